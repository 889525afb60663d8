"""Adapters that plug ares-events into other libraries.

What lives here: :mod:`~ares_events.integrations.eventsourcing`, the persistence module
of the ``eventsourcing`` library (its import path is what ``PERSISTENCE_MODULE`` names),
with its store side (opening, stream prefixes, verified reads) in
``_eventsourcing_store``.

:mod:`~ares_events.integrations.langgraph` is a LangGraph checkpointer (``AresSaver``,
``AsyncAresSaver``), with its shared logic in ``_langgraph_core`` (layout, encoding, the
verified index), ``_langgraph_plan`` (planning, decoding) and ``_langgraph_steps`` (the
operations, as sansio steps).
:func:`stream_kind` tells the CLI which streams an integration owns (without importing
the integration's library).

An integration is top layer: it may import anything in the package, and its own third
party library; nothing in the package imports an integration.
"""

from typing import Final

LANGGRAPH_STREAM_PREFIX: Final = "langgraph/"
"""Streams of LangGraph threads: ``langgraph/<thread_id>``."""


def thread_of(stream_id: str) -> str | None:
    """The LangGraph thread id of a stream, or None when it is not a LangGraph thread."""
    if stream_id.startswith(LANGGRAPH_STREAM_PREFIX) and len(stream_id) > len(
        LANGGRAPH_STREAM_PREFIX
    ):
        return stream_id[len(LANGGRAPH_STREAM_PREFIX) :]
    return None


def stream_kind(stream_id: str) -> tuple[str, str] | None:
    """``("langgraph thread", thread_id)`` for a stream an integration owns, else None."""
    tid = thread_of(stream_id)
    return None if tid is None else ("langgraph thread", tid)
