"""The MCP server end to end: `fmail-nm serve` started as a real process, driven by the `mcp`
SDK's own client over stdio and over Streamable HTTP, on the indexed fixture mail."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from fmail_nm.store import sidecar

from .conftest import BACK_TO_SCHEMA_4, MailEnv, notmuch_lock_held, search_rows
from .imapbed import free_port

# The tools of each profile (`serve --tools`); each holds the ones before it.
READ_TOOLS = {"search_emails", "list_threads", "get_thread", "get_email",
              "find_unanswered_threads", "get_attachment", "list_folders", "query_emails"}
DRAFT_TOOLS = {"save_draft", "reply_to_email", "forward_email"}
TRIAGE_TOOLS = {"update_email_status", "tag_emails", "archive", "delete_messages",
                "move_to_junk", "undo_last_write", *DRAFT_TOOLS}
MORE_READ_TOOLS = {"get_emails_content", "list_tags", "list_available_accounts",
                   "get_sync_status"}
MORE_WRITE_TOOLS = {"mark_read", "set_flagged", "move_to_folder", "restore",
                    "manage_contacts_sql", "add_email_account"}
WRITE_TOOLS = TRIAGE_TOOLS | MORE_WRITE_TOOLS
SEND_TOOLS = {"send_email"}  # only with [send] enabled or serve --allow-send; in triage
OPEN_WORLD_TOOLS = {"add_email_account", *SEND_TOOLS}  # they talk to a mail server
ALL_READS = READ_TOOLS | MORE_READ_TOOLS
DESTRUCTIVE_TOOLS = {"delete_messages", "move_to_junk", "manage_contacts_sql", *SEND_TOOLS}
# What each profile's tools/list may cost (bytes of the listed tools): the budgets of the
# lean-read-path issue (every tool, compose and send included, within 25 KB; the default 18).
TOOL_LIST_BYTES = {"read": 11_000, "triage": 18_000, "all": 25_000}


def uid(message_id: str) -> str:
    return sidecar.uid_for(message_id)


async def structured(client: Client, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, args or {})
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def text(client: Client, tool: str, args: dict[str, Any] | None = None) -> str:
    result = await client.call_tool(tool, args or {})
    assert not result.is_error, result.content
    return result.content[0].text  # type: ignore[union-attr]


def check_tool_list(tools: list[Any], expected: set[str], profile: str) -> None:
    assert {t.name for t in tools} == expected
    for tool in tools:
        annotations = tool.annotations
        assert annotations is not None
        assert annotations.open_world_hint is (tool.name in OPEN_WORLD_TOOLS), tool.name
        assert tool.output_schema is not None and tool.description
        assert "$defs" not in json.dumps(tool.output_schema)
        assert '"title"' not in json.dumps([tool.input_schema, tool.output_schema])
        if tool.name in ALL_READS:
            assert annotations.read_only_hint is True
        else:
            assert not annotations.read_only_hint  # unset: the spec's default, false
            assert annotations.destructive_hint is (tool.name in DESTRUCTIVE_TOOLS), tool.name
    whole = sum(len(t.model_dump_json(by_alias=True, exclude_none=True)) for t in tools)
    assert whole <= TOOL_LIST_BYTES[profile], f"tool list is {whole} bytes"


async def exercise_every_read_tool(client: Client, *, tools: set[str], profile: str) -> None:
    check_tool_list((await client.list_tools()).tools, tools, profile)

    sql = await structured(client, "query_emails", {
        "sql_query": "SELECT * FROM emails WHERE folder='INBOX' AND is_read=0 ORDER BY date DESC LIMIT 10"})
    assert sql["row_count"] == 10 and sql["columns"][:3] == ["uid", "subject", "sender_email"]
    by_column = [dict(zip(sql["columns"], row)) for row in sql["rows"]]
    assert all(r["is_read"] == 0 and r["folder"] == "INBOX" for r in by_column)
    assert [r["date"] for r in by_column] == sorted((r["date"] for r in by_column), reverse=True)
    hostile = await client.call_tool("query_emails", {"sql_query": "DELETE FROM emails"})
    assert hostile.is_error and "refused" in hostile.content[0].text  # type: ignore[union-attr]
    via_uid = await structured(client, "get_email", {"id": by_column[0]["uid"], "max_body_chars": 100})
    assert via_uid["message_id"] == by_column[0]["message_id"]

    found = await structured(client, "search_emails", {"query": 'from:anna "school trip"', "limit": 10})
    row = next(r for r in search_rows(found) if r["id"] == uid("school-trip-1@example.com"))
    assert row["from"] == "Anna Schmidt <anna.schmidt@example.com>"
    assert "is_read" not in row and "to" not in row  # derivable, or not the user's own mail

    bad = await client.call_tool("search_emails", {"query": "subject:(unclosed"})
    assert bad.is_error and "position" in bad.content[0].text  # type: ignore[union-attr]

    threads = await structured(client, "list_threads", {"query": "id:thread-deep-1@example.net"})
    assert threads["threads"][0]["messages"] == 8
    thread = await structured(client, "get_thread", {"thread_id": threads["threads"][0]["thread"],
                                                      "max_body_chars": 300})
    assert [m["depth"] for m in thread["messages"]] == list(range(8))

    mail = await structured(client, "get_email", {"id": "charset-cp1252@example.net",
                                                  "body_format": "full"})
    assert "\u201cPremium Oak\u201d" in mail["body"]["text"]
    html = await structured(client, "get_email", {"id": "html-only-1@coop.example.com"})
    assert "https://coop.example.com/blog/winter-vegetables" in html["body"]["text"]
    assert "js-marker-must-not-appear" not in html["body"]["text"]

    unanswered = await structured(client, "find_unanswered_threads", {"limit": 100})
    last = {t["last"] for t in unanswered["threads"]}
    assert uid("unanswered-2@example.org") in last and uid("answered-1@example.org") not in last

    big = await structured(client, "get_email", {"id": "big-attachment-1@acme.test"})
    csv = next(a for a in big["attachments"] if a["filename"] == "dataset.csv")
    part = await structured(client, "get_attachment", {"id": "big-attachment-1@acme.test",
                                                       "index": csv["index"], "max_chars": 500})
    assert part["truncated"] and len(part["text"]) <= 500
    assert part["untrusted"] is True and big["body"]["untrusted"] is True

    folders = await structured(client, "list_folders", {"account": "work"})
    assert {f["folder"] for f in folders["folders"]} == {"work/INBOX", "work/Sent", "work/Trash"}

    unknown = await client.call_tool("get_email", {"id": "nope@example.com"})
    assert unknown.is_error and "no message with id" in unknown.content[0].text  # type: ignore[union-attr]
    # Length caps are left out of the advertised schemas but still enforced by the server.
    advertised = json.dumps([t.input_schema for t in (await client.list_tools()).tools])
    assert "maxLength" not in advertised and "maxItems" not in advertised
    huge = await client.call_tool("get_email", {"id": "x" * 1001})
    assert huge.is_error and huge.content[0].text.startswith("invalid arguments: id:")  # type: ignore[union-attr]
    assert "1000 characters" in huge.content[0].text  # type: ignore[union-attr]

    if "get_emails_content" not in tools:
        return
    many = await client.call_tool("get_emails_content", {"ids": ["x@y"] * 51})
    assert many.is_error and many.content[0].text.startswith("invalid arguments: ids:")  # type: ignore[union-attr]
    assert "at most 50 items" in many.content[0].text  # type: ignore[union-attr]
    batch = await structured(client, "get_emails_content", {"ids": ["answered-2@example.com", "x@y"]})
    assert batch["not_found"] == ["x@y"]
    assert batch["emails"][0]["message_id"] == "answered-2@example.com"
    tags = await structured(client, "list_tags")
    assert {"inbox", "sent", "list"} <= {t["tag"] for t in tags["tags"]}
    accounts = await structured(client, "list_available_accounts")
    assert [a["name"] for a in accounts["accounts"]] == ["personal", "work"]


@pytest.mark.anyio
async def test_every_read_tool_over_stdio(shared_indexed: MailEnv) -> None:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--read-only"],
                                   env={**os.environ, **shared_indexed.env})
    async with Client(params) as client:
        assert "UNTRUSTED DATA" in (client.instructions or "")
        await exercise_every_read_tool(client, tools=READ_TOOLS, profile="read")


@pytest.mark.anyio
async def test_every_tool_of_the_all_profile(shared_indexed: MailEnv) -> None:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--tools", "all", "--no-push"],
                                   env={**os.environ, **shared_indexed.env})
    async with Client(params) as client:
        await exercise_every_read_tool(
            client, tools=ALL_READS | TRIAGE_TOOLS | MORE_WRITE_TOOLS, profile="all")


def test_the_server_tells_the_model_only_of_the_tools_it_offers(shared_indexed: MailEnv) -> None:
    """The read profile offers no write and no draft tool: its instructions must not tell the
    model how writes and drafts go (`serve --tools read`)."""
    from fmail_nm.mcp.server import build_server

    told = {}
    for profile, read_only in (("read", False), ("triage", False), ("all", False),
                               ("all", True)):
        server, service = build_server(shared_indexed.config(), tools=profile,
                                       read_only=read_only)
        try:
            told[profile, read_only] = server.instructions or ""
        finally:
            service.close()
    for key, text in told.items():
        offers_writes = key in (("triage", False), ("all", False))
        assert "UNTRUSTED DATA" in text
        assert ("undo_last_write" in text) is offers_writes, key
        assert ("drafts" in text) is offers_writes, key


@pytest.mark.anyio
async def test_sync_status_reads_as_lines_with_the_setup_problems(indexed: MailEnv) -> None:
    indexed.notmuch("config", "set", "maildir.synchronize_flags", "false")
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--tools", "all", "--read-only"],
                                   env={**os.environ, **indexed.env})
    async with Client(params) as client:
        lines = (await text(client, "get_sync_status")).split("\n")
    assert lines[0] == ("fmail-nm service: not running (no status recorded; start it with "
                        "`fmail-nm run` or `fmail-nm serve --watch`)")
    assert lines[1] == "setup problems:"
    assert any(line.startswith("- ") and "notmuch config set maildir.synchronize_flags true"
               in line for line in lines[2:])


@pytest.mark.anyio
async def test_a_server_started_on_an_older_sidecar_migrates_it(indexed: MailEnv) -> None:
    """After an upgrade the sidecar has an older schema until something writes it; the read
    tools only read it (and read every page from notmuch meanwhile), so the server brings it
    up to date as it starts."""
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with sqlite3.connect(path) as conn:
        conn.executescript(BACK_TO_SCHEMA_4)
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--read-only"],
                                   env={**os.environ, **indexed.env})
    async with Client(params) as client:
        with sqlite3.connect(path) as conn:  # before any tool call
            assert conn.execute("PRAGMA user_version").fetchone()[0] == sidecar.SCHEMA_VERSION
        sql = await structured(client, "query_emails", {
            "sql_query": "SELECT count(*) AS n FROM emails"})
        assert sql["rows"][0][0] > 0


@pytest.mark.anyio
async def test_a_server_starts_on_a_sidecar_it_cannot_migrate(indexed: MailEnv) -> None:
    """A sidecar the server may not write (immutable here; a read-only mount, a backup)
    stays as it is, and the server serves: searches from notmuch, SQL with a clear error."""
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with sqlite3.connect(path) as conn:
        conn.executescript(BACK_TO_SCHEMA_4)
        conn.execute("PRAGMA journal_mode = DELETE")  # no -wal/-shm files to write beside it
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this file system cannot make a file immutable")
    try:
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                             "--read-only"],
                                       env={**os.environ, **indexed.env})
        async with Client(params) as client:
            found = await structured(client, "search_emails", {"query": "in:inbox", "limit": 3})
            assert found["total"] > 0 and len(found["rows"]) == 3
            sql = await client.call_tool("query_emails", {"sql_query": "SELECT 1"})
            assert sql.is_error and "schema 4" in sql.content[0].text  # type: ignore[union-attr]
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 4


@pytest.mark.anyio
async def test_a_sidecar_damaged_under_a_running_server_is_named_with_its_fix(
        indexed: MailEnv) -> None:
    """A read that finds the mirror damaged said only "Error executing tool search_emails":
    the model must learn that the sidecar is the problem, and the way out."""
    path = sidecar.sidecar_path(indexed.config().data_dir)
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--read-only"],
                                   env={**os.environ, **indexed.env})
    async with Client(params) as client:
        assert (await structured(client, "search_emails", {"query": "in:inbox"}))["total"] > 0
        for extra in ("-wal", "-shm"):
            path.with_name(path.name + extra).unlink(missing_ok=True)
        path.write_bytes(b"this is not an SQLite file " * 1000)
        found = await client.call_tool("search_emails", {"query": "in:inbox"})
        assert found.is_error
        assert f"the sidecar {path} cannot be read" in found.content[0].text  # type: ignore[union-attr]
        assert "fmail-nm sidecar rebuild" in found.content[0].text  # type: ignore[union-attr]




@pytest.mark.anyio
async def test_a_fault_in_the_servers_own_sidecar_sql_reads_as_an_internal_error(
        indexed: MailEnv) -> None:
    """SQL of the server's own that fails on the sidecar (a table it names is not there) is
    fmail-nm's fault: said so, with SQLite's words, not bare nor as a damaged file."""
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE tag_counts")
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--tools", "all", "--read-only"],
                                   env={**os.environ, **indexed.env})
    async with Client(params) as client:
        found = await client.call_tool("list_tags", {})
    said = found.content[0].text  # type: ignore[union-attr]
    assert found.is_error and "internal error in fmail-nm" in said, said
    assert "no such table: tag_counts" in said and "cannot be read" not in said


@pytest.mark.anyio
@pytest.mark.parametrize("emptied", ["truncated", "made anew"])
async def test_a_sidecar_emptied_under_a_running_server_is_made_anew(
        indexed: MailEnv, emptied: str) -> None:
    """A sidecar truncated to nothing (or deleted and made anew, empty) under a running server
    is what the server's start migrates: the server does the same, where its open reader
    kept every write from making the file anew -- each read answered "malformed" and each
    SQL call "schema 0" until a restart."""
    path = sidecar.sidecar_path(indexed.config().data_dir)
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--read-only"],
                                   env={**os.environ, **indexed.env})
    count = {"sql_query": "SELECT count(*) AS n FROM emails"}
    async with Client(params) as client:
        inbox = (await structured(client, "search_emails", {"query": "in:inbox"}))["total"]
        mirrored = (await structured(client, "query_emails", count))["rows"][0][0]
        for first in ("search_emails", "query_emails"):  # whichever notices it first
            if emptied == "truncated":
                os.truncate(path, 0)
            else:
                path.unlink()
                path.write_bytes(b"")
            if first == "search_emails":
                found = await structured(client, "search_emails", {"query": "in:inbox"})
                assert found["total"] == inbox
            assert (await structured(client, "query_emails", count))["rows"][0][0] == mirrored
            found = await structured(client, "search_emails", {"query": "in:inbox"})
            assert found["total"] == inbox
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sidecar.SCHEMA_VERSION


def wait_for_port(proc: subprocess.Popen[str], port: int, timeout: float = 60) -> None:
    """Wait until the server process listens on ``port``; fail if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc.poll() is not None:
                out = proc.stdout or proc.stderr
                raise AssertionError(f"server exited: {out.read() if out else ''}") from None
            time.sleep(0.1)
    raise AssertionError(f"server did not listen on port {port} within {timeout}s")


