"""The web console (``ares-events ui``, docs/ui.md): :mod:`.markup`, :mod:`.queries`,
:mod:`.views` and :mod:`.run_views` (the pages), :mod:`.app` (the ASGI application),
:mod:`.server` (the session and uvicorn) and ``static/``.

It may import anything in the package below the CLI (it is a top-layer package).
"""

from __future__ import annotations

from ares_events.errors import MissingDependencyError

try:  # the ``ui`` extra; without it, the hint to install it (exit 2 from the CLI)
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:
    raise MissingDependencyError("the web console (ares-events ui)", "ui") from exc

from ares_events.ui.app import CSP, ConsoleApp
from ares_events.ui.server import ConsoleServer

__all__ = ["CSP", "ConsoleApp", "ConsoleServer"]
