"""The storage work of :class:`~ares_events.integrations.google_adk.AresSessionService`:
:class:`AsyncAdkSessions` (one face written, the other generated), one verified view and
lock per stream (at most :data:`MAX_VIEWS`), so different sessions run side by side.

It may import anything in the package (an integration is top layer), and ``google.adk``.
"""

from __future__ import annotations

import copy
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions import _session_util
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session
from google.adk.sessions.state import State

from ares_events.core.backend import Capability
from ares_events.core.events import ANY, NewEvent, RecordedEvent
from ares_events.core.faces import ASYNC
from ares_events.errors import ChainIntegrityError, ConcurrencyError
from ares_events.integrations._conversation_async import AsyncConversationStream
from ares_events.integrations._faces import Table
from ares_events.integrations._google_adk_core import (
    MARKER,
    MODULE,
    SESSION_PREFIX,
    T_CREATED,
    T_DELETED,
    T_EVENT,
    T_STATE,
    Fold,
    SessionStateProjection,
    StaleSessionConflict,
    app_stream,
    decode,
    marker_version,
    quote_part,
    session_stream,
    since_created,
    user_stream,
)
from ares_events.projections.recovery_async import AsyncSnapshotter, arecover

if ASYNC:
    from asyncio import Lock
else:
    from threading import Lock

if TYPE_CHECKING:
    from ares_events.core.store_async import AsyncEventStore

__all__ = ["MAX_VIEWS", "AsyncAdkSessions"]

MAX_VIEWS: Final = 1024
TAIL_ATTEMPTS: Final = 100


