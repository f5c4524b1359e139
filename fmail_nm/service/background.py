"""The always-on part of fmail-nm: watch the Maildir, index what changed, pull on a schedule,
push what the write tools changed -- and say how it went in ``status.json``.

Threads, each with one job, none blocking another (or the MCP server):

* the watcher (:mod:`fmail_nm.service.watcher`) hands over debounced batches of changed message files;
* one index thread runs ``notmuch new`` (hooks, tagging, blocklist, sidecar) -- never two at
  once; requests that arrive during a run are coalesced into one more run, and a run that
  failed (the notmuch write lock held by another program past the run's timeout) is tried
  again later, backing off.  It also runs a
  "safety index" when none ran for ``[index] safety_interval_minutes``, and the watcher asks
  for one after inotify lost events: the watcher is fast, the full run is what is always right.  Before running for
  a watcher batch it asks the index whether the batch is already reflected: the write tools
  move and rename files and tell notmuch themselves, so their events need no ``notmuch new``;
* one pull thread per account with ``mbsync_channel`` and ``pull_interval_minutes > 0``;
* the :class:`~fmail_nm.service.push.PushScheduler` for pushes the write tools ask for; a
  failed push is tried again (backing off), and one not done by the stop is marked in
  ``status.json`` and done by the next start.

The configuration is followed as the user edits it (:class:`~fmail_nm.app.LiveConfig`): each
index run, push request and heartbeat looks, and a change reschedules the pulls.

Call :meth:`Background.stop` only after the MCP server stopped taking calls: the write tools
move files on the server's thread, and stop() should not race a move.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO

from ..app import LiveConfig
from ..clock import utc_now
from ..config import Account, Config
from ..errors import BackendError
from ..private import private_dir
from ..store.notmuch import Reader
from ..store.notmuch_cli import NEW_STOP_GRACE, notmuch_settings, stop_new_runs
from .index import INDEX_TIMEOUT, IndexingStopped, run_index
from .mbsync import (MBSYNC_TIMEOUT, STOP_GRACE, MbsyncNotInstalled, MbsyncRun,
                     mbsync_config_of, run_mbsync, stop_running, wait_for_channels)
from .push import PUSH_QUIET, PUSH_RETRY, PushScheduler, backoff_delay, mbsync_ran
from .status import (
    IndexStatus,
    ServiceInfo,
    ServiceStatus,
    StatusStore,
    account_status,
    first_line,
    mark_stopped,
    run_info,
)
from .watcher import WRITE_WAIT, MailWatcher

log = logging.getLogger(__name__)

BUSY_RETRY = 30.0  # a channel busy with another mbsync: try again this soon (or the interval)
PULL_LOCK_WAIT = 10.0  # how long a scheduled pull waits for a busy channel
INDEX_RETRY = 30.0  # a failed index run is tried again this soon, doubling up to MAX_BACKOFF
HEARTBEAT = 5.0  # the index thread refreshes the queue length and revision this often
WRITER_CHECK = 0.2  # a run held back for a file being written looks again this often


class AlreadyRunning(BackendError):
    """Another fmail-nm service (watcher/scheduler) runs for the same data directory."""


PullKey = tuple[str | None, str | None, float]


def _pull_key(config: Config, account: Account) -> PullKey:
    """What a scheduled pull of an account depends on: a change means a new schedule."""
    return account.mbsync_channel, mbsync_config_of(config, account), account.pull_interval_minutes


def _follow_accounts(status: ServiceStatus, config: Config) -> None:
    """The status's accounts as the configuration has them now, each one's history kept
    while its channel stays the same."""
    accounts = []
    for account in config.accounts:
        known = status.account(account.name)
        if known is None or known.channel != account.mbsync_channel:
            known = account_status(account)
        known.pull_interval_minutes = account.pull_interval_minutes
        if account.pull_interval_minutes <= 0:
            known.next_pull_at = None
        accounts.append(known)
    status.accounts = accounts


# ---------------------------------------------------------------------------------------------
# The index thread


@dataclass
class _Work:
    reasons: list[str] = field(default_factory=list)
    paths: dict[str, None] = field(default_factory=dict)  # insertion-ordered set

    def __bool__(self) -> bool:
        return bool(self.reasons or self.paths)

    def merge(self, other: _Work) -> None:
        self.reasons.extend(other.reasons)
        self.paths.update(other.paths)

    def describe(self) -> str:
        parts = sorted(set(self.reasons))
        if self.paths:
            parts.append(f"{len(self.paths)} changed file(s)")
        return ", ".join(parts)


# The runs that put right whatever was missed -- the periodic one, the first after a start,
# the one after inotify lost events -- list every folder (notmuch new --full-scan).
SAFETY_INDEX = "safety index"
STARTUP_INDEX = "startup"
OVERFLOW_INDEX = "events the watcher may have missed"  # an overflow, watches rebuilt
FULL_SCAN_REASONS = frozenset({SAFETY_INDEX, STARTUP_INDEX, OVERFLOW_INDEX})
RETRY_INDEX = "retry after a failed run"


class _Indexer:
    """One thread that runs the index; the notmuch Reader it checks batches with lives on it."""

    def __init__(self, bg: Background) -> None:
        self.bg = bg
        self._work = _Work()
        self._running = False
        self._stopping = False
        self._deadline = 0.0
        # A failed run's work, tried again at _retry_at (or with the next work, if sooner):
        # its mail is on disk, but no event may come to set off another run.
        self._retry = _Work()
        self._retry_at = 0.0
        self._failures = 0  # failed runs in a row
        self.set_safety(bg._applied)
        self._last_index = time.monotonic()  # the startup run is asked for at once
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="fmail-index", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def set_safety(self, config: Config) -> None:
        self._safety = config.settings.safety_index_minutes * 60.0  # 0: no safety index

    def request(self, reason: str) -> None:
        with self._cond:
            self._work.reasons.append(reason)
            self._cond.notify_all()

    def add_paths(self, paths: Iterable[Path]) -> None:
        with self._cond:
            for path in paths:
                self._work.paths[os.fspath(path)] = None
            self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return not self._work and not self._running

    def stop(self, deadline: float) -> None:
        """Take no new work; a run in progress finishes, and what was asked for before stop
        gets one last run if there is time for it."""
        with self._cond:
            self._stopping = True
            self._deadline = deadline
            self._cond.notify_all()
        if self._thread.ident is None:  # never started
            return
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive() and stop_new_runs():
            # Left running, it would index on after we are gone (most often it waits for a
            # lock another program holds), its post-new pass left to us: the sidecar out of
            # step.  Stopped, it keeps what it indexed; the next start indexes the rest.
            log.warning("index run still going at shutdown: notmuch new stopped; the next "
                        "start of the service indexes what it left")
            # The stop returns once the run has ended (within its grace and SIGKILL's wait);
            # what is left on the thread is its own work -- the prefetch stopped without
            # waiting for its parse, the run recorded as stopped, the work asked for since it
            # began not indexed (the deadline is past) -- which one grace covers many times.
            self._thread.join(NEW_STOP_GRACE)
        if self._thread.is_alive():
            log.warning("index run still going at shutdown; left to finish on its own")

    # -- on the thread -------------------------------------------------------------------------

    def _take(self) -> tuple[_Work, bool] | None:
        """The next work and whether it is the last (None: stop).  Waits at most a heartbeat;
        an empty _Work means "refresh the status"."""
        with self._cond:
            if not self._work and not self._stopping:
                self._cond.wait(min(HEARTBEAT, self._until_safety(), self._until_retry()))
            if self._work or (self._until_retry() <= 0 and not self._stopping):
                if self._retry and not self._work:
                    self._work.reasons.append(RETRY_INDEX)
                self._work.merge(self._retry)
                self._retry = _Work()
            if not self._work and not self._stopping and self._until_safety() <= 0:
                self._work.reasons.append(SAFETY_INDEX)
            work, self._work = self._work, _Work()
            if self._stopping and not work:
                return None
            self._running = bool(work)
            return work, self._stopping

    def _until_safety(self) -> float:
        """Seconds until the next safety index is due (infinite when there is none)."""
        if self._safety <= 0:
            return float("inf")
        return self._last_index + self._safety - time.monotonic()

    def _until_retry(self) -> float:
        """Seconds until a failed run is due again (infinite when none is waiting)."""
        return self._retry_at - time.monotonic() if self._retry else float("inf")

    def _retry_later(self, work: _Work) -> None:
        """Have a failed run's work done again, later each time it fails in a row."""
        self._failures += 1
        delay = backoff_delay(self.bg.index_retry, self._failures - 1)
        with self._cond:
            if self._stopping:  # the startup run of the next start lists every folder
                return
            self._retry.merge(work)
            self._retry_at = time.monotonic() + delay
        log.info("trying again in %.0fs, or with the next change before that", delay)

    def _loop(self) -> None:
        reader = Reader(self.bg.config.settings.notmuch_config)
        try:
            while (taken := self._take()) is not None:
                work, last = taken
                try:
                    if not work:
                        self._heartbeat(reader)
                    else:
                        self._handle(reader, work, last)
                except Exception:  # keep the thread alive; the next request tries again
                    log.exception("background indexing step failed")
                finally:
                    with self._cond:
                        self._running = False
                        self._cond.notify_all()
                if last:
                    break
        finally:
            reader.close()

    def _heartbeat(self, reader: Reader) -> None:
        self.bg.follow_config()  # an edit shows in pulls and the status without other work
        queue = self.bg.queue_length()
        revision = _revision(reader)
        mode = self.bg.watching()  # inotify may have given way to polling since

        def refresh(s: ServiceStatus) -> None:
            s.service.watcher = mode
            s.queue_length = queue
            if revision is not None:
                s.notmuch_revision = revision
        self.bg.store.update_running(refresh)

    def _unreflected(self, reader: Reader, paths: list[str]) -> list[str]:
        """The paths whose state on disk the index does not show yet: a file that exists but
        is not indexed, or one that is indexed but gone.  Our own moves and flag renames were
        told to notmuch by the write tools, so they drop out here."""
        try:
            known = reader.known_files(paths)
        except Exception as exc:  # cannot tell: index, which is always correct
            log.debug("cannot check changed files against the index (%s); indexing", exc)
            return paths
        return [p for p in paths if os.path.lexists(p) != (p in known)]

    def _handle(self, reader: Reader, work: _Work, last: bool) -> None:
        changed = list(work.paths)
        if not work.reasons:
            changed = self._unreflected(reader, changed)
            if not changed:
                log.debug("%d changed file(s) already in the index; no notmuch new needed",
                          len(work.paths))

                def skipped(s: ServiceStatus) -> None:
                    s.index.batches_skipped += 1
                self.bg.store.update_running(skipped)
                return
            log.debug("not yet indexed: %s", ", ".join(changed[:10]))
        self._wait_for_mbsync()
        if not self._wait_for_writers():
            log.warning("shutting down while a file is being written into a Maildir: not "
                        "indexing (%s); the next start of the service will", work.describe())
            return
        timeout = self.bg.index_timeout
        if last:
            remaining = self._deadline - time.monotonic() - 1.0
            if remaining <= 0:
                log.warning("shutting down: not indexing (%s); the next `fmail-nm index` or "
                            "start of the service will", work.describe())
                return
            timeout = min(timeout, remaining)
        full_scan = not FULL_SCAN_REASONS.isdisjoint(work.reasons)
        ok = self._index(reader, work.describe(), timeout, full_scan=full_scan)
        # notmuch new skips a folder whose mtime it recorded, which can hide a file (see
        # run_notmuch_new's full_scan): what the batch named and the index still does not
        # show gets one run that lists every folder.  (After a failed run it shows nothing.)
        missed = [] if not ok or full_scan or not changed else self._unreflected(reader, changed)
        if missed and not (last and self._deadline - time.monotonic() < 1.0):
            log.info("notmuch new left %d changed file(s) out (%s); scanning every folder",
                     len(missed), missed[0])
            ok = self._index(reader, "files a folder scan missed", timeout, full_scan=True)
        if not ok and not last:
            self._retry_later(work)
        elif ok:
            self._failures = 0

    def _wait_for_mbsync(self) -> None:
        """Hold the run while an mbsync of ours syncs (at most its timeout; see
        wait_for_channels): the run that ends the sync asks for an index anyway."""
        def stopping() -> bool:
            with self._cond:  # stop() ended the runs: what is left is indexed now
                return self._stopping
        wait_for_channels(self.bg.config, self.bg.mbsync_timeout, stop=stopping)

    def _wait_for_writers(self) -> bool:
        """Hold the run while a file is being written straight into new/ or cur/ (see
        MailWatcher.writing), which notmuch new would index half-written for good; the
        watcher lets go of a write open too long.  False when stop() came first."""
        writing = self.bg.files_being_written()
        if writing:
            log.info("waiting for %d file(s) being written to be closed, e.g. %s",
                     len(writing), writing[0])
        with self._cond:
            while writing:
                if self._stopping:
                    return False
                self._cond.wait(WRITER_CHECK)  # or sooner: a close's batch notifies
                writing = self.bg.files_being_written()
        return True

    def _index(self, reader: Reader, reason: str, timeout: float, *,
               full_scan: bool = False) -> bool:
        """Run the index and record how it went; whether it went through."""
        started = utc_now()
        clock = time.monotonic()
        error: str | None = None
        added: int | None = None
        stopped = False
        try:
            # The configuration as it is now: the pass tags by the rules the hook would read.
            summary = run_index(self.bg.config, show_progress=False, timeout=timeout,
                                full_scan=full_scan)
        except IndexingStopped as exc:  # by stop(): no failure, though the run did not end
            stopped, error = True, str(exc)
            log.info("indexing (%s) stopped after %.1fs: %s", reason,
                     time.monotonic() - clock, error)
        except Exception as exc:  # notmuch new failed or timed out, a busy lock, the sidecar
            error = str(exc) or type(exc).__name__
            log.warning("indexing (%s) failed after %.1fs: %s", reason,
                        time.monotonic() - clock, first_line(error))
        else:
            added = summary.added
            log.info("indexed (%s): %d new, %d messages in all, %.1fs", reason, summary.added,
                     summary.total, time.monotonic() - clock)
        finished = utc_now()
        self._last_index = time.monotonic()  # a failed run too: the next try is due in full
        revision = _revision(reader)
        queue = self.bg.queue_length()

        def record(s: ServiceStatus) -> None:
            s.index.runs += 1
            s.index.last_run_at = started
            s.index.last_ok = None if stopped else error is None
            s.index.last_error = error
            if error is None:
                s.index.last_added = added
                s.indexed_at = finished
            if revision is not None:
                s.notmuch_revision = revision
            s.queue_length = queue
        self.bg.store.update_running(record)
        return error is None


