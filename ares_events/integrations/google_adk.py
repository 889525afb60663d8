"""A Google ADK session service on ares-events: :class:`AresSessionService` implements
``BaseSessionService`` (``pip install 'ares-events[google-adk]'``)::

    from google.adk.runners import Runner
    from ares_events.integrations.google_adk import AresSessionService

    service = AresSessionService(url="sqlite:///agents.db")
    runner = Runner(agent=agent, app_name="app", session_service=service)

One session is one hash-chained stream, ``google-adk/<app>/<user>/<session>`` (each part
percent-encoded), holding ``adk.session.created`` (with the session-scoped initial
state), one ``adk.event`` per event (the ADK event and its session-scoped state delta) and
``adk.session.deleted``. App-scoped (``app:``) and user-scoped (``user:``) state live in
``google-adk-app/<app>`` and ``google-adk-user/<app>/<user>``, written in the same
transaction as the event that changed them; ``temp:`` state is never stored. State is
folded as ADK folds it: the session's own keys, then ``app:`` and ``user:`` keys merged in.

- **Versions, not timestamps.** A session object carries the stream version it was read
  at (ADK's ``_storage_update_marker``); ``append_event`` writes at that version. Two
  ``run_async`` on one session: the first append wins, the other gets
  :class:`SessionConflict` (ADK's ``StaleSessionError`` and a
  :class:`~ares_events.errors.ConcurrencyError`), and the stream never interleaves the
  two runs' events. Reload the session (``get_session``) and run again.
- **The tail only.** ``get_session(config=GetSessionConfig(num_recent_events=N))`` reads
  the last events of the stream (verified from the first one's link to the head row) and
  the state from the latest snapshot plus the events after it: O(N + snapshot interval),
  not O(session).
- **Verified before decoded.** Every read checks the chain (a MAC in keyed mode) and the
  head row before an event is decoded, and raises
  :class:`~ares_events.errors.ChainIntegrityError` on findings.
- **History is kept.** ``delete_session`` appends ``adk.session.deleted``; with
  ``erase_on_delete=True`` it also erases the payloads of the session's events (blobs
  too) and records each erasure in ``ares-events/erasures``.

Under the session, :mod:`ares_events.integrations.google_adk_journal` runs an agent's
model calls and tools through the run journal (a killed run resumes without re-paying
answered model calls or repeating tool side effects).

It may import anything in the package, and ``google.adk``.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import quote, unquote

from google.adk.errors._stale_session_error import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions import _session_util
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State

from ares_events.core.backend import Capability
from ares_events.core.events import ANY, NewEvent, RecordedEvent, validate_name
from ares_events.errors import ChainIntegrityError, ConcurrencyError, ConfigError
from ares_events.integrations._conversation_async import AsyncConversationStream
from ares_events.projections.recovery_async import AsyncSnapshotter, arecover
from ares_events.stores.threaded import async_face

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

__all__ = [
    "APP_PREFIX",
    "MODULE",
    "SESSION_PREFIX",
    "USER_PREFIX",
    "AresSessionService",
    "SessionConflict",
    "SessionStateProjection",
]

SESSION_PREFIX: Final = "google-adk/"
APP_PREFIX: Final = "google-adk-app/"
USER_PREFIX: Final = "google-adk-user/"
MODULE: Final = "google-adk"
T_CREATED: Final = "adk.session.created"
T_EVENT: Final = "adk.event"
T_DELETED: Final = "adk.session.deleted"
T_STATE: Final = "adk.state"
MARKER: Final = "ares-v"
MAX_VIEWS: Final = 1024


class SessionConflict(ConcurrencyError, StaleSessionError):
    """The session was written by another run after this session object was read; the
    event was not stored. Reload the session (``get_session``) and run again.

    Also an ADK ``StaleSessionError`` (a ``ValueError``), so code written for ADK's own
    services catches it.
    """

    def __init__(self, session_id: str, stream_id: str, expected: int, actual: int) -> None:
        self.session_id = session_id
        ConcurrencyError.__init__(
            self,
            stream_id,
            expected,
            actual,
            f"session {session_id!r} was modified in storage by another run since this "
            f"session object was read (version {expected}); the event was not stored: "
            "reload the session and run again",
        )


def _q(part: str) -> str:
    return quote(part, safe="")


def session_stream(app_name: str, user_id: str, session_id: str) -> str:
    """The stream of a session.

    Raises:
        InvalidEvent: the name is too long or holds a control character.
    """
    sid = f"{SESSION_PREFIX}{_q(app_name)}/{_q(user_id)}/{_q(session_id)}"
    return validate_name(sid, "session")


def _app_stream(app_name: str) -> str:
    return validate_name(APP_PREFIX + _q(app_name), "app_name")


def _user_stream(app_name: str, user_id: str) -> str:
    return validate_name(f"{USER_PREFIX}{_q(app_name)}/{_q(user_id)}", "user_id")


class SessionStateProjection:
    """The fold of a session stream: live or not, its session-scoped state, how many
    events it holds and when it was last updated (what ``get_session`` needs besides the
    events; snapshotted, so a tail read does not replay the session)."""

    name: ClassVar[str] = "google_adk_session"
    version: ClassVar[int] = 1

    def initial(self) -> dict[str, Any]:
        return {"live": False, "state": {}, "events": 0, "updated": 0.0, "since": 0}

    def apply(self, state: dict[str, Any], event: RecordedEvent) -> dict[str, Any]:
        p = event.payload
        if event.type == T_CREATED:
            return {
                "live": True,
                "state": dict(p.get("state") or {}),
                "events": 0,
                "updated": p.get("time", 0.0),
                "since": event.version,
            }
        if event.type == T_EVENT and state["live"]:
            state["state"].update(p.get("delta") or {})
            state["events"] += 1
            state["updated"] = (p.get("event") or {}).get("timestamp", state["updated"])
        elif event.type == T_DELETED:
            return self.initial()
        return state


class AresSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` on ares-events (see the module docstring).

    Args:
        url: a store URL; the service opens it on first use and closes it in :meth:`close`.
        store: an open store instead (blocking or asyncio; left open by :meth:`close`).
        snapshot_every: snapshot each session's state every this many events (0: never;
            then a tail read replays the session's state from its start).
        erase_on_delete: ``delete_session`` also erases the session's payloads.
        by: the name written in erasure records.

    Raises:
        ConfigError: neither or both of ``url`` and ``store``.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        store: EventStore | AsyncEventStore | None = None,
        snapshot_every: int = 50,
        erase_on_delete: bool = False,
        by: str = "google-adk",
    ) -> None:
        if (url is None) == (store is None):
            raise ConfigError("give exactly one of url= or store=")
        self._url = url
        self._store: AsyncEventStore | None = async_face(store) if store is not None else None
        self._owns = store is None
        self._snapshot_every = snapshot_every
        self._erase = erase_on_delete
        self._by = by
        self._views: OrderedDict[str, _View] = OrderedDict()
        self._projection = SessionStateProjection()
        self._snapshotter: AsyncSnapshotter | None = None

    def __repr__(self) -> str:
        return f"AresSessionService({self._store!r})"

    # -- BaseSessionService ------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session (``AlreadyExistsError`` when a live one has this id)."""
        session_id = (session_id.strip() if session_id else None) or str(uuid.uuid4())
        sid = session_stream(app_name, user_id, session_id)
        deltas = _session_util.extract_json_safe_state_delta(state or {})
        now = time.time()
        v = await self._view(sid)
        view = v.stream
        async with v.lock:
            await view.refresh()
            if v.fold()["live"]:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            created = NewEvent(
                type=T_CREATED,
                module=MODULE,
                payload={
                    "app_name": app_name,
                    "user_id": user_id,
                    "session_id": session_id,
                    "state": deltas["session"],
                    "time": now,
                },
            )
            batches = [(sid, [created], view.version), *self._scoped(app_name, user_id, deltas)]
            store = await self._open()
            try:
                res = await store.append_many(batches)
            except ConcurrencyError:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
            await view.refresh()
        await self._after_append(sid, res[0].version)
        session = Session(
            id=session_id, app_name=app_name, user_id=user_id, state=deltas["session"]
        )
        session.last_update_time = now
        session._storage_update_marker = f"{MARKER}{res[0].version}"
        return await self._merge(session)

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events (all, or the ``num_recent_events`` newest and
        those at or after ``after_timestamp``), or None.

        Raises:
            ChainIntegrityError: the session's stream does not verify.
        """
        session_id = session_id.strip() if session_id else session_id
        sid = session_stream(app_name, user_id, session_id)
        recent = config.num_recent_events if config is not None else None
        if recent is not None:
            got = await self._tail_session(sid, recent)
        else:
            v = await self._view(sid)
            async with v.lock:
                await v.stream.refresh()
                events = _since_created(v.stream.events)
                got = (copy.deepcopy(v.fold()), v.stream.version, events)
        fold, version, events = got
        if not fold["live"]:
            return None
        adk_events = [_decode(e) for e in events if e.type == T_EVENT]
        if recent is not None:
            adk_events = adk_events[-recent:] if recent else []
        if config is not None and config.after_timestamp is not None:
            adk_events = [ev for ev in adk_events if ev.timestamp >= config.after_timestamp]
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=dict(fold["state"]),
            events=adk_events,
        )
        session.last_update_time = float(fold["updated"])
        session._storage_update_marker = f"{MARKER}{version}"
        return await self._merge(session)

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The live sessions of an app (of one user, when given), without events,
        oldest update first."""
        store = await self._open()
        prefix = f"{SESSION_PREFIX}{_q(app_name)}/"
        if user_id is not None:
            prefix += f"{_q(user_id)}/"
        out: list[Session] = []
        async for stream_id, _v in store.streams():
            if not stream_id.startswith(prefix):
                continue
            rest = stream_id[len(SESSION_PREFIX) :].split("/")
            if len(rest) != 3:
                continue
            uid, sess = unquote(rest[1]), unquote(rest[2])
            fold, _version = await self._state_of(stream_id)
            if not fold["live"]:
                continue
            s = Session(id=sess, app_name=app_name, user_id=uid, state=dict(fold["state"]))
            s.last_update_time = float(fold["updated"])
            out.append(await self._merge(s))
        out.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=out)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session (an ``adk.session.deleted`` event; its payloads erased too
        with ``erase_on_delete``). Deleting a missing session does nothing."""
        session_id = session_id.strip() if session_id else session_id
        sid = session_stream(app_name, user_id, session_id)
        v = await self._view(sid)
        view = v.stream
        async with v.lock:
            await view.refresh()
            if not v.fold()["live"]:
                return
            events = _since_created(view.events)
            first = (events[0].version if events else view.version + 1) - 1  # its creation
            doomed = [first, *(e.version for e in events)]
            await view.append([NewEvent(type=T_DELETED, module=MODULE, payload={})], ANY)
            await view.refresh()
            if self._erase:
                await view.erase(doomed, reason="google-adk delete_session", by=self._by)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user-scoped state (keys without the ``user:`` prefix)."""
        return await self._scoped_state(_user_stream(app_name, user_id))

    async def append_event(self, session: Session, event: Event) -> Event:
        """Append ``event`` at the version ``session`` was read at; apply its state
        delta as ADK does (``temp:`` keys only in memory).

        Raises:
            SessionConflict: another run wrote to the session since (nothing stored).
            SessionNotFoundError: the session does not exist (or was deleted).
        """
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        sid = session_stream(session.app_name, session.user_id, session.id)
        delta = event.actions.state_delta if event.actions else None
        deltas = _session_util.extract_json_safe_state_delta(delta or {})
        payload = {"event": event.model_dump(exclude_none=True, mode="json"), "delta": {}}
        payload["delta"] = deltas["session"]
        v = await self._view(sid)
        view = v.stream
        async with v.lock:
            await view.refresh()
            if not v.fold()["live"]:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            expected = _marker_version(session)
            if expected is None:
                expected = view.version  # a session object this service did not read
            ev = NewEvent(type=T_EVENT, module=MODULE, payload=payload)
            batches = [
                (sid, [ev], expected),
                *self._scoped(session.app_name, session.user_id, deltas),
            ]
            store = await self._open()
            try:
                res = await store.append_many(batches)
            except ConcurrencyError as exc:
                raise SessionConflict(session.id, sid, expected, view.version) from exc
            await view.refresh()
        await self._after_append(sid, res[0].version)
        session.last_update_time = event.timestamp
        session._storage_update_marker = f"{MARKER}{res[0].version}"
        return self._commit_event_to_session(session, event)

    # -- plumbing ----------------------------------------------------------------------

    async def close(self) -> None:
        """Close the store when the service opened it (from ``url=``)."""
        if self._owns and self._store is not None:
            await self._store.close()
            self._store = None
        self._views.clear()

    async def _open(self) -> AsyncEventStore:
        if self._store is None:
            from ares_events.stores import open_async_store

            assert self._url is not None
            self._store = await open_async_store(self._url)
        return self._store

    async def _view(self, stream_id: str) -> _View:
        got = self._views.get(stream_id)
        if got is None:
            got = _View(AsyncConversationStream(await self._open(), stream_id))
            self._views[stream_id] = got
            while len(self._views) > MAX_VIEWS:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(stream_id)
        return got

    def _scoped(
        self, app_name: str, user_id: str, deltas: dict[str, dict[str, Any]]
    ) -> list[tuple[str, list[NewEvent], Any]]:
        out: list[tuple[str, list[NewEvent], Any]] = []
        if deltas["app"]:
            ev = NewEvent(type=T_STATE, module=MODULE, payload={"delta": deltas["app"]})
            out.append((_app_stream(app_name), [ev], ANY))
        if deltas["user"]:
            ev = NewEvent(type=T_STATE, module=MODULE, payload={"delta": deltas["user"]})
            out.append((_user_stream(app_name, user_id), [ev], ANY))
        return out

    async def _scoped_state(self, stream_id: str) -> dict[str, Any]:
        v = await self._view(stream_id)
        async with v.lock:
            await v.stream.refresh()
            return copy.deepcopy(v.fold()["state"])

    async def _merge(self, session: Session) -> Session:
        for k, v in (await self._scoped_state(_app_stream(session.app_name))).items():
            session.state[State.APP_PREFIX + k] = v
        user = await self._scoped_state(_user_stream(session.app_name, session.user_id))
        for k, v in user.items():
            session.state[State.USER_PREFIX + k] = v
        return session

    async def _after_append(self, stream_id: str, version: int) -> None:
        store = await self._open()
        if self._snapshot_every <= 0 or Capability.SNAPSHOTS not in store.capabilities:
            return
        if self._snapshotter is None:
            self._snapshotter = AsyncSnapshotter(
                store, [self._projection], every=self._snapshot_every
            )
        await self._snapshotter.after_append(stream_id, version)

    async def _state_of(self, stream_id: str) -> tuple[dict[str, Any], int]:
        """The session's fold from its latest snapshot and the events after it."""
        store = await self._open()
        snaps = store.snapshots if Capability.SNAPSHOTS in store.capabilities else None
        rep = await arecover(
            store, stream_id, self._projection, snapshots=snaps, max_replay=2**62, strict=True
        )
        return rep.state, rep.version

    async def _tail_session(
        self, stream_id: str, recent: int
    ) -> tuple[dict[str, Any], int, list[RecordedEvent]]:
        store = await self._open()
        view = AsyncConversationStream(store, stream_id)
        for _ in range(100):
            fold, version = await self._state_of(stream_id)
            if not fold["live"]:
                return fold, version, []
            since = int(fold["since"])
            want = min(recent, int(fold["events"]))
            # The newest ``want`` events of the live incarnation end at ``version`` (the
            # session's events are its last events, after its creation).
            tail = await view.tail(want) if want else []
            if tail and tail[-1].version != version:
                continue  # another writer appended in between: read both again
            if not tail:
                head = await store.head(stream_id)
                if head is not None and head.version != version:
                    continue
            return fold, version, [e for e in tail if e.version > since]
        raise ChainIntegrityError(stream_id, [])  # pragma: no cover - a thousand writers


