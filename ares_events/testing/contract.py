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

``store`` and ``store_url`` must name the same store: a test may open ``store_url`` a
second time to check what another open sees. Tests of optional capabilities
(:class:`~ares_events.stores.Capability`) skip with a reason when the store does not
declare the capability; every other test always runs.

The class name deliberately does not start with ``Test``, so pytest does not collect it
where it is defined. It is assembled from :class:`WriteContract` (``_contract_writes.py``),
:class:`ReadContract` (``_contract_reads.py``), :class:`LifecycleContract`
(``_contract_lifecycle.py``: identity and close), :class:`EraseContract`
(``_contract_erase.py``: ``Capability.ERASE``) and :class:`PagesContract`
(``_contract_pages.py``: ``streams_page``); the helpers
live in ``_contract_helpers.py``. These modules may import the public API
(``ares_events``) and pytest.
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