class AsyncAdkSessions:
    """ADK sessions on one store; the arguments are
    :class:`~ares_events.integrations.google_adk.AresSessionService`'s."""

    def __init__(
        self, store: AsyncEventStore, *, snapshot_every: int, erase_on_delete: bool, by: str
    ) -> None:
        self.store = store
        self._erase = erase_on_delete
        self._by = by
        self._views = Table(lambda sid: _View(AsyncConversationStream(store, sid)), MAX_VIEWS)
        self._projection = SessionStateProjection()
        self._snapshotter = (
            AsyncSnapshotter(store, [self._projection], every=snapshot_every)
            if snapshot_every > 0 and Capability.SNAPSHOTS in store.capabilities
            else None
        )

    async def create_session(
        self, app_name: str, user_id: str, state: dict[str, Any] | None, session_id: str | None
    ) -> Session:
        session_id = (session_id.strip() if session_id else None) or str(uuid.uuid4())
        sid = session_stream(app_name, user_id, session_id)
        deltas = _session_util.extract_json_safe_state_delta(state or {})
        now = time.time()
        v = self._views.get(sid)
        async with v.lock:
            await v.stream.refresh()
            if v.fold()["live"]:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            payload: dict[str, Any] = {"app_name": app_name, "user_id": user_id}
            payload["session_id"] = session_id
            payload.update(state=deltas["session"], time=now)
            created = NewEvent(type=T_CREATED, module=MODULE, payload=payload)
            batches = [(sid, [created], v.stream.version), *_scoped(app_name, user_id, deltas)]
            try:
                res = await self.store.append_many(batches)
            except ConcurrencyError:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
            await v.stream.refresh()
        await self._after_append(sid, res[0].version)
        return await self._session(
            app_name, user_id, session_id, deltas["session"], now, res[0].version
        )

    async def get_session(
        self, app_name: str, user_id: str, session_id: str, config: GetSessionConfig | None
    ) -> Session | None:
        session_id = session_id.strip() if session_id else session_id
        sid = session_stream(app_name, user_id, session_id)
        recent = config.num_recent_events if config is not None else None
        if recent is not None:
            fold, version, events = await self._tail_session(sid, recent)  # at most recent
        else:
            v = self._views.get(sid)
            async with v.lock:
                await v.stream.refresh()
                events = since_created(v.stream.events)
                fold, version = copy.deepcopy(v.fold()), v.stream.version
        if not fold["live"]:
            return None
        adk_events = [decode(e) for e in events if e.type == T_EVENT]
        if config is not None and config.after_timestamp is not None:
            adk_events = [ev for ev in adk_events if ev.timestamp >= config.after_timestamp]
        return await self._session(
            app_name, user_id, session_id, fold["state"], fold["updated"], version, adk_events
        )

    async def list_sessions(self, app_name: str, user_id: str | None) -> list[Session]:
        prefix = f"{SESSION_PREFIX}{quote_part(app_name)}/"
        if user_id is not None:
            prefix += f"{quote_part(user_id)}/"
        out: list[Session] = []
        async for stream_id, _v in self.store.streams():
            if not stream_id.startswith(prefix):
                continue
            rest = stream_id[len(SESSION_PREFIX) :].split("/")
            if len(rest) != 3:
                continue
            uid, sess = unquote(rest[1]), unquote(rest[2])
            fold, _version = await self._state_of(stream_id)
            if not fold["live"]:
                continue
            out.append(
                await self._session(app_name, uid, sess, fold["state"], fold["updated"], None)
            )
        out.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return out

    async def delete_session(self, app_name: str, user_id: str, session_id: str) -> None:
        session_id = session_id.strip() if session_id else session_id
        sid = session_stream(app_name, user_id, session_id)
        v = self._views.get(sid)
        view = v.stream
        async with v.lock:
            await view.refresh()
            if not v.fold()["live"]:
                return
            events = since_created(view.events)
            first = (events[0].version if events else view.version + 1) - 1  # its creation
            doomed = [first, *(e.version for e in events)]
            await view.append([NewEvent(type=T_DELETED, module=MODULE, payload={})], ANY)
            await view.refresh()
            if self._erase:
                await view.erase(doomed, reason="google-adk delete_session", by=self._by)

    async def get_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        return await self._scoped_state(user_stream(app_name, user_id))

    async def store_event(self, session: Session, event: Event) -> int | None:
        """Store ``event`` (its ``temp:`` delta already trimmed) at the version ``session``
        was read at; return the new version, or None for a re-delivery (the session
        already holds an equal event with its id: stored once, as ADK's own service does).
        """
        sid = session_stream(session.app_name, session.user_id, session.id)
        delta = event.actions.state_delta if event.actions else None
        deltas = _session_util.extract_json_safe_state_delta(delta or {})
        dumped = event.model_dump(exclude_none=True, mode="json")
        payload = {"event": dumped, "delta": deltas["session"]}
        v = self._views.get(sid)
        async with v.lock:
            await v.stream.refresh()
            fold = v.fold()
            if not fold["live"]:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            if any(e.payload["event"] == dumped for e in v.folded.by_id.get(event.id, ())):
                return None
            expected = marker_version(session)
            if expected is None:
                expected = v.stream.version  # a session object this service did not read
            ev = NewEvent(type=T_EVENT, module=MODULE, payload=payload)
            batches = [(sid, [ev], expected), *_scoped(session.app_name, session.user_id, deltas)]
            try:
                res = await self.store.append_many(batches)
            except ConcurrencyError as exc:
                raise StaleSessionConflict(session.id, sid, expected, v.stream.version) from exc
            await v.stream.refresh()
        await self._after_append(sid, res[0].version)
        return res[0].version

    async def _scoped_state(self, stream_id: str) -> dict[str, Any]:
        v = self._views.get(stream_id)
        async with v.lock:
            await v.stream.refresh()
            return copy.deepcopy(v.fold()["state"])

    async def _session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        state: dict[str, Any],
        updated: float,
        version: int | None,
        events: list[Event] | None = None,
    ) -> Session:
        """A session object (read at ``version``), its ``app:`` and ``user:`` state merged
        in as ADK merges them."""
        s = Session(id=session_id, app_name=app_name, user_id=user_id, state=dict(state))
        s.events = events or []
        s.last_update_time = float(updated)
        if version is not None:
            s._storage_update_marker = f"{MARKER}{version}"
        scopes = (
            (State.APP_PREFIX, app_stream(app_name)),
            (State.USER_PREFIX, user_stream(app_name, user_id)),
        )
        for prefix, stream_id in scopes:
            for k, v in (await self._scoped_state(stream_id)).items():
                s.state[prefix + k] = v
        return s

    async def _after_append(self, stream_id: str, version: int) -> None:
        if self._snapshotter is not None:
            await self._snapshotter.after_append(stream_id, version)

    async def _state_of(self, stream_id: str) -> tuple[dict[str, Any], int]:
        """The session's fold from its latest snapshot and the events after it."""
        store = self.store
        snaps = store.snapshots if Capability.SNAPSHOTS in store.capabilities else None
        rep = await arecover(
            store, stream_id, self._projection, snapshots=snaps, max_replay=2**62, strict=True
        )
        return rep.state, rep.version

    async def _tail_session(
        self, stream_id: str, recent: int
    ) -> tuple[dict[str, Any], int, list[RecordedEvent]]:
        view = AsyncConversationStream(self.store, stream_id)
        for _ in range(TAIL_ATTEMPTS):
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
                head = await self.store.head(stream_id)
                if head is not None and head.version != version:
                    continue
            return fold, version, [e for e in tail if e.version > since]
        raise ChainIntegrityError(stream_id, [])  # pragma: no cover - a hundred writers


@dataclass(slots=True)
class _View:
    stream: AsyncConversationStream
    lock: Lock = field(default_factory=Lock)
    folded: Fold = field(default_factory=Fold)

    def fold(self) -> dict[str, Any]:
        """The fold of every event read so far."""
        return self.folded.update(self.stream.events)


def _scoped(
    app_name: str, user_id: str, deltas: dict[str, dict[str, Any]]
) -> list[tuple[str, list[NewEvent], Any]]:
    streams = {"app": app_stream(app_name), "user": user_stream(app_name, user_id)}
    return [
        (sid, [NewEvent(type=T_STATE, module=MODULE, payload={"delta": deltas[k]})], ANY)
        for k, sid in streams.items()
        if deltas[k]
    ]
