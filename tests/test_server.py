"""The MCP server end to end: `fmail-nm serve` started as a real process, driven by the `mcp`
SDK's own client over stdio and over Streamable HTTP, on the indexed fixture mail."""

from __future__ import annotations

import json
import os
import socket
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

from .conftest import MailEnv
from .imapbed import free_port

READ_TOOLS = {"search_emails", "list_threads", "get_thread", "get_email", "get_emails_content",
              "find_unanswered_threads", "get_attachment", "list_tags", "list_folders",
              "list_available_accounts", "query_emails", "get_sync_status"}
WRITE_TOOLS = {"update_email_status", "mark_read", "set_flagged", "tag_emails", "archive",
               "delete_messages", "move_to_junk", "move_to_folder", "restore", "undo_last_write",
               "manage_contacts_sql", "save_draft", "reply_to_email", "forward_email",
               "add_email_account"}
SEND_TOOLS = {"send_email"}  # only with [send] enabled or serve --allow-send
COMPOSE_TOOLS = {"save_draft", "reply_to_email", "forward_email", *SEND_TOOLS}
OPEN_WORLD_TOOLS = {"add_email_account", *SEND_TOOLS}  # they talk to a mail server
DESTRUCTIVE_TOOLS = {"delete_messages", "move_to_junk", "manage_contacts_sql", *SEND_TOOLS}


async def structured(client: Client, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, args or {})
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def check_tool_list(tools: list[Any], *, read_only: bool, send: bool = False) -> None:
    assert {t.name for t in tools} == READ_TOOLS | (set() if read_only else WRITE_TOOLS) | (
        SEND_TOOLS if send else set())
    for tool in tools:
        annotations = tool.annotations
        assert annotations is not None
        assert annotations.open_world_hint is (tool.name in OPEN_WORLD_TOOLS), tool.name
        assert tool.output_schema is not None and tool.description
        if tool.name in READ_TOOLS:
            assert annotations.read_only_hint is True and annotations.destructive_hint is False
        else:
            assert annotations.read_only_hint is False
            assert annotations.destructive_hint is (tool.name in DESTRUCTIVE_TOOLS), tool.name
    # What a client puts in the model's context: names, descriptions, input schemas.
    # The draft and send tools have their own budget: about 1.2 KB each, schemas included.
    composing = [t for t in tools if t.name in COMPOSE_TOOLS]
    size = sum(len(t.model_dump_json(exclude_none=True)) for t in composing)
    assert size <= 1_200 * len(composing), f"draft and send tools: {size} bytes"
    tools = [t for t in tools if t.name not in COMPOSE_TOOLS]
    model_facing = sum(len(json.dumps([t.name, t.description, t.input_schema])) for t in tools)
    assert model_facing < 20_000, f"tool list is {model_facing} bytes"
    whole = sum(len(t.model_dump_json(exclude_none=True)) for t in tools)
    # 45 000 before add_email_account (1.3 KB with its output schema) joined the list.
    assert whole < 46_500, f"tool list with output schemas is {whole} bytes"