class _View:
    """A verified view of one stream, its lock, and its fold so far (a session's
    :class:`SessionStateProjection`, or the merged deltas of an app or user stream)."""

    __slots__ = ("_n", "_state", "lock", "stream")

    def __init__(self, stream: AsyncConversationStream) -> None:
        self.stream = stream
        self.lock = asyncio.Lock()
        self._state = SessionStateProjection().initial()
        self._n = 0

    def fold(self) -> dict[str, Any]:
        """The fold of every event read so far (only the new ones are applied)."""
        events = self.stream.events
        p = SessionStateProjection()
        if self._n > len(events):  # the view was read again from the start
            self._state, self._n = p.initial(), 0
        for e in events[self._n :]:
            if e.type == T_STATE:
                if not e.payload_erased:
                    self._state["state"].update(e.payload.get("delta") or {})
            elif not e.payload_erased:
                self._state = p.apply(self._state, e)
            elif e.type == T_DELETED:
                self._state = p.initial()
        self._n = len(events)
        return self._state


def _since_created(events: list[RecordedEvent]) -> list[RecordedEvent]:
    """The events of the live incarnation (after the last creation)."""
    for i in range(len(events) - 1, -1, -1):
        if events[i].type == T_CREATED:
            return events[i + 1 :]
    return []


def _decode(e: RecordedEvent) -> Event:
    return Event.model_validate(e.payload["event"])


def _marker_version(session: Session) -> int | None:
    marker = session._storage_update_marker
    if isinstance(marker, str) and marker.startswith(MARKER):
        try:
            return int(marker[len(MARKER) :])
        except ValueError:
            return None
    return None
