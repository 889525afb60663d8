"""Adapters that plug ares-events into other libraries: the ``eventsourcing`` persistence
module, a LangGraph checkpointer (with signed approvals of interrupts), and sessions,
message stores and durable runs for the OpenAI Agents SDK, Pydantic AI and Google ADK.
A module named after a library is public; a ``_`` module is its storage work.
:func:`stream_kind` tells the CLI which streams an integration owns, without importing
the integration's library.

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
