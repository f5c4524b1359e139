"""The sidecar mirror against real notmuch on the fixture mail: complete, exact, incremental,
crash-safe; and the blocklist acting on mail."""

from __future__ import annotations

import email.utils
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fmail_nm import cli
from fmail_nm.clock import iso_from_epoch
from fmail_nm.message import mime
from fmail_nm.message.mime import parse_message
from fmail_nm.message.text import preview, preview_html_text
from fmail_nm.passes import mirror
from fmail_nm.store import maildir, sidecar, threads
from fmail_nm.store.notmuch import Reader
from fmail_nm.tools import reads, render
from fmail_nm.tools.contacts import search
from fmail_nm.tools.sql import query_emails

from .conftest import MailEnv

DUMP_QUERIES = {
    "messages": "SELECT * FROM messages ORDER BY message_id",
    "message_tags": "SELECT * FROM message_tags ORDER BY message_id, tag",
    "message_folders": "SELECT * FROM message_folders ORDER BY message_id, folder",
    "message_addresses": "SELECT * FROM message_addresses ORDER BY message_id, role, email",
    "contact_stats": "SELECT * FROM contact_stats ORDER BY email_address",
    "mirror_counts": "SELECT * FROM mirror_counts ORDER BY name",
    "shown_days": "SELECT * FROM shown_days WHERE n <> 0 ORDER BY day",
    "tag_counts": "SELECT * FROM tag_counts WHERE n <> 0 OR shown <> 0 ORDER BY tag",
}


def sidecar_file(env: MailEnv) -> Path:
    return sidecar.sidecar_path(env.config().data_dir)


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sidecar.opened(path) as conn:
        return {name: conn.execute(sql).fetchall() for name, sql in DUMP_QUERIES.items()}


def sync(env: MailEnv, *, full: bool = False) -> mirror.MirrorReport:
    with Reader() as reader:
        return mirror.sync_sidecar(env.config(), reader, full=full)


def problems(env: MailEnv, *, parse_files: bool = True) -> list[str]:
    with Reader() as reader, sidecar.opened(sidecar_file(env)) as conn:
        return mirror.check(env.config(), reader, conn, parse_files=parse_files)


def rebuilt_copy(env: MailEnv, tmp_path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """What a full rebuild from scratch produces, in a separate sidecar file."""
    other = tmp_path / "fresh.sqlite3"
    with Reader() as reader, sidecar.opened(other) as conn:
        mirror.Mirror(env.config(), reader, conn).sync(full=True)
    return dump(other)


def notmuch_show_all(env: MailEnv) -> list[dict[str, Any]]:
    """Every message as the notmuch CLI shows it (an independent view of the index)."""
    out = env.notmuch("show", "--format=json", "--body=false", "--entire-thread=false",
                      "--exclude=false", "*").stdout
    messages: list[dict[str, Any]] = []

    def walk(node: Any, thread: int) -> None:
        if isinstance(node, dict):
            messages.append({**node, "_thread": thread})
        elif isinstance(node, list):
            for item in node:
                walk(item, thread)
    for number, thread in enumerate(json.loads(out)):
        walk(thread, number)
    return messages


# ---------------------------------------------------------------------------------------------
# Completeness and exactness


def test_every_message_is_mirrored_with_the_fields_notmuch_and_the_file_give(indexed: MailEnv) -> None:
    shown = notmuch_show_all(indexed)
    assert len(shown) == 169
    with sidecar.opened(sidecar_file(indexed)) as conn:
        conn.row_factory = sqlite3.Row
        rows = {r["message_id"]: r for r in conn.execute("SELECT * FROM emails")}
    assert set(rows) == {m["id"] for m in shown}
    threads: dict[int, set[str]] = {}
    for m in shown:
        row, headers = rows[m["id"]], m["headers"]
        name, address = email.utils.parseaddr(headers.get("From", ""))
        assert (row["sender_email"], row["sender_name"]) == (address.lower(), name), m["id"]
        assert row["subject"] == headers.get("Subject", ""), m["id"]
        assert json.loads(row["tags"]) == sorted(m["tags"]), m["id"]
        assert row["is_read"] == int("unread" not in m["tags"])
        assert row["is_flagged"] == int("flagged" in m["tags"])
        expected_date = iso_from_epoch(m["timestamp"]) if m["timestamp"] else None
        assert row["date"] == expected_date, m["id"]
        files = m["filename"] if isinstance(m["filename"], list) else [m["filename"]]
        folders = sorted({maildir.notmuch_folder(f, indexed.mail_root) for f in files})
        assert json.loads(row["folders"]) == folders, m["id"]
        recipients = {a.lower() for _, a in email.utils.getaddresses(
            [headers.get("To", ""), headers.get("Cc", "")]) if a}
        assert {r["email"] for r in json.loads(row["recipients"])} == recipients, m["id"]
        with open(files[0], "rb") as fh:
            raw = fh.read()
        parsed = parse_message(raw, preview_html_text)
        assert row["body_preview"] == preview(parsed.text, 200)
        # what get_email lists; notmuch's tag alone leaves out parts sent inline
        assert row["has_attachment"] == int(bool(parsed.attachments)), m["id"]
        assert row["uid"] == sidecar.uid_for(m["id"])
        threads.setdefault(m["_thread"], set()).add(row["thread_id"])
    assert all(len(ids) == 1 for ids in threads.values())  # one thread id per notmuch thread
    assert len({next(iter(ids)) for ids in threads.values()}) == len(threads)


def test_check_reports_nothing_after_index_and_finds_a_tampered_row(indexed: MailEnv) -> None:
    assert problems(indexed) == []
    with sidecar.opened(sidecar_file(indexed)) as conn:
        conn.execute("UPDATE messages SET subject = 'tampered' "
                     "WHERE message_id = 'school-trip-1@example.com'")
    found = problems(indexed)
    # the row, and its thread's row in the threads table (whose subject it gives)
    assert len(found) == 2 and "school-trip-1@example.com: subject" in found[0]
    assert found[1].startswith("thread ") and "School trip" in found[1]
    cli = indexed.fmail("sidecar", "check", check=False)
    assert cli.returncode == 1 and "2 difference" in cli.stdout
    indexed.fmail("sidecar", "rebuild")
    assert indexed.fmail("sidecar", "check").stdout.strip().endswith("sidecar matches notmuch")


def test_primary_folder_and_account_follow_the_v2_columns(indexed: MailEnv) -> None:
    with sidecar.opened(sidecar_file(indexed)) as conn:
        rows = dict(conn.execute(
            "SELECT message_id, account_name || ':' || folder FROM emails WHERE message_id IN "
            "('school-trip-1@example.com', 'self-cc-1@example.org', 'both-accounts-1@example.com', "
            "'work-trash-1@acme.test')").fetchall())
    assert rows == {
        "school-trip-1@example.com": "personal:INBOX",
        "self-cc-1@example.org": "personal:INBOX",  # Sent + INBOX: the inbox copy is primary
        "both-accounts-1@example.com": "personal:INBOX",
        "work-trash-1@acme.test": "work:Trash",
    }


def test_the_v2_example_query_works_verbatim(indexed: MailEnv) -> None:
    with sidecar.opened(sidecar_file(indexed)) as conn:
        rows = conn.execute("SELECT * FROM emails WHERE folder='INBOX' AND is_read=0 "
                            "ORDER BY date DESC LIMIT 10").fetchall()
    expected = indexed.notmuch("search", "--output=messages", "--sort=newest-first",
                               "--exclude=false", "tag:unread AND (folder:personal/INBOX OR "
                               "folder:work/INBOX)").stdout.split()
    assert [r[10] for r in rows] == [e.removeprefix("id:") for e in expected][:10]


def test_contact_figures_are_harvested_from_headers(indexed: MailEnv) -> None:
    with sidecar.opened(sidecar_file(indexed)) as conn:
        conn.row_factory = sqlite3.Row
        anna = conn.execute("SELECT * FROM contacts WHERE email_address = "
                            "'anna.schmidt@example.com'").fetchone()
        me = conn.execute("SELECT is_me FROM contacts WHERE email_address = 'amorgan@acme.test'").fetchone()
    shown = notmuch_show_all(indexed)
    from_anna = [m for m in shown
                 if email.utils.parseaddr(m["headers"]["From"])[1].lower() == "anna.schmidt@example.com"]
    mine = {"alex@example.org", "alex.morgan@example.org", "amorgan@acme.test"}
    to_anna = [m for m in shown
               if email.utils.parseaddr(m["headers"]["From"])[1].lower() in mine
               and "anna.schmidt@example.com" in {a.lower() for _, a in email.utils.getaddresses(
                   [m["headers"].get("To", ""), m["headers"].get("Cc", "")])}]
    sent_to_anna = [m for m in to_anna if "draft" not in m["tags"]]
    assert anna["messages_from"] == len(from_anna) > 0
    assert anna["messages_to"] == len(sent_to_anna) == len(to_anna) - 1 > 0  # not the draft
    assert anna["name"] == "Anna Schmidt" and anna["is_me"] == 0 and anna["is_blocked"] == 0
    assert me["is_me"] == 1


@pytest.mark.parametrize(("header", "expected"), [
    # notmuch hands the From header decoded: an encoded name's comma has lost its quotes
    ("Smith, Bob <Bob.Smith@corp.test>", ("Smith, Bob", "bob.smith@corp.test")),
    ("M\u00fcller, J\u00fcrgen (Sales) <j@x.de>", ("M\u00fcller, J\u00fcrgen (Sales)", "j@x.de")),
    ('"Smith, Bob" <bob@corp.test>', ("Smith, Bob", "bob@corp.test")),
    ("bob@corp.test (Bob)", ("Bob", "bob@corp.test")),
    ("Bob <bob@corp.test>", ("Bob", "bob@corp.test")),
    ("undisclosed", ("", "undisclosed")),
])
def test_the_sender_of_a_decoded_from_header(header: str, expected: tuple[str, str]) -> None:
    assert threads.sender(header) == expected


def test_a_sender_named_last_comma_first_in_an_encoded_word_is_a_contact_and_blockable(
        indexed: MailEnv, capsys: pytest.CaptureFixture[str]) -> None:
    """Exchange writes "Müller, Jürgen" as one encoded word; decoded by notmuch, the comma
    split the From header: the mirror took "smith" for the sender (a contact no mail has),
    and blocking bob.smith@… tagged none of his mail."""
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1799999901.enc_1.host").write_bytes(
        b"From: =?utf-8?q?Smith=2C_Bob?= <bob.smith@corp.test>\nTo: alex@example.org\n"
        b"Subject: enc\nDate: Mon, 30 Nov 2026 10:01:00 +0000\nMessage-ID: <enc-1@corp.test>\n"
        b"\nhi\n")
    indexed.fmail("index", "--quiet")
    with sidecar.opened(sidecar_file(indexed)) as conn:
        assert conn.execute("SELECT email_address, name, messages_from FROM contacts "
                            "WHERE email_address LIKE '%smith%'").fetchall() == [
            ("bob.smith@corp.test", "Smith, Bob", 1)]
    with Reader() as reader:  # and the read tools name him so, where notmuch's header is read
        [read] = reads.get_thread(reads.Mailbox(indexed.config(), reader),
                                  "enc-1@corp.test").messages
        assert read.from_ == "Smith, Bob <bob.smith@corp.test>"
    cli.main(["contacts", "block", "bob.smith@corp.test", "--no-push"])
    assert "mail tagged blocked: 1" in capsys.readouterr().out
    # Newer mail naming him by his address (as Outlook writes it) does not rename him so.
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1799999902.enc_2.host").write_bytes(
        b'From: "bob.smith@corp.test" <bob.smith@corp.test>\nTo: alex@example.org\n'
        b"Subject: enc\nDate: Tue, 1 Dec 2026 10:01:00 +0000\nMessage-ID: <enc-2@corp.test>\n"
        b"\nhi\n")
    indexed.fmail("index", "--quiet")
    for full in (False, True):  # added up, and counted anew
        sync(indexed, full=full)
        with sidecar.opened(sidecar_file(indexed)) as conn:
            assert conn.execute("SELECT name, messages_from FROM contacts WHERE email_address "
                                "= 'bob.smith@corp.test'").fetchone() == ("Smith, Bob", 2)
    # Mirrors an earlier version built so: contacts named by an address are named anew, and
    # messages whose sender is no address are read again from the index.
    with sidecar.opened(sidecar_file(indexed)) as conn:
        conn.execute("UPDATE contact_stats SET name = email_address "
                     "WHERE email_address = 'bob.smith@corp.test'")
        conn.execute("PRAGMA user_version = 16")
    sync(indexed)
    with sidecar.opened(sidecar_file(indexed)) as conn:
        assert conn.execute("SELECT name FROM contacts WHERE email_address "
                            "= 'bob.smith@corp.test'").fetchone() == ("Smith, Bob",)
    with sidecar.opened(sidecar_file(indexed)) as conn:
        conn.execute("UPDATE messages SET sender_email = 'smith', sender_name = '' "
                     "WHERE message_id = 'enc-1@corp.test'")
        conn.execute("UPDATE message_addresses SET email = 'smith', name = '' "
                     "WHERE message_id = 'enc-1@corp.test' AND role = 'from'")
        mirror.refresh_stats(conn, ["smith", "bob.smith@corp.test"])
        conn.execute("PRAGMA user_version = 16")
    assert problems(indexed, parse_files=False) != []
    sync(indexed)
    assert problems(indexed, parse_files=False) == []
    with sidecar.opened(sidecar_file(indexed)) as conn:
        assert conn.execute("SELECT count(*) FROM contacts WHERE email_address = 'smith'"
                            ).fetchone() == (0,)


# ---------------------------------------------------------------------------------------------
# Incremental sync


