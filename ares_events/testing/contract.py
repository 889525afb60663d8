"""The store conformance suite: :class:`StoreContract`.

Every store passes the same tests. Subclass :class:`StoreContract` in a module pytest
collects and provide two fixtures::

    import ares_events as ae
    from ares_events.testing import StoreContract

    @pytest.fixture
    def store_url(tmp_path) -> str:          # a fresh, empty store's URL
        return f"mystore://{tmp_path}/db"

    @pytest.fixture
    def store(store_url) -> Iterator[ae.EventStore]:   # that store, opened
        with ae.open_store(store_url) as s:
            yield s

    class TestMyStore(StoreContract):
        pass

``store`` and ``store_url`` must name the same store (a test may open ``store_url`` again).
Tests of optional capabilities skip when the store does not declare them. The name does
not start with ``Test``, so pytest does not collect it here. It is assembled from the
``_contract_*.py`` modules (writes, reads, lifecycle, erase, pages; helpers), which may
import the public API and pytest.
"""

from __future__ import annotations

from ares_events.testing._contract_erase import EraseContract
from ares_events.testing._contract_helpers import run_concurrent_appenders, store_state
from ares_events.testing._contract_lifecycle import LifecycleContract
from ares_events.testing._contract_pages import PagesContract
from ares_events.testing._contract_reads import ReadContract
from ares_events.testing._contract_writes import WriteContract

__all__ = ["StoreContract", "run_concurrent_appenders", "store_state"]


class StoreContract(WriteContract, ReadContract, LifecycleContract, EraseContract, PagesContract):
    """Behaviour every event store shares. Subclass it with ``store``/``store_url``
    fixtures (see the module docstring)."""
