"""The read tools as plain functions, on the indexed fixture mail (named messages, exact values)."""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pytest
from notmuch2 import _message as notmuch2_message

from fmail_nm.clock import iso_from_epoch
from fmail_nm.dsl import DSL_HELP
from fmail_nm.store import sidecar
from fmail_nm.store import notmuch as notmuch_store
from fmail_nm.store.notmuch import QueryError, Reader
from fmail_nm.tools import dto, reads, render

from .conftest import MailEnv

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def mb(shared_indexed: MailEnv) -> Iterator[reads.Mailbox]:
    with Reader() as reader:
        yield reads.Mailbox(shared_indexed.config(), reader, clock=lambda: NOW)


def ids(result: reads.dto.SearchResult) -> list[str]:
    return [r.id for r in result.results]


def uid(message_id: str) -> str:
    return sidecar.uid_for(message_id)



def test_only_a_search_for_me_looks_up_the_users_sub_addresses(mb: reads.Mailbox) -> None:
    """Finding the sub-addresses of the user's (sidecar.own_addresses) reads the mirror's
    addresses after each sync: a search that does not say "me" has no use for them."""
    conn = mb.mirror.connection()
    assert conn is not None
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        reads.search_emails(mb, "invoice")
        reads.list_threads(mb, "is:unread")
        assert not [s for s in statements if "substr(a.email" in s]
        reads.search_emails(mb, "to:me")
        assert [s for s in statements if "substr(a.email" in s]
    finally:
        conn.set_trace_callback(None)


def test_search_finds_named_messages_with_index_fields(mb: reads.Mailbox) -> None:
    result = reads.search_emails(mb, 'from:anna subject:"school trip"')
    assert set(ids(result)) >= {uid("school-trip-1@example.com"), uid("school-trip-3@example.com")}
    first = next(r for r in result.results if r.id == uid("school-trip-1@example.com"))
    assert first.from_ == "Anna Schmidt <anna.schmidt@example.com>"
    assert first.thread == mb.reader.find("school-trip-1@example.com").thread_id  # type: ignore[union-attr]
    assert first.date == "2026-03-09T06:55:00Z"
    assert first.to == []  # received mail: the recipient is the user
    assert first.tags == ["flagged", "inbox", "replied"]


def test_the_query_examples_the_model_is_shown_find_what_they_say(mb: reads.Mailbox) -> None:
    """search_emails' description (DSL_HELP) teaches by its examples: each must run on real
    mail and select what it reads as (NOW is 2026-12-01, so older_than:2m is before October)."""
    examples = [line.strip() for line in DSL_HELP.split("Examples:\n", 1)[1].splitlines()]
    found = {text: reads.search_emails(mb, text, limit=500).results for text in examples}
    assert found["from:alice is:unread newer_than:7d"] == []  # no Alice in the fixture mail
    invoices = found["subject:(invoice OR receipt) has:attachment after:2026-01-01"]
    assert [r.subject for r in invoices] == ["Your invoice 2026-0042"]
    inbox = found["in:inbox -is:list -from:noreply"]
    assert inbox and all("inbox" in r.tags and "list" not in r.tags for r in inbox)
    bob = found["(from:bob OR to:bob) before:2026/03/01"]
    assert all(r.date and r.date < "2026-03-01" for r in bob)
    work_sent = found["account:work in:sent older_than:2m"]
    assert work_sent and all(r.date and r.date < "2026-10-02" for r in work_sent)
    assert all(reads.get_email(mb, r.id, 1).folders == ["work/Sent"] for r in work_sent)


def test_search_pages_with_total_and_cursor(mb: reads.Mailbox) -> None:
    everything = reads.search_emails(mb, "", limit=500)
    assert everything.total == len(everything.results)
    seen: list[str] = []
    cursor = None
    while True:
        page = reads.search_emails(mb, "", limit=40, cursor=cursor)
        assert page.total == everything.total
        seen += ids(page)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ids(everything)  # newest first, no gaps, no repeats


def test_cursor_of_another_search_is_refused(mb: reads.Mailbox) -> None:
    page = reads.search_emails(mb, "is:read", limit=5)
    assert page.next_cursor
    with pytest.raises(reads.ToolError, match="different search"):
        reads.search_emails(mb, "is:unread", limit=5, cursor=page.next_cursor)
    with pytest.raises(reads.ToolError, match="bad cursor"):
        reads.search_emails(mb, "", cursor="%%%not-a-cursor")
    # digits str.isdigit() takes and int() does not: a clear error, not an internal one
    for garbled in ("\u00b2.abc", f"{page.next_cursor.split('.')[0]}.abc.\u00b2"):
        with pytest.raises(reads.ToolError, match="bad cursor"):
            reads.search_emails(mb, "is:read", limit=5, cursor=garbled)


def test_bad_dsl_is_a_tool_error_with_position(mb: reads.Mailbox) -> None:
    with pytest.raises(reads.ToolError, match="position"):
        reads.search_emails(mb, "from:(alice")


def test_spam_and_trash_hidden_unless_asked(mb: reads.Mailbox) -> None:
    default = reads.search_emails(mb, "", limit=500)
    anywhere = reads.search_emails(mb, "in:anywhere", limit=500)
    assert default.total < anywhere.total
    assert not any({"spam", "deleted"} & set(r.tags) for r in default.results)


def test_since_until_and_account_scope(mb: reads.Mailbox) -> None:
    march = reads.search_emails(mb, "", since="2026-03-09", until="2026-03-10", limit=500)
    assert uid("school-trip-1@example.com") in ids(march)
    assert all(r.date and "2026-03-09" <= r.date[:10] <= "2026-03-10" for r in march.results)
    work = reads.search_emails(mb, "", account="work", limit=500)
    assert work.total > 0
    assert all(any(f.startswith("work/") for f in reads.get_email(mb, r.id, 1).folders)
               for r in work.results[:10])
    with pytest.raises(reads.ToolError, match="ISO 8601"):
        reads.search_emails(mb, "", since="last tuesday")


def test_recipients_of_the_users_own_mail_come_from_the_sidecar(mb: reads.Mailbox) -> None:
    row = reads.search_emails(mb, "id:school-trip-2@example.org").results[0]
    assert row.to == ["Anna Schmidt <anna.schmidt@example.com>"]  # no file is opened for it
    mail = reads.get_email(mb, "multi-rcpt-1@example.com")
    # To then Cc, decoded, each person as one string.
    assert (mail.to + mail.cc)[:5] == [
        "Morgan, Alex <alex@example.org>",
        'Dr. "Bob" O\'Neil <bob.oneil@example.net>',
        "Chloe Dubois <chloe.dubois@example.net>",
        "Müller, Jürgen <juergen.mueller@example.com>",
        "ben.carter@example.net",
    ]


def test_duplicate_message_id_lists_both_folders(mb: reads.Mailbox) -> None:
    result = reads.search_emails(mb, "id:both-accounts-1@example.com", limit=5)
    assert result.total == 1
    assert reads.get_email(mb, result.results[0].id).folders == ["personal/INBOX", "work/INBOX"]


