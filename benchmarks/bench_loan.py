"""Loan data: build time, peak memory and single-query latency on Credit and Adult.

    python -m benchmarks.bench_loan                      # the four models, 1000 + 1000 queries
    python -m benchmarks.bench_loan --models credit-gb300x4 --queries 100
    python -m benchmarks.bench_loan --scaling            # trees x depth on Credit, RF and GB

The data are read as shipped with their declared schemas (``maps_core.load_csv``: integers,
binaries, one-hot groups; Credit's single-category SEX column is a constant), split 80/20
with ``random_state=0``. Every model is built and queried in its own subprocess, so its peak
RSS (``ru_maxrss``) is its own; the JIT is warmed on a tiny model first and the build's own
growth over that baseline is reported too. The build uses the service's default budgets
(``app.settings.Settings``: rectangles and memory) unless given. Queries are the first N
test rows and N uniform legal samples (each feature uniform over its schema domain,
integers on integers, each one-hot group on one category), for each norm with the
schema's default weights; each norm's queries stop after ``--time-budget`` seconds (the
table says how many ran). Every answer is checked with the model's own ``predict``.

Targets (issue 14): p50 <= 2 ms, p99 <= 50 ms, max <= 500 ms; build <= 10 s and <= 1 GB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent

#: name -> (dataset file stem, kind, trees, depth)
MODELS = {
    "credit-rf100x5": ("Credit", "rf", 100, 5),
    "credit-gb300x4": ("Credit", "gb", 300, 4),
    "credit-rf200x8": ("Credit", "rf", 200, 8),
    "adult-gb300x4": ("Adult", "gb", 300, 4),
}
#: issue 15: XGBoost and LightGBM, read from their own files (``--models native``)
NATIVE = {
    f"{ds.lower()}-{kind}{n}x{d}": (ds, kind, n, d)
    for ds in ("Credit", "Adult", "FICO") for kind in ("xgb", "lgbm") for n, d in ((100, 5), (500, 6))
}
NORMS = ("l1", "l2", "linf")
TARGETS = {"p50": 2.0, "p99": 50.0, "max": 500.0, "T0": 10.0, "peak_mb": 1024.0}


def uniform_legal(schema: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` points drawn uniformly from the schema's legal domain, shape (n, m)."""
    lo, hi = schema.domains()
    m = len(schema)
    X = np.empty((n, m))
    groups = schema.groups()
    in_group = {j for cols in groups.values() for j in cols}
    for j, f in enumerate(schema.features):
        if j in in_group:
            continue
        a, b = lo[j], hi[j]
        if not (np.isfinite(a) and np.isfinite(b)):
            raise ValueError(f"feature {f.name!r} has no finite domain to sample")
        X[:, j] = rng.integers(int(a), int(b) + 1, size=n) if f.is_integral else rng.uniform(a, b, n)
    for cols in groups.values():
        X[:, cols] = 0.0
        X[np.arange(n), np.asarray(cols)[rng.integers(0, len(cols), size=n)]] = 1.0
    return X


def _model(kind: str, trees: int, depth: int, nominal: list[bool] | None = None,
           seed: int = 0) -> Any:
    """The estimator, seeded with ``seed``; with ``nominal`` (per column, whether it holds
    category codes) an XGBoost model splits those columns as categories (LightGBM's are
    named at fit)."""
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier

    if kind == "rf":
        return RandomForestClassifier(trees, max_depth=depth, random_state=seed, n_jobs=2)
    if kind == "xgb":
        import xgboost

        cats: dict[str, Any] = {} if not nominal or not any(nominal) else {
            "enable_categorical": True, "feature_types": ["c" if c else "q" for c in nominal]}
        return xgboost.XGBClassifier(n_estimators=trees, max_depth=depth, random_state=seed, n_jobs=2,
                                     **cats)
    if kind == "lgbm":
        import lightgbm

        return lightgbm.LGBMClassifier(n_estimators=trees, max_depth=depth, num_leaves=2**depth,
                                       random_state=seed, n_jobs=2, verbose=-1)
    return GradientBoostingClassifier(n_estimators=trees, max_depth=depth, random_state=seed)


