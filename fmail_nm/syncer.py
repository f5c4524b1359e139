"""Running mbsync: pull and push the Maildir against the IMAP servers, then index.

fmail-nm has no IMAP code of its own (DESIGN.md, principle 3): every write is a tag or a file
rename, and mbsync carries it to the server.  This module runs ``mbsync`` for the accounts'
channels and reports what happened; it never raises for a server that is down or a password
that is wrong -- those are results, so one bad account does not stop the others.

* :func:`run_mbsync` -- one ``mbsync`` per channel, serialised per channel across threads and
  processes by an ``flock`` on ``<data_dir>/locks/mbsync-<channel>.lock``.
* :class:`PushScheduler` -- a debounced background pusher for the write tools: ``request()``
  only enqueues; a quiet period after the last request, one push runs for what piled up.
* :func:`sync` -- mbsync, then ``notmuch new`` with hooks and our tagging pass, then a caller's
  ``after_index`` (the sidecar).  Indexing runs even when mbsync failed: local mail is the truth.

How mbsync merges flags (isync 1.4, observed in tests/test_sync.py): it keeps the flags of the
last sync per message (the sync state) and carries each side's changes since then to the other
side, flag by flag.  A boolean can only change one way from a common base, so a change made
locally and a different one made on the server (read here, flagged there) both survive, and the
same flag changed on both sides changed to the same value -- there is no flag conflict to lose.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Literal

from .config import Account, Config, ConfigError
from .indexing import IndexSummary, run_index
from .nm import NotmuchAccessError

log = logging.getLogger(__name__)

Direction = Literal["pull", "push", "both"]
DIRECTIONS: tuple[Direction, ...] = ("pull", "push", "both")
# mbsync 1.4: "If neither --pull nor --push are specified, both are active."
_DIRECTION_ARGS: dict[Direction, tuple[str, ...]] = {
    "pull": ("--pull",),
    "push": ("--push",),
    "both": (),
}
MBSYNC_TIMEOUT = 600.0
LOCK_TIMEOUT = 60.0
ERROR_LINES = 12
ERROR_CHARS = 2000
# Lines that say nothing about why a run failed: notices, progress counters, -V chatter.
_NOISE = re.compile(
    r"^(?:\S+ notice: |Notice: |C: \d|B: \d|Processing |Opening |Connecting |Resolving |"
    r"Logging in|Selecting |Synchronizing|Loading |Channel |Mailbox |Authenticating)"
)


class MbsyncNotInstalled(FileNotFoundError):
    """The ``mbsync`` program (isync) is not on ``$PATH``."""


class ChannelBusy(RuntimeError):
    """Another mbsync (ours, in this or another process) holds the channel's lock."""


@dataclass(frozen=True)
class MbsyncRun:
    """What one mbsync run for one account did.  ``ok`` is the only field callers must check.

    ``returncode`` is None when mbsync was not started: ``skipped`` for an account without a
    channel or a channel that stayed ``busy`` with another run, neither for mbsync missing.
    ``started``/``finished`` are UTC; ``started`` is taken once the channel lock is held, so two
    runs on one channel never have overlapping intervals.
    """

    account: str
    channel: str | None
    direction: Direction
    ok: bool
    returncode: int | None
    started: datetime
    finished: datetime
    error: str = ""
    skipped: bool = False
    busy: bool = False  # skipped because another run held the channel for too long
    lock_wait: float = 0.0  # seconds spent waiting for another run on the same channel

    @property
    def seconds(self) -> float:
        return (self.finished - self.started).total_seconds()

    def describe(self) -> str:
        """One line for a status listing or a log."""
        target = f"{self.account} (channel {self.channel})" if self.channel else self.account
        if self.ok:
            return f"{target}: {self.direction} ok in {self.seconds:.1f}s"
        state = "skipped" if self.skipped else f"failed (exit {self.returncode})"
        return f"{target}: {self.direction} {state}: {self.error}"


def _now() -> datetime:
    return datetime.now(UTC)


def find_mbsync() -> str:
    """The path of ``mbsync``, or :class:`MbsyncNotInstalled` with an installation hint."""
    found = shutil.which("mbsync")
    if found is None:
        raise MbsyncNotInstalled(
            "mbsync (isync) is not installed or not on PATH: install isync "
            "(Debian/Ubuntu: apt-get install isync) to sync with IMAP servers"
        )
    return found


# ---------------------------------------------------------------------------------------------
# Per-channel lock


