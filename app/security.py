"""Bearer tokens and the loopback rule.

Two kinds of access:

* **management** (``POST``/``DELETE /v1/models``): ``Authorization: Bearer <admin token>``.
  When no admin token is configured, management is allowed only from loopback clients
  (127.0.0.0/8, ::1, and IPv4-mapped loopback), judged by the connection's peer address.
  The literal host ``"testclient"`` that Starlette's test client reports is *not* loopback:
  tests pass ``client=("127.0.0.1", ...)`` like a real local caller. Behind a reverse proxy
  on the same host every request looks local, so such deployments must set an admin token.
* **queries** (everything under ``/v1`` that is not management): one of the API tokens when
  any is configured (the admin token also works); open otherwise.

A missing or malformed header answers 401 with ``WWW-Authenticate: Bearer``; a token that
does not match answers 403. Tokens are compared with :func:`hmac.compare_digest`, against
every configured token, so that timing does not reveal which one (or how much of one)
matched.

``/healthz``, ``/readyz``, ``/metrics`` and the OpenAPI documents are always open.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable

from fastapi import Request

from .errors import ForbiddenError, UnauthorizedError
from .settings import Settings

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def is_loopback(host: str | None) -> bool:
    """Whether a peer address is a loopback address (not a host name)."""
    if not host:
        return False
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None when absent.

    Raises
    ------
    UnauthorizedError
        When the header is present but is not a Bearer credential.
    """
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise UnauthorizedError(
            "the Authorization header must be 'Bearer <token>'", "authorization", _CHALLENGE
        )
    return token


def _matches(token: str, candidates: Iterable[str]) -> bool:
    found = False
    given = token.encode()
    for c in candidates:
        # No early exit: every candidate is compared.
        found |= hmac.compare_digest(given, c.encode())
    return found


def _settings(request: Request) -> Settings:
    settings = request.app.state.settings
    assert isinstance(settings, Settings)
    return settings


async def require_admin(request: Request) -> None:
    """FastAPI dependency guarding model management (``async``: no threadpool hop)."""
    settings = _settings(request)
    admin = settings.admin_secret
    if admin is None:
        host = request.client.host if request.client else None
        if is_loopback(host):
            return
        raise ForbiddenError(
            "model management is only allowed from loopback clients when no admin token "
            "is configured; set CFMAPS_ADMIN_TOKEN to manage models remotely",
            "authorization",
        )
    token = bearer_token(request)
    if token is None:
        raise UnauthorizedError(
            "model management needs 'Authorization: Bearer <admin token>'",
            "authorization",
            _CHALLENGE,
        )
    if not _matches(token, [admin]):
        raise ForbiddenError("the token does not grant model management", "authorization")


async def require_query(request: Request) -> None:
    """FastAPI dependency guarding the query routes."""
    settings = _settings(request)
    if not settings.api_tokens:
        return
    token = bearer_token(request)
    if token is None:
        raise UnauthorizedError(
            "this service needs 'Authorization: Bearer <api token>'",
            "authorization",
            _CHALLENGE,
        )
    allowed = list(settings.api_tokens)
    if settings.admin_secret is not None:
        allowed.append(settings.admin_secret)
    if not _matches(token, allowed):
        raise ForbiddenError("the token is not valid for this service", "authorization")


#: The dependencies that check credentials, one per kind of access: the body limit looks
#: them up on a route to check them before the body is read (``app.main._early_auth``).
CREDENTIAL_CHECKS = (require_admin, require_query)
