"""The tags an index run gives: the same as they always were, whatever notmuch's new.tags says,
with only the exceptions rewritten -- and an index built by an earlier version upgrades in place.

``tests/data/fixture-tags.dump`` is ``notmuch dump --include=tags`` (sorted) of the fixture mail
after ``fmail-nm init``, taken from the version that tagged every new message through ``new``.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import threading
from pathlib import Path

import pytest

from fmail_nm.passes import post_new as post_new_pass
from fmail_nm.passes.blocklist import apply_blocklist
from fmail_nm.passes.mirror import SyncInProgress, sync_lock
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader, Writer, WriteTxn

from .conftest import REPO, BACK_TO_SCHEMA_4, USER_ADDRESSES, MailEnv, run_init

EXPECTED = REPO / "tests" / "data" / "fixture-tags.dump"
OLD_PROPERTY = "fmail.recipients"


def dump(env: MailEnv) -> list[str]:
    return sorted(env.notmuch("dump", "--include=tags").stdout.splitlines())


def revision(env: MailEnv) -> int:
    return int(env.notmuch("count", "--lastmod", "*").stdout.split()[-1])


def changed_since(env: MailEnv, rev: int) -> set[str]:
    out = env.notmuch("search", "--output=messages", "--exclude=false", f"lastmod:{rev + 1}..")
    return {line.removeprefix("id:") for line in out.stdout.split()}


def test_first_index_gives_the_tags_it_always_gave(indexed: MailEnv) -> None:
    assert indexed.notmuch("config", "get", "new.tags").stdout.split() == ["inbox", "unread"]
    assert dump(indexed) == sorted(EXPECTED.read_text().splitlines())


def test_the_traditional_new_tag_gives_the_same_tags(mail_env: MailEnv) -> None:
    """afew-style setups keep `new` in new.tags: each new message is rewritten once (to take
    `new` off), and ends with the same tags."""
    args = ["init", "--no-index", "--mail-root", str(mail_env.mail_root), "--name", "Alex Morgan"]
    for address in USER_ADDRESSES:
        args += ["--address", address]
    mail_env.fmail(*args)
    mail_env.notmuch("config", "set", "new.tags", "new")
    mail_env.fmail("index", "--quiet")
    assert mail_env.notmuch("count", "tag:new").stdout.strip() == "0"
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())


def test_the_first_notmuch_new_after_init_tags_everything_it_adds(mail_env: MailEnv) -> None:
    """`init --no-index`, then the user's own `notmuch new` (the hook, not `fmail-nm index`,
    runs the pass): the tags are the same as after a full `fmail-nm init`."""
    args = ["init", "--no-index", "--mail-root", str(mail_env.mail_root), "--name", "Alex Morgan"]
    for address in USER_ADDRESSES:
        args += ["--address", address]
    mail_env.fmail(*args)
    mail_env.notmuch("new")
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())


def test_index_runs_the_pass_itself_and_the_hook_starts_no_second_fmail_nm(
        mail_env: MailEnv) -> None:
    """`fmail-nm index` asks our hook to leave the pass to it: the user's chained hook still
    runs, our hook's command does not, and the tags are the same.  A plain `notmuch new` still
    gets the pass from the hook."""
    import sys

    from fmail_nm.adopt.hooks import install_hooks

    args = ["init", "--no-index", "--mail-root", str(mail_env.mail_root), "--name", "Alex Morgan"]
    for address in USER_ADDRESSES:
        args += ["--address", address]
    mail_env.fmail(*args)
    hook_dir = Path(mail_env.notmuch("config", "get", "database.hook_dir").stdout.strip())
    ours, users = mail_env.base / "ours.log", mail_env.base / "users.log"
    recorder = mail_env.base / "fmail-recorder"
    recorder.write_text(f'#!/bin/sh\necho ran >> "{ours}"\nexec "{sys.executable}" -m fmail_nm "$@"\n')
    recorder.chmod(0o755)
    (hook_dir / "post-new").unlink()
    user_hook = hook_dir / "post-new"
    user_hook.write_text(f'#!/bin/sh\necho ran >> "{users}"\n')
    user_hook.chmod(0o755)
    install_hooks(hook_dir, [str(recorder)])  # chains the user's hook

    mail_env.fmail("index", "--quiet")
    assert users.read_text() == "ran\n"
    assert not ours.exists()
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())

    inbox = mail_env.mail_root / "personal" / "INBOX" / "new"
    (inbox / "listed-1:2,").write_bytes(LISTED)
    mail_env.notmuch("new")
    assert ours.read_text() == "ran\n" and users.read_text() == "ran\nran\n"
    tags = mail_env.notmuch("search", "--output=tags", "id:listed-1@example.com").stdout.split()
    assert "list" in tags


PLAIN = (b"From: Nia <nia@example.com>\nTo: alex@example.org\nSubject: plain\n"
         b"Message-ID: <plain-1@example.com>\nDate: Tue, 01 Dec 2026 10:00:00 +0000\n\nhello\n")
LISTED = (b"From: Rust <rust@lists.example.com>\nTo: rust-users@lists.example.com\n"
          b"List-Id: Rust users <rust-users.lists.example.com>\nSubject: weekly\n"
          b"Message-ID: <listed-1@example.com>\nDate: Tue, 01 Dec 2026 11:00:00 +0000\n\nnews\n")
MINE = (b"From: Alex Morgan <alex@example.org>\nTo: nia@example.com\nSubject: mine\n"
        b"Message-ID: <mine-1@example.org>\nDate: Tue, 01 Dec 2026 12:00:00 +0000\n\nhi\n")


def test_only_the_exceptions_are_rewritten(indexed: MailEnv) -> None:
    inbox = indexed.mail_root / "personal" / "INBOX" / "new"
    for n, raw in enumerate((PLAIN, LISTED, MINE)):
        (inbox / f"1800000000.{n}_1.host").write_bytes(raw)
    indexed.notmuch("new", "--no-hooks")
    after_notmuch_new = revision(indexed)
    indexed.fmail("hook", "post-new")
    # Plain inbox mail already had its final tags from notmuch new: not touched again.
    assert changed_since(indexed, after_notmuch_new) == {"listed-1@example.com", "mine-1@example.org"}

    def tags(mid: str) -> set[str]:
        return set(indexed.notmuch("search", "--output=tags", f"id:{mid}").stdout.split())
    assert tags("plain-1@example.com") == {"inbox", "unread"}
    assert tags("listed-1@example.com") == {"list", "list/rust-users.lists.example.com", "unread"}
    assert tags("mine-1@example.org") == {"sent", "unread"}
    # A second run finds nothing left to tag and rewrites nothing.
    settled = revision(indexed)
    indexed.fmail("hook", "post-new")
    assert changed_since(indexed, settled) == set()


def test_old_tags_are_never_redone_when_the_sidecar_is_rebuilt(indexed: MailEnv) -> None:
    """The sidecar is a cache: deleting it rebuilds the mirror, but mail tagged long ago
    (here: a message the user took out of the inbox by hand) is not tagged again."""
    indexed.notmuch("tag", "-inbox", "--", "id:school-trip-3@example.com")
    before = dump(indexed)
    data = indexed.config().data_dir
    for path in data.glob("sidecar.sqlite3*"):
        path.unlink()
    indexed.fmail("index", "--quiet")
    assert dump(indexed) == before


def test_a_new_tag_of_the_users_own_is_not_new_mail(indexed: MailEnv) -> None:
    """Without ``new`` in new.tags, ``new`` is a tag like any other (mutt users give it by
    hand): a message carrying it is not waiting for the pass, so the rules never redo its
    tags -- archived in the mail client, it stays out of the inbox."""
    mid = "id:school-trip-3@example.com"
    indexed.notmuch("tag", "+new", "--", mid)
    indexed.fmail("index", "--quiet")
    indexed.notmuch("tag", "-inbox", "--", mid)
    before = dump(indexed)
    indexed.fmail("index", "--quiet")
    assert dump(indexed) == before


def test_an_inbox_tag_taken_off_before_the_pass_stays_off(indexed: MailEnv) -> None:
    """Mail that reached the index without a hook is tagged by the next pass, which must not
    put back the inbox tag taken off meanwhile: by ``notmuch insert --no-hooks -inbox``
    (procmail filing mail as it delivers it), or by the user archiving in the mail client
    before the pass ran.  The rules still add their tags."""
    for raw, ops in ((PLAIN, ["-inbox", "+todo"]), (LISTED, ["+inbox", "+unread"])):
        insert(indexed, raw, "--no-hooks", "--folder=personal/INBOX", *ops)
    assert tags_of(indexed, "listed-1@example.com") == {"inbox", "unread"}  # no pass yet
    indexed.notmuch("tag", "-inbox", "--", "id:listed-1@example.com")
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1800000000.2_1.host").write_bytes(MINE)
    indexed.notmuch("new", "--no-hooks")
    indexed.notmuch("tag", "-inbox", "+read-later", "--", "id:mine-1@example.org")
    indexed.notmuch("new")

    assert tags_of(indexed, "plain-1@example.com") == {"todo", "unread"}
    assert tags_of(indexed, "listed-1@example.com") == {
        "list", "list/rust-users.lists.example.com", "unread"}
    assert tags_of(indexed, "mine-1@example.org") == {"read-later", "sent", "unread"}


def insert(env: MailEnv, raw: bytes, *args: str) -> None:
    """``notmuch insert`` as procmail or a mail client's Sent copy runs it."""
    subprocess.run(["notmuch", "insert", *args], input=raw, env={**os.environ, **env.env},
                   capture_output=True, check=True)


