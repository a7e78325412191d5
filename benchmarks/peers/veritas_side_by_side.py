"""cfmaps and Veritas side by side: closest point of the target class, weighted l-infinity (issue 14).

    python -m benchmarks.peers.veritas_side_by_side                   # 3 forests, 10 queries each
    python -m benchmarks.peers.veritas_side_by_side --models pd-rf100x5 --queries 4

Veritas (``dtai-veritas``, Devos et al., ICML 2021) runs in its own venv
(``bash benchmarks/peers/setup_envs.sh veritas``) through
:mod:`benchmarks.peers.run_veritas`, fed through files: this script trains each forest as
``bench_loan`` does (Credit RF 100x5 and GB 300x4; Pima ``PD`` RF 100x5, split as the paper
benchmarks split it), writes its trees, the queries and the cost model to a job file,
and compares the answers with cfmaps' on the same queries.

The problem both tools solve. Veritas knows boxes, not integers or one-hot groups, so both
answer the *continuous relaxation*: every feature continuous within its declared range
(cfmaps gets a schema with every feature ``continuous`` and the same bounds), distance
``max_j w_j |x'_j - x_j|`` with cfmaps' default weights ``w_j = 1 / (upper_j - lower_j)``
(Veritas gets the weights as the box's per-feature scale, so no model is rescaled), target
the other class. On the declared schemas the answers would differ (integers, one-hot).

Reported per model: how many queries Veritas solved with a proof within ``--time-limit``,
whether its distance equals cfmaps' (relative 1e-9, plus one float64 ulp of the moved
value: cfmaps states the infimum, Veritas the distance of a float64 point on the open side),
whether any valid Veritas point is nearer than cfmaps (a cfmaps bug), validity of both by
scikit-learn's ``predict``, and the per-query times and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_loan import _model, uniform_legal
from benchmarks.common import SHARED
from benchmarks.peers.peers import VENVS

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results" / "veritas.md"
REL_TOL = 1e-9
#: name -> (dataset file, kind, trees, depth, load_csv options)
MODELS = {
    "credit-rf100x5": ("Credit.csv", "rf", 100, 5, {}),
    "credit-gb300x4": ("Credit.csv", "gb", 300, 4, {}),
    "pd-rf100x5": ("Pima-Diabetes.csv", "rf", 100, 5, {"whole_floats_as_integers": True}),
}


def veritas_python() -> Path:
    py = VENVS / "veritas" / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"{py} is missing: run `bash benchmarks/peers/setup_envs.sh veritas` first")
    return py


def le_boundary(t: float) -> float:
    """The largest float64 T with ``float32(T) <= t``: scikit-learn sends x left iff
    ``float32(x) <= t``, i.e. iff ``x <= T``. Between the float32 f at or below t and the
    next float32 g, float64 inputs round to f below their midpoint and to g above it; the
    midpoint itself rounds to whichever of the two is even."""
    f = np.float32(t)
    if float(f) > t:
        f = np.nextafter(f, np.float32(-np.inf))
    g = np.nextafter(f, np.float32(np.inf))
    mid = (float(f) + float(g)) / 2.0  # exact: both are float32
    return mid if np.float32(mid) == f else float(np.nextafter(mid, -np.inf))


def export(trained: Any, kind: str) -> tuple[list[dict[str, Any]], float]:
    """Node arrays for Veritas (split = one float64 above the real boundary, since Veritas
    sends ``x < split`` left) and the raw-score offset; class 1 iff base + leaves > 0."""
    if kind == "rf":
        ests = [e.tree_ for e in trained.estimators_]
        base = -len(ests) / 2.0
    else:
        ests = [e[0].tree_ for e in trained.estimators_]
        base = float(trained._raw_predict_init(np.zeros((1, trained.n_features_in_)))[0, 0])
    trees = []
    for tr in ests:
        leaf = tr.children_left == -1
        v = tr.value[:, 0, :]
        vals = v[:, 1] / v.sum(axis=1) if kind == "rf" else trained.learning_rate * v[:, 0]
        trees.append(
            {
                "left": tr.children_left.tolist(),
                "right": tr.children_right.tolist(),
                "feature": np.where(leaf, 0, tr.feature).tolist(),
                "split": [0.0 if lf else float(np.nextafter(le_boundary(t), np.inf))
                          for lf, t in zip(leaf, tr.threshold, strict=True)],
                "leaf": np.where(leaf, vals, 0.0).tolist(),
            }
        )
    return trees, base


def raw_score(trained: Any, kind: str, X: np.ndarray, trees: list[dict[str, Any]], base: float) -> np.ndarray:
    """The raw score Veritas should compute, from scikit-learn's own routing (``apply``)."""
    ests = trained.estimators_ if kind == "rf" else [e[0] for e in trained.estimators_]
    out = np.full(len(X), base)
    for est, tr in zip(ests, trees, strict=True):
        out += np.asarray(tr["leaf"])[est.apply(X.astype(np.float32))]
    return out


