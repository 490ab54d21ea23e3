"""Sans-IO: bytes in, tar members out (plain, gzip, bzip2, xz); webdataset's key rules. No I/O here (a test walks this folder) (see README.md in this folder)."""
