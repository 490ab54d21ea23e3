"""TarWriter, ShardWriter and the encoders (see README.md in this folder)."""
