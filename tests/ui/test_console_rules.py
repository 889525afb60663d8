"""The console's rules: read-only browsing changes nothing (file bytes, heads, rows), a
read-only store refuses writes at the backend, actions with ``--allow-actions`` append
the same audited events as the CLI, and the session, CSRF, Host and CSP rules hold at the
HTTP level; secrets never reach a page, a header or the console's output."""

from __future__ import annotations

import hashlib
import http.client
import re
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

import psycopg
import pytest
from selenium.webdriver.common.by import By

import ares_events as ae
from ares_events.cli import main
from ares_events.errors import StoreError
from tests.ui import fleet
from tests.ui.conftest import build_sqlite, console, screenshot
from tests.ui.test_console_browser import browse_every_view, wait

# -- fingerprints -----------------------------------------------------------------------------


def sqlite_fingerprint(url: str) -> dict[str, Any]:
    """The file's bytes, every table's row count and every head, read without writing."""
    path = Path(url.removeprefix("sqlite:///"))
    wal = path.with_name(path.name + "-wal")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        counts = {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        heads = conn.execute(
            "SELECT stream_id, version, head_hash FROM ares_streams ORDER BY stream_id"
        ).fetchall()
    finally:
        conn.close()
    return {
        "bytes": hashlib.sha256(path.read_bytes()).hexdigest(),
        "wal": wal.read_bytes() if wal.exists() else b"",  # an empty WAL is no write
        "counts": counts,
        "heads": heads,
    }


def _one(conn: psycopg.Connection[Any], sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def pg_fingerprint(url: str) -> dict[str, Any]:
    """Every table of the store's schema with its row count, and every head."""
    parts = urlsplit(url)
    schema = re.search(r"schema=(\w+)", parts.query)
    assert schema is not None
    s = schema.group(1)
    conninfo = url.split("?", maxsplit=1)[0]
    with psycopg.connect(conninfo) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename", (s,)
            )
        ]
        counts = {t: _one(conn, f'SELECT count(*) FROM "{s}"."{t}"') for t in tables}
        heads = conn.execute(
            f'SELECT stream_id, version, head_hash FROM "{s}".ares_streams ORDER BY stream_id'
        ).fetchall()
        schemas = _one(conn, "SELECT count(*) FROM pg_namespace")
    return {"tables": tables, "counts": counts, "heads": heads, "schemas": schemas}


def check_proof(c: Any, tmp_path: Path) -> None:
    """An inclusion proof downloaded from the console checks offline with verify-proof."""
    status, headers, body = _request(
        c.base, "GET", "/proof?stream=run-done&version=2", headers=_session(c)
    )
    assert status == 200 and "attachment" in headers["content-disposition"], body[:300]
    proof = tmp_path / "proof.json"
    proof.write_text(body)
    assert main(["verify-proof", str(proof), "--vkey", fleet.LOG_KEY.verifier.text]) == 0


def test_read_only_browsing_changes_nothing_on_sqlite(
    driver: Any, sqlite_url: str, tmp_path: Path
) -> None:
    """Browsing every view of a SQLite store (an audit and a proof included) leaves the
    file's bytes, every table's rows and every head exactly as they were."""
    before = sqlite_fingerprint(sqlite_url)
    with console(sqlite_url) as c:
        browse_every_view(driver, c, "ro-sqlite")
        check_proof(c, tmp_path)
    assert sqlite_fingerprint(sqlite_url) == before


@pytest.mark.postgres
def test_read_only_browsing_changes_nothing_on_postgres(
    driver: Any, pg_fleet_url: str, tmp_path: Path
) -> None:
    """Browsing every view of a PostgreSQL store (an audit and a proof included) creates
    no table or schema and changes no row or head."""
    before = pg_fingerprint(pg_fleet_url)
    with console(pg_fleet_url) as c:
        browse_every_view(driver, c, "ro-postgres")
        check_proof(c, tmp_path)
    assert pg_fingerprint(pg_fleet_url) == before


def test_read_only_sqlite_refuses_writes(sqlite_url: str) -> None:
    """A store opened read_only=True refuses an append before SQLite is asked, and the
    file is opened mode=ro."""
    before = sqlite_fingerprint(sqlite_url)
    with ae.open_store(sqlite_url, create=False, read_only=True) as store:
        assert store.stream_version("run-done") > 0
        with pytest.raises(StoreError, match="read-only"):
            ae.emit(store, "agent-9", "note.added", "runtime", {})
    assert sqlite_fingerprint(sqlite_url) == before


