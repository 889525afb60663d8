"""docs/ui.md's example of mounting the console in one's own service is a program: its
```python block builds the service, served here by uvicorn on a real socket. Without the
login nothing of the console answers; with it every view answers under the mount, the
links of its pages lead to pages under the mount, an audit runs through the form, and
the console's own rules (CSRF, same origin, CSP) still hold behind the user's
authentication; the service's Host check refuses another name."""

from __future__ import annotations

import base64
import http.client
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import pytest
import uvicorn

from tests.ui.conftest import build_sqlite

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "ui.md"
PASSWORD = "correct horse battery staple"


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The documented service, serving on a free loopback port; its base URL."""
    blocks = re.findall(r"^```python\n(.*?)^```$", GUIDE.read_text(), flags=re.M | re.S)
    (block,) = [b for b in blocks if "ConsoleApp(" in b]
    (tmp_path / "agents").mkdir()
    built = build_sqlite(tmp_path / "agents")
    Path(built.removeprefix("sqlite:///")).rename(tmp_path / "agents.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPS_PASSWORD", PASSWORD)
    monkeypatch.setenv("CONSOLE_SECRET", "one secret for every worker")
    ns: dict[str, Any] = {"__name__": "yourservice"}
    exec(compile(block, f"{GUIDE.name}[mount]", "exec"), ns)
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(ns["app"], log_config=None, lifespan="on", http="h11", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    assert ns["console"].closing  # the service's lifespan closed the console


def _get(
    url: str, *, login: bool = True, headers: dict[str, str] | None = None, body: str | None = None
) -> tuple[int, dict[str, str], str]:
    parts = urlsplit(url)
    hdrs = dict(headers or {})
    if login:
        hdrs["Authorization"] = "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("POST" if body is not None else "GET", target, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def test_the_documented_mount_serves_the_console_behind_its_login(service: str) -> None:
    """Refused without the login; with it, /ares/ leads to the streams, every link of the
    pages stays under /ares/ and answers, an audit runs, and CSRF, Origin, CSP and the
    Host check hold."""
    assert _get(service + "/ares/streams", login=False)[0] == 401
    assert _get(service + "/ares/", login=False)[0] == 401
    status, headers, _ = _get(service + "/ares/")
    assert status == 303
    streams_url = urljoin(service + "/ares/", headers["location"])
    assert streams_url == service + "/ares/streams"
    status, headers, page = _get(streams_url)
    assert status == 200 and "run-done" in page and "agent-2" in page
    assert "default-src 'none'" in headers["content-security-policy"]
    # Every link of the page (navigation, streams, static files) stays under the mount.
    links = set(re.findall(r'(?:href|src|action)="(\./[^"]*)"', page))
    assert {"./streams", "./runs", "./integrity", "./static/console.js"} <= links
    for link in sorted(links - {"./audit"}):
        target = urljoin(streams_url, link.replace("&amp;", "&"))
        assert target.startswith(service + "/ares/"), link
        assert _get(target)[0] == 200, link
    status, _, page = _get(service + "/ares/run?id=run-doubt")
    assert status == 200 and "IN DOUBT" in page
    # An audit through the form: the CSRF token and this origin.
    _, _, page = _get(service + "/ares/integrity")
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match is not None
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    origin = {**form, "Origin": service}
    assert _get(service + "/ares/audit", headers=form, body="deep=1")[0] == 403
    good = urlencode({"csrf": match.group(1)})
    foreign = {**form, "Origin": "http://evil.example"}
    assert _get(service + "/ares/audit", headers=foreign, body=good)[0] == 403
    status, headers, _ = _get(service + "/ares/audit", headers=origin, body=good)
    assert status == 303 and urljoin(service + "/ares/audit", headers["location"]) == (
        service + "/ares/integrity"
    )
    for _ in range(600):  # bounded: the audit of a small store takes well under that
        _, _, page = _get(service + "/ares/integrity")
        if 'id="audit-result"' in page:
            break
        time.sleep(0.1)
    assert ">clean<" in page
    # Read-only: the actions are refused even with the login and the form token.
    act = urlencode({"csrf": match.group(1), "action": "cancel", "id": "run-paused", "by": "x"})
    assert _get(service + "/ares/action", headers=origin, body=act)[0] == 403
    # The service's Host check.
    assert _get(service + "/ares/streams", headers={"Host": "evil.example"})[0] == 400
