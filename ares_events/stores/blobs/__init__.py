"""Content-addressed blob stores for spilled payloads, and blob garbage collection.

What lives here: :mod:`~ares_events.stores.blobs.base` (keys, digests, ``BlobInfo``, the
``BlobStore`` protocol, ``BlobReader``, ``BaseBlobStore``, ``FileBlobStore``,
``open_blobs``, ``gc_blobs``) and :mod:`~ares_events.stores.blobs.s3` (``S3BlobStore``).

It may import the core's value types (:mod:`ares_events.core.events`,
:mod:`ares_events.core.recorder`) and :mod:`ares_events.errors`; the core's
``EventStore`` only for type checking.
"""

from __future__ import annotations

from ares_events.stores.blobs.base import (
    BLOB_SCHEMES,
    CHUNK_SIZE,
    BaseBlobStore,
    BlobInfo,
    BlobReader,
    BlobStore,
    FileBlobStore,
    GcReport,
    check_blob_params,
    check_key,
    digest_of,
    gc_blobs,
    open_blobs,
    parse_duration,
)

__all__ = [
    "BLOB_SCHEMES",
    "CHUNK_SIZE",
    "BaseBlobStore",
    "BlobInfo",
    "BlobReader",
    "BlobStore",
    "FileBlobStore",
    "GcReport",
    "check_blob_params",
    "check_key",
    "digest_of",
    "gc_blobs",
    "open_blobs",
    "parse_duration",
]
