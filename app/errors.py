"""Every error the service answers with, mapped to HTTP in one table.

Errors leave the service as JSON::

    {"error": "invalid_input", "message": "feature 'age' is missing", "field": "instance.age"}

``field`` names the offending input (a dotted path into the request, ``"model"``/``"spec"``
for uploads, ``"target"``, ``"norm"``, ...) or is null when no single input is to blame.
Request-validation errors also carry ``details``: every problem found, not only the first.

Domain errors (:class:`maps_core.MapsError`) and service errors (:class:`ApiError`) are
converted here and nowhere else; routes just raise. Anything else reaching the top is a bug:
it is logged with its traceback and answered with a JSON 500 that leaks nothing.
"""

from __future__ import annotations

import asyncio
import email.message
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from maps_core.exceptions import (
    ArtifactError,
    BudgetExceededError,
    InvalidQueryError,
    MapsError,
    QueryCancelledError,
    SchemaError,
    UnsupportedModelError,
)

from .responses import SafeJSONResponse as JSONResponse

log = logging.getLogger("cfmaps.app")


class ApiError(Exception):
    """Base of the service's own errors.

    Parameters
    ----------
    message : str
        Plain-words explanation, shown to the client.
    field : str, optional
        The offending input.
    headers : mapping, optional
        Extra response headers (``WWW-Authenticate``, ``Retry-After``).
    """

    def __init__(
        self, message: str, field: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.headers = headers or {}


class InvalidInputError(ApiError):
    """The request is well-formed HTTP but its content is unusable."""


class UnsafeModelFileError(InvalidInputError):
    """The uploaded model file is of a kind the service refuses to load."""


class UnsupportedModelFileError(InvalidInputError):
    """The uploaded file holds a model the engine cannot serve (a regressor, a pipeline, a
    model the adapters refuse): :class:`maps_core.UnsupportedModelError` with its field."""


class MalformedBodyError(ApiError):
    """The body is not what its ``Content-Type`` says: a multipart upload cut short."""


#: Where :class:`app.main.BodyLimitMiddleware` notes, in the ASGI scope, that a multipart
#: body ended without its closing boundary.
MULTIPART_CUT = "cfmaps.multipart_cut"


def check_multipart_whole(scope: Mapping[str, Any]) -> None:
    """Raise :class:`MalformedBodyError` when the request's multipart body ended before its
    closing boundary (noted by the body limit). Starlette's parser takes the parts it got
    whole and drops the rest: a body cut in the model file answered 422 "model: Field
    required", and one cut in the spec, after the model, would have been built without it.
    """
    if scope.get(MULTIPART_CUT):
        raise MalformedBodyError(
            "the multipart body ends before its closing boundary: the upload was cut short "
            "(send it again)", "model")


class NotFoundError(ApiError):
    """No such resource."""


class ModelNotFoundError(NotFoundError):
    """No model with this id."""


class ModelNotReadyError(ApiError):
    """The model exists but cannot answer yet (queued, building, loading or failed)."""


class PayloadTooLargeError(ApiError):
    """Body, upload or batch above the configured limit."""


class StorageError(ApiError):
    """The data dir refused a write the request needs (read-only, no permission, an I/O
    error): nothing was changed."""


class StorageFullError(StorageError):
    """The data dir has no space (or quota) left for the request's files."""


class RateLimitedError(ApiError):
    """The client asked for more answers than its rate limit allows (``app.ratelimit``)."""


class UnauthorizedError(ApiError):
    """No credentials were given where they are required."""


class ForbiddenError(ApiError):
    """Credentials were given but do not grant this operation."""


# The one table: exception class -> (HTTP status, machine-readable code). Looked up along the
# exception's MRO, so the most specific entry wins.
ERROR_TABLE: dict[type[Exception], tuple[int, str]] = {
    # service errors
    UnsafeModelFileError: (422, "unsafe_model_file"),
    UnsupportedModelFileError: (422, "unsupported_model"),
    InvalidInputError: (422, "invalid_input"),
    ModelNotFoundError: (404, "model_not_found"),
    NotFoundError: (404, "not_found"),
    ModelNotReadyError: (409, "model_not_ready"),
    PayloadTooLargeError: (413, "payload_too_large"),
    MalformedBodyError: (400, "bad_request"),
    UnauthorizedError: (401, "unauthorized"),
    ForbiddenError: (403, "forbidden"),
    RateLimitedError: (429, "rate_limited"),
    StorageFullError: (507, "insufficient_storage"),
    StorageError: (503, "storage_unavailable"),
    # engine errors
    InvalidQueryError: (422, "invalid_query"),
    SchemaError: (422, "invalid_schema"),
    UnsupportedModelError: (422, "unsupported_model"),
    # A query's or build's budget ran out: the request is valid but too expensive to serve
    # under the configured limits; retrying will not help, so not a 5xx.
    BudgetExceededError: (422, "budget_exceeded"),
    # The client went away and its batch stopped: nobody reads the answer, but the access
    # log and the metrics see nginx's "client closed request", not an error of ours.
    QueryCancelledError: (499, "client_closed_request"),
    # Persisted maps unreadable: the server cannot serve this model now (not the client's
    # fault, but also not a bug in the service).
    ArtifactError: (503, "artifact_unavailable"),
    MapsError: (422, "invalid_request"),
}


def lookup(exc: BaseException) -> tuple[int, str] | None:
    """HTTP status and code for an exception, or None when it is not a known error."""
    for klass in type(exc).__mro__:
        if klass in ERROR_TABLE:
            return ERROR_TABLE[klass]
    return None


#: Longest ``message`` and ``field`` an error document carries: they may quote what the
#: client sent (an unknown feature name), and a 3 MB key came back twice, a 6 MB 422.
MAX_MESSAGE_CHARS = 2000
MAX_FIELD_CHARS = 200


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to at most ``limit`` characters, marked with "..." where cut."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def error_body(
    code: str, message: str, field: str | None = None, details: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The JSON error document (``message`` and ``field`` cut to :data:`MAX_MESSAGE_CHARS`
    and :data:`MAX_FIELD_CHARS`)."""
    body: dict[str, Any] = {
        "error": code, "message": shorten(message, MAX_MESSAGE_CHARS),
        "field": None if field is None else shorten(field, MAX_FIELD_CHARS)}
    if details:
        body["details"] = [
            {**d, **{k: shorten(d[k], n) for k, n in (("message", MAX_MESSAGE_CHARS),
                                                     ("field", MAX_FIELD_CHARS))
                     if isinstance(d.get(k), str)}} for d in details]
    return body


def response_for(exc: BaseException) -> JSONResponse:
    """JSON response for a known error (:func:`lookup` must not be None)."""
    status, code = lookup(exc) or (500, "internal_error")
    field = getattr(exc, "field", None)
    headers = dict(getattr(exc, "headers", None) or {})
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return JSONResponse(error_body(code, message, field), status_code=status, headers=headers)


def _loc_to_field(loc: Sequence[Any]) -> str | None:
    """pydantic location -> dotted field path, without the ``body``/``query`` prefix."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "form"):
        parts = parts[1:]
    # Union members ("list[...]", "function-after[...]") are noise to a client.
    parts = [p for p in parts if "[" not in p]
    return ".".join(parts) or None


def validation_details(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """pydantic errors -> ``[{"field": ..., "message": ...}]`` (JSON-safe)."""
    out = []
    for e in errors:
        if e.get("type") == "none_required" and len(errors) > 1:
            # The null member of an optional field: "Input should be None" beside the
            # real complaint about the value sent says nothing a client can act on.
            continue
        loc = tuple(e.get("loc", ()))
        field = _loc_to_field(loc)
        message = str(e.get("msg", "invalid value"))
        # pydantic's prefix of the messages our own validators raise says nothing to a client
        for prefix in ("Value error, ", "Assertion failed, "):
            message = message.removeprefix(prefix)
        if e.get("type") == "missing" and loc and isinstance(loc[-1], int):
            # an item of a fixed-length list (bounds' [lower, upper], a range's lo,hi):
            # "Field required" at bounds.x.1 read as if a field had been left out
            field = _loc_to_field(loc[:-1])
            message = f"too few items: only {loc[-1]} given"
        if e.get("type") == "json_invalid":
            field = "body"
        elif loc == ("body",):
            # the body as a whole: empty, a JSON array or null, or not sent as JSON (curl's
            # -d without a content type is a form); pydantic's words name its internals
            field = "body"
            message = "must be a JSON object, sent with Content-Type: application/json"
        elif "Expected UploadFile" in message:
            # a text field where a file part belongs: Starlette's words name its class
            message = "must be a file part (a text field was sent)"
        out.append({"field": field, "message": message})
    return out


_STATUS_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    503: "unavailable",
}


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app takes on the request's path (asked of the
    routes themselves, so included routers count too)."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    if "GET" in allowed and "HEAD" not in allowed:
        # FastAPI's routes declare GET only; HEAD is answered as GET (HeadAsGetMiddleware)
        allowed.insert(allowed.index("GET") + 1, "HEAD")
    return allowed


