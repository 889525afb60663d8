"""The optional native verifier (``ares_events._native``) against the pure-Python
reference: its BLAKE3 equals the ``blake3`` package's on any input and key, and its
``verify_run`` gives the same answer (index, last version, last hash) as
:func:`ares_events.chain.verify_run` on valid pages and on every kind of
tamper; a :class:`ChainVerifier` records the same findings with it on and off.

The extension is built by ``pip install`` (``scripts/test``); a test environment where it
did not build fails here, unless ``ARES_EVENTS_NO_NATIVE=1`` says it is meant to be off
(then the conformance and tamper suites run on the Python verifier).
"""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import blake3
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ares_events import chain
from ares_events import errors as ae_errors
from ares_events.chain import (
    ChainKey,
    _cache_name,
    _encode_str,
    canonical_json,
    genesis,
    header_bytes,
    link_hash,
    link_hashes_reference,
    payload_digest,
)
from ares_events.core.events import (
    _UUID7,
    ErasedPayloadRef,
    MalformedPayloadRef,
    PayloadRef,
    PreparedEvent,
    RecordedEvent,
    uuid7_reference,
)
from ares_events.core.row_pages import EventPage
from ares_events.integrity import verifier
from tests.fixtures.tier import examples
from tests.integrity.test_codec import scalars, text

SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
small_values = st.recursive(
    scalars,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(text, c, max_size=3)),
    max_leaves=6,
)
NO_NATIVE = os.environ.get(chain.NO_NATIVE_ENV, "") not in ("", "0")
BUILD_HINT = (
    "the C extension ares_events._native did not build: install a C compiler "
    "and the Python headers (e.g. apt-get install gcc python3-dev) and reinstall "
    "(rm .venv/.ares-events-installed; scripts/test), or set ARES_EVENTS_NO_NATIVE=1"
)


def _import_native() -> ModuleType | None:
    try:
        return importlib.import_module("ares_events._native")
    except ImportError:
        return None


@pytest.fixture(scope="module")
def native() -> ModuleType:
    mod = _import_native()
    if mod is None:
        if NO_NATIVE:
            pytest.skip("ARES_EVENTS_NO_NATIVE is set and the extension is not built")
        pytest.fail(BUILD_HINT)
    return mod


def test_the_native_verifier_is_built_and_in_use() -> None:
    """Fails (never skips) when the extension is missing from the test environment."""
    if NO_NATIVE:
        assert chain._native is None
        return
    assert _import_native() is not None, BUILD_HINT
    assert chain._native is not None


def test_the_sqlite_writer_is_in_use_on_cpython() -> None:
    """SQLite appends take the native writer on CPython with the extension (its own tests
    skip without it, so this one says when it is missing)."""
    from ares_events.stores.sqlite import writes

    if NO_NATIVE or sys.implementation.name != "cpython":
        assert not writes.NATIVE_WRITES
        return
    assert _import_native() is not None, BUILD_HINT
    if getattr(sys.modules.get("_sqlite3"), "__file__", None) is None:
        # _sqlite3 built into the interpreter: no library to find SQLite's functions in
        assert not writes.NATIVE_WRITES
        return
    maps = Path("/proc/self/maps")
    if not maps.exists() or "libsqlite3" not in maps.read_text():
        # SQLite linked into _sqlite3 itself (whether it exports its functions varies)
        pytest.skip("this CPython's SQLite is not a shared libsqlite3: the writer may be off")
    assert writes.NATIVE_WRITES, "the SQLite writer is off on this CPython (writes.py says why)"


