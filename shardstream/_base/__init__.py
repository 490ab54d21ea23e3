"""The foundation every layer may use: errors, redaction, handlers, counters, lazy torch (see README.md in this folder)."""
