"""Blobs as files in a local folder (``file:///abs/dir``): :class:`FileBlobStore`.

It may import :mod:`ares_events.stores.blobs.base`, the core's value types and
:mod:`ares_events.errors`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Final

from ares_events.core.events import PayloadRef
from ares_events.core.url import StoreURL
from ares_events.errors import BlobMissing, ConfigError, StoreUnavailable
from ares_events.stores.blobs.base import (
    _KEY_RE,
    OWNER_MARKER,
    BaseBlobStore,
    BlobInfo,
    check_blob_params,
    check_key,
    copy_hashing,
)

logger = logging.getLogger(__name__)

__all__ = ["FileBlobStore", "fsync_dir", "write_atomic"]


_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_OPEN_FLAGS: Final = os.O_RDONLY | _NONBLOCK | getattr(os, "O_CLOEXEC", 0)
"""How a blob's file is opened for reading (``O_NONBLOCK``: see ``_open_raw``)."""


def fsync_dir(path: Path) -> None:
    """``fsync`` the folder ``path`` (what makes a rename in it durable).

    Raises:
        OSError: the folder cannot be opened or synced.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stamp(file: int | Path) -> None:
    """Set the mtime from the precise clock: the kernel's own is a tick behind it, so a
    refresh just after an erasure began could read as before it (and its blob go)."""
    now = time.time_ns()
    os.utime(file, ns=(now, now))


def write_atomic(path: Path, data: bytes, *, prefix: str = ".tmp-") -> None:
    """Write ``data`` to ``path`` whole or not at all: a temporary file ``prefix*`` in the
    same folder, ``fsync``, rename over ``path`` (the folder is not synced: :func:`fsync_dir`).

    Raises:
        OSError: the file cannot be written (the temporary file is removed).
    """
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            _stamp(f.fileno())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _mtime(st: os.stat_result) -> datetime:
    return datetime.fromtimestamp(st.st_mtime, UTC)


class FileBlobStore(BaseBlobStore):
    """Blobs as files in a local folder: ``<root>/ab/cd/<64 hex>``, written atomically and
    durably (temp file, ``fsync``, rename, ``fsync`` of the folder)."""

    def __init__(
        self, root: str | os.PathLike[str], *, url: str | None = None, create: bool = True
    ) -> None:
        """Open the folder ``root`` (creating it unless ``create=False``; the first blob
        written creates it then).

        Raises:
            StoreUnavailable: the folder cannot be created.
        """
        self.root = Path(root).absolute()
        self.url = url or self.root.as_uri()
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreUnavailable(
                    f"blob folder {self.root} cannot be created: {exc.strerror}"
                ) from exc
        logger.info("opened blob store %s", self.url)

    @property
    def location(self) -> str:
        """The folder as an absolute ``file://`` URL."""
        return self.root.resolve().as_uri()

    @classmethod
    def from_url(cls, url: StoreURL, *, create: bool = True) -> FileBlobStore:
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
        if not url.path.startswith("/") or url.path == "/":
            raise ConfigError(f"blob URL {url.redacted()} needs an absolute folder path")
        return cls(url.path, url=url.redacted(), create=create)

    def _unavailable(self, what: str, exc: OSError) -> StoreUnavailable:
        return StoreUnavailable(f"blob store {self.url}: {what}: {exc.strerror or exc}")

    def path_for(self, key: str) -> Path:
        """Where the blob ``key`` lives."""
        key = check_key(key)
        return self.root / key[:2] / key[2:4] / key

    def _write(self, key: str, data: bytes) -> None:
        path = self.path_for(key)
        if self._touch_existing(path, len(data)):
            logger.debug("blob %s already stored; refreshed its mtime", key)
            return
        try:
            self._ensure_dir(path.parent)
            write_atomic(path, data)
            fsync_dir(path.parent)
        except OSError as exc:
            raise self._unavailable(f"cannot write blob {key}", exc) from exc
        logger.debug("wrote blob %s (%d bytes)", key, len(data))

    def _touch_existing(self, path: Path, size: int) -> bool:
        """Refresh an existing blob of the right size (a running gc keeps it); False when
        it must be written."""
        try:
            st = os.stat(path)
            if st.st_size != size:
                logger.warning("blob %s has the wrong size %d; rewriting it", path.name, size)
                return False
            _stamp(path)
        except (FileNotFoundError, NotADirectoryError):
            return False  # not there (the write reports any problem with the folder)
        except OSError as exc:
            raise self._unavailable(f"cannot stat blob {path.name}", exc) from exc
        return True

    def _ensure_dir(self, d: Path) -> None:
        if d.is_dir():
            return
        d.mkdir(parents=True, exist_ok=True)
        # New directory entries are durable only once their parents are synced.
        fsync_dir(d.parent)
        fsync_dir(self.root)

    def put_stream(self, stream: BinaryIO) -> PayloadRef:
        """Store everything read from ``stream``; it is hashed while it is written to a
        temp file in the folder, then renamed into place.

        Raises:
            StoreUnavailable: the blob could not be written.
        """
        tmp_dir = self.root / ".tmp"
        try:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=tmp_dir)
            try:
                with os.fdopen(fd, "wb") as f:
                    size, digest = copy_hashing(stream, f)
                    f.flush()
                    os.fsync(f.fileno())
                key = digest.hex()
                path = self.path_for(key)
                if self._touch_existing(path, size):
                    os.unlink(tmp)
                else:
                    self._ensure_dir(path.parent)
                    os.replace(tmp, path)
                    fsync_dir(path.parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise self._unavailable("cannot write a blob", exc) from exc
        return PayloadRef(key, size, digest)

    def _open_raw(self, key: str, stream_id: str | None, version: int | None) -> BinaryIO:
        """The blob's file, open for reading; BlobMissing unless it is a regular file."""
        path = self.path_for(key)
        where: dict[str, Any] = {"stream_id": stream_id, "version": version}
        try:
            # Non-blocking: a FIFO in the blob's place would make a plain open wait for a
            # writer forever. Symlinks are followed (one to a copy of the blob reads fine).
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            raise BlobMissing(key, f"no file {path}", **where) from None
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket or a device without its driver
                raise BlobMissing(key, f"{path} is not a regular file", **where) from None
            raise self._unavailable(f"cannot open blob {key}", exc) from exc
        try:
            mode = os.fstat(fd).st_mode  # of what was opened: no swap after a check
            if not stat.S_ISREG(mode):
                raise BlobMissing(key, f"{path} is not a regular file", **where)
            if _NONBLOCK:
                os.set_blocking(fd, True)  # reads of the regular file as usual
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def _read_all(self, key: str, size: int, stream_id: str | None, version: int | None) -> bytes:
        with self._open_raw(key, stream_id, version) as f:
            try:
                return f.read(size + 1)
            except OSError as exc:
                raise self._unavailable(f"cannot read blob {key}", exc) from exc

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of blob ``key`` from ``offset`` (one seek and one read)."""
        with self._open_raw(check_key(key), None, None) as f:
            try:
                f.seek(offset)
                return f.read(length)
            except OSError as exc:
                raise self._unavailable(f"cannot read blob {key}", exc) from exc

    def exists(self, key: str) -> bool:
        """True when the file of ``key`` exists."""
        return self.path_for(key).is_file()

    def list_blobs(self) -> Iterator[BlobInfo]:
        """Every blob file (temp files and foreign files are skipped).

        Raises:
            StoreUnavailable: the folder cannot be read.
        """
        if not self.root.is_dir():
            return  # opened with create=False and nothing written yet
        try:
            for d1 in sorted(os.scandir(self.root), key=lambda e: e.name):
                if len(d1.name) != 2 or not d1.is_dir():
                    continue
                for d2 in sorted(os.scandir(d1.path), key=lambda e: e.name):
                    if len(d2.name) != 2 or not d2.is_dir():
                        continue
                    prefix = d1.name + d2.name
                    for f in os.scandir(d2.path):
                        if not (_KEY_RE.fullmatch(f.name) and f.name.startswith(prefix)):
                            continue
                        try:
                            st = f.stat()
                        except FileNotFoundError:
                            continue  # deleted while listing
                        yield BlobInfo(f.name, st.st_size, _mtime(st))
        except OSError as exc:
            raise self._unavailable("cannot list blobs", exc) from exc

    def delete(self, key: str, *, if_older_than: datetime | None = None) -> bool:
        """Delete the blob file ``key``; with ``if_older_than``, through a tombstone, so a
        blob an append reuses is never lost (docs/blobs.md).

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
            raise self._unavailable(f"cannot delete blob {key}", exc) from exc

    def _read_owner(self) -> str | None:
        try:
            return (self.root / OWNER_MARKER).read_bytes()[:100].decode("ascii", "replace").strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._unavailable(f"cannot read {OWNER_MARKER}", exc) from exc

    def _write_owner(self, token: str) -> str:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.root)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(token.encode())
                    f.flush()
                    os.fsync(f.fileno())
                # link(2), unlike a rename, fails when the marker exists (another store
                # claimed first), and a marker never shows half written.
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, self.root / OWNER_MARKER)
            finally:
                os.unlink(tmp)
            fsync_dir(self.root)
        except OSError as exc:
            raise self._unavailable(f"cannot write {OWNER_MARKER}", exc) from exc
        return self._read_owner() or ""

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
