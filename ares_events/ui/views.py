"""The console's pages, rendered on the server from :mod:`.queries` with :mod:`.markup`
(every store value escaped; no inline script or style, so the CSP needs no
``unsafe-inline``).

Each view returns the content of ``<main>``; :func:`page` wraps it in the layout. A view
marked live is refreshed in place by ``console.js`` when the store's last position moves.

It may import anything below the console and this package's modules.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from ares_events.agents.run_info import LIST_STATUSES
from ares_events.agents.runs import StepInfo
from ares_events.core.events import RecordedEvent, parse_at
from ares_events.core.snapshot_format import SnapshotInfo
from ares_events.integrity.findings import AuditReport, Finding, VerifyReport
from ares_events.projections.tables import ProjectionMeta
from ares_events.ui.markup import Markup, el, esc, json_text, link, url
from ares_events.ui.queries import PageChain, RunSummary, StreamRow, page_of_step

__all__ = [
    "Chrome",
    "audit_view",
    "diff_view",
    "message_view",
    "page",
    "payload_view",
    "projections_view",
    "run_view",
    "runs_view",
    "stream_view",
    "streams_view",
    "verify_view",
]

PAYLOAD_PREVIEW: Final = 4000
NAV: Final = (
    ("Streams", "/streams"),
    ("Runs", "/runs"),
    ("Integrity", "/integrity"),
    ("Projections", "/projections"),
)


@dataclass(frozen=True, slots=True)
class Chrome:
    """What every page shows around its content."""

    store_url: str
    """Redacted: never a password."""
    actions: bool
    csrf: str


def page(
    chrome: Chrome,
    title: str,
    body: Markup,
    *,
    live: bool = False,
    poll: bool = False,
    position: int = 0,
    active: str = "",
) -> Markup:
    """The whole HTML document around one view's content."""
    mode = (
        el("span", "actions enabled", cls="mode actions")
        if chrome.actions
        else el("span", "read-only", cls="mode")
    )
    nav = el(
        "nav",
        el("span", "ares-events", cls="brand"),
        [link(name, href, cls="on" if href == active else None) for name, href in NAV],
        el("span", chrome.store_url, cls="store", title="store (redacted)"),
        mode,
    )
    main = el(
        "main",
        body,
        id="main",
        data_live="1" if live else None,
        data_poll="1" if poll else None,
        data_position=str(position),
    )
    return Markup(
        "<!DOCTYPE html>"
        + el(
            "html",
            el(
                "head",
                el("meta", charset="utf-8"),
                el("meta", name="viewport", content="width=device-width, initial-scale=1"),
                el("title", f"{title} · ares-events"),
                el("link", rel="stylesheet", href="/static/console.css"),
                el("script", src="/static/console.js", defer=True),
            ),
            el("body", nav, main),
            lang="en",
        )
    )


def _findings(findings: list[Finding], limit: int = 50) -> Markup:
    if not findings:
        return Markup("")
    rows = [
        el(
            "tr",
            el("td", f.kind),
            el("td", f.stream_id if f.stream_id is not None else "store"),
            el("td", f.version),
            el("td", f.detail),
        )
        for f in findings[:limit]
    ]
    more = len(findings) - limit
    return el(
        "table",
        el(
            "thead",
            el("tr", el("th", "finding"), el("th", "stream"), el("th", "v"), el("th", "detail")),
        ),
        el("tbody", rows),
        el("caption", f"{more} more finding(s) not shown") if more > 0 else None,
        cls="findings",
    )


def _status(ok: bool, text: str | None = None) -> Markup:
    return el("span", text or ("verified" if ok else "FINDINGS"), cls="ok" if ok else "bad")


def message_view(title: str, text: str) -> Markup:
    """A page that only says something (not found, refused, done)."""
    return el("section", el("h1", title), el("p", text, cls="message"))


# -- streams ---------------------------------------------------------------------------------


