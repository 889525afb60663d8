"""What both faces of the LangGraph checkpointer decide, without I/O: the event layout of a
thread (docs/guide-langgraph.md lists the payloads), the encoding of checkpoints, channel
values and writes, and :class:`ThreadIndex`, the index of one thread built only from
events whose link verified (a thread with any finding is refused as a whole).

It may import the package below ``integrations`` and ``langgraph``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Final

import blake3
import orjson
from langgraph.checkpoint.serde.base import SerializerProtocol

from ares_events.chain import ChainKey, canonical_json
from ares_events.core.backend import Head
from ares_events.core.events import MAX_NAME_LENGTH, NewEvent, RecordedEvent, validate_name
from ares_events.errors import ChainIntegrityError, ConcurrencyError, InvalidEvent
from ares_events.integrations import LANGGRAPH_STREAM_PREFIX
from ares_events.integrity.findings import Finding
from ares_events.integrity.verifier import ChainVerifier

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
        self, stream_id: str, ns: str, parent: str | None, winner: str, actual: int, attempted: str
    ) -> None:
        self.checkpoint_ns = ns
        self.parent_checkpoint_id = parent
        """None when the refused checkpoint was a second root of an empty namespace."""
        self.winner_checkpoint_id = winner
        self.attempted_checkpoint_id = attempted
        if parent is None:
            expected = f"the first checkpoint of namespace {ns!r}"
            text = (
                f"namespace {ns!r} was already started by {winner}; refusing the parentless "
                f"{attempted} (a second writer starting the same new thread would give it "
                "two roots: reload it and run again)"
            )
        else:
            expected = f"a checkpoint continuing {parent}"
            text = (
                f"checkpoint {parent} in namespace {ns!r} was already continued by {winner}; "
                f"refusing {attempted} (a second writer from the same parent would fork the "
                "thread: reload it and run again)"
            )
        super().__init__(stream_id, expected, actual, text)


def stream_of(thread_id: object) -> str:
    """The stream holding a thread.

    Raises:
        InvalidEvent: the thread id is not a non-empty printable string of at most 246
            characters.
    """
    if not isinstance(thread_id, str):
        thread_id = str(thread_id)
    limit = MAX_NAME_LENGTH - len(STREAM_PREFIX)
    if len(thread_id) > limit:
        raise InvalidEvent(
            "thread_id", f"is {len(thread_id)} characters long, the limit is {limit}"
        )
    return STREAM_PREFIX + validate_name(thread_id, "thread_id")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return binascii.a2b_base64(text, strict_mode=True)


def pack(serde: SerializerProtocol, obj: Any) -> dict[str, Any]:
    """``{"j": obj}`` when ``obj`` is plain JSON that survives a round trip unchanged,
    else the serializer's typed bytes ``{"t", "b"}``."""
    with contextlib.suppress(InvalidEvent):  # canonical JSON refuses tuples too
        if orjson.loads(canonical_json(obj)) == obj:
            return {"j": obj}
    t, b = serde.dumps_typed(obj)
    return {"t": t, "b": b64(b)}


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


