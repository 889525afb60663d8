"""The Merkle tree is checked against the event rows before the log key signs anything
(and before a look-only consistency proof): a rewrite with every hash recomputed, or a
deleted tail, made behind the store's back after a checkpoint was signed, stops
``checkpoint --key``, ``prove --key``, ``anchor --key`` and ``prove --consistency`` with
exit 1, storing nothing. The tree's tiles are never touched by such a tamper, so a check
against the stored tree alone passes it (hunt F1). On SQLite and PostgreSQL, through plain
SQL as an attacker with the database would do it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.chain import canonical_json, header_bytes, link_hash, payload_digest
from ares_events.cli import main

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@contextlib.contextmanager
def _sql(url: str) -> Iterator[tuple[Any, str]]:
    """A raw connection to the store's database and its parameter mark (the attacker)."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            yield conn, "?"
            conn.commit()
        return
    import psycopg

    base, _, query = url.partition("?")
    schema = dict(p.split("=", 1) for p in query.split("&") if p).get("schema", "public")
    with psycopg.connect(base) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        yield conn, "%s"


def _rewrite(url: str, stream: str, version: int) -> None:
    """Change one payload and recompute the rest of its (unkeyed) chain and its head."""
    with ae.open_store(url) as store:
        events = list(store.read(stream, version, None, None))
    prev = events[0].prev_hash
    with _sql(url) as (conn, p):
        for e in events:
            raw = canonical_json({"forged": True}) if e.version == version else e.payload_bytes
            # The fields the stored header commits to (RecordedEvent.header()), new payload.
            header = header_bytes(
                e[0], e[1], e[3], e[4], e[5], e[7], e[8], payload_digest(raw).hex(), len(raw)
            )
            h = link_hash(prev, header, None)
            conn.execute(
                f"UPDATE ares_events SET payload = {p}, prev_hash = {p}, hash = {p} "
                f"WHERE stream_id = {p} AND version = {p}",
                (raw, prev, h, stream, e.version),
            )
            prev = h
        conn.execute(
            f"UPDATE ares_streams SET head_hash = {p} WHERE stream_id = {p}", (prev, stream)
        )


def _delete_tail(url: str, k: int) -> None:
    """Delete the last ``k`` events and set every head to match."""
    with _sql(url) as (conn, p):
        rows = conn.execute(
            f"SELECT position FROM ares_events ORDER BY position DESC LIMIT {p}", (k,)
        ).fetchall()
        for (pos,) in rows:
            conn.execute(f"DELETE FROM ares_events WHERE position = {p}", (pos,))
        for (sid,) in conn.execute("SELECT stream_id FROM ares_streams").fetchall():
            last = conn.execute(
                f"SELECT version, hash FROM ares_events WHERE stream_id = {p} "
                "ORDER BY version DESC LIMIT 1",
                (sid,),
            ).fetchone()
            conn.execute(
                f"UPDATE ares_streams SET version = {p}, head_hash = {p} WHERE stream_id = {p}",
                (last[0], last[1], sid),
            )


