"""What every ``ares-events`` command shares: the click group, per-invocation state,
options, exit codes and display helpers; print store content with :func:`text`.

It may import anything below the CLI; never a command module.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import quote, urlsplit

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ares_events import __version__
from ares_events.cli.terminal import VisibleFormatter, VisibleHook, dumps, fitted, text, visible
from ares_events.core.store import EventStore
from ares_events.errors import AresError, ConfigError, StoreUnavailable
from ares_events.integrity.findings import Finding
from ares_events.integrity.notes import SigningKey, VerifierKey, read_key_file
from ares_events.stores import open_store
from ares_events.stores.settings import DEFAULT_CLI_STORE, Settings

__all__ = [
    "EXIT_FINDINGS",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "App",
    "cli",
    "json_app",
    "json_option",
    "key_option",
    "load_signing_key",
    "load_vkeys",
    "pass_app",
    "text",
    "verdict",
    "visible",
    "vkey_option",
]

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = 3
EXIT_INTERNAL: Final = 4
"""A bug or an unexpected failure; the traceback is printed with ``-v``."""
EXIT_CONFLICT: Final = 5
"""The store changed under the command (another writer got there first): read again and
retry. Not a usage error: the same command can succeed when run again."""

PROG: Final = "ares-events"
MAX_FINDINGS_SHOWN: Final = 50
"""Human output lists at most this many findings; ``--json`` lists them all."""
READ_ONLY_SCHEMES: Final = frozenset({"sqlite", "postgresql", "postgres", "citus", "pgcells"})
"""Backends with a read-only mode (``read_only=True``): a store of another scheme opened
for reading relies on the command not writing."""


_CHAIN_KEY_ARG: Final = re.compile(r"[0-9A-Fa-f]{64}")
_PIECE: Final = re.compile(r"[0-9A-Za-z+/=]{16,}")
"""16 or more base64 (or hex) characters in a row: a secret's piece when one holds it."""


def secret_args(args: Iterable[str]) -> set[str]:
    """The arguments holding a private signing key (keygen's ``PRIVATE+KEY+...`` text) or
    a chain key's value (64 hex digits, also as ``--option=VALUE``): given by mistake in
    another argument's place, an error would echo them."""
    found = set()
    for arg in args:
        value = (arg.partition("=")[2] if arg.startswith("-") else arg).strip()
        if "PRIVATE+KEY+" in arg.upper():
            found.add(arg)
        elif _CHAIN_KEY_ARG.fullmatch(value):
            found.add(value)
    return found


class CommandError(click.ClickException):
    """A command cannot do what was asked (e.g. no such stream): one line, exit 2."""

    exit_code = EXIT_USAGE


# -- shared state -----------------------------------------------------------------------


def _console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr, highlight=False, soft_wrap=True)
    console.push_render_hook(VisibleHook())
    return console


