"""The clients that cannot sample, where each keeps its MCP servers, and how it spells them.

Locations, per the clients' own documentation (see docs/clients-command.md for the sources and what
is uncertain): user-level files under the layout's directories, project-level files under the
project directory. `Dialect` is how a client writes a remote (URL) server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mcp_backfill.clients.platforms import Layout

__all__ = ["CLIENTS", "Client", "Dialect", "Format", "client_names"]

Format = Literal["json", "toml"]
KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class Dialect:
    """How a client writes a remote server: the keys that hold a streamable-HTTP URL, those that
    hold a legacy SSE URL (the proxy cannot reach those), the headers key, and keys that make an
    entry unwrappable (headers taken from the client's environment, which the wrapper cannot copy)."""

    url_keys: tuple[str, ...] = ("url",)
    sse_url_keys: tuple[str, ...] = ()
    headers_key: str = "headers"
    unsupported_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Client:
    name: str
    label: str
    format: Format
    servers_key: str
    user_files: Callable[[Layout], list[Path]]
    project_files: Callable[[Path], list[Path]]
    dialect: Dialect = Dialect()

    def tables(self, document: Any) -> list[KeyPath]:
        """The key paths of the server tables in a parsed file of this client."""
        if not isinstance(document, dict):
            return []
        paths: list[KeyPath] = []
        if isinstance(document.get(self.servers_key), dict):
            paths.append((self.servers_key,))
        if self.name == "claude-code" and isinstance(document.get("projects"), dict):
            # ~/.claude.json keeps each project's "local"-scope servers under projects[<path>].
            for project, settings in document["projects"].items():
                if isinstance(settings, dict) and isinstance(settings.get(self.servers_key), dict):
                    paths.append(("projects", project, self.servers_key))
        return paths


def _desktop(layout: Layout) -> list[Path]:
    # Linux has no official Claude Desktop; community builds use ~/.config/Claude like the others.
    return [layout.app_data / "Claude" / "claude_desktop_config.json"]


def _vscode(layout: Layout) -> list[Path]:
    return [layout.app_data / "Code" / "User" / "mcp.json"]


CLIENTS: tuple[Client, ...] = (
    Client("claude-desktop", "Claude Desktop", "json", "mcpServers", _desktop, lambda project: []),
    Client(
        "claude-code",
        "Claude Code",
        "json",
        "mcpServers",
        lambda layout: [layout.home / ".claude.json"],
        lambda project: [project / ".mcp.json"],
    ),
    Client(
        "cursor",
        "Cursor",
        "json",
        "mcpServers",
        lambda layout: [layout.home / ".cursor" / "mcp.json"],
        lambda project: [project / ".cursor" / "mcp.json"],
    ),
    Client(
        "vscode", "VS Code", "json", "servers", _vscode, lambda project: [project / ".vscode" / "mcp.json"]
    ),
    Client(
        "windsurf",
        "Windsurf",
        "json",
        "mcpServers",
        lambda layout: [layout.home / ".codeium" / "windsurf" / "mcp_config.json"],
        lambda project: [],
        Dialect(url_keys=("serverUrl", "url")),
    ),
    Client(
        "gemini",
        "Gemini CLI",
        "json",
        "mcpServers",
        lambda layout: [layout.home / ".gemini" / "settings.json"],
        lambda project: [project / ".gemini" / "settings.json"],
        Dialect(url_keys=("httpUrl",), sse_url_keys=("url",)),
    ),
    Client(
        "codex",
        "Codex",
        "toml",
        "mcp_servers",
        lambda layout: [layout.codex_home / "config.toml"],
        lambda project: [project / ".codex" / "config.toml"],
        Dialect(headers_key="http_headers", unsupported_keys=("bearer_token_env_var", "env_http_headers")),
    ),
)


def client_names() -> tuple[str, ...]:
    return tuple(client.name for client in CLIENTS)
