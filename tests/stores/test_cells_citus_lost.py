"""A worker lost during a Citus cell's transaction: whatever the operation, the error is
StoreUnavailable (transient: try again), as it is for an append. Citus relays the worker's
loss as an internal error ("could not commit transaction for shard ..."), which the plain
PostgreSQL mapping alone would call a StoreError."""

from __future__ import annotations

import subprocess
import uuid
from typing import Any, ClassVar

import psycopg
import pytest

import ares_events as ae
from ares_events.core.events import RecordedEvent
from ares_events.core.recorder import backend_of
from ares_events.errors import StoreError, StoreUnavailable
from ares_events.projections import ProjectionRunner, read_model
from ares_events.stores.cells.citus import cell_placements
from ares_events.stores.cells.citus_clock import WORKER_LOST, CitusClock
from ares_events.stores.postgres.driver import DriverErrors
from ares_events.stores.postgres.sql import Statements
from tests.fixtures import cell_servers


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


class _Count:
    """A projection whose first pass creates its read-model table (DDL, which Citus sends
    to every worker)."""

    version: ClassVar[int] = 1

    def __init__(self, name: str) -> None:
        self.name = name

    def initial(self) -> int:
        """Nothing counted."""
        return 0

    def apply(self, state: Any, event: RecordedEvent) -> int:
        """Count one event."""
        return int(state) + 1


def _restart(port: int) -> None:
    """``pg_ctl restart -m fast`` of the server on ``port``, back up when it returns."""
    with _admin(port) as c:
        data = str(c.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
    pg_ctl = [*cell_servers._run_as(), str(cell_servers.PG_BIN / "pg_ctl"), "-D", data]
    restart = [*pg_ctl, "-l", f"{data}.log", "-m", "fast", "-w", "restart"]
    subprocess.run(restart, check=True, capture_output=True)


@pytest.mark.postgres
def test_a_read_model_table_made_after_a_worker_restarted_is_unavailable(
    citus_coordinator: str, citus_ports: list[int]
) -> None:
    """The coordinator's session holds a cached connection to every worker (DDL reaches
    them all); one worker restarts and is up again; the first pass of a new projection
    creates its table over the stale connection: StoreUnavailable (Citus: "failure on
    connection marked as essential"), never a plain StoreError, and the next pass makes
    the table."""
    prefix = f"l{uuid.uuid4().hex[:8]}"
    # One coordinator connection, so the pass after the restart runs on the session that
    # cached the connection the restart left stale.
    query = f"cells=1&partitions=1&pool_min=1&pool_max=1&prefix={prefix}"
    with ae.open_store(f"citus://root@{citus_coordinator}/postgres?{query}") as store:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={})])
        # The other worker: the pass's first statement reads the cell and so replaces a
        # stale connection to the cell's own worker; only the DDL reaches the other one.
        cell_worker = cell_placements(store)[0].port
        other = next(p for p in citus_ports[1:] if p != cell_worker)
        hit = None
        for attempt in range(3):
            ProjectionRunner(store, [_Count(f"warm{attempt}")]).run_once()  # caches them
            _restart(other)
            runner = ProjectionRunner(store, [_Count(f"p{attempt}")])
            try:
                runner.run_once()
            except StoreUnavailable as exc:
                hit = exc
                runner.run_once()  # transient: the next pass makes the table and folds
                break
        assert hit is not None, "no pass met the stale connection"
        assert "marked as essential" in str(hit)
        assert read_model(store, f"p{attempt}", "s") == 1


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
