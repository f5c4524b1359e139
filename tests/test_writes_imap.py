"""The write tools against a real IMAP server: Dovecot, mbsync and notmuch, no mocks.

Every write here goes through :mod:`fmail_nm.tools.writes` (or, once, through the real MCP server
process), then through mbsync, and is judged by what the *server* holds afterwards -- read with
imaplib -- and by the local side: tags, the files on disk, and ``notmuch new`` finding nothing
left to correct.  After each sync the set-up must also be settled: a further plain mbsync run
changes nothing on either side and prints nothing but notices, and no message exists twice on
the server.

The bed (tests/syncbed.py): account ``acct`` with INBOX, Sent, Trash, Junk, Archive; mbsync with
``Expunge Both``, ``Create Both``.  Seeded: 1 unread, 2 read, 3 unread+flagged, 4 read+flagged
in INBOX, 5 read in Archive.  The two-account tests add ``work``, a second login on the same
server with its own channel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread
import pytest
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from fmail_nm.mcp.serving import serving
from fmail_nm.passes.changes import WriteContext
from fmail_nm.service import cycle
from fmail_nm.store import sidecar
from fmail_nm.store.maildir import MaildirName
from fmail_nm.store.notmuch import DatabaseBusy, Writer
from fmail_nm.tools import writes

from . import imapbed
from .conftest import notmuch_lock_held, search_rows
from .syncbed import (  # noqa: F401  (pytest fixtures, used by name)
    ACCOUNT,
    FLAGGED,
    IMAP_USER,
    MBSYNC_TIMEOUT,
    SEEN,
    SyncBed,
    message,
    require_tools,
    sync_bed,
    synced_bed,
)
from .test_background import _mbsync_runs_with as mbsync_runs_with
from .test_background import _silent_server as silent_server
from .test_http import authed_client
from .test_http import serving as http_serving
from .test_server import READ_TOOLS, TRIAGE_TOOLS, check_tool_list, text

pytestmark = pytest.mark.imap

T = TypeVar("T")
SEEDED = 5
# What the server holds per Message-ID (no angle brackets): one (folder, flags) per copy.
# UIDs are left out: a message that moves and comes back gets a new one, which is fine.
Snapshot = dict[str, list[tuple[str, frozenset[str]]]]
# mbsync's notices are chatter ("Maildir notice: sleeping due to recent directory
# modification."); anything else it prints is a warning or an error.
MBSYNC_NOTICE = re.compile(r"^\S+ notice: ")


# ---------------------------------------------------------------------------------------------
# Looking at both sides


def server_snapshot(bed: SyncBed) -> Snapshot:
    found: defaultdict[str, list[tuple[str, frozenset[str]]]] = defaultdict(list)
    for folder, messages in bed.server_state().items():
        for msg in messages:
            found[msg.message_id.strip("<>")].append((folder, msg.flags))
    return {mid: sorted(places, key=lambda p: (p[0], sorted(p[1])))
            for mid, places in found.items()}


def assert_no_duplicates(snapshot: Snapshot) -> None:
    """Every seeded message is on the server exactly once, in all folders together."""
    assert sorted(snapshot) == sorted(SyncBed.mid(n) for n in range(1, SEEDED + 1)), snapshot
    twice = {mid: places for mid, places in snapshot.items() if len(places) != 1}
    assert not twice, f"on the server more than once: {twice}"


def sync(bed: SyncBed) -> Snapshot:
    """syncer.sync both ways (mbsync, notmuch new, tagging); it must report no error at all --
    mbsync's "UID ... is beyond highest assigned UID" fails the run, so it would show here."""
    report = bed.sync()
    assert report.ok, report.errors()
    assert report.index is not None
    snapshot = server_snapshot(bed)
    assert_no_duplicates(snapshot)
    return snapshot


def notmuch_new(bed: SyncBed) -> str:
    done = subprocess.run(["notmuch", "new", "--no-hooks"], env={**os.environ, **bed.env},
                          text=True, capture_output=True, timeout=120, check=True)
    return done.stdout.strip()


def assert_settled(bed: SyncBed) -> None:
    """Nothing is left to do: another mbsync run changes nothing and reports no problem, then
    ``notmuch new`` finds no file added, removed or renamed; every indexed file name is the
    one on disk."""
    before = server_snapshot(bed)
    again = imapbed.run_mbsync(bed.mbsync_config, ACCOUNT, check=False)
    said = [line for line in (again.stdout + again.stderr).splitlines()
            if not MBSYNC_NOTICE.match(line)]
    assert again.returncode == 0 and not said, again
    assert server_snapshot(bed) == before
    assert notmuch_new(bed) == "No new mail."
    for n in range(1, SEEDED + 1):
        mid = bed.mid(n)
        indexed = bed.find(mid)
        assert indexed is not None, mid
        assert sorted(indexed.filenames) == [str(p) for p in bed.files(mid)], mid


