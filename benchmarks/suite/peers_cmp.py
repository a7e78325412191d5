"""Part 3: OCEAN, treecf and DiCE on our forests and our queries, beside our own answers.

Our side comes from the part-1 worker of the same forest (seed 0): unit-weight L1 answers
on the first test rows (plain L1 in original units, the peers' objective), target = the
other class of the forest's prediction. The peers run through ``benchmarks/peers`` in their
own venvs; ``run_peer`` re-trains the forest there and checks it bit for bit; here we re-fit
it in this process too and compare its fingerprint with the worker's.
"""

from __future__ import annotations

import math

import numpy as np

from benchmarks.suite.config import SPLIT_SEED


def _ulp32(v: float) -> float:
    v = abs(float(v))
    return float(np.spacing(np.float32(max(v, 1.0))))


def tolerance(d: float, q: np.ndarray) -> float:
    """Float32 boundary slack: a peer's point sits one float32 step beyond a threshold."""
    return 1e-6 * max(1.0, abs(d)) + 2 * len(q) * _ulp32(np.max(np.abs(q)))


def run_peers(dataset: str, worker: dict, plan, log) -> dict:
    """Run every available peer on the dataset's peer queries; compare with ours."""
    from benchmarks.common import load
    from benchmarks.peers.peers import available, run_peer_full
    from benchmarks.suite.queries import fit_forest, forest_hash

    out: dict = {"dataset": dataset, "peers": {}, "notes": []}
    ours = worker.get("peer_queries")
    if not ours:
        out["error"] = "no unit-weight answers from our engine (the build did not finish?)"
        return out
    n = min(len(ours), plan.n_queries[dataset])
    ours = ours[:n]
    Xtr, Xte, ytr, yte, schema = load(dataset, seed=SPLIT_SEED)
    spec = worker["spec"]
    forest = fit_forest(Xtr, ytr, spec["trees"], spec["depth"], spec["seed"])
    if forest_hash(forest) != worker["forest_hash"]:
        out["error"] = "forest re-fitted here differs from the worker's: peers not run"
        return out
    Q = Xte[:n]
    targets = [o["target"] for o in ours]
    out.update(n=n, ours=ours, queries=Q.tolist())
    limits = {"ocean": plan.ocean_time_limit, "treecf": plan.treecf_time_limit, "dice": 0.0}
    for name in plan.peers:
        if not available(name):
            out["notes"].append(f"{name}: venv missing (bash benchmarks/peers/setup_envs.sh)")
            continue
        log(f"  {dataset}: {name} on {n} queries (limit {limits[name]:g} s/query)")
        try:
            recs, meta = run_peer_full(
                name, forest, Q, norm="l1", time_limit=limits[name] or 60.0, X_train=Xtr,
                y_train=ytr, targets=targets, schema=schema, nice=0,
            )
        except Exception as exc:  # a broken peer must not sink the suite
            out["peers"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            log(f"  !! {name} failed: {exc}")
            continue
        keep = ("status", "time_s", "valid", "proved_optimal", "peer_status", "peer_objective",
                "lower_bound", "dist_l1", "domain_ok", "error")
        out["peers"][name] = {
            "records": [{k: r.get(k) for k in keep} for r in recs],
            "meta": {k: meta.get(k) for k in ("python", "oceanpy", "ortools", "dice-ml", "treecf",
                                              "setup_s", "wall_s", "timed_out", "fatal")
                     if k in meta},
            "forest_source": (meta.get("forest") or {}).get("source"),
        }
        out["peers"][name]["summary"] = summarize(name, recs, ours, Q)
    return out


def summarize(name: str, recs: list[dict], ours: list[dict], Q: np.ndarray) -> dict:
    """Time per query, validity, proofs, distance ratios peer/ours, and mismatches."""
    t = [r["time_s"] for r in recs if r.get("time_s") is not None]
    ratios, mism, below, matched, both = [], [], [], 0, 0
    for i, (r, o) in enumerate(zip(recs, ours, strict=True)):
        if not r.get("valid") or r.get("dist_l1") is None or o.get("distance") is None:
            continue
        d_ours = o["distance"]
        d_peer = r["dist_l1"]
        ratios.append(d_peer / d_ours if d_ours > 0 else (1.0 if d_peer == 0 else math.inf))
        tol = tolerance(d_ours, Q[i])
        rec = {"i": i, "ours": d_ours, "ours_point_l1": o.get("cf_distance"), "ours_valid": o.get("valid"),
               "peer": d_peer, "peer_objective": r.get("peer_objective"),
               "peer_status": r.get("peer_status"), "tolerance": tol}
        if r.get("proved_optimal"):
            both += 1
            cands = [d_peer] + ([r["peer_objective"]] if r.get("peer_objective") is not None else [])
            if any(abs(d_ours - c) <= tol for c in cands):
                matched += 1
            else:
                rec["kind"] = ("ours larger (ours not optimal?)" if d_ours > d_peer
                               else "ours smaller (peer's proof wrong?)")
                mism.append(rec)
        elif d_peer < d_ours - tol and r.get("domain_ok") is not False:
            # Any valid, legal counterfactual closer than ours refutes our optimum.
            rec["kind"] = "peer's valid counterfactual (not proved optimal) is closer than ours"
            below.append(rec)
    return {
        "n": len(recs),
        "answered": sum(r.get("dist_l1") is not None for r in recs),
        "valid": sum(bool(r.get("valid")) for r in recs),
        "proved_optimal": sum(bool(r.get("proved_optimal")) for r in recs),
        "median_time_s": float(np.median(t)) if t else None,
        "mean_time_s": float(np.mean(t)) if t else None,
        "max_time_s": float(np.max(t)) if t else None,
        "median_ratio": float(np.median(ratios)) if ratios else None,
        "max_ratio": float(np.max(ratios)) if ratios else None,
        "optimal_compared": both,
        "optimal_matched": matched,
        "mismatches": mism + below,
        "closer_than_ours": len(below),
        "statuses": {s: sum(r.get("status") == s for r in recs) for s in {r.get("status") for r in recs}},
    }
