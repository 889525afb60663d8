"""A small journaled run, executed as a real subprocess by the crash tests.

The run (``flow=basic``): model call, ``create_ticket`` tool call, patch, model call,
complete. With ``flow=interrupt`` an ``awaiting_approval`` interrupt sits between the
patch and the second model call. ``flow=long`` only patches, LONG_STEPS times (a busy run
for races with operators). ``flow=retry`` is the loop every agent has (see
:func:`run_retry_loop`): the model answers each prompt only after two ``RateLimited``
errors, ``create_ticket`` and ``notify`` lose their first answer after the side effect
(``GatewayTimeout``), and ``weather`` is down for good (the loop gives up after two
attempts and tells the model).

The fake LLM and the fake ticketing service keep their own SQLite file (``--services``):
every model call and every tool invocation is a row, and the ticketing service honours
idempotency keys (one ticket and one side-effect row per key). The crash tests read
those tables, not anything the child claims.

Crash switches: ``--die-after N`` SIGKILLs the process right after the Nth event append;
``--die-in tool`` SIGKILLs inside the tool after its side effect, before it returns;
``--die-in model`` SIGKILLs inside the model call after it was made (and counted),
before the journal records its completion; ``--die-in-call K`` SIGKILLs inside the Kth
service invocation (model or tool, rate-limited or not) after its effect, noting in the
``kills`` table what it was doing.

The store URL comes from ``ARES_STORE_URL`` (never argv). On a normal exit the child
prints one JSON line: outcome, status and the journal's stats.

    python tests/children/journal_child.py --services S.db --run-id RUN [--die-after N]
        [--die-in tool|model] [--die-in-call K] [--flow basic|interrupt|retry|long]
        [--mode reconcile|idempotent|none]

Exit status 0 when the loop returned (completed or paused), 3 when it stopped on an
in-doubt tool call (``InDoubtToolCall``; the JSON line says so).
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

from ares_events.agents.journal import InDoubtToolCall, Journal, ModelReply
from ares_events.chain import canonical_json
from ares_events.stores import open_store

CODE_REVISION = "child-rev-1"
PROMPT_HASH = "child-prompt-1"

RATE_LIMITS = 2
"""flow=retry: RateLimited errors the model gives for each prompt before answering."""
WEATHER_ATTEMPTS = 2
"""flow=retry: the loop gives up on the weather tool after this many attempts."""
EXIT_IN_DOUBT = 3
LONG_STEPS = 400
"""flow=long: state patches, one per step, then complete (a run that is busy appending)."""

SERVICES_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS model_calls (run TEXT, messages_hash TEXT, content TEXT)",
    "CREATE TABLE IF NOT EXISTS rate_limited (run TEXT, messages_hash TEXT, content TEXT)",
    "CREATE TABLE IF NOT EXISTS tool_invocations (run TEXT, key TEXT)",
    "CREATE TABLE IF NOT EXISTS tickets (key TEXT PRIMARY KEY, run TEXT, title TEXT)",
    "CREATE TABLE IF NOT EXISTS side_effects (key TEXT, run TEXT, title TEXT)",
    "CREATE TABLE IF NOT EXISTS lost_answers (key TEXT, run TEXT)",
    "CREATE TABLE IF NOT EXISTS kills (run TEXT, what TEXT, detail TEXT)",
)


class RateLimited(Exception):
    """HTTP 429 from the fake model: nothing was paid; try again later."""


class GatewayTimeout(Exception):
    """The fake gateway timed out after the side effect landed: the answer is lost."""


class ServiceDown(Exception):
    """The fake weather service is down (no side effect)."""


class Killer:
    """Counts service invocations; SIGKILLs this process inside the Kth one (0: never),
    after noting in the ``kills`` table what it was doing."""

    def __init__(self, services: str, run: str, k: int = 0) -> None:
        self.services, self.run, self.k, self.n = services, run, k, 0

    def tick(self, what: str, detail: str) -> None:
        """Called inside an invocation, after its effect: die if this is the Kth."""
        self.n += 1
        if self.k and self.n == self.k:
            with services_db(self.services) as c:
                c.execute("INSERT INTO kills VALUES (?, ?, ?)", (self.run, what, detail))
            die()


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


def answer_text(content: str) -> str:
    """The fake model's (deterministic) answer to a last message ``content``."""
    return "answer-" + blake3.blake3(content.encode()).hexdigest()[:8]


