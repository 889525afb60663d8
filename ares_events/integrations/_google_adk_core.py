"""What both faces of the Google ADK session service share, without I/O: stream names,
event types, :class:`StaleSessionConflict`, the fold of a session and the decoding of
stored events (the layout is in docs/guide-google-adk.md).

It may import anything in the package (an integration is top layer), and ``google.adk``.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, Final
from urllib.parse import quote

from google.adk.errors._stale_session_error import StaleSessionError
from google.adk.events.event import Event
from google.adk.sessions.session import Session

from ares_events.core.events import RecordedEvent, validate_name
from ares_events.errors import SessionConflict

SESSION_PREFIX: Final = "google-adk/"
APP_PREFIX: Final = "google-adk-app/"
USER_PREFIX: Final = "google-adk-user/"
MODULE: Final = "google-adk"
T_CREATED: Final = "adk.session.created"
T_EVENT: Final = "adk.event"
T_DELETED: Final = "adk.session.deleted"
T_STATE: Final = "adk.state"
MARKER: Final = "ares-v"


class StaleSessionConflict(SessionConflict, StaleSessionError):
    """A :class:`~ares_events.errors.SessionConflict` that is also ADK's
    ``StaleSessionError`` (a ``ValueError``), so code written for ADK's own services
    catches it: reload the session (``get_session``) and run again."""

    def __init__(self, session_id: str, stream_id: str, expected: int, actual: int) -> None:
        text = (
            f"session {session_id!r} was modified in storage by another run since this "
            f"session object was read (version {expected}); the event was not stored: "
            "reload the session and run again"
        )
        super().__init__(session_id, stream_id, expected, actual, text)


def quote_part(part: str) -> str:
    """One part of a stream name, percent-encoded (``/`` too)."""
    return quote(part, safe="")


def session_stream(app_name: str, user_id: str, session_id: str) -> str:
    """The stream of a session.

    Raises:
        InvalidEvent: the name is too long or holds a control character.
    """
    q = quote_part
    return validate_name(f"{SESSION_PREFIX}{q(app_name)}/{q(user_id)}/{q(session_id)}", "session")


def app_stream(app_name: str) -> str:
    """The stream of an app's ``app:`` state."""
    return validate_name(APP_PREFIX + quote_part(app_name), "app_name")


def user_stream(app_name: str, user_id: str) -> str:
    """The stream of a user's ``user:`` state."""
    return validate_name(f"{USER_PREFIX}{quote_part(app_name)}/{quote_part(user_id)}", "user_id")


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
            state = {"live": True, "state": dict(p.get("state") or {}), "events": 0}
            return {**state, "updated": p.get("time", 0.0), "since": event.version}
        if event.type == T_EVENT and state["live"]:
            state["state"].update(p.get("delta") or {})
            state["events"] += 1
            state["updated"] = (p.get("event") or {}).get("timestamp", state["updated"])
        elif event.type == T_STATE:  # an app or user stream's delta
            state["state"].update(p.get("delta") or {})
        elif event.type == T_DELETED:
            return self.initial()
        return state


class Fold:
    """The fold of every event of a verified view read so far (a session's
    :class:`SessionStateProjection`, or the merged deltas of an app or user stream), and
    the live session's events by ADK event id; only the events read since the last call
    are applied."""

    __slots__ = ("_n", "by_id", "state")

    def __init__(self) -> None:
        self.state = SessionStateProjection().initial()
        self.by_id: dict[str, list[RecordedEvent]] = {}
        self._n = 0

    def update(self, events: list[RecordedEvent]) -> dict[str, Any]:
        """Fold ``events[n:]`` (``events``: the view's, of which ``n`` were folded)."""
        p = SessionStateProjection()
        if self._n > len(events):  # the view was read again from the start
            self.state, self.by_id, self._n = p.initial(), {}, 0
        for e in events[self._n :]:
            if e.payload_erased and e.type != T_DELETED:  # a deletion counts, erased or not
                continue
            self.state = p.apply(self.state, e)
            if e.type == T_EVENT:
                event_id = (e.payload.get("event") or {}).get("id")
                if event_id:
                    self.by_id.setdefault(event_id, []).append(e)
            elif e.type in (T_CREATED, T_DELETED):
                self.by_id = {}
        self._n = len(events)
        return self.state


def since_created(events: list[RecordedEvent]) -> list[RecordedEvent]:
    """The events of the live incarnation (after the last creation)."""
    for i in range(len(events) - 1, -1, -1):
        if events[i].type == T_CREATED:
            return events[i + 1 :]
    return []


def decode(e: RecordedEvent) -> Event:
    """The ADK event an ``adk.event`` holds."""
    return Event.model_validate(e.payload["event"])


def marker_version(session: Session) -> int | None:
    """The stream version a session object was read (or last written) at, from ADK's
    ``_storage_update_marker``; None for a session this service did not read."""
    marker = session._storage_update_marker
    if isinstance(marker, str) and marker.startswith(MARKER):
        with contextlib.suppress(ValueError):
            return int(marker[len(MARKER) :])
    return None
