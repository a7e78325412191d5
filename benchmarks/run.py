"""Benchmark suite entry point: paper reproduction, sensitivity, peers, total time, summary.

    python benchmarks/run.py --quick     # < 3 min, writes benchmarks/results/quick/
    python benchmarks/run.py             # default, < 30 min, writes benchmarks/results/
    python benchmarks/run.py --full      # 5 seeds everywhere, large budgets (hours)

See benchmarks/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from suite.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
