"""Conventions platform teams expect: Open Inference Protocol health routes, request ids,
JSON logs, complete Allow headers and an OpenAPI document that states its rules."""

from __future__ import annotations

import io
import json
import logging
import warnings
from typing import Any

from svc_helpers import Fitted, Service

from app.observability import configure_logging


def test_open_inference_protocol_health(rf_service: tuple[Service, str]) -> None:
    svc, model_id = rf_service
    assert svc.client.get("/v2/health/live").json() == {"live": True}
    r = svc.client.get("/v2/health/ready")
    assert r.status_code == 200 and r.json() == {"ready": True}
    r = svc.client.get(f"/v2/models/{model_id}/ready")
    assert r.status_code == 200 and r.json() == {"name": model_id, "ready": True, "status": "ready"}
    r = svc.client.get("/v2/models/nope/ready")
    assert r.status_code == 404 and r.json()["error"] == "model_not_found"


def test_a_model_not_ready_yet_says_when_to_ask_again(
    service: Service, rf: Fitted, tmp_path: Any
) -> None:
    """``/v2/models/{id}/ready``'s 503 is documented with ``Retry-After`` (as the other
    probes send it); it had none. A failed model gets none: waiting does not mend it."""
    import functools

    import build_faults
    from svc_helpers import upload, wait_built, wait_until

    builds = service.app.state.builds
    gate = tmp_path / "gate"
    builds.worker = functools.partial(build_faults.hold, str(gate))
    mid = upload(service.client, rf.skops).json()["id"]
    wait_until(lambda: service.client.get(f"/v1/models/{mid}").json()["status"] == "building")
    r = service.client.get(f"/v2/models/{mid}/ready")
    assert r.status_code == 503 and r.json()["status"] == "building"
    assert r.headers["Retry-After"] == "1"
    gate.touch()
    assert wait_built(service.client, mid)["status"] == "ready"
    builds.worker = build_faults.zero_division
    bad = wait_built(service.client, upload(service.client, rf.skops).json()["id"])
    assert bad["status"] == "failed"
    r = service.client.get(f"/v2/models/{bad['id']}/ready")
    assert r.status_code == 503 and "Retry-After" not in r.headers


def test_request_ids_in_and_out(service: Service) -> None:
    r = service.client.get("/healthz", headers={"X-Request-ID": "req-42"})
    assert r.headers["X-Request-ID"] == "req-42"
    fresh = [service.client.get("/healthz").headers["X-Request-ID"] for _ in range(2)]
    assert fresh[0] != fresh[1] and all(len(f) == 32 for f in fresh)
    # a header that would break log lines is replaced, not echoed
    r = service.client.get("/healthz", headers={"X-Request-ID": "a b\tc"})
    assert r.headers["X-Request-ID"] not in ("a b\tc", "") and " " not in r.headers["X-Request-ID"]
    # errors carry it too
    r = service.client.get("/v1/models/nope", headers={"X-Request-ID": "req-43"})
    assert r.status_code == 404 and r.headers["X-Request-ID"] == "req-43"


def test_json_logs_carry_the_request_id(service: Service) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("json", "info")
        buf = io.StringIO()
        root.handlers[0].setStream(buf)  # type: ignore[attr-defined]
        service.client.get("/v1/models/nope", headers={"X-Request-ID": "req-44"})
        logging.getLogger("cfmaps.app").info("outside a request")
        # a Python warning (numpy's overflow RuntimeWarning, say) is a JSON line too: it
        # was printed raw, two lines of text among the JSON
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("overflow encountered in multiply", RuntimeWarning, stacklevel=1)
        lines = [json.loads(line) for line in buf.getvalue().splitlines()]
        assert lines and all({"time", "level", "logger", "message", "request_id"} <= set(x) for x in lines)
        assert lines[-2]["request_id"] == "-" and lines[-2]["message"] == "outside a request"
        assert lines[-1]["logger"] == "py.warnings" and "overflow" in lines[-1]["message"]
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        logging.captureWarnings(False)


def test_405_names_every_allowed_method(service: Service) -> None:
    for path, allowed in (("/v1/models", "GET, HEAD, POST"),
                          ("/v1/models/abc", "GET, HEAD, DELETE"),
                          ("/v1/models/abc/counterfactuals", "POST"), ("/healthz", "GET, HEAD")):
        r = service.client.options(path)
        assert r.status_code == 405 and r.headers["Allow"] == allowed, path
        assert r.json()["error"] == "method_not_allowed"
        # every method named is answered (HEAD as GET), none other
        for method in ("HEAD", "GET"):
            code = service.client.request(method, path).status_code
            assert (code == 405) == (method not in allowed), (path, method, code)


def test_openapi_states_its_rules(service: Service) -> None:
    doc: dict[str, Any] = service.client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for name in ("CounterfactualRequest", "PredictRequest"):
        assert schemas[name]["allOf"] == [
            {"oneOf": [{"required": ["instance"]}, {"required": ["instances"]}]}
        ]
        assert schemas[name]["properties"]["instances"]["minItems"] == 1
        assert "null" not in json.dumps(schemas[name]["properties"]["instance"])
    post = doc["paths"]["/v1/models"]["post"]
    links = post["responses"]["202"]["links"]
    ops = {op["operationId"] for p in doc["paths"].values() for op in p.values()}
    assert {"get_model", "counterfactuals", "predict", "delete_model"} <= {
        link["operationId"] for link in links.values()} <= ops
    for path in ("/v1/models", "/v1/models/{model_id}/counterfactuals", "/v1/models/{model_id}/predict"):
        assert {"400", "413", "422"} <= set(doc["paths"][path]["post"]["responses"]), path
    # every answer a route gives is documented: readiness probes' 503, token checks' 401/403
    for path in ("/readyz", "/v2/health/ready"):
        assert "503" in doc["paths"][path]["get"]["responses"], path
    for path in ("/v1/models", "/v1/models/{model_id}"):
        assert {"401", "403"} <= set(doc["paths"][path]["get"]["responses"]), path


def test_one_of_is_enforced(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    x = rf.X[0].tolist()
    for body in ({}, {"instance": x, "instances": [x]}, {"instances": []}, {"instance": None},
                 # an explicit null is not "absent": the schema's oneOf refuses it too
                 {"instance": x, "instances": None}, {"instance": None, "instances": [x]}):
        for path in ("counterfactuals", "predict"):
            r = svc.client.post(f"/v1/models/{model_id}/{path}", json=body)
            assert r.status_code == 422, (path, body, r.text)
            assert r.json()["field"] in ("instance", "instances"), (path, body, r.json())
