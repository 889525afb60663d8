"""docs/guide-google-adk.md is a program: every ```python block runs, in order, in
one namespace, against a temporary SQLite store and PostgreSQL, and prints what the text
says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-google-adk.md"


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_guide_google_adk_runs(
    backend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    text = GUIDE.read_text()
    if backend == "postgres":
        text = text.replace("sqlite:///agents.db", str(request.getfixturevalue("postgres_url")))
    blocks = re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    ns: dict[str, Any] = {"__name__": "guide_google_adk"}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), ns)
    out = capsys.readouterr().out
    for line in (
        "events: 4",
        "state: {'app:greeting': 'Olá', 'last': 'done', 'tier': 'gold', 'user:language': 'pt'}",
        "tail: ['close my ticket', 'done']",
        "conflicts: 1",
        "one run kept: True 2",
        "after delete: None",
        "erased: 5",
        "chain ok: True",
    ):
        assert line in out, out