def _file_of(env: MailEnv, message_id: str) -> Path:
    return Path(env.notmuch("search", "--output=files", "--exclude=false",
                            f"id:{message_id}").stdout.split()[0])


def test_incremental_sync_after_tags_moves_and_removals_equals_a_rebuild(
        indexed: MailEnv, tmp_path: Path) -> None:
    path = sidecar_file(indexed)
    indexed.notmuch("tag", "+important", "-inbox", "--", "id:school-trip-1@example.com")
    moved = _file_of(indexed, "lunch-1@acme.test")
    shutil.move(moved, indexed.mail_root / "work" / "Trash" / "cur" / moved.name.split(",U=")[0])
    os.unlink(_file_of(indexed, "water-1@example.com"))
    indexed.notmuch("new")  # runs our post-new hook, which syncs the sidecar
    with sidecar.opened(path) as conn:
        assert conn.execute("SELECT count(*) FROM messages WHERE message_id = 'water-1@example.com'").fetchone()[0] == 0
        assert conn.execute("SELECT folder FROM messages WHERE message_id = 'lunch-1@acme.test'").fetchone()[0] == "Trash"
        assert "important" in json.loads(conn.execute(
            "SELECT tags FROM messages WHERE message_id = 'school-trip-1@example.com'").fetchone()[0])
    assert problems(indexed) == []
    assert dump(path) == rebuilt_copy(indexed, tmp_path)


def _delivered(env: MailEnv, name: str, headers: str) -> None:
    (env.mail_root / "personal" / "INBOX" / "new" / name).write_text(
        textwrap.dedent(headers).lstrip() + "\nA body.\n")


def test_contact_figures_added_up_for_new_mail_equal_a_recount(indexed: MailEnv,
                                                                tmp_path: Path) -> None:
    """New mail adds to its addresses' figures without recounting them, except where the
    name it brings may or may not be the newest: the result is a full rebuild's."""
    path = sidecar_file(indexed)
    with sidecar.opened(path) as conn:
        before = dict(conn.execute("SELECT email_address, messages_from FROM contact_stats"))
    # newer than all of Anna's mail, under another name: the name follows it
    _delivered(indexed, "1796000000.a.host", """
        From: Anna S. <anna.schmidt@example.com>
        To: Alex Morgan <alex@example.org>, Nobody New <nobody-new@example.net>
        Subject: Figures 1
        Date: Thu, 30 Dec 2027 10:00:00 +0000
        Message-ID: <figures-1@example.com>
        """)
    # older than Anna's newest mail and naming her otherwise: she is recounted
    _delivered(indexed, "1796000001.b.host", """
        From: Alex Morgan <alex@example.org>
        To: "Schmidt, Anna" <anna.schmidt@example.com>
        Cc: anna.schmidt@example.com
        Subject: Figures 2
        Date: Mon, 02 Jan 2006 10:00:00 +0000
        Message-ID: <figures-2@example.org>
        """)
    # no name, no date
    _delivered(indexed, "1796000002.c.host", """
        From: ben.carter@example.net
        To: alex@example.org
        Subject: Figures 3
        Message-ID: <figures-3@example.net>
        """)
    indexed.notmuch("new", "--no-hooks")
    # Anna, Ben and Alex are added to; the new address alone is counted
    assert sync(indexed).recounted == 1
    figures = ("contact_stats", "mirror_counts", "shown_days", "tag_counts")
    mine, rebuilt = dump(path), rebuilt_copy(indexed, tmp_path)
    assert [mine[t] for t in figures] == [rebuilt[t] for t in figures]
    with sidecar.opened(path) as conn:
        after = dict(conn.execute("SELECT email_address, messages_from FROM contact_stats"))
        anna = conn.execute("SELECT name, messages_to FROM contact_stats "
                            "WHERE email_address = 'anna.schmidt@example.com'").fetchone()
    assert after["anna.schmidt@example.com"] == before["anna.schmidt@example.com"] + 1
    assert after["ben.carter@example.net"] == before["ben.carter@example.net"] + 1
    assert after["nobody-new@example.net"] == 0
    assert anna[0] == "Anna S."  # the newest message naming her


ANNA, ZOE, ME = "anna.schmidt@example.com", "zoe.quinn@example.net", "alex@example.org"
BAKE_SALE = """
    From: Alex Morgan <alex@example.org>
    To: Anna Schmidt <anna.schmidt@example.com>, Zoe Quinn <zoe.quinn@example.net>
    Subject: Bake sale
    Date: Fri, 31 Dec 2027 10:00:00 +0000
    Message-ID: <bake-sale@example.org>
    """
BAKE_SALE_DATE = "2027-12-31T10:00:00Z"  # newer than any mail of the fixture


def _figures(env: MailEnv) -> dict[str, tuple[Any, ...]]:
    """Each contact's harvested figures: name, first and last seen, messages from and to."""
    with sidecar.opened(sidecar_file(env)) as conn:
        return {r[0]: r[1:] for r in conn.execute("SELECT * FROM contact_stats")}


def _put(env: MailEnv, folder: str, name: str, headers: str) -> Path:
    """A message file written straight into a Maildir folder's cur/, as a mail client does."""
    path = env.mail_root / folder / "cur" / name
    path.write_text(textwrap.dedent(headers).lstrip() + "\nA body.\n")
    return path


def _same_figures_as_a_rebuild(env: MailEnv, tmp_path: Path) -> bool:
    return dump(sidecar_file(env))["contact_stats"] == rebuilt_copy(env, tmp_path)["contact_stats"]


def test_a_draft_counts_in_no_figures_until_it_is_sent(indexed: MailEnv, tmp_path: Path) -> None:
    """A draft is not mail to anyone: it raises no one's counts or last_seen, makes no
    contact of an address it alone names, and is not offered by the contacts search; sent
    (the Sent copy keeping the draft's Message-ID, the draft file gone), it counts once."""
    before = _figures(indexed)
    draft = _put(indexed, "personal/Drafts", "1796400000.1_1.host:2,DS", BAKE_SALE)
    indexed.notmuch("new")  # runs our post-new hook, which syncs the sidecar
    assert "draft" in indexed.notmuch("search", "--output=tags", "id:bake-sale@example.org").stdout
    assert _figures(indexed) == before
    with sidecar.opened(sidecar_file(indexed)) as conn:
        assert search(conn, "quinn") == []

    draft.unlink()
    _put(indexed, "personal/Sent", "1796400001.1_1.host:2,S", BAKE_SALE)
    indexed.notmuch("new")
    after = _figures(indexed)
    name, first, _, sent_from, sent_to = before[ANNA]
    assert after[ANNA] == (name, first, BAKE_SALE_DATE, sent_from, sent_to + 1)
    assert after[ZOE] == ("Zoe Quinn", BAKE_SALE_DATE, BAKE_SALE_DATE, 0, 1)
    assert after[ME][2:4] == (BAKE_SALE_DATE, before[ME][3] + 1)
    assert _same_figures_as_a_rebuild(indexed, tmp_path)


def test_a_draft_deleted_or_sent_under_a_new_message_id_leaves_only_the_sent_mail(
        indexed: MailEnv, tmp_path: Path) -> None:
    """mutt and aerc send a draft as a new message and delete the draft: the figures are
    those of the sent message alone; a draft deleted unsent leaves them as they were."""
    before = _figures(indexed)
    draft = _put(indexed, "personal/Drafts", "1796400000.1_1.host:2,DS", BAKE_SALE)
    indexed.notmuch("new")
    assert _figures(indexed) == before
    draft.unlink()
    indexed.notmuch("new")
    assert _figures(indexed) == before

    draft = _put(indexed, "personal/Drafts", "1796400002.1_1.host:2,DS", BAKE_SALE)
    indexed.notmuch("new")
    draft.unlink()
    _put(indexed, "personal/Sent", "1796400003.1_1.host:2,S",
         BAKE_SALE.replace("<bake-sale@", "<bake-sale-sent@"))
    indexed.notmuch("new")
    after = _figures(indexed)
    assert after[ANNA][2:] == (BAKE_SALE_DATE, before[ANNA][3], before[ANNA][4] + 1)
    assert after[ZOE][1:] == (BAKE_SALE_DATE, BAKE_SALE_DATE, 0, 1)
    assert _same_figures_as_a_rebuild(indexed, tmp_path)


def test_a_draft_tag_set_or_taken_off_recounts_the_messages_addresses(
        indexed: MailEnv, tmp_path: Path) -> None:
    """A tag-only change that makes a message a draft or no longer one recounts the
    figures of its addresses -- those alone."""
    before = _figures(indexed)
    indexed.notmuch("tag", "-draft", "--", "id:draft-1@example.org")  # to Anna, from the user
    assert sync(indexed).recounted == 2
    assert _figures(indexed)[ANNA][4] == before[ANNA][4] + 1
    assert _same_figures_as_a_rebuild(indexed, tmp_path)

    indexed.notmuch("tag", "+draft", "--", "id:draft-1@example.org")
    assert sync(indexed).recounted == 2
    assert _figures(indexed) == before


HELPER, LEAKED = "hidden.helper@example.net", "leaked.bcc@example.net"
BEN = "ben.carter@example.net"
# The user's Sent copy keeps its Bcc (mutt, aerc and fmail-nm's own sending file it so).
BCC_SENT = """
    From: Alex Morgan <alex@example.org>
    To: Anna Schmidt <anna.schmidt@example.com>
    Bcc: Hidden Helper <hidden.helper@example.net>
    Subject: Bake sale helpers
    Date: Fri, 31 Dec 2027 10:00:00 +0000
    Message-ID: <bcc-sent@example.org>
    """
# Mail received whose sender's client leaked its Bcc (naming a known contact otherwise, too).
BCC_RECEIVED = """
    From: Anna Schmidt <anna.schmidt@example.com>
    To: Alex Morgan <alex@example.org>
    Bcc: Leaked Stranger <leaked.bcc@example.net>, Not Ben <ben.carter@example.net>
    Subject: Bake sale list
    Date: Fri, 31 Dec 2027 11:00:00 +0000
    Message-ID: <bcc-received@example.com>
    """


def test_the_bcc_of_the_users_sent_mail_are_contacts_written_to_and_no_other_bcc_is(
        indexed: MailEnv, tmp_path: Path) -> None:
    """Whom the user wrote to in Bcc is someone the user wrote to; a Bcc that mail received
    from others shows makes no contact, nor names one.  A mirror written before Bcc was
    kept gets it by parsing again the files of the user's own mail alone, once."""
    ben = _figures(indexed)[BEN]
    _put(indexed, "personal/Sent", "1796400010.1_1.host:2,S", BCC_SENT)
    _put(indexed, "personal/INBOX", "1796400011.1_1.host:2,", BCC_RECEIVED)
    indexed.notmuch("new")  # runs our post-new hook, which syncs the sidecar
    assert _figures(indexed)[HELPER] == ("Hidden Helper", BAKE_SALE_DATE, BAKE_SALE_DATE, 0, 1)
    assert LEAKED not in _figures(indexed) and _figures(indexed)[BEN] == ben
    assert _same_figures_as_a_rebuild(indexed, tmp_path)

    path = sidecar_file(indexed)
    with sidecar.opened(path) as conn:  # as schema 17 mirrored it: To and Cc alone
        for mid in ("bcc-sent@example.org", "bcc-received@example.com"):
            [recipients] = conn.execute("SELECT recipients FROM messages WHERE message_id = ?",
                                        (mid,)).fetchone()
            kept = [r for r in json.loads(recipients) if r["kind"] != "bcc"]
            conn.execute("UPDATE messages SET recipients = ? WHERE message_id = ?",
                         (json.dumps(kept, ensure_ascii=False), mid))
        conn.execute("DELETE FROM message_addresses WHERE role NOT IN ('from', 'to', 'cc')")
        mirror.refresh_stats(conn, [HELPER])
        own, mailbox = conn.execute(
            "SELECT count(*) FILTER (WHERE is_sent = 1 OR is_draft = 1 OR message_id IN "
            "(SELECT message_id FROM message_tags WHERE tag = 'sent')), count(*) "
            "FROM messages").fetchone()
        conn.execute("PRAGMA user_version = 17")
    assert HELPER not in _figures(indexed)
    report = sync(indexed)
    assert report.parsed == own < mailbox / 4  # the user's own mail, not the mailbox
    assert _figures(indexed)[HELPER] == ("Hidden Helper", BAKE_SALE_DATE, BAKE_SALE_DATE, 0, 1)
    assert LEAKED not in _figures(indexed) and _figures(indexed)[BEN] == ben
    assert dump(path)["contact_stats"] == rebuilt_copy(indexed, tmp_path)["contact_stats"]
    # Mail received keeps the recipients it was mirrored with (no figure counts its Bcc).
    assert [p[:p.index(" is ")] for p in problems(indexed)] == [
        "bcc-received@example.com: recipients"]
    assert sync(indexed).parsed == 0  # done once

    with sidecar.opened(path) as conn:  # as before the user's address was configured
        conn.execute("DELETE FROM me WHERE email = ?", (ME,))
        conn.execute("UPDATE messages SET is_sent = 0 WHERE sender_email = ?", (ME,))
        mirror.refresh_stats(conn, [HELPER])
    assert HELPER not in _figures(indexed)
    sync(indexed)  # the user's mail from it is the user's again: so is its Bcc
    assert _figures(indexed)[HELPER] == ("Hidden Helper", BAKE_SALE_DATE, BAKE_SALE_DATE, 0, 1)


