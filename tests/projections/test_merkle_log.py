"""The Merkle log over a real store: the tree the runner keeps equals the RFC 9162 tree of
the events in position order on every backend (also while appends race it), its proofs
verify offline, and a proof or checkpoint made before a rewrite fails after it."""

from __future__ import annotations

import base64
import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.chain import canonical_json, header_bytes, link_hash, payload_digest
from ares_events.errors import ProofError
from ares_events.integrity import merkle
from ares_events.integrity.anchors import verify_anchors, write_checkpoint_note
from ares_events.integrity.checkpoints import (
    Checkpoint,
    inclusion_document,
    sign_checkpoint,
    verify_proof,
)
from ares_events.integrity.notes import SigningKey
from ares_events.projections.merkle import MerkleLogProjection
from ares_events.projections.runner import rebuild, verify_rebuild
from tests.integrity import tlog_reference as ref


def _evs(n: int, start: int = 0) -> list[ae.NewEvent]:
    return [
        ae.NewEvent(type="t.happened", module="test", payload={"n": start + i}) for i in range(n)
    ]


@pytest.fixture
def key() -> SigningKey:
    """A log key."""
    return SigningKey.generate("example.com/merkle-test")


def test_tree_equals_the_reference_tree_on_every_backend(
    store: ae.EventStore, key: SigningKey
) -> None:
    """After appends in batches, across streams, the tree's size, roots and proofs are
    those of the reference tree over read_all's chain hashes; every proof verifies."""
    for i in range(9):
        store.append(f"s{i % 3}", _evs(i % 4 + 1, i * 10))
    log = ae.MerkleLog(store, batch_size=7)
    assert log.catch_up() == 21
    leaves = [e.hash for e in store.read_all()]
    assert log.size() == len(leaves) == 21
    for n in (1, 2, 3, 8, 16, 17, 21):
        assert log.root(n) == ref.mth(leaves[:n])
    signed = log.sign(key)
    assert signed.checkpoint.size == 21 and signed.checkpoint.root == ref.mth(leaves)
    for e in store.read_all():
        doc = log.prove_event(e.stream_id, e.version)
        assert doc["leaf_data"] == e.hash.hex()
        assert verify_proof(doc, [key.verifier]).ok
    store.append("s9", _evs(5))
    doc = log.prove_consistency(21, key=key)
    assert doc["new_size"] == 26 and verify_proof(doc, [key.verifier]).ok
    assert [ref.b64(h) for h in ref.proof(21, [e.hash for e in store.read_all()])] == doc[
        "consistency"
    ]