class FakeLLM:
    """Deterministic completions; every paid call is a row in ``model_calls``. With
    ``rate_limits`` it first answers each prompt that many times with ``RateLimited``
    (rows in ``rate_limited``; nothing paid), counting across processes."""

    def __init__(
        self,
        services: str,
        run: str,
        *,
        die_inside: bool = False,
        rate_limits: int = 0,
        killer: Killer | None = None,
    ) -> None:
        self.services, self.run, self.die_inside = services, run, die_inside
        self.rate_limits, self.killer = rate_limits, killer

    def __call__(self, messages: Any, params: Mapping[str, Any]) -> ModelReply:
        content = str(messages[-1]["content"])
        mh = messages_hash(messages)
        with services_db(self.services) as c:
            limited = c.execute(
                "SELECT count(*) FROM rate_limited WHERE run = ? AND messages_hash = ?",
                (self.run, mh),
            ).fetchone()[0]
            table = "rate_limited" if limited < self.rate_limits else "model_calls"
            c.execute(f"INSERT INTO {table} VALUES (?, ?, ?)", (self.run, mh, content))
        if self.killer is not None:
            self.killer.tick("rate_limited" if table == "rate_limited" else "model", content)
        if table == "rate_limited":
            raise RateLimited(f"429 Too Many Requests (retry after {limited + 1}s)")
        if self.die_inside:
            die()  # the call was made and paid for; its answer is lost
        prompt = 10 + len(content) // 4
        return ModelReply(
            {"text": answer_text(content)},
            {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5},
        )


class FakeTicketing:
    """Creates tickets and sends notifications, honouring idempotency keys; logs every
    invocation. With ``lose_first`` the first invocation of each key loses its answer
    after the side effect (``GatewayTimeout``). ``weather`` is always down."""

    def __init__(
        self,
        services: str,
        run: str,
        *,
        die_inside: bool = False,
        lose_first: bool = False,
        killer: Killer | None = None,
    ) -> None:
        self.services, self.run, self.die_inside = services, run, die_inside
        self.lose_first, self.killer = lose_first, killer

    def _effect(self, key: str, title: str) -> bool:
        """Apply the side effect for ``key`` once; True when this invocation is the
        key's first (so its answer may be lost)."""
        with services_db(self.services) as c:
            c.execute("INSERT INTO tool_invocations VALUES (?, ?)", (self.run, key))
            c.execute("BEGIN IMMEDIATE")
            first = c.execute("SELECT 1 FROM tickets WHERE key = ?", (key,)).fetchone() is None
            if first:
                c.execute("INSERT INTO tickets VALUES (?, ?, ?)", (key, self.run, title))
                c.execute("INSERT INTO side_effects VALUES (?, ?, ?)", (key, self.run, title))
                if self.lose_first:
                    c.execute("INSERT INTO lost_answers VALUES (?, ?)", (key, self.run))
            c.execute("COMMIT")
        if self.killer is not None:
            self.killer.tick("tool", key)
        if self.die_inside:
            die()  # the side effect landed; the reply never reaches the journal
        return first

    def create(self, args: Any, key: str) -> dict[str, Any]:
        """Create the ticket for ``key`` unless it exists (then return that one)."""
        if self._effect(key, args["title"]) and self.lose_first:
            raise GatewayTimeout(f"504 Gateway Timeout (request {key})")
        return {"ticket": key, "title": args["title"]}

    def notify(self, args: Any, key: str) -> dict[str, Any]:
        """Send a notification for ``key`` unless it was sent."""
        if self._effect(key, f"notify: {args['text']}") and self.lose_first:
            raise GatewayTimeout(f"504 Gateway Timeout (request {key})")
        return {"sent": key}

    def weather(self, args: Any, key: str) -> dict[str, Any]:
        """The weather service, which is down (no side effect)."""
        with services_db(self.services) as c:
            c.execute("INSERT INTO tool_invocations VALUES (?, ?)", (self.run, key))
        if self.killer is not None:
            self.killer.tick("weather", key)
        raise ServiceDown(f"503 weather service unavailable for {args['city']}")

    def lookup(self, key: str) -> tuple[bool, Any]:
        """Reconciler: did a call with this key land? (and its result if so)."""
        with services_db(self.services) as c:
            row = c.execute("SELECT title FROM tickets WHERE key = ?", (key,)).fetchone()
        if row is None:
            return False, None
        if str(row[0]).startswith("notify: "):
            return True, {"sent": key}
        return True, {"ticket": key, "title": row[0]}


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


