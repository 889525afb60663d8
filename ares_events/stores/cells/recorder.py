# Generated from recorder_async.py by tools/async_to_sync.py: do not edit.
""":class:`CellsRecorder`: a store of many cells (one face written, the other
generated; docs/scaling.md).

It may import the core, :mod:`ares_events.errors`, the PostgreSQL backend and the
archive's formats.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, ClassVar

from ares_events.core.backend import (
    AppendOutcome,
    ArchivedRow,
    Batch,
    Capability,
    EraseOutcome,
    Head,
    TrackingRecord,
)
from ares_events.core.events import ErasedPayloadRef, ExpectedVersion, PayloadRef, RecordedEvent
from ares_events.core.iterators import closing_iter
from ares_events.core.url import StoreURL
from ares_events.errors import (
    ConfigError,
    CrossCellError,
    InvalidEvent,
    StoreError,
    StoreNotFound,
)
from ares_events.stores.cells.citus_clock import CitusClock
from ares_events.stores.cells.layout import (
    CELLS_KEY,
    DEFAULT_CELLS,
    DEFAULT_PARTITIONS,
    OWN_PARAMS,
    CellMap,
    CellsConfig,
    pack,
    parse_cells_url,
    unpack,
    with_position,
)
from ares_events.stores.postgres.options import OWN_PARAMS as PG_PARAMS
from ares_events.stores.postgres.options import libpq_options
from ares_events.stores.postgres.recorder import PostgresRecorder

if TYPE_CHECKING:
    from ares_events.core.snapshot_format import Snapshot, SnapshotInfo, SnapshotRow

logger = logging.getLogger(__name__)

__all__ = ["CellsRecorder", "CellsSnapshotRows"]

_MAX_LOCAL = 1 << 63


class CellsRecorder:
    """A store of many cells, each an :class:`PostgresRecorder` (docs/scaling.md).

    Args:
        cells: the cells' recorders, in cell order (this recorder closes them).
        cell_map: which cell holds each partition.
        description: the store URL, redacted.
        citus: the cells are distributed schemas of a Citus cluster.
        shared_clock: the cells' positions come from one transaction-id space (schemas
            of one database, or Citus cells positioned by the coordinator).
    """

    scheme: ClassVar[tuple[str, ...]] = ("citus", "pgcells")
    BASE_CAPABILITIES: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.PERSISTENT,
            Capability.MULTI_PROCESS,
            Capability.WAKEUPS,
            Capability.SNAPSHOTS,
            Capability.MULTI_STREAM_APPEND,
            Capability.ERASE,
            Capability.METADATA,
            Capability.DUPLICATE_SCAN,
            Capability.POSITION_SCAN,
            Capability.READ_MODELS,
        }
    )
    """What every cell store declares; one whose cells do not share a transaction-id
    clock (cells on several plain servers) adds ``CELL_CURSORS``, one whose cells do adds
    ``ARCHIVE``."""

    def __init__(
        self,
        cells: Sequence[PostgresRecorder],
        cell_map: CellMap,
        *,
        description: str,
        citus: bool = False,
        shared_clock: bool = False,
    ) -> None:
        if not cells or len(cells) != len(cell_map.cells):
            raise ConfigError(f"{description}: {len(cells)} cells for a map of {cell_map.cells}")
        self.cells = list(cells)
        self.cell_map = cell_map
        self.citus = citus
        self.shared_clock = shared_clock
        # One position space: the archive's position ranges hold across cells.
        extra = Capability.ARCHIVE if shared_clock else Capability.CELL_CURSORS
        self.capabilities: frozenset[Capability] = self.BASE_CAPABILITIES | {extra}
        self._description = description
        self._n = len(cells)

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> CellsRecorder:
        """Open (creating unless ``create=False``) the cells of a ``citus://`` or
        ``pgcells://`` URL (:func:`~ares_events.stores.cells.layout.parse_cells_url`).
        Keyword ``options`` go to every cell (``create``, ``migrate``, ``pool_max``...).

        Raises:
            ConfigError: a bad URL, or ``partitions``/``cells`` that differ from the
                recorded cell map (fixed at init).
            StoreNotFound: ``create=False`` and a cell does not exist.
            StoreUnavailable: a server cannot be reached.
        """
        cfg = parse_cells_url(url)
        _check_passed_on(url, cfg)
        if cfg.citus:  # every cell's positions from the coordinator (citus_clock.py)
            options = {**options, "clock": CitusClock}
        opened: list[PostgresRecorder] = []
        try:
            first = PostgresRecorder.from_url(
                StoreURL.parse(cfg.url_of(0, cfg.name_of(0))), **options
            )
            opened.append(first)
            raw = first.meta_get(CELLS_KEY)
            create = bool(options.get("create", True))
            if raw is None and not create:
                raise StoreNotFound(
                    cfg.where, f"schema {cfg.name_of(0)} holds no cell map (not a cell store)"
                )
            if raw is not None:
                cell_map = CellMap.from_json(raw, cfg.where)
                _check_requested(cfg, cell_map)
            else:
                n = cfg.cells or (len(cfg.hosts) if len(cfg.hosts) > 1 else DEFAULT_CELLS)
                partitions = cfg.partitions or max(DEFAULT_PARTITIONS, n)
                if n > partitions:
                    raise ConfigError(
                        f"cells ({n}) must not exceed partitions ({partitions}) in {cfg.where}"
                    )
                cell_map = CellMap.new(partitions, [cfg.name_of(i) for i in range(n)])
            for i, name in enumerate(cell_map.cells[1:], start=1):
                opened.append(
                    PostgresRecorder.from_url(StoreURL.parse(cfg.url_of(i, name)), **options)
                )
            rec = cls(
                opened,
                cell_map,
                description=cfg.where,
                citus=cfg.citus,
                shared_clock=cfg.citus or len(set(cfg.hosts)) == 1,
            )
            rec._record_map(new=raw is None, create=create)
        except BaseException as exc:
            for r in opened:
                r.close()
            if isinstance(exc, StoreNotFound) and exc.where != cfg.where:
                # A cell's URL is internal: name the store the user gave (and `init` it).
                raise StoreNotFound(cfg.where, exc.detail) from exc
            raise
        logger.info("opened cell store %s (%d cells)", cfg.where, len(opened))
        return rec

    def _record_map(self, *, new: bool, create: bool) -> None:
        """Record the map of a new store in every cell (the first cell decides), or check
        that every cell of an existing one holds it (filling in what an interrupted init missed)."""
        want = self.cell_map.to_json()
        if new:
            stored = self.cells[0].meta_put_if_absent(CELLS_KEY, want)
            if stored != want:
                raise ConfigError(
                    f"{self._description}: another ares-events process initialised this "
                    "store with another cell map at the same time; open it again"
                )
        for i, cell in enumerate(self.cells[1:], start=1):
            got = cell.meta_get(CELLS_KEY)
            if got is None:
                if not create:
                    raise StoreNotFound(
                        self._description,
                        f"cell {self.cell_map.cells[i]} holds no cell map (an interrupted "
                        "init: run `ares-events init`)",
                    )
                got = cell.meta_put_if_absent(CELLS_KEY, want)
            if got != want:
                raise ConfigError(
                    f"{self._description}: cell {self.cell_map.cells[i]} belongs to another "
                    "cell store (its recorded cell map differs)"
                )

    def describe(self) -> str:
        """The store URL, redacted."""
        return self._description

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._description!r}, cells={self._n})"

    def cell_index(self, stream_id: str) -> int:
        """The index of the cell that holds ``stream_id``."""
        return self.cell_map.cell_of(stream_id)

    def cell_for(self, stream_id: str) -> PostgresRecorder:
        """The cell that holds ``stream_id``."""
        return self.cells[self.cell_map.cell_of(stream_id)]

    def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append in the stream's cell (that cell's guarantees).

        Raises:
            ConcurrencyError: ``expected_version`` is not satisfied.
            StoreUnavailable: the cell's server failed; nothing was written (unless the
                COMMIT itself failed: re-append the same event ids to find out).
            StoreError: any other database error.
        """
        return self.cell_for(batch.stream_id).append(batch, expected_version)

    def append_many(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        """Several batches (and a tracking record, routed by its name) in one transaction
        of one cell.

        Raises:
            CrossCellError: the streams (or the tracking name) are in different cells.
            InvalidEvent: a tracking position that no cell can hold (a merged cursor).
            ConcurrencyError: an expected version or the tracking record is not satisfied.
            StoreUnavailable: the cell's server failed.
        """
        where = {self.cell_index(b.stream_id) for b, _ in batches}
        if tracking is not None:
            where.add(self.cell_index(tracking.name))
            if tracking.position >= _MAX_LOCAL:
                raise InvalidEvent(
                    "tracking",
                    "a cell store tracks positions below 2**63 only (a merged read_all "
                    "cursor does not fit; keep one tracking name per cell)",
                )
        if len(where) != 1:
            raise CrossCellError(
                "append_many",
                self._description,
                [self.cell_map.cells[i] for i in sorted(where)],
            )
        (i,) = where
        return self.cells[i].append_many(batches, tracking)

    def tracked_position(self, name: str) -> int | None:
        """The tracked position of ``name``, from the cell of its name."""
        return self.cell_for(name).tracked_position(name)

    def erase(
        self,
        stream_id: str,
        version: int,
        position: int,
        event_hash: bytes,
        ref: ErasedPayloadRef,
        blob_key: str | None = None,
    ) -> EraseOutcome:
        """Erase in the stream's cell; the blob's other references are counted in every
        cell (a blob is content-addressed, so another cell's stream may share it)."""
        i = self.cell_index(stream_id)
        out = self.cells[i].erase(stream_id, version, position, event_hash, ref, blob_key)
        if not out.erased or not blob_key:
            return out
        refs = out.blob_refs
        for j, cell in enumerate(self.cells):
            if j != i:
                rows = cell._query(
                    "counting blob references", cell.sql.blob_refs, (PayloadRef.like_key(blob_key),)
                )
                refs += int(rows[0][0]) if rows else 0
        return EraseOutcome(True, refs)

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        """One stream from its cell: the cell's own iterator (positions are the cell's)."""
        return self.cell_for(stream_id).read(stream_id, from_version, to_version, limit)

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> Iterator[RecordedEvent]:
        """Every cell merged (docs/scaling.md): on a shared clock by position, up to the
        highest position final in every cell; else each event with the merge's cursor."""
        if self.shared_clock:
            # Every cell is read below the same top: a cell's own fresh bound can come out
            # lower (postgres/sql.py), and the merge would step over its rows for good.
            top = self.last_position()
            its = [
                c.read_all(after_position, limit, stream_prefix=stream_prefix, below=top + 1)
                for c in self.cells
            ]
            merged = _merge(its, _position)
        else:
            parts = unpack(after_position, self._n)
            its = [
                c.read_all(parts[i], limit, stream_prefix=stream_prefix)
                for i, c in enumerate(self.cells)
            ]
            merged = _merge(its, _position, parts=parts, order=_at)
        with closing_iter(merged) as items:
            for cursor, e in items:
                if self.shared_clock:
                    if e.position > top:
                        return
                    yield e
                else:
                    yield with_position(e, cursor)
                if limit is not None:
                    limit -= 1
                    if limit == 0:
                        return

    def positions(self, after_position: int) -> Iterator[tuple[Any, Any, Any]]:
        """``(position, stream_id, version)`` in the order and with the positions of
        :meth:`read_all`."""
        if not self.shared_clock:
            # The merge's order needs each event's time, so this is read_all's scan.
            with closing_iter(self.read_all(after_position, None)) as events:
                for e in events:
                    yield e.position, e.stream_id, e.version
            return
        top = self.last_position()
        merged = _merge([c.positions(after_position, below=top + 1) for c in self.cells], _first)
        with closing_iter(merged) as items:
            for _, row in items:
                if type(row[0]) is int and row[0] > top:
                    return
                yield row

    def head(self, stream_id: str) -> Head | None:
        """The stream's head, from its cell."""
        return self.cell_for(stream_id).head(stream_id)

    def heads(self) -> Iterator[tuple[str, Head]]:
        """Every head of every cell, merged by stream id."""
        its = [c.heads() for c in self.cells]
        for _, item in _merge(its, _first):
            yield item

    def last_position(self) -> int:
        """The highest position final in every cell (a shared clock), else one cursor of
        every cell's last position."""
        lasts = [c.last_position() for c in self.cells]
        return max(lasts) if self.shared_clock else pack(lasts)

    def schema_version(self) -> int:
        """The lowest schema version of the cells."""
        return min([c.schema_version() for c in self.cells])

    def wait_for(self, position: int, timeout: float) -> bool:
        """True once any cell has an event past its part of ``position``, False after
        ``timeout`` seconds (every cell's own wake-ups, waited for at once)."""
        parts = [position] * self._n if self.shared_clock else unpack(position, self._n, "position")
        if any(c.last_position() > parts[i] for i, c in enumerate(self.cells)):
            return True
        pool = ThreadPoolExecutor(self._n, thread_name_prefix="ares-cells-wait")
        try:
            futs = {pool.submit(c.wait_for, parts[i], timeout) for i, c in enumerate(self.cells)}
            while futs:
                done, futs = wait(futs, return_when=FIRST_COMPLETED)
                if any(f.result() for f in done):
                    return True
            return False
        finally:
            # The other waits end at their timeout; nobody waits for them here.
            pool.shutdown(wait=False)

    def meta_get(self, key: str) -> str | None:
        """A value of the first cell's metadata (the store's identity lives there)."""
        return self.cells[0].meta_get(key)

    def meta_put_if_absent(self, key: str, value: str) -> str:
        """Store ``value`` in the first cell unless one is there; return the stored value."""
        return self.cells[0].meta_put_if_absent(key, value)

    def meta_set(self, key: str, value: str) -> None:
        """Store ``value`` in the first cell."""
        if key == CELLS_KEY:
            raise StoreError(f"{self._description}: the cell map is fixed at init")
        self.cells[0].meta_set(key, value)

    def meta_swap(self, key: str, expected: str | None, value: str) -> bool:
        """Compare-and-set of a value of the first cell's metadata."""
        if key == CELLS_KEY:
            raise StoreError(f"{self._description}: the cell map is fixed at init")
        return bool(self.cells[0].meta_swap(key, expected, value))

    def delete_archived(
        self, first_position: int, last_position: int, expected: Sequence[ArchivedRow]
    ) -> int:
        """Delete the rows a segment holds, each cell its own in its own transaction (a
        crash between cells leaves the rest to the next archive run).

        Raises:
            StoreError: a cell's rows differ from the segment (that cell deletes nothing).
        """
        by_cell: dict[int, list[ArchivedRow]] = {}
        for row in expected:
            by_cell.setdefault(self.cell_index(row[3]), []).append(row)
        n = 0
        for i in sorted(by_cell):
            n += int(self.cells[i].delete_archived(first_position, last_position, by_cell[i]))
        return n

    def find_duplicates(self) -> Iterator[tuple[str, Any, Any, int, Any]]:
        """Every cell's duplicate rows (positions are the cells' own)."""
        for c in self.cells:
            yield from c.find_duplicates()

    def read_models(self) -> Any:
        """The read-model tables of the first cell, where each projection's rows and its
        one cursor commit together. On a shared clock that cursor is every cell's
        checkpoint at once (one position space).

        Raises:
            ConfigError: cells on separate servers (their cursors do not fit the
                read models' bigint positions).
        """
        if not self.shared_clock:
            raise ConfigError(
                f"read models of {self._description}: cells on separate servers have "
                "per-cell cursors, which the read-model tables cannot hold yet; run "
                "projections per cell store of one server or Citus (docs/scaling.md)"
            )
        return self.cells[0].read_models()

    def snapshot_rows(self) -> CellsSnapshotRows:
        """The snapshot rows, each in its stream's cell."""
        return CellsSnapshotRows(self)

    def close(self) -> None:
        """Close every cell. Idempotent."""
        errors: list[BaseException] = []
        for c in self.cells:
            try:
                c.close()
            except BaseException as exc:  # close the others, then report the first
                errors.append(exc)
        if errors:
            raise errors[0]


class CellsSnapshotRows:
    """Snapshot rows of a cell store: each row in the cell of its stream."""

    def __init__(self, rec: CellsRecorder) -> None:
        self._rec = rec

    def put(self, snap: Snapshot) -> None:
        """Insert or replace the row, in the stream's cell."""
        self._rec.cell_for(snap.stream_id).snapshot_rows().put(snap)

    def get(self, stream_id: str, projection: str) -> SnapshotRow | None:
        """The row of ``(stream_id, projection)``, or None."""
        return self._rec.cell_for(stream_id).snapshot_rows().get(stream_id, projection)

    def remove(self, stream_id: str, projection: str | None) -> int:
        """Delete the rows of a stream; return how many."""
        return self._rec.cell_for(stream_id).snapshot_rows().remove(stream_id, projection)

    def infos(self, stream_id: str | None) -> Iterator[SnapshotInfo]:
        """Every row's description, ordered by stream and projection."""
        if stream_id is not None:
            for info in self._rec.cell_for(stream_id).snapshot_rows().infos(stream_id):
                yield info
            return
        its = [c.snapshot_rows().infos(None) for c in self._rec.cells]
        for _, info in _merge(its, _info_key):
            yield info


_position = attrgetter("position")
_at = attrgetter("at")
_first = itemgetter(0)
_info_key = attrgetter("stream_id", "projection")


def _merge(
    its: list[Iterator[Any]],
    key: Callable[[Any], Any],
    *,
    parts: list[int] | None = None,
    order: Callable[[Any], Any] | None = None,
) -> Iterator[tuple[int, Any]]:
    """Merge per-cell iterators sorted by ``key`` (by ``order`` first; ties: the lower
    cell), each item with the cursor after it when given the cells' ``parts`` (else 0)."""
    by = order or key
    cur = None if parts is None else list(parts)  # the caller's list stays as given
    heap: list[tuple[Any, int, Any]] = []
    try:
        for i, it in enumerate(its):
            item = next(it, None)
            if item is not None:
                heap.append((by(item), i, item))
        heapq.heapify(heap)
        while heap:
            _, i, item = heapq.heappop(heap)
            if cur is not None:
                cur[i] = key(item)
            yield (0 if cur is None else pack(cur)), item
            nxt = next(its[i], None)
            if nxt is not None:
                heapq.heappush(heap, (by(nxt), i, nxt))
    finally:
        for it in its:
            close = getattr(it, "close", None)
            if close is not None:
                close()


def _check_passed_on(url: StoreURL, cfg: CellsConfig) -> None:
    """Refuse the parameters no cell takes, on the URL as given: a cell's URL is rebuilt
    from pieces, and the '@' by which the given one shows that a password holding an
    unencoded '?' may have become a parameter name is gone from it (StoreURL.unknown_params
    then hides every name)."""
    unknown = sorted({k for k, _ in cfg.extra} - set(PG_PARAMS) - libpq_options())
    if unknown:
        valid = [*OWN_PARAMS, *(p for p in PG_PARAMS if p != "schema")]
        raise ConfigError(
            f"{url.unknown_params(unknown)} for {url.redacted(unknown)}; valid: "
            f"{', '.join(valid)}, or any libpq option"
        )


def _check_requested(cfg: CellsConfig, cell_map: CellMap) -> None:
    """A URL may repeat the recorded ``partitions``/``cells``, never change them."""
    for name, asked, made in (
        ("partitions", cfg.partitions, cell_map.partitions),
        ("cells", cfg.cells, len(cell_map.cells)),
    ):
        if asked is not None and asked != made:
            raise ConfigError(
                f"{cfg.where} asks for {asked} {name}, but the store was created with "
                f"{made} (fixed at init; drop {name}= from the URL)"
            )