def lock_path(config: Config, channel: str) -> Path:
    """The lock file for a channel; the name is made file-safe and kept unique by a hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", channel)[:60]
    digest = hashlib.sha256(channel.encode()).hexdigest()[:8]
    return config.data_dir / "locks" / f"mbsync-{safe}-{digest}.lock"


def _try_flock(fh: IO[str]) -> bool:
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def channel_lock(config: Config, channel: str, timeout: float = LOCK_TIMEOUT) -> Iterator[float]:
    """Hold the channel's lock; yields the seconds spent waiting for it.

    ``flock`` locks belong to an open file, so each call opens its own: two threads of one
    process exclude each other just like two processes do, and the kernel drops the lock if
    the holder dies.  Polling (not a blocking flock) keeps the wait bounded; after ``timeout``
    seconds :class:`ChannelBusy` is raised.
    """
    path = lock_path(config, channel)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    began = time.monotonic()
    deadline = began + max(timeout, 0.0)
    delay = 0.02
    with open(path, "a", encoding="utf-8") as fh:
        if not _try_flock(fh):
            log.info("waiting for the lock on mbsync channel %r (%s)", channel, path)
            while not _try_flock(fh):
                if time.monotonic() >= deadline:
                    raise ChannelBusy(
                        f"another mbsync is already running on channel {channel!r}; gave up "
                        f"after {timeout:g}s -- the changes go out with that run or the next one"
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.25)
        try:
            yield time.monotonic() - began
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# Running mbsync


def valid_channel(channel: str) -> bool:
    # A leading "-" would make mbsync read the name as an option.
    return bool(channel) and not channel.startswith("-") and "\0" not in channel


def mbsync_argv(program: str, config: Config, channel: str, direction: Direction) -> list[str]:
    """``mbsync [-c CONFIG] -q [--pull|--push] CHANNEL``; ``-q`` drops progress counters, not
    errors."""
    if direction not in _DIRECTION_ARGS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}")
    if not valid_channel(channel):
        raise ConfigError(f"invalid mbsync channel name {channel!r}")
    argv = [program]
    if config.settings.mbsync_config:
        argv += ["-c", os.path.expanduser(config.settings.mbsync_config)]
    return [*argv, "-q", *_DIRECTION_ARGS[direction], channel]


def trim_error(stderr: str, stdout: str = "") -> str:
    """The lines of mbsync's output that say what went wrong, without notices or counters."""
    lines: list[str] = []
    for line in (stderr or stdout).splitlines():
        line = line.strip()
        if line and not _NOISE.match(line) and line not in lines:
            lines.append(line)
    text = "\n".join(lines[-ERROR_LINES:])
    return text if len(text) <= ERROR_CHARS else "…" + text[-ERROR_CHARS:]


def _kill_group(proc: subprocess.Popen[str]) -> None:
    # mbsync runs in its own session, so a PassCmd child goes down with it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _execute(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """Run mbsync; return (exit status or None if it did not start, what went wrong)."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)
    except FileNotFoundError:  # removed between the PATH lookup and now
        raise MbsyncNotInstalled(f"mbsync could not be started: {argv[0]} not found") from None
    except OSError as exc:
        return None, f"mbsync could not be started: {exc}"
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        detail = trim_error(stderr, stdout)
        return proc.returncode, (f"mbsync did not finish within {timeout:g}s and was stopped"
                                 + (f"\n{detail}" if detail else ""))
    if proc.returncode == 0:
        return 0, ""
    error = trim_error(stderr, stdout) or f"mbsync exited with status {proc.returncode}"
    return proc.returncode, error


def _not_run(account: Account, direction: Direction, reason: str, *, skipped: bool = True,
             busy: bool = False, lock_wait: float = 0.0) -> MbsyncRun:
    moment = _now()
    return MbsyncRun(account=account.name, channel=account.mbsync_channel, direction=direction,
                     ok=False, returncode=None, started=moment, finished=moment, error=reason,
                     skipped=skipped, busy=busy, lock_wait=lock_wait)


def _run_channel(program: str, config: Config, account: Account, direction: Direction, *,
                 timeout: float, lock_timeout: float) -> MbsyncRun:
    channel = account.mbsync_channel
    assert channel is not None
    argv = mbsync_argv(program, config, channel, direction)
    try:
        with channel_lock(config, channel, lock_timeout) as waited:
            started = _now()
            code, error = _execute(argv, timeout)
            finished = _now()
    except ChannelBusy as exc:
        log.warning("mbsync %s for %s skipped: %s", direction, account.name, exc)
        return _not_run(account, direction, str(exc), busy=True, lock_wait=lock_timeout)
    run = MbsyncRun(account=account.name, channel=channel, direction=direction, ok=code == 0,
                    returncode=code, started=started, finished=finished, error=error,
                    lock_wait=waited)
    log.log(logging.INFO if run.ok else logging.WARNING, "mbsync %s", run.describe())
    return run


