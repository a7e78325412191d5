"""Real responses follow the response models the OpenAPI document publishes.

The routes build plain dicts for speed; here each kind of answer is read back through its
documented model. A round trip through the model must give the response unchanged, so a
key the model does not document (dropped on validation), a documented key the response
lacks (filled by a default) or a value of another type fails the test.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from svc_helpers import Fitted, Service

from app.schemas import (
    CounterfactualBatchOut,
    CounterfactualOut,
    ErrorResponse,
    ModelInfo,
    ModelList,
    ModelReadyOut,
    PredictBatchOut,
    PredictionOut,
    ReadinessOut,
    ServerReadyOut,
)


def _follows(model: type[BaseModel], data: Any) -> None:
    parsed = model.model_validate(data)
    assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == data


def test_answers_follow_their_models(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    url = f"/v1/models/{model_id}"
    x = rf.X[0].tolist()
    cases: list[tuple[type[BaseModel], str, dict[str, Any]]] = [
        (CounterfactualOut, "/counterfactuals", {"instance": x}),
        (CounterfactualOut, "/counterfactuals", {"instance": x, "k": 3, "norm": "l2"}),
        # infeasible: every feature immutable
        (CounterfactualOut, "/counterfactuals", {"instance": x, "immutable": svc_names(svc, model_id)}),
        (CounterfactualBatchOut, "/counterfactuals", {"instances": [x, rf.X[1].tolist()], "k": 2}),
        (PredictionOut, "/predict", {"instance": x}),
        (PredictBatchOut, "/predict", {"instances": [x, x]}),
    ]
    seen_infeasible = seen_alternatives = False
    for model, route, body in cases:
        r = svc.client.post(url + route, json=body)
        assert r.status_code == 200, r.text
        _follows(model, r.json())
        doc = r.json()
        seen_infeasible |= doc.get("feasible") is False
        seen_alternatives |= "alternatives" in doc
    assert seen_infeasible and seen_alternatives  # the cases cover both optional shapes
    _follows(ModelInfo, svc.client.get(url).json())
    _follows(ModelList, svc.client.get("/v1/models").json())


def svc_names(svc: Service, model_id: str) -> list[str]:
    return [f["name"] for f in svc.client.get(f"/v1/models/{model_id}").json()["features"]]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"instance": [1.0]}, 422),
        ({"instances": [[0.0, 0.0, 0.0, 0.0], [1e9, 0.0, 0.0, 0.0]], "target": "nope"}, 422),
        ({"instance": [0.0, 0.0, 0.0, 0.0], "weights": {"zip": 1.0}}, 422),
    ],
)
def test_errors_follow_their_model(
    rf_service: tuple[Service, str], body: dict[str, Any], status: int
) -> None:
    svc, model_id = rf_service
    r = svc.client.post(f"/v1/models/{model_id}/counterfactuals", json=body)
    assert r.status_code == status
    doc = r.json()
    assert doc["field"]  # every input error names its field
    _follows(ErrorResponse, doc)


def test_errors_quote_what_the_client_sent_in_short(rf_service: tuple[Service, str]) -> None:
    """An unknown feature named by a 3 MB key came back twice, in ``message`` and
    ``field``: a 6 MB 422."""
    svc, model_id = rf_service
    key = "k" * 1_000_000
    for body in ({"instance": {key: 1.0}}, {key: 1}):
        r = svc.client.post(f"/v1/models/{model_id}/counterfactuals", json=body)
        assert r.status_code == 422, r.text[:300]
        assert len(r.content) < 10_000, len(r.content)
        doc = r.json()
        assert doc["field"].endswith("...") and doc["message"].endswith("...")
        _follows(ErrorResponse, doc)


def test_the_probes_answer_as_documented(service_factory: Any, rf: Fitted) -> None:
    """The 503 bodies of the readiness probes were not in the OpenAPI document."""
    with service_factory() as svc:
        model_id = svc.add(rf.skops)
        doc = svc.client.get("/openapi.json").json()["paths"]
        for path, model in (("/readyz", ReadinessOut), ("/v2/health/ready", ServerReadyOut),
                            (f"/v2/models/{model_id}/ready", ModelReadyOut)):
            r = svc.client.get(path)
            assert r.status_code == 200, r.text
            _follows(model, r.json())
            documented = doc[path.replace(model_id, "{model_id}")]["get"]["responses"]
            for code in ("200", "503"):
                schema = documented[code]["content"]["application/json"]["schema"]
                assert schema == {"$ref": f"#/components/schemas/{model.__name__}"}
        svc.app.state.registry.loaded.clear()  # as while loading at start
        r = svc.client.get("/readyz")
        assert r.status_code == 503
        _follows(ReadinessOut, r.json())
        r = svc.client.get("/v2/health/ready")
        assert r.status_code == 503 and r.json() == {"ready": False}
        svc.app.state.registry.loaded.set()
        # every operation but a GET documents the 415 of a Content-Encoding
        for path, item in doc.items():
            for method, op in item.items():
                assert ("415" in op["responses"]) == (method != "get"), (method, path)


def _untyped(schema: dict[str, Any]) -> bool:
    """Whether a JSON schema leaves a value's type open: ``{}``, an object of anything or
    a list of such."""
    if not schema or schema.get("additionalProperties") is True:
        return True
    if schema.get("type") == "object" and "properties" not in schema and not isinstance(
            schema.get("additionalProperties"), dict):
        return True
    parts = [schema.get("items", {"type": "x"})] if schema.get("type") == "array" else []
    parts += schema.get("anyOf", []) + schema.get("oneOf", [])
    return any(_untyped(p) for p in parts)


def test_every_response_is_typed_and_documented(rf_service: tuple[Service, str]) -> None:
    """A generated client read a model's features and build statistics, and the instances
    it sends, as untyped objects, and the answers' fields had no word of documentation."""
    svc, _ = rf_service
    doc = svc.client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    seen: set[str] = set()

    def refs(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref":
                    name = value.rsplit("/", 1)[1]
                    if name not in seen:
                        seen.add(name)
                        refs(schemas[name])
                else:
                    refs(value)
        elif isinstance(node, list):
            for value in node:
                refs(value)

    for item in doc["paths"].values():
        for op in item.values():
            refs(op.get("responses", {}))
    assert {"ModelInfo", "FeatureInfo", "BuildStatsOut", "CounterfactualOut"} <= seen
    # self-explanatory where their model's description says what they are
    plain = {"id", "name", "message", "results", "models", "ready", "status"}
    for name in seen:
        schema = schemas[name]
        assert schema.get("description"), name
        for prop, sub in schema.get("properties", {}).items():
            assert not _untyped(sub), (name, prop, sub)
            assert "description" in sub or "$ref" in sub or prop in plain, (name, prop)
    for name in ("CounterfactualRequest", "PredictRequest", "MapRequest"):
        instance = schemas[name]["properties"]["instance"]
        assert not _untyped(instance), instance
