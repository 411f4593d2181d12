"""How to reach an HTTP upstream: its settings, the httpx2 client for it, and safe wording for logs."""

from __future__ import annotations

import base64
import http.cookiejar
import os
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2

from mcp_backfill import __version__
from mcp_backfill.errors import ConfigError
from mcp_backfill.options import named
from mcp_backfill.proxy_variables import unusable_proxy_variables
from mcp_backfill.transports.http_upstream.early import EarlyAnswer, Hooks
from mcp_backfill.transports.http_upstream.http11 import Http11Transport, Outgoing


@dataclass(frozen=True)
class HttpUpstreamSettings:
    """How to reach one streamable-HTTP upstream (built from `Config` by `assembly`)."""

    url: str
    # --max-message-bytes: larger answers are dropped (and answered for with an error).
    max_message_bytes: int
    # Sent on every request (e.g. the upstream's own auth), after the proxy's User-Agent.
    headers: tuple[tuple[str, str], ...] = ()
    connect_timeout: float = 30.0
    # Longest silence on an open response; SSE servers ping well within it.
    read_timeout: float = 300.0
    # Acknowledgements (202) of notifications and responses come at once; do not wait long for one.
    one_way_timeout: float = 30.0
    # Consecutive failed reconnections of a dropped SSE stream before giving up on it.
    reconnect_attempts: int = 3
    # Once a request's SSE stream has delivered its answer, how long to read on to the stream's end
    # (servers close it right after the response). A response read to its end hands its connection
    # back to the pool; one closed midway closes the connection, and the next POST pays a new one.
    finish_timeout: float = 1.0
    # Seconds between reconnections when the server's SSE `retry:` field says nothing.
    reconnect_delay: float = 1.0
    # Every known secret: kept out of the error messages built from what the upstream answered
    # (an upstream may echo the credential it was sent in its error page).
    secrets: tuple[str, ...] = field(default=(), repr=False)


def make_http_client(settings: HttpUpstreamSettings, tls: ssl.SSLContext | None = None) -> httpx2.AsyncClient:
    """A client for upstream sessions (connection pooling, cookies).

    `tls` is the certificate-checking context to use; without one the client builds its own, which
    costs about 25 ms of CPU and 0.8 MB of memory (the CA bundle): a process opening many clients
    (the sidecar, one per client session) should build one with `tls_context()` and share it.

    A plain `http://` upstream that no HTTP proxy stands in front of is spoken to by the lean
    `Http11Transport` (a third of httpx2's own transport's CPU per request); anything else (TLS, an
    `HTTP_PROXY`/`ALL_PROXY` from the environment) by httpx2's transport.

    Raises `ConfigError` naming a proxy variable httpx2 cannot use (never quoting its value).
    """
    timeout = httpx2.Timeout(settings.connect_timeout, read=settings.read_timeout)
    lean = httpx2.URL(settings.url).scheme == "http" and not goes_through_a_proxy(settings.url)
    try:
        return UpstreamClient(
            timeout=timeout,
            headers={"user-agent": f"mcp-backfill/{__version__}"},
            follow_redirects=False,
            verify=tls if tls is not None else True,
            transport=Http11Transport() if lean else None,
        )
    except (httpx2.InvalidURL, ValueError, ImportError):  # the proxy variables httpx2 reads here
        client = f"The HTTP client of {named('--upstream-url')}"
        raise ConfigError(unusable_proxy_variables(os.environ, client)) from None


