"""Properties of `mcp-backfill clients`' pure parts: the JSONC editor and the entry wrapper.

Wrapping then unwrapping an entry gives it back (key order included), wrapping is idempotent, and
through the text editor the same round trip gives back the file byte for byte.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.clients import jsonc, jsonc_edit, toml_file
from mcp_backfill.clients.catalog import CLIENTS, Client
from mcp_backfill.clients.entries import (
    KEY_FILE_VARIABLE,
    UNWRAP_VARIABLE,
    URL_VARIABLE,
    Proxy,
    Skip,
    Summary,
    describe,
    is_wrapped,
    unwrap,
    wrap,
)

WORDS = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\x7f"), max_size=12
)
NAMES = st.text("abcdefghijklmnopqrstuvwxyz_-", min_size=1, max_size=10)
HEADER_NAMES = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-", min_size=1, max_size=12)
JSON_LEAVES = st.none() | st.booleans() | st.integers(-1000, 1000) | WORDS
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(NAMES, children, max_size=4),
    max_leaves=12,
)
STARTS = st.sampled_from(
    [
        ("/opt/bin/mcp-backfill", ()),
        ("C:\\Tools\\mcp-backfill.exe", ()),
        ("/usr/bin/python3", ("-m", "mcp_backfill")),
    ]
)
PROXIES = st.builds(
    lambda start, options, env: Proxy(start[0], start[1], options, env),
    STARTS,
    st.lists(st.sampled_from(["--provider", "mock", "--max-tokens-cap", "2048"]), max_size=4).map(tuple),
    st.sampled_from([{}, {KEY_FILE_VARIABLE: "/home/me/.anthropic-key"}]),
)
RESOLVERS = st.sampled_from([lambda name: None, lambda name: f"/usr/local/bin/{name}"])


@st.composite
def ordered(draw: st.DrawFn, members: dict[str, Any]) -> dict[str, Any]:
    keys = draw(st.permutations(list(members)))
    return {key: members[key] for key in keys}


@st.composite
def stdio_entries(draw: st.DrawFn) -> dict[str, Any]:
    members: dict[str, Any] = {
        "command": draw(
            st.sampled_from(["npx", "uvx", "docker", "/usr/bin/python3", "./run.sh", "weather-server"])
        )
    }
    if draw(st.booleans()):
        members["args"] = draw(st.lists(WORDS, max_size=4))
    if draw(st.booleans()):
        members["env"] = draw(st.dictionaries(NAMES.map(str.upper), WORDS, max_size=3))
    if draw(st.booleans()):
        members["type"] = "stdio"
    if draw(st.booleans()):
        members["timeout"] = draw(st.integers(0, 60000))
    return draw(ordered(members))


@st.composite
def url_entries(draw: st.DrawFn, client: Client) -> dict[str, Any]:
    userinfo = draw(st.sampled_from(["", "alice:pass-0123@", "tok-0123@"]))
    query = draw(st.sampled_from(["", "?api_key=key-0123", "?team=a&token=t-0123"]))
    url = "https://" + userinfo + draw(NAMES) + ".example/mcp" + query
    members: dict[str, Any] = {draw(st.sampled_from(client.dialect.url_keys)): url}
    if draw(st.booleans()):
        members["type"] = "http"
    if draw(st.booleans()):
        headers = st.dictionaries(HEADER_NAMES, WORDS, max_size=3)
        members[client.dialect.headers_key] = draw(headers)
    if draw(st.booleans()):
        members["description"] = draw(WORDS)
    return draw(ordered(members))


@st.composite
def client_entries(draw: st.DrawFn) -> tuple[Client, dict[str, Any]]:
    client = draw(st.sampled_from(CLIENTS))
    entry = draw(stdio_entries() | url_entries(client))
    return client, entry


def same(left: Any, right: Any) -> bool:
    return jsonc_edit.same(left, right)


@given(client_entries(), PROXIES, RESOLVERS)
def test_unwrap_undoes_wrap(case: tuple[Client, dict[str, Any]], proxy: Proxy, resolve: Any) -> None:
    client, entry = case
    wrapped, _ = wrap(entry, client.dialect, proxy, resolve)
    assert is_wrapped(wrapped)
    assert same(unwrap(wrapped, client.dialect)[0], entry)


@given(client_entries(), PROXIES, RESOLVERS)
def test_wrapping_twice_changes_nothing(
    case: tuple[Client, dict[str, Any]], proxy: Proxy, resolve: Any
) -> None:
    client, entry = case
    wrapped, _ = wrap(entry, client.dialect, proxy, resolve)
    assert same(wrap(wrapped, client.dialect, proxy, resolve)[0], wrapped)


@given(stdio_entries(), PROXIES)
def test_wrapped_stdio_starts_the_proxy_then_the_resolved_command(
    entry: dict[str, Any], proxy: Proxy
) -> None:
    wrapped, warnings = wrap(entry, CLIENTS[0].dialect, proxy, lambda name: f"/usr/local/bin/{name}")
    assert wrapped["command"] == proxy.command
    args = wrapped["args"]
    assert args[: len(proxy.prefix) + len(proxy.options)] == [*proxy.prefix, *proxy.options]
    upstream = args[args.index("--") + 1 :]
    assert upstream[1:] == entry.get("args", [])
    bare = "/" not in entry["command"]
    assert upstream[0] == (f"/usr/local/bin/{entry['command']}" if bare else entry["command"])
    assert bool(warnings) == (entry["command"] == "./run.sh")
    for name, value in proxy.env.items():
        assert wrapped["env"][name] == value


def test_a_remote_entry_becomes_a_stdio_wrapper_with_its_headers_in_the_environment() -> None:
    vscode = next(client for client in CLIENTS if client.name == "vscode")
    entry = {"type": "http", "url": "https://x.example/mcp", "headers": {"Authorization": "Bearer t"}}
    wrapped, _ = wrap(entry, vscode.dialect, Proxy("/opt/mcp-backfill"), lambda name: None)
    assert list(wrapped) == ["type", "command", "args", "env"]
    assert wrapped["type"] == "stdio"
    assert wrapped["args"] == []
    assert wrapped["env"]["MCP_BACKFILL_UPSTREAM_URL"] == "https://x.example/mcp"
    assert wrapped["env"]["MCP_BACKFILL_UPSTREAM_HEADERS"] == "Authorization: Bearer t"
    assert json.loads(wrapped["env"][UNWRAP_VARIABLE]) == {"url": "url", "type": "http", "headers": "headers"}


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("https://alice:url-pass-0123@x.example/mcp", "url-pass-0123"),
        ("https://tok-0123456789@x.example/mcp", "tok-0123456789"),
        ("https://x.example/mcp?api_key=query-key-0123", "query-key-0123"),
        ("https://mcp.example/api/s/path-secret-0123/mcp", "path-secret-0123"),
    ],
)
@pytest.mark.parametrize("client", CLIENTS, ids=lambda client: client.name)
def test_a_wrapped_url_is_in_the_environment_not_the_process_list(
    client: Client, url: str, secret: str
) -> None:
    """The wrapped entry's `args` are the proxy's command line, which every local user sees in
    `ps`: a password, token or key in the URL goes in `env`, as the headers do, and nowhere in
    `args` (the URL's path may be the credential, so every URL goes there)."""
    entry = {client.dialect.url_keys[0]: url, "type": "http"}
    proxy = Proxy("/usr/bin/python3", ("-m", "mcp_backfill"), ("--provider", "mock"))
    wrapped, _ = wrap(entry, client.dialect, proxy, lambda name: None)
    assert not any(secret in arg for arg in wrapped["args"]), wrapped["args"]
    assert wrapped["args"] == ["-m", "mcp_backfill", "--provider", "mock"]
    assert wrapped["env"][URL_VARIABLE] == url
    assert describe(wrapped, client.dialect) == Summary("url", True, (url,))
    assert unwrap(wrapped, client.dialect)[0] == entry


@given(client_entries(), PROXIES)
def test_an_entry_wrapped_by_an_earlier_version_still_unwraps(
    case: tuple[Client, dict[str, Any]], proxy: Proxy
) -> None:
    """Earlier versions of `wrap` put the URL in `args`, as `--upstream-url URL`: such an entry is
    still recognised as a wrapped URL entry, and unwraps to what it was."""
    client, entry = case
    wrapped, _ = wrap(entry, client.dialect, proxy, lambda name: None)
    if URL_VARIABLE not in wrapped.get("env", {}):
        return  # a command entry
    url = wrapped["env"].pop(URL_VARIABLE)
    wrapped["args"] = [*wrapped["args"], "--upstream-url", url]
    assert is_wrapped(wrapped)
    assert describe(wrapped, client.dialect) == Summary("url", True, (url,))
    assert same(unwrap(wrapped, client.dialect)[0], entry)
    assert same(wrap(wrapped, client.dialect, proxy, lambda name: None)[0], wrapped)


def test_a_servers_own_upstream_url_argument_is_not_taken_for_the_proxys() -> None:
    """A wrapped command whose server takes an `--upstream-url` of its own is a command entry."""
    dialect = CLIENTS[0].dialect
    entry = {"command": "/usr/bin/gateway", "args": ["--upstream-url", "https://x.example/mcp"]}
    wrapped, _ = wrap(entry, dialect, Proxy("/opt/mcp-backfill"), lambda name: None)
    assert describe(wrapped, dialect) == Summary(
        "stdio", True, ("/usr/bin/gateway", "--upstream-url", "https://x.example/mcp")
    )
    assert unwrap(wrapped, dialect)[0] == entry


@pytest.mark.parametrize(
    ("client", "entry", "reason"),
    [
        ("claude-code", {"type": "sse", "url": "https://x.example/sse"}, "SSE"),
        ("gemini", {"url": "https://x.example/events"}, "SSE"),
        ("codex", {"url": "https://x.example/mcp", "bearer_token_env_var": "TOKEN"}, "environment"),
        ("cursor", {"name": "no transport"}, "neither a command nor a URL"),
    ],
)
def test_what_the_proxy_cannot_reach_is_skipped_with_a_reason(
    client: str, entry: dict[str, Any], reason: str
) -> None:
    dialect = next(each for each in CLIENTS if each.name == client).dialect
    with pytest.raises(Skip, match=reason):
        wrap(entry, dialect, Proxy("/opt/mcp-backfill"), lambda name: None)


# -- the text editors ---------------------------------------------------------------------------


def styled(value: Any, style: int) -> str:
    """A file as clients and people write it: JSON.stringify's 2 spaces, 4 spaces, tabs, or inline
    arrays inside indented objects (the common hand-written form)."""
    if style == 0:
        return json.dumps(value, indent=2) + "\n"
    if style == 1:
        return json.dumps(value, indent=4)
    if style == 2:  # tabs and Windows line endings
        return json.dumps(value, indent="\t", ensure_ascii=False).replace("\n", "\r\n") + "\r\n"
    text = json.dumps(value, indent=2)
    for node in _arrays(value):
        text = text.replace(json.dumps(node, indent=2).replace("\n", "\n" + " " * 0), json.dumps(node))
    return text + "\n"


def _arrays(value: Any) -> list[Any]:
    found = []
    if isinstance(value, list):
        found.append(value)
        for item in value:
            found.extend(_arrays(item))
    elif isinstance(value, dict):
        for item in value.values():
            found.extend(_arrays(item))
    return found


@given(st.dictionaries(NAMES, JSON_VALUES, max_size=5), st.integers(0, 2))
def test_an_unchanged_value_leaves_the_text_alone(value: dict[str, Any], style: int) -> None:
    text = styled(value, style)
    assert jsonc_edit.rewrite(text, value) == text
    assert same(jsonc.parse(text).value, value)


@given(
    st.dictionaries(NAMES, JSON_VALUES, max_size=5),
    st.dictionaries(NAMES, JSON_VALUES, max_size=5),
    st.integers(0, 2),
)
def test_a_rewritten_text_holds_the_new_value(old: dict[str, Any], new: dict[str, Any], style: int) -> None:
    text = styled({"keep": {"a": 1}, "servers": old}, style)
    rewritten = jsonc_edit.rewrite(text, {"keep": {"a": 1}, "servers": new})
    assert same(jsonc.parse(rewritten).value, {"keep": {"a": 1}, "servers": new})


@given(client_entries(), PROXIES, RESOLVERS, st.integers(0, 3), st.booleans())
def test_wrap_then_unwrap_gives_the_file_back_byte_for_byte(
    case: tuple[Client, dict[str, Any]], proxy: Proxy, resolve: Any, style: int, comments: bool
) -> None:
    client, entry = case
    document = {
        "other": {"theme": "dark", "list": [1, 2]},
        "servers": {"one": entry, "two": {"command": "x"}},
    }
    text = styled(document, style)
    if comments:
        text = re.sub(r'\n(\s*)"other"', r'\n\1// settings\n\1"other"', text, count=1)
        text = text.replace('"two"', '/* kept */ "two"', 1)
    wrapped_entry, _ = wrap(entry, client.dialect, proxy, resolve)
    wrapped_text = jsonc_edit.rewrite(
        text, {**document, "servers": {"one": wrapped_entry, "two": {"command": "x"}}}
    )
    assert ("// settings" in wrapped_text) == comments
    assert jsonc_edit.rewrite(wrapped_text, document) == text


@given(stdio_entries(), PROXIES, RESOLVERS)
def test_toml_wrap_then_unwrap_gives_the_file_back(entry: dict[str, Any], proxy: Proxy, resolve: Any) -> None:
    import tomlkit

    codex = next(client for client in CLIENTS if client.name == "codex")
    entry = {key: value for key, value in entry.items() if value is not None}
    document = {"model": "o3", "mcp_servers": {"one": entry}}
    text = "# my Codex settings\n" + tomlkit.dumps(document)
    wrapped_entry, _ = wrap(entry, codex.dialect, proxy, resolve)
    wrapped_text = toml_file.rewrite(text, {"model": "o3", "mcp_servers": {"one": wrapped_entry}})
    # TOML writes a sub-table after the plain values whatever the order: compare as maps.
    read_back = toml_file.load(wrapped_text)["mcp_servers"]["one"]
    assert read_back == wrapped_entry
    unwrapped, _ = unwrap(read_back, codex.dialect)
    restored = toml_file.rewrite(wrapped_text, {"model": "o3", "mcp_servers": {"one": unwrapped}})
    assert toml_file.load(restored) == document
    assert restored.startswith("# my Codex settings\n")


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ('{\n  "a": 1,\n  "b": }\n', 3, 8),
        ('{\n  "a": [1, 2\n}', 3, 1),
        ('{"a": 1} x', 1, 10),
        ("{\n  /* open", 2, 3),
        ("{\n  a: 1\n}", 2, 3),
        ('{"a": NaN}', 1, 7),
    ],
)
def test_a_parse_error_names_the_line_and_column(text: str, line: int, column: int) -> None:
    with pytest.raises(jsonc.ParseError) as raised:
        jsonc.parse(text)
    assert (raised.value.line, raised.value.column) == (line, column)


def test_comments_and_trailing_commas_are_accepted() -> None:
    text = '// lead\n{\n  "a": [1, 2,], /* note */\n  "b": {"c": "d",},\n}\n'
    assert jsonc.parse(text).value == {"a": [1, 2], "b": {"c": "d"}}


def test_gemini_url_is_streamable_http_only_when_its_type_says_so() -> None:
    gemini = next(client for client in CLIENTS if client.name == "gemini")
    entry = {"url": "https://x.example/mcp", "type": "http"}
    wrapped, _ = wrap(entry, gemini.dialect, Proxy("/opt/mcp-backfill"), lambda name: None)
    assert wrapped["env"][URL_VARIABLE] == "https://x.example/mcp"
    assert unwrap(wrapped, gemini.dialect)[0] == entry
