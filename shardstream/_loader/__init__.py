"""The pipeline in a helper process (SubprocessLoader) and shared memory (see README.md in this folder)."""
