"""treecf (PyPI ``treecf``) runner: exact branch-and-bound backend (Rust core).

Run by benchmarks/.venvs/treecf/bin/python: ``run_treecf.py JOB.npz OUT.jsonl``.

Set-up: ``treecf.Explainer(forest, normalizers=np.ones(m), value_policy={f: "integer"
for integer and binary features})`` -- with unit normalizers and unit weights its
objective ``sum(weight * |delta| / sigma)`` is plain L1 in original units; the "integer"
policy is a hard constraint of the exact search, so binary features move 0 <-> 1 and
integer features stay integral, as in our engine's integer/binary schema types.

Per query: ``explain(x, target=Target.raw(range=...), backend="exact",
time_budget_s=time_limit, node_budget=..., warm_start=..., search=..., seed=...)``.
For a RandomForestClassifier treecf's raw score is the averaged class-1 probability
(identity link); sklearn predicts class 1 iff P(1) > P(0), i.e. P(1) > 0.5 (a tie goes to
class 0), so the target is [0.5 + 1e-9, 2] for class 1 and [-1, 0.5 + 1e-9] for class 0.
``proved_optimal`` = ``proof == "optimal"``. Binary classification only.

Options: norm (must be "l1"), time_limit (s per query, default 60), node_budget
(treecf default 2,000,000), integer_policy (True; False treats every feature as
continuous, which is NOT our semantics for integer/binary features), warm_start
(default False when any feature is integer or binary -- see the note in run() -- else
True), search ("refine"), random_seed (0).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from _common import Job, Output, log, main_wrapper, record, write_meta

EPS = 1e-9


def run(job: Job, out_path: str, meta_path: str) -> None:
    import treecf
    from _common import load_forest
    from treecf import Counterfactual, Explainer, Target

    opts = job.options
    norm = str(opts.get("norm", "l1")).lower()
    if norm != "l1":
        raise ValueError(f"treecf minimises weighted L1 only, not {norm!r}")
    if job.n_classes != 2:
        raise ValueError("treecf supports binary classifiers only")
    time_limit = float(opts.get("time_limit", 60.0))
    int_policy = bool(opts.get("integer_policy", True))
    node_budget = opts.get("node_budget")
    # treecf 0.3.2: the genetic warm start ignores value_policy, and the exact search then
    # certifies that non-integral incumbent as "optimal" (seen on BC: L1 6.4999999 with a
    # feature at 2.5000001 vs the true integer optimum 7). So no warm start by default
    # whenever a value policy is in force.
    has_int = int_policy and any(t != "continuous" for t in job.feature_types)
    warm_start = bool(opts.get("warm_start", not has_int))
    search = opts.get("search")
    seed = int(opts.get("random_seed", 0))

    model, forest_info = load_forest(job)
    t0 = time.perf_counter()
    names = [f"f{j}" for j in range(job.n_features)]
    policy = {
        n: "integer"
        for n, t in zip(names, job.feature_types, strict=True)
        if t != "continuous" and int_policy
    }
    explainer = Explainer(model, normalizers=np.ones(job.n_features), value_policy=policy)
    if list(explainer.ir.feature_names) != names:
        raise RuntimeError(f"unexpected treecf feature names {explainer.ir.feature_names}")
    targets = {1: Target.raw(range=(0.5 + EPS, 2.0)), 0: Target.raw(range=(-1.0, 0.5 + EPS))}
    setup_s = time.perf_counter() - t0
    meta = {
        "peer": "treecf",
        "treecf": treecf.__version__,
        "forest": forest_info,
        "setup_s": setup_s,
        "options": {
            "norm": norm,
            "time_limit": time_limit,
            "node_budget": node_budget,
            "warm_start": warm_start,
            "search": search,
            "random_seed": seed,
            "normalizers": 1.0,
            "value_policy": policy,
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
                res = explainer.explain(
                    x.copy(),
                    target=targets[target],
                    backend="exact",
                    time_budget_s=time_limit,
                    node_budget=node_budget,
                    warm_start=warm_start,
                    search=search,
                    seed=seed,
                )
            dt = time.perf_counter() - t1
            stats = dict(getattr(res, "solver_stats", {}) or {})
            lb = stats.get("lower_bound")
            keep = {k: stats.get(k) for k in ("nodes_expanded", "completed", "gap")}
            if isinstance(res, Counterfactual):
                rec = record(
                    job,
                    model,
                    i,
                    peer="treecf",
                    time_s=dt,
                    cf=res.x_cf,
                    status="ok",
                    proved_optimal=(res.proof == "optimal"),
                    peer_status=res.proof,
                    peer_objective=res.distance,
                    lower_bound=lb,
                    extra=keep,
                )
            else:
                status = "infeasible" if res.proof == "certified" else "no_cf"
                rec = record(
                    job,
                    model,
                    i,
                    peer="treecf",
                    time_s=dt,
                    cf=None,
                    status=status,
                    proved_optimal=(res.proof == "certified"),
                    peer_status=res.proof,
                    lower_bound=lb,
                    error=res.reason,
                    extra=keep,
                )
        except Exception as exc:  # noqa: BLE001
            dt = time.perf_counter() - t1
            rec = record(
                job,
                model,
                i,
                peer="treecf",
                time_s=dt,
                cf=None,
                status="error",
                error=f"{type(exc).__name__}: {exc}",
            )
        out.write(rec)
        log(
            f"treecf q{i}: {rec['status']}/{rec['peer_status']} {dt:.3f}s "
            f"l1={rec['dist_l1']} valid={rec['valid']}"
        )
    out.close()
    meta["done"] = True
    write_meta(meta_path, meta)


if __name__ == "__main__":
    main_wrapper(run)