def _revision(reader: Reader) -> int | None:
    try:
        return reader.revision().number
    except Exception as exc:  # a missing database shows up in the index error instead
        log.debug("cannot read the notmuch revision: %s", exc)
        return None


# ---------------------------------------------------------------------------------------------
# Scheduled pulls


class _Puller:
    """Pulls one account every ``interval`` seconds (backing off while it fails)."""

    def __init__(self, bg: Background, account: Account, key: PullKey) -> None:
        self.bg = bg
        self.account = account
        self.key = key
        self.interval = account.pull_interval_minutes * 60.0
        self.retired = False  # the account left the configuration, or its schedule changed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"pull-{account.name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, *, retire: bool = False) -> None:
        """End the schedule; a run in progress finishes.  ``retire``: another puller (or
        none) takes over the account, so this one's status is no longer the account's."""
        self.retired = self.retired or retire
        self._stop.set()

    def join(self, deadline: float) -> None:
        if self._thread.ident is None:  # never started
            return
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning("pull for %s still running at the shutdown deadline", self.account.name)

    def _loop(self) -> None:
        failures = 0
        delay = 0.0  # pull once at start: mail may have come while the service was down
        while not self._stop.wait(delay):
            run, broke = self._pull()
            if run.returncode is not None:
                # Even a failed mbsync may have fetched part of the mail.
                self.bg.request_index(f"pull {self.account.name}")
            if run.ok:
                failures = 0
                delay = self.interval
                self.bg._pushed(self.account.name)  # it synced both ways
            elif run.busy:
                delay = min(self.interval, BUSY_RETRY)
                log.info("pull for %s: channel busy with another mbsync; trying again in %.0fs",
                         self.account.name, delay)
            else:
                failures += 1
                delay = backoff_delay(self.interval, failures)
                # Said once, with the traceback of an unexpected error (None otherwise).
                log.warning("pull for %s failed (%d in a row), next try in %.0fs: %s",
                            self.account.name, failures, delay, first_line(run.error),
                            exc_info=broke)
            self._record(run, failures, None if self._stop.is_set() else delay)

    def _pull(self) -> tuple[MbsyncRun, Exception | None]:
        """The run, and the unexpected error it failed with (for :meth:`_loop` to log with
        the failure, not a second time apart from it)."""
        now = utc_now()
        broke: Exception | None = None
        try:
            # Both ways: the scheduled run also carries changes no write tool announced -- a
            # mail client's flag renames, blocked mail the tagging pass moved to Junk.
            (run,) = run_mbsync(self.bg.config, self.account.name, "both",
                                timeout=self.bg.mbsync_timeout, lock_timeout=PULL_LOCK_WAIT)
            return run, None
        except MbsyncNotInstalled as exc:
            error = str(exc)
        except Exception as exc:  # keep pulling later; the status says what broke
            broke = exc
            error = f"{type(exc).__name__}: {exc}"
        return MbsyncRun(account=self.account.name, channel=self.account.mbsync_channel,
                         direction="both", ok=False, returncode=None, started=now,
                         finished=utc_now(), error=error), broke

    def _record(self, run: MbsyncRun, failures: int, delay: float | None) -> None:
        next_at = None if delay is None else utc_now() + timedelta(seconds=delay)

        def record(s: ServiceStatus) -> None:
            acct = s.account(self.account.name)
            if acct is None:
                return
            if not run.busy:
                acct.last_pull = run_info(run)
                if run.direction == "both":  # it pushed too: an older push failure is past
                    acct.last_push = run_info(run)
            if self.retired:  # the schedule is its successor's to say
                return
            acct.consecutive_failures = failures
            acct.next_pull_at = next_at
        self.bg.store.update_running(record)


