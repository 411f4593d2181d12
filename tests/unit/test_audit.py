"""The audit log file: refused at startup when unusable, one flushed JSON line per record."""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_backfill.errors import ConfigError
from mcp_backfill.sampling.audit import AuditLog, AuditRecord

SECRET = "sk-ant-audit-SECRET-42"


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_unusable_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--audit-log / MCP_BACKFILL_AUDIT_LOG: "):
        AuditLog(str(tmp_path / "missing-dir" / "audit.jsonl"))
    with pytest.raises(ConfigError, match="--audit-log"):
        AuditLog(str(tmp_path))  # a directory


@pytest.mark.anyio
async def test_lines_are_written_while_running_and_flushed_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"earlier": true}\n')  # appended to, never truncated
    audit = AuditLog(str(path), secrets=[SECRET])
    async with audit.running():
        ok = AuditRecord(request_id=7, session="stdio", model="claude-x", tools=2)
        ok.usage = {"input_tokens": 3, "output_tokens": 4}
        ok.stop_reason = "end_turn"
        audit.record(ok, params={"secret": SECRET}, result={"role": "assistant"})
        for _ in range(50):  # the writer thread flushes without being asked to stop
            await anyio.sleep(0.02)
            if len(path.read_text().splitlines()) == 2:
                break
        assert len(lines(path)) == 2
        refused = AuditRecord(request_id="r-2", session="stdio")
        refused.fail(-32602, f"too many messages {SECRET}", {"limit": "max_messages"}, "refused")
        audit.record(refused)
        cancelled = AuditRecord(request_id=9, session=None)
        cancelled.cancelled = True
        audit.record(cancelled)
    earlier, first, second, third = lines(path)
    assert earlier == {"earlier": True}
    assert first["request_id"] == 7
    assert first["session"] == "stdio"
    assert (first["model"], first["tools"], first["stop_reason"], first["outcome"]) == (
        "claude-x",
        2,
        "end_turn",
        "answered",
    )
    assert first["usage"] == {"input_tokens": 3, "output_tokens": 4}
    assert isinstance(first["latency_ms"], int)
    assert first["ts"].endswith("Z")
    datetime.fromisoformat(first["ts"].replace("Z", "+00:00"))
    assert "params" not in first
    assert "result" not in first
    assert (second["outcome"], second["charged"], second["calls"]) == ("refused", None, 0)
    assert second["error"] == {"code": -32602, "message": "too many messages ***", "limit": "max_messages"}
    assert third["outcome"] == "cancelled"
    assert SECRET not in path.read_text()


@pytest.mark.anyio
async def test_content_only_with_audit_content_and_secrets_redacted(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path), include_content=True, secrets=[SECRET])
    async with audit.running():
        audit.record(
            AuditRecord(request_id=1, session="s"),
            params={"messages": [{"role": "user", "content": {"type": "text", "text": f"key {SECRET}"}}]},
            result={"content": {"type": "text", "text": "answer"}},
        )
    [entry] = lines(path)
    assert entry["params"]["messages"][0]["content"]["text"] == "key ***"
    assert entry["result"] == {"content": {"type": "text", "text": "answer"}}


@pytest.mark.anyio
async def test_a_full_queue_drops_and_counts_lines_instead_of_growing(tmp_path: Path) -> None:
    """The writer is not draining (the disk is stuck, or nothing started it): memory stays bounded."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path), include_content=True, queue_lines=3)
    for n in range(10):
        audit.record(AuditRecord(request_id=n, session="s"), params={"big": "x" * 1000})
    assert audit.dropped == 7
    async with audit.running():  # what was queued is still written
        pass
    assert [line["request_id"] for line in lines(path)] == [0, 1, 2]


@pytest.mark.anyio
async def test_a_lone_surrogate_is_written_escaped_and_the_writer_goes_on(tmp_path: Path) -> None:
    """A server's request id may be `"\\ud800"` (JSON allows it, the relay's decoder accepts it):
    UTF-8 has no form for it, and its line must not end the writer (and with it the proxy)."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path), include_content=True, secrets=[SECRET])
    async with audit.running():
        audit.record(AuditRecord(request_id=1, session="stdio"))
        audit.record(AuditRecord(request_id="\ud800", session="stdio"), params={"text": f"\udfff {SECRET}"})
        await anyio.sleep(0.2)
        audit.record(AuditRecord(request_id=3, session="stdio"))
    first, odd, last = lines(path)
    assert (first["request_id"], odd["request_id"], last["request_id"]) == (1, "\ud800", 3)
    assert odd["params"] == {"text": "\udfff ***"}
    assert audit.dropped == 0


