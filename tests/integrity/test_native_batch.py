"""The append path's C passes against their Python references (issue 33):
``_native.prepare`` against :func:`prepare_reference` (the same PreparedEvents, or the
reference runs and raises what it raises), ``_native.insert_rows`` against
:func:`insert_rows_reference` (the same row tuples, byte for byte: the chain's bytes do
not depend on which path sealed them), and ``_native.uuid7`` against
:func:`uuid7_python` (the same ids from the same clock and random bits).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import random
import time
import uuid
from types import ModuleType, SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ares_events import chain
from ares_events.chain import ChainKey, genesis, header_bytes, link_hash
from ares_events.core import events as ev_mod
from ares_events.core.backend import (
    Batch,
    Head,
    SealedEvent,
    insert_rows_reference,
    params_of_rows,
)
from ares_events.core.events import (
    _GOOD_NAMES,
    _UUID7,
    MAX_METADATA_BYTES,
    NewEvent,
    PreparedEvent,
    new_event_reference,
    prepare,
    prepare_reference,
    uuid7,
    uuid7_python,
)
from ares_events.errors import InvalidEvent
from tests.fixtures.tier import examples
from tests.integrity.test_codec import scalars, text

SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
NO_NATIVE = os.environ.get(chain.NO_NATIVE_ENV, "") not in ("", "0")
AT = "2026-01-01T00:00:00.000000Z"


# The library's own C pass (off under ARES_EVENTS_NO_NATIVE even when the extension is built).
uses_c_pass = pytest.mark.skipif(
    importlib.import_module("ares_events.core.backend")._native_insert_rows is None,
    reason="ARES_EVENTS_NO_NATIVE is set: Batch takes the Python path, tested elsewhere",
)


@pytest.fixture(scope="module")
def native() -> ModuleType:
    try:
        return importlib.import_module("ares_events._native")
    except ImportError:
        if NO_NATIVE:
            pytest.skip("ARES_EVENTS_NO_NATIVE is set and the extension is not built")
        raise


values = st.recursive(
    scalars,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(text, c, max_size=3)),
    max_leaves=8,
)
int_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), text),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(text, c, max_size=3)),
    max_leaves=8,
)
names = st.one_of(st.sampled_from(["task.created", "tool.result", "runtime"]), text)
ids = st.one_of(
    st.just(None),  # the default: a fresh UUIDv7
    st.uuids(),
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.just("not-a-uuid"),
)


@st.composite
def new_events(draw: Any, plain: bool = False) -> dict[str, Any]:
    """NewEvent keyword arguments (the test builds the event: a default id draws random
    bits, which hypothesis does not allow inside a strategy)."""
    kw: dict[str, Any] = {
        "type": draw(st.sampled_from(["task.created", "tool.result"]) if plain else names),
        "module": draw(st.just("runtime") if plain else names),
        "payload": draw(int_values if plain else values),
    }
    meta = draw(st.dictionaries(text, int_values if plain else values, max_size=3))
    if meta or draw(st.booleans()):
        kw["metadata"] = meta
    eid = None if plain else draw(ids)
    if eid is not None:
        kw["event_id"] = eid
    return kw


def _outcome(fn: Any, stream: str, events: list[Any]) -> Any:
    try:
        return fn(stream, events, AT)
    except InvalidEvent as exc:
        return ("InvalidEvent", exc.field, exc.problem, exc.stream_id, exc.index)
    except Exception as exc:  # the same failure on both paths, whatever it is
        return (type(exc).__name__, str(exc))


@SETTINGS
@given(specs=st.lists(new_events(), min_size=1, max_size=6), dup=st.booleans())
def test_prepare_equals_the_reference(native: ModuleType, specs: list[Any], dup: bool) -> None:
    """Whatever the batch, the fast prepare gives the reference's PreparedEvents or its
    error (field, problem, index)."""
    events = [NewEvent(**kw) for kw in specs]
    if dup:
        events = [*events, events[0]]
    want = _outcome(prepare_reference, "s", events)
    assert _outcome(prepare, "s", events) == want
    assert _outcome(prepare, "s", events) == _outcome(prepare_reference, "s", events)


@SETTINGS
@given(specs=st.lists(new_events(plain=True), min_size=1, max_size=6))
def test_prepare_takes_the_c_pass_on_plain_batches(
    native: ModuleType, specs: list[dict[str, Any]]
) -> None:
    """Known names, default ids, no floats: the C pass answers (not the fallback), with
    the reference's PreparedEvents field for field."""
    events = [NewEvent(**kw) for kw in specs]
    want = prepare_reference("s", events, AT)  # also validates and remembers the names
    got = native.prepare(
        events, AT, NewEvent, PreparedEvent, _UUID7, _GOOD_NAMES, orjson.dumps,
        ev_mod._SORT_KEYS, MAX_METADATA_BYTES,
    )  # fmt: skip
    assert got is not None
    assert got == want
    for g, w in zip(got, want, strict=True):
        assert type(g) is PreparedEvent
        assert g.uid is w.uid and type(g.event_id) is str


