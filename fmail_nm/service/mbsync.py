"""Running mbsync: pull and push the Maildir against the IMAP servers -- and nothing else.

fmail-nm has no IMAP code of its own (ARCHITECTURE.md, "Data flow"): every write is a tag or a file
rename, and mbsync carries it to the server.  This module runs ``mbsync`` for the accounts'
channels and reports what happened; it never raises for a server that is down or a password
that is wrong -- those are results, so one bad account does not stop the others.

* :func:`run_mbsync` -- one ``mbsync`` per channel, serialised per channel across threads and
  processes by an ``flock`` on ``<data_dir>/locks/mbsync-<channel>.lock``.
* A folder another client deleted or renamed on the server fails every run of its channel
  (mbsync 1.4 without ``Remove Near``; the other folders still sync): an empty local folder
  is removed, as the server's was; one holding mail (or copies held for undo, or files in its
  ``tmp/``) is kept, and the run's error says which, how much, and what to do
  (:func:`gone_from_server`).

What builds on it: :mod:`fmail_nm.service.cycle` (``sync``: mbsync, then index) and
:mod:`fmail_nm.service.push` (the debounced background push after writes).  This module
imports no indexing code.

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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from .. import mbsyncrc
from ..clock import utc_now
from ..config import Account, Config, ConfigError, users_mbsync_config
from ..errors import BackendError, CallerError
from ..flock import flock_within, try_flock
from ..runs import RunRegistry
from ..store.maildir import HOLD, HOLD_DAYS, held_in, relative_path
from .pushed import record_pushed

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
# Lines that say nothing about why a run failed: notices, progress counters, -V chatter, and
# what KDE's XOAUTH2 SASL plugin says at every sign-in.
_NOISE = re.compile(
    r"^(?:\S+ notice: |Notice: |C: \d|B: \d|Processing |Opening |Connecting |Resolving |"
    r"Logging in|Selecting |Synchronizing|Loading |Channel |Mailbox |Authenticating|"
    r"\[SASL-XOAUTH2\] )"
)


class MbsyncNotInstalled(BackendError, FileNotFoundError):
    """The ``mbsync`` program (isync) is not on ``$PATH``."""


class ChannelBusy(BackendError):
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
        # The tool named: the error that follows is mbsync's (or the server's, through it).
        action = "sync" if self.direction == "both" else self.direction
        return f"{target}: mbsync {action} {state}: {self.error}"


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
    with open(path, "a", encoding="utf-8") as fh:
        if not try_flock(fh):
            log.info("waiting for the lock on mbsync channel %r (%s)", channel, path)
            if not flock_within(fh, began + timeout - time.monotonic()):
                raise ChannelBusy(
                    f"another mbsync is already running on channel {channel!r}; gave up "
                    f"after {timeout:g}s -- the changes go out with that run or the next one"
                )
        try:
            yield time.monotonic() - began
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


CHANNEL_POLL = 0.2  # how often a wait for a busy channel looks again


def busy_channels(config: Config) -> list[str]:
    """The accounts' channels an mbsync run of ours (in any process) holds right now."""
    busy = []
    for channel in sorted({a.mbsync_channel for a in config.accounts if a.mbsync_channel}):
        try:
            fh = open(lock_path(config, channel), encoding="utf-8")
        except OSError:  # never synced, or not a file we can open: no run of ours holds it
            continue  # (channel_lock could not open it either; that run says why it failed)
        with fh:
            try:  # shared: fails only while a run holds it exclusively
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                busy.append(channel)
            else:
                fcntl.flock(fh, fcntl.LOCK_UN)
    return busy


def wait_for_channels(config: Config, timeout: float,
                      stop: Callable[[], bool] = lambda: False,
                      on_wait: Callable[[list[str]], None] | None = None) -> float | None:
    """Wait until no mbsync run of ours holds a channel; the seconds waited (0.0 when none
    did), None if ``timeout`` ran out (or ``stop()`` said so) first.  mbsync syncs one
    folder after another, so in the middle of a run a message another client moved is gone
    from its old folder and not yet in its new one: ``notmuch new`` then would drop it, and
    every tag only notmuch keeps with it.  ``on_wait`` gets the busy channels once, when
    there are any: a person waiting is told for what."""
    began = time.monotonic()
    waited = 0.0
    busy = busy_channels(config)
    if busy and on_wait is not None:
        on_wait(busy)
    while busy:
        if stop() or time.monotonic() - began >= max(timeout, 0.0):
            return None
        time.sleep(CHANNEL_POLL)
        waited = time.monotonic() - began
        busy = busy_channels(config)
    return waited


