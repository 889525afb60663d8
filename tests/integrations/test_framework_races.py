"""Two processes run the same session or conversation of each framework adapter, 1,000
rounds: each round both read, then both write two items at once. Exactly one write wins
each round, the other gets the adapter's documented conflict, and the stored history is
the winners' pairs in round order: never interleaved, nothing lost, nothing of a loser.

The 1,000 rounds are shared by pairs running at once on sessions of one store, each pair
its own session: the same number of contested rounds, with other sessions' writers on the
same file or database beside them, and every read a quarter of a 1,000-round history.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from tests.children.framework_race_child import history, writer
from tests.integrations.fw_helpers import ADAPTERS, FRAMEWORKS, SHARED_BACKENDS, fw_url

ROUNDS = 1000
PAIRS = 4  # writer pairs at once, a session each, ROUNDS // PAIRS rounds each


def _prepare(adapter: str, url: str, sid: str) -> str:
    """Create what must exist first (an ADK session); return the stream to verify."""

    async def main() -> str:
        store = await ae.open_async_store(url)
        try:
            if adapter == "google-adk":
                from ares_events.integrations.google_adk import AresSessionService, session_stream

                await AresSessionService(store=store).create_session(
                    app_name="race", user_id="u", session_id=sid
                )
                return session_stream("race", "u", sid)
            if adapter == "openai-agents":
                from ares_events.integrations.openai_agents import stream_of

                return stream_of(sid)
            from ares_events.integrations.pydantic_ai import stream_of as pai_stream

            return pai_stream(sid)
        finally:
            await store.close()

    return asyncio.run(main())


def _results(out: Any, procs: list[Any], within: float = 850) -> list[Any]:
    """One result a child, failing at once (not at the timeout) when a child died first."""
    got: list[Any] = []
    deadline = time.monotonic() + within
    while len(got) < len(procs):
        try:
            got.append(out.get(timeout=1))
        except queue.Empty:
            died = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not died, f"a writer died (exit codes {died})"
            assert time.monotonic() < deadline, "the writers did not finish"
    return got


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", SHARED_BACKENDS)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_two_processes_on_one_session_never_interleave(
    adapter: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = fw_url(backend, tmp_path, request)
    sids = [f"race-{uuid.uuid4().hex[:8]}" for _ in range(PAIRS)]
    streams = [_prepare(adapter, url, sid) for sid in sids]
    # A fork server imports the frameworks once and forks each writer from its clean,
    # thread-free process: a spawned writer would spend seconds importing them.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.children.framework_race_child", *FRAMEWORKS])
    out = ctx.Queue()
    # Held until the writers have started: a barrier's semaphore goes with its last owner.
    barriers = [ctx.Barrier(2) for _ in sids]
    procs = [
        ctx.Process(
            target=writer, args=(adapter, url, sid, ROUNDS // PAIRS, f"{k}{w}", barriers[k], out)
        )
        for k, sid in enumerate(sids)
        for w in ("a", "b")
    ]
    for p in procs:
        p.start()
    got = {name: (res, probs) for name, res, probs in _results(out, procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for k, sid in enumerate(sids):
        a, b = got[f"{k}a"], got[f"{k}b"]
        assert a[1] == [] and b[1] == [], (a[1][:3], b[1][:3])
        assert len(a[0]) == len(b[0]) == ROUNDS // PAIRS
        expected: list[str] = []
        for i, (ra, rb) in enumerate(zip(a[0], b[0], strict=True)):
            assert sorted((ra, rb)) == ["lose", "win"], f"pair {k}, round {i}: {ra}, {rb}"
            w = f"{k}a" if ra == "win" else f"{k}b"
            expected += [f"{w}-{i}-a", f"{w}-{i}-b"]
        assert history(adapter, url, sid) == expected
    with ae.open_store(url) as store:
        for stream in streams:
            report = ae.integrity.verify_stream(store, stream)
            assert report.ok, report.findings
