"""The catch-up projection runner (:class:`ProjectionRunner`), offline rebuilds and
rebuild diffs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ares_events.core.events import RecordedEvent
from ares_events.core.read_models import Cursor, ProjectionMeta, ReadModels
from ares_events.core.traced import projection_lag
from ares_events.errors import ConfigError, StoreError
from ares_events.projections.base import Projection, SkippedEvent, apply_one
from ares_events.projections.tables import encode_state, table_name, tables_for
from ares_events.stores.memory.read_models import MemoryReadModels

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = [
    "DiffReport",
    "ProjectionRunner",
    "RebuildReport",
    "read_model",
    "rebuild",
    "verify_rebuild",
]

Progress = Callable[[int, int], None]


def _fold_batch(
    projection: Projection,
    tables: ReadModels,
    table: str,
    events: list[RecordedEvent],
    *,
    strict: bool,
    skipped: list[SkippedEvent],
) -> dict[str, tuple[bytes, int]]:
    """Apply a batch of events to the rows they touch; returns the changed rows. A batch
    projection (the Merkle log) defines ``fold_batch(load, events) -> {key: state}`` and
    folds the whole batch itself; its rows are committed with the cursor like any other."""
    batch_fold = getattr(projection, "fold_batch", None)
    if callable(batch_fold):
        states = batch_fold(lambda keys: tables.load(table, list(keys)), events)
        last = events[-1].position
        return {k: (encode_state(v), last) for k, v in states.items()}
    key_of = getattr(projection, "key", None)  # one row per key, default the stream id
    keyed = [(key_of(e) if callable(key_of) else e.stream_id, e) for e in events]
    keys = sorted({k for k, _ in keyed if k is not None})
    states = tables.load(table, keys) if keys else {}
    last_pos: dict[str, int] = {}
    for k, e in keyed:
        if k is None:
            continue
        st = states.get(k)
        st = projection.initial() if st is None else st
        states[k] = apply_one(projection, st, e, strict=strict, skipped=skipped)
        last_pos[k] = e.position
    return {k: (encode_state(states[k]), last_pos[k]) for k in last_pos}


@dataclass(slots=True)
class RebuildReport:
    """Outcome of :func:`rebuild`."""

    projection: str
    events: int
    rows: int
    seconds: float
    resumed_from: int
    position: int
    table: str
    skipped: list[SkippedEvent] = field(default_factory=list)

    @property
    def events_per_s(self) -> float:
        """Throughput of this run."""
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self) | {"seconds": round(self.seconds, 3)}
        first = {k: d.pop(k) for k in ("projection", "events", "rows", "seconds")}
        return first | {"events_per_s": round(self.events_per_s)} | d  # the rate after seconds


@dataclass(slots=True)
class DiffReport:
    """Keys whose rebuilt state differs from the live read model."""

    projection: str
    position: int
    rows_compared: int
    only_live: list[str] = field(default_factory=list)
    only_rebuilt: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the live read model equals a fresh rebuild."""
        return not (self.only_live or self.only_rebuilt or self.different)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        head = {"projection": self.projection, "position": self.position, "ok": self.ok}
        return head | asdict(self)  # the other fields after "ok", these three in place


def _ensure_live(tables: ReadModels, projection: Projection) -> ProjectionMeta:
    meta = tables.meta(projection.name)
    if meta is None:
        live = table_name(projection.name, 1)
        tables.create(live)
        tables.put_meta(ProjectionMeta(projection.name, projection.version, live, 0, None, 0, 1))
        meta = tables.meta(projection.name)  # whoever created it first wins
        assert meta is not None
    return meta


