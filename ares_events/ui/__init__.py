"""The web console (``ares-events ui``, docs/ui.md): :mod:`.markup`, :mod:`.queries`,
:mod:`.views` and :mod:`.run_views` (the pages), :mod:`.app` (the ASGI application),
:mod:`.server` (the session and uvicorn) and ``static/``.

It may import anything in the package below the CLI (it is a top-layer package).
"""

from __future__ import annotations

from ares_events.ui.app import CSP, ConsoleApp
from ares_events.ui.server import ConsoleServer

__all__ = ["CSP", "ConsoleApp", "ConsoleServer"]
