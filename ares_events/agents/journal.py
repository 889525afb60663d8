"""The durable run journal: write-ahead model and tool calls for agent loops.

Every step appends its intention before acting and its outcome after, and nothing
reaches the agent that is not already durable. An agent loop is re-run from the top
after a crash; each journaled step with a recorded outcome returns that outcome instead
of acting again, so a resumed run never re-pays for an answered model call and never
repeats a side-effecting tool call.

Steps are numbered 1, 2, 3, ... in the order the loop makes them, so the loop must be
deterministic given the journal's answers (the usual durable-execution rule). A step
whose recorded request differs from the replayed one (another prompt at step 7) raises
:class:`ReplayDivergence`, naming the first difference, rather than mixing histories.

**Attempts are not steps.** A call that raises records a failed attempt of its step
(``model.call.failed`` / ``tool.call.failed``) and the original exception propagates.
The next call at that point of the loop decides: the same call (same messages; same tool
and args) is a retry of the same step, with the same idempotency key and the next attempt
number; any other call means the loop gave up, so ``step.abandoned`` is recorded and the
next step starts. On replay a step with an outcome returns it (its failed attempts are
not replayed), an abandoned step raises its recorded failures again without calling, and
a step whose last attempt failed and that is still open is attempted for real.

Every append names the version it expects, so two live incarnations of one run cannot
both write: the second gets a ``ConcurrencyError`` (fencing for free).

Tool calls carry the idempotency key ``run_id:step_n``. A tool call requested but never
answered (the process died in between) is *in doubt*: it is reconciled with
``reconcile(key) -> (landed, result)`` when given; else an ``idempotent=True`` tool is
retried with the same key; else the run is interrupted with reason
``in_doubt_tool_call`` for a human (``ares-events runs resolve``,
:meth:`Journal.resolve_tool_call`), never re-executed blindly.

Opening a :class:`Journal` is for the process that runs the loop (it passes the version
gate, which appends). To look at a run without writing, use :meth:`Journal.inspect`;
operators settle runs with :mod:`ares_events.agents.runs` (``ares-events runs``).

This module is the public face: :class:`Journal` lives in :mod:`.journal_core`,
:class:`AsyncJournal` in :mod:`.journal_async`, the errors in :mod:`.journal_errors`, the
decorators in :mod:`.journal_decorators`, what a request records in :mod:`.recording`.
"""

from __future__ import annotations

from ares_events.agents.journal_async import AsyncJournal
from ares_events.agents.journal_core import (
    IN_DOUBT,
    Journal,
    JournalStats,
    ModelReply,
    migrating_gate,
    strict_gate,
)
from ares_events.agents.journal_decorators import journaled_step, journaled_tool
from ares_events.agents.journal_errors import (
    InDoubtToolCall,
    ModelCallFailed,
    ReplayDivergence,
    RunNotFound,
    RunNotRunnable,
    RunRefused,
    ToolCallFailed,
)
from ares_events.agents.recording import redact_keys

__all__ = [
    "IN_DOUBT",
    "AsyncJournal",
    "InDoubtToolCall",
    "Journal",
    "JournalStats",
    "ModelCallFailed",
    "ModelReply",
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
