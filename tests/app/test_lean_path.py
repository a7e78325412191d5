"""The leaner request path (issue 16): the query routes' lean dispatch answers as FastAPI
does, the corked transport writes a response once, orjson writes what json wrote."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from fastapi import APIRouter, FastAPI, Request
from starlette.routing import Match
from svc_helpers import Fitted, Service

from app.responses import SafeJSONResponse
from app.routes import counterfactuals
from app.routes.lean import LeanDispatch, LeanJSONRoute
from app.schemas import CounterfactualRequest
from app.server import PROTOCOL, _CorkedTransport

# "application/json; charset=utf-8" is JSON to FastAPI but not to the lean dispatch, which
# takes the exact "application/json" only: the same request through both paths.
LEAN = {"Content-Type": "application/json"}
FASTAPI = {"Content-Type": "application/json; charset=utf-8"}


def _strip_seconds(doc: Any) -> Any:
    """The answer without the engine's timings (which differ run to run)."""
    if isinstance(doc, dict):
        return {k: _strip_seconds(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_strip_seconds(v) for v in doc]
    return doc


def _both(svc: Service, url: str, body: bytes | str, **headers: str) -> tuple[Any, Any]:
    lean = svc.client.post(url, content=body, headers={**LEAN, **headers})
    full = svc.client.post(url, content=body, headers={**FASTAPI, **headers})
    return lean, full


def test_the_query_routes_take_the_lean_path() -> None:
    plans = {(r.path, *r.methods): r.lean for r in counterfactuals.router.routes
             if isinstance(r, LeanJSONRoute)}
    assert plans[("/v1/models/{model_id}/counterfactuals", "POST")] is not None
    assert plans[("/v1/models/{model_id}/predict", "POST")] is not None
    assert plans[("/v1/models/{model_id}/map.png", "POST")] is not None
    assert plans[("/v1/models/{model_id}/map.png", "GET")] is None  # query parameters


def test_routes_of_other_shapes_keep_fastapis_handler() -> None:
    router = APIRouter(route_class=LeanJSONRoute)

    @router.post("/q")
    async def with_query(body: CounterfactualRequest, n: int = 1) -> SafeJSONResponse:
        return SafeJSONResponse({})

    @router.post("/d")
    async def returns_dict(body: CounterfactualRequest) -> dict[str, int]:
        return {}

    @router.post("/s")
    def sync_endpoint(body: CounterfactualRequest) -> SafeJSONResponse:
        return SafeJSONResponse({})

    @router.post("/n")
    async def no_body(request: Request) -> SafeJSONResponse:
        return SafeJSONResponse({})

    @router.post("/c/{x}")
    async def typed_path(x: int, body: CounterfactualRequest) -> SafeJSONResponse:
        return SafeJSONResponse({})

    routes = [r for r in router.routes if isinstance(r, LeanJSONRoute)]
    assert len(routes) == 5 and all(r.lean is None for r in routes)


def test_the_dispatch_matches_what_the_router_matches(rf_service: tuple[Service, str]) -> None:
    svc, model_id = rf_service
    dispatch = LeanDispatch(svc.app, [counterfactuals.router])
    for path in (f"/v1/models/{model_id}/counterfactuals", f"/v1/models/{model_id}/predict",
                 f"/v1/models/{model_id}/map.png", f"/v1/models/{model_id}",
                 "/v1/models", f"/v1/models/{model_id}/counterfactuals/x", "/healthz"):
        scope = {"type": "http", "method": "POST", "path": path, "root_path": ""}
        ours = dispatch._match(scope)
        theirs = [r for r in counterfactuals.router.routes if r.matches(scope)[0] == Match.FULL]
        assert (ours is None) == (not theirs), path
        if ours is not None:
            assert ours[0].route is theirs[0] and ours[1] == {"model_id": model_id}


def test_lean_and_fastapi_answers_are_the_same(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    url = f"/v1/models/{model_id}/counterfactuals"
    bodies: list[bytes | str] = [
        json.dumps({"instance": rf.X[0].tolist()}),
        json.dumps({"instance": dict(zip(["x0", "x1", "x2", "x3", "x4"], rf.X[1].tolist(),
                                         strict=True)), "norm": "l2", "k": 3}),
        json.dumps({"instances": rf.X[:7].tolist(), "norm": "linf"}),
        json.dumps({"instances": rf.X[:3].tolist(), "bounds": {"x0": [None, 1.0]},
                    "immutable": ["x1"], "direction": {"x2": "increase"}}),
        # refused by the engine, the codec or the service's limits (lean path, app.errors)
        json.dumps({"instance": rf.X[0].tolist(), "target": 7}),
        json.dumps({"instance": [1.0, 2.0]}),
        json.dumps({"instance": {"x0": 1.0}}),
        json.dumps({"instance": rf.X[0].tolist(), "k": 101}),
        json.dumps({"instances": rf.X[:2].tolist(), "weights": {"nope": 1.0}}),
        json.dumps({"instances": np.resize(rf.X, (1001, 5)).tolist()}),
        # refused by pydantic or the JSON decoder (FastAPI's own path, with the body replayed)
        json.dumps({"instance": rf.X[0].tolist(), "norm": "l3"}),
        json.dumps({"instace": rf.X[0].tolist()}),
        json.dumps({"instance": rf.X[0].tolist(), "k": 1.5}),
        '{"instance": [1, 2,',
        "[" * 5000 + "]" * 5000,
        "",
        b"\xff\xfe",
    ]
    for body in bodies:
        lean, full = _both(svc, url, body)
        assert lean.status_code == full.status_code, (body, lean.text, full.text)
        assert _strip_seconds(lean.json()) == _strip_seconds(full.json()), body
        assert lean.headers["content-type"] == full.headers["content-type"]
    lean, full = _both(svc, "/v1/models/nope/counterfactuals", json.dumps({"instance": [1.0] * 5}))
    assert lean.status_code == full.status_code == 404 and lean.json() == full.json()


def test_lean_path_answers_errors_through_the_app_handlers(
    service_factory: Any, rf: Fitted
) -> None:
    with service_factory(api_tokens="tok-a", rate_limit_per_minute=3) as svc:
        ok = {"Authorization": "Bearer tok-a"}
        model_id = svc.add(rf.skops, headers=ok)
        url = f"/v1/models/{model_id}/counterfactuals"
        body = json.dumps({"instance": rf.X[0].tolist()})
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
            lean, full = _both(svc, url, body, **headers)
            assert lean.status_code == full.status_code and lean.status_code in (401, 403)
            assert lean.json() == full.json()
            assert lean.headers.get("www-authenticate") == full.headers.get("www-authenticate")
        statuses = [svc.client.post(url, content=body, headers={**LEAN, **ok}).status_code
                    for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        r = svc.client.post(url, content=body, headers={**LEAN, **ok})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"] == "rate_limited"


def test_lean_path_keeps_request_ids_metrics_and_the_body_limit(
    service_factory: Any, rf: Fitted
) -> None:
    with service_factory(max_body_bytes=2000) as svc:
        model_id = svc.add(rf.skops)
        url = f"/v1/models/{model_id}/counterfactuals"
        r = svc.client.post(url, content=json.dumps({"instance": rf.X[0].tolist()}),
                            headers={**LEAN, "X-Request-ID": "abc-123"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "abc-123"
        big = json.dumps({"instances": np.resize(rf.X, (100, 5)).tolist()})
        lean, full = _both(svc, url, big)
        assert lean.status_code == full.status_code == 413 and lean.json() == full.json()
        text = svc.client.get("/metrics").text
        line = ('cfmaps_http_requests_total{method="POST",'
                'route="/v1/models/{model_id}/counterfactuals",status="200"} 1.0')
        assert line in text


def test_dependency_overrides_send_requests_to_fastapi(rf_service: tuple[Service, str],
                                                        rf: Fitted) -> None:
    from app.security import require_query

    svc, model_id = rf_service
    calls = []

    async def counting(request: Request) -> None:
        calls.append(1)

    app: FastAPI = svc.app
    app.dependency_overrides[require_query] = counting
    try:
        r = svc.client.post(f"/v1/models/{model_id}/counterfactuals",
                            content=json.dumps({"instance": rf.X[0].tolist()}), headers=LEAN)
    finally:
        app.dependency_overrides.clear()
    assert r.status_code == 200 and calls == [1]


class _FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_corked_transport_writes_one_turns_output_once() -> None:
    async def run() -> tuple[list[bytes], list[bytes], list[bytes], bool]:
        loop = asyncio.get_running_loop()
        fake = _FakeTransport()
        t = _CorkedTransport(fake, loop)
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        t.write(b"body")
        held = list(fake.writes)  # nothing written within the turn
        await asyncio.sleep(0)
        once = list(fake.writes)
        t.write(b"last")
        t.close()  # writes what it holds before closing
        assert t.get_extra_info("peername") == "info:peername"
        await asyncio.sleep(0)
        return held, once, fake.writes, fake.closed

    held, once, final, closed = asyncio.run(run())
    assert held == [] and once == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    assert final == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"last"] and closed
    assert PROTOCOL.startswith("app.server:Corked")


@pytest.mark.parametrize("doc", [
    {"a": 1.5e-05, "b": [1, 2.0, None, True, False], "c": "é\u2028\"\\/\n", "d": 1e16,
     "e": 0.1 + 0.2, "f": -0.0, "g": {"h": []}, "i": 2**63 - 1, "j": -(2**63)},
    {"big": 2**70, "s": "\ud800"},  # what orjson refuses: the json module writes it
    {1: "non-string key"},
    [np.float64(0.5), 3],
])
def test_json_answers_mean_what_the_json_module_wrote(doc: Any) -> None:
    body = SafeJSONResponse(doc).body
    reference = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                           default=lambda v: v.item()).encode("utf-8", errors="replace")
    assert json.loads(body) == json.loads(reference)