# ---------------------------------------------------------------------------------------------
# Running mbsync


def valid_channel(channel: str) -> bool:
    # A leading "-" would make mbsync read the name as an option.
    return bool(channel) and not channel.startswith("-") and "\0" not in channel


def mbsync_config_of(config: Config, account: Account) -> str | None:
    """The mbsync config an account's channel is in: its own (accounts fmail-nm added have
    theirs; absolute, as :func:`~fmail_nm.config.load_settings` resolves it), else the user's
    (:func:`~fmail_nm.config.users_mbsync_config`) -- always named to mbsync with ``-c``:
    left to itself, mbsync may read another file than the one parsed here (isync 1.4 reads
    no isyncrc).  None: there is none."""
    if account.mbsync_config:
        return account.mbsync_config
    users = users_mbsync_config(config.settings)
    return str(users) if users is not None else None


def mbsync_argv(program: str, config: Config, account: Account, direction: Direction) -> list[str]:
    """``mbsync [-c CONFIG] -q [--pull|--push] CHANNEL``; ``-q`` drops progress counters, not
    errors."""
    if direction not in _DIRECTION_ARGS:
        raise CallerError(f"direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}")
    channel = account.mbsync_channel or ""
    if not valid_channel(channel):
        raise ConfigError(f"invalid mbsync channel name {channel!r}")
    rc = mbsync_config_of(config, account)
    return [program, *(["-c", rc] if rc else []), "-q", *_DIRECTION_ARGS[direction], channel]


def trim_error(stderr: str, stdout: str = "") -> str:
    """The lines of mbsync's output that say what went wrong, without notices or counters."""
    lines: list[str] = []
    for line in (stderr or stdout).splitlines():
        line = line.strip()
        if line and not _NOISE.match(line) and line not in lines:
            lines.append(line)
    text = "\n".join(lines[-ERROR_LINES:])
    return text if len(text) <= ERROR_CHARS else "…" + text[-ERROR_CHARS:]


def kill_group(proc: subprocess.Popen[Any], sig: signal.Signals = signal.SIGKILL) -> None:
    """Signal a command run in a session of its own (mbsync, msmtp) and all it started: a
    password command goes down with it."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        proc.send_signal(sig)


# The mbsync runs of this process (and the msmtp runs that check an account being added).
# Each runs in a session of its own, out of reach of a signal to the service's process group
# (Ctrl-C, `kill -- -PGID`): untracked, a run hung on a silent server (`Timeout 0`) would
# outlive the service for good.  SIGTERM to its session first: mbsync takes an interrupted run
# up again from its journal.
RUNS = RunRegistry(kill_group, signal.SIGTERM)
STOP_GRACE = 2.0  # seconds between SIGTERM and SIGKILL for a run stop_running ends
STOPPED = "mbsync was stopped: fmail-nm was shutting down"  # what such a run reports


class StoppedAtShutdown(BackendError):
    """A run the service's shutdown ended (see :func:`stop_running`), or refused to start."""


def start_tracked(argv: list[str], **popen: Any) -> subprocess.Popen[Any]:
    """Start a run that the service's shutdown ends (see :func:`stop_running`) if still going;
    StoppedAtShutdown once the shutdown has ended the runs for good (a push's next account, a
    tool call the shutdown left to finish going on to its pull would outlive us)."""
    proc = RUNS.start(argv, **popen)
    if proc is None:
        raise StoppedAtShutdown(f"{argv[0]} was not started: fmail-nm was shutting down")
    return proc


def untrack(proc: subprocess.Popen[Any]) -> bool:
    """The run ended: whether :func:`stop_running` ended it."""
    return RUNS.finished(proc)