def test_the_writer_reads_a_handle_only_where_it_saw_one(native: ModuleType) -> None:
    """The writer takes a connection's sqlite3 handle from a private struct, so the check
    opens a probe and compares: a connection opened before the check, a probe that is not
    a Connection and a factory that fails are refused; a writer refuses anything but a
    Connection."""
    import sqlite3

    from ares_events.stores.sqlite import writes

    if not writes.NATIVE_WRITES:  # its import ran sqlite_setup, which a check needs first
        pytest.skip("the SQLite writer is off here (test_the_sqlite_writer_is_in_use says why)")
    check = native.sqlite_handle_check
    before = sqlite3.connect(":memory:")

    def fails(_: str) -> sqlite3.Connection:
        raise sqlite3.OperationalError("no")

    class Sub(sqlite3.Connection):
        pass

    try:
        assert check(lambda _: before, sqlite3.Connection) is False
        assert check(lambda _: object(), sqlite3.Connection) is False
        assert check(fails, sqlite3.Connection) is False
        assert check(sqlite3.connect, sqlite3.Connection) is True
        assert check(Sub, sqlite3.Connection) is True
        assert check(sqlite3.connect, Sub) is False  # not the type checked first
    finally:
        before.close()
    with pytest.raises(TypeError, match=r"needs a sqlite3\.Connection"):
        native.SQLiteWriter(object(), *["SELECT 1"] * 5, *[None] * 5)


