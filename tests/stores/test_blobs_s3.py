"""Blob spill to S3-compatible storage, against a real HTTP server (moto in its own
process, boto3 unpatched), with SQLite and PostgreSQL stores."""

from __future__ import annotations

import collections
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

import ares_events as ae
from ares_events.chain import canonical_json
from ares_events.errors import BlobCorrupted, BlobMissing, ConfigError, StoreUnavailable
from ares_events.stores.blobs import gc_blobs, open_blobs
from ares_events.stores.blobs.s3 import MULTIPART_SIZE, S3BlobStore
from tests.fixtures import servers
from tests.fixtures.fix_backends import open_backend

pytestmark = pytest.mark.s3

THRESHOLD = 1000
PREFIX = "agent-blobs"
SECRET = servers.s3_env()["AWS_SECRET_ACCESS_KEY"]
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def payload_of_size(n: int, fill: str = "a") -> dict[str, str]:
    """A payload whose canonical JSON is exactly ``n`` bytes."""
    return {"x": fill * (n - 8)}


class RequestCounter:
    """Counts S3 operations a real boto3 client sends (botocore ``before-call`` hook)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.ops: collections.Counter[str] = collections.Counter()

    def _on_call(self, model: Any, **_: Any) -> None:
        self.ops[model.name] += 1

    def __enter__(self) -> collections.Counter[str]:
        self.client.meta.events.register("before-call.s3", self._on_call)
        return self.ops

    def __exit__(self, *exc: object) -> None:
        self.client.meta.events.unregister("before-call.s3", self._on_call)


@pytest.fixture
def s3_client(s3_endpoint: str) -> Iterator[Any]:
    """A plain boto3 client of the test server (to create, inspect and damage objects)."""
    client = boto3.session.Session().client("s3", endpoint_url=s3_endpoint)
    yield client
    client.close()


@pytest.fixture
def bucket(s3_client: Any) -> str:
    """A fresh, empty bucket per test."""
    name = f"ares-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def blobs_url(s3_endpoint: str, bucket: str) -> str:
    """The blob URL of the test bucket."""
    return f"s3://{bucket}/{PREFIX}?endpoint_url={s3_endpoint}"


@pytest.fixture(params=BACKENDS)
def spill_store(
    request: pytest.FixtureRequest, tmp_path: Path, blobs_url: str
) -> Iterator[ae.EventStore]:
    """A SQLite or PostgreSQL store spilling payloads over 1000 bytes to the bucket."""
    with open_backend(
        request.param, tmp_path, request, blobs=blobs_url, spill_threshold=THRESHOLD
    ) as store:
        yield store


def object_keys(s3_client: Any, bucket: str) -> list[str]:
    """Every object key in ``bucket`` but the owner marker's (the store's claim)."""
    resp = s3_client.list_objects_v2(Bucket=bucket)
    keys = (o["Key"] for o in resp.get("Contents", ()))
    return sorted(k for k in keys if k != f"{PREFIX}/.ares-owner")


def s3_blobs(store: ae.EventStore) -> S3BlobStore:
    """The store's S3 blob store."""
    assert isinstance(store.blobs, S3BlobStore)
    return store.blobs


# -- spill ---------------------------------------------------------------------------------


def test_spill_boundary(spill_store: ae.EventStore, s3_client: Any, bucket: str) -> None:
    """threshold bytes stay inline; threshold+1 bytes become one object under the prefix."""
    ae.emit(spill_store, "s", "t", "m", payload_of_size(THRESHOLD))
    assert object_keys(s3_client, bucket) == []
    big = payload_of_size(THRESHOLD + 1, "b")
    ae.emit(spill_store, "s", "t", "m", big)
    inline, spilled = spill_store.read("s")
    assert inline.payload_ref is None
    assert spilled.payload_ref is not None
    assert object_keys(s3_client, bucket) == [f"{PREFIX}/{spilled.payload_ref.key}"]
    assert spilled.payload == big


def test_equal_payloads_are_one_object(
    spill_store: ae.EventStore, s3_client: Any, bucket: str
) -> None:
    """The same big payload appended three times is stored as one object."""
    payload = payload_of_size(4000, "d")
    for sid in ("a", "b", "c"):
        ae.emit(spill_store, sid, "t", "m", payload)
    (key,) = object_keys(s3_client, bucket)
    head = s3_client.head_object(Bucket=bucket, Key=key)
    assert "ares-touched" in head["Metadata"]  # reuse refreshed the object for gc
    assert [e.payload for sid in "abc" for e in spill_store.read(sid)] == [payload] * 3


