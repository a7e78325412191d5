"""Trees appended one by one into the node arrays of a :class:`FlatEnsemble`: what every
adapter does once it has read a library's trees, and the size limits every adapter
enforces before it allocates anything in proportion to a model's claims.

Size limits. A model file is small, but what it claims is not bounded by its size: an
XGBoost file states ``num_feature`` and ``num_class`` as plain numbers, and the flat
ensemble holds a dense ``(n_nodes, n_classes)`` value matrix, so a few kilobytes could make
the service build a schema of a billion features or a matrix of many gigabytes. No model
cfmaps can build maps for comes near these limits:

* :data:`MAX_FEATURES` input features (100,000);
* :data:`MAX_CLASSES` classes (10,000);
* :data:`MAX_NODE_VALUES` entries in the flat value matrix, nodes times classes (2**25,
  256 MiB of float64), which also bounds the trees times classes of a multiclass file.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from typing import Any

import numpy as np

from ..ensemble import FlatEnsemble
from ..exceptions import UnsupportedModelError
from ..results import py_scalar

__all__ = ["MAX_CLASSES", "MAX_FEATURES", "MAX_NODE_VALUES", "MAX_UNFOLDED_NODES", "TreeStack",
           "check_category_values", "check_size",
           "class_labels", "code_set_cuts", "library_of", "parse_dump",
           "skip_always_left", "unfold_tree"]

#: Most input features a model may have (see the module docs).
MAX_FEATURES = 100_000
#: Most classes a model may have (see the module docs).
MAX_CLASSES = 10_000
#: Most entries (nodes times classes) of the flat ensemble's value matrix.
MAX_NODE_VALUES = 2**25
#: Most nodes one tree may have once its categorical splits are unfolded into plain ones
#: (:func:`unfold_tree`); each adapter passes its own module's name, which tests lower.
MAX_UNFOLDED_NODES = 1 << 20


def library_of(model: Any) -> str:
    """The top-level package an object's type comes from (``"sklearn"``, ``"lightgbm"``):
    how adapters recognise a library's objects without importing it."""
    return type(model).__module__.partition(".")[0]


def class_labels(labels: Any, n_classes: int, what: str) -> list[Any]:
    """A fitted wrapper's ``classes_`` as plain Python scalars, in class-index order.

    Raises
    ------
    UnsupportedModelError
        When they are not ``n_classes`` distinct labels (the model's file and its wrapper
        disagree).
    """
    out = [py_scalar(c) for c in np.asarray(labels).ravel()]
    if len(out) != n_classes or len({repr(c) for c in out}) != n_classes:
        raise UnsupportedModelError(
            f"the {what}'s classes_ ({len(out)}) do not match its booster's {n_classes} classes")
    return out


def parse_dump(model: Any, booster: Any, wrapper: bool, method: str, args: tuple[Any, ...],
               parse: Callable[[Any], Any], library: str, expected: str,
               labels: Any = None) -> Any:
    """The parsed model file of a library's object in memory: ``booster.method(*args)``
    (the library's own dump, as its ``save_model`` writes it) read by ``parse``; a fitted
    scikit-learn ``wrapper``'s ``classes_`` (or ``labels``, when given) become the parsed
    model's ``labels``.

    Raises
    ------
    UnsupportedModelError
        When ``booster`` has no such dump (naming what was ``expected``), the dump fails
        inside the library, or ``parse`` refuses it.
    """
    kind = type(model).__name__
    dump = getattr(booster, method, None)
    if not callable(dump):
        raise UnsupportedModelError(f"unsupported {library} object {kind!r}: pass {expected}")
    try:
        data = dump(*args)
    except Exception as exc:  # the library's own errors (a freed booster, say)
        raise UnsupportedModelError(f"could not read the {kind}: {exc}") from None
    parsed = parse(data)
    if labels is None and wrapper:
        labels = getattr(model, "classes_", None)
    if labels is not None:
        parsed.labels = class_labels(labels, parsed.n_classes, kind)
    return parsed


