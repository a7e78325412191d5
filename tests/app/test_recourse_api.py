"""Actionable recourse over HTTP on the Adult data (issue 4).

A small forest trained on Adult, one-hot encoded by ``maps_core.load_csv`` (integer age and
hours, integer education level, binary sex and native country, four categorical groups), is
uploaded with skops and a spec carrying the real types, groups and bounds. Constrained
queries (immutable, one-way, bounds, categorical groups with switching costs, every norm,
``k`` alternatives) are checked against the model's own ``predict``, the legal values, the
constraints, the ``changes`` listing, and every Adult row: no real person who satisfies the
constraints and gets the target decision is closer than the certified distance.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skops.io as sio
from sklearn.ensemble import RandomForestClassifier
from svc_helpers import Service, start_service

from maps_core import FeatureSchema, load_csv
from tests.recourse import constraint_box

CLASSES = ["<=50K", ">50K"]
TARGET = ">50K"
NORMS = ["l1", "l2", "linf", "l0"]
GROUP_COSTS = {"Occupation": 0.25, "MaritalStatus": 3.0, "Relationship": 2.0}


@dataclass
class Adult:
    model: Any
    X: np.ndarray
    labels: np.ndarray  # model.predict on every row, as display names
    names: list[str]
    spec: dict[str, Any]
    lower: np.ndarray
    upper: np.ndarray
    integral: np.ndarray
    groups: dict[str, list[int]]

    def col(self, name: str) -> int:
        return self.names.index(name)

    def vec(self, obj: dict[str, Any]) -> np.ndarray:
        return np.array([obj[n] for n in self.names], dtype=np.float64)

    def predict(self, A: np.ndarray) -> np.ndarray:
        return np.array(CLASSES)[self.model.predict(np.atleast_2d(A))]


@pytest.fixture(scope="module")
def adult(shared_dir: Path) -> Adult:
    ds = load_csv(shared_dir / "datasets" / "Adult.csv")
    X = ds.X
    # EducationNumber is coded F but holds the education level 1..16: declare it integer.
    feats = [replace(f, type="integer") if f.name == "EducationNumber" else f for f in ds.schema]
    schema = FeatureSchema(tuple(feats))
    rng = np.random.default_rng(0)
    idx = rng.choice(len(X), 4000, replace=False)
    model = RandomForestClassifier(n_estimators=8, max_depth=4, random_state=0).fit(X[idx], ds.y[idx])
    lo, hi = schema.domains()
    spec = {"name": "adult", "features": schema.to_dicts(), "classes": CLASSES}
    return Adult(model, X, np.array(CLASSES)[model.predict(X)], schema.names, spec, lo, hi,
                 schema.integral_mask(), schema.groups())


@pytest.fixture(scope="module")
def adult_service(adult: Adult, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    with start_service(tmp_path_factory.mktemp("recourse") / "data") as svc:
        t0 = time.perf_counter()
        model_id = svc.add(sio.dumps(adult.model), adult.spec)
        assert time.perf_counter() - t0 < 60, "the Adult forest should build in seconds"
        yield svc, model_id


def ask(adult_service: tuple[Service, str], body: dict[str, Any]) -> dict[str, Any]:
    svc, model_id = adult_service
    r = svc.client.post(f"/v1/models/{model_id}/counterfactuals", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def queries(adult: Adult, n: int, seed: int) -> np.ndarray:
    """Rows the model puts below 50K, with room to raise education."""
    rng = np.random.default_rng(seed)
    ok = np.flatnonzero((adult.labels == "<=50K") & (adult.X[:, adult.col("EducationNumber")] < 16))
    return adult.X[rng.choice(ok, n, replace=False)]


def request_for(adult: Adult, x: np.ndarray, norm: str) -> dict[str, Any]:
    """Age and sex fixed, work class fixed (its whole group), education only up, capital
    loss only down, capital gain at most 5000, hours within +-10 of today's, and per-group
    switching costs (a change of marital status is dear, of occupation cheap)."""
    hours = x[adult.col("HoursPerWeek")]
    return {
        "instance": dict(zip(adult.names, [adult_value(adult, j, v) for j, v in enumerate(x)],
                             strict=True)),
        "target": TARGET,
        "norm": norm,
        "immutable": ["Age", "Sex", *[adult.names[j] for j in adult.groups["WorkClass"]]],
        "direction": {"EducationNumber": "increase", "CapitalLoss": "decrease"},
        "bounds": {"HoursPerWeek": [hours - 10, hours + 10], "CapitalGain": [None, 5000.0]},
        "group_costs": GROUP_COSTS,
    }


def adult_value(adult: Adult, j: int, v: float) -> float | int:
    return int(v) if adult.integral[j] else float(v)


def adult_box(adult: Adult, x: np.ndarray, req: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    return constraint_box(adult.names, adult.lower, adult.upper, x, req)


def costs(adult: Adult, x: np.ndarray, Z: np.ndarray, norm: str) -> np.ndarray:
    """Distance from x to every row of Z with the spec's default weights (1 / range) and the
    request's group costs; l0 as changes + l1 / (1 + l1), ordered like (changes, l1)."""
    Z = np.atleast_2d(Z)
    in_group = np.zeros(len(adult.names), dtype=bool)
    terms = []
    changes = np.zeros(len(Z), dtype=np.int64)
    for g, js in adult.groups.items():
        in_group[js] = True
        switched = np.any(Z[:, js] != x[js], axis=1)
        terms.append(np.where(switched, GROUP_COSTS.get(g, 1.0), 0.0))
        changes += switched
    plain = ~in_group
    w = 1.0 / (adult.upper - adult.lower)
    delta = (np.abs(Z - x) * w)[:, plain]
    t = np.column_stack([delta, *terms])
    changes += np.count_nonzero(Z[:, plain] != x[plain], axis=1)
    if norm == "l0":
        l1 = t.sum(axis=1)
        return changes + l1 / (1 + l1)
    return {"l1": t.sum(axis=1), "l2": np.sqrt((t**2).sum(axis=1)), "linf": t.max(axis=1)}[norm]


