"""A secret given by mistake as a command-line argument (a private key file's text, a
chain key) is never echoed by an error, human or --json (outsider hunt, records: `keygen
"$(cat alice.key)"` printed the whole private key in click's usage error)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.integrity.notes import SigningKey
from tests.fixtures.cli_helpers import run

KEY = SigningKey.generate("alice")
TEXT = KEY.private_text()
SEED = TEXT.split("+", 4)[4]  # base64(alg || seed): the secret itself
CHAIN_KEY = "7a" * 32


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/cli/conftest.py


STORE = ["--store", "sqlite:///{d}/s.db"]
CASES = [
    ["keygen", TEXT, "--out", "{d}/k"],  # the key in NAME's place
    ["keygen", "alice", TEXT, "--out", "{d}/k"],  # an unexpected extra argument
    ["verify-record", TEXT, "--vkey", KEY.verifier.text],
    ["verify-record", f" {TEXT}\n", "--vkey", KEY.verifier.text],
    [*STORE, "runs", "show", TEXT],
    [*STORE, "runs", "resume", "r", f"--expires-in={TEXT}"],
    [*STORE, "runs", "show", CHAIN_KEY],
    [*STORE, "tail", CHAIN_KEY.upper()],
]


@pytest.mark.parametrize("argv", CASES)
@pytest.mark.parametrize("json_arg", [(), ("--json",)])
def test_a_secret_argument_is_not_echoed_by_an_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    json_arg: tuple[str, ...],
) -> None:
    """Each fails (exit 2) saying why, without the key: stderr, and the --json error
    object on stdout."""
    with ae.open_store(f"sqlite:///{tmp_path}/s.db", create=True):
        pass
    args = [a.replace("{d}", str(tmp_path)) for a in argv]
    code, out, err = run(capsys, *json_arg, *args)
    assert code == 2, err
    assert "error" in err.lower() and "***" in err
    if json_arg:
        message = json.loads(out)["error"]["message"]
        assert "***" in message
    for secret in (SEED, CHAIN_KEY, CHAIN_KEY.upper()):
        assert secret not in out and secret not in err
