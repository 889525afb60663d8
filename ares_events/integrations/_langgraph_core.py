"""What both faces of the LangGraph checkpointer decide, without I/O: the event layout of
a thread, the encoding of checkpoints, channel values and writes, and the verified
in-memory index of one thread (:class:`ThreadIndex`).

**Layout.** One LangGraph thread is one stream, ``langgraph/<thread_id>`` (every
checkpoint namespace lives inside it), of events with module ``langgraph``:

``lg.checkpoint``
    ``{"ns", "id", "parent", "cp", "md", "vals"}``: the checkpoint without its channel
    values (``cp``), its metadata (``md``), and for each channel that has a value the
    content digest of that value (``vals``).
``lg.value``
    one channel value, content-addressed: ``{"d": digest, "t": type, "b": base64}``, or
    for a ``list`` a run of items ``{"d", "list": [[type, base64], ...], "base", "n",
    "depth"}``: the items after the first ``n`` items of the value ``base`` (a delta; no
    ``base``: the whole list). A value is stored once per thread whatever the channel or
    version that holds it; a delta chain is cut by a whole list every
    :data:`MAX_DELTA_DEPTH` links, which bounds what a reload reads.
``lg.writes``
    ``{"ns", "cp", "task", "path", "w": [[idx, channel, type, base64], ...]}``: pending
    writes of a task, with ``put_writes``' rules (a regular write is kept once, a special
    one is replaced).
``lg.pruned``
    ``{"drop": [versions], "all": bool, "reason"}``: those events are deleted (their
    payloads are erased right after, each erasure recorded in ``ares-events/erasures``).

Payloads are JSON (``{"j": ...}``) where the value is plain JSON, else the serializer's
typed bytes in base64 (``{"t", "b"}``).

**Verified before decoded.** The index is built from the stream read in order through a
:class:`~ares_events.integrity.verify.ChainVerifier` (keyed in keyed mode): an event is
applied only after its link verified, so every payload the savers decode is one the chain
vouches for. A thread with any finding is refused as a whole
(:class:`~ares_events.errors.ChainIntegrityError`), before anything is decoded. Spilled
payloads are fetched later through the blob store, whose digest check ties them to the
verified header.

It may import the package below ``integrations`` and ``langgraph``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import blake3
import orjson
from langgraph.checkpoint.base import WRITES_IDX_MAP, PendingWrite, writes_sort_key
from langgraph.checkpoint.serde.base import SerializerProtocol

from ares_events.core.events import NewEvent, RecordedEvent
from ares_events.core.recorder import Head
from ares_events.errors import ChainIntegrityError, ConcurrencyError, InvalidEvent
from ares_events.integrations import LANGGRAPH_STREAM_PREFIX
from ares_events.integrity.chain import ChainKey, canonical_json, header_bytes, link_hash
from ares_events.integrity.findings import Finding
from ares_events.integrity.verify import ChainVerifier

logger = logging.getLogger(__name__)

STREAM_PREFIX: Final = LANGGRAPH_STREAM_PREFIX
MODULE: Final = "langgraph"
T_CHECKPOINT: Final = "lg.checkpoint"
T_VALUE: Final = "lg.value"
T_WRITES: Final = "lg.writes"
T_PRUNED: Final = "lg.pruned"
EVENT_TYPES: Final = frozenset({T_CHECKPOINT, T_VALUE, T_WRITES, T_PRUNED})
MAX_DELTA_DEPTH: Final = 256
"""A list value is stored whole after this many deltas in a row (bounds a reload)."""
BRANCH_SOURCES: Final = frozenset({"fork", "update"})
"""Checkpoint sources that start a deliberate branch (time travel, ``update_state``)."""


class StaleWriteError(ConcurrencyError):
    """A checkpoint was written from a parent that another writer already continued.

    Two writers that both resumed a thread from the same checkpoint would fork it; the
    second one gets this error instead (its state is stale: reload the thread and run
    again). ``is_stale_write_owner_error`` is the marker the proposed LangGraph
    write-ownership extension recognises.
    """

    is_stale_write_owner_error: Final = True

    def __init__(
        self, stream_id: str, ns: str, parent: str, winner: str, actual: int, attempted: str
    ) -> None:
        self.checkpoint_ns = ns
        self.parent_checkpoint_id = parent
        self.winner_checkpoint_id = winner
        self.attempted_checkpoint_id = attempted
        super().__init__(
            stream_id,
            f"a checkpoint continuing {parent}",
            actual,
            f"checkpoint {parent} in namespace {ns!r} was already continued by {winner}; "
            f"refusing {attempted} (a second writer from the same parent would fork the "
            "thread: reload it and run again)",
        )


def stream_of(thread_id: object) -> str:
    """The stream holding a thread.

    Raises:
        InvalidEvent: the thread id is not a non-empty printable string of at most 246
            characters.
    """
    if not isinstance(thread_id, str):
        thread_id = str(thread_id)
    if not thread_id:
        raise InvalidEvent("thread_id", "must not be empty")
    return STREAM_PREFIX + thread_id


def thread_of(stream_id: str) -> str | None:
    """The thread id of a stream, or None when it is not a LangGraph thread."""
    if stream_id.startswith(STREAM_PREFIX) and len(stream_id) > len(STREAM_PREFIX):
        return stream_id[len(STREAM_PREFIX) :]
    return None


# -- encoding -------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return binascii.a2b_base64(text, strict_mode=True)


def pack(serde: SerializerProtocol, obj: Any) -> dict[str, Any]:
    """``{"j": obj}`` when ``obj`` is plain JSON that survives a round trip unchanged,
    else the serializer's typed bytes ``{"t", "b"}``."""
    try:
        raw = canonical_json(obj)
    except InvalidEvent:
        pass
    else:
        if orjson.loads(raw) == obj and _no_tuples(obj):
            return {"j": obj}
    t, b = serde.dumps_typed(obj)
    return {"t": t, "b": b64(b)}


