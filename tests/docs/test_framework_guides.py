"""The framework guides (docs/guide-openai-agents.md, guide-pydantic-ai.md,
guide-google-adk.md) are programs: every ```python block runs, in order, in one namespace,
against a temporary SQLite store and PostgreSQL, and prints what the text says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"

GUIDES: dict[str, tuple[int, tuple[str, ...]]] = {
    "openai_agents": (
        5,
        (
            "answer: California",
            "model saw items: 3",
            "stored items: 4",
            "conflicts: 1",
            "answers kept: 1",
            "popped: oops",
            "after clear: []",
            "events: [('oai.items', True), ('oai.popped', False), ('oai.cleared', False)]",
            "chain ok: True",
            "shipped | model calls: 2 | shipments: 1",
            "shipped | model calls: 0 | shipments: 1",
            "paused for approval | refunds: []",
            "refunded | refunds: ['A-7']",
        ),
    ),
    "google_adk": (
        4,
        (
            "events: 4",
            "state: {'app:greeting': 'Olá', 'last': 'done', 'tier': 'gold', 'user:language': 'pt'}",
            "tail: ['close my ticket', 'done']",
            "conflicts: 1",
            "answers kept: 1",
            "after delete: None",
            "erased: 5",
            "chain ok: True",
            "first run: both shipped | model calls: 2 | shipments: ['adk-order-1:3', "
            "'adk-order-1:4']",
            "after a restart: both shipped | model calls: 0 | shipments: ['adk-order-1:3', "
            "'adk-order-1:4']",
            "session events: 4",
            "steps: ['google-adk.session.base', 'model', 'ship', 'ship', 'model', "
            "'google-adk.session.append'] completed",
        ),
    ),
    "pydantic_ai": (
        3,
        (
            "you said: hello, again",
            "stored messages: 4",
            "refused: chat-1 2 3",
            "stored messages: 6",
            "both shipped | model calls paid: 2 | shipments: 2",
            "steps: ['model', 'tool', 'tool', 'model'] completed",
        ),
    ),
}
"""Each guide: how many ``python`` blocks it has, and lines its output must contain."""


@pytest.mark.parametrize("guide", sorted(GUIDES))
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_framework_guide_runs(
    guide: str,
    backend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    path = DOCS / f"guide-{guide.replace('_', '-')}.md"
    n_blocks, expected = GUIDES[guide]
    text = path.read_text()
    if backend == "postgres":
        text = text.replace("sqlite:///agents.db", str(request.getfixturevalue("postgres_url")))
    blocks = re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    assert len(blocks) == n_blocks
    monkeypatch.chdir(tmp_path)
    ns: dict[str, Any] = {"__name__": f"guide_{guide}"}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{path.name}[block {i}]", "exec"), ns)
    out = capsys.readouterr().out
    for line in expected:
        assert line in out, out
