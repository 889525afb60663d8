"""The clock of a cell on Citus (docs/scaling.md): positions from the coordinator, rows
committed in one phase on the worker.

It may import the core, :mod:`ares_events.errors` and the PostgreSQL backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar, Final

import psycopg
from psycopg import sql

from ares_events.core.backend import SealedEvent
from ares_events.errors import StoreUnavailable
from ares_events.stores.postgres.clock import Batches, ServerClock, Statement, event_row
from ares_events.stores.postgres.driver import relays_loss
from ares_events.stores.postgres.sql import SELECT_BOUND, Statements, render_for

__all__ = ["CitusClock"]

COORDINATOR_XID: Final = "SELECT pg_current_xact_id()::text::bigint"
COORDINATOR_NOTIFY: Final = "SELECT pg_notify(%s, %s)"
SELECT_LAST_BELOW: Final = (
    "SELECT coalesce(max(position), 0) FROM {s}.ares_events WHERE position < %s"
)
# The one-phase writes: router statements of plain VALUES (docs/scaling.md).
INSERT_EVENTS: Final = (
    "INSERT INTO {s}.ares_events (position, stream_id, version, event_id, type, module,"
    " payload, payload_ref, metadata, recorded_at, prev_hash, hash) VALUES {rows}"
)
EVENT_ROW: Final = "(%s, %s, %s, %s::uuid, %s, %s, %s, %s, %s, %s, %s, %s)"
UPSERT_HEADS: Final = (
    "INSERT INTO {s}.ares_streams (stream_id, version, head_hash) VALUES {rows}"
    " ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version,"
    " head_hash = excluded.head_hash"
)
HEAD_ROW: Final = "(%s, %s, %s)"
UPSERT_TRACKING: Final = (
    "INSERT INTO {s}.ares_tracking (name, position) VALUES (%s, %s)"
    " ON CONFLICT (name) DO UPDATE SET position = excluded.position"
)
ROWS_PER_INSERT: Final = 4096
"""Events per INSERT (12 parameters each; a statement takes at most 65,535)."""
COMMIT_FAILED: Final = "failed to commit transaction on "
"""Citus's warning when a worker's one-phase COMMIT failed (its outcome unknown)."""
WORKER_LOST: Final = (
    "terminating connection due to administrator command",
    "the database system is shutting down",
    "the database system is starting up",
    "server closed the connection unexpectedly",
    "connection to the remote node",
    # DDL (a read-model table), which Citus sends to every worker, over a connection it
    # cached to a worker that has restarted since: the next attempt opens a new one.
    "failure on connection marked as essential",
    # The one-phase commit on the worker failed as the worker went away: the outcome there
    # is unknown, so the append is not acknowledged.
    "could not commit transaction for shard",
)
"""What a worker's loss looks like when Citus relays it as another kind of error."""

_ONE_PHASE = True
"""False only to show the race (tests/stores/test_cells_citus_race.py) of the plain
server's ``INSERT ... SELECT`` writes, which Citus commits in two phases."""


