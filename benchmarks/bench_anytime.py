"""Answers within a time limit: exact queries against ``on_budget="best"``, side by side.

    python -m benchmarks.bench_anytime                          # Credit RF 100x5, 100 + 100
    python -m benchmarks.bench_anytime --model credit-rf200x8 --limits 0.05,0.2

For one loan model of :mod:`benchmarks.bench_loan` (same data, split, training, service
budgets and queries: the first N test rows and N uniform legal samples, alternating), each
norm's queries run first exactly (the service's default budgets: 500k boxes, 30 s) and then
with each time limit and ``on_budget="best"``. Per limit: latency, the share of answers
proven optimal within it, and for the others how far they are from the exact optimum
(``distance / optimum - 1``, known from the exact run) and what they certify
(``distance / lower_bound - 1``). Every answer is checked with the model's own ``predict``,
and every lower bound against the exact optimum (a violation is counted as ``unsound``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_loan import MODELS, _as_served, _model, uniform_legal

HERE = Path(__file__).resolve().parent


def _pct(a: list[float], q: float) -> float:
    return float(np.percentile(a, q)) if a else 0.0


def run(model_name: str, n: int, norms: list[str], limits: list[float]) -> dict[str, Any]:
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import train_test_split

    from app.settings import Settings
    from benchmarks.common import SHARED
    from maps_core import BudgetExceededError, CounterfactualMaps, load_csv

    dataset, kind, trees, depth = MODELS[model_name]
    data = load_csv(SHARED / "datasets" / f"{dataset}.csv")
    Xtr, Xte, ytr, _ = train_test_split(data.X, data.y, test_size=0.2, random_state=0)
    trained = _model(kind, trees, depth).fit(Xtr, ytr)
    model = _as_served(kind, trained)
    warm = RandomForestClassifier(2, max_depth=2, random_state=0).fit(Xtr[:300], ytr[:300])
    CounterfactualMaps.build(warm, data.schema).counterfactual(Xte[0], max_seconds=1.0,
                                                               on_budget="best")
    s = Settings()
    t = time.perf_counter()
    maps = CounterfactualMaps.build(model, data.schema, max_rectangles=s.build_max_rectangles,
                                    max_memory=s.effective_build_memory())
    t0 = time.perf_counter() - t
    rng = np.random.default_rng(0)
    Q = np.empty((2 * n, Xte.shape[1]))
    Q[0::2], Q[1::2] = Xte[:n], uniform_legal(data.schema, n, rng)
    out: dict[str, Any] = {"model": model_name, "T0": t0, "mixed": maps.stats.mixed_regions,
                           "queries": len(Q), "rows": []}
    for norm in norms:
        exact: list[float | None] = []
        lat: list[float] = []
        for x in Q:
            a = time.perf_counter()
            try:
                r = maps.counterfactual(x, norm=norm, max_boxes=s.query_max_boxes,
                                        max_seconds=s.query_max_seconds)
                exact.append(None if r.best is None else r.best.distance)
            except BudgetExceededError:
                exact.append(None)
            lat.append((time.perf_counter() - a) * 1e3)
        failed = sum(e is None for e in exact)
        out["rows"].append(_row(norm, "exact", lat, len(Q) - failed, failed, [], [], 0, 0))
        for limit in limits:
            lat, excess, certified = [], [], []
            proven = failed = invalid = unsound = 0
            for x, opt in zip(Q, exact, strict=True):
                a = time.perf_counter()
                try:
                    r = maps.counterfactual(x, norm=norm, max_boxes=s.query_max_boxes,
                                            max_seconds=limit, on_budget="best")
                except BudgetExceededError:
                    failed += 1
                    lat.append((time.perf_counter() - a) * 1e3)
                    continue
                lat.append((time.perf_counter() - a) * 1e3)
                if r.best is None:
                    continue
                invalid += int(trained.predict(r.best.x[None])[0] != r.target)
                d, low = r.best.distance, r.lower_bound
                if opt is not None and not (low <= opt * (1 + 1e-9) + 1e-12
                                            and opt <= d * (1 + 1e-9) + 1e-12):
                    unsound += 1
                if r.optimal:
                    proven += 1
                    continue
                certified.append(d / low - 1 if low > 0 else np.inf)
                if opt is not None and opt > 0:
                    excess.append(d / opt - 1)
            out["rows"].append(_row(norm, f"{limit:g} s, best", lat, proven, failed, excess,
                                    certified, invalid, unsound))
    return out


def _row(norm: str, mode: str, lat: list[float], proven: int, failed: int, excess: list[float],
         certified: list[float], invalid: int, unsound: int) -> dict[str, Any]:
    return {"norm": norm, "mode": mode, "n": len(lat), "p50": _pct(lat, 50), "p99": _pct(lat, 99),
            "max": max(lat), "proven": proven, "failed": failed, "unproven": len(certified),
            "excess_p50": _pct(excess, 50), "excess_p90": _pct(excess, 90),
            "excess_max": max(excess, default=0.0), "cert_p50": _pct(certified, 50),
            "cert_max": max(certified, default=0.0), "invalid": invalid, "unsound": unsound}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="credit-rf100x5", choices=sorted(MODELS))
    ap.add_argument("--queries", type=int, default=100, help="test rows, and as many uniform")
    ap.add_argument("--norms", default="l1,l2,linf")
    ap.add_argument("--limits", default="0.02,0.05", help="time limits (seconds) to compare")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "anytime.md")
    a = ap.parse_args()
    from benchmarks.suite.env import describe, load_average

    env = describe()
    res = run(a.model, a.queries, a.norms.split(","), [float(v) for v in a.limits.split(",")])
    print(json.dumps(res))
    lines = [
        "# Answers within a time limit (`on_budget=\"best\"`) against exact answers",
        "",
        f"Command: `python -m benchmarks.bench_anytime --model {a.model} --queries "
        f"{a.queries} --norms {a.norms} --limits {a.limits}`; one run, the exact and the "
        "limited queries side by side in one process, on the same maps.",
        "",
        f"Machine: {env['nproc']} CPUs ({env['cpu']}), {env['ram_gb']} GB RAM, Python "
        f"{env['python']}, scikit-learn {env['versions']['scikit-learn']}, numba "
        f"{env['versions']['numba']}; date {env['date']}; git `{env['git']}`; load average at "
        f"start {env['load_start']}, at end {load_average()}.",
        "",
        f"Model {res['model']}: built in {res['T0']:.1f} s at the service's default budgets, "
        f"{res['mixed']:,} mixed regions; {res['queries']} queries (test rows and uniform legal "
        "samples, alternating).",
        "",
        "| norm | mode | n | p50 (ms) | p99 (ms) | max (ms) | proven optimal | best found "
        "(unproven) | no answer | excess over the optimum p50 / p90 / max | certified gap "
        "p50 / max | invalid | unsound |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        gap = (f"{r['excess_p50']:.1%} / {r['excess_p90']:.1%} / {r['excess_max']:.1%}"
               if r["unproven"] else "")
        cert = f"{r['cert_p50']:.1%} / {r['cert_max']:.1%}" if r["unproven"] else ""
        lines.append(
            f"| {r['norm']} | {r['mode']} | {r['n']} | {r['p50']:.2f} | {r['p99']:.1f} | "
            f"{r['max']:.0f} | {r['proven']} | {r['unproven']} | {r['failed']} | {gap} | {cert} | "
            f"{r['invalid']} | {r['unsound']} |")
    lines += [
        "",
        "Columns. *exact*: the service's default (every answer certified optimal; *no answer* "
        "counts budget failures, 422 in the service). *best*: `max_seconds` = the limit and "
        "`on_budget=\"best\"`: *proven optimal* answers are certified within the limit; "
        "*best found* are valid but unproven (`optimal: false`); *excess* is their distance "
        "over the exact run's optimum, *certified gap* their distance over their own "
        "`lower_bound` (what a client sees); *no answer* means the search met no target box "
        "(a 422). *unsound* counts lower bounds above, or distances below, the exact optimum "
        "(must be 0). With a limit, the search stops a fifth of it early (at most 10 ms) to "
        "leave that time to the guesses for a nearer answer (`maps_core._incumbent`); the "
        "clock is read about every millisecond, so an answer may come about a millisecond "
        "after the limit.",
    ]
    a.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
