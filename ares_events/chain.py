"""Hash chain, format v1: canonical JSON, payload digests, headers and link hashes.

This module is the single implementation of the on-disk chain format. ``docs/format.md``
restates it with test vectors, and ``tests/integrity/test_vectors.py`` checks this code
against them.

Byte layout (all hashes are 32-byte blake3 digests)::

    canonical_json(x) = json.dumps(x, sort_keys=True, separators=(",", ":"),
                                   ensure_ascii=False, allow_nan=False).encode("utf-8")
    payload_bytes     = canonical_json(payload)
    payload_digest    = blake3(payload_bytes)
    header            = canonical_json({"v": 1, "stream": stream_id, "version": version,
                                        "id": str(event_id), "type": type, "module": module,
                                        "meta": metadata, "at": "YYYY-MM-DDTHH:MM:SS.ffffffZ",
                                        "payload": payload_digest.hex(),
                                        "size": len(payload_bytes)})
    genesis(stream)   = blake3(b"ares-events/v1\\x00" + stream_id.encode())
    hash_1            = blake3(genesis(stream) + header_1)
    hash_n            = blake3(hash_{n-1} + header_n)

With a chain key, the link hashes use blake3's keyed mode; genesis and payload digests
stay unkeyed.

Headers and canonical JSON have fast encoders that ``tests/integrity/test_codec.py``
proves byte-identical to ``json.dumps``.
"""

from __future__ import annotations

import binascii
import importlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import blake3
import orjson

from ares_events.errors import ConfigError, InvalidEvent

logger = logging.getLogger(__name__)

NO_NATIVE_ENV: Final = "ARES_EVENTS_NO_NATIVE"


def _load_native() -> Any:
    """The optional C fast paths (``ares_events._native``), or None: not built, or switched
    off with ``ARES_EVENTS_NO_NATIVE=1`` (the Python code is their reference)."""
    if os.environ.get(NO_NATIVE_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("ares_events._native")
    except ImportError as exc:
        logger.debug("native fast paths not available (%s); using the Python ones", exc)
        return None


_native: Any = _load_native()
_native_scan: Any = None if _native is None else _native.scan

__all__ = [
    "FORMAT_VERSION",
    "ChainKey",
    "canonical_json",
    "canonical_json_reference",
    "genesis",
    "header_bytes",
    "link_hash",
    "link_hashes",
    "link_hashes_reference",
    "payload_digest",
    "payload_digester",
    "verify_run",
    "vouch",
]

FORMAT_VERSION: Final = 1
_GENESIS_PREFIX: Final = b"ares-events/v1\x00"
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1
_MAX_DEPTH: Final = 200
# json's own C string escaper (ensure_ascii=False flavour); this is what json.dumps uses.
_encode_str = json.encoder.c_encode_basestring or json.encoder.py_encode_basestring  # type: ignore[attr-defined]
_ORJSON_OPTS: Final = orjson.OPT_SORT_KEYS


class ChainKey:
    """A 32-byte key for the keyed (MAC) mode of the chain's link hashes.

    The key never appears in ``repr``, ``str`` or any error message.
    """

    __slots__ = ("_derived", "_key")

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) != 32:
            raise ConfigError("chain key must be exactly 32 bytes")
        self._key = bytes(key)
        self._derived: dict[str, bytes] = {}

    @classmethod
    def from_hex(cls, text: str, *, source: str = "chain key") -> ChainKey:
        """Parse a 64-hex-digit key.

        Raises:
            ConfigError: the text is not 64 hex digits (the message never echoes it).
        """
        try:
            raw = bytes.fromhex(text.strip())
        except ValueError:
            raise ConfigError(f"{source} must be 64 hex digits (32 bytes)") from None
        if len(raw) != 32:
            raise ConfigError(f"{source} must be 64 hex digits (32 bytes), got {len(raw)} bytes")
        return cls(raw)

    @classmethod
    def coerce(cls, key: ChainKey | bytes | str | None) -> ChainKey | None:
        """A key from a :class:`ChainKey`, 32 raw bytes or 64 hex digits (None stays None).

        Raises:
            ConfigError: anything else (the message never echoes the value).
        """
        if key is None or isinstance(key, ChainKey):
            return key
        if isinstance(key, bytes | bytearray):
            return cls(bytes(key))
        if isinstance(key, str):
            return cls.from_hex(key)
        raise ConfigError("chain_key must be a ChainKey, 32 raw bytes or 64 hex digits")

    @property
    def key(self) -> bytes:
        """The raw key bytes. Never log them."""
        return self._key

    def derive(self, purpose: str) -> bytes:
        """A 32-byte subkey for one purpose (blake3's key derivation mode, context
        ``"ares-events v1 <purpose>"``): snapshot seals and anchor MACs never use the
        link-hash key itself. Never log it."""
        sub = self._derived.get(purpose)
        if sub is None:
            sub = blake3.blake3(self._key, derive_key_context=f"ares-events v1 {purpose}").digest()
            self._derived[purpose] = sub
        return sub

    def mac(self, purpose: str, data: bytes) -> bytes:
        """blake3 keyed hash of ``data`` under the subkey of ``purpose`` (32 bytes)."""
        return blake3.blake3(data, key=self.derive(purpose)).digest()

    def fingerprint(self) -> str:
        """A short, non-reversible identifier of the key, safe to display."""
        return blake3.blake3(b"ares-events/key-fingerprint\x00" + self._key).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"ChainKey(fingerprint={self.fingerprint()})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChainKey) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self) -> Any:  # refuse to be pickled into logs or task queues by accident
        raise TypeError("ChainKey cannot be pickled")