class CatchAllMiddleware:
    """Answers an unhandled exception with the JSON 500 (:func:`bug_response`) from inside
    the request-id and metrics middleware.

    Starlette runs the ``Exception`` handler in its outermost middleware, outside every
    one added here: the 500 lacked ``X-Request-ID``, its log line the request id, and the
    exception, re-raised after the answer, made the server drop the connection. Here the
    exception ends with the answer. One raised after the answer began goes on up (nothing
    can be answered any more)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            if started:
                raise
            await bug_response(scope.get("method", ""), scope.get("path", ""))(scope, receive, send)
        except asyncio.CancelledError as exc:
            # uvicorn cancels the requests still running when its graceful shutdown period
            # (CFMAPS_SHUTDOWN_GRACE_SECONDS) runs out, then answers each with a bare
            # text/plain 500 and logs it as an exception in the app: a client read a bug
            # where a retry elsewhere would do. Answered here as the 503 it is, with its
            # request id. Any other cancellation (a cancel scope's) goes on as it came.
            if started or not _shutdown_cancel(exc):
                raise
            log.warning("%s %s: stopped by the shutdown's grace period",
                        scope.get("method", ""), scope.get("path", ""))
            await JSONResponse(
                error_body("unavailable", "the service is stopping; send the request again"),
                status_code=503, headers={"Retry-After": "1", "Connection": "close"},
            )(scope, receive, send)


def _shutdown_cancel(exc: asyncio.CancelledError) -> bool:
    """Whether ``exc`` is uvicorn's cancellation of a request its shutdown's grace period
    cut short (its message: "Task cancelled, timeout graceful shutdown exceeded")."""
    return any(isinstance(a, str) and "graceful shutdown" in a for a in exc.args)


def bug_response(method: str, path: str) -> JSONResponse:
    """A genuine bug: log it with the traceback (call from an ``except`` block), tell the
    client nothing internal."""
    log.exception("unhandled error on %s %s", method, path)
    return JSONResponse(
        error_body("internal_error", "internal server error; the error was logged"),
        status_code=500,
    )


def _read_as_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body with this ``Content-Type`` as JSON: its own rule, an
    ``application/json`` or ``application/*+json`` media type in any case (a body it
    cannot read is then its 400 "error parsing the body", answered here as the 422 of a
    body that is no JSON; checking for the lower-case prefix alone answered
    ``Application/JSON`` and ``application/vnd.api+json`` with a 400)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json"))


def install(app: FastAPI) -> None:
    """Register the exception handlers on ``app``."""

    async def on_known(request: Request, exc: Exception) -> JSONResponse:
        return response_for(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        try:
            check_multipart_whole(request.scope)  # a part missing because the body was cut
        except MalformedBodyError as cut:
            return response_for(cut)
        details = validation_details(exc.errors())
        field = details[0]["field"] if details else None
        message = str(details[0]["message"]) if details else "invalid request"
        if field:
            message = f"{field}: {message}"
        return JSONResponse(error_body("invalid_input", message, field, details), status_code=422)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400 and _read_as_json(request.headers.get("content-type")):
            # FastAPI's answer when json.loads fails other than by a syntax error (which is
            # the 422 "body" above): as that one, naming the body and why
            return JSONResponse(error_body(
                "invalid_input", "body: not JSON this service reads (an integer of more than "
                "4,300 digits, text that is not UTF-8, or arrays nested too deep)", "body"),
                status_code=422)
        if exc.status_code == 400 and str(exc.detail).startswith("Part exceeded maximum size"):
            # Starlette's cap on a text part (the route sets it one past the spec's): the
            # spec over its 64 MiB, as the 413 a spec sent as a file gets
            return JSONResponse(error_body(
                "payload_too_large", "spec: a text part over 64 MiB (a spec may take up to "
                "64 MiB; the model goes as a file part)", "spec"), status_code=413)
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route matching the path only;
            # /v1/models takes GET and POST from two routes.
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return JSONResponse(
            error_body(code, str(exc.detail), getattr(exc, "field", None)),
            status_code=exc.status_code,
            headers=headers,
        )

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        # Reached only without CatchAllMiddleware (create_app adds it).
        return bug_response(request.method, request.url.path)

    app.add_exception_handler(ApiError, on_known)
    app.add_exception_handler(MapsError, on_known)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_bug)