def test_a_listing_names_whom_the_users_mail_went_to_openly_not_its_bcc(
        indexed: MailEnv) -> None:
    """The mirror keeps the Bcc of the user's Sent copy for contacts, but a listing's ``to``
    (search, unanswered threads) names the open recipients alone, as get_email does and as
    the listing did when the mirror is behind: a Bcc shown there as a recipient is one a
    follow-up written from it would give away."""
    _put(indexed, "personal/Sent", "1796400010.1_1.host:2,S", BCC_SENT)
    indexed.notmuch("new")  # runs our post-new hook, which syncs the sidecar
    anna = ["Anna Schmidt <anna.schmidt@example.com>"]
    with Reader() as reader:
        mb = reads.Mailbox(indexed.config(), reader)
        [row] = reads.search_emails(mb, "id:bcc-sent@example.org").results
        assert row.to == anna
        assert reads.get_email(mb, row.id).to == anna
        unanswered = reads.find_unanswered_threads(mb, limit=500).threads
        [thread] = [t for t in unanswered if t.last == row.id]
        assert thread.to == anna


ALICE, BOB, CAROL, ERIN = ("alice.smith@example.com", "bob.jones@example.net",
                           "carol.white@example.net", "erin.black@example.net")
GROUP, DEV_LIST = "golang-nuts@googlegroups.com", "dev@lists.example.org"
# List mail whose From the list rewrote to its own address (DMARC mitigation): Google Groups
# names the author in X-Original-From and Reply-To, Mailman in Reply-To -- or, when replies
# go to the list, nowhere.
GROUP_POST = f"""
    From: "'Alice Smith' via golang-nuts" <{GROUP}>
    Reply-To: Alice Smith <{ALICE}>
    X-Original-From: Alice Smith <{ALICE}>
    To: golang-nuts <{GROUP}>
    List-Id: <golang-nuts.googlegroups.com>
    Subject: Generics question
    Date: Fri, 31 Dec 2027 12:00:00 +0000
    Message-ID: <group-post@googlegroups.com>
    """
MAILMAN_POST = f"""
    From: Bob Jones via dev-list <{DEV_LIST}>
    Reply-To: {BOB}
    To: {DEV_LIST}
    List-Id: Dev list <dev.lists.example.org>
    Subject: Release plan
    Date: Fri, 31 Dec 2027 13:00:00 +0000
    Message-ID: <mailman-post@lists.example.org>
    """
MAILMAN_REPLY_TO_LIST = f"""
    From: Carol White via dev-list <{DEV_LIST}>
    Reply-To: {DEV_LIST}
    To: {DEV_LIST}
    List-Id: Dev list <dev.lists.example.org>
    Subject: Re: Release plan
    Date: Fri, 31 Dec 2027 14:00:00 +0000
    Message-ID: <mailman-reply@lists.example.org>
    """
# Not list mail: its Reply-To is no one who wrote to the user, its sender's name stays.
PORTAL = f"""
    From: Dan Green via Acme Portal <portal@acme.example>
    Reply-To: Erin Black <{ERIN}>
    To: Alex Morgan <alex@example.org>
    Subject: You have a message
    Date: Fri, 31 Dec 2027 15:00:00 +0000
    Message-ID: <portal@acme.example>
    """
REWRITTEN = {"list-1": GROUP_POST, "list-2": MAILMAN_POST, "list-3": MAILMAN_REPLY_TO_LIST}
# List mail from its author, whose own name says " via ": not rewritten, her Reply-To no author.
VIA_IN_HER_NAME = f"""
    From: Maria via Roma <maria@roma.example>
    Reply-To: boss@office.example
    To: {DEV_LIST}
    List-Id: Dev list <dev.lists.example.org>
    Subject: Trip to Roma
    Date: Fri, 31 Dec 2027 17:00:00 +0000
    Message-ID: <maria-post@roma.example>
    """


def _deliver_list_mail(env: MailEnv) -> None:
    for number, headers in enumerate([*REWRITTEN.values(), PORTAL]):
        _put(env, "personal/INBOX", f"179640002{number}.1_1.host:2,", headers)
    env.notmuch("new")  # runs our post-new hook, which syncs the sidecar


def _list_mail_figures_are_the_authors(env: MailEnv) -> None:
    figures = _figures(env)
    assert figures[ALICE] == ("Alice Smith", "2027-12-31T12:00:00Z", "2027-12-31T12:00:00Z", 1, 0)
    assert figures[BOB] == ("Bob Jones", "2027-12-31T13:00:00Z", "2027-12-31T13:00:00Z", 1, 0)
    # The list's address is still what the mail came from, named as the list names itself.
    assert figures[GROUP][0] == "golang-nuts" and figures[GROUP][3] == 1
    assert figures[DEV_LIST][0] is None and figures[DEV_LIST][3] == 2
    assert CAROL not in figures and ERIN not in figures
    assert figures["portal@acme.example"][0] == "Dan Green via Acme Portal"


def test_the_author_of_list_mail_whose_from_the_list_rewrote_is_a_contact(
        indexed: MailEnv, tmp_path: Path) -> None:
    """A list that rewrites From to its own address leaves the author in X-Original-From or
    Reply-To: the author is the contact the mail is from, named as the author; the list's
    address does not take the author's name.  Listings show the mail as the list's, and no
    recipient more; a Reply-To of mail no list rewrote makes no contact."""
    _deliver_list_mail(indexed)
    _list_mail_figures_are_the_authors(indexed)
    _put(indexed, "personal/INBOX", "1796400025.1_1.host:2,", VIA_IN_HER_NAME)
    indexed.notmuch("new")
    figures = _figures(indexed)
    assert "boss@office.example" not in figures
    assert figures["maria@roma.example"][0] == "Maria via Roma"
    assert _same_figures_as_a_rebuild(indexed, tmp_path)
    assert problems(indexed) == []
    with Reader() as reader:
        [row] = reads.search_emails(reads.Mailbox(indexed.config(), reader),
                                    "id:group-post@googlegroups.com").results
        assert row.from_ == f"'Alice Smith' via golang-nuts <{GROUP}>"
    with sidecar.opened(sidecar_file(indexed)) as conn:
        [recipients] = conn.execute("SELECT recipients FROM emails "
                                    "WHERE message_id = 'group-post@googlegroups.com'").fetchone()
        assert json.loads(recipients) == [{"name": "golang-nuts", "email": GROUP, "kind": "to"}]
        assert search(conn, "alice")[0]["email_address"] == ALICE

    # Filed elsewhere, the mail keeps its author without its file being parsed again; a
    # newer post adds to the author's figures as a recount would count them.
    moved = _file_of(indexed, "group-post@googlegroups.com")
    shutil.move(moved, indexed.mail_root / "personal" / "Archive" / "cur" / moved.name)
    _put(indexed, "personal/INBOX", "1796400030.1_1.host:2,", GROUP_POST.replace(
        "group-post@", "group-post-2@").replace("12:00:00", "16:00:00"))
    indexed.notmuch("new")
    assert _figures(indexed)[ALICE] == ("Alice Smith", "2027-12-31T12:00:00Z",
                                        "2027-12-31T16:00:00Z", 2, 0)
    assert _same_figures_as_a_rebuild(indexed, tmp_path)
    assert problems(indexed) == []


def test_a_mirror_of_list_mail_written_before_the_upgrade_gains_its_authors(
        indexed: MailEnv, tmp_path: Path) -> None:
    """A sidecar of schema 22 knew no list author (its role did not exist): the upgrade
    parses again the list mail whose sender may be the list's, and that alone, once."""
    _deliver_list_mail(indexed)
    path = sidecar_file(indexed)
    with sidecar.opened(path) as conn:  # as schema 22 wrote it
        conn.executescript("""
            CREATE TABLE message_addresses_old (
                message_id TEXT NOT NULL REFERENCES messages(message_id) ON DELETE CASCADE,
                role       TEXT NOT NULL CHECK (role IN ('from', 'to', 'cc', 'bcc')),
                email      TEXT NOT NULL,
                name       TEXT NOT NULL,
                PRIMARY KEY (email, role, message_id)
            ) WITHOUT ROWID;
            INSERT INTO message_addresses_old SELECT a.message_id, a.role, a.email,
                CASE a.role WHEN 'from' THEN m.sender_name ELSE a.name END
                FROM message_addresses a JOIN messages m USING (message_id)
                WHERE a.role IN ('from', 'to', 'cc', 'bcc');
            DROP TABLE message_addresses;
            ALTER TABLE message_addresses_old RENAME TO message_addresses;
            CREATE INDEX message_addresses_message ON message_addresses(message_id);
            """)
        mirror.refresh_stats(conn, [r[0] for r in conn.execute(
            "SELECT email_address FROM contact_stats UNION SELECT email FROM message_addresses")])
        lists = conn.execute("SELECT count(*) FROM messages WHERE list_id IS NOT NULL"
                             ).fetchone()[0]
        conn.execute("PRAGMA user_version = 22")
    old = _figures(indexed)
    assert ALICE not in old and BOB not in old
    assert old[DEV_LIST][0] == "Carol White via dev-list"
    report = sync(indexed)
    assert report.parsed == len(REWRITTEN) < lists  # the rewritten list mail, not all of it
    _list_mail_figures_are_the_authors(indexed)
    assert _same_figures_as_a_rebuild(indexed, tmp_path)
    assert problems(indexed) == []
    assert sync(indexed).parsed == 0  # done once


def test_a_mirror_that_read_a_list_members_reply_to_as_her_authors_reads_it_again(
        indexed: MailEnv, tmp_path: Path) -> None:
    """Schema 25 read list mail from "Maria via Roma" <maria@roma.example>, her own address,
    as the list's rewrite: her Reply-To its author, her address unnamed.  The upgrade parses
    such list mail again."""
    _put(indexed, "personal/INBOX", "1796400025.1_1.host:2,", VIA_IN_HER_NAME)
    indexed.notmuch("new")  # runs our post-new hook, which syncs the sidecar
    with sidecar.opened(sidecar_file(indexed)) as conn:  # as schema 26 wrote it
        conn.execute("UPDATE message_addresses SET name = '' WHERE role = 'from' "
                     "AND message_id = 'maria-post@roma.example'")
        conn.execute("INSERT INTO message_addresses VALUES ('maria-post@roma.example', "
                     "'author', 'boss@office.example', 'Maria')")
        mirror.refresh_stats(conn, ["maria@roma.example", "boss@office.example"])
        conn.execute("PRAGMA user_version = 26")
    assert "boss@office.example" in _figures(indexed)
    sync(indexed)
    figures = _figures(indexed)
    assert "boss@office.example" not in figures
    assert figures["maria@roma.example"][0] == "Maria via Roma"
    assert _same_figures_as_a_rebuild(indexed, tmp_path)
    assert problems(indexed) == []


def test_a_mirror_with_list_authors_set_back_before_schema_18_migrates_again(
        indexed: MailEnv, tmp_path: Path) -> None:
    """The migrations stay runnable over a schema set back, as tests of older versions set
    it: version 18 remakes message_addresses without the role 'author', which version 23
    lets in again and its parse fills."""
    _deliver_list_mail(indexed)
    with sidecar.opened(sidecar_file(indexed)) as conn:
        conn.execute("PRAGMA user_version = 17")
    sync(indexed)
    _list_mail_figures_are_the_authors(indexed)
    assert _same_figures_as_a_rebuild(indexed, tmp_path)
    assert problems(indexed) == []


def test_sync_without_changes_parses_nothing(indexed: MailEnv) -> None:
    report = sync(indexed)
    assert (report.full, report.upserted, report.parsed, report.removed) == (False, 0, 0, 0)
    indexed.notmuch("tag", "+x", "--", "id:school-trip-1@example.com")
    report = sync(indexed)
    # a tag change re-reads no file, and changes no contact's figures
    assert (report.upserted, report.parsed, report.recounted) == (1, 0, 0)


def test_a_removed_message_is_dropped_even_though_the_revision_does_not_move(indexed: MailEnv) -> None:
    before = indexed.notmuch("count", "--lastmod", "*").stdout.split()[2]
    os.unlink(_file_of(indexed, "water-1@example.com"))
    indexed.notmuch("new", "--no-hooks")
    assert indexed.notmuch("count", "--lastmod", "*").stdout.split()[2] == before
    report = sync(indexed)
    assert report.removed == 1
    assert problems(indexed, parse_files=False) == []


def test_a_new_notmuch_database_means_a_full_rebuild(indexed: MailEnv, tmp_path: Path) -> None:
    shutil.rmtree(indexed.mail_root / ".notmuch")
    indexed.notmuch("new", "--no-hooks")
    report = sync(indexed)
    assert report.full and report.upserted == 169
    assert problems(indexed) == []


def leave_list_mail_marked(indexed: MailEnv) -> None:
    """New list mail mirrored and marked for tagging, the tagging not run: what a post-new
    pass that stopped after its mirror step (the notmuch lock held elsewhere, a kill) leaves."""
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1799999999.pending_1.host").write_bytes(
        b"From: News <news@lists.example.org>\nTo: alex@example.org\nSubject: weekly\n"
        b"Message-ID: <pending-1@lists.example.org>\nList-Id: <weekly.lists.example.org>\n"
        b"Date: Mon, 30 Nov 2026 10:00:00 +0000\n\nhello\n")
    indexed.notmuch("new", "--no-hooks")
    sync(indexed)  # the pass's mirror step, and no tagging after it


def test_a_rebuild_keeps_the_mail_a_failed_pass_left_untagged_marked(indexed: MailEnv) -> None:
    """A post-new pass that stops after its mirror step (the notmuch lock held elsewhere, a
    kill) leaves new mail marked for tagging; `sidecar rebuild`, which `sidecar check` names
    for that difference, dropped the mark, and the mail never got its rules' tags."""
    leave_list_mail_marked(indexed)
    with sidecar.opened(sidecar_file(indexed)) as conn:
        assert sidecar.pending_tagging(conn) == [("pending-1@lists.example.org",
                                                  "weekly.lists.example.org")]
    indexed.fmail("sidecar", "rebuild")
    indexed.fmail("index", "--quiet")
    tags = indexed.notmuch("search", "--output=tags", "id:pending-1@lists.example.org").stdout
    assert "list/weekly.lists.example.org" in tags.split()
    assert problems(indexed) == []


