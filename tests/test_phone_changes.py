"""Files, index, sidecar and server in step when another IMAP client changes the mail too.

Real Dovecot, mbsync and notmuch (tests/syncbed.py); the "phone" is imaplib against the test
Dovecot, acting between fmail-nm's writes and the next sync.
"""

from __future__ import annotations

import imaplib
import os
import threading
import time
from collections.abc import Sequence

import pytest

from fmail_nm.config import Config
from fmail_nm.passes.changes import WriteContext
from fmail_nm.service import cycle, doctor, mbsync, send, status
from fmail_nm.service.background import Background
from fmail_nm.store import maildir, sidecar
from fmail_nm.tools import compose, writes

from . import imapbed
from .smtpbed import SmtpBed
from .syncbed import (  # noqa: F401  (pytest fixtures, used by name)
    ACCOUNT,
    ADDRESS,
    IMAP_USER,
    SEEN,
    SyncBed,
    sync_bed,
    synced_bed,
)
from .test_background import wait_for
from .test_send_imap import smtp  # noqa: F401  (pytest fixture, used by name)
from .test_writes_imap import ctx, synced_once  # noqa: F401  (ctx: a pytest fixture)

pytestmark = pytest.mark.imap

# The service with its watcher only: no scheduled pull and no push of its own.
WATCH_ONLY = {"watch": True, "schedule": False, "push": False, "watch_quiet": 0.3,
              "watch_max_delay": 3.0, "poll_interval": 0.5}


def _uid(client: imaplib.IMAP4, message_id: str) -> str:
    typ, data = client.uid("SEARCH", "HEADER", "Message-ID", f'"<{message_id}>"')
    assert typ == "OK", data
    (uid,) = (data[0] or b"").split()
    return uid.decode()


def phone_moves(bed: SyncBed, message_id: str, source: str, dest: str) -> None:
    """Another IMAP client moves a message (UID MOVE), as a phone's delete or archive does."""
    with bed.server.imap(IMAP_USER) as client:
        assert client.select(f'"{source}"')[0] == "OK"
        typ, data = client.uid("MOVE", _uid(client, message_id), f'"{dest}"')
        assert typ == "OK", data
        client.close()


def phone_expunges(bed: SyncBed, message_id: str, folder: str) -> None:
    """Another IMAP client deletes a message for good (flags it deleted and expunges)."""
    with bed.server.imap(IMAP_USER) as client:
        assert client.select(f'"{folder}"')[0] == "OK"
        typ, data = client.uid("STORE", _uid(client, message_id), "+FLAGS", "(\\Deleted)")
        assert typ == "OK", data
        assert client.expunge()[0] == "OK"
        client.close()


def in_inbox_and_archive(bed: SyncBed) -> tuple[str, Config]:
    """A message with a copy in INBOX and one in Archive (and another message), synced."""
    mid = bed.mid(1)
    bed.seed(1)
    bed.seed(1, folder="Archive")
    bed.seed(2)
    bed.init()
    assert bed.sync().ok
    return mid, bed.config()


def test_a_held_copy_takes_the_place_of_the_copy_the_phone_deletes(sync_bed: SyncBed) -> None:
    """Archived here while Archive had the message too: its INBOX file is held.  The phone
    then deletes the Archive copy; the held copy was the last one anywhere (not on the
    server, not in the index) and pruned a month later.  It takes the Archive copy's place,
    with the message's tags, on the server too; undo puts it back in INBOX."""
    bed = sync_bed
    mid, config = in_inbox_and_archive(bed)
    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        assert writes.archive(ctx, [mid]).applied == [mid]
        tags = bed.tags(mid)
        phone_expunges(bed, mid, "Archive")
        assert bed.sync().ok
        assert bed.tags(mid) == tags
        assert synced_once(bed)[mid] == [("Archive", frozenset())]
        undone = writes.undo_last_write(ctx)
        assert undone.applied == [mid] and not undone.errors
        assert synced_once(bed)[mid] == [("INBOX", frozenset())]


