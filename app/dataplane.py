"""The query data plane: a request body in, a JSON-ready answer out.

``POST /v1/models/{id}/counterfactuals`` and ``cfmaps query`` both call
:func:`counterfactual_answer`, so they decode, validate and format a query the same way.
Validation happens once:

* :class:`~app.schemas.FeatureCodec` decodes the instances (names, missing features,
  numbers only), which is about the JSON shape, not about the model;
* the engine checks everything about the model (legal domain, integral values, one-hot
  groups, option names and bounds, class labels) and says which row and which field are
  at fault; this module only turns that into the request's path (``instances.3.AGE``).

The only checks made here are the service's own limits (batch size, ``k``, answers per
request: :func:`check_answers`), and, before
``POST /v1/models/{id}/predict`` hands rows to the uploaded model itself
(:func:`check_model_reads`), the values its float32 view cannot hold.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from maps_core import BudgetExceededError, CounterfactualMaps, InvalidQueryError, py_scalar
from maps_core.slices import map_slice
from maps_core.splits import FLOAT32_MAX, beyond_view

from .errors import InvalidInputError, PayloadTooLargeError
from .mapimage import class_colours, png_bytes, render
from .schemas import MAP_DEFAULT_SIZE, CounterfactualRequest, FeatureCodec, MapRequest, results_json

__all__ = ["INLINE_MAX_RECTANGLES", "QueryLimits", "check_answers", "check_model_reads",
           "counterfactual_answer", "map_picture", "model_predictions", "runs_inline"]

#: Largest maps (certified rectangles, no mixed region) whose single-instance queries run
#: on the event loop instead of a worker thread (:func:`runs_inline`).
INLINE_MAX_RECTANGLES = 20_000
_inline: weakref.WeakKeyDictionary[CounterfactualMaps, bool] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class QueryLimits:
    """The service's per-request limits (``CFMAPS_MAX_BATCH``, ``CFMAPS_MAX_K``,
    ``CFMAPS_MAX_ANSWERS``,
    ``CFMAPS_QUERY_MAX_BOXES``, ``CFMAPS_QUERY_MAX_SECONDS``, ``CFMAPS_QUERY_MAX_MEMORY``,
    ``CFMAPS_QUERY_THREADS``, ``CFMAPS_MAP_MAX_SIDE``), the norm of a query that names none
    (``CFMAPS_DEFAULT_NORM``) and what a search beyond its budgets answers when the query
    does not say (``CFMAPS_QUERY_ON_BUDGET``)."""

    max_batch: int = 1000
    max_k: int = 100
    default_norm: str = "l1"
    map_max_side: int = 1024
    max_boxes: int | None = None  # the engine's default
    max_answers: int | None = None  # instances x k; none by default
    max_seconds: float | None = None  # per instance; none by default
    max_memory: int | None = None  # per instance; the engine's default
    threads: int | None = None  # per instance's search; the engine's default
    on_budget: str = "error"  # a search beyond its budgets, when the request does not say


def runs_inline(maps: CounterfactualMaps, body: CounterfactualRequest) -> bool:
    """Whether a query is cheap enough, in the worst case, to answer on the event loop.

    Handing a query to a worker thread and its answer back costs about 0.1-0.25 ms of CPU
    (two thread wake-ups through the kernel), more than a typical query on small maps
    (0.05-0.1 ms). The thread only keeps the event loop free while a query runs (the engine
    holds the GIL, so it adds no parallelism), which matters for long queries only. A query
    is bounded by the size of its maps when they have no mixed region (the search visits at
    most every KD-tree node and rectangle once; mixed regions are refined at query time, up
    to ``CFMAPS_QUERY_MAX_BOXES`` boxes, which can take seconds): one instance on maps of at
    most :data:`INLINE_MAX_RECTANGLES` rectangles takes a few milliseconds at worst, and runs
    inline. Batches and everything else go to the thread pool.
    """
    if body.instances is not None:
        return False
    ok = _inline.get(maps)
    if ok is None:
        part = maps.partition
        ok = _inline[maps] = part.n_mixed == 0 and part.n_rectangles <= INLINE_MAX_RECTANGLES
    return ok


def _request_path(exc: InvalidQueryError, single: bool) -> str | None:
    """Where an engine error points in the request: a row's value becomes
    ``instance.<feature>`` or ``instances.<row>.<feature>``; other fields keep their own
    path (``weights.AGE``, ``target``)."""
    if exc.row is None:
        return exc.field
    return _row_path(exc.field, exc.row, single)


def _row_path(field: str | None, row: int, single: bool) -> str:
    """``instance.<field>`` or ``instances.<row>.<field>`` (the row alone without a field)."""
    base = "instance" if single else f"instances.{row}"
    return f"{base}.{field}" if field and field != "instance" else base


def check_answers(n: int, k: int, limits: QueryLimits) -> None:
    """Refuse a query of ``n`` instances at ``k`` counterfactuals each over the limits:
    ``k`` above ``max_k`` (422), ``n * k`` above ``max_answers`` (413, before the rate
    limit charges them: the answer alone would be tens to hundreds of megabytes).

    Raises
    ------
    InvalidInputError, PayloadTooLargeError
    """
    if k > limits.max_k:
        raise InvalidInputError(f"k must be at most {limits.max_k}", "k")
    if limits.max_answers is not None and n * k > limits.max_answers:
        raise PayloadTooLargeError(
            f"{n} instances at k = {k} ask for {n * k} counterfactuals, above the limit of "
            f"{limits.max_answers} per request: send fewer instances per request, or a "
            "smaller k", "k")


def check_model_reads(maps: CounterfactualMaps, codec: FeatureCodec, X: np.ndarray,
                      single: bool) -> None:
    """Refuse the values of validated rows (finite, right width; shape (n, m)) that the
    uploaded model itself cannot read, before ``POST /v1/models/{id}/predict`` charges or
    runs them: libraries that read features as float32 (scikit-learn's forests and
    boosting, XGBoost) refuse values beyond the float32 range (about 3.4e38), which JSON
    can carry. The row's value is named.
    """
    out = beyond_view(maps.ensemble.split_rule, X)
    if out is not None:
        i, j = out
        name = codec.names[j]
        raise InvalidInputError(
            f"the model reads features as float32 and refuses {float(X[i, j])!r} for "
            f"{name!r} (beyond +-{FLOAT32_MAX:.8g})", _row_path(name, i, single))


def model_predictions(model: Any, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The model's own labels and probabilities for rows it reads
    (:func:`check_model_reads`), as ``POST /v1/models/{id}/predict`` reports them. Any
    exception from the model is a defect, not the client's input, and is left to the 500
    handler."""
    return model.predict(X), model.predict_proba(X)


