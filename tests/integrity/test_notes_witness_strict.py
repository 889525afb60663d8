"""Signed notes and witness requests read strictly: an error about a note never quotes a
line of its signature block (it may be a private key given by mistake), and a witness
request's old size is ASCII decimal as C2SP tlog-witness writes it, anything else a 400."""

from __future__ import annotations

import pytest

from ares_events.errors import ProofError, WitnessRefused
from ares_events.integrity import merkle
from ares_events.integrity.checkpoints import Checkpoint, read_checkpoint, sign_checkpoint
from ares_events.integrity.notes import EM_DASH, Note, SigningKey
from ares_events.integrity.witness import parse_request


def _pieces(secret: str, n: int = 6) -> list[str]:
    """Every ``n``-character piece of ``secret``: none may appear in an error."""
    return [secret[i : i + n] for i in range(len(secret) - n + 1)]


@pytest.mark.parametrize(
    "block",
    [
        "{key}\n",  # a key file's line where a signature line belongs
        "{sig}{key}\n",  # after a good signature line
        f"{EM_DASH} {{key}}\n",  # one field only
        f"{EM_DASH} a {{key}}\n",  # in a signature's place
        f"{EM_DASH} {{key}} AAAAAAAA\n",  # in a key name's place
        "{key} \n",
    ],
)
def test_a_note_error_never_quotes_a_signature_line(block: str) -> None:
    """A note whose signature block holds a private key's text is refused, and the error
    says where and what kind of line, never a piece of it (it printed 60 characters, most
    of the seed of a key with a short name)."""
    key = SigningKey.generate("a")
    note = sign_checkpoint(Checkpoint("a", 0, merkle.EMPTY_ROOT), key)
    sig = note.partition("\n\n")[2]
    text = "keys\n\n" + block.format(key=key.private_text(), sig=sig)
    secret = key.private_text().rsplit("+", 1)[1]
    with pytest.raises(ProofError) as info:
        read_checkpoint(text)
    reason = info.value.reason
    assert not [p for p in _pieces(secret) if p in reason], reason
    assert "PRIVATE+KEY+a" not in reason
    assert "line 1" in reason or "line 2" in reason  # where it is


def test_a_private_key_in_a_signature_block_is_named_as_such() -> None:
    """The one kind of line worth naming: a private key's, so its owner knows what was
    given (and nothing of it is shown)."""
    key = SigningKey.generate("example.com/log")
    with pytest.raises(ProofError) as info:
        Note.parse("keys\n\n" + key.private_text() + "\n")
    assert "private" in info.value.reason and key.name not in info.value.reason


@pytest.mark.parametrize(
    "size",
    [
        "\uff10",  # FULLWIDTH DIGIT ZERO: int() reads it as 0
        "\u0663",  # ARABIC-INDIC DIGIT THREE: int() reads it as 3
        "\u00b2",  # SUPERSCRIPT TWO: isdigit() is true, int() raises ValueError
        "1\u00b2",
        "+1",
        "-0",
        "01",
        " 1",
        "1 ",
        "",
        "9" * 20,
    ],
)
def test_an_old_size_that_is_not_ascii_decimal_is_a_400(size: str) -> None:
    """tlog-witness: "the tree size ... encoded as an ASCII decimal with no leading zeroes".
    A Unicode digit was cosigned (or, for a superscript, an internal error)."""
    key = SigningKey.generate("a")
    note = sign_checkpoint(Checkpoint("a", 0, merkle.EMPTY_ROOT), key)
    with pytest.raises(WitnessRefused) as info:
        parse_request(f"old {size}\n\n{note}")
    assert info.value.status == 400


@pytest.mark.parametrize("size", ["0", "7", "10", str(2**63 - 1)])
def test_an_ascii_decimal_old_size_parses(size: str) -> None:
    """The sizes the spec writes are read as before."""
    old, proof, _note = parse_request(f"old {size}\n\nnote\n")
    assert old == int(size) and proof == []