def _as_served(kind: str, model: Any) -> Any:
    """The model as the service reads it: XGBoost and LightGBM models go through their
    saved files and cfmaps' own parsers (the libraries only train them here)."""
    import tempfile

    if kind == "xgb":
        from maps_core.adapters.xgboost_json import parse_xgboost

        path = Path(tempfile.mkdtemp()) / "model.json"
        model.save_model(path)
        return parse_xgboost(path.read_bytes())
    if kind == "lgbm":
        from maps_core.adapters.lightgbm_text import parse_lightgbm

        return parse_lightgbm(model.booster_.model_to_string())
    return model


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Build one model's maps and time its queries (runs in a subprocess of its own)."""
    from sklearn.model_selection import train_test_split

    from app.settings import Settings
    from benchmarks.common import SHARED, warm_up
    from maps_core import BudgetExceededError, CounterfactualMaps, load_csv

    data = load_csv(SHARED / "datasets" / f"{spec['dataset']}.csv",
                    categories=spec.get("categories", "one-hot"))
    Xtr, Xte, ytr, _ = train_test_split(data.X, data.y, test_size=0.2, random_state=0)
    nominal = [f.type == "nominal" for f in data.schema]
    fit = ({"categorical_feature": [j for j, c in enumerate(nominal) if c]}
           if spec["kind"] == "lgbm" and any(nominal) else {})
    trained = _model(spec["kind"], spec["trees"], spec["depth"], nominal,
                     spec.get("seed", 0)).fit(Xtr, ytr, **fit)
    model = _as_served(spec["kind"], trained)
    warm_up(Xtr, ytr, data.schema, Xte[0])  # JIT time is neither build nor query time
    base_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    defaults = Settings()
    max_rect = spec.get("max_rectangles") or defaults.build_max_rectangles
    max_mem = spec.get("max_memory") or defaults.effective_build_memory()
    # as the service answers: 422 beyond either budget
    max_boxes, max_seconds = defaults.query_max_boxes, defaults.query_max_seconds
    t = time.perf_counter()
    maps = CounterfactualMaps.build(model, data.schema, max_rectangles=max_rect,
                                    max_seconds=spec.get("max_seconds"), max_memory=max_mem)
    t0 = time.perf_counter() - t
    build_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rng = np.random.default_rng(0)
    n = spec["queries"]
    sets = {"test": Xte[:n], "uniform": uniform_legal(data.schema, n, rng)}
    out: dict[str, Any] = {
        **spec, "features": int(data.X.shape[1]), "T0": t0, "base_mb": base_mb,
        "build_growth_mb": build_peak - base_mb, "rectangles": int(sum(maps.stats.rectangles_per_class)),
        "mixed": int(maps.stats.mixed_regions), "max_rectangles": max_rect, "max_memory": max_mem,
        "max_boxes": max_boxes, "max_seconds": max_seconds,
        "lat": {},
    }
    for norm in spec["norms"]:
        lat: list[float] = []
        fails = invalid = 0
        stop = time.perf_counter() + spec["time_budget"]
        # test rows and uniform samples alternate, so a time budget cut keeps both kinds
        for x in (row for pair in zip(*sets.values(), strict=True) for row in pair):
            s = time.perf_counter()
            try:
                r = maps.counterfactual(x, norm=norm, max_boxes=max_boxes, max_seconds=max_seconds)
            except BudgetExceededError:
                fails += 1
                r = None
            lat.append(time.perf_counter() - s)
            if r is not None and r.best is not None and trained.predict(r.best.x[None])[0] != r.target:
                invalid += 1
            if time.perf_counter() > stop:
                break
        a = np.array(lat) * 1e3
        # even positions are test rows (the applicants a loan frontend asks about), odd
        # ones uniform samples: their medians differ several-fold on the random forests
        out["lat"][norm] = {"n": int(a.size), "p50": float(np.median(a)),
                            "p50_test": float(np.median(a[0::2])),
                            "p50_uniform": float(np.median(a[1::2])) if a.size > 1 else np.nan,
                            "p99": float(np.percentile(a, 99)), "max": float(a.max()),
                            "failures": fails, "invalid": invalid,
                            "of": sum(len(Q) for Q in sets.values())}
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run_subprocess(spec: dict[str, Any], timeout: float | None) -> dict[str, Any] | None:
    """:func:`run_one` in a fresh interpreter; None when it ran past ``timeout``."""
    try:
        res = subprocess.run([sys.executable, "-m", "benchmarks.bench_loan", "--one", json.dumps(spec)],
                             cwd=HERE.parent, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if res.returncode != 0:
        raise RuntimeError(f"{spec}: exit {res.returncode}\n{res.stderr[-2000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def _mark(value: float, target: float) -> str:
    return f"{value:.3g}" + ("" if value <= target else " ✗")


def _header(env: dict[str, Any], load: str, command: str) -> list[str]:
    return [
        f"Command: `{command}`; one run, every model in its own subprocess.",
        "",
        f"Machine: {env['nproc']} CPUs ({env['cpu']}), {env['ram_gb']} GB RAM, Python "
        f"{env['python']}, numpy {env['versions']['numpy']}, scikit-learn "
        f"{env['versions']['scikit-learn']}, numba {env['versions']['numba']}; date "
        f"{env['date']}; git `{env['git']}`; load average at start {env['load_start']}, at "
        f"end {load}.",
        "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"among {', '.join(MODELS)}; or 'native' for the XGBoost/LightGBM set")
    ap.add_argument("--queries", type=int, default=1000, help="test rows, and as many uniform")
    ap.add_argument("--norms", default=",".join(NORMS))
    ap.add_argument("--time-budget", type=float, default=300.0, help="seconds of queries per norm")
    ap.add_argument("--max-rectangles", type=int, help="build budget (default: the service's)")
    ap.add_argument("--max-memory", type=int, help="build budget in bytes (default: the service's)")
    ap.add_argument("--scaling", action="store_true", help="trees x depth table on Credit instead")
    ap.add_argument("--trees", default="50,100,200,500", help="--scaling: numbers of trees")
    ap.add_argument("--depths", default="3,5,8", help="--scaling: depths")
    ap.add_argument("--timeout", type=float, default=300.0, help="--scaling: seconds per cell")
    ap.add_argument("--categories", choices=("one-hot", "codes"), default="one-hot",
                    help="E columns one-hot encoded, or one nominal column of codes that "
                         "XGBoost and LightGBM split as categories (load_csv's categories)")
    ap.add_argument("--seeds", default="0",
                    help="the models' random_state, a comma list: one row per seed (name@seed "
                         "past the first), to see how much a model's training draw matters")
    ap.add_argument("--out", type=Path, help="markdown results file (default under results/)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(json.loads(a.one))))
        return
    from benchmarks.suite.env import describe, load_average

    env = describe()
    base = {"norms": a.norms.split(","), "time_budget": a.time_budget, "queries": a.queries,
            "max_rectangles": a.max_rectangles, "max_memory": a.max_memory,
            "categories": a.categories}
    if a.scaling:
        _scaling(a, base, env, load_average)
        return
    rows = []
    names = list(NATIVE) if a.models == "native" else a.models.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    for name, seed in ((n, s) for n in names for s in seeds):
        ds, kind, trees, depth = {**MODELS, **NATIVE}[name]
        label = name if seed == 0 else f"{name}@{seed}"
        r = run_subprocess({**base, "name": label, "dataset": ds, "kind": kind, "trees": trees,
                            "depth": depth, "seed": seed}, None)
        assert r is not None
        rows.append(r)
        print(f"# {label}: T0 {r['T0']:.1f} s, peak {r['peak_mb']:.0f} MB, "
              + ", ".join(f"{n} p50 {v['p50']:.2f} ms" for n, v in r["lat"].items()),
              file=sys.stderr, flush=True)
    lines = ["# Loan data: build and single-query latency", ""]
    lines += _header(env, load_average(), "python -m benchmarks.bench_loan " + " ".join(sys.argv[1:]))
    lines += [
        f"Targets: p50 <= {TARGETS['p50']} ms, p99 <= {TARGETS['p99']} ms, max <= "
        f"{TARGETS['max']} ms, T0 <= {TARGETS['T0']} s, peak <= {TARGETS['peak_mb']:.0f} MB "
        "(✗ marks a miss). Queries: the first test rows and as many uniform legal samples, "
        "alternating (the medians of each kind too); `n` ran within the time budget per norm. "
        "Each query's mixed-region "
        "search may pop the service's `CFMAPS_QUERY_MAX_BOXES` boxes (default 500k) for "
        "its `CFMAPS_QUERY_MAX_SECONDS` (default 30 s); beyond either it is a budget "
        "failure, as the service's 422. Every answer was checked "
        "with `model.predict`.",
        "",
        "| model | m | T0 (s) | peak RSS (MB) | build growth (MB) | rectangles | mixed | norm | n | "
        "p50 (ms) | p50 test rows / uniform (ms) | p99 (ms) | max (ms) | budget failures | "
        "invalid |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for norm, v in r["lat"].items():
            lines.append(
                f"| {r['name']} | {r['features']} | {_mark(r['T0'], TARGETS['T0'])} "
                f"| {_mark(r['peak_mb'], TARGETS['peak_mb'])} | {r['build_growth_mb']:.0f} "
                f"| {r['rectangles']:,} | {r['mixed']:,} | {norm} | {v['n']}/{v['of']} "
                f"| {_mark(v['p50'], TARGETS['p50'])} "
                f"| {v['p50_test']:.3g} / {v['p50_uniform']:.3g} "
                f"| {_mark(v['p99'], TARGETS['p99'])} "
                f"| {_mark(v['max'], TARGETS['max'])} | {v['failures']} | {v['invalid']} |")
    out = a.out or HERE / "results" / "loan.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _scaling(a: argparse.Namespace, base: dict[str, Any], env: dict[str, Any], load_average: Any) -> None:
    rows = []
    base = {**base, "norms": ["l2"]}
    for kind in ("rf", "gb"):
        for depth in (int(d) for d in a.depths.split(",")):
            for trees in (int(t) for t in a.trees.split(",")):
                spec = {**base, "name": f"credit-{kind}{trees}x{depth}", "dataset": "Credit",
                        "kind": kind, "trees": trees, "depth": depth}
                r = run_subprocess(spec, a.timeout)
                rows.append((spec, r))
                print(f"# {spec['name']}: " + ("out of reach" if r is None else
                      f"T0 {r['T0']:.1f} s, l2 p50 {r['lat']['l2']['p50']:.2f} ms"),
                      file=sys.stderr, flush=True)
    lines = ["# Loan data: scaling with trees and depth (Credit)", ""]
    lines += _header(env, load_average(), "python -m benchmarks.bench_loan --scaling "
                     + " ".join(x for x in sys.argv[1:] if x != "--scaling"))
    lines += [f"l2 only, {a.queries} test rows + {a.queries} uniform legal samples; a cell that "
              f"does not finish (training, build and queries) within {a.timeout:g} s is out of reach.",
              "", "| model | T0 (s) | peak RSS (MB) | mixed | n | l2 p50 (ms) | p99 (ms) | max (ms) |",
              "|---|---|---|---|---|---|---|---|"]
    for spec, r in rows:
        if r is None:
            lines.append(f"| {spec['name']} | out of reach (> {a.timeout:g} s) | | | | | | |")
            continue
        v = r["lat"]["l2"]
        lines.append(f"| {spec['name']} | {r['T0']:.2f} | {r['peak_mb']:.0f} | {r['mixed']:,} "
                     f"| {v['n']}/{v['of']} | {v['p50']:.3g} | {v['p99']:.3g} | {v['max']:.3g} |")
    out = a.out or HERE / "results" / "loan_scaling.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(rows, out.with_suffix(".png"))


def _plot(rows: list[tuple[dict[str, Any], dict[str, Any] | None]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no plot (pip install -e '.[bench]')", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for kind, ax in zip(("rf", "gb"), axes, strict=True):
        for depth in sorted({s["depth"] for s, _ in rows}):
            pts = [(s["trees"], r["lat"]["l2"]["p50"]) for s, r in rows
                   if r is not None and s["kind"] == kind and s["depth"] == depth]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=f"depth {depth}")
        ax.set(xscale="log", yscale="log", xlabel="trees", ylabel="l2 p50 (ms)",
               title=f"Credit, {kind.upper()}")
        ax.axhline(2.0, color="grey", linestyle="--", linewidth=0.8)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
