"""Checking signed checkpoints kept by a witness against the events as they are today.

``ares-events anchor --key FILE`` writes the log's signed checkpoint (a C2SP
``tlog-checkpoint`` note) to the witness folder as ``checkpoint-<size>-<time>.note``.
:func:`check_checkpoint_notes` verifies each note's signature against trusted verifier keys
and then recomputes, in one pass over ``read_all``, the RFC 9162 root of the first ``size``
events for every checkpoint size, straight from the events' chain hashes (never from the
stored tree, which a rewrite could leave as it was). That is the consistency of each
signed checkpoint with today's log, shown by recomputation: a checkpoint proves the log
extends it exactly when the root of today's first ``size`` leaves is its root.

An edited note no longer verifies (forging one needs the log key); removing notes from the
witness leaves the others checked; a rewrite of any event before a checkpoint's size
changes the root at that size. Findings (the first failing checkpoint of each kind, with
how many others fail the same way):

``anchor_corrupt``      a note that does not parse, or whose signature does not verify,
                        or that no trusted key of its origin signed.
``anchor_unverified``   no trusted verifier key is known (pass ``--vkey``).
``anchor_truncated``    the log now holds fewer events than the checkpoint's size.
``anchor_rewritten``    the root of the first ``size`` events differs from the signed one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ares_events.errors import ProofError
from ares_events.integrity import merkle
from ares_events.integrity.checkpoints import SignedCheckpoint, b64, open_checkpoint
from ares_events.integrity.findings import Finding
from ares_events.integrity.notes import VerifierKey

__all__ = ["RootAccumulator", "check_checkpoint_notes", "recorded_log_keys"]

NOTE_PREFIX = "checkpoint-"
NOTE_SUFFIX = ".note"


class RootAccumulator:
    """RFC 9162 roots of a growing list of leaves with ``O(log n)`` state: the roots of
    the complete subtrees that make up the tree so far, largest first."""

    __slots__ = ("size", "stack")

    def __init__(self) -> None:
        self.size = 0
        self.stack: list[tuple[int, bytes]] = []  # (height, hash)

    def add(self, leaf_data: bytes) -> None:
        """Append one leaf (its data: an event's chain hash)."""
        stack = self.stack
        h, height = merkle.leaf_hash(leaf_data), 0
        while stack and stack[-1][0] == height:
            h = merkle.node_hash(stack.pop()[1], h)
            height += 1
        stack.append((height, h))
        self.size += 1

    def root(self) -> bytes:
        """The root of the leaves added so far."""
        if not self.stack:
            return merkle.EMPTY_ROOT
        r = self.stack[-1][1]
        for _, h in reversed(self.stack[:-1]):
            r = merkle.node_hash(h, r)
        return r


def recorded_log_keys(recorder: Any) -> list[VerifierKey]:
    """The verifier keys the store recorded as having signed its checkpoints (a weaker
    source than keys given from outside: whoever can write the store can change them)."""
    import json

    get = getattr(recorder, "meta_get", None)
    raw = get("log_keys") if callable(get) else None
    out: list[VerifierKey] = []
    try:
        for text in json.loads(raw) if raw else []:
            try:
                out.append(VerifierKey.parse(str(text)))
            except ValueError:
                continue
    except ValueError:
        return []
    return out


def _roots_at(recorder: Any, sizes: set[int]) -> tuple[int, dict[int, bytes]]:
    """(number of events visible to ``read_all``, root at each wanted size)."""
    acc = RootAccumulator()
    roots: dict[int, bytes] = {}
    if 0 in sizes:
        roots[0] = merkle.EMPTY_ROOT
    for e in recorder.read_all(0, None):
        h = e.hash
        acc.add(h if isinstance(h, bytes) else repr(h).encode())
        if acc.size in sizes:
            roots[acc.size] = acc.root()
    return acc.size, roots


def check_checkpoint_notes(
    recorder: Any, notes: Iterable[tuple[str, bytes]], keys: Sequence[VerifierKey]
) -> tuple[int, list[Finding]]:
    """Check every ``(name, note bytes)`` against ``keys`` and today's events.

    Returns:
        (checkpoints whose signature verified, findings).

    Raises:
        StoreUnavailable: the store cannot be read.
    """
    findings: list[Finding] = []
    good: list[tuple[str, SignedCheckpoint]] = []
    for name, raw in notes:
        if not keys:
            findings.append(
                Finding(
                    "anchor_unverified",
                    None,
                    None,
                    f"checkpoint {name}: no trusted verifier key to check its signature "
                    "(pass --vkey, or sign checkpoints in this store first)",
                )
            )
            continue
        try:
            signed = open_checkpoint(raw, keys)
            origin = signed.checkpoint.origin
            if not any(k.name == origin for k in signed.verified_by):
                raise ProofError(f"no trusted key of its origin {origin!r} signed it")
        except ProofError as exc:
            findings.append(
                Finding("anchor_corrupt", None, None, f"checkpoint {name}: {exc.reason}")
            )
            continue
        good.append((name, signed))
    if not good:
        return 0, findings
    total, roots = _roots_at(recorder, {s.checkpoint.size for _, s in good})
    failed: dict[str, list[tuple[str, SignedCheckpoint]]] = {}
    for name, signed in sorted(good, key=lambda g: g[1].checkpoint.size):
        cp = signed.checkpoint
        if total < cp.size:
            failed.setdefault("anchor_truncated", []).append((name, signed))
        elif roots.get(cp.size) != cp.root:
            failed.setdefault("anchor_rewritten", []).append((name, signed))
    for kind, items in failed.items():
        name, first = items[0]
        cp = first.checkpoint
        more = f" (and {len(items) - 1} later checkpoint(s) likewise)" if len(items) > 1 else ""
        if kind == "anchor_truncated":
            detail = (
                f"checkpoint {name} of {cp.origin} signed {cp.size} events but the log holds "
                f"{total}: events were deleted{more}"
            )
        else:
            now = roots.get(cp.size)
            detail = (
                f"checkpoint {name} of {cp.origin} signed root {b64(cp.root)} for the first "
                f"{cp.size} events; today they hash to {b64(now) if now else '?'}: some of "
                f"those events were rewritten after it was signed{more}"
            )
        findings.append(Finding(kind, None, None, detail))
    return len(good), findings
