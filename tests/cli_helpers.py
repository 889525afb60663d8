"""Running the CLI in-process from tests."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ares_events.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    """Run with --json; stdout must be exactly one JSON object."""
    code, out, _ = run(capsys, *args, "--json")
    assert out.count("\n") == 1, out
    data = json.loads(out)
    assert isinstance(data, dict)
    return code, data
