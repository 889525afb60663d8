"""A number-like option that ``int()`` refuses (``+-5``, ``²``) is a ``ConfigError`` naming
the option, like any other bad number, never a bare ``ValueError`` that the CLI would not
map to its usage exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ares_events as ae
from ares_events.core.url import parse_int
from ares_events.errors import ConfigError


@given(st.text(max_size=8) | st.from_regex(r"\s*[+-]{0,2}[0-9²³¹٣]{1,4}\s*", fullmatch=True))
def test_parse_int_returns_an_int_or_raises_config_error(text: str) -> None:
    try:
        value = parse_int(text, "pool_max", "postgres://h/db")
    except ConfigError as exc:
        assert "pool_max" in str(exc)
    else:
        assert value == int(text.strip()) and text.strip().lstrip("+").isascii()


@pytest.mark.parametrize("text", ["+-5", "²", "-+1", "١٢"])
def test_open_store_refuses_digit_like_text(tmp_path: Path, text: Any) -> None:
    with pytest.raises(ConfigError, match="spill_threshold"):
        ae.open_store(f"sqlite:///{tmp_path}/s.db", spill_threshold=text)
    assert not (tmp_path / "s.db").exists()
