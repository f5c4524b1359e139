"""The child processes of one kind a shutdown must end itself (mbsync and msmtp checks in
:mod:`fmail_nm.service.mbsync`, ``notmuch new`` in :mod:`fmail_nm.store.notmuch_cli`).

Each runs in a session of its own, out of reach of a signal to our process group: one left
behind would outlive the process.  A registry starts and tracks a run at once, tells the run's
caller whether a stop ended it, and stops them all -- every one signalled first, then all
waited for against one deadline, so that N runs cost one grace, not N (the systemd unit's
TimeoutStopSec bounds the whole shutdown); :func:`stop_together` so stops several registries,
for the longest of their graces rather than their sum.  A run SIGKILL does not end in
:data:`KILL_WAIT` is given up on: one in uninterruptible sleep (a hung NFS Maildir) ends when
the kernel lets it, which may be never, and outside systemd nothing else would bound the
shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

Run = subprocess.Popen[Any]
log = logging.getLogger(__name__)
# Seconds a SIGKILLed run has to end (a few milliseconds unless the kernel holds it) before
# it is left behind; counted in the unit's TimeoutStopSec like the graces.
KILL_WAIT = 2.0


class RunRegistry:
    """The runs of one kind this process has going, and those of them :meth:`stop_all` ended.

    ``send(run, sig)`` is how a signal reaches one run (its session, its process group);
    ``polite`` the first signal of a stop, after which a run has the stop's grace to end before
    SIGKILL.
    """

    def __init__(self, send: Callable[[Run, signal.Signals], None],
                 polite: signal.Signals) -> None:
        self._send = send
        self._polite = polite
        self._lock = threading.Lock()
        self._running: set[Run] = set()
        self._stopped: set[Run] = set()
        self._refusing = False

    def start(self, argv: list[str], **popen: Any) -> Run | None:
        """Start a run and track it; None, starting nothing, once a final :meth:`stop_all`
        ended the runs for good.  Started and tracked under the lock stop_all takes: a run
        tracked only once Popen returned could be at work already, and a stop meanwhile
        missed it."""
        with self._lock:
            if self._refusing:
                return None
            proc: Run = subprocess.Popen(argv, **popen)
            self._running.add(proc)
        return proc

    def finished(self, proc: Run) -> bool:
        """The run has ended: no longer tracked; whether :meth:`stop_all` ended it."""
        with self._lock:
            self._running.discard(proc)
            stopped = proc in self._stopped
            self._stopped.discard(proc)
        return stopped

    def stop_all(self, grace: float, *, final: bool = False) -> int:
        """Stop every run still going (:meth:`stop`); how many there were.  ``final``: the
        process is ending, and :meth:`start` refuses from now on."""
        return stop_together([(self, grace)], final=final)[0]

    def stop(self, procs: list[Run], grace: float) -> None:
        """The polite signal to each run, then SIGKILL to those still there ``grace`` seconds
        after -- one deadline for them all (see :func:`_stop`)."""
        _stop([(self, procs, grace)])

    def _going(self, *, final: bool) -> list[Run]:
        """The runs still going, which a stop is about to end (:meth:`finished` tells their
        callers so); ``final``: :meth:`start` refuses from now on."""
        with self._lock:
            self._refusing = self._refusing or final
            procs = [proc for proc in self._running if proc.poll() is None]
            self._stopped.update(procs)
        return procs

    def start_again(self) -> None:
        """Take runs again after a final :meth:`stop_all` (tests run many shutdowns in one
        process)."""
        with self._lock:
            self._refusing = False

    def _signal(self, proc: Run, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # it has just ended
            self._send(proc, sig)


def stop_together(stops: Sequence[tuple[RunRegistry, float]], *,
                  final: bool = False) -> list[int]:
    """Stop every run still going of each registry, with that registry's grace, as
    :meth:`RunRegistry.stop_all` does -- all signalled first, then waited for from one start, so
    that the stops cost the longest grace, not the sum of them; how many runs each had.
    ``final``: the process is ending, and no registry starts a run from now on."""
    groups = [(registry, registry._going(final=final), grace) for registry, grace in stops]
    _stop(groups)
    return [len(procs) for _, procs, _ in groups]


def _stop(groups: Sequence[tuple[RunRegistry, list[Run], float]]) -> None:
    """Each registry's polite signal to each of its runs, then SIGKILL to those still there
    the registry's grace after the first signal.  An exception during the wait (a second
    Ctrl-C) cuts it short: SIGKILL at once, and it propagates.  Those still there KILL_WAIT
    seconds after their SIGKILL are left behind, with a warning."""
    began = time.monotonic()
    waiting = sorted(groups, key=lambda group: group[2])  # the shortest grace is over first
    killed: list[Run] = []
    try:
        for registry, procs, _ in groups:
            for proc in procs:
                registry._signal(proc, registry._polite)
        while waiting:
            registry, procs, grace = waiting[0]
            still = _still_going(procs, began + grace - time.monotonic())
            killed += _kill(registry, still)
            waiting.pop(0)  # after the kill: one cut short between them is killed again
    finally:
        for registry, procs, _ in waiting:  # cut short
            killed += _kill(registry, [proc for proc in procs if proc.poll() is None])
        for proc in _still_going(killed, KILL_WAIT):
            log.warning("%s (pid %d) still there %.0f s after SIGKILL, most likely stuck "
                        "in the kernel (a hung network file system): left behind; once "
                        "fmail-nm exits, init adopts it", _command(proc), proc.pid, KILL_WAIT)


def _kill(registry: RunRegistry, procs: list[Run]) -> list[Run]:
    for proc in procs:
        registry._signal(proc, signal.SIGKILL)
    return procs


def _command(proc: Run) -> str:
    return cast(list[str], proc.args)[0]  # as :meth:`RunRegistry.start` was given it


def _still_going(procs: list[Run], seconds: float) -> list[Run]:
    """The runs of ``procs`` that have not ended ``seconds`` from now: one deadline for all."""
    deadline = time.monotonic() + seconds
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    return [proc for proc in procs if proc.poll() is None]