class CitusClock(ServerClock):
    """Positions and visibility from the coordinator, rows committed on the worker in one
    phase before the coordinator's transaction ends (docs/scaling.md).

    Args:
        q: the statements of the cell's schema.
    """

    predict_heads: ClassVar[bool] = False
    """The one-statement fast path would take its xid on the worker (and Citus refuses a
    volatile function in RETURNING): every append takes the locked path."""
    xid_statements: ClassVar[tuple[Statement, ...]] = (
        (sql.Composed([sql.SQL(COORDINATOR_XID)]), None, "one"),
    )
    bound: ClassVar[sql.Composed | None] = sql.Composed([sql.SQL(SELECT_BOUND)])
    lost: ClassVar[tuple[str, ...]] = WORKER_LOST
    """A read-model transaction or a read that loses a worker fails as an append does."""

    @classmethod
    def check_schema(cls, conn: Any, schema: str, where: str) -> None:
        """Any schema: a distributed one is what this clock orders."""

    def __init__(self, q: Statements) -> None:
        super().__init__(q)
        self._s = sql.Identifier(q.schema)
        self.all, self.all_range, self.all_from = self.below
        self.positions = self.positions_below
        self.last = self._render(SELECT_LAST_BELOW)
        self._tracking = self._render(UPSERT_TRACKING)
        self._inserts: dict[int, sql.Composed] = {}
        self._heads: dict[int, sql.Composed] = {}

    def _render(self, text: str) -> sql.Composed:
        return render_for(self._s, text)

    def xid(self, own: int, got: list[Any]) -> int:
        """The coordinator's xid (the last statement of the first round trip), not the
        worker's."""
        return int(got[-1][0])

    @contextlib.contextmanager
    def writing(self, conn: Any, where: str) -> Iterator[None]:
        """Around an append's transaction: Citus's warning that a worker's commit failed,
        or a worker lost while the transaction ran (Citus relays the worker's own error,
        not always as a connection error), means the outcome is unknown or nothing was
        written: either way the append is not acknowledged and may be tried again.

        Raises:
            StoreUnavailable: either happened (append the same events again).
        """
        failed: list[str] = []

        def on_notice(d: Any) -> None:
            msg = d.message_primary or ""
            if d.severity_nonlocalized == "WARNING" and msg.startswith(COMMIT_FAILED):
                failed.append(msg)

        conn.add_notice_handler(on_notice)
        try:
            yield
        except psycopg.Error as exc:
            if (exc.sqlstate or "")[:2] not in ("08", "57") and not relays_loss(exc, WORKER_LOST):
                raise
            failed.append(" ".join(str(exc).split()))
        finally:
            conn.remove_notice_handler(on_notice)
        if failed:
            raise StoreUnavailable(
                f"append to {where}: a worker of the cell failed during the append "
                f"({failed[0]}); it may or may not be stored: append the same events again "
                "(appends are idempotent) to find out"
            )

    def write_many(
        self, xid: int, batches: Batches, tracking: tuple[str, int] | None, channel: str | None
    ) -> tuple[Statement, ...]:
        """Every batch's events, the heads and the tracking row in router statements, the
        wake-up on the coordinator."""
        rows = [(sid, s) for sid, _, ss in batches for s in ss]
        end = xid * 65536 + len(rows) - 1
        if not _ONE_PHASE:
            return (*super().write_many(xid, batches, tracking, None), *_wakeup_at(channel, end))
        heads = [v for sid, _, ss in batches for v in (sid, ss[-1].version, ss[-1].hash)]
        upsert = self._rows(self._heads, UPSERT_HEADS, HEAD_ROW, len(batches))
        out = [*self._events(xid, rows), (upsert, heads, None)]
        if tracking is not None:
            out.append((self._tracking, tracking, None))
        return (*out, *_wakeup_at(channel, end))

    def _events(self, xid: int, rows: list[tuple[str, SealedEvent]]) -> list[Statement]:
        out: list[Statement] = []
        first = xid * 65536
        for lo in range(0, len(rows), ROWS_PER_INSERT):
            chunk = rows[lo : lo + ROWS_PER_INSERT]
            query = self._rows(self._inserts, INSERT_EVENTS, EVENT_ROW, len(chunk))
            args: list[Any] = []
            for i, (sid, s) in enumerate(chunk, start=lo):
                args += (first + i, *event_row(sid, s))
            out.append((query, args, None))
        return out

    def _rows(self, cache: dict[int, sql.Composed], text: str, row: str, n: int) -> sql.Composed:
        query = cache.get(n)
        if query is None:
            query = self._render(text.replace("{rows}", ", ".join([row] * n)))
            if n < 64:  # the common sizes; a rare large batch is rendered each time
                cache[n] = query
        return query


def _wakeup_at(channel: str | None, last_position: int) -> tuple[Statement, ...]:
    """The NOTIFY as a coordinator statement (where the LISTEN connection is), delivered
    on commit; none when the store does not notify."""
    if channel is None:
        return ()
    return ((sql.Composed([sql.SQL(COORDINATOR_NOTIFY)]), (channel, str(last_position)), None),)
