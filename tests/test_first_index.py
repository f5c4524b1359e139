"""The first index of an empty database, done by fmail-nm itself (passes.first_index): the same
messages, threads and tags as ``notmuch new`` followed by the post-new pass, each batch all or
nothing, and notmuch new's own rules for what it indexes."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import notmuch2
import pytest

from fmail_nm.adopt.hooks import kept_hook
from fmail_nm.config import Config
from fmail_nm.passes import first_index, indexing
from fmail_nm.service.index import hook_in_the_way, run_index
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader, Writer, WriteTxn, maildir_flags, with_flag_tags

from .conftest import USER_ADDRESSES, MailEnv, make_mail_env
from .test_background import _gone
from .test_index_tags import EXPECTED, LISTED, dump


def init_without_index(env: MailEnv) -> None:
    args = ["init", "--no-index", "--mail-root", str(env.mail_root), "--name", "Alex Morgan"]
    for address in USER_ADDRESSES:
        args += ["--address", address]
    env.fmail(*args)


def threads(env: MailEnv) -> set[tuple[str, ...]]:
    """Each thread as the sorted Message-IDs in it (thread ids differ between two indexes)."""
    groups = []
    for thread in env.notmuch("search", "--output=threads", "--exclude=false", "*").stdout.split():
        ids = env.notmuch("search", "--output=messages", "--exclude=false", thread).stdout.split()
        groups.append(tuple(sorted(ids)))
    return set(groups)


def set_up_elsewhere(base: Path, add: Callable[[MailEnv], None]) -> MailEnv:
    """The same tree in another place, set up but not indexed."""
    other = make_mail_env(base)
    add(other)
    init_without_index(other)
    return other


# Files beside the fixtures for the cases a first index must get right (added to both trees).
def mail(mid: str, extra: bytes = b"") -> bytes:
    return (b"From: Nia <nia@example.com>\nTo: alex@example.org\nSubject: s " + mid.encode()
            + b"\nMessage-ID: <" + mid.encode() + b">\nDate: Tue, 01 Dec 2026 10:00:00 +0000\n"
            + extra + b"\nhello\n")


def add_cases(env: MailEnv) -> None:
    inbox, archive = env.mail_root / "personal" / "INBOX", env.mail_root / "personal" / "Archive"
    (inbox / "cur" / "1.a:2,S").write_bytes(mail("seen@x"))
    (inbox / "cur" / "2.a:2,FRS").write_bytes(mail("flagged-replied@x"))
    (inbox / "cur" / "3.a").write_bytes(mail("no-info-in-cur@x"))  # no flags said: no change
    (inbox / "new" / "4.a").write_bytes(mail("delivered@x"))
    # one message, two copies whose flags differ: unread only if neither copy is Seen -- or,
    # with flag sync off, if the copy read first is not.  notmuch reads a folder's entries by
    # inode number, which the file system chose for INBOX and Archive; so that both trees of a
    # test agree, the copy without flags goes in the folder read first.
    first, second = sorted((inbox, archive), key=lambda folder: folder.stat().st_ino)
    (first / "cur" / "5.a:2,").write_bytes(mail("two-copies@x"))
    (second / "cur" / "5.b:2,SF").write_bytes(mail("two-copies@x"))
    # a later reply threads with its parent, whichever file is read first
    (inbox / "cur" / "0.a:2,S").write_bytes(mail("reply@x", b"In-Reply-To: <seen@x>\n"))
    (inbox / "cur" / ".hidden:2,").write_bytes(mail("dot-file@x"))  # notmuch reads these too
    (inbox / "cur" / "6.a:2,").write_bytes(b"\x00\x01 not mail at all")
    (inbox / "cur" / "7.a:2,").write_bytes(LISTED)


@pytest.mark.parametrize("sync_flags", ["true", "false"])
def test_the_first_index_equals_notmuch_new_and_the_pass(mail_env: MailEnv, tmp_path: Path,
                                                         sync_flags: str) -> None:
    add_cases(mail_env)
    init_without_index(mail_env)
    mail_env.notmuch("config", "set", "maildir.synchronize_flags", sync_flags)
    summary = run_index(mail_env.config(), show_progress=False)
    assert summary.first_index
    assert summary.added == 169 + 8

    # The other way: notmuch new, our hook running the post-new pass.
    other = set_up_elsewhere(tmp_path / "other", add_cases)
    other.notmuch("config", "set", "maildir.synchronize_flags", sync_flags)
    other.notmuch("new")

    assert dump(mail_env) == dump(other)
    assert threads(mail_env) == threads(other)
    assert mail_env.notmuch("count", "id:dot-file@x").stdout.strip() == "1"
    tags = set(mail_env.notmuch("search", "--output=tags", "id:two-copies@x").stdout.split())
    assert ("unread" in tags) == ("flagged" not in tags) == (sync_flags == "false")
    # the drafts are drafts, never sent mail, whether or not the D flag gives the tag
    for query in ("folder:personal/Drafts and tag:draft", "folder:personal/Drafts"):
        assert mail_env.notmuch("count", "--exclude=false", query).stdout.strip() == "2"
    assert mail_env.notmuch("count", "--exclude=false", "tag:draft and tag:sent").stdout == "0\n"
    # the files are what notmuch knows: nothing left for notmuch new, nothing missing
    assert "No new mail" in mail_env.notmuch("new").stdout
    check = mail_env.fmail("sidecar", "check", check=False)
    assert check.returncode == 0, check.stdout


def add_seen_copies(env: MailEnv) -> None:
    """Two messages, each with an unflagged copy in one account's INBOX and a Seen copy in
    the other's, in both orders: which copy is indexed first decides what the database holds
    of a message mid-batch."""
    inboxes = (env.mail_root / "personal" / "INBOX", env.mail_root / "work" / "INBOX")
    for n, (plain, seen) in enumerate((inboxes, inboxes[::-1])):
        (plain / "cur" / f"8.{n}:2,").write_bytes(mail(f"seen-copy-{n}@x"))
        (seen / "cur" / f"9.{n}:2,S").write_bytes(mail(f"seen-copy-{n}@x"))


def first_index_beside_the_pass(env: MailEnv, base: Path,
                                with_rule: Callable[[MailEnv], None]) -> list[str]:
    """The seen copies indexed first by fmail-nm's first index with a rule, then in another
    place by notmuch new and the pass: the tags of the copies, once both agree on all mail."""
    add_seen_copies(env)
    init_without_index(env)
    with_rule(env)
    assert run_index(env.config(), show_progress=False).first_index
    other = set_up_elsewhere(base / "other", add_seen_copies)
    with_rule(other)
    other.notmuch("new")
    assert dump(env) == dump(other)
    return [line for line in dump(env) if "seen-copy" in line]


def test_a_rule_that_hates_a_tag_reads_the_tags_worked_out_not_those_written_so_far(
        mail_env: MailEnv, tmp_path: Path) -> None:
    """A rule's ``-tag:x`` is answered from the tags worked out for the batch, as ``tag:x``
    is -- not from what the database holds mid-batch: inbox mail has ``unread`` written as it
    is indexed, and a Seen copy in another inbox later in the batch takes it off.  (And mail
    that stays unread gets no "seen": notmuch new and the pass agree on all of it.)"""
    def with_rule(env: MailEnv) -> None:
        env.fmail_config.write_text(env.fmail_config.read_text() + (
            '\n[[tagging.rules]]\nquery = "{folder:inbox} -tag:unread"\nadd = ["seen"]\n'))
    assert first_index_beside_the_pass(mail_env, tmp_path, with_rule) == [
        "+inbox +seen -- id:seen-copy-0@x", "+inbox +seen -- id:seen-copy-1@x"]


def test_a_rule_naming_a_saved_search_reads_no_tag_written_before_the_batch_ends(
        mail_env: MailEnv, tmp_path: Path) -> None:
    """A saved search (``query:unr`` for ``tag:unread``) was answered by notmuch from the
    database: inbox mail's tags written as it is indexed showed ``unread`` there although a
    Seen copy later in the batch takes it off, and list mail, whose tags wait for the rules,
    showed none.  Its tag terms are answered from the tags worked out, as the rule's own."""
    def with_rule(env: MailEnv) -> None:
        env.notmuch("config", "set", "query.unr", "tag:unread")
        env.fmail_config.write_text(env.fmail_config.read_text() + (
            '\n[[tagging.rules]]\nquery = "{folder:inbox} query:unr"\nadd = ["viaq"]\n'))
    assert first_index_beside_the_pass(mail_env, tmp_path, with_rule) == [
        "+inbox -- id:seen-copy-0@x", "+inbox -- id:seen-copy-1@x"]


