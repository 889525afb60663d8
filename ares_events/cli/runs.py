"""CLI command group ``runs``: look at and operate durable agent runs (journal streams)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from ares_events.agents.approvals import APPROVAL_REASON, sign_approval
from ares_events.agents.journal_errors import RunNotFound, RunNotRunnable
from ares_events.agents.recording import hash_of, shorten
from ares_events.agents.runs import (
    LIST_STATUSES,
    RunInfo,
    StepInfo,
    approval_request,
    cancel_run,
    inspect_run,
    list_runs,
    pending_call,
    resolve_step,
    resume_run,
)
from ares_events.cli.common import (
    EXIT_CONFLICT,
    EXIT_FINDINGS,
    EXIT_OK,
    PROG,
    App,
    CommandError,
    _print_findings,
    add_columns,
    cli,
    json_app,
    key_option,
    load_signing_key,
    os_user,
    text,
    user_json,
)
from ares_events.errors import ConcurrencyError, ConfigError
from ares_events.integrity.notes import SigningKey

_STATUS_STYLE = {
    "running": "cyan",
    "paused": "yellow",
    "in_doubt": "bold yellow",
    "completed": "green",
    "failed": "red",
    "cancelled": "dim",
    "refused": "red",
}
_CELL = 48
_ARGS = 400
"""Characters of a call's arguments shown to its approver (--json gives them all)."""


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _status_text(status: str) -> Text:
    return text(status, style=_STATUS_STYLE.get(status, ""))


@contextlib.contextmanager
def _operator_errors(run: str, action: str) -> Iterator[None]:
    """Map a refused operator action to one line: exit 2 (does not apply), 5 (changed)."""
    try:
        yield
    except (RunNotFound, RunNotRunnable, ConfigError) as exc:
        raise CommandError(str(exc)) from None
    except ConcurrencyError as exc:
        raise _Changed(
            f"run {run!r} changed while {action} (expected version {exc.expected}, now "
            f"{exc.actual}); look again with `{PROG} runs show {run}`"
        ) from None


class _Changed(click.ClickException):
    exit_code = EXIT_CONFLICT  # another writer came first: a conflict, not a finding


def _by_reason(fn: Any) -> Any:
    reason = "Why (recorded in the event's metadata)."
    by = "Who acts (recorded in the event's metadata). Default: the OS user."
    fn = click.option("--reason", metavar="TEXT", help=reason)(fn)
    return click.option("--by", metavar="WHO", help=by)(fn)


def _signing(fn: Any) -> Any:
    fn = click.option(
        "--expires-in",
        type=click.IntRange(1, 10 * 365 * 86400),
        default=900,
        show_default=True,
        metavar="SECONDS",
        help="With --key: the signed approval expires after this many seconds.",
    )(fn)
    return key_option(
        "Sign the approval with this approver key (keygen NAME --approver): it names "
        "the pending call, the run's head, an expiry and a single-use nonce."
    )(fn)


def _approver(app: App, key_file: str | None, by: str | None) -> tuple[SigningKey | None, str]:
    """The approver key of ``--key`` (None without one) and who acts: ``--by``, else the
    key's name, else the OS user."""
    key = load_signing_key(app, key_file, required=True) if key_file is not None else None
    return key, by or (key.name if key is not None else os_user())


@cli.group(name="runs")
def runs_cmd() -> None:
    """Look at and operate durable agent runs (the run journal's streams).

    list and show only read: they append nothing. resolve, resume and cancel each append
    one audited event (who, why, which command) to the run.

    \b
    Example:
      ares-events runs list --status in_doubt
      ares-events runs show run-42
      ares-events runs resolve run-42 2 --result '{"ticket": "T-7"}' --reason "found it"
      ares-events runs resume run-42 --by alice
      ares-events runs cancel run-42 --reason "superseded"
    """


