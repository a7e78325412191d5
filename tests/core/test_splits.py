"""Split rules: the flat ensemble, the grid and the maps follow the rule an adapter states.

The reference below walks the trees in numpy with the rule's own comparison (no maps_core
code), on points chosen at every threshold and one step of the rule's input type either
side of it, where a wrong rule would send them the other way.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from maps_core import CounterfactualMaps, FeatureSchema, UnsupportedModelError, flatten_model
from maps_core.adapters import ADAPTERS, adapter_for, check_model
from maps_core.grid import Grid
from maps_core.splits import (
    FLOAT32_LE,
    FLOAT32_LT,
    FLOAT32_MAX,
    FLOAT64_LE,
    SPLIT_RULES,
    beyond_view,
    canonical_thresholds,
)
from tests.conftest import fit


def reference_predict(ens, X: np.ndarray) -> np.ndarray:
    """Class index per row by the rule's comparison, trees summed in order."""
    view32 = ens.split_rule.startswith("float32")
    strict = ens.split_rule.endswith("<")
    out = np.empty(X.shape[0], dtype=np.int64)
    for i, x in enumerate(X):
        s = ens.base.astype(np.float64).copy()
        for r in ens.roots:
            node = int(r)
            while ens.node_feature[node] >= 0:
                v = x[ens.node_feature[node]]
                v = float(np.float32(v)) if view32 else float(v)
                t = ens.node_threshold[node]
                node = int(ens.node_left[node] if (v < t if strict else v <= t) else ens.node_right[node])
            s += ens.node_value[node]
        top = 0
        for k in range(1, s.size):
            if s[k] > s[top] or (ens.tie_break == "high" and s[k] == s[top]):
                top = k
        out[i] = top
    return out


def edge_points(ens, rng: np.random.Generator, n_random: int = 400) -> np.ndarray:
    """Random rows whose one feature sits at a threshold, or one float64 / float32 step
    either side of it."""
    m = ens.n_features
    base = rng.normal(scale=2.0, size=(n_random, m))
    rows = [base]
    for f in range(m):
        t = ens.thresholds(f)
        t32 = t.astype(np.float32)
        vals = np.concatenate([
            t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf),
            t32.astype(np.float64),
            np.nextafter(t32, np.float32(-np.inf)).astype(np.float64),
            np.nextafter(t32, np.float32(np.inf)).astype(np.float64),
        ])
        P = base[rng.integers(0, n_random, size=vals.size)].copy()
        P[:, f] = vals
        rows.append(P)
    return np.vstack(rows)


@pytest.fixture(scope="module", params=["rf", "gb"])
def sklearn_ensemble(request):
    model, X, _ = fit(request.param, n_classes=2, n_features=3, seed=3)
    return flatten_model(model)


@pytest.mark.parametrize("rule", sorted(SPLIT_RULES))
def test_flat_ensemble_follows_its_rule(sklearn_ensemble, rule):
    ens = replace(sklearn_ensemble, split_rule=rule)
    P = edge_points(ens, np.random.default_rng(0))
    assert np.array_equal(ens.predict_index(P), reference_predict(ens, P))


