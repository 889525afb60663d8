"""What only the asyncio face has, on every backend: async iterators (lazy, paged, closed
early), subscribe(), waiting without blocking the loop, cancellation, close with tasks in
flight, the a-twins (arecover, asnapshot, areplay, averify_stream), blobs fetched off the
loop, and one store shared by both faces.

The shared behaviour of both faces is the conformance suite
(tests/stores/test_contract_async.py); the PostgreSQL-only guarantees (late commits,
200 concurrent appenders with one subscriber) are in tests/stores/test_postgres_async.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import ares_events as ae
from ares_events.projections.builtin import RecoveryStateProjection
from tests.fixtures.fix_backends import _params, store_url_for

T = TypeVar("T")
TIMEOUT = 60.0  # seconds; only to turn a hang into a failure


def _ev(n: int = 0, **kw: Any) -> ae.NewEvent:
    kw.setdefault("payload", {"n": n})
    return ae.NewEvent(type="test.happened", module="async-tests", **kw)


def go(coro: Awaitable[T]) -> T:
    """Run one test scenario on a fresh event loop, bounded in time."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, TIMEOUT)

    return asyncio.run(bounded())


@pytest.fixture(params=_params(["memory", "sqlite", "postgres"]))
def aurl(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL of each system of record."""
    return store_url_for(str(request.param), tmp_path, request)


def _paged(url: str, page: int) -> str:
    if url.startswith("memory"):
        return url
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}page_size={page}"


# -- the surface --------------------------------------------------------------------------


def test_open_async_store_is_public_and_named() -> None:
    """ae.open_async_store and ae.AsyncEventStore are exported, and the store names
    itself without secrets."""
    assert "open_async_store" in ae.__all__ and "AsyncEventStore" in ae.__all__

    async def scenario() -> None:
        async with await ae.open_async_store("memory://") as store:
            assert isinstance(store, ae.AsyncEventStore)
            assert repr(store) == "AsyncEventStore('memory://')"
            assert store.url == "memory://"
            assert ae.Capability.WAKEUPS in store.capabilities
            assert store.chain_key is None and store.blobs is None
            assert store.identity is None and not store.closed
        assert store.closed

    go(scenario())


def test_reads_are_lazy_paged_and_can_stop_early(aurl: str) -> None:
    """read/read_all are async iterators over pages: a long stream comes back whole and
    in order with a tiny page size, and breaking out early closes the iterator cleanly."""

    async def scenario() -> None:
        async with await ae.open_async_store(_paged(aurl, 7)) as store:
            await store.append("s", [_ev(i) for i in range(50)])
            await store.append("t", [_ev(i) for i in range(5)])
            got = [e.payload["n"] async for e in store.read("s")]
            assert got == list(range(50))
            assert [e.version async for e in store.read("s", 10, 20)] == list(range(10, 21))
            assert len([e async for e in store.read("s", limit=9)]) == 9
            positions = [e.position async for e in store.read_all()]
            assert len(positions) == 55 and positions == sorted(positions)
            after = positions[30]
            assert [e.position async for e in store.read_all(after, limit=3)] == positions[31:34]
            it = store.read("s")
            first = await anext(it)
            await it.aclose()  # type: ignore[attr-defined]
            assert first.version == 1
            assert [(sid, v) async for sid, v in store.streams()] == [("s", 50), ("t", 5)]

    go(scenario())


def test_bad_arguments_raise_at_the_call_and_write_nothing(aurl: str) -> None:
    """Invalid stream ids, ranges and events raise InvalidEvent when the method is called
    (before any iteration), and the store is exactly as before."""

    async def scenario() -> None:
        async with await ae.open_async_store(aurl) as store:
            await store.append("s", [_ev()])
            with pytest.raises(ae.InvalidEvent):
                store.read("")
            with pytest.raises(ae.InvalidEvent):
                store.read("s", from_version=0)
            with pytest.raises(ae.InvalidEvent):
                store.read_all(-1)
            with pytest.raises(ae.InvalidEvent):
                store.subscribe(-1)
            with pytest.raises(ae.InvalidEvent):
                await store.append("s", [])
            with pytest.raises(ae.InvalidEvent):
                await store.append("s", [_ev(payload={"x": float("nan")})])
            with pytest.raises(ae.ConcurrencyError):
                await store.append("s", [_ev()], expected_version=5)
            assert [e.version async for e in store.read("s")] == [1]

    go(scenario())


# -- subscribe and wait_for ---------------------------------------------------------------


def test_subscribe_catches_up_then_follows_live_appends(aurl: str) -> None:
    """subscribe(after) yields the stored events after ``after``, then each new one as it
    commits, in position order, each once."""

    async def scenario() -> None:
        async with await ae.open_async_store(_paged(aurl, 3)) as store:
            first = await store.append("a", [_ev(i) for i in range(4)])
            seen: list[tuple[str, int]] = []

            async def consume() -> None:
                async for e in store.subscribe(0, page=2):
                    seen.append((e.stream_id, e.payload["n"]))
                    if len(seen) == 10:
                        return

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.05)
            for i in range(3):
                await store.append("b", [_ev(i)])
            await store.append("c", [_ev(7), _ev(8), _ev(9)])
            await asyncio.wait_for(task, 30)
            assert seen == [
                ("a", 0),
                ("a", 1),
                ("a", 2),
                ("a", 3),
                ("b", 0),
                ("b", 1),
                ("b", 2),
                ("c", 7),
                ("c", 8),
                ("c", 9),
            ]
            tail = [e.stream_id async for e in _take(store.subscribe(first.position), 6)]
            assert tail == ["b"] * 3 + ["c"] * 3

    go(scenario())


async def _take(ait: Any, n: int) -> Any:
    async for x in ait:
        yield x
        n -= 1
        if n == 0:
            await ait.aclose()
            return


def test_wait_for_times_out_and_wakes_without_blocking_the_loop(aurl: str) -> None:
    """wait_for returns False after its timeout and True once another task appends; the
    loop keeps running other tasks meanwhile."""

    async def scenario() -> None:
        async with await ae.open_async_store(aurl) as store:
            assert await store.wait_for(0, 0.05) is False
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)

            t = asyncio.create_task(ticker())
            waiter = asyncio.create_task(store.wait_for(0, 30))
            await asyncio.sleep(0.1)
            assert not waiter.done()
            assert ticks > 0  # other tasks ran while the waiter waited
            await store.append("s", [_ev()])
            assert await asyncio.wait_for(waiter, 30) is True
            t.cancel()

    go(scenario())


def test_memory_store_is_one_store_whichever_face_opens_it() -> None:
    """memory://NAME opened by both faces is one store: a blocking append in another
    thread wakes an asyncio subscriber, and the blocking face sees async appends."""
    name = "memory://shared-faces-test"

    async def scenario() -> list[int]:
        sync = ae.open_store(name)
        try:
            async with await ae.open_async_store(name) as store:
                await store.append("s", [_ev(0)])
                assert sync.stream_version("s") == 1
                got: list[int] = []

                async def consume() -> None:
                    async for e in store.subscribe(0):
                        got.append(e.payload["n"])
                        if len(got) == 3:
                            return

                task = asyncio.create_task(consume())
                await asyncio.sleep(0.05)
                threading.Thread(target=lambda: sync.append("s", [_ev(1), _ev(2)])).start()
                await asyncio.wait_for(task, 30)
                return got
        finally:
            sync.close()

    assert go(scenario()) == [0, 1, 2]


# -- blobs ------------------------------------------------------------------------------------


def test_spilled_payloads_round_trip_and_are_fetched_off_the_loop(
    aurl: str, tmp_path: Path
) -> None:
    """A payload over the threshold goes to the blob store (in a worker thread) and comes
    back already fetched and checked: reading it does no I/O on the loop."""
    blobs = (tmp_path / "blobs").as_uri()
    big = {"text": "x" * 5000}

    async def scenario() -> None:
        async with await ae.open_async_store(aurl, blobs=blobs, spill_threshold=1024) as store:
            await store.append("s", [_ev(payload=big), _ev(1)])
            events = [e async for e in store.read("s")]
            assert events[0].payload_ref is not None and events[1].payload_ref is None
            assert events[0].payload_loaded  # fetched before it was yielded
            assert events[0].payload == big
            assert (await ae.integrity.averify_stream(store, "s")).ok

    go(scenario())


def test_a_missing_blob_raises_where_the_payload_is_read(tmp_path: Path) -> None:
    """A spilled payload whose blob is gone still yields its event; reading ``payload``
    raises BlobMissing, as in the blocking store."""
    folder = tmp_path / "blobs"
    url = f"sqlite:///{tmp_path / 'b.db'}"

    async def scenario() -> None:
        async with await ae.open_async_store(
            url, blobs=folder.as_uri(), spill_threshold=64
        ) as store:
            await store.append("s", [_ev(payload={"t": "y" * 500})])
            for f in folder.rglob("*"):
                if f.is_file():
                    f.unlink()
            e = await anext(store.read("s"))
            with pytest.raises(ae.BlobMissing):
                _ = e.payload

    go(scenario())


# -- the a-twins ---------------------------------------------------------------------------------


def test_async_twins_agree_with_the_blocking_ones(aurl: str) -> None:
    """arecover, asnapshot, areplay and averify_stream give the results of recover,
    snapshot, replay and verify_stream on the same store."""
    proj = RecoveryStateProjection()

    async def scenario() -> None:
        async with await ae.open_async_store(aurl) as store:
            for i in range(30):
                await store.append(
                    "agent",
                    [ae.NewEvent(type="task.created", module="m", payload={"task_id": f"t{i}"})],
                )
            rep = await ae.arecover(store, "agent", proj, snapshots=store.snapshots)
            assert rep.ok and rep.version == 30 and str(rep.source) == "events"
            snap = await ae.asnapshot(store, "agent", proj)
            assert snap is not None and snap.at_version == 30
            again = await ae.arecover(store, "agent", proj, snapshots=store.snapshots)
            assert str(again.source) == "snapshot" and again.replayed == 0
            assert again.state == rep.state
            capped = await ae.areplay(store, "agent", lambda s, e: s + 1, 0, max_replay=7)
            assert capped.capped and capped.state == 7
            v = await ae.integrity.averify_stream(store, "agent")
            assert v.ok and v.events_checked == 30
            if not aurl.startswith("memory"):
                with ae.open_store(aurl) as sync:
                    srep = ae.recover(sync, "agent", proj, snapshots=sync.snapshots)
                    assert (srep.state, srep.version, srep.source) == (
                        again.state,
                        again.version,
                        again.source,
                    )
                    assert ae.integrity.verify_stream(sync, "agent").ok

    go(scenario())


def test_averify_stream_reports_tampering(tmp_path: Path) -> None:
    """averify_stream finds an edited payload (a hash mismatch) like verify_stream."""
    import sqlite3

    url = f"sqlite:///{tmp_path / 't.db'}"

    async def scenario() -> Any:
        async with await ae.open_async_store(url) as store:
            await store.append("s", [_ev(i) for i in range(3)])
            conn = sqlite3.connect(tmp_path / "t.db")
            with conn:
                conn.execute("UPDATE ares_events SET payload = ? WHERE version = 2", (b'{"n":99}',))
            conn.close()
            return await ae.integrity.averify_stream(store, "s")

    rep = go(scenario())
    assert not rep.ok and {f.kind for f in rep.findings} == {"hash_mismatch"}


# -- cancellation and close -----------------------------------------------------------------------


def test_cancelled_tasks_leave_the_store_usable(aurl: str) -> None:
    """Cancelling tasks in the middle of appends, reads and waits raises CancelledError in
    them only; the store keeps working and its chains verify."""

    async def scenario() -> None:
        async with await ae.open_async_store(aurl) as store:
            await store.append("s", [_ev(i) for i in range(20)])

            async def reader() -> None:
                while True:
                    async for _ in store.read_all():
                        await asyncio.sleep(0)

            async def writer(k: int) -> None:
                i = 0
                while True:
                    await store.append(f"w{k}", [_ev(i)])
                    i += 1

            tasks = [asyncio.create_task(reader()), asyncio.create_task(store.wait_for(2**62, 60))]
            tasks += [asyncio.create_task(writer(k)) for k in range(4)]
            await asyncio.sleep(0.3)
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert [type(r).__name__ for r in results] == ["CancelledError"] * len(tasks)
            for k in range(4):
                v = await store.stream_version(f"w{k}")
                await store.append(f"w{k}", [_ev(-1)], expected_version=v)
                assert (await ae.integrity.averify_stream(store, f"w{k}")).ok
            assert [e.version async for e in store.read("s")] == list(range(1, 21))

    go(scenario())


@pytest.mark.slow  # a race, many rounds
def test_a_cancelled_append_settles_however_many_cancels_come(aurl: str) -> None:
    """An append cancelled twice or three times (an outer timeout and a task group): once
    its task has CancelledError, the append has committed or not, and nothing of it
    happens later (the stream is the same half a second on); re-appending the same events
    lands them exactly once."""

    async def scenario() -> None:
        async with await ae.open_async_store(aurl) as store:
            late = []
            for i in range(24):
                sid, evs = f"c{i}", [_ev(k) for k in range((1, 40, 400)[i % 3])]
                task = asyncio.create_task(store.append(sid, evs))
                await asyncio.sleep((0, 0.0005, 0.002, 0.005)[i % 4])
                for _ in range(2 + i % 2):
                    task.cancel()
                    await asyncio.sleep(0)
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                seen = await store.stream_version(sid)
                await asyncio.sleep(0.5 if i % 6 == 0 else 0.05)
                late += [sid] if await store.stream_version(sid) != seen else []
                await store.append(sid, evs)  # lands now, or is the duplicate it was
                assert await store.stream_version(sid) == len(evs)
            assert late == []

    go(scenario())


def test_close_with_tasks_in_flight_gives_them_store_closed(aurl: str) -> None:
    """close() while tasks append, read, wait and subscribe: each task ends with success
    or StoreClosed (never a hang, never another error), and every later call raises
    StoreClosed."""

    async def scenario() -> None:
        store = await ae.open_async_store(aurl)
        await store.append("s", [_ev()])

        async def writer(k: int) -> None:
            while True:
                await store.append(f"w{k}", [_ev()])

        async def reader() -> None:
            while True:
                async for _ in store.read_all():
                    pass

        async def subscriber() -> None:
            async for _ in store.subscribe(0):
                pass

        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(writer(k)) for k in range(3)]
        tasks += [asyncio.create_task(reader()), asyncio.create_task(subscriber())]
        tasks.append(asyncio.create_task(store.wait_for(2**62, 60)))
        await asyncio.sleep(0.2)
        await asyncio.wait_for(store.close(), 30)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        assert [type(r).__name__ for r in results] == ["StoreClosed"] * len(tasks)
        for call in (
            lambda: store.append("s", [_ev()]),
            lambda: store.head("s"),
            store.last_position,
            lambda: store.wait_for(0, 0.01),
        ):
            with pytest.raises(ae.StoreClosed):
                await call()
        with pytest.raises(ae.StoreClosed):
            store.read("s")
        await store.close()  # idempotent

    go(scenario())


# -- the journal on the async store -----------------------------------------------------------


def test_async_journal_on_the_async_store_replays_without_calling(aurl: str) -> None:
    """An AsyncJournal over an AsyncEventStore journals model and tool calls, and a
    reopened run answers them from the log without awaiting the model or the tool; the
    run's chain verifies and the blocking Journal.inspect sees the same run."""
    calls: list[str] = []

    async def model(messages: Any, params: Any) -> ae.ModelReply:
        await asyncio.sleep(0)
        calls.append("model")
        return ae.ModelReply({"text": messages[-1]["content"].upper()}, {"total_tokens": 5})

    async def tool(args: Any, key: str) -> dict[str, Any]:
        calls.append(key)
        return {"ticket": key}

    async def loop(store: ae.AsyncEventStore) -> list[Any]:
        j = await ae.AsyncJournal.open(store, "run-1", code_revision="r1", snapshot_every=3)
        out = []
        for i in range(3):
            out.append(await j.model_call([{"content": f"step {i}"}], call=model))
            out.append(await j.tool_call("file", {"i": i}, call=tool))
            await j.patch("i", i)
        await j.complete("done")
        assert j.status == "completed"
        return out

    async def scenario() -> None:
        async with await ae.open_async_store(aurl) as store:
            first = await loop(store)
            made = list(calls)
            again = await loop(store)
            assert again == first and calls == made
            info = await ae.AsyncJournal.inspect(store, "run-1")
            assert info.status == "completed" and len(info.steps) == 9
            assert (await ae.integrity.averify_stream(store, "run-1")).ok

    go(scenario())
    assert calls.count("model") == 3


def test_async_journal_coroutine_reconciler_settles_an_in_doubt_call() -> None:
    """A tool call requested but never answered is in doubt; a coroutine reconciler is
    awaited on the loop and its answer recorded, and the tool is not called again."""

    async def scenario() -> None:
        async with await ae.open_async_store("memory://") as store:
            j = await ae.AsyncJournal.open(store, "run-d")

            async def dies(args: Any, key: str) -> Any:
                raise asyncio.CancelledError  # the process "died" in the call

            with pytest.raises(asyncio.CancelledError):
                await j.tool_call("pay", {"eur": 5}, call=dies)
            again = await ae.AsyncJournal.open(store, "run-d")
            asked: list[str] = []

            async def reconcile(key: str) -> tuple[bool, Any]:
                await asyncio.sleep(0)
                asked.append(key)
                return True, {"paid": True}

            async def never(args: Any, key: str) -> Any:
                raise AssertionError("the tool must not run again")

            got = await again.tool_call("pay", {"eur": 5}, call=never, reconcile=reconcile)
            assert got == {"paid": True} and asked == ["run-d:1"]
            assert again.stats.tool_calls_reconciled == 1

    go(scenario())


# -- no blocking on the loop -------------------------------------------------------------------


def test_sqlite_io_runs_off_the_event_loop(tmp_path: Path) -> None:
    """The SQLite recorder's appends and reads run on the store's worker threads (one
    writer), never on the event loop's thread."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    seen: dict[str, set[str]] = {"append": set(), "read": set()}

    async def scenario() -> str:
        store = await ae.open_async_store(url)
        sync = store.recorder.sync  # type: ignore[attr-defined]
        append, read = sync.append, sync.read

        def spy(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(*a: Any) -> Any:
                seen[kind].add(threading.current_thread().name)
                return fn(*a)

            return wrapped

        sync.append, sync.read = spy("append", append), spy("read", read)
        try:
            await asyncio.gather(*(store.append(f"s{k}", [_ev(k)]) for k in range(20)))
            for k in range(5):
                assert [e.version async for e in store.read(f"s{k}")] == [1]
        finally:
            await store.close()
        return threading.current_thread().name

    loop_thread = go(scenario())
    assert loop_thread not in seen["append"] | seen["read"]
    assert len(seen["append"]) == 1 and next(iter(seen["append"])).startswith("ares-events-write")
    assert all(name.startswith("ares-events-read") for name in seen["read"])
