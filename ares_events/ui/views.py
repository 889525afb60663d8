"""The console's pages, rendered on the server from :mod:`.queries` with :mod:`.markup`;
:func:`page` wraps a view in the layout. It may import anything below the console and
this package's modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ares_events.core.events import RecordedEvent
from ares_events.core.read_models import ProjectionMeta
from ares_events.core.snapshot_format import SnapshotInfo
from ares_events.integrity.findings import AuditReport, Finding, VerifyReport
from ares_events.ui.markup import Markup, el, json_text, link
from ares_events.ui.queries import PageChain, StreamRow

__all__ = [
    "Chrome",
    "audit_view",
    "findings_table",
    "header",
    "join_inputs",
    "message_view",
    "page",
    "pager",
    "payload_view",
    "projections_view",
    "row",
    "status_text",
    "stream_view",
    "streams_view",
    "table",
    "verify_view",
]

PAYLOAD_PREVIEW: Final = 4000
_VERIFY_OFFLINE: Final = "ares-events verify-proof proof.json --vkey VKEY"
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
    signer: str | None = None
    """``<name>+<key id>`` of the approver key actions are signed with (never the key)."""


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
    mode = "actions enabled" if chrome.actions else "read-only"
    nav = el(
        "nav",
        el("span", "ares-events", cls="brand"),
        [link(name, href, cls="on" if href == active else None) for name, href in NAV],
        el("span", chrome.store_url, cls="store", title="store (redacted)"),
        el("span", mode, cls="mode actions" if chrome.actions else "mode"),
        el("span", "signs as ", el("code", chrome.signer), cls="mode actions", id="signer")
        if chrome.signer
        else None,
    )
    flags = {"data_live": "1" if live else None, "data_poll": "1" if poll else None}
    main = el("main", body, id="main", **flags, data_position=str(position))
    return Markup(
        "<!DOCTYPE html>"
        + el(
            "html",
            el(
                "head",
                el("meta", charset="utf-8"),
                el("meta", name="viewport", content="width=device-width, initial-scale=1"),
                el("title", f"{title} · ares-events"),
                el("link", rel="icon", href="./static/favicon.svg"),
                el("link", rel="stylesheet", href="./static/console.css"),
                el("script", src="./static/console.js", defer=True),
            ),
            el("body", nav, main),
            lang="en",
        )
    )


def findings_table(findings: list[Finding], limit: int = 50) -> Markup:
    if not findings:
        return Markup("")
    rows = [
        row(f.kind, "store" if f.stream_id is None else f.stream_id, f.version, f.detail)
        for f in findings[:limit]
    ]
    more = len(findings) - limit
    caption = el("caption", f"{more} more finding(s) not shown") if more > 0 else None
    return table(("finding", "stream", "v", "detail"), rows, caption, cls="findings")


def header(*names: str) -> Markup:
    """A table's row of column names."""
    return el("tr", [el("th", h) for h in names])


def row(*cells: Any, **attrs: Any) -> Markup:
    """A table row with a ``<td>`` of each cell (a cell already made with ``el("td", ...)``,
    for its attributes, stays as it is)."""
    tds = [c if isinstance(c, Markup) and c.startswith("<td") else el("td", c) for c in cells]
    return el("tr", tds, **attrs)


def table(columns: tuple[str, ...], rows: Any, *more: Any, **attrs: Any) -> Markup:
    """A table: a head row of ``columns``, a body of ``rows``, then ``more`` children."""
    return el("table", el("thead", header(*columns)), el("tbody", rows), *more, **attrs)


def pager(*parts: Any) -> Markup:
    """The paging line: ``parts`` (a part may be None) apart by spaces."""
    return el("p", [x for p in parts for x in (" ", p)][1:], cls="pager")


def status_text(ok: bool, text: str | None = None) -> Markup:
    return el("span", text or ("verified" if ok else "FINDINGS"), cls="ok" if ok else "bad")


def message_view(title: str, text: str) -> Markup:
    """A page that only says something (not found, refused, done)."""
    return el("section", el("h1", title), el("p", text, cls="message"))