def continuous_schema(schema: Any) -> Any:
    from maps_core.schema import Feature, FeatureSchema

    lo, hi = schema.domains()
    return FeatureSchema(
        tuple(Feature(name=f.name, type="continuous", lower=float(a), upper=float(b))
              for f, a, b in zip(schema.features, lo, hi, strict=True))
    )


def run_model(name: str, n_queries: int, time_limit: float) -> dict[str, Any]:
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import train_test_split

    from app.settings import Settings
    from maps_core import CounterfactualMaps, load_csv

    fname, kind, n_trees, depth, opts = MODELS[name]
    data = load_csv(SHARED / "datasets" / fname, **opts)
    Xtr, Xte, ytr, _ = train_test_split(data.X, data.y, test_size=0.2, random_state=0)
    trained = _model(kind, n_trees, depth).fit(Xtr, ytr)
    schema = continuous_schema(data.schema)
    w = schema.default_weights()
    lower, upper = schema.domains()
    half = n_queries // 2
    X = np.vstack([Xte[: n_queries - half], uniform_legal(data.schema, half, np.random.default_rng(0))])
    targets = 1 - trained.predict(X).astype(int)

    trees, base = export(trained, kind)
    X_check = np.vstack([Xtr[:300], X, uniform_legal(schema, 200, np.random.default_rng(1))])
    raw_check = raw_score(trained, kind, X_check, trees, base)
    if kind == "rf":
        sk_raw = (trained.predict_proba(X_check)[:, 1] - 0.5) * n_trees
    else:
        sk_raw = trained.decision_function(X_check)
    if not np.allclose(raw_check, sk_raw, rtol=0, atol=1e-9):
        raise RuntimeError(f"{name}: exported trees do not reproduce scikit-learn's scores")
    folder = Path(tempfile.mkdtemp(prefix="cfmaps-veritas-"))
    job = {
        "trees": trees, "base": base, "X_check": X_check.tolist(), "raw_check": raw_check.tolist(),
        "X": X.tolist(), "targets": targets.tolist(), "weights": w.tolist(),
        "lower": lower.tolist(), "upper": upper.tolist(), "time_limit": time_limit,
    }
    (folder / "job.json").write_text(json.dumps(job))

    # cfmaps: JIT warm-up on a tiny forest, then the build (T0), then each query on its own
    warm = RandomForestClassifier(2, max_depth=2, random_state=0).fit(Xtr[:300], ytr[:300])
    CounterfactualMaps.build(warm, schema).counterfactual(Xte[0], norm="linf")
    defaults = Settings()
    t = time.perf_counter()
    maps = CounterfactualMaps.build(trained, schema, max_rectangles=defaults.build_max_rectangles,
                                    max_memory=defaults.effective_build_memory())
    t0 = time.perf_counter() - t
    ours = []
    for x, tg in zip(X, targets, strict=True):
        s = time.perf_counter()
        r = maps.counterfactual(x, target=int(tg), norm="linf")
        dt = time.perf_counter() - s
        b = r.best
        rec: dict[str, Any] = {"seconds": dt, "distance": None, "valid": False, "x_cf": None}
        if b is not None:
            rec.update(distance=float(b.distance), x_cf=[float(v) for v in b.x],
                       cost=float(np.max(np.abs(b.x - x) * w)),
                       valid=bool(int(trained.predict(b.x[None])[0]) == int(tg)))
        ours.append(rec)

    out = folder / "veritas.jsonl"
    proc = subprocess.run(
        [str(veritas_python()), str(HERE / "run_veritas.py"), str(folder / "job.json"), str(out)],
        capture_output=True, text=True, timeout=n_queries * (time_limit + 30) + 120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"Veritas runner failed on {name}:\n{proc.stderr[-3000:]}")
    theirs = [json.loads(line) for line in out.read_text().splitlines()]
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    for rec, x, tg in zip(theirs, X, targets, strict=True):
        if rec.get("x_cf") is not None:
            cf = np.asarray(rec["x_cf"])
            rec["valid"] = bool(int(trained.predict(cf[None])[0]) == int(tg))
            rec["cost"] = float(np.max(np.abs(cf - x) * w))  # recomputed here
            moved = cf != x
            rec["ulp_slack"] = float(np.max(w[moved] * np.spacing(np.abs(cf[moved])), initial=0.0))
    return {"name": name, "features": len(schema), "T0": t0, "ours": ours, "theirs": theirs,
            "X": X.tolist(), "targets": targets.tolist(), "meta": meta}


