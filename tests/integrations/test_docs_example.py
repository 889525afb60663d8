"""The example in docs/integrations.md runs as written, and the audit it ends with is clean;
a tampered state makes the same audit report the aggregate's stream."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
import types
from pathlib import Path

import pytest

from ares_events.cli import main as cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def _example() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Example: persist an application, then audit it", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert m is not None
    return m.group(1)


def test_docs_example_runs_and_audits_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The documented application persists through ares-events and audits clean; editing a
    stored state is then a finding on that aggregate's stream."""
    db = tmp_path / "dogs.db"
    url = f"sqlite:///{db}"
    monkeypatch.setenv("ARES_STORE_URL", url)
    # A real module, so eventsourcing can resolve the example's event topics.
    mod = types.ModuleType("ares_docs_example")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    exec(compile(_example(), str(DOC), "exec"), mod.__dict__)
    capsys.readouterr()
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        streams = c.execute("SELECT stream_id, version FROM ares_streams").fetchall()
        assert len(streams) == 1 and streams[0][1] == 3
        c.execute(
            "UPDATE ares_events SET payload = ? WHERE version = 2",
            (b'{"state":"{\\"trick\\":\\"sit\\"}"}',),
        )
    c.close()
    assert cli(["--store", url, "audit", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    kinds = {(f["kind"], f["stream_id"]) for f in report["findings"]}
    assert ("hash_mismatch", streams[0][0]) in kinds