def test_verification_and_replay_send_no_blob_requests(spill_store: ae.EventStore) -> None:
    """verify_stream, a shallow audit and a replay that never touches payloads send no
    request to S3; touching one payload sends exactly one GetObject."""
    for fill in "abcd":
        ae.emit(spill_store, "s", "t", "m", payload_of_size(3000, fill))
    client = s3_blobs(spill_store).client
    with RequestCounter(client) as ops:
        assert ae.integrity.verify_stream(spill_store, "s").ok
        assert ae.integrity.audit(spill_store).ok
        versions = [(e.version, e.type, e.payload_size) for e in spill_store.read("s")]
    assert versions == [(v, "t", 3000) for v in range(1, 5)]
    assert sum(ops.values()) == 0
    with RequestCounter(client) as ops:
        e = next(spill_store.read("s", from_version=3))
        assert e.payload == payload_of_size(3000, "c")
        assert e.payload_bytes is e.payload_bytes  # fetched once, kept
    assert ops == {"GetObject": 1}


def test_large_payload_uses_multipart_transfers(spill_store: ae.EventStore) -> None:
    """A payload over the multipart size is uploaded in parts and read back intact."""
    payload = payload_of_size(MULTIPART_SIZE + 1234, "m")
    client = s3_blobs(spill_store).client
    with RequestCounter(client) as ops:
        ae.emit(spill_store, "s", "t", "m", payload)
    assert ops["CreateMultipartUpload"] == 1 and ops["UploadPart"] == 2
    (e,) = spill_store.read("s")
    assert e.payload_bytes == canonical_json(payload)
    assert ae.integrity.audit(spill_store, deep=True).ok


# -- failures ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_endpoint_during_append_appends_nothing(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, s3_endpoint: str
) -> None:
    """With nothing listening at endpoint_url, a spilling append raises StoreUnavailable
    and writes no event; the message holds no secret. So does the store's first write,
    inline or not: it claims the blob location it records as its own."""
    dead = f"http://127.0.0.1:{servers.free_port()}"
    url = f"s3://bucket/p?endpoint_url={dead}&max_attempts=1&connect_timeout=2"
    with open_backend(backend, tmp_path, request, blobs=url, spill_threshold=THRESHOLD) as st:
        for payload in ({"small": True}, payload_of_size(5000)):
            with pytest.raises(StoreUnavailable, match="blob store s3://bucket/p") as info:
                ae.emit(st, "s", "t", "m", payload)
            assert SECRET not in str(info.value)
            assert st.stream_version("s") == 0
            assert list(st.read("s")) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_server_stopping_mid_session_fails_the_append_cleanly(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, s3_endpoint: str
) -> None:
    """A server that goes away between two appends: the second raises StoreUnavailable,
    nothing is appended, and the stream stays verifiable."""
    port = servers.free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        servers._wait_port("127.0.0.1", port, 30, "moto server")
        endpoint = f"http://127.0.0.1:{port}"
        admin = boto3.session.Session().client("s3", endpoint_url=endpoint)
        admin.create_bucket(Bucket="short-lived")
        admin.close()
        url = f"s3://short-lived/x?endpoint_url={endpoint}&max_attempts=2&connect_timeout=2"
        with open_backend(backend, tmp_path, request, blobs=url, spill_threshold=THRESHOLD) as st:
            ae.emit(st, "s", "t", "m", payload_of_size(3000))
            proc.terminate()
            proc.wait(10)
            with pytest.raises(StoreUnavailable):
                ae.emit(st, "s", "t", "m", payload_of_size(3000, "z"))
            assert st.stream_version("s") == 1
            assert ae.integrity.verify_stream(st, "s").ok  # no blob needed
    finally:
        proc.terminate()
        proc.wait(10)


def test_missing_bucket_is_a_clear_store_unavailable(tmp_path: Path, s3_endpoint: str) -> None:
    """Spilling into a bucket that does not exist names the bucket; nothing is appended."""
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p?endpoint_url={s3_endpoint}"
    with ae.open_store(
        f"sqlite:///{tmp_path / 'e.db'}", blobs=url, spill_threshold=THRESHOLD
    ) as st:
        with pytest.raises(StoreUnavailable, match="does not exist"):
            ae.emit(st, "s", "t", "m", payload_of_size(2000))
        assert st.stream_version("s") == 0