async def exercise_every_read_tool(client: Client, *, read_only: bool) -> None:
    check_tool_list((await client.list_tools()).tools, read_only=read_only)

    sql = await structured(client, "query_emails", {
        "sql_query": "SELECT * FROM emails WHERE folder='INBOX' AND is_read=0 ORDER BY date DESC LIMIT 10"})
    assert sql["row_count"] == 10 and sql["columns"][:3] == ["uid", "subject", "sender_email"]
    by_column = [dict(zip(sql["columns"], row)) for row in sql["rows"]]
    assert all(r["is_read"] == 0 and r["folder"] == "INBOX" for r in by_column)
    assert [r["date"] for r in by_column] == sorted((r["date"] for r in by_column), reverse=True)
    hostile = await client.call_tool("query_emails", {"sql_query": "DELETE FROM emails"})
    assert hostile.is_error and "refused" in hostile.content[0].text  # type: ignore[union-attr]
    via_uid = await structured(client, "get_email", {"id": by_column[0]["uid"], "max_body_chars": 100})
    assert via_uid["id"] == by_column[0]["message_id"]

    raw = await client.call_tool("search_emails", {"query": 'from:anna "school trip"', "limit": 10})
    text = raw.content[0].text  # type: ignore[union-attr]
    assert json.loads(text) == raw.structured_content and "\n" not in text  # compact for the model
    found = await structured(client, "search_emails", {"query": 'from:anna "school trip"', "limit": 10})
    assert "school-trip-1@example.com" in {r["id"] for r in found["results"]}
    row = next(r for r in found["results"] if r["id"] == "school-trip-1@example.com")
    assert row["from"] == {"name": "Anna Schmidt", "address": "anna.schmidt@example.com"}

    bad = await client.call_tool("search_emails", {"query": "subject:(unclosed"})
    assert bad.is_error and "position" in bad.content[0].text  # type: ignore[union-attr]

    threads = await structured(client, "list_threads", {"query": "id:thread-deep-1@example.net"})
    assert threads["threads"][0]["message_count"] == 8
    thread = await structured(client, "get_thread", {"thread_id": threads["threads"][0]["thread_id"],
                                                      "max_body_chars": 300})
    assert [m["depth"] for m in thread["messages"]] == list(range(8))

    mail = await structured(client, "get_email", {"id": "charset-cp1252@example.net",
                                                  "body_format": "full"})
    assert "\u201cPremium Oak\u201d" in mail["body"]["text"]
    html = await structured(client, "get_email", {"id": "html-only-1@coop.example.com"})
    assert "https://coop.example.com/blog/winter-vegetables" in html["body"]["text"]
    assert "js-marker-must-not-appear" not in html["body"]["text"]

    batch = await structured(client, "get_emails_content", {"ids": ["answered-2@example.com", "x@y"]})
    assert batch["not_found"] == ["x@y"] and batch["emails"][0]["id"] == "answered-2@example.com"

    unanswered = await structured(client, "find_unanswered_threads", {"limit": 100})
    last = {t["last_outgoing"]["id"] for t in unanswered["threads"]}
    assert "unanswered-2@example.org" in last and "answered-1@example.org" not in last

    big = await structured(client, "get_email", {"id": "big-attachment-1@acme.test"})
    csv = next(a for a in big["attachments"] if a["filename"] == "dataset.csv")
    part = await structured(client, "get_attachment", {"id": "big-attachment-1@acme.test",
                                                       "index": csv["index"], "max_chars": 500})
    assert part["truncated"] and len(part["text"]) <= 500
    assert part["untrusted"] is True and big["body"]["untrusted"] is True

    tags = await structured(client, "list_tags")
    assert {"inbox", "sent", "list"} <= {t["tag"] for t in tags["tags"]}
    folders = await structured(client, "list_folders", {"account": "work"})
    assert {f["folder"] for f in folders["folders"]} == {"work/INBOX", "work/Sent", "work/Trash"}
    accounts = await structured(client, "list_available_accounts")
    assert [a["name"] for a in accounts["accounts"]] == ["personal", "work"]

    unknown = await client.call_tool("get_email", {"id": "nope@example.com"})
    assert unknown.is_error and "no message with id" in unknown.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_every_read_tool_over_stdio(shared_indexed: MailEnv) -> None:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--read-only"],
                                   env={**os.environ, **shared_indexed.env})
    async with Client(params) as client:
        assert "UNTRUSTED DATA" in (client.instructions or "")
        await exercise_every_read_tool(client, read_only=True)


@pytest.fixture
def http_server(shared_indexed: MailEnv) -> Iterator[tuple[str, str]]:
    port = free_port()
    env = {**os.environ, **shared_indexed.env, "FMAIL_TOKEN": "test-token-123"}
    proc = subprocess.Popen([sys.executable, "-m", "fmail_nm", "serve", "--transport", "http",
                             "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise AssertionError(f"server exited: {proc.stdout.read()}")  # type: ignore[union-attr]
                time.sleep(0.1)
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
            await exercise_every_read_tool(client, read_only=False)


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
