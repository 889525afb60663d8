"""Shared helpers for the benchmarks in ``bench/``.

* :func:`make_payloads`: deterministic ~300-byte JSON payloads shaped like an agent's
  tool-result events (ints, strings, a nested object, one non-ASCII word; no floats).
* :func:`interleave`: runs several systems' repetitions in alternating order (ABBA...)
  so that drift from other processes on the machine hits every system alike.
* :class:`Stats`: median / p90 of a list of samples.
* :func:`write_section`: replaces the text between ``<!-- bench:NAME:start -->`` and
  ``<!-- bench:NAME:end -->`` in ``docs/performance.md`` (appending the section when it
  is missing), so several benchmarks share one page.
* :func:`machine_description`: cores, CPU, Python, SQLite and library versions, date.

No timing thresholds live here or in tests: numbers are reported, never asserted.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import importlib.metadata
import math
import os
import platform
import random
import re
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "DOC_PATH",
    "PAYLOAD_TARGET_BYTES",
    "Stats",
    "Timing",
    "canonical_bytes",
    "fmt_ms",
    "fmt_rate",
    "fmt_ratio",
    "interleave",
    "machine_description",
    "make_payloads",
    "markdown_table",
    "timed",
    "write_section",
]

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
PAYLOAD_TARGET_BYTES = 300

_WORDS = (
    "agent", "tool", "search", "result", "page", "token", "model", "call", "retry",
    "budget", "plan", "step", "memory", "context", "window", "cache", "vector", "index",
    "query", "answer", "source", "citation", "draft", "review", "patch", "state",
    "resume", "snapshot", "chain", "verify", "event", "stream", "fold", "projection",
)  # fmt: skip
_TOOLS = ("web.search", "fs.read", "fs.write", "shell.run", "http.get", "db.query")


def canonical_bytes(payload: Any) -> bytes:
    """The payload's canonical JSON bytes (sorted keys, compact, UTF-8), the same bytes
    ares-events stores; used as the eventsourcing ``StoredEvent.state``."""
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)


def make_payloads(
    n: int, *, seed: int = 1, target: int = PAYLOAD_TARGET_BYTES
) -> list[dict[str, Any]]:
    """``n`` deterministic payloads whose canonical JSON is ``target`` bytes (+-2).

    Each has a ``tokens.completion`` int and an ``ok`` bool, which the benchmark folds
    count, so a fold has to decode the payload.
    """
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        p: dict[str, Any] = {
            "step": i,
            "call_id": f"call_{rng.getrandbits(48):012x}",
            "tool": _TOOLS[i % len(_TOOLS)],
            "args": {"query": " ".join(rng.choices(_WORDS, k=4)), "top_k": 5},
            "ok": i % 7 != 0,
            "tokens": {"prompt": rng.randrange(200, 8000), "completion": rng.randrange(1, 900)},
            "summary": "",
        }
        base = len(canonical_bytes(p))
        words: list[str] = ["résumé"]
        while len(" ".join(words).encode()) < target - base:
            words.append(rng.choice(_WORDS))
        text = " ".join(words)
        # trim to the exact size (ASCII tail, so byte and char lengths agree there)
        excess = len(text.encode()) - (target - base)
        p["summary"] = text[: len(text) - excess] if excess > 0 else text
        out.append(p)
    return out


@dataclass(frozen=True)
class Stats:
    """Summary of timing samples (seconds, or any unit)."""

    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: Iterable[float]) -> Stats:
        """Freeze a list of samples."""
        s = tuple(samples)
        if not s:
            raise ValueError("no samples")
        return cls(s)

    @property
    def median(self) -> float:
        """Median sample."""
        return statistics.median(self.samples)

    @property
    def p90(self) -> float:
        """90th percentile (nearest-rank)."""
        s = sorted(self.samples)
        return s[max(0, math.ceil(0.9 * len(s)) - 1)]

    @property
    def n(self) -> int:
        """Number of samples."""
        return len(self.samples)


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Run ``fn`` once with the garbage collector paused.

    Returns:
        (wall seconds, CPU seconds of this process, result). CPU time leaves out waiting
        for ``fsync`` and for other processes, so it is the steadier measure of our own
        overhead on a busy machine; wall time is what a caller waits.
    """
    gc.collect()
    gc.disable()
    try:
        c0 = time.process_time()
        t0 = time.perf_counter()
        result = fn()
        return time.perf_counter() - t0, time.process_time() - c0, result
    finally:
        gc.enable()


@dataclass(frozen=True)
class Timing:
    """Wall-clock and CPU samples of one system on one workload."""

    wall: Stats
    cpu: Stats

    @property
    def median(self) -> float:
        """Median wall time."""
        return self.wall.median

    @property
    def p90(self) -> float:
        """p90 wall time."""
        return self.wall.p90


def interleave(
    runs: dict[str, Callable[[], tuple[float, float]]],
    reps: int,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Timing]:
    """Run every system ``reps`` times, alternating the order each round (A B, B A, ...).

    Each callable performs one repetition (including its own untimed setup) and returns
    its measured (wall, cpu) seconds. Returns the samples per system.
    """
    names = list(runs)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            wall, cpu = runs[name]()
            walls[name].append(wall)
            cpus[name].append(cpu)
            if progress is not None:
                progress(f"{name} rep {r + 1}/{reps}")
    return {n: Timing(Stats.of(walls[n]), Stats.of(cpus[n])) for n in names}


def fmt_rate(per_second: float) -> str:
    """``12,345 ev/s``."""
    return f"{per_second:,.0f} ev/s"


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds with sensible precision."""
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:,.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.3f} ms"


def fmt_ratio(x: float) -> str:
    """``1.23x``."""
    return f"{x:.2f}x"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description(extra_dists: Sequence[str] = ()) -> dict[str, str]:
    """Facts about the machine and software the numbers were measured on."""
    dists = ("ares-events", "eventsourcing", "blake3", "orjson", *extra_dists)
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{_cpu_model()}, {os.cpu_count()} logical cores",
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": sqlite3.sqlite_version,
        "libraries": ", ".join(f"{d} {_version(d)}" for d in dists),
    }


def write_section(name: str, body: str, *, path: Path = DOC_PATH, title: str = "") -> None:
    """Replace the marked section ``name`` of ``path`` with ``body``.

    The section is delimited by ``<!-- bench:NAME:start -->`` and ``<!-- bench:NAME:end -->``;
    text outside the markers (hand-written analysis) is kept. A missing section is
    appended at the end, under ``title`` when given.
    """
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Performance\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text, count=1)
    else:
        heading = f"\n## {title}\n\n" if title else "\n"
        text = text.rstrip("\n") + "\n" + heading + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


# -- PostgreSQL -------------------------------------------------------------------------


def with_db(url: str, dbname: str) -> str:
    """``url`` pointed at database ``dbname``."""
    from urllib.parse import urlsplit, urlunsplit

    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc, "/" + dbname, p.query, ""))


@contextlib.contextmanager
def throwaway_db(admin_url: str, label: str) -> Iterator[str]:
    """Create a uniquely named database, yield its URL, drop it afterwards."""
    import os
    import uuid

    import psycopg

    name = f"ares_bench_{label}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_db(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
