"""Hostile and malformed input: always a JSON 4xx naming the field, never a 500."""

from __future__ import annotations

import gzip
import json
from typing import Any

import numpy as np
import pytest
from svc_helpers import Fitted, Service, start_service

GOOD = [0.1, 0.2, 0.3, 0.4, 0.5]


@pytest.fixture(scope="module")
def strict_service(tmp_path_factory: pytest.TempPathFactory, rf: Fitted) -> Any:
    """A service that answers 500 (instead of raising) if a bug slips through (one per
    module: these tests only read)."""
    with start_service(
        tmp_path_factory.mktemp("hostile"),
        raise_server_exceptions=False,
        max_batch=10,
        max_body_bytes=20_000,
    ) as s:
        yield s, s.add(rf.skops)


def _raw(svc: Service, model_id: str, text: str, path: str = "counterfactuals") -> Any:
    return svc.client.post(
        f"/v1/models/{model_id}/{path}",
        content=text.encode(),
        headers={"content-type": "application/json"},
    )


@pytest.mark.parametrize(
    ("text", "status", "field"),
    [
        ('{"instance": [NaN, 0.2, 0.3, 0.4, 0.5]}', 422, "instance.x0"),
        ('{"instance": [0.1, Infinity, 0.3, 0.4, 0.5]}', 422, "instance.x1"),
        ('{"instance": [0.1, 0.2, -Infinity, 0.4, 0.5]}', 422, "instance.x2"),
        ('{"instance": {"x0": NaN, "x1": 0, "x2": 0, "x3": 0, "x4": 0}}', 422, "instance.x0"),
        ('{"instance": [1e400, 0.2, 0.3, 0.4, 0.5]}', 422, "instance.x0"),
        ('{"instance": [1' + "0" * 400 + ", 0.2, 0.3, 0.4, 0.5]}", 422, "instance.x0"),
        ('{"instance": ["0.1", 0.2, 0.3, 0.4, 0.5]}', 422, "instance.x0"),
        ('{"instance": [true, 0.2, 0.3, 0.4, 0.5]}', 422, "instance.x0"),
        ('{"instance": [null, 0.2, 0.3, 0.4, 0.5]}', 422, "instance.x0"),
        ('{"instance": [[0.1], 0.2, 0.3, 0.4, 0.5]}', 422, "instance.x0"),
        ('{"instance": {"x0": {}, "x1": 0, "x2": 0, "x3": 0, "x4": 0}}', 422, "instance.x0"),
        ('{"instance": [0.1, 0.2]}', 422, "instance"),
        ('{"instance": []}', 422, "instance"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]}', 422, "instance"),
        ('{"instance": {"x0": 0, "x1": 0, "x2": 0, "x3": 0}}', 422, "instance.x4"),
        (
            '{"instance": {"x0": 0, "x1": 0, "x2": 0, "x3": 0, "x4": 0, "x9": 1}}',
            422,
            "instance.x9",
        ),
        ('{"instance": "0.1,0.2"}', 422, "instance"),
        ('{"instance": 5}', 422, "instance"),
        (
            '{"instances": [[0.1, 0.2, 0.3, 0.4, 0.5], [0.1, "x", 0.3, 0.4, 0.5]]}',
            422,
            "instances.1.x1",
        ),
        ('{"instances": []}', 422, "instances"),
        ('{"instances": {"a": 1}}', 422, "instances"),
        (
            '{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "instances": [[0.1, 0.2, 0.3, 0.4, 0.5]]}',
            422,
            "instance",
        ),
        ("{}", 422, "instance"),
        ('{"instace": [0.1, 0.2, 0.3, 0.4, 0.5]}', 422, "instace"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "norm": "l3"}', 422, "norm"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "norm": 1}', 422, "norm"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "k": 0}', 422, "k"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "k": "2"}', 422, "k"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "k": 1.5}', 422, "k"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "k": 1000000000}', 422, "k"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "weights": {"x0": -1}}', 422, "weights.x0"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "weights": {"x0": NaN}}', 422, "weights.x0"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "weights": {"zz": 1}}', 422, "weights.zz"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "weights": [1, 2]}', 422, "weights"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "immutable": ["zz"]}', 422, "immutable.zz"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "immutable": "x0"}', 422, "immutable"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "direction": {"x0": "up"}}', 422, "direction.x0"),
        (
            '{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "direction": {"zz": "increase"}}',
            422,
            "direction.zz",
        ),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "bounds": {"x0": [1, 0]}}', 422, "bounds.x0"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "bounds": {"x0": [1]}}', 422, "bounds.x0"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "bounds": {"x0": [NaN, 1]}}', 422, "bounds.x0.0"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "bounds": {"zz": [0, 1]}}', 422, "bounds.zz"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "target": {"a": 1}}', 422, "target"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "target": NaN}', 422, "target"),
        ('{"instance": {"\\ud800": 1}}', 422, None),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "target": "\\udfff"}', 422, "target"),
        ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5], "weights": {"\\ud800": 1}}', 422, None),
        ("[1, 2, 3]", 422, "body"),
        ('"just a string"', 422, "body"),
        ("null", 422, "body"),
        ("{not json", 422, "body"),
        # json.loads fails otherwise: past the 4,300-digit limit, nested too deep
        ('{"instance": [' + "9" * 5000 + ', 0.2, 0.3, 0.4, 0.5]}', 422, "body"),
        # (Python 3.13's json parses 3,000 levels: then the instance is refused instead)
        ('{"instance": ' + "[" * 3000 + "]" * 3000 + "}", 422, ("body", "instance")),
        ("", 422, "body"),
        ("[" * 50_000 + "]" * 50_000, 413, "body"),
    ],
)
def test_hostile_counterfactual_bodies(
    strict_service: Any, text: str, status: int, field: str | tuple[str, ...] | None
) -> None:
    svc, model_id = strict_service
    r = _raw(svc, model_id, text)
    assert r.status_code == status, r.text
    body = r.json()
    assert body["message"] and body["error"]
    if isinstance(field, tuple):
        assert body["field"] in field, body
    elif field is not None:
        assert body["field"] == field, body
    # an optional field's null member is not the client's problem ("instances.none:
    # Input should be None" beside "List should have at least 1 item")
    assert not [d for d in body.get("details", []) if "Input should be None" in d["message"]]


