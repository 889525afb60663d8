"""The LangGraph checkpointer beyond the official suite: verified before decoded (a
tampered checkpoint, value or blob is refused before the serializer sees a byte), no
pickle, a real graph killed with SIGKILL and resumed, deltas that reproduce the state of
a reference saver, and retention that leaves no payload behind and records it."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

import ares_events as ae
from ares_events.core.events import ERASURE_STREAM
from ares_events.errors import BlobCorrupted, ChainIntegrityError
from ares_events.integrations.langgraph import AresSaver, AsyncAresSaver, stream_of
from tests.children.langgraph_fork_child import checkpoint
from tests.fixtures.tier import QUICK

ROOT = Path(__file__).resolve().parents[2]


class RecordingSerde(JsonPlusSerializer):
    """The default serializer, counting what it is asked to decode."""

    def __init__(self) -> None:
        super().__init__(pickle_fallback=False)
        self.loads: list[str] = []

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        self.loads.append(data[0])
        return super().loads_typed(data)


def _cfg(tid: str, cid: str | None = None, ns: str = "") -> Any:
    conf: dict[str, Any] = {"thread_id": tid, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def _put(saver: AresSaver, tid: str, values: dict[str, Any], parent: str | None = None) -> str:
    cp = checkpoint()
    cp["channel_values"] = values
    cp["channel_versions"] = {k: saver.get_next_version(None, None) for k in values}
    saver.put(_cfg(tid, parent), cp, {"source": "loop", "step": 0}, cp["channel_versions"])
    return cp["id"]


def _tamper(db: Path, sql_where: str) -> None:
    """Change one character inside a stored payload (still valid JSON and base64)."""
    con = sqlite3.connect(db)
    try:
        pos, payload = con.execute(
            f"SELECT position, payload FROM ares_events WHERE {sql_where} ORDER BY position LIMIT 1"
        ).fetchone()
        text = payload.decode()
        mark = next(m for m in ('"b":"', '["msgpack","', '"step":') if m in text)
        i = text.index(mark) + len(mark) + 1
        new = text[:i] + ("B" if text[i] != "B" else "C") + text[i + 1 :]
        con.execute("UPDATE ares_events SET payload = ? WHERE position = ?", (new.encode(), pos))
        con.commit()
    finally:
        con.close()


def test_tampered_channel_value_is_refused_before_decoding(tmp_path: Path) -> None:
    """One character changed in a stored channel value: a fresh saver refuses the thread
    with a hash_mismatch finding and never calls the serializer."""
    db = tmp_path / "t.db"
    with AresSaver.from_url(f"sqlite:///{db}") as saver:
        _put(saver, "t1", {"msgs": ["hello", "world"], "other": {"a": 1}})
    _tamper(db, "type = 'lg.value'")
    serde = RecordingSerde()
    with AresSaver.from_url(f"sqlite:///{db}", serde=serde) as saver:
        with pytest.raises(ChainIntegrityError) as err:
            saver.get_tuple(_cfg("t1"))
        assert [f.kind for f in err.value.findings] == ["hash_mismatch"]
        with pytest.raises(ChainIntegrityError):
            list(saver.list(_cfg("t1")))
    assert serde.loads == []


def test_tampered_checkpoint_is_refused_before_decoding(tmp_path: Path) -> None:
    """A changed byte in a checkpoint's metadata: refused, nothing decoded, and the
    store's audit reports the same event."""
    db = tmp_path / "t.db"
    with AresSaver.from_url(f"sqlite:///{db}") as saver:
        _put(saver, "t1", {"x": 1})
    _tamper(db, "type = 'lg.checkpoint'")
    serde = RecordingSerde()
    with (
        AresSaver.from_url(f"sqlite:///{db}", serde=serde) as saver,
        pytest.raises(ChainIntegrityError),
    ):
        saver.get_tuple(_cfg("t1"))
    assert serde.loads == []
    with ae.open_store(f"sqlite:///{db}") as store:
        report = ae.integrity.audit(store)
        assert {f.kind for f in report.findings} == {"hash_mismatch"}


