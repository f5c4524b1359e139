"""Every page of generated searches and thread listings, walked to the end with the clock
moving between pages, against notmuch2 asked directly: the same messages and threads, in the
same date order, with notmuch's totals.  On the fixture's ~170 messages small pages make the
reads take every path they have -- the mirror's pages, its tag scans, the recent-mail and
sender windows, notmuch's whole search -- and later pages check the cursors."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import notmuch2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fmail_nm.store.notmuch import Reader
from fmail_nm.tools import reads

from .conftest import MailEnv

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
SORTS = {"newest": notmuch2.Database.SORT.NEWEST_FIRST,
         "oldest": notmuch2.Database.SORT.OLDEST_FIRST}

WORDS = ["cabin", "release", "invoice", "trail", "school", "contract", '"science museum"',
         "subject:reminder", "from:anna", "from:alex@example.org",
         "from:no-reply@northwind-bank.example.com", "from:margaret.morgan@example.net",
         "to:alex@example.org"]
TAGS = ["is:unread", "-is:unread", "in:inbox", "-in:inbox", "is:flagged", "is:replied",
        "list:rust-users", "list:hikers", "has:attachment", "in:sent", "in:anywhere",
        "in:trash", "in:spam", "in:archive"]
DATES = ["after:2026/03/01", "before:2026/06/01", "after:2026/01/01 before:2026/10/01",
         "newer_than:60d", "older_than:30d", "newer_than:1y"]

Clause = st.sampled_from(WORDS) | st.sampled_from(TAGS) | st.sampled_from(DATES)
Searches = st.lists(Clause, min_size=0, max_size=3).map(" ".join) | st.tuples(
    st.sampled_from(WORDS + TAGS), st.sampled_from(WORDS + TAGS)).map(" OR ".join)
Scopes = st.sampled_from([{}, {}, {"since": "2026-05-01"}, {"until": "2026-09-30"},
                          {"since": "2026-02-01", "until": "2026-11-15"}])


class MovingClock:
    """Now, moved on by hand: a later page is asked for later than the first."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now

    def tick(self) -> None:
        self.now += timedelta(hours=7)


@pytest.fixture(scope="module")
def walk(shared_indexed: MailEnv) -> Iterator[tuple[reads.Mailbox, MovingClock, notmuch2.Database]]:
    clock = MovingClock()
    config = shared_indexed.config()
    db = notmuch2.Database(mode=notmuch2.Database.MODE.READ_ONLY,
                           config=notmuch2.Database.CONFIG.SEARCH)
    with Reader() as reader:
        yield reads.Mailbox(config, reader, clock=clock), clock, db
    db.close()


def _truth(mb: reads.Mailbox, text: str, scope: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """The notmuch query the first page ran (relative dates counted from NOW)."""
    compiled = mb.compile(text, int(NOW.timestamp()))
    return reads.scoped_query(mb, compiled, **scope), compiled.exclude_tags


SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(text=Searches, scope=Scopes, sort=st.sampled_from(["newest", "newest", "oldest"]),
       limit=st.integers(1, 7))
def test_every_page_of_a_search_is_notmuchs(walk: tuple[reads.Mailbox, MovingClock, notmuch2.Database],
                                            text: str, scope: dict[str, str], sort: str,
                                            limit: int) -> None:
    mb, clock, db = walk
    clock.now = NOW
    query, excluded = _truth(mb, text, scope)
    truth = [(m.messageid, m.date) for m in db.messages(query, exclude_tags=excluded,
                                                         sort=SORTS[sort])]
    got: list[tuple[str, int]] = []
    cursor = None
    while True:
        page = reads.search_emails(mb, text, limit=limit, cursor=cursor, sort=sort, **scope)
        assert page.total == len(truth)
        assert len(page.results) <= limit
        for row in page.results:
            found = mb.find(row.id)
            assert found is not None
            got.append((found.message_id, found.date))
        if (cursor := page.next_cursor) is None:
            break
        assert len(page.results) == limit
        clock.tick()
    assert sorted(got) == sorted(truth) and len(got) == len(truth)
    assert [date for _, date in got] == [date for _, date in truth]


@SETTINGS
@given(text=Searches, scope=Scopes, limit=st.integers(1, 5))
def test_every_page_of_a_thread_listing_is_notmuchs(
        walk: tuple[reads.Mailbox, MovingClock, notmuch2.Database], text: str,
        scope: dict[str, str], limit: int) -> None:
    mb, clock, db = walk
    clock.now = NOW
    text = text or "*"
    query, excluded = _truth(mb, text, scope)
    truth = {t.threadid: (t.last, len(t), t.matched)
             for t in db.threads(query, exclude_tags=excluded, sort=SORTS["newest"])}
    got: list[tuple[str, int, int]] = []
    cursor = None
    while True:
        page = reads.list_threads(mb, text, limit=limit, cursor=cursor, **scope)
        assert page.total in (None, len(truth))
        got += [(t.thread, t.messages, t.matched) for t in page.threads]
        if (cursor := page.next_cursor) is None:
            break
        clock.tick()
    assert len(got) == len(truth) and {t for t, _, _ in got} == set(truth)
    assert all(truth[t][1:] == (messages, matched) for t, messages, matched in got)
    newest = [truth[t][0] for t, _, _ in got]
    assert newest == sorted(newest, reverse=True)
