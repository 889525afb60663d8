"""The ``ares-events`` command line: one module per command group.

Exit codes: 0 clean, 1 findings (or a command failed for another reason, said on
stderr), 2 usage or configuration error, 3 store unavailable.

What lives here: :mod:`~ares_events.cli.common` (the click group ``cli``, ``App``,
``json_option``, ``pass_app``, the ``EXIT_*`` codes and the shared display helpers), one
module per command group, each registering its commands on the group when imported
(:mod:`~ares_events.cli.inspect`: init, streams, tail, verify, audit;
:mod:`~ares_events.cli.state`: recover, snapshot, rebuild; :mod:`~ares_events.cli.blobs`:
gc-blobs; :mod:`~ares_events.cli.anchors`: anchor; :mod:`~ares_events.cli.demo`: demo;
:mod:`~ares_events.cli.bench`: bench; :mod:`~ares_events.cli.runs`: runs list, show,
resolve, resume, cancel), and here :func:`main`, which maps errors to exit
codes.

It may import anything in the package (the CLI is the top layer). The command modules
import :mod:`~ares_events.cli.common`, never each other or this package.
"""

from __future__ import annotations

import logging

import click

# Importing a command module registers its commands on the group.
from ares_events.cli import anchors, bench, blobs, demo, inspect, runs, state  # noqa: F401
from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    PROG,
    App,
    _reset_logging,
    cli,
    json_option,
    pass_app,
)
from ares_events.errors import (
    AresError,
    ChainIntegrityError,
    ConfigError,
    InvalidEvent,
    MissingDependencyError,
    StoreError,
    StoreUnavailable,
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

logger = logging.getLogger(__name__)


def _error(app: App, message: str) -> None:
    # One line: driver messages (e.g. libpq's) may span several.
    click.echo(f"{PROG}: error: {app.scrub(' '.join(message.split()))}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (console script ``ares-events``).

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        0 clean, 1 findings, 2 usage or config error, 3 store unavailable.
    """
    app = App()
    saved_level = logging.getLogger("ares_events").level
    try:
        rv = cli.main(args=argv, prog_name=PROG, standalone_mode=False, obj=app)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        return EXIT_USAGE
    except click.UsageError as exc:
        exc.show()
        return EXIT_USAGE
    except click.ClickException as exc:
        _error(app, exc.format_message())
        return exc.exit_code
    except click.Abort:
        _error(app, "aborted")
        return 130
    except (ConfigError, InvalidEvent, MissingDependencyError) as exc:
        _error(app, str(exc))
        return EXIT_USAGE
    except (StoreUnavailable, StoreError) as exc:
        _error(app, str(exc))
        return EXIT_UNAVAILABLE
    except ChainIntegrityError as exc:
        _error(app, str(exc))
        return EXIT_FINDINGS
    except AresError as exc:
        _error(app, f"{type(exc).__name__}: {exc}")
        return EXIT_FINDINGS
    except BrokenPipeError:
        return EXIT_FINDINGS
    except Exception as exc:
        logger.debug("internal error", exc_info=True)
        _error(app, f"internal error: {type(exc).__name__}: {exc} (run with -vv for details)")
        return EXIT_FINDINGS
    finally:
        _reset_logging(saved_level)
    return int(rv) if isinstance(rv, int) else EXIT_OK
