"""Every command-line option, declared once in `OPTIONS`.

One `Option` holds what the rest of the program needs to know about a setting: the `Config` field
it fills, its flag and environment variable, its default, how a raw string becomes a value, what
values are acceptable, its help text and which command has it. From the table come the argparse
parsers (`cli`), the flag > environment > default lookup (`read_options`), `Config`'s defaults and
per-field checks (`config`), and the options reference of the docs (`python -m mcp_backfill.options`,
which writes `docs/reference/options.md`).

This module imports nothing heavy and nothing of mcp-backfill but `errors`, so that any module (the
domain ones included) may use `env_var()` to name an option in a message, or the value types it
declares (`AudioPolicy`...), without depending on `config`.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, get_args

from mcp_backfill.errors import ConfigError

Mode = Literal["fallback", "always", "off"]
Era = Literal["auto", "handshake"]
ProviderName = Literal["anthropic", "bedrock", "vertex", "mock"]
AudioPolicy = Literal["reject", "placeholder"]
LogFormat = Literal["text", "json"]
Approval = Literal["never", "elicit", "elicit-tools"]

MODES: tuple[Mode, ...] = get_args(Mode)
ERAS: tuple[Era, ...] = get_args(Era)
PROVIDERS: tuple[ProviderName, ...] = get_args(ProviderName)
AUDIO_POLICIES: tuple[AudioPolicy, ...] = get_args(AudioPolicy)
LOG_FORMATS: tuple[LogFormat, ...] = get_args(LogFormat)
APPROVALS: tuple[Approval, ...] = get_args(Approval)
LOG_LEVELS = ("debug", "info", "warning", "error")

ENV_PREFIX = "MCP_BACKFILL_"
MIB = 1024 * 1024
# Said instead of a secret option's malformed value.
NOT_QUOTED = "not quoted: it may hold a secret"

# Which commands have an option: both `mcp-backfill` and `mcp-backfill serve`, or `serve` only.
Command = Literal["both", "serve"]
SERVE_COMMAND = "serve"
# How an option is given: one value, a switch (a flag without a value; `1`/`0`… in the environment),
# or header lines (a repeatable flag; one per line in the environment).
Kind = Literal["value", "switch", "lines"]


def env_name(flag: str) -> str:
    """`--max-tokens-cap` -> `MCP_BACKFILL_MAX_TOKENS_CAP`."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


# -- value types and parsers ---------------------------------------------------------------------
# A parser turns one raw string (from a flag or the environment) into a value, or raises
# `ValueError` saying what it expected (`Malformed` when it can say which part of the value is wrong).


class Malformed(ValueError):
    """A value of which one part is wrong; `where` names that part (`line 2`) without quoting it."""

    def __init__(self, expected: str, where: str) -> None:
        super().__init__(expected)
        self.where = where


@dataclass(frozen=True)
class Secret:
    """A credential whose value never appears in `repr()` or `str()`."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def whole_number(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("expected a whole number") from None


# The longest duration an option takes, in seconds (about 31 years): `inf`, `nan` and numbers so
# large that counting them in milliseconds overflows would break the timers and the ledger's leases.
MAX_SECONDS = 1e9


def number(raw: str) -> float:
    """A number of seconds: finite, and at most `MAX_SECONDS`."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    if abs(value) > MAX_SECONDS:
        raise ValueError(f"expected at most {MAX_SECONDS:.0e} seconds (about 31 years)")
    return value


def parse_bool(raw: str) -> bool:
    """`1/true/yes/on` and `0/false/no/off`, in any case."""
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1, true, yes, on, 0, false, no or off")


def split_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """Comma-separated lists (flags or env) -> tuple of stripped, non-empty items."""
    items = value.split(",") if isinstance(value, str) else value
    return tuple(item.strip() for item in items if item.strip())


BUDGET_WINDOWS: Mapping[str, int] = {"hour": 3600, "day": 86_400, "week": 604_800}
"""The windows a budget may be given per, in seconds; windows are aligned to UTC (a day starts at
00:00 UTC, a week on Thursday, as the Unix epoch did)."""


class Allowance(NamedTuple):
    """Tokens a payer may spend: over its lifetime (`window` None), or in each window."""

    tokens: int
    window: str | None = None

    def __str__(self) -> str:
        return f"{self.tokens} tokens" + (f" per {self.window}" if self.window else "")


def budget(raw: str) -> tuple[Allowance, ...]:
    """`2000000` (a lifetime), `100000/day` (per window), or several, comma-separated; `0`: none."""
    allowances: list[Allowance] = []
    for part in split_list(raw):
        amount, slash, per = part.partition("/")
        window = per.strip().lower() if slash else None
        try:
            tokens = int(amount.strip().replace("_", ""))
        except ValueError:
            tokens = -1
        if tokens < 0 or (window is not None and window not in BUDGET_WINDOWS):
            raise ValueError(
                f"expected tokens, optionally per {', '.join(BUDGET_WINDOWS)}, e.g. 2000000 or "
                "100000/day or both, comma-separated"
            )
        if any(each.window == window for each in allowances):
            raise ValueError(f"two budgets {'per ' + window if window else 'for the lifetime'}")
        if tokens > 0:
            allowances.append(Allowance(tokens, window))
        elif window is not None:
            raise ValueError("a budget per window must be more than 0 tokens")
    return tuple(allowances)


class ClientToken(NamedTuple):
    """One named client credential of `serve` (`--client-tokens`)."""

    name: str
    token: Secret

    def __repr__(self) -> str:
        return f"ClientToken({self.name!r}, ***)"


CLIENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
SHARED_CLIENT = "default"
"""The client identity of every holder of the shared `--auth-token`: no named client may have it."""


