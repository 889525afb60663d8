"""CLI commands of verifiable records: ``export`` and ``verify-record``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    App,
    CommandError,
    add_columns,
    cli,
    json_app,
    key_option,
    load_signing_key,
    load_vkeys,
    user_json,
    verdict,
    vkey_option,
)
from ares_events.stores.settings import Settings


@cli.command(name="export")
@click.argument("stream", metavar="RUN_OR_STREAM")
@click.option("--out", "out", required=True, metavar="FILE", help="Write the record here (0600).")
@click.option(
    "--format", "form", type=click.Choice(["json", "cbor"]), default="json", show_default=True
)
@click.option(
    "--redact",
    multiple=True,
    metavar="JSONPATH",
    help="Replace what this JSONPath selects in each event's payload by its salted digest "
    "(repeat for several; e.g. '$.args.card', '$..email').",
)
@click.option(
    "--disclosures",
    metavar="FILE",
    help="With --redact: where the redacted values and their salts go (0600); default "
    "FILE.disclosures.json.",
)
@key_option(
    "The signing key file (keygen): the log's key or an export key; default: ARES_LOG_KEY_FILE."
)
@json_app
def export_cmd(
    app: App,
    stream: str,
    out: str,
    form: str,
    redact: tuple[str, ...],
    disclosures: str | None,
    key_file: str | None,
    as_json: bool,
) -> int:
    """Export RUN_OR_STREAM as a signed record anyone can verify offline.

    The record follows draft-birkholz-verifiable-agent-conversations (messages, tool
    calls and results, system events) and carries the proof: every event's chain link,
    its inclusion proof against a signed checkpoint, the checkpoint, and a consistency
    proof to the newest checkpoint. The CBOR form is a COSE_Sign1 (Ed25519); the JSON form
    the record with a detached COSE_Sign1. With --redact, selected values become salted
    digests (the record still verifies) and the values go to the disclosures file. Needs a
    stored checkpoint covering the stream, or the log's own key to sign one.

    \b
    Example:
      ares-events export run-42 --out run-42.acr.json --key log.key
      ares-events export run-42 --out run-42.acr --format cbor --key export.key
      ares-events export run-42 --out r.json --key log.key --redact '$.args.card'
    """
    from ares_events.records.export import disclosures_bytes, export_record, write_private

    key = load_signing_key(app, key_file, required=True)
    assert key is not None
    disc_path = disclosures or f"{out}.disclosures.json"
    for p in (out, disc_path if redact else None):
        if p is not None and Path(p).exists():
            raise CommandError(f"{p} already exists; refusing to overwrite it")
    with app.open(write=True) as store:  # may catch the Merkle log up and sign a checkpoint
        ex = export_record(store, stream, key=key, form=form, redact_paths=redact)
    write_private(out, ex.data)
    wrote_disc = None
    if ex.disclosures is not None:
        wrote_disc = str(write_private(disc_path, disclosures_bytes(ex.disclosures)))
    data = {
        "out": out,
        "format": form,
        "stream": stream,
        "record": ex.record_id,
        "events": ex.events,
        "bytes": len(ex.data),
        "checkpoint_size": ex.checkpoint_size,
        "redacted": len(ex.disclosures["disclosures"]) if ex.disclosures else 0,
        "disclosures": wrote_disc,
    }
    if as_json:
        return app.json(data)
    app.say(
        f"wrote {out}: {ex.events} event(s) of {stream}, {len(ex.data)} bytes, "
        f"proved against checkpoint size {ex.checkpoint_size}"
    )
    if wrote_disc:
        app.say(f"redacted values and salts: {wrote_disc} (keep it secret)")
    return EXIT_OK


@cli.command(name="verify-record")
@click.argument("file", metavar="FILE")
@vkey_option(
    "A verifier key (text or a file) trusted as the log (its checkpoints) and as the "
    "record's signer; repeat for several; default: ARES_LOG_VKEY."
)
@click.option(
    "--approver",
    "approver_vkeys",
    multiple=True,
    metavar="VKEY",
    help="An approver's verifier key (text or a file): trusted for the record's signed "
    "approvals only, never as the log or the signer; repeat for several.",
)
@click.option(
    "--disclosures",
    metavar="FILE",
    help="Also check these disclosed values against the record's salted digests, and put "
    "back those that match for the approval checks a redaction left unchecked.",
)
@json_app
def verify_record_cmd(
    app: App,
    file: str,
    vkeys: tuple[str, ...],
    approver_vkeys: tuple[str, ...],
    disclosures: str | None,
    as_json: bool,
) -> int:
    """Check a record file offline: the COSE signature, every chain link and payload,
    every inclusion proof, the checkpoints and the consistency proof, the entries, and the
    signed approvals it carries. No store is opened. Each key is trusted for its role
    only: --vkey for the log and the signer, --approver for approvals.

    Exit 0 when every check passed, 1 on any finding (each names what failed), 2 on usage
    errors. A record of a keyed chain is checked with ARES_EVENTS_CHAIN_KEY.

    \b
    Example:
      ares-events verify-record run-42.acr.json --vkey log.vkey
      ares-events verify-record run-42.acr --vkey export.vkey --vkey log.vkey \\
          --approver alice.vkey --json
    """
    from ares_events.records import check_disclosures, verify_record

    keys = [k.text for k in load_vkeys(vkeys)]
    approvers = [k.text for k in load_vkeys(approver_vkeys, required=False, option="--approver")]
    try:
        data = Path(file).read_bytes()
    except OSError as exc:
        raise CommandError(f"cannot read {file}: {exc.strerror or exc}") from None
    chain_key = Settings.from_env().chain_key
    secret = chain_key.key if chain_key else None
    doc, checked = None, []
    try:
        if disclosures is not None:
            doc = user_json(Path(disclosures).read_text(encoding="utf-8"))
        rep = verify_record(data, keys, chain_key=secret, approvers=approvers, disclosures=doc)
        if doc is not None and all(f.kind != "malformed" for f in rep.findings):
            checked = check_disclosures(data, doc)
    except (OSError, ValueError) as exc:  # the keys were checked: the disclosures file
        raise CommandError(f"cannot check {disclosures}: {exc}") from None
    bad = not rep.ok or any(not c["ok"] for c in checked)
    if as_json:
        return app.json({**rep.to_dict(), "ok": not bad, "disclosures": checked}, not bad)
    if rep.ok:
        cp = rep.checkpoint or {}
        line = (
            f"{rep.form} record of {rep.stream}: {rep.events} event(s) "
            f"({rep.redacted} redacted, {rep.erased} erased), signed by {rep.signed_by}, "
            f"in log {cp.get('origin')} at size {cp.get('size')}, "
            f"{len(rep.approvals)} signed approval(s)"
        )
        unchecked = sum(1 for a in rep.approvals if a.get("unchecked"))
        if unchecked:
            line += f" ({unchecked} not fully checked: redacted)"
        app.out.print(verdict(True, line, good="verified"))
    else:
        table = Table(title="findings", title_justify="left")
        add_columns(table, "kind", "version", "detail")
        for f in rep.findings:
            table.add_row(Text(f.kind, style="red"), str(f.version or ""), Text(f.detail))
        app.say("NOT VERIFIED", style="bold red")
        app.out.print(table)
    for c in checked:
        style = "green" if c["ok"] else "bold red"
        app.say(f"disclosed v{c['version']} {c['path']}: {c['detail']}", style=style)
    return EXIT_FINDINGS if bad else EXIT_OK
