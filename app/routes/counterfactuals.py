"""Queries: counterfactuals, the model's own predictions, and the map picture."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import ValidationError

from ..dataplane import (
    QueryLimits,
    check_answers,
    check_map_size,
    check_model_reads,
    counterfactual_answer,
    map_picture,
    model_predictions,
    runs_inline,
)
from ..errors import InvalidInputError, validation_details
from ..responses import SafeJSONResponse as JSONResponse
from ..schemas import (
    CounterfactualBatchOut,
    CounterfactualOut,
    CounterfactualRequest,
    ErrorResponse,
    MapRequest,
    PredictBatchOut,
    PredictionOut,
    PredictRequest,
)
from ..security import require_query
from .deps import (
    MODEL_ID_DOC,
    MetricsDep,
    RegistryDep,
    SettingsDep,
    charge,
    charged,
    in_thread,
    known_query,
    model_entry,
    until_disconnect,
)
from .lean import LeanJSONRoute

# LeanJSONRoute: the JSON query routes skip FastAPI's generic request handling on the happy
# path (app/routes/lean.py); the OpenAPI document and every error answer are FastAPI's.
router = APIRouter(prefix="/v1/models", tags=["queries"],
                   dependencies=[Depends(require_query), Depends(known_query)],
                   route_class=LeanJSONRoute)

ModelId = Annotated[str, Path(description=MODEL_ID_DOC)]
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse, "description": d}
    for s, d in {
        400: "Malformed request (a body that is no JSON this service reads is the 422 naming `body`)",
        401: "Missing bearer token",
        403: "Wrong token",
        404: "Unknown model",
        409: "Model not ready",
        413: "Body or batch too large, or instances times `k` above `CFMAPS_MAX_ANSWERS`",
        422: "Invalid input (the `field` names it)",
        429: "Rate limit reached (`CFMAPS_RATE_LIMIT_PER_MINUTE`; see `Retry-After`)",
    }.items()
}


@router.post(
    "/{model_id}/counterfactuals",
    response_model=CounterfactualOut | CounterfactualBatchOut,
    responses=_ERRORS,
    summary="Exact nearest counterfactuals",
)
async def counterfactuals(
    request: Request,
    model_id: ModelId,
    body: CounterfactualRequest,
    registry: RegistryDep,
    settings: SettingsDep,
    metrics: MetricsDep,
) -> JSONResponse:
    """Certified nearest inputs that the model assigns to the target class.

    With ``instance`` the answer is one result object; with ``instances`` it is
    ``{"results": [...]}`` in input order. ``norm`` defaults to the service's
    ``CFMAPS_DEFAULT_NORM`` (``l1`` unless configured).
    """
    entry = await model_entry(registry, model_id, ready=True)
    assert entry.maps is not None
    n = entry.codec.check_count(body, settings.max_batch)  # a 413 costs no answers
    limits = _limits(settings)
    check_answers(n, body.k, limits)
    query = functools.partial(counterfactual_answer, entry.maps, entry.codec, body, limits,
                              resolve_target=entry.target_resolver(), display=entry.display)
    k = min(int(body.k), settings.max_k)
    # a request over the whole limit names what to shrink: k when one instance asks too much
    if n == 1 and k > 1:
        field, advice = "k", "ask for fewer alternatives (a smaller k)"
    else:
        field = "instances"
        advice = "split it into smaller batches" + (" or ask for a smaller k" if k > 1 else "")
    with charged(request, n * k, field=field, advice=advice):
        # CPU-bound engine work runs in a worker thread so that the event loop keeps
        # serving, unless it is bounded and short (runs_inline): then the hop costs more.
        if runs_inline(entry.maps, body):
            answer = query()
        else:
            answer = await until_disconnect(request, query)
    results = answer["results"] if "results" in answer else [answer]
    metrics.counterfactuals.inc(len(results))
    unproven = sum(not r["optimal"] for r in results)
    if unproven:
        metrics.unproven.inc(unproven)
    return JSONResponse(answer)


@router.post(
    "/{model_id}/predict",
    response_model=PredictionOut | PredictBatchOut,
    responses=_ERRORS,
    summary="The model's own labels and class probabilities",
)
async def predict(
    request: Request,
    model_id: ModelId,
    body: PredictRequest,
    registry: RegistryDep,
    settings: SettingsDep,
) -> JSONResponse:
    """Labels and probabilities from the uploaded model itself (not from the maps)."""
    entry = await model_entry(registry, model_id, ready=True)
    assert entry.maps is not None
    X, single = entry.codec.matrix(body, settings.max_batch)  # bad input costs no answers
    check_model_reads(entry.maps, entry.codec, X, single)
    charge(request, X.shape[0])
    labels, proba = await in_thread(model_predictions, entry.model, X)
    names = [str(c) for c in entry.classes]
    out = [
        {
            "prediction": entry.display(labels[i]),
            "probabilities": {n: float(p) for n, p in zip(names, proba[i], strict=True)},
        }
        for i in range(X.shape[0])
    ]
    return JSONResponse(out[0] if single else {"results": out})


def _limits(settings: Any) -> QueryLimits:
    return QueryLimits(
        max_batch=settings.max_batch, max_k=settings.max_k, default_norm=settings.default_norm,
        map_max_side=settings.map_max_side, max_boxes=settings.query_max_boxes,
        max_answers=settings.max_answers, max_seconds=settings.query_max_seconds,
        max_memory=settings.effective_query_memory(), threads=settings.query_threads,
        on_budget=settings.query_on_budget)


_PNG: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
        "description": "The slice as a PNG; `X-Map-Extent`, `X-Map-Classes`, `X-Map-Colours` "
        "and `X-Map-Counterfactual` headers describe it (JSON).",
    },
    **_ERRORS,
}


#: Pixels of a map picture counted as one answer by the rate limit: a picture shows the
#: decision over a whole slice, so it is charged by its size (the default 480x360 counts
#: as 169 answers).
PIXELS_PER_ANSWER = 1024


async def _picture(model_id: str, body: MapRequest, registry: Any, settings: Any,
                   request: Request) -> Response:
    entry = await model_entry(registry, model_id, ready=True)
    assert entry.maps is not None
    body = check_map_size(body, settings.map_max_side)  # an oversize picture costs no answers
    with charged(request, -(-body.width * body.height // PIXELS_PER_ANSWER), field="width",
                 advice="ask for a smaller picture"):
        png, headers = await in_thread(
            map_picture, entry.maps, entry.codec, body, _limits(settings),
            resolve_target=entry.target_resolver(), display=entry.display,
        )
    return Response(png, media_type="image/png", headers={**headers, "Cache-Control": "no-store"})


@router.post("/{model_id}/map.png", response_class=Response, responses=_PNG,
             summary="Picture of a two-feature slice of the map")
async def map_png_post(
    request: Request, model_id: ModelId, body: MapRequest, registry: RegistryDep,
    settings: SettingsDep
) -> Response:
    """The classes over two features, every other feature held at the instance's value,
    read from the maps (certified rectangles, mixed regions decided exactly), with the
    boundaries the slice crosses, the instance and its nearest counterfactual in the slice.
    Pixel ``(row, col)`` shows ``a = a_lo + (col + 0.5)(a_hi - a_lo)/width`` and
    ``b = b_hi - (row + 0.5)(b_hi - b_lo)/height``, rounded on integral features."""
    return await _picture(model_id, body, registry, settings, request)


def _numbers(text: str, field: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise InvalidInputError(f"{field} must be comma-separated numbers", field) from None


@router.get("/{model_id}/map.png", response_class=Response, responses=_PNG,
            summary="Picture of a two-feature slice of the map (query parameters)")
async def map_png(
    request: Request,
    model_id: ModelId,
    registry: RegistryDep,
    settings: SettingsDep,
    features: Annotated[list[str], Query(description=(
        "Two feature names: `a,b`, or the parameter twice (`features=a&features=b`) for "
        "names holding a comma."))],
    instance: Annotated[str, Query(description="All feature values in column order, "
                                   "comma-separated.")],
    width: Annotated[int | None, Query(ge=1, description=(
        "Pixels. Default 480, or the service's largest side when smaller."))] = None,
    height: Annotated[int | None, Query(ge=1, description=(
        "Pixels. Default 360, scaled with the width's default."))] = None,
    target: Annotated[str | None, Query(description="Class of the counterfactual drawn.")] = None,
    norm: Annotated[str | None, Query()] = None,
    a_range: Annotated[str | None, Query(description="`lo,hi` along the first feature.")] = None,
    b_range: Annotated[str | None, Query(description="`lo,hi` along the second feature.")] = None,
    overlay: bool = True,
) -> Response:
    """As the POST, with the instance as comma-separated values in column order."""
    await model_entry(registry, model_id, ready=True)  # a 404 or 409 before a bad value
    fields: dict[str, Any] = {
        "features": features[0].split(",") if len(features) == 1 else features,
        "instance": _numbers(instance, "instance"),
        "target": target, "norm": norm, "overlay": overlay,
    }
    for key, size in (("width", width), ("height", height)):
        if size is not None:  # else MapRequest's default, fitted to the service's limit
            fields[key] = size
    for key, text in (("a_range", a_range), ("b_range", b_range)):
        if text is not None:
            fields[key] = _numbers(text, key)
    try:
        body = MapRequest.model_validate(fields)
    except ValidationError as exc:
        # the body route's words, on the query parameter as a whole (a_range, not a_range.0)
        errors = exc.errors()
        message = validation_details(errors)[0]["message"]
        where = ".".join(str(p) for p in errors[0]["loc"][:1])
        raise InvalidInputError(f"{where}: {message}", where) from None
    return await _picture(model_id, body, registry, settings, request)
