"""Signed approvals of LangGraph interrupts: :class:`ApprovalGate` lets a node go on only
after it checked an approver's signed approval itself and recorded it as used, on the
thread's stream (docs/guide-langgraph.md shows the flow and the events).

It may import anything in the package, and ``langgraph``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from langgraph.config import get_config
from langgraph.errors import GraphInterrupt
from langgraph.types import Command, interrupt

from ares_events.agents.approvals import (
    APPROVAL_REASON,
    Approval,
    Ledger,
    Pending,
    approver_keys,
    check_approval,
)
from ares_events.agents.journal_errors import RunNotRunnable
from ares_events.agents.recording import hash_of
from ares_events.core.catalog import new_event
from ares_events.core.events import ANY, NO_STREAM
from ares_events.core.faces import blocking
from ares_events.core.iterators import closing_iter
from ares_events.errors import ApprovalForged, ConcurrencyError, ConfigError
from ares_events.integrations._langgraph_core import MODULE, stream_of

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from ares_events.core.store import EventStore
    from ares_events.integrity.notes import VerifierKey

__all__ = ["PRESENTED", "REQUESTED", "USED", "ApprovalGate"]

REQUESTED: Final = "lg.approval.requested"
PRESENTED: Final = "lg.approval"
USED: Final = "lg.approval.used"
_OURS: Final = frozenset({REQUESTED, PRESENTED, USED})
_RETRIES: Final = 100


@dataclass(slots=True)
class _Thread:
    ledger: Ledger = field(default_factory=Ledger)
    asked: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Every request by step, answered or not."""
    used_at: dict[str, datetime] = field(default_factory=dict)
    """When each nonce was used (an approval's expiry is judged at its first use)."""
    head: bytes = b""
    version: int = 0


