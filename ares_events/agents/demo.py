"""The demo behind ``ares-events demo --simple``: simulated agents taking turns, each
appending its life write-ahead to its own stream ``demo-<run>-agent-NN`` (a new run id
every run; ``seed`` fixes the events' content), then every chain verified (docs/cli.md).
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ares_events.core.events import NO_STREAM, NewEvent
from ares_events.core.faces import blocking
from ares_events.core.store import EventStore
from ares_events.errors import ConfigError
from ares_events.integrity.findings import Finding
from ares_events.integrity.verify import verify_stream

__all__ = ["DemoResult", "DemoStream", "new_run_id", "run_demo"]

MIN_EVENTS = 8
"""Fewest events per agent: the fixed lifecycle plus one model round trip."""

_MODELS = ("gpt-4o-mini", "claude-3-5-haiku", "llama-3.1-70b")
_TOOLS: dict[str, tuple[str, tuple[str, ...]]] = {  # tool -> (its argument, values to pick)
    "web.search": ("query", ("event sourcing hash chain", "sqlite wal fsync", "agent recovery")),
    "fs.read": ("path", ("/data/report.md", "/data/tickets.csv", "/data/ledger.json")),
    "python.exec": ("code", ("sum(range(10))", "len(rows)", "sorted(tags)[:3]")),
    "http.get": ("url", ("https://example.com/status", "https://example.com/api/items?page=2")),
    "sql.query": ("sql", ("SELECT count(*) FROM tickets", "SELECT id FROM invoices WHERE open")),
}
_TASKS = (
    "summarise the incident report",
    "triage new support tickets",
    "reconcile the invoice ledger",
    "draft the release notes",
    "audit the access logs",
)


@dataclass(frozen=True, slots=True)
class DemoStream:
    """One simulated agent's stream after the run."""

    stream_id: str
    version: int
    events: int
    ok: bool
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = {k: getattr(self, k) for k in self.__slots__}
        d["findings"] = [f.to_dict() for f in self.findings]
        return d


@dataclass(frozen=True, slots=True)
class DemoResult:
    """Outcome of :func:`run_demo`."""

    run_id: str
    agents: int
    events: int
    streams: list[DemoStream]
    append_seconds: float
    verify_seconds: float

    @property
    def all_ok(self) -> bool:
        """True when every stream verified clean."""
        return all(s.ok for s in self.streams)

    @property
    def append_rate(self) -> float:
        """Events appended per second."""
        return self.events / self.append_seconds if self.append_seconds > 0 else 0.0

    @property
    def verify_rate(self) -> float:
        """Events verified per second."""
        checked = sum(s.version for s in self.streams)
        return checked / self.verify_seconds if self.verify_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "run_id": self.run_id,
            "agents": self.agents,
            "events": self.events,
            "all_ok": self.all_ok,
            "append_seconds": round(self.append_seconds, 6),
            "verify_seconds": round(self.verify_seconds, 6),
            "append_events_per_second": round(self.append_rate, 1),
            "verify_events_per_second": round(self.verify_rate, 1),
            "streams": [s.to_dict() for s in self.streams],
        }


def new_run_id(store: EventStore, agents: int) -> str:
    """A short random run id whose agent streams do not exist in ``store`` yet."""
    store = blocking(store, "ares_events.agents.demo.new_run_id")
    while True:
        run_id = secrets.token_hex(3)
        if all(store.stream_version(stream_name(run_id, i)) == 0 for i in range(1, agents + 1)):
            return run_id


def stream_name(run_id: str, agent: int) -> str:
    """The stream id of agent number ``agent`` (1-based) in run ``run_id``."""
    return f"demo-{run_id}-agent-{agent:02d}"


