"""Looking at runs and operating them, without running their loop.

Looking is read-only: :func:`inspect_run` and :func:`list_runs` fold a run's stream (its
chain checked on the way; schema problems are listed, not raised) and append nothing,
not even a gate decision or a snapshot. Only a :class:`~ares_events.agents.journal.Journal`
opened to run the loop passes the version gate and appends.

Operating appends exactly one audited event per action, with ``{"by", "reason", "via"}``
in its metadata (the metadata is part of the hash chain): :func:`resolve_step` settles
an in-doubt tool call (``tool.returned`` with the result, or ``tool.call.not_done``),
:func:`resume_run` answers an interrupt (``run.resumed``), :func:`cancel_run` stops a run
for good (``run.cancelled``). Each names the version it read, so an action on a run that
changed meanwhile fails with ``ConcurrencyError`` instead of acting on a stale view.

It may import the core, integrity, projections and this package's leaf modules.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ares_events.agents.journal_errors import RunNotFound, RunNotRunnable
from ares_events.core.catalog import new_event
from ares_events.core.ports import StorePort, port_for
from ares_events.core.recorder import Capability
from ares_events.core.sansio import Call, Steps, arun, run
from ares_events.errors import ChainIntegrityError, ConfigError
from ares_events.integrity.findings import Finding
from ares_events.projections.builtin import RunStateProjection
from ares_events.projections.recovery import recover_steps

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

__all__ = [
    "LIST_STATUSES",
    "AttemptInfo",
    "RunInfo",
    "StepInfo",
    "ainspect_run",
    "audit",
    "cancel_run",
    "inspect_run",
    "list_runs",
    "resolve_step",
    "resume_run",
    "tokens_of",
]

IN_DOUBT: Final = "in_doubt_tool_call"
FINISHED: Final = frozenset({"completed", "failed", "cancelled"})
LIST_STATUSES: Final = (
    "running",
    "paused",
    "in_doubt",
    "completed",
    "failed",
    "cancelled",
    "refused",
)
"""What ``list_runs(status=...)`` filters on. ``paused`` includes runs paused on an in-doubt
tool call; ``in_doubt`` matches those and any run with a tool call that has no outcome."""
MODULE: Final = "journal"
_UNSET: Final = object()


def tokens_of(usage: Mapping[str, Any] | None) -> int:
    """Tokens of a usage mapping: ``total_tokens`` when present, else the sum of its
    integer values."""
    if not usage:
        return 0
    if "total_tokens" in usage and isinstance(usage["total_tokens"], int):
        return int(usage["total_tokens"])
    return sum(v for v in usage.values() if isinstance(v, int) and not isinstance(v, bool))


def audit(by: str, reason: str | None, via: str) -> dict[str, Any]:
    """The metadata of an operator's event: who, why, through what."""
    meta: dict[str, Any] = {"by": by, "via": via}
    if reason:
        meta["reason"] = reason
    return meta


