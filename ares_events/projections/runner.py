"""The catch-up projection runner (:class:`ProjectionRunner`), offline rebuilds and
rebuild diffs."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.events import RecordedEvent
from ares_events.core.faces import blocking
from ares_events.core.read_models import Cursor, ProjectionMeta, ReadModels
from ares_events.core.traced import projection_lag
from ares_events.errors import ChainIntegrityError, ConfigError, InvalidEvent, StoreError
from ares_events.integrity.findings import Finding
from ares_events.integrity.verifier import malformed_reason
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

_ANOTHER: Final = "another rebuild of the same projection is running"
_STALLED_AFTER_S: Final = 60.0
"""A runner that lost its rebuild to another process waits while that rebuild's cursor
moves, and takes the slot over once it stood still this long (its process died)."""


class _Lost(Exception):
    """Internal: another rebuild holds the building slot; :func:`rebuild` raises it as
    the documented StoreError, a runner follows that rebuild instead."""


def _key_of(projection: Projection, event: RecordedEvent) -> str | None:
    """The row ``event`` folds into: the projection's ``key(event)``, else the stream id."""
    key_of = getattr(projection, "key", None)
    if not callable(key_of):
        return event.stream_id
    key = key_of(event)
    # Backends compare keys as text: an int key matched no stored row on SQLite (each
    # batch restarted from initial()) and failed on PostgreSQL. Refuse it on all.
    if key is not None and not isinstance(key, str):
        raise InvalidEvent(
            f"key of projection {projection.name!r}",
            f"must be a str or None, got {type(key).__name__} {key!r:.80}",
            stream_id=event.stream_id,
        )
    return key


def _check_rows(events: list[RecordedEvent]) -> None:
    """Raise the audit's ``malformed_row`` for a row that is not an event (a tampered
    database: docs/security.md): folded, it would crash or build a wrong read model."""
    for e in events:
        problem = malformed_reason(e)
        if problem is not None:
            sid: str | None = e.stream_id
            v: int | None = e.version
            if type(sid) is not str or type(v) is not int:
                sid = v = None  # the row's own stream id or version is what is damaged
            detail = f"position {e.position!r}: {problem} (run `ares-events audit`)"
            raise ChainIntegrityError(None, [Finding("malformed_row", sid, v, detail)])


def _fold_batch(
    projection: Projection,
    tables: ReadModels,
    table: str,
    events: list[RecordedEvent],
    *,
    strict: bool,
    skipped: list[SkippedEvent],
) -> dict[str, tuple[bytes, int]]:
    """The rows a batch of events changes. A batch projection (the Merkle log) folds the
    whole batch itself with ``fold_batch(load, events) -> {key: state}``."""
    batch_fold = getattr(projection, "fold_batch", None)
    if callable(batch_fold):
        states = batch_fold(lambda keys: tables.load(table, list(keys)), events)
        last = events[-1].position
        return {k: (encode_state(v), last) for k, v in states.items()}
    _check_rows(events)
    keyed = [(_key_of(projection, e), e) for e in events]  # one row per key
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


@contextlib.contextmanager
def _building(tables: ReadModels, name: str, table: str, cursor: Cursor) -> Iterator[None]:
    """A StoreError on ``table`` as :class:`_Lost` when another rebuild took the building
    slot over meanwhile and dropped ``table`` (its doing, not damage)."""
    try:
        yield
    except StoreError as exc:
        now = tables.meta(name) if cursor == "building" else None
        if now is None or now.building_table == table:
            raise
        raise _Lost(f"rebuild of {name!r}: its table {table} was taken over; {_ANOTHER}") from exc


