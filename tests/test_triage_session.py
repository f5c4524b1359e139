"""An assistant's triage session through the real server and the `mcp` SDK client: what the
model is told after each step must match notmuch and the Maildir files."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest
from mcp.client.client import Client

from fmail_nm.store import sidecar

from .conftest import MailEnv
from .test_server import text
from .test_server_writes import call, server_params


def _ids(page: dict[str, Any]) -> list[str]:
    return [row[0] for row in page["rows"]]


@pytest.mark.anyio
@pytest.mark.parametrize(("query", "write", "args"), [
    ("is:unread", "update_email_status", {"mark_as": "read"}),  # a page the mirror answers
    ("in:inbox -subject:zzzznothing", "archive", {}),  # a page notmuch answers
])
async def test_the_next_page_after_triaging_the_first_skips_nothing(
        indexed: MailEnv, query: str, write: str, args: dict[str, Any]) -> None:
    """Mark read or archive what the first page showed, then ask for the next page: it goes
    on right after the last message shown, not a page's worth further on."""
    async with Client(server_params(indexed)) as client:
        first = await call(client, "search_emails", {"query": query, "limit": 4})
        shown = _ids(first)
        personal = [uid for uid in shown if uid != "896d38ca504084ce"]  # work has no Archive
        done = await call(client, write, {"ids": personal[:2], **args})
        assert len(done["applied"]) == 2
        second = await call(client, "search_emails",
                            {"query": query, "limit": 4, "cursor": first["next_cursor"]})
        now = _ids(await call(client, "search_emails", {"query": query, "limit": 100}))
        still_shown = [uid for uid in shown if uid in now]
        assert _ids(second) == now[len(still_shown):len(still_shown) + 4]


def _row(page: dict[str, Any], uid: str) -> dict[str, Any]:
    return next(dict(zip(page["columns"], row)) for row in page["rows"] if row[0] == uid)


@pytest.mark.anyio
async def test_an_edited_draft_is_listed_as_it_now_reads(indexed: MailEnv) -> None:
    """save_draft(draft_id=...) keeps the Message-ID: the listings, their search terms and
    the SQL mirror must show the new subject, recipients and date, not the first save's."""
    async with Client(server_params(indexed)) as client:
        saved = await call(client, "reply_to_email", {"id": "mum-visit-2026@example.net",
                                                      "body": "Yes, the 5th works."})
        edited = await call(client, "save_draft", {
            "draft_id": saved["id"], "subject": "Coffee on Saturday",
            "to": ["Margaret Morgan <margaret.morgan@example.net>", "Dad <dad@example.net>"],
            "body": "Yes, the 5th works. I'll bake."})
        assert edited["id"] == saved["id"]
        uid = saved["id"]  # the listings' short id, which every tool takes
        mail = await call(client, "get_email", {"id": uid})
        assert mail["subject"] == "Coffee on Saturday"
        drafts = await call(client, "search_emails", {"query": "in:drafts"})
        row = _row(drafts, uid)
        assert row["subject"] == "Coffee on Saturday"
        assert row["to"] == ["margaret.morgan@example.net", "dad@example.net"]
        assert row["timestamp"] == int(datetime.fromisoformat(mail["date"]).timestamp())
        line = next(li for li in (await text(client, "search_emails", {"query": "in:drafts"}))
                    .splitlines() if li.startswith(uid))
        assert line.endswith("D to Margaret Morgan, Dad | Coffee on Saturday")
        # its words are the new text's: the old subject no longer finds it
        assert (await call(client, "search_emails", {"query": "subject:visiting in:drafts"}))["total"] == 0
        sql = await call(client, "query_emails", {"sql_query": (
            f"SELECT subject, recipients, body_preview FROM emails WHERE uid = '{uid}'")})
        subject, recipients, preview = sql["rows"][0]
        assert subject == "Coffee on Saturday" and "dad@example.net" in recipients
        assert preview.startswith("Yes, the 5th works. I'll bake.")
        # the thread it answers is still its thread
        assert mail["thread"] == (await call(client, "get_email", {
            "id": "mum-visit-2026@example.net", "max_body_chars": 1}))["thread"]


