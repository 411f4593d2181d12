"""A lean fake Claude Messages API for the sampling scenarios: `python -m benchmarks.fake_api`.

It answers `POST /v1/messages` with a short, precomputed text message (as a server-sent event
stream when `"stream": true`) over keep-alive HTTP/1.1, after `--delay` seconds. There is no
validation and nothing is parsed beyond the request head and the `model`, so it is not the
bottleneck; the scenarios measure its own time anyway (direct SDK calls) as the baseline. Any
other request is answered 404 (a `HEAD` without a body).
Binds 127.0.0.1, prints the port on stdout, and exits when its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from typing import Any

MODEL_RE = re.compile(rb'"model"\s*:\s*"([^"]{1,200})"')
REPLY_TEXT = "Hello from the benchmark fake."


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def message(model: str) -> dict[str, Any]:
    return {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": REPLY_TEXT}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 7},
    }


def stream_body(model: str) -> bytes:
    start = {
        **message(model),
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 12, "output_tokens": 1},
    }
    events = [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        _sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": REPLY_TEXT}},
        ),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 7},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(events)


def http_response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
        "request-id: req_bench\r\nconnection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


class FakeApi:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._cache: dict[tuple[bytes, bool], bytes] = {}

    def response(self, body: bytes) -> bytes:
        match = MODEL_RE.search(body)
        model = match.group(1) if match else b"claude-bench"
        streaming = b'"stream":true' in body or b'"stream": true' in body
        key = (model, streaming)
        if key not in self._cache:
            name = model.decode()
            self._cache[key] = (
                http_response("200 OK", "text/event-stream", stream_body(name))
                if streaming
                else http_response("200 OK", "application/json", json.dumps(message(name)).encode())
            )
        return self._cache[key]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if not head.startswith(b"POST ") or b"/v1/messages " not in head.split(b"\r\n", 1)[0]:
                    missing = http_response("404 Not Found", "application/json", b'{"type":"error"}')
                    if head.startswith(b"HEAD "):  # the head alone (the proxy's warm-up connects so)
                        missing = missing[: missing.index(b"\r\n\r\n") + 4]
                    writer.write(missing)
                else:
                    if self.delay:
                        await asyncio.sleep(self.delay)
                    writer.write(self.response(body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def main_async(delay: float) -> None:
    fake = FakeApi(delay)
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    # Serve until our stdin closes (the harness exiting, however it exits).
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    server.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fake_api")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(main_async(args.delay))
    except ImportError:
        asyncio.run(main_async(args.delay))
    return 0


if __name__ == "__main__":
    sys.exit(main())
