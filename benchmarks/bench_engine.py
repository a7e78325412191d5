"""Engine benchmark (issue 2): build cost and in-process query latency.

For ``RandomForestClassifier(n_estimators=100, max_depth=5, random_state=0)`` on BC, CP, FI
and PD (80/20 split, the schema a user would declare: see ``common.declared_schema``),
prints build time T0, rectangles per class, mixed regions left by the time budget, bytes on
disk, peak RSS, and per-query latency p50/p99 for l1/l2/linf over up to 1000 test queries
(topped up with uniform legal samples), beside one single-row ``model.predict``.

Each dataset runs in its own subprocess so that peak memory is per dataset.

    python benchmarks/bench_engine.py [--datasets BC,CP,FI,PD] [--max-seconds 240]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

PAPER_T0 = {"BC": 8.8, "CP": 0.3, "FI": 1.6, "PD": 234.4}


def queries(Xte: np.ndarray, schema, n: int, rng) -> np.ndarray:
    if len(Xte) >= n:
        return Xte[:n]
    lo, hi = schema.domains()
    extra = rng.uniform(np.where(np.isfinite(lo), lo, Xte.min(0)),
                        np.where(np.isfinite(hi), hi, Xte.max(0)), size=(n - len(Xte), Xte.shape[1]))
    integ = schema.integral_mask()
    extra[:, integ] = np.round(extra[:, integ])
    return np.vstack([Xte, extra])


def run_one(name: str, max_seconds: float, n_queries: int) -> dict:
    from common import load
    from sklearn.ensemble import RandomForestClassifier

    from maps_core import CounterfactualMaps

    Xtr, Xte, ytr, yte, schema = load(name)
    model = RandomForestClassifier(n_estimators=100, max_depth=5, random_state=0).fit(Xtr, ytr)
    CounterfactualMaps.build(RandomForestClassifier(2, max_depth=2).fit(Xtr, ytr), schema)  # JIT warm-up
    t0 = time.perf_counter()
    maps = CounterfactualMaps.build(model, schema, max_seconds=max_seconds)
    T0 = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        maps.save(Path(d) / "maps")
        loaded = CounterfactualMaps.load(Path(d) / "maps")
        size = loaded.stats.bytes_on_disk
        Q = queries(Xte, schema, n_queries, np.random.default_rng(0))
        loaded.counterfactuals(Q[:5], norm="l2")  # warm-up
        lat = {}
        refined = 0
        for norm in ("l1", "l2", "linf"):
            ts = []
            for q in Q:
                s = time.perf_counter()
                r = loaded.counterfactual(q, norm=norm)
                ts.append(time.perf_counter() - s)
                refined += r.stats.regions_refined
            lat[norm] = (float(np.median(ts)) * 1e3, float(np.percentile(ts, 99)) * 1e3)
    s = time.perf_counter()
    for q in Q[:200]:
        model.predict(q[None])
    pred_ms = (time.perf_counter() - s) / 200 * 1e3
    return {
        "dataset": name,
        "T0": T0,
        "paper_T0": PAPER_T0[name],
        "rects": maps.stats.rectangles_per_class,
        "mixed": maps.stats.mixed_regions,
        "bytes": size,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "lat": lat,
        "refined": refined,
        "predict_ms": pred_ms,
        "n_queries": len(Q),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default="CP,FI,BC,PD")
    ap.add_argument("--max-seconds", type=float, default=240.0)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one, a.max_seconds, a.queries)))
        return
    rows = []
    for name in a.datasets.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", name, "--max-seconds",
                              str(a.max_seconds), "--queries", str(a.queries)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"# {name} done: T0={r['T0']:.2f}s", file=sys.stderr, flush=True)
    print("| dataset | T0 (s) | paper T0 | rectangles/class | mixed | disk (MB) | peak RSS (MB) "
          "| l1 p50/p99 (ms) | l2 p50/p99 (ms) | linf p50/p99 (ms) | model.predict 1 row (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lat = " | ".join(f"{r['lat'][n][0]:.3f} / {r['lat'][n][1]:.3f}" for n in ("l1", "l2", "linf"))
        print(f"| {r['dataset']} | {r['T0']:.2f} | {r['paper_T0']} | {r['rects']} | {r['mixed']} "
              f"| {r['bytes'] / 1e6:.1f} | {r['peak_mb']:.0f} | {lat} | {r['predict_ms']:.3f} |")


if __name__ == "__main__":
    main()
