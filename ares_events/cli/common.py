"""The ``ares-events`` command line.

Exit codes: 0 clean, 1 findings (or a command failed for another reason, said on
stderr), 2 usage or configuration error, 3 store unavailable.

The store comes from ``--store``, else ``ARES_STORE_URL``, else ``sqlite:///ares-events.db``
in the working directory; the CLI says on stderr which store it opened (password
redacted). The environment is read only through :meth:`ares_events.Settings.from_env`.

Adding a command is a local edit: one function, decorated like the ones below::

    @cli.command()
    @json_option
    @pass_app
    def frobnicate(app: App, as_json: bool) -> int:
        '''One line saying what it does.

        \b
        Example:
          ares-events frobnicate --json
        '''
        with app.open() as store:
            data = {...}
        if as_json:
            app.json(data)
        else:
            app.out.print(...)
        return EXIT_OK

Raise library errors freely: :func:`main` maps them to exit codes and prints one line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlsplit

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ares_events import __version__
from ares_events.core.events import RecordedEvent
from ares_events.core.store import EventStore
from ares_events.errors import (
    AresError,
    ChainIntegrityError,
    ConfigError,
    InvalidEvent,
    MissingDependencyError,
    StoreError,
    StoreUnavailable,
)
from ares_events.integrity.findings import Finding
from ares_events.integrity.verify import audit, verify_stream
from ares_events.stores import open_store
from ares_events.stores.settings import DEFAULT_CLI_STORE, Settings

__all__ = [
    "EXIT_FINDINGS",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "App",
    "cli",
    "json_option",
    "main",
    "pass_app",
]

logger = logging.getLogger(__name__)

EXIT_OK: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = 3

PROG: Final = "ares-events"
MAX_FINDINGS_SHOWN: Final = 50
"""Human output lists at most this many findings; ``--json`` lists them all."""
PAYLOAD_WIDTH: Final = 60


class CommandError(click.ClickException):
    """A command cannot do what was asked (e.g. no such stream): one line, exit 2."""

    exit_code = EXIT_USAGE


# -- shared state -----------------------------------------------------------------------


@dataclass
class App:
    """Per-invocation state: global options, consoles and secrets to keep out of output."""

    store_opt: str | None = None
    blobs_opt: str | None = None
    quiet: bool = False
    out: Console = field(default_factory=lambda: Console(highlight=False, soft_wrap=True))
    err: Console = field(
        default_factory=lambda: Console(stderr=True, highlight=False, soft_wrap=True)
    )
    secrets: set[str] = field(default_factory=set)

    def note(self, message: str) -> None:
        """A status line on stderr (silenced by ``-q``)."""
        if not self.quiet:
            self.err.print(Text(message, style="dim"))

    def json(self, data: dict[str, Any]) -> None:
        """Write ``data`` as the one JSON object on stdout."""
        click.echo(json.dumps(data, ensure_ascii=False, default=str))

    def _remember_secrets(self, url: str | None, settings: Settings) -> None:
        if url:
            try:
                parts = urlsplit(url)
                if parts.password:
                    self.secrets.add(parts.password)
                    self.secrets.add(quote(parts.password, safe=""))
                    raw = parts.netloc.rsplit("@", 1)[0].partition(":")[2]
                    if raw:
                        self.secrets.add(raw)
            except ValueError:
                pass
        if settings.chain_key is not None:
            self.secrets.add(settings.chain_key.key.hex())

    def scrub(self, text: str) -> str:
        """``text`` with every known secret replaced by ``***`` (defence in depth)."""
        for s in sorted(self.secrets, key=len, reverse=True):
            if len(s) >= 3:
                text = text.replace(s, "***")
        return text

    def raw_store_url(self) -> str:
        """The store URL as configured (may hold a password: never print it)."""
        return self.store_opt or Settings.from_env().store_url or DEFAULT_CLI_STORE

    @contextlib.contextmanager
    def open(self, **options: Any) -> Iterator[EventStore]:
        """Open the configured store, say which on stderr, close it afterwards.

        Raises:
            ConfigError: bad URL or environment value.
            StoreUnavailable: the store cannot be reached.
        """
        settings = Settings.from_env()
        url = self.store_opt or settings.store_url or DEFAULT_CLI_STORE
        blobs = self.blobs_opt or settings.blobs_url
        self._remember_secrets(url, settings)
        self._remember_secrets(blobs, settings)
        self._remember_secrets(settings.cache_url, settings)
        if blobs is not None:
            options["blobs"] = blobs
        if settings.cache_url is not None:
            options["cache"] = settings.cache_url
        try:
            store = open_store(
                url,
                chain_key=settings.chain_key,
                spill_threshold=settings.spill_threshold_bytes,
                **options,
            )
        except OSError as exc:
            if isinstance(exc, AresError):
                raise
            raise StoreUnavailable(f"cannot open store: {exc.strerror or exc}") from exc
        keyed = " (keyed chain)" if settings.chain_key is not None else ""
        self.note(f"store: {store.url}{keyed}")
        try:
            yield store
        finally:
            store.close()

    def progress(self, description: str) -> Progress:
        """A progress bar on stderr (only on a terminal, not with ``-q``; removed when done)."""
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
            disable=self.quiet or not self.err.is_terminal,
        )


pass_app = click.make_pass_decorator(App)
"""Decorator handing a command the :class:`App` of this invocation."""

json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object on stdout instead of tables.",
)
"""The ``--json`` flag every reporting command takes."""


def _configure_logging(verbose: int, quiet: int) -> None:
    level = logging.WARNING
    if verbose >= 2:
        level = logging.DEBUG
    elif verbose == 1:
        level = logging.INFO
    elif quiet:
        level = logging.ERROR
    root = logging.getLogger("ares_events")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s %(name)s: %(message)s"))
    handler.set_name("ares-events-cli")
    root.addHandler(handler)
    root.setLevel(level)


def _reset_logging(saved_level: int) -> None:
    root = logging.getLogger("ares_events")
    for h in list(root.handlers):
        if h.get_name() == "ares-events-cli":
            root.removeHandler(h)
    root.setLevel(saved_level)


# -- display helpers ----------------------------------------------------------------------


def _short(data: bytes | str, width: int = PAYLOAD_WIDTH) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text if len(text) <= width else text[: width - 1] + "…"


def _event_dict(e: RecordedEvent) -> dict[str, Any]:
    d: dict[str, Any] = {
        "stream_id": e.stream_id,
        "version": e.version,
        "position": e.position,
        "event_id": e.event_id_str,
        "type": e.type,
        "module": e.module,
        "recorded_at": e.at,
        "metadata": e.metadata,
        "prev_hash": e.prev_hash.hex(),
        "hash": e.hash.hex(),
        "payload_ref": None,
    }
    ref = e.payload_ref
    if ref is not None:
        d["payload_ref"] = {"key": ref.key, "size": ref.size, "digest": ref.digest.hex()}
    try:
        d["payload"] = e.payload
    except AresError as exc:  # a spilled payload that cannot be fetched
        d["payload"] = None
        d["payload_error"] = str(exc)
    return d


def _tail_table(app: App, stream: str, events: list[RecordedEvent]) -> Table:
    """One row per event; payloads shortened to what is left of the terminal's width."""
    cols = {
        "ver": [str(e.version) for e in events],
        "pos": [str(e.position) for e in events],
        "time (UTC)": [e.at[11:23] for e in events],
        "type": [e.type for e in events],
        "module": [e.module for e in events],
    }
    widths = {name: max([len(name), *map(len, vals)]) for name, vals in cols.items()}
    # 3 characters of padding and border per column, plus the closing border.
    room = app.out.width - sum(widths.values()) - 3 * (len(cols) + 1) - 1
    width = max(16, room)
    table = Table(title=f"{stream}: last {len(events)} event(s)", title_justify="left")
    for name in cols:
        justify: Any = "right" if name in ("ver", "pos") else "left"
        table.add_column(name, justify=justify, no_wrap=True, min_width=widths[name])
    table.add_column("payload", no_wrap=True, overflow="ellipsis")
    for i, e in enumerate(events):
        ref = e.payload_ref
        payload = (
            f"<spilled: {ref.size} bytes>"
            if ref is not None and not e.payload_loaded
            else _short(e.payload_bytes, width)
        )
        table.add_row(*(Text(vals[i]) for vals in cols.values()), Text(payload))
    return table


