"""Supervisor hooks over a store (:func:`restore`, the ``record_*`` functions,
:func:`flapping`) and :class:`ProcessSupervisor`, a small reference supervisor of OS
processes (docs/guide-journal.md).
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ares_events.agents import supervision_telemetry as otel
from ares_events.core.backend import Capability
from ares_events.core.catalog import new_event
from ares_events.core.events import ANY, NO_STREAM, ExpectedVersion
from ares_events.core.faces import blocking
from ares_events.errors import ConcurrencyError, ConfigError
from ares_events.projections.builtin import AgentStateProjection, GenealogyProjection
from ares_events.projections.recovery import RecoveryReport, recover

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.projections.base import Projection

logger = logging.getLogger(__name__)

__all__ = [
    "FlapSignal",
    "ManagedAgent",
    "ProcessSupervisor",
    "backoff_delay",
    "flapping",
    "heartbeat",
    "record_death",
    "record_resurrection",
    "record_start",
    "record_stop",
    "restore",
]

MODULE = "supervisor"


def restore(
    store: EventStore,
    agent_id: str,
    projection: Projection | None = None,
    *,
    max_replay: int = 10_000,
) -> RecoveryReport:
    """Recover an agent's state (default :class:`AgentStateProjection`), snapshot first.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    snaps = store.snapshots if Capability.SNAPSHOTS in store.capabilities else None
    proj = projection or AgentStateProjection()
    return recover(store, agent_id, proj, snapshots=snaps, max_replay=max_replay)


def _emit(
    store: EventStore,
    agent_id: str,
    type_: str,
    payload: dict[str, Any],
    expected: ExpectedVersion = ANY,
) -> int:
    store = blocking(store, "ares_events.agents.supervision")
    return store.append(
        agent_id, [new_event(type_, MODULE, payload)], expected_version=expected
    ).version


def record_start(
    store: EventStore, agent_id: str, instance_id: str, *, expected: ExpectedVersion = ANY
) -> int:
    """Append ``agent.started``; returns the stream version. With ``expected``, only at
    that version (else :class:`~ares_events.ConcurrencyError`: another supervisor acted)."""
    return _emit(store, agent_id, "agent.started", {"instance_id": instance_id}, expected)


def record_death(
    store: EventStore, agent_id: str, cause: str, *, expected: ExpectedVersion = ANY
) -> int:
    """Append ``agent.dead`` with its cause; returns the stream version (``expected``: as
    for :func:`record_start`)."""
    version = _emit(store, agent_id, "agent.dead", {"cause": cause}, expected)
    otel.death(agent_id, cause)
    return version


def record_resurrection(
    store: EventStore,
    agent_id: str,
    instance_id: str,
    attempt: int,
    *,
    expected: ExpectedVersion = ANY,
) -> int:
    """Append ``agent.resurrected``; returns the stream version (``expected``: as for
    :func:`record_start`)."""
    payload = {"instance_id": instance_id, "attempt": attempt}
    version = _emit(store, agent_id, "agent.resurrected", payload, expected)
    otel.resurrection(agent_id, attempt)
    return version


def record_stop(store: EventStore, agent_id: str, reason: str) -> int:
    """Append ``agent.stopped`` (voluntary; never treated as a crash)."""
    return _emit(store, agent_id, "agent.stopped", {"reason": reason})


@dataclass(frozen=True, slots=True)
class FlapSignal:
    """Whether an agent is flapping, with the evidence."""

    agent_id: str
    flapping: bool
    deaths: int
    max_deaths_in_window: int
    rule: tuple[int, float]


def flapping(
    store: EventStore, agent_id: str, *, deaths: int = 5, window_s: float = 30.0
) -> FlapSignal:
    """``deaths`` deaths within ``window_s`` seconds (event time) means flapping."""
    st = recover(store, agent_id, GenealogyProjection(deaths, window_s), max_replay=2**62).state
    worst = int(st["max_deaths_in_window"])
    return FlapSignal(agent_id, bool(st["flapping"]), len(st["deaths"]), worst, (deaths, window_s))


def backoff_delay(attempt: int, *, base: float = 1.0, cap: float = 30.0) -> float:
    """Delay before resurrection ``attempt`` (1-based): base, 2 base, 4 base, ... <= cap."""
    if attempt < 1:
        raise ConfigError("attempt is 1-based")
    return float(min(cap, base * (2 ** (attempt - 1))))


def heartbeat(path: str | os.PathLike[str]) -> None:
    """Agent side: touch the heartbeat file the supervisor watches."""
    Path(path).touch()  # an existing file's mtime is set to now


def _mtime(path: Path | None) -> int | None:
    """The heartbeat file's mtime in nanoseconds, None when there is no file."""
    try:
        return None if path is None else path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def _exit_cause(code: int) -> str:
    """The death cause of a process that exited with ``code`` (``Popen.returncode``)."""
    if code >= 0:
        return f"exit status {code}"
    number = -code
    try:
        return f"killed by signal {signal.Signals(number).name}"
    except ValueError:
        pass
    # Real-time signals between SIGRTMIN and SIGRTMAX have no name of their own in Python.
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is not None and high is not None and low < number < high:
        return f"killed by signal SIGRTMIN+{number - low}"
    return f"killed by signal {number}"


