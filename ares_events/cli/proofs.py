"""CLI commands of the verifiable log: ``keygen``, ``checkpoint``, ``prove`` and
``verify-proof``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

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
    read_text,
    text,
    user_json,
    verdict,
    vkey_option,
)
from ares_events.errors import ConfigError, ProofError
from ares_events.integrity.checkpoints import b64, read_checkpoint, verify_proof
from ares_events.integrity.notes import ALG_COSIGNATURE_V1, ALG_ED25519, SigningKey, write_key_file
from ares_events.projections.merkle import MAX_SIZE, CheckpointNeeded, MerkleLog

KEY_HELP = "The log's signing key file (from keygen); default: ARES_LOG_KEY_FILE."
VKEY_HELP = (
    "A trusted verifier key (<name>+<hex>+<base64>, or a file holding one); repeat for "
    "several; default: ARES_LOG_VKEY."
)


@cli.command(name="keygen")
@click.argument("name")
@click.option(
    "--out",
    required=True,
    metavar="FILE",
    help="Write the signing key here (0600; never overwritten).",
)
@click.option(
    "--witness",
    is_flag=True,
    help="A witness's cosigning key (C2SP tlog-cosignature, type 0x04) instead of a log key.",
)
@click.option(
    "--approver",
    is_flag=True,
    help="An approver's key: it signs approvals (runs resume/resolve --key); give its "
    "verifier key to the journals that trust it (approvers=).",
)
@json_app
def keygen_cmd(app: App, name: str, out: str, witness: bool, approver: bool, as_json: bool) -> int:
    """Create an Ed25519 signing key NAME, write it to FILE, print its verifier key.

    NAME is the log's identity (the origin line of its checkpoints), conventionally a
    schema-less URL such as example.com/agents-log. The key file is created readable by
    its owner only and is never overwritten; stdout gets the verifier key alone
    (<name>+<key id>+<base64 key>), which you give to whoever verifies proofs; with
    --json {"name", "role", "key_file", "verifier_key"} (role: log, witness or approver).

    \b
    Example:
      ares-events keygen example.com/agents-log --out log.key > log.vkey
      ares-events keygen witness.example.com/w1 --out witness.key --witness
      ares-events keygen alice --out alice.key --approver > alice.vkey
    """
    if witness and approver:
        raise click.UsageError("a key is a witness's or an approver's, not both")
    key = SigningKey.generate(name, alg=ALG_COSIGNATURE_V1 if witness else ALG_ED25519)
    app.secrets.add(key.private_text())
    path = write_key_file(out, key)
    role = "approver" if approver else "witness" if witness else "log"
    what = "approver key" if approver else "signing key"
    app.note(f"wrote {what} {name} to {path} (keep it secret; mode 0600)")
    if as_json:
        return app.json(
            {"name": name, "role": role, "key_file": str(path), "verifier_key": key.verifier.text}
        )
    click.echo(key.verifier.text)
    return EXIT_OK


@cli.command(name="checkpoint")
@key_option(KEY_HELP)
@click.option("--list", "list_", is_flag=True, help="List the stored checkpoints; sign nothing.")
@json_app
def checkpoint_cmd(app: App, key_file: str | None, list_: bool, as_json: bool) -> int:
    """Sign, store and print a checkpoint of the log (C2SP tlog-checkpoint).

    Brings the Merkle log up to date with every committed event, then signs its size and
    RFC 9162 root with the log key. The checkpoint is stored in the store (prove uses the
    latest one that covers an event) and printed: the signed note, or with --json
    {"checkpoint", "tree_size", "root"}. Exits 1, signing nothing, when the Merkle log no
    longer matches its events (every leaf is checked against them first) or a checkpoint
    already stored (its events were rewritten or removed after it was signed): the key
    never signs two histories.

    \b
    Example:
      ares-events checkpoint --key log.key
      ARES_LOG_KEY_FILE=log.key ares-events checkpoint --json
      ares-events checkpoint --list
    """
    if list_:
        with app.open() as store:
            rows = MerkleLog(store).checkpoints.all()
        listed = [(o, n, b64(r), at, _row_problem(o, n, r, note)) for o, n, r, note, at in rows]
        ok = not any(p for *_, p in listed)
        if as_json:
            keys = ("origin", "tree_size", "root", "created_at", "problem")
            return app.json({"checkpoints": [dict(zip(keys, r, strict=True)) for r in listed]}, ok)
        table = Table(title=f"{len(rows)} checkpoint(s)", title_justify="left")
        # Names and roots are copied whole.
        add_columns(table, "origin", "tree size", "root", "signed at", no_wrap=True)
        if not ok:
            add_columns(table, "problem", style="red")
        for o, n, r, at, problem in listed:
            table.add_row(text(o), str(n), r, at, *([] if ok else [problem or ""]))
        app.table(table, optional=("signed at",))
        return EXIT_OK if ok else EXIT_FINDINGS
    key = load_signing_key(app, key_file, required=True)
    assert key is not None
    with app.open(write=True) as store:
        log = MerkleLog(store)
        _catch_up(app, log)
        signed = log.sign(key)
    cp = signed.checkpoint
    if as_json:
        return app.json({"checkpoint": signed.text, "tree_size": cp.size, "root": b64(cp.root)})
    click.echo(signed.text, nl=False)
    return EXIT_OK


def _row_problem(origin: str, size: int, root: bytes, note: str) -> str | None:
    """What is wrong with a stored checkpoint row: its columns are what the list shows,
    and they must be what its note says (no signature is checked here: verify-proof and
    anchor --check do that)."""
    try:
        cp = read_checkpoint(note).checkpoint
    except ProofError as exc:
        return f"its note is not a checkpoint ({exc.reason})"
    if (cp.origin, cp.size, cp.root) != (origin, size, root):
        return "the row differs from its signed note"
    return None


def _number(value: str, what: str, hint: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not {what}", param_hint=hint) from None


def _tree_size(value: str) -> int:
    """NEW_SIZE: a tree size is 0 to 2**63-1 (a checkpoint's bound); anything else is a
    usage error on every backend, never a lookup (SQLite cannot even bind it)."""
    n = _number(value, "a tree size", "NEW_SIZE")
    if not 0 <= n <= MAX_SIZE:
        raise click.BadParameter(
            f"{value!r} is not a tree size (0 to 2**63-1)", param_hint="NEW_SIZE"
        )
    return n


def _catch_up(app: App, log: MerkleLog) -> None:
    if log.store.last_position() > log.position():
        with app.progress("Merkle log") as progress:
            log.catch_up(progress=progress)


@cli.command(name="prove")
@click.argument("args", nargs=-1, metavar="[STREAM VERSION | NEW_SIZE]")
@click.option(
    "--consistency",
    "old_size",
    type=click.IntRange(min=0, max=MAX_SIZE),
    metavar="OLD_SIZE",
    help="Prove that the log at NEW_SIZE (default: the latest checkpoint) extends OLD_SIZE.",
)
@key_option(KEY_HELP + " With it, sign a fresh checkpoint.")
@click.option("--out", "out", metavar="FILE", help="Also write the proof (JSON) to FILE.")
@json_app
def prove_cmd(
    app: App,
    args: tuple[str, ...],
    old_size: int | None,
    key_file: str | None,
    out: str | None,
    as_json: bool,
) -> int:
    """Prove an event is in the log, or that the log only grew (RFC 9162 proofs).

    STREAM VERSION: an inclusion proof of that event against the latest stored checkpoint
    that covers it (or a checkpoint signed now with --key). --consistency OLD_SIZE
    [NEW_SIZE]: a consistency proof between two checkpoints. The proof is one JSON
    object (--json, or --out FILE) that `ares-events verify-proof` checks offline. Exits 1
    when no proof can be made (the event or log was rewritten or cut after it was
    signed, or the Merkle log no longer matches its events). Without --key it only
    reads: exit 2 when the proof would need a checkpoint signed first (none covers it).

    \b
    Example:
      ares-events prove agent-7 42 --json > proof.json
      ares-events prove --consistency 1000 --json > growth.json
      ares-events prove agent-7 42 --key log.key --out proof.json
    """
    key = load_signing_key(app, key_file, required=False)
    if old_size is None:
        if len(args) != 2:
            raise click.UsageError(
                "prove needs STREAM VERSION (or --consistency OLD_SIZE [NEW_SIZE])"
            )
        stream_id, version = args[0], _number(args[1], "a version number", "VERSION")
    elif len(args) > 1:
        raise click.UsageError("prove --consistency takes OLD_SIZE and at most one NEW_SIZE")
    else:
        new_size = _tree_size(args[0]) if args else None
    # Without a key, a proof only reads: of what the Merkle log holds, against stored
    # checkpoints. With one it signs (and stores) a checkpoint, after catching the log up.
    with app.open(write=key is not None) as store:
        log = MerkleLog(store)
        if key is not None:
            _catch_up(app, log)
        try:
            if old_size is None:
                doc = log.prove_event(stream_id, version, key=key, catch_up=key is not None)
            else:
                doc = log.prove_consistency(old_size, new_size, key=key, catch_up=key is not None)
        except CheckpointNeeded as exc:
            # A look-only command that would need a write (signing) to answer: exit 2,
            # as every such command (docs/cli.md), naming the commands that sign.
            raise ConfigError(
                f"{exc.reason}; signing one writes to the store, which prove without --key "
                "does not do"
            ) from None
    if out is not None:
        try:
            Path(out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot write {out}: {exc.strerror or exc}") from None
    if as_json:
        return app.json(doc)
    cp = read_checkpoint(doc["checkpoint"]).checkpoint
    if old_size is None:
        app.say(
            f"{stream_id} v{version} is leaf {doc['leaf_index']} of {cp.origin} at size "
            f"{cp.size} ({len(doc['inclusion'])} hashes)"
        )
    else:
        app.say(
            f"{cp.origin} at size {doc['new_size']} extends size {doc['old_size']} "
            f"({len(doc['consistency'])} hashes)"
        )
    if out is None:
        app.note("add --json (or --out FILE) for the proof itself")
    return EXIT_OK


@cli.command(name="verify-proof")
@click.argument("file", metavar="FILE")
@vkey_option(VKEY_HELP)
@click.option(
    "--old",
    "old_file",
    metavar="FILE",
    help="Consistency proofs: the old signed checkpoint you trust (a note, or a proof JSON "
    "whose checkpoint it is); default: the one in the proof, if signed by a trusted key.",
)
@json_app
def verify_proof_cmd(
    app: App, file: str, vkeys: tuple[str, ...], old_file: str | None, as_json: bool
) -> int:
    """Check a proof file offline: its checkpoint's signature, its root and the proof.

    Works on both kinds `prove` writes (inclusion and consistency) without opening any
    store. FILE '-' reads stdin. Exit 0 when valid, 1 when not (the reason is printed),
    2 on usage errors (unreadable file, not a proof: neither kind or both, malformed key).

    \b
    Example:
      ares-events verify-proof proof.json --vkey "$(cat log.vkey)"
      ares-events verify-proof growth.json --vkey log.vkey --old old-checkpoint.txt
    """
    keys = load_vkeys(vkeys)
    doc = _read_json(file)
    old = _read_old(old_file) if old_file is not None else None
    try:
        check = verify_proof(doc, keys, old_checkpoint=old)
    except ProofError as exc:
        raise CommandError(f"{file}: {exc.reason}") from None
    if as_json:
        app.json(check.to_dict())
    elif check.ok:
        what = (
            f"leaf {check.details['leaf_index']}"
            if check.kind == "inclusion"
            else f"growth from size {check.details['old_size']}"
        )
        signed = f"(signed by {', '.join(check.signed_by)})"
        line = f"{check.kind} proof: {what} in {check.origin} at size {check.tree_size} {signed}"
        app.out.print(verdict(True, line, good="valid"))
    else:
        app.out.print(verdict(False, f"{check.kind} proof: {check.reason}", bad="INVALID"))
    return EXIT_OK if check.ok else EXIT_FINDINGS


def _read_json(file: str) -> dict[str, Any]:
    try:
        doc = user_json(read_text(file))
    except ValueError:
        raise CommandError(
            f"{file} is not JSON, or nested too deeply (a proof is the JSON `prove --json` prints)"
        ) from None
    if not isinstance(doc, dict):
        raise CommandError(f"{file} is not a JSON object")
    return doc


def _read_old(file: str) -> str:
    text = read_text(file)
    if text.lstrip().startswith("{"):
        try:
            doc = user_json(text)
        except ValueError:
            raise CommandError(f"{file} is not JSON nor a signed checkpoint") from None
        cp = doc.get("checkpoint") if isinstance(doc, dict) else None
        if not isinstance(cp, str):
            raise CommandError(f"{file} holds no 'checkpoint'")
        return cp
    return text