def _claim(tables: ReadModels, name: str, seen: ProjectionMeta) -> str:
    """Claim the building slot for the next generation's table (replacing ``seen``'s);
    :class:`_Lost` when another rebuild changed the registry row since ``seen``."""
    gen = seen.generation + 1
    table = table_name(name, gen)
    # Created before the claim: a rebuild that resumes from the claim finds its table. Only
    # the claim's winner writes rows into it (every commit is a compare-and-set).
    tables.create(table)
    if not tables.start_building(name, table, seen):
        now = tables.meta(name)
        # Past this generation nobody can claim (nor then swap in) this table any more:
        # drop it unless it is live or building (the winner's, of the same name).
        named = () if now is None else (now.active_table, now.building_table)
        if now is not None and now.generation > gen and table not in named:
            tables.drop(table)
        raise _Lost(f"rebuild of {name!r}: {_ANOTHER} (it claimed generation {gen} first)")
    if seen.building_table is not None and seen.building_table != table:
        # The registry names it no more, so no swap can make it live: whoever fills it
        # stops at its next read or commit (see _building).
        tables.drop(seen.building_table)
    return table


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
    """Fold read_all from ``after`` (up to ``until``) into ``table``, moving ``cursor``
    with every batch; (events applied, last position, events skipped)."""
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
        new = batch[-1].position
        with _building(tables, projection.name, table, cursor):
            rows = _fold_batch(projection, tables, table, batch, strict=strict, skipped=skipped)
            moved = not tables.commit(table, rows, projection.name, cursor, pos, new)
        if moved:
            raise _Lost(f"rebuild of {projection.name!r}: its cursor moved under it; {_ANOTHER}")
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
    rebuild resumes from its own cursor unless ``from_scratch``, which takes the building
    slot over from any other rebuild (that one then stops with the StoreError below).

    Raises:
        EventSchemaError: strict and an event fails its schema.
        InvalidEvent: the projection's ``key(event)`` is neither a str nor None.
        StoreError: another rebuild of the same projection is running.
        StoreUnavailable: the store cannot be reached.
    """
    store = blocking(store, "ae.projections.rebuild")
    try:
        return _rebuild(store, projection, from_scratch, batch_size, strict, progress)
    except _Lost as lost:
        raise StoreError(str(lost)) from lost.__cause__


def _rebuild(
    store: EventStore,
    projection: Projection,
    from_scratch: bool,
    batch_size: int,
    strict: bool,
    progress: Progress | None,
) -> RebuildReport:
    """:func:`rebuild`, raising :class:`_Lost` when another rebuild holds the slot."""
    tables = tables_for(store)
    meta = _ensure_live(tables, projection)
    started = time.perf_counter()
    if meta.building_table and not from_scratch:
        table, after = meta.building_table, meta.building_position
        logger.info("resuming rebuild of %s at position %d", projection.name, after)
    else:
        table, after = _claim(tables, projection.name, meta), 0
    resumed_from = after
    n, pos, skipped = _fill(
        store, projection, tables, table, after, "building", None, batch_size, strict, progress
    )
    # Counted before the swap: a later rebuild may swap and drop this table at once after
    # it, and no commit can change the rows between the count and a swap that succeeds.
    with _building(tables, projection.name, table, "building"):
        rows = sum(1 for _ in tables.scan(table))
    old = (tables.meta(projection.name) or meta).active_table
    if not tables.swap(projection.name, table, pos, projection.version):
        raise _Lost(
            f"rebuild of {projection.name!r}: the registry changed before the swap; {_ANOTHER}"
        )
    if old and old != table:
        tables.drop(old)
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

    The cursor and the live rows are read first, as one snapshot: a runner that commits
    meanwhile (its rows lie past that cursor) never shows as a difference.

    Raises:
        ChainIntegrityError: a row is not an event (a ``malformed_row``).
        ConfigError: the projection's read model was never built in this store (nothing
            to verify: a pass over zero rows would vouch for a table that is not there).
        StoreUnavailable: the store cannot be reached.
    """
    store = blocking(store, "ae.projections.verify_rebuild")
    view = tables_for(store).read_live(projection.name)
    if view is None:
        raise ConfigError(
            f"the read model {projection.name!r} was never built in {store.url}: nothing to "
            f"verify (`ares-events rebuild {projection.name}` builds it)"
        )
    meta, live = view
    scratch = MemoryReadModels()
    _fill(
        store, projection, scratch, "verify", 0, "none", meta.position, batch_size, False, progress
    )
    fresh = dict(scratch.scan("verify"))
    rep = DiffReport(projection.name, meta.position, len(set(live) | set(fresh)))
    rep.only_live = sorted(set(live) - set(fresh))
    rep.only_rebuilt = sorted(set(fresh) - set(live))
    rep.different = sorted(k for k in set(live) & set(fresh) if live[k] != fresh[k])
    return rep


