"""The runs a shutdown ends (``fmail_nm.runs``): several stopped at once cost one grace."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

import pytest

from fmail_nm.runs import Run, RunRegistry
from fmail_nm.store import notmuch_cli

from .conftest import isolated_env

# A post-new hook that holds its notmuch new up until SIGKILL: it writes down each SIGINT (the
# polite stop, which notmuch new waits out as long as its hook runs) and, from then on, that it
# is still alive -- lines a SIGKILL to its session ends.
HELD_UP_HOOK = """#!/bin/sh
trap 'echo "INT $$" >> "$HOOK_LOG"; interrupted=1' INT
echo "start $$" >> "$HOOK_LOG"
while :; do
    sleep 0.05
    if [ -n "${interrupted:-}" ]; then echo "alive $$" >> "$HOOK_LOG"; fi
done
"""


def _held_up_notmuch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A notmuch config whose database is made, and whose post-new hook holds each run up;
    (the config, the hook's log)."""
    for name, value in isolated_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    mail, hooks, log = tmp_path / "mail", tmp_path / "hooks", tmp_path / "hook.log"
    for sub in ("cur", "new", "tmp"):
        (mail / "INBOX" / sub).mkdir(parents=True)
    hooks.mkdir()
    (hooks / "post-new").write_text(HELD_UP_HOOK)
    (hooks / "post-new").chmod(0o755)
    config = tmp_path / "notmuch-config"
    config.write_text(f"[database]\npath={mail}\nhook_dir={hooks}\n")
    monkeypatch.setenv("HOOK_LOG", str(log))
    log.touch()
    assert notmuch_cli.run_notmuch_new(str(config), hooks=False).returncode == 0  # the database
    return config, log


def _started(log: Path) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith("start")]


def test_runs_stopped_together_are_all_signalled_before_any_is_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped one after another, each run had its own grace: N notmuch new runs that wait on
    a hook cost N graces, past what systemd gives the service's stop.  Every one is signalled
    first, then all are waited for against one deadline."""
    monkeypatch.setattr(notmuch_cli, "NEW_STOP_GRACE", 1.0)
    config, log = _held_up_notmuch(tmp_path, monkeypatch)
    results: list[notmuch_cli.NewResult] = []
    threads = []
    for n in (1, 2):  # one after another: the two hooks are both holding their runs up
        # A timeout (never reached) runs each in a session of its own even when the tests
        # are typed at a terminal: in ours, the stop would reach notmuch new alone, and its
        # hook would hold the run's pipe open for good.
        threads.append(threading.Thread(daemon=True, target=lambda: results.append(
            notmuch_cli.run_notmuch_new(str(config), timeout=600))))
        threads[-1].start()
        while len(_started(log)) < n:
            assert threads[-1].is_alive(), results  # ended before its hook held it up
            threads[-1].join(0.05)

    assert notmuch_cli.stop_new_runs() == 2
    for thread in threads:
        thread.join(30)

    assert len(results) == 2 and all(r.shut_down for r in results)
    lines = log.read_text().splitlines()
    first, second = _started(log)
    interrupted = [line.split()[1] for line in lines if line.startswith("INT")]
    assert sorted(interrupted) == sorted([first, second])
    # the run signalled first was still alive once the second was signalled: not killed yet
    early, late = interrupted
    assert lines.index(f"INT {late}") < max(i for i, line in enumerate(lines)
                                            if line == f"alive {early}"), lines


def test_a_run_sigkill_does_not_end_is_left_behind_with_its_pid(
        caplog: pytest.LogCaptureFixture) -> None:
    """A run in uninterruptible sleep (its Maildir on a hung NFS server) outlives SIGKILL
    until the kernel lets it go -- maybe never: waited for without a bound, it held the
    shutdown for good (outside systemd nothing else ends it).  No process can ignore SIGKILL,
    so here the registry's own ``send`` leaves the run untouched, as the kernel leaves one in
    D state; the run is a real process, and the stop must give up on it and say which."""
    def untouched(proc: Run, sig: signal.Signals) -> None:
        pass
    registry = RunRegistry(untouched, signal.SIGTERM)
    proc = registry.start([sys.executable, "-c", "import time; time.sleep(600)"])
    assert proc is not None
    stopper = threading.Thread(target=registry.stop_all, args=(0.1,), daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="fmail_nm.runs"):
            stopper.start()
            stopper.join(60)
            assert not stopper.is_alive(), "the stop waits for a run SIGKILL did not end"
        assert proc.poll() is None  # given up on, not ended
    finally:
        proc.kill()
        proc.wait()
        stopper.join(60)
    assert f"(pid {proc.pid}) still there" in caplog.text, caplog.text
    assert "init adopts it" in caplog.text
    assert registry.finished(proc)  # its caller still learns the shutdown stopped it


def test_a_run_whose_timer_cannot_start_is_stopped_and_untracked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the start of its notmuch new, a run can still fail before it reads a line: its
    timeout's timer thread cannot start (threads exhausted; here a stack no address space
    holds).  The run was left going -- held up by its hook, for good -- and tracked: the
    shutdown then found it still there."""
    monkeypatch.setattr(notmuch_cli, "NEW_STOP_GRACE", 1.0)
    config, _ = _held_up_notmuch(tmp_path, monkeypatch)
    threading.stack_size(sys.maxsize & ~0xFFFF)  # every thread started from here on fails
    try:
        with pytest.raises(RuntimeError, match="thread"):
            notmuch_cli.run_notmuch_new(str(config), timeout=600)
    finally:
        threading.stack_size(0)
    assert notmuch_cli.stop_new_runs() == 0  # nothing of it left for the shutdown to stop