@dataclass(slots=True)
class CheckpointRec:
    version: int
    ns: str
    id: str
    parent: str | None
    payload: dict[str, Any]
    writes: dict[tuple[str, int], WriteRec] = field(default_factory=dict)

    def plain(self, part: str, key: str) -> Any:
        """``key`` of the checkpoint (``part="cp"``) or of its metadata (``"md"``) when
        that is stored as plain JSON, else None."""
        p = self.payload.get(part) or {}
        j = p.get("j") if isinstance(p, dict) else None
        return j.get(key) if isinstance(j, dict) else None


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
        """Raise ChainIntegrityError when the thread's chain did not verify."""
        if self.findings:
            raise ChainIntegrityError(self.stream_id, self.findings)

    def apply_all(self, page: Sequence[RecordedEvent], head: Head | None = None) -> None:
        """Verify events read after the verifier's last version and apply the ones not
        applied yet (the saver's own appends are applied when written, and verified
        here when read back); ``head`` (given on the first read) is compared with the
        last one."""
        if not self.findings:
            sound = self.verifier.sound_prefix(page)
            for e in page[:sound]:
                if e[1] > self.applied:
                    self._apply(e)
                    self.applied = e[1]
            if sound < len(page):
                self.findings.extend(self.verifier.findings)
                self.verifier.findings.clear()
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
        else:
            self._apply_payload(e.version, e.type, e.payload, e.metadata, None)

    def _apply_payload(
        self, v: int, type_: str, p: Any, meta: Any, spilled_hash: bytes | None
    ) -> None:
        if spilled_hash is None and not isinstance(p, dict):
            bad = Finding("malformed_row", self.stream_id, v, "payload is not a dict")
            self.findings.append(bad)
            return
        if type_ == T_VALUE:
            # A spilled value's digest is in its metadata (so the index needs no fetch).
            src = p if spilled_hash is None else meta
            d = src.get("d") if isinstance(src, dict) else None
            if not isinstance(d, str):
                self.findings.append(Finding("malformed_row", self.stream_id, v, "no digest"))
                return
            if spilled_hash is not None:
                self.hashes[v] = spilled_hash
            base = src.get("base")
            base = base if isinstance(base, str) else None
            self.values[d] = ValueRec(v, p, base, int(src.get("depth", 0)))
            self.by_version[v] = ("value", d)
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
            if parent is not None and rec.plain("md", "source") not in BRANCH_SOURCES:
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
        tables = (self.orphan_writes, self.checkpoints, self.continued, self.values)
        for table in (*tables, self.by_version, self.hashes, self.last_list):
            table.clear()

    def _drop(self, versions: Iterable[int]) -> None:
        self._latest_stale = True
        for v in versions:
            what = self.by_version.pop(v, None)
            self.hashes.pop(v, None)
            if what is None:
                continue
            kind, key = what
            if kind in ("checkpoint", "value"):
                table: dict[Any, Any] = self.checkpoints if kind == "checkpoint" else self.values
                if getattr(table.get(key), "version", None) == v:
                    del table[key]
            elif kind == "writes":
                ck = self.checkpoints.get(key)
                ws = ck.writes if ck is not None else self.orphan_writes.get(key, {})
                left = {k: w for k, w in ws.items() if w.version != v}
                if ck is not None:
                    ck.writes = left
                elif left:
                    self.orphan_writes[key] = left
                else:
                    self.orphan_writes.pop(key, None)
        self.last_list.clear()

    def latest(self, ns: str) -> CheckpointRec | None:
        """The newest checkpoint of a namespace (ids sort by time)."""
        if self._latest_stale:
            by_id = sorted(self.checkpoints.values(), key=lambda r: r.id)
            self._latest = {rec.ns: rec for rec in by_id}  # the newest of each comes last
            self._latest_stale = False
        return self._latest.get(ns)

    def get(self, ns: str, checkpoint_id: str | None) -> CheckpointRec | None:
        if checkpoint_id is None:
            return self.latest(ns)
        return self.checkpoints.get((ns, checkpoint_id))

    def unneeded(
        self, keep: Iterable[CheckpointRec], rebased: AbstractSet[str] = frozenset()
    ) -> list[int]:
        """Versions of the events (prune records aside) the ``keep`` checkpoints do not
        need: they need themselves, their writes, their values and every base of a delta
        value (but of the ``rebased`` values, which are being written again whole)."""
        # Writes whose checkpoint is not stored yet may belong to one being written.
        live = {w.version for ws in self.orphan_writes.values() for w in ws.values()}
        for rec in keep:
            live.add(rec.version)
            live.update(w.version for w in rec.writes.values())
            for d in (rec.payload.get("vals") or {}).values():
                if d not in rebased:
                    live.update(val.version for val in self.chain(d))
        return sorted(v for v, (k, _) in self.by_version.items() if v not in live and k != "pruned")

    def chain(self, digest: str) -> Iterator[ValueRec]:
        """The stored value ``digest`` and the bases of its delta chain, newest first (up
        to the first one not stored; bounded, whatever the stream holds)."""
        cur: str | None = digest
        for _ in range(MAX_DELTA_DEPTH + 2):
            val = self.values.get(cur) if cur is not None else None
            if val is None:
                return
            yield val
            cur = val.base
