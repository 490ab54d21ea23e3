"""Per-sample decoders: webdataset's handler chains, images (and the fused path), video, audio, tenbin (see README.md in this folder)."""
