"""Drafts, replies, forwards and sending, through the plain functions, on a private indexed
copy of the fixture mail, with a real SMTP server (aiosmtpd) behind a real msmtp.

What is judged: the bytes the SMTP server received and its envelope, the files in the Drafts
and Sent folders, notmuch's tags and Maildir flags, the audit log -- and, for every refusal,
that nothing changed anywhere."""

from __future__ import annotations

import base64
import email
import email.header
import email.policy
import email.utils
import json
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from email.message import EmailMessage
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from fmail_nm.errors import FmailError
from fmail_nm.message import mime
from fmail_nm.passes.changes import ChangeError, WriteContext
from fmail_nm.passes import mirror
from fmail_nm.passes.mirror import sync_sidecar
from fmail_nm.service import send
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader, Writer
from fmail_nm.tools import compose, contacts, reads, writes
from fmail_nm.tools.compose import ComposeError

from .conftest import LockHolder, MailEnv
from .smtpbed import SmtpBed

ORIGINAL = "orig-1@example.net"
ORIGINAL_MAIL = (
    "From: =?utf-8?q?Zo=C3=AB_M=C3=BCller?= <zoe@example.net>\r\n"
    "To: Alex Morgan <alex@example.org>, bob@example.com\r\n"
    "Cc: carol@example.com, alex.morgan@example.org\r\n"
    "Reply-To: team@example.net\r\n"
    "Subject: Re: AW: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\n"
    f"Message-ID: <{ORIGINAL}>\r\n"
    "References: <root@example.net> <mid@example.net>\r\n"
    "In-Reply-To: <mid@example.net>\r\n"
    "Date: Tue, 02 Jan 2024 09:01:00 +0000\r\n"
    "Content-Type: text/plain; charset=utf-8\r\n"
    "Content-Transfer-Encoding: 8bit\r\n"
    "\r\n"
    "Hello Alex,\r\n\r\ncan you send the numbers?\r\n\r\n-- \r\nZo\u00eb\r\n"
).encode()
FOLLOWUP = "list-1@example.net"
FOLLOWUP_MAIL = (
    "From: dave@example.com\r\n"
    "To: dev@lists.example.com\r\n"
    "Cc: alex@example.org, erin@example.com\r\n"
    "Mail-Followup-To: dev@lists.example.com, dave@example.com, alex@example.org\r\n"
    "Subject: patch review\r\n"
    f"Message-ID: <{FOLLOWUP}>\r\n"
    "Date: Wed, 03 Jan 2024 10:00:00 +0000\r\n"
    "\r\n"
    "Please review.\r\n"
).encode()
PERSONAL = {"personal": "alex@example.org", "personal2": "alex.morgan@example.org",
            "work": "amorgan@acme.test"}


@dataclass
class Bed:
    env: MailEnv
    smtp: SmtpBed
    ctx: WriteContext
    attachments: Path

    @property
    def drafts(self) -> Path:
        return self.env.mail_root / "personal" / "Drafts" / "cur"

    @property
    def sent(self) -> Path:
        return self.env.mail_root / "personal" / "Sent" / "cur"

    def draft_body(self, mid: str) -> str:
        """The body text of the (first) draft file with this Message-ID."""
        return body_text(parse(self.files_with(self.drafts, mid)[0].read_bytes()))

    def files_with(self, folder: Path, mid: str) -> list[Path]:
        needle = f"<{mid}>".encode()
        return sorted(p for p in folder.iterdir()
                      if needle in p.read_bytes().split(b"\r\n\r\n", 1)[0]
                      and re.search(rb"(?mi)^message-id:\s*" + re.escape(needle),
                                    p.read_bytes()))

    def mailbox(self) -> reads.Mailbox:
        """What the reads use, sharing with ctx, as in the server, the drafts the model saw."""
        return reads.Mailbox(self.ctx.config, self.ctx.reader,
                             seen_drafts=self.ctx.seen_drafts)

    def put_draft(self, name: str, data: bytes) -> None:
        """A draft file another mail client saved in the personal Drafts, indexed."""
        (self.drafts / name).write_bytes(data)
        self.env.notmuch("new")

    def refused_send(self, draft_id: str, match: str) -> None:
        """send_draft refuses the draft, and nothing changed nor went out."""
        before = self.state()
        with pytest.raises(ComposeError, match=match):
            send.send_draft(self.ctx, draft_id)
        assert self.state() == before and self.smtp.received == []

    def receive(self, data: bytes) -> None:
        """One more message in the personal INBOX, indexed (hooks and all)."""
        deliver(self.env, f"1800000100.{zlib.crc32(data)}.test", data)
        self.env.notmuch("new")

    def tags(self, mid: str) -> frozenset[str]:
        found = self.ctx.reader.find(mid)
        assert found is not None, mid
        return found.tags

    def state(self) -> tuple[object, ...]:
        """Everything a refused call must leave as it was."""
        root = self.env.mail_root
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*")
                       if p.is_file() and p.parent.name in ("cur", "new"))
        with sidecar.opened(self.ctx.sidecar_file) as conn:
            audit = conn.execute("SELECT count(*) FROM audit_log").fetchone()[0]
        return files, self.tags(ORIGINAL), audit, len(self.smtp.received)


def deliver(env: MailEnv, name: str, data: bytes) -> None:
    (env.mail_root / "personal" / "INBOX" / "cur" / f"{name}:2,S").write_bytes(data)


def configure(env: MailEnv, smtp: SmtpBed, **send_options: object) -> None:
    """The fixture fmail.toml with its per-account msmtp commands dropped and a [send] table
    that points at the test server."""
    text = re.sub(r"(?m)^send = .*\n", "", env.fmail_config.read_text()).split("\n[send]\n")[0]
    env.fmail_config.write_text(text + "\n" + smtp.send_settings(**send_options))


@pytest.fixture
def bed(indexed: MailEnv, tmp_path: Path) -> Iterator[Bed]:
    smtp = SmtpBed(tmp_path / "smtp", PERSONAL).start()
    attachments = tmp_path / "outgoing"
    attachments.mkdir()
    configure(indexed, smtp, attachments_dir=str(attachments), max_message_mb=1)
    deliver(indexed, "1800000000.test_1.host", ORIGINAL_MAIL)
    deliver(indexed, "1800000001.test_2.host", FOLLOWUP_MAIL)
    indexed.notmuch("new")
    config = indexed.config()
    try:
        with Reader(config.settings.notmuch_config) as reader, \
                Writer(config.settings.notmuch_config) as writer:
            yield Bed(indexed, smtp, WriteContext(config, reader, writer,
                                                  sidecar.sidecar_path(config.data_dir)),
                      attachments)
    finally:
        smtp.stop()


def parse(data: bytes) -> email.message.EmailMessage:
    msg = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(msg, email.message.EmailMessage)
    return msg


def body_text(msg: email.message.EmailMessage) -> str:
    body = msg.get_body(preferencelist=("plain",))
    assert isinstance(body, email.message.EmailMessage)
    return str(body.get_content()).replace("\r\n", "\n")


def header_block(data: bytes) -> str:
    return data.split(b"\r\n\r\n", 1)[0].decode("ascii")


# ---------------------------------------------------------------------------------------------
# Replies


def test_reply_all_is_a_threaded_draft_in_drafts(bed: Bed) -> None:
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Here they are.", reply_all=True)

    assert draft.from_ == "alex@example.org"
    assert draft.to == ["team@example.net"]  # Reply-To wins over From
    assert draft.cc == ["bob@example.com", "carol@example.com"]  # none of the user's own
    assert draft.subject == "Re: Grüße"  # no Re: AW: stacking
    (path,) = bed.files_with(bed.drafts, draft.message_id)
    assert path.name.endswith(":2,DS")
    assert bed.tags(draft.message_id) == {"draft"}
    data = path.read_bytes()
    head = header_block(data)
    assert "From: Alex Morgan <alex@example.org>" in head
    assert f"In-Reply-To: <{ORIGINAL}>" in head
    assert f"References: <root@example.net> <mid@example.net> <{ORIGINAL}>" in head
    assert "Subject: Re: =?utf-8?" in head and "Grüße" not in head  # encoded words
    assert re.search(r"(?m)^Message-ID: <[^>]+@example\.org>\r?$", head)  # the user's domain
    assert "\n" not in data.replace(b"\r\n", b"").decode()  # CRLF throughout
    body = body_text(parse(data))
    assert body.startswith("Here they are.\n\nOn Tue, 02 Jan 2024 at 09:01 +0000, Zoë Müller "
                           "wrote:\n> Hello Alex,\n>\n> can you send the numbers?\n")
    assert "> Zoë" not in body  # the signature is not quoted
    assert bed.ctx.reader.find(draft.message_id).thread_id == bed.ctx.reader.find(ORIGINAL).thread_id  # type: ignore[union-attr]


def test_reply_all_leaves_out_the_users_sub_addresses_only(bed: Bed) -> None:
    """A message to the user's alex+lists@ (a sub-address of alex@example.org): reply-all
    writes to the others, not back to the user; alex+x@ of another domain is someone else."""
    deliver(bed.env, "1800000003.test_4.host", (
        b"From: Bob <bob@example.com>\r\nTo: Alex <Alex+Lists@Example.org>\r\n"
        b"Cc: Carol <carol@example.com>, Other <alex+x@example.net>\r\n"
        b"Subject: plans\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\n"
        b"Message-ID: <plus-1@example.com>\r\n\r\nHi\r\n"))
    bed.env.notmuch("new")
    draft = compose.reply_to_email(bed.ctx, "plus-1@example.com", "ok", reply_all=True)
    assert draft.to == ["bob@example.com"]
    assert draft.cc == ["carol@example.com", "alex+x@example.net"]


def test_reply_honours_mail_followup_to_and_plain_reply(bed: Bed) -> None:
    everyone = compose.reply_to_email(bed.ctx, FOLLOWUP, "LGTM", reply_all=True, quote=False)
    assert everyone.to == ["dev@lists.example.com", "dave@example.com"] and everyone.cc == []
    assert everyone.subject == "Re: patch review"
    assert bed.draft_body(everyone.message_id) == "LGTM\n"

    one = compose.reply_to_email(bed.ctx, FOLLOWUP, "Thanks")
    assert one.to == ["dave@example.com"] and one.cc == []


def test_a_reply_to_a_forward_quotes_the_forwarded_message(bed: Bed) -> None:
    forward = (b"From: Priya Raman <priya.raman@acme.test>\r\nTo: alex@example.org\r\n"
               b"Subject: FW: Invoice 4471 overdue\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\n"
               b"Message-ID: <fw-4471@acme.test>\r\n\r\n"
               b"Please handle this by Friday.\r\n\r\n________________________________\r\n"
               b"From: Vendor Billing <billing@vendor.example>\r\n"
               b"Sent: Monday, March 2, 2026 9:14 AM\r\nTo: Priya Raman <priya.raman@acme.test>\r\n"
               b"Subject: Invoice 4471 overdue\r\n\r\n"
               b"Your invoice 4471 for EUR 12,400 is 30 days overdue.\r\n")
    deliver(bed.env, "1800000002.test_3.host", forward)
    bed.env.notmuch("new")
    draft = compose.reply_to_email(bed.ctx, "fw-4471@acme.test", "Paid today.")
    body = bed.draft_body(draft.message_id)
    assert body.startswith("Paid today.\n\nOn Mon, 02 Mar 2026 at 10:00 +0000, Priya Raman "
                           "wrote:\n> Please handle this by Friday.\n")
    assert "> Your invoice 4471 for EUR 12,400 is 30 days overdue." in body


def test_a_reply_to_a_threads_id_says_it_is_one(bed: Bed) -> None:
    thread = bed.env.notmuch("search", "--output=threads", f"id:{ORIGINAL}").stdout.strip()
    with pytest.raises(ComposeError, match="no message with id .*that is a thread's id"):
        compose.reply_to_email(bed.ctx, thread.removeprefix("thread:"), "Thanks")


def test_a_reply_to_html_mail_quotes_it_without_markdown_escapes(bed: Bed) -> None:
    bed.receive(b"From: Jo <jo@example.net>\r\nTo: alex@example.org\r\nSubject: Q3\r\n"
                b"Message-ID: <q3@example.net>\r\nMIME-Version: 1.0\r\n"
                b"Content-Type: text/html; charset=utf-8\r\n\r\n"
                b"<p>Results for Q3:</p><p>- EMEA up</p><p>1. ACME signed</p>"
                b"<p>&gt; 40% growth</p>\r\n")
    draft = compose.reply_to_email(bed.ctx, "q3@example.net", "Great.")
    body = bed.draft_body(draft.message_id)
    assert body.endswith("> Results for Q3:\n>\n> - EMEA up\n>\n> 1. ACME signed\n>\n"
                         "> > 40% growth\n")
    assert "\\" not in body


def test_a_reply_to_an_invitation_quotes_its_summary_as_people_read_it(bed: Bed) -> None:
    """An invitation without body text: the reply quotes the event's summary (titled by the
    part's method), its HTML-only description without Markdown escapes, and no notes."""
    bed.receive(b"From: Jo <jo@example.net>\r\nTo: alex@example.org\r\n"
                b"Subject: Invitation: Budget review\r\nMessage-ID: <inv@example.net>\r\n"
                b"Date: Mon, 30 Nov 2026 09:00:00 +0000\r\nMIME-Version: 1.0\r\n"
                b"Content-Type: text/calendar; method=REQUEST; charset=utf-8\r\n\r\n"
                b"BEGIN:VCALENDAR\r\nBEGIN:VEVENT\r\nSUMMARY:Budget review\r\n"
                b"DTSTART:20261203T150000Z\r\nDTEND:20261203T160000Z\r\n"
                b"X-ALT-DESC;FMTTYPE=text/html:<p>Agenda:</p><p>1. Budget</p>\r\n"
                b"END:VEVENT\r\nEND:VCALENDAR\r\n")
    draft = compose.reply_to_email(bed.ctx, "inv@example.net", "I'll be there.")
    body = bed.draft_body(draft.message_id)
    assert body == ("I'll be there.\n\nOn Mon, 30 Nov 2026 at 09:00 +0000, Jo wrote:\n"
                    "> Invitation: Budget review\n> When: Thu 2026-12-03 15:00 to 16:00 (UTC)\n"
                    "> Description: Agenda:\n>\n> 1. Budget\n")


def test_save_draft_again_replaces_the_file_and_keeps_the_threading(bed: Bed) -> None:
    first = compose.reply_to_email(bed.ctx, ORIGINAL, "v1")
    (old,) = bed.files_with(bed.drafts, first.message_id)
    again = compose.save_draft(bed.ctx, bcc=["secret@example.com"], body="v2",
                               draft_id=first.message_id)
    assert again.message_id == first.message_id and again.to == ["team@example.net"]
    assert again.bcc == ["secret@example.com"]
    (new,) = bed.files_with(bed.drafts, first.message_id)
    assert new != old and not old.exists()
    head = header_block(new.read_bytes())
    assert f"In-Reply-To: <{ORIGINAL}>" in head and "Bcc: secret@example.com" in head
    assert body_text(parse(new.read_bytes())) == "v2\n"
    found = bed.ctx.reader.find(first.message_id)
    assert found is not None and found.filenames == (str(new),)
    with pytest.raises(ChangeError, match="not taken back"):
        writes.undo_last_write(bed.ctx)


def test_a_drafts_id_works_before_the_mirror_has_it(bed: Bed) -> None:
    """The answer's id is the uid only once the mirror has the draft (its sync after the
    write failed or was not run here): else the uid resolves to nothing, and the Message-ID
    is the id that works, as in listings."""
    first = compose.save_draft(bed.ctx, ["bob@example.com"], subject="plan", body="v1")
    again = compose.save_draft(bed.ctx, body="v2", draft_id=first.id)
    assert again.message_id == first.message_id and first.id == first.message_id
    sync_sidecar(bed.ctx.config, bed.ctx.reader)
    synced = compose.save_draft(bed.ctx, body="v3", draft_id=first.id)
    assert synced.id == sidecar.uid_for(first.message_id)
    assert compose.save_draft(bed.ctx, body="v4", draft_id=synced.id).id == synced.id


def test_a_draft_with_two_versions_in_drafts_is_neither_sent_nor_saved_over(bed: Bed) -> None:
    """Another client's edit (a phone's new version, pulled before its old one is deleted)
    left two files of one Message-ID in Drafts: send_email sent the old one and dropped the
    edit, save_draft rebuilt the old one over it.  Both refuse and change nothing."""
    first = compose.save_draft(bed.ctx, ["bob@example.com"], subject="plan", body="old text")
    (old,) = bed.files_with(bed.drafts, first.message_id)
    bed.put_draft("1900000000.phone.host:2,DS",
                  old.read_bytes().replace(b"old text", b"edited on the phone"))
    bed.refused_send(first.message_id, "2 different versions in Drafts.*nothing was changed")
    before = bed.state()
    with pytest.raises(ComposeError, match="2 different versions in Drafts"):
        compose.save_draft(bed.ctx, cc=["carl@example.com"], draft_id=first.message_id)
    assert bed.state() == before and len(bed.files_with(bed.drafts, first.message_id)) == 2


def as_fetched_back(data: bytes) -> bytes:
    """A draft as mbsync stores the copy it uploaded, fetched back: with the X-TUID line it
    put into that copy -- last of its header, before the blank line -- and LF line ends."""
    return data.replace(b"\r\n\r\n", b"\r\nX-TUID: vhZfUoALbz2p\r\n\r\n",
                        1).replace(b"\r\n", b"\n")


def test_a_draft_fetched_back_with_mbsyncs_header_alone_is_one_version(bed: Bed) -> None:
    """mbsync, its state lost, fetched the server's copy of a draft beside the local one: the
    two differ by the X-TUID line mbsync put into the copy it uploaded, and by its LF line
    ends.  One version: sent."""
    first = compose.save_draft(bed.ctx, ["bob@example.com"], subject="plan", body="text")
    (old,) = bed.files_with(bed.drafts, first.message_id)
    bed.put_draft("1900000000.refetched.host:2,DS", as_fetched_back(old.read_bytes()))
    assert len(bed.files_with(bed.drafts, first.message_id)) == 2
    assert send.send_draft(bed.ctx, first.message_id).sent
    (got,) = bed.smtp.received
    assert b"X-TUID" not in got.data and bed.files_with(bed.drafts, first.message_id) == []


def saved_elsewhere(bed: Bed, mid: str, name: str, edit: Callable[[bytes], bytes]) -> None:
    """Another program saves the draft as a new file of its Message-ID (mutt's edit; mbsync's
    copy fetched back) and removes the old file; indexed."""
    (old,) = bed.files_with(bed.drafts, mid)
    (bed.drafts / name).write_bytes(edit(old.read_bytes()))
    old.unlink()
    bed.env.notmuch("new")


def in_mutt(data: bytes) -> bytes:
    return data.replace(b"\r\n\r\nv1\r\n", b"\r\n\r\nv2 from mutt\r\n")


def test_a_draft_edited_in_mutt_since_the_model_saved_it_is_not_saved_over(bed: Bed) -> None:
    """The model saves a draft, the user edits it in mutt, the model saves it again with a body
    written from its own text: the user's edit was gone.  Refused, nothing changed; once the
    model read it again (get_email), its change is saved."""
    first = compose.save_draft(bed.ctx, ["bob@example.com"], subject="plan", body="v1")
    saved_elsewhere(bed, first.message_id, "1900000000.mutt.host:2,DS", in_mutt)
    before = bed.state()
    with pytest.raises(ComposeError, match="changed since you last read or saved it .in "
                                           "another mail client.; nothing was saved: read it "
                                           r"again \(get_email\)"):
        compose.save_draft(bed.ctx, body="v1, and more", draft_id=first.message_id)
    assert bed.state() == before and bed.draft_body(first.message_id) == "v2 from mutt\n"
    assert reads.get_email(bed.mailbox(), first.message_id).body.text == "v2 from mutt"
    compose.save_draft(bed.ctx, body="v2 from mutt, and more", draft_id=first.message_id)
    assert bed.draft_body(first.message_id) == "v2 from mutt, and more\n"


def test_a_reply_mbsync_alone_changed_is_saved_again_and_one_edited_once_read_in_its_thread(
        bed: Bed) -> None:
    """mbsync renames a draft it uploads and, its state lost, fetches it back with X-TUID and
    LF line ends: the same draft, saved again.  The user's edit in mutt is refused until the
    model reads the draft again, here in its thread (get_thread)."""
    reply = compose.reply_to_email(bed.ctx, ORIGINAL, "v1")
    saved_elsewhere(bed, reply.message_id, "1900000000.mbsync.host,U=7:2,DS", as_fetched_back)
    compose.save_draft(bed.ctx, cc=["carol@example.com"], draft_id=reply.message_id)
    saved_elsewhere(bed, reply.message_id, "1900000001.mutt.host:2,DS", in_mutt)
    with pytest.raises(ComposeError, match="changed since you last read or saved it"):
        compose.save_draft(bed.ctx, cc=[], draft_id=reply.message_id)
    thread = reads.get_thread(bed.mailbox(), reply.message_id)
    assert [m.body.text for m in thread.messages if m.body and "mutt" in m.body.text]
    compose.save_draft(bed.ctx, cc=[], draft_id=reply.message_id)
    assert bed.draft_body(reply.message_id).startswith("v2 from mutt\n")
    assert "Cc" not in parse(bed.files_with(bed.drafts, reply.message_id)[0].read_bytes())


def test_a_draft_another_client_sent_is_not_sent_again_before_its_deletion_arrives(
        bed: Bed) -> None:
    """The phone sent the draft: its copy is in Sent already, the draft's deletion comes with
    the next pull.  send_email sent it a second time, and filed a second Sent copy."""
    first = compose.save_draft(bed.ctx, ["bob@example.com"], subject="plan", body="text")
    (draft,) = bed.files_with(bed.drafts, first.message_id)
    (bed.sent / "1900000000.phone.host:2,S").write_bytes(draft.read_bytes())
    bed.env.notmuch("new")
    bed.refused_send(first.message_id, "has a copy in Sent too: it was sent already")


def test_a_draft_deleted_or_moved_meanwhile_is_refused_saying_where_it_is(bed: Bed) -> None:
    """A draft the user deleted (Trash) or another client moved out of Drafts was refused
    with "re-index and try again", which cannot help; the refusal says where it is."""
    first = compose.save_draft(bed.ctx, ["bob@example.com"], subject="plan", body="text")
    assert writes.delete_messages(bed.ctx, [first.message_id]).applied == [first.message_id]
    bed.refused_send(first.message_id, "no longer in a Drafts folder but in personal/Trash")
    with pytest.raises(ComposeError, match="no longer in a Drafts folder.*left as it is"):
        compose.save_draft(bed.ctx, body="more", draft_id=first.message_id)


# ---------------------------------------------------------------------------------------------
# Sending


OTHER_CLIENTS_DRAFT = (
    b"From: Alex Morgan <alex@example.org>\r\nTo: bob@example.com\r\n"
    b"Reply-To: projects@example.org\r\nOrganization: Example Org\r\nX-Priority: 1\r\n"
    b"Subject: plans\r\nMessage-ID: <phone-1@example.org>\r\n"
    b"Date: Sat, 05 Dec 2026 10:00:00 +0000\r\n\r\nDraft from the phone.\r\n")


