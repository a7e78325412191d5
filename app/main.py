"""The application factory.

Run with ``uvicorn --factory app.main:create_app`` (settings from ``CFMAPS_*``) or
``cfmaps serve [--workers N]``. Any number of processes may share a data dir: each
follows the others' changes (:meth:`app.registry.Registry.sync`), and a file lock decides
which one builds a model.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import resource
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any, cast

from fastapi import FastAPI, params
from fastapi.routing import APIRoute, APIRouter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from maps_core.warmup import discard_scratch, warm_up

from . import errors
from .builds import BuildManager
from .dataplane import default_map_size
from .errors import ForbiddenError, UnauthorizedError, error_body
from .metrics import Metrics, MetricsMiddleware
from .observability import WORKER_LOG_ENV, RequestIdMiddleware, configure_logging
from .ratelimit import RateLimiter
from .registry import Registry
from .responses import SafeJSONResponse
from .routes import counterfactuals, health, models, ui
from .routes.lean import LeanDispatch
from .schemas import NORM_DEFAULT_WORDS, ON_BUDGET_DEFAULT_WORDS
from .security import CREDENTIAL_CHECKS, require_admin
from .settings import Settings
from .siblings import Siblings

log = logging.getLogger("cfmaps.app")


def _version() -> str:
    try:
        return metadata.version("cfmaps")
    except metadata.PackageNotFoundError:
        return "0.0.0+local"


class BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive`` when a streamed body passes its limit.

    An ``HTTPException`` because FastAPI re-raises those from body parsing (anything else
    would become a 400), so the 413 reaches the exception handlers intact.
    """

    def __init__(self, limit: int, field: str) -> None:
        super().__init__(413, f"the request body exceeds the limit of {limit} bytes")
        self.field = field


class BodyLimitMiddleware:
    """Refuse bodies above ``max_body_bytes`` (``max_upload_bytes`` for model uploads) with 413.

    A declared ``Content-Length`` above the limit is refused before reading anything; a body
    without one (chunked) is counted as it streams. Before any of it, a request with a body
    is checked for its credentials (:func:`_early_auth`), and one sent with a
    ``Content-Encoding`` is refused (415). The limit is the route's: uploads, the routes
    that take files, may send ``max_upload_bytes``. A multipart upload that ends without
    its closing delimiter is noted as cut short (:class:`_CloseFinder`,
    :func:`app.errors.check_multipart_whole`).
    """

    def __init__(self, app: ASGIApp, settings: Settings,
                 routers: Sequence[APIRouter] = ()) -> None:
        self.app = app
        self.settings = settings
        self.guards = _guards(routers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        upload = False
        for route, guard, files in self.guards:
            if route.matches(scope)[0] is Match.FULL:
                # /metrics counts the answers given here (401, 403, 413, 415) by their
                # route, as the router would have named it
                scope["route"] = route
                denied = None if guard is None else await _early_auth(scope, guard)
                if denied is not None:
                    await denied(scope, receive, send)
                    return
                upload = files
                break
        else:
            # Starlette redirects a path that matches with its trailing slash toggled (307,
            # body unread): an upload sent to /v1/models/ must get that, not the 413 of a
            # query body's limit.
            path = scope["path"]
            twin = {**scope, "path": path[:-1] if path.endswith("/") else path + "/"}
            upload = any(files and route.matches(twin)[0] is Match.FULL
                         for route, _, files in self.guards)
        limit = self.settings.max_upload_bytes if upload else self.settings.max_body_bytes
        field = "model" if upload else "body"
        coding = _content_encoding(scope)
        if coding not in ("", "identity"):
            # the body would be read as what it is not: gzip bytes as "not JSON", an
            # encoded upload as no model file
            await _refuse(send, 415, error_body(
                "unsupported_media_type", f"Content-Encoding {coding!r} is not supported: "
                "send the body uncompressed", "content-encoding"))
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, 413, error_body(
                "payload_too_large",
                f"the request body ({declared} bytes) exceeds the limit of {limit} bytes",
                field,
            ))
            return
        seen = 0
        close = _multipart_close(scope) if upload else None
        finder = None if close is None else _CloseFinder(close)

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                seen += len(chunk)
                if seen > limit:
                    raise BodyTooLarge(limit, field)
                if finder is not None:
                    finder.feed(chunk)
                    if not message.get("more_body", False):
                        # (no body at all is no part: the route's validation names it)
                        scope[errors.MULTIPART_CUT] = seen > 0 and not finder.found
            return message

        await self.app(scope, limited, send)