def read_model(store: EventStore, projection: Projection | str, key: str) -> Any:
    """The live read-model state of ``key`` (None when absent)."""
    store = blocking(store, "ae.projections.read_model")
    name = projection if isinstance(projection, str) else projection.name
    tables = tables_for(store)
    meta = tables.meta(name)
    if meta is None or meta.active_table is None:
        return None
    return tables.load(meta.active_table, [key]).get(key)


@dataclass(slots=True)
class _Following:
    """Another process's rebuild a runner waits for: the building table and its cursor
    when last seen moving, and when (``time.monotonic()``)."""

    table: str | None
    position: int
    since: float


class ProjectionRunner:
    """Keeps read models caught up with the log, exactly once per event.

    A runner whose projection version differs from the read model's rebuilds it first.
    When another process's rebuild holds the slot (a replica started at the same time),
    it folds nothing into the old table and waits for that rebuild's swap, taking the slot
    over only once that rebuild stopped making progress.

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
        store = blocking(store, "ae.projections.ProjectionRunner")
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
        self._following: dict[str, _Following] = {}

    def position(self, projection: Projection | str | None = None) -> int:
        """Cursor of one projection (or the minimum over all)."""
        if projection is None:
            names = [p.name for p in self.projections]
        else:
            names = [projection if isinstance(projection, str) else projection.name]
        return min(m.position if (m := self.tables.meta(n)) else 0 for n in names)

    def run_once(self) -> int:
        """Apply at most one batch per projection. Returns the number of events applied.

        Raises:
            EventSchemaError: strict and an event fails its schema.
            InvalidEvent: a projection's ``key(event)`` is neither a str nor None.
            StoreError: the read model is damaged.
            StoreUnavailable: the store cannot be reached.
        """
        total = 0
        for p in self.projections:
            meta = _ensure_live(self.tables, p)
            if meta.projection_version != p.version:
                rebuilt = self._rebuild_first(p, meta)
                if rebuilt is None:
                    continue  # another process rebuilds it: the old table gets nothing
                meta = rebuilt
            else:
                self._following.pop(p.name, None)
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

    def _rebuild_first(self, p: Projection, meta: ProjectionMeta) -> ProjectionMeta | None:
        """Rebuild ``p``'s read model built by another version; the registry row after the
        swap, or None while another process's rebuild holds the slot."""
        now = time.monotonic()
        f = self._following.get(p.name)
        if f is not None and meta.building_table is not None:
            if (meta.building_table, meta.building_position) != (f.table, f.position):
                self._following[p.name] = _Following(
                    meta.building_table, meta.building_position, now
                )
                return None
            if now - f.since < _STALLED_AFTER_S:
                return None
            logger.warning(
                "the rebuild of %s made no progress for %.0fs: taking it over",
                p.name, now - f.since,
            )  # fmt: skip
        else:
            logger.warning(
                "read model of %s was built by version %d, code is %d: rebuilding",
                p.name, meta.projection_version, p.version,
            )  # fmt: skip
        try:
            _rebuild(
                self.store, p, from_scratch=True, batch_size=1000, strict=self.strict, progress=None
            )
        except _Lost:
            # Two replicas started after a version bump: taking the slot back would only
            # make the other one lose in turn. Wait for its swap instead.
            held = self.tables.meta(p.name)
            table, pos = (held.building_table, held.building_position) if held else (None, 0)
            self._following[p.name] = _Following(table, pos, time.monotonic())
            logger.info("another process is rebuilding %s: waiting for its swap", p.name)
            return None
        self._following.pop(p.name, None)
        return self.tables.meta(p.name) or meta

    def run_until_idle(self, *, progress: Callable[[int], None] | None = None) -> int:
        """Apply batches until the log is exhausted; returns events applied (``progress``
        is called with the running total after each batch). While another process
        rebuilds one of the read models, it waits for that rebuild's swap."""
        n = 0
        delay = 0.005
        while True:
            k = self.run_once()
            if k:
                n += k
                delay = 0.005
                if progress is not None:
                    progress(n)
            elif not self._following:
                return n
            else:
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

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
