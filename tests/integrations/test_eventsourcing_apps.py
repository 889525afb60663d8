"""Several eventsourcing applications in one ares-events store: each has its own
notification log by default (a stream prefix from its name, the way
``eventsourcing.postgres`` names its tables), ``ARES_STREAM_PREFIX`` overrides it, stores
written with the old unprefixed layout are never silently lost, and one application's reads
do not fetch another's events.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate, event
from hypothesis import given
from hypothesis import strategies as st

import ares_events as ae
from ares_events.core.events import prefix_range
from ares_events.errors import ConfigError
from ares_events.integrations import eventsourcing as es

MODULE = "ares_events.integrations.eventsourcing"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Order(Aggregate):
    @event("Placed")
    def __init__(self, item: str) -> None:
        self.item = item
        self.notes: list[str] = []

    @event("Noted")
    def note(self, text: str) -> None:
        self.notes.append(text)


class Orders(Application[uuid.UUID]):
    """An application named ``Orders``."""


class Invoices(Application[uuid.UUID]):
    """An application named ``Invoices``."""


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL (SQLite file or PostgreSQL schema)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'apps.db'}"
    return str(request.getfixturevalue("postgres_url"))


@contextlib.contextmanager
def app(cls: type[Application[uuid.UUID]], url: str, **env: str) -> Iterator[Any]:
    """An application of ``cls`` on ``url``, closed afterwards."""
    a = cls(env={"PERSISTENCE_MODULE": MODULE, "ARES_STORE_URL": url, **env})
    try:
        yield a
    finally:
        a.close()


def save_orders(a: Application[uuid.UUID], n: int, notes: int = 0) -> list[uuid.UUID]:
    ids = []
    for i in range(n):
        o = Order(f"item-{i}")
        for j in range(notes):
            o.note(f"note-{j}")
        a.save(o)
        ids.append(o.id)
    return ids


def notification_ids(a: Application[uuid.UUID]) -> list[int]:
    return [n.id for n in a.recorder.select_notifications(start=None, limit=10_000)]


def stream_ids(url: str) -> list[str]:
    with ae.open_store(url) as store:
        return [sid for sid, _ in store.streams()]


# -- one notification log per application ---------------------------------------------------


def test_applications_sharing_a_store_have_their_own_logs(url: str) -> None:
    """Two applications in one store each see only their own notifications, subscriptions
    and max_notification_id."""
    with app(Orders, url) as orders, app(Invoices, url) as invoices:
        mine: list[int] = []
        theirs: list[int] = []
        for _ in range(3):
            for r in orders.save(Order("o")):
                mine.append(r.notification.id)
            for r in invoices.save(Order("i"), Order("j")):
                theirs.append(r.notification.id)
        assert notification_ids(orders) == mine
        assert notification_ids(invoices) == theirs
        assert orders.recorder.max_notification_id() == mine[-1] < theirs[-1]
        assert invoices.recorder.max_notification_id() == theirs[-1]
        log = list(orders.notification_log.select(start=1, limit=10))
        assert [n.id for n in log] == mine
        with orders.recorder.subscribe(gt=None) as sub:
            got = [next(sub).id for _ in mine]
        assert got == mine
        with orders.recorder.subscribe(gt=mine[-1]) as sub:
            later = orders.save(Order("late"))[0].notification.id
            invoices.save(Order("other"))
            assert next(sub).id == later
    sids = stream_ids(url)
    assert sids and all(s.startswith(("orders/", "invoices/", "snapshots/")) for s in sids)


def test_a_new_application_in_a_used_store_starts_empty(url: str) -> None:
    """An application added to a store that another application uses has an empty
    notification log and no max_notification_id."""
    with app(Orders, url) as orders:
        save_orders(orders, 3)
    with app(Invoices, url) as invoices:
        assert notification_ids(invoices) == []
        assert invoices.recorder.max_notification_id() is None
        with pytest.raises(AggregateNotFoundError):
            invoices.repository.get(uuid.uuid4())


def test_notification_reads_do_not_fetch_other_applications_events(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Selecting notifications and max_notification_id read only this application's rows
    from the backend, however many events another application wrote after them."""
    with app(Orders, url) as orders, app(Invoices, url) as invoices:
        mine = [r.notification.id for r in orders.save(Order("a"), Order("b"))]
        for _ in range(10):
            invoices.save(*[Order(str(i)) for i in range(50)])
        recorder = orders.recorder.store.recorder
        inner = getattr(recorder, "inner", recorder)
        fetched: list[str] = []
        real = inner.read_all

        def counting(*args: Any, **kw: Any) -> Iterator[Any]:
            for e in real(*args, **kw):
                fetched.append(e.stream_id)
                yield e

        monkeypatch.setattr(inner, "read_all", counting)
        assert notification_ids(orders) == mine
        assert orders.recorder.max_notification_id() == mine[-1]
        assert fetched and all(s.startswith("orders/") for s in fetched)
        assert len(fetched) <= 4 * len(mine)


