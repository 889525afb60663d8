"""What the console's views show, read from the store a page at a time; nothing here
writes. It may import anything below the console.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Final

from ares_events.agents.approvals import APPROVAL_REASON
from ares_events.agents.journal_errors import RunNotFound
from ares_events.agents.run_info import (
    RunCounts,
    StepInfo,
    listed_under,
    request_of,
    run_counts,
    run_status,
    steps_of,
)
from ares_events.core.backend import Head
from ares_events.core.events import ERASURE_STREAM, RecordedEvent
from ares_events.core.iterators import closing_iter, first
from ares_events.core.store import EventStore
from ares_events.integrations import LANGGRAPH_STREAM_PREFIX
from ares_events.integrity.findings import Finding
from ares_events.integrity.verifier import ChainVerifier
from ares_events.projections.builtin import RunStateProjection
from ares_events.projections.recovery import recover

__all__ = [
    "EVENTS_PER_PAGE",
    "STEPS_PER_PAGE",
    "STREAMS_PER_PAGE",
    "PageChain",
    "RunCache",
    "RunSummary",
    "StreamRow",
    "approval_request",
    "event_page",
    "kind_of",
    "load_requests",
    "page_chain",
    "page_of_step",
    "run_rows",
    "steps_page",
    "stream_rows",
    "summarize",
]

STREAMS_PER_PAGE: Final = 50
EVENTS_PER_PAGE: Final = 100
STEPS_PER_PAGE: Final = 50
RUN_SCAN: Final = 400
"""Streams looked at per page of the runs list (runs have no index of their own)."""
_LIFECYCLE: Final = ("run.", "agent.")


def kind_of(stream_id: str, first_event: RecordedEvent | None) -> str:
    """What a stream is, from its id and first event."""
    if stream_id.startswith(LANGGRAPH_STREAM_PREFIX):
        return "langgraph thread"
    if stream_id == ERASURE_STREAM:
        return "erasure record"
    if first_event is None:
        return "empty"
    if first_event.type == "run.started":
        return "run"
    if first_event.type.startswith("agent.") or first_event.module == "runtime":
        return "agent"
    return "stream"


@dataclass(frozen=True, slots=True)
class StreamRow:
    """One line of the streams list."""

    stream_id: str
    version: int
    head: bytes
    kind: str
    last_at: str | None


def stream_rows(
    store: EventStore, *, prefix: str | None, after: str, limit: int = STREAMS_PER_PAGE
) -> tuple[list[StreamRow], str | None]:
    """One page of streams and the cursor of the next page (None: this is the last)."""
    page = store.streams_page(after=after, prefix=prefix, limit=limit + 1)
    rows = [_row(store, sid, head) for sid, head in page[:limit]]
    return rows, (rows[-1].stream_id if len(page) > limit and rows else None)


def _row(store: EventStore, sid: str, head: Head) -> StreamRow:
    opening = first(store.read(sid, 1, limit=1))
    last = opening if head.version <= 1 else first(store.read(sid, head.version, limit=1))
    last_at = last.at if last is not None else None
    return StreamRow(sid, head.version, head.hash, kind_of(sid, opening), last_at)


def event_page(
    store: EventStore, stream_id: str, from_version: int, limit: int = EVENTS_PER_PAGE
) -> list[RecordedEvent]:
    """At most ``limit`` events from ``from_version`` (never the whole stream)."""
    with closing_iter(store.read(stream_id, max(1, from_version), limit=limit)) as events:
        return list(events)


@dataclass(frozen=True, slots=True)
class PageChain:
    """The chain status of one page: links checked from the event before it."""

    ok: bool
    checked: int
    findings: list[Finding]
    at_head: bool  # the page ends at the head, and the head was compared too


def page_chain(
    store: EventStore, stream_id: str, events: list[RecordedEvent], head: Head | None
) -> PageChain:
    """Check a page's links (from the hash of the event before it) and, when it ends at
    the head, compare with the head."""
    if not events:
        return PageChain(True, 0, [], False)
    start = events[0].version
    # From version 1 the verifier starts at the genesis link and ignores start_hash.
    before = first(store.read(stream_id, start - 1, limit=1)) if start > 1 else None
    start_hash = before.hash if before is not None else b""
    v = ChainVerifier(stream_id, store.chain_key, start_version=start - 1, start_hash=start_hash)
    v.check_page(events)
    at_head = head is not None and events[-1].version >= head.version
    if at_head:
        v.check_head(head)
    return PageChain(not v.findings, len(events), list(v.findings), at_head)


# -- runs ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A run as its log tells it (the fields of :class:`~ares_events.agents.runs.RunInfo`),
    without a step object per step: :func:`steps_page` builds those for one page, so a run
    of 10,000 steps costs a fold, not 10,000 objects, per view."""

    run_id: str
    status: str
    version: int
    code_revision: str | None
    step_keys: tuple[str, ...]
    """Every step number (as the fold keys them), in order."""
    usage: dict[str, Any]
    counts: RunCounts
    """The run's numbers (:func:`~ares_events.agents.run_info.run_counts`, as ``runs``)."""
    interrupt: dict[str, Any] | None
    error: str | None
    result: Any
    cancelled: dict[str, Any] | None
    updated_at: str | None
    started_at: str | None
    in_doubt: tuple[StepInfo, ...]
    findings: list[Finding]
    skipped: list[str]
    state: dict[str, Any] = field(repr=False)

    @property
    def ok(self) -> bool:
        """The chain checked clean and every event matched its schema."""
        return not self.findings and not self.skipped

    def matches(self, status: str | None) -> bool:
        """Whether this run is listed under ``status`` (as ``RunInfo.matches``)."""
        return listed_under(status, self.status, bool(self.in_doubt))