def stop_running(grace: float = STOP_GRACE, *, final: bool = False) -> int:
    """End every run of this process still going (mbsync's, and msmtp's checks) -- the
    service's shutdown, once its deadline has passed: SIGTERM to each run's session, SIGKILL
    to those still there ``grace`` seconds later.  The runs report that they were stopped.
    ``final``: the process is ending, and no run starts from now on (:func:`start_tracked`
    refuses).  Returns how many there were."""
    return RUNS.stop_all(grace, final=final)


KILLED_OUTPUT_WAIT = 5.0  # seconds to read what a run wrote once mbsync itself has ended
EXIT_CHECK = 1.0  # how often a read of a run's output looks whether mbsync has ended
# mbsync 1.4 with a SASL plugin that is done after one step (KDE's XOAUTH2): a server that
# refuses the token answers with a challenge holding the error; mbsync says this, gives the
# sign-in up -- and then waits on that connection for good.
_GAVE_UP_SIGN_IN = "IMAP wants more steps despite successful SASL authentication"


def _sign_in_refused(to: str = "") -> str:
    return (f"mbsync gave up signing in{to}: the server did not take what the password command "
            "printed -- for an OAuth2 (XOAUTH2) account, an access token that is expired, "
            "revoked or another account's (renew it with your token helper)")


SIGN_IN_REFUSED = _sign_in_refused()


class _SignInAbandoned(Exception):
    """mbsync gave the sign-in up and hangs (see ``_GAVE_UP_SIGN_IN``)."""


