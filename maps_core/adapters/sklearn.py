"""scikit-learn tree ensembles -> :class:`~maps_core.ensemble.FlatEnsemble`.

Supported: ``DecisionTreeClassifier``, ``ExtraTreeClassifier``, ``RandomForestClassifier``,
``ExtraTreesClassifier`` (soft voting: averaged leaf probabilities),
``GradientBoostingClassifier`` (summed leaf values times the learning rate, plus the prior)
and ``HistGradientBoostingClassifier`` (its baseline plus the leaf values, which already
hold the learning rate). The first four compare ``float32(x) <= t``; histogram gradient
boosting compares the raw float64 input, ``x <= t`` (split rule ``float64<=``), and predicts
class 1 iff ``expit(raw) > 0.5`` (the argmax of ``[1 - p, p]``: class 0 at a raw score of
0), or the argmax of the raw scores. A NaN input would follow each node's
``missing_go_to_left``, but cfmaps refuses NaN in queries.

Histogram gradient boosting with categorical features (``categorical_features``) reads
each categorical value as its position among the categories seen in training (exact
equality; any other value is missing) after moving those columns first: the adapter maps
the trees' features back to the input columns and unfolds each categorical split into
plain ``x <= t`` splits, a known category ``k`` being the point ``(nextafter(k, -inf),
k]`` (:func:`_hist_unfolded`). Categories that are not numbers are refused.

Models fitted on data with missing values: a split that sends the missing values, and
only them, right is stored with the threshold +inf (the trees' ``missing_go_to_left`` is
False there; histogram gradient boosting does the same for a split on its missing-value
bin). Every finite input goes left at such a node (``x <= inf``, also when ``float32(x)``
overflows to +inf), so the adapter replaces the node by its left child
(:func:`~maps_core.adapters._trees.skip_always_left`); a threshold of -inf or NaN is
refused as malformed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ensemble import FlatEnsemble
from ..exceptions import UnsupportedModelError
from ..results import py_scalar
from ..splits import FLOAT32_LE, FLOAT32_MAX, FLOAT64_LE
from ._trees import (
    MAX_UNFOLDED_NODES,
    TreeStack,
    check_size,
    library_of,
    unfold_tree,
)

_FORESTS = ("RandomForestClassifier", "ExtraTreesClassifier")
_TREES = ("DecisionTreeClassifier", "ExtraTreeClassifier")
#: The strategies of a gradient boosting's ``DummyClassifier`` init whose scores are the
#: same for every input (``"stratified"`` draws them at random on every call).
_CONSTANT_DUMMIES = ("prior", "most_frequent", "uniform", "constant")
_BOOSTING = ("GradientBoostingClassifier",)
_HIST = ("HistGradientBoostingClassifier",)
SUPPORTED = _TREES + _FORESTS + _BOOSTING + _HIST


def _check(model: Any) -> str:
    kind = type(model).__name__
    if kind == "Pipeline":
        raise UnsupportedModelError(
            "a scikit-learn Pipeline is not supported: pass the final tree-ensemble step and "
            "apply the preprocessing to the inputs yourself"
        )
    if kind not in SUPPORTED:
        raise UnsupportedModelError(
            f"unsupported model type {kind!r}; supported: {', '.join(SUPPORTED)}"
        )
    if not hasattr(model, "classes_") or not hasattr(model, "n_features_in_"):
        raise UnsupportedModelError(f"the {kind} is not fitted")
    if getattr(model, "n_outputs_", 1) != 1:
        raise UnsupportedModelError(f"multi-output {kind} is not supported")
    classes = np.asarray(model.classes_)
    if classes.ndim != 1 or classes.size < 2:
        raise UnsupportedModelError(f"the {kind} must have at least two classes")
    return kind


def tree_problem(tree: Any, n_features: Any) -> str | None:
    """What is wrong with a fitted tree's node arrays, or None when they form a proper
    binary tree over ``n_features`` inputs.

    scikit-learn's compiled ``predict`` and this engine's kernels index these arrays
    without bounds checks, so a crafted or corrupted model must be stopped before either
    runs: array lengths equal ``node_count``; a node is a leaf on both sides or on
    neither; children lie in range and *after* their parent (as scikit-learn numbers
    them, which also excludes cycles), and every node but the root has exactly one
    parent; split features lie in ``[0, n_features)``; values are finite, thresholds
    finite or +inf (a split that sends only missing values right, see the module docs).
    """
    try:
        n = int(tree.node_count)
        left = np.asarray(tree.children_left, dtype=np.int64)
        right = np.asarray(tree.children_right, dtype=np.int64)
        feat = np.asarray(tree.feature, dtype=np.int64)
        thr = np.asarray(tree.threshold, dtype=np.float64)
        value = np.asarray(tree.value, dtype=np.float64)
    except Exception as exc:  # attributes missing or of the wrong kind
        return f"unreadable node arrays ({type(exc).__name__}: {exc})"
    if (n < 1 or not (len(left) == len(right) == len(feat) == len(thr) == n)
            or value.shape[:1] != (n,)):
        return "node arrays disagree with node_count"
    internal = left >= 0
    if not np.array_equal(internal, right >= 0):
        return "a node has exactly one child"
    idx = np.flatnonzero(internal)
    if np.any(left[idx] >= n) or np.any(right[idx] >= n):
        return "node indices out of range"
    if np.any(left[idx] <= idx) or np.any(right[idx] <= idx):
        return "a child precedes its parent (cycle)"
    kids = np.concatenate([left[idx], right[idx]])
    if np.unique(kids).size != kids.size or kids.size != n - 1:
        return "child indices do not form a tree (a node with two parents)"
    if np.any(feat[idx] < 0) or (
        isinstance(n_features, int | np.integer) and np.any(feat[idx] >= n_features)
    ):
        return "split feature out of range"
    if not (np.all(_usable_thresholds(thr[idx])) and np.all(np.isfinite(value))):
        return "a threshold of -inf or NaN, or a non-finite leaf value"
    finite = thr[idx][np.isfinite(thr[idx])]
    if np.any(np.abs(finite) > FLOAT32_MAX):
        # float32(x) <= t compares a float32: no training data gives such a threshold, and
        # the inputs that would reach past it are beyond float32, which the library refuses
        return "a threshold beyond float32's range (the tree compares float32 inputs)"
    return None


def _usable_thresholds(t: np.ndarray) -> np.ndarray:
    """Finite, or +inf (the node sends every finite input left, see the module docs)."""
    return np.isfinite(t) | (t == np.inf)


def _estimators(model: Any) -> list[Any]:
    """The fitted trees' owners of a model (itself, or its ``estimators_``)."""
    if hasattr(model, "tree_"):
        return [model]
    try:
        return list(np.asarray(getattr(model, "estimators_", []), dtype=object).ravel())
    except Exception as exc:  # a crafted attribute that is not even a sequence
        raise UnsupportedModelError(f"malformed estimators_: {exc}") from exc