@pytest.mark.slow  # starts child processes: the whole suite runs it
@pytest.mark.parametrize(("value", "off"), [("1", True), ("0", False), ("", False)])
def test_the_environment_switch(value: str, off: bool) -> None:
    env = {**os.environ, chain.NO_NATIVE_ENV: value}
    out = subprocess.run(
        [sys.executable, "-c", "from ares_events import chain; print(chain._native is None)"],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.strip()  # fmt: skip
    if off:
        assert out == "True"
    elif _import_native() is not None:
        assert out == "False"


# -- BLAKE3 ----------------------------------------------------------------------------------

# Around the block (64) and chunk (1024) sizes and the tree's power-of-two shapes.
LENGTHS = sorted(
    {0, 1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025, 2047, 2048, 2049}
    | {3072, 3073, 4095, 4096, 4097, 5 * 1024, 7 * 1024 + 1, 8192, 8193, 16384, 16385}
    | {31 * 1024 + 5, 65536, 65537, 100_000, (1 << 20) + 7}
)


WIDTHS = (0, 1, 4, 8, 16)
"""verify_page's lanes: the CPU's best, one at a time, 4, 8 and 16 (16 falls back to 8
without AVX-512, 8 to 4 without AVX2)."""


@pytest.mark.parametrize("length", LENGTHS)
def test_blake3_at_boundary_lengths(native: ModuleType, length: int) -> None:
    rnd = random.Random(length)
    data = rnd.randbytes(length)
    key = rnd.randbytes(32)
    assert native.blake3_hash(data) == blake3.blake3(data).digest()
    assert native.blake3_hash(data, key) == blake3.blake3(data, key=key).digest()


@SETTINGS
@given(data=st.binary(max_size=6000), key=st.binary(min_size=32, max_size=32))
def test_blake3_equals_the_package(native: ModuleType, data: bytes, key: bytes) -> None:
    assert native.blake3_hash(data) == blake3.blake3(data).digest()
    assert native.blake3_hash(data, key=key) == blake3.blake3(data, key=key).digest()


# The official BLAKE3 test vectors (BLAKE3-team/BLAKE3, test_vectors/test_vectors.json):
# every input length class they cover, input bytes 0, 1, ..., 250, 0, 1, ...; the chain
# uses the hash and keyed_hash modes (derive_key goes through the blake3 package).
OFFICIAL_LENGTHS = (
    0, 1, 2, 3, 4, 5, 6, 7, 8, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025, 2048, 2049,
    3072, 3073, 4096, 4097, 5120, 5121, 6144, 6145, 7168, 7169, 8192, 8193, 16384, 31744,
    102400,
)  # fmt: skip
OFFICIAL_KEY = b"whats the Elvish word for friend"
# First 32 bytes of some official outputs, copied from the file: the package itself is
# held to the file here, then the native hash to the package at every length.
OFFICIAL = {
    (0, False): "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
    (1, False): "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213",
    (1024, False): "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7",
    (1024, True): "75c46f6f3d9eb4f55ecaaee480db732e6c2105546f1e675003687c31719c7ba4",
    (2049, True): "9f29700902f7c86e514ddc4df1e3049f258b2472b6dd5267f61bf13983b78dd5",
}


@SETTINGS
@given(
    items=st.lists(
        st.one_of(st.binary(max_size=1100), st.binary(min_size=1020, max_size=9000)),
        max_size=12,
    ),
    key=st.one_of(st.none(), st.binary(min_size=32, max_size=32)),
)
def test_blake3_many_equals_the_package(
    native: ModuleType, items: list[bytes], key: bytes | None
) -> None:
    """The lanes-wide hashing verify_page uses, at every width, on inputs of mixed lengths
    (a lane takes the next input when its own is done; an input of several chunks is
    hashed chunk by chunk beside the others, then joined)."""
    want = [
        (blake3.blake3(x) if key is None else blake3.blake3(x, key=key)).digest() for x in items
    ]
    for width in WIDTHS:
        assert native.blake3_many(items, key, width) == want


@pytest.mark.parametrize("width", WIDTHS)
def test_blake3_many_at_boundary_lengths(native: ModuleType, width: int) -> None:
    rnd = random.Random(width)
    items = [rnd.randbytes(n) for n in LENGTHS]
    assert native.blake3_many(items, None, width) == [blake3.blake3(x).digest() for x in items]


def _official_input(length: int) -> bytes:
    return bytes(i % 251 for i in range(length))


@pytest.mark.parametrize("length", OFFICIAL_LENGTHS)
def test_blake3_official_vectors(native: ModuleType, length: int) -> None:
    """The hand-written BLAKE3 gives the official test vectors' hash and keyed_hash."""
    data = _official_input(length)
    for keyed in (False, True):
        want = (blake3.blake3(data, key=OFFICIAL_KEY) if keyed else blake3.blake3(data)).digest()
        if (length, keyed) in OFFICIAL:
            assert want.hex() == OFFICIAL[length, keyed]
        got = native.blake3_hash(data, OFFICIAL_KEY) if keyed else native.blake3_hash(data)
        assert got == want, f"length {length}, keyed={keyed}"
        for width in WIDTHS:  # lanes-wide, beside a short input and the same one again
            key = OFFICIAL_KEY if keyed else None
            many = native.blake3_many([b"x", data, data], key, width)
            assert many[1:] == [want, want], f"length {length}, keyed={keyed}, width {width}"


def test_blake3_refuses_a_bad_key_without_echoing_it(native: ModuleType) -> None:
    secret = b"k" * 31
    with pytest.raises(ValueError, match="32 bytes") as info:
        native.blake3_hash(b"x", secret)
    assert "kkk" not in str(info.value)


# -- pages -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    stream: str
    events: list[RecordedEvent]
    start_version: int
    start_hash: bytes
    key: ChainKey | None


def _event(
    stream: str, version: int, eid: str, type_: str, module: str, payload: Any, meta: Any,
    at: str, prev: bytes, key: ChainKey | None,
) -> RecordedEvent:  # fmt: skip
    pb = canonical_json(payload)
    mj = canonical_json(meta, field="metadata")
    header = header_bytes(
        stream, version, eid, type_, module, mj, at, payload_digest(pb).hex(), len(pb)
    )
    h = link_hash(prev, header, key)
    return RecordedEvent(stream, version, version * 3, eid, type_, module, pb, mj, at, prev, h)


realistic_at = st.datetimes().map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
names = st.one_of(st.sampled_from(["Started", "tool.Called", "ares.agent"]), text)
keys = st.one_of(st.none(), st.binary(min_size=32, max_size=32).map(ChainKey))


@st.composite
def pages(draw: st.DrawFn, max_events: int = 6) -> Page:
    stream = draw(st.one_of(st.sampled_from(["s", "agent-1/run"]), text))
    key = draw(keys)
    if draw(st.booleans()):
        start_version, start_hash = 0, genesis(stream)
    else:
        start_version = draw(st.integers(1, 2**62))
        start_hash = draw(st.binary(min_size=32, max_size=32))
    out: list[RecordedEvent] = []
    prev, version = start_hash, start_version
    for _ in range(draw(st.integers(0, max_events))):
        version += 1
        e = _event(
            stream,
            version,
            draw(st.one_of(st.uuids().map(str), text)),
            draw(names),
            draw(names),
            draw(small_values),
            draw(st.dictionaries(text, small_values, max_size=3)),
            draw(st.one_of(realistic_at, text)),
            prev,
            key,
        )
        out.append(e)
        prev = e.hash
    return Page(stream, out, start_version, start_hash, key)


def both(native: ModuleType, page: Page, events: list[RecordedEvent], start: int = 0) -> Any:
    """Native and Python verify_run over ``events`` from the page's start; asserts they
    agree and returns the answer."""
    sid_json = _cache_name(page.stream)
    key = None if page.key is None else page.key.key
    args = (events, start, page.stream, sid_json, page.start_version, page.start_hash, key)
    ours = native.verify_run(*args)
    ref = chain.verify_run(*args)
    assert ours == ref
    assert type(ours[1]) is int
    assert type(ours[2]) is bytes
    for width in WIDTHS:
        # verify_page (several events hashed at once) may stop short of verify_run,
        # never past it; verify_run from where it stopped gives the reference's answer.
        j, last, last_hash = native.verify_page(list(events), *args[1:], width)
        assert j <= ref[0]
        assert (j, last, last_hash) == chain.verify_run(events[:j], start, *args[2:])
        assert native.verify_run(events, j, *args[2:4], last, last_hash, key) == ref
    return ours


@SETTINGS
@given(page=pages())
def test_valid_pages_agree_and_verify(native: ModuleType, page: Page) -> None:
    i, last, last_hash = both(native, page, page.events)
    assert i == len(page.events)
    assert last == page.start_version + len(page.events)
    assert last_hash == (page.events[-1].hash if page.events else page.start_hash)


def _other(x: Any) -> Any:
    if isinstance(x, bytes):
        return x[:-1] + bytes([x[-1] ^ 1]) if x else b"x"
    if isinstance(x, str):
        return x + "x"
    return x


# Each tamper: a name and how it changes one event's 12 stored fields (a list).
def _set(i: int, value: Any) -> Any:
    def f(row: list[Any], draw: st.DrawFn) -> None:
        row[i] = value(row[i], draw) if callable(value) else value

    return f


def _ref(kind: str) -> Any:
    def f(row: list[Any], draw: st.DrawFn) -> None:
        raw = row[6]
        digest = payload_digest(raw)
        row[6] = None
        if kind == "blob":
            row[11] = PayloadRef(key="blobs/" + "0" * 64, size=len(raw), digest=digest)
        elif kind == "erased":
            row[11] = ErasedPayloadRef(key="", size=len(raw), digest=digest)
        elif kind == "malformed":
            row[11] = MalformedPayloadRef(key="", size=0, digest=b"", problem="not JSON")
        else:  # a reference and the payload both set
            row[6] = raw
            row[11] = PayloadRef(key="k", size=len(raw), digest=digest)

    return f


def _raw_quoted_at(row: list[Any], draw: st.DrawFn) -> None:
    """A forged hash over ``at`` quoted without the escaper (not the canonical header):
    only meaningful when ``at`` needs escaping, which the drawn value makes sure of."""
    row[8] = row[8] + draw(st.sampled_from(["\n", "\x00", '"', "\\", "\x1f"]))
    # Not canonical: quoted as is.
    fields = (row[0], row[1], row[3], row[4], row[5], row[7], row[8])
    stream, version, eid, ty, mo, meta, at = fields
    pb = row[6]
    header = (
        b'{"at":"' + at.encode() + b'","id":' + _encode_str(eid).encode() + b',"meta":'
        + meta + b',"module":' + _encode_str(mo).encode() + b',"payload":"'
        + payload_digest(pb).hex().encode() + b'","size":' + str(len(pb)).encode()
        + b',"stream":' + _encode_str(stream).encode() + b',"type":'
        + _encode_str(ty).encode() + b',"v":1,"version":' + str(version).encode() + b"}"
    )  # fmt: skip
    row[10] = blake3.blake3(row[9] + header).digest()  # unkeyed; a keyed chain refuses too


odd_values: st.SearchStrategy[Any] = st.sampled_from(
    [None, 0, 1, -1, True, 1.5, b"", b"x", "", "x", "\ud800", "\x00", '"', "\\", [], {}]
)
TAMPERS: dict[str, Any] = {
    "payload": _set(6, lambda x, d: _other(x)),
    "payload_type": _set(
        6, lambda x, d: d(st.sampled_from([None, "text", x.decode("latin-1"), 5]))
    ),
    "payload_empty": _set(6, b""),
    "meta": _set(7, lambda x, d: _other(x)),
    "meta_type": _set(7, lambda x, d: d(st.sampled_from([None, x.decode("latin-1"), 0]))),
    "type": _set(4, lambda x, d: _other(x)),
    "module": _set(5, lambda x, d: _other(x)),
    "at": _set(8, lambda x, d: _other(x)),
    "event_id": _set(3, lambda x, d: _other(x)),
    "type_odd": _set(4, lambda x, d: d(odd_values)),
    "module_odd": _set(5, lambda x, d: d(odd_values)),
    "at_odd": _set(8, lambda x, d: d(odd_values)),
    "event_id_odd": _set(3, lambda x, d: d(odd_values)),
    "version_gap": _set(1, lambda x, d: x + d(st.sampled_from([1, 2, 10]))),
    "version_back": _set(1, lambda x, d: x - d(st.sampled_from([1, 2]))),
    "version_type": _set(1, lambda x, d: d(st.sampled_from([str(x), float(x), True, None]))),
    "version_huge": _set(1, lambda x, d: x + 2**64),
    "prev_hash": _set(9, lambda x, d: _other(x)),
    "prev_hash_type": _set(9, lambda x, d: d(st.sampled_from([x.hex(), None, x[:31]]))),
    "prev_hash_bytearray": _set(9, lambda x, d: bytearray(x)),
    "hash": _set(10, lambda x, d: _other(x)),
    "hash_type": _set(10, lambda x, d: d(st.sampled_from([x.hex(), None, x[:31], x + b"\0"]))),
    "hash_bytearray": _set(10, lambda x, d: bytearray(x)),
    "stream": _set(0, lambda x, d: _other(x)),
    "stream_type": _set(0, lambda x, d: d(st.sampled_from([x.encode("utf-8", "replace"), None]))),
    "blob_ref": _ref("blob"),
    "erased": _ref("erased"),
    "malformed_ref": _ref("malformed"),
    "ref_and_payload": _ref("both"),
    "raw_quoted_at": _raw_quoted_at,
    "position": _set(2, lambda x, d: d(odd_values)),
}


@SETTINGS
@given(
    page=pages().filter(lambda p: len(p.events) > 0),
    tamper=st.sampled_from(sorted(TAMPERS)),
    data=st.data(),
)
def test_tampered_pages_agree(native: ModuleType, page: Page, tamper: str, data: Any) -> None:
    """Native and Python stop at the same event, with the same state, for any tamper; the
    events before it are the same sound chain."""
    j = data.draw(st.integers(0, len(page.events) - 1), label="tampered event")
    row = list(page.events[j][:12])
    TAMPERS[tamper](row, data.draw)
    events = list(page.events)
    events[j] = RecordedEvent(*row)
    i, _, _ = both(native, page, events)
    assert i >= j or i == len(events)
    # Resuming after the tampered event (as ChainVerifier.check_page does) agrees too.
    for start in range(j, len(events) + 1):
        both(native, page, events, start)


def _findings(page: Page, events: list[RecordedEvent], use_native: bool, rows: bool = False) -> Any:
    """What the verifier finds on ``events``: given as a list, or (``rows``) as an
    EventPage of their rows, the way a SQLite read hands them over."""
    saved = chain._native
    chain._native = _import_native() if use_native else None
    given: Any = events
    if rows:
        given = EventPage([tuple(e[:12]) for e in events], lambda r: RecordedEvent(*r))
    try:
        v = verifier.ChainVerifier(
            page.stream, page.key, start_version=page.start_version, start_hash=page.start_hash
        )
        kept = v.check_page(given)
        s = verifier.ChainVerifier(
            page.stream, page.key, start_version=page.start_version, start_hash=page.start_hash
        )
        prefix = s.sound_prefix(given)
        return (
            [(f.kind, f.stream_id, f.version, f.detail) for f in v.findings],
            list(kept),
            v.last,
            v.last_hash,
            prefix,
            [(f.kind, f.version) for f in s.findings],
        )
    finally:
        chain._native = saved


@settings(SETTINGS, max_examples=examples(100))
@given(
    page=pages().filter(lambda p: len(p.events) > 0),
    tampers=st.lists(st.sampled_from(sorted(TAMPERS)), min_size=1, max_size=3),
    data=st.data(),
)
def test_the_verifier_finds_the_same_with_and_without_native(
    native: ModuleType, page: Page, tampers: list[str], data: Any
) -> None:
    events = list(page.events)
    for tamper in tampers:
        j = data.draw(st.integers(0, len(events) - 1))
        row = list(events[j][:12])
        try:
            TAMPERS[tamper](row, data.draw)
        except (TypeError, AttributeError, ValueError):
            continue  # a tamper that does not apply to an event tampered already
        events[j] = RecordedEvent(*row)
    reference = _findings(page, events, False)
    assert _findings(page, events, True) == reference
    # A page of rows (verified straight from the rows, events built when needed) finds
    # the same, on either path.
    assert _findings(page, events, True, rows=True) == reference
    assert _findings(page, events, False, rows=True) == reference


def test_a_long_keyed_page_verifies_natively(native: ModuleType) -> None:
    key = ChainKey(bytes(range(32)))
    prev = genesis("s")
    events = []
    for v in range(1, 301):
        e = _event(
            "s", v, str(uuid.uuid4()), "T", "m", {"i": v, "text": "é" * (v * 7)}, {},
            "2026-01-01T00:00:00.000000Z", prev, key,
        )  # fmt: skip
        events.append(e)
        prev = e.hash
    page = Page("s", events, 0, genesis("s"), key)
    assert both(native, page, events) == (300, 300, prev)
    unkeyed = Page("s", events, 0, genesis("s"), None)
    assert both(native, unkeyed, events)[0] == 0  # a keyed chain is not an unkeyed one


def test_versions_past_64_bits_agree(native: ModuleType) -> None:
    """The reference compares Python ints; so does the native path past int64."""
    start = 2**63 - 3
    h0 = bytes(32)
    prev, events = h0, []
    for v in range(start + 1, start + 6):
        e = _event("s", v, "id", "T", "m", 1, {}, "t", prev, None)
        events.append(e)
        prev = e.hash
    page = Page("s", events, start, h0, None)
    assert both(native, page, events) == (5, start + 5, prev)


def test_bad_arguments_raise(native: ModuleType) -> None:
    sid = _cache_name("s")
    with pytest.raises(ValueError, match="32 bytes"):
        native.verify_run([], 0, "s", sid, 0, genesis("s"), b"short")
    with pytest.raises(ValueError, match="start"):
        native.verify_run([], -1, "s", sid, 0, genesis("s"), None)
    with pytest.raises(TypeError):
        native.verify_run([], 0, "s", sid, "0", genesis("s"), None)
    assert native.verify_run((), 5, "s", sid, 0, genesis("s"), None) == (5, 0, genesis("s"))


# -- canonical JSON's acceptance walk ----------------------------------------------------------


class _Str(str):
    pass


class _Int(int):
    pass


# Everything the reference accepts, and near misses it refuses: tuples, sets, subclasses
# of int and dict, non-str keys, NaN and infinities, integers just outside 64 bits.
odd_leaves = st.one_of(
    scalars,
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 2**63, -(2**63) - 1]),
    st.sampled_from([2**63 - 1, -(2**63), (), frozenset(), b"x", uuid.UUID(int=1)]),
    st.builds(_Str, text),
    st.builds(_Int, st.integers(-5, 5)),
)
odd_values = st.recursive(
    odd_leaves,
    lambda c: st.one_of(
        st.lists(c, max_size=4),
        st.dictionaries(text, c, max_size=4),
        st.dictionaries(st.one_of(text, st.integers(0, 3), st.builds(_Str, text)), c, max_size=2),
        st.tuples(c),
    ),
    max_leaves=12,
)