def test_deep_nesting_within_the_body_limit_is_not_a_500(strict_service: Any) -> None:
    svc, model_id = strict_service
    r = _raw(svc, model_id, '{"instance": ' + "[" * 5000 + "]" * 5000 + "}")
    assert 400 <= r.status_code < 500


def test_predict_rejects_the_same_inputs(strict_service: Any) -> None:
    svc, model_id = strict_service
    for text, field in [
        ('{"instances": [[NaN, 0.2, 0.3, 0.4, 0.5]]}', "instances.0.x0"),
        ('{"instance": [0.1, 0.2]}', "instance"),
        ('{"instances": [[0.1, 0.2, 0.3, 0.4, 0.5]], "target": 1}', "target"),
    ]:
        r = _raw(svc, model_id, text, "predict")
        assert r.status_code == 422 and r.json()["field"] == field, r.text


@pytest.mark.parametrize("path", ["counterfactuals", "predict"])
@pytest.mark.parametrize(("content", "ctype"), [
    ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5]}', "text/plain"),  # JSON, not sent as JSON
    ('{"instance": [0.1, 0.2, 0.3, 0.4, 0.5]}', "application/x-www-form-urlencoded"),  # curl -d
    ("", "application/json"),
    ("null", "application/json"),
])
def test_a_body_that_is_no_json_object_names_the_body(strict_service: Any, path: str,
                                                      content: str, ctype: str) -> None:
    """These were 422s with field null and pydantic's 'a valid dictionary or object to
    extract fields from'."""
    svc, model_id = strict_service
    r = svc.client.post(f"/v1/models/{model_id}/{path}", content=content.encode(),
                        headers={"content-type": ctype})
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "body"
    assert "application/json" in r.json()["message"]


def test_values_beyond_float32_are_refused_with_the_reason(strict_service: Any) -> None:
    # JSON carries 1.8e308, scikit-learn's float32 forests refuse it in their own predict
    # (it was a 500): the 422 names the value. The counterfactual route refuses it too: an
    # answer keeping that value would be a point the model cannot be asked about.
    svc, model_id = strict_service
    huge = [0.1, 0.2, -3.4e39, 0.4, 1.7976931348623157e308]
    for route in ("predict", "counterfactuals"):
        for body, field in [({"instance": huge}, "instance.x2"),
                            ({"instances": [GOOD, huge]}, "instances.1.x2")]:
            r = svc.client.post(f"/v1/models/{model_id}/{route}", json=body)
            assert r.status_code == 422, r.text
            assert r.json()["field"] == field, r.json()
            assert "-3.4e+39" in r.json()["message"], r.json()
            assert "float32" in r.json()["message"], r.json()
    # the largest values the float32 view holds are answered, by both routes
    capped = [3.4028234663852886e38, 0.2, -3.4028234663852886e38, 0.4, 0.5]
    for route in ("predict", "counterfactuals"):
        r = svc.client.post(f"/v1/models/{model_id}/{route}", json={"instance": capped})
        assert r.status_code == 200, r.text


