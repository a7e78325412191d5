"""cfmaps and treecf side by side on XGBoost and LightGBM models (issue 15).

    python -m benchmarks.peers.native_side_by_side                     # 12 models, 10 queries each
    python -m benchmarks.peers.native_side_by_side --models credit-xgb100x5 --queries 4

Same models, same queries, same cost. Each model of ``bench_loan.NATIVE`` (XGBoost and
LightGBM, 100 trees depth 5 and 500 trees depth 6, on Credit, Adult and FICO with their
declared schemas) is trained as ``bench_loan`` trains it and saved in its library's own
format. cfmaps builds its maps from that file (its own parsers, the service's default
budgets) and answers each query with l1 and the schema's default weights. treecf reads the
same booster's JSON dump with its own parsers, in its own venv
(``benchmarks/peers/setup_envs.sh treecf``), exact backend, with the cost model restated
in its terms (:mod:`benchmarks.peers.run_treecf_native`): its objective then *is* cfmaps'
weighted l1, over the same legal domain (ranges, integers, one-hot groups).

Queries: the first N/2 test rows and N/2 uniform legal samples; the target is the other
class. Reported per model: how many queries treecf proved optimal within ``--time-limit``
seconds, whether cfmaps' distance equals treecf's on each of those (relative 1e-6; treecf
states its distance at its returned point, cfmaps the infimum), whether any treecf answer
is *nearer* than cfmaps' (which would be a cfmaps bug), the validity of every returned
point by the library's own ``predict``, and the median per-query time of each and the
median per-query ratio.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_loan import NATIVE, _model, uniform_legal
from benchmarks.common import SHARED
from benchmarks.peers.peers import peer_python

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results" / "native_treecf.md"
REL_TOL = 1e-6


def _dump(kind: str, model: Any, folder: Path) -> tuple[Path, Any]:
    """Write the model's JSON dump for treecf; return its path and the model as cfmaps
    serves it (read from the library's own file by cfmaps' parsers)."""
    if kind == "xgb":
        from maps_core.adapters.xgboost_json import parse_xgboost

        path = folder / "model.json"
        model.save_model(path)
        return path, parse_xgboost(path.read_bytes())
    from maps_core.adapters.lightgbm_text import parse_lightgbm

    path = folder / "model_dump.json"
    path.write_text(json.dumps(model.booster_.dump_model()))
    return path, parse_lightgbm(model.booster_.model_to_string())


def _raw_target(kind: str, target: int) -> tuple[float, float]:
    """The raw-score interval of the target class. XGBoost predicts 1 when its float32
    probability exceeds 0.5, which needs a margin above about 1.2e-7; LightGBM when the
    raw score is positive. Margins are piecewise constant, so the slack never decides."""
    if target == 1:
        return (1e-6 if kind == "xgb" else 1e-12, 1e30)
    return (-1e30, 0.0)


def run_model(name: str, n_queries: int, time_limit: float) -> dict[str, Any]:
    from sklearn.model_selection import train_test_split

    from app.settings import Settings
    from maps_core import CounterfactualMaps, load_csv

    ds_name, kind, trees, depth = NATIVE[name]
    data = load_csv(SHARED / "datasets" / f"{ds_name}.csv")
    schema = data.schema
    Xtr, Xte, ytr, _ = train_test_split(data.X, data.y, test_size=0.2, random_state=0)
    trained = _model(kind, trees, depth).fit(Xtr, ytr)
    folder = Path(tempfile.mkdtemp(prefix="cfmaps-treecf-"))
    dump, served = _dump(kind, trained, folder)
    defaults = Settings()
    t = time.perf_counter()
    maps = CounterfactualMaps.build(
        served,
        schema,
        max_rectangles=defaults.build_max_rectangles,
        max_memory=defaults.effective_build_memory(),
    )
    t0 = time.perf_counter() - t
    half = n_queries // 2
    X = np.vstack([Xte[: n_queries - half], uniform_legal(schema, half, np.random.default_rng(0))])
    pred = trained.predict(X).astype(int)
    targets = 1 - pred
    w = schema.default_weights()
    lower, upper = schema.domains()
    groups = list(schema.groups().values())
    in_group = {j for g in groups for j in g}
    sigma = [2.0 if j in in_group else 1.0 / w[j] for j in range(len(schema))]
    job = {
        "dump": str(dump),
        "X": X.tolist(),
        "raw_targets": [_raw_target(kind, int(t)) for t in targets],
        "sigma": sigma,
        "lower": lower.tolist(),
        "upper": upper.tolist(),
        "groups": groups,
        "integer": [j for j, f in enumerate(schema.features) if f.is_integral and j not in in_group],
        "time_limit": time_limit,
    }
    (folder / "job.json").write_text(json.dumps(job))

    # cfmaps: warm once (JIT), then each query timed on its own
    maps.counterfactual(X[0], target=int(targets[0]), norm="l1")
    ours = []
    for x, tg in zip(X, targets, strict=True):
        s = time.perf_counter()
        r = maps.counterfactual(x, target=int(tg), norm="l1")
        dt = time.perf_counter() - s
        best = r.best
        ours.append(
            {
                "seconds": dt,
                "distance": None if best is None else float(best.distance),
                "valid": best is not None and int(trained.predict(best.x[None])[0]) == tg,
            }
        )

    out = folder / "treecf.jsonl"
    proc = subprocess.run(
        [str(peer_python("treecf")), str(HERE / "run_treecf_native.py"), str(folder / "job.json"), str(out)],
        capture_output=True,
        text=True,
        timeout=n_queries * (time_limit + 30) + 120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"treecf runner failed on {name}:\n{proc.stderr[-3000:]}")
    theirs = [json.loads(line) for line in out.read_text().splitlines()]
    for rec, x, tg in zip(theirs, X, targets, strict=True):
        if rec.get("x_cf") is not None:
            cf = np.asarray(rec["x_cf"])
            rec["valid"] = int(trained.predict(cf[None])[0]) == tg
            # its cost recomputed by cfmaps' own weighted l1 (groups: 1 per switch)
            d = float(
                np.sum(np.abs(cf - x) * w * np.array([0.0 if j in in_group else 1.0 for j in range(len(x))]))
            )
            d += sum(float(np.any(cf[g] != x[g])) for g in groups)
            rec["our_cost"] = d
    return {
        "name": name,
        "trees": trees,
        "depth": depth,
        "features": len(schema),
        "T0": t0,
        "ours": ours,
        "theirs": theirs,
        "X": X.tolist(),
    }


def _summary(res: dict[str, Any]) -> dict[str, Any]:
    ours, theirs = res["ours"], res["theirs"]
    proved = [i for i, r in enumerate(theirs) if r.get("proof") == "optimal"]
    agree = 0
    worst = 0.0
    for i in proved:
        a, b = ours[i]["distance"], theirs[i]["distance"]
        rel = abs(a - b) / max(abs(a), abs(b), 1e-300)
        worst = max(worst, rel)
        agree += rel <= REL_TOL
    # any valid treecf answer, proved or not, nearer than cfmaps' infimum would be a cfmaps bug
    nearer = sum(
        1
        for o, t in zip(ours, theirs, strict=True)
        if t.get("valid") and o["distance"] is not None and t["distance"] < o["distance"] * (1 - REL_TOL)
    )
    ratios = [t["seconds"] / o["seconds"] for o, t in zip(ours, theirs, strict=True)]
    return {
        "n": len(ours),
        "proved": len(proved),
        "agree": agree,
        "nearer": nearer,
        "worst_rel": worst,
        "ours_invalid": sum(not o["valid"] for o in ours),
        "theirs_invalid": sum(r.get("valid") is False for r in theirs),
        "ours_p50_ms": 1e3 * float(np.median([o["seconds"] for o in ours])),
        "ours_max_ms": 1e3 * float(np.max([o["seconds"] for o in ours])),
        "theirs_p50_s": float(np.median([t["seconds"] for t in theirs])),
        "ratio_p50": float(np.median(ratios)),
        "ratio_proved_p50": float(np.median([ratios[i] for i in proved])) if proved else float("nan"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(NATIVE))
    p.add_argument("--queries", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=10.0, help="treecf seconds per query")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    rows = []
    for name in a.models.split(","):
        res = run_model(name, a.queries, a.time_limit)
        s = _summary(res)
        print(json.dumps({"model": name, **s}), flush=True)
        rows.append((res, s))
    git = subprocess.run(
        ["git", "log", "-1", "--format=%h %s"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# cfmaps and treecf on XGBoost and LightGBM models",
        "",
        "Command: `python -m benchmarks.peers.native_side_by_side "
        f"--queries {a.queries} --time-limit {a.time_limit:g}`;"
        f" one run. Machine: {platform.machine()}, Python {platform.python_version()}; "
        f"{datetime.now(UTC).isoformat(timespec='seconds')}; git `{git[:80]}`.",
        "",
        "Same booster, same queries (half test rows, half uniform legal samples), target the other class, "
        "weighted l1 with the schema's default weights over the same legal domain (treecf: normalizers 1/w, "
        "`Range` per feature, `OneHot` groups, integer value policy, exact backend, no warm start). "
        "cfmaps' build time, memory and latency over many more queries are in `native.md`.",
        "",
        "| model | m | queries | treecf proved optimal | same distance (rel 1e-6) | "
        "treecf nearer (any answer) | "
        "max rel diff | invalid (cfmaps / treecf) | cfmaps p50 / max (ms) | treecf p50 (s) | "
        "time ratio p50 (all / proved) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res, s in rows:
        lines.append(
            f"| {res['name']} | {res['features']} | {s['n']} | {s['proved']} | {s['agree']}/{s['proved']} | "
            f"{s['nearer']} | {s['worst_rel']:.1e} | {s['ours_invalid']} / {s['theirs_invalid']} | "
            f"{s['ours_p50_ms']:.3g} / {s['ours_max_ms']:.3g} | {s['theirs_p50_s']:.3g} | "
            f"{s['ratio_p50']:.3g}x / {s['ratio_proved_p50']:.3g}x |"
        )
    a.out.write_text("\n".join(lines) + "\n")
    # every query's answers, for a closer look at any disagreement
    raw = [{"model": res["name"], "x": x, "ours": o, "treecf": t}
           for res, _ in rows for x, o, t in zip(res["X"], res["ours"], res["theirs"], strict=True)]
    a.out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
