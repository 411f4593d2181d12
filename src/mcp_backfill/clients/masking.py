"""What `list` and `--dry-run` print of an entry, with its credentials replaced by `***`, and
with no control character (`printable`): a project's configs come with a cloned repository, and
what they hold must not drive the terminal (retitle it, clear it, hide text).

A config holds secrets in plain text: `env` values (`GITHUB_TOKEN`), headers (`Authorization`), a
URL's password or query, a server's `--api-key VALUE` or `--token=VALUE` argument. They stay in the
file, but not on the terminal (or a pasted bug report). Which names and values are credentials is
`mcp_backfill.credentials`'s to say (the proxy masks the upstream command in its log the same way).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from mcp_backfill.clients.entries import HEADERS_VARIABLE
from mcp_backfill.credentials import MASK, is_secret_name, literal, masked_arg, shown_args, url_target

__all__ = ["MASK", "is_secret_name", "masked", "printable", "shown_args", "shown_url", "url_target"]

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with each control character (but tab and newline) and bidirectional override written
    as an escape (`\\x1b`), so printing it cannot drive the terminal."""
    return _CONTROLS.sub(lambda match: ascii(match.group())[1:-1], text)


def shown_url(url: str) -> str:
    """A URL without its user information (`user:password@`, or a token as the user) and query
    (which may hold a key)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{MASK}@{host}" if "@" in parts.netloc else parts.netloc
    return parts._replace(netloc=netloc, query="…" if parts.query else "", fragment="").geturl()


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
                result[key] = "\n".join(masked_arg(line) for line in item.split("\n"))
            elif isinstance(item, str) and is_secret_name(key) and literal(item):
                result[key] = MASK
            else:
                result[key] = masked(item)
        return result
    if isinstance(value, str) and "://" in value:
        return url_target(value)
    return value
