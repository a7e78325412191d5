"""The real thing: uvicorn on a loopback port, driven over HTTP."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from svc_helpers import Fitted

from app.main import create_app
from app.server import PROTOCOL
from app.settings import Settings

ADMIN = {"Authorization": "Bearer admin-tok"}
API = {"Authorization": "Bearer api-tok"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# uvicorn's own choice, and the protocol `cfmaps serve` runs (each response written once)
@pytest.fixture(params=["auto", PROTOCOL])
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    settings = Settings(data_dir=tmp_path / "data", admin_token="admin-tok", api_tokens="api-tok")
    port = _free_port()
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=port, log_level="warning", lifespan="on",
        http=request.param,
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    base = f"http://127.0.0.1:{port}"
    # ready once the warm-up has compiled (or loaded) the query kernels, even with no models
    deadline = time.monotonic() + 300
    while httpx.get(f"{base}/readyz", timeout=10).status_code != 200:
        assert thread.is_alive() and time.monotonic() < deadline, "the app did not get ready"
        time.sleep(0.02)
    try:
        yield base
    finally:
        srv.should_exit = True
        thread.join(timeout=20)


def test_upload_build_query_over_http(server: str, rf: Fitted) -> None:
    with httpx.Client(base_url=server, timeout=30) as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").status_code == 200

        r = http.post("/v1/models", files={"model": ("rf.skops", rf.skops)})
        assert r.status_code == 401
        r = http.post(
            "/v1/models",
            files={"model": ("rf.skops", rf.skops)},
            data={"spec": '{"name": "forest", "classes": ["denied", "approved"]}'},
            headers=ADMIN,
        )
        assert r.status_code == 202, r.text
        model_id = r.json()["id"]

        deadline = time.monotonic() + 60
        while True:
            info = http.get(f"/v1/models/{model_id}", headers=API).json()
            assert 0.0 <= info["progress"] <= 1.0
            if info["status"] in ("ready", "failed"):
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert info["status"] == "ready", info

        X = rf.X[:8]
        r = http.post(
            f"/v1/models/{model_id}/counterfactuals",
            json={"instances": X.tolist(), "target": "approved", "norm": "l2"},
            headers=API,
        )
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert len(results) == 8
        for x, res in zip(X, results, strict=True):
            cf = np.array([res["counterfactual"][f"x{j}"] for j in range(5)])
            assert rf.model.predict(cf[None])[0] == 1  # "approved"
            assert res["target"] == "approved" and res["optimal"] is True
            if rf.model.predict(x[None])[0] == 1:
                assert res["distance"] == 0

        # httpx refuses to encode NaN; send the token Python's json module writes.
        r = http.post(
            f"/v1/models/{model_id}/counterfactuals",
            content=b'{"instance": [NaN, 0, 0, 0, 0]}',
            headers={**API, "content-type": "application/json"},
        )
        assert r.status_code == 422 and r.json()["field"] == "instance.x0"
        # an answer of several hundred kilobytes, over the same keep-alive connection
        big = np.resize(rf.X, (1000, 5))
        r = http.post(f"/v1/models/{model_id}/counterfactuals", json={"instances": big.tolist()},
                      headers=API)
        assert r.status_code == 200 and len(r.content) > 300_000
        assert len(r.json()["results"]) == 1000
        assert http.delete(f"/v1/models/{model_id}", headers=ADMIN).status_code == 204
        assert "cfmaps_http_requests_total" in http.get("/metrics").text


def test_the_service_raises_its_open_files_limit_to_the_hard_one() -> None:
    """Each loaded model keeps about 30 descriptors open (memory maps): under a soft limit
    of 1,024 the 35th failed to load. The service raises it as far as it may."""
    import resource
    import subprocess
    import sys

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.fail(f"this machine's hard limit on open files is {hard}: nothing to raise")

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    out = subprocess.run(
        [sys.executable, "-c", "import resource; from app.main import raise_open_files_limit; "
         "print(raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"],
        preexec_fn=low_soft_limit, capture_output=True, text=True, check=True)
    raised, soft = (int(v) for v in out.stdout.split())
    assert raised == soft > 256
    assert soft == (hard if hard != resource.RLIM_INFINITY else 1 << 20)


def test_a_bug_is_a_json_500_with_its_request_id_and_the_connection_stays_open(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unhandled exception (a bug) is answered as a JSON 500 carrying X-Request-ID, the
    log line carries the id (the log filter reads it from app.observability.request_id),
    and the keep-alive connection serves the next request."""
    import logging

    from app.observability import request_id
    from app.registry import Registry

    def broken(self: Registry) -> list[object]:
        raise RuntimeError("a bug")

    seen: list[tuple[str, str, bool]] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.getMessage(), request_id.get(), record.exc_info is not None))

    grab = Grab(level=logging.ERROR)
    logging.getLogger("cfmaps").addHandler(grab)
    monkeypatch.setattr(Registry, "list", broken)
    try:
        with httpx.Client(base_url=server, timeout=30) as http:
            r = http.get("/v1/models", headers={**API, "X-Request-ID": "trace-me-500"})
            assert r.status_code == 500
            assert r.json() == {"error": "internal_error", "field": None,
                                "message": "internal server error; the error was logged"}
            assert r.headers["x-request-id"] == "trace-me-500"
            assert http.get("/healthz").status_code == 200  # the same connection
    finally:
        logging.getLogger("cfmaps").removeHandler(grab)
    assert ("unhandled error on GET /v1/models", "trace-me-500", True) in seen
