"""``notmuch`` run as a program: its resolved configuration, ``notmuch new`` and ``notmuch reindex``.

The indexer is ``notmuch new`` itself -- the program every notmuch user already trusts, which
runs their pre-/post-new hooks (ours among them).  Everything else goes through the bindings
in :mod:`fmail_nm.store.notmuch`.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ..config import NOTMUCH_LOCATION_VARIABLES
from ..runs import RunRegistry
from .notmuch import ConfigUnparsable, DatabaseMissing, notmuch_message
from .notmuch_config import find_notmuch_config

CLI_TIMEOUT = 30.0


# ---------------------------------------------------------------------------------------------
# Configuration, read the way libnotmuch reads it


def config_arg(config_path: str | os.PathLike[str] | None) -> list[str]:
    return [f"--config={os.fspath(config_path)}"] if config_path else []


def notmuch_settings(config_path: str | os.PathLike[str] | None = None,
                     env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every setting notmuch resolves (config file, database, defaults), via ``notmuch config
    list`` -- it works before a database exists, which the bindings cannot do.  ``env``: the
    environment notmuch runs in (default: this process's)."""
    argv = ["notmuch", *config_arg(config_path), "config", "list"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                              check=False, env=env)
    except FileNotFoundError:
        raise DatabaseMissing("the notmuch program is not installed") from None
    if done.returncode != 0:
        raise DatabaseMissing(f"notmuch could not read its configuration: {done.stderr.strip()}")
    settings: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            settings[key] = value
    # A config it cannot load, notmuch lists as nothing at all, and exits 0.
    found = find_notmuch_config(os.fspath(config_path) if config_path else None)
    if not settings and found is not None:
        raise ConfigUnparsable(found, notmuch_message(done.stderr))
    return settings


def database_located_by_environment(
        config_path: str | os.PathLike[str] | None) -> dict[str, str]:
    """The variables besides the config that decide where notmuch finds its database, as
    fmail.toml's ``[notmuch]`` names them (config.NOTMUCH_LOCATION_VARIABLES): ``database``
    from $NOTMUCH_DATABASE, which always does; ``maildir`` from $MAILDIR, only when notmuch
    would find the database elsewhere without it (notmuch-config(1), "DATABASE LOCATION":
    a config's database.path comes first) -- it is a variable of the user's shell that other
    programs read too.  notmuch reads both from the environment alone, so a program started
    without it (by an MCP client, by systemd) would open another database, or none."""
    located = {key: os.environ[variable] for key, variable in NOTMUCH_LOCATION_VARIABLES.items()
               if os.environ.get(variable)}
    if "maildir" in located and ("database" in located
                                 or not _maildir_locates_database(config_path)):
        del located["maildir"]
    return located


def _maildir_locates_database(config_path: str | os.PathLike[str] | None) -> bool:
    without = {name: value for name, value in os.environ.items() if name != "MAILDIR"}
    try:
        return (notmuch_settings(config_path).get("database.path")
                != notmuch_settings(config_path, without).get("database.path"))
    except (DatabaseMissing, ConfigUnparsable):
        return True  # cannot tell: keep it, as the environment had it


def reindex(config_path: str | os.PathLike[str] | None, query: str) -> str | None:
    """``notmuch reindex`` of the messages ``query`` finds: their subject, date, sender and
    words read again from their files, thread and tags kept (the bindings cannot).  None
    when done, else what went wrong."""
    argv = ["notmuch", *config_arg(config_path), "reindex", query]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else notmuch_message(done.stderr) or "failed"


# ---------------------------------------------------------------------------------------------
# notmuch new


@dataclass(frozen=True)
class NewResult:
    returncode: int
    output: str
    timed_out: bool = False  # stopped after ``timeout`` seconds (e.g. stuck on the write lock)
    shut_down: bool = False  # stopped by stop_new_runs (the service's shutdown)


