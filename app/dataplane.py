"""The query data plane: a request body in, a JSON-ready answer out.

``POST /v1/models/{id}/counterfactuals`` and ``cfmaps query`` both call
:func:`counterfactual_answer`, so they decode, validate and format a query the same way.
Validation happens once:

* :class:`~app.schemas.FeatureCodec` decodes the instances (names, missing features,
  numbers only), which is about the JSON shape, not about the model;
* the engine checks everything about the model (legal domain, integral values, one-hot
  groups, option names and bounds, class labels) and says which row and which field are
  at fault; this module only turns that into the request's path (``instances.3.AGE``).

The only checks made here are the service's own limits (batch size, ``k``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from maps_core import CounterfactualMaps, InvalidQueryError

from .errors import InvalidInputError
from .schemas import CounterfactualRequest, FeatureCodec, py_scalar, result_json

__all__ = ["QueryLimits", "counterfactual_answer"]


@dataclass(frozen=True)
class QueryLimits:
    """The service's per-request limits (``CFMAPS_MAX_BATCH``, ``CFMAPS_MAX_K``) and the
    norm of a query that names none (``CFMAPS_DEFAULT_NORM``)."""

    max_batch: int = 1000
    max_k: int = 100
    default_norm: str = "l1"


def _request_path(exc: InvalidQueryError, single: bool) -> str | None:
    """Where an engine error points in the request: a row's value becomes
    ``instance.<feature>`` or ``instances.<row>.<feature>``; other fields keep their own
    path (``weights.AGE``, ``target``)."""
    if exc.row is None:
        return exc.field
    base = "instance" if single else f"instances.{exc.row}"
    return f"{base}.{exc.field}" if exc.field and exc.field != "instance" else base


def counterfactual_answer(
    maps: CounterfactualMaps,
    codec: FeatureCodec,
    body: CounterfactualRequest,
    limits: QueryLimits,
    *,
    resolve_target: Callable[[Any], Any] | None = None,
    display: Callable[[Any], Any] = py_scalar,
) -> dict[str, Any]:
    """Exact counterfactuals for a request body, as the JSON object the API returns.

    Parameters
    ----------
    maps : CounterfactualMaps
    codec : FeatureCodec
        The model's feature names and types.
    body : CounterfactualRequest
        A validated request (pydantic has checked its shape).
    limits : QueryLimits
    resolve_target : callable, optional
        Maps the request's ``target`` (a display name or a label) to the model's label; the
        engine then checks that label. Default: the target as given.
    display : callable
        A class label as the response shows it.

    Returns
    -------
    dict
        One result object for ``instance``; ``{"results": [...]}`` for ``instances``.

    Raises
    ------
    InvalidInputError, PayloadTooLargeError
        A malformed instance, a batch or ``k`` over the limits.
    InvalidQueryError
        What the engine refuses, with ``field`` as the request's path.
    """
    X, single = codec.matrix(body, limits.max_batch)
    if body.k > limits.max_k:
        raise InvalidInputError(f"k must be at most {limits.max_k}", "k")
    target = body.target if resolve_target is None else resolve_target(body.target)
    try:
        results = maps.counterfactuals(
            X,
            target,
            norm=body.norm or limits.default_norm,
            weights=body.weights,
            immutable=body.immutable,
            direction=body.direction,
            bounds=None if body.bounds is None else {k: list(v) for k, v in body.bounds.items()},
            k=body.k,
            group_costs=body.group_costs,
        )
    except InvalidQueryError as exc:
        exc.field = _request_path(exc, single)
        raise
    out = [result_json(r, codec, body.k, display) for r in results]
    return out[0] if single else {"results": out}
