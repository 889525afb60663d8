"""A TCP proxy on loopback for outage tests: the client talks to the proxy, the proxy to
the real server. ``down()`` cuts every connection and refuses new ones (what a crashed
server looks like from the client); ``hang()`` accepts connections and never answers (an
unreachable host); ``up()`` serves again on the same port.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (see the module docstring)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = int(probe.getsockname()[1])
        probe.close()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._mode = "down"

    # -- control ---------------------------------------------------------------------------

    def up(self) -> None:
        """Accept and forward connections."""
        self._set_mode("up")

    def hang(self) -> None:
        """Cut every connection; accept new ones but never answer (a black hole)."""
        self._set_mode("hang")

    def down(self) -> None:
        """Cut every connection and refuse new ones."""
        self._set_mode("down")

    def _set_mode(self, mode: str) -> None:
        with self._lock:
            self._mode = mode
            conns, self._conns = self._conns, set()
            listener = self._listener
            if mode == "down" and listener is not None:
                self._listener = None
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                c.close()
        if mode == "down":
            if listener is not None:
                with contextlib.suppress(OSError):
                    listener.close()
            return
        if self._listener is None:
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("127.0.0.1", self.port))
            srv.listen(64)
            self._listener = srv
            threading.Thread(target=self._accept, args=(srv,), daemon=True).start()

    # -- plumbing --------------------------------------------------------------------------

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return
            with self._lock:
                mode = self._mode
                self._conns.add(client)
            if mode != "up":
                continue  # hang: keep it open, say nothing
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.add(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def tcp_proxy(host: str, port: int) -> Iterator[TcpProxy]:
    """A running proxy to ``host:port``, taken down at the end."""
    proxy = TcpProxy(host, port)
    proxy.up()
    try:
        yield proxy
    finally:
        proxy.down()
