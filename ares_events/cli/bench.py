"""``ares-events bench``: a quick measurement of the configured store on this machine."""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
from rich.table import Table

from ares_events.cli.common import EXIT_FINDINGS, EXIT_OK, App, add_columns, cli, json_app, text
from ares_events.core.events import NewEvent
from ares_events.core.store import EventStore
from ares_events.projections.recovery import replay

__all__ = ["BenchResult", "run_bench"]


def _event(i: int) -> NewEvent:
    # About 300 bytes of canonical JSON, shaped like a tool result.
    payload = {
        "step": i,
        "call_id": f"call_{i:012x}",
        "tool": "search.web",
        "args": {"query": "durable agent execution write-ahead log", "top_k": 5},
        "ok": True,
        "tokens": {"prompt": 1200 + i % 100, "completion": 180 + i % 50},
        "summary": "agents are disposable; their history is not " * 3,
    }
    return NewEvent(type="tool.result", module="bench", payload=payload)


@dataclass(slots=True)
class BenchResult:
    """Rates and latencies measured by :func:`run_bench`."""

    store: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, events: int, seconds: float, **extra: Any) -> None:
        rate = round(events / seconds) if seconds > 0 else None
        row = {"workload": name, "events": events, "seconds": round(seconds, 4)}
        self.rows.append({**row, "events_per_s": rate, **extra})

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "workloads": self.rows}


def run_bench(
    store: EventStore, *, events: int = 2000, progress: Callable[[str], None] | None = None
) -> BenchResult:
    """Measure single appends, 100-event batches and a verified replay on ``store``."""
    tag = uuid.uuid4().hex[:8]
    res = BenchResult(store.url)
    say = progress or (lambda _m: None)

    singles = max(10, events // 20)
    sid = f"bench-{tag}-single"
    lat = []
    t0 = time.perf_counter()
    for i in range(singles):
        s = time.perf_counter()
        store.append(sid, [_event(i)])
        lat.append(time.perf_counter() - s)
    elapsed, p50_ms = time.perf_counter() - t0, round(statistics.median(lat) * 1000, 3)
    res.add("1-event appends (one transaction each)", singles, elapsed, p50_ms=p50_ms)
    say(f"{singles} single appends done")

    sid = f"bench-{tag}-batch"
    batches = max(1, events // 100)
    t0 = time.perf_counter()
    for b in range(batches):
        store.append(sid, [_event(b * 100 + j) for j in range(100)])
    res.add("100-event batches", batches * 100, time.perf_counter() - t0)
    say(f"{batches} batches done")

    def fold(state: int, e: Any) -> int:
        return state + (1 if e.payload.get("ok") else 0)

    t0 = time.perf_counter()
    r = replay(store, sid, fold, 0, max_replay=batches * 100 + 1)
    res.add("replay: read + verify chain + fold", r.replayed, time.perf_counter() - t0, ok=r.ok)
    t0 = time.perf_counter()
    tail = list(store.read(sid, from_version=max(1, batches * 100 - 99)))
    res.add("read the last 100 events", len(tail), time.perf_counter() - t0)
    return res


@cli.command(name="bench")
@click.option(
    "--events",
    type=click.IntRange(100, 10_000_000),
    default=2000,
    show_default=True,
    help="Events to append in 100-event batches (single appends: a twentieth of it).",
)
@json_app
def bench_cmd(app: App, events: int, as_json: bool) -> int:
    """Measure appends and a verified replay on the configured store, here and now.

    Writes to fresh streams named bench-<random>-... (never an agent's stream). For the
    side-by-side comparison with the eventsourcing library, run the scripts in the
    repository's bench/ folder (see docs/performance.md).

    \b
    Example:
      ares-events --store sqlite:///scratch.db bench
      ares-events --store postgresql://app@db/agents bench --events 10000 --json
    """
    with app.open(create=True) as store:
        result = run_bench(store, events=events, progress=None if as_json else app.note)
    chain_ok = all(row.get("ok", True) for row in result.rows)
    if as_json:
        return app.json(result.to_dict(), chain_ok)
    table = Table(title=text(f"bench on {result.store}"), title_justify="left")
    numbers = ("events", "seconds", "events/s")
    add_columns(table, "workload", *numbers, "note", right=numbers)
    for row in result.rows:
        note = ""
        if "p50_ms" in row:
            note = f"p50 {row['p50_ms']} ms"
        elif "ok" in row:
            note = "chain ok" if row["ok"] else "CHAIN FINDINGS"
        rate = f"{row['events_per_s']:,}" if row["events_per_s"] else "-"
        table.add_row(row["workload"], str(row["events"]), f"{row['seconds']:.3f}", rate, note)
    app.table(table)
    return EXIT_OK if chain_ok else EXIT_FINDINGS
