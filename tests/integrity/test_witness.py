"""The witness: it cosigns a log's checkpoints only while each extends the last one it
cosigned (C2SP tlog-witness), refuses everything else with the spec's status, never rolls
back under concurrent requests, and its cosignatures verify as tlog-cosignature lines."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.cli import main
from ares_events.errors import WitnessRefused
from ares_events.integrity.checkpoints import (
    Checkpoint,
    open_checkpoint,
    sign_checkpoint,
    verify_proof,
)
from ares_events.integrity.notes import ALG_COSIGNATURE_V1, SigningKey
from ares_events.integrity.witness import LogWitness, format_request, parse_request


def _evs(n: int) -> list[ae.NewEvent]:
    return [ae.NewEvent(type="t.happened", module="test", payload={"i": i}) for i in range(n)]


@pytest.fixture
def keys() -> tuple[SigningKey, SigningKey]:
    """(log key, witness key)."""
    return SigningKey.generate("example.com/wlog"), SigningKey.generate(
        "witness.example/w1", alg=ALG_COSIGNATURE_V1
    )


def _request(log: ae.MerkleLog, key: SigningKey, old: int) -> tuple[int, list[bytes], str]:
    doc = log.prove_consistency(old, key=key)
    import base64

    return old, [base64.b64decode(h) for h in doc["consistency"]], doc["checkpoint"]


def test_cosigns_a_growing_log_and_refuses_what_is_not_consistent(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    """A log that only grows is cosigned at every step; a checkpoint of a rewritten log,
    signed with the real key, is refused (422) and the witness keeps the last good one."""
    lk, wk = keys
    db = tmp_path / "ev.db"
    with ae.open_store(f"sqlite:///{db}") as store, LogWitness(tmp_path / "w.db", wk) as w:
        w.add_log(lk.verifier)
        log = ae.MerkleLog(store)
        store.append("a", _evs(5))
        res = w.add_checkpoint(*_request(log, lk, 0))
        assert res.size == 5
        cosigned = open_checkpoint(res.note, [lk.verifier, wk.verifier])
        assert [k.name for k in cosigned.verified_by] == [lk.name, wk.name]
        store.append("b", _evs(3))
        assert w.add_checkpoint(*_request(log, lk, 5)).size == 8
        # the log is forked: a checkpoint of other events, honestly signed by the log key
        other = ae.open_store("memory://")
        other.append("x", _evs(12))
        forged = ae.MerkleLog(other)
        old, proof, note = _request(forged, lk, 8)
        with pytest.raises(WitnessRefused) as info:
            w.add_checkpoint(old, proof, note)
        assert info.value.status == 422
        assert w.latest(lk.name)["size"] == 8  # type: ignore[index]
        # same size, another root: a fork at the cosigned size
        fork = sign_checkpoint(Checkpoint(lk.name, 8, forged.root(8)), lk)
        with pytest.raises(WitnessRefused) as info:
            w.add_checkpoint(8, [], fork)
        assert info.value.status == 409 and info.value.latest_size == 8
        other.close()


def test_refusals_carry_the_tlog_witness_status(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    """Unknown log 404, no trusted signature 403, old size above the checkpoint 400, not
    the last cosigned size 409 (with the latest size), malformed requests 400."""
    lk, wk = keys
    with ae.open_store("memory://") as store, LogWitness(tmp_path / "w.db", wk) as w:
        store.append("a", _evs(4))
        log = ae.MerkleLog(store)
        req = _request(log, lk, 0)
        with pytest.raises(WitnessRefused) as info:
            w.add_checkpoint(*req)
        assert info.value.status == 404
        w.add_log(lk.verifier)
        impostor = SigningKey.generate(lk.name)
        note = sign_checkpoint(Checkpoint(lk.name, 4, log.root(4)), impostor)
        with pytest.raises(WitnessRefused) as info:
            w.add_checkpoint(0, [], note)
        assert info.value.status == 403
        with pytest.raises(WitnessRefused) as info:
            w.add_checkpoint(5, [], req[2])
        assert info.value.status == 400
        w.add_checkpoint(*req)
        with pytest.raises(WitnessRefused) as info:
            w.add_checkpoint(*req)  # old size 0 again: the witness is at 4
        assert info.value.status == 409 and info.value.latest_size == 4
        w.add_checkpoint(4, [], req[2])  # same size, same root: fine
        for body in ("old x\n\n", "new 1\n\nfoo", "old 1\nnot base64!\n\nfoo", "old 01\n\nx"):
            with pytest.raises(WitnessRefused) as info:
                parse_request(body)
            assert info.value.status == 400
        assert parse_request(format_request(*req)) == req
    with pytest.raises(ae.ConfigError):
        LogWitness(tmp_path / "x.db", lk)  # a log key cannot cosign


_RACE_CHILD = textwrap.dedent(
    """
    import sys, threading
    import ares_events as ae
    from ares_events.errors import WitnessRefused
    from ares_events.integrity.notes import SigningKey
    from ares_events.integrity.witness import LogWitness
    from tests.integrity.test_witness import _request

    state, lk_text, wk_text, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    lk, wk = SigningKey.from_text(lk_text), SigningKey.from_text(wk_text)
    store = ae.open_store("memory://")
    log = ae.MerkleLog(store)
    with LogWitness(state, wk) as w:
        w.add_log(lk.verifier)
    for r in range(rounds):
        cur = (LogWitness(state).latest(lk.name) or {"size": 0})["size"]
        store.append("a", [ae.NewEvent(type="t", module="m", payload={"r": r})])
        small = _request(log, lk, cur)          # cur -> n
        store.append("a", [ae.NewEvent(type="t", module="m", payload={"r": r, "x": 1})])
        big = _request(log, lk, cur)            # cur -> n + 1
        ok, barrier = [], threading.Barrier(2)
        def send(req):
            with LogWitness(state, wk) as w:
                barrier.wait()
                try:
                    ok.append(w.add_checkpoint(*req).size)
                except WitnessRefused as exc:
                    assert exc.status == 409, exc.status
        ts = [threading.Thread(target=send, args=(q,)) for q in (small, big)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        latest = LogWitness(state).latest(lk.name)["size"]
        assert len(ok) == 1 and latest == ok[0], (ok, latest)
    print("ok")
    """
)


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_concurrent_requests_never_roll_the_witness_back(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    """Two requests from the same old size race, many times, in a child process: exactly
    one is cosigned each time and the stored size is the one cosigned (never rolled back)."""
    lk, wk = keys
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _RACE_CHILD,
            str(tmp_path / "w.db"),
            lk.private_text(),
            wk.private_text(),
            "25",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=root,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_witness_cli(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey], capsys: pytest.CaptureFixture[str]
) -> None:
    """witness add-log / cosign / list from the CLI: a proof JSON is cosigned (exit 0, a
    cosignature line that verifies with the witness key), a replay is refused (exit 1,
    status 409), and verify-proof accepts the cosigned checkpoint with both keys (not with
    the witness's alone)."""
    lk, wk = keys
    (tmp_path / "w.key").write_text(wk.private_text() + "\n")
    (tmp_path / "log.key").write_text(lk.private_text() + "\n")
    url = f"sqlite:///{tmp_path / 'ev.db'}"
    with ae.open_store(url) as store:
        store.append("a", _evs(6))
    state = str(tmp_path / "w.db")
    assert main(["witness", "add-log", lk.verifier.text, "--state", state]) == 0
    assert (
        main(
            [
                "--store",
                url,
                "prove",
                "--consistency",
                "0",
                "--key",
                str(tmp_path / "log.key"),
                "--out",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "witness",
                "cosign",
                str(tmp_path / "r.json"),
                "--state",
                state,
                "--key",
                str(tmp_path / "w.key"),
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert (
        res["status"] == 200
        and res["size"] == 6
        and res["cosignatures"][0].startswith("\u2014 witness.example/w1 ")
    )
    doc = json.loads((tmp_path / "r.json").read_text())
    doc["checkpoint"] = res["checkpoint"]
    (tmp_path / "cosigned.json").write_text(json.dumps(doc))
    cosigned = ["verify-proof", str(tmp_path / "cosigned.json"), "--vkey", wk.verifier.text]
    # The witness's cosignature alone does not vouch for the log: its own key must sign.
    assert main(cosigned) == 1
    assert "no trusted log key of its origin" in capsys.readouterr().out
    assert main([*cosigned, "--vkey", lk.verifier.text]) == 0
    assert "signed by example.com/wlog, witness.example/w1" in capsys.readouterr().out
    code = main(
        [
            "witness",
            "cosign",
            str(tmp_path / "r.json"),
            "--state",
            state,
            "--key",
            str(tmp_path / "w.key"),
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["status"] == 409 and out["latest_size"] == 6
    assert main(["witness", "list", "--state", state, "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["logs"]
    assert entry["origin"] == lk.name and entry["size"] == 6
    assert verify_proof(doc, [lk.verifier, wk.verifier]).signed_by == [lk.name, wk.name]
    assert wk.private_text() not in capsys.readouterr().out


def test_a_deeply_nested_request_is_refused_400(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """witness cosign on a JSON request nested deeper than the parser goes: a malformed
    request, "REFUSED 400" and exit 1 as docs/cli.md says (it was an internal error, exit
    4, then a usage error, exit 2), nothing cosigned."""
    deep = tmp_path / "req.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    key = tmp_path / "w.key"
    state = tmp_path / "w.db"
    assert main(["keygen", "example.com/w", "--witness", "--out", str(key)]) == 0
    capsys.readouterr()
    assert main(["witness", "cosign", str(deep), "--state", str(state), "--key", str(key)]) == 1
    out, err = capsys.readouterr()
    assert "REFUSED" in out and "400" in out and "internal error" not in err
    assert not state.exists()