class HeadAsGetMiddleware:
    """Answer ``HEAD`` as the ``GET`` of the same path, headers only (RFC 9110, 9.3.2:
    servers support HEAD wherever they support GET).

    FastAPI routes take only the methods they name, so the probes, ``/metrics`` and the
    model routes answered HEAD with 405, and load balancers and uptime monitors probe with
    it. A ``HEAD`` route of its own would repeat every GET's operation id in OpenAPI. A path
    without GET answers 405 as GET would, naming its methods.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return  # the body's parts go nowhere; Content-Length stays the GET's
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        inner = {**scope, "method": "GET"}
        try:
            await self.app(inner, receive, headers_only)
        finally:
            # the route the router matched, for the metrics outside (a load balancer's HEAD
            # probes counted as requests to unknown paths, "<unmatched>")
            if "route" in inner:
                scope["route"] = inner["route"]


Guard = Callable[[Request], Awaitable[None]]


def _guards(routers: Sequence[APIRouter]) -> list[tuple[APIRoute, Guard | None, bool]]:
    """The routes of ``routers`` that take a body, as each declares it: the dependency that
    checks its credentials (:data:`app.security.CREDENTIAL_CHECKS`; None for a route that
    checks none), and whether it takes files (a model upload, whose body may reach
    ``max_upload_bytes`` where others stop at ``max_body_bytes``). The routers must be
    included as they are (as for :class:`LeanDispatch`): their routes' own paths are
    matched."""
    found: list[tuple[APIRoute, Guard | None, bool]] = []
    for route in (r for router in routers for r in router.routes):
        if not isinstance(route, APIRoute) or not route.methods or route.methods <= {
                "GET", "HEAD", "OPTIONS"}:
            continue
        guard = next((cast(Guard, dep.call) for dep in route.dependant.dependencies
                      if dep.call in CREDENTIAL_CHECKS), None)
        files = any(isinstance(p.field_info, params.File) for p in route.dependant.body_params)
        found.append((route, guard, files))
    return found


async def _early_auth(scope: Scope, guard: Guard) -> Response | None:
    """The 401/403 of a request whose route (an upload, a query, a delete) checks
    credentials with ``guard`` that do not pass, decided before its body is read: FastAPI
    reads and parses a body before it runs a route's dependencies, so a client without a
    token had its 256 MiB upload read (and a broken JSON body got 422, not 401). None: go
    on (the route's own dependencies check again, as for every route)."""
    try:
        await guard(Request(scope))
    except (UnauthorizedError, ForbiddenError) as exc:
        return errors.response_for(exc)
    return None


async def _refuse(send: Send, status: int, error: dict[str, Any]) -> None:
    """Answer ``error`` with ``status`` before the body is read, and close the connection
    (the unread body would otherwise be taken for the next request)."""
    body = json.dumps(error, separators=(",", ":")).encode()  # as every other answer
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    })
    await send({"type": "http.response.body", "body": body})


def _content_encoding(scope: Scope) -> str:
    """The request's ``Content-Encoding``, lower case ("" without one)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-encoding":
            return value.decode("latin-1").strip().lower()
    return ""


class _CloseFinder:
    """Whether a body, fed chunk by chunk, holds the closing delimiter of its multipart
    parts on a line of its own (``CRLF --<boundary>--``). No part may hold that line (RFC
    2046) and a body may go on after it (an epilogue), so it is looked for as the body
    streams, not at its end; the start of the body counts as a line's start (a body with
    no part at all)."""

    def __init__(self, close: bytes) -> None:
        self.needle = b"\r\n" + close
        self.tail = b"\r\n"  # the last bytes fed, as many as could start the needle
        self.found = False

    def feed(self, chunk: bytes) -> None:
        if self.found or not chunk:
            return
        k = len(self.needle) - 1
        # whole in the chunk, or begun in the tail and ended in the chunk's first k bytes
        self.found = self.needle in chunk or self.needle in self.tail + chunk[:k]
        self.tail = (self.tail + chunk)[-k:] if len(chunk) < k else chunk[-k:]


def _multipart_close(scope: Scope) -> bytes | None:
    """The delimiter that closes the request's multipart body (``--<boundary>--``), or None
    for a body of another type."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            kind, _, options = value.partition(b";")
            if kind.strip().lower() != b"multipart/form-data":
                return None
            for param in options.split(b";"):
                key, _, boundary = param.strip().partition(b"=")
                if key.strip().lower() == b"boundary" and boundary.strip(b'" '):
                    return b"--" + boundary.strip(b'" ') + b"--"
            return None
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _sync_loop(registry: Registry, settings: Settings, stop: threading.Event) -> None:
    """Follow what other processes do in the data dir (see :meth:`Registry.sync`), every
    ``CFMAPS_SYNC_INTERVAL_SECONDS``, once the start-up load is done."""
    registry.loaded.wait()
    while not stop.wait(settings.sync_interval_seconds):
        try:
            registry.sync()
        except Exception:  # a bug here must not end the thread: log and keep following
            log.exception("data dir sync failed")


