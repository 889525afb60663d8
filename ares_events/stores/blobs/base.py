"""Content-addressed blob stores for spilled payloads, and blob garbage collection.

A payload whose canonical JSON is larger than the store's ``spill_threshold`` is written
to a blob store *before* its event commits; the event keeps a
:class:`~ares_events.core.events.PayloadRef` (key, size, digest). The chain commits to the
digest (format v1), so verifying a chain never fetches a blob; reading the payload
fetches it lazily and checks the digest.

Blob stores are chosen by URL (:func:`open_blobs`):

``file:///abs/dir``
    :class:`FileBlobStore`: one file per blob under ``ab/cd/<hex>`` (the first two
    byte pairs of the key as directories). Only absolute paths: ``file://rel/dir`` names
    a *host* in URL syntax and is refused. Use ``FileBlobStore(path)`` for a relative
    folder from Python.
``s3://bucket/prefix?endpoint_url=http://...&region=...``
    :class:`~ares_events.stores.blobs.s3.S3BlobStore` through boto3 (credentials from boto3's
    normal chain only; a URL with a user or password is refused).

The key of a blob is the hex blake3 digest of the payload's canonical bytes, so equal
payloads are stored once; a write of a key that already exists only refreshes its
modification time (which keeps it safe from a concurrent :func:`gc_blobs`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, Self, runtime_checkable

import blake3

from ares_events.core.events import PayloadRef, PreparedEvent, RecordedEvent
from ares_events.core.recorder import StoreURL
from ares_events.errors import (
    BlobCorrupted,
    BlobMissing,
    ConfigError,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = [
    "BaseBlobStore",
    "BlobInfo",
    "BlobReader",
    "BlobStore",
    "FileBlobStore",
    "GcReport",
    "gc_blobs",
    "open_blobs",
    "parse_duration",
]

CHUNK_SIZE = 1024 * 1024
"""Bytes read per step when streaming a blob (verify, put_stream)."""

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


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """One stored blob: its key, stored size and last modification time (UTC)."""

    key: str
    size: int
    modified: datetime


@runtime_checkable
class BlobStore(Protocol):
    """What :class:`~ares_events.core.store.EventStore` and the tools need from a blob store."""

    url: str
    """The blob store's URL (never holds a secret; safe to log)."""

    def spill(self, prepared: PreparedEvent, threshold: int) -> PreparedEvent:
        """Move a payload larger than ``threshold`` bytes to the store."""
        ...

    def attach(self, event: RecordedEvent) -> RecordedEvent:
        """Return ``event`` able to fetch its spilled payload lazily."""
        ...

    def put(self, data: bytes, *, digest: bytes | None = None) -> PayloadRef:
        """Store ``data`` under its digest."""
        ...

    def put_stream(self, stream: BinaryIO) -> PayloadRef:
        """Store everything read from ``stream`` under its digest."""
        ...

    def get(
        self, ref: PayloadRef, *, stream_id: str | None = None, version: int | None = None
    ) -> bytes:
        """Fetch a blob and check it against ``ref``."""
        ...

    def open(
        self, ref: PayloadRef, *, stream_id: str | None = None, version: int | None = None
    ) -> BlobReader:
        """A streaming reader that checks ``ref`` when it reaches the end."""
        ...

    def verify(self, ref: PayloadRef) -> None:
        """Stream a blob and check its size and digest."""
        ...

    def exists(self, key: str) -> bool:
        """True when a blob is stored under ``key``."""
        ...

    def list_blobs(self) -> Iterator[BlobInfo]:
        """Every stored blob with its size and modification time."""
        ...

    def delete(self, key: str, *, if_older_than: datetime | None = None) -> bool:
        """Delete a blob; True when it was deleted."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


class BlobReader(io.RawIOBase):
    """A read-only stream over a blob that checks its size and digest as it goes.

    Reading past the size in the ``PayloadRef`` or reaching the end with another size or
    digest raises :class:`BlobCorrupted`; nothing unverified is ever returned as the last
    chunk. Memory use is constant (one read buffer).
    """

    def __init__(
        self,
        raw: Any,
        ref: PayloadRef,
        *,
        stream_id: str | None = None,
        version: int | None = None,
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
        want = min(len(view), self._ref.size + 1 - self._seen)
        if want <= 0:
            want = 1
        data = self._raw.read(want)
        n = len(data)
        if n == 0:
            self._finish()
            return 0
        self._seen += n
        if self._seen > self._ref.size:
            raise BlobCorrupted(
                self._ref.key,
                f"blob is larger than the {self._ref.size} bytes the chain records",
                **self._where,
            )
        self._hasher.update(data)
        view[:n] = data
        return n

    def _finish(self) -> None:
        self._done = True
        ref = self._ref
        if self._seen != ref.size:
            raise BlobCorrupted(
                ref.key,
                f"blob has {self._seen} bytes, the chain records {ref.size}",
                **self._where,
            )
        got = self._hasher.digest()
        if got != ref.digest:
            raise BlobCorrupted(
                ref.key,
                f"blake3 digest of the blob is {got.hex()}, the chain records {ref.digest.hex()}",
                **self._where,
            )

    def close(self) -> None:
        """Close the underlying stream."""
        if not self.closed:
            with contextlib.suppress(Exception):
                self._raw.close()
        super().close()

    def __enter__(self) -> BlobReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class BaseBlobStore:
    """Shared logic of the blob stores: spill, attach, digest checks.

    Subclasses implement :meth:`_write` (store bytes under a key unless present),
    :meth:`_open_raw`, :meth:`_read_all`, :meth:`put_stream`, :meth:`exists`,
    :meth:`list_blobs`, :meth:`delete` and :meth:`close`.
    """

    url: str = ""

    # -- core hooks ------------------------------------------------------------------

    def spill(self, prepared: PreparedEvent, threshold: int) -> PreparedEvent:
        """Write the payload to the blob store when it is larger than ``threshold``.

        A payload of exactly ``threshold`` bytes stays inline. Called by
        :meth:`EventStore.append` before the backend append, so the blob exists before
        the event that references it commits.

        Returns:
            ``prepared`` unchanged, or a copy with ``payload_bytes=None`` and a
            ``payload_ref``.

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

    # -- public API --------------------------------------------------------------------

    def put(self, data: bytes, *, digest: bytes | None = None) -> PayloadRef:
        """Store ``data`` under its blake3 digest (once: an existing blob is kept).

        Args:
            data: the canonical payload bytes.
            digest: blake3 of ``data`` when the caller has it already.

        Returns:
            The reference to record in the event.

        Raises:
            StoreUnavailable: the blob could not be written.
        """
        if digest is None:
            digest = digest_of(data)
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
        if len(data) != ref.size:
            detail = (
                f"blob is larger than the {ref.size} bytes the chain records"
                if len(data) > ref.size
                else f"blob has {len(data)} bytes, the chain records {ref.size}"
            )
            raise BlobCorrupted(key, detail, stream_id=stream_id, version=version)
        got = digest_of(data)
        if got != ref.digest:
            raise BlobCorrupted(
                key,
                f"blake3 digest of the blob is {got.hex()}, the chain records {ref.digest.hex()}",
                stream_id=stream_id,
                version=version,
            )
        logger.debug("fetched blob %s (%d bytes)", key, ref.size)
        return data

    def open(
        self, ref: PayloadRef, *, stream_id: str | None = None, version: int | None = None
    ) -> BlobReader:
        """A streaming reader of the blob of ``ref`` (constant memory).

        The size and digest are checked as the end is reached; read to the end before
        trusting the bytes.

        Raises:
            BlobMissing: no blob under ``ref.key``.
            StoreUnavailable: the blob store cannot be reached.
        """
        key = check_key(ref.key)
        return BlobReader(
            self._open_raw(key, stream_id, version), ref, stream_id=stream_id, version=version
        )

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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- to implement ------------------------------------------------------------------

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
        """Delete the blob ``key``.

        Args:
            key: the blob key.
            if_older_than: delete only if the blob was last modified before this time
                (checked again right before deleting; how :func:`gc_blobs` stays safe
                while appends refresh blobs they reuse).

        Returns:
            True when a blob was deleted.

        Raises:
            StoreUnavailable: the blob store cannot be reached.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release connections. Idempotent."""


