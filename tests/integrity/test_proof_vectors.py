"""docs/proofs.md test vectors, checked three ways.

(1) ``tlog_reference.py``, an independent implementation written from the page (no package
import), reproduces every vector; (2) the package's Merkle math, tiles, notes, checkpoints
and cosignatures reproduce them; (3) known answers from outside this project (Go's
``golang.org/x/mod/sumdb/note`` example and the C2SP signed-note example) verify.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ares_events.core.events import RecordedEvent
from ares_events.errors import ConfigError, ProofError
from ares_events.integrity import merkle
from ares_events.integrity.anchors import RootAccumulator
from ares_events.integrity.checkpoints import (
    Checkpoint,
    consistency_document,
    cosign_checkpoint,
    inclusion_document,
    open_checkpoint,
    parse_checkpoint,
    proof_kind,
    sign_checkpoint,
    verify_proof,
)
from ares_events.integrity.notes import (
    ALG_COSIGNATURE_V1,
    Note,
    SigningKey,
    VerifierKey,
    open_note,
    read_key_file,
    sign_note,
    write_key_file,
)
from ares_events.projections.merkle import MerkleLogProjection, _Tiles
from tests.integrity import tlog_reference as ref

PROOFS_MD = Path(__file__).resolve().parents[2] / "docs" / "proofs.md"


def _blocks() -> dict[str, dict[str, Any]]:
    text = PROOFS_MD.read_text(encoding="utf-8")
    blocks = [json.loads(b) for b in re.findall(r"^```json\n(.*?)^```$", text, flags=re.S | re.M)]
    return {b["name"]: b for b in blocks if isinstance(b, dict) and "name" in b}


VECTORS = _blocks()
TREE = VECTORS["merkle-13"]
SIGNED = VECTORS["signed-checkpoint"]
LEAVES = [bytes.fromhex(h) for h in TREE["leaves"]]


def _b(x: list[str]) -> list[bytes]:
    return [base64.b64decode(h) for h in x]


def _node_source(leaves: list[bytes]) -> merkle.NodeSource:
    hashes = [merkle.leaf_hash(d) for d in leaves]
    return lambda level, index: merkle.perfect_root(hashes[index << level : (index + 1) << level])


def test_vectors_cover_the_required_cases() -> None:
    """The page has leaf hashes, roots for sizes 0..13, inclusion and consistency proofs for
    several sizes (powers of two and not), and a signed, cosigned checkpoint."""
    assert len(LEAVES) == 13 and len(TREE["roots"]) == 14
    assert {(v["leaf_index"], v["tree_size"]) for v in TREE["inclusion"]} >= {
        (0, 1),
        (3, 8),
        (12, 13),
    }
    sizes = {(v["old_size"], v["new_size"]) for v in TREE["consistency"]}
    assert {(1, 2), (4, 8), (6, 13), (13, 13)} <= sizes
    assert SIGNED["signed_note"].startswith(SIGNED["checkpoint_body"] + "\n\u2014 ")


# -- (1) the independent reference ---------------------------------------------------------


def test_reference_reproduces_leaves_and_roots() -> None:
    """The reference computes every leaf hash and root on the page."""
    assert [ref.sha256(b"\x00" + d).hex() for d in LEAVES] == TREE["leaf_hashes"]
    for n, root in TREE["roots"].items():
        assert ref.b64(ref.mth(LEAVES[: int(n)])) == root


def test_reference_reproduces_and_verifies_proofs() -> None:
    """The reference computes every proof on the page and its verifiers accept them."""
    for v in TREE["inclusion"]:
        m, n = v["leaf_index"], v["tree_size"]
        assert [ref.b64(x) for x in ref.path(m, LEAVES[:n])] == v["proof"]
        root = base64.b64decode(TREE["roots"][str(n)])
        assert ref.verify_inclusion(m, n, LEAVES[m], _b(v["proof"]), root)
    for v in TREE["consistency"]:
        m, n = v["old_size"], v["new_size"]
        assert [ref.b64(x) for x in ref.proof(m, LEAVES[:n])] == v["proof"]
        r1, r2 = (base64.b64decode(TREE["roots"][str(s)]) for s in (m, n))
        assert ref.verify_consistency(m, n, r1, r2, _b(v["proof"]))


def test_reference_reproduces_signed_checkpoint() -> None:
    """The reference derives both keys' texts, the signed note and the cosignature."""
    log, wit = SIGNED["log_key"], SIGNED["witness_key"]
    seed, wseed = bytes.fromhex(log["seed"]), bytes.fromhex(wit["seed"])
    assert ref.private_key_text(log["name"], 1, seed) == log["private_key"]
    assert ref.vkey_text(log["name"], 1, ref.public_key(seed)) == log["vkey"]
    assert ref.vkey_text(wit["name"], 4, ref.public_key(wseed)) == wit["vkey"]
    body = ref.checkpoint_body(log["name"], 13, base64.b64decode(TREE["roots"]["13"]))
    assert body == SIGNED["checkpoint_body"]
    assert ref.sign_note(body, log["name"], seed) == SIGNED["signed_note"]
    line = ref.cosignature_line(body, wit["name"], wseed, SIGNED["cosignature_time"])
    assert line == SIGNED["cosignature_line"]
    assert ref.open_note(SIGNED["signed_note"], log["name"], ref.public_key(seed)) == body


