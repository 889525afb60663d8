"""Signed approvals of pending calls: what an approver signs (a C2SP signed note, laid out
in docs/records.md), :func:`check_approval`'s typed refusals before a call runs under
one, and :class:`Ledger`, a run's pending requests, approvals and used nonces.

It may import the format layer, the core and integrity.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from ares_events.chain import canonical_json
from ares_events.errors import (
    ApprovalExpired,
    ApprovalForged,
    ApprovalReplayed,
    ApprovalReused,
    ApprovalWrongCall,
    ConfigError,
    ProofError,
)
from ares_events.integrity.notes import Note, SigningKey, VerifierKey, open_note

if TYPE_CHECKING:
    from ares_events.core.events import RecordedEvent

__all__ = [
    "APPROVAL_PREFIX",
    "APPROVAL_REASON",
    "Approval",
    "Ledger",
    "Pending",
    "approver_keys",
    "check_approval",
    "sign_approval",
]

APPROVAL_PREFIX: Final = "ares-events/approval/v1"
APPROVAL_REASON: Final = "approval required"
"""The ``reason`` of the interrupt a call that needs approval appends."""
ACTIONS: Final = ("approve", "result", "not_done")
_AT: Final = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True, slots=True)
class Pending:
    """What an approval must name: the run, the step, the digest of the call's arguments
    and the chain head it is presented after."""

    run_id: str
    step: int
    args: str
    head: bytes


@dataclass(frozen=True, slots=True)
class Approval:
    """A parsed approval note."""

    note: str
    body: dict[str, Any]
    signer: str
    """``<name>+<key id>`` of its (first) signature line."""

    @property
    def nonce(self) -> str:
        """The single-use nonce."""
        return str(self.body.get("nonce"))

    @classmethod
    def parse(cls, note: str, run_id: str, step: int | None) -> Approval:
        """Parse an approval note (nothing verified).

        Raises:
            ApprovalForged: not an approval note.
        """
        try:
            parsed = Note.parse(note)
            lines = parsed.text.split("\n")
            if len(lines) != 3 or lines[0] != APPROVAL_PREFIX or lines[2]:
                raise ValueError("not an approval")
            body = json.loads(lines[1])
            if not isinstance(body, dict) or body.get("action") not in ACTIONS:
                raise ValueError("not an approval")
        except (ProofError, ValueError, TypeError):
            raise ApprovalForged(run_id, step, "not a signed approval note") from None
        sig = parsed.signatures[0]
        return cls(note, body, f"{sig.name}+{sig.key_id.hex()}")


def sign_approval(
    key: SigningKey,
    pending: Pending,
    *,
    action: str = "approve",
    outcome: str | None = None,
    expires_in: float = 900.0,
    now: datetime | None = None,
) -> str:
    """An approval of ``pending``, signed with the approver's ``key``.

    Args:
        pending: the call it approves and the head the approver sees now.
        action: ``approve``, ``result`` (with ``outcome``: the result's ``hash_of``) or
            ``not_done``.
        expires_in: seconds until it expires; ``now``: the signing time (default: UTC now).

    Raises:
        ApprovalWrongCall: an unknown ``action``, or ``outcome`` missing for ``result``.
    """
    if action not in ACTIONS or (action == "result") != (outcome is not None):
        raise ApprovalWrongCall(pending.run_id, pending.step, f"cannot sign action {action!r}")
    at = (now or datetime.now(UTC)) + timedelta(seconds=expires_in)
    body: dict[str, Any] = {
        "action": action,
        "args": pending.args,
        "expires": at.strftime(_AT),
        "head": pending.head.hex(),
        "key": f"{key.name}+{key.verifier.key_id.hex()}",
        "nonce": secrets.token_hex(16),
        "run": pending.run_id,
        "step": pending.step,
    }
    if outcome is not None:
        body["outcome"] = outcome
    text = f"{APPROVAL_PREFIX}\n{canonical_json(body).decode('utf-8')}\n"
    return text + "\n" + key.signature_line(text.encode("utf-8"))


def approver_keys(keys: Iterable[VerifierKey | str]) -> tuple[VerifierKey, ...]:
    """``keys`` as verifier keys: a :class:`VerifierKey`, or its text as ``keygen
    --approver`` prints it (what a ``.vkey`` file holds).

    Raises:
        ConfigError: a text that is not a verifier key (never repeated: it may be a
            private key), or something else in a key's place.
    """
    out = []
    for key in keys:
        if isinstance(key, str):
            out.append(VerifierKey.parse(key, source="an approver's key"))
        elif isinstance(key, VerifierKey):
            out.append(key)
        else:
            raise ConfigError(
                f"an approver's key must be a VerifierKey or its text, got {type(key).__name__}"
            )
    return tuple(out)


def check_approval(
    note: str,
    pending: Pending,
    *,
    trusted: Sequence[VerifierKey | str],
    used: Iterable[str] = (),
    action: str = "approve",
    outcome: str | None = None,
    now: datetime | None = None,
) -> Approval:
    """Check ``note`` approves exactly ``pending``, now, once, by a trusted key.

    Raises:
        ApprovalForged: malformed, or not signed (validly) by a key in ``trusted``.
        ApprovalReplayed: its nonce is in ``used``.
        ApprovalReused: issued for another run or another chain head.
        ApprovalWrongCall: another step, arguments digest, action or outcome.
        ApprovalExpired: its expiry has passed.
        ConfigError: a key in ``trusted`` is not a verifier key (:func:`approver_keys`).
    """
    run, step = pending.run_id, pending.step
    approval = Approval.parse(note, run, step)
    try:
        _note, signers = open_note(note, approver_keys(trusted))
    except ProofError as exc:
        raise ApprovalForged(run, step, exc.reason) from None
    body = approval.body
    if body.get("key") not in {f"{k.name}+{k.key_id.hex()}" for k in signers}:
        raise ApprovalForged(
            run, step, f"no trusted signature of the key it names, {body.get('key')!r}"
        )
    if approval.nonce in set(used):
        raise ApprovalReplayed(run, step, f"nonce {approval.nonce[:12]} was used before")
    if body.get("run") != run:
        raise ApprovalReused(run, step, f"it approves run {body.get('run')!r}")
    if body.get("head") != pending.head.hex():
        raise ApprovalReused(run, step, "it was signed against another chain head")
    wanted = {"step": step, "args": pending.args, "action": action, "outcome": outcome}
    wrong = [name for name, want in wanted.items() if body.get(name) != want]
    if wrong:
        raise ApprovalWrongCall(run, step, f"its {', '.join(wrong)} differ from the pending call")
    try:
        expires = datetime.strptime(str(body.get("expires")), _AT).replace(tzinfo=UTC)
    except ValueError:
        raise ApprovalForged(run, step, "its expiry is not a UTC time") from None
    if (now or datetime.now(UTC)) > expires:
        raise ApprovalExpired(run, step, f"it expired at {body.get('expires')}")
    return approval


@dataclass(slots=True)
class Ledger:
    """A run's approval requests, the approvals presented after each and the nonces
    consumed, read from its events in order: a request is a payload with ``reason`` =
    :data:`APPROVAL_REASON`, an integer ``step`` and an ``args_hash`` (the journal's
    ``run.interrupted``, the LangGraph gate's ``lg.interrupted``); a payload's ``approval``
    presents a note, its ``approved`` (with ``step``) consumes a nonce."""

    requests: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    """step -> (version, payload) of the latest request at that step no call consumed yet."""
    presented: list[tuple[int, bytes, str]] = field(default_factory=list)
    """(version, hash of the event before it, note) of every approval, in order."""
    used: dict[str, int | None] = field(default_factory=dict)
    """Nonces that let a call run -> the step of that call."""

    def fold(self, event: RecordedEvent, prev: bytes) -> None:
        """Take one event of the run (``prev``: the hash of the event before it)."""
        if event.payload_erased or not isinstance(event.payload, dict):
            return
        p = event.payload
        step = p.get("step") if type(p.get("step")) is int else None
        if p.get("reason") == APPROVAL_REASON and step is not None and "args_hash" in p:
            self.requests[step] = (event.version, p)
        note = p.get("approval")
        if isinstance(note, str):
            self.presented.append((event.version, prev, note))
        nonce = p.get("approved")
        if isinstance(nonce, str):
            self.used[nonce] = step
            if step is not None:
                self.requests.pop(step, None)  # consumed: no approval matches it any more

    def answer(self, step: int) -> tuple[int, bytes, str] | None:
        """The latest approval presented after the open request at ``step``."""
        req = self.requests.get(step)
        if req is None:
            return None
        after = [a for a in self.presented if a[0] > req[0]]
        return after[-1] if after else None

    def used_before(self, version: int) -> set[str]:
        """Nonces consumed, or presented by an approval before ``version``."""
        earlier = set(self.used)
        for v, _prev, note in self.presented:
            if v < version:
                with contextlib.suppress(ApprovalForged):  # not an approval note: no nonce
                    earlier.add(Approval.parse(note, "", None).nonce)
        return earlier