# -- local folder ----------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mtime(st: os.stat_result) -> datetime:
    return datetime.fromtimestamp(st.st_mtime, UTC)


class FileBlobStore(BaseBlobStore):
    """Blobs as files in a local folder: ``<root>/ab/cd/<64 hex>``.

    Writes are atomic and durable: a temp file in the target directory, ``fsync``,
    ``rename`` over the final name, ``fsync`` of the directory. A crash leaves either
    no blob or the whole blob (and perhaps a ``.tmp-*`` file, which :func:`gc_blobs`
    removes once it is older than the grace period).
    """

    def __init__(self, root: str | os.PathLike[str], *, url: str | None = None) -> None:
        """Open (and create) the folder ``root``.

        Raises:
            StoreUnavailable: the folder cannot be created.
        """
        self.root = Path(root).absolute()
        self.url = url or self.root.as_uri()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(
                f"blob folder {self.root} cannot be created: {exc.strerror}"
            ) from exc
        logger.info("opened blob store %s", self.url)

    @classmethod
    def from_url(cls, url: StoreURL) -> FileBlobStore:
        """Open ``file:///abs/dir`` (host empty or ``localhost``; no query parameters).

        Raises:
            ConfigError: a host other than localhost (``file://rel/dir``), no path, or
                query parameters.
            StoreUnavailable: the folder cannot be created.
        """
        check_blob_params(url, ())
        if url.username or url.password is not None or url.host not in (None, "", "localhost"):
            raise ConfigError(
                f"blob URL {url.redacted()} names a host; use file:///absolute/path "
                "(three slashes; relative folders are not accepted in URLs)"
            )
        if not url.path or not url.path.startswith("/") or url.path == "/":
            raise ConfigError(f"blob URL {url.redacted()} needs an absolute folder path")
        return cls(url.path, url=url.redacted())

    # -- layout ------------------------------------------------------------------------

    def path_for(self, key: str) -> Path:
        """Where the blob ``key`` lives."""
        key = check_key(key)
        return self.root / key[:2] / key[2:4] / key

    # -- writes ------------------------------------------------------------------------

    def _write(self, key: str, data: bytes) -> None:
        path = self.path_for(key)
        if self._touch_existing(path, len(data)):
            logger.debug("blob %s already stored; refreshed its mtime", key)
            return
        try:
            self._ensure_dir(path.parent)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_dir(path.parent)
        except OSError as exc:
            raise StoreUnavailable(
                f"blob store {self.url}: cannot write blob {key}: {exc.strerror or exc}"
            ) from exc
        logger.debug("wrote blob %s (%d bytes)", key, len(data))

    def _touch_existing(self, path: Path, size: int) -> bool:
        """Refresh an existing blob of the right size; False when it must be written.

        Refreshing the mtime matters: :func:`gc_blobs` may have listed this blob as an
        old orphan; a fresh mtime makes it skip the blob (see :meth:`delete`).
        """
        try:
            st = os.stat(path)
            if st.st_size != size:
                logger.warning("blob %s has the wrong size %d; rewriting it", path.name, size)
                return False
            os.utime(path)
        except (FileNotFoundError, NotADirectoryError):
            return False  # not there (the write reports any problem with the folder)
        except OSError as exc:
            raise StoreUnavailable(
                f"blob store {self.url}: cannot stat blob {path.name}: {exc.strerror}"
            ) from exc
        return True

    def _ensure_dir(self, d: Path) -> None:
        if d.is_dir():
            return
        d.mkdir(parents=True, exist_ok=True)
        # New directory entries are durable only once their parents are synced.
        _fsync_dir(d.parent)
        _fsync_dir(self.root)

    def put_stream(self, stream: BinaryIO) -> PayloadRef:
        """Store everything read from ``stream``; it is hashed while it is written to a
        temp file in the folder, then renamed into place.

        Raises:
            StoreUnavailable: the blob could not be written.
        """
        hasher = blake3.blake3()
        size = 0
        tmp_dir = self.root / ".tmp"
        try:
            tmp_dir.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=tmp_dir)
            try:
                with os.fdopen(fd, "wb") as f:
                    while chunk := stream.read(CHUNK_SIZE):
                        hasher.update(chunk)
                        size += len(chunk)
                        f.write(chunk)
                    f.flush()
                    os.fsync(f.fileno())
                digest = hasher.digest()
                key = digest.hex()
                path = self.path_for(key)
                if self._touch_existing(path, size):
                    os.unlink(tmp)
                else:
                    self._ensure_dir(path.parent)
                    os.replace(tmp, path)
                    _fsync_dir(path.parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise StoreUnavailable(
                f"blob store {self.url}: cannot write a blob: {exc.strerror or exc}"
            ) from exc
        return PayloadRef(key, size, digest)

    # -- reads -------------------------------------------------------------------------

    def _open_path(self, key: str, stream_id: str | None, version: int | None) -> BinaryIO:
        path = self.path_for(key)
        try:
            return open(path, "rb")  # the caller closes it
        except FileNotFoundError:
            raise BlobMissing(
                key, f"no file {path}", stream_id=stream_id, version=version
            ) from None
        except OSError as exc:
            raise StoreUnavailable(
                f"blob store {self.url}: cannot open blob {key}: {exc.strerror}"
            ) from exc

    def _open_raw(self, key: str, stream_id: str | None, version: int | None) -> Any:
        return self._open_path(key, stream_id, version)

    def _read_all(self, key: str, size: int, stream_id: str | None, version: int | None) -> bytes:
        with self._open_path(key, stream_id, version) as f:
            try:
                return f.read(size + 1)
            except OSError as exc:
                raise StoreUnavailable(
                    f"blob store {self.url}: cannot read blob {key}: {exc.strerror}"
                ) from exc

    def exists(self, key: str) -> bool:
        """True when the file of ``key`` exists."""
        return self.path_for(key).is_file()

    def list_blobs(self) -> Iterator[BlobInfo]:
        """Every blob file (temp files and foreign files are skipped).

        Raises:
            StoreUnavailable: the folder cannot be read.
        """
        try:
            for d1 in sorted(os.scandir(self.root), key=lambda e: e.name):
                if len(d1.name) != 2 or not d1.is_dir():
                    continue
                for d2 in sorted(os.scandir(d1.path), key=lambda e: e.name):
                    if len(d2.name) != 2 or not d2.is_dir():
                        continue
                    prefix = d1.name + d2.name
                    for f in os.scandir(d2.path):
                        name = f.name
                        if not (_KEY_RE.fullmatch(name) and name.startswith(prefix)):
                            continue
                        try:
                            st = f.stat()
                        except FileNotFoundError:
                            continue  # deleted while listing
                        yield BlobInfo(name, st.st_size, _mtime(st))
        except OSError as exc:
            raise StoreUnavailable(
                f"blob store {self.url}: cannot list blobs: {exc.strerror}"
            ) from exc

    def delete(self, key: str, *, if_older_than: datetime | None = None) -> bool:
        """Delete the blob file ``key``.

        With ``if_older_than``, the file is first renamed to a tombstone, then its mtime
        is read: an append that refreshed it before the rename is seen (the file is
        restored), and one after the rename finds no file and writes it again. So a
        blob that an append reuses is never lost.

        Raises:
            StoreUnavailable: the file cannot be removed.
        """
        path = self.path_for(key)
        try:
            if if_older_than is None:
                path.unlink()
                return True
            tomb = path.with_name(f".gc-{key}")
            os.rename(path, tomb)
            if _mtime(os.stat(tomb)) >= if_older_than:
                os.replace(tomb, path)  # refreshed by an append: keep (same content)
                return False
            tomb.unlink()
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreUnavailable(
                f"blob store {self.url}: cannot delete blob {key}: {exc.strerror}"
            ) from exc

    def restore_tombstone(self, tomb: Path, key: str) -> None:
        """Put back a blob a crashed :func:`gc_blobs` had renamed to ``.gc-<key>``."""
        path = self.path_for(key)
        with contextlib.suppress(FileNotFoundError):
            if path.exists():
                tomb.unlink()
            else:
                os.replace(tomb, path)
                logger.warning("restored blob %s left as a tombstone by an earlier gc", key)

    def stale_temp_files(self, cutoff: datetime) -> Iterator[Path]:
        """Leftover ``.tmp-*`` / ``.gc-*`` files (from crashes) last modified before
        ``cutoff``."""
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith((".tmp-", ".gc-")):
                    p = Path(dirpath) / name
                    with contextlib.suppress(FileNotFoundError):
                        if _mtime(p.stat()) < cutoff:
                            yield p


# -- URL dispatch ----------------------------------------------------------------------


def check_blob_params(url: StoreURL, allowed: tuple[str, ...]) -> dict[str, str]:
    """The URL's query parameters, refusing unknown ones.

    The message names the unknown parameters but never repeats a value or the query
    string (someone may have put a secret there).

    Raises:
        ConfigError: a parameter not in ``allowed``; lists the valid ones.
    """
    params = url.params
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        where = f"{url.scheme}://{url.host or ''}{url.path}"
        raise ConfigError(
            f"unknown parameter(s) {', '.join(unknown)} in blob URL {where}; "
            f"valid: {', '.join(sorted(allowed)) or 'none'}"
        )
    return params


def open_blobs(url: str) -> BaseBlobStore:
    """Open the blob store of ``url``.

    ``file:///abs/dir`` opens :class:`FileBlobStore`; ``s3://bucket/prefix?...`` opens
    :class:`~ares_events.stores.blobs.s3.S3BlobStore` (see its docs for the query parameters).

    Raises:
        ConfigError: unknown scheme, bad URL or unknown query parameter (the message
            never contains a secret).
        MissingDependencyError: ``s3://`` without boto3 installed.
        StoreUnavailable: the folder cannot be created.
    """
    parsed = StoreURL.parse(url, source="blob URL")
    if parsed.scheme == "file":
        return FileBlobStore.from_url(parsed)
    if parsed.scheme == "s3":
        from ares_events.stores.blobs.s3 import S3BlobStore

        return S3BlobStore.from_url(parsed)
    raise ConfigError(
        f"unknown blob URL scheme {parsed.scheme!r} in {parsed.redacted()}; "
        f"known: {', '.join(BLOB_SCHEMES)}"
    )


# -- garbage collection ----------------------------------------------------------------

_DURATION_RE = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """Parse ``"90s"``, ``"30m"``, ``"1h"``, ``"2d"``, ``"1w"`` or a sum like ``"1h30m"``.

    Raises:
        ConfigError: not of that form.
    """
    s = text.strip().lower() if isinstance(text, str) else ""
    parts = _DURATION_RE.findall(s)
    if not s or "".join(n + u for n, u in parts) != s:
        raise ConfigError(f"duration must look like 30s, 15m, 1h, 2d, 1w or 1h30m, got {text!r}")
    return timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in parts))


