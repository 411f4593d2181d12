"""Reading the container files offline (no Docker engine here): Dockerfile, .dockerignore, compose.yaml,
and the option names the CLI really has, so the tests can hold the three against each other."""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mcp_backfill.cli import build_parser
from mcp_backfill.options import ENV_PREFIX, env_name
from tests.harness import ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE = ROOT / "compose.yaml"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper-case, e.g. "ENV"
    arguments: str  # the rest of the logical line, continuations joined
    stage: int  # index of the FROM this instruction belongs to

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form ENTRYPOINT/CMD; ValueError for the shell form."""
        return _json_array(self.arguments)


def _json_array(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"not exec form (a JSON array): {text!r}") from None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"not exec form (a JSON array of strings): {text!r}")
    return value


def parse_dockerfile(text: str) -> list[Instruction]:
    """Logical instructions: comments dropped, backslash continuations joined (the default escape)."""
    instructions: list[Instruction] = []
    pending = ""
    stage = -1
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue  # comment lines are dropped even inside a continuation, as Docker does
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical = (pending + line).strip()
        pending = ""
        keyword, _, arguments = logical.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, arguments.strip(), stage))
    if pending:
        raise ValueError("Dockerfile ends inside a line continuation")
    return instructions


def env_assignments(instruction: Instruction) -> dict[str, str]:
    """`ENV A=1 B="two words"` (or the legacy `ENV A value`) -> {"A": "1", "B": "two words"}."""
    tokens = shlex.split(instruction.arguments)
    if tokens and "=" not in tokens[0]:
        return {tokens[0]: " ".join(tokens[1:])}
    pairs = {}
    for token in tokens:
        name, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"ENV token without '=': {token!r}")
        pairs[name] = value
    return pairs


def healthcheck_command(instruction: Instruction) -> list[str]:
    """The exec-form command of `HEALTHCHECK [--option=...] CMD [...]`."""
    before, sep, command = instruction.arguments.partition("CMD ")
    if not sep or not all(token.startswith("--") for token in before.split()):
        raise ValueError(f"unexpected HEALTHCHECK: {instruction.arguments!r}")
    return _json_array(command.strip())


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(instruction.stage for instruction in instructions)
    return [instruction for instruction in instructions if instruction.stage == last]


def image_env(instructions: list[Instruction]) -> dict[str, str]:
    """Every ENV of the final stage (the image's environment, bar the base image's own)."""
    env: dict[str, str] = {}
    for instruction in final_stage(instructions):
        if instruction.keyword == "ENV":
            env.update(env_assignments(instruction))
    return env


def dockerignore_admits(patterns: list[str], path: str) -> bool:
    """Whether a build-context path survives .dockerignore (last matching pattern wins; a pattern
    matching a parent directory covers everything below it)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    admitted = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.removeprefix("!").strip("/")
        regex = fnmatch.translate(body).replace(".*", "[^/]*")
        if body.startswith("**/"):
            regex = "(.*/)?" + fnmatch.translate(body[3:]).replace(".*", "[^/]*")
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            admitted = negated
    return admitted


def dockerignore_patterns() -> list[str]:
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def cli_env_names(parser: argparse.ArgumentParser | None = None) -> set[str]:
    """Every `MCP_BACKFILL_*` name the CLI reads: `env_name()` of each long option (`serve` and any
    subcommands included), plus names an option's help announces in brackets (e.g. a plural list
    variable)."""
    names: set[str] = set()
    if parser is None:
        names |= cli_env_names(build_parser(serve=True))
        parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                names |= cli_env_names(subparser)
            continue
        names |= {env_name(flag) for flag in action.option_strings if flag.startswith("--")}
        names |= set(re.findall(rf"\b{ENV_PREFIX}[A-Z0-9_]+", action.help or ""))
    names.discard(env_name("--help"))
    names.discard(env_name("--version"))
    return names


def repo_path(path: str) -> Path:
    return ROOT / path