def _hist_predictors(model: Any) -> list[tuple[int, Any]]:
    """(class column, predictor) of a HistGradientBoostingClassifier, in summation order."""
    out = []
    for stage in getattr(model, "_predictors", None) or []:
        for k, pred in enumerate(stage):
            out.append((k, pred))
    return out


def hist_tree_problem(nodes: Any, n_features: Any) -> str | None:
    """What is wrong with a histogram tree's node array (``TreePredictor.nodes``), or None:
    the same promises as :func:`tree_problem` (scikit-learn's compiled predict trusts
    them); categorical splits are checked where they are read (:func:`_flatten_hist`,
    :func:`_hist_unfolded`)."""
    names = getattr(getattr(nodes, "dtype", None), "names", None) or ()
    need = ("value", "feature_idx", "num_threshold", "left", "right", "is_leaf", "is_categorical")
    if not all(n in names for n in need):
        return "not a histogram-gradient-boosting node array"
    n = nodes.shape[0]
    if n < 1:
        return "an empty tree"
    leaf = nodes["is_leaf"].astype(bool)
    inner = ~leaf
    idx = np.arange(n)
    left, right = nodes["left"].astype(np.int64), nodes["right"].astype(np.int64)
    kids = np.concatenate([left[inner], right[inner]])
    if (kids.size != n - 1 or not np.array_equal(np.sort(kids), np.arange(1, n))
            or np.any(left[inner] <= idx[inner]) or np.any(right[inner] <= idx[inner])):
        return "children out of range, shared, or not after their parent"
    feats = nodes["feature_idx"][inner]
    if n_features is not None and feats.size and (feats.min() < 0 or feats.max() >= int(n_features)):
        return "a split feature out of range"
    if not (np.all(_usable_thresholds(nodes["num_threshold"][inner]))
            and np.all(np.isfinite(nodes["value"][leaf]))):
        return "a threshold of -inf or NaN, or a non-finite leaf value"
    return None


