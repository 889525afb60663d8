"""A writer of the LangGraph fork race (tests/integrations/test_langgraph_races.py): run
in a child process, it continues the thread's newest checkpoint once per round, in step
with a rival process, and reports what happened each round."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.base.id import uuid6

from ares_events.integrations.langgraph import AresSaver, StaleWriteError


def checkpoint() -> Checkpoint:
    """A minimal checkpoint with a fresh id."""
    return Checkpoint(
        v=1,
        id=str(uuid6(clock_seq=-1)),
        ts=datetime.now(UTC).isoformat(),
        channel_values={},
        channel_versions={},
        versions_seen={},
        updated_channels=None,
    )


def writer(url: str, thread_id: str, rounds: int, name: str, barrier: Any, out: Any) -> None:
    """Each round: read the tip, wait for the rival, put a child of the tip."""
    results: list[tuple[str, str, str]] = []
    problems: list[str] = []
    with AresSaver.from_url(url) as saver:
        for i in range(rounds):
            barrier.wait()
            tup = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
            if tup is None:
                problems.append(f"round {i}: no tip")
                break
            parent = tup.checkpoint["id"]
            cp = checkpoint()
            config: Any = {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": "",
                    "checkpoint_id": parent,
                }
            }
            barrier.wait()
            try:
                md: Any = {"source": "loop", "step": i, "writer": name}
                saver.put(config, cp, md, {})
                results.append(("win", parent, cp["id"]))
            except StaleWriteError as exc:
                if exc.is_stale_write_owner_error is not True:
                    problems.append(f"round {i}: error without the ownership marker")
                results.append(("lose", parent, exc.winner_checkpoint_id))
            except Exception as exc:  # reported, so the test shows it
                problems.append(f"round {i}: {type(exc).__name__}: {exc}")
                results.append(("error", parent, ""))
            barrier.wait()
    out.put((name, results, problems))