@pytest.mark.anyio
async def test_lines_the_file_refuses_are_counted_and_the_writer_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: the rest of the batch is lost with the line that failed, and counted."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path))
    real_write, failing = audit._file.write, [True]

    def write(data: bytes) -> int:
        if failing[0]:
            raise OSError(28, "No space left on device")
        return real_write(data)

    monkeypatch.setattr(audit._file, "write", write)
    for n in range(3):  # queued before the writer starts: one batch
        audit.record(AuditRecord(request_id=n, session="s"))
    async with audit.running():
        for _ in range(50):
            await anyio.sleep(0.02)
            if audit.dropped == 3:
                break
        assert audit.dropped == 3
        failing[0] = False
        audit.record(AuditRecord(request_id="after", session="s"))
    assert [line["request_id"] for line in lines(path)] == ["after"]


@pytest.mark.anyio
async def test_a_new_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """With `--audit-content` it holds every prompt: not 0644 under the usual umask. A file that
    exists keeps the mode its owner gave it."""
    path, shared = tmp_path / "audit.jsonl", tmp_path / "shared.jsonl"
    shared.touch()
    shared.chmod(0o640)
    old = os.umask(0o022)
    try:
        audits = [AuditLog(str(path), include_content=True), AuditLog(str(shared), include_content=True)]
    finally:
        os.umask(old)
    for audit in audits:
        async with audit.running():
            pass
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(shared.stat().st_mode) == 0o640


@pytest.mark.anyio
async def test_a_moved_file_whose_path_cannot_be_opened_again_is_written_on(tmp_path: Path) -> None:
    """Rotation is followed by opening the path again; when that fails (its directory is gone) the
    lines still go to the file that is open, rather than being lost."""
    where = tmp_path / "logs"
    where.mkdir()
    path, moved = where / "audit.jsonl", tmp_path / "audit.jsonl.1"
    audit = AuditLog(str(path))
    async with audit.running():
        path.rename(moved)
        where.rmdir()
        audit.record(AuditRecord(request_id="after", session="s"))
    assert [line["request_id"] for line in lines(moved)] == ["after"]
    assert audit.dropped == 0


@pytest.mark.anyio
async def test_a_full_disk_loses_lines_once_and_closing_the_file_does_not_raise(tmp_path: Path) -> None:
    """`/dev/full` refuses every write. The file was buffered: a refused line stayed in the buffer,
    tried again with each later line (written after all once the disk had room, yet counted lost)
    and at the close, which raised `OSError` out of the writer (the stdio wrapper ended with a
    traceback instead of its exit summary)."""
    audit = AuditLog("/dev/full")
    async with audit.running():
        audit.record(AuditRecord(request_id=1, session="s"))
        audit.record(AuditRecord(request_id=2, session="s"))
    assert audit.dropped == 2


@pytest.mark.anyio
async def test_a_line_a_full_disk_cut_short_does_not_swallow_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path))
    real_write, calls = audit._file.write, [0]

    def write(data: memoryview) -> int:
        calls[0] += 1
        if calls[0] == 1:
            return real_write(data[:10])  # part of the first line, then the disk is full
        if calls[0] == 2:
            raise OSError(28, "No space left on device")
        return real_write(data)

    monkeypatch.setattr(audit._file, "write", write)
    async with audit.running():
        audit.record(AuditRecord(request_id="cut", session="s"))
        for _ in range(100):
            await anyio.sleep(0.02)
            if audit.dropped:
                break
        audit.record(AuditRecord(request_id="whole", session="s"))
    fragment, whole = path.read_text().splitlines()
    assert len(fragment) == 10
    assert json.loads(whole)["request_id"] == "whole"
    assert audit.dropped == 1


def planted_link(tmp_path: Path) -> tuple[Path, Path]:
    """A directory like /tmp, and a file of the proxy's user elsewhere (its shell profile, say)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    return shared / "audit.jsonl", victim


def test_a_hard_link_planted_in_a_shared_directory_is_refused(tmp_path: Path) -> None:
    """Where the kernel lets any user hard-link another's file (`fs.protected_hardlinks` unset, as
    in many containers), a link planted at the audit path in /tmp names a file of the proxy's user:
    its owner is the proxy's, so it was used, and every exchange appended to that file."""
    path, victim = planted_link(tmp_path)
    os.link(victim, path)
    with pytest.raises(ConfigError, match="link"):
        AuditLog(str(path))
    assert victim.read_text() == "mine\n"


@pytest.mark.anyio
async def test_a_hard_link_planted_after_rotation_is_not_followed(tmp_path: Path) -> None:
    """Rotation leaves the path free for a moment: a hard link planted there then was opened as the
    audit log's next file (the checks of a shared directory held at the start only in effect)."""
    path, victim = planted_link(tmp_path)
    moved = tmp_path / "audit.jsonl.1"
    audit = AuditLog(str(path))
    async with audit.running():
        path.rename(moved)
        os.link(victim, path)
        audit.record(AuditRecord(request_id="after", session="s"))
    assert victim.read_text() == "mine\n"
    assert [line["request_id"] for line in lines(moved)] == ["after"]
