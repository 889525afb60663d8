"""AresSessionService against Google ADK's session service contract (the behaviours its
own tests hold every BaseSessionService to: tests/unittests/sessions upstream), on
memory, SQLite and PostgreSQL; plus what ares-events adds: version-based conflicts, two
run_async on one session, tail-only reads, verified reads, erasure on delete."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

import ares_events as ae
from ares_events.errors import ChainIntegrityError, ConcurrencyError
from ares_events.integrations.google_adk import (
    AresSessionService,
    SessionConflict,
    SessionStateProjection,
    session_stream,
)
from ares_events.projections.runner import ProjectionRunner, read_model
from tests.integrations.fw_helpers import FW_BACKENDS, fw_url, tamper_sqlite

APP, USER = "my_app", "test_user"


class FakeLlm(BaseLlm):
    """A model that answers each request with the next scripted text (no network)."""

    model: str = "fake"
    replies: list[str] = []  # noqa: RUF012 - a pydantic field (copied per instance)
    delay: float = 0.0

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        if self.delay:
            await asyncio.sleep(self.delay)
        text = self.replies.pop(0)
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


@pytest.fixture(params=FW_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fw_url(str(request.param), tmp_path, request)


def run(url: str, body: Any, **kw: Any) -> Any:
    async def main() -> Any:
        service = AresSessionService(url=url, **kw)
        try:
            return await body(service)
        finally:
            await service.close()

    return asyncio.run(main())


def ev(inv: str, delta: dict[str, Any] | None = None, **kw: Any) -> Event:
    return Event(
        invocation_id=inv, author="user", actions=EventActions(state_delta=delta or {}), **kw
    )


def test_get_missing_session_is_none(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        assert await s.get_session(app_name=APP, user_id=USER, session_id="123") is None

    run(url, body)


def test_create_get_delete(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER, state={"key": "value"})
        assert (session.app_name, session.user_id, session.state) == (APP, USER, {"key": "value"})
        assert session.id
        got = await s.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got == session
        await s.delete_session(app_name=APP, user_id=USER, session_id=session.id)
        assert await s.get_session(app_name=APP, user_id=USER, session_id=session.id) is None
        # Deleting again, or a session that never was, does nothing.
        await s.delete_session(app_name=APP, user_id=USER, session_id=session.id)
        await s.delete_session(app_name=APP, user_id=USER, session_id="never")
        # The id can be used again: a new session, without the old one's events.
        again = await s.create_session(app_name=APP, user_id=USER, session_id=session.id)
        assert again.events == [] and again.state == {}

    run(url, body)


def test_list_sessions_per_user_and_for_all(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        for uid, sid in [("user1", "session1a"), ("user1", "session1b"), ("user2", "session2a")]:
            await s.create_session(
                app_name=APP, user_id=uid, session_id=sid, state={"key": "value" + sid}
            )
        await s.create_session(app_name="other_app", user_id="user1", session_id="x")
        one = (await s.list_sessions(app_name=APP, user_id="user1")).sessions
        assert {x.id: x.state for x in one} == {
            "session1a": {"key": "valuesession1a"},
            "session1b": {"key": "valuesession1b"},
        }
        assert all(x.events == [] for x in one)
        two = (await s.list_sessions(app_name=APP, user_id="user2")).sessions
        assert [x.id for x in two] == ["session2a"]
        everyone = (await s.list_sessions(app_name=APP)).sessions
        assert [x.id for x in everyone] == ["session1a", "session1b", "session2a"]  # oldest first
        await s.delete_session(app_name=APP, user_id="user1", session_id="session1a")
        assert len((await s.list_sessions(app_name=APP)).sessions) == 2

    run(url, body)


def test_app_user_session_and_temp_state_are_scoped_as_adk_scopes_them(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        s1 = await s.create_session(
            app_name=APP, user_id="u1", session_id="s1", state={"app:k1": "v1", "user:u1": "a"}
        )
        await s.append_event(
            s1, ev("inv1", {"app:k2": "v2", "user:u2": "b", "sk": "s", "temp:t": 1})
        )
        assert s1.state["temp:t"] == 1 and s1.state["sk"] == "s"
        assert "temp:t" not in s1.events[0].actions.state_delta
        s1b = await s.create_session(app_name=APP, user_id="u1", session_id="s1b")
        assert s1b.state == {"app:k1": "v1", "app:k2": "v2", "user:u1": "a", "user:u2": "b"}
        s2 = await s.create_session(app_name=APP, user_id="u2", session_id="s2")
        assert s2.state == {"app:k1": "v1", "app:k2": "v2"}
        got = await s.get_session(app_name=APP, user_id="u1", session_id="s1")
        assert got is not None and got.state["sk"] == "s" and "temp:t" not in got.state
        assert await s.get_user_state(app_name=APP, user_id="u1") == {"u1": "a", "u2": "b"}
        assert await s.get_user_state(app_name=APP, user_id="nobody") == {}

    run(url, body)


def test_sessions_are_keyed_by_app_and_user(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        s1 = await s.create_session(app_name=APP, user_id="u1", session_id="s1")
        await s.append_event(s1, ev("inv1"))
        await s.create_session(app_name=APP, user_id="u2", session_id="s1")
        got = await s.get_session(app_name=APP, user_id="u2", session_id="s1")
        assert got is not None and got.user_id == "u2" and got.events == []
        with pytest.raises(AlreadyExistsError):
            await s.create_session(app_name=APP, user_id="u1", session_id="s1")
        # Odd characters in the names stay apart (each part is encoded).
        a = await s.create_session(app_name="a/b", user_id="c", session_id="d")
        b = await s.create_session(app_name="a", user_id="b/c", session_id="d")
        assert a.id == b.id == "d"
        assert (await s.get_session(app_name="a/b", user_id="c", session_id="d")) is not None

    run(url, body)


def test_padded_session_id_reads_and_deletes(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        made = await s.create_session(app_name=APP, user_id=USER, session_id="  padded  ")
        assert made.id == "padded"
        got = await s.get_session(app_name=APP, user_id=USER, session_id=" padded ")
        assert got is not None
        await s.delete_session(app_name=APP, user_id=USER, session_id="padded ")
        assert await s.get_session(app_name=APP, user_id=USER, session_id="padded") is None

    run(url, body)


def test_events_round_trip_bytes_and_every_field(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER)
        content = types.Content(
            role="user", parts=[types.Part.from_bytes(data=b"\x00\xffimage", mime_type="image/png")]
        )
        await s.append_event(session, Event(invocation_id="i", author="user", content=content))
        full = Event(
            invocation_id="invocation",
            author="user",
            content=types.Content(role="user", parts=[types.Part(text="test_text")]),
            turn_complete=True,
            partial=False,
            actions=EventActions(
                artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True
            ),
            long_running_tool_ids={"tool1"},
            error_code="error_code",
            error_message="error_message",
            interrupted=True,
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2
            ),
            custom_metadata={"custom_key": "custom_value"},
            timestamp=1700000000.123,
        )
        await s.append_event(session, full)
        got = await s.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None
        assert got.events[0].content == content
        assert got == session
        # A partial event is not stored.
        await s.append_event(session, Event(invocation_id="p", author="user", partial=True))
        got = await s.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and len(got.events) == 2

    run(url, body)


def test_last_update_time_follows_the_events(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER)
        t = session.last_update_time + 10
        await s.append_event(session, ev("inv", timestamp=t))
        assert session.last_update_time == pytest.approx(t, abs=1e-6)
        got = await s.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and got.last_update_time == pytest.approx(t, abs=1e-6)

    run(url, body)


def test_a_stale_session_object_is_refused_by_version(url: str) -> None:
    """ADK's own staleness test, with versions instead of timestamps: even an event whose
    timestamp is newer than everything stored is refused from a stale session object."""

    async def body(s: AresSessionService) -> None:
        original = await s.create_session(app_name=APP, user_id=USER)
        await s.append_event(original, ev("inv1", {"sk1": "v1"}))
        updated = await s.get_session(app_name=APP, user_id=USER, session_id=original.id)
        assert updated is not None
        await s.append_event(updated, ev("inv2", {"sk2": "v2"}))
        with pytest.raises(SessionConflict, match="modified in storage") as info:
            await s.append_event(original, ev("inv3", {"sk3": "v3"}, timestamp=4e9))
        assert isinstance(info.value, ValueError) and isinstance(info.value, ConcurrencyError)
        final = await s.get_session(app_name=APP, user_id=USER, session_id=original.id)
        assert final is not None
        assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
        assert final.state == {"sk1": "v1", "sk2": "v2"}
        with pytest.raises(SessionNotFoundError):
            gone = await s.create_session(app_name=APP, user_id=USER, session_id="gone")
            await s.delete_session(app_name=APP, user_id=USER, session_id="gone")
            await s.append_event(gone, ev("late"))

    run(url, body)


def test_two_writers_from_one_read_one_wins_each_round(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER)
        for i in range(8):
            latest = await s.get_session(app_name=APP, user_id=USER, session_id=session.id)
            assert latest is not None
            a, b = latest.model_copy(deep=True), latest.model_copy(deep=True)
            got = await asyncio.gather(
                s.append_event(a, ev(f"inv{i}-1", {f"sk{i}-1": 1})),
                s.append_event(b, ev(f"inv{i}-2", {f"sk{i}-2": 2})),
                return_exceptions=True,
            )
            assert sorted(type(g).__name__ for g in got) == ["Event", "StaleSessionConflict"]
        final = await s.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert final is not None and len(final.events) == 8 and len(final.state) == 8

    run(url, body)


def test_recent_events_and_after_timestamp(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER, state={"k": 0})
        for i in range(12):
            await s.append_event(session, ev(f"inv{i}", {"k": i}, timestamp=1000.0 + i))

        def get(**kw: Any) -> Any:
            return s.get_session(
                app_name=APP, user_id=USER, session_id=session.id, config=GetSessionConfig(**kw)
            )

        tail = await get(num_recent_events=3)
        assert [e.invocation_id for e in tail.events] == ["inv9", "inv10", "inv11"]
        assert tail.state == {"k": 11} and tail == tail.model_copy()
        assert (await get(num_recent_events=0)).events == []
        assert len((await get(num_recent_events=50)).events) == 12
        assert [e.invocation_id for e in (await get(after_timestamp=1010.0)).events] == [
            "inv10",
            "inv11",
        ]
        both = await get(num_recent_events=5, after_timestamp=1009.5)
        assert [e.invocation_id for e in both.events] == ["inv10", "inv11"]
        # A tail read gives a session that writes at the right version.
        await s.append_event(tail, ev("inv12"))
        assert len((await get(num_recent_events=50)).events) == 13

    run(url, body, snapshot_every=5)


def test_a_tail_read_does_not_read_the_events_before_the_tail(tmp_path: Path) -> None:
    """An early event is tampered with: reading the whole session refuses it
    (ChainIntegrityError); reading the newest events does not touch it, so it works."""
    url = f"sqlite:///{tmp_path}/tail.db"

    async def fill(s: AresSessionService) -> str:
        session = await s.create_session(app_name=APP, user_id=USER)
        await s.append_event(session, ev("secret-early", {"k": "early"}))
        for i in range(30):
            await s.append_event(session, ev(f"inv{i}", {"k": i}))
        return session.id

    sid = run(url, fill, snapshot_every=10)
    tamper_sqlite(tmp_path / "tail.db", "secret-early", "secret-EARLY")

    async def read(s: AresSessionService) -> None:
        tail = await s.get_session(
            app_name=APP, user_id=USER, session_id=sid, config=GetSessionConfig(num_recent_events=5)
        )
        assert tail is not None and [e.invocation_id for e in tail.events][-1] == "inv29"
        assert tail.state == {"k": 29}
        with pytest.raises(ChainIntegrityError) as info:
            await s.get_session(app_name=APP, user_id=USER, session_id=sid)
        assert info.value.stream_id == session_stream(APP, USER, sid)

    run(url, read, snapshot_every=10)


def test_two_run_async_on_one_session_never_interleave(url: str) -> None:
    async def body(s: AresSessionService) -> None:
        session = await s.create_session(app_name=APP, user_id=USER, session_id="race")
        agent = LlmAgent(name="a", model=FakeLlm(replies=["one", "two", "three"], delay=0.01))
        runner = Runner(agent=agent, app_name=APP, session_service=s)

        async def turn(text: str) -> list[Event]:
            msg = types.Content(role="user", parts=[types.Part(text=text)])
            return [
                e async for e in runner.run_async(user_id=USER, session_id="race", new_message=msg)
            ]

        got = await asyncio.gather(turn("A"), turn("B"), return_exceptions=True)
        errors = [g for g in got if isinstance(g, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], SessionConflict), got
        final = await s.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert final is not None
        # The winner's prompt and reply end the session. Before them stands at most the
        # loser's prompt, when it landed before the winner read the history (the winner's
        # reply was then computed on it); the loser's reply is what is refused.
        *before, prompt, reply = final.events
        assert prompt.invocation_id == reply.invocation_id and prompt.author == "user"
        assert reply.author == "a"
        assert len(before) <= 1
        assert all(e.author == "user" and e.invocation_id != reply.invocation_id for e in before)
        texts = [
            str(e.content.parts[0].text) for e in [*before, prompt] if e.content and e.content.parts
        ]
        assert sorted(texts) in (["A"], ["B"], ["A", "B"])

    run(url, body)


def test_delete_with_erase_erases_and_keeps_the_chain(url: str) -> None:
    async def body(s: AresSessionService) -> str:
        session = await s.create_session(app_name=APP, user_id=USER, state={"card": "4111"})
        await s.append_event(session, ev("inv", {"ssn": "078-05-1120"}))
        await s.delete_session(app_name=APP, user_id=USER, session_id=session.id)
        assert await s.get_session(app_name=APP, user_id=USER, session_id=session.id) is None
        return session.id

    sid = run(url, body, erase_on_delete=True)
    with ae.open_store(url) as store:
        stream = session_stream(APP, USER, sid)
        events = list(store.read(stream))
        assert [e.payload_erased for e in events] == [True, True, False]
        assert ae.integrity.verify_stream(store, stream).ok
        assert len(list(store.read("ares-events/erasures"))) == 2


@pytest.mark.parametrize("face", ["blocking", "asyncio"])
def test_delete_with_erase_drops_the_snapshots_and_read_models_that_folded_it(
    url: str, face: str, tmp_path: Path
) -> None:
    """erase_on_delete erases as ``ares-events erase`` does: the session's snapshots and
    the read models that folded its payloads go too, so none holds its state any more (on
    either face; on SQLite no copy stays in the files); a read model refolds without it,
    and the audit is clean."""
    secret = "SSN-078-05-1120"
    proj = SessionStateProjection()

    async def main() -> None:
        opened = await ae.open_async_store(url) if face == "asyncio" else None
        s = AresSessionService(
            url=None if opened else url, store=opened, snapshot_every=5, erase_on_delete=True
        )
        try:
            session = await s.create_session(
                app_name=APP, user_id=USER, session_id="s1", state={"ssn": secret}
            )
            for i in range(6):
                await s.append_event(session, ev(f"inv{i}", {"turn": i}))
            with ae.open_store(url) as store:
                ProjectionRunner(store, [proj]).run_until_idle()
                assert secret in str(read_model(store, proj, stream))
                snap = store.snapshots.load(stream, proj.name)  # at version 5
                assert snap is not None and secret in str(snap.state)
            await s.delete_session(app_name=APP, user_id=USER, session_id="s1")
        finally:
            await s.close()
            if opened is not None:
                await opened.close()

    stream = session_stream(APP, USER, "s1")
    asyncio.run(main())
    with ae.open_store(url) as store:
        snaps = store.snapshots
        states = [snaps.load(stream, i.projection, verify=False) for i in snaps.list(stream)]
        assert [s.at_version for s in states if s and secret in str(s.state)] == []
        assert read_model(store, proj, stream) is None  # emptied until the runner refolds
        ProjectionRunner(store, [proj]).run_until_idle()
        assert secret not in str(read_model(store, proj, stream))
        assert ae.integrity.audit(store, deep=True).ok
    files = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    assert not any(secret.encode() in b for b in files)
