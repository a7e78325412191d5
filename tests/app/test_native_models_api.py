"""Native XGBoost and LightGBM model files through the HTTP API: upload, build, query, check
with the library itself, and the refusals."""

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


@pytest.mark.parametrize("ext", ["json", "ubj"])
def test_xgboost_upload_query_and_check_with_xgboost(service: Service, tmp_path, ext: str) -> None:
    xgb = pytest.importorskip("xgboost")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 4))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5)
    clf = xgb.XGBClassifier(n_estimators=15, max_depth=3, random_state=0).fit(X, y)
    clf.get_booster().feature_names = ["income", "age", "debt", "late"]
    path = tmp_path / f"model.{ext}"
    clf.save_model(path)
    ref = xgb.XGBClassifier()
    ref.load_model(path)
    r = upload(service.client, path.read_bytes(), filename="upload")
    assert r.status_code == 202, r.text
    info = wait_built(service.client, r.json()["id"])
    assert info["status"] == "ready" and info["format"] == "xgboost"
    names = [f["name"] for f in info["features"]]
    assert names == ["income", "age", "debt", "late"]
    url = f"/v1/models/{info['id']}/counterfactuals"
    for x in X[:10]:
        for target in (0, 1, 2):
            doc = service.client.post(url, json={"instance": x.tolist(), "target": target}).json()
            cf = np.array([doc["counterfactual"][n] for n in names])
            assert int(ref.predict(cf[None])[0]) == doc["target"] == target


def test_unsupported_xgboost_files_get_a_422(service: Service, tmp_path) -> None:
    xgb = pytest.importorskip("xgboost")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    xgb.XGBRegressor(n_estimators=2).fit(X, X[:, 0]).save_model(tmp_path / "reg.json")
    good = tmp_path / "good.json"
    xgb.XGBClassifier(n_estimators=2).fit(X, (X[:, 0] > 0).astype(int)).save_model(good)
    data = good.read_bytes()
    for blob, words in (((tmp_path / "reg.json").read_bytes(), "objective 'reg:squarederror'"),
                        (data[: len(data) // 2], "truncated or malformed")):
        r = upload(service.client, blob)
        assert r.status_code == 422 and r.json()["field"] == "model", r.text
        assert words in r.json()["message"]
    # a wrong feature count against the spec
    r = upload(service.client, data, {"features": [{"name": "a"}, {"name": "b"}]})
    assert r.status_code == 422 and r.json()["field"] == "spec.features"


def test_hist_gradient_boosting_through_skops(service: Service) -> None:
    import skops.io as sio
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(800, 4))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5)
    model = HistGradientBoostingClassifier(max_iter=20, max_depth=3, random_state=0).fit(X, y)
    r = upload(service.client, sio.dumps(model))
    assert r.status_code == 202, r.text
    info = wait_built(service.client, r.json()["id"])
    assert info["status"] == "ready" and info["model_type"] == "HistGradientBoostingClassifier"
    url = f"/v1/models/{info['id']}/counterfactuals"
    for x in X[:10]:
        doc = service.client.post(url, json={"instance": x.tolist(), "norm": "l1"}).json()
        cf = np.array([doc["counterfactual"][f"x{i}"] for i in range(4)])
        assert model.predict(cf[None])[0] == doc["target"] != doc["prediction"]


def test_hist_gradient_boosting_with_categorical_features_through_skops(service: Service) -> None:
    """Its preprocessor (FunctionTransformer(partial(check_array))) passes skops' trust
    check, a spec declares the codes' column nominal, and every answer is a legal code the
    model predicts as the target."""
    import skops.io as sio
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=800), rng.integers(0, 9, 800)]).astype(float)
    y = ((X[:, 0] > 0) ^ np.isin(X[:, 1], (2, 5, 6))).astype(int)
    model = HistGradientBoostingClassifier(max_iter=20, categorical_features=[1],
                                           random_state=0).fit(X, y)
    spec = {"features": [{"name": "a"}, {"name": "c", "type": "nominal", "lower": 0, "upper": 8}]}
    r = upload(service.client, sio.dumps(model), spec)
    assert r.status_code == 202, r.text
    info = wait_built(service.client, r.json()["id"])
    assert info["status"] == "ready", info
    url = f"/v1/models/{info['id']}/counterfactuals"
    for x in X[:10]:
        doc = service.client.post(url, json={"instance": x.tolist(), "norm": "l1"}).json()
        cf = np.array([doc["counterfactual"]["a"], doc["counterfactual"]["c"]])
        assert cf[1] in range(9)
        assert model.predict(cf[None])[0] == doc["target"] != doc["prediction"]
