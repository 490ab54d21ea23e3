"""A pipeline's passes as one iterator, over the engine (see README.md in this folder)."""