def streams_view(rows: list[StreamRow], prefix: str, after: str, next_after: str | None) -> Markup:
    """The streams list: a prefix search and one page."""
    form = el(
        "form",
        el(
            "label", "prefix ", el("input", type="search", name="prefix", value=prefix, id="prefix")
        ),
        el("button", "search", type="submit"),
        method="get",
        action="/streams",
        cls="search",
    )
    body = [
        el(
            "tr",
            el("td", link(r.stream_id, "/stream", {"id": r.stream_id}), cls="sid"),
            el("td", el("span", r.kind, cls=f"kind k-{r.kind.split()[0]}")),
            el("td", r.version, cls="num"),
            el("td", r.head.hex()[:16], cls="hash", title=r.head.hex()),
            el("td", r.last_at),
        )
        for r in rows
    ]
    table = el(
        "table",
        el(
            "thead",
            el("tr", [el("th", h) for h in ("stream", "kind", "version", "head", "last write")]),
        ),
        el("tbody", body),
        id="streams",
    )
    pager = el(
        "p",
        link("first page", "/streams", {"prefix": prefix}) if after else None,
        " ",
        link("next page →", "/streams", {"prefix": prefix, "after": next_after}, id="next")
        if next_after is not None
        else el("span", "end of the list", cls="dim"),
        cls="pager",
    )
    empty = el("p", "no stream matches", cls="dim") if not rows else None
    return el("section", el("h1", "Streams"), form, table, empty, pager)


def _payload(e: RecordedEvent) -> Markup:
    ref = e.payload_ref
    if e.payload_erased:
        return el("span", "erased", cls="erased", title="the payload was erased; its digest stays")
    if ref is not None:
        return el(
            "span",
            f"spilled blob, {ref.size} bytes ",
            link("fetch", "/payload", {"id": e.stream_id, "v": e.version}, cls="fetch"),
            cls="spilled",
        )
    text = json_text(e.payload)
    if len(text) <= 120 and "\n" not in text.strip():
        return el("code", text)
    return el(
        "details",
        el("summary", f"{e.payload_size} bytes"),
        el("pre", json_text(e.payload, limit=PAYLOAD_PREVIEW)),
        link("whole payload", "/payload", {"id": e.stream_id, "v": e.version})
        if len(text) > PAYLOAD_PREVIEW
        else None,
    )


def stream_view(
    stream_id: str,
    version: int,
    events: list[RecordedEvent],
    chain: PageChain,
    snapshots: list[SnapshotInfo],
    per_page: int,
) -> Markup:
    """One stream: a page of events with payloads, the page's chain status, snapshots."""
    start = events[0].version if events else 1
    rows = [
        el(
            "tr",
            el("td", e.version, cls="num"),
            el("td", e.position, cls="num"),
            el("td", e.type),
            el("td", e.module),
            el("td", e.at),
            el("td", e.hash.hex()[:12], cls="hash", title=e.hash.hex()),
            el("td", _payload(e), cls="payload"),
            id=f"v{e.version}",
        )
        for e in events
    ]
    nav = el(
        "p",
        link("← previous", "/stream", {"id": stream_id, "from": max(1, start - per_page)})
        if start > 1
        else None,
        " ",
        el("span", f"versions {start}–{start + len(events) - 1} of {version}", cls="dim"),
        " ",
        link("next →", "/stream", {"id": stream_id, "from": start + len(events)}, id="next")
        if start + len(events) <= version
        else None,
        " ",
        link("last page", "/stream", {"id": stream_id, "from": max(1, version - per_page + 1)}),
        cls="pager",
    )
    status = el(
        "p",
        "page chain: ",
        _status(chain.ok),
        f" ({chain.checked} events from the link before them"
        + (", head compared)" if chain.at_head else ")"),
        " · ",
        link("verify the whole stream", "/verify", {"id": stream_id}),
        " · ",
        link("run timeline", "/run", {"id": stream_id}) if events and _is_run(events) else None,
        id="chain",
    )
    snaps = (
        el(
            "table",
            el("caption", "snapshots"),
            el(
                "tr",
                [
                    el("th", h)
                    for h in ("projection", "version", "at version", "size", "created", "problem")
                ],
            ),
            [
                el(
                    "tr",
                    el("td", s.projection),
                    el("td", s.projection_version),
                    el("td", s.at_version),
                    el("td", s.state_size),
                    el("td", s.created_at.isoformat()),
                    el("td", s.problem),
                )
                for s in snapshots
            ],
            id="snapshots",
        )
        if snapshots
        else el("p", "no snapshots", cls="dim")
    )
    return el(
        "section",
        el("h1", "Stream ", el("span", stream_id, cls="sid", id="stream-id")),
        status,
        _findings(chain.findings),
        nav,
        el(
            "table",
            el(
                "thead",
                el(
                    "tr",
                    [el("th", h) for h in ("v", "pos", "type", "module", "at", "hash", "payload")],
                ),
            ),
            el("tbody", rows),
            id="events",
        ),
        snaps,
    )


