"""The CLI names the framework adapters' streams (``ares-events streams``)."""

from __future__ import annotations

from ares_events.integrations import stream_kind


def test_the_adapters_streams_have_kinds() -> None:
    assert stream_kind("openai-agents/user-42") == ("openai-agents session", "user-42")
    assert stream_kind("pydantic-ai/chat-1") == ("pydantic-ai conversation", "chat-1")
    assert stream_kind("google-adk/app/u/s") == ("google-adk session", "app/u/s")
    assert stream_kind("langgraph/t1") == ("langgraph thread", "t1")
    assert stream_kind("openai-agents/") is None
    assert stream_kind("google-adk-app/app") is None
    assert stream_kind("agent-7") is None