def _grouped(findings: list[Finding]) -> list[tuple[Finding, int, int | None]]:
    """Runs of findings with the same kind, stream and detail at consecutive versions,
    as (first finding, count, last version): a wrong chain key is one row, not 1,000."""
    rows: list[tuple[Finding, int, int | None]] = []
    for f in findings:
        if rows:
            first, n, last = rows[-1]
            if (
                (first.kind, first.stream_id, first.detail) == (f.kind, f.stream_id, f.detail)
                and last is not None
                and f.version == last + 1
            ):
                rows[-1] = (first, n + 1, f.version)
                continue
        rows.append((f, 1, f.version))
    return rows


def _findings_table(findings: list[Finding]) -> Table:
    table = Table(title="findings", title_justify="left")
    table.add_column("kind", style="red", no_wrap=True)
    table.add_column("stream", overflow="fold")
    table.add_column("version", justify="right", no_wrap=True)
    table.add_column("detail")
    for f, n, last in _grouped(findings)[:MAX_FINDINGS_SHOWN]:
        where = "" if f.version is None else str(f.version)
        if n > 1:
            where = f"{f.version}..{last} ({n})"
        table.add_row(
            Text(f.kind),
            Text(f.stream_id if f.stream_id is not None else "(store)"),
            where,
            Text(f.detail),
        )
    return table


