"""Benchmark: payload spill to a blob folder and to S3 (moto server) vs inline payloads.

Workload: one agent stream of ``--events`` events (default 400) of which 5% carry a
1 MB payload (a tool output: text, distinct per event) and the rest ~300-byte payloads.
For each configuration (inline SQLite, SQLite + ``file://`` blobs, SQLite + ``s3://``
blobs on a local moto server) it measures, each phase in a fresh subprocess so that
the peak RSS is that phase's own:

* append: events/s (one ``emit`` per event, as an agent does) and peak RSS over the
  baseline (interpreter + imports + the payloads already built);
* replay without touching payloads (types and versions only, the recovery fast path):
  events/s and blob requests (S3 operations counted with botocore's ``before-call``
  hook; files opened under the blob folder counted with an audit hook);
* full replay decoding every payload: events/s and peak RSS over the baseline.

Then one 200 MB payload: peak RSS of appending it (over a baseline that already holds the
payload object) and of reading it back (``payload_bytes``, then ``payload``), for the file
and S3 blob stores. Also the zstd ratio/speed on the 1 MB payloads (compression is not
implemented; this is the measurement that decides whether it would pay).

Run: ``.venv/bin/python -m bench.bench_blobs [--events 400] [--big-mb 200] [--no-write]``.
Results replace the ``blobs`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine_description, make_payloads, markdown_table, write_section

MB = 1024 * 1024
THRESHOLD = 256 * 1024
_WORDS = [
    "def", "return", "import", "self", "value", "error", "trace", "line", "file", "path",
    "status", "ok", "failed", "retry", "token", "result", "output", "stdout", "stderr", "exit",
    "code", "json", "key", "list", "item", "index", "page", "http", "get",
]  # fmt: skip


def peak_mb() -> float:
    """This process's peak RSS since the last :func:`baseline_mb`, in MiB.

    On Linux this is ``VmHWM`` from ``/proc/self/status``: ``ru_maxrss`` also counts the
    peak of the parent process image before ``exec`` (the kernel carries it over) and
    cannot be reset, so it would report the driver's size, not the phase's. Elsewhere
    ``ru_maxrss`` is used.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def baseline_mb() -> float:
    """Collect garbage, reset the peak-RSS mark to the current RSS and return it.

    Building the payloads allocates transient copies; without the reset they would set
    a high-water mark the measured phase never reaches. Linux resets VmHWM
    on ``echo 5 > /proc/self/clear_refs``; elsewhere the baseline is the peak so far.
    """
    import gc

    gc.collect()
    try:  # give freed heap back to the OS, or later allocations reuse it unseen
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return peak_mb()


def big_text(n_bytes: int, seed: int) -> str:
    """Deterministic ASCII text of exactly ``n_bytes`` (log-like lines)."""
    rng = random.Random(seed)
    lines: list[str] = []
    size = 0
    while size < n_bytes:
        line = f"{rng.randrange(10**6):06d} " + " ".join(rng.choices(_WORDS, k=12))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:n_bytes]


def workload(n: int) -> list[dict[str, Any]]:
    """``n`` payloads; every 20th is a ~1 MB tool output (5%)."""
    small = make_payloads(n, seed=7)
    out: list[dict[str, Any]] = []
    for i, p in enumerate(small):
        if i % 20 == 10:
            out.append({"step": i, "tool": "shell.run", "stdout": big_text(MB, seed=i)})
        else:
            out.append(p)
    return out


# -- workers (run in subprocesses) ----------------------------------------------------------


def _open(cfg: dict[str, Any]) -> Any:
    import ares_events as ae

    return ae.open_store(cfg["store"], blobs=cfg.get("blobs"), spill_threshold=THRESHOLD)


class _Counter:
    """Counts blob requests: S3 operations or files opened under the blob folder."""

    def __init__(self, store: Any) -> None:
        self.n = 0
        self.watch: str | None = None
        blobs = store.blobs
        client = getattr(blobs, "client", None)
        if client is not None:
            client.meta.events.register("before-call.s3", self._on_call)
        elif blobs is not None:
            self.watch = str(blobs.root)
            sys.addaudithook(self._on_audit)

    def _on_call(self, **_: Any) -> None:
        self.n += 1

    def _on_audit(self, event: str, args: tuple[Any, ...]) -> None:
        if (
            event == "open"
            and self.watch
            and args
            and isinstance(args[0], str)
            and args[0].startswith(self.watch)
        ):
            self.n += 1


def worker_append(cfg: dict[str, Any]) -> dict[str, Any]:
    import ares_events as ae

    payloads = workload(cfg["events"])
    store = _open(cfg)
    base = baseline_mb()
    t0 = time.perf_counter()
    for p in payloads:
        ae.emit(store, "agent-1", "tool.result", "runtime", p)
    dt = time.perf_counter() - t0
    store.close()
    return {"append_eps": len(payloads) / dt, "append_peak_mb": peak_mb() - base}