def _no_tuples(x: Any) -> bool:
    if isinstance(x, tuple):
        return False
    if isinstance(x, dict):
        return all(_no_tuples(v) for v in x.values())
    if isinstance(x, list):
        return all(_no_tuples(v) for v in x)
    return True


def unpack(serde: SerializerProtocol, packed: Mapping[str, Any]) -> Any:
    if "j" in packed:
        # A copy: callers (LangGraph itself) mutate checkpoints, the index must not change.
        return orjson.loads(orjson.dumps(packed["j"]))
    return serde.loads_typed((packed["t"], unb64(packed["b"])))


def _item_digest(t: str, b: bytes) -> bytes:
    return blake3.blake3(t.encode() + b"\x00" + b).digest(length=16)


@dataclass(slots=True)
class EncodedValue:
    """A channel value encoded for storage: its digest, and for a list its items."""

    digest: str
    typed: tuple[str, bytes] | None = None
    items: list[tuple[str, bytes]] | None = None
    item_digests: list[bytes] | None = None


def encode_value(serde: SerializerProtocol, value: Any) -> EncodedValue:
    """Encode a channel value; a ``list`` item by item (so a longer list can be stored as
    the items it adds)."""
    if type(value) is list:
        items = [serde.dumps_typed(v) for v in value]
        digests = [_item_digest(t, b) for t, b in items]
        h = blake3.blake3(b"list\x00")
        for d in digests:
            h.update(d)
        return EncodedValue(h.hexdigest(length=16), items=items, item_digests=digests)
    t, b = serde.dumps_typed(value)
    return EncodedValue(blake3.blake3(_item_digest(t, b)).hexdigest(length=16), typed=(t, b))


# -- the index of one thread ---------------------------------------------------------------


@dataclass(slots=True)
class CheckpointRec:
    version: int
    ns: str
    id: str
    parent: str | None
    payload: dict[str, Any]
    writes: dict[tuple[str, int], WriteRec] = field(default_factory=dict)

    @property
    def source(self) -> object:
        md = self.payload.get("md") or {}
        j = md.get("j") if isinstance(md, dict) else None
        return j.get("source") if isinstance(j, dict) else None


@dataclass(slots=True)
class WriteRec:
    version: int
    task_id: str
    idx: int
    channel: str
    t: str
    b: str
    path: str


@dataclass(slots=True)
class ValueRec:
    version: int
    payload: dict[str, Any] | None
    """The event's payload; None when it spilled to the blob store (fetched on use)."""
    base: str | None = None
    depth: int = 0