class AsciiCookies(http.cookiejar.DefaultCookiePolicy):
    """The cookies an upstream sets are kept only when ASCII: a `Cookie` header must be, and one
    holding anything else would make every later request of the session fail to be built."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        text = f"{cookie.name}={cookie.value or ''}"
        return text.isascii() and super().set_ok(cookie, request)


class UpstreamClient(httpx2.AsyncClient):
    """httpx2's client, remembering whether it speaks through the lean `Http11Transport` (see
    `post_message`), and the heads of the message POSTs it sent that way."""

    def __init__(self, *, transport: Http11Transport | None, **options: Any) -> None:
        super().__init__(transport=transport, **options)
        self.cookies.jar.set_policy(AsciiCookies())
        self.lean = transport
        self._heads: dict[tuple[Any, ...], tuple[httpx2.URL, _MessageHead | None]] = {}

    def message_head(self, url: httpx2.URL, headers: Mapping[str, str]) -> _MessageHead | None:
        """How a message POST to `url` with `headers` starts on the wire, up to its length, as this
        client would send it without cookies; None when that cannot be reused (see `post_message`).

        A session's POSTs all carry the same headers, so the head is rendered once (from the request
        the client builds) and only the length and body change.
        """
        key = (tuple(self.headers.raw), tuple(headers.items()))
        known = self._heads.get(key)
        if known is not None and (known[0] is url or known[0] == url):
            return known[1]
        if len(self._heads) >= MESSAGE_HEADS:
            self._heads.clear()  # the session's headers changed many times: start over
        head = _MessageHead.render(self, url, headers)
        self._heads[key] = (url, head)
        return head


# Message heads an `UpstreamClient` keeps (a session uses one or two: before and after its id).
MESSAGE_HEADS = 8
_LENGTH_PROBE = b"Content-Length: 1\r\n\r\n"


@dataclass(frozen=True)
class _MessageHead:
    """The start of a message POST's head (everything before its `Content-Length`), rendered once."""

    prefix: bytes
    key: tuple[str, int]
    close: bool

    @classmethod
    def render(
        cls, http: httpx2.AsyncClient, url: httpx2.URL, headers: Mapping[str, str]
    ) -> _MessageHead | None:
        """From the request the client builds for a one-byte body, whose length httpx2 puts last;
        None when the headers name a length themselves (it would not be the body's)."""
        merged = _merged(http, url, headers)
        if "content-length" in merged:
            return None
        outgoing = Outgoing.of(httpx2.Request("POST", url, headers=merged, content=b"-"), b"-")
        if not outgoing.head.endswith(_LENGTH_PROBE):
            return None
        return cls(outgoing.head[: -len(_LENGTH_PROBE)], outgoing.key, outgoing.close)

    def outgoing(self, body: bytes, timeouts: Mapping[str, float | None]) -> Outgoing:
        head = b"%sContent-Length: %d\r\n\r\n" % (self.prefix, len(body))
        return Outgoing(self.key, "POST", head, body, timeouts, self.close)


@dataclass(frozen=True)
class WrittenPost:
    """A message POST already on the wire (`write_message_now`); `post_message` reads its answer."""

    outgoing: Outgoing
    transport: Http11Transport
    connection: Any  # the transport's connection it went out on
    headers: Mapping[str, str]

    def discard(self) -> None:
        """Its answer will not be read: the connection cannot be reused."""
        self.transport.release(self.outgoing.key, self.connection, reusable=False)

    def read_early(self, hooks: Hooks, max_bytes: int) -> None:
        """Have its answer read from the connection's callback (`early.py`)."""
        EarlyAnswer(self.connection.reader, hooks, max_bytes)

    def done(self, reusable: bool) -> None:
        """Its answer was read whole from the connection's callback (`early.py`)."""
        self.connection.reader.forget()
        self.transport.release(self.outgoing.key, self.connection, reusable=reusable)


def write_message_now(
    http: httpx2.AsyncClient, url: httpx2.URL, body: bytes, headers: Mapping[str, str]
) -> WrittenPost | None:
    """Write a message POST at once, without waiting, when the lean transport has an idle connection
    for it and the client's cookie jar is empty; None (nothing sent) otherwise. Hand the result to
    `post_message`, or `discard` it."""
    if not isinstance(http, UpstreamClient) or http.lean is None or http.cookies or not body:
        return None
    head = http.message_head(url, headers)
    if head is None:
        return None
    outgoing = head.outgoing(body, http.timeout.as_dict())
    connection = http.lean.write_now(outgoing)
    return None if connection is None else WrittenPost(outgoing, http.lean, connection, headers)