def mirrored_tags(env: MailEnv, mid: str) -> set[str] | None:
    with sidecar.opened(sidecar.sidecar_path(env.config().data_dir)) as conn:
        row = conn.execute("SELECT tags FROM messages WHERE message_id = ?", (mid,)).fetchone()
    return None if row is None else set(json.loads(row[0]))


def test_mail_notmuch_insert_delivers_is_tagged_and_mirrored_when_insert_returns(
        indexed: MailEnv) -> None:
    """Our post-insert hook runs the pass: the rules start from the tags insert gave (new.tags
    and the caller's), and a tag of new.tags the caller took off stays off."""
    insert(indexed, LISTED, "--folder=personal/INBOX")
    insert(indexed, PLAIN, "--folder=personal/INBOX", "-inbox", "+todo")
    insert(indexed, MINE, "--folder=personal/Sent", "+sent", "-unread")
    listed = {"list", "list/rust-users.lists.example.com", "unread"}
    assert tags_of(indexed, "listed-1@example.com") == listed
    assert tags_of(indexed, "plain-1@example.com") == {"todo", "unread"}
    assert tags_of(indexed, "mine-1@example.org") == {"sent"}
    assert mirrored_tags(indexed, "listed-1@example.com") == listed
    assert mirrored_tags(indexed, "mine-1@example.org") == {"sent"}


