"""The store conformance suite: :class:`StoreContract`, assembled from the
``_contract_*.py`` modules (which may import the public API and pytest).

Subclass it in a collected module with a ``store_url`` fixture (a fresh store's URL) and a
``store`` fixture that opens that same URL; optional capabilities skip when undeclared.
"""

from __future__ import annotations

from ares_events.testing._contract_erase import EraseContract
from ares_events.testing._contract_helpers import run_concurrent_appenders, store_state
from ares_events.testing._contract_lifecycle import LifecycleContract
from ares_events.testing._contract_reads import ReadContract
from ares_events.testing._contract_writes import WriteContract

__all__ = ["StoreContract", "run_concurrent_appenders", "store_state"]


class StoreContract(WriteContract, ReadContract, LifecycleContract, EraseContract):
    """Behaviour every event store shares. Subclass it with ``store``/``store_url``
    fixtures (the module docstring)."""
