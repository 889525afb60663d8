"""What goes into a stream's cached tail: the body of one entry (the part behind its seal,
:class:`.keys.Sealer`: an event's stored fields as a compact JSON array, and when they
were read from the store), and the runs of events written (:func:`contiguous_suffix`,
:class:`SealRecorder`).

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ares_events.core.backend import Batch, Head, SealedEvent
from ares_events.core.events import MalformedPayloadRef, PayloadRef, RecordedEvent

__all__ = ["SealRecorder", "contiguous_suffix", "decode", "encode", "event"]


def encode(e: RecordedEvent, filled_ms: int) -> bytes:
    """One cached event: its stored fields as a compact JSON array (version and stream
    are implied by the field name and the key), then when they were read from the store
    (milliseconds since the epoch).

    Raises:
        ValueError: an event that is not cacheable: its payload both inline and spilled,
            neither, or a malformed reference (a damaged row: left to the store).
    """
    raw = e._payload_bytes
    ref = e.payload_ref
    if (raw is None) == (ref is None) or isinstance(ref, MalformedPayloadRef):
        raise ValueError("not a cacheable event")
    return orjson.dumps(
        [
            e.position,
            e.event_id_str,
            e.type,
            e.module,
            None if raw is None else raw.decode(),
            e.metadata_json.decode(),
            e.at,
            e.prev_hash.hex(),
            e.hash.hex(),
            None if ref is None else ref.to_json().decode(),
            filled_ms,
        ]
    )


def decode(stream_id: str, version: int, raw: bytes) -> RecordedEvent:
    """The event of one entry's body (:func:`encode`).

    Raises:
        ValueError: not an entry (orjson's error is one), or its payload is both inline and
            spilled, or neither.
    """
    return event(stream_id, version, orjson.loads(raw))


def event(stream_id: str, version: int, fields: Any) -> RecordedEvent:
    pos, eid, typ, mod, payload, meta, at, prev, h, ref, _filled = fields
    if (payload is None) == (ref is None):
        # A reader gets either inline bytes or a reference: both would serve bytes the
        # chain's digest does not cover (the header hashes the reference's digest).
        raise ValueError("the payload must be either inline or spilled")
    return RecordedEvent(
        stream_id,
        version,
        pos,
        eid,
        typ,
        mod,
        None if payload is None else payload.encode(),
        meta.encode(),
        at,
        bytes.fromhex(prev),
        bytes.fromhex(h),
        None if ref is None else PayloadRef.from_json(ref),
    )


class SealRecorder(Batch):
    """A copy of a :class:`Batch` that remembers what the backend sealed (the versions and
    hashes it wrote), for backends that return no events from ``append``."""

    __slots__ = ("sealed",)

    sealed: list[SealedEvent]

    @classmethod
    def around(cls, batch: Batch) -> SealRecorder:
        spy = cls.__new__(cls)
        for klass in type(batch).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if hasattr(batch, name):
                    object.__setattr__(spy, name, getattr(batch, name))
        spy.sealed = []
        return spy

    def seal(self, head: Head | None) -> list[SealedEvent]:
        """Seal as the original would, and remember the result."""
        self.sealed = super().seal(head)
        return self.sealed


def contiguous_suffix(events: Sequence[RecordedEvent]) -> list[RecordedEvent]:
    """The longest run at the end of ``events`` with consecutive, linked versions."""
    out = [events[-1]]
    for e in reversed(events[:-1]):
        nxt = out[-1]
        if e.version != nxt.version - 1 or e.hash != nxt.prev_hash:
            break
        out.append(e)
    out.reverse()
    return out
