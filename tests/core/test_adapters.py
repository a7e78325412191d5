import numpy as np
import pytest
from sklearn.dummy import DummyClassifier
from sklearn.ensemble import (
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
)
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from maps_core import UnsupportedModelError, flatten_model
from tests.brute_force import brute_force
from tests.conftest import MODEL_FACTORIES, fit, synthetic


@pytest.mark.parametrize("kind", sorted(MODEL_FACTORIES))
@pytest.mark.parametrize("n_classes", [2, 3])
def test_flat_predict_matches_model(kind, n_classes):
    model, X, _ = fit(kind, n_classes)
    ens = flatten_model(model)
    rng = np.random.default_rng(1)
    Z = np.vstack([X, rng.normal(scale=3, size=(20000, X.shape[1]))])
    got = np.asarray(ens.classes)[ens.predict_index(Z)]
    assert np.array_equal(got, model.predict(Z))
    assert ens.n_classes == n_classes


def test_gradient_boosting_binary_tie_goes_to_class_one():
    model, _, _ = fit("gb", 2)
    assert flatten_model(model).tie_break == "high"


@pytest.mark.parametrize(
    "obj, words",
    [
        (GradientBoostingRegressor(n_estimators=2).fit(*synthetic()), "unsupported model type"),
        (make_pipeline(StandardScaler(), RandomForestClassifier(2)).fit(*synthetic()), "Pipeline"),
        (RandomForestClassifier(2), "not fitted"),
        ("a string", "unsupported model type 'str'"),
        # a subclass that keeps its parent's name (it may predict otherwise): named with
        # its module, not as the supported class it is not
        (type("RandomForestClassifier", (RandomForestClassifier,), {"__module__": "mine"})(),
         r"unsupported model type 'mine\.RandomForestClassifier'"),
    ],
)
def test_unsupported_models_are_named(obj, words):
    with pytest.raises(UnsupportedModelError, match=words):
        flatten_model(obj)


@pytest.mark.parametrize("damage", ["child_out_of_range", "cycle", "shared_child", "feature", "nan"])
def test_corrupt_tree_arrays_are_refused(damage):
    """The kernels index node arrays without bounds checks: a crafted or corrupted tree
    must be refused by the adapter, not crash or hang later."""
    from sklearn.tree import DecisionTreeClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    model = DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, y)
    t = model.tree_
    inner = np.flatnonzero(t.children_left >= 0)
    i, j = int(inner[0]), int(inner[1])
    if damage == "child_out_of_range":
        t.children_left[j] = t.node_count + 5
    elif damage == "cycle":
        t.children_right[j] = i
    elif damage == "shared_child":
        t.children_right[j] = t.children_left[j]
    elif damage == "feature":
        t.feature[i] = 7
    else:
        t.threshold[i] = np.nan
    with pytest.raises(UnsupportedModelError):
        flatten_model(model)