def test_an_insert_while_a_long_pass_runs_returns_and_the_next_pass_tags_it(
        indexed: MailEnv) -> None:
    """An MDA's ``notmuch insert`` waits for our hook: while another process holds the sidecar
    for long (the service's first index), the hook leaves the mail to the next pass rather
    than hold the delivery until the MDA's time limit kills it and delivers it again."""
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with sync_lock(path, wait=math.inf):
        subprocess.run(["notmuch", "insert", "--folder=personal/INBOX"], input=LISTED,
                       env={**os.environ, **indexed.env}, capture_output=True, check=True,
                       timeout=120)
    assert tags_of(indexed, "listed-1@example.com") == {"inbox", "unread"}
    indexed.notmuch("new")
    listed = {"list", "list/rust-users.lists.example.com", "unread"}
    assert tags_of(indexed, "listed-1@example.com") == listed
    assert mirrored_tags(indexed, "listed-1@example.com") == listed


def test_a_sync_started_while_an_insert_is_tagged_is_waited_for_no_longer(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The post-insert pass's last sync (the final tags) waits for another process's sync no
    longer than its first: an index run that takes the sidecar while the pass tags leaves the
    mirroring to the next pass, rather than hold the MDA's delivery behind it."""
    insert(indexed, LISTED, "--no-hooks", "--folder=personal/INBOX")
    config = indexed.config()
    path = sidecar.sidecar_path(config.data_dir)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # its own open of the lock file: another process, as flock sees it
        with sync_lock(path, wait=math.inf):
            held.set()
            release.wait(timeout=20)  # a pass that waits for ever must still end

    def blocklist_then_a_sync_elsewhere(*args: object, **kwargs: object) -> object:
        found = apply_blocklist(*args, **kwargs)  # type: ignore[arg-type]
        holder.start()
        held.wait(timeout=20)
        return found

    holder = threading.Thread(target=hold)
    monkeypatch.setattr(post_new_pass, "apply_blocklist", blocklist_then_a_sync_elsewhere)
    try:
        with Reader(indexed.notmuch_config) as reader, Writer(indexed.notmuch_config) as writer:
            with pytest.raises(SyncInProgress):
                post_new_pass.post_new(config, reader, writer, sync_wait=0.1)
    finally:
        release.set()
        holder.join()
    listed = {"list", "list/rust-users.lists.example.com", "unread"}
    assert tags_of(indexed, "listed-1@example.com") == listed
    indexed.notmuch("new")  # the next pass mirrors what this one tagged
    assert mirrored_tags(indexed, "listed-1@example.com") == listed


def test_mail_inserted_without_hooks_waits_for_the_next_pass(indexed: MailEnv) -> None:
    insert(indexed, LISTED, "--no-hooks", "--folder=personal/INBOX")
    assert tags_of(indexed, "listed-1@example.com") == {"inbox", "unread"}
    assert mirrored_tags(indexed, "listed-1@example.com") is None
    indexed.notmuch("new")
    listed = {"list", "list/rust-users.lists.example.com", "unread"}
    assert tags_of(indexed, "listed-1@example.com") == listed
    assert mirrored_tags(indexed, "listed-1@example.com") == listed


def test_mail_the_first_run_after_a_compact_indexes_is_tagged(indexed: MailEnv) -> None:
    """``notmuch compact`` (a weekly cron job) gives the database a new UUID, so the mirror is
    built again; the mail the next ``notmuch new`` brings is still new mail, and tagged."""
    indexed.notmuch("compact")
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1800000000.1_1.host").write_bytes(LISTED)
    before = dump(indexed)
    indexed.notmuch("new")
    tags = indexed.notmuch("search", "--output=tags", "id:listed-1@example.com").stdout.split()
    assert set(tags) == {"list", "list/rust-users.lists.example.com", "unread"}
    assert set(dump(indexed)) - set(before) == {
        "+list +list%2frust-users.lists.example.com +unread -- id:listed-1@example.com"}


def test_mail_tagged_by_hand_before_a_compact_is_not_tagged_again(indexed: MailEnv) -> None:
    """Mail changed by hand since the last pass (a list message the user put in the inbox in
    a mail client) is no new mail after ``notmuch compact``: it keeps its tags, and the mail
    the next ``notmuch new`` brings is still tagged."""
    indexed.notmuch("tag", "+inbox", "--", "id:list-hike-1@example.net")
    indexed.notmuch("compact")
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1800000000.1_1.host").write_bytes(LISTED)
    indexed.notmuch("new")

    def tags(mid: str) -> set[str]:
        return set(indexed.notmuch("search", "--output=tags", f"id:{mid}").stdout.split())
    assert tags("listed-1@example.com") == {"list", "list/rust-users.lists.example.com", "unread"}
    assert tags("list-hike-1@example.net") == {"inbox", "list", "list/hikers.lists.example.net"}


def set_old_property(txn: WriteTxn, ids: list[str]) -> None:
    for mid in ids:
        txn.set_property(mid, OLD_PROPERTY, '[["Alex", "alex@example.org"]]')


def test_an_index_from_the_previous_version_upgrades_in_place(indexed: MailEnv) -> None:
    """The previous version kept recipients in a notmuch property and had a version-1 sidecar:
    the next index run drops the property, migrates the sidecar, and loses nothing."""
    ids = ["school-trip-1@example.com", "wedding-1@example.net", "self-cc-1@example.org"]
    with Writer() as writer:
        writer.run(lambda txn: set_old_property(txn, ids))
    path = sidecar.sidecar_path(indexed.config().data_dir)
    conn = sqlite3.connect(path)
    conn.executescript(BACK_TO_SCHEMA_4)
    conn.executescript("DROP INDEX messages_needs_tagging; "
                       "ALTER TABLE messages DROP COLUMN needs_tagging; "
                       # version 3's threads table back to version 1's view
                       "DROP VIEW threads; DROP TABLE thread_rows; DROP INDEX messages_thread_date; "
                       "CREATE VIEW threads AS SELECT thread_id FROM messages; "
                       "PRAGMA user_version = 1;")
    conn.close()
    tags_before = dump(indexed)
    query = f'sexp:"(property (starts-with {OLD_PROPERTY}=))"'
    assert indexed.notmuch("count", query).stdout.strip() == "3"

    indexed.fmail("index", "--quiet")

    assert indexed.notmuch("count", query).stdout.strip() == "0"
    with Reader() as reader:
        assert all(reader.property(mid, OLD_PROPERTY) is None for mid in ids)
    assert dump(indexed) == tags_before
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(sidecar.MIGRATIONS)
    check = indexed.fmail("sidecar", "check", check=False)
    assert check.returncode == 0, check.stdout
    with Reader() as reader, sidecar.opened(path) as conn:  # mirrored past the property's drop
        assert sidecar.get_state(conn, "revision") == str(reader.revision().number)
    stored = sidecar.recipients_of(indexed.config().data_dir, ids)
    assert all(stored[mid] for mid in ids if mid != "self-cc-1@example.org")


def test_the_expected_dump_is_the_fixture_tree(tmp_path: Path) -> None:
    """The reference dump names every message of the fixtures once (a stale dump would make
    the comparisons above compare the wrong thing)."""
    lines = [line for line in EXPECTED.read_text().splitlines() if not line.startswith("#")]
    ids = [line.split(" -- id:")[1] for line in lines]
    assert len(ids) == len(set(ids)) == 169
    assert sum(" +inbox " in f" {line} " for line in lines) == 98


def test_rule_tag_terms_are_answered_from_the_expected_tags() -> None:
    from fmail_nm.passes.tagging import _answered_from
    from fmail_nm.store.query import MATCH_NOTHING

    expected = {"a@x": {"sent", "list"}, "b@x": {"inbox"}, "c@x": {"my tag"}}
    ids = sorted(expected)
    assert _answered_from("tag:sent", ids, expected) == '(id:"a@x")'
    assert _answered_from("NOT is:inbox", ids, expected) == 'NOT (id:"b@x")'
    assert _answered_from('tag:"my tag" OR tag:/^li/', ids, expected) == (
        '(id:"c@x") OR (id:"a@x")')
    assert _answered_from("tag:spam", ids, expected) == MATCH_NOTHING
    # other terms are left to notmuch, quoted phrases untouched even when they say tag:
    assert _answered_from('from:x@y AND subject:"tag:sent" AND tag:inbox', ids, expected) == (
        'from:x@y AND subject:"tag:sent" AND (id:"b@x")')
    assert _answered_from("tag:/[unclosed/", ids, expected) == MATCH_NOTHING


def test_expected_tags_keep_what_new_tags_meant() -> None:
    from fmail_nm.config import DEFAULT_RULES
    from fmail_nm.passes.tagging import expected_tags, ruled_new_tags

    def expected(current: set[str], new_tags: set[str], list_id: str | None) -> set[str]:
        ruled = ruled_new_tags(frozenset(new_tags), DEFAULT_RULES)
        return expected_tags(frozenset(current), ruled, list_id)

    # new.tags without `new`: as if it had been `new` -- inbox is the rules' to give
    assert expected({"inbox", "unread", "attachment"}, {"inbox", "unread"}, None) == {
        "unread", "attachment"}
    # ... but a tag of the user's own that no rule gives stays
    assert expected({"inbox", "unread", "work"}, {"inbox", "unread", "work"}, None) == {
        "unread", "work"}
    # with `new`: only `new` goes, as it always did (here inbox came with new.tags)
    assert expected({"new", "inbox"}, {"new", "inbox"}, "Rust.Users.lists.example.com") == {
        "inbox", "list", "list/rust.users.lists.example.com"}


def init_no_index_then_bare_new(env: MailEnv) -> None:
    args = ["init", "--no-index", "--mail-root", str(env.mail_root), "--name", "Alex Morgan"]
    for address in USER_ADDRESSES:
        args += ["--address", address]
    env.fmail(*args)
    env.notmuch("new", "--no-hooks")


def test_the_tagger_tags_each_mirror_batch_while_the_mirror_goes_on(mail_env: MailEnv) -> None:
    """Many small mirror batches, each handed to the tagger as it commits: every message ends
    with the tags it always got, and no mark is left behind."""
    from fmail_nm.passes.mirror import Mirror
    from fmail_nm.passes.tagging import Tagger, configured_new_tags

    init_no_index_then_bare_new(mail_env)
    config = mail_env.config()
    handed: list[int] = []
    with Reader() as reader, Writer() as writer, \
            sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        with Tagger(config, writer, configured_new_tags(reader)) as tagger:
            def hand_over(marked: list[tuple[str, str | None]]) -> None:
                handed.append(len(marked))
                tagger.add(marked)
            Mirror(config, reader, conn, batch_size=20, on_marked=hand_over).sync()
        assert sidecar.pending_tagging(conn) == []
        assert tagger.report.messages == sum(handed) == 169
    assert len(handed) == 9
    mail_env.fmail("sidecar", "sync")
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())