def worker_replay(cfg: dict[str, Any]) -> dict[str, Any]:
    store = _open(cfg)
    counter = _Counter(store)
    base = baseline_mb()
    t0 = time.perf_counter()
    n = sum(1 for e in store.read("agent-1") if e.type)
    dt_light = time.perf_counter() - t0
    light_requests = counter.n
    t0 = time.perf_counter()
    total = 0
    for e in store.read("agent-1"):
        p = e.payload
        total += len(p.get("stdout", "")) if isinstance(p, dict) else 0
    dt_full = time.perf_counter() - t0
    out = {
        "events": n,
        "light_eps": n / dt_light,
        "light_requests": light_requests,
        "full_eps": n / dt_full,
        "full_requests": counter.n - light_requests,
        "replay_peak_mb": peak_mb() - base,
        "stdout_bytes": total,
    }
    store.close()
    return out


def worker_big_append(cfg: dict[str, Any]) -> dict[str, Any]:
    import ares_events as ae

    payload = {"stdout": big_text(cfg["big_mb"] * MB, seed=42)}
    store = _open(cfg)
    base = baseline_mb()
    t0 = time.perf_counter()
    ae.emit(store, "big", "tool.result", "runtime", payload)
    dt = time.perf_counter() - t0
    store.close()
    return {"seconds": dt, "peak_over_baseline_mb": peak_mb() - base, "baseline_mb": base}


def worker_big_read(cfg: dict[str, Any]) -> dict[str, Any]:
    store = _open(cfg)
    (e,) = store.read("big")
    base = baseline_mb()
    t0 = time.perf_counter()
    raw = e.payload_bytes
    dt = time.perf_counter() - t0
    after_bytes = peak_mb() - base
    t1 = time.perf_counter()
    decoded = e.payload
    dt_decode = time.perf_counter() - t1
    after_decode = peak_mb() - base
    assert len(decoded["stdout"]) > 0
    size = len(raw)
    store.close()
    return {
        "size_mb": size / MB,
        "fetch_seconds": dt,
        "fetch_peak_mb": after_bytes,
        "decode_seconds": dt_decode,
        "decode_peak_mb": after_decode,
    }


def worker_big_decode(cfg: dict[str, Any]) -> dict[str, Any]:
    """Decode the big payload directly (``e.payload`` without ``payload_bytes`` first)."""
    store = _open(cfg)
    (e,) = store.read("big")
    base = baseline_mb()
    decoded = e.payload
    peak = peak_mb() - base
    assert len(decoded["stdout"]) > 0
    store.close()
    return {"decode_only_peak_mb": peak}


WORKERS = {
    "big_decode": worker_big_decode,
    "append": worker_append,
    "replay": worker_replay,
    "big_append": worker_big_append,
    "big_read": worker_big_read,
}


def run_worker(kind: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run one phase in a fresh interpreter; return its JSON result."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_blobs", "--worker", kind, json.dumps(cfg)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
        # A fixed mmap threshold: big buffers always get fresh pages that are returned on
        # free, so a phase's peak cannot hide in heap left resident by the setup.
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker {kind} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- driver ---------------------------------------------------------------------------------


def zstd_numbers(n: int) -> dict[str, float]:
    """Ratio and speed of zstd level 3 on the 1 MB payloads of the workload."""
    import zstandard

    from ares_events.chain import canonical_json

    blobs = [canonical_json(p) for p in workload(n) if "stdout" in p]
    raw = sum(len(b) for b in blobs)
    cctx, dctx = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
    t0 = time.perf_counter()
    comp = [cctx.compress(b) for b in blobs]
    tc = time.perf_counter() - t0
    t0 = time.perf_counter()
    for c in comp:
        dctx.decompress(c)
    td = time.perf_counter() - t0
    return {
        "ratio": raw / sum(len(c) for c in comp),
        "compress_mb_s": raw / MB / tc,
        "decompress_mb_s": raw / MB / td,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=400)
    ap.add_argument("--big-mb", type=int, default=200)
    ap.add_argument("--no-write", action="store_true", help="print, do not edit the docs")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("cfg", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](json.loads(args.cfg))))
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import boto3

    from tests import servers

    os.environ.update(servers.s3_env())
    results: dict[str, dict[str, Any]] = {}
    big: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, servers.s3_server() as endpoint:
        admin = boto3.session.Session().client("s3", endpoint_url=endpoint)
        for b in ("bench-small", "bench-big"):
            admin.create_bucket(Bucket=b)
        admin.close()
        configs = {
            "inline (SQLite)": {"store": f"sqlite:///{tmp}/inline.db"},
            "spill to file://": {
                "store": f"sqlite:///{tmp}/file.db",
                "blobs": f"file://{tmp}/blobs",
            },
            "spill to s3:// (moto)": {
                "store": f"sqlite:///{tmp}/s3.db",
                "blobs": f"s3://bench-small/p?endpoint_url={endpoint}",
            },
        }
        for name, cfg in configs.items():
            cfg["events"] = args.events
            print(f"[blobs] {name}: append", file=sys.stderr)
            r = run_worker("append", cfg)
            print(f"[blobs] {name}: replay", file=sys.stderr)
            r.update(run_worker("replay", cfg))
            r["db_mb"] = os.path.getsize(cfg["store"].removeprefix("sqlite:///")) / MB
            results[name] = r
        big_cfgs = {
            "file://": {"store": f"sqlite:///{tmp}/big-f.db", "blobs": f"file://{tmp}/bigblobs"},
            "s3:// (moto)": {
                "store": f"sqlite:///{tmp}/big-s.db",
                "blobs": f"s3://bench-big/p?endpoint_url={endpoint}",
            },
        }
        for name, cfg in big_cfgs.items():
            cfg["big_mb"] = args.big_mb
            print(f"[blobs] {args.big_mb} MB payload, {name}", file=sys.stderr)
            big[name] = run_worker("big_append", cfg)
            big[name].update({"read": run_worker("big_read", cfg)})
            big[name].update({"decode": run_worker("big_decode", cfg)})
    zs = zstd_numbers(args.events)
    body = render(args, results, big, zs)
    print(body)
    if not args.no_write:
        write_section("blobs", body, title="Blob spill (file and S3)")
    return 0


