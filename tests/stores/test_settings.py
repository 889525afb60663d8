"""ae.Settings.from_env parsing, and that no secret (chain key, URL password) ever shows
in a repr, str, error message or log line."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.errors import AresError, ConfigError
from ares_events.integrity import ChainKey
from ares_events.stores import StoreURL

KEY_HEX = "a1" * 16 + "b2c3d4e5f60718293a4b5c6d7e8f9012"
SECRET = "s3cr@t"  # percent-encoded in URLs as s3cr%40t
SECRET_URL = "postgresql://u:s3cr%40t@h/db"
SECRET_FORMS = (SECRET, "s3cr%40t", "s3cr")


def _assert_clean(text: str) -> None:
    for form in (*SECRET_FORMS, KEY_HEX, KEY_HEX.upper()):
        assert form not in text, f"{form!r} leaked into {text!r}"


# -- parsing ------------------------------------------------------------------------------


def test_from_env_defaults() -> None:
    """An empty environment gives the documented defaults and no store URL."""
    s = ae.Settings.from_env({})
    assert s.store_url is None
    assert s.cache_url is None
    assert s.blobs_url is None
    assert s.spill_threshold_bytes == 256 * 1024
    assert s.snapshot_every == 100
    assert s.chain_key is None


def test_from_env_reads_every_variable() -> None:
    """Every ARES_* variable is parsed into its typed field."""
    s = ae.Settings.from_env(
        {
            "ARES_STORE_URL": "sqlite:///x.db",
            "ARES_CACHE_URL": "redis://127.0.0.1:6379/0",
            "ARES_BLOBS_URL": "file:///tmp/blobs",
            "ARES_SPILL_THRESHOLD_BYTES": "1024",
            "ARES_SNAPSHOT_EVERY": "25",
            "ARES_EVENTS_CHAIN_KEY": KEY_HEX,
            "UNRELATED": "ignored",
        }
    )
    assert s.store_url == "sqlite:///x.db"
    assert s.cache_url == "redis://127.0.0.1:6379/0"
    assert s.blobs_url == "file:///tmp/blobs"
    assert s.spill_threshold_bytes == 1024
    assert s.snapshot_every == 25
    assert s.chain_key == ChainKey(bytes.fromhex(KEY_HEX))


def test_empty_values_mean_unset() -> None:
    """Variables set to the empty string fall back to defaults."""
    s = ae.Settings.from_env(
        {
            "ARES_STORE_URL": "",
            "ARES_SNAPSHOT_EVERY": "",
            "ARES_SPILL_THRESHOLD_BYTES": "",
            "ARES_EVENTS_CHAIN_KEY": "",
        }
    )
    assert s.store_url is None
    assert s.snapshot_every == 100
    assert s.spill_threshold_bytes == 256 * 1024
    assert s.chain_key is None


@pytest.mark.parametrize("var", ["ARES_SNAPSHOT_EVERY", "ARES_SPILL_THRESHOLD_BYTES"])
@pytest.mark.parametrize("value", ["ten", "0", "-5", "1.5", "1e3"])
def test_bad_integer_names_the_variable(var: str, value: str) -> None:
    """A non-positive-integer value raises ConfigError naming the variable and value."""
    with pytest.raises(ConfigError) as ei:
        ae.Settings.from_env({var: value})
    assert var in str(ei.value)
    assert repr(value) in str(ei.value)


def test_snapshot_every_message() -> None:
    """ARES_SNAPSHOT_EVERY='ten' gives the documented message."""
    with pytest.raises(
        ConfigError, match="ARES_SNAPSHOT_EVERY must be a positive integer, got 'ten'"
    ):
        ae.Settings.from_env({"ARES_SNAPSHOT_EVERY": "ten"})


@pytest.mark.parametrize("text", [KEY_HEX, KEY_HEX.upper(), f"  {KEY_HEX}\n"])
def test_chain_key_hex_parsing(text: str) -> None:
    """A 64-hex-digit key parses (any case, surrounding whitespace ignored)."""
    s = ae.Settings.from_env({"ARES_EVENTS_CHAIN_KEY": text})
    assert s.chain_key is not None
    assert s.chain_key.key == bytes.fromhex(KEY_HEX)


@pytest.mark.parametrize("text", [KEY_HEX[:-2], KEY_HEX + "00", "zz" * 32, KEY_HEX[:-1] + "g"])
def test_bad_chain_key_never_echoed(text: str) -> None:
    """A malformed chain key raises ConfigError naming the variable, never the key."""
    with pytest.raises(ConfigError) as ei:
        ae.Settings.from_env({"ARES_EVENTS_CHAIN_KEY": text})
    msg = str(ei.value)
    assert "ARES_EVENTS_CHAIN_KEY" in msg
    assert text not in msg
    assert text[:16] not in msg
    assert ei.value.__cause__ is None
    assert ei.value.__suppress_context__ or ei.value.__context__ is None


def test_with_overrides() -> None:
    """Explicit arguments override env values; None leaves them alone."""
    s = ae.Settings.from_env({"ARES_STORE_URL": "sqlite:///a.db", "ARES_SNAPSHOT_EVERY": "5"})
    t = s.with_overrides(store_url="memory://", snapshot_every=None)
    assert (t.store_url, t.snapshot_every) == ("memory://", 5)


def test_open_store_needs_a_url() -> None:
    """Settings.open_store without a store URL is a ConfigError naming ARES_STORE_URL."""
    with pytest.raises(ConfigError, match="ARES_STORE_URL"):
        ae.Settings.from_env({}).open_store()


def test_settings_open_store_uses_key(tmp_path: Path) -> None:
    """Settings.open_store opens the configured store with the configured chain key."""
    s = ae.Settings.from_env(
        {"ARES_STORE_URL": f"sqlite:///{tmp_path / 'k.db'}", "ARES_EVENTS_CHAIN_KEY": KEY_HEX}
    )
    with s.open_store() as store:
        assert store.chain_key == s.chain_key
        ae.emit(store, "s", "t", "m")
        assert ae.integrity.verify_stream(store, "s").ok


# -- secrets ------------------------------------------------------------------------------


def test_settings_repr_hides_secrets() -> None:
    """repr/str of Settings show neither the chain key nor URL passwords."""
    s = ae.Settings.from_env(
        {
            "ARES_STORE_URL": SECRET_URL,
            "ARES_CACHE_URL": "redis://:s3cr%40t@127.0.0.1:6379/0",
            "ARES_BLOBS_URL": "s3://bucket/p",
            "ARES_EVENTS_CHAIN_KEY": KEY_HEX,
        }
    )
    for text in (repr(s), str(s)):
        _assert_clean(text)
        assert "***" in text
        assert "chain_key=set" in text


def test_settings_repr_hides_unencoded_passwords() -> None:
    """A password that was not percent-encoded (with / ? # or @) is still hidden."""
    for raw in ("p/ss@w", "p?ss", "p#ss", "pa@ss"):
        s = ae.Settings.from_env({"ARES_STORE_URL": f"postgresql://u:{raw}@h/db"})
        assert raw not in repr(s)


def test_chain_key_repr_and_pickle() -> None:
    """ChainKey shows only a fingerprint and refuses to be pickled."""
    key = ChainKey.from_hex(KEY_HEX)
    for text in (repr(key), str(key), f"{key}", f"{key!r}"):
        _assert_clean(text)
        assert key.fingerprint() in text
    with pytest.raises(TypeError):
        pickle.dumps(key)


@pytest.mark.parametrize(
    "url",
    [
        SECRET_URL,
        "postgresql://u:s3cr%40t@h:5432/db?sslmode=require",
        "redis://:s3cr%40t@h:6379/0",
    ],
)
def test_store_url_redacted(url: str) -> None:
    """StoreURL.redacted/repr/str replace the password with *** and keep the rest."""
    parsed = StoreURL.parse(url)
    assert parsed.password == SECRET
    for text in (parsed.redacted(), repr(parsed), str(parsed), f"{parsed}"):
        _assert_clean(text)
        assert ":***@" in text
        assert "h" in text


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/db?password=s3cr%40t",
        "postgresql://u@h/db?sslmode=require&password=s3cr%40t&connect_timeout=5",
        "postgresql://u@h/db?sslpassword=s3cr%40t",
    ],
)
def test_password_query_parameter_redacted(url: str) -> None:
    """A libpq password given as a query parameter is redacted too."""
    parsed = StoreURL.parse(url)
    for text in (parsed.redacted(), repr(parsed), str(parsed)):
        _assert_clean(text)
        assert "password=***" in text
    assert "connect_timeout=5" in parsed.redacted() or "connect_timeout" not in url