async def post_message(
    http: httpx2.AsyncClient,
    url: httpx2.URL,
    body: bytes,
    headers: Mapping[str, str],
    written: WrittenPost | None = None,
) -> httpx2.Response:
    """POST a message (unless `write_message_now` did: `written`); the response comes back with its
    body unread (close it).

    Over the lean transport the request goes straight to the transport as the client would send
    it (its headers under `headers`, its cookies, its timeouts), and the answer's cookies go back
    to the client's jar: what the client's own `send` would do, without the layers these POSTs
    never use (auth flows, redirects, event hooks): about 55 µs of CPU per POST. While the jar is
    empty (it is, unless the upstream sets cookies), no request is even built: the head the client's
    `message_head` rendered for these headers is reused, about 50 µs more (`benchmarks/README.md`,
    3b, both rounds).
    """
    if not isinstance(http, UpstreamClient) or http.lean is None:
        return await http.send(http.build_request("POST", url, content=body, headers=headers), stream=True)
    timeouts = http.timeout.as_dict()
    head = None if http.cookies or not body or written else http.message_head(url, headers)
    request = None
    if written is not None:
        response = await written.transport.send(written.outgoing, written.connection)
    elif head is not None:
        response = await http.lean.send(head.outgoing(body, timeouts))
    else:
        request = httpx2.Request(
            "POST",
            url,
            headers=_merged(http, url, headers),
            cookies=http.cookies or None,
            content=body,
            extensions={"timeout": timeouts},
        )
        response = await http.lean.handle_async_request(request)
    if "set-cookie" in response.headers:  # into the jar, as the client's own `send` does
        response.request = request or httpx2.Request("POST", url, headers=_merged(http, url, headers))
        http.cookies.extract_cookies(response)
    return response


def _merged(http: httpx2.AsyncClient, url: httpx2.URL, headers: Mapping[str, str]) -> httpx2.Headers:
    """The headers the client's own `send` would put on a request to `url`: its defaults, `headers`,
    and the Basic credentials of a URL that carries them (`user:password@`), as its auth flow does."""
    merged = http.headers.copy()
    merged.update(headers)
    if url.username or url.password:
        userpass = f"{url.username}:{url.password}".encode()
        merged["authorization"] = f"Basic {base64.b64encode(userpass).decode()}"
    return merged


def goes_through_a_proxy(url: str) -> bool:
    """Whether the environment's proxy settings (`HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`) apply to `url`."""
    proxies = urllib.request.getproxies()
    if not (proxies.get("http") or proxies.get("all")):
        return False
    host = httpx2.URL(url).host
    return not urllib.request.proxy_bypass_environment(host, proxies)  # type: ignore[attr-defined]


def tls_context() -> ssl.SSLContext:
    """The context `httpx2.AsyncClient` would build for itself (system CAs, `SSL_CERT_FILE`…)."""
    return httpx2.create_ssl_context()


def display_url(url: httpx2.URL | str) -> str:
    """The URL without credentials or query (either may hold a token), for messages and logs."""
    parsed = httpx2.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


def describe_transport_error(exc: httpx2.RequestError) -> str:
    """What went wrong on the way to or from the upstream: a transport error, or an answer whose
    `Content-Encoding` does not decode (which httpx2 raises as no transport error)."""
    if isinstance(exc, httpx2.ConnectTimeout):
        return "timed out connecting"
    if isinstance(exc, httpx2.ReadTimeout):
        return "timed out waiting for data"
    if isinstance(exc, httpx2.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx2.DecodingError):
        return f"the answer's Content-Encoding does not decode ({reason})"
    if isinstance(exc, httpx2.ConnectError):
        return f"cannot connect ({reason})"
    return reason
