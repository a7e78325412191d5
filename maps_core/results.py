"""Plain result containers returned by the public API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def py_scalar(v: Any) -> Any:
    """A numpy scalar as the plain Python scalar it holds (JSON-friendly: class labels,
    feature values); any other value unchanged."""
    return v.item() if isinstance(v, np.generic) else v


@dataclass(frozen=True)
class Region:
    """An axis-aligned box of inputs, one interval per feature.

    Attributes
    ----------
    lower, upper : ndarray of shape (n_features,)
        Interval ends; ``-inf`` / ``+inf`` for an unbounded end.
    lower_closed, upper_closed : ndarray of shape (n_features,), bool
        Whether the end itself belongs to the region. An end of a continuous feature that
        comes from a model threshold is the real point where the model's decision changes
        (for a model that casts to float32, halfway between two float32 values); it is
        closed when the model sends that very point into the region, open otherwise.
        Integer features always have closed ends at integers.
    """

    lower: np.ndarray
    upper: np.ndarray
    lower_closed: np.ndarray
    upper_closed: np.ndarray

    def contains(self, x: np.ndarray) -> bool:
        """Whether the point ``x`` (shape (n_features,)) lies in the region."""
        x = np.asarray(x, dtype=np.float64)
        lo_ok = np.where(self.lower_closed, x >= self.lower, x > self.lower)
        hi_ok = np.where(self.upper_closed, x <= self.upper, x < self.upper)
        return bool(np.all(lo_ok & hi_ok))


@dataclass(frozen=True)
class QueryStats:
    """Work done by one search.

    Attributes
    ----------
    nodes_popped : int
        KD-tree nodes taken off the priority queue.
    rectangles_evaluated : int
        Rectangles whose exact distance was computed.
    regions_refined : int
        Boxes popped inside unresolved (mixed) regions during the search.
    peak_boxes : int
        The most of those boxes the search held at once (its memory: see ``max_memory``
        of :meth:`~maps_core.CounterfactualMaps.counterfactuals`).
    seconds : float
        Wall-clock time of the search.
    """

    nodes_popped: int = 0
    rectangles_evaluated: int = 0
    regions_refined: int = 0
    peak_boxes: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, int | float]:
        """Plain JSON-ready form (what the CLI and the HTTP API print)."""
        return {
            "nodes_popped": int(self.nodes_popped),
            "rectangles_evaluated": int(self.rectangles_evaluated),
            "regions_refined": int(self.regions_refined),
            "peak_boxes": int(self.peak_boxes),
            "seconds": float(self.seconds),
        }


@dataclass(frozen=True)
class Counterfactual:
    """One counterfactual: a point, its certified distance and its region.

    Attributes
    ----------
    x : ndarray of shape (n_features,)
        The counterfactual input; the model predicts ``target`` for it.
    distance : float
        Certified optimum: the infimum of the distance from the query to the inputs that
        the model assigns to ``target`` (and that satisfy the query's constraints). When
        the result is not ``optimal`` (``on_budget="best"``): the infimum over ``region``.
    counterfactual_distance : float
        Distance from the query to ``x``. Equal to ``distance`` up to float rounding: when
        the optimum sits on an open end of the region, ``x`` is the nearest float32 value
        strictly inside it.
    region : Region
        The box containing ``x`` on which the model's decision is ``target`` everywhere
        (clipped to the query's constraints and the legal domain).
    target : object
        Class label of the counterfactual.
    """

    x: np.ndarray
    distance: float
    counterfactual_distance: float
    region: Region
    target: Any


@dataclass(frozen=True)
class CounterfactualResult:
    """Answer to one counterfactual query.

    Attributes
    ----------
    query : ndarray of shape (n_features,)
        The query input.
    prediction : object
        The model's class label for ``query``.
    target : object or None
        Target class label of the best counterfactual; when infeasible, the class asked
        for, or with none asked for, the one other class that no input reaches (``None``
        when several are unreachable).
    feasible : bool
        False when no input satisfies the constraints and reaches the target.
    reason : str or None
        Plain explanation when ``feasible`` is False (see :meth:`explain`).
    unreachable : tuple
        When infeasible: the target class labels no admissible input reaches.
    constraints : str
        When infeasible: the active constraints, in words (empty if none).
    counterfactuals : tuple of Counterfactual
        The ``k`` best counterfactuals, from distinct rectangles, by increasing distance.
    stats : QueryStats
    optimal : bool
        True when the answer is certified: ``best`` nearest and, with ``k > 1``, the others
        next (always, unless the query asked for ``on_budget="best"`` and its search ran out
        of a budget first).
    lower_bound : float or None
        Certified lower bound of the optimal distance: ``best.distance`` when
        ``optimal``, below it otherwise (``None`` when infeasible).
    """

    query: np.ndarray
    prediction: Any
    target: Any
    feasible: bool
    counterfactuals: tuple[Counterfactual, ...]
    stats: QueryStats
    reason: str | None = None
    unreachable: tuple[Any, ...] = ()
    constraints: str = ""
    optimal: bool = True
    lower_bound: float | None = None

    def explain(self, name: Callable[[Any], Any] = str) -> str | None:
        """The reason of an infeasible answer, naming classes with ``name(label)`` (a
        service shows its own display names)."""
        if self.feasible:
            return None
        within = " in the legal domain"
        if self.constraints:
            within = f" within the constraints ({self.constraints})"
        names = " or ".join(str(name(c)) for c in self.unreachable)
        return f"the model classifies no input{within} as {names}"

    @property
    def best(self) -> Counterfactual | None:
        """The nearest counterfactual, or None when infeasible."""
        return self.counterfactuals[0] if self.counterfactuals else None


@dataclass(frozen=True)
class BuildStats:
    """What a build produced and what it cost.

    Attributes
    ----------
    seconds : float
        Wall-clock build time (extraction plus indexing).
    rectangles_per_class : list of int
        Certified rectangles per class index.
    mixed_regions : int
        Unresolved regions kept when a budget ran out; refined on demand at query time.
    thresholds_per_feature : list of int
        Distinct thresholds left per feature after collapsing on the legal domain.
    raw_thresholds : int
        Distinct (feature, threshold) pairs in the model before collapsing.
    bytes_on_disk : int
        Size of the saved artifact (0 until saved or loaded).
    extra : dict
        Algorithm counters (regions visited, exact certifications, ...).
    """

    seconds: float
    rectangles_per_class: list[int]
    mixed_regions: int
    thresholds_per_feature: list[int]
    raw_thresholds: int
    bytes_on_disk: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rectangles(self) -> int:
        return int(sum(self.rectangles_per_class))
