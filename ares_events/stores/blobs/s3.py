"""Blobs in S3-compatible object storage, through boto3 (``s3://bucket/prefix?...``;
docs/blobs.md)."""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO

from ares_events.core.events import PayloadRef
from ares_events.core.url import StoreURL
from ares_events.errors import (
    BlobMissing,
    ConfigError,
    MissingDependencyError,
    StoreClosed,
    StoreUnavailable,
)
from ares_events.stores.blobs.base import (
    _KEY_RE,
    OWNER_MARKER,
    BaseBlobStore,
    BlobInfo,
    check_blob_params,
    check_key,
    copy_hashing,
)

try:
    import boto3
    import boto3.exceptions
    import boto3.s3.transfer
    import botocore.config
    import botocore.exceptions
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    _IMPORT_ERROR: ImportError | None = _exc
else:
    _IMPORT_ERROR = None

logger = logging.getLogger(__name__)

__all__ = ["S3BlobStore"]

PARAMS = (
    "addressing_style",
    "connect_timeout",
    "endpoint_url",
    "max_attempts",
    "read_timeout",
    "region",
)
MULTIPART_SIZE = 8 * 1024 * 1024
"""Multipart threshold and part size; blobs at least this big download in parallel."""
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_LAST_MODIFIED_RESOLUTION = timedelta(seconds=1)
"""S3 keeps LastModified to the second (truncated)."""
_TOUCHED = "ares-touched"
_TOUCHED_AT = "%Y%m%dT%H%M%S.%fZ"


def _modified(head: dict[str, Any]) -> datetime:
    """When the object was last written or refreshed: our metadata's precise time, else
    the latest time the truncated LastModified may stand for."""
    touched = (head.get("Metadata") or {}).get(_TOUCHED)
    if touched:
        with contextlib.suppress(ValueError):
            return datetime.strptime(touched, _TOUCHED_AT).replace(tzinfo=UTC)
    last: datetime = head["LastModified"]
    return last + _LAST_MODIFIED_RESOLUTION - timedelta(microseconds=1)


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _positive(params: dict[str, str], name: str, default: float, url: StoreURL) -> float:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise ConfigError(f"{name} in {url.redacted()} must be a positive number, got {raw!r}")
    return value


