"""HTML by construction (ares_events.ui.markup): store text never becomes markup."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ares_events.ui.markup import Markup, el, esc, link, url, visible


def test_text_and_attributes_are_escaped() -> None:
    """Children and attribute values are escaped; only Markup passes through."""
    out = el("td", "<script>alert(1)</script>", title='"><img src=x onerror=alert(1)>')
    assert out == (
        '<td title="&quot;&gt;&lt;img src=x onerror=alert(1)&gt;">'
        "&lt;script&gt;alert(1)&lt;/script&gt;</td>"
    )
    assert el("p", Markup("<b>ours</b>")) == "<p><b>ours</b></p>"
    assert esc(None) == "" and esc(3) == "3"


def test_links_only_carry_encoded_queries() -> None:
    """A stream id in a link is a query value, percent-encoded: never a scheme or a path;
    the path is relative to the console's root (``./``), wherever that is mounted."""
    href = url("/stream", {"id": "javascript:alert(1)//&x=<y>"})
    assert href == "./stream?id=javascript%3Aalert%281%29%2F%2F%26x%3D%3Cy%3E"
    assert link("x", "/stream", {"id": '"'}).startswith('<a href="./stream?id=%22">')
    assert url("/streams") == "./streams" and url("/streams", {"prefix": ""}) == "./streams"


def test_invisible_characters_are_spelled_out() -> None:
    """Bidi overrides, zero-width and control characters show as ⟨U+XXXX⟩; newlines stay."""
    assert visible("a\u202eb\u200bc\x00d\ne") == "a⟨U+202E⟩b⟨U+200B⟩c⟨U+0000⟩d\ne"
    assert visible("plain é 💥") == "plain é 💥"
    assert visible("a\x1b]0;x\x07\n\tb", keep="") == "a⟨U+001B⟩]0;x⟨U+0007⟩⟨U+000A⟩⟨U+0009⟩b"


@given(st.text())
def test_no_text_survives_as_a_tag(text: str) -> None:
    """Whatever the text, the rendered element has exactly its own two tags."""
    out = el("span", text, title=text)
    assert out.count("<") == 2 and out.count(">") == 2
    assert out.startswith('<span title="') and out.endswith("</span>")
