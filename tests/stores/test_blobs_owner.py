"""One blob location, one store: the owner marker (``.ares-owner``) a store claims before
it first writes or deletes a blob, so two stores configured with the same folder or S3
prefix never delete each other's blobs (gc-blobs and erase count only their own store's
references)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.core.recorder import backend_of
from ares_events.errors import ConfigError
from ares_events.stores.blobs import BaseBlobStore, gc_blobs
from tests.fixtures.cli_helpers import run

OWNER_MARKER = ".ares-owner"  # on-disk names: written out, so a rename shows here
BLOBS_OWNER_KEY = "blobs/owner"
THRESHOLD = 1000  # an erasure record stays inline
BIG = {"x": "b" * 2000}
LATER = timedelta(seconds=5)  # a gc "now" past every blob's mtime (S3: 1 s resolution)


def _big(tag: str) -> list[ae.NewEvent]:
    return [ae.NewEvent(type="t", module="m", payload={**BIG, "tag": tag})]


class Location:
    """A blob location (a folder, or a prefix of a fresh moto bucket) seen from outside."""

    def __init__(self, url: str, names: Callable[[], list[str]], drop: Callable[[str], None]):
        self.url = url
        self.names = names
        """Every file or object name under the location (the marker too)."""
        self.drop = drop

    def blobs(self) -> list[str]:
        """Every name but the marker's."""
        return [n for n in self.names() if n != OWNER_MARKER]


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Location]:
    """One blob location that two stores are (wrongly) configured with."""
    if request.param == "file":
        root = tmp_path / "shared"
        yield Location(
            root.as_uri(),
            lambda: sorted(p.name for p in root.rglob("*") if p.is_file()),
            lambda name: (root / name).unlink(missing_ok=True),
        )
        return
    import boto3

    endpoint = request.getfixturevalue("s3_endpoint")
    client = boto3.session.Session().client("s3", endpoint_url=endpoint)
    bucket = f"ares-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)

    def names() -> list[str]:
        got = client.list_objects_v2(Bucket=bucket, Prefix="p/").get("Contents", [])
        return sorted(o["Key"].removeprefix("p/") for o in got)

    yield Location(
        f"s3://{bucket}/p?endpoint_url={endpoint}",
        names,
        lambda name: client.delete_object(Bucket=bucket, Key=f"p/{name}"),
    )
    client.close()


def _open(tmp_path: Path, name: str, loc: Location) -> ae.EventStore:
    return ae.open_store(
        f"sqlite:///{tmp_path / name}.db", blobs=loc.url, spill_threshold=THRESHOLD
    )


def _token(store: ae.EventStore) -> str | None:
    value: str | None = backend_of(store.recorder).meta_get(BLOBS_OWNER_KEY)
    return value


def test_a_second_store_cannot_spill_into_a_location_another_owns(
    tmp_path: Path, shared: Location
) -> None:
    """The first store to write owns the location; a second store configured with it gets
    a ConfigError naming the location (no secret) from its first write, which appends
    nothing (inline or spilled), and records nothing: reopened with a location of its own,
    as the message advises, it writes; the first store's blobs stay."""
    with _open(tmp_path, "a", shared) as a:
        a.append("s", _big("a"))
        mine = shared.blobs()
        assert len(mine) == 1
    with _open(tmp_path, "b", shared) as b:
        with pytest.raises(ConfigError) as info:
            b.append("s", _big("b"))
        text = str(info.value)
        assert "belongs to another store" in text and "its own" in text
        assert shared.url.partition("?")[0].removeprefix("file://") in text
        assert "endpoint_url" not in text and "secret" not in text.lower()
        assert b.stream_version("s") == 0 and shared.blobs() == mine
        with pytest.raises(ConfigError):  # refused again, not only once; inline too
            b.append("s", [ae.NewEvent(type="t", module="m", payload={"small": 1})])
        assert b.stream_version("s") == 0
    assert OWNER_MARKER in shared.names()
    own = (tmp_path / "own").as_uri()
    with ae.open_store(f"sqlite:///{tmp_path / 'b'}.db", blobs=own, spill_threshold=THRESHOLD) as b:
        b.append("s", _big("b"))  # nothing of the refused location was recorded
        b.append("s", [ae.NewEvent(type="t", module="m", payload={"small": 1})])
        assert not ae.erase(b, "s", 2, reason="test", by="test").already_erased
    with _open(tmp_path, "a", shared) as a:  # the owner, reopened, spills on
        a.append("s", _big("a2"))
        assert ae.integrity.audit(a, deep=True).ok