class ThreadIndex:
    """What a saver knows of one thread, built only from verified events."""

    def __init__(self, stream_id: str, key: ChainKey | None) -> None:
        self.stream_id = stream_id
        self.verifier = ChainVerifier(stream_id, key)
        self.key = key
        self.findings: list[Finding] = []
        self.checkpoints: dict[tuple[str, str], CheckpointRec] = {}
        self.continued: dict[tuple[str, str], str] = {}
        self.values: dict[str, ValueRec] = {}
        self.by_version: dict[int, tuple[str, Any]] = {}
        self.hashes: dict[int, bytes] = {}
        """Verified hashes of events whose payload spilled (checked again on fetch)."""
        self.last_list: dict[tuple[str, str], tuple[str, list[bytes]]] = {}
        self.started = False
        self._latest: dict[str, CheckpointRec] = {}
        self._latest_stale = False
        self.orphan_writes: dict[tuple[str, str], dict[tuple[str, int], WriteRec]] = {}
        self.applied = 0
        """Highest version applied (the verifier's, or past it: the saver's own appends)."""

    @property
    def version(self) -> int:
        """The stream version this index reflects (its own appends included)."""
        return max(self.verifier.last, self.applied)

    def check(self) -> None:
        """Raise when the thread's chain did not verify.

        Raises:
            ChainIntegrityError: with the findings; nothing of the thread is decoded.
        """
        if self.findings:
            raise ChainIntegrityError(self.stream_id, self.findings)

    def apply_all(self, events: Iterable[RecordedEvent], head: Head | None = None) -> None:
        """Verify events read after the verifier's last version and apply the ones not
        applied yet (the saver's own appends are applied when written, and verified
        here when read back); ``head`` (given on the first read) is compared with the
        last one."""
        for e in events:
            if self.findings:
                break
            if not self.verifier.check(e):
                self.findings.extend(self.verifier.findings)
                self.verifier.findings.clear()
                break
            if e.version > self.applied:
                self._apply(e)
                self.applied = e.version
        if head is not None and not self.findings:
            self.verifier.check_head(head)
            self.findings.extend(self.verifier.findings)
            self.verifier.findings.clear()
        self.started = True

    def apply_own(self, last_version: int, events: Sequence[NewEvent]) -> None:
        """Apply events this saver has just appended (``last_version``: the stream's
        version after them), from the payloads in hand."""
        first = last_version - len(events) + 1
        for i, ev in enumerate(events):
            self._apply_payload(first + i, ev.type, ev.payload, ev.metadata or {}, None)
        self.applied = max(self.applied, last_version)

    def _apply(self, e: RecordedEvent) -> None:
        if e.module != MODULE or e.type not in EVENT_TYPES or e.payload_erased:
            return
        if e.payload_ref is not None and e.type == T_VALUE:
            self._apply_payload(e.version, e.type, None, e.metadata, e.hash)
            return
        self._apply_payload(e.version, e.type, e.payload, e.metadata, None)

    def _apply_payload(
        self, v: int, type_: str, p: Any, meta: Any, spilled_hash: bytes | None
    ) -> None:
        if spilled_hash is None and not isinstance(p, dict):
            self.findings.append(
                Finding("malformed_row", self.stream_id, v, "payload is not a dict")
            )
            return
        if type_ == T_VALUE:
            if spilled_hash is not None:
                self.hashes[v] = spilled_hash
                d = self._spilled_digest(v, meta)
                if d is None:
                    return
                self.values[d[0]] = ValueRec(v, None, d[1], d[2])
                self.by_version[v] = ("value", d[0])
                return
            d0 = p["d"]
            self.values[d0] = ValueRec(v, p, p.get("base"), int(p.get("depth", 0)))
            self.by_version[v] = ("value", d0)
        elif type_ == T_CHECKPOINT:
            ns, cid, parent = p["ns"], p["id"], p.get("parent")
            old = self.checkpoints.get((ns, cid))
            rec = CheckpointRec(v, ns, cid, parent, p)
            if old is not None:
                rec.writes = old.writes
                self.by_version.pop(old.version, None)
            else:
                # LangGraph may store a task's writes before the checkpoint they belong to.
                rec.writes = self.orphan_writes.pop((ns, cid), {})
            self.checkpoints[(ns, cid)] = rec
            self.by_version[v] = ("checkpoint", (ns, cid))
            cur = self._latest.get(ns)
            if cur is None or cid >= cur.id:
                self._latest[ns] = rec
            if parent is not None and rec.source not in BRANCH_SOURCES:
                self.continued.setdefault((ns, parent), cid)
        elif type_ == T_WRITES:
            ns, cid = p["ns"], p["cp"]
            self.by_version[v] = ("writes", (ns, cid))
            ws = self.writes_of(ns, cid, create=True)
            task, path = p["task"], p.get("path", "")
            for idx, ch, t, b in p["w"]:
                k = (task, idx)
                if k in ws and idx >= 0:
                    continue
                ws[k] = WriteRec(v, task, idx, ch, t, b, path)
        elif type_ == T_PRUNED:
            if p.get("all"):
                self._reset()
            else:
                self._drop(int(x) for x in p.get("drop", ()))
            self.by_version[v] = ("pruned", None)

    def _spilled_digest(self, v: int, m: Any) -> tuple[str, str | None, int] | None:
        # The digest of a spilled value is in its metadata (so the index needs no fetch).
        d = m.get("d") if isinstance(m, dict) else None
        if not isinstance(d, str):
            self.findings.append(
                Finding("malformed_row", self.stream_id, v, "spilled value without digest")
            )
            return None
        base = m.get("base")
        return d, base if isinstance(base, str) else None, int(m.get("depth", 0))

    def writes_of(
        self, ns: str, cid: str, *, create: bool = False
    ) -> dict[tuple[str, int], WriteRec]:
        """The pending writes stored for a checkpoint (also before the checkpoint is)."""
        ck = self.checkpoints.get((ns, cid))
        if ck is not None:
            return ck.writes
        if create:
            return self.orphan_writes.setdefault((ns, cid), {})
        return self.orphan_writes.get((ns, cid), {})

    def _reset(self) -> None:
        self._latest_stale = True
        self.orphan_writes.clear()
        self.checkpoints.clear()
        self.continued.clear()
        self.values.clear()
        self.by_version.clear()
        self.hashes.clear()
        self.last_list.clear()

    def _drop(self, versions: Iterable[int]) -> None:
        self._latest_stale = True
        for v in versions:
            what = self.by_version.pop(v, None)
            self.hashes.pop(v, None)
            if what is None:
                continue
            kind, key = what
            if kind == "checkpoint":
                rec = self.checkpoints.get(key)
                if rec is not None and rec.version == v:
                    del self.checkpoints[key]
            elif kind == "value":
                rec_v = self.values.get(key)
                if rec_v is not None and rec_v.version == v:
                    del self.values[key]
            elif kind == "writes":
                ck = self.checkpoints.get(key)
                if ck is not None:
                    ck.writes = {k: w for k, w in ck.writes.items() if w.version != v}
                elif key in self.orphan_writes:
                    left = {k: w for k, w in self.orphan_writes[key].items() if w.version != v}
                    if left:
                        self.orphan_writes[key] = left
                    else:
                        del self.orphan_writes[key]
        self.last_list.clear()

    # -- queries -----------------------------------------------------------------------------

    def latest(self, ns: str) -> CheckpointRec | None:
        """The newest checkpoint of a namespace (ids sort by time)."""
        if self._latest_stale:
            self._latest = {}
            for (n, cid), rec in self.checkpoints.items():
                cur = self._latest.get(n)
                if cur is None or cid > cur.id:
                    self._latest[n] = rec
            self._latest_stale = False
        return self._latest.get(ns)

    def get(self, ns: str, checkpoint_id: str | None) -> CheckpointRec | None:
        if checkpoint_id is None:
            return self.latest(ns)
        return self.checkpoints.get((ns, checkpoint_id))

    def live_versions(
        self, keep: Iterable[CheckpointRec], rebased: set[str] | None = None
    ) -> set[int]:
        """Versions of the events the given checkpoints need: themselves, their writes,
        their values and every base of a delta value (but of the ``rebased`` values,
        which are being written again whole)."""
        # Writes whose checkpoint is not stored yet may belong to one being written.
        out: set[int] = {w.version for ws in self.orphan_writes.values() for w in ws.values()}
        for rec in keep:
            out.add(rec.version)
            out.update(w.version for w in rec.writes.values())
            for d in (rec.payload.get("vals") or {}).values():
                if rebased and d in rebased:
                    continue
                seen = 0
                cur: str | None = d
                while cur is not None and seen <= MAX_DELTA_DEPTH + 1:
                    val = self.values.get(cur)
                    if val is None:
                        break
                    out.add(val.version)
                    cur = val.base
                    seen += 1
        return out


