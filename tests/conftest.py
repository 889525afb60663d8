"""Shared pytest configuration."""

from __future__ import annotations

pytest_plugins = ["tests.fix_backends", "tests.fix_cells"]
