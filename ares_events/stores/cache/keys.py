"""The cache's keys: the per-store secret recorded in the store (``ares_meta`` row
``cache/secret``), the Redis namespace and the entry MAC key derived from it
(:func:`load_keys`), and the seal in front of each cached entry (:class:`Sealer`). Why a
secret: docs/architecture.md, "Redis cache".

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import blake3

from ares_events.chain import ChainKey
from ares_events.core.backend import Capability
from ares_events.core.identity import IDENTITY_KEY, StoreIdentity
from ares_events.core.recorder import backend_of
from ares_events.errors import StoreError, StoreUnavailable

logger = logging.getLogger(__name__)

__all__ = [
    "CACHE_ROW",
    "TAG_SIZE",
    "CacheKeys",
    "Sealer",
    "chain_differs",
    "fresh_epoch",
    "load_keys",
]

CACHE_ROW: Final = "cache/secret"
"""The ``ares_meta`` row holding the store's cache secret (64 hex digits)."""
TAG_SIZE: Final = 16
"""Bytes of the MAC in front of each cached entry."""
_LAYOUT: Final = b"entries 2"
"""Part of the namespace: a new entry layout gets new keys, so no reader meets entries of
another layout (they expire). Change it with the layout of :meth:`Sealer.seal` or
``_encode``."""


@dataclass(frozen=True, slots=True)
class CacheKeys:
    """What one store's cache is keyed by (never logged: ``mac`` is a secret)."""

    ns: str
    """Key prefix of every Redis key of this store: ``<prefix><16 hex digits>:``."""
    mac: bytes = field(repr=False)
    """The key of the entries' MACs."""
    shared: bool
    """False: the store holds no secret this process can read (or record), so the namespace
    and MAC key are this process's own and its cached tails serve nobody else."""

    @property
    def epoch(self) -> bytes:
        """The key of the erasure epoch (a random value each erasure replaces)."""
        return f"{self.ns}epoch".encode()

    @property
    def channel(self) -> bytes:
        """The wake-up channel."""
        return f"{self.ns}wake".encode()


def load_keys(
    inner: Any, prefix: str, chain_key: ChainKey | None, *, record: bool = True
) -> CacheKeys:
    """The keys of the store under ``inner``: read its cache secret, recording one first
    when it has none, ``record`` is true and the store may be written (one metadata read;
    one write, once per store).

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    secret = _recorded_secret(inner, record)
    shared = secret is not None
    if secret is None:
        secret = os.urandom(32)
    # The secret tells two stores apart wherever they are; the location tells a store from
    # a copy of it (a backup restored elsewhere), which holds the same secret.
    ns = blake3.blake3(
        b"\0".join((_LAYOUT, secret, _location(inner))),
        derive_key_context="ares-events v1 cache namespace",
    ).hexdigest(length=8)
    mac = blake3.blake3(secret, derive_key_context="ares-events v1 cache entry").digest()
    if chain_key is not None:
        # A keyed store's entries need the chain key too: reading the database (which
        # holds the secret) is then not enough to forge one.
        mac = blake3.blake3(mac, key=chain_key.derive("cache entry")).digest()
    return CacheKeys(ns=f"{prefix}{ns}:", mac=mac, shared=shared)


def _recorded_secret(inner: Any, record: bool) -> bytes | None:
    """The store's cache secret, recorded now if need be and ``record``; None when it has
    none and cannot record one."""
    where = inner.describe()
    if Capability.METADATA not in inner.capabilities:
        logger.info("redis cache: %s keeps no metadata; its cache is this process's own", where)
        return None
    raw = inner.meta_get(CACHE_ROW)
    if raw is None:
        read_only = getattr(backend_of(inner), "read_only", False) is True
        if read_only or not record:
            # Opened read-only, or by a store object that never writes: it must not
            # write, not even this row.
            logger.info(
                "redis cache: %s %s and records no cache secret yet; its cache is this "
                "process's own",
                where,
                "is read-only" if read_only else "is read by a store object that never writes",
            )
            return None
        try:
            raw = inner.meta_put_if_absent(CACHE_ROW, os.urandom(32).hex())
        except StoreUnavailable:
            raise
        except StoreError as exc:
            logger.info(
                "redis cache: cannot record a cache secret in %s (%s); its cache is this "
                "process's own",
                where,
                type(exc).__name__,
            )
            return None
    try:
        secret = bytes.fromhex(raw)
    except (TypeError, ValueError):
        secret = b""
    if len(secret) != 32:
        logger.warning(
            "redis cache: the %s row of %s is not 64 hex digits; its cache is this "
            "process's own until the row is deleted",
            CACHE_ROW,
            where,
        )
        return None
    return secret


def chain_differs(inner: Any, chain_key: ChainKey | None) -> bool | None:
    """Whether the store under ``inner`` records another hash chain than ``chain_key``
    (True for a store object opened with ``check_identity=False`` under another key); None
    when it records no identity yet. One metadata read.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    if Capability.METADATA not in inner.capabilities:
        return False  # such a store records no identity: there is no other chain to tell
    raw = inner.meta_get(IDENTITY_KEY)
    if raw is None:
        return None
    try:
        identity = StoreIdentity.from_json(raw, inner.describe())
    except StoreUnavailable:
        raise
    except StoreError:
        return True  # unreadable (the open reported it): whose chain it is cannot be told
    return identity.chain_problem(chain_key) is not None


