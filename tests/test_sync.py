"""Sync end to end: a real Dovecot, a real mbsync, real notmuch, fmail-nm's syncer in between.

What is shown here (and relied on by the write tools):

* a pull brings every message in, with ``unread``/``flagged`` matching ``\\Seen``/``\\Flagged``;
* server-side flag changes become tag changes (mbsync renames, ``notmuch new`` with
  ``maildir.synchronize_flags`` turns the rename into tags);
* local changes -- a mail client's rename, or a tag change through :class:`fmail_nm.store.notmuch.Writer`
  -- are pushed as IMAP flags;
* the conflict rule: mbsync merges per flag against its sync state, so a local change and a
  different server change to the same message both survive;
* a server outage is a reported failure, never lost local state; the next sync recovers;
* mbsync never runs twice at once on one channel, across threads and processes.

These tests fail -- never skip -- when Dovecot or mbsync is missing: CI installs both.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fmail_nm.config import ConfigError
from fmail_nm.service import cycle, mbsync, send
from fmail_nm.service.push import PushScheduler

from .conftest import MailEnv, notmuch_lock_held
from .syncbed import (  # noqa: F401  (pytest fixtures, used by name)
    ACCOUNT,
    ADDRESS,
    FLAGGED,
    SEEN,
    SyncBed,
    message,
    seed_standard,
    sync_bed,
    synced_bed,
)
from .test_background import wait_for

pytestmark = pytest.mark.imap


def assert_synced(report: cycle.SyncReport) -> None:
    assert report.ok, report.errors()
    (run,) = report.runs
    assert (run.account, run.channel, run.returncode) == (ACCOUNT, ACCOUNT, 0)


def test_initial_pull_indexes_everything_with_flags_as_tags(sync_bed: SyncBed) -> None:
    seed_standard(sync_bed)
    init = sync_bed.init()
    assert "indexed: 0 new" in init.stdout, init.stdout

    report = sync_bed.sync()

    assert_synced(report)
    assert report.runs[0].direction == "both" and not report.runs[0].error
    assert report.index is not None and report.index.added == 5
    assert sync_bed.search("*") == sorted(sync_bed.mid(n) for n in range(1, 6))
    assert sync_bed.search("subject:sync AND body:message") == sync_bed.search("*")
    expected = {
        1: {"unread", "inbox"},
        2: {"inbox"},
        3: {"unread", "flagged", "inbox"},
        4: {"flagged", "inbox"},
        5: {"archived"},  # the post-new rules: mail already in Archive stays out of the inbox
    }
    for n, tags in expected.items():
        assert sync_bed.tags(sync_bed.mid(n)) == frozenset(tags), n  # "new" is gone: the hook ran
    assert sync_bed.search("folder:acct/Archive") == [sync_bed.mid(5)]
    assert sync_bed.find(sync_bed.mid(1)).filenames[0].endswith(":2,")  # type: ignore[union-attr]


def test_mail_appended_on_the_server_arrives_with_the_next_sync(synced_bed: SyncBed) -> None:
    synced_bed.seed(6, flags=[FLAGGED])
    assert synced_bed.find(synced_bed.mid(6)) is None

    report = synced_bed.sync()

    assert_synced(report)
    assert report.index is not None and report.index.added == 1
    assert synced_bed.tags(synced_bed.mid(6)) == {"unread", "flagged", "inbox"}


def test_server_flag_changes_become_tag_changes(synced_bed: SyncBed) -> None:
    synced_bed.store(synced_bed.mid(1), "+FLAGS", [FLAGGED])  # flag an unread message
    synced_bed.store(synced_bed.mid(2), "-FLAGS", [SEEN])     # mark a read message unread
    synced_bed.store(synced_bed.mid(4), "-FLAGS", [FLAGGED])  # unflag

    assert_synced(synced_bed.sync())

    # mbsync renamed the files; notmuch new (synchronize_flags) turned that into tags.
    assert synced_bed.maildir_flags(synced_bed.mid(1)) == "F"
    assert synced_bed.tags(synced_bed.mid(1)) == {"unread", "flagged", "inbox"}
    assert synced_bed.tags(synced_bed.mid(2)) == {"unread", "inbox"}
    assert synced_bed.tags(synced_bed.mid(4)) == {"inbox"}
    assert synced_bed.tags(synced_bed.mid(3)) == {"unread", "flagged", "inbox"}  # untouched


def test_mail_client_rename_is_indexed_and_pushed(synced_bed: SyncBed) -> None:
    mid = synced_bed.mid(1)
    (before,) = synced_bed.files(mid)
    assert before.parent.name == "new" and before.name.endswith(":2,")

    # What neomutt does when a message is read: new/…:2, -> cur/…:2,S
    synced_bed.rename_flags(mid, "S")
    synced_bed.index()
    assert synced_bed.tags(mid) == {"inbox"}
    assert synced_bed.server_flags(mid) == frozenset()

    (run,) = synced_bed.mbsync("push")

    assert run.ok and run.direction == "push", run
    assert synced_bed.server_flags(mid) == {SEEN}


def test_writer_tag_changes_are_pushed(synced_bed: SyncBed) -> None:
    read, flag = synced_bed.mid(1), synced_bed.mid(2)
    with synced_bed.writer() as writer:
        writer.run(lambda txn: txn.change_tags([read], remove=["unread"]))
        writer.run(lambda txn: txn.change_tags([flag], add=["flagged"]))
    # The writer renamed the files to match (notmuch's maildir flag sync) ...
    assert synced_bed.maildir_flags(read) == "S"
    assert synced_bed.maildir_flags(flag) == "FS"

    (run,) = synced_bed.mbsync("push")

    # ... and mbsync carried the renames to the server.
    assert run.ok, run
    assert synced_bed.server_flags(read) == {SEEN}
    assert synced_bed.server_flags(flag) == {SEEN, FLAGGED}
    assert synced_bed.server_flags(synced_bed.mid(3)) == {FLAGGED}  # untouched


def test_local_and_server_changes_to_one_message_both_survive(synced_bed: SyncBed) -> None:
    """The rule: mbsync merges flag by flag against the state of the last sync, so a change
    made on each side since then is carried to the other.  A flag changed on both sides can
    only have changed the same way, so no flag change is ever lost."""
    mid, other = synced_bed.mid(1), synced_bed.mid(3)
    with synced_bed.writer() as writer:  # locally: read
        writer.run(lambda txn: txn.change_tags([mid, other], remove=["unread"]))
    synced_bed.store(mid, "+FLAGS", [FLAGGED])  # on the server: flagged
    synced_bed.store(other, "-FLAGS", [FLAGGED])  # on the server: unflagged (locally read)

    report = synced_bed.sync()

    assert_synced(report)
    assert synced_bed.server_flags(mid) == {SEEN, FLAGGED}
    assert synced_bed.tags(mid) == {"flagged", "inbox"}
    assert synced_bed.maildir_flags(mid) == "FS"
    assert synced_bed.server_flags(other) == {SEEN}
    assert synced_bed.tags(other) == {"inbox"}

    # Both sides also changing the same flag the same way is no conflict either.
    with synced_bed.writer() as writer:
        writer.run(lambda txn: txn.change_tags([mid], remove=["flagged"]))
    synced_bed.store(mid, "-FLAGS", [FLAGGED])
    assert_synced(synced_bed.sync())
    assert synced_bed.server_flags(mid) == {SEEN}
    assert synced_bed.tags(mid) == {"inbox"}


def test_outage_is_reported_and_local_state_kept(synced_bed: SyncBed) -> None:
    mid = synced_bed.mid(1)
    port = synced_bed.server.port
    synced_bed.server.stop()
    with synced_bed.writer() as writer:  # a change made while the server is down
        writer.run(lambda txn: txn.change_tags([mid], add=["flagged"], remove=["unread"]))
    # ... and a sent message neomutt saves into Sent meanwhile (its Fcc).
    fcc = synced_bed.account_dir / "Sent" / "cur" / "1700000000.local_1.host:2,S"
    fcc.write_bytes(client_written_message(7))

    report = synced_bed.sync()

    assert not report.ok and not report.mbsync_ok
    (run,) = report.runs
    assert not run.ok and not run.skipped and run.returncode not in (0, None)
    assert "Connection refused" in run.error and str(port) in run.error, run.error
    assert any("Connection refused" in line for line in report.errors())
    # Indexing ran anyway and nothing local was lost.
    assert report.index_error is None and report.index is not None
    assert synced_bed.tags(mid) == {"flagged", "inbox"}
    assert synced_bed.maildir_flags(mid) == "FS"
    assert synced_bed.tags(synced_bed.mid(7)) == {"sent"}
    assert len(synced_bed.search("*")) == 6

    synced_bed.server.start()
    assert synced_bed.server.port == port
    assert_synced(synced_bed.sync())
    assert synced_bed.server_flags(mid) == {SEEN, FLAGGED}
    assert synced_bed.server_flags(synced_bed.mid(7), folder="Sent") == {SEEN}
    assert synced_bed.tags(mid) == {"flagged", "inbox"}


def test_sync_command_pulls_and_reports_an_outage(synced_bed: SyncBed) -> None:
    synced_bed.seed(8)  # appended on the server after the first sync
    done = synced_bed.mail_env.fmail("sync", "--pull")
    assert "pull ok" in done.stdout and "indexed:" in done.stdout
    assert synced_bed.mid(8) in synced_bed.search("*")
    synced_bed.server.stop()
    failed = synced_bed.mail_env.fmail("sync", check=False)
    assert failed.returncode == 1 and "Connection refused" in failed.stderr
    # Said once, on stderr: not also among the runs listed on stdout.
    said = f"{ACCOUNT} (channel {ACCOUNT}): mbsync sync failed"
    assert failed.stderr.count(said) == 1 and said not in failed.stdout
    assert "indexed:" in failed.stdout  # the local index is still brought up to date
    unknown = synced_bed.mail_env.fmail("sync", "nosuchaccount", check=False)
    assert unknown.returncode == 2 and "unknown account" in unknown.stderr


# Stands in for an mbsync whose password command left a helper running in a session of its
# own (out of reach of the kill of mbsync's session), holding mbsync's stdout and stderr.
LEAVES_A_HOLDER = """#!/bin/sh
setsid sh -c 'echo $$ > "$0"; exec sleep 600' "{pid_file}" &
echo "Error: stuck before the kill" >&2
exec sleep 600
"""


def _leaving_a_holder(tmp_path: Path) -> tuple[Path, Path]:
    """The stand-in mbsync (LEAVES_A_HOLDER) and the file its holder writes its pid to."""
    pid_file = tmp_path / "holder.pid"
    script = tmp_path / "hangs"
    script.write_text(LEAVES_A_HOLDER.format(pid_file=pid_file))
    script.chmod(0o755)
    return script, pid_file


def _executing(script: Path, timeout: float
               ) -> tuple[threading.Thread, list[tuple[int | None, str]]]:
    """``mbsync.execute`` of the script on a thread of its own, started; its result lands in
    the list."""
    result: list[tuple[int | None, str]] = []
    worker = threading.Thread(
        target=lambda: result.append(mbsync.execute([str(script)], timeout)), daemon=True)
    worker.start()
    return worker, result


def _end_holder(pid_file: Path) -> None:
    if pid_file.is_file() and pid_file.read_text().strip():
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_run_killed_at_its_timeout_does_not_wait_for_a_child_holding_its_pipes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the timeout's kill, execute read the killed run's pipes until they closed:
    never, while a child that escaped the kill still held them."""
    monkeypatch.setattr(mbsync, "KILLED_OUTPUT_WAIT", 0.5, raising=False)
    script, pid_file = _leaving_a_holder(tmp_path)
    worker, result = _executing(script, 2)
    try:
        worker.join(60)  # without the bound: until the holder ends (600 s)
        assert result, "execute still reading the pipes the holder keeps open"
        code, error = result[0]
        assert code is not None and code < 0  # killed
        assert error.startswith("mbsync did not finish within 2s and was stopped")
    finally:
        _end_holder(pid_file)
        worker.join(30)