def test_a_listed_id_finds_its_message_in_a_search(mb: reads.Mailbox) -> None:
    """The ids a page lists are uids ("every tool takes ids"): id: takes them too."""
    listed = uid("school-trip-1@example.com")
    for query in (f"id:{listed}", f"id:<{listed}> OR id:nope@example.com"):
        assert ids(reads.search_emails(mb, query)) == [listed], query
    assert reads.search_emails(mb, "id:0123456789abcdef").total == 0  # no message's uid


def test_a_list_shows_by_its_shortest_name_and_once_on_its_own_page(mb: reads.Mailbox) -> None:
    """A whole List-Id on every line (~rust-users.lists.example.org) cost 30 bytes a line:
    a line names a list by the first labels list: finds it by, and a page whose every line
    is on one list names it once, in its header."""
    mixed = reads.search_emails(mb, "is:list")
    head, *lines = render.search_text(mixed).split("\n")
    assert " all ~" not in head
    shown = {name for line in lines for name in re.findall(r"~(\S+)", line.split(" | ")[0])}
    assert shown == {"rust-users", "hikers"}
    for name in shown:  # each name finds its list's mail and no other
        assert (set(ids(reads.search_emails(mb, f"list:{name}")))
                == {e.id for e in mixed.results if any(t.startswith(f"list/{name}.") for t in e.tags)})
    head, *lines = render.search_text(reads.search_emails(mb, "list:rust-users")).split("\n")
    assert "; all ~rust-users; " in head and len(lines) > 2
    assert not any("~" in line.split(" | ")[0] for line in lines)
    head, *lines = render.threads_text(reads.list_threads(mb, "list:hikers")).split("\n")
    assert "; all ~hikers" in head and not any("~" in line for line in lines)
    # one line: the header's note would be longer than the name on the line
    head, line = render.search_text(reads.search_emails(mb, "id:list-rust-7@example.com")).split("\n")
    assert " all ~" not in head and " U~rust-users " in line


def test_a_thread_names_its_list_as_listings_do(mb: reads.Mailbox) -> None:
    """A thread's message lines carried the whole List-Id too: a thread all on one list
    names it once in its header, by the name list: finds it by; programs keep the tag."""
    thread = reads.get_thread(mb, "list-rust-1@example.com", include_bodies=False)
    head, *lines = render.thread_text(thread).split("\n")
    message_lines = [line for line in lines if line.startswith("[")]
    assert re.search(r"\(3 messages\); all ~rust-users(;|$)", head)
    assert len(message_lines) == 3 and not any(" ~" in line or "~rust" in line
                                               for line in message_lines)
    assert all("list/rust-users.lists.example.org" in m.tags for m in thread.messages)
    assert "list_names" not in thread.model_dump()
    # one message: the header's note would be longer than the name on the line
    head, _, line = render.thread_text(
        reads.get_thread(mb, "list-rust-7@example.com", include_bodies=False)).split("\n")
    assert " all ~" not in head and " U~rust-users " in line


def test_a_senders_name_cannot_pass_for_a_thread_lines_reply_note() -> None:
    """A thread line ends with "reply to [n]": a sender named so would fake what a message
    replies to; such a name is quoted, other names are as they were."""
    thread = dto.ThreadFull(thread="t1", subject="s", messages=[
        dto.ThreadMessage(id="a1", depth=0, **{"from": "Ann <ann@example.org>"}, tags=[]),
        dto.ThreadMessage(id="b2", depth=1, parent="a1", tags=[],
                          **{"from": "Bob Reply  To [1] <bob@example.org>"}),
    ])
    lines = [line for line in render.thread_text(thread).split("\n") if line.startswith("[")]
    assert lines[0].endswith(" Ann <ann@example.org>")
    assert lines[1].endswith(' "Bob Reply  To [1] <bob@example.org>" reply to [1]')


@pytest.mark.parametrize("name", ["Bob reply to[1]", "Bob reply-to [1]", "Bob reply_to [1]",
                                  "Bob replyto[1]", "Bob (reply to) [1]", "Bob reply to\uff3b1]",
                                  "Bob reply t\u043e [1]", "Bob repl\u0443 to [1]",
                                  "Bob rep1y to [1]"])
def test_a_senders_name_like_a_reply_note_without_its_spaces_is_quoted(name: str) -> None:
    """Without the space before "[", or with "-", "_" or none between its words, a name
    still reads as the line's "reply to [n]"; so it does with a Cyrillic "о" or "у" or a
    digit one in its words, which no spelling of them in a pattern catches."""
    line = _thread_line_of(name)
    assert line.endswith(f' "{name} <bob@example.org>" reply to [1]'), line


def _thread_line_of(name: str) -> str:
    """The line of a reply from ``name`` in a thread of two."""
    thread = dto.ThreadFull(thread="t1", subject="s", messages=[
        dto.ThreadMessage(id="a1", depth=0, **{"from": "Ann <ann@example.org>"}, tags=[]),
        dto.ThreadMessage(id="b2", depth=1, parent="a1", tags=[],
                          **{"from": f"{name} <bob@example.org>"}),
    ])
    return [line for line in render.thread_text(thread).split("\n") if line.startswith("[")][1]


@pytest.mark.parametrize("name", [
    "Bob reply to \u27e61]", "Bob reply to \u30141\u3015", "Bob reply to \u30101\u3011",
    "Bob reply to \u20451\u2046", "Bob reply to (1)", "Bob reply to {1}",
    "Bob reply to \u27e81\u27e9", "Bob reply to \u23a11]", "Bob reply to \u2474",
    "Bob reply to [\u00b9]", "Bob reply to [\u200d1]", "Bob reply to \uff3b\u2000\uff11\uff3d"])
def test_a_senders_name_with_a_look_alike_bracketed_number_is_quoted(name: str) -> None:
    """Only "[" and the fullwidth "［" were looked for: "⟦1]", "〔1〕", "【1】", "⁅1⁆", "(1)",
    "⑴" (one character), a superscript 1 or a joiner inside the brackets read as the line's
    own "reply to [1]" as well."""
    assert _thread_line_of(name).endswith(f' "{name} <bob@example.org>" reply to [1]')


@pytest.mark.parametrize("name", [
    "Bob reply to \u23a11\u23a4", "Bob reply to \u23a31\u23a6", "Bob reply to \u20391\u203a",
    "Bob reply to [\u28001\u2800]", "Bob reply to [\u03321\u0332]", "Bob reply to [\u2776]"])
def test_a_senders_name_with_a_number_between_bracket_look_alikes_of_no_bracket_kind_is_quoted(
        name: str) -> None:
    """A number passed as bracketed only beside a Unicode bracket: "⎡1⎤" (the square
    bracket's corners, maths symbols), "‹1›" (quotation marks), a blank Braille cell or a
    combining mark between bracket and number, and "❶" (a number NFKC keeps, not a decimal
    digit) read as the line's own "reply to [1]" and were left bare."""
    assert _thread_line_of(name).endswith(f' "{name} <bob@example.org>" reply to [1]')


