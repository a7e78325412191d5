"""One build and its queries, in a subprocess of its own (the parent enforces a hard timeout).

    python -m benchmarks.suite.worker SPEC.json OUT.json

SPEC keys: dataset, trees, depth, seed, max_seconds, n_queries, query_budget (seconds per
norm), norms, n_peer (unit-weight L1 answers on the first n_peer queries, for the peer
comparison), n_scan (queries also answered by linear scan, per norm, for at most
scan_budget seconds per norm).

OUT is rewritten (atomically) after every stage, so a run killed by the parent's timeout
still leaves what it finished. Timings: ``time.perf_counter`` around the public calls; the
numba kernels are warmed up on a tiny forest first (JIT loading is not part of T0).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


T_START = time.perf_counter()


# Rectangle budget of every build: the service's default (CFMAPS_BUILD_MAX_RECTANGLES), which
# bounds a build's memory (PD 100x5 reached 9.7 GB at 17M rectangles without it).
MAX_RECTANGLES = 5_000_000


def _dump(out: Path, res: dict) -> None:
    res.setdefault("stage_s", {})[res["stage"]] = round(time.perf_counter() - T_START, 2)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    os.replace(tmp, out)


def _warm_up(Xtr: np.ndarray, ytr: np.ndarray, schema) -> float:
    """Compile/load every kernel a timed call may use: build, search, refinement, scan."""
    from benchmarks.suite.queries import fit_forest
    from maps_core import CounterfactualMaps
    from maps_core.options import make_options
    from maps_core.query import linear_scan

    t = time.perf_counter()
    small = fit_forest(Xtr, ytr, 3, 3, 0)
    for kw in ({}, {"max_rectangles": 3}):  # the second leaves mixed regions
        m = CounterfactualMaps.build(small, schema, **kw)
        for norm in ("l1", "l2", "linf"):
            m.counterfactuals(Xtr[:3], norm=norm)
            m.counterfactuals(Xtr[:3], norm=norm, weights=np.ones(Xtr.shape[1]))
            linear_scan(m.engine, Xtr[0], 0, make_options(m.engine, norm=norm))
    return time.perf_counter() - t


def _timed_queries(maps, Q: np.ndarray, norm: str, budget: float, **kw) -> dict:
    """Answer queries in order until all are done or ``budget`` seconds are spent."""
    times, dist, refined, xs, targets = [], [], 0, [], []
    spent = 0.0
    for q in Q:
        s = time.perf_counter()
        r = maps.counterfactual(q, norm=norm, **kw)
        dt = time.perf_counter() - s
        spent += dt
        times.append(dt)
        refined += r.stats.regions_refined
        if r.best is None:
            dist.append(None)
            xs.append(None)
            targets.append(None)
        else:
            dist.append(float(r.best.distance))
            xs.append(r.best.x)
            targets.append(r.best.target)
        if spent >= budget:
            break
    return {"times": times, "distances": dist, "regions_refined": refined, "xs": xs,
            "targets": targets, "n": len(times), "n_total": len(Q)}


def _valid(model, xs: list, targets: list) -> tuple[int, int]:
    """(valid, answered): the model itself predicts the counterfactual's target class."""
    idx = [i for i, x in enumerate(xs) if x is not None]
    if not idx:
        return 0, 0
    pred = model.predict(np.array([xs[i] for i in idx]))
    ok = sum(1 for j, i in enumerate(idx) if pred[j] == targets[i])
    return int(ok), len(idx)


