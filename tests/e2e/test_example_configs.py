"""Every example client config, run the way a desktop app runs it.

Each file's `weather` entry gets its `/ABSOLUTE/PATH/TO/...` placeholders (and the client's own
`${...}` variables) replaced with this checkout's paths, then is started with a minimal
environment — `PATH=/usr/bin:/bin` plus the entry's own `env` — by a real MCP SDK client, which
calls a tool that samples. The only addition is `ANTHROPIC_BASE_URL`, pointing at the fake Claude.
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters, types

from tests.fake_claude import FakeClaude, text_reply
from tests.harness import EXAMPLES, ROOT, TEST_API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

CONFIGS = EXAMPLES / "client-configs"
MINIMAL_PATH = "/usr/bin:/bin"
PROXY = Path(sys.executable).parent / "mcp-backfill"
SERVERS_KEY = {"vscode_mcp.json": "servers", "codex_config.toml": "mcp_servers"}


def example_files() -> list[str]:
    return sorted(p.name for p in CONFIGS.iterdir() if p.suffix in (".json", ".toml"))


def weather_entry(name: str) -> dict[str, Any]:
    text = (CONFIGS / name).read_text()
    document = tomllib.loads(text) if name.endswith(".toml") else json.loads(text)
    entry: dict[str, Any] = document[SERVERS_KEY.get(name, "mcpServers")]["weather"]
    return entry


def filled(value: str, key_file: Path) -> str:
    for placeholder, real in (
        ("/ABSOLUTE/PATH/TO/mcp-backfill", str(PROXY)),
        ("/ABSOLUTE/PATH/TO/python3", sys.executable),
        ("/ABSOLUTE/PATH/TO/examples/", f"{EXAMPLES}/"),
        ("/ABSOLUTE/PATH/TO/anthropic-key", str(key_file)),
        ("${workspaceFolder}", str(ROOT)),
        ("${input:anthropic-api-key}", TEST_API_KEY),  # what VS Code asks the user for
        ("${ANTHROPIC_API_KEY}", TEST_API_KEY),  # what Claude Code takes from the user's environment
    ):
        value = value.replace(placeholder, real)
    assert "ABSOLUTE" not in value, f"a placeholder the test does not know: {value}"
    assert "${" not in value, f"a variable the test does not know: {value}"
    return value


def test_every_client_has_an_example() -> None:
    assert example_files() == [
        "claude_code_mcp.json",
        "claude_desktop_config.json",
        "codex_config.toml",
        "cursor_mcp.json",
        "gemini_settings.json",
        "vscode_mcp.json",
        "windsurf_mcp_config.json",
    ]


@pytest.mark.parametrize("name", example_files())
async def test_the_example_runs_with_a_minimal_path(
    name: str, fake_claude: FakeClaude, tmp_path: Path
) -> None:
    key_file = tmp_path / "anthropic-key"
    key_file.write_text(TEST_API_KEY + "\n")
    key_file.chmod(0o600)
    entry = weather_entry(name)
    env = {key: filled(value, key_file) for key, value in entry.get("env", {}).items()}
    env |= {"PATH": MINIMAL_PATH, "ANTHROPIC_BASE_URL": fake_claude.url}
    server = StdioServerParameters(
        command=filled(entry["command"], key_file),
        args=[filled(arg, key_file) for arg in entry["args"]],
        env=env,
    )
    assert server.args[0] == "--"  # the proxy's own options, then `--`, then the server
    fake_claude.enqueue(text_reply("Summarised through the example config."))
    async with Client(server, mode="legacy") as client:
        result = await client.call_tool("summarize", {"text": "A long text about MCP."})
    [block] = result.content
    assert isinstance(block, types.TextContent)
    assert "Summarised through the example config." in block.text
    assert len(fake_claude.message_requests) == 1


async def test_a_bare_command_name_is_not_found_with_a_minimal_path(tmp_path: Path) -> None:
    """Why the examples use absolute paths: a desktop app cannot start `mcp-backfill` by name."""
    entry = weather_entry("claude_desktop_config.json")
    server = StdioServerParameters(command="mcp-backfill", args=entry["args"], env={"PATH": MINIMAL_PATH})
    with pytest.raises(FileNotFoundError):
        async with Client(server, mode="legacy"):
            pass
