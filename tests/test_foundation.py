"""init, index, the post-new tagging pass and the notmuch access layer, on real notmuch with a
temp copy of the fixture mail."""

from __future__ import annotations

import email
import email.policy
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fmail_nm.adopt.hooks import kept_hook
from fmail_nm.demo import demo_environment
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import DatabaseBusy, Reader, Writer

from .conftest import MailEnv, notmuch_lock_held, run_init


def maildir_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.parent.name in ("cur", "new")
                  and ".notmuch" not in p.parts)


def message_id_of(path: Path) -> str | None:
    with path.open("rb") as fh:
        msg = email.message_from_binary_file(fh, policy=email.policy.compat32)
    value = msg.get("Message-ID")
    return str(value).strip().strip("<>") if value else None


def tags_of(env: MailEnv, message_id: str) -> set[str]:
    out = env.notmuch("search", "--output=tags", "--exclude=false", f"id:{message_id}").stdout
    return set(out.split())


def dump_tags(env: MailEnv) -> str:
    return env.notmuch("dump").stdout


def test_init_indexes_every_fixture_message(indexed: MailEnv) -> None:
    files = maildir_files(indexed.mail_root)
    ids = [message_id_of(p) for p in files]
    without_id = sum(1 for i in ids if i is None)
    unique = len({i for i in ids if i is not None}) + without_id
    assert len(files) >= 150
    assert int(indexed.notmuch("count", "--output=files", "--exclude=false", "*").stdout) == len(files)
    # Duplicates (one Message-ID in several files) are one message.
    assert int(indexed.notmuch("count", "--exclude=false", "*").stdout) == unique
    assert unique < len(files)
    assert indexed.notmuch("count", "tag:new").stdout.strip() == "0"


def test_init_writes_the_notmuch_config_we_need(indexed: MailEnv) -> None:
    def get(key: str) -> str:
        return indexed.notmuch("config", "get", key).stdout.strip()
    # notmuch's own default: new mail is final as it is indexed, but for the exceptions
    assert get("new.tags").split("\n") == ["inbox", "unread"]
    assert ".mbsyncstate" in get("new.ignore").split("\n")
    assert ".uidvalidity" in get("new.ignore").split("\n")
    assert get("search.exclude_tags").split("\n") == ["deleted", "spam"]
    assert get("maildir.synchronize_flags") == "true"
    assert get("user.primary_email") == "alex@example.org"


def test_second_init_changes_nothing(indexed: MailEnv) -> None:
    config_before = indexed.notmuch_config.read_bytes()
    tags_before = dump_tags(indexed)
    hook = indexed.mail_root / ".notmuch" / "hooks" / "post-new"
    hook_before = hook.read_bytes()
    out = run_init(indexed).stdout
    assert "left unchanged" in out
    assert "post-new: unchanged" in out
    assert "indexed: 0 new" in out
    assert indexed.notmuch_config.read_bytes() == config_before
    assert hook.read_bytes() == hook_before
    assert dump_tags(indexed) == tags_before


