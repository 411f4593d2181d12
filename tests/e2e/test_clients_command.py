"""`mcp-backfill clients` as a user runs it: the real command against fixture configs of every
client, laid out in a temporary home the way Linux, macOS and Windows lay them out.

For each client and system: `list` finds exactly the files where that system keeps them (decoys
where the other systems keep them are ignored), `--dry-run` prints a diff and writes nothing, `wrap`
backs each file up and rewrites only the servers (comments, order, other settings kept; absolute
paths; `--`), a second `wrap` changes nothing, `unwrap` gives the files back, and a malformed file
stops the command with nothing changed. Then a wrapped Claude Desktop entry is started the way the
desktop app starts it, with a minimal PATH, and answers a tool call through a real MCP client.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from mcp_backfill.clients import jsonc
from tests.e2e.test_http_upstream import handshake, recorder
from tests.fake_claude import FakeClaude
from tests.harness import EXAMPLES, ROOT, TEST_API_KEY, proxy_env, raw_proxy, run_clients

FIXTURES = ROOT / "tests" / "client_configs"
PROXY = str(Path(sys.executable).parent / "mcp-backfill")
SYSTEMS = ("linux", "macos", "windows")
APP_DATA = {"linux": ".config", "macos": "Library/Application Support", "windows": "AppData/Roaming"}

# Where each client keeps its user-level config, relative to the home directory, per system.
USER_FILES: dict[str, dict[str, str]] = {
    "claude-desktop": {
        os_name: f"{APP_DATA[os_name]}/Claude/claude_desktop_config.json" for os_name in SYSTEMS
    },
    "claude-code": dict.fromkeys(SYSTEMS, ".claude.json"),
    "cursor": dict.fromkeys(SYSTEMS, ".cursor/mcp.json"),
    "vscode": {os_name: f"{APP_DATA[os_name]}/Code/User/mcp.json" for os_name in SYSTEMS},
    "windsurf": dict.fromkeys(SYSTEMS, ".codeium/windsurf/mcp_config.json"),
    "gemini": dict.fromkeys(SYSTEMS, ".gemini/settings.json"),
    "codex": dict.fromkeys(SYSTEMS, ".codex/config.toml"),
}
PROJECT_FILES = {
    "claude-code": ".mcp.json",
    "cursor": ".cursor/mcp.json",
    "vscode": ".vscode/mcp.json",
    "gemini": ".gemini/settings.json",
    "codex": ".codex/config.toml",
}
FIXTURE_NAMES = {
    "claude-desktop": ("claude_desktop_config.json", None),
    "claude-code": ("claude_code_user.json", "claude_code_project.json"),
    "cursor": ("cursor_user.json", "cursor_project.json"),
    "vscode": ("vscode_user.json", "vscode_project.json"),
    "windsurf": ("windsurf_user.json", None),
    "gemini": ("gemini_user.json", "gemini_project.json"),
    "codex": ("codex_user.toml", "codex_project.toml"),
}
# Entries the proxy cannot front, left alone with a reason: legacy SSE, a header from the environment.
SKIPPED = {"claude-code": {"events"}, "gemini": {"legacy"}, "codex": {"private"}}
# The servers reached by URL (wrapped with the URL in MCP_BACKFILL_UPSTREAM_URL), the rest are commands.
REMOTE = {"docs", "remote", "github"}
# Secrets in the fixtures that must stay where they were and not show up anywhere else.
KEY_FILE_CONTENT = TEST_API_KEY
COMMENT = re.compile(r"(?:^|(?<=\s))(?://|/\*|#) [^\n]*", re.MULTILINE)


class Home:
    """A temporary home (and project) holding one client's fixtures where `os_name` keeps them."""

    def __init__(self, root: Path, client: str, os_name: str) -> None:
        self.root = root
        self.home = root / "home"
        self.project = root / "project"
        self.bin = root / "bin"
        self.client = client
        self.os_name = os_name
        self.key_file = root / "anthropic.key"
        self.key_file.write_text(KEY_FILE_CONTENT + "\n")
        self.bin.mkdir()
        server = self.bin / "weather-server"
        server.write_text("#!/bin/sh\nexit 0\n")
        server.chmod(server.stat().st_mode | stat.S_IXUSR)
        self.files: list[Path] = []
        user, project = FIXTURE_NAMES[client]
        self.files.append(self._place(self.home / USER_FILES[client][os_name], user))
        if project is not None:
            self.files.append(self._place(self.project / PROJECT_FILES[client], project))
        for other in SYSTEMS:  # decoys where the other systems keep the file
            decoy = self.home / USER_FILES[client][other]
            if not decoy.exists():
                decoy.parent.mkdir(parents=True, exist_ok=True)
                decoy.write_text(
                    '{"mcpServers": {"decoy": {"command": "x"}}, "servers": {"decoy": {"command": "x"}}}'
                )

    def _place(self, path: Path, fixture: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((FIXTURES / fixture).read_bytes())
        return path

    def run(
        self, action: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        environment = env or proxy_env(PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}")
        return run_clients(
            action,
            *args,
            home=self.home,
            project=self.project,
            os_name=self.os_name,
            client=self.client,
            env=environment,
        )

    def contents(self) -> dict[Path, bytes]:
        return {path: path.read_bytes() for path in self.files}

    def backups(self) -> list[Path]:
        return sorted(
            path for file in self.files for path in file.parent.glob(f"{file.name}.bak-mcp-backfill-*")
        )


def parsed(path: Path) -> Any:
    text = path.read_text()
    return tomllib.loads(text) if path.suffix == ".toml" else jsonc.parse(text).value


def server_tables(value: dict[str, Any]) -> list[dict[str, Any]]:
    tables = [value.get(key) for key in ("mcpServers", "servers", "mcp_servers")]
    tables += [project.get("mcpServers") for project in value.get("projects", {}).values()]
    return [table for table in tables if isinstance(table, dict)]


def comments(text: str) -> list[str]:
    """The comments of a JSONC or TOML text (a `//` in a URL is not one)."""
    return [match.group(0) for match in COMMENT.finditer(text)]


def without_servers(value: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in value.items() if k not in ("mcpServers", "servers", "mcp_servers", "projects")}
    for path, project in value.get("projects", {}).items():
        rest[f"project {path}"] = {k: v for k, v in project.items() if k != "mcpServers"}
    return rest


@pytest.mark.parametrize("os_name", SYSTEMS)
@pytest.mark.parametrize("client", list(USER_FILES))
def test_wrap_and_unwrap_every_client_config(tmp_path: Path, client: str, os_name: str) -> None:
    home = Home(tmp_path, client, os_name)
    originals = home.contents()

    # list: the files where this system keeps them, and nothing wrapped yet
    listing = home.run("list", "--json")
    assert listing.returncode == 0, listing.stderr
    report = json.loads(listing.stdout)
    assert {Path(entry["path"]) for entry in report["files"]} == set(home.files)
    servers = {server["name"]: server for entry in report["files"] for server in entry["servers"]}
    assert "decoy" not in servers
    assert servers
    assert not any(server["wrapped"] for server in servers.values())
    for name, server in servers.items():
        assert server["kind"] == ("url" if name in REMOTE | SKIPPED.get(client, set()) else "stdio"), name
    table = home.run("list")
    assert all(str(path) in table.stdout for path in home.files)

    # --dry-run: a diff of every file, nothing written
    dry = home.run("wrap", "--all", "--dry-run", "--key-file", str(home.key_file))
    assert dry.returncode == 0, dry.stderr
    for path in home.files:
        assert f"--- {path}\n" in dry.stdout
    assert f'+      "command": "{PROXY}"' in dry.stdout or f'+command = "{PROXY}"' in dry.stdout
    assert home.contents() == originals
    assert home.backups() == []

    # wrap: backups of the originals, the servers rewritten, everything else kept
    wrapped_run = home.run("wrap", "--all", "--key-file", str(home.key_file), "--", "--provider", "mock")
    assert wrapped_run.returncode == 0, wrapped_run.stderr
    backups = home.backups()
    assert sorted(path.read_bytes() for path in backups) == sorted(originals.values())
    for name in SKIPPED.get(client, set()):
        assert f"skipped {client} {name} " in wrapped_run.stderr
    wrapped_files = home.contents()
    for path in home.files:
        after = parsed(path)
        before = (
            tomllib.loads(originals[path].decode())
            if path.suffix == ".toml"
            else jsonc.parse(originals[path].decode()).value
        )
        assert without_servers(after) == without_servers(before)
        kept = comments(originals[path].decode())
        assert kept == [line for line in comments(wrapped_files[path].decode()) if line in kept]
        assert KEY_FILE_CONTENT not in wrapped_files[path].decode()
        for servers_table, old_table in zip(server_tables(after), server_tables(before), strict=True):
            assert list(servers_table) == list(old_table)  # same servers, same order
            for name, entry in servers_table.items():
                if name in SKIPPED.get(client, set()):
                    assert entry == old_table[name]
                    continue
                assert entry["command"] == PROXY
                args = entry["args"]
                assert args[:2] == ["--provider", "mock"]
                assert entry["env"]["ANTHROPIC_API_KEY_FILE"] == str(home.key_file)
                if name in REMOTE:
                    assert args[2:] == []  # the URL is in env: the process list shows the arguments
                    url_key = next(key for key in ("url", "httpUrl", "serverUrl") if key in old_table[name])
                    assert entry["env"]["MCP_BACKFILL_UPSTREAM_URL"] == old_table[name][url_key]
                    assert "MCP_BACKFILL_UPSTREAM_HEADERS" in entry["env"]
                    continue
                upstream = args[args.index("--") + 1 :]
                original = old_table[name]
                assert upstream[1:] == original.get("args", [])
                if original["command"] == "weather-server":
                    assert upstream[0] == str(home.bin / "weather-server")
                else:
                    assert upstream[0] == original["command"]  # absolute already, or not on PATH
                for variable, value in original.get("env", {}).items():
                    assert entry["env"][variable] == value
    if client == "cursor":
        assert "'not-installed-tool-0b1c' is not on PATH" in wrapped_run.stderr
    relisted = json.loads(home.run("list", "--json").stdout)
    for entry in relisted["files"]:
        for server in entry["servers"]:
            assert server["wrapped"] == (server["name"] not in SKIPPED.get(client, set())), server

    # wrap again: nothing changes, no new backup
    again = home.run("wrap", "--all", "--key-file", str(home.key_file), "--", "--provider", "mock")
    assert again.returncode == 0, again.stderr
    assert home.contents() == wrapped_files
    assert home.backups() == backups

    # unwrap: the files as they were
    unwrapped = home.run("unwrap", "--all")
    assert unwrapped.returncode == 0, unwrapped.stderr
    restored = home.contents()
    for path in home.files:
        if path.suffix == ".toml":
            # tomlkit rewrites a removed-then-restored line in its own style (a remote server's URL
            # and headers); the values, the order of the tables and every comment come back.
            assert tomllib.loads(restored[path].decode()) == tomllib.loads(originals[path].decode())
            assert comments(restored[path].decode()) == comments(originals[path].decode())
        else:
            assert restored[path] == originals[path], restored[path].decode()

    # a malformed file: refused with its position, nothing changed anywhere
    broken = home.files[0]
    broken.write_bytes(
        originals[broken].replace(b"\n", b"\n@", 1) if broken.suffix == ".json" else b"[mcp_servers\n"
    )
    before_failure = home.contents()
    refused = home.run("wrap", "--all", "--key-file", str(home.key_file))
    assert refused.returncode == 1
    position = "line 2, column 1" if broken.suffix == ".json" else "line 1, column 12"
    assert f"{broken}: {position}: " in refused.stderr
    assert "nothing was changed" in refused.stderr
    assert home.contents() == before_failure


def test_named_servers_only_and_unknown_names(tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor", "linux")
    originals = home.contents()
    unknown = home.run("wrap", "no-such-server")
    assert unknown.returncode == 1
    assert "no server named no-such-server" in unknown.stderr
    assert home.contents() == originals
    done = home.run("wrap", "weather", "--key-file", str(home.key_file))
    assert done.returncode == 0, done.stderr
    table = parsed(home.files[0])["mcpServers"]
    assert table["weather"]["command"] == PROXY
    assert table["remote"] == parsed_original(originals[home.files[0]])["mcpServers"]["remote"]
    assert "note: the wrapped servers need the Claude API key" not in done.stderr  # --key-file was given
    nothing = home.run("wrap")
    assert nothing.returncode == 2
    assert "--all" in nothing.stderr


@pytest.mark.parametrize("client", list(USER_FILES))
def test_the_client_pages_dry_run_command_works(tmp_path: Path, client: str) -> None:
    """docs/clients/<client>.md's "shows the diff first" command, run as written on its client's files."""
    page = (ROOT / "docs" / "clients" / f"{client}.md").read_text()
    match = re.search(r"`mcp-backfill clients (wrap [^`]*--dry-run)`", page)
    assert match, f"docs/clients/{client}.md: no `mcp-backfill clients wrap ... --dry-run` command"
    action, *args = match.group(1).split()
    assert args[args.index("--client") + 1] == client
    home = Home(tmp_path, client, "linux")
    originals = home.contents()
    dry = home.run(action, *(os.path.expanduser(arg) for arg in args))
    assert dry.returncode == 0, f"`{match.group(0)}` -> exit {dry.returncode}: {dry.stderr}"
    assert f"+++ {home.files[0]}\n" in dry.stdout
    assert home.contents() == originals


def parsed_original(content: bytes) -> Any:
    return jsonc.parse(content.decode()).value


def test_the_variables_locate_configs_without_home(tmp_path: Path) -> None:
    """Without --home: HOME, then APPDATA (Windows) and XDG_CONFIG_HOME (Linux) as the user set them."""
    config = tmp_path / "elsewhere"
    for relative in ("Claude/claude_desktop_config.json",):
        path = config / relative
        path.parent.mkdir(parents=True)
        path.write_bytes((FIXTURES / "claude_desktop_config.json").read_bytes())
    for os_name, variable in (("linux", "XDG_CONFIG_HOME"), ("windows", "APPDATA")):
        env = proxy_env(HOME=str(tmp_path / "home"), **{variable: str(config)})
        argv = [sys.executable, "-m", "mcp_backfill", "clients", "list", "--json", "--os", os_name]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr
        paths = [entry["path"] for entry in json.loads(done.stdout)["files"]]
        assert paths == [str(config / "Claude" / "claude_desktop_config.json")], os_name


def test_write_key_is_the_only_way_the_key_lands_in_a_config(tmp_path: Path) -> None:
    home = Home(tmp_path, "claude-desktop", "linux")
    env = proxy_env(PATH=f"{home.bin}{os.pathsep}{os.environ['PATH']}", ANTHROPIC_API_KEY=TEST_API_KEY)
    plain = home.run("wrap", "--all", "--dry-run", env=env)
    assert TEST_API_KEY not in plain.stdout + plain.stderr
    assert "ANTHROPIC_API_KEY" in plain.stderr  # the note says how the servers get the key
    shown = home.run("wrap", "--all", "--dry-run", "--write-key", env=env)
    assert TEST_API_KEY not in shown.stdout + shown.stderr  # masked in the diff
    written = home.run("wrap", "--all", "--write-key", env=env)
    assert written.returncode == 0, written.stderr
    assert TEST_API_KEY not in written.stdout + written.stderr
    assert parsed(home.files[0])["mcpServers"]["weather"]["env"]["ANTHROPIC_API_KEY"] == TEST_API_KEY


def test_a_wrapped_desktop_entry_runs_with_a_minimal_path(tmp_path: Path, fake_claude: FakeClaude) -> None:
    """What issue 14 saw fail: a desktop app starts servers with PATH=/usr/bin:/bin. After `wrap`,
    the entry names mcp-backfill and the server's interpreter by absolute path, so it starts, and
    the proxy answers the server's sampling request with the key from the --key-file."""
    home_dir = tmp_path / "home"
    config = home_dir / ".config" / "Claude" / "claude_desktop_config.json"
    config.parent.mkdir(parents=True)
    entry = {"command": "python", "args": [str(EXAMPLES / "weather_server.py")]}
    config.write_text(json.dumps({"mcpServers": {"weather": entry}}, indent=2) + "\n")
    key_file = tmp_path / "anthropic.key"
    key_file.write_text(TEST_API_KEY + "\n")
    key_file.chmod(0o600)
    user_path = f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin"
    argv = [sys.executable, "-m", "mcp_backfill", "clients", "wrap", "weather", "--home", str(home_dir)]
    argv += ["--os", "linux", "--key-file", str(key_file)]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=proxy_env(PATH=user_path), cwd=tmp_path, timeout=60
    )
    assert done.returncode == 0, done.stderr
    wrapped = json.loads(config.read_text())["mcpServers"]["weather"]
    assert wrapped["command"] == PROXY
    assert wrapped["args"] == [
        "--",
        str(Path(sys.executable).parent / "python"),
        str(EXAMPLES / "weather_server.py"),
    ]
    assert TEST_API_KEY not in config.read_text()

    async def call() -> str:
        # As the desktop app starts it: the entry's command, args and env, a minimal PATH, no cwd of
        # ours (the fake Claude API stands in for the real one).
        environment = {"PATH": "/usr/bin:/bin", "HOME": str(home_dir), "ANTHROPIC_BASE_URL": fake_claude.url}
        server = StdioServerParameters(
            command=wrapped["command"],
            args=wrapped["args"],
            env={**environment, **wrapped["env"]},
            cwd=str(tmp_path),
        )
        with anyio.fail_after(90):
            async with Client(server, mode="legacy") as client:
                result = await client.call_tool("summarize", {"text": "Rain in Oslo, sun in Rome."})
        assert not result.is_error, result
        return " ".join(getattr(block, "text", "") for block in result.content)

    assert "fake-claude says" in anyio.run(call)
    assert fake_claude.message_requests  # answered with the key read from the file


def test_a_wrapped_url_entry_keeps_its_credentials_out_of_the_process_list(tmp_path: Path) -> None:
    """A remote entry whose URL holds a password (or a key in its query) is wrapped with the URL in
    `env`, where the headers go, not in `args`: the running proxy's command line (what `ps` shows
    every local user) holds no credential, and the proxy still reaches the URL with them (the
    password as Basic authentication). `list` and `--dry-run` show the URL masked."""
    password, query_key = "url-pass-0123456789", "query-key-0123456789"
    home_dir, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    config = home_dir / ".claude.json"
    config.parent.mkdir(parents=True)

    def clients(action: str, *args: str) -> subprocess.CompletedProcess[str]:
        done = run_clients(
            action,
            *args,
            home=home_dir,
            project=project,
            os_name="linux",
            client="claude-code",
            env=proxy_env(),
        )
        assert done.returncode == 0, done.stderr
        for secret in (password, query_key):
            assert secret not in done.stdout + done.stderr
        return done

    async def scenario() -> None:
        async with recorder() as (upstream, recorded):
            url = upstream.url.replace("http://", f"http://alice:{password}@") + f"?api_key={query_key}"
            entry = {"type": "http", "url": url, "headers": {"X-Team": "blue"}}
            config.write_text(json.dumps({"mcpServers": {"remote": entry}}, indent=2) + "\n")
            dry = clients("wrap", "remote", "--dry-run", "--", "--provider", "mock")
            assert "***@127.0.0.1" in dry.stdout
            clients("wrap", "remote", "--", "--provider", "mock")
            wrapped = json.loads(config.read_text())["mcpServers"]["remote"]
            assert wrapped["command"] == PROXY
            for secret in (password, query_key):
                assert not any(secret in arg for arg in wrapped["args"]), wrapped["args"]
            listed = json.loads(clients("list", "--json").stdout)["files"][0]["servers"][0]
            assert (listed["kind"], listed["wrapped"]) == ("url", True)
            assert listed["target"].startswith("http://***@127.0.0.1:")

            argv = [wrapped["command"], *wrapped["args"]]
            async with raw_proxy(argv, {**proxy_env(), **wrapped["env"]}) as session:
                await handshake(session)
                answer = await session.request(2, "tools/list")
                cmdline = Path(f"/proc/{session.process.pid}/cmdline")
                if cmdline.exists():
                    for secret in (password, query_key):
                        assert secret.encode() not in cmdline.read_bytes()
                await session.close_stdin()
                await session.wait()
                log = session.stderr()
            requests = recorded()
            assert answer["result"] == {"method": "tools/list"}, answer
            basic = "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()
            assert {request["headers"].get("authorization") for request in requests} == {basic}
            assert {request["headers"].get("x-team") for request in requests} == {"blue"}
            assert password not in log
            assert query_key not in log

            clients("unwrap", "remote")
            assert json.loads(config.read_text())["mcpServers"]["remote"] == entry

    anyio.run(scenario)