def test_a_run_stopped_at_shutdown_does_not_wait_for_a_child_holding_its_pipes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stop_running ended the run, but execute went on reading its pipes until they closed
    -- or the run's whole timeout was over -- while a child that escaped the kill still held
    them: the service's shutdown waited up to 600 s for it."""
    monkeypatch.setattr(mbsync, "KILLED_OUTPUT_WAIT", 0.5)
    monkeypatch.setattr(mbsync, "EXIT_CHECK", 0.1, raising=False)
    script, pid_file = _leaving_a_holder(tmp_path)
    worker, result = _executing(script, 600)
    try:
        while not (pid_file.is_file() and pid_file.read_text().strip()):
            worker.join(0.05)  # the holder is there before the run is stopped
        while not mbsync.stop_running(grace=5.0):
            worker.join(0.05)
        worker.join(60)  # without the bound: until the holder ends (600 s)
        assert result, "execute still reading the pipes the holder keeps open"
        code, error = result[0]
        assert code is not None and code < 0  # ended by the signal
        assert error == "mbsync was stopped: fmail-nm was shutting down"
    finally:
        _end_holder(pid_file)
        worker.join(30)


def test_no_run_starts_once_the_shutdown_has_ended_the_runs(sync_bed: SyncBed) -> None:
    """The shutdown's last stop_running ends the runs still going, and the process exits:
    a run started after it -- a push going on to its next account, an account being added
    by a tool call the shutdown left to finish, going on to its SMTP check or its pull --
    outlived the service, in a session of its own.  It is refused instead, saying why."""
    seed_standard(sync_bed)
    sync_bed.init()
    mbsync.stop_running(final=True)

    (run,) = mbsync.run_mbsync(sync_bed.config(), ACCOUNT, "pull")
    with pytest.raises(send.StoppedAtShutdown, match="shutting down"):
        send.run_to_end(["msmtp", "--version"], None, 30, stoppable=True)

    assert not run.ok and run.returncode is None and run.error == mbsync.STOPPED  # not started


