"""One server entry of a client config: what it is, wrapping it in mcp-backfill, and undoing that.

Pure functions on plain values (the parsed entry), so they are property-tested: `unwrap(wrap(e))`
is `e`, and wrapping a wrapped entry changes nothing.

The wrapped form of a stdio entry keeps every key in place and changes only
    command: <absolute mcp-backfill>    args: [<proxy options>..., "--", <absolute command>, <args>...]
and adds to `env` what the proxy needs (ANTHROPIC_API_KEY_FILE with `--key-file`). A remote entry
(`url`/`httpUrl`/`serverUrl`) becomes a stdio one at the URL key's place:
    command: <absolute mcp-backfill>    args: [<proxy options>...]
with the URL in `env` as MCP_BACKFILL_UPSTREAM_URL and its headers moved, at the headers key's
place, to `env` as MCP_BACKFILL_UPSTREAM_HEADERS: in the environment, not the arguments, because the
arguments are in the process list, which every local user can read, and a URL may hold a password
(`user:password@`), a key in its query or a token in its path. Every URL goes there, not only those
that look like they hold one. An entry wrapped by an earlier version has the URL in `args`
(`--upstream-url <url>` after the proxy options); it is still recognised and unwrapped.

What cannot be read back from that (the command as it was written before it was made absolute, the
URL's key and `type`, which keys did not exist) is kept in one more variable of `env`,
MCP_BACKFILL_UNWRAP, as compact JSON; it is written only when needed. The proxy drops every
MCP_BACKFILL_* variable from the environment it passes to the server, so none of this reaches it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from mcp_backfill.clients.catalog import Dialect
from mcp_backfill.options import option

__all__ = [
    "HEADERS_VARIABLE",
    "KEY_FILE_VARIABLE",
    "KEY_VARIABLE",
    "UNWRAP_VARIABLE",
    "URL_VARIABLE",
    "Proxy",
    "Skip",
    "Summary",
    "describe",
    "is_wrapped",
    "unwrap",
    "wrap",
]

UNWRAP_VARIABLE = "MCP_BACKFILL_UNWRAP"
KEY_VARIABLE = "ANTHROPIC_API_KEY"
KEY_FILE_VARIABLE = f"{KEY_VARIABLE}_FILE"
HEADERS_VARIABLE = option("upstream_headers").env
URL_VARIABLE = option("upstream_url").env
_SEPARATOR = "--"
_UPSTREAM_URL = option("upstream_url").flag
_ANY_URL_KEYS = ("url", "httpUrl", "serverUrl")


class Skip(Exception):
    """This entry is left as it is; the message says why."""


@dataclass(frozen=True)
class Proxy:
    """How a wrapped entry starts mcp-backfill: `command` (absolute) with `prefix` (`-m
    mcp_backfill` when it is a Python interpreter), the user's proxy `options`, and variables to add
    to the entry's environment (the key file)."""

    command: str
    prefix: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Summary:
    kind: str  # "stdio", "url" or "unknown"
    wrapped: bool
    target: tuple[str, ...]  # the command line or (the) URL the entry reaches, behind the proxy if wrapped


def is_wrapped(entry: Mapping[str, Any]) -> bool:
    """Whether the entry starts mcp-backfill (its executable, or `python -m mcp_backfill`)."""
    command = entry.get("command")
    if not isinstance(command, str):
        return False
    name = PureWindowsPath(command).name.lower().removesuffix(".exe")
    args = entry.get("args")
    by_module = isinstance(args, list) and args[:2] == ["-m", "mcp_backfill"]
    return name == "mcp-backfill" or by_module


def _wrapped_url(args: list[str], env: Mapping[str, Any]) -> str | None:
    """The URL a wrapped entry's proxy reaches: from `env`, or (as earlier versions of `wrap` wrote
    it) the value of `--upstream-url` among the proxy's own arguments; None for a command entry."""
    if _SEPARATOR in args:
        return None
    url = env.get(URL_VARIABLE)
    if isinstance(url, str):
        return url
    if _UPSTREAM_URL in args[:-1]:
        return args[args.index(_UPSTREAM_URL) + 1]
    return None