def test_store_repr_hides_password_and_key() -> None:
    """repr(store) and store.url never show a URL password or the chain key."""
    with ae.open_store("memory://u:s3cr%40t@shared-secret-test", chain_key=KEY_HEX) as store:
        for text in (repr(store), str(store), store.url):
            _assert_clean(text)
        assert "keyed" in repr(store)


@pytest.mark.parametrize(
    "url",
    [
        "u:s3cr%40t@h/db",  # no scheme
        "u:s3cr@t@h/db",  # no scheme, unencoded
        "nosuch://u:s3cr%40t@h/db",  # unknown scheme
        "postgresql://u:s3cr%40t@h:notaport/db",  # bad port
        "memory://u:s3cr%40t@name?bogus=1",  # unknown parameter
        "sqlite://u:s3cr%40t@host/x.db",  # sqlite takes no host
        "postgresql://u@h:notaport/db?password=s3cr%40t",  # libpq password parameter
        "postgresql://u@h/db?pasword=s3cr%40t",  # a mistyped secret: an unknown parameter
        "memory://name?pass=s3cr%40t",
    ],
)
def test_errors_for_bad_urls_hide_password(url: str, tmp_path: Path) -> None:
    """Errors raised for bad store URLs never contain the password."""
    with pytest.raises(AresError) as ei:
        ae.open_store(url)
    assert isinstance(ei.value, ConfigError)
    _assert_clean(str(ei.value))
    _assert_clean(repr(ei.value))


@pytest.mark.parametrize("key", [b"short", "abc", "zz" * 32, 12])
def test_bad_chain_key_argument(key: object) -> None:
    """A malformed chain_key argument is a ConfigError that never echoes it."""
    with pytest.raises(ConfigError) as ei:
        ae.open_store("memory://", chain_key=key)  # type: ignore[arg-type]
    assert str(key) not in str(ei.value)


def test_logs_hide_password(caplog: pytest.LogCaptureFixture) -> None:
    """Opening a store logs its URL redacted."""
    with caplog.at_level(logging.DEBUG, logger="ares_events"):
        store = ae.open_store("memory://u:s3cr%40t@log-secret-test", chain_key=KEY_HEX)
        ae.emit(store, "s", "t", "m")
        store.close()
    assert caplog.records
    for rec in caplog.records:
        _assert_clean(rec.getMessage())