def test_a_draft_from_another_client_keeps_its_headers_when_saved_again(bed: Bed) -> None:
    bed.put_draft("1800000700.phone.host:2,DS", OTHER_CLIENTS_DRAFT)
    saved = compose.save_draft(bed.ctx, cc=["carol@example.com"], draft_id="phone-1@example.org")
    assert saved.cc == ["carol@example.com"]
    (path,) = bed.files_with(bed.drafts, "phone-1@example.org")
    msg = parse(path.read_bytes())
    assert (msg["reply-to"], msg["organization"], msg["x-priority"]) == (
        "projects@example.org", "Example Org", "1")
    assert body_text(msg) == "Draft from the phone.\n"


# Headers another client kept in a draft, as its source has them: one that decodes to text
# like an encoded word hiding a Bcc, one that decodes to a line break, 8-bit bytes, a fold.
KEPT_SOURCE = [
    b"X-Note: =?utf-8?q?=3D=3Futf-8=3Fq=3F=3D0D=3D0ABcc:_spy@evil.example=3F=3D?=",
    b"X-Comment: =?utf-8?q?Example=0D=0AX-Injected:_1?=",
    b"X-Label: caf\xc3\xa9 \xc3\xa9t\xc3\xa9",
    b"X-Folded: first part\r\n\tsecond part",
]


def test_a_draft_saved_again_writes_the_headers_it_keeps_as_they_were(bed: Bed) -> None:
    """A kept header went back through the email package as decoded text: decoded a second
    time, a line break hidden in it started a header of its own (a Bcc when sent), one that
    decoded to a line break stopped the save, 8-bit bytes became U+FFFD or unknown-8bit."""
    draft = OTHER_CLIENTS_DRAFT.replace(b"phone-1@", b"kept-1@").replace(
        b"X-Priority: 1\r\n", b"".join(line + b"\r\n" for line in KEPT_SOURCE))
    bed.put_draft("1800000702.kept.host:2,DS", draft)
    compose.save_draft(bed.ctx, cc=["carol@example.com"], draft_id="kept-1@example.org")
    (path,) = bed.files_with(bed.drafts, "kept-1@example.org")
    data = path.read_bytes()
    for line in KEPT_SOURCE:
        assert b"\r\n" + line + b"\r\n" in data
    head = data.split(b"\r\n\r\n", 1)[0]
    names = [line.split(b":", 1)[0].lower() for line in head.split(b"\r\n")
             if line[:1] not in (b" ", b"\t")]
    assert sorted(names) == sorted([b"from", b"to", b"cc", b"subject", b"date", b"message-id",
                                    b"reply-to", b"organization", b"x-note", b"x-comment",
                                    b"x-label", b"x-folded", b"content-type",
                                    b"content-transfer-encoding", b"mime-version"])
    # and so they go out: as written, to the recipients only -- 8-bit text as encoded words,
    # since nothing sends SMTPUTF8 (test_a_draft_with_raw_utf8_headers_goes_out_as_encoded_words)
    send.send_draft(bed.ctx, "kept-1@example.org")
    (got,) = bed.smtp.received
    assert sorted(got.rcpt_tos) == ["bob@example.com", "carol@example.com"]
    for line in KEPT_SOURCE:
        assert (b"\r\n" + line + b"\r\n" in got.data) == line.isascii()
    assert got.message()["x-label"] == "café été"


def test_a_draft_with_an_html_body_is_not_rebuilt_without_it(bed: Bed) -> None:
    html_draft = OTHER_CLIENTS_DRAFT.replace(b"phone-1@", b"html-1@").replace(
        b"\r\n\r\nDraft from the phone.\r\n",
        b"\r\nMIME-Version: 1.0\r\nContent-Type: multipart/alternative; boundary=B\r\n\r\n"
        b"--B\r\nContent-Type: text/plain\r\n\r\nHello\r\n"
        b"--B\r\nContent-Type: text/html\r\n\r\n<p><b>Hello</b></p>\r\n--B--\r\n")
    bed.put_draft("1800000701.html.host:2,DS", html_draft)
    before = bed.state()
    with pytest.raises(ComposeError, match="HTML body"):
        compose.save_draft(bed.ctx, cc=["carol@example.com"], draft_id="html-1@example.org")
    assert bed.state() == before
    (path,) = bed.files_with(bed.drafts, "html-1@example.org")
    assert path.read_bytes() == html_draft


def test_send_goes_through_msmtp_and_files_the_message(bed: Bed) -> None:
    (bed.attachments / "numbers.csv").write_text("q,n\n1,2\n")
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Numbers attached.", reply_all=True)
    compose.save_draft(bed.ctx, bcc=["Secret Person <secret@example.com>"],
                       attachments=["numbers.csv"], draft_id=draft.message_id)

    done = send.send_draft(bed.ctx, draft.message_id)

    assert done.sent is True and done.message_id == draft.message_id
    (got,) = bed.smtp.received
    assert got.mail_from == "alex@example.org"
    assert got.rcpt_tos == ("team@example.net", "bob@example.com", "carol@example.com",
                            "secret@example.com")  # Bcc in the envelope ...
    head = header_block(got.data)
    assert not re.search(r"(?mi)^bcc:", head) and "secret" not in head  # ... not in the mail
    assert f"In-Reply-To: <{ORIGINAL}>" in head and f"Message-ID: <{draft.message_id}>" in head
    msg = got.message()
    assert msg["subject"] == "Re: Grüße"
    assert body_text(msg).startswith("Numbers attached.\n\nOn ")
    (part,) = list(msg.iter_attachments())
    assert part.get_filename() == "numbers.csv" and part.get_content_type() == "text/csv"
    assert part.get_payload(decode=True) == b"q,n\n1,2\n"  # exactly as on disk

    assert bed.files_with(bed.drafts, draft.message_id) == []
    (copy,) = bed.files_with(bed.sent, draft.message_id)
    assert copy.name.endswith(":2,S")
    assert "Bcc: Secret Person <secret@example.com>" in header_block(copy.read_bytes())
    assert bed.tags(draft.message_id) - {"attachment"} == {"sent"}  # no longer a draft, not unread
    assert "replied" in bed.tags(ORIGINAL)
    (original,) = bed.ctx.reader.find(ORIGINAL).filenames  # type: ignore[union-attr]
    assert original.endswith(":2,RS")  # mbsync pushes it as \Answered

    with sidecar.opened(bed.ctx.sidecar_file) as conn:
        entry = sidecar.last_write(conn, bed.ctx.session)
    assert entry is not None and entry.action == "send"
    assert {c["message_id"] for c in entry.changes} == {draft.message_id, ORIGINAL}
    with pytest.raises(ChangeError, match="cannot be recalled"):
        writes.undo_last_write(bed.ctx)
    assert "replied" in bed.tags(ORIGINAL) and bed.files_with(bed.sent, draft.message_id) == [copy]


def test_a_text_attachment_names_its_charset_and_goes_out_byte_for_byte(bed: Bed) -> None:
    """Text without a charset is read as US-ASCII: a UTF-8 file says utf-8; a file in a
    charset not known (Latin-1 here) claims none, and goes as a file to save."""
    (bed.attachments / "résumé ü.txt").write_text("hello attachment ü")
    latin1 = "Grüße aus Köln\r\n".encode("latin-1")
    (bed.attachments / "old.txt").write_bytes(latin1)
    draft = compose.save_draft(bed.ctx, ["zoe@example.net"], subject="cv", body="see attached",
                               attachments=["résumé ü.txt", "old.txt"])
    (saved,) = bed.files_with(bed.drafts, draft.message_id)
    saved_draft = parse(saved.read_bytes())  # before sending takes it out of Drafts
    send.send_draft(bed.ctx, draft.message_id)
    (got,) = bed.smtp.received
    for msg in (saved_draft, got.message()):
        utf8, unknown = msg.iter_attachments()
        assert utf8.get_content_type() == "text/plain"
        assert utf8.get_content_charset() == "utf-8"
        assert utf8.get_content() == "hello attachment ü"
        assert unknown.get_content_type() == "application/octet-stream"
        assert unknown.get_param("charset") is None and unknown.get_filename() == "old.txt"
        assert unknown.get_payload(decode=True) == latin1  # exactly as on disk


def test_an_account_whose_server_saves_sent_mail_gets_no_sent_copy_from_us(bed: Bed) -> None:
    """``server_saves_sent = true`` on an account (what `fmail-nm account add` writes for
    Gmail) is ``send = { server_stores_sent = true }``: the server files what it sends, so a
    copy of ours would be a second one in Sent."""
    text = bed.env.fmail_config.read_text()
    channel = 'mbsync_channel = "personal"\n'
    assert channel in text
    bed.env.fmail_config.write_text(
        text.replace(channel, channel + "server_saves_sent = true\n", 1))
    bed.ctx = replace(bed.ctx, config=bed.env.config())
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Here they are.")

    assert send.send_draft(bed.ctx, draft.message_id).sent is True

    assert len(bed.smtp.received) == 1
    assert bed.files_with(bed.sent, draft.message_id) == []
    assert bed.files_with(bed.drafts, draft.message_id) == []
    assert "replied" in bed.tags(ORIGINAL)


def test_a_draft_the_server_filed_is_refused_as_sent_by_its_uid(bed: Bed) -> None:
    """With the server filing sent mail no copy of ours is left to resolve the draft's uid by:
    a retry under the uid the listing showed is still told it was sent, not "no draft"."""
    text = bed.env.fmail_config.read_text()
    channel = 'mbsync_channel = "personal"\n'
    bed.env.fmail_config.write_text(
        text.replace(channel, channel + "server_saves_sent = true\n", 1))
    bed.ctx = replace(bed.ctx, config=bed.env.config())
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Here they are.")
    send.send_draft(bed.ctx, draft.message_id)

    with pytest.raises(send.SendRefused, match="was sent already"):
        send.send_draft(bed.ctx, sidecar.uid_for(draft.message_id))
    assert len(bed.smtp.received) == 1


def test_a_draft_sent_from_another_accounts_address_leaves_no_draft_behind(bed: Bed) -> None:
    """A draft saved in personal/Drafts whose From the user changed (in mutt) to the work
    address: sent through the work account, filed in work/Sent, and gone from the Drafts
    folder it lay in -- where mutt, aerc and the phone would have kept showing it."""
    draft = (b"From: Alex Morgan <amorgan@acme.test>\r\nTo: client@example.com\r\n"
             b"Subject: cross account\r\nMessage-ID: <cross-1@acme.test>\r\n"
             b"Date: Sat, 05 Dec 2026 10:00:00 +0000\r\n\r\nHello\r\n")
    bed.put_draft("1800000600.cross.host:2,DS", draft)

    done = send.send_draft(bed.ctx, "cross-1@acme.test")

    assert done.sent is True
    (got,) = bed.smtp.received
    assert got.mail_from == "amorgan@acme.test"
    assert bed.files_with(bed.drafts, "cross-1@acme.test") == []
    work_sent = bed.env.mail_root / "work" / "Sent" / "cur"
    assert len(bed.files_with(work_sent, "cross-1@acme.test")) == 1
    assert "draft" not in bed.tags("cross-1@acme.test")


def test_with_every_address_on_both_accounts_a_reply_stays_in_the_account_of_the_mail(
        bed: Bed) -> None:
    """Accounts found in an mbsync config all list notmuch's addresses: a reply to mail in
    work's INBOX went to personal's Drafts and, sent, into personal's Sent."""
    config = bed.ctx.config
    shared = config.account("personal").addresses + config.account("work").addresses
    work = replace(config.account("work"), addresses=shared,
                   folders={**config.account("work").folders, "drafts": "work/Drafts"})
    ctx = replace(bed.ctx, config=replace(config, accounts=(
        replace(config.account("personal"), addresses=shared), work)))
    data = (b"From: Priya <priya@example.net>\r\nTo: amorgan@acme.test\r\n"
            b"Subject: Q4\r\nMessage-ID: <q4-work@example.net>\r\n\r\nNumbers?\r\n")
    (bed.env.mail_root / "work" / "INBOX" / "cur" / "1800000700.w.host:2,S").write_bytes(data)
    bed.env.notmuch("new")

    draft = compose.reply_to_email(ctx, "q4-work@example.net", "Here.")

    assert draft.from_ == "amorgan@acme.test"
    work_drafts = bed.env.mail_root / "work" / "Drafts" / "cur"
    assert len(bed.files_with(work_drafts, draft.message_id)) == 1
    send.send_draft(ctx, draft.message_id)
    assert len(bed.files_with(bed.env.mail_root / "work" / "Sent" / "cur", draft.message_id)) == 1
    assert bed.files_with(bed.sent, draft.message_id) == []


def test_with_every_address_on_both_accounts_a_draft_from_work_is_sent_by_work(
        bed: Bed) -> None:
    """Accounts from an mbsync config list every address, each its login first: a draft in
    personal's Drafts whose From the user changed to the work login goes through work."""
    config = bed.ctx.config
    personal, work = config.account("personal"), config.account("work")
    ctx = replace(bed.ctx, config=replace(config, accounts=(
        replace(personal, addresses=personal.addresses + work.addresses),
        replace(work, addresses=work.addresses + personal.addresses))))
    bed.put_draft("1800000600.cross.host:2,DS",
                  b"From: Alex Morgan <amorgan@acme.test>\r\nTo: client@example.com\r\n"
                  b"Subject: cross\r\nMessage-ID: <cross-2@acme.test>\r\n\r\nHello\r\n")

    send.send_draft(ctx, "cross-2@acme.test")

    work_sent = bed.env.mail_root / "work" / "Sent" / "cur"
    assert len(bed.files_with(work_sent, "cross-2@acme.test")) == 1
    assert bed.files_with(bed.sent, "cross-2@acme.test") == []


def from_work(data: bytes) -> bytes:
    """mutt's edit of a draft's From to the work address (its `edit-from`)."""
    return re.sub(rb"(?m)^From: [^\r\n]*", b"From: Alex Morgan <amorgan@acme.test>", data,
                  count=1)


def test_a_draft_whose_from_went_to_an_account_without_drafts_is_saved_where_it_lies(
        bed: Bed) -> None:
    """A draft in personal's Drafts whose From the user changed (in mutt) to the work address,
    work having no Drafts folder: saving it again was refused ("account 'work' has no drafts
    folder") and the model's edit lost.  It is saved once, in the Drafts folder it lies in,
    its old file gone, and still goes out through work."""
    assert "drafts" not in bed.ctx.config.account("work").folders
    first = compose.save_draft(bed.ctx, ["bob@example.com"], subject="plan", body="v1")
    saved_elsewhere(bed, first.message_id, "1900000000.mutt.host:2,DS", from_work)
    (old,) = bed.files_with(bed.drafts, first.message_id)
    reads.get_email(bed.mailbox(), first.message_id)  # the model sees the user's change

    saved = compose.save_draft(bed.ctx, body="v2", draft_id=first.message_id)

    assert saved.from_ == "amorgan@acme.test"
    (new,) = bed.files_with(bed.drafts, first.message_id)
    assert new != old and not old.exists() and new.name.endswith(":2,DS")
    msg = parse(new.read_bytes())
    assert msg["from"] == "Alex Morgan <amorgan@acme.test>" and body_text(msg) == "v2\n"
    found = bed.ctx.reader.find(first.message_id)
    assert found is not None and found.filenames == (str(new),) and "draft" in found.tags
    assert not (bed.env.mail_root / "work" / "Drafts").exists()
    send.send_draft(bed.ctx, first.message_id)
    (got,) = bed.smtp.received
    assert got.mail_from == "amorgan@acme.test" and b"\r\n\r\nv2\r\n" in got.data
    assert bed.files_with(bed.drafts, first.message_id) == []


def test_a_draft_whose_from_went_to_an_account_with_drafts_moves_there_once(bed: Bed) -> None:
    """The same change of From to an account that has a Drafts folder (not made on disk yet):
    saved again, the draft is one file in that account's Drafts, none left in the other."""
    config = bed.ctx.config
    work = replace(config.account("work"),
                   folders={**config.account("work").folders, "drafts": "work/Drafts"})
    bed.ctx = replace(bed.ctx, config=replace(config, accounts=(
        config.account("personal"), work)))
    first = compose.save_draft(bed.ctx, ["bob@example.com"], subject="plan", body="v1")
    saved_elsewhere(bed, first.message_id, "1900000000.mutt.host:2,DS", from_work)
    reads.get_email(bed.mailbox(), first.message_id)
    assert not (bed.env.mail_root / "work" / "Drafts").exists()

    compose.save_draft(bed.ctx, body="v2", draft_id=first.message_id)

    assert bed.files_with(bed.drafts, first.message_id) == []
    (new,) = bed.files_with(bed.env.mail_root / "work" / "Drafts" / "cur", first.message_id)
    assert new.name.endswith(":2,DS") and body_text(parse(new.read_bytes())) == "v2\n"
    found = bed.ctx.reader.find(first.message_id)
    assert found is not None and found.filenames == (str(new),) and "draft" in found.tags


def test_a_reply_to_mail_for_an_alias_only_notmuch_names_writes_from_it(bed: Bed) -> None:
    """An address in notmuch's user.other_email that no account lists: the reply is from it
    (in the account holding the mail), and a reply-all leaves it and the work address out."""
    bed.env.notmuch("config", "set", "user.other_email", *PERSONAL.values(), "me@alias.test")
    ctx = replace(bed.ctx, config=bed.env.config())
    bed.receive(b"From: Jo <jo@example.net>\r\nTo: me@alias.test, amorgan@acme.test\r\n"
                b"Cc: kim@example.net\r\nSubject: alias\r\n"
                b"Message-ID: <alias-1@example.net>\r\n\r\nHi\r\n")

    draft = compose.reply_to_email(ctx, "alias-1@example.net", "Hi", reply_all=True)

    assert draft.from_ == "me@alias.test"
    assert (draft.to, draft.cc) == (["jo@example.net"], ["kim@example.net"])
    assert len(bed.files_with(bed.drafts, draft.message_id)) == 1  # personal's, which holds the mail


def test_forward_attaches_the_original_unchanged_and_marks_it_passed(bed: Bed) -> None:
    draft = compose.forward_email(bed.ctx, ORIGINAL, ["Frank <frank@example.com>"], "FYI")
    assert draft.subject == "Fwd: Re: AW: Grüße" and draft.to == ["frank@example.com"]
    send.send_draft(bed.ctx, draft.message_id)

    (got,) = bed.smtp.received
    assert got.rcpt_tos == ("frank@example.com",)
    assert f"X-Forwarded-Message-Id: <{ORIGINAL}>" in header_block(got.data)
    (part,) = list(got.message().iter_attachments())
    assert part.get_content_type() == "message/rfc822"
    assert ORIGINAL_MAIL in got.data  # byte for byte, 8-bit body included
    assert "passed" in bed.tags(ORIGINAL) and "replied" not in bed.tags(ORIGINAL)