@pytest.mark.anyio
async def test_the_next_page_of_threads_after_reading_the_first_skips_nothing(
        indexed: MailEnv) -> None:
    async with Client(server_params(indexed)) as client:
        first = await call(client, "list_threads", {"query": "is:unread", "limit": 4})
        shown = [t["thread"] for t in first["threads"]]
        read = {"query": f"thread:{shown[0]} OR thread:{shown[1]}"}
        dry = await call(client, "mark_read", read)
        await call(client, "mark_read", {**read, "confirm_count": dry["match_count"]})
        second = await call(client, "list_threads", {"query": "is:unread", "limit": 4,
                                                     "cursor": first["next_cursor"]})
        now = [t["thread"] for t in (await call(client, "list_threads", {
            "query": "is:unread", "limit": 100}))["threads"]]
        assert [t["thread"] for t in second["threads"]] == now[2:6]


@pytest.mark.anyio
async def test_listed_times_are_on_the_days_the_search_language_counts(
        indexed: MailEnv) -> None:
    """on:/after:/today count the user's (the machine's) days: a line must show its message
    on the day the search found it on, and say which clock it reads."""
    params = server_params(indexed)
    params.env = {**(params.env or {}), "TZ": "Asia/Tokyo"}
    async with Client(params) as client:
        found = await call(client, "search_emails", {"query": "on:2026-11-30"})
        # Tom's mail of 2026-11-29 19:05 UTC is 2026-11-30 04:05 in Tokyo
        assert _ids(found) == ["896d38ca504084ce"] and found["rows"][0][1] == 1795979100
        lines = (await text(client, "search_emails", {"query": "on:2026-11-30"})).splitlines()
        assert "UTC+09:00" in lines[0]
        assert lines[1].startswith("896d38ca504084ce 2026-11-30 04:05 U ")
        threads = (await text(client, "list_threads", {"query": "on:2026-11-30"})).splitlines()
        assert "UTC+09:00" in threads[0] and " 2026-11-30 04:05 " in threads[1]


NEWEST = """\
From: Someone <someone@example.net>
To: Alex Morgan <alex.morgan@example.org>
Subject: {subject}
Date: Sun, 06 Dec 2026 10:00:00 +0000
Message-ID: <{mid}>

Hello.
"""


def test_the_next_page_after_new_mail_arrived_repeats_nothing(indexed: MailEnv) -> None:
    """New mail lands on top of a newest-first listing between two pages: the next page goes
    on after the last message shown, not a page's worth down (which repeated the last ones)."""
    from fmail_nm.store.notmuch import Reader
    from fmail_nm.tools import reads
    with Reader() as reader:
        first = reads.search_emails(reads.Mailbox(indexed.config(), reader), "in:inbox", limit=3)
    inbox = indexed.mail_root / "personal" / "INBOX" / "new"
    for n in range(2):
        (inbox / f"1796500000.{n}_new{n}.host").write_text(
            NEWEST.format(subject=f"new {n}", mid=f"newest-{n}@example.net"))
    indexed.fmail("index")
    with Reader() as reader:
        mb = reads.Mailbox(indexed.config(), reader)
        second = reads.search_emails(mb, "in:inbox", limit=3, cursor=first.next_cursor)
        now = [e.id for e in reads.search_emails(mb, "in:inbox", limit=100).results]
    shown = [e.id for e in first.results]
    assert set(now[:2]) == {sidecar.uid_for(f"newest-{n}@example.net") for n in (0, 1)}
    after = now.index(shown[-1]) + 1
    assert [e.id for e in second.results] == now[after:after + 3]


def _shown(tool: str, page: dict[str, Any]) -> list[str]:
    """The ids a search page lists, or the threads a thread page lists."""
    return _ids(page) if tool == "search_emails" else [t["thread"] for t in page["threads"]]


