"""Command line: flags (with `MCP_BACKFILL_*` environment fallbacks) -> `Config` -> run.

The flags, their variables, defaults and help all come from the option table (`options.OPTIONS`).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn
from urllib.parse import urlsplit

import anyio

from mcp_backfill import __version__, telemetry
from mcp_backfill.config import (
    PLATFORM_BASE_URL_VARIABLES,
    PLATFORM_SECRET_ENV_VARS,
    SECRET_FILE_VARIABLES,
    Config,
    Secret,
    custom_header_secrets,
    is_loopback,
    looks_like_a_placeholder,
    read_secret_files,
    secret_from_env,
    unknown_variables,
    upstream_environment,
)
from mcp_backfill.errors import ConfigError, StartupError
from mcp_backfill.logs import configure_logging, get_logger
from mcp_backfill.options import (
    DEFAULTS,
    GROUPS,
    OPTIONS,
    SERVE_COMMAND,
    Option,
    options_for,
    read_options,
)
from mcp_backfill.transports.child import HeldSignals, start_child

SERVE_USAGE = "mcp-backfill serve [OPTIONS] (--upstream-url URL | -- COMMAND [ARGS...])"
USAGE = f"mcp-backfill [OPTIONS] (--upstream-url URL | -- COMMAND [ARGS...])\n       {SERVE_USAGE}"
CHECK_COMMAND = "check"
CLIENTS_COMMAND = "clients"
DESCRIPTION = (
    "Run an MCP server behind a transparent proxy that answers its sampling/createMessage requests "
    "(including sampling with tools) with Claude, for clients that cannot sample. The server is a "
    "command the proxy starts (after `--`) or a streamable-HTTP endpoint (--upstream-url); the client "
    "talks to the proxy over stdio. Every option can also be set with the environment variable shown "
    "in brackets."
)
EPILOG = (
    "environment: ANTHROPIC_API_KEY, or ANTHROPIC_API_KEY_FILE naming a file that holds it (required by "
    "--provider anthropic; never logged, never passed to the upstream server), ANTHROPIC_BASE_URL (an API "
    "gateway or proxy in front of the Claude API). "
    "Bedrock: AWS_REGION, AWS_BEARER_TOKEN_BEDROCK or the usual AWS credentials. Vertex: CLOUD_ML_REGION, "
    "ANTHROPIC_VERTEX_PROJECT_ID, MCP_BACKFILL_VERTEX_ACCESS_TOKEN or Application Default Credentials. "
    "Each variable that holds a secret can instead name a file that holds it, with _FILE added to its name: "
    f"{', '.join(f'{name}_FILE' for name in SECRET_FILE_VARIABLES)}. "
    "`mcp-backfill serve --help` describes the streamable-HTTP front.\n\n"
    "examples:\n"
    "  mcp-backfill -- /usr/bin/python3 /abs/path/server.py      wrap a stdio server\n"
    "  mcp-backfill --provider mock -- npx -y some-server        offline, no key needed\n"
    "  mcp-backfill --upstream-url http://127.0.0.1:9000/mcp     wrap a streamable-HTTP server\n"
    "  mcp-backfill serve --port 8080 -- /abs/path/server        serve it over HTTP\n"
    "  mcp-backfill clients list                                 find and wrap client configs\n"
    "  mcp-backfill check -- /abs/path/server                    check a setup"
)
SERVE_ONLY = {opt.flag for opt in OPTIONS if opt.command == "serve"}
SERVE_ONLY_VARIABLES = {
    name
    for opt in OPTIONS
    if opt.command == "serve"
    for name in (opt.env, f"{opt.env}_FILE" if opt.env in SECRET_FILE_VARIABLES else "")
    if name
}


class _Parser(argparse.ArgumentParser):
    """argparse, with hints for the usual mistakes in its error messages."""

    def error(self, message: str) -> NoReturn:
        unrecognized = message.partition("unrecognized arguments: ")[2].split()
        serve_flags = [arg.split("=")[0] for arg in unrecognized if arg.split("=")[0] in SERVE_ONLY]
        serving = self.prog.endswith(SERVE_COMMAND)
        if unrecognized[:1] == [SERVE_COMMAND] and not serving:
            message += f"; `{SERVE_COMMAND}` comes first: {SERVE_USAGE}"
        elif serve_flags and not serving:
            message += f"; {serve_flags[0]} is an option of `mcp-backfill serve` (the HTTP front)"
        elif unrecognized and not unrecognized[0].startswith("-"):
            command = " ".join(unrecognized)
            message += f"; put `--` before the server command: {self.prog} [OPTIONS] -- {command}"
        super().error(message)


SERVE_DESCRIPTION = (
    "Serve an MCP server over streamable HTTP at /mcp, with sampling answered by Claude for clients that "
    "cannot sample. Every handshake-era client session gets its own upstream (a process, or an HTTP "
    "session with --upstream-url); the 2026-07-28 requests of one client identity share one. /healthz, "
    "/readyz and /metrics (Prometheus) are served next to /mcp. Every option can also be set with the "
    "environment variable shown in brackets."
)


def build_parser(serve: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mcp-backfill serve" if serve else "mcp-backfill",
        usage=SERVE_USAGE if serve else USAGE,
        description=textwrap.fill(SERVE_DESCRIPTION if serve else DESCRIPTION, 100),
        epilog="\n".join(
            textwrap.fill(part, 100) if not part.startswith("examples:") else part
            for part in EPILOG.split("\n\n")
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # one spelling per option: `check` reports where each setting came from
    )
    parser.add_argument("--version", action="version", version=f"mcp-backfill {__version__}")
    offered = {each.name: each for each in options_for(serve)}
    for title, names in GROUPS:
        members = [offered[name] for name in names if name in offered]
        if members:
            group = parser.add_argument_group(title)
            for each in members:
                _add_option(group, each)
    return parser


def _add_option(parser: argparse._ActionsContainer, each: Option) -> None:
    """Flags stay raw strings (None when absent): converting them is `Option.convert`'s job, so a
    flag and its environment variable are read, and refused, the same way."""
    kwargs: dict[str, Any] = {"dest": each.name, "default": None, "help": each.help_text()}
    if each.kind == "switch":
        kwargs.update(action="store_const", const="true")
    else:
        kwargs["metavar"] = each.metavar
        if each.kind == "lines":
            kwargs["action"] = "append"
        if each.choices:
            kwargs["choices"] = each.choices
    parser.add_argument(each.flag, **kwargs)


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """Flags win over `MCP_BACKFILL_*` variables, which win over defaults."""
    environ = read_secret_files(environ)
    argv = list(argv)
    serve = bool(argv) and argv[0] == SERVE_COMMAND
    if serve:
        argv = argv[1:]
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    args = build_parser(serve).parse_args(argv)
    values = read_options(options_for(serve), vars(args), environ)
    values.update(_model_choice(values))
    return Config(
        upstream_command=tuple(command),
        api_key=secret_from_env(environ, "ANTHROPIC_API_KEY"),
        api_base_url=environ.get("ANTHROPIC_BASE_URL") or None,
        platform_base_url=_platform_base_url(values, environ),
        vertex_access_token=secret_from_env(environ, "MCP_BACKFILL_VERTEX_ACCESS_TOKEN"),
        bedrock_api_key=secret_from_env(environ, "AWS_BEARER_TOKEN_BEDROCK"),
        platform_secrets=tuple(
            secret for name in PLATFORM_SECRET_ENV_VARS if (secret := secret_from_env(environ, name))
        )
        + custom_header_secrets(environ),
        telemetry_secrets=tuple(Secret(value) for value in telemetry.export_secrets(environ)),
        front="http" if serve else "stdio",
        **values,
    )


def _platform_base_url(values: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """The endpoint variable of the chosen platform, if set (an empty one is unset, as for the SDK)."""
    variable = PLATFORM_BASE_URL_VARIABLES.get(values.get("provider", DEFAULTS["provider"]))
    return (environ.get(variable) or None) if variable else None


def _model_choice(values: Mapping[str, Any]) -> dict[str, Any]:
    """`--model` and `--allowed-models` together: a model outside the default list (a provider-native
    id, say) is pinned unless a list is given; without `--model`, the default model if the list has
    it, else the list's first."""
    allowed: tuple[str, ...] = values.get("allowed_models", DEFAULTS["allowed_models"])
    explicit: str = values.get("model", "")
    if explicit and "allowed_models" not in values and explicit not in allowed:
        allowed = (explicit,)
    fallback = DEFAULTS["model"]
    model = explicit or (fallback if fallback in allowed else allowed[0] if allowed else "")
    return {"model": model, "allowed_models": allowed}