def check_trees(model: Any) -> None:
    """Refuse a model holding a malformed tree (see :func:`tree_problem`).

    Raises
    ------
    UnsupportedModelError
        Naming the tree and its problem.
    """
    n_features = getattr(model, "n_features_in_", None)
    for k, (_, pred) in enumerate(_hist_predictors(model)):
        problem = hist_tree_problem(getattr(pred, "nodes", None), n_features)
        if problem:
            raise UnsupportedModelError(f"the model holds a malformed tree #{k}: {problem}")
    for k, est in enumerate(_estimators(model)):
        tree = getattr(est, "tree_", None)
        if tree is None:
            continue
        problem = tree_problem(tree, n_features)
        if problem:
            raise UnsupportedModelError(f"the model holds a malformed tree #{k}: {problem}")


def _append_tree(tree: Any, values: np.ndarray, trees: TreeStack, n_features: int) -> None:
    problem = tree_problem(tree, n_features)
    if problem:
        raise UnsupportedModelError(f"a tree of the model is malformed: {problem}")
    trees.add_skipping_inf(np.asarray(tree.feature),
                           np.asarray(tree.threshold, dtype=np.float64),
                           np.asarray(tree.children_left, dtype=np.int64),
                           np.asarray(tree.children_right, dtype=np.int64), values)


def _n_nodes(obj: Any, attr: str) -> int:
    """A tree's node count for the size limits, 0 when unreadable: the tree's own check
    (:func:`tree_problem`, :func:`hist_tree_problem`) then names the problem."""
    try:
        return max(int(getattr(obj, attr)), 0)
    except Exception:  # a crafted or missing attribute of any kind
        return 0


def _proba_values(tree: Any) -> np.ndarray:
    # Same normalisation as DecisionTreeClassifier.predict_proba.
    v = np.array(tree.value[:, 0, :], dtype=np.float64)
    s = v.sum(axis=1, keepdims=True)
    s[s == 0.0] = 1.0
    return v / s


def flatten(model: Any) -> FlatEnsemble:
    """Convert a fitted scikit-learn tree classifier to a :class:`FlatEnsemble`.

    Parameters
    ----------
    model : estimator
        A fitted ``DecisionTreeClassifier``, ``ExtraTreeClassifier``,
        ``RandomForestClassifier``, ``ExtraTreesClassifier``,
        ``GradientBoostingClassifier`` or ``HistGradientBoostingClassifier`` (without
        categorical features).

    Returns
    -------
    FlatEnsemble

    Raises
    ------
    UnsupportedModelError
        For any other object, an unfitted model, or a multi-output model.
    """
    kind = _check(model)
    check_size(f"the {kind}", n_features=int(model.n_features_in_),
               n_classes=int(np.asarray(model.classes_).size))
    if kind in _HIST:
        return _flatten_hist(model)
    m = int(model.n_features_in_)
    classes = [py_scalar(c) for c in np.asarray(model.classes_)]
    n_classes = len(classes)
    check_size(f"the {kind}", n_classes=n_classes,
               n_nodes=sum(_n_nodes(getattr(e, "tree_", None), "node_count") for e in _estimators(model)))
    acc = TreeStack()
    base = np.zeros(n_classes, dtype=np.float64)
    tie_break = "low"
    if kind in _TREES:
        _append_tree(model.tree_, _proba_values(model.tree_), acc, m)
    elif kind in _FORESTS:
        for est in model.estimators_:
            _append_tree(est.tree_, _proba_values(est.tree_), acc, m)
    else:  # gradient boosting
        init = model.init_
        dummy = type(init).__name__ == "DummyClassifier"
        strategy = getattr(init, "strategy", None)
        if not ((isinstance(init, str) and init == "zero")
                or (dummy and strategy in _CONSTANT_DUMMIES)):
            # any other init's scores vary with x ("stratified" draws them at random on
            # every call): the model is no longer constant on its leaves' boxes
            what = (f"a DummyClassifier init of strategy {strategy!r}, whose scores vary "
                    "from input to input," if dummy else "a custom init estimator")
            raise UnsupportedModelError(
                f"GradientBoostingClassifier with {what} is not supported (init='zero' "
                f"or a DummyClassifier of strategy {', '.join(_CONSTANT_DUMMIES)} is)")
        raw0 = np.asarray(
            model._raw_predict_init(np.zeros((1, model.n_features_in_), dtype=np.float32)),
            dtype=np.float64,
        )[0]
        if not np.all(np.isfinite(raw0)):
            raise UnsupportedModelError(
                "GradientBoostingClassifier whose init estimator gives a non-finite score")
        lr = float(model.learning_rate)
        stages = model.estimators_
        if n_classes == 2:
            # Binary boosting keeps one raw score r and predicts class 1 when r >= 0:
            # scores (0, r) with ties going to the higher index.
            base[1] = raw0[0]
            tie_break = "high"
            for est in stages[:, 0]:
                leaf = np.zeros((est.tree_.node_count, 2))
                leaf[:, 1] = lr * est.tree_.value[:, 0, 0]
                _append_tree(est.tree_, leaf, acc, m)
        else:
            base[:] = raw0
            for stage in stages:
                for k, est in enumerate(stage):
                    leaf = np.zeros((est.tree_.node_count, n_classes))
                    leaf[:, k] = lr * est.tree_.value[:, 0, 0]
                    _append_tree(est.tree_, leaf, acc, m)
    names = getattr(model, "feature_names_in_", None)
    return acc.ensemble(
        kind=kind,
        n_features=int(model.n_features_in_),
        classes=classes,
        feature_names=None if names is None else [str(n) for n in names],
        base=base,
        tie_break=tie_break,
        split_rule=FLOAT32_LE,  # sklearn compares float32(x) <= t (t float64)
    )


