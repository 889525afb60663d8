"""docs/guide-async.md is a program: every ```python block runs, in order, in one
namespace, against a temporary SQLite store, and prints what the text says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-async.md"


def test_guide_async_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every ```python block of docs/guide-async.md runs; its output shows the chain
    verified, the subscriber's three events, the snapshot recovery, a journal answered
    from the log on restart, and a subscriber ended by StoreClosed."""
    blocks = re.findall(r"^```python\n(.*?)^```$", GUIDE.read_text(), flags=re.M | re.S)
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    ns: dict[str, Any] = {"__name__": "guide_async"}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), ns)
    out = capsys.readouterr().out
    assert "chain ok: True" in out
    assert "['run-0@1', 'run-1@1', 'run-2@1']" in out
    assert "snapshot 2 True" in out
    assert "completed model called 1 time(s)" in out
    assert "subscriber ended: StoreClosed" in out
    assert (tmp_path / "guide-async.db").exists()
