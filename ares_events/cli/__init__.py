"""The ``ares-events`` command line: one module per command group.

Exit codes: 0 clean, 1 findings, 2 usage or configuration error, 3 store unavailable
(or no store at that URL), 4 internal error (a bug: the traceback is printed with ``-v``).

What lives here: :mod:`~ares_events.cli.common` (the click group ``cli``, ``App``,
``json_option``, ``pass_app``, the ``EXIT_*`` codes and the shared display helpers), one
module per command group, each registering its commands on the group when imported
(:mod:`~ares_events.cli.inspect`: init, streams, tail, verify, audit;
:mod:`~ares_events.cli.state`: recover, snapshot, rebuild; :mod:`~ares_events.cli.blobs`:
gc-blobs; :mod:`~ares_events.cli.anchors`: anchor; :mod:`~ares_events.cli.demo`: demo;
:mod:`~ares_events.cli.bench`: bench; :mod:`~ares_events.cli.runs`: runs list, show,
resolve, resume, cancel; :mod:`~ares_events.cli.proofs`: keygen, checkpoint, prove,
verify-proof; :mod:`~ares_events.cli.records`: export, verify-record;
:mod:`~ares_events.cli.erasure`: erase; :mod:`~ares_events.cli.witness`:
witness; :mod:`~ares_events.cli.console`: ui), and here :func:`main`, which maps errors to
exit codes.
witness; :mod:`~ares_events.cli.archive`: archive), and here :func:`main`, which maps
errors to exit codes.

It may import anything in the package (the CLI is the top layer). The command modules
import :mod:`~ares_events.cli.common`, never each other or this package.
"""

from __future__ import annotations

import logging
import traceback

import click

# Importing a command module registers its commands on the group.
from ares_events.cli import (  # noqa: F401
    anchors,
    archive,
    bench,
    blobs,
    cells,
    console,
    demo,
    erasure,
    inspect,
    proofs,
    records,
    runs,
    state,
    witness,
)
from ares_events.cli.common import (
    EXIT_FINDINGS,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    PROG,
    App,
    _reset_logging,
    cli,
    install_global_options,
    json_option,
    pass_app,
)
from ares_events.errors import (
    ArchiveError,
    AresError,
    BlobError,
    ChainIntegrityError,
    ConfigError,
    EventNotFound,
    InvalidEvent,
    MissingDependencyError,
    PayloadErased,
    ProofError,
    ReplayCapExceeded,
    SnapshotMismatch,
    StoreError,
)

__all__ = [
    "EXIT_FINDINGS",
    "EXIT_INTERNAL",
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

install_global_options(cli)  # --store, --blobs, -v, -q after the subcommand too


def _error(app: App, message: str) -> None:
    # One line: driver messages (e.g. libpq's) may span several.
    click.echo(f"{PROG}: error: {app.scrub(' '.join(message.split()))}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (console script ``ares-events``).

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        0 clean, 1 findings, 2 usage or config error, 3 store unavailable, 4 internal
        error.
    """
    app = App()
    saved_level = logging.getLogger("ares_events").level
    install_global_options(cli)  # commands registered since import get them too
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
    except (ConfigError, InvalidEvent, MissingDependencyError, EventNotFound) as exc:
        _error(app, str(exc))
        return EXIT_USAGE
    except ArchiveError as exc:  # an archived segment missing or altered: a finding
        _error(app, str(exc))
        return EXIT_FINDINGS if exc.kind in ("missing", "corrupted", "unreadable") else 3
    except StoreError as exc:
        _error(app, str(exc))
        return EXIT_UNAVAILABLE
    except (
        ChainIntegrityError,
        SnapshotMismatch,
        BlobError,
        ReplayCapExceeded,
        ProofError,
        PayloadErased,
    ) as exc:
        _error(app, str(exc))
        return EXIT_FINDINGS
    except AresError as exc:
        _error(app, f"{type(exc).__name__}: {exc}")
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK  # the reader went away (ares-events tail ... | head)
    except Exception as exc:
        if app.verbose:
            click.echo(app.scrub(traceback.format_exc()), err=True)
        _error(
            app,
            f"internal error: {type(exc).__name__}: {exc}"
            + ("" if app.verbose else " (run with -v for the traceback)"),
        )
        return EXIT_INTERNAL
    finally:
        _reset_logging(saved_level)
    return int(rv) if isinstance(rv, int) else EXIT_OK
