"""Counterfactual and predict routes, validated against the model's own predictions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from svc_helpers import GB3_SPEC, Fitted, Service

import maps_core.query
from maps_core._memory import bytes_per_box

NAMES = ["x0", "x1", "x2", "x3", "x4"]


def _vec(obj: dict[str, Any], names: list[str]) -> np.ndarray:
    return np.array([obj[n] for n in names], dtype=np.float64)


def _in_region(x: np.ndarray, region: dict[str, Any], names: list[str]) -> bool:
    for j, n in enumerate(names):
        iv = region[n]
        if iv["lower"] is not None:
            if x[j] < iv["lower"] or (x[j] == iv["lower"] and not iv["lower_closed"]):
                return False
        if iv["upper"] is not None:
            if x[j] > iv["upper"] or (x[j] == iv["upper"] and not iv["upper_closed"]):
                return False
    return True


def _check(res: dict[str, Any], fitted: Fitted, x: np.ndarray, names: list[str]) -> np.ndarray:
    """Everything a client relies on, checked against the model itself."""
    model = fitted.model
    assert res["prediction"] == model.predict(x[None])[0]
    assert res["feasible"] is True and res["reason"] is None
    assert res["optimal"] is True
    cf = _vec(res["counterfactual"], names)
    assert model.predict(cf[None])[0] == res["target"] != res["prediction"]
    changed = {n for j, n in enumerate(names) if cf[j] != x[j]}
    assert set(res["changes"]) == changed
    for n, ch in res["changes"].items():
        assert ch["from"] == x[names.index(n)] and ch["to"] == res["counterfactual"][n]
    assert _in_region(cf, res["region"], names)
    assert res["distance"] == pytest.approx(res["counterfactual_distance"], rel=1e-5, abs=1e-6)
    assert set(res["stats"]) == {
        "nodes_popped",
        "rectangles_evaluated",
        "regions_refined",
        "peak_boxes",
        "seconds",
    }
    return cf


def test_single_instance_as_object_and_list(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    url = f"/v1/models/{model_id}/counterfactuals"
    for i in range(5):
        x = rf.X[i]
        by_list = svc.client.post(url, json={"instance": x.tolist()})
        by_obj = svc.client.post(url, json={"instance": dict(zip(NAMES, x.tolist(), strict=True))})
        assert by_list.status_code == by_obj.status_code == 200, by_list.text
        a, b = by_list.json(), by_obj.json()
        assert a["counterfactual"] == b["counterfactual"] and a["distance"] == b["distance"]
        assert "alternatives" not in a
        cf = _check(a, rf, x, NAMES)
        # L1 with unit weights (unbounded continuous features): the certified optimum can be
        # no farther than any training point the model assigns to the target class.
        assert a["distance"] == pytest.approx(np.abs(cf - x).sum(), rel=1e-5)
        mask = rf.model.predict(rf.X) == a["target"]
        assert a["distance"] <= np.abs(rf.X[mask] - x).sum(axis=1).min() + 1e-9


def test_batch_answers_in_input_order(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    url = f"/v1/models/{model_id}/counterfactuals"
    X = rf.X[:12]
    batch = svc.client.post(url, json={"instances": X.tolist(), "norm": "l2"}).json()["results"]
    assert len(batch) == 12
    for i, res in enumerate(batch):
        single = svc.client.post(url, json={"instance": X[i].tolist(), "norm": "l2"}).json()
        assert res["counterfactual"] == single["counterfactual"]
        _check(res, rf, X[i], NAMES)


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_norms(rf_service: tuple[Service, str], rf: Fitted, norm: str) -> None:
    svc, model_id = rf_service
    x = rf.X[3]
    res = svc.client.post(
        f"/v1/models/{model_id}/counterfactuals", json={"instance": x.tolist(), "norm": norm}
    ).json()
    cf = _check(res, rf, x, NAMES)
    d = cf - x
    expected = {"l1": np.abs(d).sum(), "l2": np.sqrt((d**2).sum()), "linf": np.abs(d).max()}
    assert res["counterfactual_distance"] == pytest.approx(expected[norm], rel=1e-6)


def test_targets_by_label_and_string(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    url = f"/v1/models/{model_id}/counterfactuals"
    x = rf.X[0]
    pred = int(rf.model.predict(x[None])[0])
    other = 1 - pred
    for target in (other, str(other), float(other)):
        res = svc.client.post(url, json={"instance": x.tolist(), "target": target}).json()
        assert res["target"] == other
        _check(res, rf, x, NAMES)
    # Asking for the class it already has: the input itself, at distance 0.
    res = svc.client.post(url, json={"instance": x.tolist(), "target": pred}).json()
    assert res["distance"] == 0 and res["changes"] == {}
    for bad in (7, "seven", True, [0], {"a": 1}):
        r = svc.client.post(url, json={"instance": x.tolist(), "target": bad})
        assert r.status_code == 422, bad
        assert r.json()["field"] == "target"


CONSTRAINED = {
    "immutable": ["x4"],
    "direction": {"x0": "increase", "x1": "decrease"},
    "bounds": {"x2": [-2.0, None]},
    "weights": {"x3": 2.0},
}


def test_constraints_are_passed_to_the_engine(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    url = f"/v1/models/{model_id}/counterfactuals"
    feasible = 0
    for i in range(6):
        x = rf.X[i]
        res = svc.client.post(url, json={"instance": x.tolist(), **CONSTRAINED}).json()
        if not res["feasible"]:
            assert res["reason"] and res["counterfactual"] is None and res["distance"] is None
            assert res["changes"] is None and res["region"] is None and res["optimal"] is True
            continue
        feasible += 1
        cf = _vec(res["counterfactual"], NAMES)
        assert rf.model.predict(cf[None])[0] == res["target"] != res["prediction"]
        # Up to float32 rounding (see the exact test below).
        assert abs(cf[4] - x[4]) < 1e-6
        assert cf[0] >= x[0] - 1e-6 and cf[1] <= x[1] + 1e-6
        assert cf[2] >= -2.0 or abs(cf[2] - x[2]) < 1e-6
    assert feasible > 0


def test_constraints_are_exact(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    url = f"/v1/models/{model_id}/counterfactuals"
    for i in (0, 1, 4, 5):
        x = rf.X[i]
        res = svc.client.post(url, json={"instance": x.tolist(), **CONSTRAINED}).json()
        cf = _check(res, rf, x, NAMES)
        assert cf[4] == x[4] and "x4" not in res["changes"]
        assert cf[0] >= x[0] and cf[1] <= x[1]


def test_k_alternatives(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    x = rf.X[1]
    res = svc.client.post(
        f"/v1/models/{model_id}/counterfactuals", json={"instance": x.tolist(), "k": 3}
    ).json()
    _check(res, rf, x, NAMES)
    alts = res["alternatives"]
    assert 1 <= len(alts) <= 2
    dists = [res["distance"]] + [a["distance"] for a in alts]
    assert dists == sorted(dists)
    for a in alts:
        cf = _vec(a["counterfactual"], NAMES)
        assert rf.model.predict(cf[None])[0] == a["target"]
        assert _in_region(cf, a["region"], NAMES)
        assert set(a["changes"]) == {n for j, n in enumerate(NAMES) if cf[j] != x[j]}


def test_answers_per_request_are_limited(service_factory: Any, rf: Fitted) -> None:
    """Instances times k is capped (CFMAPS_MAX_ANSWERS): 1,000 instances at k = 100 made a
    430 MB answer and about 2 GB of memory in the serving process."""
    with service_factory(max_answers=12) as svc:
        model_id = svc.add(rf.skops)
        url = f"/v1/models/{model_id}/counterfactuals"
        rows = rf.X[:4].tolist()
        r = svc.client.post(url, json={"instances": rows, "k": 3})
        assert r.status_code == 200 and len(r.json()["results"]) == 4, r.text
        r = svc.client.post(url, json={"instances": rows + rows[:1], "k": 3})
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "payload_too_large" and r.json()["field"] == "k"
        assert "15 counterfactuals, above the limit of 12" in r.json()["message"]
        r = svc.client.post(url, json={"instance": rows[0], "k": 13})
        assert r.status_code == 413 and r.json()["field"] == "k", r.text
        r = svc.client.post(url, json={"instance": rows[0], "k": 101})  # over CFMAPS_MAX_K
        assert r.status_code == 422 and r.json()["field"] == "k", r.text


def test_display_names_integer_features_and_domain(service: Service, gb3: Fitted) -> None:
    model_id = service.add(gb3.skops, GB3_SPEC)
    url = f"/v1/models/{model_id}/counterfactuals"
    names = [f["name"] for f in GB3_SPEC["features"]]
    display = dict(zip(["high", "low", "mid"], GB3_SPEC["classes"], strict=True))
    x = gb3.X[0]
    pred = gb3.model.predict(x[None])[0]
    targets = [c for c in ("high", "low", "mid") if c != pred]
    for target in (targets[0], display[targets[1]]):  # a label, then a display name
        res = service.client.post(url, json={"instance": x.tolist(), "target": target}).json()
        assert res["prediction"] == display[pred]
        assert res["target"] in (display[targets[0]], display[targets[1]])
        cf = _vec(res["counterfactual"], names)
        assert display[gb3.model.predict(cf[None])[0]] == res["target"]
        # integer/binary features come back as JSON integers; age is immutable in the spec
        for n in ("income", "late", "age"):
            assert type(res["counterfactual"][n]) is int
            for end in ("lower", "upper"):
                v = res["region"][n][end]
                assert v is None or type(v) is int
        assert "age" not in res["changes"]
        assert type(res["counterfactual"]["score"]) is float

    bad = {"income": 3.5, "late": 0, "score": 0.1, "age": 30}
    r = service.client.post(url, json={"instances": [x.tolist(), bad]})
    assert r.status_code == 422 and r.json()["field"] == "instances.1.income"
    r = service.client.post(url, json={"instance": {**bad, "income": 3, "age": 10}})
    assert r.status_code == 422 and r.json()["field"] == "instance.age"
    assert "legal range" in r.json()["message"]

    # an unknown class is refused naming the classes as the responses show them (the
    # message listed the model's own labels)
    r = service.client.post(url, json={"instance": x.tolist(), "target": "Top"})
    assert r.status_code == 422 and r.json()["field"] == "target"
    assert str(GB3_SPEC["classes"]) in r.json()["message"], r.json()["message"]
    r = service.client.post(f"/v1/models/{model_id}/map.png",
                            json={"instance": x.tolist(), "target": "Top",
                                  "features": ["income", "score"]})
    assert r.status_code == 422 and r.json()["field"] == "target"
    assert str(GB3_SPEC["classes"]) in r.json()["message"], r.json()["message"]

    r = service.client.post(f"/v1/models/{model_id}/predict", json={"instance": x.tolist()})
    assert r.status_code == 200
    assert r.json()["prediction"] == display[pred]
    assert set(r.json()["probabilities"]) == set(GB3_SPEC["classes"])


def test_predict_matches_the_model(rf_service: tuple[Service, str], rf: Fitted) -> None:
    svc, model_id = rf_service
    X = rf.X[:20]
    r = svc.client.post(f"/v1/models/{model_id}/predict", json={"instances": X.tolist()})
    assert r.status_code == 200
    results = r.json()["results"]
    proba = rf.model.predict_proba(X)
    for i, res in enumerate(results):
        assert res["prediction"] == rf.model.predict(X[i : i + 1])[0]
        assert res["probabilities"]["0"] == pytest.approx(proba[i, 0])
        assert res["probabilities"]["1"] == pytest.approx(proba[i, 1])
    one = svc.client.post(f"/v1/models/{model_id}/predict", json={"instance": X[0].tolist()})
    assert one.json() == results[0]


def test_default_norm_setting(service_factory: Any, rf: Fitted) -> None:
    with service_factory(default_norm="linf") as svc:
        model_id = svc.add(rf.skops)
        x = rf.X[2]
        res = svc.client.post(
            f"/v1/models/{model_id}/counterfactuals", json={"instance": x.tolist()}
        ).json()
        cf = _check(res, rf, x, NAMES)
        assert res["counterfactual_distance"] == pytest.approx(np.abs(cf - x).max(), rel=1e-6)
        # and the OpenAPI document says so (it said "default l1")
        props = svc.client.get("/openapi.json").json()["components"]["schemas"][
            "CounterfactualRequest"]["properties"]
        assert "default linf." in props["norm"]["description"]
        assert "default l1" not in props["norm"]["description"]


def test_openapi_states_the_query_time_limit(service_factory: Any, rf: Fitted) -> None:
    """max_seconds carried only its exclusive minimum, so a schema-valid 60 was a 422
    "at most 30" (QA, session 61): the document states the configured limit, and a value
    at it is answered."""
    with service_factory(query_max_seconds=12.5) as svc:
        model_id = svc.add(rf.skops)
        props = svc.client.get("/openapi.json").json()["components"]["schemas"][
            "CounterfactualRequest"]["properties"]
        number = [b for b in props["max_seconds"]["anyOf"] if b.get("type") == "number"]
        assert number == [{"type": "number", "exclusiveMinimum": 0.0, "maximum": 12.5}]
        url = f"/v1/models/{model_id}/counterfactuals"
        x = rf.X[0].tolist()
        assert svc.client.post(url, json={"instance": x, "max_seconds": 12.5}).status_code == 200
        r = svc.client.post(url, json={"instance": x, "max_seconds": 12.6})
        assert r.status_code == 422 and r.json()["field"] == "max_seconds"
    with service_factory(query_max_seconds=None) as svc:  # no limit: none stated
        props = svc.client.get("/openapi.json").json()["components"]["schemas"][
            "CounterfactualRequest"]["properties"]
        assert all("maximum" not in b for b in props["max_seconds"]["anyOf"])


def test_query_box_budget_setting(service_factory: Any, rf: Fitted) -> None:
    """CFMAPS_QUERY_MAX_BOXES bounds the mixed-region search of each instance: on maps a
    build left mixed regions in, a query that needs more boxes is a 422 budget_exceeded
    naming the limit, and the queries that fit answer exactly as without the limit. In
    one thread, as the comparison is box for box."""
    X = rf.X[:40]
    with service_factory(build_max_rectangles=20, query_threads=1) as svc:
        mid = svc.add(rf.skops)
        free = svc.client.post(f"/v1/models/{mid}/counterfactuals",
                               json={"instances": X.tolist(), "norm": "l2"}).json()["results"]
    with service_factory(build_max_rectangles=20, query_max_boxes=1, query_threads=1) as svc:
        mid = svc.add(rf.skops)
        refused = []
        for i, (x, want) in enumerate(zip(X, free, strict=True)):
            r = svc.client.post(f"/v1/models/{mid}/counterfactuals",
                                json={"instance": x.tolist(), "norm": "l2"})
            if r.status_code == 422:
                assert r.json()["error"] == "budget_exceeded"
                assert "more than 1 box of" in r.json()["message"]
                assert r.json()["field"] == "instance"
                assert want["stats"]["regions_refined"] > 1
                refused.append(i)
            else:
                assert r.status_code == 200
                assert r.json()["counterfactual_distance"] == want["counterfactual_distance"]
        assert refused
        # a batch names its first row out of the budget (it named none: the client could
        # not tell which to drop), in the compiled batch and row by row (k = 2)
        for k in (1, 2):
            r = svc.client.post(f"/v1/models/{mid}/counterfactuals",
                                json={"instances": X.tolist(), "norm": "l2", "k": k})
            assert r.status_code == 422 and r.json()["error"] == "budget_exceeded", r.text
            if k == 1:
                assert r.json()["field"] == f"instances.{refused[0]}"
            else:  # k = 2 searches further: its first row out may come earlier
                assert int(r.json()["field"].split(".")[1]) <= refused[0]


def test_query_memory_budget_setting(service_factory: Any, rf: Fitted) -> None:
    """CFMAPS_QUERY_MAX_MEMORY bounds the boxes each instance's search holds at once: with
    room for two boxes, a query that held more without it (``peak_boxes``) is a 422
    budget_exceeded naming the limit, and one that held at most one answers as without it
    (a pop takes one slot beyond its own before it frees any, so two may not be enough for
    a search that held two). In one thread, as the comparison is box for box."""
    X = rf.X[:40]
    with service_factory(build_max_rectangles=20, query_threads=1) as svc:
        mid = svc.add(rf.skops)
        free = svc.client.post(f"/v1/models/{mid}/counterfactuals",
                               json={"instances": X.tolist(), "norm": "l2"}).json()["results"]
        kern = svc.app.state.registry.get(mid).maps.engine.kernel
        per_box = bytes_per_box(len(NAMES), len(kern.roots), len(kern.base))
    with service_factory(build_max_rectangles=20, query_max_memory=2 * per_box,
                         query_threads=1) as svc:
        assert svc.settings.effective_query_memory() == 2 * per_box
        mid = svc.add(rf.skops)
        refused = answered = 0
        for x, want in zip(X, free, strict=True):
            r = svc.client.post(f"/v1/models/{mid}/counterfactuals",
                                json={"instance": x.tolist(), "norm": "l2"})
            held = want["stats"]["peak_boxes"]
            if r.status_code == 422:
                assert r.json()["error"] == "budget_exceeded"
                assert "max_memory" in r.json()["message"]
            else:
                assert r.status_code == 200, r.text
                assert r.json()["counterfactual_distance"] == want["counterfactual_distance"]
                assert r.json()["stats"]["peak_boxes"] == held
            if held > 2:
                assert r.status_code == 422
                refused += 1
            elif held <= 1:
                assert r.status_code == 200
                answered += 1
        assert refused > 0 and answered > 0


def test_query_threads_setting(service_factory: Any, rf: Fitted,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """CFMAPS_QUERY_THREADS reaches the engine: with searches in parts however short, a
    service at 2 threads runs each instance's search in two parts and answers as one at
    1, which runs none in parts."""
    monkeypatch.setattr(maps_core.query, "PARALLEL_SHARE", 0.0)
    calls: list[int] = []
    real = maps_core.query._run_parts
    monkeypatch.setattr(maps_core.query, "_run_parts",
                        lambda *a: calls.append(a[4]) or real(*a))
    X = rf.X[:12]
    got: dict[int, list[float]] = {}
    for n in (1, 2):
        calls.clear()
        # no warm-up: its own searches run in parts (in two threads) and would count
        with service_factory(build_max_rectangles=20, query_threads=n, warm_up=False) as svc:
            assert svc.settings.query_threads == n
            mid = svc.add(rf.skops)
            got[n] = []
            for x in X:
                r = svc.client.post(f"/v1/models/{mid}/counterfactuals",
                                    json={"instance": x.tolist(), "norm": "l1"})
                assert r.status_code == 200, r.text
                _check(r.json(), rf, x, NAMES)
                got[n].append(r.json()["counterfactual_distance"])
        assert calls == ([] if n == 1 else [2] * len(X))
    assert got[1] == got[2]


def test_query_time_budget_setting(service_factory: Any, rf: Fitted) -> None:
    """CFMAPS_QUERY_MAX_SECONDS bounds the mixed-region search of each instance: with no
    time at all, a query on maps a build left mixed regions in is a 422 budget_exceeded
    naming the limit; on the default (30 s) the same query answers."""
    x = rf.X[0].tolist()
    with service_factory(build_max_rectangles=20, query_max_seconds=1e-9) as svc:
        mid = svc.add(rf.skops)
        r = svc.client.post(f"/v1/models/{mid}/counterfactuals", json={"instance": x})
        assert r.status_code == 422, r.text
        assert r.json()["error"] == "budget_exceeded"
        assert "max_seconds" in r.json()["message"]
    with service_factory(build_max_rectangles=20) as svc:
        assert svc.settings.query_max_seconds == 30.0
        mid = svc.add(rf.skops)
        r = svc.client.post(f"/v1/models/{mid}/counterfactuals", json={"instance": x})
        assert r.status_code == 200, r.text


def test_best_found_on_budget(service_factory: Any, rf: Fitted) -> None:
    """``on_budget: best``: an instance whose search runs out of CFMAPS_QUERY_MAX_BOXES
    answers 200 with a valid counterfactual, ``optimal`` false and a ``lower_bound`` at or
    below the exact answer's distance, itself at or below the one returned; instances that
    fit answer exactly (``lower_bound`` = ``distance``). The default stays a 422."""
    X = rf.X[:40]
    with service_factory(build_max_rectangles=20) as svc:
        mid = svc.add(rf.skops)
        exact = svc.client.post(f"/v1/models/{mid}/counterfactuals",
                                json={"instances": X.tolist()}).json()["results"]
    with service_factory(build_max_rectangles=20, query_max_boxes=1) as svc:
        mid = svc.add(rf.skops)
        url = f"/v1/models/{mid}/counterfactuals"
        got = svc.client.post(url, json={"instances": X.tolist(), "on_budget": "best"})
        assert got.status_code == 200, got.text
        unproven = 0
        for x, res, want in zip(X, got.json()["results"], exact, strict=True):
            cf = _vec(res["counterfactual"], NAMES)
            assert rf.model.predict(cf[None])[0] == res["target"] != res["prediction"]
            assert _in_region(cf, res["region"], NAMES)
            assert res["lower_bound"] <= want["distance"] * (1 + 1e-12)
            assert want["distance"] <= res["distance"] * (1 + 1e-12)
            if res["optimal"]:
                assert res["distance"] == pytest.approx(want["distance"], abs=1e-12)
                assert res["lower_bound"] == res["distance"]
            else:
                unproven += 1
                r = svc.client.post(url, json={"instance": x.tolist()})
                assert r.status_code == 422 and r.json()["error"] == "budget_exceeded"
                assert "on_budget" in r.json()["message"]
        assert unproven > 0
        metrics = svc.client.get("/metrics").text
        assert f"cfmaps_counterfactuals_unproven_total {float(unproven)}" in metrics


def test_best_found_by_the_services_default(service_factory: Any, rf: Fitted) -> None:
    """CFMAPS_QUERY_ON_BUDGET=best: a request that does not say answers with the best
    found beyond the budgets (``optimal`` false where unproven); one that says ``error``
    still gets the 422, and the OpenAPI document names the default."""
    X = rf.X[:40].tolist()
    with service_factory(build_max_rectangles=20, query_max_boxes=1,
                         query_on_budget="best") as svc:
        mid = svc.add(rf.skops)
        url = f"/v1/models/{mid}/counterfactuals"
        got = svc.client.post(url, json={"instances": X})
        assert got.status_code == 200, got.text
        results = got.json()["results"]
        unproven = [x for x, r in zip(X, results, strict=True) if not r["optimal"]]
        assert unproven and len(unproven) < len(X)
        for r in results:  # valid, proven or not
            cf = _vec(r["counterfactual"], NAMES)
            assert rf.model.predict(cf[None])[0] == r["target"] != r["prediction"]
            assert r["lower_bound"] <= r["distance"]
        r = svc.client.post(url, json={"instance": unproven[0], "on_budget": "error"})
        assert r.status_code == 422 and r.json()["error"] == "budget_exceeded", r.text
        r = svc.client.post(url, json={"instance": unproven[0]})
        assert r.status_code == 200 and r.json()["optimal"] is False
        # the map picture's counterfactual (within its slice) follows the same default:
        # drawn when its search met one, a 422 only when it met none
        drawn = 0
        for x in unproven:
            r = svc.client.post(f"/v1/models/{mid}/map.png", json={
                "features": ["x0", "x1"], "instance": x, "width": 20, "height": 15})
            assert r.status_code == 200 or "no best found" in r.json()["message"], r.text
            drawn += r.status_code == 200
        assert drawn > 0
        schema = svc.client.get("/openapi.json").json()["components"]["schemas"]
        doc = schema["CounterfactualRequest"]["properties"]["on_budget"]["description"]
        assert "`CFMAPS_QUERY_ON_BUDGET` (here `best`)" in doc, doc


def test_request_time_limit(service_factory: Any, rf: Fitted) -> None:
    """``max_seconds`` in a request tightens the service's time budget, never loosens it."""
    x = rf.X[0].tolist()
    with service_factory(build_max_rectangles=20, query_max_seconds=5.0) as svc:
        mid = svc.add(rf.skops)
        url = f"/v1/models/{mid}/counterfactuals"
        r = svc.client.post(url, json={"instance": x, "max_seconds": 1e-9})
        assert r.status_code == 422 and r.json()["error"] == "budget_exceeded", r.text
        assert "1e-09 s" in r.json()["message"]
        r = svc.client.post(url, json={"instance": x, "max_seconds": 1e-9, "on_budget": "best"})
        assert r.status_code == 200, r.text
        assert r.json()["optimal"] is False
        assert r.json()["lower_bound"] <= r.json()["distance"]
        r = svc.client.post(url, json={"instance": x, "max_seconds": 10})
        assert r.status_code == 422 and r.json()["field"] == "max_seconds", r.text
        for bad in (0, -1, "1", True, "NaN"):
            r = svc.client.post(url, json={"instance": x, "max_seconds": bad})
            assert r.status_code == 422, (bad, r.text)
        r = svc.client.post(url, json={"instance": x, "on_budget": "approximate"})
        assert r.status_code == 422 and "on_budget" in r.text
        r = svc.client.post(url, json={"instance": x, "max_seconds": 2.5})
        assert r.status_code == 200 and r.json()["optimal"] is True
        assert r.json()["lower_bound"] == r.json()["distance"]