def test_a_new_message_is_dated_when_sent_with_encoded_names(bed: Bed) -> None:
    draft = compose.save_draft(bed.ctx, ["Zoë Müller <zoe@example.net>"], [], [], "Hello",
                               "Grüße\n" + "long line " * 20, account="personal")
    bed.ctx.clock = lambda: datetime(2030, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    done = send.send_draft(bed.ctx, draft.message_id)
    assert done.from_ == "alex@example.org" and done.to == ["zoe@example.net"]
    (got,) = bed.smtp.received
    assert got.mail_from == "alex@example.org" and got.rcpt_tos == ("zoe@example.net",)
    head = header_block(got.data)
    assert "To: =?utf-8?q?Zo=C3=AB_M=C3=BCller?= <zoe@example.net>" in head
    assert "Subject: Hello" in head and "Content-Transfer-Encoding: quoted-printable" in head
    assert all(len(line) <= 78 for line in got.data.split(b"\r\n"))
    msg = got.message()
    assert email.utils.parsedate_to_datetime(msg["date"]) == datetime(
        2030, 5, 6, 7, 8, 9, tzinfo=timezone.utc)  # the time of sending, not of the draft
    assert str(msg["to"]) == "Zoë Müller <zoe@example.net>"
    assert body_text(msg) == "Grüße\n" + "long line " * 20 + "\n"


# ---------------------------------------------------------------------------------------------
# Refusals: a clear error, and nothing changed


def test_a_failing_sender_is_reported_verbatim_and_the_draft_stays(bed: Bed) -> None:
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Hi")
    before = bed.state()
    bed.smtp.reject = "550 5.1.1 mailbox unavailable"

    with pytest.raises(send.SendFailed) as failed:
        send.send_draft(bed.ctx, draft.message_id)

    assert "exit status" in str(failed.value) and "550 5.1.1 mailbox unavailable" in str(
        failed.value) and "draft is kept" in str(failed.value)
    assert bed.state() == before
    assert len(bed.files_with(bed.drafts, draft.message_id)) == 1
    assert bed.files_with(bed.sent, draft.message_id) == []
    assert bed.tags(draft.message_id) == {"draft"}

    bed.smtp.reject = None  # nothing went out: trying again is not refused as "may have gone"
    assert send.send_draft(bed.ctx, draft.message_id).sent is True
    assert len(bed.smtp.received) == 1


def test_a_send_that_timed_out_is_refused_until_the_caller_says_to_send_anyway(
        bed: Bed) -> None:
    """The command timed out while the server held its answer to the message: it may have
    gone out, so the draft is not sent again on a plain retry -- only with resend_unfinished
    (the user checked); once sent and filed, it is refused as sent whatever is asked."""
    configure(bed.env, bed.smtp, timeout_seconds=1)
    ctx = replace(bed.ctx, config=bed.env.config())
    draft = compose.reply_to_email(ctx, ORIGINAL, "Numbers below.")
    bed.smtp.release.clear()
    try:
        with pytest.raises(send.SendFailed, match="may or may not have sent"):
            send.send_draft(ctx, draft.message_id)
    finally:
        bed.smtp.release.set()
    with pytest.raises(send.SendRefused, match="never finished") as refused:
        send.send_draft(ctx, draft.message_id)
    assert "may have gone out" in str(refused.value)
    assert "resend_unfinished=true" in str(refused.value)
    assert len(bed.files_with(bed.drafts, draft.message_id)) == 1

    configure(bed.env, bed.smtp)
    ctx = replace(ctx, config=bed.env.config())
    done = send.send_draft(ctx, draft.message_id, resend_unfinished=True)
    assert done.sent is True and bed.files_with(bed.drafts, draft.message_id) == []
    assert bed.smtp.received[-1].message()["Message-ID"] == f"<{draft.message_id}>"
    with pytest.raises(send.SendRefused, match="was sent already"):
        send.send_draft(ctx, draft.message_id, resend_unfinished=True)


def test_a_send_another_process_began_meanwhile_is_not_sent_twice(
        bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two server processes sharing the sidecar both send a draft: each checks it unsent,
    then records its start.  The second start, made after the first one's check, finds a
    record its own check did not see and sends nothing; without that, both sent it."""
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Numbers below.")
    load_draft = compose.load_draft

    def other_process_starts(ctx: WriteContext, draft_id: str) -> compose.Outgoing:
        # Between this send's check and its record: the other process's record lands.
        with sidecar.opened(sidecar.sidecar_path(ctx.config.data_dir)) as conn:
            assert sidecar.send_started(conn, draft.message_id, "2026-01-01T00:00:00Z",
                                        seen=None)
        return load_draft(ctx, draft_id)

    monkeypatch.setattr(compose, "load_draft", other_process_starts)
    with pytest.raises(send.SendRefused, match="another send of .* began or ended"):
        send.send_draft(bed.ctx, draft.message_id)
    assert bed.smtp.received == []
    assert len(bed.files_with(bed.drafts, draft.message_id)) == 1
    monkeypatch.setattr(compose, "load_draft", load_draft)
    with pytest.raises(send.SendRefused, match="never finished"):
        send.send_draft(bed.ctx, draft.message_id)


def test_a_send_whose_connection_ended_after_the_message_went_in_is_not_taken_as_unsent(
        bed: Bed) -> None:
    """msmtp's own network timeout passes while the server holds its answer to the message
    (as a connection lost there does): msmtp exits non-zero -- 74, an I/O error -- with the
    whole message in, which a server may keep and deliver.  That exit is no "nothing was
    sent": a plain retry is refused as maybe sent, not sent a second time."""
    bed.smtp.rc.write_text(bed.smtp.rc.read_text().replace("defaults\n",
                                                           "defaults\ntimeout 1\n", 1))
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Numbers below.")
    bed.smtp.release.clear()
    try:
        with pytest.raises(send.SendFailed, match="exit status 74") as failed:
            send.send_draft(bed.ctx, draft.message_id)
    finally:
        bed.smtp.release.set()
    assert bed.smtp.arrived.is_set()  # the whole message was in: a real server may keep it

    with pytest.raises(send.SendRefused, match="never finished"):
        send.send_draft(bed.ctx, draft.message_id)
    assert bed.smtp.received == []
    assert "may or may not have sent" in str(failed.value)
    assert "resend_unfinished=true" in str(failed.value)


def test_a_send_command_ended_by_a_signal_is_not_taken_as_unsent(bed: Bed) -> None:
    """The send command is killed (the OOM killer, a user's kill) after it read the message:
    it may have been past the server's answer, so a plain retry is refused."""
    text = bed.env.fmail_config.read_text()
    bed.env.fmail_config.write_text(re.sub(
        r'(?m)^command = .*$', 'command = ["sh", "-c", "cat >/dev/null; kill -KILL $$"]', text))
    ctx = replace(bed.ctx, config=bed.env.config())
    draft = compose.reply_to_email(ctx, ORIGINAL, "Numbers below.")
    with pytest.raises(send.SendFailed, match="exit status -9") as failed:
        send.send_draft(ctx, draft.message_id)
    with pytest.raises(send.SendRefused, match="never finished"):
        send.send_draft(bed.ctx, draft.message_id)
    assert bed.smtp.received == []
    assert "may or may not have sent" in str(failed.value)


def test_a_message_sent_while_another_program_holds_the_lock_is_filed_once_it_is_free(
        bed: Bed) -> None:
    """The write's bound runs out while another program (a big notmuch new) holds the write
    lock: the message is out already, so its filing waits on for the lock -- not "sent,
    still in Drafts, not in Sent"."""
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Numbers below.")
    holder = LockHolder(bed.env.env)
    release = threading.Timer(2, holder.release)
    release.start()
    try:
        with bed.ctx.writer.deadline(time.monotonic() + 1):  # the server's bound per call
            done = send.send_draft(bed.ctx, draft.message_id)
    finally:
        release.cancel()
        holder.release()
    assert done.sent is True and len(bed.smtp.received) == 1
    assert bed.files_with(bed.drafts, draft.message_id) == []
    assert len(bed.files_with(bed.sent, draft.message_id)) == 1
    assert bed.tags(draft.message_id) == {"sent"} and "replied" in bed.tags(ORIGINAL)


def test_refusals_change_nothing(bed: Bed, tmp_path: Path) -> None:
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Hi")
    (tmp_path / "secret.txt").write_text("not for sending")
    (bed.attachments / "link.txt").symlink_to(tmp_path / "secret.txt")
    (bed.attachments / "big.bin").write_bytes(b"\xff" * (1024 * 1024))
    with sidecar.opened(bed.ctx.sidecar_file) as conn:
        contacts.set_blocked(conn, ["bad@example.com", "news@b\u00fccher.example"], True)
    before = bed.state()

    cases: list[tuple[str, object]] = [
        ("line breaks", lambda: compose.save_draft(
            bed.ctx, ["x@example.com"], subject="hi\r\nBcc: victim@example.com", body="")),
        ("line breaks", lambda: compose.save_draft(
            bed.ctx, ["x@example.com\nBcc: victim@example.com"], subject="hi", body="")),
        # What Python's email package also breaks a header line at (VT, FF, FS, NEL, LS):
        # once written and read back, each would start a header of the caller's.
        ("line breaks", lambda: compose.save_draft(
            bed.ctx, ['"Bob\x0bReply-To: attacker@evil.example\x0bX: " <bob@example.com>'],
            subject="hi", body="")),
        *[("line breaks", lambda c=c: compose.save_draft(
            bed.ctx, ["x@example.com"], subject=f"hi{c}Cc: victim@example.com", body=""))
          for c in ("\x0c", "\x1c", "\x85", "\u2028")],
        ("line breaks", lambda: compose.save_draft(
            bed.ctx, ["x@example.com"], subject="hi", body="", attachments=["a\x0bb.txt"])),
        ("NUL", lambda: compose.save_draft(bed.ctx, ["x@example.com"], subject="hi",
                                           body="a\x00b")),
        ("'not-an-address' is not an email address", lambda: compose.save_draft(
            bed.ctx, ["ok@example.com", "not-an-address"], subject="hi", body="")),
        ("blocklist: bad@example.com", lambda: compose.save_draft(
            bed.ctx, ["Bad <BAD@example.com>"], subject="hi", body="")),
        # Blocked with its domain in Unicode, written in ACE (xn--): the same address.
        ("blocklist: news@xn--bcher-kva.example", lambda: compose.save_draft(
            bed.ctx, ["news@xn--bcher-kva.example"], subject="hi", body="")),
        ("outside the attachments folder", lambda: compose.save_draft(
            bed.ctx, ["x@example.com"], subject="hi", body="", attachments=["../secret.txt"])),
        ("outside the attachments folder", lambda: compose.save_draft(
            bed.ctx, ["x@example.com"], subject="hi", body="", attachments=["link.txt"])),
        ("max_message_mb", lambda: compose.save_draft(
            bed.ctx, ["x@example.com"], subject="hi", body="", attachments=["big.bin"])),
        ("no draft with id", lambda: send.send_draft(bed.ctx, ORIGINAL)),
        ("not saved as a draft", lambda: send.send_new(bed.ctx, ["x@example.com"], "s", "b")),
    ]
    for expected, call in cases:
        with pytest.raises(FmailError) as refused:
            call()  # type: ignore[operator]
        assert expected in str(refused.value), (expected, str(refused.value))
        assert bed.state() == before, expected

    # A draft edited in the mail client is checked again before it is sent.
    (path,) = bed.files_with(bed.drafts, draft.message_id)
    path.write_bytes(path.read_bytes().replace(b"To: team@example.net",
                                               b"To: bad@example.com"))
    before = bed.state()
    with pytest.raises(ComposeError, match="blocklist"):
        send.send_draft(bed.ctx, draft.message_id)
    assert bed.state() == before
    # ... and a name holding a vertical tab, which would be written out as a line break.
    path.write_bytes(path.read_bytes().replace(
        b"To: bad@example.com", b'To: "Team\x0bReply-To: attacker@evil.example" <team@example.net>'))
    before = bed.state()
    with pytest.raises(ComposeError, match="line breaks"):
        send.send_draft(bed.ctx, draft.message_id)
    assert bed.state() == before


def draft_named(bed: Bed, error: BaseException) -> str:
    """The Message-ID of the draft a refused or failed direct send names by the id listings
    show (its uid, or its Message-ID before the mirror has it), "... (draft_id ID: ...)"."""
    shown = re.search(r"\(draft_id (\S+?):", str(error))[1]
    (named,) = [mid for mid in bed.ctx.reader.message_ids("tag:draft")
                if shown in (mid, sidecar.uid_for(mid))]
    return named


def test_sending_off_and_the_hourly_limit(bed: Bed) -> None:
    configure(bed.env, bed.smtp, max_per_hour=1, direct=True)
    bed.ctx.config = bed.env.config()
    first = send.send_new(bed.ctx, ["x@example.com"], "one", "1")
    assert first.sent
    draft = compose.save_draft(bed.ctx, ["y@example.com"], subject="two", body="2")
    before = bed.state()
    with pytest.raises(send.SendRefused, match="limit is 1"):
        send.send_draft(bed.ctx, draft.message_id)
    assert bed.state() == before and len(bed.smtp.received) == 1

    bed.env.fmail_config.write_text(bed.env.fmail_config.read_text().replace(
        "enabled = true", "enabled = false"))
    bed.ctx.config = bed.env.config()
    with pytest.raises(send.SendRefused, match="sending is off"):
        send.send_draft(bed.ctx, draft.message_id)
    assert bed.state() == before


def test_a_direct_send_refused_by_the_limit_or_sending_off_keeps_the_draft_it_names(
        bed: Bed) -> None:
    """The refusal says the draft is kept: it is, under the id the refusal names."""
    configure(bed.env, bed.smtp, max_per_hour=1, direct=True)
    bed.ctx.config = bed.env.config()
    send.send_new(bed.ctx, ["x@example.com"], "one", "1")
    with pytest.raises(send.SendRefused, match=r"limit is 1.*draft is kept \(draft_id ") as refused:
        send.send_new(bed.ctx, ["y@example.com"], "two", "The words to keep.")
    draft_id = draft_named(bed, refused.value)
    assert bed.draft_body(draft_id) == "The words to keep.\n"
    # The refusal says how to try again without a second copy: send that draft.
    assert "to try again, send_email that draft_id" in str(refused.value)

    bed.env.fmail_config.write_text(bed.env.fmail_config.read_text().replace(
        "enabled = true", "enabled = false"))
    bed.ctx.config = bed.env.config()
    with pytest.raises(send.SendRefused,
                       match=r"sending is off.*draft is saved.*\(draft_id ") as refused:
        send.save_and_send(bed.ctx, lambda c: compose.reply_to_email(c, ORIGINAL, "Later."))
    draft_id = draft_named(bed, refused.value)
    assert bed.draft_body(draft_id).startswith("Later.\n")
    assert len(bed.smtp.received) == 1


def test_a_command_that_reads_recipients_from_the_mail_is_refused(bed: Bed) -> None:
    text = bed.env.fmail_config.read_text().replace(
        '"-C", ', '"-t", "-C", ')
    bed.env.fmail_config.write_text(text)
    bed.ctx.config = bed.env.config()
    draft = compose.save_draft(bed.ctx, ["x@example.com"], subject="s", body="b")
    with pytest.raises(send.SendRefused, match="drop -t"):
        send.send_draft(bed.ctx, draft.message_id)
    assert bed.smtp.received == []


def test_direct_sending_saves_first_so_a_failure_leaves_the_draft(bed: Bed) -> None:
    configure(bed.env, bed.smtp, direct=True)
    bed.ctx.config = bed.env.config()
    bed.smtp.reject = "550 no such user"
    with pytest.raises(send.SendFailed, match="550 no such user") as failed:
        send.save_and_send(bed.ctx, lambda c: compose.reply_to_email(c, ORIGINAL, "x"))
    draft_id = draft_named(bed, failed.value)
    assert len(bed.files_with(bed.drafts, draft_id)) == 1 and bed.smtp.received == []

    bed.smtp.reject = None
    done = send.save_and_send(bed.ctx, lambda c: compose.reply_to_email(c, ORIGINAL, "y"))
    assert done.sent and bed.smtp.received[0].rcpt_tos == ("team@example.net",)
    assert "replied" in bed.tags(ORIGINAL)


HOSTILE_MAIL = (
    "From: Mallory <mallory@example.com>\r\n"
    "To: alex@example.org\r\n"
    "Subject: =?utf-8?q?Invoice=0D=0ABcc:_victim@example.com?=\r\n"
    "Message-ID: <hostile-1@example.com>\r\n"
    "References: <ok@example.com> <bad id@example.com>\r\n"
    "Date: Wed, 03 Jan 2024 10:00:00 +0000\r\n"
    "\r\n"
    "Pay now.\r\n"
).encode()


def test_a_reply_to_hostile_mail_carries_nothing_it_injects(bed: Bed) -> None:
    bed.receive(HOSTILE_MAIL)
    draft = compose.reply_to_email(bed.ctx, "hostile-1@example.com", "No.")
    assert draft.subject == "Re: Invoice Bcc: victim@example.com"  # one line, only text
    head = header_block(bed.files_with(bed.drafts, draft.message_id)[0].read_bytes())
    assert not re.search(r"(?mi)^bcc:", head)
    assert "References: <ok@example.com> <hostile-1@example.com>" in head  # "bad id" dropped


def test_a_reply_to_the_users_own_mail_goes_to_its_recipients(bed: Bed) -> None:
    bed.receive(b"From: Alex Morgan <alex@example.org>\r\nTo: Bob <bob@example.com>\r\n"
                b"Cc: carol@example.com\r\nSubject: Fwd: plans\r\n"
                b"Message-ID: <own-1@example.org>\r\n\r\nSee below.\r\n")
    one = compose.reply_to_email(bed.ctx, "own-1@example.org", "Any news?")
    assert one.to == ["bob@example.com"] and one.cc == [] and one.subject == "Re: Fwd: plans"
    everyone = compose.reply_to_email(bed.ctx, "own-1@example.org", "Any news?",
                                      reply_all=True)
    assert everyone.to == ["bob@example.com"] and everyone.cc == ["carol@example.com"]
    forward = compose.forward_email(bed.ctx, "own-1@example.org", ["dan@example.com"])
    assert forward.subject == "Fwd: plans"  # no Fwd: Fwd:


def test_a_reply_whose_to_holds_only_the_user_goes_to_the_others(bed: Bed) -> None:
    """To (or Reply-To) naming only the user, the others in Cc: Cc becomes To, and a
    Reply-To of the user's own gives way to From -- never "no recipient left"."""
    bed.receive(b"From: Alex Morgan <alex@example.org>\r\nTo: alex@example.org\r\n"
                b"Cc: bob@example.com, carol@example.com\r\nSubject: note to self\r\n"
                b"Message-ID: <own-2@example.org>\r\n\r\nhi\r\n")
    bed.receive(b"From: R <r@example.net>\r\nTo: bob@example.com\r\nCc: carol@example.com\r\n"
                b"Reply-To: alex@example.org\r\nSubject: form\r\n"
                b"Message-ID: <rtm-1@example.net>\r\n\r\nhi\r\n")
    for reply_all in (False, True):
        own = compose.reply_to_email(bed.ctx, "own-2@example.org", "x", reply_all=reply_all)
        assert (own.to, own.cc) == (["bob@example.com", "carol@example.com"], [])
    one = compose.reply_to_email(bed.ctx, "rtm-1@example.net", "x")
    assert (one.to, one.cc) == (["r@example.net"], [])
    everyone = compose.reply_to_email(bed.ctx, "rtm-1@example.net", "x", reply_all=True)
    assert (everyone.to, everyone.cc) == (["r@example.net"],
                                          ["bob@example.com", "carol@example.com"])


def test_a_reply_to_mail_without_message_id_names_no_made_up_id(bed: Bed) -> None:
    """notmuch makes up an id (notmuch-sha1-...) for mail without a Message-ID; nobody else
    knows it, so it stays out of the reply's headers."""
    bed.receive(b"From: Old Mailer <old@example.com>\r\nTo: alex@example.org\r\n"
                b"Subject: no id\r\n\r\nhello\r\n")
    (made_up,) = bed.ctx.reader.message_ids("subject:\"no id\"")
    assert made_up.startswith("notmuch-sha1-")
    draft = compose.reply_to_email(bed.ctx, made_up, "Hi")
    head = header_block(bed.files_with(bed.drafts, draft.message_id)[0].read_bytes())
    assert "notmuch-sha1" not in head
    assert not re.search(r"(?mi)^(in-reply-to|references):", head)


@pytest.mark.parametrize("subject", [
    "Приглашение на день рождения бабушки в субботу, 14 марта, в Москве",
    "Grüße aus Köln — 日本語のテキスト 🎉 Grüße aus Köln — 日本語のテキスト 🎉 Grüße aus Köln",
])
def test_a_long_non_ascii_subject_reads_back_whole_in_notmuch_and_on_the_wire(
        bed: Bed, subject: str) -> None:
    """notmuch (GMime) stopped decoding the email package's base64 words at their "="
    padding, and the package's folding could drop a space between two words."""
    draft = compose.save_draft(bed.ctx, ["bob@example.com"], subject=subject, body="b")
    found = bed.ctx.reader.find(draft.message_id)
    assert found is not None and found.subject == subject
    send.send_draft(bed.ctx, draft.message_id)
    (got,) = bed.smtp.received
    assert got.message()["subject"] == subject
    assert max(len(line) for line in header_block(got.data).split("\r\n")) <= 78
    sent = bed.ctx.reader.find(draft.message_id)
    assert sent is not None and sent.subject == subject


@pytest.mark.parametrize(("name", "word"), [
    ("Приглашение Иванович Петров-Водкин Александр Сергеевич Пушкин", "Пушкин"),
    ("Zoë Müller-Lüdenscheidt, Garmisch-Partenkirchen 日本語のなまえ 🎉", "Lüdenscheidt"),
])
def test_a_long_non_ascii_name_reads_back_whole_in_notmuch_and_on_the_wire(
        bed: Bed, name: str, word: str) -> None:
    """A recipient's name went out as the email package's base64 words, padded with "="
    before the last one: notmuch (GMime) read "Приглашение Иванович Пе" of the Sent copy."""
    draft = compose.save_draft(bed.ctx, [f'"{name}" <zoe@example.net>', "bob@example.com"],
                               subject="s", body="b")
    send.send_draft(bed.ctx, draft.message_id)
    (got,) = bed.smtp.received
    assert rfc2047_phrase(got.data, "To") == f"{name} <zoe@example.net>, bob@example.com"
    shown = json.loads(bed.env.notmuch("show", "--format=json", "--body=false",
                                       f"id:{draft.message_id}").stdout)
    assert email.utils.getaddresses([shown[0][0][0]["headers"]["To"]]) == [
        (name, "zoe@example.net"), ("", "bob@example.com")]
    assert max(len(line) for line in header_block(got.data).split("\r\n")) <= 78
    assert bed.ctx.reader.message_ids(f"to:{word}") == [draft.message_id]


def test_recipients_differing_in_case_only_get_one_copy(bed: Bed) -> None:
    draft = compose.save_draft(bed.ctx, ["bob@example.com"], cc=["Bob <BOB@example.com>"],
                               subject="once", body="b")
    send.send_draft(bed.ctx, draft.message_id)
    (got,) = bed.smtp.received
    assert got.rcpt_tos == ("bob@example.com",)


def test_a_reply_to_mail_bcc_d_to_an_alias_is_written_from_that_address(bed: Bed) -> None:
    bed.receive(b"Delivered-To: alex.morgan@example.org\r\nFrom: Erin <erin@example.com>\r\n"
                b"To: undisclosed-recipients:;\r\nSubject: hi\r\n"
                b"Message-ID: <bcc-1@example.com>\r\n\r\nHi.\r\n")
    draft = compose.reply_to_email(bed.ctx, "bcc-1@example.com", "Hello")
    assert draft.from_ == "alex.morgan@example.org" and draft.to == ["erin@example.com"]



def test_a_reply_to_mail_sent_to_a_sub_address_is_written_from_its_address(bed: Bed) -> None:
    """Mail to alex.morgan+lists@: the reply comes from alex.morgan@, not the account's first
    address -- and from the sub-address itself only when fmail.toml lists it (a server may
    refuse mail from an address it does not know)."""
    bed.receive(b"From: Erin <erin@example.com>\r\nTo: Alex <Alex.Morgan+Lists@example.org>"
                b"\r\nSubject: hi\r\nMessage-ID: <plus-2@example.com>\r\n\r\nHi.\r\n")
    draft = compose.reply_to_email(bed.ctx, "plus-2@example.com", "Hello")
    assert draft.from_ == "alex.morgan@example.org" and draft.to == ["erin@example.com"]
    add_my_address(bed, "alex.morgan+lists@example.org", "personal")
    draft = compose.reply_to_email(bed.ctx, "plus-2@example.com", "Hello")
    assert draft.from_ == "alex.morgan+lists@example.org"

# The user's address with a non-ASCII domain: fmail.toml and each mail may write the domain in
# Unicode or in ACE (xn--), and either way it is the user's.
IDN_ME, ACE_ME = "alex@b\u00fccher.example", "alex@xn--bcher-kva.example"
OTHER_FORM = {IDN_ME: ACE_ME, ACE_ME: IDN_ME}


def add_my_address(bed: Bed, address: str, account: str) -> None:
    """``address`` one more of the user's, last of ``account``'s addresses in fmail.toml."""
    last = {"personal": PERSONAL["personal2"], "work": PERSONAL["work"]}[account]
    text = bed.env.fmail_config.read_text()
    assert f'"{last}"]' in text
    bed.env.fmail_config.write_text(text.replace(f'"{last}"]', f'"{last}", "{address}"]', 1))
    bed.ctx = replace(bed.ctx, config=bed.env.config())


@pytest.mark.parametrize("configured", [IDN_ME, ACE_ME])
def test_a_reply_leaves_out_my_address_whichever_form_its_domain_is_written_in(
        bed: Bed, configured: str) -> None:
    """Mail writing the user's domain in the other form than fmail.toml: reply-all sends the
    user no copy, and a reply to the user's own mail goes to its recipients."""
    add_my_address(bed, configured, "personal")
    written = OTHER_FORM[configured]
    bed.receive("From: Carol <carol@example.com>\r\nTo: alex@example.org\r\n"
                f"Cc: Alex <{written}>, bob@example.com\r\nSubject: books\r\n"
                "Message-ID: <idn-in-1@example.com>\r\n\r\nHi.\r\n".encode())
    bed.receive(f"From: Alex <{written}>\r\nTo: Bob <bob@example.com>\r\n"
                "Cc: carol@example.com, alex@example.org\r\nSubject: plans\r\n"
                "Message-ID: <idn-own-1@example.com>\r\n\r\nSee below.\r\n".encode())

    everyone = compose.reply_to_email(bed.ctx, "idn-in-1@example.com", "x", reply_all=True)
    assert (everyone.to, everyone.cc) == (["carol@example.com"], ["bob@example.com"])
    one = compose.reply_to_email(bed.ctx, "idn-own-1@example.com", "Any news?")
    assert (one.to, one.cc) == (["bob@example.com"], [])
    everyone = compose.reply_to_email(bed.ctx, "idn-own-1@example.com", "Any news?",
                                      reply_all=True)
    assert (everyone.to, everyone.cc) == (["bob@example.com"], ["carol@example.com"])


def test_a_reply_is_from_my_address_as_configured_whichever_form_the_mail_wrote(
        bed: Bed) -> None:
    """The original sent to the user's address with its domain in Unicode, fmail.toml
    writing it in ACE: the reply is From that address, as configured."""
    add_my_address(bed, ACE_ME, "personal")
    bed.receive(f"From: Carol <carol@example.com>\r\nTo: Alex <{IDN_ME}>\r\n"
                "Subject: books\r\nMessage-ID: <idn-in-2@example.com>\r\n\r\nHi.\r\n"
                .encode())
    draft = compose.reply_to_email(bed.ctx, "idn-in-2@example.com", "x")
    assert (draft.from_, draft.to) == (ACE_ME, ["carol@example.com"])
    head = header_block(bed.files_with(bed.drafts, draft.message_id)[0].read_bytes())
    assert f"From: Alex Morgan <{ACE_ME}>" in head


def test_a_draft_from_my_address_in_ace_is_sent_through_its_account(bed: Bed) -> None:
    """fmail.toml lists an address of the work account with its domain in Unicode; a draft
    saved in personal/Drafts whose From mutt wrote in ACE is that account's: sent From the
    address as the draft writes it, and filed in work/Sent."""
    add_my_address(bed, IDN_ME, "work")
    with bed.smtp.rc.open("a") as rc:  # msmtp picks the account by the envelope sender
        rc.write(f"account idn\nfrom {ACE_ME}\n")
    bed.put_draft("1800000700.idn.host:2,DS", (
        f"From: Alex Morgan <{ACE_ME}>\r\nTo: client@example.com\r\n"
        "Subject: idn account\r\nMessage-ID: <idn-draft-1@example.com>\r\n"
        "Date: Sat, 05 Dec 2026 10:00:00 +0000\r\n\r\nHello\r\n").encode())

    send.send_draft(bed.ctx, "idn-draft-1@example.com")

    (got,) = bed.smtp.received
    assert got.mail_from == ACE_ME and got.message()["from"].addresses[0].domain == \
        "xn--bcher-kva.example"
    work_sent = bed.env.mail_root / "work" / "Sent" / "cur"
    assert len(bed.files_with(work_sent, "idn-draft-1@example.com")) == 1
    assert bed.files_with(bed.sent, "idn-draft-1@example.com") == []


def test_a_domain_in_unicode_goes_out_in_ace(bed: Bed) -> None:
    """fmail.toml writes the user's address with its domain in Unicode, and the model a
    recipient's: headers and the SMTP envelope (no SMTPUTF8) carry ASCII only, so the reply
    to mail sent there could not be written (\"cannot be encoded\") and the recipient was
    refused as not an address.  Both go out with the domain in ACE, the same address."""
    add_my_address(bed, IDN_ME, "personal")
    bed.receive(f"From: Carol <carol@example.com>\r\nTo: Alex <{ACE_ME}>\r\n"
                "Subject: books\r\nMessage-ID: <idn-in-3@example.com>\r\n\r\nHi.\r\n"
                .encode())
    bed.receive("From: Bob <bob@example.com>\r\nTo: alex@example.org\r\n"
                "Cc: info@b\u00fccher.de\r\nSubject: q\r\nMessage-ID: <idn-cc@example.com>"
                "\r\n\r\nhi\r\n".encode())
    everyone = compose.reply_to_email(bed.ctx, "idn-cc@example.com", "x", reply_all=True)
    assert everyone.cc == ["info@xn--bcher-kva.de"]
    reply = compose.reply_to_email(bed.ctx, "idn-in-3@example.com", "x")
    assert reply.from_ == ACE_ME
    head = header_block(bed.files_with(bed.drafts, reply.message_id)[0].read_bytes())
    assert f"From: Alex Morgan <{ACE_ME}>" in head

    new = compose.save_draft(bed.ctx, to=["Bob <bob@b\u00fccher.example>"], subject="s",
                             body="b")
    assert new.to == ["bob@xn--bcher-kva.example"]
    send.send_draft(bed.ctx, new.message_id)
    (got,) = bed.smtp.received
    assert got.rcpt_tos == ("bob@xn--bcher-kva.example",)
    assert got.message()["to"].addresses[0].domain == "xn--bcher-kva.example"


@pytest.mark.parametrize(("subject", "reply", "forward"), [
    ("Hello", "Re: Hello", "Fwd: Hello"),
    ("RE: re[2]: AW: Hello", "Re: Hello", "Fwd: RE: re[2]: AW: Hello"),
    ("Fw: FWD: Hello", "Re: Fw: FWD: Hello", "Fwd: Hello"),
    ("", "Re: ", "Fwd: "),
])
def test_subject_prefixes_do_not_stack(subject: str, reply: str, forward: str) -> None:
    assert compose.reply_subject(subject) == reply
    assert compose.forward_subject(subject) == forward


@pytest.mark.parametrize(("table", "error"), [
    ("enabled = 1", "enabled must be true or false"),
    ("max_per_hour = -1", "max_per_hour must be a whole number"),
    ("max_message_mb = 0", "max_message_mb must be a number > 0"),
    ("attachments = '~/x'", "unknown key attachments"),
])
def test_send_settings_are_checked(tmp_path: Path, table: str, error: str) -> None:
    from fmail_nm.config import ConfigError, load_settings

    path = tmp_path / "fmail.toml"
    path.write_text(f"[send]\n{table}\n")
    with pytest.raises(ConfigError, match=error):
        load_settings(path)


def test_send_settings_default_to_drafts_only(tmp_path: Path) -> None:
    from fmail_nm.config import load_settings

    path = tmp_path / "fmail.toml"
    path.write_text("")
    send_settings = load_settings(path).send
    assert send_settings.enabled is False and send_settings.direct is False
    assert send_settings.attachments_dir is None and send_settings.command == ("msmtp",)


# ---------------------------------------------------------------------------------------------
# Drafts other clients wrote, and replies to unusual mail


def rfc2047_phrase(data: bytes, name: str) -> str:
    """A header as an RFC 2047 reader (mutt, GMime) decodes it: whitespace between two
    encoded words is dropped, whitespace next to plain text is kept."""
    raw = re.search(rb"(?msi)^" + name.encode() + rb":(.*?)\r\n(?![ \t])", data)
    assert raw is not None
    return str(email.header.make_header(email.header.decode_header(
        raw[1].decode().replace("\r\n", "")))).strip()


# A draft another client saved without a Message-ID (notmuch names it by a hash of the file).
NO_ID_DRAFT = (b"From: Alex Morgan <alex@example.org>\r\nTo: bob@example.com\r\n"
               b"Subject: no id\r\n\r\nhi\r\n")
MUTT_POSTPONED = (
    b"From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: secret plans\n"
    b"Message-ID: <mutt-1@example.org>\nDate: Sat, 05 Dec 2026 10:00:00 +0000\n"
    b"X-Mutt-PGP: %s\nX-Mutt-Fcc: =Sent/2026\nMIME-Version: 1.0\n"
    b"Content-Type: text/plain; charset=us-ascii\n\nthe launch code is 1234\n")


@pytest.mark.parametrize("crypt", [b"E", b"S", b"ES", b"MS<0x12345678>", b"SE<0xABCDEF12>"])
def test_a_draft_mutt_was_to_encrypt_or_sign_is_not_sent_plain(bed: Bed, crypt: bytes) -> None:
    """mutt postpones a message with what it is to do on sending (X-Mutt-PGP: E encrypts,
    S signs); fmail-nm can do neither, so it refuses rather than send it plain."""
    bed.put_draft("1800000800.mutt.host:2,DS", MUTT_POSTPONED % crypt)
    bed.refused_send("mutt-1@example.org", "send it from mutt")


def test_a_mutt_draft_goes_out_without_the_headers_mutt_keeps_for_itself(bed: Bed) -> None:
    """What a client keeps in a postponed message for itself (mutt's X-Mutt-*, an Fcc,
    Thunderbird's X-Mozilla-Draft-Info) goes neither to the recipients nor into Sent; a
    draft mutt was only to encrypt opportunistically (O, no E) is sent."""
    bed.put_draft("1800000800.mutt.host:2,DS", (MUTT_POSTPONED % b"O").replace(
        b"MIME-Version", b"Fcc: =Sent\nX-Mozilla-Draft-Info: internal/draft; vcard=0\n"
                         b"MIME-Version"))
    send.send_draft(bed.ctx, "mutt-1@example.org")
    (got,) = bed.smtp.received
    (copy,) = bed.files_with(bed.sent, "mutt-1@example.org")
    for data in (got.data, copy.read_bytes()):
        assert "launch code" in body_text(parse(data))
        assert not re.search(r"(?mi)^(x-mutt-|fcc:|x-mozilla-)", header_block(data))


PHONE_DRAFTS = {
    "apple-mail": b"X-Uniform-Type-Identifier: com.apple.mail-draft\r\n"
                  b"X-Apple-Base-Url: x-msg://6/\r\nX-Apple-Mail-Remote-Attachments: YES\r\n"
                  b"X-Apple-Auto-Saved: 1\r\nX-Apple-Mail-Plain-Text-Draft: yes\r\n",
    "k-9": b"X-K9mail-Identity: !l=0&o=0&qs=PREFIX&f=TEXT&s=--%20%0D%0AAlex%20M&m=\r\n"
           b" %23%3AOGM4OWE1MTEtMTdkZS00%3AANSWERED&p=0&q=SHOW\r\n",
}


@pytest.mark.parametrize("client", PHONE_DRAFTS)
def test_a_phone_draft_goes_out_without_the_headers_the_phone_keeps_for_itself(
        bed: Bed, client: str) -> None:
    """A draft written on the phone went out with what the phone keeps for its own drafts:
    Apple Mail's draft type and X-Apple-* state, K-9's identity (the user's signature and
    the message replied to, encoded)."""
    bed.put_draft("1800000805.phone.host:2,DS", (
        b"From: Alex Morgan <alex@example.org>\r\nTo: bob@example.com\r\nSubject: plans\r\n"
        b"Message-ID: <phone-2@example.org>\r\n" + PHONE_DRAFTS[client] +
        b"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\nsee you\r\n"))
    send.send_draft(bed.ctx, "phone-2@example.org")
    (got,) = bed.smtp.received
    (copy,) = bed.files_with(bed.sent, "phone-2@example.org")
    for data in (got.data, copy.read_bytes()):
        assert body_text(parse(data)) == "see you\n"
        assert not re.search(r"(?mi)^(x-apple-|x-uniform-|x-k9mail-)", header_block(data))


# A draft as mutt or aerc postpone it where their config allows raw UTF-8 in headers.
RAW_UTF8_DRAFT = (
    "From: Alex Mörgan <alex@example.org>\nTo: Zoë Müller <zoe@bücher.example>,\n"
    " \"Smith, Jörg\" <js@example.com>\nCc: 山田 太郎 <yamada@example.jp>\n"
    "Subject: Re: Grüße aus Köln – 会議 =?utf-8?q?=C3=A9t=C3=A9?=\n"
    "Organization: Bücher & Söhne\nMessage-ID: <raw-8bit@example.org>\nMIME-Version: 1.0\n"
    "Content-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: 8bit\n\n"
    "Hallo Zoë\n").encode()


def test_a_draft_with_raw_utf8_headers_goes_out_as_encoded_words(bed: Bed) -> None:
    """Raw UTF-8 in a draft's Subject, names and Organization went out as it was, without
    SMTPUTF8 (msmtp has none): strict servers refuse it, others garble it.  It goes out as
    RFC 2047 words that read back as the same text, a domain in ACE, and the Sent copy is
    the bytes sent."""
    bed.put_draft("1800000806.mutt.host:2,DS", RAW_UTF8_DRAFT)
    send.send_draft(bed.ctx, "raw-8bit@example.org")
    (got,) = bed.smtp.received
    head = got.data.split(b"\r\n\r\n", 1)[0]
    assert head.isascii(), head
    assert got.rcpt_tos == ("zoe@xn--bcher-kva.example", "js@example.com", "yamada@example.jp")
    sent = got.message()
    assert sent["subject"] == "Re: Grüße aus Köln – 会議 été"
    assert sent["organization"] == "Bücher & Söhne"
    assert [(a.display_name, a.addr_spec) for field in ("from", "to", "cc")
            for a in sent[field].addresses] == [
        ("Alex Mörgan", "alex@example.org"), ("Zoë Müller", "zoe@xn--bcher-kva.example"),
        ("Smith, Jörg", "js@example.com"), ("山田 太郎", "yamada@example.jp")]
    assert body_text(sent) == "Hallo Zoë\n"
    (copy,) = bed.files_with(bed.sent, "raw-8bit@example.org")
    assert copy.read_bytes() == got.data


def test_raw_8bit_draft_headers_in_the_drafts_charset_or_else_refused(bed: Bed) -> None:
    """Header bytes that are not UTF-8 are read in the charset the draft's text declares
    (mutt writes both in its send_charset); where that does not read them either they are
    refused, saying so: a guess could send other letters than the user wrote.  A Reply-To
    whose local part only SMTPUTF8 carries is refused as a recipient's is."""
    latin1 = (b"From: Alex Morgan <alex@example.org>\nTo: J\xf6rg <j@example.com>\n"
              b"Subject: Gr\xfc\xdfe\nMessage-ID: <latin1@example.org>\nMIME-Version: 1.0\n"
              b"Content-Type: text/plain; charset=iso-8859-1\n"
              b"Content-Transfer-Encoding: 8bit\n\nGr\xfc\xdfe\n")
    bed.put_draft("1800000807.mutt.host:2,DS", latin1)
    bed.put_draft("1800000808.mutt.host:2,DS", latin1.replace(b"latin1@", b"broken@").replace(
        b"iso-8859-1", b"utf-8"))
    bed.refused_send("broken@example.org", "its To header has bytes that are not utf-8; "
                    "nothing was sent")
    # Not a recipient, but an address all the same: its local part has no ASCII form.
    reply_to = "Reply-To: 用户@例子.广告\nX-O".encode()
    bed.put_draft("1800000809.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"eai-reply@").replace(b"Organization", reply_to))
    bed.refused_send("eai-reply@example.org",
                     "reply-to: '用户@例子.广告' has non-ASCII letters before the @, which only "
                     "SMTPUTF8")
    send.send_draft(bed.ctx, "latin1@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    sent = got.message()
    assert sent["subject"] == "Grüße" and sent["to"].addresses[0].display_name == "Jörg"


def test_a_raw_8bit_date_or_receipt_address_in_a_draft_does_not_stop_its_send(
        bed: Bed) -> None:
    """A Date written in the locale's month names ("Mär") was refused as 8-bit text an id or a
    date may not have, though sending replaces the Date; a read-receipt request to a name
    with non-ASCII letters (mutt's my_hdr Disposition-Notification-To) was refused as such
    too: it is an address header, its name goes out as encoded words."""
    bed.put_draft("1800000810.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"date-8bit@").replace(
        b"Organization: ", "Date: Di, 3 Mär 2026 10:00:00 +0100\n"
        "Disposition-Notification-To: Alex Mörgan <alex@example.org>\nOrganization: ".encode()))
    send.send_draft(bed.ctx, "date-8bit@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    sent = got.message()
    assert "Mär" not in sent["date"] and sent["date"].datetime.year == bed.ctx.clock().year
    assert sent["disposition-notification-to"] == "Alex Mörgan <alex@example.org>"


def test_a_group_in_a_raw_8bit_address_header_goes_out_as_the_group(bed: Bed) -> None:
    """A group with a non-ASCII name ("Team Ünïcode: a, b;" as mutt writes a group alias)
    went out as its members only, its name dropped: it goes out as the group, its name as
    encoded words, its members as addresses."""
    bed.put_draft("1800000811.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"group-8bit@").replace(
        b"Cc: ", "Cc: Team Ünïcode: dev@example.com, Jörg <js2@example.com>;, ".encode()))
    send.send_draft(bed.ctx, "group-8bit@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert set(got.rcpt_tos) >= {"dev@example.com", "js2@example.com", "yamada@example.jp"}
    groups = got.message()["cc"].groups
    assert [(g.display_name, [(a.display_name, a.addr_spec) for a in g.addresses])
            for g in groups] == [
        ("Team Ünïcode", [("", "dev@example.com"), ("Jörg", "js2@example.com")]),
        (None, [("山田 太郎", "yamada@example.jp")])]


def test_raw_8bit_attachment_names_in_a_draft_go_out_as_rfc2231_parameters(bed: Bed) -> None:
    """An attachment's filename="Résumé.pdf" (and Content-Type name=) went out raw, in a body
    the server may not take 8-bit: it goes out as an RFC 2231 parameter, the part's content
    the same bytes."""
    pdf = b"%PDF-1.4 \x00\xff\xfe binary"
    bed.put_draft("1800000812.mutt.host:2,DS", (
        "From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: cv\n"
        "Message-ID: <cv-8bit@example.org>\nMIME-Version: 1.0\n"
        'Content-Type: multipart/mixed; boundary="b"\n\n--b\n'
        "Content-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: 8bit\n\nAnbei.\n"
        '--b\nContent-Type: application/pdf; name="Résumé.pdf"\n'
        'Content-Disposition: attachment; filename="Résumé.pdf"\n'
        f"Content-Transfer-Encoding: base64\n\n{base64.b64encode(pdf).decode()}\n--b--\n"
    ).encode())
    send.send_draft(bed.ctx, "cv-8bit@example.org")
    (got,) = bed.smtp.received
    head = got.data.split(b"--b\r\n")[2].split(b"\r\n\r\n", 1)[0]
    assert head.isascii(), head
    assert b"filename*=utf-8''R%C3%A9sum%C3%A9.pdf" in head
    (attachment,) = got.message().iter_attachments()
    assert attachment.get_filename() == "Résumé.pdf"
    assert attachment.get_param("name") == "Résumé.pdf"
    assert attachment.get_content() == pdf
    assert body_text(got.message()).rstrip() == "Anbei."


def test_raw_8bit_ids_in_references_are_left_out_and_in_in_reply_to_refused(bed: Bed) -> None:
    """A References with one internationalized id (RFC 6532) refused the whole send: that
    id, which no header without SMTPUTF8 can carry, is left out, the rest of the chain goes.
    An 8-bit In-Reply-To -- the mail replied to -- is refused, saying how to send anyway."""
    refs = "References: <root@example.net> <mïd@exämple.net>\n <last@example.net>\nOrganiz"
    bed.put_draft("1800000813.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"refs-8bit@").replace(b"Organiz", refs.encode()))
    bed.put_draft("1800000814.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"irt-8bit@").replace(
        b"Organiz", "In-Reply-To: <mïd@exämple.net>\nOrganiz".encode()))
    bed.refused_send("irt-8bit@example.org", "In-Reply-To .*non-ASCII.*nothing was sent.*"
                     "remove its In-Reply-To")
    send.send_draft(bed.ctx, "refs-8bit@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert got.message()["references"].split() == ["<root@example.net>", "<last@example.net>"]


def test_a_raw_8bit_x_header_with_an_address_keeps_the_address_readable(bed: Bed) -> None:
    """X-Original-From: Jörg <j@example.com> went out as one encoded word, address and all,
    which no reader takes for an address: an X- header that reads as addresses goes out as
    them; any other as text."""
    bed.put_draft("1800000815.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"x-8bit@").replace(
        b"Organiz", "X-Original-From: Jörg Müller <jm@example.com>\n"
                    "X-Note: Grüße aus Köln\nOrganiz".encode()))
    send.send_draft(bed.ctx, "x-8bit@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert re.search(rb"(?m)^X-Original-From: =\?utf-8\?q\?[^<]+\?= <jm@example.com>\r$",
                     got.data)
    assert rfc2047_phrase(got.data, "X-Original-From") == "Jörg Müller <jm@example.com>"
    assert rfc2047_phrase(got.data, "X-Note") == "Grüße aus Köln"


def test_a_raw_8bit_x_header_with_an_address_fmail_nm_would_not_send_to_goes_as_text(
        bed: Bed) -> None:
    """An X- header naming an address no recipient header may hold (root@localhost) is no
    recipient: it goes out as text, as any other X- header -- it stopped the send."""
    bed.put_draft("1800000822.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"x-local@").replace(
        b"Organiz", "X-Original-To: Jörg <root@localhost>\nOrganiz".encode()))
    send.send_draft(bed.ctx, "x-local@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert rfc2047_phrase(got.data, "X-Original-To") == "Jörg <root@localhost>"


def test_raw_8bit_keywords_go_out_as_one_phrase_each(bed: Bed) -> None:
    """Keywords: Grüße, Köln went out as one encoded word with the comma inside, one keyword
    to every reader: each phrase is encoded on its own, the commas between them."""
    bed.put_draft("1800000816.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"kw-8bit@").replace(
        b"Organiz", "Keywords: Grüße, Köln,plain words\nOrganiz".encode()))
    send.send_draft(bed.ctx, "kw-8bit@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    raw = re.search(rb"(?msi)^Keywords:(.*?)\r\n(?![ \t])", got.data)
    assert raw is not None
    assert [str(email.header.make_header(email.header.decode_header(phrase))).strip()
            for phrase in raw[1].decode().replace("\r\n", "").split(",")] == [
        "Grüße", "Köln", "plain words"]


def test_a_raw_8bit_to_header_shows_every_address_the_envelope_sends_to(bed: Bed) -> None:
    """An 8-bit To the email package's header parser reads as fewer addresses than the
    envelope's parser ("Zoë" <a> <b>: a second address without a comma) went out showing
    only the first while the mail went to both -- a recipient nobody sees.  The header shows
    every address the mail is sent to."""
    bed.put_draft("1800000817.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"hidden-8bit@").replace(
        b"To: ", 'To: "Zoë" <bob@example.com> <eve@example.net>, '.encode()).replace(
        b"Cc: ", "Cc: Jörg <js3@example.com>x@example.net, ".encode()))
    send.send_draft(bed.ctx, "hidden-8bit@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    shown = {addr for _, addr in email.utils.getaddresses(
        got.message().get_all("to", []) + got.message().get_all("cc", []))}
    assert {"eve@example.net", "x@example.net"} <= set(got.rcpt_tos)
    assert shown == set(got.rcpt_tos)


def test_a_raw_8bit_to_header_in_the_drafts_charset_is_where_the_mail_goes(bed: Bed) -> None:
    """The header went out read in the draft's charset, the envelope from the raw bytes read
    otherwise: iso-8859-2's \xe8 (c-caron) is windows-1252's e-grave, so the header showed
    kocka.cz with a caron while the mail went to another domain; a Shift_JIS letter whose
    second byte is a backslash escaped a quote for the envelope only, so the mail did not go
    to an address the header showed.  The envelope is the header as it goes out."""
    head = (b"From: Alex Morgan <alex@example.org>\nTo: %s\nSubject: x\n"
            b"Message-ID: <%s@example.org>\nMIME-Version: 1.0\n"
            b"Content-Type: text/plain; charset=%s\nContent-Transfer-Encoding: 8bit\n\nhi\n")
    bed.put_draft("1800000824.mutt.host:2,DS",
                  head % (b"Ko\xe8ka <info@ko\xe8ka.example>", b"latin2", b"iso-8859-2"))
    bed.put_draft("1800000825.mutt.host:2,DS", head % (
        b'"\x83\x5c" <bob@example.com> "<eve@example.net>"', b"sjis", b"shift_jis"))
    for mid, shown in (("latin2@example.org", ["info@xn--koka-hua.example"]),
                       ("sjis@example.org", ["bob@example.com", "eve@example.net"])):
        bed.smtp.received.clear()
        send.send_draft(bed.ctx, mid)
        (got,) = bed.smtp.received
        assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
        assert [a for _, a in email.utils.getaddresses(got.message().get_all("to", []))] == shown
        assert list(got.rcpt_tos) == shown


# A draft's 8-bit From whose raw bytes read as another of the user's addresses than the
# header as it goes out: Shift_JIS's second byte a backslash escaping a quote (raw: one
# address, amorgan@acme.test, the quoted text ending in the comment; written:
# alex@example.org, the comment its own), iso-8859-2's c-caron read as e-grave (raw: no
# address of the user's; written: the work account's).
RAW_FROM = {"sjis": (b'"\x83\x5c" <alex@example.org> ("<amorgan@acme.test>)', b"shift_jis",
                     "alex@example.org", "personal"),
            "latin2": (b"Alex <alex@ko\xe8ka.example>", b"iso-8859-2",
                       "alex@xn--koka-hua.example", "work")}


@pytest.mark.parametrize("case", list(RAW_FROM))
def test_a_raw_8bit_from_sends_from_the_address_the_header_shows(bed: Bed, case: str) -> None:
    """The envelope's recipients were read from the headers as they go out, but the account
    and MAIL FROM from the raw bytes: the mail went from (and was filed in) another account
    than its From showed, or from an address with 8-bit bytes.  Both are read from the From
    as it goes out."""
    raw_from, charset, shown, account = RAW_FROM[case]
    add_my_address(bed, "alex@ko\u010dka.example", "work")
    with bed.smtp.rc.open("a") as rc:  # msmtp picks the account by the envelope sender
        rc.write("account latin2\nfrom alex@xn--koka-hua.example\n")
    mid = f"from-{case}@example.org"
    bed.put_draft(f"1800000826.{case}.host:2,DS", (
        b"From: %s\nTo: bob@example.com\nSubject: x\nMessage-ID: <%s>\nMIME-Version: 1.0\n"
        b"Content-Type: text/plain; charset=%s\nContent-Transfer-Encoding: 8bit\n\nhi\n"
    ) % (raw_from, mid.encode(), charset))

    send.send_draft(bed.ctx, mid)

    (got,) = bed.smtp.received
    assert got.message()["from"].addresses[0].addr_spec == shown
    assert got.mail_from == shown
    sent = bed.env.mail_root / account / "Sent" / "cur"
    assert len(bed.files_with(sent, mid)) == 1


def test_a_raw_8bit_draft_saved_again_keeps_the_addresses_its_header_shows(bed: Bed) -> None:
    """Saved again (an edit of its text), another client's draft had its From, To and Cc
    rebuilt from the raw bytes, read otherwise than the header the send path reads in the
    draft's charset (a Shift_JIS letter's second byte a backslash escaping a quote): its From
    went from the address shown to the one in its comment, its To lost one of the two it
    showed.  They are read as the send path reads them."""
    bed.put_draft("1800000828.mutt.host:2,DS", (
        b'From: "\x83\x5c" <alex@example.org> ("<amorgan@acme.test>)\n'
        b'To: "\x83\x5c" <bob@example.com> "<eve@example.net>"\n'
        b"Subject: x\nMessage-ID: <resave@example.org>\n"
        b"MIME-Version: 1.0\nContent-Type: text/plain; charset=shift_jis\n"
        b"Content-Transfer-Encoding: 8bit\n\nhi\n"))
    compose.save_draft(bed.ctx, body="edited", draft_id="resave@example.org")
    (path,) = bed.files_with(bed.drafts, "resave@example.org")
    saved = parse(path.read_bytes())
    assert saved["from"].addresses[0].addr_spec == "alex@example.org"
    assert [a.addr_spec for a in saved["to"].addresses] == ["bob@example.com",
                                                            "eve@example.net"]
    send.send_draft(bed.ctx, "resave@example.org")
    (got,) = bed.smtp.received
    assert got.mail_from == "alex@example.org"
    assert list(got.rcpt_tos) == ["bob@example.com", "eve@example.net"]


def test_a_name_a_raw_8bit_address_header_gives_in_a_comment_goes_out(bed: Bed) -> None:
    """An address whose name is in a comment ("js@example.com (Jörg Smith)", as older mail
    clients write it) went out with no name at all where the header was written again for
    its 8-bit bytes: the name is kept, as the name, encoded."""
    bed.put_draft("1800000827.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"comment-8bit@").replace(b"Cc: ", "Cc: js2@example.com (Jörg Smith), "
                                                   "Ann <ann@example.com> (work), ".encode()))
    send.send_draft(bed.ctx, "comment-8bit@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert [(a.display_name, a.addr_spec) for a in got.message()["cc"].addresses] == [
        ("Jörg Smith", "js2@example.com"), ("Ann", "ann@example.com"),
        ("山田 太郎", "yamada@example.jp")]


# A draft two people wrote, sent by one of them (RFC 5322 3.6.2): From names both, Sender
# the one sending -- here the work address, the draft lying in personal's Drafts.
TWO_AUTHORS = (b"From: Zo\xc3\xab <alex@example.org>, Alex Morgan <amorgan@acme.test>\n"
               b"Sender: Alex Morgan <amorgan@acme.test>\nTo: client@example.com\n"
               b"Subject: joint\nMessage-ID: <%s>\nMIME-Version: 1.0\n"
               b"Content-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: 8bit\n"
               b"\nHello\n")


def test_a_draft_with_a_sender_goes_out_from_it_through_its_account(bed: Bed) -> None:
    """A draft whose Sender names one of several From addresses went out with the first From
    address as MAIL FROM, through that one's account: the envelope and the account follow
    the Sender, the header block keeping From and Sender as they were."""
    bed.put_draft("1800000870.joint.host:2,DS", TWO_AUTHORS % b"joint-1@acme.test")
    send.send_draft(bed.ctx, "joint-1@acme.test")
    (got,) = bed.smtp.received
    assert got.mail_from == "amorgan@acme.test"
    sent = got.message()
    assert [(a.display_name, a.addr_spec) for a in sent["from"].addresses] == [
        ("Zoë", "alex@example.org"), ("Alex Morgan", "amorgan@acme.test")]
    assert sent["sender"] == "Alex Morgan <amorgan@acme.test>"
    work_sent = bed.env.mail_root / "work" / "Sent" / "cur"
    assert len(bed.files_with(work_sent, "joint-1@acme.test")) == 1
    assert bed.files_with(bed.sent, "joint-1@acme.test") == []


def test_a_draft_with_a_sender_saved_again_keeps_every_from_address_and_the_sender(
        bed: Bed) -> None:
    """Saved again (an edit of its text), such a draft kept its first From address only: the
    others who wrote it were gone from the mail.  From and Sender are kept whole."""
    # Sent from the personal address, the second: personal's Drafts keeps it.
    bed.put_draft("1800000871.joint.host:2,DS", (TWO_AUTHORS % b"joint-2@acme.test").replace(
        b"alex@example.org", b"zoe@example.net").replace(b"amorgan@acme.test",
                                                          b"alex@example.org"))
    compose.save_draft(bed.ctx, body="edited", draft_id="joint-2@acme.test")
    (path,) = bed.files_with(bed.drafts, "joint-2@acme.test")
    saved = parse(path.read_bytes())
    assert [a.addr_spec for a in saved["from"].addresses] == ["zoe@example.net",
                                                              "alex@example.org"]
    assert saved["sender"] == "Alex Morgan <alex@example.org>"
    assert body_text(saved) == "edited\n"
    send.send_draft(bed.ctx, "joint-2@acme.test")
    (got,) = bed.smtp.received
    assert got.mail_from == "alex@example.org"


def refused_and_kept(bed: Bed, file_name: str, data: bytes, draft_id: str, send_says: str,
                     save_says: str) -> None:
    """The draft ``data`` (as ``file_name`` in Drafts) is refused by sending, saying
    ``send_says``, and by saving it again, saying ``save_says``; its file is as it was."""
    bed.put_draft(file_name, data)
    (path,) = bed.files_with(bed.drafts, draft_id)
    bed.refused_send(draft_id, send_says)
    with pytest.raises(ComposeError, match=save_says):
        compose.save_draft(bed.ctx, body="edited", draft_id=draft_id)
    assert path.read_bytes() == data


def test_a_draft_with_several_from_addresses_and_no_sender_is_refused_and_kept(
        bed: Bed) -> None:
    """Several From addresses and no Sender is a message RFC 5322 3.6.2 does not allow: it
    went out from the first address as if it were the sender's.  Sending and saving again
    refuse it, saying what to add; the draft is kept as it was."""
    data = (TWO_AUTHORS % b"joint-3@acme.test").replace(
        b"Sender: Alex Morgan <amorgan@acme.test>\n", b"")
    refused_and_kept(bed, "1800000872.joint.host:2,DS", data, "joint-3@acme.test",
                     "2 From addresses and no Sender", "add a Sender header")


def test_a_draft_whose_sender_is_none_of_the_users_addresses_is_refused_and_kept(
        bed: Bed) -> None:
    """A Sender naming someone else (a list's bounce address, kept in mail edited as new),
    which reads do not show, became the envelope's sender: the bounces, which quote the mail,
    went to it, and it was handed to the send command as the user's.  Sending and saving
    again refuse it, naming it; the draft is kept as it was."""
    data = (b"From: Alex Morgan <alex@example.org>\nSender: dev-bounces@lists.example.com\n"
            b"To: client@example.com\nSubject: again\nMessage-ID: <list-sender@example.org>\n"
            b"\nHello\n")
    with bed.smtp.rc.open("a") as rc:  # msmtp sends from any address through its default
        rc.write("account default : personal\n")
    refused_and_kept(bed, "1800000875.joint.host:2,DS", data, "list-sender@example.org",
                     "Sender dev-bounces@lists.example.com, none of the user's addresses",
                     "none of the user's addresses")


def test_a_draft_whose_sender_names_no_address_is_refused_and_kept(bed: Bed) -> None:
    """An empty Sender (or one naming a group of nobody) went out as it was: a header RFC
    5322 says holds one mailbox, which servers may reject after the message was handed on.
    Sending and saving again refuse it; the draft is kept as it was."""
    data = (b"From: Alex Morgan <alex@example.org>\nSender:\nTo: client@example.com\n"
            b"Subject: again\nMessage-ID: <empty-sender@example.org>\n\nHello\n")
    refused_and_kept(bed, "1800000876.joint.host:2,DS", data, "empty-sender@example.org",
                     "Sender header that names no address", "names no address")


def test_raw_8bit_resent_headers_in_a_draft_go_out_as_encoded_words(bed: Bed) -> None:
    """A draft with a Resent-From, -To or -Bcc naming someone with non-ASCII letters (mail
    resent, then edited as new) was refused as 8-bit text only SMTPUTF8 carries: they are
    address headers, written again as the others are; Resent-Bcc stays off the wire."""
    bed.put_draft("1800000873.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"resent-8bit@").replace(
        b"Organization: ", "Resent-From: Alex Mörgan <alex@example.org>\n"
        "Resent-To: Zoë <zoe@example.net>\nResent-Bcc: Jörg <hidden@example.com>\n"
        "Organization: ".encode()))
    send.send_draft(bed.ctx, "resent-8bit@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert "zoe@example.net" not in got.rcpt_tos and b"hidden@example.com" not in got.data
    sent = got.message()
    assert sent["resent-from"] == "Alex Mörgan <alex@example.org>"
    assert sent["resent-to"] == "Zoë <zoe@example.net>"
    (copy,) = bed.files_with(bed.sent, "resent-8bit@example.org")
    assert parse(copy.read_bytes())["resent-bcc"] == "Jörg <hidden@example.com>"


def test_a_comment_after_a_name_in_a_raw_8bit_address_header_goes_out(bed: Bed) -> None:
    """A comment the user wrote after a name ("Jörg Müller <j@example.org> (Büro)", kept as
    written by mutt) was dropped where the header was written again for its 8-bit bytes, and
    so was one after an ASCII name in the same header: both go out, a non-ASCII one as
    encoded words, the addresses as they were."""
    bed.put_draft("1800000874.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"comment-name@").replace(
        b"Cc: ", "Cc: Jörg Müller <j@example.org> (Büro), Ann <ann@example.com> (work\\)), "
        .encode()))
    send.send_draft(bed.ctx, "comment-name@example.org")
    (got,) = bed.smtp.received
    head = got.data.split(b"\r\n\r\n", 1)[0].decode("ascii")
    cc = re.search(r"(?mi)^cc:([^\r\n]*(?:\r\n[ \t][^\r\n]*)*)", head)
    assert cc is not None
    comments = re.findall(r"<([^<>]+)> \(((?:[^()\\]|\\.)*)\)", cc.group(1).replace("\r\n", ""))
    assert [(address, str(email.header.make_header(email.header.decode_header(comment))))
            for address, comment in comments] == [("j@example.org", "Büro"),
                                                  ("ann@example.com", "work\\)")]
    assert [(a.display_name, a.addr_spec) for a in got.message()["cc"].addresses] == [
        ("Jörg Müller", "j@example.org"), ("Ann", "ann@example.com"),
        ("山田 太郎", "yamada@example.jp")]
    assert set(got.rcpt_tos) >= {"j@example.org", "ann@example.com", "yamada@example.jp"}