def event_loop_options() -> dict[str, Any]:
    """uvloop where it is installed (every platform but Windows): it cuts the relay's per-message cost."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def open_standard_descriptors() -> None:
    """Point stdin, stdout or stderr at the null device if this process was started without it
    (`2>&-`): otherwise the first pipe or socket made takes its number, and whatever is meant for
    it goes there (the logs into the upstream's stdin, the protocol into a socket)."""
    streams = ("stdin", "stdout", "stderr")
    for fd, name in enumerate(streams):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if null != fd:  # (it is the lowest free number: this one)
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)  # as it would have been: the upstream's stderr is ours
        if getattr(sys, name) is None:  # Python found it closed at start
            mode = "r" if fd == 0 else "w"
            setattr(sys, name, open(fd, mode, closefd=False, errors="backslashreplace"))  # noqa: SIM115


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the process exit status (the upstream's, when it ran).

    A `StartupError` ends the process with its own `exit_code`: a `ConfigError` (2) is printed as a
    usage error, the others (an upstream that cannot start: 127, an address in use: 1) are logged.
    """
    open_standard_descriptors()
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] in ([CHECK_COMMAND], [CLIENTS_COMMAND]):
        try:
            return _command(arguments[0], arguments[1:])
        except KeyboardInterrupt:  # Ctrl-C: the user knows; no traceback
            return 130
    try:
        config = parse_config(arguments, os.environ)
        configure_logging(config.log_level, config.log_format, config.secrets())
        _warn_about(config, os.environ)
        try:
            return _run(config)
        except BaseExceptionGroup as group:  # a task group around the start (the audit log's writer)
            error = _startup_error(group)
            if error is None:
                raise
            raise error from None
    except ConfigError as exc:  # also found once running: an unusable --audit-log file, a provider setup
        sys.stderr.write(f"mcp-backfill: error: {exc}\n")
        return exc.exit_code
    except StartupError as exc:
        get_logger().error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _startup_error(group: BaseExceptionGroup[BaseException]) -> StartupError | None:
    """The `StartupError` a task group wrapped (the audit log's writer, the store's upkeep run around
    the start of the upstream), when that is all the group holds; else None."""
    errors, rest = group.split(StartupError)
    if errors is None or rest is not None:
        return None
    first: BaseException = errors
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first if isinstance(first, StartupError) else None


def _command(name: str, arguments: list[str]) -> int:
    """`mcp-backfill check` or `mcp-backfill clients`, imported only then."""
    if name == CHECK_COMMAND:
        from mcp_backfill.doctor import main as check_main

        return check_main(arguments, parse_config)
    from mcp_backfill.clients.command import main as clients_main

    return clients_main(arguments)


def _warn_about(config: Config, environ: Mapping[str, str]) -> None:
    """Settings that are accepted but are probably not what the user meant."""
    log = get_logger()
    for name, close in unknown_variables(environ):
        hint = f"; did you mean {close}?" if close else ""
        log.warning(f"{name} is not a variable mcp-backfill reads{hint}")
    if config.provider == "anthropic" and config.api_key and looks_like_a_placeholder(config.api_key.value):
        log.warning(
            "ANTHROPIC_API_KEY looks like a placeholder, not a key from console.anthropic.com; "
            "sampling requests will be refused with an authentication error"
        )
    if config.front != "http":
        for name in sorted(SERVE_ONLY_VARIABLES & environ.keys()):
            log.warning(f"{name} is read by `mcp-backfill serve` only; the stdio wrapper ignores it")
    variable = PLATFORM_BASE_URL_VARIABLES.get(config.provider, "ANTHROPIC_BASE_URL")
    base = urlsplit(
        (config.api_base_url if config.provider == "anthropic" else config.platform_base_url) or ""
    )
    if config.provider != "mock" and base.scheme == "http" and not is_loopback(base.hostname or ""):
        log.warning(
            f"{variable} is a plain http:// URL on another machine: the credentials and every "
            "prompt cross the network unencrypted; use https:// unless that network is trusted"
        )


def _run(config: Config) -> int:
    """Run the front `config` asks for, imported only then (neither is light to import).

    The stdio wrapper starts its upstream command first, so that the server's own start (an
    interpreter, `npx`) runs beside the import of the relay and not after it; a stop signal that
    comes before the front watches them is held for it (`HeldSignals`)."""
    if config.front == "http":
        from mcp_backfill.sidecar.server import run_sidecar

        return anyio.run(run_sidecar, config, backend_options=event_loop_options())
    held = HeldSignals().install()
    started = None
    try:
        if config.upstream_command and config.upstream_url is None:
            started = start_child(
                config.upstream_command, upstream_environment(os.environ), config.shutdown_grace
            )
        from mcp_backfill.stdio_front import run_stdio_proxy

        return anyio.run(run_stdio_proxy, config, started, held, backend_options=event_loop_options())
    finally:
        if started is not None:
            started.discard(config.shutdown_grace)  # unless the front adopted it (and stopped it)
        held.restore()


if __name__ == "__main__":
    sys.exit(main())
