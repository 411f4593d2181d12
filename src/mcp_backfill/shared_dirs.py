"""Files the proxy writes where other users may create files too (`/tmp` on a shared machine).

In a directory every user can write to, another user can create the file first, or put a symbolic
link at its name: the proxy would then write into a file they read and rewrite, or into whatever
file of the proxy's user the link names. The kernel refuses both in sticky directories only when
`fs.protected_regular` and `fs.protected_symlinks` are set, which many systems (containers above
all) do not do. So there, the proxy opens its files without following a link, and uses a file only
when it is its user's (or the directory owner's, as the kernel allows) and has no other name: without
`fs.protected_hardlinks`, any user may hard-link a file of the proxy's user there. Elsewhere than POSIX
(Windows: a mode says nothing of other users) nothing is checked.
"""

from __future__ import annotations

import os
import stat

__all__ = ["NOFOLLOW", "foreign_file", "in_shared_directory", "link_refused", "unsafe_directory"]

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_POSIX = hasattr(os, "geteuid")


def in_shared_directory(path: str) -> os.stat_result | None:
    """The status of `path`'s directory when every user may write to it, else None."""
    if not _POSIX:
        return None
    try:
        status = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return None
    return status if status.st_mode & stat.S_IWOTH else None


def foreign_file(fd: int, directory: os.stat_result) -> str | None:
    """Why the file open as `fd`, in the shared `directory`, must not be used (None: it may)."""
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        return "it is not a regular file, in a directory every user can write to"
    if status.st_nlink > 1:  # a file of ours another user linked there (no `fs.protected_hardlinks`)
        return (
            f"it has {status.st_nlink} names (hard links), in a directory every user can write to: "
            "another user may have linked a file of yours there; use a path in a directory only you "
            "can write to"
        )
    if status.st_uid not in (os.geteuid(), directory.st_uid):
        return (
            f"another user (uid {status.st_uid}) owns it, in a directory every user can write to: "
            "they could read and rewrite what is written there; use a path in a directory only you "
            "can write to"
        )
    return None


def link_refused(path: str) -> str:
    """What to say when `path`, in a shared directory, is a symbolic link (not followed)."""
    return (
        f"{path} is a symbolic link in a directory every user can write to, which another user may "
        "have planted; it is not followed: use a path in a directory only you can write to"
    )


def unsafe_directory(directory: str) -> str | None:
    """Why files in `directory` could be another user's to create, read or replace (None: they
    could not, or it does not exist yet): every user can write to it, or another user owns it."""
    if not _POSIX:
        return None
    try:
        status = os.stat(directory)
    except OSError:
        return None
    if status.st_mode & stat.S_IWOTH:
        return f"{directory} is a directory every user can write to"
    if status.st_uid not in (os.geteuid(), 0) and not _shared_with_a_group_of_ours(status):
        return f"{directory} belongs to another user (uid {status.st_uid})"
    return None


def _shared_with_a_group_of_ours(status: os.stat_result) -> bool:
    """A directory another user owns but lets a group the proxy's user is in write to: shared on
    purpose (several users' processes counting against one ledger), not planted."""
    return bool(status.st_mode & stat.S_IWGRP) and status.st_gid in {os.getegid(), *os.getgroups()}
