"""The run journal's errors (public; importable from ``ares_events``; docs/errors.md draws
their tree).

It may import the format layer only.
"""

from __future__ import annotations

from typing import Any

from ares_events.errors import ApprovalRefused, AresError

__all__ = [
    "ApprovalRequired",
    "InDoubtToolCall",
    "ModelCallFailed",
    "ReentrantCall",
    "ReplayDivergence",
    "RunNotFound",
    "RunNotRunnable",
    "RunRefused",
    "ToolCallFailed",
    "journal_error_in",
]


class RunRefused(AresError):
    """The version gate refused to resume a run under changed code or prompt."""

    def __init__(self, run_id: str, recorded: tuple[str, str], current: tuple[str, str]) -> None:
        self.run_id = run_id
        self.recorded = recorded
        self.current = current
        super().__init__(
            f"run {run_id!r} started under code {recorded[0]!r} / prompt "
            f"{recorded[1][:12]!r}; refusing to resume under code "
            f"{current[0]!r} / prompt {current[1][:12]!r}"
        )


class RunNotRunnable(AresError):
    """The run is paused, completed, failed, cancelled or refused; it takes no new steps
    (or an operator action does not apply to its state)."""

    def __init__(self, run_id: str, status: str, detail: str = "") -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(f"run {run_id!r} is {status}" + (f": {detail}" if detail else ""))


class InDoubtToolCall(RunNotRunnable):
    """A tool call was requested but has no result and cannot be reconciled safely."""

    def __init__(self, run_id: str, key: str, name: str, step: int | None = None) -> None:
        self.key = key
        self.name = name
        self.step = step
        where = f"step {step}, " if step is not None else ""
        super().__init__(
            run_id,
            "paused",
            f"tool call {name!r} ({where}key {key}) is in doubt; a human must resolve it "
            f"(ares-events runs resolve {run_id} {step if step is not None else 'STEP'} "
            "--result JSON | --not-done, or Journal.resolve_tool_call())",
        )


class ApprovalRequired(RunNotRunnable):
    """A call that needs a signed approval reached its step: the run is paused until an
    approver signs one (``ares-events runs resume RUN --key FILE``)."""

    def __init__(self, run_id: str, step: int, name: str) -> None:
        self.step = step
        self.name = name
        super().__init__(
            run_id,
            "paused",
            f"tool call {name!r} at step {step} needs a signed approval "
            f"(ares-events runs resume {run_id} --key APPROVER_KEY)",
        )


class RunNotFound(AresError, LookupError):
    """No run has this id (no stream, or a stream that is not a run)."""

    def __init__(self, run_id: str, detail: str = "no such run") -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r}: {detail}")

    def __str__(self) -> str:  # LookupError's KeyError-like quoting does not apply
        return str(self.args[0]) if self.args else ""


class ReentrantCall(AresError, RuntimeError):
    """A journal was asked for a step while one of its own tool, model or reconcile
    callables ran (a journal is not re-entrant); nothing was written for that call.

    Attributes:
        run_id: the run.
        what: the nested call (``model_call``, ``tool_call 'search'``, ``patch``...).
        inside, step: the callable that was running (``tool 'create'``...) and its step.
    """

    def __init__(self, run_id: str, what: str, inside: str, step: int) -> None:
        self.run_id = run_id
        self.what = what
        self.inside = inside
        self.step = step
        super().__init__(
            f"run {run_id!r}: {what} was called while the {inside} of step {step} runs; "
            "a journal is not re-entrant and its steps are one sequence (a callable must "
            "not use its own journal, and threads or tasks must not share one: make "
            "parallel tool calls one step after another); nothing was written for it"
        )


class ReplayDivergence(AresError):
    """The replayed loop asked for something other than what the log recorded.

    Attributes:
        run_id, step: where.
        path: the first differing place (``messages[1].content``, ``args.title``,
            ``kind``, ``tool``), or None.
        recorded, current: the two values there, as short JSON texts (hashes when only
            hashes are recorded), or None.
        hashes_only: True when the log holds only a hash of the request, so the
            difference itself cannot be shown.
    """

    def __init__(
        self,
        run_id: str,
        step: int,
        detail: str,
        *,
        path: str | None = None,
        recorded: str | None = None,
        current: str | None = None,
        hashes_only: bool = False,
    ) -> None:
        self.run_id = run_id
        self.step = step
        self.path = path
        self.recorded = recorded
        self.current = current
        self.hashes_only = hashes_only
        super().__init__(f"run {run_id!r} step {step}: {detail}")


class ModelCallFailed(AresError):
    """A model call's recorded failure, replayed when the exception's own class is not
    loaded in this process (live, the original is re-raised).

    Attributes:
        run_id, step, attempt: where.
        error_type: the original exception's class name (``RateLimited``).
        error: its recorded message.
        replayed: True (raised from the log, not by a live call).
    """

    def __init__(self, run_id: str, step: int, attempt: int, error_type: str, error: str) -> None:
        self.run_id = run_id
        self.step = step
        self.attempt = attempt
        self.error_type = error_type
        self.error = error
        self.replayed = True
        super().__init__(
            f"model call at step {step} (attempt {attempt}) of run {run_id!r} failed: "
            f"{error_type}: {error}"
        )


class ToolCallFailed(AresError):
    """A tool call's recorded failure replayed: an error outcome (a human's
    ``resolve_tool_call(key, error=...)``, or an older log's), or a failed attempt whose
    exception class is not loaded in this process (live, the original is re-raised).

    Attributes:
        run_id, key: the run and the call's idempotency key.
        error: the recorded error (``"TypeName: message"`` or what a human wrote).
        step, attempt, error_type: where and what, when known.
    """

    def __init__(
        self,
        run_id: str,
        key: str,
        error: Any,
        *,
        step: int | None = None,
        attempt: int | None = None,
        error_type: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.key = key
        self.error = error
        self.step = step
        self.attempt = attempt
        self.error_type = error_type
        self.replayed = True
        super().__init__(f"tool call {key} of run {run_id!r} failed: {error}")


def journal_error_in(exc: BaseException) -> BaseException | None:
    """The journal's own error (a run refused, not runnable, in doubt, a replay that
    diverged, a re-entrant call) that ``exc`` is or was raised from (through ``__cause__``
    and ``__context__``), else None: what an adapter re-raises when a framework wrapped it."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(
            cur, RunNotRunnable | ReplayDivergence | RunRefused | ReentrantCall | ApprovalRefused
        ):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


for _name in __all__[:-1]:  # every error (not journal_error_in) is ares_events.<Name>
    globals()[_name].__module__ = "ares_events"
del _name
