"""The commands of `shardstream` (the parser and `main` live in `shardstream.cli`). See README.md here."""