# -- the prefix and its precedence -----------------------------------------------------------


def test_prefix_precedence(url: str) -> None:
    """<APP>_ARES_STREAM_PREFIX beats ARES_STREAM_PREFIX, which beats the name-derived
    default; an explicitly empty prefix means no prefix at all."""
    cases = [
        ({}, "orders/"),
        ({"ARES_STREAM_PREFIX": "shop:"}, "shop:"),
        ({"ARES_STREAM_PREFIX": "shop:", "ORDERS_ARES_STREAM_PREFIX": "o-"}, "o-"),
        ({"ARES_STREAM_PREFIX": "shop:", "ORDERS_ARES_STREAM_PREFIX": ""}, ""),
    ]
    for env, prefix in cases:
        with app(Orders, url, **env) as orders:
            assert orders.factory.datastore.stream_prefix == prefix
            oid = save_orders(orders, 1)[0]
            assert orders.repository.get(oid).item == "item-0"
        assert f"{prefix}{oid}" in stream_ids(url)


def test_unnamed_factory_prefix_mirrors_eventsourcing_postgres() -> None:
    """A factory constructed without an application name uses ``stored/`` (as
    eventsourcing.postgres uses ``stored_events``); a named one its lowercased name."""
    from eventsourcing.persistence import InfrastructureFactory
    from eventsourcing.utils import Environment

    env = {"PERSISTENCE_MODULE": MODULE, "ARES_STORE_URL": "memory://prefix-mirror"}
    for name, prefix in (("", "stored/"), ("BankAccounts", "bankaccounts/")):
        f = InfrastructureFactory.construct(Environment(name, env))
        assert isinstance(f, es.AresFactory)
        try:
            assert f.datastore.stream_prefix == prefix
        finally:
            f.close()


def test_bad_prefix_is_a_config_error(tmp_path: Path) -> None:
    """A prefix holding a control character, or too long to leave room for an id, is a
    ConfigError naming the setting."""
    url = f"sqlite:///{tmp_path / 'bad.db'}"
    for bad in ("a\nb", "x" * 250):
        with pytest.raises(ConfigError, match="ARES_STREAM_PREFIX"):
            Orders(env={"PERSISTENCE_MODULE": MODULE, "ARES_STORE_URL": url,
                        "ARES_STREAM_PREFIX": bad})  # fmt: skip


# -- stores written before per-application prefixes -------------------------------------------


def test_a_store_with_the_old_layout_is_never_silently_empty(url: str) -> None:
    """A store written with the old default (no prefix) is refused with a ConfigError that
    says how to keep it (an empty prefix), and with that setting everything is there."""
    with app(Orders, url, ARES_STREAM_PREFIX="") as old:
        ids = save_orders(old, 2, notes=2)
        before = notification_ids(old)
    assert all(s in stream_ids(url) for s in map(str, ids))
    with pytest.raises(ConfigError, match="ORDERS_ARES_STREAM_PREFIX= ") as info:
        Orders(env={"PERSISTENCE_MODULE": MODULE, "ARES_STORE_URL": url})
    password = urlsplit(url).password
    assert password is None or password not in str(info.value)
    with app(Orders, url, ORDERS_ARES_STREAM_PREFIX="") as kept:
        assert [kept.repository.get(i).notes for i in ids] == [["note-0", "note-1"]] * 2
        assert notification_ids(kept) == before
        assert kept.recorder.max_notification_id() == before[-1]


