"""CLI command ``gc-blobs``: delete blobs no event references."""

from __future__ import annotations

import click

from ares_events.cli.common import EXIT_OK, App, cli, json_app
from ares_events.stores.blobs import gc_blobs, parse_duration


@cli.command(name="gc-blobs")
@click.option(
    "--older-than",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Grace period (30m, 1h, 2d): younger orphans may belong to appends in flight.",
)
@click.option("--dry-run", is_flag=True, help="Report what would be deleted; delete nothing.")
@json_app
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
    try:
        grace = parse_duration(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    with app.open(write=not dry_run) as store:  # may record the store's owner token
        report = gc_blobs(store, grace, dry_run=dry_run)
    if as_json:
        return app.json({"store": app.url, **report.to_dict()})
    verb = "would delete" if dry_run else "deleted"
    app.say(
        f"{report.events_scanned} events scanned, {report.referenced_keys} referenced "
        f"blob(s), {report.blobs_listed} listed: kept {report.kept_referenced} referenced "
        f"and {report.kept_young} younger than {older_than}; {verb} "
        f"{len(report.deleted)} orphan(s) ({report.bytes_deleted:,} bytes)"
    )
    return EXIT_OK