def run(spec: dict, out: Path) -> None:
    from benchmarks.common import load
    from benchmarks.suite.config import SPLIT_SEED
    from benchmarks.suite.queries import fit_forest, forest_hash, query_set
    from maps_core import CounterfactualMaps
    from maps_core.options import make_options
    from maps_core.query import linear_scan

    res: dict = {"spec": spec, "stage": "start", "pid": os.getpid()}
    name = spec["dataset"]
    Xtr, Xte, ytr, yte, schema = load(name, seed=SPLIT_SEED)
    t = time.perf_counter()
    model = fit_forest(Xtr, ytr, spec["trees"], spec["depth"], spec["seed"])
    res.update(
        fit_s=time.perf_counter() - t,
        forest_hash=forest_hash(model),
        test_accuracy=float(model.score(Xte, yte)),
        n_train=len(Xtr), n_test=len(Xte), n_features=Xtr.shape[1],
        feature_types=[f.type for f in schema.features],
    )
    res["warmup_s"] = _warm_up(Xtr, ytr, schema)
    _dump(out, res)

    t = time.perf_counter()
    maps = CounterfactualMaps.build(model, schema, max_seconds=spec["max_seconds"],
                                    max_rectangles=spec.get("max_rectangles", MAX_RECTANGLES),
                                    on_budget="mixed")
    T0 = time.perf_counter() - t
    st = maps.stats
    res.update(
        stage="built", T0=T0, rectangles=st.rectangles, rectangles_per_class=st.rectangles_per_class,
        mixed=st.mixed_regions, thresholds=int(sum(st.thresholds_per_feature)),
        raw_thresholds=st.raw_thresholds,
        budget_exhausted=bool(st.extra.get("budget_exhausted", st.mixed_regions > 0)),
        counters={k: v for k, v in st.extra.items() if isinstance(v, int | float | bool)},
        peak_rss_mb_build=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    _dump(out, res)

    Q, n_test_rows = query_set(Xte, schema, spec["n_queries"])
    res["n_test_rows_in_queries"] = n_test_rows
    res["norms"] = {}
    for norm in spec["norms"]:
        r = _timed_queries(maps, Q, norm, spec["query_budget"])
        ok, answered = _valid(model, r.pop("xs"), r.pop("targets"))
        r.update(valid=ok, answered=answered)
        r.pop("distances")
        res["norms"][norm] = r
        res["stage"] = f"queries-{norm}"
        _dump(out, res)

    if spec.get("n_peer"):
        # Unit weights: plain L1 in original units, the peers' objective; target = the other
        # class of the forest's prediction (all four datasets are binary).
        Qp = Xte[: spec["n_peer"]]
        classes = list(model.classes_)
        pred = model.predict(Qp)
        recs = []
        ones = np.ones(Xtr.shape[1])
        for q, p in zip(Qp, pred, strict=True):
            tgt = classes[1 - classes.index(p)]
            s = time.perf_counter()
            r = maps.counterfactual(q, target=tgt, norm="l1", weights=ones)
            dt = time.perf_counter() - s
            b = r.best
            rec = {"time_s": dt, "target": tgt.item() if hasattr(tgt, "item") else tgt,
                   "feasible": r.feasible, "refined": r.stats.regions_refined}
            if b is not None:
                cf = np.asarray(b.x)
                rec.update(distance=float(b.distance), cf_distance=float(np.abs(cf - q).sum()),
                           valid=bool(model.predict(cf[None])[0] == tgt), counterfactual=cf.tolist())
            recs.append(rec)
        res["peer_queries"] = recs
        res["stage"] = "peer-queries"
        _dump(out, res)

    if spec.get("n_scan"):
        Qs = Q[: spec["n_scan"]]
        pred_idx = maps.predict_index(Qs)
        scan: dict = {"n": len(Qs), "rectangles": st.rectangles, "mixed": st.mixed_regions}
        for norm in spec["norms"]:
            opts = make_options(maps.engine, norm=norm)
            kd_t, sc_t, agree, worse = [], [], 0, 0
            t_norm = time.perf_counter()
            for q, p in zip(Qs, pred_idx, strict=True):
                if time.perf_counter() - t_norm > spec.get("scan_budget", np.inf):
                    break
                t_idx = 1 - int(p) if len(maps.classes) == 2 else None
                tgt = None if t_idx is None else maps.classes[t_idx]
                s = time.perf_counter()
                r = maps.counterfactual(q, target=tgt, norm=norm)
                kd_t.append(time.perf_counter() - s)
                if t_idx is None:
                    continue
                s = time.perf_counter()
                d, _ = linear_scan(maps.engine, q, t_idx, opts)
                sc_t.append(time.perf_counter() - s)
                kd = r.best.distance if r.best is not None else np.inf
                # Without mixed regions both must agree; with them the scan sees certified
                # rectangles only (an upper bound), so the KD answer may be smaller.
                if np.isclose(kd, d, rtol=1e-9, atol=1e-12) or (np.isinf(kd) and np.isinf(d)):
                    agree += 1
                elif kd > d:
                    worse += 1
            scan[norm] = {"kd_median_s": float(np.median(kd_t)),
                          "scan_median_s": float(np.median(sc_t)) if sc_t else None,
                          "agree": agree, "kd_worse": worse, "compared": len(sc_t)}
        res["scan"] = scan
        res["stage"] = "scan"
        _dump(out, res)

    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["stage"] = "done"
    _dump(out, res)


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
