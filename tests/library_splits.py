"""Each model library's splits, read from the library's own objects (no maps_core code),
for the independent brute forces of the tests and of ``scripts/fuzz_mixed.py``.

A split sends x left by one of three rules (README, "Split semantics"):

* ``"float32<="``: scikit-learn's trees, ``float32(x) <= t`` with a float64 ``t``;
* ``"float32<"``: XGBoost, ``float32(x) < t`` with a float32 ``t``;
* ``"float64<="``: LightGBM and HistGradientBoosting, ``x <= t`` in float64.

:func:`split_values` gives, per feature, the *last value sent left* of each split in the
view the rule compares in (a float32 for the first two rules, the float64 threshold for
the third) and the view itself. On the real line, a float32 view changes sides halfway to
the next float32 (owned by the side its own rounding goes to), a float64 view at the value
itself (owned by the left side). On integers, the last integer sent left is the floor of
that value.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def raw_thresholds(model, f: int) -> np.ndarray:
    """Thresholds of feature ``f`` read straight from the sklearn trees (not from maps_core)."""
    ests = getattr(model, "estimators_", None)
    trees = [model] if ests is None else list(np.ravel(ests))
    ts = []
    for est in trees:
        tr = est.tree_
        ts.append(tr.threshold[(tr.children_left >= 0) & (tr.feature == f)])
    return np.unique(np.concatenate(ts)) if ts else np.zeros(0)


def f32_floor(t: np.ndarray) -> np.ndarray:
    """The largest float32 at or below each float64 ``t`` (as float64): the last float32
    that scikit-learn's ``float32(x) <= t`` sends left."""
    f = np.asarray(t, dtype=np.float64).astype(np.float32)
    up = f.astype(np.float64) > t
    f[up] = np.nextafter(f[up], np.float32(-np.inf))
    return f.astype(np.float64)