def _python_scan(x: Any) -> bool | None:
    try:
        return chain._scan(x, 0)
    except chain._Reject:
        return None


@SETTINGS
@given(x=odd_values)
def test_scan_equals_the_python_walk(native: ModuleType, x: Any) -> None:
    """The C acceptance walk answers as the Python one: float or not, or refused."""
    assert native.scan(x) == _python_scan(x)


@pytest.mark.parametrize("depth", [199, 200, 201, 202])
def test_scan_depth_limit_equals_the_python_walk(native: ModuleType, depth: int) -> None:
    """Nesting is refused from the same depth on both paths."""
    x: Any = 1
    for i in range(depth):
        x = [x] if i % 2 else {"k": x}
    assert native.scan(x) == _python_scan(x)


# -- sealing a batch ---------------------------------------------------------------------------

prepared_events = st.builds(
    lambda eid, ty, mo, meta, at, digest, size: PreparedEvent(
        eid, ty, mo, None, canonical_json(meta), at, digest, size, None
    ),
    st.one_of(st.uuids().map(str), text),
    text,
    text,
    st.dictionaries(text, scalars, max_size=3),
    st.one_of(st.just("2026-01-01T00:00:00.000000Z"), text),
    st.binary(min_size=32, max_size=32),
    st.integers(0, 2**40),
)


