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
            ConfigError: the URL has no scheme, does not parse, has an invalid port,
                holds a "#" (a fragment: written %23 in a path or password), or holds an
                "@" after its host part where a password with an unencoded "?" or "/"
                would put it (the message shows nothing of the URL).
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
        query = tuple(parse_qsl(parts.query, keep_blank_values=True))
        if _cut_userinfo(parts.netloc, parts.path, parts.query) and (
            parts.netloc.startswith(":")
            or parts.netloc.endswith(":")
            or "@" in parts.path
            or any("@" in name for name, _ in query)
        ):
            # urlsplit ended the host part at a '?' or '/' in a password ("user:?pw@host",
            # "user:12/pw@host"): the rest of the password would become a parameter name,
            # a database or a port, and be echoed by later errors. An '@' in the path or in
            # a parameter's name, or after an empty host or port, is read as that. An '@'
            # in a parameter's value after host:port is not (?user=admin@server, Azure).
            # Nothing of the URL is shown.
            raise ConfigError(
                f"{source} holds an '@' after its host part, as when a password holds an "
                f"unencoded '?' or '/': {_ENCODE_HINT}, an '@' in a path or a parameter as %40"
            )
        return cls(
            raw=url,
            scheme=parts.scheme.lower(),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            host=parts.hostname,
            port=port,
            path=unquote(parts.path),
            query=query,
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
                f"{self.unknown_params(unknown)} in "
                # An unknown parameter may be a mistyped secret (pasword=): its value is hidden.
                f"{self.redacted(unknown)}; valid: {', '.join(sorted(allowed)) or 'none'}"
            )
        return params

    def unknown_params(self, names: Sequence[str]) -> str:
        """ "unknown parameter(s) a, b": the start of an error about the URL's unknown
        query parameters, naming only those that cannot be part of a password.

        A name that is not a plain word (letters, digits, '_', '.', '-') is not shown: it
        may be the tail of a password whose unencoded '?' began the query. No name is shown
        when the URL holds an '@' after a host part with a ':' (user:2024?x=pw@host may be
        such a password too, cut after "2024").
        """
        parts = urlsplit(self.raw)  # parsed once already: it does not raise
        cut = _cut_userinfo(parts.netloc, parts.path, parts.query)
        shown = [] if cut else [n for n in names if _PLAIN_NAME.fullmatch(n)]
        hidden = len(names) - len(shown)
        if not hidden:
            return f"unknown parameter(s) {', '.join(shown)}"
        text = f"{hidden} unknown parameter(s) not shown ({_ENCODE_HINT})"
        return f"unknown parameter(s) {', '.join(shown)} and {text}" if shown else text

    def redacted(self, hide: Sequence[str] = ()) -> str:
        """The URL with any password, and the values of the parameters named in ``hide``,
        replaced by ``***`` (the whole query when one of them is no plain word: such a name
        is not shown, see :meth:`unknown_params`)."""
        url = redact_url(self.raw)
        if not all(_PLAIN_NAME.fullmatch(name) for name in hide):
            return f"{url.partition('?')[0]}?***"
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


# A name a parameter of ours or libpq's could have: only such unknown names are echoed.
_PLAIN_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")

_ENCODE_HINT: Final = "a password holding '?', '/' or '#' must be percent-encoded (%3F, %2F, %23)"


def _cut_userinfo(netloc: str, path: str, query: str) -> bool:
    """Whether urlsplit may have ended the host part inside a password: the host part has
    no '@' but a ':' (user:pw or host:port), and an '@' comes after it."""
    return "@" not in netloc and ":" in netloc and ("@" in path or "@" in query)


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
    """An integer URL parameter or option: an int, or its ASCII digits (never a bool or a float,
    which ``int()`` would truncate), at least ``minimum`` and at most 2**63-1.

    Raises:
        ConfigError: anything else (names the parameter and the redacted URL).
    """
    # ASCII digits only: ``str.isdigit`` also takes "²", which ``int()`` then refuses.
    if type(value) is str and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        value = int(value.strip())
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
