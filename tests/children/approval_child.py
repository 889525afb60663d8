"""Child process of tests/records/test_approvals.py: run a loop whose tool needs a
signed approval, SIGKILLing itself at a chosen point.

Usage: python -m tests.children.approval_child URL RUN VKEY EFFECTS KILL_AT

KILL_AT: ``checked`` (the approval verified, nothing of the call written yet),
``requested`` (the call's write-ahead request committed, the tool not entered),
``effect`` (the tool did its side effect, its result not recorded), or ``none``.
The tool's side effect is a line appended to EFFECTS; the reconciler reads that file.
Exit 0 when the run completed, 3 when it stopped paused or in doubt.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import ares_events as ae
from ares_events.agents import approvals
from ares_events.agents import journal as journal_module
from ares_events.agents.journal import Journal
from ares_events.integrity.notes import VerifierKey


def main() -> int:
    url, run, vkey, effects, kill_at = sys.argv[1:6]
    out = Path(effects)

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if kill_at == "checked":
        original = approvals.check_approval

        def checked(*args: Any, **kwargs: Any) -> Any:
            approval = original(*args, **kwargs)
            die()
            return approval

        # The journal calls the name it imported: replace it there.
        setattr(journal_module, "check_approval", checked)  # noqa: B010

    def pay(args: Any, key: str) -> str:
        if kill_at == "requested":
            die()
        with out.open("a") as f:
            f.write(key + "\n")
            f.flush()
            os.fsync(f.fileno())
        if kill_at == "effect":
            die()
        return "paid"

    def landed(key: str) -> tuple[bool, Any]:
        done = out.exists() and key in out.read_text().split()
        return done, "paid" if done else None

    with ae.open_store(url) as store:
        j = Journal(store, run, approvers=[VerifierKey.parse(vkey)])
        try:
            j.tool_call("pay", {"amount": 5}, call=pay, reconcile=landed, needs_approval=True)
        except ae.RunNotRunnable:
            return 3
        j.complete()
    return 0


if __name__ == "__main__":
    sys.exit(main())
