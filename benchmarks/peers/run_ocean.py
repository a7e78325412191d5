"""OCEAN (PyPI ``oceanpy``) runner: ``ConstraintProgrammingExplainer`` (OR-Tools CP-SAT).

Run by benchmarks/.venvs/ocean/bin/python (Python 3.12+): ``run_ocean.py JOB.npz OUT.jsonl``.

Units. ``ocean.feature.parse_features`` would rescale every continuous column to
[-0.5, 0.5] (x' = (x - min) / (max - min) - 0.5), and a forest trained on that frame is not
our forest. So this runner does NOT call ``parse_features``: it builds OCEAN's ``Mapper``
directly over the original columns (continuous -> Feature.CONTINUOUS, integer ->
Feature.DISCRETE, binary -> Feature.BINARY), hands OCEAN the very forest trained on the
original data, and OCEAN's objective is then already plain L1 (or squared L2) in original
units. See README.md in this folder for the conversion when OCEAN's own scaling is used.

Options (``job.options``): norm ("l1" | "l2"), time_limit (s per query, default 60),
num_workers (CP-SAT workers; default: CP-SAT's own = all cores), random_seed (42).
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
from _common import Job, Output, log, main_wrapper, record, write_meta


def make_mapper(job: Job):  # type: ignore[no-untyped-def]
    import pandas as pd
    from ocean.abc import Mapper
    from ocean.feature import Feature

    mapping = {}
    for j, (name, ftype) in enumerate(zip(job.feature_names, job.feature_types, strict=True)):
        col = job.X_train[:, j]
        if ftype == "binary":
            feat = Feature(Feature.Type.BINARY)
        elif ftype == "integer":
            levels = sorted({float(v) for v in col} | {float(job.lower[j]), float(job.upper[j])})
            feat = Feature(Feature.Type.DISCRETE, levels=levels)
        else:
            # outer levels only bound the search domain; a query or counterfactual never
            # needs to leave [lower, upper] (every threshold lies inside it), and an interval's
            # cost is the distance from the query to its nearest end, so these do not affect
            # distances. Keep them wide so every query value lies strictly inside.
            lo = min(float(job.lower[j]), float(job.X_q[:, j].min()))
            hi = max(float(job.upper[j]), float(job.X_q[:, j].max()))
            pad = max(1.0, hi - lo)
            feat = Feature(Feature.Type.CONTINUOUS, levels=(lo - pad, hi + pad))
        mapping[name] = feat
    return Mapper(mapping, columns=pd.Index(job.feature_names))


def run(job: Job, out_path: str, meta_path: str) -> None:
    from importlib.metadata import version

    import ocean
    import ortools
    from _common import load_forest

    opts = job.options
    norm_name = str(opts.get("norm", "l1")).lower()
    if norm_name not in ("l1", "l2"):
        raise ValueError(f"OCEAN's CP backend supports norm l1 or l2, not {norm_name!r}")
    norm = 1 if norm_name == "l1" else 2
    time_limit = float(opts.get("time_limit", 60.0))
    num_workers = opts.get("num_workers")
    seed = int(opts.get("random_seed", 42))

    model, forest_info = load_forest(job)
    for j, t in enumerate(job.feature_types):
        if t != "continuous" and not np.all(job.X_q[:, j] == np.round(job.X_q[:, j])):
            raise ValueError(f"feature {job.feature_names[j]!r} is {t} but a query is not integral")

    t0 = time.perf_counter()
    mapper = make_mapper(job)
    explainer = ocean.ConstraintProgrammingExplainer(model, mapper=mapper)
    setup_s = time.perf_counter() - t0
    log(f"ocean: explainer built in {setup_s:.2f}s ({len(model.estimators_)} trees)")
    meta = {
        "peer": "ocean",
        "oceanpy": version("oceanpy"),
        "ortools": ortools.__version__,
        "forest": forest_info,
        "setup_s": setup_s,
        "options": {
            "norm": norm_name,
            "time_limit": time_limit,
            "num_workers": num_workers,
            "random_seed": seed,
        },
    }
    write_meta(meta_path, meta)

    out = Output(out_path)
    for i in range(len(job.X_q)):
        x = job.X_q[i]
        target = int(job.targets[i])
        t1 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exp = explainer.explain(
                    x.copy(),
                    y=target,
                    norm=norm,
                    max_time=time_limit,
                    num_workers=num_workers,
                    random_seed=seed,
                )
            dt = time.perf_counter() - t1
            st = explainer.get_solving_status()
            scale = float(explainer._obj_scale)
            lb = explainer.solver.BestObjectiveBound() / scale
            if exp is None:
                status = "infeasible" if st == "INFEASIBLE" else "no_cf"
                rec = record(
                    job,
                    model,
                    i,
                    peer="ocean",
                    time_s=dt,
                    cf=None,
                    status=status,
                    proved_optimal=(st == "INFEASIBLE"),
                    peer_status=st,
                )
            else:
                obj = explainer.get_objective_value()
                cf = np.asarray(exp.x, dtype=np.float64)
                if norm == 2:  # CP objective and bound are sums of squares
                    obj, lb = math.sqrt(max(obj, 0.0)), math.sqrt(max(lb, 0.0))
                rec = record(
                    job,
                    model,
                    i,
                    peer="ocean",
                    time_s=dt,
                    cf=cf,
                    status="ok",
                    proved_optimal=(st == "OPTIMAL"),
                    peer_status=st,
                    peer_objective=obj,
                    lower_bound=lb,
                )
        except Exception as exc:  # noqa: BLE001 - report and go on with the next query
            dt = time.perf_counter() - t1
            rec = record(
                job,
                model,
                i,
                peer="ocean",
                time_s=dt,
                cf=None,
                status="error",
                error=f"{type(exc).__name__}: {exc}",
            )
        out.write(rec)
        log(
            f"ocean q{i}: {rec['status']}/{rec['peer_status']} {dt:.2f}s "
            f"l1={rec['dist_l1']} valid={rec['valid']}"
        )
    out.close()
    meta["done"] = True
    write_meta(meta_path, meta)


if __name__ == "__main__":
    main_wrapper(run)
