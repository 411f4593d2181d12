"""CORS on `/mcp`: what lets a page that `--allowed-origins` admits call the sidecar from a browser.

Before a POST of JSON, a DELETE, or any request carrying `Authorization` or the MCP headers, a
browser asks first: an `OPTIONS` preflight naming the method and headers it wants to send. It then
hands the page a response only when the response names the page's origin, and shows it only the
headers the response exposes (`Mcp-Session-Id` above all: without it a browser client cannot go
past `initialize`). An MCP server that serves browsers does this itself, so a sidecar put in front
of it must too.

The sidecar answers the preflight of an admitted origin itself (204; a browser sends no credentials
on it, so none are asked for) and names the origin on every `/mcp` response to it, errors included.
An origin the allow-list refuses gets 403 before this (`app.py`), and a request without `Origin`
(not from a browser) gets no CORS headers at all.
"""

from __future__ import annotations

import re

from mcp_backfill.sidecar.http_io import HttpCall, RawHeaders

ALLOWED_METHODS = b"GET, POST, DELETE"
EXPOSED_HEADERS = b"mcp-session-id, mcp-protocol-version, www-authenticate"
MAX_AGE_SECONDS = b"600"
"""How long a browser may keep a preflight's answer."""
# A header list as browsers send it in `Access-Control-Request-Headers`: names and commas.
_HEADER_LIST = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*")


def is_preflight(call: HttpCall) -> bool:
    return call.method == "OPTIONS" and "access-control-request-method" in call.headers


async def answer_preflight(call: HttpCall, origin: str) -> None:
    """204 for a preflight from an admitted origin: every method `/mcp` serves, the headers asked."""
    headers = [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-methods", ALLOWED_METHODS),
        (b"access-control-max-age", MAX_AGE_SECONDS),
        (b"vary", b"origin, access-control-request-method, access-control-request-headers"),
    ]
    requested = call.headers.get("access-control-request-headers", "").strip()
    if requested and _HEADER_LIST.fullmatch(requested):
        headers.append((b"access-control-allow-headers", requested.encode("latin-1")))
    await call.respond(204, content_type=None, headers=headers)


def response_headers(origin: str) -> RawHeaders:
    """What every `/mcp` response to an admitted origin carries."""
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-expose-headers", EXPOSED_HEADERS),
        (b"vary", b"origin"),
    ]
