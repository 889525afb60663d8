"""The blob store protocol: content-addressed storage for payloads over the spill threshold
(the built-in stores: :mod:`ares_events.stores.blobs`).

It may import the core's events.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO, Protocol, runtime_checkable

from ares_events.core.events import PayloadRef, PreparedEvent, RecordedEvent

__all__ = ["BlobInfo", "BlobStore"]


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """One stored blob: its key, stored size and last modification time (UTC)."""

    key: str
    size: int
    modified: datetime


@runtime_checkable
class BlobStore(Protocol):
    """What the event store and the tools need from a blob store (the built-in ones are
    in :mod:`ares_events.stores.blobs`)."""

    url: str
    """The blob store's URL (never holds a secret; safe to log)."""

    def spill(self, prepared: PreparedEvent, threshold: int) -> PreparedEvent:
        """Move a payload larger than ``threshold`` bytes to the store."""

    def attach(self, event: RecordedEvent) -> RecordedEvent:
        """Return ``event`` able to fetch its spilled payload lazily."""

    def put(self, data: bytes, *, digest: bytes | None = None) -> PayloadRef:
        """Store ``data`` under its digest."""

    def put_stream(self, stream: BinaryIO) -> PayloadRef:
        """Store everything read from ``stream`` under its digest."""

    def get(
        self, ref: PayloadRef, *, stream_id: str | None = None, version: int | None = None
    ) -> bytes:
        """Fetch a blob and check it against ``ref``."""

    def open(
        self, ref: PayloadRef, *, stream_id: str | None = None, version: int | None = None
    ) -> io.RawIOBase:
        """A streaming reader that checks ``ref`` when it reaches the end."""

    def verify(self, ref: PayloadRef) -> None:
        """Stream a blob and check its size and digest."""

    def exists(self, key: str) -> bool:
        """True when a blob is stored under ``key``."""

    def list_blobs(self) -> Iterator[BlobInfo]:
        """Every stored blob with its size and modification time."""

    def delete(self, key: str, *, if_older_than: datetime | None = None) -> bool:
        """Delete a blob; True when it was deleted."""

    def claim(self, token: str | None, *, write: bool = True) -> None:
        """Make the location the store's whose owner token is ``token`` (ConfigError when
        another store's is)."""

    def close(self) -> None:
        """Release connections. Idempotent."""
