"""Cell-store behaviour beyond the shared suites: the partition hash is stable, the cell
map is fixed at init, cross-cell multi-stream appends are refused whole, erasure counts a
blob's references in every cell, secrets stay out of messages, and the journal, recovery
and the LangGraph saver run on a cell store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypedDict
from urllib.parse import quote, unquote, urlsplit

import pytest
from langgraph.graph.message import add_messages

import ares_events as ae
from ares_events.core.recorder import backend_of
from ares_events.errors import ConfigError, CrossCellError
from ares_events.integrity import audit
from ares_events.stores.cells import CellMap, pack, partition_of, unpack
from ares_events.stores.cells.layout import parse_cells_url
from tests.fixtures import servers
from tests.fixtures.fix_cells import cells_url

pytestmark = pytest.mark.postgres


class Chat(TypedDict):
    """The LangGraph state of the saver test."""

    messages: Annotated[list[Any], add_messages]


def test_partition_of_is_a_stable_function_of_the_stream_id() -> None:
    """The partition hash is the documented blake3 prefix: fixed vectors, any P."""
    assert [partition_of(s, 64) for s in ("agent-7", "run-42", "", "ü/1")] == [
        partition_of(s, 64) for s in ("agent-7", "run-42", "", "ü/1")
    ]
    import blake3

    d = blake3.blake3(b"ares-events/partition/v1\x00" + b"agent-7").digest(8)
    assert partition_of("agent-7", 1000) == int.from_bytes(d, "big") % 1000
    assert {partition_of(f"s{i}", 12) for i in range(500)} == set(range(12))


def test_cursor_packing_round_trips_and_refuses_foreign_values() -> None:
    """pack/unpack round-trip; a cursor of more cells or a negative one is InvalidEvent."""
    parts = [5, 2**63 - 1, 0]
    assert unpack(pack(parts), 3) == parts
    with pytest.raises(ae.InvalidEvent):
        unpack(pack([1, 2, 3, 4]), 3)
    with pytest.raises(ae.InvalidEvent):
        unpack(-1, 3)


def test_cell_map_json_round_trip_and_bad_maps() -> None:
    """A recorded map reads back; a map this build cannot read is a ConfigError."""
    m = CellMap.new(8, ["a_1", "a_2", "a_3"])
    assert CellMap.from_json(m.to_json(), "here") == m
    assert m.assignment == (0, 1, 2, 0, 1, 2, 0, 1)
    for bad in ("{}", "[]", '{"v": 2, "partitions": 1, "cells": ["x"], "assignment": [0]}',
                '{"v": 1, "partitions": 2, "cells": ["x"], "assignment": [0, 1]}'):  # fmt: skip
        with pytest.raises(ConfigError):
            CellMap.from_json(bad, "here")


def test_url_errors_name_the_parameter_and_never_the_password() -> None:
    """Bad partitions/cells/prefix/schema are ConfigErrors naming the parameter; the
    password is never in a message or a repr."""
    pw = "s3cr3t-pw"
    for query, word in [
        ("partitions=0", "partitions"),
        ("cells=x", "cells"),
        ("cells=5&partitions=4", "exceed"),
        ("prefix=Bad-Name", "prefix"),
        ("schema=public", "schema"),
    ]:
        with pytest.raises(ConfigError) as ei:
            ae.open_store(f"pgcells://root:{pw}@127.0.0.1:1/db?{query}")
        assert word in str(ei.value) and pw not in str(ei.value)
    cfg = parse_cells_url(ae.core.url.StoreURL.parse(f"pgcells://root:{pw}@h:5/db?cells=2"))
    assert pw not in repr(cfg) and pw in unquote(cfg.url_of(0, "x"))


def test_the_cell_map_is_fixed_at_init(request: pytest.FixtureRequest) -> None:
    """Reopening with other partitions or cells is refused before anything is written;
    repeating them, or leaving them out, opens the store as created."""
    url = cells_url("schemas", request, partitions=8, cells=2)
    with ae.open_store(url) as store:
        store.append("a", [ae.NewEvent(type="t.x", module="m")])
    for other in ("partitions=9", "cells=3"):
        changed = (
            url.replace("partitions=8", other)
            if "partitions" in other
            else url.replace("cells=2", other)
        )
        with pytest.raises(ConfigError) as ei:
            ae.open_store(changed)
        assert "fixed at init" in str(ei.value)
    bare = url.replace("cells=2&partitions=8&", "")
    with ae.open_store(bare) as store:
        assert _cells(store).cell_map.partitions == 8 and len(_cells(store).cells) == 2
        assert store.stream_version("a") == 1


def _cells(store: ae.EventStore) -> Any:
    """The cell store's recorder (CellsRecorder), under the archive reader."""
    return backend_of(store.recorder)