def compare(o: dict[str, Any], t: dict[str, Any]) -> str:
    """``exact`` (same to 1e-9 relative plus one float64 ulp of a moved value), ``farther``,
    ``nearer`` (a valid Veritas point nearer than cfmaps' infimum), ``-`` (no answer)."""
    if o.get("distance") is None or t.get("cost") is None:
        return "-"
    a, b = o["distance"], t["cost"]
    tol = REL_TOL * max(abs(a), abs(b)) + t["ulp_slack"]
    if abs(a - b) <= tol:
        return "exact"
    if b < a:
        return "nearer" if t["valid"] else "invalid-nearer"
    return "farther"


def _summary(res: dict[str, Any]) -> dict[str, Any]:
    ours, theirs = res["ours"], res["theirs"]
    kinds = [compare(o, t) for o, t in zip(ours, theirs, strict=True)]
    for t, k in zip(theirs, kinds, strict=True):
        t["vs_cfmaps"] = k
    proved = [i for i, t in enumerate(theirs) if t.get("proved") and t["status"] == "ok"]
    ratios = [t["seconds"] / o["seconds"] for o, t in zip(ours, theirs, strict=True)]
    return {
        "n": len(ours),
        "proved": len(proved),
        "exact": sum(kinds[i] == "exact" for i in proved),
        "farther": sum(kinds[i] == "farther" for i in proved),
        "nearer": kinds.count("nearer"),
        "unproved": sum(not t.get("proved") for t in theirs),
        "ours_invalid": sum(not o["valid"] for o in ours),
        "theirs_invalid": sum(t.get("valid") is False for t in theirs),
        "T0": res["T0"],
        "ours_p50_ms": 1e3 * float(np.median([o["seconds"] for o in ours])),
        "ours_max_ms": 1e3 * float(np.max([o["seconds"] for o in ours])),
        "theirs_p50_s": float(np.median([t["seconds"] for t in theirs])),
        "theirs_max_s": float(np.max([t["seconds"] for t in theirs])),
        "steps_p50": float(np.median([t["steps"] for t in theirs])),
        "ratio_p50": float(np.median(ratios)),
        "ratio_min": float(np.min(ratios)),
        "ratio_max": float(np.max(ratios)),
    }


NOTES = """\
Columns. *proved*: Veritas' bisection finished within the time limit, every step decided by
a complete Veritas search (`StopReason.NO_MORE_OPEN` / optimal for "no point of the target
class in this box", a solution for "some point"); its answer is then the exact optimum over
float64 inputs. *= cfmaps*: Veritas' point, its weighted linf recomputed here, equals
cfmaps' distance to 1e-9 relative plus one float64 ulp of the moved value (cfmaps states the
infimum; on an open cell side Veritas' point is the first float64 inside). *farther*: a
proved Veritas answer farther than that. *Veritas nearer*: any valid Veritas point nearer
than cfmaps' distance: a cfmaps bug. *invalid*: scikit-learn's `predict` at the point is not
the target. Times are per query: cfmaps after its build (`T0`, after a JIT warm-up on a tiny
forest), Veritas for the whole bisection (its ensemble built once per model, not timed);
the ratio is Veritas / cfmaps on each query (median, min, max). *steps*: Veritas searches
per query (the bisection's length).

How Veritas is driven. Veritas has no nearest-counterfactual call: its robustness search
(`veritas.VeritasRobustnessSearch`) bisects the radius of a box around the query with an A*
search for the largest output in the box, to a relative gap of 1e-5. `run_veritas.py` does
the same bisection over the finite set of radii at which the box reaches a new cell
(`|split - x_j| * w_j`), so the result is exact and comparable to 1e-9. It gallops up from
the smallest radii (1st, 2nd, 4th, 8th... then bisects): Veritas decides small boxes fast,
while one search over a large box (or the whole domain) ran out of 10 s on Credit GB 300x4
even though a point of the target class was in it. Each search uses the focal-search
settings of `VeritasRobustnessSearch` (`focal_eps = 0.2`, `max_focal_size = 1000`). The
ensemble is
built from scikit-learn's node arrays with each split placed at the real boundary of
scikit-learn's `float32(x) <= t` (`veritas.get_addtree` would use `x <= t` in float64, a
slightly different model on slivers narrower than a float32 ulp), and checked against
scikit-learn's scores on 500+ points before any query. The weights enter as the box's
per-feature scale (box `[x_j - r / w_j, x_j + r / w_j]`), so neither model is rescaled.

The problem is the continuous relaxation of the declared schemas (Veritas has no integers or
one-hot groups): both tools get every feature continuous in its declared range. cfmaps'
answers on the declared schemas (integers, one-hot groups, l1/l2/linf) are in `loan.md`.
"""


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _machine() -> str:
    cpu, ram = "?", float("nan")
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        ram = int(open("/proc/meminfo", encoding="utf-8").readline().split()[1]) / 2**20
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), {ram:.0f} GB RAM"


