"""Regenerate the old-LightGBM fixture of tests/core/test_old_library_files.py (not run by
CI): ``python make.py`` in a virtual environment holding lightgbm 2.3.1 (Python 3.8).

``2.3.1_wrapper.joblib`` is a fitted ``LGBMClassifier`` with string labels, pickled by
joblib; ``2.3.1_wrapper.npz`` holds ``X`` and ``pred``, the class index the fitted model
predicted there (its ``classes_`` order)."""
import joblib
import lightgbm
import numpy as np

assert lightgbm.__version__ == "2.3.1", lightgbm.__version__
rng = np.random.default_rng(0)
X = rng.normal(0, 2, size=(400, 3))
y = np.array(["no", "yes"])[(X[:, 0] + X[:, 1] > 0.5).astype(int)]
m = lightgbm.LGBMClassifier(n_estimators=5, num_leaves=4, random_state=0).fit(X, y)
joblib.dump(m, "2.3.1_wrapper.joblib")
P = np.vstack([rng.normal(0, 2, size=(300, 3)), X[:100]])
pred = np.array([list(m.classes_).index(v) for v in m.predict(P)])
np.savez_compressed("2.3.1_wrapper.npz", X=P, pred=pred)
print("done", m.classes_)
