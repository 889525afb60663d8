"""CLI command ``anchor``: checkpoint every stream head to a witness, or check the anchors.

Registered on the group when imported (``ares_events.cli`` imports this module). It may
import :mod:`ares_events.cli.common` and anything below the CLI.
"""

from __future__ import annotations

import click
from rich.text import Text

from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    App,
    CommandError,
    _print_findings,
    cli,
    json_option,
    pass_app,
)
from ares_events.stores.settings import Settings


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