@runs_cmd.command(name="list")
@click.option(
    "--status",
    type=click.Choice(LIST_STATUSES),
    help="Only runs with this status (paused includes in_doubt; in_doubt also matches "
    "runs with a tool call that has no outcome).",
)
@json_app
def runs_list(app: App, status: str | None, as_json: bool) -> int:
    """List every run (streams that begin with run.started), appending nothing.

    Per run: status, steps, tokens, in-doubt tool calls, the interrupt or error, and the
    time of its last event (--json: every number of the run, as `runs show`). Run ids are
    never cut: at 80 columns the time, then the tokens, go first. Exits 1 when a run's
    chain has findings.

    \b
    Example:
      ares-events runs list
      ares-events runs list --status paused --json
    """
    with app.open() as store:
        runs = list_runs(store, status=status)
    bad = [r for r in runs if not r.ok]
    if as_json:
        data = {"store": app.url, "status": status, "count": len(runs), "ok": not bad}
        return app.json({**data, "runs": [r.to_dict(steps=False) for r in runs]}, not bad)
    if not runs:
        app.say(f"no runs{f' with status {status}' if status else ''} in {app.url}")
        return EXIT_OK
    table = Table(
        title=f"{len(runs)} run(s)", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False
    )
    # Run ids stay whole: they are what people copy into the next command.
    numbers = ("steps", "tokens", "in doubt")
    add_columns(table, "run", "status", *numbers, right=numbers, no_wrap=True)
    table.add_column("why", overflow="fold", min_width=10)
    table.add_column("updated (UTC)", no_wrap=True)
    for r in runs:
        why = ""
        if r.interrupt:
            why = str(r.interrupt.get("reason"))
        elif r.error:
            why = shorten(str(r.error), _CELL)
        elif r.cancelled:
            why = f"cancelled by {r.cancelled.get('by')}"
        if not r.ok:
            why = f"FINDINGS {why}".strip()
        counts = map(str, (r.counts.steps, r.counts.tokens, len(r.in_doubt)))
        updated = text((r.updated_at or "")[5:16].replace("T", " "))
        table.add_row(text(r.run_id), _status_text(r.status), *counts, text(why), updated)
    app.table(table, optional=("updated (UTC)", "in doubt", "tokens", "steps"))
    return EXIT_FINDINGS if bad else EXIT_OK


def _asked(s: StepInfo) -> str:
    if s.kind == "patch":
        return f"set {s.detail}"
    if s.kind == "interrupt":
        return f"interrupt: {s.detail}"
    req = s.request or {}
    if s.kind == "tool":
        return f"{s.name} {shorten(_json_text(req.get('args')), _CELL)}"
    if "messages" not in req:
        return f"messages #{(s.request_hash or '')[:12]} (hash only)"
    msgs = req.get("messages")
    last = msgs[-1] if isinstance(msgs, list) and msgs else msgs
    if isinstance(last, dict) and "content" in last:
        last = last["content"]
    n = len(msgs) if isinstance(msgs, list) else 1
    return f"{n} msg(s); last: {shorten(str(last), _CELL)}"


def _got(s: StepInfo) -> str:
    if s.kind in ("patch", "interrupt"):
        return ""
    if s.status in ("answered", "returned"):
        return shorten(_json_text(s.outcome), _CELL)
    if s.error:
        return shorten(s.error, _CELL)
    return "(no outcome)" if s.status == "requested" else ""


def _attempts_text(s: StepInfo) -> str:
    if not s.attempts:
        return ""
    failed = [a for a in s.attempts if a.status == "failed"]
    text = str(len(s.attempts))
    if failed:
        types = sorted({str(a.error_type) for a in failed})
        text += f" ({len(failed)} failed: {', '.join(types)})"
    if any(a.reconciled for a in s.attempts):
        text += " (reconciled)"
    resolved = [a.resolved_by for a in s.attempts if a.resolved_by]
    if resolved:
        text += f" (resolved by {resolved[-1]})"
    return text


def _asked_json(asked: dict[str, Any] | None) -> dict[str, Any] | None:
    """The approval request a run waits on, as shown: step, tool, args, args digest."""
    keys = {"step": "step", "tool": "name", "args": "args", "args_hash": "args_hash"}
    return None if asked is None else {k: asked.get(field) for k, field in keys.items()}


