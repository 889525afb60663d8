"""Store URLs, parsed once at the edge: :class:`StoreURL` and its redaction (the only form
of a URL ever logged or shown).

It may import :mod:`ares_events.errors` only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ares_events.errors import ConfigError

__all__ = ["StoreURL", "parse_bool", "parse_int", "parse_seconds", "redact_url"]


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL. ``redacted()`` is the only form ever logged or shown."""

    raw: str
    scheme: str
    username: str | None
    password: str | None
    host: str | None
    port: int | None
    path: str
    query: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, url: str, *, source: str = "store URL") -> StoreURL:
        """Parse ``url``.

        Raises:
            ConfigError: the URL has no scheme, does not parse, has an invalid port or
                holds a "#" (a fragment: written %23 in a path or password).
        """
        if not isinstance(url, str) or "://" not in url:
            raise ConfigError(f"{source} must look like scheme://..., got {redact_url(str(url))!r}")
        if "#" in url:
            # urlsplit cuts the URL at '#' (a fragment no store reads): sqlite:///runs#1.db
            # and sqlite:///runs#2.db would both open "runs". Not shown: it may be a password.
            raise ConfigError(
                f"{source} holds a '#', which would end the URL there (a fragment): write it "
                "as %23 (in a path or a password)"
            )
        try:
            parts = urlsplit(url)
        except ValueError:  # the reason may quote the netloc, password and all: not shown
            raise ConfigError(
                f"{source} does not parse as a URL (a bracket, a character?)"
            ) from None
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"{source} has an invalid port") from None
        return cls(
            raw=url,
            scheme=parts.scheme.lower(),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            host=parts.hostname,
            port=port,
            path=unquote(parts.path),
            query=tuple(parse_qsl(parts.query, keep_blank_values=True)),
        )

    @property
    def params(self) -> dict[str, str]:
        """Query parameters (last one wins)."""
        return dict(self.query)

    def check_params(self, allowed: Sequence[str]) -> dict[str, str]:
        """Return the query parameters, refusing unknown ones.

        Raises:
            ConfigError: a parameter is not in ``allowed``; lists the valid ones.
        """
        params = self.params
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise ConfigError(
                f"unknown parameter(s) {', '.join(unknown)} in "
                # An unknown parameter may be a mistyped secret (pasword=): its value is hidden.
                f"{self.redacted(unknown)}; valid: {', '.join(sorted(allowed)) or 'none'}"
            )
        return params

    def redacted(self, hide: Sequence[str] = ()) -> str:
        """The URL with any password, and the values of the parameters named in ``hide``,
        replaced by ``***``."""
        url = redact_url(self.raw)
        for name in hide:
            url = re.sub(rf"([?&;]{re.escape(name)}=)[^&#]*", r"\1***", url)
        return url

    def __repr__(self) -> str:
        return f"StoreURL({self.redacted()!r})"

    __str__ = redacted


# Query parameters that carry credentials (libpq takes password= and sslpassword=).
_SECRET_PARAM: Final = re.compile(
    r"([?&;][^=&#]*(?:password|secret|token|passwd)[^=&#]*=)[^&#]*", re.IGNORECASE
)


_BOOLS: Final = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_bool(value: object, name: str, where: str) -> bool:
    """A boolean URL parameter or option: a bool, or true/false/1/0/yes/no.

    Raises:
        ConfigError: anything else (names the parameter and the redacted URL).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _BOOLS:
        return _BOOLS[value.lower()]
    raise ConfigError(f"{name} must be true or false, got {value!r} in {where}")


def parse_int(value: object, name: str, where: str, *, minimum: int = 1) -> int:
    """An integer URL parameter or option: an int, or its digits (never a bool or a float,
    which ``int()`` would truncate), at least ``minimum`` and at most 2**63-1.

    Raises:
        ConfigError: anything else (names the parameter and the redacted URL).
    """
    if type(value) is str and value.strip().lstrip("+-").isdigit():
        value = int(value)
    if type(value) is not int:
        raise ConfigError(f"{name} must be an integer, got {value!r:.40} in {where}")
    if not minimum <= value <= 2**63 - 1:
        raise ConfigError(f"{name} must be >= {minimum} (and < 2**63), got {value} in {where}")
    return value


def parse_seconds(value: object, name: str, where: str) -> float:
    """A duration in seconds: an int, a float or their text, finite and > 0 (never a bool).

    Raises:
        ConfigError: anything else (names the parameter and the redacted URL).
    """
    seconds = None
    if type(value) in (int, float, str):
        try:
            seconds = float(value)  # type: ignore[arg-type]
        except ValueError:
            seconds = None
    if seconds is None or not 0 < seconds < float("inf"):
        raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r:.40} in {where}")
    return seconds


def redact_url(url: str) -> str:
    """``url`` with its password and credential-like query parameters replaced by ``***``."""
    return _SECRET_PARAM.sub(r"\1***", _redact_userinfo(url))


def _redact_userinfo(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        # urlsplit sees no password when one holds an unencoded '/', '?' or '#', or when
        # the scheme is missing: redact anything shaped like "user:secret@" regardless.
        head, at, tail = url.rpartition("@")
        prefix, sep, userinfo = head.partition("://")
        if not sep:
            prefix, userinfo = "", head
        user, colon, _ = userinfo.partition(":")
        if not at or not colon:
            return url
        return f"{prefix}{sep}{user}:***@{tail}"
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = quote(unquote(parts.username or ""), safe="")
    return parts._replace(netloc=f"{user}:***@{netloc}").geturl()
