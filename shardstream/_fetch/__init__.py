"""Bytes from a URL: the event loop, the scheme registry, HTTP, S3, files, fsspec, `pipe:`; retries (see README.md in this folder)."""