def test_init_keeps_an_existing_notmuch_config_and_chains_its_hook(mail_env: MailEnv) -> None:
    # A user who already runs notmuch with their own post-new hook (afew, say).
    mail_env.notmuch_config.write_text(textwrap.dedent(f"""\
        [database]
        path={mail_env.mail_root}
        [user]
        primary_email=alex@example.org
        other_email=alex.morgan@example.org;amorgan@acme.test
        [new]
        tags=new
        ignore=.mbsyncstate;.mbsyncstate.journal;.mbsyncstate.new;.mbsyncstate.lock;.uidvalidity
        [search]
        exclude_tags=deleted;spam
        """))
    config_before = mail_env.notmuch_config.read_bytes()
    mail_env.notmuch("new", "--no-hooks")
    hooks = mail_env.mail_root / ".notmuch" / "hooks"
    hooks.mkdir(parents=True)
    marker = mail_env.base / "user-hook-ran"
    user_hook = hooks / "post-new"
    user_hook.write_text(f"#!/bin/sh\necho ran >> '{marker}'\n")
    user_hook.chmod(0o755)

    out = mail_env.fmail("init").stdout
    assert "left unchanged" in out
    assert "previous hook now runs first" in out
    assert mail_env.notmuch_config.read_bytes() == config_before
    assert kept_hook(hooks, "post-new").read_text().startswith("#!/bin/sh\necho ran")
    runs_after_init = marker.read_text().count("ran")
    assert runs_after_init == 1  # init's notmuch new ran both hooks
    # Mail indexed before fmail-nm arrived has its recipients in the sidecar after init.
    stored = sidecar.recipients_of(mail_env.config().data_dir, ["school-trip-1@example.com"])
    assert "alex@example.org" in [r["email"] for r in stored["school-trip-1@example.com"]]

    # New mail later: `notmuch new` run by the user runs their hook and our tagging pass.
    new_mail = mail_env.mail_root / "personal" / "INBOX" / "new" / "1800000000.1_1.test,U=9999"
    new_mail.write_bytes(b"From: Nia <nia@example.com>\nTo: alex@example.org\n"
                         b"Subject: later\nMessage-ID: <later-1@example.com>\n"
                         b"Date: Tue, 01 Dec 2026 10:00:00 +0000\n\nhello\n")
    mail_env.notmuch("new")
    assert marker.read_text().count("ran") == 2
    assert tags_of(mail_env, "later-1@example.com") == {"inbox", "unread"}


# Tags after init, from the files' Maildir flags and the default rules of the tagging pass.
EXPECTED_TAGS = {
    # from the user, in Sent: sent, not inbox
    "unanswered-2@example.org": {"sent"},
    "wedding-2@example.org": {"sent"},  # sent From the alias address
    # answered by the user (R), flagged (F): inbox
    "school-trip-1@example.com": {"inbox", "replied", "flagged"},
    # list mail: list + list/<id>, not inbox
    "list-rust-2@example.net": {"list", "list/rust-users.lists.example.org"},
    # unread (no S flag) HTML newsletter without List-Id
    "html-only-1@coop.example.com": {"inbox", "unread"},
    # Trash, Junk and Archive folders carry the standard tags
    "trash-1@bookshelf.example.com": {"deleted"},
    "junk-4@parcel-notify.example.com": {"spam", "unread"},
    "carpool-1@example.com": {"archived", "replied"},
    # a draft is the user's but was never sent
    "draft-1@example.org": {"draft", "unread"},
    # one Message-ID, a copy in each account's INBOX
    "both-accounts-1@example.com": {"inbox"},
}


@pytest.mark.parametrize("message_id, expected", sorted(EXPECTED_TAGS.items()))
def test_tagging_pass_gives_exact_tags(shared_indexed: MailEnv, message_id: str,
                                       expected: set[str]) -> None:
    assert tags_of(shared_indexed, message_id) == expected


def test_tagging_pass_invariants(shared_indexed: MailEnv) -> None:
    env = shared_indexed

    def count(query: str) -> int:
        return int(env.notmuch("count", "--exclude=false", query).stdout)
    mine = "(from:alex@example.org OR from:alex.morgan@example.org OR from:amorgan@acme.test)"
    assert count(f"{mine} AND NOT tag:draft") == count("tag:sent") > 0
    assert count("tag:sent AND tag:inbox") == 0
    assert count("tag:list AND tag:inbox") == 0
    assert count("tag:list") >= 10
    assert count("NOT (tag:sent OR tag:draft OR tag:list OR tag:deleted OR tag:spam "
                 "OR tag:archived)") == count("tag:inbox")
    assert count("tag:new") == 0