def _print_findings(app: App, findings: list[Finding]) -> None:
    app.out.print(_findings_table(findings))
    rows = len(_grouped(findings))
    if rows > MAX_FINDINGS_SHOWN:
        app.out.print(f"… and {rows - MAX_FINDINGS_SHOWN} more rows (use --json for all)")


def _status(ok: bool) -> Text:
    return Text("ok", style="green") if ok else Text("FINDINGS", style="bold red")


# -- the command group --------------------------------------------------------------------


@click.group(
    name=PROG,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Store and environment:
  --store URL   else ARES_STORE_URL, else sqlite:///ares-events.db (working directory)
  --blobs URL   else ARES_BLOBS_URL (blob store for spilled payloads)
  ARES_EVENTS_CHAIN_KEY  64 hex digits: keyed chain hashes
\b
Exit codes: 0 clean, 1 findings, 2 usage or config error, 3 store unavailable.
\b
Examples:
  ares-events demo                      10 agents, kill -9 three times, all finish
  ares-events streams
  ares-events tail demo-1a2b3c-agent-01 -n 5
  ares-events --store sqlite:////var/lib/agents.db audit --json""",
)
@click.version_option(__version__, "--version", prog_name=PROG)
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    help="Event store URL (sqlite:///rel.db, sqlite:////abs.db, memory://, postgresql://...).",
)
@click.option("--blobs", "blobs_url", metavar="URL", help="Blob store URL for spilled payloads.")
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-vv: debug).")
@click.option("-q", "--quiet", count=True, help="Only errors on stderr; no progress bars.")
@click.pass_context
def cli(
    ctx: click.Context, store_url: str | None, blobs_url: str | None, verbose: int, quiet: int
) -> None:
    """ares-events: hash-chained, append-only event logs for LLM agents.

    Agents are disposable; their history is not. Inspect, verify and audit a store, or run
    the demo to see it work.
    """
    app = ctx.ensure_object(App)
    app.store_opt = store_url
    app.blobs_opt = blobs_url
    app.quiet = bool(quiet) and not verbose
    _configure_logging(verbose, quiet)


# -- commands (one function each) ------------------------------------------------------------


