"""Public helpers for users and plugin authors: the store conformance suite.

``StoreContract`` (the suite every store passes) needs pytest; it is imported on first
access, so importing :mod:`ares_events.testing` itself never needs pytest.

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

__all__ = ["StoreContract", "run_concurrent_appenders", "store_state"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import sys

        if "ares_events.testing.contract" not in sys.modules:
            import pytest

            # Plain asserts in the suite get pytest's detailed failure messages. Only
            # before the first import: registering later would warn.
            pytest.register_assert_rewrite("ares_events.testing.contract")
        from ares_events.testing import contract

        value = getattr(contract, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ares_events.testing' has no attribute {name!r}")