def test_deleted_object_found_by_deep_audit_and_raised_on_read(
    spill_store: ae.EventStore, s3_client: Any, bucket: str
) -> None:
    """An object deleted behind our back is blob_missing in a deep audit and BlobMissing
    on read."""
    ae.emit(spill_store, "s", "t", "m", payload_of_size(2000))
    ae.emit(spill_store, "s", "t", "m", payload_of_size(2000, "k"))
    (e1, _) = spill_store.read("s")
    assert e1.payload_ref is not None
    s3_client.delete_object(Bucket=bucket, Key=f"{PREFIX}/{e1.payload_ref.key}")
    report = ae.integrity.audit(spill_store, deep=True)
    assert [(f.kind, f.stream_id, f.version) for f in report.findings] == [("blob_missing", "s", 1)]
    assert report.blobs_checked == 2
    (e1, e2) = spill_store.read("s")
    with pytest.raises(BlobMissing) as info:
        _ = e1.payload
    assert (info.value.stream_id, info.value.version) == ("s", 1)
    assert e2.payload == payload_of_size(2000, "k")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b.replace(b"a", b"b", 1), id="edited"),
        pytest.param(lambda b: b[:100], id="truncated"),
        pytest.param(lambda b: b + b"\n", id="extended"),
    ],
)
def test_altered_object_found_by_deep_audit_and_raised_on_read(
    spill_store: ae.EventStore, s3_client: Any, bucket: str, damage: Any
) -> None:
    """An object rewritten with other bytes is blob_corrupted in a deep audit and
    BlobCorrupted on read."""
    ae.emit(spill_store, "s", "t", "m", payload_of_size(2000))
    (e,) = spill_store.read("s")
    assert e.payload_ref is not None
    key = f"{PREFIX}/{e.payload_ref.key}"
    body = canonical_json(payload_of_size(2000))
    s3_client.put_object(Bucket=bucket, Key=key, Body=damage(body))
    report = ae.integrity.audit(spill_store, deep=True)
    assert [f.kind for f in report.findings] == ["blob_corrupted"]
    with pytest.raises(BlobCorrupted) as info:
        _ = e.payload
    assert info.value.key == e.payload_ref.key


# -- garbage collection --------------------------------------------------------------------


def test_gc_deletes_orphans_and_keeps_referenced_objects(
    spill_store: ae.EventStore, s3_client: Any, bucket: str
) -> None:
    """gc with older_than=0 deletes an unreferenced object and keeps every referenced
    one; the dry run before deletes nothing."""
    blobs = s3_blobs(spill_store)
    ae.emit(spill_store, "s", "t", "m", payload_of_size(2000, "r"))
    ae.emit(spill_store, "s", "t", "m", payload_of_size(2000, "q"))
    orphan = blobs.put(b'{"orphan":true}')
    later = datetime.now(UTC) + timedelta(seconds=2)  # LastModified has 1 s resolution
    dry = gc_blobs(spill_store, timedelta(0), dry_run=True, now=later)
    assert dry.deleted == [orphan.key] and dry.kept_referenced == 2
    assert len(object_keys(s3_client, bucket)) == 3
    report = gc_blobs(spill_store, timedelta(0), now=later)
    assert report.deleted == [orphan.key]
    assert f"{PREFIX}/{orphan.key}" not in object_keys(s3_client, bucket)
    assert len(object_keys(s3_client, bucket)) == 2
    assert ae.integrity.audit(spill_store, deep=True).ok


def test_gc_keeps_young_orphans(spill_store: ae.EventStore) -> None:
    """An orphan younger than the grace period (an append in flight) is kept."""
    blobs = s3_blobs(spill_store)
    orphan = blobs.put(b'{"in_flight":1}')
    report = gc_blobs(spill_store, timedelta(hours=1))
    assert report.deleted == [] and report.kept_young == 1
    assert blobs.exists(orphan.key)


# -- API and URLs --------------------------------------------------------------------------


def test_blob_api_round_trip(blobs_url: str) -> None:
    """put/get/open/put_stream/list/delete work on the bucket."""
    import io

    blobs = open_blobs(blobs_url)
    try:
        data = b'{"v":"' + b"x" * 50_000 + b'"}'
        ref = blobs.put(data)
        assert blobs.exists(ref.key) and blobs.get(ref) == data
        with blobs.open(ref) as reader:
            assert reader.read() == data
        assert blobs.put_stream(io.BytesIO(data)) == ref
        infos = list(blobs.list_blobs())
        assert [(i.key, i.size) for i in infos] == [(ref.key, len(data))]
        assert infos[0].modified.tzinfo is not None
        blobs.verify(ref)
        assert blobs.delete(ref.key) is True
        assert not blobs.exists(ref.key)
        with pytest.raises(BlobMissing, match=ref.key):
            blobs.verify(ref)
    finally:
        blobs.close()
        blobs.close()  # idempotent


