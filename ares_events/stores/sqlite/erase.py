"""Erasure in the SQLite backend: :class:`SQLiteErasure`, a mixin of
:class:`~ares_events.stores.sqlite.SQLiteRecorder`.

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

from ares_events.core.backend import EraseOutcome
from ares_events.core.events import ErasedPayloadRef, PayloadRef
from ares_events.core.lifecycle import OperationGate
from ares_events.errors import StoreClosed, StoreUnavailable

__all__ = ["SQLiteErasure"]

ERASE_PAYLOAD: Final = (
    "UPDATE ares_events SET payload = NULL, payload_ref = ? "
    "WHERE stream_id = ? AND version = ? AND position = ? AND hash = ? "
    # Only a row not erased yet: a second (concurrent) erasure matches nothing.
    "AND (payload_ref IS NULL OR instr(payload_ref, '\"erased\":true') = 0)"
)
# An erased reference holds no "key": it never counts as a user of the blob.
COUNT_BLOB_REFS: Final = "SELECT count(*) FROM ares_events WHERE payload_ref LIKE ?"


class SQLiteErasure:
    """``erase`` and ``scrubbing`` (a mixin: the recorder provides the attributes below)."""

    _gate: OperationGate
    _local: threading.local
    _serial: contextlib.AbstractContextManager[Any]
    _memory: bool
    _conn: Callable[[], sqlite3.Connection]
    _write: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
    describe: Callable[[], str]

    def erase(self, stream_id: str, version: int, position: int, event_hash: bytes,
              ref: ErasedPayloadRef, blob_key: str | None = None) -> EraseOutcome:  # fmt: skip
        """Erase one payload in one ``BEGIN IMMEDIATE`` transaction, scrubbed (docs/proofs.md).

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the database stayed locked or failed.
        """
        action = f"erase of stream {stream_id!r} version {version}"
        args = (ref.to_json().decode(), stream_id, version, position, event_hash)
        try:
            with self._gate.op(), self.scrubbing(), self._write() as c:
                if c.execute(ERASE_PAYLOAD, args).rowcount != 1:
                    return EraseOutcome(False)
                refs = 0
                if blob_key:
                    like = (PayloadRef.like_key(blob_key),)
                    refs = c.execute(COUNT_BLOB_REFS, like).fetchone()[0]
            return EraseOutcome(True, int(refs))
        except sqlite3.Error as exc:
            if self._gate.closed:
                raise StoreClosed(self.describe(), action) from exc
            raise StoreUnavailable(f"{action} in {self.describe()} failed: {exc}") from exc

    @contextlib.contextmanager
    def scrubbing(self) -> Iterator[None]:
        """This thread's deletes zero the freed bytes (``secure_delete`` on); at the end the
        WAL is checkpointed and truncated, so old bytes are in neither file (a reader holding
        old frames delays that to a later checkpoint). Reentrant: an erasure's steps
        (payload, snapshots, read models, record) all run inside one."""
        depth = getattr(self._local, "scrub", 0)
        if depth == 0:
            with self._gate.op(), self._serial:
                self._conn().execute("PRAGMA secure_delete = ON")
        self._local.scrub = depth + 1
        try:
            yield
        finally:
            self._local.scrub = depth
            if depth == 0:
                with contextlib.suppress(sqlite3.Error, StoreClosed), self._gate.op(), self._serial:
                    self._conn().execute("PRAGMA secure_delete = FAST")
                    if not self._memory:
                        self._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