def _report(a: argparse.Namespace, rows: list[Any], load_start: str) -> list[str]:
    import sklearn

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE).stdout.strip()

    dirty = git("status", "--porcelain", "--", "maps_core", "benchmarks")
    dirty = " (with uncommitted changes)" if dirty else ""
    models = "" if a.models == ",".join(MODELS) else f" --models {a.models}"
    meta = rows[0][0]["meta"] if rows else {}
    lines = [
        "# cfmaps and Veritas: closest point of the other class, weighted l-infinity (issue 14)",
        "",
        f"Command: `python -m benchmarks.peers.veritas_side_by_side --queries {a.queries} "
        f"--time-limit {a.time_limit:g}{models}`; one run.",
        "",
        f"Machine: {_machine()}; Python {platform.python_version()}, scikit-learn {sklearn.__version__}, "
        f"numpy {np.__version__}; dtai-veritas {meta.get('veritas', '?')} (its venv). "
        f"Date {datetime.now(UTC).isoformat(timespec='seconds')}; git "
        f"`{git('log', '-1', '--format=%h %s')[:90]}`{dirty}. Load average at start {load_start}, "
        "at end "
        f"{_load()} (2 cores, shared: every time is a wall time).",
        "",
        "Same forest (scikit-learn, trained as `bench_loan` trains it), same queries (half test rows, half "
        "uniform legal samples), target the other class, distance `max_j |x'_j - x_j| / (upper_j - lower_j)` "
        "over the declared ranges with every feature continuous; Veritas limited to "
        f"{a.time_limit:g} s per query.",
        "",
        "| model | m | queries | Veritas proved | = cfmaps | farther (proved) | Veritas nearer | "
        "no proof | invalid cfmaps / Veritas | cfmaps T0 (s) | cfmaps p50 / max (ms) | "
        "Veritas p50 / max (s) | steps p50 | ratio p50 (min - max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res, s in rows:
        lines.append(
            f"| {res['name']} | {res['features']} | {s['n']} | {s['proved']} | {s['exact']}/{s['proved']} | "
            f"{s['farther']} | {s['nearer']} | {s['unproved']} | "
            f"{s['ours_invalid']} / {s['theirs_invalid']} | "
            f"{s['T0']:.3g} | {s['ours_p50_ms']:.3g} / {s['ours_max_ms']:.3g} | "
            f"{s['theirs_p50_s']:.3g} / {s['theirs_max_s']:.3g} | {s['steps_p50']:.0f} | "
            f"{s['ratio_p50']:.3g}x ({s['ratio_min']:.3g} - {s['ratio_max']:.3g}) |"
        )
    return [*lines, "", NOTES]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--queries", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=10.0, help="Veritas seconds per query")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    load_start = _load()
    rows = []
    for name in a.models.split(","):
        res = run_model(name, a.queries, a.time_limit)
        s = _summary(res)
        print(json.dumps({"model": name, **s}), flush=True)
        rows.append((res, s))
    a.out.write_text("\n".join(_report(a, rows, load_start)) + "\n")
    raw = [{"model": res["name"], "x": x, "target": tg, "cfmaps": o, "veritas": t}
           for res, _ in rows
           for x, tg, o, t in zip(res["X"], res["targets"], res["ours"], res["theirs"], strict=True)]
    a.out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
