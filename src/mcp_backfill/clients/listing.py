"""`mcp-backfill clients list`: each config file found, its servers, and which are wrapped.

A table for people, or JSON (`--json`) for scripts and tests. No credential is shown (`masking`):
not a URL's user information or query (some servers take their key there), not the value of a
server's `--api-key`-like option.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from mcp_backfill.clients.documents import Document
from mcp_backfill.clients.entries import describe
from mcp_backfill.clients.masking import printable, shown_args, shown_url

__all__ = ["at", "write_listing"]


def at(value: Any, path: tuple[str, ...]) -> Any:
    """The value at a key path."""
    for key in path:
        value = value[key]
    return value


def write_listing(documents: list[Document], problems: list[str], as_json: bool, out: TextIO) -> None:
    report: list[dict[str, Any]] = []
    for document in documents:
        location = document.location
        for table in document.tables() or [()]:
            if len(table) > 1 and not at(document.value, table):
                continue  # Claude Code keeps an empty server table for every project it has opened
            servers = []
            for name, entry in (at(document.value, table) if table else {}).items():
                summary = describe(entry, location.client.dialect)
                if summary.kind == "url":
                    target = shown_url(summary.target[0])
                else:
                    target = " ".join(shown_args(list(summary.target)))
                servers.append(
                    {"name": name, "kind": summary.kind, "wrapped": summary.wrapped, "target": target}
                )
            report.append(
                {
                    "client": location.client.name,
                    "scope": location.scope,
                    "path": str(location.path),
                    "table": list(table),
                    "servers": servers,
                }
            )
    if as_json:
        out.write(json.dumps({"files": report, "errors": problems}, indent=2) + "\n")
        return
    if not report and not problems:
        out.write("no client config found\n")
    for entry in report:  # (JSON escapes control characters; here `printable` does)
        where = printable(" ".join(entry["table"][:-1])) if len(entry["table"]) > 1 else ""
        path = printable(entry["path"])
        out.write(f"{entry['client']} ({entry['scope']}{': ' + where if where else ''}): {path}\n")
        if not entry["servers"]:
            out.write("  (no servers)\n")
        names = [printable(server["name"]) for server in entry["servers"]]
        width = max((len(name) for name in names), default=0)
        for name, server in zip(names, entry["servers"], strict=True):
            state = "wrapped" if server["wrapped"] else "not wrapped"
            target = printable(server["target"])
            out.write(f"  {name:<{width}}  {server['kind']:<7} {state:<11}  {target}\n")