def check_size(what: str, *, n_features: int | None = None, n_classes: int | None = None,
               n_nodes: int | None = None) -> None:
    """Refuse a model beyond the size limits (see the module docs), before anything is
    allocated in proportion to its claims.

    Parameters
    ----------
    what : str
        The model, as error messages name it (``"XGBoost model file"``).
    n_features, n_classes : int, optional
        What the model claims.
    n_nodes : int, optional
        Nodes of all its trees together (with ``n_classes``: the flat value matrix's rows).

    Raises
    ------
    UnsupportedModelError
        Naming the claim and the limit.
    """
    if n_features is not None and not 0 <= n_features <= MAX_FEATURES:
        raise UnsupportedModelError(
            f"{what}: {n_features} features; cfmaps supports 0 to {MAX_FEATURES:,}")
    if n_classes is not None and not 0 <= n_classes <= MAX_CLASSES:
        raise UnsupportedModelError(
            f"{what}: {n_classes} classes; cfmaps supports at most {MAX_CLASSES:,}")
    if n_nodes is not None and n_classes is not None and n_nodes * n_classes > MAX_NODE_VALUES:
        raise UnsupportedModelError(
            f"{what}: {n_nodes} tree nodes times {n_classes} classes is more than the "
            f"{MAX_NODE_VALUES:,} node values cfmaps holds")


