"""A small suite of named timings to compare commits, in the manner of asv (no asv needed).

    python -m benchmarks.asv_suite [--out timings.json] [--repeat 3]

Each timing prints one line ``name  p50 (n runs)`` in milliseconds:

* ``search.<dataset>.<norm>``: one counterfactual (the engine call, end to end), p50 over
  200 test rows, on RandomForest(100, max_depth=5) maps of CP (complete) and PD (100,000
  rectangles: mixed regions, the deepening search);
* ``extract.CP``: a whole build of CP's maps, p50 of ``--repeat`` builds;
* ``http.counterfactual``: one ``POST /v1/models/{id}/counterfactuals`` round trip through
  the ASGI app in-process (httpx transport: routing, validation, JSON both ways), p50 of
  300 requests.

Compare two commits by running it on each (same machine, same load) and diffing the JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _p50(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _forest(name: str) -> tuple[Any, np.ndarray, Any]:
    from sklearn.ensemble import RandomForestClassifier

    from benchmarks.common import load

    Xtr, Xte, ytr, _, schema = load(name)
    return RandomForestClassifier(100, max_depth=5, random_state=0).fit(Xtr, ytr), Xte, schema


def search_timings(out: dict[str, float]) -> None:
    from maps_core import CounterfactualMaps

    for name, budget in (("CP", None), ("PD", 100_000)):
        model, Xte, schema = _forest(name)
        maps = CounterfactualMaps.build(model, schema, max_rectangles=budget)
        Q = Xte[:200]
        for norm in ("l1", "l2", "linf", "l0"):
            maps.counterfactual(Q[0], norm=norm)  # compiled, warm
            times = []
            for x in Q:
                t = time.perf_counter()
                maps.counterfactual(x, norm=norm)
                times.append(time.perf_counter() - t)
            out[f"search.{name}.{norm}"] = statistics.median(times) * 1e3


def extract_timing(out: dict[str, float], repeat: int) -> None:
    from maps_core import CounterfactualMaps

    model, _, schema = _forest("CP")
    CounterfactualMaps.build(model, schema)
    out["extract.CP"] = _p50(lambda: CounterfactualMaps.build(model, schema), repeat)


def http_timing(out: dict[str, float]) -> None:
    import warnings

    import skops.io as sio
    from sklearn.ensemble import RandomForestClassifier

    from app.main import create_app
    from app.settings import Settings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 5))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    model = RandomForestClassifier(20, max_depth=4, random_state=0).fit(X, y)
    app = create_app(Settings(data_dir=Path(tempfile.mkdtemp())))
    # a loopback client: uploads need no admin token from there
    with TestClient(app, client=("127.0.0.1", 50000)) as c:
        r = c.post("/v1/models", files={"model": ("m.skops", io.BytesIO(sio.dumps(model)))})
        model_id = r.json()["id"]
        while c.get(f"/v1/models/{model_id}").json()["status"] not in ("ready", "failed"):
            time.sleep(0.05)
        url = f"/v1/models/{model_id}/counterfactuals"
        rows = [x.tolist() for x in X[:300]]
        it = iter(rows * 2)
        c.post(url, json={"instance": rows[0]})
        out["http.counterfactual"] = _p50(lambda: c.post(url, json={"instance": next(it)}), 300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the timings as JSON")
    ap.add_argument("--repeat", type=int, default=3, help="builds timed for extract.CP")
    a = ap.parse_args()
    out: dict[str, float] = {}
    search_timings(out)
    extract_timing(out, a.repeat)
    http_timing(out)
    for name, ms in out.items():
        print(f"{name:28s} {ms:10.3f} ms")
    if a.out:
        a.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
