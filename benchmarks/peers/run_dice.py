"""DiCE (PyPI ``dice-ml``) runner, model-agnostic sklearn backend.

Run by benchmarks/.venvs/dice/bin/python: ``run_dice.py JOB.npz OUT.jsonl``.

Set-up: ``dice_ml.Data(dataframe=train, continuous_features=<all>, outcome_name=...)``,
``dice_ml.Model(model=<forest wrapper>, backend="sklearn", model_type="classifier")``,
``dice_ml.Dice(data, model, method=<method>)``; per query
``generate_counterfactuals(query_df, total_CFs=1, desired_class=<target>, random_seed=...)``.

Every feature is declared continuous: integer and binary columns are given an integer
dtype, so DiCE infers precision 0 and only proposes integers (0/1 for binary columns);
its permitted range is the training min/max. Columns are renamed f0..f{m-1} internally
(DiCE dislikes some characters in names). DiCE has no notion of norm or of optimality;
the runner reports L1/L2/Linf of what it returns, in original units.

Options: method ("random" default | "genetic" | "kdtree"), total_cfs (1; with more, the
L1-closest valid one is kept), random_seed (0; query i uses random_seed + i), time_limit
(ignored: DiCE has no time limit; the caller's subprocess timeout is the guard).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from _common import Job, Output, log, main_wrapper, record, write_meta


class _Wrapped:
    """sklearn-like model taking DiCE's DataFrames (columns f0..) as float64 arrays."""

    def __init__(self, model, columns):  # type: ignore[no-untyped-def]
        self.model = model
        self.columns = list(columns)
        self.classes_ = model.classes_
        self.n_features_in_ = len(self.columns)

    def _X(self, X):  # type: ignore[no-untyped-def]
        if hasattr(X, "loc"):
            X = X[self.columns]
        return np.asarray(X, dtype=np.float64)

    def predict_proba(self, X):  # type: ignore[no-untyped-def]
        return self.model.predict_proba(self._X(X))

    def predict(self, X):  # type: ignore[no-untyped-def]
        return self.model.predict(self._X(X))


def run(job: Job, out_path: str, meta_path: str) -> None:
    from importlib.metadata import version

    import dice_ml
    import pandas as pd
    from _common import load_forest

    opts = job.options
    method = str(opts.get("method", "random"))
    total_cfs = int(opts.get("total_cfs", 1))
    seed0 = int(opts.get("random_seed", 0))

    model, forest_info = load_forest(job)
    cols = [f"f{j}" for j in range(job.n_features)]
    integral = [t != "continuous" for t in job.feature_types]

    def frame(X: np.ndarray) -> pd.DataFrame:
        df = pd.DataFrame(np.asarray(X, dtype=np.float64), columns=cols)
        for c, is_int in zip(cols, integral, strict=True):
            if is_int:
                df[c] = np.round(df[c].to_numpy()).astype(np.int64)
        return df

    t0 = time.perf_counter()
    train = frame(job.X_train)
    outcome = "__class__"
    # DiCE's outcome column holds class *indices* so desired_class is an index too
    train[outcome] = np.searchsorted(np.asarray(job.classes), job.y_train).astype(np.int64)
    data = dice_ml.Data(dataframe=train, continuous_features=cols, outcome_name=outcome)
    wrapped = _Wrapped(model, cols)
    m = dice_ml.Model(model=wrapped, backend="sklearn", model_type="classifier")
    explainer = dice_ml.Dice(data, m, method=method)
    setup_s = time.perf_counter() - t0
    meta = {
        "peer": "dice",
        "dice-ml": version("dice-ml"),
        "pandas": pd.__version__,
        "forest": forest_info,
        "setup_s": setup_s,
        "options": {"method": method, "total_cfs": total_cfs, "random_seed": seed0},
    }
    write_meta(meta_path, meta)

    out = Output(out_path)
    for i in range(len(job.X_q)):
        x = job.X_q[i]
        target = int(job.targets[i])
        q = frame(x[None])
        t1 = time.perf_counter()
        try:
            kwargs = {"random_seed": seed0 + i} if method in ("random", "genetic") else {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = explainer.generate_counterfactuals(
                    q, total_CFs=total_cfs, desired_class=target, verbose=False, **kwargs
                )
            dt = time.perf_counter() - t1
            cfs = res.cf_examples_list[0].final_cfs_df
            if cfs is None or len(cfs) == 0:
                rec = record(
                    job,
                    model,
                    i,
                    peer="dice",
                    time_s=dt,
                    cf=None,
                    status="no_cf",
                    peer_status="no counterfactual returned",
                )
            else:
                C = cfs[cols].to_numpy(dtype=np.float64)
                pred = np.argmax(model.predict_proba(C), axis=1)
                d = np.abs(C - x).sum(axis=1)
                order = np.lexsort((d, pred != target))  # valid first, then closest
                cf = C[order[0]]
                rec = record(
                    job,
                    model,
                    i,
                    peer="dice",
                    time_s=dt,
                    cf=cf,
                    status="ok",
                    peer_status=f"{len(C)} cf(s)",
                )
        except Exception as exc:  # noqa: BLE001 - DiCE raises when it finds nothing
            dt = time.perf_counter() - t1
            msg = f"{type(exc).__name__}: {exc}"
            status = "no_cf" if "No counterfactuals found" in str(exc) else "error"
            rec = record(
                job, model, i, peer="dice", time_s=dt, cf=None, status=status, error=msg[:500]
            )
        out.write(rec)
        log(f"dice q{i}: {rec['status']} {dt:.3f}s l1={rec['dist_l1']} valid={rec['valid']}")
    out.close()
    meta["done"] = True
    write_meta(meta_path, meta)


if __name__ == "__main__":
    main_wrapper(run)
