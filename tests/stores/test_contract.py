"""The shared store conformance suite, run on every backend of the ``store`` fixture."""

from __future__ import annotations

from ares_events.testing import StoreContract


class TestStoreContract(StoreContract):
    """Every behaviour all stores share (memory, sqlite, postgres)."""
