"""A retry after a failed attempt whose outcome is unknown asks the reconciler first
(issue 22): the tool is called again only when the reconciler says the call did not land.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ares_events as ae
from ares_events.agents.journal import AsyncJournal, Journal


class GatewayTimeout(Exception):
    """The gateway timed out after the downstream system acted."""


class Payments:
    """A downstream system that does NOT dedupe on the key (the reconciler exists for it):
    every invocation charges; the answer of the first charge is lost."""

    def __init__(self, lose_first: bool = True, fail_before: bool = False) -> None:
        self.lose_first = lose_first
        self.fail_before = fail_before
        self.charges: list[str] = []
        self.invocations = 0
        self.asked: list[str] = []

    def charge(self, args: Any, key: str) -> dict[str, Any]:
        self.invocations += 1
        if self.fail_before and self.invocations == 1:
            raise GatewayTimeout("504 before the charge was made")
        self.charges.append(key)
        if self.lose_first and self.invocations == 1:
            raise GatewayTimeout("504 after the charge was made")
        return {"charge": len(self.charges), "key": key}

    def lookup(self, key: str) -> tuple[bool, Any]:
        self.asked.append(key)
        if key in self.charges:
            return True, {"charge": self.charges.index(key) + 1, "key": key}
        return False, None


def _retrying(call: Any) -> Any:
    for _ in range(5):
        try:
            return call()
        except GatewayTimeout:
            continue
    raise AssertionError("never succeeded")


def test_a_retry_after_a_lost_answer_asks_the_reconciler_and_does_not_charge_twice(
    store: ae.EventStore,
) -> None:
    pay = Payments()
    j = Journal(store, "r-pay")
    got = _retrying(
        lambda: j.tool_call("charge", {"cents": 500}, call=pay.charge, reconcile=pay.lookup)
    )
    assert got == {"charge": 1, "key": "r-pay:1"}
    assert pay.charges == ["r-pay:1"], "the tool was called again after its charge landed"
    assert pay.invocations == 1 and pay.asked == ["r-pay:1"]
    assert j.stats.tool_calls_reconciled == 1 and j.stats.tool_calls_made == 0
    events = [(e.type, dict(e.payload)) for e in store.read("r-pay")]
    kinds = [t for t, _ in events]
    assert kinds[-4:] == [
        "tool.call.requested",
        "tool.call.failed",
        "tool.call.requested",
        "tool.returned",
    ]
    assert events[-1][1]["reconciled"] is True
    assert [p["attempt"] for t, p in events if t == "tool.call.requested"] == [1, 2]
    # Replayed: the reconciled result, neither the tool nor the reconciler asked again.
    j2 = Journal(store, "r-pay")
    assert j2.tool_call("charge", {"cents": 500}, call=pay.charge, reconcile=pay.lookup) == got
    assert pay.invocations == 1 and pay.asked == ["r-pay:1"]
    info = Journal.inspect(store, "r-pay")
    step = info.steps[-1]
    assert [a.status for a in step.attempts] == ["failed", "returned"]


def test_a_retry_the_reconciler_says_did_not_land_calls_the_tool(store: ae.EventStore) -> None:
    pay = Payments(lose_first=False, fail_before=True)
    j = Journal(store, "r-pay2")
    got = _retrying(
        lambda: j.tool_call("charge", {"cents": 500}, call=pay.charge, reconcile=pay.lookup)
    )
    assert got == {"charge": 1, "key": "r-pay2:1"}
    assert pay.charges == ["r-pay2:1"] and pay.invocations == 2 and pay.asked == ["r-pay2:1"]
    assert j.stats.tool_calls_made == 1 and j.stats.tool_calls_reconciled == 0


def test_a_retry_after_a_restart_asks_the_reconciler_too(store: ae.EventStore) -> None:
    """The failed attempt is in the log and the process restarted: same rule."""
    pay = Payments()
    j = Journal(store, "r-pay3")
    try:
        j.tool_call("charge", {"cents": 1}, call=pay.charge, reconcile=pay.lookup)
    except GatewayTimeout:
        pass
    j2 = Journal(store, "r-pay3")
    got = j2.tool_call("charge", {"cents": 1}, call=pay.charge, reconcile=pay.lookup)
    assert got["key"] == "r-pay3:1" and pay.charges == ["r-pay3:1"] and pay.invocations == 1


def test_the_async_journal_asks_a_coroutine_reconciler(store: ae.EventStore) -> None:
    pay = Payments()

    async def lookup(key: str) -> tuple[bool, Any]:
        return pay.lookup(key)

    async def run() -> Any:
        j = await AsyncJournal.open(store, "r-apay")
        for _ in range(3):
            try:
                return await j.tool_call("charge", {"c": 2}, call=pay.charge, reconcile=lookup)
            except GatewayTimeout:
                continue
        raise AssertionError("never succeeded")

    got = asyncio.run(run())
    assert got["key"] == "r-apay:1" and pay.charges == ["r-apay:1"] and pay.invocations == 1