# ---------------------------------------------------------------------------------------------
# The service


class Background:
    """Watcher, index thread, scheduled pulls and the push scheduler, with their status.

    ``start()`` once, ``stop()`` once (after the MCP server stopped taking calls).  Everything
    in between is thread-safe: ``request_index`` and ``request_push`` return at once.
    """

    def __init__(self, config: Config, *, watch: bool = True, schedule: bool = True,
                 push: bool = True, push_quiet: float = PUSH_QUIET, watch_quiet: float = 1.0,
                 watch_max_delay: float = 10.0, watch_write_wait: float = WRITE_WAIT,
                 status_store: StatusStore | None = None,
                 force_polling: bool = False, poll_interval: float = 2.0,
                 index_timeout: float = INDEX_TIMEOUT, index_retry: float = INDEX_RETRY,
                 mbsync_timeout: float = MBSYNC_TIMEOUT, push_retry: float = PUSH_RETRY,
                 live: LiveConfig | None = None) -> None:
        self._started = False
        self._status_written = False
        self._live = live or LiveConfig(config)  # shared with the MCP server's tools
        self._applied = config  # the configuration the pullers, pusher and status follow
        self._config_lock = threading.RLock()
        self.store = status_store or StatusStore(config.data_dir)
        self.index_timeout = index_timeout
        self.index_retry = index_retry
        self.mbsync_timeout = mbsync_timeout
        self._stopping = threading.Event()
        self._indexer = _Indexer(self)
        self._watcher: MailWatcher | None = None
        if watch:
            self._watcher = MailWatcher(config, self._indexer.add_paths, quiet=watch_quiet,
                                        max_delay=watch_max_delay, force_polling=force_polling,
                                        poll_interval=poll_interval,
                                        write_wait=watch_write_wait, ignore=self._ignored(),
                                        on_overflow=self._overflowed,
                                        on_folder_gone=self._folder_gone)
        self._schedule = schedule
        self._pullers: dict[str, _Puller] = {}
        self._retired: list[_Puller] = []  # stopped on a configuration change; joined at stop
        self._schedule_pulls(config)
        self._push_wanted = push
        self._push_quiet = push_quiet
        self._pusher: PushScheduler | None = None
        self._push_retry = push_retry
        self._lock_file: IO[str] | None = None

    # -- the configuration ---------------------------------------------------------------------

    @property
    def config(self) -> Config:
        return self.follow_config()

    def follow_config(self) -> Config:
        """The configuration as the files say now (see :class:`~fmail_nm.app.LiveConfig`);
        a change is applied on the way: pulls scheduled, moved or ended, the status's
        accounts, the safety interval, the pusher's accounts."""
        fresh = self._live.current()
        with self._config_lock:
            if fresh is not self._applied and not self._stopping.is_set():
                self._apply(fresh)
            return fresh

    def _apply(self, config: Config) -> None:
        self._applied = config
        self._schedule_pulls(config)
        self._indexer.set_safety(config)
        if self._started:
            self._start_pusher(config)
            if self._pusher is not None:
                self._pusher.config = config
        if self._status_written:
            self.store.update(lambda s: _follow_accounts(s, config))

    def _schedule_pulls(self, config: Config) -> None:
        """A puller for each account with a channel and an interval; one whose account left
        or whose schedule changed is stopped, its successor pulls at once."""
        wanted = {a.name: a for a in config.accounts
                  if self._schedule and a.mbsync_channel and a.pull_interval_minutes > 0}
        self._retired = [p for p in self._retired if p.alive()]
        for name, puller in list(self._pullers.items()):
            account = wanted.get(name)
            if account is None or _pull_key(config, account) != puller.key:
                puller.stop(retire=True)
                self._retired.append(self._pullers.pop(name))
                log.info("configuration changed: scheduled pulls for %s %s", name,
                         "end" if account is None else "follow the new settings")
        for name, account in wanted.items():
            if name not in self._pullers:
                puller = self._pullers[name] = _Puller(self, account, _pull_key(config, account))
                if self._started:
                    puller.start()

    def _start_pusher(self, config: Config) -> None:
        if self._pusher is None and self._push_wanted and any(
                a.mbsync_channel for a in config.accounts):
            self._pusher = PushScheduler(config, quiet_period=self._push_quiet,
                                         retry=self._push_retry, timeout=self.mbsync_timeout,
                                         after_push=self._after_push)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start everything and index once (mail may have arrived while nothing watched).
        Raises :class:`AlreadyRunning` when another service has this data directory."""
        if self._started:
            raise RuntimeError("Background was already started")
        self._lock_file = self._take_instance_lock()
        self._started = True
        try:
            self._start_parts()
        except BaseException:
            self.stop(timeout=10.0)
            raise

    def _start_parts(self) -> None:
        # Writes the last run could not push (server down, stopped first): pushed now.
        unpushed = self._unpushed(self.store.load())
        self.store.write(self._initial_status())
        self._status_written = True
        self._indexer.start()
        if self._watcher is not None:
            # Before the first index run, so nothing that lands in between is missed.
            self._watcher.start()
        self.request_index(STARTUP_INDEX)
        with self._config_lock:
            self._start_pusher(self._applied)
            for puller in self._pullers.values():
                puller.start()
        mode = self.watching()

        def started(s: ServiceStatus) -> None:
            s.service.watcher = mode
        self.store.update(started)
        if unpushed:
            log.info("writes the last run left unpushed: %s", ", ".join(unpushed))
            self._set_push_pending(unpushed, True)  # kept for a later start (--no-push now)
            self.request_push(unpushed)
        log.info("background service started: watching %s, %d scheduled pull(s), push %s",
                 mode, len(self._pullers), "on" if self._pusher else "off")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop watching and scheduling, let a running mbsync or index run finish (within
        ``timeout`` seconds in all), push what the write tools left pending, index once more
        if that was asked for, and mark the status as not running."""
        if not self._started or self._stopping.is_set():
            return
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.stop(timeout=min(5.0, timeout))
        with self._config_lock:  # no configuration change starts a puller from here on
            pullers = [*self._pullers.values(), *self._retired]
        for puller in pullers:
            puller.stop()
        for puller in pullers:
            puller.join(deadline)
        if self._pusher is not None:
            pending = self._pusher.status().pending
            # Failed pushes waiting for their retry stay marked in status.json: the next
            # start pushes them.
            self._pusher.close(flush=True, timeout=max(0.0, deadline - time.monotonic()))
            left = self._pusher.status()
            if left.pending or left.running:
                log.warning("shutdown: push for %s not finished; the next sync pushes it",
                            ", ".join(sorted(left.pending | left.running)))
            elif pending:
                log.info("shutdown: pushed %s", ", ".join(sorted(pending)))
        if stopped := stop_running():  # past the deadline: not left running after we exit
            log.warning("shutdown: stopped %d mbsync run(s) or account check(s) still going; "
                        "the next sync takes the runs up again", stopped)
            # Each records its stopped run -- within one grace for them all: one each made
            # the shutdown's bound grow with the accounts, past the unit's TimeoutStopSec.
            recorded = time.monotonic() + STOP_GRACE
            for puller in pullers:
                puller.join(recorded)
        self._indexer.stop(deadline)
        if self._status_written:
            self.store.update(mark_stopped)
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None
        log.info("background service stopped")

    def __enter__(self) -> Background:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests ------------------------------------------------------------------------------

    def request_index(self, reason: str) -> None:
        """Index soon (coalesced with other requests); returns at once."""
        if self._stopping.is_set():
            # Only pushes that finish during stop() get here; stop() still runs what is queued.
            log.debug("index requested during shutdown: %s", reason)
        self._indexer.request(reason)

    def _overflowed(self) -> None:
        self.request_index(OVERFLOW_INDEX)

    def _folder_gone(self, folder: str) -> None:
        self.request_index(f"folder left the mail tree: {folder}")

    def request_push(self, accounts: Iterable[str]) -> None:
        """Push these accounts shortly (debounced); what the write tools call after a move."""
        names = list(accounts)
        if self._stopping.is_set():
            log.warning("shutting down: push for %s not queued; the next start pushes it",
                        ", ".join(names))
            self._set_push_pending(names, True)
            return
        self.follow_config()  # an account added since the last look is the pusher's too
        if self._pusher is None or not names:
            log.debug("push not enabled; not pushing %s", ", ".join(names))
            return
        # Marked first: the push may be over before request() returns.  (An unknown name,
        # which request() refuses, is in no status to mark.)
        self._set_push_pending(names, True)
        self._pusher.request(names)

    def _set_push_pending(self, names: Iterable[str], pending: bool) -> None:
        wanted = set(names)

        def mark(s: ServiceStatus) -> None:
            for acct in s.accounts:
                if acct.name in wanted:
                    acct.push_pending = pending
        self.store.update(mark)

    def _after_push(self, runs: list[MbsyncRun]) -> None:
        # mbsync renames the files it uploaded (,U=<uid>): index so notmuch has the new names.
        def record(s: ServiceStatus) -> None:
            for run in runs:
                acct = s.account(run.account)
                if acct is not None and not run.skipped:
                    acct.last_push = run_info(run)
        self.store.update(record)
        for run in runs:
            # A busy channel is queued again by the pusher, a failed push retried by it: the
            # account stays marked until a push goes through.
            if run.ok or (run.skipped and not run.busy):  # pushed, or nothing to push with
                self._pushed(run.account)
        if mbsync_ran(runs):
            self.request_index("push " + ", ".join(sorted({r.account for r in runs})))

    def _pushed(self, name: str) -> None:
        """The account's writes are on the server (a push, or a pull that synced both ways)
        -- unless a later write's push waits: that one settles the mark."""
        if self._pusher is not None:
            if name in self._pusher.status().pending:
                return
            self._pusher.synced(name)  # a retry due is no longer needed
        self._set_push_pending([name], False)

    def _unpushed(self, last: ServiceStatus | None) -> list[str]:
        if last is None:
            return []
        names = {a.name for a in self.config.accounts if a.mbsync_channel}
        return [a.name for a in last.accounts if a.push_pending and a.name in names]

    # -- looking in ----------------------------------------------------------------------------

    def queue_length(self) -> int:
        return self._watcher.pending() if self._watcher is not None else 0

    def files_being_written(self) -> list[str]:
        """Message files being written straight into a Maildir now (see MailWatcher.writing)."""
        return self._watcher.writing() if self._watcher is not None else []

    def status(self) -> ServiceStatus:
        """The current status, queue length as of now while running (a stopped service has
        nothing queued, whatever a watcher's thread that outlived the stop still holds)."""
        current = self.store.current() if self._started else None
        status = current or self._initial_status(running=False)
        if status.service.running:
            status.queue_length = self.queue_length()
        return status

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no file event, index request or push is waiting or running (scheduled
        pulls aside); False if ``timeout`` ran out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pusher_idle = self._pusher is None or self._pusher.wait_idle(0)
            if self.queue_length() == 0 and self._indexer.idle() and pusher_idle:
                return True
            time.sleep(0.05)
        return False

    @property
    def watch_mode(self) -> str | None:
        return self._watcher.mode if self._watcher is not None else None

    def watching(self) -> str:
        """How the Maildir is watched now, for the status: inotify, polling, or off."""
        return self.watch_mode or "off"

    # -- helpers -------------------------------------------------------------------------------

    def _initial_status(self, running: bool = True) -> ServiceStatus:
        now = utc_now()
        return ServiceStatus(
            service=ServiceInfo(pid=os.getpid(), started_at=now, running=running),
            accounts=[account_status(a) for a in self.config.accounts],
            index=IndexStatus(),
        )

    def _take_instance_lock(self) -> IO[str]:
        # One service per data directory: two would index twice and overwrite each other's
        # status.  (Several MCP servers without --watch may run side by side.)
        locks = self.config.data_dir / "locks"
        private_dir(locks)
        handle = open(locks / "service.lock", "a+", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            other = self.store.load()
            pid = f" (pid {other.service.pid})" if other is not None else ""
            raise AlreadyRunning(
                f"another fmail-nm service{pid} already watches and indexes this mail "
                f"(data dir {self.config.data_dir}); run only one `fmail-nm run` or "
                f"`serve --watch`") from None
        return handle

    def _ignored(self) -> list[Path]:
        """A notmuch database inside the mail root under a name other than ``.notmuch``."""
        try:
            db_path = notmuch_settings(self.config.settings.notmuch_config).get("database.path")
        except Exception:  # the watcher works without it: it keeps only new/ and cur/ files
            return []
        if not db_path:
            return []
        db = Path(db_path)
        root = self.config.mail_root
        if db != root and db.is_relative_to(root):
            return [db]
        return []