def test_a_tagger_that_cannot_write_leaves_the_marks_for_the_next_run(mail_env: MailEnv) -> None:
    """The write lock is held elsewhere: the tagger's error reaches the caller, the mirror's
    batches are kept, every message stays marked, and the next index run tags them."""
    from fmail_nm.errors import FmailError
    from fmail_nm.passes.post_new import post_new

    from .conftest import notmuch_lock_held

    init_no_index_then_bare_new(mail_env)
    config = mail_env.config()
    with Reader() as reader, Writer(lock_timeout=0.5) as writer:
        with notmuch_lock_held(mail_env.env):
            try:
                post_new(config, reader, writer)
            except FmailError as exc:
                assert "busy" in str(exc).lower()
            else:
                raise AssertionError("post_new went on without the write lock")
    with sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        assert len(sidecar.pending_tagging(conn)) == 169
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 169
    mail_env.fmail("index", "--quiet")
    assert dump(mail_env) == sorted(EXPECTED.read_text().splitlines())


def test_a_rule_for_all_mail_tags_all_new_mail(mail_env: MailEnv) -> None:
    """A rule whose query is notmuch's "*" applies to every message the run adds: the rule
    query is combined with the run's ids without parentheses around "*", which notmuch would
    read as a wildcard matching a fraction of the mail."""
    mail_env.fmail_config.write_text(mail_env.fmail_config.read_text()
                                     + '\n[[tagging.rules]]\nquery = "*"\nadd = ["seen-by-rules"]\n')
    run_init(mail_env)
    everything = int(mail_env.notmuch("count", "--exclude=false", "*").stdout)
    tagged = int(mail_env.notmuch("count", "--exclude=false", "tag:seen-by-rules").stdout)
    assert tagged == everything > 100


