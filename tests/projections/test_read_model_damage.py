"""A damaged or tampered read-model registry or table, on SQLite and PostgreSQL: every
command that reads it stops with a StoreError that says what is damaged, never deletes what
a registry row names unless it is a read-model table, and never crashes with a driver or
decoding error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.cli import main
from ares_events.errors import StoreError
from ares_events.projections import (
    AgentStateProjection,
    ProjectionRunner,
    read_model,
    verify_rebuild,
)
from ares_events.projections.tables import tables_for
from tests.fixtures.fix_backends import open_backend, run_behind_store
from tests.projections.test_recovery import append_life


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def built(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ae.EventStore, str]]:
    """(store, backend): three agents' events, folded into the ``agent_state`` read model."""
    with open_backend(request.param, tmp_path, request) as store:
        for agent in ("agent-0", "agent-1", "agent-2"):
            append_life(store, agent, 5)
        ProjectionRunner(store, [AgentStateProjection()]).run_until_idle()
        yield store, request.param


def _set_registry(store: ae.EventStore, backend: str, column: str, value: Any) -> None:
    run_behind_store(
        store,
        backend,
        f"UPDATE ares_projections SET {column} = ? WHERE name = 'agent_state'",
        f"UPDATE {{schema}}.ares_projections SET {column} = %s WHERE name = 'agent_state'",
        (value,),
    )


def _live_table(store: ae.EventStore) -> str:
    meta = tables_for(store).meta("agent_state")
    assert meta is not None and meta.active_table is not None
    return meta.active_table


def _damaged(exc: pytest.ExceptionInfo[StoreError]) -> str:
    assert type(exc.value) is StoreError  # damage: not "unavailable, try again"
    return str(exc.value)


@pytest.mark.parametrize(
    "table", ["ares_events", 'ares_rm_x" ; DROP TABLE ares_events; --', "ARES_RM_X", "nope"]
)
def test_a_registry_row_naming_another_table_stops_an_erasure_that_deletes_nothing(
    built: tuple[ae.EventStore, str], table: str
) -> None:
    """A registry row whose live table is not a read-model table (the events' table, one
    with a quote) makes an erasure's read-model reset a StoreError naming the damaged row;
    no event is deleted and the value never reaches SQL."""
    store, backend = built
    before = [e.event_id for e in store.read_all()]
    _set_registry(store, backend, "active_table", table)
    with pytest.raises(StoreError) as exc:
        ae.erase(store, "agent-1", 2, reason="test", by="tester")
    assert "registry row of read model 'agent_state' is damaged: active_table" in _damaged(exc)
    assert [e.event_id for e in store.read_all()] == before
    with pytest.raises(StoreError, match=r"registry row .* is damaged") as exc:
        verify_rebuild(store, AgentStateProjection())
    _damaged(exc)


def test_the_erase_command_on_a_tampered_registry_exits_3_and_keeps_every_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported case: ``erase`` on a SQLite store whose registry names ``ares_events``
    exits 3 with the damaged row named (not 0 with every other event deleted)."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    with ae.open_store(url) as store:
        for agent in ("agent-0", "agent-1", "agent-2"):
            append_life(store, agent, 5)
        ProjectionRunner(store, [AgentStateProjection()]).run_until_idle()
        _set_registry(store, "sqlite", "active_table", "ares_events")
    code = main(["-q", "--store", url, "erase", "agent-1", "2", "--reason", "test"])
    assert code == 3
    assert "registry row of read model 'agent_state' is damaged" in capsys.readouterr().err
    with ae.open_store(url) as store:
        assert store.last_position() == 15 == len(list(store.read_all()))


@pytest.mark.parametrize("column", ["position", "building_position", "generation"])
def test_a_registry_cursor_that_is_no_integer_is_damage(
    tmp_path: Path, request: pytest.FixtureRequest, column: str
) -> None:
    """A registry cursor or generation that is text (SQLite keeps what it is given) is a
    StoreError naming the field, not a TypeError deep in the runner."""
    with open_backend("sqlite", tmp_path, request) as store:
        append_life(store, "agent-0", 5)
        ProjectionRunner(store, [AgentStateProjection()]).run_until_idle()
        _set_registry(store, "sqlite", column, "abc")
        for look in (
            lambda: verify_rebuild(store, AgentStateProjection()),
            lambda: read_model(store, "agent_state", "agent-0"),
            lambda: ProjectionRunner(store, [AgentStateProjection()]).run_once(),
        ):
            with pytest.raises(StoreError, match=f"is damaged: {column} is 'abc'") as exc:
                look()
            _damaged(exc)


def test_a_registry_row_naming_a_missing_table_is_a_store_error(
    built: tuple[ae.EventStore, str],
) -> None:
    """A registry row naming a read-model table that is not there: reads and the erasure's
    reset are a StoreError naming the table (the driver's error as its cause), not a raw
    driver error."""
    store, backend = built
    _set_registry(store, backend, "active_table", "ares_rm_gone_1")
    for look in (
        lambda: verify_rebuild(store, AgentStateProjection()),
        lambda: read_model(store, "agent_state", "agent-0"),
        lambda: ae.erase(store, "agent-1", 2, reason="test", by="tester"),
    ):
        with pytest.raises(StoreError, match="ares_rm_gone_1") as exc:
            look()
        _damaged(exc)
        assert exc.value.__cause__ is not None


def test_a_read_model_row_that_is_not_json_is_damage(built: tuple[ae.EventStore, str]) -> None:
    """A read-model row whose state is not UTF-8 JSON: a verify, a read and the runner's
    next fold of that key are a StoreError naming the row and table, not a decoding
    crash."""
    store, backend = built
    table = _live_table(store)
    run_behind_store(
        store,
        backend,
        f"UPDATE {table} SET state = ? WHERE key = 'agent-1'",
        f"UPDATE {{schema}}.{table} SET state = %s WHERE key = 'agent-1'",
        (b"\xff\xfe\x00",),
    )
    append_life(store, "agent-1", 1)
    for look in (
        lambda: verify_rebuild(store, AgentStateProjection()),
        lambda: read_model(store, "agent_state", "agent-1"),
        lambda: ProjectionRunner(store, [AgentStateProjection()]).run_once(),
    ):
        with pytest.raises(StoreError, match=f"row 'agent-1' of table {table} is damaged") as exc:
            look()
        _damaged(exc)
    assert read_model(store, "agent_state", "agent-0") is not None  # the other rows read
