"""Pages the mirror answers along its index of the mail a search shows -- all mail by date, a
date range, the newest threads of tags -- are notmuch's pages, with notmuch's totals; and
notmuch answers while the mirror lags or stands for other exclusions."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

import notmuch2

import pytest

from fmail_nm.clock import iso_from_epoch
from fmail_nm.dsl import date_range_query
from fmail_nm.passes import mirror
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader
from fmail_nm.store.query import (Conjunction, all_of, conjunction, quote,
                                    sender_conjunction)
from fmail_nm.tools import reads

from .conftest import BACK_TO_SCHEMA_4, MailEnv
from .test_lean_reads import NEW_MAIL, uid

EXCLUDED = ("deleted", "spam")
SCHOOL_1 = "school-trip-1@example.com"


@pytest.fixture
def mailbox(indexed: MailEnv) -> Iterator[reads.Mailbox]:
    with Reader() as reader:
        yield reads.Mailbox(indexed.config(), reader)


def notmuch_page(query: str, sort: str, exclude: tuple[str, ...] = EXCLUDED
                 ) -> list[tuple[str, int]]:
    with Reader() as reader:
        return [(m.message_id, m.date) for m in reader.messages(
            query, exclude_tags=exclude, sort=sort, limit=1000)]


def every_page(mb: reads.Mailbox, text: str, sort: str, limit: int, **scope: str
               ) -> tuple[list[tuple[str, int]], set[int]]:
    """Every page of a search as (Message-ID, date), and the totals the pages gave."""
    got: list[tuple[str, int]] = []
    totals: set[int] = set()
    cursor = None
    while True:
        result = reads.search_emails(mb, text, limit=limit, cursor=cursor, sort=sort, **scope)
        totals.add(result.total)
        for row in result.results:
            m = mb.find(row.id)
            assert m is not None
            got.append((m.message_id, m.date))
        cursor = result.next_cursor
        if cursor is None:
            return got, totals


def same_order(pages: list[tuple[str, int]], truth: list[tuple[str, int]]) -> None:
    """The same messages in the same date order (messages of one date in either order)."""
    assert sorted(pages) == sorted(truth) and len(pages) == len(truth)
    assert [d for _, d in pages] == [d for _, d in truth]


def answered_by_mirror(mb: reads.Mailbox, text: str, **scope: str) -> bool:
    compiled = mb.compile(text)
    nm_query = reads.scoped_query(mb, compiled, **scope)
    mirror = reads.answerable(mb, nm_query, compiled.exclude_tags)
    return reads._page_from_mirror(mirror, "newest", 0, 5) is not None


def indexing_once(monkeypatch: pytest.MonkeyPatch, owner: object, name: str,
                  index: Callable[[], None],
                  when: Callable[[str], bool] = lambda _: True) -> list[bool]:
    """``owner.name`` wrapped: its first call whose query ``when`` accepts runs
    ``index`` first (mail delivered and indexed by a real notmuch new in the middle of a
    read); the list returned is emptied then, for the test to see it happened."""
    wrapped, pending = getattr(owner, name), [True]

    def indexing(*args: Any, **kwargs: Any) -> Any:
        if pending and when(args[0] if args else kwargs.get("query", "")):
            pending.clear()
            index()
        return wrapped(*args, **kwargs)

    monkeypatch.setattr(owner, name, indexing)
    return pending


def test_all_mail_and_date_ranges_page_as_notmuch_does(mailbox: reads.Mailbox) -> None:
    cases = [("", {}), ("after:2026-03-01 before:2026-11-01", {}), ("after:2026-10-01", {}),
             ("", {"since": "2026-02-01", "until": "2026-09-30"}),
             # ends inside days: whole days are counted by day, the ends along the index
             ("", {"since": "2026-03-09T07:00:00Z", "until": "2026-10-15T05:30:00Z"}),
             ("", {"since": "2026-03-09T07:00:00Z", "until": "2026-03-09T20:00:00Z"})]
    for text, scope in cases:
        nm_query = reads.scoped_query(mailbox, mailbox.compile(text), **scope)
        assert answered_by_mirror(mailbox, text, **scope), nm_query
        for sort in ("newest", "oldest"):
            truth = notmuch_page(nm_query, sort)
            assert truth, nm_query
            for limit in (1, 7, 50):
                pages, totals = every_page(mailbox, text, sort, limit, **scope)
                same_order(pages, truth)
                assert totals == {len(truth)}, (nm_query, sort, limit)
        # the last page says how many spam and deleted messages match too
        whole = len(notmuch_page(nm_query, "newest", ()))
        last = reads.search_emails(mailbox, text, limit=500, **scope)
        assert last.next_cursor is None and (last.hidden or 0) == whole - len(truth), nm_query
    assert reads.search_emails(mailbox, "", limit=500).hidden  # the fixtures have spam


PRE_1970 = b"""\
From: Old Timer <old@example.com>
To: Alex Morgan <alex@example.org>
Subject: From 1965
Date: Mon, 01 Mar 1965 10:00:00 +0000
Message-ID: <old-1965@example.com>

Hello.
"""


def test_mail_and_ranges_before_1970_are_where_notmuch_files_them(
        indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    # notmuch files mail dated before 1970 where it files undated mail, at 0, and refuses a
    # negative date in a query: a since/until before 1970 is put as after:/before: put it.
    (indexed.mail_root / "personal" / "INBOX" / "cur" / "1965.old.host:2,S").write_bytes(PRE_1970)
    indexed.notmuch("new", "--no-hooks")
    mirror.sync_sidecar(indexed.config(), mailbox.reader)
    found = mailbox.find("old-1965@example.com")
    assert found is not None and found.date == 0
    nm_query = reads.scoped_query(mailbox, mailbox.compile(""))
    assert answered_by_mirror(mailbox, "")
    for sort in ("newest", "oldest"):
        same_order(every_page(mailbox, "", sort, 7)[0], notmuch_page(nm_query, sort))
    undated = {"old-1965@example.com", "no-date-1@parcelgo.example.net"}
    june_end = 1782863999  # 2026-06-30T23:59:59Z
    for scope, truth_query in (({"since": "1960-01-01"}, "date:@0.."),
                               ({"since": "1960-01-01", "until": "2026-06-30"},
                                f"date:@0..@{june_end}"),
                               ({"until": "1965-12-31"}, None)):
        got = reads.search_emails(mailbox, "", limit=500, **scope)
        ids = [mailbox.find(r.id).message_id for r in got.results]  # type: ignore[union-attr]
        truth = [m for m, _ in notmuch_page(truth_query, "newest")] if truth_query else []
        assert sorted(ids) == sorted(truth) and got.total == len(truth), scope
        assert set(ids) >= undated if truth_query else not ids, scope


def test_what_the_mirror_does_not_answer_is_left_to_notmuch(mailbox: reads.Mailbox) -> None:
    # A date range open at its start reaches undated and pre-1970 mail, which notmuch
    # ranges in its own way; a search that names spam shows what the mirror leaves out.
    for text in ("before:2026-06-01", "in:spam", "in:inbox", "from:anna"):
        assert not answered_by_mirror(mailbox, text), text
        nm_query = reads.scoped_query(mailbox, mailbox.compile(text))
        truth = notmuch_page(nm_query, "newest", mailbox.compile(text).exclude_tags)
        same_order(every_page(mailbox, text, "newest", 4)[0], truth)


def test_conjunctions_of_tags_and_dates_are_read_and_nothing_else() -> None:
    assert conjunction("*") == Conjunction((), None, None)
    read = conjunction('(tag:"inbox") AND tag:unread AND (date:@5.. AND date:..@9)')
    assert read is not None and (read.tags, read.since, read.until) == (("inbox", "unread"), 5, 9)
    assert conjunction('tag:"a AND b"') == Conjunction(("a AND b",), None, None)
    # the DSL's list: regex is read; a regex where POSIX and Python could differ is not
    listed = conjunction('tag:"/^list/(.*\\.)?rust-users(\\..*)?$/"')
    assert listed is not None and listed.tag_groups(
        ["list/rust-users.lists.example.org", "list/rust-users", "list/trust-users.org", "inbox"]
    ) == [("list/rust-users.lists.example.org", "list/rust-users")]
    for query in ('tag:"/a|b/"', 'tag:"/a.b/"', 'tag:"/é/"', 'tag:"/[ab]/"', "tag:foo*", "date:..@5", "date:@0..", "tag:a tag:b",
                  "tag:a OR tag:b", "NOT tag:a", "(tag:a", "tag:a)", "tag:a AND", "from:x",
                  "date:..", "* AND tag:a", ""):
        assert conjunction(query) is None, query
    # from:"<address>" with tags and dates: the mirror's senders estimate where its mail is
    assert sender_conjunction('(from:"Ann@Example.com") AND (tag:"unread")') == (
        "ann@example.com", Conjunction(("unread",), None, None))
    assert conjunction('from:"ann@example.com"') is None
    for query in ('from:"ann"', 'from:"ann@example.com" AND "linux"', 'NOT from:"a@b.c"',
                  'from:"a@b.c" AND from:"d@e.f"', 'from:"a@b.c" OR tag:x', "tag:inbox"):
        assert sender_conjunction(query) is None, query


def test_a_sender_search_looks_among_the_senders_newest_mail_when_a_page_of_it_is_there(
        mailbox: reads.Mailbox) -> None:
    # A page of 2 looks first among the sender's own 4 newest messages (twice the page):
    # Margaret wrote 8, Marco 2 (notmuch then searches all his mail at once), and none of
    # Margaret's is flagged.
    window = {who: reads._recent_window(mailbox, mailbox.compile(f"from:{who}").query, 40, 2)
              for who in ("margaret.morgan@example.net", "Marco.Rossi@acme.test")}
    fourth = notmuch_page(mailbox.compile("from:margaret.morgan@example.net").query,
                          "newest")[3][1]
    assert window["margaret.morgan@example.net"] == f"date:@{fourth}.."
    assert window["Marco.Rossi@acme.test"] is None
    assert reads._recent_window(mailbox, mailbox.compile("from:margaret.morgan@example.net "
                                                         "is:flagged").query, 40, 2) is None
    for who in window:
        nm_query = mailbox.compile(f"from:{who}").query
        truth = notmuch_page(nm_query, "newest")
        assert truth
        for limit in (1, 2, 3):
            listed, totals = every_page(mailbox, f"from:{who}", "newest", limit)
            same_order(listed, truth)
            assert totals == {len(truth)}


def notmuch_threads(query: str, limit: int, offset: int = 0) -> list[tuple[str, int, int]]:
    with Reader() as reader:
        return [(t.thread_id, t.matched_count, t.message_count) for t in reader.threads(
            query, exclude_tags=EXCLUDED, offset=offset, limit=limit)]


def test_thread_pages_of_tags_and_dates_are_notmuchs(mailbox: reads.Mailbox) -> None:
    conn = reads.current_mirror(mailbox, EXCLUDED)
    assert conn is not None
    # The window of a first page: 20 messages per thread; "in:inbox" finds its threads there.
    assert sidecar.newest_threads(conn, [("inbox",)], want=4, scan=80) is not None
    for text in ("in:inbox", "in:inbox is:unread", "is:starred", "after:2026-03-01", "",
                 "list:rust-users", "list:example.org after:2026-06-01", "list:no-such-list"):
        nm_query = reads.scoped_query(mailbox, mailbox.compile(text))
        truth = notmuch_threads(nm_query, 1000)
        assert truth or "no-such" in text, text
        for limit in (1, 3, 50):
            got, cursor = [], None
            while True:
                page = reads.list_threads(mailbox, text, limit=limit, cursor=cursor)
                got += [(t.thread, t.matched, t.messages) for t in page.threads]
                assert len(page.threads) <= limit
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert got == truth, (text, limit)
    # the message count of one tag, two, or a list is the mirror's, as notmuch counts it
    with Reader() as reader:
        for text in ("in:inbox", "in:inbox is:unread", "list:rust-users", "list:no-such-list"):
            query = reads.scoped_query(mailbox, mailbox.compile(text))
            assert reads._kept_counts(reads.answerable(mailbox, query, EXCLUDED))
            assert reads.list_threads(mailbox, text).matched_messages == reader.count(
                query, exclude_tags=EXCLUDED), text
    # unread_only is one more tag
    unread = reads.list_threads(mailbox, "in:inbox", unread_only=True, limit=50)
    assert [t.thread for t in unread.threads] == [
        t for t, _, _ in notmuch_threads('tag:"inbox" AND tag:unread', 1000)]


def libnotmuch_threads(query: str) -> dict[str, tuple[object, ...]]:
    """Each thread libnotmuch builds for a query, read through the bindings alone: subject,
    authors (its string split), dates, message counts and tags."""
    db = notmuch2.Database(mode=notmuch2.Database.MODE.READ_ONLY,
                           config=notmuch2.Database.CONFIG.SEARCH)
    try:
        return {str(t.threadid): (
            str(t.subject), tuple(re.split(r", |\| ", str(t.authors))) if str(t.authors) else (),
            iso_from_epoch(t.first) or "", iso_from_epoch(t.last) or "", len(t), t.matched,
            tuple(sorted(str(tag) for tag in t.tags)))
            for t in db.threads(query, exclude_tags=EXCLUDED)}
    finally:
        db.close()


def listed_threads(mb: reads.Mailbox, text: str, **kwargs: Any) -> dict[str, tuple[object, ...]]:
    """Every page of list_threads, as libnotmuch_threads has them."""
    found, cursor = {}, None
    while True:
        page = reads.list_threads(mb, text, limit=7, cursor=cursor, **kwargs)
        for t in page.threads:
            found[t.thread] = (t.subject, tuple(t.authors), t.oldest, t.newest, t.messages,
                               t.matched, tuple(t.tags))
        cursor = page.next_cursor
        if cursor is None:
            return found


def test_threads_summarized_by_the_mirror_are_libnotmuchs(mailbox: reads.Mailbox) -> None:
    assert reads.current_mirror(mailbox, EXCLUDED) is not None
    for text in ("in:inbox", "in:inbox is:unread", "is:starred", "after:2026-03-01", "",
                 "list:rust-users", "list:example.org after:2026-06-01", "is:sent"):
        nm_query = reads.scoped_query(mailbox, mailbox.compile(text))
        assert reads.answerable(mailbox, nm_query, EXCLUDED) is not None, text
        truth = libnotmuch_threads(nm_query)
        assert truth and listed_threads(mailbox, text) == truth, text


THREAD_MAIL = [
    ("boat-1", '"Carter, Ben" <ben.carter@example.net>', "Boat trip", "01 Jan 2027 09:00", ""),
    ("boat-2", "Sam@Example.net", "RE: Boat trip", "02 Jan 2027 09:00", "boat-1"),
    ("boat-3", "Ann Lee <ann@example.com>", "", "03 Jan 2027 09:00", "boat-2"),
    ("boat-4", "Ben Carter <ben.carter@example.net>", "Re: Boat trip moved", "04 Jan 2027 09:00",
     "boat-3"),
    ("boat-5", "Prize Desk <win@prizes.example.net>", "Re: You won", "05 Jan 2027 09:00", "boat-4"),
]


class TieMail:
    """Writes test mail from one sender into the personal inbox, a file per message in the
    order asked: notmuch indexes them in that order, unlike their Message-IDs'.  ``kind``
    keeps each test's file names (and subjects) apart; ``seen`` marks them read."""

    def __init__(self, env: MailEnv, kind: str, *, seen: bool = True) -> None:
        self.cur = env.mail_root / "personal" / "INBOX" / "cur"
        self.kind, self.flags, self.written = kind, "S" if seen else "", 0

    def __call__(self, mid: str, date: str, parent: str | None = None) -> None:
        """One message; no Date header when ``date`` is empty (undated)."""
        self.written += 1
        head = f"Date: {date}\n" if date else ""
        reply = f"In-Reply-To: <{parent}>\n" if parent else ""
        self.cur.joinpath(f"1800000960.{self.kind}{self.written:04d}.host:2,{self.flags}"
                          ).write_bytes(
            f"From: Tie <tie@example.com>\nTo: alex@example.org\nSubject: {self.kind} {mid}\n"
            f"{head}Message-ID: <{mid}>\n{reply}\nx\n".encode())


