"""Side-by-side query latency of two versions of the engine on the same saved maps (issue
14 goal 3: the paper's datasets within 1.2x).

Build the maps once, with either version, then query them with each version in turn,
each with its own numba cache, alternating. The version is whichever ``maps_core`` the
interpreter imports, so ``query`` runs the file by its path from outside the checkout
(``python -m`` from the checkout would put the checkout's own ``maps_core`` first); it
prints the one it uses::

    python -m benchmarks.engine_ab build /tmp/ab                  # BC, CP, FI, PD
    git worktree add /tmp/old <commit>
    cd /tmp
    AB=$REPO/benchmarks/engine_ab.py
    PYTHONPATH=/tmp/old NUMBA_CACHE_DIR=/tmp/nc_old python $AB query /tmp/ab --out old1.json
    PYTHONPATH=$REPO NUMBA_CACHE_DIR=/tmp/nc_new python $AB query /tmp/ab --out new1.json
    ...                                                          # old2, new2
    python $AB compare old1.json new1.json old2.json new2.json

``build``: ``RandomForestClassifier(100, max_depth=5, random_state=0)`` per dataset (80/20
split, declared schemas, budgets 240 s and 5M rectangles, as ``bench_engine``), its maps
saved under the folder with the queries (500; PD 300: the test rows topped up with uniform
legal samples). ``query``: single ``counterfactual`` calls per norm, unconstrained; prints
and saves each norm's p50, the mixed-region boxes popped and every distance. ``compare``:
the p50 table and the ratio mean(new) / mean(old) (files alternate old, new), and whether
every distance is identical.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

NORMS = ("l1", "l2", "linf")


def build(folder: Path, names: list[str]) -> None:
    import joblib
    from sklearn.ensemble import RandomForestClassifier

    from benchmarks.bench_engine import queries
    from benchmarks.common import load
    from maps_core import CounterfactualMaps

    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        Xtr, Xte, ytr, _, schema = load(name)
        model = RandomForestClassifier(100, max_depth=5, random_state=0).fit(Xtr, ytr)
        t = time.perf_counter()
        maps = CounterfactualMaps.build(model, schema, max_seconds=240,
                                        max_rectangles=5_000_000)
        print(f"{name}: built in {time.perf_counter() - t:.1f} s, "
              f"{maps.stats.mixed_regions} mixed regions", flush=True)
        maps.save(folder / name)
        Q = queries(Xte, schema, 300 if name == "PD" else 500, np.random.default_rng(0))
        joblib.dump(Q, folder / f"{name}.queries.joblib")


def query(folder: Path, names: list[str], out: Path) -> None:
    import joblib

    import maps_core
    from maps_core import CounterfactualMaps

    print("maps_core from", Path(maps_core.__file__).parent, flush=True)
    res: dict[str, dict[str, object]] = {}
    for name in names:
        maps = CounterfactualMaps.load(folder / name)
        Q = joblib.load(folder / f"{name}.queries.joblib")
        maps.counterfactuals(Q[:5], norm="l2")  # compile / load the kernels first
        for norm in NORMS:
            times, pops, dists = [], 0, []
            for q in Q:
                t = time.perf_counter()
                r = maps.counterfactual(q, norm=norm)
                times.append(time.perf_counter() - t)
                pops += r.stats.regions_refined
                dists.append(r.best.distance)
            p50 = float(np.median(times)) * 1e3
            res[f"{name} {norm}"] = {"p50_ms": p50, "boxes": pops, "distances": dists}
            print(f"{name} {norm}: p50 {p50:.3f} ms, {pops} boxes", flush=True)
    out.write_text(json.dumps(res))


def compare(files: list[Path]) -> None:
    runs = [json.loads(f.read_text()) for f in files]
    old, new = runs[0::2], runs[1::2]
    heads = [f"{'old' if i % 2 == 0 else 'new'} {i // 2 + 1}" for i in range(len(runs))]
    print("| dataset | norm | " + " | ".join(heads) + " | ratio |")
    print("|---|---|" + "---|" * len(runs) + "---|")
    same = True
    for key in runs[0]:
        cells = [f"{r[key]['p50_ms']:.3f}" for r in runs]
        ratio = (np.mean([r[key]["p50_ms"] for r in new])
                 / np.mean([r[key]["p50_ms"] for r in old]))
        same &= all(r[key]["distances"] == runs[0][key]["distances"] for r in runs)
        print(f"| {key.replace(' ', ' | ')} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    print("distances identical in every run:", same)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=["build", "query", "compare"])
    ap.add_argument("paths", nargs="+", type=Path,
                    help="the maps folder (build, query) or the runs' JSON files (compare)")
    ap.add_argument("--datasets", default="BC,CP,FI,PD")
    ap.add_argument("--out", type=Path, help="query: where to save the run (JSON)")
    a = ap.parse_args()
    names = a.datasets.split(",")
    if a.step == "build":
        build(a.paths[0], names)
    elif a.step == "query":
        if a.out is None:
            ap.error("query needs --out")
        query(a.paths[0], names, a.out)
    else:
        compare(a.paths)


if __name__ == "__main__":
    main()
