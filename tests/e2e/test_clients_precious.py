"""`mcp-backfill clients` with a user's precious files and secrets: what `list` and `--dry-run`
print hides credentials, and a change keeps the file's owner, private backups, comments inside the
arguments. The real command, in a process, on files in a scratch home (each test failed before its
fix)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.e2e.test_clients_edges import CONFIG, Home
from tests.harness import proxy_env

SECRETS = ("ghp_SECRET1", "SECRET2", "ghp_SECRET3", "sk-ant-SECRET4", "SECRET5", "SECRET6", "SECRET7")
WITH_SECRETS = """{
  "mcpServers": {
    "gh": {
      "command": "python3",
      "args": ["-y", "server-github", "--api-key", "ghp_SECRET1", "--token=SECRET2"],
      "env": {"GITHUB_TOKEN": "ghp_SECRET3", "ANTHROPIC_API_KEY": "sk-ant-SECRET4"}
    },
    "remote": {
      "url": "https://me:SECRET5@mcp.example/mcp?key=SECRET6",
      "headers": {"Authorization": "Bearer SECRET7"}
    }
  }
}
"""


def test_list_does_not_print_credentials(tmp_path: Path) -> None:
    """`list` hid a URL's query but showed its password (`https://me:PASSWORD@host`), and showed a
    server's command line with the values of `--api-key`-like options."""
    home = Home(tmp_path)
    home.write(WITH_SECRETS)
    for args in ((), ("--json",)):
        run = home.run("list", *args)
        assert run.returncode == 0, run.stderr
        leaked = [secret for secret in SECRETS if secret in run.stdout + run.stderr]
        assert not leaked, run.stdout
        assert "server-github" in run.stdout
        assert "mcp.example/mcp" in run.stdout


def test_dry_run_does_not_print_credentials(tmp_path: Path) -> None:
    """`--dry-run` masked only the shell's ANTHROPIC_API_KEY: the diff showed the entries' own
    tokens, API keys, header values and URL passwords, on both its sides, for wrap and unwrap."""
    home = Home(tmp_path)
    home.write(WITH_SECRETS)
    run = home.run("wrap", "--all", "--key-file", str(home.key_file), "--dry-run")
    assert run.returncode == 0, run.stderr
    assert "MCP_BACKFILL_UPSTREAM_HEADERS" in run.stdout, run.stdout
    assert str(home.key_file) in run.stdout  # a path, not a secret
    leaked = [secret for secret in SECRETS if secret in run.stdout + run.stderr]
    assert not leaked, run.stdout
    assert home.read() == WITH_SECRETS
    assert home.run("wrap", "--all", "--key-file", str(home.key_file)).returncode == 0
    run = home.run("unwrap", "--all", "--dry-run")
    assert run.returncode == 0, run.stderr
    assert '"headers"' in run.stdout, run.stdout
    leaked = [secret for secret in SECRETS if secret in run.stdout + run.stderr]
    assert not leaked, run.stdout


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_change_keeps_the_files_owner(tmp_path: Path) -> None:
    """`sudo mcp-backfill clients wrap` replaced the user's 0600 config with one owned by root: the
    client, running as the user, could no longer read its own config (nor the backup)."""
    home = Home(tmp_path)
    home.write(CONFIG)
    os.chown(home.path, 4321, 4322)
    home.path.chmod(0o600)
    run = home.run("wrap", "weather", "--key-file", str(home.key_file))
    assert run.returncode == 0, run.stderr
    assert "mcp-backfill" in home.read()
    for path in home.path.parent.iterdir():
        status = path.stat()
        assert (path.name, status.st_uid, status.st_gid, status.st_mode & 0o777) == (
            path.name,
            4321,
            4322,
            0o600,
        )


