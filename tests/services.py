"""Real infrastructure for the multi-replica tests: a `redis-server` and an HAProxy, on loopback.

Both are Debian packages that `scripts/setup` installs (as root) when missing; a test that needs one
fails with the command that installs it rather than skipping.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import anyio
from anyio.abc import Process

from tests.harness import free_port, stop_process, wait_for_port


def binary(name: str, package: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")
    if path is None:
        raise AssertionError(
            f"{name} is missing: apt-get install -y {package} (scripts/setup does it as root)"
        )
    return path


@dataclass
class RedisServer:
    port: int
    process: Process | None
    log_path: Path
    data_dir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


async def _start_redis(server: RedisServer) -> None:
    with server.log_path.open("ab") as log:  # the child keeps its own descriptor
        server.process = await _spawn_redis(server, log)
    await wait_for_port(server.port, server.process, server.log_path)


async def _spawn_redis(server: RedisServer, log: BinaryIO) -> Process:
    return await anyio.open_process(
        [
            binary("redis-server", "redis-server"),
            "--bind",
            "127.0.0.1",
            "--port",
            str(server.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(server.data_dir),
        ],
        stdout=log,
        stderr=log,
    )


@asynccontextmanager
async def redis_server() -> AsyncIterator[RedisServer]:
    """A throwaway redis-server on a free loopback port, without persistence."""
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(free_port(), None, Path(tmp) / "redis.log", Path(tmp))
        await _start_redis(server)
        try:
            yield server
        finally:
            if server.process is not None:
                await stop_process(server.process)


async def stop_redis(server: RedisServer) -> None:
    assert server.process is not None
    await stop_process(server.process)
    server.process = None


async def restart_redis(server: RedisServer) -> None:
    """Start it again on the same port (its data is gone: it was never saved)."""
    await _start_redis(server)