def counterfactual_answer(
    maps: CounterfactualMaps,
    codec: FeatureCodec,
    body: CounterfactualRequest,
    limits: QueryLimits,
    *,
    resolve_target: Callable[[Any], Any] | None = None,
    display: Callable[[Any], Any] = py_scalar,
    cancel: threading.Event | None = None,
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
        Maps the request's ``target`` (a display name or a label; None for none) to the
        model's label, refusing an unknown class in the client's terms
        (:meth:`~app.registry.ModelEntry.resolve_target`). Default: the target as given,
        for the engine to resolve.
    display : callable
        A class label as the response shows it.
    cancel : threading.Event, optional
        Set when the answer is no longer wanted: the searches stop within about a
        millisecond, with :class:`~maps_core.QueryCancelledError`.

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
    check_answers(X.shape[0], body.k, limits)
    target = body.target if resolve_target is None else resolve_target(body.target)
    max_seconds = limits.max_seconds
    if body.max_seconds is not None:
        if max_seconds is not None and body.max_seconds > max_seconds:
            raise InvalidInputError(
                f"max_seconds must be at most {max_seconds:g} (this service's limit)",
                "max_seconds")
        max_seconds = body.max_seconds
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
            max_boxes=limits.max_boxes,
            max_seconds=max_seconds,
            max_memory=limits.max_memory,
            on_budget=body.on_budget or limits.on_budget,
            threads=limits.threads,
            cancel=cancel,
        )
    except InvalidQueryError as exc:
        exc.field = _request_path(exc, single)
        raise
    except BudgetExceededError as exc:
        # the row whose search ran out, so a client can drop it and send the rest again
        if exc.row is not None:
            exc.field = _row_path(None, exc.row, single)
        raise
    out = results_json(results, codec, body.k, display)
    return out[0] if single else {"results": out}