def _is_run(events: list[RecordedEvent]) -> bool:
    return events[0].version == 1 and events[0].type == "run.started"


def payload_view(e: RecordedEvent, error: str | None) -> Markup:
    """One event's whole payload (a spilled one is fetched now)."""
    title = el("h1", "Payload of ", el("span", e.stream_id, cls="sid"), f" v{e.version}")
    if error is not None:
        return el("section", title, el("p", error, cls="bad"))
    return el(
        "section",
        title,
        el("p", f"{e.type} · {e.payload_size} bytes · digest {e.payload_digest.hex()}"),
        el("pre", json_text(e.payload), id="payload"),
    )


def verify_view(report: VerifyReport) -> Markup:
    """The whole stream's chain status."""
    return el(
        "section",
        el("h1", "Chain of ", el("span", report.stream_id, cls="sid")),
        el(
            "p",
            _status(report.ok),
            f" {report.events_checked} events checked, head at version {report.head_version}",
            id="verify",
        ),
        el("p", "first finding: ", str(report.findings[0])) if report.findings else None,
        _findings(report.findings),
        link("back to the stream", "/stream", {"id": report.stream_id}),
    )


# -- runs ------------------------------------------------------------------------------------


def runs_view(
    rows: list[RunSummary], status: str, prefix: str, after: str, next_after: str | None
) -> Markup:
    """The runs list, by status."""
    now = datetime.now(UTC)
    tabs = el(
        "p",
        [
            link(
                s or "all",
                "/runs",
                {"status": s, "prefix": prefix},
                cls="on" if s == status else None,
            )
            for s in ("", *LIST_STATUSES)
        ],
        cls="tabs",
    )
    body = [
        el(
            "tr",
            el("td", link(r.run_id, "/run", {"id": r.run_id}), cls="sid"),
            el("td", el("span", r.status, cls=f"st st-{r.status}")),
            el("td", r.step_count, cls="num"),
            el("td", r.tokens, cls="num"),
            el("td", _cost(r.usage)),
            el("td", _age(r.started_at, now), title=r.started_at),
            el("td", r.updated_at),
            el("td", len(r.in_doubt) or "", cls="num"),
        )
        for r in rows
    ]
    table = el(
        "table",
        el(
            "thead",
            el(
                "tr",
                [
                    el("th", h)
                    for h in (
                        "run",
                        "status",
                        "steps",
                        "tokens",
                        "cost",
                        "age",
                        "updated",
                        "in doubt",
                    )
                ],
            ),
        ),
        el("tbody", body),
        id="runs",
    )
    pager = el(
        "p",
        link(
            "more →", "/runs", {"status": status, "prefix": prefix, "after": next_after}, id="next"
        )
        if next_after is not None
        else el("span", "end of the store", cls="dim"),
        cls="pager",
    )
    empty = el("p", "no run here", cls="dim") if not rows else None
    return el("section", el("h1", "Runs"), tabs, table, empty, pager)


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


def _payload_or_note(e: RecordedEvent) -> Any:
    if e.payload_erased:
        return "(erased)"
    if e.payload_ref is not None:
        return "(spilled)"
    return e.payload