@pytest.mark.parametrize("name", ["Bob (Work)", "\u3010\u516c\u5f0f\u3011Shop", "Agent 007",
                                  "Bob [ACME]", "ACME (UK) 2", "Bob \u2014 2nd floor",
                                  "\u5f20\u4e09\u30fb2", "Bob #1 #2"])
def test_a_name_with_brackets_but_no_number_in_them_is_as_it_was(name: str) -> None:
    assert _thread_line_of(name).endswith(f" {name} <bob@example.org> reply to [1]")


def test_list_threads_counts(mb: reads.Mailbox) -> None:
    deep = reads.list_threads(mb, "id:thread-deep-1@example.net", limit=5)
    assert deep.total == 1
    t = deep.threads[0]
    assert t.messages == 8
    assert t.matched == 1
    assert "Ben Carter" in t.authors
    assert t.unread == 0


def test_list_threads_pages_without_a_thread_total_when_many_messages_match(
        mb: reads.Mailbox, monkeypatch: pytest.MonkeyPatch) -> None:
    def walk(limit: int) -> tuple[list[reads.dto.ThreadList], list[str]]:
        pages, seen, cursor = [], [], None
        while True:
            page = reads.list_threads(mb, "in:inbox", limit=limit, cursor=cursor)
            pages.append(page)
            seen += [t.thread for t in page.threads]
            if (cursor := page.next_cursor) is None:
                return pages, seen

    counted_pages, counted = walk(4)
    inbox_messages = mb.reader.count(mb.compile("in:inbox").query,
                                     exclude_tags=mb.compile("in:inbox").exclude_tags)
    assert counted_pages[0].total == len(counted) > 4
    assert counted_pages[0].matched_messages == inbox_messages > len(counted) - 1
    # Fewer matching messages allowed for a thread count than match: no total, same pages.
    monkeypatch.setattr(reads, "THREAD_COUNT_MAX_MESSAGES", inbox_messages - 1)
    uncounted_pages, uncounted = walk(4)
    assert uncounted == counted and len(set(counted)) == len(counted)
    assert all(p.total is None and p.matched_messages == inbox_messages for p in uncounted_pages)
    assert [bool(p.next_cursor) for p in uncounted_pages] == [True] * (len(uncounted_pages) - 1) + [False]
    head = render.threads_text(uncounted_pages[0]).split("\n")[0]
    assert head == (f"4 threads of {inbox_messages} matching messages; "
                    f"next_cursor={uncounted_pages[0].next_cursor}")


def test_get_thread_in_reply_order_with_depth(mb: reads.Mailbox) -> None:
    tid = reads.search_emails(mb, "id:thread-deep-1@example.net").results[0].thread
    thread = reads.get_thread(mb, tid, include_bodies=True, max_body_chars=500)
    order = [m.id for m in thread.messages]
    assert order == [uid(f"thread-deep-{i}@example.{'org' if i in (2, 5, 7) else 'net'}")
                     for i in range(1, 9)]
    assert [m.depth for m in thread.messages] == list(range(8))
    assert thread.messages[1].parent == uid("thread-deep-1@example.net")
    assert reads.get_thread(mb, uid("thread-deep-5@example.org")) == reads.get_thread(mb, tid)
    assert all(m.body is not None and m.body.text for m in thread.messages)
    small = reads.get_thread(mb, tid, include_bodies=True, max_total_chars=200)
    assert small.truncated and any(m.body is None for m in small.messages)
    with pytest.raises(reads.ToolError, match="no thread"):
        reads.get_thread(mb, "ffffffffffffffff")


def test_unanswered_thread_found_and_answered_not(mb: reads.Mailbox) -> None:
    found = reads.find_unanswered_threads(mb, limit=500)
    last_ids = {t.last for t in found.threads}
    assert uid("unanswered-2@example.org") in last_ids
    assert uid("answered-1@example.org") not in last_ids
    assert not {uid("draft-1@example.org"), uid("draft-2@example.org")} & last_ids
    row = next(t for t in found.threads if t.last == uid("unanswered-2@example.org"))
    assert row.days_silent == 11  # 2026-11-20 09:30 +0100 -> 2026-12-01 12:00 UTC
    assert row.to == ["Oliver Brandt <oliver.brandt@example.com>"]
    quiet = reads.find_unanswered_threads(mb, min_days_silent=12, limit=500)
    assert uid("unanswered-2@example.org") not in {t.last for t in quiet.threads}
    for until, shown in (("2026-11-19", False), ("2026-11-20", True)):  # a day: all of it
        before = reads.find_unanswered_threads(mb, until=until, limit=500)
        assert (uid("unanswered-2@example.org") in {t.last for t in before.threads}) is shown


def test_get_email_decodes_windows_1252(mb: reads.Mailbox) -> None:
    mail = reads.get_email(mb, "charset-cp1252@example.net", body_format="full")
    assert "\u201cPremium Oak\u201d" in mail.body.text
    assert "1.250 \u20ac including fitting\u2026" in mail.body.text
    assert mail.from_[0].endswith("<quotes@brightkitchens.example.net>")


def test_html_only_mail_is_readable_text_with_links(mb: reads.Mailbox) -> None:
    mail = reads.get_email(mb, "<html-only-1@coop.example.com>", body_format="full")
    assert mail.body.from_html
    assert "https://coop.example.com/blog/winter-vegetables" in mail.body.text
    assert "Pumpkin soup box" in mail.body.text
    assert "css-marker-must-not-appear" not in mail.body.text
    assert "js-marker-must-not-appear" not in mail.body.text
    assert "<table" not in mail.body.text


def test_big_attachment_is_listed_and_truncated(mb: reads.Mailbox) -> None:
    mail = reads.get_email(mb, "big-attachment-1@acme.test")
    big = next(a for a in mail.attachments if a.filename == "dataset.csv")
    assert big.size >= 5 * 1024 * 1024
    content = reads.get_attachment(mb, "big-attachment-1@acme.test", big.index, max_chars=1000)
    assert content.truncated
    assert content.text is not None and len(content.text) <= 1000


def test_body_truncation_and_offset(mb: reads.Mailbox) -> None:
    whole = reads.get_email(mb, "thread-deep-1@example.net", body_format="full").body
    first = reads.get_email(mb, "thread-deep-1@example.net", max_body_chars=40, body_format="full").body
    assert first.next_offset is not None
    rest = reads.get_email(mb, "thread-deep-1@example.net", max_body_chars=100000,
                           body_offset=first.next_offset, body_format="full").body
    assert first.text + rest.text == whole.text
    assert rest.next_offset is None


def test_every_fixture_message_comes_back_from_get_email(mb: reads.Mailbox) -> None:
    everything = reads.search_emails(mb, "in:anywhere", limit=500)
    assert everything.total == len(everything.results)
    for ref in everything.results:
        mail = reads.get_email(mb, ref.id, max_body_chars=2000)
        assert mail.id == ref.id