@cli.command()
@json_option
@pass_app
def init(app: App, as_json: bool) -> int:
    """Create the store's schema, or migrate it to this version.

    Safe to run again: an up-to-date store is left as it is.

    \b
    Example:
      ares-events --store sqlite:///agents.db init
    """
    with app.open() as store:
        getter: Callable[[], int] | None = getattr(store.recorder, "schema_version", None)
        schema = getter() if callable(getter) else None
        streams = sum(1 for _ in store.streams())
        url = store.url
    if as_json:
        app.json({"store": url, "schema_version": schema, "streams": streams})
    else:
        what = (
            f"schema version {schema}"
            if schema is not None
            else "schema version not reported by this backend"
        )
        app.out.print(Text(f"initialized {url}: {what}, {streams} stream(s)"))
    return EXIT_OK


@cli.command()
@json_option
@pass_app
def streams(app: App, as_json: bool) -> int:
    """List every stream with its version and head hash.

    \b
    Example:
      ares-events streams
      ares-events streams --json
    """
    with app.open() as store:
        rows = [(sid, h.version, h.hash.hex()) for sid, h in store.recorder.heads()]
        url = store.url
    if as_json:
        app.json(
            {
                "store": url,
                "count": len(rows),
                "streams": [{"stream_id": s, "version": v, "head_hash": h} for s, v, h in rows],
            }
        )
        return EXIT_OK
    if not rows:
        app.out.print(Text(f"no streams in {url}"))
        return EXIT_OK
    table = Table(title=f"{len(rows)} stream(s)", title_justify="left")
    table.add_column("stream", no_wrap=True)
    table.add_column("version", justify="right")
    table.add_column("head hash", no_wrap=True)
    for sid, version, h in rows:
        table.add_row(Text(sid), str(version), h[:16])
    app.out.print(table)
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
@json_option
@pass_app
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
        if head is not None:
            first = max(1, head.version - count + 1)
            events = list(store.read(stream, from_version=first))[-count:]
        else:  # no head row: still show what the stream holds (verify will flag it)
            events = list(deque(store.read(stream), maxlen=count))
        if not events and head is None:
            raise CommandError(f"no stream {stream!r} in {store.url}")
        rows = [_event_dict(e) for e in events] if as_json else []
        if not as_json:
            table = _tail_table(app, stream, events)
        version = head.version if head is not None else 0
    if as_json:
        app.json({"stream_id": stream, "version": version, "events": rows})
    else:
        app.out.print(table)
    return EXIT_OK


@cli.command()
@click.argument("stream")
@json_option
@pass_app
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
        app.out.print(
            Text.assemble(
                ("ok ", "bold green"),
                f"{stream}: {report.events_checked} events, chain intact, "
                f"head at version {report.head_version}",
            )
        )
    else:
        app.out.print(
            Text.assemble(
                ("FINDINGS ", "bold red"),
                f"{stream}: {len(report.findings)} finding(s) in "
                f"{report.events_checked} events (head says version {report.head_version})",
            )
        )
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
    help="Also check the store still extends every anchor kept at this witness "
    "(file:///folder/ or s3://...; see `anchor`).",
)
@json_option
@pass_app
def audit_cmd(app: App, deep: bool, anchors_url: str | None, as_json: bool) -> int:
    """Verify every stream and the global order of the whole store.

    Checks every chain against its head, and that global positions are strictly
    increasing (and gap-free on stores that promise it: memory, SQLite). A progress bar
    runs on stderr. Exits 1 on findings.

    \b
    Example:
      ares-events audit
      ares-events audit --deep --json
      ares-events audit --anchors file:///var/lib/ares-anchors/
    """
    with app.open() as store, app.progress("auditing") as bar:
        task = bar.add_task("auditing", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, done))

        report = audit(store, deep=deep, progress=progress, anchors=anchors_url)
        url = store.url
    bad = sorted({f.stream_id for f in report.findings if f.stream_id is not None})
    if as_json:
        data = report.to_dict()
        data["store"] = url
        data["deep"] = deep
        data["streams_with_findings"] = bad
        app.json(data)
        return EXIT_OK if report.ok else EXIT_FINDINGS
    table = Table(title=f"audit of {url}", title_justify="left")
    for name in ("streams", "events", "blobs checked", "snapshots checked", "findings", "result"):
        table.add_column(name, justify="right" if name != "result" else "left")
    table.add_row(
        str(report.streams_checked),
        str(report.events_checked),
        str(report.blobs_checked) if deep else "-",
        str(report.snapshots_checked) if deep else "-",
        str(len(report.findings)),
        _status(report.ok),
    )
    app.out.print(table)
    if not report.ok:
        app.out.print(Text(f"{len(bad)} stream(s) with findings"))
        _print_findings(app, report.findings)
    return EXIT_OK if report.ok else EXIT_FINDINGS