def test_writer_tag_change_renames_maildir_flags(indexed: MailEnv) -> None:
    with Reader() as reader:
        unread = reader.messages("tag:unread AND folder:personal/INBOX", exclude_tags=(), limit=1)[0]
    path = Path(unread.filenames[0])
    assert path.parent.name == "new" or ":2," not in path.name or "S" not in path.name.split(":2,")[1]
    with Writer() as writer:
        result = writer.run(lambda txn: txn.change_tags([unread.message_id], remove=["unread"]))
    assert result.applied == [unread.message_id]
    with Reader() as reader:
        after = reader.find(unread.message_id)
    assert after is not None and "unread" not in after.tags
    new_path = Path(after.filenames[0])
    assert new_path.exists() and not path.exists()
    assert new_path.parent.name == "cur"
    assert "S" in new_path.name.rsplit(":2,", 1)[1]
    assert ",U=" in new_path.name  # a flag change keeps mbsync's UID


def test_writer_reports_unknown_ids(indexed: MailEnv) -> None:
    with Writer() as writer:
        result = writer.run(lambda txn: txn.change_tags(["no-such-id@example.com"], add=["x"]))
    assert result.applied == [] and result.not_found == ["no-such-id@example.com"]


def test_write_while_another_process_holds_the_lock(indexed: MailEnv) -> None:
    with Reader() as reader:
        target = reader.messages("tag:inbox", limit=1)[0]
    with notmuch_lock_held() as holder:
        with Writer(lock_timeout=1.0) as writer:
            with pytest.raises(DatabaseBusy, match="database busy.*retry") as err:
                writer.run(lambda txn: txn.change_tags([target.message_id], add=["busy-test"]))
            assert err.value.waited == 1.0
            holder.release()
            # The abandoned batch never ran, later: nothing was lost, nothing half-applied.
            with Reader() as reader:
                assert "busy-test" not in reader.find(target.message_id).tags  # type: ignore[union-attr]
            # Once the lock is free the same write succeeds.
            writer.run(lambda txn: txn.change_tags([target.message_id], add=["busy-test"]))
        with Reader() as reader:
            assert "busy-test" in reader.find(target.message_id).tags  # type: ignore[union-attr]


def test_closing_a_writer_that_gave_up_does_not_wait_for_the_lock(indexed: MailEnv) -> None:
    """The writer thread of a batch given up on blocks in its open until the lock is free:
    close() waited for it, up to the Writer's whole timeout more, without a word, after
    the caller had been told "busy"."""
    writer = Writer(lock_timeout=600.0)
    with notmuch_lock_held() as holder:
        with pytest.raises(DatabaseBusy):
            writer.run(lambda txn: None, lock_timeout=0.5)
        closing = threading.Thread(target=writer.close)
        closing.start()
        closing.join(timeout=60)
        assert not closing.is_alive(), "close() waits for the lock held elsewhere"
        assert holder.proc.poll() is None  # the lock was held all along
        holder.release()


def test_a_deadline_bounds_the_wait_for_the_lock_and_a_passed_one_runs_nothing(
        indexed: MailEnv) -> None:
    ran: list[int] = []
    with Writer(lock_timeout=5.0) as writer:
        # Asked long enough ago that its time went on waiting in a queue: busy, never run.
        with writer.deadline(time.monotonic() - 0.1):
            with pytest.raises(DatabaseBusy):
                writer.run(lambda txn: ran.append(1))
        with notmuch_lock_held() as holder:
            # The nearer deadline wins over the Writer's timeout and over an inner deadline.
            with writer.deadline(time.monotonic() + 0.5), writer.deadline(time.monotonic() + 60):
                with pytest.raises(DatabaseBusy) as err:
                    writer.run(lambda txn: ran.append(2))
            assert err.value.waited <= 0.5
            holder.release()
        writer.run(lambda txn: ran.append(3))
    assert ran == [3]


