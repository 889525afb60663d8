"""CLI command ``erase``: remove one event's payload and keep the log verifiable."""

from __future__ import annotations

import click

from ares_events.cli.common import EXIT_OK, App, cli, json_app, os_user
from ares_events.projections.erasure import erase


@cli.command(name="erase")
@click.argument("stream")
@click.argument("version", type=click.IntRange(1, 2**63 - 1))
@click.option(
    "--reason",
    required=True,
    metavar="TEXT",
    help="Why (kept in the erasure record; no personal data).",
)
@click.option("--by", "by", metavar="NAME", help="Who asks for it (default: the OS user).")
@json_app
def erase_cmd(
    app: App, stream: str, version: int, reason: str, by: str | None, as_json: bool
) -> int:
    """Erase the payload of STREAM VERSION; every chain, proof and checkpoint stays valid.

    The payload's bytes (inline, or its blob when no other event shares it) are removed;
    its digest and size stay, because the hash chain commits to them. A blob an append of
    the same payload refreshed meanwhile is left to gc-blobs. Snapshots and read
    models that folded it are deleted or rewound, the snapshot events of
    snapshots/STREAM whose metadata "covers" is VERSION or later are erased too (each
    recorded), a Redis cache drops its copy, and the erasure is recorded as a
    payload.erased event in the stream ares-events/erasures (who, why, which event).
    Reads of the event then say payload_erased; audit lists it as information. Erasing an
    erased event changes nothing.

    \b
    Example:
      ares-events erase agent-7 12 --reason "GDPR request #4411" --by dpo@example.com
    """
    with app.open(write=True) as store:
        report = erase(store, stream, version, reason=reason, by=by or os_user())
    if as_json:
        return app.json({"store": app.url, **report.to_dict()})
    if report.already_erased:
        app.say(f"{stream} v{version}: the payload was already erased")
        return EXIT_OK
    blob = "" if report.blob_key is None else "; its blob was deleted"
    if report.blob_key is not None and not report.blob_deleted:
        blob = f"; its blob is kept ({report.blob_shared_by} other event(s) hold the same payload)"
    if report.blob_left_for_gc:
        blob = "; its blob, refreshed meanwhile by an append, is kept: gc-blobs deletes it later"
    extra = []
    if report.snapshots_deleted:
        extra.append(f"{report.snapshots_deleted} snapshot(s) deleted")
    if report.snapshot_events_erased:
        extra.append(
            f"{report.snapshot_events_erased} snapshot event(s) of snapshots/{stream} erased"
        )
    if report.read_models_reset:
        extra.append(f"read models rewound: {', '.join(report.read_models_reset)}")
    app.say(
        f"erased the payload of {stream} v{version} ({report.payload_size} bytes; digest "
        f"{report.payload_digest.hex()[:16]}… kept){blob}; recorded at position "
        f"{report.record_position}" + (f"; {'; '.join(extra)}" if extra else "")
    )
    return EXIT_OK
