"""The directories client configs live under, for Linux, macOS and Windows.

Derived from a home directory and the usual variables (APPDATA, XDG_CONFIG_HOME, CODEX_HOME), so
that `--home` and `--os` can point the whole search at a temporary directory laid out like any of
the three systems; with `--home`, the variables are not consulted and everything is under it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

__all__ = ["OS_NAMES", "Layout", "OsName", "current_os", "layout"]

OsName = Literal["linux", "macos", "windows"]
OS_NAMES: tuple[OsName, ...] = get_args(OsName)


def current_os() -> OsName:
    if sys.platform == "win32":
        return "windows"
    if sys.platform == "darwin":
        return "macos"
    return "linux"


@dataclass(frozen=True)
class Layout:
    """Where things are on one machine: the home directory, the per-user application data
    directory (APPDATA on Windows, ~/Library/Application Support on macOS, XDG_CONFIG_HOME on
    Linux) and Codex's home."""

    os: OsName
    home: Path
    app_data: Path
    codex_home: Path


def layout(os_name: OsName, home: Path | None, environ: Mapping[str, str]) -> Layout:
    """The layout of `os_name` for `home` (default: the user's: HOME; USERPROFILE first on Windows)."""
    explicit = home is not None
    if home is None:
        names = ("USERPROFILE", "HOME") if os_name == "windows" else ("HOME",)
        found = next((environ[name] for name in names if environ.get(name)), None)
        home = Path(found or os.path.expanduser("~"))

    def variable(name: str) -> Path | None:
        value = None if explicit else environ.get(name)
        return Path(value) if value else None

    if os_name == "windows":
        app_data = variable("APPDATA") or home / "AppData" / "Roaming"
    elif os_name == "macos":
        app_data = home / "Library" / "Application Support"
    else:
        app_data = variable("XDG_CONFIG_HOME") or home / ".config"
    codex_home = variable("CODEX_HOME") or home / ".codex"
    return Layout(os_name, home, app_data, codex_home)
