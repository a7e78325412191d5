"""The lean path of the JSON query routes: FastAPI's contract, a fraction of its work.

On this service's query routes FastAPI spent about 0.3 ms of CPU per request around a
query that can take 0.05 ms (measured with cProfile on the ASGI app and with py-spy on a
server under load): five middlewares, a router walk through the included routers (a regex
per route, scope bookkeeping per level), the content type parsed with :mod:`email`, the
dependency graph solved recursively, every step wrapped for telemetry.

:class:`LeanDispatch` answers the happy path of the routes declared with
:class:`LeanJSONRoute` itself, and hands everything else to the FastAPI app unchanged:

* which routes: those of the routers given to it whose shape is simple, checked once when
  the route is declared (:class:`_Plan`): the ``Request``, plain ``str`` path parameters, one
  JSON body model, and ``async`` dependencies that take nothing but the ``Request``, with an
  endpoint that returns a ``Response``;
* which requests: ``POST`` to such a route's path with ``Content-Type: application/json``, a
  body that is JSON and that the route's body model accepts, and no dependency override
  installed.

For those, the body is decoded with :func:`json.loads` and validated by the route's own
body field (the calls FastAPI makes), the dependencies are awaited in declaration order and
the endpoint is called. Exceptions are answered by the app's own exception handlers
(:mod:`app.errors`), looked up as Starlette's ``ExceptionMiddleware`` does; one that has no
handler there (a bug) propagates to the app's outer ``ServerErrorMiddleware`` as before.
Any other request, including one whose body turned out malformed, goes to the FastAPI app
with its body replayed, so every error answer stays FastAPI's, byte for byte. The OpenAPI
document is generated from the routes, so it does not change.

The routers must be included in the app as they are (no prefix or dependencies added by
``include_router``): the dispatcher matches the routes' own paths.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["LeanDispatch", "LeanJSONRoute"]


class _Plan:
    """What the lean path needs of a route; ``reason`` says why a route cannot take it."""

    def __init__(self, route: APIRoute) -> None:
        self.reason: str | None = None
        dep = route.dependant
        body = route.body_field
        if body is None or getattr(route, "_embed_body_fields", False) or len(dep.body_params) != 1:
            self.reason = "no single JSON body"
        elif type(body.field_info).__name__ != "Body":  # Form and File are subclasses
            self.reason = "not a JSON body"
        elif route.methods != {"POST"}:
            self.reason = "not a POST route"
        elif dep.query_params or dep.header_params or dep.cookie_params:
            self.reason = "query, header or cookie parameters"
        elif any(_plain_type(p) is not str for p in dep.path_params):
            self.reason = "a path parameter that is not a plain str"
        elif _special(dep):
            self.reason = "a special parameter (background tasks, response, scopes...)"
        elif not _returns_response(dep.call):
            self.reason = "the endpoint is not an async def returning a Response"
        else:
            for sub in dep.dependencies:
                if not _request_only(sub):
                    self.reason = f"dependency {getattr(sub.call, '__name__', sub.call)!r}"
                    break
        self.route = route
        self.body: Any = body
        self.body_name = dep.body_params[0].name if dep.body_params else ""
        self.call: Any = dep.call
        self.request_name = dep.request_param_name
        self.path_names = [p.name for p in dep.path_params]
        self.deps: list[tuple[str | None, Callable[[Request], Awaitable[Any]]]] = [
            (sub.name, typing.cast(Callable[[Request], Awaitable[Any]], sub.call))
            for sub in dep.dependencies
        ]

    async def answer(self, request: Request, raw: bytes) -> Response | None:
        """The route's response to a request whose body is ``raw``, or None when FastAPI
        must handle it."""
        try:
            data = json.loads(raw)
            value, errors = self.body.validate(data, {}, loc=("body",))
        except Exception:  # malformed JSON, not text, nested too deep: FastAPI's answer
            return None
        if errors:
            return None
        values: dict[str, Any] = {}
        for name, dep in self.deps:
            out = await dep(request)
            if name is not None:
                values[name] = out
        params = request.path_params
        for name in self.path_names:
            values[name] = params[name]
        values[self.body_name] = value
        if self.request_name is not None:
            values[self.request_name] = request
        response: Response = await self.call(**values)
        return response


def _plain_type(field: Any) -> Any:
    info = field.field_info
    if info.metadata:  # constraints (min_length, pattern...): FastAPI must check them
        return None
    return info.annotation


def _special(dep: Any) -> bool:
    return bool(dep.background_tasks_param_name or dep.response_param_name
                or dep.security_scopes_param_name or dep.websocket_param_name
                or dep.http_connection_param_name)


def _request_only(sub: Any) -> bool:
    """An ``async def dep(request)`` with no other parameter and no sub-dependency."""
    return (
        inspect.iscoroutinefunction(sub.call)
        and sub.request_param_name is not None
        and not (sub.path_params or sub.query_params or sub.header_params or sub.cookie_params
                 or sub.body_params or sub.dependencies or _special(sub))
        and len(inspect.signature(sub.call).parameters) == 1
    )


def _returns_response(call: Any) -> bool:
    if not inspect.iscoroutinefunction(call):
        return False
    try:
        ret = typing.get_type_hints(call).get("return")
    except Exception:  # an annotation that does not resolve: leave the route to FastAPI
        return False
    return isinstance(ret, type) and issubclass(ret, Response)


class LeanJSONRoute(APIRoute):
    """An ``APIRoute`` that :class:`LeanDispatch` may answer (``lean`` is None when its
    shape does not allow it; FastAPI then answers every request, as for any route)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plan = _Plan(self)
        self.lean: _Plan | None = plan if plan.reason is None else None