# After SIGINT, notmuch new commits what it has indexed and exits (on SIGTERM it dies with
# all of it); this long, then SIGKILL.
NEW_STOP_GRACE = 5.0


def _signal_new(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """``sig`` to notmuch new's own process group -- or to it alone when it shares ours, the
    terminal's (see :func:`run_notmuch_new`), which a signal to the group would end too."""
    if os.getpgid(proc.pid) == proc.pid:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)


# The runs of this process still going, most in a session of their own: out of reach of a
# signal to the service's process group, one left behind would index on after the service is
# gone -- the pass that follows it left to the service.  The server's shutdown refuses new ones
# at the end: a thread it left running (a push it ended, which goes on to its re-index) would
# start a notmuch new that outlives it.
NEW_RUNS = RunRegistry(_signal_new, signal.SIGINT)


def stop_new_runs() -> int:
    """Stop every ``notmuch new`` of this process still going (as :func:`_stop_new` does, but
    all within one NEW_STOP_GRACE) -- the service's shutdown, once its deadline has passed;
    how many were stopped.  The server's last stop (``final``: none starts after it) ends
    them together with mbsync's runs (:func:`fmail_nm.runs.stop_together`)."""
    return NEW_RUNS.stop_all(NEW_STOP_GRACE)


def _time_out(proc: subprocess.Popen[bytes], timed_out: threading.Event) -> None:
    timed_out.set()
    _stop_new(proc)


def _stop_new(proc: subprocess.Popen[bytes]) -> None:
    """Stop a ``notmuch new``, its hooks included when they are in its own process group:
    politely first, because notmuch new commits what it indexed on SIGINT; SIGKILL after
    NEW_STOP_GRACE, or at once when a second Ctrl-C or SIGTERM cuts the wait short (it then
    propagates)."""
    NEW_RUNS.stop([proc], NEW_STOP_GRACE)


