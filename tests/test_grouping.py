"""The suite's ``xdist_group`` marks hold under ``scripts/test``'s ``--dist loadgroup``:
every test of a group runs in one process (``tests/fixtures/xdist_groups.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a pytest run of its own in a child process
def test_a_group_runs_in_one_process(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.fixtures.xdist_groups"]\n')
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n\n"
        "@pytest.mark.xdist_group('one')\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "def test_grouped(i):\n"
        "    with open('workers.txt', 'a') as f:\n"
        "        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
    )
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"),
            *("--dist", "loadgroup", "--rootdir", str(tmp_path), "test_grouped.py"),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, workers
