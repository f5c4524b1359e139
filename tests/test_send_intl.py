"""Composing, replying and sending with international and odd addresses, through the real
server process and the `mcp` SDK client, real notmuch and a real SMTP server behind msmtp:
what notmuch reads from the saved draft, and what the server receives."""

from __future__ import annotations

import email.policy
import json
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from mcp.client.client import Client

from .conftest import MailEnv
from .smtpbed import SmtpBed
from .test_send import configure, deliver
from .test_send_server import mail, smtp  # noqa: F401 - fixtures
from .test_server_writes import call, error_text, server_params


def shown_headers(env: MailEnv, message_id: str) -> dict[str, str]:
    """The headers `notmuch show` gives for one message."""
    shown = json.loads(env.notmuch("show", "--format=json", "--body=false",
                                   f"id:{message_id}").stdout)
    headers: dict[str, str] = shown[0][0][0]["headers"]
    return headers


def parsed(data: bytes) -> EmailMessage:
    msg = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    return msg


@pytest.mark.anyio
async def test_names_with_specials_are_never_folded_inside_their_quotes(
        mail: MailEnv, smtp: SmtpBed) -> None:
    """A quoted name with spaces where the To line reaches 78 columns: folded inside its
    quotes, notmuch (GMime) showed the line break in the name ("Name\\r\\n (comment)").
    Names with commas, quotes, backslashes, parentheses and an "@" read back as written, in
    notmuch and on the wire, and the envelope has each address once."""
    configure(mail, smtp)
    to = ['"Müller, Jörg" <j@x.de>', '"a@b" <c@d.org>', 'Name (comment) <p@y.org>',
          '"back\\\\slash \\"q\\"" <b@y.org>', '"Smith, John (Sales)" <js@y.org>',
          '"Jörg (JJ) \\"x\\", y@z" <jj@y.org>']
    names = ["Müller, Jörg", "a@b", "Name (comment)", 'back\\slash "q"', "Smith, John (Sales)",
             'Jörg (JJ) "x", y@z']
    async with Client(server_params(mail, "--allow-send")) as client:
        draft = await call(client, "save_draft", {"to": to, "subject": "names", "body": "hi"})
        mid = (await call(client, "get_email", {"id": draft["id"]}))["message_id"]
        shown = shown_headers(mail, mid)["To"]
        assert "\r" not in shown and "\n" not in shown, shown
        (path,) = mail.notmuch("search", "--output=files", f"id:{mid}").stdout.split()
        saved = parsed(Path(path).read_bytes())
        assert [a.display_name for a in saved["to"].addresses] == names
        await call(client, "send_email", {"draft_id": draft["id"]})
    (got,) = smtp.received
    assert got.rcpt_tos == ("j@x.de", "c@d.org", "p@y.org", "b@y.org", "js@y.org", "jj@y.org")
    assert [a.display_name for a in got.message()["to"].addresses] == names


@pytest.mark.anyio
async def test_an_address_with_a_non_ascii_local_part_is_refused_saying_why(
        mail: MailEnv, smtp: SmtpBed) -> None:
    """用户@例子.广告 needs SMTPUTF8, which fmail-nm does not send (msmtp does not speak it):
    given, read from mail replied to, or in a draft another client saved, it is refused
    naming SMTPUTF8 -- not "not an email address" -- and nothing is written or sent."""
    configure(mail, smtp)
    deliver(mail, "1800000900.eai.host", (
        "From: Jörg <jörg@bücher.de>\r\nTo: alex@example.org\r\nSubject: eai\r\n"
        "Message-ID: <eai-1@example.com>\r\n\r\nhi\r\n").encode())
    (mail.mail_root / "personal" / "Drafts" / "cur" / "1800000901.eai.host:2,DS").write_bytes((
        "From: Alex Morgan <alex@example.org>\r\nTo: =?utf-8?b?55So5oi3?= <用户@例子.广告>\r\n"
        "Subject: eai draft\r\nMessage-ID: <eai-draft@example.org>\r\n\r\nhi\r\n").encode())
    mail.notmuch("new")
    async with Client(server_params(mail, "--allow-send")) as client:
        calls: list[tuple[str, dict[str, Any]]] = [
            ("save_draft", {"to": ["用户@例子.广告"], "subject": "s"}),
            ("save_draft", {"to": ["Jörg <jörg@bücher.de>"]}),
            ("reply_to_email", {"id": "eai-1@example.com", "body": "x"}),
            ("send_email", {"draft_id": "eai-draft@example.org"})]
        for tool, args in calls:
            said = await error_text(client, tool, args)
            assert "SMTPUTF8" in said and "not an email address" not in said, said
    assert smtp.received == []
    drafts = mail.notmuch("search", "--output=files", "folder:personal/Drafts").stdout
    assert len(drafts.split()) == 3  # the fixture's two and the other client's


