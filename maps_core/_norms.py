"""The distances a query may ask for, in one place.

Every norm is a per-feature cost ``w_f * delta_f`` folded into an *accumulated* value that
the kernels compare and order: the sum (``l1``), the sum of squares (``l2``, so no square
root runs per box), the maximum (``linf``), or for ``l0`` the number of changed features
with the weighted l1 folded in as a tie-break (:func:`key`). :func:`finish` turns an
accumulated value into the distance a caller sees and :func:`accumulate_radius` a distance
into an accumulated bound.

The kernels compare the integer codes below (numba freezes module globals into compiled
code, so the names cost nothing). Adding a norm means a code here, its branch in
:func:`acc`, :func:`fold`, :func:`finish` and :func:`accumulate_radius`, and a look at the
few kernels that special-case a norm (each names the code it tests).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

L1 = 0
L2 = 1
LINF = 2
L0 = 3
#: How many norm codes there are (codes run 0 .. N_NORMS - 1).
N_NORMS = 4

#: Norm names accepted by the API and the CLI, mapped to their kernel codes.
NORMS: dict[str, int] = {"l1": L1, "l2": L2, "linf": LINF, "l0": L0}
#: The names, in the order the API documents them.
NORM_NAMES: tuple[str, ...] = tuple(NORMS)


def norm_code(name: str) -> int:
    """Kernel code of a norm name (raises ``KeyError`` when unknown)."""
    return NORMS[name]


@njit(cache=True, nogil=True, inline="always")
def acc(norm, total, term):
    """Fold one non-negative per-feature cost ``term`` into the accumulated ``total``."""
    if norm == L1 or norm == L0:
        return total + term
    if norm == L2:
        return total + term * term
    return max(total, term)


@njit(cache=True, nogil=True, inline="always")
def fold(norm, total, term):
    """Fold a *distance* ``term`` into a distance ``total`` (used where distances, not
    accumulated values, are combined: the farthest admissible point)."""
    if norm == L1 or norm == L0:
        return total + term
    if norm == LINF:
        return max(total, term)
    return math.hypot(total, term)


@njit(cache=True, nogil=True, inline="always")
def key(norm, total, changes):
    """Search key: the accumulated cost, or for ``l0`` the pair (changes, weighted l1)
    folded into one float, ordered lexicographically: ``changes + l1 / (1 + l1)``.

    The fraction is kept below 1 so the number of changes is always exact. The l1
    tie-break is resolved to float64 precision of the folded key: two l1 values are told
    apart when they differ by more than about ``2e-16 * (1 + l1) ** 2`` (with the default
    unit-free weights l1 is at most a few units, so ties are broken exactly in practice).
    """
    if norm == L0:
        frac = total / (1.0 + total) if total < np.inf else 1.0
        # Never up to the next count: with 2 or more changes, a fraction just below 1 (an
        # l1 of about 4.5e15 and more) rounded the sum up, one change too many.
        return min(changes + frac, np.nextafter(changes + 1.0, 0.0))
    return total


@njit(cache=True, nogil=True, inline="always")
def accumulate_radius(norm, radius):
    """A distance as an accumulated bound (squared for ``l2``)."""
    return radius * radius if norm == L2 else radius


def finish(norm: int, accumulated: float) -> float:
    """The distance a caller sees from an accumulated value (see the module docs)."""
    if norm == L0:
        return float(math.floor(accumulated))  # the number of changes; the fraction is the tie-break
    return math.sqrt(accumulated) if norm == L2 else float(accumulated)


__all__ = [
    "L0",
    "L1",
    "L2",
    "LINF",
    "NORMS",
    "N_NORMS",
    "NORM_NAMES",
    "acc",
    "accumulate_radius",
    "finish",
    "fold",
    "key",
    "norm_code",
]
