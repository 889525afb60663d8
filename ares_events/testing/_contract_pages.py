"""The conformance suite's stream pages (``Capability.STREAM_PAGES``). May import the
public API."""

from __future__ import annotations

import pytest

import ares_events as ae
from ares_events.errors import InvalidEvent
from ares_events.testing._contract_helpers import _ev

_IDS = ("a", "a%b", "a_b", "ab", "abc", "b", "b/1", "b/2", "é/x", "\u202e-rtl")


class PagesContract:
    """Paged listings of streams: the same ids and order as ``streams()``."""

    def test_streams_page_walks_every_stream_once(self, store: ae.EventStore) -> None:
        """Pages of any size, chained by the last id, list every stream once, in the
        order of streams(), with the versions of its heads."""
        for i, sid in enumerate(_IDS):
            store.append(sid, [_ev(n) for n in range(i % 3 + 1)])
        expected = list(store.streams())
        for size in (1, 3, len(_IDS), 100):
            seen: list[tuple[str, int]] = []
            after = ""
            while True:
                page = store.streams_page(after=after, limit=size)
                assert len(page) <= size
                seen.extend((sid, h.version) for sid, h in page)
                if len(page) < size:
                    break
                after = page[-1][0]
            assert seen == expected

    def test_streams_page_prefix_is_exact(self, store: ae.EventStore) -> None:
        """A prefix matches ids that start with it, character for character: ``%`` and
        ``_`` are not wildcards, and paging within a prefix stops at its end."""
        for sid in _IDS:
            store.append(sid, [_ev(0)])
        for prefix in ("a", "a_", "a%", "b/", "é", "\u202e", "zz"):
            want = [sid for sid, _ in store.streams() if sid.startswith(prefix)]
            got = [sid for sid, _ in store.streams_page(prefix=prefix, limit=100)]
            assert got == want, prefix
            paged: list[str] = []
            after = ""
            while True:
                page = store.streams_page(prefix=prefix, after=after, limit=1)
                if not page:
                    break
                paged.append(page[0][0])
                after = page[0][0]
            assert paged == want, prefix

    def test_streams_page_heads_match(self, store: ae.EventStore) -> None:
        """Each listed head is the stream's head (version and hash)."""
        store.append("h1", [_ev(0), _ev(1)])
        store.append("h2", [_ev(2)])
        for sid, head in store.streams_page(limit=10):
            assert head == store.head(sid)

    def test_streams_page_refuses_bad_arguments(self, store: ae.EventStore) -> None:
        """A limit below 1 or a non-string cursor is InvalidEvent, not an empty page."""
        for bad in (0, -1, 1.5, True):
            with pytest.raises(InvalidEvent):
                store.streams_page(limit=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidEvent):
            store.streams_page(after=None)  # type: ignore[arg-type]
