"""Property tests of canonical JSON (format v1): the fast encoder is byte-identical to the
normative ``json.dumps`` form, and everything outside the allowed types is rejected with
an ``InvalidEvent`` that names the path of the bad value."""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ares_events.chain import (
    ChainKey,
    canonical_json,
    canonical_json_reference,
    header_bytes,
    link_hash,
    link_hashes,
    payload_digest,
    payload_digester,
)
from ares_events.errors import InvalidEvent
from tests.fixtures.tier import examples
from tests.integrity.test_vectors import ref_canonical

SETTINGS = settings(
    max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

INT_MIN, INT_MAX = -(2**63), 2**63 - 1

# Text with everything but lone surrogates: control characters, DEL, U+2028, emoji, ...
tricky_chars = st.sampled_from(
    ['"', "\\", "\n", "\r", "\t", "\b", "\f", "\x00", "\x01", "\x1f", "\x7f", "\x80",
     "\u2028", "\u2029", "\ufeff", "\uffff", "\U0001f600", "\U0010ffff", "é", "\u0301", "\u200d"]
)  # fmt: skip
text = st.text(
    alphabet=st.one_of(st.characters(exclude_categories=["Cs"]), tricky_chars), max_size=20
)
ints = st.one_of(
    st.integers(INT_MIN, INT_MAX),
    st.sampled_from([INT_MIN, INT_MIN + 1, -1, 0, 1, INT_MAX - 1, INT_MAX, 2**53, 2**53 + 1]),
)
floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
                     1e16, 1e15, 1e-7, 0.1, 1.0, 123456789012345680.0, 1 / 3]),
)  # fmt: skip
int_scalars = st.one_of(st.none(), st.booleans(), ints, text)
scalars = st.one_of(int_scalars, floats)


