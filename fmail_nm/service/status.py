"""The background service's status, shared with other processes through ``status.json``.

The service (``fmail-nm run`` / ``serve --watch``) writes the file whenever something it did
changes; ``fmail-nm status`` and the ``get_sync_status`` tool read it.  An MCP server without
``--watch`` writes none (several may run side by side): its ``get_sync_status`` adds the
pushes it made itself (:func:`with_own_pushes`), and it keeps them in a file of its own,
``servers/<pid>-<token>.json``, for ``fmail-nm status`` (:class:`ServerPushRecord`).  Writes
are atomic (temporary file, then rename), so a reader sees the old status or the new one,
never half; reads tolerate a missing or damaged file (no service has run, or a crash mid-way).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import tempfile
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import IO

from pydantic import Field, PrivateAttr, ValidationError
from pydantic.json_schema import SkipJsonSchema

from ..clock import utc_now
from ..config import Account
from ..private import private_dir, private_file
from ..tools.dto import Dto
from .mbsync import MbsyncRun
from .push import PushScheduler, PushStatus
from .pushed import last_pushed

log = logging.getLogger(__name__)

STATUS_FILE = "status.json"
SERVERS_DIR = "servers"  # one file per MCP server without --watch, and the lock it holds


class ServiceInfo(Dto):
    pid: int
    started_at: datetime
    running: bool = Field(description="false once the service stopped cleanly")
    stopped_at: datetime | None = None
    watcher: str = Field(default="off", description="inotify, polling or off")


class RunInfo(Dto):
    """One mbsync run (pull or push) for an account."""

    at: datetime = Field(description="when it started (UTC)")
    ok: bool
    error: str | None = None
    seconds: float


class AccountStatus(Dto):
    name: str
    channel: str | None
    pull_interval_minutes: float = Field(description="0: no scheduled pull")
    last_pull: RunInfo | None = None
    last_push: RunInfo | None = None
    next_pull_at: datetime | None = None
    consecutive_failures: int = Field(default=0, description="failed pulls in a row")
    push_pending: bool = Field(
        default=False, description="writes not pushed yet (a push failed or the service "
        "stopped first): retried, and pushed by the next start")
    # In a server's file (ServerPushRecord) only: when its latest write asked for a push, so
    # only a push that started later settles what it left.  Not in get_sync_status's schema.
    last_write_at: SkipJsonSchema[datetime | None] = None


class IndexStatus(Dto):
    last_run_at: datetime | None = None
    last_ok: bool | None = None  # None after a run: stopped at shutdown (last_error says so)
    last_error: str | None = None
    runs: int = Field(default=0, description="notmuch new runs by this service")
    last_added: int | None = Field(default=None, description="messages the last run added")
    batches_skipped: int = Field(
        default=0, description="file-event batches the index already reflected (no run needed)")


class ServiceStatus(Dto):
    service: ServiceInfo
    accounts: list[AccountStatus] = Field(default_factory=list)
    index: IndexStatus = Field(default_factory=IndexStatus)
    queue_length: int = Field(default=0, description="file events waiting for the debounce")
    notmuch_revision: int | None = None
    indexed_at: datetime | None = Field(default=None,
                                        description="end of the last successful index run")
    # No service's: an MCP server's without --watch, for its own pushes (server_only_status).
    # Not in the answer's schema: service.running=false tells a client as much.
    _server_only: bool = PrivateAttr(default=False)

    @property
    def server_only(self) -> bool:
        return self._server_only

    def account(self, name: str) -> AccountStatus | None:
        return next((a for a in self.accounts if a.name == name), None)


def run_info(run: MbsyncRun) -> RunInfo:
    return RunInfo(at=run.started, ok=run.ok, error=run.error or None, seconds=run.seconds)


def account_status(account: Account) -> AccountStatus:
    return AccountStatus(name=account.name, channel=account.mbsync_channel,
                         pull_interval_minutes=account.pull_interval_minutes)


def server_only_status(accounts: Iterable[Account], started_at: datetime) -> ServiceStatus:
    """The status of an MCP server without ``--watch`` where no service ever wrote one: it
    pushes (and retries) its own writes, and nothing watches, indexes or pulls."""
    status = ServiceStatus(service=ServiceInfo(pid=os.getpid(), started_at=started_at,
                                               running=False),
                           accounts=[account_status(a) for a in accounts])
    status._server_only = True
    return status


def mark_stopped(status: ServiceStatus) -> None:
    """Mark a status as its process's last: stopped cleanly now, nothing queued or due."""
    status.service.running = False
    status.service.stopped_at = utc_now()
    status.queue_length = 0
    for acct in status.accounts:
        acct.next_pull_at = None