@SETTINGS
@given(
    stream=text.filter(bool),
    version=st.integers(0, 2**62),
    prev=st.binary(min_size=32, max_size=32),
    events=st.lists(prepared_events, min_size=1, max_size=5),
    keyed=st.booleans(),
)
def test_link_hashes_equal_the_python_loop(
    native: ModuleType, stream: str, version: int, prev: bytes, events: list[Any], keyed: bool
) -> None:
    """The C sealing loop gives the Python reference's link hashes, byte for byte."""
    key = ChainKey(b"\x07" * 32) if keyed else None
    want = link_hashes_reference(stream, version, prev, events, key)
    got = native.link_hashes(_cache_name(stream), version, prev, events, key and key.key)
    assert got == want
    # and the reference is the format: header_bytes + link_hash, event by event
    h = prev
    for i, e in enumerate(events):
        header = header_bytes(
            stream, version + i + 1, e.event_id, e.type, e.module, e.meta_json, e.at,
            e.digest.hex(), e.size,
        )  # fmt: skip
        h = link_hash(h, header, key)
        assert want[i] == h


# -- UUIDv7 objects ----------------------------------------------------------------------------


@SETTINGS
@given(
    ms=st.integers(0, 2**48 - 1), seq=st.integers(0, 2**12 - 1), rand_b=st.integers(0, 2**62 - 1)
)
def test_make_uuid7_equals_the_python_object(
    native: ModuleType, ms: int, seq: int, rand_b: int
) -> None:
    """The C-built UUIDv7 is the Python reference's object: type, value, text, is_safe."""
    want = uuid7_reference(ms, seq, rand_b)
    got = native.make_uuid7(_UUID7, ms, seq, rand_b, uuid.SafeUUID.unknown)
    assert type(got) is type(want) is _UUID7
    assert got.int == want.int and got.is_safe is want.is_safe
    assert str(got) == str(want) == str(uuid.UUID(int=want.int))
    assert got.version == 7 and got.variant == uuid.RFC_4122