def _at_a_terminal() -> bool:
    """Whether this process is in the foreground of its controlling terminal: a command
    typed at a shell (not one under `timeout`, which takes a process group of its own)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # no controlling terminal: a service, an MCP client's child
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def run_notmuch_new(config_path: str | None = None, *, hooks: bool = True,
                    timeout: float | None = None, as_tty: bool = False,
                    on_line: Callable[[str], None] | None = None,
                    env: Mapping[str, str] | None = None,
                    full_scan: bool = False) -> NewResult:
    """``notmuch new`` as a subprocess: it is the indexer every notmuch user already trusts,
    and it runs the user's pre-/post-new hooks (ours among them).

    notmuch prints its progress ("Processed 120 of 5000 files") only to a terminal, so with
    ``as_tty`` it runs on a pseudo-terminal and ``on_line`` sees each progress update -- and
    every line the hooks write, which share that terminal (``env``, added to ours for notmuch new
    and its hooks, is how a caller asks our hook for its progress lines:
    :mod:`fmail_nm.progress`).

    ``timeout`` bounds the whole run -- also the silent wait while another program holds the
    write lock (retry_lock prints nothing): notmuch new and its hooks are then stopped and the
    result says ``timed_out``.  On a Ctrl-C or a SIGTERM to us (a KeyboardInterrupt here, the
    CLI's ``_Terminated`` included) it is stopped as at a timeout, waited for, and the
    exception goes on -- never left indexing, and running its hooks, after we are gone.  It
    runs in a session of its own, so that its hooks are stopped with it and no signal meant
    for us (`timeout`'s to our process group: SIGTERM, which loses what it indexed) reaches
    it -- except with no timeout in the foreground of a terminal (`fmail-nm index` typed at a
    shell): there it stays in our process group, so that the user's hooks keep the terminal
    (an `mbsync -a` asking for a password, an ssh) and Ctrl-C and Ctrl-Z reach it as they
    reach us.

    ``full_scan`` lists every folder, not only those whose mtime changed since notmuch
    recorded it: on kernels with fine-grained file times (Linux 6.13 on) a folder's mtime can
    be a second ahead of ``time()`` for a few milliseconds after each second begins, and a
    scan then records a second in which more mail can still land unseen (notmuch's guard
    against that compares the two).  It costs ~0.2 s at 100,000 messages.
    """
    import pty  # here: the post-new hook, run after every notmuch new, starts none

    argv = ["notmuch", *config_arg(config_path), "new"]
    if not hooks:
        argv.append("--no-hooks")
    if full_scan:
        argv.append("--full-scan")
    child_env = {**os.environ, **env} if env else None
    own_session = timeout is not None or not _at_a_terminal()
    timed_out = threading.Event()
    timer = None
    lines: list[str] = []
    master, slave = pty.openpty() if as_tty else (-1, -1)
    proc = None
    try:  # on a pseudo-terminal, notmuch new and its hooks share it; else one pipe
        proc = NEW_RUNS.start(argv, stdout=slave if as_tty else subprocess.PIPE,
                              stderr=slave if as_tty else subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=own_session,
                              env=child_env)
    finally:
        if as_tty:
            os.close(slave)
            if proc is None:  # refused, or it could not start
                os.close(master)
    if proc is None:  # the shutdown has stopped the runs for good
        return NewResult(-signal.SIGINT, "", shut_down=True)
    # Once started, the run is stopped and untracked whatever fails: its timer's thread
    # cannot start, say, and it would go on (held up by a hook: for good), tracked.
    try:
        if as_tty:
            chunks = _pty_chunks(master)
        else:
            stdout = cast(io.BufferedReader, proc.stdout)  # a pipe: stdout=PIPE above
            chunks = iter(lambda: stdout.read1(4096), b"")
        # A timer, not a check between lines: a notmuch new waiting for the lock prints
        # nothing.
        if timeout is not None:
            timer = threading.Timer(timeout, _time_out, args=(proc, timed_out))
            timer.daemon = True
            timer.start()
        for line in _split_progress(chunks):
            lines.append(line)
            if on_line is not None:
                on_line(line)
        proc.wait(timeout=CLI_TIMEOUT)
    except BaseException:
        _stop_new(proc)  # with the terminal still open: its last words do not fail it
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if as_tty:
            os.close(master)
        shut_down = NEW_RUNS.finished(proc)
    return NewResult(proc.returncode, "".join(lines), timed_out=timed_out.is_set(),
                     shut_down=shut_down)


def _pty_chunks(fd: int) -> Iterator[bytes]:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            return
        if not chunk:
            return
        yield chunk


def _split_progress(chunks: Iterable[bytes]) -> Iterator[str]:
    # notmuch redraws its progress line with "\r"; split on it so callers see each update.
    buffer = ""
    for chunk in chunks:
        buffer += chunk.decode("utf-8", errors="replace")
        while True:
            cuts = [i for i in (buffer.find("\r"), buffer.find("\n")) if i >= 0]
            if not cuts:
                break
            cut = min(cuts)
            yield buffer[: cut + 1]
            buffer = buffer[cut + 1:]
    if buffer:
        yield buffer


def user_settings_as_written(nm: Mapping[str, str],
                             config_path: str | os.PathLike[str] | None) -> dict[str, str]:
    """``nm`` with the ``user.*`` values the config file really sets: ``notmuch config list``
    fills in guesses (the login name, ``user@hostname``) that are nobody's address."""
    import configparser

    path = find_notmuch_config(os.fspath(config_path) if config_path else None)
    if path is None:  # settings kept in the database only: nothing to tell guesses by
        return dict(nm)
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error:
        return dict(nm)  # notmuch read it; keep notmuch's word
    written = {f"user.{k}": v for k, v in parser.items("user")} if parser.has_section("user") \
        else {}
    return {**{k: v for k, v in nm.items() if not k.startswith("user.")}, **written}
