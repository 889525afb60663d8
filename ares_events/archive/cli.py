"""CLI command ``archive``, registered on the group when imported. It may import
:mod:`ares_events.cli.common` and anything below the CLI.
"""

from __future__ import annotations

import click
from rich.table import Table

from ares_events.cli.common import (
    EXIT_OK,
    App,
    CommandError,
    cli,
    json_option,
    key_option,
    pass_app,
    text,
)


@cli.command(name="archive")
@click.option(
    "--to",
    "to",
    metavar="ARCHIVE_URL",
    help="Where segments go: s3://bucket/prefix?endpoint_url=... or file:///dir (not the "
    "blob location). Recorded in the store's identity when the first segment is "
    "archived; later runs must name the same place.",
)
@click.option(
    "--before",
    metavar="POSITION|AGE",
    help="Archive events at global positions below POSITION (e.g. 120000), or recorded "
    "longer than AGE ago (90d, 12h, 30m, 45s, 2w, 7y).",
)
@click.option(
    "--segment-events",
    type=click.IntRange(min=1),
    default=65_536,
    show_default=True,
    help="Events per segment at most.",
)
@click.option(
    "--block-events",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Events per compressed block, the unit a reader fetches: smaller blocks make "
    "reads of a few archived events cheaper and compress worse.",
)
@click.option("--max-segments", type=click.IntRange(min=1), help="Stop after N segments.")
@key_option(
    "Sign a checkpoint of the Merkle log at each segment's end with this log key "
    "(from keygen); default: ARES_LOG_KEY_FILE when set."
)
@click.option("--status", is_flag=True, help="Show the store's archive (segments) and exit.")
@click.option(
    "--retire-before",
    metavar="POSITION|AGE",
    help="Retention: delete whole archived segments whose events all lie before this "
    "horizon, oldest first, leaving a tombstone in the segment index and an "
    "archive.segment.retired record in the stream ares-events/retention (needs --reason).",
)
@click.option("--reason", metavar="TEXT", help="Why segments are retired (the legal basis).")
@click.option("--by", "by", metavar="NAME", help="Who retires them (default: the OS user).")
@json_option
@pass_app
def archive_cmd(
    app: App,
    to: str | None,
    before: str | None,
    segment_events: int,
    block_events: int,
    max_segments: int | None,
    key_file: str | None,
    status: bool,
    retire_before: str | None,
    reason: str | None,
    by: str | None,
    as_json: bool,
) -> int:
    """Archive old events to immutable segments on S3 or a folder, read through the store.

    Segment by segment, in global order: the events are checked (their chains, their
    Merkle leaves), written as a compressed segment and a manifest (position range,
    streams, Merkle tree size and root at its end, optionally a signed checkpoint), read
    back and verified, recorded in the store's segment index, and only then are their rows
    deleted. A crash at any step loses nothing; running again finishes the job. Each
    stream's head, its last event, snapshots and read models stay in the database; every
    read (read, read_all, replay, recover, verify, audit, proofs) goes on into the
    archive when it needs older events, and checks them against the store's digests.

    \b
    Examples:
      ares-events archive --to s3://ares-archive/prod --before 90d
      ares-events archive --to file:///backup/archive --before 1200000 --json
      ares-events archive --status
      ares-events archive --retire-before 7y --reason "retention policy R-12"
    """
    from ares_events.archive.job import archive, parse_before
    from ares_events.cli.common import load_signing_key

    given = [n for n, v in (("--to", to), ("--before", before)) if v]
    if status and (given or retire_before is not None):
        raise CommandError("--status only reads: it takes no --to, --before or --retire-before")
    if retire_before is not None and given:
        raise CommandError(f"--retire-before is a run of its own: drop {' and '.join(given)}")
    if status:
        return _status(app, as_json)
    if retire_before is not None:
        return _retire(app, retire_before, reason, by, as_json)
    if not to or not before:
        raise CommandError("archive needs --to ARCHIVE_URL and --before POSITION|AGE")
    when = parse_before(before)
    key = load_signing_key(app, key_file, required=False)
    with app.open(write=True) as store:
        report = archive(
            store, to, before=when, segment_events=segment_events,
            block_events=block_events, key=key, max_segments=max_segments,
        )  # fmt: skip
    if as_json:
        app.json({"store": app.url, **report.to_dict()})
        return EXIT_OK
    if not report.segments and not report.resumed:
        app.out.print(text(f"nothing to archive before {before} (archived through position "
                           f"{report.through})"))  # fmt: skip
        return EXIT_OK
    table = Table(title=text(f"archived to {report.archive}"), title_justify="left")
    for col in ("segment", "positions", "events", "bytes", "tree size", "root"):
        table.add_column(
            col, justify="right" if col in ("events", "bytes", "tree size") else "left"
        )
    for s in report.segments:
        table.add_row(
            str(s["seq"]), f"{s['first_position']}..{s['last_position']}", str(s["events"]),
            str(s["bytes"]), str(s["tree_size"]), s["root"][:16] + "…",
        )  # fmt: skip
    app.table(table)
    per = report.archive_bytes / report.events_archived if report.events_archived else 0.0
    resumed = ""
    if report.resumed:
        resumed = f" (finishing {report.resumed} segment(s) of an interrupted run)"
    app.out.print(text(f"{report.events_archived} events archived ({per:.1f} bytes each in the "
                       f"archive), {report.rows_deleted} rows deleted{resumed}; archived through "
                       f"position {report.through}"))  # fmt: skip
    return EXIT_OK


def _status(app: App, as_json: bool) -> int:
    from ares_events.archive.reader import ArchiveRecorder
    from ares_events.core.recorder import system_of_record

    with app.open() as store:
        rec = system_of_record(store.recorder)
        ix = rec.segment_index() if isinstance(rec, ArchiveRecorder) else None
    if ix is None:
        if as_json:
            app.json({"store": app.url, "archive": None, "segments": []})
        else:
            app.out.print(text(f"{app.url}: nothing archived"))
        return EXIT_OK
    rows = [s.to_doc() for s in ix.segments]
    if as_json:
        app.json(
            {"store": app.url, "archive": ix.location, "through": ix.through, "segments": rows}
        )
        return EXIT_OK
    table = Table(title=text(f"{app.url}: archive {ix.location}"), title_justify="left")
    for col in ("segment", "positions", "events", "bytes", "tree size", "state"):
        table.add_column(col)
    for s in ix.segments:
        table.add_row(
            str(s.seq), f"{s.first_position}..{s.last_position}", str(s.events),
            str(s.segment.size), str(s.tree_size),
            "retired" if s.retired is not None else "archived",
        )  # fmt: skip
    app.table(table)
    return EXIT_OK


def _retire(app: App, before: str, reason: str | None, by: str | None, as_json: bool) -> int:
    from ares_events.archive.job import parse_before
    from ares_events.archive.retention import retire
    from ares_events.cli.common import os_user

    if not reason:
        raise CommandError("--retire-before needs --reason TEXT (kept in the record)")
    by = os_user() if by is None else by
    with app.open(write=True) as store:
        report = retire(store, before=parse_before(before, "--retire-before"), reason=reason, by=by)
    if as_json:
        app.json({"store": app.url, **report.to_dict()})
        return EXIT_OK
    app.out.print(text(f"retired {len(report.segments)} segment(s), {report.events} events"))
    for s in report.segments:
        app.out.print(text(f"  segment {s['seq']}: positions {s['first_position']}.."
                           f"{s['last_position']} (record at position "
                           f"{s['record_position']})"))  # fmt: skip
    return EXIT_OK
