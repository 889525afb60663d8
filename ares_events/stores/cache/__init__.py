"""Redis read-through cache around any backend: :class:`CachedRecorder` (the rules are in
docs/architecture.md, "Redis cache"); the URL's parsing is in :mod:`.config`, the keys and
seals in :mod:`.keys`, an entry's body in :mod:`.entries`, the Lua scripts in
:mod:`.scripts`.

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

import orjson

from ares_events.chain import ChainKey, _cache_name, genesis, link_hash, vouch
from ares_events.core.backend import AppendOutcome, Batch, Capability, Head
from ares_events.core.events import ExpectedVersion, RecordedEvent
from ares_events.core.lifecycle import OperationGate
from ares_events.errors import MissingDependencyError, StoreClosed
from ares_events.stores.cache.config import parse
from ares_events.stores.cache.entries import SealRecorder, contiguous_suffix
from ares_events.stores.cache.entries import encode as _encode
from ares_events.stores.cache.entries import event as _event
from ares_events.stores.cache.keys import CacheKeys, Sealer, chain_differs, fresh_epoch, load_keys
from ares_events.stores.cache.scripts import DROP_SCRIPT, EPOCH_SCRIPT, WRITE_SCRIPT

if TYPE_CHECKING:
    import redis

logger = logging.getLogger(__name__)

__all__ = ["CacheStats", "CachedRecorder"]

_MAX_BACKOFF: Final = 30.0
_POLL_CAP: Final = 0.25
"""Longest pause between inner-store checks in ``wait_for`` (writers without the cache
publish no wake-ups)."""
_DROP_BATCH: Final = 1000
"""Stream tails dropped per script call (a retirement drops those of every stream of a
segment)."""


@dataclass(slots=True)
class CacheStats:
    """Counters of one :class:`CachedRecorder` (approximate under threads)."""

    hits: int = 0
    """Reads served entirely from Redis."""
    partial_hits: int = 0
    """Reads served from Redis plus the events appended behind the cache's back."""
    misses: int = 0
    """Reads that fell through to the inner store while Redis was reachable."""
    bypassed: int = 0
    """Operations that skipped Redis: it was down, or this store object reads under another
    chain than the store's (``check_identity=False``)."""
    errors: int = 0
    """Redis failures (each starts or extends an outage)."""
    forged: int = 0
    """Cached entries edited in Redis (a bad seal, a malformed entry, hashes that do not
    link to the store's head, a key of another Redis type): each read went to the inner
    store and replaced the tail (or the wrong-typed erasure epoch)."""


