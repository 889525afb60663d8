"""The kill -9 resurrection demo behind ``ares-events demo``: the driver, the fake LLM and
ticketing service, and the agents a :class:`~ares_events.agents.supervision.ProcessSupervisor`
brings back until all finish (docs/cli.md tells the story and the report).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3

from ares_events.agents.journal import Journal, ModelReply
from ares_events.agents.run_info import RunCounts
from ares_events.agents.runs import inspect_run
from ares_events.agents.supervision import ProcessSupervisor, heartbeat
from ares_events.chain import canonical_json
from ares_events.core.events import parse_at
from ares_events.core.recorder import backend_of
from ares_events.errors import ConfigError
from ares_events.integrity.verify import verify_stream
from ares_events.stores import Capability
from ares_events.stores.settings import Settings

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

__all__ = ["DemoReport", "run_demo"]

SERVICES_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS llm_calls (agent TEXT, messages_hash TEXT, tokens INTEGER, "
    "at REAL)",
    "CREATE TABLE IF NOT EXISTS tickets (key TEXT PRIMARY KEY, agent TEXT, title TEXT, at REAL)",
    "CREATE TABLE IF NOT EXISTS side_effects (key TEXT, agent TEXT, title TEXT, at REAL)",
    "CREATE TABLE IF NOT EXISTS rate_limits (agent TEXT, messages_hash TEXT, at REAL)",
    "CREATE TABLE IF NOT EXISTS lost_answers (key TEXT, agent TEXT, at REAL)",
    "CREATE TABLE IF NOT EXISTS incarnations (agent TEXT, instance TEXT, ready_s REAL, "
    "model_from_log INTEGER, tokens_from_log INTEGER, model_made INTEGER, "
    "tools_from_log INTEGER, tools_reconciled INTEGER, recovered_from TEXT, "
    "PRIMARY KEY (agent, instance))",
)


@contextlib.contextmanager
def _db(path: str) -> Iterator[sqlite3.Connection]:
    with contextlib.closing(sqlite3.connect(path, timeout=30, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")
        yield conn


class RateLimited(Exception):
    """The fake LLM's HTTP 429: nothing was paid; try again after a moment."""


class GatewayTimeout(Exception):
    """The fake ticketing gateway timed out after the ticket was created."""


def _share(digest: str) -> int:
    """0, 1 or 2, evenly, from a hex digest: how often a prompt is rate-limited, and
    (0) whether a ticket's first answer is lost."""
    return int(digest[:8], 16) % 3


class FakeLLM:
    """Deterministic completions; every paid call (and its tokens) is counted. A third of
    the prompts get one rate limit, a third two, before an answer (counted, not paid)."""

    def __init__(self, path: str, agent: str, latency: float) -> None:
        self.path, self.agent, self.latency = path, agent, latency

    def __call__(self, messages: Any, params: Any) -> ModelReply:
        time.sleep(self.latency)
        text = str(messages[-1]["content"])
        digest = blake3.blake3(text.encode()).hexdigest()[:16]
        tokens = 40 + len(text) // 4
        mh = blake3.blake3(canonical_json(messages)).hexdigest()
        with _db(self.path) as c:
            limited = c.execute(
                "SELECT count(*) FROM rate_limits WHERE agent = ? AND messages_hash = ?",
                (self.agent, mh),
            ).fetchone()[0]
            if limited < _share(digest):
                c.execute("INSERT INTO rate_limits VALUES (?, ?, ?)", (self.agent, mh, time.time()))
                raise RateLimited("429 Too Many Requests")
            c.execute(
                "INSERT INTO llm_calls VALUES (?, ?, ?, ?)", (self.agent, mh, tokens, time.time())
            )
        return ModelReply(
            {"text": f"finding {digest}"},
            {"prompt_tokens": tokens - 20, "completion_tokens": 20, "total_tokens": tokens},
        )