COMMENTED_ARGS = """{
  "mcpServers": {
    "files": {
      "command": "python3",
      "args": [
        "-y",
        "@modelcontextprotocol/server-filesystem",
        // "/home/me/Desktop",
        "/home/me/Downloads", /* for now */
      ],
    }
  }
}
"""
COMMENTED_TOML_ARGS = """[mcp_servers.files]
command = "python3"
args = [
  "-y",
  "@modelcontextprotocol/server-filesystem",
  # "/home/me/Desktop",
  '/home/me/Downloads', # for now
]
"""


@pytest.mark.parametrize(
    ("rel", "client", "original"),
    [
        (".cursor/mcp.json", "cursor", COMMENTED_ARGS),
        (".codex/config.toml", "codex", COMMENTED_TOML_ARGS),
        (".cursor/mcp.json", "cursor", '{"mcpServers": {"files": {"command": "python3", "args": ["a",]}}}\n'),
    ],
)
def test_comments_inside_the_arguments_survive_wrap_and_unwrap(
    tmp_path: Path, rel: str, client: str, original: str
) -> None:
    """`wrap` rewrote the whole `args` array: an argument the user had commented out (a common way
    to switch one off), a comment after one, a trailing comma were gone, and `unwrap` did not bring
    them back."""
    home = Home(tmp_path, rel, client)
    home.write(original)
    run = home.run("wrap", "files", "--key-file", str(home.key_file))
    assert run.returncode == 0, run.stderr
    wrapped = home.read()
    assert "mcp-backfill" in wrapped
    for comment in ("/home/me/Desktop", "for now"):
        assert (comment in wrapped) == (comment in original), wrapped
    run = home.run("unwrap", "files")
    assert run.returncode == 0, run.stderr
    assert home.read() == original


CRLF_TOML = (
    "# Codex on Windows\r\n"
    "[mcp_servers.files]\r\n"
    'command = "python3"\r\n'
    'args = ["server.py"]\r\n'
    "\r\n"
    "[mcp_servers.remote]\r\n"
    'url = "https://mcp.example/mcp"\r\n'
    'http_headers = { "X-Team" = "blue" }\r\n'
)


def test_a_crlf_codex_config_keeps_its_line_endings(tmp_path: Path) -> None:
    """tomlkit ends the lines it adds with a bare LF: a Windows config came back with mixed line
    endings from `wrap`, and from `unwrap` of a URL entry too."""
    home = Home(tmp_path, ".codex/config.toml", "codex")
    home.write(CRLF_TOML)
    run = home.run("wrap", "--all", "--key-file", str(home.key_file))
    assert run.returncode == 0, run.stderr
    wrapped = home.path.read_bytes()
    assert b"mcp-backfill" in wrapped
    assert wrapped.count(b"\n") == wrapped.count(b"\r\n"), wrapped
    run = home.run("unwrap", "--all")
    assert run.returncode == 0, run.stderr
    unwrapped = home.path.read_bytes()
    assert unwrapped.count(b"\n") == unwrapped.count(b"\r\n"), unwrapped
    assert tomllib.loads(unwrapped.decode()) == tomllib.loads(CRLF_TOML)


