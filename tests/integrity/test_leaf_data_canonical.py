"""verify-proof binds the exact bytes of an inclusion proof: leaf_data is lowercase hex, as
prove writes it; another spelling of the same bytes (a changed case, a space) is refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import ares_events as ae
from ares_events.integrity.checkpoints import verify_proof
from ares_events.integrity.notes import SigningKey

RESPELL: dict[str, Callable[[str], str]] = {
    "upper": str.upper,
    "space": lambda h: h[:2] + " " + h[2:],
    "newline": lambda h: h + "\n",
}


@pytest.mark.parametrize("respell", RESPELL.values(), ids=RESPELL.keys())
def test_leaf_data_in_another_spelling_is_refused(respell: Callable[[str], str]) -> None:
    key = SigningKey.generate("example.com/log")
    with ae.open_store("memory://") as store:
        for i in range(5):
            ae.emit(store, "s0", "note.added", "runtime", {"i": i})
        doc = ae.MerkleLog(store).prove_event("s0", 3, key=key)
    assert verify_proof(doc, [key.verifier]).ok
    bad = dict(doc, leaf_data=respell(doc["leaf_data"]))
    assert bad != doc
    check = verify_proof(bad, [key.verifier])
    assert not check.ok and "lowercase hex" in (check.reason or "")