def test_racing_appends_never_leave_a_hole(store: ae.EventStore) -> None:
    """Appenders in threads race a catching-up tree (on PostgreSQL, commits land out of
    position order); at the end the tree is exactly every event in position order."""
    log = ae.MerkleLog(store, batch_size=5)
    stop = threading.Event()
    errors: list[BaseException] = []

    def append(w: int) -> None:
        try:
            for i in range(30):
                store.append(f"w{w}", _evs(1 + i % 3, i))
        except BaseException as exc:  # reported below
            errors.append(exc)

    def follow() -> None:
        try:
            while not stop.is_set():
                log.catch_up()
        except BaseException as exc:  # reported below
            errors.append(exc)

    follower = threading.Thread(target=follow)
    follower.start()
    workers = [threading.Thread(target=append, args=(w,)) for w in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    follower.join()
    assert not errors
    log.catch_up()
    leaves = [e.hash for e in store.read_all()]
    assert log.size() == len(leaves) == sum(sum(1 + i % 3 for i in range(30)) for _ in range(4))
    assert log.root() == ref.mth(leaves)
    assert [log.index_of(e.position) for e in store.read_all()] == list(range(len(leaves)))


def test_no_checkpoint_no_proof_and_one_origin(key: SigningKey) -> None:
    """Without a stored checkpoint covering the event, prove refuses (and with a key it
    signs one); a log keeps one origin; an unknown event is EventNotFound."""
    with ae.open_store("memory://") as store:
        store.append("a", _evs(3))
        log = ae.MerkleLog(store)
        with pytest.raises(ProofError, match="no stored checkpoint covers"):
            log.prove_event("a", 2)
        assert log.prove_event("a", 2, key=key)["tree_size"] == 3
        store.append("a", _evs(1))
        with pytest.raises(ProofError, match="no stored checkpoint covers"):
            log.prove_event("a", 4)
        with pytest.raises(ProofError, match="origin"):
            log.sign(SigningKey.generate("example.com/another-name"))
        with pytest.raises(ae.EventNotFound):
            log.prove_event("a", 9)
        assert log.latest_checkpoint() is not None and log.checkpoint_at(3) is not None
        assert [row[1] for row in log.checkpoints.all()] == [3]


def _rewrite_event(db: Path, stream: str, version: int, payload: dict[str, Any]) -> None:
    """The attacker: change one payload and recompute the rest of its (unkeyed) chain and
    its head, so a bare chain audit passes."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        rows = conn.execute(
            "SELECT version, event_id, type, module, metadata, recorded_at, payload "
            "FROM ares_events WHERE stream_id = ? ORDER BY version",
            (stream,),
        ).fetchall()
        prev = ae.integrity.genesis(stream)
        for v, eid, typ, mod, meta, at, stored in rows:
            raw = canonical_json(payload) if v == version else stored
            header = header_bytes(
                stream, v, eid, typ, mod, meta, at, payload_digest(raw).hex(), len(raw)
            )
            h = link_hash(prev, header, None)
            conn.execute(
                "UPDATE ares_events SET payload = ?, prev_hash = ?, hash = ? "
                "WHERE stream_id = ? AND version = ?",
                (raw, prev, h, stream, v),
            )
            prev = h
        conn.execute("UPDATE ares_streams SET head_hash = ? WHERE stream_id = ?", (prev, stream))


def test_a_proof_made_before_a_rewrite_fails_after_it(tmp_path: Path, key: SigningKey) -> None:
    """Rewrite an event (chain recomputed, bare audit clean): the old proof no longer
    matches the event, prove refuses, the signed checkpoint in the witness reports
    anchor_rewritten, and after the attacker rebuilds the tree no consistency proof from
    the old checkpoint verifies (and signing the rebuilt tree is refused)."""
    db = tmp_path / "events.db"
    witness = (tmp_path / "witness").as_uri() + "/"
    with ae.open_store(f"sqlite:///{db}") as store:
        store.append("a", _evs(4))
        store.append("b", _evs(4))
        log = ae.MerkleLog(store)
        old_cp = log.sign(key)
        write_checkpoint_note(witness, old_cp.text, old_cp.checkpoint.size)
        old_proof = log.prove_event("a", 2)
        assert verify_proof(old_proof, [key.verifier]).ok
        assert verify_anchors(store, witness, keys=[key.verifier]).ok
    _rewrite_event(db, "a", 2, {"n": "forged"})
    with ae.open_store(f"sqlite:///{db}") as store:
        assert ae.integrity.audit(store).ok  # the bare chain is fooled
        (now,) = store.read("a", 2, 2)
        # the old proof is still about the old event: checked against today's, it fails
        path = [base64.b64decode(h) for h in old_proof["inclusion"]]
        forged = inclusion_document(
            old_proof["leaf_index"], old_proof["tree_size"], now.hash, path, old_proof["checkpoint"]
        )
        assert not verify_proof(forged, [key.verifier]).ok
        log = ae.MerkleLog(store)
        with pytest.raises(ProofError, match="rewritten after it was logged"):
            log.prove_event("a", 2)
        check = verify_anchors(store, witness, keys=[key.verifier])
        assert [f.kind for f in check.findings] == ["anchor_rewritten"]
        audit = ae.integrity.audit(store, anchors=witness, anchor_keys=[key.verifier])
        assert "anchor_rewritten" in {f.kind for f in audit.findings}
        # the stored tree is not the tree of today's events
        assert not verify_rebuild(store, MerkleLogProjection()).ok
        # the attacker rebuilds the tree to match the forged events
        rebuild(store, MerkleLogProjection(), from_scratch=True)
        with pytest.raises(ProofError, match="no longer matches its checkpoint"):
            log.prove_event("a", 2)
        store.append("c", _evs(1))
        with pytest.raises(ProofError, match="no longer matches its checkpoint"):
            log.sign(key, store=False)  # the key holder's next checkpoint is refused
        log.catch_up()
        old_size, new_size = old_cp.checkpoint.size, log.size()
        proof = log.consistency_proof(old_size, new_size)
        assert not merkle.verify_consistency(
            old_size, new_size, old_cp.checkpoint.root, log.root(new_size), proof
        )


def test_deleted_events_are_anchor_truncated(tmp_path: Path, key: SigningKey) -> None:
    """Events deleted after a signed checkpoint make the log shorter than the checkpoint:
    anchor_truncated; an edited note is anchor_corrupt; an empty witness is no_anchor."""
    db = tmp_path / "events.db"
    witness = (tmp_path / "witness").as_uri() + "/"
    with ae.open_store(f"sqlite:///{db}") as store:
        assert [f.kind for f in verify_anchors(store, witness).findings] == ["no_anchor"]
        store.append("a", _evs(6))
        cp = ae.MerkleLog(store).sign(key)
        where = write_checkpoint_note(witness, cp.text, cp.checkpoint.size)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DELETE FROM ares_events WHERE stream_id = 'a' AND version > 4")
    with ae.open_store(f"sqlite:///{db}") as store:
        kinds = [f.kind for f in verify_anchors(store, witness).findings]  # keys from the store
        assert kinds == ["anchor_truncated"]
    Path(where).write_text(cp.text.replace("\n6\n", "\n4\n", 1))
    with ae.open_store(f"sqlite:///{db}") as store:
        kinds = [f.kind for f in verify_anchors(store, witness, keys=[key.verifier]).findings]
        assert kinds == ["anchor_corrupt"]
        other = SigningKey.generate("example.com/merkle-test")
        kinds = [f.kind for f in verify_anchors(store, witness, keys=[other.verifier]).findings]
        assert kinds == ["anchor_corrupt"]
        assert [f.kind for f in verify_anchors(store, witness, keys=[]).findings] == [
            "anchor_unverified"
        ]


def test_prove_refuses_an_event_whose_payload_was_edited_in_place(
    tmp_path: Path, key: SigningKey
) -> None:
    """An edit of one payload, its stored hash left alone (the row no longer hashes to it),
    is not proven: the leaf matches the log but the event is not the one that was hashed."""
    db = tmp_path / "events.db"
    with ae.open_store(f"sqlite:///{db}") as store:
        store.append("a", _evs(3))
        log = ae.MerkleLog(store)
        log.sign(key)
        assert verify_proof(log.prove_event("a", 2), [key.verifier]).ok
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "UPDATE ares_events SET payload = ? WHERE stream_id = 'a' AND version = 2",
            (canonical_json({"n": "forged"}),),
        )
    with ae.open_store(f"sqlite:///{db}") as store:
        log = ae.MerkleLog(store)
        with pytest.raises(ProofError, match="edited after it was written"):
            log.prove_event("a", 2)
        with pytest.raises(ProofError, match="edited after it was written"):
            log.prove_event("a", 2, key=key)
        assert verify_proof(log.prove_event("a", 3), [key.verifier]).ok


def test_sign_refuses_a_tree_that_contradicts_a_stored_checkpoint(
    tmp_path: Path, key: SigningKey
) -> None:
    """After a rewrite (chain recomputed) and a rebuilt tree, signing refuses: neither a
    second root at a size already signed nor a larger size whose prefix is not the stored
    root, with or without storing; the store keeps its one honest checkpoint."""
    db = tmp_path / "events.db"
    with ae.open_store(f"sqlite:///{db}") as store:
        store.append("a", _evs(4))
        honest = ae.MerkleLog(store).sign(key)
    _rewrite_event(db, "a", 2, {"n": "forged"})
    with ae.open_store(f"sqlite:///{db}") as store:
        rebuild(store, MerkleLogProjection(), from_scratch=True)
        log = ae.MerkleLog(store)
        assert log.root(4) != honest.checkpoint.root  # the tree now is the forged one
        for store_it in (True, False):  # same size, another root
            with pytest.raises(ProofError, match="no longer matches its checkpoint at size 4"):
                log.sign(key, store=store_it)
        store.append("a", _evs(1))  # a larger size whose prefix differs
        for size in (None, 5, 3):
            with pytest.raises(ProofError, match="no longer matches its checkpoint at size 4"):
                log.sign(key, size=size)
        with pytest.raises(ProofError, match="no longer matches its checkpoint at size 4"):
            log.prove_event("a", 5, key=key)
        with pytest.raises(ProofError, match="no longer matches its checkpoint at size 4"):
            log.prove_consistency(4, key=key)
        assert [(r[1], r[2], r[3]) for r in log.checkpoints.all()] == [
            (4, honest.checkpoint.root, honest.text)
        ]


def test_sign_signs_every_size_of_a_log_that_only_grew(key: SigningKey) -> None:
    """An honest log signs below, at and above its latest checkpoint (the same note again
    at its size), in any order: each agrees with the checkpoints already stored."""
    with ae.open_store("memory://") as store:
        store.append("a", _evs(6))
        log = ae.MerkleLog(store)
        six = log.sign(key)
        assert log.sign(key, size=3).checkpoint.size == 3
        assert log.sign(key).text == six.text
        store.append("b", _evs(2))
        assert log.sign(key).checkpoint.size == 8
        assert log.sign(key, size=5).checkpoint.size == 5
        assert [r[1] for r in log.checkpoints.all()] == [3, 5, 6, 8]


def test_sign_refuses_when_another_root_was_stored_at_its_size_meanwhile(
    key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signer that checked the stored checkpoints, then lost the insert at its size to a
    racing signer of another root, refuses instead of returning a note the store does not
    keep (the store keeps the first row of a size)."""
    with ae.open_store("memory://") as store:
        store.append("a", _evs(3))
        log = ae.MerkleLog(store)
        put = log.checkpoints.put
        other = merkle.leaf_hash(b"another tree")
        racer = sign_checkpoint(Checkpoint(key.name, 3, other), key)

        def racing_put(origin: str, size: int, root: bytes, note: str) -> None:
            put(origin, size, other, racer)  # the racing signer lands first
            put(origin, size, root, note)

        monkeypatch.setattr(log.checkpoints, "put", racing_put)
        with pytest.raises(ProofError, match="another root at size 3"):
            log.sign(key)
        assert [r[3] for r in log.checkpoints.all()] == [racer]


def test_sign_refuses_when_the_stored_checkpoint_is_damaged(
    tmp_path: Path, key: SigningKey
) -> None:
    """A stored checkpoint whose note no longer parses cannot vouch for the tree: signing
    refuses, naming it as damaged, rather than signing unchecked."""
    db = tmp_path / "events.db"
    with ae.open_store(f"sqlite:///{db}") as store:
        store.append("a", _evs(2))
        ae.MerkleLog(store).sign(key)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE ares_checkpoints SET note = 'not a note'")
    with ae.open_store(f"sqlite:///{db}") as store:
        store.append("a", _evs(1))
        with pytest.raises(ProofError, match="a stored checkpoint is damaged"):
            ae.MerkleLog(store).sign(key)
