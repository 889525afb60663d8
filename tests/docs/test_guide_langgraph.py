"""docs/guide-langgraph.md is a program: every ```python block runs, in order, in one
namespace, against a temporary SQLite store and the local S3 server, and prints what the
text says."""

from __future__ import annotations

import re
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-langgraph.md"


@pytest.mark.s3
def test_guide_langgraph_example_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    s3_endpoint: str,
) -> None:
    """Every ```python block of docs/guide-langgraph.md runs: the chain verifies, the
    second writer is refused, the audit is clean before and after pruning, the thread is
    gone after delete_thread, an interrupt goes on only under a signed approval (and the
    thread's record verifies with it), and a screenshot spills to S3."""
    import boto3

    bucket = f"guide-{uuid.uuid4().hex[:12]}"
    boto3.session.Session().client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    text = GUIDE.read_text().replace(
        "s3://agent-blobs/langgraph?endpoint_url=http://127.0.0.1:9000",
        f"s3://{bucket}/langgraph?endpoint_url={s3_endpoint}",
    )
    blocks = re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    # A real module: LangGraph resolves the state's annotations through sys.modules.
    module = types.ModuleType("guide_langgraph")
    monkeypatch.setitem(sys.modules, "guide_langgraph", module)
    ns: dict[str, Any] = module.__dict__
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), ns)
    out = capsys.readouterr().out
    for line in (
        "messages: 6",
        "chain ok: True",
        "refused: True",
        "audit ok: True",
        "kept: 2",
        "erased events: True",
        "after delete: None",
        "asks: {'refund': 40} []",
        "unsigned resume refused: []",
        "refunded: [40]",
        "record ok: True ['approve']",
        "spilled: True",
        "deep audit ok: True",
    ):
        assert line in out, out
    assert "audit ok: False" not in out
    # delete_thread removed the spilled screenshot from the bucket (the store's owner
    # marker stays: it is no blob).
    client = boto3.session.Session().client("s3", endpoint_url=s3_endpoint)
    objects = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    assert [o["Key"] for o in objects] == ["langgraph/.ares-owner"]
