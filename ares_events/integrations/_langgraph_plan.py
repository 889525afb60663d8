"""Planning and decoding for the LangGraph checkpointer, over the verified index: the events
of a put, a ``put_writes`` and a prune; pending writes; channel values rebuilt from their
delta chains; spilled values checked again; erasure records.

It may import the package below ``integrations``, ``_langgraph_core`` and ``langgraph``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from langgraph.checkpoint.base import WRITES_IDX_MAP, PendingWrite, writes_sort_key
from langgraph.checkpoint.serde.base import SerializerProtocol

from ares_events.chain import header_bytes, link_hash
from ares_events.core.events import NewEvent, RecordedEvent
from ares_events.errors import ChainIntegrityError
from ares_events.integrations._faces import MISS, Table
from ares_events.integrations._langgraph_core import (
    BRANCH_SOURCES,
    MAX_DELTA_DEPTH,
    MODULE,
    T_CHECKPOINT,
    T_VALUE,
    T_WRITES,
    CheckpointRec,
    EncodedValue,
    StaleWriteError,
    ThreadIndex,
    _item_digest,
    b64,
    unb64,
)
from ares_events.integrity.findings import Finding


def plan_put(
    index: ThreadIndex,
    encoded_cp: dict[str, Any],
    values: Mapping[str, EncodedValue | str],
    ns: str,
    checkpoint_id: str,
    parent: str | None,
    source: object,
    root: bool = False,
) -> list[NewEvent]:
    """The events of a put against what the index knows now (``values``: per channel, the
    encoded value, or the digest of the parent's unchanged one). ``root``: the writer saw
    the namespace empty, so the checkpoint is its first and must stay its only root
    (StaleWriteError when another writer continued ``parent`` or started the namespace).
    """
    if root and (ns, checkpoint_id) not in index.checkpoints:
        first = index.latest(ns)
        if first is not None:
            raise StaleWriteError(index.stream_id, ns, None, first.id, index.version, checkpoint_id)
    if parent is not None and source not in BRANCH_SOURCES:
        winner = index.continued.get((ns, parent))
        if winner is not None and winner != checkpoint_id:
            raise StaleWriteError(index.stream_id, ns, parent, winner, index.version, checkpoint_id)
    parent_rec = index.checkpoints.get((ns, parent)) if parent is not None else None
    parent_vals = (parent_rec.payload.get("vals") or {}) if parent_rec else {}
    events: list[NewEvent] = []
    vals: dict[str, str] = {}
    for ch, enc in values.items():
        vals[ch] = enc if isinstance(enc, str) else enc.digest
        if isinstance(enc, str) or enc.digest in index.values:
            continue
        if any(e.payload.get("d") == enc.digest for e in events if e.type == T_VALUE):
            continue
        events.append(_value_event(index, ns, ch, enc, parent_vals.get(ch)))
    encoded_cp["vals"] = vals
    events.append(NewEvent(type=T_CHECKPOINT, module=MODULE, payload=encoded_cp))
    return events


def _value_event(
    index: ThreadIndex, ns: str, ch: str, enc: EncodedValue, prev: str | None
) -> NewEvent:
    if enc.items is None:
        assert enc.typed is not None
        t, b = enc.typed
        whole = {"d": enc.digest, "t": t, "b": b64(b)}
        return NewEvent(type=T_VALUE, module=MODULE, payload=whole, metadata={"d": enc.digest})
    assert enc.item_digests is not None
    base_items = _base_items(index, ns, ch, prev)
    index.last_list[(ns, ch)] = (enc.digest, enc.item_digests)
    start = 0
    payload: dict[str, Any] = {"d": enc.digest}
    meta: dict[str, Any] = {"d": enc.digest}
    if base_items is not None and prev is not None:
        n = len(base_items)
        base_rec = index.values.get(prev)
        depth = (base_rec.depth if base_rec else 0) + 1
        if (
            base_rec is not None
            and 0 < n <= len(enc.item_digests)
            and depth <= MAX_DELTA_DEPTH
            and enc.item_digests[:n] == base_items
        ):
            start = n
            payload.update(base=prev, n=n, depth=depth)
            meta.update(base=prev, depth=depth)
    payload["list"] = [[t, b64(b)] for t, b in enc.items[start:]]
    return NewEvent(type=T_VALUE, module=MODULE, payload=payload, metadata=meta)


def _base_items(index: ThreadIndex, ns: str, ch: str, prev: str | None) -> list[bytes] | None:
    """Item digests of the list value ``prev`` when the index can tell them cheaply."""
    if prev is None:
        return None
    cached = index.last_list.get((ns, ch))
    if cached is not None and cached[0] == prev:
        return cached[1]
    # Not the last list this saver wrote (another process, a restart): rebuild the item
    # digests from the stored items when they are all in memory.
    items = _items_in_memory(index, prev)
    return None if items is None else [_item_digest(t, unb64(b)) for t, b in items]


def writes_event(
    index: ThreadIndex,
    serde: SerializerProtocol,
    ns: str,
    checkpoint_id: str,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> NewEvent | None:
    """The event of a ``put_writes``, without the regular writes already stored."""
    stored = index.writes_of(ns, checkpoint_id)
    out = []
    for i, (ch, value) in enumerate(writes):
        idx = WRITES_IDX_MAP.get(ch, i)
        if idx >= 0 and (task_id, idx) in stored:
            continue
        t, b = serde.dumps_typed(value)
        out.append([idx, ch, t, b64(b)])
    payload = {"ns": ns, "cp": checkpoint_id, "task": task_id, "path": task_path, "w": out}
    return NewEvent(type=T_WRITES, module=MODULE, payload=payload) if out else None


def pending_writes(serde: SerializerProtocol, rec: CheckpointRec) -> list[PendingWrite]:
    ws = sorted(rec.writes.values(), key=lambda w: writes_sort_key(w.path, w.task_id, w.idx))
    return [(w.task_id, w.channel, serde.loads_typed((w.t, unb64(w.b)))) for w in ws]


def verify_fetched(index: ThreadIndex, e: RecordedEvent) -> None:
    """Check an event fetched again (a spilled value) against the hash verified when the
    index read it (ChainIntegrityError when it is not that event)."""
    want = index.hashes.get(e.version)
    problem = None
    if want is None:
        problem = "event not in the verified index"
    else:
        ref = e.payload_ref
        try:
            if ref is None:
                raise ValueError("payload no longer spilled")
            fields = (e.stream_id, e.version, e.event_id_str, e.type, e.module, e.metadata_json)
            header = header_bytes(*fields, e.at, ref.digest.hex(), ref.size)
            if e.hash != want or link_hash(e.prev_hash, header, index.key) != want:
                problem = "event differs from the one verified"
        except (TypeError, ValueError) as exc:
            problem = f"event cannot be checked: {exc}"
    if problem is not None:
        raise ChainIntegrityError(
            index.stream_id, [Finding("hash_mismatch", index.stream_id, e.version, problem)]
        )


ValueCache = Table[Any]
"""Decoded channel values by (stream, digest): the opt-in ``value_cache`` of the savers.
Filled only from verified, decoded storage (never from a caller's objects); a hit hands
out a new top-level list or dict whose items are shared with the cache and earlier
callers."""


def _handout(value: Any) -> Any:
    return type(value)(value) if type(value) in (list, dict) else value


def materialise(
    index: ThreadIndex,
    serde: SerializerProtocol,
    digest: str,
    fetched: Mapping[Any, Any],
    cache: ValueCache | None = None,
) -> Any:
    """Decode the value ``digest`` (``fetched``: payloads of spilled value events by
    version, and values pinned from the cache by ``("pinned", digest)``)."""
    pinned = fetched.get(("pinned", digest), MISS)
    if pinned is not MISS:
        return _handout(pinned)
    if cache is not None:
        hit = cache.get((index.stream_id, digest))
        if hit is not MISS:
            return _handout(hit)
        value = materialise(index, serde, digest, fetched)
        cache.put((index.stream_id, digest), value)
        return _handout(value)
    chain: list[dict[str, Any]] = []
    d: str | None = digest
    while d is not None:
        rec = index.values.get(d)
        if rec is None:
            _missing(index, None, f"channel value {d} is not stored")
        p = rec.payload if rec.payload is not None else fetched[rec.version]
        chain.append(p)
        d = p.get("base")
        if len(chain) > MAX_DELTA_DEPTH + 2:
            _missing(index, rec.version, "delta chain too long")
    top = chain[0]
    if "list" not in top:
        return serde.loads_typed((top["t"], unb64(top["b"])))
    return [serde.loads_typed((t, unb64(b))) for t, b in _joined(chain)]


def _missing(index: ThreadIndex, version: int | None, detail: str) -> NoReturn:
    finding = Finding("value_missing", index.stream_id, version, detail)
    raise ChainIntegrityError(index.stream_id, [finding])


def prune_plan(
    index: ThreadIndex, keep_last: int | None, older_than: str | None
) -> tuple[list[NewEvent], list[int]]:
    """What a prune appends and drops so that each namespace keeps its newest
    ``keep_last`` checkpoints (None: all) and, with ``older_than`` (an ISO time), none
    written before it but its newest.

    A kept list value stored as a delta is written again whole (a rebase), so the older
    values it was built on can go too.
    """
    by_ns: dict[str, list[CheckpointRec]] = {}
    for rec in index.checkpoints.values():
        by_ns.setdefault(rec.ns, []).append(rec)
    keep: list[CheckpointRec] = []
    for recs in by_ns.values():
        recs.sort(key=lambda r: r.id, reverse=True)
        kept = recs[:keep_last] if keep_last is not None else recs
        if older_than is not None:
            # By age, but never the newest: a thread is pruned, not reset.
            kept = [r for i, r in enumerate(kept) if i == 0 or _ts(r) >= older_than]
        keep.extend(kept)
    rebased: list[NewEvent] = []
    done: set[str] = set()
    for rec in keep:
        for d in (rec.payload.get("vals") or {}).values():
            val = index.values.get(d)
            if d in done or val is None or val.base is None:
                continue
            items = _items_in_memory(index, d)
            if items is not None:
                done.add(d)
                payload = {"d": d, "list": items}
                rebased.append(
                    NewEvent(type=T_VALUE, module=MODULE, payload=payload, metadata={"d": d})
                )
    return rebased, index.unneeded(keep, rebased=done)


def _items_in_memory(index: ThreadIndex, digest: str) -> list[list[str]] | None:
    chain: list[dict[str, Any]] = []
    for rec in index.chain(digest):
        if rec.payload is None or "list" not in rec.payload:
            return None
        chain.append(rec.payload)
    # A chain cut short (a base not stored) is not the value.
    return _joined(chain) if chain and "base" not in chain[-1] else None


def _joined(chain: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The items of a list value from its delta chain (newest first)."""
    items: list[list[str]] = []
    for p in reversed(chain):
        items = items[: int(p.get("n", 0))] if "base" in p else []
        items.extend(p["list"])
    return items


def _ts(rec: CheckpointRec) -> str:
    ts = rec.plain("cp", "ts")
    return ts if isinstance(ts, str) else ""