def test_a_location_shared_before_markers_belongs_to_the_first_claimer(
    tmp_path: Path, shared: Location, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two stores that spilled into one location before markers existed: the first to
    claim it (here by an erasure) owns it; the other's gc-blobs (library and CLI, exit 2)
    and erase refuse before changing anything; the owner's erase and gc work, and the
    marker is neither deleted nor reported."""
    for name in ("a", "b"):
        with _open(tmp_path, name, shared) as s:
            s.append("s", _big(name))
            s.append("s", _big(name + "2"))
        shared.drop(OWNER_MARKER)  # as a store of an older version left it
    assert len(shared.blobs()) == 4
    with _open(tmp_path, "a", shared) as a:
        rep = ae.erase(a, "s", 1, reason="test", by="owner")
        assert rep.blob_deleted and len(shared.blobs()) == 3
    left = shared.names()
    with _open(tmp_path, "b", shared) as b:
        with pytest.raises(ConfigError, match="belongs to another store"):
            gc_blobs(b, timedelta(0), now=datetime.now(UTC) + LATER)
        with pytest.raises(ConfigError, match="belongs to another store"):
            gc_blobs(b, timedelta(0), dry_run=True, now=datetime.now(UTC) + LATER)
        with pytest.raises(ConfigError, match="belongs to another store"):
            ae.erase(b, "s", 1, reason="test", by="other")
        (first,) = b.read("s", 1, 1)
        assert not first.payload_erased and first.payload == {**BIG, "tag": "b"}
        assert b.stream_version(ae.ERASURE_STREAM) == 0
    store_b = f"sqlite:///{tmp_path / 'b.db'}"
    for extra in (["--dry-run"], []):
        code, _, err = run(capsys, "--store", store_b, "--blobs", shared.url, "gc-blobs",
                           "--older-than", "0s", *extra)  # fmt: skip
        assert code == 2 and "belongs to another store" in err, err
    assert shared.names() == left and OWNER_MARKER in left
    with _open(tmp_path, "a", shared) as a:
        assert ae.erase(a, "s", 2, reason="test", by="owner").blob_deleted
        report = gc_blobs(a, timedelta(0), now=datetime.now(UTC) + LATER)
        assert OWNER_MARKER not in report.deleted and OWNER_MARKER not in str(report.to_dict())
        assert shared.names() == [OWNER_MARKER]  # b's blobs were orphans to a
        assert ae.integrity.audit(a, deep=True).ok


def test_the_asyncio_face_refuses_too(tmp_path: Path, shared: Location) -> None:
    """On the asyncio face too, a spilling append and an erasure (of a spilled payload or
    an inline one: erase_events of several is never left half done) by a store that does
    not own its blob location raise ConfigError and change nothing."""

    async def scenario() -> None:
        url = f"sqlite:///{tmp_path / 'a.db'}"
        async with await ae.open_async_store(url, blobs=shared.url, spill_threshold=THRESHOLD) as a:
            await a.append("s", _big("a"))
        other = f"sqlite:///{tmp_path / 'b.db'}"
        async with await ae.open_async_store(
            other, blobs=shared.url, spill_threshold=THRESHOLD
        ) as b:
            with pytest.raises(ConfigError, match="belongs to another store"):
                await b.append("s", _big("b"))
            with pytest.raises(ConfigError, match="belongs to another store"):
                await b.append("s", [ae.NewEvent(type="t", module="m", payload={"small": 1})])
            assert await b.stream_version("s") == 0
        shared.drop(OWNER_MARKER)  # b writes as if before markers, then a claims
        with _open(tmp_path, "b", shared) as sync_b:
            sync_b.append("s", [ae.NewEvent(type="t", module="m", payload={"small": 1})])
            sync_b.append("s", _big("b"))
        shared.drop(OWNER_MARKER)
        async with await ae.open_async_store(url, blobs=shared.url) as a:
            await a.claim_blobs()
        async with await ae.open_async_store(other, blobs=shared.url) as b:
            for version in (1, 2):  # inline, spilled
                with pytest.raises(ConfigError, match="belongs to another store"):
                    await b.erase_payload("s", version)
            assert [x.payload_erased async for x in b.read("s")] == [False, False]

    asyncio.run(scenario())
    assert len(shared.blobs()) == 2


def test_the_marker_is_not_a_blob(tmp_path: Path, shared: Location) -> None:
    """The marker is never listed, iterated, deleted by gc (even when old) or counted as a
    stray object, and it holds the store's recorded owner token."""
    with _open(tmp_path, "a", shared) as a:
        a.append("s", _big("a"))
        blobs = a.blobs
        assert isinstance(blobs, BaseBlobStore)
        orphan = blobs.put(b'{"orphan":true}')
        if shared.url.startswith("file:"):
            marker = Path(shared.url.removeprefix("file://")) / OWNER_MARKER
            assert marker.read_text() == _token(a)
            os.utime(marker, (0, 0))
        keys = [i.key for i in blobs.list_blobs()]
        assert OWNER_MARKER not in keys and len(keys) == 2
        assert sorted(blobs.list_keys()) == sorted(keys) == sorted(i.key for i in blobs)
        report = gc_blobs(a, timedelta(0), now=datetime.now(UTC) + LATER)
        assert report.deleted == [orphan.key] and report.blobs_listed == 2
        assert report.temp_files_deleted == []
        assert OWNER_MARKER in shared.names()
        assert ae.integrity.audit(a, deep=True).ok


def test_reads_never_claim(tmp_path: Path, shared: Location) -> None:
    """Reads, a deep audit and a dry-run gc of a location nobody claimed write no marker,
    and record no owner token."""
    with _open(tmp_path, "a", shared) as a:
        a.append("s", _big("a"))
    shared.drop(OWNER_MARKER)
    with _open(tmp_path, "r", shared) as r:
        assert r.stream_version("s") == 0
        gc_blobs(r, timedelta(0), dry_run=True, now=datetime.now(UTC) + LATER)
        assert _token(r) is None
    with _open(tmp_path, "a", shared) as a:
        assert next(a.read("s")).payload["tag"] == "a"
        assert ae.integrity.audit(a, deep=True).ok
        gc_blobs(a, timedelta(0), dry_run=True, now=datetime.now(UTC) + LATER)
    assert OWNER_MARKER not in shared.names()


# -- two processes claiming at once ----------------------------------------------------------

ROUNDS = 40


def _claimer(name: str, root: str, barrier: Any, out: Any) -> None:
    """In a spawned process: each round, open this process's own store over the round's
    fresh folder, wait for the other, claim; report the outcome and the owner token."""
    import ares_events as ae
    from ares_events.errors import ConfigError

    for i in range(ROUNDS):
        folder = Path(root) / str(i)
        with ae.open_store(
            f"sqlite:///{folder / name}.db", blobs=(folder / "blobs").as_uri()
        ) as store:
            barrier.wait(timeout=60)
            try:
                store.claim_blobs()
                won = True
            except ConfigError:
                won = False
            out.put((i, name, won, _token(store)))


@pytest.mark.slow
def test_two_processes_claiming_at_once_make_one_owner(tmp_path: Path) -> None:
    """Two processes of two different stores claim one fresh folder at the same moment,
    round after round: each round exactly one owns it, and the marker holds its token."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    for i in range(ROUNDS):
        (tmp_path / str(i)).mkdir()
    procs = [
        ctx.Process(target=_claimer, args=(n, str(tmp_path), barrier, out)) for n in ("a", "b")
    ]
    for p in procs:
        p.start()
    for p in procs:  # what they put fits in the pipe: they exit before it is read
        p.join(timeout=120)
        assert p.exitcode == 0
    results = [out.get(timeout=10) for _ in range(2 * ROUNDS)]
    for i in range(ROUNDS):
        got = [r for r in results if r[0] == i]
        winners = [token for _, _, won, token in got if won]
        assert len(got) == 2 and len(winners) == 1, got
        assert (tmp_path / str(i) / "blobs" / OWNER_MARKER).read_text() == winners[0]
