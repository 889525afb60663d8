"""The draft's view of a stream: events as ``session.entries`` of
draft-birkholz-verifiable-agent-conversations-00 (mapping rules: docs/records.md).
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["agent_meta", "entries_of"]

Entry = dict[str, Any]
_ADAPTERS: Final = ("openai-agents", "pydantic-ai", "google-adk", "langgraph")
"""Adapters whose streams are named ``<adapter>/...``."""
_USAGE: Final = {
    "input_tokens": "input",
    "prompt_tokens": "input",
    "output_tokens": "output",
    "completion_tokens": "output",
    "total_tokens": "total",
    "cached_tokens": "cached",
    "reasoning_tokens": "reasoning",
}


def token_usage(usage: Any) -> dict[str, Any] | None:
    """The draft's ``token-usage`` from a usage mapping (unknown keys kept as they are)."""
    if not isinstance(usage, dict) or not usage:
        return None
    out: dict[str, Any] = {}
    for k, v in usage.items():
        name = _USAGE.get(k, str(k))
        if name in _USAGE.values() and not (type(v) is int and v >= 0):
            continue  # the draft's counters are uints
        out.setdefault(name, v)
    return out or None


def _event(kind: str, data: Any) -> Entry:
    return {
        "type": "system-event",
        "event-type": kind,
        "data": data if isinstance(data, dict) else {"value": data},
    }


def _call(name: Any, args: Any, call_id: Any) -> Entry:
    return {"type": "tool-call", "name": str(name), "input": args, "call-id": str(call_id)}


def _result(output: Any, call_id: Any, **more: Any) -> Entry:
    entry = {"type": "tool-result", "output": output, "call-id": str(call_id)}
    return entry | {k.replace("_", "-"): v for k, v in more.items()}  # is_error: is-error


