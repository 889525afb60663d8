"""A password holding an unencoded '?' or '/' ends the URL's host part early: urlsplit sees
no password, and the rest of the password lands in the query (as a parameter name) or the
path. No error built from such a URL may show any part of the password (configuration.md:
a malformed value is a ConfigError "never showing a password"), in Python, on the CLI's
stderr or in its --json error object."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.core.url import StoreURL
from ares_events.errors import AresError, ConfigError
from ares_events.stores.postgres.options import parse_options
from tests.fixtures.cli_helpers import run

SECRET = "SuperSecretPw"
"""The part of each password below that no message may show."""

# Each password starts with '?' or '/', or with digits then '?' or '/' (the digits pass for
# a port): the parts urlsplit cuts it into are the digits ("the port") and the rest.
CUT_STORE_URLS = [
    f"postgresql://root:?{SECRET}@127.0.0.1:1/db",
    f"postgresql://root:/{SECRET}@127.0.0.1:1/db",
    f"postgresql://root:77/{SECRET}@127.0.0.1:1/db",  # "77" would be the port
    f"postgresql://root:77?{SECRET}@127.0.0.1:1/db",
    f"postgresql://root:?x{SECRET}=1@127.0.0.1:1/db",  # a parameter with a value
    f"sqlite://root:?{SECRET}@/x.db",
    f"memory://root:?{SECRET}@name",
]
CUT_CACHE_URLS = [
    f"redis://:?{SECRET}@127.0.0.1:1/11",
    f"redis://:2024?{SECRET}@127.0.0.1:1/11",
    f"redis://:2024?x{SECRET}=1@127.0.0.1:1/11",
    f"redis://:2024/{SECRET}@127.0.0.1:1/11",
    f"redis://user:?{SECRET}@127.0.0.1:1/11",
]
CUT_BLOB_URLS = [
    f"s3://key:?{SECRET}@bucket/prefix",
    f"s3://key:77/{SECRET}@bucket/prefix",
]


def _assert_clean(text: str, *extra: str) -> None:
    for form in (SECRET, *extra):
        assert form not in text, f"{form!r} leaked into {text!r}"


def _open_error(**kw: str) -> str:
    url = kw.pop("url", "memory://")
    with pytest.raises(AresError) as ei:
        ae.open_store(url, **kw).close()  # type: ignore[arg-type]
    assert isinstance(ei.value, ConfigError), ei.value
    return f"{ei.value} {ei.value!r}"


@pytest.mark.parametrize("url", CUT_STORE_URLS + CUT_CACHE_URLS + CUT_BLOB_URLS)
def test_parse_refuses_a_password_cut_short(url: str) -> None:
    """The URL is refused where it is parsed, naming the fix and echoing none of it."""
    with pytest.raises(ConfigError) as ei:
        StoreURL.parse(url)
    message = str(ei.value)
    _assert_clean(message, "77", "2024", "root", "127.0.0.1", "bucket")
    assert "%3F" in message and "%2F" in message


@pytest.mark.parametrize("url", CUT_STORE_URLS)
def test_store_errors_hide_a_password_cut_short(url: str) -> None:
    _assert_clean(_open_error(url=url), "77")


@pytest.mark.parametrize("cache", CUT_CACHE_URLS)
def test_cache_errors_hide_a_password_cut_short(cache: str) -> None:
    _assert_clean(_open_error(cache=cache), "2024")


@pytest.mark.parametrize("blobs", CUT_BLOB_URLS)
def test_blob_errors_hide_a_password_cut_short(blobs: str) -> None:
    _assert_clean(_open_error(blobs=blobs), "77")


def test_unknown_parameter_names_of_a_cut_url_are_not_shown() -> None:
    """A password "2024?xyzzy=SuperSecretPw" after a user that passes for a host: the URL
    parses (it could be host:port/db?user=admin@server), but the unknown parameter's name
    is part of the password, so no name is shown when the URL holds an '@' after a
    host part with a ':' in it."""
    url = StoreURL.parse(f"postgresql://root:2024?xyzzy={SECRET}@127.0.0.1:1/db")
    with pytest.raises(ConfigError) as ei:
        parse_options(url, {})
    _assert_clean(str(ei.value), "xyzzy", "2024")
    assert "%3F" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        url.check_params(("ttl",))
    _assert_clean(str(ei.value), "xyzzy", "2024")


@pytest.mark.parametrize(
    "url",
    [
        "memory://name?Super%20Secret%21=1",
        "sqlite:///x.db?Super%20Secret%21=1",
        "postgresql://u@h/db?Super%20Secret%21=1",
    ],
)
def test_an_unknown_name_that_is_no_plain_word_is_not_shown(url: str) -> None:
    """An unknown parameter name that is no plain word (a password's tail, likely) is not
    echoed; plain ones still are (a typo is worth seeing)."""
    for bad in (url, f"{url}&bogus=2"):
        with pytest.raises(ConfigError) as ei:
            if bad.startswith("postgresql"):
                parse_options(StoreURL.parse(bad), {})
            else:
                ae.open_store(bad).close()
        message = str(ei.value)
        _assert_clean(message, "Super", "Secret")
        assert "not shown" in message
        assert ("bogus" in message) == bad.endswith("bogus=2")


def test_s3_blob_url_with_a_port_is_refused_unshown() -> None:
    """A bucket takes no port: s3://key:2024?region=pw@bucket/p parses (the '@' is in a
    value), but would reach boto3 with the password's tail as region."""
    for blobs in (f"s3://key:2024?region={SECRET}@bucket/p", f"s3://key:2024?xyzzy={SECRET}@b/p"):
        message = _open_error(blobs=blobs)
        _assert_clean(message, "2024", "xyzzy")
        assert "holds credentials or a port" in message


