"""CLI command ``anchor``: a signed checkpoint to a location outside the store, or check
the anchors there."""

from __future__ import annotations

from pathlib import Path

import click

from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    App,
    CommandError,
    _print_findings,
    cli,
    json_app,
    key_option,
    load_signing_key,
    load_vkeys,
    verdict,
    vkey_option,
)
from ares_events.core.recorder import backend_of
from ares_events.integrity.anchors import verify_anchors, write_checkpoint_note
from ares_events.integrity.checkpoints import b64
from ares_events.stores.settings import Settings


@cli.command(name="anchor")
@click.option(
    "--to",
    "location",
    metavar="URL",
    help="Where signed checkpoints are kept: file:///folder/ or "
    "s3://bucket/prefix?endpoint_url=... (default: ARES_ANCHOR_URL, else a folder anchors/ "
    "next to a SQLite store file).",
)
@click.option("--witness", "old_location", metavar="URL", hidden=True)  # its first name
@key_option("The log's signing key file (default: ARES_LOG_KEY_FILE); needed to anchor.")
@click.option("--check", is_flag=True, help="Verify the store still extends every anchor there.")
@vkey_option(
    "--check: a trusted verifier key for the signed checkpoints (repeatable; default: "
    "ARES_LOG_VKEY, else the key of --key, else the keys the store recorded)."
)
@json_app
def anchor_cmd(
    app: App,
    location: str | None,
    old_location: str | None,
    key_file: str | None,
    check: bool,
    vkeys: tuple[str, ...],
    as_json: bool,
) -> int:
    """Anchor the log at a location outside the store, or check the anchors there.

    With the log's key (--key or ARES_LOG_KEY_FILE): brings the Merkle log up to date,
    signs a checkpoint (C2SP tlog-checkpoint), stores it and writes it to the location as
    checkpoint-<size>-<time>.note; nobody without the key can forge or edit one. Exits 1,
    writing nothing, when the Merkle log does not match its events (every leaf is checked
    against them first, as `checkpoint` does) or no longer matches a checkpoint already
    stored (its events were rewritten or removed after it was signed).

    --check proves the store still extends every checkpoint there: its signature, and the
    root of today's first <size> events. A deleted tail or a rewritten event is a finding;
    removing checkpoints from the location only removes them, it cannot make a rewrite
    pass. Exits 1 on findings.

    \b
    Example:
      ares-events anchor --key log.key
      ares-events anchor --to s3://audit-bucket/ares --check --vkey log.vkey --json
    """
    settings = Settings.from_env()
    key = load_signing_key(app, key_file, required=False)
    if key is None and not check:
        raise click.UsageError(
            "anchor signs a checkpoint with the log's key: pass --key FILE (or set "
            "ARES_LOG_KEY_FILE); make one with `ares-events keygen NAME --out FILE`"
        )
    trusted = load_vkeys(vkeys, required=False) or ([key.verifier] if key is not None else None)
    # Only signing writes to the store (the Merkle log, the checkpoint); --check reads.
    with app.open(write=not check) as store:
        url = location or old_location or settings.anchor_url
        if url is None:
            path = getattr(backend_of(store.recorder), "path", None)
            if not isinstance(path, Path):
                raise CommandError(
                    f"no anchor location for {store.url}: pass --to URL or set "
                    "ARES_ANCHOR_URL (the default folder needs a SQLite store file)"
                )
            url = (path.absolute().parent / "anchors").as_uri() + "/"
        app._remember_secrets(url, settings)
        if check:
            report = verify_anchors(store, url, keys=trusted)
        else:
            assert key is not None
            from ares_events.projections.merkle import MerkleLog

            signed = MerkleLog(store).sign(key)
            where = write_checkpoint_note(url, signed.text, signed.checkpoint.size)
    if check and as_json:
        return app.json({"store": app.url, **report.to_dict()}, report.ok)
    if check:
        keys_note = " (keys recorded in the store)" if report.keys_from == "store" else ""
        line = f"{report.anchors_checked} signed checkpoint(s) in {report.location}{keys_note}"
        app.out.print(verdict(report.ok, f"{line}, {len(report.findings)} finding(s)"))
        if not report.ok:
            _print_findings(app, report.findings)
        return EXIT_OK if report.ok else EXIT_FINDINGS
    cp = signed.checkpoint
    if as_json:
        data = {"store": app.url, "location": where, "checkpoint": signed.text}
        return app.json({**data, "tree_size": cp.size, "root": b64(cp.root)})
    app.say(f"anchored {cp.origin} at size {cp.size} to {where}")
    return EXIT_OK
