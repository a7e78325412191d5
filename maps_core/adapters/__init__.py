"""Adapters that turn fitted models into :class:`~maps_core.ensemble.FlatEnsemble`.

One module per model library, each exporting an :class:`Adapter` registered here. An
adapter states what it accepts, prepares the object the engine reads (:meth:`Adapter.prepare`:
LightGBM's and XGBoost's objects in memory become their parsed model files, whose
``predict`` the engine emulates), checks a model's structure before any of the library's
own code runs on it (:meth:`Adapter.check`: a crafted tree must never reach a compiled
``predict`` that trusts it), and flattens it, stating the library's split rule
(:mod:`maps_core.splits`) and tie-break in the flat ensemble.

Adding a library means one module here (an :class:`Adapter`, registered below) plus, for
the service, one reader of its file format in :mod:`app.modelio`.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..ensemble import FlatEnsemble
from ..exceptions import MapsError, UnsupportedModelError
from ..results import py_scalar
from .lightgbm_text import LIGHTGBM
from .sklearn import SKLEARN
from .xgboost_json import XGBOOST


class Adapter(Protocol):
    """What the registry needs of a model library's adapter."""

    #: Short name of the library (``"sklearn"``).
    name: str
    #: Model types it supports, for error messages.
    supported: tuple[str, ...]

    def accepts(self, model: Any) -> bool:
        """Whether the model belongs to this adapter's library (supported or not: the
        adapter then explains what is wrong with it)."""
        ...

    def prepare(self, model: Any) -> Any:
        """The object :meth:`check`, :meth:`flatten` and the build's labels read for an
        accepted model (the model itself, or its parsed file); its ``predict`` must be the
        library's decision and its ``classes_`` the labels.

        Raises :class:`UnsupportedModelError` (message names the problem)."""
        ...

    def check(self, model: Any) -> None:
        """Refuse a model whose structure could crash or hang code that trusts it.

        Raises :class:`UnsupportedModelError` (message names the problem)."""
        ...

    def flatten(self, model: Any) -> FlatEnsemble:
        """The flat ensemble of a supported, fitted model."""
        ...


#: The registered adapters, asked in order.
ADAPTERS: list[Adapter] = [SKLEARN, LIGHTGBM, XGBOOST]


def adapter_for(model: Any) -> Adapter:
    """The adapter of the model's library.

    Raises
    ------
    UnsupportedModelError
        When no registered adapter accepts the model.
    """
    for adapter in ADAPTERS:
        if adapter.accepts(model):
            return adapter
    supported = [k for a in ADAPTERS for k in a.supported]
    kind = type(model)
    # Named with its module: a subclass of a supported class that keeps its name (and may
    # predict otherwise) read "unsupported model type 'RandomForestClassifier'"
    name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")
    raise UnsupportedModelError(
        f"unsupported model type {name!r}; supported: {', '.join(supported)}")


def prepare_model(model: Any) -> Any:
    """The object the engine reads for a model (see :meth:`Adapter.prepare`): a LightGBM
    or XGBoost object in memory becomes its parsed model file; anything else is returned
    as it is (:func:`flatten_model` refuses what no adapter accepts).

    Raises
    ------
    UnsupportedModelError
        An accepted object that cannot be prepared (unfitted, or refused by its format).
    """
    for adapter in ADAPTERS:
        if adapter.accepts(model):
            return adapter.prepare(model)
    return model


def check_model(model: Any) -> None:
    """Structural check of a freshly loaded model by its adapter (see :meth:`Adapter.check`);
    objects no adapter accepts are left to :func:`flatten_model` to refuse."""
    for adapter in ADAPTERS:
        if adapter.accepts(model):
            adapter.check(adapter.prepare(model))
            return


def flatten_model(model: Any) -> FlatEnsemble:
    """Convert a fitted tree-ensemble classifier to a :class:`FlatEnsemble`.

    Parameters
    ----------
    model : estimator
        A fitted model of a registered library (see :data:`ADAPTERS`; each adapter's
        ``supported`` names the model types it takes), or its parsed model file.

    Returns
    -------
    FlatEnsemble

    Raises
    ------
    UnsupportedModelError
        For any other object, an unfitted, malformed or multi-output model.
    """
    adapter = adapter_for(model)
    return adapter.flatten(adapter.prepare(model))


def check_flattened(model: Any, ens: FlatEnsemble, n_points: int = 256) -> None:
    """Check that ``ens`` (:func:`flatten_model` of ``model``) decides as the model's own
    ``predict`` on seeded points around its thresholds, wherever its margin is clear.

    A file assembled from a fitted model's parts with one changed (``classes_`` of
    another length, an ``n_classes_`` that disagrees, a tree of another model) flattens
    into trees that no longer are the model: served, it would answer wrong or fail on
    every query. For untrusted uploads; a model's library may refuse such an object
    anywhere, so any error of its ``predict`` counts.

    Parameters
    ----------
    model : estimator
        The model as loaded (its ``predict`` and ``classes_``).
    ens : FlatEnsemble
    n_points : int
        Points tried, each feature at one of its thresholds moved by a small random
        amount (or a standard normal value on a feature without splits).

    Raises
    ------
    UnsupportedModelError
        When the model's own ``predict`` fails or disagrees, or its leaf values or base
        scores are not finite.
    """
    if not (np.all(np.isfinite(ens.node_value)) and np.all(np.isfinite(ens.base))):
        # a learning rate or baseline of nan/inf: every score is nan, every answer noise
        raise UnsupportedModelError("the model's leaf values or base scores are not finite")
    rng = np.random.default_rng(0)
    m = ens.n_features
    X = rng.normal(size=(n_points, m))
    for f in range(m):
        t = ens.thresholds(f)
        t = t[np.isfinite(t)]
        if t.size:
            base = rng.choice(t, n_points)
            X[:, f] = base + rng.normal(scale=1e-3, size=n_points) * np.maximum(1.0, np.abs(base))
    X = np.clip(X, -3e38, 3e38)  # within float32's range, which some libraries require
    try:
        own = np.asarray(model.predict(X)).ravel()
        idx, margin = ens.predict_margin(X)
        labels = [py_scalar(c) for c in ens.classes]
        # 1 and 1.0 are one label, True and 1 are not (as target_index reads them)
        pos = {(isinstance(c, bool), c): i for i, c in enumerate(labels)}
        got = np.array([pos.get((isinstance(v, bool), v), -1)
                        for v in (py_scalar(u) for u in own)])
    except MapsError:
        raise
    except Exception as exc:  # the library's own refusal of a malformed object
        raise UnsupportedModelError(
            f"the model's own predict fails: {type(exc).__name__}: {exc}") from None
    # Clear: well past the last bits in which a library's own sums differ from these
    # (XGBoost adds float32 scores over hundreds of trees: about 1e-5 of a unit)
    clear = margin > 1e-4 * np.maximum(1.0, np.abs(margin).max(initial=0.0))
    if got.shape != idx.shape or np.any((got != idx) & clear):
        raise UnsupportedModelError(
            "the model's own predict disagrees with its trees (a classes_ or n_classes_ "
            "that does not match them?): the file is inconsistent")


__all__ = ["ADAPTERS", "Adapter", "adapter_for", "check_flattened", "check_model", "flatten_model",
           "prepare_model"]
