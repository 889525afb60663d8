"""Built-in projections: agent state, recovery state, genealogy and run state."""

from __future__ import annotations

from typing import Any, ClassVar

from ares_events.core.catalog import (
    AgentDead,
    AgentResurrected,
    AgentStarted,
    AgentStopped,
    FailoverCompleted,
    FailoverTriggered,
    ModelCallAttemptFailed,
    ModelCallRequested,
    ModelResponded,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunGate,
    RunInterrupted,
    RunResumed,
    RunStarted,
    SessionCreated,
    StatePatched,
    StepAbandoned,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    ToolCallAttemptFailed,
    ToolCallNotDone,
    ToolCallRequested,
    ToolReturned,
    parse,
)
from ares_events.core.events import RecordedEvent, parse_at
from ares_events.errors import ConfigError

__all__ = [
    "AgentStateProjection",
    "GenealogyProjection",
    "RecoveryStateProjection",
    "RunStateProjection",
]


def _remove(items: list[str], value: str) -> None:
    if value in items:
        items.remove(value)


def _session_and_tasks(state: dict[str, Any], p: Any) -> None:
    """Fold what both agent projections keep alike: the session and the pending tasks."""
    if isinstance(p, SessionCreated):
        state["session_id"] = p.session_id
    elif isinstance(p, TaskCreated) and p.task_id not in state["pending_tasks"]:
        state["pending_tasks"].append(p.task_id)
    elif isinstance(p, TaskCompleted | TaskFailed):
        _remove(state["pending_tasks"], p.task_id)


class AgentStateProjection:
    """Session, status, pending/done/failed tasks, instance, restarts, last event."""

    name: ClassVar[str] = "agent_state"
    version: ClassVar[int] = 1

    def initial(self) -> dict[str, Any]:
        """Empty agent."""
        return {
            "session_id": None,
            "status": "new",
            "pending_tasks": [],
            "done_tasks": [],
            "failed_tasks": [],
            "instance_id": None,
            "restarts": 0,
            "deaths": 0,
            "last_event": None,
            "version": 0,
        }

    def apply(self, state: dict[str, Any], event: RecordedEvent) -> dict[str, Any]:
        """Fold one event."""
        p = parse(event)
        _session_and_tasks(state, p)
        if isinstance(p, TaskCompleted):
            state["done_tasks"].append(p.task_id)
        elif isinstance(p, TaskFailed):
            state["failed_tasks"].append(p.task_id)
        elif isinstance(p, AgentStarted):
            state.update(status="running", instance_id=p.instance_id)
        elif isinstance(p, AgentStopped):
            state["status"] = "stopped"
        elif isinstance(p, AgentDead):
            state["status"] = "dead"
            state["deaths"] += 1
        elif isinstance(p, AgentResurrected):
            state.update(status="running", instance_id=p.instance_id)
            state["restarts"] += 1
        elif isinstance(p, FailoverCompleted):
            state["instance_id"] = p.instance_id
        state["last_event"] = {"type": event.type, "version": event.version, "at": event.at}
        state["version"] = event.version
        return state


class RecoveryStateProjection:
    """What a supervisor needs to resurrect an agent: session, pending tasks, last
    version, last failover."""

    name: ClassVar[str] = "recovery_state"
    version: ClassVar[int] = 1

    def initial(self) -> dict[str, Any]:
        """Empty recovery state."""
        return {"session_id": None, "pending_tasks": [], "last_version": 0, "last_failover": None}

    def apply(self, state: dict[str, Any], event: RecordedEvent) -> dict[str, Any]:
        """Fold one event."""
        p = parse(event)
        _session_and_tasks(state, p)
        if isinstance(p, FailoverTriggered):
            fo = {"reason": p.reason, "at": event.at, "version": event.version, "completed": False}
            state["last_failover"] = fo
        elif isinstance(p, FailoverCompleted):
            v = event.version
            lf = state["last_failover"] or {"reason": None, "at": event.at, "version": v}
            state["last_failover"] = dict(lf, completed=True, instance_id=p.instance_id)
        state["last_version"] = event.version
        return state