def _print_run(app: App, info: RunInfo, asked: dict[str, Any] | None) -> None:
    rest = f"version {info.version}, code {info.code_revision}, prompt {str(info.prompt_hash)[:12]}"
    head = Text.assemble(text(f"run {info.run_id}: "), _status_text(info.status), text(f"  {rest}"))
    app.out.print(head)
    app.out.print(text(", ".join(f"{k} {v}" for k, v in info.counts.to_dict().items())))
    if info.interrupt:
        app.say(f"interrupt: {_json_text(info.interrupt)}", style="yellow")
    if asked is not None:
        args = _json_text(asked.get("args"))
        cut = " (cut: --json shows them all)" if len(args) > _ARGS else ""
        app.say(
            f"approval request: step {asked.get('step')}, tool {asked.get('name')}, "
            f"args {shorten(args, _ARGS)}{cut}, args digest {asked.get('args_hash')}",
            style="yellow",
        )
        if info.status == "paused":
            app.say(f"approve it: `{PROG} runs resume {info.run_id} --key FILE`", style="yellow")
    if info.error:
        app.say(f"error: {info.error}", style="red")
    if info.cancelled:
        app.say(f"cancelled: {_json_text(info.cancelled)}", style="dim")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1))
    add_columns(table, "step", "kind", "status", right=("step",), no_wrap=True)
    add_columns(table, "attempts", "asked", "got", overflow="fold")
    table.add_column("tokens", justify="right", no_wrap=True)
    for s in info.steps:
        status = text(s.status, style="bold yellow" if s.in_doubt else "")
        tokens = str(s.tokens) if s.kind == "model" else ""
        described = map(text, (_attempts_text(s), _asked(s), _got(s)))
        table.add_row(str(s.step), text(s.kind), status, *described, tokens)
    app.table(table)
    for s in info.in_doubt:
        app.say(
            f"in doubt: step {s.step}, tool {s.name}, key {s.key}: check the downstream "
            f"system for that key, then `{PROG} runs resolve {info.run_id} {s.step} "
            "--result JSON` (it landed) or `--not-done` (it did not)",
            style="bold yellow",
        )
    if info.findings:
        _print_findings(app, info.findings)
    for line in info.skipped:
        app.say(f"skipped {line}", style="red")


@runs_cmd.command(name="show")
@click.argument("run")
@json_app
def runs_show(app: App, run: str, as_json: bool) -> int:
    """Show RUN step by step, appending nothing: its numbers (steps, attempts, retries,
    tokens, recoveries, resumes: defined in docs/guide-journal.md), then each step's kind,
    status and attempts (with their errors), what it asked (messages, tool and args, as
    recorded), what it got, tokens; in-doubt tool calls, the interrupt and the approval
    request it waits on (step, tool, args, args digest: what `resume --key` signs). Exits
    1 on chain findings.

    \b
    Example:
      ares-events runs show run-42
      ares-events runs show run-42 --json | jq '.steps[] | select(.kind == "tool")'
    """
    with app.open() as store, _operator_errors(run, "reading it"):
        info = inspect_run(store, run)
        # A damaged log is not approved from (and its ledger may not even decode).
        asked = approval_request(store, run) if info.ok else None
    if as_json:
        app.json(dict(info.to_dict(), approval_request=_asked_json(asked), store=app.url))
    else:
        _print_run(app, info, asked)
    return EXIT_OK if info.ok else EXIT_FINDINGS


def _done(app: App, as_json: bool, info: RunInfo, line: str, **data: Any) -> int:
    if as_json:
        data = {"store": app.url, "run_id": info.run_id, **data}
        return app.json({**data, "version": info.version, "status": info.status})
    app.say(line)
    app.out.print(Text.assemble("run is now ", _status_text(info.status)))
    return EXIT_OK


def _step_number(run: str, step: str) -> int:
    """STEP as a number, also given as the call's idempotency key ``RUN:STEP``."""
    text = step.removeprefix(f"{run}:")
    # isdigit() alone accepts superscripts and other Unicode digits that int() refuses.
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise click.BadParameter(
            f"{step!r} is not a step number (or the key {run}:N)", param_hint="STEP"
        )
    return int(text)


