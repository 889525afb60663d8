"""A program that uses an eventsourcing application on ares-events exits quietly, like one
on ``eventsourcing.sqlite``: nothing on stderr, whether it closes the application, leaves
it to garbage collection, or keeps it referenced until the interpreter tears modules down
(when ``Application.__del__`` runs after module globals are gone).

Each case runs in a child process, since what is checked is the interpreter's exit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate

CHILD = textwrap.dedent(
    """
    import logging
    import sys

    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate

    how, url = sys.argv[1], sys.argv[2]
    app = Application(
        env={"PERSISTENCE_MODULE": "ares_events.integrations.eventsourcing",
             "ARES_STORE_URL": url, "IS_SNAPSHOTTING_ENABLED": "y"}
    )
    agg = Aggregate()
    app.save(agg)
    app.take_snapshot(agg.id)
    app.repository.get(agg.id)
    list(app.notification_log.select(start=1, limit=10))
    if how == "close":
        app.close()
    elif how == "follow":
        # A daemon thread still following the notification log when the program ends.
        import threading
        import time

        def follow():
            with app.recorder.subscribe(gt=None) as sub:
                for _ in sub:
                    pass

        threading.Thread(target=follow, daemon=True).start()
        time.sleep(0.3)
    elif how == "held":
        # A registry in a library module that outlives __main__ at shutdown: the
        # application is collected while module globals are being cleared.
        logging.ares_test_registry = [app]
    print("done")
    """
)


SYSTEM_CHILD = textwrap.dedent(
    """
    import sys

    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate
    from eventsourcing.system import ProcessApplication, SingleThreadedRunner, System


    class School(Application):
        pass


    class Follower(ProcessApplication):
        def policy(self, domain_event, processing_event):
            pass


    how, url = sys.argv[1], sys.argv[2]
    env = {"PERSISTENCE_MODULE": "ares_events.integrations.eventsourcing", "ARES_STORE_URL": url}
    runner = SingleThreadedRunner(System(pipes=[[School, Follower]]), env=env)
    runner.start()
    school = runner.get(School)  # still referenced when the program ends
    school.save(Aggregate())
    if how == "stop":
        runner.stop()  # closes the applications and forgets them
    print("done")
    """
)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'exit.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.mark.slow  # starts child processes: the whole suite runs it
@pytest.mark.parametrize("how", ["close", "forget", "held", "follow"])
def test_exit_is_quiet(url: str, how: str, tmp_path: Path) -> None:
    """Creating, using and leaving an application prints nothing to stderr at exit."""
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    for _ in range(2):  # the second run opens the existing store
        proc = subprocess.run(
            [sys.executable, str(script), how, url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.stdout.strip() == "done", proc.stderr
        assert proc.returncode == 0
        assert proc.stderr == ""


@pytest.mark.slow  # starts child processes: the whole suite runs it
@pytest.mark.parametrize("how", ["stop", "run"])
def test_exit_of_a_system_is_quiet(url: str, how: str, tmp_path: Path) -> None:
    """A System run by SingleThreadedRunner, stopped or not, with an application still
    referenced from ``__main__``, exits with nothing on stderr (an application freed while
    modules are torn down used to print ``Exception ignored in: Application.__del__``)."""
    script = tmp_path / "system.py"
    script.write_text(SYSTEM_CHILD, encoding="utf-8")
    for _ in range(2):  # the second run opens the existing store
        proc = subprocess.run(
            [sys.executable, str(script), how, url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.stdout.strip() == "done", proc.stderr
        assert proc.returncode == 0
        assert proc.stderr == ""


def test_closing_the_application_ends_its_subscriptions(url: str) -> None:
    """A thread iterating a subscription sees the iteration end (no exception) when the
    application is closed."""
    app: Application[uuid.UUID] = Application(
        env={"PERSISTENCE_MODULE": "ares_events.integrations.eventsourcing", "ARES_STORE_URL": url}
    )
    app.save(Aggregate())
    seen: list[int] = []
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            with app.recorder.subscribe(gt=None) as sub:
                seen.extend(n.id for n in sub)
        except BaseException as exc:  # the test fails on any, below
            errors.append(exc)

    t = threading.Thread(target=follow)
    t.start()
    for _ in range(100):
        if seen:
            break
        t.join(0.05)
    app.close()
    t.join(10)
    assert not t.is_alive()
    assert errors == []
    assert len(seen) == 1