def _selected(config: Config, account: str | None) -> list[Account]:
    return [config.account(account)] if account is not None else list(config.accounts)


def run_mbsync(config: Config, account: str | None = None, direction: Direction = "both", *,
               timeout: float = MBSYNC_TIMEOUT,
               lock_timeout: float = LOCK_TIMEOUT) -> list[MbsyncRun]:
    """Run mbsync for one account (by name) or all of them; one result per account.

    Accounts run one after another, each channel once (accounts sharing a channel share its
    result).  An account without ``mbsync_channel`` is reported as skipped, one with an
    unusable channel name as failed.  A channel that
    another run holds is waited for up to ``lock_timeout`` seconds, then reported as skipped.
    Raises only for caller errors: an unknown account (:class:`ConfigError`), a bad direction
    (:class:`ValueError`), or mbsync not installed (:class:`MbsyncNotInstalled`).
    """
    if direction not in _DIRECTION_ARGS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}")
    accounts = _selected(config, account)
    program = find_mbsync() if any(a.mbsync_channel for a in accounts) else ""
    runs: list[MbsyncRun] = []
    by_channel: dict[str, MbsyncRun] = {}
    for acct in accounts:
        if not acct.mbsync_channel:
            runs.append(_not_run(acct, direction, f"account {acct.name!r} has no mbsync channel; "
                                 "set mbsync_channel in its [[accounts]] entry in fmail.toml"))
        elif not valid_channel(acct.mbsync_channel):
            runs.append(_not_run(acct, direction, f"account {acct.name!r}: invalid mbsync "
                                 f"channel name {acct.mbsync_channel!r}", skipped=False))
        elif acct.mbsync_channel in by_channel:
            runs.append(replace(by_channel[acct.mbsync_channel], account=acct.name))
        else:
            run = _run_channel(program, config, acct, direction, timeout=timeout,
                               lock_timeout=lock_timeout)
            by_channel[acct.mbsync_channel] = run
            runs.append(run)
    return runs


# ---------------------------------------------------------------------------------------------
# sync: mbsync, then index


@dataclass
class SyncReport:
    """What :func:`sync` did.  ``ok`` means every channel synced and the index is current."""

    runs: list[MbsyncRun]
    started: datetime
    finished: datetime
    index: IndexSummary | None = None
    index_error: str | None = None
    after_index_error: str | None = None

    @property
    def mbsync_ok(self) -> bool:
        return all(r.ok for r in self.runs if r.channel)

    @property
    def ok(self) -> bool:
        return self.mbsync_ok and self.index_error is None and self.after_index_error is None

    def errors(self) -> list[str]:
        """What went wrong, one line each (accounts without a channel are not errors)."""
        out = [r.describe() for r in self.runs if r.channel and not r.ok]
        if self.index_error:
            out.append(f"indexing failed: {self.index_error}")
        if self.after_index_error:
            out.append(f"after indexing: {self.after_index_error}")
        return out


def _mbsync_or_report(config: Config, account: str | None, direction: Direction,
                      timeout: float, lock_timeout: float) -> list[MbsyncRun]:
    try:
        return run_mbsync(config, account, direction, timeout=timeout, lock_timeout=lock_timeout)
    except MbsyncNotInstalled as exc:
        # Indexing what is on disk is still worth doing; the report carries the reason.
        return [_not_run(a, direction, str(exc), skipped=False)
                for a in _selected(config, account)]


def sync(config: Config, account: str | None = None, direction: Direction = "both", *,
         after_index: Callable[[], None] | None = None,
         timeout: float = MBSYNC_TIMEOUT, lock_timeout: float = LOCK_TIMEOUT) -> SyncReport:
    """mbsync, then ``notmuch new`` with hooks and the tagging pass, then ``after_index()``.

    mbsync failures (server down, bad password, busy channel) are in the report with mbsync's
    own words; indexing and ``after_index`` run regardless, on whatever the Maildir holds --
    a push also renames files (a new message gets its ``,U=<n>``), so it needs indexing too.
    An unknown account or a bad direction raises before anything runs.
    """
    if account is not None:
        config.account(account)
    started = _now()
    report = SyncReport(runs=_mbsync_or_report(config, account, direction, timeout, lock_timeout),
                        started=started, finished=started)
    try:
        report.index = run_index(config, show_progress=False)
    except (NotmuchAccessError, OSError, subprocess.SubprocessError) as exc:
        report.index_error = str(exc)
    if after_index is not None:
        try:
            after_index()
        except Exception as exc:  # reported, and logged with its traceback
            log.exception("after-index step failed")
            report.after_index_error = f"{type(exc).__name__}: {exc}"
    report.finished = _now()
    return report


