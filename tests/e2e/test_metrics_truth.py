"""What `serve` reports — `/metrics`, the audit log — against what the fake Claude API served.

A real `mcp-backfill serve` (the anthropic provider against tests/fake_claude.py) serves real MCP
clients and servers; each test ends sampling calls one way and reads back the proxy's reports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client

from tests.fake_claude import FakeClaude, text_reply
from tests.harness import proxy_env, python_server, tool_json
from tests.sidecar_harness import HTTP_TIMEOUT, run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
# One sample line of the text exposition format (0.0.4): name, labels (values escaped: \\ \" \n
# only), a value. https://prometheus.io/docs/instrumenting/exposition_formats/
_LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE_LINE = re.compile(
    rf"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{{[a-zA-Z_][a-zA-Z0-9_]*={_LABEL_VALUE}"
    rf"(?:,[a-zA-Z_][a-zA-Z0-9_]*={_LABEL_VALUE})*\}})? \S+$"
)


def plain(text: str, timeout: float = 30.0) -> dict[str, Any]:
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": 20}
    return {"params_json": json.dumps(params), "timeout": timeout}


def exposition_problems(text: str) -> list[str]:
    return [
        line
        for line in text.split("\n")[:-1]
        if not (line.startswith(("# HELP ", "# TYPE ")) or _SAMPLE_LINE.match(line))
    ]


async def test_metrics_stay_readable_whatever_model_name_the_api_reports(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A gateway may report any model string: one UTF-8 cannot encode (a lone surrogate, which JSON
    allows) or one with quotes, backslashes and line breaks still leaves `/metrics` valid."""
    odd = ['say "hi"\\\nback', "lone \ud800 surrogate"]
    fake_claude.enqueue(*(text_reply("fine", model=model) for model in odd))
    async with (
        run_sidecar(upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        Client(sidecar.url, mode="legacy") as client,
    ):
        assert "result" in tool_json(await client.call_tool("sample_raw", plain("one")))
        # The SDK's server cannot read the answer with the lone surrogate (pydantic refuses one): it
        # gives up waiting, soon. The proxy answered it all the same.
        await client.call_tool("sample_raw", plain("two", timeout=2.0))
        assert len(fake_claude.message_requests) == 2
        scrape = await http.get(f"{sidecar.base}/metrics")
    assert scrape.status_code == 200, scrape.text
    text = scrape.content.decode("utf-8")  # strict: the format is UTF-8
    assert exposition_problems(text) == []
    assert 'model="say \\"hi\\"\\\\\\nback"' in text
    answered = [
        line for line in text.splitlines() if line.startswith("mcp_backfill_sampling_requests_total{")
    ]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in answered) == 2, answered
