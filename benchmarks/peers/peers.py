"""Run the peer counterfactual tools (OCEAN, DiCE, treecf) on our forests, side by side.

Runs under the project's own interpreter (Python 3.11, /work/main/.venv). Each peer lives
in its own virtual environment under benchmarks/.venvs/<name> (made by setup_envs.sh) and
is driven as a subprocess running benchmarks/peers/run_<name>.py; nothing of the peers is
imported here, and nothing of the project is imported by the runners.

    from benchmarks.peers.peers import run_peer          # or: sys.path + "import peers"
    recs = run_peer("treecf", forest, X_q, norm="l1", time_limit=60,
                    X_train=X_tr, y_train=y_tr, feature_types=types)

``forest`` is a fitted ``RandomForestClassifier`` (or a dict spec such as
``{"n_estimators": 100, "max_depth": 5, "random_state": 0}``, trained here on
``X_train, y_train``). The runner re-trains the same forest in the peer's venv (same
scikit-learn, same data, same seed), checks it node for node against the exported arrays,
falls back to rebuilding the trees from those arrays if they differ, and refuses to run
unless ``predict_proba`` agrees bit for bit with ours on a check set.

Each returned record (one per query, in order) has: i, peer, target, status (ok | no_cf |
infeasible | error | timeout | not_run), time_s, counterfactual, valid (the host forest
predicts the target at the counterfactual), proved_optimal, peer_status, peer_objective,
lower_bound, dist_l1 / dist_l2 / dist_linf (plain, unweighted, original units),
dist_l1_range (L1 with per-feature weights 1/(upper-lower)), error.

CLI:  python -m benchmarks.peers.peers --demo         (COMPAS, 10 trees depth 3, 5 queries)
      python -m benchmarks.peers.peers --calibrate    (BC, 100 trees depth 5, 5 queries)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
REPO = BENCH.parent
VENVS = Path(os.environ.get("CFMAPS_PEER_VENVS", BENCH / ".venvs"))
DATASETS = Path(os.environ.get("CFMAPS_DATASETS", REPO.parent / "shared" / "datasets"))

PEERS: dict[str, dict[str, Any]] = {
    "ocean": {"runner": "run_ocean.py", "norms": ("l1", "l2"), "exact": True},
    "dice": {"runner": "run_dice.py", "norms": ("l1", "l2", "linf"), "exact": False},
    "treecf": {"runner": "run_treecf.py", "norms": ("l1",), "exact": True},
}
TYPE_CODES = {"B": "binary", "D": "integer", "F": "continuous"}


class PeerUnavailable(RuntimeError):
    """The peer's virtual environment is missing: run benchmarks/peers/setup_envs.sh."""


def peer_python(name: str) -> Path:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; known: {sorted(PEERS)}")
    py = VENVS / name / "bin" / "python"
    if not py.exists():
        raise PeerUnavailable(
            f"{py} is missing: run `bash benchmarks/peers/setup_envs.sh {name}` first"
        )
    return py


def available(name: str) -> bool:
    try:
        peer_python(name)
    except PeerUnavailable:
        return False
    return True


