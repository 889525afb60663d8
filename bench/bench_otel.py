"""Cost of telemetry (issue 24): the 1-event append and a 100k-event replay on SQLite,
in one run, by three configurations of the same package:

- ``no extra``: OpenTelemetry not importable (the package without the ``otel`` extra);
- ``API, no SDK``: ``opentelemetry-api`` installed, no provider configured (the no-op);
- ``SDK, in-memory``: the SDK's tracer and meter providers, every span exported at once
  (``SimpleSpanProcessor``) to an ``InMemorySpanExporter``, metrics to an
  ``InMemoryMetricReader``.

Each measurement runs in a fresh child process (a global provider is per process, and
"not installed" means the import fails), configurations interleaved (A B C, C B A, ...),
the median of the repeats reported. Goals: within 2% (API only) and 10% (SDK) of the
package without the extra.

    .venv/bin/python -m bench.bench_otel            # full sizes, rewrites its section
    .venv/bin/python -m bench.bench_otel --quick    # small sizes, prints only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine_description, write_section

MODES = ("none", "api", "sdk")
LABELS = {"none": "no extra", "api": "API, no SDK", "sdk": "SDK, in-memory exporter"}
GOALS = {"api": 0.02, "sdk": 0.10}


def _worker(mode: str, db: str, appends: int, append_db: str, replay: bool) -> dict[str, float]:
    if mode == "none":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # as if not installed
    import ares_events as ae

    if mode == "sdk":
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(tp)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    from ares_events.core import telemetry

    assert (telemetry.current() is not None) == (mode == "sdk"), mode
    out: dict[str, float] = {}
    with ae.open_store(f"sqlite:///{append_db}") as store:
        ev = [ae.NewEvent(type="tool.result", module="bench", payload={"n": 1, "s": "x" * 200})]
        for _ in range(20):  # warm-up
            store.append("warm", ev)
        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(appends):
            store.append(
                f"s-{i % 50}", [ae.NewEvent(type="tool.result", module="bench", payload={"i": i})]
            )
        out["append_wall_us"] = (time.perf_counter() - w0) / max(appends, 1) * 1e6
        out["append_cpu_us"] = (time.process_time() - c0) / max(appends, 1) * 1e6
    if not replay:
        return out
    with ae.open_store(f"sqlite:///{db}") as store:
        w0, c0 = time.perf_counter(), time.process_time()
        res = ae.replay(store, "big", lambda n, e: n + 1, 0, max_replay=10**7)
        out["replay_wall_ms"] = (time.perf_counter() - w0) * 1e3
        out["replay_cpu_ms"] = (time.process_time() - c0) * 1e3
        assert res.state == res.replayed and not res.findings
    return out


def _build(db: Path, n: int) -> None:
    import ares_events as ae

    with ae.open_store(f"sqlite:///{db}") as store:
        for start in range(0, n, 1000):
            store.append(
                "big",
                [
                    ae.NewEvent(
                        type="tool.result", module="bench", payload={"i": i, "s": "x" * 200}
                    )
                    for i in range(start, min(n, start + 1000))
                ],
            )


_COLLECTED = re.compile(r"Collected : (\d+)")


def _instructions(mode: str, db: Path, adb: Path, appends: int, replay: bool) -> int:
    """CPU instructions of one worker process under callgrind (the whole process)."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "bench.bench_otel",
        "--worker",
        mode,
        "--db",
        str(db),
        "--append-db",
        str(adb),
        "--appends",
        str(appends),
    ]
    if not replay:
        cmd.append("--no-replay")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    run = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    found = _COLLECTED.findall(run.stderr)
    assert found, run.stderr[-2000:]
    return int(found[-1])


