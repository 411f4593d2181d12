"""Codex's config.toml, read and rewritten through tomlkit, which keeps comments and layout.

The same contract as `jsonc_edit.rewrite`: the text changed so that it holds `new`, with members
that did not change left alone, changed ones replaced in place and new ones inserted after the
member that precedes them in `new` (so undoing a change restores the order), and the file's line
endings. tomlkit is imported here only, on first use: the proxy never pays for it.
"""

from __future__ import annotations

import re
from typing import Any

from mcp_backfill.clients.jsonc import ParseError
from mcp_backfill.clients.jsonc_edit import same

__all__ = ["load", "rewrite"]


def load(text: str) -> Any:
    """The TOML document as plain values; `ParseError` (line, column) when it is not TOML."""
    return _parse(text).unwrap()


def rewrite(text: str, new: Any) -> str:
    import tomlkit

    document = _parse(text)
    _apply(document, document.unwrap(), new)
    rewritten = tomlkit.dumps(document)
    if "\r\n" in text and "\n" not in text.replace("\r\n", ""):
        # A CRLF file (Windows) stays one: tomlkit ends the lines it adds with a bare LF. Only lines
        # end that way (a new string's newline is written as the escape `\n`).
        rewritten = re.sub(r"(?<!\r)\n", "\r\n", rewritten)
    return rewritten


def _parse(text: str) -> Any:
    import tomlkit
    from tomlkit.exceptions import ParseError as TomlError

    try:
        return tomlkit.parse(text)
    except TomlError as exc:
        message = str(exc).split(" at line ")[0]
        raise ParseError(message, exc.line, exc.col) from None


def _body(table: Any) -> Any:
    """The container that holds a table's members (a document is its own)."""
    from tomlkit.container import Container

    return table if isinstance(table, Container) else table.value


def _inline(value: Any) -> Any:
    """A new value as an item that stays where it is put: a table is written inline (a `[table]`
    header in the middle of one would take the members after it)."""
    import tomlkit

    if isinstance(value, dict):
        table = tomlkit.inline_table()
        table.update(value)
        return table
    return tomlkit.item(value)


def _apply(table: Any, old: dict[str, Any], new: dict[str, Any]) -> None:
    from tomlkit.items import InlineTable

    for key in old:
        if key not in new:
            del table[key]
    previous: str | None = None
    for key, value in new.items():
        if key in old:
            if not same(old[key], value):
                current = table[key]
                if (
                    isinstance(old[key], dict)
                    and isinstance(value, dict)
                    and hasattr(current, "value")
                    and not _dotted(current)
                ):
                    _apply(current, old[key], value)
                elif not _edit_array(current, old[key], value):
                    table[key] = _inline(value)
        elif isinstance(table, InlineTable):
            table[key] = value
        else:
            item = _inline(value)
            if previous is None and not _body(table):
                table[key] = item
            elif previous is None:
                _body(table)._insert_at(0, key, item)
            else:
                _body(table)._insert_after(previous, key, item)
        previous = key


def _edit_array(array: Any, old: Any, new: Any) -> bool:
    """Changes a multi-line array in place when its last items stay (`wrap` puts the proxy's
    arguments before a server's, `unwrap` takes them away): those keep their comments. False when
    it is not such an array (a one-line array, which holds no comment, is written anew)."""
    from tomlkit.items import Array

    if not (isinstance(array, Array) and isinstance(old, list) and isinstance(new, list)):
        return False
    if "\n" not in array.as_string():
        return False
    kept = 0
    while kept < min(len(old), len(new)) and same(old[-1 - kept], new[-1 - kept]):
        kept += 1
    if not kept:
        return False
    for _ in range(len(old) - kept):
        del array[0]
    for index, item in enumerate(new[: len(new) - kept]):
        array.insert(index, _inline(item))
    return True


def _dotted(item: Any) -> bool:
    """Whether a table holds dotted keys (`a.b = 1`): tomlkit cannot insert into or delete from
    those in place, so such a table is replaced whole."""
    from tomlkit.items import Table

    return isinstance(item, Table) and any(key is not None and key.is_dotted() for key, _ in item.value.body)