def client_tokens(raw: str) -> tuple[ClientToken, ...]:
    """`name=token` entries, one per line or comma-separated; `#` starts a comment line.

    A malformed entry is named by its place (`entry 2 of line 3`), never quoted: it holds a token."""
    entries: list[ClientToken] = []
    lines = raw.splitlines()
    for line_number, line in enumerate(lines, 1):
        if line.strip().startswith("#"):
            continue
        items = split_list(line)
        for entry_number, entry in enumerate(items, 1):
            name, equals, token = entry.partition("=")
            if not equals or not CLIENT_NAME.match(name.strip()) or not token.strip():
                raise Malformed(
                    "expected name=token entries (a name of letters, digits, _ . @ -), one per line "
                    "or comma-separated",
                    _place(line_number if len(lines) > 1 else 0, entry_number if len(items) > 1 else 0),
                )
            entries.append(ClientToken(name.strip(), Secret(token.strip())))
    return tuple(entries)


def _place(line: int, entry: int) -> str:
    """`entry 2 of line 3`, `line 3`, `entry 2` or `value` (0: the value has one line, or one entry)."""
    if line and entry:
        return f"entry {entry} of line {line}"
    return f"line {line}" if line else f"entry {entry}" if entry else "value"


def parse_header(line: str) -> tuple[str, str]:
    """`"Name: value"` -> `("Name", "value")`; the name and value are checked by `Config`."""
    name, colon, value = line.partition(":")
    if not colon or not name.strip():
        raise ValueError("expected 'Name: value'")
    return name.strip(), value.strip()


def stripped(raw: str) -> str:
    return raw.strip()


def text_or_none(raw: str) -> str | None:
    return raw.strip() or None


def secret_or_none(raw: str) -> Secret | None:
    return Secret(raw.strip()) if raw.strip() else None


# -- checks --------------------------------------------------------------------------------------


class Check:
    """A rule a field value must follow; `problem()` says what is wrong (after the option), or None.

    A plain class with factory functions rather than dataclasses: the proxy imports this module on
    every start, and each dataclass costs a millisecond or more to create.
    """

    __slots__ = ("complaint", "passes")

    def __init__(self, passes: Callable[[Any], bool], complaint: str) -> None:
        self.passes = passes
        self.complaint = complaint
        """May contain `{value}`."""

    def problem(self, value: Any) -> str | None:
        return None if self.passes(value) else self.complaint.format(value=value)


def at_least(minimum: int, note: str = "") -> Check:
    return Check(lambda value: value >= minimum, _noted(f"must be at least {minimum}, not {{value}}", note))


def not_negative(note: str = "") -> Check:
    return Check(lambda value: value >= 0, _noted("must not be negative", note))


def positive() -> Check:
    return Check(lambda value: value > 0, "must be positive")


def between(low: int, high: int) -> Check:
    return Check(lambda value: low <= value <= high, f"must be between {low} and {high}")


def not_empty(complaint: str = "must not be empty") -> Check:
    return Check(bool, complaint)


def min_length(length: int) -> Check:
    def passes(value: Any) -> bool:
        return len(value.value if isinstance(value, Secret) else value) >= length

    return Check(passes, f"must be at least {length} characters long")


def _noted(text: str, note: str) -> str:
    return f"{text} ({note})" if note else text


# -- the option ----------------------------------------------------------------------------------


class Option:
    """One option. Read-only once built (a plain class: cheaper to create than a dataclass).

    `name` is the `Config` field it sets (and the argparse `dest`); `help` the plain `--help` text,
    to which the default and the environment variable are appended; `doc` the reference's "meaning"
    cell (Markdown); `parse` turns one raw string into a value (raising `ValueError` that says what
    it expected); `checks` are the field's own rules (cross-field rules live in `Config`); `env` is
    derived from the flag unless given (a repeatable flag's variable has a plural name);
    `secret` marks a value that may hold a credential, never quoted in an error; `negated` marks
    a switch that turns its field off (`--no-prompt-cache`); `default_note` is said after the
    default (e.g. "no limit"); `default_text` is the default as the docs say it, when the field's
    own default is resolved elsewhere (e.g. from the bound port).
    """

    __slots__ = (
        "checks",
        "choices",
        "command",
        "default",
        "default_note",
        "default_text",
        "doc",
        "env",
        "flag",
        "help",
        "kind",
        "metavar",
        "name",
        "negated",
        "parse",
        "secret",
    )

    def __init__(
        self,
        name: str,
        flag: str,
        default: Any,
        help: str,
        doc: str,
        *,
        parse: Callable[[str], Any] = stripped,
        kind: Kind = "value",
        choices: tuple[str, ...] = (),
        checks: tuple[Check, ...] = (),
        metavar: str | None = None,
        command: Command = "both",
        negated: bool = False,
        secret: bool = False,
        env: str = "",
        default_note: str = "",
        default_text: str = "",
    ) -> None:
        self.name = name
        self.flag = flag
        self.default = default
        self.help = help
        self.doc = doc
        self.parse = parse
        self.kind = kind
        self.choices = choices
        self.checks = checks
        self.metavar = metavar
        self.command = command
        self.negated = negated
        self.secret = secret
        self.env = env or env_name(flag)
        self.default_note = default_note
        self.default_text = default_text

    def __repr__(self) -> str:
        return f"Option({self.name!r}, {self.flag!r}, {self.default!r})"

    @property
    def names(self) -> str:
        """`--flag / MCP_BACKFILL_FLAG`: how an error message names the option."""
        return f"{self.flag} / {self.env}"

    # -- reading ---------------------------------------------------------------------------------

    def raw(self, given: str | list[str] | None, environ: Mapping[str, str]) -> str | list[str] | None:
        """The flag's value, else the environment variable's; None (or empty) when neither is set."""
        raw = given if given is not None else environ.get(self.env)
        return raw if raw else None

    def convert(self, raw: str | list[str]) -> Any:
        """The field's value for a raw flag or environment value; `ConfigError` names both."""
        if self.kind == "lines":  # a variable's lines, or a repeated flag's headers
            lines, part = (raw.splitlines(), "line") if isinstance(raw, str) else (raw, "header")
            return tuple(
                self._convert_one(line, where=f"{part} {number}")
                for number, line in enumerate(lines, 1)
                if line.strip()
            )
        assert isinstance(raw, str)
        if self.kind == "switch":
            return self._convert_one(raw, parse_bool) != self.negated
        if self.choices and raw not in self.choices:
            raise self._invalid(raw, f"expected one of {', '.join(self.choices)}")
        return self._convert_one(raw)

    def _convert_one(self, raw: str, parse: Callable[[str], Any] | None = None, where: str = "value") -> Any:
        try:
            return (parse or self.parse)(raw)
        except ValueError as exc:
            raise self._invalid(raw, str(exc), exc.where if isinstance(exc, Malformed) else where) from None

    def _invalid(self, raw: str, expected: str, where: str = "value") -> ConfigError:
        """A secret's value is never quoted: `where` says which part of it is wrong."""
        if self.secret:
            return ConfigError(f"{self.names}: invalid {where} ({expected}; {NOT_QUOTED})")
        return ConfigError(f"{self.names}: invalid value {raw!r} ({expected})")

    # -- checking --------------------------------------------------------------------------------

    def problem(self, value: Any) -> str | None:
        """What is wrong with a field value, as an error message naming the option; None if nothing."""
        if value is None:
            return None
        if self.choices and value not in self.choices:
            return f"{self.names}: must be one of {', '.join(self.choices)}, not {value!r}"
        for check in self.checks:
            problem = check.problem(value)
            if problem is not None:
                return f"{self.names}: {problem}"
        return None

    # -- describing ------------------------------------------------------------------------------

    def default_words(self) -> str:
        """The default for people (help and docs), without Markdown; "" when there is none."""
        if self.default_text:
            return self.default_text.replace("`", "")
        return _words(self) or ""

    def help_text(self) -> str:
        default = self.default_words()
        if default and self.default_note:
            default = f"{default}, {self.default_note}"
        env = f"{self.env}, one header per line" if self.kind == "lines" else self.env
        return f"{self.help}{f' (default {default})' if default else ''} [{env}]"