class LeanDispatch:
    """ASGI middleware, innermost of the app's own (inside the body limit, the metrics and
    the request id, which see its requests as any other): see the module docstring.

    Parameters
    ----------
    app : ASGI app
        The rest of the FastAPI stack (its exception middleware and router).
    routers : sequence of APIRouter
        Routers whose :class:`LeanJSONRoute` routes this answers.
    """

    def __init__(self, app: ASGIApp, routers: Sequence[APIRouter]) -> None:
        self.app = app
        self.plans = [r.lean for router in routers for r in router.routes
                      if isinstance(r, LeanJSONRoute) and r.lean is not None]

    def _match(self, scope: Scope) -> tuple[_Plan, dict[str, Any]] | None:
        path = scope["path"]
        for plan in self.plans:
            m = plan.route.path_regex.match(path)
            if m is not None:
                return plan, m.groupdict()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hit = None
        if (scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
                and not scope["app"].dependency_overrides):
            hit = self._match(scope)
        if hit is None:
            await self.app(scope, receive, send)
            return
        plan, params = hit
        for name, value in scope.get("headers", ()):
            if name == b"content-type":
                if value != b"application/json":
                    hit = None
                break
        else:
            hit = None
        if hit is None:  # another content type (or none): FastAPI's handling
            await self.app(scope, receive, send)
            return
        scope["path_params"] = params
        scope["route"] = plan.route  # as the router sets it (the metrics read it)
        request = Request(scope, receive, send)
        try:
            raw = await request.body()
        except HTTPException as exc:  # the body limit's 413
            response: Response | None = await _handled(request, exc)
        except Exception:  # the client went away mid-body: FastAPI's answer to that
            await self.app(scope, receive, send)
            return
        else:
            try:
                response = await plan.answer(request, raw)
            except Exception as exc:
                response = await _handled(request, exc)
            if response is None:  # FastAPI answers, from the body already read
                await self.app(scope, _replay(raw, receive), send)
                return
        assert response is not None
        await response(scope, receive, send)


async def _handled(request: Request, exc: Exception) -> Response:
    """The app's answer to an exception, by its own handlers (as Starlette's
    ``ExceptionMiddleware`` chooses them); re-raised when it has none but the last-resort
    one, which the app's ``ServerErrorMiddleware`` runs."""
    handlers = request.app.exception_handlers
    handler = None
    if isinstance(exc, HTTPException):
        handler = handlers.get(exc.status_code)
    if handler is None:
        for klass in type(exc).__mro__:
            if klass is Exception:
                break
            if klass in handlers:
                handler = handlers[klass]
                break
    if handler is None:
        raise exc
    response: Response = await handler(request, exc)
    return response


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` first, then what the connection sends."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
