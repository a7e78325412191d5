"""cfmaps benchmark suite (issue 5): entry point ``python benchmarks/run.py``."""