def test_the_first_index_tags_my_mail_from_a_sub_address_sent(mail_env: MailEnv) -> None:
    """Mail from alex+lists@ (of alex@example.org) is the user's: the rules see the senders of
    the batch, since the mirror that lists the sub-addresses seen is built after it."""
    (mail_env.mail_root / "personal" / "Sent" / "cur" / "8.a:2,S").write_bytes(
        mail("plus-sent@x").replace(b"Nia <nia@example.com>", b"Alex <alex+lists@example.org>"))
    init_without_index(mail_env)
    assert run_index(mail_env.config(), show_progress=False).first_index
    assert mail_env.notmuch("search", "--output=tags", "id:plus-sent@x").stdout.split() == [
        "sent"]


def test_init_indexes_the_fixtures_itself_with_the_tags_they_always_had(
        mail_env: MailEnv) -> None:
    init_without_index(mail_env)
    assert run_index(mail_env.config(), show_progress=False).first_index
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())
    # Later mail is notmuch new's, tagged by the pass as always.
    (mail_env.mail_root / "personal" / "INBOX" / "new" / "later").write_bytes(LISTED)
    later = run_index(mail_env.config(), show_progress=False)
    assert not later.first_index and later.added == 1
    tags = mail_env.notmuch("search", "--output=tags", "id:listed-1@example.com").stdout.split()
    assert sorted(tags) == ["list", "list/rust-users.lists.example.com", "unread"]


