# Generated from runs_async.py by tools/async_to_sync.py: do not edit.
"""Looking at runs (read-only: :func:`inspect_run`, :func:`list_runs`) and operating them
(:func:`resolve_step`, :func:`resume_run`, :func:`cancel_run`: one audited event each, at
the version read), without running their loop. Written once for both faces.

It may import the core, the stores, integrity, projections and this package's leaf modules.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from ares_events.agents.approvals import Ledger, Pending, check_approval
from ares_events.agents.journal_errors import RunNotFound, RunNotRunnable
from ares_events.agents.recording import hash_of
from ares_events.agents.run_info import (
    FINISHED,
    IN_DOUBT,
    LIST_STATUSES,
    MODULE,
    AttemptInfo,
    RunCounts,
    RunInfo,
    StepInfo,
    audit,
    request_of,
    run_counts,
    run_status,
    steps_of,
    tokens_of,
)
from ares_events.core.catalog import new_event
from ares_events.core.faces import blocking
from ares_events.core.iterators import closing_iter, first
from ares_events.errors import ApprovalRefused, ChainIntegrityError, ConfigError
from ares_events.integrity.verifier import ChainVerifier
from ares_events.integrity.verify import chain_start
from ares_events.projections.builtin import RunStateProjection
from ares_events.projections.recovery import recover

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ares_events.core.events import RecordedEvent
    from ares_events.core.store import EventStore  # as is
    from ares_events.integrity.notes import VerifierKey

__all__ = [
    "FINISHED",
    "IN_DOUBT",
    "LIST_STATUSES",
    "AttemptInfo",
    "RunCounts",
    "RunInfo",
    "StepInfo",
    "approval_request",
    "audit",
    "cancel_run",
    "inspect_run",
    "iter_run_ids",
    "list_runs",
    "pending_call",
    "resolve_step",
    "resume_run",
    "run_counts",
    "tokens_of",
]


_UNSET: Final = object()


def _requests(store: EventStore, run_id: str, state: Mapping[str, Any]) -> dict[int, Any]:
    """What each model and tool step asked, by the version of its request event."""
    wanted = {
        rec["version"]
        for rec in state["steps"].values()
        if rec.get("kind") in ("model", "tool") and isinstance(rec.get("version"), int)
    }
    found: dict[int, Any] = {}
    if not wanted:
        return found
    with closing_iter(store.read(run_id, min(wanted), max(wanted))) as events:
        for e in events:
            req = request_of(e) if e.version in wanted else None
            if req is not None:
                found[e.version] = req
    return found


def _why_not_a_run(store: EventStore, run_id: str) -> str | None:
    """None when ``run_id`` is a run, or may be one, else why not."""
    opening = first(store.read(run_id, 1, limit=1))
    if opening is None:
        return "no such run"
    if opening.type != "run.started" and _sound(store, opening):
        return f"stream is not a run (its first event is {opening.type!r}, not 'run.started')"
    # An opening that fails its chain check may be a run's, edited: it is inspected as a
    # run, so its findings are shown (never a run hidden by editing one field).
    return None


def _sound(store: EventStore, opening: RecordedEvent) -> bool:
    """Whether ``opening``, a stream's first readable event, passes its chain check."""
    # Version 1 links to genesis; only a later one (events retired) needs the archive's
    # index, so listing runs reads no index for each stream that is not one.
    start = None if opening.version == 1 else chain_start(store, opening.stream_id)
    sv, sh = start or (0, None)
    v = ChainVerifier(opening.stream_id, store.chain_key, start_version=sv, start_hash=sh)
    v.check_page([opening])
    return not v.findings


