"""The console as an ASGI application (:class:`ConsoleApp`, Starlette routing), with its
rules and no session of its own; mountable anywhere (docs/ui.md).

It may import anything below the console and this package's modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from importlib import resources
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlsplit

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from ares_events.agents.approvals import APPROVAL_REASON, sign_approval
from ares_events.agents.journal_errors import RunNotFound, RunNotRunnable
from ares_events.agents.recording import hash_of
from ares_events.agents.run_info import LIST_STATUSES
from ares_events.agents.runs import cancel_run, pending_call, resolve_step, resume_run
from ares_events.core.store import EventStore
from ares_events.errors import AresError, ConcurrencyError, ConfigError, EventNotFound
from ares_events.integrity.audit import audit
from ares_events.integrity.notes import SigningKey
from ares_events.integrity.verify import verify_stream
from ares_events.projections.tables import read_models, stored_checkpoints
from ares_events.ui import queries, run_views, views
from ares_events.ui.markup import Markup, url, visible

__all__ = ["CSP", "MAX_FORM", "VIA", "ConsoleApp", "Hardened", "refusal"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY_HEADERS: Final = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # same-origin POSTs keep their Origin
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
_STATIC: Final = {
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",  # declared: the browser asks for no /favicon.ico
}
MAX_FORM: Final = 1 << 20
"""The largest request body (bytes) the console accepts; a bigger one is refused unread."""
_FORM_SECONDS: Final = 10.0
_TICK: Final = 0.25
_LIVE_SECONDS: Final = 25.0
_LIVE_STREAMS: Final = 4
_GLANCE_MS: Final = 5000
"""When every live stream is held, how long a further live view waits between looks."""
VIA: Final = "ares-events ui"


class _Refused(Exception):
    def __init__(self, status: HTTPStatus, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


@dataclass(frozen=True, slots=True)
class _Page:
    title: str
    body: Markup
    options: Mapping[str, Any] = field(default_factory=dict)
    status: HTTPStatus = HTTPStatus.OK


def _failed(title: str, heading: str, text: str, status: HTTPStatus) -> _Page:
    return _Page(title, views.message_view(heading, text), status=status)


def refusal(status: HTTPStatus, text: str) -> Response:
    """A page that refuses, for someone who may have no session (it names no store)."""
    no_session = views.Chrome("", False, "")
    body = str(views.page(no_session, "refused", views.message_view(status.phrase, text)))
    return Response(body, status, media_type="text/html; charset=utf-8")


class Hardened:
    """``app`` with the security headers on every response it sends, a body over
    :data:`MAX_FORM` refused before a byte of it is read, and ``Connection: close`` on any
    response sent before the request's body was read whole (the server would otherwise
    read and discard the rest to reuse the connection)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        app = self.app
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        chunked = any(k == b"transfer-encoding" for k, _ in scope["headers"])
        pending = [chunked or (declared is not None and declared.strip(b"0") != b"")]
        try:
            size = int(declared or b"0")
        except ValueError:  # uvicorn refuses it first; another server may not
            size = -1
        if size < 0:
            app = refusal(HTTPStatus.BAD_REQUEST, "bad Content-Length")
        elif size > MAX_FORM:
            app = refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "form too large")

        async def receive_counted() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                pending[0] = False
            return message

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _OURS]
                headers.extend(_SECURITY_HEADERS)
                if pending[0] and not any(k.lower() == b"connection" for k, _ in headers):
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive_counted, send_secured)


_OURS: Final = frozenset(k for k, _ in _SECURITY_HEADERS)