PAGER = """\
From: Pager <pager@example.net>
To: Alex Morgan <alex.morgan@example.org>
Subject: pager {n}
Date: {date}
Message-ID: <pager-{n}@example.net>

Hello.
"""


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["search_emails", "list_threads"])
async def test_the_next_page_after_mail_above_left_skips_none_of_the_last_shown_second(
        indexed: MailEnv, tool: str) -> None:
    """The last message shown shares its second with the next one, and mail above both
    leaves the search between the pages: the next page still shows that next message."""
    dates = ["Sun, 06 Dec 2026 12:00:00 +0000", "Sun, 06 Dec 2026 11:00:00 +0000",
             "Sun, 06 Dec 2026 11:00:00 +0000", "Sun, 06 Dec 2026 10:00:00 +0000"]
    inbox = indexed.mail_root / "personal" / "INBOX" / "new"
    for n, date in enumerate(dates):
        (inbox / f"1796500000.{n}_pager{n}.host").write_text(PAGER.format(n=n, date=date))
    indexed.fmail("index")
    uids = [sidecar.uid_for(f"pager-{n}@example.net") for n in range(4)]
    query = {"query": "in:inbox subject:pager", "limit": 2}

    async with Client(server_params(indexed)) as client:
        first = await call(client, tool, query)
        done = await call(client, "archive", {"ids": [uids[0]]})
        assert len(done["applied"]) == 1
        listed, page = _shown(tool, first), first
        while page.get("next_cursor") and len(listed) < 8:
            page = await call(client, tool, {**query, "cursor": page["next_cursor"]})
            listed += _shown(tool, page)
        if tool == "list_threads":  # a thread of its own for each message
            uids = [(await call(client, "get_email", {"id": uid, "max_body_chars": 1}))["thread"]
                    for uid in uids]
    assert set(uids[1:]) <= set(listed)


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["search_emails", "list_threads"])
async def test_pages_through_one_second_of_many_while_new_mail_comes_above(
        indexed: MailEnv, tool: str) -> None:
    """Five messages share a second, pages hold two, and a new message comes above them
    before each next page: every one of the five is listed once, and the pages end."""
    inbox = indexed.mail_root / "personal" / "INBOX" / "new"
    for n in range(5):
        (inbox / f"1796500000.{n}_pager{n}.host").write_text(
            PAGER.format(n=n, date="Sun, 06 Dec 2026 11:00:00 +0000"))
    indexed.fmail("index")
    query = {"query": "in:inbox subject:pager", "limit": 2}

    async with Client(server_params(indexed)) as client:
        page = await call(client, tool, query)
        listed, pages = _shown(tool, page), 1
        while page.get("next_cursor") and pages < 6:
            (inbox / f"1796500100.{pages}_newer.host").write_text(PAGER.format(
                n=f"new-{pages}", date=f"Sun, 06 Dec 2026 12:0{pages}:00 +0000"))
            indexed.fmail("index")
            page = await call(client, tool, {**query, "cursor": page["next_cursor"]})
            listed, pages = listed + _shown(tool, page), pages + 1
        wanted = [sidecar.uid_for(f"pager-{n}@example.net") for n in range(5)]
        if tool == "list_threads":  # a thread of its own for each message
            wanted = [(await call(client, "get_email", {"id": uid, "max_body_chars": 1}))["thread"]
                      for uid in wanted]
    assert sorted(listed) == sorted(wanted)
    assert page.get("next_cursor") is None


REPLY = """\
From: Pager <pager@example.net>
To: Alex Morgan <alex.morgan@example.org>
Subject: Re: pager {n}
Date: {date}
Message-ID: <pager-{n}-reply@example.net>
In-Reply-To: <pager-{n}@example.net>
References: <pager-{n}@example.net>

Hello again.
"""


