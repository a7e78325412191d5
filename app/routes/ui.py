"""The explorer page (``GET /ui``): static HTML, CSS and JavaScript shipped in the package.

The page talks to the public API only, with the token its user types; it holds no secret,
so it is served without authentication. Its files are read once, at import.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
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


# HEAD as well: link checkers and uptime probes ask for the page with HEAD.
@router.api_route("/ui", methods=["GET", "HEAD"], response_class=HTMLResponse)
async def ui_page() -> Response:
    body, media = _FILES["index.html"]
    return Response(body, media_type=media, headers=_HEADERS)


@router.api_route("/ui/{name}", methods=["GET", "HEAD"])
async def ui_asset(name: str) -> Response:
    if name not in _FILES or name == "index.html":
        raise NotFoundError(f"no page asset {name!r}")
    body, media = _FILES[name]
    return Response(body, media_type=media, headers=_HEADERS)