class FakeTicketing:
    """Creates tickets; honours idempotency keys; records every call that reached it. The
    first call for a third of the keys loses its answer after creating the ticket."""

    def __init__(self, path: str, agent: str, latency: float) -> None:
        self.path, self.agent, self.latency = path, agent, latency

    def create(self, args: Any, key: str) -> dict[str, Any]:
        """Create a ticket unless one with this key exists (then return it).

        Raises:
            GatewayTimeout: (first call of some keys) the ticket exists, the answer is lost.
        """
        lost = False
        with _db(self.path) as c:
            c.execute("BEGIN IMMEDIATE")
            row = c.execute("SELECT key FROM tickets WHERE key = ?", (key,)).fetchone()
            now = time.time()
            ticket = (key, self.agent, args["title"], now)
            # Every call that reached the service counts, the ones its key made harmless
            # too: the demo's duplicates are the journal's, not only the service's.
            c.execute("INSERT INTO side_effects VALUES (?, ?, ?, ?)", ticket)
            if row is None:
                c.execute("INSERT INTO tickets VALUES (?, ?, ?, ?)", ticket)
                lost = _share(blake3.blake3(key.encode()).hexdigest()) == 0
                if lost:
                    c.execute("INSERT INTO lost_answers VALUES (?, ?, ?)", (key, self.agent, now))
            c.execute("COMMIT")
        time.sleep(self.latency)  # the reply travels back slowly: a window for kill -9
        if lost:
            raise GatewayTimeout(f"504 Gateway Timeout (request {key})")
        return {"ticket": key}

    def lookup(self, key: str) -> tuple[bool, Any]:
        """Reconciliation: did a call with this key land?"""
        with _db(self.path) as c:
            row = c.execute("SELECT key FROM tickets WHERE key = ?", (key,)).fetchone()
        return (row is not None, {"ticket": key} if row else None)


def _open_from_env() -> EventStore:
    """Open the store the driver configured in the environment (as any ares-events process)."""
    settings = Settings.from_env()
    if not settings.store_url:
        raise SystemExit("ARES_STORE_URL is not set (the demo driver sets it)")
    return settings.open_store()  # type: ignore[no-any-return]


def _retrying(journal: Journal, call: Any, retry_on: type[Exception], limit: int = 8) -> Any:
    """The retry loop every agent has: call again (same step, same idempotency key) after
    a short backoff, which a replayed failure skips."""
    while True:
        try:
            return call()
        except retry_on:
            if journal.attempt >= limit:
                raise
            if not journal.replaying:
                time.sleep(0.005 * journal.attempt)


def agent_main(args: argparse.Namespace) -> int:
    """One agent incarnation: recover the run, replay answered steps, finish the task."""
    agent_id = os.environ.get("ARES_AGENT_ID", args.agent_id)
    instance = os.environ.get("ARES_INSTANCE_ID", "i-manual")
    hb = os.environ.get("ARES_HEARTBEAT_FILE")
    store = _open_from_env()
    llm = FakeLLM(args.services, agent_id, args.latency)
    tickets = FakeTicketing(args.services, agent_id, args.latency)
    journal = Journal(
        store,
        f"run-{agent_id}",
        code_revision="demo-1",
        prompt_hash="p-1",
        snapshot_every=args.snapshot_every,
    )
    ready = journal.stats.resume_seconds

    def ledger() -> None:
        s = journal.stats
        counts = (s.model_calls_from_log, s.tokens_from_log, s.model_calls_made)
        row = (*counts, s.tool_calls_from_log, s.tool_calls_reconciled, journal.recovered_from)
        with _db(args.services) as c:
            sql = "INSERT OR REPLACE INTO incarnations VALUES (?,?,?,?,?,?,?,?,?)"
            c.execute(sql, (agent_id, instance, ready, *row))

    ledger()
    summary = "nothing yet"
    for i in range(1, args.rounds + 1):
        if hb:
            heartbeat(hb)
        question = f"{agent_id}: topic part {i}; so far: {summary}"
        msgs = [
            {"role": "system", "content": "You are a careful research agent."},
            {"role": "user", "step": i, "content": question},
        ]
        ask = functools.partial(journal.model_call, msgs, {"temperature": 0}, call=llm)
        completion = _retrying(journal, ask, RateLimited)
        summary = completion["text"]
        file_ticket = functools.partial(
            journal.tool_call,
            "create_ticket",
            {"title": f"{agent_id} finding {i}"},
            call=tickets.create,
            reconcile=tickets.lookup,
        )
        _retrying(journal, file_ticket, GatewayTimeout)
        journal.patch("progress", i)
        ledger()
    journal.complete({"summary": summary})
    ledger()
    store.close()
    return 0