def test_a_new_application_beside_an_old_one_sets_its_prefix(url: str) -> None:
    """Another application joining a store that one application keeps in the old layout is
    told to set its prefix explicitly, and works once it does."""
    with app(Orders, url, ORDERS_ARES_STREAM_PREFIX="") as old:
        save_orders(old, 1)
    with pytest.raises(ConfigError, match="INVOICES_ARES_STREAM_PREFIX=invoices/"):
        Invoices(env={"PERSISTENCE_MODULE": MODULE, "ARES_STORE_URL": url})
    with app(Invoices, url, INVOICES_ARES_STREAM_PREFIX="invoices/") as invoices:
        assert notification_ids(invoices) == []
        (iid,) = save_orders(invoices, 1)
        assert invoices.repository.get(iid).item == "item-0"
        assert len(notification_ids(invoices)) == 1


def test_an_old_aggregate_behind_other_streams_is_not_reported_missing(url: str) -> None:
    """When the store starts with other programs' streams, getting an aggregate stored in
    the old layout is a ConfigError naming the fix, not AggregateNotFoundError."""
    with ae.open_store(url) as store:
        ae.emit(store, "agent-1", "agent.started", "runtime", {})
    with app(Orders, url, ARES_STREAM_PREFIX="") as old:
        (oid,) = save_orders(old, 1)
    with app(Orders, url) as new:
        with pytest.raises(ConfigError, match="ARES_STREAM_PREFIX") as info:
            new.repository.get(oid)
        assert str(oid) in str(info.value)
        with pytest.raises(AggregateNotFoundError):
            new.repository.get(uuid.uuid4())


# -- PostgreSQL with a linguistic collation ---------------------------------------------------


@pytest.fixture
def icu_url(postgres_admin_url: str) -> Iterator[str]:
    """A throwaway database whose default collation is ICU ``en`` (not byte order)."""
    name = f"ares_icu_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_admin_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu "
            "ICU_LOCALE 'en' LOCALE 'C.UTF-8'"
        )
    parts = urlsplit(postgres_admin_url)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, "/" + name, "", ""))
    finally:
        with psycopg.connect(postgres_admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.postgres
def test_prefixes_compare_by_code_point_under_any_collation(icu_url: str) -> None:
    """On a database with a linguistic collation, prefixes that differ only in case (which
    such a collation interleaves) still select only their own streams."""
    with (
        app(Orders, icu_url, ARES_STREAM_PREFIX="T/") as upper,
        app(Invoices, icu_url, ARES_STREAM_PREFIX="t/") as lower,
    ):
        ups = [r.notification.id for r in upper.save(Order("u"), Order("v"))]
        lows = [r.notification.id for r in lower.save(Order("w"))]
        assert notification_ids(upper) == ups
        assert notification_ids(lower) == lows
        with ae.open_store(icu_url) as store:
            assert {e.stream_id[:2] for e in store.read_all(stream_prefix="t/")} == {"t/"}
            assert {e.stream_id[:2] for e in store.read_all(stream_prefix="T/")} == {"T/"}


# -- the range helper --------------------------------------------------------------------------


@given(
    st.text(min_size=1, max_size=4, alphabet=st.sampled_from("aAz/%_0\U0010ffff\ud7ff\ue000é")),
    st.lists(st.text(max_size=6, alphabet=st.sampled_from("aAz/%_0\U0010ffff\ud7ff\ue000é"))),
)
def test_prefix_range_is_exactly_startswith(prefix: str, ids: list[str]) -> None:
    """lo <= s < hi holds exactly for the strings that start with the prefix."""
    lo, hi = prefix_range(prefix)
    for s in [*ids, prefix, prefix + "\U0010ffff", prefix[:-1]]:
        assert (lo <= s and (hi is None or s < hi)) == s.startswith(prefix)