def test_sidecar_check_names_the_command_that_tags_mail_left_marked(indexed: MailEnv) -> None:
    """Mail a failed pass left marked for tagging is a difference `sidecar check` reports; the
    command its advice names must tag it (`sidecar sync`, once named, keeps the mark)."""
    leave_list_mail_marked(indexed)
    checked = indexed.fmail("sidecar", "check", check=False)
    assert checked.returncode == 1 and "needs_tagging is 1" in checked.stdout, checked.stdout
    advised = re.search(r"`fmail-nm ([^`]+)`", checked.stdout.splitlines()[-1])
    assert advised is not None, checked.stdout
    indexed.fmail(*advised.group(1).split())
    tags = indexed.notmuch("search", "--output=tags", "id:pending-1@lists.example.org").stdout
    assert "list/weekly.lists.example.org" in tags.split(), (advised.group(1), tags)
    assert problems(indexed) == []


CRASHING_SYNC = textwrap.dedent("""
    import os, signal, sys
    from fmail_nm.passes import mirror
    from fmail_nm.store import sidecar
    from fmail_nm.app import load_config
    from fmail_nm.store.notmuch import Reader

    batches = 0
    def crash(n):
        global batches
        batches += 1
        if batches == 3:
            os.kill(os.getpid(), signal.SIGKILL)
    config = load_config()
    with Reader() as reader, sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        mirror.Mirror(config, reader, conn, batch_size=20, on_batch=crash).sync(full=True)
    print("not killed")
""")


