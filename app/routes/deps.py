"""Dependency aliases shared by the routers.

All dependencies are ``async def``: FastAPI runs plain ``def`` dependencies in the
threadpool, a thread hop per dependency per request that costs more than the query.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.routing import APIRoute

from maps_core import InvalidQueryError, QueryCancelledError

from ..builds import BuildManager
from ..errors import InvalidInputError, PayloadTooLargeError, shorten
from ..metrics import Metrics
from ..ratelimit import RateLimiter
from ..registry import ModelEntry, Registry
from ..security import bearer_token
from ..settings import Settings, query_threads


async def _registry(request: Request) -> Registry:
    reg: Registry = request.app.state.registry
    return reg


async def _settings(request: Request) -> Settings:
    s: Settings = request.app.state.settings
    return s


async def _builds(request: Request) -> BuildManager:
    b: BuildManager = request.app.state.builds
    return b


async def _metrics(request: Request) -> Metrics:
    m: Metrics = request.app.state.metrics
    return m


RegistryDep = Annotated[Registry, Depends(_registry)]
SettingsDep = Annotated[Settings, Depends(_settings)]
BuildsDep = Annotated[BuildManager, Depends(_builds)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]


async def known_query(request: Request) -> None:
    """Refuse a query parameter that the route does not declare, as an unknown body field
    is refused: a typo or an option sent in the wrong place (``?norm=l2`` on a route that
    reads its options from the JSON body) changed nothing, silently. A name starting with
    ``_`` is a client's cache-buster (jQuery's ``_=1700000000``), not meant for the service.

    Raises
    ------
    InvalidInputError
        Naming the parameter (a 422).
    """
    if not request.scope.get("query_string"):
        return
    known, repeatable = declared_query(request.scope.get("route"))
    params = request.query_params
    for name in params:
        if name.startswith("_"):
            continue
        if name not in known:
            where = (f"the parameters are {', '.join(known)}" if known else
                     "this route takes none (its options go in the request body)"
                     if request.method == "POST" else "this route takes none")
            raise InvalidInputError(f"unknown query parameter {shorten(name)!r}; {where}", name)
        if name not in repeatable and len(params.getlist(name)) > 1:
            # ?limit=1&limit=2 took the last one silently
            raise InvalidInputError(f"query parameter {shorten(name)!r} is given more than "
                                    "once; it takes one value", name)


def declared_query(route: APIRoute | None) -> tuple[tuple[str, ...], frozenset[str]]:
    """The query parameters ``route`` and its dependencies declare, by the names clients
    send, and those of them that take a list (sent once per item). Computed once per
    route and kept on it (routes are not hashable)."""
    if route is None:
        return (), frozenset()
    found: tuple[tuple[str, ...], frozenset[str]] | None = route.__dict__.get("_cfmaps_query")
    if found is None:
        names: list[str] = []
        lists: set[str] = set()
        pending = [route.dependant]
        while pending:
            dep = pending.pop()
            for p in dep.query_params:
                if p.alias not in names:
                    names.append(p.alias)
                if typing.get_origin(p.field_info.annotation) in (list, tuple, set):
                    lists.add(p.alias)
            pending += reversed(dep.dependencies)
        found = route.__dict__["_cfmaps_query"] = (tuple(names), frozenset(lists))
    return found


def charge(request: Request, answers: int, field: str = "instances",
           advice: str = "split it into smaller batches") -> str | None:
    """Count ``answers`` against the client's rate limit, when one is configured;
    ``field`` and ``advice`` word the refusal of a request that asks for more than the
    limit allows at all. Returns the client's key (None without a limit).

    The client is its token only when the service checks tokens: on open query routes
    any string would do, so there the address is the client.

    Raises
    ------
    RateLimitedError
    """
    limiter: RateLimiter | None = request.app.state.limiter
    if limiter is None:
        return None
    settings: Settings = request.app.state.settings
    token = bearer_token(request) if settings.api_tokens else None
    host = request.client.host if request.client else None
    key = RateLimiter.client_key(token, host)
    limiter.charge(key, answers, field, advice)
    return key


#: Refusals of the request's content: they cost the client no answers.
_BAD_INPUT = (InvalidInputError, PayloadTooLargeError, InvalidQueryError)


@contextmanager
def charged(request: Request, answers: int, field: str = "instances",
            advice: str = "split it into smaller batches") -> Iterator[None]:
    """:func:`charge` for the block's work, given back when the block refuses the request
    as bad input (a malformed instance, ``k`` over the limit, an option the engine
    refuses): charged first, so that a client past its limit costs no CPU, but only
    answers count, as on ``/predict``. A budget that runs out is work done: kept."""
    key = charge(request, answers, field, advice)
    try:
        yield
    except _BAD_INPUT:
        if key is not None:
            request.app.state.limiter.refund(key, answers)
        raise


T = TypeVar("T")
_executor: ThreadPoolExecutor | None = None


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, so that the event loop keeps serving.

    A plain :class:`~concurrent.futures.ThreadPoolExecutor` of
    :func:`~app.settings.query_threads` threads (Python's default size, ``min(32, cores +
    4)``; the default query memory budget is shared among them) through
    ``loop.run_in_executor``: half the CPU of
    Starlette's ``run_in_threadpool`` per call (anyio's capacity limiter, cancel scope and
    backend lookup are not needed here), measured at 0.13 against 0.25 ms. The caller's
    context variables (the request id of the log records) go along, as with anyio.
    """
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=query_threads(),
                                       thread_name_prefix="cfmaps-query")
    call = functools.partial(fn, *args, **kwargs)
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_executor, ctx.run, call)