def _agent_steps(rng: random.Random, run_id: str, agent: int, n: int) -> Iterator[list[NewEvent]]:
    task_id = f"t-{run_id}-{agent:02d}"
    model = rng.choice(_MODELS)

    def ev(type_: str, module: str, **payload: Any) -> list[NewEvent]:
        meta = {"run": run_id, "agent": agent, "task_id": task_id}
        return [NewEvent(type=type_, module=module, payload=payload, metadata=meta)]

    user = f"user-{rng.randint(1, 99)}"
    yield ev("session.created", "runtime", session_id=f"s-{run_id}-{agent:02d}", user=user)
    yield ev("task.created", "runtime", task_id=task_id, title=rng.choice(_TASKS))
    instance = f"i-{rng.randint(1000, 9999)}"
    yield ev("agent.started", "runtime", instance_id=instance, model=model, attempt=1)
    left = n - 5  # 3 above, 2 at the end
    step = 0
    tokens = 0
    while left > 0:
        step += 1
        call = {"call_id": f"c-{step:04d}", "step": step}
        prompt = rng.randint(200, 4000)
        mh, params = f"{rng.getrandbits(128):032x}", {"model": model, "temperature": 0}
        yield ev("model.call.requested", "llm", **call, messages_hash=mh, params=params)
        left -= 1
        if left == 0:
            break
        tool = rng.choice(tuple(_TOOLS)) if left >= 4 and rng.random() < 0.7 else None
        completion = rng.randint(20, 600)
        tokens += prompt + completion
        finish = {"finish_reason": "tool_calls" if tool else "stop"}
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        latency = rng.randint(180, 4200)
        yield ev(
            "model.responded", "llm", **call, completion=finish, usage=usage, latency_ms=latency
        )
        left -= 1
        if tool is not None:
            arg, values = _TOOLS[tool]
            ids = {
                "idempotency_key": f"{run_id}-{agent:02d}:{step}",
                "tool_call_id": f"tc-{step:04d}",
            }
            args = {arg: rng.choice(values)}
            yield ev("tool.call.requested", "tools", **ids, name=tool, args=args)
            result = {"result": {"bytes": rng.randint(10, 20_000)}, "ok": rng.random() > 0.08}
            timing = {"duration_ms": rng.randint(3, 2500), "result_bytes": rng.randint(10, 20_000)}
            # The result and the state change it causes are recorded together.
            returned = ev("tool.returned", "tools", **ids, **result, **timing)
            yield returned + ev("state.patched", "runtime", key="step", value=step)
            left -= 3
        elif left > 0:
            yield ev("state.patched", "runtime", key="notes", value=f"step {step} done")
            left -= 1
    yield ev("task.completed", "runtime", task_id=task_id, steps=step, tokens=tokens)
    yield ev("agent.stopped", "runtime", reason="task completed", exit_code=0)


def run_demo(
    store: EventStore,
    *,
    agents: int = 5,
    events: int = 300,
    seed: int | None = None,
    run_id: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DemoResult:
    """Simulate ``agents`` agents (one stream each) appending about ``events`` events each
    (at least :data:`MIN_EVENTS`), then verify every stream. ``seed`` makes the content
    reproducible; ``run_id`` names the streams (default: a fresh unused one);
    ``progress(events_done, events_total)`` is called after each append.

    Raises:
        ConfigError: ``agents`` < 1 or ``events`` < :data:`MIN_EVENTS` (a ValueError).
        ConcurrencyError: someone else appended to one of the demo's new streams.
        StoreUnavailable: the store cannot be reached.
    """
    store = blocking(store, "ares_events.agents.demo.run_demo")
    if agents < 1:
        raise ConfigError(f"agents must be >= 1, got {agents}")
    if events < MIN_EVENTS:
        raise ConfigError(f"events must be >= {MIN_EVENTS}, got {events}")
    run_id = run_id or new_run_id(store, agents)
    rng = random.Random(seed)
    names = [stream_name(run_id, i) for i in range(1, agents + 1)]
    lives = {
        name: _agent_steps(random.Random(rng.random()), run_id, i, events)
        for i, name in enumerate(names, 1)
    }
    versions = dict.fromkeys(names, 0)
    total = agents * events
    done = 0
    t0 = time.perf_counter()
    while lives:
        for name in list(lives):
            batch = next(lives[name], None)
            if batch is None:
                del lives[name]
                continue
            # Write-ahead with optimistic concurrency: each append states the version the
            # agent last saw, so a second writer on the same stream would be refused.
            expected = versions[name] or NO_STREAM
            res = store.append(name, batch, expected_version=expected)
            versions[name] = res.version
            done += len(batch)
            if progress is not None:
                progress(done, total)
    append_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    reports = {name: verify_stream(store, name) for name in names}
    streams = [DemoStream(n, r.version, versions[n], r.ok, r.findings) for n, r in reports.items()]
    verify_seconds = time.perf_counter() - t1
    return DemoResult(run_id, agents, done, streams, append_seconds, verify_seconds)
