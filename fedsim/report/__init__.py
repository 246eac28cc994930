"""Run directories, per-round rows and summaries."""
