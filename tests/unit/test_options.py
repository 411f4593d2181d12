"""The option table: one entry per option, consistent names, sound defaults, and the docs in sync."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from mcp_backfill.cli import build_parser, parse_config
from mcp_backfill.config import SECRET_FILE_VARIABLES, Config
from mcp_backfill.errors import ConfigError
from mcp_backfill.options import (
    BY_FLAG,
    BY_NAME,
    DEFAULTS,
    ENV_PREFIX,
    FILE_FORM,
    MIB,
    OPTIONS,
    Allowance,
    Option,
    env_var,
    main,
    markdown_table,
    number,
    options_for,
    sync_tables,
)
from tests.harness import ROOT

KEY = {"ANTHROPIC_API_KEY": "sk-ant-unit-secret"}
REFERENCE = ROOT / "docs" / "reference" / "options.md"
# `Config` fields that are not options: the command after `--`, the front (`serve` or not), and
# credentials read from the environment only.
NOT_OPTIONS = {
    "upstream_command",
    "front",
    "api_key",
    "api_base_url",
    "platform_base_url",
    "vertex_access_token",
    "bedrock_api_key",
    "platform_secrets",
    "telemetry_secrets",
}


def test_every_option_field_of_config_has_exactly_one_entry() -> None:
    names = [option.name for option in OPTIONS]
    assert len(names) == len(set(names))
    assert len({option.flag for option in OPTIONS}) == len(OPTIONS)
    assert len({option.env for option in OPTIONS}) == len(OPTIONS)
    assert set(names) == {f.name for f in fields(Config)} - NOT_OPTIONS


def test_config_defaults_are_the_tables() -> None:
    for f in fields(Config):
        if f.name in BY_NAME:
            assert f.default is not MISSING
            assert f.default == DEFAULTS[f.name], f.name


def test_every_env_var_is_the_prefix_and_the_flag() -> None:
    for option in OPTIONS:
        expected = ENV_PREFIX + option.flag.removeprefix("--").replace("-", "_").upper()
        if option.kind == "lines":
            expected += "S"  # one variable holds every header, one per line
        assert option.env == expected
        assert env_var(option.flag) == option.env


def test_every_default_passes_its_own_check() -> None:
    for option in OPTIONS:
        assert option.problem(option.default) is None, option.name
        if option.choices:
            assert option.default in option.choices


def test_checks_name_the_flag_and_the_variable() -> None:
    assert (
        BY_NAME["max_tokens_cap"].problem(0)
        == "--max-tokens-cap / MCP_BACKFILL_MAX_TOKENS_CAP: must be at least 1, not 0"
    )
    assert BY_NAME["port"].problem(70000) == "--port / MCP_BACKFILL_PORT: must be between 0 and 65535"
    assert (
        BY_NAME["mode"].problem("x")
        == "--mode / MCP_BACKFILL_MODE: must be one of fallback, always, off, not 'x'"
    )


@pytest.mark.parametrize("serve", [False, True])
def test_the_parsers_have_exactly_the_tables_flags(serve: bool) -> None:
    parser = build_parser(serve)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    assert flags == {option.flag for option in options_for(serve)} | {"-h", "--help", "--version"}
    helps = {action.option_strings[0]: action.help or "" for action in parser._actions}
    for option in options_for(serve):
        assert option.env in helps[option.flag]
        if option.default_words():
            assert f"default {option.default_words()}" in helps[option.flag]


@pytest.mark.parametrize("argv", [["--prov", "mock"], ["serve", "--max-sess", "3"]])
def test_abbreviated_flags_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # Every option has a variable too, and `check` reports where each setting came from: one spelling.
    with pytest.raises(SystemExit):
        parse_config([*argv, "--", "s"], KEY)
    assert f"unrecognized arguments: {argv[-2]}" in capsys.readouterr().err


def test_serve_options_are_read_by_serve_only() -> None:
    env = KEY | {"MCP_BACKFILL_PORT": "9000", "MCP_BACKFILL_MAX_SESSIONS": "0"}
    assert parse_config(["--", "s"], env).port == DEFAULTS["port"]
    assert parse_config(["serve", "--", "s"], env | {"MCP_BACKFILL_MAX_SESSIONS": "3"}).port == 9000


@pytest.mark.parametrize("option", [option for option in OPTIONS if option.choices], ids=str)
def test_a_bad_choice_in_the_environment_lists_the_valid_values(option: Option) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(["--", "s"], KEY | {option.env: "sometimes"})
    message = str(caught.value)
    assert option.flag in message
    assert option.env in message
    assert ", ".join(option.choices) in message


def test_bad_values_from_the_environment_say_what_was_expected() -> None:
    expected = r"MCP_BACKFILL_PORT: invalid value 'many' \(expected a whole number\)"
    with pytest.raises(ConfigError, match=expected):
        parse_config(["serve", "--", "s"], KEY | {"MCP_BACKFILL_PORT": "many"})
    expected = r"MCP_BACKFILL_AUDIT_CONTENT: invalid value 'maybe' \(expected 1, true"
    with pytest.raises(ConfigError, match=expected):
        parse_config(["--", "s"], KEY | {"MCP_BACKFILL_AUDIT_CONTENT": "maybe"})


def test_the_reference_tables_are_generated_from_the_table() -> None:
    page = REFERENCE.read_text(encoding="utf-8")
    assert sync_tables(page) == page, (
        "the option tables of docs/reference/options.md differ from src/mcp_backfill/options.py; "
        "run .venv/bin/python -m mcp_backfill.options --write docs/reference/options.md"
    )


def test_the_reference_names_every_file_variable() -> None:
    """Each option whose variable has a `_FILE` form says so in its row; the prose names the others."""
    assert FILE_FORM.issubset(BY_NAME)
    page = REFERENCE.read_text(encoding="utf-8")
    for name in FILE_FORM:
        env = BY_NAME[name].env
        assert f"`{env}_FILE` (a file holding the value)" in markdown_table(BY_NAME[name].command), name
    assert [name for name in SECRET_FILE_VARIABLES if f"`{name}_FILE`" not in page] == []


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda opt: opt.flag)
def test_a_default_cell_says_something_once(opt: Option) -> None:
    """e.g. not "none (none)": a note repeats nothing the default already says."""
    rows = markdown_table(opt.command).splitlines()
    row = next(line for line in rows if line.startswith((f"| `{opt.flag} ", f"| `{opt.flag}`")))
    cell = row.split(" | ")[2]
    shown = cell.partition(" (")[0].strip("`")
    assert cell != f"{shown} ({shown})", row


def test_the_generator_checks_and_rewrites_a_stale_readme(tmp_path: Path) -> None:
    stale = tmp_path / "options.md"
    fresh = REFERENCE.read_text(encoding="utf-8")
    edited = fresh.replace("| `MCP_BACKFILL_MODE` | `fallback` |", "| `MCP_BACKFILL_MODE` | `always` |")
    assert edited != fresh
    stale.write_text(edited, encoding="utf-8")
    assert main(["--check", str(REFERENCE)]) == 0
    assert main(["--check", str(stale)]) == 1
    assert main(["--write", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == fresh


# Defaults the docs quote outside the generated tables: "`--flag` (N)", "(N s)", "(N MiB)" in
# prose, and "| … | `--flag` | `N` …" rows of the limits tables.
DOCS = ROOT / "docs"
PROSE_DEFAULT = re.compile(r"`(--[a-z-]+)`\s+\((\d[\d.]*)(\s+s|\s+MiB)?\)")
ROW_DEFAULT = re.compile(r"^\|[^|\n]*\|\s*`(--[a-z-]+)`\s*\|\s*`(\d[\d.]*)`", re.MULTILINE)


def test_defaults_quoted_elsewhere_in_the_docs_are_the_tables() -> None:
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    readme = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    quoted = [
        (flag, float(n) * (MIB if (unit or "").strip() == "MiB" else 1))
        for flag, n, unit in PROSE_DEFAULT.findall(readme)
    ]
    quoted += [(flag, float(n)) for flag, n in ROW_DEFAULT.findall(readme)]
    assert len(quoted) >= 15
    for flag, value in quoted:
        default = BY_FLAG[flag].default
        if isinstance(default, tuple) and all(isinstance(each, Allowance) for each in default):
            default = sum(each.tokens for each in default if each.window is None)  # a lifetime budget
        assert value == default, f"the docs say {flag} defaults to {value:g}"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_domain_modules_do_not_read_config() -> None:
    package = ROOT / "src" / "mcp_backfill"
    for path in [*(package / "sampling").glob("*.py"), *(package / "providers").glob("*.py")]:
        assert "mcp_backfill.config" not in imported_modules(path), path


@pytest.mark.parametrize(
    ("modules", "not_loaded"),
    [
        # the command line: parsing options and printing help start at once
        (
            "mcp_backfill.cli, mcp_backfill.config, mcp_backfill.options",
            "mcp mcp_types anthropic httpx2 uvicorn",
        ),
        # the stdio wrapper in front of a child: the HTTP upstream leg (httpx2, about 100 ms of
        # startup) is imported only for --upstream-url, the Claude client by the warm-up
        ("mcp_backfill.cli, mcp_backfill.stdio_front", "httpx2 httpcore2 uvicorn anthropic"),
    ],
)
def test_startup_imports_nothing_heavy(modules: str, not_loaded: str) -> None:
    code = f"import sys, {modules}\nprint(sorted(m for m in {not_loaded.split()!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_every_option_is_in_exactly_one_help_group() -> None:
    from mcp_backfill.options import GROUPS, OPTIONS

    grouped = [name for _, names in GROUPS for name in names]
    assert sorted(grouped) == sorted(opt.name for opt in OPTIONS)
    assert len(grouped) == len(set(grouped))


# Options whose values may hold a credential: a malformed one is never quoted in the error.
SECRET_OPTIONS = {
    "upstream_url",
    "upstream_headers",
    "api_headers",
    "auth_token",
    "client_tokens",
    "metrics_token",
    "state_store",
    "request_state_key",
}
CREDENTIAL = "alicesupersecrettoken12345"


def test_the_options_that_may_hold_a_credential_are_marked_secret() -> None:
    assert {option.name for option in OPTIONS if option.secret} == SECRET_OPTIONS


@pytest.mark.parametrize(
    ("argv", "env", "option", "where"),
    [
        (["serve"], {"MCP_BACKFILL_CLIENT_TOKENS": f"alice={CREDENTIAL},bob"}, "client_tokens", "entry 2"),
        (
            ["serve", "--client-tokens", f"# ops\nalice={CREDENTIAL}\nbob {CREDENTIAL[::-1]}"],
            {},
            "client_tokens",
            "line 3",
        ),
        ([], {"MCP_BACKFILL_API_HEADERS": f"X-Team: blue\nX-Api-Key {CREDENTIAL}"}, "api_headers", "line 2"),
        (
            ["--api-header", "X-Team: blue", "--api-header", f"Bearer {CREDENTIAL}"],
            {},
            "api_headers",
            "header 2",
        ),
        (
            ["--upstream-url", "http://h/mcp"],
            {"MCP_BACKFILL_UPSTREAM_HEADERS": f"Authorization=Bearer {CREDENTIAL}"},
            "upstream_headers",
            "line 1",
        ),
    ],
)
def test_a_malformed_secret_is_refused_without_being_quoted(
    argv: list[str], env: dict[str, str], option: str, where: str
) -> None:
    upstream = [] if "--upstream-url" in argv else ["--", "s"]
    with pytest.raises(ConfigError) as caught:
        parse_config([*argv, *upstream], KEY | env)
    message = str(caught.value)
    assert f"{BY_NAME[option].flag} / {BY_NAME[option].env}: invalid {where}" in message
    assert CREDENTIAL not in message
    assert CREDENTIAL[::-1] not in message


def test_a_malformed_client_tokens_file_is_refused_by_line(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice={CREDENTIAL}\nbob {CREDENTIAL[::-1]}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        parse_config(["serve", "--", "s"], KEY | {"MCP_BACKFILL_CLIENT_TOKENS_FILE": str(tokens)})
    assert "--client-tokens / MCP_BACKFILL_CLIENT_TOKENS: invalid line 2" in str(caught.value)
    assert CREDENTIAL[::-1] not in str(caught.value)


@pytest.mark.parametrize("raw", ["inf", "-Infinity", "nan"])
@pytest.mark.parametrize("option", [option for option in OPTIONS if option.parse is number], ids=str)
def test_seconds_must_be_finite(option: Option, raw: str) -> None:
    serve = ["serve"] if option.command == "serve" else []
    with pytest.raises(ConfigError) as caught:
        parse_config([*serve, f"{option.flag}={raw}", "--", "s"], KEY)
    assert f"{option.names}: invalid value '{raw}' (expected a finite number)" in str(caught.value)


@pytest.mark.parametrize("option", [option for option in OPTIONS if option.parse is number], ids=str)
def test_seconds_too_many_to_count_in_milliseconds_are_refused(option: Option) -> None:
    """1e306 is finite, and overflowed the moment the proxy counted it in milliseconds (the task
    book's cap, the ledger's lease): a crash after the upstream had started."""
    serve = ["serve"] if option.command == "serve" else []
    with pytest.raises(ConfigError, match=r"expected at most 1e\+09 seconds"):
        parse_config([*serve, f"{option.flag}=1e306", "--", "s"], KEY)
    parse_config([*serve, f"{option.flag}=1e9", "--", "s"], KEY)
