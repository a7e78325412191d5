"""The explorer page (``GET /ui``): static HTML, CSS and JavaScript shipped in the package.

The page talks to the public API only, with the token its user types; it holds no secret,
so it is served without authentication. Its files are read once, at import.
"""

from __future__ import annotations

import hashlib
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ..errors import NotFoundError

router = APIRouter(include_in_schema=False)

_FILES = {
    name: (files("app.ui").joinpath(name).read_bytes(), media)
    for name, media in (
        ("index.html", "text/html; charset=utf-8"),
        ("explorer.js", "text/javascript; charset=utf-8"),
        ("explorer.css", "text/css; charset=utf-8"),
    )
}
# Same-origin scripts, styles and API calls only; the map arrives as a blob: URL.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob:; "
    "style-src 'self' 'unsafe-inline'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


#: Each file's entity tag: ``no-cache`` makes a browser ask again on every visit, and with
#: a tag it asks "changed since?" and gets a body-less 304 while the file is the same.
_ETAGS = {name: f'"{hashlib.sha256(body).hexdigest()[:32]}"' for name, (body, _) in _FILES.items()}


def _serve(request: Request, name: str) -> Response:
    body, media = _FILES[name]
    headers = {**_HEADERS, "ETag": _ETAGS[name]}
    asked = request.headers.get("if-none-match", "")
    if asked.strip() == "*" or _ETAGS[name] in (t.strip().removeprefix("W/") for t in asked.split(",")):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=media, headers=headers)


# HEAD as well: link checkers and uptime probes ask for the page with HEAD.
@router.api_route("/ui", methods=["GET", "HEAD"], response_class=HTMLResponse)
async def ui_page(request: Request) -> Response:
    return _serve(request, "index.html")


@router.api_route("/ui/{name}", methods=["GET", "HEAD"])
async def ui_asset(request: Request, name: str) -> Response:
    if name not in _FILES or name == "index.html":
        raise NotFoundError(f"no page asset {name!r}")
    return _serve(request, name)
