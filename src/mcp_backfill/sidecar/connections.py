"""The HTTP connections the sidecar accepts: uvicorn's h11 protocol with the limits it lacks.

uvicorn closes a connection left idle after a response (`timeout_keep_alive`), but not one that
never finishes sending a request's headers — nor one that sends nothing at all — and it accepts any
number of connections. Each would hold a socket and memory forever. Here a connection must deliver
the headers of each request within `header_timeout` seconds (counted from connecting, or from the
previous response), or it is closed; and a connection beyond `max_connections` is closed as soon as
it is accepted. Once a request's headers are in, the request is the application's: long-lived SSE
responses are not cut, and a slow body is the app's `--body-timeout` (408).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from mcp_backfill.logs import get_logger

log = get_logger("sidecar")


class GuardedH11Protocol(H11Protocol):
    header_timeout: float = 10.0
    max_connections: int = 1000

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            log.warning(
                "connection refused: too many open connections (--max-connections)",
                extra={"connections": len(self.connections) - 1},
            )
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # a request's headers are in: the rest is the application's

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.info("connection closed: no complete request headers within --header-timeout")
            self.transport.close()


def guarded_protocol(header_timeout: float, max_connections: int) -> type[GuardedH11Protocol]:
    """The protocol class for uvicorn's `http=` setting, with these limits."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout": header_timeout, "max_connections": max_connections},
    )
