"""What every blob store shares: keys and digests, :class:`BlobInfo`, the
:class:`BlobStore` protocol, :class:`BlobReader`, :class:`BaseBlobStore` and
:func:`check_blob_params`.

It may import the core's value types and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any, BinaryIO, Final, Self

import blake3

from ares_events.core.blobs import BlobInfo, BlobStore
from ares_events.core.events import PayloadRef, PreparedEvent, RecordedEvent
from ares_events.core.url import StoreURL
from ares_events.errors import BlobCorrupted, ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "BLOB_SCHEMES",
    "CHUNK_SIZE",
    "OWNER_MARKER",
    "BaseBlobStore",
    "BlobInfo",
    "BlobReader",
    "BlobStore",
    "check_blob_params",
    "check_key",
    "copy_hashing",
    "digest_of",
]

CHUNK_SIZE = 1024 * 1024
"""Bytes read per step when streaming a blob (verify, put_stream)."""

OWNER_MARKER: Final = ".ares-owner"
"""The file (or object) at the top of a blob location naming the store that owns it: its
owner token. Not a blob: no listing shows it (it is not a key)."""

_PARALLEL_HASH_FROM = 8 * 1024 * 1024
_KEY_RE = re.compile(r"[0-9a-f]{64}")
BLOB_SCHEMES = ("file", "s3")


def check_key(key: str) -> str:
    """Return ``key`` if it is a blob key (64 lowercase hex digits).

    Keys come from ``payload_ref`` columns, which the chain does not cover; checking
    the form keeps an edited row from naming a path outside the blob store.

    Raises:
        BlobCorrupted: the key is not 64 lowercase hex digits.
    """
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise BlobCorrupted(str(key)[:80], "not a blob key (64 lowercase hex digits expected)")
    return key


def digest_of(data: bytes) -> bytes:
    """blake3 of ``data`` (multi-threaded for large inputs; same digest)."""
    if len(data) >= _PARALLEL_HASH_FROM:
        return blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest()
    return blake3.blake3(data).digest()


def copy_hashing(src: BinaryIO, dst: Any) -> tuple[int, bytes]:
    """Copy ``src`` to ``dst`` in chunks; the size and blake3 digest of what was copied."""
    hasher = blake3.blake3()
    size = 0
    while chunk := src.read(CHUNK_SIZE):
        hasher.update(chunk)
        size += len(chunk)
        dst.write(chunk)
    return size, hasher.digest()


class BlobReader(io.RawIOBase):
    """A read-only stream over a blob that checks its size and digest as it goes.

    Reading past the size in the ``PayloadRef`` or reaching the end with another size or
    digest raises :class:`BlobCorrupted`; nothing unverified is ever returned as the last
    chunk. Memory use is constant (one read buffer).
    """

    def __init__(
        self, raw: Any, ref: PayloadRef, *, stream_id: str | None = None, version: int | None = None
    ) -> None:
        super().__init__()
        self._raw = raw
        self._ref = ref
        self._where: dict[str, Any] = {"stream_id": stream_id, "version": version}
        self._hasher = blake3.blake3()
        self._seen = 0
        self._done = False

    def readable(self) -> bool:
        """Always True."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Read into ``buffer``; at the end of the blob, check it.

        Raises:
            BlobCorrupted: more bytes than the ref's size, or a wrong size or digest at the
                end.
        """
        if self._done:
            return 0
        view = memoryview(buffer).cast("B")
        # Ask for one byte more than the ref allows in total, so an oversized blob is
        # caught without reading all of it.
        want = max(1, min(len(view), self._ref.size + 1 - self._seen))
        data = self._raw.read(want)
        n = len(data)
        if n == 0:
            self._done = True
            _check_blob(self._ref, self._seen, self._hasher.digest(), self._where)
            return 0
        self._seen += n
        if self._seen > self._ref.size:  # the size check raises before the digest is known
            _check_blob(self._ref, self._seen, b"", self._where)
        self._hasher.update(data)
        view[:n] = data
        return n

    def close(self) -> None:
        """Close the underlying stream."""
        if not self.closed:
            with contextlib.suppress(Exception):
                self._raw.close()
        super().close()


def _check_blob(ref: PayloadRef, size: int, digest: bytes, where: dict[str, Any]) -> None:
    if size != ref.size:
        detail = (
            f"blob is larger than the {ref.size} bytes the chain records"
            if size > ref.size
            else f"blob has {size} bytes, the chain records {ref.size}"
        )
        raise BlobCorrupted(ref.key, detail, **where)
    if digest != ref.digest:
        raise BlobCorrupted(
            ref.key,
            f"blake3 digest of the blob is {digest.hex()}, the chain records {ref.digest.hex()}",
            **where,
        )


class BaseBlobStore:
    """Shared logic of the blob stores: spill, attach, digest checks. Subclasses implement
    the methods that raise :class:`NotImplementedError` below, and :meth:`close`."""

    url: str = ""

    @property
    def location(self) -> str:
        """Where the blobs live, as recorded in the store's identity and compared on
        open (no credentials, no transport options)."""
        return self.url

    def spill(self, prepared: PreparedEvent, threshold: int) -> PreparedEvent:
        """Write the payload to the blob store when it is larger than ``threshold`` (called
        before the backend append, so the blob exists before the event that references it
        commits).

        Raises:
            StoreUnavailable: the blob could not be written; nothing is appended.
        """
        if (
            prepared.payload_ref is not None
            or prepared.payload_bytes is None
            or prepared.size <= threshold
        ):
            return prepared
        ref = self.put(prepared.payload_bytes, digest=prepared.digest)
        return dataclasses.replace(prepared, payload_bytes=None, payload_ref=ref)

    def attach(self, event: RecordedEvent) -> RecordedEvent:
        """Return ``event`` with a loader, so ``event.payload_bytes`` fetches the blob on
        first access and checks its digest (nothing is fetched here)."""
        if event.payload_ref is None or event.payload_loaded:
            return event
        return event._with_loader(
            functools.partial(self.get, stream_id=event.stream_id, version=event.version)
        )

    def put(self, data: bytes, *, digest: bytes | None = None) -> PayloadRef:
        """Store ``data`` (canonical payload bytes) under its blake3 digest (once: an
        existing blob is kept); ``digest`` when the caller has it already.

        Raises:
            StoreUnavailable: the blob could not be written.
        """
        digest = digest_of(data) if digest is None else digest
        key = digest.hex()
        self._write(key, data)
        return PayloadRef(key, len(data), digest)

    def put_stream(self, stream: BinaryIO) -> PayloadRef:
        """Store everything read from ``stream`` (hashed as it is read).

        Raises:
            StoreUnavailable: the blob could not be written.
        """
        raise NotImplementedError

    def get(
        self, ref: PayloadRef, *, stream_id: str | None = None, version: int | None = None
    ) -> bytes:
        """Fetch the blob of ``ref`` and check its size and digest.

        Raises:
            BlobMissing: no blob under ``ref.key``.
            BlobCorrupted: the blob's size or digest differs from ``ref``.
            StoreUnavailable: the blob store cannot be reached.
        """
        key = check_key(ref.key)
        data = self._read_all(key, ref.size, stream_id, version)
        _check_blob(ref, len(data), digest_of(data), {"stream_id": stream_id, "version": version})
        logger.debug("fetched blob %s (%d bytes)", key, ref.size)
        return data

    def open(
        self, ref: PayloadRef, *, stream_id: str | None = None, version: int | None = None
    ) -> BlobReader:
        """A streaming reader of the blob of ``ref`` (constant memory), which checks the
        size and digest at the end: read to the end before trusting the bytes.

        Raises:
            BlobMissing: no blob under ``ref.key``.
            StoreUnavailable: the blob store cannot be reached.
        """
        key = check_key(ref.key)
        return BlobReader(
            self._open_raw(key, stream_id, version), ref, stream_id=stream_id, version=version
        )

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of blob ``key`` from ``offset`` (for archive segments, whose
        blocks carry their own digests; nothing is checked here).

        Raises:
            BlobMissing: no blob under ``key``.
            StoreUnavailable: the blob store cannot be reached.
        """
        with self._open_raw(check_key(key), None, None) as f:
            if offset:
                f.read(offset)  # a generic body cannot seek; the backends override this
            data: bytes = f.read(length)
        return data

    def verify(self, ref: PayloadRef) -> None:
        """Stream the blob of ``ref`` and check its size and digest (constant memory).

        Raises:
            BlobMissing: no blob under ``ref.key``.
            BlobCorrupted: the blob's size or digest differs from ``ref``.
            StoreUnavailable: the blob store cannot be reached.
        """
        buf = bytearray(CHUNK_SIZE)
        with self.open(ref) as reader:
            while reader.readinto(buf):
                pass

    def list_keys(self) -> Iterator[str]:
        """Every stored blob key."""
        return (b.key for b in self.list_blobs())

    def __iter__(self) -> Iterator[BlobInfo]:
        return self.list_blobs()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _write(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _open_raw(self, key: str, stream_id: str | None, version: int | None) -> Any:
        raise NotImplementedError

    def _read_all(self, key: str, size: int, stream_id: str | None, version: int | None) -> bytes:
        """The blob's bytes, at most ``size + 1`` of them (enough to see it is too long)."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        """True when a blob is stored under ``key``.

        Raises:
            StoreUnavailable: the blob store cannot be reached.
        """
        raise NotImplementedError

    def list_blobs(self) -> Iterator[BlobInfo]:
        """Every stored blob with its size and modification time.

        Raises:
            StoreUnavailable: the blob store cannot be reached.
        """
        raise NotImplementedError

    def delete(self, key: str, *, if_older_than: datetime | None = None) -> bool:
        """Delete the blob ``key``; with ``if_older_than``, only if it was last modified
        before then (checked again right before deleting: how :func:`gc_blobs` stays safe
        while appends refresh blobs they reuse). True when a blob was deleted.

        Raises:
            StoreUnavailable: the blob store cannot be reached.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release connections. Idempotent."""

    def claim(self, token: str | None, *, write: bool = True) -> None:
        """Make this location the blob location of the store whose owner token is
        ``token``: read the :data:`OWNER_MARKER` and, when there is none and ``write``,
        create it holding ``token`` (atomically: of stores claiming at once, one wins).
        ``write=False`` only checks (a dry run; ``token`` None: the store has none yet).

        Raises:
            ConfigError: the marker names another owner (the message names the location,
                never a secret, and nothing was written).
            StoreUnavailable: the location cannot be read or written.
        """
        owner = self._read_owner()
        if owner is None and write and token is not None:
            owner = self._write_owner(token)
            logger.info("blob store %s: claimed for its store (%s)", self.location, OWNER_MARKER)
        if owner is not None and owner != token:
            raise ConfigError(
                f"the blob location {self.location} belongs to another store (its "
                f"{OWNER_MARKER} names another owner): each store needs its own blob folder "
                "or S3 prefix, or gc-blobs and erase of one delete the other's blobs; open "
                "this store with blobs= a location of its own"
            )

    def _read_owner(self) -> str | None:
        """The owner token in the marker, None when there is no marker."""
        raise NotImplementedError

    def _write_owner(self, token: str) -> str:
        """Create the marker holding ``token`` unless one exists; the token it holds now."""
        raise NotImplementedError


def check_blob_params(url: StoreURL, allowed: tuple[str, ...]) -> dict[str, str]:
    """The URL's query parameters. The message names unknown ones (as
    :meth:`StoreURL.unknown_params` shows them) but never repeats a value or the query
    string (someone may have put a secret there).

    Raises:
        ConfigError: a parameter not in ``allowed``; lists the valid ones.
    """
    params = url.params
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        where = f"{url.scheme}://{url.host or ''}{url.path}"
        raise ConfigError(
            f"{url.unknown_params(unknown)} in blob URL {where}; "
            f"valid: {', '.join(sorted(allowed)) or 'none'}"
        )
    return params