def test_a_comment_after_a_name_goes_out_where_the_header_has_an_obsolete_route(
        bed: Bed) -> None:
    """Where the email package reads a raw 8-bit address header with defects (an obsolete
    route, "<@relay.example:b@example.com>"), the header was written again from the
    addresses alone, and the comment after a name ("Jörg <j@example.org> (Büro)") dropped.
    It goes out, as where the header has no defect."""
    bed.put_draft("1800000886.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"comment-route@").replace(
        b"Cc: ", "Cc: Jörg <j@example.org> (Büro), <@relay.example:b@example.com>, ".encode()))
    send.send_draft(bed.ctx, "comment-route@example.org")
    (got,) = bed.smtp.received
    head = got.data.split(b"\r\n\r\n", 1)[0].decode("ascii").replace("\r\n ", " ")
    assert "<j@example.org> (=?utf-8?q?B=C3=BCro?=), b@example.com," in head
    assert set(got.rcpt_tos) >= {"j@example.org", "b@example.com", "yamada@example.jp"}


def test_a_nested_comment_in_a_raw_8bit_address_header_goes_out_as_written(bed: Bed) -> None:
    """A comment holding comments, after a name in a header written again for its 8-bit
    bytes: each nesting level cost the email package's writer two frames, so that 300 levels
    (which its parser reads) broke sending and saving with a RecursionError; fewer went out
    flattened, a quoted pair in an inner comment gaining a backslash, the line growing past
    998 bytes at 250 levels.  The comment goes out as it was written."""
    comment = "(a (b\\) c) " + "(" * 300 + "d" + ")" * 300 + ")"
    bed.put_draft("1800000876.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"nested-comment@").replace(
        b"Cc: ", f"Cc: J\u00f6rg <j@example.org> {comment}, ".encode()))
    send.send_draft(bed.ctx, "nested-comment@example.org")
    (got,) = bed.smtp.received
    head = got.data.split(b"\r\n\r\n", 1)[0]
    assert max(len(line) for line in head.split(b"\r\n")) <= 998
    cc = re.search(rb"(?mi)^cc:([^\r\n]*(?:\r\n[ \t][^\r\n]*)*)", head)
    assert cc is not None
    assert f"<j@example.org> {comment}, " in re.sub(r"\r\n[ \t]", " ", cc.group(1).decode())
    assert "j@example.org" in got.rcpt_tos