# ---------------------------------------------------------------------------------------------
# Debounced background push


@dataclass(frozen=True)
class PushStatus:
    pending: frozenset[str]
    running: frozenset[str]
    last: dict[str, MbsyncRun]
    batches: int  # pushes completed since the scheduler started
    closed: bool


@dataclass
class _State:
    pending: set[str] = field(default_factory=set)
    running: frozenset[str] = frozenset()
    first_request: float = 0.0
    last_request: float = 0.0
    flush_now: bool = False
    closed: bool = False
    drain_on_close: bool = False
    batches: int = 0
    last: dict[str, MbsyncRun] = field(default_factory=dict)


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
        self._state = _State()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="mbsync-push", daemon=True)
        self._thread.start()

    def __enter__(self) -> PushScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, accounts: Iterable[str]) -> None:
        """Queue a push for these accounts (names checked now, so a typo fails here)."""
        names = {self.config.account(name).name for name in accounts}
        if not names:
            return
        with self._cond:
            state = self._state
            if state.closed:
                raise RuntimeError("the push scheduler is closed")
            now = time.monotonic()
            if not state.pending:
                state.first_request = now
            state.last_request = now
            state.pending |= names
            self._cond.notify_all()

    def flush(self) -> None:
        """Start what is pending now instead of after the quiet period (returns at once)."""
        with self._cond:
            self._state.flush_now = True
            self._cond.notify_all()

    def status(self) -> PushStatus:
        with self._cond:
            s = self._state
            return PushStatus(pending=frozenset(s.pending), running=s.running,
                              last=dict(s.last), batches=s.batches, closed=s.closed)

    def last_results(self) -> dict[str, MbsyncRun]:
        return self.status().last

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or running; False if ``timeout`` ran out first."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._state.pending and not self._state.running, timeout)

    def close(self, *, flush: bool = False, timeout: float = 10.0) -> None:
        """Stop: pending pushes are dropped (``flush=True``: run now), a push in flight may
        finish; waits at most ``timeout`` seconds for the thread."""
        with self._cond:
            self._state.closed = True
            self._state.drain_on_close = flush
            self._cond.notify_all()
        self._thread.join(timeout)

    # -- the background thread -------------------------------------------------------------

    def _due(self) -> float:
        s = self._state
        return min(s.last_request + self.quiet_period, s.first_request + self.max_delay)

    def _next_batch(self) -> list[str] | None:
        """Wait for a batch that is due; None when the scheduler is closing."""
        with self._cond:
            s = self._state
            while True:
                if s.closed and not (s.drain_on_close and s.pending):
                    s.pending.clear()
                    self._cond.notify_all()
                    return None
                if s.pending:
                    wait = self._due() - time.monotonic()
                    if wait <= 0 or s.flush_now or s.closed:
                        batch = sorted(s.pending)
                        s.pending.clear()
                        s.flush_now = False
                        s.running = frozenset(batch)
                        return batch
                    self._cond.wait(wait)
                else:
                    self._cond.wait()

    def _push(self, batch: list[str]) -> list[MbsyncRun]:
        runs: list[MbsyncRun] = []
        for name in batch:
            try:
                runs += run_mbsync(self.config, name, "push", timeout=self.timeout,
                                   lock_timeout=self.lock_timeout)
            except MbsyncNotInstalled as exc:
                runs.append(_not_run(self.config.account(name), "push", str(exc), skipped=False))
            except Exception as exc:  # keep the thread alive; the status shows what broke
                log.exception("push for %s failed", name)
                runs.append(_not_run(self.config.account(name), "push",
                                     f"{type(exc).__name__}: {exc}", skipped=False))
        return runs

    def _finish(self, runs: list[MbsyncRun]) -> None:
        with self._cond:
            s = self._state
            for run in runs:
                s.last[run.account] = run
                if run.busy and not s.closed:
                    # The other run may have started before this change was made: go again.
                    if not s.pending:
                        s.first_request = time.monotonic()
                    s.last_request = time.monotonic()
                    s.pending.add(run.account)
            s.running = frozenset()
            s.batches += 1
            self._cond.notify_all()

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            runs = self._push(batch)
            # Before _finish, so wait_idle() also covers the callback (e.g. a re-index).
            if self.after_push is not None:
                try:
                    self.after_push(runs)
                except Exception:
                    log.exception("after-push callback failed")
            self._finish(runs)