def _check(x: Any, path: str, depth: int) -> bool:
    """Validate a JSON value; return True when it contains a float anywhere.

    ``type(x) is ...`` checks are deliberate: bool is an int subclass, and tuples, sets,
    UUIDs, enums and other look-alikes are rejected instead of being coerced.
    """
    t = type(x)
    if t is str:
        return False
    if t is dict or t is list:
        if depth > _MAX_DEPTH:
            raise InvalidEvent(path, f"nested deeper than {_MAX_DEPTH} levels")
        has_float = False
        for k, v in x.items() if t is dict else enumerate(x):
            if t is list:
                sub = f"{path}[{k}]"
            elif type(k) is str:
                sub = f"{path}.{k}"
            else:
                raise InvalidEvent(f"{path}", f"object key {k!r} is {type(k).__name__}, not str")
            if _check(v, sub, depth + 1):
                has_float = True
        return has_float
    if t is int:
        if x < _INT_MIN or x > _INT_MAX:
            raise InvalidEvent(path, f"integer {x} is outside the 64-bit signed range")
        return False
    if t is bool or x is None:
        return False
    if t is float:
        if math.isnan(x) or math.isinf(x):
            raise InvalidEvent(path, f"{x!r} is not a finite number (NaN/Infinity are not JSON)")
        return True
    if isinstance(x, str):  # str subclasses encode as their string value, like json.dumps
        return False
    raise InvalidEvent(
        path,
        f"{type(x).__name__} is not a JSON value "
        "(allowed: dict, list, str, int, float, bool, None)",
    )


class _Reject(Exception):
    """Internal: the fast scan met something it will not accept (the slow walk says why)."""


_REJECT = _Reject()


def _scan(x: Any, depth: int) -> bool:
    """:func:`_check` without messages (``_Reject`` instead; scalars in containers are
    checked inline, no call per leaf): True when a float occurs anywhere."""
    if depth > _MAX_DEPTH:
        raise _REJECT
    t = type(x)
    if t is dict:
        for k in x:
            if type(k) is not str:
                raise _REJECT
        values: Any = x.values()
    elif t is list:
        values = x
    elif t is str or t is bool or x is None:
        return False
    elif t is int:
        if x < _INT_MIN or x > _INT_MAX:
            raise _REJECT
        return False
    elif t is float:
        if x - x != 0.0:  # NaN or +-inf
            raise _REJECT
        return True
    elif isinstance(x, str):
        return False
    else:
        raise _REJECT
    has_float = False
    for v in values:
        tv = type(v)
        if tv is str or tv is bool or v is None:
            continue
        if tv is int:
            if v < _INT_MIN or v > _INT_MAX:
                raise _REJECT
        elif tv is float:
            if v - v != 0.0:
                raise _REJECT
            has_float = True
        elif tv is dict or tv is list:
            if _scan(v, depth + 1):
                has_float = True
        elif not isinstance(v, str):
            raise _REJECT
    return has_float


