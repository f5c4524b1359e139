"""The debounced background push: send what the write tools changed shortly after they did.

A write (flag rename, move) asks for a push of its accounts; requests pile up in a
:class:`~fmail_nm.service.debounce.Debouncer` and one ``mbsync --push`` per account runs once
they stop coming for a moment.  A push that fails (the server down) is tried again, backing
off: only a write would ask again otherwise, and the change would stay local.  The MCP server
pushes, and retries, through this one scheduler, with ``--watch`` (the background service's)
and without (its own).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from ..clock import utc_now
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

PUSH_QUIET = 2.0  # seconds without a new write before the push runs
PUSH_RETRY = 60.0  # a failed push is tried again after twice this, doubling up to MAX_BACKOFF
MAX_BACKOFF = 1800.0  # seconds between tries of a failing pull or push, at most


def backoff_delay(interval: float, failures: int) -> float:
    """Seconds to the next try after ``failures`` failed runs in a row (pulls, pushes): the
    interval doubled per failure, at most :data:`MAX_BACKOFF` -- but never less than the
    interval itself."""
    if failures <= 0:
        return interval
    return max(interval, min(interval * 2 ** min(failures, 30), MAX_BACKOFF))


class PushSchedulerClosed(BackendError):
    """A push was requested after the scheduler was closed (the service is shutting down)."""


def mbsync_ran(runs: Iterable[MbsyncRun]) -> bool:
    """Whether mbsync ran for any of these pushes: only then may it have renamed files (a
    failed run too, for what it uploaded before it broke), which the index must follow.  A
    push skipped for a busy channel leaves that to the other run's index."""
    return any(run.returncode is not None for run in runs)


@dataclass(frozen=True)
class PushStatus:
    pending: frozenset[str]
    running: frozenset[str]
    retrying: frozenset[str]  # the last push failed; another is due after a back-off
    last: dict[str, MbsyncRun]
    asked: dict[str, datetime]  # when a write last asked for the account's push
    batches: int  # pushes completed since the scheduler started
    closed: bool

    def unpushed(self, name: str) -> bool:
        """Whether the account has writes not on the server yet, as far as this scheduler
        knows: a push waits, runs, or failed and waits for its retry."""
        return name in self.pending or name in self.running or name in self.retrying


