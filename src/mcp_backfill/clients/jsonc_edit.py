"""Rewrite a JSON(C) text into a new value while keeping everything that did not change.

A user's config is theirs: its comments, key order, indentation and line endings must survive a
wrap. So the new text is built from the old one: a value equal to the old is copied verbatim, an
object is rebuilt member by member (kept members keep their text, separators and comments), and
only new or changed leaves are written, in the style of what they replace (inline or one item per
line, the file's indentation unit and line ending). Undoing a change the same way gives the old text
back, which is what lets `unwrap` restore a file byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_backfill.clients.jsonc import Node, parse

__all__ = ["rewrite", "same"]


def same(left: Any, right: Any) -> bool:
    """Equal as JSON: `1` is not `true`, and key order counts (it is part of the text)."""
    if isinstance(left, dict) and isinstance(right, dict):
        return list(left) == list(right) and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right, strict=True))
    return type(left) is type(right) and left == right


def rewrite(text: str, new: Any) -> str:
    """`text` (JSONC) changed so that it parses to `new`."""
    root = parse(text)
    editor = _Editor(text)
    start = text[: root.start]
    return start + editor.render(root, new, editor.line_indent(root.start)) + text[root.end :]


class _Editor:
    def __init__(self, text: str) -> None:
        self.text = text
        self.eol = "\r\n" if "\r\n" in text else "\n"
        self.unit = _indent_unit(text)
        self.inline_arrays = _prefers_inline_arrays(parse(text), text)
        # A file with \u escapes and no raw non-ASCII character escapes what it writes too.
        self.ascii = text.removeprefix("\ufeff").isascii() and "\\u" in text  # a byte order mark is not text

    # -- positions -------------------------------------------------------------------------------

    def line_indent(self, offset: int) -> str:
        """The whitespace that starts the line `offset` is on."""
        line_start = self.text.rfind("\n", 0, offset) + 1
        end = line_start
        while end < len(self.text) and self.text[end] in " \t":
            end += 1
        return self.text[line_start:end]

    def starts_line(self, offset: int) -> bool:
        line_start = self.text.rfind("\n", 0, offset) + 1
        return not self.text[line_start:offset].strip()

    def multiline(self, node: Node) -> bool:
        return "\n" in self.text[node.start : node.end]

    # -- rendering -------------------------------------------------------------------------------

    def render(self, node: Node, new: Any, indent: str, flat: bool = False) -> str:
        """The text for `node` once its value is `new`; `indent` is its line's indentation, `flat`
        says its container is written on one line (so a new object there is too)."""
        if same(node.value, new):
            return self.text[node.start : node.end]
        if node.kind == "object" and isinstance(new, dict) and node.members and new:
            return self._object(node, new, indent)
        if node.kind == "array" and isinstance(new, list) and node.items and new:
            kept = self._array(node, new, indent)
            if kept is not None:
                return kept
        return self.serialize(new, indent, node, flat)

    def _array(self, node: Node, new: list[Any], indent: str) -> str | None:
        """An array whose last items stay (`wrap` puts the proxy's arguments before a server's,
        `unwrap` takes them away again): those keep their text, comments between them and a
        trailing comma included; only the items before them are written. None if no item stays."""
        text, items = self.text, node.items
        kept = 0
        while kept < min(len(items), len(new)) and same(items[-1 - kept].value, new[-1 - kept]):
            kept += 1
        if not kept:
            return None
        first = items[0]
        on_lines = self.starts_line(first.start)
        inner = self.line_indent(first.start) if on_lines else indent + self.unit
        separator = "," + (self.eol + inner if on_lines else " ")
        if len(items) > 1 and text[first.end : items[1].start].strip() == ",":
            separator = text[first.end : items[1].start]
        added = [
            self.serialize(item, inner, None, not on_lines) + separator for item in new[: len(new) - kept]
        ]
        return (
            text[node.start : first.start] + "".join(added) + text[items[len(items) - kept].start : node.end]
        )

    def _object(self, node: Node, new: dict[str, Any], indent: str) -> str:
        text = self.text
        old = {member.key: index for index, member in enumerate(node.members)}
        first = node.members[0]
        multiline = self.starts_line(first.start)
        inner = self.line_indent(first.start) if multiline else indent
        separator = "," + (self.eol + inner if multiline else " ")
        colon = text[first.key_end : first.value.start]
        if colon.strip() != ":":
            colon = ": "
        parts = ["{", text[node.start + 1 : first.start]]
        # A new member takes the place (separator) and shape of a removed one of the same kind:
        # `url` -> `command`, `headers` -> `env`, and back again on undo.
        removed = [index for index, member in enumerate(node.members) if member.key not in new]
        previous: int | None = None
        used: set[int] = set()
        for position, (key, value) in enumerate(new.items()):
            index = old.get(key)
            like = None
            if index is None:
                index = next((i for i in removed if node.members[i].value.kind == _kind(value)), None)
                if index is not None:
                    removed.remove(index)
                    like = node.members[index].value
            if position:
                # The text after the member written last (its comma and any comment on its line)
                # goes after it, once, whatever follows; only then the generic separator.
                if previous is not None and previous + 1 < len(node.members) and previous not in used:
                    used.add(previous)
                    parts.append(text[node.members[previous].value.end : node.members[previous + 1].start])
                else:
                    parts.append(separator)
            if key not in old:
                new_text = self.serialize(value, inner, like, not multiline)
                parts.append(json.dumps(key, ensure_ascii=self.ascii) + colon + new_text)
            else:
                member = node.members[old[key]]
                new_text = self.render(member.value, value, inner, not multiline)
                parts.append(text[member.start : member.value.start] + new_text)
            previous = index
        last = node.members[-1]
        parts.append(text[last.value.end : node.end])
        return "".join(parts)

    def serialize(self, value: Any, indent: str, like: Node | None, flat: bool = False) -> str:
        """`value` as new text at `indent`, shaped like `like` (the value it replaces) if given,
        else on one line when `flat`."""
        if isinstance(value, dict):
            if not value:
                return "{}"
            inline = flat
            if like is not None and like.kind == "object" and like.members:
                inline = not self.multiline(like)
            pairs = [
                json.dumps(k, ensure_ascii=self.ascii)
                + ": "
                + self.serialize(v, indent + self.unit, None, inline)
                for k, v in value.items()
            ]
            return self._container("{", "}", pairs, indent, inline, ", ", "")
        if isinstance(value, list):
            if not value:
                return "[]"
            inline, separator, padding = self.inline_arrays or flat, ", ", ""
            if like is not None and like.kind == "array" and like.items:
                inline = not self.multiline(like)
                padding = self.text[like.start + 1 : like.items[0].start]
                if len(like.items) > 1:
                    separator = self.text[like.items[0].end : like.items[1].start]
                if not inline or padding.strip() or separator.strip() != ",":
                    separator, padding = ", ", ""
            inner = indent + self.unit
            if like is not None and like.kind == "array" and like.items and not inline:
                inner = self.line_indent(like.items[0].start)
            items = [self.serialize(item, inner, None, inline) for item in value]
            return self._container("[", "]", items, indent, inline, separator, padding, inner)
        return json.dumps(value, ensure_ascii=self.ascii)

    def _container(
        self,
        opening: str,
        closing: str,
        items: list[str],
        indent: str,
        inline: bool,
        sep: str,
        pad: str,
        inner: str | None = None,
    ) -> str:
        if inline:
            return opening + pad + sep.join(items) + pad + closing
        step = self.eol + (indent + self.unit if inner is None else inner)
        return opening + step + ("," + step).join(items) + self.eol + indent + closing


def _kind(value: Any) -> str:
    """The `Node.kind` `value` would parse as."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool) or value is None:
        return "literal"
    return "number"


def _indent_unit(text: str) -> str:
    """The file's indentation step: the smallest indentation of any line (two spaces if none)."""
    widths = []
    for line in text.splitlines():
        stripped = line.lstrip(" \t")
        if stripped and stripped != line and not stripped.startswith(("//", "/*", "*")):
            widths.append(line[: len(line) - len(stripped)])
    if not widths:
        return "  "
    return min(widths, key=len)


def _prefers_inline_arrays(root: Node, text: str) -> bool:
    """Whether the file writes its non-empty arrays on one line (the default when it has none)."""
    inline = multiline = 0
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(member.value for member in node.members)
        stack.extend(node.items)
        if node.kind == "array" and node.items:
            if "\n" in text[node.start : node.end]:
                multiline += 1
            else:
                inline += 1
    return inline >= multiline