def render(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    big: dict[str, dict[str, Any]],
    zs: dict[str, float],
) -> str:
    """The markdown of the ``blobs`` section."""
    m = machine_description(("boto3", "moto"))
    n_big = sum(1 for i in range(args.events) if i % 20 == 10)
    rows = [
        [
            name,
            f"{r['append_eps']:,.0f}",
            f"{r['append_peak_mb']:.0f}",
            f"{r['light_eps']:,.0f}",
            str(r["light_requests"]),
            f"{r['full_eps']:,.0f}",
            str(r["full_requests"]),
            f"{r['replay_peak_mb']:.0f}",
            f"{r['db_mb']:.1f}",
        ]
        for name, r in results.items()
    ]
    table = markdown_table(
        [
            "configuration",
            "append ev/s",
            "append peak RSS +MiB",
            "replay, payloads untouched ev/s",
            "blob requests",
            "full replay ev/s",
            "blob requests",
            "replay peak RSS +MiB",
            "SQLite file MiB",
        ],
        rows,
    )
    big_rows = [
        [
            name,
            f"{b['seconds']:.2f} s",
            f"{b['peak_over_baseline_mb']:.0f}",
            f"{b['read']['fetch_seconds']:.2f} s",
            f"{b['read']['fetch_peak_mb']:.0f}",
            f"{b['read']['decode_peak_mb']:.0f}",
            f"{b['decode']['decode_only_peak_mb']:.0f}",
        ]
        for name, b in big.items()
    ]
    big_table = markdown_table(
        [
            "blob store",
            "append",
            "append peak RSS +MiB",
            "fetch `payload_bytes`",
            "fetch peak RSS +MiB",
            "+ decode `payload` peak +MiB",
            "decode `payload` alone, peak +MiB",
        ],
        big_rows,
    )
    return f"""
Measured by `bench/bench_blobs.py` on {m["date"]}: {m["cpu"]}; {m["os"]}; {m["python"]};
SQLite {m["sqlite"]}; {m["libraries"]}. The S3 numbers are against a moto server on
loopback (a real HTTP server in another process; real S3 adds network latency per request).

**Workload**: one stream of {args.events} events, {n_big} of them (5%) with a 1 MiB payload
(distinct text per event), the rest ~300-byte payloads; spill threshold 256 KiB; one
`emit` per event. Each phase runs in a fresh process; "peak RSS +MiB" is that phase's
peak RSS (`VmHWM`, reset to the current RSS through `/proc/self/clear_refs` once the
payloads are built and `malloc_trim` returned freed heap) minus the RSS at that point
(interpreter, imports, store, payloads).

{table}

Replay with payloads untouched (types and versions only, as chain verification and the
recovery fast path do) makes **no** blob request: spilled payloads are fetched lazily, one
request or file open per payload actually touched.

**One {args.big_mb} MiB payload** (peak RSS over a baseline that already holds the payload
object for the append, and the opened store for the read):

{big_table}

Appending keeps one extra copy (the canonical JSON bytes) plus boto3's bounded multipart
buffers; reading holds the fetched bytes once (large S3 blobs download in parallel parts to
a temp file, then are read once at their exact size); decoding adds the Python `str`.

**zstd** (level 3) on the 1 MiB payloads of this workload: ratio {zs["ratio"]:.1f}x,
compress {zs["compress_mb_s"]:,.0f} MiB/s, decompress {zs["decompress_mb_s"]:,.0f} MiB/s.
Blobs are stored uncompressed for now: on local disk and loopback the write/fetch path is
not bandwidth-bound, so compression would only add CPU; it would pay for remote S3
(egress and storage cost) and can be added without a format change (the digest stays over
the canonical bytes; a zstd frame's magic bytes never start a JSON text).
"""


if __name__ == "__main__":
    sys.exit(main())