def local_file(bed: SyncBed, mid: str, folder: str) -> Path:
    """The message's one file, which must be in ``folder/cur`` and carry mbsync's UID."""
    (path,) = bed.files(mid)
    assert path.parent == bed.account_dir / folder / "cur", path
    assert ",U=" in path.name, path  # mbsync has seen it in this folder
    return path


def others(snapshot: Snapshot, mid: str) -> Snapshot:
    return {k: v for k, v in snapshot.items() if k != mid}


@pytest.fixture
def ctx(synced_bed: SyncBed) -> Iterator[WriteContext]:
    config = synced_bed.config()
    with synced_bed.reader() as reader, synced_bed.writer() as writer:
        yield WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))


# ---------------------------------------------------------------------------------------------
# Flags


def test_read_unread_flag_unflag_reach_the_server(synced_bed: SyncBed,
                                                  ctx: WriteContext) -> None:
    bed = synced_bed
    m1, m2, m3, m4 = (bed.mid(n) for n in range(1, 5))
    before = server_snapshot(bed)

    assert writes.set_read(ctx, [m1], True).applied == [m1]
    assert writes.set_flagged(ctx, [m1], True).applied == [m1]
    assert writes.update_email_status(ctx, [m2], "unread").applied == [m2]
    assert writes.set_flagged(ctx, [m4], False).applied == [m4]
    snapshot = sync(bed)

    assert snapshot[m1] == [("INBOX", {SEEN, FLAGGED})]
    assert snapshot[m2] == [("INBOX", frozenset())]
    assert snapshot[m4] == [("INBOX", {SEEN})]
    assert snapshot[m3] == before[m3] == [("INBOX", {FLAGGED})]  # untouched
    assert bed.tags(m1) == {"flagged", "inbox"}
    assert bed.tags(m2) == {"unread", "inbox"}
    assert bed.tags(m4) == {"inbox"}
    assert local_file(bed, m1, "INBOX").name.endswith(":2,FS")
    assert_settled(bed)

    # ... and back again, the flag tags also through tag_emails.
    assert writes.update_email_status(ctx, [m1], "unread").applied == [m1]
    assert writes.set_flagged(ctx, [m1], False).applied == [m1]
    assert writes.set_read(ctx, [m2], True).applied == [m2]
    assert writes.tag_emails(ctx, [m4], add=["flagged"]).applied == [m4]
    assert writes.tag_emails(ctx, [m3], remove=["unread"]).applied == [m3]
    snapshot = sync(bed)

    assert snapshot == {**before, m3: [("INBOX", {SEEN, FLAGGED})]}
    assert bed.tags(m1) == {"unread", "inbox"}
    assert bed.tags(m3) == {"flagged", "inbox"}
    assert_settled(bed)


# ---------------------------------------------------------------------------------------------
# Moves


@pytest.mark.parametrize(("action", "folder", "tag"), [
    pytest.param(writes.delete_messages, "Trash", "deleted", id="delete"),
    pytest.param(writes.move_to_junk, "Junk", "spam", id="junk"),
])
def test_delete_or_junk_and_restore_on_the_server(
        synced_bed: SyncBed, ctx: WriteContext,
        action: Callable[..., writes.WriteResult], folder: str, tag: str) -> None:
    bed = synced_bed
    mid = bed.mid(4)  # read and flagged: the flags must travel with it
    before = server_snapshot(bed)

    assert action(ctx, [mid]).applied == [mid]
    snapshot = sync(bed)

    assert snapshot[mid] == [(folder, {SEEN, FLAGGED})]  # out of INBOX, into Trash / Junk
    assert others(snapshot, mid) == others(before, mid)
    assert bed.tags(mid) == {"flagged", tag}
    local_file(bed, mid, folder)
    assert_settled(bed)

    assert writes.restore(ctx, [mid]).applied == [mid]
    snapshot = sync(bed)

    assert snapshot == before  # back in INBOX, flags as they were, nothing else moved
    assert bed.tags(mid) == {"flagged", "inbox"}
    local_file(bed, mid, "INBOX")
    assert_settled(bed)


def test_archive_and_move_back_on_the_server(synced_bed: SyncBed,
                                             ctx: WriteContext) -> None:
    bed = synced_bed
    mid = bed.mid(1)  # unread: archiving must not mark it read
    before = server_snapshot(bed)

    assert writes.archive(ctx, [mid]).applied == [mid]
    snapshot = sync(bed)

    assert snapshot[mid] == [("Archive", frozenset())]
    assert snapshot[bed.mid(5)] == [("Archive", {SEEN})]  # the one already there is kept
    assert others(snapshot, mid) == others(before, mid)
    assert bed.tags(mid) == {"unread", "archived"}
    local_file(bed, mid, "Archive")
    assert_settled(bed)

    assert writes.move_to_folder(ctx, [mid], "INBOX").applied == [mid]
    assert sync(bed) == before
    assert bed.tags(mid) == {"unread", "inbox"}
    local_file(bed, mid, "INBOX")
    assert_settled(bed)