def _compact(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def _age(at: str | None, now: datetime) -> str:
    """``3d 4h``, ``2h 5m``, ``4m 10s``: how long ago ``at`` was."""
    if not at:
        return ""
    try:
        secs = int((now - parse_at(at)).total_seconds())
    except (ValueError, TypeError):
        return ""
    secs = max(secs, 0)
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


def _attempts(s: StepInfo) -> Markup:
    return el(
        "ol",
        [
            el(
                "li",
                f"attempt {a.n}: {a.status}",
                f" at {a.at}" if a.at else None,
                f" — {a.error_type}: {a.error}" if a.error_type else None,
                f" (resolved by {a.resolved_by})" if a.resolved_by else None,
            )
            for a in s.attempts
        ],
        cls="attempts",
    )


def _step(chrome: Chrome, info: RunSummary, s: StepInfo, request: Any) -> Markup:
    head = el(
        "h3",
        f"step {s.step} · {s.kind}",
        f" · {s.name}" if s.name else None,
        " · ",
        el("span", s.status, cls=f"st st-{s.status}"),
        el("span", "IN DOUBT", cls="badge bad") if s.in_doubt else None,
    )
    parts: list[Any] = [head]
    if s.key:
        parts.append(el("p", "idempotency key ", el("code", s.key)))
    if s.kind in ("model", "tool"):
        parts.append(_attempts(s))
        if request is not None:
            parts.append(
                el(
                    "details",
                    el("summary", "request"),
                    el("pre", json_text(request), cls="request"),
                )
            )
        elif s.request_hash:
            parts.append(el("p", f"request hash {s.request_hash}", cls="dim"))
        if s.outcome is not None:
            label = "answer" if s.kind == "model" else "result"
            parts.append(
                el("details", el("summary", label), el("pre", json_text(s.outcome), cls="outcome"))
            )
        if s.tokens:
            parts.append(el("p", f"{s.tokens} tokens ", el("code", json_text(s.usage))))
        if s.error:
            parts.append(el("p", s.error, cls="bad"))
    elif s.detail:
        parts.append(el("p", s.detail))
    if s.in_doubt:
        parts.append(
            el(
                "p",
                "The call was requested and no outcome was recorded: the tool may or may not "
                "have run. Check the tool's side with the idempotency key, then resolve it.",
                cls="doubt",
            )
        )
        if chrome.actions:
            parts.append(_resolve_form(chrome, info, s))
    if s.kind == "model":
        parts.append(
            el(
                "form",
                el(
                    "label",
                    "compare with the current request (JSON) ",
                    el("textarea", name="current", rows="3"),
                ),
                el("input", type="hidden", name="id", value=info.run_id),
                el("input", type="hidden", name="step", value=str(s.step)),
                el("button", "diff", type="submit"),
                method="get",
                action="/diff",
                cls="diff-form",
            )
        )
    return el(
        "article", parts, cls="step doubt-step" if s.in_doubt else "step", id=f"step-{s.step}"
    )


def _hidden(chrome: Chrome, info: RunSummary, action: str) -> Markup:
    return join_inputs(
        {"csrf": chrome.csrf, "id": info.run_id, "action": action, "version": str(info.version)}
    )


def join_inputs(values: Mapping[str, str]) -> Markup:
    """Hidden inputs."""
    return Markup("".join(el("input", type="hidden", name=k, value=v) for k, v in values.items()))


def _who_fields() -> Markup:
    return Markup(
        el("label", "by ", el("input", name="by", required=True, maxlength="200"))
        + el("label", "reason ", el("input", name="reason", maxlength="2000"))
    )


def _resolve_form(chrome: Chrome, info: RunSummary, s: StepInfo) -> Markup:
    return el(
        "form",
        _hidden(chrome, info, "resolve"),
        el("input", type="hidden", name="step", value=str(s.step)),
        el("label", "result (JSON) ", el("textarea", name="result", rows="2")),
        el("label", el("input", type="checkbox", name="not_done", value="1"), " it did not run"),
        _who_fields(),
        el("button", "resolve", type="submit", cls="act"),
        method="post",
        action="/action",
        cls="action",
    )


def _run_actions(chrome: Chrome, info: RunSummary) -> Markup | None:
    if not chrome.actions:
        return None
    forms = []
    if info.status in ("paused", "in_doubt") and not info.in_doubt:
        forms.append(
            el(
                "form",
                _hidden(chrome, info, "resume"),
                _who_fields(),
                el("button", "resume", type="submit", cls="act"),
                method="post",
                action="/action",
                cls="action",
                id="resume-form",
            )
        )
    if info.status not in ("completed", "failed", "cancelled"):
        forms.append(
            el(
                "form",
                _hidden(chrome, info, "cancel"),
                _who_fields(),
                el("button", "cancel run", type="submit", cls="act danger"),
                method="post",
                action="/action",
                cls="action",
                id="cancel-form",
            )
        )
    return el("div", forms, cls="actions") if forms else None


def run_view(
    chrome: Chrome,
    info: RunSummary,
    lifecycle: list[RecordedEvent],
    steps: list[StepInfo],
    requests: Mapping[int, Any],
    page_no: int,
    pages: int,
) -> Markup:
    """A run's summary and a page of its timeline."""
    summary = el(
        "dl",
        el("dt", "status"),
        el("dd", el("span", info.status, cls=f"st st-{info.status}", id="run-status")),
        el("dt", "version"),
        el("dd", info.version),
        el("dt", "steps"),
        el("dd", info.step_count),
        el("dt", "tokens"),
        el("dd", info.tokens),
        el("dt", "started"),
        el("dd", info.started_at, " (", _age(info.started_at, datetime.now(UTC)), " ago)"),
        el("dt", "updated"),
        el("dd", info.updated_at),
        el("dt", "resumptions"),
        el("dd", info.resumes),
        el("dt", "code revision"),
        el("dd", info.code_revision),
        el("dt", "chain"),
        el("dd", _status(info.ok, "verified" if info.ok else "findings")),
        cls="summary",
    )
    doubt = (
        el(
            "p",
            "in doubt: ",
            [
                link(
                    f"step {s.step} ({s.name})",
                    "/run",
                    {"id": info.run_id, "page": page_of_step(info, s.step)},
                )
                for s in info.in_doubt
            ],
            cls="doubt",
        )
        if info.in_doubt
        else None
    )
    extra = [
        el("p", "interrupt: ", el("code", json_text(info.interrupt))) if info.interrupt else None,
        el("p", "error: ", info.error, cls="bad") if info.error else None,
        el("p", "cancelled: ", el("code", json_text(info.cancelled))) if info.cancelled else None,
        el("details", el("summary", "result"), el("pre", json_text(info.result)))
        if info.result is not None
        else None,
    ]
    life = el(
        "details",
        el(
            "summary",
            f"lifecycle ({len(lifecycle)} events: starts, gates, interrupts, resumptions, "
            "cancels, ends)",
        ),
        el(
            "ol",
            [
                el(
                    "li",
                    link(f"v{e.version}", "/stream", {"id": info.run_id, "from": e.version}),
                    f" {e.at} ",
                    el("strong", _LIFE_LABELS.get(e.type, e.type)),
                    " ",
                    el("code", _compact(_payload_or_note(e))),
                    el("code", json_text(e.metadata), cls="meta") if e.metadata else None,
                )
                for e in lifecycle
            ],
        ),
        id="lifecycle",
    )
    pager = el(
        "p",
        link("← earlier steps", "/run", {"id": info.run_id, "page": page_no - 1})
        if page_no > 1
        else None,
        " ",
        el("span", f"page {page_no} of {max(pages, 1)}", cls="dim"),
        " ",
        link("later steps →", "/run", {"id": info.run_id, "page": page_no + 1}, id="next")
        if page_no < pages
        else None,
        cls="pager",
    )
    return el(
        "section",
        el("h1", "Run ", el("span", info.run_id, cls="sid", id="run-id")),
        summary,
        doubt,
        extra,
        _findings(info.findings),
        _run_actions(chrome, info),
        life,
        el("p", link("events of this run", "/stream", {"id": info.run_id})),
        el("h2", "Timeline"),
        pager,
        el("div", [_step(chrome, info, s, requests.get(s.step)) for s in steps], id="timeline"),
        pager,
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


# -- integrity and projections ---------------------------------------------------------------


def audit_view(
    chrome: Chrome,
    job: Mapping[str, Any] | None,
    checkpoints: list[tuple[str, int, bytes, str]],
    witness_note: str | None,
) -> Markup:
    """The audit (start it, see its progress and findings), checkpoints, proofs."""
    start = el(
        "form",
        join_inputs({"csrf": chrome.csrf}),
        el(
            "label",
            el("input", type="checkbox", name="deep", value="1"),
            " deep (blobs and snapshots)",
        ),
        el("button", "run an audit", type="submit", id="audit-start"),
        method="post",
        action="/audit",
        cls="action",
    )
    parts: list[Any] = [el("h1", "Integrity"), start]
    if job is not None:
        report: AuditReport | None = job.get("report")
        done, total = job.get("done", 0), job.get("total", 0)
        if report is None and job.get("error") is None:
            parts.append(
                el(
                    "p",
                    f"audit running: {done} of {total} events",
                    el("progress", value=str(done), max=str(max(total, 1))),
                    id="audit-progress",
                )
            )
        elif job.get("error") is not None:
            parts.append(el("p", "audit failed: ", job["error"], cls="bad", id="audit-result"))
        elif report is not None:
            parts.append(
                el(
                    "p",
                    _status(
                        report.ok, "clean" if report.ok else f"{len(report.findings)} finding(s)"
                    ),
                    f" {report.streams_checked} streams, {report.events_checked} events, "
                    f"{report.blobs_checked} blobs, {report.snapshots_checked} snapshots"
                    + (
                        f", {report.anchors_checked} anchors"
                        if report.anchors_checked is not None
                        else ""
                    )
                    + " checked"
                    f" (started {job.get('started')})",
                    id="audit-result",
                )
            )
            if report.findings:
                parts.append(el("p", "first finding: ", str(report.findings[0])))
            parts.append(_findings(report.findings))
    parts.append(el("h2", "Signed checkpoints"))
    if checkpoints:
        parts.append(
            el(
                "table",
                el("tr", [el("th", h) for h in ("origin", "tree size", "root", "signed at")]),
                [
                    el(
                        "tr",
                        el("td", o),
                        el("td", n, cls="num"),
                        el("td", r.hex()[:16], cls="hash", title=r.hex()),
                        el("td", at),
                    )
                    for o, n, r, at in checkpoints
                ],
                id="checkpoints",
            )
        )
    else:
        parts.append(
            el("p", "no signed checkpoint yet (ares-events checkpoint --key FILE)", cls="dim")
        )
    if witness_note:
        parts.append(el("p", witness_note, cls="dim"))
    parts.append(el("h2", "Inclusion proof of one event"))
    parts.append(
        el(
            "form",
            el("label", "stream ", el("input", name="stream", required=True)),
            el(
                "label",
                "version ",
                el("input", name="version", type="number", min="1", required=True),
            ),
            el("button", "download proof", type="submit"),
            method="get",
            action="/proof",
            cls="action",
        )
    )
    parts.append(
        el(
            "p",
            "Check it offline: ",
            el("code", "ares-events verify-proof proof.json --vkey VKEY"),
            cls="dim",
        )
    )
    return el("section", parts)


def projections_view(metas: list[ProjectionMeta], last: int, lags: Mapping[str, str]) -> Markup:
    """Each read model's position, lag and rebuild state."""
    rows = [
        el(
            "tr",
            el("td", m.name),
            el("td", m.projection_version, cls="num"),
            el("td", m.generation, cls="num"),
            el("td", m.position, cls="num"),
            el("td", lags.get(m.name, ""), cls="num"),
            el("td", m.active_table),
            el(
                "td",
                f"rebuilding into {m.building_table} at position {m.building_position}"
                if m.building_table
                else "",
            ),
        )
        for m in metas
    ]
    return el(
        "section",
        el("h1", "Projections"),
        el("p", f"store's last position: {last}", id="last-position"),
        el(
            "table",
            el(
                "tr",
                [
                    el("th", h)
                    for h in (
                        "read model",
                        "version",
                        "generation",
                        "position",
                        "lag (events)",
                        "table",
                        "rebuild",
                    )
                ],
            ),
            rows,
            id="projections",
        )
        if metas
        else el("p", "no read model registered in this store", cls="dim"),
    )


def href(path: str, query: Mapping[str, Any] | None = None) -> str:
    """Same as :func:`markup.url` (re-exported for the server)."""
    return url(path, query)


def text(value: Any) -> Markup:
    """Escaped text."""
    return esc(value)
