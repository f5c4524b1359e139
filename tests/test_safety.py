"""What an attacker or a careless model could do in one call, tried through the real server
process and the `mcp` SDK's client: each gets a clear error or a safe answer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp.client.client import Client

from fmail_nm.dsl import MAX_QUERY_CHARS

from .conftest import MailEnv
from .test_server_writes import BANK, call, error_text, server_params


def server_rss_kib() -> int:
    """VmRSS of the one `fmail_nm serve` process this test started (a child of ours)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
        if ppid == os.getpid() and b"fmail_nm" in cmdline and b"serve" in cmdline:
            found.append(next(int(line.split()[1]) for line in status.splitlines()
                              if line.startswith("VmRSS:")))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.anyio
async def test_a_huge_search_is_refused_without_growing_the_server(indexed: MailEnv) -> None:
    async with Client(server_params(indexed)) as client:
        await call(client, "search_emails", {"query": "from:anna", "limit": 5})
        before = server_rss_kib()
        refused = await client.call_tool("search_emails", {"query": "a " * 51_200})
        assert refused.is_error
        text = refused.content[0].text  # type: ignore[union-attr]
        assert f"at most {MAX_QUERY_CHARS} characters" in text and len(text) < 500
        many = await error_text(client, "search_emails", {"query": "a " * 1000})
        assert "at most 200 words" in many
        assert server_rss_kib() - before < 8 * 1024  # a few MB at most
        # Still answering, and a long query within the limits has a short echo.
        long_ok = await call(client, "search_emails",
                             {"query": " OR ".join(f"subject:w{i}" for i in range(60))})
        assert long_ok["total"] == 0 and len(long_ok["query"]) <= 600


@pytest.mark.anyio
async def test_smaller_holes_are_closed(indexed: MailEnv) -> None:
    async with Client(server_params(indexed)) as client:
        page = await call(client, "search_emails", {"query": "", "limit": 2})
        offset, fingerprint = page["next_cursor"].split(".")
        assert offset == "2"
        negative = f"-5.{fingerprint}"
        assert "negative" in await error_text(client, "search_emails",
                                              {"query": "", "cursor": negative})

        invalid = await error_text(client, "search_emails", {"query": "x", "limit": 0})
        assert invalid.startswith("invalid arguments: limit:")
        assert "pydantic" not in invalid and "http" not in invalid

        schema = await error_text(client, "query_emails",
                                  {"sql_query": "SELECT * FROM sqlite_master"})
        assert "refused" in schema and "sqlite_master" in schema
        json_each = await call(client, "query_emails", {"sql_query": (
            "SELECT count(*) FROM emails e, json_each(e.tags) t WHERE t.value = 'inbox'")})
        assert json_each["rows"][0][0] > 0

        mid = "tom-hotfix@acme.test"
        assert "reserved" in await error_text(client, "tag_emails", {"ids": [mid], "add": ["new"]})
        # Tagged deleted, it would vanish here and stay in the server's inbox.
        assert "delete_messages" in await error_text(client, "tag_emails",
                                                     {"ids": [mid], "add": ["deleted"]})

        query = "from:anna.schmidt@example.com"
        preview = await call(client, "mark_read", {"query": query})
        assert preview["dry_run"] and preview["match_count"] > 1
        wrong = await error_text(client, "mark_read",
                                 {"query": query, "confirm_count": preview["match_count"] + 1})
        assert f"does not match the {preview['match_count']} messages" in wrong

        for folder in ("Nowhere", "../../etc"):
            refused = await client.call_tool("move_to_folder", {"ids": [mid], "folder": folder})
            assert refused.is_error, folder
        files_now = (await call(client, "get_email", {"id": mid}))["folders"]
        assert files_now == ["work/INBOX"]

        email = await call(client, "get_email", {"id": mid})
        assert email["body"]["untrusted"] is True


@pytest.mark.anyio
async def test_a_search_says_how_many_matches_are_hidden_as_spam(indexed: MailEnv) -> None:
    async with Client(server_params(indexed)) as client:
        visible = await call(client, "search_emails", {"query": f"from:{BANK}", "limit": 100})
        assert visible["total"] == 23 and "hidden" not in visible
        await call(client, "move_to_junk", {"query": f"from:{BANK}", "confirm_count": 23})
        after = await call(client, "search_emails", {"query": f"from:{BANK}"})
        assert after["total"] == 0 and after["hidden"] == 23
        shown = await call(client, "search_emails", {"query": f"from:{BANK} in:anywhere",
                                                     "limit": 100})
        assert shown["total"] == 23 and "hidden" not in shown


