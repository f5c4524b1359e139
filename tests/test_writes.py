"""The write tools on a private, indexed copy of the fixture mail: real notmuch, real files.

Each write is checked three ways: the tags and files notmuch reports (through the CLI, not our
own reader), the files on disk (folder, cur/, no ,U=, Maildir flags), and that ``notmuch new``
finds nothing to correct -- index and Maildir in step.
"""

from __future__ import annotations

import dataclasses
import fcntl
import io
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fmail_nm import dsl, flock
from fmail_nm.errors import FmailError
from fmail_nm.clock import utc_now, utc_stamp
from fmail_nm.config import Config
from fmail_nm.passes import changes
from fmail_nm.passes.changes import ChangeError, WriteContext, WriteOutcome
from fmail_nm.passes.mirror import sync_sidecar
from fmail_nm.service.index import run_index
from fmail_nm.store import maildir, sidecar
from fmail_nm.store import notmuch as notmuch_store
from fmail_nm.store.maildir import MaildirName
from fmail_nm.store.notmuch import DatabaseBusy, Reader, Writer
from fmail_nm.tools import compose, reads, writes
from fmail_nm.tools.contacts import MailEffect
from fmail_nm.tools.reads import Mailbox, ToolError

from .conftest import LockHolder, MailEnv, notmuch_lock_held, run_init

UNREAD_IN_CUR = "html-only-1@coop.example.com"  # personal/INBOX/cur, no S
IN_INBOX = "school-trip-3@example.com"  # personal/INBOX/cur, read
IN_NEW_NO_INFO = "mum-visit-2026@example.net"  # personal/INBOX/new, name without ":2,"
IN_ARCHIVE = "wedding-1@example.net"  # personal/Archive
IN_TRASH = "trash-2@example.net"  # personal/Trash, tagged deleted by post-new
WORK_INBOX = "work-deep-1@acme.test"  # work has no Junk (and no Archive) folder
SELF_CC = "self-cc-1@example.org"  # personal/Sent + personal/INBOX
BOTH_ACCOUNTS = "both-accounts-1@example.com"  # personal/INBOX + work/INBOX


# ---------------------------------------------------------------------------------------------
# Set-up and what we look at


class Harness:
    def __init__(self, env: MailEnv, ctx: WriteContext) -> None:
        self.env = env
        self.ctx = ctx
        self.outcomes: list[WriteOutcome] = []

    def tags(self, mid: str) -> set[str]:
        out = self.env.notmuch("search", "--output=tags", "--exclude=false", f"id:{mid}").stdout
        return set(out.split())

    def files(self, mid: str) -> list[str]:
        """The message's files as notmuch has them, relative to the mail root, sorted."""
        out = self.env.notmuch("search", "--output=files", "--exclude=false", f"id:{mid}").stdout
        return sorted(Path(p).relative_to(self.env.mail_root).as_posix()
                      for p in out.split("\n") if p)

    def folders(self, mid: str) -> list[str]:
        return sorted(str(Path(f).parent.parent) for f in self.files(mid))

    def shape(self, mid: str) -> tuple[frozenset[str], list[tuple[str, str, str]]]:
        """Tags and (folder, unique part, flags) of every file: what an undo must restore."""
        files = []
        for f in self.files(mid):
            name = MaildirName.parse(Path(f).name)
            files.append((str(Path(f).parent.parent), name.key, name.flags))
        return frozenset(self.tags(mid)), sorted(files)

    def count(self, query: str) -> int:
        return int(self.env.notmuch("count", "--exclude=false", query).stdout)

    def assert_in_step(self) -> None:
        """Every file on disk is indexed and every indexed file exists."""
        out = self.env.notmuch("new", "--no-hooks").stdout.strip()
        assert out == "No new mail.", out

    def audit(self) -> list[tuple[Any, ...]]:
        with sidecar.opened(self.ctx.sidecar_file) as conn:
            return conn.execute("SELECT id, action, params, changes, undone_at FROM audit_log "
                                "ORDER BY id").fetchall()


def flags_of(relative: str) -> str:
    return MaildirName.parse(Path(relative).name).flags


def assert_moved_name(relative: str, folder: str) -> None:
    assert relative.startswith(folder + "/cur/"), relative
    assert ",U=" not in relative
    assert ":2," in relative


@pytest.fixture
def h(indexed: MailEnv) -> Iterator[Harness]:
    config = indexed.config()
    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config=config, reader=reader, writer=writer,
                                  sidecar_file=sidecar.sidecar_path(config.data_dir))
        harness = Harness(indexed, ctx)
        ctx.after_write = harness.outcomes.append
        yield harness


# ---------------------------------------------------------------------------------------------
# Tags and flags


def test_read_and_unread_follow_in_tags_and_maildir_flags(h: Harness) -> None:
    assert "unread" in h.tags(UNREAD_IN_CUR)
    result = writes.set_read(h.ctx, [UNREAD_IN_CUR], True)
    assert result.applied == [UNREAD_IN_CUR] and not result.errors and result.audit_id
    assert "unread" not in h.tags(UNREAD_IN_CUR)
    [path] = h.files(UNREAD_IN_CUR)
    assert "S" in flags_of(path)
    assert h.count(f"id:{UNREAD_IN_CUR} AND tag:unread") == 0

    writes.update_email_status(h.ctx, [UNREAD_IN_CUR], "unread")
    assert "unread" in h.tags(UNREAD_IN_CUR)
    [path] = h.files(UNREAD_IN_CUR)
    assert "S" not in flags_of(path) and path.startswith("personal/INBOX/")
    h.assert_in_step()


@pytest.mark.parametrize("spelling", ["yes", "YES", "1"])
def test_synchronize_flags_spelled_another_way_notmuch_accepts_still_renames_files(
        indexed: MailEnv, spelling: str) -> None:
    """notmuch reads yes/true/1 in any case as on (`notmuch tag -unread` renames the file):
    a write must too, or the Seen flag never reaches the file, nor the server."""
    indexed.notmuch("config", "set", "maildir.synchronize_flags", spelling)
    config = indexed.config()
    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        assert writes.set_read(ctx, [UNREAD_IN_CUR], True).applied == [UNREAD_IN_CUR]
        [path] = Harness(indexed, ctx).files(UNREAD_IN_CUR)
    assert "S" in flags_of(path)


def test_mark_as_takes_only_read_or_unread(h: Harness) -> None:
    with pytest.raises(ToolError, match="'read' or 'unread'"):
        writes.update_email_status(h.ctx, [IN_INBOX], "seen")
    assert h.audit() == []


def test_reading_a_file_in_new_moves_it_to_cur_with_s(h: Harness) -> None:
    writes.set_read(h.ctx, [IN_NEW_NO_INFO], True)
    [path] = h.files(IN_NEW_NO_INFO)
    assert path.startswith("personal/INBOX/cur/") and flags_of(path) == "S"
    h.assert_in_step()


def test_flagging_sets_and_clears_f(h: Harness) -> None:
    writes.set_flagged(h.ctx, [IN_INBOX], True)
    assert "flagged" in h.tags(IN_INBOX)
    assert "F" in flags_of(h.files(IN_INBOX)[0])
    writes.set_flagged(h.ctx, [IN_INBOX], False)
    assert "flagged" not in h.tags(IN_INBOX)
    assert "F" not in flags_of(h.files(IN_INBOX)[0])
    h.assert_in_step()


def test_tag_emails_adds_and_removes(h: Harness) -> None:
    writes.tag_emails(h.ctx, [IN_INBOX], add=["old"])
    result = writes.tag_emails(h.ctx, [IN_INBOX, IN_ARCHIVE], add=["todo", "project/x"],
                               remove=["old"])
    assert sorted(result.applied) == sorted([IN_INBOX, IN_ARCHIVE])
    assert {"todo", "project/x"} <= h.tags(IN_INBOX) and "old" not in h.tags(IN_INBOX)
    assert h.count("tag:todo") == 2
    # Tags alone touch no file: the follow-up needs a sidecar sync but no mbsync push.
    assert h.outcomes[-1].accounts == frozenset()
    assert set(h.outcomes[-1].message_ids) == {IN_INBOX, IN_ARCHIVE}


@pytest.mark.parametrize("bad", ["", "two words", "-minus", "x" * 101, "tab\there"])
def test_tag_names_are_checked(h: Harness, bad: str) -> None:
    with pytest.raises(ToolError):
        writes.tag_emails(h.ctx, [IN_INBOX], add=[bad])
    assert h.audit() == []


def test_a_tag_both_added_and_removed_is_refused(h: Harness) -> None:
    with pytest.raises(ToolError, match="both added and removed"):
        writes.tag_emails(h.ctx, [IN_INBOX], add=["a"], remove=["a"])


def test_ids_may_be_uids_or_bracketed_and_unknown_ones_are_reported(h: Harness) -> None:
    uid = sidecar.uid_for(IN_ARCHIVE)  # the mirror may or may not have it yet
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        conn.execute(
            "INSERT OR IGNORE INTO messages (message_id, uid, thread_id, folders, subject, "
            "sender_email, sender_name, recipients, body_preview, is_read, is_flagged, "
            "is_replied, is_draft, is_sent, has_attachment, tags, filenames) "
            "VALUES (?, ?, 't', '[]', '', '', '', '[]', '', 1, 0, 0, 0, 0, 0, '[]', '[]')",
            (IN_ARCHIVE, uid))
    result = writes.tag_emails(h.ctx, [uid, f"<{IN_INBOX}>", "nobody@nowhere.test",
                                       "0123456789abcdef"], add=["picked"])
    assert sorted(result.applied) == sorted([IN_ARCHIVE, IN_INBOX])
    assert result.not_found == ["nobody@nowhere.test", "0123456789abcdef"]
    assert "picked" in h.tags(IN_ARCHIVE) and "picked" in h.tags(IN_INBOX)


# ---------------------------------------------------------------------------------------------
# Moves


def test_archive_moves_the_inbox_file_and_strips_the_uid(h: Harness) -> None:
    [before] = h.files(IN_INBOX)
    assert ",U=" in before
    result = writes.archive(h.ctx, [IN_INBOX])
    assert result.applied == [IN_INBOX] and not result.errors
    [after] = h.files(IN_INBOX)
    assert_moved_name(after, "personal/Archive")
    assert flags_of(after) == flags_of(before)
    assert not (h.env.mail_root / before).exists() and (h.env.mail_root / after).exists()
    tags = h.tags(IN_INBOX)
    assert "archived" in tags and "inbox" not in tags
    assert h.outcomes[-1].accounts == frozenset({"personal"})
    h.assert_in_step()


def test_a_file_from_new_lands_in_cur_with_an_info_part(h: Harness) -> None:
    writes.archive(h.ctx, [IN_NEW_NO_INFO])
    [after] = h.files(IN_NEW_NO_INFO)
    assert_moved_name(after, "personal/Archive")
    assert flags_of(after) == ""  # still unread: no S
    assert {"archived", "unread"} <= h.tags(IN_NEW_NO_INFO)
    h.assert_in_step()


def test_delete_then_restore_returns_to_the_origin_folder(h: Harness) -> None:
    writes.delete_messages(h.ctx, [IN_ARCHIVE])
    [trashed] = h.files(IN_ARCHIVE)
    assert_moved_name(trashed, "personal/Trash")
    assert "deleted" in h.tags(IN_ARCHIVE) and "archived" not in h.tags(IN_ARCHIVE)
    assert h.count(f"id:{IN_ARCHIVE}") == 1  # deleted, not gone
    result = writes.restore(h.ctx, [IN_ARCHIVE])
    assert result.applied == [IN_ARCHIVE]
    [back] = h.files(IN_ARCHIVE)
    assert_moved_name(back, "personal/Archive")
    tags = h.tags(IN_ARCHIVE)
    assert "archived" in tags and "deleted" not in tags and "inbox" not in tags
    h.assert_in_step()


def test_junk_from_trash_keeps_where_the_mail_came_from(h: Harness) -> None:
    """Deleted from Archive, then marked as junk from Trash: restore puts it back in Archive
    (Trash is no home to go back to)."""
    writes.delete_messages(h.ctx, [IN_ARCHIVE])
    writes.move_to_junk(h.ctx, [IN_ARCHIVE])
    assert h.folders(IN_ARCHIVE) == ["personal/Junk"]
    writes.restore(h.ctx, [IN_ARCHIVE])
    assert h.folders(IN_ARCHIVE) == ["personal/Archive"]
    h.assert_in_step()


def test_undo_does_not_make_again_a_folder_removed_since(h: Harness) -> None:
    """Mail moved to a folder, deleted from it, and the folder removed (in another client):
    undoing the delete puts the mail in the inbox, as restore does, and says so -- a folder
    made again here, mbsync would make again on the server."""
    projects = h.env.mail_root / "personal" / "Projects"
    for sub in ("cur", "new", "tmp"):
        (projects / sub).mkdir(parents=True)
    assert writes.move_to_folder(h.ctx, [IN_INBOX], "Projects").applied == [IN_INBOX]
    assert writes.delete_messages(h.ctx, [IN_INBOX]).applied == [IN_INBOX]
    shutil.rmtree(projects)
    h.env.notmuch("new", "--no-hooks")
    undone = writes.undo_last_write(h.ctx)
    assert not projects.exists()
    assert h.folders(IN_INBOX) == ["personal/INBOX"]
    assert "deleted" not in h.tags(IN_INBOX) and "inbox" in h.tags(IN_INBOX)
    assert any("personal/Projects" in e.error and "removed" in e.error for e in undone.errors)
    h.assert_in_step()


def test_restore_remembers_the_origin_in_notmuch_not_the_sidecar(h: Harness) -> None:
    writes.delete_messages(h.ctx, [IN_ARCHIVE])
    h.ctx.sidecar_file.unlink()  # a rebuilt sidecar knows nothing of past writes
    writes.restore(h.ctx, [IN_ARCHIVE])
    assert h.folders(IN_ARCHIVE) == ["personal/Archive"]


def test_restore_without_a_known_origin_goes_to_the_inbox(h: Harness) -> None:
    assert "deleted" in h.tags(IN_TRASH)
    writes.restore(h.ctx, [IN_TRASH])
    [back] = h.files(IN_TRASH)
    assert_moved_name(back, "personal/INBOX")
    tags = h.tags(IN_TRASH)
    assert "inbox" in tags and "deleted" not in tags
    h.assert_in_step()


def test_restore_into_a_folder_removed_since_goes_to_the_inbox(h: Harness) -> None:
    """The origin folder was removed after the config was loaded (as in a long-running
    server): it is not made again (mbsync would make it on the server too)."""
    projects = h.env.mail_root / "personal" / "Projects"
    for sub in ("cur", "new", "tmp"):
        (projects / sub).mkdir(parents=True)
    h.ctx.config = h.env.config()  # loaded while Projects is there
    writes.move_to_folder(h.ctx, [IN_INBOX], "Projects")
    writes.delete_messages(h.ctx, [IN_INBOX])
    shutil.rmtree(projects)
    assert "personal/Projects" in h.ctx.config.folders
    writes.restore(h.ctx, [IN_INBOX])
    assert h.folders(IN_INBOX) == ["personal/INBOX"]
    assert not projects.exists()
    h.assert_in_step()


def test_junk_and_back(h: Harness) -> None:
    writes.move_to_junk(h.ctx, [IN_INBOX])
    [junked] = h.files(IN_INBOX)
    assert_moved_name(junked, "personal/Junk")
    assert "spam" in h.tags(IN_INBOX) and "inbox" not in h.tags(IN_INBOX)
    writes.restore(h.ctx, [IN_INBOX])
    assert h.folders(IN_INBOX) == ["personal/INBOX"]
    assert "inbox" in h.tags(IN_INBOX) and "spam" not in h.tags(IN_INBOX)
    h.assert_in_step()


def assert_refused(result: writes.WriteResult, mid: str, why: str) -> None:
    """The write applied nothing, and said why for this one message."""
    assert result.applied == []
    [error] = result.errors
    assert error.id == mid and why in error.error, error


def test_a_missing_role_folder_is_a_clear_error_and_changes_nothing(h: Harness) -> None:
    before = h.shape(WORK_INBOX)
    result = writes.move_to_junk(h.ctx, [WORK_INBOX])
    assert_refused(result, WORK_INBOX, "'work' has no junk folder")
    assert h.shape(WORK_INBOX) == before
    assert result.audit_id is None and h.audit() == [] and h.outcomes == []
    h.assert_in_step()


