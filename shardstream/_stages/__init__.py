"""What a stage is: the stage contract, the resume contract, per-sample and stream stages (see README.md in this folder)."""