def test_no_secret_in_repr_or_logs(
    blobs_url: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The blob store's repr and its log lines never show the AWS secret."""
    caplog.set_level("DEBUG", logger="ares_events")
    with ae.open_store(
        f"sqlite:///{tmp_path / 'e.db'}", blobs=blobs_url, spill_threshold=THRESHOLD
    ) as st:
        ae.emit(st, "s", "t", "m", payload_of_size(3000))
        _ = next(st.read("s")).payload
        assert SECRET not in repr(st.blobs)
        assert repr(st.blobs).startswith("S3BlobStore('s3://")
    assert caplog.records
    assert all(SECRET not in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("s3://AKIA:hunter2@bucket/p", "holds credentials"),
        ("s3://bucket/p?endpoint_url=http://u:hunter2@127.0.0.1:9", "holds credentials"),
        ("s3://bucket/p?aws_secret_access_key=hunter2", "valid: addressing_style"),
        ("s3:///p", "no bucket"),
        ("s3://bucket/p?addressing_style=sideways", "path, virtual or auto"),
        ("s3://bucket/p?max_attempts=0", "max_attempts"),
        ("s3://bucket/p?connect_timeout=soon", "connect_timeout"),
        ("s3://bucket/p?endpoint_url=ftp://h", "http"),
    ],
)
def test_bad_s3_urls_are_config_errors_without_secrets(url: str, match: str) -> None:
    """Credentials in the URL, unknown parameters and bad values raise ConfigError that
    never repeats a password."""
    with pytest.raises(ConfigError, match=match) as info:
        open_blobs(url)
    assert "hunter2" not in str(info.value)


# -- LastModified resolution and a blob deleted mid-refresh ------------------------------


def test_delete_if_older_than_uses_the_precise_time_or_a_truncated_last_modified(
    blobs_url: str, s3_client: Any, bucket: str
) -> None:
    """A blob this store wrote or refreshed after the cutoff is kept (it records the
    precise time in the object's metadata). One without that metadata (written before,
    or by another tool) has only LastModified, kept to the second: a cutoff within its
    second, or less than a second after it, does not prove it older."""
    s = open_blobs(blobs_url)
    try:
        data = canonical_json(payload_of_size(2000))
        for i in range(20):
            cutoff = datetime.now(UTC)
            ref = s.put(data)  # written the first time, refreshed after
            assert s.delete(ref.key, if_older_than=cutoff) is False, i
        obj = f"{PREFIX}/{ref.key}"
        s3_client.put_object(Bucket=bucket, Key=obj, Body=data)  # no metadata
        modified = s3_client.head_object(Bucket=bucket, Key=obj)["LastModified"]
        assert modified.microsecond == 0  # the server truncates, as S3 does
        for later in (0.0, 0.5, 0.999):
            assert s.delete(ref.key, if_older_than=modified + timedelta(seconds=later)) is False
        assert s.exists(ref.key)
        assert s.delete(ref.key, if_older_than=modified + timedelta(seconds=1)) is True
        assert not s.exists(ref.key)
    finally:
        s.close()


def test_append_uploads_again_a_blob_deleted_between_head_and_copy(
    spill_store: ae.EventStore, s3_client: Any, bucket: str
) -> None:
    """A gc or an erasure deletes the blob right after the append's HEAD found it: the
    CopyObject that refreshes it gets NoSuchKey, and the append uploads it again instead
    of failing; the event reads. (Only the first HEAD: the append's refresh after its
    commit heads the blob again.)"""
    blobs = s3_blobs(spill_store)
    payload = payload_of_size(3000)
    ae.emit(spill_store, "warm", "t", "m", payload)
    head = blobs._head
    deletions = 0

    def head_then_delete(key: str) -> dict[str, Any] | None:
        nonlocal deletions
        found = head(key)
        if found is not None and deletions == 0:
            s3_client.delete_object(Bucket=bucket, Key=f"{PREFIX}/{key}")
            deletions += 1
        return found

    blobs._head = head_then_delete  # type: ignore[method-assign]
    try:
        ae.emit(spill_store, "s", "t", "m", payload)
    finally:
        del blobs._head
    assert deletions == 1
    (e,) = spill_store.read("s")
    assert e.payload == payload
    assert ae.integrity.audit(spill_store, deep=True).ok
