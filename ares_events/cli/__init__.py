"""The ``ares-events`` command line: :mod:`~ares_events.cli.common` (group, ``App``,
options, exit codes), :mod:`~ares_events.cli.terminal`, one module per command group, and
:func:`main`, which maps errors to exit codes (docs/cli.md).

It may import anything in the package (the CLI is the top layer). The command modules
import :mod:`~ares_events.cli.common`, never each other or this package.
"""

from __future__ import annotations

import io
import logging
import sys
import traceback

import click

# Importing a command module registers its commands on the group.
from ares_events.archive import cli as archive_cli  # noqa: F401
from ares_events.cli import (  # noqa: F401
    anchors,
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
    EXIT_CONFLICT,
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
    secret_args,
    visible,
)
from ares_events.errors import (
    ArchiveError,
    AresError,
    BlobError,
    ChainIntegrityError,
    ConcurrencyError,
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
    "EXIT_CONFLICT",
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

install_global_options(cli)  # --store, --blobs, -v, -q after the subcommand too


def _fail(
    app: App,
    argv: list[str] | None,
    exc: BaseException,
    kind: str,
    code: int,
    message: str | None = None,
    *,
    human: str | None = None,
) -> int:
    """Report a failure: the human message on stderr (made visible) and, with ``--json``,
    one ``{"error": {...}}`` object on stdout (unless the command's object is out
    already); return the exit code. No secret of the configuration reaches either."""
    app.remember_configured_secrets()
    # One line: driver messages (e.g. libpq's) may span several.
    line = app.scrub(" ".join((str(exc) if message is None else message).split()))
    if human is None:
        click.echo(f"{PROG}: error: {visible(line)}", err=True)
    else:
        click.echo(visible(app.scrub(human), keep="\n"), err=True, nl=False)
    # --json was asked for, also when parsing failed before the option was read.
    args = list(sys.argv[1:] if argv is None else argv)
    args = args[: args.index("--")] if "--" in args else args
    if (app.json_requested or app.json_default or "--json" in args) and not app.json_written:
        error = {"kind": kind, "type": type(exc).__name__, "message": line, "exit_code": code}
        app.json({"error": error})
    return code


_FINDINGS: tuple[type[AresError], ...] = (ChainIntegrityError, SnapshotMismatch, BlobError)
_FINDINGS += (ReplayCapExceeded, ProofError, PayloadErased)
_EXIT_BY_ERROR: tuple[tuple[type[AresError] | tuple[type[AresError], ...], str, int], ...] = (
    ((ConfigError, MissingDependencyError), "config", EXIT_USAGE),
    ((InvalidEvent, EventNotFound), "usage", EXIT_USAGE),
    (StoreError, "unavailable", EXIT_UNAVAILABLE),
    (_FINDINGS, "findings", EXIT_FINDINGS),
    (ConcurrencyError, "conflict", EXIT_CONFLICT),  # another writer got there first: run it again
    (AresError, "error", EXIT_USAGE),  # reported as usage, named by its class
)
"""(classes, JSON ``kind``, exit code) of library errors, the first match wins."""


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (console script ``ares-events``): 0 clean,
    1 findings, 2 usage or config error, 3 store unavailable, 4 internal error, 5 conflict
    (another writer changed the store first; run it again), 130 aborted.

    An error is one line on stderr; with ``--json`` also one JSON object on stdout,
    ``{"error": {"kind", "type", "message", "exit_code"}}``, ``kind`` being ``usage``,
    ``config``, ``findings``, ``unavailable``, ``conflict``, ``internal`` or ``aborted``.

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when None.
    """
    app = App()
    app.secrets |= secret_args(sys.argv[1:] if argv is None else argv)
    saved_level = logging.getLogger("ares_events").level
    install_global_options(cli)  # commands registered since import get them too
    try:
        rv = cli.main(args=argv, prog_name=PROG, standalone_mode=False, obj=app)
    except click.UsageError as exc:
        usage = io.StringIO()
        exc.show(file=usage)
        no_args = isinstance(exc, click.exceptions.NoArgsIsHelpError)
        msg = "a command is needed" if no_args else exc.format_message()
        return _fail(app, argv, exc, "usage", EXIT_USAGE, msg, human=usage.getvalue())
    except click.ClickException as exc:
        kind = {EXIT_FINDINGS: "findings", EXIT_CONFLICT: "conflict"}.get(exc.exit_code, "usage")
        return _fail(app, argv, exc, kind, exc.exit_code, exc.format_message())
    except click.Abort as exc:
        return _fail(app, argv, exc, "aborted", 130, "aborted")
    except ArchiveError as exc:  # an archived segment missing or altered: a finding
        if exc.kind in ("missing", "corrupted", "unreadable"):
            return _fail(app, argv, exc, "findings", EXIT_FINDINGS)
        return _fail(app, argv, exc, "unavailable", EXIT_UNAVAILABLE)
    except AresError as exc:
        kind, code = next((k, c) for cls, k, c in _EXIT_BY_ERROR if isinstance(exc, cls))
        message = f"{type(exc).__name__}: {exc}" if kind == "error" else None
        return _fail(app, argv, exc, "usage" if kind == "error" else kind, code, message)
    except BrokenPipeError:
        return EXIT_OK  # the reader went away (ares-events tail ... | head)
    except Exception as exc:
        if app.verbose:
            app.remember_configured_secrets()
            tb = visible(app.scrub(traceback.format_exc()), keep="\n")
            click.echo(tb, err=True, nl=False)
        hint = "" if app.verbose else " (run with -v for the traceback)"
        message = f"internal error: {type(exc).__name__}: {exc}{hint}"
        return _fail(app, argv, exc, "internal", EXIT_INTERNAL, message)
    finally:
        _reset_logging(saved_level)
    return int(rv) if isinstance(rv, int) else EXIT_OK
