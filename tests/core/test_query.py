"""Optimality against brute force, KD-tree against a linear scan, validity, options."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.tree import DecisionTreeClassifier

from maps_core import CounterfactualMaps, InvalidQueryError
from maps_core.options import categories, make_options
from maps_core.query import linear_scan, locate_rect, search
from tests.brute_force import brute_force
from tests.conftest import MODEL_FACTORIES, fit

NORMS = ["l1", "l2", "linf"]


@pytest.fixture(scope="module", params=[(k, c) for k in sorted(MODEL_FACTORIES) for c in (2, 3)],
                ids=lambda p: f"{p[0]}-{p[1]}cls")
def suite(request):
    kind, n_classes = request.param
    model, X, _ = fit(kind, n_classes, n_features=4, seed=7)
    return model, X, CounterfactualMaps.build(model)


@pytest.mark.parametrize("norm", NORMS)
def test_distance_equals_brute_force(suite, norm):
    model, X, maps = suite
    rng = np.random.default_rng(11)
    for i in rng.choice(len(X), 6, replace=False):
        x = X[i]
        w = rng.uniform(0.2, 2.0, size=x.shape[0])
        for t in range(len(maps.classes)):
            res = maps.counterfactual(x, maps.classes[t], norm=norm, weights=w)
            want = brute_force(model, x, t, w, norm)
            if not np.isfinite(want):
                assert not res.feasible
                continue
            assert res.best is not None
            assert abs(res.best.distance - want) <= 1e-9, (t, res.best.distance, want)


@pytest.mark.parametrize("norm", NORMS)
def test_kdtree_equals_linear_scan_and_answers_are_valid(suite, norm):
    model, X, maps = suite
    rng = np.random.default_rng(5)
    Q = np.vstack([X[rng.choice(len(X), 30, replace=False)], rng.normal(scale=2, size=(20, 4))])
    opts = make_options(maps.engine, norm=norm)
    for res in maps.counterfactuals(Q, norm=norm):
        assert res.feasible
        cf = res.best
        t = maps.target_index(cf.target)
        d_scan, _ = linear_scan(maps.engine, res.query, t, opts)
        assert cf.distance == pytest.approx(d_scan, abs=1e-12)
        assert res.prediction != cf.target
        assert model.predict(cf.x[None])[0] == cf.target
        assert cf.region.contains(cf.x)
        assert cf.counterfactual_distance == pytest.approx(cf.distance, rel=1e-5, abs=1e-6)
        # omitted target = nearest other class: no other class is closer
        for other in range(len(maps.classes)):
            if maps.classes[other] != res.prediction:
                d_o, _ = linear_scan(maps.engine, res.query, other, opts)
                assert cf.distance <= d_o + 1e-12


def test_target_equal_to_prediction_returns_x_and_its_region(suite):
    model, X, maps = suite
    x = X[0]
    pred = model.predict(x[None])[0]
    res = maps.counterfactual(x, pred)
    assert res.best.distance == 0.0 and np.array_equal(res.best.x, x)
    assert res.best.region.contains(x)
    corners = np.where(res.best.region.upper_closed, res.best.region.upper, np.nan)
    probe = np.where(np.isfinite(corners), corners, x)
    assert model.predict(probe[None])[0] == pred


def test_k_best_are_distinct_and_sorted(suite):
    model, X, maps = suite
    res = maps.counterfactual(X[1], k=5, norm="l2")
    d = [c.distance for c in res.counterfactuals]
    assert d == sorted(d) and len(d) >= 2
    boxes = {(tuple(c.region.lower), tuple(c.region.upper)) for c in res.counterfactuals}
    assert len(boxes) == len(d)
    for c in res.counterfactuals:
        assert model.predict(c.x[None])[0] == c.target


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"norm": "l3"}, "norm"),
        ({"target": "nope"}, "target"),
        ({"weights": {"zz": 1.0}}, "weights.zz"),
        ({"weights": {"x0": -1.0}}, "weights"),
        ({"weights": [1.0, 2.0]}, "weights"),
        ({"weights": [1.0, np.inf, 1.0, 1.0]}, "weights"),
        ({"weights": {"x0": np.nan}}, "weights"),
        ({"weights": [1.0, 1.0, 1.0, -1.0]}, "weights"),
        ({"immutable": "x0"}, "immutable"),
        ({"immutable": ["x0", "zz"]}, "immutable.zz"),
        ({"direction": ["x0"]}, "direction"),
        ({"direction": {"x1": "up"}}, "direction.x1"),
        ({"direction": {"zz": "increase"}}, "direction.zz"),
        ({"bounds": {"x2": [1.0]}}, "bounds.x2"),
        ({"bounds": {"x2": [2.0, 1.0]}}, "bounds.x2"),
        ({"bounds": {"x2": [None, "a"]}}, "bounds.x2"),
        # taken for numbers before, where weights refuse them
        ({"bounds": {"x2": ["0.5", None]}}, "bounds.x2"),
        ({"bounds": {"x2": [False, True]}}, "bounds.x2"),
        ({"bounds": {"x2": {0.0, 1.0}}}, "bounds.x2"),
        ({"bounds": {"x2": "01"}}, "bounds.x2"),
        ({"bounds": {"zz": [0.0, 1.0]}}, "bounds.zz"),
        ({"group_costs": {"g": 1.0}}, "group_costs.g"),
        ({"group_costs": [1.0]}, "group_costs"),
        ({"k": 0}, "k"),
        ({"k": True}, "k"),
        ({"weights": {"x0": "a"}}, "weights.x0"),
        ({"weights": {"x1": [1.0, 2.0]}}, "weights.x1"),
        ({"weights": {"x1": True}}, "weights.x1"),
        ({"weights": [1.0, "a", 1.0, 1.0]}, "weights"),
        ({"weights": [[1.0], [1.0], [1.0], [1.0]]}, "weights"),
        # past float64's range, unhashable, or no label at all: named, never a bare error
        ({"weights": [1.0, 10**400, 1.0, 1.0]}, "weights"),
        ({"weights": {"x1": 10**400}}, "weights.x1"),
        ({"bounds": {"x2": [10**400, None]}}, "bounds.x2"),
        ({"norm": ["l1"]}, "norm"),
        ({"direction": {"x1": ["increase"]}}, "direction.x1"),
        ({"target": np.array([0, 1])}, "target"),
        ({"target": [0]}, "target"),
        # bounds wholly past float32's range: no value these scikit-learn models read
        ({"bounds": {"x2": [3.5e38, None]}}, "bounds.x2"),
        ({"bounds": {"x0": [None, -1e39]}}, "bounds.x0"),
    ],
)
def test_bad_options_name_the_field(suite, kwargs, field):
    _, X, maps = suite
    kwargs = dict(kwargs)
    target = kwargs.pop("target", None)
    with pytest.raises(InvalidQueryError) as err:
        maps.counterfactual(X[0], target, **kwargs)
    assert err.value.field == field


@pytest.mark.parametrize(
    "x, field",
    [([np.nan, 0, 0, 0], "x0"), ([0, np.inf, 0, 0], "x1"), ([0, 0, 0], "instance"),
     (["a", 0, 0, 0], "instance"), (np.array([1j, 0, 0, 0]), "instance"),
     # beyond the float32 range these scikit-learn models read (their predict refuses it)
     ([0, 0, -3.5e38, 0], "x2"), ([0, 2.0**128 - 2.0**103, 0, 0], "x1"),
     ([0, 10**400, 0, 0], "instance")],
)
def test_bad_inputs_are_refused(suite, x, field):
    _, _, maps = suite
    with pytest.raises(InvalidQueryError) as err:
        maps.counterfactual(x)
    assert err.value.field == field


def test_bounds_reaching_float32s_largest_value_are_answered_validly(suite):
    """A bound that ends within float32's range (or straddles its end) leaves values the
    model reads: the answer is one of them, and scikit-learn itself predicts the target."""
    model, X, maps = suite
    answered = 0
    for x, bounds in itertools.product(X[:4], ({"x1": [3.4e38, None]}, {"x1": [3.0e38, 1e39]},
                                               {"x1": [-1e39, -3.0e38]})):
        res = maps.counterfactual(x, bounds=bounds)
        if res.feasible:
            answered += 1
            assert abs(res.best.x[1]) <= np.finfo(np.float32).max
            assert model.predict(res.best.x[None])[0] == res.best.target
    assert answered  # the other class lies out there for some of these rows


def test_a_huge_max_seconds_is_no_limit(suite):
    _, X, maps = suite
    assert maps.counterfactual(X[0], max_seconds=10**400).feasible


def test_the_largest_float32_input_is_answered_validly(suite):
    # the least float64 that scikit-learn's float32 cast does not send to infinity
    model, X, maps = suite
    x = X[0].copy()
    x[1] = np.nextafter(2.0**128 - 2.0**103, 0.0)
    res = maps.counterfactual(x)
    assert model.predict(res.best.x[None])[0] == res.best.target


def test_default_options_are_shared_and_custom_ones_leave_them_alone(suite):
    _, X, maps = suite
    base = make_options(maps.engine, norm="l2")
    assert make_options(maps.engine, norm="l2") is base  # built once per maps, norm and k
    assert make_options(maps.engine, norm="l2", k=2) is not base
    before = {f: getattr(base, f).copy() for f in ("weights", "lower", "upper", "immutable")}
    heavy = maps.counterfactual(X[0], norm="l2", weights=7.0 * base.weights)
    plain = maps.counterfactual(X[0], norm="l2")
    for f, v in before.items():
        assert np.array_equal(getattr(base, f), v)
    assert heavy.best.distance == pytest.approx(7.0 * plain.best.distance)


@pytest.mark.parametrize("budget", ["complete", "mixed"])
@pytest.mark.parametrize("norm", NORMS + ["l0"])
def test_a_batch_answers_every_row_as_a_query_of_its_own(norm, budget):
    # Batches with k = 1 run in one compiled call (query._batch); each row must get what
    # the per-row path (query.search) gives it: the same answer, region, point and
    # counters, through every branch (answered in the kernel; x itself when the target is
    # its class; no answer under the constraints; maps with mixed regions).
    model, X, _ = fit("rf", 3, n_features=4, seed=3)
    maps = CounterfactualMaps.build(model, **({"max_seconds": 0.0} if budget == "mixed" else {}))
    assert maps.engine.has_mixed == (budget == "mixed")
    rng = np.random.default_rng(2)
    Q = np.vstack([X[:25], rng.normal(scale=2, size=(15, 4))])
    names = maps.feature_names
    cases = [
        (None, {}),
        (maps.classes[1], {}),  # rows of class 1 are answered by themselves
        (maps.classes[2], {"immutable": names[:3], "bounds": {names[3]: [0.0, 0.1]}}),
    ]
    engine = maps.engine
    rids = locate_rect(engine, Q)
    for target, constraints in cases:
        got = maps.counterfactuals(Q, target, norm=norm, **constraints)
        opts = make_options(engine, norm=norm, **constraints)
        t_idx = None if target is None else maps.target_index(target)
        cats = categories(opts, Q)
        for i, res in enumerate(got):
            want = search(engine, Q[i], t_idx, opts, int(rids[i]), cats[i])
            assert maps.target_index(res.prediction) == want.prediction
            assert res.stats.nodes_popped == want.nodes_popped
            assert res.stats.regions_refined == want.regions_refined
            assert res.stats.peak_boxes == want.peak_boxes
            assert res.stats.seconds > 0
            assert res.unreachable == tuple(maps.classes[j] for j in want.unreachable)
            assert len(res.counterfactuals) == len(want.found)
            for cf, f in zip(res.counterfactuals, want.found, strict=True):
                assert cf.distance == f.distance
                assert cf.counterfactual_distance == f.counterfactual_distance
                assert maps.target_index(cf.target) == f.target
                np.testing.assert_array_equal(cf.x, f.x)
                for a, b in ((cf.region.lower, f.lower), (cf.region.upper, f.upper),
                             (cf.region.lower_closed, f.lower_closed),
                             (cf.region.upper_closed, f.upper_closed)):
                    np.testing.assert_array_equal(a, b)
        if target == maps.classes[1]:  # both kinds of row are in this batch
            assert {r.best.distance == 0 for r in got} == {True, False}
    assert any(not r.feasible for r in got)  # the constrained case reached "no answer"
    if budget == "mixed":
        assert any(r.stats.regions_refined > 0 for r in maps.counterfactuals(Q, norm=norm))


@pytest.mark.parametrize("on_budget", ["error", "best"])
def test_a_time_limit_stops_no_batch_on_complete_maps(on_budget):
    # A single query on complete maps runs the KD descent, which always ends, without a
    # time limit; the compiled batch applied it, and its rows stopped "out of time" (or
    # answered optimal=False with a lower bound of 0) where alone they answer.
    model, X, _ = fit("rf", 3, n_features=4, seed=3)
    maps = CounterfactualMaps.build(model)
    assert not maps.engine.has_mixed
    alone = [maps.counterfactual(x, max_seconds=1e-9) for x in X[:30]]
    got = maps.counterfactuals(X[:30], max_seconds=1e-9, on_budget=on_budget)
    assert all(r.optimal for r in got) and all(r.optimal for r in alone)
    assert [r.best.distance for r in got] == [r.best.distance for r in alone]
    assert [r.lower_bound for r in got] == [r.best.distance for r in got]


@pytest.mark.parametrize("budget", [{}, {"max_seconds": 0.0}], ids=["complete", "mixed"])
@pytest.mark.parametrize("norm", ["l1", "l2", "linf", "l0"])
def test_unbounded_integer_features_get_exact_distances(norm, budget):
    """Integer features without bounds: a region that runs to +-inf along one, or a value
    beyond int64, is rounded to integers without overflowing (numba's math.ceil(-inf) is
    an int64, and made the distance about 9.2e18). Brute force over the integer grid,
    labelled by the model."""
    from sklearn.ensemble import RandomForestClassifier

    from maps_core import Feature, FeatureSchema

    rng = np.random.default_rng(3)
    X = rng.integers(0, 11, size=(300, 2)).astype(np.float64)
    y = ((X[:, 0] > 4) ^ (X[:, 1] > 6)).astype(int)
    model = RandomForestClassifier(6, max_depth=3, random_state=0).fit(X, y)
    schema = FeatureSchema((Feature("a", "integer"), Feature("b", "integer")))
    maps = CounterfactualMaps.build(model, schema, **budget)
    assert maps.engine.has_mixed == bool(budget)  # no time: the domain is one mixed region
    w = np.array([1.0, 0.7])
    # the last: beyond int64 (math.floor overflowed there too)
    for x in [np.array([2.0, 3.0]), np.array([-40.0, 9.0]), np.array([7.0, 60.0]),
              np.array([3e20, 2.0])]:
        # labels are constant beyond the thresholds (all within 0..10): the integers from
        # -1 to 11, plus x's own, hold a nearest point of every class
        axes = [np.union1d(np.arange(-1.0, 12.0), [v]) for v in x]
        Z = np.array(np.meshgrid(*axes)).reshape(2, -1).T
        labels = model.predict(Z)
        delta = np.abs(Z - x) * w
        res = maps.counterfactual(x, 1 - model.predict(x[None])[0], norm=norm, weights=w)
        want_pts = labels != model.predict(x[None])[0]
        if norm == "l0":
            want = (delta[want_pts] > 0).sum(axis=1).min()
            assert int(res.best.distance) == want
        else:
            d = {"l1": delta.sum(axis=1), "l2": np.sqrt((delta**2).sum(axis=1)),
                 "linf": delta.max(axis=1)}[norm]
            assert res.best.distance == pytest.approx(d[want_pts].min(), rel=1e-12)
        assert model.predict(res.best.x[None])[0] == res.best.target
        assert np.all(res.best.x == np.round(res.best.x))


@pytest.mark.parametrize("w", [1.0, 1e15, 1e16, 1e300])
def test_l0_counts_changes_exactly_whatever_the_weights(w):
    """The l0 key folds the weighted l1 into a fraction below 1; with 2 or more changes
    and an l1 of about 4.5e15 or more the sum rounded up to the next count."""
    from sklearn.tree import DecisionTreeClassifier

    # every corner of the cube, fitted exactly: class 1 at (1, 1, 0), 2 at (1, 1, 1)
    corners = np.array(list(itertools.product([0.0, 1.0], repeat=3)))
    y = (corners[:, 0] * corners[:, 1] * (1 + corners[:, 2])).astype(int)
    model = DecisionTreeClassifier(random_state=0).fit(corners, y)
    maps = CounterfactualMaps.build(model)
    labels = model.predict(corners)  # every threshold is 0.5: the corners hold every cell
    for target in (1, 2):
        changes = np.count_nonzero(corners[labels == target], axis=1).min()
        assert changes >= 2  # where the rounding struck
        res = maps.counterfactual(np.zeros(3), target, norm="l0", weights=[w, w, w])
        assert res.best.distance == changes
        assert np.count_nonzero(res.best.x) == changes


@pytest.mark.parametrize("budget", [{}, {"max_seconds": 0.0}], ids=["complete", "mixed"])
@pytest.mark.parametrize("norm", NORMS)
def test_single_leaf_trees_count_in_every_search(norm, budget):
    """Trees that found no split worth making (``min_impurity_decrease``; XGBoost and
    LightGBM make such trees too) add their value everywhere, and with unbalanced classes
    they decide many inputs. The mixed-region search starts a box with the trees that
    split, and used to leave those trees out of the scores: its answers there were points
    the model labels otherwise."""
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier

    X, y = make_classification(n_samples=400, n_features=4, n_informative=1, n_redundant=0,
                               n_clusters_per_class=1, weights=[0.75], flip_y=0.1,
                               random_state=0)
    model = RandomForestClassifier(n_estimators=12, max_depth=3, max_features=1,
                                   min_impurity_decrease=0.03, random_state=0).fit(X, y)
    single = [e.tree_.node_count == 1 for e in model.estimators_]
    assert 0 < sum(single) < len(single)
    maps = CounterfactualMaps.build(model, **budget)
    assert maps.engine.has_mixed == bool(budget)
    # queries where the trees that split alone would decide the other class
    P = np.random.default_rng(0).normal(scale=2, size=(4000, 4))
    split_only = np.mean([e.predict_proba(P) for e, s in zip(model.estimators_, single,
                                                             strict=True) if not s], axis=0)
    flipped = P[split_only.argmax(axis=1) != model.predict(P)]
    assert len(flipped) > 100
    w = np.array([0.5, 1.0, 1.5, 2.0])
    for x in np.vstack([flipped[:6], X[:6]]):
        for t in range(2):
            res = maps.counterfactual(x, maps.classes[t], norm=norm, weights=w)
            want = brute_force(model, x, t, w, norm)
            assert res.best is not None
            assert abs(res.best.distance - want) <= 1e-9 * max(1.0, want)
            assert model.predict(res.best.x[None])[0] == maps.classes[t]


@pytest.mark.parametrize(("labels", "target", "index"), [
    ([False, True], "True", 1),  # the service writes labels as keys: "False", "True"
    ([False, True], True, 1),
    ([False, True], "False", 0),
    ([False, True], "true", 1),  # JSON's spelling, quoted
    ([False, True], "false", 0),
    ([0, 1], "1", 1),
    ([0, 1], 1.0, 1),
    (["a", "b"], "b", 1),
    ([0.0, 1.0], "1", 1),  # a number's text, as a query string carries it
    ([0.0, 1.0], "1.0", 1),
    ([0, 2], "2.0", 1),
    ([0, 2], "2e0", 1),
    ([-1, 1], "-1", 0),
])
def test_a_target_is_its_label_or_the_label_s_text(labels, target, index):
    X = np.random.default_rng(0).random((80, 2))
    y = np.array(labels)[(X[:, 0] > 0.5).astype(int)]
    maps = CounterfactualMaps.build(DecisionTreeClassifier(max_depth=2, random_state=0).fit(X, y))
    assert maps.target_index(target) == index
    res = maps.counterfactual(X[0], target=target)
    assert res.best is not None and res.target == maps.classes[index]


@pytest.mark.parametrize(("labels", "target"), [
    ([0, 1], True),  # a boolean matches only a boolean class
    ([False, True], 1),
    ([False, True], "TRUE"),
    ([False, True], " true"),
    ([0, 1], "true"),
    ([0, 1], "one"),
    ([0.0, 1.0], " 1"),  # float() takes these; a class's text does not look like them
    ([0.0, 1.0], "1_0"),
    ([0.0, 1.0], "nan"),
    ([False, True], "1"),
])
def test_a_target_no_class_matches_is_refused(labels, target):
    X = np.random.default_rng(0).random((80, 2))
    y = np.array(labels)[(X[:, 0] > 0.5).astype(int)]
    maps = CounterfactualMaps.build(DecisionTreeClassifier(max_depth=2, random_state=0).fit(X, y))
    with pytest.raises(InvalidQueryError, match="unknown class"):
        maps.target_index(target)
