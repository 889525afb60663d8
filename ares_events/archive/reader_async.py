"""Reading through the archive: :class:`AsyncArchiveRecorder` serves the events an
archive run removed from the database out of the archive (docs/archive.md, "Reading
through"); one face written, the other generated.

It may import the core, :mod:`ares_events.errors`, the blob stores and this package.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final, TypeVar, cast

from ares_events.archive.erase import erase_archived
from ares_events.archive.segment import (
    INDEX_KEY,
    THROUGH_KEY,
    SegmentIndex,
    parse_through,
    through_update,
)
from ares_events.archive.source import ArchiveSource
from ares_events.core.backend import (
    AppendOutcome,
    ArchivedRow,
    Batch,
    Capability,
    EraseOutcome,
    Head,
    TrackingRecord,
)
from ares_events.core.events import ErasedPayloadRef, ExpectedVersion, RecordedEvent
from ares_events.core.faces import ASYNC
from ares_events.core.iterators_async import aclose_iter, afirst
from ares_events.errors import ArchiveError

logger = logging.getLogger(__name__)

__all__ = ["AsyncArchiveRecorder"]

_BIG: Final = 2**62
T = TypeVar("T")
PAGE: Final = 256
"""Events per database page of ``read_all``: under the garbage collector's threshold of
700 tracked objects (pages of 1000 spent 12% of a bare read's CPU in collections, 256 5%)."""


if ASYNC:

    async def _flatten(pages: AsyncIterator[list[RecordedEvent]]) -> AsyncIterator[RecordedEvent]:
        try:
            async for page in pages:
                for e in page:
                    yield e
        finally:
            await aclose_iter(pages)  # a reader that stops early closes the database read

else:
    _flatten = itertools.chain.from_iterable  # pages handed on at C speed


async def _take(it: AsyncIterator[RecordedEvent], n: int) -> list[RecordedEvent]:
    if ASYNC:
        out: list[RecordedEvent] = []
        if n > 0:
            async for e in it:
                out.append(e)
                if len(out) >= n:
                    break
        return out
    else:
        return list(itertools.islice(it, n))


def _lost(through: int) -> ArchiveError:
    """A segment index gone while ``archive/through`` says ``through``."""
    return ArchiveError(
        "missing", None, INDEX_KEY,
        f"{THROUGH_KEY} says position {through} is archived, but the record is gone",
    )  # fmt: skip


def _advanced(pos: int, upto: int, through: int) -> int:
    """``upto``, checked past ``pos`` (a bad index end would loop forever)."""
    if upto <= pos:
        raise ArchiveError(
            "corrupted", None, INDEX_KEY,
            f"archive/through says {through}, but no segment holds positions after {pos}",
        )  # fmt: skip
    return upto


class AsyncArchiveRecorder:
    """A recorder whose reads go on into the archive (docs/archive.md, "Reading through").

    Other methods forward to :attr:`inner`, each by a method of its own: ``isinstance``
    against a runtime-checkable protocol looks them up on the class (Python 3.12+).
    """

    def __init__(self, inner: Any, source: ArchiveSource | None = None) -> None:
        self.inner = inner
        self.capabilities: frozenset[Capability] = frozenset(inner.capabilities)
        self.source = source if source is not None else ArchiveSource()
        self._parsed: tuple[str | None, SegmentIndex | None] = (None, None)
        """The index as last read and parsed (text, index)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"

    def describe(self) -> str:
        """The backend's location, redacted."""
        return str(self.inner.describe())

    async def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """The backend's append (appends never touch the archive)."""
        return cast(AppendOutcome, await self.inner.append(batch, expected_version))

    async def append_many(
        self, batches: Sequence[tuple[Batch, ExpectedVersion]], tracking: TrackingRecord | None
    ) -> list[AppendOutcome]:
        return cast(list[AppendOutcome], await self.inner.append_many(batches, tracking))

    async def tracked_position(self, name: str) -> int | None:
        return cast(int | None, await self.inner.tracked_position(name))

    async def head(self, stream_id: str) -> Head | None:
        """The backend's head row (each stream's last event is never archived)."""
        return cast(Head | None, await self.inner.head(stream_id))

    def heads(self) -> AsyncIterator[tuple[str, Head]]:
        return cast(AsyncIterator[tuple[str, Head]], self.inner.heads())

    async def heads_page(
        self, after: str, limit: int, prefix: str | None
    ) -> list[tuple[str, Head]]:
        return cast(list[tuple[str, Head]], await self.inner.heads_page(after, limit, prefix))

    async def last_position(self) -> int:
        return cast(int, await self.inner.last_position())

    async def wait_for(self, position: int, timeout: float) -> bool:
        return cast(bool, await self.inner.wait_for(position, timeout))

    async def meta_get(self, key: str) -> str | None:
        return cast(str | None, await self.inner.meta_get(key))

    async def meta_put_if_absent(self, key: str, value: str) -> str:
        return cast(str, await self.inner.meta_put_if_absent(key, value))

    async def meta_set(self, key: str, value: str) -> None:
        await self.inner.meta_set(key, value)

    async def meta_swap(self, key: str, expected: str | None, value: str) -> bool:
        return cast(bool, await self.inner.meta_swap(key, expected, value))

    async def delete_archived(
        self, first_position: int, last_position: int, expected: Sequence[ArchivedRow]
    ) -> int:
        return cast(int, await self.inner.delete_archived(first_position, last_position, expected))

    def snapshot_rows(self) -> Any:
        return self.inner.snapshot_rows()

    def read_models(self) -> Any:
        return self.inner.read_models()

    def find_duplicates(self) -> AsyncIterator[tuple[str, Any, Any, int, Any]]:
        """The backend's duplicate scan (archived rows were unique when archived)."""
        return cast(AsyncIterator[tuple[str, Any, Any, int, Any]], self.inner.find_duplicates())

    def default_blobs_url(self) -> str | None:
        return cast(str | None, self.inner.default_blobs_url())

    async def segment_index(self) -> SegmentIndex | None:
        """The segment index as the database records it now (None: nothing was ever archived).

        Raises:
            ArchiveError: the record does not parse, or it is gone while
                ``archive/through`` says positions are archived (kind ``missing``).
        """
        return (await self._index_text())[1]

    async def _index_text(self) -> tuple[str | None, SegmentIndex | None]:
        text = await self.inner.meta_get(INDEX_KEY)
        if text is None:
            # Nothing archived yet, or the record is lost: the end row tells which. Taking
            # a lost index for none would make a stream read skip the archived versions
            # and a run start the archive over.
            raw = await self.inner.meta_get(THROUGH_KEY)
            through = 0 if raw is None else parse_through(raw)[0]
            if through > 0:
                # The index is recorded before its end row: a first run may have written
                # both since the read above.
                text = await self.inner.meta_get(INDEX_KEY)
                if text is None:
                    raise _lost(through)
        seen = self._parsed  # one read of the attribute: another thread may replace it
        if text != seen[0]:
            seen = (text, None if text is None else SegmentIndex.from_json(text))
        self._parsed = seen
        return seen

    async def _through(self) -> tuple[int, SegmentIndex | None]:
        """The last archived position and, when not 0, the segment index (read again only
        when the row's revision moved: the position always comes from the index, so a
        stale or hand-set row costs an index read, never a skipped range)."""
        raw = await self.inner.meta_get(THROUGH_KEY)
        if raw is None:  # a run stopped between the index and this row, or it was deleted
            ix = await self.segment_index()
            return (ix.through if ix is not None else 0), ix
        through, rev = parse_through(raw)
        ix = self._parsed[1]
        if ix is None or ix.rev != rev:
            ix = await self.segment_index()
        if ix is None:
            if through > 0:  # the rows below it are gone: never skip them
                raise _lost(through)
            return 0, None
        return ix.through, ix

    async def _record_through(self, ix: SegmentIndex) -> None:
        """:func:`ares_events.archive.erase.record_through` on this face."""
        while True:  # a lost swap means another writer moved the row: look at it again
            raw = await self.inner.meta_get(THROUGH_KEY)
            new = through_update(raw, ix)
            if new is None or await self.inner.meta_swap(THROUGH_KEY, raw, new):
                return

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> AsyncIterator[RecordedEvent]:
        """The stream's events from the database and, for versions no longer there, from
        the archive."""
        return _flatten(self._read_pages(stream_id, from_version, to_version, limit))

    async def _read_pages(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> AsyncIterator[list[RecordedEvent]]:
        """:meth:`read` as pages: a database page without a hole from ``v`` on (rows come in
        version order) is passed on whole, any other one event by event."""
        v = max(from_version, 1)
        hi = to_version if to_version is not None else _BIG
        left = limit if limit is not None else _BIG
        tolerate = False  # a gap the archive does not fill: read on as stored
        while left > 0 and v <= hi:
            it = self.inner.read(stream_id, v, to_version, None if limit is None else left)
            gap = False
            upto = hi  # the last version the archive serves before the database again
            try:
                while not gap:
                    page = await _take(it, PAGE)
                    if not page:
                        break
                    first, last = page[0][1], page[-1][1]
                    if (
                        not tolerate
                        and first == v
                        and type(first) is int
                        and type(last) is int
                        and last - first == len(page) - 1
                    ):
                        v = last + 1
                        if len(page) >= left:
                            yield page[:left]
                            return
                        left -= len(page)
                        yield page
                        continue
                    out: list[RecordedEvent] = []
                    for e in page:
                        ev = e[1]
                        if ev == v:
                            v += 1
                        elif type(ev) is int and ev > v:
                            if not tolerate:
                                # Versions v..ev-1 are not in the database: the archive
                                # serves those only. It may hold versions past ev (a run
                                # keeps each stream's last event, a later run archives the
                                # ones after it): reading on there would skip row ev.
                                gap, upto = True, ev - 1
                                break
                            v = ev + 1
                        # a lower or malformed version is passed on as stored: the
                        # verifier reports it
                        tolerate = False
                        out.append(e)
                        left -= 1
                        if left <= 0:
                            break
                    if out:
                        yield out
                    if left <= 0:
                        return
            finally:
                await aclose_iter(it)
            # Without a gap the database has nothing from v on (up to the bound). Each
            # stream's last event is never archived, so when nothing at all follows,
            # nothing after v exists (or a tampered store lost it: verification reports
            # the stream truncated); only events below one that follows can be archived.
            if not gap and (to_version is None or not await self._follows(stream_id, v)):
                return
            got = 0
            async for chunk in self._archived(stream_id, v, upto, left):
                yield chunk
                left -= len(chunk)
                got += len(chunk)
                v = chunk[-1].version + 1
            if got == 0:
                if not gap:
                    return
                tolerate = True

    async def _follows(self, stream_id: str, v: int) -> bool:
        return await afirst(self.inner.read(stream_id, v, None, 1)) is not None

    async def _archived(
        self, stream_id: str, v: int, hi: int, left: int
    ) -> AsyncIterator[list[RecordedEvent]]:
        """The stream's archived events ``v..hi`` (at most ``left``), a chunk at a time."""
        ix = await self.segment_index()  # raises when the record is lost: never a skip
        if ix is None:
            return  # nothing was ever archived
        cursor = None
        chunk_of = self.source.stream_chunk
        while left > 0 and v <= hi:
            ix, (chunk, cursor) = await self._fresh(ix, chunk_of, stream_id, v, cursor)
            out = [e for e in chunk if e.version <= hi][:left]
            if out:
                yield out
                left -= len(out)
                v = out[-1].version + 1
            if cursor is None or len(out) < len(chunk):
                return

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> AsyncIterator[RecordedEvent]:
        """Events in global order: from the archive below its last position, then from
        the database."""
        return _flatten(self._read_all(after_position, limit, stream_prefix))

    async def _read_all(
        self, after: int, limit: int | None, prefix: str | None
    ) -> AsyncIterator[list[RecordedEvent]]:
        """:meth:`read_all` as pages (the blocking face flattens them in C)."""
        pos = after
        left = limit if limit is not None else _BIG
        kw: dict[str, Any] = {"stream_prefix": prefix} if prefix else {}
        while left > 0:
            want = min(PAGE, left)
            page = [e async for e in self.inner.read_all(pos, want, **kw)]
            # Read after the page: rows deleted before it was read are below the archive's
            # position by now (recorded before the delete). One small read per page.
            through, ix = await self._through()
            if ix is not None and through > pos:
                # The archive holds what follows pos: serve it, block by block, up to its
                # end, then read the database again from there.
                while through > pos and left > 0:
                    events, upto = await self._merged_block(ix, pos, prefix)
                    pos = _advanced(pos, upto, through)
                    yield events[:left]
                    left -= min(len(events), left)
                continue
            yield page
            left -= len(page)
            if len(page) < want:
                return
            last = page[-1].position
            if type(last) is not int or last <= pos:
                # A tampered position: go on without the archive, exactly as stored.
                good = [e.position for e in page if type(e.position) is int]
                yield [e async for e in self.inner.read_all(max(good, default=0), left, **kw)]
                return
            pos = last

    async def _fresh(
        self, ix: SegmentIndex, fetch: Callable[..., T], *args: Any
    ) -> tuple[SegmentIndex, T]:
        """The index used and ``fetch(index, *args)`` (on a worker thread). An erasure
        elsewhere may have replaced the segment (and deleted the old object) since ``ix``
        was read: on a ``missing`` error, when the segment index changed, once more."""
        try:
            return ix, await asyncio.to_thread(fetch, ix, *args)
        except ArchiveError as exc:
            fresh = await self.segment_index() if exc.kind == "missing" else None
            if fresh is None or fresh.to_json() == ix.to_json():
                raise
        return fresh, await asyncio.to_thread(fetch, fresh, *args)

    async def _merged_block(
        self, ix: SegmentIndex, pos: int, prefix: str | None
    ) -> tuple[list[RecordedEvent], int]:
        """The archive's next block after ``pos`` merged with the database rows in its range
        (streams' last events, and rows an interrupted run left: served once)."""
        _, (events, upto) = await self._fresh(ix, self.source.events_after, pos, prefix)
        have = {e.position for e in events}
        extra: list[RecordedEvent] = []
        kw: dict[str, Any] = {"stream_prefix": prefix} if prefix else {}
        cur, more, want = pos, True, 1
        while more:
            # One row first: inside an archived range the database rarely has any, and a
            # page would read (and drop) rows past the block every time.
            page = [e async for e in self.inner.read_all(cur, want, **kw)]
            more = len(page) == want
            want = PAGE
            for e in page:
                p = e.position
                if type(p) is not int or p > upto:
                    more = False  # past the block (a tampered position sorts last)
                    break
                if p not in have:
                    extra.append(e)
                cur = p
        if extra:
            events = sorted([*events, *extra], key=lambda e: e.position)
        return events, upto

    async def positions(self, after_position: int) -> AsyncIterator[tuple[Any, Any, Any]]:
        """``(position, stream_id, version)`` in global order, archived rows included
        (the audit's order check)."""
        pos = after_position
        while True:
            through, ix = await self._through()
            if ix is not None and through > pos:
                events, upto = await self._merged_block(ix, pos, None)
                _advanced(pos, upto, through)
                for e in events:
                    yield e[2], e[0], e[1]
                pos = upto
                continue
            it = self.inner.positions(pos)
            jumped = False
            try:
                async for row in it:
                    p = row[0]
                    if type(p) is int and p > pos + 1:
                        # a hole: rows archived (and deleted) since the scan started?
                        again, _ = await self._through()
                        if again > pos:
                            jumped = True
                            break
                    yield row
                    if type(p) is int and p > pos:
                        pos = p
            finally:
                await aclose_iter(it)
            if not jumped:
                return

    async def erase(
        self,
        stream_id: str,
        version: int,
        position: int,
        event_hash: bytes,
        ref: ErasedPayloadRef,
        blob_key: str | None = None,
    ) -> EraseOutcome:
        """Erase in the database; an archived event's segment is rewritten instead (its
        rows, chain and Merkle leaves unchanged but for that payload)."""
        out: EraseOutcome = await self.inner.erase(
            stream_id, version, position, event_hash, ref, blob_key
        )
        if out.erased:
            return out
        for _ in range(5):  # another erasure or archive run swapped the segment index: again
            text, ix = await self._index_text()
            if text is None or ix is None or ix.segment_at(position) is None:
                return out
            args = (self.source, ix, stream_id, version, position, event_hash, ref, blob_key)
            done = await asyncio.to_thread(erase_archived, *args)
            if done is None:
                return out
            new_ix, refs, old_keys = done
            new_text = new_ix.to_json()
            if await self.inner.meta_swap(INDEX_KEY, text, new_text):
                await self._record_through(new_ix)
                # The old objects hold the payload: delete them now (the segment index names
                # them as pending until then, so a crash here leaves them to the next run).
                await asyncio.to_thread(self.source.drop_objects, new_ix, old_keys)
                left = tuple(k for k in new_ix.pending if k not in old_keys)
                clean = dataclasses.replace(new_ix, pending=left)
                await self.inner.meta_swap(INDEX_KEY, new_text, clean.to_json())
                return EraseOutcome(True, refs)
        raise ArchiveError("busy", None, INDEX_KEY, "the segment index kept changing; erase again")

    async def close(self) -> None:
        """Close the archive's blob store, then the backend."""
        try:
            await asyncio.to_thread(self.source.close)
        finally:
            await self.inner.close()