@pytest.mark.postgres
def test_read_only_postgres_refuses_writes(pg_fleet_url: str) -> None:
    """A PostgreSQL store opened read_only=True runs read-only transactions: the server
    refuses the append."""
    before = pg_fingerprint(pg_fleet_url)
    with ae.open_store(pg_fleet_url, create=False, read_only=True) as store:
        assert len(store.streams_page(limit=100)) == len(before["heads"])
        with pytest.raises(StoreError, match="read-only"):
            ae.emit(store, "agent-9", "note.added", "runtime", {})
    assert pg_fingerprint(pg_fleet_url) == before


def test_read_only_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    """read_only on a path with no store is StoreNotFound, and no file appears."""
    with pytest.raises(ae.errors.StoreNotFound):
        ae.open_store(f"sqlite:///{tmp_path / 'none.db'}", read_only=True)
    assert list(tmp_path.iterdir()) == []


# -- actions ----------------------------------------------------------------------------------


def _new_events(
    url: str, streams: dict[str, int]
) -> list[tuple[str, str, str, Any, dict[str, Any]]]:
    out = []
    with ae.open_store(url) as store:
        for sid, v in streams.items():
            for e in store.read(sid, v + 1):
                meta = dict(e.metadata)
                out.append((sid, e.type, e.module, e.payload, meta))
    return out


def _fill(driver: Any, form: Any, by: str, reason: str) -> None:
    form.find_element(By.NAME, "by").send_keys(by)
    form.find_element(By.NAME, "reason").send_keys(reason)


def test_actions_append_what_the_cli_appends(driver: Any, tmp_path: Path, capsys: Any) -> None:
    """With --allow-actions, resolve (not done), resume and cancel through the browser
    append the same events as `ares-events runs resolve|resume|cancel` on a copy of the
    store: same types, payloads, who and why; only ``via`` names the console."""
    url = build_sqlite(tmp_path)
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    for f in tmp_path.glob("console.db*"):
        if f.is_file():
            shutil.copy(f, copy_dir / f.name)
    copy_url = f"sqlite:///{copy_dir / 'console.db'}"
    with ae.open_store(url) as store:
        start = {sid: store.stream_version(sid) for sid in ("run-doubt", "run-paused")}
    # Through the CLI, on the copy.
    for argv in (
        [
            "runs",
            "resolve",
            "run-doubt",
            "2",
            "--not-done",
            "--by",
            "alice",
            "--reason",
            "no ticket",
        ],
        ["runs", "resume", "run-doubt", "--by", "alice", "--reason", "go on"],
        ["runs", "cancel", "run-paused", "--by", "alice", "--reason", "not needed"],
    ):
        assert main(["--store", copy_url, *argv]) == 0
    capsys.readouterr()
    # Through the console.
    with console(url, "--allow-actions") as c:
        assert "actions allowed" in c.output()
        driver.get(c.login)
        wait(driver).until(lambda d: d.find_elements(By.ID, "streams"))
        driver.get(c.base + "/run?id=run-doubt")
        form = driver.find_element(By.CSS_SELECTOR, ".doubt-step form.action")
        form.find_element(By.NAME, "not_done").click()
        _fill(driver, form, "alice", "no ticket")
        screenshot(driver, "actions-resolve")
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait(driver).until(lambda d: d.find_elements(By.ID, "resume-form"))
        form = driver.find_element(By.ID, "resume-form")
        _fill(driver, form, "alice", "go on")
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait(driver).until(lambda d: "running" in d.find_element(By.ID, "run-status").text)
        driver.get(c.base + "/run?id=run-paused")
        form = driver.find_element(By.ID, "cancel-form")
        _fill(driver, form, "alice", "not needed")
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait(driver).until(lambda d: "cancelled" in d.find_element(By.ID, "run-status").text)
        check_proof(c, tmp_path)  # with actions, the log is caught up first
    by_console = _new_events(url, start)
    by_cli = _new_events(copy_url, start)
    assert len(by_console) == len(by_cli) == 3
    for ui_e, cli_e in zip(by_console, by_cli, strict=True):
        ui_via, cli_via = ui_e[4].pop("via"), cli_e[4].pop("via")
        assert ui_e == cli_e
        assert ui_via.startswith("ares-events ui ") and cli_via.startswith("ares-events runs ")
        assert ui_e[4]["by"] == "alice" and ui_e[4]["reason"]