def test_tampered_blob_is_refused_before_decoding(tmp_path: Path) -> None:
    """A value that spilled to the blob store, changed there: BlobCorrupted, nothing
    decoded."""
    db = tmp_path / "t.db"
    url = f"sqlite:///{db}"
    big = "screenshot:" + "x" * 5000
    with AresSaver.from_url(url, spill_threshold=1024) as saver:
        _put(saver, "t1", {"image": big, "small": 1})
        assert saver.get_tuple(_cfg("t1")).checkpoint["channel_values"]["image"] == big  # type: ignore[union-attr]
    blobs = [p for p in Path(f"{db}.blobs").rglob("*") if p.is_file() and p.name[0] != "."]
    assert len(blobs) == 1
    data = bytearray(blobs[0].read_bytes())
    data[len(data) // 2] ^= 0x01
    blobs[0].chmod(0o644)
    blobs[0].write_bytes(bytes(data))
    serde = RecordingSerde()
    with AresSaver.from_url(url, serde=serde) as saver, pytest.raises(BlobCorrupted):
        saver.get_tuple(_cfg("t1"))
    assert serde.loads == []


def test_keyed_chain_refuses_a_rehashed_edit(tmp_path: Path) -> None:
    """In keyed mode an edit whose hash was recomputed without the key is refused."""
    from ares_events.chain import header_bytes, link_hash, payload_digest

    db = tmp_path / "t.db"
    key = "11" * 32
    with AresSaver.from_url(f"sqlite:///{db}", chain_key=key) as saver:
        _put(saver, "t1", {"x": "secret plan"})
    _tamper(db, "type = 'lg.value'")
    con = sqlite3.connect(db)
    row = con.execute(
        "SELECT position, stream_id, version, event_id, type, module, payload, metadata,"
        " recorded_at, prev_hash FROM ares_events WHERE type = 'lg.value'"
    ).fetchone()
    header = header_bytes(
        row[1], row[2], row[3], row[4], row[5], row[7], row[8],
        payload_digest(row[6]).hex(), len(row[6]),
    )  # fmt: skip
    con.execute(
        "UPDATE ares_events SET hash = ? WHERE position = ?", (link_hash(row[9], header), row[0])
    )
    con.commit()
    con.close()
    serde = RecordingSerde()
    with (
        AresSaver.from_url(f"sqlite:///{db}", chain_key=key, serde=serde) as saver,
        pytest.raises(ChainIntegrityError),
    ):
        saver.get_tuple(_cfg("t1"))
    assert serde.loads == []


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.write_text, (Path(self.path), "unpickled"))


def test_default_serializer_never_unpickles(tmp_path: Path) -> None:
    """A verified value stored as ``pickle`` is refused by the default serializer: the
    payload's code never runs."""
    db = tmp_path / "t.db"
    marker = tmp_path / "marker"
    with AresSaver.from_url(f"sqlite:///{db}") as saver:
        _put(saver, "t1", {"x": 1})
        evil = pickle.dumps(_Boom(str(marker)))
        import base64

        d = "0" * 32
        saver.store.append(
            stream_of("t1"),
            [
                ae.NewEvent(
                    type="lg.value",
                    module="langgraph",
                    payload={"d": d, "t": "pickle", "b": base64.b64encode(evil).decode()},
                    metadata={"d": d},
                )
            ],
        )
        cp = checkpoint()
        cp["channel_versions"] = {"x": "2"}
        saver.put(_cfg("t1", saver.get_tuple(_cfg("t1")).checkpoint["id"]), cp, {}, {})  # type: ignore[union-attr]
        # Point the new checkpoint at the pickled value (a writer with store access could).
        saver.store.append(
            stream_of("t1"),
            [
                ae.NewEvent(
                    type="lg.checkpoint",
                    module="langgraph",
                    payload={
                        "ns": "",
                        "id": "ffffffff-0000-0000-0000-000000000000",
                        "parent": None,
                        "cp": {
                            "j": {
                                "v": 1,
                                "id": "ffffffff-0000-0000-0000-000000000000",
                                "ts": "",
                                "channel_versions": {"x": "3"},
                                "versions_seen": {},
                            }
                        },
                        "md": {"j": {}},
                        "vals": {"x": d},
                    },
                )
            ],
        )
    with (
        AresSaver.from_url(f"sqlite:///{db}") as saver,
        pytest.raises(NotImplementedError, match="pickle"),
    ):
        saver.get_tuple(_cfg("t1"))
    assert not marker.exists()


