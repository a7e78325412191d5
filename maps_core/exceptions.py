"""One exception hierarchy for the whole core.

Every error the library raises on purpose derives from :class:`MapsError`, so a caller
(the HTTP service, the CLI) converts errors to its own vocabulary in exactly one place.
"""

from __future__ import annotations


class MapsError(Exception):
    """Base class of every error raised by :mod:`maps_core`."""


class UnsupportedModelError(MapsError, TypeError):
    """The object handed to the builder is not a fitted, supported tree-ensemble classifier."""


class SchemaError(MapsError, ValueError):
    """A feature schema is malformed or does not match the model.

    Parameters
    ----------
    message : str
        What is wrong, in plain words.
    feature : int, optional
        Position of the feature at fault, when one feature's declaration is (a caller
        names it, e.g. ``spec.features.3``).
    """

    def __init__(self, message: str, feature: int | None = None) -> None:
        super().__init__(message)
        self.feature = feature


class BudgetExceededError(MapsError):
    """A budget ran out: extraction's rectangles or time (when told to stop), or a query's
    search inside the mixed regions a budgeted build left (``query.MAX_MIXED_POPS``).

    Parameters
    ----------
    message : str
        Which budget, and what would help.
    row : int, optional
        Row of the query's input matrix whose search ran out (the first such).
    field : str, optional
        Where a caller's request names that row (``instances.3``), as for
        :class:`InvalidQueryError`; the core leaves it unset.
    """

    def __init__(self, message: str, row: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.row = row
        self.field = field


class QueryCancelledError(MapsError):
    """The caller cancelled a query while it ran (its ``cancel`` event was set): the rows
    not yet searched were not searched. A service sets it when the client has gone away."""


class ArtifactError(MapsError):
    """Base class of errors about persisted maps."""


class ArtifactNotFoundError(ArtifactError, FileNotFoundError):
    """No persisted maps exist at the given path."""


class CorruptArtifactError(ArtifactError):
    """Persisted maps are truncated, tampered with or otherwise unreadable."""


class IncompatibleArtifactError(ArtifactError):
    """Persisted maps were written by an incompatible format version."""


class BuildOptionsError(MapsError, ValueError):
    """A build's options are malformed: a budget that is no positive number, an unknown
    ``on_budget``."""


class InvalidQueryError(MapsError, ValueError):
    """A counterfactual or prediction request is malformed.

    Parameters
    ----------
    message : str
        What is wrong, in plain words.
    field : str, optional
        The offending input (a feature name, ``"target"``, ``"norm"``, ...), so that a caller
        can point at it.
    row : int, optional
        Row of the input matrix at fault, when the error is about one row's values (a
        caller that received a batch names it, e.g. ``instances.3.AGE``).
    """

    def __init__(self, message: str, field: str | None = None, row: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.row = row
