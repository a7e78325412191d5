"""Shared helpers for the peer runners (run_*.py).

This module is imported by the runners, which execute inside the peers' own virtual
environments (benchmarks/.venvs/<name>, Python 3.11 or 3.12). It must therefore depend on
numpy and scikit-learn only -- never on maps_core or anything else of the project.

Protocol (written by peers.py, read here)
-----------------------------------------
``job.npz`` holds

* ``X_train`` (n, m) float64, ``y_train`` (n,) int -- the forest's training data;
* ``feature_names`` (m,) str, ``feature_types`` (m,) str in {continuous, integer, binary},
  ``lower`` / ``upper`` (m,) float64 -- legal range of each feature (finite);
* ``forest_params`` -- JSON string of ``RandomForestClassifier.get_params()``;
* the exported forest: ``nodes`` (structured array, sklearn's ``Tree.__getstate__()['nodes']``
  of every tree concatenated), ``values`` (float64, concatenated), ``tree_offsets``
  (n_trees + 1,), ``tree_max_depth`` (n_trees,), ``classes`` (k,);
* ``X_check`` (c, m) float64 and ``proba_check`` (c, k) float64 -- the host forest's
  ``predict_proba`` on a few hundred points, to verify the forest rebuilt here;
* ``X_q`` (q, m) float64, ``targets`` (q,) int class indices;
* ``options`` -- JSON string: norm, time_limit, peer-specific options.

The runner writes one JSON object per query to the output ``.jsonl`` (flushed after each
query, so a caller that kills the runner keeps the finished queries) and a ``.meta.json``
with versions, the forest check and the set-up time.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
import traceback
from typing import Any

import numpy as np

TYPES = ("continuous", "integer", "binary")


# ------------------------------------------------------------------------------------------
# job loading
# ------------------------------------------------------------------------------------------
class Job:
    def __init__(self, path: str) -> None:
        z = np.load(path, allow_pickle=False)
        self.X_train = np.asarray(z["X_train"], dtype=np.float64)
        self.y_train = np.asarray(z["y_train"])
        self.feature_names = [str(s) for s in z["feature_names"]]
        self.feature_types = [str(s) for s in z["feature_types"]]
        self.lower = np.asarray(z["lower"], dtype=np.float64)
        self.upper = np.asarray(z["upper"], dtype=np.float64)
        self.forest_params = json.loads(str(z["forest_params"]))
        self.nodes = z["nodes"]
        self.values = np.asarray(z["values"], dtype=np.float64)
        self.tree_offsets = np.asarray(z["tree_offsets"], dtype=np.int64)
        self.tree_max_depth = np.asarray(z["tree_max_depth"], dtype=np.int64)
        self.classes = z["classes"]
        self.X_check = np.asarray(z["X_check"], dtype=np.float64)
        self.proba_check = np.asarray(z["proba_check"], dtype=np.float64)
        self.X_q = np.asarray(z["X_q"], dtype=np.float64)
        self.targets = np.asarray(z["targets"], dtype=np.int64)
        self.options: dict[str, Any] = json.loads(str(z["options"]))
        for t in self.feature_types:
            if t not in TYPES:
                raise ValueError(f"unknown feature type {t!r}")

    @property
    def n_features(self) -> int:
        return self.X_train.shape[1]

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def ranges(self) -> np.ndarray:
        r = self.upper - self.lower
        return np.where(r > 0, r, 1.0)


# ------------------------------------------------------------------------------------------
# the forest: re-train with the same seed, verify node-for-node; rebuild from arrays if not
# ------------------------------------------------------------------------------------------
def _tree_state(job: Job, i: int) -> dict[str, Any]:
    a, b = int(job.tree_offsets[i]), int(job.tree_offsets[i + 1])
    return {
        "max_depth": int(job.tree_max_depth[i]),
        "node_count": b - a,
        "nodes": np.ascontiguousarray(job.nodes[a:b]),
        "values": np.ascontiguousarray(job.values[a:b]),
    }


def _same_tree(tree: Any, state: dict[str, Any]) -> bool:
    mine = tree.__getstate__()
    if mine["node_count"] != state["node_count"]:
        return False
    n1, n2 = mine["nodes"], state["nodes"]
    for f in ("left_child", "right_child", "feature", "threshold"):
        if f not in n1.dtype.names or f not in n2.dtype.names:
            return False
        if not np.array_equal(n1[f], n2[f]):
            return False
    v1 = np.asarray(mine["values"], dtype=np.float64).reshape(len(n1), -1)
    v2 = np.asarray(state["values"], dtype=np.float64).reshape(len(n2), -1)
    return v1.shape == v2.shape and np.array_equal(v1, v2)


def load_forest(job: Job) -> tuple[Any, dict[str, Any]]:
    """The job's forest as a fitted RandomForestClassifier, and a report of how it was made.

    1. Re-train ``RandomForestClassifier(**forest_params)`` on the job's training data.
    2. Compare every tree node-for-node (children, features, thresholds, leaf values) with
       the exported arrays. Identical -> ``source = "retrained-identical"``.
    3. Otherwise replace each estimator's ``tree_`` by a Tree rebuilt from the exported
       arrays (``Tree.__setstate__``) -> ``source = "rebuilt-from-arrays"``.
    4. Either way, ``predict_proba`` on ``X_check`` must equal the host's bit for bit.
    """
    import sklearn
    from sklearn.ensemble import RandomForestClassifier

    t0 = time.perf_counter()
    params = dict(job.forest_params)
    params["n_jobs"] = 1
    params["verbose"] = 0
    model = RandomForestClassifier(**params).fit(job.X_train, job.y_train)
    n_trees = len(job.tree_offsets) - 1
    if len(model.estimators_) != n_trees:
        raise RuntimeError(
            f"re-trained forest has {len(model.estimators_)} trees, expected {n_trees}"
        )
    states = [_tree_state(job, i) for i in range(n_trees)]
    same = [_same_tree(est.tree_, st) for est, st in zip(model.estimators_, states, strict=True)]
    source = "retrained-identical"
    if not all(same):
        from sklearn.tree._tree import Tree

        source = "rebuilt-from-arrays"
        for est, st in zip(model.estimators_, states, strict=True):
            k = job.n_classes
            tree = Tree(job.n_features, np.array([k], dtype=np.intp), 1)
            vals = st["values"].reshape(st["node_count"], 1, k)
            st = dict(st, values=np.ascontiguousarray(vals))
            nodes = st["nodes"]
            want = tree.__getstate__()["nodes"].dtype
            if nodes.dtype != want:  # another sklearn's node layout: copy the common fields
                conv = np.zeros(len(nodes), dtype=want)
                for f in want.names:
                    if f in nodes.dtype.names:
                        conv[f] = nodes[f]
                st["nodes"] = conv
            tree.__setstate__(st)
            est.tree_ = tree
    proba = model.predict_proba(job.X_check)
    if proba.shape != job.proba_check.shape or not np.array_equal(proba, job.proba_check):
        diff = (
            float(np.max(np.abs(proba - job.proba_check)))
            if proba.shape == job.proba_check.shape
            else float("nan")
        )
        raise RuntimeError(
            f"forest check failed ({source}): predict_proba differs from the host's "
            f"on X_check (max abs diff {diff})"
        )
    return model, {
        "source": source,
        "trees_identical_after_retrain": int(sum(same)),
        "n_trees": n_trees,
        "check_points": int(len(job.X_check)),
        "sklearn": sklearn.__version__,
        "numpy": np.__version__,
        "seconds": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------------------------------
# distances and records
# ------------------------------------------------------------------------------------------
def distances(x: np.ndarray, cf: np.ndarray, ranges: np.ndarray) -> dict[str, float]:
    """Plain unweighted L1 / L2 / Linf in original units, plus L1 with weights 1/range."""
    d = np.abs(np.asarray(cf, dtype=np.float64) - np.asarray(x, dtype=np.float64))
    return {
        "dist_l1": float(d.sum()),
        "dist_l2": float(math.sqrt(float((d * d).sum()))),
        "dist_linf": float(d.max()) if d.size else 0.0,
        "dist_l1_range": float((d / ranges).sum()),
    }


def finite(v: Any) -> Any:
    """JSON-safe float (NaN/inf -> None)."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return v
    return f if math.isfinite(f) else None