def _fill(
    store: EventStore,
    projection: Projection,
    tables: ReadModels,
    table: str,
    after: int,
    cursor: Cursor,
    until: int | None,
    batch_size: int,
    strict: bool,
    progress: Progress | None,
) -> tuple[int, int, list[SkippedEvent]]:
    """Fold read_all from ``after`` (up to ``until``) into ``table``, moving the registry's
    ``cursor`` ("building" or "none") with every batch. Returns (events applied, last
    position, events skipped)."""
    total = store.last_position() if until is None else until
    n = 0
    skipped: list[SkippedEvent] = []
    pos = after
    while True:
        batch = list(store.read_all(after_position=pos, limit=batch_size))
        if until is not None:
            batch = [e for e in batch if e.position <= until]
        if not batch:
            break
        rows = _fold_batch(projection, tables, table, batch, strict=strict, skipped=skipped)
        new = batch[-1].position
        if not tables.commit(table, rows, projection.name, cursor, pos, new):
            raise StoreError(
                f"rebuild of {projection.name!r}: its cursor moved under it; another rebuild "
                "of the same projection is running"
            )
        pos = new
        n += len(batch)
        if progress is not None:
            progress(n, max(total - after, n))
        if len(batch) < batch_size or (until is not None and pos >= until):
            break
    return n, pos, skipped


def rebuild(
    store: EventStore,
    projection: Projection,
    *,
    from_scratch: bool = False,
    batch_size: int = 1000,
    strict: bool = True,
    progress: Progress | None = None,
) -> RebuildReport:
    """Rebuild ``projection``'s read model from the log and swap it in atomically.

    The live table serves reads (and a running :class:`ProjectionRunner` keeps it current)
    until the swap, which is one compare-and-set of the registry row. An interrupted
    rebuild resumes from its own cursor unless ``from_scratch``.

    Raises:
        EventSchemaError: strict and an event fails its schema.
        StoreError: another rebuild of the same projection is running.
        StoreUnavailable: the store cannot be reached.
    """
    tables = tables_for(store)
    meta = _ensure_live(tables, projection)
    started = time.perf_counter()
    if meta.building_table and not from_scratch:
        table, after = meta.building_table, meta.building_position
        logger.info("resuming rebuild of %s at position %d", projection.name, after)
    else:
        if meta.building_table:
            tables.drop(meta.building_table)
        gen = meta.generation + 1
        table, after = table_name(projection.name, gen), 0
        tables.drop(table)
        tables.create(table)
        tables.start_building(projection.name, table, gen)
    resumed_from = after
    n, pos, skipped = _fill(
        store, projection, tables, table, after, "building", None, batch_size, strict, progress
    )
    old = (tables.meta(projection.name) or meta).active_table
    if not tables.swap(projection.name, table, pos, projection.version):
        raise StoreError(
            f"rebuild of {projection.name!r}: the registry changed before the swap; another "
            "rebuild of the same projection is running"
        )
    if old and old != table:
        tables.drop(old)
    rows = sum(1 for _ in tables.scan(table))
    return RebuildReport(
        projection.name, n, rows, time.perf_counter() - started, resumed_from, pos, table, skipped
    )


