"""The class KD-trees: every node's box is the hull of its rectangles' real bounds, and
each class's tree holds exactly its certified rectangles and every mixed region."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier

from maps_core import CounterfactualMaps
from maps_core.index import LEAF_SIZE, _n_nodes
from maps_core.partition import MIXED
from tests.conftest import synthetic


def _built(kind: str, n_classes: int, max_rectangles: int | None) -> CounterfactualMaps:
    X, y = synthetic(n_classes, n_features=5, seed=3)
    X[:, 4] = np.round(X[:, 4])  # a feature with few cuts (integer values)
    model = (RandomForestClassifier(12, max_depth=4, random_state=0) if kind == "rf"
             else GradientBoostingClassifier(n_estimators=10, max_depth=3, random_state=0))
    return CounterfactualMaps.build(model.fit(X, y), max_rectangles=max_rectangles)


@pytest.mark.parametrize("max_rectangles", [None, 60])
@pytest.mark.parametrize(("kind", "n_classes"), [("rf", 2), ("gb", 3), ("rf", 4)])
def test_nodes_bound_their_rectangles(kind: str, n_classes: int, max_rectangles: int | None) -> None:
    maps = _built(kind, n_classes, max_rectangles)
    part, grid, idx = maps.partition, maps.grid, maps.index
    if max_rectangles is not None:
        assert part.n_mixed > 0  # the budget binds: mixed regions are indexed per class
    off = grid.cell_offsets[:-1]
    lower = grid.cell_lower[part.lo + off]  # real bounds, shape (n_rectangles, m)
    upper = grid.cell_upper[part.hi + off]
    mixed = set(np.flatnonzero(part.labels == MIXED).tolist())
    seen = 0
    for k in range(n_classes):
        root = int(idx.class_root[k])
        want = set(np.flatnonzero(part.labels == k).tolist()) | mixed
        assert root >= 0
        assert set(idx.order[idx.start[root]:idx.end[root]].tolist()) == want
        assert idx.end[root] - idx.start[root] == len(want)  # no entry twice
        # the nodes of class k are contiguous, a whole tree of the expected size
        n_nodes = _n_nodes(len(want), LEAF_SIZE)
        stack = [root]
        nodes = []
        while stack:
            nd = stack.pop()
            nodes.append(nd)
            ids = idx.order[idx.start[nd]:idx.end[nd]]
            assert ids.size > 0
            np.testing.assert_array_equal(idx.node_lo[nd], lower[ids].min(axis=0))
            np.testing.assert_array_equal(idx.node_hi[nd], upper[ids].max(axis=0))
            if idx.left[nd] < 0:
                assert idx.right[nd] < 0 and ids.size <= LEAF_SIZE
                continue
            lc, rc = int(idx.left[nd]), int(idx.right[nd])
            mid = idx.start[nd] + (idx.end[nd] - idx.start[nd]) // 2
            assert (idx.start[lc], idx.end[lc], idx.start[rc], idx.end[rc]) == (
                idx.start[nd], mid, mid, idx.end[nd])
            stack += [lc, rc]
        assert sorted(nodes) == list(range(root, root + n_nodes))
        seen += n_nodes
    assert idx.n_nodes == seen


def test_node_counts() -> None:
    assert _n_nodes(1, 8) == 1
    assert _n_nodes(8, 8) == 1
    assert _n_nodes(9, 8) == 3  # 4 and 5 entries
    # 33 -> 16 (-> 8, 8) and 17 (-> 8, 9 -> 4, 5): 1 + 3 + 5
    assert _n_nodes(33, 8) == 9
