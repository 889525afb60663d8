"""The ``ares-events`` command line: one module per command group.

What lives here: :mod:`~ares_events.cli.common` (the click group ``cli``, ``App``,
``json_option``, ``pass_app``, the ``EXIT_*`` codes, display helpers and ``main``) and the
command modules, each of which registers its commands on the group when imported:
:mod:`~ares_events.cli.state` (recover, snapshot, rebuild), :mod:`~ares_events.cli.demo`
(demo) and :mod:`~ares_events.cli.bench` (bench).

It may import anything in the package (it is the top layer). The command modules import
:mod:`~ares_events.cli.common`, never each other or this package.
"""

from __future__ import annotations

from ares_events.cli import demo, state  # noqa: F401 - importing registers the commands
from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    App,
    cli,
    json_option,
    main,
    pass_app,
)

__all__ = [
    "EXIT_FINDINGS",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "App",
    "cli",
    "json_option",
    "main",
    "pass_app",
]