class GenealogyProjection:
    """Every death (cause, time) and resurrection (new instance), plus a flapping flag:
    ``flap_deaths`` deaths within ``flap_window_s`` seconds (of event time).

    Its name is ``genealogy`` with the default rule, ``genealogy.flap-<deaths>-<window>s``
    with another: the flag is folded under the rule, so a snapshot or read model made under
    one rule is never resumed under another."""

    version: ClassVar[int] = 1

    def __init__(self, flap_deaths: int = 5, flap_window_s: float = 30.0) -> None:
        if flap_deaths < 1 or flap_window_s <= 0:
            raise ConfigError("flap_deaths must be >= 1 and flap_window_s > 0")
        self.flap_deaths = flap_deaths
        self.flap_window_s = flap_window_s
        rule = (flap_deaths, float(flap_window_s))
        self.name = "genealogy" if rule == (5, 30.0) else f"genealogy.flap-{rule[0]}-{rule[1]:g}s"

    def initial(self) -> dict[str, Any]:
        """No deaths yet."""
        return {
            "deaths": [],
            "resurrections": [],
            "stops": [],
            "flapping": False,
            "max_deaths_in_window": 0,
            "flap_rule": [self.flap_deaths, self.flap_window_s],
        }

    def apply(self, state: dict[str, Any], event: RecordedEvent) -> dict[str, Any]:
        """Fold one event."""
        p = parse(event)
        at, v = event.at, event.version
        if isinstance(p, AgentDead):
            state["deaths"].append({"cause": p.cause, "at": at, "version": v})
            now, window = parse_at(at), self.flap_window_s
            # every death's "at" went through parse_at when it was folded
            n = sum((now - parse_at(d["at"])).total_seconds() <= window for d in state["deaths"])
            state["max_deaths_in_window"] = max(state["max_deaths_in_window"], n)
            state["flapping"] = n >= self.flap_deaths
        elif isinstance(p, AgentResurrected):
            state["resurrections"].append(
                {"instance_id": p.instance_id, "attempt": p.attempt, "at": at, "version": v}
            )
        elif isinstance(p, AgentStopped):
            state["stops"].append({"reason": p.reason, "at": at, "version": v})
        elif isinstance(p, AgentStarted):
            state["flapping"] = False if not state["deaths"] else state["flapping"]
        return state


class RunStateProjection:
    """A durable run: status, steps with their attempts, recorded completions by step,
    token usage, tool calls by idempotency key, in-doubt calls, interrupt, patched state.

    ``steps`` maps each step number (a string) to its record: ``kind`` (``model``,
    ``tool``, ``patch`` or ``interrupt``), ``status`` and, for calls, ``attempts`` (each
    ``{"n", "status", "version", "at"}`` plus ``error_type``/``error``/``error_class`` when
    it failed) and the recorded request's ``hash`` and ``version`` (the request itself stays
    in its event: the state never grows with prompts). A call step's status is
    ``requested`` (an attempt has no outcome), ``failed`` (its last attempt raised; the loop
    may retry it), ``not_done`` (a human found the in-doubt attempt did not land),
    ``abandoned`` (the loop went on after a failure), ``answered`` / ``returned``, or
    ``error`` (a recorded error outcome).

    ``resumes`` counts ``run.resumed`` events (interrupts answered); ``recoveries`` counts
    ``run.gate`` events that let the run go on (incarnations that picked it up from its log).
    :func:`ares_events.agents.run_info.run_counts` is where a run's numbers are defined.
    """

    name: ClassVar[str] = "run_state"
    version: ClassVar[int] = 3  # 3: recoveries

    def initial(self) -> dict[str, Any]:
        """A run that has not started."""
        return {
            "status": "new",
            "step": 0,
            "code_revision": None,
            "prompt_hash": None,
            "requested": {},
            "completions": {},
            "usage": {},
            "tool_calls": {},
            "dangling": [],
            "interrupt": None,
            "state": {},
            "error": None,
            "result": None,
            "gate": None,
            "resumes": 0,
            "recoveries": 0,
            "cancelled": None,
            "steps": {},
            "usage_by_step": {},
        }

    def apply(self, state: dict[str, Any], event: RecordedEvent) -> dict[str, Any]:
        """Fold one event."""
        p = parse(event)
        fold = _RUN_FOLDS.get(type(p))  # None for an event of another kind
        if fold is not None:
            fold(state, p, event)
        return state


def _bump(state: dict[str, Any], step: int | None) -> None:
    if step is not None:
        state["step"] = max(state["step"], step)


def _attempt(event: RecordedEvent, n: int) -> dict[str, Any]:
    return {"n": n, "status": "requested", "version": event.version, "at": event.at}


