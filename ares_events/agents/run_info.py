"""What a run is, as its log tells it: :class:`RunInfo` with its steps and attempts, the
run's numbers (:func:`run_counts`, their one definition), and the small rules both faces of
:mod:`.runs_async` share.

It may import the core and this package's leaf modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ares_events.integrity.findings import Finding

if TYPE_CHECKING:
    from ares_events.core.events import RecordedEvent

__all__ = [
    "FINISHED",
    "IN_DOUBT",
    "LIST_STATUSES",
    "MODULE",
    "AttemptInfo",
    "RunCounts",
    "RunInfo",
    "StepInfo",
    "audit",
    "listed_under",
    "request_of",
    "run_counts",
    "run_status",
    "steps_of",
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


@dataclass(frozen=True, slots=True)
class RunCounts:
    """A run's numbers, each defined once, here, from its fold: ``runs list/show``, the
    console, ``Journal.inspect`` and the demo all show these (docs/guide-journal.md)."""

    steps: int
    """Numbered steps the run recorded: each model call, tool call, state patch and
    interrupt is one step (a retry is not a new step)."""
    attempts: int
    """Attempts of its model and tool calls: one per recorded request
    (``model.call.requested`` / ``tool.call.requested``), first tries and retries."""
    retries: int
    """Attempts after the first of their step (``attempts`` minus the call steps)."""
    tokens: int
    """Tokens of its recorded model answers, each answered step once (:func:`tokens_of`)."""
    recoveries: int
    """Times a new incarnation picked the run up from its log to go on: its ``run.gate``
    events that did not refuse (opening a finished run is not one)."""
    resumes: int
    """Interrupts answered: its ``run.resumed`` events."""

    def to_dict(self) -> dict[str, int]:
        """JSON-ready form (the keys are the field names)."""
        return {k: getattr(self, k) for k in self.__slots__}


def run_counts(state: Mapping[str, Any]) -> RunCounts:
    """The numbers of a run from its fold (a ``RunStateProjection`` state)."""
    calls = [r for r in state["steps"].values() if r.get("kind") in ("model", "tool")]
    attempts = sum(len(r.get("attempts") or ()) for r in calls)
    return RunCounts(
        steps=len(state["steps"]),
        attempts=attempts,
        retries=sum(max(len(r.get("attempts") or ()) - 1, 0) for r in calls),
        tokens=sum(tokens_of(u) for u in state["usage_by_step"].values()),
        recoveries=int(state["recoveries"]),
        resumes=int(state["resumes"]),
    )


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
    counts: RunCounts
    """The run's numbers (:func:`run_counts`)."""
    interrupt: dict[str, Any] | None
    error: str | None
    result: Any
    cancelled: dict[str, Any] | None
    updated_at: str | None
    findings: list[Finding] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict, repr=False)
    """The raw fold (``RunStateProjection``) these views were made from."""

    @property
    def tokens(self) -> int:
        """``counts.tokens``."""
        return self.counts.tokens

    @property
    def resumes(self) -> int:
        """``counts.resumes``."""
        return self.counts.resumes

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
        return listed_under(status, self.status, bool(self.in_doubt))

    def to_dict(self, *, steps: bool = True) -> dict[str, Any]:
        """JSON-ready form. ``counts`` holds the run's numbers; ``step_count``, ``tokens``
        and ``resumes`` repeat three of them (kept for scripts written before ``counts``)."""
        d: dict[str, Any] = {
            "run_id": self.run_id,
            "status": self.status,
            "version": self.version,
            "code_revision": self.code_revision,
            "prompt_hash": self.prompt_hash,
            "counts": self.counts.to_dict(),
            "step_count": self.counts.steps,
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


def listed_under(status: str | None, run_status: str, in_doubt: bool) -> bool:
    """Whether a run of ``run_status`` (with tool calls ``in_doubt`` or not) is listed
    under ``status`` (None: every run; see :data:`LIST_STATUSES`)."""
    if status is None or status == run_status:
        return True
    if status == "paused":
        return run_status == "in_doubt"
    return status == "in_doubt" and in_doubt


def request_of(e: RecordedEvent) -> dict[str, Any] | None:
    """What the request event ``e`` of a model or tool step asked, as recorded; None for
    another event."""
    if e.payload_erased:
        return {"erased": True}
    payload = e.payload if isinstance(e.payload, dict) else {}
    if e.type == "model.call.requested":
        req = {"params": payload.get("params")}
        if "messages" in payload:  # absent: only its hash is recorded
            req["messages"] = payload["messages"]
        return req
    if e.type == "tool.call.requested":
        return {"args": payload.get("args")}
    return None


def run_status(state: Mapping[str, Any]) -> str:
    status = str(state["status"])
    interrupt = state.get("interrupt") or {}
    if (
        status == "paused"
        and interrupt.get("reason") == IN_DOUBT
        and interrupt.get("key") in state["dangling"]
    ):
        return "in_doubt"
    return status


def steps_of(state: Mapping[str, Any], requests: Mapping[int, Any]) -> tuple[StepInfo, ...]:
    out = []
    for k in sorted(state["steps"], key=int):
        rec = state["steps"][k]
        n = int(k)
        kind = str(rec.get("kind"))
        attempts = tuple(
            AttemptInfo(
                int(a.get("n", i + 1)),
                str(a.get("status")),
                reconciled=bool(a.get("reconciled", False)),
                **{k: a.get(k) for k in ("version", "at", "error_type", "error", "resolved_by")},
            )
            for i, a in enumerate(rec.get("attempts") or [])
        )
        failed = [a for a in attempts if a.status == "failed"]
        last_error = None
        if failed and rec.get("status") in ("failed", "abandoned"):
            last_error = f"{failed[-1].error_type}: {failed[-1].error}"
        status = str(rec.get("status"))
        extra: dict[str, Any]
        if kind == "model":
            usage = state["usage_by_step"].get(k)
            extra = {"outcome": state["completions"].get(k), "error": last_error, "usage": usage}
            extra["tokens"] = tokens_of(usage)
        elif kind == "tool":
            call = state["tool_calls"].get(rec.get("key"), {})
            extra = {"name": rec.get("name"), "key": rec.get("key"), "outcome": call.get("result")}
            extra["error"] = call.get("error") if status == "error" else last_error
        else:
            detail = rec.get("key") if kind == "patch" else rec.get("reason")
            out.append(StepInfo(n, kind, status, detail=detail))
            continue
        req = requests.get(rec["version"]) if isinstance(rec.get("version"), int) else None
        out.append(
            StepInfo(n, kind, status, attempts, request=req, request_hash=rec.get("hash"), **extra)
        )
    return tuple(out)
