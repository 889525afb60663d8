"""The PostgreSQL backend's URL parameters and keyword options, parsed once
(docs/configuration.md).

It may import the core (``StoreURL``, ``parse_bool``), :mod:`ares_events.errors` and psycopg.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg

from ares_events.core.url import StoreURL, parse_bool, parse_int, parse_seconds
from ares_events.errors import ConfigError

__all__ = [
    "OWN_PARAMS",
    "SECRET_PARAMS",
    "PostgresOptions",
    "check_schema_name",
    "libpq_options",
    "parse_options",
]

OWN_PARAMS: Final = (
    "schema",
    "pool_min",
    "pool_max",
    "pool_timeout",
    "statement_timeout",
    "page_size",
    "migrate",
    "notify",
)
KEYWORD_OPTIONS: Final = ("create", "read_only")
"""Keyword-only options of ``open_store`` (not URL parameters)."""
# A schema name is an SQL identifier here, not free text: letters, digits and "_",
# starting with a letter or "_", at most 63 bytes. Quoting alone is not enough: "%" or
# "?" inside a quoted name would still reach the driver's placeholder parser.
_SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
# libpq options that carry a secret: refused in the query string, where they would be shown.
SECRET_PARAMS: Final = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PostgresOptions:
    """Everything a ``postgresql://`` URL and the keyword options configure."""

    where: str
    """The URL, redacted (for messages)."""
    schema: str
    pool_min: int
    pool_max: int
    pool_timeout: float
    statement_timeout: int | None
    page_size: int
    migrate: bool
    notify: bool
    create: bool = True
    read_only: bool = False
    connect_kwargs: dict[str, Any] = field(repr=False)
    """Keyword arguments of ``psycopg.connect`` (may hold the password: never shown)."""


def check_schema_name(schema: object, where: str) -> str:
    """Return ``schema`` when it is a plain SQL identifier.

    Raises:
        ConfigError: anything else (names the rule; "%", "?", quotes, dots are refused).
    """
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise ConfigError(
            f"postgresql schema must be 1-63 letters, digits or '_' and start with a letter "
            f"or '_', got {schema!r} in {where}"
        )
    return schema


def libpq_options() -> frozenset[str]:
    """Every connection option this libpq knows."""
    return frozenset(o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults())


def parse_options(url: StoreURL, options: dict[str, Any]) -> PostgresOptions:
    """Check and type the URL's parameters; keyword ``options`` override them.

    Raises:
        ConfigError: a secret in the query string, an unknown parameter (lists the valid
            ones), an invalid value (names it) or a control character in a connection
            value (names the field, never shows the value).
    """
    where = url.redacted()
    params = url.params
    libpq = libpq_options()
    secret = sorted(set(params) & SECRET_PARAMS)
    if secret:
        raise ConfigError(
            f"parameter(s) {', '.join(secret)} carry a secret and must not be in the "
            "query string of a store URL; put the password percent-encoded in the URL "
            "(postgresql://user:password@host/db) or use a passfile"
        )
    unknown = sorted(set(params) - set(OWN_PARAMS) - libpq)
    unknown_opts = sorted(set(options) - set(OWN_PARAMS) - set(KEYWORD_OPTIONS))
    if unknown or unknown_opts:
        # The URL's names only as unknown_params shows them (one that is no plain word may
        # be the tail of a password whose unencoded '?' began the query); keyword options
        # come from code and are named.
        names = [url.unknown_params(unknown)] if unknown else ["unknown parameter(s)"]
        if unknown_opts:
            names.append(", ".join(unknown_opts))
        raise ConfigError(
            # An unknown parameter may be a mistyped secret (pasword=): its value is hidden.
            f"{', '.join(names) if unknown else ' '.join(names)} for "
            f"{url.redacted(unknown)}; "
            f"valid: {', '.join(OWN_PARAMS)}, or any libpq option "
            f"({', '.join(sorted(libpq - SECRET_PARAMS))})"
        )
    own: dict[str, Any] = {k: v for k, v in params.items() if k in OWN_PARAMS}
    own.update(options)
    schema = check_schema_name(own.get("schema", "public"), where)
    pool_min = parse_int(own.get("pool_min", 1), "pool_min", where, minimum=0)
    pool_max = parse_int(own.get("pool_max", max(10, pool_min)), "pool_max", where)
    if pool_min > pool_max:
        raise ConfigError(f"pool_min ({pool_min}) must not exceed pool_max ({pool_max}) in {where}")
    pool_timeout = parse_seconds(own.get("pool_timeout", 30.0), "pool_timeout", where)
    stmt_timeout = None
    if "statement_timeout" in own:
        stmt_timeout = parse_int(own["statement_timeout"], "statement_timeout", where)
    page_size = parse_int(own.get("page_size", 2000), "page_size", where)
    migrate = parse_bool(own.get("migrate", True), "migrate", where)
    notify = parse_bool(own.get("notify", True), "notify", where)
    kwargs: dict[str, Any] = {k: v for k, v in params.items() if k in libpq}
    for key, value in (("host", url.host), ("port", url.port), ("user", url.username)):
        if value:
            kwargs.setdefault(key, str(value))
    if url.password is not None:
        kwargs["password"] = url.password
    dbname = url.path.lstrip("/")
    if dbname:
        kwargs.setdefault("dbname", dbname)
    for key, value in kwargs.items():
        # libpq reads a value as a C string: a NUL would cut it, and drop every option
        # after it (dbname, connect_timeout, read-only), silently. The value may be the
        # password: never shown.
        if isinstance(value, str) and _CONTROL.search(value):
            raise ConfigError(
                f"postgresql {key} holds a control character (%00-%1F or %7F), which "
                f"libpq cannot take, in {where}"
            )
    # Never wait forever for a server that does not answer (libpq's default is to wait):
    # a dead or unreachable server is reported within a few seconds.
    kwargs.setdefault("connect_timeout", "5")
    kwargs["autocommit"] = True
    read_only = parse_bool(own.get("read_only", False), "read_only", where)
    if read_only:
        # Every transaction of every connection of the pool is read-only (the server
        # refuses a write), and nothing is created or migrated on open.
        extra = "-c default_transaction_read_only=on"
        kwargs["options"] = f"{kwargs['options']} {extra}" if kwargs.get("options") else extra
        migrate = False
    return PostgresOptions(
        where=where,
        schema=schema,
        pool_min=pool_min,
        pool_max=pool_max,
        pool_timeout=pool_timeout,
        statement_timeout=stmt_timeout,
        page_size=page_size,
        migrate=migrate,
        notify=notify,
        create=parse_bool(own.get("create", True), "create", where) and not read_only,
        read_only=read_only,
        connect_kwargs=kwargs,
    )