def _two_streams_in_different_cells(store: ae.EventStore) -> tuple[str, str]:
    rec = _cells(store)
    first = "s0"
    other = next(f"s{i}" for i in range(1, 200) if rec.cell_index(f"s{i}") != rec.cell_index(first))
    return first, other


def test_append_many_across_cells_is_refused_whole(request: pytest.FixtureRequest) -> None:
    """append_many over streams of two cells raises CrossCellError naming the cells and
    writes nothing; within one cell it is atomic as on any store."""
    with ae.open_store(cells_url("schemas", request)) as store:
        a, b = _two_streams_in_different_cells(store)

        def ev() -> ae.NewEvent:
            return ae.NewEvent(type="t.x", module="m")

        with pytest.raises(CrossCellError) as ei:
            store.append_many([(a, [ev()], ae.NO_STREAM), (b, [ev()], ae.NO_STREAM)])
        assert len(ei.value.cells) == 2 and "nothing was written" in str(ei.value)
        assert store.stream_version(a) == store.stream_version(b) == 0
        rec = _cells(store)
        same = next(f"s{i}" for i in range(1, 200) if rec.cell_index(f"s{i}") == rec.cell_index(a))
        res = store.append_many([(a, [ev()], ae.NO_STREAM), (same, [ev()], ae.NO_STREAM)])
        assert [r.version for r in res] == [1, 1]


