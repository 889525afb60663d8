"""Each guide's install line is enough for its first example (issue 29): a clean venv per
guide, the package installed from a wheel of this tree with exactly what the guide's
``pip install`` lines say, then the guide's first ``python`` block run in it.

The wheel is built once; the venvs are made and filled concurrently (pip's cache makes a
repeat quick), so the whole file costs about the slowest install, not their sum.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
INSTALL_TIMEOUT = 900  # seconds; only to turn a hang into a failure
RUN_TIMEOUT = 300


@dataclass(frozen=True)
class Guide:
    """A page with an install line and the example that line must be enough for."""

    doc: str
    extra: str | None = None
    """Only the install lines naming this extra (a page with several)."""
    env: dict[str, str] = field(default_factory=dict)


GUIDES = {
    g.doc: g
    for g in (
        Guide("guide-langgraph.md"),
        Guide("guide-openai-agents.md"),
        Guide("guide-pydantic-ai.md"),
        Guide("guide-google-adk.md"),
        Guide("integrations.md", "eventsourcing", {"ARES_STORE_URL": "sqlite:///dogs.db"}),
        Guide("observability.md"),
    )
}
REFERENCE_PAGES = {
    "blobs.md": "a table of errors and the extra each needs",
    "configuration.md": "a reference of URLs, not a runnable guide",
    "errors.md": "a table of errors and the extra each needs",
}
"""Pages that mention ``pip install 'ares-events[...]'`` without a guide's example."""
INSTALL = re.compile(r"pip install ([^`\n#]+)")


def install_lines(guide: Guide) -> list[list[str]]:
    """The page's ``pip install`` arguments, one list per line (duplicates once)."""
    found: list[list[str]] = []
    for m in INSTALL.finditer((DOCS / guide.doc).read_text()):
        args = shlex.split(m.group(1))
        if not args or (guide.extra and not any(f"[{guide.extra}]" in a for a in args)):
            continue
        if args not in found:
            found.append(args)
    return found


def first_example(guide: Guide) -> str:
    """The page's first ``python`` block."""
    blocks = re.findall(r"^```python\n(.*?)^```$", (DOCS / guide.doc).read_text(), re.M | re.S)
    assert blocks, f"{guide.doc} has no python block"
    return str(blocks[0])


def test_every_page_with_an_install_line_is_checked() -> None:
    """A page that tells users to install an extra is a guide checked here, or a reference
    page listed with why not."""
    pages = {p.name for p in DOCS.glob("*.md") if "pip install 'ares-events[" in p.read_text()}
    assert pages - set(GUIDES) - set(REFERENCE_PAGES) == set()
    for guide in GUIDES.values():
        args = [a for line in install_lines(guide) for a in line]
        assert any(a.startswith("ares-events[") for a in args), guide


def _tree(dest: Path) -> Path:
    """This working tree's files (tracked and new, not ignored), copied to ``dest``: the
    wheel is built there, so nothing is written into the tree and parallel builds do not
    collide."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    archive = dest.with_suffix(".tar")
    with tarfile.open(archive, "w") as tar:
        for name in filter(None, listed):
            path = ROOT / name.decode()
            if path.is_file():
                tar.add(path, arcname=name.decode())
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this tree, built once (pip, with build isolation, as a user's pip does)."""
    work = tmp_path_factory.mktemp("wheel")
    src = _tree(work / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "out", src],
        check=True,
        timeout=INSTALL_TIMEOUT,
        capture_output=True,
    )
    (built,) = (work / "out").glob("ares_events-*.whl")
    return built


@dataclass
class Venv:
    """A clean venv being filled by ``pip install`` (a running process until waited)."""

    path: Path
    proc: subprocess.Popen[str]

    @property
    def python(self) -> Path:
        """Its interpreter."""
        return self.path / "bin" / "python"

    def wait(self) -> str:
        """Wait for the install; pip's output."""
        out, _ = self.proc.communicate(timeout=INSTALL_TIMEOUT)
        assert self.proc.returncode == 0, out
        return out


@pytest.fixture(scope="module")
def venvs(
    wheel: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, Venv]]:
    """One clean venv per selected guide, all filled at once by the outer pip
    (``--python``): only the wheel with the guide's extra and what else its lines name."""
    selected = {
        item.callspec.params["doc"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == "test_install_line_is_enough_for_the_first_example"
    }
    started: dict[str, Venv] = {}
    for doc, guide in GUIDES.items():
        if doc not in selected:
            continue
        path = tmp_path_factory.mktemp("venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
        specs = [
            a.replace("ares-events", str(wheel), 1) if a.startswith("ares-events[") else a
            for line in install_lines(guide)
            for a in line
        ]
        cmd = [sys.executable, "-m", "pip", "--python", path / "bin" / "python", "install"]
        proc = subprocess.Popen(
            # --no-compile: bytecode for every installed module is most of an install's
            # CPU; the example compiles only what it imports.
            [*map(str, cmd), "-q", "--disable-pip-version-check", "--no-compile", *specs],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started[doc] = Venv(path, proc)
    try:
        yield started
    finally:
        for v in started.values():
            if v.proc.poll() is None:
                v.proc.kill()
                v.proc.wait()
            if v.proc.stdout is not None:  # a venv no test waited for (one was deselected)
                v.proc.stdout.close()


@pytest.mark.slow
# One process runs them all: the fixture fills every selected venv at once, in each
# process that runs any of them.
@pytest.mark.xdist_group("install_lines")
@pytest.mark.timeout(INSTALL_TIMEOUT + RUN_TIMEOUT)  # the first waits for the wheel too
@pytest.mark.parametrize("doc", sorted(GUIDES))
def test_install_line_is_enough_for_the_first_example(
    doc: str, venvs: dict[str, Venv], tmp_path: Path
) -> None:
    """In a venv holding only what the guide's install lines name, its first example runs
    (no ModuleNotFoundError, no error at all)."""
    guide = GUIDES[doc]
    venv = venvs[doc]
    venv.wait()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARES_", "PYTHON"))}
    env.update(guide.env)
    proc = subprocess.run(
        [str(venv.python), "-c", first_example(guide)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, f"{doc}: {proc.stderr[-3000:]}"
    # The venv is clean: the package comes from the wheel, not from this tree.
    where = subprocess.run(
        [str(venv.python), "-c", "import ares_events; print(ares_events.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(venv.path) in where