def test_a_message_deleted_here_and_then_on_the_phone_stays_gone(sync_bed: SyncBed) -> None:
    """Deleted here while Archive had the message too: its INBOX file went to Trash, its
    Archive one into a hold.  The phone then empties Trash: the message was deleted on
    purpose on both sides, and its held copy must not bring it back -- it stays held."""
    bed = sync_bed
    mid, config = in_inbox_and_archive(bed)
    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        assert writes.delete_messages(ctx, [mid]).applied == [mid]
    assert [folder for folder, _ in synced_once(bed)[mid]] == ["Trash"]
    phone_expunges(bed, mid, "Trash")
    assert bed.sync().ok
    assert mid not in synced_once(bed)
    assert bed.find(mid) is None and bed.files(mid) == []
    assert [maildir.held_message_id(p) for p in maildir.held_files(config)] == [mid]


def test_a_move_on_the_server_keeps_local_tags_through_a_pull_the_watcher_sees(
        synced_bed: SyncBed, ctx: WriteContext) -> None:
    """mbsync syncs one folder after the other: a message the phone moved from INBOX to
    Trash is gone from the local INBOX before its Trash copy arrives.  A ``notmuch new`` in
    that gap drops the message -- and with it every tag only notmuch keeps (``todo``), since
    the Trash copy then comes back as new mail.  The service's watcher sees the INBOX file go
    and must not index while an mbsync run holds the channel."""
    bed = synced_bed
    mid = bed.mid(1)
    assert writes.tag_emails(ctx, [mid], add=["todo"]).applied == [mid]
    phone_moves(bed, mid, "INBOX", "Trash")
    config = bed.config()
    bg = Background(config, **WATCH_ONLY)
    bg.start()
    try:
        assert bg.wait_idle(60), "the startup index run did not finish"
        runs = bg.status().index.runs
        # A sync of ours that has done INBOX and not yet Trash (mbsync's order).
        with mbsync.channel_lock(config, ACCOUNT):
            imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:INBOX")
            assert bed.files(mid) == []
            # The watcher hands the removal to the index thread (which may run it or wait).
            wait_for(lambda: bg.queue_length() == 0 and (
                bg.status().index.runs > runs or not bg._indexer.idle()),
                "the watcher's batch to reach the index thread")
            imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:Trash")

        def in_trash() -> bool:
            found = bed.find(mid)
            return found is not None and all("/Trash/" in f for f in found.filenames)
        wait_for(in_trash, "the index to have the Trash copy")
        assert bg.wait_idle(60)
    finally:
        bg.stop()
    assert bed.tags(mid) == {"todo", "deleted", "unread"}


def test_a_write_during_a_pull_does_not_reindex_a_message_out_of_the_index(
        synced_bed: SyncBed) -> None:
    """The same gap, reached by a write: the phone moved the message to Trash and a pull has
    done INBOX only.  The archive finds its file gone and asks for a re-index -- which then
    would drop the message (and its ``todo``), answer "not found", and let the Trash copy
    come back as new mail.  While the sync holds the channel the write must leave the index
    alone and say the message could not be written; once the pull is done it works."""
    from fmail_nm.mcp.server import MailService

    bed = synced_bed
    mid = bed.mid(1)
    config = bed.config()
    service = MailService(config)
    try:
        assert writes.tag_emails(service._writes(), [mid], add=["todo"]).applied == [mid]
        phone_moves(bed, mid, "INBOX", "Trash")
        with mbsync.channel_lock(config, ACCOUNT):
            imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:INBOX")
            writer = service._the_writer()
            with writer.deadline(time.monotonic() + 1.0):  # the write's bound, shortened
                result = writes.archive(service._writes(), [mid])
            assert result.applied == [] and [e.id for e in result.errors] == [mid], result
            assert bed.find(mid) is not None  # still indexed, with its tags
            imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:Trash")
        bed.index()
        assert bed.tags(mid) == {"todo", "deleted", "unread"}
    finally:
        service.close()


def tagged_then_moved_by_the_phone(bed: SyncBed, config: Config) -> str:
    """Message 1 tagged ``todo`` (a tag only notmuch keeps), then moved by the phone from
    INBOX to Trash on the server; its Message-ID."""
    mid = bed.mid(1)
    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        assert writes.tag_emails(ctx, [mid], add=["todo"]).applied == [mid]
    phone_moves(bed, mid, "INBOX", "Trash")
    return mid