class PushScheduler:
    """Push local changes (flag renames, moves) to the servers shortly after they are made.

    :meth:`request` adds accounts and returns at once.  Once no request has come for
    ``quiet_period`` seconds (or ``max_delay`` after the first one, so a steady stream of
    writes still gets pushed), one background thread runs ``mbsync --push`` for every account
    that piled up.  A push that found its channel busy is queued again; one that failed is
    queued again after :func:`backoff_delay` of ``retry`` seconds (None: not at all) -- on the
    same thread, so a retry is a push like any other: one at a time, serialised with every
    mbsync of fmail-nm's by the channel lock, waiting for it at most ``lock_timeout``.
    ``after_push`` (if given) gets each batch's results on that thread -- e.g. to re-index,
    since mbsync renames a file it uploaded; ``on_change`` (once set) gets the status on
    that thread after requests (once for a burst), as a batch starts and once it is settled
    (retry due or not), never on the requester's.  :meth:`close` drops what is pending (or runs
    it, with ``flush=True``) and the retries due, and waits a bounded time for a push in
    flight; mbsync's own ``timeout`` bounds that push.
    """

    def __init__(self, config: Config, *, quiet_period: float = PUSH_QUIET,
                 max_delay: float = 30.0, retry: float | None = PUSH_RETRY,
                 timeout: float = MBSYNC_TIMEOUT, lock_timeout: float = LOCK_TIMEOUT,
                 after_push: Callable[[list[MbsyncRun]], None] | None = None) -> None:
        self.config = config
        self.quiet_period = quiet_period
        self.max_delay = max(max_delay, quiet_period)
        self.retry = retry
        self.timeout = timeout
        self.lock_timeout = lock_timeout
        self.after_push = after_push
        self.on_change: Callable[[PushStatus], None] | None = None  # set by its recorder
        self._lock = threading.Lock()
        self._last: dict[str, MbsyncRun] = {}
        self._asked: dict[str, datetime] = {}
        self._batches = 0
        self._failures: dict[str, int] = {}  # failed pushes in a row, per account
        self._retries: dict[str, threading.Timer] = {}  # the retry due, per account
        self._closing = False
        self._failed_at_close: set[str] = set()  # pushes that failed once closing began
        self.started = utc_now()
        self._debouncer: Debouncer[str] = Debouncer(
            self._run_batch, quiet=quiet_period, max_wait=self.max_delay, name="mbsync-push",
            on_added=lambda: self._changed(self.status()))

    def __enter__(self) -> PushScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, accounts: Iterable[str]) -> None:
        """Queue a push for these accounts (names checked now, so a typo fails here);
        :class:`PushSchedulerClosed` once closed."""
        names = {self.config.account(name).name for name in accounts}
        with self._lock:  # before the add, so on_change sees the time with the account
            self._asked.update(dict.fromkeys(names, utc_now()))
        if names and not self._debouncer.add(sorted(names)):
            raise PushSchedulerClosed("the push scheduler is closed")

    def flush(self) -> None:
        """Start what is pending now instead of after the quiet period (returns at once)."""
        self._debouncer.flush()

    def synced(self, name: str) -> None:
        """The account's changes reached the server by another run (a two-way sync that
        succeeded): a retry due for it is no longer needed."""
        with self._lock:
            self._failures.pop(name, None)
            timer = self._retries.pop(name, None)
        if timer is not None:
            timer.cancel()

    def status(self) -> PushStatus:
        with self._lock:  # with the debouncer's state: an account moves between them under it
            last, batches, retrying = dict(self._last), self._batches, frozenset(self._retries)
            asked, state = dict(self._asked), self._debouncer.state()
        return PushStatus(pending=frozenset(state.pending), running=frozenset(state.in_flight),
                          retrying=retrying, last=last, asked=asked, batches=batches,
                          closed=state.closed)

    def last_results(self) -> dict[str, MbsyncRun]:
        return self.status().last

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or running (``after_push`` included); False if
        ``timeout`` ran out first."""
        return self._debouncer.wait_idle(timeout)

    def close(self, *, flush: bool = False, timeout: float = 10.0) -> frozenset[str]:
        """Stop: pending pushes are dropped (``flush=True``: run now), a push in flight may
        finish; waits at most ``timeout`` seconds for the thread.  Returns the accounts whose
        writes are still local: a failed push waited for its retry, now dropped, a push run by
        ``flush`` failed, or one was still running (or waiting) when the wait ran out."""
        with self._lock:
            self._closing = True
            timers, self._retries = self._retries, {}
        for timer in timers.values():
            timer.cancel()
        self._debouncer.close(flush=flush, timeout=timeout)
        with self._lock:  # with what a push of the flush left unpushed
            state = self._debouncer.state()
            return (frozenset(timers) | frozenset(self._failed_at_close)
                    | frozenset(state.pending) | frozenset(state.in_flight))

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
                self.synced(name)  # no retry either: there is no server to push to
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
        self._changed(self.status())
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
        # Still in flight here, so status() shows the account unpushed throughout.
        for run in runs:
            if run.ok or (run.skipped and not run.busy):  # pushed, or nothing to push with
                self.synced(run.account)
            elif not run.busy:
                self._retry_later(run.account)
        # The other run may have started before this change was made: go again.  (Refused,
        # and so dropped, once the scheduler is closed.)
        busy = [run.account for run in runs if run.busy]
        if busy:
            self._debouncer.add(busy)
        # The batch is settled: what it left unpushed is retrying or pending again.
        self._changed(dataclasses.replace(self.status(), running=frozenset()))

    def _changed(self, status: PushStatus) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(status)
        except Exception:  # keep the thread alive; the pushes matter more than their record
            log.exception("push status callback failed")

    def _retry_later(self, name: str) -> None:
        """A push failed (the server down, say): only a write would ask again, so the
        scheduler does, backing off as scheduled pulls do."""
        if self.retry is None:
            return
        with self._lock:
            if self._closing:
                self._failed_at_close.add(name)
                return
            if name in self._retries:
                return
            failures = self._failures[name] = self._failures.get(name, 0) + 1
            delay = backoff_delay(self.retry, failures)
            timer = self._retries[name] = threading.Timer(delay, self._retry_now, [name])
        timer.daemon = True
        timer.start()
        log.info("push for %s failed (%d in a row); trying again in %.0fs", name, failures,
                 delay)

    def _retry_now(self, name: str) -> None:
        with self._lock:
            if self._retries.pop(name, None) is None:  # cancelled meanwhile
                return
            # Queued while still counted as retrying: status() never shows it pushed.
            self._debouncer.add([name])
