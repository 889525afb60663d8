"""Adapters that plug ares-events into other libraries.

What lives here: :mod:`~ares_events.integrations.eventsourcing`, the persistence module
of the ``eventsourcing`` library (its import path is what ``PERSISTENCE_MODULE`` names),
with its store side (opening, stream prefixes, verified reads) in
``_eventsourcing_store``.

:mod:`~ares_events.integrations.langgraph` is a LangGraph checkpointer (``AresSaver``,
``AsyncAresSaver``), with its shared logic in ``_langgraph_core`` (layout, encoding, the
verified index), ``_langgraph_plan`` (planning, decoding) and ``_langgraph_steps`` (the
operations, as sansio steps); :mod:`~ares_events.integrations.langgraph_approvals` gates
a node on an approver's signed approval.
:mod:`~ares_events.integrations.openai_agents`, :mod:`~ares_events.integrations.pydantic_ai`
and :mod:`~ares_events.integrations.google_adk` adapt agent frameworks (a session or
conversation is one stream, read through ``_conversation``, verified; written with
optimistic concurrency); :mod:`~ares_events.integrations.openai_agents_journal`,
:mod:`~ares_events.integrations.pydantic_ai` and
:mod:`~ares_events.integrations.google_adk_journal` run their agents durably (the run
journal under the model and tool calls).
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


FRAMEWORK_STREAM_PREFIXES: Final = (
    ("openai-agents/", "openai-agents session"),
    ("pydantic-ai/", "pydantic-ai conversation"),
    ("google-adk/", "google-adk session"),
)
"""Streams of the framework adapters, with what the CLI calls them."""


def stream_kind(stream_id: str) -> tuple[str, str] | None:
    """``("langgraph thread", thread_id)`` (or an adapter's session or conversation) for a
    stream an integration owns, else None."""
    tid = thread_of(stream_id)
    if tid is not None:
        return ("langgraph thread", tid)
    for prefix, kind in FRAMEWORK_STREAM_PREFIXES:
        if stream_id.startswith(prefix) and len(stream_id) > len(prefix):
            return (kind, stream_id[len(prefix) :])
    return None