def _args(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def _journal(type_: str, p: Any) -> list[Entry] | None:
    if not isinstance(p, dict):
        return None
    if type_ == "model.call.requested":
        content = p["messages"] if "messages" in p else {"messages-hash": p.get("messages_hash")}
        return [{"type": "user", "content": content, "ares-step": p.get("step")}]
    if type_ == "model.responded":
        e: Entry = {"type": "assistant", "content": p.get("completion"), "ares-step": p.get("step")}
        usage = token_usage(p.get("usage"))
        if usage is not None:
            e["token-usage"] = usage
        return [e]
    if type_ == "tool.call.requested":
        call = _call(p.get("name"), p.get("args"), p.get("idempotency_key"))
        return [call | {"ares-step": p.get("step")}]
    if type_ in ("tool.returned", "tool.call.failed"):
        failed = type_ == "tool.call.failed" or p.get("error") is not None
        out = p.get("error") if failed else p.get("result")
        if type_ == "tool.call.failed":
            out = {"error_type": p.get("error_type"), "error": out}
        status = "error" if failed else "success"
        return [_result(out, p.get("idempotency_key"), status=status, is_error=failed)]
    return None


def _openai_item(it: Any) -> Entry:
    if not isinstance(it, dict):
        return _event("item", it)
    kind, role = it.get("type"), it.get("role")
    if kind == "function_call":
        return _call(it.get("name"), _args(it.get("arguments")), it.get("call_id"))
    if kind == "function_call_output":
        return _result(it.get("output"), it.get("call_id"))
    if kind == "reasoning":
        return {"type": "reasoning", "content": it.get("summary") or it.get("content") or ""}
    if role == "assistant":
        return {"type": "assistant", "content": it.get("content")}
    if role in ("user", "system", "developer"):
        return {"type": "user", "content": it.get("content"), "role": role}
    return _event(str(kind or "item"), it)


def _openai(type_: str, p: Any) -> list[Entry] | None:
    if type_ == "oai.items" and isinstance(p, dict) and isinstance(p.get("items"), list):
        return [_openai_item(it) for it in p["items"]]
    return None


def _pydantic_part(kind: str, part: Any, model: Any) -> Entry:
    if not isinstance(part, dict):
        return _event("part", part)
    pk = part.get("part_kind")
    if pk in ("user-prompt", "system-prompt"):
        return {"type": "user", "content": part.get("content"), "role": pk}
    if pk == "tool-return":
        return _result(part.get("content"), part.get("tool_call_id"), name=part.get("tool_name"))
    if pk == "retry-prompt":
        return _result(part.get("content"), part.get("tool_call_id"), status="error", is_error=True)
    if pk == "tool-call":
        return _call(part.get("tool_name"), _args(part.get("args")), part.get("tool_call_id"))
    if pk == "thinking":
        return {"type": "reasoning", "content": part.get("content")}
    if pk == "text":
        e: Entry = {"type": "assistant", "content": part.get("content")}
        if isinstance(model, str):
            e["model-id"] = model
        return e
    return _event(str(pk or kind), part)


def _pydantic(type_: str, p: Any) -> list[Entry] | None:
    messages = p.get("messages") if isinstance(p, dict) else None
    if type_ != "pai.messages" or not isinstance(messages, list):
        return None
    out: list[Entry] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        parts = [
            _pydantic_part(str(m.get("kind")), part, m.get("model_name"))
            for part in m.get("parts") or []
        ]
        usage = token_usage(m.get("usage"))
        if usage is not None and parts and parts[-1]["type"] == "assistant":
            parts[-1]["token-usage"] = usage
        out.extend(parts)
    return out


def _adk(type_: str, p: Any) -> list[Entry] | None:
    if type_ != "adk.event" or not isinstance(p, dict) or not isinstance(p.get("event"), dict):
        return None
    ev = p["event"]
    content = ev.get("content") if isinstance(ev.get("content"), dict) else {}
    role = "user" if content.get("role") == "user" else "assistant"
    out: list[Entry] = []
    for part in content.get("parts") or []:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("function_call"), dict):
            fc = part["function_call"]
            out.append(_call(fc.get("name"), fc.get("args"), fc.get("id")))
        elif isinstance(part.get("function_response"), dict):
            fr = part["function_response"]
            out.append(_result(fr.get("response"), fr.get("id"), name=fr.get("name")))
        elif part.get("thought"):
            out.append({"type": "reasoning", "content": part.get("text")})
        elif "text" in part:
            out.append({"type": role, "content": part.get("text")})
    if not out:
        out.append(_event(type_, {"author": ev.get("author"), "id": ev.get("id")}))
    for e in out:
        e.setdefault("author", ev.get("author"))
    return out


_MAPPERS: Final = (_journal, _openai, _pydantic, _adk)


def entries_of(version: int, type_: str, at: str, payload: Any, *, erased: bool) -> list[Entry]:
    """The draft entries of one event (``payload`` as exported: maybe redacted)."""
    if erased:
        found = [_event("payload-erased", {"type": type_})]
    else:
        mapped = (m(type_, payload) for m in _MAPPERS)
        found = next((f for f in mapped if f is not None), []) or [_event(type_, payload)]
    many = len(found) > 1
    for k, e in enumerate(found, 1):
        e.setdefault("timestamp", at)
        e["id"] = f"{version}.{k}" if many else str(version)
        e["ares-version"] = version
        e["ares-type"] = type_
    return found


def agent_meta(
    stream: str, first_type: str | None, entries: list[Entry], models: list[str]
) -> dict[str, Any]:
    """The draft's ``agent-meta``: models seen in the entries, the adapter by stream."""
    named = [e["model-id"] for e in entries if isinstance(e.get("model-id"), str)]
    seen = list(dict.fromkeys([*models, *named]))
    adapter, slash, _ = stream.partition("/")
    cli = "ares-events journal" if first_type == "run.started" else "ares-events"
    if slash and adapter in _ADAPTERS:
        cli = adapter
    meta: dict[str, Any] = {
        "model-id": seen[0] if seen else "unknown",
        "model-provider": "unknown",
        "cli-name": cli,
    }
    if len(seen) > 1:
        meta["models"] = seen
    return meta