@pytest.mark.parametrize("rule", sorted(SPLIT_RULES))
def test_maps_follow_the_rule(sklearn_ensemble, rule):
    """Complete maps of the same trees under each rule label every edge point as the rule
    does, and their answers are predicted as the target by the rule's reference."""
    ens = replace(sklearn_ensemble, split_rule=rule)
    maps = CounterfactualMaps.build(ens, n_jobs=1)
    assert maps.stats.mixed_regions == 0
    P = edge_points(ens, np.random.default_rng(1), n_random=100)
    assert np.array_equal(maps.predict_index(P), reference_predict(ens, P))
    for x in P[:: max(1, P.shape[0] // 60)]:
        for norm in ("l1", "l2", "linf"):
            res = maps.counterfactual(x, norm=norm)
            got = reference_predict(ens, res.best.x[None, :])[0]
            assert maps.classes[got] == res.target, (rule, norm, x)


def test_the_rules_differ_where_they_should(sklearn_ensemble):
    """At a threshold that is a float32 value, ``<`` and ``<=`` part ways; just above a
    threshold that is not, float32 and float64 views do. (Guards the test above against a
    rule that is ignored everywhere.)"""
    t = np.array([0.5, 0.1])  # 0.5 is a float32 value, 0.1 is not
    assert canonical_thresholds(t, FLOAT32_LE, False)[0] == 0.5
    below = float(np.nextafter(np.float32(0.5), np.float32(0)))
    assert canonical_thresholds(t, FLOAT32_LT, False)[0] == below
    assert canonical_thresholds(t, FLOAT64_LE, False)[1] == 0.1
    assert canonical_thresholds(t, FLOAT32_LE, False)[1] < 0.1  # float32(0.1) > 0.1
    assert list(canonical_thresholds(np.array([1.5, 2.0]), FLOAT32_LT, True)) == [1.0, 1.0]
    assert list(canonical_thresholds(np.array([1.5, 2.0]), FLOAT64_LE, True)) == [1.0, 2.0]
    ens = sklearn_ensemble
    sizes = {r: Grid.from_ensemble(replace(ens, split_rule=r), FeatureSchema.default(3))
             for r in SPLIT_RULES}
    assert {g.view32 for g in sizes.values()} == {True, False}


@pytest.mark.parametrize("rule", [FLOAT32_LE, FLOAT32_LT])
def test_values_a_float32_view_cannot_hold_are_found(rule):
    X = np.zeros((3, 4))
    assert beyond_view(rule, X) is None
    X[2, 3] = FLOAT32_MAX  # the largest float32 itself fits,
    X[0, 1] = -np.nextafter(FLOAT32_MAX, np.inf)  # and so does what rounds to it
    assert beyond_view(rule, X) is None
    half_ulp = 2.0 ** (127 - 24)  # from here on, the float32 cast overflows
    X[2, 1] = FLOAT32_MAX + half_ulp
    X[1, 2] = -1e39
    assert beyond_view(rule, X) == (1, 2)  # the first in row order
    X[1, 2] = np.nextafter(FLOAT32_MAX + half_ulp, 0.0)
    assert beyond_view(rule, X) == (2, 1)
    assert beyond_view(FLOAT64_LE, X) is None  # a float64 view holds every finite value


def test_unknown_rule_is_refused(sklearn_ensemble):
    with pytest.raises(UnsupportedModelError, match="split rule"):
        replace(sklearn_ensemble, split_rule="float16<=")


def test_saved_maps_keep_the_rule(sklearn_ensemble, tmp_path):
    ens = replace(sklearn_ensemble, split_rule=FLOAT64_LE)
    maps = CounterfactualMaps.build(ens, n_jobs=1)
    maps.save(tmp_path / "m")
    back = CounterfactualMaps.load(tmp_path / "m")
    assert back.ensemble.split_rule == FLOAT64_LE and back.grid.view32 is False
    # the rule is part of the decision function, so of the fingerprint
    assert back.fingerprint == maps.fingerprint != sklearn_ensemble.fingerprint()


class _Toy:
    """A model of an imaginary library: one stump on feature 0."""

    classes_ = [0, 1]


class _ToyAdapter:
    name = "toy"
    supported = ("Toy",)
    checked: list[object] = []

    def accepts(self, model):
        return isinstance(model, _Toy)

    def prepare(self, model):
        return model

    def check(self, model):
        self.checked.append(model)

    def flatten(self, model):
        from maps_core import FlatEnsemble

        return FlatEnsemble(
            kind="Toy", n_features=1, classes=[0, 1], feature_names=None,
            node_feature=np.array([0, -1, -1], dtype=np.int32),
            node_threshold=np.array([0.25, 0.0, 0.0]),
            node_left=np.array([1, -1, -1], dtype=np.int32),
            node_right=np.array([2, -1, -1], dtype=np.int32),
            node_value=np.array([[0, 0], [1, 0], [0, 1]], dtype=np.float64),
            roots=np.array([0], dtype=np.int32), base=np.zeros(2), split_rule=FLOAT64_LE,
        )


def test_a_new_library_is_one_registered_adapter(monkeypatch):
    """Registering an adapter is all flatten_model, the structural check and the build
    need; unknown objects are still refused by name."""
    toy = _ToyAdapter()
    monkeypatch.setattr("maps_core.adapters.ADAPTERS", [*ADAPTERS, toy])
    model = _Toy()
    assert adapter_for(model) is toy
    check_model(model)
    assert toy.checked == [model]
    maps = CounterfactualMaps.build(model, n_jobs=1)
    # float64 x <= 0.25: 0.25 itself goes left (class 0), the next float64 right
    assert list(maps.predict([[0.25], [float(np.nextafter(0.25, 1))]])) == [0, 1]
    res = maps.counterfactual([0.0], norm="l1")
    assert res.best.distance == 0.25 and res.best.x[0] > 0.25
    with pytest.raises(UnsupportedModelError, match="supported: .*Toy"):
        flatten_model(object())