def _flatten_hist(model: Any) -> FlatEnsemble:
    """A HistGradientBoostingClassifier as a flat ensemble (see the module docs)."""
    m = int(model.n_features_in_)
    classes = [py_scalar(c) for c in np.asarray(model.classes_)]
    n_classes = len(classes)
    binary = n_classes == 2
    categorical = getattr(model, "is_categorical_", None) is not None and np.any(model.is_categorical_)
    column, known = _hist_categories(model, m) if categorical else (None, {})
    baseline = np.asarray(model._baseline_prediction, dtype=np.float64).ravel()
    check_size("the HistGradientBoostingClassifier", n_classes=n_classes,
               n_nodes=sum(_n_nodes(getattr(p, "nodes", None), "size") for _, p in _hist_predictors(model)))
    trees = TreeStack()
    for k, pred in _hist_predictors(model):
        nodes = pred.nodes
        problem = hist_tree_problem(nodes, m)
        if problem:
            raise UnsupportedModelError(f"a tree of the model is malformed: {problem}")
        leaf = nodes["is_leaf"].astype(bool)
        value = np.zeros((nodes.shape[0], n_classes))
        value[leaf, 1 if binary else k] = nodes["value"][leaf]
        left = np.where(leaf, -1, nodes["left"].astype(np.int64))  # uint32 in scikit-learn
        right = np.where(leaf, -1, nodes["right"].astype(np.int64))
        if column is not None:
            trees.add(*_hist_unfolded(pred, column, known, value))
            continue
        if np.any(nodes["is_categorical"][~leaf]):
            raise UnsupportedModelError("a tree of the model is malformed: a categorical split "
                                        "in a model without categorical features")
        trees.add_skipping_inf(np.asarray(nodes["feature_idx"]),
                               np.asarray(nodes["num_threshold"], dtype=np.float64), left, right,
                               value)
    # categorical splits unfold into more nodes than the model has
    check_size("the HistGradientBoostingClassifier", n_classes=n_classes, n_nodes=trees.n_nodes)
    base = np.zeros(n_classes)
    if binary:
        base[1] = baseline[0]
    else:
        base[:] = baseline
    names = getattr(model, "feature_names_in_", None)
    return trees.ensemble(
        kind="HistGradientBoostingClassifier",
        n_features=m,
        classes=classes,
        feature_names=None if names is None else [str(n) for n in names],
        base=base,
        tie_break="low",  # binary: expit(0) = 0.5 is class 0; multiclass: first argmax
        split_rule=FLOAT64_LE,  # x <= t on the raw float64 input
    )


