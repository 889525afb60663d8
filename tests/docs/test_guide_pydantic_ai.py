"""docs/guide-pydantic-ai.md is a program: every ```python block runs, in order, in
one namespace, against a temporary SQLite store and PostgreSQL, and prints what the text
says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-pydantic-ai.md"


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_guide_pydantic_ai_runs(
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
    ns: dict[str, Any] = {"__name__": "guide_pydantic_ai"}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), ns)
    out = capsys.readouterr().out
    for line in (
        "you said: hello, again",
        "stored messages: 4",
        "refused: chat-1 2 3",
        "stored messages: 6",
        "both shipped | model calls paid: 2 | shipments: 2",
        "steps: ['model', 'tool', 'tool', 'model'] completed",
    ):
        assert line in out, out
