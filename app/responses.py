"""The JSON response class used by every route and error handler."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse


class SafeJSONResponse(JSONResponse):
    """Compact JSON that cannot fail to encode.

    Requests may smuggle lone UTF-16 surrogates (``"\\ud800"``) into strings that end up in
    a response (an unknown feature name echoed in an error); they are not encodable as UTF-8,
    so they are replaced instead of crashing the response. NaN and infinities are refused
    (``allow_nan=False``): the routes turn them into ``null`` beforehand.
    """

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8", errors="replace")