@dataclass
class App:
    """Per-invocation state: global options, consoles and secrets to keep out of output."""

    store_opt: str | None = None
    blobs_opt: str | None = None
    quiet: bool = False
    verbose: int = 0
    json_default: bool = False
    """``--json`` given before the subcommand."""
    json_requested: bool = False
    """``--json`` given, before or after the subcommand (errors are then JSON too)."""
    json_written: bool = False
    """The command's one JSON object is on stdout already."""
    out: Console = field(default_factory=_console)
    err: Console = field(default_factory=lambda: _console(stderr=True))
    secrets: set[str] = field(default_factory=set)
    url: str = ""
    """The redacted URL of the store :meth:`open` opened last."""

    def note(self, message: str) -> None:
        """A status line on stderr (silenced by ``-q``)."""
        if not self.quiet:
            self.err.print(text(message, style="dim"))

    def say(self, line: str, style: str = "") -> None:
        """``line`` on stdout, made visible."""
        self.out.print(text(line, style=style))

    def json(self, data: dict[str, Any], ok: bool = True) -> int:
        """Write ``data`` as the one JSON object on stdout (hidden characters escaped,
        strings exact: :func:`~ares_events.cli.terminal.dumps`); return the command's exit
        code, :data:`EXIT_FINDINGS` when not ``ok``."""
        click.echo(dumps(data))
        self.json_written = True
        return EXIT_OK if ok else EXIT_FINDINGS

    def table(self, table: Table, *, optional: tuple[str, ...] = ()) -> None:
        """Print ``table`` on stdout at the terminal's width (80 in a pipe) without cutting
        an id (:func:`~ares_events.cli.terminal.fitted`: ``optional`` columns go first)."""
        self.out.print(fitted(self.out, table, optional))

    def _remember_secrets(self, url: str | None, settings: Settings) -> None:
        with contextlib.suppress(ValueError):  # not a URL: it has no password either
            parts = urlsplit(url or "")
            if parts.password:
                # As parsed, percent-encoded, and as written in the URL.
                raw = parts.netloc.rsplit("@", 1)[0].partition(":")[2]
                self.secrets |= {parts.password, quote(parts.password, safe=""), raw} - {""}
        if settings.chain_key is not None:
            self.secrets.add(settings.chain_key.key.hex())

    def scrub(self, text: str) -> str:
        """``text`` with every known secret replaced by ``***`` (defence in depth), and
        every piece of one of 16 characters or more (a secret shortened for display, an
        argument quoted without its spaces), in any case."""
        for s in sorted(self.secrets, key=len, reverse=True):
            if len(s) >= 3:
                text = text.replace(s, "***")
        long = [s.lower() for s in self.secrets if len(s) >= 16]
        return _PIECE.sub(lambda m: "***" if any(m[0].lower() in s for s in long) else m[0], text)

    def remember_configured_secrets(self) -> None:
        """Learn the secrets of the whole configuration (``--store``, ``--blobs``, the
        environment's URLs and chain key), so an error reported before the store was
        opened cannot show one either. A malformed environment is then just skipped: it is
        the error being reported."""
        try:
            settings = Settings.from_env()
        except AresError:
            settings = Settings()
        urls = (self.store_opt, self.blobs_opt, settings.store_url, settings.blobs_url)
        for url in (*urls, settings.cache_url, settings.anchor_url):
            self._remember_secrets(url, settings)

    def raw_store_url(self) -> str:
        """The store URL as configured (may hold a password: never print it)."""
        return self.store_opt or Settings.from_env().store_url or DEFAULT_CLI_STORE

    @contextlib.contextmanager
    def open(
        self, *, create: bool = False, write: bool = False, **options: Any
    ) -> Iterator[EventStore]:
        """Open the configured store, say which on stderr, close it afterwards.

        Args:
            create: create the store when it does not exist; only commands that write
                by nature (init, demo, bench) pass True. Reporting commands never
                create what they report on.
            write: the command writes to the store (implied by ``create``). Without it
                the store is opened read-only where the backend can (SQLite
                ``query_only``, PostgreSQL read-only transactions): a write is refused
                and nothing is created, not even a ``-wal`` file that outlives the run.

        Raises:
            ConfigError: bad URL or environment value, or a configuration the store's
                recorded identity refuses.
            StoreNotFound: no store at the URL and ``create`` is False.
            StoreUnavailable: the store cannot be reached.
        """
        settings = Settings.from_env()
        self.remember_configured_secrets()
        url = self.raw_store_url()
        wrapped = {"blobs": self.blobs_opt or settings.blobs_url, "cache": settings.cache_url}
        options.update({k: v for k, v in wrapped.items() if v is not None})
        options["spill_threshold"] = settings.spill_threshold_bytes
        scheme = url.partition(":")[0].split("+")[0].lower()
        if not (create or write) and scheme in READ_ONLY_SCHEMES:
            options["read_only"] = True
        try:
            store = open_store(url, chain_key=settings.chain_key, create=create, **options)
        except OSError as exc:
            if isinstance(exc, AresError):
                raise
            raise StoreUnavailable(f"cannot open store: {exc.strerror or exc}") from exc
        keyed = " (keyed chain)" if settings.chain_key is not None else ""
        self.url = store.url
        self.note(f"store: {store.url}{keyed}")
        try:
            yield store
        finally:
            store.close()

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None = None) -> Iterator[Callable[..., None]]:
        """A progress bar on stderr (only on a terminal, not with ``-q``; removed when
        done). Yields ``update(done, total=None, **fields)``: a library's progress
        callback; ``fields`` such as a new ``description``."""
        columns = [TextColumn("{task.description}"), BarColumn(), TaskProgressColumn()]
        hidden = self.quiet or not self.err.is_terminal
        with Progress(
            *columns, TimeElapsedColumn(), console=self.err, transient=True, disable=hidden
        ) as bar:
            task = bar.add_task(description, total=total)

            def update(done: int, total: int | None = None, **fields: Any) -> None:
                total = None if total is None else max(total, done)
                bar.update(task, completed=done, total=total, **fields)

            yield update


# -- keys of the verifiable log -------------------------------------------------------------


def load_signing_key(app: App, key_file: str | None, *, required: bool) -> SigningKey | None:
    """The signing key from ``--key``, else ``ARES_LOG_KEY_FILE`` (None when neither and
    not ``required``). Its secret is registered with ``app`` so no output can show it.

    Raises:
        CommandError: ``required`` and no key file is configured.
        ConfigError: the file is missing or malformed (the message never shows it).
    """
    path = key_file or Settings.from_env().log_key_file
    if path is None:
        if required:
            raise CommandError(
                "this command signs: pass --key FILE or set ARES_LOG_KEY_FILE "
                "(create a key with `ares-events keygen NAME --out FILE`)"
            )
        return None
    key = read_key_file(path)
    text = key.private_text()
    app.secrets |= {text, text.rsplit("+", 1)[-1]}
    return key


