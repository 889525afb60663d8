"""CLI commands that look at a store: ``init``, ``streams``, ``tail``, ``verify``, ``audit``."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    App,
    CommandError,
    _print_findings,
    _status,
    add_columns,
    cli,
    json_app,
    load_vkeys,
    text,
    verdict,
    visible,
    vkey_option,
)
from ares_events.core.events import ERASURE_STREAM, RecordedEvent
from ares_events.core.recorder import backend_of
from ares_events.errors import AresError
from ares_events.integrity.audit import audit
from ares_events.integrity.verifier import head_problem, malformed_reason
from ares_events.integrity.verify import verify_stream


def _event_dict(e: RecordedEvent) -> dict[str, Any]:
    problem = malformed_reason(e)
    if problem is not None:  # a damaged row: shown as stored, never decoded (verify says more)
        fields = ("stream_id", "version", "position", "event_id", "type", "module", "payload")
        names = (*fields, "metadata", "recorded_at", "prev_hash", "hash")
        raw = dict(zip(names, e[:11], strict=True))
        shown = {k: v.hex() if isinstance(v, bytes) else v for k, v in raw.items()}
        return {**shown, "malformed": problem}
    d: dict[str, Any] = {
        "stream_id": e.stream_id,
        "version": e.version,
        "position": e.position,
        "event_id": e.event_id_str,
        "type": e.type,
        "module": e.module,
        "recorded_at": e.at,
        "metadata": _decoded(lambda: e.metadata, e.metadata_json),
        "prev_hash": e.prev_hash.hex(),
        "hash": e.hash.hex(),
        "payload_ref": None,
    }
    ref = e.payload_ref
    if ref is not None and ref.erased:
        d["payload_ref"] = {"erased": True, "size": ref.size, "digest": ref.digest.hex()}
        return d | {"payload": None, "payload_erased": True}
    if ref is not None:
        d["payload_ref"] = {"key": ref.key, "size": ref.size, "digest": ref.digest.hex()}
    try:
        d["payload"] = _decoded(lambda: e.payload, e.payload_bytes)
    except AresError as exc:  # a spilled payload that cannot be fetched
        d |= {"payload": None, "payload_error": str(exc)}
    return d


def _decoded(value: Callable[[], Any], raw: bytes | None) -> Any:
    """``value()``, or ``{"not_json": <raw as text>}`` for an edited row (verify reports it)."""
    try:
        return value()
    except ValueError:
        return {"not_json": (raw or b"").decode("utf-8", "replace")}


def _tail_table(app: App, stream: str, events: list[RecordedEvent]) -> Table:
    cols = {
        "ver": [visible(str(e.version)) for e in events],
        "pos": [visible(str(e.position)) for e in events],
        "time (UTC)": [visible(str(e.at))[11:23] for e in events],
        "type": [visible(str(e.type)) for e in events],
        "module": [visible(str(e.module)) for e in events],
    }
    widths = {name: max([len(name), *map(len, vals)]) for name, vals in cols.items()}
    # 3 characters of padding and border per column, plus the closing border.
    width = max(16, app.out.width - sum(widths.values()) - 3 * (len(cols) + 1) - 1)
    table = Table(title=text(f"{stream}: last {len(events)} event(s)"), title_justify="left")
    for name in cols:
        justify: Any = "right" if name in ("ver", "pos") else "left"
        table.add_column(name, justify=justify, no_wrap=True, min_width=widths[name])
    table.add_column("payload", no_wrap=True, overflow="ellipsis")
    for i, e in enumerate(events):
        ref = e.payload_ref
        problem = malformed_reason(e)
        if problem is not None:
            payload = visible(f"<malformed row: {problem}>")
        elif ref is not None and ref.erased:
            payload = f"<erased: {ref.size} bytes>"
        elif ref is not None and not e.payload_loaded:
            payload = f"<spilled: {ref.size} bytes>"
        else:
            payload = visible(e.payload_bytes.decode("utf-8", "replace"))
            if len(payload) > width:
                payload = payload[: width - 1] + "…"
        table.add_row(*(Text(vals[i]) for vals in cols.values()), Text(payload))
    return table


@cli.command()
@click.option(
    "--relocate-blobs",
    is_flag=True,
    help="Record --blobs as the store's blob location (after moving its blobs there).",
)
@json_app
def init(app: App, relocate_blobs: bool, as_json: bool) -> int:
    """Create the store, or migrate it to this version, and record its identity.

    The identity (chain mode and key id, blob location, format) is what every later
    open is checked against: a process with another chain key, none, or another blob
    location is refused before it writes anything. Safe to run again: an up-to-date
    store is left as it is.

    \b
    Example:
      ares-events --store sqlite:///agents.db init
      ARES_EVENTS_CHAIN_KEY=... ares-events --store postgresql://app@db/agents init
      ares-events --blobs s3://bucket/ares init --relocate-blobs
    """
    if relocate_blobs and not app.blobs_opt:
        raise click.UsageError("--relocate-blobs needs --blobs URL (the new location)")
    from ares_events.stores.blobs.gc import check_apart, recorded_archive

    with app.open(create=True, check_identity=not relocate_blobs) as store:
        if relocate_blobs:
            # the one check the archive run and gc-blobs make: gc-blobs would delete segments
            check_apart(store.blobs, recorded_archive(store))
        getter = getattr(backend_of(store.recorder), "schema_version", None)
        schema: int | None = getter() if callable(getter) else None
        ident = store.record_identity(relocate_blobs=relocate_blobs)
        streams = sum(1 for _ in store.streams())
    chain = ident.describe_chain() if ident is not None else "not recorded by this backend"
    where = None if ident is None else ident.blobs
    blobs = "none" if where is None else "the folder next to the SQLite file"
    if where is not None and not isinstance(where, str):
        blobs = where.location
    if as_json:
        identity = json.loads(ident.to_json()) if ident is not None else None
        data = {"store": app.url, "schema_version": schema, "streams": streams}
        return app.json({**data, "identity": identity})
    what = "not reported by this backend" if schema is None else schema
    app.say(f"initialized {app.url}: schema version {what}, {streams} stream(s)")
    app.say(f"chain: {chain}; blobs: {blobs}")
    return EXIT_OK


@cli.command()
@json_app
def streams(app: App, as_json: bool) -> int:
    """List every stream with its version and head hash.

    \b
    Example:
      ares-events streams
      ares-events streams --json
    """
    from ares_events.integrations import stream_kind

    def kind(sid: str) -> tuple[str, str | None]:
        if sid == ERASURE_STREAM:
            return "erasure records", None
        return stream_kind(sid) or ("", None)

    with app.open() as store:
        rows = [(sid, h.version, h.hash.hex(), *kind(sid)) for sid, h in store.recorder.heads()]
    if as_json:
        streams = [
            {"stream_id": s, "version": v, "head_hash": h}
            | ({"kind": k} if k else {})
            | ({"thread_id": t} if t is not None else {})
            for s, v, h, k, t in rows
        ]
        return app.json({"store": app.url, "count": len(rows), "streams": streams})
    if not rows:
        app.say(f"no streams in {app.url}")
        return EXIT_OK
    table = Table(title=f"{len(rows)} stream(s)", title_justify="left")
    add_columns(table, "stream", "version", "head hash", right=("version",), no_wrap=True)
    table.add_column("kind", overflow="fold")
    for sid, version, h, k, t in rows:
        table.add_row(text(sid), str(version), h[:16], text(f"{k} {t}" if t is not None else k))
    app.table(table, optional=("head hash", "kind"))
    return EXIT_OK


@cli.command()
@click.argument("stream")
@click.option(
    "-n",
    "--lines",
    "count",
    type=click.IntRange(1, 100_000),
    default=20,
    show_default=True,
    help="How many events, counted from the end.",
)
@json_app
def tail(app: App, stream: str, count: int, as_json: bool) -> int:
    """Show the last events of STREAM.

    People get one line per event with a shortened payload; --json gives every field and
    the full payload.

    \b
    Example:
      ares-events tail demo-1a2b3c-agent-01 -n 5
      ares-events tail agent-7 --json
    """
    with app.open() as store:
        head = store.head(stream)
        if head is not None and head_problem(head) is not None:
            head = None  # a damaged head row: shown as no head (verify reports it)
        if head is not None:
            first = max(1, head.version - count + 1)
            events = list(store.read(stream, from_version=first))[-count:]
        else:  # no head row: still show what the stream holds (verify will flag it)
            events = list(deque(store.read(stream), maxlen=count))
        if not events and head is None:
            raise CommandError(f"no stream {stream!r} in {store.url}")
        # Inside the open store: a spilled payload is fetched for --json.
        if as_json:
            version = head.version if head is not None else 0
            rows = [_event_dict(e) for e in events]
            app.json({"stream_id": stream, "version": version, "events": rows})
        else:
            app.table(_tail_table(app, stream, events), optional=("module", "pos"))
    return EXIT_OK


@cli.command()
@click.argument("stream")
@json_app
def verify(app: App, stream: str, as_json: bool) -> int:
    """Recompute STREAM's hash chain and check it against its head.

    Reports edited, missing, duplicated or reordered events and a truncated tail.
    Exits 1 when there are findings.

    \b
    Example:
      ares-events verify agent-7
      ares-events verify agent-7 --json
    """
    with app.open() as store:
        report = verify_stream(store, stream)
        if report.events_checked == 0 and report.head_version == 0:
            raise CommandError(f"no stream {stream!r} in {store.url}")
    if as_json:
        app.json(report.to_dict())
    elif report.ok:
        line = f"{report.events_checked} events, chain intact, head at version"
        app.out.print(verdict(True, f"{stream}: {line} {report.head_version}"))
    else:
        line = f"{len(report.findings)} finding(s) in {report.events_checked} events"
        app.out.print(verdict(False, f"{stream}: {line} (head says version {report.head_version})"))
        _print_findings(app, report.findings)
    return EXIT_OK if report.ok else EXIT_FINDINGS


@cli.command(name="audit")
@click.option(
    "--deep",
    is_flag=True,
    help="Also fetch every spilled payload and check its digest, and check every snapshot.",
)
@click.option(
    "--anchors",
    "anchors_url",
    metavar="URL",
    help="Also check the store still extends every anchor kept at this location "
    "(file:///folder/ or s3://...; see `anchor`).",
)
@vkey_option(
    "--anchors: a trusted verifier key for signed checkpoints (repeatable; default: "
    "ARES_LOG_VKEY, else the log keys the store recorded)."
)
@json_app
def audit_cmd(
    app: App, deep: bool, anchors_url: str | None, vkeys: tuple[str, ...], as_json: bool
) -> int:
    """Verify every stream and the global positions of the whole store.

    Checks every chain against its head, and that global positions are strictly
    increasing (and gap-free on stores that promise it: memory, SQLite); positions are not
    hashed, so a rewritten interleaving of streams is caught by --anchors only. Erased payloads
    are listed as information, not findings. With --anchors, also proves the log still
    extends every signed checkpoint kept at that location. A progress bar
    runs on stderr. Exits 1 on findings.

    \b
    Example:
      ares-events audit
      ares-events audit --deep --json
      ares-events audit --anchors file:///var/lib/ares-anchors/ --vkey log.vkey
    """
    with app.open() as store, app.progress("auditing") as progress:
        # --vkey, else ARES_LOG_VKEY, else None: the keys the store recorded
        keys = load_vkeys(vkeys, required=False) or None
        report = audit(store, deep=deep, progress=progress, anchors=anchors_url, anchor_keys=keys)
    bad = sorted({f.stream_id for f in report.findings if f.stream_id is not None})
    if as_json:
        data = dict(report.to_dict(), store=app.url, deep=deep, streams_with_findings=bad)
        return app.json(data, report.ok)
    table = Table(title=text(f"audit of {app.url}"), title_justify="left")
    columns = ["streams", "events", "blobs checked", "snapshots checked"]
    cells = [str(report.streams_checked), str(report.events_checked)]
    cells += [str(n) if deep else "-" for n in (report.blobs_checked, report.snapshots_checked)]
    if report.anchors_checked is not None:
        columns.append("anchors checked")
        cells.append(str(report.anchors_checked))
    add_columns(table, *columns, "findings", "result", right=(*columns, "findings"))
    table.add_row(*cells, str(len(report.findings)), _status(report.ok))
    app.table(table)
    if report.erased:
        app.say(
            f"{len(report.erased)} erased payload(s) (information: their chains and "
            "proofs stay valid; --json lists them)"
        )
    if not report.ok:
        app.say(f"{len(bad)} stream(s) with findings")
        _print_findings(app, report.findings)
    return EXIT_OK if report.ok else EXIT_FINDINGS