def test_busy_counts_the_wait_from_when_the_caller_asked(indexed: MailEnv) -> None:
    """A write queued behind others is told how long it was kept waiting in all, not only
    the rest of its bound it spent on the lock itself."""
    with Writer(lock_timeout=5.0) as writer, notmuch_lock_held() as holder:
        asked = time.monotonic() - 3.0  # its first three seconds went on waiting in a queue
        with writer.deadline(asked + 3.5, asked=asked):
            with pytest.raises(DatabaseBusy, match=r"gave up after [3-9]\.\ds") as err:
                writer.run(lambda txn: None)
        assert err.value.waited >= 3.0
        with writer.deadline(time.monotonic() - 0.1, asked=asked):  # its time all gone
            with pytest.raises(DatabaseBusy, match=r"gave up after [3-9]\.\ds"):
                writer.run(lambda txn: None)
        holder.release()


def test_the_writer_holds_committing_only_while_a_batch_has_the_database(
        indexed: MailEnv) -> None:
    committing = threading.Lock()
    held_in_batch: list[bool] = []
    with Writer(lock_timeout=30.0, committing=committing) as writer:
        with notmuch_lock_held() as holder:
            batch = threading.Thread(
                target=lambda: writer.run(lambda txn: held_in_batch.append(committing.locked())))
            batch.start()
            time.sleep(0.3)  # let the batch reach its wait for the lock
            # Waiting for another program's lock, the writer leaves readers alone.
            assert committing.acquire(timeout=5)
            committing.release()
            holder.release()
            batch.join(timeout=30)
    assert held_in_batch == [True]
    assert not committing.locked()


def test_reader_sees_a_write_made_after_it_opened(indexed: MailEnv) -> None:
    with Reader() as reader, Writer() as writer:
        target = reader.messages("tag:inbox", limit=1)[0]
        before = reader.revision()
        assert reader.count("tag:fresh-tag") == 0
        # Written by another process, as a mail client would.
        indexed.notmuch("tag", "+fresh-tag", "--", f"id:{target.message_id}")
        assert reader.count("tag:fresh-tag") == 1
        assert reader.revision().number > before.number
        # And by our own writer.
        writer.run(lambda txn: txn.change_tags([target.message_id], remove=["fresh-tag"]))
        assert reader.count("tag:fresh-tag") == 0


def test_reader_lists_the_tags_of_the_index_as_it_stands(indexed: MailEnv) -> None:
    with Reader() as reader:
        target = reader.messages("tag:inbox", limit=1)[0]
        before = reader.all_tags()
        assert before == sorted(before) and "inbox" in before and "fresh-tag" not in before
        reader.all_tags().append("not-a-tag")  # a copy: the next caller is not misled
        assert reader.all_tags() == before
        indexed.notmuch("tag", "+fresh-tag", "--", f"id:{target.message_id}")
        assert reader.all_tags() == sorted([*before, "fresh-tag"])
        indexed.notmuch("tag", "-fresh-tag", "--", f"id:{target.message_id}")
        assert reader.all_tags() == before


def test_reader_applies_exclude_tags_from_the_config(indexed: MailEnv) -> None:
    with Reader() as reader, Writer() as writer:
        target = reader.messages("tag:inbox", limit=1)[0]
        total = reader.count("*")
        writer.run(lambda txn: txn.change_tags([target.message_id], add=["spam"]))
        assert reader.exclude_tags() == ("deleted", "spam")
        assert reader.count("*") == total - 1
        assert reader.count("*", exclude_tags=()) >= total


def test_reader_follows_an_edited_config_without_a_commit(indexed: MailEnv) -> None:
    with Reader() as reader:
        assert reader.exclude_tags() == ("deleted", "spam")
        before = reader.revision()
        indexed.notmuch("config", "set", "search.exclude_tags", "deleted")
        assert reader.exclude_tags() == ("deleted",)
        assert reader.revision() == before  # no commit told it


def test_reader_is_confined_to_its_thread(indexed: MailEnv) -> None:
    errors: list[BaseException] = []
    with Reader() as reader:
        reader.count("*")

        def other() -> None:
            try:
                reader.count("*")
            except BaseException as exc:  # noqa: BLE001 - collected for the assert
                errors.append(exc)
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert errors and "thread" in str(errors[0])


