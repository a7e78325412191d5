"""Adapters that turn fitted models into :class:`~maps_core.ensemble.FlatEnsemble`."""

from .sklearn import flatten_model

__all__ = ["flatten_model"]