def test_prepare_falls_back_on_every_unusual_event(native: ModuleType) -> None:
    """Each unusual case makes the C pass hand the batch to the reference (None)."""
    prepare_reference("s", [NewEvent(type="t", module="m")], AT)

    class Sub(NewEvent):
        pass

    def c_pass(*evs: Any) -> Any:
        return native.prepare(
            list(evs), AT, NewEvent, PreparedEvent, _UUID7, _GOOD_NAMES, orjson.dumps,
            ev_mod._SORT_KEYS, MAX_METADATA_BYTES,
        )  # fmt: skip

    assert c_pass(NewEvent(type="t", module="m", payload={"a": [1, "x", None, True]}))
    e = NewEvent(type="t", module="m")
    for odd in (
        [NewEvent(type="never-seen-before", module="m")],
        [NewEvent(type="t", module="m", payload={"f": 1.5})],
        [NewEvent(type="t", module="m", metadata={"f": 0.5})],
        [NewEvent(type="t", module="m", event_id=uuid.uuid4())],
        [NewEvent(type="t", module="m", event_id=str(uuid7()))],
        [NewEvent(type="t", module="m", payload={1: 2})],
        [NewEvent(type="t", module="m", payload=2**63)],
        [NewEvent(type="t", module="m", payload="\ud800")],
        [NewEvent(type="t", module="m", metadata={"big": "x" * MAX_METADATA_BYTES})],
        [e, e],
        [Sub(type="t", module="m")],
        [object()],
    ):
        assert c_pass(*odd) is None


# A batch sealed after a head: the events, the stream, the head's version and hash, the first
# position and whether the chain is keyed.
BATCHES = given(
    specs=st.lists(new_events(plain=True), min_size=1, max_size=5),
    stream=text.filter(bool),
    version=st.one_of(st.just(0), st.integers(1, 2**62)),
    prev=st.binary(min_size=32, max_size=32),
    position=st.integers(0, 2**62),
    keyed=st.booleans(),
)


@SETTINGS
@BATCHES
def test_insert_rows_equal_the_reference(
    native: ModuleType,
    specs: list[dict[str, Any]],
    stream: str,
    version: int,
    prev: bytes,
    position: int,
    keyed: bool,
) -> None:
    """The C pass builds the reference's rows, byte for byte, and they are the format's
    chain: header_bytes + link_hash event by event."""
    key = ChainKey(b"\x09" * 32) if keyed else None
    events = [NewEvent(**kw) for kw in specs]
    prepared = prepare_reference(stream, events, AT)
    head = Head(version, prev) if version else None
    batch = Batch(stream, prepared, key)
    want = insert_rows_reference(stream, batch.seal(head), position)
    got = batch.insert_rows(head, position)
    assert got == want
    assert [type(x) for r in got[0] for x in r] == [type(x) for r in want[0] for x in r]
    raw = native.insert_rows(
        stream, chain._cache_name(stream), version, prev if version else genesis(stream),
        position, prepared, key and key.key, PreparedEvent,
    )  # fmt: skip
    assert raw is not None and raw[0] == want[0] and raw[1] == want[2]
    h = prev if version else genesis(stream)
    for i, (row, p) in enumerate(zip(got[0], prepared, strict=True)):
        assert row[0] == position + i + 1 and row[2] == version + i + 1 and row[10] == h
        header = header_bytes(
            stream, version + i + 1, p.event_id, p.type, p.module, p.meta_json, p.at,
            p.digest.hex(), p.size,
        )  # fmt: skip
        h = link_hash(h, header, key)
        assert row[11] == h
    assert got[1:] == (version + len(events), h, position + len(events))


