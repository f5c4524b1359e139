"""The debounced background push: send what the write tools changed shortly after they did.

A write (flag rename, move) asks for a push of its accounts; requests pile up in a
:class:`~fmail_nm.service.debounce.Debouncer` and one ``mbsync --push`` per account runs once
they stop coming for a moment.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..config import Config, ConfigError
from ..errors import BackendError
from .debounce import Debouncer
from .mbsync import (
    LOCK_TIMEOUT,
    MBSYNC_TIMEOUT,
    MbsyncNotInstalled,
    MbsyncRun,
    not_run,
    run_mbsync,
)

log = logging.getLogger(__name__)


class PushSchedulerClosed(BackendError):
    """A push was requested after the scheduler was closed (the service is shutting down)."""


@dataclass(frozen=True)
class PushStatus:
    pending: frozenset[str]
    running: frozenset[str]
    last: dict[str, MbsyncRun]
    batches: int  # pushes completed since the scheduler started
    closed: bool


class PushScheduler:
    """Push local changes (flag renames, moves) to the servers shortly after they are made.

    :meth:`request` adds accounts and returns at once.  Once no request has come for
    ``quiet_period`` seconds (or ``max_delay`` after the first one, so a steady stream of
    writes still gets pushed), one background thread runs ``mbsync --push`` for every account
    that piled up.  A push that found its channel busy is queued again.  ``after_push`` (if
    given) gets each batch's results on that thread -- e.g. to re-index, since mbsync renames
    a file it uploaded.  :meth:`close` drops what is pending (or runs it, with ``flush=True``)
    and waits a bounded time for a push in flight; mbsync's own ``timeout`` bounds that push.
    """

    def __init__(self, config: Config, *, quiet_period: float = 2.0, max_delay: float = 30.0,
                 timeout: float = MBSYNC_TIMEOUT, lock_timeout: float = LOCK_TIMEOUT,
                 after_push: Callable[[list[MbsyncRun]], None] | None = None) -> None:
        self.config = config
        self.quiet_period = quiet_period
        self.max_delay = max(max_delay, quiet_period)
        self.timeout = timeout
        self.lock_timeout = lock_timeout
        self.after_push = after_push
        self._lock = threading.Lock()
        self._last: dict[str, MbsyncRun] = {}
        self._batches = 0
        self._debouncer: Debouncer[str] = Debouncer(
            self._run_batch, quiet=quiet_period, max_wait=self.max_delay, name="mbsync-push")

    def __enter__(self) -> PushScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, accounts: Iterable[str]) -> None:
        """Queue a push for these accounts (names checked now, so a typo fails here);
        :class:`PushSchedulerClosed` once closed."""
        names = {self.config.account(name).name for name in accounts}
        if names and not self._debouncer.add(sorted(names)):
            raise PushSchedulerClosed("the push scheduler is closed")

    def flush(self) -> None:
        """Start what is pending now instead of after the quiet period (returns at once)."""
        self._debouncer.flush()

    def status(self) -> PushStatus:
        with self._lock:
            last, batches = dict(self._last), self._batches
        state = self._debouncer.state()
        return PushStatus(pending=frozenset(state.pending), running=frozenset(state.in_flight),
                          last=last, batches=batches, closed=state.closed)

    def last_results(self) -> dict[str, MbsyncRun]:
        return self.status().last

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or running (``after_push`` included); False if
        ``timeout`` ran out first."""
        return self._debouncer.wait_idle(timeout)

    def close(self, *, flush: bool = False, timeout: float = 10.0) -> None:
        """Stop: pending pushes are dropped (``flush=True``: run now), a push in flight may
        finish; waits at most ``timeout`` seconds for the thread."""
        self._debouncer.close(flush=flush, timeout=timeout)

    # -- on the debouncer's thread -------------------------------------------------------------

    def _push(self, batch: list[str]) -> list[MbsyncRun]:
        """The batch's runs, each failure logged once."""
        runs: list[MbsyncRun] = []
        config = self.config  # one configuration for the batch (the service may replace it)
        for name in batch:
            try:
                account = config.account(name)
            except ConfigError:  # taken out of fmail.toml since the write asked for it
                log.info("not pushing %s: the account is no longer configured", name)
                continue
            try:
                done = run_mbsync(config, name, "push", timeout=self.timeout,
                                  lock_timeout=self.lock_timeout)
            except MbsyncNotInstalled as exc:
                done = [not_run(account, "push", str(exc), skipped=False)]
            except Exception as exc:  # keep the thread alive; the status shows what broke
                log.exception("mbsync push for %s failed", name)  # said here, with its traceback
                runs.append(not_run(account, "push", f"{type(exc).__name__}: {exc}",
                                    skipped=False))
                continue
            for run in done:
                if run.channel and not run.ok:  # run_mbsync leaves saying so to its caller
                    log.warning("mbsync %s", run.describe())
            runs += done
        return runs

    def _run_batch(self, batch: list[str]) -> None:
        runs = self._push(sorted(batch))
        # While the batch still counts as running, so wait_idle() also covers the callback
        # (e.g. a re-index) and a busy channel's retry.
        if self.after_push is not None:
            try:
                self.after_push(runs)
            except Exception:
                log.exception("after-push callback failed")
        with self._lock:
            for run in runs:
                self._last[run.account] = run
            self._batches += 1
        # The other run may have started before this change was made: go again.  (Refused,
        # and so dropped, once the scheduler is closed.)
        busy = [run.account for run in runs if run.busy]
        if busy:
            self._debouncer.add(busy)