def test_after_mbsync_renames_a_moved_file_a_reindex_lets_later_writes_work(
        synced_bed: SyncBed, ctx: WriteContext) -> None:
    bed = synced_bed
    mid = bed.mid(2)
    assert writes.delete_messages(ctx, [mid]).applied == [mid]
    (moved,) = bed.files(mid)
    assert moved.parent == bed.account_dir / "Trash" / "cur" and ",U=" not in moved.name

    (run,) = bed.mbsync("push")
    assert run.ok, run.error

    # mbsync uploaded the file and gave it its new UID by renaming it behind notmuch's back.
    renamed = local_file(bed, mid, "Trash")
    assert renamed != moved and not moved.exists()
    assert MaildirName.parse(renamed.name) == MaildirName.parse(moved.name)  # only ,U= added
    assert bed.find(mid).filenames == (str(moved),)  # type: ignore[union-attr]

    bed.index()  # what the push scheduler does after every push (and `fmail-nm index`)
    assert bed.find(mid).filenames == (str(renamed),)  # type: ignore[union-attr]
    assert notmuch_new(bed) == "No new mail."

    # Later writes on that message act on the renamed file.
    assert writes.set_flagged(ctx, [mid], True).applied == [mid]
    assert writes.restore(ctx, [mid]).applied == [mid]
    snapshot = sync(bed)

    assert snapshot[mid] == [("INBOX", {SEEN, FLAGGED})]
    assert bed.tags(mid) == {"flagged", "inbox"}
    local_file(bed, mid, "INBOX")
    assert_settled(bed)


def test_a_write_before_the_reindex_is_refused_not_lost(
        synced_bed: SyncBed, ctx: WriteContext) -> None:
    """Between mbsync's rename and the next index the index names a file that is gone.  A
    flag change then cannot rename the file (libnotmuch skips a failed rename silently), so
    the write must say so and change nothing -- not report success and be undone by the next
    ``notmuch new`` (which sees the renamed file with its old flags)."""
    bed = synced_bed
    mid = bed.mid(2)
    assert writes.delete_messages(ctx, [mid]).applied == [mid]
    (run,) = bed.mbsync("push")
    assert run.ok, run.error
    renamed = local_file(bed, mid, "Trash")
    tags = bed.tags(mid)
    assert tags == {"deleted"}

    flagged = writes.set_flagged(ctx, [mid], True)
    restored = writes.restore(ctx, [mid])

    for result in (flagged, restored):
        assert result.applied == [] and [e.id for e in result.errors] == [mid], result
        assert "re-index" in result.errors[0].error, result.errors[0].error
    assert bed.tags(mid) == tags and bed.files(mid) == [renamed]

    snapshot = sync(bed)  # indexes too
    assert snapshot[mid] == [("Trash", {SEEN})]
    assert bed.tags(mid) == tags
    assert writes.set_flagged(ctx, [mid], True).applied == [mid]  # now it works
    assert sync(bed)[mid] == [("Trash", {SEEN, FLAGGED})]
    assert bed.tags(mid) == {"flagged", "deleted"}
    assert_settled(bed)


# ---------------------------------------------------------------------------------------------
# Undo


def test_undo_of_a_delete_puts_the_server_back(synced_bed: SyncBed,
                                               ctx: WriteContext) -> None:
    bed = synced_bed
    mid = bed.mid(3)  # unread and flagged
    before, tags = server_snapshot(bed), bed.tags(mid)

    deleted = writes.delete_messages(ctx, [mid])
    assert deleted.applied == [mid]
    assert sync(bed)[mid] == [("Trash", {FLAGGED})]
    local_file(bed, mid, "Trash")  # mbsync renamed it since the delete recorded its move

    undone = writes.undo_last_write(ctx)
    assert undone.applied == [mid] and undone.audit_id == deleted.audit_id
    snapshot = sync(bed)

    assert snapshot == before  # in INBOX, not in Trash, flags as before
    assert bed.tags(mid) == tags == {"unread", "flagged", "inbox"}
    local_file(bed, mid, "INBOX")
    assert_settled(bed)