def test_the_mirror_is_built_alongside_and_marks_nothing_for_tagging(mail_env: MailEnv) -> None:
    init_without_index(mail_env)
    with Reader() as reader:
        report = first_index.index_first(mail_env.config(), reader, batch_size=40)
    assert report.mirrored and report.added == 169 and report.files == 171
    path = sidecar.sidecar_path(mail_env.config().data_dir)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 169
        assert conn.execute("SELECT count(*) FROM messages WHERE needs_tagging").fetchone()[0] == 0
    check = mail_env.fmail("sidecar", "check", check=False)
    assert check.returncode == 0, check.stdout


def test_without_the_mirror_follower_the_pass_builds_the_mirror_and_tags_nothing_again(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    real = multiprocessing.get_context("spawn")

    class NoProcesses:
        def Queue(self):  # type: ignore[no-untyped-def]  # noqa: N802 - multiprocessing's name
            return real.Queue()

        def Process(self, **kwargs):  # type: ignore[no-untyped-def]  # noqa: N802
            process = real.Process(**kwargs)
            process.start = lambda: (_ for _ in ()).throw(OSError("no processes left"))
            return process
    monkeypatch.setattr(first_index.multiprocessing, "get_context", lambda _: NoProcesses())
    init_without_index(mail_env)
    with Reader() as reader:
        report = first_index.index_first(mail_env.config(), reader)
    assert not report.mirrored and report.added == 169
    monkeypatch.undo()
    revision = int(mail_env.notmuch("count", "--lastmod", "*").stdout.split()[-1])
    mail_env.fmail("index", "--quiet")  # builds the mirror; must not take this mail for new
    assert int(mail_env.notmuch("count", "--lastmod", "*").stdout.split()[-1]) == revision
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())
    check = mail_env.fmail("sidecar", "check", check=False)
    assert check.returncode == 0, check.stdout


def add_many(env: MailEnv, count: int) -> None:
    """More mail than a pipe holds of a first index's notes (64 KiB), and work for its
    parse workers."""
    cur = env.mail_root / "personal" / "Archive" / "cur"
    for i in range(count):
        (cur / f"many-{i}:2,S").write_bytes(
            mail(f"many-{i}@x", b"X-Pad: " + b"p" * 200 + b"\n") + b"A longer body line.\n" * 30)


# A first index in a process of its own; FOLLOWER says what happens to its mirror follower.
FIRST_INDEX_RUN = """
import os, signal, sys
from fmail_nm.app import load_config
from fmail_nm.passes import first_index
from fmail_nm.store.notmuch import Reader
start = first_index._MirrorFollower.__init__
def started(self, config):
    start(self, config)
    if sys.argv[1] == "killed":  # the OOM killer, kill -9
        os.kill(self._process.pid, signal.SIGKILL)
        self._process.join()
first_index._MirrorFollower.__init__ = started
def progress(phase, done, total):
    if sys.argv[1] == "run-killed" and done:
        import multiprocessing
        print(*(child.pid for child in multiprocessing.active_children()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
with Reader() as reader:
    report = first_index.index_first(load_config(), reader, batch_size=40, on_progress=progress)
print(report.mirrored, report.added)
"""


def run_first_index(env: MailEnv, follower: str) -> subprocess.CompletedProcess[str]:
    # Output to files: processes that outlive the run would hold a pipe open.
    out, err = env.base / "first-index.out", env.base / "first-index.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        done = subprocess.run([sys.executable, "-c", FIRST_INDEX_RUN, follower], stdout=stdout,
                              stderr=stderr, env={**os.environ, **env.env}, timeout=120)
    return subprocess.CompletedProcess(done.args, done.returncode, out.read_text(),
                                       err.read_text())


