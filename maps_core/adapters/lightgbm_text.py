"""LightGBM classifiers, read from the text model file ``save_model`` / ``model_to_string``
writes: parsed here, never loaded through LightGBM (whose code would then run on an
uploaded file).

What the file says, and how it maps to a :class:`~maps_core.ensemble.FlatEnsemble`:

* ``num_class`` and ``num_tree_per_iteration``: tree ``i`` adds to class
  ``i % num_tree_per_iteration`` (binary: one tree per iteration, the raw score of class 1);
* every tree's ``leaf_value`` already holds the shrinkage, and the first trees hold the
  initial score (``boost_from_average``), so there is no separate base score;
* ``average_output`` (random-forest mode): the raw score is the trees' mean;
* a split sends ``x`` left iff ``x <= threshold`` in float64 (split rule ``float64<=``),
  on LightGBM's view of ``x``: reading a row, it drops every value with
  ``|x| <= kZeroThreshold`` (``1e-35`` as a float32, :data:`K_ZERO`) as a sparse zero, so
  such inputs are 0.0. The adapter folds that into the thresholds: a threshold in
  ``[0, K_ZERO)`` becomes ``K_ZERO``, one in ``[-K_ZERO, 0)`` becomes the float64 below
  ``-K_ZERO``; then ``x <= t`` on the raw input is LightGBM's decision everywhere (its
  splits between negative values and zero sit at ``-K_ZERO`` itself, where this matters).
  ``decision_type`` bit 0 marks a categorical split, bit 1 the default direction of a
  missing value, bits 2-3 the missing type (0 none: NaN is read as 0.0; 1 zero: 0.0 is
  missing and goes the default way; 2 NaN: NaN goes the default way). cfmaps refuses NaN
  in queries, so the default direction never matters, except for the *zero* type, where
  0.0 itself is routed by it: such models (``zero_as_missing=True``) are refused, as are
  linear trees. Trained on data with NaN, LightGBM may write a split of threshold
  ``inf``, which sends NaN its default way and every finite input left: it is replaced by
  its left child (``-inf`` and NaN thresholds are refused).
* ``pandas_categorical`` (a model fitted on pandas ``category`` columns): numeric
  categories other than ``0..n-1`` are refused
  (:func:`~maps_core.adapters._trees.check_category_values`).
* a categorical split (``categorical_feature``, or a pandas ``category`` column) sends
  ``x`` left iff its code is in the node's bitset (``cat_threshold`` words from
  ``cat_boundaries[k]``, ``k`` the node's threshold). LightGBM reads the code as C's
  ``int(x)``, truncated toward zero, and sends a negative code, NaN and a code past the
  bitset right: so code 0 is every ``x`` in ``(-1, 1)``, code ``c >= 1`` every ``x`` in
  ``[c, c + 1)``. Each such split becomes a balanced chain of ``x <= t`` splits, one
  interval per run of codes, with a copy of the child subtree below each run
  (:func:`~maps_core.adapters._trees.unfold_tree`): the flat ensemble decides every real
  input as LightGBM does, and on a feature declared ``integer`` or ``nominal`` the chain's
  cuts fall between codes. A tree whose chains would unfold past
  :data:`MAX_UNFOLDED_NODES` nodes is refused.
* ``sigmoid`` (binary, multiclassova) must be a positive finite number, as LightGBM itself
  requires when it loads a file; models beyond the size limits of
  :mod:`maps_core.adapters._trees` (features, classes, nodes times classes) are refused
  before anything is allocated for them.

The decision is ``LGBMClassifier.predict``'s: the argmax of the class probabilities, which
for a binary model is class 1 iff ``sigmoid(raw) > 0.5`` (class 0 at exactly 0.5), and for
``multiclass`` (a softmax of the raw scores) or ``multiclassova`` (a sigmoid per class) the
argmax of those probabilities, first index on a tie (two raw scores a float64 ulp apart
may give equal probabilities). :class:`LightGBMModel` emulates it in float64 (LightGBM's
own arithmetic), and the engine asks it wherever the flat ensemble's margin is too small
to decide.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ensemble import FlatEnsemble
from ..exceptions import UnsupportedModelError
from ..splits import FLOAT64_LE
from ._trees import (
    MAX_UNFOLDED_NODES,
    TreeStack,
    check_category_values,
    check_size,
    code_set_cuts,
    library_of,
    parse_dump,
    unfold_tree,
)

__all__ = ["K_ZERO", "LIGHTGBM", "MAX_UNFOLDED_NODES", "LightGBMAdapter", "LightGBMModel",
           "effective_thresholds", "from_lightgbm", "lightgbm_view", "parse_lightgbm"]

_OBJECTIVES = ("binary", "multiclass", "multiclassova")
#: LightGBM's kZeroThreshold (1e-35f): inputs with ``|x| <= K_ZERO`` are read as 0.0.
K_ZERO = float(np.float32(1e-35))
#: LightGBM reads a categorical input as ``int(x)`` (C's truncation toward zero); beyond
#: int32 the conversion gives a negative code, which goes right like any code past the
#: bitset.
_INT32_END = 2.0**31


@dataclass
class _Tree:
    split_feature: np.ndarray  # (n_internal,) int
    threshold: np.ndarray  # (n_internal,) float64
    decision_type: np.ndarray  # (n_internal,) int
    left: np.ndarray  # (n_internal,) int; < 0: leaf ~child
    right: np.ndarray
    leaf_value: np.ndarray  # (n_leaves,) float64
    # categorical splits: node i (decision_type bit 0) sends left the codes whose bits are
    # set in the words cat_threshold[cat_boundaries[k]:cat_boundaries[k + 1]], k = its
    # threshold
    cat_boundaries: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    cat_threshold: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def categorical(self) -> np.ndarray:
        """Boolean mask of the categorical splits, shape (n_internal,)."""
        return (self.decision_type & 1).astype(bool)

    def codes(self, node: int) -> np.ndarray:
        """The codes the categorical split ``node`` sends left, increasing."""
        k = int(self.threshold[node])
        words = self.cat_threshold[self.cat_boundaries[k]:self.cat_boundaries[k + 1]]
        bits = np.unpackbits(words.astype("<u4").view(np.uint8), bitorder="little")
        return np.flatnonzero(bits)


@dataclass
class LightGBMModel:
    """A LightGBM classifier as its text model file describes it.

    Attributes
    ----------
    n_classes : int
    n_features_in_ : int
    feature_names : list of str
    objective : str
        ``binary``, ``multiclass`` or ``multiclassova``.
    sigmoid : float
        The objective's sigmoid parameter (binary, multiclassova).
    average_output : bool
        Random-forest mode: the raw score is the mean of the trees.
    trees : list
        In file order; tree ``i`` adds to class ``i % n_tree_per_iteration``.
    labels : list, optional
        Class labels in index order, when known (a fitted ``LGBMClassifier``'s
        ``classes_``); a file alone stores indices 0..K-1.
    """

    n_classes: int
    n_features_in_: int
    feature_names: list[str]
    objective: str
    sigmoid: float
    average_output: bool
    n_tree_per_iteration: int
    trees: list[_Tree] = field(repr=False)
    labels: list[Any] | None = None

    @property
    def classes_(self) -> np.ndarray:
        """Class labels: ``labels``, else the indices 0..K-1 a file stores (name them in
        the spec)."""
        return np.arange(self.n_classes) if self.labels is None else np.asarray(self.labels)

    def raw_scores(self, X: np.ndarray) -> np.ndarray:
        """Raw scores as LightGBM computes them (float64, trees in order), shape (n, K')
        with K' = ``n_tree_per_iteration``."""
        X = np.asarray(X, dtype=np.float64)
        k = self.n_tree_per_iteration
        out = np.zeros((X.shape[0], k))
        for i, t in enumerate(self.trees):
            out[:, i % k] += _tree_values(t, X)
        if self.average_output:
            out /= len(self.trees) // k
        return out

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities as ``LGBMClassifier.predict_proba``, shape (n, n_classes)."""
        raw = self.raw_scores(X)
        if self.objective == "binary":
            p = 1.0 / (1.0 + _exp(-self.sigmoid * raw[:, 0]))
            return np.column_stack([1.0 - p, p])
        if self.objective == "multiclassova":
            return 1.0 / (1.0 + _exp(-self.sigmoid * raw))
        e = _exp(raw - raw.max(axis=1, keepdims=True))
        # summed in class order, as LightGBM's Softmax does (numpy sums pairwise)
        return e / np.cumsum(e, axis=1)[:, -1:]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Class labels as ``LGBMClassifier.predict`` (argmax, first index on a tie)."""
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]


