"""The store side of the eventsourcing persistence module: opening the store from
eventsourcing's ``Environment``, the application's stream prefix, verified reads and a
close that is safe at interpreter exit (docs/integrations.md).

It may import anything in the package and ``eventsourcing``.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Sequence
from typing import Any, Final

from eventsourcing.persistence import DataError
from eventsourcing.utils import Environment, strtobool

from ares_events.core.backend import Head
from ares_events.core.events import RecordedEvent, validate_name
from ares_events.core.store import EventStore
from ares_events.errors import ChainIntegrityError, ConfigError, InvalidEvent
from ares_events.integrity.findings import Finding
from ares_events.integrity.verifier import ChainVerifier

__all__ = ["MODULE", "AresDatastore", "ChainVerificationError", "open_datastore"]

MODULE: Final = "eventsourcing"
SNAPSHOTS: Final = "snapshots"
_OFFSETS_MAX: Final = 100_000
_NO_HASH: Final = bytes(32)
# Room an aggregate's stream id needs after the prefix: a UUID, and "snapshots/" before it.
_ID_ROOM: Final = 36 + len(SNAPSHOTS) + 1
# max_notification_id looks back from the end in windows of positions growing this much.
_WINDOW: Final = 1024
_GROWTH: Final = 8


class ChainVerificationError(DataError, ChainIntegrityError):
    """A verified read found a stream's stored events inconsistent with its hash chain.

    An eventsourcing ``DataError`` and an ares-events ``ChainIntegrityError``; not an
    ``IntegrityError``, which a caller may retry: re-reading tampered data never helps.
    """

    def __init__(self, stream_id: str, findings: Sequence[Finding]) -> None:
        ChainIntegrityError.__init__(self, stream_id, findings)


def _setting_name(env: Environment, key: str) -> str:
    """The variable ``env.get(key)`` reads (``<APP>_KEY`` before ``KEY``), or the
    application's own name for it when neither is set."""
    keys = env.create_keys(key)
    return next((k for k in keys if dict.get(env, k) is not None), keys[0])


def _check_prefix(prefix: str, source: str) -> None:
    try:
        validate_name(prefix + "0" * _ID_ROOM, "stream prefix")
    except InvalidEvent as exc:
        raise ConfigError(
            f"{source}={prefix!r:.60} is not a usable stream prefix: {exc.problem}"
        ) from None


def _is_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