def test_a_follower_killed_leaves_the_run_to_finish_and_the_mirror_to_the_next_sync(
        mail_env: MailEnv) -> None:
    """The mirror follower killed (out of memory, kill -9): the run indexed all but never
    exited -- at exit it waited for its queue's feeder thread, itself waiting for room in a
    pipe no one read."""
    add_many(mail_env, 600)
    init_without_index(mail_env)
    done = run_first_index(mail_env, "killed")  # timeout: the hang
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "769"]
    revision = int(mail_env.notmuch("count", "--lastmod", "*").stdout.split()[-1])
    mail_env.fmail("index", "--quiet")  # builds the mirror; must not take this mail for new
    assert int(mail_env.notmuch("count", "--lastmod", "*").stdout.split()[-1]) == revision
    with sqlite3.connect(sidecar.sidecar_path(mail_env.config().data_dir)) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 769
    check = mail_env.fmail("sidecar", "check", check=False)
    assert check.returncode == 0, check.stdout


def test_a_follower_killed_with_notes_queued_leaves_no_thread_holding_them(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process that goes on after its first index (the service), the notes a killed
    follower never read stayed with the queue's feeder thread, blocked for good on a full
    pipe: a thread and a few batches' parses until restart."""
    add_many(mail_env, 600)
    init_without_index(mail_env)
    followers: list[multiprocessing.process.BaseProcess] = []
    start = first_index._MirrorFollower.__init__

    def stopped(self: first_index._MirrorFollower, config: Config) -> None:
        start(self, config)
        assert self._process is not None and self._process.pid is not None
        os.kill(self._process.pid, signal.SIGSTOP)  # reads no note: they fill the pipe
        followers.append(self._process)

    def killed_later(phase: str, done: int, total: int) -> None:
        if done >= 400 and followers[0].is_alive():
            os.kill(followers[0].pid, signal.SIGKILL)  # type: ignore[arg-type]
            followers[0].join()
    feeders = _feeder_threads()
    monkeypatch.setattr(first_index._MirrorFollower, "__init__", stopped)
    with Reader() as reader:
        report = first_index.index_first(mail_env.config(), reader, batch_size=40,
                                         on_progress=killed_later)
    assert not report.mirrored and report.added == 769
    deadline = time.monotonic() + 30
    while _feeder_threads() - feeders and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _feeder_threads() - feeders


def _feeder_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "QueueFeederThread" and t.is_alive()}


def test_a_first_index_killed_leaves_no_process_of_its_own(mail_env: MailEnv) -> None:
    """Its mirror follower waited for the run's notes for good, holding a pipe it also
    writes to."""
    add_many(mail_env, 600)
    init_without_index(mail_env)
    done = run_first_index(mail_env, "run-killed")
    assert done.returncode == -signal.SIGKILL, done.stderr
    children = [int(pid) for pid in done.stdout.split()]
    assert children  # the follower, the parse workers
    try:
        deadline = time.monotonic() + 30
        while not all(map(_gone, children)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in children if not _gone(pid)] == []
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_notmuch_new_run_meanwhile_leaves_the_rest_to_the_pass(mail_env: MailEnv) -> None:
    """Another program indexing between two batches (mbsync's post-sync `notmuch new`): its
    mail has only new.tags; the first index stops, and the pass tags it as new mail."""
    init_without_index(mail_env)
    others = []

    def after_a_batch(phase: str, done: int, total: int) -> None:
        if 0 < done < total and not others:
            others.append(mail_env.notmuch("new", "--no-hooks").stdout)
    with Reader() as reader:
        report = first_index.index_first(mail_env.config(), reader, batch_size=40,
                                         on_progress=after_a_batch)
    assert "Added" in others[0]
    assert report.interrupted and not report.mirrored and 0 < report.added <= 40
    mail_env.fmail("index", "--quiet")
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())
    check = mail_env.fmail("sidecar", "check", check=False)
    assert check.returncode == 0, check.stdout


