"""A provider built when it is first needed, so that a proxy which never samples never pays for it.

Importing the anthropic SDK takes 1.3-3.6 s and about 54 MB on this project's machines. The SDK is
imported in a worker thread (the relay keeps moving messages meanwhile), either when the relay
warms it up — as soon as it sees that it is to answer a session's sampling, from the client's
`initialize` (or first 2026-07-28 request) on, while the upstream is still starting (`--no-warm-up`
turns that off) — or at the latest when the first sampling request arrives. A warm-up also opens the
client's connection to its API (`connect`), so that the first request finds it ready; Bedrock's and
Vertex's providers, built at startup, are wrapped for that alone (`LazyProvider.built`).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from mcp_backfill.errors import ConfigError, SamplingError, internal_error
from mcp_backfill.logs import get_logger
from mcp_backfill.sampling.provider import ProgressCallback, Provider, UsageMeter

log = get_logger("provider")

# The import runs in a worker thread while the event loop's thread relays messages. Each time a
# message wakes the loop's thread, it waits for the GIL until the importing thread lets go, which
# is after the interpreter's switch interval: 5 ms by default, so a handshake's few messages could
# each wait up to 5 ms. During the build the interval is this instead (then set back).
#
# The cyclic garbage collector is off during the build as well: the import makes some 300,000
# objects, and the full collections they set off held the GIL, and with it the relay, for 12-27 ms
# each (the longest ping during a warm-up went from 27-30 ms to 7-15 ms without them). Once built,
# every object so far is frozen (`gc.freeze`): they live as long as the process, and no later full
# collection scans them again (the one at exit went from 50 ms to 0.3 ms).
BUILD_SWITCH_INTERVAL = 0.0005


class LazyProvider:
    def __init__(
        self,
        name: str,
        build: Callable[[], Provider],
        prime: Callable[[], Awaitable[None]] | None = None,
        connect: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.name = name
        self._build = build
        self._prime = prime
        self._connect = connect
        self._provider: Provider | None = None
        self._unusable: str | None = None  # why the build failed on the configuration
        self._lock = anyio.Lock()
        self._warmed = False
        self._requests_waiting = 0  # sampling requests waiting for the build

    @classmethod
    def built(cls, provider: Provider, connect: Callable[[], Awaitable[int]]) -> LazyProvider:
        """A provider built already (Bedrock's and Vertex's, at startup), whose warm-up only
        connects it to its API."""
        lazy = cls(provider.name, lambda: provider, connect=connect)
        lazy._provider = provider
        return lazy

    async def _get(self, why: str = "first request") -> Provider:
        request = why != "warm-up"
        self._requests_waiting += request
        try:
            async with self._lock:  # concurrent first requests build it once
                if self._unusable is not None:
                    raise self._refusal()
                if self._provider is None:
                    try:
                        self._provider = await self._built()
                    except ConfigError as exc:  # the environment will not change: every request is told
                        log.error(
                            "the provider cannot be built", extra={"provider": self.name, "error": str(exc)}
                        )
                        self._unusable = str(exc)
                        raise self._refusal() from None
                    # Priming plays a canned answer so that the first request finds the client's
                    # machinery ready; a request already waiting would only wait longer for it.
                    if not request and self._prime is not None and not self._requests_waiting:
                        try:  # an optimisation only
                            await self._prime()
                        except Exception as exc:
                            log.debug("priming the provider failed", extra={"error": repr(exc)})
                    log.info("provider ready", extra={"provider": self.name, "built_for": why})
                return self._provider
        finally:
            self._requests_waiting -= request

    def _refusal(self) -> SamplingError:
        return internal_error(self._unusable or "", provider=self.name)

    async def _built(self) -> Provider:
        """`build()` in a worker thread, with a short switch interval and no cyclic collector."""
        previous, collecting = sys.getswitchinterval(), gc.isenabled()
        sys.setswitchinterval(min(previous, BUILD_SWITCH_INTERVAL))
        gc.disable()
        try:
            return await anyio.to_thread.run_sync(self._build)
        finally:
            sys.setswitchinterval(previous)
            gc.freeze()
            if collecting:
                gc.enable()

    async def warm_up(self) -> None:
        """Once: build the provider now, ahead of the first request (unless built already),
        `prime` it on this loop unless a request is waiting for it, then `connect` it to its API.
        The connecting is outside the build's lock: a request that waited for the build goes ahead
        at once (over a connection of its own, if this one is not open yet)."""
        if self._warmed:
            return
        self._warmed = True
        await self._get("warm-up")
        if self._connect is None:
            return
        try:
            status = await self._connect()
        except Exception as exc:  # an optimisation only: the first request then connects itself
            log.debug("connecting ahead to the API failed", extra={"error": type(exc).__name__})
        else:
            log.debug("connected ahead to the API", extra={"provider": self.name, "status": status})

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        provider = self._provider if self._provider is not None else await self._get()
        return await provider.create_message(request, on_progress=on_progress, meter=meter)

    async def aclose(self) -> None:
        if self._provider is not None:
            await self._provider.aclose()