def _words(option: Option) -> str | None:
    value = option.default
    if option.kind == "switch":
        return "off"
    if value is None or value == ():
        return None
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# -- the table -----------------------------------------------------------------------------------

OPTIONS: tuple[Option, ...] = (
    Option(
        "upstream_url",
        "--upstream-url",
        None,
        "the upstream MCP server's streamable-HTTP endpoint (e.g. http://127.0.0.1:8000/mcp), "
        "instead of a command after `--`",
        "a streamable-HTTP upstream instead of a command after `--`",
        parse=text_or_none,
        secret=True,
        metavar="URL",
    ),
    Option(
        "upstream_headers",
        "--upstream-header",
        (),
        "an HTTP header sent with every request to --upstream-url, e.g. the upstream's own auth; repeatable",
        "sent with every upstream request",
        parse=parse_header,
        secret=True,
        kind="lines",
        metavar="'NAME: VALUE'",
        env="MCP_BACKFILL_UPSTREAM_HEADERS",
    ),
    Option(
        "mode",
        "--mode",
        "fallback",
        "when to answer sampling: fallback (only what the client lacks), always (every request), "
        "off (pure pass-through)",
        "when the proxy answers sampling (below)",
        choices=MODES,
    ),
    Option(
        "era",
        "--era",
        "auto",
        "protocol revisions offered to the client: auto (2026-07-28 and the handshake era) or handshake "
        "(answer server/discover with 'method not found' so clients fall back to initialize; for servers "
        "whose tools only sample through the handshake-era back-channel)",
        '`handshake` answers `server/discover` with "method not found" so clients fall back to '
        "`initialize` ([eras](../protocol-eras.md))",
        choices=ERAS,
    ),
    Option(
        "max_input_rounds",
        "--max-input-rounds",
        10,
        "2026-07-28: input_required rounds the proxy drives for one request before failing it",
        "2026-07-28: `input_required` rounds the proxy drives for one request before failing it with "
        "`-32603`",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
    ),
    Option(
        "input_stash_ttl",
        "--input-stash-ttl",
        300.0,
        "2026-07-28: seconds the proxy keeps its answers to a round while the client answers the rest",
        "2026-07-28: seconds the proxy keeps its answers to a mixed round while the client answers its part",
        parse=number,
        checks=(positive(),),
        metavar="SECONDS",
    ),
    Option(
        "task_ttl_max",
        "--task-ttl-max",
        3600.0,
        "longest a sampling task is kept (seconds): a server's requested ttl is lowered to this, and "
        "a task that asks for none gets it",
        "handshake era: the longest the proxy keeps a task-augmented sampling request and its answer; "
        "a server's requested `ttl` is lowered to this, a task that asks for none gets it",
        parse=number,
        checks=(positive(),),
        metavar="SECONDS",
    ),
    Option(
        "approve",
        "--approve",
        "never",
        "ask the user before a sampling request goes to Claude, through the client's elicitation: "
        "never, elicit (every request) or elicit-tools (requests that offer tools)",
        "ask the user, through the client's `elicitation/create`, before a sampling request goes to "
        "Claude: `never`, `elicit` (every request) or `elicit-tools` (requests that offer tools); see "
        "[approval](../approval.md)",
        choices=APPROVALS,
    ),
    Option(
        "approve_timeout",
        "--approve-timeout",
        300.0,
        "seconds an approval may take, the question's sending and the user's answer (and, in the "
        "handshake era, the wait for another open question) included, before refusing the request",
        "seconds from a sampling request's arrival until the user's answer to its approval question, "
        "the wait for another open question of the session and the question's sending included; "
        "then the request is refused as not approved",
        parse=number,
        checks=(positive(),),
        metavar="SECONDS",
    ),
    Option(
        "provider",
        "--provider",
        "anthropic",
        "who answers: anthropic (Claude API or a gateway), bedrock (Amazon Bedrock), "
        "vertex (Google Vertex AI) or mock (offline, deterministic)",
        "Claude API (or a gateway), Amazon Bedrock, Google Vertex AI, or the offline deterministic mock "
        "([Providers](../providers.md))",
        choices=PROVIDERS,
    ),
    Option(
        "model",
        "--model",
        "claude-sonnet-5-5",
        "model used when the server's modelPreferences do not decide; a model outside the default list, "
        "e.g. a Bedrock or Vertex id, pins it",
        "model used when `modelPreferences` do not decide; a model outside the default list (e.g. a "
        "Bedrock or Vertex id) pins it",
        metavar="MODEL",
    ),
    Option(
        "allowed_models",
        "--allowed-models",
        ("claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5"),
        "comma-separated models that modelPreferences may pick from; give one model to pin it",
        "what `modelPreferences` may choose from; one entry pins the model",
        parse=split_list,
        checks=(not_empty("must name at least one model"),),
        metavar="LIST",
    ),
    Option(
        "allow_model_upgrade",
        "--allow-model-upgrade",
        False,
        "let a server's modelPreferences pick an allowed model of a pricier family than --model "
        "(opus over sonnet over haiku); without it they can only pick the same family or a cheaper one",
        "let `modelPreferences` pick a pricier family than `--model` ([models](../limits.md#models))",
        kind="switch",
    ),
    Option(
        "max_tokens_cap",
        "--max-tokens-cap",
        16384,
        "a request's maxTokens above this is clamped to it",
        "a request's `maxTokens` is clamped to this (noted in the result `_meta`)",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
    ),
    Option(
        "max_messages",
        "--max-messages",
        1000,
        "most messages in one sampling request",
        "most messages in one sampling request",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
    ),
    Option(
        "max_text_bytes",
        "--max-text-bytes",
        4 * MIB,
        "most UTF-8 bytes of text (system prompt, messages, tool inputs and results, tool definitions) "
        "in one sampling request",
        "most UTF-8 bytes of text in one sampling request",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
    ),
    Option(
        "max_binary_bytes",
        "--max-binary-bytes",
        20 * MIB,
        "most decoded bytes of image, audio and document data in one sampling request",
        "most decoded image/audio/document bytes in one sampling request",
        parse=whole_number,
        checks=(at_least(0),),
        metavar="N",
    ),
    Option(
        "max_tools",
        "--max-tools",
        128,
        "most tools in one sampling request",
        "most tools in one sampling request",
        parse=whole_number,
        checks=(at_least(0),),
        metavar="N",
    ),
    Option(
        "max_tool_calls",
        "--max-tool-calls",
        16,
        "most tool calls in one Claude response",
        "most tool calls in one Claude response",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
    ),
    Option(
        "max_content_blocks",
        "--max-content-blocks",
        10_000,
        "most content blocks in one sampling request, those inside tool results included",
        "most content blocks in one sampling request, those inside tool results included",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
    ),
    Option(
        "rate_limit",
        "--rate-limit",
        600,
        "sampling requests per minute for this process, more are refused with -32603; 0 = no limit",
        "sampling requests per minute for the process; `0` = no limit",
        parse=whole_number,
        checks=(at_least(0),),
        metavar="N",
    ),
    Option(
        "max_concurrent_sampling",
        "--max-concurrent-sampling",
        4,
        "Claude calls in flight at once; more wait their turn",
        "Claude calls in flight at once; more wait their turn",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
    ),
    Option(
        "max_waiting_sampling",
        "--max-waiting-sampling",
        100,
        "sampling requests waiting for a Claude call slot, for the process and for each client "
        "identity; more are refused with -32603 at once",
        "sampling requests waiting for a Claude call slot, for the process and for each client "
        "identity; more are refused with `-32603` at once",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
    ),
    Option(
        "client_rate_limit",
        "--client-rate-limit",
        0,
        "sampling requests per minute for each client identity (serve); 0 = half of --rate-limit when "
        "clients are told apart (named tokens, forwarded Authorization), else --rate-limit",
        "sampling requests per minute for one client identity; `0` = half of `--rate-limit` when "
        "clients are told apart, else `--rate-limit` ([identities](../limits.md#who-pays))",
        parse=whole_number,
        checks=(at_least(0),),
        metavar="N",
        command="serve",
    ),
    Option(
        "client_max_concurrent_sampling",
        "--client-max-concurrent-sampling",
        0,
        "Claude calls in flight at once for each client identity (serve); 0 = half of "
        "--max-concurrent-sampling (rounded up) when clients are told apart, else all of it",
        "Claude calls in flight at once for one client identity; `0` = half of "
        "`--max-concurrent-sampling` (rounded up) when clients are told apart, else all of it",
        parse=whole_number,
        checks=(at_least(0),),
        metavar="N",
        command="serve",
    ),
    Option(
        "client_session_rate",
        "--client-session-rate",
        0,
        "upstream starts per minute for each client identity (serve): its new handshake-era "
        "sessions and its 2026-07-28 upstream's (re)starts together, more get 429; 0 = 60 when "
        "clients are told apart (named tokens, forwarded Authorization), else no limit",
        "upstream starts a minute for one client identity: its new handshake-era sessions and its "
        "2026-07-28 upstream's (re)starts, counted together (more get `429`); `0` = 60 when clients "
        "are told apart, else no limit",
        parse=whole_number,
        checks=(at_least(0),),
        metavar="N",
        command="serve",
    ),
    Option(
        "budget_tokens",
        "--budget-tokens",
        (),
        "tokens this process may spend, e.g. 2000000 (lifetime), 100000/day (per UTC hour, day or "
        "week) or both comma-separated; then sampling is refused",
        "tokens the whole process may spend: `N` (lifetime), `N/hour`, `N/day`, `N/week`, or several "
        "comma-separated ([budgets](../limits.md#budgets))",
        parse=budget,
        metavar="BUDGET",
        default_note="no limit",
    ),
    Option(
        "client_budget_tokens",
        "--client-budget-tokens",
        (),
        "tokens each client identity may spend (serve), in the same form as --budget-tokens; new "
        "sessions of a client never reset it",
        "tokens one client identity may spend, in the form of `--budget-tokens`",
        parse=budget,
        metavar="BUDGET",
        command="serve",
        default_note="no limit",
    ),
    Option(
        "session_budget_tokens",
        "--session-budget-tokens",
        (Allowance(5_000_000),),
        "tokens one client session (a 2026-07-28 client: one run of its upstream) may spend, in the "
        "same form as --budget-tokens; 0 = no limit",
        "tokens one client session may spend (a 2026-07-28 client's: one run of its upstream), in the "
        "form of `--budget-tokens`; `0` = no limit ([Budgets](../limits.md#budgets))",
        parse=budget,
        metavar="BUDGET",
        default_text="5000000",
    ),
    Option(
        "state_store",
        "--state-store",
        None,
        "where budgets, rate limits and client slots are counted: memory (this process), "
        "sqlite:///path/file.db (every process on this machine that uses the file) or "
        "redis://[:password@]host:6379/0 (every replica using that server; rediss:// for TLS)",
        "where budgets, rate limits and client slots are counted: `memory`, `sqlite:///path/file.db` "
        "(processes on one machine) or `redis://host:6379/0` (replicas) ([more than one "
        "replica](../replicas.md)); prefer the `_FILE` variable when it holds a password",
        parse=secret_or_none,
        secret=True,
        metavar="URL",
        default_text="memory",
    ),
    Option(
        "state_store_outage",
        "--state-store-outage",
        "refuse",
        "while a shared --state-store cannot be reached: refuse sampling (relaying goes on) or count "
        "locally in this process until it is back",
        "while the shared store is unreachable: `refuse` sampling, or count `local`ly meanwhile",
        choices=("refuse", "local"),
    ),
    Option(
        "state_store_timeout",
        "--state-store-timeout",
        2.0,
        "seconds to wait for the state store (connecting, or one operation) before it counts as down",
        "seconds to wait for the state store before it counts as unreachable",
        parse=number,
        checks=(positive(),),
        metavar="SECONDS",
    ),
    Option(
        "state_store_lease",
        "--state-store-lease",
        30.0,
        "seconds a shared store keeps a reservation or slot of a process that stopped renewing it "
        "(one that died)",
        "seconds a shared store keeps the reservations and slots of a process that died",
        parse=number,
        checks=(positive(),),
        metavar="SECONDS",
    ),
    Option(
        "request_state_key",
        "--request-state-key",
        None,
        "secret (32+ characters) shared by the replicas: 2026-07-28 mixed rounds then carry the "
        "proxy's answers sealed (AES-GCM) in the requestState instead of this process's memory, so a "
        "retry may reach any replica; prefer MCP_BACKFILL_REQUEST_STATE_KEY_FILE",
        "secret shared by replicas: mixed 2026-07-28 rounds carry the proxy's answers sealed in "
        "`requestState`, so any replica can take the retry; prefer the `_FILE` variable",
        parse=secret_or_none,
        secret=True,
        checks=(min_length(32),),
        metavar="SECRET",
        command="serve",
    ),
    Option(
        "audit_log",
        "--audit-log",
        None,
        "append one JSON line per sampling exchange to FILE (usage, latency, outcome; no content)",
        "append one JSON line per sampling exchange to `FILE`",
        parse=str,
        metavar="FILE",
    ),
    Option(
        "audit_content",
        "--audit-content",
        False,
        "also write each exchange's MCP params and result to the audit log",
        "also write each exchange's MCP params and result to the audit log",
        kind="switch",
    ),
    Option(
        "prompt_cache",
        "--no-prompt-cache",
        True,
        "do not mark prompt-cache breakpoints (cache_control) in Claude requests",
        "do not mark prompt-cache breakpoints in Claude requests",
        kind="switch",
        negated=True,
        default_note="caching on",
    ),
    Option(
        "warm_up",
        "--no-warm-up",
        True,
        "do not import and build the Claude client in the background from the client's initialize on "
        "(when the proxy is to answer its sampling), nor open its connection to the API ahead of the "
        "first request (a HEAD of the base URL, with no credentials); the first sampling request then "
        "waits for both (saves about 54 MB in sessions that never sample)",
        "do not get the Claude client ready (built and connected to the API) in the background from a "
        "backfilled client's initialize on (the first sampling request then waits seconds for it; "
        "saves about 54 MB where nothing samples)",
        kind="switch",
        negated=True,
        default_note="warm-up on",
    ),
    Option(
        "audio",
        "--audio",
        "reject",
        "audio content, which Claude cannot read: reject (-32602) or placeholder text",
        "audio content (Claude has no audio input): `-32602`, or a text placeholder",
        choices=AUDIO_POLICIES,
    ),
    Option(
        "max_message_bytes",
        "--max-message-bytes",
        32 * MIB,
        "largest JSON-RPC message accepted from either side",
        "largest JSON-RPC message accepted from either side",
        parse=whole_number,
        checks=(at_least(1024),),
        metavar="N",
    ),
    Option(
        "max_batch_messages",
        "--max-batch-messages",
        1000,
        "most messages in one JSON-RPC batch from either side; a larger batch is refused whole",
        "most messages in one JSON-RPC batch (an array, 2025-03-26) from either side; a larger batch "
        "from the client is refused as a whole with `-32600` (over HTTP: `400`), before any of it is "
        "relayed; one from the upstream is dropped as a whole, each request it answers failed with "
        "`-32603` and each request of the server's in it refused",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
    ),
    Option(
        "shutdown_grace",
        "--shutdown-grace",
        2.0,
        "seconds to wait at each shutdown step (stdin close, SIGTERM, SIGKILL)",
        "seconds between shutdown steps: stdin close → SIGTERM → SIGKILL (HTTP upstream: how long "
        "requests in flight may finish)",
        parse=number,
        checks=(not_negative(),),
        metavar="SECONDS",
    ),
    Option(
        "sampling_timeout",
        "--sampling-timeout",
        # Leaves room inside the 60 s that MCP SDK servers (and most others) wait for an answer.
        50.0,
        "seconds one sampling request may take, retries included, inside the 60 s MCP servers usually "
        "wait; 0 = no deadline",
        "deadline for one sampling request, retries included; `0` = none "
        "([Retries and deadlines](../limits.md#retries-and-deadlines))",
        parse=number,
        checks=(not_negative("0 turns the deadline off"),),
        metavar="SECONDS",
    ),
    Option(
        "retry_max_attempts",
        "--retry-max-attempts",
        6,
        "Claude API attempts per request on 429/529/5xx/connection errors; 1 = no retries",
        "Claude API attempts per request on transient failures; `1` = no retries",
        parse=whole_number,
        checks=(at_least(1, "1 = no retries"),),
        metavar="N",
    ),
    Option(
        "retry_base_delay",
        "--retry-base-delay",
        0.5,
        "first backoff in seconds, doubled per retry, jittered",
        "first backoff; doubled per retry, jittered",
        parse=number,
        checks=(not_negative(),),
        metavar="SECONDS",
    ),
    Option(
        "retry_max_delay",
        "--retry-max-delay",
        10.0,
        "longest wait between attempts, also the cap on retry-after",
        "longest wait between attempts, and the cap on a server's `retry-after`",
        parse=number,
        checks=(not_negative(),),
        metavar="SECONDS",
    ),
    Option(
        "api_headers",
        "--api-header",
        (),
        "extra HTTP header 'Name: value' on every Claude API call, e.g. for a gateway; repeatable; "
        "values are redacted from logs",
        "extra HTTP headers on every Claude API call, e.g. for a gateway; values are redacted from logs",
        parse=parse_header,
        secret=True,
        kind="lines",
        metavar="'NAME: VALUE'",
        env="MCP_BACKFILL_API_HEADERS",
    ),
    Option(
        "log_level",
        "--log-level",
        "info",
        "how much to log",
        "`debug`, `info`, `warning`, `error`",
        choices=LOG_LEVELS,
    ),
    Option(
        "log_format",
        "--log-format",
        "text",
        "text or json lines; logs always go to stderr",
        "logs go to stderr only, one line (or JSON object) per event",
        choices=LOG_FORMATS,
    ),
    # `mcp-backfill serve` only.
    Option(
        "host",
        "--host",
        "127.0.0.1",
        "address to listen on",
        "address to listen on",
        checks=(not_empty(),),
        metavar="HOST",
        command="serve",
    ),
    Option(
        "port",
        "--port",
        8080,
        "TCP port to listen on; 0 picks a free one",
        "TCP port; `0` picks a free one (the `serving streamable HTTP … port=N` log line says which)",
        parse=whole_number,
        checks=(between(0, 65535),),
        metavar="N",
        command="serve",
    ),
    Option(
        "auth_token",
        "--auth-token",
        None,
        "bearer token clients must send (Authorization: Bearer ...) on /mcp and /metrics; prefer the "
        "environment variable, command lines are visible to other users",
        "bearer token required on `/mcp` and `/metrics` (at least 16 characters); prefer the variable, "
        "command lines are visible to other users",
        parse=secret_or_none,
        secret=True,
        checks=(min_length(16),),
        metavar="TOKEN",
        command="serve",
    ),
    Option(
        "metrics_token",
        "--metrics-token",
        None,
        "bearer token /metrics needs instead of a client's: /metrics names every client and what it "
        "spent, which no client then reads; prefer the environment variable",
        "bearer token `/metrics` needs instead of a client's (at least 16 characters): `/metrics` names "
        "every client and what it spent, which no client then reads",
        parse=secret_or_none,
        secret=True,
        checks=(min_length(16),),
        metavar="TOKEN",
        command="serve",
    ),
    Option(
        "client_tokens",
        "--client-tokens",
        (),
        "named client credentials, name=token entries (one per line or comma-separated; # comments): "
        "each client authenticates with its own bearer token and gets its own budget, rate limit and "
        "slots; prefer MCP_BACKFILL_CLIENT_TOKENS_FILE",
        "named client credentials, `name=token` per line: each client its own bearer token and its own "
        "budget ([who pays](../limits.md#who-pays)); prefer the `_FILE` variable",
        parse=client_tokens,
        secret=True,
        metavar="ENTRIES",
        command="serve",
    ),
    Option(
        "allow_unauthenticated",
        "--allow-unauthenticated",
        False,
        "allow listening on a non-loopback address without --auth-token (when something in front of "
        "the proxy authenticates clients)",
        "allow a non-loopback `--host` without a token (when something in front authenticates clients)",
        kind="switch",
        command="serve",
    ),
    Option(
        "allowed_hosts",
        "--allowed-hosts",
        (),
        "comma-separated Host header values accepted on every path, /mcp, /healthz, /readyz and /metrics "
        "(DNS-rebinding protection); 'name:*' allows any port, '*' any host",
        "`Host` values accepted on every path (`/mcp`, `/healthz`, `/readyz`, `/metrics`); `name:*` allows "
        "any port, `*` any host",
        parse=split_list,
        metavar="LIST",
        command="serve",
        default_text="`localhost:PORT,127.0.0.1:PORT,[::1]:PORT`",
    ),
    Option(
        "allowed_origins",
        "--allowed-origins",
        (),
        "comma-separated Origin header values accepted on every path (and given CORS on /mcp, for browser "
        "pages); 'scheme://name:*' allows any port, '*' any origin; requests without Origin are always "
        "accepted",
        "`Origin` values accepted on every path (and given CORS on `/mcp`, for browser pages); requests "
        "without `Origin` are always accepted",
        parse=split_list,
        metavar="LIST",
        command="serve",
        default_text="`http://localhost:*,http://127.0.0.1:*,http://[::1]:*`",
        default_note="and without port",
    ),
    Option(
        "max_sessions",
        "--max-sessions",
        100,
        "concurrent upstreams: handshake sessions plus 2026-07-28 clients; more get HTTP 503",
        "concurrent upstreams (each one an upstream process, or with `--upstream-url` an upstream HTTP "
        "session or client): handshake-era sessions plus 2026-07-28 client identities, counted together; "
        "more get `503`",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
        command="serve",
    ),
    Option(
        "max_connections",
        "--max-connections",
        1000,
        "open HTTP connections at once; more are closed as soon as they are accepted",
        "open HTTP connections at once; more are closed at once",
        parse=whole_number,
        checks=(at_least(1),),
        metavar="N",
        command="serve",
    ),
    Option(
        "header_timeout",
        "--header-timeout",
        10.0,
        "seconds a connection may take to send a request's headers (from connecting, or from the "
        "previous response); then it is closed",
        "seconds to receive a request's headers; then the connection is closed",
        parse=number,
        checks=(positive(),),
        metavar="SECONDS",
        command="serve",
    ),
    Option(
        "body_timeout",
        "--body-timeout",
        30.0,
        "seconds a request may take to send its body; then it gets 408",
        "seconds to receive a request's body; then `408`",
        parse=number,
        checks=(positive(),),
        metavar="SECONDS",
        command="serve",
    ),
    Option(
        "session_idle_timeout",
        "--session-idle-timeout",
        1800.0,
        "seconds a session (or a 2026-07-28 client's upstream) may stay without any request in flight "
        "(one whose client dropped its connection does not count) before it and its upstream are "
        "closed; 0 never",
        "a session (or a 2026-07-28 client identity's upstream) with no HTTP request being served and no "
        "request in flight for that long (a request whose client dropped its connection and left does "
        "not count) is closed, and so is its upstream; `0` never",
        parse=number,
        checks=(not_negative("0 turns reaping off"),),
        metavar="SECONDS",
        command="serve",
    ),
    Option(
        "drain_timeout",
        "--drain-timeout",
        10.0,
        "on SIGTERM, SIGINT or SIGHUP, seconds to let requests in flight finish before the upstreams "
        "are stopped",
        "on SIGTERM, SIGINT or SIGHUP, how long requests in flight may take to finish",
        parse=number,
        checks=(not_negative(),),
        metavar="SECONDS",
        command="serve",
    ),
    Option(
        "forward_authorization",
        "--forward-authorization",
        False,
        "with --upstream-url: pass each HTTP client's own Authorization header on to the upstream, which "
        "authenticates clients (not combinable with --auth-token or --client-tokens)",
        "with `--upstream-url`: pass each client's own `Authorization` header on to the upstream, which "
        "authenticates clients (not with `--auth-token`/`--client-tokens`); `--upstream-header` adds fixed "
        "headers",
        kind="switch",
        command="serve",
    ),
)

