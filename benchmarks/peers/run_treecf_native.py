"""treecf on an XGBoost or LightGBM model read from its own JSON dump (issue 15).

Run by benchmarks/.venvs/treecf/bin/python: ``run_treecf_native.py JOB.json OUT.jsonl``.
The host (:mod:`benchmarks.peers.native_side_by_side`) writes the job: the model dump
(XGBoost's ``save_model`` JSON, LightGBM's ``dump_model()`` JSON, both read by treecf's
own parsers, so no model library is needed here), the feature names, the queries, each
query's raw-score target interval, and the cost model stated in treecf's terms so that its
objective is exactly cfmaps' weighted l1:

* ``weights`` w_f = cfmaps' weights and ``normalizers`` 1, treecf minimising
  sum w_f |delta_f| / 1 (the weights passed as they are, not as 1 / (1 / w));
* one-hot groups as ``OneHot`` constraints, their columns at weight 1/2 (a switch moves two
  columns by 1: cost 1, cfmaps' default group cost);
* every feature's schema domain as a ``Range``, integers and binaries as the "integer"
  value policy.

Each query runs the exact backend with no warm start (treecf 0.3.2's warm start ignores
the value policy; see run_treecf.py). One JSON line per query: status, proof, distance,
the counterfactual, seconds.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np


def main(job_path: str, out_path: str) -> None:
    from treecf import Counterfactual, Explainer, Target
    from treecf.constraints.objects import OneHot, Range
    from treecf.ir.parsers import parse_model

    job = json.loads(open(job_path, encoding="utf-8").read())
    ir = parse_model(job["dump"])
    if ir.n_features != len(job["weights"]):
        raise RuntimeError(f"treecf reads {ir.n_features} features, expected {len(job['weights'])}")
    names = list(ir.feature_names)  # by position: the host speaks in column indices
    constraints = [
        Range(n, float(a), float(b)) for n, a, b in zip(names, job["lower"], job["upper"], strict=True)
    ]
    constraints += [OneHot(tuple(names[j] for j in g)) for g in job["groups"]]
    explainer = Explainer(
        ir,
        constraints=constraints,
        weights={n: float(w) for n, w in zip(names, job["weights"], strict=True)},
        normalizers={n: 1.0 for n in names},
        value_policy={names[j]: "integer" for j in job["integer"]},
    )
    with open(out_path, "w", encoding="utf-8") as out:
        for x, (lo, hi) in zip(job["X"], job["raw_targets"], strict=True):
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    res = explainer.explain(
                        np.asarray(x, dtype=np.float64),
                        target=Target.raw(range=(lo, hi)),
                        backend="exact",
                        time_budget_s=job["time_limit"],
                        warm_start=False,
                        seed=0,
                    )
                except Exception as exc:  # noqa: BLE001 - a peer's failure is a result to report
                    res = exc
            dt = time.perf_counter() - t
            if isinstance(res, Counterfactual):
                rec = {
                    "status": "ok",
                    "proof": res.proof,
                    "distance": float(res.distance),
                    "x_cf": [float(v) for v in res.x_cf],
                    "seconds": dt,
                }
            elif isinstance(res, Exception):
                rec = {"status": "error", "error": f"{type(res).__name__}: {res}", "seconds": dt}
            else:
                rec = {
                    "status": "none",
                    "proof": getattr(res, "proof", None),
                    "reason": str(getattr(res, "reason", "")),
                    "seconds": dt,
                }
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
