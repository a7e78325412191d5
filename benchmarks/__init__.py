"""Benchmarks of cfmaps: run each as a module from the repository root, e.g.
``python -m benchmarks.run`` or ``python -m benchmarks.bench_loan``."""