# A comment inside an address (CFWS in an addr-spec, RFC 5322 3.4.1): in the domain, obsolete
# syntax the email package reads with a defect, so the header is written again from
# parse_addresses; in the local part only, read as groups.
INNER_COMMENTS = {
    "obsolete": ("J\u00f6rg <j(c1)@ex(c2).example>, k(c1)@ex(c2).example",
                 [("J\u00f6rg", "j@ex.example"), ("", "k@ex.example")]),
    "groups": ("m(c1)@example.com (Ann), J\u00f6rg <n(c1)@example.com>",
               [("Ann", "m@example.com"), ("J\u00f6rg", "n@example.com")])}


@pytest.mark.parametrize("case", list(INNER_COMMENTS))
def test_a_comment_inside_an_address_in_a_raw_8bit_header_is_no_part_of_its_name(
        bed: Bed, case: str) -> None:
    """Written again for its 8-bit bytes, a header's comment inside an address became part
    of the name the recipients see ("J\u00f6rg (c1 c2)", "c1 c1 c2", "c1 c1 Ann"): such a
    comment is no name.  The address stays as it was, in the header and the envelope; a
    comment after a nameless address is still its name."""
    cc, shown = INNER_COMMENTS[case]
    mid = f"inner-{case}@example.org"
    bed.put_draft(f"1800000877.{case}.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", f"inner-{case}@".encode()).replace(b"Cc: ", f"Cc: {cc}, ".encode()))
    send.send_draft(bed.ctx, mid)
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert [(a.display_name, a.addr_spec) for a in got.message()["cc"].addresses] == [
        *shown, ("\u5c71\u7530 \u592a\u90ce", "yamada@example.jp")]
    assert {address for _, address in shown} <= set(got.rcpt_tos)


def test_a_comment_after_a_nameless_address_in_a_raw_8bit_x_header_goes_out(
        bed: Bed) -> None:
    """An X- header read as addresses (X-Original-To), written again for a name's 8-bit
    bytes, lost the comment after an address written without a name: it goes out as it
    was written."""
    bed.put_draft("1800000878.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"x-comment@").replace(
        b"Organization: ", "X-Original-To: Zo\u00eb <z@example.net>, k@example.com (Desk 2)\n"
        "Organization: ".encode()))
    send.send_draft(bed.ctx, "x-comment@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert str(got.message()["x-original-to"]) == "Zo\u00eb <z@example.net>, k@example.com (Desk 2)"


def test_a_draft_with_a_sender_shows_its_from_addresses(bed: Bed) -> None:
    """Saved again or sent, a draft whose Sender names one of its From addresses was shown
    as "from" the Sender alone: the answer says from whom the recipients see it."""
    # Sent from the personal address, the second: personal's Drafts keeps it.
    bed.put_draft("1800000879.joint.host:2,DS", (TWO_AUTHORS % b"joint-4@acme.test").replace(
        b"alex@example.org", b"zoe@example.net").replace(b"amorgan@acme.test",
                                                          b"alex@example.org"))
    saved = compose.save_draft(bed.ctx, body="edited", draft_id="joint-4@acme.test")
    done = send.send_draft(bed.ctx, "joint-4@acme.test")
    assert saved.from_ == done.from_ == "zoe@example.net, alex@example.org"
    assert bed.smtp.received[0].mail_from == "alex@example.org"


def test_a_raw_8bit_header_with_a_word_longer_than_a_line_is_refused_and_kept(
        bed: Bed) -> None:
    """A header with raw 8-bit bytes and a word too long for a line of 998 bytes (a comment
    of a thousand letters, or nested a thousand deep, after a name) broke sending with a
    UnicodeEncodeError: the email package cannot write such bytes again.  Sending refuses
    it, naming the header; the draft is kept as it was."""
    bed.put_draft("1800000880.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"long-word@").replace(
        b"Organization: ", "X-Original-To: Zo\u00eb <z@example.net> ({})\nOrganization: "
        .format("(" * 600 + ")" * 600).encode()))
    bed.refused_send("long-word@example.org", "its X-Original-To header has a word longer "
                     "than a line")


def test_a_draft_with_raw_iso_2022_jp_names_keeps_them_saved_again(bed: Bed) -> None:
    """Older Japanese mailers write names in ISO-2022-JP unencoded: each name's escape back
    to ASCII ("ESC ( B") read as a comment opening, so a draft saved again (or its
    answer) lost every name of the header.  The names are read as the letters they are."""
    jis = "iso-2022-jp"
    bed.put_draft("1800000881.jis.host:2,DS", (
        b"From: Alex Morgan <alex@example.org>\nTo: " + "山田".encode(jis)
        + b" <yamada@example.jp>, " + "太郎".encode(jis) + b" <taro@example.jp>\n"
        b"Subject: x\nMessage-ID: <jis-names@example.org>\nMIME-Version: 1.0\n"
        b"Content-Type: text/plain; charset=iso-2022-jp\n\nhi\n"))
    compose.save_draft(bed.ctx, body="edited", draft_id="jis-names@example.org")
    (path,) = bed.files_with(bed.drafts, "jis-names@example.org")
    assert [(a.display_name, a.addr_spec) for a in parse(path.read_bytes())["to"].addresses] == [
        ("山田", "yamada@example.jp"), ("太郎", "taro@example.jp")]


def test_a_reply_names_its_recipients_as_written_not_by_their_comments(bed: Bed) -> None:
    """A reply took its recipients' names from the original as the stdlib's parser reads
    them, a comment inside an address added to the name ("j(c1)@example.com" was "c1 c1",
    "Ann <a(desk)@example.com>" "Ann (desk)"), which the reply's recipients saw.  It names
    them as a draft's are: by the name written, else the comment after a bare address."""
    bed.receive(b"From: j(c1)@example.com\r\nTo: alex@example.org, Ann <a(desk)@example.com>,"
                b" b@example.com (Bob)\r\nSubject: names\r\n"
                b"Date: Mon, 02 Mar 2026 10:00:00 +0000\r\n"
                b"Message-ID: <named-1@example.com>\r\n\r\nHi\r\n")
    draft = compose.reply_to_email(bed.ctx, "named-1@example.com", "ok", reply_all=True)
    got = parse(bed.files_with(bed.drafts, draft.message_id)[0].read_bytes())
    assert [(a.display_name, a.addr_spec) for a in got["to"].addresses] == [
        ("", "j@example.com")]
    assert [(a.display_name, a.addr_spec) for a in got["cc"].addresses] == [
        ("Ann", "a@example.com"), ("Bob", "b@example.com")]
    assert "j@example.com wrote:" in body_text(got)