def second_messages(c1: Any, ticket: Any, weather: str | None = None) -> list[dict[str, str]]:
    """The messages of the second model call, built from the earlier answers."""
    extra = f" Weather: {weather}." if weather is not None else ""
    return [
        *first_messages(),
        {"role": "assistant", "content": c1["text"]},
        {"role": "user", "content": f"Ticket {ticket['ticket']} is filed.{extra} Conclude."},
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


def retrying(journal: Journal, call: Any, retry_on: type[Exception], limit: int = 5) -> Any:
    """``call()`` again while it raises ``retry_on``, up to ``limit`` attempts of the step
    (counted by the journal, so the budget survives a restart)."""
    while True:
        try:
            return call()
        except retry_on:
            if journal.attempt >= limit:
                raise


def run_retry_loop(journal: Journal, llm: Any, tickets: FakeTicketing, *, mode: str) -> str:
    """flow=retry: the rate-limited model, tools that lose answers, a tool that is down."""
    opts: dict[str, Any] = {
        "reconcile": tickets.lookup if mode == "reconcile" else None,
        "idempotent": mode == "idempotent",
    }
    c1 = retrying(
        journal,
        lambda: journal.model_call(first_messages(), {"temperature": 0}, call=llm),
        RateLimited,
    )
    title = ticket_title(c1)
    ticket = retrying(
        journal,
        lambda: journal.tool_call("create_ticket", {"title": title}, call=tickets.create, **opts),
        GatewayTimeout,
    )
    journal.patch("ticket", ticket["ticket"])
    try:
        weather = retrying(
            journal,
            lambda: journal.tool_call("weather", {"city": "Oslo"}, call=tickets.weather, **opts),
            ServiceDown,
            limit=WEATHER_ATTEMPTS,
        )
    except ServiceDown as exc:
        weather = f"unknown ({type(exc).__name__}: {exc})"
    msgs = second_messages(c1, ticket, weather)
    c2 = retrying(
        journal, lambda: journal.model_call(msgs, {"temperature": 0}, call=llm), RateLimited
    )
    note = retrying(
        journal,
        lambda: journal.tool_call("notify", {"text": c2["text"]}, call=tickets.notify, **opts),
        GatewayTimeout,
    )
    journal.complete({"answer": c2["text"], "ticket": ticket["ticket"], "sent": note["sent"]})
    return "completed"


def expected_retry_result(run_id: str) -> dict[str, Any]:
    """What a flow=retry run completes with, whatever crashes it went through."""
    c1 = {"text": answer_text(first_messages()[-1]["content"])}
    ticket = {"ticket": f"{run_id}:2"}
    weather = "unknown (ServiceDown: 503 weather service unavailable for Oslo)"
    c2 = answer_text(second_messages(c1, ticket, weather)[-1]["content"])
    return {"answer": c2, "ticket": f"{run_id}:2", "sent": f"{run_id}:6"}


def run_once(
    url: str,
    services: str,
    run_id: str,
    *,
    die_after: int = 0,
    die_in: str | None = None,
    die_in_call: int = 0,
    flow: str = "basic",
    mode: str = "reconcile",
    snapshot_every: int = 2,
) -> dict[str, Any]:
    """Open (or resume) the run and drive its loop once; the JSON-ready outcome."""
    store = open_store(url)
    try:
        target: Any = KillAfterAppends(store, die_after) if die_after else store
        journal = Journal(
            target,
            run_id,
            code_revision=CODE_REVISION,
            prompt_hash=PROMPT_HASH,
            snapshot_every=snapshot_every,
        )
        killer = Killer(services, run_id, die_in_call)
        retry = flow == "retry"
        llm = FakeLLM(
            services,
            run_id,
            die_inside=die_in == "model",
            rate_limits=RATE_LIMITS if retry else 0,
            killer=killer,
        )
        tickets = FakeTicketing(
            services, run_id, die_inside=die_in == "tool", lose_first=retry, killer=killer
        )
        try:
            if retry:
                outcome = run_retry_loop(journal, llm, tickets, mode=mode)
            elif flow == "long":
                for i in range(LONG_STEPS):
                    journal.patch("i", i)
                journal.complete()
                outcome = "completed"
            else:
                outcome = run_loop(journal, llm, tickets, mode=mode, flow=flow)
        except InDoubtToolCall as exc:
            outcome = "in_doubt"
            return {"outcome": outcome, "status": journal.status, "step": exc.step, "key": exc.key}
        return {
            "outcome": outcome,
            "status": journal.status,
            "recovered_from": journal.recovered_from,
            "stats": dataclasses.asdict(journal.stats),
        }
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    """Run (or resume) the journaled run once; see the module docstring."""
    p = argparse.ArgumentParser(prog="journal_child")
    p.add_argument("--services", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--die-after", type=int, default=0)
    p.add_argument("--die-in", choices=("tool", "model"), default=None)
    p.add_argument("--flow", choices=("basic", "interrupt", "retry", "long"), default="basic")
    p.add_argument("--mode", choices=("reconcile", "idempotent", "none"), default="reconcile")
    p.add_argument("--snapshot-every", type=int, default=2)
    p.add_argument("--die-in-call", type=int, default=0)
    args = p.parse_args(argv)
    out = run_once(
        os.environ["ARES_STORE_URL"],
        args.services,
        args.run_id,
        die_after=args.die_after,
        die_in=args.die_in,
        die_in_call=args.die_in_call,
        flow=args.flow,
        mode=args.mode,
        snapshot_every=args.snapshot_every,
    )
    print(json.dumps(out))
    return EXIT_IN_DOUBT if out["outcome"] == "in_doubt" else 0


if __name__ == "__main__":
    sys.exit(main())
