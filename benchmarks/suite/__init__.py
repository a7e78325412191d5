"""cfmaps benchmark suite (issue 5): entry point ``python -m benchmarks.run``."""
