"""A small journaled run, executed as a real subprocess by the crash tests.

The run (``flow=basic``): model call, ``create_ticket`` tool call, patch, model call,
complete. With ``flow=interrupt`` an ``awaiting_approval`` interrupt sits between the
patch and the second model call.

The fake LLM and the fake ticketing service keep their own SQLite file (``--services``):
every model call and every tool invocation is a row, and the ticketing service honours
idempotency keys (one ticket and one side-effect row per key). The crash tests read
those tables, not anything the child claims.

Crash switches: ``--die-after N`` SIGKILLs the process right after the Nth event append;
``--die-in tool`` SIGKILLs inside the tool after its side effect, before it returns;
``--die-in model`` SIGKILLs inside the model call after it was made (and counted),
before the journal records its completion.

The store URL comes from ``ARES_STORE_URL`` (never argv). On a normal exit the child
prints one JSON line: outcome, status and the journal's stats.

    python tests/journal_child.py --services S.db --run-id RUN [--die-after N]
        [--die-in tool|model] [--flow basic|interrupt] [--mode reconcile|idempotent|none]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sqlite3
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import blake3

from ares_events.agents.journal import Journal, ModelReply
from ares_events.integrity.chain import canonical_json
from ares_events.stores import open_store

CODE_REVISION = "child-rev-1"
PROMPT_HASH = "child-prompt-1"

SERVICES_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS model_calls (run TEXT, messages_hash TEXT, content TEXT)",
    "CREATE TABLE IF NOT EXISTS tool_invocations (run TEXT, key TEXT)",
    "CREATE TABLE IF NOT EXISTS tickets (key TEXT PRIMARY KEY, run TEXT, title TEXT)",
    "CREATE TABLE IF NOT EXISTS side_effects (key TEXT, run TEXT, title TEXT)",
)


def die() -> None:
    """kill -9 of this very process: no cleanup, no flush, no atexit."""
    os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def services_db(path: str) -> Iterator[sqlite3.Connection]:
    """A connection to the fake services' own SQLite file (autocommit)."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        for stmt in SERVICES_SCHEMA:
            conn.execute(stmt)
        yield conn
    finally:
        conn.close()


def messages_hash(messages: Any) -> str:
    """Hash of a message list, as the fake LLM logs it."""
    return blake3.blake3(canonical_json(messages)).hexdigest()


class FakeLLM:
    """Deterministic completions; every call is a row in ``model_calls``."""

    def __init__(self, services: str, run: str, *, die_inside: bool = False) -> None:
        self.services, self.run, self.die_inside = services, run, die_inside

    def __call__(self, messages: Any, params: Mapping[str, Any]) -> ModelReply:
        content = str(messages[-1]["content"])
        with services_db(self.services) as c:
            c.execute(
                "INSERT INTO model_calls VALUES (?, ?, ?)",
                (self.run, messages_hash(messages), content),
            )
        if self.die_inside:
            die()  # the call was made and paid for; its answer is lost
        prompt = 10 + len(content) // 4
        text = "answer-" + blake3.blake3(content.encode()).hexdigest()[:8]
        return ModelReply(
            {"text": text},
            {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5},
        )


class FakeTicketing:
    """Creates tickets, honouring idempotency keys; logs every invocation."""

    def __init__(self, services: str, run: str, *, die_inside: bool = False) -> None:
        self.services, self.run, self.die_inside = services, run, die_inside

    def create(self, args: Any, key: str) -> dict[str, Any]:
        """Create the ticket for ``key`` unless it exists (then return that one)."""
        with services_db(self.services) as c:
            c.execute("INSERT INTO tool_invocations VALUES (?, ?)", (self.run, key))
            c.execute("BEGIN IMMEDIATE")
            if c.execute("SELECT 1 FROM tickets WHERE key = ?", (key,)).fetchone() is None:
                c.execute("INSERT INTO tickets VALUES (?, ?, ?)", (key, self.run, args["title"]))
                c.execute(
                    "INSERT INTO side_effects VALUES (?, ?, ?)", (key, self.run, args["title"])
                )
            c.execute("COMMIT")
        if self.die_inside:
            die()  # the side effect landed; the reply never reaches the journal
        return {"ticket": key, "title": args["title"]}

    def lookup(self, key: str) -> tuple[bool, Any]:
        """Reconciler: did a call with this key land? (and its result if so)."""
        with services_db(self.services) as c:
            row = c.execute("SELECT title FROM tickets WHERE key = ?", (key,)).fetchone()
        return (True, {"ticket": key, "title": row[0]}) if row else (False, None)