def streams_view(rows: list[StreamRow], prefix: str, after: str, next_after: str | None) -> Markup:
    """The streams list: a prefix search and one page."""
    box = el("input", type="search", name="prefix", value=prefix, id="prefix")
    form = el(
        "form",
        el("label", "prefix ", box),
        el("button", "search", type="submit"),
        method="get",
        action="./streams",
        cls="search",
    )
    body = [
        row(
            el("td", link(r.stream_id, "/stream", {"id": r.stream_id}), cls="sid"),
            el("span", r.kind, cls=f"kind k-{r.kind.split()[0]}"),
            el("td", r.version, cls="num"),
            el("td", r.head.hex()[:16], cls="hash", title=r.head.hex()),
            r.last_at,
        )
        for r in rows
    ]
    listing = table(("stream", "kind", "version", "head", "last write"), body, id="streams")
    nxt = {"prefix": prefix, "after": next_after}
    more = link("next page →", "/streams", nxt, id="next") if next_after is not None else None
    pages = pager(
        link("first page", "/streams", {"prefix": prefix}) if after else None,
        more or el("span", "end of the list", cls="dim"),
    )
    empty = el("p", "no stream matches", cls="dim") if not rows else None
    return el("section", el("h1", "Streams"), form, listing, empty, pages)


def _payload(e: RecordedEvent) -> Markup:
    ref, where = e.payload_ref, {"id": e.stream_id, "v": e.version}
    if e.payload_erased:
        return el("span", "erased", cls="erased", title="the payload was erased; its digest stays")
    if ref is not None:
        fetch = link("fetch", "/payload", where, cls="fetch")
        return el("span", f"spilled blob, {ref.size} bytes ", fetch, cls="spilled")
    text = json_text(e.payload)
    if len(text) <= 120 and "\n" not in text.strip():
        return el("code", text)
    preview = el("pre", json_text(e.payload, limit=PAYLOAD_PREVIEW))
    whole = link("whole payload", "/payload", where) if len(text) > PAYLOAD_PREVIEW else None
    return el("details", el("summary", f"{e.payload_size} bytes"), preview, whole)


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
        row(
            el("td", e.version, cls="num"),
            el("td", e.position, cls="num"),
            e.type,
            e.module,
            e.at,
            el("td", e.hash.hex()[:12], cls="hash", title=e.hash.hex()),
            el("td", _payload(e), cls="payload"),
            id=f"v{e.version}",
        )
        for e in events
    ]
    end = start + len(events)
    at = {"id": stream_id}
    nav = pager(
        link("← previous", "/stream", {**at, "from": max(1, start - per_page)})
        if start > 1
        else None,
        el("span", f"versions {start}–{end - 1} of {version}", cls="dim"),
        link("next →", "/stream", {**at, "from": end}, id="next") if end <= version else None,
        link("last page", "/stream", {**at, "from": max(1, version - per_page + 1)}),
    )
    status = el(
        "p",
        "page chain: ",
        status_text(chain.ok),
        f" ({chain.checked} events from the link before them"
        + (", head compared)" if chain.at_head else ")"),
        " · ",
        link("verify the whole stream", "/verify", {"id": stream_id}),
        " · ",
        link("run timeline", "/run", {"id": stream_id})
        if events and events[0].version == 1 and events[0].type == "run.started"
        else None,
        id="chain",
    )
    snap_rows = [
        row(
            s.projection,
            s.projection_version,
            s.at_version,
            s.state_size,
            s.created_at.isoformat(),
            s.problem,
        )
        for s in snapshots
    ]
    columns = ("projection", "version", "at version", "size", "created", "problem")
    snaps = el("table", el("caption", "snapshots"), header(*columns), snap_rows, id="snapshots")
    return el(
        "section",
        el("h1", "Stream ", el("span", stream_id, cls="sid", id="stream-id")),
        status,
        findings_table(chain.findings),
        nav,
        table(("v", "pos", "type", "module", "at", "hash", "payload"), rows, id="events"),
        snaps if snapshots else el("p", "no snapshots", cls="dim"),
    )


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
    checked = f" {report.events_checked} events checked, head at version {report.head_version}"
    return el(
        "section",
        el("h1", "Chain of ", el("span", report.stream_id, cls="sid")),
        el("p", status_text(report.ok), checked, id="verify"),
        el("p", "first finding: ", str(report.findings[0])) if report.findings else None,
        findings_table(report.findings),
        link("back to the stream", "/stream", {"id": report.stream_id}),
    )