def record(
    job: Job,
    model: Any,
    i: int,
    *,
    peer: str,
    time_s: float,
    cf: np.ndarray | None,
    status: str,
    proved_optimal: bool | None = None,
    peer_status: str | None = None,
    peer_objective: float | None = None,
    lower_bound: float | None = None,
    error: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    x = job.X_q[i]
    target = int(job.targets[i])
    rec: dict[str, Any] = {
        "i": i,
        "peer": peer,
        "target": target,
        "pred_query": int(np.argmax(model.predict_proba(x[None])[0])),
        "status": status,
        "time_s": float(time_s),
        "counterfactual": None,
        "pred_cf": None,
        "valid": False,
        "in_bounds": None,
        "integral_ok": None,
        "domain_ok": None,
        "proved_optimal": proved_optimal,
        "peer_status": peer_status,
        "peer_objective": finite(peer_objective),
        "lower_bound": finite(lower_bound),
        "dist_l1": None,
        "dist_l2": None,
        "dist_linf": None,
        "dist_l1_range": None,
        "error": error,
    }
    if cf is not None:
        cf = np.asarray(cf, dtype=np.float64).ravel()
        # class *index* predicted by the forest itself (argmax of predict_proba, ties -> lowest)
        pred = int(np.argmax(model.predict_proba(cf[None])[0]))
        rec["counterfactual"] = [float(v) for v in cf]
        rec["pred_cf"] = pred
        rec["valid"] = bool(pred == target)
        rec["in_bounds"] = bool(np.all(cf >= job.lower - 1e-9) and np.all(cf <= job.upper + 1e-9))
        integral = np.array([t != "continuous" for t in job.feature_types])
        rec["integral_ok"] = bool(np.all(cf[integral] == np.round(cf[integral])))
        rec["domain_ok"] = bool(rec["in_bounds"] and rec["integral_ok"])
        rec.update(distances(x, cf, job.ranges))
    if extra:
        rec.update(extra)
    return rec


class Output:
    """JSON-lines writer, one line per query, flushed at once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fh = open(path, "w", encoding="utf-8")

    def write(self, rec: dict[str, Any]) -> None:
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def write_meta(path: str, meta: dict[str, Any]) -> None:
    meta = dict(meta)
    meta.setdefault("python", sys.version.split()[0])
    meta.setdefault("platform", platform.platform())
    meta.setdefault("pid", os.getpid())
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=1, default=str)


def _orphan_watchdog(period: float = 2.0) -> None:
    """Exit when the parent (peers.py) disappears, so a killed caller leaves no solver behind.

    peers.py starts the runner in its own session (so a timeout can kill the whole group);
    the flip side is that a SIGKILLed caller would not take the runner with it.
    """
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(period)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="orphan-watchdog").start()


def main_wrapper(run: Any) -> None:
    """``python run_X.py JOB.npz OUT.jsonl`` -> run(job, out_path); meta beside the output."""
    _orphan_watchdog()
    if len(sys.argv) != 3:
        sys.stderr.write(f"usage: {sys.argv[0]} JOB.npz OUT.jsonl\n")
        sys.exit(2)
    job_path, out_path = sys.argv[1], sys.argv[2]
    meta_path = out_path[: -len(".jsonl")] if out_path.endswith(".jsonl") else out_path
    meta_path += ".meta.json"
    try:
        run(Job(job_path), out_path, meta_path)
    except Exception:
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        write_meta(meta_path, {"fatal": tb})
        sys.exit(1)


def log(msg: str) -> None:
    sys.stderr.write(msg.rstrip() + "\n")
    sys.stderr.flush()