class KillAfterAppends:
    """A real store whose process is SIGKILLed right after its Nth append commits."""

    def __init__(self, store: Any, n: int) -> None:
        self._store = store
        self._n = n
        self._appends = 0

    def append(self, *args: Any, **kwargs: Any) -> Any:
        """Delegate, then die when this was the Nth append."""
        res = self._store.append(*args, **kwargs)
        self._appends += 1
        if self._appends == self._n:
            die()
        return res

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def first_messages() -> list[dict[str, str]]:
    """The messages of the run's first model call."""
    return [
        {"role": "system", "content": "You file tickets for findings."},
        {"role": "user", "content": "Summarise topic A."},
    ]


def second_messages(c1: Any, ticket: Any) -> list[dict[str, str]]:
    """The messages of the second model call, built from the earlier answers."""
    return [
        *first_messages(),
        {"role": "assistant", "content": c1["text"]},
        {"role": "user", "content": f"Ticket {ticket['ticket']} is filed. Conclude."},
    ]


def ticket_title(c1: Any) -> str:
    """The ticket title the loop derives from the first answer."""
    return f"finding {c1['text']}"


def run_loop(
    journal: Journal,
    llm: Any,
    tickets: FakeTicketing,
    *,
    mode: str = "reconcile",
    flow: str = "basic",
) -> str:
    """The agent loop; returns ``completed`` or ``paused``. Deterministic given answers."""
    c1 = journal.model_call(first_messages(), {"temperature": 0}, call=llm)
    ticket = journal.tool_call(
        "create_ticket",
        {"title": ticket_title(c1)},
        call=tickets.create,
        reconcile=tickets.lookup if mode == "reconcile" else None,
        idempotent=mode == "idempotent",
    )
    journal.patch("ticket", ticket["ticket"])
    if flow == "interrupt" and journal.interrupt("awaiting_approval"):
        return "paused"
    c2 = journal.model_call(second_messages(c1, ticket), {"temperature": 0}, call=llm)
    journal.complete({"answer": c2["text"]})
    return "completed"


def main(argv: list[str] | None = None) -> int:
    """Run (or resume) the journaled run once; see the module docstring."""
    p = argparse.ArgumentParser(prog="journal_child")
    p.add_argument("--services", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--die-after", type=int, default=0)
    p.add_argument("--die-in", choices=("tool", "model"), default=None)
    p.add_argument("--flow", choices=("basic", "interrupt"), default="basic")
    p.add_argument("--mode", choices=("reconcile", "idempotent", "none"), default="reconcile")
    p.add_argument("--snapshot-every", type=int, default=2)
    args = p.parse_args(argv)
    store = open_store(os.environ["ARES_STORE_URL"])
    target: Any = KillAfterAppends(store, args.die_after) if args.die_after else store
    journal = Journal(
        target,
        args.run_id,
        code_revision=CODE_REVISION,
        prompt_hash=PROMPT_HASH,
        snapshot_every=args.snapshot_every,
    )
    llm = FakeLLM(args.services, args.run_id, die_inside=args.die_in == "model")
    tickets = FakeTicketing(args.services, args.run_id, die_inside=args.die_in == "tool")
    outcome = run_loop(journal, llm, tickets, mode=args.mode, flow=args.flow)
    print(
        json.dumps(
            {
                "outcome": outcome,
                "status": journal.status,
                "recovered_from": journal.recovered_from,
                "stats": dataclasses.asdict(journal.stats),
            }
        )
    )
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