def check_answer(adult: Adult, x: np.ndarray, req: dict[str, Any], ans: dict[str, Any]) -> np.ndarray:
    """One counterfactual (the best or an alternative): valid, legal, constrained, honest."""
    cf_json = ans["counterfactual"]
    cf = adult.vec(cf_json)
    # valid: the uploaded model itself gives the target
    assert adult.predict(cf)[0] == TARGET
    # legal values: integers as JSON integers inside their range, one category per group
    for j, n in enumerate(adult.names):
        assert adult.lower[j] <= cf[j] <= adult.upper[j], n
        if adult.integral[j]:
            assert type(cf_json[n]) is int, (n, cf_json[n])
    for g, js in adult.groups.items():
        assert np.isin(cf[js], (0, 1)).all() and cf[js].sum() == 1, f"group {g}: {cf[js]}"
    # constraints
    cmin, cmax = adult_box(adult, x, req)
    bad = [adult.names[j] for j in np.flatnonzero((cf < cmin) | (cf > cmax))]
    assert not bad, f"constraints broken on {bad}"
    for n in req.get("immutable", []):
        assert cf[adult.col(n)] == x[adult.col(n)], n
    # changes list exactly the changed features, with their old and new values
    changed = {n for j, n in enumerate(adult.names) if cf[j] != x[j]}
    assert set(ans["changes"]) == changed
    for n, ch in ans["changes"].items():
        assert ch["from"] == x[adult.col(n)] and ch["to"] == cf_json[n]
    # the region holds the answer and stays inside the constraints
    for j, n in enumerate(adult.names):
        iv = ans["region"][n]
        lo = -np.inf if iv["lower"] is None else iv["lower"]
        hi = np.inf if iv["upper"] is None else iv["upper"]
        assert (cf[j] >= lo if iv["lower_closed"] else cf[j] > lo), n
        assert (cf[j] <= hi if iv["upper_closed"] else cf[j] < hi), n
        assert lo >= cmin[j] and hi <= cmax[j], (n, iv, cmin[j], cmax[j])
    # distances: the answer's own distance, computed here
    norm = req.get("norm", "l1")
    mine = float(costs(adult, x, cf, norm)[0])
    if norm == "l0":
        assert ans["distance"] == ans["counterfactual_distance"] == int(mine) == len(changed) - sum(
            max(0, int(np.sum(cf[js] != x[js])) - 1) for js in adult.groups.values())
    else:
        assert ans["counterfactual_distance"] == pytest.approx(mine, rel=1e-9, abs=1e-12)
        assert ans["distance"] == pytest.approx(mine, rel=1e-5, abs=1e-6)
    return cf