def test_a_configured_folder_missing_on_disk_is_created(indexed: MailEnv) -> None:
    with indexed.fmail_config.open("a") as fh:  # work's folder table is the file's last one
        fh.write('archive = "Archive"\n')
    assert not (indexed.mail_root / "work" / "Archive").exists()
    config = indexed.config()
    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        result = writes.archive(ctx, [WORK_INBOX])
    assert result.applied == [WORK_INBOX]
    for sub in ("cur", "new", "tmp"):
        assert (indexed.mail_root / "work" / "Archive" / sub).is_dir()
        harness = Harness(indexed, ctx)
        files = harness.files(WORK_INBOX)
        assert len(files) == 1
        assert_moved_name(files[0], "work/Archive")
        harness.assert_in_step()


def test_move_to_folder_by_account_relative_or_full_path(h: Harness) -> None:
    for sub in ("cur", "new", "tmp"):
        (h.env.mail_root / "personal" / "Projects" / "2026" / sub).mkdir(parents=True)
    result = writes.move_to_folder(h.ctx, [IN_INBOX], "Projects/2026")
    assert result.applied == [IN_INBOX]
    [moved] = h.files(IN_INBOX)
    assert_moved_name(moved, "personal/Projects/2026")
    # A plain folder means "filed": no longer in the inbox, not deleted or archived.
    assert not h.tags(IN_INBOX) & {"inbox", "deleted", "spam", "archived"}

    writes.move_to_folder(h.ctx, [IN_INBOX], "personal/INBOX")
    assert h.folders(IN_INBOX) == ["personal/INBOX"]
    assert "inbox" in h.tags(IN_INBOX)
    h.assert_in_step()


def test_mail_moved_into_drafts_is_a_draft_until_it_leaves(h: Harness) -> None:
    """Mail moved into Drafts is tagged as mail that arrived there: a draft (D flag too, so
    the server shows it as one), out of the inbox, and the user's own no sent mail.  Someone
    else's, moved back out, is mail like any other again, D flag gone; the user's own stays
    a draft until it is in Sent."""
    sent = "wedding-2@example.org"  # personal/Sent, tagged sent
    assert "sent" in h.tags(sent)
    assert writes.move_to_folder(h.ctx, [IN_INBOX, sent], "Drafts").applied == [IN_INBOX, sent]
    for mid in (IN_INBOX, sent):
        assert "draft" in h.tags(mid) and not h.tags(mid) & {"inbox", "sent"}, h.tags(mid)
        [moved] = h.files(mid)
        assert_moved_name(moved, "personal/Drafts")
        assert "D" in flags_of(moved)
    writes.move_to_folder(h.ctx, [IN_INBOX], "INBOX")
    assert "inbox" in h.tags(IN_INBOX) and "draft" not in h.tags(IN_INBOX)
    assert "D" not in flags_of(h.files(IN_INBOX)[0])
    # The user's own mail in Drafts is a draft of theirs: filed away it is still no sent mail.
    writes.move_to_folder(h.ctx, [sent], "Archive")
    assert "draft" in h.tags(sent) and "sent" not in h.tags(sent), h.tags(sent)
    assert "D" in flags_of(h.files(sent)[0])
    writes.move_to_folder(h.ctx, [sent], "Sent")
    assert "sent" in h.tags(sent) and "draft" not in h.tags(sent), h.tags(sent)
    h.assert_in_step()


def test_a_draft_filed_away_without_the_users_addresses_known_stays_a_draft(h: Harness) -> None:
    """init may finish without an address: no draft can be told from someone else's mail
    dragged into Drafts then, and each stays a draft when filed, D flag too."""
    filed = compose.save_draft(h.ctx, ["zoe@example.net"], subject="unsent", body="words")
    config = h.ctx.config
    bare = dataclasses.replace(
        config, settings=dataclasses.replace(config.settings, addresses=()),
        accounts=tuple(dataclasses.replace(a, addresses=()) for a in config.accounts))
    assert bare.addresses == ()
    writes.move_to_folder(dataclasses.replace(h.ctx, config=bare), [filed.message_id], "Archive")
    assert "draft" in h.tags(filed.message_id), h.tags(filed.message_id)
    assert "D" in flags_of(h.files(filed.message_id)[0])


def test_a_draft_filed_away_or_thrown_away_elsewhere_stays_a_draft_and_no_sent_mail(
        h: Harness) -> None:
    """A draft never sent is no sent mail wherever it goes but Sent: filed in the Archive by
    fmail-nm, thrown in the Trash by another client and restored (without a recorded origin:
    to the inbox)."""
    filed = compose.save_draft(h.ctx, ["zoe@example.net"], subject="unsent", body="words")
    writes.move_to_folder(h.ctx, [filed.message_id], "Archive")
    assert "draft" in h.tags(filed.message_id) and "sent" not in h.tags(filed.message_id), h.tags(filed.message_id)
    thrown = compose.save_draft(h.ctx, ["zoe@example.net"], subject="thrown", body="words")
    [path] = h.files(thrown.message_id)
    (h.env.mail_root / path).rename(h.env.mail_root / "personal/Trash/cur" / Path(path).name)
    h.env.notmuch("new")
    assert {"draft", "deleted"} <= h.tags(thrown.message_id), h.tags(thrown.message_id)
    writes.restore(h.ctx, [thrown.message_id])
    assert "draft" in h.tags(thrown.message_id) and "sent" not in h.tags(thrown.message_id), h.tags(thrown.message_id)
    h.assert_in_step()


def test_tag_emails_refuses_the_new_tag(h: Harness) -> None:
    with pytest.raises(ToolError, match="reserved"):
        writes.tag_emails(h.ctx, [IN_INBOX], add=["new"])
    assert "new" not in h.shape(IN_INBOX)[0]


@pytest.mark.parametrize(("change", "tool"), [
    ({"add": ["deleted"]}, "delete_messages"), ({"add": ["spam"]}, "move_to_junk"),
    ({"add": ["archived"]}, "archive"), ({"remove": ["deleted"]}, "restore"),
    ({"add": ["blocked"]}, "manage_contacts_sql"), ({"remove": ["blocked"]}, "manage_contacts_sql"),
])
def test_tag_emails_refuses_tags_another_tool_owns_and_names_it(
        h: Harness, change: dict[str, list[str]], tool: str) -> None:
    """A place tag by hand would leave the file where it is: tagged deleted, a message in
    INBOX vanished from every search yet stayed in the server's (and the phone's) inbox."""
    before = h.shape(IN_INBOX)
    with pytest.raises(ToolError, match=f"{tool}.*nothing was changed"):
        writes.tag_emails(h.ctx, [IN_INBOX], **change)
    assert h.shape(IN_INBOX) == before and h.audit() == []


def test_tag_emails_refuses_the_tags_the_users_folder_rules_give(mail_env: MailEnv) -> None:
    """`filed` is what this user's rules give mail in Archive: a move sets it, not a tag."""
    mail_env.fmail_config.write_text(mail_env.fmail_config.read_text() + CUSTOM_RULES)
    run_init(mail_env)
    config = mail_env.config()
    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        with pytest.raises(ToolError, match="'filed'.*rule.*move_to_folder"):
            writes.tag_emails(ctx, [IN_INBOX], add=["filed"])
        # todo: the catch-all rule's, which archiving only takes off -- the user's to end
        assert writes.tag_emails(ctx, [IN_INBOX], remove=["todo"]).applied == [IN_INBOX]
        assert writes.tag_emails(ctx, [IN_INBOX], add=["sent"]).applied == [IN_INBOX]


def test_inbox_is_taken_off_by_tag_also_where_archive_cannot(h: Harness) -> None:
    """notmuch's way of filing mail in place: the work account has no Archive folder, so
    archive cannot take its mail out of the inbox -- a tag can, and puts it back."""
    assert "inbox" in h.tags(WORK_INBOX)
    assert writes.archive(h.ctx, [WORK_INBOX]).applied == []
    assert writes.tag_emails(h.ctx, [WORK_INBOX], remove=["inbox"]).applied == [WORK_INBOX]
    assert "inbox" not in h.tags(WORK_INBOX)
    assert writes.tag_emails(h.ctx, [WORK_INBOX], add=["inbox"]).applied == [WORK_INBOX]
    assert "inbox" in h.tags(WORK_INBOX)
    h.assert_in_step()


def test_move_to_folder_refuses_unknown_and_escaping_folders(h: Harness) -> None:
    before = h.shape(IN_INBOX)
    with pytest.raises(ToolError, match="no folder 'Nowhere' in any account") as refused:
        writes.move_to_folder(h.ctx, [IN_INBOX], "Nowhere")
    assert "personal/Archive" in str(refused.value)
    with pytest.raises(ToolError, match="no folder 'Nowhere' in account 'work'"):
        writes.move_to_folder(h.ctx, [IN_INBOX], "Nowhere", account="work")
    for bad in ("../outside", "INBOX/cur", "", "/", ".notmuch"):
        with pytest.raises(ToolError, match="bad folder name"):
            writes.move_to_folder(h.ctx, [IN_INBOX], bad)
    assert h.shape(IN_INBOX) == before


def test_move_to_folder_never_moves_mail_into_another_account(h: Harness) -> None:
    """Another account's folder is another server's mailbox: a personal message is not
    moved to work/INBOX (mbsync would take it off the personal server), by name from the
    mail root or with account= given."""
    before = h.shape(IN_INBOX), h.shape(SELF_CC)
    result = writes.move_to_folder(h.ctx, [IN_INBOX], "work/INBOX")
    assert_refused(result, IN_INBOX, "folder 'work/INBOX' is in account 'work'")
    with pytest.raises(ToolError, match="messages move only within their own account"):
        writes.move_to_folder(h.ctx, [SELF_CC], "work/INBOX", account="personal")
    assert (h.shape(IN_INBOX), h.shape(SELF_CC)) == before
    assert h.audit() == [] and h.outcomes == []
    h.assert_in_step()


def test_a_move_never_overwrites_a_file_with_the_same_name(h: Harness) -> None:
    [before] = h.files(IN_INBOX)
    taken = h.env.mail_root / "personal" / "Archive" / "cur" / MaildirName.parse(
        Path(before).name).filename()
    taken.write_bytes(b"someone else's file\n")
    writes.archive(h.ctx, [IN_INBOX])
    [after] = h.files(IN_INBOX)
    assert_moved_name(after, "personal/Archive")
    assert h.env.mail_root / after != taken
    assert taken.read_bytes() == b"someone else's file\n"
    assert flags_of(after) == flags_of(before)
    taken.unlink()
    h.assert_in_step()


def test_a_move_is_one_atomic_rename_so_a_kill_cannot_leave_two_copies(h: Harness) -> None:
    """A hard link then an unlink left the message under both names when the server was
    killed between them (the fault suite found it); a rename is seen as one move event."""
    from watchdog.events import FileSystemEvent, FileSystemEventHandler
    from watchdog.observers import Observer

    class Events(FileSystemEventHandler):
        def __init__(self) -> None:
            self.seen: list[tuple[str, str, str]] = []

        def on_any_event(self, event: FileSystemEvent) -> None:
            if not event.is_directory and ".notmuch" not in str(event.src_path):
                self.seen.append((event.event_type, str(event.src_path),
                                  str(getattr(event, "dest_path", ""))))

    [before] = h.files(IN_INBOX)
    events, observer = Events(), Observer()
    observer.schedule(events, str(h.env.mail_root), recursive=True)
    observer.start()
    try:
        writes.archive(h.ctx, [IN_INBOX])
        [after] = h.files(IN_INBOX)
        moved = ("moved", str(h.env.mail_root / before), str(h.env.mail_root / after))
        for _ in range(100):
            if moved in events.seen:
                break
            time.sleep(0.05)
    finally:
        observer.stop()
        observer.join(timeout=10)
    assert moved in events.seen, events.seen
    assert not [e for e in events.seen if e[0] == "created"], events.seen
    h.assert_in_step()


def test_a_vanished_file_is_an_error_for_that_message_only(h: Harness) -> None:
    [gone] = h.files(IN_ARCHIVE)
    (h.env.mail_root / gone).unlink()
    result = writes.delete_messages(h.ctx, [IN_ARCHIVE, IN_INBOX])
    assert result.applied == [IN_INBOX]
    [error] = result.errors
    assert error.id == IN_ARCHIVE and "gone" in error.error
    assert h.files(IN_ARCHIVE) == [gone]  # index untouched for it
    assert h.folders(IN_INBOX) == ["personal/Trash"]
    [entry] = h.audit()
    assert [c["message_id"] for c in json.loads(entry[3])] == [IN_INBOX]


# ---------------------------------------------------------------------------------------------
# Several files per Message-ID


@pytest.mark.parametrize(("write", "folder", "tag"), [
    pytest.param(writes.delete_messages, "personal/Trash", "deleted", id="delete"),
    pytest.param(writes.move_to_junk, "personal/Junk", "spam", id="junk"),
])
def test_a_message_in_two_folders_goes_into_the_bin_once_and_restore_brings_both_back(
        h: Harness, write: Callable[..., writes.WriteResult], folder: str, tag: str) -> None:
    """Mail cc'd to oneself has a file in INBOX and one in Sent: deleting it moved both into
    Trash, two copies there (and on the server), and restore had two to bring back.  One
    goes; the other leaves its folder into that folder's hold; restore -- and undo -- put
    each back where it was."""
    before = h.shape(SELF_CC)
    assert h.folders(SELF_CC) == ["personal/INBOX", "personal/Sent"]
    result = write(h.ctx, [SELF_CC])
    assert result.applied == [SELF_CC] and not result.errors
    [binned] = h.files(SELF_CC)
    assert_moved_name(binned, folder)
    homes = {key: home for home, key, _ in before[1]}  # unique part -> folder
    [held] = _held(h)
    held_key = MaildirName.parse(held.name).key
    assert held.parent == h.env.mail_root / homes[held_key] / "tmp" / maildir.HOLD
    assert set(homes) == {held_key, MaildirName.parse(Path(binned).name).key}
    assert {tag, "inbox"} & h.tags(SELF_CC) == {tag}
    h.assert_in_step()

    restored = writes.restore(h.ctx, [SELF_CC])
    assert restored.applied == [SELF_CC] and not restored.errors
    assert h.shape(SELF_CC) == before and not _held(h)
    h.assert_in_step()
    assert not writes.undo_last_write(h.ctx).errors  # the restore: back in the bin and hold
    assert h.folders(SELF_CC) == [folder] and [p.name for p in _held(h)] == [held.name]
    assert not writes.undo_last_write(h.ctx).errors  # the write
    assert h.shape(SELF_CC) == before and not _held(h)
    h.assert_in_step()


@pytest.mark.parametrize("way_back", ["restore", "undo"])
def test_a_held_copy_comes_back_with_the_flags_the_message_has_now(
        h: Harness, way_back: str) -> None:
    """A held copy keeps the Maildir flags it had; marked unread and flagged meanwhile (here
    by another notmuch client), the message's Trash file was renamed and the held one came
    back saying read: mbsync uploads that, and notmuch new, seeing mbsync's rename of the
    upload, reads it back into the tags -- unread gone."""
    writes.delete_messages(h.ctx, [SELF_CC])
    h.env.notmuch("tag", "+unread", "+flagged", "--", f"id:{SELF_CC}")
    back = (writes.restore(h.ctx, [SELF_CC]) if way_back == "restore"
            else writes.undo_last_write(h.ctx))
    assert back.applied == [SELF_CC] and not back.errors
    assert h.folders(SELF_CC) == ["personal/INBOX", "personal/Sent"]
    assert [flags_of(f) for f in h.files(SELF_CC)] == ["F", "F"]
    assert {"unread", "flagged"} <= h.tags(SELF_CC)
    h.assert_in_step()


def _held(h: Harness) -> list[Path]:
    """Every held copy under the mail root."""
    return sorted(h.env.mail_root.glob(f"*/*/tmp/{maildir.HOLD}/*"))


def test_archive_of_mail_in_trash_says_so_and_changes_nothing(h: Harness) -> None:
    """It was reported applied while the message stayed in Trash (and, with no audit entry,
    a following undo took back an older write)."""
    before = h.shape(IN_TRASH)
    result = writes.archive(h.ctx, [IN_TRASH])
    assert_refused(result, IN_TRASH, "restore it first")
    assert h.shape(IN_TRASH) == before


