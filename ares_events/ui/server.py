"""The console's HTTP server: the standard library's, a small pool of worker threads, one
store opened read-only unless actions are allowed.

Security, in the order a request meets it:

* the ``Host`` header must name this server (no DNS rebinding);
* every page needs the session cookie, set by the URL printed at start (``?token=``, a
  random per-start secret, compared in constant time, then dropped from the address bar);
* ``POST`` only for what starts work (an audit) or acts (``--allow-actions``), with a CSRF
  token derived from the session and a same-origin ``Origin`` when the browser sends one;
* every response carries a strict Content-Security-Policy (``default-src 'none'``, script
  and style from this origin only, no ``unsafe-inline``), ``nosniff``, no referrer, no
  framing and ``no-store``;
* the access log shows the path without its query (the token is never logged).

It may import anything below the console and this package's modules.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib import resources
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from ares_events.agents.journal_errors import RunNotFound, RunNotRunnable
from ares_events.agents.run_info import LIST_STATUSES
from ares_events.agents.runs import cancel_run, resolve_step, resume_run
from ares_events.core.store import EventStore
from ares_events.errors import AresError, ConcurrencyError, ConfigError, EventNotFound
from ares_events.integrity.audit import audit
from ares_events.integrity.verify import verify_stream
from ares_events.projections.status import read_models, stored_checkpoints
from ares_events.ui import queries, run_views, views
from ares_events.ui.markup import Markup

__all__ = ["CSP", "ConsoleServer", "ConsoleState"]

logger = logging.getLogger(__name__)

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_COOKIE: Final = "ares_console"
"""The session cookie's name is this plus ``_<port>``: cookies are per host, not per
port, and two consoles on one host must not log each other out."""
_STATIC: Final = {
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
}
_MAX_BODY: Final = 1 << 20
_LIVE_SECONDS: Final = 25.0
_LIVE_STREAMS: Final = 4
VIA: Final = "ares-events ui"


@dataclass
class ConsoleState:
    """What the request handlers share."""

    store: EventStore
    actions: bool
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    runs: queries.RunCache = field(default_factory=queries.RunCache)
    job: dict[str, Any] | None = None
    job_lock: threading.Lock = field(default_factory=threading.Lock)
    live: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(_LIVE_STREAMS)
    )
    hosts: frozenset[str] = frozenset()
    cookie: str = _COOKIE
    """The session cookie's name (per port: see :data:`_COOKIE`)."""
    authed: threading.local = field(default_factory=threading.local, repr=False)
    anchors: str | None = field(default=None, repr=False)
    """A witness URL the audit checks anchors against (may name a bucket: not shown)."""
    stopping: threading.Event = field(default_factory=threading.Event)

    def __repr__(self) -> str:  # the token is a secret
        return f"ConsoleState(store={self.store.url!r}, actions={self.actions})"

    @property
    def csrf(self) -> str:
        """The form token of this session (derived, so it proves nothing on its own)."""
        return hmac.new(self.token.encode(), b"csrf", hashlib.sha256).hexdigest()

    def chrome(self) -> views.Chrome:
        """The layout's values (a visitor without a session is not told which store)."""
        if not getattr(self.authed, "ok", False):
            return views.Chrome("", False, "")
        return views.Chrome(self.store.url, self.actions, self.csrf)


class _Pool(HTTPServer):
    """An HTTP server whose requests run on a fixed pool of threads (a store keeps one
    connection per thread: a thread per request would open a connection per request)."""

    daemon_threads = True

    def __init__(self, addr: tuple[str, int], handler: Any, workers: int) -> None:
        super().__init__(addr, handler)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="ares-ui")

    def process_request(self, request: Any, client_address: Any) -> None:
        self.pool.submit(self._work, request, client_address)

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)