def test_the_log_names_the_token_source(indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmail_nm.mcp.serving import connection_help
    config = indexed.config()
    assert "http-token" in connection_help(config, host="127.0.0.1", port=1, show_token=False)
    monkeypatch.setenv("FMAIL_TOKEN", "set-by-the-service-manager")
    text = connection_help(config, host="127.0.0.1", port=1, show_token=False)
    assert "$FMAIL_TOKEN" in text and "http-token" not in text
    assert "set-by-the-service-manager" not in text




def tag_dump(env: MailEnv) -> str:
    return env.notmuch("dump", "--include=tags").stdout


@pytest.mark.anyio
async def test_a_mass_block_needs_confirmation_spares_the_user_and_undoes_exactly(
        indexed: MailEnv) -> None:
    hand_spam = "tom-hotfix@acme.test"
    async with Client(server_params(indexed)) as client:
        indexed.notmuch("tag", "+spam", "--", f"id:{hand_spam}")  # by hand, in another client
        await call(client, "manage_contacts_sql", {
            "sql_query": f"UPDATE contacts SET notes='my bank' WHERE email_address='{BANK}'"})
        original = tag_dump(indexed)
        inbox = (await call(client, "search_emails", {"query": "in:inbox"}))["total"]
        assert inbox > 0

        mine = await error_text(client, "manage_contacts_sql",
                                {"sql_query": "UPDATE contacts SET is_blocked=1"})
        assert "own address" in mine and "nothing was changed" in mine
        assert tag_dump(indexed) == original

        everyone = "UPDATE contacts SET is_blocked=1, notes='bulk' WHERE is_me=0"
        preview = await call(client, "manage_contacts_sql", {"sql_query": everyone})
        count = preview["changed"]
        assert preview["dry_run"] is True and count > 10 and len(preview["sample"]) == 5
        # Nothing was blocked: the sample shows whom it would block, not every address.
        assert not preview.get("blocked") and not preview.get("unblocked")
        assert tag_dump(indexed) == original
        assert "does not match" in await error_text(
            client, "manage_contacts_sql", {"sql_query": everyone, "confirm_count": count - 1})

        done = await call(client, "manage_contacts_sql",
                          {"sql_query": everyone, "confirm_count": count})
        assert "dry_run" not in done and done["audit_id"] and len(done["blocked"]) == count
        assert (await call(client, "search_emails", {"query": "in:inbox"}))["total"] == 0
        blocked_inbox = indexed.notmuch("count", "tag:blocked AND tag:inbox").stdout.strip()
        assert blocked_inbox == "0"  # other notmuch clients do not show it in the inbox either
        assert (await call(client, "search_emails", {"query": "is:sent"}))["total"] > 0

        released = await call(client, "manage_contacts_sql", {
            "sql_query": "UPDATE contacts SET is_blocked=0 WHERE is_me=0",
            "confirm_count": count})
        assert len(released["unblocked"]) == count
        # Unblocking takes away only what blocking added: the spam tag set by hand stays.
        assert tag_dump(indexed) == original

        await call(client, "undo_last_write")  # the unblock
        assert (await call(client, "search_emails", {"query": "in:inbox"}))["total"] == 0
        await call(client, "undo_last_write")  # the block
        assert tag_dump(indexed) == original
        notes = await call(client, "query_emails", {
            "sql_query": f"SELECT notes, is_blocked FROM contacts WHERE email_address='{BANK}'"})
        assert notes["rows"] == [["my bank", 0]]
        blocked = await call(client, "query_emails", {
            "sql_query": "SELECT count(*) FROM contacts WHERE is_blocked=1"})
        assert blocked["rows"] == [[0]]
        assert (await call(client, "search_emails", {"query": "in:inbox"}))["total"] == inbox


def test_the_cli_refuses_to_block_the_users_own_address(indexed: MailEnv) -> None:
    refused = indexed.fmail("contacts", "block", "Alex <ALEX@example.org>", check=False)
    assert refused.returncode == 2 and "own address" in refused.stderr
    assert indexed.notmuch("count", "tag:blocked").stdout.strip() == "0"


@pytest.mark.anyio
async def test_every_string_parameter_has_a_length_limit(indexed: MailEnv) -> None:
    long = "x" * 5000
    async with Client(server_params(indexed)) as client:
        for tool, args in [("get_email", {"id": long}),
                           ("get_thread", {"thread_id": long}),
                           ("tag_emails", {"ids": ["tom-hotfix@acme.test"], "add": [long]}),
                           ("move_to_folder", {"ids": ["tom-hotfix@acme.test"], "folder": long}),
                           ("search_emails", {"query": "x", "account": long}),
                           ("search_emails", {"query": "x", "cursor": long}),
                           ("search_emails", {"query": "x", "since": long}),
                           ("list_threads", {"query": long})]:
            text = await error_text(client, tool, args)
            assert len(text) < 600 and long not in text, (tool, text[:200])


@pytest.mark.anyio
async def test_deleting_every_contact_needs_confirmation_and_undo_brings_notes_back(
        indexed: MailEnv) -> None:
    async with Client(server_params(indexed)) as client:
        noted = "UPDATE contacts SET notes='note of ' || email_address WHERE is_me=0"
        preview = await call(client, "manage_contacts_sql", {"sql_query": noted})
        count = preview["changed"]
        await call(client, "manage_contacts_sql", {"sql_query": noted, "confirm_count": count})
        wipe = await call(client, "manage_contacts_sql", {"sql_query": "DELETE FROM contacts"})
        assert wipe["dry_run"] is True and wipe["changed"] == count
        rows = "SELECT count(*) FROM contacts WHERE notes IS NOT NULL"
        assert (await call(client, "query_emails", {"sql_query": rows}))["rows"] == [[count]]
        await call(client, "manage_contacts_sql", {"sql_query": "DELETE FROM contacts",
                                                   "confirm_count": count})
        assert (await call(client, "query_emails", {"sql_query": rows}))["rows"] == [[0]]
        await call(client, "undo_last_write")
        back = await call(client, "query_emails", {"sql_query": (
            f"SELECT notes FROM contacts WHERE email_address='{BANK}'")})
        assert back["rows"] == [[f"note of {BANK}"]]
        assert (await call(client, "query_emails", {"sql_query": rows}))["rows"] == [[count]]