def test_missing_headers_do_not_break_listing(shared_indexed: MailEnv) -> None:
    with Reader() as reader:
        everything = reader.messages("*", exclude_tags=())
    assert len(everything) == int(shared_indexed.notmuch("count", "--exclude=false", "*").stdout)
    assert any(m.subject == "" for m in everything)  # the fixture has a message with no Subject


def test_index_command_picks_up_new_mail_and_reports_counts(indexed: MailEnv) -> None:
    new_mail = indexed.mail_root / "work" / "INBOX" / "new" / "1800000001.1_1.test,U=9998"
    new_mail.write_bytes(b"From: Ola <ola@example.net>\nTo: amorgan@acme.test\nSubject: ping\n"
                         b"Message-ID: <ping-1@example.net>\nDate: Tue, 01 Dec 2026 10:00:00 +0000"
                         b"\n\nping\n")
    out = indexed.fmail("index", "--quiet").stdout
    assert "indexed: 1 new" in out
    assert tags_of(indexed, "ping-1@example.net") == {"inbox", "unread"}


def test_init_without_config_or_mail_root_is_a_clear_error(mail_env: MailEnv) -> None:
    done = mail_env.fmail("init", check=False)
    assert done.returncode == 2
    assert "no notmuch config found" in done.stderr
    assert not mail_env.notmuch_config.exists()


def test_progress_bar_renders_notmuch_progress_lines() -> None:
    from fmail_nm.service.index import progress_bar
    assert progress_bar("Processed 50 of 200 files (1s remaining)      \r") == (
        "indexing [#######.......................] 50/200 files")
    assert progress_bar("Processed 7 files") == "indexing: 7 files"
    assert progress_bar("Added 3 new messages to the database.") is None


def test_the_index_summary_counts_are_notmuchs_from_the_mirror_or_while_it_lags(
        indexed: MailEnv) -> None:
    from fmail_nm.passes.mirror import sync_sidecar
    from fmail_nm.service.index import SUMMARY_TAGS, _kept_summary, summary_counts

    def truth(reader: Reader) -> tuple[int, dict[str, int]]:
        return (reader.count("*", exclude_tags=()),
                {tag: reader.count(f"tag:{tag}", exclude_tags=()) for tag in SUMMARY_TAGS})

    config = indexed.config()
    with Reader() as reader:
        assert _kept_summary(config, reader) is not None  # the mirror answers
        assert summary_counts(config, reader) == truth(reader)
        indexed.notmuch("tag", "+flagged", "-inbox", "--", "tag:inbox")
        assert _kept_summary(config, reader) is None  # the mirror lags: notmuch counts
        assert summary_counts(config, reader) == truth(reader)
        assert summary_counts(config, reader)[1]["inbox"] == 0
        sync_sidecar(config, reader)
        assert _kept_summary(config, reader) == truth(reader)


def test_demo_indexes_its_own_copy_of_the_sample_mail(mail_env: MailEnv) -> None:
    demo_dir = mail_env.base / "demo"
    out = mail_env.fmail("demo", "--dir", str(demo_dir), "--no-serve").stdout
    assert "indexed: 169 new, 169 messages in all" in out
    assert (demo_dir / "notmuch-config").is_file()
    # The demo never touches the caller's own setup.
    assert not mail_env.notmuch_config.exists()
    again = mail_env.fmail("demo", "--dir", str(demo_dir), "--no-serve").stdout
    assert "indexed: 0 new, 169 messages in all" in again