class _Refused(Exception):
    def __init__(self, status: HTTPStatus, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class _Handler(BaseHTTPRequestHandler):
    server_version = "ares-events-ui"
    sys_version = ""
    state: ConsoleState  # set on the subclass made per server

    # -- plumbing ----------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        # The query may hold the session token: only the path is logged.
        # (its arguments may quote the raw request line, query and all: not logged)
        path = urlsplit(getattr(self, "path", "") or "").path
        logger.info("%s %s: refused by the HTTP layer", getattr(self, "command", "-"), path)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        logger.info("%s %s -> %s", self.command, urlsplit(self.path).path, code)

    def _headers(
        self, status: HTTPStatus, ctype: str, length: int | None = None, **extra: str
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "same-origin")  # same-origin POSTs keep their Origin
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        for k, v in extra.items():
            self.send_header(k.replace("_", "-"), v)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send(self, status: HTTPStatus, body: bytes, ctype: str, **extra: str) -> None:
        self._headers(status, ctype, len(body), **extra)
        if self.command != "HEAD":
            self.wfile.write(body)

    def _html(
        self, title: str, body: Markup, *, status: HTTPStatus = HTTPStatus.OK, **kw: Any
    ) -> None:
        if self.headers.get("X-Ares-Fragment") == "1":
            out = str(body)
        else:
            out = str(views.page(self.state.chrome(), title, body, **kw))
        self._send(status, out.encode("utf-8"), "text/html; charset=utf-8")

    def _redirect(self, location: str, **extra: str) -> None:
        self._headers(
            HTTPStatus.SEE_OTHER, "text/plain; charset=utf-8", 0, Location=location, **extra
        )

    def _check_host(self) -> None:
        host = (self.headers.get("Host") or "").lower()
        if host not in self.state.hosts:
            raise _Refused(HTTPStatus.MISDIRECTED_REQUEST, "unknown Host")

    def _session_ok(self) -> bool:
        raw = self.headers.get("Cookie") or ""
        for part in raw.split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.state.cookie and hmac.compare_digest(
                value.encode(), self.state.token.encode()
            ):
                return True
        return False

    # -- entry points ------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self._dispatch(post=False)

    def do_POST(self) -> None:
        self._dispatch(post=True)

    def _dispatch(self, *, post: bool) -> None:
        parts = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        self.state.authed.ok = False
        try:
            self._check_host()
            if parts.path.startswith("/static/"):
                return self._static(parts.path.removeprefix("/static/"))
            token = q.pop("token", None)
            if token is not None and not post:
                if not hmac.compare_digest(token.encode(), self.state.token.encode()):
                    raise _Refused(
                        HTTPStatus.FORBIDDEN, "wrong token: open the URL the console printed"
                    )
                cookie = (
                    f"{self.state.cookie}={self.state.token}; HttpOnly; SameSite=Strict; Path=/"
                )
                return self._redirect(views.href(parts.path, q), Set_Cookie=cookie)
            if not self._session_ok():
                raise _Refused(
                    HTTPStatus.FORBIDDEN,
                    "no console session: open the URL that `ares-events ui` printed "
                    "(it holds the token)",
                )
            self.state.authed.ok = True
            if post:
                form = self._form()
                return self._post(parts.path, form)
            return self._get(parts.path, q)
        except _Refused as r:
            self._html("refused", views.message_view(r.status.phrase, r.text), status=r.status)
        except (RunNotFound, EventNotFound) as exc:
            self._html(
                "not found", views.message_view("Not found", str(exc)), status=HTTPStatus.NOT_FOUND
            )
        except AresError as exc:
            self._html(
                "error", views.message_view("Error", str(exc)), status=HTTPStatus.BAD_REQUEST
            )
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a bug or a driver error: one page, the console keeps serving
            logger.exception("console: %s %s failed", self.command, parts.path)
            with contextlib.suppress(OSError):
                self._html(
                    "error",
                    views.message_view("Internal error", f"{type(exc).__name__} (see the log)"),
                    status=HTTPStatus.INTERNAL_SERVER_ERROR,
                )

    def _form(self) -> dict[str, str]:
        if (
            self.headers.get("Content-Type", "").split(";")[0].strip()
            != "application/x-www-form-urlencoded"
        ):
            raise _Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "forms only")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _Refused(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if length > _MAX_BODY:
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "form too large")
        origin = self.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc.lower() not in self.state.hosts:
            raise _Refused(HTTPStatus.FORBIDDEN, "cross-origin form refused")
        body = self.rfile.read(length).decode("utf-8", "replace")
        form = {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}
        if not hmac.compare_digest(form.get("csrf", "").encode(), self.state.csrf.encode()):
            raise _Refused(HTTPStatus.FORBIDDEN, "missing or wrong CSRF token: reload the page")
        return form

    def _static(self, name: str) -> None:
        if name not in _STATIC:
            raise _Refused(HTTPStatus.NOT_FOUND, "no such file")
        data = resources.files("ares_events.ui").joinpath("static", name).read_bytes()
        self._send(HTTPStatus.OK, data, _STATIC[name])

    # -- GET views ---------------------------------------------------------------------------

    def _get(self, path: str, q: dict[str, str]) -> None:
        st = self.state
        store = st.store
        if path == "/":
            return self._redirect("/streams")
        if path == "/live":
            return self._live(q)
        if path == "/streams":
            rows, nxt = queries.stream_rows(
                store, prefix=q.get("prefix") or None, after=q.get("after", "")
            )
            body = views.streams_view(rows, q.get("prefix", ""), q.get("after", ""), nxt)
            return self._html(
                "Streams", body, live=True, position=store.last_position(), active="/streams"
            )
        if path == "/stream":
            return self._stream(q)
        if path == "/payload":
            sid, v = _sid(q), _int(q, "v", 1)
            e = queries.event_page(store, sid, v, 1)
            if not e or e[0].version != v:
                raise EventNotFound(sid, v)
            error = (
                "the payload was erased (its digest and size stay in the chain)"
                if e[0].payload_erased
                else None
            )
            try:
                if error is None:
                    _ = e[0].payload
            except AresError as exc:
                error = str(exc)
            return self._html("Payload", views.payload_view(e[0], error))
        if path == "/verify":
            rep = verify_stream(store, _sid(q))
            return self._html("Chain", views.verify_view(rep))
        if path == "/runs":
            status = q.get("status") or None
            if status is not None and status not in LIST_STATUSES:
                raise ConfigError(f"unknown run status {status!r}")
            runs, nxt = queries.run_rows(
                store,
                st.runs,
                status=status,
                prefix=q.get("prefix") or None,
                after=q.get("after", ""),
            )
            body = run_views.runs_view(
                runs, status or "", q.get("prefix", ""), q.get("after", ""), nxt
            )
            return self._html(
                "Runs", body, live=True, position=store.last_position(), active="/runs"
            )
        if path == "/run":
            return self._run(q)
        if path == "/diff":
            sid, step = _sid(q), _int(q, "step", 1)
            got = st.runs.get(store, sid)
            page = queries.steps_page(got.run, queries.page_of_step(got.run, step))
            s = next((x for x in page if x.step == step), None)
            if s is None:
                raise ConfigError(f"run {sid!r} has no step {step}")
            req = queries.load_requests(store, sid, [s]).get(step)
            return self._html(
                "Divergence", run_views.diff_view(sid, step, req, q.get("current", ""))
            )
        if path == "/integrity":
            with st.job_lock:
                job = dict(st.job) if st.job is not None else None
            running = job is not None and job.get("report") is None and job.get("error") is None
            note = (
                "the audit also checks the anchors of the witness given with --anchors"
                if st.anchors
                else "no witness given (ares-events ui --anchors URL): anchors are not checked"
            )
            body = views.audit_view(st.chrome(), job, stored_checkpoints(store), note)
            return self._html("Integrity", body, poll=running, active="/integrity")
        if path == "/proof":
            return self._proof(q)
        if path == "/projections":
            metas = read_models(store)
            last = store.last_position()
            lags = {m.name: _lag(store, m.position) for m in metas}
            body = views.projections_view(metas, last, lags)
            return self._html("Projections", body, live=True, position=last, active="/projections")
        raise _Refused(HTTPStatus.NOT_FOUND, "no such page")

    def _stream(self, q: dict[str, str]) -> None:
        store = self.state.store
        sid = _sid(q)
        head = store.head(sid)
        if head is None:
            raise _Refused(HTTPStatus.NOT_FOUND, f"no stream {sid!r}")
        per = queries.EVENTS_PER_PAGE
        start = _int(q, "from", 1)
        events = queries.event_page(store, sid, start, per)
        chain = queries.page_chain(store, sid, events, head)
        snaps: list[Any] = []
        with contextlib.suppress(AresError):
            snaps = list(store.snapshots.list(sid))
        body = views.stream_view(sid, head.version, events, chain, snaps, per)
        at_end = not events or events[-1].version >= head.version
        self._html("Stream", body, live=at_end, position=store.last_position())

    def _run(self, q: dict[str, str]) -> None:
        st = self.state
        sid = _sid(q)
        got = st.runs.get(st.store, sid)
        per = queries.STEPS_PER_PAGE
        pages = max(1, -(-got.run.step_count // per))
        page_no = min(max(1, _int(q, "page", pages)), pages)  # default: the latest steps
        chunk = queries.steps_page(got.run, page_no, per)
        reqs = queries.load_requests(st.store, sid, chunk)
        body = run_views.run_view(st.chrome(), got.run, got.lifecycle, chunk, reqs, page_no, pages)
        self._html("Run", body, live=page_no == pages, position=st.store.last_position())

    def _proof(self, q: dict[str, str]) -> None:
        from ares_events.projections.merkle import MERKLE_PROJECTION, MerkleLog

        store = self.state.store
        sid, version = q.get("stream", ""), _int(q, "version", 1)
        if not sid:
            raise ConfigError("which stream? (stream=...)")
        if not any(m.name == MERKLE_PROJECTION for m in read_models(store)):
            raise _Refused(
                HTTPStatus.CONFLICT,
                "this store has no Merkle log yet: sign a checkpoint with "
                "`ares-events checkpoint --key FILE` first",
            )
        # Read-only: a proof of what the log holds against its latest stored checkpoint;
        # with actions allowed, the log is caught up first (as `ares-events prove` does).
        doc = MerkleLog(store).prove_event(sid, version, catch_up=self.state.actions)
        data = (json.dumps(doc, indent=2) + "\n").encode()
        name = f"proof-v{version}.json"
        self._send(
            HTTPStatus.OK,
            data,
            "application/json",
            Content_Disposition=f'attachment; filename="{name}"',
        )

    def _live(self, q: dict[str, str]) -> None:
        """Server-sent events: the store's last position, whenever it moves (for
        :data:`_LIVE_SECONDS`, then the browser reconnects)."""
        st = self.state
        if not st.live.acquire(blocking=False):
            raise _Refused(HTTPStatus.SERVICE_UNAVAILABLE, "too many live views")
        try:
            self._headers(HTTPStatus.OK, "text/event-stream; charset=utf-8")
            pos = _int(q, "after", 0)
            self.wfile.write(b"retry: 1000\n\n")
            deadline = time.monotonic() + _LIVE_SECONDS
            while time.monotonic() < deadline and not st.stopping.is_set():
                last = st.store.last_position()
                if last != pos:
                    pos = last
                    self.wfile.write(f"event: position\ndata: {pos}\n\n".encode())
                else:
                    self.wfile.write(b": idle\n\n")
                self.wfile.flush()
                st.store.wait_for(pos, 1.0)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            st.live.release()

    # -- POST --------------------------------------------------------------------------------

    def _post(self, path: str, form: dict[str, str]) -> None:
        if path == "/audit":
            self._start_audit(form.get("deep") == "1")
            return self._redirect("/integrity")
        if path == "/action":
            return self._action(form)
        raise _Refused(HTTPStatus.NOT_FOUND, "no such action")

    def _start_audit(self, deep: bool) -> None:
        st = self.state
        with st.job_lock:
            if st.job is not None and st.job.get("report") is None and st.job.get("error") is None:
                return  # one audit at a time
            job: dict[str, Any] = {
                "started": datetime.now(UTC).isoformat(timespec="seconds"),
                "done": 0,
                "total": 0,
            }
            st.job = job

        def progress(done: int, total: int) -> None:
            with st.job_lock:
                job["done"], job["total"] = done, total

        def work() -> None:
            try:
                rep = audit(st.store, deep=deep, progress=progress, anchors=st.anchors)
                with st.job_lock:
                    job["report"] = rep
            except Exception as exc:  # shown on the page; the console keeps serving
                with st.job_lock:
                    job["error"] = f"{type(exc).__name__}: {exc}"

        threading.Thread(target=work, name="ares-ui-audit", daemon=True).start()

    def _action(self, form: dict[str, str]) -> None:
        st = self.state
        if not st.actions:
            raise _Refused(HTTPStatus.FORBIDDEN, "read-only console: start it with --allow-actions")
        action, sid = form.get("action", ""), _sid(form)
        by = form.get("by", "").strip()
        reason = form.get("reason", "").strip() or None
        if not by:
            raise ConfigError("say who acts (by)")
        version = _int(form, "version", 0)
        if st.store.stream_version(sid) != version:
            raise ConcurrencyError(
                sid,
                version,
                st.store.stream_version(sid),
                "the run changed since the page was shown: reload it",
            )
        via = f"{VIA} {action}"
        try:
            if action == "resume":
                resume_run(st.store, sid, by=by, reason=reason, via=via)
            elif action == "cancel":
                cancel_run(st.store, sid, by=by, reason=reason, via=via)
            elif action == "resolve":
                step = _int(form, "step", 0)
                if form.get("not_done") == "1":
                    resolve_step(st.store, sid, step, not_done=True, by=by, reason=reason, via=via)
                else:
                    try:
                        result = json.loads(form.get("result", ""))
                    except ValueError:
                        raise ConfigError("the result must be JSON") from None
                    resolve_step(st.store, sid, step, result=result, by=by, reason=reason, via=via)
            else:
                raise _Refused(HTTPStatus.BAD_REQUEST, f"unknown action {action!r}")
        except RunNotRunnable as exc:
            raise ConfigError(str(exc)) from exc
        logger.info("console action %s on a run by %s", action, by)
        self._redirect(views.href("/run", {"id": sid}))


def _sid(q: dict[str, str]) -> str:
    sid = q.get("id", "")
    if not sid:
        raise ConfigError("which stream? (id=...)")
    return sid


def _int(q: dict[str, str], name: str, default: int) -> int:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


def _lag(store: EventStore, position: int, cap: int = 10_000) -> str:
    n = 0
    for _ in store.read_all(after_position=position, limit=cap + 1):
        n += 1
    return f"{cap}+" if n > cap else str(n)


class ConsoleServer:
    """The console bound to ``host:port`` over ``store`` (:meth:`serve_forever` blocks;
    :meth:`start` serves on a thread, for tests and embedding)."""

    def __init__(
        self,
        store: EventStore,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        actions: bool = False,
        workers: int = 8,
        anchors: str | None = None,
    ) -> None:
        self.state = ConsoleState(store=store, actions=actions, anchors=anchors)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.httpd = _Pool((host, port), handler, workers)
        addr = self.httpd.server_address
        self.host: str = addr[0] if isinstance(addr[0], str) else addr[0].decode()
        self.port = int(addr[1])
        names = {str(self.host), "localhost", "127.0.0.1", "[::1]"}
        self.state.hosts = frozenset(f"{n}:{self.port}".lower() for n in names)
        self.state.cookie = f"{_COOKIE}_{self.port}"
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"ConsoleServer({self.base_url!r}, actions={self.state.actions})"

    @property
    def base_url(self) -> str:
        """The address, without the token."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def login_url(self) -> str:
        """The address to open: it holds the session token (print it only to the user)."""
        return f"{self.base_url}/?token={self.state.token}"

    def serve_forever(self) -> None:
        """Serve until :meth:`close` (or Ctrl-C)."""
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> ConsoleServer:
        """Serve on a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name="ares-ui", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving (live streams end at their next tick) and free the port."""
        self.state.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd.pool.shutdown(wait=True, cancel_futures=True)
        if self._thread is not None:
            self._thread.join(timeout=10)