def test_a_message_in_two_folders_leaves_one_copy_where_it_goes_and_comes_back_whole(
        sync_bed: SyncBed) -> None:
    """Gmail keeps every message in "[Gmail]/All Mail" too; with that as the archive folder
    (or an Archive holding the same message), archiving moved the INBOX file there and mbsync
    uploaded it: a second copy.  Now the server's INBOX loses it, its Archive keeps exactly
    one, and undo puts it back in INBOX.  Deleting (or junking) mail in two folders put both
    files into Trash, two copies on the server: now one goes, the other is held, and restore
    or undo puts each back in its folder, on the server too -- the held one with the flags
    the message has now, not those it had when it was held."""
    bed = sync_bed
    mid = bed.mid(1)
    both = {mid: [("Archive", frozenset()), ("INBOX", frozenset())]}
    bed.seed(1)
    bed.seed(1, folder="Archive")
    bed.init()
    assert bed.sync().ok
    assert server_snapshot(bed) == both
    tags = bed.tags(mid)
    config = bed.config()
    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        assert writes.archive(ctx, [mid]).applied == [mid]
        assert synced_once(bed) == {mid: [("Archive", frozenset())]}
        assert {"archived", "inbox"} & bed.tags(mid) == {"archived"}
        assert notmuch_new(bed) == "No new mail."  # the held copy stays out of the index

        undone = writes.undo_last_write(ctx)
        assert undone.applied == [mid] and not undone.errors
        assert synced_once(bed) == both
        assert bed.tags(mid) == tags

        assert not writes.delete_messages(ctx, [mid]).errors
        assert synced_once(bed) == {mid: [("Trash", frozenset())]}
        assert notmuch_new(bed) == "No new mail."
        assert not writes.set_flagged(ctx, [mid], True).errors  # the held copy is not renamed
        restored = writes.restore(ctx, [mid])
        assert restored.applied == [mid] and not restored.errors
        flagged = [(folder, frozenset({FLAGGED})) for folder, _ in both[mid]]
        assert synced_once(bed) == {mid: flagged}
        assert bed.tags(mid) == tags | {"flagged"}

        assert not writes.set_flagged(ctx, [mid], False).errors
        assert not writes.move_to_junk(ctx, [mid]).errors
        assert synced_once(bed) == {mid: [("Junk", frozenset())]}
        undone = writes.undo_last_write(ctx)
        assert undone.applied == [mid] and not undone.errors
        assert synced_once(bed) == both
        assert bed.tags(mid) == tags
    assert notmuch_new(bed) == "No new mail."


def synced_once(bed: SyncBed) -> Snapshot:
    """Sync; then what the server holds, which must be what the local folders hold: each
    message once per folder at most, on both sides."""
    report = bed.sync()
    assert report.ok, report.errors()
    snapshot = server_snapshot(bed)
    for mid, places in snapshot.items():
        folders = sorted(folder for folder, _ in places)
        assert len(set(folders)) == len(folders), (mid, places)
        assert folders == sorted(path.parent.parent.name for path in bed.files(mid)), mid
    return snapshot


# ---------------------------------------------------------------------------------------------
# Another program holds the notmuch lock


def test_a_busy_database_changes_nothing_here_or_on_the_server(
        synced_bed: SyncBed, ctx: WriteContext) -> None:
    bed = synced_bed
    mid = bed.mid(1)
    server_before = bed.server_state()  # exact, UIDs included
    local_before = (bed.tags(mid), bed.files(mid), bed.find(mid))

    # A real process holds the write lock: it opened the bed's notmuch database read-write.
    with (notmuch_lock_held(bed.env) as holder,
          Writer(bed.config().settings.notmuch_config, lock_timeout=1.0) as busy):
        busy_ctx = WriteContext(ctx.config, ctx.reader, busy, ctx.sidecar_file)
        with pytest.raises(DatabaseBusy, match="database busy"):
            writes.delete_messages(busy_ctx, [mid])
        with pytest.raises(DatabaseBusy, match="database busy"):
            writes.set_read(busy_ctx, [mid], True)
        assert (bed.tags(mid), bed.files(mid), bed.find(mid)) == local_before

        holder.release()
        assert holder.proc.returncode == 0
        report = bed.sync()
        assert report.ok, report.errors()
        assert bed.server_state() == server_before
        assert (bed.tags(mid), bed.files(mid), bed.find(mid)) == local_before
        with sidecar.opened(ctx.sidecar_file) as conn:
            # nothing recorded, nothing to undo, in any session
            assert sidecar.last_write(conn, ctx.session) is None
            assert sidecar.last_write(conn, ctx.session, others=True) is None

        # The lock is free again: the very same write now goes through.
        assert writes.delete_messages(busy_ctx, [mid]).applied == [mid]
    snapshot = sync(bed)
    assert snapshot[mid] == [("Trash", frozenset())]
    assert bed.tags(mid) == {"unread", "deleted"}
    assert_settled(bed)


# ---------------------------------------------------------------------------------------------
# The real server process: write, then the background push, with no sync by hand