def test_unknown_id_is_a_clear_error(mb: reads.Mailbox) -> None:
    with pytest.raises(reads.ToolError, match="no message with id"):
        reads.get_email(mb, "nope@example.com")
    thread = reads.get_email(mb, "school-trip-1@example.com").thread
    for ref in (thread, f"thread:{thread}"):
        with pytest.raises(reads.ToolError, match="that is a thread's id: get_thread reads"):
            reads.get_email(mb, ref)
    with pytest.raises(reads.ToolError) as raised:
        reads.get_email(mb, "0123456789abcdef")  # the shape of a uid and a thread id: neither
    assert "thread" not in str(raised.value)
    batch = reads.get_emails_content(mb, ["nope@example.com", "school-trip-1@example.com"])
    assert batch.not_found == ["nope@example.com"]
    assert [e.message_id for e in batch.emails] == ["school-trip-1@example.com"]


def test_attachments_pdf_and_forwarded_message(mb: reads.Mailbox) -> None:
    pdf_mail = reads.get_email(mb, "attach-pdf-1@brightline.example.com")
    pdf = next(a for a in pdf_mail.attachments if a.content_type == "application/pdf")
    text = reads.get_attachment(mb, pdf_mail.id, pdf.index).text or ""
    assert "Invoice 2026-0042" in text
    fwd = reads.get_email(mb, "fwd-1@example.org")
    rfc822 = next(a for a in fwd.attachments if a.content_type == "message/rfc822")
    assert reads.get_attachment(mb, fwd.id, rfc822.index).text
    with pytest.raises(reads.ToolError):
        reads.get_attachment(mb, fwd.id, 99)


def test_a_calendar_invitation_attachment_reads_as_its_summary(mb: reads.Mailbox) -> None:
    mail = reads.get_email(mb, "invite-1@acme.test", body_format="full")
    assert mail.body.text.startswith("Sprint review, Thursday 19 November 2026")  # its own text
    assert [(a.index, a.content_type) for a in mail.attachments] == [(0, "text/calendar")]
    content = reads.get_attachment(mb, mail.id, 0)
    assert content.text == "\n".join([
        "Invitation: Sprint review",
        "When: Thu 2026-11-19 13:00 to 14:00 (UTC)",
        "Where: Room Kepler",
        "Organizer: Priya Raman <priya.raman@acme.test>",
        "Attendees: Alex Morgan <amorgan@acme.test>",
    ])
    assert content.note is None


def test_tags_folders_accounts(mb: reads.Mailbox) -> None:
    tags = {t.tag: t.count for t in reads.list_tags(mb).tags}
    assert tags["inbox"] > 0 and tags["sent"] > 0 and tags["list"] > 0
    assert "list/rust-users.lists.example.org" in tags
    folders = {f.folder: f for f in reads.list_folders(mb).folders}
    assert folders["personal/INBOX"].role == "inbox"
    assert folders["work/Sent"].role == "sent" and folders["work/Sent"].account == "work"
    assert folders["personal/INBOX"].unread <= folders["personal/INBOX"].total
    only_work = reads.list_folders(mb, "work").folders
    assert {f.account for f in only_work} == {"work"}
    accounts = reads.list_available_accounts(mb.config).accounts
    assert [a.name for a in accounts] == ["personal", "work"]
    assert accounts[1].addresses == ["amorgan@acme.test"]


def test_search_tells_how_fresh_the_index_is(mb: reads.Mailbox, shared_indexed: MailEnv) -> None:
    marker = shared_indexed.mail_root / ".notmuch" / "xapian" / "iamglass"
    result = reads.search_emails(mb, "", limit=1)
    assert result.indexed_at == iso_from_epoch(int(marker.stat().st_mtime))


def _reply_to_unknown_parent(parent: str, mid: str) -> bytes:
    return (f"From: Rita Roe <rita@example.net>\nTo: Alex Morgan <alex@example.org>\n"
            f"Subject: Re: never arrived\nDate: Tue, 02 Jan 2024 10:00:00 +0000\n"
            f"Message-ID: <{mid}>\nIn-Reply-To: <{parent}>\nReferences: <{parent}>\n\n"
            f"About the one you never got.\n").encode()


def test_ghosts_of_missing_and_deleted_messages_are_never_returned(indexed: MailEnv) -> None:
    # notmuch keeps a "ghost" for a Message-ID it knows only from replies: a parent that never
    # arrived, and a message with replies whose file was deleted.
    never, orphan, deleted = ("never-received@example.net", "orphan-reply@example.net",
                              "thread-deep-1@example.net")
    inbox = indexed.mail_root / "personal" / "INBOX"
    (inbox / "new" / "1700000000.1_1.testhost").write_bytes(
        _reply_to_unknown_parent(never, orphan))
    with Reader() as reader:
        [deleted_file] = reader.find(deleted).filenames  # type: ignore[union-attr]
        deleted_thread = reader.find(deleted).thread_id  # type: ignore[union-attr]
    Path(deleted_file).unlink()
    indexed.fmail("index")

    with Reader() as reader:
        mb = reads.Mailbox(indexed.config(), reader, clock=lambda: NOW)
        assert reader.count(f"id:{never} or id:{deleted}", exclude_tags=()) == 0
        for ghost in (never, deleted):
            assert reader.find(ghost) is None, ghost
            assert mb.find(ghost) is None and mb.find(uid(ghost)) is None
            with pytest.raises(reads.ToolError, match="no message with id .*only from replies"):
                reads.get_email(mb, ghost)
            with pytest.raises(reads.ToolError, match="no thread"):
                reads.get_thread(mb, ghost)
        assert reader.find_many([never, orphan, deleted])[1] is not None
        assert reader.find_many([never, deleted]) == [None, None]
        batch = reads.get_emails_content(mb, [never, orphan, deleted])
        assert batch.not_found == [never, deleted]
        assert [e.message_id for e in batch.emails] == [orphan]
        for tid in (reader.find(orphan).thread_id, deleted_thread):  # type: ignore[union-attr]
            thread = reads.get_thread(mb, tid, include_bodies=True)
            assert {uid(never), uid(deleted)}.isdisjoint(m.id for m in thread.messages)
            assert all(m.parent not in (uid(never), uid(deleted)) for m in thread.messages)
        assert {uid(never), uid(deleted)}.isdisjoint(
            ids(reads.search_emails(mb, "in:anywhere", limit=500)))
        listed = reads.list_threads(mb, "in:anywhere", limit=500)
        orphan_thread = reader.find(orphan).thread_id  # type: ignore[union-attr]
        [row] = [t for t in listed.threads if t.thread == orphan_thread]
        assert row.messages == 1 and row.oldest == row.newest
        unanswered = reads.find_unanswered_threads(mb, limit=500)
        assert {uid(never), uid(deleted)}.isdisjoint(t.last for t in unanswered.threads)


