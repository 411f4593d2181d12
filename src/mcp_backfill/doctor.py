"""`mcp-backfill check`: is this setup going to work? A report a user can paste into a bug report.

It reads the options exactly as the proxy would (flags, then `MCP_BACKFILL_*` variables, then
defaults; `*_FILE` variables read from their files) and prints each setting that is not a default
with where it came from, secrets masked. Then it tries the parts in turn: one cheap authenticated
call to the provider (counting the tokens of a one-word prompt costs nothing; not with `--mode
off`, which never calls it), and a real session through the proxy — `mcp-backfill` started with
the same options in front of the same upstream, an MCP SDK client doing the handshake — which
shows the server's name, version and protocol revision, and whether the proxy will answer
sampling for a client that declares what `--client-capabilities` says. Exit status 0 when every
part works, 1 when one does not, 2 for bad usage.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from mcp_backfill import __version__
from mcp_backfill.assembly import ledger_store, provider_settings
from mcp_backfill.config import PLATFORM_BASE_URL_VARIABLES, SECRET_FILE_VARIABLES, Config, unknown_variables
from mcp_backfill.credentials import hide_url_credentials, shown_args
from mcp_backfill.errors import ConfigError
from mcp_backfill.logs import Redactor
from mcp_backfill.options import DEFAULTS, SERVE_COMMAND, Option, Secret, named, option, options_for
from mcp_backfill.relay.capabilities import ClientProfile, proxy_answers
from mcp_backfill.transports.http_upstream.settings import display_url

CLIENT_CAPABILITIES: Mapping[str, dict[str, Any]] = {
    "none": {},
    "sampling": {"sampling": {}},
    "sampling-tools": {"sampling": {"tools": {}}},
}
CAPABILITIES_FLAG = "--client-capabilities"
USAGE = (
    "usage: mcp-backfill check [--client-capabilities none|sampling|sampling-tools] [OPTIONS] "
    "(--upstream-url URL | -- COMMAND [ARGS...])"
)
HELP_FLAGS = ("-h", "--help")
HELP = f"""{USAGE}

Check that a setup works, and print a report to paste into a bug report. The options are the
proxy's own, read as it reads them (flags, then MCP_BACKFILL_* variables, then defaults;
`mcp-backfill --help` lists them). The parts tried, in turn:
  configuration              each setting that is not a default, and where it came from (secrets
                             masked); MCP_BACKFILL_* variables that mcp-backfill does not read
  provider                   one authenticated call that costs nothing (counting the tokens of a
                             one-word prompt); not with --mode off, --provider mock or bedrock
                             (whose client counts no tokens)
  state store                opened and asked once, when --state-store names one
  session through the proxy  the proxy started with these options in front of the server, and an
                             MCP client's handshake and tools/list through it: the server's name,
                             version and protocol revision, and whether the proxy answers sampling
                             for a client that declares what --client-capabilities says

options:
  --client-capabilities none|sampling|sampling-tools
                             what the checking client declares it can do (default: none)
  -h, --help                 show this help and exit

Exit status: 0 when every part works, 1 when one does not, 2 for bad usage.

examples:
  mcp-backfill check -- /abs/path/server
  mcp-backfill check --provider mock --upstream-url http://127.0.0.1:9000/mcp
  mcp-backfill check --client-capabilities sampling -- npx -y some-server
