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

A client's requests on one connection mostly come with the same head but for their length, and
llhttp's callbacks cost about 10 µs a request, on the call's path (`benchmarks/README.md`, the
thirty-seventh round). So the head of a request read whole is kept (`KnownHead`), and the next read
that is that head byte for byte, with other digits in its `Content-Length` and exactly that many
bytes of body after it, is read from it: what llhttp made of the same bytes, with another length.
"""

from __future__ import annotations

import re

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


_LENGTH_NAME = b"\r\ncontent-length:"
_DIGITS = re.compile(rb"[0-9]{1,18}")


class KnownHead:
    """The head of a request `read_whole` read, but for its `Content-Length`'s digits: the bytes
    before them and after them (to the head's end), and the headers llhttp read from it."""

    __slots__ = ("_prefix", "_suffix", "headers")

    def __init__(self, prefix: bytes, suffix: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self._prefix = prefix
        self._suffix = suffix
        self.headers = headers

    @classmethod
    def of(cls, data: bytes, request: WholeRequest) -> KnownHead | None:
        """The head of `data`, which `read_whole` read as `request`; None when its length is not
        one `Content-Length` of plain digits (a chunked body, say): each such read is parsed."""
        head = data[: len(data) - len(request.body)]
        lowered = head.lower()
        at = lowered.find(_LENGTH_NAME)
        if at < 0 or lowered.find(_LENGTH_NAME, at + 1) >= 0 or b"\r\ntransfer-encoding:" in lowered:
            return None
        start = at + len(_LENGTH_NAME)
        while head[start : start + 1] in (b" ", b"\t"):
            start += 1
        digits = _DIGITS.match(head, start)
        if digits is None or int(digits.group()) != len(request.body):
            return None
        return cls(head[:start], head[digits.end() :], request.headers)

    def body_of(self, data: bytes) -> bytes | None:
        """The body of `data` when it is this head with some length and exactly that many bytes
        after it; None: `data` is to be parsed."""
        prefix = self._prefix
        if not data.startswith(prefix):
            return None
        digits = _DIGITS.match(data, len(prefix))
        if digits is None:
            return None
        end = digits.end()
        if not data.startswith(self._suffix, end):
            return None
        start = end + len(self._suffix)
        return data[start:] if len(data) - start == int(digits.group()) else None
