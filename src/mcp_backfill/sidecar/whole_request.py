"""A request that came whole in one read, parsed without uvicorn: what the lane looks at first.

Most of a session's calls arrive as one read holding one whole `POST` (its head and its body) on
a connection with nothing else in flight. uvicorn's protocol would build its request for it first:
its parser's Python callbacks, the ASGI scope, the request's cycle and its event, about 11 µs of
CPU in a loop and more on a call's path (`benchmarks/README.md`, the thirty-third round). Here the
same C parser (llhttp, through httptools) reads the bytes into the few things the lane looks at:
the target, the headers (names lowercased, as uvicorn gives them) and the body.

Whatever is not exactly one whole keep-alive HTTP/1.1 `POST` (a part of one, two pipelined, an
upgrade, bytes llhttp refuses) is not read here at all: uvicorn reads the same bytes, as it always
has, and answers them (a 400 included). A request the lane takes this way has no uvicorn cycle until
it needs one (`connections._Guard.adopt`).
"""

from __future__ import annotations

try:
    import httptools
except ImportError:  # a platform without its wheel: the lane takes nothing (see `connections.py`)
    httptools = None  # type: ignore[assignment]


class WholeRequest:
    """One request's target, headers and body, as llhttp reads them (its parser's callbacks)."""

    __slots__ = ("_body", "done", "headers", "parser", "plain", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self.done = False
        self.plain = False  # a keep-alive HTTP/1.1 POST asking for no upgrade
        self.parser: httptools.HttpRequestParser | None = None  # while it reads

    @property
    def body(self) -> bytes:
        body = self._body
        return body[0] if len(body) == 1 else b"".join(body)

    def on_message_begin(self) -> None:
        if self.done:
            raise _Another

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        # (Asked now: once the message is complete, llhttp says keep-alive of a `Connection: close`.)
        parser = self.parser
        self.plain = (
            parser is not None
            and parser.get_method() == b"POST"
            and parser.get_http_version() == "1.1"
            and parser.should_keep_alive()
            and not parser.should_upgrade()
        )

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class _Another(Exception):
    """A second request begins in the same bytes: they are uvicorn's to read."""


def read_whole(data: bytes) -> WholeRequest | None:
    """`data` read as one request, when it is exactly one whole keep-alive HTTP/1.1 `POST` that asks
    for no upgrade; else None, and nothing is changed (uvicorn reads the bytes)."""
    request = WholeRequest()
    request.parser = httptools.HttpRequestParser(request)
    try:
        request.parser.feed_data(data)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    finally:
        request.parser = None  # (it holds the request: a reference cycle otherwise)
    return request if request.done and request.plain else None
