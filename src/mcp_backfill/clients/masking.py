"""What `list` and `--dry-run` print of an entry, with its credentials replaced by `***`, and
with no control character (`printable`): a project's configs come with a cloned repository, and
what they hold must not drive the terminal (retitle it, clear it, hide text).

A config holds secrets in plain text: `env` values (`GITHUB_TOKEN`), headers (`Authorization`), a
URL's password or query, a server's `--api-key VALUE` or `--token=VALUE` argument. They stay in the
file, but not on the terminal (or a pasted bug report). A name counts as a credential's when one of
its words (`api_key`, `apiKey`, `X-Api-Key` all have `key`) is a credential word and its last word
does not say it names a file or an identifier (`ANTHROPIC_API_KEY_FILE` is a path, shown).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from mcp_backfill.clients.entries import HEADERS_VARIABLE
from mcp_backfill.credentials import hide_url_credentials

__all__ = ["MASK", "is_secret_name", "masked", "printable", "shown_args", "shown_url", "url_target"]

MASK = "***"
_WORDS = {
    "apikey",
    "auth",
    "authorization",
    "bearer",
    "cookie",
    "credential",
    "credentials",
    "key",
    "pass",
    "passwd",
    "password",
    "pat",
    "pwd",
    "secret",
    "token",
}
_NOT_SECRET = {"dir", "file", "id", "name", "path", "url"}
_ASSIGNMENT = re.compile(r"^(-{0,2}[A-Za-z0-9_.-]+)=(.+)$", re.DOTALL)
_HEADER = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$", re.DOTALL)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_REFERENCE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\bBearer\b|\bBasic\b")


def printable(text: str) -> str:
    """`text` with each control character (but tab and newline) and bidirectional override written
    as an escape (`\\x1b`), so printing it cannot drive the terminal."""
    return _CONTROLS.sub(lambda match: ascii(match.group())[1:-1], text)


def _literal(value: str) -> bool:
    """Whether a credential's value holds the credential itself, not only references to where the
    client finds it (`${input:token}`, `Bearer ${GITHUB_TOKEN}`), which are shown."""
    return bool(_REFERENCE.sub("", value).strip())


def is_secret_name(name: str) -> bool:
    words = [
        word for word in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if word
    ]
    return bool(words) and words[-1] not in _NOT_SECRET and any(word in _WORDS for word in words)


def shown_url(url: str) -> str:
    """A URL without its user information (`user:password@`, or a token as the user) and query
    (which may hold a key)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{MASK}@{host}" if "@" in parts.netloc else parts.netloc
    return parts._replace(netloc=netloc, query="…" if parts.query else "", fragment="").geturl()


def url_target(url: str) -> str:
    """A URL value masked where it may hold a credential: its user information, and the values of
    query parameters named like one."""
    hidden = hide_url_credentials(url)
    parts = urlsplit(hidden)
    if "@" in parts.netloc:
        hidden = parts._replace(netloc=f"{MASK}@{parts.netloc.rpartition('@')[2]}").geturl()
    return hidden


def _one(arg: str) -> str:
    if "://" in arg:
        return url_target(arg)
    for pattern in (_ASSIGNMENT, _HEADER):
        match = pattern.match(arg)
        if match and is_secret_name(match.group(1)) and _literal(match.group(2)):
            return arg[: match.start(2)] + MASK
    return arg


def shown_args(args: list[str]) -> list[str]:
    """A command's arguments with the value of each credential option masked: `--api-key VALUE`,
    `--token=VALUE`, `-e GITHUB_TOKEN=VALUE`, `--header 'Authorization: Bearer VALUE'`, a URL's
    password."""
    shown: list[str] = []
    for index, arg in enumerate(args):
        previous = args[index - 1] if index else ""
        flag = previous.startswith("-") and "=" not in previous and is_secret_name(previous)
        shown.append(MASK if flag and not arg.startswith("-") and _literal(arg) else _one(arg))
    return shown


def masked(value: Any) -> Any:
    """A parsed config (or part of one) with every credential in it replaced by `***`."""
    if isinstance(value, list):
        if all(isinstance(item, str) for item in value):
            return shown_args(value)
        return [masked(item) for item in value]
    if isinstance(value, dict):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(item, str) and key == HEADERS_VARIABLE:
                result[key] = "\n".join(_one(line) for line in item.split("\n"))
            elif isinstance(item, str) and is_secret_name(key) and _literal(item):
                result[key] = MASK
            else:
                result[key] = masked(item)
        return result
    if isinstance(value, str) and "://" in value:
        return url_target(value)
    return value