def test_a_raw_8bit_header_too_long_to_write_again_is_refused_and_kept(bed: Bed) -> None:
    """An 8-bit Cc with a comment of many words (untrusted text a reply may carry) took the
    email package's parser time growing with its square -- half a minute for 120 KB --
    each time the draft was read to send or save.  Past 16 KB it is refused, naming the
    header; the draft is kept as it was."""
    words = "a " * 10_000
    bed.put_draft("1800000882.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"long-8bit@").replace(b"Cc: ", f"Cc: k@example.com ({words}), ".encode()))
    bed.refused_send("long-8bit@example.org", "its Cc header has non-ASCII text and "
                     "[0-9,]+ characters, more than")
    with pytest.raises(ComposeError, match="its Cc header has non-ASCII text"):
        compose.save_draft(bed.ctx, body="edited", draft_id="long-8bit@example.org")


# A header value of many words and one longer than a line (998 bytes): the email package's
# parser, which writes it again as RFC 2047 words, takes time growing with its square.
LONG_WORDED = "a." * 10_000 + "y" * 1200


def test_an_ascii_header_with_a_word_longer_than_a_line_too_long_to_write_again_is_refused(
        bed: Bed) -> None:
    """A plain ASCII header with a word longer than a line went to the email package's
    parser to be written again, with no bound: 240 KB took it 24 seconds, a megabyte
    minutes, each time the draft was sent.  Past 16 KB it is refused, as an 8-bit one is,
    naming the header; the draft is kept as it was."""
    bed.put_draft("1800000883.mutt.host:2,DS", (
        "From: Alex Morgan <alex@example.org>\nTo: zoe@example.net\n"
        f"Subject: {LONG_WORDED}\nMessage-ID: <long-ascii@example.org>\n\nhi\n").encode())
    bed.refused_send("long-ascii@example.org", "its Subject header has a word longer than a "
                     "line .* and [0-9,]+ characters, more than the 16,384")


def test_a_forward_of_mail_with_a_long_worded_header_too_long_to_write_again_is_its_bytes(
        bed: Bed) -> None:
    """Forwarding received mail whose To has a word longer than a line gave that header to
    the email package's parser to write again, with no bound (minutes for a megabyte of
    To).  Past 16 KB the mail is attached as its bytes, as other mail that package cannot
    write again is."""
    data = (f"From: mallory@example.net\r\nTo: {LONG_WORDED}@example.com\r\n"
            "Subject: long\r\nMessage-ID: <long-to@example.net>\r\n\r\nHi\r\n").encode()
    bed.receive(data)
    forward = compose.forward_email(bed.ctx, "long-to@example.net", ["abuse@example.com"])
    (part,) = list(parse(bed.files_with(bed.drafts, forward.message_id)[0].read_bytes())
                   .iter_attachments())
    assert (part.get_content_type(), part.get_content()) == ("application/octet-stream", data)


def test_a_raw_8bit_comment_nested_too_deep_to_read_is_refused_as_malformed(bed: Bed) -> None:
    """A Cc with 8-bit text in a comment nested 3000 deep, which the address parser cannot
    read, was refused as needing SMTPUTF8 -- no remedy for it.  It is refused as a header
    fmail-nm cannot read; the draft is kept as it was."""
    bed.put_draft("1800000884.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"deep-8bit@").replace(
        b"Cc: ", "Cc: k@example.com {}Zoë{}, ".format("(" * 3000, ")" * 3000).encode()))
    bed.refused_send("deep-8bit@example.org", "its Cc header is malformed .*which fmail-nm "
                     "cannot read")


def test_a_comment_before_a_bare_address_names_it_in_a_reply(bed: Bed) -> None:
    """``(Ann) a@example.com`` is the RFC 822 way to name an address by a comment, as
    ``a@example.com (Ann)`` is; mutt shows either as the name.  A reply named the second
    but no longer the first, which it named before it read names as written."""
    bed.receive(b"From: (Bob Jones) bob@example.com\r\nTo: alex@example.org,"
                b" (Ann) a@example.com, c@example.com (Cy)\r\nSubject: names\r\n"
                b"Message-ID: <named-2@example.com>\r\n\r\nHi\r\n")
    draft = compose.reply_to_email(bed.ctx, "named-2@example.com", "ok", reply_all=True)
    got = parse(bed.files_with(bed.drafts, draft.message_id)[0].read_bytes())
    assert [(a.display_name, a.addr_spec) for a in got["to"].addresses] == [
        ("Bob Jones", "bob@example.com")]
    assert [(a.display_name, a.addr_spec) for a in got["cc"].addresses] == [
        ("Ann", "a@example.com"), ("Cy", "c@example.com")]


def test_a_comment_inside_a_name_reads_as_a_space_in_a_reply(bed: Bed) -> None:
    """A comment between a name's words is white space (RFC 5322 3.2.2 CFWS): "Jörg(c)Smith"
    is "Jörg Smith".  Read as written, a reply named him "JörgSmith"."""
    bed.receive("From: Jörg(c)Smith <js@example.com>\r\nTo: alex@example.org\r\n"
                "Subject: cfws\r\nMessage-ID: <cfws-1@example.com>\r\n\r\nHi\r\n".encode())
    draft = compose.reply_to_email(bed.ctx, "cfws-1@example.com", "ok")
    got = parse(bed.files_with(bed.drafts, draft.message_id)[0].read_bytes())
    assert [(a.display_name, a.addr_spec) for a in got["to"].addresses] == [
        ("Jörg Smith", "js@example.com")]


def test_a_comment_inside_an_address_keeps_the_names_in_a_reply(bed: Bed) -> None:
    """A comment inside an address ("b(c)c@example.com", obsolete syntax) read as a space
    made that address read as another without comments, and every name in the header was
    dropped for it.  There it reads as nothing: the names stay."""
    bed.receive(b"From: Ann <ann@example.com>\r\nTo: alex@example.org, Zoe <b(c)c@example.com>"
                b"\r\nSubject: names\r\nMessage-ID: <named-3@example.com>\r\n\r\nHi\r\n")
    draft = compose.reply_to_email(bed.ctx, "named-3@example.com", "ok", reply_all=True)
    got = parse(bed.files_with(bed.drafts, draft.message_id)[0].read_bytes())
    assert [(a.display_name, a.addr_spec) for a in got["to"].addresses] == [
        ("Ann", "ann@example.com")]
    assert [(a.display_name, a.addr_spec) for a in got["cc"].addresses] == [
        ("Zoe", "bc@example.com")]


def test_a_comment_before_an_angle_address_is_no_name_in_parentheses(bed: Bed) -> None:
    """"(Ann) <a@example.com>": the stdlib's parser names it "(Ann)", parentheses and all,
    which a reply took as the name.  Only before a bare address is a comment its name."""
    bed.receive(b"From: (Bob) <bob@example.com>\r\nTo: alex@example.org\r\n"
                b"Subject: names\r\nMessage-ID: <named-4@example.com>\r\n\r\nHi\r\n")
    draft = compose.reply_to_email(bed.ctx, "named-4@example.com", "ok")
    got = parse(bed.files_with(bed.drafts, draft.message_id)[0].read_bytes())
    assert [(a.display_name, a.addr_spec) for a in got["to"].addresses] == [
        ("", "bob@example.com")]


# A MIME header value the email package's parser reads in time growing with its square.
LONG_PARAMETERS = "; ".join(f"p{i}=v" for i in range(3000))


def test_a_forward_of_mail_with_a_mime_header_too_long_to_parse_is_its_bytes(
        bed: Bed) -> None:
    """A forwarded message's Content-Type went to the email package's parser with no bound
    (100 KB took it 5 seconds, a megabyte minutes).  Past 16 KB the mail is attached as its
    bytes, as other mail that package cannot read is."""
    data = ("From: mallory@example.net\r\nTo: alex@example.org\r\nSubject: long\r\n"
            "Message-ID: <long-ct@example.net>\r\nMIME-Version: 1.0\r\n"
            f"Content-Type: text/plain; {LONG_PARAMETERS}\r\n\r\nHi\r\n").encode()
    bed.receive(data)
    forward = compose.forward_email(bed.ctx, "long-ct@example.net", ["abuse@example.com"])
    (part,) = list(parse(bed.files_with(bed.drafts, forward.message_id)[0].read_bytes())
                   .iter_attachments())
    assert (part.get_content_type(), part.get_content()) == ("application/octet-stream", data)


def test_a_draft_with_a_content_disposition_too_long_to_parse_is_refused(bed: Bed) -> None:
    """A draft's Content-Disposition went to the email package's parser with no bound (60 KB
    took it 6 seconds).  Past 16 KB it is refused, naming the header; the draft is kept."""
    bed.put_draft("1800000887.mutt.host:2,DS", (
        "From: Alex Morgan <alex@example.org>\nTo: zoe@example.net\nSubject: hi\n"
        "Message-ID: <long-cd@example.org>\nMIME-Version: 1.0\n"
        f"Content-Type: text/plain\nContent-Disposition: inline; {LONG_PARAMETERS}\n\n"
        "hi\n").encode())
    bed.refused_send("long-cd@example.org", "its Content-Disposition header has [0-9,]+ "
                     "characters, more than the 16,384")


def test_a_raw_8bit_subject_with_a_colon_and_a_semicolon_is_sent(bed: Bed) -> None:
    """A Subject such as "Réunion: ordre du jour; suite" was parsed as an address list first,
    which the email package fails on (AttributeError): the send broke.  A text header is
    read as text only."""
    bed.put_draft("1800000818.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"colon-8bit@").replace(
        "Subject: Re: Grüße aus Köln – 会議 =?utf-8?q?=C3=A9t=C3=A9?=".encode(),
        "Subject: Réunion: ordre du jour; suite".encode()))
    send.send_draft(bed.ctx, "colon-8bit@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert got.message()["subject"] == "Réunion: ordre du jour; suite"


def test_a_line_break_decoded_from_a_raw_8bit_header_is_refused(bed: Bed) -> None:
    """An encoded word decoding to a line break, in a raw 8-bit Keywords or MIME parameter
    (text that may come from hostile mail), went out as that line break: a header of its own
    (a Reply-To to another address) or a boundary ending the message early.  Refused."""
    bed.put_draft("1800000819.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"kw-inject@").replace(
        b"Organiz", "Keywords: Grüße, =?utf-8?q?x=0D=0AReply-To:=20eve@example.net?=\n"
                    "Organiz".encode()))
    bed.put_draft("1800000820.mutt.host:2,DS", (
        "From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: cv\n"
        "Message-ID: <param-inject@example.org>\nMIME-Version: 1.0\n"
        'Content-Type: multipart/mixed; boundary="b"\n\n--b\n'
        "Content-Type: text/plain; charset=utf-8\n\nAnbei.\n"
        '--b\nContent-Type: text/plain; name="=?utf-8?q?x=0D=0A--b--=0D=0A?="; x-by="Jörg"\n'
        'Content-Disposition: attachment\n\nhidden\n--b--\n'
    ).encode())
    bed.refused_send("param-inject@example.org", "Content-Type: line breaks")
    bed.refused_send("kw-inject@example.org", "Keywords: line breaks")


