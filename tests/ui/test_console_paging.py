"""The console pages everything from the store: streams by cursor, a stream's events by
version, a run's timeline by step (the latest page by default), runs by scan; each page
holds at most its size. Driven over HTTP against the in-process server."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import pytest

import ares_events as ae
from ares_events.agents.journal import Journal, ModelReply
from ares_events.ui import ConsoleServer
from tests.ui.test_console_rules import _request


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ConsoleServer, dict[str, str]]]:
    """A read-only console over 130 streams, a 250-event stream and a 120-step run."""
    url = f"sqlite:///{tmp_path_factory.mktemp('paging') / 'p.db'}"
    with ae.open_store(url + "?synchronous=normal") as store:
        store.append_many(
            [
                (
                    f"s-{i:03d}",
                    [ae.NewEvent(type="note.added", module="m", payload={"i": i})],
                    ae.NO_STREAM,
                )
                for i in range(130)
            ]
        )
        store.append(
            "long",
            [ae.NewEvent(type="note.added", module="m", payload={"n": n}) for n in range(250)],
        )
        j = Journal(store, "run-long")
        for n in range(120):
            j.model_call(
                [{"role": "user", "content": f"q{n}"}],
                {},
                call=lambda m, p: ModelReply({"text": "a"}, {"total_tokens": 2}),
            )
    with ae.open_store(url, create=False, read_only=True) as store:
        server = ConsoleServer(store, port=0).start()
        try:
            token = server.login_url.split("token=")[1]
            yield server, {"Cookie": f"ares_console_{server.port}={token}"}
        finally:
            server.close()


def _get(served: tuple[ConsoleServer, dict[str, str]], path: str) -> str:
    server, cookie = served
    status, _, body = _request(server.base_url, "GET", path, headers=cookie)
    assert status == 200, (path, body[:300])
    return body


def _next(body: str) -> str | None:
    m = re.search(r'<a href="([^"]+)" id="next">', body)
    return html.unescape(m.group(1)) if m else None


def test_streams_page_by_cursor(served: tuple[ConsoleServer, dict[str, str]]) -> None:
    """50 streams a page, the next page from the last id; every stream listed once."""
    seen: list[str] = []
    path: str | None = "/streams"
    while path is not None:
        body = _get(served, path)
        ids = re.findall(r'<a href="\./stream\?id=([^"&]+)"', body)
        assert len(ids) <= 50
        seen.extend(ids)
        path = _next(body)
    assert seen == sorted(seen) and len(seen) == len(set(seen)) == 132  # + long, run-long


def test_stream_events_page_by_version(served: tuple[ConsoleServer, dict[str, str]]) -> None:
    """A stream's page holds 100 events from the version asked for."""
    body = _get(served, "/stream?id=long&from=101")
    versions = [int(v) for v in re.findall(r'<tr id="v(\d+)"', body)]
    assert versions == list(range(101, 201))
    assert _next(body) == "./stream?id=long&from=201"
    last = _get(served, "/stream?id=long&from=201")
    assert [int(v) for v in re.findall(r'<tr id="v(\d+)"', last)] == list(range(201, 251))
    assert _next(last) is None and "head compared" in last


def test_run_timeline_pages_by_step(served: tuple[ConsoleServer, dict[str, str]]) -> None:
    """A 120-step run: 50 steps a page, the latest page by default."""
    latest = _get(served, "/run?id=run-long")
    assert [int(s) for s in re.findall(r'id="step-(\d+)"', latest)] == list(range(101, 121))
    first = _get(served, "/run?id=run-long&page=1")
    assert [int(s) for s in re.findall(r'id="step-(\d+)"', first)] == list(range(1, 51))
    assert "page 1 of 3" in first and "q0" in html.unescape(first)


def test_unknown_things_are_404_not_500(served: tuple[ConsoleServer, dict[str, str]]) -> None:
    """A missing stream, run or page is a page saying so."""
    server, cookie = served
    for path in ("/stream?id=nope", "/run?id=nope", "/run?id=s-001", "/nope"):
        status, _, _ = _request(server.base_url, "GET", path, headers=cookie)
        assert status == 404, path
    status, _, _ = _request(server.base_url, "GET", "/stream?id=long&from=x", headers=cookie)
    assert status == 400
