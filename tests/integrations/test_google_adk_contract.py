"""AresSessionService against the rest of what google-adk's own session-service tests
(tests/unittests/sessions/test_session_service.py, 2.13) hold its services to, beyond
test_google_adk.py: listing order, how a delta's values land, temp state, tool
confirmations, missing sessions, user state, exact epochs, ids, concurrent creates,
values JSON cannot hold, session objects that drifted, and re-delivered events. On
memory, SQLite and PostgreSQL.

One upstream behaviour is deliberately different, and tested as ours: events come back
in the order they were appended (the stream's order), not sorted by timestamp and id as
ADK's database service sorts them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.session import Session
from google.adk.tools.tool_confirmation import ToolConfirmation

from ares_events.integrations.google_adk import AresSessionService
from tests.integrations.fw_helpers import FW_BACKENDS, fw_url

APP, USER = "my_app", "u1"


@pytest.fixture(params=FW_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fw_url(str(request.param), tmp_path, request)


def run(url: str, body: Any) -> Any:
    async def main() -> Any:
        service = AresSessionService(url=url)
        try:
            return await body(service)
        finally:
            await service.close()

    return asyncio.run(main())


def ev(delta: dict[str, Any] | None = None, **kw: Any) -> Event:
    kw.setdefault("invocation_id", "inv")
    return Event(author="user", actions=EventActions(state_delta=delta or {}), **kw)


async def reload(s: AresSessionService, sid: str, user: str = USER) -> Session:
    got = await s.get_session(app_name=APP, user_id=user, session_id=sid)
    assert got is not None
    return got


def test_listing_is_by_last_update_oldest_first(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        for sid in ("a", "b", "c"):
            await s.create_session(app_name=APP, user_id=USER, session_id=sid)
        a = await reload(s, "a")
        await s.append_event(a, ev(timestamp=a.last_update_time + 60))  # a: the newest now
        listed = (await s.list_sessions(app_name=APP, user_id=USER)).sessions
        assert [x.id for x in listed] == ["b", "c", "a"]

    run(url, body)


def test_a_delta_replaces_values_keeps_nulls_and_leaves_other_keys(url: str) -> None:
    """Session, app and user scope alike: a dict value replaces the stored one (no deep
    merge), None is stored (the key stays), and other keys (a False) are untouched; in
    the session object written to and in what is read back."""

    async def body(s: AresSessionService) -> None:
        start = {"profile": {"name": "ada", "role": "admin"}, "flag": True, "off": False}
        start |= {"app:cfg": {"name": "ada", "role": "admin"}, "user:pref": "dark"}
        s1 = await s.create_session(app_name=APP, user_id=USER, session_id="s1", state=start)
        delta = {"profile": {"name": "bob"}, "flag": None, "new": True}
        await s.append_event(s1, ev(delta | {"app:cfg": {"name": "bob"}, "user:pref": None}))
        want = {"profile": {"name": "bob"}, "flag": None, "off": False, "new": True}
        want |= {"app:cfg": {"name": "bob"}, "user:pref": None}
        assert s1.state == want
        assert (await reload(s, "s1")).state == want
        other_user = await s.create_session(app_name=APP, user_id="u2", session_id="s2")
        assert other_user.state == {"app:cfg": {"name": "bob"}}
        same_user = await s.create_session(app_name=APP, user_id=USER, session_id="s3")
        assert same_user.state == {"app:cfg": {"name": "bob"}, "user:pref": None}

    run(url, body)


def test_temp_state_is_seen_by_the_next_event_of_the_invocation_only(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER, session_id="seq")
        first = ev({"temp:output": "from agent 1", "kept": 1})
        await s.append_event(session, first)
        assert session.state["temp:output"] == "from agent 1"  # agent 2 reads it
        assert first.actions.state_delta == {"kept": 1}  # the stored event has no temp key
        got = await reload(s, "seq")
        assert got.state == {"kept": 1}
        assert got.events[0].actions.state_delta == {"kept": 1}

    run(url, body)


def test_requested_tool_confirmations_round_trip(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER, session_id="tc")
        asked = ToolConfirmation(
            hint="dynamic hint", confirmed=False, payload={"collection": "photos", "id": 1}
        )
        actions = EventActions(requested_tool_confirmations={"call_1": asked})
        await s.append_event(session, Event(invocation_id="i", author="user", actions=actions))
        got = (await reload(s, "tc")).events[0].actions.requested_tool_confirmations["call_1"]
        assert (got.hint, got.confirmed, got.payload) == (asked.hint, False, asked.payload)

    run(url, body)


def test_appending_to_a_session_never_created_or_deleted_is_not_found(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        with pytest.raises(SessionNotFoundError):
            await s.append_event(Session(app_name=APP, user_id=USER, id="never"), ev())
        gone = await s.create_session(app_name=APP, user_id=USER, session_id="gone")
        await s.delete_session(app_name=APP, user_id=USER, session_id="gone")
        with pytest.raises(SessionNotFoundError):
            await s.append_event(gone, ev())

    run(url, body)


def test_user_state_is_the_users_latest_and_no_one_elses(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        assert await s.get_user_state(app_name=APP, user_id=USER) == {}
        session = await s.create_session(app_name=APP, user_id=USER)
        await s.append_event(session, ev({"user:profile": {"name": "Alice"}, "session_key": 1}))
        assert await s.get_user_state(app_name=APP, user_id=USER) == {"profile": {"name": "Alice"}}
        await s.append_event(session, ev({"user:counter": 1}))
        await s.append_event(session, ev({"user:counter": 2}))
        assert (await s.get_user_state(app_name=APP, user_id=USER))["counter"] == 2
        assert await s.get_user_state(app_name=APP, user_id="u2") == {}
        assert await s.get_user_state(app_name="other_app", user_id=USER) == {}

    run(url, body)


def test_epochs_in_a_repeated_local_hour_come_back_exact(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2024-11-03 06:00 and 06:30 UTC are both in the hour US Eastern repeats."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    epochs = [1730613600.0, 1730615400.0]
    try:

        async def body(s: AresSessionService) -> None:
            session = await s.create_session(app_name=APP, user_id=USER, session_id="dst")
            for t in epochs:
                await s.append_event(session, ev(timestamp=t))
            assert [e.timestamp for e in (await reload(s, "dst")).events] == epochs

        run(url, body)
    finally:
        monkeypatch.undo()
        time.tzset()


def test_blank_and_padded_ids(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        blank = await s.create_session(app_name=APP, user_id=USER, session_id="   ")
        assert blank.id.strip() == blank.id and blank.id
        await s.create_session(app_name=APP, user_id=USER, session_id="x", state={"k": "first"})
        with pytest.raises(AlreadyExistsError):
            await s.create_session(
                app_name=APP, user_id=USER, session_id="  x  ", state={"k": "second"}
            )
        assert (await reload(s, "x")).state == {"k": "first"}

    run(url, body)


def test_two_creates_of_one_id_at_once_one_wins(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        await s.create_session(app_name=APP, user_id=USER, session_id="warm-up")
        for i in range(5):
            sid = f"race-{i}"
            got = await asyncio.gather(
                s.create_session(app_name=APP, user_id=USER, session_id=sid, state={"n": 1}),
                s.create_session(app_name=APP, user_id=USER, session_id=sid, state={"n": 2}),
                return_exceptions=True,
            )
            errors = [g for g in got if isinstance(g, BaseException)]
            made = [g for g in got if isinstance(g, Session)]
            assert len(made) == 1 and len(errors) == 1
            assert isinstance(errors[0], AlreadyExistsError) and sid in str(errors[0])
            assert (await reload(s, sid)).state == made[0].state

    run(url, body)


def test_a_value_json_cannot_hold_is_stored_as_text(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER, session_id="odd")
        await s.append_event(session, ev({"callback": lambda: 1, "ok": 2}))
        got = await reload(s, "odd")
        assert len(got.events) == 1 and got.state["ok"] == 2
        assert isinstance(got.state["callback"], str)

    run(url, body)


def test_a_session_object_that_drifted_or_lost_its_marker_still_writes(url: str) -> None:
    """The version is what is compared, not a float timestamp: a session whose
    last_update_time drifted writes; one without a marker (not read by this service)
    writes at the stream's version when it lands."""

    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER, session_id="d")
        first = ev(invocation_id="inv1", timestamp=session.last_update_time + 10)
        await s.append_event(session, first)
        session.last_update_time -= 0.0001
        await s.append_event(session, ev(invocation_id="inv2", timestamp=first.timestamp + 10))
        session._storage_update_marker = None
        await s.append_event(session, ev(invocation_id="inv3", timestamp=first.timestamp + 20))
        assert [e.invocation_id for e in (await reload(s, "d")).events] == [
            "inv1",
            "inv2",
            "inv3",
        ]

    run(url, body)


