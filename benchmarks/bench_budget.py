"""Build budget against query latency on a model whose partition cannot be completed.

Pima (PD) with ``RandomForestClassifier(100, max_depth=5, random_state=0)`` certifies only
a few percent of its domain by 5M rectangles, so its queries search mixed regions whatever
the budget. This sweep builds PD maps under several rectangle budgets (each in its own
subprocess, for its peak memory) and times the same l2 queries on each: the 154 test rows
and 300 uniform legal samples (``bench_engine.queries``), reporting T0, rectangles, mixed
regions, bytes on disk, peak RSS, p50 latency per query set and the median number of boxes
popped inside mixed regions; distances are checked equal across budgets.

    python -m benchmarks.bench_budget [--budgets 2000,100000,1000000,5000000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def run_one(budget: int) -> dict:
    from sklearn.ensemble import RandomForestClassifier

    from benchmarks.bench_engine import queries
    from benchmarks.common import load
    from maps_core import CounterfactualMaps

    Xtr, Xte, ytr, yte, schema = load("PD")
    model = RandomForestClassifier(n_estimators=100, max_depth=5, random_state=0).fit(Xtr, ytr)
    CounterfactualMaps.build(RandomForestClassifier(2, max_depth=2).fit(Xtr, ytr), schema)  # JIT warm-up
    t0 = time.perf_counter()
    maps = CounterfactualMaps.build(model, schema, max_seconds=600, max_rectangles=budget)
    T0 = time.perf_counter() - t0
    Q = queries(Xte, schema, len(Xte) + 300, np.random.default_rng(0))
    out: dict = {"budget": budget, "T0": T0, "rects": sum(maps.stats.rectangles_per_class),
                 "mixed": maps.stats.mixed_regions}
    with tempfile.TemporaryDirectory() as d:
        loaded = CounterfactualMaps.load(maps.save(Path(d) / "maps"))
        out["bytes"] = loaded.stats.bytes_on_disk
        loaded.counterfactuals(Q[:5], norm="l2")  # warm-up
        dist, ms, pops = [], [], []
        for q in Q:
            s = time.perf_counter()
            r = loaded.counterfactual(q, norm="l2")
            ms.append((time.perf_counter() - s) * 1e3)
            dist.append(r.best.distance)
            pops.append(r.stats.regions_refined)
    n = len(Xte)
    ms_a, pops_a = np.array(ms), np.array(pops)
    out.update(test_p50=float(np.median(ms_a[:n])), unif_p50=float(np.median(ms_a[n:])),
               all_p50=float(np.median(ms_a)), test_pops=float(np.median(pops_a[:n])),
               unif_pops=float(np.median(pops_a[n:])), dist=dist,
               peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="2000,100000,1000000,5000000")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "pd_budget.md")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args.one)))
        return
    rows = []
    for b in (int(v) for v in args.budgets.split(",")):
        res = subprocess.run([sys.executable, "-m", "benchmarks.bench_budget", "--one", str(b)],
                             capture_output=True, text=True, check=True, cwd=HERE.parent)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"budget {b}: T0 {rows[-1]['T0']:.1f} s, l2 p50 test {rows[-1]['test_p50']:.2f} ms, "
              f"uniform {rows[-1]['unif_p50']:.2f} ms", flush=True)
    ref = np.array(rows[0]["dist"])
    same = all(np.allclose(np.array(r["dist"]), ref, rtol=0, atol=1e-12) for r in rows)
    lines = [
        "# PD: build budget against query latency",
        "",
        "Command: `python -m benchmarks.bench_budget` (see its docstring). "
        f"Machine: {platform.machine()}, Python {platform.python_version()}; one run, all budgets "
        "side by side. RandomForestClassifier(100, max_depth=5, random_state=0) on Pima, l2 "
        "queries: the 154 test rows and 300 uniform legal samples. `mixed pops` = median boxes "
        "popped inside mixed regions per query.",
        "",
        "| max rectangles | T0 (s) | rectangles | mixed regions | disk (MB) | peak RSS (MB) "
        "| l2 p50 test rows (ms) | l2 p50 uniform (ms) | l2 p50 all (ms) | mixed pops test / uniform |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['budget']:,} | {r['T0']:.2f} | {r['rects']:,} | {r['mixed']:,} | "
            f"{r['bytes'] / 1e6:.1f} | {r['peak_mb']:.0f} | {r['test_p50']:.2f} | "
            f"{r['unif_p50']:.2f} | {r['all_p50']:.2f} | {r['test_pops']:.0f} / {r['unif_pops']:.0f} |"
        )
    lines += ["", f"Distances identical across budgets (to 1e-12): {'yes' if same else 'NO'}.", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
