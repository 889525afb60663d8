"""The web console (``ares-events ui``): streams, runs and their timelines, integrity and
projections in a browser, rendered on the server.

Read-only by default: the store is opened with ``read_only=True`` (SQLite ``query_only``,
PostgreSQL read-only transactions) and nothing is appended. With ``--allow-actions`` the
run actions (resolve, resume, cancel) append the same audited events as the CLI.

What lives here: :mod:`.markup` (HTML that escapes everything by construction),
:mod:`.queries` (paged reads), :mod:`.views` and :mod:`.run_views` (the pages),
:mod:`.app` (the ASGI application: routes, CSRF, CSP, live updates; mountable behind a
user's own authentication), :mod:`.server` (``ares-events ui``: the app behind a
per-start session, served by uvicorn) and ``static/`` (one stylesheet, one script; no
CDN, no build).

It may import anything in the package below the CLI (it is a top-layer package).
"""

from __future__ import annotations

from ares_events.ui.app import CSP, ConsoleApp
from ares_events.ui.server import ConsoleServer

__all__ = ["CSP", "ConsoleApp", "ConsoleServer"]