@cli.command(name="bench")
@click.option(
    "--events",
    type=click.IntRange(100, 10_000_000),
    default=2000,
    show_default=True,
    help="Events to append in 100-event batches (single appends: a twentieth of it).",
)
@json_option
@pass_app
def bench_cmd(app: App, events: int, as_json: bool) -> int:
    """Measure appends and a verified replay on the configured store, here and now.

    Writes to fresh streams named bench-<random>-... (never an agent's stream). For the
    side-by-side comparison with the eventsourcing library, run the scripts in the
    repository's bench/ folder (see docs/performance.md).

    \b
    Example:
      ares-events --store sqlite:///scratch.db bench
      ares-events --store postgresql://app@db/agents bench --events 10000 --json
    """
    from ares_events.cli.bench import run_bench

    with app.open() as store:
        result = run_bench(store, events=events, progress=None if as_json else app.note)
    chain_ok = all(row.get("ok", True) for row in result.rows)
    if as_json:
        app.json(result.to_dict())
        return EXIT_OK if chain_ok else EXIT_FINDINGS
    table = Table(title=f"bench on {result.store}", title_justify="left")
    for col in ("workload", "events", "seconds", "events/s", "note"):
        table.add_column(col, justify="left" if col in ("workload", "note") else "right")
    for row in result.rows:
        note = ""
        if "p50_ms" in row:
            note = f"p50 {row['p50_ms']} ms"
        elif "ok" in row:
            note = "chain ok" if row["ok"] else "CHAIN FINDINGS"
        table.add_row(
            row["workload"],
            str(row["events"]),
            f"{row['seconds']:.3f}",
            f"{row['events_per_s']:,}" if row["events_per_s"] else "-",
            note,
        )
    app.out.print(table)
    return EXIT_OK if chain_ok else EXIT_FINDINGS