# -- HTTP rules -------------------------------------------------------------------------------


def _request(
    base: str,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: str | None = None,
) -> tuple[int, dict[str, str], str]:
    parts = urlsplit(base)  # base: the console's root, its secret prefix included
    target = parts.path + "/" + (path[2:] if path.startswith("./") else path.lstrip("/"))
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def _session(c: Any) -> dict[str, str]:
    token = c.login.split("token=")[1]
    status, headers, _ = _request(c.base, "GET", f"/?token={token}")
    assert (
        status == 303
        and "HttpOnly" in headers["set-cookie"]
        and "SameSite=Strict" in headers["set-cookie"]
    )
    # One cookie per port: two consoles on one host keep their own sessions; and it is
    # scoped to the console's secret path, so no other server on this host receives it.
    assert headers["set-cookie"].startswith(f"ares_console_{urlsplit(c.base).port}=")
    assert f"Path={urlsplit(c.base).path}/" in headers["set-cookie"].split("; ")
    return {"Cookie": headers["set-cookie"].split(";")[0]}


def test_session_csrf_host_and_csp(sqlite_url: str) -> None:
    """No page without the session cookie; a wrong token, a foreign Host, a POST without
    the CSRF token or from another origin, and an action on a read-only console are
    refused; every response carries the strict CSP."""
    with console(sqlite_url, "-v") as c:
        host = urlsplit(c.base).netloc
        status, headers, body = _request(c.base, "GET", "/streams")
        assert status == 403 and "token" in body
        assert "console.db" not in body  # no session: not even which store
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"
        assert _request(c.base, "GET", "/?token=wrong")[0] == 403
        cookie = _session(c)
        assert _request(c.base, "GET", "/streams", headers=cookie)[0] == 200
        evil_host = {**cookie, "Host": "evil.example"}
        assert _request(c.base, "GET", "/streams", headers=evil_host)[0] == 421
        _, _, page = _request(c.base, "GET", "/integrity", headers=cookie)
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert csrf is not None
        form = {**cookie, "Content-Type": "application/x-www-form-urlencoded"}
        assert _request(c.base, "POST", "/audit", headers=form, body="deep=1")[0] == 403
        foreign = {**form, "Origin": "http://evil.example"}
        ok_body = urlencode({"csrf": csrf.group(1)})
        assert _request(c.base, "POST", "/audit", headers=foreign, body=ok_body)[0] == 403
        assert (
            _request(
                c.base, "POST", "/audit", headers={**form, "Origin": f"http://{host}"}, body=ok_body
            )[0]
            == 303
        )
        act = urlencode(
            {
                "csrf": csrf.group(1),
                "action": "cancel",
                "id": "run-paused",
                "by": "x",
                "version": "4",
            }
        )
        status, _, body = _request(c.base, "POST", "/action", headers=form, body=act)
        assert status == 403 and "read-only" in body
        assert (
            _request(
                c.base,
                "GET",
                "/streams",
                headers={"Cookie": cookie["Cookie"].split("=")[0] + "=wrong"},
            )[0]
            == 403
        )
        status, headers, _ = _request(c.base, "GET", "/static/console.js", headers=cookie)
        assert status == 200 and headers["content-type"].startswith("text/javascript")
    # The access log (-v) shows paths, never a query: the token is only on the "open" line.
    logged = [ln for ln in c.stderr if not ln.startswith("open http")]
    assert any("GET /streams" in ln for ln in logged)
    assert not any("token=" in ln for ln in logged)


