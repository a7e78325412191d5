"""XGBoost classifiers, read from the JSON or UBJSON file ``save_model`` writes: parsed
here, never loaded through XGBoost.

What the file says, and how it maps to a :class:`~maps_core.ensemble.FlatEnsemble`:

* ``learner.objective.name``: ``binary:logistic`` (one score, class 1 iff the float32
  probability exceeds 0.5), ``multi:softprob`` (one score per class, argmax of the
  float32 softmax, first index on a tie) and ``multi:softmax`` (one score per class,
  argmax of the float32 scores themselves, first index on a tie: two scores an ulp
  apart can round to the same probability, and then the two objectives disagree);
* ``learner_model_param.base_score``: stored as a probability for ``binary:logistic``
  (the margin it adds is ``-log(1/p - 1)``), as a margin for the multiclass objectives;
  a scalar or one value per class (``"[5E-1]"``);
* ``gradient_booster.model.tree_info``: the class each tree adds to;
* ``learner.attributes.best_iteration`` (written by early stopping): ``XGBClassifier.predict``
  then uses only boosting rounds ``0..best_iteration``, so only their trees are read. A
  round is the trees between two entries of ``gradient_booster.model.iteration_indptr``
  (files of XGBoost < 2 have none: a round is then ``n_groups * num_parallel_tree``
  trees, ``num_parallel_tree`` as :func:`_trees_per_round` finds it in files of XGBoost
  < 1.6, which do not store it); ``best_iteration = -1`` means every round, as in XGBoost.
  An ``xgboost.Booster`` object is read with every round, as its own ``predict`` uses them
  (:func:`from_xgboost`);
* ``learner.attributes.scikit_learn`` (files XGBoost 1.x's scikit-learn wrapper saved: its
  parameters and fitted attributes as JSON text): its ``classes_`` are the labels, and a
  number as its ``missing`` is refused, as on the wrapper itself;
* every tree's ``split_conditions`` hold the float32 thresholds of its internal nodes and
  the leaf values of its leaves (``left_children == -1``); a split sends ``x`` left iff
  ``float32(x) < threshold`` (split rule ``float32<``); ``default_left`` routes missing
  values, which cfmaps refuses in queries (NaN only: the scikit-learn wrapper's
  ``missing`` parameter is not saved, and the reloaded file reads every other value as a
  number, as the maps do);
* XGBoost sums the leaf values in float32, tree by tree after the base margin: the flat
  ensemble says so (``score_precision="float32"``), so certificates keep a margin wide
  enough for float32 rounding and the engine decides the closer cells with
  :meth:`XGBoostModel.predict`, which repeats XGBoost's float32 arithmetic.

Categorical splits (``enable_categorical``; ``split_type`` 1, their codes in
``categories`` at ``categories_segments``/``categories_sizes`` of the node listed in
``categories_nodes``) send ``x`` *right* when its code is in the node's set: XGBoost reads
``float32(x)`` as the code ``int(float32(x))`` and sends a negative value, and a code past
the set's, left. So code ``c`` is ``float32(x)`` in ``[c, c + 1)``, and each such split
becomes a balanced chain of ``float32(x) < c`` splits, one interval per run of codes, with
a copy of the child subtree below each run (as LightGBM's: see
:func:`~maps_core.adapters._trees.unfold_tree`); codes must lie below ``2**24``, where
float32 holds every integer. Files of XGBoost 1.6 (``"version": [1, 6, ...]``) follow its
rule: an invalid code (negative, or at or past the node's bit set, whose 32-bit words
reach its largest code) goes the node's default way (``default_left``; :func:`_cuts_16`).
Files of XGBoost 1.5 follow its own: a value in (-1, 0) is code 0 (C's truncation toward
zero), not an invalid code. XGBoost 1.3 and 1.4 (categorical splits from ``gpu_hist``
only) read a file's categorical split as a numeric one at its ``split_conditions``, where
later versions read a category set: those files are refused.
XGBoost 1.5-2.0 wrote NaN as a categorical split's condition, which no one reads. A
model fitted on pandas ``category`` columns stores their
categories (``model.cats``); numeric ones other than ``0..n-1`` are refused
(:func:`~maps_core.adapters._trees.check_category_values`).

Refused, naming the reason: ``dart`` and ``gblinear`` boosters, regression, ranking and
other objectives, multi-target models and
multi-output trees (``multi_strategy="multi_output_tree"``, vector leaves), and models beyond
the size limits of :mod:`maps_core.adapters._trees` (features, classes, nodes times classes),
which are checked before anything is allocated for them.

The file is JSON when its first byte other than a UTF-8 byte order mark and JSON
whitespace is ``{`` followed, after optional whitespace, by ``"`` or ``}``; otherwise it is
read as UBJSON, whose ``{`` is followed by a key's length marker.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ensemble import FlatEnsemble
from ..exceptions import UnsupportedModelError
from ..splits import FLOAT32_LT
from ._trees import (
    MAX_UNFOLDED_NODES,
    TreeStack,
    check_category_values,
    check_size,
    class_labels,
    code_set_cuts,
    library_of,
    parse_dump,
    unfold_tree,
)

__all__ = ["MAX_UNFOLDED_NODES", "XGBOOST", "XGBoostAdapter", "XGBoostModel", "from_xgboost",
           "is_json", "parse_xgboost"]
#: Categories are integers below this (float32 holds every integer up to it).
_MAX_CODE = 1 << 24
#: The least float32 above -1: XGBoost 1.5 reads float32(x) from here to 1 as code 0.
_ABOVE_MINUS_ONE = float(np.nextafter(np.float32(-1), np.float32(0)))

_OBJECTIVES = ("binary:logistic", "multi:softprob", "multi:softmax")


@dataclass
class _Tree:
    left: np.ndarray  # (n,) int, -1 at leaves
    right: np.ndarray
    feature: np.ndarray  # (n,) int
    value: np.ndarray  # (n,) float32: threshold at internal nodes, leaf value at leaves
    group: int  # the class the tree adds to
    # categorical splits: node -> the codes it sends right, increasing
    categories: dict[int, np.ndarray] = field(default_factory=dict)
    # XGBoost 1.6's rule for an invalid code at a categorical split (negative, or past the
    # node's bit set): the node's default way (default_left, (n,) bool), not left
    default_left: np.ndarray | None = None
    # XGBoost 1.5's: a value in (-1, 0) is code 0 (C's truncation toward zero), not invalid
    rule_15: bool = False


@dataclass
class XGBoostModel:
    """An XGBoost classifier as its saved model file describes it.

    Attributes
    ----------
    n_classes : int
    n_features_in_ : int
    feature_names : list of str or None
    objective : str
    base_margin : ndarray of shape (n_groups,), float32
        What every score starts from (one group for binary models).
    trees : list
    labels : list, optional
        Class labels in index order, when known (a fitted ``XGBClassifier``'s
        ``classes_``); a file alone stores indices 0..K-1.
    """

    n_classes: int
    n_features_in_: int
    feature_names: list[str] | None
    objective: str
    base_margin: np.ndarray
    trees: list[_Tree] = field(repr=False)
    labels: list[Any] | None = None

    @property
    def classes_(self) -> np.ndarray:
        """Class labels: ``labels``, else the indices 0..K-1 a file stores (name them in
        the spec)."""
        return np.arange(self.n_classes) if self.labels is None else np.asarray(self.labels)

    def margins(self, X: np.ndarray) -> np.ndarray:
        """Scores as XGBoost computes them: float32, the base margin first, then every
        tree in order, shape (n, n_groups)."""
        X32 = np.asarray(X, dtype=np.float64).astype(np.float32)
        out = np.tile(self.base_margin, (X32.shape[0], 1))
        for t in self.trees:
            out[:, t.group] = (out[:, t.group] + _tree_values(t, X32)).astype(np.float32)
        return out

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities in float32 as XGBoost's predict, shape (n, n_classes)."""
        m = self.margins(X)
        one = np.float32(1.0)
        if self.objective == "binary:logistic":
            p = one / (one + _expf(-m[:, 0]))
            return np.column_stack([one - p, p]).astype(np.float32)
        e = _expf((m - m.max(axis=1, keepdims=True)).astype(np.float32))
        # XGBoost's Softmax sums the float32 exponentials in a double, in class order, and
        # divides by that sum rounded to float32 (a float32 sum decided near ties the
        # other way: a QA fuzz)
        wsum = np.cumsum(e.astype(np.float64), axis=1)[:, -1:].astype(np.float32)
        return (e / wsum).astype(np.float32)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Class labels as ``XGBClassifier.predict``: class 1 iff the float32 probability
        exceeds 0.5; with ``multi:softmax``, the first index of the highest score (the
        booster's own transform, before any softmax); else the first index of the highest
        probability."""
        if self.objective == "multi:softmax":
            index = np.argmax(self.margins(X), axis=1)
        elif self.objective == "binary:logistic":
            index = (self.predict_proba(X)[:, 1] > np.float32(0.5)).astype(np.int64)
        else:
            index = np.argmax(self.predict_proba(X), axis=1)
        return self.classes_[index]


def _expf(x: np.ndarray) -> np.ndarray:
    """``expf`` as C's libm computes it, correctly rounded to float32. numpy's own float32
    exp may be an ulp off (a vectorised approximation), which is enough to turn a
    probability of 0.50000006 into 0.5 and flip XGBoost's decision at a margin of 1e-7."""
    return np.exp(np.asarray(x, dtype=np.float64)).astype(np.float32)


def _tree_values(t: _Tree, X32: np.ndarray) -> np.ndarray:
    n = X32.shape[0]
    node = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        nd = node[active]
        inner = t.left[nd] >= 0
        active, nd = active[inner], nd[inner]
        if not active.size:
            break
        v = X32[active, t.feature[nd]]
        go_left = v < t.value[nd]
        for c, codes in t.categories.items():
            at = nd == c
            if at.any():
                u = v[at]
                # False for NaN: XGBoost's invalid codes
                ok = ((u > -1) if t.rule_15 else (u >= 0)) & (u < _MAX_CODE)
                code = np.where(ok, u, 0).astype(np.int64)  # (truncated toward zero)
                out = ~(ok & np.isin(code, codes))
                if t.default_left is not None:  # XGBoost 1.6: invalid codes go the default way
                    valid = (u >= 0) & (u < _bit_set_end(codes))
                    out = np.where(valid, out, bool(t.default_left[c]))
                go_left[at] = out
        node[active] = np.where(go_left, t.left[nd], t.right[nd])
    return t.value[node]


# -- reading the file ---------------------------------------------------------------------
def _ubjson(data: bytes) -> Any:
    """Decode the UBJSON XGBoost writes (objects, arrays, optimized typed arrays)."""
    pos = 0
    fixed = {b"i": ">b", b"U": ">B", b"I": ">h", b"l": ">i", b"L": ">q", b"d": ">f", b"D": ">d"}

    def need(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise UnsupportedModelError("XGBoost UBJSON model file is truncated")
        out = data[pos:pos + n]
        pos += n
        return out

    def number(marker: bytes) -> Any:
        fmt = fixed.get(marker)
        if fmt is None:
            raise UnsupportedModelError(f"XGBoost UBJSON: unknown type marker {marker!r}")
        return struct.unpack(fmt, need(struct.calcsize(fmt)))[0]

    def length() -> int:
        # a string's length or a container's count: an integer marker, never negative
        # (need() of a negative size would move backwards and could loop)
        marker = need(1)
        if marker not in (b"i", b"U", b"I", b"l", b"L"):
            raise UnsupportedModelError(f"XGBoost UBJSON: a length of type {marker!r}")
        n = int(number(marker))
        if n < 0:
            raise UnsupportedModelError(f"XGBoost UBJSON: a negative length {n}")
        return n

    def string() -> str:
        return need(length()).decode("utf-8")

    def value(marker: bytes) -> Any:
        if marker in fixed:
            return number(marker)
        if marker == b"S":
            return string()
        if marker == b"T":
            return True
        if marker == b"F":
            return False
        if marker == b"Z":
            return None
        if marker in (b"[", b"{"):
            return container(marker)
        raise UnsupportedModelError(f"XGBoost UBJSON: unknown type marker {marker!r}")

    def container(open_: bytes) -> Any:
        nonlocal pos
        typ = count = None
        if data[pos:pos + 1] == b"$":
            pos += 1
            typ = need(1)
        if data[pos:pos + 1] == b"#":
            pos += 1
            count = length()
            # Every element reads at least one byte, except in an array typed Z, T or F,
            # which reads none: a 20-byte file could declare 2**62 of them. No file holds
            # more elements than the bytes left, so a count beyond them is refused.
            if count > len(data) - pos:
                raise UnsupportedModelError(
                    f"XGBoost UBJSON model file is truncated or malformed: a container of {count} "
                    f"elements in {len(data) - pos} bytes")
        if open_ == b"[":
            if typ is not None and count is not None and typ in fixed:
                fmt = fixed[typ]
                size = struct.calcsize(fmt)
                return np.frombuffer(need(size * count), dtype=np.dtype(fmt)).tolist()
            items: list[Any] = []
            while count is None or len(items) < count:
                if typ is not None:  # typed: no marker per item
                    items.append(value(typ))
                    continue
                m = need(1)
                if count is None and m == b"]":
                    break
                items.append(value(m))
            return items
        obj: dict[str, Any] = {}
        while count is None or len(obj) < count:
            if count is None and data[pos:pos + 1] == b"}":
                pos += 1
                break
            key = string()
            obj[key] = value(typ if typ is not None else need(1))
        return obj

    if need(1) != b"{":
        raise UnsupportedModelError("not an XGBoost model file")
    return container(b"{")


_JSON_SPACE = b" \t\n\r"


def is_json(data: bytes) -> bool:
    """Whether an XGBoost model file (or its first bytes) is JSON rather than UBJSON.

    Both start with ``{`` (JSON after an optional UTF-8 byte order mark and whitespace);
    in JSON the next character other than whitespace is ``"`` (a key) or ``}``, in UBJSON
    the next byte is a key's length marker (``i``, ``U``...) or a container header
    (``$``, ``#``). An empty UBJSON object ``{}`` reads the same either way.
    """
    text = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    text = text.lstrip(_JSON_SPACE)
    if text[:1] != b"{":
        return False
    return text[1:].lstrip(_JSON_SPACE)[:1] in (b'"', b"}")


def _base_score(text: Any) -> np.ndarray:
    if isinstance(text, int | float):
        return np.array([text], dtype=np.float32)
    values = str(text).strip().strip("[]").split(",")
    try:
        return np.array([float(v) for v in values if v.strip()], dtype=np.float32)
    except ValueError:
        raise UnsupportedModelError(f"XGBoost model file: base_score {text!r} is not a number") from None


def _logit32(p: np.float32) -> np.float32:
    """XGBoost's margin of a base probability: ``-log(1/p - 1)``, the inner part in
    float32 (its ProbToMargin), the logarithm correctly rounded."""
    q = np.float32(np.float32(1.0) / p) - np.float32(1.0)
    return np.float32(-math.log(float(q)))


def parse_xgboost(data: bytes, *, every_round: bool = False) -> XGBoostModel:
    """Parse an XGBoost model file (JSON or UBJSON, as ``save_model`` writes).

    Parameters
    ----------
    data : bytes
        The file's content.
    every_round : bool
        Read the trees of every boosting round even when early stopping stored
        ``best_iteration``: ``Booster.predict`` uses them all unless told otherwise, while
        ``XGBClassifier.predict`` (the default, and what a file stands for) stops there.

    Raises
    ------
    UnsupportedModelError
        A truncated or malformed file, or a model cfmaps cannot represent (see the module
        docs), naming what is wrong.
    """
    try:
        doc = json.loads(data) if is_json(data) else _ubjson(data)
    except (ValueError, UnicodeDecodeError) as exc:
        # json's own errors, and Python's limit on an integer's digits (4,300): a plain
        # ValueError that no model file triggers
        raise UnsupportedModelError(f"XGBoost JSON model file is truncated or malformed: {exc}") from None
    except RecursionError:  # arrays nested thousands deep: no model file is
        raise UnsupportedModelError("XGBoost model file: nested too deeply") from None
    try:
        return _model(doc, every_round)
    except (OverflowError, RecursionError) as exc:
        # an integer beyond int64 where the file should hold an index, or a number beyond
        # float64: a malformed file like any other (never an unhandled error)
        raise UnsupportedModelError(f"XGBoost model file: a number out of range ({exc})") from None


def _model(doc: Any, every_round: bool = False) -> XGBoostModel:
    """The model a decoded XGBoost file describes (see :func:`parse_xgboost`)."""
    try:
        learner = doc["learner"]
        booster = learner["gradient_booster"]
        objective = learner["objective"]["name"]
        param = learner["learner_model_param"]
        attributes = learner.get("attributes") or {}
    except (KeyError, TypeError, AttributeError):
        raise UnsupportedModelError("XGBoost model file: no learner, booster or objective") from None
    if not all(isinstance(d, dict) for d in (booster, param, attributes)):
        raise UnsupportedModelError("XGBoost model file: malformed learner")
    if booster.get("name") != "gbtree":
        raise UnsupportedModelError(
            f"XGBoost booster {booster.get('name')!r} is not supported (only gbtree: dart and "
            "gblinear models are not piecewise constant in the way cfmaps needs)")
    model_doc = booster.get("model")
    drop = model_doc.get("weight_drop") if isinstance(model_doc, dict) else None
    if drop is not None and (not isinstance(drop, list) or any(w != 1 for w in drop)):
        # XGBoost >= 3.4 saves a dart model (deprecated there) as "gbtree" with its trees'
        # weights: read as plain trees it answered wrong on 14 of 300 points
        raise UnsupportedModelError(
            "XGBoost dart models (trees weighted by weight_drop) are not supported: train "
            "with booster='gbtree'")
    if objective not in _OBJECTIVES:
        raise UnsupportedModelError(
            f"XGBoost objective {objective!r} is not a classifier cfmaps supports "
            f"({', '.join(_OBJECTIVES)})")
    try:
        n_features = int(param["num_feature"])
        num_class = int(param.get("num_class", 0))
        num_target = int(param.get("num_target", 1))
        model = booster["model"]
        tree_docs = model["trees"]
        tree_info = _integers(model["tree_info"]).tolist()
        per_round_doc = model.get("gbtree_model_param", {}).get("num_parallel_tree")
        indptr_doc = model.get("iteration_indptr")
        indptr = None if indptr_doc is None else _integers(indptr_doc).tolist()
        best_doc = attributes.get("best_iteration")
        best = None if best_doc is None else int(str(best_doc))  # as XGBoost's Python reads it
        leaf_sizes = [int(t.get("tree_param", {}).get("size_leaf_vector", 1)) for t in tree_docs]
        version = tuple(int(v) for v in doc.get("version", ()))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UnsupportedModelError("XGBoost model file: malformed model parameters") from None
    wrapper = _wrapper_params(attributes)
    missing = wrapper.get("missing")
    if missing is not None and not _is_nan(missing):
        raise UnsupportedModelError(
            f"XGBoost model file: the XGBClassifier that saved it treats {missing!r} as "
            "missing (its missing parameter), which cfmaps cannot represent: train with the "
            "default missing=nan")
    per_round = _trees_per_round(per_round_doc, wrapper, attributes, best)
    if num_target != 1:
        raise UnsupportedModelError("XGBoost multi-target models are not supported")
    if any(s > 1 for s in leaf_sizes):
        raise UnsupportedModelError(
            "XGBoost multi-output trees (multi_strategy='multi_output_tree', one leaf vector "
            "for all classes) are not supported; train with the default "
            "multi_strategy='one_output_per_tree'")
    binary = objective == "binary:logistic"
    n_classes = 2 if binary else num_class
    n_groups = 1 if binary else num_class
    if n_classes < 2 or len(tree_info) != len(tree_docs):
        raise UnsupportedModelError("XGBoost model file: inconsistent classes or tree_info")
    # before the base scores, feature names and schema are built for what the file claims
    check_size("XGBoost model file", n_features=n_features, n_classes=n_classes)
    n_used = _trees_used(len(tree_docs), indptr, n_groups * per_round,
                         None if every_round else best)
    labels = _wrapper_labels(wrapper, n_classes)
    tree_docs, tree_info = tree_docs[:n_used], tree_info[:n_used]
    base = _base_score(param.get("base_score", "0.5"))
    if base.size == 1:
        base = np.repeat(base, n_groups)
    if base.size != n_groups:
        raise UnsupportedModelError(f"XGBoost model file: {base.size} base scores for {n_groups} groups")
    if not np.all(np.isfinite(base)):
        raise UnsupportedModelError(f"XGBoost model file: a non-finite base_score {base.tolist()}")
    if binary:
        if not 0.0 < float(base[0]) < 1.0:
            raise UnsupportedModelError(
                f"XGBoost model file: base_score {base[0]} is no probability (XGBoost writes "
                "0 or 1 for a classifier fitted on a single class, which has no other class "
                "to explain)")
        base = np.array([_logit32(base[0])], dtype=np.float32)
    _check_stored_categories(model.get("cats"))
    names = learner.get("feature_names") or None
    if names is not None and len(names) != n_features:
        raise UnsupportedModelError(
            f"XGBoost model file: {len(names)} feature names for {n_features} features")
    trees = [_tree(t, g, n_features, n_groups, i, version)
             for i, (t, g) in enumerate(zip(tree_docs, tree_info, strict=True))]
    if not trees:
        raise UnsupportedModelError("XGBoost model file: no trees")
    # refused here, at upload, rather than when flatten() allocates the value matrix
    check_size("XGBoost model file", n_classes=n_classes, n_nodes=sum(t.left.size for t in trees))
    return XGBoostModel(n_classes=n_classes, n_features_in_=n_features,
                        feature_names=[str(n) for n in names] if names else None,
                        objective=objective, base_margin=base.astype(np.float32), trees=trees,
                        labels=labels)


def _wrapper_params(attributes: dict[str, Any]) -> dict[str, Any]:
    """The parameters and fitted attributes of the scikit-learn wrapper that saved the
    file (``attributes.scikit_learn``, a JSON text; XGBoost 1.x writes them all, 2.x only
    ``_estimator_type``), empty when there is none.

    Raises
    ------
    UnsupportedModelError
        When the text is no JSON object.
    """
    text = attributes.get("scikit_learn")
    if text is None:
        return {}
    try:
        params = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        params = None
    if not isinstance(params, dict):
        raise UnsupportedModelError("XGBoost model file: malformed scikit_learn attribute")
    return params


def _trees_per_round(stored: Any, wrapper: dict[str, Any], attributes: dict[str, Any],
                     best: int | None) -> int:
    """Trees per class in one boosting round (``num_parallel_tree``).

    Files of XGBoost >= 1.6 store it. Older ones do not, and neither does XGBoost read it
    from them: a forest (``XGBRFClassifier``, ``num_parallel_tree > 1``) saved by 1.5 loads
    in later versions as one tree per round, and its early-stopping limit then keeps a
    fraction of its trees. What the fitted model used is read instead from the wrapper's
    saved parameters (XGBoost 1.x's ``attributes.scikit_learn``), else from
    ``best_ntree_limit`` (``(best_iteration + 1) * num_parallel_tree``, XGBoost 1.4-1.5),
    else 1: a file of XGBoost < 1.4 saved from a ``Booster`` records no more (see the
    README).

    Raises
    ------
    UnsupportedModelError
        When those records are no positive integers or disagree.
    """
    try:
        if stored is not None:
            return int(stored)
        saved = wrapper.get("num_parallel_tree")
        limit = attributes.get("best_ntree_limit")
        from_limit = None
        if limit is not None and best is not None and best >= 0:
            n, r = divmod(int(str(limit)), best + 1)
            from_limit = n if r == 0 else -1
    except (TypeError, ValueError):
        raise UnsupportedModelError("XGBoost model file: malformed num_parallel_tree or "
                                    "best_ntree_limit") from None
    if saved is not None and (type(saved) is not int or saved < 1):
        raise UnsupportedModelError("XGBoost model file: malformed num_parallel_tree")
    if from_limit is not None and (from_limit < 1 or saved not in (None, from_limit)):
        raise UnsupportedModelError(
            f"XGBoost model file: best_ntree_limit {limit} is not best_iteration + 1 = "
            f"{(best or 0) + 1} rounds of num_parallel_tree trees")
    return saved or from_limit or 1


def _wrapper_labels(wrapper: dict[str, Any], n_classes: int) -> list[Any] | None:
    """The class labels the saving wrapper predicted (its ``classes_``: XGBoost 1.3-1.5
    encoded labels such as ``[3, 7, 11]`` and decoded them in ``predict``), or None."""
    labels = wrapper.get("classes_")
    if labels is None:
        return None
    if not isinstance(labels, list) or not all(
            isinstance(v, str | int | float) and not (isinstance(v, float) and math.isnan(v))
            for v in labels):
        raise UnsupportedModelError("XGBoost model file: malformed classes_ in the scikit_learn "
                                    "attribute")
    return class_labels(labels, n_classes, "XGBoost model file")


def _check_stored_categories(cats: Any) -> None:
    """Refuse numeric pandas categories that are not their own codes (XGBoost 3.1+ stores
    each feature's categories in ``model.cats.enc``: numbers as ``values``, strings as
    ``offsets`` into bytes; see :func:`~maps_core.adapters._trees.check_category_values`)."""
    if cats is None:
        return
    enc = cats.get("enc") if isinstance(cats, dict) else None
    if not isinstance(enc, list) or not all(isinstance(e, dict) for e in enc):
        raise UnsupportedModelError("XGBoost model file: malformed stored categories (cats)")
    for j, e in enumerate(enc):
        if e.get("offsets"):
            continue  # strings: a query can only name them by their codes
        values = e.get("values") or []
        if not isinstance(values, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise UnsupportedModelError("XGBoost model file: malformed stored categories (cats)")
        check_category_values(values, f"XGBoost model file, feature #{j}")


def _trees_used(n_trees: int, indptr: list[int] | None, per_round: int, best: int | None) -> int:
    """How many trees (the first ones) ``XGBClassifier.predict`` uses: all, or those of
    rounds ``0..best`` when early stopping stored ``best_iteration`` (see the module docs).

    Raises
    ------
    UnsupportedModelError
        When the round layout disagrees with the trees, or ``best`` names a round the
        file does not have (XGBoost's own predict fails on such a file).
    """
    if indptr is None:  # XGBoost < 2: every round has the same trees
        if per_round < 1 or n_trees % per_round:
            raise UnsupportedModelError(
                f"XGBoost model file: {n_trees} trees are not rounds of {per_round}")
        indptr = list(range(0, n_trees + 1, per_round))
    elif (not indptr or indptr[0] != 0 or indptr[-1] != n_trees
          or any(b < a for a, b in zip(indptr, indptr[1:], strict=False))):
        raise UnsupportedModelError("XGBoost model file: iteration_indptr disagrees with the trees")
    rounds = len(indptr) - 1
    if best is None or best == -1:  # XGBoost: iteration_range (0, 0) is every round
        return n_trees
    if not 0 <= best < rounds:
        raise UnsupportedModelError(
            f"XGBoost model file: best_iteration {best} is not one of its {rounds} rounds")
    return indptr[best + 1]


def _integers(values: Any) -> np.ndarray:
    """A list of JSON integers as int64, shape (n,).

    ``np.asarray(..., dtype=np.int64)`` would truncate 2.5 to 2 and parse the string "2",
    so a file XGBoost itself refuses would load as a different model.

    Raises
    ------
    ValueError, OverflowError
        When an element is no integer (a bool neither) or does not fit in int64.
    """
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ValueError("not a list of integers")
    return np.asarray(values, dtype=np.int64)


def _tree(doc: dict[str, Any], group: int, n_features: int, n_groups: int, i: int,
          version: tuple[int, ...] = ()) -> _Tree:
    """Tree ``i`` of the file, adding to class ``group``. Its categorical splits follow
    the rule of the XGBoost ``version`` that wrote it (the file's ``version``; none: the
    current rule): 1.6 sends an invalid code the node's default way, 1.5 reads a value in
    (-1, 0) as code 0, and 1.3-1.4, which read such a split as a numeric one, are refused."""
    where = f"tree {i}"
    try:
        left = _integers(doc["left_children"])
        right = _integers(doc["right_children"])
        feature = _integers(doc["split_indices"])
        value = np.asarray(doc["split_conditions"], dtype=np.float64).astype(np.float32)
        split_type = _integers(doc.get("split_type", []))
        cat_nodes = _integers(doc.get("categories_nodes", []))
        segments = _integers(doc.get("categories_segments", []))
        sizes = _integers(doc.get("categories_sizes", []))
        codes = _integers(doc.get("categories", []))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        raise UnsupportedModelError(f"XGBoost model file: malformed {where}") from None
    categorical = np.flatnonzero(split_type != 0)
    ok = (split_type.size in (0, left.size) and bool(np.all((split_type == 0) | (split_type == 1)))
          and np.array_equal(np.sort(cat_nodes), categorical)
          and segments.shape == sizes.shape == cat_nodes.shape
          and bool(np.all((segments >= 0) & (sizes >= 0) & (segments + sizes <= codes.size)))
          and bool(np.all((codes >= 0) & (codes < _MAX_CODE))))
    if not ok:
        raise UnsupportedModelError(
            f"XGBoost model file: malformed categorical split ({where}): split_type, "
            "categories_nodes, _segments, _sizes and categories disagree, or a category is "
            f"not an integer in [0, 2**24)")
    cats = {int(nd): np.unique(codes[a:a + k]) for nd, a, k in zip(cat_nodes, segments, sizes, strict=True)}
    if cats and version and version[:2] < (1, 5):
        # Probed in XGBoost 1.3.3 and 1.4.2: their loaders read every split as
        # float32(x) < split_condition, while later versions read the same file's split as
        # a category set: two models in one file.
        raise UnsupportedModelError(
            f"XGBoost model file: a categorical split ({where}) in a file of XGBoost "
            f"{'.'.join(map(str, version))}, which reads it as a numeric split where later "
            "versions read a category set, so the model it holds is ambiguous: retrain it with "
            "XGBoost >= 1.6")
    default_left = None
    if version[:2] == (1, 6) and cats:
        try:
            dl = _integers(doc["default_left"])
        except (KeyError, TypeError, ValueError, OverflowError):
            dl = np.zeros(0, dtype=np.int64)
        if dl.shape != left.shape or not bool(np.all((dl == 0) | (dl == 1))):
            raise UnsupportedModelError(f"XGBoost model file: malformed default_left ({where})")
        default_left = dl.astype(bool)
    t = _Tree(left=left, right=right, feature=feature, value=value, group=group, categories=cats,
              default_left=default_left, rule_15=version[:2] == (1, 5))
    _check_tree(t, n_features, n_groups, where)
    return t


def _check_tree(t: _Tree, n_features: int, n_groups: int, where: str) -> None:
    """Refuse structures that would crash or loop: every node but the root is a child
    exactly once, children come after their parent, features are in range."""
    n = t.left.size
    ok = n > 0 and t.right.size == n and t.feature.size == n and t.value.size == n
    ok = ok and 0 <= t.group < n_groups
    if ok:
        inner = t.left >= 0
        # Leaves need finite values. A split condition may be +-inf: "exact" trees on
        # values near float32's largest store the overflowing midpoint, and
        # float32(x) < inf sends right exactly the inputs beyond float32's range (the
        # split rule's real boundaries handle it), float32(x) < -inf none left. A
        # categorical split's condition is unused: XGBoost 1.5-2.0 wrote NaN there.
        numeric = inner.copy()
        numeric[[nd for nd in t.categories if 0 <= nd < n]] = False
        ok = (bool(np.all(np.isfinite(t.value[~inner])))
              and not bool(np.any(np.isnan(t.value[numeric]))))
        idx = np.arange(n)
        kids = np.concatenate([t.left[inner], t.right[inner]])
        ok = (ok and np.array_equal(inner, t.right >= 0)
              and np.array_equal(np.sort(kids), np.arange(1, n))
              and bool(np.all(t.left[inner] > idx[inner]))
              and bool(np.all(t.right[inner] > idx[inner]))
              and bool(np.all((t.feature[inner] >= 0) & (t.feature[inner] < n_features))))
    ok = ok and all(0 <= nd < n and t.left[nd] >= 0 for nd in t.categories)
    if not ok:
        raise UnsupportedModelError(f"XGBoost model file: malformed tree structure ({where})")


def flatten(model: XGBoostModel) -> FlatEnsemble:
    """The flat ensemble of a parsed XGBoost classifier (see the module docs)."""
    binary = model.objective == "binary:logistic"
    k = model.n_classes
    check_size("XGBoost model", n_features=model.n_features_in_, n_classes=k,
               n_nodes=sum(t.left.size for t in model.trees))
    trees = TreeStack()
    for i, t in enumerate(model.trees):
        inner = t.left >= 0
        value = np.zeros((t.left.size, k))
        value[~inner, 1 if binary else t.group] = t.value[~inner].astype(np.float64)
        if t.categories:
            trees.add(*_unfolded(t, value, f"tree {i}"))
            continue
        trees.add(t.feature, t.value.astype(np.float64), t.left, t.right, value)
    # categorical splits unfold into more nodes than the file has
    check_size("XGBoost model", n_classes=k, n_nodes=trees.n_nodes)
    base = np.zeros(k)
    if binary:
        base[1] = float(model.base_margin[0])
    else:
        base[:] = model.base_margin.astype(np.float64)
    return trees.ensemble(
        kind=f"XGBoost({model.objective})",
        n_features=model.n_features_in_,
        classes=list(range(k)) if model.labels is None else list(model.labels),
        feature_names=model.feature_names,
        base=base,
        tie_break="low",  # binary: a probability of exactly 0.5 is class 0; argmax: first
        split_rule=FLOAT32_LT,
        score_precision="float32",
    )


def _unfolded(t: _Tree, value: np.ndarray, where: str) -> tuple[np.ndarray, ...]:
    """The node arrays (feature, threshold, left, right, value) of a tree with categorical
    splits, each unfolded into plain ``float32(x) < t`` splits (see the module docs);
    ``value`` holds its leaves' rows, shape (n_nodes, n_classes)."""
    cuts, sides = [], []
    for nd in range(t.left.size):
        if nd in t.categories and t.default_left is not None:
            c, inside = _cuts_16(t.categories[nd], bool(t.default_left[nd]))
            cuts.append(c)
            sides.append(inside)
        elif nd in t.categories:
            c, inside = code_set_cuts(t.categories[nd], strict=True)
            if t.rule_15:  # code 0 is (-1, 1): float32(x) >= the float32 just above -1
                c = np.where(c == 0.0, _ABOVE_MINUS_ONE, c)
            cuts.append(c)
            sides.append(inside)  # in the set: right
        else:
            cuts.append(t.value[nd:nd + 1].astype(np.float64))
            sides.append(np.array([False, True]))
    return unfold_tree(t.feature, cuts, sides, t.left, t.right, value, MAX_UNFOLDED_NODES,
                       f"XGBoost model, {where}", is_leaf=t.left < 0)


def _bit_set_end(codes: np.ndarray) -> int:
    """The first code past a categorical node's bit set in XGBoost 1.6: the set takes whole
    32-bit words, up to its largest code."""
    return 32 * (int(np.max(codes)) // 32 + 1)


def _cuts_16(codes: np.ndarray, default_left: bool) -> tuple[np.ndarray, np.ndarray]:
    """A categorical split of XGBoost 1.6 as cuts and sides (True: right) on
    ``float32(x) < t``, as :func:`~maps_core.adapters._trees.code_set_cuts` gives them for
    later versions, except that an invalid code (a negative value, or one at or past
    :func:`_bit_set_end`) goes the node's default way where later versions send it left."""
    end = _bit_set_end(codes)
    c, _ = code_set_cuts(codes, strict=True)
    cuts = np.unique(np.concatenate([c, [0.0, float(end)]]))
    inside = set(int(v) for v in codes)
    # every interval [cuts[j], cuts[j + 1]) holds codes of one kind: read it at its start
    starts = np.concatenate([[-1.0], cuts])
    sides = np.array([(not default_left) if v < 0 or v >= end else int(v) in inside
                      for v in starts])
    return cuts, sides


def from_xgboost(model: Any) -> XGBoostModel:
    """The parsed model of an XGBoost object in memory, read through its own JSON dump.

    An ``xgboost.Booster`` or a fitted scikit-learn wrapper (``XGBClassifier``,
    ``XGBRFClassifier``) writes the file ``save_model`` would (``save_raw("json")``, with
    the best iteration that early stopping stored); xgboost itself is never imported. A
    wrapper's ``classes_`` become the labels. Each object is read as its own ``predict``
    decides: a wrapper's with the trees up to that best iteration, a ``Booster``'s with
    every tree (its ``predict`` ignores ``best_iteration`` unless given an
    ``iteration_range``).

    Raises
    ------
    UnsupportedModelError
        An unfitted wrapper, an object that is no model, a wrapper whose ``missing`` is a
        number (its ``predict`` sends that value the default way, which the file does not
        record), or a model the file format refuses (see :func:`parse_xgboost`).
    """
    kind = type(model).__name__
    booster, wrapper = model, hasattr(model, "get_booster")
    if wrapper:
        try:
            booster = model.get_booster()
        except Exception:  # xgboost raises its own NotFittedError
            raise UnsupportedModelError(f"the {kind} is not fitted") from None
        missing = getattr(model, "missing", None)  # None: NaN, as for a DMatrix
        if missing is not None and not _is_nan(missing):
            raise UnsupportedModelError(
                f"the {kind} treats {missing!r} as missing (its missing parameter), which "
                "cfmaps cannot represent: train with the default missing=nan")
    return parse_dump(model, booster, wrapper, "save_raw", ("json",),
                      lambda raw: parse_xgboost(bytes(raw), every_round=not wrapper), "XGBoost",
                      "a fitted XGBClassifier or an xgboost.Booster")


def _is_nan(v: Any) -> bool:
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return False


class XGBoostAdapter:
    """The registry's adapter for XGBoost models: parsed JSON/UBJSON files, and the
    library's own objects, read through their JSON dump (:func:`from_xgboost`)."""

    name: str = "xgboost"
    supported: tuple[str, ...] = ("XGBoost JSON/UBJSON model (binary:logistic, multi:softprob, "
                                  "multi:softmax; gbtree), XGBClassifier, xgboost.Booster",)

    def accepts(self, model: Any) -> bool:
        return isinstance(model, XGBoostModel) or library_of(model) == "xgboost"

    def prepare(self, model: Any) -> XGBoostModel:
        return model if isinstance(model, XGBoostModel) else from_xgboost(model)

    def check(self, model: Any) -> None:
        n_groups = 1 if model.objective == "binary:logistic" else model.n_classes
        for i, t in enumerate(model.trees):
            _check_tree(t, model.n_features_in_, n_groups, f"tree {i}")

    def flatten(self, model: Any) -> FlatEnsemble:
        return flatten(model)


XGBOOST = XGBoostAdapter()
