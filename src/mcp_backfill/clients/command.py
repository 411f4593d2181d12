"""`mcp-backfill clients list|wrap|unwrap`: the command line over `documents`, `entries`, `changes`.

An interactive command (stdout is the user's, unlike the proxy's stdio mode): results go to stdout,
warnings and errors to stderr. A change is all or nothing: every config file in scope is parsed
before any is written, and a malformed one stops the command with nothing changed.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from mcp_backfill.clients.catalog import client_names
from mcp_backfill.clients.changes import Change, Changed, Unrestored, apply_changes
from mcp_backfill.clients.documents import Document, Malformed, discover, load
from mcp_backfill.clients.entries import (
    KEY_FILE_VARIABLE,
    KEY_VARIABLE,
    Proxy,
    Skip,
    is_wrapped,
    unwrap,
    wrap,
)
from mcp_backfill.clients.listing import at, write_listing
from mcp_backfill.clients.masking import printable
from mcp_backfill.clients.platforms import OS_NAMES, OsName, current_os, layout

__all__ = ["main"]

PROG = "mcp-backfill clients"
DESCRIPTION = (
    "Find the MCP configs of Claude Desktop, Claude Code, Cursor, VS Code, Windsurf, Gemini CLI and "
    "Codex (user files and the project's), list their servers, and wrap them in mcp-backfill (or undo "
    "that). Files keep their comments and layout; each one changed gets a backup next to it."
)
EXAMPLES = """examples:
  mcp-backfill clients list
  mcp-backfill clients wrap weather --key-file ~/.config/anthropic.key --dry-run
  mcp-backfill clients wrap --all --client cursor --key-file ~/.config/anthropic.key
  mcp-backfill clients unwrap weather

`mcp-backfill clients COMMAND --help` describes each command's options."""
WRAP_EPILOG = (
    "Proxy options for the wrapped servers go after `--`, e.g. "
    "`mcp-backfill clients wrap weather --key-file ~/.config/anthropic.key -- --max-tokens-cap 2048`. "
    "Only servers that sample need wrapping; the others work as they are."
)