# -- models fitted on data with missing values ------------------------------------------
def _nan_data(seed: int = 0, n: int = 800):
    """Missingness that carries the label, so the trees split on it (threshold +inf)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = (X[:, 0] > 0).astype(int)
    X[rng.random(n) < 0.3, 1] = np.nan
    y[np.isnan(X[:, 1])] = 1 - y[np.isnan(X[:, 1])]
    return X, y


def _finite_points(rng, n: int = 20_000, m: int = 3):
    """Random finite points, with huge values (beyond float32, up to 1e308) in places."""
    P = rng.normal(scale=2.0, size=(n, m))
    huge = rng.random(P.shape) < 0.1
    P[huge] = rng.choice([1e39, -1e39, 3.5e38, 1e308, -1e308, 1e30], size=int(huge.sum()))
    return P


def _float32_predict(model, P):
    """What the trees decide on float32(P), +-inf where P overflows float32 (scikit-learn's
    own predict refuses such inputs; its trees send +inf left at a +inf threshold)."""
    with np.errstate(over="ignore"):
        P32 = P.astype(np.float32)
    trees = [model] if hasattr(model, "tree_") else model.estimators_
    values = [t.tree_.predict(P32).reshape(len(P), -1) for t in trees]  # (n, K) per tree
    proba = np.mean([v / v.sum(axis=1, keepdims=True) for v in values], axis=0)
    return model.classes_[np.argmax(proba, axis=1)]


@pytest.mark.parametrize("kind", ["tree", "forest"])
def test_trees_fitted_with_missing_values(kind):
    """A split that sends only the missing values right has threshold +inf: every finite
    input goes left, so the node is its left child. Faithful on finite inputs (huge ones
    too), and counterfactuals are valid."""
    from sklearn.tree import DecisionTreeClassifier

    from maps_core import CounterfactualMaps

    X, y = _nan_data()
    model = (DecisionTreeClassifier(max_depth=4, random_state=0) if kind == "tree"
             else RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0)).fit(X, y)
    trees = [model] if kind == "tree" else model.estimators_
    assert any(np.isinf(t.tree_.threshold).any() for t in trees)  # the case under test
    ens = flatten_model(model)
    rng = np.random.default_rng(1)
    P = _finite_points(rng)
    assert np.array_equal(np.asarray(ens.classes)[ens.predict_index(P)], _float32_predict(model, P))
    Q = rng.normal(scale=2.0, size=(20_000, 3))
    maps = CounterfactualMaps.build(model)
    assert np.array_equal(np.asarray(maps.predict(Q)), model.predict(Q))
    for x in Q[:10]:
        for target in (0, 1):
            res = maps.counterfactual(x, target)
            assert model.predict(res.best.x[None])[0] == target
        # the exact optimum (the brute force drops the +inf splits: no side changes there)
        target = 1 - int(model.predict(x[None])[0])
        for norm in ("l1", "l2", "linf"):
            res = maps.counterfactual(x, target, norm=norm, weights=np.ones(3))
            want = brute_force(model, x, target, np.ones(3), norm)
            assert res.best.distance == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("bad", [-np.inf, np.nan])
def test_thresholds_of_minus_inf_or_nan_stay_refused(bad):
    from sklearn.tree import DecisionTreeClassifier

    X, y = _nan_data()
    model = DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, y)
    model.tree_.threshold[0] = bad
    with pytest.raises(UnsupportedModelError, match="threshold of -inf or NaN"):
        flatten_model(model)


@pytest.mark.parametrize("bad", [1e300, -1e300, 3.5e38, -3.5e38])
def test_thresholds_beyond_float32_are_refused(bad):
    """A float32 tree's thresholds lie within float32's range (no training data gives
    another); crafted ones beyond it made empty cells, wrong labels and answers the library
    itself refuses (found by a QA fuzz)."""
    from sklearn.tree import DecisionTreeClassifier

    X, y = _nan_data()
    model = DecisionTreeClassifier(max_depth=3, random_state=0).fit(np.nan_to_num(X), y)
    model.tree_.threshold[0] = bad
    with pytest.raises(UnsupportedModelError, match="beyond float32's range"):
        flatten_model(model)
    model.tree_.threshold[0] = float(np.finfo(np.float32).max)  # the edge itself is fine
    flatten_model(model)


def test_a_claimed_feature_count_beyond_the_limit_is_refused():
    from sklearn.tree import DecisionTreeClassifier

    model = DecisionTreeClassifier(max_depth=2, random_state=0).fit(*synthetic())
    model.n_features_in_ = 10**9
    with pytest.raises(UnsupportedModelError, match="1000000000 features; cfmaps supports 0 to 100,000"):
        flatten_model(model)


@pytest.mark.parametrize("kind", sorted(MODEL_FACTORIES))
@pytest.mark.parametrize("n_classes", [2, 3])
def test_check_flattened_accepts_fitted_models(kind, n_classes):
    from maps_core.adapters import check_flattened

    model, _, _ = fit(kind, n_classes)
    check_flattened(model, flatten_model(model))


@pytest.mark.parametrize("library", ["xgboost", "lightgbm", "hist"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_check_flattened_accepts_native_models(library, n_classes):
    """The libraries' own predict (XGBoost's float32 sums over 200 trees too) agrees with
    the flattened trees wherever the margin is clear: no legitimate upload is refused."""
    from maps_core.adapters import check_flattened
    from tests.library_splits import engine_model

    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 6))
    y = (X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(int) + (n_classes == 3) * (X[:, 3] > 0.5)
    if library == "xgboost":
        xgb = pytest.importorskip("xgboost")
        clf = xgb.XGBClassifier(n_estimators=200, max_depth=4, random_state=0).fit(X, y)
    elif library == "lightgbm":
        lgb = pytest.importorskip("lightgbm")
        clf = lgb.LGBMClassifier(n_estimators=200, num_leaves=15, verbose=-1, random_state=0).fit(X, y)
    else:  # a categorical feature and missing values too
        from sklearn.ensemble import HistGradientBoostingClassifier

        X[:, 5] = rng.integers(0, 7, size=len(X))
        y = y ^ (X[:, 5] % 3 == 0)
        X[rng.random(len(X)) < 0.1, 4] = np.nan
        clf = HistGradientBoostingClassifier(max_iter=100, categorical_features=[5],
                                             random_state=0).fit(X, y)
        X[np.isnan(X)] = 0.0
    parsed = engine_model(clf)
    check_flattened(parsed, flatten_model(parsed))
    check_flattened(clf, flatten_model(clf))  # the library's own object, its own predict


@pytest.mark.parametrize("strategy", ["prior", "most_frequent", "uniform", "constant"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_gradient_boosting_with_a_constant_dummy_init(strategy, n_classes):
    X, y = synthetic(n_classes=n_classes)
    init = DummyClassifier(strategy=strategy, constant=1 if strategy == "constant" else None)
    model = GradientBoostingClassifier(n_estimators=5, max_depth=2, init=init,
                                       random_state=0).fit(X, y)
    ens = flatten_model(model)
    Z = np.random.default_rng(2).normal(scale=3, size=(5000, X.shape[1]))
    assert np.array_equal(np.asarray(ens.classes)[ens.predict_index(Z)], model.predict(Z))


def test_gradient_boosting_with_a_random_dummy_init_is_refused():
    # "stratified" draws the init's scores at random on every call: predict is not a
    # function of x, so no map can be faithful to it
    X, y = synthetic()
    model = GradientBoostingClassifier(
        n_estimators=2, max_depth=1, random_state=0,
        init=DummyClassifier(strategy="stratified", random_state=0)).fit(X, y)
    with pytest.raises(UnsupportedModelError, match="strategy 'stratified'"):
        flatten_model(model)
    model = GradientBoostingClassifier(n_estimators=2, max_depth=1, random_state=0,
                                       init=LogisticRegression()).fit(X, y)
    with pytest.raises(UnsupportedModelError, match="custom init estimator"):
        flatten_model(model)