# -- planning a put --------------------------------------------------------------------------


@dataclass(slots=True)
class PutPlan:
    events: list[NewEvent]
    expected: int


def plan_put(
    index: ThreadIndex,
    serde: SerializerProtocol,
    encoded_cp: dict[str, Any],
    values: Mapping[str, EncodedValue],
    ns: str,
    checkpoint_id: str,
    parent: str | None,
    source: object,
) -> PutPlan:
    """The events of a put against what the index knows now.

    Raises:
        StaleWriteError: ``parent`` was already continued by another checkpoint.
    """
    if parent is not None and source not in BRANCH_SOURCES:
        winner = index.continued.get((ns, parent))
        if winner is not None and winner != checkpoint_id:
            raise StaleWriteError(index.stream_id, ns, parent, winner, index.version, checkpoint_id)
    parent_rec = index.checkpoints.get((ns, parent)) if parent is not None else None
    parent_vals = (parent_rec.payload.get("vals") or {}) if parent_rec else {}
    events: list[NewEvent] = []
    vals: dict[str, str] = {}
    for ch, enc in values.items():
        vals[ch] = enc.digest
        if enc.digest in index.values:
            continue
        if any(e.payload.get("d") == enc.digest for e in events if e.type == T_VALUE):
            continue
        events.append(_value_event(index, ns, ch, enc, parent_vals.get(ch)))
    encoded_cp["vals"] = vals
    events.append(NewEvent(type=T_CHECKPOINT, module=MODULE, payload=encoded_cp))
    return PutPlan(events, index.version)