@pytest.mark.parametrize("route", ["counterfactuals", "map.png"])
def test_a_query_waiting_for_its_thread_survives_a_delete(
    rf_service: tuple[Service, str], rf: Fitted, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """A query naming its target by label waits for a worker thread; a DELETE answered
    meanwhile took the entry's maps away, and the target's resolution, done in the
    thread, failed an assert: a 500 (QA, session 61). The query answers with the maps it
    was given."""
    import threading

    import app.routes.counterfactuals as routes

    svc, model_id = rf_service
    started, release = threading.Event(), threading.Event()
    name = "counterfactual_answer" if route == "counterfactuals" else "map_picture"
    real = getattr(routes, name)

    def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(routes, name, held)
    monkeypatch.setattr(routes, "runs_inline", lambda *a: False)
    x = {n: float(v) for n, v in zip(NAMES, rf.X[0], strict=True)}
    target = int(1 - rf.model.predict(rf.X[:1])[0])
    body: dict[str, Any] = {"instance": x, "target": target}
    if route == "map.png":
        body["features"] = NAMES[:2]
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(
        svc.client.post(f"/v1/models/{model_id}/{route}", json=body)))
    t.start()
    assert started.wait(30)
    assert svc.client.delete(f"/v1/models/{model_id}").status_code == 204
    release.set()
    t.join(60)
    r = out[0]
    assert r.status_code == 200, r.text
    if route == "counterfactuals":
        assert r.json()["target"] == target
        cf = _vec(r.json()["counterfactual"], NAMES)
        assert rf.model.predict(cf[None])[0] == target
    assert svc.client.get(f"/v1/models/{model_id}").status_code == 404


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
@pytest.mark.parametrize("route", ["counterfactuals", "predict", "map.png"])
def test_an_unknown_query_parameter_is_refused(rf_service: tuple[Service, str], rf: Fitted,
                                               route: str, content_type: str) -> None:
    """An option sent in the query string rather than the body (``?norm=l2``) was ignored
    with a 200: answered in l1, as if it had been heard. Both request paths (the lean
    dispatch takes the exact ``application/json`` only) refuse it, naming it; a client's
    cache-buster ``_`` is let through."""
    svc, mid = rf_service
    body = {"instance": list(map(float, rf.X[0]))}
    if route == "map.png":
        body |= {"features": ["x0", "x1"], "width": 20, "height": 15}
    url = f"/v1/models/{mid}/{route}"
    headers = {"Content-Type": content_type}
    content = __import__("json").dumps(body)
    r = svc.client.post(url, params={"norm": "l2"}, content=content, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "norm"
    assert "unknown query parameter 'norm'" in r.json()["message"]
    assert "request body" in r.json()["message"]
    ok = svc.client.post(url, params={"_": "1700000000"}, content=content, headers=headers)
    assert ok.status_code == 200, ok.text
    assert svc.client.post(url, content=content, headers=headers).status_code == 200


def test_validation_messages_speak_to_the_client(rf_service: tuple[Service, str],
                                                 rf: Fitted) -> None:
    """pydantic's "Value error, " prefix is not passed on, and a [lower, upper] pair (or a
    map's lo,hi range) with an item short is "too few items" on the pair, not "Field
    required" on an item the client never named (a_range=30 read as if it were unsent)."""
    svc, model_id = rf_service
    url = f"/v1/models/{model_id}"
    x = rf.X[0].tolist()
    r = svc.client.post(f"{url}/counterfactuals", json={"instance": x, "k": 2.5})
    assert r.status_code == 422 and r.json()["message"] == "k: expected an integer", r.text
    r = svc.client.post(f"{url}/counterfactuals", json={"instance": x, "bounds": {"x0": [1]}})
    assert r.status_code == 422, r.text
    assert (r.json()["field"], r.json()["message"]) == (
        "bounds.x0", "bounds.x0: too few items: only 1 given")
    r = svc.client.get(f"{url}/map.png", params={
        "features": "x0,x1", "instance": ",".join(map(str, x)), "a_range": "30"})
    assert r.status_code == 422, r.text
    assert (r.json()["field"], r.json()["message"]) == (
        "a_range", "a_range: too few items: only 1 given")


def test_a_query_parameter_given_twice_is_refused_unless_it_takes_a_list(
        rf_service: tuple[Service, str], rf: Fitted) -> None:
    """``?limit=1&limit=2`` listed two models and ``?status=ready&status=failed`` none:
    the last value was taken silently. A parameter that takes a list (map.png's
    ``features``, sent once per name) may repeat."""
    svc, mid = rf_service
    for query, name in (("limit=1&limit=2", "limit"), ("status=ready&status=failed", "status")):
        r = svc.client.get(f"/v1/models?{query}")
        assert r.status_code == 422 and r.json()["field"] == name, r.text
        assert "more than once" in r.json()["message"]
    x = ",".join(map(str, rf.X[0]))
    r = svc.client.get(f"/v1/models/{mid}/map.png?features=x0&features=x1&instance={x}"
                       "&width=20&height=15")
    assert r.status_code == 200, r.text
    r = svc.client.get(f"/v1/models/{mid}/map.png?features=x0,x1&instance={x}&width=20"
                       "&width=30&height=15")
    assert r.status_code == 422 and r.json()["field"] == "width", r.text
