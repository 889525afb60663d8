"""Pydantic AI histories through the message store, as Pydantic AI's own message tests
round-trip them (tests/test_messages.py upstream: every part kind, binary content, tool
arguments as a dict or a string, usage, run and conversation ids, metadata): whatever a
history is, what ``load`` returns equals what ``ModelMessagesTypeAdapter`` itself returns
for it, after it went through the store's chain and its JSON. On SQLite and PostgreSQL,
property-based."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import (
    BinaryContent,
    FilePart,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

import ares_events as ae
from ares_events.integrations.pydantic_ai import AresMessageStore
from tests.fixtures.tier import examples
from tests.integrations.fw_helpers import fw_url

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

names = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
texts = st.text(max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
times = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
binaries = st.builds(
    BinaryContent,
    data=st.binary(max_size=64),
    media_type=st.sampled_from(["image/png", "audio/wav", "application/pdf"]),
)
request_parts: st.SearchStrategy[Any] = st.one_of(
    st.builds(SystemPromptPart, content=texts, timestamp=times),
    st.builds(
        UserPromptPart,
        content=texts | st.lists(texts | binaries, min_size=1, max_size=3),
        timestamp=times,
    ),
    st.builds(
        ToolReturnPart,
        tool_name=names,
        content=json_values,
        tool_call_id=names,
        metadata=st.none() | json_values,
        timestamp=times,
    ),
    st.builds(  # a retry that answers a tool call
        ToolReturnPart,
        tool_name=names,
        content=texts,
        tool_call_id=names,
        outcome=st.just("retried"),
        timestamp=times,
    ),
)
response_parts: st.SearchStrategy[Any] = st.one_of(
    st.builds(TextPart, content=texts),
    st.builds(
        ToolCallPart,
        tool_name=names,
        args=st.none() | texts | st.dictionaries(names, json_values, max_size=3),
        tool_call_id=names,
    ),
    st.builds(ThinkingPart, content=texts, signature=st.none() | texts),
    st.builds(FilePart, content=binaries),
)
messages: st.SearchStrategy[ModelMessage] = st.one_of(
    st.builds(
        ModelRequest,
        parts=st.lists(request_parts, min_size=1, max_size=3),
        instructions=st.none() | texts,
        run_id=st.none() | names,
    ),
    st.builds(
        ModelResponse,
        parts=st.lists(response_parts, min_size=1, max_size=3),
        usage=st.builds(
            RequestUsage,
            input_tokens=st.integers(0, 2**31),
            output_tokens=st.integers(0, 2**31),
            details=st.dictionaries(names, st.integers(0, 2**31), max_size=2),
        ),
        model_name=st.none() | texts,
        timestamp=times,
        provider_response_id=st.none() | names,
    ),
)


@pytest.fixture(params=BACKENDS)
def history(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AresMessageStore]:
    with ae.open_store(fw_url(str(request.param), tmp_path, request)) as store:
        yield AresMessageStore(store=store)


def reference(msgs: list[ModelMessage]) -> list[ModelMessage]:
    """Pydantic AI's own round trip of ``msgs``."""
    return ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(msgs))


def wide_int(value: Any) -> bool:
    """Whether ``value`` (JSON) holds an integer outside the signed 64-bit range (the
    store's JSON refuses one: InvalidEvent)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not -(2**63) <= value < 2**63
    if isinstance(value, list):
        return any(wide_int(v) for v in value)
    if isinstance(value, dict):
        return any(wide_int(v) for v in value.values())
    return False


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(turns=st.lists(st.lists(messages, min_size=1, max_size=3), min_size=1, max_size=3))
def test_a_history_loads_back_as_pydantic_ai_round_trips_it(
    history: AresMessageStore, turns: list[list[ModelMessage]]
) -> None:
    """Every turn appended loads back as Pydantic AI's own round trip of it; a turn
    holding an integer the store's JSON cannot hold exactly is refused whole
    (InvalidEvent), never stored as another number."""
    cid = f"h-{uuid.uuid4().hex}"
    stored: list[ModelMessage] = []
    for new in turns:
        if wide_int(json.loads(ModelMessagesTypeAdapter.dump_json(new))):
            with pytest.raises(ae.InvalidEvent):
                history.append(cid, new)
        else:
            history.append(cid, new)
            stored += new
    want: list[Any] = reference(stored)
    assert history.load(cid) == want
    assert AresMessageStore(store=history._faces.blocking().store).load(cid) == want  # a new reader


def test_an_integer_beyond_64_bits_is_refused_not_rounded(history: AresMessageStore) -> None:
    ok: list[ModelMessage] = [
        ModelRequest(parts=[ToolReturnPart("t", {"n": 2**63 - 1}, tool_call_id="c")])
    ]
    wide = [ModelRequest(parts=[ToolReturnPart("t", {"n": 2**70}, tool_call_id="c")])]
    history.append("wide", ok)
    with pytest.raises(ae.InvalidEvent, match="64-bit"):
        history.append("wide", wide)
    assert history.load("wide") == reference(ok)