def no_closer_row(adult: Adult, x: np.ndarray, req: dict[str, Any], distance: float) -> None:
    """Optimality on real data: no Adult row that satisfies the constraints and gets the
    target decision is closer than the certified distance."""
    cmin, cmax = adult_box(adult, x, req)
    ok = np.all((adult.X >= cmin) & (adult.X <= cmax), axis=1) & (adult.labels == TARGET)
    if not ok.any():
        return
    # (l0: a row's key is changes + l1 / (1 + l1) >= its changes >= the certified changes)
    d = costs(adult, x, adult.X[ok], req["norm"])
    assert d.min() >= distance - 1e-9


@pytest.mark.parametrize("norm", NORMS)
def test_constrained_recourse_on_adult(adult: Adult, adult_service: tuple[Service, str],
                                       norm: str) -> None:
    n_feasible = n_switched = 0
    for x in queries(adult, 8, seed=1):
        req = request_for(adult, x, norm)
        res = ask(adult_service, req)
        assert res["prediction"] == adult.predict(x)[0] == "<=50K"
        if not res["feasible"]:
            assert isinstance(res["reason"], str) and res["reason"]
            assert res["counterfactual"] is None and res["changes"] is None
            continue
        n_feasible += 1
        assert res["target"] == TARGET and res["reason"] is None and res["optimal"] is True
        cf = check_answer(adult, x, req, res)
        no_closer_row(adult, x, req, res["distance"])
        n_switched += any(not np.array_equal(cf[js], x[js]) for js in adult.groups.values())
    assert n_feasible >= 6, "most of these people should have some recourse"
    assert n_switched >= 1, "the queries should exercise category switches"


def test_alternatives_are_valid_sorted_and_distinct(adult: Adult,
                                                    adult_service: tuple[Service, str]) -> None:
    for x in queries(adult, 4, seed=2):
        req = {**request_for(adult, x, "l1"), "k": 3}
        res = ask(adult_service, req)
        if not res["feasible"]:
            continue
        answers = [res, *res["alternatives"]]
        assert 1 <= len(answers) <= 3
        d = [a["distance"] for a in answers]
        assert d == sorted(d)
        regions = {tuple(sorted((n, iv["lower"], iv["upper"]) for n, iv in a["region"].items()))
                   for a in answers}
        assert len(regions) == len(answers)
        for a in answers:
            check_answer(adult, x, req, a)


def test_group_costs_steer_category_switches(adult: Adult, adult_service: tuple[Service, str]) -> None:
    """A category switch costs its group's cost: priced out, no group switches when a
    cheaper answer exists; free, a switch never adds to the distance."""
    for x in queries(adult, 5, seed=3):
        base = {"instance": x.tolist(), "target": TARGET, "norm": "l1"}
        dear = ask(adult_service, {**base, "group_costs": {g: 1e6 for g in adult.groups}})
        if dear["feasible"] and dear["distance"] < 1e6:
            cf = adult.vec(dear["counterfactual"])
            for g, js in adult.groups.items():
                assert np.array_equal(cf[js], x[js]), f"{g} switched at cost 1e6"
        free = ask(adult_service, {**base, "group_costs": {g: 0.0 for g in adult.groups}})
        assert free["feasible"]
        cf = adult.vec(free["counterfactual"])
        in_group = np.zeros(len(x), dtype=bool)
        for js in adult.groups.values():
            in_group[js] = True
        w = 1.0 / (adult.upper - adult.lower)
        plain_cost = float(np.sum(w[~in_group] * np.abs(cf - x)[~in_group]))
        assert free["counterfactual_distance"] == pytest.approx(plain_cost, rel=1e-9, abs=1e-12)
        if dear["feasible"]:
            assert free["distance"] <= dear["distance"]
        assert adult.predict(cf)[0] == TARGET