def test_insert_rows_goes_through_an_overridden_seal() -> None:
    """A Batch subclass that watches seal() (the cache's) still sees the sealing."""
    seen: list[list[SealedEvent]] = []

    class Watching(Batch):
        __slots__ = ()

        def seal(self, head: Head | None) -> list[SealedEvent]:
            out = super().seal(head)
            seen.append(out)
            return out

    prepared = prepare("s", [NewEvent(type="t", module="m") for _ in range(3)], AT)
    rows, version, last, pos = Watching("s", prepared, None).insert_rows(None, 7)
    assert len(seen) == 1 and [s.hash for s in seen[0]] == [r[11] for r in rows]
    assert rows == Batch("s", prepared, None).insert_rows(None, 7)[0]
    assert (version, last, pos) == (3, rows[-1][11], 10)


def test_insert_rows_of_spilled_events_use_the_reference() -> None:
    """A payload_ref is serialized by the reference (the C pass declines)."""
    from ares_events.core.events import PayloadRef

    p = prepare("s", [NewEvent(type="t", module="m", payload={"a": 1})], AT)[0]
    ref = PayloadRef(key="k", size=p.size, digest=p.digest)
    spilled = PreparedEvent(
        p.event_id, p.type, p.module, None, p.meta_json, p.at, p.digest, p.size, ref, p.uid
    )
    rows, *_ = Batch("s", [spilled], None).insert_rows(None, 0)
    assert rows[0][6] is None and rows[0][7] == ref.to_json().decode()


# -- UUIDv7 -----------------------------------------------------------------------------------


@SETTINGS
@given(
    seed=st.integers(0, 2**32),
    start=st.integers(2**40, 2**44),  # ms (nanoseconds stay within 64 bits)
    steps=st.lists(st.sampled_from([0, 0, 0, 1, 5]), min_size=1, max_size=20),
)
def test_native_uuid7_equals_the_python_generator(
    native: ModuleType, seed: int, start: int, steps: list[int]
) -> None:
    """From the same clock readings and random bits, the C generator makes the same ids
    (objects of the same class, with their text) as uuid7_python."""
    clock = [start * 1_000_000 + 123]
    for s in steps:
        clock.append(clock[-1] + s * 1_000_000 + 7)

    def run(gen: Any, setup: Any) -> list[uuid.UUID]:
        rnd = random.Random(seed)
        ticks = iter(clock)
        setup(rnd.getrandbits, lambda: next(ticks))
        return [gen() for _ in clock]

    def setup_c(bits: Any, time_ns: Any) -> None:
        native.uuid7_setup(_UUID7, uuid.SafeUUID.unknown, bits, time_ns)

    def setup_py(bits: Any, time_ns: Any) -> None:
        ev_mod._getrandbits = bits
        setattr(ev_mod, "time", SimpleNamespace(time_ns=time_ns))  # noqa: B010
        ev_mod._last_ms, ev_mod._seq = 0, 0

    saved = (ev_mod._getrandbits, ev_mod._last_ms, ev_mod._seq)
    try:
        got = run(native.uuid7, setup_c)
        want = run(uuid7_python, setup_py)
    finally:
        ev_mod._getrandbits, ev_mod._last_ms, ev_mod._seq = saved
        setattr(ev_mod, "time", time)  # noqa: B010
        native.uuid7_setup(_UUID7, uuid.SafeUUID.unknown, random.getrandbits, time.time_ns)
    assert [type(u) for u in got] == [_UUID7] * len(clock)
    assert [(u.int, str(u), u.is_safe) for u in got] == [(u.int, str(u), u.is_safe) for u in want]