"""
NOT_SERVE = (
    "mcp-backfill check: error: `check` tries the stdio wrapper, not `serve` (the HTTP front); run it "
    "without `serve` and its own options (--host, --port, --auth-token...) to check the provider and "
    "the upstream, then ask the running sidecar: GET /healthz"
)
KEY_PREFIX = "sk-ant-"  # every Anthropic API key's, public: the one part of a secret `check` shows
TIMEOUT = 30.0  # seconds for each part that talks to something
# What a report line shows escaped: every control character (line breaks too: a line of the report
# is one line) and the bidirectional overrides and isolates. The server's name and tools and the
# provider's errors come from elsewhere, and must not drive the terminal or add lines of their own.
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


ParseConfig = Callable[[Sequence[str], Mapping[str, str]], Config]


def main(argv: Sequence[str], parse_config: ParseConfig, environ: Mapping[str, str] = os.environ) -> int:
    """`parse_config`: the proxy's own reading of its options (the command line's)."""
    args = list(argv)
    declared = "none"
    options = args[: args.index("--") if "--" in args else len(args)]
    given = [at for at, arg in enumerate(options) if arg.partition("=")[0] == CAPABILITIES_FLAG]
    if given:  # `--client-capabilities VALUE` or `--client-capabilities=VALUE`
        at = given[0]
        _, equals, value = args[at].partition("=")
        width = 1 if equals else 2
        declared = value if equals else args[at + 1] if at + 1 < len(args) else ""
        del args[at : at + width]
    if any(arg in HELP_FLAGS for arg in options):  # before the server command's own `--help`
        sys.stdout.write(HELP)
        return 0
    if declared not in CLIENT_CAPABILITIES or not args:
        sys.stderr.write(f"{USAGE}\n`mcp-backfill check --help` describes it.\n")
        return 2
    if args[0] == SERVE_COMMAND:  # its session part would speak stdio to an HTTP server, and wait
        sys.stderr.write(f"{USAGE}\n{NOT_SERVE}\n")
        return 2
    try:
        config = parse_config(args, environ)
    except ConfigError as exc:
        sys.stdout.write(f"configuration: FAILED: {exc}\n")
        return 1
    except SystemExit as exc:  # argparse already said what is wrong
        return exc.code if isinstance(exc.code, int) else 2
    report = Report()
    report.section("mcp-backfill check")
    report.line(f"mcp-backfill {__version__}, Python {platform.python_version()}, {platform.platform()}")
    _configuration(report, args, config, environ)
    anyio.run(_provider, report, config)
    anyio.run(_store, report, config)
    anyio.run(_session, report, args, config, declared)
    report.section("result")
    report.line("OK: every part works" if not report.problems else f"{report.problems} problem(s) above")
    return 1 if report.problems else 0


class Report:
    """What `check` prints (to stdout: this command is not a proxy), and how many parts failed."""

    def __init__(self) -> None:
        self.problems = 0

    def section(self, title: str) -> None:
        sys.stdout.write(f"\n{title}\n" if title != "mcp-backfill check" else f"{title}\n")

    def line(self, text: str) -> None:
        sys.stdout.write(f"  {one_line(text)}\n")

    def fail(self, text: str) -> None:
        self.problems += 1
        self.line(f"FAILED: {text}")


def one_line(text: str) -> str:
    """`text` with each character of `_UNSHOWN` written as its escape (`\\x1b`, `\\n`, `\\u202e`)."""
    return _UNSHOWN.sub(lambda match: ascii(match.group())[1:-1], text)


def _configuration(report: Report, argv: Sequence[str], config: Config, environ: Mapping[str, str]) -> None:
    report.section("configuration (not defaults; secrets masked)")
    flags = set(argv[: argv.index("--")] if "--" in argv else argv)
    for opt in options_for(config.front == "http"):
        value = getattr(config, opt.name)
        source = _source(opt, flags, environ)
        if source == "default" and opt.name not in ("provider", "model", "mode"):
            continue
        report.line(f"{opt.flag} = {_shown(opt, value)}  ({source})")
    if config.provider == "anthropic":
        origin = "file ANTHROPIC_API_KEY_FILE" if environ.get("ANTHROPIC_API_KEY_FILE") else "environment"
        shown = "(not set)" if config.api_key is None else _masked(config.api_key.value)
        report.line(f"ANTHROPIC_API_KEY = {shown}  ({origin})")
        if config.api_base_url:
            report.line(f"ANTHROPIC_BASE_URL = {display_url(config.api_base_url)}  (environment)")
    for name, close in unknown_variables(environ):
        hint = f"; did you mean {close}?" if close else ""
        report.fail(f"{name} is not a variable mcp-backfill reads{hint}")


def _source(opt: Option, flags: set[str], environ: Mapping[str, str]) -> str:
    if opt.flag in flags or any(flag.startswith(opt.flag + "=") for flag in flags):
        return "flag"
    if opt.env in SECRET_FILE_VARIABLES and environ.get(f"{opt.env}_FILE"):
        return f"file {opt.env}_FILE"
    return f"environment {opt.env}" if environ.get(opt.env) else "default"  # empty: not set (`Option.raw`)


def _shown(opt: Option, value: Any) -> str:
    if opt.name == "upstream_url" and value:
        return display_url(value)
    if opt.name == "state_store" and isinstance(value, Secret):  # which store, without its password
        return hide_url_credentials(value.value)
    if isinstance(value, Secret):
        return _masked(value.value)
    if opt.secret and isinstance(value, tuple):  # headers, client tokens
        return f"({len(value)} set, values masked)"
    if isinstance(value, tuple):
        return ",".join(str(each) for each in value) or "(none)"
    return str(value if value is not None else DEFAULTS.get(opt.name))


def _masked(secret: str) -> str:
    """The length only; of an Anthropic key, also its public prefix (which tells a key from a token)."""
    length = f"({len(secret)} characters)"
    return f"{KEY_PREFIX}…{length}" if secret.startswith(KEY_PREFIX) else f"***{length}"


async def _provider(report: Report, config: Config) -> None:
    report.section(f"provider: {config.provider}")
    if config.mode == "off":  # Config asks for no key then: the provider is never called
        report.line("not tried: --mode off answers no sampling request (pure pass-through)")
        return
    if config.provider == "mock":
        report.line("offline mock provider: nothing to reach, no key needed (answers are canned)")
        return
    from mcp_backfill.providers.anthropic import (
        CREDENTIALS,
        CREDENTIALS_HOSTS,
        NoVertexProject,
        client_secrets,
        credentials_unreachable,
        failed_request,
        google_credentials_failed,
        load_vertex_credentials,
        name_not_resolved,
    )
    from mcp_backfill.providers.platforms import make_client

    try:
        client = make_client(provider_settings(config))
    except ConfigError as exc:
        report.fail(str(exc))
        return
    if config.provider == "bedrock":  # the SDK's Bedrock client refuses count_tokens before sending
        found = await _aws_credentials(report, config, client)
        await client.close()
        if not found:
            return
        report.line(
            "not tried: the Bedrock client cannot count tokens, the one call that costs nothing; "
            "the first sampling request shows whether the AWS credentials work"
        )
        return
    endpoint = PLATFORM_BASE_URL_VARIABLES.get(config.provider, "ANTHROPIC_BASE_URL")  # the SDK reads it
    network = f"; check {endpoint} and the network"
    try:
        with anyio.fail_after(TIMEOUT):
            await load_vertex_credentials(client)
            counted = await client.messages.count_tokens(
                model=config.model, messages=[{"role": "user", "content": "ping"}]
            )
        report.line(f"authenticated: {config.model} counted {counted.input_tokens} tokens in a test prompt")
    except TimeoutError:  # `fail_after`'s, which says nothing of itself
        report.fail(f"no answer from the Claude API in {TIMEOUT:g} s{network}")
    except Exception as exc:  # what the SDK raises, shown redacted (an endpoint's text may quote a key)
        status = getattr(exc, "status_code", None)
        credentials = CREDENTIALS.get(config.provider, "ANTHROPIC_API_KEY")
        hint = f"; check {credentials}" if status in (401, 403) else ""
        hint = network if status is None else hint
        if isinstance(exc, NoVertexProject):  # says the variable to set; nothing was sent
            hint = ""
        elif credentials_unreachable(exc) and name_not_resolved(exc):  # a typo in that host, say
            where = CREDENTIALS_HOSTS.get(config.provider, "where the credentials come from")
            hint = f"; that host name does not resolve: check {where} and this machine's DNS"
        elif credentials_unreachable(exc):  # the token endpoint, not Claude's, is out of reach
            hint = f"; check {credentials} and the network to where they come from"
        elif google_credentials_failed(exc):  # Claude's endpoint was never called
            hint = f"; check {credentials}"
        # Also what the client minted or sent itself (a Vertex token from Application Default
        # Credentials), which an endpoint's error may quote.
        extra = client_secrets(client, failed_request(exc))
        report.fail(f"{type(exc).__name__}: {_redacted(str(exc), config, extra)}{hint}")
    finally:
        await client.close()


async def _aws_credentials(report: Report, config: Config, client: Any) -> bool:
    """A Bedrock client that signs with SigV4 (no Bedrock API key): boto3 resolves its AWS
    credentials through the session the SDK signs with, as the first sampling request would (a
    role's are fetched from STS, which costs nothing), and where they came from is said, never
    they; False, failed with the settings to check, when there are none or they cannot be had."""
    from mcp_backfill.providers.anthropic import (
        CREDENTIALS,
        CREDENTIALS_HOSTS,
        aws_session,
        credentials_unreachable,
        name_not_resolved,
    )

    session = None if client.api_key is not None else aws_session(client)
    if session is None:  # a Bedrock API key, or an SDK that keeps its session elsewhere
        return True
    settings = CREDENTIALS["bedrock"]

    def resolve() -> Any:
        found = session.get_credentials()
        if found is None:
            from botocore.exceptions import NoCredentialsError  # type: ignore[import-untyped]

            raise NoCredentialsError()
        found.get_frozen_credentials()  # a role's, an SSO login's: fetched now
        return found

    try:
        with anyio.fail_after(TIMEOUT):
            found = await anyio.to_thread.run_sync(resolve, abandon_on_cancel=True)
    except TimeoutError:
        report.fail(
            f"no AWS credentials in {TIMEOUT:g} s; check {settings} and the network to where they come from"
        )
        return False
    except Exception as exc:  # botocore's own, redacted (an STS or SSO answer may quote a request)
        hint = f"; check {settings}"
        if credentials_unreachable(exc) and name_not_resolved(exc):
            where = CREDENTIALS_HOSTS["bedrock"]
            hint = f"; that host name does not resolve: check {where} and this machine's DNS"
        elif credentials_unreachable(exc):
            hint = f"; check {settings} and the network to where they come from"
        report.fail(f"{type(exc).__name__}: {_redacted(str(exc), config)}{hint}")
        return False
    report.line(f"AWS credentials found ({getattr(found, 'method', None) or 'by boto3'})")
    return True


async def _store(report: Report, config: Config) -> None:
    """The shared ledger store, when one is named: opened and asked once (the session after would
    otherwise fail as a whole, "Connection closed", with the reason on the proxy's stderr only)."""
    if config.state_store is None:
        return
    report.section(f"state store: {_shown(option('state_store'), config.state_store)}")
    fix = f"; check {named('--state-store')}"
    try:
        store = ledger_store(config)
    except ConfigError as exc:
        report.fail(str(exc))
        return
    try:
        with anyio.fail_after(TIMEOUT):
            await store.ping()
        report.line("answers: the ledger is kept there")
    except TimeoutError:
        report.fail(f"no answer in {TIMEOUT:g} s{fix} and the network")
    except Exception as exc:  # the store client's own, redacted of the URL's password
        report.fail(f"{type(exc).__name__}: {_redacted(str(exc), config)}{fix}")
    finally:
        await store.aclose()


def _redacted(text: str, config: Config, extra: tuple[str, ...] = ()) -> str:
    return Redactor(config.secrets() + extra).redact(text)[:300]


async def _session(report: Report, argv: Sequence[str], config: Config, declared: str) -> None:
    from mcp import Client, StdioServerParameters

    target = (
        display_url(config.upstream_url)
        if config.upstream_url
        else " ".join(shown_args(config.upstream_command))
    )
    report.section(f"session through the proxy: {one_line(target)}")
    command = [sys.executable, "-m", "mcp_backfill", *argv]
    env = {"MCP_BACKFILL_LOG_LEVEL": "warning", **os.environ}  # its problems, not its progress
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    try:
        with anyio.fail_after(TIMEOUT):
            async with Client(params, mode="legacy") as client:
                info = client.server_info
                name = f"{info.name} {info.version or ''}".strip() if info is not None else "(no serverInfo)"
                report.line(f"handshake done: {name}, protocol {client.protocol_version}")
                listed = await client.list_tools()
                report.line(f"tools: {', '.join(tool.name for tool in listed.tools) or '(none)'}")
    except TimeoutError:
        what = "a streamable-HTTP MCP endpoint" if config.upstream_url else "an MCP server that speaks stdio"
        report.fail(
            f"no answer from the server in {TIMEOUT:g} s (handshake and tools/list): is it {what}? "
            "(the proxy's own messages, on stderr, may say more)"
        )
        return
    except Exception as exc:
        cause: BaseException = exc
        while isinstance(cause, BaseExceptionGroup) and cause.exceptions:  # the first real cause
            cause = cause.exceptions[0]
        what = _redacted(str(cause), config) or "the session ended"
        report.fail(f"{type(cause).__name__}: {what} (the proxy's own messages, on stderr, say why)")
        return
    profile = ClientProfile.from_capabilities(CLIENT_CAPABILITIES[declared])
    plain = proxy_answers(config.mode, profile, {})
    tools = proxy_answers(config.mode, profile, {"tools": []})
    answers = (
        "answers every sampling request"
        if plain and tools
        else "answers the sampling requests that use tools; the client answers the rest"
        if tools
        else "leaves sampling to the client"
    )
    report.line(f"for a client declaring {declared!r}: the proxy (--mode {config.mode}) {answers}")