def canonical_json_reference(x: Any) -> bytes:
    """The normative encoder, exactly as format v1 defines it (no validation)."""
    return json.dumps(
        x, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_json(x: Any, *, field: str = "payload") -> bytes:
    """Encode ``x`` as canonical JSON bytes (format v1).

    Args:
        x: a value made only of dict (str keys), list, str, bool, None, finite float and
            int in [-2**63, 2**63).
        field: name used in error messages.

    Raises:
        InvalidEvent: the value is not canonical-JSON encodable; names the path.
    """
    try:
        # The walk of _scan in C where it is built: None where it refuses.
        has_float = _scan(x, 0) if _native_scan is None else _native_scan(x)
    except _Reject:
        has_float = None
    except RecursionError:
        raise InvalidEvent(field, f"nested deeper than {_MAX_DEPTH} levels") from None
    if has_float is None:
        _check(x, field, 0)  # raises InvalidEvent naming the path
        raise InvalidEvent(field, "is not canonical-JSON encodable")
    try:
        return canonical_json_reference(x) if has_float else orjson.dumps(x, option=_ORJSON_OPTS)
    except (TypeError, ValueError, orjson.JSONEncodeError) as exc:
        # lone surrogates (not UTF-8 encodable: UnicodeEncodeError is a ValueError) and similar.
        raise InvalidEvent(field, f"cannot be encoded as UTF-8 JSON: {exc}") from None


def payload_digest(payload_bytes: bytes) -> bytes:
    """blake3 of the canonical payload bytes (never keyed)."""
    return blake3.blake3(payload_bytes).digest()


def payload_digester() -> Callable[[bytes], bytes]:
    """A :func:`payload_digest` for many payloads in a row, in ONE thread (one batch):
    it reuses one blake3 hasher, which spares the binding's per-call construction
    (about 0.3 µs a digest). The same bytes as :func:`payload_digest`."""
    h = blake3.blake3()
    update, digest, reset = h.update, h.digest, h.reset

    def one(payload_bytes: bytes) -> bytes:
        update(payload_bytes)
        d: bytes = digest()
        reset()
        return d

    return one


def genesis(stream_id: str) -> bytes:
    """The chain's starting value for a stream (never keyed)."""
    return blake3.blake3(_GENESIS_PREFIX + stream_id.encode("utf-8")).digest()


def header_bytes(
    stream_id: str,
    version: int,
    event_id: str,
    type_: str,
    module: str,
    meta_json: bytes,
    at: str,
    digest_hex: str,
    size: int,
) -> bytes:
    """Canonical JSON of the header object, assembled from pre-encoded parts.

    ``meta_json`` must already be ``canonical_json(metadata)``. Keys appear in sorted
    order: at, id, meta, module, payload, size, stream, type, v, version.
    """
    enc = _encode_str
    cache = _NAME_CACHE
    st = cache.get(stream_id) or _cache_name(stream_id)
    ty = cache.get(type_) or _cache_name(type_)
    mo = cache.get(module) or _cache_name(module)
    return _HEADER % (
        enc(at).encode(),
        enc(event_id).encode(),
        meta_json,
        mo,
        digest_hex.encode(),
        size,
        st,
        ty,
        version,
    )


# Stream ids, types and modules repeat from event to event: keep their JSON encodings.
_NAME_CACHE: dict[str, bytes] = {}
_HEADER: Final = (
    b'{"at":%b,"id":%b,"meta":%b,"module":%b,"payload":"%b","size":%d,"stream":%b,'
    b'"type":%b,"v":1,"version":%d}'
)


def _cache_name(name: str) -> bytes:
    if len(_NAME_CACHE) > 4096:
        _NAME_CACHE.clear()
    encoded: bytes = _encode_str(name).encode("utf-8")
    _NAME_CACHE[name] = encoded
    return encoded


def link_hashes(
    stream_id: str,
    version: int,
    prev: bytes,
    events: Iterable[Any],
    key: ChainKey | None = None,
) -> list[bytes]:
    """The link hashes of ``events`` (each a :class:`~ares_events.core.events.PreparedEvent`)
    appended to ``stream_id`` after ``version`` whose hash is ``prev``: exactly
    ``link_hash(prev, header_bytes(...))`` event by event. The C loop does it when it is
    built; :func:`link_hashes_reference` is its reference.
    """
    st = _NAME_CACHE.get(stream_id) or _cache_name(stream_id)
    # Anything unusual (a head hash that is not 32 bytes in a tampered file, a version
    # past 64 bits) takes the reference, so the C loop never changes an outcome.
    if (
        _native is not None
        and type(version) is int
        and version < _INT_MAX
        and type(prev) is bytes
        and len(prev) == 32
    ):
        k = None if key is None else key.key
        return _native.link_hashes(st, version, prev, events, k)  # type: ignore[no-any-return]
    return link_hashes_reference(stream_id, version, prev, events, key)


def link_hashes_reference(
    stream_id: str,
    version: int,
    prev: bytes,
    events: Iterable[Any],
    key: ChainKey | None = None,
) -> list[bytes]:
    """:func:`link_hashes` in Python: ``link_hash(prev, header_bytes(...))`` event by
    event, with the stream's and the time's JSON computed once and one blake3 hasher."""
    enc = _encode_str
    cache = _NAME_CACHE
    st = cache.get(stream_id) or _cache_name(stream_id)
    h = blake3.blake3() if key is None else blake3.blake3(key=key.key)
    update, digest, reset = h.update, h.digest, h.reset
    header = _HEADER
    last_at: str | None = None
    at_json = b""
    out: list[bytes] = []
    add = out.append
    for e in events:
        version += 1
        at = e.at
        if at != last_at:
            at_json = enc(at).encode()
            last_at = at
        ty = cache.get(e.type) or _cache_name(e.type)
        mo = cache.get(e.module) or _cache_name(e.module)
        update(prev)
        update(
            header
            % (
                at_json,
                enc(e.event_id).encode(),
                e.meta_json,
                mo,
                e.digest.hex().encode(),
                e.size,
                st,
                ty,
                version,
            )
        )
        prev = digest()
        reset()
        add(prev)
    return out


def link_hash(prev: bytes, header: bytes, key: ChainKey | None = None) -> bytes:
    """``hash_n = blake3(hash_{n-1} + header_n)``, keyed when a chain key is given."""
    if key is None:
        return blake3.blake3(prev + header).digest()
    return blake3.blake3(prev + header, key=key.key).digest()


def verify_run(
    events: Sequence[Any],
    start: int,
    stream_id: str,
    stream_json: bytes,
    last_version: int,
    last_hash: bytes,
    key: bytes | None = None,
    payload_hasher: Any = None,
    link_hasher: Any = None,
) -> tuple[int, int, bytes]:
    """The verifier's fast path over ``events[start:]`` (``RecordedEvent`` objects, or rows
    of their fields in the same order): vouches for each event in turn
    that is the next version, links to the last hash, has an inline payload and hashes to
    its stored hash; stops at the first it cannot vouch for (the slow path names the
    problem). Returns ``(index of that event or len(events), last version, last hash)``.

    The reference of ``ares_events._native.verify_run`` (``tests/integrity/test_native.py``);
    :func:`vouch` runs the native one when it is there.
    ``stream_json`` is the stream id as JSON; ``key`` the chain key's bytes; the hashers are
    reusable blake3 objects (the link one made with ``key``).
    """
    ph = blake3.blake3() if payload_hasher is None else payload_hasher
    lh = link_hasher
    if lh is None:
        lh = blake3.blake3() if key is None else blake3.blake3(key=key)
    cache = _NAME_CACHE
    enc = _encode_str
    n = len(events)
    i = start
    while i < n:
        e = events[i]
        version = e[1]
        raw = e[6]
        if (
            type(version) is not int
            or version != last_version + 1
            or e[9] != last_hash
            or e[11] is not None
            or type(raw) is not bytes
            or e[0] != stream_id
        ):
            break
        try:
            ty = e[4]
            ty = cache.get(ty) or _cache_name(ty)
            mo = e[5]
            mo = cache.get(mo) or _cache_name(mo)
            # The same escaper as header_bytes: the bytes hashed are always the canonical
            # ones, whatever characters a tampered row holds.
            at = enc(e[8]).encode()
            eid = enc(e[3]).encode()
            ph.update(raw)
            # hexlify, not blake3's hexdigest(): the binding's hex costs ~10x more.
            digest_hex = binascii.hexlify(ph.digest())
            ph.reset()
            header = _HEADER % (at, eid, e[7], mo, digest_hex, len(raw), stream_json, ty, version)
        except (TypeError, AttributeError, ValueError):
            ph.reset()
            break
        # One update per hash: each blake3 call costs about as much as hashing 300 bytes.
        lh.update(last_hash + header)
        h = lh.digest()
        lh.reset()
        if h != e[10]:
            break
        last_version = version
        last_hash = h
        i += 1
    return i, last_version, last_hash


def vouch(
    events: Sequence[Any],
    start: int,
    stream_id: str,
    stream_json: bytes,
    last_version: int,
    last_hash: bytes,
    key: bytes | None = None,
    payload_hasher: Any = None,
    link_hasher: Any = None,
) -> tuple[int, int, bytes]:
    """:func:`verify_run`, in C when the extension is built (several events hashed at
    once, lanes-wide): the one fast path of the chain verifier and the Redis cache."""
    native = _native
    if native is None or type(last_hash) is not bytes or type(last_version) is not int:
        return verify_run(
            events,
            start,
            stream_id,
            stream_json,
            last_version,
            last_hash,
            key,
            payload_hasher,
            link_hasher,
        )
    # verify_page (absent from a module built before it) may stop short of verify_run
    # (at anything unusual), never past it: verify_run decides from there.
    page = getattr(native, "verify_page", None)
    if page is not None and type(events) is list and len(events) - start > 1:
        start, last_version, last_hash = page(
            events, start, stream_id, stream_json, last_version, last_hash, key
        )
        if start == len(events):
            return start, last_version, last_hash
    return native.verify_run(  # type: ignore[no-any-return]
        events, start, stream_id, stream_json, last_version, last_hash, key
    )