@dataclass(slots=True)
class GcReport:
    """What :func:`gc_blobs` found and deleted (or would delete, in a dry run)."""

    dry_run: bool
    older_than: timedelta
    cutoff: datetime
    events_scanned: int = 0
    referenced_keys: int = 0
    blobs_listed: int = 0
    kept_referenced: int = 0
    kept_young: int = 0
    deleted: list[str] = field(default_factory=list)
    """Keys deleted (in a dry run: keys that would be deleted)."""
    bytes_deleted: int = 0
    temp_files_deleted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "dry_run": self.dry_run,
            "older_than_seconds": self.older_than.total_seconds(),
            "cutoff": self.cutoff.isoformat(),
            "events_scanned": self.events_scanned,
            "referenced_keys": self.referenced_keys,
            "blobs_listed": self.blobs_listed,
            "kept_referenced": self.kept_referenced,
            "kept_young": self.kept_young,
            "deleted": list(self.deleted),
            "bytes_deleted": self.bytes_deleted,
            "temp_files_deleted": list(self.temp_files_deleted),
        }


def gc_blobs(
    store: EventStore,
    older_than: timedelta,
    dry_run: bool = False,
    *,
    now: datetime | None = None,
) -> GcReport:
    """Delete blobs no event references and that are older than ``older_than``.

    Order matters for safety while appends go on: the cutoff is fixed first, then every
    referenced key is collected by reading every stream (payload refs only, no blob is
    fetched), then the blobs are listed. A blob written by an append still in flight is
    younger than the cutoff and kept; a blob an append reuses gets a fresh mtime and is
    kept too (``delete`` re-checks the mtime). A referenced blob is never deleted.

    Args:
        store: an event store opened with ``blobs=``.
        older_than: grace period; must exceed the longest append (``1h`` is generous).
        dry_run: report what would be deleted, delete nothing.
        now: the current time (for tests); defaults to ``datetime.now(UTC)``.

    Returns:
        A :class:`GcReport`.

    Raises:
        ConfigError: the store has no blob store, or ``older_than`` is negative.
        StoreUnavailable: the store or the blob store cannot be reached.
    """
    blobs = store.blobs
    if blobs is None:
        raise ConfigError("gc-blobs needs a blob store: open the store with blobs=URL")
    if older_than < timedelta(0):
        raise ConfigError(f"older_than must not be negative, got {older_than}")
    cutoff = (now or datetime.now(UTC)) - older_than
    report = GcReport(dry_run=dry_run, older_than=older_than, cutoff=cutoff)
    referenced: set[str] = set()
    # Per-stream reads, not read_all: a backend's read_all may hold back committed events
    # (PostgreSQL hides rows above the oldest running write transaction), and a blob
    # referenced only by a hidden event must never look like an orphan.
    for stream_id, _version in list(store.streams()):
        for e in store.read(stream_id):
            report.events_scanned += 1
            ref = e.payload_ref
            if ref is not None:
                referenced.add(ref.key)
    report.referenced_keys = len(referenced)
    for info in list(blobs.list_blobs()):
        report.blobs_listed += 1
        if info.key in referenced:
            report.kept_referenced += 1
        elif info.modified >= cutoff:
            report.kept_young += 1
        elif dry_run or blobs.delete(info.key, if_older_than=cutoff):
            report.deleted.append(info.key)
            report.bytes_deleted += info.size
        else:
            report.kept_young += 1  # refreshed by an append since it was listed
    if isinstance(blobs, FileBlobStore):
        for p in list(blobs.stale_temp_files(cutoff)):
            key = p.name[4:] if p.name.startswith(".gc-") else ""
            if key in referenced:
                # A gc that crashed between its rename and its unlink: put it back.
                if not dry_run:
                    blobs.restore_tombstone(p, key)
                continue
            report.temp_files_deleted.append(str(p.relative_to(blobs.root)))
            if not dry_run:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
    logger.info(
        "gc-blobs%s: %d listed, %d referenced, %d young, %d %s",
        " (dry run)" if dry_run else "",
        report.blobs_listed,
        report.kept_referenced,
        report.kept_young,
        len(report.deleted),
        "to delete" if dry_run else "deleted",
    )
    return report