@runs_cmd.command(name="resolve")
@click.argument("run")
@click.argument("step")
@click.option(
    "--result",
    "result_json",
    metavar="JSON",
    help="The call landed: its result (JSON), returned to the loop from now on.",
)
@click.option(
    "--not-done",
    is_flag=True,
    help="The call did not land: the next attempt runs it again with the same key.",
)
@_by_reason
@_signing
@json_app
def runs_resolve(
    app: App,
    run: str,
    step: str,
    result_json: str | None,
    not_done: bool,
    by: str | None,
    reason: str | None,
    key_file: str | None,
    expires_in: int,
    as_json: bool,
) -> int:
    """Settle the in-doubt tool call at STEP of RUN (a call requested with no outcome).

    STEP is the step number, or the call's idempotency key RUN:STEP. Check the downstream
    system for that key (runs show lists it), then record what happened: --result JSON (it
    landed, with this result) or --not-done (it did not; it will run again with the same
    key). Appends one event. A run paused on the call stays paused until `runs resume`.

    \b
    Example:
      ares-events runs resolve run-42 2 --result '{"ticket": "T-7"}' --reason "in Jira"
      ares-events runs resolve run-42 2 --not-done --by alice
      ares-events runs resolve run-42 2 --result '"ok"' --key alice.key
    """
    if (result_json is None) == (not not_done):
        raise click.UsageError("give exactly one of --result JSON or --not-done")
    number = _step_number(run, step)
    result: Any = None
    if result_json is not None:
        try:
            result = user_json(result_json)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--result") from None
    key, who = _approver(app, key_file, by)
    kwargs: dict[str, Any] = {"not_done": True} if not_done else {"result": result}
    with app.open(write=True) as store, _operator_errors(run, "resolving it"):
        if key is not None:
            kwargs["approval"] = sign_approval(
                key,
                pending_call(store, run, number),
                action="not_done" if not_done else "result",
                outcome=None if not_done else hash_of(result, "result"),
                expires_in=expires_in,
            )
            kwargs["approvers"] = [key.verifier]
        info = resolve_step(
            store, run, number, by=who, reason=reason, via=f"{PROG} runs resolve", **kwargs
        )
    verdict = "did not land (it will run again)" if not_done else "landed; result recorded"
    line = f"step {number} of run {run}: {verdict} (by {who})"
    done = {"action": "resolve", "step": number, "not_done": not_done, "by": who, "reason": reason}
    return _done(app, as_json, info, line, **done)


@runs_cmd.command(name="resume")
@click.argument("run")
@_by_reason
@_signing
@json_app
def runs_resume(
    app: App,
    run: str,
    by: str | None,
    reason: str | None,
    key_file: str | None,
    expires_in: int,
    as_json: bool,
) -> int:
    """Answer RUN's interrupt (approve it): the next incarnation of the agent goes on past
    it. Appends one event. A run paused on an in-doubt tool call must be resolved first.

    \b
    Example:
      ares-events runs resume run-42 --by alice --reason "approved in ticket T-7"
      ares-events runs resume run-42 --key alice.key      # a signed approval

    With --key the approval is signed (a journal given the approver's verifier key runs
    a call that needs approval only under such an approval, once).
    """
    key, who = _approver(app, key_file, by)
    signed: dict[str, Any] = {}
    approved: dict[str, Any] = {}
    with app.open(write=True) as store, _operator_errors(run, "resuming it"):
        if (
            key is None
            and (inspect_run(store, run).interrupt or {}).get("reason") == APPROVAL_REASON
        ):  # unsigned, its agent would only pause again
            raise CommandError(
                f"run {run} waits for a signed approval: give --key FILE "
                "(an approver's key, from keygen NAME --approver)"
            )
        if key is not None:
            pending, asked = pending_call(store, run), approval_request(store, run) or {}
            signed["approval"] = sign_approval(key, pending, expires_in=expires_in)
            signed["approvers"] = [key.verifier]
            same = (asked.get("step"), asked.get("args_hash")) == (pending.step, pending.args)
            tool = asked.get("name") if same else None
            approved = {"step": pending.step, "tool": tool, "args_hash": pending.args}
        info = resume_run(store, run, by=who, reason=reason, via=f"{PROG} runs resume", **signed)
    if approved and not as_json:  # what the approver signed, named
        what = f", tool {approved['tool']}" if approved["tool"] is not None else ""
        app.say(
            f"signed approval of step {approved['step']}{what}, args digest {approved['args_hash']}"
        )
    line = f"run {run} resumed by {who}; start its agent again to let it go on"
    done = {"approved": approved} if approved else {}
    return _done(app, as_json, info, line, action="resume", by=who, reason=reason, **done)


@runs_cmd.command(name="cancel")
@click.argument("run")
@_by_reason
@json_app
def runs_cancel(app: App, run: str, by: str | None, reason: str | None, as_json: bool) -> int:
    """Cancel RUN for good: it takes no new step (its recorded steps still replay), and a
    live incarnation is stopped at its next append. Appends one event.

    \b
    Example:
      ares-events runs cancel run-42 --reason "superseded by run-43"
    """
    who = by or os_user()
    with app.open(write=True) as store, _operator_errors(run, "cancelling it"):
        info = cancel_run(store, run, by=who, reason=reason, via=f"{PROG} runs cancel")
    line = f"run {run} cancelled by {who}"
    return _done(app, as_json, info, line, action="cancel", by=who, reason=reason)