def default_map_size(max_side: int) -> dict[str, int]:
    """The picture's size when a request gives none: :data:`MAP_DEFAULT_SIZE` shrunk to
    fit ``max_side`` pixels, its 4:3 kept, as ``{"width": w, "height": h}``."""
    scale = min(1.0, max_side / max(MAP_DEFAULT_SIZE))
    return {side: max(1, int(default * scale))
            for side, default in zip(("width", "height"), MAP_DEFAULT_SIZE, strict=True)}


def check_map_size(body: MapRequest, max_side: int) -> MapRequest:
    """``body`` with the default size shrunk to fit ``max_side`` pixels (its 4:3 kept),
    when the request gives no size; refuses a size given wider or higher than that
    (before a rate limit counts it).

    Raises
    ------
    InvalidInputError
        Naming ``width`` or ``height``.
    """
    fitted = {side: v for side, v in default_map_size(max_side).items()
              if side not in body.model_fields_set}
    if fitted:
        body = body.model_copy(update=fitted)
    for field, v in (("width", body.width), ("height", body.height)):
        if v > max_side:
            raise InvalidInputError(f"{field} must be at most {max_side} pixels", field)
    return body


def map_picture(
    maps: CounterfactualMaps,
    codec: FeatureCodec,
    body: MapRequest,
    limits: QueryLimits,
    *,
    resolve_target: Callable[[Any], Any] | None = None,
    display: Callable[[Any], Any] = py_scalar,
) -> tuple[bytes, dict[str, str]]:
    """The PNG of a two-feature slice of the map through ``body.instance``
    (:mod:`maps_core.slices`, drawn by :mod:`app.mapimage`), and the headers that describe
    it: ``X-Map-Extent`` (JSON ``[a_lo, a_hi, b_lo, b_hi]``), ``X-Map-Classes`` (JSON list
    of the class labels in colour order), ``X-Map-Colours`` (JSON list of their fill
    colours, ``"#rrggbb"``, for a legend) and ``X-Map-Counterfactual`` (JSON object of the
    two features' values at the nearest counterfactual *within the slice*, i.e. with every
    other feature held and the spec's own constraints (immutable features, directions) in
    force, or ``null`` when there is none; it may lie outside the extent drawn).

    Raises
    ------
    InvalidInputError
        A malformed instance, an unknown feature, a size over ``map_max_side``.
    InvalidQueryError
        What the engine refuses, with ``field`` as the request's path.
    """
    x = codec.row(body.instance, "instance")
    names = maps.feature_names
    cols = []
    for i, name in enumerate(body.features):
        if name not in names:
            raise InvalidInputError(f"unknown feature {name!r}", f"features.{i}")
        cols.append(names.index(name))
    check_map_size(body, limits.map_max_side)
    a, b = cols
    target = body.target if resolve_target is None else resolve_target(body.target)
    try:
        sl = map_slice(maps, x, a, b, body.width, body.height, body.a_range, body.b_range)
        held = [n for j, n in enumerate(names) if j not in (a, b)]
        res = maps.counterfactual(x, target, norm=body.norm or limits.default_norm,
                                  immutable=held, max_boxes=limits.max_boxes,
                                  max_seconds=limits.max_seconds,
                                  max_memory=limits.max_memory, threads=limits.threads,
                                  on_budget=limits.on_budget)
    except InvalidQueryError as exc:
        exc.field = _request_path(exc, True)
        raise
    cf = res.best
    point = None if cf is None else (float(cf.x[a]), float(cf.x[b]))
    img = render(sl, len(maps.classes), (float(x[a]), float(x[b])), point, overlay=body.overlay)
    headers = {
        "X-Map-Extent": json.dumps(list(sl.extent)),
        "X-Map-Classes": json.dumps([display(c) for c in maps.classes]),
        "X-Map-Colours": json.dumps(["#{:02x}{:02x}{:02x}".format(*map(int, rgb))
                                     for rgb in class_colours(len(maps.classes))]),
        "X-Map-Counterfactual": json.dumps(
            None if cf is None else {names[a]: codec.value(a, cf.x[a]),
                                     names[b]: codec.value(b, cf.x[b])}),
    }
    return png_bytes(img), headers
