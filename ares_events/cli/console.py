"""CLI command ``ui``: the web console (:mod:`ares_events.ui`)."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from ares_events.cli.common import (
    EXIT_OK,
    READ_ONLY_SCHEMES,
    App,
    CommandError,
    cli,
    key_option,
    load_signing_key,
    pass_app,
)
from ares_events.cli.terminal import visible

if TYPE_CHECKING:
    from ares_events.ui import ConsoleServer


class _Stop:
    """What SIGINT and SIGTERM ask, wherever they land: a flag, and the server told to
    stop. Nothing is raised into the code that runs (an exception thrown mid-start-up
    could leave a server nobody stops) and no lock is taken."""

    def __init__(self) -> None:
        self.requested = False
        self.server: ConsoleServer | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self.server is not None:
            self.server.request_stop()


@contextlib.contextmanager
def _server_logs(app: App) -> Iterator[None]:
    """uvicorn's own lines through the CLI's handler: errors always, warnings (a
    malformed request, too many connections) with -v. They quote no request."""
    ours = logging.getLogger("ares_events")
    handlers = [h for h in ours.handlers if h.get_name() == "ares-events-cli"]
    uv = logging.getLogger("uvicorn")
    saved = (uv.level, uv.propagate, list(uv.handlers))
    uv.setLevel(logging.WARNING if app.verbose else logging.ERROR)
    uv.handlers, uv.propagate = handlers, False
    try:
        yield
    finally:
        uv.setLevel(saved[0])
        uv.propagate, uv.handlers = saved[1:]


@cli.command(name="ui")
@click.option(
    "--port",
    default=8765,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind (loopback unless you mean otherwise).",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Show resolve/resume/cancel buttons on runs; each appends the same audited event "
    "as `ares-events runs ...`. Without it the store is opened read-only.",
)
@click.option(
    "--anchors",
    "anchors_url",
    metavar="URL",
    help="A witness (file:// or s3://) the Integrity page's audit also checks anchors "
    "against, as `ares-events audit --anchors URL`.",
)
@key_option(
    "With --allow-actions: an approver key (keygen NAME --approver) the console signs "
    "each resume and resolve with, as `runs resume|resolve --key`. Read at start; pages "
    "show its name and id only. Without it, a run paused for a signed approval cannot be "
    "resumed from the console."
)
@click.option(
    "--expires-in",
    type=click.IntRange(1, 10 * 365 * 86400),
    default=900,
    show_default=True,
    metavar="SECONDS",
    help="With --key: each signed approval expires after this many seconds.",
)
@pass_app
def ui_cmd(
    app: App,
    port: int,
    host: str,
    allow_actions: bool,
    anchors_url: str | None,
    key_file: str | None,
    expires_in: int,
) -> int:
    """Open a local web console over the store: streams, runs, integrity, projections.

    Pages are rendered on the server (no build step, no CDN, a strict Content-Security-
    Policy). Read-only by default: SQLite connections run query_only and PostgreSQL
    read-only transactions; nothing is appended. The URL printed at start holds a
    per-start secret path and session token: open it, and keep it to yourself.

    \b
    Example:
      ares-events --store sqlite:///agents.db ui
      ares-events ui --port 9000 --allow-actions
      ares-events ui --anchors file:///var/lib/ares-anchors/
      ares-events ui --allow-actions --key alice.key     # approvals signed by alice
    """
    if key_file is not None and not allow_actions:
        raise click.UsageError("--key signs the console's actions: give --allow-actions too")
    key = load_signing_key(app, key_file, required=True) if key_file is not None else None
    # SIGTERM (a supervisor, a test) and Ctrl-C stop it, whenever they land: installed
    # first, before the store is opened, and before the address is printed (whoever
    # reads it may stop us at once).
    stop = _Stop()
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        options = {"port": port, "anchors": anchors_url, "approver": key, "expires_in": expires_in}
        _serve(app, stop, host, allow_actions, **options)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return EXIT_OK


def _serve(app: App, stop: _Stop, host: str, actions: bool, **options: Any) -> None:
    from ares_events.ui import ConsoleServer

    scheme = app.raw_store_url().partition(":")[0].split("+")[0].lower()
    if not actions and scheme not in READ_ONLY_SCHEMES:
        app.note(f"{scheme}:// has no read-only mode; the console appends nothing anyway")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    with app.open(write=actions) as store:
        if stop.requested:
            return
        try:
            server = ConsoleServer(store, host=host, actions=actions, **options)
        except OSError as exc:
            where = f"{host}:{options['port']}"
            raise CommandError(f"cannot listen on {where}: {exc.strerror or exc}") from None
        stop.server = server
        try:
            if stop.requested:  # landed before the server could be told
                return
            mode = "actions allowed" if actions else "read-only"
            if options["approver"] is not None:
                mode += f", approvals signed by {visible(server.app.signer)}"
            if not loopback:
                app.err.print(f"warning: listening on {host}, reachable from other machines")
            if host in ("0.0.0.0", "::"):  # noqa: S104 (the address asked for)
                app.err.print(
                    "from another machine: the address below with this machine's address or "
                    "name in place of the loopback one"
                )
            click.echo(f"ares-events console ({mode}) on {server.address}", err=True)
            click.echo(f"open {server.login_url}", err=True)
            with _server_logs(app):
                server.serve_forever()
        finally:
            server.close()
