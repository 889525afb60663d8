"""The binary array parameters of the PostgreSQL appends (``postgres.arrays``): whatever
the elements, the server reads exactly the list psycopg's own dumper would send."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ares_events.stores.postgres.arrays import ByteaArray, TextArray
from tests.fixtures.tier import examples

_texts = st.lists(
    st.one_of(
        st.none(), st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))
    ),
    min_size=1,
    max_size=40,
)
_bytes = st.lists(st.one_of(st.none(), st.binary(max_size=300)), min_size=1, max_size=40)


@pytest.fixture(scope="module")
def conn(postgres_db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres_db_url, autocommit=True) as c:
        yield c


@settings(max_examples=examples(60), deadline=None)
@given(items=_texts)
def test_text_arrays_arrive_as_sent(conn: psycopg.Connection[Any], items: list[str | None]) -> None:
    row = conn.execute(
        "SELECT %b::text[], %b::text[] = %b::text[]", (TextArray(items), TextArray(items), items)
    ).fetchone()
    assert row is not None and row[0] == items and row[1] is True


@settings(max_examples=examples(60), deadline=None)
@given(items=_bytes)
def test_bytea_arrays_arrive_as_sent(
    conn: psycopg.Connection[Any], items: list[bytes | None]
) -> None:
    row = conn.execute(
        "SELECT %b::bytea[], %b::bytea[] = %b::bytea[]",
        (ByteaArray(items), ByteaArray(items), items),
    ).fetchone()
    assert row is not None and row[0] == items and row[1] is True


def test_unnest_with_ordinality_keeps_the_order_and_the_nulls(
    conn: psycopg.Connection[Any],
) -> None:
    rows = conn.execute(
        "SELECT x.t, x.b, x.i FROM unnest(%b::text[], %b::bytea[]) WITH ORDINALITY AS x(t, b, i)",
        (TextArray(["é", None, "c"]), ByteaArray([b"\x00", b"", None])),
    ).fetchall()
    assert rows == [("é", b"\x00", 1), (None, b"", 2), ("c", None, 3)]