def test_a_cli_contacts_block_during_a_pull_does_not_reindex_a_message_out_of_the_index(
        synced_bed: SyncBed, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The same gap, reached by `fmail-nm contacts block` on an account that moves blocked
    mail to Junk: its re-index did not wait for the channel the way the server's does, and
    dropped the message the phone had moved (and its ``todo``) in the middle of a pull."""
    from fmail_nm import cli
    from fmail_nm.service import index

    bed = synced_bed
    toml = bed.mail_env.fmail_config
    toml.write_text(toml.read_text().replace(f'mbsync_channel = "{ACCOUNT}"\n',
                                             f'mbsync_channel = "{ACCOUNT}"\n'
                                             "blocked_to_junk = true\n"))
    config = bed.reload()
    mid = tagged_then_moved_by_the_phone(bed, config)
    monkeypatch.setattr(index, "REINDEX_TIMEOUT", 1.0)  # the wait for the channel, shortened
    with mbsync.channel_lock(config, ACCOUNT):
        imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:INBOX")
        assert cli.main(["contacts", "block", "--no-push", "sender1@example.net"]) == 0
        assert bed.find(mid) is not None  # still indexed, with its tags
        assert "mbsync is syncing this mail right now" in caplog.text
        imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:Trash")
    bed.index()
    assert {"todo", "deleted"} <= bed.tags(mid)


def with_other_account(bed: SyncBed) -> str:
    """A second account with a channel of its own (one empty folder); its name."""
    other = "other"
    imapbed.write_mbsync_config(bed.mbsync_config, bed.server, IMAP_USER, bed.mail_root,
                                account=other, patterns="Junk", append=True)
    (bed.mail_root / other).mkdir(exist_ok=True)
    toml = bed.mail_env.fmail_config
    toml.write_text(toml.read_text() + f'\n[[accounts]]\nname = "{other}"\n'
                    f'maildir = "{other}"\nmbsync_channel = "{other}"\n')
    return other


def test_a_sync_of_another_account_does_not_index_in_the_middle_of_a_pull(
        synced_bed: SyncBed) -> None:
    """The same gap, reached by `fmail-nm sync` of another account (the CLI's push and an
    account being added run the same cycle): its own mbsync run was done, and the index at
    its end ran while the service's pull of this account was half-way -- dropping the
    message the phone had moved, and its ``todo``."""
    bed = synced_bed
    other = with_other_account(bed)
    config = bed.reload()
    mid = tagged_then_moved_by_the_phone(bed, config)
    with mbsync.channel_lock(config, ACCOUNT):  # the service's pull: INBOX done, Trash not
        imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:INBOX")
        report = cycle.sync(config, other, "pull", timeout=60, index_timeout=1.0)
        (run,) = report.runs
        assert run.ok, run.error
        assert report.index is None and report.index_error is not None
        assert "mbsync is syncing this mail right now" in report.index_error
        assert bed.find(mid) is not None  # still indexed, with its tags
        imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:Trash")
    report = cycle.sync(config, other, "pull", timeout=60)
    assert report.ok, report.errors()
    assert {"todo", "deleted"} <= bed.tags(mid)


def test_fmail_nm_index_and_init_do_not_index_in_the_middle_of_a_pull(
        synced_bed: SyncBed, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The same gap, reached by `fmail-nm index` (or init run again, whose database holds
    tags too) while the service pulls: they ran notmuch new at once, without a word, and
    dropped the message the phone had moved, and its ``todo``.  They wait for the pull, say
    so and for which channel, and give up -- indexing nothing -- when it takes too long."""
    from fmail_nm import cli
    from fmail_nm.service import index

    bed = synced_bed
    config = bed.config()
    mid = tagged_then_moved_by_the_phone(bed, config)
    monkeypatch.setattr(index, "SYNC_WAIT_TIMEOUT", 1.0)  # the wait for the pull, shortened
    with mbsync.channel_lock(config, ACCOUNT):  # the service's pull: INBOX done, Trash not
        imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:INBOX")
        for command in (["index", "--quiet"], ["init"]):
            capsys.readouterr()
            assert cli.main(command) == 1, command
            err = capsys.readouterr().err
            assert err.count(f"waiting for mbsync to finish syncing '{ACCOUNT}'") == 1, err
            assert "mbsync is syncing this mail right now" in err
            assert bed.find(mid) is not None, command  # still indexed, with its tags
        imapbed.run_mbsync(bed.mbsync_config, f"{ACCOUNT}:Trash")
    assert cli.main(["index", "--quiet"]) == 0
    assert "waiting for mbsync" not in capsys.readouterr().err
    assert {"todo", "deleted"} <= bed.tags(mid)


def test_fmail_nm_sync_says_which_pull_its_index_waits_for(
        synced_bed: SyncBed, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`fmail-nm sync` of one account waits, before its index, for the service's pull of
    another: it sat silent meanwhile.  It says once that it waits, and for which channel."""
    from fmail_nm import cli

    bed = synced_bed
    other = with_other_account(bed)
    config = bed.reload()
    told = threading.Event()
    holding = threading.Event()
    said = cli.say_channel_wait

    def say(channels: Sequence[str]) -> None:
        said(channels)
        told.set()  # the pull ends once the wait is said (or after a while, if it never is)
    monkeypatch.setattr(cli, "say_channel_wait", say)

    def pull() -> None:  # the service's pull of the first account, holding its channel
        with mbsync.channel_lock(config, ACCOUNT):
            holding.set()
            told.wait(5.0)
    puller = threading.Thread(target=pull)
    puller.start()
    try:
        assert holding.wait(30)
        assert cli.main(["sync", "--pull", other]) == 0
    finally:
        told.set()
        puller.join()
    err = capsys.readouterr().err
    assert err.count("waiting for mbsync to finish syncing") == 1, err
    assert f"waiting for mbsync to finish syncing '{ACCOUNT}' (" in err, err


def test_a_reply_to_mail_read_on_the_phone_marks_the_original_answered(
        synced_bed: SyncBed, smtp: SmtpBed) -> None:
    """The phone read the original and a pull renamed its file (``:2,S``) before the index
    ran; then the reply drafted here is sent.  The send must still file it and mark the
    original replied (``\\Answered`` on the server) -- not report the filing as failed and
    leave the original unanswered everywhere."""
    bed = synced_bed
    bed.mail_env.fmail_config.write_text(bed.mail_env.fmail_config.read_text() +
                                         'drafts = "Drafts"\n\n' + smtp.send_settings())
    config = bed.reload()
    original = bed.mid(1)
    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir),
                           reindex=bed.index)  # what the server and the CLI give a write
        draft = compose.reply_to_email(ctx, original, "Thanks, will do.")
        bed.store(original, "+FLAGS", [SEEN])
        (run,) = bed.mbsync("pull")
        assert run.ok, run.error

        assert send.send_draft(ctx, draft.message_id).sent
        assert len(smtp.received) == 1
        assert bed.tags(original) == {"replied", "inbox"}  # read on the phone, answered here
    report = bed.sync()
    assert report.ok, report.errors()
    assert bed.server_flags(original) == {SEEN, "\\Answered"}
    assert bed.server_flags(draft.message_id, folder="Sent") == {SEEN}


def phone_folder(bed: SyncBed, command: str, *folders: str) -> None:
    """Another IMAP client deletes or renames a folder (``delete``/``rename``)."""
    with bed.server.imap(IMAP_USER) as client:
        typ, data = getattr(client, command)(*(f'"{folder}"' for folder in folders))
        assert typ == "OK", data


def synced_folder(bed: SyncBed, folder: str) -> None:
    imapbed.create_folder(bed.server, IMAP_USER, folder)
    assert bed.sync().ok


def test_a_folder_the_phone_deletes_holding_a_local_move_is_reported_until_settled(
        synced_bed: SyncBed, ctx: WriteContext) -> None:
    """mbsync 1.4 skips a box it synced before that the server no longer has, and fails the
    run for good: the sync says which folder, how much mail only this side has in it, and
    what to do.  The channel's other folders sync all the same; the mail is never removed."""
    bed = synced_bed
    mid, new = bed.mid(2), bed.mid(9)
    synced_folder(bed, "Projects")
    assert writes.move_to_folder(ctx, [mid], "Projects").applied == [mid]
    phone_folder(bed, "delete", "Projects")
    bed.seed(9)
    report = bed.sync()
    (run,) = report.failed()
    said = status.first_line(run.error)  # what `fmail-nm status` and get_sync_status show
    assert "the server no longer has folder Projects" in said, said
    assert "local folder acct/Projects holds 1 message(s)" in said, said
    # Not "create the folder on the server again": mbsync 1.4 then fails for good on the
    # box's new UIDVALIDITY.
    assert "move_to_folder" in said and "create folder" not in said, said
    assert [p.parent.parent.name for p in bed.files(mid)] == ["Projects"]
    assert bed.find(new) is not None and [p.parent.parent.name for p in bed.files(new)] == [
        "INBOX"]
    # What it says to do settles it: the emptied folder goes at the next sync.
    assert writes.move_to_folder(ctx, [mid], "Archive").applied == [mid]
    report = bed.sync()
    assert report.ok, report.errors()
    assert not (bed.account_dir / "Projects").exists()
    assert [m.message_id for m in bed.server_state()["Archive"]].count(f"<{mid}>") == 1


def test_an_empty_folder_the_phone_deletes_is_removed_here_too(synced_bed: SyncBed) -> None:
    bed = synced_bed
    synced_folder(bed, "Projects")
    phone_folder(bed, "delete", "Projects")
    report = bed.sync()
    assert report.ok, report.errors()
    assert not (bed.account_dir / "Projects").exists()
    assert bed.sync().ok


def test_a_folder_the_phone_deletes_stays_while_its_hold_keeps_a_copy(
        synced_bed: SyncBed, ctx: WriteContext) -> None:
    """A message in Projects and Archive moved to Archive here: its Projects file is held,
    for undo.  The phone then deletes the emptied Projects folder: the folder stays while
    its hold keeps the copy, and the sync says so.  Once the copy is pruned, the next sync
    removes the folder -- the empty hold (which mbsync will not remove) with it."""
    bed = synced_bed
    mid = bed.mid(2)
    synced_folder(bed, "Projects")
    assert writes.move_to_folder(ctx, [mid], "Projects").applied == [mid]
    assert bed.sync().ok
    bed.seed(2, folder="Archive")
    assert bed.sync().ok
    assert writes.move_to_folder(ctx, [mid], "Archive").applied == [mid]
    assert bed.sync().ok
    hold = bed.account_dir / "Projects" / "tmp" / maildir.HOLD
    (held,) = hold.iterdir()
    phone_folder(bed, "delete", "Projects")
    report = bed.sync()
    (run,) = report.failed()
    said = status.first_line(run.error)
    assert "local folder acct/Projects holds 0 message(s)" in said, said
    assert "and 1 copy kept for undo" in said, said
    assert held.exists()
    held.unlink()  # what prune_holds does a month later
    report = bed.sync()
    assert report.ok, report.errors()
    assert not (bed.account_dir / "Projects").exists()
    assert bed.sync().ok


def test_an_empty_folder_the_phone_deletes_with_a_file_left_in_its_tmp_is_reported(
        synced_bed: SyncBed) -> None:
    """A file in the folder's tmp/ (another program's unfinished delivery) keeps mbsync from
    removing the folder -- after it dropped the folder's UIDVALIDITY.  The folder is left as
    it is, and the sync says why; once the file is gone, the next sync removes it."""
    bed = synced_bed
    synced_folder(bed, "Projects")
    stray = bed.account_dir / "Projects" / "tmp" / "1700000000.123_4.host"
    stray.write_bytes(b"partial")
    phone_folder(bed, "delete", "Projects")
    report = bed.sync()
    (run,) = report.failed()
    said = status.first_line(run.error)
    assert "and 1 other file in its tmp/" in said, said
    stray.unlink()
    report = bed.sync()
    assert report.ok, report.errors()
    assert not (bed.account_dir / "Projects").exists()


def test_a_folder_the_phone_renames_is_reported_with_the_mail_only_here(
        synced_bed: SyncBed, ctx: WriteContext) -> None:
    """A rename is a deletion to mbsync: the mail already there arrives under the new name,
    and the old local folder, holding a move not yet pushed, is reported, never removed."""
    bed = synced_bed
    mid, other = bed.mid(2), bed.mid(4)
    synced_folder(bed, "Projects")
    assert writes.move_to_folder(ctx, [other], "Projects").applied == [other]
    assert bed.sync().ok
    assert writes.move_to_folder(ctx, [mid], "Projects").applied == [mid]
    phone_folder(bed, "rename", "Projects", "Renamed")
    report = bed.sync()
    (run,) = report.failed()
    assert "local folder acct/Projects holds 2 message(s)" in status.first_line(run.error)
    assert sorted(p.parent.parent.name for p in bed.files(other)) == ["Projects", "Renamed"]
    assert [p.parent.parent.name for p in bed.files(mid)] == ["Projects"]
    # doctor says it too, from the run the service recorded
    config = bed.config()
    recorded = status.account_status(config.account(ACCOUNT))
    recorded.last_pull = status.run_info(run)
    status.StatusStore(config.data_dir).write(status.ServiceStatus(
        service=status.ServiceInfo(pid=os.getpid(), started_at=run.started, running=True),
        accounts=[recorded]))
    (finding,) = doctor.gone_folder_findings(config)
    assert "local folder acct/Projects holds 2 message(s)" in finding.problem, finding
    assert "move_to_folder" in finding.fix, finding



def phone_edits_draft(bed: SyncBed, message_id: str, old: bytes, new: bytes) -> None:
    """The phone saves its edit of a draft as phones do: it appends the new version (the same
    Message-ID) and deletes the old one."""
    with bed.server.imap(IMAP_USER) as client:
        assert client.select('"Drafts"')[0] == "OK"
        uid = _uid(client, message_id)
        typ, data = client.uid("FETCH", uid, "(BODY.PEEK[])")
        assert typ == "OK", data
        edited = bytes(data[0][1]).replace(b"\r\n\r\n" + old, b"\r\n\r\n" + new)
        assert client.append('"Drafts"', "(\\Draft \\Seen)", None, edited)[0] == "OK"
        assert client.uid("STORE", uid, "+FLAGS", "(\\Deleted)")[0] == "OK"
        assert client.expunge()[0] == "OK"


def drafting(bed: SyncBed, smtp: SmtpBed) -> WriteContext:
    bed.mail_env.fmail_config.write_text(bed.mail_env.fmail_config.read_text() +
                                         'drafts = "Drafts"\n\n' + smtp.send_settings())
    config = bed.reload()
    return WriteContext(config, bed.reader(), bed.writer(),
                        sidecar.sidecar_path(config.data_dir), reindex=bed.index)


def edited_on_the_phone(bed: SyncBed, ctx: WriteContext) -> compose.DraftResult:
    """A draft saved here ("v1") and pushed, then edited on the phone ("v2 from the phone")."""
    draft = compose.save_draft(ctx, ["bob@example.com"], subject="plan", body="v1")
    assert bed.sync().ok
    phone_edits_draft(bed, draft.message_id, b"v1", b"v2 from the phone")
    return draft


def test_a_draft_edited_on_the_phone_is_sent_as_edited_without_mbsyncs_header(
        synced_bed: SyncBed, smtp: SmtpBed) -> None:
    """The phone edits a draft saved here; mbsync pulls.  send_email with the id the model
    knew sends the phone's text -- and not mbsync's X-TUID, which the pulled version carries
    (mbsync put it into the copy it uploaded)."""
    bed = synced_bed
    ctx = drafting(bed, smtp)
    with ctx.reader, ctx.writer:
        draft = edited_on_the_phone(bed, ctx)
        assert bed.sync().ok
        assert send.send_draft(ctx, draft.message_id).sent
    (got,) = smtp.received
    assert got.data.endswith(b"\r\n\r\nv2 from the phone\r\n")
    assert b"X-TUID" not in got.data


def test_a_draft_edited_here_and_on_the_phone_at_once_is_not_sent_with_one_edit_lost(
        synced_bed: SyncBed, smtp: SmtpBed) -> None:
    """The phone edits a draft while the model saves it again here: after the sync both
    versions are in Drafts under one Message-ID.  send_email sent one of them, the other
    edit silently lost; it refuses, and sends nothing."""
    bed = synced_bed
    ctx = drafting(bed, smtp)
    with ctx.reader, ctx.writer:
        draft = edited_on_the_phone(bed, ctx)
        compose.save_draft(ctx, body="v2 from here", draft_id=draft.message_id)
        assert bed.sync().ok
        assert len(bed.files(draft.message_id)) == 2
        with pytest.raises(compose.ComposeError, match="2 different versions in Drafts"):
            send.send_draft(ctx, draft.message_id)
    assert smtp.received == []