def _hist_categories(model: Any, m: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """A HistGradientBoostingClassifier with categorical features: the input column of each
    of its trees' feature indices, shape (m,), and the known categories of each categorical
    column, increasing (float64).

    Its ``predict`` first passes the input through ``_preprocessor``, a column transformer
    that puts the categorical columns first, each mapped by an ``OrdinalEncoder`` to the
    position of its value among the categories seen in training (exact equality), any
    other value to NaN (missing); the trees read that. Categories that are not numbers
    (strings) cannot come in a numeric query and are refused.
    """
    is_cat = np.asarray(model.is_categorical_, dtype=bool)
    try:
        encoder = model._preprocessor.named_transformers_["encoder"]  # noqa: SLF001
        found = list(encoder.categories_)
    except Exception:  # a crafted or an unknown layout
        raise UnsupportedModelError(
            "the HistGradientBoostingClassifier's categories cannot be read (no fitted "
            "_preprocessor encoder)") from None
    cols = np.flatnonzero(is_cat)
    if is_cat.shape != (m,) or len(found) != cols.size:
        raise UnsupportedModelError("the HistGradientBoostingClassifier's categories do not "
                                    "match its categorical features")
    known: dict[int, np.ndarray] = {}
    for j, cats in zip(cols, found, strict=True):
        cats = np.asarray(cats)
        if cats.dtype.kind not in "iuf":
            raise UnsupportedModelError(
                f"the HistGradientBoostingClassifier's categorical feature {int(j)} has "
                f"categories that are not numbers ({cats[:3].tolist()}...); encode them as "
                "integer codes before fitting, or one-hot encode them")
        cats = cats.astype(np.float64)
        known[int(j)] = cats[~np.isnan(cats)]
    return np.concatenate([cols, np.flatnonzero(~is_cat)]), known


def _hist_unfolded(pred: Any, column: np.ndarray, known: dict[int, np.ndarray],
                   value: np.ndarray) -> tuple[np.ndarray, ...]:
    """A histogram tree of a model with categorical features, its feature indices mapped
    back to the input columns and each categorical split unfolded into plain ``x <= t``
    splits (:func:`~maps_core.adapters._trees.unfold_tree`): a known category ``k`` is the
    point ``(nextafter(k, -inf), k]``, sent left when its code is in the split's
    ``raw_left_cat_bitsets`` row, right otherwise; every other value is missing for the
    tree and goes its ``missing_go_to_left`` way. Returns (feature, threshold, left,
    right, value) for :meth:`TreeStack.add`."""
    nodes = pred.nodes
    n = nodes.shape[0]
    leaf = nodes["is_leaf"].astype(bool)
    if leaf[0]:  # a constant tree
        return (np.full(1, -1), np.zeros(1), np.full(1, -1), np.full(1, -1), value[:1])
    feature = column[np.where(leaf, 0, nodes["feature_idx"].astype(np.int64))]
    bitsets = np.asarray(getattr(pred, "raw_left_cat_bitsets", np.zeros((0, 8))), dtype=np.int64)
    cuts, sides = [], []
    for nd in range(n):
        if leaf[nd] or not nodes["is_categorical"][nd]:
            cuts.append(np.array([float(nodes["num_threshold"][nd])]))
            sides.append(np.array([False, True]))
            continue
        b = int(nodes["bitset_idx"][nd])
        cats = known.get(int(feature[nd]))
        if cats is None or not 0 <= b < bitsets.shape[0]:
            raise UnsupportedModelError("a categorical split of the HistGradientBoostingClassifier "
                                        "names no known categories")
        codes = np.arange(cats.size)
        go_right = ((bitsets[b, np.minimum(codes // 32, bitsets.shape[1] - 1)] >> (codes % 32)) & 1) == 0
        go_right &= codes < 32 * bitsets.shape[1]
        miss = not bool(nodes["missing_go_to_left"][nd])
        c = np.column_stack([np.nextafter(cats, -np.inf), cats]).ravel()
        side = np.full(c.size + 1, miss)
        side[1::2] = go_right
        cuts.append(c)
        sides.append(side)
    return unfold_tree(feature, cuts, sides, nodes["left"].astype(np.int64),
                       nodes["right"].astype(np.int64), value, MAX_UNFOLDED_NODES,
                       "a HistGradientBoostingClassifier tree", is_leaf=leaf)


class SklearnAdapter:
    """The registry's adapter for scikit-learn (see :class:`maps_core.adapters.Adapter`)."""

    name: str = "sklearn"
    supported: tuple[str, ...] = SUPPORTED

    def accepts(self, model: Any) -> bool:
        # Any scikit-learn object: this adapter names what is wrong with an unsupported one
        # (a Pipeline, a regressor, an unfitted model).
        return library_of(model) == "sklearn"

    def prepare(self, model: Any) -> Any:
        return model  # scikit-learn's own objects: their predict is the reference

    def check(self, model: Any) -> None:
        check_trees(model)

    def flatten(self, model: Any) -> FlatEnsemble:
        return flatten(model)


SKLEARN = SklearnAdapter()

__all__ = ["SKLEARN", "SUPPORTED", "SklearnAdapter", "check_trees", "flatten", "tree_problem"]
