"""Writes of the blocking PostgreSQL recorder: the append protocol of
:mod:`.protocol` driven over a psycopg ``Connection``.

:class:`PostgresWrites` is a mixin of the recorder
(:class:`~ares_events.stores.postgres.recorder.PostgresRecorder`); it uses the recorder's
SQL, its ``_conn()`` unit of work and its head predictions. The asyncio recorder drives
the same steps over an ``AsyncConnection``. It may import the core,
:mod:`ares_events.errors`, psycopg and this package's SQL, connections and protocol.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ares_events.core.events import ExpectedVersion
from ares_events.core.recorder import AppendOutcome, Batch, TrackingRecord
from ares_events.core.sansio import Steps, run
from ares_events.errors import StoreError
from ares_events.stores.postgres.connection import rollback_quietly
from ares_events.stores.postgres.protocol import (
    MAX_BATCH,
    RETRIES,
    PostgresAppendProtocol,
    Stmt,
    check_batch_size,
    retryable,
)

logger = logging.getLogger(__name__)

__all__ = ["MAX_BATCH", "PostgresWrites", "SyncPort", "run_on"]


class SyncPort:
    """Sends the protocol's statements over a blocking connection."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def one(self, s: Stmt) -> Any:
        return self.conn.execute(s.query, s.args, binary=s.binary, prepare=s.prepare).fetchone()

    def all(self, s: Stmt) -> list[Any]:
        return self.conn.execute(s.query, s.args, binary=s.binary, prepare=s.prepare).fetchall()

    def pipeline(self, stmts: Sequence[Stmt]) -> list[Any]:
        conn = self.conn
        with conn.pipeline():
            curs = [
                conn.execute(s.query, s.args, binary=s.binary, prepare=s.prepare) for s in stmts
            ]
        # One round trip: the pipeline is synced on exit, every result is here now.
        return [
            c.fetchone() if s.fetch == "one" else c.fetchall() if s.fetch == "all" else None
            for c, s in zip(curs, stmts, strict=True)
        ]


def run_on(conn: psycopg.Connection[Any], steps: Steps[Any]) -> Any:
    """Drive protocol steps on ``conn``; any failure leaves no transaction open."""
    try:
        return run(steps, SyncPort(conn))
    except BaseException:
        rollback_quietly(conn)
        raise


class PostgresWrites(PostgresAppendProtocol):
    """Appends (a mixin: the recorder provides ``_conn`` and ``_query``)."""

    def _conn(
        self, what: str, *, translate: bool = True
    ) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        raise NotImplementedError

    def _query(self, what: str, query: sql.Composed, args: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append in one transaction, serialized per stream only (see the package docstring).

        Raises:
            InvalidEvent: more than 65,535 events in one batch.
            ConcurrencyError: ``expected_version`` is not satisfied.
            StoreUnavailable: the server, the pool or the connection failed; nothing was
                written (unless the failure hit the COMMIT itself: re-append the same
                event ids to find out, appends are idempotent).
            StoreError: any other database error.
        """
        check_batch_size(len(batch.events), batch.stream_id)
        what = f"append to stream {batch.stream_id!r}"
        for attempt in range(RETRIES):
            try:
                with self._conn(what) as conn:
                    outcome: AppendOutcome = run_on(
                        conn, self._append_steps(batch, expected_version)
                    )
                    return outcome
            except StoreError as exc:
                self._forget([batch])
                if retryable(exc, attempt):
                    logger.debug("%s: unique violation, retrying", what)
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def append_many(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        """Append several batches (and a tracking record) in one transaction (see
        :meth:`PostgresAppendProtocol._many_steps`).

        Raises:
            InvalidEvent: more than 65,535 events in all.
            ConcurrencyError: an expected version or the tracking record is not satisfied.
            StoreUnavailable: the server, the pool or the connection failed.
            StoreError: any other database error.
        """
        check_batch_size(sum(len(b.events) for b, _ in batches))
        what = f"append to {len(batches)} stream(s)"
        for attempt in range(RETRIES):
            try:
                with self._conn(what) as conn:
                    outcomes: list[AppendOutcome] = run_on(
                        conn, self._many_steps(batches, tracking)
                    )
                    return outcomes
            except StoreError as exc:
                self._forget([b for b, _ in batches])
                if retryable(exc, attempt):
                    continue  # a concurrent append of the same ids: the id check decides
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def tracked_position(self, name: str) -> int | None:
        """The tracked position of ``name``, or None.

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        rows = self._query(f"tracked position of {name!r}", self._sql["tracking"], (name,))
        return int(rows[0][0]) if rows else None