class S3BlobStore(BaseBlobStore):
    """Content-addressed blobs in an S3 bucket (or any S3-compatible server)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: str | None = None,
        max_attempts: int = 3,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        url: str | None = None,
    ) -> None:
        """Create the boto3 client (no request is made here).

        Raises:
            MissingDependencyError: boto3 is not installed.
        """
        if _IMPORT_ERROR is not None:
            raise MissingDependencyError("the s3:// blob store", "s3") from _IMPORT_ERROR
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._key_prefix = f"{self.prefix}/" if self.prefix else ""
        self.endpoint_url = endpoint_url
        self.url = url or f"s3://{bucket}/{self.prefix}"
        style = addressing_style or ("path" if endpoint_url else "auto")
        config = botocore.config.Config(
            region_name=region,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            s3={"addressing_style": style},
            # Our own blake3 digest checks every byte; CRC checksums would only cost CPU
            # and break older S3-compatible servers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            user_agent_extra="ares-events",
        )
        # A private session: credentials from boto3's chain, no shared global state.
        session = boto3.session.Session()
        self.client: Any = session.client("s3", endpoint_url=endpoint_url, config=config)
        self.transfer_config = boto3.s3.transfer.TransferConfig(
            multipart_threshold=MULTIPART_SIZE,
            multipart_chunksize=MULTIPART_SIZE,
            max_concurrency=4,
            use_threads=True,
        )
        self._closed = False
        logger.info("opened blob store %s", self.url)

    @property
    def location(self) -> str:
        """``s3://bucket/prefix``: the same blobs whatever endpoint or region reaches them."""
        return f"s3://{self.bucket}/{self.prefix}"

    @classmethod
    def from_url(cls, url: StoreURL) -> S3BlobStore:
        """Open ``s3://bucket/prefix?...`` (see the module docs for the parameters).

        Raises:
            ConfigError: a user or password in the URL (or in ``endpoint_url``), no
                bucket, an unknown parameter (lists the valid ones) or a bad value.
            MissingDependencyError: boto3 is not installed.
        """
        # A bucket takes no port: "key:2024" before it is a key and a password whose
        # unencoded '?' began the query (s3://key:2024?x=pw@bucket/p), refused unshown.
        if url.username or url.password is not None or url.port is not None:
            raise ConfigError(
                f"blob URL {url.redacted()} holds credentials or a port; S3 credentials come "
                "only from boto3's chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws, "
                "roles), an endpoint from endpoint_url="
            )
        params = check_blob_params(url, PARAMS)
        if not url.host:
            raise ConfigError(f"blob URL {url.redacted()} has no bucket: s3://bucket/prefix")
        endpoint = params.get("endpoint_url") or None
        if endpoint is not None:
            ep = StoreURL.parse(endpoint, source="endpoint_url")
            if ep.username or ep.password is not None:
                raise ConfigError(
                    f"endpoint_url in blob URL s3://{url.host}{url.path} holds credentials; "
                    "use boto3's credential chain instead"
                )
            if ep.scheme not in ("http", "https"):
                raise ConfigError(f"endpoint_url must be http(s)://..., got {ep.redacted()!r}")
        style = params.get("addressing_style")
        if style is not None and style not in ("path", "virtual", "auto"):
            raise ConfigError(
                f"addressing_style in {url.redacted()} must be path, virtual or auto, got {style!r}"
            )
        attempts = params.get("max_attempts", "3")
        if not attempts.isdigit() or int(attempts) < 1:
            raise ConfigError(
                f"max_attempts in {url.redacted()} must be an integer >= 1, got {attempts!r}"
            )
        return cls(
            url.host,
            url.path,
            endpoint_url=endpoint,
            region=params.get("region") or None,
            addressing_style=style,
            max_attempts=int(attempts),
            connect_timeout=_positive(params, "connect_timeout", 5.0, url),
            read_timeout=_positive(params, "read_timeout", 60.0, url),
            url=url.redacted(),
        )

    def object_key(self, key: str) -> str:
        """The S3 object key of blob ``key``."""
        return self._key_prefix + check_key(key)

    @contextlib.contextmanager
    def _errors(self, op: str, key: str | None = None, **where: Any) -> Iterator[None]:
        if self._closed:
            raise StoreClosed(self.url, f"{op} of blob {key}" if key else op)
        try:
            yield
        except botocore.exceptions.ClientError as exc:
            code = _code(exc)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _NOT_FOUND and key is not None:
                raise BlobMissing(
                    key, f"no object s3://{self.bucket}/{self.object_key(key)}", **where
                ) from exc
            if code == "NoSuchBucket":
                raise StoreUnavailable(
                    f"blob store {self.url}: {op}: bucket {self.bucket!r} does not exist"
                ) from exc
            raise StoreUnavailable(
                f"blob store {self.url}: {op} failed: {code or 'HTTP ' + str(status)}"
                f" {exc.response.get('Error', {}).get('Message', '')}".rstrip()
            ) from exc
        except (botocore.exceptions.BotoCoreError, boto3.exceptions.Boto3Error) as exc:
            raise StoreUnavailable(
                f"blob store {self.url}: {op} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _unless_missing(self, call: Any, **kwargs: Any) -> dict[str, Any] | None:
        """``call(Bucket=..., **kwargs)``'s response; None when the object is not found."""
        try:
            response: dict[str, Any] = call(Bucket=self.bucket, **kwargs)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                return None
            raise
        return response

    def _head(self, key: str) -> dict[str, Any] | None:
        with self._errors("HeadObject"):
            return self._unless_missing(self.client.head_object, Key=self.object_key(key))

    def _write(self, key: str, data: bytes) -> None:
        if self._touch_existing(key, len(data)):
            return
        # BytesIO over the bytes does not copy them.
        self._upload(key, io.BytesIO(data))
        logger.debug("uploaded blob %s (%d bytes)", key, len(data))

    def _upload(self, key: str, fileobj: BinaryIO) -> None:
        """The transfer manager reads one part at a time (multipart above MULTIPART_SIZE)."""
        with self._errors("upload", key):
            self.client.upload_fileobj(
                fileobj,
                self.bucket,
                self.object_key(key),
                ExtraArgs={
                    "ContentType": "application/json",
                    "Metadata": {_TOUCHED: datetime.now(UTC).strftime(_TOUCHED_AT)},
                },
                Config=self.transfer_config,
            )

    def _touch_existing(self, key: str, size: int) -> bool:
        """True when the blob exists with the right size, refreshed (a copy onto itself)
        so a concurrent :func:`gc_blobs` keeps it."""
        head = self._head(key)
        if head is None:
            return False
        if int(head.get("ContentLength", -1)) != size:
            logger.warning("blob %s has the wrong size; uploading it again", key)
            return False
        obj = self.object_key(key)
        with self._errors("CopyObject", key):
            copied = self._unless_missing(
                self.client.copy_object,
                Key=obj,
                CopySource={"Bucket": self.bucket, "Key": obj},
                MetadataDirective="REPLACE",
                ContentType=head.get("ContentType") or "application/json",
                Metadata={_TOUCHED: datetime.now(UTC).strftime(_TOUCHED_AT)},
            )
        if copied is None:
            # Deleted (by gc-blobs or an erasure) since the HEAD: upload it again.
            logger.debug("blob %s vanished while being refreshed; uploading it", key)
            return False
        logger.debug("blob %s already stored; refreshed it", key)
        return True

    def put_stream(self, stream: BinaryIO) -> PayloadRef:
        """Store everything read from ``stream``: it is hashed while it is spooled to a
        temp file, then uploaded (multipart) under its digest.

        Raises:
            StoreUnavailable: the upload failed.
        """
        with tempfile.TemporaryFile() as spool:
            size, digest = copy_hashing(stream, spool)
            key = digest.hex()
            if not self._touch_existing(key, size):
                spool.seek(0)
                self._upload(key, spool)
        return PayloadRef(key, size, digest)

    def _open_raw(self, key: str, stream_id: str | None, version: int | None) -> Any:
        where = {"stream_id": stream_id, "version": version}
        with self._errors("GetObject", key, **where):
            resp = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
        return _TranslatingBody(self, resp["Body"], key, where)

    def _read_all(self, key: str, size: int, stream_id: str | None, version: int | None) -> bytes:
        where: dict[str, Any] = {"stream_id": stream_id, "version": version}
        if size < MULTIPART_SIZE:
            parts: list[bytes] = []
            left = size + 1
            with contextlib.closing(self._open_raw(key, stream_id, version)) as body:
                while left > 0 and (chunk := body.read(left)):
                    parts.append(chunk)
                    left -= len(chunk)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        # Large: parallel ranged GETs into a temp file, then one read of the exact size,
        # so the payload exists once in memory (no growing buffer, no copy).
        with tempfile.TemporaryFile() as spool:
            with self._errors("download", key, **where):
                self.client.download_fileobj(
                    self.bucket, self.object_key(key), spool, Config=self.transfer_config
                )
            spool.seek(0)
            return spool.read(size + 1)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of blob ``key`` from ``offset``: one ranged GetObject."""
        if length <= 0:
            return b""
        with self._errors("GetObject", key):
            resp = self.client.get_object(
                Bucket=self.bucket,
                Key=self.object_key(key),
                Range=f"bytes={offset}-{offset + length - 1}",
            )
            data: bytes = resp["Body"].read()
        return data

    def exists(self, key: str) -> bool:
        """True when the object of ``key`` exists (a HEAD request).

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        return self._head(key) is not None

    def list_blobs(self) -> Iterator[BlobInfo]:
        """Every blob object under the prefix (``ListObjectsV2``, paginated).

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        paginator = self.client.get_paginator("list_objects_v2")
        n = len(self._key_prefix)
        with self._errors("ListObjectsV2"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key_prefix):
                for obj in page.get("Contents", ()):
                    name = obj["Key"][n:]
                    if _KEY_RE.fullmatch(name):
                        yield BlobInfo(name, int(obj["Size"]), obj["LastModified"])

    def delete(self, key: str, *, if_older_than: datetime | None = None) -> bool:
        """Delete the object of ``key``.

        With ``if_older_than``, a HEAD first checks that it was not refreshed since
        (S3 has no rename; the window between HEAD and DELETE is one round trip).

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        if if_older_than is not None:
            head = self._head(key)
            if head is None or _modified(head) >= if_older_than:
                return False
        with self._errors("DeleteObject", key):
            self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))
        return True

    def _read_owner(self) -> str | None:
        with self._errors(f"GetObject {OWNER_MARKER}"):
            resp = self._unless_missing(self.client.get_object, Key=self._key_prefix + OWNER_MARKER)
            if resp is None:
                return None
            data: bytes = resp["Body"].read(100)
        return data.decode("ascii", "replace").strip()

    def _write_owner(self, token: str) -> str:
        with self._errors(f"PutObject {OWNER_MARKER}"):
            try:
                # If-None-Match: of two stores claiming at once, S3 lets one write
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self._key_prefix + OWNER_MARKER,
                    Body=token.encode(),
                    ContentType="text/plain",
                    IfNoneMatch="*",
                )
            except botocore.exceptions.ClientError as exc:
                if _code(exc) not in ("PreconditionFailed", "ConditionalRequestConflict"):
                    raise
        # Read back: a server that ignores If-None-Match shows the last writer here
        owner = self._read_owner()
        if owner is None:  # 409: the other claim has not landed yet
            raise StoreUnavailable(
                f"blob store {self.url}: another store is claiming this location at the same "
                "moment; try again"
            )
        return owner

    def close(self) -> None:
        """Close the boto3 client's connections. Idempotent."""
        if not self._closed:
            self._closed = True
            self.client.close()


class _TranslatingBody:
    """A ``GetObject`` body whose read errors become ares errors."""

    def __init__(self, store: S3BlobStore, body: Any, key: str, where: dict[str, Any]) -> None:
        self._store = store
        self._body = body
        self._key = key
        self._where = where

    def read(self, n: int = -1) -> bytes:
        with self._store._errors("GetObject body", self._key, **self._where):
            data: bytes = self._body.read(n if n >= 0 else None)
        return data

    def close(self) -> None:
        self._body.close()
