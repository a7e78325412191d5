"""Liveness, readiness and metrics (always open: probes and scrapers carry no tokens), with
the Open Inference Protocol's health routes beside cfmaps' own."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from ..metrics import CONTENT_TYPE
from ..registry import Registry
from ..responses import SafeJSONResponse as JSONResponse
from ..schemas import ErrorResponse, ModelReadyOut, ReadinessOut, ServerReadyOut
from ..siblings import Siblings
from .deps import MODEL_ID_DOC, MetricsDep, RegistryDep, model_entry

ModelId = Annotated[str, Path(description=MODEL_ID_DOC)]

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _ready(request: Request, registry: Registry) -> bool:
    """This process has loaded, and so have its siblings when it has any."""
    siblings: Siblings | None = request.app.state.siblings
    return registry.all_loaded() and (siblings is None or siblings.all_ready())


def _loading(body: type[Any]) -> dict[int | str, dict[str, Any]]:
    return {503: {"model": body,
                  "description": "Still loading the persisted models (`Retry-After: 1`)"}}


@router.get("/readyz", summary="Readiness: every persisted ready model has been loaded",
            response_model=ReadinessOut, responses=_loading(ReadinessOut))
async def readyz(request: Request, registry: RegistryDep) -> JSONResponse:
    """200 once the start-up load of the persisted models has finished, 503 before. Under
    ``cfmaps serve --workers N``, once every one of the N processes has (:mod:`app.siblings`).

    A model whose files fail to load does not hold readiness back forever (it would take
    every other model out of service with it): it is reported ``failed`` by
    ``GET /v1/models/{id}`` and counted here under ``models.failed``.
    """
    counts = registry.counts()
    body = {"models": counts}
    if not _ready(request, registry):
        return JSONResponse(
            {"status": "loading", **body}, status_code=503, headers={"Retry-After": "1"}
        )
    return JSONResponse({"status": "ready", **body})


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(m: MetricsDep) -> Response:
    return Response(m.render(), media_type=CONTENT_TYPE)


# -- Open Inference Protocol (KServe v2) health routes, for platforms that probe them ------
@router.get("/v2/health/live", summary="Open Inference Protocol: server live")
async def v2_live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready", summary="Open Inference Protocol: server ready",
            response_model=ServerReadyOut, responses=_loading(ServerReadyOut))
async def v2_ready(request: Request, registry: RegistryDep) -> JSONResponse:
    """200 ``{"ready": true}`` once the persisted models are loaded (as ``/readyz``), 503
    ``{"ready": false}`` before."""
    if not _ready(request, registry):
        return JSONResponse({"ready": False}, status_code=503, headers={"Retry-After": "1"})
    return JSONResponse({"ready": True})


@router.get(
    "/v2/models/{model_id}/ready",
    summary="Open Inference Protocol: model ready",
    response_model=ModelReadyOut,
    responses={404: {"model": ErrorResponse, "description": "Unknown model"},
               503: {"model": ModelReadyOut,
                     "description": "Known, not ready (queued, building, loading or failed; "
                                    "`Retry-After: 1` unless failed)"}},
)
async def v2_model_ready(model_id: ModelId, registry: RegistryDep) -> JSONResponse:
    """200 ``{"name": id, "ready": true}`` when the model answers queries; 503 with
    ``"ready": false`` and its ``status`` while it is queued, building, loading or failed
    (with ``Retry-After`` but when failed); 404 for an unknown id. Open like the other
    probes: it tells only the status."""
    entry = await model_entry(registry, model_id)
    ready = entry.status == "ready" and entry.maps is not None
    body = {"name": model_id, "ready": ready, "status": entry.status}
    # waiting mends every state but failed (only a new upload does)
    headers = {} if ready or entry.status == "failed" else {"Retry-After": "1"}
    return JSONResponse(body, status_code=200 if ready else 503, headers=headers)