def test_default_ids_are_uuid7_and_increase() -> None:
    """NewEvent's default ids come from the generator: version 7, increasing."""
    got = [NewEvent(type="t", module="m").event_id for _ in range(5000)]
    assert all(type(u) is _UUID7 and u.version == 7 for u in got)
    assert all(str(u) == str(uuid.UUID(int=u.int)) for u in got)  # type: ignore[union-attr]
    assert got == sorted(got, key=lambda u: u.int)  # type: ignore[union-attr]
    assert len(set(got)) == len(got)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_children_make_other_ids() -> None:
    """random reseeds in a forked child: parent and child never repeat an id."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        os.write(w, "\n".join(str(uuid7()) for _ in range(50)).encode())
        os._exit(0)
    os.close(w)
    mine = {str(uuid7()) for _ in range(50)}
    with os.fdopen(r, "rb") as f:
        theirs = set(f.read().decode().split("\n"))
    os.waitpid(pid, 0)
    assert len(theirs) == 50 and not (mine & theirs)


# -- NewEvent's __init__ ----------------------------------------------------------------------

kwarg_names = st.sampled_from(["type", "module", "payload", "metadata", "event_id", "foo", "typ"])


def _init_outcome(make: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        ev = make(*args, **kwargs)
    except TypeError as exc:
        return ("TypeError", str(exc).replace("new_event_reference()", "NewEvent.__init__()"))
    values = [getattr(ev, f.name) for f in dataclasses.fields(NewEvent)]
    if "event_id" not in kwargs:  # a fresh id on each path: compare what it is
        values[-1] = (type(values[-1]), values[-1].version)
    return (type(ev), values)


@SETTINGS
@given(
    kwargs=st.dictionaries(kwarg_names, st.one_of(st.none(), text, values), max_size=6),
    npos=st.integers(0, 2),
)
def test_new_event_init_equals_the_dataclass_init(
    native: ModuleType, kwargs: dict[str, Any], npos: int
) -> None:
    """NewEvent(...) (the C __init__) and the generated __init__ build the same event from
    the same arguments, or raise the same TypeError."""
    args = ("x",) * npos

    def reference(*a: Any, **kw: Any) -> NewEvent:
        if a:  # the reference helper takes keywords only; the generated __init__ says this
            ev = object.__new__(NewEvent)
            NewEvent.__init__(ev, *a, **kw)
            return ev
        return new_event_reference(**kw)

    got = _init_outcome(NewEvent, args, kwargs)
    assert got == _init_outcome(reference, args, kwargs)
    if got[0] is NewEvent:
        ev = NewEvent(**kwargs)
        assert dataclasses.replace(ev) == ev and ev == new_event_reference(**{
            **kwargs, "event_id": ev.event_id
        })  # fmt: skip
        with pytest.raises(dataclasses.FrozenInstanceError):
            ev.type = "other"  # type: ignore[misc]


def test_new_event_defaults_are_fresh_objects() -> None:
    """Each event gets its own payload and metadata dicts and its own id."""
    a, b = NewEvent(type="t"), NewEvent(type="t")
    assert a.payload == {} and a.metadata == {} and a.module == ""
    assert a.payload is not b.payload and a.metadata is not b.metadata
    assert a.event_id != b.event_id


def test_a_subclass_keeps_the_generated_init() -> None:
    class Sub(NewEvent):
        pass

    ev = Sub(type="t", module="m")
    assert type(ev) is Sub and ev.module == "m"
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        Sub(type="t", foo=1)  # type: ignore[call-arg]


def test_a_second_class_takes_the_c_init_over(native: ModuleType) -> None:
    """Installing the C __init__ on another class (a reloaded module) gives the first
    one back its generated __init__; installing it again on NewEvent restores it."""
    fs = dataclasses.fields(NewEvent)

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Other:
        type: str
        module: str = ""

    ofs = dataclasses.fields(Other)
    try:
        native.install_init(
            Other, tuple(f.name for f in ofs), tuple(f.default for f in ofs),
            tuple(f.default_factory for f in ofs), dataclasses.MISSING,
        )  # fmt: skip
        assert Other(type="t") == Other(type="t", module="")
        assert NewEvent(type="t", module="m").module == "m"  # the generated __init__ again
    finally:
        native.install_init(
            NewEvent, tuple(f.name for f in fs), tuple(f.default for f in fs),
            tuple(f.default_factory for f in fs), dataclasses.MISSING,
        )  # fmt: skip
    assert NewEvent(type="t").module == ""


@uses_c_pass
@SETTINGS
@BATCHES
def test_flat_values_equal_the_reference_rows(
    native: ModuleType,
    specs: list[dict[str, Any]],
    stream: str,
    version: int,
    prev: bytes,
    position: int,
    keyed: bool,
) -> None:
    """The values of the multi-row INSERT are the reference rows' values, less what is
    bound once (the stream id, the one recorded_at; type, module and metadata when the
    events share them)."""
    key = ChainKey(b"\x0b" * 32) if keyed else None
    prepared = prepare_reference(stream, [NewEvent(**kw) for kw in specs], AT)
    head = Head(version, prev) if version else None
    batch = Batch(stream, prepared, key)
    rows, last_version, last_hash, last_pos = insert_rows_reference(
        stream, batch.seal(head), position
    )
    got = batch._c_rows(head, position, flat=True)  # what the native SQLite writer binds
    assert got is not None
    (values, last, width), version_after = got
    shared, want = params_of_rows(rows)
    assert (values, width) == (want, 4 if len(shared) > 1 else 10)
    assert (version_after, last, position + len(rows)) == (last_version, last_hash, last_pos)


@uses_c_pass
def test_flat_values_decline_what_the_rows_path_takes() -> None:
    """Two recorded_at values, a spilled payload or a watched seal: no flat values."""
    from ares_events.core.events import PayloadRef

    p = prepare("s", [NewEvent(type="t", module="m") for _ in range(2)], AT)
    other_at = PreparedEvent(
        p[1].event_id, p[1].type, p[1].module, p[1].payload_bytes, p[1].meta_json,
        "2026-01-01T00:00:00.000001Z", p[1].digest, p[1].size, None, p[1].uid,
    )  # fmt: skip
    spilled = PreparedEvent(
        p[1].event_id, p[1].type, p[1].module, None, p[1].meta_json, AT, p[1].digest,
        p[1].size, PayloadRef(key="k", size=p[1].size, digest=p[1].digest), p[1].uid,
    )  # fmt: skip

    class Watching(Batch):
        __slots__ = ()

        def seal(self, head: Head | None) -> list[SealedEvent]:
            return super().seal(head)

    assert Batch("s", p, None)._c_rows(None, 0, flat=True) is not None
    assert Batch("s", [p[0], other_at], None)._c_rows(None, 0, flat=True) is None
    assert Batch("s", [p[0], spilled], None)._c_rows(None, 0, flat=True) is None
    assert Watching("s", p, None)._c_rows(None, 0, flat=True) is None
    assert Watching("s", p, None).writer_args() is None  # nor the native SQLite writer


@pytest.mark.parametrize("mixed", [False, True], ids=["shared", "mixed"])
@pytest.mark.parametrize("sizes", [[1, 2, 3, 7], [63, 64, 65], [100, 127, 129]])
def test_multi_row_inserts_store_every_event_in_order(
    tmp_path: Any, sizes: list[int], mixed: bool
) -> None:
    """Batches cut into multi-row statements of every chunk size read back in order, with
    a chain that verifies, whether their events share type, module and metadata (bound
    once) or not."""
    import sqlite3

    import ares_events as ae

    db = tmp_path / "e.db"
    with ae.open_store(f"sqlite:///{db}") as store:
        version = 0
        appended = []
        for n in sizes:
            evs = [
                NewEvent(
                    type="t" if not mixed or i % 3 else "u",
                    module="m" if not mixed or i % 5 else "n",
                    payload={"i": i, "n": n},
                    metadata={"k": i % 2} if mixed else {"k": 1},
                )
                for i in range(n)
            ]
            res = store.append("s", evs, expected_version=version)
            version += n
            assert res.version == version and res.position == version
            appended += evs
        got = list(store.read("s"))
        assert [e.event_id for e in got] == [e.event_id for e in appended]
        assert [e.payload for e in got] == [e.payload for e in appended]
        assert [(e.type, e.module, e.metadata) for e in got] == [
            (e.type, e.module, e.metadata) for e in appended
        ]
        assert [e.version for e in got] == list(range(1, version + 1))
        assert [e.position for e in got] == list(range(1, version + 1))
        assert ae.integrity.verify_stream(store, "s").ok
    conn = sqlite3.connect(db)
    try:
        at = conn.execute("SELECT DISTINCT recorded_at FROM ares_events").fetchall()
        assert 1 <= len(at) <= len(sizes)  # one recorded_at a batch
    finally:
        conn.close()