# -- views ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One attempt of a call step."""

    n: int
    status: str
    """``requested`` (no outcome yet), ``failed``, ``answered``, ``returned``, ``error``,
    ``not_done``."""
    version: int | None
    at: str | None
    error_type: str | None = None
    error: str | None = None
    reconciled: bool = False
    resolved_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One step of a run: what it asked and what it got."""

    step: int
    kind: str
    """``model``, ``tool``, ``patch`` or ``interrupt``."""
    status: str
    attempts: tuple[AttemptInfo, ...] = ()
    name: str | None = None
    """The tool's name (tool steps)."""
    key: str | None = None
    """The idempotency key ``run_id:step`` (tool steps)."""
    request: Any = None
    """``{"messages", "params"}`` (model) or ``{"args"}`` (tool) as recorded (redacted),
    or None when not loaded; ``messages`` is absent when only its hash is recorded."""
    request_hash: str | None = None
    outcome: Any = None
    """The completion (model) or result (tool)."""
    error: str | None = None
    usage: dict[str, Any] | None = None
    tokens: int = 0
    detail: str | None = None
    """The patched key or the interrupt's reason."""

    @property
    def in_doubt(self) -> bool:
        """A tool call whose last attempt has no outcome."""
        return self.kind == "tool" and self.status == "requested"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = {k: getattr(self, k) for k in self.__slots__}
        d["attempts"] = [a.to_dict() for a in self.attempts]
        d["in_doubt"] = self.in_doubt
        return d


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run as its log tells it (see :func:`inspect_run`)."""

    run_id: str
    status: str
    """``running``, ``paused``, ``in_doubt`` (paused on an in-doubt tool call),
    ``completed``, ``failed``, ``cancelled`` or ``refused``."""
    version: int
    code_revision: str | None
    prompt_hash: str | None
    steps: tuple[StepInfo, ...]
    usage: dict[str, Any]
    tokens: int
    interrupt: dict[str, Any] | None
    error: str | None
    result: Any
    resumes: int
    cancelled: dict[str, Any] | None
    updated_at: str | None
    findings: list[Finding] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict, repr=False)
    """The raw fold (``RunStateProjection``) these views were made from."""

    @property
    def in_doubt(self) -> tuple[StepInfo, ...]:
        """Tool calls with no outcome (in doubt once their process is gone)."""
        return tuple(s for s in self.steps if s.in_doubt)

    @property
    def ok(self) -> bool:
        """The chain checked clean and every event matched its schema."""
        return not self.findings and not self.skipped

    def step(self, n: int) -> StepInfo | None:
        """Step ``n``, or None."""
        return next((s for s in self.steps if s.step == n), None)

    def matches(self, status: str | None) -> bool:
        """Whether this run is listed under ``status`` (None: every run)."""
        if status is None or status == self.status:
            return True
        if status == "paused":
            return self.status == "in_doubt"
        return status == "in_doubt" and bool(self.in_doubt)

    def to_dict(self, *, steps: bool = True) -> dict[str, Any]:
        """JSON-ready form."""
        d: dict[str, Any] = {
            "run_id": self.run_id,
            "status": self.status,
            "version": self.version,
            "code_revision": self.code_revision,
            "prompt_hash": self.prompt_hash,
            "step_count": len(self.steps),
            "tokens": self.tokens,
            "usage": self.usage,
            "in_doubt": [s.to_dict() for s in self.in_doubt],
            "interrupt": self.interrupt,
            "error": self.error,
            "result": self.result,
            "resumes": self.resumes,
            "cancelled": self.cancelled,
            "updated_at": self.updated_at,
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "skipped": self.skipped,
        }
        if steps:
            d["steps"] = [s.to_dict() for s in self.steps]
        return d


def _status(state: Mapping[str, Any]) -> str:
    status = str(state["status"])
    interrupt = state.get("interrupt") or {}
    if (
        status == "paused"
        and interrupt.get("reason") == IN_DOUBT
        and interrupt.get("key") in state["dangling"]
    ):
        return "in_doubt"
    return status


def _attempts(rec: Mapping[str, Any]) -> tuple[AttemptInfo, ...]:
    return tuple(
        AttemptInfo(
            n=int(a.get("n", i + 1)),
            status=str(a.get("status")),
            version=a.get("version"),
            at=a.get("at"),
            error_type=a.get("error_type"),
            error=a.get("error"),
            reconciled=bool(a.get("reconciled", False)),
            resolved_by=a.get("resolved_by"),
        )
        for i, a in enumerate(rec.get("attempts") or [])
    )


def _steps(state: Mapping[str, Any], requests: Mapping[int, Any]) -> tuple[StepInfo, ...]:
    out = []
    for k in sorted(state["steps"], key=int):
        rec = state["steps"][k]
        n = int(k)
        kind = str(rec.get("kind"))
        attempts = _attempts(rec)
        failed = [a for a in attempts if a.status == "failed"]
        last_error = (
            f"{failed[-1].error_type}: {failed[-1].error}"
            if failed and rec.get("status") in ("failed", "abandoned")
            else None
        )
        req = requests.get(rec["version"]) if isinstance(rec.get("version"), int) else None
        if kind == "model":
            usage = state["usage_by_step"].get(k)
            out.append(
                StepInfo(
                    n,
                    kind,
                    str(rec.get("status")),
                    attempts,
                    request=req,
                    request_hash=rec.get("hash"),
                    outcome=state["completions"].get(k),
                    error=last_error,
                    usage=usage,
                    tokens=tokens_of(usage),
                )
            )
        elif kind == "tool":
            call = state["tool_calls"].get(rec.get("key"), {})
            error = call.get("error") if rec.get("status") == "error" else last_error
            out.append(
                StepInfo(
                    n,
                    kind,
                    str(rec.get("status")),
                    attempts,
                    name=rec.get("name"),
                    key=rec.get("key"),
                    request=req,
                    request_hash=rec.get("hash"),
                    outcome=call.get("result"),
                    error=error,
                )
            )
        else:
            detail = rec.get("key") if kind == "patch" else rec.get("reason")
            out.append(StepInfo(n, kind, str(rec.get("status")), detail=detail))
    return tuple(out)


def _requests(run_id: str, state: Mapping[str, Any]) -> Steps[dict[int, Any]]:
    wanted = {
        rec["version"]
        for rec in state["steps"].values()
        if rec.get("kind") in ("model", "tool") and isinstance(rec.get("version"), int)
    }
    found: dict[int, Any] = {}
    if not wanted:
        return found
    handle = yield Call("open_read", run_id, min(wanted), max(wanted), None)
    try:
        while chunk := (yield Call("next_chunk", handle)):
            for e in chunk:
                if e.version not in wanted:
                    continue
                if e.payload_erased:
                    found[e.version] = {"erased": True}
                    continue
                payload = e.payload if isinstance(e.payload, dict) else {}
                if e.type == "model.call.requested":
                    req = {"params": payload.get("params")}
                    if "messages" in payload:
                        req["messages"] = payload["messages"]
                    found[e.version] = req
                elif e.type == "tool.call.requested":
                    found[e.version] = {"args": payload.get("args")}
    except GeneratorExit:  # the driver itself was closed: no more calls
        raise
    except BaseException:
        yield Call("close_read", handle)
        raise
    yield Call("close_read", handle)
    return found


def _is_run(run_id: str) -> Steps[str | None]:
    """None when ``run_id`` is a run, else why not."""
    first = yield Call("read_at", run_id, 1)
    if first is None:
        return "no such run"
    if first.type != "run.started":
        return f"stream is not a run (its first event is {first.type!r}, not 'run.started')"
    return None


def inspect_run(store: EventStore, run_id: str, *, requests: bool = True) -> RunInfo:
    """The run ``run_id`` as its log tells it, appending nothing.

    Args:
        store: the event store.
        run_id: the run (its stream id).
        requests: also load what each model and tool step asked (one more read of the
            stream; payloads spilled to blobs are fetched).

    Raises:
        RunNotFound: no stream ``run_id``, or a stream that is not a run.
        StoreUnavailable: the store cannot be reached.
    """
    return run(_inspect_steps(store, run_id, requests), StorePort(store))


async def ainspect_run(store: AsyncEventStore, run_id: str, *, requests: bool = True) -> RunInfo:
    """The asyncio twin of :func:`inspect_run` (the same steps).

    Raises:
        RunNotFound: no stream ``run_id``, or a stream that is not a run.
        StoreUnavailable: the store cannot be reached.
    """
    return await arun(_inspect_steps(store, run_id, requests), port_for(store))


def _inspect_steps(store: Any, run_id: str, requests: bool) -> Steps[RunInfo]:
    why = yield from _is_run(run_id)
    if why is not None:
        raise RunNotFound(run_id, why)
    snaps = store.snapshots if Capability.SNAPSHOTS in store.capabilities else None
    rep = yield from recover_steps(
        store.chain_key,
        run_id,
        RunStateProjection(),
        snapshots=snaps,
        max_replay=2**62,
        tolerant=True,
    )
    state = rep.state
    last = yield Call("read_at", run_id, rep.version)
    loaded = (yield from _requests(run_id, state)) if requests else {}
    return RunInfo(
        run_id=run_id,
        status=_status(state),
        version=rep.version,
        code_revision=state["code_revision"],
        prompt_hash=state["prompt_hash"],
        steps=_steps(state, loaded),
        usage=dict(state["usage"]),
        tokens=sum(tokens_of(u) for u in state["usage_by_step"].values()),
        interrupt=state["interrupt"],
        error=state["error"],
        result=state.get("result"),
        resumes=int(state["resumes"]),
        cancelled=state.get("cancelled"),
        updated_at=last.at if last is not None else None,
        findings=list(rep.findings),
        skipped=[f"version {s.version}: {s.type}: {s.reason}" for s in rep.skipped],
        state=state,
    )


def iter_run_ids(store: EventStore) -> Iterator[str]:
    """Streams of ``store`` that are runs (their first event is ``run.started``)."""
    # Listed first: reading each stream while the listing is open would nest cursors.
    port = StorePort(store)
    for stream_id in [sid for sid, _ in store.streams()]:
        if run(_is_run(stream_id), port) is None:
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
    runs = (inspect_run(store, run_id, requests=False) for run_id in iter_run_ids(store))
    return [r for r in runs if r.matches(status)]


# -- operating ------------------------------------------------------------------------------


def _checked(store: EventStore, run_id: str) -> RunInfo:
    info = inspect_run(store, run_id, requests=False)
    if info.findings:
        raise ChainIntegrityError(run_id, info.findings)
    return info


def _append(
    store: EventStore, info: RunInfo, type_: str, payload: dict[str, Any], meta: dict[str, Any]
) -> RunInfo:
    store.append(
        info.run_id,
        [new_event(type_, MODULE, payload, metadata=meta)],
        expected_version=info.version,
    )
    return inspect_run(store, info.run_id, requests=False)


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
) -> RunInfo:
    """Settle the in-doubt tool call at ``step``: it landed with ``result`` (recorded as
    its outcome, returned to the loop on replay), or it did ``not_done`` (the next attempt
    runs it again with the same idempotency key). Appends one event.

    Raises:
        RunNotFound: no such run.
        ConfigError: not exactly one of ``result`` / ``not_done``; no step ``step``; not a
            tool step; not in doubt.
        ChainIntegrityError: the run's chain has findings (never act on a damaged log).
        ConcurrencyError: the run changed since it was read.
    """
    if (result is _UNSET) == (not not_done):
        raise ConfigError("give exactly one of a result or not_done")
    info = _checked(store, run_id)
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
    meta = audit(by, reason, via)
    if not_done:
        return _append(
            store, info, "tool.call.not_done", {"idempotency_key": s.key, "by": by}, meta
        )
    payload = {"idempotency_key": s.key, "result": result, "resolved_by": by}
    return _append(store, info, "tool.returned", payload, meta)


def resume_run(
    store: EventStore, run_id: str, *, by: str, reason: str | None = None, via: str = "library"
) -> RunInfo:
    """Answer the run's interrupt: append ``run.resumed``; the next incarnation of the
    loop goes on past it.

    Raises:
        RunNotFound: no such run.
        RunNotRunnable: the run is not paused, or is paused on an in-doubt tool call that
            has not been resolved yet.
        ChainIntegrityError: the run's chain has findings.
        ConcurrencyError: the run changed since it was read.
    """
    info = _checked(store, run_id)
    if info.status not in ("paused", "in_doubt"):
        raise RunNotRunnable(run_id, info.status, "only a paused run resumes")
    if info.status == "in_doubt" and info.in_doubt:
        s = info.in_doubt[0]
        raise RunNotRunnable(
            run_id,
            info.status,
            f"tool call {s.name!r} at step {s.step} is still in doubt; resolve it first "
            f"(ares-events runs resolve {run_id} {s.step} --result JSON | --not-done)",
        )
    return _append(store, info, "run.resumed", {"by": by}, audit(by, reason, via))


def cancel_run(
    store: EventStore, run_id: str, *, by: str, reason: str | None = None, via: str = "library"
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
    info = _checked(store, run_id)
    if info.status in FINISHED:
        raise RunNotRunnable(run_id, info.status, "a finished run cannot be cancelled")
    payload: dict[str, Any] = {"by": by}
    if reason:
        payload["reason"] = reason
    return _append(store, info, "run.cancelled", payload, audit(by, reason, via))