def test_a_sync_killed_midway_is_completed_by_the_next_run(indexed: MailEnv, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", CRASHING_SYNC], env={**os.environ, **indexed.env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    with sidecar.opened(sidecar_file(indexed)) as conn:
        partial = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        window = json.loads(sidecar.get_state(conn, "window") or "{}")
    assert partial == 60 and window["after"]  # three committed batches, position saved
    report = sync(indexed)
    assert not report.full and report.upserted == 169 - 60
    assert problems(indexed) == []
    assert dump(sidecar_file(indexed)) == rebuilt_copy(indexed, tmp_path)


# ---------------------------------------------------------------------------------------------
# Blocklist


NEW_FROM_BANK = b"""From: Northwind Bank <no-reply@northwind-bank.example.com>
To: Alex Morgan <alex@example.org>
Subject: Your December statement
Date: Tue, 01 Dec 2026 06:15:00 +0000
Message-ID: <statement-2026-12@northwind-bank.example.com>

Your statement is ready.
"""


@pytest.fixture
def mailbox(indexed: MailEnv) -> Iterator[reads.Mailbox]:
    with Reader() as reader:
        yield reads.Mailbox(indexed.config(), reader)


def _search_ids(mb: reads.Mailbox, query: str) -> set[str]:
    return {r.id for r in reads.search_emails(mb, query, limit=500).results}


def test_blocking_hides_a_sender_now_and_later_and_unblocking_restores(
        indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    bank = "no-reply@northwind-bank.example.com"
    before_inbox = _search_ids(mailbox, "in:inbox")
    from_bank = _search_ids(mailbox, f"from:{bank}")
    assert len(from_bank) == 23 and from_bank & before_inbox

    out = indexed.fmail("contacts", "block", bank).stdout
    assert "mail tagged blocked: 23" in out
    assert _search_ids(mailbox, f"from:{bank}") == set()
    assert _search_ids(mailbox, "in:inbox") == before_inbox - from_bank
    assert _search_ids(mailbox, "is:blocked") == from_bank

    (indexed.mail_root / "personal" / "INBOX" / "new" / "1796200000.1_1.host").write_bytes(NEW_FROM_BANK)
    indexed.fmail("index", "--quiet")
    new_tags = indexed.notmuch("search", "--output=tags", "--exclude=false",
                               "id:statement-2026-12@northwind-bank.example.com").stdout.split()
    assert {"blocked", "spam"} <= set(new_tags)
    statement = sidecar.uid_for("statement-2026-12@northwind-bank.example.com")
    assert statement in _search_ids(mailbox, "is:blocked")

    indexed.fmail("contacts", "unblock", bank)
    assert _search_ids(mailbox, f"from:{bank}") == from_bank | {statement}
    assert _search_ids(mailbox, "is:blocked") == set()
    assert problems(indexed, parse_files=False) == []


def _tags_of(env: MailEnv, message_id: str) -> set[str]:
    return set(env.notmuch("search", "--output=tags", "--exclude=false",
                           f"id:{message_id}").stdout.split())


def test_blocking_a_list_author_blocks_her_posts_the_list_rewrote_now_and_later(
        indexed: MailEnv, mailbox: reads.Mailbox, tmp_path: Path) -> None:
    """Her posts come from the list's address, which notmuch's from: finds, but they count
    as hers: blocking her blocks them -- and her next post -- and keeps her figures; one
    undo or an unblock puts them back.  The list's address blocked blocks all its mail, and
    stays blocked while she is unblocked."""
    from fmail_nm.passes.changes import WriteContext
    from fmail_nm.store.notmuch import Writer
    from fmail_nm.tools import writes

    _deliver_list_mail(indexed)
    post, bobs = "group-post@googlegroups.com", "mailman-post@lists.example.org"
    tags_before, figures_before = _tags_of(indexed, post), _figures(indexed)[ALICE]
    assert "blocked" not in tags_before

    assert "mail tagged blocked: 1" in indexed.fmail("contacts", "block", ALICE).stdout
    assert {"blocked", "spam"} <= _tags_of(indexed, post)
    assert _search_ids(mailbox, "is:blocked") == {sidecar.uid_for(post)}
    assert "blocked" not in _tags_of(indexed, bobs)
    assert _figures(indexed)[ALICE] == figures_before
    assert _same_figures_as_a_rebuild(indexed, tmp_path)
    with sidecar.opened(sidecar_file(indexed)) as conn:  # the block's entry names her post
        [changes] = conn.execute("SELECT changes FROM audit_log ORDER BY id DESC").fetchone()
    assert [c["message_id"] for c in json.loads(changes) if "message_id" in c] == [post]
    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(indexed.config(), reader, writer, sidecar_file(indexed))
        writes.undo_last_write(ctx)
    assert _tags_of(indexed, post) == tags_before

    indexed.fmail("contacts", "block", ALICE)
    _put(indexed, "personal/INBOX", "1796400040.1_1.host:2,", GROUP_POST.replace(
        "group-post@", "group-post-2@").replace("12:00:00", "16:00:00"))
    indexed.notmuch("new")  # runs our post-new hook: the blocklist catches her new post
    assert {"blocked", "spam"} <= _tags_of(indexed, "group-post-2@googlegroups.com")
    assert "mail tagged blocked: 0" in indexed.fmail("contacts", "block", GROUP).stdout
    indexed.fmail("contacts", "unblock", ALICE)
    assert _search_ids(mailbox, "is:blocked") == {
        sidecar.uid_for(post), sidecar.uid_for("group-post-2@googlegroups.com")}
    indexed.fmail("contacts", "unblock", GROUP)
    assert _search_ids(mailbox, "is:blocked") == set()
    assert _tags_of(indexed, post) == tags_before
    assert problems(indexed) == []


def test_unblocking_keeps_spam_on_mail_in_a_junk_folder(indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    junk_sender = indexed.notmuch("address", "--output=sender", "--exclude=false",
                                  "folder:personal/Junk").stdout.split("\n")[0]
    address = email.utils.parseaddr(junk_sender)[1]
    assert address
    indexed.fmail("contacts", "block", address)
    indexed.fmail("contacts", "unblock", address)
    tags = indexed.notmuch("search", "--output=tags", "--exclude=false",
                           f"from:{address} AND folder:personal/Junk").stdout.split()
    assert "spam" in tags and "blocked" not in tags


def _people_of(env: MailEnv, query: str) -> set[str]:
    out = env.notmuch("address", "--output=sender", "--output=recipients", "--output=address",
                      "--exclude=false", query).stdout
    return {line.lower() for line in out.split()}


def test_spam_makes_no_contact_but_a_blocked_sender_stays_one(
        indexed: MailEnv, tmp_path: Path) -> None:
    """Mail tagged spam (a Junk folder's) counts in no figure: a spammer, or whom the spam
    names, is no contact to suggest.  A blocked sender's mail, which the block makes spam,
    keeps its sender's figures: the blocklist keeps it a contact, blocked, found by name."""
    spammers = _people_of(indexed, "tag:spam") - _people_of(indexed, "NOT tag:spam")
    assert spammers and not spammers & _figures(indexed).keys()
    with sidecar.opened(sidecar_file(indexed)) as conn:
        assert search(conn, next(iter(spammers))) == []

    bank = "no-reply@northwind-bank.example.com"
    before = _figures(indexed)[bank]
    indexed.fmail("contacts", "block", bank)
    assert _figures(indexed)[bank] == before
    with sidecar.opened(sidecar_file(indexed)) as conn:
        [row] = search(conn, "northwind")
        assert (row["is_blocked"], row["messages_from"]) == (1, before[3])
    assert _same_figures_as_a_rebuild(indexed, tmp_path)

    spammer = sorted(spammers)[0]
    with sidecar.opened(sidecar_file(indexed)) as conn:  # as schema 20 counted spam
        conn.execute("INSERT INTO contact_stats VALUES (?, 'Winner', NULL, NULL, 1, 0)", (spammer,))
        conn.execute("PRAGMA user_version = 20")
    sync(indexed)
    assert spammer not in _figures(indexed) and _same_figures_as_a_rebuild(indexed, tmp_path)


def _block_records(env: MailEnv) -> set[str]:
    with sidecar.opened(sidecar_file(env)) as conn:
        return {r[0] for r in conn.execute("SELECT message_id FROM blocked_mail")}


def _ids_from(env: MailEnv, address: str) -> list[str]:
    return sorted(env.notmuch("search", "--output=messages", "--exclude=false",
                              f"from:{address}").stdout.replace("id:", "").split())


def test_a_block_record_goes_with_its_message_and_stays_while_it_is_in_junk(
        indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    """How a blocked message was before the block is kept for as long as it can be
    unblocked -- in Junk or Trash too -- and dropped once the message is gone from notmuch."""
    bank = "no-reply@northwind-bank.example.com"
    indexed.fmail("contacts", "block", bank)
    blocked = _ids_from(indexed, bank)
    assert _block_records(indexed) == set(blocked)
    gone, junked, trashed = blocked[:3]
    os.unlink(_file_of(indexed, gone))  # expunged
    for mid, folder in ((junked, "Junk"), (trashed, "Trash")):
        file = _file_of(indexed, mid)
        target = indexed.mail_root / "personal" / folder / "cur" / file.name.split(",U=")[0]
        shutil.move(file, target)
    indexed.notmuch("new")  # runs our post-new hook, which syncs the sidecar
    assert _block_records(indexed) == set(blocked) - {gone}

    indexed.fmail("contacts", "unblock", bank)
    assert _search_ids(mailbox, "is:blocked") == set()
    assert sidecar.uid_for(trashed) in _search_ids(mailbox, "in:trash")


MARKET_REPLY = """
    From: Alex Morgan <alex@example.org>
    To: Anna Schmidt <anna.schmidt@example.com>
    Subject: Re: Christmas market stall
    Date: Sat, 28 Nov 2026 08:00:00 +0100
    Message-ID: <market-reply@example.org>
    In-Reply-To: <anna-market@example.com>
    References: <anna-market@example.com>
    """


def _market_thread(env: MailEnv) -> tuple[Any, ...]:
    """The SQL view of the market thread: what it says was sent, by whom, who spoke last."""
    with sidecar.opened(sidecar_file(env)) as conn:
        return conn.execute(
            "SELECT t.message_count, t.sent_count, t.last_sender_email, t.last_from_me, "
            "t.participants FROM threads t JOIN emails e USING (thread_id) "
            "WHERE e.message_id = 'anna-market@example.com'").fetchone()


def _is_sent(env: MailEnv, message_id: str) -> int:
    with sidecar.opened(sidecar_file(env)) as conn:
        return conn.execute("SELECT is_sent FROM emails WHERE message_id = ?",
                            (message_id,)).fetchone()[0]


def test_a_draft_is_not_sent_mail_in_the_sql_views(indexed: MailEnv) -> None:
    """A reply still in Drafts is in the thread, but not sent: emails.is_sent is 0, and the
    thread's sent_count, last sender and participants are those of the mail exchanged, so
    "threads where I had the last word" does not count a reply never sent.  Sent, it
    counts."""
    count, sent, last_sender, last_from_me, participants = _market_thread(indexed)
    assert (last_sender, last_from_me) == (ANNA, 0)
    draft = _put(indexed, "personal/Drafts", "1796400000.1_1.host:2,DS", MARKET_REPLY)
    indexed.notmuch("new")  # runs our post-new hook, which syncs the sidecar
    assert _is_sent(indexed, "market-reply@example.org") == 0
    assert _market_thread(indexed) == (count, sent, ANNA, 0, participants)
    assert problems(indexed) == []

    draft.unlink()
    _put(indexed, "personal/Sent", "1796400001.1_1.host:2,S", MARKET_REPLY)
    indexed.notmuch("new")
    assert _is_sent(indexed, "market-reply@example.org") == 1
    after = _market_thread(indexed)
    assert after[:4] == (count + 1, sent + 1, ME, 1)
    assert set(after[4].split(",")) == set(participants.split(",")) | {ME}
    assert problems(indexed) == []


ANNA_MARKET_DATE, MARKET_DRAFT_DATE = "2026-11-27T17:45:00Z", "2026-11-28T07:00:00Z"
LONE_DRAFT = """
    From: Alex Morgan <alex@example.org>
    To: Zoe Quinn <zoe.quinn@example.net>
    Subject: Lunch?
    Date: Sat, 28 Nov 2026 09:00:00 +0100
    Message-ID: <lone-draft@example.org>
    """


def _thread_rows(env: MailEnv) -> dict[str, list[Any]]:
    """The ``threads`` rows of the market thread and of the lone draft's, as query_emails
    reads them, by the Message-ID that names the thread."""
    rows = query_emails(sidecar_file(env), (
        "SELECT e.message_id, t.subject, t.message_count, t.unread_count, t.first_date, "
        "t.last_date, t.last_sender_email, t.last_from_me FROM emails e JOIN threads t "
        "USING (thread_id) WHERE e.message_id IN ('anna-market@example.com', "
        "'lone-draft@example.org')")).rows
    return {str(row[0]): row[1:] for row in rows}


def test_a_drafted_reply_neither_dates_nor_counts_in_its_thread(indexed: MailEnv) -> None:
    """A thread's row is the mail exchanged: an unread reply still in Drafts, dated after
    the last message, leaves its date, counts and last sender as they were -- "when did
    Anna last write, and who spoke last" read off one row agree -- and a draft of a new
    message makes no thread.  Sent, the reply dates and counts."""
    before = _thread_rows(indexed)
    assert list(before) == ["anna-market@example.com"]
    draft = _put(indexed, "personal/Drafts", "1796400000.1_1.host:2,D", MARKET_REPLY)
    _put(indexed, "personal/Drafts", "1796400002.1_1.host:2,D", LONE_DRAFT)
    indexed.notmuch("new")  # runs our post-new hook, which syncs the sidecar
    assert query_emails(sidecar_file(indexed), "SELECT is_draft, is_read FROM emails WHERE "
                        "message_id = 'market-reply@example.org'").rows == [[1, 0]]
    assert _thread_rows(indexed) == before
    assert problems(indexed) == []

    draft.unlink()
    _put(indexed, "personal/Sent", "1796400001.1_1.host:2,S", MARKET_REPLY)
    indexed.notmuch("new")
    subject, count, unread, first, _, _, _ = before["anna-market@example.com"]
    assert _thread_rows(indexed)["anna-market@example.com"] == [
        subject, count + 1, unread, first, MARKET_DRAFT_DATE, ME, 1]


def test_a_sidecar_whose_threads_counted_drafts_is_corrected(indexed: MailEnv) -> None:
    """Until schema 19 a thread's counts and dates took in its drafts, and a draft alone
    made a thread: the migration computes every thread row again."""
    _put(indexed, "personal/Drafts", "1796400000.1_1.host:2,D", MARKET_REPLY)
    _put(indexed, "personal/Drafts", "1796400002.1_1.host:2,D", LONE_DRAFT)
    indexed.notmuch("new")
    path = sidecar_file(indexed)
    with sidecar.opened(path) as conn:  # the rows as schema 18 computed them
        conn.execute("INSERT OR IGNORE INTO thread_rows (thread_id, message_count, "
                     "unread_count, sent_count) SELECT thread_id, 0, 0, 0 FROM messages")
        conn.execute("UPDATE thread_rows SET (message_count, unread_count, last_date) = ("
                     "SELECT count(*), sum(1 - is_read), max(date) FROM messages m "
                     "WHERE m.thread_id = thread_rows.thread_id)")
        conn.execute("PRAGMA user_version = 18")
    with sidecar.opened(path) as conn:  # migrates
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sidecar.SCHEMA_VERSION
        assert sidecar.thread_problems(conn) == []
    assert _thread_rows(indexed) == {"anna-market@example.com": [
        "Christmas market stall", 1, 1, ANNA_MARKET_DATE, ANNA_MARKET_DATE, ANNA, 0]}


def test_a_sidecar_that_counted_drafts_as_sent_is_corrected(indexed: MailEnv,
                                                            tmp_path: Path) -> None:
    """Until schema 14 a draft from the user was sent mail to SQL: the migration clears
    is_sent of drafts and recomputes the thread rows, as a rebuild would have them."""
    _put(indexed, "personal/Drafts", "1796400000.1_1.host:2,DS", MARKET_REPLY)
    indexed.notmuch("new")
    path = sidecar_file(indexed)
    with sidecar.opened(path) as conn:
        conn.execute("UPDATE messages SET is_sent = 1 WHERE is_draft = 1")
        conn.execute("UPDATE thread_rows SET sent_count = sent_count + 1, last_from_me = 1 "
                     "WHERE thread_id IN (SELECT thread_id FROM messages WHERE is_draft = 1)")
        conn.execute("PRAGMA user_version = 13")  # the schema before drafts were not sent
    with sidecar.opened(path) as conn:  # migrates
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sidecar.SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM emails WHERE is_draft = 1 AND is_sent = 1"
                            ).fetchone()[0] == 0
        assert sidecar.thread_problems(conn) == []
    assert dump(path)["messages"] == rebuilt_copy(indexed, tmp_path)["messages"]


def test_a_sidecar_from_before_drafts_were_left_out_is_recounted_and_loses_stale_records(
        indexed: MailEnv, tmp_path: Path) -> None:
    """Figures counted with drafts, as the previous schema's mirror did, are recounted by the
    first sync after the migration, and the block records of messages the mirror no longer
    has (dropped before records went with them) are dropped; the others stay."""
    path = sidecar_file(indexed)
    with sidecar.opened(path) as conn:
        conn.execute("UPDATE contact_stats SET messages_to = messages_to + 1, last_seen = ? "
                     "WHERE email_address = ?", (BAKE_SALE_DATE, ANNA))
        sidecar.save_pre_block(conn, {
            "expunged-long-ago@example.com": sidecar.PreBlock(frozenset({"inbox"}), frozenset()),
            "draft-1@example.org": sidecar.PreBlock(frozenset({"draft"}), frozenset())})
        conn.execute("PRAGMA user_version = 11")  # the schema before drafts were left out
    with sidecar.opened(path) as conn:  # migrates
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sidecar.SCHEMA_VERSION
    assert _block_records(indexed) == {"draft-1@example.org"}
    sync(indexed)
    assert _same_figures_as_a_rebuild(indexed, tmp_path)


def _plans(conn: sqlite3.Connection, call: Callable[[], object]) -> list[str]:
    """The query plan of each statement on the audit log that ``call`` runs."""
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        call()
    finally:
        conn.set_trace_callback(None)
    return [" ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
            for sql in statements if "audit_log" in sql]


def test_the_send_checks_and_the_pruning_read_the_audit_log_by_index(tmp_path: Path) -> None:
    """Months of writes make a log of thousands of entries: what each send reads of it, and
    the pruning of old ones, must not go through them all."""
    with sidecar.opened(tmp_path / sidecar.SIDECAR_NAME) as conn:
        for call in (lambda: sidecar.count_writes(conn, "send", "2026-01-01T00:00:00Z"),
                     lambda: sidecar.sent_at(conn, "sent-1@example.org"),
                     lambda: sidecar.prune_audit_log(conn),
                     lambda: sidecar.last_write(conn, "a-session")):
            plans = _plans(conn, call)
            assert plans and all("SCAN audit_log" not in plan for plan in plans), plans


def test_an_audit_log_of_schema_27_keeps_its_writes_as_made_outside_any_session(
        tmp_path: Path) -> None:
    """Version 28 records each write's MCP session: the writes from before are kept, undone
    marks and all, as made outside any session (undo_last_write of a session passes them
    over), and the migration runs again over a schema set back."""
    path = tmp_path / sidecar.SIDECAR_NAME
    with sidecar.opened(path) as conn:
        first = sidecar.record_write(conn, "archive", {"ids": ["a@example.org"]}, [])
        second = sidecar.record_write(conn, "tag", {"ids": ["b@example.org"]}, [])
        sidecar.mark_undone(conn, second, sidecar.newest_entry(conn))
        conn.executescript("""
            DROP INDEX audit_log_session;
            ALTER TABLE audit_log DROP COLUMN session;
            PRAGMA user_version = 27;
            """)
    with sidecar.opened(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sidecar.SCHEMA_VERSION
        entry = sidecar.last_write(conn, None)
        assert entry is not None and (entry.id, entry.session) == (first, None)
        assert sidecar.last_write(conn, "a-session") is None
        assert sidecar.last_write(conn, "a-session", others=True) == entry
        third = sidecar.record_write(conn, "tag", {}, [], "a-session")
        conn.execute("PRAGMA user_version = 27")
    with sidecar.opened(path) as conn:
        rows = conn.execute("SELECT id, undone_at IS NOT NULL FROM audit_log ORDER BY id")
        assert rows.fetchall() == [(first, 0), (second, 1), (third, 0)]


def test_writes_undone_before_schema_29_count_as_undone_before_anything_after_them(
        tmp_path: Path) -> None:
    """Version 29 records the newest entry at each undo; an undo made before it cannot say,
    and counts as made before any later write (undo traces nothing through it, as before)."""
    path = tmp_path / sidecar.SIDECAR_NAME
    with sidecar.opened(path) as conn:
        kept, undone = (sidecar.record_write(conn, "tag", {}, [{"message_id": "m"}])
                        for _ in range(2))
        later = sidecar.record_write(conn, "tag", {}, [{"message_id": "m"}])
        sidecar.mark_undone(conn, undone, sidecar.newest_entry(conn))
        assert conn.execute("SELECT undone_upto FROM audit_log WHERE id = ?",
                            (undone,)).fetchone()[0] == later
        conn.execute("PRAGMA user_version = 28")
    with sidecar.opened(path) as conn:
        rows = conn.execute("SELECT id, undone_upto FROM audit_log ORDER BY id").fetchall()
        assert rows == [(kept, None), (undone, undone), (later, None)]
        entry = sidecar.write_left(conn, later)
        assert entry is not None and sidecar.earlier_changes(conn, entry, ["m"]) == []


def test_an_audit_log_of_schema_29_keeps_its_rows_and_indexes_and_undoes_as_before(
        tmp_path: Path) -> None:
    """Version 30 records where an undo read what stands for each message apart: the entries
    undone before keep their undone_upto, which answers for their mail too; the table keeps
    every index, and the migration runs again over a schema set back."""
    path = tmp_path / sidecar.SIDECAR_NAME
    indexes = ("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'audit_log' "
               "ORDER BY name")
    made = [(f"audit_log_{name}",) for name in ("action", "at", "session", "undone")]
    with sidecar.opened(path) as conn:
        assert conn.execute(indexes).fetchall() == made
        undone = sidecar.record_write(conn, "tag", {}, [{"message_id": "m"}], "s")
        later = sidecar.record_write(conn, "tag", {}, [{"message_id": "m"}])
        sidecar.mark_undone(conn, undone, later)
        conn.executescript("""
            ALTER TABLE audit_log DROP COLUMN mail_undone_upto;
            PRAGMA user_version = 29;
            """)
    for _ in range(2):
        with sidecar.opened(path) as conn:
            assert conn.execute(indexes).fetchall() == made
            rows = conn.execute("SELECT id, session, undone_upto, mail_undone_upto "
                                "FROM audit_log ORDER BY id").fetchall()
            assert rows == [(undone, "s", later, None), (later, None, None, None)]
            entry = sidecar.write_left(conn, later)
            assert entry is not None
            [earlier] = sidecar.earlier_changes(conn, entry, ["m"])
            assert (earlier.audit_id, earlier.undone_upto) == (undone, later)
            conn.execute("PRAGMA user_version = 29")

def test_whether_a_write_was_undone_after_a_later_one_is_read_from_its_index_if_there(
        tmp_path: Path) -> None:
    """earlier_changes first asks whether any entry before one was undone after it was made:
    the partial index audit_log_undone answers, not a scan of the whole log.  A sidecar
    without that index (copied or mended without it) gets the same answer, by a scan."""
    path = tmp_path / sidecar.SIDECAR_NAME
    with sidecar.opened(path) as conn:
        undone, later = (sidecar.record_write(conn, "tag", {}, [{"message_id": "m"}])
                         for _ in range(2))
        sidecar.mark_undone(conn, undone, later)
        entry = sidecar.write_left(conn, later)
        assert entry is not None
        asked: list[str] = []
        conn.set_trace_callback(asked.append)
        found = sidecar.earlier_changes(conn, entry, ["m"])
        conn.set_trace_callback(None)
        assert found == [sidecar.EarlierChange(undone, later, {"message_id": "m"})]
        [probe] = [sql for sql in asked if sql.startswith("SELECT 1 FROM audit_log")]
        plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {probe}"))
        assert "USING INDEX audit_log_undone" in plan, plan
        conn.execute("DROP INDEX audit_log_undone")
        assert sidecar.earlier_changes(conn, entry, ["m"]) == found


# Ids whose JSON text is not themselves (quotes, backslashes, non-ASCII), and ids that are
# prefixes of others: the text filter of later_changes must find each, and only each.
AWKWARD_IDS = ['a@example.org', 'a@example.org.uk', 'q"uote@example.org',
               'back\\slash@example.org', 'grüße@example.org', 'ctl\tx@example.org',
               'snow\u2603@example.org']


@pytest.mark.parametrize("ensure_ascii", [False, True], ids=["as-written", "ascii-escaped"])
def test_later_and_earlier_changes_find_every_id_however_json_spells_it(
        tmp_path: Path, ensure_ascii: bool) -> None:
    """Each id alone (the text-filtered reading) and all at once (the unfiltered one) find
    the same changes: every later entry naming it, not undone, and no other id's -- also
    in an entry written with non-ASCII escaped (as json.dumps does by default)."""
    with sidecar.opened(tmp_path / sidecar.SIDECAR_NAME) as conn:
        first = sidecar.record_write(conn, "tag", {}, [{"message_id": i} for i in AWKWARD_IDS])
        ids = []
        for mid in AWKWARD_IDS:
            ids.append(conn.execute(
                "INSERT INTO audit_log (at, action, params, changes) VALUES (?, 'tag', '{}', ?)",
                ("2026-01-01T00:00:00Z", json.dumps([{"message_id": mid, "n": 1}],
                                                    ensure_ascii=ensure_ascii))).lastrowid)
        undone = sidecar.record_write(conn, "tag", {}, [{"message_id": AWKWARD_IDS[0]}])
        last = sidecar.record_write(conn, "tag", {}, [])
        sidecar.mark_undone(conn, undone, sidecar.newest_entry(conn))
        assert len(AWKWARD_IDS) > sidecar.FILTER_IDS_UP_TO  # all at once: not filtered
        together = sidecar.later_changes(conn, first, AWKWARD_IDS)
        assert [(i, c["message_id"]) for i, _, c in together] == list(zip(ids, AWKWARD_IDS))
        for entry_id, mid in zip(ids, AWKWARD_IDS):
            assert sidecar.later_changes(conn, first, [mid]) == [
                (entry_id, "tag", {"message_id": mid, "n": 1})]
            later = sidecar.last_write(conn, None)  # `undone` was undone after it was made
            assert later is not None and later.id == last
            earlier = sidecar.earlier_changes(conn, later, [mid])
            assert [(e.audit_id, e.change["message_id"]) for e in earlier] == (
                [(undone, mid)] if mid == AWKWARD_IDS[0] else []) + [(entry_id, mid), (first, mid)]
        # Made after every undo: nothing before it was undone since, so nothing is read.
        after = sidecar.write_left(conn, sidecar.record_write(conn, "tag", {}, []))
        assert after is not None and sidecar.earlier_changes(conn, after, AWKWARD_IDS) == []


def test_a_transaction_on_a_connection_left_in_one_fails_outside_an_enclosing_one(
        tmp_path: Path) -> None:
    """Every transaction opened while one was open became a savepoint of it: on a long-lived
    connection (the mirror's) one left open -- a COMMIT that failed -- made each later one a
    savepoint that never committed, where it had failed.  It fails, as SQLite fails it; only
    inside sidecar.enclosing, opened on purpose, does a transaction nest."""
    path = tmp_path / "sidecar.sqlite"
    with sidecar.opened(path) as conn:
        conn.execute("BEGIN IMMEDIATE")  # left open
        with pytest.raises(sqlite3.OperationalError, match="within a transaction"):
            with sidecar.transaction(conn):
                sidecar.set_state(conn, "lost", "1")
        conn.execute("ROLLBACK")
        with sidecar.enclosing(conn, keep=True), sidecar.transaction(conn):
            sidecar.set_state(conn, "kept", "1")
        assert not conn.in_transaction
    with sidecar.opened(path, readonly=True) as conn:
        assert conn.execute("SELECT key FROM sync_state WHERE key IN ('lost', 'kept')"
                            ).fetchall() == [("kept",)]


def test_a_commit_that_fails_rolls_the_transaction_back(tmp_path: Path) -> None:
    """A COMMIT SQLite refuses (a deferred foreign key still violated) left the transaction
    open, its half-done writes with it: the connection's next transaction failed ("within a
    transaction"), and closing it lost them silently.  It is rolled back, the error raised."""
    path = tmp_path / "sidecar.sqlite"
    with sidecar.opened(path) as conn:
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            with sidecar.transaction(conn):
                conn.execute("PRAGMA defer_foreign_keys = ON")  # checked at COMMIT
                sidecar.set_state(conn, "half", "1")
                conn.execute("INSERT INTO message_tags (message_id, tag) VALUES ('gone', 'x')")
        assert not conn.in_transaction
        with sidecar.transaction(conn):
            sidecar.set_state(conn, "next", "1")
    with sidecar.opened(path, readonly=True) as conn:
        assert conn.execute("SELECT key FROM sync_state WHERE key IN ('half', 'next')"
                            ).fetchall() == [("next",)]


# Another process reading: it holds a SHARED lock until told to go on.
_READER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN")
conn.execute("SELECT count(*) FROM sync_state").fetchone()
print("reading", flush=True)
sys.stdin.readline()
"""


def test_a_commit_another_process_holds_off_rolls_the_transaction_back(
        tmp_path: Path) -> None:
    """In rollback-journal mode, COMMIT needs every reader gone: with another process
    reading, it fails busy and SQLite keeps the transaction open to try again.  It is
    rolled back, and the connection takes the next transaction once the reader is gone."""
    path = tmp_path / "sidecar.sqlite"
    with sidecar.opened(path) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("PRAGMA busy_timeout = 50")
        with subprocess.Popen([sys.executable, "-c", _READER, str(path)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) as reader:
            assert reader.stdout is not None and reader.stdin is not None
            assert reader.stdout.readline() == "reading\n"
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                with sidecar.transaction(conn):
                    sidecar.set_state(conn, "held_off", "1")
            assert not conn.in_transaction
            reader.stdin.write("\n")
            reader.stdin.close()
        with sidecar.transaction(conn):
            sidecar.set_state(conn, "next", "1")
    with sidecar.opened(path, readonly=True) as conn:
        assert conn.execute("SELECT key FROM sync_state WHERE key IN ('held_off', 'next')"
                            ).fetchall() == [("next",)]


# A write SQLite answers by rolling back the whole transaction, as it does on SQLITE_FULL or
# an I/O error: a trigger's RAISE(ROLLBACK) is SQLite's own way to do it at will.
_ROLLS_BACK = ("CREATE TRIGGER rolls_back BEFORE INSERT ON sync_state WHEN NEW.key = 'boom' "
               "BEGIN SELECT RAISE(ROLLBACK, 'rolled back whole'); END")


def test_a_transaction_sqlite_rolled_back_raises_its_own_error(tmp_path: Path) -> None:
    """Rolling back what SQLite rolled back already failed ("no transaction is active"),
    hiding why it did."""
    with sidecar.opened(tmp_path / "sidecar.sqlite") as conn:
        conn.execute(_ROLLS_BACK)
        with pytest.raises(sqlite3.IntegrityError, match="rolled back whole"):
            with sidecar.transaction(conn):
                sidecar.set_state(conn, "boom", "1")
        with pytest.raises(sqlite3.IntegrityError, match="rolled back whole"):
            with sidecar.enclosing(conn, keep=True), sidecar.transaction(conn):
                sidecar.set_state(conn, "boom", "1")
        assert not conn.in_transaction


def test_a_transaction_after_sqlite_rolled_back_the_enclosing_one_fails(
        tmp_path: Path) -> None:
    """Inside sidecar.enclosing, once SQLite has rolled back the enclosing transaction (an
    error the block went on after), a savepoint would begin a transaction of its own and
    commit when released -- in a rehearsal too, which must change nothing.  It fails."""
    path = tmp_path / "sidecar.sqlite"
    with sidecar.opened(path) as conn:
        conn.execute(_ROLLS_BACK)
        with pytest.raises(sidecar.SidecarError, match="rolled back"):
            with sidecar.enclosing(conn, keep=False):
                with sidecar.transaction(conn):
                    sidecar.set_state(conn, "before", "1")
                with pytest.raises(sqlite3.IntegrityError, match="rolled back whole"):
                    with sidecar.transaction(conn):
                        sidecar.set_state(conn, "boom", "1")
                with sidecar.transaction(conn):
                    sidecar.set_state(conn, "after", "1")
        assert not conn.in_transaction
    with sidecar.opened(path, readonly=True) as conn:
        assert conn.execute("SELECT key FROM sync_state WHERE key IN ('before', 'after')"
                            ).fetchall() == []


def test_pruning_the_audit_log_takes_short_transactions_and_a_bounded_number_a_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No write lock held long: each transaction deletes PRUNE_BATCH entries at most, and a
    backlog (a log from before pruning) goes over several calls."""
    monkeypatch.setattr(sidecar, "PRUNE_BATCH", 3)
    monkeypatch.setattr(sidecar, "PRUNE_BATCHES", 2)
    with sidecar.opened(tmp_path / sidecar.SIDECAR_NAME) as conn:
        for _ in range(8):
            sidecar.record_write(conn, "archive", {"ids": ["a@example.org"]}, [])
        conn.execute("UPDATE audit_log SET at = '2020-01-01T00:00:00Z'")
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        assert sidecar.prune_audit_log(conn) == 6
        assert statements.count("COMMIT") == 2
        assert sidecar.prune_audit_log(conn) == 2
        assert conn.execute("SELECT count(*) FROM audit_log").fetchone()[0] == 0


def test_the_wal_shrinks_back_after_a_large_write_while_the_server_reads(tmp_path: Path) -> None:
    """The server's reader keeps the WAL file from going away with the last writer; after a
    large transaction (a rebuild) it must not stay that large for good."""
    path = tmp_path / sidecar.SIDECAR_NAME
    wal = path.with_name(path.name + "-wal")
    with sidecar.opened(path):
        pass
    reader = sidecar.MirrorReader(path)
    try:
        assert reader.connection() is not None  # open throughout, as the server's is
        with sidecar.opened(path) as conn:
            sidecar.record_write(conn, "tag", {}, [{"message_id": "x" * (16 << 20)}])
        assert wal.stat().st_size > 16 << 20
        for _ in range(3):
            with sidecar.opened(path) as conn:
                sidecar.record_write(conn, "tag", {}, [])
        assert wal.stat().st_size <= sidecar.JOURNAL_SIZE_LIMIT
    finally:
        reader.close()


def test_a_sidecar_of_a_newer_version_is_named_so_and_left_as_it_is(indexed: MailEnv) -> None:
    """A sidecar a later fmail-nm wrote (after a downgrade) cannot be migrated back: read and
    read-write opens alike say so, rather than send the user to a `fmail-nm index` that fails
    the same way, and the file is not written."""
    path = sidecar_file(indexed)
    with sidecar.opened(path) as conn:
        conn.execute(f"PRAGMA user_version = {sidecar.SCHEMA_VERSION + 1}")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = path.read_bytes()
    for readonly in (True, False):
        with pytest.raises(sidecar.SidecarError) as raised:
            sidecar.connect(path, readonly=readonly)
        assert "written by a newer fmail-nm" in str(raised.value)
        assert "fmail-nm index" not in str(raised.value)
    assert path.read_bytes() == before


def test_contacts_export_and_import_survive_a_rebuild(indexed: MailEnv, tmp_path: Path) -> None:
    path = sidecar_file(indexed)
    indexed.fmail("contacts", "block", "junk@prizes.example.net")
    with sidecar.opened(path) as conn:
        conn.execute("UPDATE contacts SET notes = 'class rep, prefers phone' "
                     "WHERE email_address = 'anna.schmidt@example.com'")
    exported = tmp_path / "contacts.csv"
    indexed.fmail("contacts", "export", str(exported))
    path.unlink()
    indexed.fmail("sidecar", "rebuild")
    with sidecar.opened(path) as conn:
        assert conn.execute("SELECT count(*) FROM contact_info").fetchone()[0] == 0
    assert "imported 2 contacts" in indexed.fmail("contacts", "import", str(exported)).stdout
    with sidecar.opened(path) as conn:
        rows = dict(conn.execute("SELECT email_address, coalesce(notes, is_blocked) FROM contacts "
                                 "WHERE email_address IN ('anna.schmidt@example.com', "
                                 "'junk@prizes.example.net')").fetchall())
    assert rows == {"anna.schmidt@example.com": "class rep, prefers phone",
                    "junk@prizes.example.net": 1}


def test_a_block_imported_into_a_rebuilt_sidecar_puts_the_mail_back_in_the_inbox_when_lifted(
        indexed: MailEnv, tmp_path: Path) -> None:
    """A sidecar lost and rebuilt keeps no record of how blocked mail was before its block;
    the export brings the block back, and unblocking then released the mail with blocked and
    spam taken off but not the inbox the block had taken: it stayed out of the inbox."""
    bank = "from:no-reply@northwind-bank.example.com"

    def tags_by_message() -> dict[str, list[str]]:
        ids = indexed.notmuch("search", "--output=messages", "--exclude=false", bank).stdout.split()
        return {mid: sorted(indexed.notmuch("search", "--output=tags", "--exclude=false",
                                            mid).stdout.split()) for mid in ids}
    before = tags_by_message()
    assert sum("inbox" in tags for tags in before.values()) > 1
    indexed.fmail("contacts", "block", bank.removeprefix("from:"))
    exported = tmp_path / "contacts.csv"
    indexed.fmail("contacts", "export", str(exported))
    sidecar_file(indexed).unlink()
    indexed.fmail("sidecar", "rebuild")
    indexed.fmail("contacts", "import", str(exported))
    assert "released: 23" in indexed.fmail("contacts", "unblock", bank.removeprefix("from:")).stdout
    assert tags_by_message() == before


def test_contacts_cli_rejects_bad_input_without_changing_anything(indexed: MailEnv, tmp_path: Path) -> None:
    bad = indexed.fmail("contacts", "block", "not-an-address", check=False)
    assert bad.returncode == 2 and "not an email address" in bad.stderr
    csv_file = tmp_path / "bad.csv"
    csv_file.write_text("email_address,is_blocked\nok@example.com,1\nbroken,1\n")
    bad = indexed.fmail("contacts", "import", str(csv_file), check=False)
    assert bad.returncode == 2 and "line 3" in bad.stderr
    with sidecar.opened(sidecar_file(indexed)) as conn:
        assert conn.execute("SELECT count(*) FROM contact_info").fetchone()[0] == 0


def test_read_tools_accept_the_uid_from_the_sidecar(indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    uid = sidecar.uid_for("school-trip-1@example.com")
    email_full = reads.get_email(mailbox, uid)
    assert (email_full.id, email_full.message_id) == (uid, "school-trip-1@example.com")
    content = reads.get_emails_content(mailbox, [uid, "0123456789abcdef"])
    assert [e.message_id for e in content.emails] == ["school-trip-1@example.com"]
    assert content.not_found == ["0123456789abcdef"]


def test_blocked_to_junk_moves_the_mail_and_unblocking_moves_it_back(indexed: MailEnv) -> None:
    toml = indexed.fmail_config.read_text()
    indexed.fmail_config.write_text(toml.replace('name = "personal"\n',
                                                 'name = "personal"\nblocked_to_junk = true\n', 1))
    bank = "no-reply@northwind-bank.example.com"

    def folders() -> dict[str, set[str]]:
        out = indexed.notmuch("search", "--output=files", "--exclude=false", f"from:{bank}").stdout
        found: dict[str, set[str]] = {}
        for name in out.split():
            folder = maildir.notmuch_folder(name, indexed.mail_root)
            found.setdefault(str(folder), set()).add(name)
        return found
    before = {k: len(v) for k, v in folders().items()}
    assert "personal/Junk" not in before and sum(before.values()) == 23

    indexed.fmail("contacts", "block", bank)
    assert {k: len(v) for k, v in folders().items()} == {"personal/Junk": 23}
    assert all(",U=" not in Path(n).name for n in folders()["personal/Junk"])

    indexed.fmail("contacts", "unblock", bank)
    assert {k: len(v) for k, v in folders().items()} == before
    tags = indexed.notmuch("search", "--output=tags", "--exclude=false", f"from:{bank}").stdout.split()
    assert "blocked" not in tags and "spam" not in tags
    assert problems(indexed, parse_files=False) == []
    assert "No new mail" in indexed.notmuch("new", "--no-hooks").stdout


def test_blocked_mail_delivered_to_two_accounts_moves_to_each_accounts_junk_and_back(
        indexed: MailEnv) -> None:
    """The block's spam tag is the whole message's, but only the primary file's account moved
    its copy to Junk: the other account's stayed in its INBOX, tagged spam, and on that
    server's inbox."""
    toml = indexed.fmail_config.read_text()
    for name in ("personal", "work"):
        toml = toml.replace(f'name = "{name}"\n', f'name = "{name}"\nblocked_to_junk = true\n')
    indexed.fmail_config.write_text(toml + 'junk = "Junk"\n')  # work's folders come last
    for sub in maildir.MAILDIR_SUBDIRS:
        (indexed.mail_root / "work" / "Junk" / sub).mkdir(parents=True)
    mid = "both-accounts-1@example.com"

    def folders() -> list[str]:
        out = indexed.notmuch("search", "--output=files", "--exclude=false", f"id:{mid}").stdout
        return sorted(str(maildir.notmuch_folder(name, indexed.mail_root))
                      for name in out.split())
    assert folders() == ["personal/INBOX", "work/INBOX"]

    indexed.fmail("contacts", "block", "register@devconf.example.com")
    assert folders() == ["personal/Junk", "work/Junk"]

    indexed.fmail("contacts", "unblock", "register@devconf.example.com")
    assert folders() == ["personal/INBOX", "work/INBOX"]
    tags = indexed.notmuch("search", "--output=tags", "--exclude=false", f"id:{mid}").stdout
    assert {"blocked", "spam"} & set(tags.split()) == set()
    assert "No new mail" in indexed.notmuch("new", "--no-hooks").stdout


def test_a_file_name_that_is_not_utf8_is_mirrored_and_stops_nothing(indexed: MailEnv) -> None:
    """Linux allows any bytes in a name, and notmuch indexes such a file: the mirror stored
    the name as text and failed on it ("surrogates not allowed") on every later run, so no
    mail after it reached the mirror."""
    inbox = os.fsencode(indexed.mail_root / "personal" / "INBOX")
    message = (b"From: Odd <odd@example.com>\nTo: alex@example.org\nSubject: odd name\n"
               b"Date: Mon, 30 Nov 2026 10:00:00 +0000\nMessage-ID: <odd-name@example.com>\n\nx\n")
    with open(inbox + b"/cur/1796300000.1_1.host-\xff\xfe:2,S", "wb") as fh:
        fh.write(message)
    indexed.fmail("index")
    (indexed.mail_root / "personal" / "INBOX" / "cur" / "1796300001.later.host:2,S").write_bytes(
        message.replace(b"odd-name@", b"later-1@").replace(b"odd name", b"later"))
    indexed.fmail("index")
    assert indexed.fmail("sidecar", "check").stdout.strip().endswith("sidecar matches notmuch")
    with sidecar.opened(sidecar_file(indexed)) as conn:
        rows = dict(conn.execute("SELECT message_id, filenames FROM messages WHERE message_id "
                                 "IN ('odd-name@example.com', 'later-1@example.com')"))
    [name] = json.loads(rows["odd-name@example.com"])
    assert os.fsencode(name).endswith(b"-\xff\xfe:2,S")  # the name as it is on disk
    assert "later-1@example.com" in rows
    indexed.fmail("sidecar", "rebuild")


# ---------------------------------------------------------------------------------------------
# Attachments: the listing, SQL and has:attachment say what get_email lists


def _message(mid: str, subject: str, body: str, content_type: str = "text/plain") -> bytes:
    return (f"From: Sam Sender <sam@example.com>\nTo: alex@example.org\nSubject: {subject}\n"
            f"Date: Tue, 01 Dec 2026 10:00:00 +0000\nMessage-ID: <{mid}>\nMIME-Version: 1.0\n"
            f"Content-Type: {content_type}\n\n{body}").encode()


def _mixed(*parts: str) -> str:
    return "".join(f"--b1\n{part}\n" for part in parts) + "--b1--\n"


# Message-ID: (the message, the types of what get_email lists as its attachments); none of
# them has a part sent with "Content-Disposition: attachment", so notmuch tags none of them.
ATTACHED = {
    "inline-pdf@h1.example": (_message(
        "inline-pdf@h1.example", "the invoice", _mixed(
            "Content-Type: text/plain\n\nthe invoice, as Apple Mail sends it",
            'Content-Type: application/pdf; name="inv.pdf"\nContent-Disposition: inline; '
            'filename="inv.pdf"\nContent-Transfer-Encoding: base64\n\nJVBERi0xLjQK'),
        'multipart/mixed; boundary="b1"'), ["application/pdf"]),
    "inline-forward@h1.example": (_message(
        "inline-forward@h1.example", "Fwd: minutes", _mixed(
            "Content-Type: text/plain\n\nsee below",
            "Content-Type: message/rfc822\nContent-Disposition: inline\n\n"
            "From: Ola <ola@example.net>\nSubject: minutes\nMessage-ID: <minutes@h1.example>\n\n"
            "the minutes"),
        'multipart/mixed; boundary="b1"'), ["message/rfc822"]),
    "invitation@h1.example": (_message(
        "invitation@h1.example", "Invitation: sprint review",
        "BEGIN:VCALENDAR\nMETHOD:REQUEST\nBEGIN:VEVENT\nUID:sprint-1\nSUMMARY:Sprint review\n"
        "DTSTART:20261203T100000Z\nDTEND:20261203T110000Z\nEND:VEVENT\nEND:VCALENDAR\n",
        "text/calendar; method=REQUEST"), ["text/calendar"]),
    "no-attachment@h1.example": (_message(
        "no-attachment@h1.example", "plain words", "nothing attached\n"), []),
}


# Parts get_email lists that are no files to a reader: a PGP signature, a logo the HTML shows.
NOT_FILES = {
    "signed@h1.example": (_message(
        "signed@h1.example", "signed words", _mixed(
            "Content-Type: text/plain\n\nsigned words",
            'Content-Type: application/pgp-signature; name="signature.asc"\n\n'
            "-----BEGIN PGP SIGNATURE-----\n\niQEz\n-----END PGP SIGNATURE-----"),
        'multipart/signed; protocol="application/pgp-signature"; micalg=pgp-sha256; '
        'boundary="b1"'), ["application/pgp-signature"]),
    "logo@h1.example": (_message(
        "logo@h1.example", "newsletter", _mixed(
            'Content-Type: text/html\n\n<p>News</p><img src="cid:logo@x" alt="">',
            "Content-Type: image/png\nContent-ID: <logo@x>\nContent-Disposition: inline\n"
            "Content-Transfer-Encoding: base64\n\niVBORw0KGgo="),
        'multipart/related; boundary="b1"'), ["image/png"]),
}


def _deliver_attached(env: MailEnv, messages: dict[str, tuple[bytes, list[str]]] = ATTACHED
                      ) -> None:
    for n, (raw, _) in enumerate(messages.values()):
        (env.mail_root / "personal" / "INBOX" / "new" / f"1796400000.{n}.h1").write_bytes(raw)
    env.notmuch("new")  # runs our post-new hook, which mirrors them


def _attachment_answers(env: MailEnv, mb: reads.Mailbox,
                        messages: dict[str, tuple[bytes, list[str]]] = ATTACHED
                        ) -> dict[str, dict[str, bool]]:
    """Per message, whether each place says it has an attachment."""
    ids = " OR ".join(f"id:{mid}" for mid in messages)
    lines = render.search_text(reads.search_emails(mb, ids)).split("\n")[1:]
    flags = {line.split(" ")[0]: line.split(" ")[3] for line in lines}
    found = _search_ids(mb, f"has:attachment ({ids})")
    marks = ", ".join(f"'{mid}'" for mid in messages)
    sql = dict(query_emails(sidecar_file(env), f"SELECT message_id, has_attachment FROM emails "
                                               f"WHERE message_id IN ({marks})").rows)
    threads = render.threads_text(reads.list_threads(mb, ids)).split("\n")[1:]
    thread_flags = {line.split(" ")[0]: line.split(" ")[4] for line in threads}

    def in_thread(mid: str) -> bool:  # the message's line in get_thread
        full = reads.get_thread(mb, mid, include_bodies=False)
        line = next(x for x in render.thread_text(full).split("\n")
                    if x.startswith("[") and f" {sidecar.uid_for(mid)} " in x)
        return "A" in line.split(" ")[4]
    return {mid: {"get_email": bool(reads.get_email(mb, mid).attachments),
                  "listing": "A" in flags[sidecar.uid_for(mid)],
                  "threads": "A" in thread_flags[reads.get_email(mb, mid).thread],
                  "thread": in_thread(mid),
                  "sql": bool(sql[mid]),
                  "search": sidecar.uid_for(mid) in found}
            for mid in messages}


def test_every_place_says_what_get_email_lists_as_attachments(indexed: MailEnv,
                                                               mailbox: reads.Mailbox) -> None:
    """A PDF sent inline, a forward sent inline, an invitation alone: notmuch does not tag
    them "attachment", but get_email lists them, and so the listing's A, the SQL column and
    has:attachment must say so; a plain message has none anywhere."""
    _deliver_attached(indexed)
    assert indexed.notmuch("count", "tag:attachment AND (" + " OR ".join(
        f"id:{mid}" for mid in ATTACHED) + ")").stdout.strip() == "0"
    for mid, (_, types) in ATTACHED.items():
        assert [a.content_type for a in reads.get_email(mailbox, mid).attachments] == types
    answers = _attachment_answers(indexed, mailbox)
    assert answers == {mid: dict.fromkeys(answers[mid], bool(types))
                       for mid, (_, types) in ATTACHED.items()}
    # the invitation's summary is its body, so its preview
    preview_of = dict(query_emails(sidecar_file(indexed), "SELECT message_id, body_preview "
                                   "FROM emails WHERE message_id = 'invitation@h1.example'").rows)
    assert "Sprint review" in preview_of["invitation@h1.example"]
    assert problems(indexed) == []


def test_a_signature_or_a_pictured_logo_is_no_attachment_to_flag(
        indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    """get_email lists a PGP signature and an image the HTML shows in place, for whoever
    wants them; but a signed message or a newsletter's logo is no mail "with attachments":
    the listing's A, the SQL column and has:attachment say none."""
    _listed_but_never_flagged(indexed, mailbox, NOT_FILES)


def _listed_but_never_flagged(indexed: MailEnv, mailbox: reads.Mailbox,
                              cases: dict[str, tuple[bytes, list[str]]]) -> None:
    """Each message's parts are listed by get_email with these types, and no place says it
    has an attachment."""
    _deliver_attached(indexed, cases)
    for mid, (_, types) in cases.items():
        assert [a.content_type for a in reads.get_email(mailbox, mid).attachments] == types
    answers = _attachment_answers(indexed, mailbox, cases)
    assert answers == {mid: {"get_email": True, "listing": False, "threads": False,
                             "thread": False, "sql": False, "search": False}
                       for mid in cases}


# An encrypted message, whose parts get_email lists: PGP/MIME's control part and ciphertext,
# an S/MIME body sent as smime.p7m.
ENCRYPTED = {
    "pgp-encrypted@h1.example": (_message(
        "pgp-encrypted@h1.example", "sealed words", _mixed(
            "Content-Type: application/pgp-encrypted\n\nVersion: 1",
            'Content-Type: application/octet-stream; name="encrypted.asc"\n'
            'Content-Disposition: inline; filename="encrypted.asc"\n\n'
            "-----BEGIN PGP MESSAGE-----\n\nhQEMA\n-----END PGP MESSAGE-----"),
        'multipart/encrypted; protocol="application/pgp-encrypted"; boundary="b1"'),
        ["application/pgp-encrypted", "application/octet-stream"]),
    "smime-encrypted@h1.example": (_message(
        "smime-encrypted@h1.example", "sealed words",
        "MIIBhgYJKoZIhvcNAQcDoIIBdzCCAXMCAQAxggEu\n",
        "application/pkcs7-mime; smime-type=enveloped-data; name=smime.p7m\n"
        "Content-Disposition: attachment; filename=smime.p7m\n"
        "Content-Transfer-Encoding: base64"), ["application/pkcs7-mime"]),
}


def test_an_encrypted_message_is_no_attachment_to_flag(indexed: MailEnv,
                                                        mailbox: reads.Mailbox) -> None:
    """The parts of an encrypted message are the message itself, not files attached to it:
    no place says it has an attachment (has:attachment never did), and reading a part says
    it is encrypted instead of calling the ciphertext a binary file."""
    _listed_but_never_flagged(indexed, mailbox, ENCRYPTED)
    notes = [reads.get_attachment(mailbox, mid, index).note
             for mid, (_, types) in ENCRYPTED.items() for index in range(len(types))]
    assert notes == ["encrypted (PGP/MIME): fmail-nm does not decrypt mail"] * 2 + [
        "encrypted (S/MIME): fmail-nm does not decrypt mail"]


def test_encrypted_mail_mirrored_as_having_an_attachment_is_corrected(
        indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    """Until schema 20 the mirror took an encrypted message's ciphertext for a file: its
    'A' stayed on every message mirrored then, as a sync parses again only mail that changed."""
    _deliver_attached(indexed, ENCRYPTED)
    path = sidecar_file(indexed)
    with sidecar.opened(path) as conn:  # the rows as schema 19 wrote them
        conn.executemany("UPDATE messages SET has_attachment = 1 WHERE message_id = ?",
                         [(mid,) for mid in ENCRYPTED])
        conn.execute("PRAGMA user_version = 19")
    indexed.notmuch("new")  # migrates, then mirrors
    answers = _attachment_answers(indexed, mailbox, ENCRYPTED)
    assert answers == {mid: {"get_email": True, "listing": False, "threads": False,
                             "thread": False, "sql": False, "search": False}
                       for mid in ENCRYPTED}

def test_a_tag_change_keeps_has_attachment(indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    """A tag change rewrites the row from notmuch without parsing the file again: the
    attachment the parse found stays, while the mirror lags and after the sync."""
    _deliver_attached(indexed)
    retagged = [mid for mid, (_, types) in ATTACHED.items() if types]
    indexed.notmuch("tag", "+later", "-inbox", "--", " OR ".join(f"id:{m}" for m in retagged))
    lagging = _attachment_answers(indexed, mailbox)
    assert all(lagging[mid]["listing"] for mid in retagged)
    report = sync(indexed)
    assert report.upserted == len(retagged) and report.parsed == 0
    answers = _attachment_answers(indexed, mailbox)
    assert all(answers[mid] == dict.fromkeys(answers[mid], True) for mid in retagged)
    assert problems(indexed) == []



def test_a_part_header_cut_by_the_parsed_head_is_no_attachment(tmp_path: Path) -> None:
    """The mirror parses a file's first 64 KiB: a part whose Content-Type line that cut ends
    in ("text/pl") must not count as an attachment of some other type."""
    start = _message("long@h1.example", "long", "--b1\nContent-Type: text/plain\n\n",
                     'multipart/mixed; boundary="b1"')
    cut = b"\n--b1\nContent-Type: text/pl"
    filler = b"words " * ((mirror.HEAD_BYTES - len(start) - len(cut)) // 6)
    filler += b"w" * (mirror.HEAD_BYTES - len(start) - len(cut) - len(filler))
    raw = start + filler + cut + b"ain\n\nmore words\n--b1--\n"
    assert raw.rindex(b"text/pl") + len(b"text/pl") == mirror.HEAD_BYTES
    path = tmp_path / "long.eml"
    path.write_bytes(raw)
    assert not parse_message(raw, preview_html_text).attachments  # as get_email reads it
    parsed = mirror.parse_file([str(path)])
    assert not parsed.has_attachment and parsed.body_preview.startswith("words words")


def _folded_people(count: int, name_chars: int) -> list[str]:
    """Recipients folded as Outlook folds them: a quoted name on one line, its address on
    the next (a header cut between the two leaves a name that reads as an address)."""
    return [f' "Doe, Jo {i} {"x" * name_chars}"\n <jo{i}@example.org>' for i in range(count)]


def _stored(recipients: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    return [(r["kind"], r["name"], r["email"]) for r in recipients]


def _padded_to(start: bytes, to: bytes, rest: bytes, at: bytes, where: int) -> bytes:
    """``start``, a padding header, ``to`` and ``rest``, with the padding sized so that the
    end of ``at`` (in ``to``) is byte ``where`` of the message."""
    pad = where - len(start) - len(b"X-Pad: \n") - to.index(at) - len(at)
    raw = start + b"X-Pad: " + b"p" * pad + b"\n" + to + rest
    assert raw[where - len(at):where] == at
    return raw


def test_recipients_past_the_parsed_head_are_read_whole(tmp_path: Path) -> None:
    """A To running past the 64 KiB the mirror parses, cut there between a quoted name and
    its address: the mirror reads the header block whole, as get_email does -- every
    recipient, the Cc after them, and no name stored as an address."""
    start = b"From: Sam Sender <sam@example.com>\nSubject: many\n"
    to = ("To:" + ",\n".join(_folded_people(400, 150)) + "\n").encode()
    raw = _padded_to(start, to, b"Cc: Chloe Dubois <chloe@example.net>\n\nhello\n",
                     b"<jo300@exa", mirror.HEAD_BYTES)
    path = tmp_path / "long-to.eml"
    path.write_bytes(raw)
    whole = parse_message(raw, preview_html_text)  # as get_email reads it
    assert len(whole.to) == 400 and whole.defects == []
    expected = ([("to", a.name, a.address) for a in whole.to]
                + [("cc", "Chloe Dubois", "chloe@example.net")])
    stored = mirror.parse_file([str(path)]).recipients
    assert _stored(stored) == expected
    assert mirror.file_recipients([str(path)]) == stored  # what a lagging listing reads


def test_a_header_block_cut_at_its_bound_keeps_no_half_address(tmp_path: Path) -> None:
    """A hostile header block longer than the 1 MiB any parse reads of one, cut inside the
    To's last address there: that address is dropped, not stored in half."""
    filler = b"\n".join(b" " + b"f" * 998 for _ in range(900))
    start = b"From: Sam Sender <sam@example.com>\nSubject: huge\nX-Filler:" + filler + b"\n"
    to = ("To:" + ",\n".join(_folded_people(300, 200)) + "\n").encode()
    raw = _padded_to(start, to, b"Cc: chloe@example.net\n\nhello\n", b"<jo250@exa", 1 << 20)
    path = tmp_path / "huge-head.eml"
    path.write_bytes(raw)
    stored = mirror.parse_file([str(path)]).recipients
    assert _stored(stored) == [
        ("to", f"Doe, Jo {i} {'x' * 200}", f"jo{i}@example.org") for i in range(250)]
    assert mirror.file_recipients([str(path)]) == stored


def test_a_header_block_whose_bound_falls_between_two_headers_keeps_the_last_address(
        tmp_path: Path) -> None:
    """A header block longer than its bound, the bound falling just after the To's line
    ends and before another header begins: the To was read whole, and so is its last
    address."""
    filler = b"\n".join(b" " + b"f" * 998 for _ in range(900))
    start = b"From: Sam Sender <sam@example.com>\nSubject: huge\nX-Filler:" + filler + b"\n"
    to = b"To: Ann <ann@example.org>, Ben <ben@example.org>\n"
    raw = _padded_to(start, to, b"Cc: chloe@example.net\n\nhello\n", b"ben@example.org>\n",
                     1 << 20)
    path = tmp_path / "huge-head.eml"
    path.write_bytes(raw)
    stored = mirror.parse_file([str(path)]).recipients
    assert _stored(stored) == [("to", "Ann", "ann@example.org"), ("to", "Ben", "ben@example.org")]
    assert mirror.file_recipients([str(path)]) == stored


@pytest.mark.parametrize("newline", [b"\n", b"\r"], ids=["no-blank-line", "bare-cr"])
def test_a_long_message_whose_header_block_the_parser_ends_early_keeps_the_last_address(
        tmp_path: Path, newline: bytes) -> None:
    """A message of more than the 1 MiB bound on header blocks whose headers end without the
    blank line split_head looks for -- its body follows the To directly, or its lines end in
    a bare CR -- was not cut inside its To: every recipient is read, as get_email reads them."""
    head = newline.join([b"From: Sam Sender <sam@example.com>", b"Subject: big",
                         b"To: Ann <ann@example.org>, Ben <ben@example.org>", b""])
    body = b"no header, the text begins" + newline if newline == b"\n" else newline
    raw = head + body + (b"QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=" * 2 + newline) * 20000
    assert len(raw) > 1 << 20
    path = tmp_path / "big.eml"
    path.write_bytes(raw)
    expected = [("to", "Ann", "ann@example.org"), ("to", "Ben", "ben@example.org")]
    whole = parse_message(raw, preview_html_text)
    assert [("to", a.name, a.address) for a in whole.to] == expected
    stored = mirror.parse_file([str(path)]).recipients
    assert _stored(stored) == expected
    assert mirror.file_recipients([str(path)]) == stored


PARSE_FAILS = (b"From: Alex Morgan <alex@example.org>\nTo: Ann <ann@example.org>, ben@example.net\n"
               b"Cc: Chloe Dubois <chloe@example.net>\nBcc: dan@example.com\n"
               b"List-Id: Plans <plans.lists.example.org>\nSubject: plans\n"
               b"Message-ID: <parse-fails-1@example.org>\n"
               b"Content-Type: multipart/mixed; boundary=B\n\n--B\n\nnever closed\n")


def test_a_message_its_whole_parse_fails_on_is_mirrored_with_its_header_blocks_recipients(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the whole parse of a message fails (what it gives then has no header), the
    mirror keeps the recipients and the List-Id its header block names: the recipients a
    listing reads of the file while the mirror lags, so the row does not change when the
    mirror catches up.  No mail is known to make the parse raise: here it raises on this
    message."""
    whole_parse = mime._summary  # what the mirror reads of a message (mime.parse_summary)

    def failing(raw: bytes, render_html: mime.HtmlRenderer,
                defects: list[str]) -> mime.Summary:
        if b"<parse-fails-1@" in raw:
            raise RecursionError("too deep")
        return whole_parse(raw, render_html, defects)

    monkeypatch.setattr(mime, "_summary", failing)
    assert "Message-ID: <parse-fails-1@" in mime.parse_summary(PARSE_FAILS, preview_html_text).text
    path = indexed.mail_root / "personal" / "Sent" / "cur" / "1796000100.fails.host:2,S"
    path.write_bytes(PARSE_FAILS)
    indexed.notmuch("new", "--no-hooks")
    lagging = _stored(mirror.file_recipients([str(path)]))
    assert len(lagging) == 4
    sync(indexed)
    with sidecar.opened(sidecar_file(indexed)) as conn:
        stored = conn.execute("SELECT role, name, email FROM message_addresses WHERE "
                              "message_id = 'parse-fails-1@example.org' AND role <> 'from'"
                              ).fetchall()
        [(list_id,)] = conn.execute("SELECT list_id FROM messages "
                                    "WHERE message_id = 'parse-fails-1@example.org'")
    assert sorted(stored) == sorted(lagging)
    assert list_id == "plans.lists.example.org"


class Killed(Exception):
    """Stands for the process dying just after a batch was committed."""


def _killed(_: int) -> None:
    raise Killed


def test_a_mirror_written_before_the_upgrade_is_parsed_again_once(indexed: MailEnv,
                                                                  mailbox: reads.Mailbox) -> None:
    """A sidecar of schema 12 took has_attachment from notmuch's tag, and an invitation alone
    had no preview: the upgrade parses the rows that can be wrong again, once; a sync killed
    on the way leaves the rest to the next."""
    _deliver_attached(indexed)
    path = sidecar_file(indexed)
    with sqlite3.connect(path) as conn:  # as the version before wrote the rows
        conn.execute("UPDATE messages SET has_attachment = EXISTS (SELECT 1 FROM message_tags t "
                     "WHERE t.message_id = messages.message_id AND t.tag = 'attachment')")
        conn.execute("UPDATE messages SET body_preview = '' "
                     "WHERE message_id = 'invitation@h1.example'")
        conn.execute("PRAGMA user_version = 12")
        # a row with the tag has it, and only an empty preview lacked text that now shows
        candidates, total = conn.execute("SELECT count(*) FILTER (WHERE has_attachment = 0 "
                                         "OR body_preview = ''), count(*) FROM messages").fetchone()
        # and schema 18 reads the Bcc of the user's own mail
        own = conn.execute(f"SELECT count(*) FROM messages WHERE {sidecar.BCC_REPARSED_ROWS}"
                           ).fetchone()[0]
    conn.close()
    progress: list[tuple[str, int, int]] = []
    with Reader() as reader, sidecar.opened(path) as conn:  # opening it migrates it
        with pytest.raises(Killed):
            mirror.Mirror(indexed.config(), reader, conn, batch_size=20, on_batch=_killed,
                          on_progress=lambda *step: progress.append(step)).sync()
    assert progress == [("sidecar", 0, candidates)]  # an upgrade of a large mailbox says so
    report = sync(indexed)
    # the rows not committed before, and no others: those with the tag are not parsed again
    assert report.parsed == candidates - 20 + own and candidates < total
    answers = _attachment_answers(indexed, mailbox)
    assert answers == {mid: dict.fromkeys(answers[mid], bool(types))
                       for mid, (_, types) in ATTACHED.items()}
    assert problems(indexed) == []
    assert sync(indexed).parsed == 0  # done once