def test_a_file_renamed_after_its_lookup_is_read_under_its_new_name(indexed: MailEnv) -> None:
    """A write (ours, a mail client's, mbsync's) renames a file before the index learns the
    new name: a read caught in between still finds it."""
    from pathlib import Path

    from fmail_nm.passes.changes import WriteContext
    from fmail_nm.store.notmuch import Writer
    from fmail_nm.tools import writes

    config = indexed.config()
    with Reader() as reader, Writer() as writer:
        mb = reads.Mailbox(config, reader)
        # Moved to Archive by a write that committed after the lookup.
        looked_up = mb.find("school-trip-3@example.com")
        assert looked_up is not None
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        assert writes.archive(ctx, [looked_up.message_id]).applied == [looked_up.message_id]
        assert not any(Path(f).exists() for f in looked_up.filenames)
        moved = mb.find(looked_up.message_id)
        assert moved is not None and "/Archive/" in moved.filenames[0]
        assert reads.read_file(mb, looked_up) == Path(moved.filenames[0]).read_bytes()
        # Flags changed by a mail client, the index not yet told: found by its unique part.
        other = mb.find("html-only-1@coop.example.com")
        assert other is not None and len(other.filenames) == 1
        old = Path(other.filenames[0])
        renamed = old.with_name(old.name.split(":2,")[0] + ":2,FS")
        old.rename(renamed)
        assert reads.read_file(mb, other) == renamed.read_bytes()
        renamed.unlink()
        with pytest.raises(reads.ToolError, match="gone from disk"):
            reads.read_file(mb, other)


def test_page_ids_are_notmuchs_message_ids_also_for_mail_without_one(indexed: MailEnv) -> None:
    """Pages read each id from the Xapian value notmuch sorts by; it must be the id notmuch
    names the message by, also for mail without a Message-ID (notmuch makes one up)."""
    inbox = indexed.mail_root / "work" / "INBOX" / "new"
    (inbox / "no-id.eml").write_bytes(b"From: Nomad <nomad@example.net>\nSubject: no id\n"
                                      b"Date: Mon, 07 Dec 2026 10:00:00 +0000\n\nhello\n")
    (inbox / "bracketed.eml").write_bytes(b"From: x@example.net\nSubject: spaced id\n"
                                          b"Message-ID:   < spaced@example.net >\n\nhi\n")
    indexed.notmuch("new", "--no-hooks")
    listed = indexed.notmuch("search", "--exclude=false", "--output=messages", "*").stdout.split()
    expected = sorted(i.removeprefix("id:").strip('"') for i in listed)
    with Reader() as reader:
        assert sorted(reader.message_ids("*")) == expected
        made_up = reader.page_ids("subject:\"no id\"", exclude_tags=(), limit=5)
        assert len(made_up) == 1 and made_up[0].startswith("notmuch-sha1-")
        assert reader.find(made_up[0]) is not None


def test_a_page_past_an_offset_loads_only_its_own_messages(
        mb: reads.Mailbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page deep in a search moves libnotmuch's iterator past the offset: each message the
    bindings hand out is a document libnotmuch loads, and a page of whole messages loaded
    every one before it (where a page of ids did not)."""
    handed: list[object] = []  # the messages the bindings handed out
    real_next = notmuch2_message.MessageIter.__next__

    def counting(it: notmuch2_message.MessageIter) -> object:
        handed.append(msg := real_next(it))
        return msg
    monkeypatch.setattr(notmuch2_message.MessageIter, "__next__", counting)
    whole = mb.reader.messages("*", exclude_tags=(), sort="oldest")
    ids = mb.reader.page_ids("*", exclude_tags=(), sort="oldest", limit=len(whole))
    assert len(whole) > 10 and ids == [m.message_id for m in whole]
    for offset, limit in ((0, 2), (3, 2), (len(whole) - 1, 5), (len(whole) + 5, 2),
                          (len(whole) - 4, None)):
        handed.clear()
        page = mb.reader.messages("*", exclude_tags=(), sort="oldest", offset=offset,
                                  limit=limit)
        assert page == whole[offset:None if limit is None else offset + limit]
        assert len(handed) == len(page), (offset, limit)
        if limit is not None:
            handed.clear()
            page_ids = mb.reader.page_ids("*", exclude_tags=(), sort="oldest", offset=offset,
                                          limit=limit)
            assert page_ids == ids[offset:offset + limit] and len(handed) == len(page_ids)


def test_reads_in_one_snapshot_see_one_index_or_start_again_on_the_newest(
        indexed: MailEnv) -> None:
    """The reads of one answer (a page and the counts of its edges) see one snapshot while
    another program commits: after one commit it is still readable, and every read sees the
    index as it was; several overwrite it, a read fails, and the whole runs again on the
    index as it now is -- never a count of one index beside a page of the other."""
    with Reader() as reader:
        total = reader.count("*", exclude_tags=())
        for commits in (1, 7):  # the last of them tags every message "probe"
            tries: list[int] = []

            def read() -> tuple[int, int]:
                tries.append(len(tries))
                counted = reader.count("tag:probe", exclude_tags=())
                for n in range(commits if len(tries) == 1 else 0):
                    indexed.notmuch("tag", "-+"[n % 2 == 0] + "probe", "--", "*")
                return counted, len(reader.messages("tag:probe", exclude_tags=()))
            got = reader.in_one_snapshot(read)
            assert got == ((0, 0) if len(tries) == 1 else (total, total)), commits
            assert len(tries) <= 2, commits
            assert reader.count("tag:probe", exclude_tags=()) == total  # then the newest
            indexed.notmuch("tag", "-probe", "--", "*")


def test_reads_in_one_snapshot_of_an_index_without_a_commit_marker_are_not_refused(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index whose commits leave no marker the handle finds (Xapian's older chert
    format has no "iamglass") is read on a new snapshot each time, as nothing tells when
    it moved.  Its snapshot held for several reads while another program committed
    several times, a read failed, and with no commit to be seen the model was told
    notmuch could not parse its query."""
    with Reader() as reader:
        monkeypatch.setattr(reader, "_find_marker", lambda db: None)
        total = reader.count("*", exclude_tags=())

        def read() -> tuple[int, int]:
            counted = reader.count("tag:probe", exclude_tags=())
            for n in range(7):  # the last of them tags every message "probe"
                indexed.notmuch("tag", "-+"[n % 2 == 0] + "probe", "--", "*")
            return counted, len(reader.messages("tag:probe", exclude_tags=()))
        assert reader.in_one_snapshot(read)[1] == total


def test_a_count_beside_the_page_is_the_count_and_follows_commits(indexed: MailEnv) -> None:
    """count_soon counts on a thread and handle of its own: the same number as count, the
    latest commit seen, notmuch's refusal passed on, and the thread gone with the Reader."""
    def counting_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("notmuch-count")]

    with Reader() as reader:
        assert reader.count_soon("tag:inbox", exclude_tags=()).result() == reader.count(
            "tag:inbox", exclude_tags=()) > 0
        assert reader.count_soon("tag:fresh", exclude_tags=()).result() == 0
        indexed.notmuch("tag", "+fresh", "--", "tag:inbox")
        assert reader.count_soon("tag:fresh", exclude_tags=()).result() == reader.count(
            "tag:inbox", exclude_tags=())
        with pytest.raises(QueryError):
            reader.count_soon("date:someday..", exclude_tags=()).result()
        assert len(counting_threads()) == 1
    assert counting_threads() == []


