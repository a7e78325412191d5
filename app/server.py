"""uvicorn's HTTP protocols, writing each response in one piece.

uvicorn writes a response's status line and headers as soon as the app sends
``http.response.start``, then its body at ``http.response.body``: two ``send`` system calls,
two TCP segments (and two wake-ups of the client) for every small JSON answer. On loopback
the second write cost about 0.02-0.03 ms of server CPU per request (measured on a trivial ASGI
app under uvicorn with httptools and uvloop, 0.15 against 0.12-0.14 ms per request).

:class:`_CorkedTransport` holds what the protocol writes during one turn of the event loop
and writes it at the end of that turn, once: the start and the body of a response sent by
one task step (a Starlette ``Response`` sends both without waiting) leave together. Nothing
waits longer than the current turn; a close (or a connection already closing) writes what is
held first. Every other transport method is the real transport's.

``cfmaps serve`` passes :data:`PROTOCOL` (an import string, so that ``--workers N`` processes
import it too) as uvicorn's ``http`` option: the corked httptools protocol when httptools is
installed (the ``service`` extra installs it), else the corked h11 one.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any, cast

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["PROTOCOL", "CorkedH11Protocol"]


class _CorkedTransport:
    """A transport proxy whose writes within one event-loop turn become one write."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._held = [bytes(data)]
            self._loop.call_soon(self._flush)
        else:
            self._held.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CorkedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol over a :class:`_CorkedTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, _CorkedTransport(transport, self.loop)))


if importlib.util.find_spec("httptools") is not None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class CorkedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol over a :class:`_CorkedTransport`."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(cast(asyncio.Transport, _CorkedTransport(transport, self.loop)))

    __all__ += ["CorkedHttpToolsProtocol"]
    PROTOCOL = "app.server:CorkedHttpToolsProtocol"
else:  # pragma: no cover - the service extra installs httptools
    PROTOCOL = "app.server:CorkedH11Protocol"
