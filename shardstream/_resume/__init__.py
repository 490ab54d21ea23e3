"""Saving and resuming a pass: positions, states across ranks, their checks, the equal-work split (see README.md in this folder)."""
