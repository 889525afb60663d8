"""Opening a store by URL: :func:`open_async_store` (one face written, the other generated;
the composition order is in docs/architecture.md).

It may import the core, :mod:`ares_events.errors` and this package's registry; the cache,
the blob stores and the worker-thread adapter are imported when asked for.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from ares_events.chain import ChainKey
from ares_events.core.backend import Capability
from ares_events.core.faces import ASYNC
from ares_events.core.identity import DEFAULT_BLOBS, IDENTITY_KEY, BlobsIdentity, StoreIdentity
from ares_events.core.rules import DEFAULT_MAX_INLINE_BYTES
from ares_events.core.store_async import AsyncEventStore
from ares_events.core.url import StoreURL, parse_int
from ares_events.stores import _registry

if ASYNC:
    import asyncio

logger = logging.getLogger(__name__)

__all__ = ["open_async_store"]


async def open_async_store(
    url: str,
    *,
    blobs: str | Literal[False] | None = None,
    spill_threshold: int = 256 * 1024,
    cache: str | None = None,
    chain_key: ChainKey | bytes | str | None = None,
    max_inline_bytes: int = DEFAULT_MAX_INLINE_BYTES,
    create: bool = True,
    check_identity: bool = True,
    **options: Any,
) -> AsyncEventStore:
    """Open an event store chosen by URL (on the asyncio face, a backend without a native
    asyncio recorder runs on worker threads: docs/guide-async.md).

    Args:
        url: ``memory://[NAME]``, ``sqlite:///rel.db``, ``sqlite:////abs.db``,
            ``postgresql://user@host/db?...``.
        blobs: blob store URL for spilled payloads (``file:///dir``, ``s3://bucket/prefix``).
            None (default): the location the store recorded in its identity, else the
            backend's default if it has one: for a SQLite file, the folder
            ``<file>.blobs`` next to it. False: no blob store (nothing spills, and
            spilled payloads cannot be read).
        spill_threshold: payloads larger than this many bytes go to ``blobs``.
        cache: optional Redis URL for a read-through cache (never the system of record).
        chain_key: 32-byte key (raw, hex or :class:`~ares_events.chain.ChainKey`) for
            keyed link hashes.
        max_inline_bytes: a payload that is not spilled may be at most this big (64 MiB);
            a bigger one is ``InvalidEvent`` (configure ``blobs`` to store it).
        create: create the store (file, schema, blob folder) when it does not exist
            (default). False opens an existing store only and creates nothing: what
            reporting and integrity tools use, so a typo'd path is "no store", not a new
            empty one.
        check_identity: refuse a configuration that differs from the store's recorded
            identity (default). False is for forensic reading under another chain key (a
            store opened so never writes).
        **options: backend keyword options (e.g. ``migrate=False``).

    Raises:
        ConfigError: bad URL or option (the message never contains a password), or a
            configuration that differs from the store's recorded identity (another chain
            key, none, or another blob location); nothing is written.
        UnknownSchemeError: no backend for the scheme.
        MissingDependencyError: the backend's extra is not installed.
        StoreNotFound: ``create=False`` and there is no store at ``url``.
        StoreUnavailable: the store cannot be reached.
        SchemaVersionError: ``migrate=False`` and the schema is not current.
    """
    parsed = StoreURL.parse(url)
    cls = _registry.resolve(parsed.scheme)
    key = ChainKey.coerce(chain_key)
    spill_threshold = parse_int(spill_threshold, "spill_threshold", "open_store")
    max_inline_bytes = parse_int(max_inline_bytes, "max_inline_bytes", "open_store")
    if not create:
        options["create"] = False
    recorder, identity = await _open_recorder(cls, parsed, cache, options, key)
    try:
        blobs_url, default_blobs = _blob_choice(blobs, identity, recorder)
        blob_store = None
        if blobs_url:
            from ares_events.stores.blobs import open_blobs

            blob_store = await asyncio.to_thread(open_blobs, blobs_url, create=create)
            if blobs and not default_blobs:  # named: it may be the default folder itself
                default_blobs = await asyncio.to_thread(_is_default, blob_store, identity, recorder)
        store = await AsyncEventStore.open(
            recorder,
            chain_key=key,
            blobs=blob_store,
            spill_threshold=spill_threshold,
            url=parsed.redacted(),
            max_inline_bytes=max_inline_bytes,
            default_blobs=default_blobs,
            identity=identity,
            check_identity=check_identity,
        )
    except BaseException:
        await recorder.close()
        raise
    logger.info("opened store %s", parsed.redacted())
    return store


async def _open_recorder(
    cls: type[Any], url: StoreURL, cache: str | None, options: dict[str, Any], key: ChainKey | None
) -> tuple[Any, StoreIdentity | None]:
    """The backend recorder of this face (behind the archive reader and the cache when
    asked for) and the identity the store recorded."""
    if ASYNC:
        native = None if cache is not None else _registry.resolve_async(cls)
        if native is None:  # the blocking face's recorder, on worker threads
            from ares_events.stores.opening import _open_recorder as _open_blocking
            from ares_events.stores.threaded import ThreadedRecorder

            sync, identity = await asyncio.to_thread(_open_blocking, cls, url, cache, options, key)
            return ThreadedRecorder(sync), identity
        rec = await native.open_url(url, **options)
    else:
        rec = cls.from_url(url, **options)
    try:
        identity = None
        if Capability.METADATA in rec.capabilities:
            raw = await rec.meta_get(IDENTITY_KEY)
            identity = None if raw is None else StoreIdentity.from_json(raw, url.redacted())
        if identity is not None and identity.archive is not None:
            # Under the cache: what the cache wraps (and integrity checks read) reads
            # through. A store without an archive never constructs the reader.
            from ares_events.archive.reader_async import AsyncArchiveRecorder

            rec = AsyncArchiveRecorder(rec)
        if cache is not None:  # a blocking recorder (asyncio with a cache runs on threads)
            from ares_events.stores.cache import CachedRecorder

            rec = CachedRecorder.wrap(rec, cache, key)
    except BaseException:
        await rec.close()
        raise
    return rec, identity


def _blob_choice(
    blobs: str | Literal[False] | None, identity: StoreIdentity | None, recorder: Any
) -> tuple[str | None, bool]:
    """The blob store URL to open (None: none) and whether it is the backend's default."""
    if blobs is not None:
        return blobs or None, False
    recorded = identity.blobs if identity is not None else None
    if isinstance(recorded, BlobsIdentity):
        return recorded.url, False  # where this store keeps its spilled payloads
    url = _default_url(recorder)
    return url, bool(url) and (recorded in (None, DEFAULT_BLOBS))


def _default_url(recorder: Any) -> str | None:
    caps = recorder.capabilities
    return recorder.default_blobs_url() if Capability.DEFAULT_BLOBS in caps else None


def _is_default(blob_store: Any, identity: StoreIdentity | None, recorder: Any) -> bool:
    """Whether a named blob store is the backend's default folder (compared as locations
    are, resolved): it is then the ``"default"`` the store records, not another location."""
    if identity is not None and isinstance(identity.blobs, BlobsIdentity):
        return False  # a recorded location: compared as such on open
    url = _default_url(recorder)
    if not url:
        return False
    from ares_events.stores.blobs import open_blobs

    return bool(open_blobs(url, create=False).location == blob_store.location)