def test_write_key_does_not_put_the_key_in_a_project_config(tmp_path: Path) -> None:
    """`wrap --all --write-key`, run in a repository (the project is the current directory), wrote
    the API key in plain text into its `.cursor/mcp.json` (and `.mcp.json`, `.vscode/mcp.json`),
    files made to be committed and shared."""
    home = Home(tmp_path)
    home.write(CONFIG)
    project_config = home.project / ".cursor" / "mcp.json"
    project_config.parent.mkdir(parents=True)
    project_config.write_text(CONFIG)
    key = "sk-ant-api03-" + "k" * 40
    env = proxy_env(PATH=f"{home.bin}{os.pathsep}/usr/bin:/bin", ANTHROPIC_API_KEY=key)
    place = ["--home", str(home.home), "--os", "linux", "--project", str(home.project), "--client", "cursor"]
    run = subprocess.run(
        [sys.executable, "-m", "mcp_backfill", "clients", "wrap", *place, "--all", "--write-key"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert key not in project_config.read_text()
    assert "--key-file" in run.stderr, run.stderr
    assert key in home.read()  # the user's own file, as asked


HOSTILE = (
    '{"mcpServers": {"evil\\u001b]0;owned\\u0007": {"command": "python3", "args": ["\\u001b[2Jx", 7]},\n'
    '  "fine": {"command": "python3", "args": ["\\u009b31m"]}}} // \x1b[5m blinking\n'
)


def test_control_characters_from_a_config_do_not_reach_the_terminal(tmp_path: Path) -> None:
    """A project's configs come with the repository cloned: `list`, `--dry-run` and the `skipped`
    lines printed a server name, arguments and comments as they were, terminal escape sequences
    (retitle the window, clear the screen, recolour) included."""
    home = Home(tmp_path)
    home.write(HOSTILE)
    for args in (("list",), ("wrap", "--all", "--dry-run"), ("wrap", "--all")):
        run = home.run(*args)
        assert run.returncode == 0, run.stderr
        shown = run.stdout + run.stderr
        assert "evil" in shown, shown
        assert not any(char in shown for char in "\x1b\x07\x9b"), (args, shown)


def _immutable(path: Path, on: bool) -> bool:
    flag = "+i" if on else "-i"
    try:
        return subprocess.run(["chattr", flag, str(path)], capture_output=True, timeout=10).returncode == 0
    except OSError:
        return False


def test_a_file_that_cannot_be_replaced_leaves_the_others_unchanged(tmp_path: Path) -> None:
    """All or nothing, to the last step: the second file could not be replaced (on Windows, a
    client or a virus scanner holding it open does this; here it is immutable) after the first had
    been, and the command said `no file was changed`, leaving the first changed and the second's
    temporary file behind."""
    home = Home(tmp_path)
    home.write(CONFIG)  # the user's file, replaced first
    project_config = home.project / ".cursor" / "mcp.json"
    project_config.parent.mkdir(parents=True)
    project_config.write_text(CONFIG)
    if not _immutable(project_config, True):
        pytest.skip("needs chattr (and root) to make a file that cannot be replaced")
    try:
        run = home.run("wrap", "weather", "--key-file", str(home.key_file))
    finally:
        _immutable(project_config, False)
    assert run.returncode == 1, run.stdout
    assert "no file was changed" in run.stderr, run.stderr
    assert home.read() == CONFIG, "the first file stayed changed"
    assert project_config.read_text() == CONFIG
    for directory in (home.path.parent, project_config.parent):
        assert sorted(p.name for p in directory.iterdir()) == ["mcp.json"]


def test_write_key_leaves_the_key_readable_by_its_owner_only(tmp_path: Path) -> None:
    """`wrap --write-key` wrote the API key into a user's config that other users could read (0644,
    as editors and most clients create it: Cursor's, VS Code's, Claude Desktop's): on a shared
    machine every user could read the key. The config and its backup are then its owner's only."""
    home = Home(tmp_path)
    home.write(CONFIG)
    home.path.chmod(0o644)
    key = "sk-ant-api03-" + "k" * 40
    env = proxy_env(PATH=f"{home.bin}{os.pathsep}/usr/bin:/bin", ANTHROPIC_API_KEY=key)
    place = ["--home", str(home.home), "--os", "linux", "--project", str(home.project), "--client", "cursor"]
    run = subprocess.run(
        [sys.executable, "-m", "mcp_backfill", "clients", "wrap", *place, "weather", "--write-key"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert key in home.read()
    assert home.path.stat().st_mode & 0o777 == 0o600
    assert "0600" in run.stderr, run.stderr  # the user is told why the mode changed
    # No file next to it holds the key where others can read it (the backup never held it).
    for path in home.path.parent.iterdir():
        if key in path.read_text():
            assert path.stat().st_mode & 0o077 == 0, path.name
