"""Public helpers for users and plugin authors: the store conformance suite.

``StoreContract`` (the suite every store passes) and ``SnapshotContract`` (the suite every
snapshot store passes) need pytest; they are imported on first access, so importing
:mod:`ares_events.testing` itself never needs pytest.

Example::

    from ares_events.testing import StoreContract

    class TestMyStore(StoreContract):  # with `store` and `store_url` fixtures
        pass
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ares_events.testing.contract import (
        StoreContract,
        run_concurrent_appenders,
        store_state,
    )
    from ares_events.testing.snapshots import SnapshotContract

__all__ = ["SnapshotContract", "StoreContract", "run_concurrent_appenders", "store_state"]
_HOME = {"SnapshotContract": "snapshots"}


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib
        import sys

        module_name = f"ares_events.testing.{_HOME.get(name, 'contract')}"
        if module_name not in sys.modules:
            import pytest

            # Plain asserts in the suite get pytest's detailed failure messages. Only
            # before the first import: registering later would warn.
            pytest.register_assert_rewrite(module_name)
        value = getattr(importlib.import_module(module_name), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ares_events.testing' has no attribute {name!r}")
