"""Trees appended one by one into the node arrays of a :class:`FlatEnsemble`: what every
adapter does once it has read a library's trees."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ensemble import FlatEnsemble
from ..exceptions import UnsupportedModelError

__all__ = ["TreeStack"]


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