class CachedRecorder:
    """A :class:`~ares_events.core.recorder.Recorder` that caches stream tails in Redis
    around another recorder (docs/architecture.md, "Redis cache")."""

    capabilities: frozenset[Capability]
    scheme: tuple[str, ...]

    def __init__(self, inner: Any, url: str, chain_key: ChainKey | None = None) -> None:
        """Wrap ``inner``; no request is made here (the keys are read from the store at
        first use). ``chain_key`` is the store's: cached events are served only after their
        hashes are recomputed with it (without it a keyed chain's tail never checks out),
        and it keys the entries' MACs.

        Raises:
            ConfigError: a bad cache URL (the message never shows its password).
            MissingDependencyError: redis-py is not installed.
        """
        cfg, redacted = parse(url)
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:  # pragma: no cover - only without the extra
            raise MissingDependencyError("the Redis cache", "redis") from exc
        self.inner = inner
        self._chain_key = chain_key
        self.capabilities = frozenset(inner.capabilities)
        self.stats = CacheStats()
        self._cfg = cfg
        self._url = redacted
        self._redis_errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._response_error: type[BaseException] = redis.ResponseError
        tls = {"ssl": True, "ssl_cert_reqs": cfg.ssl_cert_reqs, "ssl_ca_certs": cfg.ssl_ca_certs}
        kw: dict[str, Any] = {k: v for k, v in tls.items() if v is not None} if cfg.ssl else {}
        # No retries inside redis-py (its default retries with backoff for seconds): a
        # failure must cost one short timeout, then the cache is bypassed.
        self._redis: redis.Redis = redis.Redis(
            host=cfg.host,
            port=cfg.port,
            db=cfg.db,
            username=cfg.username,
            password=cfg.password,
            socket_timeout=cfg.socket_timeout,
            socket_connect_timeout=cfg.connect_timeout,
            retry=Retry(NoBackoff(), 0),
            **kw,
        )
        self._script = self._redis.register_script(WRITE_SCRIPT)
        self._drop_script = self._redis.register_script(DROP_SCRIPT)
        self._epoch_script = self._redis.register_script(EPOCH_SCRIPT)
        self._keys: CacheKeys | None = None
        self._keys_lock = threading.Lock()
        # The erasure epoch last seen in Redis (scripts.py): an operation takes it before it
        # reads or appends, and its cache write is refused if an erasure replaced it since.
        self._epoch = b""
        self._lock = threading.Lock()
        self._outage = False
        self._dirty: set[str] = set()  # streams erased or retired, tail not yet dropped
        # True: the store records another chain than this object's key (opened with
        # check_identity=False under another key), so no cached tail would ever check
        # out: it reads around the cache and writes nothing to it. None: the store records
        # no identity yet (told at the first read of a stream that exists).
        self._other_chain: bool | None = None
        self._failures = 0
        self._down_until = 0.0
        # Each Redis call runs inside this gate: close() waits for the calls in flight
        # before it closes the client, and a call attempted after that is skipped (the
        # cache is bypassed), so no thread uses a closed Redis connection.
        self._gate = OperationGate(self._url)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One Redis call's result, or :data:`_SKIPPED` (closing), :data:`_FAILED` (an
        outage) or :data:`_WRONGTYPE`."""
        try:
            self._gate.enter()
        except StoreClosed:
            return _SKIPPED
        try:
            result = fn(*args, **kwargs)
        except self._redis_errors as exc:
            if isinstance(exc, self._response_error) and "WRONGTYPE" in str(exc):
                # Redis answered: a key of this store's holds another type of value than
                # the cache writes there (written by someone else). Not an outage: the
                # caller replaces that key, every other key is served as before.
                result = _WRONGTYPE
            else:
                self._failed(exc)
                return _FAILED
        finally:
            self._gate.exit()
        self._ok()
        return result

    @classmethod
    def wrap(cls, inner: Any, url: str, chain_key: ChainKey | None = None) -> CachedRecorder:
        """Wrap ``inner``, read the store's identity (under another chain than
        ``chain_key``'s, the cache is read around and nothing more is done), read its
        cache secret (recording one if it has none and may be written), and read the
        erasure epoch from Redis once (a failure only logs a WARNING).

        Raises:
            ConfigError: a bad cache URL.
            MissingDependencyError: redis-py is not installed.
            StoreUnavailable: the inner store cannot be reached.
        """
        rec = cls(inner, url, chain_key)
        rec._other_chain = chain_differs(inner, chain_key)
        if rec._other_chain:
            logger.info(
                "redis cache %s: %s records another hash chain than this store object's "
                "chain key (opened with check_identity=False); it reads around the cache",
                rec._url,
                rec.describe(),
            )
            return rec
        keys = rec._space()
        epoch = rec._call(rec._epoch_script, keys=[keys.epoch], args=[fresh_epoch()])
        if epoch is _WRONGTYPE:
            rec._wrong_type(None)
        elif isinstance(epoch, bytes):
            rec._epoch = epoch
        if rec._epoch:
            logger.info(
                "redis cache %s in front of %s%s",
                rec._url,
                rec.describe(),
                "" if keys.shared else " (private to this process)",
            )
        return rec

    def _space(self) -> CacheKeys:
        """This store's keys, read from it (and recorded there) on first use."""
        keys = self._keys
        if keys is None:
            with self._keys_lock:
                keys = self._keys
                if keys is None:
                    # A store object under another chain never writes: not even the secret.
                    record = self._other_chain is not True
                    keys = load_keys(self.inner, self._cfg.prefix, self._chain_key, record=record)
                    self._keys = keys
        return keys

    def __repr__(self) -> str:
        return f"CachedRecorder({self.describe()!r}, cache={self._url!r})"

    @property
    def cache_url(self) -> str:
        """The cache URL, redacted (safe to log)."""
        return self._url

    def describe(self) -> str:
        """The inner store's description."""
        return str(self.inner.describe())

    def uncached(self) -> Any:
        """The system of record under the cache (what integrity checks read)."""
        return self.inner

    def key(self, stream_id: str) -> bytes:
        """The Redis key of ``stream_id``'s cached tail.

        Raises:
            StoreUnavailable: the inner store cannot be reached (the key is read from it
                on first use).
        """
        return f"{self._space().ns}s:{stream_id}".encode()

    def _usable(self) -> bool:
        return not self._outage or time.monotonic() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        """Start or extend an outage: WARNING once, then bypass with backoff."""
        with self._lock:
            self.stats.errors += 1
            self._failures += 1
            delay = min(self._cfg.retry_after * 2 ** min(self._failures - 1, 16), _MAX_BACKOFF)
            self._down_until = time.monotonic() + delay
            first = not self._outage
            self._outage = True
        if first:
            text = f"{type(exc).__name__}: {exc}"
            pw = self._cfg.password
            logger.warning(
                "redis cache %s unavailable (%s); bypassing it, reads and appends go to %s "
                "only; retrying in %gs",
                self._url,
                text.replace(pw, "***") if pw and len(pw) >= 3 else text,
                self.describe(),
                delay,
            )
        else:
            logger.debug("redis cache %s still unavailable; retrying in %gs", self._url, delay)

    def _ok(self) -> None:
        if not self._outage:
            return
        with self._lock:
            was, self._outage, self._failures = self._outage, False, 0
        if was:
            logger.info("redis cache %s reachable again", self._url)

    def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append to the inner store, then (after it committed) update the cached tail and
        publish a wake-up.

        Raises:
            ConcurrencyError: ``expected_version`` is not satisfied (from the inner store).
            StoreUnavailable: the inner store cannot be reached.
        """
        spy = SealRecorder.around(batch)
        # Taken before the commit: an erasure of these events comes after it, and refuses
        # the cache write below if it comes before that write.
        epoch, started = self._epoch, time.time()
        outcome: AppendOutcome = self.inner.append(spy, expected_version)
        if outcome.duplicate:
            return outcome
        events = outcome.events or self._rebuild(spy, outcome)
        if events:
            self._store_tail(batch.stream_id, events, epoch, started, force=False, publish=True)
        elif outcome.position is not None:
            self._publish(outcome.position)  # readers catch the tail up from the inner store
        return outcome

    def _rebuild(self, spy: SealRecorder, outcome: AppendOutcome) -> list[RecordedEvent]:
        """The events just written, where a batch provably takes consecutive positions
        (gapless backends, PostgreSQL); else none (the next read catches the tail up)."""
        sealed = spy.sealed
        if not sealed or outcome.position is None or sealed[-1].version != outcome.version:
            return []
        consecutive = Capability.GAPLESS_POSITIONS in self.capabilities or (
            type(self.inner).__module__.startswith("ares_events.stores.postgres.")
        )
        if not consecutive:
            return []
        first = outcome.position - len(sealed) + 1
        return [s.recorded(spy.stream_id, first + i) for i, s in enumerate(sealed)]

    def _publish(self, position: int) -> None:
        if not self._usable():
            self.stats.bypassed += 1
            return
        self._call(self._redis.publish, self._space().channel, position)

    def _store_tail(
        self,
        stream_id: str,
        events: Sequence[RecordedEvent],
        epoch: bytes,
        started: float,
        *,
        force: bool,
        publish: bool,
    ) -> None:
        """Write ``events`` (read from time ``started`` on, under erasure ``epoch``) to the
        stream's cached tail, and publish a wake-up."""
        if self._other_chain:
            return  # another chain's events: never served, so never written (see __init__)
        if not self._usable():
            self.stats.bypassed += 1
            return
        keys = self._space()
        run = list(events[-self._cfg.tail :])
        entries: list[bytes] = []
        # Events read longer than ttl ago would never be served (_unsealed): not written.
        if time.time() - started < self._cfg.ttl:
            filled = int(started * 1000)
            sealer = Sealer(keys.mac, stream_id)
            try:
                entries = [sealer.seal(e.version, _encode(e, filled)) for e in run]
            except (UnicodeDecodeError, TypeError, ValueError):
                logger.debug("stream %r: events not cacheable; tail not updated", stream_id)
                entries = []
        channel = keys.channel if publish else b""
        if entries:
            first, last = run[0], run[-1]
            args: list[Any] = [
                first.version,
                last.version,
                first.prev_hash,
                last.hash,
                self._cfg.tail,
                self._cfg.ttl,
                "1" if force else "0",
                channel,
                last.position,
                epoch,
                fresh_epoch(),
                *entries,
            ]
            now = self._call(self._script, keys=[self.key(stream_id), keys.epoch], args=args)
            if isinstance(now, bytes):
                self._epoch = now
            elif now is _WRONGTYPE:
                self._wrong_type(stream_id)
        elif publish:
            self._call(self._redis.publish, channel, events[-1].position)

    def erase(self, stream_id: str, *args: Any) -> Any:
        """Erase in the inner store, then drop the stream's cached tail (an erasure changes
        no hash, so the tail's stamp would still match the head) and replace the erasure
        epoch, so that no write of events read before the erasure is taken.

        Raises:
            StoreUnavailable: the inner store cannot be reached.
        """
        outcome = self.inner.erase(stream_id, *args)
        self.drop_tails([stream_id])
        return outcome

    def drop_tails(self, stream_ids: Sequence[str]) -> None:
        """Drop the cached tails of ``stream_ids`` and replace the erasure epoch, after
        events of theirs changed in the store without changing their heads (an erasure;
        archived events retired, :func:`ares_events.archive.retention.retire`): a tail's
        stamp would still match the head. Any writer that read the old events before is
        refused (the epoch). Until it is done (Redis down), this object reads those streams
        around the cache; other processes serve such a tail for at most ``ttl`` seconds
        (docs/operations.md, "Erasure and the cache")."""
        if not stream_ids:
            return
        with self._lock:
            self._dirty.update(stream_ids)
        self._drop_cached(stream_ids)

    def _drop_cached(self, stream_ids: Sequence[str]) -> bool:
        """True once the streams' cached tails are gone and the epoch replaced."""
        if not self._usable():
            return False
        for i in range(0, max(len(stream_ids), 1), _DROP_BATCH):
            batch = stream_ids[i : i + _DROP_BATCH]
            keys = [self._space().epoch, *(self.key(sid) for sid in batch)]
            epoch = self._call(self._drop_script, keys=keys, args=[fresh_epoch()])
            if not isinstance(epoch, bytes):  # failed, or skipped while closing
                return False
            self._epoch = epoch
            with self._lock:
                self._dirty.difference_update(batch)
        return True

    def _wrong_type(self, stream_id: str | None) -> None:
        """The epoch (or ``stream_id``'s tail) holds another type of Redis value: count and
        log a forged entry, then drop the tail and replace the epoch."""
        self.stats.forged += 1
        logger.warning(
            "%s holds another type of Redis value than the store's cache writes there; replaced",
            "the cache's erasure epoch"
            if stream_id is None
            else f"stream {stream_id!r}: the cached tail or the cache's erasure epoch",
        )
        self._drop_cached([] if stream_id is None else [stream_id])

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        """Events of one stream in version order, from the cached tail when it provably
        matches the inner store's head, else from the inner store (lazily)."""
        if (
            self._other_chain
            or not self._usable()
            or (stream_id in self._dirty and not self._drop_cached([stream_id]))
        ):
            self.stats.bypassed += 1
            return self.inner.read(stream_id, from_version, to_version, limit)  # type: ignore[no-any-return]
        return self._read(stream_id, from_version, to_version, limit)

    def _read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        # Both taken before anything is read from the store: the erasure epoch (a refill of
        # events read before an erasure is refused) and the time the entries written from
        # this read carry (they are served until ttl seconds after it).
        epoch, started = self._epoch, time.time()
        head: Head | None = self.inner.head(stream_id)
        if head is None:
            yield from self.inner.read(stream_id, from_version, to_version, limit)
            return
        if self._other_chain is None:
            # The store recorded no identity when this object was opened; it has one now
            # that a stream exists (the first write records it first), unless it is a
            # store that keeps none (then there is no other chain to tell).
            self._other_chain = chain_differs(self.inner, self._chain_key) is True
            if self._other_chain:
                self.stats.bypassed += 1
                yield from self.inner.read(stream_id, from_version, to_version, limit)
                return
        lo = max(from_version, 1)
        hi = head.version if to_version is None else min(to_version, head.version)
        if limit is not None:
            hi = min(hi, lo + limit - 1)
        if hi < lo:
            return  # nothing in range as of the head just read
        force: bool | None = False
        if head.version - lo < self._cfg.tail:  # else older than any cached tail
            served, force = self._from_cache(stream_id, lo, hi, head, epoch, started)
            if served is not None:
                yield from served
                return
        self.stats.misses += 1
        # Read to the end requested, not to the head: a longer answer is just as true. When
        # the read reaches the head, refill the cached tail (``force``: replace what is
        # cached; None: the cache is current, leave it).
        recent: deque[RecordedEvent] = deque(maxlen=self._cfg.tail)
        for e in self.inner.read(stream_id, lo, to_version, limit):
            recent.append(e)
            yield e
        if force is not None and recent and recent[-1].version >= head.version:
            run = contiguous_suffix(list(recent))
            self._store_tail(stream_id, run, epoch, started, force=force, publish=False)

    def _from_cache(
        self, stream_id: str, lo: int, hi: int, head: Head, epoch: bytes, started: float
    ) -> tuple[list[RecordedEvent] | None, bool | None]:
        """Events ``lo..hi`` from the cache, or None and how to refill it (True: replace,
        False: extend, None: leave it). Fetched up to the newest, to check the hashes up to
        the store's head."""
        fields = [b"v", b"h", b"f", *(b"e:%d" % v for v in range(lo, head.version + 1))]
        key = self.key(stream_id)
        got = self._call(self._redis.hmget, key, fields)
        if got is _SKIPPED:
            return None, None
        if got is _FAILED:
            return None, False
        if got is _WRONGTYPE:
            # Not a tail: dropped (DEL takes any type), so the refill can replace it.
            self._call(self._redis.delete, key)
            return self._forged(stream_id, "its key holds another type of Redis value")
        vals = cast("list[bytes | None]", got)
        if vals[0] is None or vals[1] is None:
            return None, False  # nothing cached for this stream
        try:
            cached_v = int(vals[0])
        except ValueError:
            return self._forged(stream_id, "its stamp is not a version")
        cached_h = bytes(vals[1])
        try:
            if cached_v == head.version:
                if cached_h != head.hash:
                    return None, True  # another chain under this key: replace it
                raws = vals[3:]
                if any(r is None for r in raws):
                    return None, None  # older than the (current) cached tail
                out = self._unsealed(stream_id, lo, hi, cast("list[bytes]", raws))
                if out is None:
                    return None, True
                if not self._vouched(stream_id, lo, out, head.hash):
                    return self._forged(stream_id, "its events do not hash to the store's head")
                self.stats.hits += 1
                return out[: hi - lo + 1], False
            if cached_v > head.version:
                return None, True  # cache ahead of the store (restored, or another store)
            return self._catch_up(
                stream_id, lo, hi, head, cached_v, cached_h, vals[3:], epoch, started
            )
        except _Forged as exc:
            return self._forged(stream_id, str(exc))

    def _catch_up(
        self,
        stream_id: str,
        lo: int,
        hi: int,
        head: Head,
        cached_v: int,
        cached_h: bytes,
        raws: Sequence[bytes | None],
        epoch: bytes,
        started: float,
    ) -> tuple[list[RecordedEvent] | None, bool | None]:
        """The cache is behind the head: read the newer events from the inner store, check
        they link onto the cached tail, serve both and extend the cache (or raise _Forged).
        """
        missing = head.version - cached_v
        if missing > self._cfg.tail:
            return None, False
        cached_part = raws[: max(0, cached_v - lo + 1)]
        if any(r is None for r in cached_part):
            return None, False
        out = self._unsealed(stream_id, lo, hi, cast("list[bytes]", cached_part))
        if out is None:
            return None, True
        newer = list(self.inner.read(stream_id, cached_v + 1, head.version, None))
        if len(newer) != missing or newer[0].prev_hash != cached_h or newer[-1].hash != head.hash:
            return None, True  # the cached tail is not this stream's history
        if out and not self._vouched(stream_id, lo, out, newer[0].prev_hash):
            raise _Forged("its events do not hash to the store's head")
        out = [e for e in out if e.version <= hi]
        out.extend(e for e in newer if lo <= e.version <= hi)
        self.stats.partial_hits += 1
        self._store_tail(stream_id, newer, epoch, started, force=False, publish=False)
        return out, False

    def _unsealed(
        self, stream_id: str, lo: int, hi: int, raws: list[bytes]
    ) -> list[RecordedEvent] | None:
        """The events of ``raws`` (versions ``lo``..), those up to ``hi`` checked against
        their seals (which also cover position and payload reference, unlike the chain);
        None when one to serve is ``ttl`` seconds old or more (it may predate an erasure:
        docs/operations.md, "Erasure and the cache"). Raises _Forged on a bad entry."""
        # Only the events served need their seal: the others are used for their chain
        # fields only (to link the served ones to the head's hash), which are hashed again.
        served = hi - lo + 1
        bodies = Sealer(self._space().mac, stream_id).unseal(lo, raws, served)
        if bodies is None:
            raise _Forged("an entry's seal does not match")
        now = time.time() * 1000
        ttl = self._cfg.ttl * 1000
        out: list[RecordedEvent] = []
        append = out.append
        for i, body in enumerate(bodies):
            try:
                fields = orjson.loads(body)
                filled = fields[10]
                append(_event(stream_id, lo + i, fields))
            except (ValueError, TypeError, AttributeError, IndexError) as exc:
                raise _Forged("a malformed entry") from exc
            if i < served and (type(filled) is not int or not now - ttl < filled <= now + ttl):
                return None  # stale (or from a clock far ahead): replaced, not served
        return out

    def _vouched(
        self, stream_id: str, lo: int, events: list[RecordedEvent], end_hash: bytes
    ) -> bool:
        """Whether ``events`` (versions ``lo``.., from Redis) hash and link up to
        ``end_hash``, read from the store: then they are the stored events, whatever was
        written to Redis (docs/architecture.md, "Redis cache")."""
        key = None if self._chain_key is None else self._chain_key.key
        sj = _cache_name(stream_id)
        last_v, last_h = (0, genesis(stream_id)) if lo == 1 else (lo - 1, events[0].prev_hash)
        i = 0
        while True:
            i, last_v, last_h = vouch(events, i, stream_id, sj, last_v, last_h, key)
            if i == len(events):
                return last_h == end_hash
            # The fast path takes inline payloads only; a spilled payload's hash commits to
            # the digest its reference carries (its key and erased flag: the entry's seal).
            e = events[i]
            if e.payload_ref is None or e.version != last_v + 1 or e.prev_hash != last_h:
                return False
            if link_hash(last_h, e.header(), self._chain_key) != e.hash:
                return False
            i, last_v, last_h = i + 1, e.version, e.hash

    def _forged(self, stream_id: str, why: str) -> tuple[None, bool]:
        """Count and log a cached tail edited in Redis (never its content)."""
        self.stats.forged += 1
        logger.warning(
            "stream %r: the cached tail is not as the store's cache wrote it (%s); read from "
            "the store and replaced",
            stream_id,
            why,
        )
        return None, True

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> Iterator[RecordedEvent]:
        """Global order, always from the inner store (which filters by ``stream_prefix``)."""
        kw = {"stream_prefix": stream_prefix} if stream_prefix else {}
        return self.inner.read_all(after_position, limit, **kw)  # type: ignore[no-any-return]

    def head(self, stream_id: str) -> Head | None:
        """The inner store's head (never cached: it decides ``expected_version``)."""
        return self.inner.head(stream_id)  # type: ignore[no-any-return]

    def heads(self) -> Iterator[tuple[str, Head]]:
        """Every head, from the inner store."""
        return self.inner.heads()  # type: ignore[no-any-return]

    def last_position(self) -> int:
        """The inner store's last position."""
        return int(self.inner.last_position())

    def wait_for(self, position: int, timeout: float) -> bool:
        """Wait for an event after ``position`` (True) or ``timeout`` seconds (False):
        the inner store's wake-ups when it has them, else the Redis channel with a re-check
        at least every 0.25 s, else polling.

        Raises:
            StoreUnavailable: the inner store cannot be reached.
        """
        if Capability.WAKEUPS in self.capabilities:
            return bool(self.inner.wait_for(position, timeout))
        deadline = time.monotonic() + timeout
        if self.inner.last_position() > position:
            return True
        pubsub = self._subscribe()
        delay = 0.005
        try:
            while True:
                # Checked after subscribing, so an append just before cannot be missed.
                if self.inner.last_position() > position:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if pubsub is not None:
                    if self._call(pubsub.get_message, timeout=min(left, _POLL_CAP)) is _FAILED:
                        _close_quietly(pubsub)
                        pubsub = None
                else:
                    time.sleep(min(delay, left))
                    delay = min(delay * 2, _POLL_CAP)
        finally:
            if pubsub is not None:
                _close_quietly(pubsub)

    def _subscribe(self) -> Any:
        if not self._usable():
            self.stats.bypassed += 1
            return None
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        if self._call(pubsub.subscribe, self._space().channel) in (_SKIPPED, _FAILED):
            _close_quietly(pubsub)
            return None
        return pubsub

    # Each is a method of its own: ``isinstance`` against a runtime-checkable protocol
    # looks methods up on the class (3.12+). A write here leaves cached tails as they are:
    # a read serves a tail only when its stamp equals the inner head.

    def append_many(self, batches: Sequence[tuple[Batch, ExpectedVersion]], tracking: Any) -> Any:
        return self.inner.append_many(batches, tracking)

    def tracked_position(self, name: str) -> Any:
        return self.inner.tracked_position(name)

    def heads_page(self, after: str, limit: int, prefix: str | None) -> Any:
        return self.inner.heads_page(after, limit, prefix)

    def positions(self, after_position: int) -> Any:
        return self.inner.positions(after_position)

    def find_duplicates(self) -> Any:
        return self.inner.find_duplicates()

    def meta_get(self, key: str) -> Any:
        return self.inner.meta_get(key)

    def meta_put_if_absent(self, key: str, value: str) -> Any:
        return self.inner.meta_put_if_absent(key, value)

    def meta_set(self, key: str, value: str) -> None:
        self.inner.meta_set(key, value)

    def meta_swap(self, key: str, expected: str | None, value: str) -> Any:
        return self.inner.meta_swap(key, expected, value)

    def delete_archived(self, first: int, last: int, expected: Sequence[Any]) -> Any:
        return self.inner.delete_archived(first, last, expected)  # older than any cached tail

    def snapshot_rows(self) -> Any:
        return self.inner.snapshot_rows()  # snapshots are not cached

    def read_models(self) -> Any:
        return self.inner.read_models()  # read models are not cached

    def default_blobs_url(self) -> Any:
        return self.inner.default_blobs_url()

    def close(self) -> None:
        """Wait for the Redis calls in flight (later ones are skipped), close the inner
        store (which waits for its own calls), then the Redis connections. Idempotent."""
        first = self._gate.close()
        self.inner.close()
        if first:
            with contextlib.suppress(*self._redis_errors):
                self._redis.close()


class _Forged(Exception):
    """A cached entry that is not as this store's cache wrote it (internal)."""


_SKIPPED: Final = object()  # a Redis call skipped because of close() (see ``_call``)
_FAILED: Final = object()  # a Redis call that failed
_WRONGTYPE: Final = object()  # a Redis call refused: a key of another type (see ``_call``)


def _close_quietly(pubsub: Any) -> None:
    with contextlib.suppress(Exception):
        pubsub.close()