# -- (2) the package ------------------------------------------------------------------------


def test_package_merkle_math_reproduces_vectors() -> None:
    """leaf_hash, root, inclusion_proof and consistency_proof give the page's values, and
    the package's verifiers accept them."""
    assert [merkle.leaf_hash(d).hex() for d in LEAVES] == TREE["leaf_hashes"]
    hashes = [merkle.leaf_hash(d) for d in LEAVES]
    node = _node_source(LEAVES)
    for n, root in TREE["roots"].items():
        assert base64.b64encode(merkle.root(hashes[: int(n)])).decode() == root
    for v in TREE["inclusion"]:
        m, n = v["leaf_index"], v["tree_size"]
        assert merkle.inclusion_proof(m, n, node) == _b(v["proof"])
        root = base64.b64decode(TREE["roots"][str(n)])
        assert merkle.verify_inclusion(m, n, hashes[m], _b(v["proof"]), root)
    for v in TREE["consistency"]:
        m, n = v["old_size"], v["new_size"]
        assert merkle.consistency_proof(m, n, node) == _b(v["proof"])
        r1, r2 = (base64.b64decode(TREE["roots"][str(s)]) for s in (m, n))
        assert merkle.verify_consistency(m, n, r1, r2, _b(v["proof"]))


def _fake_event(position: int, chain_hash: bytes) -> RecordedEvent:
    return RecordedEvent(
        "s", position, position, "id", "t", "m", b"{}", b"{}", "at", b"", chain_hash
    )


def _fold_tiles(leaves: list[bytes], batch: int) -> dict[str, Any]:
    """The Merkle projection's rows after folding ``leaves`` as chain hashes in batches."""
    rows: dict[str, Any] = {}
    proj = MerkleLogProjection()
    events = [_fake_event(i + 1, d) for i, d in enumerate(leaves)]
    for i in range(0, len(events), batch):
        out = proj.fold_batch(
            lambda keys: {k: rows[k] for k in keys if k in rows}, events[i : i + batch]
        )
        # what the runner stores: canonical JSON, read back as JSON
        rows.update(json.loads(json.dumps(out)))
    return rows


class _DictTables:
    def __init__(self, rows: dict[str, Any]) -> None:
        self.rows = rows

    def load(self, table: str, keys: list[str]) -> dict[str, Any]:
        return {k: self.rows[k] for k in keys if k in self.rows}


def test_tiles_reproduce_vector_roots_and_proofs() -> None:
    """The tiled projection, folded in uneven batches, gives the page's roots and proofs."""
    tiles = _Tiles(_DictTables(_fold_tiles(LEAVES, 5)), "t")
    for n, root in TREE["roots"].items():
        if int(n):
            assert base64.b64encode(merkle.subtree_hash(0, int(n), tiles.node)).decode() == root
    for v in TREE["inclusion"]:
        assert merkle.inclusion_proof(v["leaf_index"], v["tree_size"], tiles.node) == _b(v["proof"])


