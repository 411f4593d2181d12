"""The Claude client is built on the first sampling request, once, however many arrive together."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from mcp_backfill.providers.lazy import BUILD_SWITCH_INTERVAL, LazyProvider
from mcp_backfill.sampling.provider import ProgressCallback, Provider, UsageMeter

pytestmark = pytest.mark.anyio


class Echo:
    name = "echo"

    def __init__(self) -> None:
        self.closed = False

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        return {"echo": request}

    async def aclose(self) -> None:
        self.closed = True


async def test_built_once_on_first_use_and_closed_only_if_built() -> None:
    built: list[Echo] = []

    def build() -> Provider:
        built.append(Echo())
        return built[-1]

    idle = LazyProvider("anthropic", build)
    await idle.aclose()
    assert built == []  # never used: never built

    lazy = LazyProvider("anthropic", build)
    answers: list[dict[str, Any]] = []

    async def ask(n: int) -> None:
        answers.append(await lazy.create_message({"n": n}))

    async with anyio.create_task_group() as tg:
        for n in range(5):
            tg.start_soon(ask, n)
    assert len(built) == 1
    assert sorted(a["echo"]["n"] for a in answers) == [0, 1, 2, 3, 4]
    await lazy.aclose()
    assert built[0].closed


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # what the build froze goes back to the collector


@pytest.mark.usefixtures("unfrozen")
@pytest.mark.parametrize("fails", [False, True])
async def test_the_build_runs_without_the_collector_and_freezes_what_it_made(fails: bool) -> None:
    seen: dict[str, Any] = {}
    interval = sys.getswitchinterval()

    def build() -> Provider:
        seen.update(collector=gc.isenabled(), interval=sys.getswitchinterval(), made=[[] for _ in range(9)])
        if fails:
            raise RuntimeError("no SDK")
        return Echo()

    lazy = LazyProvider("anthropic", build)
    frozen = gc.get_freeze_count()
    if fails:
        with pytest.raises(RuntimeError):
            await lazy.warm_up()
    else:
        await lazy.warm_up()
    assert seen["collector"] is False
    assert seen["interval"] <= BUILD_SWITCH_INTERVAL
    assert gc.isenabled()
    assert sys.getswitchinterval() == interval
    assert gc.get_freeze_count() >= frozen + len(seen["made"])  # the build's objects among them


@pytest.mark.usefixtures("unfrozen")
async def test_the_warm_up_connects_outside_the_build_lock_and_survives_a_failed_connection() -> None:
    """A request that waited for the build goes ahead while the warm-up is still connecting; a
    connection that fails is only an optimisation lost."""
    building, connecting, release = threading.Event(), anyio.Event(), anyio.Event()
    answers: list[dict[str, Any]] = []
    connections: list[None] = []

    def build() -> Provider:
        building.wait(10)
        return Echo()

    async def connect() -> int:
        connections.append(None)
        connecting.set()
        await release.wait()
        raise OSError("connection refused")

    async def ask() -> None:
        answers.append(await lazy.create_message({"n": 1}))

    lazy = LazyProvider("anthropic", build, connect=connect)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lazy.warm_up)
            await anyio.sleep(0.05)  # the warm-up holds the build's lock
            tg.start_soon(ask)  # and this request waits for it
            await anyio.sleep(0.05)
            building.set()
            await connecting.wait()
            while not answers:  # answered while the connecting still hangs
                await anyio.sleep(0.01)
            release.set()
    assert answers == [{"echo": {"n": 1}}]
    await lazy.warm_up()  # built already: nothing more, not even another connection
    assert len(connections) == 1


@pytest.mark.usefixtures("unfrozen")
@pytest.mark.parametrize("request_waits", [False, True])
async def test_the_warm_up_primes_only_when_no_request_is_waiting_for_the_build(request_waits: bool) -> None:
    """Priming plays a canned answer ahead of the first request; a request that came during the
    build would only wait longer for it (the first answer right after the handshake, scenario 4)."""
    building = threading.Event()
    primed: list[None] = []
    answers: list[dict[str, Any]] = []

    def build() -> Provider:
        building.wait(10)
        return Echo()

    async def prime() -> None:
        primed.append(None)

    async def ask() -> None:
        answers.append(await lazy.create_message({"n": 1}))

    lazy = LazyProvider("anthropic", build, prime)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lazy.warm_up)
            await anyio.sleep(0.05)  # the warm-up holds the build's lock
            if request_waits:
                tg.start_soon(ask)
                await anyio.sleep(0.05)
            building.set()
    assert primed == ([] if request_waits else [None])
    assert answers == ([{"echo": {"n": 1}}] if request_waits else [])