@pytest.mark.anyio
async def test_the_next_thread_page_after_the_last_threads_newest_match_left_skips_none(
        indexed: MailEnv) -> None:
    """The last thread shown loses its newest match between pages (its reply archived, its
    first message still in the inbox), so it now ranks below threads not shown yet: the next
    page still shows those threads."""
    inbox = indexed.mail_root / "personal" / "INBOX" / "new"
    dates = {"0": "Sun, 06 Dec 2026 12:00:00 +0000", "1": "Sun, 06 Dec 2026 09:00:00 +0000",
             "2": "Sun, 06 Dec 2026 10:30:00 +0000", "3": "Sun, 06 Dec 2026 10:00:00 +0000"}
    for n, date in dates.items():
        (inbox / f"1796500000.{n}_pager{n}.host").write_text(PAGER.format(n=n, date=date))
    (inbox / "1796500001.1_reply.host").write_text(
        REPLY.format(n=1, date="Sun, 06 Dec 2026 11:00:00 +0000"))
    indexed.fmail("index")
    query = {"query": "in:inbox subject:pager", "limit": 2}
    async with Client(server_params(indexed)) as client:
        threads = {n: (await call(client, "get_email", {"id": f"pager-{n}@example.net",
                                                        "max_body_chars": 1}))["thread"]
                   for n in dates}
        first = await call(client, "list_threads", query)
        assert [t["thread"] for t in first["threads"]] == [threads["0"], threads["1"]]
        done = await call(client, "archive", {"ids": ["pager-1-reply@example.net"]})
        assert len(done["applied"]) == 1
        listed, page = [], first
        while page.get("next_cursor") and len(listed) < 8:
            page = await call(client, "list_threads", {**query, "cursor": page["next_cursor"]})
            listed += [t["thread"] for t in page["threads"]]
    assert {threads["2"], threads["3"]} <= set(listed)


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["search_emails", "list_threads"])
async def test_a_page_notmuch_reads_after_one_the_mirror_read_skips_none_of_one_second(
        indexed: MailEnv, tool: str) -> None:
    """Three messages share the newest second; the first page (from the mirror) shows one,
    then the mirror lags (a tag set with notmuch alone) and notmuch reads the next page: the
    other two are on it."""
    inbox = indexed.mail_root / "personal" / "INBOX" / "new"
    for n in "abc":  # indexed in Message-ID order
        (inbox / f"1796500000.{n}_pager.host").write_text(
            PAGER.format(n=n, date="Sun, 06 Dec 2026 23:00:00 +0000"))
        indexed.fmail("index")
    query = {"query": "in:inbox", "limit": 1}

    async with Client(server_params(indexed)) as client:
        wanted = {sidecar.uid_for(f"pager-{n}@example.net") for n in "abc"}
        if tool == "list_threads":  # a thread of its own for each message
            wanted = {(await call(client, "get_email", {"id": uid, "max_body_chars": 1}))[
                "thread"] for uid in wanted}
        first = await call(client, tool, query)
        indexed.notmuch("tag", "+lagging", "--", "from:pager@example.net")
        second = await call(client, tool, {**query, "limit": 2, "cursor": first["next_cursor"]})
    assert _shown(tool, first)[0] in wanted
    assert set(_shown(tool, second)) == wanted - set(_shown(tool, first))


@pytest.mark.anyio
async def test_a_thread_page_ending_with_mail_dated_far_ahead_has_a_cursor_that_reads(
        indexed: MailEnv) -> None:
    """Mail is untrusted: a message dated in the year 9999 ranks its thread first, and the
    cursor of a page ending with that thread still reads and leads to the next thread."""
    inbox = indexed.mail_root / "personal" / "INBOX" / "new"
    dates = {"0": "Fri, 31 Dec 9999 23:59:59 +0000", "1": "Sun, 06 Dec 2026 12:00:00 +0000"}
    for n, date in dates.items():
        (inbox / f"1796500000.{n}_pager{n}.host").write_text(PAGER.format(n=n, date=date))
    indexed.fmail("index")
    query = {"query": "in:inbox subject:pager", "limit": 1}
    async with Client(server_params(indexed)) as client:
        later = (await call(client, "get_email", {"id": "pager-1@example.net",
                                                  "max_body_chars": 1}))["thread"]
        first = await call(client, "list_threads", query)
        second = await call(client, "list_threads", {**query, "cursor": first["next_cursor"]})
        # The first thread leaves the search, so the page resumes at the cursor's rank: the
        # widest a cursor carries still reads.
        assert (await call(client, "archive", {"ids": ["pager-0@example.net"]}))["applied"]
        # (the mark before the date: "~", or "_" on pages in notmuch's order, as here)
        widest = re.sub(r"([~_])\d+", r"\g<1>" + "9" * 12, first["next_cursor"])
        assert widest != first["next_cursor"]
        resumed = await call(client, "list_threads", {**query, "cursor": widest})
    assert [t["thread"] for t in second["threads"]] == [later]
    assert [t["thread"] for t in resumed["threads"]] == [later]


# More messages of one second than a resumed page reads to find the last one shown among them
# (reads.MAX_SECOND_SCAN).
MANY_IN_ONE_SECOND = 1100