class UsageError(Exception):
    """Bad arguments: printed with the usage, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--client",
        action="append",
        choices=client_names(),
        help="only this client's files (repeatable; default: all)",
    )
    common.add_argument(
        "--os",
        choices=OS_NAMES,
        default=None,
        help="look where this operating system keeps the configs (default: this machine's)",
    )
    common.add_argument(
        "--home",
        metavar="DIR",
        help="the home directory to search (default: HOME; APPDATA, XDG_CONFIG_HOME and CODEX_HOME are "
        "honoured only without --home)",
    )
    common.add_argument(
        "--project",
        metavar="DIR",
        help="the project whose .mcp.json, .cursor/, .vscode/, .gemini/ and .codex/ configs to include "
        "(default: the current directory)",
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=textwrap.fill(DESCRIPTION, 88, break_on_hyphens=False),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="action", required=True, metavar="{list,wrap,unwrap}")
    listing = commands.add_parser(
        "list", parents=[common], help="each config file, its servers, and which are wrapped"
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    helps = {
        "wrap": "wrap the named servers (or --all) in mcp-backfill",
        "unwrap": "restore the named servers (or --all) as they were before `wrap`",
    }
    for action, summary in helps.items():
        sub = commands.add_parser(
            action,
            parents=[common],
            help=summary,
            usage=f"{PROG} {action} [OPTIONS] (NAME... | --all)"
            + (" [-- PROXY_OPTIONS...]" if action == "wrap" else ""),
            epilog=WRAP_EPILOG if action == "wrap" else None,
        )
        sub.add_argument("names", nargs="*", metavar="NAME", help="server names, as `list` shows them")
        sub.add_argument("--all", action="store_true", help="every server in the files found")
        sub.add_argument("--dry-run", action="store_true", help="print the changes as a diff; write nothing")
        if action == "wrap":
            key = sub.add_mutually_exclusive_group()
            key.add_argument(
                "--key-file",
                metavar="PATH",
                help=f"the wrapped servers read the Claude API key from this file ({KEY_FILE_VARIABLE})",
            )
            key.add_argument(
                "--write-key",
                action="store_true",
                help=f"write the key from {KEY_VARIABLE} into the configs (prefer --key-file)",
            )
            sub.add_argument(
                "--proxy-command",
                metavar="PATH",
                help="the mcp-backfill executable the wrapped entries start (default: this one)",
            )
    return parser


def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    argv = list(argv)
    proxy_options: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, proxy_options = argv[:split], argv[split + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if proxy_options and args.action != "wrap":
            raise UsageError("options after `--` are proxy options, for `wrap` only")
        return _run(args, proxy_options, environ, sys.stdout, sys.stderr)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    except (Changed, Unrestored) as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 1
    except (OSError, UnicodeError) as exc:  # a file that cannot be written (or encoded): none is
        sys.stderr.write(f"{PROG}: error: {exc}; no file was changed\n")
        return 1


def _run(
    args: argparse.Namespace, proxy_options: list[str], environ: Mapping[str, str], out: TextIO, err: TextIO
) -> int:
    os_name: OsName = args.os or current_os()
    home = Path(args.home).absolute() if args.home else None
    where = layout(os_name, home, environ)
    project = Path(args.project or os.getcwd()).absolute()
    locations = discover(where, project, tuple(args.client or ()))
    documents: list[Document] = []
    problems: list[str] = []
    for location in locations:
        try:
            documents.append(load(location))
        except Malformed as exc:
            problems.append(str(exc))
    if args.action == "list":
        write_listing(documents, problems, args.json, out)
        for problem in problems:
            err.write(f"{PROG}: error: {printable(problem)}\n")
        return 1 if problems else 0
    if not args.names and not args.all:
        raise UsageError(f"name the servers to {args.action}, or pass --all")
    if args.names and args.all:
        raise UsageError("give server names or --all, not both")
    if problems:
        for problem in problems:
            err.write(f"{PROG}: error: {printable(problem)}\n")
        err.write(f"{PROG}: error: fix the file above (or leave it out with --client); nothing was changed\n")
        return 1
    if args.action == "wrap":
        proxy = _proxy(args, proxy_options, environ)
        change: Callable[..., tuple[dict[str, Any], list[str]]] = functools.partial(
            wrap, proxy=proxy, resolve=_resolver(environ)
        )
    else:
        proxy = None
        change = unwrap
    writes_key = proxy is not None and KEY_VARIABLE in proxy.env
    changes, unknown = _changes(documents, args.names, change, err, writes_key)
    if unknown:
        err.write(
            f"{PROG}: error: no server named {', '.join(unknown)} in the files found "
            f"(`{PROG} list` shows them); nothing was changed\n"
        )
        return 1
    if not documents:
        err.write(
            f"{PROG}: error: no client config found; --home, --os and --project say where to look "
            "(docs/clients-command.md lists each client's files)\n"
        )
        return 1
    written = apply_changes(
        changes,
        args.dry_run,
        environ,
        out,
        writes_key=bool(getattr(args, "write_key", False)),
        err=sys.stderr,
    )
    verb = "wrapped" if args.action == "wrap" else "unwrapped"
    if not args.dry_run:
        out.write(f"{verb} {len(changes)} server(s) in {written} file(s)\n")
    other_provider = any(option.startswith("--provider") for option in proxy_options)
    if args.action == "wrap" and changes and proxy is not None and not proxy.env and not other_provider:
        err.write(
            f"note: the wrapped servers need the Claude API key: set {KEY_VARIABLE} where the client starts "
            f"them, or wrap again with --key-file PATH (unwrap first)\n"
        )
    return 0


def _changes(
    documents: list[Document],
    names: list[str],
    change: Callable[..., tuple[dict[str, Any], list[str]]],
    err: TextIO,
    writes_key: bool = False,
) -> tuple[list[Change], list[str]]:
    """The entries to rewrite, and the names not found. With `writes_key` (--write-key), a project's
    configs are left alone: they are made to be committed and shared, and the key would be in them."""
    changes: list[Change] = []
    seen: set[str] = set()
    for document in documents:
        dialect = document.location.client.dialect
        for table in document.tables():
            servers = at(document.value, table)
            for name, entry in servers.items():
                if names and name not in names:
                    continue
                seen.add(name)
                where = printable(f"{document.location.client.name} {name} ({document.location.path})")
                if not isinstance(entry, dict):
                    err.write(f"skipped {where}: it is not an object\n")
                    continue
                try:
                    new, warnings = change(entry, dialect)
                except Skip as exc:
                    err.write(f"skipped {where}: {exc}\n")
                    continue
                if writes_key and document.location.scope == "project" and new is not entry:
                    err.write(
                        f"skipped {where}: --write-key would put the API key in a project's config, "
                        "which is often committed and shared; wrap it with --key-file PATH\n"
                    )
                    continue
                for warning in warnings:
                    err.write(f"warning: {where}: {warning}\n")
                if new != entry or list(new) != list(entry):
                    changes.append(Change(document, table, name, new))
    return changes, [name for name in names if name not in seen]


def _resolver(environ: Mapping[str, str]) -> Callable[[str], str | None]:
    """A bare command name to the absolute path the user's PATH finds now."""

    def resolve(name: str) -> str | None:
        found = shutil.which(name, path=environ.get("PATH", os.defpath))
        return os.path.abspath(found) if found else None

    return resolve


