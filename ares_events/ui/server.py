"""``ares-events ui``'s server: :class:`.ConsoleApp` behind a per-start session (secret
path prefix, session cookie, ``Host`` check), served by uvicorn on one socket; the layers
are in docs/ui.md.

It may import anything below the console and this package's modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import secrets
import socket
import threading
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode

import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from ares_events.core.store import EventStore
from ares_events.integrity.notes import SigningKey
from ares_events.ui.app import ConsoleApp, Hardened, refusal
from ares_events.ui.markup import visible

__all__ = ["HEAD_TIMEOUT", "MAX_HEAD", "MAX_TARGET", "ConsoleServer"]

logger = logging.getLogger(__name__)

# The session cookie's name is this plus "_<port>" (its path already differs per start;
# the port in the name tells a user which console a cookie is for).
_COOKIE: Final = "ares_console"
HEAD_TIMEOUT: Final = 10.0
"""Seconds a connection has to send a whole request head (first, or after a response)."""
MAX_TARGET: Final = 64 * 1024
"""The longest request target (path and query, bytes) a request may name: a 414 beyond."""
MAX_HEAD: Final = MAX_TARGET + 32 * 1024
"""The largest request head the server buffers before answering 400 (a target of
:data:`MAX_TARGET` and some headers)."""
_MAX_CONNECTIONS: Final = 1000  # beyond this many open connections: a 503 at once
_STOP_SECONDS: Final = 2  # a stop waits this long for responses in flight, then cancels them


class _Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (h11) with a deadline for each request head: uvicorn
    times out a keep-alive connection only after a response, not one that never sends a
    whole request (idle or slow clients would hold their socket forever). Its access
    log is off: it would print the query (the token) and the raw path."""

    head_timeout: float = HEAD_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access_log = False
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._deadline()

    def on_response_complete(self) -> None:
        done = self.cycle
        # uvicorn may start a pipelined request in here: the deadline waits for a head
        # after the one just answered, not for the response already under way.
        super().on_response_complete()
        self._deadline(done)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _deadline(self, waiting_after: Any = None) -> None:
        # A new request head replaces self.cycle: if it is still the same object when the
        # timer fires, no whole head arrived in time.

        def expire() -> None:
            if self.cycle is waiting_after and not self.transport.is_closing():
                self.transport.close()

        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_timeout, expire)


class _Server(uvicorn.Server):
    """uvicorn's server; a SIGINT or SIGTERM it catches also ends the live streams, so a
    stop does not wait for them."""

    def __init__(self, config: uvicorn.Config, app: ConsoleApp) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._app.closing = True
        super().handle_exit(sig, frame)


class _Gate:
    """The console's front door when it runs as its own server: Host, version, target
    length, the secret prefix and the session cookie."""

    def __init__(
        self, app: ASGIApp, *, prefix: str, token: str, cookie: str, hosts: frozenset[str]
    ) -> None:
        self.app, self.prefix, self.cookie, self.hosts = app, prefix, cookie, hosts
        self._token = token.encode()

    def __repr__(self) -> str:  # the prefix and the token are secrets
        return f"_Gate(hosts={sorted(self.hosts)})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off and websockets are not served
            return
        await self._decide(scope)(scope, receive, send)

    def _decide(self, scope: Scope) -> ASGIApp:
        headers = dict(scope["headers"])  # h11 has lower-cased the names
        if scope["http_version"] not in ("1.0", "1.1"):
            return refusal(HTTPStatus.BAD_REQUEST, "HTTP/1.0 and HTTP/1.1 only")
        target = len(scope["raw_path"]) + len(scope["query_string"])
        if target > MAX_TARGET:
            return refusal(HTTPStatus.REQUEST_URI_TOO_LONG, "address too long")
        # h11 bounds only a head still incomplete: one that completes in the read crossing
        # MAX_HEAD is parsed whole. Its size (each header line with ": " and CRLF) decides.
        if target + sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > MAX_HEAD:
            return refusal(HTTPStatus.BAD_REQUEST, "request head too large")
        host = headers.get(b"host", b"").decode("latin-1").lower()
        if host not in self.hosts and host != _arrival(scope):
            return refusal(HTTPStatus.MISDIRECTED_REQUEST, "unknown Host")
        path: str = scope["path"]
        if path == self.prefix:
            return Response(status_code=HTTPStatus.SEE_OTHER, headers={"Location": path + "/"})
        if not path.startswith(self.prefix + "/"):
            return refusal(HTTPStatus.NOT_FOUND, "no such page")
        inner = path[len(self.prefix) :]
        scope["root_path"] = scope.get("root_path", "") + self.prefix
        if inner.startswith("/static/"):
            return self.app
        query = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
        token = next((v for k, v in query if k == "token"), None)
        if token is not None and scope["method"] in ("GET", "HEAD"):
            if not hmac.compare_digest(token.encode(), self._token):
                return refusal(
                    HTTPStatus.FORBIDDEN, "wrong token: open the URL the console printed"
                )
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            cookie = (
                f"{self.cookie}={self._token.decode()}; HttpOnly; SameSite=Strict; "
                f"Path={self.prefix}/"
            )
            here = scope["raw_path"].decode("latin-1")  # as sent: percent-encoded, ASCII
            headers = {"Location": here + (f"?{rest}" if rest else ""), "Set-Cookie": cookie}
            return Response(status_code=HTTPStatus.SEE_OTHER, headers=headers)
        if not self._session_ok(headers.get(b"cookie", b"")):
            return refusal(
                HTTPStatus.FORBIDDEN,
                "no console session: open the URL that `ares-events ui` printed "
                "(it holds the token)",
            )
        return self.app

    def _session_ok(self, raw: bytes) -> bool:
        # Any cookie of that name may match: another server on this host can set one of the
        # same name (cookies ignore ports), which must not log the user out.
        ok = False
        for part in raw.decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie:
                ok |= hmac.compare_digest(value.encode("latin-1"), self._token)
        return ok


