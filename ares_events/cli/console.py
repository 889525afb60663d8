"""CLI command ``ui``: the web console (:mod:`ares_events.ui`).

Registered on the group when imported (``ares_events.cli`` imports this module). It may
import :mod:`ares_events.cli.common` and anything below the CLI.
"""

from __future__ import annotations

import ipaddress
import signal
from typing import Any

import click

from ares_events.cli.common import (
    EXIT_OK,
    READ_ONLY_SCHEMES,
    App,
    CommandError,
    cli,
    pass_app,
)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


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
@pass_app
def ui_cmd(app: App, port: int, host: str, allow_actions: bool, anchors_url: str | None) -> int:
    """Open a local web console over the store: streams, runs, integrity, projections.

    Pages are rendered on the server (no build step, no CDN, a strict Content-Security-
    Policy). Read-only by default: SQLite connections run query_only and PostgreSQL
    read-only transactions; nothing is appended. The URL printed at start holds a
    per-start session token: open it, and keep it to yourself.

    \b
    Example:
      ares-events --store sqlite:///agents.db ui
      ares-events ui --port 9000 --allow-actions
      ares-events ui --anchors file:///var/lib/ares-anchors/
    """
    from ares_events.ui import ConsoleServer

    scheme = app.raw_store_url().partition(":")[0].split("+")[0].lower()
    if not allow_actions and scheme not in READ_ONLY_SCHEMES:
        app.note(f"{scheme}:// has no read-only mode; the console appends nothing anyway")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    with app.open(write=allow_actions) as store:
        try:
            server = ConsoleServer(
                store, host=host, port=port, actions=allow_actions, anchors=anchors_url
            )
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        # SIGTERM (a supervisor, a test) stops it as Ctrl-C does: the store is closed.
        # Installed before the address is printed: whoever reads it may stop us at once.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            mode = "actions allowed" if allow_actions else "read-only"
            if not loopback:
                app.err.print(f"warning: listening on {host}, reachable from other machines")
            click.echo(f"ares-events console ({mode}) on {server.base_url}", err=True)
            click.echo(f"open {server.login_url}", err=True)
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            server.close()
    return EXIT_OK
