"""`mcp-backfill clients` on awkward files: comments between kept members, duplicate keys, Codex's
dotted TOML keys, symbolic links, a planted temporary file, a failure on the second of two files, a
proxy command of another name, a command the user pointed elsewhere, a byte order mark. The real
command, in a process, on files in a scratch home (the client review's findings: each test failed
before its fix)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.harness import proxy_env, run_clients


class Home:
    def __init__(self, root: Path, rel: str = ".cursor/mcp.json", client: str = "cursor") -> None:
        self.root = root
        self.home = root / "home"
        self.project = root / "project"
        self.project.mkdir(parents=True, exist_ok=True)
        self.bin = root / "bin"
        self.bin.mkdir(exist_ok=True)
        for name in ("python3", "weather-server"):
            exe = self.bin / name
            exe.write_text("#!/bin/sh\nexit 0\n")
            exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        self.path = self.home / rel
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.client = client
        self.key_file = root / "key"
        self.key_file.write_text("sk-test\n")

    def write(self, data: str | bytes) -> None:
        self.path.write_bytes(data.encode() if isinstance(data, str) else data)

    def read(self) -> str:
        return self.path.read_bytes().decode()

    def run(self, action: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = proxy_env(PATH=f"{self.bin}{os.pathsep}/usr/bin:/bin")
        return run_clients(
            action, *args, home=self.home, project=self.project, os_name="linux", client=self.client, env=env
        )


COMMENTED = """{
  "mcpServers": {
    "weather": {
      "command": "python3", // keep: the system interpreter, not the venv one
      "env": {"CITY": "Paris"}
    }
  }
}
"""


def test_comment_between_kept_members_survives_wrap(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.write(COMMENTED)
    run = home.run("wrap", "weather", "--key-file", str(home.key_file))
    assert run.returncode == 0, run.stderr
    assert "// keep: the system interpreter" in home.read(), home.read()


def test_wrap_then_unwrap_gives_back_the_bytes(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.write(COMMENTED)
    assert home.run("wrap", "weather", "--key-file", str(home.key_file)).returncode == 0
    run = home.run("unwrap", "weather")
    assert run.returncode == 0, run.stderr
    assert home.read() == COMMENTED


DUPLICATED = """{
  "editor.fontSize": 12,
  "editor.fontSize": 14,
  "mcpServers": {
    "weather": {"command": "python3", "args": ["server.py"]}
  }
}
"""


def test_wrap_does_not_drop_a_duplicate_member(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.write(DUPLICATED)
    run = home.run("wrap", "weather", "--key-file", str(home.key_file))
    # Either refuse the file (nothing written) or keep both members; never drop one silently.
    if run.returncode == 0:
        assert home.read().count('"editor.fontSize"') == 2, home.read()
    else:
        assert home.read() == DUPLICATED


CONFIG = '{\n  "mcpServers": {\n    "weather": {"command": "python3", "args": ["server.py"]}\n  }\n}\n'


def test_symlinked_config_stays_a_symlink(tmp_path: Path) -> None:
    """Dotfile managers (stow, home-manager, chezmoi symlink mode) keep configs as symlinks: `wrap`
    must write through the link, not replace the link with a regular file."""
    home = Home(tmp_path)
    dotfiles = tmp_path / "dotfiles" / "mcp.json"
    dotfiles.parent.mkdir()
    dotfiles.write_text(CONFIG)
    home.path.symlink_to(dotfiles)
    run = home.run("wrap", "weather", "--key-file", str(home.key_file))
    assert run.returncode == 0, run.stderr
    assert home.path.is_symlink(), "the symlink was replaced by a regular file"
    assert "mcp-backfill" in dotfiles.read_text(), "the real config (link target) was not changed"


def test_predictable_temp_name_is_not_followed(tmp_path: Path) -> None:
    """A project checkout can carry `.vscode/.mcp.json.mcp-backfill-tmp` as a symlink; the temporary
    file is opened by a fixed name without O_EXCL/O_NOFOLLOW, so wrap writes through that link into
    any file the user owns (here a stand-in for ~/.bashrc)."""
    home = Home(tmp_path)
    home.write('{"mcpServers": {}}\n')  # user file (unrelated)
    victim = tmp_path / "home" / ".bashrc"
    victim.write_text("export IMPORTANT=1\n")
    project_config = home.project / ".cursor" / "mcp.json"
    project_config.parent.mkdir(parents=True)
    project_config.write_text(CONFIG)
    (project_config.parent / ".mcp.json.mcp-backfill-tmp").symlink_to(victim)
    run = home.run("wrap", "weather", "--key-file", str(home.key_file))
    assert run.returncode == 0, run.stderr
    assert victim.read_text() == "export IMPORTANT=1\n", f"victim overwritten: {victim.read_text()[:80]!r}"


def test_failure_on_second_file_leaves_first_unchanged(tmp_path: Path) -> None:
    """'All or nothing': the second file cannot be written (here: its command, moved into the
    rewritten args, holds a lone surrogate escape, which cannot be encoded as UTF-8; a read-only
    directory or a full disk do the same for a non-root user), but the first file has already been
    replaced by then."""
    home = Home(tmp_path)
    home.write(CONFIG)  # user file, written first
    user_before = home.read()
    project_config = home.project / ".cursor" / "mcp.json"
    project_config.parent.mkdir(parents=True)
    project_config.write_text(
        '{"théme": 1, "mcpServers": {"weather": {"command": "python3\\udc80", "args": ["x"]}}}\n',
        encoding="utf-8",
    )
    project_before = project_config.read_bytes()
    run = home.run("wrap", "weather", "--key-file", str(home.key_file))
    assert run.returncode != 0
    assert project_config.read_bytes() == project_before
    assert home.read() == user_before, "first file changed although the command failed"
    leftovers = [p.name for p in project_config.parent.iterdir() if p.name != "mcp.json"]
    assert leftovers == [], leftovers


CASES = {
    "dotted-in-servers-table": '[mcp_servers]\nweather.command = "python3"\nweather.args = ["server.py"]\n',
    "dotted-from-root": 'mcp_servers.weather.command = "python3"\n\n[other]\na = 1\n',
    "dotted-env": '[mcp_servers.weather]\ncommand = "python3"\nenv.CITY = "Paris"\n',
}


@pytest.mark.parametrize("name", list(CASES))
def test_wrap_then_unwrap_dotted_keys(tmp_path: Path, name: str) -> None:
    home = Home(tmp_path, ".codex/config.toml", "codex")
    original = CASES[name]
    home.write(original)
    wrapped = home.run("wrap", "weather", "--key-file", str(home.key_file))
    assert wrapped.returncode == 0, wrapped.stderr[-600:]
    assert "Traceback" not in wrapped.stderr
    unwrapped = home.run("unwrap", "weather")
    assert unwrapped.returncode == 0, unwrapped.stderr[-600:]
    assert "Traceback" not in unwrapped.stderr
    assert tomllib.loads(home.read()) == tomllib.loads(original)


def test_wrap_with_proxy_command_of_another_name_can_be_undone(tmp_path: Path) -> None:
    """`--proxy-command PATH` accepts any executable (e.g. a pinned copy `mcp-backfill-0.4`, or a
    `.cmd`/`.bat` shim on Windows), but `is_wrapped` recognises only a file named `mcp-backfill`:
    `list` says not wrapped, a second wrap double-wraps, and unwrap silently does nothing."""
    home = Home(tmp_path)
    home.write('{"mcpServers": {"weather": {"command": "python3", "args": ["server.py"]}}}\n')
    original = home.read()
    pinned = tmp_path / "bin" / "mcp-backfill-0.4"
    pinned.write_text("#!/bin/sh\n")
    pinned.chmod(pinned.stat().st_mode | stat.S_IXUSR)
    run = home.run("wrap", "weather", "--key-file", str(home.key_file), "--proxy-command", str(pinned))
    if run.returncode != 0:  # refusing such a proxy command up front is a fix too
        assert home.read() == original
        return
    assert str(pinned) in home.read()
    listing = json.loads(home.run("list", "--json").stdout)
    assert listing["files"][0]["servers"][0]["wrapped"], "list says the wrapped server is not wrapped"
    run = home.run("unwrap", "weather")
    assert run.returncode == 0, run.stderr
    assert home.read() == original, "unwrap did not restore the entry"


def test_unwrap_keeps_a_command_the_user_repointed(tmp_path: Path) -> None:
    """After wrap, the user points the server at another interpreter with the same base name
    (a venv's python3). Docs: the command goes back to the bare name 'unless you have since pointed
    it at a different program'. unwrap compares base names only and writes bare `python3` back, so the
    server silently runs on the system interpreter again."""
    home = Home(tmp_path)
    home.write('{"mcpServers": {"weather": {"command": "python3", "args": ["server.py"]}}}\n')
    assert home.run("wrap", "weather", "--key-file", str(home.key_file)).returncode == 0
    wrapped = json.loads(home.read())
    args = wrapped["mcpServers"]["weather"]["args"]
    venv_python = "/home/me/weather/.venv/bin/python3"
    args[args.index("--") + 1] = venv_python  # the user's hand edit
    home.write(json.dumps(wrapped))
    run = home.run("unwrap", "weather")
    assert run.returncode == 0, run.stderr
    assert json.loads(home.read())["mcpServers"]["weather"]["command"] == venv_python


WITH_BOM = (
    '\ufeff{\n  "mcpServers": {\n    "weather": {"command": "python3", "args": ["caf\\u00e9"]}\n  }\n}\n'
)


def test_bom_file_round_trips(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.write(WITH_BOM)
    assert home.run("wrap", "weather", "--key-file", str(home.key_file)).returncode == 0
    assert home.run("unwrap", "weather").returncode == 0
    assert home.read() == WITH_BOM


@pytest.mark.parametrize("action", ["list", "wrap"])
def test_a_deeply_nested_config_is_refused_by_its_position(tmp_path: Path, action: str) -> None:
    """A cloned project's config nested 100,000 levels deep ended the command with a RecursionError
    traceback; it is refused like any other malformed file, naming where, with nothing written."""
    home = Home(tmp_path)
    nested = "[" * 100_000 + "]" * 100_000
    deep = '{"mcpServers": {"weather": {"command": "python3", "args": ' + nested + "}}}\n"
    home.write(deep)
    run = home.run(action, *(["weather", "--key-file", str(home.key_file)] if action == "wrap" else []))
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "RecursionError" not in run.stderr
    assert run.returncode != 0
    assert f"{home.path}: line 1, column " in run.stderr
    assert "nested more than" in run.stderr
    assert home.read() == deep


def test_a_config_too_large_to_be_one_is_refused_unread(tmp_path: Path) -> None:
    """A cloned project's `.mcp.json` can be gigabytes of zeros (git stores them in kilobytes): it was
    read whole, twice over (1 GB took 2.1 GB), before being refused; now it is refused by its size."""
    home = Home(tmp_path)
    with home.path.open("wb") as file:
        file.truncate(300 * 1024 * 1024)  # sparse: nothing written
    run = home.run("list")
    assert run.returncode != 0
    assert f"{home.path}: larger than 256 MiB, too large to be a client's config" in run.stderr