class AresDatastore:
    """One ares-events store shared by the recorders of one factory: the application's
    stream prefix, the per-stream version offsets learnt so far (a stream's first event
    never changes, so a learnt offset stays true) and the verified-read switch.

    The store is closed by :meth:`close`, at garbage collection or at interpreter exit,
    whichever comes first: an ``Application.__del__`` that runs while the interpreter
    tears modules down finds it closed and touches nothing.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        stream_prefix: str = "",
        verify_reads: bool = False,
        legacy_hint: str | None = None,
    ) -> None:
        self.store = store
        self.stream_prefix = stream_prefix
        self.verify_reads = verify_reads
        self.legacy_hint = legacy_hint
        self._offsets: dict[str, int] = {}
        self._lock = threading.Lock()
        self._close = weakref.finalize(self, store.close)

    def stream_id(self, originator_id: uuid.UUID | str) -> str:
        """The ares-events stream of an aggregate."""
        return self.stream_prefix + str(originator_id)

    def offset(self, stream_id: str) -> int | None:
        """Original version of the stream's first event (None: no such stream)."""
        off = self._offsets.get(stream_id)
        if off is not None:
            return off
        for e in self.read(stream_id, 1, 1, 1, None, check_head=False):
            off = int(e.metadata["originator_version"])
            self.remember(stream_id, off)
        return off

    def remember(self, stream_id: str, offset: int) -> None:
        """Record a stream's offset."""
        with self._lock:
            if len(self._offsets) >= _OFFSETS_MAX:
                self._offsets.clear()
            self._offsets[stream_id] = offset

    def head(self, stream_id: str) -> Head | None:
        """The stream's head when reads are verified (read before the events), else None."""
        return self.store.head(stream_id) if self.verify_reads else None

    def read(
        self,
        stream_id: str,
        lo: int,
        hi: int | None,
        limit: int | None,
        head: Head | None,
        *,
        check_head: bool = True,
    ) -> list[RecordedEvent]:
        """Events ``lo..hi`` of a stream (at most ``limit``), verified when enabled: then
        the read stops at ``head`` (read before the events) and is compared with it when
        it reaches it.

        Raises:
            ChainVerificationError: the events are not what the chain recorded.
        """
        if not self.verify_reads:
            return list(self.store.read(stream_id, lo, hi, limit))
        if head is not None:
            hi = head.version if hi is None else min(hi, head.version)
        empty = (hi is not None and hi < lo) or limit == 0
        recs = [] if empty else list(self.store.read(stream_id, lo, hi, limit))
        reaches = check_head and (
            head is None
            or (
                hi == head.version
                and (limit is None or len(recs) < limit or recs[-1].version == head.version)
            )
        )
        self._verify(stream_id, lo, recs, head, reaches)
        return recs

    def _verify(
        self, sid: str, lo: int, recs: list[RecordedEvent], head: Head | None, reaches: bool
    ) -> None:
        v = self._verifier(sid, lo, recs[0].prev_hash if recs else None)
        v.check_page(recs)
        if reaches and (recs or (head is not None and head.version >= lo)):
            v.check_head(head)
        if v.findings:
            raise ChainVerificationError(sid, v.findings)

    def verify_notifications(self, events: Sequence[RecordedEvent]) -> None:
        """Check each event's link, and the links between consecutive events of one stream,
        when reads are verified.

        Raises:
            ChainVerificationError: an event is not what the chain recorded.
        """
        if not self.verify_reads:
            return
        chains: dict[str, ChainVerifier] = {}
        for e in events:
            v = chains.get(e.stream_id)
            if v is None or e.version != v.last + 1:
                v = chains[e.stream_id] = self._verifier(e.stream_id, e.version, e.prev_hash)
            if not v.check(e):
                raise ChainVerificationError(e.stream_id, v.findings)

    def _verifier(self, sid: str, first: Any, prev_hash: Any) -> ChainVerifier:
        """A verifier from genesis, or from version ``first`` linked to ``prev_hash`` (a
        malformed one is replaced by zeros, which then fails the first link)."""
        if type(first) is not int or first <= 1:
            return ChainVerifier(sid, self.store.chain_key)
        ok = isinstance(prev_hash, bytes) and len(prev_hash) == len(_NO_HASH)
        start = prev_hash if ok else _NO_HASH
        return ChainVerifier(sid, self.store.chain_key, start_version=first - 1, start_hash=start)

    def last_position(self) -> int | None:
        """The highest position of this application's events, or None: looks back from
        the store's end in growing windows, so a recent event costs one small read (the
        backend filters out other applications')."""
        store = self.store
        prefix = self.stream_prefix or None
        hi = store.last_position()
        window = _WINDOW
        while hi > 0:
            lo = max(hi - window, 0)
            found = None
            for e in store.read_all(lo, None, stream_prefix=prefix):
                if e.position > hi:
                    break  # checked already (or appended since the end was read)
                if e.module == MODULE:
                    found = e.position
            if found is not None:
                return found
            hi, window = lo, window * _GROWTH
        return None

    def check_layout(self) -> None:
        """Refuse a store whose first event is in the old unprefixed layout when the
        prefix was derived (ConfigError naming the setting that keeps that layout)."""
        if self.legacy_hint is None:
            return
        first = next(iter(self.store.read_all(0, 1)), None)
        if first is not None and first.module == MODULE and _is_uuid(first.stream_id):
            raise ConfigError(self._legacy_message(first.stream_id))

    def check_not_legacy(self, originator_id: uuid.UUID | str) -> None:
        """After an aggregate was not found: ConfigError if it is in the old layout."""
        sid = str(originator_id)
        if self.legacy_hint is None or sid == self.stream_id(originator_id):
            return
        try:
            first = next(iter(self.store.read(sid, 1, 1, 1)), None)
        except InvalidEvent:
            return  # not a possible stream id: nothing stored under it
        if first is not None and first.module == MODULE:
            raise ConfigError(self._legacy_message(sid))

    def _legacy_message(self, sid: str) -> str:
        return (
            f"store {self.store.url} holds eventsourcing events without a stream prefix "
            f"(e.g. stream {sid!r}), the layout before per-application prefixes, and this "
            f"application's prefix is {self.stream_prefix!r}: if they are this "
            f"application's, set {self.legacy_hint}= (empty) to keep using that layout; if "
            f"they belong to another application, set {self.legacy_hint}="
            f"{self.stream_prefix} explicitly (docs/integrations.md, 'Stream prefixes')"
        )

    def close(self) -> None:
        """Close the store (once; later calls do nothing)."""
        self._close()


def open_datastore(env: Environment) -> AresDatastore:
    """Open the store ``env`` names, with the application's stream prefix.

    Raises:
        OSError: no store URL is set (eventsourcing's convention for missing settings).
        ConfigError: a bad setting, or a store in the old layout under a derived prefix.
    """
    from ares_events.stores.settings import Settings

    url = env.get("ARES_STORE_URL")
    if not url:
        raise OSError(
            "set ARES_STORE_URL (or <APP>_ARES_STORE_URL) to the ares-events store, "
            "e.g. sqlite:///app.db or postgresql://user@host/db"
        )
    keys = ("ARES_BLOBS_URL", "ARES_CACHE_URL", "ARES_SPILL_THRESHOLD_BYTES")
    values = {k: v for k in (*keys, "ARES_EVENTS_CHAIN_KEY") if (v := env.get(k)) is not None}
    raw = env.get("ARES_VERIFY_READS")
    try:  # spelt as eventsourcing spells its flags (y/yes/t/true/on/1, n/...); unset: False
        verify = strtobool(raw) if raw else False
    except ValueError:
        raise ConfigError(
            f"{_setting_name(env, 'ARES_VERIFY_READS')} must be true or false (y/yes/on/1, "
            f"n/no/off/0), got {raw!r:.40}"
        ) from None
    prefix = env.get("ARES_STREAM_PREFIX")
    setting = _setting_name(env, "ARES_STREAM_PREFIX")
    hint = setting if prefix is None else None  # a derived prefix: the old layout is refused
    if prefix is None:  # the application's name, lower case
        prefix = (env.name.lower() or "stored") + "/"
        _check_prefix(prefix, "the application name")
    elif prefix:
        _check_prefix(prefix, setting)
    store = Settings.from_env({"ARES_STORE_URL": url, **values}).open_store()
    try:
        ds = AresDatastore(store, stream_prefix=prefix, verify_reads=verify, legacy_hint=hint)
        ds.check_layout()
    except BaseException:
        store.close()
        raise
    return ds