def test_batch_too_large_is_413(strict_service: Any) -> None:
    svc, model_id = strict_service
    for path in ("counterfactuals", "predict"):
        r = svc.client.post(f"/v1/models/{model_id}/{path}", json={"instances": [GOOD] * 11})
        assert r.status_code == 413
        assert r.json() == {
            "error": "payload_too_large",
            "message": "11 instances exceed the limit of 10 per request",
            "field": "instances",
        }
        ok = svc.client.post(f"/v1/models/{model_id}/{path}", json={"instances": [GOOD] * 10})
        assert ok.status_code == 200


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON",
                                          "application/json; charset=utf-8",
                                          "application/vnd.api+json"])
def test_a_body_fastapi_reads_as_json_but_cannot_is_422_in_any_case(
    strict_service: Any, content_type: str
) -> None:
    """FastAPI reads any application/json or application/*+json body as JSON, in any
    case; one it could not read was the 422 naming the body only when the Content-Type
    began with lower-case "application/json", else a 400 with no field (QA, session 61)."""
    svc, model_id = strict_service
    url = f"/v1/models/{model_id}/counterfactuals"
    for body in (('{"instance": [' + "9" * 5000 + ', 0.2, 0.3, 0.4, 0.5]}').encode(),
                 b'{"instance": "\xff\xfe"}'):  # not UTF-8
        r = svc.client.post(url, content=body, headers={"content-type": content_type})
        assert r.status_code == 422, (content_type, r.text)
        assert (r.json()["error"], r.json()["field"]) == ("invalid_input", "body")


