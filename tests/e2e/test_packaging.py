"""The package as users get it: the sdist and wheel built with `python -m build`, checked by
`twine check`, the wheel installed into a fresh virtualenv (no dev tools), and that installation run:
`mcp-backfill --version`, and a stdio session from a real MCP SDK client through the installed
proxy to the example weather server, run by the fresh virtualenv's own Python.

Slow (a build and an install from the package index, or pip's cache): every test of this module
shares one build and one installation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
import trove_classifiers
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters

from mcp_backfill import __version__
from tests.harness import EXAMPLES, ROOT

pytestmark = [pytest.mark.timeout(900), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SRC = ROOT / "src" / "mcp_backfill"


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


def clean_env() -> dict[str, str]:
    """No variable that could make the installed proxy import this checkout or use a real key."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
        and not k.startswith(("ANTHROPIC_", "MCP_BACKFILL_"))
    }


def run(*argv: str | Path, cwd: Path, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(arg) for arg in argv], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    work = tmp_path_factory.mktemp("packaging")
    dist = work / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=work)
    [sdist] = dist.glob("*.tar.gz")
    [wheel] = dist.glob("*.whl")
    environment = work / "venv"
    venv.create(environment, with_pip=True)
    run(
        environment / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check", wheel, cwd=work
    )
    return Built(sdist, wheel, environment)


def test_twine_accepts_both_distributions(built: Built) -> None:
    out = run(sys.executable, "-m", "twine", "check", "--strict", built.sdist, built.wheel, cwd=built.venv)
    assert out.count("PASSED") == 2


def test_the_wheel_holds_the_package_its_data_and_its_metadata(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
        [metadata_name] = [name for name in names if name.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
        [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        scripts = wheel.read(entry_points).decode()
    sources = {f"mcp_backfill/{path.relative_to(SRC).as_posix()}" for path in SRC.rglob("*.py")}
    assert sources <= names, sorted(sources - names)
    assert "mcp_backfill/py.typed" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert not [name for name in names if name.startswith(("tests/", "examples/", "benchmarks/"))]
    assert "mcp-backfill = mcp_backfill.cli:main" in scripts

    assert metadata["Name"] == "mcp-backfill"
    assert metadata["Version"] == __version__
    assert metadata["License-Expression"] == "MIT"
    assert metadata["Requires-Python"] == ">=3.11"
    classifiers = metadata.get_all("Classifier") or []
    assert classifiers
    assert [c for c in classifiers if c not in trove_classifiers.classifiers] == []
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert {"otel", "bedrock", "vertex", "redis", "dev"} <= extras
    description = metadata.get_payload()
    assert isinstance(description, str)
    assert description.startswith("#")  # the README is the long description
    assert metadata["Description-Content-Type"] == "text/markdown"


def test_the_sdist_holds_what_a_rebuild_needs(built: Built) -> None:
    with tarfile.open(built.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "src/mcp_backfill/py.typed"} <= names
    assert {f"src/mcp_backfill/{path.relative_to(SRC).as_posix()}" for path in SRC.rglob("*.py")} <= names


def test_the_installed_command_reports_its_version(built: Built) -> None:
    out = run(built.bin / "mcp-backfill", "--version", cwd=built.venv)
    assert out.strip() == f"mcp-backfill {__version__}"
    where = run(
        built.bin / "python", "-c", "import mcp_backfill; print(mcp_backfill.__file__)", cwd=built.venv
    )
    assert Path(where.strip()).is_relative_to(built.venv)  # the installed copy, not this checkout
    # The fresh environment has the runtime dependencies and none of the development tools.
    installed = run(built.bin / "python", "-m", "pip", "list", "--format", "json", cwd=built.venv)
    packages = {entry["name"].lower() for entry in json.loads(installed)}
    assert {"mcp", "anthropic", "uvicorn"} <= packages
    assert not packages & {"pytest", "mypy", "ruff", "hypothesis", "build", "twine"}


@pytest.mark.anyio
async def test_a_stdio_session_through_the_installed_proxy_samples(built: Built) -> None:
    # The installed proxy wraps the example server, run by the fresh environment's own Python.
    server = [str(built.bin / "python"), str(EXAMPLES / "weather_server.py")]
    params = StdioServerParameters(
        command=str(built.bin / "mcp-backfill"),
        args=["--provider", "mock", "--", *server],
        env=clean_env(),
        cwd=str(built.venv),
    )
    async with Client(params, mode="legacy") as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert "summarize" in tools
        result = await client.call_tool("summarize", {"text": "Rain in the morning, sun in the afternoon."})
    assert not result.is_error
    [block] = result.content
    assert isinstance(block, types.TextContent)
    assert block.text.strip()