def _value_event(
    index: ThreadIndex, ns: str, ch: str, enc: EncodedValue, prev: str | None
) -> NewEvent:
    if enc.items is None:
        assert enc.typed is not None
        t, b = enc.typed
        return NewEvent(
            type=T_VALUE,
            module=MODULE,
            payload={"d": enc.digest, "t": t, "b": b64(b)},
            metadata={"d": enc.digest},
        )
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
    if items is None:
        return None
    return [_item_digest(t, unb64(b)) for t, b in items]


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
    if not out:
        return None
    return NewEvent(
        type=T_WRITES,
        module=MODULE,
        payload={"ns": ns, "cp": checkpoint_id, "task": task_id, "path": task_path, "w": out},
    )


def pending_writes(serde: SerializerProtocol, rec: CheckpointRec) -> list[PendingWrite]:
    ws = sorted(rec.writes.values(), key=lambda w: writes_sort_key(w.path, w.task_id, w.idx))
    return [(w.task_id, w.channel, serde.loads_typed((w.t, unb64(w.b)))) for w in ws]


def verify_fetched(index: ThreadIndex, e: RecordedEvent) -> None:
    """Check an event fetched again (a spilled value) against the hash verified when the
    index read it.

    Raises:
        ChainIntegrityError: the stored event is not the one the chain verified.
    """
    want = index.hashes.get(e.version)
    problem = None
    if want is None:
        problem = "event not in the verified index"
    else:
        ref = e.payload_ref
        try:
            if ref is None:
                raise ValueError("payload no longer spilled")
            header = header_bytes(
                e.stream_id,
                e.version,
                e.event_id_str,
                e.type,
                e.module,
                e.metadata_json,
                e.at,
                ref.digest.hex(),
                ref.size,
            )
            if e.hash != want or link_hash(e.prev_hash, header, index.key) != want:
                problem = "event differs from the one verified"
        except (TypeError, ValueError) as exc:
            problem = f"event cannot be checked: {exc}"
    if problem is not None:
        raise ChainIntegrityError(
            index.stream_id, [Finding("hash_mismatch", index.stream_id, e.version, problem)]
        )


def values_needed(index: ThreadIndex, digests: Iterable[str]) -> list[int]:
    """Versions of spilled value events a materialisation will need to fetch."""
    out = []
    for d in digests:
        seen = 0
        cur: str | None = d
        while cur is not None and seen <= MAX_DELTA_DEPTH + 1:
            rec = index.values.get(cur)
            if rec is None:
                break
            if rec.payload is None:
                out.append(rec.version)
            cur = rec.base
            seen += 1
    return out