# ------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------
def load_dataset(name_or_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a born-again-format CSV (row 1 names, row 2 type codes, label column ``Class``)."""
    p = Path(name_or_path)
    if not p.exists():
        short = {
            "BC": "Breast-Cancer-Wisconsin",
            "CP": "COMPAS-ProPublica",
            "FI": "FICO",
            "PD": "Pima-Diabetes",
        }
        p = DATASETS / f"{short.get(str(name_or_path), str(name_or_path))}.csv"
    with open(p, encoding="utf-8") as fh:
        names = fh.readline().strip().split(",")
        codes = fh.readline().strip().split(",")
    data = np.loadtxt(p, delimiter=",", skiprows=2, dtype=np.float64, ndmin=2)
    label = names.index("Class")
    keep = [j for j in range(len(names)) if j != label]
    return {
        "X": data[:, keep],
        "y": data[:, label].astype(np.int64),
        "feature_names": [names[j] for j in keep],
        "feature_types": [TYPE_CODES[codes[j]] for j in keep],
        "path": str(p),
    }


def infer_types(X: np.ndarray) -> list[str]:
    """Same rule as maps_core.FeatureSchema.infer: {0,1} -> binary, integral -> integer."""
    out = []
    for col in np.asarray(X, dtype=np.float64).T:
        col = col[np.isfinite(col)]
        if col.size and np.all((col == 0) | (col == 1)):
            out.append("binary")
        elif col.size and np.all(col == np.round(col)):
            out.append("integer")
        else:
            out.append("continuous")
    return out


def _schema_types(schema: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    types, lo, hi = [], [], []
    for f in schema.features:
        t = {"categorical": "binary"}.get(f.type, f.type)
        types.append(t)
        lo.append(np.nan if f.lower is None else float(f.lower))
        hi.append(np.nan if f.upper is None else float(f.upper))
    return types, np.array(lo), np.array(hi)


# ------------------------------------------------------------------------------------------
# job export
# ------------------------------------------------------------------------------------------
def _json_params(model: Any) -> dict[str, Any]:
    out = {}
    for k, v in model.get_params(deep=False).items():
        if isinstance(v, np.generic):
            v = v.item()
        try:
            json.dumps(v)
        except TypeError:
            v = None  # e.g. a RandomState: the runner then rebuilds the trees from arrays
        out[k] = v
    return out


def _fit_spec(spec: dict[str, Any], X: np.ndarray, y: np.ndarray) -> Any:
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(**spec).fit(X, y)


def make_job(
    path: str | os.PathLike[str],
    forest: Any,
    X_q: np.ndarray,
    targets: np.ndarray,
    *,
    X_train: np.ndarray,
    y_train: np.ndarray,
    feature_types: Sequence[str] | None = None,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
    feature_names: Sequence[str] | None = None,
    options: dict[str, Any] | None = None,
) -> Path:
    """Write the runner input ``.npz`` (see _common.py for the protocol)."""
    X_train = np.asarray(X_train, dtype=np.float64)
    y_train = np.asarray(y_train)
    X_q = np.atleast_2d(np.asarray(X_q, dtype=np.float64))
    m = X_train.shape[1]
    if type(forest).__name__ != "RandomForestClassifier":
        raise TypeError(f"peers take a RandomForestClassifier, got {type(forest).__name__}")
    types = list(feature_types) if feature_types is not None else infer_types(X_train)
    lo = np.full(m, np.nan) if lower is None else np.asarray(lower, dtype=np.float64).copy()
    hi = np.full(m, np.nan) if upper is None else np.asarray(upper, dtype=np.float64).copy()
    dmin, dmax = X_train.min(axis=0), X_train.max(axis=0)
    lo = np.where(np.isfinite(lo), lo, dmin)
    hi = np.where(np.isfinite(hi), hi, dmax)
    for j, t in enumerate(types):
        if t == "binary":
            lo[j], hi[j] = 0.0, 1.0
    names = list(feature_names) if feature_names is not None else [f"x{j}" for j in range(m)]

    nodes, values, offsets, depths = [], [], [0], []
    for est in forest.estimators_:
        st = est.tree_.__getstate__()
        nodes.append(st["nodes"])
        values.append(np.asarray(st["values"], dtype=np.float64).reshape(len(st["nodes"]), -1))
        offsets.append(offsets[-1] + len(st["nodes"]))
        depths.append(int(st["max_depth"]))

    rng = np.random.default_rng(12345)
    U = rng.uniform(lo, hi, size=(200, m))
    for j, t in enumerate(types):
        if t != "continuous":
            U[:, j] = np.round(U[:, j])
    sub = X_train[rng.permutation(len(X_train))[:300]]
    X_check = np.vstack([sub, X_q, U])
    proba = forest.predict_proba(X_check)

    path = Path(path)
    np.savez(
        path,
        X_train=X_train,
        y_train=y_train,
        feature_names=np.array(names, dtype=str),
        feature_types=np.array(types, dtype=str),
        lower=lo,
        upper=hi,
        forest_params=np.array(json.dumps(_json_params(forest))),
        nodes=np.concatenate(nodes),
        values=np.concatenate(values),
        tree_offsets=np.array(offsets, dtype=np.int64),
        tree_max_depth=np.array(depths, dtype=np.int64),
        classes=np.asarray(forest.classes_),
        X_check=X_check,
        proba_check=proba,
        X_q=X_q,
        targets=np.asarray(targets, dtype=np.int64),
        options=np.array(json.dumps(options or {})),
    )
    return path


# ------------------------------------------------------------------------------------------
# running a peer
# ------------------------------------------------------------------------------------------
def default_timeout(name: str, n_queries: int, time_limit: float) -> float:
    """Whole-run guard: start-up + per query (limit + slack)."""
    per = {"ocean": time_limit * 1.5 + 10, "treecf": time_limit * 1.5 + 5}.get(name, 120.0)
    return 180.0 + n_queries * per


def kill_group(proc: subprocess.Popen) -> None:
    """Stop a child started in its own session, and everything it spawned."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_job(
    name: str,
    job: str | os.PathLike[str],
    *,
    timeout: float,
    nice: int = 10,
    verbose: bool = False,
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Run peer ``name`` on a job ``.npz`` made by :func:`make_job`.

    Returns the runner's records by query index (as the runner wrote them, before the host
    re-check that :func:`run_peer` adds) and its meta, plus returncode / timed_out / wall_s
    / stderr_tail. On ``timeout`` the runner's whole process group is killed; the records
    finished by then are kept.
    """
    py = peer_python(name)
    job = Path(job)
    with tempfile.TemporaryDirectory(prefix=f"peer-{name}-out-") as d:
        out = Path(d) / "out.jsonl"
        meta_p = Path(d) / "out.meta.json"
        err_p = Path(d) / "stderr.log"
        cmd = [str(py), str(HERE / PEERS[name]["runner"]), str(job.resolve()), str(out)]
        if nice:
            cmd = ["nice", "-n", str(int(nice)), *cmd]
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        env["PYTHONUNBUFFERED"] = "1"
        timed_out = False
        t0 = time.perf_counter()
        with open(err_p, "wb") as err:
            proc = subprocess.Popen(
                cmd, cwd=str(HERE), stdout=err, stderr=err, env=env, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(proc)
                rc = proc.returncode
            except BaseException:
                kill_group(proc)
                raise
        wall = time.perf_counter() - t0
        stderr = err_p.read_text(errors="replace")
        if verbose:
            sys.stderr.write(stderr)
        meta: dict[str, Any] = {}
        if meta_p.exists():
            try:
                meta = json.loads(meta_p.read_text())
            except json.JSONDecodeError:
                meta = {}
        meta.update(
            {
                "returncode": rc,
                "timed_out": timed_out,
                "wall_s": wall,
                "guard_s": timeout,
                "stderr_tail": stderr[-3000:],
            }
        )
        got: dict[int, dict[str, Any]] = {}
        if out.exists():
            for line in out.read_text().splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                got[int(r["i"])] = r
    return got, meta


def run_peer_full(
    name: str,
    forest: Any,
    queries: np.ndarray,
    norm: str = "l1",
    time_limit: float = 60.0,
    *,
    X_train: np.ndarray,
    y_train: np.ndarray,
    targets: Sequence[int] | np.ndarray | None = None,
    feature_types: Sequence[str] | None = None,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
    schema: Any = None,
    feature_names: Sequence[str] | None = None,
    timeout: float | None = None,
    options: dict[str, Any] | None = None,
    nice: int = 10,
    workdir: str | os.PathLike[str] | None = None,
    verbose: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Like :func:`run_peer`, and also return the runner's meta (versions, set-up time...)."""
    peer_python(name)  # fail early when the venv is missing
    norm = norm.lower()
    if norm not in PEERS[name]["norms"]:
        raise ValueError(f"{name} does not support norm {norm!r} (supports {PEERS[name]['norms']})")
    X_train = np.asarray(X_train, dtype=np.float64)
    y_train = np.asarray(y_train)
    if isinstance(forest, dict):
        forest = _fit_spec(forest, X_train, y_train)
    X_q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
    if schema is not None:
        feature_types, lower, upper = _schema_types(schema)
        feature_names = feature_names or list(schema.names)
    idx_pred = np.argmax(forest.predict_proba(X_q), axis=1)
    if targets is None:
        if len(forest.classes_) != 2:
            raise ValueError("give targets for a multi-class forest")
        t_idx = 1 - idx_pred
    else:
        # class labels -> class indices
        t_idx = np.array([int(np.flatnonzero(forest.classes_ == t)[0]) for t in targets])
    opts = {"norm": norm, "time_limit": float(time_limit), **(options or {})}

    tmp = tempfile.TemporaryDirectory(prefix=f"peer-{name}-", dir=workdir)
    try:
        job = make_job(
            Path(tmp.name) / "job.npz",
            forest,
            X_q,
            t_idx,
            X_train=X_train,
            y_train=y_train,
            feature_types=feature_types,
            lower=lower,
            upper=upper,
            feature_names=feature_names,
            options=opts,
        )
        guard = timeout if timeout is not None else default_timeout(name, len(X_q), time_limit)
        got, meta = run_job(name, job, timeout=guard, nice=nice, verbose=verbose)
        timed_out, rc, stderr = meta["timed_out"], meta["returncode"], meta["stderr_tail"]
    finally:
        tmp.cleanup()

    recs = []
    ranges = _ranges(X_train, feature_types, lower, upper)
    for i in range(len(X_q)):
        r = got.get(i)
        if r is None:
            why = "timeout" if timed_out else "not_run"
            detail = (
                f"whole-run timeout after {guard:.0f}s"
                if timed_out
                else f"runner exited with {rc}: {stderr.strip().splitlines()[-1:]}"
            )
            r = {
                "i": i,
                "peer": name,
                "target": int(t_idx[i]),
                "status": why,
                "time_s": None,
                "counterfactual": None,
                "valid": False,
                "proved_optimal": None,
                "peer_status": None,
                "peer_objective": None,
                "lower_bound": None,
                "dist_l1": None,
                "dist_l2": None,
                "dist_linf": None,
                "dist_l1_range": None,
                "error": detail,
            }
        else:
            r = _host_check(r, forest, X_q[i], int(t_idx[i]), ranges)
        r["target_label"] = _py(forest.classes_[int(t_idx[i])])
        recs.append(r)
    return recs, meta


