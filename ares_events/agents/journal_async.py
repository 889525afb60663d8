"""The durable run journal: write-ahead model and tool calls for agent loops (over 800
lines because the journal is one state machine per run, read best in one class).

:class:`AsyncJournal`, one face written, the other generated (``journal.py`` is the import
path of both); docs/guide-journal.md tells the whole story.

It may import the core, stores, integrity, projections and this package's leaf modules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ares_events.agents.approvals import APPROVAL_REASON, Pending, approver_keys, check_approval
from ares_events.agents.journal_decorators import ACTIVE, journaled_step, journaled_tool, wrap_tool
from ares_events.agents.journal_errors import (
    ApprovalRequired,
    InDoubtToolCall,
    ModelCallFailed,
    ReentrantCall,
    ReplayDivergence,
    RunNotFound,
    RunNotRunnable,
    RunRefused,
    ToolCallFailed,
)
from ares_events.agents.journal_rules import (
    OPEN,
    SAME_STEP,
    GatePolicy,
    JournalStats,
    ModelReply,
    diverged,
    failure,
    kind_divergence,
    migrating_gate,
    recorded_failure,
    reply,
    strict_gate,
)
from ares_events.agents.journal_telemetry import RunTrace, call_span, start_run
from ares_events.agents.recording import MISSING, Redactor, hash_of, redact_keys
from ares_events.agents.run_info import FINISHED, IN_DOUBT, RunCounts, audit, run_counts, tokens_of
from ares_events.agents.runs_async import _why_not_a_run, inspect_run, ledger_of
from ares_events.core.backend import Capability
from ares_events.core.catalog import new_event
from ares_events.core.events import NO_STREAM
from ares_events.core.faces import ASYNC, blocking
from ares_events.core.iterators_async import afirst, maybe_await
from ares_events.errors import (
    ApprovalWrongCall,
    ChainIntegrityError,
    ConfigError,
    InvalidEvent,
    PayloadErased,
    StoreError,
)
from ares_events.projections.base import ERASED_REASON
from ares_events.projections.builtin import RunStateProjection
from ares_events.projections.recovery_async import AsyncSnapshotter, arecover

if ASYNC:
    from ares_events.stores.threaded import async_face
else:
    # One import path for both faces: ``from ares_events.agents.journal import AsyncJournal``.
    from ares_events.agents.journal_async import AsyncJournal  # as is

if TYPE_CHECKING:
    from collections.abc import Sequence
    from contextvars import Token

    from ares_events.core.store import EventStore  # as is
    from ares_events.core.store_async import AsyncEventStore
    from ares_events.integrity.notes import VerifierKey

logger = logging.getLogger(__name__)

__all__ = [
    "IN_DOUBT",
    "ApprovalRequired",
    "AsyncJournal",
    "InDoubtToolCall",
    "JournalStats",
    "ModelCallFailed",
    "ModelReply",
    "ReentrantCall",
    "ReplayDivergence",
    "RunNotFound",
    "RunNotRunnable",
    "RunRefused",
    "ToolCallFailed",
    "journaled_step",
    "journaled_tool",
    "migrating_gate",
    "redact_keys",
    "strict_gate",
]


class AsyncJournal:
    """Write-ahead journal of one run.

    Open the asyncio face with ``await AsyncJournal.open(store, run_id, ...)``; the
    blocking face's constructor opens the run itself.

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
            :func:`redact_keys`); outcomes are recorded as returned.
        record_prompts: False records only the hash of a model call's messages (params and
            tool args are still recorded, after ``redact``).
        approvers: the verifier keys whose signed approval lets a ``needs_approval`` tool
            call run (:mod:`~ares_events.agents.approvals`), as ``VerifierKey`` or its text
            (a ``.vkey`` file's); never read from the store.

    A journal is not re-entrant: a tool, model or reconcile callable must not use the
    journal that called it (:class:`ReentrantCall`).

    Raises:
        RunRefused: the gate refused to resume.
        RunNotFound: the stream ``run_id`` exists but is not a run (its first event is
            not ``run.started``); nothing was written to it.
        ChainIntegrityError: the run's log has integrity findings; never act on it.
        PayloadErased: an event of the run was erased: it cannot be replayed.
        StoreUnavailable: the store cannot be reached.
    """

    _token: Token[Any] | None = None
    _run_trace: RunTrace | None = None
    _trace_token: Any = None
    _inside: tuple[str, int] | None = None
    """The callable of this journal running now (what, step), else None."""
    _snapshot_skipped = -1
    """The version whose snapshot could not be taken (-1: none)."""

    def __init__(
        self,
        store: AsyncEventStore | EventStore,
        run_id: str,
        *,
        code_revision: str = "unversioned",
        prompt_hash: str = "",
        gate: GatePolicy = strict_gate,
        snapshot_every: int = 100,
        module: str = "journal",
        redact: Redactor | None = None,
        record_prompts: bool = True,
        approvers: Sequence[VerifierKey | str] = (),
    ) -> None:
        if ASYNC:
            store = async_face(store)
        else:
            store = blocking(store, "ae.Journal", "ae.AsyncJournal")
        self.store: Any = store
        self.run_id = run_id
        self.module = module
        self.redact = redact
        self.record_prompts = record_prompts
        self.projection = RunStateProjection()
        self.stats = JournalStats()
        self._snapshots = store.snapshots if Capability.SNAPSHOTS in store.capabilities else None
        self.state: dict[str, Any] = self.projection.initial()
        self.version = 0
        self.recovered_from = "empty"
        self.resumed = False
        self.position = 0
        """The step the loop is at (the last step it touched; 0 before the first)."""
        self.attempt = 0
        """Attempt number of the last call at the current step (1 for a first attempt)."""
        self.replaying = False
        """True when the last call was answered (or failed) from the log, not made."""
        self._here = 0
        self._snapshotter = (
            AsyncSnapshotter(
                store, [self.projection], every=snapshot_every, snapshots=self._snapshots
            )
            if self._snapshots is not None and snapshot_every > 0
            else None
        )
        self._snapshot_every = snapshot_every
        self.approvers = approver_keys(approvers)
        self._opening = (code_revision, prompt_hash, gate)
        if ASYNC:
            pass  # open() recovers the run and passes the gate
        else:
            self._open_run()

    @classmethod
    async def open(
        cls,
        store: AsyncEventStore | EventStore,
        run_id: str,
        *,
        code_revision: str = "unversioned",
        prompt_hash: str = "",
        gate: GatePolicy = strict_gate,
        snapshot_every: int = 100,
        module: str = "journal",
        redact: Redactor | None = None,
        record_prompts: bool = True,
        approvers: Sequence[VerifierKey | str] = (),
    ) -> AsyncJournal:
        """Open the run: recover it, then start it or pass the version gate.

        Raises:
            RunRefused: the gate refused to resume.
            RunNotFound: the stream exists but is not a run; nothing was written to it.
            ChainIntegrityError: the run's log has integrity findings.
            PayloadErased: an event of the run was erased: it cannot be replayed.
            StoreUnavailable: the store cannot be reached.
        """
        j = cls(
            store,
            run_id,
            code_revision=code_revision,
            prompt_hash=prompt_hash,
            gate=gate,
            snapshot_every=snapshot_every,
            module=module,
            redact=redact,
            record_prompts=record_prompts,
            approvers=approvers,
        )
        if ASYNC:
            await j._open_run()
        return j

    async def _open_run(self) -> None:
        started = time.perf_counter()
        run = self._run_trace = start_run(self.run_id)
        token = run.attach() if run is not None else None
        try:
            await self._open(*self._opening)
            if run is not None:
                origin = None
                if self.resumed:  # the trace of the run's first incarnation, to link to
                    opening = await afirst(self.store.read(self.run_id, 1, 1, 1))
                    origin = opening.metadata if opening is not None else None
                run.opened(self, origin)
        except BaseException as exc:
            if run is not None:
                run.end(self.status, exc)
            raise
        finally:
            if run is not None:
                run.detach(token)
        self.stats.resume_seconds = time.perf_counter() - started

    # ``Journal.inspect(store, run_id)``: the run read without appending anything.
    inspect = staticmethod(inspect_run)

    async def __aenter__(self) -> AsyncJournal:
        self._token = ACTIVE.set(self)
        if self._run_trace is not None:  # the run's span is the parent of what runs inside
            self._trace_token = self._run_trace.attach()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._token is not None:
            ACTIVE.reset(self._token)
            self._token = None
        run = self._run_trace
        if run is not None:
            run.detach(self._trace_token)
            self._trace_token = None
            err = exc[1] if len(exc) > 1 and isinstance(exc[1], BaseException) else None
            run.end(self.status, err)

    async def model_call(
        self,
        messages: Any,
        params: Mapping[str, Any] | None = None,
        *,
        call: Callable[[Any, Mapping[str, Any]], Any | Awaitable[Any]],
    ) -> Any:
        """One model step: recorded completion on replay, else request, call, record.

        ``call(messages, params)`` returns a :class:`ModelReply`, a ``(completion,
        usage)`` tuple, a ``{"completion", "usage"}`` dict or a bare completion. When it
        raises, or returns a reply that cannot be recorded (:class:`InvalidEvent`), the
        failed attempt is recorded and the exception propagates; calling again with the
        same messages retries the same step.

        Raises:
            InvalidEvent: the messages or params are not JSON (nothing was written), or
                the reply cannot be recorded (not JSON, a usage that is not a mapping);
                then the attempt is recorded as failed.
            ReentrantCall: called from inside a callable of this journal.
            ReplayDivergence: the messages differ from those recorded at this step.
            RunNotRunnable: the run is paused/completed/failed and the step is new.
            ModelCallFailed: replaying an abandoned step whose exception class is not
                loaded in this process (else an instance of that class is raised).
        """
        self._not_reentrant("model_call")
        if params is not None and not isinstance(params, Mapping):
            # Checked before anything is appended (nor a step taken).
            got = type(params).__name__
            raise InvalidEvent("params", f"of a model call must be a mapping, got {got}")
        with call_span(self, "chat", params=params) as span:
            step, done, value = await self._model_begin(messages, params)
            span.begun(self, done)
            if span.capturing and self.record_prompts:
                span.content("gen_ai.input.messages", self._record(messages))
            if done:
                span.content("gen_ai.output.messages", value)
                return value
            try:
                raw = await self._calling("model call", step, call, messages, dict(params or {}))
                answer = reply(raw)
            except Exception as exc:
                await self._model_failed(step, exc)
                raise
            completion, usage = answer.completion, dict(answer.usage)
            responded = {"step": step, "completion": completion, "usage": usage}
            try:
                await self._append("model.responded", responded)
            except InvalidEvent as exc:
                # The reply cannot be stored (not JSON, too large) and nothing was written:
                # a failed attempt, so a re-run does not take it for a call in flight.
                await self._model_failed(step, exc)
                raise
            self.stats.model_calls_made += 1
            span.usage(self.state["usage_by_step"].get(str(step)))
            span.content("gen_ai.output.messages", completion)
            return completion

    async def tool_call(
        self,
        name: str,
        args: Any,
        *,
        call: Callable[[Any, str], Any | Awaitable[Any]],
        reconcile: Callable[[str], Any] | None = None,
        idempotent: bool = False,
        needs_approval: bool = False,
    ) -> Any:
        """One tool step with the idempotency key ``run_id:step_n``.

        ``call(args, key)`` performs the side effect, passing ``key`` downstream. When it
        raises, the failed attempt is recorded and the original exception propagates;
        calling again with the same name and args retries the step with the same key.
        ``reconcile(key) -> (landed, result)`` asks the downstream system whether an
        in-doubt call, or a failed attempt whose answer was lost, landed; the tool is
        called again only when it did not.

        ``needs_approval``: the run pauses (:class:`ApprovalRequired`) until an approval
        of this very call, signed by a key in ``approvers``, is presented (``runs resume
        RUN --key FILE``); its nonce is consumed with the request.

        Raises:
            ReentrantCall: called from inside a callable of this journal.
            ApprovalRequired: the call needs a signed approval; the run is now paused.
            ApprovalRefused: the presented approval is forged, expired, replayed, reused
                or for another call (a subclass says which); nothing ran or was written.
            InDoubtToolCall: in doubt, no reconciler and not idempotent; run interrupted.
            ReplayDivergence: another tool, or other args, were recorded at this step.
            RunNotRunnable: the run cannot take new steps.
            ToolCallFailed: the step's recorded outcome is an error, or an abandoned
                step's failure is replayed and its exception class is not loaded here.
        """
        self._not_reentrant(f"tool_call {name!r}")
        with call_span(self, "execute_tool", tool=name) as span:
            try:
                key, done, value = await self._tool_begin(
                    name, args, reconcile, idempotent, needs_approval
                )
            except InDoubtToolCall as exc:
                if self._run_trace is not None:
                    self._run_trace.event("ares_events.tool.in_doubt", {"gen_ai.tool.name": name})
                    self._run_trace.end(self.status, exc)
                raise
            step = self.position
            span.begun(self, done, key)
            if span.capturing:
                span.content("gen_ai.tool.call.arguments", self._record(args))
            if done:
                span.content("gen_ai.tool.call.result", value)
                return value
            try:
                result = await self._calling(f"tool {name!r}", step, call, args, key)
            except Exception as exc:
                self.stats.tool_attempts_failed += 1
                failed = {"step": step, "attempt": self.attempt, **failure(exc)}
                await self._append("tool.call.failed", {"idempotency_key": key, **failed})
                raise
            span.content("gen_ai.tool.call.result", result)
            self.stats.tool_calls_made += 1
            await self._append("tool.returned", {"idempotency_key": key, "result": result})
            return result

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        idempotent: bool = False,
        reconcile: Callable[[str], Any] | None = None,
    ) -> Any:
        """Decorator: each call of ``fn`` is a :meth:`tool_call` of this journal (its bound
        arguments are the args; a parameter ``idempotency_key`` receives the key)."""
        return wrap_tool(lambda: self, fn, name=name, idempotent=idempotent, reconcile=reconcile)

    def step(self, fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
        """Decorator: ``fn``'s result is recorded once and replayed after (a tool that is
        safe to run again when in doubt)."""
        return self.tool(fn, name=name, idempotent=True)

    async def resolve_tool_call(
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
            RunNotRunnable: the run is finished (completed, failed or cancelled): its log
                takes no more steps.
            ReentrantCall: called from inside a callable of this journal.
        """
        self._not_reentrant("resolve_tool_call")
        if self.state["status"] in FINISHED:
            raise RunNotRunnable(self.run_id, self.state["status"], "a finished run")
        tc = self.state["tool_calls"].get(key)
        if tc is None or tc["status"] != "requested":
            raise ConfigError(f"tool call {key} is not in doubt")
        payload: dict[str, Any] = {"idempotency_key": key, "resolved_by": by}
        payload["error" if error is not None else "result"] = error if error is not None else result
        await self._append("tool.returned", payload, metadata=audit(by, reason, "library"))

    async def patch(self, key: str, value: Any) -> None:
        """Record a state patch (skipped when replaying a recorded step).

        Raises:
            ReplayDivergence: the log recorded another kind of step here.
            RunNotRunnable: the run cannot take new steps.
            ReentrantCall: called from inside a callable of this journal.
        """
        self._not_reentrant("patch")
        step, rec = self._position("patch", lambda rec: False, "a state patch")
        if rec is not None:
            self.replaying = True
            return
        await self._new_step()
        await self._append("state.patched", {"key": key, "value": value, "step": step})

    async def interrupt(self, reason: str) -> bool:
        """Pause the run (e.g. awaiting approval). Returns True when the run is now paused
        and the process should exit; False when replaying an interrupt already resumed.

        Raises:
            ReplayDivergence: the log recorded another kind of step here.
            RunNotRunnable: the run cannot take new steps.
            ReentrantCall: called from inside a callable of this journal.
        """
        self._not_reentrant("interrupt")
        step, rec = self._position("interrupt", lambda rec: False, f"an interrupt ({reason})")
        if rec is not None:
            self.replaying = True
            paused = not rec.get("resumed", False)
        else:
            await self._new_step()
            await self._append("run.interrupted", {"reason": reason, "step": step})
            paused = True
        if paused and self._run_trace is not None:
            self._run_trace.event(
                "ares_events.run.interrupted", {"ares_events.journal.step": self.position}
            )
            self._run_trace.end(self.status)
        return paused

    async def resume(self, *, by: str, reason: str | None = None) -> None:
        """Resume a paused run (from any process, any time later).

        Raises:
            RunNotRunnable: the run is not paused.
            ReentrantCall: called from inside a callable of this journal.
        """
        self._not_reentrant("resume")
        if self.state["status"] != "paused":
            raise RunNotRunnable(self.run_id, self.state["status"], "only a paused run resumes")
        await self._append("run.resumed", {"by": by}, metadata=audit(by, reason, "library"))

    async def complete(self, result: Any = None) -> None:
        """Mark the run completed (idempotent).

        Raises:
            RunNotRunnable: the run is paused, failed, cancelled or refused.
            ReentrantCall: called from inside a callable of this journal.
        """
        self._not_reentrant("complete")
        if self.state["status"] != "completed":
            self._require_runnable()
            await self._abandon_open(self.position)
            await self._append("run.completed", {"result": result, "step": self.position})
        if self._run_trace is not None:
            self._run_trace.end(self.status)

    async def fail(self, error: str) -> None:
        """Mark the run failed (idempotent).

        Raises:
            ReentrantCall: called from inside a callable of this journal.
        """
        self._not_reentrant("fail")
        if self.state["status"] == "running":
            await self._abandon_open(self.position)
        if self.state["status"] != "failed":
            await self._append("run.failed", {"error": error, "step": self.position})
        if self._run_trace is not None:
            self._run_trace.end(self.status)

    async def _open(self, code_revision: str, prompt_hash: str, gate: GatePolicy) -> None:
        """Recover the run, then start it or pass the version gate (both append)."""
        # Before anything is folded or written: a stream that is not a run (a
        # supervisor's, an aggregate's) must not get a run.gate nor be taken for one.
        why = await _why_not_a_run(self.store, self.run_id)
        if why is not None and why != "no such run":
            raise RunNotFound(self.run_id, why)
        rep = await arecover(
            self.store, self.run_id, self.projection, snapshots=self._snapshots, max_replay=2**62
        )
        if rep.findings:
            raise ChainIntegrityError(self.run_id, rep.findings)
        erased = [s for s in rep.skipped if s.reason == ERASED_REASON]
        if erased:
            # A step whose request or outcome was erased cannot be replayed: acting again
            # could re-pay a model call or repeat a side effect. Inspection still works.
            raise PayloadErased(self.run_id, erased[0].version)
        self.state = rep.state
        self.version = rep.version
        self.recovered_from = str(rep.source)
        self.resumed = rep.version > 0
        opening = {"code_revision": code_revision, "prompt_hash": prompt_hash}
        if not self.resumed:
            await self._append("run.started", opening, NO_STREAM, self._trace_metadata())
        elif self.state["status"] not in FINISHED:
            recorded = (self.state["code_revision"] or "", self.state["prompt_hash"] or "")
            decision = gate(recorded, (code_revision, prompt_hash))
            if decision not in ("resume", "migrate", "refuse"):
                raise ConfigError(
                    f"version gate returned {decision!r}; expected resume, migrate or refuse"
                )
            payload = {"decision": decision, **opening, "recorded_code_revision": recorded[0]}
            payload["recorded_prompt_hash"] = recorded[1]
            await self._append("run.gate", payload, metadata=self._trace_metadata())
            if decision == "refuse":
                raise RunRefused(self.run_id, recorded, (code_revision, prompt_hash))

    @property
    def status(self) -> str:
        """``running``, ``paused``, ``completed``, ``failed``, ``cancelled`` or ``refused``."""
        return str(self.state["status"])

    @property
    def counts(self) -> RunCounts:
        """The run's numbers as its log tells them so far (the same as
        ``Journal.inspect(...).counts``, ``runs show`` and the console)."""
        return run_counts(self.state)

    @property
    def patched(self) -> dict[str, Any]:
        """The run's patched state (key -> value)."""
        return dict(self.state["state"])

    async def _append(
        self,
        type_: str,
        payload: dict[str, Any],
        expected: Any = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        ev = new_event(type_, self.module, payload, metadata=metadata)
        res = await self.store.append(
            self.run_id, [ev], expected_version=self.version if expected is None else expected
        )
        # Fold the stored event itself so the state is exactly what a recovery would see.
        e = await afirst(self.store.read(self.run_id, from_version=res.version, limit=1))
        if e is not None:
            self.state = self.projection.apply(self.state, e)
        self.version = res.version
        every = self._snapshot_every
        if self._snapshotter is not None and res.version // every > self._snapshot_skipped // every:
            try:
                await self._snapshotter.after_append(self.run_id, res.version)
            except (InvalidEvent, StoreError) as exc:
                # The event is committed: its append must not surface as a failure. A
                # snapshot is only an optimisation (recovery folds from the log); skip
                # it, and do not try again before the next one is due.
                self._snapshot_skipped = res.version
                logger.warning(
                    "run %r: snapshot at version %d skipped: %s: %s",
                    self.run_id,
                    res.version,
                    type(exc).__name__,
                    exc,
                )

    def _trace_metadata(self) -> dict[str, Any] | None:
        """The run span's trace context, stored with the events that open an incarnation."""
        return self._run_trace.metadata() if self._run_trace is not None else None

    def _require_runnable(self) -> None:
        st = self.state["status"]
        if st != "running":
            detail = ""
            if st == "paused" and self.state["interrupt"]:
                detail = f"interrupted: {self.state['interrupt']['reason']}"
            raise RunNotRunnable(self.run_id, st, detail)

    def _rec(self, step: int) -> dict[str, Any] | None:
        rec = self.state["steps"].get(str(step))
        return rec if isinstance(rec, dict) else None

    def _position(
        self, kind: str, same: Callable[[dict[str, Any]], bool], asked: str
    ) -> tuple[int, dict[str, Any] | None]:
        """The step of this call (the current one again for another attempt of it, else the
        next) and its record (None: a new step); ReplayDivergence on another kind of step."""
        rec = self._rec(self.position) if self.position else None
        if rec and rec.get("kind") == kind and rec.get("status") in SAME_STEP and same(rec):
            self._here += 1
            return self.position, rec
        self.position += 1
        self._here = 1
        rec = self._rec(self.position)
        if rec is not None and rec.get("kind") != kind:
            raise kind_divergence(self.run_id, self.position, rec, asked)
        return self.position, rec

    async def _abandon_open(self, step: int) -> None:
        rec = self._rec(step) if step > 0 else None
        if rec is not None and rec.get("status") in OPEN:
            await self._append("step.abandoned", {"step": step})
            self.stats.steps_abandoned += 1

    async def _new_step(self) -> None:
        self._require_runnable()
        await self._abandon_open(self.position - 1)
        self.attempt = 1
        self.replaying = False

    async def _recorded_request(self, rec: dict[str, Any], field: str) -> Any:
        """``field`` of the step's first request event, or MISSING when not recorded."""
        version = rec.get("version")
        if not isinstance(version, int):
            return MISSING
        e = await afirst(self.store.read(self.run_id, from_version=version, limit=1))
        payload = e.payload if e is not None and isinstance(e.payload, dict) else {}
        return payload.get(field, MISSING)

    def _raise_recorded(self, step: int, rec: dict[str, Any]) -> None:
        """Raise the failure a replayed abandoned step saw at this (``_here``-th) call."""
        self.replaying = True
        self.stats.failures_from_log += 1
        fails = [a for a in rec.get("attempts", []) if a.get("status") == "failed"]
        if fails:
            self.attempt = int(fails[min(self._here, len(fails)) - 1]["n"])
        raise recorded_failure(self.run_id, step, rec, self._here)

    def _record(self, value: Any) -> Any:
        return self.redact(value) if self.redact is not None else value

    def _not_reentrant(self, what: str) -> None:
        """Refuse, before anything moves, a call made while a callable of this journal runs:
        its steps would interleave with the running one in the log and could not replay."""
        if self._inside is not None:
            inside, step = self._inside
            raise ReentrantCall(self.run_id, what, inside, step)

    async def _calling(self, inside: str, step: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (awaited when it returns an awaitable), marked as running."""
        self._inside = (inside, step)
        try:
            return await maybe_await(fn(*args))
        finally:
            self._inside = None

    async def _model_failed(self, step: int, exc: BaseException) -> None:
        self.stats.model_attempts_failed += 1
        failed = {"step": step, "attempt": self.attempt, **failure(exc)}
        await self._append("model.call.failed", failed)

    async def _model_begin(
        self, messages: Any, params: Mapping[str, Any] | None
    ) -> tuple[int, bool, Any]:
        msgs = self._record(messages)
        prm = self._record(dict(params or {}))
        mh = hash_of(msgs, "messages")
        hash_of(prm, "params")  # not JSON: fail before anything is appended
        req: dict[str, Any] = {"messages_hash": mh, "params": prm}
        if self.record_prompts:
            req["messages"] = msgs
        if self.redact is not None:
            req["redacted"] = True
        step, rec = self._position("model", lambda rec: rec.get("hash") == mh, "a model call")
        if rec is None:
            await self._new_step()
            await self._request("model", step, 1, req)
            return step, False, None
        if rec.get("hash") != mh:
            recorded = await self._recorded_request(rec, "messages")
            raise diverged(self.run_id, step, "messages", recorded, msgs, "messages", rec, mh)
        status = rec.get("status")
        if status == "answered":
            self.replaying = True
            self.attempt = len(rec.get("attempts", [])) or 1
            self.stats.model_calls_from_log += 1
            self.stats.tokens_from_log += tokens_of(self.state["usage_by_step"].get(str(step)))
            return step, True, self.state["completions"].get(str(step))
        if status == "abandoned":
            self._raise_recorded(step, rec)
        self._require_runnable()
        self.replaying = False
        last = rec["attempts"][-1]["n"] if rec.get("attempts") else 0
        if status == "requested":
            # Asked, never answered nor failed (the process died in the call): ask again
            # under the same request; only an unanswered call can be paid twice.
            self.attempt = last or 1
        else:
            await self._request("model", step, last + 1, req)
        return step, False, None

    async def _request(self, kind: str, step: int, attempt: int, req: dict[str, Any]) -> None:
        """Write attempt ``attempt`` of the call at ``step`` ahead of the call."""
        self.attempt = attempt
        await self._append(f"{kind}.call.requested", {**req, "step": step, "attempt": attempt})

    async def _tool_begin(
        self,
        name: str,
        args: Any,
        reconcile: Callable[[str], Any] | None,
        idempotent: bool,
        needs_approval: bool = False,
    ) -> tuple[str, bool, Any]:
        recorded_args = self._record(args)
        ah = hash_of(recorded_args, "args")

        def same(rec: dict[str, Any]) -> bool:
            return rec.get("name") == name and rec.get("hash") in (None, ah)

        step, rec = self._position("tool", same, f"tool {name!r}")
        key = str((rec or {}).get("key") or f"{self.run_id}:{step}")
        req = {"name": name, "args": recorded_args, "idempotency_key": key, "args_hash": ah}
        if rec is None:
            if needs_approval:  # the approval's nonce, consumed by this call
                req["approved"] = await self._approval(step, name, recorded_args, ah, key)
            await self._new_step()
            await self._request("tool", step, 1, req)
            return key, False, None
        if rec.get("name") != name:
            was = repr(rec.get("name"))
            detail = f"tool {name!r} requested where the log recorded {was}"
            raise ReplayDivergence(
                self.run_id, step, detail, path="tool", recorded=was, current=repr(name)
            )
        if rec.get("hash") not in (None, ah):
            recorded = await self._recorded_request(rec, "args")
            what = f"args of tool {name!r}"
            raise diverged(self.run_id, step, what, recorded, recorded_args, "args", rec, ah)
        tc = self.state["tool_calls"].get(key, {})
        status = rec.get("status")
        last = rec["attempts"][-1]["n"] if rec.get("attempts") else 0
        if status in ("returned", "error"):
            self.replaying = True
            self.attempt = last or 1
            self.stats.tool_calls_from_log += 1
            if status == "error":
                raise ToolCallFailed(self.run_id, key, tc.get("error"), step=step)
            return key, True, tc.get("result")
        if status == "abandoned":
            self._raise_recorded(step, rec)
        if status in OPEN:
            self._require_runnable()
            self.replaying = False
            await self._request("tool", step, last + 1, req)
            if status == "failed" and reconcile is not None:
                # The failed attempt may have landed before its answer was lost (a
                # timeout): the reconciler, asked under the new attempt's write-ahead
                # request, decides whether the tool is called again.
                landed, result = await self._calling("reconciler", step, reconcile, key)
                if landed:
                    return key, True, await self._reconciled(key, result)
            return key, False, None
        # In doubt: requested, no outcome.
        self.attempt = last or 1
        if reconcile is not None:
            landed, result = await self._calling("reconciler", step, reconcile, key)
            if landed:
                self._require_runnable()
                return key, True, await self._reconciled(key, result)
        elif not idempotent:
            if self.state["status"] == "running":
                await self._append(
                    "run.interrupted", {"reason": IN_DOUBT, "key": key, "step": step}
                )
            raise InDoubtToolCall(self.run_id, key, name, step)
        self._require_runnable()
        self.replaying = False
        return key, False, None

    async def _approval(self, step: int, name: str, args: Any, ah: str, key: str) -> str:
        """The nonce of the valid approval of the call at ``step`` (nothing is written when
        it is refused); else pause the run for one, naming the call and its arguments."""
        self._require_runnable()
        if not self.approvers:
            raise ConfigError(
                f"tool {name!r} needs approval but the journal trusts no approver key "
                "(pass approvers=)"
            )
        ledger, _head = await ledger_of(self.store, self.run_id)
        found = ledger.answer(step)
        if found is None:
            await self._new_step()
            payload = {"reason": APPROVAL_REASON, "step": step, "key": key, "name": name}
            await self._append("run.interrupted", {**payload, "args": args, "args_hash": ah})
            raise ApprovalRequired(self.run_id, step, name)
        version, head, note = found
        asked = ledger.requests[step][1].get("name")
        if asked is not None and asked != name:  # the approver was shown that tool, no other
            raise ApprovalWrongCall(
                self.run_id, step, f"it approves a call of {asked!r}, not of {name!r}"
            )
        pending = Pending(self.run_id, step, ah, head)
        used = ledger.used_before(version)
        return check_approval(note, pending, trusted=self.approvers, used=used).nonce

    async def _reconciled(self, key: str, result: Any) -> Any:
        await self._append(
            "tool.returned", {"idempotency_key": key, "result": result, "reconciled": True}
        )
        self.stats.tool_calls_reconciled += 1
        self.replaying = True
        return result


if ASYNC:
    pass
else:
    __all__ += ["AsyncJournal"]  # as is
