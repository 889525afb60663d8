"""Adapters that plug ares-events into other libraries (eventsourcing, LangGraph, the OpenAI
Agents SDK, Pydantic AI, Google ADK): a module named after a library is public, a ``_``
module is its storage work. :func:`stream_kind` names an integration's streams for the CLI.

An integration is top layer: it may import anything in the package, and its own third
party library; nothing in the package imports an integration.
"""

from typing import Final

LANGGRAPH_STREAM_PREFIX: Final = "langgraph/"
"""Streams of LangGraph threads: ``langgraph/<thread_id>``."""

FRAMEWORK_STREAM_PREFIXES: Final = (
    ("openai-agents/", "openai-agents session"),
    ("pydantic-ai/", "pydantic-ai conversation"),
    ("google-adk/", "google-adk session"),
)
"""Streams of the framework adapters, with what the CLI calls them."""
STREAM_KINDS: Final = ((LANGGRAPH_STREAM_PREFIX, "langgraph thread"), *FRAMEWORK_STREAM_PREFIXES)


def stream_kind(stream_id: str) -> tuple[str, str] | None:
    """``(kind, id)`` (e.g. ``("langgraph thread", thread_id)``) for a stream an
    integration owns, else None."""
    for prefix, kind in STREAM_KINDS:
        if stream_id.startswith(prefix) and len(stream_id) > len(prefix):
            return (kind, stream_id[len(prefix) :])
    return None


def thread_of(stream_id: str) -> str | None:
    """The LangGraph thread id of a stream, or None when it is not a LangGraph thread."""
    got = stream_kind(stream_id)
    return got[1] if got is not None and got[0] == "langgraph thread" else None
