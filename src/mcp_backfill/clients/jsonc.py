"""A JSON-with-comments (JSONC) parser that keeps each value's position in the text.

Client configs are edited in place (`jsonc_edit`), so the parser returns, besides the Python value,
where every object member and array item starts and ends. It accepts what VS Code's JSONC accepts:
`//` and `/* */` comments and trailing commas; strict JSON is a subset. Anything else is refused
with the line and column of the first offending character.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Member", "Node", "ParseError", "parse", "position"]

_WHITESPACE = " \t\r\n\ufeff"
_LITERALS = {"true": True, "false": False, "null": None}
_DECODER = json.JSONDecoder()
MAX_DEPTH = 100
"""Containers nested deeper are refused (as TOML's reader refuses them): the parser recurses, and a
config nested 100,000 levels deep ended the command with a `RecursionError`. No client's is near it."""


class ParseError(ValueError):
    """The text is not JSON (with comments); `line` and `column` are 1-based."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.reason = message
        self.line = line
        self.column = column


@dataclass
class Node:
    """One value: its kind, its span `[start, end)` in the text, and (for containers) its parts."""

    kind: str  # "object", "array", "string", "number", "literal"
    start: int
    end: int
    value: Any
    members: list[Member] = field(default_factory=list)  # objects
    items: list[Node] = field(default_factory=list)  # arrays


@dataclass
class Member:
    """`"key": value` inside an object; `start` is where the key's quote is."""

    key: str
    start: int
    key_end: int
    value: Node


def position(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of `offset`."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def parse(text: str) -> Node:
    """The root value of `text`; `ParseError` when it is not JSONC."""
    parser = _Parser(text)
    parser.skip()
    root = parser.value()
    parser.skip()
    if parser.at < len(text):
        parser.fail("unexpected text after the end of the document")
    return root


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.depth = 0

    def fail(self, message: str, at: int | None = None) -> None:
        line, column = position(self.text, self.at if at is None else at)
        raise ParseError(message, line, column)

    def skip(self) -> None:
        """Whitespace and comments."""
        text = self.text
        while self.at < len(text):
            char = text[self.at]
            if char in _WHITESPACE:
                self.at += 1
            elif text.startswith("//", self.at):
                newline = text.find("\n", self.at)
                self.at = len(text) if newline < 0 else newline + 1
            elif text.startswith("/*", self.at):
                close = text.find("*/", self.at + 2)
                if close < 0:
                    self.fail("unterminated /* comment")
                self.at = close + 2
            else:
                return

    def value(self) -> Node:
        if self.at >= len(self.text):
            self.fail("unexpected end of the document: a value is missing")
        char = self.text[self.at]
        if char in "{[":
            if self.depth >= MAX_DEPTH:
                self.fail(f"JSON value nested more than {MAX_DEPTH} levels deep")
            self.depth += 1
            node = self.object() if char == "{" else self.array()
            self.depth -= 1
            return node
        if char == '"':
            return self.string()
        return self.scalar()

    def string(self) -> Node:
        start = self.at
        try:
            decoded, end = _DECODER.raw_decode(self.text, start)
        except json.JSONDecodeError as exc:
            self.fail(f"invalid string ({exc.msg})", exc.pos)
            raise  # unreachable: fail() raises
        self.at = end
        return Node("string", start, end, decoded)

    def scalar(self) -> Node:
        start = self.at
        for word, literal in _LITERALS.items():
            if self.text.startswith(word, start):
                self.at = start + len(word)
                return Node("literal", start, self.at, literal)
        if self.text[start] not in "-0123456789":
            self.fail(f"unexpected character {self.text[start]!r}")
        try:
            decoded, end = _DECODER.raw_decode(self.text, start)
        except json.JSONDecodeError:
            self.fail(f"unexpected character {self.text[start]!r}")
            raise  # unreachable
        self.at = end
        return Node("number", start, end, decoded)

    def object(self) -> Node:
        start = self.at
        self.at += 1
        members: list[Member] = []
        value: dict[str, Any] = {}
        while True:
            self.skip()
            if self.at < len(self.text) and self.text[self.at] == "}":
                break
            if self.at >= len(self.text) or self.text[self.at] != '"':
                self.fail("expected a quoted member name or '}'")
            key_start = self.at
            key_node = self.string()
            key = key_node.value
            if key in value:  # the editor could keep only one of them: refuse, write nothing
                self.fail(f"duplicate member name {key!r}", key_start)
            self.skip()
            if self.at >= len(self.text) or self.text[self.at] != ":":
                self.fail(f"expected ':' after the member name {key!r}")
            self.at += 1
            self.skip()
            item = self.value()
            members.append(Member(key, key_start, key_node.end, item))
            value[key] = item.value
            self.skip()
            if self.at < len(self.text) and self.text[self.at] == ",":
                self.at += 1
                continue
            if self.at < len(self.text) and self.text[self.at] == "}":
                break
            self.fail("expected ',' or '}' after an object member")
        self.at += 1
        return Node("object", start, self.at, value, members=members)

    def array(self) -> Node:
        start = self.at
        self.at += 1
        items: list[Node] = []
        while True:
            self.skip()
            if self.at < len(self.text) and self.text[self.at] == "]":
                break
            items.append(self.value())
            self.skip()
            if self.at < len(self.text) and self.text[self.at] == ",":
                self.at += 1
                continue
            if self.at < len(self.text) and self.text[self.at] == "]":
                break
            self.fail("expected ',' or ']' after an array item")
        self.at += 1
        return Node("array", start, self.at, [item.value for item in items], items=items)
