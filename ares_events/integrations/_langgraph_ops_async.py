"""The LangGraph checkpointer's operations, one face written, the other generated: each
takes a :class:`Job`, one thread's verified index held under the thread's lock.

It may import the package below ``integrations`` and ``langgraph``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ares_events.core.events import ANY, AppendResult, NewEvent
from ares_events.errors import ChainIntegrityError, ConcurrencyError, InvalidEvent
from ares_events.integrations._conversation_async import erase_events
from ares_events.integrations._faces import MISS
from ares_events.integrations._langgraph_core import (
    BRANCH_SOURCES,
    MODULE,
    T_PRUNED,
    CheckpointRec,
    EncodedValue,
    ThreadIndex,
    encode_value,
    pack,
    unb64,
    unpack,
)
from ares_events.integrations._langgraph_plan import (
    ValueCache,
    materialise,
    pending_writes,
    plan_put,
    prune_plan,
    verify_fetched,
    writes_event,
)
from ares_events.integrity.findings import Finding

if TYPE_CHECKING:
    from ares_events.core.store_async import AsyncEventStore

MAX_RETRIES = 1000


@dataclass(slots=True)
class Job:
    """One thread's verified index, with the saver's store, serializer, value cache and
    name in erasure records."""

    store: AsyncEventStore
    index: ThreadIndex
    serde: SerializerProtocol
    cache: ValueCache | None
    by: str


async def refresh(job: Job, *, check: bool = True) -> None:
    """Bring the index up to the stream's end, verifying every new event (with ``check``,
    ChainIntegrityError when the thread does not verify)."""
    store, index = job.store, job.index
    if not index.started:
        head = await store.head(index.stream_id)
        events = [e async for e in store.read(index.stream_id, 1, head.version)] if head else []
        index.apply_all(events, head)
    else:
        events = [e async for e in store.read(index.stream_id, index.verifier.last + 1, None)]
        index.apply_all(events)
    if check:
        index.check()


async def append_checked(job: Job, build: Callable[[], Sequence[NewEvent]]) -> AppendResult | None:
    """Append what ``build`` plans at the version the index is at, and apply it; after a
    concurrent write, read it (verified) and plan again. Nothing to append: None."""
    store, index = job.store, job.index
    if not index.started:
        await refresh(job, check=False)
    index.check()
    for _ in range(MAX_RETRIES):
        events = list(build())
        if not events:
            return None
        try:
            res = await store.append(index.stream_id, events, expected_version=index.version)
        except ConcurrencyError:
            await refresh(job)
            continue
        index.apply_own(res.version, events)
        return res
    raise ConcurrencyError(  # pragma: no cover - a thousand writers on one thread
        index.stream_id, index.version, index.version, "too many concurrent writers"
    )


def _ids(config: RunnableConfig) -> tuple[Any, str, str | None]:
    """The thread id as the caller gave it (an ``int`` stays one in the configs returned,
    as LangGraph's own savers return it), the namespace and the checkpoint id."""
    conf = config["configurable"]
    return conf["thread_id"], conf.get("checkpoint_ns", "") or "", get_checkpoint_id(config)


def _config(tid: Any, ns: str, cid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": cid}}


async def get_checkpoint(job: Job, config: RunnableConfig) -> CheckpointTuple | None:
    tid, ns, cid = _ids(config)
    await refresh(job)
    rec = job.index.get(ns, cid)
    if rec is None:
        return None
    return build_tuple(job, tid, rec, await fetch_values(job, [rec], job.cache))


async def fetch_values(
    job: Job, recs: Sequence[CheckpointRec], cache: ValueCache | None
) -> dict[int, Any]:
    """Payloads of the spilled values these checkpoints need (and ``cache`` does not
    hold decoded), each checked again."""
    index = job.index
    out: dict[Any, Any] = {}
    for rec in recs:
        digests = list((rec.payload.get("vals") or {}).values())
        if cache is not None:
            # A decoded value held now is pinned for this read (the cache may drop it).
            for d in list(digests):
                hit = cache.get((index.stream_id, d))
                if hit is not MISS:
                    out[("pinned", d)] = hit
                    digests.remove(d)
        # The spilled value events the materialisation will need.
        for v in [r.version for d in digests for r in index.chain(d) if r.payload is None]:
            if v in out:
                continue
            events = [e async for e in job.store.read(index.stream_id, v, v)]
            if not events:
                gone = Finding("truncated", index.stream_id, v, "event no longer stored")
                raise ChainIntegrityError(index.stream_id, [gone])
            verify_fetched(index, events[0])
            out[v] = events[0].payload
    return out


def build_tuple(
    job: Job, tid: Any, rec: CheckpointRec, fetched: Mapping[int, Any]
) -> CheckpointTuple:
    """Decode a checkpoint (run under the thread's lock: the index does not change)."""
    p, serde = rec.payload, job.serde
    cp: Checkpoint = unpack(serde, p["cp"])
    cp["channel_values"] = {
        ch: materialise(job.index, serde, d, fetched, job.cache)
        for ch, d in (p.get("vals") or {}).items()
    }
    md: CheckpointMetadata = unpack(serde, p["md"])
    parent = _config(tid, rec.ns, rec.parent) if rec.parent is not None else None
    return CheckpointTuple(_config(tid, rec.ns, rec.id), cp, md, parent, pending_writes(serde, rec))


async def put_checkpoint(
    job: Job,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> RunnableConfig:
    tid, ns, parent = _ids(config)
    source = metadata.get("source")
    index, serde = job.index, job.serde
    if not index.started:
        await refresh(job, check=False)
    index.check()
    # A root (parentless, not a deliberate branch) is appended only while its namespace is
    # empty, so two writers that both started it cannot give it two roots. Whether the
    # writer saw it empty is the writer's word, not what the index holds now (one saver
    # serving both writers holds the winner's root): in the thread's namespace a negative
    # step marks LangGraph's first checkpoint of a run that loaded none. Another parentless
    # checkpoint of a started namespace is added on purpose (a subgraph replayed from
    # before it first ran, a caller putting without a parent).
    step = metadata.get("step")
    first = ns == "" and isinstance(step, int) and step < 0
    root = parent is None and source not in BRANCH_SOURCES and (first or index.latest(ns) is None)
    cp: dict[str, Any] = dict(checkpoint)
    values: dict[str, Any] = cp.pop("channel_values", None) or {}
    md = dict(get_checkpoint_metadata(config, metadata))
    payload = {"ns": ns, "id": checkpoint["id"], "parent": parent, "cp": pack(serde, cp)}
    payload["md"] = pack(serde, md)  # and "vals", by plan_put
    # Per channel: its encoded value, or the digest of the parent's value when unchanged.
    prev = index.checkpoints.get((ns, parent)) if parent is not None else None
    prev_vals = (prev.payload.get("vals") or {}) if prev is not None else {}
    prev_versions = prev.plain("cp", "channel_versions") if prev is not None else None
    prev_versions = prev_versions if isinstance(prev_versions, dict) else {}
    encoded: dict[str, EncodedValue | str] = {}
    for ch, ver in (checkpoint.get("channel_versions") or {}).items():
        if ch not in new_versions and ch in prev_vals and prev_versions.get(ch) == ver:
            encoded[ch] = prev_vals[ch]
        elif ch in values:
            encoded[ch] = encode_value(serde, values[ch])

    def build() -> list[NewEvent]:
        return plan_put(index, dict(payload), encoded, ns, checkpoint["id"], parent, source, root)

    await append_checked(job, build)
    return _config(tid, ns, checkpoint["id"])


async def put_writes(
    job: Job, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, path: str
) -> None:
    _tid, ns, cid = _ids(config)
    if cid is None:
        raise InvalidEvent("config", "put_writes needs a checkpoint_id in the config")

    def build() -> list[NewEvent]:
        ev = writes_event(job.index, job.serde, ns, cid, writes, task_id, path)
        return [] if ev is None else [ev]

    await append_checked(job, build)


async def list_checkpoints(
    job: Job,
    config: RunnableConfig,
    filter: Mapping[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> list[CheckpointTuple]:
    """Matching checkpoints of one thread, newest first (decoded)."""
    conf = config.get("configurable", {})
    tid = conf["thread_id"]
    await refresh(job)
    ns = conf.get("checkpoint_ns")
    cid = conf.get("checkpoint_id")
    before_id = get_checkpoint_id(before) if before else None
    recs = sorted(job.index.checkpoints.values(), key=lambda r: r.id, reverse=True)
    out_recs: list[CheckpointRec] = []
    for rec in recs:
        if (ns is not None and rec.ns != ns) or (cid is not None and rec.id != cid):
            continue
        if before_id is not None and rec.id >= before_id:
            continue
        if filter:
            md = unpack(job.serde, rec.payload["md"])
            if not all(md.get(k) == v for k, v in filter.items()):
                continue
        out_recs.append(rec)
        if limit is not None and len(out_recs) >= limit:
            break
    fetched = await fetch_values(job, out_recs, job.cache)
    return [build_tuple(job, tid, r, fetched) for r in out_recs]


async def drop_checkpoints(
    job: Job, plan: Callable[[], tuple[Sequence[NewEvent], list[int] | None]], reason: str
) -> int:
    """Append what ``plan`` says (events to write first, and the versions to drop; None:
    the whole thread) with a ``lg.pruned`` record, at the version the plan was made on
    (planned again after a concurrent write), then erase those events' payloads (blobs
    too) and record each erasure. Returns how many payloads were erased."""
    await refresh(job)
    chosen: list[list[int] | None] = []

    def build() -> list[NewEvent]:
        first, drop = plan()
        chosen[:] = [drop]
        if (drop is None and job.index.version == 0) or (drop is not None and not drop):
            return []
        payload = {"drop": drop or [], "all": drop is None, "reason": reason}
        return [*first, NewEvent(type=T_PRUNED, module=MODULE, payload=payload)]

    res = await append_checked(job, build)
    if res is None:
        return 0
    drop = chosen[0]
    targets = list(range(1, res.version)) if drop is None else drop
    return await erase_events(job.store, job.index.stream_id, targets, reason, job.by)


async def prune(job: Job, keep_last: int | None, older_than: str | None) -> int:
    what = f"keep the last {keep_last}" if keep_last is not None else "all"
    if older_than is not None:
        what += f" not older than {older_than}"
    plan = functools.partial(prune_plan, job.index, keep_last, older_than)
    return await drop_checkpoints(job, plan, f"langgraph prune ({what})")


async def delete_thread(job: Job) -> int:
    return await drop_checkpoints(job, lambda: ((), None), "langgraph delete_thread")


async def delete_runs(job: Job, run_ids: set[str]) -> int:
    index = job.index

    def plan() -> tuple[Sequence[NewEvent], list[int] | None]:
        recs = index.checkpoints.values()
        keep = [r for r in recs if unpack(job.serde, r.payload["md"]).get("run_id") not in run_ids]
        return (), [] if len(keep) == len(recs) else index.unneeded(keep)

    return await drop_checkpoints(job, plan, "langgraph delete_for_runs")


async def copy_thread(job: Job, dst_stream: str) -> int:
    """Append the live events of the thread to ``dst_stream`` (read again, verified)."""
    from ares_events.integrity.verifier import ChainVerifier

    store, src = job.store, job.index
    await refresh(job)
    live = {v for v, (k, _) in src.by_version.items() if k != "pruned"}
    if not live:
        return 0
    events = [e async for e in store.read(src.stream_id, 1, src.version)]
    check = ChainVerifier(src.stream_id, src.key)
    out = []
    for e in events:
        if not check.check(e):
            src.findings.extend(check.findings)
            src.check()
        if e.version in live:
            out.append(
                NewEvent(type=e.type, module=e.module, payload=e.payload, metadata=e.metadata)
            )
    if out:
        await store.append(dst_stream, out, expected_version=ANY)
    return len(out)


async def delta_history(
    job: Job, config: RunnableConfig, channels: Sequence[str]
) -> dict[str, DeltaChannelHistory]:
    """``get_delta_channel_history`` from the index: the same walk as the base class's
    (parent chain, each checkpoint's pending writes in ``writes_sort_key`` order, the
    nearest stored value as the seed), decoding only the writes and seeds it returns."""
    _tid, ns, cid = _ids(config)
    await refresh(job)
    index, serde = job.index, job.serde
    if not channels:
        return {}
    collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
    seeds: dict[str, str] = {}
    remaining = set(channels)
    target = index.get(ns, cid)
    cursor = target.parent if target is not None else None
    path: list[CheckpointRec] = []
    seen: set[str] = set()
    while cursor is not None and remaining and cursor not in seen:
        seen.add(cursor)
        rec = index.checkpoints.get((ns, cursor))
        if rec is None:
            break
        path.append(rec)
        ws = sorted(rec.writes.values(), key=lambda w: writes_sort_key(w.path, w.task_id, w.idx))
        for w in reversed(ws):
            if w.channel in remaining:
                collected[w.channel].append(
                    (w.task_id, w.channel, serde.loads_typed((w.t, unb64(w.b))))
                )
        vals = rec.payload.get("vals") or {}
        for ch in list(remaining):
            if ch in vals:
                seeds[ch] = vals[ch]
                remaining.discard(ch)
        cursor = rec.parent
    fetched = await fetch_values(job, path, None)
    out: dict[str, DeltaChannelHistory] = {}
    for ch in channels:
        entry: DeltaChannelHistory = {"writes": list(reversed(collected[ch]))}
        if ch in seeds:
            entry["seed"] = materialise(index, serde, seeds[ch], fetched, job.cache)
        out[ch] = entry
    return out