def _request_attempt(
    state: dict[str, Any], step: int, kind: str, attempt: int, event: RecordedEvent, **fields: Any
) -> None:
    """Record attempt ``attempt`` of the call at ``step``, making the step on the first."""
    rec: dict[str, Any] | None = state["steps"].get(str(step))
    if rec is None or rec.get("kind") != kind:
        state["steps"][str(step)] = rec = {
            "kind": kind,
            "status": "requested",
            "attempts": [],
            "hash": None,
            "version": event.version,
        }
    rec.update(fields, status="requested")
    rec["attempts"].append(_attempt(event, attempt))


def _settle(rec: dict[str, Any] | None, status: str) -> dict[str, Any] | None:
    """Give the step ``rec`` (if any) and its last attempt ``status``; that attempt."""
    if rec is None:
        return None
    rec["status"] = status
    attempts = rec.get("attempts") or []
    if attempts:
        attempts[-1]["status"] = status
    return attempts[-1] if attempts else None


def _fail_attempt(rec: dict[str, Any], attempt: int, p: Any) -> None:
    for a in rec["attempts"]:
        if a["n"] == attempt:
            a.update(
                status="failed", error_type=p.error_type, error=p.error, error_class=p.error_class
            )
    rec["status"] = "failed"


def _run_started(state: dict[str, Any], p: RunStarted, event: RecordedEvent) -> None:
    state.update(status="running", code_revision=p.code_revision, prompt_hash=p.prompt_hash)


def _model_requested(state: dict[str, Any], p: ModelCallRequested, event: RecordedEvent) -> None:
    state["requested"][str(p.step)] = p.messages_hash
    _bump(state, p.step)
    _request_attempt(state, p.step, "model", p.attempt, event, hash=p.messages_hash)


def _model_failed(state: dict[str, Any], p: ModelCallAttemptFailed, event: RecordedEvent) -> None:
    rec = state["steps"].get(str(p.step))
    if rec is not None and rec.get("kind") == "model":
        _fail_attempt(rec, p.attempt, p)


def _model_responded(state: dict[str, Any], p: ModelResponded, event: RecordedEvent) -> None:
    key = str(p.step)
    state["completions"][key] = p.completion
    state["usage_by_step"][key] = p.usage
    _bump(state, p.step)
    usage = state["usage"]
    for k, v in p.usage.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            usage[k] = usage.get(k, 0) + v
    rec = state["steps"].get(key)
    if rec is not None and rec.get("kind") == "model":
        _settle(rec, "answered")


def _new_tool_call(event: RecordedEvent) -> dict[str, Any]:
    return {
        "name": None,
        "args": None,
        "status": "requested",
        "result": None,
        "error": None,
        "version": event.version,
    }


def _tool_requested(state: dict[str, Any], p: ToolCallRequested, event: RecordedEvent) -> None:
    key = p.idempotency_key
    call = state["tool_calls"].get(key)
    if call is None or p.attempt <= 1:
        call = _new_tool_call(event)
        state["tool_calls"][key] = call
    call.update(name=p.name, args=p.args, status="requested", result=None, error=None)
    if key not in state["dangling"]:
        state["dangling"].append(key)
    step = p.step if p.step is not None else _step_of(key)
    _bump(state, step)
    if step is None:
        return
    call["step"] = step
    _request_attempt(state, step, "tool", p.attempt, event, name=p.name, key=key, hash=p.args_hash)


def _tool_step(state: dict[str, Any], key: str) -> dict[str, Any] | None:
    step = state["tool_calls"].get(key, {}).get("step")
    if step is None:
        step = _step_of(key)
    rec = state["steps"].get(str(step)) if step is not None else None
    return rec if rec is not None and rec.get("kind") == "tool" else None


def _settle_tool(state: dict[str, Any], key: str, status: str) -> dict[str, Any] | None:
    """Give the call ``key``, its step and the step's last attempt ``status``; that attempt."""
    call = state["tool_calls"].get(key)
    if call is not None:
        call["status"] = status
    _remove(state["dangling"], key)
    return _settle(_tool_step(state, key), status)


def _tool_failed(state: dict[str, Any], p: ToolCallAttemptFailed, event: RecordedEvent) -> None:
    call = state["tool_calls"].get(p.idempotency_key)
    if call is not None:
        call.update(status="failed", error=f"{p.error_type}: {p.error}")
    _remove(state["dangling"], p.idempotency_key)
    rec = _tool_step(state, p.idempotency_key)
    if rec is not None:
        _fail_attempt(rec, p.attempt, p)


def _tool_not_done(state: dict[str, Any], p: ToolCallNotDone, event: RecordedEvent) -> None:
    last = _settle_tool(state, p.idempotency_key, "not_done")
    if last is not None:
        last["by"] = p.by


