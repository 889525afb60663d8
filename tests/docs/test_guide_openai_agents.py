"""docs/guide-openai-agents.md is a program: every ```python block runs, in order, in
one namespace, against a temporary SQLite store and PostgreSQL, and prints what the text
says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-openai-agents.md"


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_guide_openai_agents_runs(
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
    assert len(blocks) == 4
    monkeypatch.chdir(tmp_path)
    ns: dict[str, Any] = {"__name__": "guide_openai_agents"}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), ns)
    out = capsys.readouterr().out
    for line in (
        "answer: California",
        "model saw items: 3",
        "stored items: 4",
        "conflicts: 1",
        "items kept: 2",
        "popped: oops",
        "after clear: []",
        "events: [('oai.items', True), ('oai.popped', False), ('oai.cleared', False)]",
        "chain ok: True",
        "shipped | model calls: 2 | shipments: 1",
        "shipped | model calls: 0 | shipments: 1",
    ):
        assert line in out, out