def os_user() -> str:
    """The OS user's name (who acts, by default), or ``unknown``."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in this environment
        return "unknown"


def read_text(file: str) -> str:
    """The UTF-8 text of ``file`` (``-``: standard input).

    Raises:
        CommandError: it cannot be read, or is not UTF-8 text.
    """
    try:
        return sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise CommandError(f"cannot read {file}: {reason}") from None


def user_json(raw: str) -> Any:
    """``raw``, JSON the user gave, parsed; ValueError when it is not JSON, also when it
    nests deeper than ``json``'s decoder recurses (a RecursionError, else a crash)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deep") from None


def load_vkeys(
    values: tuple[str, ...], *, required: bool = True, option: str = "--vkey"
) -> list[VerifierKey]:
    """Verifier keys from ``--vkey`` values (text or a file holding the text), else
    ``ARES_LOG_VKEY`` (another ``option``'s values: that option's, no default).

    Raises:
        CommandError: ``required`` and none is given.
        ConfigError: a malformed key; the message says where it came from (the option,
            the variable or the file), never what it holds.
    """
    origin, raw = option, list(values)
    if not raw and option == "--vkey":
        origin, raw = "ARES_LOG_VKEY", list(Settings.from_env().log_vkeys)
    if not raw and required:
        raise CommandError("pass --vkey VKEY (the log's verifier key, as keygen printed it)")
    keys: list[VerifierKey] = []
    for i, v in enumerate(raw, 1):
        # The value is not repeated in errors: a secret given in a verifier key's place
        # (a chain key, a private key, in the environment or a file) must not be printed.
        source = origin if len(raw) == 1 else f"{origin} (value {i} of {len(raw)})"
        text = v
        if "+" not in v:
            p = Path(v)
            try:
                text = p.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise ConfigError(
                    f"{source} is neither a verifier key nor a readable file "
                    f"({why or 'cannot be read'})"
                ) from None
            source = f"verifier key file {p}"
        keys.append(VerifierKey.parse(text, source=source))
    return keys


pass_app = click.make_pass_decorator(App)
"""Decorator handing a command the :class:`App` of this invocation."""


def _json_from_group(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    app = ctx.find_object(App)
    wanted = bool(value or (app is not None and app.json_default))
    if wanted and app is not None:
        app.json_requested = True
    return wanted


json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    callback=_json_from_group,
    help="Print one JSON object on stdout instead of tables.",
)
"""The ``--json`` flag every reporting command takes (also accepted before the
subcommand: ``ares-events --json audit``)."""


def json_app(fn: Callable[..., Any]) -> Callable[..., Any]:
    """:data:`json_option` and :data:`pass_app`, which every reporting command takes."""
    return json_option(pass_app(fn))


def key_option(help_: str, *, required: bool = False) -> Callable[[F], F]:
    """The ``--key FILE`` option (the command's ``key_file``), with ``help_``."""
    return click.option("--key", "key_file", required=required, metavar="FILE", help=help_)


def vkey_option(help_: str) -> Callable[[F], F]:
    """The repeatable ``--vkey VKEY`` option (the command's ``vkeys``), with ``help_``."""
    return click.option("--vkey", "vkeys", multiple=True, metavar="VKEY", help=help_)


def _set_global(ctx: click.Context, param: click.Parameter, value: str | int | None) -> None:
    if value is None or value == 0:
        return
    app = ctx.ensure_object(App)
    if param.name == "store":
        if not str(value).strip():
            raise click.BadParameter(
                "needs a store URL (sqlite:///path.db, postgresql://...), got an empty string",
                param_hint="'--store'",
            )
        app.store_opt = str(value)
    elif param.name == "blobs":
        app.blobs_opt = str(value)
    elif param.name == "verbose":
        app.verbose = max(app.verbose, int(value))
        app.quiet = False
        _configure_logging(app.verbose, 0)
    elif not app.verbose:
        app.quiet = True
        _configure_logging(0, int(value))


def _global_params(**helps: str) -> list[click.Option]:
    """``--store``, ``--blobs``, ``-v`` and ``-q``, setting :class:`App` fields: the
    group's (given its ``helps`` by name), or as a subcommand accepts them (after its name)."""
    url: dict[str, Any] = {"metavar": "URL"}
    count: dict[str, Any] = {"count": True}
    store = helps.get("store", "Event store URL (also accepted before the subcommand).")
    verbose = "More log output on stderr (-vv: debug); tracebacks of internal errors."
    return [
        click.Option(decls, expose_value=False, callback=_set_global, help=help_, **kind)
        for decls, kind, help_ in (
            (["--store"], url, store),
            (["--blobs"], url, "Blob store URL for spilled payloads."),
            (["-v", "--verbose"], count, helps.get("verbose", verbose)),
            (["-q", "--quiet"], count, "Only errors on stderr; no progress bars."),
        )
    ]


