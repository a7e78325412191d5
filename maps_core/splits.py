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
<maps_core.ensemble.FlatEnsemble.split_rule>`. Everything downstream works on the model's
*view* of an input (``float32(x)`` or ``x``) and on canonical thresholds ``s`` for which the
node sends the view left iff ``view <= s`` (:func:`canonical_thresholds`), so the grid, the
extraction and the search are the same code for every rule; the kernels only ask
:func:`model_view`, :func:`next_up` and :func:`next_down` for the view's lattice.
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
    if integral:
        # x <= t  <=>  x <= floor(t);  x < t  <=>  x <= ceil(t) - 1
        return np.ceil(t) - 1.0 if strict else np.floor(t)
    if view32:
        s = floor32(t)  # the largest view <= t
        if strict:  # the largest view < t
            eq = s == t
            s[eq] = np.nextafter(s[eq].astype(np.float32), np.float32(-np.inf)).astype(np.float64)
        return s
    return np.nextafter(t, -np.inf) if strict else t


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
    "FLOAT64_LE",
    "SPLIT_RULES",
    "canonical_thresholds",
    "floor32",
    "model_view",
    "next_down",
    "next_up",
    "rule_flags",
]
