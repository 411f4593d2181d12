"""`mcp-backfill clients`' file handling, in process: a file a client rewrote meanwhile is not
overwritten, and the layouts follow the variables unless --home is given."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from mcp_backfill.clients import changes
from mcp_backfill.clients.catalog import CLIENTS
from mcp_backfill.clients.documents import Location, load
from mcp_backfill.clients.entries import Proxy, wrap
from mcp_backfill.clients.platforms import layout


def test_a_file_changed_since_it_was_read_is_left_alone(tmp_path: Path) -> None:
    desktop = CLIENTS[0]
    path = tmp_path / "claude_desktop_config.json"
    path.write_text('{"mcpServers": {"a": {"command": "/bin/a"}}}\n')
    document = load(Location(desktop, path, "user"))
    entry, _ = wrap(
        document.value["mcpServers"]["a"], desktop.dialect, Proxy("/opt/mcp-backfill"), lambda n: None
    )
    change = changes.Change(document, ("mcpServers",), "a", entry)
    path.write_text('{"mcpServers": {"a": {"command": "/bin/a"}}, "written": "by the client"}\n')
    with pytest.raises(changes.Changed):
        changes.apply_changes([change], False, {}, io.StringIO())
    assert "by the client" in path.read_text()
    assert list(tmp_path.iterdir()) == [path]  # no backup either


def test_home_overrides_the_variables(tmp_path: Path) -> None:
    environ = {"HOME": "/home/me", "APPDATA": "C:/Users/me/AppData/Roaming", "XDG_CONFIG_HOME": "/xdg"}
    assert layout("windows", None, environ).app_data == Path("C:/Users/me/AppData/Roaming")
    assert layout("linux", None, environ).app_data == Path("/xdg")
    assert layout("macos", None, environ).app_data == Path("/home/me/Library/Application Support")
    assert layout("windows", tmp_path, environ).app_data == tmp_path / "AppData" / "Roaming"
    assert layout("linux", tmp_path, environ).app_data == tmp_path / ".config"
    assert layout("linux", None, {"HOME": "/home/me", "CODEX_HOME": "/codex"}).codex_home == Path("/codex")


def test_windows_home_is_the_user_profile() -> None:
    environ = {"HOME": "/c/Users/me", "USERPROFILE": "C:/Users/me"}
    assert layout("windows", None, environ).home == Path("C:/Users/me")
    assert layout("linux", None, environ).home == Path("/c/Users/me")


def test_a_new_config_is_never_readable_by_more_people_than_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary file with the new text was created with the umask's mode (0644) and only then
    given the config's: a 0600 `~/.claude.json` (or a config holding the API key) was readable by
    everyone for a moment."""
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {}}\n')
    config.chmod(0o600)
    modes: list[int] = []
    copymode = shutil.copymode

    def noting(source: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        modes.append(os.stat(target).st_mode & 0o777)
        return copymode(source, target, *args, **kwargs)

    monkeypatch.setattr(shutil, "copymode", noting)
    previous = os.umask(0o022)
    try:
        _, temporary, backup = changes._stage(config, '{"mcpServers": {"x": {}}}\n')
    finally:
        os.umask(previous)
    assert modes == [0o600]
    assert (temporary.stat().st_mode & 0o777, backup.stat().st_mode & 0o777) == (0o600, 0o600)


def test_a_backup_is_never_readable_by_more_people_than_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backup was made with `shutil.copy2`: created with the umask's mode (0644), filled with the
    config (a 0600 `~/.claude.json`, or one holding keys), and only then given the config's mode."""
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {}, "primaryApiKey": "sk-ant-secret"}\n')
    config.chmod(0o600)
    seen: list[tuple[str, int, int]] = []
    chmod = os.chmod

    def noting(target: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(target, (str, Path)) and changes.BACKUP_SUFFIX in str(target):
            status = os.stat(target)
            seen.append((str(target), status.st_mode & 0o777, status.st_size))
        return chmod(target, *args, **kwargs)

    monkeypatch.setattr(os, "chmod", noting)
    previous = os.umask(0o022)
    try:
        _, temporary, backup = changes._stage(config, '{"mcpServers": {"x": {}}}\n')
    finally:
        os.umask(previous)
    exposed = [(name, oct(mode)) for name, mode, size in seen if size and mode & 0o077]
    assert exposed == []
    assert backup.read_bytes() == config.read_bytes()
    assert backup.stat().st_mode & 0o777 == 0o600
    temporary.unlink()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name a descriptor's file")
def test_the_new_text_is_on_disk_before_it_replaces_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary file was moved over the config without an fsync: a crash (or power loss) soon
    after could leave an empty or partial config in place of the old one, which is gone."""
    desktop = CLIENTS[0]
    path = tmp_path / "claude_desktop_config.json"
    path.write_text('{"mcpServers": {"a": {"command": "/bin/a"}}}\n')
    document = load(Location(desktop, path, "user"))
    entry, _ = wrap(
        document.value["mcpServers"]["a"], desktop.dialect, Proxy("/opt/mcp-backfill"), lambda n: None
    )
    synced: set[str] = set()
    replaced: list[tuple[str, bool]] = []
    fsync, replace = os.fsync, os.replace

    def noting_fsync(descriptor: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{descriptor}"))
        fsync(descriptor)

    def noting_replace(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        replaced.append((str(source), str(source) in synced))
        replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", noting_fsync)
    monkeypatch.setattr(os, "replace", noting_replace)
    changes.apply_changes([changes.Change(document, ("mcpServers",), "a", entry)], False, {}, io.StringIO())
    assert "mcp-backfill" in path.read_text()
    assert len(replaced) == 1
    assert replaced[0][1], f"{replaced[0][0]} was not synced to disk before it replaced the config"


def test_a_file_changed_while_the_new_one_is_staged_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file was compared with what was read only before the backup and the new text were
    written (and synced) beside it: a client that rewrote it in that time lost its change."""
    desktop = CLIENTS[0]
    path = tmp_path / "claude_desktop_config.json"
    path.write_text('{"mcpServers": {"a": {"command": "/bin/a"}}}\n')
    document = load(Location(desktop, path, "user"))
    entry, _ = wrap(
        document.value["mcpServers"]["a"], desktop.dialect, Proxy("/opt/mcp-backfill"), lambda n: None
    )
    mkstemp = tempfile.mkstemp

    def client_writes_meanwhile(*args: Any, **kwargs: Any) -> Any:
        path.write_text('{"mcpServers": {"a": {"command": "/bin/a"}}, "written": "by the client"}\n')
        return mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", client_writes_meanwhile)
    with pytest.raises(changes.Changed):
        changes.apply_changes(
            [changes.Change(document, ("mcpServers",), "a", entry)], False, {}, io.StringIO()
        )
    assert "by the client" in path.read_text()
    assert list(tmp_path.iterdir()) == [path]  # no backup, no temporary file either
