"""Files the proxy writes in a directory every user can write to (`/tmp`, on a shared machine): the
audit log (`--audit-log`, which `--audit-content` fills with prompts) is never another user's file
or a link another user planted there. Real processes; the other user is played by `chown`, so these
run as root (each test failed before its fix)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, proxy_env

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="playing another user needs chown (root)"
)

OTHER_USER = 4321
ECHO = [sys.executable, "-m", "tests.servers.echo_server"]


def shared_directory(tmp_path: Path) -> Path:
    """A directory like /tmp: anyone may create files in it, only their owner may remove them."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def run_wrapper(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_backfill", "--provider", "mock", *options, "--", *ECHO],
        input="",
        capture_output=True,
        text=True,
        env=proxy_env(),
        cwd=ROOT,
        timeout=60,
    )


def test_an_audit_log_another_user_planted_is_refused(tmp_path: Path) -> None:
    """Another user created the audit file first (0666, theirs): the proxy appended to it, so they
    read every exchange (and with --audit-content every prompt) and could rewrite the record."""
    shared = shared_directory(tmp_path)
    planted = shared / "audit.jsonl"
    planted.write_text("")
    os.chown(planted, OTHER_USER, OTHER_USER)
    planted.chmod(0o666)
    done = run_wrapper("--audit-log", str(planted))
    assert done.returncode == 2, done.stderr
    assert "--audit-log / MCP_BACKFILL_AUDIT_LOG" in done.stderr
    assert "another user" in done.stderr, done.stderr


def test_an_audit_log_link_another_user_planted_is_not_followed(tmp_path: Path) -> None:
    """A link planted at the audit path, pointing at a file of the proxy's user: the proxy created
    (or appended to) whatever the link named."""
    shared = shared_directory(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    target = victim / "created-by-the-proxy"
    link = shared / "audit.jsonl"
    link.symlink_to(target)
    os.lchown(link, OTHER_USER, OTHER_USER)
    done = run_wrapper("--audit-log", str(link))
    assert done.returncode == 2, done.stderr
    assert "--audit-log / MCP_BACKFILL_AUDIT_LOG" in done.stderr
    assert not target.exists()


def test_an_audit_log_of_its_own_in_a_shared_directory_is_used(tmp_path: Path) -> None:
    shared = shared_directory(tmp_path)
    mine = shared / "audit.jsonl"
    done = run_wrapper("--audit-log", str(mine))
    assert done.returncode == 0, done.stderr
    assert mine.stat().st_mode & 0o777 == 0o600
    again = run_wrapper("--audit-log", str(mine))  # existing, and the proxy's user's
    assert again.returncode == 0, again.stderr


def test_a_sqlite_ledger_in_a_directory_others_can_write_to_is_refused(tmp_path: Path) -> None:
    """`--state-store sqlite:///tmp/ledger.db`: another user could create the ledger (or the `-wal`
    and `-shm` files SQLite keeps beside it) first, 0666, and then rewrite what every budget has
    used (erase the spend, or fill the budget); the proxy used their file."""
    shared = shared_directory(tmp_path)
    planted = shared / "ledger.db"
    planted.write_bytes(b"")
    os.chown(planted, OTHER_USER, OTHER_USER)
    planted.chmod(0o666)
    done = run_wrapper("--state-store", f"sqlite://{planted}", "--budget-tokens", "1000")
    assert done.returncode == 2, done.stderr
    assert "--state-store / MCP_BACKFILL_STATE_STORE" in done.stderr
    assert "every user can write to" in done.stderr, done.stderr
    assert planted.read_bytes() == b""


def test_a_sqlite_ledger_in_another_users_directory_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_USER, OTHER_USER)
    done = run_wrapper("--state-store", f"sqlite://{theirs / 'ledger.db'}", "--budget-tokens", "1000")
    assert done.returncode == 2, done.stderr
    assert "--state-store / MCP_BACKFILL_STATE_STORE" in done.stderr
    assert f"uid {OTHER_USER}" in done.stderr, done.stderr
    assert not (theirs / "ledger.db").exists()


def test_a_sqlite_ledger_in_a_directory_shared_with_its_group_is_used(tmp_path: Path) -> None:
    """Another user's directory that a group of the proxy's user may write to: shared on purpose."""
    group = tmp_path / "group"
    group.mkdir()
    os.chown(group, OTHER_USER, os.getegid())
    group.chmod(0o2775)
    done = run_wrapper("--state-store", f"sqlite://{group / 'ledger.db'}", "--budget-tokens", "1000")
    assert done.returncode == 0, done.stderr


def test_a_sqlite_ledger_in_a_directory_of_its_own_is_used(tmp_path: Path) -> None:
    ledger = tmp_path / "private" / "ledger.db"  # created, as its directory is
    done = run_wrapper("--state-store", f"sqlite://{ledger}", "--budget-tokens", "1000")
    assert done.returncode == 0, done.stderr
