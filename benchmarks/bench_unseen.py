"""Models cfmaps was not tuned on: synthetic data, the libraries' own objects, default budgets.

The loan benchmark (``bench_loan``) measures the models issue 14 names on Credit and Adult.
This one asks what a new user meets first: ``CounterfactualMaps.build(model, schema)`` with
the library's defaults (``DEFAULT_MAX_RECTANGLES``), on scikit-learn's
``make_classification`` data (every feature continuous, informative features mixed by
random rotations, so the trees split everywhere), for the model kinds loan teams ship,
passed as the libraries' objects (``LGBMClassifier``, ``XGBClassifier``). Each case runs in
its own subprocess (its peak RSS is the build's and the queries'); a JIT warm-up on a tiny
forest comes first and is not timed. Queries: training rows, nearest other class, each
under ``max_seconds`` (default 10 s, ``on_budget="error"``): a search that runs out is a
*failure*, counted, not timed into the latency columns. Every answer is checked with the
model's own ``predict``. A norm stops after ``--norm-seconds`` of queries.

    python -m benchmarks.bench_unseen [--cases rf5c,lgbm80,...] [--queries 100]
                                      [--max-seconds 10] [--norm-seconds 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

# name -> (rows, features, informative, classes, model description)
CASES = {
    "hgb3c": (20000, 20, 6, 3, "HistGradientBoostingClassifier(max_iter=200), 10% NaN in training"),
    "rf5c": (20000, 30, 10, 5, "RandomForestClassifier(100, max_depth=8)"),
    "et200": (20000, 25, 8, 2, "ExtraTreesClassifier(200, max_depth=10)"),
    "xgb500": (20000, 40, 13, 2, "XGBClassifier(n_estimators=500, max_depth=6)"),
    "lgbm80": (20000, 80, 26, 2, "LGBMClassifier(n_estimators=300, num_leaves=31)"),
}


def _model(name: str, X: np.ndarray, y: np.ndarray, rng: np.random.Generator):
    if name == "hgb3c":
        from sklearn.ensemble import HistGradientBoostingClassifier

        Xn = X.copy()
        Xn[rng.random(X.shape) < 0.1] = np.nan
        return HistGradientBoostingClassifier(max_iter=200, random_state=0).fit(Xn, y)
    if name == "rf5c":
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(100, max_depth=8, random_state=0, n_jobs=2).fit(X, y)
    if name == "et200":
        from sklearn.ensemble import ExtraTreesClassifier

        return ExtraTreesClassifier(200, max_depth=10, random_state=0, n_jobs=2).fit(X, y)
    if name == "xgb500":
        import xgboost as xgb

        return xgb.XGBClassifier(n_estimators=500, max_depth=6, random_state=0).fit(X, y)
    import lightgbm as lgb

    return lgb.LGBMClassifier(n_estimators=300, num_leaves=31, verbose=-1, random_state=0).fit(X, y)


def run_one(name: str, n_queries: int, max_seconds: float, norm_seconds: float) -> dict:
    from sklearn.datasets import make_classification

    from benchmarks.common import warm_up
    from maps_core import BudgetExceededError, CounterfactualMaps, Feature, FeatureSchema

    rows, m, informative, k, _ = CASES[name]
    X, y = make_classification(rows, m, n_informative=informative, n_classes=k,
                               n_clusters_per_class=2, random_state=3)
    rng = np.random.default_rng(1)
    model = _model(name, X, y, rng)
    lo, hi = X.min(0), X.max(0)
    schema = FeatureSchema([Feature(f"f{j}", lower=float(lo[j]), upper=float(hi[j]))
                            for j in range(m)])
    warm_up(X, y, schema, X[0])  # not timed
    t = time.perf_counter()
    maps = CounterfactualMaps.build(model, schema)
    out: dict = {"case": name, "T0_s": round(time.perf_counter() - t, 2),
                 "rectangles": maps.stats.rectangles, "mixed": maps.stats.mixed_regions}
    Q = X[rng.choice(rows, size=n_queries, replace=False)]
    for norm in ("l1", "l2", "linf"):
        lat, fails, invalid, t_norm = [], 0, 0, time.perf_counter()
        for x in Q:
            s = time.perf_counter()
            try:
                r = maps.counterfactual(x, norm=norm, max_seconds=max_seconds)
            except BudgetExceededError:
                fails += 1
            else:
                lat.append(time.perf_counter() - s)
                if r.best is None or model.predict(r.best.x[None])[0] != r.target:
                    invalid += 1
            if time.perf_counter() - t_norm > norm_seconds:
                break
        a = np.array(lat) * 1e3
        p50, p90, top = (round(float(v), 2) for v in np.percentile(a, [50, 90, 100])) \
            if a.size else (None, None, None)
        out[norm] = {"asked": len(lat) + fails, "answered": len(lat), "out_of_time": fails,
                     "invalid": invalid, "p50_ms": p50, "p90_ms": p90, "max_ms": top}
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return out


def _report(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        "# Models cfmaps was not tuned on (synthetic data, library defaults)",
        "",
        f"Command: `python -m benchmarks.bench_unseen --queries {args.queries} --max-seconds "
        f"{args.max_seconds:g} --norm-seconds {args.norm_seconds:g}`; one run.",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}; "
        f"{time.strftime('%Y-%m-%d')}. Data: `make_classification(rows, features, "
        "n_informative, n_classes, n_clusters_per_class=2, random_state=3)`, every feature "
        "continuous in its observed range; default build budgets; queries are training "
        "rows, nearest other class, each under `max_seconds` (a search that runs out is "
        "counted, not timed); a norm stops after its seconds of queries.",
        "",
        "| case | model | rows x features (informative), classes | T0 (s) | rectangles | mixed "
        "| peak RSS (MB) | norm | answered / asked | out of time | invalid | p50 / p90 / max (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows, m, inf, k, desc = CASES[r["case"]]
        for norm in ("l1", "l2", "linf"):
            q = r[norm]
            lines.append(
                f"| {r['case']} | {desc} | {rows} x {m} ({inf}), {k} | {r['T0_s']} | "
                f"{r['rectangles']:,} | {r['mixed']:,} | {r['peak_rss_mb']} | {norm} | "
                f"{q['answered']} / {q['asked']} | {q['out_of_time']} | {q['invalid']} | "
                f"{q['p50_ms']} / {q['p90_ms']} / {q['max_ms']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--max-seconds", type=float, default=10.0)
    ap.add_argument("--norm-seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "unseen.md")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one, a.queries, a.max_seconds, a.norm_seconds)))
        return
    results = []
    for name in a.cases.split(","):
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_unseen", "--one", name,
             "--queries", str(a.queries), "--max-seconds", str(a.max_seconds),
             "--norm-seconds", str(a.norm_seconds)],
            capture_output=True, text=True, check=True, cwd=HERE.parent)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    a.out.write_text(_report(results, a))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