class _AccessLog:
    """One log line per response: method, the path inside the console (the prefix and
    the query are secrets), status; every control and bidi character spelled out. A path
    outside the console is not shown: a mistyped link (``//prefix/...``, ``/prefix.``)
    or a pasted token holds a secret, whole or nearly."""

    def __init__(self, app: ASGIApp, prefix: str, token: str) -> None:
        self.app, self.prefix, self.token = app, prefix, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == self.prefix or path.startswith(self.prefix + "/"):
            path = (path[len(self.prefix) :] or "/").replace(self.token, "***")
        else:
            path = "(a path outside the console)"

        async def logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                method, where = visible(scope["method"], keep=""), visible(path, keep="")
                logger.info("%s %s -> %s", method, where, message["status"])
            await send(message)

        await self.app(scope, receive, logged)


def _listen(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a name: the first address it resolves to
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=1024)


class ConsoleServer:
    """The console bound to ``host:port`` over ``store``, behind a per-start session
    (:meth:`serve_forever` blocks; :meth:`start` serves on a thread, for tests and
    embedding; :meth:`request_stop` may be called from a signal handler).

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        actions: bool = False,
        workers: int = 8,
        anchors: str | None = None,
        head_timeout: float = HEAD_TIMEOUT,
        approver: SigningKey | None = None,
        expires_in: float = 900.0,
    ) -> None:
        self._token = secrets.token_urlsafe(24)
        self._prefix = "/" + secrets.token_urlsafe(12)
        self.app = ConsoleApp(
            store,
            actions=actions,
            anchors=anchors,
            workers=workers,
            secret=self._token,
            approver=approver,
            expires_in=expires_in,
        )
        self._sock = _listen(host, port)
        self.host: str = host
        self.port = int(self._sock.getsockname()[1])
        self.hosts = _host_names(host, self.port)
        cookie = f"{_COOKIE}_{self.port}"
        gate = _Gate(
            self.app, prefix=self._prefix, token=self._token, cookie=cookie, hosts=self.hosts
        )
        protocol = type("Protocol", (_Protocol,), {"head_timeout": head_timeout})
        config = uvicorn.Config(
            _AccessLog(Hardened(gate), self._prefix, self._token),
            http=protocol,
            ws="none",
            lifespan="off",
            interface="asgi3",
            loop="asyncio",
            log_config=None,
            proxy_headers=False,
            server_header=False,
            limit_concurrency=_MAX_CONNECTIONS,
            h11_max_incomplete_event_size=MAX_HEAD,
            timeout_graceful_shutdown=_STOP_SECONDS,
        )
        self._server = _Server(config, self.app)
        self._thread: threading.Thread | None = None
        self._served = False

    def __repr__(self) -> str:
        return f"ConsoleServer({self.address!r}, actions={self.app.actions})"

    @property
    def address(self) -> str:
        """Where it listens: ``http://host:port`` (no secret in it); loopback when it
        listens on every address (browsers refuse to open 0.0.0.0)."""
        host = _LOOPBACK_OF.get(self.host, self.host)
        return f"http://{_bracketed(host)}:{self.port}"

    @property
    def base_url(self) -> str:
        """The console's root, ``http://host:port/<prefix>`` (a secret: the session
        cookie is scoped to it)."""
        return self.address + self._prefix

    @property
    def login_url(self) -> str:
        """The address to open: it holds the session token (print it only to the user)."""
        return f"{self.base_url}/?token={self._token}"

    def serve_forever(self) -> None:
        """Serve until :meth:`request_stop` or :meth:`close` (or, on the main thread,
        SIGINT or SIGTERM, which uvicorn turns into a stop)."""
        self._served = True
        self._server.run(sockets=[self._sock])

    def start(self) -> ConsoleServer:
        """Serve on a background thread."""
        self._served = True  # the thread's serve closes the socket, even after an early close
        self._thread = threading.Thread(target=self.serve_forever, name="ares-ui", daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Ask the server to stop (it finishes within a few seconds). Safe in a signal
        handler: it only sets flags, so it can land anywhere, even before serving starts
        (the server then stops as soon as it has started)."""
        self.app.closing = True
        self._server.should_exit = True

    def close(self) -> None:
        """Stop serving (live streams end at their next tick) and free the port."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not self._served:
            self._sock.close()
        self.app.close()


_LOOPBACK_OF: Final = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104 (read, not bound)
"""The address to print for a console listening on every address."""


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host  # an IPv6 address is bracketed in Host


def _host_names(host: str, port: int) -> frozenset[str]:
    names = [host, "localhost", "127.0.0.1", "::1"]
    if host in _LOOPBACK_OF:  # on every address: this machine's own names too
        names += [socket.gethostname(), socket.getfqdn()]
    return frozenset(f"{_bracketed(n)}:{port}".lower() for n in names)


def _arrival(scope: Scope) -> str | None:
    """``host:port`` of the address the request came in on (another machine's browser
    names it in Host when the console listens on every address), or None."""
    server = scope.get("server")
    if not server or server[1] is None:
        return None
    host = str(server[0])
    with contextlib.suppress(ValueError):  # dual stack: an IPv4 client's address as IPv6
        mapped = ipaddress.ip_address(host)
        if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped is not None:
            host = str(mapped.ipv4_mapped)
    return f"{_bracketed(host)}:{server[1]}".lower()
