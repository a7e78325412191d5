"""Helpers shared by the service tests (imported as a plain module: tests/app has no
``__init__.py``, which would shadow the ``app`` package)."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import skops.io as sio
import uvicorn

from app.main import create_app
from app.settings import Settings

with warnings.catch_warnings():
    # Starlette 1.x deprecates httpx in its TestClient in favour of httpx2, which this
    # environment does not ship; the warning says nothing about our code.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

LOCAL = ("127.0.0.1", 50000)


def free_port() -> int:
    """A loopback TCP port nobody listens on (for a real server in a test)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
REMOTE = ("203.0.113.7", 50000)


@dataclass
class Fitted:
    """A fitted model with its data."""

    model: Any
    X: np.ndarray
    y: np.ndarray

    @property
    def skops(self) -> bytes:
        return sio.dumps(self.model)


GB3_SPEC = {
    "name": "grades",
    "features": [
        {"name": "income", "type": "integer", "lower": 0, "upper": 100},
        {"name": "late", "type": "binary"},
        {"name": "score", "type": "continuous", "lower": -5, "upper": 5},
        {"name": "age", "type": "integer", "lower": 18, "upper": 100, "mutable": False},
    ],
    # gb3.model.classes_ is sorted: ["high", "low", "mid"]
    "classes": ["High risk", "Low risk", "Medium risk"],
}


# Generous: the first build of a run also compiles the numba kernels (about 25 s on a
# 2-core machine with a cold cache, longer when the machine is busy); a passing wait
# returns as soon as the predicate holds.
def wait_until(predicate: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def wait_ready(client: TestClient) -> dict[str, Any]:
    """Wait for /readyz to answer 200 (start-up load done)."""
    out: dict[str, Any] = {}

    def ok() -> bool:
        r = client.get("/readyz")
        out.update(r.json())
        return r.status_code == 200

    wait_until(ok, timeout=300)  # a fresh checkout compiles the query kernels first
    return out


def wait_built(
    client: TestClient, model_id: str, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Poll GET /v1/models/{id} until ready or failed; returns the last body."""
    body: dict[str, Any] = {}

    def done() -> bool:
        body.update(client.get(f"/v1/models/{model_id}", headers=headers).json())
        return body["status"] in ("ready", "failed")

    wait_until(done)
    return body


def upload(
    client: TestClient,
    model: bytes,
    spec: dict[str, Any] | str | None = None,
    headers: dict[str, str] | None = None,
    filename: str = "model.skops",
) -> Any:
    data = None
    if spec is not None:
        data = {"spec": spec if isinstance(spec, str) else json.dumps(spec)}
    return client.post("/v1/models", files={"model": (filename, model)}, data=data, headers=headers)


class Service:
    """A running app (lifespan entered) with a loopback TestClient."""

    def __init__(self, client: TestClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings

    @property
    def app(self) -> Any:
        return self.client.app

    def add(
        self,
        model: bytes,
        spec: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> str:
        """Upload, wait for the build, return the id (asserting it became ready)."""
        r = upload(self.client, model, spec, headers=headers)
        assert r.status_code == 202, r.text
        body = wait_built(self.client, r.json()["id"], headers=headers)
        assert body["status"] == "ready", body
        return str(body["id"])


@contextmanager
def start_service(
    data_dir: Path,
    client: tuple[str, int] = LOCAL,
    raise_server_exceptions: bool = True,
    **overrides: Any,
) -> Iterator[Service]:
    """Create an app on ``data_dir``, enter its lifespan and wait for /readyz."""
    settings = Settings(data_dir=data_dir, **overrides)
    app = create_app(settings)
    with TestClient(app, client=client, raise_server_exceptions=raise_server_exceptions) as c:
        wait_ready(c)
        yield Service(c, settings)


def decode_png(data: bytes) -> np.ndarray:
    """RGB array (h, w, 3) of an 8-bit RGB, non-interlaced PNG (all five row filters)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    i, idat = 8, b""
    while i < len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        kind, body = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        assert struct.unpack(">I", data[i + 8 + n:i + 12 + n])[0] == zlib.crc32(kind + body)
        if kind == b"IHDR":
            w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, colour, interlace) == (8, 2, 0)
        elif kind == b"IDAT":
            idat += body
        i += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + 3 * w)
    out = np.zeros((h, 3 * w), dtype=np.int64)
    for r in range(h):
        f, line = raw[r, 0], raw[r, 1:].astype(np.int64)
        prev = out[r - 1] if r else np.zeros(3 * w, dtype=np.int64)
        if f == 0:
            out[r] = line
        elif f == 2:
            out[r] = (line + prev) % 256
        else:  # the encoder under test writes filter 0 only; others are not expected
            raise AssertionError(f"unexpected PNG row filter {f}")
    return out.reshape(h, w, 3).astype(np.uint8)


@contextmanager
def serve_uvicorn(settings: Settings) -> Iterator[tuple[str, Any]]:
    """The app under a real uvicorn in a thread, on a free loopback port:
    ``(base url, app)``."""
    app = create_app(settings)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(),
                                        log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    base = f"http://127.0.0.1:{srv.config.port}"
    # ready = the query kernels compiled (a minute on a fresh checkout) and models loaded
    deadline = time.monotonic() + 300
    while httpx.get(f"{base}/readyz", timeout=10).status_code != 200:
        assert thread.is_alive() and time.monotonic() < deadline, "the app did not get ready"
        time.sleep(0.02)
    try:
        yield base, app
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