@pytest.fixture(params=BACKENDS)
def env(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> dict[str, str]:
    """A store of 12 events in 3 streams, a log key, and a signed checkpoint of size 12."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ev.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    with ae.open_store(url) as store:
        for i in range(12):
            ae.emit(store, f"a{i % 3}", "x.happened", "test", {"i": i})
    key = str(tmp_path / "log.key")
    assert run(capsys, "keygen", "example.com/f1", "--out", key)[0] == 0
    code, out, _ = run(capsys, "--store", url, "checkpoint", "--key", key, "--json")
    assert code == 0
    return {"url": url, "key": key, "dir": str(tmp_path), "root": json.loads(out)["root"]}


def _stored(capsys: pytest.CaptureFixture[str], url: str) -> list[tuple[int, str]]:
    code, out, _ = run(capsys, "--store", url, "checkpoint", "--list", "--json")
    assert code == 0
    return [(r["tree_size"], r["root"]) for r in json.loads(out)["checkpoints"]]


def _refuses_to_sign(capsys: pytest.CaptureFixture[str], env: dict[str, str]) -> None:
    url, key = env["url"], env["key"]
    anchors = Path(env["dir"]) / "anchors"
    code, out, err = run(capsys, "--store", url, "checkpoint", "--key", key)
    assert code == 1 and out == "" and "does not match its events" in err, err
    code, _, err = run(capsys, "--store", url, "prove", "--consistency", "6", "--key", key)
    assert code == 1 and "does not match its events" in err, err
    code, _, err = run(capsys, "--store", url, "prove", "a0", "1", "--key", key)
    assert code == 1 and "does not match its events" in err, err
    code, _, err = run(capsys, "--store", url, "anchor", "--key", key, "--to", str(anchors))
    assert code == 1 and "does not match its events" in err and not anchors.exists(), err
    # Look-only: the consistency proof vouches for every leaf below its new size.
    code, out, err = run(capsys, "--store", url, "prove", "--consistency", "6", "--json")
    assert code == 1 and "does not match its events" in err, err
    assert _stored(capsys, url) == [(12, env["root"])]  # nothing signed, nothing stored


@pytest.mark.parametrize("tamper", ["rewrite", "deltail"])
def test_signing_refuses_a_tree_its_events_no_longer_match(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], tamper: str
) -> None:
    """After a consistent rewrite or a deleted tail, nothing is signed (exit 1), also after
    new genuine events (which on SQLite reuse the deleted positions and so would never
    enter the tree); rebuilding the tree then meets the stored checkpoint's check."""
    url = env["url"]
    if tamper == "rewrite":
        _rewrite(url, "a1", 2)
        assert run(capsys, "--store", url, "audit")[0] == 0  # the bare chain is fooled
    else:
        _delete_tail(url, 4)
    _refuses_to_sign(capsys, env)
    with ae.open_store(url) as store:
        for i in range(6):
            ae.emit(store, f"a{i % 3}", "x.happened", "test", {"new": i})
    _refuses_to_sign(capsys, env)
    assert run(capsys, "--store", url, "rebuild", "merkle_log")[0] == 0
    code, _, err = run(capsys, "--store", url, "checkpoint", "--key", env["key"])
    assert code == 1 and "no longer matches its checkpoint at size 12" in err, err


def test_an_untampered_log_still_signs_and_proves(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The check passes an honest log, also with events the tree has not folded yet."""
    url, key = env["url"], env["key"]
    with ae.open_store(url) as store:
        ae.emit(store, "b", "x.happened", "test", {})
    code, out, _ = run(capsys, "--store", url, "prove", "--consistency", "6", "--key", key)
    assert code == 0, out
    code, _, err = run(capsys, "--store", url, "prove", "--consistency", "6", "13", "--json")
    assert code == 0, err


@pytest.mark.parametrize(
    "args",
    [
        ("--consistency", "1", "9223372036854775808"),
        ("--consistency", "9223372036854775808"),
        ("--consistency", "1", "-1"),
        ("--consistency", "1", "99999999999999999999999"),
    ],
)
def test_a_tree_size_no_log_can_have_is_a_usage_error(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    """Tree sizes are below 2**63 (the checkpoint format's bound): anything else is a usage
    error (exit 2) on every backend, never an internal error."""
    code, _, err = run(capsys, "--store", env["url"], "prove", *args)
    assert code == 2, err


def test_a_look_only_proof_that_needs_a_checkpoint_signed_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the log built but no checkpoint stored, prove without a key would need one
    signed (a write): exit 2 naming the commands that sign, as docs/cli.md says."""
    url = f"sqlite:///{tmp_path / 'ev.db'}"
    with ae.open_store(url) as store:
        ae.emit(store, "a", "x.happened", "test", {})
        ae.MerkleLog(store).catch_up()
    code, _, err = run(capsys, "--store", url, "prove", "a", "1")
    assert code == 2 and "checkpoint --key" in err, err
    code, _, err = run(capsys, "--store", url, "prove", "--consistency", "0")
    assert code == 2 and "checkpoint --key" in err, err
