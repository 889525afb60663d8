"""Stores chosen by URL: ``open_store()``, ``register_store()``, ``available_schemes()``.

Composition order (documented in docs/architecture.md)::

    EventStore(core: validate, encode, chain, spill to blobs)
      └── CachedRecorder (Redis, optional, read-through; never the system of record)
            └── backend Recorder (memory | sqlite | postgresql)

What lives here: the backends, each implementing the core's ``Recorder`` protocol
(:mod:`~ares_events.stores.memory`, :mod:`~ares_events.stores.sqlite`, the
:mod:`~ares_events.stores.postgres` package), the Redis cache wrapper
(:mod:`~ares_events.stores.cache`), blob stores (:mod:`~ares_events.stores.blobs`), the
snapshot stores beside the events (:mod:`~ares_events.stores.snapshots`), the scheme
registry (``_registry``), SQL migrations (``_migrations``), ``Settings``
(:mod:`~ares_events.stores.settings`, the configuration :func:`open_store` takes) and
:mod:`~ares_events.stores.base`, the contract's import path for plugin authors.

It may import the core, :mod:`ares_events.errors` and :mod:`ares_events.integrity.chain`;
never verification, projections, the agent runtime, the CLI or an integration. The core
never imports a store: it reaches backends through the ``Recorder`` protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from ares_events.core.identity import DEFAULT_BLOBS, IDENTITY_KEY, BlobsIdentity, StoreIdentity
from ares_events.core.recorder import Capability, Recorder, StoreURL
from ares_events.core.store import DEFAULT_MAX_INLINE_BYTES, EventStore
from ares_events.core.store_async import AsyncEventStore
from ares_events.errors import ConfigError
from ares_events.integrity.chain import ChainKey
from ares_events.stores import _registry

logger = logging.getLogger(__name__)

__all__ = [
    "AsyncEventStore",
    "Capability",
    "EventStore",
    "Recorder",
    "StoreURL",
    "available_schemes",
    "open_async_store",
    "open_store",
    "register_store",
    "registered_stores",
]


def open_store(
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
) -> EventStore:
    """Open an event store chosen by URL.

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
        chain_key: 32-byte key (raw, hex or :class:`ChainKey`) for keyed link hashes.
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
    key = _check_common(chain_key, spill_threshold)
    if not create:
        options["create"] = False
    recorder = cls.from_url(parsed, **options)
    try:
        identity = _recorded_identity(recorder, parsed.redacted())
        blobs_url, default_blobs = _blob_choice(blobs, identity, recorder)
        blob_store = _open_blob_store(blobs_url, create)
        if cache is not None:
            from ares_events.stores.cache import CachedRecorder

            recorder = CachedRecorder.wrap(recorder, cache)
        store = EventStore(
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
        recorder.close()
        raise
    logger.info("opened store %s", parsed.redacted())
    return store


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
    """Open an asyncio event store chosen by URL: the same URLs, options, identity checks
    and blob choice as :func:`open_store`, and the same store (either face can open it).

    The backend's native asyncio face is used where it has one (``memory://``,
    ``postgresql://``: psycopg's async connections and pool); any other backend, and any
    store behind a Redis ``cache`` (redis-py is blocking), runs its blocking recorder in
    a few dedicated threads (:class:`~ares_events.stores.threaded.ThreadedRecorder`: one
    writer thread, reader threads), so nothing blocks the event loop. The store belongs
    to the running event loop.

    Raises:
        ConfigError: bad URL or option, or a configuration that differs from the store's
            recorded identity; nothing is written.
        UnknownSchemeError: no backend for the scheme.
        MissingDependencyError: the backend's extra is not installed.
        StoreNotFound: ``create=False`` and there is no store at ``url``.
        StoreUnavailable: the store cannot be reached.
        SchemaVersionError: ``migrate=False`` and the schema is not current.
    """
    import asyncio

    parsed = StoreURL.parse(url)
    cls = _registry.resolve(parsed.scheme)
    key = _check_common(chain_key, spill_threshold)
    if not create:
        options["create"] = False
    native = None if cache is not None else _registry.resolve_async(cls)
    recorder: Any
    if native is not None:
        recorder = await native.open_url(parsed, **options)
    else:
        from ares_events.stores.threaded import ThreadedRecorder

        def blocking_open() -> Any:
            rec = cls.from_url(parsed, **options)
            if cache is not None:
                from ares_events.stores.cache import CachedRecorder

                try:
                    rec = CachedRecorder.wrap(rec, cache)
                except BaseException:
                    rec.close()
                    raise
            return rec

        recorder = ThreadedRecorder(await asyncio.to_thread(blocking_open))
    try:
        getter = getattr(recorder, "meta_get", None)
        raw = await getter(IDENTITY_KEY) if callable(getter) else None
        identity = StoreIdentity.from_json(raw, parsed.redacted()) if raw is not None else None
        blobs_url, default_blobs = _blob_choice(blobs, identity, recorder)
        blob_store = (
            await asyncio.to_thread(_open_blob_store, blobs_url, create) if blobs_url else None
        )
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
    logger.info("opened async store %s", parsed.redacted())
    return store


def _check_common(
    chain_key: ChainKey | bytes | str | None, spill_threshold: int
) -> ChainKey | None:
    key = ChainKey.coerce(chain_key)
    if spill_threshold <= 0:
        raise ConfigError(
            f"spill_threshold must be a positive number of bytes, got {spill_threshold!r}"
        )
    return key


def _blob_choice(
    blobs: str | Literal[False] | None, identity: StoreIdentity | None, recorder: Any
) -> tuple[str | None, bool]:
    """The blob store URL to open (None: none) and whether it is the backend's default."""
    if blobs is not None:
        return blobs or None, False
    recorded = identity.blobs if identity is not None else None
    if isinstance(recorded, BlobsIdentity):
        return recorded.url, False  # where this store keeps its spilled payloads
    default = getattr(recorder, "default_blobs_url", None)
    url = default() if callable(default) else None
    return url, bool(url) and (recorded in (None, DEFAULT_BLOBS))


def _open_blob_store(blobs_url: str | None, create: bool) -> Any:
    if not blobs_url:
        return None
    from ares_events.stores.blobs import open_blobs

    return open_blobs(blobs_url, create=create)


def _recorded_identity(recorder: Any, where: str) -> StoreIdentity | None:
    """The identity the store recorded, or None (none yet, or a backend that keeps none)."""
    getter = getattr(recorder, "meta_get", None)
    if not callable(getter):
        return None
    raw = getter(IDENTITY_KEY)
    return StoreIdentity.from_json(raw, where) if raw is not None else None


def register_store(scheme: str, target: str | type[Any], *, replace: bool = False) -> None:
    """Register a backend class (or ``"module:Class"``) for a URL scheme.

    Raises:
        ConfigError: already registered and ``replace`` is False.
    """
    _registry.register(scheme, target, replace=replace)


def registered_stores() -> Mapping[str, str | type[Any]]:
    """Read-only view of scheme -> backend."""
    return _registry.view()


def available_schemes() -> list[str]:
    """Every registered scheme, sorted."""
    return sorted(_registry.view())
