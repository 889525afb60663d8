"""Two processes run the same session or conversation of each framework adapter, 1,000
rounds: each round both read, then both write two items at once. Exactly one write wins
each round, the other gets the adapter's documented conflict, and the stored history is
the winners' pairs in round order: never interleaved, nothing lost, nothing of a loser."""

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

ROUNDS = 1000
ADAPTERS = ["openai-agents", "pydantic-ai", "google-adk"]
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/race.db"
    return str(request.getfixturevalue("postgres_url"))


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
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_two_processes_on_one_session_never_interleave(
    adapter: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(backend, tmp_path, request)
    sid = f"race-{uuid.uuid4().hex[:8]}"
    stream = _prepare(adapter, url, sid)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=writer, args=(adapter, url, sid, ROUNDS, name, barrier, out))
        for name in ("a", "b")
    ]
    for p in procs:
        p.start()
    got = {name: (res, probs) for name, res, probs in _results(out, procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got["a"][1] == [] and got["b"][1] == [], (got["a"][1][:3], got["b"][1][:3])
    a, b = got["a"][0], got["b"][0]
    assert len(a) == len(b) == ROUNDS
    expected: list[str] = []
    for i, (ra, rb) in enumerate(zip(a, b, strict=True)):
        assert sorted((ra, rb)) == ["lose", "win"], f"round {i}: {ra}, {rb}"
        w = "a" if ra == "win" else "b"
        expected += [f"{w}-{i}-a", f"{w}-{i}-b"]
    assert history(adapter, url, sid) == expected
    with ae.open_store(url) as store:
        report = ae.integrity.verify_stream(store, stream)
        assert report.ok, report.findings
