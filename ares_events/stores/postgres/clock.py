"""The clock of a PostgreSQL store: where positions and the visibility bound come from,
and the statements that write an append's rows under them (:class:`ServerClock`).

It may import the core's value types, psycopg and :mod:`.sql`, :mod:`.arrays`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from psycopg import sql

from ares_events.core.backend import SealedEvent
from ares_events.core.events import PayloadRef
from ares_events.errors import ConfigError
from ares_events.stores.postgres.arrays import ByteaArray, TextArray
from ares_events.stores.postgres.sql import (
    DIST_CATALOG,
    DISTRIBUTED_SCHEMA,
    FROM,
    ORDER_BY_POSITION,
    RANGE,
    SELECT_ALL_BELOW,
    SELECT_POSITIONS_BELOW,
    Statements,
    render_for,
)

__all__ = ["Batches", "ServerClock", "Statement", "column_arrays", "event_row", "ref_text"]

Statement = tuple[Any, Any, Any]
"""``(query, args, fetch)`` of the recorder's pipelines (fetch: None, "one" or "all")."""
Batches = Sequence[tuple[str, int, Sequence[SealedEvent]]]
"""What an append writes: per stream, its id, its version before, its sealed events."""


def ref_text(ref: PayloadRef | None) -> str | None:
    """The stored form of a payload reference (None: the payload is inline)."""
    return ref.to_json().decode() if ref is not None else None


def event_row(sid: str, s: SealedEvent) -> tuple[Any, ...]:
    """One event's columns after its position, in the order of the INSERT statements."""
    e = s.event
    return (
        sid,
        s.version,
        e.event_id,
        e.type,
        e.module,
        e.payload_bytes,
        ref_text(e.payload_ref),
        e.meta_json,
        e.at,
        s.prev_hash,
        s.hash,
    )


def column_arrays(sealed: Sequence[SealedEvent]) -> tuple[Any, ...]:
    """A batch's rows as one array per column, in the order of the append statements."""
    evs = [s.event for s in sealed]
    return (
        TextArray([e.event_id for e in evs]),
        TextArray([e.type for e in evs]),
        TextArray([e.module for e in evs]),
        ByteaArray([e.payload_bytes for e in evs]),
        TextArray([ref_text(e.payload_ref) for e in evs]),
        ByteaArray([e.meta_json for e in evs]),
        TextArray([e.at for e in evs]),
        ByteaArray([s.prev_hash for s in sealed]),
        ByteaArray([s.hash for s in sealed]),
    )


class ServerClock:
    """Positions and visibility from the server that holds the rows.

    Args:
        q: the statements of the recorder's schema.
    """

    predict_heads: ClassVar[bool] = True
    """The one-statement fast path may be used (it takes its xid where it writes)."""
    xid_statements: ClassVar[tuple[Statement, ...]] = ()
    """Added to the locked path's first round trip; :meth:`xid` reads their results."""
    bound: ClassVar[sql.Composed | None] = None
    """A statement whose one value bounds the next read (None: reads bound themselves)."""
    lost: ClassVar[tuple[str, ...]] = ()
    """Messages that mean a node of the store was lost, whatever the error's class: every
    operation's error, not only an append's, is then StoreUnavailable."""

    def __init__(self, q: Statements) -> None:
        self.q = q
        self.all, self.all_range, self.all_from = q.all, q.all_range, q.all_from
        self.positions, self.last = q.positions, q.last
        s = sql.Identifier(q.schema)
        # The same reads below a bound given as their second parameter.
        self.below = tuple(
            render_for(s, SELECT_ALL_BELOW + where + ORDER_BY_POSITION)
            for where in ("", RANGE, FROM)
        )
        self.positions_below = render_for(s, SELECT_POSITIONS_BELOW)

    def xid(self, own: int, got: list[Any]) -> int:
        """The position's transaction id: ``own``, the writing transaction's."""
        return own

    @classmethod
    def check_schema(cls, conn: Any, schema: str, where: str) -> None:
        """Refuse a schema whose rows live on other nodes (a Citus distributed schema, a
        cell of a ``citus://`` store): this server's transaction ids would not order its
        positions, so readers would pass over events written here.

        Raises:
            ConfigError: ``schema`` is distributed.
        """
        distributed = (
            conn.execute(DIST_CATALOG).fetchone()[0]
            and (conn.execute(DISTRIBUTED_SCHEMA, (schema,)).fetchone()[0])
        )
        if distributed:
            raise ConfigError(
                f"schema {schema!r} of {where} is a Citus distributed schema (a cell of a "
                "citus:// store): open the store with its citus:// URL, whose clock keeps "
                "positions in order"
            )

    def writing(self, conn: Any, where: str) -> AbstractContextManager[None]:
        """Around the locked path's transaction: nothing to watch on one server."""
        return contextlib.nullcontext()

    def write_many(
        self, xid: int, batches: Batches, tracking: tuple[str, int] | None, channel: str | None
    ) -> tuple[Statement, ...]:
        """The locked path's write (of one batch, or ``append_many``'s): every batch's events
        (consecutive positions in batch order), the heads, the tracking row and the wake-up,
        one statement."""
        flat = [(sid, s) for sid, _, ss in batches for s in ss]
        lasts = [ss[-1] for _, _, ss in batches]
        name = tracking[0] if tracking is not None else None
        args = (
            xid,
            TextArray([sid for sid, _ in flat]),
            [s.version for _, s in flat],
            *column_arrays([s for _, s in flat]),
            [sid for sid, _, _ in batches],
            [s.version for s in lasts],
            [s.hash for s in lasts],
            name,
            tracking[1] if tracking is not None else None,
            name,
            channel,
            channel,
            str(xid * 65536 + len(flat) - 1),
        )
        return ((self.q.insert_many, args, None),)