def test_archive_moves_only_the_inbox_copy(h: Harness) -> None:
    writes.archive(h.ctx, [SELF_CC])
    assert h.folders(SELF_CC) == ["personal/Archive", "personal/Sent"]
    h.assert_in_step()


@pytest.mark.parametrize(("write", "folder", "tag"), [
    pytest.param(writes.archive, "personal/Archive", "archived", id="archive"),
    pytest.param(writes.delete_messages, "personal/Trash", "deleted", id="delete"),
    pytest.param(writes.move_to_junk, "personal/Junk", "spam", id="junk"),
])
def test_a_copy_bound_where_the_message_already_is_leaves_without_a_second_copy(
        h: Harness, write: Callable[..., writes.WriteResult], folder: str, tag: str) -> None:
    """Gmail keeps every message in "[Gmail]/All Mail" too: archiving into it moved the
    INBOX file there, a second file of the message that mbsync uploads (a true duplicate on a
    server that does not merge by Message-ID).  The INBOX copy leaves INBOX -- out of the
    index, kept on disk in INBOX's hold -- and undo brings it back."""
    [inbox_file] = h.files(IN_INBOX)
    there = _second_file(h, IN_INBOX, folder)
    before = h.shape(IN_INBOX)
    assert h.folders(IN_INBOX) == sorted(["personal/INBOX", folder])

    result = write(h.ctx, [IN_INBOX])
    assert result.applied == [IN_INBOX] and not result.errors
    assert h.files(IN_INBOX) == [there.relative_to(h.env.mail_root).as_posix()]
    assert {tag, "inbox"} & h.tags(IN_INBOX) == {tag}
    assert h.outcomes[-1].accounts == frozenset({"personal"})  # INBOX lost it: pushed
    key = MaildirName.parse(Path(inbox_file).name).key
    assert not [p for p in (h.env.mail_root / folder).glob("*/*")
                if MaildirName.parse(p.name).key == key]  # no second file there
    [held] = (h.env.mail_root / "personal/INBOX/tmp" / maildir.HOLD).iterdir()
    assert MaildirName.parse(held.name).key == key
    h.assert_in_step()  # notmuch new leaves the held copy alone

    undone = writes.undo_last_write(h.ctx)
    assert undone.applied == [IN_INBOX] and not undone.errors
    assert h.shape(IN_INBOX) == before
    assert not held.exists()
    h.assert_in_step()


@pytest.mark.parametrize(("write", "folder"), [
    pytest.param(writes.delete_messages, "personal/Trash", id="delete"),
    pytest.param(writes.move_to_junk, "personal/Junk", id="junk"),
])
def test_restore_brings_back_the_copy_a_write_held(
        h: Harness, write: Callable[..., writes.WriteResult], folder: str) -> None:
    """Deleting mail that Trash holds already put its INBOX copy in the hold; restore took
    the Trash file to INBOX and left the held copy to be pruned.  Restore puts the held copy
    back, as undo does; the bin's file, bound for the folder that has the message again,
    leaves the bin into the bin's hold."""
    _second_file(h, IN_INBOX, folder)
    before = h.shape(IN_INBOX)
    write(h.ctx, [IN_INBOX])
    [held] = _held(h)

    restored = writes.restore(h.ctx, [IN_INBOX])
    assert restored.applied == [IN_INBOX] and not restored.errors
    [back] = h.files(IN_INBOX)
    assert back.startswith("personal/INBOX/cur/") and not held.exists()
    assert MaildirName.parse(Path(back).name).key == MaildirName.parse(held.name).key
    [binned] = _held(h)
    assert binned.parent == h.env.mail_root / folder / "tmp" / maildir.HOLD
    assert {"inbox", "deleted", "spam"} & h.tags(IN_INBOX) == {"inbox"}
    h.assert_in_step()
    assert not writes.undo_last_write(h.ctx).errors  # the restore
    assert [p.name for p in _held(h)] == [held.name]
    assert not writes.undo_last_write(h.ctx).errors  # the write
    assert h.shape(IN_INBOX) == before and not _held(h)
    h.assert_in_step()


