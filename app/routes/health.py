"""Liveness, readiness and metrics (always open: probes and scrapers carry no tokens)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from ..metrics import CONTENT_TYPE
from ..responses import SafeJSONResponse as JSONResponse
from .deps import MetricsDep, RegistryDep

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: every persisted ready model has been loaded")
async def readyz(registry: RegistryDep) -> JSONResponse:
    """200 once the start-up load of the persisted models has finished, 503 before.

    A model whose files fail to load does not hold readiness back forever (it would take
    every other model out of service with it): it is reported ``failed`` by
    ``GET /v1/models/{id}`` and counted here under ``models.failed``.
    """
    counts = registry.counts()
    body = {"models": counts}
    if not registry.all_loaded():
        return JSONResponse(
            {"status": "loading", **body}, status_code=503, headers={"Retry-After": "1"}
        )
    return JSONResponse({"status": "ready", **body})


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(m: MetricsDep) -> Response:
    return Response(m.render(), media_type=CONTENT_TYPE)