def _location(inner: Any) -> bytes:
    """Where the store is: a file's real path, else its description and schema (a schema
    may be given outside the URL)."""
    backend = backend_of(inner)
    path = getattr(backend, "path", None)
    if isinstance(path, Path):
        return os.path.realpath(path).encode()
    schema = getattr(backend, "schema", None)
    return f"{inner.describe()}\0{schema if isinstance(schema, str) else ''}".encode()


def fresh_epoch() -> bytes:
    """A new erasure epoch: random, so that one never comes back after a loss (eviction)."""
    return os.urandom(12).hex().encode()


class Sealer:
    """Seals and checks the entries of one stream (one per operation, not shared between
    threads). The MAC is keyed BLAKE2b over the stream id, the version and the entry: a
    stdlib keyed hash made to be a MAC, and for entries of a few hundred bytes about a
    fifth cheaper per call than the blake3 binding (a read checks one per cached event)."""

    __slots__ = ("_base",)

    def __init__(self, mac: bytes, stream_id: str) -> None:
        sid = stream_id.encode()
        # Stream and version are the entry's Redis key and field, not in its body: bound
        # here (the stream's length first and the version in 8 bytes, so no two pairs give
        # the same bytes), an entry cannot be moved to another stream or version.
        self._base = hashlib.blake2b(
            len(sid).to_bytes(4, "big") + sid, key=mac, digest_size=TAG_SIZE
        )

    def seal(self, version: int, body: bytes) -> bytes:
        """``body`` with its MAC in front."""
        h = self._base.copy()
        h.update(version.to_bytes(8, "big"))
        h.update(body)
        return h.digest() + body

    def unseal(self, lo: int, entries: Sequence[bytes], checked: int) -> list[bytes] | None:
        """The bodies of the sealed ``entries`` (versions ``lo``..), or None when the MAC
        of one of the first ``checked`` does not match (the others are not checked)."""
        # One loop, inlined: a read checks every event it serves from the cache.
        base = self._base
        same = hmac.compare_digest
        out: list[bytes] = []
        append = out.append
        for i, entry in enumerate(entries):
            body = entry[TAG_SIZE:]
            if i < checked:
                h = base.copy()
                h.update((lo + i).to_bytes(8, "big"))
                h.update(body)
                if not same(entry[:TAG_SIZE], h.digest()):
                    return None
            append(body)
        return out