@dataclass(slots=True)
class ManagedAgent:
    """Bookkeeping of one supervised agent."""

    agent_id: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    instance_id: str | None = None
    stopped: bool = False
    finished: bool = False
    gave_up: bool = False
    resurrecting: bool = False
    restarts: int = 0
    attempt: int = 0
    next_start: float = 0.0
    heartbeat_file: Path | None = None
    started_at: float = 0.0
    elsewhere: bool = False  # another supervisor took it at start(): not ours to watch
    beat: tuple[int | None, float] = (None, 0.0)  # last mtime seen, and when (supervisor's clock)


class ProcessSupervisor:
    """Reference supervisor: agents as OS processes.

    Args:
        store: where lifecycle events go (one stream per agent id).
        heartbeat_dir: folder of heartbeat files (``<agent_id>.hb``, the id
            percent-encoded); agents get its path in ``ARES_HEARTBEAT_FILE`` and call
            :func:`heartbeat`.
        heartbeat_timeout: a live process silent for longer is killed and counted dead
            (None disables heartbeat checks).
        max_restarts: restart cap per agent (resurrections after deaths); 0 means no cap.
        backoff_base, backoff_cap: the backoff schedule (1 s to 30 s by default).
        on_flap: called with a :class:`FlapSignal` after every death while the agent is
            flapping (``flap_deaths`` deaths within ``flap_window_s``).
    """

    def __init__(
        self,
        store: EventStore,
        *,
        heartbeat_dir: str | os.PathLike[str] | None = None,
        heartbeat_timeout: float | None = None,
        max_restarts: int = 5,
        backoff_base: float = 1.0,
        backoff_cap: float = 30.0,
        flap_deaths: int = 5,
        flap_window_s: float = 30.0,
        on_flap: Callable[[FlapSignal], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        store = blocking(store, "ares_events.agents.supervision.ProcessSupervisor")
        self.store = store
        self.heartbeat_dir = Path(heartbeat_dir) if heartbeat_dir else None
        self.heartbeat_timeout = heartbeat_timeout
        self.max_restarts = max_restarts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.flap_rule = (flap_deaths, flap_window_s)
        self.on_flap = on_flap
        self.clock = clock
        self.agents: dict[str, ManagedAgent] = {}
        self.total_restarts = 0

    def register(
        self, agent_id: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ManagedAgent:
        """Register an agent command (not started yet)."""
        a = ManagedAgent(agent_id, list(argv), dict(env or {}))
        if self.heartbeat_dir is not None:
            self.heartbeat_dir.mkdir(parents=True, exist_ok=True)
            # Percent-encoded: one file per agent id ('a/b' and 'a_b' are two agents); an
            # id whose encoding is past what a file name holds (255 bytes), by its digest.
            name = quote(agent_id, safe="")
            if len(name) > 200:
                name = "id-" + hashlib.blake2b(agent_id.encode(), digest_size=16).hexdigest()
            a.heartbeat_file = self.heartbeat_dir / f"{name}.hb"
        self.agents[agent_id] = a
        return a

    def _spawn(
        self, a: ManagedAgent, *, resurrection: bool, expected: ExpectedVersion = ANY
    ) -> None:
        a.instance_id = f"i-{uuid.uuid4().hex[:8]}"
        if resurrection:
            a.restarts += 1
            self.total_restarts += 1
        env = {**os.environ, **a.env, "ARES_AGENT_ID": a.agent_id}
        env["ARES_INSTANCE_ID"] = a.instance_id
        if a.heartbeat_file is not None:
            heartbeat(a.heartbeat_file)
            env["ARES_HEARTBEAT_FILE"] = str(a.heartbeat_file)
        a.resurrecting = False
        # The process first, then its start in the log: a command that cannot run (missing,
        # not executable) must not leave an `agent.started` behind for a process that never
        # was. Its failure is a death like any other (backoff, cap, flapping).
        try:
            proc = subprocess.Popen(list(a.argv), env=env)  # noqa: S603 - argv from the caller
        except OSError as exc:
            logger.warning("cannot start %s: %s", a.agent_id, exc)
            self._died(a, f"failed to start: {exc.strerror or exc}")
            return
        try:
            if resurrection:
                record_resurrection(
                    self.store, a.agent_id, a.instance_id, a.attempt, expected=expected
                )
            else:
                record_start(self.store, a.agent_id, a.instance_id, expected=expected)
        except BaseException:
            # Not in the log, so not to be left running: no supervisor would know of it.
            proc.kill()
            proc.wait()
            raise
        a.proc = proc
        a.started_at = self.clock()
        a.beat = (_mtime(a.heartbeat_file), a.started_at)
        logger.info("started %s as %s (pid %d)", a.agent_id, a.instance_id, proc.pid)

    def start(self) -> None:
        """Start every registered agent; one a previous supervisor lost (recovered status
        ``running``, then recorded dead, or ``dead``) is resurrected, a ``stopped`` one not.

        Each record is written at the version read, so of two supervisors starting at once
        one takes an agent and the other leaves it (``ManagedAgent.elsewhere``): one loss
        is recorded once and one process runs."""
        for a in self.agents.values():
            rep = restore(self.store, a.agent_id)
            st, seen = rep.state, rep.version
            a.restarts = int(st["restarts"])
            if st["status"] == "stopped":
                a.stopped = True
                continue
            try:
                if st["status"] == "running":
                    cause = "lost: its supervisor died"
                    seen = record_death(self.store, a.agent_id, cause, expected=seen)
                lost = st["status"] in ("running", "dead")
                if lost:
                    a.attempt = a.restarts + 1
                self._spawn(a, resurrection=lost, expected=seen or NO_STREAM)
            except ConcurrencyError:
                a.elsewhere = True
                logger.warning("%s was taken by another supervisor; leaving it", a.agent_id)

    def stop(self, agent_id: str, reason: str = "requested", *, timeout: float = 10.0) -> None:
        """Voluntary stop: mark stopped (in memory and in the log) *then* signal. An agent
        already stopped or finished is not recorded stopped again."""
        a = self.agents[agent_id]
        recorded = a.stopped or (a.finished and a.proc is None)
        a.stopped = True  # the resurrection guard: set before the process can exit
        if not recorded:
            record_stop(self.store, agent_id, reason)
        if a.proc is not None and a.proc.poll() is None:
            a.proc.terminate()
            try:
                a.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                a.proc.kill()
                a.proc.wait()

    def _died(self, a: ManagedAgent, cause: str) -> None:
        record_death(self.store, a.agent_id, cause)
        a.proc = None
        sig = flapping(self.store, a.agent_id, deaths=self.flap_rule[0], window_s=self.flap_rule[1])
        if sig.flapping:
            otel.flapping(a.agent_id, sig.deaths, sig.rule)
            if self.on_flap is not None:
                self.on_flap(sig)
        if self.max_restarts and a.restarts >= self.max_restarts:
            a.gave_up = True
            otel.gave_up(a.agent_id, a.restarts)
            logger.warning(
                "%s reached the restart cap (%d); not resurrecting", a.agent_id, self.max_restarts
            )
            return
        a.attempt += 1
        a.resurrecting = True
        delay = backoff_delay(a.attempt, base=self.backoff_base, cap=self.backoff_cap)
        a.next_start = self.clock() + delay
        otel.backoff(a.agent_id, a.attempt, delay)

    def poll(self) -> None:
        """One supervision tick: reap exits, check heartbeats, run due resurrections."""
        now = self.clock()
        for a in self.agents.values():
            if a.proc is not None:
                code = a.proc.poll()
                if code is None:
                    if self._heartbeat_missed(a, now):
                        a.proc.kill()
                        a.proc.wait()
                        self._died(a, f"missed heartbeat ({self.heartbeat_timeout:g}s)")
                    continue
                a.proc = None
                if a.stopped:
                    continue  # voluntary: never a crash
                if code == 0:
                    # A clean exit is a voluntary stop: record it, so no later supervisor
                    # takes the agent for one its predecessor lost.
                    record_stop(self.store, a.agent_id, "finished")
                    a.finished = True
                    a.attempt = 0
                    continue
                self._died(a, _exit_cause(code))
            elif a.resurrecting and not a.stopped and now >= a.next_start:
                self._spawn(a, resurrection=True)

    def _heartbeat_missed(self, a: ManagedAgent, now: float) -> bool:
        # A beat is a change of the file's mtime, timed when this supervisor sees it, on its
        # own clock: the mtime's value is never compared with the time, so a wall clock that
        # jumps (NTP, a resumed VM) or a file server whose clock differs kills no agent.
        if self.heartbeat_timeout is None or a.heartbeat_file is None:
            return False
        stamp = _mtime(a.heartbeat_file)
        if stamp is not None and stamp != a.beat[0]:
            a.beat = (stamp, now)
        return now - a.beat[1] > self.heartbeat_timeout

    @property
    def settled(self) -> bool:
        """True when every agent finished, stopped or was given up on."""
        return all(
            a.proc is None
            and not a.resurrecting
            and (a.finished or a.stopped or a.gave_up or a.elsewhere)
            for a in self.agents.values()
        )

    def run(self, *, tick: float = 0.05, timeout: float | None = None) -> bool:
        """Supervise until settled (or ``timeout``); returns True when settled."""
        deadline = None if timeout is None else self.clock() + timeout
        with otel.supervising(len(self.agents)):  # deaths and backoffs are its events
            while not self.settled:
                if deadline is not None and self.clock() >= deadline:
                    return False
                self.poll()
                time.sleep(tick)
            return True

    def shutdown(self, reason: str = "supervisor shutdown") -> None:
        """Stop every running agent voluntarily."""
        for agent_id, a in self.agents.items():
            if a.proc is not None and a.proc.poll() is None:
                self.stop(agent_id, reason)