def _tool_returned(state: dict[str, Any], p: ToolReturned, event: RecordedEvent) -> None:
    call = state["tool_calls"].setdefault(p.idempotency_key, _new_tool_call(event))
    call["result"], call["error"] = p.result, p.error
    last = _settle_tool(state, p.idempotency_key, "error" if p.error is not None else "returned")
    if last is not None:
        extra = getattr(p, "__pydantic_extra__", None) or {}
        last.update({f: extra[f] for f in ("reconciled", "resolved_by") if f in extra})


def _abandoned(state: dict[str, Any], p: StepAbandoned, event: RecordedEvent) -> None:
    rec = state["steps"].get(str(p.step))
    if rec is not None:
        rec["status"] = "abandoned"
        key = rec.get("key")
        if key and key in state["tool_calls"]:
            state["tool_calls"][key]["status"] = "abandoned"
            _remove(state["dangling"], key)


def _patched(state: dict[str, Any], p: StatePatched, event: RecordedEvent) -> None:
    state["state"][p.key] = p.value
    step = event.payload.get("step") if isinstance(event.payload, dict) else None
    if type(step) is int:
        state["steps"][str(step)] = {"kind": "patch", "status": "done", "key": p.key}
        _bump(state, step)


def _interrupted(state: dict[str, Any], p: RunInterrupted, event: RecordedEvent) -> None:
    state["status"] = "paused"
    interrupt: dict[str, Any] = {"reason": p.reason, "at": event.at, "version": event.version}
    payload = event.payload if isinstance(event.payload, dict) else {}
    interrupt.update({k: payload[k] for k in ("step", "key") if k in payload})
    state["interrupt"] = interrupt
    step = payload.get("step")
    # An in-doubt interrupt names the tool call's key and step; it is not a step itself.
    if type(step) is int and "key" not in payload:
        rec = {"kind": "interrupt", "status": "paused", "reason": p.reason, "resumed": False}
        state["steps"][str(step)] = rec
        _bump(state, step)


def _resumed(state: dict[str, Any], p: RunResumed, event: RecordedEvent) -> None:
    interrupt = state["interrupt"]
    if interrupt is not None and "key" not in interrupt:
        rec = state["steps"].get(str(interrupt.get("step")))
        if rec is not None and rec.get("kind") == "interrupt":
            rec.update(status="resumed", resumed=True)
    if state["status"] == "paused":
        state["status"] = "running"
    state["interrupt"] = None
    state["resumes"] += 1


def _gate(state: dict[str, Any], p: RunGate, event: RecordedEvent) -> None:
    state["gate"] = {
        "decision": p.decision,
        "code_revision": p.code_revision,
        "prompt_hash": p.prompt_hash,
        "version": event.version,
    }
    if p.decision == "refuse":
        state["status"] = "refused"
        return
    state["recoveries"] += 1
    if p.decision == "migrate":
        state.update(code_revision=p.code_revision, prompt_hash=p.prompt_hash)
    if state["status"] == "refused":
        # A later gate let the run go on (e.g. the old code was redeployed).
        state["status"] = "paused" if state["interrupt"] else "running"


def _completed(state: dict[str, Any], p: RunCompleted, event: RecordedEvent) -> None:
    state["status"] = "completed"
    state["result"] = event.payload.get("result") if isinstance(event.payload, dict) else None


def _failed(state: dict[str, Any], p: RunFailed, event: RecordedEvent) -> None:
    state.update(status="failed", error=p.error)


def _cancelled(state: dict[str, Any], p: RunCancelled, event: RecordedEvent) -> None:
    state["status"] = "cancelled"
    payload = event.payload if isinstance(event.payload, dict) else {}
    state["cancelled"] = {"by": p.by, "reason": payload.get("reason"), "at": event.at}


_RUN_FOLDS: dict[type[Any], Any] = {
    RunStarted: _run_started,
    ModelCallRequested: _model_requested,
    ModelCallAttemptFailed: _model_failed,
    ModelResponded: _model_responded,
    ToolCallRequested: _tool_requested,
    ToolCallAttemptFailed: _tool_failed,
    ToolCallNotDone: _tool_not_done,
    ToolReturned: _tool_returned,
    StepAbandoned: _abandoned,
    StatePatched: _patched,
    RunInterrupted: _interrupted,
    RunResumed: _resumed,
    RunGate: _gate,
    RunCompleted: _completed,
    RunFailed: _failed,
    RunCancelled: _cancelled,
}


def _step_of(key: str) -> int | None:
    _, _, tail = key.rpartition(":")
    return int(tail) if tail.isdigit() else None
