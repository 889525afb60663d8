"""CLI command ``demo``: the kill -9 story, or ``--simple`` (registered on import)."""

from __future__ import annotations

import os
from typing import Any

import click
from rich import box
from rich.table import Table

from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    PROG,
    App,
    _print_findings,
    _status,
    add_columns,
    cli,
    json_app,
    text,
)
from ares_events.stores.settings import Settings


@cli.command()
@click.option(
    "--agents",
    type=click.IntRange(1, 1000),
    help="Agents to run (default 10; 5 with --simple).",
)
@click.option(
    "--kills",
    type=click.IntRange(0, 100),
    default=3,
    show_default=True,
    help="Times to SIGKILL the whole process group (supervisor and every agent).",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 10_000),
    default=12,
    show_default=True,
    help="Research rounds per agent; a round is three steps of the run (a model call, a "
    "ticket, a state patch).",
)
@click.option(
    "--steps",
    "old_steps",
    type=click.IntRange(1, 10_000),
    hidden=True,
    help="Old name of --rounds (it never counted steps).",
)
@click.option("--seed", type=int, default=None, help="Seed for reproducible kill points/content.")
@click.option(
    "--simple",
    is_flag=True,
    help="Instead: a quick single-process simulation that appends and verifies streams.",
)
@click.option(
    "--events",
    type=click.IntRange(8, 1_000_000),
    default=300,
    show_default=True,
    help="With --simple: events per agent.",
)
@json_app
def demo(
    app: App,
    agents: int | None,
    kills: int,
    rounds: int,
    old_steps: int | None,
    seed: int | None,
    simple: bool,
    events: int,
    as_json: bool,
) -> int:
    """The kill -9 story: agents die, the supervisor resurrects them, nothing is lost.

    N agents (default 10) run a deterministic research task through a write-ahead
    journal against a fake LLM (counts calls and tokens; answers a third of the prompts
    with rate limits first) and a fake ticketing service (records side effects in its
    own SQLite table, honours idempotency keys, loses a third of its first answers after
    the side effect); the agents retry both through the journal. The demo
    SIGKILLs the whole process group at seeded random points, restarts the supervisor,
    which resurrects every agent from snapshot + tail, and all finish. It then reports
    per agent: its run's steps and recoveries (as `runs show` counts them), model calls
    made vs answered from the log (tokens saved), tool side effects and duplicates (0),
    rate limits and lost answers absorbed, recovery time and chain verification.

    With --simple it instead appends a few hundred lifecycle events per agent in one
    process and verifies every chain.

    \b
    Example:
      ares-events demo
      ares-events demo --kills 3 --seed 7 --json
      ares-events demo --simple --agents 3 --events 100
    """
    if not simple:
        return _resurrection_demo(app, agents or 10, kills, old_steps or rounds, seed, as_json)
    agents = agents or 5
    from ares_events.agents.demo import run_demo

    with app.open(create=True) as store, app.progress("appending", agents * events) as progress:
        result = run_demo(store, agents=agents, events=events, seed=seed, progress=progress)
    if as_json:
        return app.json(dict(result.to_dict(), store=app.url), result.all_ok)
    title = text(f"demo run {result.run_id}: {agents} agents x {events} events")
    table = Table(title=title, title_justify="left")
    add_columns(
        table, "stream", "version", "events", "verified", right=("version", "events"), no_wrap=True
    )
    for s in result.streams:
        table.add_row(text(s.stream_id), str(s.version), str(s.events), _status(s.ok))
    app.table(table)
    app.say(
        f"{result.events} events appended in {result.append_seconds:.2f}s "
        f"({result.append_rate:,.0f} events/s, one transaction per step); "
        f"verified in {result.verify_seconds:.2f}s ({result.verify_rate:,.0f} events/s)"
    )
    if result.all_ok:
        app.say("all chains verified", style="bold green")
        first = result.streams[0].stream_id
        app.say(f"next: {PROG} streams | {PROG} tail {first} -n 5 | {PROG} audit", style="dim")
        return EXIT_OK
    for s in result.streams:
        if s.findings:
            _print_findings(app, s.findings)
    return EXIT_FINDINGS


def _resurrection_demo(
    app: App, agents: int, kills: int, rounds: int, seed: int | None, as_json: bool
) -> int:
    from ares_events.agents.resurrection import run_demo as run_kill_demo

    with app.open(create=True):
        raw_url = app.raw_store_url()
    every = Settings.from_env().snapshot_every if os.environ.get("ARES_SNAPSHOT_EVERY") else 20
    report = run_kill_demo(
        raw_url,
        blobs_url=app.blobs_opt,
        agents=agents,
        rounds=rounds,
        snapshot_every=every,
        kills=kills,
        seed=7 if seed is None else seed,
        progress=None if as_json else app.note,
    )
    data = dict(report.to_dict(), store=app.url)
    ok = report.all_finished and data["all_chains_ok"]
    ok = ok and data["duplicate_side_effects"] == data["reissued_model_calls"] == 0
    if as_json:
        return app.json(data, ok)
    table = Table(
        title=text(f"kill -9 demo {report.run}: {agents} agents, {report.kills} kills"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
        caption=(
            "steps, recoveries: of the agent's run, as `ares-events runs show` counts them\n"
            "(a recovery: a new incarnation picked the run up from its log); calls: model\n"
            "calls made; logged: answered from the log (saved: tokens not re-paid);\n"
            "effects: tickets created; dupes: duplicate side effects; 429s: rate limits\n"
            "absorbed (retried); lost: tool answers lost after the side effect (retried\n"
            "with the same key); ms: median recovery time"
        ),
        caption_justify="left",
    )
    columns = "agent fin steps recoveries calls logged saved effects dupes 429s lost ms chain"
    for col in columns.split():
        justify: Any = "left" if col in ("agent", "fin", "chain") else "right"
        table.add_column(col, justify=justify, no_wrap=True, min_width=len(col))
    for a in report.agents:
        counts = [a.counts.steps, a.counts.recoveries, a.model_calls_made]
        counts += [a.model_calls_answered_from_log, a.tokens_saved, a.tool_side_effects]
        counts += [a.duplicate_side_effects, a.rate_limits_absorbed, a.lost_answers_absorbed]
        agent = text(a.agent.removeprefix(report.run + "-").removeprefix("agent-"))
        ms = "-" if a.recovery_ms is None else f"{a.recovery_ms:.0f}"
        table.add_row(agent, _status(a.finished), *map(str, counts), ms, _status(a.chain_ok))
    app.table(table, optional=("ms", "lost", "429s"))
    app.say(
        f"all finished: {report.all_finished}; kills: {report.kills}; "
        f"recoveries: {data['recoveries']}; "
        f"duplicate side effects: {data['duplicate_side_effects']}; re-issued model calls "
        f"for answered steps: {data['reissued_model_calls']}; model calls answered from "
        f"the log: {data['model_calls_saved']} ({data['tokens_saved']} tokens saved); "
        f"rate limits absorbed: {data['rate_limits_absorbed']}; lost tool answers "
        f"absorbed: {data['lost_answers_absorbed']}; {report.seconds:.1f}s",
        style="bold green" if ok else "bold red",
    )
    return EXIT_OK if ok else EXIT_FINDINGS