def serve_params(bed: SyncBed, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "fmail_nm", "serve", "--transport", "stdio", *extra],
                                 env={**os.environ, **bed.env})


async def eventually(check: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """Poll ``check`` (in a worker thread: it does blocking I/O) until it returns something
    true; fail, saying what never happened, after a generous ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await anyio.to_thread.run_sync(check)
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g}s")
        await anyio.sleep(0.25)


@pytest.mark.anyio
async def test_the_server_pushes_a_delete_by_itself(synced_bed: SyncBed) -> None:
    bed = synced_bed
    mid = bed.mid(2)
    before = server_snapshot(bed)

    async with Client(serve_params(bed, "--read-only")) as client:
        tools = (await client.list_tools()).tools
        check_tool_list(tools, READ_TOOLS, "read")  # the read tools, and none of the write tools

    async with Client(serve_params(bed)) as client:
        check_tool_list((await client.list_tools()).tools, READ_TOOLS | TRIAGE_TOOLS, "triage")
        result = await client.call_tool("delete_messages", {"ids": [f"<{mid}>"]})
        assert not result.is_error, result.content
        assert result.structured_content is not None
        assert result.structured_content["applied"] == [mid]

        # No sync by hand: the server's push scheduler carries the move to the server ...
        def in_trash() -> Snapshot | None:
            snapshot = server_snapshot(bed)
            return snapshot if snapshot.get(mid) == [("Trash", {SEEN})] else None

        snapshot = await eventually(in_trash, f"<{mid}> in the server's Trash")
        assert_no_duplicates(snapshot)
        assert others(snapshot, mid) == others(before, mid)

        # ... and re-indexes, so the index names the file as mbsync renamed it.
        def reindexed() -> bool:
            found = bed.find(mid)
            files = bed.files(mid)
            return (found is not None and len(files) == 1 and ",U=" in files[0].name
                    and found.filenames == (str(files[0]),))

        await eventually(reindexed, "the index to follow mbsync's rename")

        found = await client.call_tool("search_emails", {"query": "in:trash"})
        assert not found.is_error and found.structured_content is not None
        # its uid once the mirror has the move, the Message-ID while it catches up
        assert [r["id"] for r in search_rows(found.structured_content)] in ([sidecar.uid_for(mid)], [mid])

    assert bed.tags(mid) == {"deleted"}
    local_file(bed, mid, "Trash")
    assert_settled(bed)


async def push_shown(client: Client) -> tuple[bool, bool | None]:
    """What get_sync_status says of the account's pushes: (writes waiting to be pushed,
    whether the last push went well: None before any)."""
    result = await client.call_tool("get_sync_status", {})
    assert not result.is_error and result.structured_content is not None, result.content
    status = result.structured_content["status"]
    (acct,) = [a for a in (status or {}).get("accounts", []) if a["name"] == ACCOUNT] or [{}]
    last = acct.get("last_push")
    return acct.get("push_pending", False), None if last is None else last["ok"]


async def until_shown(client: Client, wanted: tuple[bool, bool | None], what: str,
                      timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (shown := await push_shown(client)) != wanted:
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: get_sync_status still says {shown} after {timeout:g}s")
        await anyio.sleep(0.1)


def status_lines(bed: SyncBed) -> list[str]:
    """What `fmail-nm status`, run as the command, prints."""
    done = subprocess.run([sys.executable, "-m", "fmail_nm", "status"], capture_output=True,
                          text=True, env={**os.environ, **bed.env}, timeout=60, check=False)
    assert done.returncode == 3, done.stderr  # no service runs
    return done.stdout.splitlines()


def server_push_line(bed: SyncBed, wanted: str) -> str | None:
    """The account's line under this process's server in `fmail-nm status`, once it has
    ``wanted`` in it."""
    lines = status_lines(bed)
    head = f"MCP server without --watch: running (pid {os.getpid()}, since "
    heads = [n for n, line in enumerate(lines) if line.startswith(head)]
    line = lines[heads[0] + 1] if heads and heads[0] + 1 < len(lines) else ""
    return line if line.startswith(f"account {ACCOUNT} ") and wanted in line else None


@pytest.mark.anyio
async def test_a_server_without_watch_retries_a_push_that_failed(synced_bed: SyncBed) -> None:
    """`serve` without --watch (what a client that starts it over stdio gets) pushed a write
    once: made while the IMAP server was down, it stayed local until another write or a
    sync by hand.  The failed push is retried, backing off as the service's are, and
    get_sync_status says the write waits, then that it went out -- and so does
    `fmail-nm status` in a terminal, which knew only the service's pushes: the server keeps
    a file of its own, gone once it closed.  (The server runs in this process, over HTTP,
    for retry intervals of a fraction of a second.)"""
    bed = synced_bed
    mid = bed.mid(1)  # unread here and on the server
    with serving(bed.config(), read_only=False, push=True, tools="all", push_quiet=0.1,
                 push_retry=0.1) as server:
        async with http_serving(server) as url, authed_client() as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            bed.server.stop()
            result = await client.call_tool("update_email_status",
                                            {"ids": [f"<{mid}>"], "mark_as": "read"})
            assert not result.is_error and result.structured_content is not None
            assert result.structured_content["applied"] == [mid]
            await until_shown(client, (True, False), "the failed push")
            head, line = (await text(client, "get_sync_status")).split("\n")[:2]
            assert head.startswith("fmail-nm service: not running")  # nothing watches or pulls
            assert "this server pushes its own writes" in head
            assert line.startswith(f"account {ACCOUNT} (channel {ACCOUNT}): last push ")
            assert "FAILED: " in line and "Connection refused" in line
            assert line.endswith("; writes waiting to be pushed (retried)")
            waiting = await eventually(
                lambda: server_push_line(bed, "writes waiting to be pushed (retried)"),
                "fmail-nm status naming the waiting write")
            assert "FAILED: " in waiting and "Connection refused" in waiting

            bed.server.start()  # no write, no sync by hand from here on
            await eventually(lambda: SEEN in bed.server_flags(mid), "the push retried")
            await until_shown(client, (False, True), "the retried push")
            pushed = await eventually(lambda: server_push_line(bed, " ok in "),
                                      "fmail-nm status naming the push that went through")
            assert "waiting" not in pushed
    assert "unread" not in bed.tags(mid)
    assert not list((bed.config().data_dir / "servers").iterdir())  # closed cleanly
    assert not any(line.startswith("MCP server") for line in status_lines(bed))


@pytest.mark.anyio
async def test_a_write_a_server_without_watch_stopped_with_stays_in_the_status(
        synced_bed: SyncBed) -> None:
    """A server without --watch closed while its push failed: nothing retries the write, and
    `fmail-nm status` names it after the server is gone -- until a later push went through
    (here another server's, a process of its own, closed since), which sent it too."""
    bed = synced_bed
    await stop_a_server_with_a_failed_push(bed)
    lines = status_lines(bed)
    head = f"{STOPPED_SERVER} -- pid {os.getpid()} stopped "
    heads = [n for n, line in enumerate(lines) if line.startswith(head)]
    assert heads, lines
    account = lines[heads[0] + 1]
    assert account.startswith(f"account {ACCOUNT} (channel {ACCOUNT}): last push ")
    assert "FAILED: " in account and "Connection refused" in account
    assert account.endswith("; writes waiting to be pushed")  # not retried: the server is gone

    bed.server.start()
    async with Client(serve_params(bed)) as client:
        result = await client.call_tool("update_email_status",
                                        {"ids": [f"<{bed.mid(3)}>"], "mark_as": "read"})
        assert not result.is_error
        await eventually(lambda: SEEN in bed.server_flags(bed.mid(3)), "the other server's push")
    assert SEEN in bed.server_flags(bed.mid(1))  # the stopped server's write went with it
    # That server closed (a client's session ended) before anyone asked: its push counts.
    lines = status_lines(bed)
    assert not any(line.startswith(STOPPED_SERVER) for line in lines), lines
    assert not list((bed.config().data_dir / "servers").iterdir())  # both files gone


STOPPED_SERVER = "MCP server without --watch: NOT running"


async def stop_a_server_with_a_failed_push(bed: SyncBed) -> None:
    """A server without --watch (in this process) closes while its push of mid(1) failed:
    `fmail-nm status` names the write; the IMAP server stays down."""
    bed.server.stop()
    with serving(bed.config(), read_only=False, push=True, tools="all", push_quiet=0.1,
                 push_retry=30.0) as server:
        async with http_serving(server) as url, authed_client() as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            result = await client.call_tool("update_email_status",
                                            {"ids": [f"<{bed.mid(1)}>"], "mark_as": "read"})
            assert not result.is_error
            await until_shown(client, (True, False), "the failed push")
    assert any(line.startswith(STOPPED_SERVER) for line in status_lines(bed))


def fmail(bed: SyncBed, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fmail_nm", *args], capture_output=True,
                          text=True, env={**os.environ, **bed.env}, timeout=120, check=False)


@pytest.mark.anyio
async def test_a_sync_by_hand_settles_what_a_stopped_server_left(synced_bed: SyncBed) -> None:
    """The status line says the write goes out with `fmail-nm sync`: once that sent it,
    status names it no more."""
    bed = synced_bed
    await stop_a_server_with_a_failed_push(bed)
    bed.server.start()
    done = fmail(bed, "sync", "--push", ACCOUNT)
    assert done.returncode == 0, done.stderr
    assert SEEN in bed.server_flags(bed.mid(1))
    lines = status_lines(bed)
    assert not any(line.startswith(STOPPED_SERVER) for line in lines), lines
    assert not list((bed.config().data_dir / "servers").iterdir())


@pytest.mark.anyio
async def test_a_server_of_the_same_pid_keeps_what_a_stopped_one_left(
        synced_bed: SyncBed) -> None:
    """A later server that gets the pid of a stopped one (here: this process again; pid
    reuse, each container's pid 1) neither overwrites nor removes its record."""
    bed = synced_bed
    await stop_a_server_with_a_failed_push(bed)
    with serving(bed.config(), read_only=False, push=True, tools="all", push_quiet=0.1,
                 push_retry=30.0):
        during = status_lines(bed)
    after = status_lines(bed)
    assert any(line.startswith(STOPPED_SERVER) for line in during), during
    assert any(line.startswith(STOPPED_SERVER) for line in after), after
    bed.server.start()
    assert SEEN not in bed.server_flags(bed.mid(1))  # still local, as said


def test_status_from_another_pid_namespace_keeps_a_running_servers_file(
        synced_bed: SyncBed) -> None:
    """`fmail-nm status` where the server's pid means nothing (a sandbox, a container sharing
    the data directory) still sees it run, and leaves its file alone."""
    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "-rpf", "--mount-proc", "true"], check=False).returncode:
        pytest.skip("no unprivileged pid namespaces here")
    bed = synced_bed
    with serving(bed.config(), read_only=False, push=True, tools="all"):
        (path,) = (bed.config().data_dir / "servers").glob("*.json")
        done = subprocess.run(["unshare", "-rpf", "--mount-proc", sys.executable, "-m",
                               "fmail_nm", "status"], capture_output=True, text=True,
                              env={**os.environ, **bed.env}, timeout=60, check=False)
        assert done.returncode == 3, done.stderr
        assert path.exists(), done.stdout
        assert f"MCP server without --watch: running (pid {os.getpid()}, " in done.stdout


