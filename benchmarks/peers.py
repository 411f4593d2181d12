"""The bridges the proxy is compared with, each in its own virtualenv under `benchmarks/.peers/`.

`mcp-proxy` (PyPI) is the common Python stdio->HTTP bridge. It depends on an older `mcp` than
the proxy (1.x, with `httpx`), so it cannot share `.venv`: the first run that needs it creates
`benchmarks/.peers/mcp-proxy` and installs the pinned release there with pip, exactly as a user
would (no uvloop, which it does not depend on). Later runs reuse it; a changed pin reinstalls it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.procs import BENCH

PEERS = BENCH / ".peers"
MCP_PROXY_REQUIREMENT = "mcp-proxy==0.13.0"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_peer(name: str, requirement: str, progress: Callable[[str], None]) -> Path:
    """The virtualenv of one peer, created and filled on first use; returns its `bin/` directory."""
    venv = PEERS / name
    stamp = venv / f".installed-{requirement.replace('/', '_')}"
    if stamp.exists():
        return venv / "bin"
    progress(f"installing {requirement} into {venv.relative_to(BENCH.parent)} (first run only)")
    if not _venv_python(venv).exists():
        # The interpreter this virtualenv was made from, not the .venv's own python.
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
    for old in venv.glob(".installed-*"):
        old.unlink()
    subprocess.run(
        [
            str(_venv_python(venv)),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    stamp.touch()
    return venv / "bin"


def mcp_proxy_command(bin_dir: Path, port: int, upstream: Sequence[str]) -> list[str]:
    """`mcp-proxy` serving the stdio `upstream` over streamable HTTP at `http://127.0.0.1:PORT/mcp`.

    Quiet (`--log-level WARNING`: no access log line per request, as the sidecar has none), and
    the upstream gets this environment, as the sidecar passes its own on.
    """
    return [
        str(bin_dir / "mcp-proxy"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "WARNING",
        "--pass-environment",
        "--",
        *upstream,
    ]
