"""Signed approvals from the console, over real HTTP against the real ``ares-events ui
--allow-actions --key FILE`` process on SQLite and PostgreSQL: the operator approves,
the console signs with the key it loaded at start, and exactly the approved call runs
once; a console without a key cannot approve a call that needs one; a journal that does
not trust the console's key runs nothing; no page or output shows the key's secret; the
exported record carries the console's approval and verifies."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from selenium.webdriver.common.by import By

import ares_events as ae
from ares_events.agents.journal import Journal
from ares_events.cli import main
from ares_events.integrity.notes import SigningKey, write_key_file
from ares_events.records import export_record, verify_record
from ares_events.ui import ConsoleApp
from tests.fixtures.approvals import ALICE, MALLORY, paused, state
from tests.records.helpers import LOG
from tests.ui.conftest import console, screenshot
from tests.ui.test_console_browser import wait
from tests.ui.test_console_rules import _request, _session


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/console.db"
    return str(request.getfixturevalue("postgres_url"))


def key_file(tmp_path: Path, key: SigningKey) -> str:
    return str(write_key_file(tmp_path / f"{key.verifier.key_id.hex()}.key", key))


def secrets_of(key: SigningKey) -> list[str]:
    """The forms the key's secret could be shown in: the key file's text and its seed."""
    text = key.private_text()  # PRIVATE+KEY+<name>+<key id>+<base64 seed, which may hold "+">
    return [text, text.split("+", 4)[4]]


def approve(base: str, cookie: dict[str, str], run: str) -> tuple[int, str, str]:
    """Open the run's page, then post its resume form as the operator alice would."""
    status, _, page = _request(base, "GET", f"/run?id={run}", headers=cookie)
    assert status == 200, page[:300]
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    version = re.search(r'name="version" value="(\d+)"', page)
    form = {
        "csrf": csrf.group(1) if csrf else "",
        "id": run,
        "action": "resume",
        "version": version.group(1) if version else "0",
        "by": "alice",
        "reason": "invoice checked",
    }
    headers = {**cookie, "Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = _request(base, "POST", "/action", headers=headers, body=urlencode(form))
    return status, page, body


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_a_signed_resume_from_the_console_runs_exactly_the_approved_call(
    url: str, tmp_path: Path
) -> None:
    """The run page says what is asked (tool, arguments) and which key signs; the
    operator's resume is signed by the console's key; the journal trusting that key runs
    the call once (a second incarnation replays it); the record of the run carries the
    approval and verifies with alice's key; no secret on any page or in the output."""
    with ae.open_store(url) as store:
        loop = paused(store, "pay-1")
    with console(url, "-v", "--allow-actions", "--key", key_file(tmp_path, ALICE)) as c:
        cookie = _session(c)
        status, page, body = approve(c.base, cookie, "pay-1")
        assert status == 303, body[:300]
        signer = f"alice+{ALICE.verifier.key_id.hex()}"
        assert f"approvals signed by {signer}" in c.output()
        assert "Waiting for a signed approval" in page and signer in page
        assert "&quot;amount&quot;: 5" in page  # the arguments the approver approves
        _, _, after = _request(c.base, "GET", "/run?id=pay-1", headers=cookie)
        seen = page + after + c.output()
    for secret in secrets_of(ALICE):
        assert secret not in seen
    with ae.open_store(url) as store:
        loop.store = store
        loop()
        loop()
        assert loop.ran == ["pay-1:1"]
        assert Journal.inspect(store, "pay-1").status == "completed"
        data = export_record(store, "pay-1", key=LOG).data
    rep = verify_record(data, [LOG.verifier.text], approvers=[ALICE.verifier.text])
    assert rep.ok, rep.findings
    assert [(a["action"], a["signed_by"]) for a in rep.approvals] == [("approve", [signer])]


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_a_console_without_a_key_cannot_approve(url: str) -> None:
    """With --allow-actions and no --key, the page offers no resume of a run waiting for
    a signed approval and says how to approve it; a resume posted anyway is refused
    (403, saying why) and the store is unchanged."""
    with ae.open_store(url) as store:
        paused(store, "pay-2")
        before = state(store)
    with console(url, "--allow-actions") as c:
        status, page, body = approve(c.base, _session(c), "pay-2")
    assert 'id="needs-key"' in page and 'id="resume-form"' not in page
    assert status == 403 and "holds no approver key" in body
    with ae.open_store(url) as store:
        assert state(store) == before
        assert Journal.inspect(store, "pay-2").status == "paused"


def test_an_approval_by_an_untrusted_console_key_runs_nothing(tmp_path: Path) -> None:
    """A console signing with a key the journal does not trust: the resume is recorded,
    and the journal refuses the approval as forged before the call runs, writing
    nothing."""
    url = f"sqlite:///{tmp_path}/console.db"
    with ae.open_store(url) as store:
        loop = paused(store, "pay-3")
    with console(url, "--allow-actions", "--key", key_file(tmp_path, MALLORY)) as c:
        assert approve(c.base, _session(c), "pay-3")[0] == 303
    with ae.open_store(url) as store:
        loop.store = store
        j = loop.journal()
        before = state(store)
        with pytest.raises(ae.ApprovalForged):
            loop.steps(j)
        assert state(store) == before and loop.ran == []


def test_key_without_actions_is_refused(tmp_path: Path) -> None:
    """--key without --allow-actions: exit 2 before anything is opened; ConsoleApp with
    an approver key and no actions: ConfigError."""
    assert main(["ui", "--key", key_file(tmp_path, ALICE)]) == 2
    with ae.open_store("memory://") as store, pytest.raises(ae.ConfigError):
        ConsoleApp(store, approver=ALICE)


def test_the_browser_approves_with_the_console_key(driver: Any, tmp_path: Path) -> None:
    """In Chromium: the run page shows the signing key, the operator fills in who and
    why and clicks "approve and resume"; the run is running and the call runs once."""
    url = f"sqlite:///{tmp_path}/console.db"
    with ae.open_store(url) as store:
        loop = paused(store, "pay-4")
    with console(url, "--allow-actions", "--key", key_file(tmp_path, ALICE)) as c:
        driver.get(c.login)
        wait(driver).until(lambda d: d.find_elements(By.ID, "streams"))
        driver.get(c.base + "/run?id=pay-4")
        assert ALICE.verifier.key_id.hex() in driver.find_element(By.ID, "signer").text
        form = driver.find_element(By.ID, "resume-form")
        form.find_element(By.NAME, "by").send_keys("alice")
        screenshot(driver, "approval-signed")
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait(driver).until(lambda d: "running" in d.find_element(By.ID, "run-status").text)
    with ae.open_store(url) as store:
        loop.store = store
        loop()
        assert loop.ran == ["pay-4:1"]


def test_the_start_line_spells_out_a_hidden_character_in_the_signers_name(
    tmp_path: Path,
) -> None:
    """An approver key named with a right-to-left override (keygen takes any name) is
    shown in the console's start line with it spelled out, as on the pages: a raw U+202E
    would reorder the operator's terminal line."""
    from tests.ui.conftest import build_sqlite

    key = SigningKey.generate("al\u202eice")
    with console(build_sqlite(tmp_path), "--allow-actions", "--key", key_file(tmp_path, key)) as c:
        pass
    text = "\n".join(c.stderr)
    assert "approvals signed by al⟨U+202E⟩ice+" in text
    assert "\u202e" not in text
