"""Writing entry changes into their files: a diff for `--dry-run` (credentials masked), else a
backup and an atomic write.

Every changed file is rendered, and every file is checked to still hold what was read, before the
new files are staged beside them and again once they are, just before the first one replaces its
file: a client that rewrote a file meanwhile (Claude Code rewrites ~/.claude.json while it runs)
keeps its change, and the command changes nothing.
"""

from __future__ import annotations

import copy
import difflib
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from mcp_backfill.clients.documents import Document
from mcp_backfill.clients.entries import KEY_VARIABLE
from mcp_backfill.clients.listing import at
from mcp_backfill.clients.masking import masked, printable

__all__ = ["BACKUP_SUFFIX", "Change", "Changed", "Unrestored", "apply_changes"]

BACKUP_SUFFIX = ".bak-mcp-backfill-"


class Changed(Exception):
    """A file changed on disk between reading and writing it (Claude Code rewrites ~/.claude.json
    while it runs): its change must not be lost. Exit status 1."""


class Unrestored(Exception):
    """A file could not be replaced after others had been, and one of those could not be given its
    backup back: the message names them. Exit status 1."""


@dataclass
class Change:
    """One entry to rewrite: where it is and its new value."""

    document: Document
    table: tuple[str, ...]
    name: str
    new: Any


def apply_changes(
    changes: list[Change],
    dry_run: bool,
    environ: Mapping[str, str],
    out: TextIO,
    writes_key: bool = False,
    err: TextIO | None = None,
) -> int:
    """Renders each changed file; prints its diff (dry run) or backs it up and writes it.

    With `writes_key` (`--write-key`), a file the key is written into is made its owner's only
    (0600 from 0644, say, as editors and most clients create their configs): on a shared machine
    every user could otherwise read the key. `err` is told of each such change."""
    by_document: dict[int, tuple[Document, Any]] = {}
    for change in changes:
        document, new = by_document.setdefault(
            id(change.document), (change.document, copy.deepcopy(change.document.value))
        )
        at(new, change.table)[change.name] = change.new
    secret = environ.get(KEY_VARIABLE, "")
    rendered = [(document, document.render(new)) for document, new in by_document.values()]
    if not dry_run:
        _check_unchanged([document for document, _ in rendered])
    if dry_run:
        # Both sides with their credentials masked (the entries' tokens and keys, header values, URL
        # passwords), each rendered into the file's text like the change itself.
        for document, new in by_document.values():
            path = document.location.path
            before = document.render(masked(document.value)).splitlines(keepends=True)
            after = document.render(masked(new)).splitlines(keepends=True)
            diff = difflib.unified_diff(before, after, str(path), str(path))
            shown = "".join(_printable_line(line) for line in diff)
            out.write(shown.replace(secret, "***") if secret else shown)
        return len(by_document)
    # Everything that can fail, for every file, before the first file is replaced: all or nothing.
    # A symbolic link stays one (the file it points to is written), and the new text goes to a
    # private temporary file of a name nobody can prepare (a link planted there is not followed).
    staged: list[tuple[Path, Path, Path, Path]] = []  # (as named, file, temporary, backup)
    try:
        for document, text in rendered:
            named = document.location.path
            private = writes_key and bool(secret) and secret in text
            staged.append((named, *_stage(Path(os.path.realpath(named)), text, private, err)))
        _check_unchanged([document for document, _ in rendered])  # again, once all is staged
    except BaseException:
        for _, _, temporary, backup in staged:
            temporary.unlink(missing_ok=True)
            backup.unlink(missing_ok=True)
        raise
    _replace_all(staged)
    for named, _, _, backup in staged:
        out.write(f"{printable(str(named))}: changed (backup: {printable(backup.name)})\n")
    return len(by_document)


