"""Extraction experiments: rectangles, counters and speed per extraction setting.

    python -m benchmarks.exp_extract BC 100 5 60 0:0 16:0 64:64

Arguments: dataset, trees, depth, time budget (s), then one ``prove_budget:n_samples``
setting per run (see ``maps_core.partition.extract``). One thread, after a JIT warm-up.
"""

import sys
import time

from sklearn.ensemble import RandomForestClassifier

from benchmarks.common import load
from maps_core.adapters import flatten_model
from maps_core.grid import Grid
from maps_core.partition import extract


def main() -> None:
    name, T, D, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    Xtr, Xte, ytr, yte, schema = load(name)
    rf = RandomForestClassifier(T, max_depth=D, random_state=0).fit(Xtr, ytr)
    ens = flatten_model(rf)
    grid = Grid.from_ensemble(ens, schema)
    print("cells per feature", grid.n_cells)
    warm = RandomForestClassifier(2, max_depth=2, random_state=0).fit(Xtr, ytr)
    extract(flatten_model(warm), grid, n_jobs=1)
    for spec in sys.argv[5:]:
        pb, ns = map(int, spec.split(":"))
        t = time.time()
        p = extract(ens, grid, max_seconds=secs, n_jobs=1, prove_budget=pb, n_samples=ns)
        el = time.time() - t
        rate = p.counters["regions"] / el
        print(name, T, D, spec, f"{el:.1f}s rects={p.n_rectangles} mixed={p.n_mixed} rate={rate:.0f} reg/s",
              p.counters, flush=True)


if __name__ == "__main__":
    main()
