"""A journaled run in a child process with the OpenTelemetry SDK, killed by SIGKILL
inside its tool call (after a model call that was answered and recorded).

Finished spans are written at once (a simple span processor) as JSON lines to
``--spans``, so what the process exported before it died survives it.

    python tests/telemetry/journal_otel_child.py --spans FILE --run-id RUN

The store URL comes from ``ARES_STORE_URL``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from ares_events.agents.journal import Journal, ModelReply
from ares_events.core import telemetry
from ares_events.stores import open_store


class FileExporter(SpanExporter):
    """One JSON line per finished span, flushed before the next statement runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as f:
            for s in spans:
                ctx = s.context
                f.write(
                    json.dumps(
                        {
                            "name": s.name,
                            "trace_id": f"{ctx.trace_id:032x}",
                            "span_id": f"{ctx.span_id:016x}",
                            "parent": f"{s.parent.span_id:016x}" if s.parent else None,
                        }
                    )
                    + "\n"
                )
            f.flush()
            os.fsync(f.fileno())
        return SpanExportResult.SUCCESS


def loop(journal: Journal, die: bool) -> Any:
    """The run: one model call, one tool call (SIGKILL inside it when ``die``)."""

    def model(messages: Any, params: Any) -> ModelReply:
        return ModelReply("call the tool", {"input_tokens": 3, "output_tokens": 2})

    def tool(args: Any, key: str) -> dict[str, Any]:
        if die:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"ticket": 1}

    with journal:
        journal.model_call([{"role": "user", "content": "go"}], {"model": "m-1"}, call=model)
        result = journal.tool_call("create_ticket", {"title": "t"}, call=tool, idempotent=True)
        journal.complete(result)
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spans", required=True)
    p.add_argument("--run-id", required=True)
    args = p.parse_args()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(FileExporter(args.spans)))
    telemetry.configure(tracer_provider=tp)
    store = open_store(os.environ["ARES_STORE_URL"])
    loop(Journal(store, args.run_id), die=True)


if __name__ == "__main__":
    main()