def test_infeasible_requests_answer_200_with_a_reason(adult: Adult,
                                                      adult_service: tuple[Service, str]) -> None:
    x = queries(adult, 1, seed=4)[0]
    everything = ask(adult_service, {"instance": x.tolist(), "target": TARGET,
                                     "immutable": adult.names})
    edu = x[adult.col("EducationNumber")]
    # education may only rise, yet must end below today's level: no legal value at all
    contradictory = ask(adult_service, {"instance": x.tolist(), "target": TARGET, "norm": "l2",
                                        "direction": {"EducationNumber": "increase"},
                                        "bounds": {"EducationNumber": [None, edu - 0.5]}})
    for res in (everything, contradictory):
        assert res["feasible"] is False
        assert isinstance(res["reason"], str) and res["reason"].strip()
        assert res["prediction"] == "<=50K"
        assert res["counterfactual"] is None and res["changes"] is None and res["region"] is None
        assert res["distance"] is None


def test_instance_outside_its_one_hot_group_is_refused(adult: Adult,
                                                       adult_service: tuple[Service, str]) -> None:
    svc, model_id = adult_service
    x = queries(adult, 1, seed=5)[0].copy()
    js = adult.groups["Occupation"]
    x[js] = 0.0
    x[js[:2]] = 1.0  # two occupations at once
    r = svc.client.post(f"/v1/models/{model_id}/counterfactuals",
                        json={"instance": x.tolist(), "target": TARGET})
    assert r.status_code == 422
    assert "Occupation" in r.json()["message"]


def test_reason_names_the_target_as_the_client_does(adult: Adult,
                                                    adult_service: tuple[Service, str]) -> None:
    """The service speaks in the spec's class names (">50K"); so should the reason."""
    x = queries(adult, 1, seed=4)[0]
    res = ask(adult_service, {"instance": x.tolist(), "target": TARGET, "immutable": adult.names})
    assert res["feasible"] is False
    assert TARGET in res["reason"], res["reason"]


def test_batch_applies_the_constraints_to_every_instance(adult: Adult,
                                                         adult_service: tuple[Service, str]) -> None:
    X = queries(adult, 6, seed=6)
    req = request_for(adult, X[0], "l1")
    del req["instance"], req["bounds"]  # bounds above are per person
    batch = ask(adult_service, {**req, "instances": X.tolist()})["results"]
    assert len(batch) == len(X)
    for x, res in zip(X, batch, strict=True):
        single = ask(adult_service, {**req, "instance": x.tolist()})
        assert res == {**single, "stats": res["stats"]}
        if res["feasible"]:
            check_answer(adult, x, req, res)
            no_closer_row(adult, x, req, res["distance"])


@pytest.mark.parametrize("body, field", [
    ({"group_costs": {"Occupation": -1}}, "group_costs.Occupation"),
    ({"norm": "l3"}, "norm"),
    ({"bounds": {"Age": [50, 40]}}, "bounds.Age"),
    ({"direction": {"EducationNumber": "up"}}, "direction.EducationNumber"),
])
def test_bad_recourse_options_are_refused(adult: Adult, adult_service: tuple[Service, str],
                                          body: dict[str, Any], field: str) -> None:
    svc, model_id = adult_service
    x = queries(adult, 1, seed=7)[0]
    r = svc.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": x.tolist(), **body})
    assert r.status_code == 422
    assert r.json()["field"] == field