def describe(entry: Any, dialect: Dialect) -> Summary:
    if not isinstance(entry, dict):
        return Summary("unknown", False, ())
    args = [str(arg) for arg in entry.get("args") or []] if isinstance(entry.get("args"), list) else []
    if isinstance(entry.get("command"), str):
        wrapped = is_wrapped(entry)
        env = entry["env"] if isinstance(entry.get("env"), dict) else {}
        if wrapped and (url := _wrapped_url(args, env)) is not None:
            return Summary("url", True, (url,))
        if wrapped and _SEPARATOR in args:
            return Summary("stdio", True, tuple(args[args.index(_SEPARATOR) + 1 :]))
        return Summary("stdio", wrapped, (entry["command"], *args))
    for key in (*dialect.url_keys, *dialect.sse_url_keys, *_ANY_URL_KEYS):
        if isinstance(entry.get(key), str):
            return Summary("url", False, (entry[key],))
    return Summary("unknown", False, ())


# -- wrap ----------------------------------------------------------------------------------------


def wrap(
    entry: dict[str, Any], dialect: Dialect, proxy: Proxy, resolve: Callable[[str], str | None]
) -> tuple[dict[str, Any], list[str]]:
    """The wrapped entry and warnings; an entry already wrapped comes back unchanged.
    `resolve` finds a bare command name on the user's PATH (None when it is not there)."""
    if is_wrapped(entry):
        return entry, []
    if "command" in entry:
        return _wrap_stdio(entry, proxy, resolve)
    return _wrap_url(entry, dialect, proxy), []


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise Skip(f"its {what} is not a list of strings")
    return list(value)


def _environment(entry: Mapping[str, Any]) -> dict[str, str]:
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(value, str) for value in env.values()):
        raise Skip("its env is not a map of strings")
    return dict(env)


def _is_absolute(command: str) -> bool:
    return PurePosixPath(command).is_absolute() or PureWindowsPath(command).is_absolute()


def _wrap_stdio(
    entry: dict[str, Any], proxy: Proxy, resolve: Callable[[str], str | None]
) -> tuple[dict[str, Any], list[str]]:
    command = entry["command"]
    if not isinstance(command, str) or not command:
        raise Skip("its command is not a string")
    args = _strings(entry.get("args", []), "args")
    env = _environment(entry)
    warnings: list[str] = []
    resolved = command
    if not _is_absolute(command):
        if "/" in command or "\\" in command or "$" in command:
            warnings.append(f"command {command!r} is not an absolute path; left as it is")
        elif (found := resolve(command)) is not None:
            resolved = found
        else:
            warnings.append(f"command {command!r} is not on PATH; left as it is (the client may not find it)")
    added = {name: value for name, value in proxy.env.items() if name not in env}
    if KEY_VARIABLE in env:
        added.pop(KEY_FILE_VARIABLE, None)
        warnings.append(
            f"its env sets {KEY_VARIABLE}: the proxy uses that key, and no longer passes it to the server"
        )
    record: dict[str, Any] = {}
    if resolved != command:
        record["command"] = command
        record["resolved"] = resolved
    absent = [key for key in ("args", "env") if key not in entry]
    if absent:
        record["absent"] = absent
    if added:
        record["env"] = list(added)
    new_env = {**env, **added}
    if record:
        new_env[UNWRAP_VARIABLE] = _encode(record)
    new_args = [*proxy.prefix, *proxy.options, _SEPARATOR, resolved, *args]
    wrapped: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "command":
            wrapped["command"] = proxy.command
            if "args" not in entry:
                wrapped["args"] = new_args
                if "env" not in entry:
                    wrapped["env"] = new_env
        elif key == "args":
            wrapped["args"] = new_args
            if "env" not in entry:
                wrapped["env"] = new_env
        elif key == "env":
            wrapped["env"] = new_env
        else:
            wrapped[key] = value
    return wrapped, warnings


