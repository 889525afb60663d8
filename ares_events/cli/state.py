"""CLI commands over folds: ``recover``, ``snapshot`` and ``rebuild`` (registered on import)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    MAX_FINDINGS_SHOWN,
    App,
    CommandError,
    _print_findings,
    _status,
    add_columns,
    cli,
    json_app,
    text,
    verdict,
    visible,
)
from ares_events.core.catalog import EventSchemaError
from ares_events.projections import BUILTIN, rebuild, verify_rebuild
from ares_events.projections.merkle import MERKLE_PROJECTION, MerkleLogProjection
from ares_events.projections.recovery import recover, snapshot


def _projection_option(default: str | None) -> Callable[[Any], Any]:
    return click.option(
        "--projection",
        type=click.Choice(sorted(BUILTIN)),
        default=default,
        show_default=default is not None,
        help="Built-in projection to fold"
        + ("." if default is not None else " (default: every projection)."),
    )


@contextlib.contextmanager
def _schema_failures(hint: str) -> Iterator[None]:
    """A schema failure of a stored event: exit 1 (a finding about the data), one line."""
    try:
        yield
    except EventSchemaError as exc:
        raise click.ClickException(f"{exc} ({hint})") from None


@cli.command(name="recover")
@click.argument("stream")
@_projection_option("recovery_state")
@click.option(
    "--max-replay",
    type=click.IntRange(0),
    default=10_000,
    show_default=True,
    help="Fold at most N events; hitting the cap is reported (exit 1).",
)
@click.option("--no-snapshots", is_flag=True, help="Ignore snapshots: replay the whole stream.")
@click.option("--tolerant", is_flag=True, help="Skip and list events that fail their schema.")
@json_app
def recover_cmd(
    app: App,
    stream: str,
    projection: str,
    max_replay: int,
    no_snapshots: bool,
    tolerant: bool,
    as_json: bool,
) -> int:
    """Rebuild STREAM's state the way a supervisor would, and report how.

    Loads the latest snapshot of the projection (ignored, with the reason, when it is stale
    or does not match the stream), folds the tail with the chain checked, compares the end
    with the stream head and honours the replay cap. Prints the source, versions, events
    replayed, the snapshot used or ignored, truncation, cap, findings and the state.
    Exits 1 on findings, a truncated tail, a capped replay or skipped events.

    \b
    Example:
      ares-events recover agent-7
      ares-events recover run-42 --projection run_state --json
      ares-events recover agent-7 --no-snapshots --max-replay 100000
    """
    with app.open() as store:
        proj, snaps = BUILTIN[projection](), None if no_snapshots else store.snapshots
        with _schema_failures("use --tolerant to skip and list such events"):
            rep = recover(
                store, stream, proj, snapshots=snaps, max_replay=max_replay, tolerant=tolerant
            )
        if rep.head_version == 0 and rep.version == 0 and not rep.findings:
            raise CommandError(f"no stream {stream!r} in {store.url}")
    ok = rep.ok and not rep.truncated
    if as_json:
        return app.json(dict(rep.to_dict(), store=app.url), ok)
    if rep.snapshot_version is not None:
        snap = f"used, at version {rep.snapshot_version}"
    elif rep.snapshot_ignored is not None:
        snap = f"ignored: {rep.snapshot_ignored}"
    else:
        snap = "disabled (--no-snapshots)" if no_snapshots else "none stored"
    table = Table(title=text(f"recovery of {stream} ({projection})"), title_justify="left")
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("")
    for name, value in (
        ("source", str(rep.source)),
        ("version", f"{rep.version} (head says {rep.head_version})"),
        ("replayed", f"{rep.replayed} event(s)"),
        ("snapshot", snap),
        ("truncated", "yes" if rep.truncated else "no"),
        ("capped", f"yes, at --max-replay {max_replay}" if rep.capped else "no"),
        ("findings", str(len(rep.findings))),
        ("skipped", str(len(rep.skipped))),
    ):
        table.add_row(text(name), text(value))
    table.add_row(text("result"), _status(ok))
    app.table(table)
    if rep.findings:
        _print_findings(app, rep.findings)
    for s in rep.skipped[:MAX_FINDINGS_SHOWN]:
        app.say(f"skipped {s.stream_id} version {s.version} ({s.type}): {s.reason}")
    app.say("state:", style="bold")
    state = json.dumps(rep.state, indent=2, sort_keys=True, ensure_ascii=False)
    app.out.print(Text(visible(state, keep="\n")))  # the newlines are the indentation's
    return EXIT_OK if ok else EXIT_FINDINGS


@cli.group(name="snapshot")
def snapshot_cmd() -> None:
    """List, take, delete and verify snapshots (a cache of a fold, never the truth).

    \b
    Example:
      ares-events snapshot list
      ares-events snapshot take agent-7 --projection recovery_state
      ares-events snapshot verify --json
      ares-events snapshot delete agent-7
    """


def _print_snapshots(app: App, title: str, rows: list[tuple[Any, Any]], check: bool) -> None:
    plain: dict[str, Any] = {"pad_edge": False, "collapse_padding": True, "show_edge": False}
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), **plain)
    # Names stay whole (they are what people copy): App.table drops other columns first.
    names = ("stream", "projection", "ver", "at", "at hash", "bytes", "created UTC")
    add_columns(table, *names, right=("ver", "at", "bytes"), no_wrap=True)
    if check:
        table.add_column("check", overflow="fold")
    for info, reason in rows:
        created = info.to_dict()["created_at"][:19].replace("T", " ")
        cells: list[Text | str] = [text(info.stream_id), text(info.projection)]
        cells += [str(info.projection_version), str(info.at_version), info.at_hash.hex()[:8]]
        cells += [str(info.state_size), created]
        if check:
            cells.append(text("ok", style="green") if reason is None else text(reason, "red"))
        table.add_row(*cells)
    app.table(table, optional=("created UTC", "at hash", "bytes", "ver", "at"))


@snapshot_cmd.command(name="list")
@click.argument("stream", required=False)
@json_app
def snapshot_list(app: App, stream: str | None, as_json: bool) -> int:
    """List stored snapshots (of STREAM, or of every stream), without their state.

    \b
    Example:
      ares-events snapshot list
      ares-events snapshot list agent-7 --json
    """
    with app.open() as store:
        infos = list(store.snapshots.list(stream))
    if as_json:
        app.json({"store": app.url, "count": len(infos), "snapshots": [i.to_dict() for i in infos]})
    elif not infos:
        app.say(f"no snapshots{f' of {stream}' if stream else ''} in {app.url}")
    else:
        _print_snapshots(app, f"{len(infos)} snapshot(s)", [(i, None) for i in infos], False)
    return EXIT_OK


@snapshot_cmd.command(name="take")
@click.argument("stream")
@_projection_option(None)
@json_app
def snapshot_take(app: App, stream: str, projection: str | None, as_json: bool) -> int:
    """Fold STREAM now (from its latest good snapshot) and save a snapshot.

    Without --projection a snapshot of every built-in projection is taken. Refuses a
    stream whose chain has findings (exit 1): a snapshot would launder them.

    \b
    Example:
      ares-events snapshot take agent-7
      ares-events snapshot take run-42 --projection run_state --json
    """
    names = [projection] if projection is not None else sorted(BUILTIN)
    with app.open(write=True) as store:
        if store.stream_version(stream) == 0:
            raise CommandError(f"no stream {stream!r} in {store.url}")
        with _schema_failures("fix or upcast the event first"):
            made = [snapshot(store, stream, BUILTIN[name]()) for name in names]
        taken = [s.info() for s in made if s is not None]
    if as_json:
        snaps = [i.to_dict() for i in taken]
        return app.json({"store": app.url, "stream_id": stream, "snapshots": snaps})
    for i in taken:
        app.say(
            f"snapshot of {i.projection} for {stream} at version {i.at_version} "
            f"({i.state_size} bytes)"
        )
    return EXIT_OK


@snapshot_cmd.command(name="delete")
@click.argument("stream")
@_projection_option(None)
@json_app
def snapshot_delete(app: App, stream: str, projection: str | None, as_json: bool) -> int:
    """Delete STREAM's snapshot of one projection, or all of STREAM's snapshots.

    Safe: recovery then replays from the events (a snapshot is only a cache).

    \b
    Example:
      ares-events snapshot delete agent-7
      ares-events snapshot delete agent-7 --projection genealogy
    """
    with app.open(write=True) as store:
        n = store.snapshots.delete(stream, projection)
    if as_json:
        data = {"store": app.url, "stream_id": stream, "projection": projection}
        return app.json({**data, "deleted": n})
    what = f" of {projection}" if projection else ""
    app.say(f"deleted {n} snapshot(s){what} for {stream}")
    return EXIT_OK


@snapshot_cmd.command(name="verify")
@click.argument("stream", required=False)
@json_app
def snapshot_verify(app: App, stream: str | None, as_json: bool) -> int:
    """Check every stored snapshot (of STREAM, or all) against its stream.

    A snapshot is bad when its state digest is wrong or its at_hash is not the stream's
    hash at at_version (edited, forged, or the stream was truncated). Exits 1 when any
    is bad; recovery ignores bad snapshots anyway.

    \b
    Example:
      ares-events snapshot verify
      ares-events snapshot verify agent-7 --json
    """
    with app.open() as store:
        rows = list(store.snapshots.verify_all(stream))
    bad = [(i, r) for i, r in rows if r is not None]
    if as_json:
        snaps = [dict(i.to_dict(), ok=r is None, reason=r) for i, r in rows]
        data = {"store": app.url, "ok": not bad, "checked": len(rows), "bad": len(bad)}
        app.json({**data, "snapshots": snaps})
    else:
        if rows:
            _print_snapshots(app, f"{len(rows)} snapshot(s) checked", rows, check=True)
        if bad:
            app.say(f"{len(bad)} bad snapshot(s)", style="bold red")
        else:
            app.say(f"{len(rows)} snapshot(s) checked, all match their streams", style="green")
    return EXIT_FINDINGS if bad else EXIT_OK


_REBUILDABLE: dict[str, Any] = {**BUILTIN, MERKLE_PROJECTION: MerkleLogProjection}
"""The built-in projections and the Merkle log (whose tiles rebuild like a read model)."""


@cli.command(name="rebuild")
@click.argument("projection", type=click.Choice(sorted(_REBUILDABLE)))
@click.option(
    "--from-scratch", is_flag=True, help="Discard an interrupted rebuild instead of resuming it."
)
@click.option(
    "--verify",
    "verify_only",
    is_flag=True,
    help="Rebuild beside the live read model, diff them, and swap nothing.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1_000_000),
    default=1000,
    show_default=True,
    help="Events per transaction.",
)
@json_app
def rebuild_cmd(
    app: App, projection: str, from_scratch: bool, verify_only: bool, batch_size: int, as_json: bool
) -> int:
    """Rebuild PROJECTION's read model from the log and swap it in atomically.

    The new table fills while the live one keeps serving reads; an interrupted rebuild
    resumes where it stopped (unless --from-scratch). A progress bar with events/s runs
    on stderr. With --verify it instead rebuilds beside the live table up to its cursor
    and lists every key whose state differs; exits 1 when the diff is not clean.
    merkle_log is the verifiable log's tree: --verify proves its stored tiles are the
    tree of the events as they are now.

    \b
    Example:
      ares-events rebuild agent_state
      ares-events rebuild agent_state --from-scratch --batch-size 5000
      ares-events rebuild agent_state --verify --json
      ares-events rebuild merkle_log --verify
    """
    if verify_only and from_scratch:
        raise click.UsageError("--verify builds beside the live table; drop --from-scratch")
    what = f"{'verifying' if verify_only else 'rebuilding'} {projection}"
    with app.open(write=not verify_only) as store, app.progress(what) as bar:
        started = time.perf_counter()

        def progress(done: int, total: int) -> None:
            rate = done / max(time.perf_counter() - started, 1e-9)
            bar(done, total, description=f"{what} ({rate:,.0f} events/s)")

        proj = _REBUILDABLE[projection]()
        if verify_only:
            diff = verify_rebuild(store, proj, batch_size=batch_size, progress=progress)
        else:
            fixed = "the rebuild stopped and resumes from here once the event is fixed"
            with _schema_failures(fixed):
                rep = rebuild(
                    store, proj, from_scratch=from_scratch, batch_size=batch_size, progress=progress
                )
    if verify_only:
        if as_json:
            return app.json(dict(diff.to_dict(), store=app.url), diff.ok)
        if diff.ok:
            line = f"{diff.rows_compared} row(s) equal a fresh rebuild up to position"
            app.out.print(verdict(True, f"{projection}: {line} {diff.position}"))
            return EXIT_OK
        differs = "read model differs from a fresh rebuild"
        title = f"{projection}: {differs} (up to position {diff.position})"
        table = Table(title=title, title_justify="left")
        table.add_column("key", no_wrap=True)
        table.add_column("difference", style="red")
        for keys, what in (
            (diff.different, "state differs"),
            (diff.only_live, "only in the live table"),
            (diff.only_rebuilt, "missing from the live table"),
        ):
            for k in keys:
                table.add_row(text(k), text(what))
        app.table(table)
        return EXIT_FINDINGS
    if as_json:
        return app.json(dict(rep.to_dict(), store=app.url))
    resumed = f", resumed from position {rep.resumed_from}" if rep.resumed_from else ""
    app.say(
        f"rebuilt {projection}: {rep.events} event(s) into {rep.rows} row(s) in "
        f"{rep.seconds:.2f}s ({rep.events_per_s:,.0f} events/s){resumed}; "
        f"live table is now {rep.table} at position {rep.position}"
    )
    return EXIT_OK