BY_NAME: Mapping[str, Option] = {each.name: each for each in OPTIONS}
BY_FLAG: Mapping[str, Option] = {each.flag: each for each in OPTIONS}
DEFAULTS: Mapping[str, Any] = {each.name: each.default for each in OPTIONS}
"""`Config`'s defaults, by field name."""


# `--help` shows the options in these groups, in this order; every option is in exactly one.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "upstream",
        ("upstream_url", "upstream_headers", "shutdown_grace", "max_message_bytes", "max_batch_messages"),
    ),
    ("protocol", ("mode", "era", "max_input_rounds", "input_stash_ttl", "task_ttl_max")),
    ("approval", ("approve", "approve_timeout")),
    (
        "Claude",
        (
            "provider",
            "model",
            "allowed_models",
            "allow_model_upgrade",
            "api_headers",
            "prompt_cache",
            "warm_up",
            "audio",
            "sampling_timeout",
            "retry_max_attempts",
            "retry_base_delay",
            "retry_max_delay",
        ),
    ),
    (
        "limits per sampling request",
        (
            "max_tokens_cap",
            "max_messages",
            "max_text_bytes",
            "max_binary_bytes",
            "max_tools",
            "max_tool_calls",
            "max_content_blocks",
        ),
    ),
    (
        "rates, concurrency and budgets",
        (
            "rate_limit",
            "max_concurrent_sampling",
            "max_waiting_sampling",
            "client_rate_limit",
            "client_max_concurrent_sampling",
            "client_session_rate",
            "budget_tokens",
            "client_budget_tokens",
            "session_budget_tokens",
        ),
    ),
    (
        "shared state (replicas)",
        (
            "state_store",
            "state_store_outage",
            "state_store_timeout",
            "state_store_lease",
            "request_state_key",
        ),
    ),
    ("audit and logs", ("audit_log", "audit_content", "log_level", "log_format")),
    (
        "HTTP front (serve)",
        (
            "host",
            "port",
            "auth_token",
            "client_tokens",
            "metrics_token",
            "allow_unauthenticated",
            "forward_authorization",
            "allowed_hosts",
            "allowed_origins",
            "max_sessions",
            "max_connections",
            "header_timeout",
            "body_timeout",
            "session_idle_timeout",
            "drain_timeout",
        ),
    ),
)