def summarize(store: EventStore, run_id: str) -> RunSummary:
    """Fold the run from its first event (the whole chain checked, schema problems
    listed), appending nothing. Raises RunNotFound when it is not a run."""
    opening = first(store.read(run_id, 1, limit=1))
    if opening is None or opening.type != "run.started":
        raise RunNotFound(run_id, "no such run" if opening is None else "not a run")
    # The whole chain, as `runs show`: a snapshot vouches only for the fold it saved.
    rep = recover(store, run_id, RunStateProjection(), max_replay=2**62, tolerant=True)
    state, last = rep.state, first(store.read(run_id, rep.version, limit=1))
    keys = tuple(sorted(state["steps"], key=int))
    doubt = {k: state["steps"][k] for k in keys if _in_doubt(state["steps"][k])}
    return RunSummary(
        run_id=run_id,
        status=run_status(state),
        version=rep.version,
        code_revision=state["code_revision"],
        step_keys=keys,
        usage=dict(state["usage"]),
        counts=run_counts(state),
        interrupt=state["interrupt"],
        error=state["error"],
        result=state.get("result"),
        cancelled=state.get("cancelled"),
        updated_at=last.at if last is not None else None,
        started_at=opening.at,
        in_doubt=steps_of({**state, "steps": doubt}, {}),
        findings=list(rep.findings),
        skipped=[f"version {x.version}: {x.type}: {x.reason}" for x in rep.skipped],
        state=state,
    )


def _in_doubt(rec: Any) -> bool:
    return isinstance(rec, dict) and rec.get("kind") == "tool" and rec.get("status") == "requested"


def steps_page(run: RunSummary, page: int, per_page: int = STEPS_PER_PAGE) -> list[StepInfo]:
    """The steps of one page (1-based), built from the fold."""
    keys = run.step_keys[(page - 1) * per_page : page * per_page]
    return list(steps_of({**run.state, "steps": {k: run.state["steps"][k] for k in keys}}, {}))


def page_of_step(run: RunSummary, step: int, per_page: int = STEPS_PER_PAGE) -> int:
    """The page that shows ``step``."""
    keys = run.step_keys
    return keys.index(str(step)) // per_page + 1 if str(step) in keys else 1