def _replace_all(staged: list[tuple[Path, Path, Path, Path]]) -> None:
    """Moves each temporary file over its file; if one cannot be (on Windows, a file another
    program holds open), those already replaced get their backups (exact copies, owner and mode
    included) back, so that no file is changed, and the error is raised."""
    done: list[tuple[Path, Path]] = []
    try:
        for _, path, temporary, backup in staged:
            os.replace(temporary, path)
            done.append((path, backup))
            _sync_directory(path.parent)
    except BaseException:
        stuck: list[str] = []
        for path, backup in reversed(done):
            try:
                os.replace(backup, path)
            except OSError:
                stuck.append(f"{path} (its backup: {backup.name})")
        for _, path, temporary, backup in staged:
            temporary.unlink(missing_ok=True)
            if (path, backup) not in done:
                backup.unlink(missing_ok=True)
        if stuck:
            raise Unrestored(
                f"a file could not be replaced, and these stay changed: {', '.join(stuck)}"
            ) from None
        raise


def _printable_line(line: str) -> str:
    """A diff line with its control characters escaped (a comment may hold any), ending in one
    newline (CRLF lines keep their CR)."""
    body = line.removesuffix("\n")
    ending = "\r\n" if body.endswith("\r") else "\n"
    return printable(body.removesuffix("\r")) + ending


def _check_unchanged(documents: list[Document]) -> None:
    """`Changed` if a client rewrote one of the files since it was read."""
    for document in documents:
        if document.location.path.read_bytes() != document.text.encode("utf-8"):
            raise Changed(
                f"{document.location.path} changed while this ran; nothing was changed: run it again"
            )


def _stage(
    path: Path, text: str, private: bool = False, err: TextIO | None = None
) -> tuple[Path, Path, Path]:
    """A backup of `path` and its new content in a private temporary file next to it, both with
    the file's owner and mode (never readable by more people than it, even for a moment) and
    on disk before the file is replaced (a crash leaves the old file or the new one, whole).
    `private`: the new content holds the API key, and gets no permission for group or others."""
    status = path.stat()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    backup = path.with_name(f"{path.name}{BACKUP_SUFFIX}{stamp}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    descriptor = os.open(backup, flags, 0o600)  # a link planted at the name is not followed
    try:
        _fill(descriptor, path.read_bytes(), path, status)
        shutil.copystat(path, backup)
    except BaseException:
        backup.unlink(missing_ok=True)
        raise
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".mcp-backfill-tmp", dir=path.parent)
    temporary = Path(name)
    try:
        _fill(descriptor, text.encode("utf-8"), path, status)
        mode = stat.S_IMODE(status.st_mode)
        if not (private and mode & 0o077):
            shutil.copymode(path, temporary)
        else:  # never, even for a moment, readable by others with the key in it
            os.chmod(temporary, mode & 0o700)
            if err is not None:
                err.write(
                    f"note: {printable(str(path))} now holds the API key (--write-key): made readable by "
                    f"its owner only ({mode & 0o700:04o}, was {mode:04o})\n"
                )
    except BaseException:
        temporary.unlink(missing_ok=True)
        backup.unlink(missing_ok=True)
        raise
    return path, temporary, backup


def _fill(descriptor: int, data: bytes, path: Path, status: os.stat_result) -> None:
    """Gives a new private (0600) file the owner of `path` (`sudo` must not leave the user a config
    owned by root), writes `data` to it, and syncs it to disk."""
    with os.fdopen(descriptor, "wb") as stream:
        made = os.fstat(descriptor)
        if hasattr(os, "fchown") and (made.st_uid, made.st_gid) != (status.st_uid, status.st_gid):
            try:
                os.fchown(descriptor, status.st_uid, status.st_gid)
            except PermissionError as exc:
                raise PermissionError(
                    exc.errno,
                    f"cannot give the new {path.name} its owner (uid {status.st_uid}, "
                    f"gid {status.st_gid}): run this as that user",
                    str(path),
                ) from None
        stream.write(data)
        stream.flush()
        os.fsync(descriptor)


def _sync_directory(directory: Path) -> None:
    """Makes a rename in `directory` durable (POSIX; elsewhere, and on failure, a no-op)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