@pytest.mark.anyio
async def test_a_server_records_a_write_before_its_push_starts(synced_bed: SyncBed) -> None:
    """The server's file names a write as soon as it asks for its push, not only once the
    push starts (after the quiet period, longer while writes keep coming): a server killed
    meanwhile leaves it named."""
    bed = synced_bed
    with serving(bed.config(), read_only=False, push=True, tools="all",
                 push_quiet=600.0) as server:
        (path,) = (bed.config().data_dir / "servers").glob("*.json")
        async with http_serving(server) as url, authed_client() as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            result = await client.call_tool("update_email_status",
                                            {"ids": [f"<{bed.mid(1)}>"], "mark_as": "read"})
            assert not result.is_error
            await eventually(lambda: any(a["push_pending"] for a in
                                         json.loads(path.read_text())["accounts"]),
                             "the server's file naming the write")
            assert SEEN not in bed.server_flags(bed.mid(1))  # the push has not started
    assert SEEN in bed.server_flags(bed.mid(1))  # the close pushed it


@pytest.mark.anyio
async def test_status_json_has_the_servers(synced_bed: SyncBed) -> None:
    """`status --json` tells what the text does: the stopped server's waiting write."""
    bed = synced_bed
    await stop_a_server_with_a_failed_push(bed)
    done = fmail(bed, "status", "--json")
    assert done.returncode == 3, done.stderr
    shown = json.loads(done.stdout)
    ((server,),) = [shown["servers"]]
    assert server["service"]["running"] is False
    assert [a["push_pending"] for a in server["accounts"] if a["name"] == ACCOUNT] == [True]


