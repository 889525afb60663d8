"""Fixtures shared by the CLI tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the caller's ARES_* variables out of a test (the CLI reads them as defaults)."""
    for name in list(os.environ):
        if name.startswith("ARES_"):
            monkeypatch.delenv(name)
