"""No control or bidi character from store content reaches the operator's terminal
(issue 34): every CLI command, run over a store whose every name and string is hostile
(tests/fixtures/hostile.py), writes none raw on stdout or stderr (tables, lines, errors,
log lines at -vv, with colours on too), and ``--json`` writes valid JSON whose strings
parse back exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ares_events.cli import main
from ares_events.core.events import ERASURE_STREAM
from tests.fixtures.hostile import NAME, TEXT, Hostile, build, raw_hidden

SGR = re.compile(r"\x1b\[[0-9;]*m")
"""rich's own colour codes (with FORCE_COLOR): the only escape sequences it may write."""


def _commands(h: Hostile, tmp: Path) -> list[list[str]]:
    """Every command over the hostile store: looking first, then acting."""
    look = [
        ["streams"],
        *[["tail", s, "-n", "50"] for s in h.streams],
        *[["verify", s] for s in h.streams],
        ["audit"],
        ["audit", "--deep"],
        ["recover", h.named],
        ["recover", h.paused, "--projection", "run_state"],
        ["snapshot", "list"],
        ["snapshot", "verify"],
        ["runs", "list"],
        ["runs", "list", "--status", "in_doubt"],
        *[["runs", "show", r] for r in h.runs],
        ["checkpoint", "--list"],
        ["gc-blobs", "--dry-run"],
        ["rebuild", "run_state", "--verify"],
        # Errors that name store content or what was typed.
        ["tail", f"nope-{NAME}"],
        ["verify", f"nope-{NAME}"],
        ["runs", "show", h.plain],
        ["runs", "show", f"run-{NAME}"],
        ["runs", "cancel", h.failed],
    ]
    key = tmp / "log.key"
    act = [
        ["snapshot", "take", h.named],
        ["snapshot", "delete", h.named],
        ["runs", "resolve", h.in_doubt, "1", "--result", json.dumps(TEXT), "--by", TEXT,
         "--reason", TEXT],
        ["runs", "resume", h.in_doubt, "--by", TEXT, "--reason", TEXT],
        ["runs", "resume", h.paused, "--by", TEXT],
        ["runs", "cancel", h.paused, "--by", TEXT, "--reason", TEXT],
        ["erase", h.plain, "1", "--reason", TEXT, "--by", TEXT],
        ["tail", ERASURE_STREAM],
        ["rebuild", "run_state"],
        ["rebuild", "agent_state"],
        ["keygen", "example.com/log", "--out", str(key)],
        ["checkpoint", "--key", str(key)],
        ["prove", h.named, "2", "--key", str(key)],
        ["anchor", "--witness", (tmp / "anchors").as_uri() + "/"],
        ["anchor", "--witness", (tmp / "anchors").as_uri() + "/", "--check"],
        ["archive", "--to", (tmp / "archive").as_uri(), "--before", "5"],
        ["audit", "--deep"],
        ["init"],
    ]  # fmt: skip
    return look + act


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_no_hidden_character_reaches_the_terminal_and_json_keeps_the_strings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command three ways (plain with -vv logs, coloured, --json): no raw C0/C1
    control, ESC, bidi/zero-width format, private-use, unassigned or line-separator
    character on stdout or stderr (a newline between lines excepted); --json is one valid
    object; no command fails internally (exit 4) on hostile content."""
    h = build(tmp_path / "hostile.db")
    for argv in _commands(h, tmp_path):
        base = ["--store", h.url, *argv]
        monkeypatch.delenv("FORCE_COLOR", raising=False)
        code, out, err = _run(capsys, [*base, "-vv"])
        assert code != 4, (argv, err)
        assert raw_hidden(out) == [], (argv, out)
        assert raw_hidden(err) == [], (argv, err)
        if argv[0] == "keygen":
            continue  # one key per file; its JSON-less output was checked above
        monkeypatch.setenv("FORCE_COLOR", "1")
        code, out, err = _run(capsys, [*base, "-q"])
        assert raw_hidden(SGR.sub("", out)) == [], (argv, out)
        assert raw_hidden(SGR.sub("", err)) == [], (argv, err)
        monkeypatch.delenv("FORCE_COLOR")
        if argv[0] in ("checkpoint", "prove") and "--list" not in argv:
            continue  # a checkpoint note is the command's output, not a report
        code, out, err = _run(capsys, [*base, "--json"])
        assert code != 4, (argv, err)
        assert raw_hidden(out.removesuffix("\n"), keep="") == [], (argv, out)
        assert raw_hidden(err) == [], (argv, err)
        assert out.count("\n") == 1, (argv, out)
        assert isinstance(json.loads(out), dict)


def _json(capsys: pytest.CaptureFixture[str], h: Hostile, *argv: str) -> Any:
    code, out, _ = _run(capsys, ["--store", h.url, *argv, "--json"])
    assert code in (0, 1), out
    return json.loads(out)


def test_json_keeps_the_exact_strings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json escapes hidden characters (\\u202e), and a parser reads back exactly the
    stream ids, types, payloads, metadata, run ids, reasons and error texts stored."""
    h = build(tmp_path / "hostile.db")
    got = _json(capsys, h, "streams")
    assert {s["stream_id"] for s in got["streams"]} == set(h.streams)
    tail = _json(capsys, h, "tail", h.plain)
    assert {e["type"] for e in tail["events"]} == {f"t.{NAME}"}
    assert {e["module"] for e in tail["events"]} == {f"m{NAME}"}
    assert all(e["payload"] == h.payload for e in tail["events"])
    assert all(e["metadata"] == {TEXT: TEXT} for e in tail["events"])
    runs = {r["run_id"]: r for r in _json(capsys, h, "runs", "list")["runs"]}
    assert set(runs) == set(h.runs)
    assert runs[h.paused]["interrupt"]["reason"] == TEXT
    assert runs[h.failed]["error"] == TEXT
    assert runs[h.cancelled]["cancelled"]["reason"] == TEXT
    assert runs[h.cancelled]["cancelled"]["by"] == TEXT
    show = _json(capsys, h, "runs", "show", h.paused)
    tool = show["steps"][1]
    assert tool["name"] == TEXT and tool["request"] == {"args": {TEXT: TEXT}}
    assert tool["attempts"][0]["error"] == TEXT and tool["outcome"] == {"ok": TEXT}
    assert show["steps"][0]["outcome"] == {"text": TEXT}
    assert show["steps"][2]["detail"] == TEXT
    (doubt,) = _json(capsys, h, "runs", "show", h.in_doubt)["in_doubt"]
    assert doubt["name"] == TEXT


def test_streams_shows_a_bidi_override_instead_of_obeying_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's example: `streams` shows term-\\u202egnp.exe as term-⟨U+202E⟩gnp.exe
    (never reading as term-exe.png), in a table that stays aligned (on a terminal wide
    enough for the spelled-out ids)."""
    monkeypatch.setenv("COLUMNS", "400")
    h = build(tmp_path / "hostile.db")
    code, out, _ = _run(capsys, ["--store", h.url, "streams"])
    assert code == 0
    assert "term-⟨U+202E⟩gnp.exe" in out and "\u202e" not in out
    rows = [ln for ln in out.splitlines() if "│" in ln]
    assert len({len(ln) for ln in rows}) == 1, out  # escaped before layout: columns align