def _sent_since(push: RunInfo | None, stopped: datetime | None) -> bool:
    """Whether ``push`` sent the writes a process that stopped at ``stopped`` left waiting:
    it started later and went through (``mbsync --push`` sends every local change of the
    channel)."""
    return push is not None and push.ok and stopped is not None and push.at >= stopped


def with_own_pushes(status: ServiceStatus, pushes: PushStatus) -> ServiceStatus:
    """The status with this process's own pushes in it (an MCP server without ``--watch``
    pushes its writes itself, which no service's status.json tells): an account waits while
    either side has writes to push; its last push is the later of the two.  A service that
    stopped marked writes made before it stopped: a push of this process's that started
    later and went through sent them too (``mbsync --push`` sends every local change of the
    channel), so they wait no more."""
    shown = status.model_copy(deep=True)
    stopped = shown.service.stopped_at if not shown.service.running else None
    for acct in shown.accounts:
        run = pushes.last.get(acct.name)
        if run is not None and not run.skipped and (
                acct.last_push is None or run.started >= acct.last_push.at):
            acct.last_push = run_info(run)
        pushed = run_info(run) if run is not None and not run.skipped else None
        acct.push_pending = ((acct.push_pending and not _sent_since(pushed, stopped))
                             or pushes.unpushed(acct.name))
    return shown


class SyncStatus(Dto):
    """The answer of the ``get_sync_status`` tool."""

    running: bool = Field(description="a service is watching, indexing and pulling right now")
    status: ServiceStatus | None = Field(description="its last status; null: none ever ran")
    problems: list[str] = Field(default_factory=list, description="setup problems and fixes")


def sync_status(data_dir: Path, live: ServiceStatus | None = None,
                problems: list[str] | None = None, *,
                pusher: PushScheduler | None = None) -> SyncStatus:
    """``live`` (this process's :meth:`Background.status`) if given, else the status file --
    with the pushes of ``pusher`` in it, this process's own (an MCP server without
    ``--watch``) once it was asked for one: the writes it could not push yet are said to
    wait, whether or not a service ever ran."""
    status = live if live is not None else StatusStore(data_dir).load()
    running = service_alive(status)
    if pusher is not None:
        pushes = pusher.status()
        if status is not None or pushes.last or pushes.pending or pushes.running:
            status = with_own_pushes(
                status or server_only_status(pusher.config.accounts, pusher.started), pushes)
    return SyncStatus(running=running, status=status, problems=problems or [])


def status_path(data_dir: Path) -> Path:
    return Path(data_dir) / STATUS_FILE


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0 checks without signalling)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def service_alive(status: ServiceStatus | None) -> bool:
    """True when the status says running and its process still exists."""
    return status is not None and status.service.running and pid_alive(status.service.pid)