# -- a real graph, killed with SIGKILL between nodes ------------------------------------------


def _child(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.children.langgraph_graph_child", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow  # a kill or race in child processes: the whole suite, not the quick tier
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_graph_killed_between_nodes_resumes_to_the_same_result(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A StateGraph with an interrupt is SIGKILLed inside its second node, resumed from
    the saver in a new process, and ends exactly as an uninterrupted run does."""
    url = (
        f"sqlite:///{tmp_path}/g.db"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    marker = tmp_path / "in-step2"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.children.langgraph_graph_child",
            url,
            "killed",
            "crash",
            str(marker),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    resumed = _child(url, "killed", "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    full = _child(url, "reference", "full")
    assert full.returncode == 0, full.stderr[-3000:]
    got = json.loads(resumed.stdout.strip().splitlines()[-1])
    want = json.loads(full.stdout.strip().splitlines()[-1])
    assert got == want == {"log": ["step1", "step2:yes", "step3"], "n": 27}
    with ae.open_store(url) as store:
        assert ae.integrity.verify_stream(store, stream_of("killed")).ok


# -- deltas reproduce the state; retention ------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def _chat_graph(saver: Any) -> Any:
    def bot(state: Chat) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=f"reply {n}", id=f"ai-{n}")]}

    g = StateGraph(Chat)
    g.add_node("bot", bot)
    g.add_edge(START, "bot")
    return g.compile(checkpointer=saver)


def _history(graph: Any, tid: str) -> list[tuple[Any, ...]]:
    return [
        (tuple((m.type, m.content, m.id) for m in s.values.get("messages", [])), s.next)
        for s in graph.get_state_history({"configurable": {"thread_id": tid}})
    ]


def test_deltas_give_the_states_a_reference_saver_gives(tmp_path: Path) -> None:
    """100 chat turns (30 in the quick tier) with add_messages: every checkpoint of the
    history equals the one InMemorySaver keeps, though each turn stores only the messages it
    added."""
    turns = 30 if QUICK else 100
    ref = _chat_graph(InMemorySaver())
    with AresSaver.from_url(f"sqlite:///{tmp_path}/c.db") as saver:
        graph = _chat_graph(saver)
        for i in range(turns):
            msg = HumanMessage(content=f"hello {i} " + "y" * 200, id=f"h-{i}")
            for g in (ref, graph):
                g.invoke({"messages": [msg]}, {"configurable": {"thread_id": "c"}})
        assert _history(graph, "c") == _history(ref, "c")
        # A fresh saver (another process, no cached list) rebuilds the same states.
    with AresSaver.from_url(f"sqlite:///{tmp_path}/c.db") as saver:
        assert _history(_chat_graph(saver), "c") == _history(ref, "c")
        values = [e for e in saver.store.read(stream_of("c")) if e.type == "lg.value"]
        stored_items = sum(len(e.payload.get("list", [])) for e in values)
        # 2 * turns messages; whole lists each turn would store turns * (turns + 1).
        assert stored_items < 2 * turns * 8


def _payloads_left(store: ae.EventStore, sid: str) -> list[int]:
    return [e.version for e in store.read(sid) if not e.payload_erased and e.type != "lg.pruned"]


def test_delete_thread_leaves_no_payload_or_blob_and_is_recorded(tmp_path: Path) -> None:
    """delete_thread erases every payload and blob of the thread, records each erasure,
    leaves other threads alone, and the audit is clean."""
    db = tmp_path / "d.db"
    url = f"sqlite:///{db}"
    with AresSaver.from_url(url, spill_threshold=1024) as saver:
        parent = None
        for i in range(3):
            parent = _put(saver, "gone", {"img": f"{i}" + "z" * 4000, "n": i}, parent)
            saver.put_writes(_cfg("gone", parent), [("n", i)], f"task-{i}")
        _put(saver, "kept", {"img": "k" + "z" * 4000})
        saver.delete_thread("gone")
        assert saver.get_tuple(_cfg("gone")) is None
        assert list(saver.list(_cfg("gone"))) == []
        assert saver.get_tuple(_cfg("kept")) is not None
        store = saver.store
        assert _payloads_left(store, stream_of("gone")) == []
        blobs = [p for p in Path(f"{db}.blobs").rglob("*") if p.is_file() and p.name[0] != "."]
        assert len(blobs) == 1  # the kept thread's
        erased = [e.version for e in store.read(stream_of("gone")) if e.payload_erased]
        records = {
            e.payload["version"]
            for e in store.read(ERASURE_STREAM)
            if e.payload["stream_id"] == stream_of("gone")
        }
        assert records == set(erased) and erased
        report = ae.integrity.audit(store, deep=True)
        assert report.ok, report.findings
        assert len(report.erased) == len(erased)
        # The thread can be used again.
        _put(saver, "gone", {"n": 99})
        assert saver.get_tuple(_cfg("gone")).checkpoint["channel_values"] == {"n": 99}  # type: ignore[union-attr]


def test_prune_keeps_the_newest_and_erases_the_rest(tmp_path: Path) -> None:
    """prune(keep_last=2) keeps the two newest checkpoints per namespace with their values
    and writes; everything else's payload is erased; a fresh saver agrees."""
    url = f"sqlite:///{tmp_path}/p.db"
    with AresSaver.from_url(url) as saver:
        ids = []
        parent = None
        for i in range(6):
            parent = _put(saver, "p", {"v": f"value {i}", "list": list(range(i + 1))}, parent)
            saver.put_writes(_cfg("p", parent), [("v", f"w{i}")], "t")
            ids.append(parent)
        saver.prune(["p"], keep_last=2)
        got = [t.checkpoint["id"] for t in saver.list(_cfg("p"))]
        assert got == ids[:-3:-1]
        left = _payloads_left(saver.store, stream_of("p"))
        # 2 checkpoints, their writes, their value "v" and their list (written again whole).
        assert len(left) == 2 * 4
        assert ae.integrity.audit(saver.store).ok
    with AresSaver.from_url(url) as saver:
        tup = saver.get_tuple(_cfg("p"))
        assert tup is not None
        assert tup.checkpoint["channel_values"] == {"v": "value 5", "list": list(range(6))}
        assert [w[2] for w in tup.pending_writes or []] == ["w5"]
        assert len(list(saver.list(_cfg("p")))) == 2


def test_async_saver_runs_a_graph(tmp_path: Path) -> None:
    """AsyncAresSaver drives a real graph and shares the thread with AresSaver."""
    import asyncio

    url = f"sqlite:///{tmp_path}/a.db"

    async def go() -> list[str]:
        async with await AsyncAresSaver.from_url(url) as saver:
            graph = _chat_graph(saver)
            for i in range(3):
                await graph.ainvoke(
                    {"messages": [HumanMessage(content=f"hi {i}", id=f"h{i}")]},
                    {"configurable": {"thread_id": "a"}},
                )
            state = await graph.aget_state({"configurable": {"thread_id": "a"}})
            return [m.content for m in state.values["messages"]]

    contents = asyncio.run(go())
    assert contents == ["hi 0", "reply 1", "hi 1", "reply 3", "hi 2", "reply 5"]
    with AresSaver.from_url(url) as saver:
        tup = saver.get_tuple(_cfg("a"))
        assert tup is not None
        assert [m.content for m in tup.checkpoint["channel_values"]["messages"]] == contents


def test_bad_arguments_are_invalid_event() -> None:
    """An empty thread id, put_writes without a checkpoint id, a bad prune strategy or
    option: InvalidEvent naming it, nothing written."""
    store = ae.open_store("memory://")
    with AresSaver(store) as saver:
        with pytest.raises(ae.errors.InvalidEvent, match="thread_id"):
            saver.get_tuple(_cfg(""))
        with pytest.raises(ae.errors.InvalidEvent, match="checkpoint_id"):
            saver.put_writes(_cfg("t"), [("a", 1)], "task")
        with pytest.raises(ae.errors.InvalidEvent, match="strategy"):
            saver.prune(["t"], strategy="keep_some")
        with pytest.raises(ae.errors.InvalidEvent, match="keep_last"):
            saver.prune(["t"], keep_last=-1)
        assert list(store.streams()) == []
    for bad in ({"max_threads": 0}, {"value_cache": -1}):
        with pytest.raises(ae.errors.InvalidEvent):
            AresSaver(store, **bad)  # type: ignore[arg-type]
    assert uuid


def test_cli_streams_and_audit_know_langgraph_threads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ares-events streams` marks LangGraph threads (and the erasure records);
    `ares-events audit` is clean on a store that holds them, pruned or not."""
    from tests.fixtures.cli_helpers import run, run_json

    url = f"sqlite:///{tmp_path}/cli.db"
    with AresSaver.from_url(url) as saver:
        parent = None
        for i in range(3):
            parent = _put(saver, "chat-1", {"n": i}, parent)
        _put(saver, "chat-2", {"n": 0})
        saver.prune(["chat-1"])
        saver.store.append("plain", [ae.NewEvent(type="x", module="m", payload={})])
    code, data = run_json(capsys, "--store", url, "streams")
    assert code == 0
    kinds = {s["stream_id"]: (s.get("kind"), s.get("thread_id")) for s in data["streams"]}
    assert kinds == {
        "langgraph/chat-1": ("langgraph thread", "chat-1"),
        "langgraph/chat-2": ("langgraph thread", "chat-2"),
        ERASURE_STREAM: ("erasure records", None),
        "plain": (None, None),
    }
    code, out, _ = run(capsys, "--store", url, "streams")
    assert code == 0 and "langgraph thread chat-1" in out
    code, report = run_json(capsys, "--store", url, "audit", "--deep")
    assert code == 0, report
    assert report["ok"] is True


def test_value_cache_gives_equal_values_and_fresh_lists(tmp_path: Path) -> None:
    """With the opt-in value_cache, get_tuple returns the same values as without, and a
    caller that appends to a returned list does not change the next read."""
    url = f"sqlite:///{tmp_path}/v.db"
    with AresSaver.from_url(url) as plain, AresSaver.from_url(url, value_cache=8) as cached:
        graph = _chat_graph(plain)
        for i in range(5):
            graph.invoke(
                {"messages": [HumanMessage(content=f"q{i}", id=f"q{i}")]},
                {"configurable": {"thread_id": "v"}},
            )
        want = plain.get_tuple(_cfg("v"))
        first = cached.get_tuple(_cfg("v"))
        assert want is not None and first is not None
        assert first.checkpoint["channel_values"] == want.checkpoint["channel_values"]
        first.checkpoint["channel_values"]["messages"].append("junk")
        again = cached.get_tuple(_cfg("v"))
        assert again is not None
        assert again.checkpoint["channel_values"] == want.checkpoint["channel_values"]


def _concat(state: list[str] | None, writes: Any) -> list[str]:
    return [*(state or []), *(x for w in writes for x in w)]


class DeltaState(TypedDict):
    items: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=3)]


def _delta_graph(saver: Any) -> Any:
    def step(state: DeltaState) -> dict[str, Any]:
        return {"items": [f"n{len(state['items'])}"]}

    g = StateGraph(DeltaState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    return g.compile(checkpointer=saver)


def test_delta_channel_history_matches_the_reference_walk(tmp_path: Path) -> None:
    """A graph with a DeltaChannel rebuilds the same state as InMemorySaver, and the
    saver's get_delta_channel_history (both faces) equals the base class's walk over
    get_tuple at every checkpoint."""
    import asyncio

    from langgraph.checkpoint.base import BaseCheckpointSaver

    ref = _delta_graph(InMemorySaver())
    with AresSaver.from_url(f"sqlite:///{tmp_path}/d.db") as saver:
        graph = _delta_graph(saver)
        cfg: Any = {"configurable": {"thread_id": "d"}}
        for i in range(8):
            for g in (ref, graph):
                g.invoke({"items": [f"in{i}"]}, cfg)
        assert graph.get_state(cfg).values == ref.get_state(cfg).values
        assert len(graph.get_state(cfg).values["items"]) == 16
        configs = [t.config for t in saver.list(cfg)]
        for c in configs:
            want = BaseCheckpointSaver.get_delta_channel_history(
                saver, config=c, channels=["items"]
            )
            assert saver.get_delta_channel_history(config=c, channels=["items"]) == want
    url = f"sqlite:///{tmp_path}/d.db"

    async def async_face() -> list[Any]:
        async with await AsyncAresSaver.from_url(url) as asaver:
            return [
                await asaver.aget_delta_channel_history(config=c, channels=["items"])
                for c in configs
            ]

    with AresSaver.from_url(url) as saver:
        want_all = [
            BaseCheckpointSaver.get_delta_channel_history(saver, config=c, channels=["items"])
            for c in configs
        ]
    assert asyncio.run(async_face()) == want_all


def test_prune_by_age_keeps_recent_checkpoints_and_the_newest(tmp_path: Path) -> None:
    """prune(older_than=...) drops the checkpoints written before the cutoff (never the
    newest of a namespace), whatever their number."""
    from datetime import UTC, datetime, timedelta

    with AresSaver.from_url(f"sqlite:///{tmp_path}/a.db") as saver:
        now = datetime.now(UTC)
        parent = None
        ids = []
        for age_days in (40, 35, 3, 1):
            cp = checkpoint()
            cp["ts"] = (now - timedelta(days=age_days)).isoformat()
            saver.put(_cfg("old", parent), cp, {"step": age_days}, {})
            parent = cp["id"]
            ids.append(cp["id"])
        saver.prune(["old"], older_than=timedelta(days=30))
        assert [t.checkpoint["id"] for t in saver.list(_cfg("old"))] == ids[:1:-1]
        # All old: the newest stays.
        cp = checkpoint()
        cp["ts"] = (now - timedelta(days=90)).isoformat()
        saver.put(_cfg("ancient"), cp, {}, {})
        saver.prune(["ancient"], older_than=timedelta(days=30))
        assert [t.checkpoint["id"] for t in saver.list(_cfg("ancient"))] == [cp["id"]]
        assert ae.integrity.audit(saver.store).ok


@pytest.mark.postgres
def test_savers_repr_names_the_store_without_its_password(postgres_url: str) -> None:
    """A saver's repr (what a log line or a traceback shows) names its store with the
    URL's password redacted, in both faces."""
    url = postgres_url
    quoted = urllib.parse.urlsplit(url).password or ""
    secrets = {quoted, urllib.parse.unquote(quoted)}
    assert len(quoted) > 4  # the test database's URL carries a password (trust auth)
    with AresSaver.from_url(url) as saver:
        text = repr(saver)
    assert text.startswith("AresSaver(") and "postgresql://" in text
    assert not any(s in text for s in secrets)

    async def async_repr() -> str:
        saver = await AsyncAresSaver.from_url(url)
        try:
            return repr(saver)
        finally:
            await saver.aclose()

    text = asyncio.run(async_repr())
    assert text.startswith("AsyncAresSaver(")
    assert not any(s in text for s in secrets)


@pytest.mark.parametrize(
    ("thread_id", "says"),
    [("", "must not be empty"), ("a\x00b", "U+0000 at offset 1"), ("x" * 300, "limit is 246")],
)
def test_bad_thread_ids_are_refused_naming_the_thread_id(
    tmp_path: Path, thread_id: str, says: str
) -> None:
    """An empty, over-long or control-character thread id is an InvalidEvent about
    ``thread_id`` (offsets and limits in the user's terms, not the stream's), and
    nothing is written."""
    from langgraph.checkpoint.base import empty_checkpoint

    url = f"sqlite:///{tmp_path}/bad.db"
    with AresSaver.from_url(url) as saver:
        cfg: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        with pytest.raises(ae.errors.InvalidEvent) as ei:
            saver.put(cfg, empty_checkpoint(), {"source": "input", "step": -1}, {})
        assert ei.value.field == "thread_id" and says in str(ei.value)
        assert list(saver.store.streams()) == []
