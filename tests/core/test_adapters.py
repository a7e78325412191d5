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
