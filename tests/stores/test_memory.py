"""memory:// behaviour: private per open, shared by name."""

from __future__ import annotations

import threading
import uuid

import pytest

import ares_events as ae
from ares_events.errors import ConcurrencyError, ConfigError


def _ev(n: int = 0) -> ae.NewEvent:
    return ae.NewEvent(type="t", module="m", payload={"n": n})


def _name() -> str:
    return f"shared-{uuid.uuid4().hex[:12]}"


def test_unnamed_memory_stores_are_private() -> None:
    """Each open of memory:// is a separate, empty store."""
    with ae.open_store("memory://") as a, ae.open_store("memory://") as b:
        a.append("s", [_ev()])
        assert list(b.streams()) == []
        assert b.stream_version("s") == 0
        b.append("s", [_ev(), _ev()])
        assert a.stream_version("s") == 1
        assert [e.position for e in b.read_all()] == [1, 2]
    with ae.open_store("memory://") as c:
        assert list(c.read_all()) == []


def test_named_memory_store_is_shared() -> None:
    """Every open of memory://NAME sees the same events, heads and version checks."""
    name = _name()
    with ae.open_store(f"memory://{name}") as a, ae.open_store(f"memory://{name}") as b:
        a.append("s", [_ev(1)])
        assert [e.payload for e in b.read("s")] == [{"n": 1}]
        b.append("s", [_ev(2)], expected_version=1)
        with pytest.raises(ConcurrencyError):
            a.append("s", [_ev(3)], expected_version=1)
        assert list(a.streams()) == [("s", 2)]
        assert ae.integrity.verify_stream(a, "s").ok
    with ae.open_store(f"memory://{name}") as again:  # still there after both closed
        assert again.stream_version("s") == 2


def test_different_names_are_isolated() -> None:
    """memory://A and memory://B are different stores, and neither is memory://."""
    a_name, b_name = _name(), _name()
    with ae.open_store(f"memory://{a_name}") as a, ae.open_store(f"memory://{b_name}") as b:
        a.append("s", [_ev()])
        assert b.stream_version("s") == 0
        with ae.open_store("memory://") as anon:
            assert anon.stream_version("s") == 0


def test_idempotency_spans_opens_of_a_name() -> None:
    """A re-append through another open of the same name is recognised as a duplicate."""
    name = _name()
    batch = [_ev(1), _ev(2)]
    with ae.open_store(f"memory://{name}") as a, ae.open_store(f"memory://{name}") as b:
        first = a.append("s", batch)
        again = b.append("s", batch)
        assert again.duplicate
        assert (again.version, again.position) == (first.version, first.position)
        assert b.stream_version("s") == 2


def test_wait_for_wakes_across_opens_of_a_name() -> None:
    """A waiter on one open of memory://NAME wakes when another open appends."""
    name = _name()
    with ae.open_store(f"memory://{name}") as a, ae.open_store(f"memory://{name}") as b:
        got: list[bool] = []
        started = threading.Event()

        def wait() -> None:
            started.set()
            got.append(a.wait_for(0, timeout=60))

        t = threading.Thread(target=wait)
        t.start()
        started.wait()
        b.append("s", [_ev()])
        t.join(60)
        assert got == [True]


def test_memory_url_takes_no_parameters() -> None:
    """An unknown memory:// parameter is a ConfigError that says none are valid."""
    with pytest.raises(ConfigError) as ei:
        ae.open_store("memory://x?persist=true")
    assert "persist" in str(ei.value)
    assert "valid: none" in str(ei.value)


def test_memory_store_declares_no_persistence() -> None:
    """memory:// declares neither PERSISTENT nor MULTI_PROCESS."""
    with ae.open_store("memory://") as s:
        caps = s.capabilities
    assert ae.stores.Capability.PERSISTENT not in caps
    assert ae.stores.Capability.MULTI_PROCESS not in caps
    assert ae.stores.Capability.GAPLESS_POSITIONS in caps
