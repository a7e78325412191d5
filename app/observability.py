"""Request ids and logs.

Every request carries an id: the client's ``X-Request-ID`` when it sends a sane one (at
most 128 visible ASCII characters), else a fresh one. It is echoed in the response's
``X-Request-ID`` header and attached to every log record written while the request is
handled, so a client's complaint can be matched with the server's logs.

Logs are plain text by default; ``CFMAPS_LOG_FORMAT=json`` writes one JSON object per line
(``time``, ``level``, ``logger``, ``message``, ``request_id``, and ``exc`` when there is a
traceback), the format log collectors parse without configuration.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["REQUEST_ID_HEADER", "WORKER_LOG_ENV", "RequestIdMiddleware", "configure_logging",
           "request_id"]

REQUEST_ID_HEADER = "X-Request-ID"
#: Set by ``cfmaps serve --workers N`` to the log level: each worker process then
#: configures its logging in :func:`app.main.create_app` (the parent's handler is not
#: inherited by spawned workers).
WORKER_LOG_ENV = "_CFMAPS_WORKER_LOG_LEVEL"
_HEADER = REQUEST_ID_HEADER.lower().encode()
_SANE = re.compile(rb"[\x21-\x7e]{1,128}")

#: The id of the request being handled ("-" outside any request).
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class RequestIdMiddleware:
    """Pure ASGI middleware (no per-request task or body copy): sets :data:`request_id`
    and adds the ``X-Request-ID`` response header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = b""
        for name, value in scope.get("headers", ()):
            if name == _HEADER:
                rid = value if _SANE.fullmatch(value) else b""
                break
        if not rid:
            rid = os.urandom(16).hex().encode()  # 32 hex digits, as uuid4().hex, 5x cheaper
        token = request_id.set(rid.decode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0].lower() != _HEADER]
                message = {**message, "headers": [*headers, (_HEADER, rid)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(fmt: str = "text", level: str = "info") -> None:
    """Root handler for the service's and uvicorn's loggers, with request ids.

    Parameters
    ----------
    fmt : {"text", "json"}
    level : str
        A logging level name (``info``, ``warning``...).
    """
    handler = logging.StreamHandler()
    handler.addFilter(_RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Python's warnings (a numpy RuntimeWarning, say) as log records, in the same format:
    # printed raw, they broke one-JSON-object-per-line logs
    logging.captureWarnings(True)
    # uvicorn's own loggers propagate to the root instead of printing their own format
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
