"""Snapshot-first recovery (recover, snapshot, Snapshotter) and the recover/snapshot CLI."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any, ClassVar

import pytest

import ares_events as ae
from ares_events.core.recorder import backend_of
from ares_events.errors import ChainIntegrityError, ReplayCapExceeded
from ares_events.projections import (
    AgentStateProjection,
    GenealogyProjection,
    Projection,
    RecoveryStateProjection,
    RunStateProjection,
)
from tests.fixtures.cli_helpers import run, run_json
from tests.fixtures.fix_backends import open_backend, run_behind_store

LIFE: list[tuple[str, dict[str, Any]]] = [
    ("session.created", {"session_id": "sess"}),
    ("task.created", {"task_id": "t{i}"}),
    ("agent.started", {"instance_id": "i-{i}"}),
    ("model.call.requested", {"step": 0, "messages_hash": "m", "params": {}}),
    ("model.responded", {"step": 0, "completion": "c{i}", "usage": {"input_tokens": 5}}),
    ("tool.call.requested", {"name": "x", "args": {"i": 0}, "idempotency_key": "run:{i}"}),
    ("tool.returned", {"idempotency_key": "run:{i}", "result": "ok"}),
    ("state.patched", {"key": "k{i}", "value": 0}),
    ("task.completed", {"task_id": "t{i}"}),
    ("agent.dead", {"cause": "kill -9"}),
    ("agent.resurrected", {"instance_id": "i-{i}b", "attempt": 0}),
    ("failover.triggered", {"reason": "r{i}"}),
    ("failover.completed", {"instance_id": "i-{i}c"}),
    ("vendor.noise", {"i": 0}),
]


def _fill(value: Any, i: int) -> Any:
    if isinstance(value, str):
        return value.replace("{i}", str(i))
    if isinstance(value, dict):
        return {k: _fill(v, i) for k, v in value.items()}
    if isinstance(value, int) and not isinstance(value, bool):
        return i
    return value


def life_events(start: int, count: int) -> list[ae.NewEvent]:
    """``count`` realistic events of an agent's life, varied by their index."""
    out = []
    for n in range(start, start + count):
        t, p = LIFE[n % len(LIFE)]
        out.append(ae.NewEvent(type=t, module="test", payload=_fill(p, n)))
    return out


def append_life(store: ae.EventStore, stream: str, count: int) -> None:
    """Append ``count`` more life events to ``stream`` in batches."""
    have = store.stream_version(stream)
    evs = life_events(have, count)
    for i in range(0, len(evs), 50):
        store.append(stream, evs[i : i + 50])


def projections() -> list[Projection]:
    """Every built-in projection."""
    return [
        AgentStateProjection(),
        RecoveryStateProjection(),
        GenealogyProjection(flap_deaths=3, flap_window_s=60),
        RunStateProjection(),
    ]


_sql = run_behind_store