FILE_FORM: frozenset[str] = frozenset(
    {
        "upstream_headers",
        "state_store",
        "request_state_key",
        "api_headers",
        "auth_token",
        "client_tokens",
        "metrics_token",
    }
)
"""The options whose variable may instead name a file holding the value, `<VARIABLE>_FILE`
(`config.SECRET_FILE_VARIABLES` adds the credentials that are variables only)."""


def option(name: str) -> Option:
    """The option that sets `Config.<name>`."""
    return BY_NAME[name]


def env_var(flag: str) -> str:
    """The environment variable of `flag`, e.g. to name both in an error message."""
    return BY_FLAG[flag].env


def named(flag: str) -> str:
    """`--flag / MCP_BACKFILL_FLAG`: an option as error messages name it."""
    return BY_FLAG[flag].names


SHUTTING_DOWN = "mcp-backfill is shutting down"


def shutting_down(what: str, flag: str, seconds: float) -> str:
    """What a request a stop cut short is told: the proxy is shutting down and `what`, within the
    time the option `flag` gave it (`seconds`, when it gave any)."""
    within = f" within {named(flag)} ({seconds:g}s)" if seconds > 0 else ""
    return f"{SHUTTING_DOWN} and {what}{within}"


def options_for(serve: bool) -> tuple[Option, ...]:
    """The options of `mcp-backfill serve` (its own first) or of `mcp-backfill`."""
    own = tuple(o for o in OPTIONS if o.command == "serve") if serve else ()
    return own + tuple(o for o in OPTIONS if o.command == "both")


