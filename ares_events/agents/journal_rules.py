"""The run journal's values and policies, shared by both faces: gates, stats, the reply
type, and how an exception is recorded.

It may import this package's leaf modules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ares_events.agents.journal_errors import ModelCallFailed, ReplayDivergence, ToolCallFailed
from ares_events.agents.recording import (
    MAX_ERROR_CHARS,
    MISSING,
    class_path,
    describe,
    first_difference,
    rebuild_failure,
    shorten,
)
from ares_events.errors import InvalidEvent

__all__ = [
    "OPEN",
    "SAME_STEP",
    "GatePolicy",
    "JournalStats",
    "ModelReply",
    "diverged",
    "failure",
    "kind_divergence",
    "migrating_gate",
    "recorded_failure",
    "reply",
    "strict_gate",
]

# A call at the loop's current step with one of these statuses and the same request is
# another attempt of that step (live: a retry; on replay: the next recorded failure).
SAME_STEP: Final = frozenset({"failed", "not_done", "abandoned", "requested"})
OPEN: Final = frozenset({"failed", "not_done"})


@dataclass(frozen=True, slots=True)
class ModelReply:
    """What a model ``call`` returns: the completion and its token usage."""

    completion: Any
    usage: Mapping[str, Any]


GatePolicy = Callable[[tuple[str, str], tuple[str, str]], str]


def strict_gate(recorded: tuple[str, str], current: tuple[str, str]) -> str:
    """Resume only under the same code revision and prompt hash; otherwise refuse."""
    return "resume" if recorded == current else "refuse"


def migrating_gate(recorded: tuple[str, str], current: tuple[str, str]) -> str:
    """Resume when unchanged; refuse a changed prompt; migrate a changed code revision."""
    if recorded == current:
        return "resume"
    return "refuse" if recorded[1] != current[1] else "migrate"


@dataclass(slots=True)
class JournalStats:
    """Counters of one Journal instance (one process's incarnation of a run)."""

    model_calls_made: int = 0
    model_calls_from_log: int = 0
    tokens_from_log: int = 0
    tool_calls_made: int = 0
    tool_calls_from_log: int = 0
    tool_calls_reconciled: int = 0
    model_attempts_failed: int = 0
    tool_attempts_failed: int = 0
    steps_abandoned: int = 0
    failures_from_log: int = 0
    resume_seconds: float = 0.0


def reply(value: Any) -> ModelReply:
    """What a model ``call`` returned, as a :class:`ModelReply` (its usage a new dict).

    Raises:
        InvalidEvent: the reply's usage is not a mapping (nor null, in the dict form).
    """
    usage: Any
    if isinstance(value, ModelReply):
        completion, usage, form = value.completion, value.usage, "ModelReply"
    elif isinstance(value, tuple) and len(value) == 2:
        completion, usage, form = value[0], value[1], "(completion, usage) tuple"
    elif isinstance(value, Mapping) and "completion" in value:
        # A null usage in the dict form is "not reported" (some clients send it).
        completion, usage = value["completion"], value.get("usage")
        usage, form = ({} if usage is None else usage), '{"completion", "usage"} dict'
    else:
        return ModelReply(value, {})
    if not isinstance(usage, Mapping):
        got = type(usage).__name__
        raise InvalidEvent(
            "usage", f"of the model's reply (a {form}) must be a mapping of counts, got {got}"
        )
    return ModelReply(completion, dict(usage))


def failure(exc: BaseException) -> dict[str, Any]:
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not hide the failure itself
        message = f"<unprintable {type(exc).__name__}>"
    error = shorten(message, MAX_ERROR_CHARS)
    return {"error_type": type(exc).__name__, "error": error, "error_class": class_path(exc)}


def diverged(
    run_id: str,
    step: int,
    what: str,
    recorded: Any,
    current: Any,
    path: str,
    rec: dict[str, Any],
    current_hash: str,
) -> ReplayDivergence:
    differ = f"{what} differ from the recorded call at"
    if recorded is MISSING:
        was, now = str(rec.get("hash") or "")[:16], current_hash[:16]
        detail = (
            f"{differ} this step; only hashes are recorded, so the difference cannot be "
            f"shown: recorded blake3 {was}…, now {now}…"
        )
        return ReplayDivergence(
            run_id, step, detail, path=path, recorded=was, current=now, hashes_only=True
        )
    diff = first_difference(recorded, current, path)
    if diff is None:  # equal after all: e.g. a hash of another canonical form
        return ReplayDivergence(run_id, step, f"{differ} this step", path=path)
    where, a, b = diff
    ra, cb = describe(a, b)
    detail = f"{differ} {where}: recorded {ra}, now {cb}"
    return ReplayDivergence(run_id, step, detail, path=where, recorded=ra, current=cb)


def kind_divergence(run_id: str, step: int, rec: dict[str, Any], asked: str) -> ReplayDivergence:
    kind = str(rec.get("kind"))
    recorded = f"{kind} {rec['name']!r}" if rec.get("name") else kind
    detail = f"the log recorded a {recorded} step here; the loop asked for {asked}"
    return ReplayDivergence(run_id, step, detail, path="kind", recorded=recorded, current=asked)


def recorded_failure(run_id: str, step: int, rec: dict[str, Any], here: int) -> BaseException:
    """The failure a replayed abandoned step saw at its ``here``-th call (to raise),
    with ``attempt`` set to that attempt's number where the exception takes one."""
    fails = [a for a in rec.get("attempts", []) if a.get("status") == "failed"]
    key = str(rec.get("key") or f"{run_id}:{step}")
    if not fails:
        return ToolCallFailed(run_id, key, "abandoned without a recorded failure", step=step)
    a = fails[min(here, len(fails)) - 1]
    note = (
        f"replayed from the run journal (run {run_id!r}, step {step}, attempt "
        f"{a['n']}): the call was not made again"
    )
    exc = rebuild_failure(a.get("error_class"), str(a.get("error", "")), note)
    if exc is not None:
        return exc
    if rec.get("kind") == "model":
        return ModelCallFailed(run_id, step, a["n"], a["error_type"], a["error"])
    error = f"{a['error_type']}: {a['error']}"
    return ToolCallFailed(run_id, key, error, step=step, attempt=a["n"], error_type=a["error_type"])
