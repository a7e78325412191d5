"""A LightGBM text model through the HTTP API: upload, build, query, check with LightGBM."""

from __future__ import annotations

import numpy as np
import pytest
from svc_helpers import Service, upload, wait_built

lgb = pytest.importorskip("lightgbm")


def _fitted(feature_names: list[str] | None = None):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 4))
    y = (X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(int)
    clf = lgb.LGBMClassifier(n_estimators=20, num_leaves=6, verbose=-1, random_state=0)
    clf.fit(X, y, feature_name=feature_names or "auto")
    return clf, X


def test_upload_query_and_check_with_lightgbm(service: Service) -> None:
    clf, X = _fitted()
    text = clf.booster_.model_to_string().encode()
    r = upload(service.client, text, {"classes": ["no", "yes"]}, filename="model.bin")
    assert r.status_code == 202, r.text
    info = wait_built(service.client, r.json()["id"])
    assert info["status"] == "ready" and info["format"] == "lightgbm"
    assert [f["name"] for f in info["features"]] == [f"Column_{i}" for i in range(4)]
    url = f"/v1/models/{info['id']}/counterfactuals"
    for x in X[:15]:
        doc = service.client.post(url, json={"instance": x.tolist(), "norm": "l2"}).json()
        cf = np.array([doc["counterfactual"][f"Column_{i}"] for i in range(4)])
        assert ["no", "yes"][clf.predict(cf[None])[0]] == doc["target"] != doc["prediction"]
    pred = service.client.post(f"/v1/models/{info['id']}/predict", json={"instances": X[:20].tolist()})
    want = [["no", "yes"][c] for c in clf.predict(X[:20])]
    assert [p["prediction"] for p in pred.json()["results"]] == want


def test_feature_names_come_from_the_file_and_are_checked(service: Service) -> None:
    names = ["income", "age", "debt", "late"]
    clf, _ = _fitted(names)
    text = clf.booster_.model_to_string().encode()
    r = upload(service.client, text)
    assert r.status_code == 202
    assert [f["name"] for f in wait_built(service.client, r.json()["id"])["features"]] == names
    spec = {"features": [{"name": n} for n in ["income", "debt", "age", "late"]]}
    r = upload(service.client, text, spec)
    assert r.status_code == 422 and r.json()["field"] == "spec.features.1.name"


def test_unsupported_lightgbm_files_get_a_422(service: Service) -> None:
    clf, X = _fitted()
    good = clf.booster_.model_to_string()
    reg = lgb.LGBMRegressor(n_estimators=2, verbose=-1).fit(X, X[:, 0]).booster_.model_to_string()
    for text, words in ((reg, "objective 'regression'"), (good[: len(good) // 2], "truncated")):
        r = upload(service.client, text.encode())
        assert r.status_code == 422 and r.json()["field"] == "model", r.text
        assert words in r.json()["message"]
