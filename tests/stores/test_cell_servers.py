"""The throwaway cluster fixture cleans up after a test run that was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures import servers
from tests.fixtures.cell_servers import pg_nodes

CHILD = """
import sys, time
from tests.fixtures.cell_servers import pg_nodes
with pg_nodes(1) as ports:
    print(ports[0], flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_a_killed_runs_servers_are_stopped_by_the_next_cluster() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert child.stdout is not None
    with child.stdout:
        port = int(child.stdout.readline())
    os.kill(child.pid, signal.SIGKILL)  # no teardown runs: its server is an orphan
    child.wait()
    owned = [
        p.parent
        for p in Path("/tmp").glob("ares-cells-*/owner")
        if p.read_text().split()[0] == str(child.pid)
    ]
    assert len(owned) == 1 and servers.port_open("127.0.0.1", port), "the orphan should run"
    postmaster = int((owned[0] / f"n{port}" / "postmaster.pid").read_text().split()[0])
    with pg_nodes(1):
        assert not owned[0].exists()
        # The server is gone (its port may be the new cluster's by now: not a test of it).
        # pg_ctl -w returns once the pid file is removed, just before the postmaster exits:
        # wait for the exit itself (a zombie nobody reaps in a container counts as gone).
        deadline = time.monotonic() + 60
        while not _gone(postmaster):
            assert time.monotonic() < deadline, f"postmaster {postmaster} still runs"
            time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")