def _instruction_rows(events: int, appends: int) -> list[str]:
    """Instructions per append and per replayed event: each configuration's process
    counted with and without the workload, the difference divided by its size."""
    per: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "replay.db"
        _build(db, events)
        for mode in MODES:
            base = _instructions(mode, db, Path(tmp) / f"b-{mode}.db", 0, False)
            app = _instructions(mode, db, Path(tmp) / f"a-{mode}.db", appends, False)
            rep = _instructions(mode, db, Path(tmp) / f"r-{mode}.db", 0, True)
            per[mode] = {"append": (app - base) / appends, "replay": (rep - base) / events}
            print(mode, per[mode], file=sys.stderr)
    out = [
        "| Instructions (callgrind) | "
        + " | ".join(LABELS[m] for m in MODES)
        + " | API vs none | SDK vs none |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in (("append", "per 1-event append"), ("replay", "per replayed event")):
        base = per["none"][key]
        cells = [f"{per[m][key]:,.0f}" for m in MODES]
        diffs = [f"{(per[m][key] / base - 1) * 100:+.1f}%" for m in ("api", "sdk")]
        out.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, 3 repeats, print only")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    p.add_argument("--append-db", help=argparse.SUPPRESS)
    p.add_argument("--appends", type=int, default=300, help=argparse.SUPPRESS)
    p.add_argument("--no-replay", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--instructions",
        action="store_true",
        help="also count CPU instructions under valgrind's callgrind (repeatable on a "
        "loaded machine; a few minutes)",
    )
    a = p.parse_args(argv)
    if a.worker:
        out = _worker(a.worker, a.db, a.appends, a.append_db, not a.no_replay)
        print(json.dumps(out))
        return 0
    events, appends, reps = (20_000, 100, 3) if a.quick else (100_000, 300, 7)
    load0 = os.getloadavg()[0]
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "replay.db"
        _build(db, events)
        for rep in range(reps):
            order = MODES if rep % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                adb = Path(tmp) / f"append-{mode}-{rep}.db"
                cmd = [
                    sys.executable,
                    "-m",
                    "bench.bench_otel",
                    "--worker",
                    mode,
                    "--db",
                    str(db),
                    "--append-db",
                    str(adb),
                    "--appends",
                    str(appends),
                ]
                out = subprocess.run(
                    cmd,
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=Path(__file__).resolve().parent.parent,
                )
                samples[mode].append(json.loads(out.stdout.splitlines()[-1]))
                print(mode, samples[mode][-1], file=sys.stderr)
    med = {
        m: {k: statistics.median(s[k] for s in samples[m]) for k in samples[m][0]} for m in MODES
    }
    rows = [
        ("1-event append, wall µs", "append_wall_us", "{:.1f}"),
        ("1-event append, CPU µs", "append_cpu_us", "{:.1f}"),
        (f"replay of {events:,} events, wall ms", "replay_wall_ms", "{:.1f}"),
        (f"replay of {events:,} events, CPU ms", "replay_cpu_ms", "{:.1f}"),
    ]
    lines = [
        "| Workload | " + " | ".join(LABELS[m] for m in MODES) + " | API vs none | SDK vs none |",
        "|---|---|---|---|---|---|",
    ]
    for label, key, fmt in rows:
        base = med["none"][key]
        cells = [fmt.format(med[m][key]) for m in MODES]
        diffs = [f"{(med[m][key] / base - 1) * 100:+.1f}%" for m in ("api", "sdk")]
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    if a.instructions:
        lines += ["", *_instruction_rows(events, appends)]
    info = machine_description(("opentelemetry-api", "opentelemetry-sdk"))
    load = os.getloadavg()[0]
    body = "\n".join(
        [
            "|  |  |",
            "|---|---|",
            "| Command | `.venv/bin/python -m bench.bench_otel` |",
            f"| Date | {info.get('date', '')} |",
            f"| Machine | {info.get('cpu', '')}, {info.get('os', '')} |",
            f"| Load average (1 min) before / after | {load0:.2f} / {load:.2f} (2 cores, shared) |",
            f"| Repeats | {reps} per configuration, interleaved, each in a fresh process |",
            f"| Appends | {appends} per repeat to 50 streams, SQLite WAL + synchronous FULL |",
            "",
            *lines,
            "",
            "Goals: API only within 2%, SDK within 10% of the package without the extra.",
        ]
    )
    print(body)
    if not a.quick:
        write_section("otel", body, title="Telemetry overhead (OpenTelemetry)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