def tags_of(env: MailEnv, mid: str) -> set[str]:
    found = env.notmuch("search", "--output=tags", "--exclude=false", f"id:{mid}")
    return set(found.stdout.split())


@pytest.mark.parametrize("sync_flags", ["true", "false"])
def test_a_draft_from_the_server_is_a_draft_until_it_is_sent(mail_env: MailEnv,
                                                             sync_flags: str) -> None:
    """Drafts pulled into the Drafts folder (written on a phone) are drafts, never sent mail,
    whether or not notmuch follows the D flag; sent from the phone, the draft leaves Drafts
    and its Sent copy (the same Message-ID, another file) is sent mail and no draft."""
    args = ["init", "--no-index", "--mail-root", str(mail_env.mail_root), "--name", "Alex Morgan"]
    for address in USER_ADDRESSES:
        args += ["--address", address]
    mail_env.fmail(*args)
    mail_env.notmuch("config", "set", "maildir.synchronize_flags", sync_flags)
    drafts = mail_env.mail_root / "personal" / "Drafts" / "cur"
    # a draft the server holds without the \Draft flag, which flag sync cannot see either
    (drafts / "1796000001.unflagged.host:2,S").write_bytes(
        b"From: Alex Morgan <alex@example.org>\nTo: nia@example.com\nSubject: unflagged\n"
        b"Message-ID: <unflagged-draft@example.org>\nDate: Tue, 01 Dec 2026 10:00:00 +0000\n"
        b"\nnot yet\n")
    mail_env.notmuch("new")  # the hook's post-new pass tags
    in_drafts = mail_env.notmuch("search", "--output=messages", "--exclude=false",
                                 "folder:personal/Drafts").stdout.split()
    assert len(in_drafts) == 3
    for mid in in_drafts:
        got = tags_of(mail_env, mid.removeprefix("id:"))
        assert "draft" in got and not got & {"sent", "inbox"}, (mid, got)

    [draft] = [f for f in drafts.iterdir() if b"<draft-2@example.org>" in f.read_bytes()]
    (mail_env.mail_root / "personal" / "Sent" / "cur" / "1796000002.sent.host:2,S").write_bytes(
        draft.read_bytes())
    draft.unlink()
    # and a draft thrown away on the phone, which is still no sent mail
    [other] = [f for f in drafts.iterdir() if b"<unflagged-draft@example.org>" in f.read_bytes()]
    other.rename(mail_env.mail_root / "personal" / "Trash" / "cur" / other.name)
    mail_env.notmuch("new")
    got = tags_of(mail_env, "draft-2@example.org")
    assert "sent" in got and not got & {"draft", "inbox"}, got
    got = tags_of(mail_env, "unflagged-draft@example.org")
    assert "deleted" in got and not got & {"sent", "inbox"}, got


