"""Faithfulness of what the proxy rewrites: beyond the one change it makes, a rewritten message keeps
the sender's numbers as written (digits a double cannot hold), checked on the bytes the upstream got.
"""

from __future__ import annotations

import json

import httpx2
import pytest

from tests.harness import RawSession, proxy_argv, proxy_env, python_server, raw_proxy
from tests.sidecar_harness import HANDSHAKE_HEADERS, HTTP_TIMEOUT, response_to, run_sidecar

pytestmark = pytest.mark.anyio

ECHO = python_server("echo_server.py")

# Numbers a double cannot hold (beyond its range, below its smallest, more digits than it keeps)
# and an integer beyond 64 bits: each must reach the upstream as written.
NUMBERS = ("1e400", "-1e400", "1E-400", "1.00000000000000000000001", "123456789012345678901234567890")


async def lines_seen(session: RawSession) -> list[str]:
    answer = await session.request("lines", "test/lines")
    lines: list[str] = answer["result"]["lines"]
    return lines


@pytest.mark.parametrize("numbers", [",".join(NUMBERS), "1e400", "-1e400,1E-400"])
async def test_initialize_keeps_numbers_a_double_cannot_hold(numbers: str) -> None:
    raw = (
        '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
        f'"capabilities":{{"experimental":{{"x":[{numbers}]}}}},'
        f'"clientInfo":{{"name":"c","version":"0","n":[{numbers}]}},"_meta":{{"m":[{numbers}]}}}}}}\n'
    )
    async with raw_proxy(proxy_argv("--provider", "mock", upstream=ECHO), proxy_env()) as session:
        await session.send_raw(raw.encode())
        await session.recv_until(lambda m: m.get("id") == 1)
        seen = (await lines_seen(session))[0]
    assert '"sampling":{"tools":{}}' in seen  # it was rewritten
    for key in ("x", "n", "m"):
        assert f'"{key}":[{numbers}]' in seen, seen


MODERN = "2026-07-28"
ENVELOPE = (
    '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
    '"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"0"},'
    '"io.modelcontextprotocol/clientCapabilities":{}}'
)
EXACT = ",".join(NUMBERS)


def modern_request(request_id: int, method: str, params: str) -> bytes:
    """A 2026-07-28 request as raw text; `params` is the text inside `params`, before its `_meta`."""
    inner = f"{params},{ENVELOPE}" if params else ENVELOPE
    return f'{{"jsonrpc":"2.0","id":{request_id},"method":"{method}","params":{{{inner}}}}}'.encode()


def raw_answer_request(request_id: int) -> bytes:
    result = json.dumps(f'{{"content":[],"n":[{EXACT}]}}')
    return modern_request(request_id, "test/answer_raw", f'"result":{result}')


async def test_a_2026_request_and_its_answer_keep_numbers_a_double_cannot_hold() -> None:
    call = modern_request(1, "tools/call", f'"name":"t","arguments":{{"n":[{EXACT}]}}')
    async with raw_proxy(proxy_argv("--provider", "mock", upstream=ECHO), proxy_env()) as session:
        await session.send_raw(call + b"\n")
        await session.recv_until(lambda m: m.get("id") == 1)
        seen = (await lines_seen(session))[0]
        await session.send_raw(raw_answer_request(2) + b"\n")
        answer = await session.read_line()
    assert '"sampling":{"tools":{}}' in seen  # it was rewritten
    assert f'"arguments":{{"n":[{EXACT}]}}' in seen, seen
    assert f'"n":[{EXACT}]'.encode() in answer, answer


async def test_the_sidecars_2026_front_keeps_numbers_a_double_cannot_hold() -> None:
    """The 2026-07-28 front of `serve` parsed requests and answers with `json` and wrote them again
    (the id is the mux's): 1e400 reached the upstream, and the client, as null."""
    headers = {**HANDSHAKE_HEADERS, "mcp-protocol-version": MODERN}
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        call = modern_request(1, "tools/call", f'"name":"t","arguments":{{"n":[{EXACT}]}}')
        sent = await http.post(
            sidecar.url, content=call, headers={**headers, "mcp-method": "tools/call", "mcp-name": "t"}
        )
        assert sent.status_code == 200, sent.text
        answered = await http.post(
            sidecar.url, content=raw_answer_request(2), headers={**headers, "mcp-method": "test/answer_raw"}
        )
        listed = await http.post(
            sidecar.url,
            content=modern_request(3, "test/lines", ""),
            headers={**headers, "mcp-method": "test/lines"},
        )
    [seen] = [line for line in response_to(listed, 3)["result"]["lines"] if '"tools/call"' in line]
    assert f'"arguments":{{"n":[{EXACT}]}}' in seen, seen
    assert f'"n":[{EXACT}]' in answered.text, answered.text


async def test_a_rewritten_message_nested_deeper_than_orjson_writes_is_relayed() -> None:
    """orjson writes 255 levels at most: deeper, `json.dumps` wrote the message, recursing, and at
    about a thousand levels (orjson reads 1,024) its RecursionError ended the stdio session."""
    deep = "[" * 1000 + "1" + "]" * 1000
    raw = (
        '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
        f'"capabilities":{{"experimental":{{"x":{deep}}}}},"clientInfo":{{"name":"c","version":"0"}}}}}}\n'
    )
    async with raw_proxy(proxy_argv("--provider", "mock", upstream=ECHO), proxy_env()) as session:
        await session.send_raw(raw.encode())
        assert (await session.recv())["error"]["code"] == -32700  # too deep for the echo server
        seen = (await lines_seen(session))[0]
        assert (await session.request(2, "ping"))["result"]["echo"]["id"] == 2
    assert f'"experimental":{{"x":{deep}}},"sampling":{{"tools":{{}}}}' in seen


async def test_a_refused_oversized_request_is_answered_under_its_id_as_written() -> None:
    """The id of a message too large to parse is read from its head: it was read with `json`, and
    a decimal id of more digits than a double keeps came back changed (1.0), matching no request."""
    exact_id = "1.00000000000000000000001"
    raw = f'{{"jsonrpc":"2.0","id":{exact_id},"method":"pad","params":{{"p":"{"y" * 10_000}"}}}}\n'
    argv = proxy_argv("--provider", "mock", "--max-message-bytes", "4096", upstream=ECHO)
    async with raw_proxy(argv, proxy_env()) as session:
        await session.send_raw(raw.encode())
        refusal = await session.read_line()
    assert refusal.startswith(f'{{"jsonrpc":"2.0","id":{exact_id},"error":'.encode()), refusal
