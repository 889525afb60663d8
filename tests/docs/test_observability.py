"""docs/observability.md: its console-exporter example runs (in a child process: it sets
the global tracer provider) and prints the spans the text says, nested as it says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def test_console_example_prints_nested_spans(tmp_path: Path) -> None:
    """The first example prints append, replay and read spans, all children of the
    caller's span (read a child of replay), and none of them carries the payload."""
    block = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), flags=re.M | re.S)[0]
    out = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    spans = []
    decoder = json.JSONDecoder()
    text = out.strip()
    while text:
        span, end = decoder.raw_decode(text)
        spans.append(span)
        text = text[end:].strip()
    by_name = {s["name"]: s for s in spans}
    task = by_name["handle-task"]["context"]["span_id"]
    assert by_name["append ares_events"]["parent_id"] == task
    assert by_name["ares_events.replay"]["parent_id"] == task
    reads = [s for s in spans if s["name"] == "read ares_events"]
    replay = by_name["ares_events.replay"]["context"]["span_id"]
    assert any(r["parent_id"] == replay for r in reads)
    assert by_name["append ares_events"]["attributes"]["db.system.name"] == "sqlite"
    assert "task_id" not in out  # nothing of the payload