def test_make_uuid7_refuses_out_of_range_fields(native: ModuleType) -> None:
    """Fields wider than their bits are a ValueError, never a wrong id."""
    for ms, seq, rand_b in ((2**48, 0, 0), (0, 2**12, 0), (0, 0, 2**62)):
        with pytest.raises(ValueError, match="out of range"):
            native.make_uuid7(_UUID7, ms, seq, rand_b, uuid.SafeUUID.unknown)


def test_a_pickled_or_copied_event_id_keeps_its_text() -> None:
    """A default event id survives pickle and copy as an equal UUID with the same text."""
    import copy
    import pickle

    from ares_events.core.events import uuid7

    u = uuid7()
    for v in (pickle.loads(pickle.dumps(u)), copy.copy(u), copy.deepcopy(u)):
        assert v == u and str(v) == str(u) and v.int == u.int


@SETTINGS
@given(page=pages(), data=st.data())
def test_row_to_event_equals_from_row(native: ModuleType, page: Page, data: Any) -> None:
    """The SQLite read's C event builder makes the object ``_from_row`` makes, and hands
    any other row (a payload reference, a wrong shape) to it."""
    from ares_events.core.events import _MISSING

    slow = RecordedEvent._from_row
    for e in page.events:
        row = tuple(e[:12])
        if data.draw(st.booleans(), label="with a reference"):
            row = (*row[:6], None, *row[7:11], '{"key":"k","size":3,"digest":"' + "0" * 64 + '"}')
        got = native.row_to_event(RecordedEvent, _MISSING, slow, row)
        want = slow(row)
        assert type(got) is RecordedEvent
        assert got == want
        assert got.payload_ref == want.payload_ref
        if row[11] is None:
            assert got.payload == want.payload
            assert got.metadata == want.metadata
    odd = ("s", 1)
    assert native.row_to_event(RecordedEvent, _MISSING, lambda r: ("slow", r), odd) == (
        "slow",
        odd,
    )