@pytest.mark.anyio
async def test_a_reply_to_mail_with_raw_iso_2022_jp_headers_reads_them_as_japanese(
        mail: MailEnv, smtp: SmtpBed) -> None:
    """Older Japanese mailers write Subject and names in ISO-2022-JP unencoded (7-bit, with
    escape sequences): the reply's subject and attribution read as Japanese, not as the
    escapes' letters ("$B2q5D$N7o(B")."""
    configure(mail, smtp)
    jis = "iso-2022-jp"
    deliver(mail, "1800000910.jis.host", b"From: " + "山田".encode(jis) + b" <yamada@example.jp>"
            b"\r\nTo: alex@example.org\r\nSubject: " + "会議の件".encode(jis) +
            b"\r\nMessage-ID: <jis-1@example.jp>\r\nDate: Tue, 02 Jan 2024 09:01:00 +0000\r\n"
            b"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=ISO-2022-JP\r\n\r\n"
            + "明日の会議です。".encode(jis) + b"\r\n")
    mail.notmuch("new")
    async with Client(server_params(mail, "--allow-send")) as client:
        draft = await call(client, "reply_to_email", {"id": "jis-1@example.jp", "body": "了解"})
        assert draft["subject"] == "Re: 会議の件" and draft["to"] == ["yamada@example.jp"]
        await call(client, "send_email", {"draft_id": draft["id"]})
    (got,) = smtp.received
    sent = got.message()
    assert sent["subject"] == "Re: 会議の件"
    assert sent["to"].addresses[0].display_name == "山田"
    body = sent.get_body(("plain",))
    assert body is not None and body.get_content().replace("\r\n", "\n") == (
        "了解\n\nOn Tue, 02 Jan 2024 at 09:01 +0000, 山田 wrote:\n> 明日の会議です。\n")


GROUPS_MAIL = (
    b"From: =?utf-8?q?M=C3=BCller=2C_J=C3=B6rg?= <j@x.de>\r\n"
    b"Reply-To: undisclosed-recipients:;\r\n"
    b"To: undisclosed-recipients:;\r\n"
    b"Cc: Team: a@x.org, =?utf-8?b?5byg5LiJ?= <b@y.org>, Alex <ALEX@example.org>;,"
    b" \"Smith, \\\"Al\\\" (x)\" <al@z.org>, alex.morgan@example.org\r\n"
    b"Subject: =?GB18030?B?xOO6ww==?= " + "会議".encode("iso-2022-jp") + b"\r\n"
    b"Message-ID: <groups-1@x.de>\r\nDate: Tue, 02 Jan 2024 09:01:00 +0000\r\n"
    b"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=GB18030\r\n"
    b"Content-Transfer-Encoding: 8bit\r\n\r\n" + "你好，世界。€ 𠀀\r\n".encode("gb18030"))


@pytest.mark.anyio
async def test_replies_and_odd_bodies_go_out_as_saved_and_are_found_in_sent(
        mail: MailEnv, smtp: SmtpBed, tmp_path: Path) -> None:
    """A reply-all to mail with encoded words (a comma inside one), groups and GB18030: the
    right people, none of them the user, the subject and quote as text.  A draft with a long
    subject, an attachment with a long non-ASCII name (RFC 2231), lines over 998 bytes and
    lines SMTP would read as its own ("From ", "."): the server gets the draft (headers and
    decoded parts alike), and notmuch finds the Sent copy by its subject's words."""
    outgoing = tmp_path / "outgoing"
    outgoing.mkdir()
    attachment = "Grüße façade 日本語 – ein recht langer Dateiname.txt"
    (outgoing / attachment).write_text("hällo\n")
    configure(mail, smtp, attachments_dir=str(outgoing))
    deliver(mail, "1800000920.groups.host", GROUPS_MAIL)
    mail.notmuch("new")
    subject = "Réunion " + " ".join(f"Punkt{i} Übersicht" for i in range(20)) + " Zebrafisch"
    body = "start\nFrom here\n.\n..\n" + "x" * 1500 + "\n" + "ü" * 700 + "\nend\n"
    async with Client(server_params(mail, "--allow-send")) as client:
        reply = await call(client, "reply_to_email", {"id": "groups-1@x.de", "body": "ok",
                                                      "reply_all": True})
        assert reply["to"] == ["j@x.de"] and reply["cc"] == ["a@x.org", "b@y.org", "al@z.org"]
        assert reply["subject"] == "Re: 你好 会議"
        new = await call(client, "save_draft", {"to": ["Bob <bob@example.com>"],
                                                "subject": subject, "body": body,
                                                "attachments": [attachment]})
        saved = []
        for draft in (reply, new):
            mid = (await call(client, "get_email", {"id": draft["id"]}))["message_id"]
            (path,) = mail.notmuch("search", "--output=files", f"id:{mid}").stdout.split()
            saved.append(parsed(Path(path).read_bytes()))
            await call(client, "send_email", {"draft_id": draft["id"]})
    got = [r.message() for r in smtp.received]
    assert got[0]["to"].addresses[0].display_name == "Müller, Jörg"
    quote = got[0].get_body(("plain",))
    assert quote is not None and quote.get_content().replace("\r\n", "\n").endswith(
        "Müller, Jörg wrote:\n> 你好，世界。€ 𠀀\n")
    for copy, wire in zip(saved, got):
        assert {k: str(v) for k, v in copy.items() if k not in ("Bcc", "Date")} == \
            {k: str(v) for k, v in wire.items() if k != "Date"}
        assert [p.get_payload(decode=True) for p in copy.walk() if not p.is_multipart()] == \
            [p.get_payload(decode=True) for p in wire.walk() if not p.is_multipart()]
    assert [p.get_filename() for p in got[1].iter_attachments()] == [attachment]
    text = got[1].get_body(("plain",))
    assert text is not None and text.get_content().replace("\r\n", "\n") == body
    mail.notmuch("new")
    found = mail.notmuch("search", "--output=files", "subject:Zebrafisch",
                         "subject:Übersicht", "subject:Réunion").stdout.split()
    assert len(found) == 1 and "/personal/Sent/" in found[0]
