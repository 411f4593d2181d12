"""Command line: flags (with `MCP_BACKFILL_*` environment fallbacks) -> `Config` -> run."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from mcp_backfill import __version__
from mcp_backfill.config import (
    AUDIO_POLICIES,
    DEFAULT_ALLOWED_MODELS,
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_HOST,
    DEFAULT_MAX_BINARY_BYTES,
    DEFAULT_MAX_CONCURRENT_SAMPLING,
    DEFAULT_MAX_MESSAGES,
    DEFAULT_MAX_TEXT_BYTES,
    DEFAULT_MAX_TOKENS_CAP,
    DEFAULT_MAX_TOOL_CALLS,
    DEFAULT_MAX_TOOLS,
    DEFAULT_MODEL,
    DEFAULT_PORT,
    DEFAULT_RATE_LIMIT,
    DEFAULT_RETRY_BASE_DELAY,
    DEFAULT_RETRY_MAX_ATTEMPTS,
    DEFAULT_RETRY_MAX_DELAY,
    DEFAULT_SAMPLING_TIMEOUT,
    DEFAULT_SESSION_BUDGET_TOKENS,
    ERAS,
    LOG_FORMATS,
    LOG_LEVELS,
    MODES,
    PLATFORM_SECRET_ENV_VARS,
    PROVIDERS,
    Config,
    Secret,
    env_name,
    parse_bool,
    parse_headers,
    parse_upstream_header,
    secret_from_env,
    split_list,
)
from mcp_backfill.errors import ConfigError
from mcp_backfill.logs import configure_logging, get_logger

T = TypeVar("T")

# Plural: the variable holds every header, one per line (the flag is given once per header).
API_HEADERS_ENV = "MCP_BACKFILL_API_HEADERS"
UPSTREAM_HEADERS_ENV = "MCP_BACKFILL_UPSTREAM_HEADERS"

SERVE_USAGE = "mcp-backfill serve [OPTIONS] (--upstream-url URL | -- COMMAND [ARGS...])"
USAGE = f"mcp-backfill [OPTIONS] (--upstream-url URL | -- COMMAND [ARGS...])\n       {SERVE_USAGE}"
SERVE_COMMAND = "serve"
DESCRIPTION = (
    "Run an MCP server behind a transparent proxy that answers its sampling/createMessage requests "
    "(including sampling with tools) with Claude, for clients that cannot sample. The server is a "
    "command the proxy starts (after `--`) or a streamable-HTTP endpoint (--upstream-url); the client "
    "talks to the proxy over stdio. Every option can also be set with the environment variable shown "
    "in brackets."
)
EPILOG = (
    "environment: ANTHROPIC_API_KEY (required by --provider anthropic; never logged, never passed to the "
    "upstream server), ANTHROPIC_BASE_URL (an API gateway or proxy in front of the Claude API). "
    "Bedrock: AWS_REGION, AWS_BEARER_TOKEN_BEDROCK or the usual AWS credentials. Vertex: CLOUD_ML_REGION, "
    "ANTHROPIC_VERTEX_PROJECT_ID, MCP_BACKFILL_VERTEX_ACCESS_TOKEN or Application Default Credentials. "
    "`mcp-backfill serve --help` describes the streamable-HTTP front."
)
SERVE_DESCRIPTION = (
    "Serve an MCP server over streamable HTTP at /mcp, with sampling answered by Claude for clients that "
    "cannot sample. Every handshake-era client session gets its own upstream process; 2026-07-28 "
    "requests share one. /healthz and /metrics (Prometheus) are served next to /mcp. Every option can "
    "also be set with the environment variable shown in brackets."
)


def build_parser(serve: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-backfill serve" if serve else "mcp-backfill",
        usage=SERVE_USAGE if serve else USAGE,
        description=SERVE_DESCRIPTION if serve else DESCRIPTION,
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"mcp-backfill {__version__}")

    def option(flag: str, help_text: str, env: str | None = None, **kwargs: Any) -> None:
        parser.add_argument(flag, default=None, help=f"{help_text} [{env or env_name(flag)}]", **kwargs)

    if serve:
        _add_serve_options(option)

    option(
        "--upstream-url",
        "the upstream MCP server's streamable-HTTP endpoint (e.g. http://127.0.0.1:8000/mcp), "
        "instead of a command after `--`",
        metavar="URL",
    )
    parser.add_argument(
        "--upstream-header",
        action="append",
        default=None,
        metavar="'NAME: VALUE'",
        help="an HTTP header sent with every request to --upstream-url, e.g. the upstream's own auth; "
        f"repeatable [{UPSTREAM_HEADERS_ENV}, one header per line]",
    )
    option(
        "--mode",
        "when to answer sampling: fallback (only what the client lacks, default), "
        "always (every request), off (pure pass-through)",
        choices=MODES,
    )
    option(
        "--era",
        "protocol revisions offered to the client: auto (2026-07-28 and the handshake era, default) "
        "or handshake (answer server/discover with 'method not found' so clients fall back to "
        "initialize; for servers whose tools only sample through the handshake-era back-channel)",
        choices=ERAS,
    )
    option(
        "--max-input-rounds",
        "2026-07-28: input_required rounds the proxy drives for one request before failing it (default 10)",
        metavar="N",
    )
    option(
        "--input-stash-ttl",
        "2026-07-28: seconds the proxy keeps its answers to a round while the client answers the rest "
        "(default 300)",
        metavar="SECONDS",
    )
    option(
        "--provider",
        "who answers: anthropic (Claude API or a gateway, default), bedrock (Amazon Bedrock), "
        "vertex (Google Vertex AI) or mock (offline, deterministic)",
        choices=PROVIDERS,
    )
    option(
        "--model",
        f"model used when the server's modelPreferences do not decide (default {DEFAULT_MODEL}); "
        "a model outside the default list, e.g. a Bedrock or Vertex id, pins it",
    )
    option(
        "--allowed-models",
        "comma-separated models that modelPreferences may pick from "
        f"(default {','.join(DEFAULT_ALLOWED_MODELS)}); give one model to pin it",
    )
    option(
        "--max-tokens-cap",
        f"a request's maxTokens above this is clamped to it (default {DEFAULT_MAX_TOKENS_CAP})",
        metavar="N",
    )
    option(
        "--max-messages",
        f"most messages in one sampling request (default {DEFAULT_MAX_MESSAGES})",
        metavar="N",
    )
    option(
        "--max-text-bytes",
        "most UTF-8 bytes of text (system prompt, messages, tool inputs and results, tool definitions) "
        f"in one sampling request (default {DEFAULT_MAX_TEXT_BYTES})",
        metavar="N",
    )
    option(
        "--max-binary-bytes",
        "most decoded bytes of image, audio and document data in one sampling request "
        f"(default {DEFAULT_MAX_BINARY_BYTES})",
        metavar="N",
    )
    option("--max-tools", f"most tools in one sampling request (default {DEFAULT_MAX_TOOLS})", metavar="N")
    option(
        "--max-tool-calls",
        f"most tool calls in one Claude response (default {DEFAULT_MAX_TOOL_CALLS})",
        metavar="N",
    )
    option(
        "--rate-limit",
        "sampling requests per minute for this process; more are refused with -32603 "
        f"(default {DEFAULT_RATE_LIMIT}; 0 = no limit)",
        metavar="N",
    )
    option(
        "--max-concurrent-sampling",
        f"Claude calls in flight at once; more wait their turn (default {DEFAULT_MAX_CONCURRENT_SAMPLING})",
        metavar="N",
    )
    option(
        "--budget-tokens",
        "input+output tokens this process may spend; then sampling is refused "
        f"(default {DEFAULT_BUDGET_TOKENS} = no limit)",
        metavar="N",
    )
    option(
        "--session-budget-tokens",
        "input+output tokens one client session may spend; then sampling is refused "
        f"(default {DEFAULT_SESSION_BUDGET_TOKENS}; 0 = no limit)",
        metavar="N",
    )
    option(
        "--audit-log",
        "append one JSON line per sampling exchange to FILE (usage, latency, outcome; no content)",
        metavar="FILE",
    )
    option(
        "--audit-content",
        "also write each exchange's MCP params and result to the audit log",
        action="store_const",
        const="true",
    )
    option(
        "--no-prompt-cache",
        "do not mark prompt-cache breakpoints (cache_control) in Claude requests",
        action="store_const",
        const="true",
    )
    option(
        "--audio",
        "audio content, which Claude cannot read: reject (-32602, default) or placeholder text",
        choices=AUDIO_POLICIES,
    )
    option(
        "--max-message-bytes",
        "largest JSON-RPC message accepted from either side (default 33554432)",
        metavar="N",
    )
    option(
        "--shutdown-grace",
        "seconds to wait at each shutdown step (stdin close, SIGTERM, SIGKILL; default 2)",
        metavar="SECONDS",
    )
    option(
        "--sampling-timeout",
        f"seconds one sampling request may take, retries included (default {DEFAULT_SAMPLING_TIMEOUT:g}, "
        "inside the 60 s MCP servers usually wait; 0 = no deadline)",
        metavar="SECONDS",
    )
    option(
        "--retry-max-attempts",
        f"Claude API attempts per request on 429/529/5xx/connection errors (default "
        f"{DEFAULT_RETRY_MAX_ATTEMPTS}; 1 = no retries)",
        metavar="N",
    )
    option(
        "--retry-base-delay",
        f"first backoff in seconds, doubled per retry, jittered (default {DEFAULT_RETRY_BASE_DELAY:g})",
        metavar="SECONDS",
    )
    option(
        "--retry-max-delay",
        f"longest wait between attempts, also the cap on retry-after (default {DEFAULT_RETRY_MAX_DELAY:g})",
        metavar="SECONDS",
    )
    option(
        "--api-header",
        "extra HTTP header 'Name: value' on every Claude API call, e.g. for a gateway; repeatable "
        "(environment: one header per line); values are redacted from logs",
        env=API_HEADERS_ENV,
        action="append",
        metavar="'NAME: VALUE'",
    )
    option("--log-level", "debug, info (default), warning or error", choices=LOG_LEVELS)
    option("--log-format", "text (default) or json lines; logs always go to stderr", choices=LOG_FORMATS)
    return parser


def _add_serve_options(option: Callable[..., None]) -> None:
    option("--host", f"address to listen on (default {DEFAULT_HOST})")
    option("--port", f"TCP port to listen on (default {DEFAULT_PORT}; 0 picks a free one)", metavar="N")
    option(
        "--auth-token",
        "bearer token clients must send (Authorization: Bearer ...) on /mcp and /metrics; "
        "prefer the environment variable, command lines are visible to other users",
        metavar="TOKEN",
    )
    option(
        "--allow-unauthenticated",
        "allow listening on a non-loopback address without --auth-token (when something in front "
        "of the proxy authenticates clients)",
        action="store_const",
        const="true",
    )
    option(
        "--forward-authorization",
        "with --upstream-url: pass each HTTP client's own Authorization header on to the upstream "
        "(off by default; never the sidecar's own --auth-token, which is checked and removed)",
        action="store_const",
        const="true",
    )
    option(
        "--allowed-hosts",
        "comma-separated Host header values accepted on /mcp (DNS-rebinding protection); 'name:*' allows "
        "any port, '*' any host (default: localhost, 127.0.0.1 and [::1] with the bound port)",
        metavar="LIST",
    )
    option(
        "--allowed-origins",
        "comma-separated Origin header values accepted on /mcp; 'scheme://name:*' allows any port, "
        "'*' any origin (default: http://localhost, http://127.0.0.1 and http://[::1], any port); "
        "requests without Origin are always accepted",
        metavar="LIST",
    )
    option("--max-sessions", "concurrent client sessions; more get HTTP 503 (default 100)", metavar="N")
    option(
        "--session-idle-timeout",
        "seconds a session may stay without any request in flight before it and its upstream process "
        "are closed (default 1800; 0 never)",
        metavar="SECONDS",
    )
    option(
        "--drain-timeout",
        "on SIGTERM/SIGINT, seconds to let requests in flight finish before the upstreams are stopped "
        "(default 10)",
        metavar="SECONDS",
    )


def _pick(
    value: str | None,
    environ: Mapping[str, str],
    flag: str,
    convert: Callable[[str], T],
    default: T,
    env: str | None = None,
) -> T:
    env = env or env_name(flag)
    raw = value if value is not None else environ.get(env)
    if raw is None or raw == "":
        return default
    try:
        return convert(raw)
    except ValueError:
        raise ConfigError(f"{flag} / {env}: invalid value {raw!r}") from None


def _boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _choice(choices: Sequence[str], flag: str) -> Callable[[str], Any]:
    def convert(raw: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{flag} / {env_name(flag)} must be one of {', '.join(choices)}, not {raw!r}")
        return raw

    return convert


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """Flags win over `MCP_BACKFILL_*` variables, which win over defaults."""
    argv = list(argv)
    serve = bool(argv) and argv[0] == SERVE_COMMAND
    if serve:
        argv = argv[1:]
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    args = build_parser(serve).parse_args(argv)
    allowed: tuple[str, ...] = _pick(
        args.allowed_models, environ, "--allowed-models", split_list, DEFAULT_ALLOWED_MODELS
    )
    explicit_model = _pick(args.model, environ, "--model", str.strip, "")
    allowed_given = bool(args.allowed_models or environ.get(env_name("--allowed-models")))
    if explicit_model and not allowed_given and explicit_model not in allowed:
        allowed = (explicit_model,)  # e.g. a provider-native id: pinned
    default_model = explicit_model or (
        DEFAULT_MODEL if DEFAULT_MODEL in allowed else allowed[0] if allowed else ""
    )
    header_lines: list[str] = (
        args.upstream_header
        if args.upstream_header is not None
        else environ.get(UPSTREAM_HEADERS_ENV, "").splitlines()
    )
    return Config(
        upstream_command=tuple(command),
        upstream_url=_pick(args.upstream_url, environ, "--upstream-url", str.strip, "") or None,
        upstream_headers=tuple(parse_upstream_header(line) for line in header_lines if line.strip()),
        mode=_pick(args.mode, environ, "--mode", _choice(MODES, "--mode"), "fallback"),
        era=_pick(args.era, environ, "--era", _choice(ERAS, "--era"), "auto"),
        max_input_rounds=_pick(args.max_input_rounds, environ, "--max-input-rounds", int, 10),
        input_stash_ttl=_pick(args.input_stash_ttl, environ, "--input-stash-ttl", float, 300.0),
        provider=_pick(args.provider, environ, "--provider", _choice(PROVIDERS, "--provider"), "anthropic"),
        model=default_model,
        allowed_models=allowed,
        max_tokens_cap=_pick(args.max_tokens_cap, environ, "--max-tokens-cap", int, DEFAULT_MAX_TOKENS_CAP),
        audio=_pick(args.audio, environ, "--audio", _choice(AUDIO_POLICIES, "--audio"), "reject"),
        max_messages=_pick(args.max_messages, environ, "--max-messages", int, DEFAULT_MAX_MESSAGES),
        max_text_bytes=_pick(args.max_text_bytes, environ, "--max-text-bytes", int, DEFAULT_MAX_TEXT_BYTES),
        max_binary_bytes=_pick(
            args.max_binary_bytes, environ, "--max-binary-bytes", int, DEFAULT_MAX_BINARY_BYTES
        ),
        max_tools=_pick(args.max_tools, environ, "--max-tools", int, DEFAULT_MAX_TOOLS),
        max_tool_calls=_pick(args.max_tool_calls, environ, "--max-tool-calls", int, DEFAULT_MAX_TOOL_CALLS),
        rate_limit=_pick(args.rate_limit, environ, "--rate-limit", int, DEFAULT_RATE_LIMIT),
        max_concurrent_sampling=_pick(
            args.max_concurrent_sampling,
            environ,
            "--max-concurrent-sampling",
            int,
            DEFAULT_MAX_CONCURRENT_SAMPLING,
        ),
        budget_tokens=_pick(args.budget_tokens, environ, "--budget-tokens", int, DEFAULT_BUDGET_TOKENS),
        session_budget_tokens=_pick(
            args.session_budget_tokens,
            environ,
            "--session-budget-tokens",
            int,
            DEFAULT_SESSION_BUDGET_TOKENS,
        ),
        audit_log=_pick(args.audit_log, environ, "--audit-log", str, None),
        audit_content=_pick(args.audit_content, environ, "--audit-content", _boolean, False),
        prompt_cache=not _pick(args.no_prompt_cache, environ, "--no-prompt-cache", _boolean, False),
        max_message_bytes=_pick(
            args.max_message_bytes, environ, "--max-message-bytes", int, 32 * 1024 * 1024
        ),
        shutdown_grace=_pick(args.shutdown_grace, environ, "--shutdown-grace", float, 2.0),
        log_level=_pick(args.log_level, environ, "--log-level", _choice(LOG_LEVELS, "--log-level"), "info"),
        log_format=_pick(
            args.log_format, environ, "--log-format", _choice(LOG_FORMATS, "--log-format"), "text"
        ),
        api_key=secret_from_env(environ, "ANTHROPIC_API_KEY"),
        api_base_url=environ.get("ANTHROPIC_BASE_URL") or None,
        api_headers=_pick(args.api_header, environ, "--api-header", parse_headers, (), API_HEADERS_ENV),
        sampling_timeout=_pick(
            args.sampling_timeout, environ, "--sampling-timeout", float, DEFAULT_SAMPLING_TIMEOUT
        ),
        retry_max_attempts=_pick(
            args.retry_max_attempts, environ, "--retry-max-attempts", int, DEFAULT_RETRY_MAX_ATTEMPTS
        ),
        retry_base_delay=_pick(
            args.retry_base_delay, environ, "--retry-base-delay", float, DEFAULT_RETRY_BASE_DELAY
        ),
        retry_max_delay=_pick(
            args.retry_max_delay, environ, "--retry-max-delay", float, DEFAULT_RETRY_MAX_DELAY
        ),
        vertex_access_token=secret_from_env(environ, "MCP_BACKFILL_VERTEX_ACCESS_TOKEN"),
        platform_secrets=tuple(
            secret for name in PLATFORM_SECRET_ENV_VARS if (secret := secret_from_env(environ, name))
        ),
        **(_serve_settings(args, environ) if serve else {}),
    )


def _serve_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """The `serve` fields of `Config`."""
    token = _pick(args.auth_token, environ, "--auth-token", str.strip, "")
    no_items: tuple[str, ...] = ()
    return {
        "front": "http",
        "host": _pick(args.host, environ, "--host", str.strip, DEFAULT_HOST),
        "port": _pick(args.port, environ, "--port", int, DEFAULT_PORT),
        "auth_token": Secret(token) if token else None,
        "allow_unauthenticated": _pick(
            args.allow_unauthenticated, environ, "--allow-unauthenticated", parse_bool, False
        ),
        "forward_authorization": _pick(
            args.forward_authorization, environ, "--forward-authorization", parse_bool, False
        ),
        "allowed_hosts": _pick(args.allowed_hosts, environ, "--allowed-hosts", split_list, no_items),
        "allowed_origins": _pick(args.allowed_origins, environ, "--allowed-origins", split_list, no_items),
        "max_sessions": _pick(args.max_sessions, environ, "--max-sessions", int, 100),
        "session_idle_timeout": _pick(
            args.session_idle_timeout, environ, "--session-idle-timeout", float, 1800.0
        ),
        "drain_timeout": _pick(args.drain_timeout, environ, "--drain-timeout", float, 10.0),
    }


def event_loop_options() -> dict[str, Any]:
    """uvloop where it is installed (every platform but Windows): it cuts the relay's per-message cost."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the process exit status (the upstream's, when it ran)."""
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"mcp-backfill: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_format, config.secrets())
    from mcp_backfill.errors import BindError, UpstreamStartError
    from mcp_backfill.sidecar.server import run_sidecar
    from mcp_backfill.stdio_front import run_stdio_proxy

    run = run_sidecar if config.front == "http" else run_stdio_proxy
    try:
        return anyio.run(run, config, backend_options=event_loop_options())
    except ConfigError as exc:  # found once running: an unusable --audit-log file, a provider setup
        print(f"mcp-backfill: error: {exc}", file=sys.stderr)
        return 2
    except UpstreamStartError as exc:
        get_logger().error(str(exc))
        return 127
    except BindError as exc:
        get_logger().error(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
