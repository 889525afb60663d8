"""The verifiable log from the command line: keygen, checkpoint, prove, verify-proof and
signed anchors, with their JSON shapes and exit codes; the signing key never leaks."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import pickle
import secrets
import stat
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.cli import main
from ares_events.errors import ConfigError
from ares_events.integrity.notes import (
    ALG_COSIGNATURE_V1,
    Note,
    NoteSignature,
    SigningKey,
    read_key_file,
)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI; return (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """A SQLite store with 10 events in 3 streams, a log key file and its verifier key."""
    url = f"sqlite:///{tmp_path / 'ev.db'}"
    with ae.open_store(url) as store:
        for i in range(10):
            ae.emit(store, f"a{i % 3}", "x.happened", "test", {"i": i})
    key = tmp_path / "log.key"
    code, out, _ = run(capsys, "keygen", "example.com/cli-log", "--out", str(key))
    assert code == 0
    return {"url": url, "key": str(key), "vkey": out.strip(), "dir": str(tmp_path)}


def test_keygen_writes_a_private_file_and_prints_only_the_verifier_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """keygen creates a 0600 key file, prints the verifier key alone on stdout, refuses to
    overwrite (exit 2), and the file's key verifies what the printed key says."""
    path = tmp_path / "k.key"
    code, out, err = run(capsys, "keygen", "example.com/k", "--out", str(path))
    assert code == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert out.count("\n") == 1 and out.startswith("example.com/k+")
    key = read_key_file(path)
    assert key.verifier.text == out.strip()
    assert key.private_text() not in out + err
    before = path.read_bytes()
    code, _, err = run(capsys, "keygen", "example.com/k", "--out", str(path))
    assert code == 2 and "refusing to overwrite" in err and path.read_bytes() == before
    code, out, _ = run(
        capsys, "keygen", "w.example/w", "--out", str(tmp_path / "w.key"), "--witness"
    )
    assert code == 0 and out.strip().split("+", 2)[2].startswith("B")  # type byte 0x04
    code, _, err = run(capsys, "keygen", "bad name", "--out", str(tmp_path / "x.key"))
    assert code == 2 and not (tmp_path / "x.key").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_keygen_and_add_log_take_json_before_or_after_the_command(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command that reports takes --json on either side of its name (docs/cli.md):
    keygen's and witness add-log's did not (ignored before, a usage error after)."""

    def cli(*args: str) -> tuple[int, str, str]:
        return run(capsys, *(("--json", *args) if where == "before" else (*args, "--json")))

    for role, flags in (("log", ()), ("witness", ("--witness",)), ("approver", ("--approver",))):
        path = tmp_path / f"{role}.key"
        code, out, err = cli("keygen", f"{role}.example/k", "--out", str(path), *flags)
        assert code == 0, err
        got = json.loads(out)
        key = read_key_file(path)
        assert got == {
            "name": f"{role}.example/k",
            "role": role,
            "key_file": str(path),
            "verifier_key": key.verifier.text,
        }
        assert key.private_text() not in out + err
    state = tmp_path / "w.db"
    code, out, err = cli(
        "witness", "add-log", str(read_key_file(tmp_path / "log.key").verifier.text),
        "--state", str(state),
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out) == {
        "origin": "log.example/k",
        "key_id": read_key_file(tmp_path / "log.key").verifier.key_id.hex(),
        "state": str(state),
    }


def test_checkpoint_prove_and_verify(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """checkpoint --json has exactly checkpoint/tree_size/root; prove --json has the issue's
    keys; verify-proof exits 0 on it, 1 on a tampered copy, 2 on a file that is no proof."""
    url, key, vkey, d = env["url"], env["key"], env["vkey"], Path(env["dir"])
    code, out, _ = run(capsys, "--store", url, "checkpoint", "--key", key, "--json")
    assert code == 0
    cp = json.loads(out)
    assert set(cp) == {"checkpoint", "tree_size", "root"} and cp["tree_size"] == 10
    assert cp["checkpoint"].startswith(
        f"example.com/cli-log\n10\n{cp['root']}\n\n\u2014 example.com/cli-log "
    )
    code, out, _ = run(capsys, "--store", url, "prove", "a1", "2", "--json")
    assert code == 0
    proof = json.loads(out)
    assert set(proof) == {"leaf_index", "tree_size", "leaf_data", "inclusion", "checkpoint"}
    assert proof["tree_size"] == 10 and proof["checkpoint"] == cp["checkpoint"]
    good = d / "proof.json"
    good.write_text(out)
    assert run(capsys, "verify-proof", str(good), "--vkey", vkey)[0] == 0
    (d / "vkey.txt").write_text(vkey + "\n")
    code, out, _ = run(capsys, "verify-proof", str(good), "--vkey", str(d / "vkey.txt"), "--json")
    assert code == 0 and json.loads(out)["ok"] is True
    bad = dict(proof, leaf_index=proof["leaf_index"] ^ 1)
    (d / "bad.json").write_text(json.dumps(bad))
    code, out, _ = run(capsys, "verify-proof", str(d / "bad.json"), "--vkey", vkey)
    assert code == 1 and "INVALID" in out
    other = SigningKey.generate("example.com/cli-log").verifier.text
    assert run(capsys, "verify-proof", str(good), "--vkey", other)[0] == 1
    (d / "nonsense.json").write_text("[1, 2]")
    assert run(capsys, "verify-proof", str(d / "nonsense.json"), "--vkey", vkey)[0] == 2
    assert run(capsys, "verify-proof", str(d / "missing.json"), "--vkey", vkey)[0] == 2
    assert run(capsys, "verify-proof", str(good), "--vkey", "not-a-key")[0] == 2
    (d / "binary.vkey").write_bytes(b"\xff\xfe")  # not a key file: one line, exit 2
    code, _, err = run(capsys, "verify-proof", str(good), "--vkey", str(d / "binary.vkey"))
    assert code == 2 and "not UTF-8 text" in err and "Traceback" not in err


def test_consistency_from_the_cli(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """prove --consistency between two stored checkpoints verifies offline; without a
    checkpoint it refuses (exit 2: signing one is a write) and signs the missing ones
    with --key."""
    url, key, vkey, d = env["url"], env["key"], env["vkey"], Path(env["dir"])
    assert run(capsys, "--store", url, "prove", "--consistency", "4", "--json")[0] == 2
    assert run(capsys, "--store", url, "checkpoint", "--key", key)[0] == 0
    with ae.open_store(url) as store:
        ae.emit(store, "b", "x.happened", "test", {})
    assert run(capsys, "--store", url, "checkpoint", "--key", key)[0] == 0
    code, out, _ = run(capsys, "--store", url, "prove", "--consistency", "10", "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["old_size"], doc["new_size"]) == (10, 11)
    assert {"old_size", "new_size", "consistency", "checkpoint"} <= set(doc)
    (d / "c.json").write_text(out)
    assert run(capsys, "verify-proof", str(d / "c.json"), "--vkey", vkey)[0] == 0
    code, out, _ = run(
        capsys, "--store", url, "prove", "--consistency", "4", "11", "--key", key, "--json"
    )
    assert code == 0
    (d / "c4.json").write_text(out)
    assert run(capsys, "verify-proof", str(d / "c4.json"), "--vkey", vkey)[0] == 0
    doc = json.loads(out)
    doc["consistency"][0] = doc["consistency"][1]
    (d / "c4bad.json").write_text(json.dumps(doc))
    assert run(capsys, "verify-proof", str(d / "c4bad.json"), "--vkey", vkey)[0] == 1
    doc = json.loads(out)
    doc["old_checkpoint"] = None
    (d / "c4none.json").write_text(json.dumps(doc))
    assert run(capsys, "verify-proof", str(d / "c4none.json"), "--vkey", vkey)[0] == 1
    assert (
        run(
            capsys,
            "verify-proof",
            str(d / "c4none.json"),
            "--vkey",
            vkey,
            "--old",
            str(d / "c4.json"),
        )[0]
        == 1
    )  # c4.json's checkpoint is of size 11, not 4
    assert run(capsys, "--store", url, "prove", "a1", "99")[0] == 2
    assert run(capsys, "--store", url, "prove", "a1")[0] == 2


def test_key_from_the_environment_and_missing_key(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ARES_LOG_KEY_FILE stands in for --key; with neither, signing commands exit 2."""
    assert run(capsys, "--store", env["url"], "checkpoint")[0] == 2
    monkeypatch.setenv("ARES_LOG_KEY_FILE", env["key"])
    code, out, _ = run(capsys, "--store", env["url"], "checkpoint", "--json")
    assert code == 0 and json.loads(out)["tree_size"] == 10
    monkeypatch.setenv("ARES_LOG_VKEY", env["vkey"])
    code, out, _ = run(
        capsys, "--store", env["url"], "prove", "a0", "1", "--out", str(Path(env["dir"]) / "p.json")
    )
    assert code == 0
    assert run(capsys, "verify-proof", str(Path(env["dir"]) / "p.json"))[0] == 0


def test_the_signing_key_never_leaks(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Across every command that reads the key (with -vv logging), no output, log record or
    error shows the key file's secret; repr/str of a key do not either, and it does not
    pickle; a malformed key file's error does not echo it."""
    caplog.set_level(logging.DEBUG)
    key = read_key_file(env["key"])
    secret = key.private_text()
    # PRIVATE+KEY+<name>+<id>+<base64>: the base64 part may itself contain "+", so split from
    # the left (the name cannot contain "+").
    seed64 = secret.split("+", 4)[4]
    assert len(seed64) == 44, seed64
    url, d = env["url"], Path(env["dir"])
    outputs = []
    for args in (
        ["checkpoint", "--key", env["key"], "--json"],
        ["checkpoint", "--key", env["key"]],
        ["prove", "a1", "1", "--key", env["key"], "--json"],
        ["prove", "--consistency", "3", "--key", env["key"], "--json"],
        ["anchor", "--key", env["key"], "--witness", str(d / "w"), "--json"],
        ["anchor", "--check", "--key", env["key"], "--witness", str(d / "w")],
    ):
        code, out, err = run(capsys, "-vv", "--store", url, *args)
        assert code == 0, (args, err)
        outputs += [out, err]
    outputs += [r.getMessage() for r in caplog.records]
    outputs += [repr(key), str(key), repr(key.verifier)]
    for text in outputs:
        assert secret not in text and seed64 not in text
    with pytest.raises(TypeError):
        pickle.dumps(key)
    broken = d / "broken.key"
    broken.write_text(secret[:-6] + "AAAAAA\n")
    with pytest.raises(ConfigError) as info:
        read_key_file(broken)
    assert seed64[:20] not in str(info.value)
    code, _, err = run(capsys, "--store", url, "checkpoint", "--key", str(broken))
    assert code == 2 and seed64[:20] not in err


def test_signed_anchor_and_audit(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """anchor --key writes a signed checkpoint note to the witness; anchor --check and
    audit --anchors check it (clean, then anchor_truncated after a deleted tail); without a
    key anchor is a usage error and writes nothing."""
    import sqlite3

    url, key, vkey, d = env["url"], env["key"], env["vkey"], Path(env["dir"])
    witness = str(d / "witness")
    code, out, _ = run(
        capsys, "--store", url, "anchor", "--key", key, "--witness", witness, "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["tree_size"] == 10 and Path(data["location"]).name.startswith("checkpoint-")
    code, out, _ = run(
        capsys, "--store", url, "anchor", "--check", "--witness", witness, "--vkey", vkey, "--json"
    )
    assert code == 0 and json.loads(out)["anchors_checked"] == 1
    code, out, _ = run(
        capsys, "--store", url, "audit", "--anchors", witness, "--vkey", vkey, "--json"
    )
    assert code == 0 and json.loads(out)["anchors_checked"] == 1
    code, _, err = run(capsys, "--store", url, "anchor", "--witness", witness)
    assert code == 2 and "--key FILE" in err
    assert len(list(Path(witness).iterdir())) == 1
    with contextlib.closing(sqlite3.connect(d / "ev.db")) as conn, conn:
        conn.execute("DELETE FROM ares_events WHERE position > 7")
    code, out, _ = run(
        capsys, "--store", url, "audit", "--anchors", witness, "--vkey", vkey, "--json"
    )
    assert code == 1
    kinds = {f["kind"] for f in json.loads(out)["findings"]}
    assert "anchor_truncated" in kinds


def test_every_subcommand_is_documented_with_help(capsys: pytest.CaptureFixture[str]) -> None:
    """Every subcommand of every command group answers --help with text and appears in
    docs/cli.md as `ares-events GROUP SUB`."""
    import click

    from ares_events.cli import cli

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    assert isinstance(cli, click.Group)
    found = 0
    for name, cmd in sorted(cli.commands.items()):
        if not isinstance(cmd, click.Group):
            continue
        for sub in sorted(cmd.commands):
            code, out, _ = run(capsys, name, sub, "--help")
            assert code == 0 and f"Usage: ares-events {name} {sub}" in out, (name, sub)
            assert len(out.split("\n\n")[1].strip()) > 20, (name, sub)  # a description
            assert f"ares-events {name} {sub}" in doc, (name, sub)
            found += 1
    assert found >= 3


def _resigned(note: str, *lines: NoteSignature) -> str:
    """``note``'s checkpoint text carrying only the signature lines ``lines``."""
    return Note(Note.parse(note).text, lines).format()


def test_verify_proof_needs_the_origins_own_signature(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint of the log signed only by another trusted log's key, or carrying only a
    trusted witness's cosignature, is invalid (exit 1, new and old checkpoint alike); the
    log's signature plus a witness's cosignature is valid and lists both."""
    url, key, vkey, d = env["url"], env["key"], env["vkey"], Path(env["dir"])
    other = SigningKey.generate("other.example/log")
    witness = SigningKey.generate("w.example/w1", alg=ALG_COSIGNATURE_V1)
    assert run(capsys, "--store", url, "checkpoint", "--key", key)[0] == 0
    code, out, _ = run(capsys, "--store", url, "prove", "a1", "2", "--json")
    assert code == 0
    proof = json.loads(out)
    text = Note.parse(proof["checkpoint"]).text.encode()
    by_other = NoteSignature(other.name, other.signature(text))
    by_witness = NoteSignature(witness.name, witness.signature(text))
    cases = {
        "other": (_resigned(proof["checkpoint"], by_other), other),
        "witness": (_resigned(proof["checkpoint"], by_witness), witness),
    }
    for name, (note, signer) in cases.items():
        (d / f"{name}.json").write_text(json.dumps(dict(proof, checkpoint=note)))
        args = ["verify-proof", str(d / f"{name}.json"), "--vkey", vkey]
        code, out, _ = run(capsys, *args, "--vkey", signer.verifier.text, "--json")
        assert code == 1, name
        check = json.loads(out)
        assert check["ok"] is False
        assert "example.com/cli-log" in check["reason"] and "signed it" in check["reason"]
    both = Note.parse(proof["checkpoint"]).with_signatures([by_witness]).format()
    (d / "both.json").write_text(json.dumps(dict(proof, checkpoint=both)))
    args = ["verify-proof", str(d / "both.json"), "--vkey", vkey]
    code, out, _ = run(capsys, *args, "--vkey", witness.verifier.text, "--json")
    assert code == 0, out
    assert json.loads(out)["signed_by"] == ["example.com/cli-log", "w.example/w1"]
    # A consistency proof whose old checkpoint only another trusted log's key signed.
    with ae.open_store(url) as store:
        ae.emit(store, "b", "x.happened", "test", {})
    assert run(capsys, "--store", url, "checkpoint", "--key", key)[0] == 0
    code, out, _ = run(capsys, "--store", url, "prove", "--consistency", "10", "--json")
    assert code == 0
    growth = json.loads(out)
    old = growth["old_checkpoint"]
    forged_old = _resigned(
        old, NoteSignature(other.name, other.signature(Note.parse(old).text.encode()))
    )
    (d / "growth.json").write_text(json.dumps(dict(growth, old_checkpoint=forged_old)))
    args = ["verify-proof", str(d / "growth.json"), "--vkey", vkey]
    assert run(capsys, *args)[0] == 1  # the log's own old checkpoint is needed...
    assert run(capsys, *args, "--vkey", other.verifier.text)[0] == 1  # ...not another's
    (d / "growth_ok.json").write_text(json.dumps(growth))
    assert run(capsys, "verify-proof", str(d / "growth_ok.json"), "--vkey", vkey)[0] == 0


def _secrets(tmp_path: Path) -> dict[str, tuple[str, list[str]]]:
    """Files that hold a secret where a verifier key belongs: name -> (file content, the
    secret parts that must never be printed)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    chain = secrets.token_hex(32)
    pem = (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    body = pem.splitlines()[1]
    # A PEM body with '+' in it: the text splits into a would-be name, key ID and key.
    plus = pem.replace(body, body[:10] + "+" + body[11:20] + "+" + body[21:])
    signing = SigningKey.generate("example.com/secret").private_text()
    return {
        "chain": (chain + "\n", [chain]),
        "pem": (pem, [body]),
        "pem_plus": (plus, [body[:10], body[11:20], body[21:]]),
        "signing": (signing + "\n", [signing.split("+", 4)[4]]),
    }


def _leaked(parts: list[str], text: str) -> list[str]:
    """The 8-character pieces of ``parts`` found in ``text``."""
    return [p[i : i + 8] for p in parts for i in range(len(p) - 7) if p[i : i + 8] in text]


def test_a_secret_given_as_a_verifier_key_is_never_printed(
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A chain key, a PEM private key or a signing key in a --vkey file or in ARES_LOG_VKEY:
    exit 2 with an error naming the file or the variable, and none of the secret on stdout,
    stderr or in --json."""
    url, key = env["url"], env["key"]
    assert run(capsys, "--store", url, "checkpoint", "--key", key)[0] == 0
    proof = tmp_path / "p.json"
    assert run(capsys, "--store", url, "prove", "a1", "2", "--out", str(proof))[0] == 0
    for name, (content, parts) in _secrets(tmp_path).items():
        f = tmp_path / f"{name}.key"
        f.write_text(content)
        for json_flag in ([], ["--json"]):
            code, out, err = run(capsys, "verify-proof", str(proof), "--vkey", str(f), *json_flag)
            assert code == 2, (name, out, err)
            assert f"verifier key file {f}" in out + err
            assert not _leaked(parts, out + err), (name, out, err)
            for value in content.split():  # ARES_LOG_VKEY: one or more keys
                monkeypatch.setenv("ARES_LOG_VKEY", value)
                code, out, err = run(capsys, "verify-proof", str(proof), *json_flag)
                monkeypatch.delenv("ARES_LOG_VKEY")
                assert code == 2, (name, out, err)
                assert "ARES_LOG_VKEY" in out + err
                assert not _leaked(parts, out + err), (name, out, err)
            monkeypatch.setenv("ARES_LOG_VKEY", content)
            code, out, err = run(capsys, "verify-proof", str(proof), *json_flag)
            monkeypatch.delenv("ARES_LOG_VKEY")
            assert code == 2 and "ARES_LOG_VKEY" in out + err, (name, out, err)
            assert not _leaked(parts, out + err), (name, out, err)
            if json_flag:
                assert json.loads(out)["error"]["exit_code"] == 2


def test_a_unicode_key_name_signs_and_verifies(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """keygen takes a UTF-8 key name (C2SP signed-note allows it): checkpoint, prove and
    verify-proof round-trip with it; a name that is not well-formed UTF-8 exits 2."""
    url, name = env["url"], "log.例え.jp/é"
    other = f"sqlite:///{tmp_path / 'u.db'}"
    with ae.open_store(other) as store:
        for i in range(3):
            ae.emit(store, "u", "x.happened", "test", {"i": i})
    key = tmp_path / "u.key"
    code, vkey, err = run(capsys, "keygen", name, "--out", str(key))
    assert code == 0, err
    assert vkey.startswith(name + "+") and read_key_file(key).name == name
    code, out, _ = run(capsys, "--store", other, "checkpoint", "--key", str(key), "--json")
    assert code == 0 and json.loads(out)["checkpoint"].startswith(name + "\n3\n")
    proof = tmp_path / "u.json"
    assert run(capsys, "--store", other, "prove", "u", "2", "--out", str(proof))[0] == 0
    code, out, _ = run(capsys, "verify-proof", str(proof), "--vkey", vkey.strip(), "--json")
    assert code == 0, out
    check = json.loads(out)
    assert check["origin"] == name and check["signed_by"] == [name]
    (tmp_path / "u.vkey").write_text(vkey)
    assert run(capsys, "verify-proof", str(proof), "--vkey", str(tmp_path / "u.vkey"))[0] == 0
    # What Python makes of command-line bytes that are not UTF-8: a lone surrogate.
    code, _, err = run(capsys, "keygen", "log\udcff", "--out", str(tmp_path / "bad.key"))
    assert code == 2 and "UTF-8" in err and not (tmp_path / "bad.key").exists()
    assert run(capsys, "--store", url, "checkpoint", "--key", env["key"])[0] == 0


def test_a_deeply_nested_proof_file_is_a_usage_error(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """verify-proof on JSON nested deeper than the parser goes (as the proof, or as --old)
    exits 2 with a one-line reason, not an internal error."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    code, _, err = run(capsys, "verify-proof", str(deep), "--vkey", env["vkey"])
    assert code == 2 and "nested too deeply" in err and "internal error" not in err
    url = env["url"]
    assert run(capsys, "--store", url, "checkpoint", "--key", env["key"])[0] == 0
    proof = tmp_path / "p.json"
    assert run(capsys, "--store", url, "prove", "--consistency", "0", "--out", str(proof))[0] == 0
    code, _, err = run(
        capsys, "verify-proof", str(proof), "--vkey", env["vkey"], "--old", str(deep)
    )
    assert code == 2 and "internal error" not in err


@pytest.mark.parametrize(
    "head",
    [
        '{"position": 10, "size": "x"}',
        '{"position": 10, "size": -1}',
        '{"position": 10, "size": true}',
        '{"position": "10", "size": 10}',
        '{"size": 10}',
        "[10, 10]",
    ],
)
def test_a_damaged_merkle_head_is_a_damaged_store(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], head: str
) -> None:
    """prove on a store whose Merkle log head row is not a head: exit 3 naming the row and
    the rebuild that repairs it (--json too); after that rebuild prove works again."""
    import sqlite3

    url, d = env["url"], Path(env["dir"])
    assert run(capsys, "--store", url, "checkpoint", "--key", env["key"])[0] == 0
    with contextlib.closing(sqlite3.connect(d / "ev.db")) as conn, conn:
        (table,) = conn.execute(
            "SELECT active_table FROM ares_projections WHERE name = 'merkle_log'"
        ).fetchone()
        n = conn.execute(
            f"UPDATE {table} SET state = CAST(? AS BLOB) WHERE key = 'head'", (head,)
        ).rowcount
    assert n == 1
    code, _, err = run(capsys, "--store", url, "prove", "a1", "2")
    assert code == 3, err
    assert "'head'" in err and "rebuild merkle_log" in err and "internal error" not in err
    code, out, _ = run(capsys, "--store", url, "prove", "a1", "2", "--json")
    assert code == 3 and json.loads(out)["error"]["kind"] == "unavailable"
    assert run(capsys, "--store", url, "rebuild", "merkle_log")[0] == 0
    assert run(capsys, "--store", url, "prove", "a1", "2", "--json")[0] == 0


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("tree_size", 112, "differs from its signed note"),
        ("origin", "example.com/other", "differs from its signed note"),
        ("note", "not a note", "note is not a checkpoint"),
    ],
)
def test_checkpoint_list_shows_no_row_its_note_does_not_say(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], column: str, value: object, says: str
) -> None:
    """`checkpoint --list` lists each stored checkpoint's columns; one edited so that they
    are no longer what its signed note says (or whose note is no checkpoint) is named as
    such with exit 1, never listed as a checkpoint that was signed."""
    import sqlite3

    url, d = env["url"], Path(env["dir"])
    assert run(capsys, "--store", url, "checkpoint", "--key", env["key"])[0] == 0
    code, out, _ = run(capsys, "--store", url, "checkpoint", "--list", "--json")
    assert code == 0 and [c["problem"] for c in json.loads(out)["checkpoints"]] == [None]
    with contextlib.closing(sqlite3.connect(d / "ev.db")) as conn, conn:
        conn.execute(f"UPDATE ares_checkpoints SET {column} = ?", (value,))
    code, out, _ = run(capsys, "--store", url, "checkpoint", "--list", "--json")
    (row,) = json.loads(out)["checkpoints"]
    assert code == 1 and says in row["problem"]
    code, out, _ = run(capsys, "--store", url, "checkpoint", "--list")
    assert code == 1 and says in out


def test_checkpoint_and_anchor_refuse_to_sign_a_rewritten_log(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """After an event is rewritten (chain recomputed) and the Merkle log rebuilt,
    checkpoint --key and anchor --key exit 1 saying the log no longer matches its
    checkpoint (--json: a findings error), write no note, and keep the one stored
    checkpoint; after another append, checkpoint and prove --key refuse too."""
    from tests.projections.test_merkle_log import _rewrite_event

    url, key, d = env["url"], env["key"], Path(env["dir"])
    witness = str(d / "witness")
    code, out, _ = run(capsys, "--store", url, "checkpoint", "--key", key, "--json")
    assert code == 0
    honest = json.loads(out)
    _rewrite_event(d / "ev.db", "a1", 2, {"i": "forged"})
    assert run(capsys, "--store", url, "audit")[0] == 0  # the bare chain is fooled
    assert run(capsys, "--store", url, "rebuild", "merkle_log")[0] == 0
    says = "no longer matches its checkpoint at size 10"
    code, out, err = run(capsys, "--store", url, "checkpoint", "--key", key)
    assert code == 1 and says in err and out == ""
    code, out, _ = run(capsys, "--store", url, "checkpoint", "--key", key, "--json")
    error = json.loads(out)["error"]
    assert code == 1 and error["kind"] == "findings" and says in error["message"]
    code, out, err = run(capsys, "--store", url, "anchor", "--key", key, "--witness", witness)
    assert code == 1 and says in err and not Path(witness).exists()
    with ae.open_store(url) as store:
        ae.emit(store, "b", "x.happened", "test", {})
    code, _, err = run(capsys, "--store", url, "checkpoint", "--key", key)
    assert code == 1 and says in err
    code, _, err = run(capsys, "--store", url, "prove", "b", "1", "--key", key)
    assert code == 1 and says in err
    code, out, _ = run(capsys, "--store", url, "checkpoint", "--list", "--json")
    rows = json.loads(out)["checkpoints"]
    assert code == 0 and [(r["tree_size"], r["root"]) for r in rows] == [(10, honest["root"])]


def test_verify_proof_refuses_a_document_of_both_kinds(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A real inclusion proof with a made-up consistency proof added (or with both kinds
    removed) is not a proof: verify-proof exits 2 and says so (--json: a usage error),
    rather than checking one kind and calling the file valid."""
    url, key, vkey, d = env["url"], env["key"], env["vkey"], Path(env["dir"])
    code, out, _ = run(capsys, "--store", url, "prove", "a1", "1", "--key", key, "--json")
    assert code == 0
    proof = json.loads(out)
    bogus = base64.b64encode(b"\x07" * 32).decode()
    both = dict(proof, old_size=2, new_size=10, consistency=[bogus], old_checkpoint=None)
    neither = {k: v for k, v in proof.items() if k != "inclusion"}
    for name, doc in (("both", both), ("neither", neither)):
        (d / f"{name}.json").write_text(json.dumps(doc))
        code, out, err = run(capsys, "verify-proof", str(d / f"{name}.json"), "--vkey", vkey)
        assert code == 2 and "not a proof" in err and "valid" not in out, name
        code, out, _ = run(
            capsys, "verify-proof", str(d / f"{name}.json"), "--vkey", vkey, "--json"
        )
        assert code == 2 and "not a proof" in json.loads(out)["error"]["message"], name