def test_a_config_only_at_xdg_isyncrc_is_the_one_mbsync_is_given(synced_bed: SyncBed) -> None:
    """Without ``[mbsync] config``, fmail-nm found the user's channels in
    ``$XDG_CONFIG_HOME/isyncrc`` but ran mbsync without ``-c``: isync 1.4 reads only
    ``~/.mbsyncrc``, found none, and every sync failed."""
    toml = synced_bed.mail_env.fmail_config
    toml.write_text(toml.read_text().replace(
        f'[mbsync]\nconfig = "{synced_bed.mbsync_config}"\n', ""))
    assert "[mbsync]" not in toml.read_text()
    isyncrc = Path(synced_bed.env["XDG_CONFIG_HOME"]) / "isyncrc"
    isyncrc.parent.mkdir(parents=True, exist_ok=True)
    synced_bed.mbsync_config.rename(isyncrc)
    assert not (Path(synced_bed.env["HOME"]) / ".mbsyncrc").exists()
    synced_bed.seed(8)
    done = synced_bed.mail_env.fmail("sync", "--pull", check=False)
    assert done.returncode == 0, done.stderr
    assert "pull ok" in done.stdout
    assert synced_bed.mid(8) in synced_bed.search("*")


def test_the_default_mbsync_config_is_the_one_the_installed_mbsync_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With both ``~/.mbsyncrc`` and ``$XDG_CONFIG_HOME/isyncrc``, isync 1.5 reads the
    latter and 1.4 the former."""
    from fmail_nm import mbsyncrc

    home, xdg = tmp_path / "home", tmp_path / "xdg"
    xdg.mkdir(parents=True)
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    assert mbsyncrc.default_path() is None
    (xdg / "isyncrc").write_text("# isyncrc\n")
    assert mbsyncrc.default_path() == xdg / "isyncrc"  # whatever the version: the only one
    (home / ".mbsyncrc").write_text("# mbsyncrc\n")
    installed = mbsyncrc.installed_version()
    assert installed is not None
    assert mbsyncrc.default_path() == (xdg / "isyncrc" if installed >= (1, 5)
                                       else home / ".mbsyncrc")
    assert mbsyncrc.parse_version("isync 1.4.4\n") == (1, 4)
    assert mbsyncrc.reads_isyncrc_first(mbsyncrc.parse_version("isync 1.5.1\n"))
    assert not mbsyncrc.reads_isyncrc_first(mbsyncrc.parse_version("isync 1.4.4\n"))
    assert not mbsyncrc.reads_isyncrc_first(None)


def _pulls_new_mail_from_another_directory(bed: SyncBed, tmp_path: Path) -> None:
    """`fmail-nm sync --pull` run from a directory of its own brings a new message in."""
    bed.seed(8)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "fmail_nm", "sync", "--pull"],
                          env={**os.environ, **bed.env}, cwd=elsewhere, text=True,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "pull ok" in done.stdout
    assert bed.mid(8) in bed.search("*")


def test_a_relative_mbsync_config_is_found_from_another_directory(
        synced_bed: SyncBed, tmp_path: Path) -> None:
    """A relative ``[mbsync] config`` is fmail.toml's neighbour: `fmail-nm sync` run from
    another directory (a service's, a shell's) passed it to ``mbsync -c`` as written, and
    mbsync looked for it there."""
    toml = synced_bed.mail_env.fmail_config
    assert synced_bed.mbsync_config.parent == toml.parent
    toml.write_text(toml.read_text().replace(f'config = "{synced_bed.mbsync_config}"',
                                             f'config = "{synced_bed.mbsync_config.name}"'))
    _pulls_new_mail_from_another_directory(synced_bed, tmp_path)


def test_an_accounts_relative_mbsync_config_is_found_from_another_directory(
        synced_bed: SyncBed, tmp_path: Path) -> None:
    """The same for an account's own ``mbsync_config``: it was given to ``mbsync -c`` as
    written, and mbsync looked for it in the directory `fmail-nm sync` was run from."""
    toml = synced_bed.mail_env.fmail_config
    assert synced_bed.mbsync_config.parent == toml.parent
    toml.write_text(toml.read_text().replace(
        f'[mbsync]\nconfig = "{synced_bed.mbsync_config}"\n', "").replace(
        f'mbsync_channel = "{ACCOUNT}"\n',
        f'mbsync_channel = "{ACCOUNT}"\nmbsync_config = "{synced_bed.mbsync_config.name}"\n'))
    assert "[mbsync]" not in toml.read_text()
    _pulls_new_mail_from_another_directory(synced_bed, tmp_path)


def client_written_message(n: int) -> bytes:
    """A message from the user, with LF line ends as a local client writes it."""
    return message(n, subject="draft", sender=f"Alex Morgan <{ADDRESS}>").replace(b"\r\n", b"\n")


class _WaitSeen(logging.Handler):
    """Sets an event when the syncer logs that it is waiting for a channel's lock."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.waiting = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("waiting for the lock"):
            self.waiting.set()


