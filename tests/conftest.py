"""Shared pytest configuration.

Tests are marked by what they need, from the fixtures they use, so the quick tier
(``scripts/test --quick``: SQLite and PostgreSQL only) can leave out the rest without a
list to keep in step: ``citus`` (a Citus cluster), ``browser`` (headless Chromium),
``redis``, ``s3``; ``slow`` is set by hand on tests that take more than a few seconds.

``scripts/test`` runs the suite in parallel processes (pytest-xdist, ``--dist loadgroup``).
Each process has its own session fixtures (its own PostgreSQL database, Redis key prefix, S3
server); the tests that start a Citus cluster or a browser are grouped onto one process
each, so the machine runs one cluster and one Chromium, not one per process.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from tests.fixtures.tier import QUICK, examples

# Property tests without their own budget (hypothesis' default is 100 examples).
settings.register_profile("quick", max_examples=examples(100))
if QUICK:
    settings.load_profile("quick")

pytest_plugins = [
    "tests.fixtures.fix_backends",
    "tests.fixtures.fix_cells",
    "tests.fixtures.xdist_groups",
]

_NEEDS = {
    "citus_ports": "citus",
    "citus_coordinator": "citus",
    "citus_reused_prefix": "citus",
    "plain_cell_hosts": "slow",  # starts PostgreSQL servers of its own
    "driver": "browser",
    "redis_base_url": "redis",
    "s3_endpoint": "s3",
}


_LONG = ("slow", "citus", "browser")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, mark in _NEEDS.items():
            if fixture in names:
                item.add_marker(getattr(pytest.mark, mark))
        if "citus" in item.nodeid:  # cluster built inside the test (a cell moved, a restart)
            item.add_marker(pytest.mark.citus)
        if "[servers" in item.nodeid:  # cells on PostgreSQL servers started for the test
            item.add_marker(pytest.mark.slow)
        for group in ("citus", "browser"):
            if item.get_closest_marker(group) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
                break
    # Longest first: pytest-xdist hands tests out in this order, so the minute-long ones
    # (and the Citus and browser groups, each a queue on one process) start at once and
    # overlap with the rest instead of running alone at the end of the run.
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in _LONG))