def inspect_run(store: EventStore, run_id: str, *, requests: bool = True) -> RunInfo:
    """The run ``run_id`` as its log tells it, appending nothing. ``requests``: also load
    what each model and tool step asked (one more read of the stream).

    Raises:
        RunNotFound: no stream ``run_id``, or a stream that is not a run.
        StoreUnavailable: the store cannot be reached.
    """
    store = blocking(store, "ares_events.agents.runs", "ares_events.agents.runs_async")
    why = _why_not_a_run(store, run_id)
    if why is not None:
        raise RunNotFound(run_id, why)
    # The whole chain, not a snapshot and its tail: what it shows and the exit code it
    # gives must hold for every event (a snapshot vouches only for the fold it saved).
    rep = recover(store, run_id, RunStateProjection(), max_replay=2**62, tolerant=True)
    state = rep.state
    last = first(store.read(run_id, rep.version, limit=1))
    loaded = _requests(store, run_id, state) if requests else {}
    return RunInfo(
        run_id=run_id,
        status=run_status(state),
        version=rep.version,
        code_revision=state["code_revision"],
        prompt_hash=state["prompt_hash"],
        steps=steps_of(state, loaded),
        usage=dict(state["usage"]),
        counts=run_counts(state),
        interrupt=state["interrupt"],
        error=state["error"],
        result=state.get("result"),
        cancelled=state.get("cancelled"),
        updated_at=last.at if last is not None else None,
        findings=list(rep.findings),
        skipped=[f"version {s.version}: {s.type}: {s.reason}" for s in rep.skipped],
        state=state,
    )


def iter_run_ids(store: EventStore) -> Iterator[str]:
    """Streams of ``store`` that are runs (their first event is ``run.started``)."""
    store = blocking(store, "ares_events.agents.runs", "ares_events.agents.runs_async")
    # Listed first: reading each stream while the listing is open would nest cursors.
    for stream_id in [sid for sid, _ in store.streams()]:
        if _why_not_a_run(store, stream_id) is None:
            yield stream_id


def list_runs(store: EventStore, *, status: str | None = None) -> list[RunInfo]:
    """Every run in ``store`` (optionally only those listed under ``status``, one of
    :data:`LIST_STATUSES`), appending nothing. Requests are not loaded.

    Raises:
        ConfigError: unknown ``status``.
        StoreUnavailable: the store cannot be reached.
    """
    if status is not None and status not in LIST_STATUSES:
        raise ConfigError(f"unknown run status {status!r}; expected one of {LIST_STATUSES}")
    out = []
    for run_id in iter_run_ids(store):
        info = inspect_run(store, run_id, requests=False)
        if info.matches(status):
            out.append(info)
    return out


def _checked(store: EventStore, run_id: str) -> tuple[EventStore, RunInfo]:
    """``store`` on this face and the run, read; ChainIntegrityError on findings."""
    store = blocking(store, "ares_events.agents.runs", "ares_events.agents.runs_async")
    info = inspect_run(store, run_id, requests=False)
    if info.findings:
        raise ChainIntegrityError(run_id, info.findings)
    return store, info


def _append(
    store: EventStore, info: RunInfo, type_: str, payload: dict[str, Any], meta: dict[str, Any]
) -> RunInfo:
    ev = new_event(type_, MODULE, payload, metadata=meta)
    store.append(info.run_id, [ev], expected_version=info.version)
    return inspect_run(store, info.run_id, requests=False)


def ledger_of(store: EventStore, run_id: str) -> tuple[Ledger, bytes]:
    """The run's approvals ledger and its head hash (the journal reads it too)."""
    ledger, prev = Ledger(), b""
    with closing_iter(store.read(run_id)) as events:
        for e in events:
            ledger.fold(e, prev)
            prev = e.hash
    return ledger, prev


def pending_call(store: EventStore, run_id: str, step: int | None = None) -> Pending:
    """What an approval must name now: the step (default: the interrupt's), the digest
    of the call waiting there (its arguments; of the interrupt's reason for a plain
    interrupt) and the run's head.

    Raises:
        RunNotFound: no such run.
        RunNotRunnable: the run waits for no approval (no interrupt at a step).
        ChainIntegrityError: the run's chain has findings.
    """
    return (_pending(store, run_id, step))[0]


def approval_request(store: EventStore, run_id: str) -> dict[str, Any] | None:
    """The open approval request :func:`pending_call` names (what the approver is shown),
    as its event recorded it: ``step``, ``name`` (the tool), ``args`` (as recorded) and
    ``args_hash``; None when the run waits for no signed approval.

    Raises:
        RunNotFound: no such run.
        ChainIntegrityError: the run's chain has findings.
    """
    try:
        return (_pending(store, run_id, None))[1]
    except RunNotRunnable:
        return None