def test_erasure_counts_blob_references_in_every_cell(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two streams in different cells share one spilled blob: erasing one keeps the blob
    (the other cell still references it), erasing both removes it; chains stay valid."""
    blobs = f"file://{tmp_path / 'blobs'}"
    with ae.open_store(cells_url("schemas", request), blobs=blobs, spill_threshold=64) as store:
        a, b = _two_streams_in_different_cells(store)
        big = {"text": "x" * 500}
        store.append(a, [ae.NewEvent(type="t.x", module="m", payload=big)])
        store.append(b, [ae.NewEvent(type="t.x", module="m", payload=big)])

        def files() -> list[Path]:
            found = (tmp_path / "blobs").rglob("*")
            return sorted(p for p in found if p.is_file() and p.name != ".ares-owner")

        stored = files()
        assert len(stored) == 1  # content-addressed: one blob for both
        ae.erase(store, a, 1, reason="test", by="test")
        # (the erasure records spill too, at this threshold: look at the shared blob only)
        assert stored[0] in files() and next(store.read(b)).payload == big
        ae.erase(store, b, 1, reason="test", by="test")
        assert stored[0] not in files()
        assert ae.integrity.audit(store, deep=True).ok


def test_journal_and_recovery_on_a_cell_store(request: pytest.FixtureRequest) -> None:
    """The run journal records and fast-forwards a run; recover() rebuilds from a
    snapshot plus the tail, on a cell store."""
    from ares_events.agents.journal import Journal, ModelReply

    calls = {"n": 0}

    def llm(messages: Any, params: Any) -> ModelReply:
        calls["n"] += 1
        return ModelReply(f"answer {messages[-1]['content']}", {"total_tokens": 10})

    with ae.open_store(cells_url("schemas", request)) as store:
        for run in ("run-1", "run-2", "run-3"):
            j = Journal(store, run)
            for q in ("a", "b"):
                j.model_call([{"role": "user", "content": q}], {}, call=llm)
            j.complete({"ok": True})
        again = Journal(store, "run-2")
        again.model_call([{"role": "user", "content": "a"}], {}, call=llm)
        assert calls["n"] == 6 and again.stats.model_calls_from_log == 1
        proj = ae.projections.RecoveryStateProjection()
        ae.snapshot(store, "run-1", proj)
        rec = ae.recover(store, "run-1", proj, snapshots=store.snapshots)
        assert rec.source == "snapshot" and not rec.findings


def test_langgraph_saver_on_a_cell_store(request: pytest.FixtureRequest) -> None:
    """A LangGraph graph keeps its threads on a cell store (one stream per thread)."""
    pytest.importorskip("langgraph")

    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import START, StateGraph

    from ares_events.integrations.langgraph import AresSaver

    class Chat(TypedDict):
        messages: Annotated[list[Any], add_messages]

    def bot(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"you said: {state['messages'][-1].content}")]}

    builder = StateGraph(Chat)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    url = cells_url("schemas", request)
    saver = AresSaver.from_url(url)
    try:
        graph = builder.compile(checkpointer=saver)
        for t in ("t1", "t2", "t3"):
            config: Any = {"configurable": {"thread_id": t}}
            for text in ("hello", "again"):
                chat: Any = {"messages": [HumanMessage(content=text)]}
                graph.invoke(chat, config)
            assert len(graph.get_state(config).values["messages"]) == 4
    finally:
        saver.close()
    with ae.open_store(url) as store:
        assert audit(store).ok
        cells = {_cells(store).cell_index(sid) for sid, _ in store.streams()}
        assert len(cells) >= 1


def test_secrets_stay_out_of_reprs_and_errors(request: pytest.FixtureRequest) -> None:
    """The password of a cell-store URL is in no repr, describe() or error message."""
    url = cells_url("schemas", request)
    pw = servers.TEST_PASSWORD
    with ae.open_store(url) as store:
        texts = [repr(store), store.url, repr(store.recorder), store.recorder.describe()]
        texts += [repr(c) for c in _cells(store).cells]
        a, b = _two_streams_in_different_cells(store)
        try:
            store.append_many(
                [
                    (a, [ae.NewEvent(type="t.x", module="m")], ae.ANY),
                    (b, [ae.NewEvent(type="t.x", module="m")], ae.ANY),
                ]
            )
        except CrossCellError as exc:
            texts.append(str(exc))
    assert all(pw not in t for t in texts)


@pytest.mark.parametrize("kind", ["schemas", "servers", "citus"])
def test_subscribe_follows_every_cell(kind: str, request: pytest.FixtureRequest) -> None:
    """subscribe() on a cell store yields the events appended to streams of every cell,
    each once, as they commit (blocking face, and the asyncio face on the same store)."""
    import asyncio
    import threading

    url = cells_url(kind, request)
    with ae.open_store(url) as store:
        rec = _cells(store)
        sids = [next(f"s{i}" for i in range(500) if rec.cell_index(f"s{i}") == c) for c in range(3)]
        got: list[tuple[str, int]] = []
        ready = threading.Event()

        def follow() -> None:
            sub = store.subscribe(after_position=0)
            ready.set()
            for e in sub:
                got.append((e.stream_id, e.version))
                if len(got) == 9:
                    break

        t = threading.Thread(target=follow)
        t.start()
        ready.wait(30)
        for n in range(3):
            for sid in sids:
                store.append(sid, [ae.NewEvent(type="t.x", module="m", payload={"n": n})])
        t.join(60)
        assert sorted(got) == sorted((sid, v) for sid in sids for v in (1, 2, 3))

    async def follow_async() -> list[tuple[str, int]]:
        astore = await ae.open_async_store(url)
        try:
            seen: list[tuple[str, int]] = []
            async for e in astore.subscribe(after_position=0):
                seen.append((e.stream_id, e.version))
                if len(seen) == 9:
                    break
            return seen
        finally:
            await astore.close()

    assert sorted(asyncio.run(follow_async())) == sorted(got)


def test_missing_citus_is_reported_never_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Citus the Citus tests fail with one line saying how to install it; they
    are never skipped."""
    from tests.fixtures import cell_servers

    monkeypatch.setattr(cell_servers, "citus_installed", lambda: False)
    with pytest.raises(pytest.fail.Exception) as failed:
        cell_servers.require_citus()
    assert "build.sh" in str(failed.value)


def test_opening_without_create_never_creates_or_writes(request: pytest.FixtureRequest) -> None:
    """create=False on a missing cell store is StoreNotFound and creates nothing; a plain
    store in the first cell's schema is not taken for a cell store."""
    url = cells_url("schemas", request)
    with pytest.raises(ae.StoreNotFound):
        ae.open_store(url, create=False)
    with pytest.raises(ae.StoreNotFound):
        ae.open_store(url, create=False)  # still nothing there
    cfg = parse_cells_url(ae.core.url.StoreURL.parse(url))
    with ae.open_store(cfg.url_of(0, cfg.name_of(0))) as plain:
        plain.append("x", [ae.NewEvent(type="t.x", module="m")])
    with pytest.raises(ae.StoreNotFound) as ei:
        ae.open_store(url, create=False)
    assert "not a cell store" in str(ei.value)


@pytest.mark.parametrize("kind", ["schemas", "citus"])
def test_a_cell_whose_own_bound_comes_out_lower_never_makes_the_merge_skip(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """On one clock the merge reads every cell below the top it read first, never below a
    bound a cell computes afresh: that one can come out lower (an xid of another database
    that ended between a statement's snapshot and its activity check bounds it), and a
    merge that took it would step over that cell's rows for good while yielding later
    rows of the others. Here one cell's own reads are made to see nothing at all."""
    from psycopg import sql

    from ares_events.stores.postgres.sql import ORDER_BY_POSITION, SELECT_ALL_BELOW, render_for

    url = cells_url(kind, request)
    with ae.open_store(url) as store:
        rec = _cells(store)
        sids = [next(f"s{i}" for i in range(500) if rec.cell_index(f"s{i}") == c) for c in range(3)]
        for n in range(3):
            for sid in sids:
                store.append(sid, [ae.NewEvent(type="t.x", module="m", payload={"n": n})])
        cell = rec.cells[rec.cell_index(sids[0])]
        # The cell's own read (its bound a parameter, as every clock passes it) sees
        # nothing at all.
        nothing = render_for(
            sql.Identifier(cell.schema),
            SELECT_ALL_BELOW.replace("position < %s", "position < %s AND false")
            + ORDER_BY_POSITION,
        )
        cell.clock.all = nothing  # its own bound: nothing is final yet
        assert list(cell.read_all(0, None)) == []
        merged = [(e.stream_id, e.version) for e in store.read_all(0)]
        assert sorted(merged) == sorted((sid, v) for sid in sids for v in (1, 2, 3))
        assert [e.position for e in store.read_all(0)] == sorted(
            e.position for e in store.read_all(0)
        )


@pytest.mark.parametrize("kind", ["schemas", "citus"])
def test_a_merged_read_after_an_append_waits_for_it_to_be_final(
    kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cells on one clock: a transaction of the clock's database with a lower position is
    in flight when the append commits; the merged ``read_all`` takes its top from the
    cells' ``last_position``, and the cell that wrote waits until its append is final,
    so the read sees it (the wait is lengthened far past the other transaction's end: no
    timing precondition)."""
    import threading
    import time

    import psycopg

    from ares_events.stores.postgres import recorder

    monkeypatch.setattr(recorder, "_CATCH_UP", 60.0)
    url = cells_url(kind, request)
    clock_db = "postgresql://" + url.split("://", 1)[1].split("?", 1)[0]
    blocker = psycopg.connect(clock_db)
    blocker.execute("SELECT pg_current_xact_id()")

    def end_later() -> None:
        time.sleep(0.2)
        blocker.commit()

    ender = threading.Thread(target=end_later)
    try:
        with ae.open_store(url) as store:
            res = store.append("s", [ae.NewEvent(type="t.x", module="m")])
            ender.start()
            assert [e.position for e in store.read_all()] == [res.position]
    finally:
        if ender.is_alive():
            ender.join()
        blocker.close()


def test_a_citus_cell_is_written_only_through_its_citus_url(request: pytest.FixtureRequest) -> None:
    """A citus:// store's cells are distributed schemas whose positions only the Citus
    clock orders: the same store opened as pgcells://, or one cell as
    postgresql://...?schema=, is a ConfigError pointing at citus:// (written there, an
    event took a worker's transaction id, below what readers had passed, and a reader
    resuming from its position never saw it). Nothing is written; the password is not
    shown."""
    from ares_events.core.url import StoreURL

    url = cells_url("citus", request)
    with ae.open_store(url) as store:
        store.append("k0", [ae.NewEvent(type="t.x", module="m", payload={})])
        before = [(e.stream_id, e.version, e.position) for e in store.read_all(0)]
    cfg = parse_cells_url(StoreURL.parse(url))
    netloc = urlsplit(url).netloc
    for other in (
        "pgcells://" + url.removeprefix("citus://"),
        f"postgresql://{netloc}/postgres?schema={cfg.name_of(0)}",
    ):
        with pytest.raises(ConfigError, match="citus://") as ei:
            ae.open_store(other)
        assert "distributed schema" in str(ei.value)
        assert servers.TEST_PASSWORD not in str(ei.value)
    with ae.open_store(url) as store:
        assert [(e.stream_id, e.version, e.position) for e in store.read_all(0)] == before
        assert audit(store).ok


def test_libpq_options_reach_every_citus_cell(
    request: pytest.FixtureRequest, citus_ports: list[int]
) -> None:
    """A citus:// URL's options= reaches each cell's sessions, merged with the setting
    Citus placement needs, which comes last: a user's attempt to turn it off loses, and
    the new cells are distributed schemas on the workers as usual."""
    from ares_events.stores.cells.citus import cell_placements

    opts = quote("-c work_mem=77MB -c lock_timeout=1234 -c citus.enable_schema_based_sharding=off")
    with ae.open_store(cells_url("citus", request, cells=2, options=opts)) as store:
        for cell in _cells(store).cells:
            with cell.connection() as conn:
                shown = [
                    conn.execute(f"SHOW {name}").fetchone()[0]
                    for name in ("work_mem", "lock_timeout", "citus.enable_schema_based_sharding")
                ]
            assert shown == ["77MB", "1234ms", "on"]
        placed = {p.cell: p.port for p in cell_placements(store)}
        assert set(placed) == set(_cells(store).cell_map.cells)
        assert set(placed.values()) <= set(citus_ports[1:])