def test_a_redelivered_event_is_stored_and_applied_once(url: str) -> None:
    """A retried append (the same event object, or an equal copy, even from a stale
    session object) stores nothing and applies nothing again; distinct events that share
    an id are both stored."""

    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER, session_id="dup")
        stale = session.model_copy(deep=True)
        event = ev({"counter": 1, "user:seen": 1}, invocation_id="once")
        await s.append_event(session, event)
        await s.append_event(session, event)
        await s.append_event(stale, event.model_copy(deep=True))
        got = await reload(s, "dup")
        assert [e.id for e in got.events] == [event.id] and len(session.events) == 1
        assert got.state == {"counter": 1, "user:seen": 1}
        a = Event(id="shared", invocation_id="inv_a", author="user")
        b = Event(id="shared", invocation_id="inv_b", author="agent")
        await s.append_event(session, a)
        await s.append_event(session, b)
        assert [e.author for e in (await reload(s, "dup")).events] == ["user", "user", "agent"]

    run(url, body)


def test_events_come_back_in_the_order_they_were_appended(url: str) -> None:
    """Ours, not ADK's database service (which sorts by timestamp, then id): the stream's
    order is the order the runner produced the events, whatever their timestamps."""

    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER, session_id="order")
        for event_id, t in [("event_z", 100.0), ("event_m", 100.0), ("event_a", 99.0)]:
            await s.append_event(session, Event(author="user", id=event_id, timestamp=t))
        got = await reload(s, "order")
        assert [e.id for e in got.events] == ["event_z", "event_m", "event_a"]

    run(url, body)
