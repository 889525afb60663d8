"""Verify one stream: recompute its chain from the stored fields and compare the end with
its head (one face written, the other generated).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ares_events.archive.segment import INDEX_KEY, SegmentIndex
from ares_events.core.backend import Head
from ares_events.core.events import RecordedEvent
from ares_events.core.faces import ASYNC, blocking
from ares_events.core.iterators_async import aclosing_iter, apages
from ares_events.core.recorder_async import system_of_record
from ares_events.core.traced import traced, verified
from ares_events.errors import ArchiveError
from ares_events.integrity.findings import Finding, VerifyReport
from ares_events.integrity.verifier import PAGE, ChainVerifier, head_problem

if ASYNC:
    from ares_events.stores.threaded import async_face

if TYPE_CHECKING:
    from ares_events.core.store import EventStore  # as is
    from ares_events.core.store_async import AsyncEventStore

__all__ = ["achain_start", "averify_stream", "check_stream", "stream_report"]


async def achain_start(store: AsyncEventStore, stream_id: str) -> tuple[int, bytes] | None:
    """Where ``stream_id``'s readable chain starts when its oldest events were retired
    from the archive (the tombstone's last version and hash), else None (genesis). Only
    a store whose identity names an archive reads its segment index."""
    ident = store.identity
    if ident is None or ident.archive is None:
        return None
    text = await store.recorder.meta_get(INDEX_KEY)  # type: ignore[attr-defined]
    return None if text is None else SegmentIndex.from_json(text).retired_end(stream_id)


@traced("verify", verified, activity=True)
async def averify_stream(store: AsyncEventStore | EventStore, stream_id: str) -> VerifyReport:
    """Recompute ``stream_id``'s chain from the stored fields and compare with its head.

    The head is read first, so events appended during verification do not count as
    a mismatch; the events come straight from the system of record (under any cache).

    Returns:
        A report with ``ok``, ``findings`` and ``events_checked``.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    if ASYNC:
        store = async_face(store)
    else:
        store = blocking(store, "ae.integrity.verify_stream", "ae.integrity.averify_stream")
    head = await store.head(stream_id)
    sv, sh = await achain_start(store, stream_id) or (0, None)
    v = ChainVerifier(stream_id, store.chain_key, start_version=sv, start_hash=sh)
    n, head = await check_stream(store, stream_id, v, head)
    return stream_report(v, n, head)


def stream_report(v: ChainVerifier, n: int, head: Head | None) -> VerifyReport:
    """Compare the end of the chain ``v`` checked (``n`` rows) with ``head``; the report."""
    v.check_head(head)
    head_version = head.version if head is not None and type(head.version) is int else 0
    return VerifyReport(v.stream_id, v.findings, n, v.last, head_version)


async def check_stream(
    store: AsyncEventStore,
    stream_id: str,
    v: ChainVerifier,
    head: Head | None,
    on_page: Callable[[list[RecordedEvent]], None] | None = None,
) -> tuple[int, Head | None]:
    """Check every event of the stream with ``v``, a page at a time, straight from the
    system of record (under any cache wrapper); ``on_page`` sees each page of rows as read
    (malformed ones included). Return how many rows and the head to compare with. A stream
    written while it is checked is followed: when the events read go past the head read
    first, the head is read again, and if it moved further the new events are read up to
    it too, so a live stream is never reported truncated."""
    source = system_of_record(store.recorder)
    n = 0
    start = v.last + 1  # 1, or after the trusted point the verifier starts from
    while True:
        progressed = False
        events = source.read(stream_id, start, None, None)
        try:
            async with aclosing_iter(apages(events, PAGE)) as each_page:
                async for page in each_page:
                    v.check_page(page)
                    if on_page is not None:
                        on_page(page)
                    n += len(page)
                    progressed = True
        except ArchiveError as exc:
            # Archived events that cannot be fetched or do not match what the store
            # recorded: a finding, never a silently shorter stream.
            v.findings.append(Finding(f"archive_{exc.kind}", stream_id, v.last + 1, str(exc)))
            return n, head
        if head is not None and (head_problem(head) is not None or v.last <= head.version):
            return n, head
        # Events past the head read first (or no head then): concurrent appends.
        head = await store.head(stream_id)
        if head is None or head_problem(head) is not None or head.version <= v.last:
            return n, head
        if not progressed:
            return n, head  # the head names events the read cannot find: truncated
        start = v.last + 1