class ConsoleApp:
    """The console's pages over ``store``, as an ASGI application.

    It has no login of its own: serve it behind your authentication (mount it in a
    Starlette or FastAPI app under any path; docs/ui.md shows how), or run
    ``ares-events ui``, which serves it behind a per-start session. Every ``POST`` needs
    the form token (derived from ``secret``) and, when the browser sends ``Origin``, the
    request's own origin. Call :meth:`close` when your service stops (a mounted app gets
    no lifespan events of its own).

    Args:
        store: The store to show (open it with ``read_only=True`` unless ``actions``).
        actions: Show and accept the run actions (resolve, resume, cancel).
        anchors: An anchor location URL the Integrity page's audit also checks against.
        workers: Threads that run the store's calls.
        secret: The key the form token is derived from; random when not given. Give the
            same one to every process that serves the console behind one address.
        approver: With ``actions``: the approver key the console signs each resume and
            resolve with (the operator approves, the console signs; the key never travels
            over HTTP and pages show only its name and id). Without it, a run paused for a
            signed approval is not resumed from the console.
        expires_in: Seconds each signed approval is valid.

    Raises:
        ConfigError: an ``approver`` without ``actions``.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        actions: bool = False,
        anchors: str | None = None,
        workers: int = 8,
        secret: str | None = None,
        approver: SigningKey | None = None,
        expires_in: float = 900.0,
    ) -> None:
        self.store = store
        self.actions = actions
        if approver is not None and not actions:
            raise ConfigError("an approver key signs the console's actions: pass actions=True")
        self._approver, self._expires_in, self._anchors = approver, expires_in, anchors
        key = (secret or secrets.token_urlsafe(32)).encode()
        self._csrf = hmac.new(key, b"csrf", hashlib.sha256).hexdigest()
        self._runs = queries.RunCache()
        self._job: dict[str, Any] | None = None
        self._job_lock = threading.Lock()
        self._live = 0  # open live streams; counted on the event loop only
        self.closing = False
        """Set by :meth:`close` (and from a signal handler: a plain attribute is safe there);
        live streams end at their next tick."""
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="ares-ui")
        static = resources.files("ares_events.ui").joinpath("static")
        self._static = {name: static.joinpath(name).read_bytes() for name in _STATIC}
        get: dict[str, Callable[[dict[str, str]], _Page | Response]] = {
            "/": lambda q: _see("./streams"),
            "/streams": self._streams,
            "/stream": self._stream,
            "/payload": self._payload,
            "/verify": self._verify,
            "/runs": self._runs_list,
            "/run": self._run,
            "/diff": self._diff,
            "/integrity": self._integrity,
            "/proof": self._proof,
            "/projections": self._projections,
        }
        routes = [Route(p, self._endpoint(fn), methods=["GET"]) for p, fn in get.items()]
        routes += [
            Route("/audit", self._endpoint(self._audit, form=True), methods=["POST"]),
            Route("/action", self._endpoint(self._action, form=True), methods=["POST"]),
            Route("/live", self._live_stream, methods=["GET"]),
            Route("/static/{name}", self._static_file, methods=["GET"]),
        ]
        self._hardened = Hardened(Router(routes, default=self._not_found))

    def __repr__(self) -> str:
        return f"ConsoleApp(store={self.store.url!r}, actions={self.actions}, signer={self.signer})"

    @property
    def signer(self) -> str | None:
        """``<name>+<key id>`` of the approver key the console signs with, if any."""
        k = self._approver
        return f"{k.name}+{k.verifier.key_id.hex()}" if k is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._hardened(scope, receive, send)

    def close(self) -> None:
        """End live streams at their next tick and stop the worker threads: queued views
        are dropped; one being rendered is not waited for (a whole-stream verify can take
        long), it ends at its next store call once the store is closed."""
        self.closing = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            future = self._pool.submit(fn, *args)
        except RuntimeError:  # closed: a request that came in while the server stopped
            raise _Refused(HTTPStatus.SERVICE_UNAVAILABLE, "the console is stopping") from None
        return await asyncio.wrap_future(future)

    def _live_page(self, live: bool, active: str = "") -> dict[str, Any]:
        """Page options: updated (``live``) as the store's last position moves on from now."""
        return {"live": live, "position": self.store.last_position(), "active": active}

    def _chrome(self) -> views.Chrome:
        return views.Chrome(self.store.url, self.actions, self._csrf, self.signer)

    def _endpoint(
        self, fn: Callable[[dict[str, str]], _Page | Response], *, form: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if form:  # a POST: the whole page, after the form's checks
                    return await self._call(self._render, fn, await self._form(request), False)
                fragment = request.headers.get("x-ares-fragment") == "1"
                return await self._call(self._render, fn, dict(request.query_params), fragment)
            except _Refused as r:
                return refusal(r.status, r.text)

        return endpoint

    async def _form(self, request: Request) -> dict[str, str]:
        ctype = request.headers.get("content-type", "").split(";")[0].strip()
        if ctype != "application/x-www-form-urlencoded":
            raise _Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "forms only")
        origin = request.headers.get("origin")
        host = request.headers.get("host", "").lower()
        if origin is not None and urlsplit(origin).netloc.lower() != host:
            raise _Refused(HTTPStatus.FORBIDDEN, "cross-origin form refused")
        body = bytearray()
        chunks = request.stream().__aiter__()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _FORM_SECONDS
        next_chunk: asyncio.Future[bytes] | None = None
        try:
            while True:
                next_chunk = next_chunk or asyncio.ensure_future(anext(chunks))
                # Looked at every tick, as a live stream does: a stop does not wait out a
                # form still arriving (uvicorn would cancel it with an error logged).
                if not (await asyncio.wait({next_chunk}, timeout=_TICK))[0]:
                    if self.closing:
                        raise _Refused(HTTPStatus.SERVICE_UNAVAILABLE, "the console is stopping")
                    if loop.time() >= deadline:
                        raise _Refused(HTTPStatus.REQUEST_TIMEOUT, "the form came too slowly")
                    continue
                done, next_chunk = next_chunk, None
                body += done.result()
                if len(body) > MAX_FORM:
                    raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "form too large")
        except StopAsyncIteration:
            pass
        except ClientDisconnect:
            raise _Refused(HTTPStatus.BAD_REQUEST, "the form did not arrive") from None
        finally:
            if next_chunk is not None:
                next_chunk.cancel()
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        if not hmac.compare_digest(form.get("csrf", "").encode(), self._csrf.encode()):
            raise _Refused(HTTPStatus.FORBIDDEN, "missing or wrong CSRF token: reload the page")
        return form

    def _render(
        self, fn: Callable[[dict[str, str]], _Page | Response], q: dict[str, str], fragment: bool
    ) -> Response:
        """Run a view on a worker thread; its errors become pages."""
        try:
            out = fn(q)
        except _Refused as r:
            out = _failed("refused", r.status.phrase, r.text, r.status)
        except (RunNotFound, EventNotFound) as exc:
            out = _failed("not found", "Not found", str(exc), HTTPStatus.NOT_FOUND)
        except AresError as exc:
            out = _failed("error", "Error", str(exc), HTTPStatus.BAD_REQUEST)
        except Exception as exc:  # a bug or a driver error: one page
            logger.exception("console: %s failed", visible(fn.__name__, keep=""))
            text = f"{type(exc).__name__} (see the log)"
            out = _failed("error", "Internal error", text, HTTPStatus.INTERNAL_SERVER_ERROR)
        if isinstance(out, Response):
            return out
        html = (
            out.body if fragment else views.page(self._chrome(), out.title, out.body, **out.options)
        )
        return Response(str(html), out.status, media_type="text/html; charset=utf-8")

    async def _not_found(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # none served
            await WebSocketClose()(scope, receive, send)
            return
        await refusal(HTTPStatus.NOT_FOUND, "no such page")(scope, receive, send)

    async def _static_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return refusal(HTTPStatus.NOT_FOUND, "no such file")
        return Response(self._static[name], media_type=_STATIC[name])

    def _streams(self, q: dict[str, str]) -> _Page:
        prefix, after = q.get("prefix", ""), q.get("after", "")
        rows, nxt = queries.stream_rows(self.store, prefix=prefix or None, after=after)
        body = views.streams_view(rows, prefix, after, nxt)
        return _Page("Streams", body, self._live_page(True, "/streams"))

    def _stream(self, q: dict[str, str]) -> _Page:
        store, sid = self.store, _sid(q)
        head = store.head(sid)
        if head is None:
            raise _Refused(HTTPStatus.NOT_FOUND, f"no stream {sid!r}")
        per = queries.EVENTS_PER_PAGE
        events = queries.event_page(store, sid, _int(q, "from", 1), per)
        chain = queries.page_chain(store, sid, events, head)
        snaps: list[Any] = []
        with contextlib.suppress(AresError):  # none in this store: the page says "no snapshots"
            snaps = list(store.snapshots.list(sid))
        body = views.stream_view(sid, head.version, events, chain, snaps, per)
        at_end = not events or events[-1].version >= head.version
        return _Page("Stream", body, self._live_page(at_end))

    def _payload(self, q: dict[str, str]) -> _Page:
        sid, v = _sid(q), _int(q, "v", 1)
        e = queries.event_page(self.store, sid, v, 1)
        if not e or e[0].version != v:
            raise EventNotFound(sid, v)
        error = None
        try:
            if e[0].payload_erased:
                error = "the payload was erased (its digest and size stay in the chain)"
            else:
                _ = e[0].payload
        except AresError as exc:
            error = str(exc)
        return _Page("Payload", views.payload_view(e[0], error))

    def _verify(self, q: dict[str, str]) -> _Page:
        return _Page("Chain", views.verify_view(verify_stream(self.store, _sid(q))))

    def _runs_list(self, q: dict[str, str]) -> _Page:
        status = q.get("status") or None
        if status is not None and status not in LIST_STATUSES:
            raise ConfigError(f"unknown run status {status!r}")
        prefix, after = q.get("prefix") or None, q.get("after", "")
        runs, nxt = queries.run_rows(
            self.store, self._runs, status=status, prefix=prefix, after=after
        )
        body = run_views.runs_view(runs, status or "", prefix or "", after, nxt)
        return _Page("Runs", body, self._live_page(True, "/runs"))

    def _run(self, q: dict[str, str]) -> _Page:
        sid = _sid(q)
        got = self._runs.get(self.store, sid)
        per = queries.STEPS_PER_PAGE
        pages = max(1, -(-got.run.counts.steps // per))
        page_no = min(max(1, _int(q, "page", pages)), pages)  # default: the latest steps
        chunk = queries.steps_page(got.run, page_no, per)
        reqs = queries.load_requests(self.store, sid, chunk)
        asked = queries.approval_request(self.store, got.run)
        body = run_views.run_view(
            self._chrome(), got.run, got.lifecycle, chunk, reqs, page_no, pages, asked
        )
        return _Page("Run", body, self._live_page(page_no == pages))

    def _diff(self, q: dict[str, str]) -> _Page:
        sid, step = _sid(q), _int(q, "step", 1)
        got = self._runs.get(self.store, sid)
        page = queries.steps_page(got.run, queries.page_of_step(got.run, step))
        s = next((x for x in page if x.step == step), None)
        if s is None:
            raise ConfigError(f"run {sid!r} has no step {step}")
        req = queries.load_requests(self.store, sid, [s]).get(step)
        return _Page("Divergence", run_views.diff_view(sid, step, req, q.get("current", "")))

    def _integrity(self, q: dict[str, str]) -> _Page:
        with self._job_lock:
            job = dict(self._job) if self._job is not None else None
        running = job is not None and job.get("report") is None and job.get("error") is None
        note = (
            "the audit also checks the anchors at the location given with --anchors"
            if self._anchors
            else "no anchor location given (ares-events ui --anchors URL): anchors are not checked"
        )
        body = views.audit_view(self._chrome(), job, stored_checkpoints(self.store), note)
        return _Page("Integrity", body, {"poll": running, "active": "/integrity"})

    def _proof(self, q: dict[str, str]) -> Response:
        from ares_events.projections.merkle import MERKLE_PROJECTION, MerkleLog

        sid, version = q.get("stream", ""), _int(q, "version", 1)
        if not sid:
            raise ConfigError("which stream? (stream=...)")
        if not any(m.name == MERKLE_PROJECTION for m in read_models(self.store)):
            raise _Refused(
                HTTPStatus.CONFLICT,
                "this store has no Merkle log yet: sign a checkpoint with "
                "`ares-events checkpoint --key FILE` first",
            )
        # Read-only: a proof of what the log holds against its latest stored checkpoint;
        # with actions allowed, the log is caught up first (as `ares-events prove` does).
        doc = MerkleLog(self.store).prove_event(sid, version, catch_up=self.actions)
        return Response(
            json.dumps(doc, indent=2) + "\n",
            media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="proof-v{version}.json"'},
        )

    def _projections(self, q: dict[str, str]) -> _Page:
        metas = read_models(self.store)
        options = self._live_page(True, "/projections")
        lags = {m.name: _lag(self.store, m.position) for m in metas}
        body = views.projections_view(metas, options["position"], lags)
        return _Page("Projections", body, options)

    async def _live_stream(self, request: Request) -> Response:
        """Server-sent events: the store's last position, whenever it moves (for
        :data:`_LIVE_SECONDS`, then the browser reconnects)."""
        try:
            after = int(request.query_params.get("after") or 0)
        except ValueError:
            return refusal(HTTPStatus.BAD_REQUEST, "after must be a number")
        if self._live >= _LIVE_STREAMS:
            # Every stream is held: this view polls (one look, then the browser comes back
            # after the retry) instead of a 503, which a browser never retries.
            return _Live(self._glance(after), lambda: None)
        self._live += 1
        return _Live(self._events(after), self._live_ended)

    async def _glance(self, pos: int) -> Any:
        yield f"retry: {_GLANCE_MS}\n\n".encode()
        with contextlib.suppress(_Refused):
            last = await self._call(self.store.last_position)
            if last != pos:
                yield f"event: position\ndata: {last}\n\n".encode()

    def _live_ended(self) -> None:
        self._live -= 1

    async def _events(self, pos: int) -> Any:
        yield b"retry: 1000\n\n"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _LIVE_SECONDS
        try:
            while loop.time() < deadline and not self.closing:
                last = await self._call(self.store.last_position)
                if last != pos:
                    pos = last
                    yield f"event: position\ndata: {pos}\n\n".encode()
                else:
                    yield b": idle\n\n"
                await self._call(self.store.wait_for, pos, 1.0)
        except _Refused:
            return  # closed: the browser reconnects to whatever serves next

    def _audit(self, form: dict[str, str]) -> Response:
        deep = form.get("deep") == "1"
        with self._job_lock:
            if self._job is not None and not ({"report", "error"} & self._job.keys()):
                return _see("./integrity")  # one audit at a time
            started = datetime.now(UTC).isoformat(timespec="seconds")
            job: dict[str, Any] = {"started": started, "done": 0, "total": 0}
            self._job = job

        def progress(done: int, total: int) -> None:
            with self._job_lock:
                job["done"], job["total"] = done, total

        def work() -> None:
            try:
                rep = audit(self.store, deep=deep, progress=progress, anchors=self._anchors)
                with self._job_lock:
                    job["report"] = rep
            except Exception as exc:  # shown on the page; the console keeps serving
                with self._job_lock:
                    job["error"] = f"{type(exc).__name__}: {exc}"

        threading.Thread(target=work, name="ares-ui-audit", daemon=True).start()
        return _see("./integrity")

    def _action(self, form: dict[str, str]) -> Response:
        if not self.actions:
            raise _Refused(HTTPStatus.FORBIDDEN, "read-only console: start it with --allow-actions")
        store = self.store
        action, sid = form.get("action", ""), _sid(form)
        by = form.get("by", "").strip()
        reason = form.get("reason", "").strip() or None
        if not by:
            raise ConfigError("say who acts (by)")
        version, now = _int(form, "version", 0), store.stream_version(sid)
        if now != version:
            raise ConcurrencyError(
                sid, version, now, "the run changed since the page was shown: reload it"
            )
        via = f"{VIA} {action}"
        try:
            if action == "resume":
                waiting = (self._runs.get(store, sid).run.interrupt or {}).get("reason")
                if waiting == APPROVAL_REASON and self._approver is None:
                    raise _Refused(HTTPStatus.FORBIDDEN, _NO_KEY)
                signed = self._sign(sid, version, None, "approve", None)
                resume_run(store, sid, by=by, reason=reason, via=via, **signed)
            elif action == "cancel":
                cancel_run(store, sid, by=by, reason=reason, via=via)
            elif action == "resolve":
                step = _int(form, "step", 0)
                if form.get("not_done") == "1":
                    outcome: dict[str, Any] = {"not_done": True}
                    signed = self._sign(sid, version, step, "not_done", None)
                else:
                    try:
                        outcome = {"result": json.loads(form.get("result", ""))}
                    except ValueError:
                        raise ConfigError("the result must be JSON") from None
                    digest = hash_of(outcome["result"], "result")
                    signed = self._sign(sid, version, step, "result", digest)
                resolve_step(store, sid, step, by=by, reason=reason, via=via, **outcome, **signed)
            else:
                raise _Refused(HTTPStatus.BAD_REQUEST, f"unknown action {action!r}")
        except RunNotRunnable as exc:
            raise ConfigError(str(exc)) from exc
        logger.info("console action %s on a run by %s", action, visible(by, keep=""))
        return _see(url("/run", {"id": sid}))

    def _sign(
        self, sid: str, version: int, step: int | None, action: str, outcome: str | None
    ) -> dict[str, Any]:
        """The approval the operator gives by this action, signed with the console's key
        (nothing without one), against the run as the page showed it: a run that moved
        since is refused, so the signature never covers what the operator did not see."""
        key = self._approver
        if key is None:
            return {}
        pending = pending_call(self.store, sid, step)
        shown = queries.event_page(self.store, sid, version, 1)
        if not shown or shown[0].version != version or shown[0].hash != pending.head:
            raise ConcurrencyError(
                sid, version, self.store.stream_version(sid), "the run changed: reload it"
            )
        note = sign_approval(
            key, pending, action=action, outcome=outcome, expires_in=self._expires_in
        )
        return {"approval": note, "approvers": [key.verifier]}


_NO_KEY: Final = (
    "this run waits for a signed approval and this console holds no approver key: start "
    "it with --allow-actions --key FILE (keygen NAME --approver), or approve with "
    "`ares-events runs resume RUN --key FILE`"
)


class _Live(StreamingResponse):
    """An event stream that gives its slot back however it ends (done, client gone,
    server stopping)."""

    def __init__(self, events: Any, ended: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream; charset=utf-8")
        self._ended = ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ended()


def _see(location: str) -> Response:
    """303 to a URL relative to the page asked for (all pages are one level deep)."""
    return Response(status_code=HTTPStatus.SEE_OTHER, headers={"Location": location})


def _sid(q: Mapping[str, str]) -> str:
    sid = q.get("id", "")
    if not sid:
        raise ConfigError("which stream? (id=...)")
    return sid


def _int(q: Mapping[str, str], name: str, default: int) -> int:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


def _lag(store: EventStore, position: int, cap: int = 10_000) -> str:
    n = sum(1 for _ in store.read_all(after_position=position, limit=cap + 1))
    return f"{cap}+" if n > cap else str(n)