def _pending(
    store: EventStore, run_id: str, step: int | None
) -> tuple[Pending, dict[str, Any] | None]:
    """:func:`pending_call`, and the payload of the approval request it names (if any)."""
    store, info = _checked(store, run_id)  # never sign against a damaged log
    ledger, head = ledger_of(store, run_id)
    interrupt = info.interrupt or {}
    if step is not None:
        s = info.step(step)
        return Pending(run_id, step, (s.request_hash if s else None) or "", head), None
    step = interrupt.get("step")
    if type(step) is not int and info.status == "running" and ledger.requests:
        # Resumed, but the journal refused the approval it was resumed with: the call
        # still waits for one.
        step = max(ledger.requests)
        req = ledger.requests[step][1]
        return Pending(run_id, step, str(req.get("args_hash")), head), req
    if type(step) is not int:
        raise RunNotRunnable(run_id, info.status, "it waits for no approval of a step")
    found = ledger.requests.get(step)
    if found is not None and interrupt.get("version") == found[0]:
        return Pending(run_id, step, str(found[1].get("args_hash")), head), found[1]
    s = info.step(step)
    args = (s.request_hash if s else None) or hash_of(interrupt.get("reason"), "reason")
    return Pending(run_id, step, args, head), None


def _unused_approval(
    store: EventStore, status: str, pending: Pending, approvers: Sequence[VerifierKey | str]
) -> None:
    """RunNotRunnable while the approval presented last for ``pending``'s request still
    lets the call run (for a journal trusting ``approvers``): a new one would only dangle."""
    ledger, _head = ledger_of(store, pending.run_id)
    found = ledger.answer(pending.step)
    if found is None:
        return
    version, head, note = found
    last = Pending(pending.run_id, pending.step, pending.args, head)
    try:
        old = check_approval(note, last, trusted=approvers, used=ledger.used_before(version))
    except ApprovalRefused:
        return  # the journal refuses it too: a new approval is due
    raise RunNotRunnable(
        pending.run_id,
        status,
        f"it was resumed with an approval of step {pending.step} that no call has used yet "
        f"(it expires at {old.body.get('expires')}): start its agent again",
    )


def _approved(
    store: EventStore,
    run_id: str,
    approval: str,
    approvers: Sequence[VerifierKey | str] | None,
    pending: Pending,
    action: str,
    outcome: str | None = None,
) -> dict[str, Any]:
    """``{"approval": approval}`` once checked valid now (else a typed refusal, before
    anything is appended)."""
    if not approvers:
        raise ConfigError("checking a signed approval needs the trusted approver keys")
    ledger, _head = ledger_of(store, run_id)
    used = ledger.used_before(2**62)
    check_approval(approval, pending, trusted=approvers, used=used, action=action, outcome=outcome)
    return {"approval": approval}


def resolve_step(
    store: EventStore,
    run_id: str,
    step: int,
    *,
    result: Any = _UNSET,
    not_done: bool = False,
    by: str,
    reason: str | None = None,
    via: str = "library",
    approval: str | None = None,
    approvers: Sequence[VerifierKey | str] | None = None,
) -> RunInfo:
    """Settle the in-doubt tool call at ``step``: it landed with ``result`` (its outcome,
    returned to the loop on replay), or it did ``not_done`` (the next attempt runs it
    again with the same idempotency key). Appends one event.

    ``approval``: the verdict an approver signed (action ``result`` or ``not_done``,
    :func:`~ares_events.agents.approvals.sign_approval`), checked against ``approvers`` first.

    Raises:
        RunNotFound: no such run.
        ApprovalRefused: the signed verdict is forged, expired, replayed, reused or names
            another call or outcome (nothing is appended).
        ConfigError: not exactly one of ``result`` / ``not_done``; no step ``step``; not a
            tool step; not in doubt; an approval without ``approvers``.
        RunNotRunnable: the run is finished (completed, failed or cancelled).
        ChainIntegrityError: the run's chain has findings (never act on a damaged log).
        ConcurrencyError: the run changed since it was read.
    """
    if (result is _UNSET) == (not not_done):
        raise ConfigError("give exactly one of a result or not_done")
    store, info = _checked(store, run_id)
    s = info.step(step)
    if s is None:
        raise ConfigError(f"run {run_id!r} has no step {step} (it has {len(info.steps)})")
    if s.kind != "tool":
        raise ConfigError(
            f"step {step} of run {run_id!r} is a {s.kind} step; only tool calls are in doubt "
            "(an unanswered model call is simply made again)"
        )
    if not s.in_doubt or s.key is None:
        raise ConfigError(
            f"tool call {s.name!r} at step {step} of run {run_id!r} is not in doubt "
            f"(status {s.status})"
        )
    if info.status in FINISHED:  # a call left in doubt when the run was cancelled
        raise RunNotRunnable(run_id, info.status, "a finished run takes no verdict")
    meta = audit(by, reason, via)
    signed: dict[str, Any] = {}
    if approval is not None:
        head = first(store.read(run_id, info.version, limit=1))
        pending = Pending(run_id, step, s.request_hash or "", head.hash if head else b"")
        outcome = None if not_done else hash_of(result, "result")
        action = "not_done" if not_done else "result"
        signed = _approved(store, run_id, approval, approvers, pending, action, outcome)
    if not_done:
        payload = {"idempotency_key": s.key, "by": by, **signed}
        return _append(store, info, "tool.call.not_done", payload, meta)
    payload = {"idempotency_key": s.key, "result": result, "resolved_by": by, **signed}
    return _append(store, info, "tool.returned", payload, meta)


