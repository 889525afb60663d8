"""One incarnation of a journaled run that has every number of a run in it, for
``tests/agents/test_run_numbers.py``.

The loop: a model call the fake LLM rate-limits once (a retry), a ticket whose first
answer is lost after the side effect (a retry, reconciled), a state patch, an
``awaiting_approval`` interrupt (an operator resumes it), a second model call rate-limited
once, complete. ``--die-after N`` SIGKILLs this process right after its Nth append, so
the next incarnation recovers the run from its log (snapshot + tail: snapshots every 2
events). The store URL comes from ``ARES_STORE_URL``; on a normal exit one JSON line:
the outcome and the live journal's ``counts``.

    python -m tests.children.run_numbers_child --services S.db --run-id RUN [--die-after N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ares_events.agents.journal import Journal
from ares_events.stores import open_store
from tests.children.journal_child import (
    FakeLLM,
    FakeTicketing,
    GatewayTimeout,
    KillAfterAppends,
    RateLimited,
    first_messages,
    retrying,
    second_messages,
    ticket_title,
)


def main(argv: list[str] | None = None) -> int:
    """Drive the run once (until it pauses, completes or this process is killed)."""
    p = argparse.ArgumentParser()
    p.add_argument("--services", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--die-after", type=int, default=0)
    args = p.parse_args(argv)
    store = open_store(os.environ["ARES_STORE_URL"])
    target: Any = KillAfterAppends(store, args.die_after) if args.die_after else store
    journal = Journal(target, args.run_id, code_revision="r1", prompt_hash="p1", snapshot_every=2)
    llm = FakeLLM(args.services, args.run_id, rate_limits=1)
    tickets = FakeTicketing(args.services, args.run_id, lose_first=True)

    def ask(messages: Any) -> Any:
        return retrying(journal, lambda: journal.model_call(messages, call=llm), RateLimited)

    c1 = ask(first_messages())
    ticket = retrying(
        journal,
        lambda: journal.tool_call(
            "create_ticket",
            {"title": ticket_title(c1)},
            call=tickets.create,
            reconcile=tickets.lookup,
        ),
        GatewayTimeout,
    )
    journal.patch("ticket", ticket["ticket"])
    outcome = "paused"
    if not journal.interrupt("awaiting_approval"):
        c2 = ask(second_messages(c1, ticket))
        journal.complete({"answer": c2["text"]})
        outcome = "completed"
    print(json.dumps({"outcome": outcome, "counts": journal.counts.to_dict()}))
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
