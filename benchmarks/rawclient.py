"""A minimal JSON-lines MCP client: blocking reads and writes on the child's pipes.

No SDK, no event loop, no parsing inside the timed loops: the client's own cost per round trip is
a few microseconds, so what a scenario measures is the server (and the proxy, when there is one).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Sequence
from typing import Any

READ_CHUNK = 1 << 20
# Far longer than any answer takes: only a hung server (or proxy) hits it, and the run then fails.
READ_TIMEOUT = 120.0
PROTOCOL_VERSION = "2025-11-25"


def request_line(request_id: int, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def tool_call_line(request_id: int, name: str, arguments: dict[str, Any]) -> bytes:
    return request_line(request_id, "tools/call", {"name": name, "arguments": arguments})


class ServerClosed(Exception):
    """The server's stdout ended while we waited for a line."""


class ServerHung(Exception):
    """No answer within READ_TIMEOUT."""


class RawClient:
    """One stdio session with a child process, spoken line by line."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self._write_fd = process.stdin.fileno()
        self._read_fd = process.stdout.fileno()
        self._buffer = bytearray()
        self._scanned = 0
        self._next_id = 1

    @property
    def pid(self) -> int:
        return self.process.pid

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._write_fd, view) :]

    def read_line(self) -> bytes:
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if not select.select([self._read_fd], [], [], READ_TIMEOUT)[0]:
                raise ServerHung(f"process {self.pid} sent nothing for {READ_TIMEOUT:.0f} s")
            chunk = os.read(self._read_fd, READ_CHUNK)
            if not chunk:
                raise ServerClosed(f"process {self.pid} closed its stdout")
            self._buffer += chunk

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request and return its response; messages before it (notifications) are skipped."""
        request_id = self.next_id()
        self.send(request_line(request_id, method, params))
        while True:
            message = json.loads(self.read_line())
            if isinstance(message, dict) and message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message["result"]

    def initialize(self, capabilities: dict[str, Any] | None = None) -> Any:
        """The handshake, as a client that cannot sample would do it."""
        result = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": capabilities or {},
                "clientInfo": {"name": "mcp-backfill-bench", "version": "0"},
            },
        )
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        return result

    def round_trips(self, lines: Sequence[bytes]) -> tuple[list[float], list[bytes]]:
        """Send each line and wait for the next line back; per-request seconds and the answers."""
        times: list[float] = []
        answers: list[bytes] = []
        clock = time.perf_counter
        for line in lines:
            started = clock()
            self.send(line)
            answers.append(self.read_line())
            times.append(clock() - started)
        return times, answers

    def pipelined(self, lines: Sequence[bytes], window: int) -> tuple[float, list[bytes]]:
        """Keep `window` requests in flight until every line is answered; wall seconds and answers."""
        answers: list[bytes] = []
        started = time.perf_counter()
        sent = min(window, len(lines))
        self.send(b"".join(lines[:sent]))
        while len(answers) < len(lines):
            answers.append(self.read_line())
            if sent < len(lines):
                self.send(lines[sent])
                sent += 1
        return time.perf_counter() - started, answers


def check_answers(answers: Sequence[bytes], lines: Sequence[bytes]) -> None:
    """Every request got a successful response with its own id (checked outside the timed loop)."""
    wanted = sorted(json.loads(line)["id"] for line in lines)
    got = []
    for raw in answers:
        message = json.loads(raw)
        if "result" not in message:
            raise RuntimeError(f"unexpected answer: {raw[:300]!r}")
        got.append(message["id"])
    if sorted(got) != wanted:
        raise RuntimeError("responses do not match the requests' ids")
