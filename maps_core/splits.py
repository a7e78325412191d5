"""How a model compares an input with a split threshold: its *split rule*.

Every library sends ``x`` left at a node by its own comparison, on its own view of ``x``:

========================  ===================  ========================================
rule                      comparison           libraries
========================  ===================  ========================================
``"float32<="``           ``float32(x) <= t``  scikit-learn trees and forests
``"float32<"``            ``float32(x) < t``   XGBoost
``"float64<="``           ``x <= t``           LightGBM, HistGradientBoosting
========================  ===================  ========================================

An adapter states the rule in :attr:`FlatEnsemble.split_rule
<maps_core.ensemble.FlatEnsemble.split_rule>`. A node's threshold becomes a canonical
threshold ``s`` of the model's *view* of an input (``float32(x)`` or ``x``): the node sends
the view left iff ``view <= s`` (:func:`canonical_thresholds`), which is how the grid
locates an input. Clients send real numbers (float64 JSON), so everything stated to them
(distances, regions, the returned point) lives on the real line: :func:`real_boundaries`
turns ``s`` into the point ``b`` where the model's decision along the feature changes and
the side that owns ``b``:

* ``x <= t`` on float64: ``b = t``, owned by the left side;
* a float32 view (``float32(x) <= t`` and ``float32(x) < t`` alike, once ``s`` is the last
  float32 sent left): float32 rounding to nearest sends every real ``x`` below the
  midpoint ``b`` of ``s`` and the next float32 to ``s`` and every one above to the next
  float32, so ``b`` is that midpoint (exact in float64), owned by the side its own rounding
  (ties to even) goes to. For scikit-learn's split ``1.68 < x`` stored as the float32
  1.6799999475479126, the real inputs 1.68 and below go left.

Integer features take the integer cut below ``b`` (the last integer the node sends left),
which stays right when float32 cannot represent every integer (beyond 2**24).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .exceptions import UnsupportedModelError

FLOAT32_LE = "float32<="
FLOAT32_LT = "float32<"
FLOAT64_LE = "float64<="
#: Every rule the engine knows, with (view is float32, comparison is strict).
SPLIT_RULES: dict[str, tuple[bool, bool]] = {
    FLOAT32_LE: (True, False),
    FLOAT32_LT: (True, True),
    FLOAT64_LE: (False, False),
}


def rule_flags(rule: str) -> tuple[bool, bool]:
    """(view is float32, comparison is strict) of a rule name.

    Raises
    ------
    UnsupportedModelError
        For a rule the engine does not know.
    """
    try:
        return SPLIT_RULES[rule]
    except KeyError:
        raise UnsupportedModelError(
            f"unknown split rule {rule!r}; known: {', '.join(SPLIT_RULES)}"
        ) from None


#: Largest finite float32, as a float64: a float32 view turns anything beyond it into inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: Least float64 whose float32 cast is inf: FLOAT32_MAX plus half its ulp (the tie rounds
#: to even, here up).
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103


def beyond_view(rule: str, X: np.ndarray) -> tuple[int, int] | None:
    """First (row, column) of ``X`` (finite, shape (n, m)) that the rule's float32 view
    cannot hold: its float32 cast is an infinity (beyond :data:`FLOAT32_MAX` by half a
    float32 ulp or more; nearer values round to it). scikit-learn refuses such a value in
    its own ``predict`` ("a value too large for dtype('float32')"). ``None`` when every
    value fits, or when the rule reads float64.
    """
    if not rule_flags(rule)[0]:
        return None
    with np.errstate(over="ignore"):  # the overflow is what is looked for
        bad = np.isinf(np.asarray(X, dtype=np.float64).astype(np.float32))
    if not bad.any():
        return None
    i, j = np.argwhere(bad)[0]
    return int(i), int(j)


def floor32(t: np.ndarray) -> np.ndarray:
    """Largest float32 values ``<= t`` (elementwise), returned as float64."""
    t = np.asarray(t, dtype=np.float64)
    f = t.astype(np.float32)
    up = f.astype(np.float64) > t
    f[up] = np.nextafter(f[up], np.float32(-np.inf))
    return f.astype(np.float64)


def canonical_thresholds(t: np.ndarray, rule: str, integral: bool) -> np.ndarray:
    """Thresholds ``s`` such that the node sends an input left iff its view is ``<= s``.

    Parameters
    ----------
    t : ndarray of shape (k,)
        The model's thresholds on one feature.
    rule : str
        The model's split rule (see the module docs).
    integral : bool
        Whether the feature's legal values are integers (then ``s`` is an integer: ``1.5``
        and ``1.9`` are one cut).

    Returns
    -------
    ndarray of shape (k,), float64
    """
    view32, strict = rule_flags(rule)
    t = np.asarray(t, dtype=np.float64)
    if view32:
        s = floor32(t)  # the largest view <= t
        if strict:  # the largest view < t
            eq = s == t
            with np.errstate(over="ignore"):  # below the lowest float32: -inf, nothing left
                s[eq] = np.nextafter(s[eq].astype(np.float32),
                                     np.float32(-np.inf)).astype(np.float64)
    else:
        s = np.nextafter(t, -np.inf) if strict else t
    if not integral:
        return s
    # The last integer sent left: below the real boundary, or on it when the left side
    # owns it (x <= 2.5 -> 2; float32(x) <= 3.0 -> 3).
    b, left_owns = real_boundaries(s, rule)
    cut = np.floor(b)
    below = (cut == b) & ~left_owns
    cut[below] = previous_integer(cut[below])
    return cut


def previous_integer(v: np.ndarray) -> np.ndarray:
    """The largest integer below each integer of ``v``: ``v - 1``, except from 2**53 on,
    where every float64 is an integer and ``v - 1`` rounds back to ``v`` (a timestamp in
    nanoseconds, about 1.7e18, has 256 between neighbours)."""
    return np.minimum(v - 1.0, np.nextafter(v, -np.inf))


def next_integer(v: np.ndarray) -> np.ndarray:
    """The smallest integer above each integer of ``v`` (see :func:`previous_integer`)."""
    return np.maximum(v + 1.0, np.nextafter(v, np.inf))


def real_boundaries(s: np.ndarray, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Where on the real line the view thresholds ``s`` split, and which side owns the point.

    Parameters
    ----------
    s : ndarray of shape (k,)
        Canonical thresholds (:func:`canonical_thresholds` of a continuous feature): values
        of the model's view.
    rule : str
        The model's split rule.

    Returns
    -------
    b : ndarray of shape (k,), float64
        Real inputs ``x < b`` go left, ``x > b`` go right.
    left_owns : ndarray of shape (k,), bool
        Whether ``x == b`` goes left.
    """
    s = np.asarray(s, dtype=np.float64)
    view32, _ = rule_flags(rule)
    if not view32:
        return s.copy(), np.ones(s.shape, dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):
        s32 = s.astype(np.float32)
        up = np.nextafter(s32, np.float32(np.inf)).astype(np.float64)
        # Above the largest float32, rounding overflows to inf half an ulp past it.
        top = ~np.isfinite(up)
        up[top] = s[top] + (s[top] - np.nextafter(s32[top], np.float32(-np.inf)).astype(np.float64))
        # The midpoint of two adjacent float32 needs 25 significant bits: exact in float64.
        b = s + (up - s) / 2.0
        b[np.isneginf(s)] = -np.inf  # a node that sends no finite input left
        left_owns = b.astype(np.float32).astype(np.float64) == s
    return b, left_owns


@njit(cache=True, nogil=True, inline="always")
def model_view(v, view32):
    """The value the model compares: ``float32(v)`` or ``v`` itself, as float64."""
    return np.float64(np.float32(v)) if view32 else v


@njit(cache=True, nogil=True, inline="always")
def next_up(v, view32):
    """Smallest value of the view's lattice strictly above the lattice value ``v``."""
    if view32:
        return np.float64(np.nextafter(np.float32(v), np.float32(np.inf)))
    return np.nextafter(v, np.inf)


@njit(cache=True, nogil=True, inline="always")
def next_down(v, view32):
    """Largest value of the view's lattice strictly below the lattice value ``v``."""
    if view32:
        return np.float64(np.nextafter(np.float32(v), np.float32(-np.inf)))
    return np.nextafter(v, -np.inf)


__all__ = [
    "FLOAT32_LE",
    "FLOAT32_LT",
    "FLOAT32_MAX",
    "FLOAT32_OVERFLOW",
    "FLOAT64_LE",
    "SPLIT_RULES",
    "beyond_view",
    "canonical_thresholds",
    "floor32",
    "model_view",
    "next_down",
    "next_integer",
    "next_up",
    "previous_integer",
    "real_boundaries",
    "rule_flags",
]