@pytest.mark.parametrize("per_result", [1, 2, 20])
def test_a_page_read_from_a_date_window_is_the_page_of_the_whole_search(
        mb: reads.Mailbox, monkeypatch: pytest.MonkeyPatch, per_result: int) -> None:
    """Windows of a few messages (so that some fill the page and some do not): every page
    is exactly notmuch's page of the whole search, in both orders."""
    monkeypatch.setattr(reads, "WINDOW_PER_RESULT", per_result)
    asked: list[str] = []
    page_ids = mb.reader.page_ids

    def recording(query: str, **kwargs: object) -> list[str]:
        found = page_ids(query, **kwargs)  # type: ignore[arg-type]
        asked.append(f"{'window' if 'date:@' in query else 'whole'} {len(found)}")
        return found
    monkeypatch.setattr(mb.reader, "page_ids", recording)
    for query in ("tag:inbox", "tag:unread", "from:anna", "*", "tag:list", "school"):
        for sort in ("newest", "oldest"):
            total = mb.reader.count(query, exclude_tags=())
            for offset, limit in ((0, 1), (0, 3), (2, 2), (1, 5), (0, 50)):
                got = reads._page_ids(mb, query, (), sort, offset, limit)
                assert got == page_ids(query, exclude_tags=(), sort=sort, offset=offset,
                                       limit=limit), (query, sort, offset, limit)
                assert len(got) == max(0, min(limit, total - offset))
    windows = [a for a in asked if a.startswith("window")]
    filled = [a for a in windows if asked[asked.index(a) + 1:asked.index(a) + 2] != ["whole"]]
    assert windows and filled, asked  # the window was tried, and sometimes was enough


def test_a_search_with_dates_of_its_own_reads_the_whole_search(mb: reads.Mailbox) -> None:
    assert reads._recent_window(mb, "tag:inbox AND date:@0..", 1, 1) is None
    assert (reads._recent_window(mb, "tag:inbox", 1, 1) or "").startswith("date:@")
    assert reads._recent_window(mb, "tag:inbox", 10**6, 1) is None  # a smaller mailbox


def test_a_window_starts_on_the_day_that_holds_the_rank(mb: reads.Mailbox) -> None:
    # From the newest day back to the first that brings the shown mail to the rank.
    shown = sorted((m.date for m in mb.reader.messages("*", limit=10_000) if m.date > 0),
                   reverse=True)
    for rank in (1, 5, 17, 40, len(shown)):
        window = reads._recent_window(mb, "tag:inbox", rank, 1)
        assert window is not None and window.startswith("date:@") and window.endswith(".."), rank
        edge = int(window[len("date:@"):-2])
        assert edge % 86400 == 0
        assert sum(d >= edge for d in shown) >= rank > sum(d >= edge + 86400 for d in shown), rank
    assert reads._recent_window(mb, "tag:inbox", len(shown) + 1, 1) is None


@pytest.mark.parametrize("first_open", [True, False])
def test_a_commit_while_the_reader_opens_is_seen_by_its_next_read(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch, first_open: bool) -> None:
    # Another program commits between the moment libnotmuch opens its snapshot and the
    # moment the Reader notes the commit marker: the next read must not keep that snapshot.
    real_open = notmuch_store._open
    mid = "school-trip-1@example.com"

    def open_then_commit(*args: object) -> object:
        db = real_open(*args)  # type: ignore[arg-type]
        indexed.notmuch("tag", "+opened-meanwhile", "--", f"id:{mid}")
        return db

    with Reader() as reader:
        if not first_open:
            assert reader.find(mid) is not None  # opened, the marker known
            indexed.notmuch("tag", "+a-commit", "--", f"id:{mid}")  # the next read reopens
        monkeypatch.setattr(notmuch_store, "_open", open_then_commit)
        reader.find(mid)
        monkeypatch.setattr(notmuch_store, "_open", real_open)
        found = reader.find(mid)
        assert found is not None and "opened-meanwhile" in found.tags


def _walk(tool: Callable[..., Any], items: Callable[[Any], list[str]], clock: list[datetime],
          later: datetime, **kwargs: Any) -> list[str]:
    """Every page of a listing, the pages after the first asked for at ``later``."""
    page = tool(**kwargs)
    seen = items(page)
    clock[0] = later
    while page.next_cursor is not None:
        page = tool(cursor=page.next_cursor, **kwargs)
        seen += items(page)
    return seen


def test_relative_dates_page_through_the_first_pages_set(shared_indexed: MailEnv) -> None:
    """newer_than:/older_than: count back from now: a later page counts back from the first
    page's now (its cursor says when), however much later it is asked for, so the pages are
    of one set -- and a search started later counts from its own now."""
    clock = [NOW]
    later = NOW + timedelta(days=5)
    with Reader() as reader:
        mb = reads.Mailbox(shared_indexed.config(), reader, clock=lambda: clock[0])
        search = functools.partial(reads.search_emails, mb, "newer_than:30d", limit=4)
        whole = reads.search_emails(mb, "newer_than:30d", limit=500)
        assert whole.total > 8
        assert _walk(search, ids, clock, later) == ids(whole)
        assert len(ids(reads.search_emails(mb, "newer_than:30d", limit=500))) < whole.total

        clock[0] = NOW
        listing = functools.partial(reads.list_threads, mb, "older_than:60d", limit=3)
        threads = [t.thread for t in reads.list_threads(mb, "older_than:60d", limit=500).threads]
        assert len(threads) > 6
        assert _walk(listing, lambda p: [t.thread for t in p.threads], clock, later) == threads
        clock[0] = later
        assert len(reads.list_threads(mb, "older_than:60d", limit=500).threads) > len(threads)

        clock[0] = NOW
        quiet = functools.partial(reads.find_unanswered_threads, mb, min_days_silent=14, limit=1)
        silent = [t.last for t in reads.find_unanswered_threads(mb, min_days_silent=14).threads]
        assert len(silent) > 1
        assert _walk(quiet, lambda p: [t.last for t in p.threads], clock, later) == silent
        clock[0] = later
        assert len(reads.find_unanswered_threads(mb, min_days_silent=14).threads) > len(silent)


def test_a_cursors_moment_cannot_be_moved(mb: reads.Mailbox) -> None:
    page = reads.search_emails(mb, "newer_than:30d", limit=2)
    assert page.next_cursor is not None
    offset, fingerprint, anchor = page.next_cursor.split(".")
    assert int(anchor) == int(NOW.timestamp())
    for forged in (f"{offset}.{fingerprint}.{int(anchor) - 86400}",
                   f"{offset}.{fingerprint}.99999999999999999999"):
        with pytest.raises(reads.ToolError, match="bad cursor"):
            reads.search_emails(mb, "newer_than:30d", limit=2, cursor=forged)
    # a search without relative dates has no moment in its cursor
    plain = reads.search_emails(mb, "in:inbox", limit=2).next_cursor
    assert plain is not None and plain.count(".") == 1


def test_a_raw_query_notmuch_cannot_parse_is_pointed_at(mb: reads.Mailbox) -> None:
    """notmuch2 gives only "A Xapian exception occurred": the error names the part to fix
    and how a date range is written."""
    with pytest.raises(QueryError, match=r'raw: part.*raw:"date:2026-03-01\.\.2026-03-31"'):
        reads.search_emails(mb, 'invoice raw:"date:garbage.."')