def test_a_batch_cut_short_leaves_nothing_and_the_next_run_finishes(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    init_without_index(mail_env)
    calls = []
    real = indexing.final_tags

    def fail_second(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real(*args, **kwargs)
    monkeypatch.setattr(indexing, "final_tags", fail_second)
    config = mail_env.config()
    with Reader() as reader, pytest.raises(RuntimeError):
        first_index.index_first(config, reader, batch_size=60)
    # The first batch is there with its final tags; nothing of the second one.
    first = mail_env.notmuch("dump", "--include=tags").stdout.splitlines()[1:]
    assert 0 < len(first) < 169
    assert set(first) <= set(EXPECTED.read_text().splitlines())
    monkeypatch.undo()
    mail_env.fmail("index", "--quiet")
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())


def test_a_message_the_batch_query_misses_still_gets_its_tags(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    import fmail_nm.store.notmuch as store

    real = store.id_query
    monkeypatch.setattr(store, "id_query", lambda ids: real(sorted(ids)[1:]))
    init_without_index(mail_env)
    assert run_index(mail_env.config(), show_progress=False).first_index
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())


def test_an_all_or_nothing_write_that_fails_saves_nothing(indexed: MailEnv) -> None:
    path = indexed.mail_root / "personal" / "INBOX" / "new" / "plain"
    path.write_bytes(mail("plain@x"))

    def add_then_fail(txn: WriteTxn) -> None:
        txn.add_file(path)
        raise RuntimeError("cut short")
    with Writer() as writer:
        with pytest.raises(RuntimeError):
            writer.run(add_then_fail, all_or_nothing=True)
        assert indexed.notmuch("count", "id:plain@x").stdout.strip() == "0"
        with pytest.raises(RuntimeError):  # the default keeps what a batch did
            writer.run(add_then_fail)
    assert indexed.notmuch("count", "id:plain@x").stdout.strip() == "1"


def test_new_ignore_is_followed_and_a_pattern_python_cannot_read_is_left_to_notmuch(
        mail_env: MailEnv) -> None:
    init_without_index(mail_env)
    mail_env.notmuch("config", "set", "new.ignore", "/[/")  # notmuch's regex, not Python's
    with Reader() as reader:
        reason = first_index.why_not(reader)
    assert reason is not None and "new.ignore" in reason

    mail_env.notmuch("config", "set", "new.ignore", "/^personal/Ju[n]k$/;Trash")
    assert run_index(mail_env.config(), show_progress=False).first_index
    for folder in ("personal/Junk", "personal/Trash", "work/Trash"):
        assert mail_env.notmuch("count", f"folder:{folder}").stdout.strip() == "0"
    assert int(mail_env.notmuch("count", "folder:personal/INBOX").stdout) > 0

    with Reader() as reader:
        assert first_index.why_not(reader) == "the database is not empty"


def test_a_hook_of_the_users_keeps_the_first_index_notmuch_news(mail_env: MailEnv) -> None:
    init_without_index(mail_env)
    hook_dir = Path(mail_env.notmuch("config", "get", "database.hook_dir").stdout.strip())
    assert hook_in_the_way(str(hook_dir)) is None
    kept_hook(hook_dir, "post-new").parent.mkdir()
    kept_hook(hook_dir, "post-new").write_text("#!/bin/sh\n")
    assert "post-new" in (hook_in_the_way(str(hook_dir)) or "")
    assert not run_index(mail_env.config(), show_progress=False).first_index
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())


@pytest.mark.parametrize("names, flags", [
    (["/m/A/cur/1:2,S"], "S"), (["/m/A/new/1"], ""), (["/m/A/cur/1"], None),
    (["/m/A/tmp/1:2,S"], None), (["/m/A/cur/1:2,F", "/m/B/cur/1:2,RS"], "FRS"),
    (["/m/A/new/1", "/m/B/cur/1:2,S"], "S"),
])
def test_maildir_flags_are_read_as_libnotmuch_reads_them(tmp_path: Path, names: list[str],
                                                         flags: str | None) -> None:
    """Checked against libnotmuch itself: the same files, flags_to_tags on a real message."""
    assert maildir_flags(names) == flags
    root = tmp_path / "m"
    root.mkdir()
    notmuch2.Database.create(root, config=notmuch2.Database.CONFIG.EMPTY).close()
    db = notmuch2.Database(root, mode=notmuch2.Database.MODE.READ_WRITE,
                           config=notmuch2.Database.CONFIG.EMPTY)
    try:
        for name in names:
            path = root / name.removeprefix("/m/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(mail("f@x"))
            msg, _ = db.add(path)
        msg = db.find("f@x")
        before = {"inbox", "unread", "flagged"}
        with msg.frozen():
            for tag in before:
                msg.tags.add(tag)
        msg.tags.from_maildir_flags()
        assert set(map(str, msg.tags)) == with_flag_tags(before, flags)
    finally:
        db.close()
