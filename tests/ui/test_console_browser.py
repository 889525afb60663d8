"""The web console in a real headless Chromium, against the real ``ares-events ui``
process over real SQLite and PostgreSQL stores: every view opens and shows what the store
holds, a live update appears without a reload, hostile content stays text, and the
browser never asks another origin for anything."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from selenium.common.exceptions import (
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import ares_events as ae
from ares_events.ui.markup import visible
from tests.ui import fleet
from tests.ui.conftest import Console, console, requested_urls, screenshot

WAIT = 30  # seconds; only to turn a hang into a failure


def wait(driver: Any) -> WebDriverWait[Any]:
    """A wait that retries when a live refresh replaced the element it was reading."""
    return WebDriverWait(
        driver, WAIT, ignored_exceptions=(StaleElementReferenceException, NoSuchElementException)
    )


def text_of(driver: Any, css: str) -> str:
    """All the text of the first element matching ``css``, hidden parts included."""
    return str(driver.find_element(By.CSS_SELECTOR, css).get_attribute("textContent"))


def as_json(text: str) -> str:
    """``text`` as it shows inside a JSON payload (quotes escaped, invisibles spelled)."""
    return visible(json.dumps(text, ensure_ascii=False)[1:-1])


def no_dialog(driver: Any) -> None:
    """No alert, confirm or prompt is open."""
    with pytest.raises(NoAlertPresentException):
        _ = driver.switch_to.alert.text


def forget_earlier_pages(driver: Any) -> None:
    """Leave the last test's page (its live connection would retry its own, closed
    console) and forget what the browser asked for so far."""
    driver.get("about:blank")
    requested_urls(driver)


def only_own_origin(driver: Any, c: Console) -> None:
    """Every request the browser made went to the console itself."""
    urls = requested_urls(driver)
    assert urls, "the network log is empty"
    # The browser's own pages (chrome://new-tab-page at start) are not the console's.
    web = [u for u in urls if u.split(":", 1)[0] in ("http", "https", "ws", "wss")]
    assert any(u.startswith(c.base + "/") for u in web)
    foreign = [u for u in web if not u.startswith(c.base + "/")]
    assert foreign == []


def open_view(driver: Any, c: Console, path: str) -> None:
    driver.get(c.base + path)
    wait(driver).until(lambda d: d.find_elements(By.ID, "main"))
    no_dialog(driver)


def browse_every_view(driver: Any, c: Console, name: str) -> None:
    """Open each view, check its content, save a screenshot of it."""
    forget_earlier_pages(driver)
    driver.get(c.login)  # sets the session cookie, then drops the token from the address
    wait(driver).until(lambda d: d.current_url.endswith("/streams"))
    assert "token=" not in driver.current_url
    streams = text_of(driver, "#streams")
    for sid in ("run-done", "run-doubt", "agent-1", "agent-2"):
        assert sid in streams
    assert "run" in streams and "agent" in streams  # kinds are marked
    screenshot(driver, f"{name}-streams")

    open_view(driver, c, "/streams?prefix=run-d")
    rows = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#streams tbody tr")]
    assert [r.split()[0] for r in rows] == ["run-done", "run-doubt"]

    open_view(driver, c, "/stream?id=agent-2")
    events = text_of(driver, "#events")
    assert "spilled blob" in events and "erased" in events and "small" in events
    assert "verified" in text_of(driver, "#chain")
    screenshot(driver, f"{name}-stream")
    driver.find_element(By.CSS_SELECTOR, "a.fetch").click()
    wait(driver).until(lambda d: d.find_elements(By.ID, "payload"))
    assert "x" * 5000 in text_of(driver, "#payload")

    open_view(driver, c, "/stream?id=agent-1")
    assert "recovery_state" in text_of(driver, "#snapshots")
    open_view(driver, c, "/verify?id=agent-1")
    assert "verified" in text_of(driver, "#verify") and "3 events checked" in text_of(
        driver, "#verify"
    )

    open_view(driver, c, "/runs")
    runs = text_of(driver, "#runs")
    for run, status in (
        ("run-done", "completed"),
        ("run-paused", "paused"),
        ("run-doubt", "in_doubt"),
    ):
        assert run in runs and status in runs
    screenshot(driver, f"{name}-runs")
    open_view(driver, c, "/runs?status=in_doubt")
    assert [r.text.split()[0] for r in driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr")] == [
        "run-doubt"
    ]

    open_view(driver, c, "/run?id=run-doubt")
    doubt = driver.find_element(By.CSS_SELECTOR, ".doubt-step")
    assert "IN DOUBT" in doubt.text and "run-doubt:2" in doubt.text
    assert "in_doubt" in text_of(driver, "#run-status")
    life = text_of(driver, "#lifecycle")  # killed in the tool, then a new incarnation
    assert "new incarnation" in life and "interrupted" in life and "in_doubt_tool_call" in life
    screenshot(driver, f"{name}-run-in-doubt")

    open_view(driver, c, "/run?id=run-done")
    timeline = text_of(driver, "#timeline")
    assert "Summarise topic A." in timeline and "A is fine" in timeline and "16 tokens" in timeline
    assert "run-done:2" in timeline and "create_ticket" in timeline
    screenshot(driver, f"{name}-run")
    form = driver.find_element(By.CSS_SELECTOR, "#step-1 form.diff-form")
    form.find_element(By.NAME, "current").send_keys(
        json.dumps(
            {
                "messages": [{"role": "user", "content": "Summarise topic B."}],
                "params": {"temperature": 0},
            }
        )
    )
    form.find_element(By.CSS_SELECTOR, "button").click()
    wait(driver).until(lambda d: d.find_elements(By.ID, "diff"))
    diff = text_of(driver, "#diff")
    assert "-" in diff and "topic A." in diff and "topic B." in diff
    screenshot(driver, f"{name}-divergence")

    open_view(driver, c, "/integrity")
    driver.find_element(By.ID, "audit-start").click()
    wait(driver).until(lambda d: d.find_elements(By.ID, "audit-result"))
    result = text_of(driver, "#audit-result")
    assert "clean" in result and "streams" in result
    screenshot(driver, f"{name}-integrity")

    open_view(driver, c, "/projections")
    assert "last position" in text_of(driver, "#last-position")
    assert "merkle_log" in text_of(driver, "#projections")  # the fleet's signed log
    screenshot(driver, f"{name}-projections")
    no_dialog(driver)
    only_own_origin(driver, c)


def live_update(driver: Any, c: Console, url: str, name: str) -> None:
    """A stream appended by another process shows up in the open list, without a reload."""
    open_view(driver, c, "/streams")
    driver.execute_script("window.__sameDocument = 'yes';")
    wait(driver).until(
        lambda d: d.execute_script(
            "return performance.getEntriesByType('resource').some(e => e.name.includes('/live'))"
        )
    )
    with ae.open_store(url) as writer:
        ae.emit(writer, "agent-0-new", "note.added", "runtime", {"live": True})
    wait(driver).until(lambda d: "agent-0-new" in text_of(d, "#streams"))
    assert driver.execute_script("return window.__sameDocument") == "yes"
    screenshot(driver, f"{name}-live")


def test_every_view_on_sqlite(driver: Any, sqlite_url: str) -> None:
    """On a SQLite file store, read-only: every view, then a live update."""
    with console(sqlite_url) as c:
        browse_every_view(driver, c, "sqlite")
        live_update(driver, c, sqlite_url, "sqlite")
        assert "read-only" in c.output()


@pytest.mark.postgres
def test_every_view_on_postgres(driver: Any, pg_fleet_url: str) -> None:
    """On PostgreSQL (read-only transactions): every view, then a live update."""
    with console(pg_fleet_url) as c:
        browse_every_view(driver, c, "postgres")
        live_update(driver, c, pg_fleet_url, "postgres")


def test_hostile_content_stays_text(driver: Any, sqlite_url: str) -> None:
    """Script, HTML and odd Unicode planted in stream ids, payloads, prompts and answers
    show as text: no dialog, no element they name, no request to another origin."""
    with console(sqlite_url) as c:
        forget_earlier_pages(driver)
        driver.get(c.login)
        wait(driver).until(lambda d: d.find_elements(By.ID, "streams"))
        assert visible(fleet.EVIL_ID) in text_of(driver, "#streams")
        pages = [
            "/streams",
            f"/stream?id={quote(fleet.EVIL_ID, safe='')}",
            f"/stream?id={quote(fleet.EVIL_RUN, safe='')}",
            f"/run?id={quote(fleet.EVIL_RUN, safe='')}",
            "/runs",
            f"/verify?id={quote(fleet.EVIL_ID, safe='')}",
        ]
        for i, path in enumerate(pages):
            open_view(driver, c, path)
            for d in driver.find_elements(By.TAG_NAME, "details"):
                driver.execute_script("arguments[0].open = true", d)
            planted = driver.execute_script(
                "return document.querySelectorAll('img, iframe, svg, b, i, object, embed').length"
            )
            assert planted == 0, path
            scripts = driver.execute_script(
                "return Array.from(document.scripts).map(s => s.getAttribute('src'))"
            )
            assert scripts == ["./static/console.js"], path
            screenshot(driver, f"hostile-{i}")
        body = text_of(driver, "main")
        assert visible(fleet.EVIL_ID) in body and "⟨U+202E⟩" in body
        open_view(driver, c, f"/run?id={quote(fleet.EVIL_RUN, safe='')}")
        for d in driver.find_elements(By.TAG_NAME, "details"):
            driver.execute_script("arguments[0].open = true", d)
        timeline = text_of(driver, "#timeline")
        for planted in (fleet.EVIL_PROMPT, fleet.EVIL_HTML, fleet.EVIL_ANSWER):
            assert as_json(planted) in timeline
        open_view(driver, c, f"/stream?id={quote(fleet.EVIL_ID, safe='')}")
        driver.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
        events = text_of(driver, "#events")
        assert as_json(fleet.EVIL_HTML) in events and "task.<b>created</b>" in events
        assert "⟨U+0000⟩" in events or "\\u0000" in events
        no_dialog(driver)
        only_own_origin(driver, c)
