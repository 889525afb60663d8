"""Stream reads across archived versions and the rows the database keeps between them.

An archive run leaves each stream's last event in the database; when it lies below the
run's end, a later run archives the versions after it, so the stream reads archive,
database, archive, database. A stream read skipped that kept row (the archive read went
on past it): ``read`` lost an event ``read_all`` had, verify and audit reported a gap on a
healthy store, gc-blobs deleted the kept event's blob and a journal could not reopen its
run. Real SQLite and PostgreSQL stores, a file blob folder and a file archive.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ares_events as ae
from ares_events.agents.journal import Journal, ModelReply
from ares_events.archive import job as archive_mod
from ares_events.archive.job import archive
from ares_events.archive.segment import stored
from ares_events.stores.blobs.gc import gc_blobs
from ares_events.testing.blocking import open_blocking
from tests.fixtures.fix_backends import store_url_for
from tests.fixtures.tier import examples

SPILL = 64
"""Payloads over this many bytes spill to the blob folder."""

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def _ev(i: int, size: int = 0) -> ae.NewEvent:
    """An event whose payload carries ``i`` and ``size`` filler bytes (over SPILL: spilled)."""
    payload: dict[str, Any] = {"i": i}
    if size:
        payload["fill"] = "B" * size
    return ae.NewEvent(type="t.x", module="m", payload=payload)


def _archive_all(store: Any, to: str, **kw: Any) -> Any:
    """An archive run up to the store's end (each stream's last event stays)."""
    return archive(store, to, before=store.last_position() + 1, **kw)


def _windows(n: int) -> Iterator[tuple[int, int | None, int | None]]:
    """Every (from_version, to_version, limit) over a stream of ``n`` events, and past it
    (a to_version below from_version - 1 is as empty as from_version - 1)."""
    limits: list[int | None] = [None, 0, 1, 2]
    for lo in range(1, n + 3):
        for hi in [None, *range(lo - 1, n + 2)]:
            yield from ((lo, hi, limit) for limit in limits)


def _some_windows(n: int) -> Iterator[tuple[int, int | None, int | None]]:
    """Every start with no end or a limit of 2, every end from version 1, every pair of
    versions (where reads are dearer: the asyncio face, PostgreSQL)."""
    yield from ((lo, None, limit) for lo in range(1, n + 3) for limit in (None, 2))
    yield from ((1, hi, None) for hi in range(n + 2))
    yield from ((lo, lo + 1, None) for lo in range(1, n + 2))


def _check_reads(store: Any, streams: list[str], *, every: bool = True) -> None:
    """``read`` gives, for every stream and window (``every=False``: some), the events
    ``read_all`` has for it (every stored column compared)."""
    windows = _windows if every else _some_windows
    everything = list(store.read_all())
    for sid in streams:
        mine = [stored(e) for e in everything if e.stream_id == sid]
        versions = [r[1] for r in mine]
        assert versions == list(range(1, len(mine) + 1)), (sid, versions)
        assert [stored(e) for e in store.read(sid)] == mine, sid
        for lo, hi, limit in windows(len(mine)):
            want = [r for r in mine if r[1] >= lo and (hi is None or r[1] <= hi)][:limit]
            got = [stored(e) for e in store.read(sid, lo, hi, limit)]
            assert got == want, (sid, lo, hi, limit, [r[1] for r in got])


def _reported_scenario(store: ae.EventStore, to: str) -> None:
    """The hunt's scenario: ``s`` v3 (spilled) is kept by the first run, below its end;
    the second run archives ``s`` v4, v5."""
    store.append("s", [_ev(1), _ev(2), _ev(3, SPILL * 8)])
    store.append("other", [_ev(0), _ev(0)])  # other v1 lies after s v3: s v3 is below the end
    _archive_all(store, to)  # archives s v1, v2 and other v1; keeps s v3, other v2
    store.append("s", [_ev(4), _ev(5), _ev(6)])
    store.append("other", [_ev(0)])
    _archive_all(store, to)  # archives s v4, v5; s v3 stays in the database


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kept_row_between_archived_versions_is_read(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """After the two runs, ``read`` returns s v1..v6 (it returned 1, 2, 4, 5, 6), in every
    window, on both faces; verify and a deep audit are ok; gc-blobs deletes nothing and
    the kept event's spilled payload still reads."""
    url = store_url_for(backend, tmp_path, request)
    blobs = (tmp_path / "blobs").as_uri()
    with ae.open_store(url, blobs=blobs, spill_threshold=SPILL) as store:
        _reported_scenario(store, (tmp_path / "archive").as_uri())
    with ae.open_store(url, blobs=blobs, spill_threshold=SPILL) as store:
        assert [e.version for e in store.read("s")] == [1, 2, 3, 4, 5, 6]
        assert [e.version for e in store.read("s", 2, 4)] == [2, 3, 4]
        assert [e.version for e in store.read("s", limit=4)] == [1, 2, 3, 4]
        _check_reads(store, ["s", "other"])
        for sid in ("s", "other"):
            rep = ae.integrity.verify_stream(store, sid)
            assert rep.ok, rep.findings
        audit = ae.integrity.audit(store, deep=True)
        assert audit.ok, audit.findings
        gc = gc_blobs(store, timedelta(0), now=datetime.now(UTC) + timedelta(seconds=5))
        assert gc.deleted == [] and gc.kept_referenced == 1
        v3 = list(store.read("s", 3, 3))
        assert [e.payload["i"] for e in v3] == [3] and v3[0].payload["fill"] == "B" * SPILL * 8
    with open_blocking(url, blobs=blobs, spill_threshold=SPILL) as astore:
        assert [e.version for e in astore.read("s")] == [1, 2, 3, 4, 5, 6]
        _check_reads(astore, ["s", "other"])
        assert ae.integrity.verify_stream(astore, "s").ok  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_journal_reopens_its_run_after_two_archive_runs(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A run journaled without a snapshot, two ordinary archive runs: a restarted agent
    reopens the run and replays its first model call (it raised ChainIntegrityError: a
    gap at v4)."""
    url = store_url_for(backend, tmp_path, request)
    to = (tmp_path / "archive").as_uri()
    calls: list[str] = []

    def model(messages: Any, params: Any) -> ModelReply:
        calls.append(messages[-1]["content"])
        return ModelReply("ok " + messages[-1]["content"], {"total_tokens": 1})

    with ae.open_store(url) as store:
        j = Journal(store, "run-1", snapshot_every=1000)
        first = j.model_call([{"role": "user", "content": "a"}], call=model)
        store.append("other", [_ev(0), _ev(0)])  # other v1 (archived) lies after the run's end
        _archive_all(store, to)  # keeps the run's last event, below the archive's end
        j.model_call([{"role": "user", "content": "b"}], call=model)
        store.append("other", [_ev(0)])
        _archive_all(store, to)  # archives the run's events after the kept one
    with ae.open_store(url) as store:
        n = store.stream_version("run-1")
        assert [e.version for e in store.read("run-1")] == list(range(1, n + 1))
        again = Journal(store, "run-1", snapshot_every=1000)
        assert again.model_call([{"role": "user", "content": "a"}], call=model) == first
        assert calls == ["a", "b"]  # replayed, not called again
        assert ae.integrity.audit(store).ok


# -- the property: random appends and archive runs ------------------------------------------

STREAMS = ["a", "b", "c"]

_append = st.tuples(
    st.just("append"),
    st.sampled_from(STREAMS),
    st.lists(st.sampled_from([0, 0, 8, SPILL * 4]), min_size=1, max_size=4),  # filler sizes
)
_run = st.tuples(
    st.just("archive"),
    # where its horizon lies between the archive's end and the store's (often: the end)
    st.one_of(st.just(1.0), st.floats(0.0, 1.0)),
    st.integers(1, 4),  # segment_events
    st.integers(1, 3),  # block_events
    st.sampled_from([None, None, None, 1]),  # max_segments
    # stopped after its first segment was recorded, before deleting its rows
    st.sampled_from([False, False, False, True]),
)
_steps = st.lists(st.one_of(_append, _append, _run), min_size=8, max_size=20)


class _Stopped(Exception):
    """An archive run stopped on purpose."""


@contextlib.contextmanager
def _stopped_after_recording() -> Iterator[None]:
    """Archive runs stop once a segment is recorded, before its rows are deleted (what a
    crash there leaves: the rows in the database and in the archive)."""
    real = archive_mod._step

    def step(name: str) -> None:
        if name == "recorded":
            raise _Stopped(name)
        real(name)

    archive_mod._step = step
    try:
        yield
    finally:
        archive_mod._step = real


@pytest.fixture
def database(backend: str, request: pytest.FixtureRequest) -> str | None:
    """The session's PostgreSQL database (each example makes a schema in it), else None."""
    return str(request.getfixturevalue("postgres_db_url")) if backend == "postgres" else None


def _fresh_url(database: str | None, where: Path) -> str:
    """A store URL of its own per example (a new schema on PostgreSQL)."""
    if database is None:
        return f"sqlite:///{where / 'e.db'}"
    sep = "&" if "?" in database else "?"
    return f"{database}{sep}schema=k_{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize(
    "backend",
    [  # PostgreSQL's examples cost seconds each: the whole suite runs them
        BACKENDS[0],
        pytest.param("postgres", id="postgres", marks=(pytest.mark.postgres, pytest.mark.slow)),
    ],
)
@settings(
    max_examples=examples(30),  # each example reads every window: ~1 s; CI runs 30 a backend
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=_steps)
@example(  # the hunt's scenario, in segments of two events
    steps=[
        ("append", "a", [0, 0, SPILL * 4]),
        ("append", "b", [0, 0]),
        ("archive", 1.0, 2, 1, None, False),
        ("append", "a", [0, 0, 0]),
        ("append", "b", [0]),
        ("archive", 1.0, 2, 1, None, False),
    ]
)
def test_stream_reads_equal_read_all_across_archive_runs(
    backend: str, database: str | None, tmp_path: Path, steps: list[Any]
) -> None:
    """Appends to a few streams interleaved with archive runs (small segments and blocks,
    horizons anywhere, some runs stopped before deleting their rows, some payloads
    spilled): for every stream and every (from_version, to_version, limit) window,
    ``read`` gives the events ``read_all`` has for that stream in that window (on both
    faces), read_all gives what was appended, a deep audit is ok and gc-blobs deletes
    nothing (every blob is referenced)."""
    where = Path(tempfile.mkdtemp(dir=tmp_path))
    url = _fresh_url(database, where)
    blobs, to = (where / "blobs").as_uri(), (where / "archive").as_uri()
    appended: dict[str, list[int]] = {sid: [] for sid in STREAMS}
    with ae.open_store(url, blobs=blobs, spill_threshold=SPILL) as store:
        i = 0
        for step in steps:
            if step[0] == "append":
                _, sid, sizes = step
                store.append(sid, [_ev(i + k, size) for k, size in enumerate(sizes)])
                appended[sid] += range(i, i + len(sizes))
                i += len(sizes)
            else:
                _, frac, seg, block, most, stop = step
                positions = [e.position for e in store.read_all()]
                if not positions:
                    continue
                before = [*positions, positions[-1] + 1][round(frac * len(positions))]
                with _stopped_after_recording() if stop else contextlib.nullcontext():
                    try:
                        archive(
                            store, to, before=before, segment_events=seg, block_events=block,
                            max_segments=most,
                        )  # fmt: skip
                    except _Stopped:
                        pass  # its rows are in the database and the archive until the next run
        everything = list(store.read_all())
        for sid in STREAMS:
            assert [e.payload["i"] for e in everything if e.stream_id == sid] == appended[sid]
        written = [sid for sid in STREAMS if appended[sid]]
        # Every window on SQLite; on PostgreSQL, whose reads cost a round trip each, the
        # windows the asyncio face gets (the regression test above reads every one there).
        _check_reads(store, written, every=database is None)
        audit = ae.integrity.audit(store, deep=True)
        assert audit.ok, audit.findings
        gc = gc_blobs(store, timedelta(0), now=datetime.now(UTC) + timedelta(seconds=5))
        assert gc.deleted == []
    with open_blocking(url, blobs=blobs, spill_threshold=SPILL) as astore:
        _check_reads(astore, written, every=False)  # the asyncio face