@pytest.mark.parametrize("sync_flags", ["true", "false"])
def test_mail_moved_into_drafts_by_another_client_is_a_draft(indexed: MailEnv,
                                                            sync_flags: str) -> None:
    """Mail another client moved into Drafts is tagged as mail that arrived there: a draft,
    out of the inbox, and the user's own no sent mail -- whether or not notmuch follows the
    D flag, which the moved files do not have."""
    indexed.notmuch("config", "set", "maildir.synchronize_flags", sync_flags)
    personal = indexed.mail_root / "personal"
    moved = {"school-trip-3@example.com": "INBOX", "wedding-2@example.org": "Sent"}
    for mid, folder in moved.items():
        [path] = [f for f in (personal / folder / "cur").iterdir()
                  if f"<{mid}>".encode() in f.read_bytes()]
        path.rename(personal / "Drafts" / "cur" / re.sub(r",U=\d+", "", path.name))
    indexed.notmuch("new")  # the hook's post-new pass settles the place tags
    for mid in moved:
        got = tags_of(indexed, mid)
        assert "draft" in got and not got & {"sent", "inbox"}, (mid, got)
    # Dragged back where they came from (by mistake into Drafts): mail like any other again.
    for mid, folder in moved.items():
        [path] = [f for f in (personal / "Drafts" / "cur").iterdir()
                  if f"<{mid}>".encode() in f.read_bytes()]
        path.rename(personal / folder / "cur" / path.name)
    indexed.notmuch("new")
    back = {mid: tags_of(indexed, mid) for mid in moved}
    assert "inbox" in back["school-trip-3@example.com"], back
    assert "sent" in back["wedding-2@example.org"], back
    assert not any("draft" in got for got in back.values()), back


def test_an_upgrade_under_a_hook_running_the_pass_itself_leaves_no_mirror_lag(
        indexed: MailEnv) -> None:
    """A hook of a version before the pass moved into ``fmail-nm index`` runs the pass inside
    notmuch new: the property's drop after it must still reach the sidecar."""
    import shlex

    from fmail_nm.config import fmail_command, load_settings

    hook = Path(indexed.notmuch("config", "get", "database.hook_dir").stdout.strip()) / "post-new"
    command = fmail_command(load_settings(str(indexed.fmail_config)))
    hook.write_text(f"#!/bin/sh\n# fmail-nm hook: post-new\n{shlex.join(command)} hook post-new\n")
    hook.chmod(0o755)
    ids = ["school-trip-1@example.com", "wedding-1@example.net"]
    with Writer() as writer:
        writer.run(lambda txn: set_old_property(txn, ids))

    indexed.fmail("index", "--quiet")

    with Reader() as reader:
        assert all(reader.property(mid, OLD_PROPERTY) is None for mid in ids)
        path = sidecar.sidecar_path(indexed.config().data_dir)
        with sidecar.opened(path) as conn:
            assert sidecar.get_state(conn, "revision") == str(reader.revision().number)