class ApprovalGate:
    """Signed approvals of a graph's interrupts, recorded on the threads' streams.

    Args:
        store: The blocking store the saver writes to (``AresSaver.store``, or for an
            ``AsyncAresSaver`` one opened on the same URL).
        approvers: The verifier keys whose signed approvals let a node go on (never read
            from the store).

    Raises:
        ConfigError: no approver key.
    """

    def __init__(self, store: EventStore, *, approvers: Sequence[VerifierKey | str]) -> None:
        if not approvers:
            raise ConfigError("an approval gate needs the approvers' verifier keys")
        self.store = blocking(store, "ApprovalGate")
        self.approvers = approver_keys(approvers)

    def interrupt(self, value: Any) -> str:
        """In a node: pause the graph until an approver's signed approval of ``value``
        (JSON, shown to the approver) is presented; then check it and record it as used.
        Returns the approval's nonce, the same every time this task runs again: the
        idempotency key to give the approved side effect (a node that dies after its side
        effect runs again, as any LangGraph node does).

        Raises:
            GraphInterrupt: the first time (LangGraph's pause); the request is recorded.
            ApprovalRefused: the answer is not a valid signed approval of this very
                interrupt, now (a subclass says why); the node must not go on.
            ConfigError: a second gate in the same node.
        """
        conf = get_config()["configurable"]
        stream, ns = stream_of(str(conf["thread_id"])), str(conf.get("checkpoint_ns", ""))
        ah = hash_of(value, "args")
        try:
            interrupt({"approval_required": value, "args_hash": ah})
        except GraphInterrupt as exc:
            self._ask(stream, ns, exc, value, ah)
            raise
        return self._check(stream, ns, ah)

    def _ask(self, stream: str, ns: str, exc: GraphInterrupt, value: Any, ah: str) -> None:
        found = exc.args[0] if exc.args else ()
        iid = str(getattr(found[0], "id", "")) if found else ""
        for _ in range(_RETRIES):
            t = self._read(stream)
            if any(p.get("ns") == ns for _v, p in t.ledger.requests.values()):
                return  # asked already: the node ran again before an answer came
            if any(p.get("ns") == ns for p in t.asked.values()):
                raise ConfigError(
                    f"a second approval gate in node task {ns!r}: one gate per node (put "
                    "each approved action in its own node)"
                )
            payload = {"reason": APPROVAL_REASON, "step": t.version + 1, "ns": ns, "interrupt": iid}
            ev = new_event(REQUESTED, MODULE, {**payload, "args": value, "args_hash": ah})
            try:
                self.store.append(stream, [ev], expected_version=t.version or NO_STREAM)
                return
            except ConcurrencyError:
                continue  # the saver wrote meanwhile: read again
        raise ConcurrencyError(stream, "its head", t.version, "too many concurrent writers")

    def _check(self, stream: str, ns: str, ah: str) -> str:
        """Check the approval of this task's request: the one it used, else the latest
        presented for it. The answer LangGraph hands back is not looked at: it sticks to
        the task, a bad one too, while the thread's record can take a new approval."""
        t = self._read(stream)
        mine = [step for step, p in t.asked.items() if p.get("ns") == ns]
        if not mine:
            raise ApprovalForged(stream, None, "this task asked for no approval")
        step = mine[-1]
        spent = next((n for n, s in t.ledger.used.items() if s == step), None)
        if spent is not None:
            # This very task, run again from its start after a later resume: the approval
            # it used is checked again (a used-event alone proves nothing), as of its use.
            found = [a for a in t.ledger.presented if _field(a[2], "nonce") == spent][:1]
        else:
            others = set(t.ledger.requests) - {step}
            found = [
                a for a in t.ledger.presented if a[0] > step and _field(a[2], "step") not in others
            ]
        if not found:
            raise ApprovalForged(stream, step, "no signed approval was presented for it")
        version, prev, note = found[-1]
        nonce = check_approval(
            note,
            Pending(stream, step, ah, prev),
            trusted=self.approvers,
            used=t.ledger.used_before(version) - {spent},
            now=t.used_at.get(spent) if spent is not None else None,
        ).nonce
        if spent is not None:
            return nonce
        # One used-event per nonce whatever the races: its id is the nonce's.
        used_id = uuid.uuid5(uuid.NAMESPACE_URL, f"ares-events:{stream}:{nonce}")
        payload = {"approved": nonce, "step": step, "args_hash": ah}
        ev = new_event(USED, MODULE, payload, event_id=used_id)
        self.store.append(stream, [ev], expected_version=ANY)
        return nonce

    def pending(self, config: RunnableConfig, step: int | None = None) -> Pending:
        """What an approval of the thread's interrupt must name now (default: the latest
        one waiting): sign it with :func:`~ares_events.agents.approvals.sign_approval`.

        Raises:
            RunNotRunnable: the thread waits for no approval (at ``step``).
        """
        stream = _stream(config)
        t = self._read(stream)
        open_ = t.ledger.requests
        step = max(open_, default=None) if step is None else step
        if step is None or step not in open_:
            raise RunNotRunnable(stream, "not waiting", "it waits for no signed approval")
        return Pending(stream, step, str(open_[step][1].get("args_hash")), t.head)

    def resume(self, config: RunnableConfig, approval: str) -> Command[Any]:
        """Check ``approval`` against the interrupt it names and the thread's head,
        record it on the thread, and return the ``Command`` that resumes the graph with it.

        Raises:
            ApprovalRefused: forged, expired, replayed, reused or for another interrupt
                (nothing is recorded).
            RunNotRunnable: the thread waits for no approval.
            ConcurrencyError: the thread moved since the approval was signed (sign again).
        """
        stream = _stream(config)
        t = self._read(stream)
        named = Approval.parse(approval, stream, None).body.get("step")
        waiting = t.ledger.requests
        if not waiting:
            raise RunNotRunnable(stream, "not waiting", "it waits for no signed approval")
        step = named if named in waiting and type(named) is int else max(waiting)
        req = waiting[step]
        pending = Pending(stream, step, str(req[1].get("args_hash")), t.head)
        used = t.ledger.used_before(2**62)
        nonce = check_approval(approval, pending, trusted=self.approvers, used=used).nonce
        presented = new_event(PRESENTED, MODULE, {"approval": approval, "step": step})
        self.store.append(stream, [presented], expected_version=t.version)
        iid = req[1].get("interrupt")
        return Command(resume={iid: nonce} if iid else nonce)

    def _read(self, stream: str) -> _Thread:
        """The thread's approval events (the saver's own are passed by, unread)."""
        t = _Thread()
        with closing_iter(self.store.read(stream)) as events:
            for e in events:
                if e.type in _OURS and not e.payload_erased and isinstance(e.payload, dict):
                    t.ledger.fold(e, t.head)
                    if e.type == REQUESTED:
                        t.asked[e.version] = e.payload
                    elif e.type == USED and isinstance(e.payload.get("approved"), str):
                        t.used_at.setdefault(e.payload["approved"], e.recorded_at)
                t.head, t.version = e.hash, e.version
        return t


def _stream(config: RunnableConfig) -> str:
    return stream_of(str(config["configurable"]["thread_id"]))


def _field(note: str, name: str) -> Any:
    """The approval's ``nonce`` or ``step``; None when the note does not parse."""
    try:
        approval = Approval.parse(note, "", None)
    except ApprovalForged:
        return None
    return approval.nonce if name == "nonce" else approval.body.get(name)
