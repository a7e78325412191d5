"""Queries: counterfactuals and the model's own predictions."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Path, Request
from starlette.concurrency import run_in_threadpool

from ..dataplane import QueryLimits, counterfactual_answer
from ..responses import SafeJSONResponse as JSONResponse
from ..schemas import (
    CounterfactualBatchOut,
    CounterfactualOut,
    CounterfactualRequest,
    ErrorResponse,
    PredictBatchOut,
    PredictionOut,
    PredictRequest,
)
from ..security import require_query
from .deps import MODEL_ID_DOC, MetricsDep, RegistryDep, SettingsDep, charge

router = APIRouter(prefix="/v1/models", tags=["queries"], dependencies=[Depends(require_query)])

ModelId = Annotated[str, Path(description=MODEL_ID_DOC)]
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse, "description": d}
    for s, d in {
        400: "Malformed body (not JSON, or a broken encoding)",
        401: "Missing bearer token",
        403: "Wrong token",
        404: "Unknown model",
        409: "Model not ready",
        413: "Body or batch too large",
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
    entry = registry.get_ready(model_id)
    assert entry.maps is not None
    charge(request, _count(body) * min(int(body.k), settings.max_k))
    limits = QueryLimits(settings.max_batch, settings.max_k, settings.default_norm)
    # CPU-bound engine work runs in the threadpool so the event loop keeps serving.
    answer = await run_in_threadpool(
        counterfactual_answer, entry.maps, entry.codec, body, limits,
        resolve_target=entry.resolve_target, display=entry.display,
    )
    metrics.counterfactuals.inc(len(answer["results"]) if "results" in answer else 1)
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
    entry = registry.get_ready(model_id)
    charge(request, _count(body))
    X, single = entry.codec.matrix(body, settings.max_batch)
    labels, proba = await run_in_threadpool(_predict, entry.model, X)
    names = [str(c) for c in entry.classes]
    out = [
        {
            "prediction": entry.display(labels[i]),
            "probabilities": {n: float(p) for n, p in zip(names, proba[i], strict=True)},
        }
        for i in range(X.shape[0])
    ]
    return JSONResponse(out[0] if single else {"results": out})


def _count(body: PredictRequest | CounterfactualRequest) -> int:
    """Instances a body asks about (the codec checks the batch limit afterwards)."""
    return len(body.instances) if body.instances is not None else 1


def _predict(model: Any, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return model.predict(X), model.predict_proba(X)
