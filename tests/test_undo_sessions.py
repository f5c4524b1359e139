"""undo_last_write reverts the calling session's own latest write: two sessions of one HTTP
server, and two stdio servers on one mailbox (a chat client and a coding agent each start
one), through the `mcp` SDK client; what a later write of another session changed stands."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import MailEnv
from .test_faults import TOKEN, kill_group, start_service
from .test_server_writes import BANK, call, error_text, server_params, tags_of

MARKED = "tom-hotfix@acme.test"  # unread, in work/INBOX
FLAGGED = "mum-visit-2026@example.net"  # unread, in personal/INBOX


@contextlib.asynccontextmanager
async def http_session(url: str) -> AsyncIterator[Client]:
    """One MCP session of the HTTP server at ``url`` (the handshake protocol: a session id)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                                  timeout=httpx2.Timeout(60.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            yield client


async def each_undoes_its_own(env: MailEnv, a: Client, b: Client) -> None:
    """A marks a message read, then B flags another; A's undo takes back A's write alone;
    A's next undo reverts nothing and says B's write is not A's; B's undo takes back B's."""
    assert "unread" in tags_of(env, f"id:{MARKED}")[MARKED]
    assert "flagged" not in tags_of(env, f"id:{FLAGGED}")[FLAGGED]
    await call(a, "update_email_status", {"ids": [MARKED], "mark_as": "read"})
    flagged = await call(b, "set_flagged", {"ids": [FLAGGED]})

    assert (await call(a, "undo_last_write"))["applied"] == [MARKED]
    assert "unread" in tags_of(env, f"id:{MARKED}")[MARKED]
    assert "flagged" in tags_of(env, f"id:{FLAGGED}")[FLAGGED]

    refused = await error_text(a, "undo_last_write", {})
    assert "nothing was undone: this session has no write left to undo" in refused
    assert f"audit {flagged['audit_id']} (set_flagged" in refused
    assert "flagged" in tags_of(env, f"id:{FLAGGED}")[FLAGGED]

    assert (await call(b, "undo_last_write"))["audit_id"] == flagged["audit_id"]
    assert "flagged" not in tags_of(env, f"id:{FLAGGED}")[FLAGGED]
    assert "unread" in tags_of(env, f"id:{MARKED}")[MARKED]
    assert "nothing to undo" in await error_text(b, "undo_last_write", {})


@pytest.mark.anyio
async def test_two_sessions_of_one_http_server_each_undo_their_own_write(
        indexed: MailEnv) -> None:
    proc, url = start_service(indexed, "serve", "--transport", "http", "--no-push")
    try:
        async with http_session(url) as a, http_session(url) as b:
            await each_undoes_its_own(indexed, a, b)
    finally:
        kill_group(proc)


@pytest.mark.anyio
async def test_two_stdio_servers_on_one_mailbox_each_undo_their_own_write(
        indexed: MailEnv) -> None:
    async with Client(server_params(indexed)) as a, Client(server_params(indexed)) as b:
        await each_undoes_its_own(indexed, a, b)


@pytest.mark.anyio
async def test_an_undo_leaves_what_another_sessions_later_write_set(indexed: MailEnv) -> None:
    """A marks two messages read; B marks one of them unread, then read again.  A's undo
    makes the other unread again, and leaves the one B marked last as B left it, saying so:
    turning it unread would silently take back B's later write."""
    other = FLAGGED
    async with Client(server_params(indexed)) as a, Client(server_params(indexed)) as b:
        await call(a, "update_email_status", {"ids": [MARKED, other], "mark_as": "read"})
        await call(b, "update_email_status", {"ids": [MARKED], "mark_as": "unread"})
        last = await call(b, "update_email_status", {"ids": [MARKED], "mark_as": "read"})
        result = await a.call_tool("undo_last_write", {})
        assert not result.is_error, result.content
        assert "unread" not in tags_of(indexed, f"id:{MARKED}")[MARKED]
        assert "unread" in tags_of(indexed, f"id:{other}")[other]
        shown = result.content[0].text  # type: ignore[union-attr]
        assert f"left as a later write set them: unread (audit {last['audit_id']} (" in shown
        # B's own undo still reverts B's latest write.
        await call(b, "undo_last_write")
        assert "unread" in tags_of(indexed, f"id:{MARKED}")[MARKED]


@pytest.mark.anyio
async def test_a_write_of_an_earlier_server_is_undone_by_its_audit_id(indexed: MailEnv) -> None:
    """After a restart the earlier server's write is not this session's: a plain undo says
    which write is left and how to revert it; naming its audit_id reverts it; an id that is
    no write left is refused, nothing changed."""
    async with Client(server_params(indexed)) as before:
        marked = await call(before, "update_email_status", {"ids": [MARKED], "mark_as": "read"})
    async with Client(server_params(indexed)) as after:
        refused = await error_text(after, "undo_last_write", {})
        assert f"undo_last_write(audit_id={marked['audit_id']})" in refused
        assert "unread" not in tags_of(indexed, f"id:{MARKED}")[MARKED]

        undone = await call(after, "undo_last_write", {"audit_id": marked["audit_id"]})
        assert undone["applied"] == [MARKED]
        assert "unread" in tags_of(indexed, f"id:{MARKED}")[MARKED]

        again = await error_text(after, "undo_last_write", {"audit_id": marked["audit_id"]})
        assert f"audit {marked['audit_id']} is no write left to undo" in again
        assert "unread" in tags_of(indexed, f"id:{MARKED}")[MARKED]


@pytest.mark.anyio
async def test_an_audit_id_past_sqlites_integers_is_refused_as_no_write(indexed: MailEnv) -> None:
    """An audit_id SQLite cannot hold (JSON numbers have no bound) reads as unknown, with the
    same sentence as any other id that is no write left -- not an overflow from the driver."""
    async with Client(server_params(indexed)) as client:
        await call(client, "update_email_status", {"ids": [MARKED], "mark_as": "read"})
        for huge in (2**63, -(2**63) - 1, 10**30):
            refused = await error_text(client, "undo_last_write", {"audit_id": huge})
            assert f"audit {huge} is no write left to undo" in refused, refused
        assert "unread" not in tags_of(indexed, f"id:{MARKED}")[MARKED]
        assert (await call(client, "undo_last_write"))["applied"] == [MARKED]


@pytest.mark.anyio
async def test_an_audit_id_naming_a_write_undo_cannot_revert_says_so_and_keeps_it(
        indexed: MailEnv) -> None:
    """undo_last_write(audit_id=N) of a write that cannot be reverted (a send, a saved draft)
    says that write cannot be, not "this session's latest ... call again for the one before";
    and it leaves the entry as it was, so the same answer comes again."""
    from fmail_nm.passes.changes import NOT_UNDOABLE
    from fmail_nm.store import sidecar
    with sidecar.opened(sidecar.sidecar_path(indexed.config().data_dir)) as conn:
        sent = sidecar.record_write(conn, "send", {
            "id": "out@example.org", NOT_UNDOABLE: "a sent message cannot be recalled"}, [])
    async with Client(server_params(indexed)) as client:
        for _ in range(2):
            refused = await error_text(client, "undo_last_write", {"audit_id": sent})
            assert f"audit {sent} (send) cannot be reverted: a sent message cannot be " \
                   "recalled" in refused, refused
            assert "this session's latest" not in refused and "again" not in refused


def contact_sql(address: str, assignments: str) -> dict[str, str]:
    return {"sql_query": f"UPDATE contacts SET {assignments} WHERE email_address='{address}'"}


async def contact_of(client: Client, address: str) -> dict[str, object]:
    found = await call(client, "query_emails", {"sql_query": "SELECT name, is_blocked, notes "
                                              f"FROM contacts WHERE email_address='{address}'"})
    return dict(zip(found["columns"], found["rows"][0]))


@pytest.mark.anyio
async def test_undoing_a_contact_edit_keeps_another_sessions_later_block(indexed: MailEnv) -> None:
    """A names a contact, B blocks it; A's undo takes the name back and leaves B's block:
    restoring A's whole earlier row would unblock the sender, and the blocklist would let
    its mail in again."""
    async with Client(server_params(indexed)) as a, Client(server_params(indexed)) as b:
        before = await contact_of(a, BANK)
        await call(a, "manage_contacts_sql", contact_sql(BANK, "name='Northwind'"))
        await call(b, "manage_contacts_sql", contact_sql(BANK, "is_blocked=1"))
        assert (await call(a, "search_emails", {"query": f"from:{BANK}"}))["total"] == 0

        await call(a, "undo_last_write")
        assert await contact_of(a, BANK) == {**before, "is_blocked": 1}
        assert (await call(a, "search_emails", {"query": f"from:{BANK}"}))["total"] == 0
        assert len(tags_of(indexed, "tag:blocked")) == 23

        await call(b, "undo_last_write")  # B's block is B's to undo
        assert await contact_of(b, BANK) == before
        assert (await call(b, "search_emails", {"query": f"from:{BANK}"}))["total"] == 23


@pytest.mark.anyio
async def test_undoing_a_contact_edit_leaves_a_column_a_later_write_changed_and_says_so(
        indexed: MailEnv) -> None:
    """A sets a contact's name and notes, B renames it; A's undo takes the notes back and
    leaves B's name, naming B's write.  A blocks a sender, B unblocks it: A's undo leaves
    it unblocked, its mail where B's unblock put it."""
    async with Client(server_params(indexed)) as a, Client(server_params(indexed)) as b:
        before = await contact_of(a, BANK)
        await call(a, "manage_contacts_sql", contact_sql(BANK, "name='NW', notes='bank'"))
        renamed = await call(b, "manage_contacts_sql", contact_sql(BANK, "name='Northwind'"))
        result = await a.call_tool("undo_last_write", {})
        assert not result.is_error, result.content
        assert await contact_of(a, BANK) == {**before, "name": "Northwind"}
        shown = result.content[0].text  # type: ignore[union-attr]
        assert (f"{BANK}: left as a later write set it: name (audit {renamed['audit_id']} "
                "(contacts))") in shown

        await call(a, "manage_contacts_sql", contact_sql(BANK, "is_blocked=1"))
        unblocked = await call(b, "manage_contacts_sql", contact_sql(BANK, "is_blocked=0"))
        result = await a.call_tool("undo_last_write", {})
        assert not result.is_error, result.content
        assert (await contact_of(a, BANK))["is_blocked"] == 0
        assert (await call(a, "search_emails", {"query": f"from:{BANK}"}))["total"] == 23
        assert not tags_of(indexed, "tag:blocked")
        shown = result.content[0].text  # type: ignore[union-attr]
        assert f"is_blocked (audit {unblocked['audit_id']} (contacts))" in shown


@pytest.mark.anyio
async def test_undoing_the_adding_of_a_contact_another_session_blocked_since_keeps_the_block(
        indexed: MailEnv) -> None:
    """A adds a contact, B blocks it; A's undo takes A's name back and keeps the contact,
    blocked: deleting the row A made would drop B's block with it.  B's undo then unblocks
    it, and the contact is gone as before A added it -- not left behind as an empty row."""
    new = "pest@spam.example"
    async with Client(server_params(indexed)) as a, Client(server_params(indexed)) as b:
        await call(a, "manage_contacts_sql", {
            "sql_query": f"INSERT INTO contacts (email_address, name) VALUES ('{new}', 'Pest')"})
        await call(b, "manage_contacts_sql", contact_sql(new, "is_blocked=1"))
        await call(a, "undo_last_write")
        assert await contact_of(a, new) == {"name": None, "is_blocked": 1, "notes": None}
        await call(b, "undo_last_write")
        found = await call(b, "query_emails", {
            "sql_query": f"SELECT * FROM contacts WHERE email_address='{new}'"})
        assert found["rows"] == []