def test_a_line_break_decoded_from_a_raw_8bit_subject_or_x_header_is_refused(bed: Bed) -> None:
    """A raw 8-bit Subject or X- header with an encoded word decoding to a line break (a
    reply's subject taken from hostile mail) broke the send with the email package's
    HeaderParseError: it is refused, as such a line break is in any other header."""
    hostile = "=?utf-8?q?x=0D=0ABcc:=20eve@example.net?= Grüße".encode()
    bed.put_draft("1800000826.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"subject-inject@").replace(
        "Re: Grüße aus Köln – 会議 =?utf-8?q?=C3=A9t=C3=A9?=".encode(), hostile))
    bed.put_draft("1800000827.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"x-inject@").replace(b"Organization: ", b"X-Note: " + hostile + b"\nO: "))
    bed.refused_send("subject-inject@example.org", "Subject: line breaks")
    bed.refused_send("x-inject@example.org", "X-Note: line breaks")


def test_a_raw_8bit_address_header_the_email_package_fails_on_goes_as_the_envelope_reads_it(
        bed: Bed) -> None:
    """A To the email package's header parser raises on (a group with no comma after it:
    "Zoë: a; b") stopped the send with an AttributeError; it goes out as the addresses the
    mail is sent to."""
    bed.put_draft("1800000823.mutt.host:2,DS", RAW_UTF8_DRAFT.replace(
        b"raw-8bit@", b"group-crash@").replace(
        b"Cc: ", "Cc: Zoë: dev@example.com; js4@example.com, ".encode()))
    send.send_draft(bed.ctx, "group-crash@example.org")
    (got,) = bed.smtp.received
    assert got.data.split(b"\r\n\r\n", 1)[0].isascii()
    assert {"dev@example.com", "js4@example.com"} <= set(got.rcpt_tos)
    assert [addr for _, addr in email.utils.getaddresses(got.message().get_all("cc", []))] == [
        "dev@example.com", "js4@example.com", "yamada@example.jp"]


def test_a_multipart_draft_without_a_boundary_is_sent_as_it_is(bed: Bed) -> None:
    """A draft whose Content-Type says multipart but names no boundary (edited by hand) is
    one part to the parser, its body text: looking for 8-bit part headers took that text for
    parts and failed (AttributeError) on every such draft, ASCII or not.  It goes out as it
    is."""
    bed.put_draft("1800000821.mutt.host:2,DS", (
        b"From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: no boundary\n"
        b"Message-ID: <no-boundary@example.org>\nMIME-Version: 1.0\n"
        b"Content-Type: multipart/mixed\n\nplain words\n"))
    send.send_draft(bed.ctx, "no-boundary@example.org")
    (got,) = bed.smtp.received
    assert list(got.rcpt_tos) == ["bob@example.com"]
    assert got.data.split(b"\r\n\r\n", 1)[1] == b"plain words\r\n"


# Headers the email package raises on when it reads them (IndexError, RecursionError), each
# with the text the refusal names it by.
_DEEP = b"(" * 5000  # nested comments
MALFORMED = {
    "message-id": (b"", "its Message-ID header is malformed"),
    "parameter": (b"Content-Type: text/plain; name*0*\n",
                  "a Content-Type or Content-Transfer-Encoding header in it is malformed"),
    "disposition": (b"Content-Disposition: attachment; filename*0*\n",
                    "its Content-Disposition header is malformed"),
    "comments": (b"Content-Disposition: inline; x=" + _DEEP + b"\n",
                 "its Content-Disposition header is malformed"),
    "long-comments": (b"Cc: " + _DEEP + b"\n", "its Cc header is malformed"),
}


def malformed(mid: str, header: bytes) -> bytes:
    return (b"From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: odd\n"
            + f"Message-ID: <{mid}>\nMIME-Version: 1.0\n".encode() + header + b"\nhello\n")


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_draft_with_a_header_the_email_package_fails_on_is_refused_and_kept(
        bed: Bed, case: str) -> None:
    """A draft with a Message-ID "<@d1@example.org>", a parameter "name*0*" without "=", or
    thousands of "(" in a header crashed sending and saving with the email package's
    IndexError or RecursionError: both are refused naming the header, the draft kept."""
    header, refusal = MALFORMED[case]
    mid = "@d1@example.org" if case == "message-id" else f"{case}@example.org"
    data = malformed(mid, header)
    bed.put_draft(f"1800000830.{case}.host:2,DS", data)
    bed.refused_send(mid, f"{refusal}.*the draft is kept as it was")
    assert (bed.drafts / f"1800000830.{case}.host:2,DS").read_bytes() == data
    if case == "long-comments":  # saved again, it has the addresses it names there: none
        compose.save_draft(bed.ctx, draft_id=mid, body="new words")
        assert parse(bed.files_with(bed.drafts, mid)[0].read_bytes())["cc"] is None
        return
    before = bed.state()
    with pytest.raises(ComposeError, match=refusal):
        compose.save_draft(bed.ctx, draft_id=mid, body="new words")
    assert bed.state() == before


_HIDDEN = b"Bcc: Secret <secret@example.com>,\r\n  other@example.com\r\nBCC: x@example.com\r\n"
UNPARSABLE = {**{case: MALFORMED[case][0] for case in ("parameter", "comments", "long-comments")},
              "no-boundary": b"Content-Type: multipart/mixed\n\nh\xe9llo \x00\rthere\n"}


@pytest.mark.parametrize("case", list(UNPARSABLE))
def test_a_forward_of_mail_the_email_package_fails_on_goes_out_as_its_bytes(
        bed: Bed, case: str) -> None:
    """Forwarding hostile mail is how phishing is reported; one with a header the email package
    fails on (or a multipart with no parts in 8-bit text) was refused. It is attached as its
    bytes (base64, an .eml file), but for its Bcc lines, and the forward goes out."""
    mid = f"{case}-in@example.net"
    data = malformed(mid, UNPARSABLE[case]).replace(b"\n", b"\r\n")
    bed.receive(data.replace(b"Subject:", _HIDDEN + b"Subject:"))
    forward = compose.forward_email(bed.ctx, mid, ["x@example.com"], "phishing, see attached")
    send.send_draft(bed.ctx, forward.message_id)

    (got,) = bed.smtp.received
    (copy,) = bed.files_with(bed.sent, forward.message_id)
    for sent in (got.data, copy.read_bytes()):
        assert max(len(line) for line in sent.split(b"\r\n")) <= 998
        (part,) = list(parse(sent).iter_attachments())
        assert (part.get_content_type(), part.get_filename()) == ("application/octet-stream",
                                                                  "odd.eml")
        assert part.get_content() == data


def test_a_draft_whose_message_id_the_email_package_fails_on_otherwise_is_refused_and_kept(
        bed: Bed) -> None:
    """A Message-ID with a domain literal left open ("<d3@[ >") makes the email package raise
    an UnboundLocalError, not one of those above: refused the same way, the draft kept."""
    data = malformed("d3@[ ", b"")
    bed.put_draft("1800000835.x.host:2,DS", data)
    (mid,) = bed.env.notmuch("search", "--output=messages", "subject:odd").stdout.split()
    before = bed.state()
    for call in (lambda: send.send_draft(bed.ctx, mid.removeprefix("id:")),
                 lambda: compose.save_draft(bed.ctx, draft_id=mid.removeprefix("id:"),
                                            body="new words")):
        with pytest.raises(ComposeError, match="its Message-ID header is malformed.*the "
                                               "draft is kept as it was"):
            call()
    assert bed.state() == before and bed.smtp.received == []


def test_a_multipart_with_a_transfer_encoding_the_parser_fails_on_is_named(bed: Bed) -> None:
    """The parser reads a multipart's Content-Transfer-Encoding as well as every
    Content-Type: a refusal of what it fails on names both, not Content-Type alone."""
    bed.put_draft("1800000836.x.host:2,DS", malformed(
        "multipart-cte@example.org", b"Content-Type: multipart/mixed; boundary=b\n"
        b"Content-Transfer-Encoding: 7bit " + _DEEP + b"\n\n--b\nContent-Type: text/plain\n\n"
        b"hello\n--b--"))
    bed.refused_send("multipart-cte@example.org", "a Content-Type or Content-Transfer-Encoding "
                     "header in it is malformed")


def test_a_draft_in_a_charset_python_has_no_codec_for_is_sent_as_it_is(bed: Bed) -> None:
    """A draft whose text names a charset Python has no codec for crashed sending with a
    LookupError: it goes out as its bytes are, as mutt sends it; saving it again, which
    needs its text, is refused saying why.  Header bytes in that charset are refused as
    those in any charset that does not read them."""
    data = (b"From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: odd\n"
            b"Message-ID: <nonsense@example.org>\nMIME-Version: 1.0\n"
            b"Content-Type: text/plain; charset=x-nonsense\nContent-Transfer-Encoding: 8bit\n"
            b"\nGr\xfc\xdfe\n")
    bed.put_draft("1800000831.x.host:2,DS", data)
    bed.put_draft("1800000832.x.host:2,DS", data.replace(b"nonsense@", b"undefined@").replace(
        b"x-nonsense", b"undefined").replace(b"To: bob", b"To: J\xf6rg <bob"))
    before = bed.state()
    with pytest.raises(ComposeError, match="charset 'x-nonsense', which fmail-nm cannot read; "
                                           "nothing was saved, and the draft is kept"):
        compose.save_draft(bed.ctx, draft_id="nonsense@example.org", subject="new")
    assert bed.state() == before
    bed.refused_send("undefined@example.org", "its To header has bytes that are not utf-8 nor "
                     "undefined; nothing was sent")
    send.send_draft(bed.ctx, "nonsense@example.org")
    (got,) = bed.smtp.received
    head, body = got.data.split(b"\r\n\r\n", 1)
    assert b"charset=x-nonsense" in head and body == b"Gr\xfc\xdfe\r\n"


def test_a_multipart_draft_without_a_boundary_and_8bit_text_is_refused_and_kept(
        bed: Bed) -> None:
    """Its 8-bit text, written by the email package decoded, crashed the send with a
    UnicodeEncodeError; it cannot go out as it is (an ASCII one does, see above)."""
    bed.put_draft("1800000833.x.host:2,DS", (
        b"From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: no boundary\n"
        b"Message-ID: <no-boundary-8bit@example.org>\nMIME-Version: 1.0\n"
        b"Content-Type: multipart/mixed\nContent-Transfer-Encoding: 8bit\n\nGr\xc3\xbc\xc3\x9fe\n"))
    bed.refused_send("no-boundary-8bit@example.org", r"says multipart/mixed but has no parts "
                     r"\(it names no boundary.* 8-bit bytes.*the draft is kept as it was")


def test_a_file_name_decoded_to_a_quote_mark_is_refused_not_sent_as_a_quoted_pair(
        bed: Bed) -> None:
    """An encoded word decoding to a quote mark in a raw 8-bit parameter header went out as
    filename="a\\"; filename=evil.exe": a correct quoted pair, but clients that ignore
    backslashes read another file name there."""
    bed.put_draft("1800000834.x.host:2,DS", (
        'From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: cv\n'
        'Message-ID: <quote-param@example.org>\nMIME-Version: 1.0\n'
        'Content-Type: multipart/mixed; boundary="b"\n\n--b\n'
        'Content-Type: text/plain; charset=utf-8\n\nAnbei.\n--b\n'
        'Content-Type: application/octet-stream\nContent-Disposition: attachment; '
        'filename="=?utf-8?q?a=22=3B_filename=3Devil.exe?="; x-by="Jörg"\n\nxx\n--b--\n'
    ).encode())
    bed.refused_send("quote-param@example.org", "Content-Disposition parameter filename is "
                     "'a\"; filename=evil.exe', whose quote mark")


def test_a_non_ascii_file_name_with_a_quote_mark_goes_out_percent_encoded(bed: Bed) -> None:
    """Only a value written as a quoted string holds a quoted pair: a non-ASCII file name
    goes out as an RFC 2231 parameter, its quote marks %22, which no reader takes for an
    end -- sent, not refused."""
    bed.put_draft("1800000837.x.host:2,DS", (
        'From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: cv\n'
        'Message-ID: <quote-8bit@example.org>\nMIME-Version: 1.0\n'
        'Content-Type: multipart/mixed; boundary="b"\n\n--b\n'
        'Content-Type: text/plain; charset=utf-8\n\nAnbei.\n--b\n'
        'Content-Type: application/octet-stream\nContent-Disposition: attachment; '
        'filename="Jörg \\"final\\".txt"\n\nxx\n--b--\n').encode())
    send.send_draft(bed.ctx, "quote-8bit@example.org")
    (got,) = bed.smtp.received
    assert b"filename*=utf-8''J%C3%B6rg%20%22final%22.txt" in got.data
    (part,) = parse(got.data).iter_attachments()
    assert part.get_filename() == 'Jörg "final".txt'


def test_a_reply_to_an_smtputf8_address_says_what_can_be_done(bed: Bed) -> None:
    """A reply to a sender whose address has non-ASCII letters before the @ told the model to
    write it with save_draft, which refuses that address too: it says that only a mail client
    sending SMTPUTF8 mail can answer it, and suggests no tool."""
    bed.receive(b"From: J\xc3\xb6rg <j\xc3\xb6rg@example.de>\r\nTo: alex@example.org\r\n"
                b"Subject: eai\r\nMessage-ID: <eai-2@example.de>\r\n\r\nhi\r\n")
    with pytest.raises(ComposeError) as refused:
        compose.reply_to_email(bed.ctx, "eai-2@example.de", "x")
    said = str(refused.value)
    assert "SMTPUTF8" in said and "mail client" in said and "save_draft" not in said, said


def test_a_draft_another_client_saved_with_a_line_over_998_bytes_goes_out_intact(
        bed: Bed) -> None:
    """A draft edited by hand or saved by another tool with a long 8-bit line was sent as it
    was, and the server refused it ("500 Line too long"); mutt re-encodes on sending too."""
    line = "Grüße " * 200
    bed.put_draft("1800000803.x.host:2,DS", (
        "From: Alex Morgan <alex@example.org>\r\nTo: bob@example.com\r\nSubject: long\r\n"
        "Message-ID: <long-1@example.org>\r\nMIME-Version: 1.0\r\n"
        "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
        f"{line}\r\nshort\r\n").encode())
    send.send_draft(bed.ctx, "long-1@example.org")
    (got,) = bed.smtp.received
    (copy,) = bed.files_with(bed.sent, "long-1@example.org")
    for data in (got.data, copy.read_bytes()):
        assert max(len(line) for line in data.split(b"\r\n")) <= 998
        assert body_text(parse(data)) == f"{line}\nshort\n"


def test_a_signed_draft_with_a_line_over_998_bytes_is_refused_not_re_encoded(bed: Bed) -> None:
    """Re-encoding the signed part of a draft with a long line sent it with a signature that
    no longer verified; the server would refuse it as it is."""
    line = "Grüße " * 200
    bed.put_draft("1800000804.x.host:2,DS", (
        "From: Alex Morgan <alex@example.org>\r\nTo: bob@example.com\r\nSubject: signed\r\n"
        "Message-ID: <signed-1@example.org>\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/signed; boundary="b"; micalg=pgp-sha256; '
        'protocol="application/pgp-signature"\r\n\r\n--b\r\n'
        "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
        f"{line}\r\n--b\r\nContent-Type: application/pgp-signature\r\n\r\n"
        "-----BEGIN PGP SIGNATURE-----\r\n\r\niQ==\r\n-----END PGP SIGNATURE-----\r\n"
        "--b--\r\n").encode())
    bed.refused_send("signed-1@example.org", "signed.*over 998 bytes.*nothing was sent")


def test_a_notmuch_emacs_draft_is_not_sent_as_its_markup(bed: Bed) -> None:
    """notmuch-emacs saves a draft as MML, markup only Emacs turns into mail (attachments,
    signing): sent as it is, the recipient would read the markup."""
    bed.put_draft(
        "1800000801.emacs.host:2,DS",
        b"From: Alex Morgan <alex@example.org>\nTo: bob@example.com\nSubject: report\n"
        b"Message-ID: <emacs-1@example.org>\nX-Notmuch-Emacs-Draft: True\n\n"
        b"<#secure method=pgpmime mode=sign>\nSee the report.\n"
        b"<#part filename=\"/home/alex/report.pdf\" disposition=attachment>\n<#/part>\n")
    bed.refused_send("emacs-1@example.org", "send it from Emacs")


def test_a_draft_without_message_id_is_sent_and_filed_under_one(bed: Bed) -> None:
    """A draft another client saved without a Message-ID gets one before sending, so the
    recipients' copy and the Sent copy are one message (and replies thread with it)."""
    bed.put_draft("1800000801.x.host:2,DS", NO_ID_DRAFT)
    (mid,) = bed.ctx.reader.message_ids('subject:"no id"')
    result = send.send_draft(bed.ctx, mid)
    (got,) = bed.smtp.received
    wire_id = got.message()["message-id"]
    assert wire_id and wire_id.endswith("@example.org>")
    (copy,) = [p for p in bed.sent.iterdir() if b"Subject: no id" in p.read_bytes()]
    assert parse(copy.read_bytes())["message-id"] == wire_id
    assert result.message_id == wire_id.strip("<>")
    assert bed.ctx.reader.message_ids('subject:"no id"') == [result.message_id]
    assert not [p for p in bed.drafts.iterdir() if b"Subject: no id" in p.read_bytes()]


def test_a_draft_without_message_id_from_an_8bit_domain_gets_an_ascii_one(bed: Bed) -> None:
    """Its new Message-ID was made from the raw From, before the 8-bit rewrite: in the
    Unicode domain (alex@bücher.example), which then stopped the send as non-ASCII text in
    a Message-ID.  It is made from the From as it goes out, its domain in ACE."""
    add_my_address(bed, IDN_ME, "personal")
    with bed.smtp.rc.open("a") as rc:  # msmtp picks the account by the envelope sender
        rc.write(f"account idn\nfrom {ACE_ME}\n")
    bed.put_draft("1800000802.x.host:2,DS", NO_ID_DRAFT.replace(
        b"alex@example.org", IDN_ME.encode()).replace(b"no id", b"no id idn"))
    (mid,) = bed.ctx.reader.message_ids('subject:"no id idn"')
    send.send_draft(bed.ctx, mid)
    (got,) = bed.smtp.received
    assert got.mail_from == ACE_ME
    assert str(got.message()["message-id"]).endswith("@xn--bcher-kva.example>")


def test_a_flowed_draft_saved_again_keeps_its_paragraphs(bed: Bed) -> None:
    """aerc and Thunderbird write format=flowed: a line ending in a space goes on in the
    next. Saved again, the draft's paragraph stays one paragraph."""
    bed.put_draft(
        "1800000802.aerc.host:2,DS",
        b"From: Alex Morgan <alex@example.org>\r\nTo: bob@example.com\r\nSubject: flowed\r\n"
        b"Message-ID: <aerc-1@example.org>\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: text/plain; charset=UTF-8; format=flowed\r\n\r\n"
        b"This is one paragraph that \r\nwraps over two lines.\r\n\r\n> quoted \r\n> too\r\n")
    compose.save_draft(bed.ctx, cc=["carol@example.com"], draft_id="aerc-1@example.org")
    assert bed.draft_body("aerc-1@example.org") == (
        "This is one paragraph that wraps over two lines.\n\n> quoted too\n")


def test_saving_a_draft_again_keeps_a_long_non_ascii_name(bed: Bed) -> None:
    name = "Zoë Müller-Lüdenscheidt-Oberammergau-Partenkirchen-Garmisch-Berchtesgaden"
    draft = compose.save_draft(bed.ctx, [f'"{name}" <zoe@example.net>'], subject="s", body="1")
    (path,) = bed.files_with(bed.drafts, draft.message_id)
    assert rfc2047_phrase(path.read_bytes(), "To") == f"{name} <zoe@example.net>"
    compose.save_draft(bed.ctx, body="2", draft_id=draft.message_id)
    (path,) = bed.files_with(bed.drafts, draft.message_id)
    assert rfc2047_phrase(path.read_bytes(), "To") == f"{name} <zoe@example.net>"


@pytest.mark.parametrize("cc", ["ops@intranet", '"john smith"@example.com',
                                "taro.@docomo.ne.jp", "j\u00f6rg@example.de"])
def test_a_reply_is_not_refused_for_an_address_it_does_not_use(bed: Bed, cc: str) -> None:
    """An address fmail-nm cannot send to, in the Cc of mail the user answers, stops a
    reply-all (which names it, and how to go on) but not a reply to the sender."""
    bed.receive((f"From: Bob <bob@example.com>\r\nTo: alex@example.org\r\nCc: {cc}\r\n"
                 f"Subject: q\r\nMessage-ID: <oddcc@example.com>\r\n\r\nhi\r\n").encode())
    draft = compose.reply_to_email(bed.ctx, "oddcc@example.com", "x")
    assert draft.to == ["bob@example.com"] and draft.cc == []
    with pytest.raises(ComposeError, match="without reply_all.*save_draft"):
        compose.reply_to_email(bed.ctx, "oddcc@example.com", "x", reply_all=True)


def test_a_reply_quotes_an_interleaved_answer_with_what_it_answers(bed: Bed) -> None:
    """Quoting leaves out the history below a message, but not the quoted lines its writer
    answered in between: without them "No." and "Yes." answer nothing."""
    bed.receive(b"From: Bob <bob@example.com>\r\nTo: alex@example.org\r\nSubject: Re: plan\r\n"
                b"Message-ID: <il-1@example.com>\r\nDate: Tue, 02 Jan 2024 09:01:00 +0000\r\n"
                b"\r\nOn Mon, 1 Jan 2024, Alex wrote:\r\n> Can you do Monday?\r\nNo.\r\n\r\n"
                b"> Tuesday then?\r\nYes.\r\n\r\n> Thanks,\r\n> Alex\r\n")
    body = bed.draft_body(compose.reply_to_email(bed.ctx, "il-1@example.com", "ok").message_id)
    assert body == ("ok\n\nOn Tue, 02 Jan 2024 at 09:01 +0000, Bob wrote:\n"
                    "> On Mon, 1 Jan 2024, Alex wrote:\n> > Can you do Monday?\n> No.\n>\n"
                    "> > Tuesday then?\n> Yes.\n")


@pytest.mark.parametrize(("date", "shown"), [
    ("Tue, 01 Dec 2026 10:00:00 +0100", "On Tue, 01 Dec 2026 at 10:00 +0100, Bob wrote:"),
    ("Mon, 30 Nov 2026 22:30:00 -0800", "On Mon, 30 Nov 2026 at 22:30 -0800, Bob wrote:"),
    ("Tue, 01 Dec 2026 09:00:00 -0000", "On Tue, 01 Dec 2026 at 09:00 UTC, Bob wrote:"),
    ("Tue, 01 Dec 2026 09:00:00", "On Tue, 01 Dec 2026 at 09:00 UTC, Bob wrote:"),
    ("yesterday", "Bob wrote:"),
])
def test_a_replys_attribution_dates_the_original_as_its_sender_wrote_it(
        bed: Bed, date: str, shown: str) -> None:
    """As mutt's: the original's time in its sender's zone, with the offset; a date that
    names no zone ("-0000", none) in UTC; one that cannot be read leaves the date out."""
    bed.receive(f"From: Bob <bob@example.com>\r\nTo: alex@example.org\r\nSubject: tz\r\n"
                f"Message-ID: <tz@example.com>\r\nDate: {date}\r\n\r\nSee you.\r\n".encode())
    body = bed.draft_body(compose.reply_to_email(bed.ctx, "tz@example.com", "ok").message_id)
    assert body == f"ok\n\n{shown}\n> See you.\n"


@pytest.mark.parametrize("command", [
    ["msmtp", "-fbounce@example.org"], ["msmtp", "-f", "bounce@example.org"],
    ["msmtp", "--from=bounce@example.org"], ["msmtp", "--read-envelope-from"]])
def test_a_command_that_sets_the_envelope_sender_keeps_it(command: list[str]) -> None:
    """msmtp takes the last -f it is given: one added after the user's would override it,
    in whichever form the user wrote it (-fADDR is one argument)."""
    out = SimpleNamespace(envelope_from="alex@example.org", recipients=("bob@example.com",))
    assert send.argv_for(command, out) == [*command, "--", "bob@example.com"]  # type: ignore[arg-type]
    out_of_mine = send.argv_for(["msmtp", "-a", "personal"], out)  # type: ignore[arg-type]
    assert out_of_mine == ["msmtp", "-a", "personal", "-f", "alex@example.org", "--",
                           "bob@example.com"]


def test_a_draft_without_message_id_saved_again_gets_a_real_one(bed: Bed) -> None:
    """notmuch names a message without a Message-ID by a hash of its file; saved again, the
    draft gets a Message-ID of its own (the hash is no address anyone can reply to) and
    replaces the old file."""
    bed.put_draft("1800000803.x.host:2,DS", NO_ID_DRAFT)
    (made_up,) = bed.ctx.reader.message_ids('subject:"no id"')
    assert made_up.startswith("notmuch-sha1-")
    saved = compose.save_draft(bed.ctx, body="hello", draft_id=made_up)
    assert saved.message_id.endswith("@example.org")
    assert bed.ctx.reader.message_ids('subject:"no id"') == [saved.message_id]
    (path,) = [p for p in bed.drafts.iterdir() if b"Subject: no id" in p.read_bytes()]
    assert parse(path.read_bytes())["message-id"] == f"<{saved.message_id}>"


# ---------------------------------------------------------------------------------------------
# On the wire: lines of at most 998 bytes, headers only as written, ids folded whole

LONG_TEXT = "Zoë's table: " + ", ".join(f"cell {i}" for i in range(200))  # one line, 1.4 kB
LONG_CSV = ";".join(str(i) for i in range(400))  # one line, 1.5 kB, 7bit
LONG_MAIL = (
    "From: Zoe <zoe@example.net>\r\nTo: alex@example.org\r\nSubject: the table\r\n"
    "Message-ID: <long-1@example.net>\r\nDate: Tue, 02 Jan 2024 09:01:00 +0000\r\n"
    "X-Tokens: " + " ".join(f"t{i}" for i in range(300)) + "\r\n"  # one 1.3 kB header line
    "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=B\r\n\r\n"
    "--B\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
    f"Hello,\r\n{LONG_TEXT}\r\nbye\r\n"
    "--B\r\nContent-Type: text/csv\r\nContent-Disposition: attachment; filename=t.csv\r\n\r\n"
    f"{LONG_CSV}\r\n"
    "--B\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"  # a lone CR is content too
    f"carriage\rreturn {LONG_CSV}\r\n"
    "--B--\r\n").encode()


def parts(msg: EmailMessage) -> list[tuple[str, bytes]]:
    """Each leaf part's type and decoded content, line ends as LF."""
    return [(p.get_content_type(), cast(bytes, p.get_payload(decode=True)).replace(b"\r\n", b"\n"))
            for p in msg.walk() if not p.is_multipart()]


def attached(data: bytes) -> EmailMessage:
    msg = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    (part,) = list(msg.iter_attachments())
    inner = part.get_content()
    assert isinstance(inner, EmailMessage)
    return inner


def test_a_forward_of_mail_with_lines_over_998_bytes_goes_out_intact(bed: Bed) -> None:
    """RFC 5322 2.1.1: no line over 998 bytes; the forwarded original had them (a text part,
    a 7bit attachment, a header), so the server refused the forward. Re-encoded inside the
    attached message, the content stays the same."""
    bed.receive(LONG_MAIL)
    draft = compose.forward_email(bed.ctx, "long-1@example.net", ["frank@example.com"], "FYI")
    send.send_draft(bed.ctx, draft.message_id)

    (got,) = bed.smtp.received
    (copy,) = bed.files_with(bed.sent, draft.message_id)
    original = email.message_from_bytes(LONG_MAIL, policy=email.policy.default)
    assert isinstance(original, EmailMessage)
    for data in (got.data, copy.read_bytes()):
        assert max(len(line) for line in data.split(b"\r\n")) <= 998
        inner = attached(data)
        assert parts(inner) == parts(original)
        for name in ("from", "subject", "message-id", "date", "x-tokens"):
            assert str(inner[name]) == str(original[name])


def test_a_forward_folds_a_long_header_without_decoding_it(bed: Bed) -> None:
    """A header line over 998 bytes was written again from its decoded value: an encoded line
    break in it started a header of its own in the forwarded message."""
    words = " ".join(f"w{i}" for i in range(300))
    hidden = "=?utf-8?q?Example=0D=0AX-Injected:_1?="
    bed.receive(("From: Zoe <zoe@example.net>\r\nTo: alex@example.org\r\nSubject: long\r\n"
                 "Message-ID: <long-2@example.net>\r\n"
                 f"X-Long: {hidden} {words}\r\n\r\nHello.\r\n").encode())
    draft = compose.forward_email(bed.ctx, "long-2@example.net", ["frank@example.com"], "FYI")
    (path,) = bed.files_with(bed.drafts, draft.message_id)
    data = path.read_bytes()
    assert max(len(line) for line in data.split(b"\r\n")) <= 998
    assert no_header_line(data.split(b"message/rfc822", 1)[1].split(b"\r\n\r\n", 1)[1],
                          b"x-injected")
    long = re.search(rb"\r\nX-Long: (.*?)\r\n(?![ \t])", data, re.S)
    assert long is not None and long[1].replace(b"\r\n", b"") == f"{hidden} {words}".encode()


def test_a_forward_of_the_users_own_mail_does_not_reveal_its_bcc(bed: Bed) -> None:
    """The Sent copy keeps its Bcc (as mutt's does); forwarded whole, that copy told the new
    recipients who had been sent it blind."""
    mine = compose.save_draft(bed.ctx, ["bob@example.com"], bcc=["Secret <secret@example.com>"],
                              subject="plan", body="the plan")
    send.send_draft(bed.ctx, mine.message_id)
    forward = compose.forward_email(bed.ctx, mine.message_id, ["frank@example.com"], "FYI")
    send.send_draft(bed.ctx, forward.message_id)

    got = bed.smtp.received[-1]
    (copy,) = bed.files_with(bed.sent, forward.message_id)
    for data in (got.data, copy.read_bytes()):
        assert b"secret@example.com" not in data
        inner = attached(data)
        assert (str(inner["to"]), str(inner["subject"])) == ("bob@example.com", "plan")
        assert inner.get_content().replace("\r\n", "\n") == "the plan\n"


# Resent-Bcc lines (RFC 5322 3.6.6), one folded, in any case: the recipients a resending hid.
_RESENT_BCC = (b"Resent-Bcc: Hidden <hidden@example.com>,\r\n  also-hidden@example.com\r\n"
               b"RESENT-bcc: third-hidden@example.com\r\nresent-bcc:\r\n")


def _attached_as_sent(bed: Bed, forward_id: str) -> list[bytes]:
    """The bytes of the message a sent forward attached, as the recipients got it and as
    the Sent copy keeps it."""
    (copy,) = bed.files_with(bed.sent, forward_id)
    found = []
    for data in (bed.smtp.received[-1].data, copy.read_bytes()):
        (part,) = list(parse(data).iter_attachments())
        inner = part.get_content()
        found.append(inner.as_bytes() if isinstance(inner, EmailMessage) else inner)
    return found


@pytest.mark.parametrize("extra", [b"", UNPARSABLE["parameter"].replace(b"\n", b"\r\n")],
                         ids=["message/rfc822", "eml-file"])
def test_a_forward_does_not_reveal_the_originals_resent_bcc(bed: Bed, extra: bytes) -> None:
    """A forward cut the original's Bcc lines but sent its Resent-Bcc lines as they were:
    whom a resending of it went to blind was told to the forward's recipients -- attached
    as message/rfc822 and as the .eml file of mail the email package fails on alike."""
    mid = f"resent-{len(extra)}@example.net"
    bed.receive(malformed(mid, b"").replace(b"\n", b"\r\n").replace(
        b"Subject:", _RESENT_BCC + b"Resent-To: frank@example.com\r\n" + extra + b"Subject:"))
    forward = compose.forward_email(bed.ctx, mid, ["frank@example.com"], "FYI")
    send.send_draft(bed.ctx, forward.message_id)

    for inner in _attached_as_sent(bed, forward.message_id):
        assert b"hidden@example.com" not in inner and b"resent-bcc" not in inner.lower()
        assert b"Resent-To: frank@example.com" in inner and b"Subject: odd" in inner


# Bcc and Resent-Bcc lines (one folded) after a line ended by a lone CR, which the email
# package and some mail readers take for a line end as they do LF and CRLF.
_BLIND_AFTER_CR = (b"X-Note: hi\rBcc: Hidden <hidden@example.com>,\r also-hidden@example.com\r"
                   b"Resent-Bcc: third-hidden@example.com\rX-After: kept\r\n")


@pytest.mark.parametrize("extra", [b"", UNPARSABLE["parameter"].replace(b"\n", b"\r\n")],
                         ids=["message/rfc822", "eml-file"])
def test_a_forward_does_not_reveal_a_bcc_after_a_lone_cr(bed: Bed, extra: bytes) -> None:
    """The .eml file of mail the email package fails on had its Bcc lines cut where a line
    starts after LF only: one after a lone CR went to the forward's recipients, whose mail
    reader shows it as a header of its own."""
    mid = f"lone-cr-{len(extra)}@example.net"
    bed.receive(malformed(mid, b"").replace(b"\n", b"\r\n").replace(
        b"Subject:", _BLIND_AFTER_CR + extra + b"Subject:"))
    forward = compose.forward_email(bed.ctx, mid, ["frank@example.com"], "FYI")
    send.send_draft(bed.ctx, forward.message_id)

    for inner in _attached_as_sent(bed, forward.message_id):
        assert b"hidden@example.com" not in inner and b"bcc" not in inner.lower()
        assert b"X-After: kept" in inner and b"Subject: odd" in inner


def test_a_forward_keeps_the_body_after_a_header_block_ended_by_a_lone_cr(bed: Bed) -> None:
    """The .eml file's header block ended at the first empty line between LFs only: one
    ended by a lone CR ("\\r\\r\\n") was missed, and a body line "Bcc: ..." after it, text
    the mail reader shows as such, was cut from the mail forwarded to report it."""
    mid = "lone-cr-body@example.net"
    data = malformed(mid, UNPARSABLE["parameter"]).replace(b"\n", b"\r\n").replace(
        b"\r\n\r\nhello", b"\r\r\nBcc: text in the body\r\n\r\nhello")
    bed.receive(data)
    forward = compose.forward_email(bed.ctx, mid, ["frank@example.com"], "FYI")
    send.send_draft(bed.ctx, forward.message_id)

    assert _attached_as_sent(bed, forward.message_id) == [data, data]


def test_a_forward_keeps_the_header_block_ended_after_a_bcc_cut_after_a_lone_cr(
        bed: Bed) -> None:
    """A Bcc line cut from the .eml file with its own line end, between a line ended by a
    lone CR and the empty line (LF) ending the header block, joined the two into one CRLF:
    the empty line was gone, and the body's lines read as more header lines."""
    mid = "lone-cr-last@example.net"
    data = malformed(mid, UNPARSABLE["parameter"] + b"X-Last: kept\rBcc: hidden@example.com\n")
    bed.receive(data)
    forward = compose.forward_email(bed.ctx, mid, ["frank@example.com"], "FYI")
    send.send_draft(bed.ctx, forward.message_id)

    kept = data.replace(b"\rBcc: hidden@example.com", b"")
    assert kept.endswith(b"X-Last: kept\n\nhello\n")
    assert _attached_as_sent(bed, forward.message_id) == [kept, kept]


def test_a_drafts_resent_bcc_never_reaches_the_wire(bed: Bed) -> None:
    """A draft carrying Resent-Bcc (another client's, or mail edited as new): Bcc was cut
    from what went out, Resent-Bcc went as it was, naming those hidden to every recipient.
    It is cut too; its addresses are no recipients (those are To, Cc and Bcc), and the
    user's Sent copy keeps the draft's header as its Bcc is kept."""
    bed.put_draft("1800000860.mutt.host:2,DS", malformed("resent-draft@example.org", b"")
                  .replace(b"\n", b"\r\n").replace(b"Subject:", _RESENT_BCC + b"Subject:"))
    send.send_draft(bed.ctx, "resent-draft@example.org")
    (got,) = bed.smtp.received
    assert got.rcpt_tos == ("bob@example.com",)
    assert b"hidden@example.com" not in got.data and no_header_line(got.data, b"resent-bcc")
    (copy,) = bed.files_with(bed.sent, "resent-draft@example.org")
    assert b"Resent-Bcc: Hidden <hidden@example.com>" in copy.read_bytes()


# What mail decodes to: text that looks like an RFC 2047 word hiding a line break and a Bcc.
HIDDEN_BCC = "=?utf-8?q?=0D=0ABcc:_spy@evil.example?="


def q_word(text: str) -> str:
    """``text`` as one Q-encoded word, every character but letters and digits encoded."""
    return "=?utf-8?q?" + "".join(c if c.isalnum() else f"={ord(c):02X}" for c in text) + "?="


# A Bcc after a line the email package takes for the end of the header block: "Bcc :" (the
# space RFC 5322's obsolete syntax allows), a line without a colon before it.
BCC_PAST_A_NON_HEADER = {"space-colon": b"Bcc : Hidden <hidden@example.com>\r\n",
                         "no-colon": b"X garbled line\r\nBcc: hidden@example.com\r\n"}


@pytest.mark.parametrize("case", list(BCC_PAST_A_NON_HEADER))
def test_a_forward_does_not_reveal_a_bcc_after_a_line_that_is_no_header(
        bed: Bed, case: str) -> None:
    """The email package ends the header block at such a line and writes the rest as the
    body: the attached message went out with its Bcc as text the recipients read (its To and
    Subject too).  It goes as its bytes but for its Bcc lines, as mail the package cannot
    read does."""
    mid = f"bcc-{case}@example.net"
    bed.receive(malformed(mid, b"").replace(b"\n", b"\r\n").replace(
        b"Subject:", BCC_PAST_A_NON_HEADER[case] + b"Subject:"))
    forward = compose.forward_email(bed.ctx, mid, ["frank@example.com"], "FYI")
    send.send_draft(bed.ctx, forward.message_id)
    for inner in _attached_as_sent(bed, forward.message_id):
        assert b"hidden@example.com" not in inner and b"Subject: odd" in inner


@pytest.mark.parametrize("case", list(BCC_PAST_A_NON_HEADER))
def test_a_draft_with_a_bcc_after_a_line_that_is_no_header_is_refused_and_kept(
        bed: Bed, case: str) -> None:
    """The draft went out with that line and every header after it as its text: the Bcc
    named to all, and not sent to.  It is refused, the draft kept."""
    mid = f"draft-bcc-{case}@example.org"
    bed.put_draft(f"1800000870.{case}.host:2,DS", malformed(mid, b"").replace(
        b"\n", b"\r\n").replace(b"Subject:", BCC_PAST_A_NON_HEADER[case] + b"Subject:"))
    bed.refused_send(mid, "no header")


def no_header_line(data: bytes, name: bytes) -> bool:
    head = data.split(b"\r\n\r\n", 1)[0]
    return not any(line.lower().startswith(name + b":") for line in head.split(b"\r\n"))


def test_a_reply_to_hostile_mail_does_not_write_a_header_of_its_own(bed: Bed) -> None:
    """A subject or sender name that decodes to text like an encoded word: the email package
    decoded it a second time when writing the reply, so its line break started a header --
    the reply went to spy@evil.example blind when sent."""
    bed.receive((f"From: {q_word('Mallory ' + HIDDEN_BCC)} <mallory@example.com>\r\n"
                 f"To: alex@example.org\r\nSubject: {q_word('Invoice ' + HIDDEN_BCC)}\r\n"
                 "Message-ID: <hostile-1@example.com>\r\n\r\nPay now.\r\n").encode())
    draft = compose.reply_to_email(bed.ctx, "hostile-1@example.com", "No.")
    assert draft.subject == f"Re: Invoice {HIDDEN_BCC}"
    send.send_draft(bed.ctx, draft.message_id)

    (got,) = bed.smtp.received
    assert got.rcpt_tos == ("mallory@example.com",)
    (copy,) = bed.files_with(bed.sent, draft.message_id)
    for data in (got.data, copy.read_bytes()):
        assert no_header_line(data, b"bcc")
        msg = email.message_from_bytes(data, policy=email.policy.default)
        assert [a.addr_spec for a in msg["to"].addresses] == ["mallory@example.com"]
        assert str(msg["subject"]) == f"Re: Invoice {HIDDEN_BCC}"


def test_a_subject_the_model_writes_is_sent_as_written(bed: Bed) -> None:
    """The same through save_draft: the subject is the caller's text, read back as it was."""
    draft = compose.save_draft(bed.ctx, ["bob@example.com"], subject=f"hi {HIDDEN_BCC}",
                               body="b")
    send.send_draft(bed.ctx, draft.message_id)
    (got,) = bed.smtp.received
    assert got.rcpt_tos == ("bob@example.com",)
    assert str(got.message()["subject"]) == f"hi {HIDDEN_BCC}"
    assert no_header_line(got.data, b"bcc")


# As Microsoft 365 and Amazon SES write them: longer than fits a 78-column line after
# "In-Reply-To: ".
LONG_ID = "DB9PR10MB7289F1B9C0C9E0E1A8F2C4E5B8A62@DB9PR10MB7289.EURPRD10.PROD.OUTLOOK.COM"
SES_ID = "0100018c1a2b3c4d-5e6f7a8b-9c0d-1e2f-3a4b-5c6d7e8f9a0b-000000@email.amazonses.com"


def test_a_reply_to_mail_with_a_long_message_id_threads_everywhere(bed: Bed) -> None:
    """The email package folded In-Reply-To and References as RFC 2047 encoded words once an
    id did not fit the line -- no msg-id in those for the recipients' mail clients, so the
    reply did not thread there (notmuch, reading the draft, still threaded it)."""
    bed.receive((f"From: Priya <priya@acme.test>\r\nTo: alex@example.org\r\nSubject: Q4\r\n"
                 f"Message-ID: <{LONG_ID}>\r\nIn-Reply-To: <{SES_ID}>\r\n"
                 f"References: <root@acme.test> <{SES_ID}>\r\n\r\nNumbers?\r\n").encode())
    draft = compose.reply_to_email(bed.ctx, LONG_ID, "Attached.")
    send.send_draft(bed.ctx, draft.message_id)

    (got,) = bed.smtp.received
    (copy,) = bed.files_with(bed.sent, draft.message_id)
    for data in (got.data, copy.read_bytes()):
        head = header_block(data).replace("\r\n ", " ")  # unfolded
        assert f"\r\nIn-Reply-To: <{LONG_ID}>\r\n" in head
        assert f"\r\nReferences: <root@acme.test> <{SES_ID}> <{LONG_ID}>\r\n" in head
        assert "=?" not in head
    assert max(len(line) for line in header_block(got.data).split("\r\n")) <= 998
    sent = bed.ctx.reader.find(draft.message_id)
    original = bed.ctx.reader.find(LONG_ID)
    assert sent is not None and original is not None and sent.thread_id == original.thread_id


def test_a_forward_names_a_long_message_id_as_it_is(bed: Bed) -> None:
    bed.receive((f"From: Priya <priya@acme.test>\r\nTo: alex@example.org\r\nSubject: Q4\r\n"
                 f"Message-ID: <{LONG_ID}>\r\n\r\nNumbers.\r\n").encode())
    draft = compose.forward_email(bed.ctx, LONG_ID, ["frank@example.com"])
    send.send_draft(bed.ctx, draft.message_id)
    (got,) = bed.smtp.received
    assert f"\r\nX-Forwarded-Message-Id: <{LONG_ID}>\r\n" in header_block(got.data)
    assert "passed" in bed.tags(LONG_ID)


def test_an_eml_file_attached_goes_out_as_a_message_readers_open(bed: Bed) -> None:
    """A saved mail (.eml) is message/rfc822, which may not be base64 (RFC 2046 5.2.1); sent
    base64, Python's parser read an empty message and notmuch a part it cannot show."""
    saved = (b"From: Zoe <zoe@example.net>\r\nTo: alex@example.org\r\nSubject: inner\r\n"
             b"Message-ID: <inner-1@example.net>\r\n\r\nhello inner\r\n")
    (bed.attachments / "note.eml").write_bytes(saved)
    draft = compose.save_draft(bed.ctx, ["bob@example.com"], subject="the mail", body="see",
                               attachments=["note.eml"])
    send.send_draft(bed.ctx, draft.message_id)

    (got,) = bed.smtp.received
    (copy,) = bed.files_with(bed.sent, draft.message_id)
    for data in (got.data, copy.read_bytes()):
        msg = email.message_from_bytes(data, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        (part,) = list(msg.iter_attachments())
        assert part.get_filename() == "note.eml"
        assert part["content-transfer-encoding"] in (None, "7bit", "8bit")
        inner = attached(data)
        assert (str(inner["subject"]), str(inner["message-id"])) == ("inner",
                                                                     "<inner-1@example.net>")
        assert inner.get_content().replace("\r\n", "\n") == "hello inner\n"
    shown = bed.env.notmuch("show", "--format=text", f"id:{draft.message_id}").stdout
    assert "hello inner" in shown


def test_a_reply_to_a_huge_message_quotes_its_start_and_says_so(bed: Bed) -> None:
    lines = "".join(f"log line {i:06d}\r\n" for i in range(20_000))  # 320 KB
    bed.receive(b"From: Jo <jo@example.net>\r\nTo: alex@example.org\r\nSubject: Log\r\n"
                b"Message-ID: <log@example.net>\r\n\r\n" + lines.encode())
    draft = compose.reply_to_email(bed.ctx, "log@example.net", "Seen.")
    body = bed.draft_body(draft.message_id)
    assert body.startswith("Seen.\n\nJo wrote:\n> log line 000000\n")
    quoted_lines = compose.MAX_QUOTED_CHARS // len("log line 000000\n")
    assert f"> log line {quoted_lines - 1:06d}\n" in body
    assert f"line {quoted_lines + 1:06d}" not in body
    left = 20_000 * len("log line 000000\n") - 1 - compose.MAX_QUOTED_CHARS  # (the last \n)
    assert body.endswith(f">\n> [… {left:,} more characters of the original not quoted]\n")


def test_a_reply_to_a_subject_of_kilobytes_keeps_it_and_answers_in_short(bed: Bed) -> None:
    bed.receive(b"From: Jo <jo@example.net>\r\nTo: alex@example.org\r\nSubject: " + b"S" * 5000
                + b"\r\nMessage-ID: <long@example.net>\r\n\r\nHi\r\n")
    draft = compose.reply_to_email(bed.ctx, "long@example.net", "Hi.")
    assert draft.subject == "Re: " + "S" * 1996 + "… (5004 characters)"
    saved = parse(bed.files_with(bed.drafts, draft.message_id)[0].read_bytes())
    assert str(saved["Subject"]) == "Re: " + "S" * 5000


def _mass_mailing(mid: str, to: str, cc: str = "", padding: int = 0,
                  sender: str = "Boss <boss@example.com>") -> bytes:
    """Mail from ``sender``, To and Cc last after ``padding`` bytes of other headers."""
    pad = "".join(f"X-Pad: {'x' * 990}\r\n" for _ in range(padding // 1000))
    return (f"From: {sender}\r\nSubject: all hands\r\n"
            f"Message-ID: <{mid}>\r\n{pad}To: {to}\r\n"
            + (f"Cc: {cc}\r\n" if cc else "") + "\r\nhi\r\n").encode()


def test_recipients_past_64_kb_all_count_and_a_reply_to_everyone_is_refused_saying_why(
        bed: Bed) -> None:
    """A mass mailing's visible To/Cc runs past 64 KB: every recipient counts in get_email,
    a reply to everyone is refused for its size (not for an address cut in two) and changes
    nothing, a reply to the sender goes; a header too long to read whole stops reply_all by
    name and size -- nobody is left out of a reply unsaid."""
    people = [f'"Person {i}, Team {i % 7}" <person{i}@example.com>' for i in range(2600)]
    bed.receive(_mass_mailing("mass-1@example.com", ", ".join(people[:2000]),
                              ", ".join(["alex@example.org", *people[2000:]])))
    # A To running past the end of a header block of more than 1 MB:
    bed.receive(_mass_mailing("mass-2@example.com", ", ".join(people[:1000]), padding=1_030_000))
    quoted = '"' + ", ".join(f"q{i}@example.com" for i in range(5000))  # a quote never closed
    bed.receive(_mass_mailing("mass-3@example.com", "bob@example.com", quoted))

    shown = reads.get_email(reads.Mailbox(bed.ctx.config, bed.ctx.reader), "mass-1@example.com")
    assert shown.to[0] == "Person 0, Team 0 <person0@example.com>"
    assert shown.to[-1].startswith("… 1950 more: ") and shown.cc[-1].startswith("… 551 more: ")

    before = bed.state()
    with pytest.raises(ComposeError, match=r"to 2,601 people.*at most 100 recipients.*"
                                           r"without reply_all"):
        compose.reply_to_email(bed.ctx, "mass-1@example.com", "x", reply_all=True)
    with pytest.raises(ComposeError, match=r"header to: the header block is longer than "
                                           r"1024 KB.*without reply_all"):
        compose.reply_to_email(bed.ctx, "mass-2@example.com", "x", reply_all=True)
    with pytest.raises(ComposeError, match=r"header cc: [\d,]+ characters without a comma"):
        compose.reply_to_email(bed.ctx, "mass-3@example.com", "x", reply_all=True)
    assert bed.state() == before
    for mid in ("mass-1@example.com", "mass-2@example.com", "mass-3@example.com"):
        draft = compose.reply_to_email(bed.ctx, mid, "x")
        assert (draft.to, draft.cc) == (["boss@example.com"], [])


def test_a_reply_to_the_users_own_mail_whose_recipients_were_cut_is_refused_saying_why(
        bed: Bed) -> None:
    """Even without reply_all, a reply to the user's own mail goes to its To (to its Cc when
    the To names only the user): one of those not read whole -- the header block cut inside
    it, a quote never closed -- stops the reply by name, saying what to do, and changes
    nothing."""
    me = "Alex Morgan <alex@example.org>"
    people = ", ".join(f"p{i}@example.com" for i in range(120))  # 90 read before 1 MB
    bed.receive(_mass_mailing("own-cut-1@example.org", people, padding=1_048_000, sender=me))
    quoted = '"' + ", ".join(f"q{i}@example.com" for i in range(5000))
    bed.receive(_mass_mailing("own-cut-2@example.org", f"bob@example.com, {quoted}",
                              sender=me))
    bed.receive(_mass_mailing("own-cut-3@example.org", "alex@example.org",
                              f"bob@example.com, {quoted}", sender=me))
    before = bed.state()
    for mid, why in (("own-cut-1", "to: the header block is longer than 1024 KB"),
                     ("own-cut-2", r"to: [\d,]+ characters without a comma"),
                     ("own-cut-3", r"cc: [\d,]+ characters without a comma")):
        with pytest.raises(ComposeError, match=rf"header {why}.*write the recipients "
                                               r"yourself with save_draft"):
            compose.reply_to_email(bed.ctx, f"{mid}@example.org", "x")
    assert bed.state() == before


def test_a_reply_to_the_users_own_mail_is_not_stopped_by_a_cc_it_does_not_use(bed: Bed) -> None:
    """The Cc of the user's own mail is whom a plain reply goes to only when the To names
    the user alone: a Cc cut or never closed, beside a To naming someone, stops no reply;
    nor does such a To stop a reply to mail from someone else."""
    me = "Alex Morgan <alex@example.org>"
    quoted = '"' + ", ".join(f"q{i}@example.com" for i in range(5000))
    people = ", ".join(f"p{i}@example.com" for i in range(120))
    bed.receive(_mass_mailing("own-cc-1@example.org", "bob@example.com",
                              f"carol@example.com, {quoted}", sender=me))
    bed.receive(_mass_mailing("own-cc-2@example.org", "bob@example.com", people,
                              padding=1_048_000, sender=me))
    bed.receive(_mass_mailing("their-to@example.org", f"alex@example.org, {quoted}"))
    for mid in ("own-cc-1", "own-cc-2"):
        draft = compose.reply_to_email(bed.ctx, f"{mid}@example.org", "x")
        assert (draft.to, draft.cc) == (["bob@example.com"], [])
    draft = compose.reply_to_email(bed.ctx, "their-to@example.org", "x")
    assert draft.to and not draft.cc


def nested(mid: str, depth: int) -> bytes:
    """A mail whose text is ``depth`` multipart/mixed parts down."""
    opening = b"".join(f'Content-Type: multipart/mixed; boundary="b{i}"\r\n\r\n--b{i}\r\n'.encode()
                       for i in range(depth))
    closing = b"".join(f"\r\n--b{i}--\r\n".encode() for i in reversed(range(depth)))
    return (b"From: Zoe <zoe@example.net>\r\nTo: alex@example.org\r\nSubject: deep\r\n"
            + f"Message-ID: <{mid}>\r\nMIME-Version: 1.0\r\n".encode() + opening
            + b"Content-Type: text/plain\r\n\r\nhello deep\r\n" + closing)


@pytest.mark.parametrize("depth", [300, 1500])
def test_mail_with_hundreds_of_nested_parts_reads_replies_and_forwards(
        bed: Bed, depth: int) -> None:
    """Parts nested hundreds deep: forwarding it crashed with a RecursionError where the email
    package wrote it (300 deep), or was refused (1500, where it fails parsing it). Reads and
    the mirror follow 32 levels; the forward attaches it as its bytes and goes out."""
    mid = f"deep-{depth}@example.net"
    data = nested(mid, depth)
    bed.receive(data)
    sync_sidecar(bed.ctx.config, bed.ctx.reader)
    assert "nesting deeper than 32" in " ".join(reads.get_email(bed.mailbox(), mid).problems)
    assert reads.get_thread(bed.mailbox(), mid).messages
    (path,) = bed.ctx.reader.find(mid).filenames  # type: ignore[union-attr]
    assert mirror.parse_file([path]).recipients
    reply = compose.reply_to_email(bed.ctx, mid, "seen")
    assert "seen" in bed.draft_body(reply.message_id)
    forward = compose.forward_email(bed.ctx, mid, ["abuse@example.com"], "see attached")
    send.send_draft(bed.ctx, forward.message_id)
    (got,) = bed.smtp.received
    (part,) = list(parse(got.data).iter_attachments())
    assert (part.get_content_type(), part.get_content()) == ("application/octet-stream", data)


# Ways to hold mail: as it is, attached (message/rfc822), attached in a multipart.
WRAPPED = {"none": lambda data: data,
           "attached": lambda data: b"Content-Type: message/rfc822\r\n\r\n" + data,
           "in-multipart": lambda data: (
               b"Content-Type: multipart/mixed; boundary=w\r\n\r\n--w\r\n"
               b"Content-Type: message/rfc822\r\n\r\n" + data + b"\r\n--w--\r\n")}


@pytest.mark.parametrize("wrapped", list(WRAPPED))
@pytest.mark.parametrize("depth", [33, 900])
def test_mail_nested_past_32_levels_is_attached_as_its_bytes_before_the_email_package_reads_it(
        monkeypatch: pytest.MonkeyPatch, depth: int, wrapped: str) -> None:
    """Forwarding mail nested 900 deep spent over a second in the email package's parser
    before the depth check sent it as its bytes: fmail-nm's own splitter, which follows 32
    levels, decides first -- the email package is not asked (here: it would fail).  Inside
    an attached message too, which the splitter did not follow: the package parsed it."""
    data = WRAPPED[wrapped](nested("deep-part@example.net", depth))

    def unasked(data: bytes, whose: object, read: object = None) -> None:
        raise AssertionError("the email package parsed mail nested past 32 levels")

    monkeypatch.setattr(compose, "_parsed", unasked)
    part = compose.message_part(data, "deep.eml")
    assert (part.get_content_type(), part.get_content()) == ("application/octet-stream", data)


def test_the_depth_check_before_parsing_counts_levels_as_the_email_package_does() -> None:
    """Up to 32 levels (a forward adds two: the email package's check reads 30) are left to
    the email package; an attached message is a level, as the package counts it."""
    shallow = nested("shallow@example.net", 30)
    assert compose.message_part(shallow, "s.eml").get_content_type() == "message/rfc822"
    chain = b"Content-Type: text/plain\r\n\r\nhi\r\n"
    for level in range(40):
        chain = b"Content-Type: message/rfc822\r\n\r\nSubject: %d\r\n" % level + chain
    assert mime.nested_past_max_depth(chain)
    assert compose.message_part(chain, "c.eml").get_content_type() == "application/octet-stream"
    for depth, deep in ((31, False), (32, False), (33, True)):
        assert mime.nested_past_max_depth(nested("d@example.net", depth)) is deep
        attached = WRAPPED["attached"](nested("d@example.net", depth - 1))
        assert mime.nested_past_max_depth(attached) is deep


def test_a_draft_with_parts_nested_hundreds_deep_is_refused_and_kept(bed: Bed) -> None:
    """Another client's draft nested 300 deep crashed sending with a RecursionError."""
    data = nested("deep-draft@example.org", 300).replace(b"From: Zoe <zoe@example.net>",
                                                        b"From: Alex Morgan <alex@example.org>")
    bed.put_draft("1800000840.deep.host:2,DS", data)
    bed.refused_send("deep-draft@example.org", "nested more than 32 deep.*the draft is kept")
    assert (bed.drafts / "1800000840.deep.host:2,DS").read_bytes() == data


def test_a_message_sent_while_an_undo_is_under_way_says_so_and_not_to_send_it_again(
        bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    """The filing meets an undo under way in another fmail-nm process (it holds the undo lock
    past the filing's wait): the error names the undo -- not another program holding notmuch's
    lock, which the user would look for in vain -- and still says not to send it again."""
    import subprocess
    import sys
    monkeypatch.setattr(compose, "FILING_WAIT_S", 1)
    draft = compose.reply_to_email(bed.ctx, ORIGINAL, "Numbers below.")
    lock = bed.ctx.sidecar_file.with_name(bed.ctx.sidecar_file.name + ".undo-lock")
    undo = subprocess.Popen(  # what an undo in another process holds throughout
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert undo.stdout is not None and undo.stdout.readline() == "held\n"
        with pytest.raises(compose.FilingError) as failed:
            send.send_draft(bed.ctx, draft.message_id)
    finally:
        undo.kill()
        undo.wait()
    said = str(failed.value)
    assert "undo" in said and "another program" not in said, said
    assert "was sent" in said and "do not send it again" in said, said
    assert len(bed.smtp.received) == 1