def tamper_snapshot(store: ae.EventStore, backend: str, column: str, value: Any) -> None:
    """Overwrite one column of every stored snapshot (state or at_hash)."""
    if backend == "memory":
        table = store.recorder.snapshot_table  # type: ignore[attr-defined]
        idx = {"at_hash": 2, "state": 3}[column]
        for k, row in list(table.items()):
            table[k] = (*row[:idx], value, *row[idx + 1 :])
        return
    _sql(
        store,
        backend,
        f"UPDATE ares_snapshots SET {column} = ?",
        f"UPDATE {{schema}}.ares_snapshots SET {column} = %s",
        (value,),
    )


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def raw(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """(store, backend) without a cache in front: rows are edited behind the store's back."""
    with open_backend(request.param, tmp_path, request) as s:
        yield s, request.param


# -- recovery from snapshot == recovery from scratch -----------------------------------------


def test_recovery_from_snapshot_equals_recovery_from_scratch(store: ae.EventStore) -> None:
    """State and version are the same with or without a snapshot; only the tail is replayed."""
    append_life(store, "agent-1", 120)
    for p in projections():
        snap = ae.snapshot(store, "agent-1", p)
        assert snap is not None and snap.at_version == 120
    append_life(store, "agent-1", 37)
    for p in projections():
        fast = ae.recover(store, "agent-1", p, snapshots=store.snapshots)
        slow = ae.recover(store, "agent-1", p, snapshots=None)
        assert fast.state == slow.state, p.name
        assert fast.version == slow.version == 157
        assert fast.source is ae.RecoverySource.SNAPSHOT and str(fast.source) == "snapshot"
        assert (fast.replayed, fast.snapshot_version, fast.snapshot_ignored) == (37, 120, None)
        assert slow.source == "events" and slow.replayed == 157
        assert fast.ok and slow.ok and not fast.truncated and not fast.capped


def test_snapshot_at_head_replays_nothing(store: ae.EventStore) -> None:
    """A snapshot taken at the head recovers with replayed == 0, source snapshot."""
    append_life(store, "a", 20)
    ae.snapshot(store, "a", RunStateProjection())
    rec = ae.recover(store, "a", RunStateProjection(), snapshots=store.snapshots)
    assert (rec.source, rec.replayed, rec.version) == ("snapshot", 0, 20)
    assert rec.state == ae.recover(store, "a", RunStateProjection()).state


def test_empty_stream_recovers_as_empty(store: ae.EventStore) -> None:
    """A stream with no events recovers to the initial state, source empty, no snapshot taken."""
    p = AgentStateProjection()
    rec = ae.recover(store, "nobody", p, snapshots=store.snapshots)
    assert (rec.source, rec.version, rec.replayed) == ("empty", 0, 0)
    assert rec.state == p.initial() and rec.ok
    assert ae.snapshot(store, "nobody", p) is None
    assert list(store.snapshots.list()) == []


def test_snapshot_is_taken_from_latest_good_snapshot(store: ae.EventStore) -> None:
    """ae.snapshot twice with nothing new returns the stored one; later it moves forward."""
    append_life(store, "a", 10)
    p = RecoveryStateProjection()
    first = ae.snapshot(store, "a", p)
    again = ae.snapshot(store, "a", p)
    assert first is not None and again is not None
    assert again.at_version == first.at_version == 10 and again.at_hash == first.at_hash
    append_life(store, "a", 5)
    later = ae.snapshot(store, "a", p)
    assert later is not None and later.at_version == 15
    assert later.state == ae.recover(store, "a", p).state


# -- stale and forged snapshots ---------------------------------------------------------------


class RecoveryStateV2(RecoveryStateProjection):
    """Same fold, new version: old snapshots are stale."""

    version: ClassVar[int] = 2


def test_stale_snapshot_is_ignored_with_reason(store: ae.EventStore) -> None:
    """A snapshot of another projection version is ignored; the state comes from events."""
    append_life(store, "a", 30)
    ae.snapshot(store, "a", RecoveryStateProjection())
    rec = ae.recover(store, "a", RecoveryStateV2(), snapshots=store.snapshots)
    assert rec.source == "events" and rec.replayed == 30
    assert rec.snapshot_ignored is not None and "projection version 1 != 2" in rec.snapshot_ignored
    assert rec.state == ae.recover(store, "a", RecoveryStateProjection()).state
    assert rec.to_dict()["snapshot_ignored"] == rec.snapshot_ignored


def test_forged_snapshot_state_is_ignored(raw: tuple[ae.EventStore, str]) -> None:
    """A state edited in the snapshot table is ignored (digest mismatch); state still right."""
    store, backend = raw
    append_life(store, "a", 30)
    p = RecoveryStateProjection()
    ae.snapshot(store, "a", p)
    truth = ae.recover(store, "a", p).state
    forged = json.dumps(dict(truth, pending_tasks=["forged"]), sort_keys=True).encode()
    tamper_snapshot(store, backend, "state", forged)
    rec = ae.recover(store, "a", p, snapshots=store.snapshots)
    assert rec.snapshot_ignored == "state digest mismatch"
    assert rec.source == "events" and rec.state == truth and rec.version == 30


def test_snapshot_with_hash_of_another_version_is_ignored(raw: tuple[ae.EventStore, str]) -> None:
    """at_hash replaced by the hash of another version: ignored, replayed from events."""
    store, backend = raw
    append_life(store, "a", 30)
    p = AgentStateProjection()
    ae.snapshot(store, "a", p)
    other = next(iter(store.read("a", from_version=12, limit=1))).hash
    tamper_snapshot(store, backend, "at_hash", other)
    rec = ae.recover(store, "a", p, snapshots=store.snapshots)
    assert rec.snapshot_ignored is not None and "at_hash does not match" in rec.snapshot_ignored
    assert rec.source == "events" and rec.replayed == 30
    assert rec.state == ae.recover(store, "a", p).state


# -- truncation and the replay cap -------------------------------------------------------------


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    """A SQLite store in a file (rows are deleted behind its back)."""
    with ae.open_store(f"sqlite:///{tmp_path / 'r.db'}") as s:
        yield s


def _delete_after(store: ae.EventStore, stream: str, keep: int) -> None:
    conn = sqlite3.connect(str(backend_of(store.recorder).path))
    with conn:
        conn.execute("DELETE FROM ares_events WHERE stream_id = ? AND version > ?", (stream, keep))
    conn.close()


def test_truncated_tail_is_reported(sqlite_store: ae.EventStore) -> None:
    """Rows deleted from the tail: recovery says truncated, with a finding, never a short stream."""
    append_life(sqlite_store, "a", 40)
    p = RecoveryStateProjection()
    ae.snapshot(sqlite_store, "a", p)  # at 40
    append_life(sqlite_store, "a", 10)
    _delete_after(sqlite_store, "a", 45)
    for snaps in (None, sqlite_store.snapshots):
        rec = ae.recover(sqlite_store, "a", p, snapshots=snaps)
        assert rec.truncated is True and rec.ok is False
        assert rec.version == 45 and rec.head_version == 50
        assert any(f.kind == "truncated" for f in rec.findings)
    with pytest.raises(ChainIntegrityError):
        ae.recover(sqlite_store, "a", p, strict=True)
    with pytest.raises(ChainIntegrityError):
        ae.snapshot(sqlite_store, "a", p)


def test_truncated_below_snapshot_ignores_snapshot(sqlite_store: ae.EventStore) -> None:
    """A snapshot beyond the surviving events is ignored, and the truncation is reported."""
    append_life(sqlite_store, "a", 40)
    p = AgentStateProjection()
    ae.snapshot(sqlite_store, "a", p)
    _delete_after(sqlite_store, "a", 25)
    rec = ae.recover(sqlite_store, "a", p, snapshots=sqlite_store.snapshots)
    assert rec.snapshot_ignored is not None and "shorter than at_version 40" in rec.snapshot_ignored
    assert rec.source == "events" and rec.truncated and rec.version == 25


def test_replay_cap_is_reported_or_raised(store: ae.EventStore) -> None:
    """Hitting max_replay is reported as capped; strict=True raises ReplayCapExceeded."""
    append_life(store, "a", 50)
    p = RecoveryStateProjection()
    rec = ae.recover(store, "a", p, max_replay=20)
    assert rec.capped and not rec.ok and rec.replayed == 20 and rec.version == 20
    assert rec.state["last_version"] == 20
    with pytest.raises(ReplayCapExceeded) as info:
        ae.recover(store, "a", p, max_replay=20, strict=True)
    assert info.value.stream_id == "a"
    exact = ae.recover(store, "a", p, max_replay=50)
    assert not exact.capped and exact.version == 50
    for huge in (2**63 - 2, 2**63 - 1, 2**70):  # no cap at all (a limit error at 2**63-1)
        assert ae.recover(store, "a", p, max_replay=huge).version == 50
        assert ae.replay(store, "a", lambda n, e: n + 1, 0, max_replay=huge).state == 50


def test_snapshot_keeps_replay_under_the_cap(store: ae.EventStore) -> None:
    """With a snapshot only the tail counts against max_replay."""
    append_life(store, "a", 60)
    p = RecoveryStateProjection()
    ae.snapshot(store, "a", p)
    append_life(store, "a", 15)
    rec = ae.recover(store, "a", p, snapshots=store.snapshots, max_replay=20)
    assert not rec.capped and rec.replayed == 15 and rec.version == 75


# -- Snapshotter ---------------------------------------------------------------------------------


def test_snapshotter_writes_at_multiples_of_every(store: ae.EventStore) -> None:
    """Snapshotter(every=K) snapshots each projection when the stream reaches K, 2K, ..."""
    ps: list[Projection] = [RecoveryStateProjection(), RunStateProjection()]
    snapper = ae.Snapshotter(store, ps, every=7)
    seen: list[int] = []
    for ev in life_events(0, 30):
        res = store.append("a", [ev])
        n = snapper.after_append("a", res.version)
        if n:
            assert n == 2
            snap = store.snapshots.load("a", "recovery_state", 1)
            assert snap is not None
            seen.append(snap.at_version)
    assert seen == [7, 14, 21, 28]
    assert snapper.taken == 8
    for p in ps:
        snap = store.snapshots.load("a", p.name, p.version)
        assert snap is not None
        assert snap.at_version == 28
        assert snap.state == ae.recover(store, "a", p, max_replay=28).state


def test_snapshotter_picks_up_existing_snapshots(store: ae.EventStore) -> None:
    """A new Snapshotter starts from the stored snapshot, not from zero."""
    append_life(store, "a", 12)
    p = RecoveryStateProjection()
    ae.snapshot(store, "a", p)  # at 12
    snapper = ae.Snapshotter(store, [p], every=10)
    assert snapper.after_append("a", 12) == 0
    append_life(store, "a", 8)
    assert snapper.after_append("a", 20) == 1
    loaded = store.snapshots.load("a", p.name)
    assert loaded is not None
    assert loaded.at_version == 20


def test_snapshotter_rejects_bad_interval(store: ae.EventStore) -> None:
    """every must be positive."""
    with pytest.raises(ValueError, match="every"):
        ae.Snapshotter(store, [RecoveryStateProjection()], every=0)


# -- CLI: recover and snapshot ------------------------------------------------------------------


@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """URL of a SQLite file holding stream 'agent-1' (40 events); ARES_* env cleared."""
    for name in list(os.environ):
        if name.startswith("ARES_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")  # rich tables: room for full names
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with ae.open_store(url) as s:
        append_life(s, "agent-1", 40)
    return url


def test_cli_recover_reports_source_and_state(
    cli_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """recover prints the report and state; after snapshot take it recovers from the snapshot."""
    code, data = run_json(capsys, "--store", cli_db, "recover", "agent-1")
    assert code == 0
    assert (data["source"], data["version"], data["replayed"]) == ("events", 40, 40)
    assert data["projection"] == "recovery_state" and data["state"]["last_version"] == 40
    code, out, _ = run(capsys, "--store", cli_db, "snapshot", "take", "agent-1")
    assert code == 0 and out.count("snapshot of") == 4
    with ae.open_store(cli_db) as s:
        append_life(s, "agent-1", 5)
    code, data = run_json(
        capsys, "--store", cli_db, "recover", "agent-1", "--projection", "run_state"
    )
    assert code == 0
    assert (data["source"], data["replayed"], data["snapshot_version"]) == ("snapshot", 5, 40)
    code, data = run_json(capsys, "--store", cli_db, "recover", "agent-1", "--no-snapshots")
    assert (data["source"], data["replayed"]) == ("events", 45)
    code, out, _ = run(capsys, "--store", cli_db, "recover", "agent-1")
    assert code == 0
    assert "snapshot" in out and "used, at version 40" in out and '"last_version": 45' in out


def test_cli_recover_exit_1_on_cap_and_truncation(
    cli_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """recover exits 1 when capped or truncated, and says so."""
    code, data = run_json(capsys, "--store", cli_db, "recover", "agent-1", "--max-replay", "10")
    assert code == 1 and data["capped"] is True and data["version"] == 10
    conn = sqlite3.connect(cli_db.removeprefix("sqlite:///"))
    with conn:
        conn.execute("DELETE FROM ares_events WHERE version > 35")
    conn.close()
    code, data = run_json(capsys, "--store", cli_db, "recover", "agent-1")
    assert code == 1 and data["truncated"] is True
    assert any(f["kind"] == "truncated" for f in data["findings"])
    code, out, _ = run(capsys, "--store", cli_db, "recover", "agent-1")
    assert code == 1 and "truncated" in out and "FINDINGS" in out


def test_cli_recover_schema_error_and_tolerant(
    cli_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad event: exit 1 naming stream and version; --tolerant lists it as skipped."""
    with ae.open_store(cli_db) as s:
        ae.emit(s, "agent-1", "task.created", "test", {"wrong": 1})
    code, out, err = run(capsys, "--store", cli_db, "recover", "agent-1")
    assert code == 1 and out == ""
    assert "'agent-1'" in err and "version 41" in err and "--tolerant" in err
    code, data = run_json(capsys, "--store", cli_db, "recover", "agent-1", "--tolerant")
    assert code == 1
    assert [(s["version"], s["type"]) for s in data["skipped"]] == [(41, "task.created")]


def test_cli_recover_usage_errors(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No such stream or projection is a usage error (exit 2)."""
    code, _, err = run(capsys, "--store", cli_db, "recover", "ghost")
    assert code == 2 and "no stream 'ghost'" in err
    code, _, _ = run(capsys, "--store", cli_db, "recover", "agent-1", "--projection", "nope")
    assert code == 2


def test_cli_snapshot_list_take_verify_delete(
    cli_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """snapshot take/list/verify/delete round trip; verify exits 1 on a forged snapshot."""
    code, data = run_json(capsys, "--store", cli_db, "snapshot", "list")
    assert code == 0 and data["count"] == 0
    code, data = run_json(
        capsys, "--store", cli_db, "snapshot", "take", "agent-1", "--projection", "genealogy"
    )
    assert code == 0 and [s["projection"] for s in data["snapshots"]] == ["genealogy"]
    run_json(capsys, "--store", cli_db, "snapshot", "take", "agent-1")
    code, data = run_json(capsys, "--store", cli_db, "snapshot", "list", "agent-1")
    assert data["count"] == 4 and {s["at_version"] for s in data["snapshots"]} == {40}
    code, out, _ = run(capsys, "--store", cli_db, "snapshot", "list")
    assert code == 0 and "recovery_state" in out and "genealogy" in out
    code, data = run_json(capsys, "--store", cli_db, "snapshot", "verify")
    assert code == 0 and data["ok"] is True and data["checked"] == 4
    conn = sqlite3.connect(cli_db.removeprefix("sqlite:///"))
    with conn:
        conn.execute(
            "UPDATE ares_snapshots SET state = ? WHERE projection = 'agent_state'", (b"{}",)
        )
    conn.close()
    code, data = run_json(capsys, "--store", cli_db, "snapshot", "verify", "agent-1")
    assert code == 1 and data["bad"] == 1
    bad = [s for s in data["snapshots"] if not s["ok"]]
    assert [(s["projection"], s["reason"]) for s in bad] == [
        ("agent_state", "state digest mismatch")
    ]
    code, out, _ = run(capsys, "--store", cli_db, "snapshot", "verify")
    assert code == 1 and "state digest mismatch" in out
    code, data = run_json(
        capsys, "--store", cli_db, "recover", "agent-1", "--projection", "agent_state"
    )
    assert code == 0 and data["snapshot_ignored"] == "state digest mismatch"
    code, data = run_json(
        capsys, "--store", cli_db, "snapshot", "delete", "agent-1", "--projection", "agent_state"
    )
    assert code == 0 and data["deleted"] == 1
    code, data = run_json(capsys, "--store", cli_db, "snapshot", "delete", "agent-1")
    assert code == 0 and data["deleted"] == 3
    code, data = run_json(capsys, "--store", cli_db, "snapshot", "verify")
    assert code == 0 and data["checked"] == 0
    code, _, err = run(capsys, "--store", cli_db, "snapshot", "take", "ghost")
    assert code == 2 and "no stream 'ghost'" in err


def test_cli_snapshot_take_refuses_broken_chain(
    cli_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """snapshot take on a truncated stream exits 1 and writes nothing."""
    conn = sqlite3.connect(cli_db.removeprefix("sqlite:///"))
    with conn:
        conn.execute("DELETE FROM ares_events WHERE version > 30")
    conn.close()
    code, _, err = run(capsys, "--store", cli_db, "snapshot", "take", "agent-1")
    assert code == 1 and "agent-1" in err
    with ae.open_store(cli_db) as s:
        assert list(s.snapshots.list()) == []