def _libm_exp1(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf  # C's exp


_LIBM_EXP = np.frompyfunc(_libm_exp1, 1, 1)


def _exp(a: np.ndarray) -> np.ndarray:
    """``exp`` as C's libm computes it, element by element (LightGBM's ``std::exp``).
    numpy's vectorised exp may differ by an ulp, which decides near ties the other way
    (a QA fuzz: multiclassova and random-forest mode models with class 3 against 0)."""
    return np.asarray(_LIBM_EXP(np.asarray(a, dtype=np.float64)), dtype=np.float64)


def lightgbm_view(X: np.ndarray) -> np.ndarray:
    """Inputs as LightGBM reads them: ``|x| <= K_ZERO`` is 0.0."""
    return np.where(np.abs(X) <= K_ZERO, 0.0, X)


def effective_thresholds(t: np.ndarray) -> np.ndarray:
    """Thresholds for which ``x <= t`` on the raw input equals LightGBM's decision on its
    view of ``x`` (see the module docs)."""
    t = np.asarray(t, dtype=np.float64).copy()
    near = (t >= -K_ZERO) & (t < K_ZERO)
    t[near & (t >= 0)] = K_ZERO
    t[near & (t < 0)] = np.nextafter(-K_ZERO, -np.inf)
    return t


def _tree_values(t: _Tree, X: np.ndarray) -> np.ndarray:
    X = lightgbm_view(X)
    n = X.shape[0]
    if t.split_feature.size == 0:
        return np.full(n, t.leaf_value[0])
    node = np.zeros(n, dtype=np.int64)
    out = np.empty(n)
    active = np.arange(n)
    cat = t.categorical()
    while active.size:
        nd = node[active]
        v = X[active, t.split_feature[nd]]
        go_left = v <= t.threshold[nd]
        at_cat = cat[nd]
        if at_cat.any():
            go_left[at_cat] = _in_code_set(t, nd[at_cat], v[at_cat])
        child = np.where(go_left, t.left[nd], t.right[nd])
        leaf = child < 0
        out[active[leaf]] = t.leaf_value[~child[leaf]]
        node[active[~leaf]] = child[~leaf]
        active = active[~leaf]
    return out


def _in_code_set(t: _Tree, nodes: np.ndarray, v: np.ndarray) -> np.ndarray:
    """LightGBM's categorical decision: whether each input ``v`` (its view) at the
    categorical split ``nodes`` goes left, shape (n,)."""
    ok = (v > -1.0) & (v < _INT32_END)  # False for NaN
    code = np.where(ok, np.trunc(np.where(ok, v, 0.0)), 0).astype(np.int64)
    k = t.threshold[nodes].astype(np.int64)
    start, end = t.cat_boundaries[k], t.cat_boundaries[k + 1]
    word = start + code // 32
    ok &= word < end
    bits = t.cat_threshold[np.where(ok, word, 0)] if t.cat_threshold.size else np.zeros(v.size, np.int64)
    return ok & (((bits >> (code % 32)) & 1) == 1)


def _fields(block: str) -> dict[str, str]:
    out = {}
    for line in block.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
        elif line.strip():
            out[line.strip()] = ""
    return out


def _array(fields: dict[str, str], key: str, dtype: Any, n: int, where: str) -> np.ndarray:
    text = fields.get(key)
    if text is None:
        raise UnsupportedModelError(f"LightGBM model file: {where} has no '{key}'")
    try:
        a = np.array(text.split(), dtype=dtype) if text else np.zeros(0, dtype=dtype)
    except (ValueError, OverflowError):  # OverflowError: an integer beyond int64
        raise UnsupportedModelError(
            f"LightGBM model file: {where}: '{key}' is not numeric or out of range") from None
    if a.shape[0] != n:
        raise UnsupportedModelError(
            f"LightGBM model file: {where}: '{key}' has {a.shape[0]} values, expected {n}")
    return a


def parse_lightgbm(text: str) -> LightGBMModel:
    """Parse a LightGBM text model file (``model_to_string``).

    Raises
    ------
    UnsupportedModelError
        A truncated or malformed file, or a model cfmaps cannot represent exactly (see
        the module docs), naming what is wrong.
    """
    if not text.startswith("tree"):
        raise UnsupportedModelError("not a LightGBM text model file (it starts with 'tree')")
    if "end of trees" not in text:
        raise UnsupportedModelError("LightGBM model file is truncated: no 'end of trees'")
    head, _, rest = text.partition("\nTree=")
    hf = _fields(head)
    objective = hf.get("objective", "").split()
    if not objective or objective[0] not in _OBJECTIVES:
        name = objective[0] if objective else "none"
        raise UnsupportedModelError(
            f"LightGBM objective {name!r} is not a classifier cfmaps supports "
            f"({', '.join(_OBJECTIVES)}); ranking and regression models have no classes")
    params = dict(p.split(":", 1) for p in objective[1:] if ":" in p)
    try:
        num_class = int(hf.get("num_class", "1"))
        per_iter = int(hf.get("num_tree_per_iteration", "1"))
        n_features = int(hf["max_feature_idx"]) + 1
        sigmoid = float(params.get("sigmoid", "1"))
    except (KeyError, ValueError) as exc:
        raise UnsupportedModelError(f"LightGBM model file: malformed header ({exc})") from None
    if objective[0] != "multiclass" and not (math.isfinite(sigmoid) and sigmoid > 0):
        # LightGBM refuses it too; a negative one would swap the classes, zero or NaN
        # make every probability 0.5 or NaN
        raise UnsupportedModelError(
            f"LightGBM model file: sigmoid {params.get('sigmoid')!r} is not a positive finite number")
    n_classes = 2 if objective[0] == "binary" else num_class
    # before the feature names are split and the trees parsed for what the file claims
    check_size("LightGBM model file", n_features=n_features, n_classes=n_classes)
    if "[boosting: dart]" in text or "\nboosting=dart" in head:
        raise UnsupportedModelError("LightGBM dart models are not supported")
    if "[linear_tree: 1]" in text:
        raise UnsupportedModelError("LightGBM linear trees are not supported (leaves are not constants)")
    _check_pandas_categorical(text)
    names = hf.get("feature_names", "").split()
    if len(names) != n_features:
        raise UnsupportedModelError(
            f"LightGBM model file: {len(names)} feature names for {n_features} features")
    if (objective[0] == "binary" and per_iter != 1) or (objective[0] != "binary" and per_iter != num_class):
        raise UnsupportedModelError(
            f"LightGBM model file: {per_iter} trees per iteration for {n_classes} classes")
    trees = []
    body = rest.split("end of trees", 1)[0]
    for i, block in enumerate(("Tree=" + body).split("\nTree=")):
        if not block.strip():
            continue
        where = f"tree {i}"
        f = _fields(block)
        try:
            n_leaves = int(f["num_leaves"])
        except (KeyError, ValueError):
            raise UnsupportedModelError(f"LightGBM model file: {where} has no num_leaves") from None
        try:
            num_cat = int(f.get("num_cat", "0") or 0)
        except ValueError:
            raise UnsupportedModelError(f"LightGBM model file: {where}: malformed num_cat") from None
        if f.get("is_linear", "0") not in ("0", ""):
            raise UnsupportedModelError(f"LightGBM linear trees are not supported ({where})")
        n_int = n_leaves - 1
        t = _Tree(
            split_feature=_array(f, "split_feature", np.int64, n_int, where),
            threshold=_array(f, "threshold", np.float64, n_int, where),
            decision_type=_array(f, "decision_type", np.int64, n_int, where),
            left=_array(f, "left_child", np.int64, n_int, where),
            right=_array(f, "right_child", np.int64, n_int, where),
            leaf_value=_array(f, "leaf_value", np.float64, n_leaves, where),
        )
        if num_cat > 0:
            t.cat_boundaries = _array(f, "cat_boundaries", np.int64, num_cat + 1, where)
            t.cat_threshold = _array(f, "cat_threshold", np.int64,
                                     len(f.get("cat_threshold", "").split()), where)
        _check_tree(t, n_features, where)
        trees.append(t)
    if not trees or len(trees) % per_iter:
        raise UnsupportedModelError(
            f"LightGBM model file: {len(trees)} trees, not a multiple of {per_iter} per iteration")
    # refused here, at upload, rather than when flatten() allocates the value matrix
    check_size("LightGBM model file", n_classes=n_classes, n_nodes=_n_nodes(trees))
    return LightGBMModel(n_classes=n_classes, n_features_in_=n_features, feature_names=names,
                         objective=objective[0], sigmoid=sigmoid,
                         average_output="average_output" in hf, n_tree_per_iteration=per_iter,
                         trees=trees)


def _check_pandas_categorical(text: str) -> None:
    """Refuse numeric pandas categories that are not their own codes (the file's last line,
    ``pandas_categorical:``; see :func:`~maps_core.adapters._trees.check_category_values`)."""
    # found from the end, where LightGBM writes it, rather than by splitting the whole file
    at = text.rfind("\npandas_categorical:")
    if at < 0:
        return
    line = text[at + 1:].split("\n", 1)[0]
    try:
        columns = json.loads(line.partition(":")[2])
    except (ValueError, RecursionError):
        raise UnsupportedModelError("LightGBM model file: malformed pandas_categorical") from None
    if columns is None:
        return
    if not isinstance(columns, list) or not all(isinstance(c, list) for c in columns):
        raise UnsupportedModelError("LightGBM model file: malformed pandas_categorical")
    for i, values in enumerate(columns):
        check_category_values(values, f"LightGBM model file, categorical column #{i}")


def _n_nodes(trees: list[_Tree]) -> int:
    """Nodes of the trees in the flat ensemble: internal nodes plus leaves."""
    return sum(t.split_feature.size + t.leaf_value.size for t in trees)


def _check_tree(t: _Tree, n_features: int, where: str) -> None:
    """Refuse what cfmaps cannot represent exactly, and structures that would crash or loop."""
    cat = t.categorical() if t.decision_type.size else np.zeros(0, dtype=bool)
    if cat.any():
        b, words = t.cat_boundaries, t.cat_threshold
        ok = (b.ndim == 1 and b.size >= 2 and b[0] == 0 and b[-1] == words.size
              and bool(np.all(np.diff(b) >= 0)) and bool(np.all((words >= 0) & (words < 2**32))))
        k = t.threshold[cat]
        if not (ok and np.all(k == np.floor(k)) and np.all((k >= 0) & (k < b.size - 1))):
            raise UnsupportedModelError(
                f"LightGBM model file: malformed categorical split ({where}): cat_boundaries, "
                "cat_threshold and the split's index into them disagree")
    if t.decision_type.size and np.any(((t.decision_type >> 2) & 3) == 1):
        raise UnsupportedModelError(
            f"LightGBM zero_as_missing models are not supported ({where}): a 0.0 input would "
            "go the default way, not by its threshold")
    # +inf: a split that sends missing values, and only them, right (every finite input
    # satisfies x <= inf); the flat tree drops it (TreeStack.add_skipping_inf)
    usable = np.isfinite(t.threshold) | ((t.threshold == np.inf) & ~cat)
    if not np.all(usable) or not np.all(np.isfinite(t.leaf_value)):
        raise UnsupportedModelError(
            f"LightGBM model file: a threshold of -inf or NaN, or a non-finite leaf value ({where})")
    n_int, n_leaves = t.split_feature.size, t.leaf_value.size
    if t.split_feature.size and (t.split_feature.min() < 0 or t.split_feature.max() >= n_features):
        raise UnsupportedModelError(f"LightGBM model file: split feature out of range ({where})")
    # every internal node but the root is some node's child, every leaf exactly once, and
    # children come after their parent (no cycle)
    kids = np.concatenate([t.left, t.right])
    internal, leaves = kids[kids >= 0], ~kids[kids < 0]
    ok = (internal.size == max(n_int - 1, 0) and np.array_equal(np.sort(internal), np.arange(1, n_int))
          and np.array_equal(np.sort(leaves), np.arange(n_leaves)))
    if n_int and ok:
        parents = np.arange(n_int)
        ok = bool(np.all((t.left < 0) | (t.left > parents)) and np.all((t.right < 0) | (t.right > parents)))
    if n_int and not ok:
        raise UnsupportedModelError(f"LightGBM model file: malformed tree structure ({where})")


def flatten(model: LightGBMModel) -> FlatEnsemble:
    """The flat ensemble of a parsed LightGBM classifier (see the module docs)."""
    k = model.n_tree_per_iteration
    binary = model.objective == "binary"
    n_classes = model.n_classes
    check_size("LightGBM model", n_features=model.n_features_in_, n_classes=n_classes,
               n_nodes=_n_nodes(model.trees))
    scale = 1.0 / (len(model.trees) // k) if model.average_output else 1.0
    trees = TreeStack()
    for i, t in enumerate(model.trees):
        n_int, n_leaves = t.split_feature.size, t.leaf_value.size
        if n_int and t.categorical().any():
            trees.add_skipping_inf(*_unfolded(t, n_classes, 1 if binary else i % k, scale,
                                              f"tree {i}"))
            continue
        n = n_int + n_leaves
        # internal nodes first (LightGBM's order, root 0), then leaf j as node n_int + j:
        # children follow their parent, as TreeStack needs
        feature = np.full(n, -1, dtype=np.int64)
        threshold = np.zeros(n)
        left = np.full(n, -1, dtype=np.int64)
        right = np.full(n, -1, dtype=np.int64)
        value = np.zeros((n, n_classes))
        feature[:n_int] = t.split_feature
        threshold[:n_int] = effective_thresholds(t.threshold)
        left[:n_int] = np.where(t.left >= 0, t.left, n_int + ~t.left)
        right[:n_int] = np.where(t.right >= 0, t.right, n_int + ~t.right)
        value[n_int:, 1 if binary else i % k] = t.leaf_value * scale
        trees.add_skipping_inf(feature, threshold, left, right, value)
    # categorical splits unfold into more nodes than the file has
    check_size("LightGBM model", n_classes=n_classes, n_nodes=trees.n_nodes)
    if model.objective == "multiclassova":
        _check_ova_resolves(model, scale)
    return trees.ensemble(
        kind=f"LightGBM({model.objective})",
        n_features=model.n_features_in_,
        classes=list(range(n_classes)) if model.labels is None else list(model.labels),
        feature_names=list(model.feature_names),
        base=np.zeros(n_classes),
        # binary: class 1 iff sigmoid(raw) > 0.5, so raw = 0 is class 0; multiclass:
        # argmax, first index on a tie (both "low")
        tie_break="low",
        split_rule=FLOAT64_LE,
    )


#: Largest ``sigmoid * raw score`` a multiclassova model may reach: below it, two classes
#: whose float64 probabilities round to the same value have raw scores within the
#: engine's least near-tie margin (1e-9), where it asks the model; the probabilities'
#: spacing, 2**-53 near 1, over sigmoid's slope ``p (1 - p) >= exp(-x) / 4``, with a
#: factor 4 for exp's and the division's rounding: ``2**-49 exp(x) / sigmoid <= 1e-9``.
#: Beyond it, LightGBM picks the first class among probabilities that all read 1.0
#: (raw scores 191 and 296, say), a decision no sum of leaves makes.
_OVA_RESOLVED = math.log(1e-9 * 2.0**49)
#: Least ``sigmoid * raw score``: below about -708 the probabilities are subnormal and
#: then 0, and tie as well.
_OVA_LEAST = -700.0


def _check_ova_resolves(model: LightGBMModel, scale: float) -> None:
    """Refuse a multiclassova model whose raw scores reach where its sigmoid
    probabilities merge far beyond a near tie (see :data:`_OVA_RESOLVED`): the bounds are
    each class's sums of its trees' largest and least leaves.

    Raises
    ------
    UnsupportedModelError
    """
    k = model.n_tree_per_iteration
    hi, lo = np.zeros(k), np.zeros(k)
    for i, t in enumerate(model.trees):
        hi[i % k] += float(t.leaf_value.max()) * scale
        lo[i % k] += float(t.leaf_value.min()) * scale
    top = model.sigmoid * float(hi.max())
    least = model.sigmoid * float(lo.min())
    limit = _OVA_RESOLVED + math.log(model.sigmoid)
    if top > limit or least < _OVA_LEAST:
        raise UnsupportedModelError(
            f"LightGBM multiclassova model: its raw scores reach {top / model.sigmoid:.4g} "
            f"(at least {least / model.sigmoid:.4g}), where the per-class sigmoid "
            "probabilities of classes far apart round to the same float64 value (1.0) and "
            "LGBMClassifier.predict takes the first of them, a decision the maps cannot "
            f"follow exactly (they can while sigmoid x raw score stays within "
            f"[{_OVA_LEAST:g}, {limit:.3g}]); train with objective='multiclass', a smaller "
            "learning rate or fewer trees")


def _unfolded(t: _Tree, n_classes: int, column: int, scale: float,
              where: str) -> tuple[np.ndarray, ...]:
    """The node arrays (feature, threshold, left, right, value) of a tree with categorical
    splits, each unfolded into plain ``x <= t`` splits (see the module docs)."""
    thresholds = effective_thresholds(t.threshold)
    cat = t.categorical()
    cuts, sides = [], []
    for nd in range(t.split_feature.size):
        if cat[nd]:
            c, inside = code_set_cuts(t.codes(nd), strict=False, lowest=-1.0)
            cuts.append(c)
            sides.append(~inside)  # in the set: left
        else:
            cuts.append(thresholds[nd:nd + 1])
            sides.append(np.array([False, True]))
    leaf_values = np.zeros((t.leaf_value.size, n_classes))
    leaf_values[:, column] = t.leaf_value * scale
    return unfold_tree(t.split_feature, cuts, sides, t.left, t.right, leaf_values,
                       MAX_UNFOLDED_NODES, f"LightGBM model, {where}")


def from_lightgbm(model: Any) -> LightGBMModel:
    """The parsed model of a LightGBM object in memory, read through its own text dump.

    A ``lightgbm.Booster`` or a fitted scikit-learn wrapper (``LGBMClassifier``) writes
    the file ``save_model`` would (``model_to_string``: the best iteration when early
    stopping stored one, which is also what their ``predict`` uses); lightgbm itself is
    never imported. A wrapper's ``classes_`` become the labels.

    Raises
    ------
    UnsupportedModelError
        An unfitted wrapper, an object that is no model, or a model the file format
        refuses (see :func:`parse_lightgbm`).
    """
    kind = type(model).__name__
    booster, wrapper = model, hasattr(model, "fit")  # the wrappers are scikit-learn estimators
    labels = None
    if wrapper:
        try:
            booster = model.booster_
        except Exception:  # lightgbm raises its own LGBMNotFittedError
            # A wrapper pickled by LightGBM < 4 lacks the attributes later versions check
            # for "fitted" (its booster_ and classes_ both raise), yet holds its booster
            # and labels: read those, or it is truly not fitted.
            booster = getattr(model, "_Booster", None)
            labels = getattr(model, "_classes", None)
            if booster is None or labels is None:
                raise UnsupportedModelError(f"the {kind} is not fitted") from None
    return parse_dump(model, booster, wrapper, "model_to_string", (), parse_lightgbm,
                      "LightGBM", "a fitted LGBMClassifier or a lightgbm.Booster", labels)


class LightGBMAdapter:
    """The registry's adapter for LightGBM models: parsed text files, and the library's
    own objects, read through their text dump (:func:`from_lightgbm`)."""

    name: str = "lightgbm"
    supported: tuple[str, ...] = ("LightGBM text model (binary, multiclass, multiclassova), "
                                  "LGBMClassifier, lightgbm.Booster",)

    def accepts(self, model: Any) -> bool:
        return isinstance(model, LightGBMModel) or library_of(model) == "lightgbm"

    def prepare(self, model: Any) -> LightGBMModel:
        return model if isinstance(model, LightGBMModel) else from_lightgbm(model)

    def check(self, model: Any) -> None:
        for i, t in enumerate(model.trees):  # parse_lightgbm checked; models built in code too
            _check_tree(t, model.n_features_in_, f"tree {i}")

    def flatten(self, model: Any) -> FlatEnsemble:
        return flatten(model)


LIGHTGBM = LightGBMAdapter()
