"""The run journal's decisions, written once for :class:`~.journal_core.Journal` and
:class:`~.journal_async.AsyncJournal`.

:class:`JournalLogic` holds a run's folded state and decides every step: which step a
call belongs to, replay or act, divergence, attempts, abandonment, in-doubt tool calls,
the version gate. Where it needs the store (append an event, read one back, load or save
a snapshot) or a user's reconciler, it yields a :class:`~ares_events.core.sansio.Call`:
the blocking journal answers through a blocking store port, the asyncio journal awaits
an asyncio store (or a blocking store in worker threads) -- see
:mod:`ares_events.core.ports`. So the two journals cannot drift apart.

It may import the core, stores, integrity, projections and this package's leaf modules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ares_events.agents import runs
from ares_events.agents.journal_errors import (
    InDoubtToolCall,
    ModelCallFailed,
    ReplayDivergence,
    RunNotRunnable,
    RunRefused,
    ToolCallFailed,
)
from ares_events.agents.recording import (
    MAX_ERROR_CHARS,
    MISSING,
    Redactor,
    class_path,
    describe,
    first_difference,
    hash_of,
    rebuild_failure,
)
from ares_events.core.catalog import new_event
from ares_events.core.events import NO_STREAM
from ares_events.core.recorder import Capability
from ares_events.core.sansio import Call, Steps
from ares_events.errors import ChainIntegrityError, ConfigError, PayloadErased
from ares_events.projections.base import ERASED_REASON
from ares_events.projections.builtin import RunStateProjection
from ares_events.projections.recovery import Snapshotter, recover_steps

if TYPE_CHECKING:
    from contextvars import Token

logger = logging.getLogger(__name__)

__all__ = [
    "FINISHED",
    "IN_DOUBT",
    "GatePolicy",
    "JournalLogic",
    "JournalStats",
    "ModelReply",
    "migrating_gate",
    "strict_gate",
]

IN_DOUBT: Final = "in_doubt_tool_call"
FINISHED: Final = frozenset({"completed", "failed", "cancelled"})
# A call at the loop's current step with one of these statuses and the same request is
# another attempt of that step (live: a retry; on replay: the next recorded failure).
_SAME_STEP: Final = frozenset({"failed", "not_done", "abandoned", "requested"})
_OPEN: Final = frozenset({"failed", "not_done"})


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


def _reply(value: Any) -> ModelReply:
    if isinstance(value, ModelReply):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return ModelReply(value[0], dict(value[1]))
    if isinstance(value, Mapping) and "completion" in value:
        return ModelReply(value["completion"], dict(value.get("usage") or {}))
    return ModelReply(value, {})


def _failure(exc: BaseException) -> dict[str, Any]:
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not hide the failure itself
        message = f"<unprintable {type(exc).__name__}>"
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 1] + "…"
    return {"error_type": type(exc).__name__, "error": message, "error_class": class_path(exc)}


class JournalLogic:
    """A run's state and the journal's decisions (see the module docstring). The public
    faces are :class:`~.journal_core.Journal` and :class:`~.journal_async.AsyncJournal`.
    """

    def _setup(
        self,
        store: Any,
        run_id: str,
        *,
        snapshot_every: int,
        module: str,
        redact: Redactor | None,
        record_prompts: bool,
    ) -> None:
        """The fields of a journal that has not read its run yet (no I/O)."""
        self.store = store
        self.run_id = run_id
        self.module = module
        self.redact = redact
        self.record_prompts = record_prompts
        self.projection = RunStateProjection()
        self.stats = JournalStats()
        has_snaps = Capability.SNAPSHOTS in store.capabilities
        self._snapshots = store.snapshots if has_snaps else None
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
        self._token: Token[Any] | None = None
        self._snapshotter = (
            Snapshotter(store, [self.projection], every=snapshot_every, snapshots=self._snapshots)
            if has_snaps and snapshot_every > 0
            else None
        )

    def _open_steps(self, code_revision: str, prompt_hash: str, gate: GatePolicy) -> Steps[None]:
        """Recover the run, then start it or pass the version gate (both append)."""
        rep = yield from recover_steps(
            self.store.chain_key,
            self.run_id,
            self.projection,
            snapshots=self._snapshots,
            max_replay=2**62,
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
        current = (code_revision, prompt_hash)
        if not self.resumed:
            yield from self._append(
                "run.started",
                {"code_revision": code_revision, "prompt_hash": prompt_hash},
                NO_STREAM,
            )
        elif self.state["status"] not in FINISHED:
            recorded = (self.state["code_revision"] or "", self.state["prompt_hash"] or "")
            decision = gate(recorded, current)
            if decision not in ("resume", "migrate", "refuse"):
                raise ConfigError(
                    f"version gate returned {decision!r}; expected resume, migrate or refuse"
                )
            yield from self._append(
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
                raise RunRefused(self.run_id, recorded, current)

    # -- plumbing ------------------------------------------------------------------------

    @property
    def status(self) -> str:
        """``running``, ``paused``, ``completed``, ``failed``, ``cancelled`` or ``refused``."""
        return str(self.state["status"])

    @property
    def patched(self) -> dict[str, Any]:
        """The run's patched state (key -> value)."""
        return dict(self.state["state"])

    def _append(
        self,
        type_: str,
        payload: dict[str, Any],
        expected: Any = None,
        metadata: dict[str, Any] | None = None,
    ) -> Steps[None]:
        ev = new_event(type_, self.module, payload, metadata=metadata)
        res = yield Call(
            "append", self.run_id, [ev], self.version if expected is None else expected
        )
        # Fold the stored event itself so the state is exactly what a recovery would see.
        e = yield Call("read_at", self.run_id, res.version)
        if e is not None:
            self.state = self.projection.apply(self.state, e)
        self.version = res.version
        if self._snapshotter is not None:
            yield from self._snapshotter.after_append_steps(self.run_id, res.version)

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

    def _position(self, kind: str, same: Callable[[dict[str, Any]], bool]) -> int:
        """The step this call belongs to: the current one again when it is another attempt
        of it, else the next one."""
        rec = self._rec(self.position) if self.position else None
        if (
            rec is not None
            and rec.get("kind") == kind
            and rec.get("status") in _SAME_STEP
            and same(rec)
        ):
            self._here += 1
            return self.position
        self.position += 1
        self._here = 1
        return self.position

    def _abandon_open(self, step: int) -> Steps[None]:
        rec = self._rec(step) if step > 0 else None
        if rec is not None and rec.get("status") in _OPEN:
            yield from self._append("step.abandoned", {"step": step})
            self.stats.steps_abandoned += 1

    def _new_step(self) -> Steps[None]:
        """Checks and bookkeeping before the first append of a new step."""
        self._require_runnable()
        yield from self._abandon_open(self.position - 1)
        self.attempt = 1
        self.replaying = False

    def _diverged(
        self,
        step: int,
        what: str,
        recorded: Any,
        current: Any,
        path: str,
        rec: dict[str, Any],
        current_hash: str,
    ) -> ReplayDivergence:
        if recorded is MISSING:
            was, now = str(rec.get("hash") or "")[:16], current_hash[:16]
            return ReplayDivergence(
                self.run_id,
                step,
                f"{what} differ from the recorded call at this step; only hashes are "
                f"recorded, so the difference cannot be shown: recorded blake3 {was}…, "
                f"now {now}…",
                path=path,
                recorded=was,
                current=now,
                hashes_only=True,
            )
        diff = first_difference(recorded, current, path)
        if diff is None:  # equal after all: e.g. a hash of another canonical form
            return ReplayDivergence(
                self.run_id, step, f"{what} differ from the recorded call at this step", path=path
            )
        where, a, b = diff
        ra, cb = describe(a, b)
        return ReplayDivergence(
            self.run_id,
            step,
            f"{what} differ from the recorded call at {where}: recorded {ra}, now {cb}",
            path=where,
            recorded=ra,
            current=cb,
        )

    def _recorded_request(self, rec: dict[str, Any], field: str) -> Steps[Any]:
        """``field`` of the step's first request event, or MISSING when not recorded."""
        version = rec.get("version")
        if not isinstance(version, int):
            return MISSING
        e = yield Call("read_at", self.run_id, version)
        if e is None:
            return MISSING
        payload = e.payload if isinstance(e.payload, dict) else {}
        return payload.get(field, MISSING)

    def _kind_divergence(self, step: int, rec: dict[str, Any], asked: str) -> ReplayDivergence:
        kind = str(rec.get("kind"))
        recorded = f"{kind} {rec['name']!r}" if rec.get("name") else kind
        return ReplayDivergence(
            self.run_id,
            step,
            f"the log recorded a {recorded} step here; the loop asked for {asked}",
            path="kind",
            recorded=recorded,
            current=asked,
        )

    def _raise_recorded(self, step: int, rec: dict[str, Any]) -> None:
        """Raise the failure a replayed abandoned step saw at this (``_here``-th) call."""
        self.replaying = True
        self.stats.failures_from_log += 1
        fails = [a for a in rec.get("attempts", []) if a.get("status") == "failed"]
        key = str(rec.get("key") or f"{self.run_id}:{step}")
        if not fails:
            raise ToolCallFailed(
                self.run_id, key, "abandoned without a recorded failure", step=step
            )
        a = fails[min(self._here, len(fails)) - 1]
        self.attempt = int(a["n"])
        note = (
            f"replayed from the run journal (run {self.run_id!r}, step {step}, attempt "
            f"{a['n']}): the call was not made again"
        )
        exc = rebuild_failure(a.get("error_class"), str(a.get("error", "")), note)
        if exc is not None:
            raise exc
        if rec.get("kind") == "model":
            raise ModelCallFailed(self.run_id, step, a["n"], a["error_type"], a["error"])
        raise ToolCallFailed(
            self.run_id,
            key,
            f"{a['error_type']}: {a['error']}",
            step=step,
            attempt=a["n"],
            error_type=a["error_type"],
        )

    def _record(self, value: Any) -> Any:
        return self.redact(value) if self.redact is not None else value

    # -- model calls ---------------------------------------------------------------------

    def _model_begin(
        self, messages: Any, params: Mapping[str, Any] | None
    ) -> Steps[tuple[int, bool, Any]]:
        msgs = self._record(messages)
        prm = self._record(dict(params or {}))
        mh = hash_of(msgs, "messages")
        hash_of(prm, "params")  # not JSON: fail before anything is appended
        step = self._position("model", lambda rec: rec.get("hash") == mh)
        rec = self._rec(step)
        if rec is None:
            yield from self._new_step()
            yield from self._model_request(step, 1, mh, msgs, prm)
            return step, False, None
        if rec.get("kind") != "model":
            raise self._kind_divergence(step, rec, "a model call")
        if rec.get("hash") != mh:
            recorded = yield from self._recorded_request(rec, "messages")
            raise self._diverged(step, "messages", recorded, msgs, "messages", rec, mh)
        status = rec.get("status")
        if status == "answered":
            self.replaying = True
            self.attempt = len(rec.get("attempts", [])) or 1
            self.stats.model_calls_from_log += 1
            self.stats.tokens_from_log += runs.tokens_of(self.state["usage_by_step"].get(str(step)))
            return step, True, self.state["completions"].get(str(step))
        if status == "abandoned":
            self._raise_recorded(step, rec)
        self._require_runnable()
        self.replaying = False
        attempts = rec.get("attempts", [])
        last = attempts[-1]["n"] if attempts else 0
        if status == "requested":
            # Asked, never answered nor failed (the process died in the call): ask again
            # under the same request; only an unanswered call can be paid twice.
            self.attempt = last or 1
            return step, False, None
        self.attempt = last + 1
        yield from self._model_request(step, last + 1, mh, msgs, prm)
        return step, False, None

    def _model_request(self, step: int, attempt: int, mh: str, msgs: Any, prm: Any) -> Steps[None]:
        payload: dict[str, Any] = {
            "step": step,
            "attempt": attempt,
            "messages_hash": mh,
            "params": prm,
        }
        if self.record_prompts:
            payload["messages"] = msgs
        if self.redact is not None:
            payload["redacted"] = True
        yield from self._append("model.call.requested", payload)

    def _model_failed(self, step: int, exc: BaseException) -> Steps[None]:
        self.stats.model_attempts_failed += 1
        yield from self._append(
            "model.call.failed", {"step": step, "attempt": self.attempt, **_failure(exc)}
        )

    def _model_end(self, step: int, raw: Any) -> Steps[Any]:
        reply = _reply(raw)
        self.stats.model_calls_made += 1
        yield from self._append(
            "model.responded",
            {"step": step, "completion": reply.completion, "usage": dict(reply.usage)},
        )
        return reply.completion

    # -- tool calls ----------------------------------------------------------------------

    def _tool_begin(
        self,
        name: str,
        args: Any,
        reconcile: Callable[[str], Any] | None,
        idempotent: bool,
    ) -> Steps[tuple[str, bool, Any]]:
        recorded_args = self._record(args)
        ah = hash_of(recorded_args, "args")

        def same(rec: dict[str, Any]) -> bool:
            return rec.get("name") == name and rec.get("hash") in (None, ah)

        step = self._position("tool", same)
        rec = self._rec(step)
        key = f"{self.run_id}:{step}"
        if rec is None:
            yield from self._new_step()
            yield from self._tool_request(step, 1, name, recorded_args, ah, key)
            return key, False, None
        if rec.get("kind") != "tool":
            raise self._kind_divergence(step, rec, f"tool {name!r}")
        key = str(rec.get("key") or key)
        if rec.get("name") != name:
            raise ReplayDivergence(
                self.run_id,
                step,
                f"tool {name!r} requested where the log recorded {rec.get('name')!r}",
                path="tool",
                recorded=repr(rec.get("name")),
                current=repr(name),
            )
        if rec.get("hash") not in (None, ah):
            recorded = yield from self._recorded_request(rec, "args")
            raise self._diverged(
                step, f"args of tool {name!r}", recorded, recorded_args, "args", rec, ah
            )
        tc = self.state["tool_calls"].get(key, {})
        status = rec.get("status")
        attempts = rec.get("attempts", [])
        last = attempts[-1]["n"] if attempts else 0
        if status in ("returned", "error"):
            self.replaying = True
            self.attempt = last or 1
            self.stats.tool_calls_from_log += 1
            if status == "error":
                raise ToolCallFailed(self.run_id, key, tc.get("error"), step=step)
            return key, True, tc.get("result")
        if status == "abandoned":
            self._raise_recorded(step, rec)
        if status in _OPEN:
            self._require_runnable()
            self.replaying = False
            self.attempt = last + 1
            yield from self._tool_request(step, last + 1, name, recorded_args, ah, key)
            return key, False, None
        # In doubt: requested, no outcome.
        self.attempt = last or 1
        if reconcile is not None:
            landed, result = yield Call("user", reconcile, key)
            if landed:
                self._require_runnable()
                yield from self._append(
                    "tool.returned", {"idempotency_key": key, "result": result, "reconciled": True}
                )
                self.stats.tool_calls_reconciled += 1
                self.replaying = True
                return key, True, result
        elif not idempotent:
            if self.state["status"] == "running":
                yield from self._append(
                    "run.interrupted", {"reason": IN_DOUBT, "key": key, "step": step}
                )
            raise InDoubtToolCall(self.run_id, key, name, step)
        self._require_runnable()
        self.replaying = False
        return key, False, None

    def _tool_request(
        self, step: int, attempt: int, name: str, args: Any, ah: str, key: str
    ) -> Steps[None]:
        yield from self._append(
            "tool.call.requested",
            {
                "name": name,
                "args": args,
                "idempotency_key": key,
                "step": step,
                "attempt": attempt,
                "args_hash": ah,
            },
        )

    def _tool_failed(self, key: str, exc: BaseException) -> Steps[None]:
        self.stats.tool_attempts_failed += 1
        yield from self._append(
            "tool.call.failed",
            {
                "idempotency_key": key,
                "step": self.position,
                "attempt": self.attempt,
                **_failure(exc),
            },
        )

    def _tool_end(self, key: str, result: Any) -> Steps[Any]:
        self.stats.tool_calls_made += 1
        yield from self._append("tool.returned", {"idempotency_key": key, "result": result})
        return result

    # -- operator verdicts, state, interrupts, end ---------------------------------------

    def _resolve_steps(
        self, key: str, result: Any, error: Any, by: str, reason: str | None
    ) -> Steps[None]:
        tc = self.state["tool_calls"].get(key)
        if tc is None or tc["status"] != "requested":
            raise ConfigError(f"tool call {key} is not in doubt")
        payload: dict[str, Any] = {"idempotency_key": key, "resolved_by": by}
        payload["error" if error is not None else "result"] = error if error is not None else result
        yield from self._append(
            "tool.returned", payload, metadata=runs.audit(by, reason, "library")
        )

    def _patch_steps(self, key: str, value: Any) -> Steps[None]:
        step = self._position("patch", lambda rec: False)
        rec = self._rec(step)
        if rec is not None:
            if rec.get("kind") != "patch":
                raise self._kind_divergence(step, rec, "a state patch")
            self.replaying = True
            return
        yield from self._new_step()
        yield from self._append("state.patched", {"key": key, "value": value, "step": step})

    def _interrupt_steps(self, reason: str) -> Steps[bool]:
        step = self._position("interrupt", lambda rec: False)
        rec = self._rec(step)
        if rec is not None:
            if rec.get("kind") != "interrupt":
                raise self._kind_divergence(step, rec, f"an interrupt ({reason})")
            self.replaying = True
            return not rec.get("resumed", False)
        yield from self._new_step()
        yield from self._append("run.interrupted", {"reason": reason, "step": step})
        return True

    def _resume_steps(self, by: str, reason: str | None) -> Steps[None]:
        if self.state["status"] != "paused":
            raise RunNotRunnable(self.run_id, self.state["status"], "only a paused run resumes")
        yield from self._append(
            "run.resumed", {"by": by}, metadata=runs.audit(by, reason, "library")
        )

    def _complete_steps(self, result: Any) -> Steps[None]:
        if self.state["status"] == "completed":
            return
        self._require_runnable()
        yield from self._abandon_open(self.position)
        yield from self._append("run.completed", {"result": result, "step": self.position})

    def _fail_steps(self, error: str) -> Steps[None]:
        if self.state["status"] == "failed":
            return
        if self.state["status"] == "running":
            yield from self._abandon_open(self.position)
        yield from self._append("run.failed", {"error": error, "step": self.position})