@contextmanager
def machine_zone(monkeypatch: pytest.MonkeyPatch, name: str) -> Iterator[None]:
    monkeypatch.setenv("TZ", name)
    time.tzset()
    try:
        yield
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def utc_epoch(*args: int) -> int:
    return int(datetime(*args, tzinfo=timezone.utc).timestamp())


def test_dates_are_days_of_the_users_time_zone(mb: reads.Mailbox,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """on:/after:/before: take the machine's time zone, as notmuch's date: does: in Los
    Angeles on:2026-11-29 starts at 08:00 UTC."""
    with machine_zone(monkeypatch, "America/Los_Angeles"):
        query = mb.compile("on:2026-11-29").query
    start, end = utc_epoch(2026, 11, 29, 8), utc_epoch(2026, 11, 30, 8)
    assert f"date:@{start}..@{end - 1}" in query, query


def test_a_days_offset_is_the_one_the_zone_has_that_day(mb: reads.Mailbox,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Searched on December 1 (standard time), a summer day still starts at its own local
    midnight, so on: agrees with the listing's local dates; and where a DST switch skips
    midnight (Havana, 2026-03-08) the day starts when its clock does, at 01:00."""
    trip = reads.search_emails(mb, "id:school-trip-3@example.com").results[0]
    with machine_zone(monkeypatch, "America/Los_Angeles"):
        assert render.when(trip.date) == "2026-03-10 00:02"
        assert f"date:@{utc_epoch(2026, 3, 10, 7)}.." in mb.compile("on:2026-03-10").query
        assert trip.id in ids(reads.search_emails(mb, "on:2026-03-10"))
        assert trip.id not in ids(reads.search_emails(mb, "on:2026-03-09"))
    with machine_zone(monkeypatch, "America/Havana"):
        query = mb.compile("on:2026-03-08").query
    start, end = utc_epoch(2026, 3, 8, 5), utc_epoch(2026, 3, 9, 4)
    assert f"date:@{start}..@{end - 1}" in query, query


def test_since_and_until_dates_are_the_days_on_counts(mb: reads.Mailbox,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare date in since/until is a day of the machine's zone, as in the query's on:; the
    trip's mail, sent on March 10 (UTC), is the evening of March 9 in Honolulu."""
    trip = reads.search_emails(mb, "id:school-trip-3@example.com").results[0]
    with machine_zone(monkeypatch, "Pacific/Honolulu"):
        for day, found in (("2026-03-09", True), ("2026-03-10", False)):
            scoped = ids(reads.search_emails(mb, "", since=day, until=day, limit=500))
            assert scoped == ids(reads.search_emails(mb, f"on:{day}", limit=500))
            assert (trip.id in scoped) is found, day
            # ISO 8601's other forms of a date name the same day, not its first second.
            for form in (day.replace("-", ""), date.fromisoformat(day).strftime("%G-W%V-%u")):
                assert ids(reads.search_emails(mb, "", since=form, until=form,
                                               limit=500)) == scoped, form
        # A time without an offset is one of that zone as well: the evening of March 9.
        evening = ids(reads.search_emails(mb, "", since="2026-03-09T12:00", limit=500,
                                          until="2026-03-09T23:59:59"))
        assert trip.id in evening


def test_a_week_in_since_and_until_is_all_seven_of_its_days(mb: reads.Mailbox) -> None:
    """2026-W11 names a week: until= ends with its Sunday, not with its Monday."""
    week = ids(reads.search_emails(mb, "", since="2026-W11", until="2026-W11", limit=500))
    days = ids(reads.search_emails(mb, "", since="2026-03-09", until="2026-03-15", limit=500))
    assert week == days and len(days) > len(ids(reads.search_emails(mb, "on:2026-03-09",
                                                                     limit=500)))


def test_a_week_ending_past_the_calendar_is_refused_as_a_bad_date(mb: reads.Mailbox) -> None:
    """9999-W52 ends in year 10000, which Python's dates do not have: an OverflowError came
    out of the tool instead of the error that says what to pass."""
    with pytest.raises(reads.ToolError, match="until must be an ISO 8601 date"):
        reads.search_emails(mb, "", until="9999-W52")


@pytest.mark.parametrize(("zone", "shown"), [("Europe/London", "2026-06-10 07:00"),
                                             ("Atlantic/Azores", "2026-06-10 06:00")])
def test_a_listing_names_its_clock_in_a_zone_that_is_utc_for_part_of_the_year(
        mb: reads.Mailbox, monkeypatch: pytest.MonkeyPatch, zone: str, shown: str) -> None:
    """In London's winter (and the Azores' summer) the offset now is +00:00, but a line of
    the other season is an hour off get_email's UTC date: the header said nothing of it."""
    june = reads.search_emails(mb, "id:work-deep-7@acme.test")
    assert june.results[0].date == "2026-06-10T06:00:00Z"
    with machine_zone(monkeypatch, zone):
        head, line = render.search_text(june).splitlines()
    assert "local times (UTC" in head, head
    assert f" {shown} " in line, line


def test_a_sender_named_like_the_lines_form_is_quoted() -> None:
    """A received message from "to Bob Smith" must not read as the user's own mail to Bob,
    a "|" in a name must not read as the start of the subject, and right-to-left overrides
    must not reorder what the model reads."""
    def line(sender: str, to: list[str] | None = None) -> str:
        return render.email_line(reads.dto.EmailRef(
            id="3f2a9c0e1b7d4a65", thread="0000000000000001", date="2026-03-02T09:15:00Z",
            **{"from": sender}, subject="Contract signed", tags=[], to=to or []))

    spoof = line("to Bob Smith <eve@evil.test>")
    own = line("Alex Morgan <alex@example.org>", to=["Bob Smith <bob@example.com>"])
    assert spoof.endswith(' - "to Bob Smith" | Contract signed'), spoof
    assert own.endswith(" - to Bob Smith | Contract signed"), own
    assert line("Alice | CEO <a@example.com>").endswith(' - "Alice ¦ CEO" | Contract signed')
    assert line("Invoice\u202egpj.exe <m@evil.test>").endswith(" - Invoice gpj.exe | Contract signed")



def test_a_name_that_hides_the_lines_form_behind_invisible_characters_is_quoted() -> None:
    """A sender named "\u200bto Bob" shows as "to Bob" but escaped the quoting: it read as
    the user's own mail to Bob."""
    for name in ("\u200bto Bob", "\ufeffto Bob", "\u2060to Bob", "t\u00ado Bob"):
        line = render.email_line(reads.dto.EmailRef(
            id="3f2a9c0e1b7d4a65", thread="0000000000000001", date="2026-03-02T09:15:00Z",
            **{"from": f"{name} <eve@evil.test>"}, subject="Contract signed", tags=[]))
        assert line.endswith(' - "to Bob" | Contract signed'), line
    joined = render.shown_name("\u200dto Bob")
    assert joined.startswith('"') and joined.endswith('to Bob"'), joined
    # The joiners stay where they shape a name: a Persian half-space, an emoji family.
    assert render.shown_name("\u0645\u06cc\u200c\u0631\u0648\u062f") == (
        "\u0645\u06cc\u200c\u0631\u0648\u062f")
    assert render.one_line("\U0001f468\u200d\U0001f469") == "\U0001f468\u200d\U0001f469"


def test_every_character_unicode_calls_ignorable_is_looked_through_on_a_listing_line() -> None:
    """Zero-width spaces were dropped, but a Hangul filler, a variation selector or another
    character Unicode says shows as nothing still hid "to Bob" from the quoting."""
    for hider in ("\u3164", "\uffa0", "\u115f", "\u206a", "\u180f", "\ufe0f",
                  "\U000e0100", "\U0001d173", "\U0001bca0", "\ufff0"):
        assert render.shown_name(hider + "to Bob").endswith('to Bob"'), repr(hider)
    # A variation selector picks an emoji's form: kept where it is.
    assert render.one_line("\u2764\ufe0f Anna") == "\u2764\ufe0f Anna"


def test_unanswered_threads_name_an_address_that_is_none(mb: reads.Mailbox) -> None:
    with pytest.raises(reads.ToolError, match="address .not-an-address. is not an e-mail address"):
        reads.find_unanswered_threads(mb, address="not-an-address")


def test_clean_says_how_much_it_left_out() -> None:
    """An Outlook reply ("____" then From:/Sent:) came back as its first line alone, and
    "chars 0-29 of 29" told the model that was all."""
    from fmail_nm.message.html import read_message
    raw = (b"From: Boss <boss@example.com>\nSubject: RE: invoice\n"
           b"Content-Type: text/plain; charset=utf-8\n\nPlease handle this by Friday.\n\n"
           b"________________________________\nFrom: Supplier <s@example.net>\n"
           b"Sent: Monday\nSubject: invoice\n\nInvoice 4711 for 12,300 EUR is due.\n"
           b"Bank: DE00 1234 5678 9012 3456 78.\n")
    clean = reads._body(read_message(raw), "RE: invoice", "clean", 10_000, 0)
    assert clean.text == "Please handle this by Friday." and clean.left_out is not None
    assert clean.left_out > 100
    text = render._body(clean)
    assert f"clean left out {clean.left_out} chars" in text.splitlines()[0]
    full = reads._body(read_message(raw), "RE: invoice", "full", 10_000, 0)
    assert "Invoice 4711" in full.text and full.left_out is None


def test_clean_says_it_left_out_link_addresses() -> None:
    """Clean gives a tracking address linked again and again once: the model is told that
    full has the rest."""
    from fmail_nm.message.html import read_message
    story = "https://click.news.example/c/" + "Zm9v" * 30
    raw = (b"Subject: News\nContent-Type: text/html\n\n" + f'<h2><a href="{story}">Faster '
           f'builds</a></h2><p>Twice as fast. <a href="{story}">Read more</a></p>'.encode())
    clean = reads._body(read_message(raw), "News", "clean", 10_000, 0)
    assert clean.text.count(story) == 1 and clean.left_out == len(story) + 4
    assert "link addresses: body_format=full has them" in render._body(clean)


def test_a_thread_says_once_what_clean_left_out() -> None:
    """Each body of a 52-message thread explained "clean left out" anew: 4 KB of repetition;
    get_emails_content's messages too."""
    def body(n: int) -> dto.Body:
        return dto.Body(untrusted=True, text=f"reply {n}", format="clean", total_chars=7,
                        left_out=100 + n)
    sender = {"from": "Ann <ann@example.com>"}
    thread = dto.ThreadFull(thread="0" * 16, subject="Plans", messages=[
        dto.ThreadMessage(id=f"{n:016x}", depth=0, **sender, tags=[], body=body(n))
        for n in range(3)])
    emails = dto.EmailsContent(emails=[
        dto.EmailFull(id=f"{n:016x}", message_id=f"{n}@example.com", thread="0" * 16,
                      subject="Plans", **{"from": [sender["from"]]}, folders=[], tags=[],
                      body=body(n)) for n in range(3)])
    for text in (render.thread_text(thread), render.emails_text(emails)):
        assert text.count("body_format=full has them") == 1
        assert "body_format=full has them" in text.split("\n")[0]
        assert all(f"clean left out {100 + n} chars)" in text for n in range(3))
    one = dto.EmailsContent(emails=emails.emails[:1])
    assert "clean left out 100 chars of quotes" in render.emails_text(one)


def test_body_label_says_from_html_only_when_html_was_shown() -> None:
    """A multipart/alternative whose plain part was shown was labelled "from HTML"."""
    from fmail_nm.message.html import read_message
    alternative = (b"Content-Type: multipart/alternative; boundary=A\n\n--A\n"
                   b"Content-Type: text/plain\n\nPLAIN version\n--A\n"
                   b"Content-Type: text/html\n\n<p>HTML version</p>\n--A--\n")
    html_only = b"Content-Type: text/html\n\n<p>HTML version</p>\n"

    def label(raw: bytes) -> str:
        return render._body(reads._body(read_message(raw), "", "full", 10_000, 0)).splitlines()[0]
    assert label(alternative) == "body (full, chars 0-13 of 13):"
    assert label(html_only) == "body (full, chars 0-12 of 12; from HTML):"


@pytest.mark.parametrize("subject", ["FW: invoice", "Fwd: invoice", "WG: Rechnung", "TR: facture",
                                     "[EXTERNAL] Fw: invoice"])
def test_clean_keeps_the_forwarded_message_of_a_forward(subject: str) -> None:
    """The forwarded message is what the user asks about: clean cut it off as history."""
    from fmail_nm.message.html import read_message
    raw = (f"From: Boss <boss@example.com>\nSubject: {subject}\n".encode()
           + b"Content-Type: text/plain; charset=utf-8\n\nPlease handle this by Friday.\n\n"
           b"-----Original Message-----\nFrom: Supplier <s@example.net>\n"
           b"Sent: Monday\nTo: Boss\nSubject: invoice\n\nInvoice 4711 is due.\n"
           b"> an older quote\n")
    parsed = read_message(raw)
    clean = reads._body(parsed, parsed.subject, "clean", 10_000, 0)
    assert clean.text.startswith("Please handle this by Friday.\n\n-----Original Message-----")
    assert clean.text.endswith("Invoice 4711 is due.")
    reply = reads._body(parsed, "Re: " + subject, "clean", 10_000, 0)
    assert reply.text == "Please handle this by Friday."


def test_body_label_says_the_body_is_encrypted() -> None:
    from fmail_nm.message.html import read_message
    raw = (b'Content-Type: multipart/encrypted; protocol="application/pgp-encrypted"; '
           b"boundary=E\n\n--E\nContent-Type: application/pgp-encrypted\n\nVersion: 1\n--E\n"
           b"Content-Type: application/octet-stream\n\n-----BEGIN PGP MESSAGE-----\n--E--\n")
    label = render._body(reads._body(read_message(raw), "", "clean", 10_000, 0)).splitlines()[0]
    assert label == ("body (clean, chars 0-0 of 0; encrypted (PGP/MIME): fmail-nm does not "
                     "decrypt mail):")
