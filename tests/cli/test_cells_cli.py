"""The command line on cell stores: init, cells, verify, audit, anchor, checkpoint and
proofs work on a cell-store URL of every kind; moving a cell from the CLI on Citus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ares_events as ae
from tests.fixtures import servers
from tests.fixtures.cli_helpers import run, run_json
from tests.fixtures.fix_cells import KINDS, cells_url


@pytest.mark.postgres
@pytest.mark.parametrize("kind", KINDS)
def test_cli_on_a_cell_store(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init creates the cells (a reporting command before it finds no store), cells lists
    them with their streams, verify/audit/anchor/checkpoint/prove cover every cell, and
    the proof verifies offline (cells on separate servers: anchors and checkpoints are
    refused, saying why)."""
    url = cells_url(kind, request, cells=3)  # a new store, never a reused one
    code, _, err = run(capsys, "--store", url, "audit")
    assert code == 3 and "no store" in err  # reporting never creates
    code, data = run_json(capsys, "--store", url, "init")
    assert code == 0 and data["streams"] == 0
    with ae.open_store(url) as store:
        for i in range(30):
            ae.emit(store, f"agent-{i % 10}", "x.happened", "test", {"i": i})
    code, data = run_json(capsys, "--store", url, "cells")
    assert code == 0 and data["partitions"] == 12 and len(data["cells"]) == 3
    assert sum(c["streams"] for c in data["cells"]) == 10
    assert sum(c["partitions"] for c in data["cells"]) == 12
    if kind == "citus":
        assert all(c["location"] for c in data["cells"])
    code, data = run_json(capsys, "--store", url, "verify", "agent-3")
    assert code == 0
    code, data = run_json(capsys, "--store", url, "audit", "--deep")
    assert code == 0, data
    witness = tmp_path / "witness"
    key = tmp_path / "log.key"
    code, vkey, _ = run(capsys, "keygen", "example.com/cells", "--out", str(key))
    assert code == 0
    if kind == "servers":
        # Cells on separate servers have per-cell cursors, not 64-bit positions: anchors
        # and the Merkle log are refused with a message that says so (docs/scaling.md).
        code, _, err = run(
            capsys, "--store", url, "anchor", "--key", str(key), "--to", f"file://{witness}"
        )
        assert code == 2 and "per-cell cursors" in err
        code, _, err = run(capsys, "--store", url, "checkpoint", "--key", str(key))
        assert code == 2 and "per-cell cursors" in err
        return
    code, _, err = run(
        capsys, "--store", url, "anchor", "--key", str(key), "--to", f"file://{witness}"
    )
    assert code == 0, err
    code, _, err = run(capsys, "--store", url, "anchor", "--to", f"file://{witness}", "--check")
    assert code == 0, err
    code, out, err = run(capsys, "--store", url, "checkpoint", "--key", str(key), "--json")
    assert code == 0, err
    assert json.loads(out)["tree_size"] == 30
    code, out, err = run(capsys, "--store", url, "prove", "agent-7", "2", "--json")
    assert code == 0, err
    (tmp_path / "proof.json").write_text(out)
    code, _, _ = run(capsys, "verify-proof", str(tmp_path / "proof.json"), "--vkey", vkey.strip())
    assert code == 0


@pytest.mark.postgres
def test_cells_on_a_plain_store_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cells` on a store that is not a cell store exits 2 and says what a cell store is."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run(capsys, "--store", url, "init")[0] == 0
    code, _, err = run(capsys, "--store", url, "cells")
    assert code == 2 and "not a cell store" in err


@pytest.mark.postgres
def test_cells_move_from_the_cli(
    request: pytest.FixtureRequest, citus_ports: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    """cells move puts a Citus cell on the other worker; the store reads the same after."""
    url = cells_url("citus", request)
    with ae.open_store(url) as store:
        for i in range(20):
            ae.emit(store, f"s{i % 7}", "x.happened", "test", {"i": i})
        before = [(e.stream_id, e.version, e.position) for e in store.read_all()]
    code, data = run_json(capsys, "--store", url, "cells")
    cell = data["cells"][0]
    port = int(cell["location"].split()[0].rpartition(":")[2])
    other = next(p for p in citus_ports[1:] if p != port)
    code, moved = run_json(
        capsys, "--store", url, "cells", "move", cell["cell"], f"127.0.0.1:{other}"
    )
    assert code == 0 and moved["location"] == f"127.0.0.1:{other}"
    with ae.open_store(url) as store:
        assert [(e.stream_id, e.version, e.position) for e in store.read_all()] == before
        assert ae.integrity.audit(store).ok


@pytest.mark.postgres
def test_a_move_citus_refuses_is_a_usage_error_named_by_the_store_url(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """Moving a cell to the worker it is on is refused by Citus: exit 2 (a request to
    change, not an unavailable store), Citus's reason and the citus:// URL the user gave in
    the message, never a cell's internal postgresql:// URL or the password. A missing
    prefix opened without creating is "no store" at that same URL."""
    url = cells_url("citus", request)
    with ae.open_store(url):
        pass
    code, data = run_json(capsys, "--store", url, "cells")
    cell = data["cells"][0]
    here = cell["location"].split()[0]
    code, out, err = run(capsys, "--store", url, "cells", "move", cell["cell"], here)
    assert code == 2, err
    assert "same node" in err and "citus://" in err
    assert "postgresql://" not in err and "schema=" not in err
    assert servers.TEST_PASSWORD not in out + err
    missing = url.replace("prefix=", "prefix=gone")
    code, out, err = run(capsys, "--store", missing, "verify", "k0")
    assert code == 3 and "no store at citus://" in err, err
    assert "postgresql://" not in err and servers.TEST_PASSWORD not in out + err


def test_cells_move_to_a_port_out_of_range_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A TARGET port outside 1-65535 is a usage error naming the range, before anything
    is sent (nothing listens at the store URL: had the CLI connected, it would exit 3;
    had Citus been asked, it answered "function ... does not exist" or "non-existing node")."""
    url = "citus://root@127.0.0.1:1/postgres"
    for port, word in [("99999999999", "1-65535"), ("70000", "1-65535"), ("0", "1-65535"),
                       ("²", "HOST:PORT")]:  # fmt: skip
        code, _, err = run(capsys, "--store", url, "cells", "move", "ares_cell_1", f"h:{port}")
        assert code == 2 and word in err, (port, err)
