"""Fixtures for the web console: a real headless Chromium driven over WebDriver (Debian's
``chromium`` and ``chromium-driver``; scripts/test installs them), the console started as
the real command (``ares-events ui --port 0``) in its own process, and stores filled with
:mod:`tests.ui.fleet`. Screenshots go to ``build/ui-artifacts`` (or ``ARES_UI_ARTIFACTS``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from tests.ui import fleet

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ARES_UI_ARTIFACTS", ROOT / "build" / "ui-artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
START_TIMEOUT = 60  # seconds; only to turn a hang into a failure


@dataclass
class Console:
    """A running ``ares-events ui`` process."""

    proc: subprocess.Popen[str]
    base: str
    login: str
    stderr: list[str] = field(default_factory=list)

    def output(self) -> str:
        """Everything the process wrote to stderr so far."""
        return "".join(self.stderr)


@contextlib.contextmanager
def console(url: str, *args: str, env: dict[str, str] | None = None) -> Iterator[Console]:
    """Start ``ares-events --store URL ui --port 0 ARGS`` and wait for its URL."""
    cmd = [sys.executable, "-m", "ares_events", "--store", url, "ui", "--port", "0", *args]
    proc = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    lines: list[str] = []
    found: dict[str, str] = {}
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"open (http://\S+)", line)
            if m:
                found["login"] = m.group(1)
                ready.set()
        ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    ready.wait(START_TIMEOUT)
    try:
        assert "login" in found, f"the console did not start: {''.join(lines)}"
        login = found["login"]
        yield Console(proc, login.split("/?token=")[0], login, lines)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.fixture(scope="session")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium for the session, its network log kept."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.fail(
            f"no {' and no '.join(missing)}: apt-get install chromium chromium-driver "
            "(scripts/test installs them)",
            pytrace=False,
        )
    os.environ.setdefault("SE_AVOID_STATS", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    opts.set_capability("unhandledPromptBehavior", "ignore")
    d = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(30)
    try:
        yield d
    finally:
        d.quit()


def requested_urls(driver: Any) -> list[str]:
    """Every URL the browser asked for since the last call (the network log)."""
    out = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            out.append(msg["params"]["request"]["url"])
    return out


def screenshot(driver: Any, name: str) -> Path:
    """Save a screenshot of the current page as a test artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def build_sqlite(tmp_path: Path, **kw: Any) -> str:
    """A SQLite file store with the fleet in it; its URL."""
    url = f"sqlite:///{tmp_path / 'console.db'}"
    with ae.open_store(url, spill_threshold=1024, **kw) as store:
        fleet.build(store)
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file store with the fleet."""
    return build_sqlite(tmp_path)


@pytest.fixture
def pg_fleet_url(postgres_url: str, tmp_path: Path) -> str:
    """A PostgreSQL store (its own schema) with the fleet; blobs in a folder."""
    blobs = (tmp_path / "blobs").as_uri()
    with ae.open_store(postgres_url, blobs=blobs, spill_threshold=1024) as store:
        fleet.build(store)
    return postgres_url