@pytest.mark.parametrize(("tool", "query"), [
    ("search_emails", "in:inbox subject:pager"),  # pages notmuch reads
    ("search_emails", "in:inbox"),  # pages the mirror reads
    ("list_threads", "in:inbox subject:pager"),
])
def test_pages_through_a_second_of_more_than_a_scan_while_new_mail_comes_above(
        indexed: MailEnv, tool: str, query: str) -> None:
    """More messages share a second than a resumed page looks among for the last one shown,
    and new mail comes above them between pages: every one is listed once, the pages end."""
    from fmail_nm.store.notmuch import Reader
    from fmail_nm.tools import reads
    inbox = indexed.mail_root / "personal" / "INBOX" / "new"
    for n in range(MANY_IN_ONE_SECOND):
        (inbox / f"1796500000.{n}_pager{n}.host").write_text(
            PAGER.format(n=n, date="Sun, 06 Dec 2026 11:00:00 +0000"))
    indexed.fmail("index")
    wanted = {sidecar.uid_for(f"pager-{n}@example.net") for n in range(MANY_IN_ONE_SECOND)}

    def page(cursor: str | None) -> tuple[list[str], str | None]:
        with Reader() as reader:
            mb = reads.Mailbox(indexed.config(), reader)
            if tool == "search_emails":
                found = reads.search_emails(mb, query, limit=200, cursor=cursor)
                return [e.id for e in found.results], found.next_cursor
            threads = reads.list_threads(mb, query, limit=200, cursor=cursor)
            return [t.thread for t in threads.threads], threads.next_cursor

    listed, cursor = page(None)
    for n in range(12):
        if cursor is None:
            break
        (inbox / f"1796500100.{n}_newer.host").write_text(PAGER.format(
            n=f"new-{n}", date=f"Sun, 06 Dec 2026 12:{n:02}:00 +0000"))
        indexed.fmail("index")
        shown, cursor = page(cursor)
        listed += shown
    if tool == "list_threads":  # a thread of its own for each message
        with Reader() as reader:
            wanted = {m.thread_id for m in reader.messages("subject:pager -subject:new")}
    assert cursor is None
    assert len(listed) == len(set(listed))
    assert wanted <= set(listed)


def test_a_resumed_page_counts_the_total_once_and_goes_on_after_a_left_item(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed page whose last item moved reads up to three pages of one search (from the
    cursor, among the last item's second, from where it stands now): the total they share is
    counted once.  Where the last item left, the page goes on after where it stood in its
    second (it was read again from that second's start).  The pages stay those of notmuch's
    order."""
    import notmuch2

    from fmail_nm.store.notmuch import Reader
    from fmail_nm.tools import reads
    inbox = indexed.mail_root / "personal" / "INBOX" / "new"
    for n in range(6):
        (inbox / f"1796500000.{n}_pager{n}.host").write_text(
            PAGER.format(n=n, date="Sun, 06 Dec 2026 11:00:00 +0000"))
    indexed.fmail("index")
    counted: list[str] = []
    real_count = notmuch2.Database.count_messages

    def counting(db: notmuch2.Database, query: str, **kwargs: Any) -> int:
        counted.append(query)
        return real_count(db, query, **kwargs)
    monkeypatch.setattr(notmuch2.Database, "count_messages", counting)

    def search(cursor: str | None = None, limit: int = 2) -> tuple[list[str], str | None]:
        with Reader() as reader:
            found = reads.search_emails(reads.Mailbox(indexed.config(), reader),
                                        "in:inbox subject:pager", limit=limit, cursor=cursor)
        return [e.id for e in found.results], found.next_cursor

    def everything() -> list[str]:
        return search(limit=100)[0]
    first, cursor = search()
    total = counted[0]  # the search as it reaches notmuch
    (inbox / "1796500100.0_newer.host").write_text(
        PAGER.format(n="new", date="Sun, 06 Dec 2026 12:00:00 +0000"))
    indexed.fmail("index")
    counted.clear()
    second, cursor = search(cursor)
    assert counted.count(total) == 1
    assert second == everything()[3:5]

    mids = {sidecar.uid_for(f"pager-{n}@example.net"): f"pager-{n}@example.net" for n in range(6)}
    indexed.notmuch("tag", "-inbox", "--", f"id:{mids[second[-1]]}")
    counted.clear()
    third, _ = search(cursor, limit=1)  # (not the last page, which counts the hidden too)
    assert counted.count(total) == 1
    assert third == everything()[4:5]  # right after where the archived item stood