def run_peer(
    name: str,
    forest: Any,
    queries: np.ndarray,
    norm: str = "l1",
    time_limit: float = 60.0,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Run peer ``name`` on ``queries``; one record per query (see the module doc).

    Parameters
    ----------
    name : {"ocean", "dice", "treecf"}
    forest : fitted RandomForestClassifier, or a dict of its parameters (trained here on
        ``X_train, y_train``)
    queries : array (q, m) in original units
    norm : "l1" (all peers) or "l2" (OCEAN; DiCE ignores it)
    time_limit : seconds per query (OCEAN CP-SAT max_time, treecf time_budget_s)
    X_train, y_train : the forest's training data (required)
    targets : class labels, one per query (default: the other class, binary only)
    feature_types : "continuous" | "integer" | "binary" per feature (default: inferred like
        FeatureSchema.infer), or ``schema=`` a maps_core FeatureSchema
    lower, upper : legal ranges (default: training min/max; binary [0, 1])
    timeout : seconds for the whole peer run (default :func:`default_timeout`); on expiry
        the runner's process group is killed and unfinished queries get status "timeout"
    options : peer-specific options (see each run_*.py), e.g. {"num_workers": 1}
    nice : niceness of the peer process (default 10)
    """
    return run_peer_full(name, forest, queries, norm, time_limit, **kwargs)[0]


def _py(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _ranges(X_train: np.ndarray, types: Any, lower: Any, upper: Any) -> np.ndarray:
    m = X_train.shape[1]
    lo = np.full(m, np.nan) if lower is None else np.asarray(lower, dtype=np.float64)
    hi = np.full(m, np.nan) if upper is None else np.asarray(upper, dtype=np.float64)
    lo = np.where(np.isfinite(lo), lo, X_train.min(axis=0))
    hi = np.where(np.isfinite(hi), hi, X_train.max(axis=0))
    if types is not None:
        for j, t in enumerate(types):
            if t == "binary":
                lo[j], hi[j] = 0.0, 1.0
    r = hi - lo
    return np.where(r > 0, r, 1.0)


def _host_check(
    r: dict[str, Any], forest: Any, x: np.ndarray, t: int, ranges: np.ndarray
) -> dict[str, Any]:
    """Re-check validity and distances with the caller's own forest, in this process."""
    r = dict(r)
    r["valid_peer_env"] = r.get("valid")
    cf = r.get("counterfactual")
    if cf is None:
        r["valid"] = False
        return r
    c = np.asarray(cf, dtype=np.float64)
    pred = int(np.argmax(forest.predict_proba(c[None])[0]))
    r["pred_cf"] = pred
    r["valid"] = bool(pred == t)
    d = np.abs(c - x)
    r["dist_l1"] = float(d.sum())
    r["dist_l2"] = float(math.sqrt(float((d * d).sum())))
    r["dist_linf"] = float(d.max()) if d.size else 0.0
    r["dist_l1_range"] = float((d / ranges).sum())
    return r


# ------------------------------------------------------------------------------------------
# demo / calibration
# ------------------------------------------------------------------------------------------
def _fmt(v: Any, nd: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{nd}g}"
    return str(v)


def side_by_side(
    dataset: str,
    n_estimators: int,
    max_depth: int,
    n_queries: int,
    peers: Sequence[str],
    time_limit: float,
    norm: str = "l1",
    options: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import train_test_split

    ds = load_dataset(dataset)
    X_tr, X_te, y_tr, y_te = train_test_split(ds["X"], ds["y"], test_size=0.2, random_state=0)
    rf = RandomForestClassifier(n_estimators=n_estimators, max_depth=max_depth, random_state=0).fit(
        X_tr, y_tr
    )
    X_q = X_te[:n_queries]
    print(
        f"# {Path(ds['path']).name}: {X_tr.shape[0]} train / {X_te.shape[0]} test rows, "
        f"{X_tr.shape[1]} features; RandomForestClassifier(n_estimators={n_estimators}, "
        f"max_depth={max_depth}, random_state=0), test accuracy {rf.score(X_te, y_te):.3f}; "
        f"{len(X_q)} queries (first test rows), target = the other class, norm {norm}, "
        f"per-query limit {time_limit:g}s"
    )
    results: dict[str, Any] = {}
    for name in peers:
        if not available(name):
            print(f"\n## {name}: not set up (bash benchmarks/peers/setup_envs.sh {name})")
            continue
        if norm not in PEERS[name]["norms"]:
            print(f"\n## {name}: skipped, no {norm} support")
            continue
        recs, meta = run_peer_full(
            name,
            rf,
            X_q,
            norm=norm,
            time_limit=time_limit,
            X_train=X_tr,
            y_train=y_tr,
            feature_types=ds["feature_types"],
            feature_names=ds["feature_names"],
            options=(options or {}).get(name),
        )
        results[name] = {"records": recs, "meta": meta}
        f = meta.get("forest", {})
        ver = {k: meta.get(k) for k in ("oceanpy", "ortools", "dice-ml", "treecf") if k in meta}
        print(
            f"\n## {name} {ver} python {meta.get('python')}; forest {f.get('source')} "
            f"(sklearn {f.get('sklearn')}); set-up {_fmt(meta.get('setup_s'))}s; "
            f"wall {meta['wall_s']:.1f}s" + ("; TIMED OUT" if meta["timed_out"] else "")
        )
        if meta.get("fatal") or meta.get("returncode"):
            print("   runner failed:", (meta.get("fatal") or meta["stderr_tail"])[-800:])
        print("| q | status | peer status | time s | L1 | L2 | Linf | valid | optimal |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in recs:
            print(
                f"| {r['i']} | {r['status']} | {_fmt(r.get('peer_status'))} | "
                f"{_fmt(r['time_s'], 3)} | {_fmt(r['dist_l1'])} | {_fmt(r['dist_l2'])} | "
                f"{_fmt(r['dist_linf'])} | {_fmt(r['valid'])} | {_fmt(r['proved_optimal'])} |"
            )
        ts = [r["time_s"] for r in recs if r["time_s"] is not None]
        if ts:
            print(
                f"   median {np.median(ts):.3g}s, max {max(ts):.3g}s per query; "
                f"valid {sum(bool(r['valid']) for r in recs)}/{len(recs)}; proved optimal "
                f"{sum(bool(r['proved_optimal']) for r in recs)}/{len(recs)}"
            )
    _agreement(results)
    return results


def _agreement(results: dict[str, Any]) -> None:
    """Exact peers must agree on L1 wherever both proved optimality."""
    if "ocean" not in results or "treecf" not in results:
        return
    a, b = results["ocean"]["records"], results["treecf"]["records"]
    rows = []
    for ra, rb in zip(a, b, strict=True):
        if ra["proved_optimal"] and rb["proved_optimal"] and ra["valid"] and rb["valid"]:
            rows.append((ra["i"], ra["dist_l1"], rb["dist_l1"]))
    if not rows:
        return
    bad = [r for r in rows if not math.isclose(r[1], r[2], rel_tol=1e-6, abs_tol=1e-6)]
    print(
        f"\nOCEAN vs treecf (both proved optimal, L1): {len(rows) - len(bad)}/{len(rows)} "
        f"agree" + (f"; DISAGREE on {bad}" if bad else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument(
        "--demo", action="store_true", help="COMPAS, 10 trees depth 3, 5 queries through every peer"
    )
    g.add_argument(
        "--calibrate",
        action="store_true",
        help="BC, 100 trees depth 5, 5 queries through every peer",
    )
    ap.add_argument("--dataset", help="BC | CP | FI | PD or a CSV path (overrides the preset)")
    ap.add_argument("--trees", type=int)
    ap.add_argument("--depth", type=int)
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--peers", default="ocean,dice,treecf")
    ap.add_argument("--time-limit", type=float, default=60.0, help="per query (s)")
    ap.add_argument("--norm", default="l1")
    ap.add_argument("--ocean-workers", type=int, help="CP-SAT num_workers")
    ap.add_argument("--dice-method", default=None, help="random | genetic | kdtree")
    ap.add_argument("--json", help="also write all records to this JSON file")
    a = ap.parse_args(argv)
    if a.calibrate:
        ds, trees, depth = "BC", 100, 5
    else:
        ds, trees, depth = "CP", 10, 3
    ds, trees, depth = a.dataset or ds, a.trees or trees, a.depth or depth
    opts: dict[str, dict[str, Any]] = {}
    if a.ocean_workers:
        opts["ocean"] = {"num_workers": a.ocean_workers}
    if a.dice_method:
        opts["dice"] = {"method": a.dice_method}
    res = side_by_side(
        ds,
        trees,
        depth,
        a.queries,
        [p for p in a.peers.split(",") if p],
        a.time_limit,
        a.norm,
        opts,
    )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
