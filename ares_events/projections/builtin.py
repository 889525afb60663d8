"""Built-in projections: agent state, recovery state, genealogy and run state.

Each state is a plain JSON object so it can be snapshotted and stored as a read-model row.
Events outside the catalog are ignored; catalog events are validated (strict folds raise
:class:`~ares_events.core.catalog.EventSchemaError`, tolerant folds skip and list them).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from ares_events.core.catalog import (
    AgentDead,
    AgentResurrected,
    AgentStarted,
    AgentStopped,
    FailoverCompleted,
    FailoverTriggered,
    ModelCallRequested,
    ModelResponded,
    RunFailed,
    RunGate,
    RunInterrupted,
    RunResumed,
    RunStarted,
    SessionCreated,
    StatePatched,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
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
        if p is not None:
            if isinstance(p, SessionCreated):
                state["session_id"] = p.session_id
            elif isinstance(p, TaskCreated):
                if p.task_id not in state["pending_tasks"]:
                    state["pending_tasks"].append(p.task_id)
            elif isinstance(p, TaskCompleted):
                _remove(state["pending_tasks"], p.task_id)
                state["done_tasks"].append(p.task_id)
            elif isinstance(p, TaskFailed):
                _remove(state["pending_tasks"], p.task_id)
                state["failed_tasks"].append(p.task_id)
            elif isinstance(p, AgentStarted):
                state["status"] = "running"
                state["instance_id"] = p.instance_id
            elif isinstance(p, AgentStopped):
                state["status"] = "stopped"
            elif isinstance(p, AgentDead):
                state["status"] = "dead"
                state["deaths"] += 1
            elif isinstance(p, AgentResurrected):
                state["status"] = "running"
                state["instance_id"] = p.instance_id
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
        if isinstance(p, SessionCreated):
            state["session_id"] = p.session_id
        elif isinstance(p, TaskCreated):
            if p.task_id not in state["pending_tasks"]:
                state["pending_tasks"].append(p.task_id)
        elif isinstance(p, TaskCompleted | TaskFailed):
            _remove(state["pending_tasks"], p.task_id)
        elif isinstance(p, FailoverTriggered):
            state["last_failover"] = {
                "reason": p.reason,
                "at": event.at,
                "version": event.version,
                "completed": False,
            }
        elif isinstance(p, FailoverCompleted):
            lf = state["last_failover"] or {
                "reason": None,
                "at": event.at,
                "version": event.version,
            }
            lf = dict(lf, completed=True, instance_id=p.instance_id)
            state["last_failover"] = lf
        state["last_version"] = event.version
        return state


class GenealogyProjection:
    """Every death (cause, time) and resurrection (new instance), plus a flapping flag:
    ``flap_deaths`` deaths within ``flap_window_s`` seconds (of event time)."""

    name: ClassVar[str] = "genealogy"
    version: ClassVar[int] = 1

    def __init__(self, flap_deaths: int = 5, flap_window_s: float = 30.0) -> None:
        if flap_deaths < 1 or flap_window_s <= 0:
            raise ConfigError("flap_deaths must be >= 1 and flap_window_s > 0")
        self.flap_deaths = flap_deaths
        self.flap_window_s = flap_window_s

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
        if isinstance(p, AgentDead):
            state["deaths"].append({"cause": p.cause, "at": event.at, "version": event.version})
            now = parse_at(event.at)
            recent = [
                d
                for d in state["deaths"]
                if (now - datetime.fromisoformat(d["at"].replace("Z", "+00:00"))).total_seconds()
                <= self.flap_window_s
            ]
            n = len(recent)
            state["max_deaths_in_window"] = max(state["max_deaths_in_window"], n)
            state["flapping"] = n >= self.flap_deaths
        elif isinstance(p, AgentResurrected):
            state["resurrections"].append(
                {
                    "instance_id": p.instance_id,
                    "attempt": p.attempt,
                    "at": event.at,
                    "version": event.version,
                }
            )
        elif isinstance(p, AgentStopped):
            state["stops"].append({"reason": p.reason, "at": event.at, "version": event.version})
        elif isinstance(p, AgentStarted):
            state["flapping"] = False if not state["deaths"] else state["flapping"]
        return state


class RunStateProjection:
    """A durable run: step, status, recorded completions by step, token usage totals,
    tool calls by idempotency key, dangling calls, pending interrupt, patched state."""

    name: ClassVar[str] = "run_state"
    version: ClassVar[int] = 1

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
            "gate": None,
            "resumes": 0,
            "steps": {},
            "usage_by_step": {},
        }

    def apply(self, state: dict[str, Any], event: RecordedEvent) -> dict[str, Any]:
        """Fold one event."""
        p = parse(event)
        if p is None:
            return state
        op_step = event.payload.get("step") if isinstance(event.payload, dict) else None
        if type(op_step) is int and event.type in _STEP_OPS:
            state["steps"][str(op_step)] = event.type
        if isinstance(p, RunStarted):
            state["status"] = "running"
            state["code_revision"] = p.code_revision
            state["prompt_hash"] = p.prompt_hash
        elif isinstance(p, ModelCallRequested):
            state["requested"][str(p.step)] = p.messages_hash
            state["step"] = max(state["step"], p.step)
        elif isinstance(p, ModelResponded):
            state["completions"][str(p.step)] = p.completion
            state["usage_by_step"][str(p.step)] = p.usage
            state["step"] = max(state["step"], p.step)
            usage = state["usage"]
            for k, v in p.usage.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    usage[k] = usage.get(k, 0) + v
        elif isinstance(p, ToolCallRequested):
            key = p.idempotency_key
            state["tool_calls"][key] = {
                "name": p.name,
                "args": p.args,
                "status": "requested",
                "result": None,
                "error": None,
                "version": event.version,
            }
            if key not in state["dangling"]:
                state["dangling"].append(key)
            step = _step_of(key)
            if step is not None:
                state["step"] = max(state["step"], step)
        elif isinstance(p, ToolReturned):
            key = p.idempotency_key
            call = state["tool_calls"].setdefault(
                key,
                {
                    "name": None,
                    "args": None,
                    "status": "requested",
                    "result": None,
                    "error": None,
                    "version": event.version,
                },
            )
            call["status"] = "error" if p.error is not None else "returned"
            call["result"] = p.result
            call["error"] = p.error
            _remove(state["dangling"], key)
        elif isinstance(p, StatePatched):
            state["state"][p.key] = p.value
        elif isinstance(p, RunInterrupted):
            state["status"] = "paused"
            state["interrupt"] = {"reason": p.reason, "at": event.at, "version": event.version}
        elif isinstance(p, RunResumed):
            state["status"] = "running"
            state["interrupt"] = None
            state["resumes"] += 1
        elif isinstance(p, RunGate):
            state["gate"] = {
                "decision": p.decision,
                "code_revision": p.code_revision,
                "prompt_hash": p.prompt_hash,
                "version": event.version,
            }
            if p.decision == "migrate":
                state["code_revision"] = p.code_revision
                state["prompt_hash"] = p.prompt_hash
            elif p.decision == "refuse":
                state["status"] = "refused"
            if p.decision != "refuse" and state["status"] == "refused":
                # A later gate let the run go on (e.g. the old code was redeployed).
                state["status"] = "paused" if state["interrupt"] else "running"
        elif event.type == "run.completed":
            state["status"] = "completed"
        elif isinstance(p, RunFailed):
            state["status"] = "failed"
            state["error"] = p.error
        return state


_STEP_OPS = frozenset({"state.patched", "run.interrupted"})


def _step_of(key: str) -> int | None:
    _, _, tail = key.rpartition(":")
    return int(tail) if tail.isdigit() else None