def test_body_too_large_is_413_declared_or_streamed(strict_service: Any) -> None:
    svc, model_id = strict_service
    url = f"/v1/models/{model_id}/counterfactuals"
    big = json.dumps({"instance": GOOD, "pad": "x" * 30_000})
    r = svc.client.post(url, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body"

    def chunks() -> Any:  # no Content-Length: counted while streaming
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096].encode()

    r = svc.client.post(url, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"


def test_an_encoded_body_is_415_naming_its_encoding(strict_service: Any) -> None:
    # gzip was read as the body itself: 422 "not JSON this service reads (an integer of
    # more than 4,300 digits...)"; br over a plain body was answered as if plain
    svc, model_id = strict_service
    plain = json.dumps({"instance": GOOD}).encode()
    for route in ("counterfactuals", "predict"):
        url = f"/v1/models/{model_id}/{route}"
        for coding, body in (("gzip", gzip.compress(plain)), ("br", plain), ("GZIP", plain)):
            r = svc.client.post(url, content=body, headers={
                "content-type": "application/json", "content-encoding": coding})
            assert r.status_code == 415, (route, coding, r.text)
            assert r.json()["error"] == "unsupported_media_type"
            assert r.json()["field"] == "content-encoding" and coding.lower() in r.json()["message"]
        r = svc.client.post(url, content=plain, headers={
            "content-type": "application/json", "content-encoding": "identity"})
        assert r.status_code == 200, r.text
    r = svc.client.post("/v1/models", files={"model": ("m.skops", b"PK")},
                        headers={"content-encoding": "gzip"})
    assert r.status_code == 415


def test_wrong_methods_and_paths_are_json(strict_service: Any) -> None:
    svc, model_id = strict_service
    r = svc.client.get(f"/v1/models/{model_id}/counterfactuals")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    r = svc.client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = svc.client.post(
        f"/v1/models/{model_id}/counterfactuals",
        content=b"\xff\xfe\x00garbage",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    r = svc.client.post(
        f"/v1/models/{model_id}/counterfactuals",
        content=b"instance=1",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert 400 <= r.status_code < 500


@pytest.mark.parametrize("bad_id", ["a" * 300, "%C3%A8" * 200, "x%00y", "0" * 32])
def test_unknown_model_ids_of_any_shape_are_404(strict_service: Any, bad_id: str) -> None:
    # Each route first asks whether another process has the model on disk: an id that is
    # not a file name (too long, a NUL) answered 500 there, as schemathesis found.
    svc, _ = strict_service
    for method, path in [("GET", f"/v1/models/{bad_id}"), ("GET", f"/v2/models/{bad_id}/ready"),
                         ("DELETE", f"/v1/models/{bad_id}")]:
        r = svc.client.request(method, path)
        assert r.status_code == 404 and r.json()["error"] == "model_not_found", (path, r.text)
    r = svc.client.post(f"/v1/models/{bad_id}/counterfactuals", json={"instance": GOOD})
    assert r.status_code == 404, r.text


def test_a_multipart_body_cut_short_is_a_400(service: Any, rf: Fitted) -> None:
    """Starlette's parser keeps the parts it got whole: a body cut in the model file got
    422 "model: Field required", and one cut in the spec, after the model, was built
    without it."""
    model = (b'--XyZ\r\nContent-Disposition: form-data; name="model"; filename="m.skops"\r\n'
             b"Content-Type: application/octet-stream\r\n\r\n" + rf.skops + b"\r\n")
    spec = (b'--XyZ\r\nContent-Disposition: form-data; name="spec"\r\n\r\n'
            b'{"classes": ["no", "yes"]}\r\n')
    headers = {"content-type": 'multipart/form-data; boundary="XyZ"'}
    for body in (model[: len(model) // 2], model, model + spec[:60], model + spec):
        r = service.client.post("/v1/models", content=body, headers=headers)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "bad_request" and "cut short" in r.json()["message"]
    assert service.client.get("/v1/models").json() == {"models": [], "next_cursor": None}
    r = service.client.post("/v1/models", content=model + spec + b"--XyZ--\r\n",
                            headers=headers)
    assert r.status_code == 202 and r.json()["name"] == "m", r.text
    assert service.client.get(f"/v1/models/{r.json()['id']}").json()["classes"] == ["no", "yes"]
    # text after the closing delimiter (an epilogue, RFC 2046) is no cut: only the body's
    # last 64 bytes were looked at, and an 88-byte epilogue was refused
    r = service.client.post("/v1/models", content=model + b"--XyZ--\r\n" + b"epilogue " * 20,
                            headers=headers)
    assert r.status_code == 202, r.text


def test_the_closing_delimiter_is_found_however_the_body_is_chunked() -> None:
    from app.main import _CloseFinder

    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b"ab\r\n-XyZ", dtype=np.uint8)
    for _ in range(3000):
        body = rng.choice(alphabet, size=int(rng.integers(0, 60))).tobytes()
        finder = _CloseFinder(b"--XyZ--")
        cuts = np.sort(rng.integers(0, len(body) + 1, size=int(rng.integers(0, 8))))
        for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True):
            finder.feed(body[a:b])
        assert finder.found == (b"\r\n--XyZ--" in b"\r\n" + body), body


def test_hostile_uploads(service_factory: Any, rf: Fitted) -> None:
    with service_factory(raise_server_exceptions=False) as svc:
        c = svc.client
        cases = [
            {"files": {"model": ("m", b"\x1f\x8b" + b"\x00" * 100)}},
            {"files": {"model": ("m", b"PK\x05\x06" + b"\x00" * 18)}},  # empty zip
            {"files": {"model": ("m", rf.skops[: len(rf.skops) // 2])}},  # truncated
            {"files": {"model": ("m", rf.skops)}, "data": {"spec": '{"name": "\\ud800"}'}},
            {"files": {"model": ("m", rf.skops), "spec": ("s", b"\xff\xfe")}},
            {"files": {"model": ("m", rf.skops)}, "data": {"spec": "[" * 100_000}},
            {
                "content": b"--x\r\nnot multipart",
                "headers": {"content-type": "multipart/form-data"},
            },
            {"content": b"garbage", "headers": {"content-type": "multipart/form-data; boundary=x"}},
        ]
        for kw in cases:
            r = c.post("/v1/models", **kw)
            assert 400 <= r.status_code < 500, (kw, r.text)
            assert r.json()["error"]
        assert c.get("/v1/models").json() == {"models": [], "next_cursor": None}
        assert [p.name for p in svc.settings.models_dir.iterdir()] == []
