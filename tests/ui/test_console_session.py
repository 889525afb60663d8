"""The console's session cookie never travels to another server on the same host: cookies
ignore ports, so it is scoped to the console's per-start secret path. Checked with a real
cookie jar (http.cookiejar) and in headless Chromium, against a second local server that
records every Cookie header it receives (and sets a cookie of its own, which it does get
back: the client sends it cookies, just never the console's)."""

from __future__ import annotations

import http.cookiejar
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import pytest
from selenium.webdriver.common.by import By

from tests.fixtures.cookie_recorder import cookie_recorder
from tests.ui.conftest import console
from tests.ui.test_console_browser import forget_earlier_pages, wait
from tests.ui.test_console_rules import _request

OTHER_PATHS = ("/", "/streams", "/static/console.js", "/anything?x=1", "/")


def _secrets(c: Any) -> tuple[str, str]:
    """The console's token and secret path prefix, from the URL it printed."""
    return c.login.split("token=")[1], urlsplit(c.base).path


def _leaks(cookies: list[str], token: str, prefix: str) -> list[str]:
    return [h for h in cookies if "ares_console" in h or token in h or prefix.strip("/") in h]


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_cookie_jar_sends_the_session_to_no_other_port(sqlite_url: str) -> None:
    """Logged in through a real cookie jar, the session cookie is scoped to the console's
    secret path: requests to another server on 127.0.0.1 carry the jar's other cookie
    but never the session; the console still gets it (its pages answer)."""
    with console(sqlite_url) as c, cookie_recorder() as other:
        token, prefix = _secrets(c)
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with opener.open(c.login, timeout=30) as resp:  # 303s to the streams page
            assert resp.status == 200 and resp.url == c.base + "/streams"
            assert b'id="streams"' in resp.read()
        for path in OTHER_PATHS:
            with opener.open(other.base + path, timeout=30) as resp:
                resp.read()
        # The control: the jar does send cookies to the other server (its own probe).
        assert any("probe=1" in h for h in other.cookies())
        assert _leaks(other.cookies(), token, prefix) == []
        session = [k for k in jar if k.name.startswith("ares_console_")]
        assert len(session) == 1 and session[0].path == prefix + "/"
        assert session[0].domain == "127.0.0.1" and session[0].value == token
        with opener.open(c.base + "/runs", timeout=30) as resp:  # the session still works
            assert resp.status == 200
        # Without the cookie, the same page is refused: the jar's cookie is the session.
        assert _request(c.base, "GET", "/runs")[0] == 403


def test_chromium_sends_the_session_to_no_other_port(driver: Any, sqlite_url: str) -> None:
    """In headless Chromium: after logging in to the console, visiting another local
    server (its page loads an image of its own too) never sends it the console's cookie,
    though Chromium sends it that server's own cookie back; the console keeps its
    session."""
    with console(sqlite_url) as c, cookie_recorder() as other:
        token, prefix = _secrets(c)
        forget_earlier_pages(driver)
        driver.get(c.login)
        wait(driver).until(lambda d: d.find_elements(By.ID, "streams"))
        cookies = [k for k in driver.get_cookies() if k["name"].startswith("ares_console_")]
        for path in OTHER_PATHS:
            driver.get(other.base + path)
        wait(driver).until(lambda d: any(p == "/pixel.png" for p, _ in other.seen))
        assert any("probe=1" in h for h in other.cookies())  # Chromium sends it cookies
        assert _leaks(other.cookies(), token, prefix) == []
        assert [(k["name"], k["path"], k["httpOnly"]) for k in cookies] == [
            (f"ares_console_{urlsplit(c.base).port}", prefix + "/", True)
        ]
        driver.get(c.base + "/runs")
        wait(driver).until(lambda d: d.find_elements(By.ID, "runs"))
        assert "run-done" in driver.find_element(By.ID, "runs").text