def verify_rebuild(
    store: EventStore,
    projection: Projection,
    *,
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> DiffReport:
    """Fold the log up to the live read model's cursor and diff every key. Read-only:
    the fresh fold is kept in memory (as the diff needs both sides anyway), nothing is
    registered, created or written, so it runs on a store opened read-only.

    Raises:
        ConfigError: the projection's read model was never built in this store (nothing
            to verify: a pass over zero rows would vouch for a table that is not there).
        StoreUnavailable: the store cannot be reached.
    """
    tables = tables_for(store)
    meta = tables.meta(projection.name)
    if meta is None or meta.active_table is None:
        raise ConfigError(
            f"the read model {projection.name!r} was never built in {store.url}: nothing to "
            f"verify (`ares-events rebuild {projection.name}` builds it)"
        )
    scratch = MemoryReadModels()
    _fill(
        store, projection, scratch, "verify", 0, "none", meta.position, batch_size, False, progress
    )
    live = dict(tables.scan(meta.active_table))
    fresh = dict(scratch.scan("verify"))
    rep = DiffReport(projection.name, meta.position, len(set(live) | set(fresh)))
    rep.only_live = sorted(set(live) - set(fresh))
    rep.only_rebuilt = sorted(set(fresh) - set(live))
    rep.different = sorted(k for k in set(live) & set(fresh) if live[k] != fresh[k])
    return rep


def read_model(store: EventStore, projection: Projection | str, key: str) -> Any:
    """The live read-model state of ``key`` (None when absent)."""
    name = projection if isinstance(projection, str) else projection.name
    tables = tables_for(store)
    meta = tables.meta(name)
    if meta is None or meta.active_table is None:
        return None
    return tables.load(meta.active_table, [key]).get(key)


class ProjectionRunner:
    """Keeps read models caught up with the log, exactly once per event.

    Args:
        store: the event store (its database also holds the read models).
        projections: projections to maintain (one row per key, default the stream id;
            a projection may define ``key(event) -> str | None``).
        batch_size: events per transaction.
        strict: raise on schema failures (else skip and list them in ``skipped``).
        snapshotter: optional :class:`~ares_events.projections.recovery.Snapshotter` called for each
            stream a batch touched.
    """

    def __init__(
        self,
        store: EventStore,
        projections: Iterable[Projection],
        *,
        batch_size: int = 500,
        strict: bool = True,
        snapshotter: Any = None,
    ) -> None:
        self.store = store
        self.projections = list(projections)
        if not self.projections:
            raise ConfigError("at least one projection is required")
        self.batch_size = batch_size
        self.strict = strict
        self.snapshotter = snapshotter
        self.tables = tables_for(store)
        self.skipped: list[SkippedEvent] = []
        self._changed = threading.Condition()

    def position(self, projection: Projection | str | None = None) -> int:
        """Cursor of one projection (or the minimum over all)."""
        if projection is None:
            names = [p.name for p in self.projections]
        else:
            names = [projection if isinstance(projection, str) else projection.name]
        return min(m.position if (m := self.tables.meta(n)) else 0 for n in names)

    def run_once(self) -> int:
        """Apply at most one batch per projection. Returns the number of events applied."""
        total = 0
        for p in self.projections:
            meta = _ensure_live(self.tables, p)
            if meta.projection_version != p.version:
                logger.warning(
                    "read model of %s was built by version %d, code is %d: rebuilding",
                    p.name, meta.projection_version, p.version,
                )  # fmt: skip
                rebuild(self.store, p, from_scratch=True, strict=self.strict)
                meta = self.tables.meta(p.name) or meta
            batch = list(self.store.read_all(after_position=meta.position, limit=self.batch_size))
            if not batch:
                projection_lag(self.store, p.name, meta.position)
                continue
            table = meta.active_table or ""
            skipped: list[SkippedEvent] = []
            try:
                rows = _fold_batch(
                    p, self.tables, table, batch, strict=self.strict, skipped=skipped
                )
            except Exception:
                # A rebuild may have swapped in a new generation and dropped ``table``
                # between our registry read and the load: that is a move, not a failure.
                now = self.tables.meta(p.name)
                if now is not None and now.active_table == table:
                    raise
                logger.debug("read model of %s was swapped during a fold; retrying", p.name)
                continue
            if not self.tables.commit(
                table, rows, p.name, "live", meta.position, batch[-1].position
            ):
                # Another runner or a rebuild's swap moved the registry: nothing was
                # written; the next pass starts from the registry as it is now.
                logger.debug("read model of %s moved under the runner; retrying", p.name)
                continue
            self.skipped.extend(skipped)
            total += len(batch)
            projection_lag(self.store, p.name, batch[-1].position)
            if self.snapshotter is not None:
                for sid, v in {e.stream_id: e.version for e in batch}.items():  # each one's last
                    self.snapshotter.after_append(sid, v)
        if total:
            with self._changed:
                self._changed.notify_all()
        return total

    def run_until_idle(self, *, progress: Callable[[int], None] | None = None) -> int:
        """Apply batches until the log is exhausted; returns events applied (``progress``
        is called with the running total after each batch)."""
        n = 0
        while k := self.run_once():
            n += k
            if progress is not None:
                progress(n)
        return n

    def run_forever(self, stop: threading.Event, *, idle_wait: float = 1.0) -> None:
        """Catch up, then wait on the store's wake-ups, until ``stop`` is set."""
        while not stop.is_set():
            if self.run_once() == 0:
                self.store.wait_for(self.position(), idle_wait)

    def wait_until(self, position: int, timeout: float) -> bool:
        """Block until every projection's cursor reaches ``position`` (read-your-writes).

        Returns:
            True when caught up within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            if self.position() >= position:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self._changed:
                self._changed.wait(min(delay, left))
            delay = min(delay * 2, 0.1)
