"""Benchmark suite entry point: paper reproduction, sensitivity, peers, total time, summary.

    python -m benchmarks.run --quick     # < 3 min, writes benchmarks/results/quick/
    python -m benchmarks.run             # default, < 30 min, writes benchmarks/results/
    python -m benchmarks.run --full      # 5 seeds everywhere, large budgets (hours)

See benchmarks/README.md.
"""

from __future__ import annotations

import sys

from benchmarks.suite.cli import main

if __name__ == "__main__":
    sys.exit(main())
