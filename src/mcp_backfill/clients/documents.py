"""One client config file on disk: found, parsed, and rendered back after a change.

Files are read and written as bytes decoded as UTF-8, so line endings (CRLF on Windows) and a byte
order mark stay as they were. A file that does not parse is `Malformed`, with its path and the line
and column of the problem; nothing is ever written to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_backfill.clients import jsonc, jsonc_edit, toml_file
from mcp_backfill.clients.catalog import CLIENTS, Client, KeyPath
from mcp_backfill.clients.platforms import Layout

__all__ = ["Document", "Location", "Malformed", "discover", "load"]


class Malformed(Exception):
    """A config file that cannot be read as its format; the message names the file and position."""


@dataclass(frozen=True)
class Location:
    client: Client
    path: Path
    scope: str  # "user" or "project"


@dataclass
class Document:
    location: Location
    text: str
    value: Any

    def tables(self) -> list[KeyPath]:
        return self.location.client.tables(self.value)

    def render(self, new: Any) -> str:
        """This file's text changed to hold `new`, everything else as it was."""
        if self.location.client.format == "toml":
            return toml_file.rewrite(self.text, new)
        return jsonc_edit.rewrite(self.text, new)


def discover(layout: Layout, project: Path, names: tuple[str, ...] = ()) -> list[Location]:
    """The config files that exist, of the clients named (all when none are), user files first."""
    found: list[Location] = []
    seen: set[Path] = set()
    for client in CLIENTS:
        if names and client.name not in names:
            continue
        candidates = [(path, "user") for path in client.user_files(layout)]
        candidates += [(path, "project") for path in client.project_files(project)]
        for path, scope in candidates:
            key = path.absolute()
            if key not in seen and path.is_file():
                seen.add(key)
                found.append(Location(client, path, scope))
    return found


MAX_CONFIG_BYTES = 256 * 1024 * 1024
"""The largest config read (Claude Code's `~/.claude.json`, which keeps history, is the largest
known; megabytes). A cloned project's `.mcp.json` can be gigabytes of zeros that git stores in
kilobytes: it was read whole, and decoded, before being refused."""


def load(location: Location) -> Document:
    path = location.path
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise Malformed(f"{path}: larger than 256 MiB, too large to be a client's config")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Malformed(f"{path}: cannot read it ({exc})") from None
    if not text.strip():
        return Document(location, text, {})
    try:
        value = toml_file.load(text) if location.client.format == "toml" else jsonc.parse(text).value
    except jsonc.ParseError as exc:
        raise Malformed(f"{path}: line {exc.line}, column {exc.column}: {exc.reason}") from None
    if not isinstance(value, dict):
        raise Malformed(f"{path}: line 1, column 1: the top level is not an object")
    return Document(location, text, value)