def resume_run(
    store: EventStore,
    run_id: str,
    *,
    by: str,
    reason: str | None = None,
    via: str = "library",
    approval: str | None = None,
    approvers: Sequence[VerifierKey | str] | None = None,
) -> RunInfo:
    """Answer the run's interrupt: append ``run.resumed``; the next incarnation of the
    loop goes on past it.

    ``approval``: an approver's signed approval of the :func:`pending_call`, checked
    against ``approvers`` first; a journal that trusts the key lets a ``needs_approval``
    call run under it, once. A running run takes a new one only when the approval it was
    resumed with no longer holds (the journal refused it: expired, say).

    Raises:
        RunNotFound: no such run.
        ApprovalRefused: the approval is forged, expired, replayed, reused or names
            another call (nothing is appended).
        ConfigError: an approval without ``approvers``.
        RunNotRunnable: the run is not paused (or, with ``approval``, is running with an
            approval of the call that no call has used yet), or is paused on an in-doubt
            tool call that has not been resolved yet.
        ChainIntegrityError: the run's chain has findings.
        ConcurrencyError: the run changed since it was read.
    """
    store, info = _checked(store, run_id)
    signed: dict[str, Any] = {}
    if approval is not None:
        pending = pending_call(store, run_id)
        signed = _approved(store, run_id, approval, approvers, pending, "approve")
        if info.status not in ("paused", "in_doubt"):
            _unused_approval(store, info.status, pending, approvers or ())
    if info.status not in ("paused", "in_doubt") and not signed:
        raise RunNotRunnable(run_id, info.status, "only a paused run resumes")
    if info.status == "in_doubt" and info.in_doubt:
        s = info.in_doubt[0]
        raise RunNotRunnable(
            run_id,
            info.status,
            f"tool call {s.name!r} at step {s.step} is still in doubt; resolve it first "
            f"(ares-events runs resolve {run_id} {s.step} --result JSON | --not-done)",
        )
    payload = {"by": by, **signed}
    return _append(store, info, "run.resumed", payload, audit(by, reason, via))


def cancel_run(
    store: EventStore,
    run_id: str,
    *,
    by: str,
    reason: str | None = None,
    via: str = "library",
) -> RunInfo:
    """Stop the run for good: append ``run.cancelled``. Its recorded steps still replay;
    a new step raises ``RunNotRunnable`` (status ``cancelled``), and a live incarnation is
    fenced off at its next append.

    Raises:
        RunNotFound: no such run.
        RunNotRunnable: the run is already completed, failed or cancelled.
        ChainIntegrityError: the run's chain has findings.
        ConcurrencyError: the run changed since it was read.
    """
    store, info = _checked(store, run_id)
    if info.status in FINISHED:
        raise RunNotRunnable(run_id, info.status, "a finished run cannot be cancelled")
    payload: dict[str, Any] = {"by": by}
    if reason:
        payload["reason"] = reason
    return _append(store, info, "run.cancelled", payload, audit(by, reason, via))