def install_global_options(group: click.Group) -> None:
    """Give every command under ``group`` the global options, so they work after the
    subcommand too (``ares-events audit --store URL -v``). Idempotent."""
    for cmd in group.commands.values():
        names = {n for p in cmd.params for n in getattr(p, "opts", ())}
        for opt in _global_params():
            if not names & set(opt.opts):
                cmd.params.append(opt)
        if isinstance(cmd, click.Group):
            install_global_options(cmd)


def _configure_logging(verbose: int, quiet: int) -> None:
    level = logging.DEBUG if verbose >= 2 else logging.INFO if verbose else logging.WARNING
    if quiet and not verbose:
        level = logging.ERROR
    root = logging.getLogger("ares_events")
    if not any(h.get_name() == "ares-events-cli" for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(VisibleFormatter(f"{PROG}: %(levelname)s %(name)s: %(message)s"))
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


def _grouped(findings: list[Finding]) -> list[tuple[Finding, int, int | None]]:
    """Runs of findings with the same kind, stream and detail at consecutive versions,
    as (first finding, count, last version): a wrong chain key is one row, not 1,000."""
    rows: list[tuple[Finding, int, int | None]] = []
    for f in findings:
        first, n, last = rows[-1] if rows else (f, 0, None)
        same = (first.kind, first.stream_id, first.detail) == (f.kind, f.stream_id, f.detail)
        if same and last is not None and f.version == last + 1:
            rows[-1] = (first, n + 1, f.version)
        else:
            rows.append((f, 1, f.version))
    return rows


def _print_findings(app: App, findings: list[Finding]) -> None:
    table = Table(title="findings", title_justify="left")
    table.add_column("kind", style="red", no_wrap=True)
    table.add_column("stream", no_wrap=True)  # whole: it goes into the next command
    table.add_column("version", justify="right", no_wrap=True)
    table.add_column("detail", overflow="fold", min_width=12)
    rows = _grouped(findings)
    for f, n, last in rows[:MAX_FINDINGS_SHOWN]:
        where = "" if f.version is None else str(f.version)
        if n > 1:
            where = f"{f.version}..{last} ({n})"
        stream = f.stream_id if f.stream_id is not None else "(store)"
        table.add_row(text(f.kind), text(stream), where, text(f.detail))
    app.table(table)
    if len(rows) > MAX_FINDINGS_SHOWN:
        app.say(f"… and {len(rows) - MAX_FINDINGS_SHOWN} more rows (use --json for all)")


def add_columns(table: Table, *names: str, right: Iterable[str] = (), **options: Any) -> Table:
    """``table`` with a column of each name (right-aligned when in ``right``; ``options``
    such as ``no_wrap`` for all)."""
    for name in names:
        table.add_column(name, justify="right" if name in right else "left", **options)
    return table


def _status(ok: bool) -> Text:
    return Text("ok", style="green") if ok else Text("FINDINGS", style="bold red")


def verdict(ok: bool, line: str, good: str = "ok", bad: str = "FINDINGS") -> Text:
    """``line`` (made visible) after a green ``good`` or a red ``bad``."""
    return Text.assemble(
        (f"{good if ok else bad} ", "bold green" if ok else "bold red"), text(line)
    )


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
Global options work before or after the command (audit --store URL --json).
\b
Exit codes: 0 clean, 1 findings, 2 usage or config error, 3 store unavailable,
4 internal error (traceback with -v), 5 conflict (another writer came first: run it
again), 130 aborted.
\b
Examples:
  ares-events demo                      10 agents, kill -9 three times, all finish
  ares-events streams
  ares-events tail demo-1a2b3c-agent-01 -n 5
  ares-events --store sqlite:////var/lib/agents.db audit --json""",
)
@click.version_option(__version__, "--version", prog_name=PROG)
@click.option(
    "--json", "as_json", is_flag=True, help="Every reporting command prints one JSON object."
)
@click.pass_context
def cli(ctx: click.Context, as_json: bool) -> None:
    """ares-events: hash-chained, append-only event logs for LLM agents.

    Agents are disposable; their history is not. Inspect, verify and audit a store, or run
    the demo to see it work.
    """
    app = ctx.ensure_object(App)
    app.json_default = as_json
    _configure_logging(app.verbose, int(app.quiet))


cli.params[1:1] = _global_params(
    store="Event store URL (sqlite:///rel.db, sqlite:////abs.db, memory://, postgresql://...).",
    verbose="More log output on stderr (-vv: debug).",
)