def test_unknown_blob_parameter_that_is_no_plain_word_is_not_shown() -> None:
    for blobs in ("s3://bucket/p?Super%20Secret%21=1", "file:///tmp/blobs?Super%20Secret%21"):
        message = _open_error(blobs=blobs)
        _assert_clean(message, "Super", "Secret")
        assert "not shown" in message


# -- legitimate URLs holding '@' or an encoded '?' still work ------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://db.example/agents?user=admin@server",
        "postgresql://db.example:5432/agents?user=admin@server",
        "postgresql://u:p%3Fq@h/db",
        "postgresql://u:p%2Fq@h:5432/db",
        "postgresql://u:p%40q@h:5432/db%40x",
        "redis://:p%3Fq@127.0.0.1:6379/11",
        "sqlite:///path/with@sign.db",
        "sqlite:////abs/path/with@sign.db",
        "s3://bucket/prefix@x",
    ],
)
def test_legitimate_urls_still_parse(url: str) -> None:
    parsed = StoreURL.parse(url)
    assert "?" not in (parsed.password or "") or parsed.password == "p?q"


def test_azure_style_user_in_the_query() -> None:
    for url in (
        "postgresql://db.example/agents?user=admin@server",
        "postgresql://db.example:5432/agents?user=admin@server",
    ):
        opts = parse_options(StoreURL.parse(url), {})
        assert opts.connect_kwargs["user"] == "admin@server"
        assert opts.connect_kwargs["host"] == "db.example"


def test_encoded_password_keeps_its_question_mark() -> None:
    opts = parse_options(StoreURL.parse("postgresql://u:p%3Fq@h/db"), {})
    assert opts.connect_kwargs["password"] == "p?q"
    assert StoreURL.parse("redis://:p%3Fq@127.0.0.1:6379/11").password == "p?q"


def test_sqlite_path_with_at_sign_opens(tmp_path: Path) -> None:
    folder = tmp_path / "with@sign"
    folder.mkdir()
    url = f"sqlite:///{folder / 'runs@1.db'}"
    with ae.open_store(url, create=True) as store:
        ae.emit(store, "s", "t", "m")
    assert (folder / "runs@1.db").exists()


@pytest.mark.postgres
def test_encoded_question_mark_password_connects(postgres_url: str) -> None:
    """A percent-encoded '?' in a password reaches PostgreSQL whole (the suite's server
    takes root by trust, so any password is accepted: the URL is what is tested)."""
    head, rest = postgres_url.split("://", 1)
    userinfo, at, hostpart = rest.rpartition("@")
    user = userinfo.split(":", 1)[0] if at else "root"
    url = f"{head}://{user}:p%3Fq%2Fr@{hostpart}"
    with ae.open_store(url, create=True) as store:
        ae.emit(store, "s", "t", "m")
        assert [e.version for e in store.read("s")] == [1]


# -- the CLI: stderr and --json --------------------------------------------------------------


@pytest.fixture
def no_ares_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the caller's ARES_* variables out (the CLI reads them as defaults)."""
    for name in list(os.environ):
        if name.startswith("ARES_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("no_ares_env")
@pytest.mark.parametrize(
    ("store", "env"),
    [(u, {}) for u in CUT_STORE_URLS[:4]]
    + [("sqlite:///b.db", {"ARES_CACHE_URL": u}) for u in CUT_CACHE_URLS[:2]]
    + [("sqlite:///b.db", {"ARES_BLOBS_URL": u}) for u in CUT_BLOB_URLS],
)
def test_cli_audit_hides_a_password_cut_short(
    store: str,
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`ares-events --store URL audit` (and --json) exits 2 naming the fix, echoing no
    part of the password."""
    monkeypatch.chdir(tmp_path)
    ae.open_store("sqlite:///b.db", create=True).close()  # the cache or blob URL is at fault
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run(capsys, "--store", store, "audit")
    assert code == 2 and out == "" and "Traceback" not in err
    _assert_clean(err, "77", "2024")
    assert "%3F" in err
    code, out, err = run(capsys, "--store", store, "audit", "--json")
    assert code == 2
    data = json.loads(out)
    _assert_clean(out + err, "77", "2024")
    assert "%3F" in data["error"]["message"]


@pytest.mark.parametrize("scheme", ["pgcells", "citus"])
def test_a_cell_store_hides_a_cut_password_as_postgresql_does(scheme: str) -> None:
    """A cell store rebuilds each cell's postgresql:// URL from the pieces, where the '@'
    that marked the cut is gone; the unknown parameter is found on the URL as given."""
    message = _open_error(url=f"{scheme}://root:2024?xyzzy={SECRET}@127.0.0.1:1/db")
    _assert_clean(message, "xyzzy", "2024")
    assert "not shown" in message and "%3F" in message
    message = _open_error(url=f"{scheme}://root@127.0.0.1:1/db?cells=2&bogus=1")
    assert "unknown parameter(s) bogus" in message  # a plain typo is still named
