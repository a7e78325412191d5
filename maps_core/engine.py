"""The query side of one set of maps, assembled once: :class:`SearchEngine`.

Loading maps (or building them) yields the ensemble, the grid, the partition and the KD
forest as arrays. Everything a query derives from them and would otherwise recompute or
cache ad hoc lives here, built once: the ensemble in kernel layout, the arrays grouped the
way the search kernel takes them, the features' widths (the scale of the first deepening
radius), whether a budgeted build left mixed regions, the cache of schema-default query
options (filled by :func:`maps_core.options.make_options`), and the *exact decision* for
points whose scores nearly tie (:meth:`SearchEngine.classify`).

Where the query path labels a point itself (a query point inside a mixed region, a
near-tie box of the mixed-region search), the flat ensemble's float64 sums decide whenever
the margin exceeds the certificates' tolerance: the library's own arithmetic cannot differ
from them by that much. Below it, the model itself decides, through the ``labeler`` the
extraction uses too (attached by :meth:`CounterfactualMaps.build
<maps_core.maps.CounterfactualMaps.build>` and :meth:`~maps_core.maps.CounterfactualMaps.attach_model`).
Maps loaded without their model fall back to the flat ensemble there, which is the
model's decision bit for bit for scikit-learn's gradient boosting (same terms, same order)
and can differ for a forest only where two class sums lie within an ulp.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._norms import N_NORMS
from .ensemble import FlatEnsemble
from .grid import Grid
from .index import KDForest
from .lazy import Cells, Forest
from .partition import Kernel, Partition
from .schema import FeatureSchema

#: Weight of the newest search in :class:`SearchPace`'s running mean (about the last 16).
PACE_WEIGHT = 1.0 / 16


@dataclass(eq=False)
class SearchPace:
    """How long one set of maps' searches run, per norm (indexed by its code,
    :mod:`maps_core._norms`: the same maps' l1 and linf searches differ several-fold), as
    running means over about the last 16 instances searched: the share of searches that
    were long (popped ``long_boxes`` mixed-region boxes or more), which decides whether a
    single query's search runs in several threads (:data:`maps_core.query.PARALLEL_AFTER`),
    and the seconds, which decide whether a batch's rows do
    (:data:`maps_core.query.PARALLEL_SECONDS`). A share rather than a mean of boxes: on
    maps whose typical search is short and a few are very long (Credit RF 100x5 under
    linf: p50 1.4 ms, p99 1.4 s) the mean says long, and the typical search would pay for
    threads it does not need. Written by every query without a lock: a lost update only
    shifts a mean a little."""

    long: list[float] = field(default_factory=lambda: [0.0] * N_NORMS)
    seconds: list[float] = field(default_factory=lambda: [0.0] * N_NORMS)

    def record(self, norm: int, pops: int, seconds: float, long_boxes: int) -> None:
        """Count one instance's search under the norm of code ``norm`` that popped
        ``pops`` boxes in ``seconds``."""
        self.long[norm] += ((pops >= long_boxes) - self.long[norm]) * PACE_WEIGHT
        self.seconds[norm] += (seconds - self.seconds[norm]) * PACE_WEIGHT


@dataclass(frozen=True, eq=False)
class SearchEngine:
    """Immutable query-time view of one set of maps.

    Attributes
    ----------
    ensemble : FlatEnsemble
    schema : FeatureSchema
    grid : Grid
    partition : Partition
    index : KDForest
    kernel : Kernel
        The ensemble's arrays in kernel layout (mixed-region search, near-tie pieces).
    forest : lazy.Forest
        The KD forest and the partition's boxes, as the search kernel takes them.
    cells : lazy.Cells
        The grid's cell bounds, as the search kernel takes them.
    widths : ndarray of shape (n_features,)
        Each feature's finite extent (domain bounds and thresholds; 0 when none).
    has_mixed : bool
        Whether the partition holds mixed (unresolved) regions.
    defaults : dict
        Schema-default :class:`~maps_core.options.QueryOptions` per (norm, k), filled on
        first use and shared by every query (never written to after insertion).
    labeler : callable, optional
        ``labeler(points) -> class indices`` by the model itself, shape (n, m) -> (n,),
        for near-tie points (see the module docs).
    pace : SearchPace
        How long its searches have run (the one part that changes as it serves).
    """

    ensemble: FlatEnsemble
    schema: FeatureSchema
    grid: Grid
    partition: Partition
    index: KDForest
    kernel: Kernel
    forest: Forest
    cells: Cells
    widths: np.ndarray
    has_mixed: bool
    defaults: dict[tuple[str, int], Any] = field(default_factory=dict)
    labeler: Callable[[np.ndarray], np.ndarray] | None = None
    pace: SearchPace = field(default_factory=SearchPace)

    @classmethod
    def assemble(
        cls, ensemble: FlatEnsemble, schema: FeatureSchema, grid: Grid, partition: Partition,
        index: KDForest, labeler: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> SearchEngine:
        """The engine of the given parts (arrays are shared, not copied)."""
        ix, part, g = index, partition, grid
        forest = Forest(ix.node_lo, ix.node_hi, ix.left, ix.right, ix.start, ix.end, ix.order,
                        ix.class_root, part.labels, part.lo, part.hi)
        cells = Cells(g.cell_offsets, g.cell_lower, g.cell_upper, g.cell_lower_closed,
                      g.cell_upper_closed)
        return cls(
            ensemble=ensemble, schema=schema, grid=grid, partition=partition, index=index,
            kernel=Kernel.make(ensemble, grid), forest=forest, cells=cells,
            widths=_widths(grid, schema), has_mixed=bool(partition.n_mixed), labeler=labeler,
        )

    def classify(self, A: np.ndarray) -> np.ndarray:
        """The model's class index of every row of ``A`` (shape (n, m), legal points),
        shape (n,): the flat ensemble's argmax, and the model itself where the margin is
        within the certificates' tolerance and a labeler is attached."""
        idx, margin = self.ensemble.predict_margin(A)
        if self.labeler is not None:
            near = margin <= self.kernel.tol
            if near.any():
                idx[near] = self.labeler(np.ascontiguousarray(A[near]))
        return idx

    @property
    def classes(self) -> list[Any]:
        """Class labels in class-index order."""
        return list(self.ensemble.classes)

    @property
    def feature_names(self) -> list[str]:
        return self.schema.names

    @property
    def n_features(self) -> int:
        return self.ensemble.n_features


def _widths(g: Grid, schema: FeatureSchema) -> np.ndarray:
    """Finite extent of every feature (domain bounds and thresholds), shape (m,); 1 for a
    nominal feature, whose every switch costs one weight."""
    width = np.zeros(g.n_features)
    for f in range(g.n_features):
        if schema[f].type == "nominal":
            width[f] = 1.0
            continue
        v = np.concatenate([g.thresholds(f), [g.dom_lower[f], g.dom_upper[f]]])
        v = v[np.isfinite(v)]
        if v.size:
            # halves first: bounds of +-1e308 overflow the difference to inf (the first
            # deepening bound's scale with it); such a range is float64's largest value wide
            half = 0.5 * v.max() - 0.5 * v.min()
            width[f] = 2.0 * half if half <= _HALF_MAX else _HALF_MAX * 2.0
    return width


_HALF_MAX = float(np.finfo(np.float64).max) / 2


__all__ = ["SearchEngine", "SearchPace"]