def _state_limits_in_openapi(app: FastAPI, settings: Settings,
                             admin: set[tuple[str, str]]) -> None:
    """Write this service's limits (CFMAPS_MAX_K, CFMAPS_MAX_BATCH, CFMAPS_MAP_MAX_SIDE,
    CFMAPS_QUERY_MAX_SECONDS) and
    defaults (CFMAPS_DEFAULT_NORM, CFMAPS_QUERY_ON_BUDGET) into the request schemas, so that
    the document says which requests are valid here and what they get, and the conventions
    of :func:`_document_conventions` (``admin``: its operations that check the admin
    token)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            # a builder serves the probes alone: no request schemas (nor, maybe, components)
            schemas = doc.get("components", {}).get("schemas", {})
            for name in ("CounterfactualRequest", "PredictRequest"):
                if name not in schemas:
                    continue
                props = schemas[name]["properties"]
                props["instances"]["maxItems"] = settings.max_batch
                if "k" in props:
                    props["k"]["maximum"] = settings.max_k
                if "norm" in props:  # the default this service applies
                    props["norm"]["description"] = props["norm"]["description"].replace(
                        f"default {NORM_DEFAULT_WORDS}.", f"default {settings.default_norm}.", 1)
                if "max_seconds" in props and settings.query_max_seconds is not None:
                    # int | None: the schema is an anyOf; state the number's limit (a
                    # schema-valid 60 was a 422 "at most 30")
                    for branch in props["max_seconds"].get("anyOf", [props["max_seconds"]]):
                        if branch.get("type") == "number":
                            branch["maximum"] = settings.query_max_seconds
                if "on_budget" in props:  # likewise
                    props["on_budget"]["description"] = props["on_budget"]["description"].replace(
                        ON_BUDGET_DEFAULT_WORDS, f"here `{settings.query_on_budget}`", 1)
            if "MapRequest" in schemas:  # the map picture's routes are served
                # the limit, and the default size as fitted to it
                fitted = default_map_size(settings.map_max_side)
                for side in ("width", "height"):
                    prop = schemas["MapRequest"]["properties"][side]
                    prop["maximum"] = settings.map_max_side
                    prop["default"] = fitted[side]
                get = doc["paths"]["/v1/models/{model_id}/map.png"]["get"]
                for param in get["parameters"]:
                    if param["name"] in ("width", "height"):
                        # int | None: the schema is an anyOf; state the integer's limit
                        param["schema"] = {"type": "integer", "minimum": 1,
                                           "maximum": settings.map_max_side,
                                           "default": fitted[param["name"]]}
            _document_conventions(doc, settings, admin)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _admin_operations(routers: Sequence[APIRouter]) -> set[tuple[str, str]]:
    """The ``(method, path)`` of each operation of ``routers`` that checks the admin token
    (its route depends on :func:`~app.security.require_admin`), as the OpenAPI document
    names them (lower-case method, path template). The routers must be included as they
    are, as for :func:`_guards`."""
    return {(method.lower(), route.path_format)
            for route in (r for router in routers for r in router.routes)
            if isinstance(route, APIRoute)
            if any(dep.call is require_admin for dep in route.dependant.dependencies)
            for method in route.methods or ()}


def _document_conventions(doc: dict[str, Any], settings: Settings,
                          admin: set[tuple[str, str]]) -> None:
    """What the route declarations cannot say, written into the OpenAPI document ``doc``.

    * The bearer token: a scheme, and on each operation that answers 401, required where
      this service requires it (management with ``CFMAPS_ADMIN_TOKEN`` set, queries with
      ``CFMAPS_API_TOKENS`` set), else optional (the empty alternative ``{}``: management
      from loopback clients, open query routes). ``admin``: the operations that check the
      admin token (:func:`_admin_operations`).
    * Every 422 is an :class:`~app.schemas.ErrorResponse` (FastAPI documents its own
      ``HTTPValidationError``, a shape this service never sends).
    * 429 and 503 carry ``Retry-After`` (not the 503 of a data dir refusing writes), and
      so does the 409 of a model still queued, building or loading.
    * Every operation but a GET answers 415 to a request sent with a ``Content-Encoding``
      (:class:`BodyLimitMiddleware`).
    * ``/metrics`` answers Prometheus' text format.
    """
    comps = doc.setdefault("components", {})
    schemes = comps.setdefault("securitySchemes", {})
    schemes["bearer"] = {"type": "http", "scheme": "bearer",
                         "description": "CFMAPS_ADMIN_TOKEN for model management, one of "
                                        "CFMAPS_API_TOKENS (or the admin token) for queries"}
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    retry = {"Retry-After": {"description": "Seconds to wait before asking again",
                             "schema": {"type": "integer"}}}
    not_ready_retry = {"Retry-After": {
        "description": "Seconds to wait before asking again, while the model is queued, "
                       "building or loading (not sent once its build failed)",
        "schema": {"type": "integer"}}}
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            responses = op.get("responses", {})
            if "401" in responses:
                required = (bool(settings.admin_token) if (method, path) in admin
                            else bool(settings.api_tokens))
                op["security"] = [{"bearer": []}] if required else [{}, {"bearer": []}]
            if "422" in responses:
                content = responses["422"].setdefault("content", {})
                content["application/json"] = {"schema": error_ref}
            for code in ("429", "503"):
                if code in responses and responses[code].get("description") != models.STORAGE_REFUSED:
                    responses[code].setdefault("headers", {}).update(retry)
            if "409" in responses:  # a model not ready (Registry.get_ready)
                responses["409"].setdefault("headers", {}).update(not_ready_retry)
            if method not in ("get", "head", "options"):
                responses.setdefault("415", {
                    "description": "Sent with a Content-Encoding: send the body uncompressed",
                    "content": {"application/json": {"schema": error_ref}}})
    metrics = doc.get("paths", {}).get("/metrics", {}).get("get")
    if metrics is not None:
        metrics["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}
    schemas = comps.get("schemas", {})
    if not any("HTTPValidationError" in json.dumps(op) for op in doc.get("paths", {}).values()):
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)


def _freeze_heap() -> None:
    """Move every object alive now out of the collector's sight (:func:`gc.freeze`).

    The service holds ~190k long-lived objects (numba, scikit-learn, pydantic, the app),
    and a full collection scans them all: 0.1-0.2 s on this machine. A batch answer
    allocates enough to trigger one now and then, so batches of 100 had a p99 of 4-5
    times their median (126 against 31 ms on CP). Frozen objects are still freed by
    reference counting; only cycles among them would outlive the process, and the
    modules, settings and loaded models live as long as it anyway (``CFMAPS_GC_FREEZE``).
    """
    gc.collect()
    gc.freeze()


def _load_pending(registry: Registry, freeze: bool, warm: bool,
                  siblings: Siblings | None) -> None:
    if warm:
        # before readiness: a new process compiles the query kernels here (or loads
        # numba's cache, about a second), not in its first request. A failure (no writable
        # temporary directory, say) only costs that: the models load all the same.
        try:
            log.info("query kernels ready in %.1f s", warm_up())
        except Exception:
            log.warning("warm-up failed; the first query will compile the kernels",
                        exc_info=True)
    registry.load_pending()
    if freeze:
        _freeze_heap()  # the loaded models too
    if siblings is not None:
        siblings.mark_ready()


def raise_open_files_limit() -> int | None:
    """Raise this process's soft limit on open files to its hard limit; returns the new
    soft limit (None where the platform has none).

    Each loaded model's arrays are memory-mapped, and CPython keeps a descriptor open per
    mapping (about 30 a model): under the common soft limit of 1,024, the 35th model
    failed to load. The hard limit is the operator's (a container's ``nofile``)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        return int(soft)
    except (ValueError, OSError):  # the platform refuses: keep what there is
        return None


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the cfmaps FastAPI application.

    Parameters
    ----------
    settings : Settings, optional
        Defaults to :class:`Settings` read from the ``CFMAPS_*`` environment.

    Notes
    -----
    At start-up (lifespan) the data dir is scanned synchronously, then the query kernels are
    compiled (:func:`maps_core.warmup.warm_up`, ``CFMAPS_WARM_UP``) and the ready models are
    loaded in a background thread: ``/healthz`` answers at once, ``/readyz`` turns 200 when
    loading is done. Builds that were queued or running when the service stopped (no
    process holds their build lock), and models whose maps are of an older format, are
    built again from their stored model files. A sync thread then follows what other
    processes sharing the data dir do (``CFMAPS_ROLE``, ``cfmaps serve --workers``). On
    shutdown queued builds are dropped and running ones asked to stop; they run again at
    the next start.
    """
    settings = settings or Settings()
    raise_open_files_limit()
    if os.environ.get(WORKER_LOG_ENV):  # a worker process of cfmaps serve --workers N
        configure_logging(settings.log_format, os.environ[WORKER_LOG_ENV])
    metrics = Metrics()
    registry = Registry(settings)
    builds = BuildManager(registry, settings, metrics)
    if settings.role != "api":  # queued models no process builds, interrupted builds,
        registry.on_requeue = builds.submit  # outdated maps: built here
    metrics.watch_models(registry.counts)
    siblings = Siblings.from_env()  # the other processes of cfmaps serve --workers N

    # Models fitted on DataFrames warn on every numpy predict call; the service always
    # passes arrays in schema order, so the warning is noise.
    warnings.filterwarnings("ignore", message="X does not have valid feature names")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry.open()
        if settings.gc_freeze:
            _freeze_heap()
        warm = settings.warm_up and settings.role != "builder"
        loader = threading.Thread(target=_load_pending,
                                  args=(registry, settings.gc_freeze, warm, siblings),
                                  name="cfmaps-load", daemon=True)
        loader.start()
        stop = threading.Event()
        syncer = threading.Thread(target=_sync_loop, args=(registry, settings, stop),
                                  name="cfmaps-sync", daemon=True)
        syncer.start()
        log.info("cfmaps serving %s (role %s)", settings.data_dir, settings.role)
        try:
            yield
        finally:
            stop.set()
            builds.shutdown()
            discard_scratch()  # a warm-up still under way: the process ends without it
            metrics.close()
            if siblings is not None:
                siblings.unmark()

    app = FastAPI(
        title="cfmaps",
        version=_version(),
        summary="Exact counterfactual explanations for tree-ensemble classifiers",
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
        # operationId = the route function's name (get_model, counterfactuals...): stable
        # names for generated clients and for the upload's OpenAPI links.
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.settings = settings
    app.state.registry = registry
    app.state.builds = builds
    app.state.metrics = metrics
    app.state.siblings = siblings
    app.state.limiter = (
        RateLimiter(settings.rate_limit_per_minute,
                    shared=None if siblings is None else siblings.run_dir)
        if settings.rate_limit_per_minute else None
    )
    errors.install(app)
    # A builder serves the probes and metrics only. The routes of models and queries take
    # bodies, whose credentials are checked before they are read (BodyLimitMiddleware).
    body_routers = [] if settings.role == "builder" else [models.router, counterfactuals.router]
    for router in body_routers:
        app.include_router(router)
    if settings.role != "builder" and settings.ui:
        app.include_router(ui.router)
    app.include_router(health.router)
    _state_limits_in_openapi(app, settings, _admin_operations(body_routers))
    if settings.role != "builder":
        # Innermost of ours: the query routes' happy path without FastAPI's generic request
        # handling (app/routes/lean.py); body limit, metrics and request id as for any route.
        app.add_middleware(LeanDispatch, routers=[counterfactuals.router])
    app.add_middleware(HeadAsGetMiddleware)
    # Added last = outermost: metrics also count the 413s answered by the body limit, and
    # every answer, 413s included, carries its request id.
    app.add_middleware(errors.CatchAllMiddleware)  # inside the two below: a 500 is counted, has an id
    app.add_middleware(BodyLimitMiddleware, settings=settings, routers=body_routers)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(RequestIdMiddleware)
    return app