@SETTINGS
@given(page=pages(), data=st.data())
def test_event_payload_equals_the_python_getter(native: ModuleType, page: Page, data: Any) -> None:
    """``RecordedEvent.payload`` in C gives what the Python getter gives, decodes once and
    hands every other event (a spilled payload, an unusual shape) to it."""
    from ares_events.core import events as ev_mod

    reference = ev_mod._payload_reference
    native.payload_setup(ev_mod._MISSING, orjson.loads, reference)  # as events.py does
    for e in page.events:
        row = tuple(e[:12])
        fresh, twin = RecordedEvent._from_row(row), RecordedEvent._from_row(row)
        got = native.event_payload(fresh)
        assert got == reference(twin)
        assert native.event_payload(fresh) is got  # kept in the event's cell
        assert fresh.payload is got  # the property is the C getter
        if data.draw(st.booleans(), label="spilled"):
            ref = '{"key":"k","size":3,"digest":"' + "0" * 64 + '"}'
            spilled = RecordedEvent._from_row((*row[:6], None, *row[7:11], ref))
            with pytest.raises(ae_errors.BlobMissing):
                native.event_payload(spilled)
    odd = ("s",)
    calls: list[Any] = []

    def slow(x: Any) -> str:
        calls.append(x)
        return "slow"

    native.payload_setup(ev_mod._MISSING, orjson.loads, slow)
    try:
        assert native.event_payload(odd) == "slow" and calls == [odd]
    finally:
        native.payload_setup(ev_mod._MISSING, orjson.loads, reference)