@pytest.mark.anyio
async def test_a_stdio_server_told_to_terminate_pushes_first(synced_bed: SyncBed) -> None:
    """SIGTERM (what a client may send instead of closing stdin) right after a write, before
    its push began: the server closes as it does at the end of stdin, pushing the write."""
    bed = synced_bed
    servers = bed.config().data_dir / "servers"
    async with Client(serve_params(bed)) as client:
        result = await client.call_tool("update_email_status",
                                        {"ids": [f"<{bed.mid(1)}>"], "mark_as": "read"})
        assert not result.is_error
        (path,) = servers.glob("*.json")
        os.kill(int(path.stem.split("-")[0]), signal.SIGTERM)
        await eventually(lambda: not path.exists(), "the server closing")
    assert SEEN in bed.server_flags(bed.mid(1))
    assert "unread" not in bed.tags(bed.mid(1))


@pytest.mark.anyio
async def test_a_stdio_server_told_to_terminate_ends_a_push_that_hangs(
        synced_bed: SyncBed) -> None:
    """SIGTERM while the push after a write hangs on a server that never answers (mbsync's
    own timeout off): mbsync runs in a session of its own, where no signal to the server
    reaches it, so the server must end it before the process exits."""
    bed = synced_bed
    with silent_server(bed):
        async with Client(serve_params(bed)) as client:
            result = await client.call_tool("update_email_status",
                                            {"ids": [f"<{bed.mid(1)}>"], "mark_as": "read"})
            assert not result.is_error
            (path,) = (bed.config().data_dir / "servers").glob("*.json")
            await eventually(lambda: mbsync_runs_with(bed.mbsync_config), "the push's mbsync")
            os.kill(int(path.stem.split("-")[0]), signal.SIGTERM)
            await eventually(lambda: not mbsync_runs_with(bed.mbsync_config),
                             "the push's mbsync ending with the server")