def at_second(second: int) -> str:
    """A Date header's value: that second of one minute in 2027."""
    return f"Fri, 01 Jan 2027 10:00:{second:02d} +0000"


def two_crowded_seconds(indexed: MailEnv) -> Callable[[int, str], None]:
    """100 messages in each of two seconds (0 and 1), indexed in an order unlike their
    Message-IDs'; what delivers more of them."""
    tie = TieMail(indexed, "s")

    def deliver(second: int, mid: str) -> None:
        tie(mid, at_second(second))

    for second in (0, 1):
        for n in range(100):
            deliver(second, f"tie-{second}-{n * 37 % 100:03d}@example.com")
    indexed.fmail("index")
    return deliver


def deliver_thread(env: MailEnv) -> None:
    for n, (mid, sender, subject, date_, parent) in enumerate(THREAD_MAIL):
        reply = f"In-Reply-To: <{parent}@example.com>\n" if parent else ""
        (env.mail_root / "personal" / "INBOX" / "new" / f"17620000{n}.boat.host").write_bytes(
            f"From: {sender}\nTo: Alex Morgan <alex@example.org>\nSubject: {subject}\n"
            f"Date: {date_} +0000\nMessage-ID: <{mid}@example.com>\n{reply}\nHello.\n".encode())
    env.notmuch("new", "--no-hooks")
    env.notmuch("tag", "+spam", "--", "id:boat-5@example.com")
    env.notmuch("tag", "-unread", "--", "id:boat-1@example.com")


def thread_of_boat(mb: reads.Mailbox) -> str:
    found = mb.find("boat-1@example.com")
    assert found is not None
    return found.thread_id