@pytest.fixture
def http_server(shared_indexed: MailEnv) -> Iterator[tuple[str, str]]:
    port = free_port()
    env = {**os.environ, **shared_indexed.env, "FMAIL_TOKEN": "test-token-123"}
    proc = subprocess.Popen([sys.executable, "-m", "fmail_nm", "serve", "--transport", "http",
                             "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(proc, port)
        yield f"http://127.0.0.1:{port}/mcp", "test-token-123"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.anyio
async def test_every_read_tool_over_http(http_server: tuple[str, str]) -> None:
    url, token = http_server
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30.0)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            # the default profile
            await exercise_every_read_tool(client, tools=READ_TOOLS | TRIAGE_TOOLS,
                                           profile="triage")


@pytest.mark.anyio
async def test_http_refuses_missing_or_wrong_token_and_foreign_origin(
        http_server: tuple[str, str]) -> None:
    url, token = http_server
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30.0)) as http:
        missing = await http.post(url, json=body, headers=headers)
        assert missing.status_code == 401
        wrong = await http.post(url, json=body, headers={**headers, "Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        foreign = await http.post(url, json=body, headers={
            **headers, "Authorization": f"Bearer {token}", "Origin": "http://evil.example.com"})
        assert foreign.status_code in (403, 421)


def test_a_stdio_client_killed_mid_write_leaves_the_write_whole_and_the_server_ends_cleanly(
        indexed: MailEnv) -> None:
    """The client dies (both pipes closed) while a write by query waits for the notmuch lock:
    the write runs to its end once the lock is free, the server then exits with status 0 --
    the answer it could not write is no failure -- and index, files and sidecar agree."""
    inbox = int(indexed.notmuch("count", "tag:inbox").stdout)
    proc = subprocess.Popen([sys.executable, "-m", "fmail_nm", "serve", "--transport", "stdio",
                             "--no-push", "--tools", "all"], env={**os.environ, **indexed.env},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    def send(message: dict[str, Any]) -> None:
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    send({"id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}})
    assert '"id":1' in proc.stdout.readline()
    send({"method": "notifications/initialized"})
    with notmuch_lock_held(indexed.env) as holder:
        send({"id": 2, "method": "tools/call", "params": {
            "name": "archive", "arguments": {"query": "in:inbox", "confirm_count": inbox}}})
        proc.stdout.close()
        proc.stdin.close()
        holder.release()
        assert proc.wait(timeout=120) == 0
    assert "Traceback" not in proc.stderr.read()
    with sqlite3.connect(sidecar.sidecar_path(indexed.config().data_dir)) as conn:
        assert conn.execute("SELECT action FROM audit_log").fetchall() == [("archive",)]
    assert int(indexed.notmuch("count", "tag:inbox").stdout) < inbox
    check = indexed.fmail("sidecar", "check", "--files")
    assert check.stdout.strip().endswith("sidecar matches notmuch")
