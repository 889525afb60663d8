"""A worker lost during a Citus cell's transaction: whatever the operation, the error is
StoreUnavailable (transient: try again), as it is for an append. Citus relays the worker's
loss as an internal error ("could not commit transaction for shard ..."), which the plain
PostgreSQL mapping alone would call a StoreError."""

from __future__ import annotations

import uuid

import psycopg
import pytest

import ares_events as ae
from ares_events.core.recorder import backend_of
from ares_events.errors import StoreError, StoreUnavailable
from ares_events.stores.cells.citus_clock import WORKER_LOST, CitusClock
from ares_events.stores.postgres.driver import DriverErrors
from ares_events.stores.postgres.sql import Statements


def _admin(port: int | str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        host="127.0.0.1", port=port, user="root", dbname="postgres", autocommit=True
    )


def _kill_idle_transactions(coordinator: str) -> int:
    """Terminate, on every worker, the backends the coordinator holds in a transaction."""
    port = coordinator.rpartition(":")[2]
    with _admin(port) as c:
        rows = c.execute("SELECT nodeport FROM pg_dist_node WHERE groupid <> 0").fetchall()
    killed = 0
    for (p,) in rows:
        with _admin(p) as w:  # type: ignore[arg-type]
            pids = w.execute(
                "SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction'"
                " AND application_name LIKE 'citus_internal%%' AND pid <> pg_backend_pid()"
            ).fetchall()
            for (pid,) in pids:
                w.execute("SELECT pg_terminate_backend(%s::int, 10000)", (pid,))
                killed += 1
    return killed


@pytest.mark.postgres
def test_a_read_model_commit_that_loses_its_worker_is_unavailable(citus_coordinator: str) -> None:
    """The read-model transaction writes on the cell's worker; that worker's backend is
    terminated before COMMIT; the COMMIT fails with StoreUnavailable (not StoreError),
    nothing of it is stored, and the same transaction then commits."""
    url = f"citus://root@{citus_coordinator}/postgres?partitions=4&prefix=l{uuid.uuid4().hex[:8]}"
    with ae.open_store(url) as store:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={})])
        cells = backend_of(store.recorder)
        models = cells.read_models()  # the first cell's: a tracking row of that cell
        name = next(n for n in (f"lost-{i}" for i in range(100)) if cells.cell_index(n) == 0)
        insert = (
            f'INSERT INTO "{cells.cells[0].schema}".ares_tracking (name, position) VALUES (%s, 1)'
        )
        lost = pytest.raises(StoreUnavailable, match="could not commit transaction for shard")
        with lost, models._write() as c:
            c.execute(insert, (name,))
            assert _kill_idle_transactions(citus_coordinator) >= 1
        assert store.tracked_position(name) is None
        with models._write() as c:  # the store is usable again: the retry commits
            c.execute(insert, (name,))
        assert store.tracked_position(name) == 1


@pytest.mark.parametrize("message", WORKER_LOST)
def test_a_relayed_worker_loss_is_unavailable_only_where_the_store_says_so(message: str) -> None:
    """The same internal error is StoreUnavailable under a mapping given the lost-node
    messages (a Citus cell's), StoreError under the plain one; the password is scrubbed
    from both."""
    exc = psycopg.errors.InternalError_(f"{message} on node pw-s3cret:5432")

    def mapped(lost: tuple[str, ...]) -> StoreError:
        errors = DriverErrors(
            "a read", "db", statement_timeout=None, timeout_label=str, secret="pw-s3cret", lost=lost
        )
        with pytest.raises(StoreError) as info, errors:
            raise exc
        assert info.value.__cause__ is exc
        assert "s3cret" not in str(info.value)
        return info.value

    assert type(mapped(WORKER_LOST)) is StoreUnavailable
    assert type(mapped(())) is StoreError


@pytest.mark.postgres
def test_a_stored_value_that_reads_like_a_lost_node_is_not_one(postgres_db_url: str) -> None:
    """The server quotes a duplicate key in the error's DETAIL: a key that holds a lost-node
    message leaves a unique violation a StoreError, under the Citus mapping too (only the
    error's own message is matched), in the read path's mapping and an append's."""
    key = WORKER_LOST[-1]
    with psycopg.connect(postgres_db_url, autocommit=True) as c:
        c.execute("CREATE TEMP TABLE k (v text UNIQUE)")
        c.execute("INSERT INTO k VALUES (%s)", (key,))
        errors = DriverErrors(
            "a write",
            "db",
            statement_timeout=None,
            timeout_label=str,
            secret=None,
            lost=WORKER_LOST,
        )
        with pytest.raises(StoreError) as info, errors:
            c.execute("INSERT INTO k VALUES (%s)", (key,))
        assert type(info.value) is StoreError
        assert key in str(info.value.__cause__)  # the DETAIL did hold it
        clock = CitusClock(Statements.for_schema("s"))
        with pytest.raises(psycopg.errors.UniqueViolation), clock.writing(c, "db"):
            c.execute("INSERT INTO k VALUES (%s)", (key,))
