"""The :class:`Journal` (see :mod:`ares_events.agents.journal` for the rules it keeps),
its gates, stats and reply type. The decisions live in :mod:`.journal_logic`, shared with
the asyncio twin in :mod:`.journal_async`; this class drives them with a blocking store.

It may import the core, stores, integrity, projections and this package's leaf modules
(:mod:`.runs`, :mod:`.recording`, :mod:`.journal_errors`, :mod:`.journal_decorators`,
:mod:`.journal_logic`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ares_events.agents import runs
from ares_events.agents.journal_decorators import reset_active, set_active, wrap_tool
from ares_events.agents.journal_logic import (
    FINISHED,
    IN_DOUBT,
    GatePolicy,
    JournalLogic,
    JournalStats,
    ModelReply,
    migrating_gate,
    strict_gate,
)
from ares_events.agents.recording import Redactor
from ares_events.core.ports import StorePort
from ares_events.core.sansio import run

if TYPE_CHECKING:
    from ares_events.agents.runs import RunInfo
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = [
    "FINISHED",
    "IN_DOUBT",
    "GatePolicy",
    "Journal",
    "JournalStats",
    "ModelReply",
    "migrating_gate",
    "strict_gate",
]


class Journal(JournalLogic):
    """Write-ahead journal of one run (see the module docstring).

    Args:
        store: the event store; the run is the stream ``run_id``.
        run_id: stable id of the run (also the idempotency-key prefix).
        code_revision: revision of the agent code; recorded by ``run.started``.
        prompt_hash: hash of the prompt/config; recorded by ``run.started``.
        gate: version-gate policy deciding ``resume``/``migrate``/``refuse`` on reopen.
        snapshot_every: snapshot the run state every K events (0 disables).
        module: ``module`` of the events the journal writes.
        redact: ``redact(value) -> value`` applied to a model call's messages and params
            and a tool call's args before they are recorded, hashed and compared (e.g.
            :func:`redact_keys`). Outcomes are recorded as returned (a replay returns them).
        record_prompts: False records only the hash of a model call's messages (params and
            tool args are still recorded, after ``redact``).

    Raises:
        RunRefused: the gate refused to resume.
        ChainIntegrityError: the run's log has integrity findings; never act on it.
        PayloadErased: an event of the run was erased: it cannot be replayed (inspect it
            with :meth:`inspect`).
        StoreUnavailable: the store cannot be reached.
    """

    def __init__(
        self,
        store: EventStore,
        run_id: str,
        *,
        code_revision: str = "unversioned",
        prompt_hash: str = "",
        gate: GatePolicy = strict_gate,
        snapshot_every: int = 100,
        module: str = "journal",
        redact: Redactor | None = None,
        record_prompts: bool = True,
    ) -> None:
        started = time.perf_counter()
        self._setup(
            store,
            run_id,
            snapshot_every=snapshot_every,
            module=module,
            redact=redact,
            record_prompts=record_prompts,
        )
        self._port = StorePort(store)
        run(self._open_steps(code_revision, prompt_hash, gate), self._port)
        self.stats.resume_seconds = time.perf_counter() - started

    # -- looking without writing ------------------------------------------------------------

    @staticmethod
    def inspect(store: EventStore, run_id: str, *, requests: bool = True) -> RunInfo:
        """The run's state, steps (with attempts, requests and outcomes), tokens, in-doubt
        calls and interrupt, read without appending anything (no gate, no snapshot).

        Raises:
            RunNotFound: no run ``run_id`` in the store.
            StoreUnavailable: the store cannot be reached.
        """
        return runs.inspect_run(store, run_id, requests=requests)

    # -- plumbing ------------------------------------------------------------------------

    def __enter__(self) -> Journal:
        self._token = set_active(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            reset_active(self._token)
            self._token = None

    # -- model calls ---------------------------------------------------------------------

    def model_call(
        self,
        messages: Any,
        params: Mapping[str, Any] | None = None,
        *,
        call: Callable[[Any, Mapping[str, Any]], Any],
    ) -> Any:
        """One model step: recorded completion on replay, else request, call, record.

        ``call(messages, params)`` returns a :class:`ModelReply`, a ``(completion,
        usage)`` tuple, a ``{"completion", "usage"}`` dict or a bare completion. When it
        raises, the failed attempt is recorded and the original exception propagates;
        calling again with the same messages retries the same step.

        Raises:
            ReplayDivergence: the messages differ from those recorded at this step.
            RunNotRunnable: the run is paused/completed/failed and the step is new.
            ModelCallFailed: replaying an abandoned step whose exception class is not
                loaded in this process (else an instance of that class is raised).
        """
        step, done, value = run(self._model_begin(messages, params), self._port)
        if done:
            return value
        try:
            raw = call(messages, dict(params or {}))
        except Exception as exc:
            run(self._model_failed(step, exc), self._port)
            raise
        return run(self._model_end(step, raw), self._port)

    # -- tool calls ----------------------------------------------------------------------

    def tool_call(
        self,
        name: str,
        args: Any,
        *,
        call: Callable[[Any, str], Any],
        reconcile: Callable[[str], tuple[bool, Any]] | None = None,
        idempotent: bool = False,
    ) -> Any:
        """One tool step with the idempotency key ``run_id:step_n``.

        ``call(args, key)`` performs the side effect, passing ``key`` downstream. When it
        raises, the failed attempt is recorded and the original exception propagates;
        calling again with the same name and args retries the step with the same key.
        ``reconcile(key) -> (landed, result)`` asks the downstream system whether an
        in-doubt call landed.

        Raises:
            InDoubtToolCall: in doubt, no reconciler and not idempotent; run interrupted.
            ReplayDivergence: another tool, or other args, were recorded at this step.
            RunNotRunnable: the run cannot take new steps.
            ToolCallFailed: the step's recorded outcome is an error, or an abandoned
                step's failure is replayed and its exception class is not loaded here.
        """
        key, done, value = run(self._tool_begin(name, args, reconcile, idempotent), self._port)
        if done:
            return value
        try:
            result = call(args, key)
        except Exception as exc:
            run(self._tool_failed(key, exc), self._port)
            raise
        return run(self._tool_end(key, result), self._port)

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        idempotent: bool = False,
        reconcile: Callable[[str], tuple[bool, Any]] | None = None,
    ) -> Any:
        """Decorator: each call of ``fn`` is a :meth:`tool_call` of this journal (its bound
        arguments are the args; a parameter ``idempotency_key`` receives the key)."""

        def decorate(f: Callable[..., Any]) -> Any:
            return wrap_tool(lambda: self, f, name=name, idempotent=idempotent, reconcile=reconcile)

        return decorate(fn) if fn is not None else decorate

    def step(self, fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
        """Decorator: ``fn``'s result is recorded once and replayed after (a tool that is
        safe to run again when in doubt)."""
        return self.tool(fn, name=name, idempotent=True)

    def resolve_tool_call(
        self,
        key: str,
        *,
        result: Any = None,
        error: Any = None,
        by: str = "operator",
        reason: str | None = None,
    ) -> None:
        """Record a human's verdict on an in-doubt call (the outcome to use).

        Raises:
            ConfigError: the call is not in doubt.
        """
        run(self._resolve_steps(key, result, error, by, reason), self._port)

    # -- state, interrupts, end ----------------------------------------------------------

    def patch(self, key: str, value: Any) -> None:
        """Record a state patch (skipped when replaying a recorded step).

        Raises:
            ReplayDivergence: the log recorded another kind of step here.
            RunNotRunnable: the run cannot take new steps.
        """
        run(self._patch_steps(key, value), self._port)

    def interrupt(self, reason: str) -> bool:
        """Pause the run (e.g. awaiting approval). Returns True when the run is now paused
        and the process should exit; False when replaying an interrupt already resumed.

        Raises:
            ReplayDivergence: the log recorded another kind of step here.
            RunNotRunnable: the run cannot take new steps.
        """
        return run(self._interrupt_steps(reason), self._port)

    def resume(self, *, by: str, reason: str | None = None) -> None:
        """Resume a paused run (from any process, any time later).

        Raises:
            RunNotRunnable: the run is not paused.
        """
        run(self._resume_steps(by, reason), self._port)

    def complete(self, result: Any = None) -> None:
        """Mark the run completed (idempotent).

        Raises:
            RunNotRunnable: the run is paused, failed, cancelled or refused.
        """
        run(self._complete_steps(result), self._port)

    def fail(self, error: str) -> None:
        """Mark the run failed (idempotent)."""
        run(self._fail_steps(error), self._port)
