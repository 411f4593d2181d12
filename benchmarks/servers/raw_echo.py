"""The cheapest stdio MCP upstream we can write: JSON lines in, canned JSON lines out.

No SDK and no validation, so that a round trip through it costs as little as possible and the
proxy's own cost stands out. Requests:

* `initialize`: a minimal handshake result.
* `tools/list`: one tool, `echo`.
* `tools/call` `echo` `{"text": T}`: `{"content": [{"type": "text", "text": T}]}`.
* `tools/call` `echo` `{"size": N}`: a text result whose JSON line is about N bytes long (a tool that
  returns a large JSON document as text: quotes and newlines included, so it needs escaping).
* `tools/call` `sample`: sends one `sampling/createMessage` (`SAMPLING_PARAMS`, the request the
  SDK server sends too, and the one the sampling scenario's direct arm converts and sends itself)
  and waits for its answer, reading nothing else meanwhile; the result is the text
  `{"elapsed": seconds from writing the request to holding the parsed answer}`. Calls are handled
  one at a time, so this measures sequential sampling only.
* anything else: an empty result. Notifications are ignored. Exits on stdin EOF.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any

ROW = '{"id": %07d, "name": "item", "value": 3.14159, "tags": ["alpha", "beta"], "ok": true}\n'


def payload_text(size: int) -> str:
    """Text whose JSON encoding is about `size` bytes."""
    encoded_row = len(json.dumps(ROW % 0)) - 2
    return "".join(ROW % n for n in range(max(size // encoded_row, 1)))


def result_json(request: dict[str, object], cache: dict[int, bytes]) -> bytes:
    method = request.get("method")
    if method == "initialize":
        return (
            b'{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},'
            b'"serverInfo":{"name":"bench-raw-echo","version":"1"}}'
        )
    if method == "tools/list":
        return (
            b'{"tools":[{"name":"echo","description":"Echo text, or return `size` bytes.",'
            b'"inputSchema":{"type":"object","properties":{"text":{"type":"string"},'
            b'"size":{"type":"integer"}}}}]}'
        )
    if method == "tools/call":
        params = request.get("params")
        arguments = params.get("arguments") if isinstance(params, dict) else None
        arguments = arguments if isinstance(arguments, dict) else {}
        size = arguments.get("size")
        if isinstance(size, int):
            if size not in cache:
                text = json.dumps(payload_text(size))
                cache[size] = ('{"content":[{"type":"text","text":' + text + "}]}").encode()
            return cache[size]
        text = json.dumps(str(arguments.get("text", "")), ensure_ascii=False)
        return ('{"content":[{"type":"text","text":' + text + "}]}").encode()
    return b"{}"


SAMPLING_PARAMS: dict[str, Any] = {
    "messages": [{"role": "user", "content": {"type": "text", "text": "Say hello."}}],
    "maxTokens": 64,
    "tools": [
        {
            "name": "lookup",
            "description": "Look up the value stored under a key.",
            "inputSchema": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        }
    ],
    "toolChoice": {"mode": "auto"},
}


def sample_once(number: int, stdin: IO[bytes], stdout: IO[bytes]) -> bytes:
    """One sampling request to the client, timed from the write to the parsed answer."""
    request_id = f"sample-{number}"
    line = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "sampling/createMessage", "params": SAMPLING_PARAMS}
    ).encode()
    started = time.perf_counter()
    stdout.write(line + b"\n")
    stdout.flush()
    for answer_line in stdin:
        answer = json.loads(answer_line)
        if isinstance(answer, dict) and answer.get("id") == request_id:
            elapsed = time.perf_counter() - started
            if "result" not in answer:
                text = json.dumps({"error": answer.get("error")})
            else:
                text = json.dumps({"elapsed": elapsed, "model": answer["result"].get("model")})
            return ('{"content":[{"type":"text","text":' + json.dumps(text) + "}]}").encode()
    raise SystemExit(0)


def main() -> int:
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    cache: dict[int, bytes] = {}
    samples = 0
    for line in stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if not isinstance(request, dict) or "id" not in request or "method" not in request:
            continue
        request_id = json.dumps(request["id"]).encode()
        params = request.get("params")
        if request["method"] == "tools/call" and isinstance(params, dict) and params.get("name") == "sample":
            samples += 1
            result = sample_once(samples, stdin, stdout)
        else:
            result = result_json(request, cache)
        stdout.write(b'{"jsonrpc":"2.0","id":' + request_id + b',"result":' + result + b"}\n")
        stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
