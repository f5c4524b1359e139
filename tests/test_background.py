"""The background service end to end: a real watcher (inotify, and polling), real notmuch, real
mbsync against Dovecot.  Nothing is mocked but the inotify failure the polling test simulates.

Every wait polls with a generous timeout; no test asserts how long anything took.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fmail_nm.config import DEFAULT_SAFETY_INDEX_MINUTES, Config, ConfigError, load_settings
from fmail_nm.passes.changes import WriteContext
from fmail_nm.service import background, mbsync, watcher
from fmail_nm.service.background import AlreadyRunning, Background, backoff_delay
from fmail_nm.service.pushed import record_pushed
from fmail_nm.service.status import (
    AccountStatus,
    RunInfo,
    ServiceInfo,
    ServiceStatus,
    StatusStore,
    SyncStatus,
    render_text,
    server_statuses,
    servers_text,
    sync_status,
)
from fmail_nm.service.status import first_line as status_first_line
from fmail_nm.store import notmuch_cli, sidecar
from fmail_nm.store.notmuch import Reader, Writer
from fmail_nm.tools import reads, writes

from . import imapbed
from .conftest import MailEnv, notmuch_lock_held
from .imapbed import free_port
from .syncbed import (  # noqa: F401  (pytest fixtures, used by name)
    ACCOUNT,
    ADDRESS,
    IMAP_USER,
    LOCAL_FOLDERS,
    SEEN,
    SyncBed,
    runs_with,
    sync_bed,
    synced_bed,
)

WAIT = 60.0
# Quick debounce and polling so the tests do not idle; the logic is the same as in production.
FAST: dict[str, Any] = {"watch_quiet": 0.3, "watch_max_delay": 3.0, "poll_interval": 0.5,
                        "schedule": False, "push": False}
IN_INBOX = "school-trip-3@example.com"  # personal/INBOX/cur, read
UNREAD_IN_CUR = "html-only-1@coop.example.com"  # personal/INBOX/cur, unread


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def message(mid: str, subject: str) -> bytes:
    return (f"From: Someone <someone@example.net>\nTo: Alex Morgan <alex@example.org>\n"
            f"Subject: {subject}\nDate: Tue, 02 Jan 2024 10:00:00 +0000\n"
            f"Message-ID: <{mid}>\n\nHello.\n").encode()


def deliver(folder: Path, mid: str, subject: str = "watched delivery") -> Path:
    """Deliver like an MDA or mbsync: write in tmp/, then rename into new/."""
    name = f"{time.time_ns()}.{os.getpid()}_{mid.split('@')[0]}.testhost"
    tmp = folder / "tmp" / name
    tmp.write_bytes(message(mid, subject))
    return tmp.rename(folder / "new" / name)


def count(query: str) -> int:
    with Reader() as reader:
        return reader.count(query, exclude_tags=())


def known(mid: str) -> bool:
    with Reader() as reader:
        return reader.find(mid) is not None


@pytest.fixture
def service(indexed: MailEnv) -> Iterator[Callable[..., Background]]:
    """Start a Background on the indexed fixture copy (stopped at the end of the test)."""
    started: list[Background] = []

    def start(config: Config | None = None, **kwargs: Any) -> Background:
        bg = Background(config or indexed.config(), **{**FAST, **kwargs})
        bg.start()
        started.append(bg)
        assert bg.wait_idle(WAIT), "the startup index run did not finish"
        return bg

    yield start
    for bg in started:
        bg.stop()


# ---------------------------------------------------------------------------------------------
# Watching and indexing


def test_a_delivered_message_becomes_searchable_and_noise_triggers_nothing(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    bg = service()
    assert bg.watch_mode == "inotify"
    inbox = indexed.mail_root / "personal" / "INBOX"

    deliver(inbox, "watched-1@example.net", "watched arrival")

    wait_for(lambda: known("watched-1@example.net"), "the delivered message to be indexed")
    assert bg.wait_idle(WAIT)  # the run is over: post-new tagging done too
    with Reader() as reader:
        found = reads.search_emails(reads.Mailbox(indexed.config(), reader), "subject:watched")
    assert [r.id for r in found.results] == [sidecar.uid_for("watched-1@example.net")]
    assert "inbox" in found.results[0].tags and "new" not in found.results[0].tags
    before = bg.status()
    assert before.index.last_ok and before.indexed_at is not None
    assert before.notmuch_revision is not None

    # Noise: a delivery still in tmp/, mbsync's state files, a lock, a dotfile.
    (inbox / "tmp" / "12345.half-written").write_bytes(message("noise@example.net", "noise"))
    (inbox / ".mbsyncstate").write_text("noise\n")
    (inbox / ".mbsyncstate.lock").write_text("")
    (inbox / ".uidvalidity").write_text("1\n2\n")
    (inbox / "new" / ".hidden").write_text("noise\n")
    # ... then an event the watcher does pass on, on a file the index already has.  inotify
    # keeps order, so any noise that got through would be in this batch and force a run.
    with next((inbox / "cur").iterdir()).open("ab"):  # opened for writing, closed unchanged
        pass

    wait_for(lambda: bg.status().index.batches_skipped > before.index.batches_skipped,
             "the watcher to pass on the touched file")
    assert bg.wait_idle(WAIT)
    assert bg.status().index.runs == before.index.runs
    assert not known("noise@example.net")


def test_a_burst_of_500_deliveries_is_indexed_in_a_few_runs(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    bg = service()
    runs = bg.status().index.runs
    inbox = indexed.mail_root / "work" / "INBOX"

    for n in range(500):
        deliver(inbox, f"burst-{n}@example.net", "burstword")

    wait_for(lambda: count("subject:burstword") == 500, "all 500 messages to be indexed")
    assert bg.wait_idle(WAIT)
    status = bg.status()
    assert 1 <= status.index.runs - runs <= 3, status.index
    assert status.index.last_ok and status.queue_length == 0


def _write_in_two_parts(path: Path, data: bytes, meanwhile: Callable[[], None]) -> None:
    """Write straight into ``path`` as cp or rsync --inplace on a slow disk do: From: and part
    of To:, then ``meanwhile`` with the file open, then the rest."""
    with path.open("wb") as out:
        out.write(data[:40])
        out.flush()
        meanwhile()
        out.write(data[40:])


def _whole(env: MailEnv, mid: str, subject: str) -> bool:
    """The message is indexed under its own id, its subject searchable in the sidecar too."""
    with Reader() as reader:
        found = reads.search_emails(reads.Mailbox(env.config(), reader), f"subject:{subject}")
    return known(mid) and [r.id for r in found.results] == [sidecar.uid_for(mid)]


def test_a_file_written_slowly_into_new_is_indexed_whole(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    """A writer straight into new/ rather than tmp/ and a rename: notmuch new would give the
    first part a made-up id and never read that file name again."""
    bg = service()
    path = indexed.mail_root / "personal" / "INBOX" / "new" / f"{time.time_ns()}.slow.testhost"

    # The pause outlasts the watcher's quiet period and an index run.
    _write_in_two_parts(path, message("slow-1@example.net", "slowlywritten"),
                        lambda: time.sleep(3))

    wait_for(lambda: _whole(indexed, "slow-1@example.net", "slowlywritten"), "the whole message")
    assert bg.wait_idle(WAIT)
    with Reader() as reader:
        found = reader.find("slow-1@example.net")
        assert found is not None and found.filenames == (str(path),)  # no made-up id holds it


def test_no_index_run_reads_a_file_while_it_is_written_into_new(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    """An index run asked for by something else (a pull, a push, the safety index) waits for
    the writer too."""
    bg = service(watch_quiet=30.0, watch_max_delay=30.0)  # the watcher's batch comes too late
    runs = bg.status().index.runs
    path = indexed.mail_root / "work" / "INBOX" / "new" / f"{time.time_ns()}.slow.testhost"

    def another_run_is_asked_for() -> None:
        time.sleep(1)  # the watcher sees the write begin
        bg.request_index("test")
        time.sleep(3)  # time enough for a run
    _write_in_two_parts(path, message("slow-2@example.net", "slowlyindexed"),
                        another_run_is_asked_for)

    # That run waited for the writer's close: it indexed the whole file (the watcher's own
    # batch is still 30 s away).
    wait_for(lambda: bg.status().index.runs > runs, "the run asked for")
    assert _whole(indexed, "slow-2@example.net", "slowlyindexed")


def test_a_file_kept_open_holds_index_runs_back_only_so_long(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    """A writer that never closes its file does not stall indexing."""
    bg = service(watch_write_wait=1.0)
    runs = bg.status().index.runs
    path = indexed.mail_root / "work" / "INBOX" / "new" / f"{time.time_ns()}.open.testhost"
    with path.open("wb") as out:  # written, and kept open past the write wait
        out.write(message("kept-open-1@example.net", "keptopen"))
        out.flush()
        wait_for(bg.files_being_written, "the watcher to see the write")
        bg.request_index("test")
        wait_for(lambda: bg.status().index.runs > runs, "a run while the file is open")
        assert known("kept-open-1@example.net") and not bg.files_being_written()


def test_a_delivery_by_hard_link_is_indexed(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    """The Maildir way without a rename: link tmp/x to new/x, then unlink tmp/x -- no file is
    opened or closed in new/."""
    service()
    inbox = indexed.mail_root / "personal" / "INBOX"
    tmp = inbox / "tmp" / f"{time.time_ns()}.linked.testhost"
    tmp.write_bytes(message("linked-1@example.net", "linkeddelivery"))
    os.link(tmp, inbox / "new" / tmp.name)
    tmp.unlink()
    wait_for(lambda: known("linked-1@example.net"), "the linked delivery to be indexed")


def _stale_folder_mtime(folder: Path) -> float:
    """Leave ``folder`` as notmuch new finds it on kernels with fine-grained file times (see
    run_notmuch_new's full_scan): notmuch has recorded the second its mtime falls in, and
    mail lands in that same second.  Returns a moment of that second for the folder's
    mtime after each delivery."""
    second = int(time.time()) + 3600  # notmuch records it: its guard compares with time()
    os.utime(folder, (second, second))
    subprocess.run(["notmuch", "new", "--no-hooks"], check=True, capture_output=True)
    return second + 0.5


def test_mail_a_folder_scan_passes_over_is_indexed_by_a_full_scan(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    inbox = indexed.mail_root / "personal" / "INBOX"
    moment = _stale_folder_mtime(inbox / "new")
    deliver(inbox, "while-down@example.net")
    os.utime(inbox / "new", (moment, moment))
    subprocess.run(["notmuch", "new"], check=True, capture_output=True)
    assert not known("while-down@example.net")  # notmuch new alone passes over it
    service()  # the startup run scans every folder
    assert known("while-down@example.net")
    deliver(inbox, "watched@example.net")
    os.utime(inbox / "new", (moment, moment))
    wait_for(lambda: known("watched@example.net"),
             "the watched file notmuch new passed over to be indexed")


def test_index_full_scan_finds_mail_notmuch_new_passed_over(indexed: MailEnv) -> None:
    inbox = indexed.mail_root / "personal" / "INBOX"
    moment = _stale_folder_mtime(inbox / "new")
    deliver(inbox, "passed-over@example.net")
    os.utime(inbox / "new", (moment, moment))
    indexed.fmail("index", "--quiet")
    assert not known("passed-over@example.net")
    indexed.fmail("index", "--quiet", "--full-scan")
    assert known("passed-over@example.net")


def test_a_folder_created_after_start_is_watched(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    bg = service()
    folder = indexed.mail_root / "personal" / "NewFolder"
    for sub in ("cur", "new", "tmp"):
        (folder / sub).mkdir(parents=True)

    deliver(folder, "in-new-folder-1@example.net")  # possibly before the watch is in place
    wait_for(lambda: known("in-new-folder-1@example.net"), "the first message in the new folder")
    assert bg.wait_idle(WAIT)
    deliver(folder, "in-new-folder-2@example.net")  # certainly after: the folder is watched
    wait_for(lambda: known("in-new-folder-2@example.net"), "a later message in the new folder")
    assert count("folder:personal/NewFolder") == 2


def test_renames_and_removals_by_other_programs_are_indexed(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    service()
    with Reader() as reader:
        [unread] = reader.find(UNREAD_IN_CUR).filenames  # type: ignore[union-attr]
        [gone] = reader.find(IN_INBOX).filenames  # type: ignore[union-attr]
    assert unread.endswith(":2,")

    os.rename(unread, unread + "S")  # a mail client marks it read
    os.unlink(gone)  # and another deletes a message for good

    def tags() -> frozenset[str]:
        with Reader() as reader:
            found = reader.find(UNREAD_IN_CUR)
            return found.tags if found is not None else frozenset()
    wait_for(lambda: "unread" not in tags(), "the read flag to become a tag change")
    # (count, not find: notmuch keeps a removed message that has replies as a ghost)
    wait_for(lambda: count(f"id:{IN_INBOX}") == 0, "the removed message to leave the index")


def test_a_folder_moved_out_of_the_mail_tree_leaves_the_index(
        indexed: MailEnv, service: Callable[..., Background], tmp_path: Path) -> None:
    """`mv ~/Mail/personal/Lists ~/elsewhere` sends one event for the folder and none for
    its files: an index run must follow all the same."""
    lists = indexed.mail_root / "personal" / "Lists"
    for sub in ("cur", "new", "tmp"):
        (lists / sub).mkdir(parents=True)
    service()
    deliver(lists, "moved-away-1@example.net")
    wait_for(lambda: known("moved-away-1@example.net"), "the delivery to be indexed")
    lists.rename(tmp_path / "Lists")
    wait_for(lambda: count("id:moved-away-1@example.net") == 0,
             "the moved-away folder's mail to leave the index")


def test_a_folder_made_and_removed_in_tmp_asks_for_no_index_run(indexed: MailEnv) -> None:
    """mbsync or a mail client making and removing a scratch folder in a Maildir's tmp/:
    notmuch never indexes tmp/, so its removal is no folder leaving the index (which asks
    for a full index run)."""
    gone: list[str] = []
    w = watcher.MailWatcher(indexed.config(), lambda paths: None, on_folder_gone=gone.append)
    w.start()
    try:
        assert w.mode == "inotify"
        scratch = indexed.mail_root / "personal" / "INBOX" / "tmp" / "scratch"
        (scratch / "part").mkdir(parents=True)
        shutil.rmtree(scratch)
        # A folder that does count, removed after: once it is told, so was the one in tmp/.
        marker = indexed.mail_root / "personal" / "Marker"
        marker.mkdir()
        marker.rmdir()
        wait_for(lambda: str(marker) in gone, "the removed marker folder to be told")
        assert set(gone) == {str(marker)}
    finally:
        w.stop()


def test_events_lost_to_an_inotify_queue_overflow_are_made_up_by_an_index_run(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    bg = service()
    assert bg.watch_mode == "inotify"
    inbox = indexed.mail_root / "personal" / "INBOX"
    observer = bg._watcher._observer  # type: ignore[union-attr]
    assert isinstance(observer, watcher.InotifyObserver)
    queue_size = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    noise = inbox / "tmp" / "noise"

    # A real overflow: while watchdog's reader thread waits for its own lock, the kernel's
    # queue fills with events in tmp/ (create, close, delete: three each) and then overflows,
    # so the delivery after them is never reported.  Twice the queue: the reader may have
    # taken a buffer full of events before it stopped.
    with observer._inotify_fd._lock:
        for _ in range(queue_size // 3 * 2):
            noise.touch()
            noise.unlink()
        deliver(inbox, "after-overflow-1@example.net", "after the overflow")

    wait_for(lambda: known("after-overflow-1@example.net"),
             "an index run to find the delivery whose event the overflow lost")
    assert bg.wait_idle(WAIT)
    assert bg.status().index.last_ok


def test_a_safety_index_runs_on_the_configured_interval(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    config = indexed.config()
    settings = dataclasses.replace(config.settings, safety_index_minutes=0.02)  # 1.2 s
    # No watcher: only the interval can find this delivery.
    bg = service(config=dataclasses.replace(config, settings=settings), watch=False)
    runs = bg.status().index.runs

    deliver(indexed.mail_root / "work" / "INBOX", "unwatched-1@example.net")

    wait_for(lambda: known("unwatched-1@example.net"), "the safety index to find the delivery")
    wait_for(lambda: bg.status().index.runs >= runs + 2, "the safety index to run again")


def test_the_safety_index_is_off_with_an_interval_of_0(indexed: MailEnv) -> None:
    path = indexed.mail_root.parent / "safety.toml"
    path.write_text("addresses = []\n")
    assert load_settings(path).safety_index_minutes == DEFAULT_SAFETY_INDEX_MINUTES > 0
    path.write_text("[index]\nsafety_interval_minutes = 0\n")
    assert load_settings(path).safety_index_minutes == 0
    path.write_text("[index]\nsafety_interval_minutes = -1\n")
    with pytest.raises(ConfigError, match="safety_interval_minutes"):
        load_settings(path)


@pytest.mark.parametrize(("relative", "counts"), [
    ("acct/INBOX/new/1.2.host", True),
    ("acct/INBOX/cur/1.2.host,U=3:2,S", True),
    (".Sent/cur/1.2.host:2,S", True),  # Maildir++ folders start with a dot
    ("acct/INBOX/tmp/1.2.host", False),
    ("acct/INBOX/.mbsyncstate", False),
    ("acct/INBOX/cur/.hidden", False),
    ("acct/INBOX/new/x.lock", False),
    (".notmuch/xapian/cur/record.glass", False),
    ("acct/INBOX/1.2.host", False),
])
def test_which_paths_are_message_files(relative: str, counts: bool) -> None:
    assert watcher.is_message_path(f"/m/{relative}", "/m") is counts
    assert not watcher.is_message_path(f"/m/{relative}", "/m", ignore=["/m"])
    assert not watcher.is_message_path(f"/elsewhere/{relative}", "/m")


def test_the_services_own_moves_and_renames_cause_no_index_run(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    bg = service(watch_quiet=0.5)
    before = bg.status()
    config = indexed.config()

    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config=config, reader=reader, writer=writer,
                                  sidecar_file=sidecar.sidecar_path(config.data_dir))
        deleted = writes.delete_messages(ctx, [IN_INBOX])  # a move into personal/Trash
        read = writes.set_read(ctx, [UNREAD_IN_CUR], True)  # a flag rename (adds S)
    assert deleted.applied == [IN_INBOX] and read.applied == [UNREAD_IN_CUR]

    wait_for(lambda: bg.status().index.batches_skipped > before.index.batches_skipped,
             "the watcher to hand over the write tools' file events")
    assert bg.wait_idle(WAIT)
    after = bg.status()
    assert after.index.runs == before.index.runs, after.index
    # ... and nothing was left for notmuch new to find.
    assert indexed.notmuch("new", "--no-hooks").stdout.strip() == "No new mail."


def test_polling_fallback_when_inotify_hits_its_limit(
        indexed: MailEnv, service: Callable[..., Background], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    class NoWatches(watcher.NativeObserver):  # type: ignore[misc,valid-type]
        def start(self) -> None:
            raise OSError(errno.ENOSPC, "inotify watch limit reached")

    monkeypatch.setattr(watcher, "NativeObserver", NoWatches)
    caplog.set_level(logging.WARNING, logger="fmail_nm.service.watcher")
    bg = service()

    assert bg.watch_mode == "polling" and bg.status().service.watcher == "polling"
    assert "fs.inotify.max_user_watches" in caplog.text
    deliver(indexed.mail_root / "personal" / "INBOX", "polled-1@example.net")
    wait_for(lambda: known("polled-1@example.net"), "the polled delivery to be indexed")


def test_a_partly_watched_tree_falls_back_to_polling(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # watchdog skips sub-folders it cannot watch without an error; the watcher counts.
    monkeypatch.setattr(watcher, "count_dirs", lambda root: 10**6)
    caplog.set_level(logging.WARNING, logger="fmail_nm.service.watcher")
    w = watcher.MailWatcher(indexed.config(), lambda paths: None)
    w.start()
    try:
        assert w.mode == "polling"
        assert "could watch only" in caplog.text and "max_user_watches" in caplog.text
    finally:
        w.stop()


def test_polling_tries_inotify_again_and_switches_back_once_it_fits(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Tries that fail keep it polling without a warning each time; the first that watches
    the whole tree ends polling and asks for a full index run."""
    short = threading.Event()
    short.set()
    tries: list[str] = []
    real_count = watcher.count_dirs

    def count(root: str) -> int:  # the folders to watch, more than there are while short
        tries.append(root)
        return 10**6 if short.is_set() else real_count(root)

    monkeypatch.setattr(watcher, "count_dirs", count)
    monkeypatch.setattr(watcher, "INOTIFY_RETRY", 0.1)
    caplog.set_level(logging.INFO, logger="fmail_nm.service.watcher")
    full_runs: list[bool] = []
    w = watcher.MailWatcher(indexed.config(), lambda paths: None, poll_interval=0.1,
                            on_overflow=lambda: full_runs.append(True))
    w.start()
    try:
        wait_for(lambda: len(tries) >= 6, "inotify to be tried again")
        assert w.mode == "polling" and not full_runs
        assert caplog.text.count("could watch only") == 1, caplog.text

        short.clear()
        wait_for(lambda: w.mode == "inotify", "the watcher to be back on inotify")
        wait_for(lambda: full_runs, "a full index run after the switch")
        assert "stopped polling" in caplog.text
    finally:
        w.stop()


def test_a_held_notmuch_lock_is_an_index_error_not_a_hang(
        indexed: MailEnv, service: Callable[..., Background],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notmuch_cli, "NEW_STOP_GRACE", 1.0)
    bg = service(index_timeout=2.0)
    runs = bg.status().index.runs

    with notmuch_lock_held() as holder:
        bg.request_index("test")
        status = wait_for(lambda: (s := bg.status()).index.runs > runs and s, "the index run")
        assert status.index.last_ok is False
        assert "did not finish within 2s" in (status.index.last_error or "")
        assert count("*") > 0  # reads keep working meanwhile
        holder.release()

    bg.request_index("test again")
    wait_for(lambda: bg.status().index.runs > runs + 1, "the second index run")
    assert bg.wait_idle(WAIT)
    assert bg.status().index.last_ok and bg.status().index.last_error is None


def test_an_index_run_a_held_lock_made_fail_is_retried_on_its_own(
        indexed: MailEnv, service: Callable[..., Background], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A write lock held longer than an index run waits (a client's open write handle, a
    `notmuch tag` loop): the run fails, and the mail it was for is indexed once the lock is
    free -- with no later delivery and no safety index to set it off."""
    monkeypatch.setattr(notmuch_cli, "NEW_STOP_GRACE", 1.0)
    config = indexed.config()
    no_safety = dataclasses.replace(config, settings=dataclasses.replace(
        config.settings, safety_index_minutes=0))
    bg = service(config=no_safety, index_timeout=2.0, index_retry=0.5)
    caplog.set_level(logging.INFO, logger="fmail_nm.service.background")
    runs = bg.status().index.runs

    with notmuch_lock_held() as holder:
        deliver(indexed.mail_root / "personal" / "INBOX", "while-locked-1@example.net")
        # Two failed runs: whatever follows the first one comes and goes while it is held.
        wait_for(lambda: (s := bg.status()).index.runs > runs + 1 and s.index.last_ok is False,
                 "two index runs to fail on the lock")
        holder.release()

    wait_for(lambda: known("while-locked-1@example.net"), "a retry to index the delivery")
    assert bg.wait_idle(WAIT)
    assert bg.status().index.last_ok
    assert "trying again in" in caplog.text
    # A run that failed is not one whose folder scan passed files over: no second run at once.
    assert "scanning every folder" not in caplog.text


def _our_notmuch_new() -> int | None:
    """The pid of a `notmuch new` this process started and is running now."""
    for pid in os.listdir("/proc"):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == os.getpid() and b"notmuch" in args[0] and b"new" in args:
            return int(pid)
    return None


def _gone(pid: int) -> bool:
    try:  # a zombie is gone too: it indexes nothing more
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def _stopped_while_notmuch_new_waits(indexed: MailEnv, service: Callable[..., Background],
                                     message_id: str) -> Background:
    """A service stopped while its index run's notmuch new waits for a lock another program
    holds (released once that notmuch new is gone), a message for it delivered."""
    bg = service()
    with notmuch_lock_held() as holder:
        deliver(indexed.mail_root / "personal" / "INBOX", message_id)
        pid = wait_for(_our_notmuch_new, "the index run's notmuch new to start")
        bg.stop(timeout=2.0)
        wait_for(lambda: _gone(pid), "the waiting notmuch new to be stopped")
        holder.release()
    return bg


def test_stop_while_an_index_run_waits_for_the_lock_leaves_no_notmuch_new_behind(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    """SIGTERM while notmuch new waits for a lock another program holds: a notmuch new left
    running would index the mail once the lock is free, after the service is gone -- with
    its post-new pass left to the service, the sidecar out of step with notmuch."""
    bg = _stopped_while_notmuch_new_waits(indexed, service, "stopped-run-1@example.net")

    assert not known("stopped-run-1@example.net")
    check = indexed.fmail("sidecar", "check", check=False)
    assert check.returncode == 0 and "sidecar matches notmuch" in check.stdout, check.stdout
    indexed.fmail("index", "--quiet")  # the next run indexes it
    assert known("stopped-run-1@example.net")


def test_an_index_run_stopped_at_shutdown_shows_as_stopped_not_failed(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    """A notmuch new stopped at the shutdown deadline did not fail: the status after a
    normal stop says it was stopped and that the next start indexes the rest."""
    bg = _stopped_while_notmuch_new_waits(indexed, service, "stopped-run-2@example.net")

    shown = render_text(bg.status())
    assert "FAILED" not in shown and "exit" not in shown, shown
    assert "stopped at shutdown" in shown and "next start" in shown, shown
    assert bg.status().index.last_ok is not False


def test_a_notmuch_new_stopped_midway_keeps_what_it_indexed(indexed: MailEnv) -> None:
    """A run stopped at the service's shutdown deadline (or its timeout) that was indexing,
    not waiting: notmuch new commits what it has on SIGINT -- on SIGTERM it dies with all of
    it, and the next run starts over."""
    bulk = indexed.mail_root / "work" / "INBOX" / "new"
    for n in range(20000):
        (bulk / f"1796700000.{n}_1.host").write_bytes(
            message(f"bulk-{n}@example.net", "bulkword") + b"body words " * 100)
    progress = threading.Event()
    result: list[notmuch_cli.NewResult] = []

    def on_line(line: str) -> None:
        if re.search(r"Processed [1-9]\d{2,} ", line):  # some hundreds are in
            progress.set()
    indexing = threading.Thread(target=lambda: result.append(notmuch_cli.run_notmuch_new(
        hooks=False, timeout=WAIT * 10, as_tty=True, on_line=on_line)))
    indexing.start()
    assert progress.wait(WAIT * 5), "notmuch new showed no progress"
    assert notmuch_cli.stop_new_runs() == 1
    indexing.join(WAIT)

    assert result and result[0].returncode != 0  # stopped, not finished
    assert 0 < count("subject:bulkword") < 20000


def test_stop_during_a_burst_loses_nothing(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    bg = service()
    inbox = indexed.mail_root / "personal" / "INBOX"
    on_disk_before = sum(1 for sub in ("cur", "new") for _ in (inbox / sub).iterdir())
    halfway = threading.Event()

    def burst() -> None:
        for n in range(300):
            deliver(inbox, f"stop-{n}@example.net", "stopword")
            if n == 100:
                halfway.set()

    writer = threading.Thread(target=burst)
    writer.start()
    assert halfway.wait(WAIT)
    bg.stop(timeout=30)
    writer.join(WAIT)

    assert bg.status().service.running is False
    assert StatusStore(indexed.config().data_dir).load().service.running is False  # type: ignore[union-attr]
    on_disk = sum(1 for sub in ("cur", "new") for _ in (inbox / sub).iterdir())
    assert on_disk == on_disk_before + 300
    indexed.fmail("index")
    assert count("subject:stopword") == 300
    check = indexed.fmail("sidecar", "check", check=False)
    assert check.returncode == 0 and "sidecar matches notmuch" in check.stdout, check.stdout
    assert indexed.notmuch("new", "--no-hooks").stdout.strip() == "No new mail."


@pytest.mark.parametrize("writer", ["heartbeat", "index run"])
def test_an_index_thread_outliving_stop_leaves_the_status_stopped_with_nothing_queued(
        indexed: MailEnv, service: Callable[..., Background],
        monkeypatch: pytest.MonkeyPatch, writer: str) -> None:
    """The index thread read the queue (a delivery waiting for the debounce), then the stop
    marked the status stopped before the thread wrote what it read: a stopped status is
    final, not one of a stopped service with work queued."""
    if writer == "index run":  # no heartbeat reads the queue first
        monkeypatch.setattr(background, "HEARTBEAT", 3600.0)
    bg = service(watch_quiet=600.0, watch_max_delay=600.0)  # the delivery stays queued
    deliver(indexed.mail_root / "personal" / "INBOX", "queued-at-stop@example.net")
    wait_for(lambda: bg.queue_length() > 0, "the delivery to wait for the debounce")
    read, release = threading.Event(), threading.Event()
    seen: list[int] = []
    holder: list[threading.Thread] = []
    queue_length = bg.queue_length

    def held_after_reading() -> int:  # the index thread's read, held before it writes
        length = queue_length()
        if threading.current_thread().name == "fmail-index" and not read.is_set():
            seen.append(length)
            holder.append(threading.current_thread())
            read.set()
            release.wait(WAIT)
        return length
    monkeypatch.setattr(bg, "queue_length", held_after_reading)
    if writer == "index run":
        bg.request_index("test")
    try:
        assert read.wait(WAIT), f"the {writer} did not read the queue"
        bg.stop(timeout=1.0)  # the held thread outlives its join
    finally:
        release.set()
    holder[0].join(WAIT)

    assert not holder[0].is_alive() and seen[0] > 0
    on_disk = StatusStore(indexed.config().data_dir).load()
    assert on_disk is not None and on_disk.service.running is False
    assert on_disk.queue_length == 0, on_disk
    assert bg.status().queue_length == 0


def test_a_batch_stuck_in_its_handover_at_stop_is_not_queued_work_of_a_stopped_service(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher's thread hangs handing a batch to the index thread (a stat on a hung file
    system) past the stop: the batch still counts as the watcher's, but the service that
    stopped has nothing queued -- in its live status as in its file."""
    handing, release = threading.Event(), threading.Event()
    deliver_batch = watcher.MailWatcher._deliver

    def hung(self: watcher.MailWatcher, batch: list[str]) -> None:
        handing.set()
        release.wait(WAIT)
        deliver_batch(self, batch)
    monkeypatch.setattr(watcher.MailWatcher, "_deliver", hung)
    bg = Background(indexed.config(), **FAST)
    bg.start()
    try:
        deliver(indexed.mail_root / "personal" / "INBOX", "stuck-at-stop@example.net")
        assert handing.wait(WAIT), "the watcher handed no batch over"
        assert bg.queue_length() > 0
        bg.stop(timeout=1.0)  # the watcher's thread outlives its join

        assert bg.queue_length() > 0  # still in the watcher's hands
        assert bg.status().service.running is False
        assert bg.status().queue_length == 0
        on_disk = StatusStore(indexed.config().data_dir).load()
        assert on_disk is not None and on_disk.queue_length == 0, on_disk
    finally:
        release.set()
        bg.stop()


def test_one_service_per_data_dir(indexed: MailEnv, service: Callable[..., Background]) -> None:
    first = service()
    second = Background(indexed.config(), **FAST)
    with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}"):
        second.start()
    assert first.status().service.running


def test_the_service_follows_fmail_toml_edited_while_it_runs(
        indexed: MailEnv, service: Callable[..., Background],
        caplog: pytest.LogCaptureFixture) -> None:
    """The hook loads fmail.toml on every run, `fmail-nm index` too: the service, which runs
    the post-new pass itself, must not go on with the rules and accounts it started with."""
    bg = service()
    inbox = indexed.mail_root / "personal" / "INBOX"
    toml = indexed.fmail_config.read_text()
    assert bg.status().account("work") is not None
    # A half-written edit keeps the configuration in use, and says why.
    indexed.fmail_config.write_text(toml + "\n[[tagging.rules]]\nquery = \n")
    deliver(inbox, "mid-edit@example.net", "during the edit")
    wait_for(lambda: known("mid-edit@example.net"), "mail delivered during a broken edit")
    assert bg.wait_idle(WAIT) and bg.status().index.last_ok
    assert "does not load" in caplog.text

    without_work = toml.split('[[accounts]]\nname = "work"')[0]
    indexed.fmail_config.write_text(without_work + '\n[[tagging.rules]]\n'
                                    'query = "subject:reloaded"\nadd = ["followed-edit"]\n')
    deliver(inbox, "after-edit@example.net", "reloaded rules")
    wait_for(lambda: known("after-edit@example.net"), "the message delivered after the edit")
    assert bg.wait_idle(WAIT)
    with Reader() as reader:
        found = reader.find("after-edit@example.net")
        assert found is not None and "followed-edit" in found.tags, found
    assert [a.name for a in bg.status().accounts] == ["personal"]  # the status follows too


# ---------------------------------------------------------------------------------------------
# Scheduled pulls against Dovecot


def _with_pull_interval(bed: SyncBed, minutes: float) -> None:
    toml = re.sub(r"pull_interval_minutes = .*\n", "", bed.mail_env.fmail_config.read_text())
    marker = f'mbsync_channel = "{ACCOUNT}"\n'
    assert marker in toml
    bed.mail_env.fmail_config.write_text(
        toml.replace(marker, marker + f"pull_interval_minutes = {minutes}\n"))


@pytest.mark.imap
def test_scheduled_pulls_bring_mail_in_and_outages_show_in_the_status(
        sync_bed: SyncBed) -> None:  # noqa: F811
    bed = sync_bed
    bed.seed(1)
    bed.init()
    bg = Background(bed.reload(), **{**FAST, "schedule": True, "push": True})
    bg.start()
    try:
        # No schedule at start; one set in fmail.toml while the service runs is followed.
        assert bg.status().account(ACCOUNT).pull_interval_minutes == 0  # type: ignore[union-attr]
        _with_pull_interval(bed, 0.02)  # every 1.2 s
        wait_for(lambda: bed.find(bed.mid(1)), "the first pull to bring message 1")
        bed.seed(2)
        wait_for(lambda: bed.find(bed.mid(2)), "a later pull to bring message 2")

        bed.server.stop()

        def failed() -> Any:
            acct = bg.status().account(ACCOUNT)
            return acct is not None and acct.consecutive_failures >= 1 and acct
        acct = wait_for(failed, "a failed pull in the status")
        assert acct.last_pull is not None and not acct.last_pull.ok
        assert "Connection refused" in (acct.last_pull.error or "")
        assert acct.next_pull_at is not None
        assert bed.search("*") == sorted([bed.mid(1), bed.mid(2)])  # reads keep working
        assert "FAILED" in render_text(bg.status())
        bg.request_push([ACCOUNT])  # a write's push, during the outage

        def push_failed() -> Any:
            acct = bg.status().account(ACCOUNT)
            return acct is not None and acct.last_push is not None and not acct.last_push.ok
        wait_for(push_failed, "the failed push in the status")

        bed.server.start()
        bed.seed(3)
        wait_for(lambda: bed.find(bed.mid(3)), "the pull after the outage to bring message 3")

        def recovered() -> Any:
            acct = bg.status().account(ACCOUNT)
            return acct is not None and acct.consecutive_failures == 0 and acct
        acct = wait_for(recovered, "the status to show the pull succeeded again")
        assert acct.last_pull is not None and acct.last_pull.ok and acct.last_pull.error is None
        # The scheduled runs sync both ways: the failed push is past once one succeeds.
        acct = wait_for(lambda: (a := bg.status().account(ACCOUNT)) is not None
                        and a.last_push is not None and a.last_push.ok and a,
                        "a two-way run to stand as the last push")
        assert "FAILED" not in render_text(bg.status())

        # The schedule taken out again: no more pulls, and the status says so.
        _with_pull_interval(bed, 0)
        wait_for(lambda: (a := bg.status().account(ACCOUNT)) is not None
                 and a.pull_interval_minutes == 0 and a.next_pull_at is None,
                 "the status to show no scheduled pull")
        assert "no scheduled pull" in render_text(bg.status())
        # A pull the schedule started before it was taken out may not have started mbsync
        # yet: given more than the old interval to start, it is then waited for to end.
        time.sleep(1.5)
        wait_for(lambda: not _mbsync_runs_with(bed.mbsync_config), "a last pull to end")
        bed.seed(4)
        time.sleep(2.5)  # more than twice the old interval
        assert bed.find(bed.mid(4)) is None
    finally:
        bg.stop()


def _push_state(bg: Background) -> tuple[bool, bool | None]:
    """(writes waiting to be pushed, whether the last push went well: None before any)."""
    acct = bg.status().account(ACCOUNT)
    assert acct is not None
    return acct.push_pending, None if acct.last_push is None else acct.last_push.ok


@pytest.mark.imap
def test_writes_a_failed_push_left_go_out_once_the_server_is_back(
        synced_bed: SyncBed) -> None:  # noqa: F811
    """Without scheduled pulls (the default) only a write asks for a push: one that failed
    while the server was down, or that a stop came before, must still go out -- retried,
    and at the next start -- and the status must say it waits."""
    bed = synced_bed
    settings: dict[str, Any] = {**FAST, "push": True, "push_quiet": 0.1, "push_retry": 0.5}
    bg = Background(bed.reload(), **settings)
    bg.start()
    try:
        assert bg.wait_idle(WAIT)
        bed.server.stop()
        bed.rename_flags(bed.mid(1), "S")  # read here while the server is down
        bg.request_push([ACCOUNT])
        wait_for(lambda: _push_state(bg) == (True, False), "the failed push in the status")
        assert "waiting to be pushed" in render_text(bg.status())
        bed.server.start()
        wait_for(lambda: SEEN in bed.server_flags(bed.mid(1)), "the failed push retried")
        wait_for(lambda: _push_state(bg) == (False, True), "the status to show it pushed")

        bed.server.stop()
        bed.rename_flags(bed.mid(3), "FS")  # another write; the service stops before it goes
        bg.request_push([ACCOUNT])
    finally:
        bg.stop(timeout=10.0)
    assert _push_state(bg)[0], "a write not pushed must be kept for the next start"
    bed.server.start()
    again = Background(bed.reload(), **settings)
    again.start()
    try:
        wait_for(lambda: SEEN in bed.server_flags(bed.mid(3)), "the next start to push it")
        wait_for(lambda: _push_state(again) == (False, True), "the status to show it pushed")
    finally:
        again.stop()


def _mbsync_runs_with(config_path: Path) -> list[int]:
    return runs_with("mbsync", config_path)


@contextmanager
def _silent_server(bed: SyncBed) -> Iterator[list[socket.socket]]:
    """Point the bed's mbsync at a server that greets and then never answers, with mbsync's
    own timeout off; yields the connections it accepted.  Kills what mbsync it leaves."""
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def greet_and_fall_silent() -> None:
        while True:
            try:
                conn, _ = silent.accept()
            except OSError:
                return
            conn.sendall(b"* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] ready\r\n")
            accepted.append(conn)
    threading.Thread(target=greet_and_fall_silent, daemon=True).start()
    rc = bed.mbsync_config.read_text()
    assert f"Port {bed.server.port}\n" in rc and "Timeout 10\n" in rc
    bed.mbsync_config.write_text(rc.replace(f"Port {bed.server.port}\n",
                                            f"Port {silent.getsockname()[1]}\n")
                                 .replace("Timeout 10\n", "Timeout 0\n"))
    try:
        yield accepted
    finally:
        for pid in _mbsync_runs_with(bed.mbsync_config):  # orphans of a failed test
            os.kill(pid, signal.SIGKILL)
        silent.close()
        for conn in accepted:
            conn.close()


@pytest.mark.imap
def test_stop_ends_an_mbsync_run_hung_on_a_silent_server(
        sync_bed: SyncBed) -> None:  # noqa: F811
    """mbsync runs in a session of its own (so its password command goes with it when it is
    killed), where no signal to the service's process group reaches it: a run hung on a
    server that never answers, with mbsync's own timeout off, must still end with the
    service, and say why it ended."""
    bed = sync_bed
    _with_pull_interval(bed, 60)  # the first pull runs at start
    bed.init()
    with _silent_server(bed) as accepted:
        bg = Background(bed.reload(), **{**FAST, "schedule": True})
        bg.start()
        try:
            wait_for(lambda: accepted and _mbsync_runs_with(bed.mbsync_config),
                     "mbsync to connect to the silent server")
        finally:
            bg.stop(timeout=1.0)
        assert _mbsync_runs_with(bed.mbsync_config) == []
        acct = bg.status().account(ACCOUNT)
        assert acct is not None and acct.last_pull is not None and not acct.last_pull.ok
        assert "fmail-nm was shutting down" in (acct.last_pull.error or "")


def _ends_by(cmd: subprocess.Popen[str], err: str, sig: signal.Signals) -> None:
    """The command ended by the signal that stopped it (128 + it in a shell; a clean stop to
    systemd on SIGTERM), saying so in one line -- no traceback for a Ctrl-C."""
    assert cmd.returncode == -sig, err
    name = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    assert err.strip().splitlines()[-1].startswith(f"fmail-nm: stopped ({name})"), err
    assert "Traceback" not in err, err


@pytest.mark.imap
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_in_sync_ends_its_mbsync(
        sync_bed: SyncBed, sig: signal.Signals) -> None:  # noqa: F811
    """mbsync runs in a session of its own, where neither Ctrl-C nor a SIGTERM to the command
    (systemd's stop, `timeout`) reaches it: the command must end it as it stops, its
    password command with it.  A SIGTERM ends the command by that signal (143 in a shell,
    a clean stop to systemd), saying so."""
    bed = sync_bed
    bed.init()
    with _silent_server(bed) as accepted:
        sync = subprocess.Popen([sys.executable, "-m", "fmail_nm", "sync"],
                                env={**os.environ, **bed.env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: accepted and _mbsync_runs_with(bed.mbsync_config),
                     "fmail-nm sync's mbsync to connect to the silent server")
            sync.send_signal(sig)
            _, err = sync.communicate(timeout=30)
        finally:
            sync.kill()
            sync.wait()
        assert sync.returncode != 0
        wait_for(lambda: not _mbsync_runs_with(bed.mbsync_config), "mbsync to end")
        _ends_by(sync, err, sig)


# ---------------------------------------------------------------------------------------------
# Status file and text


def _status(pid: int, running: bool) -> ServiceStatus:
    now = datetime.now(UTC)
    return ServiceStatus(service=ServiceInfo(pid=pid, started_at=now - timedelta(minutes=5),
                                             running=running))


def test_an_error_whose_first_line_introduces_it_keeps_its_reason() -> None:
    assert status_first_line("notmuch new failed (exit 1):\n\nInternal error: adding "
                             "file-direntry term\nmore") == (
        "notmuch new failed (exit 1): Internal error: adding file-direntry term")
    assert status_first_line("Connection refused\nretrying") == "Connection refused"
    assert status_first_line("") == "unknown error"


def test_status_file_is_atomic_and_tolerant(tmp_path: Path) -> None:
    store = StatusStore(tmp_path)
    assert store.load() is None
    assert sync_status(tmp_path) == SyncStatus(running=False, status=None)
    store.write(_status(os.getpid(), True))
    assert sync_status(tmp_path).running
    store.update(lambda s: setattr(s, "queue_length", 7))
    assert store.load() == store.current() and store.load().queue_length == 7  # type: ignore[union-attr]
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temp file left
    (tmp_path / "status.json").write_text('{"service": {"pid": ')
    assert store.load() is None


def test_status_text_says_whether_the_service_runs() -> None:
    assert "not running" in render_text(None)
    alive = render_text(_status(os.getpid(), True))
    assert alive.startswith(f"fmail-nm service: running (pid {os.getpid()}")
    dead_pid = 2**22 + 12345  # above pid_max defaults: no such process
    assert "NOT running" in render_text(_status(dead_pid, True))
    assert "stopped" in render_text(_status(os.getpid(), False))


def _server_file(data_dir: Path, pid: int, *, running: bool, waiting: bool) -> Path:
    """The file an MCP server without --watch left: its account's writes waiting or not."""
    status = _status(pid, running)
    status.service.stopped_at = None if running else datetime.now(UTC) - timedelta(minutes=1)
    status.accounts = [AccountStatus(
        name="personal", channel="personal", pull_interval_minutes=0, push_pending=waiting,
        last_write_at=datetime.now(UTC) - timedelta(minutes=2) if waiting else None)]
    path = data_dir / "servers" / f"{pid}-{os.urandom(4).hex()}.json"
    StatusStore(data_dir, path).write(status)
    return path


@contextmanager
def _held(path: Path) -> Iterator[None]:
    """The lock of a server's file held, as its server does while it runs."""
    import fcntl
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield


def test_status_shows_what_stopped_servers_left_unpushed_until_a_later_push(
        tmp_path: Path) -> None:
    """A server without --watch that died, or stopped while its push failed, leaves its file:
    `fmail-nm status` names the writes waiting until a later push went through, whoever
    pushed (`fmail-nm sync`, a server since closed: the pushes they record); a file with
    nothing waiting is stale and removed -- once its server is gone for sure."""
    dead = 2**22 + 12345  # above pid_max defaults: no such process
    crashed = _server_file(tmp_path, dead, running=True, waiting=True)
    stopped = _server_file(tmp_path, os.getpid(), running=False, waiting=True)
    idle = _server_file(tmp_path, dead + 1, running=True, waiting=False)
    shown = server_statuses(tmp_path)
    assert {s.service.pid for s in shown} == {dead, os.getpid()}
    assert not idle.exists()
    text = servers_text(shown)
    assert f"NOT running -- pid {dead} is gone without a clean stop" in text
    assert f"NOT running -- pid {os.getpid()} stopped " in text
    assert text.count("account personal (channel personal): writes waiting to be pushed\n") == 2

    record_pushed(tmp_path, {"personal": datetime.now(UTC) + timedelta(seconds=1)})
    assert server_statuses(tmp_path) == []  # that push sent them
    assert not crashed.exists() and not stopped.exists()


def test_status_keeps_the_file_of_a_server_whose_pid_it_cannot_see(tmp_path: Path) -> None:
    """Its pid means nothing where `fmail-nm status` runs (another pid namespace; another
    server got it since): the server runs while it holds its file's lock, and two servers
    of one pid keep a file each."""
    unseen = 2**22 + 12345  # no such process here
    idle = _server_file(tmp_path, unseen, running=True, waiting=False)
    same_pid = _server_file(tmp_path, unseen, running=False, waiting=True)
    with _held(idle):
        shown = server_statuses(tmp_path)
        assert sorted(s.service.running for s in shown) == [False, True]
        assert idle.exists() and same_pid.exists()
        assert f"MCP server without --watch: running (pid {unseen}, " in servers_text(shown)
    assert [s.service.running for s in server_statuses(tmp_path)] == [False]  # idle one gone
    assert not idle.exists() and not idle.with_suffix(".lock").exists()


# A server without --watch asked to push two writes to one account, a push elsewhere (e.g.
# `fmail-nm sync`) starting between them, killed before its own push.
_KILLED_SERVER = """
import os, signal, threading
from fmail_nm.app import load_config
from fmail_nm.clock import utc_now
from fmail_nm.service.push import PushScheduler
from fmail_nm.service.pushed import record_pushed
from fmail_nm.service.status import ServerPushRecord
pusher = PushScheduler(load_config(), quiet_period=600.0, retry=None)
record = ServerPushRecord(pusher)
told = threading.Event()
def recorded(status):
    record.record(status)
    told.set()
pusher.on_change = recorded
pusher.request(["personal"])
assert told.wait(60)
told.clear()
record_pushed(pusher.config.data_dir, {"personal": utc_now()})
pusher.request(["personal"])
told.wait(10)  # the record of the second write, if any comes
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_status_names_a_write_a_killed_server_made_after_a_push_elsewhere(
        indexed: MailEnv) -> None:
    """A push elsewhere that started between two writes of a server sent the first only:
    once the server is killed, `fmail-nm status` still names the second."""
    done = subprocess.run([sys.executable, "-c", _KILLED_SERVER], capture_output=True,
                          text=True, env={**os.environ, **indexed.env}, timeout=120,
                          check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    shown = server_statuses(indexed.config().data_dir)
    assert [(s.service.running, [a.name for a in s.accounts if a.push_pending])
            for s in shown] == [(False, ["personal"])]


def test_backoff_doubles_within_bounds() -> None:
    assert backoff_delay(180, 0) == 180
    assert backoff_delay(180, 1) == 360
    assert backoff_delay(180, 10) == 1800
    assert backoff_delay(3600, 5) == 3600  # never less than the interval


# ---------------------------------------------------------------------------------------------
# Ctrl-C and SIGTERM while a command's notmuch new indexes


def _notmuch_new_of(pid: int) -> int | None:
    """The pid of the `notmuch new` process ``pid`` started, once it has done some work (a
    few tenths of a second of CPU: past its start, indexing)."""
    for child in os.listdir("/proc"):
        try:
            args = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            fields = Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if int(fields[1]) == pid and b"notmuch" in args[0] and b"new" in args and cpu > 0.3:
            return int(child)
    return None


@pytest.mark.parametrize("command", ["index", "sync"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_the_commands_notmuch_new(
        indexed: MailEnv, command: str, sig: signal.Signals) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM (systemd, `timeout`: to the
    command alone) while the command's notmuch new indexes: the command stops it politely,
    so it keeps what it indexed, and is gone no later than it -- a notmuch new left behind
    indexes on, and runs its post-new hook, after the command has said it stopped."""
    bulk = indexed.mail_root / "work" / "INBOX" / "new"
    total = 8000
    for n in range(total):
        (bulk / f"1796700000.{n}_1.host").write_bytes(
            message(f"bulk-{n}@example.net", "bulkword") + b"body words " * 100)
    cmd = subprocess.Popen([sys.executable, "-m", "fmail_nm", command],
                           env={**os.environ, **indexed.env}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, process_group=0)
    try:
        new = wait_for(lambda: _notmuch_new_of(cmd.pid), "the command's notmuch new to index")
        if sig == signal.SIGINT:
            os.killpg(cmd.pid, sig)  # the terminal's Ctrl-C: the foreground process group
        else:
            cmd.send_signal(sig)
        _, err = cmd.communicate(timeout=WAIT)
        left_running = not _gone(new)
    finally:
        cmd.kill()
        cmd.wait()
    assert not left_running, f"notmuch new ran on after `fmail-nm {command}` exited: {err}"
    assert cmd.returncode != 0
    _ends_by(cmd, err, sig)
    assert 0 < count("subject:bulkword") < total  # what it indexed is kept
    indexed.fmail("index", "--quiet")  # the next run does the rest
    assert count("subject:bulkword") == total
    check = indexed.fmail("sidecar", "check", check=False)
    assert check.returncode == 0 and "sidecar matches notmuch" in check.stdout, check.stdout



@contextmanager
def _typed_at_a_terminal(mail_env: MailEnv, *args: str) -> Iterator[
        tuple[subprocess.Popen[bytes], list[bytes], int]]:
    """`fmail-nm ARGS` in the foreground of a terminal of its own, as a shell starts it; what
    it writes there collected on a thread; the terminal's other end, to type into."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()
    cmd = subprocess.Popen(
        [sys.executable, "-m", "fmail_nm", *args], env={**os.environ, **mail_env.env},
        stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    out: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the last process that had the terminal open is gone
                return
            if not chunk:
                return
            out.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield cmd, out, master
    finally:
        cmd.kill()
        cmd.wait()
        reader.join(WAIT)
        os.close(master)


def test_the_users_hooks_keep_the_terminal_fmail_nm_index_runs_in(indexed: MailEnv) -> None:
    """`fmail-nm index` at a terminal: the user's pre-new hook (an `mbsync -a` that asks for
    a password, an ssh) can open the terminal, as under a plain `notmuch new` -- which it
    cannot from a session of its own, that has none."""
    with Reader() as reader:
        hook = Path(reader.setting("database.hook_dir")) / "pre-new"
    said = indexed.mail_root.parent / "hook-said"
    hook.write_text(f"#!/bin/sh\nif (: </dev/tty) 2>/dev/null; then echo terminal > '{said}'\n"
                    f"else echo none > '{said}'; fi\n")
    hook.chmod(0o755)
    with _typed_at_a_terminal(indexed, "index") as (cmd, out, _):
        returncode = cmd.wait(WAIT)
    assert returncode == 0, b"".join(out)
    assert said.read_text().strip() == "terminal", b"".join(out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_the_notmuch_new_of_fmail_nm_index_at_a_terminal(
        indexed: MailEnv, sig: signal.Signals) -> None:
    """Typed at a shell, `fmail-nm index` shares its process group with its notmuch new (see
    the test above); Ctrl-C typed there, or a SIGTERM to the command alone (a `kill` from
    elsewhere), still stops its notmuch new politely, keeping what it indexed, before the
    command ends."""
    bulk = indexed.mail_root / "work" / "INBOX" / "new"
    total = 8000
    for n in range(total):
        (bulk / f"1796700000.{n}_1.host").write_bytes(
            message(f"bulk-{n}@example.net", "bulkword") + b"body words " * 100)
    with _typed_at_a_terminal(indexed, "index") as (cmd, out, terminal):
        new = wait_for(lambda: _notmuch_new_of(cmd.pid), "the command's notmuch new to index")
        if sig == signal.SIGINT:
            os.write(terminal, b"\x03")
        else:
            cmd.send_signal(sig)
        returncode = cmd.wait(WAIT)
        left_running = not _gone(new)
    said = b"".join(out).decode(errors="replace")
    assert not left_running, f"notmuch new ran on after `fmail-nm index` exited: {said}"
    assert returncode == -sig, said
    assert 0 < count("subject:bulkword") < total, said  # what it indexed is kept


@pytest.mark.imap
def test_sigterm_while_the_service_starts_ends_its_first_pull(
        sync_bed: SyncBed) -> None:  # noqa: F811
    """`fmail-nm run` starts the background (its first pull) before it builds the MCP server:
    a SIGTERM meanwhile (systemd stopping a service that is starting) must end that pull as
    the shutdown of a running service does -- it runs in a session of its own, and hung on a
    server that never answers it outlived the service for good."""
    bed = sync_bed
    _with_pull_interval(bed, 60)  # the first pull runs at start
    bed.init()
    with _silent_server(bed) as accepted:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fmail_nm", "run", "--port", str(free_port())],
            env={**os.environ, **bed.env, "FMAIL_TOKEN": "run-test-token"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(lambda: accepted and _mbsync_runs_with(bed.mbsync_config),
                     "the first pull's mbsync to connect to the silent server")
            proc.send_signal(signal.SIGTERM)
            out = proc.communicate(timeout=120)[0]
        finally:
            proc.kill()
            proc.wait()
        assert _mbsync_runs_with(bed.mbsync_config) == [], out


# A password command that leaves a helper running in a session of its own (out of reach of
# the stop of mbsync's session), holding mbsync's stderr -- the pipe its puller reads -- and
# then never answers: the puller outlives its mbsync as long as the helper runs.
LEAVES_A_HOLDER_AND_HANGS = """#!/bin/sh
setsid sh -c 'echo $$ > "$0"; exec sleep 600' "$1" &
exec sleep 600
"""


@pytest.mark.imap
def test_the_account_pullers_share_one_grace_to_record_their_stopped_runs(
        sync_bed: SyncBed, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Once the shutdown has stopped the pulls still going, each puller is given time to
    record its stopped run -- one grace for them all: one each made the shutdown's bound grow
    with the accounts, past the unit's TimeoutStopSec.  Here every puller outlives its mbsync
    (a password command's helper holds its pipe); as the first puller's wait runs out the
    others are let go, and they are not waited for: their grace was the same, and is over."""
    bed = sync_bed
    bed.init()
    accounts = [ACCOUNT, "acct2", "acct3"]
    script = bed.base / "passcmd"
    script.write_text(LEAVES_A_HOLDER_AND_HANGS)
    script.chmod(0o755)
    holders = {name: bed.base / f"{name}.holder" for name in accounts}
    rc, toml = [], bed.mail_env.fmail_config.read_text()
    block = toml[toml.index("[[accounts]]"):]
    for name in accounts:
        rc.append(imapbed.mbsync_section(bed.server, IMAP_USER, bed.mail_root, account=name)
                  .replace('Pass "secret"', f'PassCmd "{script} {holders[name]}"'))
        for folder in LOCAL_FOLDERS:
            for sub in ("cur", "new", "tmp"):
                (bed.mail_root / name / folder / sub).mkdir(parents=True, exist_ok=True)
        if name != ACCOUNT:
            toml += "\n" + block.replace(f'"{ACCOUNT}"', f'"{name}"').replace(
                ADDRESS, f"{name}@example.org")
    assert all('PassCmd "' in section for section in rc)
    bed.mbsync_config.write_text("".join(rc))
    # the first pull runs at start
    bed.mail_env.fmail_config.write_text(re.sub(r'(mbsync_channel = "\w+"\n)',
                                                r"\1pull_interval_minutes = 60\n", toml))
    monkeypatch.setattr(mbsync, "KILLED_OUTPUT_WAIT", 600.0)  # held until the helper ends

    def release(name: str) -> None:
        with suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(holders[name].read_text()), signal.SIGKILL)

    class LetGo(logging.Handler):
        """At the first puller's wait running out, the other pullers' helpers end."""
        def __init__(self) -> None:
            super().__init__()
            self.recording = False  # the pulls have been stopped: the pullers record them
            self.left: list[str] = []  # the pullers the wait gave up on

        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if text.startswith("shutdown: stopped"):
                self.recording = True
            elif self.recording and (gone := re.match(
                    r"pull for (\S+) still running at the shutdown deadline", text)):
                if not self.left:
                    for name in accounts:
                        if name != gone[1]:
                            release(name)
                self.left.append(gone[1])

    let_go = LetGo()
    logger = logging.getLogger("fmail_nm.service.background")
    bg = Background(bed.reload(), **{**FAST, "schedule": True})
    bg.start()
    try:
        wait_for(lambda: all(p.is_file() and p.read_text().strip() for p in holders.values()),
                 "every account's mbsync to wait for its password command")
        logger.addHandler(let_go)
        bg.stop(timeout=1.0)
    finally:
        logger.removeHandler(let_go)
        for name in accounts:
            release(name)
    assert let_go.recording
    assert sorted(let_go.left) == sorted(accounts), let_go.left
