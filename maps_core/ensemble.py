"""Model-agnostic flat representation of a tree-ensemble classifier.

Every supported model becomes the same few arrays: concatenated node arrays for all trees,
a leaf value vector per node, a base score, and a decision rule. The decision is

``scores(x) = base + sum over trees t of value[leaf_t(x)]``, then ``argmax(scores)``,

where ``leaf_t(x)`` is found by sending ``x`` left by the model's own comparison, its
*split rule* (:mod:`maps_core.splits`: scikit-learn compares ``float32(x[f]) <= threshold``,
XGBoost ``float32(x[f]) < threshold``, LightGBM ``x[f] <= threshold``). Ties go to the
lowest class index, except for binary gradient boosting, which predicts class 1 when its
raw score is ``>= 0`` (``tie_break="high"``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from .exceptions import InvalidQueryError, UnsupportedModelError
from .splits import FLOAT32_LE, model_view, rule_flags


@njit(cache=True, nogil=True)
def _row_scores(X, i, nf, thr, nl, nr, nv, roots, base, out, view32, strict):
    """``base + sum over trees of the leaf values`` of row ``i`` of ``X`` into ``out``
    (shape (n_classes,)), trees added in order; the model compares its view of x
    (``float32(x)`` when ``view32``) with ``<`` when ``strict``, else ``<=``."""
    for k in range(base.shape[0]):
        out[k] = base[k]
    for r in range(roots.shape[0]):
        node = roots[r]
        while nf[node] >= 0:
            v = model_view(X[i, nf[node]], view32)
            if v < thr[node] or (not strict and v == thr[node]):
                node = nl[node]
            else:
                node = nr[node]
        for k in range(base.shape[0]):
            out[k] += nv[node, k]


@njit(cache=True, nogil=True)
def _scores(X, nf, thr, nl, nr, nv, roots, base, view32, strict):
    """Class scores of every row of ``X`` (shape (n, m)), shape (n, n_classes)."""
    out = np.empty((X.shape[0], base.shape[0]))
    for i in range(X.shape[0]):
        _row_scores(X, i, nf, thr, nl, nr, nv, roots, base, out[i], view32, strict)
    return out


@njit(cache=True, nogil=True)
def _predict(X, nf, thr, nl, nr, nv, roots, base, tie_high, view32, strict):
    """Class index of every row of ``X`` (shape (n, m)): the argmax of its scores, ties
    to the lowest index (the highest with ``tie_high``); and its margin over the
    runner-up (``inf`` with one class). Two arrays of shape (n,)."""
    out = np.empty(X.shape[0], dtype=np.int64)
    margin = np.empty(X.shape[0])
    s = np.empty(base.shape[0])
    for i in range(X.shape[0]):
        _row_scores(X, i, nf, thr, nl, nr, nv, roots, base, s, view32, strict)
        top = 0
        for k in range(1, s.shape[0]):
            if s[k] > s[top] or (tie_high and s[k] == s[top]):
                top = k
        out[i] = top
        gap = np.inf
        for k in range(s.shape[0]):
            if k != top and s[top] - s[k] < gap:
                gap = s[top] - s[k]
        margin[i] = gap
    return out, margin


@dataclass(frozen=True, eq=False)
class FlatEnsemble:
    """Flat arrays describing a fitted tree ensemble.

    Attributes
    ----------
    kind : str
        Class name of the source model, e.g. ``"RandomForestClassifier"``.
    n_features : int
        Number of input columns ``m``.
    classes : list
        The model's ``classes_`` as plain Python scalars, in class-index order.
    feature_names : list of str or None
        ``feature_names_in_`` of the model when it was fitted on named columns.
    node_feature : ndarray of shape (n_nodes,), int32
        Split feature per node, ``-1`` at leaves.
    node_threshold : ndarray of shape (n_nodes,), float64
        Split threshold per node (``x <= t`` goes left); unused at leaves.
    node_left, node_right : ndarray of shape (n_nodes,), int32
        Absolute indices of the children, ``-1`` at leaves.
    node_value : ndarray of shape (n_nodes, n_classes), float64
        Contribution of a leaf to the class scores; unused at internal nodes.
    roots : ndarray of shape (n_trees,), int32
        Root node index of every tree.
    base : ndarray of shape (n_classes,), float64
        Constant added to the scores (gradient-boosting prior).
    tie_break : {"low", "high"}
        Which class wins an exact tie of scores.
    split_rule : str
        The model's comparison of an input with a threshold, one of
        :data:`maps_core.splits.SPLIT_RULES` (default: scikit-learn's ``float32<=``).
    score_precision : {"float64", "float32"}
        The precision the library sums leaf values in. XGBoost sums in float32, whose
        rounding can move a score by about ``n_trees * 2**-24`` of its size: the
        certificates' tolerance widens accordingly, and scores within it are decided by
        the model's own arithmetic (:class:`maps_core.engine.SearchEngine`).
    """

    kind: str
    n_features: int
    classes: list[Any]
    feature_names: list[str] | None
    node_feature: np.ndarray
    node_threshold: np.ndarray
    node_left: np.ndarray
    node_right: np.ndarray
    node_value: np.ndarray
    roots: np.ndarray
    base: np.ndarray
    tie_break: str = "low"
    split_rule: str = FLOAT32_LE
    score_precision: str = "float64"

    def __post_init__(self) -> None:
        rule_flags(self.split_rule)  # an unknown rule is refused at once
        if self.score_precision not in ("float64", "float32"):
            raise UnsupportedModelError(f"unknown score precision {self.score_precision!r}")

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def n_trees(self) -> int:
        return int(self.roots.shape[0])

    @property
    def n_nodes(self) -> int:
        return int(self.node_feature.shape[0])

    def fingerprint(self) -> str:
        """SHA-256 over everything that determines the decision function."""
        h = hashlib.sha256()
        h.update(f"{self.kind}|{self.n_features}|{self.classes!r}|{self.tie_break}".encode())
        if self.split_rule != FLOAT32_LE:  # keeps the fingerprints of maps saved before
            h.update(f"|{self.split_rule}".encode())
        if self.score_precision != "float64":
            h.update(f"|{self.score_precision}".encode())
        for a in (
            self.node_feature,
            self.node_threshold,
            self.node_left,
            self.node_right,
            self.node_value,
            self.roots,
            self.base,
        ):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def thresholds(self, feature: int) -> np.ndarray:
        """Sorted unique raw thresholds used on ``feature``, shape (k,)."""
        mask = self.node_feature == feature
        return np.unique(self.node_threshold[mask])

    def decision_scores(self, X: np.ndarray) -> np.ndarray:
        """Class scores, shape (n_samples, n_classes), following the model's split semantics.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        """
        X = self._checked(X)
        # One compiled pass per row (a Python loop over trees cost ~10 ms per row on 100
        # trees); the summation order (base, then the trees in order) is kept whatever the
        # layout of X.
        return _scores(X, self.node_feature, self.node_threshold, self.node_left,
                       self.node_right, self.node_value, self.roots, self.base,
                       *rule_flags(self.split_rule))

    def _checked(self, X: Any) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise InvalidQueryError(
                f"expected an array of shape (n, {self.n_features}), got {X.shape}", "X"
            )
        return X

    def predict_index(self, X: np.ndarray) -> np.ndarray:
        """Predicted class indices, shape (n_samples,).

        The scores are the model's leaf values summed in float64 in tree order. A library
        may compute them differently in the last bits (scikit-learn's forests divide the
        sum by the number of trees before the argmax, which can merge two sums one ulp
        apart), so where the best and second-best scores nearly tie this may differ from
        the model's own ``predict``; :meth:`predict_margin` tells where, and neither the
        extraction nor the query path relies on it there (they ask the model itself; see
        :class:`maps_core.engine.SearchEngine`).
        """
        return self.predict_margin(X)[0]

    def predict_margin(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predicted class indices and each row's margin (best score minus runner-up),
        two arrays of shape (n_samples,)."""
        idx, margin = _predict(self._checked(X), self.node_feature, self.node_threshold,
                               self.node_left, self.node_right, self.node_value, self.roots,
                               self.base, self.tie_break == "high", *rule_flags(self.split_rule))
        return idx, margin


__all__ = ["FlatEnsemble"]