def _all_pages(c: Any, cookie: dict[str, str]) -> str:
    seen = []
    for path in (
        "/streams",
        "/runs",
        "/integrity",
        "/projections",
        "/run?id=run-done",
        "/stream?id=agent-2",
        "/verify?id=agent-1",
        "/payload?id=agent-2&v=2",
    ):
        status, headers, body = _request(c.base, "GET", path, headers=cookie)
        assert status == 200, (path, body[:300])
        seen.append(body)
        seen.extend(f"{k}: {v}" for k, v in headers.items())
    return "\n".join(seen)


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_chain_key_never_shown(tmp_path: Path) -> None:
    """A keyed store: the chain key is in no page, header or console output, and the
    chains still verify (the console uses the key)."""
    key = "ab" * 32
    url = build_sqlite(tmp_path, chain_key=key)
    with console(url, "-v", env={"ARES_EVENTS_CHAIN_KEY": key}) as c:
        text = _all_pages(c, _session(c))
        assert "verified" in text
    assert key not in text and key not in c.output()


@pytest.mark.postgres
def test_store_password_never_shown(pg_fleet_url: str) -> None:
    """The PostgreSQL password (URL-reserved characters) is in no page, header or output."""
    password = urlsplit(pg_fleet_url).password
    assert password
    with console(pg_fleet_url, "-v") as c:
        text = _all_pages(c, _session(c))
    for form in {password, unquote(password), quote(unquote(password), safe="")}:
        assert form not in text and form not in c.output()


def test_audit_checks_anchors_of_a_location(tmp_path: Path, capsys: Any) -> None:
    """With --anchors, the Integrity page's audit checks the anchors there (and says
    how many); the audit's progress page polls until the result is there."""
    url = build_sqlite(tmp_path)
    witness = (tmp_path / "witness").as_uri() + "/"
    (tmp_path / "witness").mkdir()
    key = str(tmp_path / "log.key")
    assert main(["keygen", "console.test/log", "--out", key]) == 0
    assert main(["--store", url, "anchor", "--key", key, "--to", witness]) == 0
    capsys.readouterr()
    with console(url, "--anchors", witness) as c:
        cookie = _session(c)
        _, _, page = _request(c.base, "GET", "/integrity", headers=cookie)
        assert "also checks the anchors" in page
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert csrf is not None
        form = {**cookie, "Content-Type": "application/x-www-form-urlencoded"}
        body = urlencode({"csrf": csrf.group(1)})
        assert _request(c.base, "POST", "/audit", headers=form, body=body)[0] == 303
        for _ in range(600):  # bounded: the audit of a small store takes well under that
            _, _, page = _request(c.base, "GET", "/integrity", headers=cookie)
            if 'id="audit-result"' in page:
                break
            assert 'id="audit-progress"' in page and 'data-poll="1"' in page
            time.sleep(0.1)
        assert "1 anchors checked" in page and ">clean<" in page


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_sigterm_stops_the_console_cleanly(sqlite_url: str) -> None:
    """SIGTERM (a supervisor's stop) ends the console like Ctrl-C: exit 0, store closed."""
    with console(sqlite_url) as c:
        c.proc.terminate()
        assert c.proc.wait(timeout=60) == 0
    assert "Traceback" not in c.output()


def test_a_console_on_every_address_answers_each_of_them_and_prints_one_that_opens(
    sqlite_url: str,
) -> None:
    """``--host 0.0.0.0`` warns that other machines can reach it, so a request naming the
    address it came in on (another machine's browser typing this one's address) is
    served; a foreign name is still refused (no DNS rebinding). The printed address is
    loopback: browsers refuse to open 0.0.0.0."""
    with console(sqlite_url, "--host", "0.0.0.0") as c:
        assert urlsplit(c.login).hostname == "127.0.0.1", c.login
        assert "reachable from other machines" in c.output()
        assert "in place of the loopback one" in c.output()
        port = urlsplit(c.base).port
        # 127.0.0.2 is this machine on another address (all of 127/8 is loopback): the
        # request comes in on it as another machine's would on the network address.
        other = c.base.replace("127.0.0.1", "127.0.0.2")
        token = urlsplit(c.login).query
        status, headers, _ = _request(
            other, "GET", f"/?{token}", headers={"Host": f"127.0.0.2:{port}"}
        )
        assert status == 303 and "set-cookie" in headers
        cookie = {"Cookie": headers["set-cookie"].split(";")[0]}
        assert (
            _request(other, "GET", "/streams", headers={**cookie, "Host": f"127.0.0.2:{port}"})[0]
            == 200
        )
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.3:{port}"):
            assert _request(other, "GET", "/streams", headers={**cookie, "Host": host})[0] == 421
