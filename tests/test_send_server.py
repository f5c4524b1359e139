"""The draft and send tools through the real server process and the `mcp` SDK client, with a
real SMTP server behind a real msmtp: which tools exist in which mode, and that every refusal
is a clear error that changes nothing (files, tags, audit log, mail received)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError

from .conftest import MailEnv, search_rows
from .smtpbed import SmtpBed
from .test_send import ORIGINAL, ORIGINAL_MAIL, PERSONAL, configure, deliver
from .test_server import ALL_READS, SEND_TOOLS, WRITE_TOOLS, check_tool_list, uid
from .test_server_writes import call, error_text, server_params

DRAFT_TOOLS = {"save_draft", "reply_to_email", "forward_email"}


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[SmtpBed]:
    bed = SmtpBed(tmp_path / "smtp", PERSONAL).start()
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def mail(indexed: MailEnv) -> MailEnv:
    deliver(indexed, "1800000000.test_1.host", ORIGINAL_MAIL)
    indexed.notmuch("new")
    return indexed


def snapshot(env: MailEnv, smtp: SmtpBed) -> tuple[Any, ...]:
    root = env.mail_root
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*")
                   if p.is_file() and p.parent.name in ("cur", "new"))
    tags = env.notmuch("search", "--output=tags", f"id:{ORIGINAL}").stdout.split()
    return files, tags, len(smtp.received)


@pytest.mark.anyio
async def test_send_tools_absent_by_default_drafts_only(mail: MailEnv, smtp: SmtpBed) -> None:
    configure(mail, smtp)
    mail.fmail_config.write_text(mail.fmail_config.read_text().replace(
        "enabled = true", "enabled = false"))
    async with Client(server_params(mail)) as client:
        tools = (await client.list_tools()).tools
        check_tool_list(tools, ALL_READS | WRITE_TOOLS, "all")
        assert not {t.name for t in tools} & SEND_TOOLS
        draft = await call(client, "reply_to_email", {"id": ORIGINAL, "body": "Thanks"})
        assert "sent" not in draft and draft["to"] == ["team@example.net"]
        found = await call(client, "search_emails", {"query": "in:drafts"})
        assert draft["id"] in {r["id"] for r in search_rows(found)}  # the listings' id

        before = snapshot(mail, smtp)
        refused = await error_text(client, "reply_to_email", {"id": ORIGINAL, "body": "x",
                                                              "send": True})
        assert "not saved as a draft" in refused
        assert (await client.call_tool("send_email", {"draft_id": draft["id"]})).is_error
        assert snapshot(mail, smtp) == before and smtp.received == []

    async with Client(server_params(mail, "--read-only")) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert not names & (WRITE_TOOLS | SEND_TOOLS)
        assert (await client.call_tool("save_draft", {"to": ["x@example.com"]})).is_error

    configure(mail, smtp)  # [send] enabled = true
    async with Client(server_params(mail)) as client:
        check_tool_list((await client.list_tools()).tools, ALL_READS | WRITE_TOOLS | SEND_TOOLS,
                        "all")


@pytest.mark.anyio
async def test_allow_send_offers_send_email_and_refusals_change_nothing(
        mail: MailEnv, smtp: SmtpBed, tmp_path: Path) -> None:
    outgoing = tmp_path / "outgoing"
    outgoing.mkdir()
    (tmp_path / "private.txt").write_text("keep")
    (outgoing / "big.bin").write_bytes(b"x" * (1024 * 1024 + 1))
    configure(mail, smtp, attachments_dir=str(outgoing), max_message_mb=1)
    mail.fmail_config.write_text(mail.fmail_config.read_text().replace(
        "enabled = true", "enabled = false"))
    async with Client(server_params(mail, "--allow-send")) as client:
        tools = (await client.list_tools()).tools
        check_tool_list(tools, ALL_READS | WRITE_TOOLS | SEND_TOOLS, "all")
        sender = next(t for t in tools if t.name == "send_email")
        assert sender.annotations.destructive_hint and sender.annotations.open_world_hint  # type: ignore[union-attr]
        # short ids (the sidecar's uid) name the original and the draft as well as Message-IDs
        draft = await call(client, "reply_to_email", {"id": uid(ORIGINAL), "body": "Numbers soon",
                                                      "reply_all": True})
        await call(client, "manage_contacts_sql", {
            "sql_query": "INSERT INTO contacts (email_address, is_blocked) "
                         "VALUES ('spam@example.com', 1)"})
        before = snapshot(mail, smtp)
        refusals = {
            "line breaks": ("save_draft", {"to": ["a@example.com"], "subject": "x\nBcc: v@x.org"}),
            "'nobody' is not an email address": ("save_draft", {"to": ["nobody"]}),
            "blocklist": ("save_draft", {"to": ["spam@example.com"], "subject": "hi"}),
            "outside the attachments folder": ("save_draft", {
                "to": ["a@example.com"], "attachments": ["../private.txt"]}),
            "not saved as a draft": ("send_email", {"to": ["a@example.com"], "subject": "s",
                                                    "body": "b"}),
            "no draft with id": ("send_email", {"draft_id": ORIGINAL}),
            "max_message_mb": ("save_draft", {"to": ["a@example.com"],
                                              "attachments": ["big.bin"]}),
        }
        for expected, (tool, args) in refusals.items():
            assert expected in await error_text(client, tool, args), expected
            assert snapshot(mail, smtp) == before, expected

        smtp.reject = "554 5.7.1 relay denied"  # the sender fails: its words, nothing filed
        failed = await error_text(client, "send_email", {"draft_id": draft["id"]})
        assert "554 5.7.1 relay denied" in failed and "the draft is kept" in failed
        assert snapshot(mail, smtp) == before
        smtp.reject = None

        done = await call(client, "send_email", {"draft_id": draft["id"]})
        assert done["sent"] is True and done["id"] == draft["id"]  # the Message-ID it had
        (got,) = smtp.received
        assert got.rcpt_tos == ("team@example.net", "bob@example.com", "carol@example.com")
        assert f"In-Reply-To: <{ORIGINAL}>".encode() in got.data
        sent = await call(client, "search_emails", {"query": f"id:{draft['id']}"})
        assert "sent" in search_rows(sent)[0]["tags"] and "draft" not in search_rows(sent)[0]["tags"]
        assert "cannot be recalled" in await error_text(client, "undo_last_write", {})
    assert "replied" in mail.notmuch("search", "--output=tags", f"id:{ORIGINAL}").stdout.split()
    check = mail.fmail("sidecar", "check", "--files")
    assert check.stdout.strip().endswith("sidecar matches notmuch")


@pytest.mark.anyio
async def test_save_draft_empties_the_cc_of_a_reply_all(mail: MailEnv, smtp: SmtpBed) -> None:
    """A reply-all the user wants to go to the sender alone: cc=[] empties its Cc (an
    omitted cc keeps it), and the draft stays a threaded reply."""
    configure(mail, smtp)
    async with Client(server_params(mail)) as client:
        draft = await call(client, "reply_to_email", {"id": ORIGINAL, "body": "x",
                                                      "reply_all": True})
        assert draft["cc"] == ["bob@example.com", "carol@example.com"]
        kept = await call(client, "save_draft", {"draft_id": draft["id"], "body": "y"})
        assert kept["cc"] == draft["cc"]
        alone = await call(client, "save_draft", {"draft_id": draft["id"], "cc": []})
        assert "cc" not in alone and alone["to"] == ["team@example.net"]
        threads = [(await call(client, "get_email", {"id": ref}))["thread"]
                   for ref in (alone["id"], ORIGINAL)]
    assert threads[0] == threads[1] != ""


@pytest.mark.anyio
async def test_a_send_the_client_gave_up_on_is_sent_once_and_said_so_on_retry(
        mail: MailEnv, smtp: SmtpBed, tmp_path: Path) -> None:
    """The client stops waiting (its timeout sends notifications/cancelled) while the send
    command runs: the message still goes out and is filed, and the model's retry is told it
    was sent -- not "no draft", which reads as "never sent", and never a second copy."""
    configure(mail, smtp)
    go = tmp_path / "go"
    held = ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.05; done; '
            f'exec msmtp -C "{smtp.rc}" "$@"', "held-send"]
    text = mail.fmail_config.read_text()
    mail.fmail_config.write_text(text.replace(f"command = {smtp.command()!r}".replace("'", '"'),
                                              "command = " + json.dumps(held)))
    async with Client(server_params(mail, "--allow-send")) as client:
        draft = await call(client, "reply_to_email", {"id": ORIGINAL, "body": "Numbers soon"})
        mid = (await call(client, "get_email", {"id": draft["id"]}))["message_id"]
        with pytest.raises(MCPError, match="timed out"):
            await client.call_tool("send_email", {"draft_id": draft["id"]},
                                   read_timeout_seconds=1)
        go.touch()
        with anyio.fail_after(60):  # the abandoned call runs on and files the message
            while "sent" not in mail.notmuch("search", "--output=tags",
                                             f"id:{mid}").stdout.split():
                await anyio.sleep(0.1)
        retry = await error_text(client, "send_email", {"draft_id": draft["id"]})
        assert "was sent already" in retry and "not sent again" in retry
    assert len(smtp.received) == 1