def test_the_demo_reads_none_of_the_users_own_account_files(mail_env: MailEnv) -> None:
    """An account `fmail-nm account add` wrote into the user's own accounts.toml is no account
    of the demo's: read against the sample mail, its folder is not there and the demo failed.
    Nor is the user's ~/.mbsyncrc the demo's: a channel of the sample's account name set the
    layout its folders were read with."""
    own = Path(mail_env.env["XDG_CONFIG_HOME"]) / "fmail-nm"
    own.mkdir(parents=True)
    (own / "accounts.toml").write_text('[[accounts]]\nname = "side"\nmaildir = "side"\n')
    (Path(mail_env.env["HOME"]) / ".mbsyncrc").write_text(
        "MaildirStore mine\nInbox ~/Maildir/\nSubFolders Maildir++\n\n"
        "Channel personal\nNear :mine:\nFar :remote:\n")
    demo_dir = mail_env.base / "demo"
    out = mail_env.fmail("demo", "--dir", str(demo_dir), "--no-serve").stdout
    assert "indexed: 169 new, 169 messages in all" in out
    layout = subprocess.run(
        [sys.executable, "-c", "from fmail_nm.app import load_config; "
         "print(load_config().account('personal').layout)"],
        env={**os.environ, **mail_env.env, **demo_environment(demo_dir)},
        capture_output=True, text=True, timeout=60, check=True).stdout
    assert layout.strip() == "FolderLayout(subfolders=None, flatten=None)"


def test_rule_placeholders_expand_to_queries_notmuch_accepts(shared_indexed: MailEnv) -> None:
    from fmail_nm.store.query import folders_query, me_query
    with Reader() as reader:
        # No addresses / no folders: a query that matches nothing, not a syntax error.
        assert reader.count(me_query([]), exclude_tags=()) == 0
        assert reader.count(folders_query([]), exclude_tags=()) == 0
        # Addresses that could change a query's meaning are left out.
        assert me_query(['x" OR tag:inbox OR "y@z', "*@example.org"]) == me_query([])
        assert reader.count(me_query(["alex@example.org"]), exclude_tags=()) > 0
        assert reader.count(folders_query(["personal/Trash", "work/Trash"]), exclude_tags=()) == 4  # fixtures: 2 + 2


MANY_LONG_RECIPIENTS = ("From: Sam Reed <sam@example.net>\nTo: " + ", ".join(
    f'"Recipient Number {n} With A Rather Long Display Name, Department of Examples" '
    f"<recipient.number.{n}.with.long.address@subdomain.example.com>" for n in range(8))
    + "\nSubject: Big list\nDate: Tue, 01 Dec 2026 09:00:00 +0000\n"
      "Message-ID: <many-long-recipients@example.net>\n\nHi all.\n").encode()


def test_long_recipient_lists_are_indexed_without_crashing_notmuch(indexed: MailEnv) -> None:
    """A notmuch property over ~220 bytes makes libnotmuch abort the process: recipients live
    in the sidecar only, every one of them, and nothing of theirs goes into notmuch."""
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1796400000.1_1.host").write_bytes(
        MANY_LONG_RECIPIENTS)
    indexed.fmail("index", "--quiet")
    tags = indexed.notmuch("search", "--output=tags", "id:many-long-recipients@example.net").stdout
    assert "inbox" in tags.split() and "new" not in tags.split()
    stored = sidecar.recipients_of(indexed.config().data_dir, ["many-long-recipients@example.net"])
    assert [r["email"] for r in stored["many-long-recipients@example.net"]] == [
        f"recipient.number.{n}.with.long.address@subdomain.example.com" for n in range(8)]
    with Reader() as reader:
        assert reader.property("many-long-recipients@example.net", "fmail.recipients") is None


def test_an_absurd_list_id_still_gets_a_list_tag(indexed: MailEnv) -> None:
    list_id = "x" * 400 + ".lists.example.net"
    raw = (f"From: List <list@example.net>\nTo: alex@example.org\nList-Id: <{list_id}>\n"
           "Subject: hello\nDate: Tue, 01 Dec 2026 09:00:00 +0000\n"
           "Message-ID: <long-list-id@example.net>\n\nbody\n").encode()
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1796400001.1_1.host").write_bytes(raw)
    indexed.fmail("index", "--quiet")
    tags = indexed.notmuch("search", "--output=tags", "id:long-list-id@example.net").stdout.split()
    assert "list" in tags and "new" not in tags
    assert [t for t in tags if t.startswith("list/")] == ["list/" + "x" * 150]
