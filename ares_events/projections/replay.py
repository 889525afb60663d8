# Generated from replay_async.py by tools/async_to_sync.py: do not edit.
"""Replay with a cap: fold a stream through a function, checking its chain as it goes.

``max_replay`` (default 10,000) bounds the work. Reaching it before the end of the
stream is never silent: the result says ``capped=True``, or in strict mode
:class:`~ares_events.errors.ReplayCapExceeded` is raised.

It may import the core, the stores, integrity and :mod:`.results`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ares_events.core.events import RecordedEvent
from ares_events.core.iterators import closing_iter
from ares_events.errors import ChainIntegrityError, InvalidEvent, ReplayCapExceeded
from ares_events.integrity.findings import Finding
from ares_events.integrity.verifier import ChainVerifier
from ares_events.projections.results import DEFAULT_MAX_REPLAY, ReplayResult

if TYPE_CHECKING:
    from ares_events.core.store import EventStore  # as is

__all__ = ["DEFAULT_MAX_REPLAY", "ReplayResult", "replay"]

S = TypeVar("S")


def replay(
    store: EventStore,
    stream_id: str,
    fold: Callable[[S, RecordedEvent], S],
    initial: S,
    *,
    from_version: int = 1,
    start_hash: bytes | None = None,
    max_replay: int = DEFAULT_MAX_REPLAY,
    strict: bool = False,
    verify: bool = True,
) -> ReplayResult[S]:
    """Fold ``stream_id`` from ``from_version`` through ``fold``, checking the chain.

    Args:
        store: the store (on the asyncio face, a blocking store works too: its calls run
            on worker threads).
        stream_id: the stream to fold.
        fold: ``fold(state, event) -> state``; must be pure.
        initial: the starting state (a snapshot's state when ``from_version > 1``).
        from_version: first version to fold.
        start_hash: hash of version ``from_version - 1`` (a snapshot's ``at_hash``); the
            chain is checked from there. Required when ``from_version > 1`` and verifying.
        max_replay: at most this many events are folded.
        strict: raise instead of reporting when the cap is hit or the chain is broken.
        verify: check the chain and the head (on by default).

    Raises:
        InvalidEvent: a bad ``max_replay``, ``from_version`` or a missing ``start_hash``.
        ReplayCapExceeded: strict mode and the cap was reached before the end.
        ChainIntegrityError: strict mode and the chain or head check found problems.
        StoreUnavailable: the store cannot be reached.
    """
    if type(max_replay) is not int or max_replay < 0:
        raise InvalidEvent("max_replay", f"must be an int >= 0, got {max_replay!r}")
    if type(from_version) is not int or from_version < 1:
        raise InvalidEvent("from_version", f"must be an int >= 1, got {from_version!r}")
    if verify and from_version > 1 and start_hash is None:
        raise InvalidEvent(
            "start_hash",
            f"is required to verify from version {from_version} (the hash of version "
            f"{from_version - 1}, e.g. a snapshot's at_hash)",
            stream_id=stream_id,
        )
    head = store.head(stream_id)
    head_version = head.version if head and type(head.version) is int else 0
    verifier = None
    if verify:
        verifier = ChainVerifier(
            stream_id, store.chain_key, start_version=from_version - 1, start_hash=start_hash
        )
    state = initial
    n = 0
    last: RecordedEvent | None = None
    capped = False
    start = from_version
    while True:
        progressed = False
        # Read one past the cap to learn whether the cap cut the stream short.
        with closing_iter(store.read(stream_id, start, None, max_replay - n + 1)) as evs:
            for e in evs:
                if n == max_replay:
                    capped = True
                    break
                if (
                    verifier is not None
                    and not verifier.check(e)
                    and verifier.findings[-1].kind == "malformed_row"
                ):
                    continue  # not an event (a tampered row): reported, never folded
                state = fold(state, e)
                last = e
                n += 1
                progressed = True
        version = last.version if last is not None else from_version - 1
        if (
            verifier is None
            or capped
            or head is None
            or type(head.version) is not int  # a malformed head row: check_head says so
            or version <= head.version
        ):
            break
        # A concurrent append moved the head past the one read first. Read the head again;
        # if it moved further still while the events were read, read up to it too, so a
        # stream that is being written is never reported as truncated. Events the head
        # names but the read cannot find stay a finding.
        head = store.head(stream_id)
        head_version = head.version if head and type(head.version) is int else 0
        if head is None or head_version <= version or not progressed:
            break
        start = version + 1
    findings: list[Finding] = []
    if verifier is not None:
        if not capped:
            verifier.check_head(head)
        findings = verifier.findings
    if capped and strict:
        raise ReplayCapExceeded(stream_id, max_replay, version)
    if findings and strict:
        raise ChainIntegrityError(stream_id, findings)
    return ReplayResult(
        state,
        version,
        n,
        capped,
        head_version,
        last.hash if last is not None else start_hash,
        findings,
    )
