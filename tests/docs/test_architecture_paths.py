"""docs/architecture.md, "Following a call down to its SQL", counts the files of the package
an append and a recover enter. Measured here the way the page says it was (a profile hook
on a warm store, each Python frame's file), so the drawing cannot drift from the code."""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import ares_events as ae
from ares_events.projections import AgentStateProjection
from ares_events.projections.recovery import snapshot

PACKAGE = Path(ae.__file__).parent
SECTION = (
    (Path(__file__).parents[2] / "docs" / "architecture.md")
    .read_text()
    .split("## Following a call down to its SQL")[1]
    .split("\n## ")[0]
)


def _documented(backend: str) -> tuple[int, int]:
    """The section's (append, recover) file counts for ``backend``."""
    found = re.findall(rf"{backend}: \*\*(\d+)(?: files)?\*\*", SECTION)
    assert len(found) == 2, found
    return int(found[0]), int(found[1])


def _entered(call: Callable[[], Any]) -> list[str]:
    """The package's files whose Python frames ``call`` enters, in order of first entry."""
    seen: list[str] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(str(PACKAGE)):
            rel = Path(name).relative_to(PACKAGE).as_posix()
            if rel not in seen:
                seen.append(rel)

    sys.setprofile(hook)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def _paths(url: str) -> tuple[list[str], list[str]]:
    """Files entered by a warm 1-event append at an expected version, and by a recover
    from a snapshot and the tail."""
    store = ae.open_store(url)
    try:
        sid, proj = f"paths-{uuid.uuid4().hex[:8]}", AgentStateProjection()

        def note(version: int) -> None:
            new = ae.NewEvent(type="note.added", module="docs", payload={"v": version})
            store.append(sid, [new], expected_version=version)

        for v in range(3):
            note(v)
        snapshot(store, sid, proj, snapshots=store.snapshots)
        note(3)
        ae.recover(store, sid, proj, snapshots=store.snapshots)  # warm
        append = _entered(lambda: note(4))
        recover = _entered(lambda: ae.recover(store, sid, proj, snapshots=store.snapshots))
        return append, recover
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["SQLite", "PostgreSQL"])
def test_the_drawn_paths_are_the_paths_taken(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each backend's append and recover enter as many files as the page says, and every
    one of them is named there (by its path or, in the PostgreSQL paragraph, its name)."""
    if backend == "SQLite":
        url = f"sqlite:///{tmp_path / 'paths.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    append, recover = _paths(url)
    assert (len(append), len(recover)) == _documented(backend), (append, recover)
    for rel in append + recover:
        assert rel in SECTION or f"`{rel.rsplit('/', 1)[-1]}`" in SECTION, rel
