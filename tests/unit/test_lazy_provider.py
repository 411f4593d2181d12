"""The Claude client is built on the first sampling request, once, however many arrive together."""

from __future__ import annotations

import gc
import sys
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
