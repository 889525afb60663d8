"""An eventsourcing application persisted by its built-in ``eventsourcing.postgres`` module
and by ours (``ares_events.integrations.eventsourcing``), same server, same run.

Run from the repository root::

    .venv/bin/python -m bench.bench_eventsourcing           # full sizes, writes docs/performance.md
    .venv/bin/python -m bench.bench_eventsourcing --quick   # smoke run, writes nothing

The server comes from ``--admin-url``, else ``ARES_BENCH_POSTGRES_URL``, else
``postgresql://root@127.0.0.1:5432/postgres``. One throwaway database is created and dropped;
every repetition of every system uses a fresh schema, so both start from empty tables.

Workload (eventsourcing's application-level benchmark shape): an ``Application`` with
default settings (JSON transcoder, no compression, no snapshots) and an aggregate with one
``@event`` method. *save*: ``A`` aggregates, each created and given ``N - 1`` more events,
then ``app.save(aggregate)`` (one insert of N events per aggregate). *get*:
``app.repository.get(id)`` of every aggregate (one select of N events each, then the fold).
Systems alternate order each repetition; medians of wall time are reported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from bench.common import (
    fmt_ms,
    fmt_ratio,
    interleave,
    machine_description,
    markdown_table,
    timed,
    write_section,
)


class Account(Aggregate):
    """A small aggregate: every credit is one event."""

    @event("Opened")
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.balance = 0

    @event("Credited")
    def credit(self, amount: int, memo: str) -> None:
        self.balance += amount


class Accounts(Application[uuid.UUID]):
    """The application under test."""


@contextlib.contextmanager
def database(admin_url: str) -> Iterator[str]:
    name = f"bench_es_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(admin_url)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def env_builtin(db_url: str, schema: str) -> dict[str, str]:
    p = urlsplit(db_url)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": p.path.lstrip("/"),
        "POSTGRES_HOST": p.hostname or "127.0.0.1",
        "POSTGRES_PORT": str(p.port or 5432),
        "POSTGRES_USER": p.username or "root",
        "POSTGRES_PASSWORD": p.password or "",
        "POSTGRES_SCHEMA": schema,
    }


def env_ours(db_url: str, schema: str) -> dict[str, str]:
    return {
        "PERSISTENCE_MODULE": "ares_events.integrations.eventsourcing",
        "ARES_STORE_URL": f"{db_url}?schema={schema}",
    }


def one_rep(
    make_env: Callable[[str, str], dict[str, str]],
    db_url: str,
    a: int,
    n: int,
    out: dict[str, list[float]],
    name: str,
) -> Callable[[], tuple[float, float]]:
    def run() -> tuple[float, float]:
        schema = f"s_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute(f'CREATE SCHEMA "{schema}"')
        app = Accounts(env=make_env(db_url, schema))
        try:
            accounts = []
            for i in range(a):
                acc = Account(f"owner-{i}")
                for j in range(n - 1):
                    acc.credit(j, "memo for the credit")
                accounts.append(acc)
            # warm-up (untimed): one aggregate each way, so connections and plans exist
            warm = Account("warm")
            app.save(warm)
            app.repository.get(warm.id)

            def save() -> None:
                for acc in accounts:
                    app.save(acc)

            def get() -> None:
                for acc in accounts:
                    got = app.repository.get(acc.id)
                    assert got.version == acc.version

            w_save, c_save, _ = timed(save)
            w_get, _, _ = timed(get)
            out[f"{name}:get"].append(w_get)
            return w_save, c_save
        finally:
            app.close()

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="small sizes; print, write nothing")
    ap.add_argument("--admin-url", default=None, help="server URL (database postgres)")
    ap.add_argument("--reps", type=int, default=None)
    args = ap.parse_args(argv)
    admin = (
        args.admin_url
        or os.environ.get("ARES_BENCH_POSTGRES_URL")
        or "postgresql://root@127.0.0.1:5432/postgres"
    )
    a, n, reps = (20, 10, 2) if args.quick else (300, 10, 7)
    reps = args.reps or reps
    gets: dict[str, list[float]] = {"builtin:get": [], "ours:get": []}
    with database(admin) as db:
        timings = interleave(
            {
                "builtin": one_rep(env_builtin, db, a, n, gets, "builtin"),
                "ours": one_rep(env_ours, db, a, n, gets, "ours"),
            },
            reps,
            progress=lambda s: print(s, file=sys.stderr),
        )
    import statistics

    save_b, save_o = timings["builtin"].median, timings["ours"].median
    get_b, get_o = statistics.median(gets["builtin:get"]), statistics.median(gets["ours:get"])
    rows = [
        ["save", f"{a} x {n} events", fmt_ms(save_b), fmt_ms(save_o), fmt_ratio(save_o / save_b)],
        ["get", f"{a} aggregates", fmt_ms(get_b), fmt_ms(get_o), fmt_ratio(get_o / get_b)],
        [
            "save + get",
            "",
            fmt_ms(save_b + get_b),
            fmt_ms(save_o + get_o),
            fmt_ratio((save_o + get_o) / (save_b + get_b)),
        ],
    ]
    table = markdown_table(
        ["workload", "size", "eventsourcing.postgres", "ares-events module", "ours / built-in"],
        rows,
    )
    mach = machine_description(["eventsourcing", "psycopg"])
    body = (
        f"Median wall time of {reps} alternating repetitions "
        f"(ratio < 1: ours is faster).\n\n{table}\n\n"
        + "Machine: "
        + ", ".join(f"{k} {v}" for k, v in mach.items())
    )
    print(body)
    if not args.quick:
        write_section(
            "eventsourcing", body, title="eventsourcing: built-in Postgres module vs ours"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