def supervise_main(args: argparse.Namespace) -> int:
    """The supervisor process: start or resurrect every agent, run until all finish."""
    store = _open_from_env()
    work = Path(args.services).parent
    sup = ProcessSupervisor(
        store,
        heartbeat_dir=work / f"{Path(args.services).stem}.heartbeats" / args.run,
        heartbeat_timeout=10.0,
        max_restarts=50,
        backoff_base=0.05,
        backoff_cap=1.0,
    )
    shared = {k: getattr(args, k) for k in ("services", "rounds", "latency", "snapshot_every")}
    for n in range(args.agents):
        agent_id = f"{args.run}-agent-{n:02d}"
        sup.register(agent_id, _argv("agent", agent_id=agent_id, **shared))
    sup.start()
    ok = sup.run(timeout=args.timeout)
    store.close()
    return 0 if ok else 1


@dataclass(slots=True)
class AgentReport:
    """Per-agent outcome of the demo."""

    agent: str
    finished: bool
    counts: RunCounts
    """The numbers of the agent's run, as ``runs show`` gives them."""
    model_calls_made: int
    model_calls_answered_from_log: int
    tokens_saved: int
    reissued_model_calls: int
    tool_side_effects: int
    duplicate_side_effects: int
    rate_limits_absorbed: int
    lost_answers_absorbed: int
    recovery_ms: float | None
    """Median time an incarnation took to recover the run from its log."""
    chain_ok: bool
    events: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = {k: getattr(self, k) for k in self.__slots__}
        d["counts"] = self.counts.to_dict()
        return d