def _wrap_url(entry: dict[str, Any], dialect: Dialect, proxy: Proxy) -> dict[str, Any]:
    kind = entry.get("type")
    url_key = next((key for key in dialect.url_keys if key in entry), None)
    for key in dialect.sse_url_keys:
        if url_key is None and key in entry:
            if kind != "http":  # Gemini CLI: `url` is SSE unless `type` says streamable HTTP
                raise Skip(
                    f"its {key!r} is a legacy SSE endpoint; the proxy reaches streamable-HTTP servers only"
                )
            url_key = key
    if url_key is None:
        raise Skip("it has neither a command nor a URL")
    url = entry[url_key]
    if not isinstance(url, str) or not url:
        raise Skip(f"its {url_key} is not a string")
    if kind == "sse" or (kind is None and url.rstrip("/").endswith("/sse")):
        raise Skip("it is a legacy SSE endpoint; the proxy reaches streamable-HTTP servers only")
    for key in dialect.unsupported_keys:
        if key in entry:
            raise Skip(
                f"its {key} takes a header from the client's environment, which the wrapper cannot copy"
            )
    if "env" in entry:
        raise Skip("it has both a URL and an env")
    headers = entry.get(dialect.headers_key, {})
    if not isinstance(headers, dict) or not all(
        isinstance(value, str) and "\n" not in value and "\r" not in value for value in headers.values()
    ):
        raise Skip(f"its {dialect.headers_key} is not a map of one-line strings")
    record: dict[str, Any] = {"url": url_key}
    if "type" in entry:
        record["type"] = kind
    if dialect.headers_key in entry:
        record["headers"] = dialect.headers_key
    env = {**proxy.env, URL_VARIABLE: url}
    if headers:
        env[HEADERS_VARIABLE] = "\n".join(f"{name}: {value}" for name, value in headers.items())
    env[UNWRAP_VARIABLE] = _encode(record)
    args = [*proxy.prefix, *proxy.options]
    wrapped: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "type":
            wrapped["type"] = "stdio"
        elif key == url_key:
            wrapped["command"] = proxy.command
            wrapped["args"] = args
            if dialect.headers_key not in entry:
                wrapped["env"] = env
        elif key == dialect.headers_key:
            wrapped["env"] = env
        else:
            wrapped[key] = value
    return wrapped


def _encode(record: Mapping[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


# -- unwrap --------------------------------------------------------------------------------------


def unwrap(entry: dict[str, Any], dialect: Dialect) -> tuple[dict[str, Any], list[str]]:
    """The entry as it was before `wrap` (an entry that is not wrapped comes back unchanged)."""
    if not is_wrapped(entry):
        return entry, []
    args = _strings(entry.get("args", []), "args")
    env = _environment(entry)
    try:
        record = json.loads(env.pop(UNWRAP_VARIABLE, "{}"))
    except ValueError:
        raise Skip(f"its {UNWRAP_VARIABLE} is not JSON") from None
    if not isinstance(record, dict):
        raise Skip(f"its {UNWRAP_VARIABLE} is not a JSON object")
    if _SEPARATOR in args:
        return _unwrap_stdio(entry, args, env, record)
    url = _wrapped_url(args, env)
    if url is not None:
        env.pop(URL_VARIABLE, None)
        return _unwrap_url(entry, url, env, record, dialect)
    raise Skip(f"neither {_SEPARATOR!r} nor {_UPSTREAM_URL} in its args, nor {URL_VARIABLE} in its env")


def _unwrap_stdio(
    entry: dict[str, Any], args: list[str], env: dict[str, str], record: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    upstream = args[args.index(_SEPARATOR) + 1 :]
    if not upstream:
        raise Skip(f"nothing follows {_SEPARATOR!r} in its args")
    command = upstream[0]
    written = record.get("command")
    found = PureWindowsPath(command).name.lower()
    resolved = record.get("resolved")
    if isinstance(resolved, str):
        same_program = command == resolved
    else:  # a record from before "resolved" was kept
        same_program = isinstance(written, str) and (
            found == written.lower() or found.startswith(written.lower() + ".")
        )
    if same_program and isinstance(written, str):
        command = written  # as it was before `wrap` made it absolute (unless pointed elsewhere since)
    for name in record.get("env", []):
        env.pop(name, None)
    absent = record.get("absent", [])
    warnings: list[str] = []
    original: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "command":
            original["command"] = command
        elif key == "args":
            if "args" not in absent or upstream[1:]:
                original["args"] = upstream[1:]
        elif key == "env":
            if "env" not in absent or env:
                original["env"] = env
        else:
            original[key] = value
    return original, warnings


def _unwrap_url(
    entry: dict[str, Any], url: str, env: dict[str, str], record: dict[str, Any], dialect: Dialect
) -> tuple[dict[str, Any], list[str]]:
    url_key = record.get("url", dialect.url_keys[0])
    headers_key = record.get("headers", dialect.headers_key)
    headers = {}
    lines = env.pop(HEADERS_VARIABLE, "")
    for line in lines.split("\n") if lines else []:
        name, _, value = line.partition(": ")
        headers[name] = value
    leftover = sorted(name for name in env if name not in (KEY_FILE_VARIABLE, KEY_VARIABLE))
    warnings = [f"dropped env variables a URL entry cannot have: {', '.join(leftover)}"] if leftover else []
    original: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "type":
            if "type" in record or not record:
                original["type"] = record.get("type", "http")
        elif key == "command":
            original[url_key] = url
        elif key == "args":
            continue
        elif key == "env":
            if "headers" in record or headers:
                original[headers_key] = headers
        else:
            original[key] = value
    return original, warnings
