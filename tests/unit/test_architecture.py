"""Rules about the shape of `src/` that a review would otherwise have to remember.

* A class longer than about 300 lines says in its docstring why it is long ("Long because …").
* Protocol names (methods, header names, media types, envelope keys) are written in
  `mcp_backfill.protocol` only; everything else refers to them by name.
* Nothing in `src/` prints, and only the stdio transport, the documentation tool
  (`python -m mcp_backfill.options`) and the interactive `mcp-backfill clients` command touch
  `sys.stdout` (stdout is the protocol of the stdio front).
* A message that names an option to fix something names its environment variable too (`named()`,
  `env_var()`), as a user who configures a container by its environment reads it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mcp_backfill import protocol
from mcp_backfill.options import BY_FLAG

SRC = Path(__file__).resolve().parents[2] / "src" / "mcp_backfill"
LONG_CLASS = 300
PROTOCOL_STRINGS = {
    value
    for name, value in vars(protocol).items()
    if name.isupper() and isinstance(value, str) and ("/" in value or "-" in value)
} - {protocol.STATELESS_VERSION, protocol.JSON_TYPE}  # a revision date and a MIME type are also plain data


# Usage lines, help and reports, where an option is shown as typed on the command line; and
# `--provider X:` prefixes, which say what failed rather than what fixes it.
FLAGS_AS_TYPED = {"cli.py", "doctor.py", "clients/command.py", "providers/platforms.py", "sidecar/server.py"}
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(SRC.rglob("*.py"))]


def test_long_classes_say_why() -> None:
    unexplained = []
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > LONG_CLASS and "Long because" not in (ast.get_docstring(node) or ""):
                    unexplained.append(f"{path.relative_to(SRC)}: {node.name} ({length} lines)")
    assert unexplained == []


def test_protocol_names_are_written_once() -> None:
    assert "notifications/cancelled" in PROTOCOL_STRINGS  # the rule below checks something
    repeated = []
    for path, tree in modules():
        if path.name == "protocol.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in PROTOCOL_STRINGS:
                repeated.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value!r}")
    assert repeated == []


def test_nothing_prints_to_stdout_by_accident() -> None:
    """No `print()` at all, and `sys.stdout` only where stdout is meant: the stdio transport, the
    documentation tool, whose output is the tables it prints, and `mcp-backfill clients` and
    `mcp-backfill check`, separate interactive commands that never run in the proxy's process."""
    on_purpose = {"transports/stdio.py", "options.py", "clients/command.py", "doctor.py"}
    found = []
    for path, tree in modules():
        where = str(path.relative_to(SRC))
        for node in ast.walk(tree):
            printing = (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
            )
            stdout = (
                isinstance(node, ast.Attribute)
                and node.attr == "stdout"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
                and where not in on_purpose
            )
            if printing or stdout:
                found.append(f"{where}:{getattr(node, 'lineno', '?')}")
    assert found == []


def test_no_import_cycle_between_packages() -> None:
    """No two packages (or top-level modules) of `mcp_backfill` import each other, even indirectly."""
    import grimp  # import-linter's import graph

    graph = grimp.build_graph("mcp_backfill")
    units = sorted(
        {".".join(module.split(".")[:2]) for module in graph.modules if module != "mcp_backfill"}
        | {
            ".".join(module.split(".")[:3])
            for module in graph.modules
            if module.count(".") >= 3  # subpackages such as transports.http_upstream
        }
    )
    assert "mcp_backfill.relay" in units
    cycles = [
        (a, b)
        for i, a in enumerate(units)
        for b in units[i + 1 :]
        if not b.startswith(a + ".")
        and not a.startswith(b + ".")
        and graph.chain_exists(importer=a, imported=b, as_packages=True)
        and graph.chain_exists(importer=b, imported=a, as_packages=True)
    ]
    assert cycles == []


def test_messages_naming_an_option_name_its_variable() -> None:
    """A string naming an option (not the option's bare name, passed on to be named) either names
    an `MCP_BACKFILL_*` variable or is built with `named()`/`env_var()`/`option()`."""
    unnamed = []
    for path, tree in modules():
        where = str(path.relative_to(SRC))
        if where in FLAGS_AS_TYPED or where == "options.py":
            continue
        skip = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # docstrings
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                skip.update(id(part) for part in ast.walk(node) if part is not node)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text, built = node.value, False
            elif isinstance(node, ast.JoinedStr):
                text = "".join(str(part.value) for part in node.values if isinstance(part, ast.Constant))
                calls = [getattr(c.func, "id", "") for c in ast.walk(node) if isinstance(c, ast.Call)]
                built = bool({"named", "env_var", "option"} & set(calls))
            else:
                continue
            flags = [flag for flag in FLAG.findall(text) if flag in BY_FLAG]
            if flags and text not in BY_FLAG and "MCP_BACKFILL_" not in text and not built:
                unnamed.append(f"{where}:{node.lineno}: {text[:60]!r}")
    assert unnamed == []
