import numpy as np
import pytest
from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from maps_core import UnsupportedModelError, flatten_model
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
        ("a string", "unsupported model type"),
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
