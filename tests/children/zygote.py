"""Imports the modules named on its command line once, then forks a fresh child per request
and runs a child script in it (``tests/fixtures/zygote.py`` is the other end).

Why: a framework such as the OpenAI Agents SDK takes ~2 s of CPU to import, and a kill
matrix starts dozens of children; forked from here, each child is still a process of its
own (its own pid, killed for real, its stores opened afresh) but skips that import.

Protocol: one JSON line per request on stdin, ``{"module", "argv", "stdout", "stderr"}``;
one JSON line back on stdout, ``{"returncode"}`` as ``subprocess`` reports it (``-9`` for a
SIGKILL). The child writes its output to the two files named.

Usage: python -m tests.children.zygote MODULE [MODULE...]
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback
from typing import Any


def _child(req: dict[str, Any]) -> None:
    """In the forked child: stdio to the request's files, then the script as ``__main__``."""
    code = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        sys.argv = [req["module"], *req["argv"]]
        try:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    for name in sys.argv[1:]:
        importlib.import_module(name)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
