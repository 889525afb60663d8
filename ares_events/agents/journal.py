"""The durable run journal: write-ahead model and tool calls for agent loops.

Every step appends its intention before acting and its outcome after, and nothing
reaches the agent that is not already durable. An agent loop is re-run from the top
after a crash; each journaled step with a recorded outcome returns that outcome instead
of acting again, so a resumed run never re-pays for an answered model call and never
repeats a side-effecting tool call.

Steps are numbered 1, 2, 3, ... in the order the loop makes them, so the loop must be
deterministic given the journal's answers (the usual durable-execution rule). A step
whose recorded intention differs from the replayed one (another prompt at step 7)
raises :class:`ReplayDivergence` rather than silently mixing histories.

Every append names the version it expects, so two live incarnations of one run cannot
both write: the second gets a ``ConcurrencyError`` (fencing for free).

Tool calls carry the idempotency key ``run_id:step_n``. A tool call requested but never
answered (the process died in between) is *in doubt*: it is reconciled with
``reconcile(key) -> (landed, result)`` when given; else an ``idempotent=True`` tool is
retried with the same key; else the run is interrupted with reason
``in_doubt_tool_call`` for a human (:meth:`Journal.resolve_tool_call`), never re-executed
blindly.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import blake3

from ares_events.core.catalog import new_event
from ares_events.core.events import NO_STREAM
from ares_events.core.recorder import Capability
from ares_events.errors import AresError, ChainIntegrityError, ConfigError
from ares_events.integrity.chain import canonical_json
from ares_events.projections.builtin import RunStateProjection
from ares_events.projections.recovery import Snapshotter, recover

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = [
    "AsyncJournal",
    "InDoubtToolCall",
    "Journal",
    "JournalStats",
    "ModelReply",
    "ReplayDivergence",
    "RunNotRunnable",
    "RunRefused",
    "ToolCallFailed",
    "migrating_gate",
    "strict_gate",
]

IN_DOUBT: Final = "in_doubt_tool_call"


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
    """The run is paused, completed, failed or refused; it cannot take new steps."""

    def __init__(self, run_id: str, status: str, detail: str = "") -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(f"run {run_id!r} is {status}" + (f": {detail}" if detail else ""))


class InDoubtToolCall(RunNotRunnable):
    """A tool call was requested but has no result and cannot be reconciled safely."""

    def __init__(self, run_id: str, key: str, name: str) -> None:
        self.key = key
        self.name = name
        super().__init__(
            run_id,
            "paused",
            f"tool call {name!r} ({key}) is in doubt; a human "
            "must resolve it with Journal.resolve_tool_call()",
        )


class ReplayDivergence(AresError):
    """The replayed loop asked for something other than what the log recorded."""

    def __init__(self, run_id: str, step: int, detail: str) -> None:
        self.run_id = run_id
        self.step = step
        super().__init__(f"run {run_id!r} step {step}: {detail}")


class ToolCallFailed(AresError):
    """A tool call ended in an error (recorded in the journal as its outcome)."""

    def __init__(self, run_id: str, key: str, error: Any) -> None:
        self.run_id = run_id
        self.key = key
        self.error = error
        super().__init__(f"tool call {key} of run {run_id!r} failed: {error}")


for _cls in (RunRefused, RunNotRunnable, InDoubtToolCall, ReplayDivergence, ToolCallFailed):
    _cls.__module__ = "ares_events"


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
    resume_seconds: float = 0.0


def _hash(value: Any) -> str:
    return blake3.blake3(canonical_json(value, field="messages")).hexdigest()


def _tokens(usage: Mapping[str, Any]) -> int:
    if "total_tokens" in usage and isinstance(usage["total_tokens"], int):
        return int(usage["total_tokens"])
    return sum(v for v in usage.values() if isinstance(v, int) and not isinstance(v, bool))


def _reply(value: Any) -> ModelReply:
    if isinstance(value, ModelReply):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return ModelReply(value[0], dict(value[1]))
    if isinstance(value, Mapping) and "completion" in value:
        return ModelReply(value["completion"], dict(value.get("usage") or {}))
    return ModelReply(value, {})


class Journal:
    """Write-ahead journal of one run (see the module docstring).

    Args:
        store: the event store; the run is the stream ``run_id``.
        run_id: stable id of the run (also the idempotency-key prefix).
        code_revision: revision of the agent code; recorded by ``run.started``.
        prompt_hash: hash of the prompt/config; recorded by ``run.started``.
        gate: version-gate policy deciding ``resume``/``migrate``/``refuse`` on reopen.
        snapshot_every: snapshot the run state every K events (0 disables).
        module: ``module`` of the events the journal writes.

    Raises:
        RunRefused: the gate refused to resume.
        ChainIntegrityError: the run's log has integrity findings; never act on it.
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
    ) -> None:
        started = time.perf_counter()
        self.store = store
        self.run_id = run_id
        self.module = module
        self.projection = RunStateProjection()
        self.stats = JournalStats()
        has_snaps = Capability.SNAPSHOTS in store.capabilities
        self._snapshots = store.snapshots if has_snaps else None
        rep = recover(store, run_id, self.projection, snapshots=self._snapshots, max_replay=2**62)
        if rep.findings:
            raise ChainIntegrityError(run_id, rep.findings)
        self.state: dict[str, Any] = rep.state
        self.version = rep.version
        self.recovered_from = str(rep.source)
        self.resumed = rep.version > 0
        self.step = 0
        self._snapshotter = (
            Snapshotter(store, [self.projection], every=snapshot_every, snapshots=self._snapshots)
            if has_snaps and snapshot_every > 0
            else None
        )
        current = (code_revision, prompt_hash)
        if not self.resumed:
            self._append(
                "run.started",
                {"code_revision": code_revision, "prompt_hash": prompt_hash},
                NO_STREAM,
            )
        elif self.state["status"] not in ("completed", "failed"):
            recorded = (self.state["code_revision"] or "", self.state["prompt_hash"] or "")
            decision = gate(recorded, current)
            if decision not in ("resume", "migrate", "refuse"):
                raise ConfigError(
                    f"version gate returned {decision!r}; expected resume, migrate or refuse"
                )
            self._append(
                "run.gate",
                {
                    "decision": decision,
                    "code_revision": code_revision,
                    "prompt_hash": prompt_hash,
                    "recorded_code_revision": recorded[0],
                    "recorded_prompt_hash": recorded[1],
                },
            )
            if decision == "refuse":
                raise RunRefused(run_id, recorded, current)
        self.stats.resume_seconds = time.perf_counter() - started

    # -- plumbing ------------------------------------------------------------------------

    @property
    def status(self) -> str:
        """``running``, ``paused``, ``completed``, ``failed`` or ``refused``."""
        return str(self.state["status"])

    def _append(self, type_: str, payload: dict[str, Any], expected: Any = None) -> None:
        ev = new_event(type_, self.module, payload)
        res = self.store.append(
            self.run_id, [ev], expected_version=(self.version if expected is None else expected)
        )
        # Fold the stored event itself so the state is exactly what a recovery would see.
        for e in self.store.read(self.run_id, from_version=res.version, limit=1):
            self.state = self.projection.apply(self.state, e)
        self.version = res.version
        if self._snapshotter is not None:
            self._snapshotter.after_append(self.run_id, res.version)

    def _require_runnable(self) -> None:
        st = self.state["status"]
        if st != "running":
            detail = ""
            if st == "paused" and self.state["interrupt"]:
                detail = f"interrupted: {self.state['interrupt']['reason']}"
            raise RunNotRunnable(self.run_id, st, detail)

    def _next_step(self) -> int:
        self.step += 1
        return self.step

    # -- model calls ---------------------------------------------------------------------

    def _model_begin(
        self, messages: Any, params: Mapping[str, Any] | None
    ) -> tuple[int, bool, Any]:
        step = self._next_step()
        key = str(step)
        mh = _hash(messages)
        recorded = self.state["requested"].get(key)
        if recorded is not None and recorded != mh:
            raise ReplayDivergence(
                self.run_id, step, "messages differ from the recorded model call at this step"
            )
        if key in self.state["completions"]:
            self.stats.model_calls_from_log += 1
            self.stats.tokens_from_log += self._recorded_tokens(key)
            return step, True, self.state["completions"][key]
        self._require_runnable()
        if recorded is None:
            self._append(
                "model.call.requested",
                {"step": step, "messages_hash": mh, "params": dict(params or {})},
            )
        return step, False, None

    def _recorded_tokens(self, key: str) -> int:
        usage = self.state.get("usage_by_step", {}).get(key)
        return _tokens(usage) if usage else 0

    def _model_end(self, step: int, raw: Any) -> Any:
        reply = _reply(raw)
        self.stats.model_calls_made += 1
        self._append(
            "model.responded",
            {"step": step, "completion": reply.completion, "usage": dict(reply.usage)},
        )
        return reply.completion

    def model_call(
        self,
        messages: Any,
        params: Mapping[str, Any] | None = None,
        *,
        call: Callable[[Any, Mapping[str, Any]], Any],
    ) -> Any:
        """One model step: recorded completion on replay, else request, call, record.

        ``call(messages, params)`` returns a :class:`ModelReply`, a ``(completion,
        usage)`` tuple, a ``{"completion", "usage"}`` dict or a bare completion.

        Raises:
            ReplayDivergence: the messages differ from those recorded at this step.
            RunNotRunnable: the run is paused/completed/failed and the step is new.
        """
        step, done, value = self._model_begin(messages, params)
        if done:
            return value
        return self._model_end(step, call(messages, dict(params or {})))

    # -- tool calls ----------------------------------------------------------------------

    def _tool_begin(
        self,
        name: str,
        args: Any,
        reconcile: Callable[[str], tuple[bool, Any]] | None,
        idempotent: bool,
    ) -> tuple[str, bool, Any]:
        step = self._next_step()
        key = f"{self.run_id}:{step}"
        tc = self.state["tool_calls"].get(key)
        if tc is not None and tc["name"] is not None and tc["name"] != name:
            raise ReplayDivergence(
                self.run_id, step, f"tool {name!r} requested where the log recorded {tc['name']!r}"
            )
        if tc is not None and tc["status"] in ("returned", "error"):
            self.stats.tool_calls_from_log += 1
            if tc["status"] == "error":
                raise ToolCallFailed(self.run_id, key, tc["error"])
            return key, True, tc["result"]
        if tc is not None:  # dangling: requested, no outcome
            if reconcile is not None:
                landed, result = reconcile(key)
                if landed:
                    self._require_runnable()
                    self._append(
                        "tool.returned",
                        {"idempotency_key": key, "result": result, "reconciled": True},
                    )
                    self.stats.tool_calls_reconciled += 1
                    return key, True, result
            elif not idempotent:
                if self.state["status"] == "running":
                    self._append("run.interrupted", {"reason": IN_DOUBT, "key": key, "step": step})
                raise InDoubtToolCall(self.run_id, key, name)
            self._require_runnable()
            return key, False, None
        self._require_runnable()
        self._append("tool.call.requested", {"name": name, "args": args, "idempotency_key": key})
        return key, False, None

    def _tool_end(self, key: str, result: Any, error: BaseException | None) -> Any:
        self.stats.tool_calls_made += 1
        if error is not None:
            msg = f"{type(error).__name__}: {error}"
            self._append("tool.returned", {"idempotency_key": key, "error": msg})
            raise ToolCallFailed(self.run_id, key, msg) from error
        self._append("tool.returned", {"idempotency_key": key, "result": result})
        return result

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

        ``call(args, key)`` performs the side effect, passing ``key`` downstream.
        ``reconcile(key) -> (landed, result)`` asks the downstream system whether an
        in-doubt call landed.

        Raises:
            ToolCallFailed: the tool raised (its error is recorded as the outcome).
            InDoubtToolCall: in doubt, no reconciler and not idempotent; run interrupted.
            ReplayDivergence: another tool was recorded at this step.
            RunNotRunnable: the run cannot take new steps.
        """
        key, done, value = self._tool_begin(name, args, reconcile, idempotent)
        if done:
            return value
        try:
            result = call(args, key)
        except Exception as exc:
            return self._tool_end(key, None, exc)
        return self._tool_end(key, result, None)

    def resolve_tool_call(
        self, key: str, *, result: Any = None, error: Any = None, by: str = "operator"
    ) -> None:
        """Record a human's verdict on an in-doubt call (the outcome to use)."""
        tc = self.state["tool_calls"].get(key)
        if tc is None or tc["status"] != "requested":
            raise ConfigError(f"tool call {key} is not in doubt")
        payload: dict[str, Any] = {"idempotency_key": key, "resolved_by": by}
        payload["error" if error is not None else "result"] = error if error is not None else result
        self._append("tool.returned", payload)

    # -- state, interrupts, end ----------------------------------------------------------

    def _replayed(self, step: int, type_: str) -> bool:
        return bool(self.state["steps"].get(str(step)) == type_)

    def patch(self, key: str, value: Any) -> None:
        """Record a state patch (skipped when replaying a recorded step)."""
        step = self._next_step()
        if self._replayed(step, "state.patched"):
            return
        self._require_runnable()
        self._append("state.patched", {"key": key, "value": value, "step": step})

    @property
    def patched(self) -> dict[str, Any]:
        """The run's patched state (key -> value)."""
        return dict(self.state["state"])

    def interrupt(self, reason: str) -> bool:
        """Pause the run (e.g. awaiting approval). Returns True when the run is now paused
        and the process should exit; False when replaying an interrupt already resumed."""
        step = self._next_step()
        if self._replayed(step, "run.interrupted"):
            return bool(self.state["status"] == "paused")
        self._require_runnable()
        self._append("run.interrupted", {"reason": reason, "step": step})
        return True

    def resume(self, *, by: str) -> None:
        """Resume a paused run (from any process, any time later).

        Raises:
            RunNotRunnable: the run is not paused.
        """
        if self.state["status"] != "paused":
            raise RunNotRunnable(self.run_id, self.state["status"], "only a paused run resumes")
        self._append("run.resumed", {"by": by})

    def complete(self, result: Any = None) -> None:
        """Mark the run completed (idempotent)."""
        if self.state["status"] == "completed":
            return
        self._require_runnable()
        self._append("run.completed", {"result": result, "step": self.step})

    def fail(self, error: str) -> None:
        """Mark the run failed (idempotent)."""
        if self.state["status"] == "failed":
            return
        self._append("run.failed", {"error": error, "step": self.step})


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class AsyncJournal:
    """The asyncio twin of :class:`Journal`: store I/O runs in a worker thread and
    ``call``/``reconcile`` may be coroutine functions. Create with :meth:`open`."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    @classmethod
    async def open(cls, store: EventStore, run_id: str, **kwargs: Any) -> AsyncJournal:
        """Open (recover, gate) the run without blocking the event loop.

        Raises:
            RunRefused: the gate refused to resume.
        """
        return cls(await asyncio.to_thread(Journal, store, run_id, **kwargs))

    @property
    def stats(self) -> JournalStats:
        """Counters."""
        return self.journal.stats

    @property
    def status(self) -> str:
        """Run status."""
        return self.journal.status

    async def model_call(
        self,
        messages: Any,
        params: Mapping[str, Any] | None = None,
        *,
        call: Callable[[Any, Mapping[str, Any]], Any | Awaitable[Any]],
    ) -> Any:
        """See :meth:`Journal.model_call`."""
        j = self.journal
        step, done, value = await asyncio.to_thread(j._model_begin, messages, params)
        if done:
            return value
        raw = await _maybe_await(call(messages, dict(params or {})))
        return await asyncio.to_thread(j._model_end, step, raw)

    async def tool_call(
        self,
        name: str,
        args: Any,
        *,
        call: Callable[[Any, str], Any | Awaitable[Any]],
        reconcile: Callable[[str], Any] | None = None,
        idempotent: bool = False,
    ) -> Any:
        """See :meth:`Journal.tool_call`."""
        j = self.journal
        sync_reconcile = None
        if reconcile is not None:
            loop = asyncio.get_running_loop()

            def sync_reconcile(key: str) -> tuple[bool, Any]:
                res = reconcile(key)
                if inspect.isawaitable(res):
                    return asyncio.run_coroutine_threadsafe(_maybe_await(res), loop).result()  # type: ignore[no-any-return]
                return res  # type: ignore[no-any-return]

        key, done, value = await asyncio.to_thread(
            j._tool_begin, name, args, sync_reconcile, idempotent
        )
        if done:
            return value
        try:
            result = await _maybe_await(call(args, key))
        except Exception as exc:
            return await asyncio.to_thread(j._tool_end, key, None, exc)
        return await asyncio.to_thread(j._tool_end, key, result, None)

    async def patch(self, key: str, value: Any) -> None:
        """See :meth:`Journal.patch`."""
        await asyncio.to_thread(self.journal.patch, key, value)

    async def interrupt(self, reason: str) -> bool:
        """See :meth:`Journal.interrupt`."""
        return await asyncio.to_thread(self.journal.interrupt, reason)

    async def resume(self, *, by: str) -> None:
        """See :meth:`Journal.resume`."""
        await asyncio.to_thread(self.journal.resume, by=by)

    async def complete(self, result: Any = None) -> None:
        """See :meth:`Journal.complete`."""
        await asyncio.to_thread(self.journal.complete, result)

    async def fail(self, error: str) -> None:
        """See :meth:`Journal.fail`."""
        await asyncio.to_thread(self.journal.fail, error)