def read_options(
    options: Iterable[Option], given: Mapping[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    """The fields set by a flag (`given`, by field name) or else by an environment variable.

    Options set by neither are left out: they keep `Config`'s defaults.
    """
    values: dict[str, Any] = {}
    for opt in options:
        raw = opt.raw(given.get(opt.name), environ)
        if raw is not None:
            values[opt.name] = opt.convert(raw)
    return values


# -- the options reference (docs/reference/options.md) ------------------------------------------

TABLES: Mapping[str, Command] = {"mcp-backfill": "both", "serve": "serve"}
REFERENCE = "docs/reference/options.md"
_BEGIN = (
    "<!-- options:{key} begin: generated by `python -m mcp_backfill.options --write " + REFERENCE + "` -->"
)
_END = "<!-- options:{key} end -->"


def markdown_table(command: Command) -> str:
    rows = ["| flag | env | default | meaning |", "|---|---|---|---|"]
    for opt in OPTIONS:
        if opt.command == command:
            cells = (_flag_cell(opt), _env_cell(opt), _default_cell(opt), opt.doc)
            rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def _flag_cell(opt: Option) -> str:
    argument = "|".join(opt.choices) if opt.choices else opt.metavar
    cell = f"`{opt.flag} {argument}`" if argument else f"`{opt.flag}`"
    return f"{cell} (repeatable)" if opt.kind == "lines" else cell


def _env_cell(opt: Option) -> str:
    cell = f"`{opt.env}` (one header per line)" if opt.kind == "lines" else f"`{opt.env}`"
    return f"{cell} or `{opt.env}_FILE` (a file holding the value)" if opt.name in FILE_FORM else cell


def _default_cell(opt: Option) -> str:
    words = _words(opt)
    if opt.default_text:
        cell = opt.default_text
    elif words is None:
        cell = "none"
    elif opt.kind == "switch":
        cell = words
    elif isinstance(opt.default, int) and opt.default >= MIB and opt.default % MIB == 0:
        cell = f"`{words}` ({opt.default // MIB} MiB)"
    else:
        cell = f"`{words}`"
    return f"{cell} ({opt.default_note})" if opt.default_note else cell


def sync_tables(text: str) -> str:
    """`text` with every generated table replaced by the table's current rendering."""
    for key, command in TABLES.items():
        begin, end = _BEGIN.format(key=key), _END.format(key=key)
        found = re.search(re.escape(begin) + r"\n.*?" + re.escape(end), text, re.DOTALL)
        if found is None:
            raise ValueError(f"the page has no {begin!r} ... {end!r} section")
        text = f"{text[: found.start()]}{begin}\n{markdown_table(command)}{end}{text[found.end() :]}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mcp_backfill.options`: print, check or rewrite the option tables of the reference page."""
    import argparse  # the documentation tool's own needs stay out of the proxy's startup
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="python -m mcp_backfill.options", description="The option reference, from the option table."
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the option tables")
    group.add_argument(
        "--write", metavar="PAGE", type=Path, help=f"regenerate the tables in PAGE ({REFERENCE})"
    )
    group.add_argument("--check", metavar="PAGE", type=Path, help="exit 1 if PAGE's tables are stale")
    args = parser.parse_args(argv)
    if args.markdown:
        for key, command in TABLES.items():
            # A documentation tool, not the proxy: its output is the tables themselves.
            sys.stdout.write(f"{_BEGIN.format(key=key)}\n{markdown_table(command)}{_END.format(key=key)}\n\n")
        return 0
    path: Path = args.write or args.check
    text = path.read_text(encoding="utf-8")
    fresh = sync_tables(text)
    if args.check:
        if fresh != text:
            sys.stderr.write(
                f"{path}: the option tables are stale; run python -m mcp_backfill.options --write {path}\n"
            )
            return 1
        return 0
    if fresh != text:
        path.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