@pytest.mark.anyio
async def test_a_push_by_a_server_without_watch_settles_what_a_stopped_service_left(
        synced_bed: SyncBed) -> None:
    """A service stopped with a write its failed push left (status.json marks the account,
    for the next start to push).  A server without --watch then pushes the account itself:
    mbsync --push sends every local change of the channel, so once that push went through
    get_sync_status no longer says writes wait."""
    from fmail_nm.service.background import Background
    bed = synced_bed
    bg = Background(bed.reload(), watch=False, schedule=False, push=True, push_quiet=0.1,
                    push_retry=30.0)
    bg.start()
    try:
        bed.server.stop()
        bed.rename_flags(bed.mid(1), "S")  # read here while the server is down
        bg.request_push([ACCOUNT])
        await eventually(lambda: (acct := bg.status().account(ACCOUNT)) is not None
                         and acct.last_push is not None, "the failed push")
    finally:
        bg.stop(timeout=10.0)
    bed.server.start()
    with serving(bed.reload(), read_only=False, push=True, tools="all",
                 push_quiet=0.1) as server:
        async with http_serving(server) as url, authed_client() as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            assert await push_shown(client) == (True, False)  # as the service left it
            result = await client.call_tool("update_email_status",
                                            {"ids": [f"<{bed.mid(3)}>"], "mark_as": "read"})
            assert not result.is_error
            await eventually(lambda: SEEN in bed.server_flags(bed.mid(3)), "the server's push")
            assert SEEN in bed.server_flags(bed.mid(1))  # the service's write went with it
            await until_shown(client, (False, True), "the push that sent both", timeout=10.0)


# ---------------------------------------------------------------------------------------------
# Two accounts


OTHER = "work"  # a second account on the same server: its own IMAP login, channel and folder
OTHER_TOML = f"""
[[accounts]]
name = "{OTHER}"
addresses = ["alex@work.example"]
maildir = "{OTHER}"
mbsync_channel = "{OTHER}"

[accounts.folders]
inbox = "INBOX"
trash = "Trash"
"""


@pytest.fixture
def two_account_bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncBed]:
    """The bed with a second account, ``work`` (IMAP login ``work``); nothing seeded."""
    require_tools()
    bed = SyncBed(tmp_path)
    bed.server.users[OTHER] = "secret"
    for key, value in bed.env.items():
        monkeypatch.setenv(key, value)
    bed.start()
    try:
        imapbed.write_mbsync_config(bed.mbsync_config, bed.server, OTHER, bed.mail_root,
                                    append=True)
        with bed.mail_env.fmail_config.open("a") as fh:
            fh.write(OTHER_TOML)
        yield bed
        assert not bed.dovecot_problems(), "\n".join(bed.dovecot_problems())
    finally:
        bed.close()


def test_a_delete_reaches_the_trash_of_both_accounts_servers(two_account_bed: SyncBed) -> None:
    """The same mail delivered to both accounts is one notmuch message: deleting it left the
    second account's copy in that server's INBOX."""
    bed = two_account_bed
    for user in (IMAP_USER, OTHER):
        imapbed.append(bed.server, user, "INBOX", message(1))
    bed.init()
    config = bed.config()
    assert cycle.sync(config, None, timeout=MBSYNC_TIMEOUT).ok
    mid = bed.mid(1)
    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        result = writes.delete_messages(ctx, [mid])
    assert result.applied == [mid] and not result.errors
    report = cycle.sync(config, None, timeout=MBSYNC_TIMEOUT)
    assert report.ok, report.errors()
    for user in (IMAP_USER, OTHER):
        state = imapbed.fetch_state(bed.server, user)
        assert [(folder, m.message_id) for folder, found in state.items() for m in found] == [
            ("Trash", f"<{mid}>")], (user, state)
    assert "deleted" in bed.tags(mid) and "inbox" not in bed.tags(mid)
    assert result.accounts == [ACCOUNT, OTHER]  # the answer names both