HOLD_LOCK = """\
import fcntl, sys
with open(sys.argv[1], "a") as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.read()
"""


def test_one_mbsync_per_channel_at_a_time(synced_bed: SyncBed) -> None:
    config = synced_bed.config()
    lock = mbsync.lock_path(config, ACCOUNT)
    assert lock.parent == config.data_dir / "locks"

    handler = _WaitSeen()
    logger = logging.getLogger("fmail_nm.service.mbsync")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # Another process holds the channel: a caller that will not wait is told so, at once.
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        (busy,) = mbsync.run_mbsync(config, ACCOUNT, lock_timeout=0)
        assert busy.skipped and busy.busy and not busy.ok and busy.returncode is None
        assert "another mbsync is already running on channel 'acct'" in busy.error

        # A caller that waits starts mbsync only once the holder let go.
        results: list[mbsync.MbsyncRun] = []
        waiter = threading.Thread(target=lambda: results.extend(
            mbsync.run_mbsync(config, ACCOUNT, lock_timeout=60)))
        waiter.start()
        assert handler.waiting.wait(30), "the second run never waited for the lock"
        released_at = datetime.now(UTC)
        holder.stdin.close()  # type: ignore[union-attr]
        holder.wait(10)
        waiter.join(60)
        (waited,) = results
        assert waited.ok and waited.lock_wait > 0 and waited.started >= released_at, waited
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        if holder.poll() is None:
            holder.kill()
            holder.wait()

    # Two threads asking at once: both run, one after the other.
    runs: list[mbsync.MbsyncRun] = []
    threads = [threading.Thread(target=lambda: runs.extend(mbsync.run_mbsync(config, ACCOUNT)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    first, second = sorted(runs, key=lambda r: r.started)
    assert first.ok and second.ok
    assert first.finished <= second.started


def test_push_scheduler_coalesces_and_pushes_in_the_background(synced_bed: SyncBed) -> None:
    read, unflag, later = synced_bed.mid(1), synced_bed.mid(3), synced_bed.mid(2)
    pushed: list[list[mbsync.MbsyncRun]] = []
    with synced_bed.writer() as writer:
        # A quiet period longer than the test: requests pile up until flush().
        with PushScheduler(synced_bed.config(), quiet_period=300, timeout=60,
                                  after_push=pushed.append) as scheduler:
            writer.run(lambda txn: txn.change_tags([read], remove=["unread"]))
            scheduler.request({ACCOUNT})
            writer.run(lambda txn: txn.change_tags([unflag], remove=["flagged"]))
            scheduler.request([ACCOUNT])
            status = scheduler.status()
            assert status.pending == {ACCOUNT} and status.batches == 0 and not status.last
            assert synced_bed.server_flags(read) == frozenset()  # nothing pushed yet

            scheduler.flush()
            assert scheduler.wait_idle(60)
            status = scheduler.status()
            assert status.batches == 1 and len(pushed) == 1  # two requests, one push
            assert status.last[ACCOUNT].ok and status.last[ACCOUNT].direction == "push"
            assert synced_bed.server_flags(read) == {SEEN}
            assert synced_bed.server_flags(unflag) == frozenset()
            with pytest.raises(ConfigError, match="unknown account 'nope'"):
                scheduler.request({"nope"})

            # Requested, then closed before the quiet period is over: dropped, not pushed.
            writer.run(lambda txn: txn.change_tags([later], add=["flagged"]))
            scheduler.request({ACCOUNT})
        assert scheduler.status().closed and scheduler.status().batches == 1
        assert synced_bed.server_flags(later) == {SEEN}
        with pytest.raises(RuntimeError, match="closed"):
            scheduler.request({ACCOUNT})

        # A short quiet period runs out on its own.
        with PushScheduler(synced_bed.config(), quiet_period=0.1, timeout=60) as scheduler:
            scheduler.request({ACCOUNT})
            assert scheduler.wait_idle(60)
            assert scheduler.status().last[ACCOUNT].ok
    assert synced_bed.server_flags(later) == {SEEN, FLAGGED}


def test_what_cannot_sync_is_reported_and_indexing_still_runs(
    synced_bed: SyncBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced_bed.seed(6)  # on the server only: no pull below can bring it in

    # mbsync missing: a clear error from run_mbsync, a report from sync and the pusher.
    bin_dir = tmp_path / "bin-without-mbsync"
    bin_dir.mkdir()
    for tool in ("notmuch", "dirname"):  # what notmuch new and our post-new hook need
        (bin_dir / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    # Not monkeypatch.undo(): that would also undo the sync_bed's isolated HOME and XDG dirs.
    with monkeypatch.context() as patch:
        patch.setenv("PATH", str(bin_dir))
        with pytest.raises(mbsync.MbsyncNotInstalled, match="apt-get install isync"):
            mbsync.run_mbsync(synced_bed.config())
        fcc = synced_bed.account_dir / "Sent" / "cur" / "1700000000.local_2.host:2,S"
        fcc.write_bytes(client_written_message(8))
        report = synced_bed.sync()
        assert not report.ok and report.index_error is None
        (run,) = report.runs
        assert not run.ok and not run.skipped and "mbsync (isync) is not installed" in run.error
        assert synced_bed.tags(synced_bed.mid(8)) == {"sent"}  # local mail indexed all the same
        with PushScheduler(synced_bed.config(), quiet_period=0) as scheduler:
            scheduler.request({ACCOUNT})
            assert scheduler.wait_idle(30)
            assert "not installed" in scheduler.status().last[ACCOUNT].error
        # A push the closing flush runs that fails is named: its writes are still local.
        scheduler = PushScheduler(synced_bed.config(), quiet_period=300)
        scheduler.request({ACCOUNT})
        assert scheduler.close(flush=True, timeout=30) == {ACCOUNT}

    # An account without a channel is skipped, with the reason; that is not a sync failure.
    toml = synced_bed.mail_env.fmail_config
    toml.write_text(toml.read_text().replace(f'mbsync_channel = "{ACCOUNT}"\n', ""))
    config = synced_bed.reload()
    (run,) = mbsync.run_mbsync(config)
    assert run.skipped and not run.busy and run.channel is None and run.returncode is None
    assert "has no mbsync channel" in run.error
    report = cycle.sync(config)
    assert report.ok and report.index is not None
    assert synced_bed.find(synced_bed.mid(6)) is None
    with pytest.raises(ConfigError, match="unknown account"):
        cycle.sync(config, "nope")


def test_a_sync_stops_waiting_for_a_write_lock_held_elsewhere(indexed: MailEnv) -> None:
    """notmuch new waits silently for the write lock another program holds; a sync (behind
    add_email_account and `fmail-nm sync`) reports that instead of hanging with it."""
    config = indexed.config()
    with notmuch_lock_held():
        report = cycle.sync(config, index_timeout=2)
    assert report.index is None and not report.ok
    assert report.index_error is not None
    assert report.index_error.startswith("notmuch new did not finish within 2s and was stopped")


def test_a_push_that_breaks_is_logged_once(indexed: MailEnv,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """An unexpected error in a push was logged with its traceback, then the failed run it
    became was logged again."""
    config = indexed.config()
    (config.data_dir / "locks").parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(config.data_dir / "locks", ignore_errors=True)
    (config.data_dir / "locks").write_text("not a folder\n")  # no channel lock can be taken
    caplog.set_level(logging.INFO, logger="fmail_nm")
    with PushScheduler(config, quiet_period=0) as scheduler:
        scheduler.request(["personal"])
        assert scheduler.wait_idle(30)
        run = scheduler.status().last["personal"]
    assert not run.ok and run.returncode is None and not run.skipped
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "personal" in said[0].getMessage() and said[0].exc_info is not None


def test_a_pull_that_breaks_is_logged_once(indexed: MailEnv,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """An unexpected error in a scheduled pull was logged with its traceback, then the
    failed pull it became was warned about again."""
    from fmail_nm.service.background import Background

    toml = indexed.fmail_config
    toml.write_text(toml.read_text().replace('mbsync_channel = "personal"\n',
                                             'mbsync_channel = "personal"\n'
                                             "pull_interval_minutes = 60\n"))
    config = indexed.config()
    mbsync.lock_path(config, "personal").mkdir(parents=True)  # the channel lock cannot be opened
    caplog.set_level(logging.INFO, logger="fmail_nm")
    bg = Background(config, watch=False, schedule=True, push=False)
    bg.start()
    try:
        def failed() -> bool:
            acct = bg.status().account("personal")
            return acct is not None and acct.consecutive_failures >= 1
        wait_for(failed, "the first pull to fail")
    finally:
        bg.stop()
    said = [r for r in caplog.records
            if r.levelno >= logging.WARNING and "pull for personal" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].exc_info is not None and "IsADirectoryError" in said[0].getMessage()


def test_a_channel_lock_that_cannot_be_opened_does_not_stop_indexing(indexed: MailEnv) -> None:
    """A lock path that is no file (a directory left there) holds no run of ours: every
    index step of the service, and `fmail-nm index`, failed on it before indexing."""
    config = indexed.config()
    mbsync.lock_path(config, "personal").mkdir(parents=True)
    assert mbsync.busy_channels(config) == []
    done = indexed.fmail("index", "--quiet", check=False)
    assert done.returncode == 0 and "indexed:" in done.stdout, done.stderr