class ValueCache:
    """Decoded channel values by (stream, digest), least recently used dropped: the
    opt-in ``value_cache`` of the savers. Filled only from verified, decoded storage
    (never from a caller's objects); a hit hands out a new top-level list or dict whose
    items are shared with the cache and earlier callers."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> Any:
        with self._lock:
            v = self._d.get(key, MISS)
            if v is not MISS:
                self._d.move_to_end(key)
        return v

    def put(self, key: tuple[str, str], value: Any) -> None:
        with self._lock:
            self._d[key] = value
            while len(self._d) > self.size:
                self._d.popitem(last=False)


MISS: Final = object()


def _handout(value: Any) -> Any:
    if type(value) is list:
        return list(value)
    if type(value) is dict:
        return dict(value)
    return value


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
            raise ChainIntegrityError(
                index.stream_id,
                [
                    Finding(
                        "value_missing", index.stream_id, None, f"channel value {d} is not stored"
                    )
                ],
            )
        p = rec.payload if rec.payload is not None else fetched[rec.version]
        chain.append(p)
        d = p.get("base")
        if len(chain) > MAX_DELTA_DEPTH + 2:
            raise ChainIntegrityError(
                index.stream_id,
                [Finding("value_missing", index.stream_id, rec.version, "delta chain too long")],
            )
    top = chain[0]
    if "list" not in top:
        return serde.loads_typed((top["t"], unb64(top["b"])))
    items: list[list[str]] = []
    for p in reversed(chain):
        items = items[: int(p.get("n", 0))] if "base" in p else []
        items.extend(p["list"])
    return [serde.loads_typed((t, unb64(b))) for t, b in items]


def prune_plan(
    index: ThreadIndex, keep_last: int | None, older_than: str | None
) -> tuple[list[NewEvent], list[int]]:
    """What a prune appends and drops so that each namespace keeps its newest
    ``keep_last`` checkpoints (None: all) and, with ``older_than`` (an ISO time), none
    written before it.

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
            kept = [r for r in kept if _ts(r) >= older_than]
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
                rebased.append(
                    NewEvent(
                        type=T_VALUE,
                        module=MODULE,
                        payload={"d": d, "list": items},
                        metadata={"d": d},
                    )
                )
    live = index.live_versions(keep, rebased=done)
    drop = sorted(
        v for v in index.by_version if v not in live and index.by_version[v][0] != "pruned"
    )
    return rebased, drop


def _items_in_memory(index: ThreadIndex, digest: str) -> list[list[str]] | None:
    chain: list[dict[str, Any]] = []
    d: str | None = digest
    while d is not None and len(chain) <= MAX_DELTA_DEPTH + 1:
        rec = index.values.get(d)
        if rec is None or rec.payload is None or "list" not in rec.payload:
            return None
        chain.append(rec.payload)
        d = rec.payload.get("base")
    items: list[list[str]] = []
    for p in reversed(chain):
        items = items[: int(p.get("n", 0))] if "base" in p else []
        items.extend(p["list"])
    return items


def _ts(rec: CheckpointRec) -> str:
    cp = rec.payload.get("cp") or {}
    j = cp.get("j") if isinstance(cp, dict) else None
    ts = j.get("ts") if isinstance(j, dict) else None
    return ts if isinstance(ts, str) else ""


def pruned_event(drop: Sequence[int], *, all_: bool, reason: str) -> NewEvent:
    return NewEvent(
        type=T_PRUNED,
        module=MODULE,
        payload={"drop": [] if all_ else list(drop), "all": all_, "reason": reason},
    )


def erasure_record(e: RecordedEvent, reason: str, by: str) -> NewEvent:
    """The ``payload.erased`` record of an event the saver erased (as ``ae.erase``
    writes it)."""
    from ares_events.core.events import ERASURE_TYPE

    return NewEvent(
        type=ERASURE_TYPE,
        module="ares-events",
        payload={
            "stream_id": e.stream_id,
            "version": e.version,
            "position": e.position,
            "event_id": e.event_id_str,
            "type": e.type,
            "payload_digest": e.payload_digest.hex(),
            "payload_size": e.payload_size,
            "reason": reason,
            "by": by,
        },
    )
