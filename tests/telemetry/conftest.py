"""Fixtures of the telemetry tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.fix_backends import store_url_for
from tests.telemetry.otel_helpers import Otel, otel_setup


@pytest.fixture
def otel() -> Iterator[Otel]:
    """In-memory exporters configured for ares-events (content capture off)."""
    yield from otel_setup()


@pytest.fixture
def otel_content() -> Iterator[Otel]:
    """In-memory exporters with GenAI content capture opted into."""
    yield from otel_setup(capture_content=True)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def real_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL on a real database (SQLite file or PostgreSQL)."""
    return store_url_for(str(request.param), tmp_path, request)
