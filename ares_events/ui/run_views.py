"""The console's run pages (list, summary and timeline, divergence), by the rules of
:mod:`.views`. It may import anything below the console and this package's modules.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from ares_events.agents.run_info import LIST_STATUSES
from ares_events.agents.runs import StepInfo
from ares_events.core.events import RecordedEvent, parse_at
from ares_events.ui.markup import Markup, el, json_text, link
from ares_events.ui.queries import RunSummary, page_of_step
from ares_events.ui.views import Chrome, findings_table, join_inputs, pager, row, status_text, table

__all__ = ["diff_view", "run_view", "runs_view"]


def runs_view(
    rows: list[RunSummary], status: str, prefix: str, after: str, next_after: str | None
) -> Markup:
    """The runs list, by status."""
    now = datetime.now(UTC)
    tabs = [
        link(
            s or "all", "/runs", {"status": s, "prefix": prefix}, cls="on" if s == status else None
        )
        for s in ("", *LIST_STATUSES)
    ]
    body = [
        row(
            el("td", link(r.run_id, "/run", {"id": r.run_id}), cls="sid"),
            el("span", r.status, cls=f"st st-{r.status}"),
            *(el("td", n, cls="num") for n in (r.counts.steps, r.counts.tokens)),
            _cost(r.usage),
            el("td", _age(r.started_at, now), title=r.started_at),
            r.updated_at,
            el("td", len(r.in_doubt) or "", cls="num"),
        )
        for r in rows
    ]
    columns = ("run", "status", "steps", "tokens", "cost", "age", "updated", "in doubt")
    listing = table(columns, body, id="runs")
    more = {"status": status, "prefix": prefix, "after": next_after}
    end = el("span", "end of the store", cls="dim")
    pages = pager(link("more →", "/runs", more, id="next") if next_after is not None else end)
    empty = el("p", "no run here", cls="dim") if not rows else None
    return el("section", el("h1", "Runs"), el("p", tabs, cls="tabs"), listing, empty, pages)


_LIFE_LABELS: Final = {
    "run.started": "started (first incarnation)",
    "run.gate": "new incarnation (version gate)",
    "run.interrupted": "interrupted",
    "run.resumed": "resumed",
    "run.cancelled": "cancelled",
    "run.completed": "completed",
    "run.failed": "failed",
    "agent.dead": "agent died",
    "agent.resurrected": "agent resurrected",
}


def _brief(e: RecordedEvent, limit: int = 300) -> str:
    """The payload as one line of JSON cut at ``limit``; a note when it is not stored here."""
    note = "(erased)" if e.payload_erased else "(spilled)" if e.payload_ref is not None else None
    text = json.dumps(note or e.payload, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def _age(at: str | None, now: datetime) -> str:
    """``3d 4h``, ``2h 5m``, ``4m 10s``: how long ago ``at`` was."""
    if not at:
        return ""
    try:
        secs = max(int((now - parse_at(at)).total_seconds()), 0)
    except (ValueError, TypeError):
        return ""
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {seconds}s"


def _cost(usage: Mapping[str, Any]) -> str:
    for k in ("cost", "cost_usd", "total_cost"):
        v = usage.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"{v:g}"
    return ""


def _details(summary: str, value: Any, cls: str | None = None) -> Markup:
    return el("details", el("summary", summary), el("pre", json_text(value), cls=cls))


def _step(chrome: Chrome, info: RunSummary, s: StepInfo, request: Any) -> Markup:
    status = el("span", s.status, cls=f"st st-{s.status}")
    badge = el("span", "IN DOUBT", cls="badge bad") if s.in_doubt else None
    name = f" · {s.name}" if s.name else None
    parts: list[Any] = [el("h3", f"step {s.step} · {s.kind}", name, " · ", status, badge)]
    if s.key:
        parts.append(el("p", "idempotency key ", el("code", s.key)))
    if s.kind in ("model", "tool"):
        attempts = [
            el(
                "li",
                f"attempt {a.n}: {a.status}",
                f" at {a.at}" if a.at else None,
                f" — {a.error_type}: {a.error}" if a.error_type else None,
                f" (resolved by {a.resolved_by})" if a.resolved_by else None,
            )
            for a in s.attempts
        ]
        parts.append(el("ol", attempts, cls="attempts"))
        if request is not None:
            parts.append(_details("request", request, "request"))
        elif s.request_hash:
            parts.append(el("p", f"request hash {s.request_hash}", cls="dim"))
        if s.outcome is not None:
            label = "answer" if s.kind == "model" else "result"
            parts.append(_details(label, s.outcome, "outcome"))
        if s.tokens:
            parts.append(el("p", f"{s.tokens} tokens ", el("code", json_text(s.usage))))
        if s.error:
            parts.append(el("p", s.error, cls="bad"))
    elif s.detail:
        parts.append(el("p", s.detail))
    if s.in_doubt:
        parts.append(el("p", _IN_DOUBT, cls="doubt"))
        if chrome.actions:
            result = el("label", "result (JSON) ", el("textarea", name="result", rows="2"))
            not_done = el("input", type="checkbox", name="not_done", value="1")
            fields = (result, el("label", not_done, " it did not run"))
            button = el("button", "resolve", type="submit", cls="act")
            parts.append(_action_form(chrome, info, "resolve", fields, button, step=s.step))
    if s.kind == "model":
        current = el("textarea", name="current", rows="3")
        diff = el(
            "form",
            el("label", "compare with the current request (JSON) ", current),
            join_inputs({"id": info.run_id, "step": str(s.step)}),
            el("button", "diff", type="submit"),
            method="get",
            action="./diff",
            cls="diff-form",
        )
        parts.append(diff)
    return el(
        "article", parts, cls="step doubt-step" if s.in_doubt else "step", id=f"step-{s.step}"
    )


def _action_form(
    chrome: Chrome,
    info: RunSummary,
    action: str,
    fields: Any,
    button: Markup,
    step: int | None = None,
    **attrs: str,
) -> Markup:
    """A run action's form: hidden values, the key the console signs with (none for a
    cancel), ``fields``, who acts and why, ``button``."""
    hidden = {"csrf": chrome.csrf, "id": info.run_id, "action": action}
    hidden["version"] = str(info.version)
    if step is not None:
        hidden["step"] = str(step)
    signer = chrome.signer if action != "cancel" else None
    signs = el("p", "the console signs this with the approver key ", el("code", signer))
    who = (
        el("label", "by ", el("input", name="by", required=True, maxlength="200")),
        el("label", "reason ", el("input", name="reason", maxlength="2000")),
    )
    form = (join_inputs(hidden), signs if signer else None, fields, who, button)
    return el("form", form, method="post", action="./action", cls="action", **attrs)


def _asked(asked: Mapping[str, Any] | None) -> Markup | None:
    """What a run paused for a signed approval asks to approve."""
    if asked is None:
        return None
    return el(
        "div",
        el("h2", "Waiting for a signed approval"),
        el("p", f"step {asked.get('step')}: tool ", el("code", asked.get("name")), id="asked"),
        el("pre", json_text(asked.get("args")), cls="request") if "args" in asked else None,
        el("p", "arguments digest ", el("code", asked.get("args_hash")), cls="dim"),
        cls="approval",
    )


_IN_DOUBT: Final = (
    "The call was requested and no outcome was recorded: the tool may or may not have run. "
    "Check the tool's side with the idempotency key, then resolve it."
)
_NEEDS_KEY: Final = (
    "This run waits for a signed approval, and this console holds no approver key: start it "
    "with --allow-actions --key FILE, or run "
)


def _run_actions(
    chrome: Chrome, info: RunSummary, asked: Mapping[str, Any] | None
) -> Markup | None:
    if not chrome.actions:
        return None
    forms = []
    if asked is not None and not chrome.signer:
        resume = el("code", f"ares-events runs resume {info.run_id} --key FILE")
        forms.append(el("p", _NEEDS_KEY, resume, cls="doubt", id="needs-key"))
    elif info.status in ("paused", "in_doubt") and not info.in_doubt:
        button = el("button", "approve and resume" if asked else "resume", type="submit", cls="act")
        forms.append(_action_form(chrome, info, "resume", None, button, id="resume-form"))
    if info.status not in ("completed", "failed", "cancelled"):
        button = el("button", "cancel run", type="submit", cls="act danger")
        forms.append(_action_form(chrome, info, "cancel", None, button, id="cancel-form"))
    return el("div", forms, cls="actions") if forms else None


def run_view(
    chrome: Chrome,
    info: RunSummary,
    lifecycle: list[RecordedEvent],
    steps: list[StepInfo],
    requests: Mapping[int, Any],
    page_no: int,
    pages: int,
    asked: Mapping[str, Any] | None = None,
) -> Markup:
    """A run's summary and a page of its timeline (``asked``: what it waits for a signed
    approval of, :func:`~ares_events.ui.queries.approval_request`)."""
    status = el("span", info.status, cls=f"st st-{info.status}", id="run-status")
    started = (info.started_at, " (", _age(info.started_at, datetime.now(UTC)), " ago)")
    chain = status_text(info.ok, "verified" if info.ok else "findings")
    # The run's numbers, with the words and meanings of `runs show` (run_info.RunCounts).
    counts = info.counts.to_dict()
    rows = [("status", status), ("version", info.version), *counts.items(), ("started", started)]
    rows += [("updated", info.updated_at), ("code revision", info.code_revision), ("chain", chain)]
    ids = {k: f"count-{k}" for k in counts}
    summary = el("dl", [(el("dt", k), el("dd", v, id=ids.get(k))) for k, v in rows], cls="summary")
    doubt = [(f"step {s.step} ({s.name})", page_of_step(info, s.step)) for s in info.in_doubt]
    links = [link(label, "/run", {"id": info.run_id, "page": page}) for label, page in doubt]
    extra = [
        el("p", "interrupt: ", el("code", json_text(info.interrupt))) if info.interrupt else None,
        el("p", "error: ", info.error, cls="bad") if info.error else None,
        el("p", "cancelled: ", el("code", json_text(info.cancelled))) if info.cancelled else None,
        _details("result", info.result) if info.result is not None else None,
    ]
    told = f"lifecycle ({len(lifecycle)} events: starts, gates, interrupts, resumes, cancels, ends)"
    events = [
        el(
            "li",
            link(f"v{e.version}", "/stream", {"id": info.run_id, "from": e.version}),
            f" {e.at} ",
            el("strong", _LIFE_LABELS.get(e.type, e.type)),
            " ",
            el("code", _brief(e)),
            el("code", json_text(e.metadata), cls="meta") if e.metadata else None,
        )
        for e in lifecycle
    ]
    life = el("details", el("summary", told), el("ol", events), id="lifecycle")
    at = {"id": info.run_id}
    paging = pager(
        link("← earlier steps", "/run", {**at, "page": page_no - 1}) if page_no > 1 else None,
        el("span", f"page {page_no} of {max(pages, 1)}", cls="dim"),
        link("later steps →", "/run", {**at, "page": page_no + 1}, id="next")
        if page_no < pages
        else None,
    )
    return el(
        "section",
        el("h1", "Run ", el("span", info.run_id, cls="sid", id="run-id")),
        summary,
        el("p", "in doubt: ", links, cls="doubt") if links else None,
        extra,
        findings_table(info.findings),
        _asked(asked),
        _run_actions(chrome, info, asked),
        life,
        el("p", link("events of this run", "/stream", {"id": info.run_id})),
        el("h2", "Timeline"),
        paging,
        el("div", [_step(chrome, info, s, requests.get(s.step)) for s in steps], id="timeline"),
        paging,
    )


def diff_view(run_id: str, step: int, recorded: Any, current_text: str) -> Markup:
    """The recorded request of a model step against the one given now, as a unified diff."""
    try:
        current: Any = json.loads(current_text)
        note = None
    except ValueError as exc:
        current, note = current_text, f"not JSON ({exc}); compared as text"
    a = json_text(recorded).splitlines()
    b = (current if isinstance(current, str) else json_text(current)).splitlines()
    lines = list(difflib.unified_diff(a, b, "recorded", "current", lineterm=""))
    body = [
        el("span", ln, cls="add" if ln.startswith("+") else "del" if ln.startswith("-") else "ctx")
        for ln in lines
    ]
    return el(
        "section",
        el("h1", "Divergence of ", el("span", run_id, cls="sid"), f" step {step}"),
        el("p", note, cls="dim") if note else None,
        el("pre", [Markup(b + "\n") for b in body], cls="diff", id="diff")
        if lines
        else el("p", "no difference: replay would take the recorded answer", cls="ok", id="diff"),
        link("back to the run", "/run", {"id": run_id}),
    )
