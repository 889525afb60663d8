"""Shared pieces of the record tests: keys, a small journaled run, export and verify."""

from __future__ import annotations

from typing import Any

from ares_events.agents.journal import Journal
from ares_events.integrity.notes import SigningKey
from ares_events.records import export_record, verify_record
from ares_events.records.verify import RecordReport

LOG = SigningKey.generate("example.com/log")
OTHER = SigningKey.generate("example.com/log")  # same name, another key


def small_run(store: Any, run_id: str = "run-1", *, steps: int = 2) -> None:
    """A journaled run: a model call, `steps` tool calls, completed."""
    j = Journal(store, run_id)
    j.model_call(
        [{"role": "user", "content": "ship it"}],
        {"model": "gpt-x"},
        call=lambda m, p: ("on it", {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}),
    )
    for i in range(steps):
        j.tool_call(
            "ship",
            {"item": f"item-{i}", "card": "4242-4242", "price": 1.5 + i},
            call=lambda a, k: {"shipped": a["item"]},
        )
    j.complete({"done": True})


def export_verify(store: Any, stream: str, form: str = "json", **kw: Any) -> RecordReport:
    """Export ``stream`` signed by the log key and verify it with the log key."""
    ex = export_record(store, stream, key=LOG, form=form, **kw)
    return verify_record(ex.data, [LOG.verifier.text])