def test_a_thread_from_the_mirror_names_its_subject_authors_and_dates_as_notmuch(
        indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    deliver_thread(indexed)
    # While the mirror lags, notmuch builds the thread; once synced, the mirror does.
    assert reads.current_mirror(mailbox, EXCLUDED) is None
    built = {text: listed_threads(mailbox, text, since="2027-01-01") for text in
             ("in:inbox", "is:unread")}
    mirror.sync_sidecar(indexed.config(), mailbox.reader)
    assert reads.current_mirror(mailbox, EXCLUDED) is not None
    early = "2027-01-03T12:00:00Z"  # the newest match then has no subject: the one before's
    for text, unread_only, until in (("in:inbox", False, None), ("is:unread", False, None),
                                     ("in:inbox", True, None), ("in:inbox", False, early)):
        got = listed_threads(mailbox, text, since="2027-01-01", until=until,
                             unread_only=unread_only)
        nm_query = reads.scoped_query(mailbox, mailbox.compile(text), since="2027-01-01",
                                      until=until, extra="tag:unread" if unread_only else None)
        truth = libnotmuch_threads(nm_query)
        assert len(got) == 1 and got.keys() == truth.keys()
        (subject, authors, *rest), (nm_subject, nm_authors, *nm_rest) = *got.values(), *truth.values()
        assert (subject, rest) == (nm_subject, nm_rest), text
        if (text, unread_only, until) in (("in:inbox", False, None), ("is:unread", False, None)):
            assert built[text] == got, text
        # The writers of matched messages first, in date order, then the rest; "Carter,
        # Ben" turned round as libnotmuch does, an address in lower case.
        assert nm_authors == tuple(a.replace("sam@example.net", "Sam@Example.net")
                                   for a in authors), text
        all_inbox = text == "in:inbox" and not unread_only
        assert authors == ((("Ben Carter",) if all_inbox else ()) + ("sam@example.net", "Ann Lee")
                           + (() if all_inbox else ("Ben Carter",))
                           + ("Prize Desk",)), text
    assert listed_threads(mailbox, "in:inbox", since="2027-01-01",
                          until=early)[thread_of_boat(mailbox)][0] == "Boat trip"
    (_, _, oldest, newest, messages, matched, tags), = listed_threads(
        mailbox, "in:inbox", since="2027-01-01").values()
    # The newest matched message's subject, one "Re: " off; the excluded one counts as a
    # message and for the tags, not as a match or for the dates.
    assert (oldest, newest, messages, matched) == ("2027-01-01T09:00:00Z", "2027-01-04T09:00:00Z",
                                                  5, 4)
    assert "spam" in tags
    assert reads.list_threads(mailbox, "in:inbox", since="2027-01-01").threads[0].subject == \
        "Boat trip moved"


def unanswered_both_ways(mb: reads.Mailbox, monkeypatch: pytest.MonkeyPatch,
                         **kwargs: Any) -> tuple[object, object]:
    """find_unanswered_threads from the mirror, then as notmuch alone answers it."""
    assert reads.current_mirror(mb, EXCLUDED) is not None
    mirrored = reads.find_unanswered_threads(mb, **kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(reads, "_unanswered_from_mirror", lambda *args: None)
        return mirrored, reads.find_unanswered_threads(mb, **kwargs)


def deliver_asks(indexed: MailEnv, mails: list[tuple[str, str, str]], *,
                 mirrored: bool = True) -> None:
    """(Message-ID's local part, From, parent's local part) the n-th dated n+1 Dec 2026;
    ``mirrored`` false: indexed without the hook, the mirror lagging."""
    for n, (mid, sender, parent) in enumerate(mails):
        reply = f"In-Reply-To: <{parent}@example.com>\n" if parent else ""
        (indexed.mail_root / "personal" / "INBOX" / "cur" / f"17630000{n}.ask.host:2,S").write_bytes(
            f"From: {sender}\nTo: Jo Park <jo.park@example.net>\nSubject: Ask {n}\n"
            f"Date: {n + 1:02} Dec 2026 09:00 +0000\nMessage-ID: <{mid}@example.com>\n{reply}\n"
            "Hello.\n".encode())
    indexed.notmuch("new", *(() if mirrored else ("--no-hooks",)))  # mirrored by the hook


def test_unanswered_threads_from_the_mirror_are_notmuchs(
        indexed: MailEnv, mailbox: reads.Mailbox, monkeypatch: pytest.MonkeyPatch) -> None:
    # The user's last word, then a reply deleted, one marked spam, and a draft: still
    # unanswered; a thread with only the user's draft in it is not one.
    deliver_asks(indexed, [("ask-1", "Alex Morgan <alex@example.org>", ""),
                           ("ask-2", "Ben Carter <ben.carter@example.net>", "ask-1"),
                           ("ask-3", "Prize Desk <win@prizes.example.net>", "ask-1"),
                           ("ask-4", "Alex Morgan <alex@example.org>", "ask-1"),
                           ("lone-1", "Alex Morgan <alex@example.org>", "")])
    indexed.notmuch("tag", "+deleted", "--", "id:ask-2@example.com")
    indexed.notmuch("tag", "+spam", "--", "id:ask-3@example.com")
    indexed.notmuch("tag", "+draft", "--", "id:ask-4@example.com", "OR", "id:lone-1@example.com")
    mirror.sync_sidecar(indexed.config(), mailbox.reader)
    for kwargs in ({"limit": 500}, {"limit": 3}, {"since": "2026-06-01", "limit": 500},
                   {"since": "2026-12-03", "limit": 500},  # only a draft of the user since
                   {"address": "Alex@Example.org", "limit": 500},
                   {"min_days_silent": 12, "limit": 500}, {"address": "nobody@example.com"}):
        mirrored, by_notmuch = unanswered_both_ways(mailbox, monkeypatch, **kwargs)
        assert mirrored == by_notmuch, kwargs
    found = reads.find_unanswered_threads(mailbox, limit=500)
    last = {t.last: t for t in found.threads}
    ask = last[sidecar.uid_for("ask-1@example.com")]
    assert (ask.messages, ask.to, ask.subject) == (4, ["Jo Park <jo.park@example.net>"], "Ask 0")
    assert sidecar.uid_for("lone-1@example.com") not in last
    # and page by page
    pages, cursor = [], None
    while True:
        page = reads.find_unanswered_threads(mailbox, limit=3, cursor=cursor)
        pages += page.threads
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == found.threads and found.total == len(pages) > 3
    # Searches that leave out more than deleted and spam mail: a last word of the user's
    # may then be left out, so notmuch answers.
    indexed.notmuch("config", "set", "search.exclude_tags", "deleted;spam;muted")
    with Reader() as reader:
        muted = reads.Mailbox(indexed.config(), reader)
        mirror.sync_sidecar(indexed.config(), reader)
        assert reads.current_mirror(muted, ("deleted", "muted", "spam")) is not None
        assert reads._unanswered_from_mirror(muted, ["alex@example.org"], None, None, 0, 5) is None
        assert reads.find_unanswered_threads(muted, limit=500) == found


def test_unanswered_threads_end_with_a_sent_reply_of_any_of_the_users_addresses(
        indexed: MailEnv, mailbox: reads.Mailbox, monkeypatch: pytest.MonkeyPatch) -> None:
    # The user's reply from the work account's address is the user's last word; a reply of
    # the user's still a draft is none: that thread waits for the user, not for Ben.
    deliver_asks(indexed, [("alias-1", "Alex Morgan <alex@example.org>", ""),
                           ("alias-2", "Ben Carter <ben.carter@example.net>", "alias-1"),
                           ("alias-3", "Alex Morgan <AMorgan@acme.test>", "alias-2"),
                           ("wait-1", "Ben Carter <ben.carter@example.net>", ""),
                           ("wait-2", "Alex Morgan <alex@example.org>", "wait-1")])
    indexed.notmuch("tag", "+draft", "--", "id:wait-2@example.com")
    mirror.sync_sidecar(indexed.config(), mailbox.reader)

    def listed(**kwargs: Any) -> set[str]:
        mirrored, by_notmuch = unanswered_both_ways(mailbox, monkeypatch, limit=500, **kwargs)
        assert mirrored == by_notmuch, kwargs
        return {t.last for t in reads.find_unanswered_threads(mailbox, limit=500, **kwargs).threads}

    alias_3, wait_2 = sidecar.uid_for("alias-3@example.com"), sidecar.uid_for("wait-2@example.com")
    assert alias_3 in listed() and wait_2 not in listed()
    assert alias_3 in listed(address="amorgan@acme.test")
    assert alias_3 not in listed(address="alex@example.org")
    # until bounds the user's last word, not the first message of theirs in the thread
    assert alias_3 not in listed(since="2026-12-01", until="2026-12-02")
    assert alias_3 not in listed(until="2026-12-02T23:00:00Z")
    assert alias_3 in listed(since="2026-12-03", until="2026-12-03")
    with pytest.raises(reads.ToolError, match="until must be an ISO 8601 date"):
        reads.find_unanswered_threads(mailbox, until="last week")


def test_a_last_word_to_blocked_people_alone_awaits_no_reply(
        indexed: MailEnv, mailbox: reads.Mailbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocking Jo makes her reply spam, which ends no thread: the user's message before it
    is the last word again, but it went to no one the user waits for -- those it went to
    are blocked, or the user.  Sent to someone else too, it still waits for them."""
    deliver_asks(indexed, [("jo-1", "Alex Morgan <alex@example.org>", ""),
                           ("jo-2", "Jo Park <jo.park@example.net>", "jo-1")])
    for day, (mid, copies) in enumerate((("also-ben", "Cc: Ben Carter <ben.carter@example.net>\n"),
                                         ("also-me", "Cc: Alex Morgan <alex@example.org>\n"))):
        (indexed.mail_root / "personal" / "Sent" / "cur" / f"1763100000.{mid}.host:2,S"
         ).write_bytes(f"From: Alex Morgan <alex@example.org>\nTo: Jo Park <jo.park@example.net>"
                       f"\n{copies}Subject: {mid}\nDate: {20 + day} Dec 2026 09:00 +0000\n"
                       f"Message-ID: <{mid}@example.org>\n\nHello.\n".encode())
    indexed.notmuch("new")  # indexed and mirrored by the hook

    def listed(**kwargs: Any) -> tuple[set[str], int]:
        mirrored, by_notmuch = unanswered_both_ways(mailbox, monkeypatch, **kwargs)
        assert mirrored == by_notmuch, kwargs
        found = reads.find_unanswered_threads(mailbox, **kwargs)
        return {t.last for t in found.threads}, found.total

    jo_1, also_ben, also_me = (sidecar.uid_for(f"{mid}@example{tld}") for mid, tld in (
        ("jo-1", ".com"), ("also-ben", ".org"), ("also-me", ".org")))
    before, total = listed(limit=500)
    assert jo_1 not in before and {also_ben, also_me} <= before
    indexed.fmail("contacts", "block", "jo.park@example.net")
    after, total_after = listed(limit=500)
    assert after == before - {also_me} and total_after == total - 1
    assert listed(limit=2)[1] == total_after


def test_a_last_word_from_a_sub_address_the_lagging_mirror_has_not_seen_is_the_users(
        indexed: MailEnv, mailbox: reads.Mailbox) -> None:
    """Mail from a sub-address of the user's that the mirror has not seen yet: notmuch answers
    while the mirror lags, and takes it for the user's last word, as the mirror does after."""
    deliver_asks(indexed, [("sub-1", "Alex Morgan <alex@example.org>", ""),
                           ("sub-2", "Ben Carter <ben.carter@example.net>", "sub-1"),
                           ("sub-3", "Alex Morgan <alex+lists@example.org>", "sub-2")],
                 mirrored=False)
    assert reads.current_mirror(mailbox, EXCLUDED) is None
    lagging = reads.find_unanswered_threads(mailbox, limit=500).threads
    assert "sub-3@example.com" in {t.last for t in lagging}  # no uid before the mirror's
    mirror.sync_sidecar(indexed.config(), mailbox.reader)
    assert reads.current_mirror(mailbox, EXCLUDED) is not None
    mirrored = reads.find_unanswered_threads(mailbox, limit=500).threads
    assert sidecar.uid_for("sub-3@example.com") in {t.last for t in mirrored}
    assert [t.thread for t in mirrored] == [t.thread for t in lagging]


def test_a_listing_reads_one_state_of_the_mirror(indexed: MailEnv,
                                                 mailbox: reads.Mailbox) -> None:
    # A sync commits while a listing is between its reads: they still agree.
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with mailbox.mirror.snapshot():
        before = sidecar.mirror_state(mailbox.mirror.connection())  # type: ignore[arg-type]
        assert before.revision is not None
        with sidecar.opened(path) as writer:
            sidecar.set_state(writer, "revision", str(before.revision + 1))
        assert sidecar.mirror_state(mailbox.mirror.connection()) == before  # type: ignore[arg-type]
    after = sidecar.mirror_state(mailbox.mirror.connection())  # type: ignore[arg-type]
    assert after.revision == before.revision + 1
    for tool in (reads.search_emails, reads.list_threads, reads.find_unanswered_threads):
        assert getattr(tool, "__wrapped__", None) is not None, tool


def test_thread_pages_while_the_mirror_lags_are_notmuchs(indexed: MailEnv,
                                                         mailbox: reads.Mailbox) -> None:
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1764666000.lag.host").write_bytes(NEW_MAIL)
    indexed.notmuch("new", "--no-hooks")
    indexed.notmuch("tag", "+inbox", "--", "id:lag-1@example.com")
    assert reads.current_mirror(mailbox, EXCLUDED) is None
    newest = reads.list_threads(mailbox, "in:inbox", limit=3).threads
    assert [t.thread for t in newest] == [t for t, _, _ in notmuch_threads('tag:"inbox"', 3)]
    assert newest[0].subject == "Lagging mirror"


def test_a_changed_exclusion_is_followed_by_the_next_sync(indexed: MailEnv) -> None:
    config = indexed.config()
    muted = ("deleted", "muted", "spam")
    indexed.notmuch("tag", "+muted", "--", f"id:{SCHOOL_1}")
    indexed.notmuch("config", "set", "search.exclude_tags", "deleted;spam;muted")
    with Reader() as reader:  # a reader reads the config as it opens
        mb = reads.Mailbox(config, reader)
        mirror.sync_sidecar(config, reader)
        assert reads.current_mirror(mb, muted) is not None
        listed, totals = every_page(mb, "", "newest", 50)
        assert SCHOOL_1 not in {mid for mid, _ in listed}
        same_order(listed, notmuch_page("*", "newest", muted))
        with sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
            assert mirror.check(config, reader, conn) == []
    # Back to the default: until the mirror follows, it does not answer.
    indexed.notmuch("config", "set", "search.exclude_tags", "deleted;spam")
    with Reader() as reader:
        mb = reads.Mailbox(config, reader)
        assert reads.current_mirror(mb, EXCLUDED) is None
        listed, totals = every_page(mb, "", "newest", 50)
        assert SCHOOL_1 in {mid for mid, _ in listed}
        same_order(listed, notmuch_page("*", "newest"))
        mirror.sync_sidecar(config, reader)
        assert reads.current_mirror(mb, EXCLUDED) is not None
        listed, totals = every_page(mb, "", "newest", 50)
        same_order(listed, notmuch_page("*", "newest"))
        assert totals == {len(listed)}


def test_the_kept_counts_follow_tags_deletions_and_rebuilds(indexed: MailEnv,
                                                             mailbox: reads.Mailbox) -> None:
    path = sidecar.sidecar_path(indexed.config().data_dir)
    config = indexed.config()

    def counts() -> tuple[int, int]:
        with sidecar.opened(path, readonly=True) as conn:
            assert sidecar.count_problems(conn) == []
            return sidecar.mirror_count(conn, "messages"), sidecar.mirror_count(conn, "shown")

    with Reader() as reader:
        everything = reader.count("*", exclude_tags=())
        shown = reader.count("*", exclude_tags=EXCLUDED)
    assert counts() == (everything, shown) and shown < everything

    def kept(*tags: str) -> tuple[int, int] | None:
        with sidecar.opened(path, readonly=True) as conn:
            return sidecar.kept_tag_counts(conn, tags)

    with Reader() as reader:
        assert kept("inbox", "unread") == (reader.count("tag:inbox AND tag:unread", exclude_tags=()),
                                           reader.count("tag:inbox AND tag:unread",
                                                        exclude_tags=EXCLUDED))
    inbox_before, pair_before = kept("inbox"), kept("unread", "inbox")
    assert pair_before is not None and inbox_before is not None and pair_before[1] > 0
    assert kept("inbox", "unread", "flagged") is None  # three tags: nothing keeps that count
    indexed.notmuch("tag", "+unread", "+spam", "--", f"id:{SCHOOL_1}")  # an inbox message
    mirror.sync_sidecar(config, mailbox.reader)
    assert counts() == (everything, shown - 1)
    assert kept("inbox") == (inbox_before[0], inbox_before[1] - 1)
    with Reader() as reader:
        assert kept("inbox", "unread") == (reader.count("tag:inbox AND tag:unread", exclude_tags=()),
                                           reader.count("tag:inbox AND tag:unread",
                                                        exclude_tags=EXCLUDED))
    file = indexed.notmuch("search", "--output=files", "--exclude=false", f"id:{SCHOOL_1}").stdout.split()[0]
    (indexed.mail_root / file).unlink()
    indexed.notmuch("new", "--no-hooks")
    mirror.sync_sidecar(config, mailbox.reader)
    assert counts() == (everything - 1, shown - 1)
    mirror.sync_sidecar(config, mailbox.reader, full=True)
    assert counts() == (everything - 1, shown - 1)


def test_a_sidecar_of_schema_4_gains_the_column_and_counts(indexed: MailEnv,
                                                           mailbox: reads.Mailbox) -> None:
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with sqlite3.connect(path) as conn:
        conn.executescript(BACK_TO_SCHEMA_4)
    assert reads.current_mirror(mailbox, EXCLUDED) is None  # a reader never migrates
    same_order(every_page(mailbox, "", "newest", 50)[0], notmuch_page("*", "newest"))
    with sidecar.opened(path) as conn:  # a read-write open migrates
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sidecar.SCHEMA_VERSION
        assert mirror.check(indexed.config(), mailbox.reader, conn) == []
    assert reads.current_mirror(mailbox, EXCLUDED) is not None


def test_tag_counts_are_notmuchs_from_the_mirror_or_while_it_lags(indexed: MailEnv,
                                                                   mailbox: reads.Mailbox) -> None:
    def truth() -> dict[str, int]:
        with Reader() as reader:
            return {t: reader.count(f"tag:{quote(t)}", exclude_tags=()) for t in reader.all_tags()}

    def listed() -> dict[str, int]:
        return {t.tag: t.count for t in reads.list_tags(mailbox).tags}

    assert listed() == truth()
    indexed.notmuch("tag", "+fresh-tag", "-inbox", "+spam", "--", f"id:{SCHOOL_1}")
    assert mailbox.mirror_lag()[1] is not None  # type: ignore[index]
    assert listed() == truth()  # notmuch counts while the mirror lags
    mirror.sync_sidecar(indexed.config(), mailbox.reader)
    assert listed() == truth() and listed()["fresh-tag"] == 1


def test_tag_searches_page_from_the_mirror_as_notmuch_does(mailbox: reads.Mailbox) -> None:
    for text in ("in:inbox", "is:unread", "in:inbox is:unread", "list:rust-users",
                 "is:starred after:2026-01-01", "label:no-such-tag", "list:no-such-list",
                 "list:rust-users is:unread"):
        compiled = mailbox.compile(text)
        nm_query = reads.scoped_query(mailbox, compiled)
        mirror = reads.answerable(mailbox, nm_query, compiled.exclude_tags)
        for sort in ("newest", "oldest"):
            ids = reads._tagged_page_from_mirror(mirror, sort, 0, 3)
            assert ids is not None, text  # the fixtures are small: every tag is common enough
            truth = notmuch_page(nm_query, sort)
            for limit in (1, 3, 50):
                pages, totals = every_page(mailbox, text, sort, limit)
                same_order(pages, truth)
                assert totals == {len(truth)}
        # one tag or two: the total and the hidden spam/deleted come from the kept counts
        # (a list: pattern naming one tag counts as that tag)
        kept = reads._kept_counts(mirror)
        assert (kept is not None) == (text != "is:starred after:2026-01-01"), text
        last = reads.search_emails(mailbox, text, limit=500)
        whole = len(notmuch_page(nm_query, "newest", ()))
        assert (last.hidden or 0) == whole - last.total and last.total == len(truth), text


def test_pages_of_a_tag_search_neither_repeat_nor_skip_mail_of_one_date(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first pages of a tag search come from the mirror and deeper ones from notmuch,
    which order messages of one date differently (by Message-ID; by when notmuch indexed
    them): a page edge inside such a date repeated some and skipped others."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"
    # Nine of the newest date, indexed in their Message-IDs' order (the mirror lists them
    # the other way round newest first), and nine of the oldest date, indexed the other way.
    ties = [(f"tie-new-{n}", "Fri, 01 Jan 2027 10:00:00 +0000") for n in range(1, 10)]
    ties += [(f"tie-old-{n}", "Sat, 01 Jan 2000 10:00:00 +0000") for n in range(9, 0, -1)]
    for n, (mid, date) in enumerate(ties):
        cur.joinpath(f"1800000900.tie{n}.host:2,FS").write_bytes(
            f"From: Tie <tie@example.com>\nTo: alex@example.org\nSubject: {mid}\n"
            f"Date: {date}\nMessage-ID: <{mid}@example.com>\n\nx\n".encode())
        indexed.fmail("index")  # one at a time: notmuch numbers them in this order
    monkeypatch.setattr(reads, "MAX_TAG_SCAN", 200)  # the mirror answers the first page only
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        compiled = mailbox.compile("is:flagged")
        nm_query = reads.scoped_query(mailbox, compiled)
        mirror = reads.answerable(mailbox, nm_query, compiled.exclude_tags)
        assert reads._tagged_page_from_mirror(mirror, "newest", 0, 4) is not None
        assert reads._tagged_page_from_mirror(mirror, "newest", 4, 4) is None
        for sort in ("newest", "oldest"):
            truth = notmuch_page(nm_query, sort)
            assert sum(1 for m, _ in truth if m.startswith("tie-")) == 18
            for limit in (2, 4, 5):
                pages, totals = every_page(mailbox, "is:flagged", sort, limit)
                same_order(pages, truth)
                assert totals == {len(truth)}


def test_pages_of_a_tag_search_read_by_notmuch_take_undated_mail(
        mailbox: reads.Mailbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deeper page of a tag search is notmuch's, ordered by the mirror's dates: undated
    mail has none there (NULL), and ordering it beside dated mail raised a TypeError."""
    monkeypatch.setattr(reads, "MAX_TAG_SCAN", 0)  # no page of the mirror's own
    nm_query = reads.scoped_query(mailbox, mailbox.compile("in:inbox"))
    truth = notmuch_page(nm_query, "newest")
    assert "no-date-1@parcelgo.example.net" in {m for m, _ in truth}
    for sort in ("newest", "oldest"):
        pages, totals = every_page(mailbox, "in:inbox", sort, 7)
        same_order(pages, notmuch_page(nm_query, sort))
        assert totals == {len(truth)}


def test_pages_under_a_burst_of_list_mail_come_from_the_mirror(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest mail all list mail, which skips the inbox: the window the inbox's share of
    the mailbox sizes holds no page of "in:inbox is:unread" (nor of its threads), and a
    wider one does -- the mirror reads that rather than leave the page to notmuch."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"
    for n in range(300):
        cur.joinpath(f"1800001000.burst{n}.host:2,S").write_bytes(
            f"From: Busy <busy@lists.example.com>\nTo: alex@example.org\nSubject: burst {n}\n"
            f"List-Id: <busy.lists.example.com>\nDate: Fri, 01 Jan 2027 10:{n // 60:02}:{n % 60:02}"
            f" +0000\nMessage-ID: <burst-{n}@lists.example.com>\n\nx\n".encode())
    indexed.fmail("index")
    indexed.notmuch("tag", "-inbox", "-unread", "--", "from:busy@lists.example.com")
    with Reader() as reader:
        mirror.sync_sidecar(indexed.config(), reader)
        mailbox = reads.Mailbox(indexed.config(), reader)
        asked: list[str] = []
        for name in ("page_ids", "threads"):
            def recording(*args: Any, _read: Any = getattr(reader, name), _name: str = name,
                          **kwargs: Any) -> Any:
                asked.append(_name)
                return _read(*args, **kwargs)
            monkeypatch.setattr(reader, name, recording)
        text = "in:inbox is:unread"
        nm_query = reads.scoped_query(mailbox, mailbox.compile(text))
        newest = notmuch_page(nm_query, "newest")
        assert newest and not any(m.startswith("burst-") for m, _ in newest)
        # a page of 2, 15 unread of 461 shown: the first window is 2*2*461/15+100 = 222, all burst
        page = reads.search_emails(mailbox, text, limit=2)
        assert [(m.message_id, m.date) for m in map(mailbox.find, [r.id for r in page.results])
                if m is not None] == newest[:2] and page.total == len(newest)
        threads = reads.list_threads(mailbox, "in:inbox", limit=5)  # a window of 6*20
        assert [(t.thread, t.matched, t.messages) for t in threads.threads] == notmuch_threads(
            reads.scoped_query(mailbox, mailbox.compile("in:inbox")), 5)
        assert asked == []  # neither page was notmuch's


def test_pages_through_a_second_of_more_messages_than_a_margin_neither_repeat_nor_skip(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """1,500 messages of one second, which notmuch orders as it indexed them and the mirror
    by Message-ID: pages of every reader walk through it while the mirror starts to lag (a
    message of that second and a tag change it has not seen), one of them leaves, and the
    mirror catches up again.  A page
    read by notmuch kept notmuch's order where the second outgrew the tie margin: hundreds
    repeated and skipped."""
    ties, tie_date = 1500, "Fri, 01 Jan 2027 10:00:00 +0000"
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"

    def deliver(name: str, mid: str) -> None:
        cur.joinpath(f"{name}:2,").write_bytes(
            f"From: Tie <tie@example.com>\nTo: alex@example.org\nSubject: tie {mid}\n"
            f"Date: {tie_date}\nMessage-ID: <{mid}@example.com>\n\nx\n".encode())

    for n in range(ties):  # indexed in an order unlike their Message-IDs'
        deliver(f"1800000900.t{n:04d}.host", f"tie-{n * 7919 % ties:04d}")
    indexed.fmail("index")
    monkeypatch.setattr(reads, "MAX_TAG_SCAN", 1000)  # tag pages past ~400 are notmuch's
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        in_order = reader.page_ids("date:@1798797600 AND from:tie@example.com",
                                   exclude_tags=EXCLUDED, limit=ties + 1)
        assert len(in_order) == ties and in_order != sorted(in_order)[::-1]
        for walk, (text, sort) in enumerate(
                (t, s) for t in ("", "is:unread", "tag:inbox", "from:tie")
                for s in ("newest", "oldest")):
            truth = set(reader.message_ids(reads.scoped_query(mailbox, mailbox.compile(text)),
                                           exclude_tags=EXCLUDED))
            seen: list[str] = []
            cursor = None
            for page in range(1000):
                if page == 3:  # a sync in flight: the mirror lags notmuch
                    deliver(f"1800000901.late{walk}.host", f"late-{walk}")
                    indexed.notmuch("new", "--no-hooks")
                    indexed.notmuch("tag", f"+lagging-{walk}", "--", "id:tie-0001@example.com")
                    assert mailbox.mirror_lag()[1] is not None  # type: ignore[index]
                if page == 6:  # and a message of that second leaves
                    gone = f"1800000900.t{100 * walk + 7:04d}.host"
                    cur.joinpath(f"{gone}:2,").unlink()
                    indexed.notmuch("new", "--no-hooks")
                if page == 10:
                    mirror.sync_sidecar(indexed.config(), reader)
                result = reads.search_emails(mailbox, text, limit=100, cursor=cursor, sort=sort)
                seen += [mailbox.find(r.id).message_id  # type: ignore[union-attr]
                         for r in result.results]
                cursor = result.next_cursor
                if cursor is None:
                    break
            gone_id = f"tie-{(100 * walk + 7) * 7919 % ties:04d}@example.com"
            throughout = truth - {gone_id}
            repeated = len(seen) - len(set(seen))
            assert (repeated, len(throughout - set(seen))) == (0, 0), (text, sort)


@pytest.mark.parametrize("date", ["Date: Fri, 01 Jan 2027 10:00:00 +0000\n", ""])
def test_pages_inside_a_second_of_thousands_read_a_bounded_part_of_it(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch, date: str) -> None:
    """3,000 messages of one second (an import; undated mail, at 0, is one date too): every
    page of messages is in the mirror's order, yet reads fewer of that second's messages
    than it holds -- a margin grown until the second was whole read all of it for each page
    (2.6 s a page at 20,000, 12 s a page of threads).  So are thread pages, whose edges'
    threads are read from that second's messages alone (no thread of it built)."""
    ties, limit = 3000, 100
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"
    for n in range(ties):  # indexed in an order unlike their Message-IDs'
        cur.joinpath(f"1800000900.t{n:04d}.host:2,").write_bytes(
            f"From: Tie <tie@example.com>\nTo: alex@example.org\nSubject: tie {n}\n"
            f"{date}Message-ID: <tie-{n * 7919 % ties:04d}@example.com>\n\nx\n".encode())
    indexed.fmail("index")
    monkeypatch.setattr(reads, "MAX_TAG_SCAN", 0)  # every page of tag:inbox is notmuch's
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        read: list[int] = []  # how many messages (threads) each read of notmuch returned
        for name in ("page_ids", "threads"):
            def counting(*args: Any, _read: Any = getattr(reader, name), **kwargs: Any) -> Any:
                got = _read(*args, **kwargs)
                read.append(len(got))
                return got
            monkeypatch.setattr(reader, name, counting)
        query = reads.scoped_query(mailbox, mailbox.compile("tag:inbox"))
        matches = reader.messages(query, exclude_tags=EXCLUDED)
        for sort in ("newest", "oldest"):
            truth = sorted(((m.date, m.message_id) for m in matches),
                           reverse=sort == "newest")
            seen: list[tuple[int, str]] = []
            cursor, most = None, 0
            while True:
                read.clear()
                result = reads.search_emails(mailbox, "tag:inbox", limit=limit, cursor=cursor,
                                             sort=sort)
                most = max(most, sum(read))
                found = [mailbox.find(r.id) for r in result.results]
                seen += [(m.date, m.message_id) for m in found if m is not None]
                cursor = result.next_cursor
                if cursor is None:
                    break
            assert seen == truth, sort
            assert most < ties, sort
        indexed.notmuch("tag", "+lagging", "--", "id:tie-0001@example.com")
        ranked = sorted(reader.threads(query, exclude_tags=EXCLUDED), key=reads._thread_rank,
                        reverse=True)
        for offset in (0, ties // 2):  # the mirror lags: notmuch's, in the mirror's order
            read.clear()
            page, _ = reads._thread_page(mailbox, query, EXCLUDED, None, offset, limit)
            assert page == ranked[offset:offset + limit], offset
            assert 0 < sum(read) < ties, offset


def test_pages_of_long_seconds_walk_in_the_mirrors_order_whatever_else_they_hold(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seconds of more messages than the largest margin (so _whole_edges reads their edges),
    beside a second whole inside a page, excluded spam among them, one Message-ID in two
    files, Message-IDs of either case and of non-ASCII letters, undated mail, and a message
    from the last day of year 9999 west of UTC -- past 10000-01-01 UTC, where notmuch keeps
    it: every walk of every page size is the mirror's (date, Message-ID) order.  The date
    ranges that counted where an edge's date starts ended before that message: it was
    counted in no date, the page dropped it and shifted the rest of its date by one."""
    tie = TieMail(indexed, "w", seen=False)

    def deliver(date: str, mid: str) -> None:
        tie(mid, date)

    seconds = ("Fri, 01 Jan 2027 10:00:00 +0000", "Fri, 01 Jan 2027 10:00:01 +0000",
               "Fri, 01 Jan 2027 10:00:02 +0000", "")
    for s, date in enumerate(seconds):
        size = 5 if s == 1 else 150  # more than a page and the largest margin each side
        for n in range(size):  # indexed in an order unlike their Message-IDs'
            n = n * 31 % size
            deliver(date, f"{'tT'[n % 2]}{'ié'[n % 3 == 0]}-{s}-{n:03d}@example.com")
    deliver(seconds[0], "ti-0-005@example.com")  # a second file of one message
    deliver("Fri, 31 Dec 9999 23:59:59 -1200", "far-future@example.com")
    indexed.fmail("index")
    indexed.notmuch("tag", "+spam", "--", "id:ti-0-007@example.com", "or",
                    "id:Té-2-009@example.com")
    mirror.sync_sidecar(indexed.config(), Reader())
    monkeypatch.setattr(reads, "MAX_TAG_SCAN", 0)  # every page of tag:inbox is notmuch's
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        query = reads.scoped_query(mailbox, mailbox.compile("tag:inbox"))
        matches = {(m.date, m.message_id) for m in reader.messages(query, exclude_tags=EXCLUDED)}
        assert (253402343999, "far-future@example.com") in matches
        for sort in ("newest", "oldest"):
            truth = [(mid, date) for date, mid in sorted(matches, reverse=sort == "newest")]
            for limit in (7, 30, 100):
                assert every_page(mailbox, "tag:inbox", sort, limit)[0] == truth, (sort, limit)


@pytest.mark.parametrize("sort", ["newest", "oldest"])
def test_a_page_of_long_seconds_reads_notmuch_once_while_mail_of_its_second_is_indexed(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch, sort: str) -> None:
    """A page across two seconds of more messages than the largest margin reads notmuch's
    page, then counts and reads the messages of its edges' seconds.  Mail of the page's
    first second indexed (by another program's notmuch new) between those reads shifted the
    edges against the page's places: the page was of the index as it stood neither before
    nor after -- five short, ten of its messages missing, five of the page before it
    there again.  Its reads see one snapshot: it is one of the two."""
    deliver = two_crowded_seconds(indexed)
    # The new mail comes first in the page's first second (1 newest first, 0 oldest first).
    first, new_id = (1, "zz-new-{}@example.com") if sort == "newest" else (0, "aa-new-{}@e")
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        compiled = mailbox.compile("")
        nm_query = reads.scoped_query(mailbox, compiled)
        conn = reads.current_mirror(mailbox, compiled.exclude_tags)
        assert conn is not None

        def listing() -> list[str]:
            matches = reader.messages(nm_query, exclude_tags=compiled.exclude_tags)
            return [mid for _, mid in sorted(((m.date, m.message_id) for m in matches),
                                             reverse=sort == "newest")]

        before = listing()
        # 80 messages into the first second, 50 of them: 20 of it, 30 of the other
        at = next(n for n, mid in enumerate(before) if mid.startswith("tie-")) + 80
        assert before[at].startswith(f"tie-{first}-") and before[at + 49].startswith("tie-")
        assert not before[at + 49].startswith(f"tie-{first}-")
        def five_more() -> None:  # at the first count of an edge's second
            for n in range(5):
                deliver(first, new_id.format(n))
            indexed.notmuch("new", "--no-hooks")

        indexing = indexing_once(monkeypatch, reader, "count", five_more)
        page = reads._page_in_mirror_order(mailbox, conn, nm_query, compiled.exclude_tags,
                                           sort, at, 50)
        assert not indexing  # the mail came while the page was read
        after = listing()
        assert len(after) == len(before) + 5
        skipped, repeated = set(before[at:at + 50]) - set(page), set(page) & set(before[:at])
        assert page in (before[at:at + 50], after[at:at + 50]), (
            f"{len(skipped)} skipped, {len(repeated)} of the page before")


def test_a_resumed_page_counts_and_reads_notmuch_once_while_mail_above_it_is_indexed(
        mailbox: reads.Mailbox, indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A next page whose last message moved (mail came above it) counts where that
    message's second now starts and how many share it, reads that second to find it, then
    the page after it.  Mail dated before that second indexed (by another program's notmuch
    new) between the counts and those reads moved the second past the places counted: the
    last message was not found, and the page went back to older mail and the second's
    messages shown before.  Its reads see one snapshot: the walk lists every message once,
    oldest first."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"

    def deliver(name: str, date: str) -> None:
        cur.joinpath(f"1800000970.{name}.host:2,S").write_bytes(
            f"From: Tie <tie@example.com>\nTo: alex@example.org\nSubject: {name}\n"
            f"Date: {date}\nMessage-ID: <{name}@example.com>\n\nx\n".encode())

    second = "Fri, 01 Jan 2027 10:00:00 +0000"
    for name, date in [*((f"d{n}", second) for n in range(4)),
                       *((f"e{n}", "Fri, 01 Jan 2027 10:00:05 +0000") for n in range(3))]:
        deliver(name, date)
    indexed.fmail("index")
    listed: list[tuple[str, int]] = []

    def page(cursor: str | None) -> str | None:
        result = reads.search_emails(mailbox, "from:tie@example.com", limit=3, cursor=cursor,
                                     sort="oldest")
        for row in result.results:
            m = mailbox.find(row.id)
            assert m is not None
            listed.append((m.message_id, m.date))
        return result.next_cursor

    cursor = page(None)  # three of the four of the first second
    everything = {m.message_id for m in mailbox.reader.messages("from:tie@example.com")}
    deliver("older0", "Thu, 31 Dec 2026 10:00:00 +0000")  # above: the last one moves
    indexed.notmuch("new", "--no-hooks")
    edge = reads.date_range_query(listed[-1][1], listed[-1][1] + 1)

    def two_older() -> None:  # counted after those before the second
        for n in (1, 2):
            deliver(f"older{n}", "Thu, 31 Dec 2026 11:00:00 +0000")
        indexed.notmuch("new", "--no-hooks")

    indexing = indexing_once(monkeypatch, mailbox.reader, "count", two_older,
                             lambda query: edge in query)
    while cursor is not None:
        cursor = page(cursor)
    assert not indexing  # the mail came while the next page was read
    ids = [mid for mid, _ in listed]
    assert len(ids) == len(set(ids)), f"repeated: {ids}"
    assert everything <= set(ids), f"skipped: {everything - set(ids)}"
    assert [d for _, d in listed] == sorted(d for _, d in listed), f"out of order: {ids}"


def test_a_resumed_thread_page_counts_and_reads_notmuch_once_while_threads_above_join(
        mailbox: reads.Mailbox, indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A next page of threads whose last thread moved (a new thread came above it) counts
    the threads ranked above that thread's date, then reads the page after it.  A message
    joining two of the threads above, indexed (by another program's notmuch new) between
    the count and the read, left one thread fewer above than counted: the page started one
    thread too far, and that thread was never listed.  Its reads see one snapshot."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"

    def deliver(name: str, second: str, references: str = "") -> None:
        cur.joinpath(f"1800000980.{name}.host:2,S").write_bytes(
            f"From: Tie <tie@example.com>\nTo: alex@example.org\nSubject: {name}\n"
            f"Date: Fri, 01 Jan 2027 {second} +0000\nMessage-ID: <{name}@example.com>\n"
            f"{references}\nx\n".encode())

    for name, second in [("t1", "10:00:30"), ("t2", "10:00:20"), ("t3", "10:00:10"),
                         ("t4", "10:00:05"), ("t5", "10:00:04"), ("t6", "10:00:03")]:
        deliver(name, second)
    indexed.fmail("index")
    listed: list[str] = []

    def page(cursor: str | None) -> str | None:
        result = reads.list_threads(mailbox, "from:tie@example.com", limit=3, cursor=cursor)
        listed.extend(t.thread for t in result.threads)
        return result.next_cursor

    cursor = page(None)  # t1, t2 and t3's threads
    deliver("new", "10:01:00")  # above: the last thread moves
    indexed.notmuch("new", "--no-hooks")
    last = mailbox.find("t3@example.com")
    assert last is not None and last.thread_id == listed[-1]
    edge = reads.date_range_query(last.date, last.date + 1)

    def joining() -> None:  # counted after the threads above
        # a reply to t1 and t2, older than both: one thread of them
        deliver("join", "09:00:00", "In-Reply-To: <t1@example.com>\n"
                "References: <t2@example.com> <t1@example.com>\n")
        indexed.notmuch("new", "--no-hooks")

    indexing = indexing_once(monkeypatch, mailbox.reader, "threads_listed_before", joining,
                             lambda query: edge in query)
    while cursor is not None:
        cursor = page(cursor)
    assert not indexing  # the mail came while the next page was read
    found = {name: mailbox.find(f"{name}@example.com") for name in ("t1", "t2", "t4", "t5", "t6")}
    threads = {name: m.thread_id for name, m in found.items() if m is not None}
    assert len(threads) == 5 and len(set(threads.values())) == 4  # t1 and t2 joined
    assert len(listed) == len(set(listed)), f"repeated: {listed}"
    skipped = [name for name, thread in threads.items() if thread not in listed]
    assert not skipped, f"never listed: the threads of {skipped}"


def test_a_resumed_page_the_mirror_answers_skips_nothing_while_mail_above_it_is_indexed(
        mailbox: reads.Mailbox, indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A next page the mirror answers (a date range) whose last message moved counts in
    notmuch where it resumes, and reads the page from the mirror's state of the call.  Mail
    above it indexed (by another program's notmuch new) after the call read that state
    was counted by notmuch but not in the mirror's page: the page started past messages
    never shown.  Its counts leave out what the mirror has not seen: at worst a repeat."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"

    def deliver(name: str, date: str) -> None:
        cur.joinpath(f"1800000990.{name}.host:2,S").write_bytes(
            f"From: Tie <tie@example.com>\nTo: alex@example.org\nSubject: {name}\n"
            f"Date: {date}\nMessage-ID: <{name}@example.com>\n\nx\n".encode())

    for n in range(6):
        deliver(f"d{n}", f"Fri, 01 Jan 2027 10:00:0{n} +0000")
    indexed.fmail("index")
    mirror.sync_sidecar(indexed.config(), mailbox.reader)
    scope = {"since": "2026-12-30T00:00:00Z", "until": "2027-01-02T00:00:00Z"}
    assert answered_by_mirror(mailbox, "", **scope)
    listed: list[str] = []

    def page(cursor: str | None) -> str | None:
        result = reads.search_emails(mailbox, "", limit=3, cursor=cursor, sort="oldest",
                                     **scope)
        for row in result.results:
            m = mailbox.find(row.id)
            assert m is not None
            listed.append(m.message_id)
        return result.next_cursor

    cursor = page(None)  # d0, d1, d2
    deliver("older0", "Thu, 31 Dec 2026 10:00:00 +0000")  # above: the last one moves
    indexed.notmuch("new", "--no-hooks")
    mirror.sync_sidecar(indexed.config(), mailbox.reader)

    def two_older() -> None:  # the call's state of the mirror is read: notmuch moves past it
        for n in (1, 2):
            deliver(f"older{n}", f"Thu, 31 Dec 2026 1{n}:00:00 +0000")
        indexed.notmuch("new", "--no-hooks")

    indexing = indexing_once(monkeypatch, sidecar, "shown_page", two_older)
    while cursor is not None:
        cursor = page(cursor)
    assert not indexing
    assert len(listed) == len(set(listed)), f"repeated: {listed}"
    skipped = [f"d{n}@example.com" for n in range(6) if f"d{n}@example.com" not in listed]
    assert not skipped, f"skipped: {skipped} of {listed}"


def test_a_resumed_thread_page_the_mirror_answers_skips_nothing_while_threads_come_above(
        mailbox: reads.Mailbox, indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`test_a_resumed_page_the_mirror_answers_skips_nothing_while_mail_above_it_is_indexed`
    for threads: threads come above the last thread shown after the call read the mirror's
    state; counted by notmuch, the mirror's page started past threads never shown."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"

    def deliver(name: str, second: str) -> None:
        cur.joinpath(f"1800000995.{name}.host:2,S").write_bytes(
            f"From: Tie <tie@example.com>\nTo: alex@example.org\nSubject: {name}\n"
            f"Date: Fri, 01 Jan 2027 {second} +0000\nMessage-ID: <{name}@example.com>\n"
            "\nx\n".encode())

    for n in range(6):
        deliver(f"t{n}", f"10:00:0{9 - n}")  # t0 newest
    indexed.fmail("index")
    mirror.sync_sidecar(indexed.config(), mailbox.reader)
    scope = {"since": "2026-12-30T00:00:00Z", "until": "2027-01-02T00:00:00Z"}
    listed: list[str] = []

    def page(cursor: str | None) -> str | None:
        result = reads.list_threads(mailbox, "*", limit=3, cursor=cursor, **scope)
        listed.extend(t.thread for t in result.threads)
        return result.next_cursor

    cursor = page(None)  # t0, t1, t2
    deliver("new0", "10:01:00")  # above: the last thread moves
    indexed.notmuch("new", "--no-hooks")
    mirror.sync_sidecar(indexed.config(), mailbox.reader)

    def two_newer() -> None:  # the call's state of the mirror is read: notmuch moves past it
        for n in (1, 2):
            deliver(f"new{n}", f"10:01:0{n}")
        indexed.notmuch("new", "--no-hooks")

    indexing = indexing_once(monkeypatch, sidecar, "newest_threads", two_newer)
    while cursor is not None:
        cursor = page(cursor)
    assert not indexing
    threads = {n: mailbox.find(f"t{n}@example.com") for n in range(6)}
    assert len(listed) == len(set(listed)), f"repeated: {listed}"
    skipped = [n for n, m in threads.items() if m is None or m.thread_id not in listed]
    assert not skipped, f"never listed: the threads of t{skipped}"


def test_mail_dated_past_year_9999_utc_is_indexed_and_listed(indexed: MailEnv) -> None:
    """notmuch keeps a Date on the last day of 9999 west of UTC as it is, in year 10000 UTC,
    which datetime cannot hold: one such message (spam) failed the whole index ("year 10000
    is out of range") and every listing that showed it."""
    indexed.mail_root.joinpath("personal", "INBOX", "cur", "1800000960.far.host:2,").write_bytes(
        b"From: Far <far@example.com>\nTo: alex@example.org\nSubject: far\n"
        b"Date: Fri, 31 Dec 9999 23:59:59 -1200\nMessage-ID: <far@example.com>\n\nx\n")
    indexed.fmail("index")
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        lag = mailbox.mirror_lag()
        assert lag is not None and lag[1] is None  # the mirror holds it
        first = reads.search_emails(mailbox, "", limit=1).results[0]
        assert (first.subject, first.date) == ("far", "9999-12-31T23:59:59Z")


def test_thread_pages_through_a_second_of_more_threads_than_a_margin_neither_repeat_nor_skip(
        indexed: MailEnv) -> None:
    """800 threads of one second (an import), which notmuch ranks as it indexed them and the
    mirror by Message-ID: a walk of its thread pages where the mirror starts to lag (a tag
    change it has not seen), mail of that second and another thread of it come, and the
    mirror catches up again.  notmuch's pages kept notmuch's order past a margin of 640
    threads: hundreds of threads were listed twice and as many never."""
    ties, tie_date = 800, "Fri, 01 Jan 2027 10:00:00 +0000"
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"

    def deliver(name: str, mid: str, references: str = "") -> None:
        cur.joinpath(f"{name}:2,").write_bytes(
            f"From: Tie <tie@example.com>\nTo: alex@example.org\nSubject: tie {mid}\n"
            f"Date: {tie_date}\nMessage-ID: <{mid}@example.com>\n{references}\nx\n".encode())

    for n in range(ties):  # indexed in an order unlike their Message-IDs'
        deliver(f"1800000900.t{n:04d}.host", f"tie-{n * 7919 % ties:04d}")
    indexed.fmail("index")
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        query = reads.scoped_query(mailbox, mailbox.compile("tag:inbox"))
        truth = set(reader.thread_ids(query, exclude_tags=EXCLUDED))
        seen: list[str] = []
        cursor = None
        for page in range(100):
            if page == 2:  # a sync in flight: the mirror lags notmuch
                indexed.notmuch("tag", "+lagging", "--", "id:tie-0001@example.com")
                assert mailbox.mirror_lag()[1] is not None  # type: ignore[index]
            if page == 6:  # a reply inside the second, and a new thread of it
                deliver("1800000901.reply.host", "tie-0500-re",
                        "In-Reply-To: <tie-0500@example.com>\n")
                deliver("1800000901.new.host", "tie-0400-new")
                indexed.notmuch("new", "--no-hooks")
            if page == 12:
                mirror.sync_sidecar(indexed.config(), reader)
            result = reads.list_threads(mailbox, "tag:inbox", limit=50, cursor=cursor)
            seen += [t.thread for t in result.threads]
            cursor = result.next_cursor
            if cursor is None:
                break
        repeated = len(seen) - len(set(seen))
        assert (repeated, len(truth - set(seen))) == (0, 0)


def test_a_thread_page_of_long_seconds_reads_notmuch_once_while_threads_of_its_second_come(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of threads across two seconds of more threads than the largest margin counts
    the threads ranked above its first second, then reads which threads of that second
    stand on it.  Threads of that second indexed between the two shifted the edge against
    the page's places; its reads see one snapshot: the page is of the index before or
    after."""
    deliver = two_crowded_seconds(indexed)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        compiled = mailbox.compile("")
        nm_query = reads.scoped_query(mailbox, compiled)

        def listing() -> list[str]:
            threads = reader.threads(nm_query, exclude_tags=compiled.exclude_tags)
            return [t.thread_id for t in sorted(threads, key=reads._thread_rank, reverse=True)]

        before = listing()
        newer_second = mailbox.find("tie-1-000@example.com")
        assert newer_second is not None
        # 80 threads into the newer second: 20 of it, 30 of the older
        at = before.index(newer_second.thread_id) - 99 + 80

        def five_more() -> None:  # at the count of the threads above the page's first second
            for n in range(5):
                deliver(1, f"zz-new-{n}@example.com")
            indexed.notmuch("new", "--no-hooks")

        indexing = indexing_once(monkeypatch, reader, "count_threads", five_more)
        page, _ = reads._thread_page(mailbox, nm_query, compiled.exclude_tags, None, at, 50)
        assert not indexing  # the threads came while the page was read
        after = listing()
        assert len(after) == len(before) + 5
        ids = [t.thread_id for t in page]
        assert ids in (before[at:at + 50], after[at:at + 50]), (
            f"{len(set(before[at:at + 50]) - set(ids))} of the page before missing")


def test_thread_pages_of_a_long_second_rank_threads_by_their_newest_matches(
        indexed: MailEnv) -> None:
    """Threads of one second of more threads than the largest margin, some with two
    messages of that second (one with a greater Message-ID, one with a lesser), some with a
    newer reply (they rank at the reply's second), a spam reply (it does not count): every
    walk of notmuch's thread pages is the mirror's order, by newest match and its
    Message-ID."""
    tie = TieMail(indexed, "r")

    def deliver(second: int, mid: str, parent: str | None = None) -> None:
        tie(mid, at_second(second), parent)

    for n in range(120):  # indexed in an order unlike their Message-IDs'
        deliver(1, f"t-{n * 37 % 120:03d}@example.com")
    for n in range(0, 120, 9):
        deliver(1, f"t-{n:03d}-a@example.com", f"t-{n:03d}@example.com")  # greater
        deliver(1, f"s-{n:03d}@example.com", f"t-{(n + 4) % 120:03d}@example.com")  # lesser
    for n in range(3, 120, 13):
        deliver(2, f"n-{n:03d}@example.com", f"t-{n:03d}@example.com")  # newer
    deliver(3, "spam-1@example.com", "t-005@example.com")
    indexed.fmail("index")
    indexed.notmuch("tag", "+spam", "--", "id:spam-1@example.com")
    with Reader() as reader:
        mirror.sync_sidecar(indexed.config(), reader)
        mailbox = reads.Mailbox(indexed.config(), reader)
        compiled = mailbox.compile("")
        nm_query = reads.scoped_query(mailbox, compiled)
        truth = [t.thread_id for t in sorted(
            reader.threads(nm_query, exclude_tags=compiled.exclude_tags),
            key=reads._thread_rank, reverse=True)]
        for limit in (7, 30, 100):
            walked: list[str] = []
            more = True
            while more:
                page, more = reads._thread_page(mailbox, nm_query, compiled.exclude_tags, None,
                                                len(walked), limit)
                walked += [t.thread_id for t in page]
            assert walked == truth, limit


def deliver_crowd(indexed: MailEnv, count: int) -> None:
    """``count`` inbox messages of one second (an import), each a thread, indexed in an
    order unlike their Message-IDs'."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"
    for n in range(count):
        mid = f"crowd-{n * 7919 % count:04d}@example.com"
        cur.joinpath(f"1800000975.c{n:04d}.host:2,").write_bytes(
            f"From: Crowd <crowd@example.com>\nTo: alex@example.org\nSubject: crowd {mid}\n"
            f"Date: Fri, 01 Jan 2027 10:00:00 +0000\nMessage-ID: <{mid}>\n\nx\n".encode())
    indexed.fmail("index")


def crowd_reply(indexed: MailEnv, parent: str, synced: bool) -> None:
    """A reply to ``parent``, newer than the crowd's second, indexed by the mirror too, or by
    notmuch alone (the mirror lags it)."""
    indexed.mail_root.joinpath("personal", "INBOX", "cur", "1800000976.re.host:2,").write_bytes(
        f"From: Crowd <crowd@example.com>\nTo: alex@example.org\nSubject: re\n"
        f"Date: Fri, 01 Jan 2027 10:05:00 +0000\nMessage-ID: <crowd-re@example.com>\n"
        f"In-Reply-To: <{parent}>\n\nx\n".encode())
    if synced:
        indexed.fmail("index")
    else:
        indexed.notmuch("new", "--no-hooks")


@pytest.mark.parametrize("synced", [True, False])
def test_a_thread_walk_through_a_crowded_second_goes_on_after_the_last_thread_got_a_reply(
        indexed: MailEnv, synced: bool) -> None:
    """200 threads of one second, 13 a page: the last thread of the second page gets a newer
    reply (it moves to the top, listed already) before the third is asked.  The next page
    went back to that second's start, and listed its first 25 threads again (in a second of
    thousands, thousands); it goes on where that thread stood, skipping none."""
    deliver_crowd(indexed, 200)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        seen: list[str] = []
        cursor = None
        for page in range(100):
            result = reads.list_threads(mailbox, "in:inbox", limit=13, cursor=cursor)
            shown = [t for t in result.threads if t.newest.startswith("2027-01-01T10:00:00")]
            seen += [t.thread for t in shown]
            if page == 1:  # it ends in the crowd's second
                assert shown and shown[-1] == result.threads[-1]
                last = reader.messages(f"thread:{shown[-1].thread}", exclude_tags=())[0]
                crowd_reply(indexed, last.message_id, synced)
            cursor = result.next_cursor
            if cursor is None:
                break
        crowd = {m.thread_id for m in reader.messages("from:crowd@example.com",
                                                      exclude_tags=())}
        repeated = [t for t in set(seen) if seen.count(t) > 1]
        assert (len(repeated), len(crowd - set(seen))) == (0, 0), (len(seen), len(crowd))


@pytest.mark.parametrize("synced", [True, False])
@pytest.mark.parametrize("sort", ["newest", "oldest"])
@pytest.mark.parametrize("text", ["in:inbox", "from:crowd@example.com in:inbox",
                                  "crowd in:inbox"])
def test_a_message_walk_through_a_crowded_second_goes_on_after_the_last_message_left(
        indexed: MailEnv, synced: bool, sort: str, text: str) -> None:
    """200 inbox messages of one second, 13 a page: the last message of the second page is
    archived (it leaves ``in:inbox``) before the third is asked.  The next page went back
    to that second's start and listed its first 25 messages again; it goes on where that
    message stood, skipping none of the others -- also where notmuch orders the second's
    messages (by when it indexed them: a sender or a word searched for), which listed the
    second again."""
    deliver_crowd(indexed, 200)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        seen: list[str] = []
        cursor, crowded, archived = None, 0, ""
        for page in range(100):
            result = reads.search_emails(mailbox, text, limit=13, cursor=cursor, sort=sort)
            seen += [mailbox.find(r.id).message_id  # type: ignore[union-attr]
                     for r in result.results]
            crowded += seen[-1].startswith("crowd-")
            if crowded == 2 and not archived:  # the second page to end in the crowd
                archived = seen[-1]
                indexed.notmuch("tag", "-inbox", "--", f"id:{archived}")
                if synced:
                    mirror.sync_sidecar(indexed.config(), reader)
            cursor = result.next_cursor
            if cursor is None:
                break
        crowd = set(reader.message_ids("from:crowd@example.com", exclude_tags=()))
        repeated = [m for m in set(seen) if seen.count(m) > 1]
        assert archived and (len(repeated), len(crowd - set(seen))) == (0, 0), len(seen)


def test_a_thread_cursor_of_old_naming_the_thread_still_resumes(indexed: MailEnv) -> None:
    """A thread cursor names the message its last thread ranked by; one from before, naming
    the thread's id, reads as it did: the same next pages, and after that thread moved, the
    rest skipping none (its second listed again: a repeat, never a skip)."""
    deliver_crowd(indexed, 40)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        first = reads.list_threads(mailbox, "in:inbox", limit=13)
        last = first.threads[-1]
        assert first.next_cursor is not None
        old = re.sub(r"[0-9a-f]{16}~", f"{last.thread}@", first.next_cursor)
        assert old != first.next_cursor and len(old) == len(first.next_cursor)

        def walk(cursor: str | None) -> list[str]:
            seen: list[str] = []
            while cursor is not None:
                page = reads.list_threads(mailbox, "in:inbox", limit=13, cursor=cursor)
                seen += [t.thread for t in page.threads]
                cursor = page.next_cursor
            return seen

        assert walk(old) == walk(first.next_cursor)
        last_message = reader.messages(f"thread:{last.thread}", exclude_tags=())[0]
        crowd_reply(indexed, last_message.message_id, True)
        rest = walk(old)
        untouched = {t.thread for t in reads.list_threads(mailbox, "in:inbox", limit=100).threads}
        assert untouched - {last.thread} <= set(rest) | {t.thread for t in first.threads}


def deliver_undated(indexed: MailEnv, count: int) -> None:
    """``count`` inbox messages with no Date (notmuch files them at 0), each a thread, indexed
    in an order unlike their Message-IDs'."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"
    for n in range(count):
        mid = f"undated-{n * 7 % count:04d}@example.com"
        cur.joinpath(f"1700000000.u{n:04d}.host:2,").write_bytes(
            f"From: Crowd <crowd@example.com>\nTo: alex@example.org\nSubject: {mid}\n"
            f"Message-ID: <{mid}>\n\nx\n".encode())
    indexed.fmail("index")


@pytest.mark.parametrize("sort", ["newest", "oldest"])
def test_a_message_walk_through_undated_mail_goes_on_after_the_last_message_left(
        indexed: MailEnv, sort: str) -> None:
    """Undated mail is one second, at 0: a page ending in it whose last message is archived
    before the next is asked resumed at the cursor's bare offset, and skipped the message
    that moved up into it."""
    deliver_undated(indexed, 60)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        inbox = set(reader.message_ids("tag:inbox", exclude_tags=EXCLUDED))
        seen: list[str] = []
        cursor, archived = None, ""
        while True:
            result = reads.search_emails(mailbox, "in:inbox", limit=13, cursor=cursor,
                                         sort=sort)
            seen += [mailbox.find(r.id).message_id  # type: ignore[union-attr]
                     for r in result.results]
            if seen[-1].startswith("undated-") and not archived:
                archived = seen[-1]
                indexed.notmuch("tag", "-inbox", "--", f"id:{archived}")
                mirror.sync_sidecar(indexed.config(), reader)
            cursor = result.next_cursor
            if cursor is None:
                break
        assert archived and inbox - set(seen) == set() and len(seen) == len(set(seen))


def test_a_thread_walk_through_undated_mail_goes_on_after_the_last_thread_left(
        indexed: MailEnv) -> None:
    """:func:`test_a_message_walk_through_undated_mail_goes_on_after_the_last_message_left`
    for threads: an undated thread ranks at 0, which its cursor names."""
    deliver_undated(indexed, 60)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        threads = {t.thread for t in reads.list_threads(mailbox, "in:inbox", limit=500).threads}
        seen: list[str] = []
        cursor, archived = None, ""
        while True:
            result = reads.list_threads(mailbox, "in:inbox", limit=13, cursor=cursor)
            seen += [t.thread for t in result.threads]
            if not result.threads[-1].newest and not archived:  # an undated thread
                archived = seen[-1]
                indexed.notmuch("tag", "-inbox", "--", f"thread:{archived}")
                mirror.sync_sidecar(indexed.config(), reader)
            cursor = result.next_cursor
            if cursor is None:
                break
        assert archived and threads - {archived} - set(seen) == set()
        assert len(seen) == len(set(seen))


@pytest.mark.parametrize("text", ["in:inbox", "from:tie@example.com"])
def test_a_message_walk_oldest_first_goes_on_after_the_last_message_was_dated_anew(
        indexed: MailEnv, text: str) -> None:
    """A message a second apart each, oldest first, 5 a page: the last of the first page is
    dated later (a draft saved again: its file read again) before the next is asked.  The
    page resumed after the messages dated before its new date, and skipped those between;
    it goes on after the date it was listed by, skipping none."""
    tie = TieMail(indexed, "redated")
    for n in range(20):
        tie(f"redated-{n:02d}@example.com", at_second(n))
    indexed.fmail("index")
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        seen: list[str] = []
        cursor, moved = None, ""
        while True:
            result = reads.search_emails(mailbox, text, limit=5, cursor=cursor, sort="oldest",
                                         since="2027-01-01")
            seen += [mailbox.find(r.id).message_id  # type: ignore[union-attr]
                     for r in result.results]
            if not moved:
                moved = seen[-1]
                name, = reader.find(moved).filenames  # type: ignore[union-attr]
                path = Path(name)
                path.write_text(path.read_text().replace(at_second(4), at_second(15)))
                indexed.notmuch("reindex", f"id:{moved}")
                mirror.sync_sidecar(indexed.config(), reader)
                assert reader.find(moved).date > reader.find(seen[0]).date + 10  # type: ignore[union-attr]
            cursor = result.next_cursor
            if cursor is None:
                break
        every = {f"redated-{n:02d}@example.com" for n in range(20)}
        assert every - set(seen) == set()
        assert [m for m in set(seen) if seen.count(m) > 1] in ([], [moved])


@pytest.mark.parametrize("kind", ["threads", "messages"])
def test_a_walk_goes_on_after_a_last_item_the_lagging_mirror_lacks_when_mail_came_above(
        indexed: MailEnv, kind: str) -> None:
    """A crowded second, half of it indexed while the mirror lags (a sync in flight): a page
    ends in a message the mirror lacks, and new mail comes above before the next is asked.
    The cursor's uid resolved to nothing: threads listed that second again, messages
    resumed at the bare offset; both go on where that message stood, skipping none."""
    deliver_crowd(indexed, 100)
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"
    for n in range(100):
        cur.joinpath(f"1800000975.lag{n:04d}.host:2,").write_bytes(
            f"From: Crowd <crowd@example.com>\nTo: alex@example.org\nSubject: lag {n}\n"
            f"Date: Fri, 01 Jan 2027 10:00:00 +0000\nMessage-ID: <lag-{n * 37 % 100:03d}@x>\n"
            "\nx\n".encode())
    indexed.notmuch("new", "--no-hooks")
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        assert mailbox.mirror_lag()[1] is not None  # type: ignore[index]
        everything = {m.message_id for m in reader.messages("from:crowd@example.com",
                                                             exclude_tags=())}
        seen: list[str] = []
        cursor, came = None, False
        while True:
            if kind == "threads":
                threads = reads.list_threads(mailbox, "in:inbox", limit=13, cursor=cursor)
                shown = [m.message_id for t in threads.threads for m in
                         reader.messages(f"thread:{t.thread}", exclude_tags=())]
                cursor = threads.next_cursor
            else:
                found = reads.search_emails(mailbox, "in:inbox", limit=13, cursor=cursor)
                shown = [reader.find(r.id).message_id if "@" in r.id  # type: ignore[union-attr]
                         else mailbox.find(r.id).message_id  # type: ignore[union-attr]
                         for r in found.results]
                cursor = found.next_cursor
            seen += shown
            if not came and shown and shown[-1].startswith("lag-"):
                came = True
                crowd_reply(indexed, "no-such-parent@example.com", False)
            if cursor is None:
                break
        repeated = [m for m in set(seen) if seen.count(m) > 1]
        assert came and (len(repeated), len(everything - set(seen))) == (0, 0), len(seen)


def test_a_message_cursor_of_old_naming_the_uid_alone_still_resumes(indexed: MailEnv) -> None:
    """A message cursor names its last message's uid and the date it was listed by; one from
    before, naming the uid alone, is still taken and reads the same next pages."""
    deliver_crowd(indexed, 40)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        for text in ("in:inbox", "from:crowd@example.com"):
            first = reads.search_emails(mailbox, text, limit=13)
            assert first.next_cursor is not None
            old = re.sub(r"~[0-9]+$", "", first.next_cursor)
            assert old != first.next_cursor and old.endswith(first.results[-1].id)

            def walk(cursor: str | None) -> list[str]:
                seen: list[str] = []
                while cursor is not None:
                    page = reads.search_emails(mailbox, text, limit=13, cursor=cursor)
                    seen += [r.id for r in page.results]
                    cursor = page.next_cursor
                return seen

            assert walk(old) == walk(first.next_cursor)
            assert len(walk(old)) == len(set(walk(old)))


@pytest.mark.parametrize("synced", [True, False])
def test_a_message_page_names_its_last_date_without_looking_the_message_up_again(
        indexed: MailEnv, synced: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The date a message cursor names is the one the page's rows were read with (the
    mirror's, or notmuch's for mail it lacks): a page looked its last message up in notmuch
    once more for it, on every search.  The cursor still names that date."""
    deliver_crowd(indexed, 30)
    if not synced:  # the last item of the page is one the mirror lacks
        crowd_reply(indexed, "no-such-parent@example.com", False)
    looked_up: list[str] = []
    real_find = Reader.find

    def finding(reader: Reader, message_id: str) -> Any:
        looked_up.append(message_id)
        return real_find(reader, message_id)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        monkeypatch.setattr(Reader, "find", finding)
        page = reads.search_emails(mailbox, "in:inbox", limit=1)
        monkeypatch.undo()
        last = page.results[-1].id
        found = mailbox.find(last) if "@" not in last else reader.find(last)
        assert found is not None and page.next_cursor is not None
        assert page.next_cursor.endswith(f"~{found.date}")
    assert looked_up == []


@pytest.mark.parametrize("rank", ["x1", "-5", "\u0661\u0662", "", "9" * 40, "1~2", "1@2",
                                  "1.5", " 1", "\u00b2"])
def test_a_message_cursor_with_a_garbled_date_is_a_bad_cursor(indexed: MailEnv,
                                                              rank: str) -> None:
    """A message cursor's date (after ``~``) that is no date of ours is refused as a bad
    cursor, never an internal error; the cursor as given still pages."""
    deliver_crowd(indexed, 10)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        cursor = reads.search_emails(mailbox, "in:inbox", limit=3).next_cursor
        assert cursor is not None and re.search(r"~[0-9]+$", cursor)
        assert reads.search_emails(mailbox, "in:inbox", limit=3, cursor=cursor).results
        forged = re.sub(r"~[0-9]+$", f"~{rank}", cursor)
        with pytest.raises(reads.ToolError, match="bad cursor"):
            reads.search_emails(mailbox, "in:inbox", limit=3, cursor=forged)


@pytest.mark.parametrize("rank", ["0", "999999999999", "000000000001"])
def test_a_message_cursor_with_a_forged_date_of_our_form_pages_on(indexed: MailEnv,
                                                                 rank: str) -> None:
    """A date of the cursor's form that its last message was not listed by (forged, or of
    undated mail) is taken as the place to go on from (it may be past the end), no internal
    error."""
    deliver_crowd(indexed, 10)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        cursor = reads.search_emails(mailbox, "in:inbox", limit=3).next_cursor
        assert cursor is not None
        # the last message leaves, so the page is resumed by the date named
        first = reads.search_emails(mailbox, "in:inbox", limit=3)
        last = mailbox.find(first.results[-1].id)
        assert last is not None
        indexed.notmuch("tag", "-inbox", "--", f"id:{last.message_id}")
        forged = re.sub(r"~[0-9]+$", f"~{rank}", cursor)
        after = reads.search_emails(mailbox, "in:inbox", limit=3, cursor=forged)
        assert after.total == first.total - 1


def deliver_crowd_threads(indexed: MailEnv, count: int, synced: bool) -> None:
    """``count`` inbox threads of one second (an import), indexed in an order unlike their
    Message-IDs'; every third one with a reply of that second too, indexed later (so that a
    thread's messages are apart in notmuch's order).  Indexed by the mirror too, or by
    notmuch alone (the mirror lags them)."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"
    for n in range(count):
        mid = f"crowd-{n * 7919 % count:04d}@example.com"
        cur.joinpath(f"1800000975.c{n:04d}.host:2,").write_bytes(
            f"From: Crowd <crowd@example.com>\nTo: alex@example.org\nSubject: crowd {mid}\n"
            f"Date: Fri, 01 Jan 2027 10:00:00 +0000\nMessage-ID: <{mid}>\n\nx\n".encode())
    for n in range(0, count, 3):
        parent = f"crowd-{n * 7919 % count:04d}@example.com"
        cur.joinpath(f"1800000975.r{n:04d}.host:2,").write_bytes(
            f"From: Crowd <crowd@example.com>\nTo: alex@example.org\nSubject: re crowd\n"
            f"Date: Fri, 01 Jan 2027 10:00:00 +0000\nMessage-ID: <crowd-re-{n:04d}@x>\n"
            f"In-Reply-To: <{parent}>\n\nx\n".encode())
    if synced:
        indexed.fmail("index")
    else:
        indexed.notmuch("new", "--no-hooks")


@pytest.mark.parametrize("synced", [True, False])
@pytest.mark.parametrize("move", ["archived", "replied", "archived, unsynced"])
@pytest.mark.parametrize("text", ["from:crowd@example.com in:inbox", "crowd in:inbox"])
def test_a_thread_walk_notmuch_orders_goes_on_after_the_last_thread_left_its_second(
        indexed: MailEnv, synced: bool, move: str, text: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads of one second whose order there is notmuch's (a sender or a word searched
    for), 13 a page: the last thread of the second page in that second is archived (it
    leaves the search) or gets a newer reply (it moves to the top) before the next is
    asked.  The next page went back to that second's start and listed its threads again;
    it goes on where that thread stood, skipping none of the others -- with the mirror
    current, or lagging the crowd (its uids found among the mail notmuch changed since).
    Only that page looks for where the thread stood."""
    deliver_crowd_threads(indexed, 120, synced)
    placed: list[str] = []
    real_place = Reader.threads_listed_before

    def placing(reader: Reader, that_date: str, thread_id: str, *args: Any, **kwargs: Any
                ) -> tuple[int, str] | None:
        placed.append(thread_id)
        return real_place(reader, that_date, thread_id, *args, **kwargs)
    monkeypatch.setattr(Reader, "threads_listed_before", placing)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        crowd = set(reader.thread_ids("from:crowd@example.com", exclude_tags=()))
        seen: list[str] = []
        cursor, crowded, moved = None, 0, ""
        for page in range(100):
            result = reads.list_threads(mailbox, text, limit=13, cursor=cursor)
            shown = [t for t in result.threads if t.newest.startswith("2027-01-01T10:00:00")]
            seen += [t.thread for t in shown]
            crowded += bool(shown) and shown[-1] == result.threads[-1]
            if crowded == 2 and not moved:  # the second page to end in the crowd
                moved = seen[-1]
                if move == "replied":
                    last = reader.messages(f"thread:{moved}", exclude_tags=())[0]
                    crowd_reply(indexed, last.message_id, synced)
                else:
                    indexed.notmuch("tag", "-inbox", "--", f"thread:{moved}")
                    if synced and move == "archived":
                        mirror.sync_sidecar(indexed.config(), reader)
            cursor = result.next_cursor
            if cursor is None:
                break
        repeated = [t for t in set(seen) if seen.count(t) > 1]
        if move == "replied":  # listed again at the top: the walk had passed it
            repeated = [t for t in repeated if t != moved]
        assert moved and (len(repeated), len(crowd - set(seen))) == (0, 0), (
            len(seen), len(repeated))
        assert placed == [moved]


def test_threads_listed_before_one_is_libnotmuchs_order_read_from_a_bounded_part(
        indexed: MailEnv) -> None:
    """Where a thread stands among those ranked at one second, as libnotmuch lists them
    (by their first message in index order, a thread with a newer match left out), whether
    it still ranks there or not; read from at most so many of the second's messages: a
    thread past them is not found (None)."""
    deliver_crowd_threads(indexed, 40, True)
    crowd_reply(indexed, "crowd-0005@example.com", True)  # that thread ranks newer now
    text, second = "from:crowd@example.com", 1798797600  # 2027-01-01 10:00:00 UTC
    that_date = all_of(text, date_range_query(second, second + 1))
    newer = all_of(text, date_range_query(second + 1, 2**63))
    with Reader() as reader:
        def place(thread: str, most: int = 1000) -> int | None:
            placed = reader.threads_listed_before(that_date, thread, newer,
                                                  exclude_tags=EXCLUDED, most=most)
            if placed is not None:  # where it stood: its first message of that second
                assert placed[1] == next(m for m in messages if m.thread_id == thread).message_id
            return None if placed is None else placed[0]
        listed = [t.thread_id for t in reader.threads(text, exclude_tags=EXCLUDED)]
        moved = reader.find("crowd-0005@example.com").thread_id  # type: ignore[union-attr]
        assert listed[0] == moved and len(listed) == 40
        messages = [m for m in reader.find_many(reader.page_ids(
            that_date, exclude_tags=EXCLUDED, sort="none", limit=1000)) if m is not None]
        assert [place(t) for t in listed[1:]] == list(range(39))
        # the thread that moved up, placed where it stood: after the threads whose first
        # message of that second came before its own
        threads = [m.thread_id for m in messages]
        first = threads.index(moved)
        assert place(moved) == len(set(threads[:first])) > 0
        assert place(moved, most=first) is None
        assert place(moved, most=first + 1) == len(set(threads[:first]))


@pytest.mark.parametrize("synced", [True, False])
@pytest.mark.parametrize("change", ["-inbox", "+deleted", "above"])
def test_a_thread_walk_notmuch_orders_skips_none_after_the_last_thread_moved_within_its_second(
        indexed: MailEnv, synced: bool, change: str) -> None:
    """notmuch lists a second's threads where their first match comes (by document id): the
    last thread of a page, with a reply of that second indexed after the whole crowd, has
    its first message archived (or deleted: a tag searches leave out) before the next page
    is asked.  It still ranks at that
    second, by its reply, now after every crowd thread: the page went on after it there and
    skipped the threads between where it stood and where it stands now.  Listed again
    there, it alone repeats.  Where it did not move (a new thread came above), nothing
    repeats: the page started at it again."""
    deliver_crowd_threads(indexed, 60, synced)
    with Reader() as reader:
        mailbox = reads.Mailbox(indexed.config(), reader)
        crowd = set(reader.thread_ids("from:crowd@example.com", exclude_tags=()))
        seen: list[str] = []
        cursor, moved = None, ""
        for _ in range(100):
            result = reads.list_threads(mailbox, "from:crowd@example.com in:inbox", limit=7,
                                        cursor=cursor)
            seen += [t.thread for t in result.threads]
            last = result.threads[-1] if result.threads else None
            if not moved and seen[7:] and last is not None and last.messages == 2:
                moved = last.thread
                if change == "above":
                    crowd_reply(indexed, "crowd-above@example.com", synced)  # a new thread
                else:
                    first = reader.messages(f"thread:{moved}", exclude_tags=(), sort="oldest")
                    parent = next(m for m in first if m.message_id.startswith("crowd-0"))
                    indexed.notmuch("tag", change, "--", f"id:{parent.message_id}")
                    if synced:
                        mirror.sync_sidecar(indexed.config(), reader)
            cursor = result.next_cursor
            if cursor is None:
                break
        assert moved and crowd - set(seen) == set(), len(crowd - set(seen))
        repeated = {t for t in seen if seen.count(t) > 1}
        assert repeated == (set() if change == "above" else {moved}), repeated


@pytest.mark.parametrize("change", ["above", "moved up"])
def test_a_thread_walk_notmuch_orders_repeats_none_where_the_last_threads_first_never_matched(
        indexed: MailEnv, change: str) -> None:
    """The threads of one second with a reply there have their first message archived before
    the walk: notmuch lists each by its reply, after every other thread of that second.  A
    page ends on one of them, and a new thread comes above (it did not move) or its first
    message is put back in the inbox (it moves up) before the next page: no thread of the
    second is skipped, and where it did not move none repeats."""
    deliver_crowd_threads(indexed, 60, False)
    with Reader() as reader:
        pairs = [t for t in reader.threads("from:crowd@example.com", exclude_tags=())
                 if t.message_count == 2]
        parents = {t.thread_id: next(m.message_id for m in reader.messages(
            f"thread:{t.thread_id}", exclude_tags=()) if not m.message_id.startswith("crowd-re"))
            for t in pairs}
        for parent in parents.values():
            indexed.notmuch("tag", "-inbox", "--", f"id:{parent}")
        mailbox = reads.Mailbox(indexed.config(), reader)
        crowd = set(reader.thread_ids("from:crowd@example.com", exclude_tags=()))
        seen: list[str] = []
        cursor, moved = None, ""
        for _ in range(100):
            result = reads.list_threads(mailbox, "from:crowd@example.com in:inbox", limit=7,
                                        cursor=cursor)
            seen += [t.thread for t in result.threads]
            last = result.threads[-1] if result.threads else None
            if not moved and last is not None and last.messages == 2 and result.next_cursor:
                moved = last.thread
                if change == "above":
                    crowd_reply(indexed, "crowd-above@example.com", False)  # a new thread
                else:
                    indexed.notmuch("tag", "+inbox", "--", f"id:{parents[moved]}")
            cursor = result.next_cursor
            if cursor is None:
                break
        assert moved and crowd - set(seen) == set(), len(crowd - set(seen))
        if change == "above":
            repeated = {t for t in seen if seen.count(t) > 1}
            assert repeated == set(), len(repeated)
