"""The official ``langgraph-checkpoint-conformance`` suite (pinned in the test extras)
against both savers, on SQLite and on PostgreSQL: every capability is detected and
``conformance_level()`` is ``FULL``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from ares_events.integrations.langgraph import AresSaver, AsyncAresSaver

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/lg.db"
    return str(request.getfixturevalue("postgres_url"))


def _check(report: object) -> None:
    rep = report  # CapabilityReport
    failures = {k: r.failures for k, r in rep.results.items() if r.failures}  # type: ignore[attr-defined]
    assert failures == {}
    detected = {k for k, r in rep.results.items() if r.detected}  # type: ignore[attr-defined]
    assert detected == {c.value for c in ALL_CAPABILITIES}
    assert rep.conformance_level() == "FULL"  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_saver_is_fully_conformant(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """AresSaver (its blocking methods, driven through the a-methods) reaches FULL."""
    url = _url(backend, tmp_path, request)

    @checkpointer_test(name=f"AresSaver-{backend}")
    async def factory() -> AsyncIterator[AresSaver]:
        saver = AresSaver.from_url(url)
        try:
            yield saver
        finally:
            saver.close()

    _check(asyncio.run(validate(factory)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_async_saver_is_fully_conformant(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """AsyncAresSaver (native asyncio store) reaches FULL."""
    url = _url(backend, tmp_path, request)

    @checkpointer_test(name=f"AsyncAresSaver-{backend}")
    async def factory() -> AsyncIterator[AsyncAresSaver]:
        saver = await AsyncAresSaver.from_url(url)
        try:
            yield saver
        finally:
            await saver.aclose()

    _check(asyncio.run(validate(factory)))