def audit_view(
    chrome: Chrome,
    job: Mapping[str, Any] | None,
    checkpoints: list[tuple[str, int, bytes, str]],
    anchors_note: str | None,
) -> Markup:
    """The audit (start it, see its progress and findings), checkpoints, proofs."""
    deep = el("input", type="checkbox", name="deep", value="1")
    start = el(
        "form",
        join_inputs({"csrf": chrome.csrf}),
        el("label", deep, " deep (blobs and snapshots)"),
        el("button", "run an audit", type="submit", id="audit-start"),
        method="post",
        action="./audit",
        cls="action",
    )
    signed = [
        row(o, el("td", n, cls="num"), el("td", r.hex()[:16], cls="hash", title=r.hex()), at)
        for o, n, r, at in checkpoints
    ]
    listing = el(
        "table", header("origin", "tree size", "root", "signed at"), signed, id="checkpoints"
    )
    none_yet = el("p", "no signed checkpoint yet (ares-events checkpoint --key FILE)", cls="dim")
    proof = el(
        "form",
        el("label", "stream ", el("input", name="stream", required=True)),
        el("label", "version ", el("input", name="version", type="number", min="1", required=True)),
        el("button", "download proof", type="submit"),
        method="get",
        action="./proof",
        cls="action",
    )
    return el(
        "section",
        el("h1", "Integrity"),
        start,
        _audit_state(job),
        el("h2", "Signed checkpoints"),
        listing if checkpoints else none_yet,
        el("p", anchors_note, cls="dim") if anchors_note else None,
        el("h2", "Inclusion proof of one event"),
        proof,
        el("p", "Check it offline: ", el("code", _VERIFY_OFFLINE), cls="dim"),
    )


def _audit_state(job: Mapping[str, Any] | None) -> list[Any]:
    """The audit's progress, failure or result (with its findings)."""
    if job is None:
        return []
    if job.get("error") is not None:
        return [el("p", "audit failed: ", job["error"], cls="bad", id="audit-result")]
    report: AuditReport | None = job.get("report")
    if report is None:
        done, total = job.get("done", 0), job.get("total", 0)
        bar = el("progress", value=str(done), max=str(max(total, 1)))
        return [el("p", f"audit running: {done} of {total} events", bar, id="audit-progress")]
    anchors = "" if report.anchors_checked is None else f", {report.anchors_checked} anchors"
    summary = (
        f" {report.streams_checked} streams, {report.events_checked} events, "
        f"{report.blobs_checked} blobs, {report.snapshots_checked} snapshots{anchors} checked"
        f" (started {job.get('started')})"
    )
    verdict = "clean" if report.ok else f"{len(report.findings)} finding(s)"
    return [
        el("p", status_text(report.ok, verdict), summary, id="audit-result"),
        el("p", "first finding: ", str(report.findings[0])) if report.findings else None,
        findings_table(report.findings),
    ]


def projections_view(metas: list[ProjectionMeta], last: int, lags: Mapping[str, str]) -> Markup:
    """Each read model's position, lag and rebuild state."""
    rows = [
        row(
            m.name,
            *(el("td", n, cls="num") for n in (m.projection_version, m.generation, m.position)),
            el("td", lags.get(m.name, ""), cls="num"),
            m.active_table,
            f"rebuilding into {m.building_table} at position {m.building_position}"
            if m.building_table
            else "",
        )
        for m in metas
    ]
    head = header(
        "read model", "version", "generation", "position", "lag (events)", "table", "rebuild"
    )
    listing = el("table", head, rows, id="projections")
    return el(
        "section",
        el("h1", "Projections"),
        el("p", f"store's last position: {last}", id="last-position"),
        listing if metas else el("p", "no read model registered in this store", cls="dim"),
    )


def join_inputs(values: Mapping[str, str]) -> Markup:
    """Hidden inputs."""
    return Markup("".join(el("input", type="hidden", name=k, value=v) for k, v in values.items()))