def _proxy(args: argparse.Namespace, options: list[str], environ: Mapping[str, str]) -> Proxy:
    command, prefix = _own_command(args.proxy_command)
    env: dict[str, str] = {}
    if args.key_file:
        key_file = Path(args.key_file).expanduser().absolute()
        if not key_file.is_file():
            sys.stderr.write(
                f"warning: --key-file {key_file} does not exist (yet); the servers need it to start\n"
            )
        env[KEY_FILE_VARIABLE] = str(key_file)
        if environ.get(KEY_VARIABLE):
            sys.stderr.write(
                f"warning: {KEY_VARIABLE} is set here too: a client that passes its own environment to "
                f"its servers would set both it and {KEY_FILE_VARIABLE}, which the proxy refuses; "
                f"keep the key in one place\n"
            )
    elif args.write_key:
        key = environ.get(KEY_VARIABLE, "")
        if not key:
            raise UsageError(f"--write-key writes the key from {KEY_VARIABLE}, which is not set")
        env[KEY_VARIABLE] = key
    return Proxy(command, prefix, tuple(options), env)


def _own_command(explicit: str | None) -> tuple[str, tuple[str, ...]]:
    """The mcp-backfill that runs now, as an absolute path (a client's PATH may not have it); on
    this machine, whatever `--os` says about where the configs are."""
    if explicit:
        command = str(Path(explicit).expanduser().absolute())
        if not is_wrapped({"command": command}):
            raise UsageError(
                f"--proxy-command {explicit}: its name must be mcp-backfill (or mcp-backfill.exe), "
                "else `list` and `unwrap` cannot recognise the wrapped entries"
            )
        return command, ()
    script = Path(sys.argv[0])
    if script.name.lower().removesuffix(".exe") == "mcp-backfill" and script.is_file():
        return str(script.absolute()), ()
    sibling = Path(sys.executable).parent / (
        "mcp-backfill.exe" if sys.platform == "win32" else "mcp-backfill"
    )
    if sibling.is_file():
        return str(sibling), ()
    found = shutil.which("mcp-backfill")
    if found:
        return os.path.abspath(found), ()
    return sys.executable, ("-m", "mcp_backfill")