async def until_disconnect(request: Request, fn: Callable[..., T]) -> T:
    """``fn(cancel=cancel)`` in a worker thread (:func:`in_thread`), with ``cancel`` set as soon as
    the client disconnects, so that a long query or batch whose client gave up stops
    (``maps_core``'s ``cancel``) instead of holding worker threads that other queries
    wait for; its :class:`~maps_core.QueryCancelledError` is answered to nobody.

    The request's body has been read, so the next message the server gives is
    ``http.disconnect``: when the client goes away, or once the response is sent (the
    watcher is stopped before that).
    """
    cancel = threading.Event()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        cancel.set()

    watcher = asyncio.create_task(watch())
    try:
        return await in_thread(fn, cancel=cancel)
    except QueryCancelledError:
        if cancel.is_set():
            _log_abandoned(request)
        raise
    finally:
        watcher.cancel()


def _log_abandoned(request: Request) -> None:
    """The access-log line of a request whose client went away (499): uvicorn writes
    none for an answer it cannot send, so the request was counted in the metrics but
    missing from the log. Same logger and wording as uvicorn's own lines."""
    client = request.client
    addr = f"{client.host}:{client.port}" if client else "-"
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', addr, request.method, path,
        request.scope.get("http_version", "1.1"), 499)


async def model_entry(registry: Registry, model_id: str, *, ready: bool = False) -> ModelEntry:
    """The registry's entry for ``model_id`` (one that answers queries when ``ready``).

    With several workers or replicas over one data dir, a model uploaded or finished
    through another process would otherwise be unknown (404) or not ready (409) here
    until the next sync pass, although its client was already told otherwise. When the
    data dir knows more (:meth:`Registry.behind`, a ``stat``), this process catches up on
    that model first, in a worker thread since it may load maps.

    Raises
    ------
    ModelNotFoundError, ModelNotReadyError
    """
    if registry.behind(model_id):
        await in_thread(registry.catch_up, model_id)
    return registry.get_ready(model_id) if ready else registry.get(model_id)


#: Path parameter documentation shared by the model routes.
MODEL_ID_DOC = "Model id as returned by POST /v1/models."
