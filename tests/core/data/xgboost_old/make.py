"""Regenerate the old-XGBoost fixtures of tests/core/test_old_library_files.py.

Run once per XGBoost version, in a virtual environment holding that version (they need
Pythons 3.8-3.10; not run by CI):

    python make.py 1.3.3   # a pickled wrapper that later versions cannot unpickle
    python make.py 1.4.2   # early stopping with num_parallel_tree > 1
    python make.py 1.5.2   # forests, wrapper metadata (missing, classes_)
    python make.py 1.6.2   # categorical splits (NaN split conditions, the 1.6 rule)
    python make.py 1.7.6   # categorical splits (NaN split conditions)

Each fixture is ``<version>_<name>.json`` (the model as ``save_model`` wrote it) and
``<version>_<name>.npz``: ``X``, points at, and one float32 ulp either side of, every split
threshold plus random and out-of-range ones, and ``pred``, the class *index* the fitted
model itself predicted there (the model as trained, before any save and load).
"""
import json
import sys

import numpy as np
import xgboost as xgb

version = sys.argv[1]
assert xgb.__version__ == version, xgb.__version__
rng = np.random.default_rng(0)


def points(booster, n_features, cat=None, n=600):
    """Sample points: each threshold and its float32 neighbours, random and far values."""
    X = rng.normal(0, 2, size=(n, n_features))
    dump = [json.loads(t) for t in booster.get_dump(dump_format="json")]
    thr = []

    def walk(node):
        if "split" in node and np.ndim(node.get("split_condition", [])) == 0:
            f = node["split"]
            names = booster.feature_names or []
            j = names.index(f) if f in names else int(str(f).lstrip("f"))
            thr.append((j, np.float32(node["split_condition"])))
        for child in node.get("children", []):
            walk(child)
    for t in dump:
        walk(t)
    rows = []
    for j, t in thr[:200]:
        for v in (np.nextafter(t, np.float32(-np.inf)), t, np.nextafter(t, np.float32(np.inf))):
            r = X[rng.integers(n)].copy()
            r[j] = float(v)
            rows.append(r)
    X = np.vstack([X, np.array(rows)]) if rows else X
    if cat is not None:  # codes, negatives, halves and codes past every set
        X[:, cat] = rng.choice([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0,
                                31.0, 32.0, 40.0, 64.0, 100.0], size=X.shape[0])
    return X


def save(name, model, X):
    base = f"{version}_{name}"
    model.save_model(base + ".json")
    labels = list(model.classes_)
    pred = np.array([labels.index(v) for v in model.predict(X)])
    np.savez_compressed(base + ".npz", X=X, pred=pred)


X = rng.normal(0, 2, size=(400, 4))
y2 = (X[:, 0] + X[:, 1] ** 2 > 1).astype(int)
y3 = np.digitize(X[:, 0] + 0.5 * X[:, 2], [-1, 1])

if version.startswith("1.3"):
    import joblib
    m = xgb.XGBClassifier(n_estimators=2, max_depth=2, use_label_encoder=False,
                          eval_metric="logloss", random_state=0).fit(X, y2)
    joblib.dump(m, f"{version}_wrapper.joblib")
if version.startswith("1.4"):
    m = xgb.XGBClassifier(n_estimators=40, max_depth=3, num_parallel_tree=3, subsample=0.7,
                          use_label_encoder=False, eval_metric="logloss", random_state=0)
    m.fit(X[:300], y2[:300], eval_set=[(X[300:], y2[300:])], early_stopping_rounds=3, verbose=False)
    save("parallel3_early_stopped", m, points(m.get_booster(), 4))
if version.startswith("1.5"):
    m = xgb.XGBRFClassifier(n_estimators=4, max_depth=3, use_label_encoder=False,
                            eval_metric="logloss", random_state=0).fit(X, y2)
    save("rf_binary", m, points(m.get_booster(), 4))
    m = xgb.XGBClassifier(n_estimators=5, max_depth=3, num_parallel_tree=2, subsample=0.7,
                          use_label_encoder=False, eval_metric="mlogloss", random_state=0).fit(X, y3)
    save("parallel2_multiclass", m, points(m.get_booster(), 4))
    m = xgb.XGBClassifier(n_estimators=5, max_depth=3, missing=0.0, use_label_encoder=False,
                          eval_metric="logloss", random_state=0).fit(X, y2)
    save("missing0", m, points(m.get_booster(), 4))
    m = xgb.XGBClassifier(n_estimators=5, max_depth=3, use_label_encoder=True,
                          eval_metric="mlogloss", random_state=0).fit(X, np.array([3, 7, 11])[y3])
    save("labels_3_7_11", m, points(m.get_booster(), 4))
if version.startswith(("1.6", "1.7")):
    import pandas as pd
    Xc = X.copy()
    Xc[:, 0] = rng.integers(0, 8, size=len(X))
    yc = (np.isin(Xc[:, 0], [1, 4, 7]) ^ (Xc[:, 1] > 0)).astype(int)
    df = pd.DataFrame(Xc, columns=list("abcd")).astype({"a": "category"})
    m = xgb.XGBClassifier(n_estimators=6, max_depth=3, tree_method="hist", enable_categorical=True,
                          use_label_encoder=False, eval_metric="logloss", random_state=0,
                          max_cat_to_onehot=1).fit(df, yc)
    P = points(m.get_booster(), 4, cat=0)
    # the fitted model on raw codes (a category column would map values to codes itself)
    booster = m.get_booster()
    proba = booster.predict(xgb.DMatrix(P, feature_names=list("abcd"),
                                        feature_types=["c", "q", "q", "q"], enable_categorical=True))
    pred = (proba > 0.5).astype(int)
    base = f"{version}_categorical"
    m.save_model(base + ".json")
    np.savez_compressed(base + ".npz", X=P, pred=pred)
print("done", version)
