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

from ..ensemble import FlatEnsemble
from ..exceptions import UnsupportedModelError
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
    raise UnsupportedModelError(
        f"unsupported model type {type(model).__name__!r}; supported: {', '.join(supported)}"
    )


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


__all__ = ["ADAPTERS", "Adapter", "adapter_for", "check_model", "flatten_model", "prepare_model"]
