"""Content-addressed blob stores for spilled payloads (docs/blobs.md): :func:`open_blobs`
picks :mod:`.file` or :mod:`.s3` by URL; :mod:`.base` holds what they share, :mod:`.gc`
the garbage collection.

It may import the core's value types (:mod:`ares_events.core.events`,
:mod:`ares_events.core.recorder`) and :mod:`ares_events.errors`; never the core's
``EventStore`` except for type checking.
"""

from __future__ import annotations

from ares_events.core.url import StoreURL
from ares_events.errors import ConfigError
from ares_events.stores.blobs.base import (
    BLOB_SCHEMES,
    CHUNK_SIZE,
    BaseBlobStore,
    BlobInfo,
    BlobReader,
    BlobStore,
    check_blob_params,
    check_key,
    digest_of,
)
from ares_events.stores.blobs.file import FileBlobStore
from ares_events.stores.blobs.gc import GcReport, gc_blobs, parse_duration

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


def open_blobs(url: str, *, create: bool = True) -> BaseBlobStore:
    """Open the blob store of ``url``.

    ``file:///abs/dir`` opens :class:`FileBlobStore`; ``s3://bucket/prefix?...`` opens
    :class:`~ares_events.stores.blobs.s3.S3BlobStore` (see its docs for the query parameters).
    With ``create=False`` a missing folder is not created (it is created by the first
    blob written); reporting tools open blob stores that way.

    Raises:
        ConfigError: unknown scheme, bad URL or unknown query parameter (the message
            never contains a secret).
        MissingDependencyError: ``s3://`` without boto3 installed.
        StoreUnavailable: the folder cannot be created.
    """
    parsed = StoreURL.parse(url, source="blob URL")
    if parsed.scheme == "file":
        return FileBlobStore.from_url(parsed, create=create)
    if parsed.scheme == "s3":
        from ares_events.stores.blobs.s3 import S3BlobStore  # boto3 is optional

        return S3BlobStore.from_url(parsed)
    raise ConfigError(
        f"unknown blob URL scheme {parsed.scheme!r} in {parsed.redacted()}; "
        f"known: {', '.join(BLOB_SCHEMES)}"
    )