def _output_of_killed(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """(stdout, stderr) of a run that has ended (killed, stopped, or exited): read until its
    pipes close, but for at most ``KILLED_OUTPUT_WAIT`` seconds -- a child that left its
    session (a PassCmd helper that daemonises) outlives mbsync holding them open, and
    reading would never end.  Then the output is given up on: the run is reported without
    it."""
    try:
        return proc.communicate(timeout=KILLED_OUTPUT_WAIT)
    except subprocess.TimeoutExpired:
        proc.wait()  # mbsync itself is gone: only the pipes are held
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        return "", ""


def _output(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """(stdout, stderr) of a run, read until its pipes close; :class:`TimeoutExpired` when
    mbsync is still running after ``timeout`` seconds.  Once mbsync has ended (stop_running
    ended it, or it exited) the pipes may still be held by a child that left its session:
    from then on the read is :func:`_output_of_killed`'s, bounded, not the run's."""
    deadline = time.monotonic() + timeout
    while True:
        try:  # retried after a timeout, communicate() loses nothing it read
            return proc.communicate(timeout=min(EXIT_CHECK, max(deadline - time.monotonic(), 0)))
        except subprocess.TimeoutExpired as exc:
            if proc.poll() is not None:
                return _output_of_killed(proc)
            if _GAVE_UP_SIGN_IN in _text(exc.stderr):
                raise _SignInAbandoned from None
            if time.monotonic() >= deadline:
                raise


def _text(partial: str | bytes | None) -> str:
    # What communicate() read before its timeout: bytes, even for a text-mode run.
    if isinstance(partial, bytes):
        return partial.decode("utf-8", "replace")
    return partial or ""


def execute(argv: list[str], timeout: float, *, keep_output: bool = False) -> tuple[int | None, str]:
    """Run mbsync; return (exit status or None if it did not start, what went wrong) -- or,
    with ``keep_output``, what it printed when it succeeded (``--list``)."""
    try:
        proc = start_tracked(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, errors="replace",
                             start_new_session=True)
    except FileNotFoundError:  # removed between the PATH lookup and now
        raise MbsyncNotInstalled(f"mbsync could not be started: {argv[0]} not found") from None
    except OSError as exc:
        return None, f"mbsync could not be started: {exc}"
    except StoppedAtShutdown:
        return None, STOPPED
    try:
        stdout, stderr = _output(proc, timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        stdout, stderr = _output_of_killed(proc)
        detail = trim_error(stderr, stdout)
        return proc.returncode, (f"mbsync did not finish within {timeout:g}s and was stopped"
                                 + (f"\n{detail}" if detail else ""))
    except _SignInAbandoned:
        kill_group(proc)
        _output_of_killed(proc)
        return proc.returncode, SIGN_IN_REFUSED
    except BaseException:  # Ctrl-C in `fmail-nm sync`: the run's own session would outlive us
        kill_group(proc)
        proc.wait()
        raise
    finally:
        stopped = untrack(proc)
    if stopped:
        return proc.returncode, STOPPED
    if proc.returncode == 0:
        return 0, stdout if keep_output else ""
    error = trim_error(stderr, stdout) or f"mbsync exited with status {proc.returncode}"
    return proc.returncode, error


def not_run(account: Account, direction: Direction, reason: str, *, skipped: bool = True,
            busy: bool = False, lock_wait: float = 0.0) -> MbsyncRun:
    """A run that did not start mbsync (``returncode`` None), with the reason as its error."""
    moment = utc_now()
    return MbsyncRun(account=account.name, channel=account.mbsync_channel, direction=direction,
                     ok=False, returncode=None, started=moment, finished=moment, error=reason,
                     skipped=skipped, busy=busy, lock_wait=lock_wait)


def _run_channel(program: str, config: Config, account: Account, direction: Direction, *,
                 timeout: float, lock_timeout: float) -> MbsyncRun:
    channel = account.mbsync_channel
    assert channel is not None
    argv = mbsync_argv(program, config, account, direction)
    try:
        with channel_lock(config, channel, lock_timeout) as waited:
            started = utc_now()
            code, error = execute(argv, timeout)
            if code != 0 and gone_from_server(error):
                code, error = _settle_gone_boxes(argv, config, account, (code, error), timeout)
            finished = utc_now()
    except ChannelBusy as exc:
        log.debug("mbsync %s for %s skipped: %s", direction, account.name, exc)
        return not_run(account, direction, str(exc), busy=True, lock_wait=lock_timeout)
    if error == SIGN_IN_REFUSED:
        error = _sign_in_refused(_group_sign_in(config, account))
    run = MbsyncRun(account=account.name, channel=channel, direction=direction, ok=code == 0,
                    returncode=code, started=started, finished=finished, error=error,
                    lock_wait=waited)
    # A failure is its caller's to say (`fmail-nm sync` prints it, the service logs it): a
    # warning here as well put it on a command's stderr twice.
    log.log(logging.INFO if run.ok else logging.DEBUG, "mbsync %s", run.describe())
    return run


# mbsync 1.4's words for a box it synced before (its sync state is there) that the server no
# longer has -- another client deleted or renamed it.  Without ``Remove Near`` mbsync skips
# that box and fails the run, at every run; the channel's other boxes sync all the same.
_GONE = re.compile(r"^Error: channel (\S+): far side box (.+) cannot be opened\.$", re.M)


def gone_from_server(error: str) -> list[tuple[str, str]]:
    """(channel, box) of each box that mbsync's error says the server no longer has."""
    return _GONE.findall(error)


@dataclass(frozen=True)
class GoneBox:
    """A box the server no longer has, and its local folder (relative to the mail root, as
    fmail-nm names folders) with how many messages it holds -- None when not found --, how
    many copies its hold keeps for undo, and how many other files lie in its ``tmp/``."""

    box: str
    folder: str | None
    messages: int | None
    held: int = 0
    leftovers: int = 0

    def problem(self) -> str:
        said = (f"the server no longer has folder {self.box} (deleted or renamed by another "
                f"mail client); mbsync skips it at every sync until that is settled")
        if self.messages is None:
            return said
        held = f", and {self.held} {'copy' if self.held == 1 else 'copies'} kept for undo"
        other = f", and {self.leftovers} other file{'s' if self.leftovers > 1 else ''} in its tmp/"
        return (f"{said}: local folder {self.folder} holds {self.messages} message(s) the "
                f"server does not have there{held if self.held else ''}"
                f"{other if self.leftovers else ''}")

    def fix(self) -> str:
        # Not "create the folder on the server again": mbsync 1.4 then fails on the box's new
        # UIDVALIDITY ("Unable to recover from UIDVALIDITY change"), at every sync.
        if self.messages is None:
            return ("move the mail of its local folder into another folder, then remove the "
                    "local folder")
        if self.messages == 0 and not self.held:
            return f"remove the empty local folder {self.folder}"
        removed = (f"removed at the first sync after the held copies are pruned ({HOLD_DAYS} "
                   "days after they were held)" if self.held else "then removed at the next sync")
        if self.messages == 0:
            return f"none needed: the folder is {removed}"
        return (f"move them into another folder (move_to_folder, query folder:\"{self.folder}\"; "
                f"the emptied folder is {removed})")


def gone_boxes(config: Config, account: Account, error: str) -> list[GoneBox]:
    """The boxes mbsync's error says the server no longer has, as their local folders are
    now."""
    rc = _parsed_rc(config, account)
    found = []
    for channel, box in gone_from_server(error):
        path = _near_folder(rc, channel, box)
        if path is None:
            found.append(GoneBox(box, None, None))
            continue
        leftovers = sum(1 for name in _in_tmp(path) if name != HOLD)
        found.append(GoneBox(box, relative_path(config.mail_root, path), _messages_in(path),
                             len(held_in(path)), leftovers))
    return found


def _settle_gone_boxes(argv: list[str], config: Config, account: Account,
                       failed: tuple[int | None, str], timeout: float) -> tuple[int | None, str]:
    """A run that failed on boxes the server no longer has: each one whose local folder holds
    no mail is removed (:func:`_removed_if_empty`) and the channel runs again; each one that
    holds mail is kept, and the error says what to do with it."""
    rc = _parsed_rc(config, account)
    code, error = failed
    removed = [gone for gone in gone_from_server(error)
               if _removed_if_empty(argv, rc, *gone, timeout)]
    if removed:  # the channel once more: its result is the run's, without the removed boxes
        code, error = execute(argv, timeout)
        if code == 0:
            return code, error
    told = [f"{gone.problem()} -- {gone.fix()}" for gone in gone_boxes(config, account, error)]
    return code, "\n".join(told + [error])


def _parsed_rc(config: Config, account: Account) -> mbsyncrc.MbsyncConfig | None:
    path = mbsync_config_of(config, account)
    return mbsyncrc.parse(Path(path)) if path and Path(path).is_file() else None


def _near_folder(rc: mbsyncrc.MbsyncConfig | None, channel: str, box: str) -> Path | None:
    """The local Maildir folder of a channel's box, as the store names it on disk; None when
    the store's layout is one this does not follow."""
    store = rc.channel_store(rc.channels[channel]) if rc and channel in rc.channels else None
    if store is None:
        return None
    if box == "INBOX":
        return store.inbox
    layout = (store.subfolders or "verbatim").lower()
    if layout == "maildir++":
        return store.inbox / ("." + box.replace("/", ".")) if store.inbox else None
    return store.path / box if store.path and layout == "verbatim" else None


def _messages_in(folder: Path) -> int | None:
    """How many message files the Maildir folder holds; None when it is no Maildir."""
    try:
        return sum(1 for sub in ("cur", "new") for entry in os.scandir(folder / sub)
                   if not entry.name.startswith("."))
    except OSError:
        return None


def _in_tmp(folder: Path) -> list[str]:
    """The names in the Maildir folder's ``tmp/`` (none when it has no ``tmp/``)."""
    try:
        return os.listdir(folder / "tmp")
    except OSError:
        return []


def _tmp_cleared(folder: Path) -> bool:
    """Whether the folder's ``tmp/`` is empty once its hold is removed if empty (``os.rmdir``
    refuses one that keeps copies).  mbsync removes no directory in ``tmp/`` nor a file
    another program may still be writing, and fails to remove a folder whose ``tmp/`` holds
    one -- after it dropped the box's UIDVALIDITY, so for good."""
    try:
        os.rmdir(folder / "tmp" / HOLD)
    except OSError:  # none, or it keeps copies
        pass
    return not _in_tmp(folder)


def _removed_if_empty(argv: list[str], rc: mbsyncrc.MbsyncConfig | None, channel: str,
                      box: str, timeout: float) -> bool:
    """Remove the local folder of a box the server no longer has if it holds no mail -- no
    message, no copy held for undo, nothing in ``tmp/`` -- and say whether it is gone.
    mbsync removes it (``--remove-near``, mbsync's ``Remove Near`` for this one box): it
    looks once more that the folder is empty, never deletes one that is not, and drops the
    box's sync state with it."""
    folder = _near_folder(rc, channel, box)
    # "," separates boxes in mbsync's channel:box argument; the inbox is never removed.
    if folder is None or box == "INBOX" or "," in box or _messages_in(folder) != 0:
        return False
    if not _tmp_cleared(folder):
        return False
    before_channel = argv[:argv.index("-q") + 1]  # mbsync [-c CONFIG] -q
    execute([*before_channel, "--remove-near", f"{channel}:{box}"], timeout)
    removed = not (folder / "cur").exists()
    if removed:
        log.info("removed the empty local folder %s: the server no longer has %s", folder, box)
    return removed


def _group_sign_in(config: Config, account: Account) -> str:
    """Which IMAP account of the account's Group mbsync gave up signing in to, as
    `` to IMAP account A (channel a)``: mbsync does not say, but only one that asks for
    XOAUTH2 gets there (see ``_GAVE_UP_SIGN_IN``).  "" for a channel that is no Group: the
    run names it (MbsyncRun.describe)."""
    path = mbsync_config_of(config, account)
    if not path or not Path(path).is_file():
        return ""
    rc = mbsyncrc.parse(Path(path))
    channels: dict[str, list[str]] = {}
    for channel in rc.group_channels(account.mbsync_channel or ""):
        imap = rc.channel_imap_account(channel)
        if imap is not None and "XOAUTH2" in imap.auth_mechs:
            channels.setdefault(imap.name, []).append(channel.name)
    named = [f"IMAP account {name} (channel{'s' if len(names) > 1 else ''} {', '.join(names)})"
             for name, names in channels.items()]
    return f" to {' or '.join(named)}" if named else ""


def selected_accounts(config: Config, account: str | None) -> list[Account]:
    """The named account (:class:`ConfigError` if unknown), or all of them."""
    return [config.account(account)] if account is not None else list(config.accounts)


def run_mbsync(config: Config, account: str | None = None, direction: Direction = "both", *,
               timeout: float = MBSYNC_TIMEOUT,
               lock_timeout: float = LOCK_TIMEOUT) -> list[MbsyncRun]:
    """Run mbsync for one account (by name) or all of them; one result per account.

    Accounts run one after another, each channel once (accounts sharing a channel share its
    result).  An account without ``mbsync_channel`` is reported as skipped, one with an
    unusable channel name as failed.  A channel that
    another run holds is waited for up to ``lock_timeout`` seconds, then reported as skipped.
    Raises only for caller errors -- an unknown account (:class:`ConfigError`), a bad
    direction (:class:`~fmail_nm.errors.CallerError`) -- and for mbsync not installed
    (:class:`MbsyncNotInstalled`, a :class:`~fmail_nm.errors.BackendError`).
    """
    if direction not in _DIRECTION_ARGS:
        raise CallerError(f"direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}")
    accounts = selected_accounts(config, account)
    program = find_mbsync() if any(a.mbsync_channel for a in accounts) else ""
    runs: list[MbsyncRun] = []
    by_channel: dict[tuple[str, str | None], MbsyncRun] = {}
    for acct in accounts:
        key = (acct.mbsync_channel or "", mbsync_config_of(config, acct))
        if not acct.mbsync_channel:
            runs.append(not_run(acct, direction, f"account {acct.name!r} has no mbsync channel; "
                                "set mbsync_channel in its [[accounts]] entry in fmail.toml"))
        elif not valid_channel(acct.mbsync_channel):
            runs.append(not_run(acct, direction, f"account {acct.name!r}: invalid mbsync "
                                f"channel name {acct.mbsync_channel!r}", skipped=False))
        elif key in by_channel:
            runs.append(replace(by_channel[key], account=acct.name))
        else:
            run = _run_channel(program, config, acct, direction, timeout=timeout,
                               lock_timeout=lock_timeout)
            by_channel[key] = run
            runs.append(run)
    if direction != "pull":  # for `fmail-nm status`: what it sent, whoever asks afterwards
        record_pushed(config.data_dir, {r.account: r.started for r in runs
                                        if r.ok and not r.skipped})
    return runs
