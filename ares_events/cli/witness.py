"""CLI command group ``witness``: a small C2SP tlog-witness with its state in SQLite."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import click
from rich.table import Table

from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    App,
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
)
from ares_events.errors import ProofError, WitnessRefused
from ares_events.integrity.checkpoints import b64, unb64_hash
from ares_events.integrity.witness import LogWitness, parse_request


def _state_option(help_: str) -> Callable[[Any], Any]:
    return click.option(
        "--state", default="ares-witness.db", show_default=True, metavar="FILE", help=help_
    )


@cli.group(name="witness")
def witness_group() -> None:
    """A witness: cosign a log's checkpoints only while the log stays append-only.

    The witness trusts logs by verifier key and remembers, per log, the last checkpoint it
    cosigned. It cosigns a new checkpoint only with a consistency proof from that one
    (C2SP tlog-witness semantics), so a log that rewrote or cut its history can never get
    a cosignature again. Its state lives in one SQLite file (--state).

    \b
    Example:
      ares-events keygen witness.example/w1 --out w1.key --witness > w1.vkey
      ares-events witness add-log "$(cat log.vkey)" --state w1.db
      ares-events prove --consistency 0 --key log.key --json > req.json
      ares-events witness cosign req.json --state w1.db --key w1.key
    """


@witness_group.command(name="add-log")
@click.argument("vkey")
@_state_option("The witness's state file (SQLite; created when missing).")
@click.option("--origin", metavar="ORIGIN", help="The log's origin line (default: the key's name).")
@json_app
def add_log_cmd(app: App, vkey: str, state: str, origin: str | None, as_json: bool) -> int:
    """Trust the log whose verifier key is VKEY (text, or a file holding it); with --json
    {"origin", "key_id", "state"}.

    \b
    Example:
      ares-events witness add-log log.vkey --state w1.db
    """
    # Named as this command takes it: add-log has no --vkey option.
    (key,) = load_vkeys((vkey,), option="VKEY")
    with LogWitness(state) as w:
        o = w.add_log(key, origin)
    if as_json:
        return app.json({"origin": o, "key_id": key.key_id.hex(), "state": state})
    app.say(f"trusting {o} (key {key.key_id.hex()}) in {state}")
    return EXIT_OK


@witness_group.command(name="list")
@_state_option("The witness's state file (SQLite; read only, never created or changed).")
@json_app
def list_cmd(app: App, state: str, as_json: bool) -> int:
    """The logs this witness trusts and the last size it cosigned for each.

    \b
    Example:
      ares-events witness list --state w1.db --json
    """
    # Read-only (docs/cli.md, "Which commands write"): a missing file, or one that is not a
    # witness's state (an event store, an empty file), is a usage error, and the file is
    # left byte for byte as it was.
    with LogWitness(state, read_only=True) as w:
        logs = w.logs()
    if as_json:
        rows = [
            dict(asdict(lg), vkeys=list(lg.vkeys), root=b64(lg.root) if lg.root else None)
            for lg in logs
        ]
        return app.json({"logs": rows})
    table = Table(title=text(f"witness {state}"), title_justify="left")
    # Names and roots are copied whole.
    add_columns(table, "origin", "cosigned size", "root", "at", no_wrap=True)
    for lg in logs:
        root = b64(lg.root) if lg.root else "-"
        table.add_row(text(lg.origin), str(lg.size), root, lg.cosigned_at or "-")
    app.table(table, optional=("at",))
    return EXIT_OK


@witness_group.command(name="cosign")
@click.argument("request", metavar="REQUEST")
@_state_option("The witness's state file (SQLite; created when missing).")
@key_option(required=True, help_="The witness's cosigning key file (keygen --witness).")
@json_app
def cosign_cmd(app: App, request: str, state: str, key_file: str, as_json: bool) -> int:
    """Cosign the checkpoint in REQUEST if it extends the last one cosigned for its log.

    REQUEST ('-': stdin) is a tlog-witness add-checkpoint body ("old <size>", the
    consistency proof lines, an empty line, the signed checkpoint) or the JSON that
    `ares-events prove --consistency OLD --json` prints. Prints the cosignature line(s),
    or with --json {"status": 200, "cosignatures", "checkpoint"}. A refusal exits 1 with
    its tlog-witness status: 404 unknown log, 403 not signed by it, 400 malformed, 409
    not the last cosigned size (the answer says which is), 422 not consistent.

    \b
    Example:
      ares-events witness cosign req.json --state w1.db --key w1.key --json
    """
    key = load_signing_key(app, key_file, required=True)
    try:
        # A request that does not parse is the protocol's "400 Bad Request", a refusal
        # like the others (exit 1); only a REQUEST that cannot be read is a usage error.
        old, proof, note = _request(request)
        with LogWitness(state, key) as w:
            res = w.add_checkpoint(old, proof, note)
    except WitnessRefused as exc:
        if as_json:
            app.json({"status": exc.status, "reason": exc.reason, "latest_size": exc.latest_size})
        else:
            extra = "" if exc.latest_size is None else f" (last cosigned size: {exc.latest_size})"
            app.out.print(verdict(False, f"{exc.status}: {exc.reason}{extra}", bad="REFUSED"))
        return EXIT_FINDINGS
    if as_json:
        data = {"status": 200, "origin": res.origin, "size": res.size}
        return app.json({**data, "cosignatures": list(res.lines), "checkpoint": res.note})
    click.echo("".join(res.lines), nl=False)
    return EXIT_OK


def _request(source: str) -> tuple[int, list[bytes], str]:
    """``(old size, proof, checkpoint)`` of REQUEST.

    Raises:
        CommandError: it cannot be read.
        WitnessRefused: it does not parse (400).
    """
    text = read_text(source)
    if not text.lstrip().startswith("{"):
        return parse_request(text)
    try:
        doc: Any = user_json(text)
        old = doc["old_size"]
        proof = [unb64_hash(h, "consistency") for h in doc["consistency"]]
        note = doc["checkpoint"]
    except ProofError as exc:
        raise WitnessRefused(400, f"not a consistency proof JSON: {exc.reason}") from None
    except KeyError as exc:
        raise WitnessRefused(400, f"not a consistency proof JSON: no {exc}") from None
    except (ValueError, TypeError) as exc:
        raise WitnessRefused(400, f"not a consistency proof JSON ({exc})") from None
    if type(old) is not int or old < 0 or not isinstance(note, str):
        raise WitnessRefused(400, "old_size must be an integer >= 0, checkpoint a string")
    return old, proof, note