def test_a_held_copy_is_kept_for_a_while_then_removed_by_an_index_run(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every message a Gmail user archives leaves its INBOX file in the hold: kept for
    undo, but not for ever (it would double the archive on disk).  An index run removes the
    held copies older than HOLD_DAYS; the undo of that write then names the copy gone."""
    _second_file(h, IN_INBOX, "personal/Archive")
    writes.archive(h.ctx, [IN_INBOX])
    [held] = (h.env.mail_root / "personal/INBOX/tmp" / maildir.HOLD).iterdir()
    run_index(h.ctx.config, show_progress=False, timeout=120)
    assert held.exists()  # a fresh one stays

    monkeypatch.setattr(maildir, "HOLD_DAYS", 0)
    run_index(h.ctx.config, show_progress=False, timeout=120)
    assert not held.exists()
    assert h.folders(IN_INBOX) == ["personal/Archive"]  # the message keeps its other file
    undone = writes.undo_last_write(h.ctx)
    [error] = undone.errors
    assert error.id == IN_INBOX and "not moved back" in error.error
    h.assert_in_step()


def test_a_held_copy_takes_the_place_of_the_file_it_was_held_for_when_that_goes(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Archived while Archive had a file of it too, the message's INBOX file is held.  When
    that Archive file goes (another client deleted it), notmuch drops the message and the
    held copy was its last one anywhere -- pruned a month later.  It takes the place of the
    file it was held for, with the message's tags; a prune never removes a held copy whose
    message has no file in the index; and undo takes it back to INBOX."""
    _second_file(h, IN_INBOX, "personal/Archive")
    writes.archive(h.ctx, [IN_INBOX])
    with Reader() as reader:
        sync_sidecar(h.ctx.config, reader)  # as the server does after each write
    tags = h.tags(IN_INBOX)
    [held] = _held(h)
    _vanish(h, IN_INBOX)
    h.env.notmuch("new", "--no-hooks")  # the message leaves the index; no post-new pass yet
    monkeypatch.setattr(maildir, "HOLD_DAYS", 0)
    with Reader() as reader:
        maildir.prune_holds(h.ctx.config, reader)
    assert held.exists()

    run_index(h.ctx.config, show_progress=False, timeout=120)
    assert h.folders(IN_INBOX) == ["personal/Archive"] and not _held(h)
    assert h.tags(IN_INBOX) == tags
    h.assert_in_step()
    undone = writes.undo_last_write(h.ctx)
    assert undone.applied == [IN_INBOX] and not undone.errors
    assert h.folders(IN_INBOX) == ["personal/INBOX"]
    h.assert_in_step()


def _second_file(h: Harness, mid: str, folder: str) -> Path:
    """Another file of the message's one file, in ``folder``, indexed."""
    [first] = h.files(mid)
    there = h.env.mail_root / folder / "cur" / "1796400000.M1P1.there:2,S"
    shutil.copyfile(h.env.mail_root / first, there)
    h.env.notmuch("new", "--no-hooks")
    return there


def test_an_undo_rolled_back_puts_a_held_copy_back_in_the_hold(h: Harness) -> None:
    _second_file(h, IN_INBOX, "personal/Archive")
    writes.archive(h.ctx, [IN_INBOX, SELF_CC])
    archived = h.shape(IN_INBOX)
    hold = h.env.mail_root / "personal/INBOX/tmp" / maildir.HOLD
    [held] = hold.iterdir()
    _vanish(h, SELF_CC)  # its Archive file: its undo cannot start, so none may

    with pytest.raises(ChangeError, match="nothing was undone"):
        writes.undo_last_write(h.ctx)
    assert h.shape(IN_INBOX) == archived
    assert [p.name for p in hold.iterdir()] == [held.name]
    h.env.notmuch("new", "--no-hooks")  # the vanished file: notmuch is told now
    result = writes.undo_last_write(h.ctx)
    assert IN_INBOX in result.applied
    assert h.folders(IN_INBOX) == ["personal/Archive", "personal/INBOX"]
    assert not list(hold.iterdir())
    h.assert_in_step()


def test_a_delete_moves_each_accounts_copy_to_its_own_trash_and_restore_brings_each_back(
        h: Harness) -> None:
    """Tags are per message: deleting moved the primary account's copy to its Trash and left
    the other account's in its INBOX -- tagged deleted, out of step, and still on that
    server's inbox -- while the answer said "1 done"."""
    writes.move_to_folder(h.ctx, [BOTH_ACCOUNTS], "Archive", account="personal")
    assert h.folders(BOTH_ACCOUNTS) == ["personal/Archive", "work/INBOX"]
    result = writes.delete_messages(h.ctx, [BOTH_ACCOUNTS])
    assert result.applied == [BOTH_ACCOUNTS] and not result.errors
    assert result.accounts == ["personal", "work"]
    assert h.outcomes[-1].accounts == frozenset({"personal", "work"})  # both are pushed
    personal, work = h.files(BOTH_ACCOUNTS)
    assert_moved_name(personal, "personal/Trash")
    assert_moved_name(work, "work/Trash")
    assert "deleted" in h.tags(BOTH_ACCOUNTS) and "inbox" not in h.tags(BOTH_ACCOUNTS)
    h.assert_in_step()

    restored = writes.restore(h.ctx, [BOTH_ACCOUNTS])  # each copy back where it was
    assert restored.applied == [BOTH_ACCOUNTS] and restored.accounts == ["personal", "work"]
    assert h.folders(BOTH_ACCOUNTS) == ["personal/Archive", "work/INBOX"]
    assert {"deleted", "archived"} & h.tags(BOTH_ACCOUNTS) == {"archived"}
    h.assert_in_step()


def test_undo_of_a_delete_in_two_accounts_puts_both_copies_back(h: Harness) -> None:
    before = h.shape(BOTH_ACCOUNTS)
    writes.delete_messages(h.ctx, [BOTH_ACCOUNTS])
    assert h.folders(BOTH_ACCOUNTS) == ["personal/Trash", "work/Trash"]
    undone = writes.undo_last_write(h.ctx)
    assert undone.applied == [BOTH_ACCOUNTS] and not undone.errors
    assert undone.accounts == ["personal", "work"]
    assert h.shape(BOTH_ACCOUNTS) == before
    h.assert_in_step()


def test_an_account_without_the_folder_keeps_its_copy_and_the_answer_says_so(
        h: Harness) -> None:
    """work has no Junk folder: its copy stays in work/INBOX, named in the answer, while
    personal's goes to personal/Junk; undo puts that one back.  Tags are the message's: spam
    and out of the inbox, as the tagging rules give mail with a file in a Junk folder,
    wherever its other files are; that work's server still shows it in INBOX, the answer
    says."""
    before = h.shape(BOTH_ACCOUNTS)
    result = writes.move_to_junk(h.ctx, [BOTH_ACCOUNTS])
    assert result.applied == [BOTH_ACCOUNTS]
    [error] = result.errors
    assert error.error.startswith("not moved: work/INBOX (account 'work' has no junk folder")
    assert h.folders(BOTH_ACCOUNTS) == ["personal/Junk", "work/INBOX"]
    assert {"spam", "inbox"} & h.tags(BOTH_ACCOUNTS) == {"spam"}
    h.assert_in_step()
    writes.undo_last_write(h.ctx)
    assert h.shape(BOTH_ACCOUNTS) == before


def test_archive_moves_each_accounts_inbox_copy_to_its_own_archive(mail_env: MailEnv) -> None:
    with mail_env.fmail_config.open("a") as fh:  # work's folder table is the file's last one
        fh.write('archive = "Archive"\n')
    run_init(mail_env)
    config = mail_env.config()
    with Reader() as reader, Writer() as writer:
        hh = Harness(mail_env, WriteContext(config, reader, writer,
                                            sidecar.sidecar_path(config.data_dir)))
        before = hh.shape(BOTH_ACCOUNTS)
        result = writes.archive(hh.ctx, [BOTH_ACCOUNTS])
        assert result.applied == [BOTH_ACCOUNTS] and not result.errors
        personal, work = hh.files(BOTH_ACCOUNTS)
        assert_moved_name(personal, "personal/Archive")
        assert_moved_name(work, "work/Archive")
        assert {"archived", "inbox"} & hh.tags(BOTH_ACCOUNTS) == {"archived"}
        hh.assert_in_step()
        writes.undo_last_write(hh.ctx)
        assert hh.shape(BOTH_ACCOUNTS) == before
        hh.assert_in_step()


def test_a_write_naming_an_account_moves_only_that_accounts_copy(h: Harness) -> None:
    assert h.folders(BOTH_ACCOUNTS) == ["personal/INBOX", "work/INBOX"]
    result = writes.delete_messages(h.ctx, [BOTH_ACCOUNTS], account="work")
    assert h.folders(BOTH_ACCOUNTS) == ["personal/INBOX", "work/Trash"]
    assert h.outcomes[-1].accounts == frozenset({"work"}) and result.accounts == []
    with pytest.raises(ToolError, match="unknown account"):
        writes.delete_messages(h.ctx, [BOTH_ACCOUNTS], account="nope")
    h.assert_in_step()


def test_flag_changes_rename_the_files_in_every_account(h: Harness) -> None:
    result = writes.set_read(h.ctx, [BOTH_ACCOUNTS], False)
    assert result.accounts == ["personal", "work"]
    writes.set_flagged(h.ctx, [BOTH_ACCOUNTS], True)
    writes.tag_emails(h.ctx, [BOTH_ACCOUNTS], add=["replied"])
    assert [flags_of(f) for f in h.files(BOTH_ACCOUNTS)] == ["FR", "FR"]
    h.assert_in_step()


# ---------------------------------------------------------------------------------------------
# Undo


UNDOABLE: dict[str, tuple[str, Callable[[WriteContext, str], writes.WriteResult]]] = {
    "read": (UNREAD_IN_CUR, lambda ctx, mid: writes.set_read(ctx, [mid], True)),
    "unread": (IN_INBOX, lambda ctx, mid: writes.set_read(ctx, [mid], False)),
    "flag": (IN_INBOX, lambda ctx, mid: writes.set_flagged(ctx, [mid], True)),
    "tag": (IN_INBOX, lambda ctx, mid: writes.tag_emails(ctx, [mid], add=["x", "unread"])),
    "archive": (IN_INBOX, lambda ctx, mid: writes.archive(ctx, [mid])),
    "archive-from-new": (IN_NEW_NO_INFO, lambda ctx, mid: writes.archive(ctx, [mid])),
    "delete": (SELF_CC, lambda ctx, mid: writes.delete_messages(ctx, [mid])),
    "junk": (IN_ARCHIVE, lambda ctx, mid: writes.move_to_junk(ctx, [mid])),
    "move": (IN_INBOX, lambda ctx, mid: writes.move_to_folder(ctx, [mid], "Sent")),
    "restore": (IN_TRASH, lambda ctx, mid: writes.restore(ctx, [mid])),
}


@pytest.mark.parametrize("kind", sorted(UNDOABLE))
def test_undo_reverts_each_kind_of_write_exactly(h: Harness, kind: str) -> None:
    mid, write = UNDOABLE[kind]
    tags_before, files_before = h.shape(mid)
    result = write(h.ctx, mid)
    assert result.applied == [mid] and result.audit_id
    assert h.shape(mid) != (tags_before, files_before)
    undone = writes.undo_last_write(h.ctx)
    assert undone.applied == [mid] and not undone.errors and undone.audit_id == result.audit_id
    tags_after, files_after = h.shape(mid)
    assert tags_after == tags_before
    if kind == "archive-from-new":  # back in its folder, in cur/ now (still unread, no S)
        assert [(f, k) for f, k, _ in files_after] == [(f, k) for f, k, _ in files_before]
        assert h.files(mid)[0].startswith("personal/INBOX/cur/")
    else:
        assert files_after == files_before
    [entry] = h.audit()
    assert entry[4] is not None  # marked undone
    h.assert_in_step()


def test_undo_walks_back_and_then_says_there_is_nothing_left(h: Harness) -> None:
    before = h.shape(IN_INBOX)
    writes.tag_emails(h.ctx, [IN_INBOX], add=["first"])
    writes.archive(h.ctx, [IN_INBOX])
    writes.undo_last_write(h.ctx)
    assert h.folders(IN_INBOX) == ["personal/INBOX"] and "first" in h.tags(IN_INBOX)
    writes.undo_last_write(h.ctx)
    assert h.shape(IN_INBOX) == before
    with pytest.raises(ToolError, match="nothing to undo"):
        writes.undo_last_write(h.ctx)


def test_two_undos_at_once_revert_two_writes_not_one_twice(h: Harness) -> None:
    """Two servers on one mailbox are each asked to undo while another program holds the
    notmuch lock: each reverts a write of its own -- the latest, then the one before --
    instead of both reverting the latest and both saying so."""
    writes.archive(h.ctx, [IN_INBOX])
    writes.set_read(h.ctx, [UNREAD_IN_CUR], True)
    undone: list[int | None] = []
    failed: list[BaseException] = []

    def undo() -> None:  # a server of its own: its own handles, on its own thread
        with Reader() as reader, Writer() as writer:
            try:
                ctx = dataclasses.replace(h.ctx, reader=reader, writer=writer)
                undone.append(writes.undo_last_write(ctx).audit_id)
            except Exception as exc:  # noqa: BLE001 - reported by the test
                failed.append(exc)
    holder = LockHolder(h.env.env)  # both undos are under way when it lets go
    servers = [threading.Thread(target=undo) for _ in range(2)]
    for server in servers:
        server.start()
    threading.Timer(2, holder.release).start()
    for server in servers:
        server.join()
    assert not failed and set(undone) == {1, 2}, (undone, failed)
    assert h.folders(IN_INBOX) == ["personal/INBOX"] and "unread" in h.tags(UNREAD_IN_CUR)
    assert all(entry[4] is not None for entry in h.audit())
    h.assert_in_step()


@pytest.mark.timeout(120)
def test_an_undo_waits_for_another_under_way_no_longer_than_its_bound(h: Harness) -> None:
    """An undo in another process held its lock (re-indexing, syncing the sidecar): this one
    waited for it without bound, past its call's, and every write queued behind it."""
    writes.archive(h.ctx, [IN_INBOX])
    lock = h.ctx.sidecar_file.with_name(h.ctx.sidecar_file.name + ".undo-lock")
    with open(lock, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        with h.ctx.writer.deadline(time.monotonic() + 1), pytest.raises(
                ChangeError, match="another undo is under way.*nothing was undone"):
            writes.undo_last_write(h.ctx)
    assert h.folders(IN_INBOX) == ["personal/Archive"]
    assert writes.undo_last_write(h.ctx).audit_id == 1
    assert h.folders(IN_INBOX) == ["personal/INBOX"]


def test_undo_keeps_a_later_change_by_someone_else(h: Harness) -> None:
    writes.tag_emails(h.ctx, [IN_INBOX], add=["ours"])
    h.env.notmuch("tag", "+theirs", "--", f"id:{IN_INBOX}")
    writes.undo_last_write(h.ctx)
    tags = h.tags(IN_INBOX)
    assert "ours" not in tags and "theirs" in tags


def test_undo_leaves_a_message_where_another_sessions_later_write_put_it(h: Harness) -> None:
    """This session archives two messages; another trashes one of them and restores it, which
    puts it back in Archive.  The undo brings the other back to the inbox and leaves the one
    where the other session's restore put it, naming that write: moving it to the inbox would
    silently take back a later write that is not this session's."""
    ours, theirs = dataclasses.replace(h.ctx, session="ours"), dataclasses.replace(
        h.ctx, session="theirs")
    writes.archive(ours, [IN_INBOX, UNREAD_IN_CUR])
    writes.delete_messages(theirs, [IN_INBOX])
    restored = writes.restore(theirs, [IN_INBOX])
    assert h.folders(IN_INBOX) == ["personal/Archive"]
    result = writes.undo_last_write(ours)
    assert sorted(result.applied) == sorted([IN_INBOX, UNREAD_IN_CUR])
    [error] = result.errors
    assert error.id == IN_INBOX
    assert f"audit {restored.audit_id} (restore) moved it since" in error.error
    assert h.folders(IN_INBOX) == ["personal/Archive"] and "inbox" not in h.tags(IN_INBOX)
    assert h.folders(UNREAD_IN_CUR) == ["personal/INBOX"] and "inbox" in h.tags(UNREAD_IN_CUR)
    assert writes.undo_last_write(theirs).audit_id == restored.audit_id
    assert h.folders(IN_INBOX) == ["personal/Trash"]
    h.assert_in_step()


def _blocking_to_junk(mail_env: MailEnv) -> Config:
    """The personal account moves a blocked sender's mail to its Junk folder."""
    toml = mail_env.fmail_config.read_text()
    assert 'name = "personal"\n' in toml
    mail_env.fmail_config.write_text(
        toml.replace('name = "personal"\n', 'name = "personal"\nblocked_to_junk = true\n', 1))
    run_init(mail_env)
    config = mail_env.config()
    assert config.account("personal").blocked_to_junk
    return config


def _a_bank_message_in_the_inbox(mail_env: MailEnv) -> str:
    return mail_env.notmuch("search", "--output=messages", "--exclude=false", "--limit=1",
                            f"from:{BANK} AND tag:inbox").stdout.strip().removeprefix("id:")


def _two_sessions(h: Harness) -> tuple[WriteContext, WriteContext]:
    return (dataclasses.replace(h.ctx, session="ours"),
            dataclasses.replace(h.ctx, session="theirs"))


def _their_undo_leaves(h: Harness, theirs: WriteContext, mid: str,
                       before: tuple[frozenset[str], list[tuple[str, str, str]]]) -> None:
    """Their undo goes through whole, and leaves the message as it was ``before``."""
    assert not writes.undo_last_write(theirs).errors
    assert h.shape(mid) == before
    h.assert_in_step()


@pytest.mark.parametrize("first, then", [
    (lambda ctx, mid: writes.tag_emails(ctx, [mid], add=["x"]),
     lambda ctx, mid: writes.tag_emails(ctx, [mid], remove=["x", "unread"])),
    (lambda ctx, mid: writes.set_read(ctx, [mid], True),
     lambda ctx, mid: writes.tag_emails(ctx, [mid], add=["unread", "x"])),
], ids=["tag-then-untag", "read-then-unread"])
def test_undoing_an_earlier_write_then_a_later_one_leaves_the_message_as_before_both(
        h: Harness, first: Callable[[WriteContext, str], object],
        then: Callable[[WriteContext, str], object]) -> None:
    """Our write changes a tag, another session's changes it again (and more); our undo
    leaves the tag as theirs set it.  Their undo then must not bring back the state our
    write made, which is undone: the message is as before both, tags and flags."""
    ours, theirs = _two_sessions(h)
    before = h.shape(UNREAD_IN_CUR)
    first(ours, UNREAD_IN_CUR)
    then(theirs, UNREAD_IN_CUR)
    writes.undo_last_write(ours)
    _their_undo_leaves(h, theirs, UNREAD_IN_CUR, before)


def test_undoing_a_write_then_the_later_write_that_moved_on_puts_the_mail_back_home(
        h: Harness) -> None:
    """Archived by us, then thrown away by another session: our undo leaves it in Trash;
    their undo then brings it to the inbox, where it was before both -- not into the
    Archive our undone archive had put it in."""
    ours, theirs = _two_sessions(h)
    before = h.shape(IN_INBOX)
    writes.archive(ours, [IN_INBOX])
    writes.delete_messages(theirs, [IN_INBOX])
    writes.undo_last_write(ours)
    assert h.folders(IN_INBOX) == ["personal/Trash"]
    _their_undo_leaves(h, theirs, IN_INBOX, before)


def test_a_change_made_elsewhere_between_an_undo_and_a_later_write_stands(h: Harness) -> None:
    """Our read, undone; the user reads the message in mutt; another session marks it unread
    and undoes that: it is read again, as mutt left it.  Within one second the undo's time
    could not tell our undone write from one undone after theirs was made, and took mutt's
    read state for ours, undoing it too."""
    ours, theirs = _two_sessions(h)
    writes.set_read(ours, [UNREAD_IN_CUR], True)
    writes.undo_last_write(ours)
    h.env.notmuch("tag", "-unread", "--", f"id:{UNREAD_IN_CUR}")  # read in mutt
    before = h.shape(UNREAD_IN_CUR)
    writes.set_read(theirs, [UNREAD_IN_CUR], False)
    assert not writes.undo_last_write(theirs).errors
    assert h.shape(UNREAD_IN_CUR) == before and "unread" not in h.tags(UNREAD_IN_CUR)
    h.assert_in_step()


@contextmanager
def _in_our_revert(monkeypatch: pytest.MonkeyPatch, before: Callable[[], object] = lambda: None,
                   after: Callable[[], object] = lambda: None) -> Iterator[None]:
    """Another session's write made in the midst of our undo -- ``before`` just before its
    revert takes notmuch's write lock, ``after`` once the revert is committed and before the
    undo is recorded -- through the real functions, at the one point each: no timing."""
    real = changes.run
    undo: list[bool] = []

    def run(ctx: WriteContext, *args: Any, **kwargs: Any) -> changes.BatchReport:
        if undo or ctx.session != "ours":  # their write's own run, or ours after
            return real(ctx, *args, **kwargs)
        undo.append(True)
        before()
        report = real(ctx, *args, **kwargs)
        after()
        return report
    monkeypatch.setattr(changes, "run", run)
    yield
    assert undo, "our undo never reverted anything"


def test_a_write_made_between_an_undo_and_its_record_counts_as_made_after_it(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our archive, then another program moves the file on to Trash: our undo cannot move
    it back, and leaves it in Trash, untagged inbox.  Another session moves it to the inbox
    after our revert, before our undo is recorded; their undo must take it back to Trash,
    untagged inbox -- not take our archive for undone after their move was made and keep
    the inbox tag our archive took off on mail in Trash."""
    ours, theirs = _two_sessions(h)
    writes.archive(ours, [IN_INBOX])
    [archived] = h.files(IN_INBOX)
    trash = h.env.mail_root / "personal/Trash/cur" / Path(archived).name
    shutil.move(h.env.mail_root / archived, trash)
    h.env.notmuch("new", "--no-hooks")
    shapes = []

    def their_move() -> None:
        shapes.append(h.shape(IN_INBOX))
        writes.move_to_folder(theirs, [IN_INBOX], "INBOX")
    with _in_our_revert(monkeypatch, after=their_move):
        writes.undo_last_write(ours)
    [undone] = shapes
    assert "inbox" not in undone[0] and [f for f, _, _ in undone[1]] == ["personal/Trash"]
    assert h.folders(IN_INBOX) == ["personal/INBOX"] and "inbox" in h.tags(IN_INBOX)
    _their_undo_leaves(h, theirs, IN_INBOX, undone)


def test_a_write_made_between_an_undos_start_and_its_revert_is_left_as_it_set_it(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our tag, then our undo; another session takes the tag off after our undo started,
    before its revert.  Their undo then must not bring back the tag our undone write
    added: the message is as before both, as when their write came before our undo."""
    ours, theirs = _two_sessions(h)
    before = h.shape(UNREAD_IN_CUR)
    writes.tag_emails(ours, [UNREAD_IN_CUR], add=["x"])
    with _in_our_revert(monkeypatch, before=lambda: writes.tag_emails(
            theirs, [UNREAD_IN_CUR], remove=["x"])):
        writes.undo_last_write(ours)
    assert h.shape(UNREAD_IN_CUR) == before
    _their_undo_leaves(h, theirs, UNREAD_IN_CUR, before)


def test_a_write_made_while_an_undo_reindexes_stands_for_its_retry(h: Harness) -> None:
    """Our read; mbsync renames the file, so our undo's revert finds it stale and re-indexes.
    Meanwhile another session marks the message unread (and tags it x).  The retry must see
    that write as made before it: it leaves unread as theirs set it, and their undo then
    leaves the message as before both -- not read, as our undone write left it."""
    _reindexing(h)
    ours, theirs = _two_sessions(h)
    before = h.shape(UNREAD_IN_CUR)
    writes.set_read(ours, [UNREAD_IN_CUR], True)
    _renamed_by_mbsync(h, UNREAD_IN_CUR)
    reindex = h.ctx.reindex
    assert reindex is not None

    def their_write_then_reindex() -> None:
        writes.tag_emails(theirs, [UNREAD_IN_CUR], add=["unread", "x"])
        reindex()
    ours.reindex = their_write_then_reindex
    [kept] = writes.undo_last_write(ours).errors
    assert "left as a later write set them: unread (audit" in kept.error, kept.error
    _their_undo_leaves(h, theirs, UNREAD_IN_CUR, before)


def _before_the_undos_contacts(monkeypatch: pytest.MonkeyPatch, then: Callable[[], None]) -> None:
    """``then`` runs once, when the next undo has reverted the mail and is about to put back
    its contacts and record itself -- one sidecar transaction (see passes.changes.undo_last),
    which another writer can only come before."""
    enclosing, done = sidecar.enclosing, []

    def first_then(conn: sqlite3.Connection, *, keep: bool) -> Any:
        if not done:
            done.append(then())
        return enclosing(conn, keep=keep)
    monkeypatch.setattr(sidecar, "enclosing", first_then)


def test_a_write_made_between_an_undos_mail_revert_and_contacts_restore_counts_as_after(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our block moves the bank's mail to Junk; another program moves one message on to
    Trash, so our undo cannot move it back and leaves it there, untagged inbox.  Another
    session moves it to the inbox after our undo reverted the mail, before it put the
    contact back: their undo must take it back to Trash, untagged inbox -- that move was
    made after our revert, whatever our contacts restore found recorded by then."""
    from fmail_nm.tools.contacts import manage_contacts

    config = _blocking_to_junk(mail_env)
    with Reader() as reader, Writer() as writer:
        h = Harness(mail_env, WriteContext(config, reader, writer,
                                           sidecar.sidecar_path(config.data_dir)))
        ours, theirs = _two_sessions(h)
        mid = _a_bank_message_in_the_inbox(mail_env)
        manage_contacts(ours, f"UPDATE contacts SET is_blocked = 1 WHERE email_address = '{BANK}'")
        [junked] = h.files(mid)
        shutil.move(mail_env.mail_root / junked,
                    mail_env.mail_root / "personal/Trash/cur" / Path(junked).name)
        mail_env.notmuch("new", "--no-hooks")
        shapes = []

        def their_move() -> None:
            shapes.append(h.shape(mid))
            writes.move_to_folder(theirs, [mid], "INBOX")
        _before_the_undos_contacts(monkeypatch, their_move)
        writes.undo_last_write(ours)
        [undone] = shapes
        assert "inbox" not in undone[0] and [f for f, _, _ in undone[1]] == ["personal/Trash"]
        assert h.folders(mid) == ["personal/INBOX"] and "inbox" in h.tags(mid)
        _their_undo_leaves(h, theirs, mid, undone)


def test_a_contacts_write_between_an_undos_mail_revert_and_contacts_restore_counts_as_before(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our block; another session unblocks the bank after our undo reverted the mail, before
    it put the contact back, which then finds their unblock and leaves it.  Their undo must
    not block the bank again, as our undone block had: for the contact, their write came
    before our undo."""
    from fmail_nm.tools.contacts import manage_contacts

    ours, theirs = _two_sessions(h)
    manage_contacts(ours, f"UPDATE contacts SET is_blocked = 1 WHERE email_address = '{BANK}'")
    unblocked = []
    _before_the_undos_contacts(monkeypatch, lambda: unblocked.append(manage_contacts(
        theirs, f"UPDATE contacts SET is_blocked = 0 WHERE email_address = '{BANK}'")))
    writes.undo_last_write(ours)
    assert unblocked and BANK not in blocked_now(h.ctx.config)
    assert not writes.undo_last_write(theirs).errors
    assert BANK not in blocked_now(h.ctx.config) and h.count("tag:blocked") == 0


def test_an_undo_that_cannot_record_itself_leaves_the_contacts_as_they_were(h: Harness) -> None:
    """The undo of a block put the contact back, committed, then failed to mark the entry
    undone: the bank stood unblocked while the log said the block stands (and a second
    undo would put it back again).  The contacts restore and the mark are one transaction:
    a mark SQLite refuses (here a trigger) leaves the contact blocked, and its mail blocked
    with it; once it can be recorded, undoing again goes through."""
    from fmail_nm.tools.contacts import manage_contacts

    ours, _ = _two_sessions(h)
    manage_contacts(ours, f"UPDATE contacts SET is_blocked = 1 WHERE email_address = '{BANK}'")
    blocked = h.count("tag:blocked")
    _refuse_undo_marks(h.ctx.sidecar_file)
    with pytest.raises(changes.ChangeError, match="nothing was undone .the sidecar could not "
                       "put its contacts back and record the undo .the mark is refused"):
        writes.undo_last_write(ours)
    assert BANK in blocked_now(h.ctx.config) and h.count("tag:blocked") == blocked > 0
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        conn.execute("DROP TRIGGER no_mark")
        assert sidecar.last_write(conn, "ours") is not None
    assert not writes.undo_last_write(ours).errors
    assert BANK not in blocked_now(h.ctx.config) and h.count("tag:blocked") == 0


def _refuse_undo_marks(sidecar_file: Path) -> None:
    """Every mark of an entry undone fails, as a full disk would fail it."""
    with sidecar.opened(sidecar_file) as conn:
        conn.execute("CREATE TRIGGER no_mark BEFORE UPDATE OF undone_at ON audit_log "
                     "BEGIN SELECT RAISE(ABORT, 'the mark is refused'); END")


def test_an_undo_of_a_block_that_cannot_record_itself_leaves_its_mail_in_junk(
        mail_env: MailEnv) -> None:
    """Our block moves the bank's mail to Junk; our undo moves it back, then cannot put the
    contact back and mark itself undone.  Its mail goes back to Junk with the contact still
    blocked -- not left in the inbox from a sender still blocked, nor found gone from Junk
    by the undo done again, which then puts back all of it, as once."""
    from fmail_nm.tools.contacts import manage_contacts

    config = _blocking_to_junk(mail_env)
    with Reader() as reader, Writer() as writer:
        h = Harness(mail_env, WriteContext(config, reader, writer,
                                           sidecar.sidecar_path(config.data_dir)))
        ours, _ = _two_sessions(h)
        mid = _a_bank_message_in_the_inbox(mail_env)
        before = h.shape(mid)
        manage_contacts(ours, f"UPDATE contacts SET is_blocked = 1 WHERE email_address = '{BANK}'")
        junked = h.shape(mid)
        _refuse_undo_marks(h.ctx.sidecar_file)
        with pytest.raises(FmailError, match="the mark is refused"):
            writes.undo_last_write(ours)
        assert h.shape(mid) == junked and BANK in blocked_now(config)
        h.assert_in_step()
        with sidecar.opened(h.ctx.sidecar_file) as conn:
            conn.execute("DROP TRIGGER no_mark")
        assert not writes.undo_last_write(ours).errors
        assert h.shape(mid) == before and BANK not in blocked_now(config)


def test_a_message_reverted_before_a_retry_counts_what_was_made_meanwhile_as_after(
        h: Harness) -> None:
    """Our read of two messages; mbsync renames one's file, so our undo reverts the other
    first and re-indexes for the renamed one.  Meanwhile the user reads the other in mutt,
    and another session marks it unread.  Their write was made after our undo had reverted
    that message: their undo must leave it read, as mutt left it -- not take our undone
    read for undone after their write was made, and keep it unread."""
    _reindexing(h)
    ours, theirs = _two_sessions(h)
    writes.set_read(ours, [IN_NEW_NO_INFO, UNREAD_IN_CUR], True)
    _renamed_by_mbsync(h, UNREAD_IN_CUR)
    reindex = h.ctx.reindex
    assert reindex is not None
    between = []

    def mutt_and_their_write_then_reindex() -> None:
        assert "unread" in h.tags(IN_NEW_NO_INFO)  # our revert of it is done
        h.env.notmuch("tag", "-unread", "--", f"id:{IN_NEW_NO_INFO}")  # read in mutt
        between.append(h.shape(IN_NEW_NO_INFO))
        writes.tag_emails(theirs, [IN_NEW_NO_INFO], add=["unread"])
        reindex()
    ours.reindex = mutt_and_their_write_then_reindex
    assert not writes.undo_last_write(ours).errors and between
    _their_undo_leaves(h, theirs, IN_NEW_NO_INFO, between[0])


class UndoAside:
    """An undo on a thread of its own, with its own notmuch handles, as another server's:
    :meth:`start` returns once it finds the undo lock held (and waits for it) or is done."""

    def __init__(self, ctx: WriteContext, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ctx = ctx
        self.stopped = threading.Event()
        self.undone: list[Any] = []
        self.failed: list[BaseException] = []
        self.thread = threading.Thread(target=self._undo)
        real = flock.try_flock

        def watched(fh: Any, *args: Any, **kwargs: Any) -> bool:
            got = real(fh, *args, **kwargs)
            if not got and threading.current_thread() is self.thread:
                self.stopped.set()
            return got
        monkeypatch.setattr(flock, "try_flock", watched)

    def _undo(self) -> None:
        try:
            with Reader() as reader, Writer() as writer:
                ctx = dataclasses.replace(self.ctx, reader=reader, writer=writer)
                self.undone.append(writes.undo_last_write(ctx))
        except Exception as exc:  # noqa: BLE001 - reported by join
            self.failed.append(exc)
        finally:
            self.stopped.set()

    def start(self) -> None:
        self.thread.start()
        assert self.stopped.wait(60)

    def join(self) -> None:
        self.thread.join()
        assert not self.failed and len(self.undone) == 1, self.failed


def test_a_write_committed_before_an_undo_but_recorded_after_counts_as_made_before(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our tag; another session takes it off, and our undo is asked for (on another thread)
    after their commit, before their audit record.  It waits for that record: their undo
    must not bring back the tag our undone write added, as when their record came first."""
    ours, theirs = _two_sessions(h)
    before = h.shape(UNREAD_IN_CUR)
    writes.tag_emails(ours, [UNREAD_IN_CUR], add=["x"])
    real, undo = changes.record, UndoAside(ours, monkeypatch)

    def undo_then_record(ctx: WriteContext, *args: Any) -> int | None:
        if ctx.session == "theirs" and undo.thread.ident is None:  # not started yet
            undo.start()
        return real(ctx, *args)
    monkeypatch.setattr(changes, "record", undo_then_record)
    writes.tag_emails(theirs, [UNREAD_IN_CUR], remove=["x"])
    undo.join()
    assert h.shape(UNREAD_IN_CUR) == before
    _their_undo_leaves(h, theirs, UNREAD_IN_CUR, before)


# Another fmail-nm process's write (the CLI's, another server's) that stops between its
# commit and its audit record until told to go on.
WRITE_STOPPED_BEFORE_ITS_RECORD = """
import sys
from fmail_nm.app import load_config
from fmail_nm.passes import changes
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader, Writer
from fmail_nm.tools import writes

real = changes.record
def stopped(ctx, *args):
    print("committed", flush=True)
    sys.stdin.readline()
    return real(ctx, *args)
changes.record = stopped
config = load_config()
with Reader() as reader, Writer() as writer:
    ctx = changes.WriteContext(config=config, reader=reader, writer=writer, session="theirs",
                               sidecar_file=sidecar.sidecar_path(config.data_dir))
    writes.tag_emails(ctx, [sys.argv[1]], remove=["x"])
"""


def test_an_undo_waits_for_another_process_write_to_be_recorded(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, their write made by another process: our undo waits for its record (the
    lock next to the sidecar), then goes through and leaves their write undoable."""
    ours, theirs = _two_sessions(h)
    before = h.shape(UNREAD_IN_CUR)
    writes.tag_emails(ours, [UNREAD_IN_CUR], add=["x"])
    other = subprocess.Popen([sys.executable, "-c", WRITE_STOPPED_BEFORE_ITS_RECORD,
                              UNREAD_IN_CUR], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, **h.env.env})
    assert other.stdout is not None and other.stdin is not None
    assert other.stdout.readline().strip() == "committed"
    undo = UndoAside(ours, monkeypatch)
    undo.start()
    other.stdin.write("\n")
    other.stdin.close()
    assert other.wait(timeout=60) == 0
    undo.join()
    assert h.shape(UNREAD_IN_CUR) == before
    _their_undo_leaves(h, theirs, UNREAD_IN_CUR, before)


# Another fmail-nm process's undo, holding the undo lock until told to let go.
UNDO_LOCK_HOLDER = """
import fcntl, sys
with open(sys.argv[1], "a") as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.readline()
"""


@contextmanager
def undo_lock_held(sidecar_file: Path) -> Iterator[None]:
    """Another process holds the undo lock of ``sidecar_file``, as an undo under way there
    does."""
    lock = sidecar_file.with_name(sidecar_file.name + ".undo-lock")
    holder = subprocess.Popen([sys.executable, "-c", UNDO_LOCK_HOLDER, str(lock)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


@pytest.mark.timeout(120)
def test_a_write_waits_for_an_undo_under_way_no_longer_than_its_bound(h: Harness) -> None:
    """An undo in another process holds the undo lock past the write's bound: the write
    changes nothing and says why; once the undo is over, it goes through."""
    with undo_lock_held(h.ctx.sidecar_file):
        with h.ctx.writer.deadline(time.monotonic() + 1), pytest.raises(
                DatabaseBusy, match="an undo is under way.*nothing was changed"):
            writes.archive(h.ctx, [IN_INBOX])
        assert h.folders(IN_INBOX) == ["personal/INBOX"] and not h.audit()
    assert writes.archive(h.ctx, [IN_INBOX]).audit_id == 1
    assert h.folders(IN_INBOX) == ["personal/Archive"]


@pytest.mark.timeout(120)
def test_a_contacts_write_waits_for_an_undo_under_way_before_saving_the_contact(
        h: Harness) -> None:
    """Its contact rows are saved before its mail is retagged and its record written: an
    undo under way elsewhere, which may be restoring that contact, is waited for before
    them -- and past the bound nothing is saved."""
    from fmail_nm.tools.contacts import manage_contacts

    block = f"UPDATE contacts SET is_blocked = 1 WHERE email_address = '{BANK}'"
    with undo_lock_held(h.ctx.sidecar_file):
        with h.ctx.writer.deadline(time.monotonic() + 1), pytest.raises(
                DatabaseBusy, match="an undo is under way.*nothing was changed"):
            manage_contacts(h.ctx, block)
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        assert not conn.execute("SELECT 1 FROM contact_info WHERE email_address = ? AND "
                                "is_blocked", (BANK,)).fetchall()
    assert not h.audit()
    assert manage_contacts(h.ctx, block).audit_id == 1


@pytest.mark.timeout(120)
def test_a_contacts_read_or_refusal_does_not_wait_for_an_undo_under_way(h: Harness) -> None:
    """Every contacts statement held the undo lock a write holds: a SELECT, or a write
    refused before it changed anything, waited for an undo under way elsewhere and failed
    with "an undo is under way" past the bound.  Only a change waits (see above)."""
    from fmail_nm.tools.contacts import manage_contacts
    from fmail_nm.tools.sql import SqlError

    with undo_lock_held(h.ctx.sidecar_file), h.ctx.writer.deadline(time.monotonic() + 1):
        found = manage_contacts(h.ctx, f"SELECT email_address FROM contacts "
                                       f"WHERE email_address = '{BANK}'")
        assert found.rows == [[BANK]] and found.audit_id is None
        with pytest.raises(SqlError, match="a contact is one e-mail address.*changed nothing"):
            manage_contacts(h.ctx, "INSERT INTO contacts (email_address) VALUES ('Bank <x>')")
    assert not h.audit()


@pytest.mark.timeout(120)
def test_a_contacts_statement_that_changes_rows_runs_once(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change ran twice: rehearsed (rolled back) outside the undo lock, then again for
    real under it -- twice the time, and a statement whose effect differs from run to run
    (random(), the clock) rehearsed one change and made another.  SQLite's own trace of
    every statement the sidecar runs (each run its own connection; a trigger's steps are
    traced under the statement's text) shows it run once, a read too."""
    from fmail_nm.tools.contacts import manage_contacts

    traces: list[list[str]] = []  # per connection, what it ran
    connect = sidecar.connect

    def traced(path: Path, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(path, **kwargs)
        traces.append([])
        conn.set_trace_callback(traces[-1].append)
        return conn

    def runs(statement: str) -> int:
        return sum(statement in ran for ran in traces)

    monkeypatch.setattr(sidecar, "connect", traced)
    change = (f"UPDATE contacts SET notes = 'lot ' || abs(random()) "
              f"WHERE email_address = '{BANK}'")
    result = manage_contacts(h.ctx, change)
    assert result.changed == 1 and result.audit_id == 1
    assert runs(change) == 1
    read = f"SELECT notes FROM contacts WHERE email_address = '{BANK}'"
    saved = manage_contacts(h.ctx, read).rows
    assert runs(read) == 1
    recorded = json.loads(h.audit()[0][3])
    assert [[c["after"]["notes"]] for c in recorded if c.get("contact") == BANK] == saved


@pytest.mark.timeout(120)
def test_a_contacts_edit_that_changes_nothing_does_not_wait_for_an_undo_under_way(
        h: Harness) -> None:
    """The CLI's block of an address blocked already held the undo lock as a change does:
    with an undo under way elsewhere it waited, then failed "an undo is under way".  A
    change still waits, and past the bound saves nothing."""
    from fmail_nm.tools.contacts import edit_contacts, set_blocked

    def block(conn: sqlite3.Connection) -> list[str]:
        return set_blocked(conn, [BANK], True)

    assert edit_contacts(h.ctx, "contacts block", {}, block)[1].audit_id == 1
    with undo_lock_held(h.ctx.sidecar_file), h.ctx.writer.deadline(time.monotonic() + 1):
        assert edit_contacts(h.ctx, "contacts block", {}, block) == ([BANK], MailEffect(None))
        with pytest.raises(DatabaseBusy, match="an undo is under way.*nothing was changed"):
            edit_contacts(h.ctx, "contacts unblock", {},
                          lambda conn: set_blocked(conn, [BANK], False))
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        assert conn.execute("SELECT is_blocked FROM contact_info WHERE email_address = ?",
                            (BANK,)).fetchall() == [(1,)]
    assert len(h.audit()) == 1


@pytest.mark.timeout(120)
def test_a_contacts_import_while_an_undo_is_under_way_is_rehearsed_and_changes_nothing(
        h: Harness) -> None:
    """The CLI's import while an undo holds the undo lock in another process is rehearsed:
    its transaction (a savepoint of the rehearsal's, see sidecar.enclosing) is rolled back,
    so past the bound no contact, tag or audit entry has changed; once the undo is over the
    same import saves its rows and blocks the sender's mail, as one entry.  Imported again
    under an undo, changing nothing, it answers from the rehearsal without waiting."""
    from fmail_nm.tools.contacts import edit_contacts, import_csv

    fair = "fair@example.org"
    text = (f"email_address,name,notes,is_blocked\n{BANK},Northwind,statements,1\n"
            f"{fair},Fair,met at the fair,\n")

    def imported(conn: sqlite3.Connection) -> int:
        return import_csv(conn, io.StringIO(text, newline=""))

    def rows() -> list[tuple[Any, ...]]:
        with sidecar.opened(h.ctx.sidecar_file) as conn:
            return conn.execute("SELECT email_address, name, notes, is_blocked FROM "
                                "contact_info ORDER BY email_address").fetchall()

    before = rows()
    assert h.count(f"from:{BANK}") == 23 and h.count("tag:blocked") == 0
    with undo_lock_held(h.ctx.sidecar_file):
        with h.ctx.writer.deadline(time.monotonic() + 1), pytest.raises(
                DatabaseBusy, match="an undo is under way.*nothing was changed"):
            edit_contacts(h.ctx, "contacts import", {}, imported)
        assert rows() == before and not h.audit() and h.count("tag:blocked") == 0
    n, effect = edit_contacts(h.ctx, "contacts import", {}, imported)
    assert n == 2 and effect.audit_id == 1 and effect.tagged == 23
    assert rows() == sorted([*(r for r in before if r[0] not in (BANK, fair)),
                             (BANK, "Northwind", "statements", 1),
                             (fair, "Fair", "met at the fair", 0)])
    assert h.count(f"from:{BANK} AND tag:blocked") == 23
    with undo_lock_held(h.ctx.sidecar_file), h.ctx.writer.deadline(time.monotonic() + 1):
        assert edit_contacts(h.ctx, "contacts import", {}, imported) == (2, MailEffect(None))
    assert len(h.audit()) == 1


@pytest.mark.timeout(120)
def test_a_contacts_edit_records_only_its_own_change_not_another_writers_meanwhile(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's edit read the contacts, then opened its transaction: a change another
    writer (another process editing contacts) committed in between was recorded in this
    edit's audit entry, and undoing the edit took it back too.  Here the other writer, on
    its own connection, tries to commit just as the edit checks the addresses it blocks
    (after it read the contacts): it finds the sidecar locked, and goes after the edit."""
    from fmail_nm.tools import contacts

    other = "fair@example.org"
    own_among = contacts.sql.own_among
    locked: list[str] = []

    def meanwhile(conn: sqlite3.Connection, addresses: Any) -> list[str]:
        try:
            add_note(wait=False)
        except sqlite3.OperationalError as exc:
            locked.append(str(exc))
        return own_among(conn, addresses)

    def add_note(*, wait: bool) -> None:
        with sidecar.opened(h.ctx.sidecar_file) as conn:
            if not wait:
                conn.execute("PRAGMA busy_timeout = 0")
            with sidecar.transaction(conn):
                conn.execute("INSERT INTO contact_info (email_address, notes, updated_at) "
                             "VALUES (?, 'met at the fair', '2026-01-01')", (other,))

    with monkeypatch.context() as patched:
        patched.setattr(contacts.sql, "own_among", meanwhile)
        effect = contacts.edit_contacts(
            h.ctx, "contacts block", {}, lambda conn: contacts.set_blocked(conn, [BANK], True))[1]
    assert len(locked) == 1 and "locked" in locked[0]
    add_note(wait=True)  # the other writer goes once the edit is done
    recorded = json.loads(h.audit()[0][3])
    assert effect.audit_id == 1
    assert [c["contact"] for c in recorded if "contact" in c] == [BANK]
    writes.undo_last_write(h.ctx)
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        assert conn.execute("SELECT notes FROM contact_info WHERE email_address = ?",
                            (other,)).fetchall() == [("met at the fair",)]


@pytest.mark.timeout(120)
def test_an_undo_under_way_counts_the_wait_from_when_the_caller_asked(h: Harness) -> None:
    """A write that waited in a queue before the undo lock was told only the rest of its
    bound it spent on the lock ("gave up after 0.5s" after four seconds), unlike "database
    busy" for notmuch's lock, which counts from when the caller asked."""
    asked = time.monotonic() - 3.0  # its first three seconds went on waiting in a queue
    with undo_lock_held(h.ctx.sidecar_file), h.ctx.writer.deadline(asked + 3.5, asked=asked):
        with pytest.raises(changes.UndoUnderWay, match=r"gave up after [3-9]\.\ds") as err:
            writes.archive(h.ctx, [IN_INBOX])
    assert err.value.waited >= 3.0
    assert h.folders(IN_INBOX) == ["personal/INBOX"] and not h.audit()


@pytest.mark.timeout(120)
def test_an_undo_kept_waiting_counts_the_wait_from_when_the_caller_asked(h: Harness) -> None:
    """An undo behind another undo said "waited 0.5s" after four seconds, as a write did
    (above): only the rest of its bound it spent on the lock."""
    writes.archive(h.ctx, [IN_INBOX])
    asked = time.monotonic() - 3.0  # its first three seconds went on waiting in a queue
    with undo_lock_held(h.ctx.sidecar_file), h.ctx.writer.deadline(asked + 3.5, asked=asked):
        with pytest.raises(ChangeError, match=r"another undo is under way.*waited [3-9]\.\ds"):
            writes.undo_last_write(h.ctx)
    assert h.folders(IN_INBOX) == ["personal/Archive"]


@pytest.mark.timeout(120)
def test_a_write_inside_one_to_another_sidecar_still_waits_for_an_undo_there(
        h: Harness, tmp_path: Path) -> None:
    """A thread's hold covers its own lock file: a write it makes, inside a write recorded
    in one sidecar, that is recorded in another (a second configuration in one process)
    waits for an undo under way there as any write does, and changes nothing."""
    (tmp_path / "other").mkdir()
    other = dataclasses.replace(h.ctx, sidecar_file=tmp_path / "other" / "sidecar.sqlite3")
    with changes.until_recorded(h.ctx), undo_lock_held(other.sidecar_file):
        with h.ctx.writer.deadline(time.monotonic() + 1), pytest.raises(
                DatabaseBusy, match="an undo is under way.*nothing was changed"):
            writes.archive(other, [IN_INBOX])
    assert h.folders(IN_INBOX) == ["personal/INBOX"]


def test_an_undo_works_in_a_sidecar_without_its_index_of_undone_writes(h: Harness) -> None:
    """A sidecar copied or mended without the index audit_log_undone (a speed-up only)
    still undoes, tracing earlier writes undone since as with it."""
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        conn.execute("DROP INDEX audit_log_undone")
    ours, theirs = _two_sessions(h)
    before = h.shape(UNREAD_IN_CUR)
    writes.set_read(ours, [UNREAD_IN_CUR], True)
    writes.tag_emails(theirs, [UNREAD_IN_CUR], add=["unread", "x"])
    writes.undo_last_write(ours)
    _their_undo_leaves(h, theirs, UNREAD_IN_CUR, before)


def test_copies_traced_back_through_different_undone_writes_keep_each_its_origin(
        h: Harness) -> None:
    """The work copy was thrown away from Sent.  We take it out of Trash, then move both
    copies to Sent; another session moves both to the inbox; our undos leave theirs.  Their
    undo then puts each copy where it was before all three: the personal copy in its inbox,
    the work one in Trash -- remembering it came from Sent, where restore brings it, though
    the personal copy's trace ended at a write made after that was lost."""
    ours, theirs = _two_sessions(h)
    writes.move_to_folder(h.ctx, [BOTH_ACCOUNTS], "Sent", account="work")
    writes.delete_messages(h.ctx, [BOTH_ACCOUNTS], account="work")
    before = h.shape(BOTH_ACCOUNTS)
    writes.move_to_folder(ours, [BOTH_ACCOUNTS], "INBOX", account="work")
    writes.move_to_folder(ours, [BOTH_ACCOUNTS], "Sent")
    writes.move_to_folder(theirs, [BOTH_ACCOUNTS], "INBOX")
    for _ in range(2):
        writes.undo_last_write(ours)
    _their_undo_leaves(h, theirs, BOTH_ACCOUNTS, before)
    writes.restore(h.ctx, [BOTH_ACCOUNTS], account="work")
    assert h.folders(BOTH_ACCOUNTS) == ["personal/INBOX", "work/Sent"]


def test_a_write_undo_passed_over_still_stands_for_the_undo_of_a_later_one(h: Harness) -> None:
    """Our saved draft cannot be undone: our undo passes over it (marking it so), yet what it
    did stands.  Another session took the draft tag off since; their undo must put it back,
    not take the draft for a write undone since and leave the tag off."""
    ours, theirs = _two_sessions(h)
    draft = compose.save_draft(ours, ["zoe@example.net"], subject="unsent", body="w").message_id
    before = h.shape(draft)
    writes.tag_emails(theirs, [draft], remove=["draft"])
    with pytest.raises(ChangeError, match="cannot be reverted"):
        writes.undo_last_write(ours)
    _their_undo_leaves(h, theirs, draft, before)


def test_undoing_a_write_then_the_later_write_that_moved_it_home_leaves_the_file_be(
        h: Harness) -> None:
    """Archived by us, moved back to the inbox by another session: once our archive is
    undone, undoing theirs finds the file home already.  It stays as it is, not moved into
    the folder it is in under a new name (which mbsync would upload again as new mail)."""
    ours, theirs = _two_sessions(h)
    before = h.shape(IN_INBOX)
    writes.archive(ours, [IN_INBOX])
    writes.move_to_folder(theirs, [IN_INBOX], "INBOX")
    writes.undo_last_write(ours)
    [home] = h.files(IN_INBOX)
    _their_undo_leaves(h, theirs, IN_INBOX, before)
    assert h.files(IN_INBOX) == [home]


def test_undoing_an_earlier_contact_edit_then_a_later_one_leaves_the_contact_as_before(
        h: Harness) -> None:
    """We name a contact, another session renames it; our undo leaves their name; their
    undo then puts back the name the contact had before both, not ours."""
    from fmail_nm.tools.contacts import manage_contacts
    ours, theirs = _two_sessions(h)

    def name() -> object:
        with sidecar.opened(h.ctx.sidecar_file) as conn:
            return conn.execute("SELECT name FROM contacts WHERE email_address = ?",
                                (BANK,)).fetchone()[0]
    before = name()
    manage_contacts(ours, f"UPDATE contacts SET name = 'NW' WHERE email_address = '{BANK}'")
    manage_contacts(theirs, "UPDATE contacts SET name = 'Northwind' "
                    f"WHERE email_address = '{BANK}'")
    writes.undo_last_write(ours)
    assert name() == "Northwind"
    writes.undo_last_write(theirs)
    assert name() == before


def test_undoing_the_adding_of_a_contact_then_its_deletion_leaves_no_contact(h: Harness) -> None:
    """We add a contact, another session deletes it; our undo has nothing left to take back;
    their undo then must not bring back the contact we added: there was none before."""
    from fmail_nm.tools.contacts import manage_contacts
    ours, theirs = _two_sessions(h)
    new = "pest@spam.example"
    manage_contacts(ours, "INSERT INTO contacts (email_address, name, notes) "
                    f"VALUES ('{new}', 'Pest', 'met once')")
    manage_contacts(theirs, f"DELETE FROM contacts WHERE email_address = '{new}'")
    writes.undo_last_write(ours)
    writes.undo_last_write(theirs)
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        assert conn.execute("SELECT * FROM contact_info WHERE email_address = ?",
                            (new,)).fetchall() == []


def test_undo_finds_a_moved_file_renamed_since(h: Harness) -> None:
    writes.delete_messages(h.ctx, [IN_INBOX])
    [trashed] = h.files(IN_INBOX)
    # mbsync names the file after uploading it, and a mail client may change its flags.
    path = h.env.mail_root / trashed
    renamed = path.with_name(MaildirName.parse(path.name).key + ",U=3:2,FS")
    path.rename(renamed)
    h.env.notmuch("new", "--no-hooks")
    writes.undo_last_write(h.ctx)
    [back] = h.files(IN_INBOX)
    assert_moved_name(back, "personal/INBOX")
    assert flags_of(back) == "FS"


def _moved_on_by_another_client(h: Harness, mid: str, folder: str) -> None:
    """A plain rename, as mutt does, which notmuch picks up (without the hook's place tags)."""
    [moved] = h.files(mid)
    (h.env.mail_root / moved).rename(h.env.mail_root / folder / "cur" / Path(moved).name)
    h.env.notmuch("new", "--no-hooks")


def test_undo_reports_a_file_moved_away_since_and_tags_it_for_where_it_is(h: Harness) -> None:
    writes.delete_messages(h.ctx, [IN_INBOX])
    _moved_on_by_another_client(h, IN_INBOX, "personal/Archive")
    result = writes.undo_last_write(h.ctx)
    [error] = result.errors
    assert error.id == IN_INBOX and "no longer where the write put it" in error.error
    assert error.error.endswith("tags restored, except inbox: place tags follow where its "
                                "files are now"), error.error
    assert h.folders(IN_INBOX) == ["personal/Archive"]
    assert {"deleted", "inbox"}.isdisjoint(h.tags(IN_INBOX)) and "archived" in h.tags(IN_INBOX)
    with pytest.raises(ToolError, match="nothing to undo"):
        writes.undo_last_write(h.ctx)


def test_undo_of_an_archive_trashed_since_leaves_it_out_of_the_inbox(h: Harness) -> None:
    """The file stays in Trash, so the message does not get `inbox` back: tagged deleted and
    inbox it was in no folder the tags name."""
    writes.archive(h.ctx, [IN_INBOX])
    _moved_on_by_another_client(h, IN_INBOX, "personal/Trash")
    [error] = writes.undo_last_write(h.ctx).errors
    tags = h.tags(IN_INBOX)
    assert "deleted" in tags and {"inbox", "archived"}.isdisjoint(tags), tags
    assert "not moved back" in error.error and "except inbox" in error.error


def test_undo_not_moving_a_file_back_still_restores_the_other_tags(h: Harness) -> None:
    """Sent mail moved into Drafts became a draft and lost `sent`; thrown away from there by
    another client, then undone: no draft, sent again -- and `deleted`, since only the tags
    saying where it is follow the file."""
    sent = "wedding-2@example.org"  # personal/Sent, tagged sent
    writes.move_to_folder(h.ctx, [sent], "Drafts")
    assert "draft" in h.tags(sent) and "sent" not in h.tags(sent)
    _moved_on_by_another_client(h, sent, "personal/Trash")
    writes.undo_last_write(h.ctx)
    tags = h.tags(sent)
    assert {"sent", "deleted"} <= tags and {"draft", "inbox"}.isdisjoint(tags), tags
    assert "D" not in flags_of(h.files(sent)[0])
    h.assert_in_step()


def _vanish(h: Harness, mid: str, index: int = 0) -> str:
    """One of a message's files is deleted by another program; notmuch is not told."""
    gone = h.files(mid)[index]
    (h.env.mail_root / gone).unlink()
    return gone


def test_undo_of_a_move_whose_file_vanished_restores_the_rest_and_says_exactly_what(
        h: Harness) -> None:
    reindexed = _reindexing(h)
    writes.delete_messages(h.ctx, [BOTH_ACCOUNTS, IN_INBOX])  # a copy in each account
    before = {mid: h.shape(mid) for mid in (BOTH_ACCOUNTS, IN_INBOX)}
    gone = _vanish(h, BOTH_ACCOUNTS)
    [kept] = [f for f in h.files(BOTH_ACCOUNTS) if f != gone]

    result = writes.undo_last_write(h.ctx)

    assert reindexed == [1]  # the index named a file no longer on disk: indexed once first
    assert sorted(result.applied) == sorted([BOTH_ACCOUNTS, IN_INBOX])
    [error] = result.errors
    assert error.id == BOTH_ACCOUNTS, result
    assert f"not moved back: {gone} (gone" in error.error, error.error
    assert "moved back: work/" in error.error and "tags restored" in error.error
    assert h.folders(IN_INBOX) == ["personal/INBOX"]
    assert h.tags(IN_INBOX) == before[IN_INBOX][0] - {"deleted"} | {"inbox"}
    [back] = h.files(BOTH_ACCOUNTS)
    assert back != kept and not back.startswith("personal/Trash/")
    assert "deleted" not in h.tags(BOTH_ACCOUNTS)
    h.assert_in_step()
    with pytest.raises(ToolError, match="nothing to undo"):
        writes.undo_last_write(h.ctx)


def test_an_undo_that_cannot_finish_undoes_nothing_and_can_be_tried_again(h: Harness) -> None:
    # No re-index at hand (h.ctx has none): a file the index names is gone from disk.
    writes.delete_messages(h.ctx, [BOTH_ACCOUNTS, IN_INBOX])
    trashed = {mid: h.shape(mid) for mid in (BOTH_ACCOUNTS, IN_INBOX)}
    _vanish(h, BOTH_ACCOUNTS, index=1)

    with pytest.raises(ChangeError, match="nothing was undone.*no longer on disk"):
        writes.undo_last_write(h.ctx)

    assert h.shape(IN_INBOX) == trashed[IN_INBOX]  # untouched, like the rest
    assert h.audit()[-1][4] is None  # not marked undone
    h.env.notmuch("new", "--no-hooks")
    result = writes.undo_last_write(h.ctx)
    assert sorted(result.applied) == sorted([BOTH_ACCOUNTS, IN_INBOX])
    assert h.folders(IN_INBOX) == ["personal/INBOX"]
    h.assert_in_step()


# ---------------------------------------------------------------------------------------------
# mbsync's rename window: the index names a file mbsync renamed since


def _reindexing(h: Harness) -> list[int]:
    """Give the writes the re-index the server gives them, counting its runs."""
    runs: list[int] = []

    def reindex() -> None:
        runs.append(1)
        run_index(h.ctx.config, show_progress=False, timeout=120)
    h.ctx.reindex = reindex
    return runs


def _renamed_by_mbsync(h: Harness, mid: str) -> str:
    """Rename a message's file as mbsync does after uploading it (``,U=``), behind notmuch."""
    [rel] = h.files(mid)
    path = h.env.mail_root / rel
    name = MaildirName.parse(path.name)
    renamed = path.with_name(f"{name.key},U=77:2,{name.flags}")
    path.rename(renamed)
    return renamed.name


def test_a_write_in_the_rename_window_reindexes_once_and_applies(h: Harness) -> None:
    runs = _reindexing(h)
    renamed = _renamed_by_mbsync(h, UNREAD_IN_CUR)
    read = writes.set_read(h.ctx, [UNREAD_IN_CUR], True)  # a flag change renames the file
    assert read.applied == [UNREAD_IN_CUR] and not read.errors, read
    assert runs == [1]
    [path] = h.files(UNREAD_IN_CUR)
    assert Path(path).name.startswith(renamed.rpartition(":2,")[0]) and "S" in flags_of(path)

    _renamed_by_mbsync(h, IN_INBOX)
    archived = writes.archive(h.ctx, [IN_INBOX])  # a move
    assert archived.applied == [IN_INBOX] and not archived.errors, archived
    assert runs == [1, 1]
    assert h.folders(IN_INBOX) == ["personal/Archive"]
    h.assert_in_step()
    # The undo reverts both halves of what was done; nothing of the failed first try.
    writes.undo_last_write(h.ctx)
    assert h.folders(IN_INBOX) == ["personal/INBOX"]
    h.assert_in_step()


def test_a_file_renamed_just_after_the_write_looked_reindexes_once_and_applies(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """mbsync renames the file between the write's look at the disk and libnotmuch's flag
    rename, which then skips it without a word: the write is the rename window's, not a
    folder it may not write to -- re-indexed once and applied."""
    runs = _reindexing(h)
    looked = notmuch_store._require_files

    def then_renamed(msg: Any) -> None:
        looked(msg)
        if not runs:  # the first try only: the retry finds the file under its new name
            _renamed_by_mbsync(h, UNREAD_IN_CUR)
    monkeypatch.setattr(notmuch_store, "_require_files", then_renamed)
    read = writes.set_read(h.ctx, [UNREAD_IN_CUR], True)
    assert read.applied == [UNREAD_IN_CUR] and not read.errors, read
    assert runs == [1]
    [path] = h.files(UNREAD_IN_CUR)
    assert ",U=77:" in path and "S" in flags_of(path) and "unread" not in h.tags(UNREAD_IN_CUR)
    h.assert_in_step()


def test_a_move_of_two_copies_one_in_the_rename_window_is_one_undoable_record(
        h: Harness) -> None:
    runs = _reindexing(h)
    before = h.shape(SELF_CC)  # a Sent and an INBOX copy
    for index in (0, 1):  # whichever copy the move reaches first, the other one is renamed
        rel = h.files(SELF_CC)[index]
        if rel.startswith("personal/Sent/"):
            path = h.env.mail_root / rel
            name = MaildirName.parse(path.name)
            path.rename(path.with_name(f"{name.key},U=77:2,{name.flags}"))
    deleted = writes.delete_messages(h.ctx, [SELF_CC])
    assert deleted.applied == [SELF_CC] and not deleted.errors, deleted
    assert runs == [1]
    assert h.folders(SELF_CC) == ["personal/Trash"] and len(_held(h)) == 1  # one copy each
    [entry] = h.audit()
    [record] = json.loads(entry[3])
    assert len(record["moves"]) == 2
    writes.undo_last_write(h.ctx)
    assert sorted(h.folders(SELF_CC)) == ["personal/INBOX", "personal/Sent"]
    assert h.shape(SELF_CC)[0] == before[0]
    h.assert_in_step()


def test_a_retry_that_cannot_get_the_lock_leaves_the_first_session_recorded(
        h: Harness) -> None:
    """Another program takes the lock right after the re-index: the message the first
    session moved stays moved, and is recorded (undo) and told (sidecar, push) -- the
    caller is not told "nothing was changed"."""
    holders: list[LockHolder] = []

    def reindex() -> None:
        run_index(h.ctx.config, show_progress=False, timeout=120)
        holders.append(LockHolder(h.env.env))  # e.g. notmuch new, started just after ours
    h.ctx.reindex = reindex
    _renamed_by_mbsync(h, IN_INBOX)
    try:
        with h.ctx.writer.deadline(time.monotonic() + 5):
            done = writes.archive(h.ctx, [UNREAD_IN_CUR, IN_INBOX])
    finally:
        for holder in holders:
            holder.release()
    assert done.applied == [UNREAD_IN_CUR]
    [error] = done.errors
    assert error.id == IN_INBOX
    assert "tried again after re-indexing: database busy" in error.error
    assert h.folders(UNREAD_IN_CUR) == ["personal/Archive"]
    assert len(h.audit()) == 1
    assert [o.message_ids for o in h.outcomes] == [(UNREAD_IN_CUR,)]
    writes.undo_last_write(h.ctx)
    assert h.folders(UNREAD_IN_CUR) == ["personal/INBOX"]
    h.assert_in_step()


def test_the_reindex_a_write_asks_for_keeps_to_the_writes_bound(h: Harness) -> None:
    """The server's re-index (notmuch new waits silently for a lock another program holds)
    is bounded by what is left of the write's own bound, not a minute of its own."""
    from fmail_nm.mcp.server import MailService
    from fmail_nm.service.index import IndexingFailed

    service = MailService(h.ctx.config)
    writer = service._the_writer()
    try:
        with notmuch_lock_held(h.env.env):
            with writer.deadline(time.monotonic() + 2), \
                    pytest.raises(IndexingFailed, match=r"within (1\.\d+|2)s"):
                service._reindex()
            with writer.deadline(time.monotonic() - 1), pytest.raises(DatabaseBusy):
                service._reindex()  # no time left: notmuch new is not even started
    finally:
        service.close()


def test_a_write_whose_file_is_gone_for_good_reindexes_once_then_gives_up(h: Harness) -> None:
    runs = _reindexing(h)
    _vanish(h, IN_ARCHIVE)  # its only file
    assert "flagged" not in h.tags(IN_ARCHIVE) | h.tags(UNREAD_IN_CUR)
    result = writes.set_flagged(h.ctx, [IN_ARCHIVE, UNREAD_IN_CUR], True)
    assert runs == [1]
    assert result.applied == [UNREAD_IN_CUR]
    assert result.not_found == [IN_ARCHIVE] and not result.errors, result
    h.assert_in_step()


# ---------------------------------------------------------------------------------------------
# Queries, dry runs, limits


def test_a_query_write_needs_the_exact_count(h: Harness) -> None:
    query = 'from:anna.schmidt@example.com subject:"school trip"'
    matches = h.count("from:anna.schmidt@example.com AND subject:\"school trip\" "
                      "AND NOT tag:deleted AND NOT tag:spam")
    assert matches >= 2
    preview = writes.tag_emails(h.ctx, add=["trip"], query=query)
    assert preview.dry_run and preview.match_count == matches and preview.applied == []
    assert 0 < len(preview.sample_ids) <= writes.SAMPLE_SIZE
    assert h.count("tag:trip") == 0
    with pytest.raises(ToolError, match=f"confirm_count {matches - 1} does not match the "
                                        f"{matches} messages"):
        writes.tag_emails(h.ctx, add=["trip"], query=query, confirm_count=matches - 1)
    assert h.count("tag:trip") == 0
    done = writes.tag_emails(h.ctx, add=["trip"], query=query, confirm_count=matches)
    assert not done.dry_run and len(done.applied) == matches and done.match_count == matches
    assert h.count("tag:trip") == matches


def test_a_bad_query_is_a_tool_error(h: Harness) -> None:
    with pytest.raises(ToolError):
        writes.archive(h.ctx, query="from:(unclosed")


def test_dry_run_with_ids_reports_and_changes_nothing(h: Harness) -> None:
    before = h.shape(IN_INBOX)
    result = writes.delete_messages(h.ctx, [IN_INBOX, "missing@x.test"], dry_run=True)
    assert result.dry_run and result.match_count == 1 and result.sample_ids == [IN_INBOX]
    assert result.not_found == ["missing@x.test"]
    assert h.shape(IN_INBOX) == before and h.audit() == []


def test_an_id_shown_as_a_json_string_is_taken_with_its_quotes(h: Harness) -> None:
    """A listing shows a Message-ID that is not one plain word as a JSON string: passed on
    as shown, quotes included, it was reported not found."""
    piped = "a|b@example.net"
    (h.env.mail_root / "personal/INBOX/cur/1800000300.piped.host:2,S").write_bytes(
        f"From: a@example.net\nSubject: piped\nMessage-ID: <{piped}>\n\nhi\n".encode())
    h.env.notmuch("new", "--no-hooks")
    result = writes.set_flagged(h.ctx, [json.dumps(piped)], True)
    assert result.applied == [piped] and not result.not_found
    assert "flagged" in h.tags(f'"{piped}"')


def test_a_threads_id_in_ids_is_refused_with_the_query_that_selects_it(h: Harness) -> None:
    """list_threads lists thread ids, shaped like uids: as an id the write would find no
    message; the error says how to act on the thread."""
    thread = h.env.notmuch("search", "--output=threads", f"id:{IN_INBOX}").stdout.strip()
    before = h.shape(IN_INBOX)
    for ref in (thread.removeprefix("thread:"), thread):
        with pytest.raises(ToolError, match=f"a thread's id.*query='{thread}'.*nothing was"):
            writes.set_read(h.ctx, [IN_INBOX, ref], True)
    assert h.shape(IN_INBOX) == before and h.audit() == []


def test_ids_or_query_but_not_both_or_neither(h: Harness) -> None:
    with pytest.raises(ToolError, match="either ids or query"):
        writes.archive(h.ctx, [IN_INBOX], query="tag:inbox")
    with pytest.raises(ToolError, match="pass ids"):
        writes.archive(h.ctx, [])


def test_batches_are_bounded(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ToolError, match="at most 500.*narrow"):
        writes.set_read(h.ctx, [f"m{i}@x.test" for i in range(501)], True)
    monkeypatch.setattr(writes, "MAX_BATCH", 3)
    with pytest.raises(ToolError, match="narrow the query"):
        writes.set_read(h.ctx, None, True, query="tag:inbox", confirm_count=10)
    assert h.audit() == []


def test_a_selection_too_large_names_a_query_for_its_newest_part(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A list's 1,724 messages to archive: the refusal said only "narrow the query", and the
    model counted messages per month in SQL to find dates that split them."""
    monkeypatch.setattr(writes, "MAX_BATCH", 3)
    with pytest.raises(ToolError) as refused:
        writes.archive(h.ctx, None, query="tag:inbox OR tag:sent", dry_run=True)
    found = re.search(r"query='(.*)' selects the newest (\d+) of them", str(refused.value))
    assert found is not None, str(refused.value)
    assert found[1].startswith("(tag:inbox OR tag:sent) after:")
    part = writes.archive(h.ctx, None, query=found[1], dry_run=True)
    assert 0 < part.match_count == int(found[2]) < 3


def test_a_selection_too_large_at_the_search_limits_is_refused_as_too_large(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search of as many words as the DSL takes has no room for the newest part's three
    more: the refusal was the DSL's "at most 200 words" on a query the caller never wrote."""
    monkeypatch.setattr(writes, "MAX_BATCH", 3)
    words = ["tag:inbox", "OR", "tag:sent"] + ["OR", "from:nobody.test"] * 98
    assert len(words) == dsl.MAX_TOKENS - 1
    with pytest.raises(ToolError, match="one write takes at most 3 -- narrow the query"):
        writes.archive(h.ctx, None, query=" ".join(words), dry_run=True)


# ---------------------------------------------------------------------------------------------
# Audit log, busy database


def test_every_applied_write_is_in_the_audit_log(h: Harness) -> None:
    result = writes.delete_messages(h.ctx, [SELF_CC])
    [(entry_id, action, params, changes, undone_at)] = h.audit()
    assert entry_id == result.audit_id and action == "delete" and undone_at is None
    assert json.loads(params)["ids"] == [SELF_CC]
    [change] = json.loads(changes)
    assert change["message_id"] == SELF_CC
    assert {str(Path(f).parent.parent) for f in change["files_before"]} == {
        "personal/INBOX", "personal/Sent"}
    assert sorted(change["files_after"]) == h.files(SELF_CC)
    assert "deleted" in change["tags_after"] and "deleted" not in change["tags_before"]
    assert len(change["moves"]) == 2
    # Writing what is already so is applied, but changes nothing and is not logged.
    again = writes.delete_messages(h.ctx, [SELF_CC])
    assert again.applied == [SELF_CC] and again.audit_id is None
    assert len(h.audit()) == 1


def test_an_index_run_prunes_the_log_past_its_days_but_keeps_sends_and_recent_undo(
        h: Harness) -> None:
    """Writes older than AUDIT_KEEP_DAYS leave the log at the next index run; a send stays
    (it refuses sending its draft again), and the write before it is still undone."""
    old = writes.tag_emails(h.ctx, [IN_INBOX], add=["old"])
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        sent = sidecar.record_write(conn, "send", {"id": "sent-1@example.org"},
                                    [{"message_id": "sent-1@example.org"}])
        long_ago = utc_stamp(utc_now() - timedelta(days=sidecar.AUDIT_KEEP_DAYS + 1))
        conn.execute("UPDATE audit_log SET at = ? WHERE id IN (?, ?)",
                     (long_ago, old.audit_id, sent))
    recent = writes.set_read(h.ctx, [UNREAD_IN_CUR], True)
    run_index(h.ctx.config, show_progress=False, timeout=120)
    assert [entry[0] for entry in h.audit()] == [sent, recent.audit_id]
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        assert sidecar.sent_at(conn, "sent-1@example.org") == long_ago
    writes.undo_last_write(h.ctx)
    assert "unread" in h.tags(UNREAD_IN_CUR)
    h.assert_in_step()


def test_a_pass_on_a_busy_sidecar_leaves_the_pruning_to_the_next(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pruning follows the pass's tagging and mirroring: a sidecar another process is
    writing then must not fail the pass (the hook, the index run) -- the old entries go at
    the next one."""
    from fmail_nm.passes.post_new import post_new
    old = writes.tag_emails(h.ctx, [IN_INBOX], add=["old"])
    with sidecar.opened(h.ctx.sidecar_file) as conn:
        conn.execute("UPDATE audit_log SET at = ? WHERE id = ?",
                     (utc_stamp(utc_now() - timedelta(days=sidecar.AUDIT_KEEP_DAYS + 1)),
                      old.audit_id))
    monkeypatch.setattr(sidecar, "BUSY_TIMEOUT_MS", 200)
    prune, blockers = sidecar.prune_audit_log, []

    def prune_while_busy(conn: sqlite3.Connection) -> int:
        blockers.append(_sidecar_writer(h))
        return prune(conn)

    monkeypatch.setattr(sidecar, "prune_audit_log", prune_while_busy)
    try:
        post_new(h.ctx.config, h.ctx.reader, h.ctx.writer)
    finally:
        for blocker in blockers:
            blocker.execute("ROLLBACK")
            blocker.close()
    assert blockers and [entry[0] for entry in h.audit()] == [old.audit_id]
    monkeypatch.setattr(sidecar, "prune_audit_log", prune)
    post_new(h.ctx.config, h.ctx.reader, h.ctx.writer)
    assert h.audit() == []


def test_a_busy_database_is_reported_and_nothing_changes(h: Harness) -> None:
    before = {mid: h.shape(mid) for mid in (IN_INBOX, UNREAD_IN_CUR)}
    with notmuch_lock_held() as holder:
        with Writer(lock_timeout=1.0) as busy_writer:
            ctx = WriteContext(h.ctx.config, h.ctx.reader, busy_writer,
                                      h.ctx.sidecar_file, h.outcomes.append)
            with pytest.raises(DatabaseBusy, match="database busy.*nothing was changed"):
                writes.delete_messages(ctx, [IN_INBOX, UNREAD_IN_CUR])
            holder.release()
            busy_writer.run(lambda txn: None)  # the abandoned batch is behind us now
    assert {mid: h.shape(mid) for mid in before} == before
    assert h.audit() == [] and h.outcomes == []
    h.assert_in_step()


# ---------------------------------------------------------------------------------------------
# Moves follow the user's tagging rules; selections follow the injected clock

CUSTOM_RULES = """
[[tagging.rules]]
query = "{me} AND NOT tag:draft"
add = ["sent"]
remove = ["inbox"]

[[tagging.rules]]
query = "{folder:trash}"
add = ["deleted"]
remove = ["inbox"]

[[tagging.rules]]
query = "{folder:archive}"
add = ["filed"]
remove = ["inbox", "todo"]

[[tagging.rules]]
query = "NOT (tag:sent OR tag:draft OR tag:list OR tag:deleted OR tag:filed)"
add = ["inbox", "todo"]
"""


def test_a_move_gives_the_tags_the_users_rules_give_not_the_defaults(mail_env: MailEnv) -> None:
    """With rules edited in fmail.toml, archive and restore end with the tags `notmuch new`
    gives mail arriving in the same folder -- not the default rules' `archived`."""
    mail_env.fmail_config.write_text(mail_env.fmail_config.read_text() + CUSTOM_RULES)
    run_init(mail_env)
    config = mail_env.config()
    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        h = Harness(mail_env, ctx)
        delivered = h.tags(IN_ARCHIVE)  # indexed by notmuch new + the post-new rules
        assert "filed" in delivered and not {"archived", "inbox", "todo"} & delivered
        in_inbox = h.tags(IN_INBOX)
        assert {"inbox", "todo"} <= in_inbox

        writes.archive(ctx, [IN_INBOX])
        archived = h.tags(IN_INBOX)
        assert "filed" in archived and not {"archived", "inbox", "todo"} & archived
        assert archived - {"filed"} == in_inbox - {"inbox", "todo"}  # only place tags changed

        writes.delete_messages(ctx, [IN_INBOX])
        assert {"deleted"} <= h.tags(IN_INBOX) and "filed" not in h.tags(IN_INBOX)
        writes.restore(ctx, [IN_INBOX])  # back to Archive, where it was deleted from
        assert h.folders(IN_INBOX) == ["personal/Archive"]
        assert h.tags(IN_INBOX) == archived
        h.assert_in_step()


def test_a_write_by_query_selects_with_the_clock_it_was_given(h: Harness) -> None:
    """Relative dates in a write's query (newer_than:) count from the context's clock, as they
    do for searches, so a server started with a clock writes what it would list."""
    from datetime import datetime, timedelta, timezone
    newest = max(int(m["timestamp"]) for m in json.loads(h.env.notmuch(
        "search", "--format=json", "--exclude=false", "*").stdout))
    moment = datetime.fromtimestamp(newest, timezone.utc) + timedelta(hours=12)
    ctx = WriteContext(h.ctx.config, h.ctx.reader, h.ctx.writer, h.ctx.sidecar_file,
                              clock=lambda: moment)
    near = writes.set_read(ctx, None, True, query="newer_than:1d", dry_run=True)
    assert near.dry_run and near.match_count and near.match_count >= 1
    later = WriteContext(h.ctx.config, h.ctx.reader, h.ctx.writer, h.ctx.sidecar_file,
                                clock=lambda: moment + timedelta(days=3650))
    far = writes.set_read(later, None, True, query="newer_than:1d", dry_run=True)
    assert far.dry_run and far.match_count == 0


# ---------------------------------------------------------------------------------------------
# Blocking through the contacts tool, with blocked_to_junk: one undoable entry

BANK = "no-reply@northwind-bank.example.com"  # 23 messages, all in the personal account


def test_blocking_with_blocked_to_junk_is_one_undoable_entry(mail_env: MailEnv) -> None:
    """``manage_contacts_sql`` blocking a sender in an account with ``blocked_to_junk``: the
    contact row, the blocked/spam tags and the Junk moves are ONE audit entry, and one
    ``undo_last_write`` puts every file back where it was, the tags exactly as they were, and
    the contact unblocked -- with notmuch and the Maildir in step."""
    from fmail_nm.tools.contacts import manage_contacts

    config = _blocking_to_junk(mail_env)

    def dump() -> str:
        return mail_env.notmuch("dump", "--include=tags").stdout

    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        h = Harness(mail_env, ctx)
        ctx.after_write = h.outcomes.append
        mids = sorted(mail_env.notmuch("search", "--output=messages", "--exclude=false",
                                       f"from:{BANK}").stdout.replace("id:", "").split())
        assert len(mids) == 23
        shapes = {mid: h.shape(mid) for mid in mids}
        assert not any(f == "personal/Junk" for _, files in shapes.values() for f, _, _ in files)
        tags_before = dump()
        audit_before = h.audit()

        result = manage_contacts(
            ctx, f"UPDATE contacts SET is_blocked = 1 WHERE email_address = '{BANK}'")

        assert not result.dry_run and result.changed == 1 and result.blocked == [BANK]
        # All 23 in personal/Junk, tagged blocked and spam, out of the inbox.
        for mid in mids:
            tags, files = h.shape(mid)
            assert {"blocked", "spam"} <= tags and "inbox" not in tags, (mid, tags)
            assert files and {f for f, _, _ in files} == {"personal/Junk"}, (mid, files)
            # Same files (unique part, flags), only the folder changed.
            assert [(k, fl) for _, k, fl in files] == [(k, fl) for _, k, fl in shapes[mid][1]]
        assert h.count(f"from:{BANK} AND folder:personal/Junk") == 23
        # The follow-up heard of the moves in personal: that is what drives the push.
        assert "personal" in set().union(*(o.accounts for o in h.outcomes)), h.outcomes
        # ONE new audit entry: the contact row and every message's tags and moves.
        entries = h.audit()[len(audit_before):]
        assert len(entries) == 1, [(e[0], e[1]) for e in entries]
        [(entry_id, action, _params, changes_json, undone_at)] = entries
        assert result.audit_id == entry_id and undone_at is None and action == "contacts"
        recorded = json.loads(changes_json)
        assert [c["contact"] for c in recorded if "contact" in c] == [BANK]
        by_mid = {c["message_id"]: c for c in recorded if "message_id" in c}
        assert sorted(by_mid) == mids
        assert all(c["moves"] for c in by_mid.values())
        h.assert_in_step()

        outcomes_before_undo = len(h.outcomes)
        undone = writes.undo_last_write(ctx)

        assert undone.audit_id == entry_id and not undone.errors, undone.errors
        assert sorted(undone.applied) == mids
        for mid in mids:
            assert h.shape(mid) == shapes[mid], mid  # folder, unique part, flags; tags
        assert dump() == tags_before  # every tag of every message, exactly
        with sidecar.opened(ctx.sidecar_file) as conn:
            assert conn.execute("SELECT is_blocked FROM contacts WHERE email_address = ?",
                                (BANK,)).fetchone()[0] == 0
            assert BANK not in sidecar.blocked_addresses(conn)
        [(_, _, _, _, undone_at)] = h.audit()[len(audit_before):]
        assert undone_at is not None
        assert "personal" in set().union(
            *(o.accounts for o in h.outcomes[outcomes_before_undo:])), "undo pushes too"
        h.assert_in_step()


def test_unblocking_with_blocked_to_junk_puts_every_message_back_as_it_was(
        mail_env: MailEnv) -> None:
    """Unblocking a sender whose mail blocking moved to Junk: every message gets exactly its
    tags and folder from before the block -- a spam tag the user had set stays, mail archived
    by taking its inbox tag away stays out of the inbox, and mail the user had junked before
    stays in Junk -- and so again after the unblock is undone (blocking it again) and redone.
    Moving mail back out of Junk gave it the place tags of the inbox folder, so the user's spam
    tag was lost and archived mail came back to the inbox; a second unblock lost even more."""
    from fmail_nm.tools.contacts import manage_contacts

    config = _blocking_to_junk(mail_env)
    statement = "id:statement-2026-{:02}@northwind-bank.example.com"
    mail_env.notmuch("tag", "+spam", "--", statement.format(9))
    mail_env.notmuch("tag", "-inbox", "--", statement.format(8))
    mail_env.notmuch("tag", "+taxes", "--", statement.format(7))
    junked = statement.format(6).removeprefix("id:")

    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        h = Harness(mail_env, ctx)
        assert writes.move_to_junk(ctx, [junked]).applied == [junked]
        mids = sorted(mail_env.notmuch("search", "--output=messages", "--exclude=false",
                                       f"from:{BANK}").stdout.replace("id:", "").split())
        shapes = {mid: h.shape(mid) for mid in mids}
        assert h.folders(junked) == ["personal/Junk"]

        def set_blocked(flag: int) -> None:
            manage_contacts(ctx, f"UPDATE contacts SET is_blocked = {flag} "
                                 f"WHERE email_address = '{BANK}'")

        def changed() -> dict[str, Any]:
            return {mid: (shapes[mid], h.shape(mid)) for mid in mids if h.shape(mid) != shapes[mid]}

        set_blocked(1)
        assert h.count(f"from:{BANK} AND folder:personal/Junk AND tag:blocked") == len(mids)
        set_blocked(0)
        assert changed() == {}
        assert not writes.undo_last_write(ctx).errors  # the unblock: blocked, in Junk again
        assert h.count(f"from:{BANK} AND folder:personal/Junk AND tag:blocked") == len(mids)
        set_blocked(0)
        assert changed() == {}
        h.assert_in_step()


def test_broken_message_ids_are_found_as_notmuch_keeps_them(h: Harness) -> None:
    """notmuch keeps a broken Message-Id header's id as it stands (``<>`` is the id ``<>``,
    spaces before ``>`` stay): the tools take that id as notmuch has it, not only cleaned of
    its brackets and spaces."""
    inbox = h.env.mail_root / "personal" / "INBOX" / "new"
    for n, header in enumerate(("<>", "<odd-1@example.net   >")):
        (inbox / f"1700000100.{n}_1.testhost").write_bytes(
            f"From: Rita Roe <rita@example.net>\nTo: Alex Morgan <alex@example.org>\n"
            f"Subject: broken id {n}\nDate: Tue, 02 Jan 2024 10:0{n}:00 +0000\n"
            f"Message-Id: {header}\n\nA body.\n".encode())
    h.env.fmail("index")
    odd = sorted(h.ctx.reader.message_ids("subject:broken"))
    assert "<>" in odd and len(odd) == 2, odd
    [spaced] = [mid for mid in odd if mid != "<>"]
    assert spaced != "odd-1@example.net" and spaced.strip() == "odd-1@example.net", spaced

    mb = Mailbox(h.ctx.config, h.ctx.reader)
    for mid in odd:
        assert reads.get_email(mb, mid).subject.startswith("broken id")
        result = writes.set_flagged(h.ctx, [mid], True)
        assert result.applied == [mid] and not result.not_found, result
        assert "flagged" in h.ctx.reader.find(mid).tags  # type: ignore[union-attr]
    # A cleaned form still names an ordinary message as before.
    assert writes.set_flagged(h.ctx, [f"<{IN_INBOX}>"], True).applied == [IN_INBOX]
    h.assert_in_step()


def test_a_block_while_notmuch_is_busy_says_it_is_saved_and_stays_undoable(
        indexed: MailEnv) -> None:
    """The contacts change is made before its mail is retagged: with the notmuch lock held
    by another program the caller read "nothing was changed", although the block was saved,
    and nothing could undo it."""
    from fmail_nm.tools.contacts import MailNotRetagged, manage_contacts

    config = indexed.config()
    with Reader() as reader, Writer(lock_timeout=0.5) as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        with notmuch_lock_held(indexed.env):
            with pytest.raises(MailNotRetagged, match="the contacts change is saved"):
                manage_contacts(
                    ctx, f"UPDATE contacts SET is_blocked = 1 WHERE email_address = '{BANK}'")
        assert BANK in blocked_now(config)
        undone = writes.undo_last_write(ctx)
        assert not undone.errors
        assert BANK not in blocked_now(config)
        assert indexed.notmuch("count", "tag:blocked").stdout.strip() == "0"


def blocked_now(config: Any) -> set[str]:
    with sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        return sidecar.blocked_addresses(conn)


# ---------------------------------------------------------------------------------------------
# Undo passes over what fmail-nm did by itself

BANK = "no-reply@northwind-bank.example.com"
BANK_FILE = (Path(__file__).parent.parent / "fixtures/maildir/personal/INBOX/cur"
             / "1791008292.48213_60.fixturehost,U=60:2,S")
FRESH_BANK = "fresh-bank-1@northwind-bank.example.com"


def test_undo_reverts_the_users_write_not_the_hooks_move_of_blocked_mail(
        mail_env: MailEnv) -> None:
    """New mail from a blocked sender is moved to Junk by the post-new hook, after the user's
    last write: undo_last_write undoes the user's write, and the blocked mail stays in Junk
    (unblocking is how it comes back)."""
    config = _blocking_to_junk(mail_env)
    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        harness = Harness(mail_env, ctx)
        from fmail_nm.tools.contacts import manage_contacts
        manage_contacts(ctx, f"UPDATE contacts SET is_blocked = 1 WHERE email_address = '{BANK}'")
        assert writes.archive(ctx, [IN_INBOX]).applied == [IN_INBOX]
        text = re.sub(r"(?im)^Message-ID:.*$", f"Message-ID: <{FRESH_BANK}>",
                      BANK_FILE.read_text(errors="replace"), count=1)
        (mail_env.mail_root / "personal/INBOX/new/9999999999.1_1.host,U=999").write_text(text)
        mail_env.notmuch("new")  # the hook's blocklist pass moves it to Junk
        assert harness.folders(FRESH_BANK) == ["personal/Junk"]
        undone = writes.undo_last_write(ctx)
        assert undone.applied == [IN_INBOX]
        assert harness.folders(IN_INBOX) == ["personal/INBOX"]
        assert harness.folders(FRESH_BANK) == ["personal/Junk"]
        harness.assert_in_step()


# ---------------------------------------------------------------------------------------------
# The audit record of a write notmuch has committed


def _sidecar_writer(h: Harness) -> sqlite3.Connection:
    """Another process's write transaction on the sidecar (a long mirror sync batch)."""
    blocker = sqlite3.connect(h.ctx.sidecar_file, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    return blocker


def test_a_write_waits_for_a_busy_sidecar_to_record_itself(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar busy for longer than a connection waits (sidecar.BUSY_TIMEOUT_MS, 5 s;
    0.5 s here) once notmuch has committed: the record waits on, so the write stays
    undoable, and the follow-up (sync, push) is told."""
    monkeypatch.setattr(sidecar, "BUSY_TIMEOUT_MS", 500)
    blocker = _sidecar_writer(h)
    release = threading.Timer(1.5, lambda: blocker.execute("ROLLBACK"))
    release.start()
    try:
        result = writes.archive(h.ctx, [IN_INBOX])
    finally:
        release.join()
        blocker.close()
    assert result.applied == [IN_INBOX] and result.audit_id
    assert h.folders(IN_INBOX) == ["personal/Archive"] and h.outcomes
    writes.undo_last_write(h.ctx)
    assert h.folders(IN_INBOX) == ["personal/INBOX"]


def test_a_write_that_cannot_be_recorded_says_it_was_done(h: Harness,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(changes, "RECORD_WAIT_S", 0)
    monkeypatch.setattr(sidecar, "BUSY_TIMEOUT_MS", 500)
    blocker = _sidecar_writer(h)
    try:
        with pytest.raises(changes.UnrecordedWrite, match="was done, but the sidecar could not record it, so undo_last_write cannot"):
            writes.archive(h.ctx, [IN_INBOX])
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert h.folders(IN_INBOX) == ["personal/Archive"] and h.outcomes  # pushed all the same


# ---------------------------------------------------------------------------------------------
# A folder fmail-nm cannot write


@contextmanager
def _immutable(folder: Path) -> Iterator[None]:
    """Renames in ``folder`` fail (EPERM), as in a read-only or failing filesystem."""
    done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"this filesystem cannot make a folder immutable: {done.stderr!r}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_flag_rename_that_fails_leaves_the_tags_and_says_so(h: Harness) -> None:
    """libnotmuch skips a file it cannot rename without a word: the tag would say read while
    the file -- and so the server -- says unread. The write is refused for that message and
    its tags stay as the file says."""
    [path] = h.files(UNREAD_IN_CUR)
    with _immutable((h.env.mail_root / path).parent):
        result = writes.set_read(h.ctx, [UNREAD_IN_CUR], True)
    assert result.applied == [] and "could not be renamed" in result.errors[0].error
    assert "unread" in h.tags(UNREAD_IN_CUR) and h.files(UNREAD_IN_CUR) == [path]
    h.assert_in_step()


def test_a_move_that_fails_for_one_copy_moves_none(h: Harness) -> None:
    """A message with two copies (INBOX and Sent) whose second cannot move: the first is put
    back, so the message is where it was, with its tags, and the caller told it failed."""
    files = h.ctx.reader.find(SELF_CC).filenames  # type: ignore[union-attr]
    before = (h.folders(SELF_CC), h.tags(SELF_CC))
    with _immutable(Path(files[1]).parent):
        result = writes.delete_messages(h.ctx, [SELF_CC])
    assert result.applied == [] and result.errors
    assert (h.folders(SELF_CC), h.tags(SELF_CC)) == before
    h.assert_in_step()