@dataclass
class _Cached:
    run: RunSummary
    lifecycle: list[RecordedEvent] = field(default_factory=list)


class RunCache:
    """Folded runs by ``(run id, version)``, least recently used out first; a run's
    lifecycle events are read once and then only its new events."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, int], _Cached] = OrderedDict()
        self._life: dict[str, tuple[int, list[RecordedEvent]]] = {}

    def get(self, store: EventStore, run_id: str) -> _Cached:
        """The run as its log tells it now, folded once per version (RunNotFound: not a run)."""
        key = (run_id, store.stream_version(run_id))
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
            seen, life = self._life.get(run_id, (0, []))
        run = summarize(store, run_id)
        if seen > run.version:  # rewritten or truncated since: read it all again
            seen, life = 0, []
        life = life + _lifecycle(store, run_id, seen + 1, run.version, _LIFE_CAP - len(life))
        found = _Cached(run, life)
        with self._lock:
            self._items[(run_id, run.version)] = found
            self._life[run_id] = (run.version, life)
            while len(self._items) > self._size:
                old, _ = self._items.popitem(last=False)
                if not any(k[0] == old[0] for k in self._items):
                    self._life.pop(old[0], None)
        return found


_LIFE_CAP: Final = 500


def _lifecycle(store: EventStore, run_id: str, lo: int, hi: int, cap: int) -> list[RecordedEvent]:
    """The run's lifecycle events between versions ``lo`` and ``hi`` (start, gates,
    interrupts, resumes, cancels, ends), at most ``cap``."""
    if cap <= 0 or lo > hi:
        return []
    with closing_iter(store.read(run_id, lo, hi)) as events:
        return list(islice((e for e in events if e.type.startswith(_LIFECYCLE)), cap))


def run_rows(
    store: EventStore,
    cache: RunCache,
    *,
    status: str | None,
    prefix: str | None,
    after: str,
    limit: int = 25,
) -> tuple[list[RunSummary], str | None]:
    """Runs among the next :data:`RUN_SCAN` streams after ``after`` (optionally of one
    status), and the cursor to go on from (None: the end of the store)."""
    rows: list[RunSummary] = []
    page = store.streams_page(after=after, prefix=prefix, limit=RUN_SCAN)
    last = after
    for sid, _head in page:
        last = sid
        try:
            got = cache.get(store, sid)
        except RunNotFound:
            continue
        if got.run.matches(status):
            rows.append(got.run)
            if len(rows) >= limit:
                break
    more = len(page) == RUN_SCAN or (len(rows) >= limit and last != page[-1][0])
    return rows, (last if more else None)


def approval_request(store: EventStore, run: RunSummary) -> dict[str, Any] | None:
    """What the run, paused for a signed approval, asks to approve (its interrupt's
    payload: step, tool name, arguments and their digest); None when it waits for none."""
    interrupt = run.interrupt or {}
    version = interrupt.get("version")
    if run.status != "paused" or interrupt.get("reason") != APPROVAL_REASON:
        return None
    got = event_page(store, run.run_id, int(version), 1) if type(version) is int else []
    if got and got[0].version == version and not got[0].payload_erased:
        payload = got[0].payload
        if isinstance(payload, dict):
            return payload
    return {"step": interrupt.get("step"), "key": interrupt.get("key")}


def load_requests(store: EventStore, run_id: str, steps: list[StepInfo]) -> dict[int, Any]:
    """What each model and tool step of ``steps`` asked, by step number (one range read)."""
    versions = {
        s.attempts[0].version: s.step
        for s in steps
        if s.kind in ("model", "tool") and s.attempts and isinstance(s.attempts[0].version, int)
    }
    if not versions:
        return {}
    with closing_iter(store.read(run_id, min(versions), max(versions))) as events:
        found = ((versions[e.version], request_of(e)) for e in events if e.version in versions)
        return {step: req for step, req in found if req is not None}