def json_values(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Nested lists and dicts (arbitrary str keys) over ``leaves``."""
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=5), st.dictionaries(text, children, max_size=5)
        ),
        max_leaves=25,
    )


values = json_values(scalars)
values_without_floats = json_values(int_scalars)


@SETTINGS
@given(values)
def test_canonical_json_equals_reference(x: Any) -> None:
    """canonical_json is byte-identical to json.dumps(sort_keys, compact, no ASCII escaping)."""
    assert canonical_json(x) == canonical_json_reference(x) == ref_canonical(x)


@SETTINGS
@given(values_without_floats)
def test_fast_path_equals_reference(x: Any) -> None:
    """Float-free values take the orjson fast path; it is byte-identical to json.dumps."""
    assert canonical_json(x) == ref_canonical(x)


@SETTINGS
@given(st.dictionaries(text, int_scalars, max_size=30))
def test_key_sorting_is_by_code_point(d: dict[str, Any]) -> None:
    """Object keys are sorted by code point, as json.dumps(sort_keys=True) sorts them."""
    assert canonical_json(d) == ref_canonical(d)
    assert list(json.loads(canonical_json(d))) == sorted(d)


@SETTINGS
@given(values)
def test_canonical_json_is_deterministic_and_idempotent(x: Any) -> None:
    """Encoding twice gives the same bytes, and decoding then re-encoding is stable."""
    first = canonical_json(x)
    assert canonical_json(x) == first
    assert canonical_json(json.loads(first)) == first


def _reorder(x: Any, rnd: Any) -> Any:
    if isinstance(x, dict):
        items = [(k, _reorder(v, rnd)) for k, v in x.items()]
        rnd.shuffle(items)
        return dict(items)
    if isinstance(x, list):
        return [_reorder(v, rnd) for v in x]
    return x


@SETTINGS
@given(values, st.randoms(use_true_random=False))
def test_key_insertion_order_does_not_matter(x: Any, rnd: Any) -> None:
    """Dicts with the same items in any insertion order encode to the same bytes."""
    assert canonical_json(_reorder(x, rnd)) == canonical_json(x)


@SETTINGS
@given(
    stream_id=text,
    version=st.integers(1, INT_MAX),
    event_id=text,
    type_=text,
    module=text,
    meta=st.dictionaries(text, values, max_size=4),
    at=text,
    digest=st.binary(min_size=32, max_size=32),
    size=st.integers(0, INT_MAX),
)
def test_header_bytes_equals_reference(
    stream_id: str,
    version: int,
    event_id: str,
    type_: str,
    module: str,
    meta: dict[str, Any],
    at: str,
    digest: bytes,
    size: int,
) -> None:
    """header_bytes (assembled from pieces) equals the canonical JSON of the header dict."""
    expected = ref_canonical(
        {
            "v": 1,
            "stream": stream_id,
            "version": version,
            "id": event_id,
            "type": type_,
            "module": module,
            "meta": meta,
            "at": at,
            "payload": digest.hex(),
            "size": size,
        }
    )
    got = header_bytes(
        stream_id, version, event_id, type_, module, canonical_json(meta, field="metadata"),
        at, digest.hex(), size,
    )  # fmt: skip
    assert got == expected


# -- rejected values -----------------------------------------------------------------------


class Color(enum.Enum):
    RED = 1


class IntColor(enum.IntEnum):
    RED = 1


BAD_VALUES = [
    float("nan"),
    float("inf"),
    float("-inf"),
    (1, 2),
    (),
    {1, 2},
    frozenset(),
    b"bytes",
    bytearray(b"x"),
    2**63,
    -(2**63) - 1,
    2**64,
    object(),
    datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    uuid.UUID(int=1),
    decimal.Decimal("1.5"),
    1j,
    Color.RED,
    IntColor.RED,
]
BAD_KEYS: list[Any] = [1, None, True, 1.5, (1,), b"k", uuid.UUID(int=1)]

# A path step is a str key (into a dict) or an int index (into a list of that length + 1).
path_steps = st.lists(st.one_of(text, st.integers(0, 3)), max_size=5)


def _nest(steps: list[str | int], leaf: Any, root: str) -> tuple[Any, str]:
    """Build a container holding ``leaf`` at ``steps``; return it and the leaf's path."""
    path = root
    for s in steps:
        path += f"[{s}]" if isinstance(s, int) else f".{s}"
    value = leaf
    for s in reversed(steps):
        value = [0] * s + [value] if isinstance(s, int) else {"ok": 1, s: value}
    return value, path


@SETTINGS
@given(
    steps=path_steps,
    bad=st.sampled_from(BAD_VALUES),
    root=st.sampled_from(["payload", "metadata"]),
)
def test_bad_values_are_rejected_naming_the_path(
    steps: list[str | int], bad: Any, root: str
) -> None:
    """NaN, infinities, tuples, sets, bytes, out-of-range ints and objects raise
    InvalidEvent whose field is the path of the bad value."""
    value, path = _nest(steps, bad, root)
    with pytest.raises(InvalidEvent) as info:
        canonical_json(value, field=root)
    assert info.value.field == path
    assert path in str(info.value)


@SETTINGS
@given(
    steps=path_steps,
    key=st.sampled_from(BAD_KEYS),
    root=st.sampled_from(["payload", "metadata"]),
)
def test_non_str_keys_are_rejected_naming_the_object(
    steps: list[str | int], key: Any, root: str
) -> None:
    """A dict with a non-str key raises InvalidEvent naming the path of that dict."""
    value, path = _nest(steps, {"a": 1, key: 2}, root)
    with pytest.raises(InvalidEvent) as info:
        canonical_json(value, field=root)
    assert info.value.field == path
    assert "not str" in info.value.problem


@pytest.mark.parametrize("floaty", [False, True], ids=["fast-path", "float-path"])
@pytest.mark.parametrize("where", ["value", "key"])
def test_lone_surrogates_are_rejected(floaty: bool, where: str) -> None:
    """Strings that are not valid Unicode cannot be UTF-8 encoded: InvalidEvent."""
    bad = "x\ud800y"
    value: dict[str, Any] = {bad: 1} if where == "key" else {"k": bad}
    if floaty:
        value["f"] = 1.5
    with pytest.raises(InvalidEvent) as info:
        canonical_json(value)
    assert info.value.field == "payload"


def test_too_deep_nesting_is_rejected() -> None:
    """Values nested deeper than the limit raise InvalidEvent instead of crashing."""
    x: Any = 1
    for _ in range(500):
        x = [x]
    with pytest.raises(InvalidEvent) as info:
        canonical_json(x)
    assert info.value.field.startswith("payload[0]")
    assert "deeper" in info.value.problem


def test_str_subclass_encodes_as_its_value() -> None:
    """A str subclass (e.g. a StrEnum member) encodes like json.dumps encodes it."""

    class Tag(enum.StrEnum):
        A = "alpha"

    x = {"tag": Tag.A, "k": [Tag.A]}
    assert canonical_json(x) == ref_canonical(x) == b'{"k":["alpha"],"tag":"alpha"}'


# -- the batch forms (one hasher reused) are the per-event forms ----------------------------


@dataclass
class _Ev:
    event_id: str
    type: str
    module: str
    meta_json: bytes
    at: str
    digest: bytes
    size: int


_ev = st.builds(
    _Ev,
    event_id=text,
    type=text,
    module=text,
    meta_json=st.dictionaries(text, values, max_size=3).map(
        lambda m: canonical_json(m, field="metadata")
    ),
    at=st.sampled_from(["2026-01-01T00:00:00.000000Z", 'é\u2028"\\']) | text,
    digest=st.binary(min_size=32, max_size=32),
    size=st.integers(0, INT_MAX),
)


@SETTINGS
@given(
    stream_id=text,
    version=st.integers(0, 2**40),
    prev=st.binary(min_size=32, max_size=32),
    events=st.lists(_ev, min_size=1, max_size=6),
    key=st.none() | st.binary(min_size=32, max_size=32).map(ChainKey),
)
def test_link_hashes_of_a_batch_equal_the_per_event_link_hashes(
    stream_id: str, version: int, prev: bytes, events: list[_Ev], key: ChainKey | None
) -> None:
    """link_hashes (batch work hoisted, one hasher reused) = link_hash(header_bytes(...))
    event by event, keyed or not."""
    expected = []
    h = prev
    for i, e in enumerate(events, start=version + 1):
        header = header_bytes(
            stream_id, i, e.event_id, e.type, e.module, e.meta_json, e.at, e.digest.hex(), e.size
        )
        h = link_hash(h, header, key)
        expected.append(h)
    assert link_hashes(stream_id, version, prev, events, key) == expected


@SETTINGS
@given(st.lists(st.binary(max_size=2000), min_size=1, max_size=8))
def test_a_reused_payload_digester_equals_payload_digest(payloads: list[bytes]) -> None:
    one = payload_digester()
    assert [one(p) for p in payloads] == [payload_digest(p) for p in payloads]