@cli.command(name="gc-blobs")
@click.option(
    "--older-than",
    "older_than",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Grace period (30m, 1h, 2d): younger orphans may belong to appends in flight.",
)
@click.option("--dry-run", is_flag=True, help="Report what would be deleted; delete nothing.")
@json_option
@pass_app
def gc_blobs_cmd(app: App, older_than: str, dry_run: bool, as_json: bool) -> int:
    """Delete blobs no event references (orphans of failed appends).

    Every referenced blob is kept, and so is every blob younger than the grace period,
    so it is safe to run while appends go on. Uses --blobs / ARES_BLOBS_URL, else the
    default folder next to a SQLite store file.

    \b
    Example:
      ares-events gc-blobs --dry-run
      ares-events --blobs s3://bucket/ares gc-blobs --older-than 2d --json
    """
    from ares_events.stores.blobs import gc_blobs, parse_duration

    try:
        grace = parse_duration(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    with app.open() as store:
        report = gc_blobs(store, grace, dry_run=dry_run)
        url = store.url
    if as_json:
        app.json({"store": url, **report.to_dict()})
        return EXIT_OK
    verb = "would delete" if dry_run else "deleted"
    app.out.print(
        Text(
            f"{report.events_scanned} events scanned, {report.referenced_keys} referenced "
            f"blob(s), {report.blobs_listed} listed: kept {report.kept_referenced} referenced "
            f"and {report.kept_young} younger than {older_than}; {verb} "
            f"{len(report.deleted)} orphan(s) ({report.bytes_deleted:,} bytes)"
        )
    )
    return EXIT_OK


@cli.command(name="anchor")
@click.option(
    "--witness",
    metavar="URL",
    help="Where anchors are kept: file:///folder/ or s3://bucket/prefix?endpoint_url=... "
    "(default: ARES_ANCHOR_URL, else a folder anchors/ next to a SQLite store file).",
)
@click.option("--check", is_flag=True, help="Verify the store still extends every stored anchor.")
@json_option
@pass_app
def anchor_cmd(app: App, witness: str | None, check: bool, as_json: bool) -> int:
    """Checkpoint every stream head to a witness outside the store, or check the anchors.

    An anchor records each stream's version and head hash, the last global position and
    a digest. --check proves the store still extends every anchor: a deleted tail (even
    with the head row rewritten to match) or a rewritten chain is a finding. Exits 1 on
    findings.

    \b
    Example:
      ares-events anchor
      ares-events anchor --witness s3://audit-bucket/ares --check --json
    """
    from pathlib import Path

    from ares_events.integrity.anchors import verify_anchors, write_anchor

    settings = Settings.from_env()
    with app.open() as store:
        url = witness or settings.anchor_url
        if url is None:
            path = getattr(store.recorder, "path", None)
            if not isinstance(path, Path):
                raise CommandError(
                    f"no anchor witness for {store.url}: pass --witness URL or set "
                    "ARES_ANCHOR_URL (the default folder needs a SQLite store file)"
                )
            url = (path.absolute().parent / "anchors").as_uri() + "/"
        app._remember_secrets(url, settings)
        if check:
            report = verify_anchors(store, url)
        else:
            anchor = write_anchor(store, url)
        store_url = store.url
    if check:
        if as_json:
            app.json({"store": store_url, **report.to_dict()})
        elif report.anchors_checked == 0 and report.ok:
            app.out.print(Text(f"no anchors in {report.witness}: nothing to check"))
        else:
            app.out.print(
                Text.assemble(
                    (
                        "ok " if report.ok else "FINDINGS ",
                        "bold green" if report.ok else "bold red",
                    ),
                    f"{report.anchors_checked} anchor(s) in {report.witness}, "
                    f"{report.streams_checked} stream(s) checked, "
                    f"{len(report.findings)} finding(s)",
                )
            )
            if not report.ok:
                _print_findings(app, report.findings)
        return EXIT_OK if report.ok else EXIT_FINDINGS
    if as_json:
        app.json({"store": store_url, "location": anchor.name, "anchor": anchor.to_dict()})
    else:
        app.out.print(
            Text(
                f"anchored {len(anchor.heads)} stream(s) at position {anchor.last_position} "
                f"to {anchor.name}"
            )
        )
    return EXIT_OK


# -- entry point ------------------------------------------------------------------------------


def _error(app: App, message: str) -> None:
    # One line: driver messages (e.g. libpq's) may span several.
    click.echo(f"{PROG}: error: {app.scrub(' '.join(message.split()))}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (console script ``ares-events``).

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        0 clean, 1 findings, 2 usage or config error, 3 store unavailable.
    """
    app = App()
    saved_level = logging.getLogger("ares_events").level
    try:
        rv = cli.main(args=argv, prog_name=PROG, standalone_mode=False, obj=app)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        return EXIT_USAGE
    except click.UsageError as exc:
        exc.show()
        return EXIT_USAGE
    except click.ClickException as exc:
        _error(app, exc.format_message())
        return exc.exit_code
    except click.Abort:
        _error(app, "aborted")
        return 130
    except (ConfigError, InvalidEvent, MissingDependencyError) as exc:
        _error(app, str(exc))
        return EXIT_USAGE
    except (StoreUnavailable, StoreError) as exc:
        _error(app, str(exc))
        return EXIT_UNAVAILABLE
    except ChainIntegrityError as exc:
        _error(app, str(exc))
        return EXIT_FINDINGS
    except AresError as exc:
        _error(app, f"{type(exc).__name__}: {exc}")
        return EXIT_FINDINGS
    except BrokenPipeError:
        return EXIT_FINDINGS
    except Exception as exc:
        logger.debug("internal error", exc_info=True)
        _error(app, f"internal error: {type(exc).__name__}: {exc} (run with -vv for details)")
        return EXIT_FINDINGS
    finally:
        _reset_logging(saved_level)
    return int(rv) if isinstance(rv, int) else EXIT_OK