@pytest.mark.parametrize(
    ("size", "batch"), [(255, 7), (256, 256), (257, 100), (513, 64), (65_537, 5000)]
)
def test_tiles_across_tile_and_level_boundaries(size: int, batch: int) -> None:
    """Around tile (256) and tile-level (65,536) boundaries the tiled tree's roots equal a
    streaming computation over the same leaves, and its proofs verify."""
    leaves = [i.to_bytes(32, "big") for i in range(size)]
    tiles = _Tiles(_DictTables(_fold_tiles(leaves, batch)), "t")
    acc = RootAccumulator()
    checks = {1, 2, 255, 256, 257, 511, 512, 65_535, 65_536, size - 1, size}
    for i, d in enumerate(leaves, 1):
        acc.add(d)
        if i in checks:
            root = merkle.subtree_hash(0, i, tiles.node)
            assert root == acc.root(), i
    root = acc.root()
    for m in {0, size // 2, size - 1}:
        p = merkle.inclusion_proof(m, size, tiles.node)
        assert merkle.verify_inclusion(m, size, merkle.leaf_hash(leaves[m]), p, root)
    if size > 300:
        assert ref.verify_consistency(
            300, size, merkle.subtree_hash(0, 300, tiles.node), root,
            merkle.consistency_proof(300, size, tiles.node),
        )  # fmt: skip


def test_package_signs_and_opens_the_vector_checkpoint() -> None:
    """The package parses the page's keys, signs the same note byte for byte, cosigns it
    byte for byte at the given time, and opens both."""
    log, wit = SIGNED["log_key"], SIGNED["witness_key"]
    key = SigningKey.from_text(log["private_key"])
    assert key.verifier.text == log["vkey"]
    assert key.private_text() == log["private_key"]
    wkey = SigningKey.from_text(wit["private_key"])
    assert wkey.verifier.text == wit["vkey"]
    cp = Checkpoint(log["name"], 13, base64.b64decode(TREE["roots"]["13"]))
    assert cp.body() == SIGNED["checkpoint_body"]
    assert parse_checkpoint(SIGNED["checkpoint_body"]) == cp
    assert sign_checkpoint(cp, key) == SIGNED["signed_note"]
    note = Note.parse(SIGNED["signed_note"])
    cosig = cosign_checkpoint(note, wkey, timestamp=SIGNED["cosignature_time"])
    assert cosig.line() == SIGNED["cosignature_line"]
    both = note.with_signatures([cosig]).format()
    assert both == SIGNED["cosigned_note"]
    vkeys = [VerifierKey.parse(log["vkey"]), VerifierKey.parse(wit["vkey"])]
    opened = open_checkpoint(both, vkeys)
    assert opened.checkpoint == cp and [k.name for k in opened.verified_by] == [
        log["name"],
        wit["name"],
    ]
    # only the witness trusted: refused (a cosignature does not stand for the log's own
    # signature); an unknown signer alone: refused
    with pytest.raises(ProofError, match="no trusted log key of its origin"):
        open_checkpoint(both, vkeys[1:])
    other = SigningKey.generate("example.org/other")
    with pytest.raises(ProofError, match="no signature from a trusted key"):
        open_checkpoint(both, [other.verifier])


def test_a_checkpoint_opens_only_with_its_origins_log_signature() -> None:
    """Signed only by another trusted log's key, or only cosigned by a trusted witness (even
    one whose key bears the origin's name), a checkpoint does not open; signed by the
    origin's log key it opens, with the witnesses' cosignatures listed after it."""
    log = SigningKey.generate("example.com/log")
    other = SigningKey.generate("other.com/log")
    witness = SigningKey.generate("w.example/w1", alg=ALG_COSIGNATURE_V1)
    namesake = SigningKey.generate("example.com/log", alg=ALG_COSIGNATURE_V1)
    cp = Checkpoint("example.com/log", 1, merkle.leaf_hash(b"forged event"))
    body = cp.body()
    trusted = [log.verifier, other.verifier, witness.verifier, namesake.verifier]
    for signer in (other, witness, namesake):
        with pytest.raises(ProofError, match=re.escape("of its origin 'example.com/log'")):
            open_checkpoint(sign_note(body, [signer]), trusted)
    note = Note.parse(sign_checkpoint(cp, log))
    both = note.with_signatures([cosign_checkpoint(note, witness)]).format()
    opened = open_checkpoint(both, trusted)
    assert opened.checkpoint == cp
    assert opened.verified_by == (log.verifier, witness.verifier)


def test_a_utf8_key_name_signs_and_opens() -> None:
    """A non-ASCII key name (UTF-8, as C2SP signed-note allows) survives its key file, its
    verifier key text and a signed checkpoint; a name that is not well-formed UTF-8 (a
    lone surrogate) is refused."""
    import tempfile

    name = "log.例え.jp/é"
    key = SigningKey.generate(name)
    with tempfile.TemporaryDirectory() as d:
        path = write_key_file(Path(d) / "k.key", key)
        assert read_key_file(path).private_text() == key.private_text()
    vkey = VerifierKey.parse(key.verifier.text)
    cp = Checkpoint(name, 3, merkle.EMPTY_ROOT)
    assert open_checkpoint(sign_checkpoint(cp, key), [vkey]).checkpoint == cp
    with pytest.raises(ConfigError, match="UTF-8"):
        SigningKey.generate("log\udcff")


@pytest.mark.parametrize(
    "secret",
    [
        "9f" * 32,  # a chain key
        "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIKx+secretsecret+secretsecret\n",
        "PRIVATE+KEY+example.com/log+01234567+AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=",
        "secret name+12345678+AS6gYjlyNICN04BZxxfSNHsIFuBGfF3O8RUL0eeuHnxZ",
        "example.com/log+deadbeef+AS6gYjlyNICN04BZxxfSNHsIFuBGfF3O8RUL0eeuHnxZ",
    ],
)
def test_a_verifier_key_error_never_repeats_the_text(secret: str) -> None:
    """Whatever is parsed in a verifier key's place, the error names its source and says
    what is wrong, never the text: it may be a secret given by mistake."""
    with pytest.raises(ConfigError) as info:
        VerifierKey.parse(secret, source="ARES_LOG_VKEY")
    message = str(info.value)
    assert message.startswith("ARES_LOG_VKEY")
    pieces = [p for p in re.split(r"[\n+]", secret) if len(p) >= 6]
    assert not [p for p in pieces if p in message]


def test_a_tampered_vector_note_is_rejected() -> None:
    """A changed size, root or signature byte makes the vector checkpoint fail to open."""
    vkey = VerifierKey.parse(SIGNED["log_key"]["vkey"])
    good = SIGNED["signed_note"]
    for bad in (
        good.replace("\n13\n", "\n14\n", 1),
        good.replace("zrz4", "zrz5", 1),
        good.replace("AN25/w", "AN25/x", 1),
    ):
        with pytest.raises(ProofError):
            open_checkpoint(bad, [vkey])


# -- (3) known answers from outside ---------------------------------------------------------

GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_SIG = (
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM="
)
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n\u2014 example.com/foo "
    "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)


def test_go_sumdb_note_known_answer() -> None:
    """Go's sumdb/note example key signs its example text to the documented note, in both
    the package and the reference."""
    key = SigningKey.from_text(GO_SKEY)
    assert key.verifier.text == GO_VKEY
    want = GO_TEXT + "\n\u2014 PeterNeumann " + GO_SIG + "\n"
    assert sign_note(GO_TEXT, [key]) == want
    seed = base64.b64decode(GO_SKEY.split("+", 4)[4])[1:]
    assert ref.sign_note(GO_TEXT, "PeterNeumann", seed) == want
    note, verified = open_note(want, [VerifierKey.parse(GO_VKEY)])
    assert note.text == GO_TEXT and verified[0].text == GO_VKEY


def test_c2sp_signed_note_example_verifies() -> None:
    """The C2SP signed-note spec's example note verifies under its example key."""
    note, verified = open_note(SPEC_NOTE, [VerifierKey.parse(SPEC_VKEY)])
    assert note.text == "This is an example message.\n" and len(verified) == 1


def test_a_document_of_both_kinds_or_neither_is_not_a_proof() -> None:
    """proof_kind names the one kind a document holds; one holding both an inclusion and
    a consistency proof (or neither) is not a proof, so verify_proof never checks one
    part and vouches for the whole."""
    key = SigningKey.generate("example.com/log")
    leaves = [b"a", b"b", b"c", b"d"]
    node = _node_source(leaves)
    root = merkle.subtree_hash(0, 4, node)
    note = sign_checkpoint(Checkpoint(key.name, 4, root), key)
    incl = inclusion_document(1, 4, leaves[1], merkle.inclusion_proof(1, 4, node), note)
    cons = consistency_document(2, 4, merkle.consistency_proof(2, 4, node), note, None)
    assert proof_kind(incl) == "inclusion" and verify_proof(incl, [key.verifier]).ok
    assert proof_kind(cons) == "consistency"
    both = {**incl, **{k: v for k, v in cons.items() if k != "checkpoint"}}
    neither = {k: v for k, v in incl.items() if k != "inclusion"}
    for doc, says in ((both, "both"), (neither, "neither")):
        with pytest.raises(ProofError, match=f"not a proof: .*{says}"):
            proof_kind(doc)
        with pytest.raises(ProofError, match="not a proof"):
            verify_proof(doc, [key.verifier])
