"""CLI commands ``cells``, ``cells move`` and ``cells rebalance``: a cell store's cells."""

from __future__ import annotations

from collections import Counter
from typing import Any

import click
from rich.table import Table

from ares_events.cli.common import EXIT_OK, App, cli, json_app, text
from ares_events.core.recorder import backend_of
from ares_events.errors import ConfigError


def _cells_of(store: Any) -> Any:
    rec = backend_of(store.recorder)
    if getattr(rec, "cell_map", None) is None:
        raise ConfigError(
            f"{store.url} is not a cell store (citus://... or pgcells://...; docs/scaling.md)"
        )
    return rec


@cli.group(name="cells", invoke_without_command=True)
@json_app
@click.pass_context
def cells_cmd(ctx: click.Context, app: App, as_json: bool) -> int:
    """Show the cells of a cell store: partitions, each cell's streams, where it lives.

    A cell store (citus://user@coordinator/db?partitions=N, or pgcells://...) keeps a fixed
    number of partitions, each in one cell (a PostgreSQL schema); a stream's partition is
    a stable hash of its id. On Citus each cell is a distributed schema on one worker.

    \b
    Example:
      ares-events --store citus://app@coordinator:5432/agents cells --json
    """
    if ctx.invoked_subcommand is not None:
        return EXIT_OK
    with app.open() as store:
        rec = _cells_of(store)
        counts = Counter(rec.cell_index(sid) for sid, _ in store.streams())
        where: dict[str, str] = {}
        if rec.citus:
            from ares_events.stores.cells.citus import cell_placements

            where = {p.cell: f"{p.host}:{p.port} ({p.size})" for p in cell_placements(store)}
    cmap = rec.cell_map
    rows = [
        {
            "cell": name,
            "partitions": cmap.assignment.count(i),
            "streams": counts[i],
            "location": where.get(name),
        }
        for i, name in enumerate(cmap.cells)
    ]
    if as_json:
        data = {"store": app.url, "partitions": cmap.partitions, "shared_clock": rec.shared_clock}
        return app.json({**data, "citus": rec.citus, "cells": rows})
    title = text(f"{app.url}: {len(rows)} cell(s), {cmap.partitions} partitions")
    table = Table(title=title, title_justify="left")
    for col in ("cell", "partitions", "streams", "location"):
        table.add_column(col, no_wrap=col != "location")
    for r in rows:
        table.add_row(*(text("-" if v is None else v) for v in r.values()))
    app.table(table)
    return EXIT_OK


_mode_option = click.option(
    "--mode",
    type=click.Choice(["auto", "force_logical", "block_writes"]),
    default="auto",
    show_default=True,
    help="Citus shard transfer mode (auto: logical replication, writes go on).",
)


@cells_cmd.command(name="move")
@click.argument("cell")
@click.argument("target", metavar="HOST:PORT")
@_mode_option
@json_app
def move_cmd(app: App, cell: str, target: str, mode: str, as_json: bool) -> int:
    """Move CELL of a citus:// store to the worker HOST:PORT, online.

    Appends to the cell go on during the copy (auto, force_logical) or wait for it
    (block_writes); positions do not change, so readers and projections never notice.

    \b
    Example:
      ares-events --store citus://app@coordinator/agents cells move ares_cell_2 10.0.0.9:5432
    """
    from ares_events.stores.cells.citus import cell_placements, move_cell

    host, _, port = target.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()):
        raise click.UsageError(f"TARGET must be HOST:PORT, got {target!r}")
    if not 1 <= int(port) <= 65535:  # else Citus answers with a puzzle (no such function/node)
        raise click.UsageError(f"the port of TARGET must be 1-65535, got {port}")
    with app.open(write=True) as store:
        _cells_of(store)
        move_cell(store, cell, host, int(port), mode=mode)
        now = {p.cell: f"{p.host}:{p.port}" for p in cell_placements(store)}
    if as_json:
        return app.json({"store": app.url, "cell": cell, "location": now.get(cell), "mode": mode})
    app.say(f"moved {cell} of {app.url} to {now.get(cell)}")
    return EXIT_OK


@cells_cmd.command(name="rebalance")
@_mode_option
@json_app
def rebalance_cmd(app: App, mode: str, as_json: bool) -> int:
    """Spread the cells of a citus:// store over its workers (after adding one), online.

    \b
    Example:
      ares-events --store citus://app@coordinator/agents cells rebalance
    """
    from ares_events.stores.cells.citus import cell_placements, rebalance

    with app.open(write=True) as store:
        _cells_of(store)
        rebalance(store, mode=mode)
        now = {p.cell: f"{p.host}:{p.port}" for p in cell_placements(store)}
    if as_json:
        return app.json({"store": app.url, "cells": now})
    for cell, loc in now.items():
        app.say(f"{cell}: {loc}")
    return EXIT_OK