def skip_always_left(left: np.ndarray, right: np.ndarray,
                     always_left: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tree without the internal nodes that send every input left, each replaced by its
    left child (their right subtrees are unreachable and dropped).

    scikit-learn stores such a node for a split that sends the missing values, and only
    them, right: its threshold is +inf, and every finite input (even one whose float32 is
    +inf) satisfies ``x <= inf``. Replacing the threshold by a finite one would change the
    decision for huge inputs; dropping the node changes nothing.

    Parameters
    ----------
    left, right : ndarray of shape (n_nodes,)
        Children within the tree, negative at leaves; node 0 is the root and children
        follow their parent (checked by the caller).
    always_left : ndarray of bool, shape (n_nodes,)
        The internal nodes to skip.

    Returns
    -------
    keep : ndarray of int
        Old index of each node of the new tree, in its order (index any node array with it).
    new_left, new_right : ndarray of int
        Children in the new numbering (root 0, children after their parent), -1 at leaves.
    """
    def resolve(i: int) -> int:
        while always_left[i]:  # terminates: children come after their parent
            i = int(left[i])
        return i

    keep = [resolve(0)]
    new_left: list[int] = []
    new_right: list[int] = []
    # breadth first: a node's children get numbers after its own, as TreeStack needs
    for i in keep:
        if left[i] < 0:
            new_left.append(-1)
            new_right.append(-1)
            continue
        new_left.append(len(keep))
        keep.append(resolve(int(left[i])))
        new_right.append(len(keep))
        keep.append(resolve(int(right[i])))
    return (np.array(keep, dtype=np.int64), np.array(new_left, dtype=np.int64),
            np.array(new_right, dtype=np.int64))


def check_category_values(values: Any, what: str) -> None:
    """Refuse a stored mapping from category values to codes that cfmaps cannot honour.

    Trained on pandas ``category`` columns, LightGBM (``pandas_categorical``) and XGBoost
    (``cats``) store each column's categories; their ``predict`` on a DataFrame maps a
    value to its position among them, the code the trees split on, while on an array it
    reads the number itself as the code. cfmaps reads numbers, so it serves the codes. That
    is what a client means when the categories are strings (a JSON number can only be a
    code) or the numbers ``0..n-1`` themselves; numbers in another order or range (say
    10, 20, 30) would be read as codes they are not, so the model is refused.

    Parameters
    ----------
    values : sequence
        The stored category values of one column (numbers or strings).
    what : str
        Where they come from, for the message.

    Raises
    ------
    UnsupportedModelError
        When the values are numbers other than ``0, 1, ..., n-1`` in that order.
    """
    vals = list(values)
    if not vals or any(isinstance(v, str) for v in vals):
        return
    if all(isinstance(v, int | float) and v == i for i, v in enumerate(vals)):
        return
    shown = ", ".join(repr(v) for v in vals[:6]) + (", ..." if len(vals) > 6 else "")
    raise UnsupportedModelError(
        f"{what}: the categories are the values [{shown}], which the library's predict on a "
        f"DataFrame maps to the codes 0..{len(vals) - 1} its trees split on; cfmaps reads "
        "numbers as those codes and cannot tell the two apart. Train on the codes instead "
        "(pandas: df[col].cat.codes) or on categories 0..n-1")


def code_set_cuts(codes: np.ndarray, strict: bool, lowest: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """A categorical split as cuts on the line the model compares on: the input goes one
    way when its integer code is in ``codes``, the other way otherwise.

    The library reads a value ``v`` as the code ``c = int(v)`` (C's truncation toward
    zero) where ``v`` lies in ``[c, c + 1)``, for ``c >= 1`` and, for ``c = 0``, above
    ``lowest``: LightGBM reads ``(-1, 1)`` as code 0 (``lowest = -1``, its ``int(v) < 0``
    test comes after the conversion), XGBoost ``[0, 1)`` (``v < 0`` is no category). Every
    other value (below, past the set's codes, NaN) goes the *out* way. Each run of
    consecutive codes becomes one interval between two cuts, in the comparison of the
    model's split rule: with ``strict`` (``v < t`` goes left, XGBoost) the intervals are
    ``[cuts[j - 1], cuts[j])`` and a run ``a..b`` is ``[a, b + 1)``; otherwise (``v <= t``,
    LightGBM) they are ``(cuts[j - 1], cuts[j]]`` and ``v >= c`` is
    ``v > nextafter(c, -inf)``.

    Parameters
    ----------
    codes : ndarray of int, shape (k,)
        The codes of the set, distinct and non-negative, in any order.
    strict : bool
        The split rule's comparison: ``v < t`` (True) or ``v <= t`` (False).
    lowest : float
        Without ``strict``: the largest value below code 0's interval.

    Returns
    -------
    cuts : ndarray of shape (2 r,)
        Increasing cut points for the ``r`` runs.
    inside : ndarray of bool, shape (2 r + 1,)
        Per interval between the cuts, from the one below ``cuts[0]`` to the one above
        ``cuts[-1]``, whether its values are in the set.
    """
    c = np.unique(np.asarray(codes, dtype=np.int64))
    if c.size == 0:
        return np.zeros(0), np.zeros(1, dtype=bool)
    starts = c[np.r_[True, np.diff(c) > 1]].astype(np.float64)
    ends = (c[np.r_[np.diff(c) > 1, True]] + 1).astype(np.float64)
    if strict:
        below, above = starts, ends
    else:
        below = np.where(starts == 0, lowest, np.nextafter(starts, -np.inf))
        above = np.nextafter(ends, -np.inf)
    cuts = np.column_stack([below, above]).ravel()
    inside = np.zeros(cuts.size + 1, dtype=bool)
    inside[1::2] = True
    return cuts, inside


def unfold_tree(feature: np.ndarray, cuts: list[np.ndarray], sides: list[np.ndarray],
                left: np.ndarray, right: np.ndarray, leaf_values: np.ndarray, max_nodes: int,
                where: str, is_leaf: np.ndarray | None = None,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A tree whose splits send an input left or right by *intervals* of one feature (a
    categorical split: several runs of codes each way) as a tree of plain ``x <= t``
    splits, each such split a balanced chain of them with a copy of the child subtree
    below every run.

    A copy only meets the inputs of its run, so every split below it is restricted to
    that run and to its ancestors' intervals: where they decide a split one way the split
    is dropped (its other subtree cannot be reached), which keeps nested categorical
    splits on the same feature from multiplying. The decision is unchanged for every
    real input.

    Parameters
    ----------
    feature : ndarray of int, shape (n_internal,)
        Split feature of each internal node.
    cuts, sides : lists of n_internal arrays
        Node ``i`` sends an input in the interval ``j`` of its increasing ``cuts[i]`` (shape
        (k,); intervals ``(-inf, cuts[0]]``, ..., ``(cuts[-1], inf)`` for the split rule
        ``x <= t``, ``(-inf, cuts[0])``, ..., ``[cuts[-1], inf)`` for ``x < t``: the
        unfolding is the same) to its left child when ``sides[i][j]`` (shape (k + 1,)) is
        False, else to its right child. A plain split has ``cuts = [t]``, ``sides =
        [False, True]``.
    left, right : ndarray of int, shape (n_internal,)
        Children: an internal node ``>= 0``, leaf ``j`` as ``~j`` (LightGBM's convention),
        or, with ``is_leaf``, node indices. The root is internal node 0; children come
        after their parent.
    leaf_values : ndarray of shape (n_leaves, n_classes)
        Each leaf's contribution to the class scores, by leaf ``j`` (or by node with
        ``is_leaf``).
    max_nodes : int
        Most nodes the result may have.
    where : str
        The tree, for error messages.
    is_leaf : ndarray of bool, shape (n_nodes,), optional
        For a library that numbers leaves with its nodes (every node's children indexed in
        the same arrays): which nodes are leaves.

    Returns
    -------
    feature, threshold, left, right, value : ndarrays of shape (n,) and (n, n_classes)
        The unfolded tree as :meth:`TreeStack.add` takes it (root 0, children after their
        parent, -1 at leaves), its thresholds compared by the same rule.

    Raises
    ------
    UnsupportedModelError
        When the result would have more than ``max_nodes`` nodes.
    """
    if is_leaf is not None:  # a leaf node as ~node (a leaf's own children are never read)
        last = is_leaf.size - 1
        left = np.where(is_leaf[np.clip(left, 0, last)], ~left, left)
        right = np.where(is_leaf[np.clip(right, 0, last)], ~right, right)
    out_f: list[int] = []
    out_t: list[float] = []
    out_l: list[int] = []
    out_r: list[int] = []
    out_leaf: list[int] = []

    def emit(f: int, t: float, leaf: int) -> int:
        if len(out_f) >= max_nodes:
            raise UnsupportedModelError(
                f"{where}: its categorical splits unfold to more than {max_nodes:,} nodes of "
                "plain splits; one-hot encode the categories with many codes instead")
        out_f.append(f)
        out_t.append(t)
        out_l.append(-1)
        out_r.append(-1)
        out_leaf.append(leaf)
        return len(out_f) - 1

    def link(parent: int, side: int, child: int) -> None:
        if parent >= 0:
            (out_r if side else out_l)[parent] = child

    # Python floats and bools, read once per node: the copies of a subtree below every run
    # of a categorical split visit its nodes many times (a LightGBM model with 4,000 codes
    # and 256-code sets: 1.1M nodes), and numpy scalars cost several times more there
    cut_lists = [np.asarray(c, dtype=np.float64).tolist() for c in cuts]
    side_lists = [np.asarray(s, dtype=bool).tolist() for s in sides]
    Box = dict[int, tuple[float, float]]
    # tasks: ("node", child id, box, parent, side) and ("runs", f, runs, box, parent, side),
    # a run being (lo, hi, child id): the inputs between lo and hi (the box's intervals, in
    # the rule's sense) go to that child
    stack: list[tuple[Any, ...]] = [("node", 0, {}, -1, 0)]
    while stack:
        task = stack.pop()
        if task[0] == "node":
            _, nd, box, parent, side = task
            if nd < 0:
                link(parent, side, emit(-1, 0.0, ~nd))
                continue
            f = int(feature[nd])
            lo, hi = box.get(f, (-np.inf, np.inf))
            c, s = cut_lists[nd], side_lists[nd]
            runs: list[tuple[float, float, int]] = []
            # only the intervals that meet the box (lo, hi): from the first whose upper
            # cut lies above lo to the last whose lower cut lies below hi
            for j in range(bisect_right(c, lo), bisect_left(c, hi) + 1):
                a = c[j - 1] if j else -np.inf
                b = c[j] if j < len(c) else np.inf
                a, b = max(a, lo), min(b, hi)
                if a >= b:
                    continue  # no input of the box lies in this interval
                child = int(right[nd] if s[j] else left[nd])
                if runs and runs[-1][2] == child:
                    runs[-1] = (runs[-1][0], b, child)
                else:
                    runs.append((a, b, child))
            stack.append(("runs", f, runs, box, parent, side))
        else:
            _, f, runs, box, parent, side = task
            if len(runs) == 1:
                a, b, child = runs[0]
                inner: Box = dict(box)
                inner[f] = (a, b)
                stack.append(("node", child, inner, parent, side))
                continue
            mid = len(runs) // 2
            here = emit(f, runs[mid - 1][1], -1)
            link(parent, side, here)
            stack.append(("runs", f, runs[mid:], box, here, 1))
            stack.append(("runs", f, runs[:mid], box, here, 0))
    leaf = np.array(out_leaf, dtype=np.int64)
    value = np.zeros((leaf.size, leaf_values.shape[1]))
    value[leaf >= 0] = leaf_values[leaf[leaf >= 0]]
    return (np.array(out_f, dtype=np.int64), np.array(out_t, dtype=np.float64),
            np.array(out_l, dtype=np.int64), np.array(out_r, dtype=np.int64), value)


class TreeStack:
    """The node arrays of the trees added so far, concatenated in order."""

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("feature", "threshold", "left", "right", "value")}
        self._roots: list[int] = []
        self._n = 0

    def add(self, feature: np.ndarray, threshold: np.ndarray, left: np.ndarray, right: np.ndarray,
            value: np.ndarray) -> None:
        """Append one tree.

        Parameters
        ----------
        feature, threshold : ndarray of shape (n_nodes,)
            Split feature and threshold per node (ignored at leaves).
        left, right : ndarray of shape (n_nodes,)
            Children as indices *within this tree*, negative at leaves; node 0 is the root
            and children follow their parent.
        value : ndarray of shape (n_nodes, n_classes)
            The leaves' contributions to the class scores (ignored at internal nodes).
        """
        # int64 first: a library's unsigned arrays (HistGradientBoosting's uint32) would
        # turn the -1 of a leaf into a huge index under numpy's promotion rules
        feature = np.asarray(feature, dtype=np.int64)
        left = np.asarray(left, dtype=np.int64)
        right = np.asarray(right, dtype=np.int64)
        leaf = left < 0
        offset = self._n
        self._parts["feature"].append(np.where(leaf, -1, feature).astype(np.int32))
        self._parts["threshold"].append(np.where(leaf, 0.0, threshold).astype(np.float64))
        self._parts["left"].append(np.where(leaf, -1, left + offset).astype(np.int32))
        self._parts["right"].append(np.where(leaf, -1, right + offset).astype(np.int32))
        self._parts["value"].append(np.asarray(value, dtype=np.float64))
        self._roots.append(offset)
        self._n += left.shape[0]

    def add_skipping_inf(self, feature: np.ndarray, threshold: np.ndarray, left: np.ndarray,
                         right: np.ndarray, value: np.ndarray) -> None:
        """:meth:`add` a tree whose internal nodes of threshold +inf are each replaced by
        their left child.

        Under the ``x <= t`` rules (scikit-learn's on float32, LightGBM's and
        HistGradientBoosting's on float64) every finite input goes left at such a node,
        even one whose float32 is +inf; only a missing value could go right. The libraries
        store them for splits that send missing values, and only them, one way. Not for
        XGBoost's ``float32(x) < t``, which sends an input beyond float32's range right.
        """
        left = np.asarray(left, dtype=np.int64)
        always_left = (left >= 0) & (np.asarray(threshold) == np.inf)
        if np.any(always_left):
            keep, left, right = skip_always_left(left, np.asarray(right, dtype=np.int64),
                                                 always_left)
            feature, threshold, value = feature[keep], threshold[keep], value[keep]
        self.add(feature, threshold, left, right, value)

    @property
    def n_nodes(self) -> int:
        """Nodes of the trees added so far."""
        return self._n

    def ensemble(self, **fields: Any) -> FlatEnsemble:
        """The flat ensemble of the trees, with the model-level ``fields`` (kind, classes,
        base, tie break, split rule...)."""
        if not self._roots:
            raise UnsupportedModelError(f"the {fields.get('kind', 'model')} has no trees")
        p = self._parts
        return FlatEnsemble(
            node_feature=np.concatenate(p["feature"]),
            node_threshold=np.concatenate(p["threshold"]),
            node_left=np.concatenate(p["left"]),
            node_right=np.concatenate(p["right"]),
            node_value=np.concatenate(p["value"]),
            roots=np.array(self._roots, dtype=np.int32),
            **fields,
        )
