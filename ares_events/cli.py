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
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlsplit

import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ares_events import __version__
from ares_events.errors import (
    AresError,
    ChainIntegrityError,
    ConfigError,
    InvalidEvent,
    MissingDependencyError,
    StoreError,
    StoreUnavailable,
)
from ares_events.events import RecordedEvent
from ares_events.integrity.verify import Finding, audit, verify_stream
from ares_events.settings import DEFAULT_CLI_STORE, Settings
from ares_events.store import EventStore
from ares_events.stores import open_store

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


def _findings_table(findings: list[Finding]) -> Table:
    table = Table(title="findings", title_justify="left")
    table.add_column("kind", style="red", no_wrap=True)
    table.add_column("stream", no_wrap=True)
    table.add_column("version", justify="right")
    table.add_column("detail")
    for f in findings[:MAX_FINDINGS_SHOWN]:
        table.add_row(
            Text(f.kind),
            Text(f.stream_id if f.stream_id is not None else "(store)"),
            str(f.version) if f.version is not None else "",
            Text(f.detail),
        )
    return table


def _print_findings(app: App, findings: list[Finding]) -> None:
    app.out.print(_findings_table(findings))
    if len(findings) > MAX_FINDINGS_SHOWN:
        app.out.print(f"… and {len(findings) - MAX_FINDINGS_SHOWN} more (use --json for all)")


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
@click.option("--deep", is_flag=True, help="Also fetch every spilled payload and check its digest.")
@json_option
@pass_app
def audit_cmd(app: App, deep: bool, as_json: bool) -> int:
    """Verify every stream and the global order of the whole store.

    Checks every chain against its head, and that global positions are strictly
    increasing (and gap-free on stores that promise it: memory, SQLite). A progress bar
    runs on stderr. Exits 1 on findings.

    \b
    Example:
      ares-events audit
      ares-events audit --deep --json
    """
    with app.open() as store, app.progress("auditing") as bar:
        task = bar.add_task("auditing", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, done))

        report = audit(store, deep=deep, progress=progress)
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
    for name in ("streams", "events", "blobs checked", "findings", "result"):
        table.add_column(name, justify="right" if name != "result" else "left")
    table.add_row(
        str(report.streams_checked),
        str(report.events_checked),
        str(report.blobs_checked) if deep else "-",
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
    from ares_events.benchmark import run_bench

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


def _projection_names() -> list[str]:
    """Names of the built-in projections (``recover``, ``snapshot``, ``rebuild``)."""
    from ares_events.projections import BUILTIN

    return sorted(BUILTIN)


def _projection_option(default: str | None) -> Callable[[Any], Any]:
    """``--projection NAME`` over the built-in projections."""
    return click.option(
        "--projection",
        "projection",
        type=click.Choice(_projection_names()),
        default=default,
        show_default=default is not None,
        help="Built-in projection to fold"
        + ("." if default is not None else " (default: every projection)."),
    )


def _schema_failure(exc: AresError, hint: str) -> click.ClickException:
    """A schema failure of a stored event: exit 1 (a finding about the data), one line."""
    return click.ClickException(f"{exc} ({hint})")


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
@json_option
@pass_app
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
    from ares_events.catalog import EventSchemaError
    from ares_events.projections import BUILTIN
    from ares_events.recovery import recover

    with app.open() as store:
        proj = BUILTIN[projection]()
        try:
            rep = recover(
                store,
                stream,
                proj,
                snapshots=None if no_snapshots else store.snapshots,
                max_replay=max_replay,
                tolerant=tolerant,
            )
        except EventSchemaError as exc:
            raise _schema_failure(exc, "use --tolerant to skip and list such events") from None
        if rep.head_version == 0 and rep.version == 0 and not rep.findings:
            raise CommandError(f"no stream {stream!r} in {store.url}")
        url = store.url
    ok = rep.ok and not rep.truncated
    if as_json:
        data = rep.to_dict()
        data["store"] = url
        app.json(data)
        return EXIT_OK if ok else EXIT_FINDINGS
    if rep.snapshot_version is not None:
        snap = f"used, at version {rep.snapshot_version}"
    elif rep.snapshot_ignored is not None:
        snap = f"ignored: {rep.snapshot_ignored}"
    else:
        snap = "disabled (--no-snapshots)" if no_snapshots else "none stored"
    table = Table(title=f"recovery of {stream} ({projection})", title_justify="left")
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
        table.add_row(Text(name), Text(value))
    table.add_row(Text("result"), _status(ok))
    app.out.print(table)
    if rep.findings:
        _print_findings(app, rep.findings)
    for s in rep.skipped[:MAX_FINDINGS_SHOWN]:
        app.out.print(Text(f"skipped {s.stream_id} version {s.version} ({s.type}): {s.reason}"))
    app.out.print(Text("state:", style="bold"))
    app.out.print(Text(json.dumps(rep.state, indent=2, sort_keys=True, ensure_ascii=False)))
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


def _snapshot_rows_table(title: str, rows: list[tuple[Any, Any]], check: bool) -> Table:
    table = Table(title=title, title_justify="left")
    # Names fold onto more lines rather than being cut: they are what people copy.
    table.add_column("stream", overflow="fold")
    table.add_column("projection", overflow="fold")
    for name in ("ver", "at", "at hash", "bytes", "created (UTC)"):
        numeric = name in ("ver", "at", "bytes")
        table.add_column(name, no_wrap=True, justify="right" if numeric else "left")
    if check:
        table.add_column("check", overflow="fold")
    for info, reason in rows:
        cells = [
            Text(info.stream_id),
            Text(info.projection),
            str(info.projection_version),
            str(info.at_version),
            info.at_hash.hex()[:12],
            str(info.state_size),
            info.to_dict()["created_at"][:19].replace("T", " "),
        ]
        if check:
            cells.append(Text("ok", style="green") if reason is None else Text(reason, "red"))
        table.add_row(*cells)
    return table


@snapshot_cmd.command(name="list")
@click.argument("stream", required=False)
@json_option
@pass_app
def snapshot_list(app: App, stream: str | None, as_json: bool) -> int:
    """List stored snapshots (of STREAM, or of every stream), without their state.

    \b
    Example:
      ares-events snapshot list
      ares-events snapshot list agent-7 --json
    """
    with app.open() as store:
        infos = list(store.snapshots.list(stream))
        url = store.url
    if as_json:
        app.json({"store": url, "count": len(infos), "snapshots": [i.to_dict() for i in infos]})
    elif not infos:
        app.out.print(Text(f"no snapshots{f' of {stream}' if stream else ''} in {url}"))
    else:
        rows = [(i, None) for i in infos]
        app.out.print(_snapshot_rows_table(f"{len(infos)} snapshot(s)", rows, check=False))
    return EXIT_OK


@snapshot_cmd.command(name="take")
@click.argument("stream")
@_projection_option(None)
@json_option
@pass_app
def snapshot_take(app: App, stream: str, projection: str | None, as_json: bool) -> int:
    """Fold STREAM now (from its latest good snapshot) and save a snapshot.

    Without --projection a snapshot of every built-in projection is taken. Refuses a
    stream whose chain has findings (exit 1): a snapshot would launder them.

    \b
    Example:
      ares-events snapshot take agent-7
      ares-events snapshot take run-42 --projection run_state --json
    """
    from ares_events.catalog import EventSchemaError
    from ares_events.projections import BUILTIN
    from ares_events.recovery import snapshot

    names = [projection] if projection is not None else sorted(BUILTIN)
    with app.open() as store:
        if store.stream_version(stream) == 0:
            raise CommandError(f"no stream {stream!r} in {store.url}")
        taken = []
        for name in names:
            try:
                snap = snapshot(store, stream, BUILTIN[name]())
            except EventSchemaError as exc:
                raise _schema_failure(exc, "fix or upcast the event first") from None
            if snap is not None:
                taken.append(snap.info())
        url = store.url
    if as_json:
        app.json({"store": url, "stream_id": stream, "snapshots": [i.to_dict() for i in taken]})
    else:
        for i in taken:
            app.out.print(
                Text(
                    f"snapshot of {i.projection} for {stream} at version {i.at_version} "
                    f"({i.state_size} bytes)"
                )
            )
    return EXIT_OK


@snapshot_cmd.command(name="delete")
@click.argument("stream")
@_projection_option(None)
@json_option
@pass_app
def snapshot_delete(app: App, stream: str, projection: str | None, as_json: bool) -> int:
    """Delete STREAM's snapshot of one projection, or all of STREAM's snapshots.

    Safe: recovery then replays from the events (a snapshot is only a cache).

    \b
    Example:
      ares-events snapshot delete agent-7
      ares-events snapshot delete agent-7 --projection genealogy
    """
    with app.open() as store:
        n = store.snapshots.delete(stream, projection)
        url = store.url
    if as_json:
        app.json({"store": url, "stream_id": stream, "projection": projection, "deleted": n})
    else:
        what = f" of {projection}" if projection else ""
        app.out.print(Text(f"deleted {n} snapshot(s){what} for {stream}"))
    return EXIT_OK


@snapshot_cmd.command(name="verify")
@click.argument("stream", required=False)
@json_option
@pass_app
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
        url = store.url
    bad = [(i, r) for i, r in rows if r is not None]
    if as_json:
        app.json(
            {
                "store": url,
                "ok": not bad,
                "checked": len(rows),
                "bad": len(bad),
                "snapshots": [dict(i.to_dict(), ok=r is None, reason=r) for i, r in rows],
            }
        )
    else:
        if rows:
            title = f"{len(rows)} snapshot(s) checked"
            app.out.print(_snapshot_rows_table(title, rows, check=True))
        app.out.print(
            Text(f"{len(bad)} bad snapshot(s)", style="bold red")
            if bad
            else Text(f"{len(rows)} snapshot(s) checked, all match their streams", style="green")
        )
    return EXIT_FINDINGS if bad else EXIT_OK


@cli.command(name="rebuild")
@click.argument("projection", type=click.Choice(_projection_names()))
@click.option(
    "--from-scratch",
    is_flag=True,
    help="Discard an interrupted rebuild instead of resuming it.",
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
@json_option
@pass_app
def rebuild_cmd(
    app: App,
    projection: str,
    from_scratch: bool,
    verify_only: bool,
    batch_size: int,
    as_json: bool,
) -> int:
    """Rebuild PROJECTION's read model from the log and swap it in atomically.

    The new table fills while the live one keeps serving reads; an interrupted rebuild
    resumes where it stopped (unless --from-scratch). A progress bar with events/s runs
    on stderr. With --verify it instead rebuilds beside the live table up to its cursor
    and lists every key whose state differs; exits 1 when the diff is not clean.

    \b
    Example:
      ares-events rebuild agent_state
      ares-events rebuild agent_state --from-scratch --batch-size 5000
      ares-events rebuild agent_state --verify --json
    """
    import time

    from ares_events.catalog import EventSchemaError
    from ares_events.projections import BUILTIN, rebuild, verify_rebuild

    if verify_only and from_scratch:
        raise click.UsageError("--verify builds beside the live table; drop --from-scratch")
    label = "verifying" if verify_only else "rebuilding"
    with app.open() as store, app.progress(label) as bar:
        task = bar.add_task(f"{label} {projection}", total=None)
        started = time.perf_counter()

        def progress(done: int, total: int) -> None:
            rate = done / max(time.perf_counter() - started, 1e-9)
            bar.update(
                task,
                completed=done,
                total=max(total, done),
                description=f"{label} {projection} ({rate:,.0f} events/s)",
            )

        proj = BUILTIN[projection]()
        if verify_only:
            diff = verify_rebuild(store, proj, batch_size=batch_size, progress=progress)
        else:
            try:
                rep = rebuild(
                    store,
                    proj,
                    from_scratch=from_scratch,
                    batch_size=batch_size,
                    progress=progress,
                )
            except EventSchemaError as exc:
                raise _schema_failure(
                    exc, "the rebuild stopped and resumes from here once the event is fixed"
                ) from None
        url = store.url
    if verify_only:
        if as_json:
            app.json(dict(diff.to_dict(), store=url))
            return EXIT_OK if diff.ok else EXIT_FINDINGS
        if diff.ok:
            app.out.print(
                Text.assemble(
                    ("ok ", "bold green"),
                    f"{projection}: {diff.rows_compared} row(s) equal a fresh rebuild "
                    f"up to position {diff.position}",
                )
            )
            return EXIT_OK
        table = Table(
            title=f"{projection}: read model differs from a fresh rebuild "
            f"(up to position {diff.position})",
            title_justify="left",
        )
        table.add_column("key", no_wrap=True)
        table.add_column("difference", style="red")
        for keys, what in (
            (diff.different, "state differs"),
            (diff.only_live, "only in the live table"),
            (diff.only_rebuilt, "missing from the live table"),
        ):
            for k in keys:
                table.add_row(Text(k), Text(what))
        app.out.print(table)
        return EXIT_FINDINGS
    if as_json:
        app.json(dict(rep.to_dict(), store=url))
        return EXIT_OK
    resumed = f", resumed from position {rep.resumed_from}" if rep.resumed_from else ""
    app.out.print(
        Text(
            f"rebuilt {projection}: {rep.events} event(s) into {rep.rows} row(s) in "
            f"{rep.seconds:.2f}s ({rep.events_per_s:,.0f} events/s){resumed}; "
            f"live table is now {rep.table} at position {rep.position}"
        )
    )
    return EXIT_OK


@cli.command()
@click.option(
    "--agents",
    type=click.IntRange(1, 1000),
    default=None,
    help="Agents to run (default 10; 5 with --simple).",
)
@click.option(
    "--kills",
    type=click.IntRange(0, 100),
    default=3,
    show_default=True,
    help="Times to SIGKILL the whole process group (supervisor and every agent).",
)
@click.option(
    "--steps",
    type=click.IntRange(1, 10_000),
    default=12,
    show_default=True,
    help="Research steps per agent (one model call, one ticket, one state patch each).",
)
@click.option("--seed", type=int, default=None, help="Seed for reproducible kill points/content.")
@click.option(
    "--simple",
    is_flag=True,
    help="Instead: a quick single-process simulation that appends and verifies streams.",
)
@click.option(
    "--events",
    type=click.IntRange(8, 1_000_000),
    default=300,
    show_default=True,
    help="With --simple: events per agent.",
)
@json_option
@pass_app
def demo(
    app: App,
    agents: int | None,
    kills: int,
    steps: int,
    seed: int | None,
    simple: bool,
    events: int,
    as_json: bool,
) -> int:
    """The kill -9 story: agents die, the supervisor resurrects them, nothing is lost.

    N agents (default 10) run a deterministic research task through a write-ahead
    journal against a fake LLM (counts calls and tokens) and a fake ticketing service
    (records side effects in its own SQLite table, honours idempotency keys). The demo
    SIGKILLs the whole process group at seeded random points, restarts the supervisor,
    which resurrects every agent from snapshot + tail, and all finish. It then reports
    per agent: steps, resumes, model calls made vs answered from the log (tokens saved),
    tool side effects and duplicates (0), resume time and chain verification.

    With --simple it instead appends a few hundred lifecycle events per agent in one
    process and verifies every chain.

    \b
    Example:
      ares-events demo
      ares-events demo --kills 3 --seed 7 --json
      ares-events demo --simple --agents 3 --events 100
    """
    if not simple:
        return _resurrection_demo(app, agents or 10, kills, steps, seed, as_json)
    agents = agents or 5
    from ares_events.demo import run_demo

    with app.open() as store, app.progress("appending") as bar:
        task = bar.add_task("appending", total=agents * events)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        result = run_demo(store, agents=agents, events=events, seed=seed, progress=progress)
        url = store.url
    if as_json:
        data = result.to_dict()
        data["store"] = url
        app.json(data)
        return EXIT_OK if result.all_ok else EXIT_FINDINGS
    table = Table(
        title=f"demo run {result.run_id}: {agents} agents x {events} events",
        title_justify="left",
    )
    table.add_column("stream", no_wrap=True)
    table.add_column("version", justify="right")
    table.add_column("events", justify="right")
    table.add_column("verified", no_wrap=True)
    for s in result.streams:
        table.add_row(Text(s.stream_id), str(s.version), str(s.events), _status(s.ok))
    app.out.print(table)
    app.out.print(
        Text(
            f"{result.events} events appended in {result.append_seconds:.2f}s "
            f"({result.append_rate:,.0f} events/s, one transaction per step); "
            f"verified in {result.verify_seconds:.2f}s ({result.verify_rate:,.0f} events/s)"
        )
    )
    if result.all_ok:
        app.out.print(Text("all chains verified", style="bold green"))
        first = result.streams[0].stream_id
        app.out.print(
            Text(f"next: {PROG} streams | {PROG} tail {first} -n 5 | {PROG} audit", style="dim")
        )
        return EXIT_OK
    for s in result.streams:
        if s.findings:
            _print_findings(app, s.findings)
    return EXIT_FINDINGS


def _resurrection_demo(
    app: App, agents: int, kills: int, steps: int, seed: int | None, as_json: bool
) -> int:
    from ares_events.resurrection import run_demo as run_kill_demo

    with app.open() as store:
        url = store.url
        raw_url = app.raw_store_url()
    report = run_kill_demo(
        raw_url,
        blobs_url=app.blobs_opt,
        agents=agents,
        steps=steps,
        snapshot_every=(
            Settings.from_env().snapshot_every if os.environ.get("ARES_SNAPSHOT_EVERY") else 20
        ),
        kills=kills,
        seed=7 if seed is None else seed,
        progress=None if as_json else app.note,
    )
    data = report.to_dict()
    data["store"] = url
    ok = (
        report.all_finished
        and data["duplicate_side_effects"] == 0
        and data["reissued_model_calls"] == 0
        and data["all_chains_ok"]
    )
    if as_json:
        app.json(data)
        return EXIT_OK if ok else EXIT_FINDINGS
    table = Table(
        title=f"kill -9 demo {report.run}: {agents} agents, {report.kills} kills",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
        caption=(
            "calls: model calls made; logged: answered from the log (saved: tokens not "
            "re-paid);\neffects: tickets created; dupes: duplicate side effects; "
            "ms: median resume time"
        ),
        caption_justify="left",
    )
    for col in (
        "agent",
        "fin",
        "steps",
        "resumes",
        "calls",
        "logged",
        "saved",
        "effects",
        "dupes",
        "ms",
        "chain",
    ):
        table.add_column(col, justify="left" if col in ("agent", "done", "chain") else "right")
    for a in report.agents:
        table.add_row(
            Text(a.agent.removeprefix(report.run + "-")),
            _status(a.finished),
            str(a.steps),
            str(a.resumes),
            str(a.model_calls_made),
            str(a.model_calls_answered_from_log),
            str(a.tokens_saved),
            str(a.tool_side_effects),
            str(a.duplicate_side_effects),
            "-" if a.resume_ms is None else f"{a.resume_ms:.0f}",
            _status(a.chain_ok),
        )
    app.out.print(table)
    app.out.print(
        Text(
            f"all finished: {report.all_finished}; kills: {report.kills}; "
            f"duplicate side effects: {data['duplicate_side_effects']}; re-issued model calls "
            f"for answered steps: {data['reissued_model_calls']}; model calls answered from "
            f"the log: {data['model_calls_saved']} ({data['tokens_saved']} tokens saved); "
            f"{report.seconds:.1f}s",
            style="bold green" if ok else "bold red",
        )
    )
    return EXIT_OK if ok else EXIT_FINDINGS


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