def f32_real_boundary(s: np.ndarray) -> np.ndarray:
    """Where scikit-learn's split ``float32(x) <= t`` changes sides on the real line, for
    ``s = f32_floor(t)``: halfway to the next float32 (float32 rounds to nearest)."""
    up = np.nextafter(s.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    return (s + up) / 2.0  # 25 significant bits: exact in float64


def _xgboost_thresholds(model: Any, m: int) -> list[np.ndarray]:
    doc = json.loads(bytes(model.get_booster().save_raw("json")))
    per: list[list[float]] = [[] for _ in range(m)]
    for tree in doc["learner"]["gradient_booster"]["model"]["trees"]:
        left = np.asarray(tree["left_children"])
        feat = np.asarray(tree["split_indices"])
        cond = np.asarray(tree["split_conditions"], dtype=np.float64)
        kind = np.asarray(tree.get("split_type") or np.zeros(left.size, dtype=int))
        plain = (left >= 0) & (kind == 0)
        for f, c in zip(feat[plain], cond[plain], strict=True):
            per[int(f)].append(float(c))
        # a categorical split: XGBoost reads float32(x) as the code int(float32(x)) and
        # sends negative values left, so its sides change only at 0 and at each integer up
        # to one past the largest code it names (every such cut, "float32(x) < c"; the
        # brute force's cells may be finer than the model's)
        cats = np.asarray(tree.get("categories", []), dtype=np.int64)
        for nd, a, k in zip(tree.get("categories_nodes", []), tree.get("categories_segments", []),
                            tree.get("categories_sizes", []), strict=True):
            top = int(cats[a:a + k].max()) if k else 0
            per[int(feat[nd])].extend(np.arange(0.0, top + 2.0).tolist())
    return [np.asarray(v, dtype=np.float64) for v in per]


#: LightGBM's kZeroThreshold, 1e-35f, as a float64
_ZERO_BAND = float(np.float32(1e-35))


def _lightgbm_thresholds(model: Any, m: int) -> list[np.ndarray]:
    per: list[list[float]] = [[] for _ in range(m)]

    def walk(node: dict[str, Any], thresholds: list[float]) -> None:
        if "split_feature" not in node:
            return
        f = int(node["split_feature"])
        if node.get("decision_type") == "==":
            # a categorical split: LightGBM reads x as the code int(x) (truncated toward
            # zero; negative codes and NaN go right), so its sides change only at -1 and
            # just below each integer from 1 up to one past the largest code it names.
            # Every such cut: the brute force's cells may be finer than the model's.
            top = max(int(c) for c in str(node["threshold"]).split("||"))
            per[f].append(-1.0)
            per[f].extend(np.nextafter(np.arange(1.0, top + 2.0), -np.inf).tolist())
        else:
            assert node.get("decision_type", "<=") == "<=", node.get("decision_type")
            # the model text's threshold: dump_model() caps them at +-1e300, while
            # LightGBM's predict compares with the real value (a QA helper's model of
            # values near 1e300 got a brute force on the wrong cells)
            t = thresholds[int(node["split_index"])]
            # LightGBM reads an input with |x| <= 1e-35 (as a float32) as 0.0: a
            # threshold within that band changes sides on the real line at its edge
            if -_ZERO_BAND <= t < _ZERO_BAND:
                t = _ZERO_BAND if t >= 0 else float(np.nextafter(-_ZERO_BAND, -np.inf))
            per[f].append(t)
        walk(node["left_child"], thresholds)
        walk(node["right_child"], thresholds)

    text: dict[int, list[float]] = {}  # each tree's thresholds, by split index
    tree_index = -1
    for line in model.booster_.model_to_string().splitlines():
        if line.startswith("Tree="):
            tree_index = int(line.split("=", 1)[1])
        elif line.startswith("threshold="):
            text[tree_index] = [float(v) for v in line.split("=", 1)[1].split()]
    for tree in model.booster_.dump_model()["tree_info"]:
        walk(tree["tree_structure"], text.get(int(tree["tree_index"]), []))
    return [np.asarray(v, dtype=np.float64) for v in per]


def _hist_gb_thresholds(model: Any, m: int) -> list[np.ndarray]:
    per: list[list[np.ndarray]] = [[] for _ in range(m)]
    is_cat = getattr(model, "is_categorical_", None)
    if is_cat is None or not np.any(is_cat):
        column = np.arange(m)
    else:
        # categorical features: the trees read the columns reordered (categorical ones
        # first) and each categorical value as its position among the known categories
        # (anything else is missing); the sides change just below and at each category
        is_cat = np.asarray(is_cat, dtype=bool)
        column = np.concatenate([np.flatnonzero(is_cat), np.flatnonzero(~is_cat)])
        encoder = model._preprocessor.named_transformers_["encoder"]  # noqa: SLF001
        for j, cats in zip(np.flatnonzero(is_cat), encoder.categories_, strict=True):
            k = np.asarray(cats, dtype=np.float64)
            k = k[~np.isnan(k)]
            per[j].append(np.concatenate([k, np.nextafter(k, -np.inf)]))
    for stage in model._predictors:  # noqa: SLF001 (the fitted trees; no public accessor)
        for predictor in stage:
            nodes = predictor.nodes
            split = (nodes["is_leaf"] == 0) & (nodes["is_categorical"] == 0)
            for f in range(m):
                t = nodes["num_threshold"][split & (nodes["feature_idx"] == f)]
                # +inf: a split that sends only missing values right (learnt from NaN in
                # training) sends every finite input left, so no side changes on the real
                # line (kept, it made a cell whose representative was inf - inf = NaN,
                # which predict sends the missing way: the oracle mislabelled it)
                per[column[f]].append(t[t < np.inf])
    return [np.concatenate(v) if v else np.zeros(0) for v in per]


def _library(model: Any) -> str:
    """``"xgboost"``, ``"lightgbm"``, ``"hist-gb"`` or ``"sklearn"``."""
    module = type(model).__module__
    if module.startswith(("xgboost", "lightgbm")):
        return module.split(".")[0]
    return "hist-gb" if type(model).__name__.startswith("HistGradientBoosting") else "sklearn"


_RULES = {"xgboost": "float32<", "lightgbm": "float64<=", "hist-gb": "float64<=",
          "sklearn": "float32<="}


def split_rule(model: Any) -> str:
    """The library's split rule: ``"float32<="``, ``"float32<"`` or ``"float64<="``."""
    return _RULES[_library(model)]


def split_values(model: Any, m: int) -> tuple[list[np.ndarray], str]:
    """Per feature, the sorted distinct last values sent left by the model's splits (each
    in the rule's view: see the module docstring), and that view (``"float32"`` or
    ``"float64"``)."""
    library = _library(model)
    if library == "xgboost":
        # float32(x) < t: the last float32 sent left is the one below t
        vals = [np.nextafter(t.astype(np.float32), np.float32(-np.inf)).astype(np.float64)
                for t in _xgboost_thresholds(model, m)]
    elif library == "lightgbm":
        vals = _lightgbm_thresholds(model, m)
    elif library == "hist-gb":
        vals = _hist_gb_thresholds(model, m)
    else:
        # a threshold of +inf (a split that sends only missing values right) sends every
        # finite input left: no side changes on the real line
        vals = [f32_floor(t[t < np.inf]) for t in (raw_thresholds(model, f) for f in range(m))]
    view = "float64" if _RULES[library] == "float64<=" else "float32"
    return [np.unique(v) for v in vals], view


def engine_model(model: Any) -> Any:
    """What ``CounterfactualMaps.build`` takes for a fitted model: scikit-learn objects as
    they are; XGBoost and LightGBM models through their saved files, as the service reads
    them."""
    library = _library(model)
    if library == "xgboost":
        from maps_core.adapters.xgboost_json import parse_xgboost

        return parse_xgboost(bytes(model.get_booster().save_raw("json")))
    if library == "lightgbm":
        from maps_core.adapters.lightgbm_text import parse_lightgbm

        return parse_lightgbm(model.booster_.model_to_string())
    return model
