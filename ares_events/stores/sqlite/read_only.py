"""How a reader opens the store's file without leaving a file beside it (docs/cli.md, "Which
commands write"): :func:`reader_uri` chooses its URI, :class:`UnlockedRead` guards an
``immutable=1`` one and :func:`require_schema` probes a file before a store opens it.

It may import :mod:`ares_events.errors` and this package.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote

from ares_events.errors import StoreError, StoreNotFound, StoreUnavailable
from ares_events.stores.sqlite.sql import HAS_META_TABLE

__all__ = ["UnlockedRead", "file_uri", "reader_uri", "require_schema"]

# Longer than a file timestamp's tick (a jiffy on Linux, 1 to 10 ms): a file last changed
# longer ago than this gets a new mtime from any later write, however quick.
_SETTLE_NS: Final = 50_000_000
_TRIES: Final = 20
_PERMISSION: Final = (
    sqlite3.SQLITE_PERM,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_AUTH,
)


def file_uri(path: Path, mode: str) -> str:
    """The URI of the file at ``path`` with SQLite's ``mode`` (``rwc``, ``rw``, ``ro``)."""
    return f"file:{quote(str(path.absolute()))}?mode={mode}"


def _stamp(path: Path) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _beside(path: Path, suffix: str) -> bool:
    return os.path.lexists(f"{path}{suffix}")


@dataclass(frozen=True, slots=True)
class UnlockedRead:
    """A reader on ``immutable=1``, which takes no lock and reads the main file only: a
    writer that starts meanwhile writes a WAL it does not see, and its checkpoint rewrites
    pages under it (a torn read: an audit could report findings that are not there, or
    "ok" about rows it never read). :meth:`check` runs after every read, so no result
    leaves the store once the file differs from the one stamped before the first read."""

    path: Path
    where: str
    stamp: tuple[int, ...]

    def check(self) -> None:
        """Check that nothing wrote the file since it was stamped.

        Raises:
            StoreUnavailable: a writer started (a ``-wal``) or wrote: run it again (the
                next open reads through the writer's files, with locks).
        """
        try:
            same = _stamp(self.path) == self.stamp and not _beside(self.path, "-wal")
        except OSError:
            same = False
        if not same:
            raise StoreUnavailable(
                f"sqlite store {self.where} was written while read without locks (this "
                "user may not create its -wal and -shm): nothing read is reported; run it again"
            )


def reader_uri(path: Path, where: str) -> tuple[str, UnlockedRead | None]:
    """The URI a reader (whose connections run ``query_only``) opens ``path`` with, and the
    guard of an unlocked one. It creates no file it cannot remove: a ``mode=ro``
    connection to a WAL database creates the ``-wal``/``-shm`` it lacks, cannot remove
    them on close, and left in a writable folder they lock the store's owner out.

    Raises:
        StoreUnavailable: the file cannot be read this way (the message says why).
    """
    for _ in range(_TRIES):
        try:
            stamp = _stamp(path)  # before looking for a writer, so a later one changes it
        except OSError as exc:
            raise StoreUnavailable(f"cannot read sqlite store {where}: {exc.strerror}") from exc
        wal, shm = _beside(path, "-wal"), _beside(path, "-shm")
        # Through a writer's files, with locks. Never mode=rw here: closing last (the
        # writer died), it would checkpoint the WAL into the file and remove both.
        if (wal and shm) or _beside(path, "-journal"):
            return file_uri(path, "ro"), None
        if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
            return file_uri(path, "rw"), None  # what it creates, the last one removes
        # No -wal: the last writer checkpointed and closed, all is in the file. Read it
        # once its timestamps are a tick old, so that any write after the stamp shows.
        if not wal and abs(time.time_ns() - max(stamp[3:])) >= _SETTLE_NS:
            return file_uri(path, "ro&immutable=1"), UnlockedRead(path, where, stamp)
        time.sleep(_SETTLE_NS / 1e9)
    if wal:
        raise StoreUnavailable(
            f"cannot read sqlite store {where}: its -wal has no -shm, and one made by this "
            "user, who may not write the store (permission denied), would lock its owner "
            "out (a writer is starting: run it again; else the owner opening it once puts "
            "it right)"
        )
    raise StoreUnavailable(f"sqlite store {where} kept changing while waiting to read it")


def require_schema(path: Path, where: str, timeout: float) -> None:
    """Check that the file holds an ares-events store, on a query-only connection of its
    own (a file that is not ours stays untouched: a store's connections would switch it to
    WAL mode), opened as :func:`reader_uri` says.

    Raises:
        StoreNotFound: not a SQLite database, or one without the ares-events tables.
        StoreUnavailable: this user may not read it (the message says so), it stayed
            locked, or a writer wrote it while it was read without locks.
    """
    uri, unlocked = reader_uri(path, where)
    try:
        probe = sqlite3.connect(uri, uri=True, timeout=timeout)
        try:
            probe.execute("PRAGMA query_only = ON")
            found = probe.execute(HAS_META_TABLE).fetchone()[0]
        finally:
            probe.close()
    except sqlite3.DatabaseError as exc:
        if unlocked is not None:
            unlocked.check()  # a page torn by a writer is "run it again", not "not a database"
        raise _unreadable(exc, path, where) from exc
    if unlocked is not None:
        unlocked.check()
    if not found:
        raise StoreNotFound(where, "the file holds no ares-events tables (run `ares-events init`)")


def _unreadable(exc: sqlite3.DatabaseError, path: Path, where: str) -> StoreError:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # an extended code's primary one
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreUnavailable(f"sqlite store {where} is locked: {exc}")
    if code not in _PERMISSION:
        return StoreNotFound(where, f"not a SQLite database ({exc})")
    if not os.access(path, os.R_OK):
        return StoreUnavailable(f"cannot read sqlite store {where}: permission denied ({exc})")
    return StoreUnavailable(
        f"cannot read sqlite store {where}: permission denied beside it, to its -wal or "
        f"-shm ({exc})"
    )
