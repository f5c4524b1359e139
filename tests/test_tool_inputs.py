"""The input contract of the tools as a model calls them through the `mcp` SDK client: an
argument the server cannot take as given is a tool error saying what to fix -- never dropped,
truncated or a crash -- and a refused write changes nothing on disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from mcp.client.client import Client

from .conftest import MailEnv, search_rows
from .test_server_writes import call, error_text, server_params

INVITE = "invite-1@acme.test"  # work/INBOX, tags: inbox; no Maildir flags but S


def mail_files(env: MailEnv) -> dict[str, float]:
    """Every message file under the mail root, with its mtime: a rename or rewrite shows."""
    files = {}
    for root, dirs, names in os.walk(env.mail_root):
        dirs[:] = [d for d in dirs if d != ".notmuch"]
        for name in names:
            path = Path(root, name)
            files[str(path.relative_to(env.mail_root))] = path.stat().st_mtime
    return files


def tags_of(env: MailEnv, message_id: str) -> list[str]:
    return sorted(env.notmuch("search", "--output=tags", f"id:{message_id}").stdout.split())


async def first_uid(client: Client, query: str) -> str:
    page = await call(client, "search_emails", {"query": query, "limit": 1})
    return str(search_rows(page)[0]["id"])


@pytest.mark.anyio
async def test_a_misspelt_argument_is_refused_not_dropped(indexed: MailEnv) -> None:
    """The SDK drops an argument the tool does not have: ``read: false`` to mark_read then
    marks the mail read (is_read's default), ``dryrun: true`` deletes for real, and a search
    with ``q`` answers with all mail."""
    async with Client(server_params(indexed)) as client:
        unread = await first_uid(client, "is:unread in:inbox")
        before = mail_files(indexed)
        text = await error_text(client, "mark_read", {"ids": [unread], "read": False})
        assert "read" in text and "is_read" in text  # names the stray argument and the right one
        text = await error_text(client, "delete_messages", {"ids": [unread], "dryrun": True})
        assert "dryrun" in text and "dry_run" in text
        text = await error_text(client, "search_emails", {"q": "from:nobody@example.invalid"})
        assert "'q'" in text and "query" in text
        assert (await call(client, "search_emails",
                           {"query": "is:unread in:inbox", "limit": 1}))["rows"][0][0] == unread
        assert mail_files(indexed) == before


@pytest.mark.anyio
async def test_a_nul_in_an_id_or_tag_is_refused_not_cut_off(indexed: MailEnv) -> None:
    """libnotmuch takes C strings, which end at a NUL: ``flagged\\0x`` added the tag
    ``flagged`` without the file's F flag (so mbsync never pushes it, and set_flagged then
    finds nothing to do), ``new\\0x`` the reserved tag ``new``, and ``<id>\\0x`` -- an id
    the index does not have -- acted on <id>."""
    async with Client(server_params(indexed)) as client:
        before, tags = mail_files(indexed), tags_of(indexed, INVITE)
        text = await error_text(client, "tag_emails", {"ids": [INVITE], "add": ["flagged\x00x"]})
        assert "add" in text and "NUL" in text
        text = await error_text(client, "tag_emails", {"ids": [INVITE + "\x00x"], "add": ["t"]})
        assert "ids" in text and "NUL" in text
        text = await error_text(client, "get_email", {"id": INVITE + "\x00x"})
        assert "id" in text and "NUL" in text
        # Other control characters were written as they are: listings show "a\x01b" as
        # "a b", a name the model cannot give back to remove it.
        text = await error_text(client, "tag_emails", {"ids": [INVITE], "add": ["a\x01b"]})
        assert "control" in text
        text = await error_text(client, "tag_emails", {"ids": [INVITE], "remove": ["-inbox"]})
        assert "'inbox'" in text and "under remove" not in text  # not told to do what it did
        assert tags_of(indexed, INVITE) == tags and mail_files(indexed) == before


@pytest.mark.anyio
async def test_out_of_range_offsets_and_silences_are_errors_that_say_so(
        shared_indexed: MailEnv) -> None:
    """A cursor whose offset was raised past any mailbox, or a min_days_silent past any
    date, reached SQLite or islice and crashed the call: the model read only "Error executing
    tool ..." with nothing to fix."""
    async with Client(server_params(shared_indexed)) as client:
        for tool in ("search_emails", "list_threads", "find_unanswered_threads"):
            page = await call(client, tool, {"limit": 1})
            _, _, rest = str(page["next_cursor"]).partition(".")
            text = await error_text(client, tool, {"cursor": "9" * 23 + "." + rest})
            assert "cursor" in text, (tool, text)
        text = await error_text(client, "find_unanswered_threads", {"min_days_silent": 10**30})
        assert "min_days_silent" in text


@pytest.mark.anyio
async def test_a_boolean_for_a_number_is_refused_not_read_as_one(indexed: MailEnv) -> None:
    """Pydantic reads true as 1 where an integer is wanted, which the listed schema refuses:
    ``limit: true`` answered with one message, ``index: true`` with attachment 1, and
    ``confirm_count: true`` -- "yes, confirmed" -- made a one-message write by query.  A
    digit of another script was read as its number too ("\\u0663", Arabic-Indic 3)."""
    async with Client(server_params(indexed)) as client:
        tags = tags_of(indexed, INVITE)
        text = await error_text(client, "tag_emails", {
            "query": f"id:{INVITE}", "add": ["t"], "confirm_count": True})
        assert "confirm_count" in text and "integer" in text
        assert tags_of(indexed, INVITE) == tags
        text = await error_text(client, "search_emails", {"limit": True})
        assert "limit" in text and "integer" in text
        attached = await first_uid(client, "tag:attachment")
        for index in (True, "\u0663"):
            text = await error_text(client, "get_attachment", {"id": attached, "index": index})
            assert "index" in text and ("integer" in text or "a number from get_email" in text)


@pytest.mark.anyio
async def test_an_account_name_is_capped_in_every_tool_that_takes_one(
        shared_indexed: MailEnv) -> None:
    """README: account names and addresses are at most 320 characters.  The SQL tools'
    account_name had no cap: a 100,000-character name came back whole in the error."""
    async with Client(server_params(shared_indexed)) as client:
        long_name = "x" * 321
        for tool, args in (("query_emails", {"sql_query": "SELECT 1", "account_name": long_name}),
                           ("manage_contacts_sql", {"sql_query": "SELECT 1 FROM contacts",
                                                    "account_name": long_name}),
                           ("search_emails", {"account": long_name})):
            text = await error_text(client, tool, args)
            assert "at most 320 characters" in text and len(text) < 300, (tool, text[:300])
