"""`ares-events demo`: the kill -9 story end to end (real processes, real SIGKILL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.cli import main
from tests.fixtures.run_numbers import assert_same, from_log, views

AGENT_KEYS = {
    "agent",
    "finished",
    "counts",
    "model_calls_made",
    "model_calls_answered_from_log",
    "tokens_saved",
    "reissued_model_calls",
    "tool_side_effects",
    "duplicate_side_effects",
    "recovery_ms",
    "chain_ok",
    "events",
    "rate_limits_absorbed",
    "lost_answers_absorbed",
}


@pytest.mark.slow
def test_demo_survives_kill_9_without_duplicates_or_reissued_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three agents, two group SIGKILLs, a rate-limited model and a ticketing service that
    loses answers: every agent finishes, no duplicate side effect, no re-issued model
    call, calls answered from the log, rate limits and lost answers absorbed (counted from
    the services' own tables), and the JSON has one entry per agent with the documented
    keys; each agent's run numbers are the ones every other view of its run shows."""
    url = f"sqlite:///{tmp_path}/d.db"
    argv = ["--store", url, "demo", "--agents", "3", "--kills", "2", "--rounds", "6"]
    code = main([*argv, "--seed", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["all_finished"] is True
    assert out["kills"] == 2
    assert out["duplicate_side_effects"] == 0
    assert out["reissued_model_calls"] == 0
    assert out["model_calls_saved"] > 0 and out["tokens_saved"] > 0
    assert out["all_chains_ok"] is True
    assert out["rate_limits_absorbed"] > 0 and out["lost_answers_absorbed"] > 0
    assert len(out["agents"]) == 3
    for agent in out["agents"]:
        assert set(agent) >= AGENT_KEYS
        assert agent["finished"] and agent["chain_ok"]
        # Six rounds: six model calls, six tickets, six patches.
        assert agent["counts"]["steps"] == 18 and agent["tool_side_effects"] == 6
        assert agent["duplicate_side_effects"] == agent["reissued_model_calls"] == 0
    assert (
        sum(a["model_calls_answered_from_log"] for a in out["agents"]) == (out["model_calls_saved"])
    )
    assert sum(a["rate_limits_absorbed"] for a in out["agents"]) == out["rate_limits_absorbed"]
    assert sum(a["lost_answers_absorbed"] for a in out["agents"]) == out["lost_answers_absorbed"]
    with ae.open_store(url) as store:
        failed = [
            e.payload["error_type"]
            for sid, _ in store.streams()
            if sid.startswith("run-")
            for e in store.read(sid)
            if e.type in ("model.call.failed", "tool.call.failed")
        ]
    assert {"RateLimited", "GatewayTimeout"} <= set(failed)
    with ae.open_store(url) as store:
        assert ae.integrity.audit(store).ok
        logged = {a["agent"]: from_log(store, f"run-{a['agent']}") for a in out["agents"]}
    assert sum(a["counts"]["recoveries"] for a in out["agents"]) == out["recoveries"] > 0
    assert sum(a["counts"]["retries"] for a in out["agents"]) > 0
    for agent in out["agents"]:
        assert agent["counts"] == logged[agent["agent"]]
        seen = views(url, f"run-{agent['agent']}", capsys)
        seen["demo --json"] = agent["counts"]
        assert_same(seen, logged[agent["agent"]])


@pytest.mark.slow
def test_demo_steps_is_the_old_name_of_rounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--steps (hidden from --help) still works and means --rounds: two rounds are six
    steps of the run (it never counted steps)."""
    url = f"sqlite:///{tmp_path}/d.db"
    argv = ["--store", url, "demo", "--agents", "1", "--kills", "0", "--steps", "2", "--json"]
    assert main(argv) == 0
    (agent,) = json.loads(capsys.readouterr().out)["agents"]
    assert agent["counts"]["steps"] == 6 and agent["counts"]["recoveries"] == 0
    assert main(["demo", "--help"]) == 0
    assert "--steps" not in capsys.readouterr().out


def test_the_demo_counts_a_repeated_call_its_service_made_harmless(tmp_path: Path) -> None:
    """The demo's ticket service dedupes by idempotency key, so counting only new tickets
    would hide a journal that calls a tool twice: every call that reached it counts, and a
    second call with the same key is a duplicate side effect in the demo's report."""
    from ares_events.agents.resurrection import SERVICES_SCHEMA, FakeTicketing, _db

    path = str(tmp_path / "services.db")
    with _db(path) as c:
        for ddl in SERVICES_SCHEMA:
            c.execute(ddl)
    tickets = FakeTicketing(path, "agent-1", 0.0)
    for _ in range(2):
        try:
            tickets.create({"title": "t"}, "key-1")
        except Exception as exc:  # the first answer may be lost on purpose
            assert type(exc).__name__ == "GatewayTimeout"
    with _db(path) as c:
        rows = c.execute("SELECT title, count(*) FROM side_effects GROUP BY title").fetchall()
        assert rows == [("t", 2)]
        assert c.execute("SELECT count(*) FROM tickets").fetchone() == (1,)