@dataclass(slots=True)
class DemoReport:
    """What ``ares-events demo`` prints."""

    run: str
    store: str
    kills: int
    kill_points: list[int]
    seconds: float
    agents: list[AgentReport] = field(default_factory=list)

    @property
    def all_finished(self) -> bool:
        """Every agent completed its task."""
        return bool(self.agents) and all(a.finished for a in self.agents)

    def totals(self) -> dict[str, int]:
        """Sums over agents."""
        return {
            "duplicate_side_effects": sum(a.duplicate_side_effects for a in self.agents),
            "reissued_model_calls": sum(a.reissued_model_calls for a in self.agents),
            "model_calls_saved": sum(a.model_calls_answered_from_log for a in self.agents),
            "tokens_saved": sum(a.tokens_saved for a in self.agents),
            "model_calls_made": sum(a.model_calls_made for a in self.agents),
            "recoveries": sum(a.counts.recoveries for a in self.agents),
            "rate_limits_absorbed": sum(a.rate_limits_absorbed for a in self.agents),
            "lost_answers_absorbed": sum(a.lost_answers_absorbed for a in self.agents),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form with the required keys."""
        return {
            "run": self.run,
            "store": self.store,
            "all_finished": self.all_finished,
            "kills": self.kills,
            "kill_points": self.kill_points,
            "seconds": round(self.seconds, 2),
            **self.totals(),
            "all_chains_ok": all(a.chain_ok for a in self.agents),
            "agents": [a.to_dict() for a in self.agents],
        }


def _events_so_far(store: Any, run: str, agents: int) -> int:
    return sum(store.stream_version(f"run-{run}-agent-{n:02d}") for n in range(agents))


def _argv(role: str, **options: object) -> list[str]:
    opts = [x for k, v in options.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    return [sys.executable, "-m", "ares_events.agents.resurrection", role, *opts]


def run_demo(
    store_url: str,
    *,
    blobs_url: str | None = None,
    agents: int = 10,
    rounds: int = 12,
    kills: int = 3,
    seed: int = 7,
    latency: float = 0.01,
    snapshot_every: int = 20,
    timeout: float = 120.0,
    progress: Any = None,
) -> DemoReport:
    """Run the whole story and compute the report from the services' own tables.

    Raises:
        ConfigError: the store cannot be shared by several processes (``memory://``).
    """
    started = time.perf_counter()
    rng = random.Random(seed)
    run = f"demo{int(time.time())}{rng.randrange(1000):03d}"
    # Every process of the demo is configured like any ares-events process: through the
    # environment (URL, blob store, cache, chain key). The URL never travels in argv.
    env = dict(os.environ, ARES_STORE_URL=store_url)
    if blobs_url:
        env["ARES_BLOBS_URL"] = blobs_url
    store = Settings.from_env(env).open_store()
    needed = {Capability.PERSISTENT, Capability.MULTI_PROCESS}
    if not needed <= store.capabilities:
        store.close()
        raise ConfigError(
            f"the kill -9 demo runs agents as separate processes: {store.url} is not a store "
            "several processes can share (use a SQLite file or PostgreSQL)"
        )
    base = Path(getattr(backend_of(store.recorder), "path", None) or Path.cwd() / "ares-events.db")
    services = str(base.parent / f"{base.stem}.demo-services.db")
    with _db(services) as c:
        for stmt in SERVICES_SCHEMA:
            c.execute(stmt)
    sizes = {"agents": agents, "rounds": rounds, "snapshot_every": snapshot_every}
    cmd = _argv("supervise", services=services, run=run, latency=latency, timeout=timeout, **sizes)
    total = agents * (2 + rounds * 7)  # plus failed attempts: rate limits and lost answers
    points = sorted(rng.randrange(total // 10, total * 9 // 10) for _ in range(kills))
    done_kills = 0
    for point in points:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, env=env)  # noqa: S603 - our own argv
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _events_so_far(store, run, agents) >= point:
                break
            time.sleep(0.005)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: supervisor and agents
            done_kills += 1
        proc.wait()
        if progress is not None:
            progress(f"kill -9 #{done_kills} at ~{_events_so_far(store, run, agents)} events")
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, env=env)  # noqa: S603 - our own argv
    try:
        proc.wait(timeout + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with _db(services) as c:
        reports = [_agent_report(store, c, f"{run}-agent-{n:02d}") for n in range(agents)]
    report = DemoReport(run, store.url, done_kills, points, time.perf_counter() - started, reports)
    store.close()
    return report


def _agent_report(store: Any, c: sqlite3.Connection, agent: str) -> AgentReport:
    run_stream = f"run-{agent}"
    # A re-issued call is an LLM call for messages whose answer was already in the log.
    hash_of_step: dict[int, str] = {}
    responded: dict[str, float] = {}
    events = 0
    for e in store.read(run_stream):
        events += 1
        if e.type == "model.call.requested":
            hash_of_step[int(e.payload["step"])] = e.payload["messages_hash"]
        elif e.type == "model.responded":
            responded[hash_of_step[int(e.payload["step"])]] = parse_at(e.at).timestamp()
    info = inspect_run(store, run_stream, requests=False)

    def rows(sql: str) -> list[Any]:  # every query is about this agent
        return c.execute(sql, (agent,)).fetchall()

    calls = rows("SELECT messages_hash, at FROM llm_calls WHERE agent = ?")
    reissued = sum(1 for mh, at in calls if mh in responded and at > responded[mh])
    effects = rows("SELECT title, count(*) FROM side_effects WHERE agent = ? GROUP BY title")
    inc = rows(
        "SELECT ready_s, model_from_log, tokens_from_log, model_made, recovered_from "
        "FROM incarnations WHERE agent = ?"
    )
    recovered = [r for r in inc if r[4] != "empty"]
    return AgentReport(
        agent=agent,
        finished=info.status == "completed",
        counts=info.counts,
        model_calls_made=len(calls),
        model_calls_answered_from_log=sum(r[1] for r in inc),
        tokens_saved=sum(r[2] for r in inc),
        reissued_model_calls=reissued,
        tool_side_effects=sum(n for _, n in effects),
        duplicate_side_effects=sum(n - 1 for _, n in effects if n > 1),
        rate_limits_absorbed=rows("SELECT count(*) FROM rate_limits WHERE agent = ?")[0][0],
        lost_answers_absorbed=rows("SELECT count(*) FROM lost_answers WHERE agent = ?")[0][0],
        recovery_ms=(
            round(statistics.median(r[0] for r in recovered) * 1000, 1) if recovered else None
        ),
        chain_ok=verify_stream(store, run_stream).ok and verify_stream(store, agent).ok,
        events=events,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the agent and supervisor roles (``python -m ...resurrection``)."""
    p = argparse.ArgumentParser(prog="python -m ares_events.agents.resurrection")
    sub = p.add_subparsers(dest="role", required=True)
    for role in ("agent", "supervise"):
        s = sub.add_parser(role)
        s.add_argument("--services", required=True)
        s.add_argument("--rounds", type=int, default=12)
        s.add_argument("--latency", type=float, default=0.01)
        s.add_argument("--snapshot-every", type=int, default=20)
        if role == "agent":
            s.add_argument("--agent-id", default="agent")
        else:
            s.add_argument("--run", required=True)
            s.add_argument("--agents", type=int, default=10)
            s.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    return agent_main(args) if args.role == "agent" else supervise_main(args)


if __name__ == "__main__":
    sys.exit(main())
