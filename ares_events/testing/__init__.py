"""Public helpers for users and plugin authors: the store conformance suites, imported
on first access (so importing this package never needs pytest).

It is the top layer: it may import anything in the package (and pytest, on first access
to a suite).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ares_events.testing.contract import StoreContract, run_concurrent_appenders, store_state
    from ares_events.testing.snapshots import SnapshotContract

__all__ = ["SnapshotContract", "StoreContract", "run_concurrent_appenders", "store_state"]
_HOME = {"SnapshotContract": "snapshots"}
# Modules whose plain asserts pytest should rewrite, per home module: the suite's own
# module and the modules it is assembled from.
_REWRITE = {
    "contract": (
        "_contract_helpers",
        "_contract_writes",
        "_contract_reads",
        "_contract_lifecycle",
        "_contract_erase",
        "contract",
    ),
    "snapshots": ("snapshots",),
}


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib
        import sys

        home = _HOME.get(name, "contract")
        fresh = [
            f"ares_events.testing.{m}"
            for m in _REWRITE[home]
            if f"ares_events.testing.{m}" not in sys.modules
        ]
        if fresh:
            import pytest

            # Plain asserts in the suite get pytest's detailed failure messages. Only
            # before the first import: registering later would warn.
            pytest.register_assert_rewrite(*fresh)
        value = getattr(importlib.import_module(f"ares_events.testing.{home}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ares_events.testing' has no attribute {name!r}")