class StatusStore:
    """``<data_dir>/status.json`` (or ``path``): the current status in memory, mirrored
    atomically on disk.

    :meth:`update` is safe from any thread of this process; other processes only read.
    """

    def __init__(self, data_dir: Path, path: Path | None = None) -> None:
        self.path = path or status_path(data_dir)
        self._lock = threading.Lock()
        self._current: ServiceStatus | None = None

    def load(self) -> ServiceStatus | None:
        """What the file says, or None when it is missing or unreadable."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return None
        try:
            return ServiceStatus.model_validate_json(text)
        except (ValidationError, ValueError) as exc:
            log.warning("ignoring damaged %s: %s", self.path, str(exc).splitlines()[0])
            return None

    def current(self) -> ServiceStatus | None:
        """This process's status (a copy), or what the file says if this process wrote none."""
        with self._lock:
            if self._current is not None:
                return self._current.model_copy(deep=True)
        return self.load()

    def write(self, status: ServiceStatus) -> None:
        """Replace the status (the service does this once, when it starts)."""
        with self._lock:
            self._current = status.model_copy(deep=True)
            self._save(self._current)

    def update(self, mutator: Callable[[ServiceStatus], None]) -> ServiceStatus:
        """Change the status in place with ``mutator`` and save it; returns a copy.

        The file is written only when something changed, so callers may update freely."""
        with self._lock:
            if self._current is None:
                raise RuntimeError("StatusStore.update before write(): no status to change")
            before = self._current.model_dump_json()
            mutator(self._current)
            if self._current.model_dump_json() != before:
                self._save(self._current)
            return self._current.model_copy(deep=True)

    def update_running(self, mutator: Callable[[ServiceStatus], None]) -> ServiceStatus:
        """:meth:`update` while the status says running; once it says stopped, nothing: a
        thread of the service that outlived its join at shutdown must not write what it saw
        running (work queued, the next pull) into its last word.  The check and the write are
        under the lock :func:`mark_stopped`'s update holds as it saves, so the stop's replace
        of the file is the last."""
        def if_running(status: ServiceStatus) -> None:
            if status.service.running:
                mutator(status)
        return self.update(if_running)

    def remove(self) -> None:
        """Delete the file (a process that leaves nothing to tell)."""
        with self._lock:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cannot remove %s: %s", self.path, exc)

    def _save(self, status: ServiceStatus) -> None:
        # Same directory as the target, so the rename is atomic; a failure leaves the old file.
        try:
            private_dir(self.path.parent)
            fd, tmp = tempfile.mkstemp(prefix=".status-", suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(status.model_dump_json(indent=2))
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:  # a full disk must not stop indexing; the log says why
            log.warning("cannot write %s: %s", self.path, exc)


# ---------------------------------------------------------------------------------------------
# The pushes of MCP servers without --watch, for `fmail-nm status`


class ServerPushRecord:
    """``<data_dir>/servers/<pid>-<token>.json``: this process's pushes (an MCP server without
    ``--watch``) as a :func:`server_only_status` with ``service.running`` true, for
    ``fmail-nm status`` in another process.  The random token keeps the name its own where
    another server gets the same pid (reused; each container's pid 1), and the server holds
    an ``flock`` on the ``.lock`` file of that name while it runs: how a process in any pid
    namespace tells that it does.

    :meth:`record` is the pusher's ``on_change``: the file is written only when what it says
    changed (writes ask for a push, which moves each account's ``last_write_at`` on, once
    per burst; a push starts, fails, goes through), on the pusher's thread.  :meth:`close`
    removes it, or, when writes stayed local, marks it stopped with them waiting, as a
    stopped service's status.json does.
    """

    def __init__(self, pusher: PushScheduler) -> None:
        self.pusher = pusher
        data_dir = Path(pusher.config.data_dir)
        path = data_dir / SERVERS_DIR / f"{os.getpid()}-{secrets.token_hex(4)}.json"
        self._held = _hold_lock(_lock_path(path))  # before the file: no file without its lock
        self.store = StatusStore(data_dir, path)
        self._lock = threading.Lock()
        self._closed = False
        status = server_only_status(pusher.config.accounts, pusher.started)
        status.service.running = True
        self.store.write(status)

    def record(self, pushes: PushStatus) -> None:
        own = with_own_pushes(server_only_status(self.pusher.config.accounts,
                                                 self.pusher.started), pushes)
        _mark_writes(own.accounts, pushes.asked)

        def follow(s: ServiceStatus) -> None:
            s.accounts = own.accounts
        with self._lock:
            if not self._closed:  # a push outliving close() must not write the file again
                self.store.update(follow)

    def close(self, unpushed: frozenset[str]) -> None:
        """After the pusher's close, with what it returned."""
        asked = self.pusher.status().asked  # a write told to no record yet counts too

        def stopped(s: ServiceStatus) -> None:
            mark_stopped(s)
            for acct in s.accounts:
                acct.push_pending = acct.name in unpushed
            _mark_writes(s.accounts, asked)
        with self._lock:
            self._closed = True
            if unpushed:
                self.store.update(stopped)
            else:
                self.store.remove()
            if self._held is not None:  # last: once it is free, the file is final
                _lock_path(self.store.path).unlink(missing_ok=True)
                self._held.close()
                self._held = None


def _mark_writes(accounts: list[AccountStatus], asked: dict[str, datetime]) -> None:
    for acct in accounts:
        acct.last_write_at = asked.get(acct.name)


def _lock_path(path: Path) -> Path:
    return path.with_suffix(".lock")


def _hold_lock(path: Path) -> IO[str] | None:
    """``path`` created and locked for as long as the returned file stays open; None, logged,
    when it cannot be (the record then reads as its server's last word)."""
    try:
        private_dir(path.parent)
        private_file(path)
        held = open(path, "a")  # held open for the life of the server
    except OSError as exc:
        log.warning("cannot create %s: %s", path, exc)
        return None
    fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a fresh name: nobody else holds it
    return held


def _server_runs(path: Path) -> bool:
    """Whether the server of this file runs: it holds the file's lock.  Only tried, never
    held: this may run in another pid namespace, where the server's pid means nothing."""
    try:
        with open(_lock_path(path)) as probe:
            fcntl.flock(probe.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except FileNotFoundError:  # the server removed it as it stopped
        return False
    except OSError as exc:  # cannot tell: it may run, so its file stays
        log.warning("cannot check %s: %s", _lock_path(path), exc)
        return True
    return False


def server_statuses(data_dir: Path) -> list[ServiceStatus]:
    """The files of MCP servers without ``--watch``, ``service.running`` saying whether the
    server runs: each running server's, and each stopped one's with writes it left local
    that no push since sent (whoever pushed: :mod:`~fmail_nm.service.pushed`).  The file of
    a server that is gone and left nothing waiting is removed -- only such a file."""
    pushed = last_pushed(data_dir)
    shown = []
    for path in sorted((Path(data_dir) / SERVERS_DIR).glob("*.json")):
        runs = _server_runs(path)  # before reading: a server writes its last before it lets go
        status = StatusStore(data_dir, path).load()
        if status is not None and not runs:
            status = _settled(status, pushed)
        if status is not None and (runs or any(a.push_pending for a in status.accounts)):
            status.service.running = runs
            shown.append(status)
        elif not runs:
            StatusStore(data_dir, path).remove()
            _lock_path(path).unlink(missing_ok=True)  # left by a server that died
    return shown


def _settled(status: ServiceStatus, pushed: dict[str, datetime]) -> ServiceStatus:
    """A stopped server's status, less the waiting writes a push since sent: one that
    started after the latest of them asked for its push and went through (``mbsync --push``
    sends every local change of the channel).  Writes of no known time stay."""
    for acct in status.accounts:
        at, written = pushed.get(acct.name), acct.last_write_at
        if at is not None and written is not None and at >= written:
            acct.push_pending = False
    return status


# ---------------------------------------------------------------------------------------------
# Text for `fmail-nm status`


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    local = moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    seconds = (now - moment).total_seconds()
    if abs(seconds) < 1:
        return f"{local} (now)"
    span = abs(seconds)
    if span < 90:
        amount = f"{span:.0f}s"
    elif span < 5400:
        amount = f"{span / 60:.0f} min"
    elif span < 172800:
        amount = f"{span / 3600:.1f} h"
    else:
        amount = f"{span / 86400:.0f} days"
    return f"{local} ({amount} ago)" if seconds > 0 else f"{local} (in {amount})"


def first_line(text: str | None) -> str:
    """An error on one line, for the journal and the status: its first line, and the next
    one too when the first only introduces it ("notmuch new failed (exit 1):")."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def _run_text(what: str, run: RunInfo | None, now: datetime) -> str:
    if run is None:
        return f"no {what} yet"
    if run.ok:
        return f"last {what} {_when(run.at, now)} ok in {run.seconds:.1f}s"
    return f"last {what} {_when(run.at, now)} FAILED: {first_line(run.error)}"


def _account_head(acct: AccountStatus) -> str:
    return f"account {acct.name}" + (f" (channel {acct.channel})" if acct.channel else
                                       " (no mbsync channel)")


def _push_parts(acct: AccountStatus, now: datetime, *, retried: bool = True) -> list[str]:
    parts = []
    if acct.last_push is not None:
        parts.append(_run_text("push", acct.last_push, now))
    if acct.push_pending:
        parts.append("writes waiting to be pushed" + (" (retried)" if retried else ""))
    return parts


def _account_line(acct: AccountStatus, now: datetime) -> str:
    head = _account_head(acct)
    parts = []
    if acct.channel and acct.pull_interval_minutes > 0:
        parts.append(f"pull every {acct.pull_interval_minutes:g} min")
        parts.append(_run_text("pull", acct.last_pull, now))
        if acct.consecutive_failures:
            parts.append(f"{acct.consecutive_failures} failure(s) in a row")
        if acct.next_pull_at is not None:
            parts.append(f"next {_when(acct.next_pull_at, now)}")
    elif acct.channel:
        parts.append("no scheduled pull (set pull_interval_minutes)")
        if acct.last_pull is not None:
            parts.append(_run_text("pull", acct.last_pull, now))
    parts += _push_parts(acct, now)
    return head + (": " + "; ".join(parts) if parts else "")


def _own_push_lines(status: ServiceStatus, now: datetime, *, retried: bool = True
                    ) -> list[str]:
    """The pushes of a server without ``--watch``, one line per account it pushes;
    ``retried``: the server runs, and retries a failed one."""
    return [f"{_account_head(acct)}: "
            f"{'; '.join(_push_parts(acct, now, retried=retried) or ['no push yet'])}"
            for acct in status.accounts if acct.channel]


def _server_only_text(status: ServiceStatus, now: datetime) -> str:
    """:func:`server_only_status` for people: no service, and what this server pushed."""
    lines = ["fmail-nm service: not running (no status recorded; start it with `fmail-nm run` "
             "or `fmail-nm serve --watch`); this server pushes its own writes"]
    return "\n".join(lines + _own_push_lines(status, now)) + "\n"


def _server_head(status: ServiceStatus, now: datetime) -> str:
    svc = status.service
    if svc.running:
        return (f"MCP server without --watch: running (pid {svc.pid}, since "
                f"{_when(svc.started_at, now)}); it pushes its own writes")
    gone = (f"pid {svc.pid} is gone without a clean stop (started {_when(svc.started_at, now)})"
            if svc.stopped_at is None else f"pid {svc.pid} stopped {_when(svc.stopped_at, now)}")
    return (f"MCP server without --watch: NOT running -- {gone}; the writes it left local "
            f"go out with the next push or `fmail-nm sync`")


def servers_text(servers: list[ServiceStatus], *, now: datetime | None = None) -> str:
    """:func:`server_statuses` for people: each server, then its accounts' pushes (a stopped
    one's: those with writes waiting)."""
    now = now or utc_now()
    lines = []
    for status in servers:
        if not status.service.running:
            status = status.model_copy(update={
                "accounts": [a for a in status.accounts if a.push_pending]})
        lines += [_server_head(status, now),
                  *_own_push_lines(status, now, retried=status.service.running)]
    return "".join(line + "\n" for line in lines)


def render_text(status: ServiceStatus | None, *, now: datetime | None = None) -> str:
    """The status for people: who runs, each account, the index, the queue, the revision."""
    now = now or utc_now()
    if status is None:
        return ("fmail-nm service: not running (no status recorded; start it with "
                "`fmail-nm run` or `fmail-nm serve --watch`)\n")
    if status.server_only:
        return _server_only_text(status, now)
    svc = status.service
    if svc.running and pid_alive(svc.pid):
        head = (f"fmail-nm service: running (pid {svc.pid}, since {_when(svc.started_at, now)}, "
                f"watching: {svc.watcher})")
    elif svc.running:
        head = (f"fmail-nm service: NOT running -- pid {svc.pid} is gone without a clean stop "
                f"(started {_when(svc.started_at, now)}); last known status:")
    else:
        head = (f"fmail-nm service: not running (stopped {_when(svc.stopped_at, now)}); "
                f"last known status:")
    lines = [head]
    lines += [_account_line(acct, now) for acct in status.accounts]
    idx = status.index
    if idx.last_run_at is None:
        index_line = f"index: no run yet ({idx.runs} runs)"
    elif idx.last_ok:
        added = f", {idx.last_added} new" if idx.last_added is not None else ""
        index_line = f"index: {idx.runs} runs, last {_when(idx.last_run_at, now)} ok{added}"
    elif idx.last_ok is None:
        index_line = (f"index: {idx.runs} runs, last {_when(idx.last_run_at, now)}: "
                      f"{first_line(idx.last_error)}")
    else:
        index_line = (f"index: {idx.runs} runs, last {_when(idx.last_run_at, now)} FAILED: "
                      f"{first_line(idx.last_error)}")
    lines.append(index_line)
    lines.append(f"indexed at: {_when(status.indexed_at, now)}")
    lines.append(f"queue: {status.queue_length} file event(s) waiting")
    revision = status.notmuch_revision
    lines.append(f"notmuch revision: {revision if revision is not None else 'unknown'}")
    return "\n".join(lines) + "\n"


def sync_status_text(result: SyncStatus, *, now: datetime | None = None) -> str:
    """``get_sync_status``'s text for the model: the status as ``fmail-nm status`` shows it,
    then the setup problems with their fixes."""
    lines = [render_text(result.status, now=now).rstrip("\n")]
    if result.problems:
        lines.append("setup problems:")
        lines += [f"- {problem}" for problem in result.problems]
    return "\n".join(lines)


def to_json(status: ServiceStatus | None, servers: list[ServiceStatus]) -> str:
    """For ``fmail-nm status --json``: the service's status (no keys where none was
    recorded), with ``servers`` added, :func:`server_statuses`."""
    shown = status.model_dump(mode="json") if status is not None else {}
    return json.dumps({**shown, "servers": [s.model_dump(mode="json") for s in servers]},
                      indent=2)
