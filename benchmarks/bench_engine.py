"""Engine benchmark (issue 2): build cost and in-process query latency.

For ``RandomForestClassifier(n_estimators=100, max_depth=5, random_state=0)`` on BC, CP, FI
and PD (80/20 split, the schema a user would declare: ``load_csv(..., whole_floats_as_integers=True)``),
prints build time T0, rectangles per class, mixed regions left by the time budget, bytes on
disk, peak RSS, and per-query latency p50/p99 for l1/l2/linf over up to 1000 test queries
(topped up with uniform legal samples), beside one single-row ``model.predict``.

A second table (issue 4) times the same queries under two constraint sets, beside the
unconstrained ones, with the ratio of the p50s (target: at most 2x) and the fraction of
queries that come back infeasible:

* ``immutable 30%``: ``round(0.3 * n_features)`` features chosen by
  ``np.random.default_rng(0).choice(n_features, ..., replace=False)``, the same for every
  query (names printed under the table);
* ``bounds all``: every feature bounded to ``[x_f - h_f, x_f + h_f]`` around the query,
  ``h_f`` = 25% of the feature's legal range (observed range when unbounded), at least 1 on
  integral features so that a binary feature keeps both values (on the all-binary CP and FI
  these bounds therefore do not bind: they time the bounds path only).

Each dataset runs in its own subprocess so that peak memory is per dataset.

    python -m benchmarks.bench_engine [--datasets BC,CP,FI,PD] [--max-seconds 240]
                                      [--max-rectangles 5000000] [--out FILE]

The tables are printed and written to ``benchmarks/results/engine.md`` (``--out``), with the
machine, the commit and the load average.

The build budgets default to the service's (``app.settings``: 5 million rectangles, which
bounds a build's memory to a few GB); PD's build stops there with mixed regions, refined at
query time. Without the rectangle cap PD's build grows until memory runs out.
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

PAPER_T0 = {"BC": 8.8, "CP": 0.3, "FI": 1.6, "PD": 234.4}
MAX_RECTANGLES = 5_000_000  # the service's default build budget when engine.md was measured


def queries(Xte: np.ndarray, schema, n: int, rng) -> np.ndarray:
    if len(Xte) >= n:
        return Xte[:n]
    lo, hi = schema.domains()
    extra = rng.uniform(np.where(np.isfinite(lo), lo, Xte.min(0)),
                        np.where(np.isfinite(hi), hi, Xte.max(0)), size=(n - len(Xte), Xte.shape[1]))
    integ = schema.integral_mask()
    extra[:, integ] = np.round(extra[:, integ])
    return np.vstack([Xte, extra])


def run_one(name: str, max_seconds: float, max_rectangles: int, n_queries: int) -> dict:
    from sklearn.ensemble import RandomForestClassifier

    from benchmarks.common import load
    from maps_core import CounterfactualMaps

    Xtr, Xte, ytr, yte, schema = load(name)
    model = RandomForestClassifier(n_estimators=100, max_depth=5, random_state=0).fit(Xtr, ytr)
    CounterfactualMaps.build(RandomForestClassifier(2, max_depth=2).fit(Xtr, ytr), schema)  # JIT warm-up
    t0 = time.perf_counter()
    maps = CounterfactualMaps.build(model, schema, max_seconds=max_seconds,
                                    max_rectangles=max_rectangles)
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
        constrained = constrained_latency(loaded, schema, Xtr, Q)
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
        "constrained": constrained,
    }


def constraint_cases(schema, Xtr: np.ndarray, Q: np.ndarray) -> dict[str, tuple[list[str], list[dict]]]:
    """Per case: the immutable names (same for every query) and one bounds dict per query."""
    names = schema.names
    m = len(names)
    fixed = sorted(np.random.default_rng(0).choice(m, size=round(0.3 * m), replace=False).tolist())
    lo, hi = schema.domains()
    lo = np.where(np.isfinite(lo), lo, Xtr.min(axis=0))
    hi = np.where(np.isfinite(hi), hi, Xtr.max(axis=0))
    half = 0.25 * (hi - lo)
    integ = schema.integral_mask()
    half[integ] = np.maximum(half[integ], 1.0)
    bounds = [{n: [float(q[j] - half[j]), float(q[j] + half[j])] for j, n in enumerate(names)} for q in Q]
    return {
        "immutable 30%": ([names[j] for j in fixed], [{}] * len(Q)),
        "bounds all": ([], bounds),
    }


def constrained_latency(maps, schema, Xtr: np.ndarray, Q: np.ndarray) -> dict:
    """p50/p99 per norm and the infeasible fraction for each constraint case."""
    out = {}
    for case, (immutable, bounds) in constraint_cases(schema, Xtr, Q).items():
        lat = {}
        infeasible = 0
        for norm in ("l1", "l2", "linf"):
            ts = []
            n_inf = 0
            for q, b in zip(Q, bounds, strict=True):
                s = time.perf_counter()
                r = maps.counterfactual(q, norm=norm, immutable=immutable or None, bounds=b or None)
                ts.append(time.perf_counter() - s)
                n_inf += not r.feasible
            lat[norm] = (float(np.median(ts)) * 1e3, float(np.percentile(ts, 99)) * 1e3)
            infeasible = max(infeasible, n_inf)
        out[case] = {"lat": lat, "infeasible": infeasible / len(Q), "immutable": immutable}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default="CP,FI,BC,PD")
    ap.add_argument("--max-seconds", type=float, default=240.0)
    ap.add_argument("--max-rectangles", type=int, default=MAX_RECTANGLES)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--out", default=str(HERE / "results" / "engine.md"),
                    help="markdown copy of the tables ('' for none)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one, a.max_seconds, a.max_rectangles, a.queries)))
        return
    from benchmarks.suite.env import describe, load_average

    env = describe()
    rows = []
    for name in a.datasets.split(","):
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_engine", "--one", name, "--max-seconds",
                              str(a.max_seconds), "--max-rectangles", str(a.max_rectangles),
                              "--queries", str(a.queries)], cwd=HERE.parent,
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"# {name} done: T0={r['T0']:.2f}s", file=sys.stderr, flush=True)
    lines = [
        "# Engine benchmark",
        "",
        "Command: `python -m benchmarks.bench_engine` (see its docstring); one run, every "
        "dataset in its own subprocess. RandomForestClassifier(100, max_depth=5, "
        f"random_state=0), 80/20 split, declared schema; budgets {a.max_seconds:g} s and "
        f"{a.max_rectangles:,} rectangles; {a.queries} queries per norm (the test rows, topped "
        "up with uniform legal samples).",
        "",
        f"Machine: {env['nproc']} CPUs ({env['cpu']}), {env['ram_gb']} GB RAM, Python "
        f"{env['python']}, numpy {env['versions']['numpy']}, scikit-learn "
        f"{env['versions']['scikit-learn']}, numba {env['versions']['numba']}; date "
        f"{env['date']}; git `{env['git']}`; load average at start {env['load_start']}, at "
        f"end {load_average()}.",
        "",
        "| dataset | T0 (s) | paper T0 | rectangles/class | mixed | disk (MB) | peak RSS (MB) "
        "| l1 p50/p99 (ms) | l2 p50/p99 (ms) | linf p50/p99 (ms) | model.predict 1 row (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lat = " | ".join(f"{r['lat'][n][0]:.3f} / {r['lat'][n][1]:.3f}" for n in ("l1", "l2", "linf"))
        lines.append(f"| {r['dataset']} | {r['T0']:.2f} | {r['paper_T0']} | {r['rects']} "
                     f"| {r['mixed']} | {r['bytes'] / 1e6:.1f} | {r['peak_mb']:.0f} | {lat} "
                     f"| {r['predict_ms']:.3f} |")
    lines += [
        "",
        "| dataset | case | l1 p50/p99 (ms) | l2 p50/p99 (ms) | linf p50/p99 (ms) "
        "| p50 ratio to unconstrained (l1/l2/linf) | within 2x | infeasible |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cases = {"unconstrained": {"lat": r["lat"], "infeasible": None}, **r["constrained"]}
        for case, c in cases.items():
            lat = " | ".join(f"{c['lat'][n][0]:.3f} / {c['lat'][n][1]:.3f}" for n in ("l1", "l2", "linf"))
            ratios = [c["lat"][n][0] / r["lat"][n][0] for n in ("l1", "l2", "linf")]
            inf = "-" if c["infeasible"] is None else f"{100 * c['infeasible']:.1f}%"
            ok = "yes" if max(ratios) <= 2.0 else "NO"
            lines.append(f"| {r['dataset']} | {case} | {lat} "
                         f"| {' / '.join(f'{x:.2f}' for x in ratios)} | {ok} | {inf} |")
    for r in rows:
        lines += ["", f"{r['dataset']} immutable 30%: "
                  f"{', '.join(r['constrained']['immutable 30%']['immutable'])}"]
    lines.append("")
    print("\n".join(lines))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
