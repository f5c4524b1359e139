"""The read tools as plain functions: the MCP layer wraps these, tests call them directly.

A listing page takes its ids, order and total from notmuch and every other field from the
sidecar mirror, in one indexed read for the page; a message the mirror does not have, or has
in an older state than the index (a sync in flight, tags changed by a mail client), is read
from notmuch instead, so a page is always the index's truth.  A listing opens no message file
but the header block of the user's own mail the mirror does not have yet, for whom it went to
(read as the mirror will read it); only tools that return a body or an attachment read a file,
and only the files of the messages they return.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import re
import sqlite3
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from time import sleep
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from ..clock import MACHINE_ZONE, iso_from_epoch, utc_now
from ..config import THREAD_ID, Config
from ..dsl import (CompiledQuery, DslContext, DslError, compile_query, date_range_query,
                   list_names, local_day)
from ..errors import CallerError
from ..message.attachments import attachment_text, dotted
from ..message.drafts import SeenDrafts
from ..message.headers import (Address, Unsubscribe, canonical_address, is_own_address,
                               search_forms)
from ..message.html import read_body, read_message
from ..message.mime import AttachmentInfo, BodyText, ParsedMessage
from ..message.text import clean_text, is_forward_subject, slice_text
from ..passes.blocklist import read_blocklist
from ..passes.mirror import MAX_RECIPIENTS, file_recipients, my_addresses
from ..store import maildir, sidecar
from ..store.notmuch import IndexedMessage, Reader, ThreadNode
from ..store.threads import ThreadSummary, sender, summarize
from ..store.query import (Conjunction, all_of, clean_id, conjunction, folders_query,
                           id_forms, id_query, me_query, plain_addresses, quote,
                           sender_conjunction)
from ..tags import ATTACHMENT, DELETED, DRAFT, LIST, SENT, SPAM
from . import dto

MAX_LIMIT = 500
DEFAULT_LIMIT = 50
# The notmuch query is echoed for the model to check what ran; a long one is cut, since the
# answer must stay small whatever the input (the query itself is limited by the DSL).
MAX_ECHOED_QUERY = 500
MAX_CURSOR_CHARS = 200
MAX_DATE_CHARS = 40
# Bounds on integers that reach SQLite (64-bit) and islice (sys.maxsize): a cursor's offset
# counts messages, and no mail is older than the Unix epoch by a million days -- past these a
# call would crash with no word of what to fix.
MAX_CURSOR_OFFSET = 2**31 - 1
MAX_DAYS_SILENT = 1_000_000
SORTS = ("newest", "oldest")


class ToolError(CallerError):
    """A request the caller can fix (unknown id, bad cursor, bad search); the text says how."""


@dataclass
class Mailbox:
    """What every read needs: the resolved config, a reader (on the caller's thread) and a
    clock; and where a read that shows a draft notes which version it showed."""

    config: Config
    reader: Reader
    clock: Callable[[], datetime] = utc_now
    seen_drafts: SeenDrafts = field(default_factory=SeenDrafts)
    mirror: sidecar.MirrorReader = field(init=False)
    # own_addresses by mirror version: reading them scans every sub-address the mirror has
    _own: dict[tuple[tuple[int, int] | None, bool], tuple[str, ...]] = field(
        init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.mirror = sidecar.MirrorReader(sidecar.sidecar_path(self.config.data_dir))

    def dsl_context(self, anchor: int | None = None) -> DslContext:
        """What the DSL needs, relative dates counted back from ``anchor`` (epoch seconds)
        or else from now, to the second (a later page passes the first page's moment).
        Dates are days of the user's time zone (the machine's, as notmuch's date: reads
        them): on:2026-11-29 starts at local midnight, in summer time or not."""
        now = self.clock().astimezone(MACHINE_ZONE)
        now = (now.replace(microsecond=0) if anchor is None
               else datetime.fromtimestamp(anchor, now.tzinfo))
        return DslContext(
            now=now,
            accounts={a.name: a.maildir for a in self.config.accounts},
            account_inboxes={a.name: inbox for a in self.config.accounts
                              if (inbox := a.outside_inbox()) is not None},
            folder_roles=self.config.roles(),
            folders=self.config.folders,
            folder_names=self.config.mailbox_names,
            excluded_tags=self.reader.search_exclusions(),
            own_addresses=self.own_addresses,
            message_id_of_uid=self._message_id_of_uid,
        )

    def own_addresses(self, received: bool = False) -> tuple[str, ...]:
        """The user's addresses, canonical, and their sub-addresses most used in the mirror:
        those the user sent from or (``received``) those mail went to (sidecar.own_addresses),
        what from:me and the user's last word, or to:me, search by.  Read once a mirror state."""
        key = (self.mirror.version(), received)
        if key not in self._own:
            self._own = {k: v for k, v in self._own.items() if k[0] == key[0]}
            self._own[key] = sidecar.own_addresses(self.mirror.connection(),
                                                   self.config.addresses, received=received)
        return self._own[key]

    def compile(self, text: str, anchor: int | None = None) -> CompiledQuery:
        try:
            return compile_query(text or "", self.dsl_context(anchor))
        except DslError as exc:
            raise ToolError(str(exc)) from None

    def find(self, ref: str) -> IndexedMessage | None:
        """A message by Message-ID (with or without <> or id:) or by its sidecar ``uid``."""
        found = self.reader.find_first(id_forms(ref))
        if found is None and (resolved := self._message_id_of_uid(clean_id(ref))):
            found = self.reader.find(resolved)
        return found

    def _message_id_of_uid(self, text: str) -> str | None:
        """The Message-ID of the message whose sidecar ``uid`` is ``text``, if any."""
        if not sidecar.looks_like_uid(text) or not (conn := self.mirror.connection()):
            return None
        return sidecar.resolve_uids(conn, [text]).get(text)

    def mirror_lag(self) -> tuple[sqlite3.Connection, int | None] | None:
        """The sidecar connection and the first notmuch revision the mirror may be missing
        (None: it is up to date, so its rows are the index's truth); None when there is no
        mirror of this database to read."""
        conn = self.mirror.connection()
        if conn is None:
            return None
        state = sidecar.mirror_state(conn)
        revision = self.reader.revision()
        if state.uuid != revision.uuid:  # built from another database: nothing in it holds
            return None
        if state.revision is None:
            return conn, 0
        return conn, state.revision + 1 if state.revision < revision.number else None

    def mirror_rows(self, message_ids: Sequence[str]) -> tuple[dict[str, tuple[Any, ...]], set[str]]:
        """The mirror's listing rows of these messages (their uids resolve), and which of
        them are stale: notmuch changed the message after the mirror's last complete sync."""
        mirror = self.mirror_lag() if message_ids else None
        if mirror is None:
            return {}, set()
        conn, lag = mirror
        rows = sidecar.listing_rows(conn, message_ids)
        if lag is None or not rows:
            return rows, set()
        return rows, set(self.reader.message_ids(f"lastmod:{lag}.. AND ({id_query(rows)})"))

    def folders_of(self, message: IndexedMessage) -> list[str]:
        return maildir.folders_of(self.config.mail_root, message.filenames)


# ---------------------------------------------------------------------------------------------
# Small conversions


def who(name: str, address: str) -> str:
    """A person as one string, ``Name <address>`` or the bare address; each part at most
    MAX_NAME_CHARS (a name of kilobytes would fill a listing)."""
    name = dto.cut(name, dto.MAX_NAME_CHARS)
    address = dto.cut(address.lower(), dto.MAX_NAME_CHARS)
    return f"{name} <{address}>" if name and name != address else address


def person(header: str) -> str:
    """The sender of a From header as notmuch gives it (decoded: "Smith, Bob <b@x>" from
    Exchange's encoded word is one person, see store.threads.sender)."""
    return who(*sender(header))


def people(addresses: Sequence[Address]) -> list[str]:
    return [who(a.name, a.address) for a in addresses]


# Recipients shown per message in listings (the sidecar keeps them all).
LISTED_RECIPIENTS = 5


def _listed_to(recipients_json: str | None, tags: Collection[str],
               me: Collection[str]) -> list[str]:
    """Whom a listed message went (or, a draft, will go) to, from its mirror row: shown for
    the user's own messages only (for mail received the recipient is the user, which says
    nothing), and without the user's own addresses unless it went to no one else (a copy to
    oneself).  To and Cc alone, as get_email shows them: the mirror keeps the Bcc of the
    user's Sent copy for contacts, and a Bcc named as a recipient here is one a follow-up
    would reveal."""
    if not _lists_recipients(tags) or not recipients_json:
        return []
    return _shown_recipients(json.loads(recipients_json), me)


def _unmirrored_to(m: IndexedMessage, tags: Collection[str], me: Collection[str]) -> list[str]:
    """:func:`_listed_to` of a message the mirror does not have yet (a sync in flight): its
    file's header block read as the mirror will read it, so that the listing does not change
    when the mirror catches up.  Only the user's own mail lists its recipients, so no other
    file is opened."""
    if not _lists_recipients(tags):
        return []
    return _shown_recipients(_file_recipients(m), me)


def _file_recipients(m: IndexedMessage) -> list[dict[str, str]]:
    """The recipients the mirror will read of a message it does not have yet."""
    return file_recipients([str(path) for name in m.filenames
                            for path in maildir.on_disk(Path(name))])


def _lists_recipients(tags: Collection[str]) -> bool:
    return SENT in tags or DRAFT in tags


def _shown_recipients(recipients: Iterable[dict[str, str]], me: Collection[str]) -> list[str]:
    return _others(((r["name"], r["email"]) for r in recipients if r.get("kind") != "bcc"), me)


def _others(people: Iterable[tuple[str, str]], me: Collection[str]) -> list[str]:
    """``me``: the user's addresses in canonical form (:func:`my_addresses`), as a recipient
    is compared -- mail may write the user's domain in ACE where the config has Unicode."""
    everyone = [(name, address) for name, address in people if address]
    others = [p for p in everyone if not is_own_address(p[1], me)] or everyone
    return [who(name, address) for name, address in others[:LISTED_RECIPIENTS]]


def dated_listing(mb: Mailbox, message_ids: Sequence[str]) -> list[tuple[dto.EmailRef, int]]:
    """These messages as listing rows, in the given order: from the mirror where it is
    current, from notmuch for the rest (see Mailbox.current_rows); each with the date (epoch
    seconds) it is listed by, what a message cursor names (see :func:`message_tail`), read
    with the row, not looked up again."""
    rows, stale = mb.mirror_rows(message_ids)
    me = my_addresses(mb.config)
    refs: dict[str, tuple[dto.EmailRef, int]] = {}
    for (mid, uid, thread, date_, name, address, subject, tags_json, recipients,
         attached, epoch) in rows.values():
        if mid not in stale:
            tags = json.loads(tags_json)
            refs[mid] = (dto.EmailRef(id=uid, thread=thread, date=date_, from_=who(name, address),
                                      subject=dto.cut(subject, dto.MAX_LISTED_SUBJECT),
                                      tags=dto.shown_tags(tags),
                                      to=_listed_to(recipients, tags, me),
                                      attachment=bool(attached)), epoch)
    missing = [mid for mid in message_ids if mid not in refs]
    for mid, m in zip(missing, mb.reader.find_many(missing) if missing else ()):
        if m is not None:  # None: removed since the ids were read
            row = rows.get(mid)
            # A draft saved again is parsed again by the next sync: its file says whom to.
            refs[mid] = (email_ref(m, known=row is not None, me=me,
                                   recipients=row[8] if row and DRAFT not in m.tags else None,
                                   attachment=bool(row[9]) if row else None), m.date)
    return [refs[mid] for mid in message_ids if mid in refs]


def email_ref(m: IndexedMessage, *, known: bool, me: Collection[str],
              recipients: str | None = None, attachment: bool | None = None) -> dto.EmailRef:
    """A listing row from the index itself; its id is the uid only when the mirror has the
    message (so the uid resolves), else the Message-ID.  ``recipients``: the mirror's
    (JSON); without them, the user's own mail lists those its file names.  ``attachment``:
    what the mirror's parse of the file says (a tag change leaves it true); without it,
    notmuch's tag, the best a listing can know without opening the file."""
    tags = sorted(m.tags)
    return dto.EmailRef(
        id=sidecar.uid_for(m.message_id) if known else m.message_id, thread=m.thread_id,
        date=iso_from_epoch(m.date), from_=person(m.from_header),
        subject=dto.cut(m.subject, dto.MAX_LISTED_SUBJECT), tags=dto.shown_tags(tags),
        to=(_listed_to(recipients, tags, me) if recipients is not None
            else _unmirrored_to(m, tags, me)),
        attachment=ATTACHMENT in m.tags if attachment is None else attachment)


def clamp_limit(limit: int) -> int:
    if limit < 1:
        raise ToolError("limit must be at least 1")
    return min(limit, MAX_LIMIT)


def _parse_when(value: str, name: str, end: bool) -> int:
    """An ISO date or datetime as epoch seconds; a bare date means the start (or, for an upper
    bound, the last second) of that day in the machine's zone, as the query's on: does (see
    Mailbox.dsl_context), and a datetime without an offset is a time of that zone too."""
    if len(value) > MAX_DATE_CHARS:
        raise ToolError(f"{name} must be an ISO 8601 date or datetime, e.g. 2026-03-01")
    try:
        if (days := _iso_days(value)) is not None:
            return local_day(days[1], MACHINE_ZONE)[1] - 1 if end else \
                local_day(days[0], MACHINE_ZONE)[0]
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=MACHINE_ZONE)
    except (ValueError, OverflowError):  # overflow: a week that ends past the year 9999
        raise ToolError(f"{name} must be an ISO 8601 date or datetime, e.g. 2026-03-01 "
                        f"(got {value!r})") from None
    return int(moment.timestamp())


# ISO 8601's week without its day (2026-W44): seven days, not the Monday date() reads it as.
_ISO_WEEK = re.compile(r"\d{4}-?W\d\d")


def _iso_days(value: str) -> tuple[date, date] | None:
    """The first and last day a date alone names, in any ISO 8601 form (2026-11-01, 20261101,
    2026-W44-7; 2026-W44 is a week): read as a datetime, 20261101 was that day's first
    second, and until= left the day out."""
    try:
        first = date.fromisoformat(value)
    except ValueError:
        return None
    return first, first + timedelta(days=6 if _ISO_WEEK.fullmatch(value) else 0)


def scoped_query(mb: Mailbox, compiled: CompiledQuery, *, since: str | None = None,
                 until: str | None = None, account: str | None = None,
                 extra: str | None = None) -> str:
    parts = [compiled.query]
    if since or until:
        start = _parse_when(since, "since", end=False) if since else 0
        end = _parse_when(until, "until", end=True) + 1 if until else 2**63
        parts.append(date_range_query(start, end))
    if account:
        acct = mb.config.account(account)
        if acct.maildir != ".":
            own, inbox = f"path:{quote(acct.maildir + '/**')}", acct.outside_inbox()
            parts.append(own if inbox is None else f"({own} OR {folders_query([inbox])})")
    if extra:
        parts.append(extra)
    return all_of(*parts)


# Cursors carry the offset and a fingerprint of the request, so a cursor from one search cannot
# silently page through another.


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:8]


def make_cursor(offset: int, fingerprint: str, anchor: int | None = None,
                last: str | None = None) -> str:
    """``<offset>.<fingerprint of the search>``, the uid of the page's ``last`` message right
    after the fingerprint when given (of a thread: see :func:`thread_tail`), and
    ``.<anchor>`` for a search with relative dates (see CompiledQuery.anchor): short, since
    the model reads and repeats it."""
    return f"{offset}.{fingerprint}{last or ''}" + ("" if anchor is None else f".{anchor}")


def cursor_last(cursor: str | None, fingerprint: str) -> str | None:
    """The uid of the last message the cursor's page showed (of a thread: where it ranked,
    see :func:`thread_tail`), if it names one (read_cursor has checked the rest)."""
    tail = (cursor or "").partition(".")[2].split(".")[0].removeprefix(fingerprint)
    uid, ranked, rank = _split_last(tail)
    return tail if sidecar.looks_like_uid(uid) and (not ranked or _is_rank(rank)) else None


def _split_last(tail: str) -> tuple[str, str, str]:
    """A cursor's last item as its uid, and of a thread the mark and the date after it (see
    :func:`thread_tail`)."""
    at = max(tail.rfind(mark) for mark in (THREAD_RANKED_BY, THREAD_LISTED_BY,
                                           OLD_THREAD_RANKED_BY))
    return (tail, "", "") if at < 0 else (tail[:at], tail[at], tail[at + 1:])


# What stands between a cursor's uid and the date its item was listed by: the uid is a
# message's; of a thread, of the message it ranked by, of the message notmuch listed it by
# (pages in notmuch's order), or, in cursors from before that, the thread's id.
THREAD_RANKED_BY, THREAD_LISTED_BY, OLD_THREAD_RANKED_BY = "~", "_", "@"
# An anchor is epoch seconds: more digits than this are no cursor of ours.
MAX_ANCHOR_DIGITS = 11
# A thread's rank is the date of a message, which its sender wrote: notmuch's dates end with
# the year 9999 (12 digits), and a rank of more digits is no cursor of ours.
MAX_RANK_DIGITS = 12


def cursor_anchor(cursor: str | None) -> int | None:
    """The moment a cursor's search counted its relative dates back from, if it names one.
    Anything else is read_cursor's to judge: a forged anchor compiles to another query,
    whose fingerprint the cursor's does not match."""
    parts = (cursor or "").split(".")
    if len(parts) != 3 or not _ascii_digits(parts[2]) or len(parts[2]) > MAX_ANCHOR_DIGITS:
        return None
    return int(parts[2])


def _is_rank(text: str) -> bool:
    return _ascii_digits(text) and len(text) <= MAX_RANK_DIGITS


def _ascii_digits(text: str) -> bool:
    # str.isdigit() also takes "²", which int() refuses: a garbled cursor gave an internal error.
    return text.isascii() and text.isdigit()


def read_cursor(cursor: str | None, fingerprint: str, anchor: int | None = None) -> int:
    """The offset a cursor of this search (its fingerprint and anchor) stands at."""
    if not cursor:
        return 0
    if len(cursor) > MAX_CURSOR_CHARS:
        raise ToolError("bad cursor: pass next_cursor exactly as returned")
    text_offset, dot, rest = cursor.partition(".")
    if not (dot and _ascii_digits(text_offset.lstrip("-"))):
        raise ToolError("bad cursor: pass next_cursor exactly as returned")
    offset = int(text_offset)
    if offset < 0:
        raise ToolError("bad cursor: its offset is negative; pass next_cursor exactly as returned")
    if offset > MAX_CURSOR_OFFSET:
        raise ToolError("bad cursor: its offset is too large; pass next_cursor exactly as "
                        "returned")
    if f"{offset}.{rest}" != make_cursor(offset, fingerprint, anchor,
                                         cursor_last(cursor, fingerprint)):
        raise ToolError("bad cursor: it belongs to a different search; start again without a cursor")
    return offset


def next_cursor(offset: int, page: int, total: int, fingerprint: str,
                anchor: int | None = None, last: str | None = None) -> str | None:
    """The cursor of the page after ``page`` items from ``offset``; None at the end."""
    if offset + page >= total:
        return None
    return make_cursor(offset + page, fingerprint, anchor, last)


# ---------------------------------------------------------------------------------------------
# Tools


P = ParamSpec("P")
R = TypeVar("R")
Item = TypeVar("Item")


def one_mirror_state(tool: Callable[Concatenate[Mailbox, P], R]) -> Callable[Concatenate[Mailbox, P], R]:
    """A listing tool whose mirror reads (page, total, rows) all see one state of the mirror."""
    @functools.wraps(tool)
    def reading(mb: Mailbox, *args: P.args, **kwargs: P.kwargs) -> R:
        with mb.mirror.snapshot():
            return tool(mb, *args, **kwargs)
    return reading


@one_mirror_state
def search_emails(mb: Mailbox, query: str = "", limit: int = DEFAULT_LIMIT,
                  cursor: str | None = None, since: str | None = None,
                  until: str | None = None, sort: str = "newest",
                  account: str | None = None) -> dto.SearchResult:
    if sort not in SORTS:
        raise ToolError(f"sort must be one of {', '.join(SORTS)}")
    limit = clamp_limit(limit)
    compiled = mb.compile(query, cursor_anchor(cursor))
    nm_query = scoped_query(mb, compiled, since=since, until=until, account=account)
    fp = _fingerprint("search", nm_query, compiled.exclude_tags, sort)
    mirror = answerable(mb, nm_query, compiled.exclude_tags)
    kept = _kept_counts(mirror)
    # started by the first page read that needs it: a resumed page reads up to three, and
    # the total is the same for each
    total_of = functools.cache(lambda: _total_of(mb, nm_query, compiled.exclude_tags, kept))

    def fetch(offset: int, limit: int) -> tuple[list[str], int, Callable[[], int]]:
        return _search_page(mb, mirror, kept, total_of, nm_query, compiled.exclude_tags, sort,
                            offset, limit)

    start, last = read_cursor(cursor, fp, compiled.anchor), cursor_last(cursor, fp)
    last_uid = _split_last(last or "")[0]
    offset, (ids, total, excluded) = _resumed_page(
        mb.reader, fetch, start, limit, last, lambda found: sidecar.uid_for(found) == last_uid,
        lambda: _resumed_offset(mb, _as_mirrored(mirror, nm_query), compiled.exclude_tags,
                                sort, start, last,
                                _in_mirror_order(mb, mirror, nm_query, compiled.exclude_tags)))
    changed = mb.reader.changed_at()
    dated = dated_listing(mb, ids)
    cursor_out = (next_cursor(offset, len(ids), total, fp, compiled.anchor,
                              message_tail(ids[-1], dated)) if ids else None)
    results = [ref for ref, _ in dated]
    return dto.SearchResult(results=results, total=total,
                            next_cursor=cursor_out, query=echoed_query(nm_query),
                            hidden=_hidden(compiled, cursor_out, excluded),
                            indexed_at=iso_from_epoch(int(changed)) if changed else None,
                            list_names=page_list_names(mb, (e.tags for e in results)))


def page_list_names(mb: Mailbox, page_tags: Iterable[Iterable[str]]) -> dict[str, str]:
    """The shorter name of each list a page's lines show (dsl.list_names): the whole
    List-Id took ~30 bytes on every line of list mail."""
    prefix = LIST + "/"

    def list_ids(tags: Iterable[str]) -> list[str]:
        return [t.removeprefix(prefix) for t in tags if t.startswith(prefix)]

    shown = {i for tags in page_tags for i in list_ids(tags)}
    return list_names(shown, list_ids(mb.reader.all_tags())) if shown else {}


def _search_page(mb: Mailbox, mirror: Answerable | None, kept: tuple[int, int] | None,
                 counting: Callable[[], Callable[[], int]], nm_query: str,
                 exclude_tags: Sequence[str], sort: str, offset: int, limit: int
                 ) -> tuple[list[str], int, Callable[[], int]]:
    """Ids, total and (a function counting) the excluded matches of one page, from the
    mirror where it can answer, else from notmuch (``counting`` starts the count of the
    total, see _total_of, where it has not started yet; ``kept``: see _kept_counts)."""
    answer = _page_from_mirror(mirror, sort, offset, limit)
    if answer is not None:
        return answer
    total_of = counting()
    tagged = _tagged_page_from_mirror(mirror, sort, offset, limit)
    if tagged is not None:
        ids = tagged
    elif (order := _tie_order(mb, mirror, nm_query, exclude_tags)) is not None:
        ids = _page_in_mirror_order(mb, order, nm_query, exclude_tags, sort, offset, limit)
    else:
        ids = _page_ids(mb, nm_query, exclude_tags, sort, offset, limit)
    total = total_of()
    return ids, total, _excluded_of(mb, nm_query, kept, total)


def message_tail(message_id: str, dated: Sequence[tuple[dto.EmailRef, int]]) -> str:
    """The last item a message cursor names: the uid of ``message_id``, the page's last, and
    the date it ranked by on the page (as :func:`thread_tail`), which ``dated`` (the page's
    rows, see :func:`dated_listing`) ends with unless it was removed since.  Its date now
    may differ -- a draft saved again is dated anew -- and a page resumed at that date
    skipped (or repeated) what lay between the two."""
    uid = sidecar.uid_for(message_id)
    date = dated[-1][1] if dated and dated[-1][0].id in (uid, message_id) else None
    if date is None or not _is_rank(str(date)):
        return uid
    return f"{uid}{THREAD_RANKED_BY}{date}"


Page = TypeVar("Page", bound=tuple[Any, ...])


def _resumed_page(reader: Reader, fetch: Callable[[int, int], Page], start: int, limit: int,
                  last: str | None, is_last: Callable[[Any], bool],
                  resumed: Callable[[], tuple[int, int]]) -> tuple[int, Page]:
    """The page a cursor asks for, and its offset.  A page whose cursor names its last item
    is read from one item earlier: that item still there, nothing before it left and the
    offset stands (the usual case, at the cost of one more row); else the offset is worked
    out again (``resumed``: a few counts, and the start of the last item's second with how
    many items share it) -- triage between pages took items out, or new mail came above.
    Its counts and the pages read from them see one snapshot of notmuch (``reader``): mail
    indexed in between moved the items against the places counted, and the page went back
    to items shown before, or past some never shown."""
    if last is None or start == 0:
        return start, fetch(start, limit)
    page = fetch(start - 1, limit + 1)
    items = page[0]
    if items and is_last(items[0]):
        return start, cast(Page, (items[1:], *page[1:]))
    return reader.in_one_snapshot(lambda: _relocated_page(fetch, start, limit, is_last, resumed))


def _relocated_page(fetch: Callable[[int, int], Page], start: int, limit: int,
                    is_last: Callable[[Any], bool],
                    resumed: Callable[[], tuple[int, int]]) -> tuple[int, Page]:
    """:func:`_resumed_page` where the last item did not stand where the cursor says."""
    offset, second = resumed()
    if second > 1:  # where the last item stands in its second, now
        begin, size = _second_scan(offset, second, start - 1)
        within = fetch(begin, size)[0]
        found = next((begin + at + 1 for at, item in enumerate(within) if is_last(item)), None)
        offset = offset if found is None else found
    return offset, fetch(offset, limit)


def _as_mirrored(mirror: Answerable | None, nm_query: str) -> str:
    """The query a resumed page counts its place with, where the mirror may answer its pages:
    the messages as the mirror's state of this call holds them (unchanged since its last
    sync).  notmuch's snapshot, opened later, may hold mail indexed since above the last
    item, which the mirror's pages lack: counted, the page started past messages never
    shown.  Left out, a message changed since only counts fewer: at worst a repeat."""
    if mirror is None:
        return nm_query
    return all_of(nm_query, f"lastmod:0..{sidecar.mirror_state(mirror.conn).revision}")


def _second_scan(begin: int, size: int, shown_at: int) -> tuple[int, int]:
    """Where a resumed page looks for the last item shown (then at ``shown_at``) among the
    ``size`` items of its second from ``begin``: all of them, or MAX_SECOND_SCAN of them
    around ``shown_at``.  Between pages the item moves by as many items as came or left
    before it -- a few, after new mail or triage of a page -- however many share its
    second: a scan from the second's start would miss it, and the page went back there
    (listing that second again, for ever if mail came before each page)."""
    if size <= MAX_SECOND_SCAN:
        return begin, size
    around = min(max(begin, shown_at - MAX_SECOND_SCAN // 2), begin + size - MAX_SECOND_SCAN)
    return around, MAX_SECOND_SCAN


def _resumed_offset(mb: Mailbox, nm_query: str, exclude_tags: Sequence[str], sort: str,
                    offset: int, last: str | None, ranked: bool) -> tuple[int, int]:
    """Where the page after the message ``last`` starts now.  Triage changes the search
    between pages (mail marked read or archived leaves ``is:unread`` or ``in:inbox``): the
    cursor's bare offset would then skip as many messages as left.  So the page resumes
    after the matches dated before ``last``'s second (after, oldest first) and, for pages in
    the mirror's order (``ranked``), those of its second up to its Message-ID, whether or
    not ``last`` is still there; for others, at that second, with how many share it (see
    :func:`_resumed`), or, where it left that second, after those notmuch lists before it
    (see :func:`_place_in_second`).  Its second is the one the cursor names (cursors of old:
    its date now).  The bare offset when ``last`` is unknown.  Undated mail is at 0, as
    notmuch files it, a second like any other: at the bare offset, a page after one that
    ended in it skipped as many as had left above."""
    uid, _, rank = _split_last(last or "")
    found = _found_last(mb, uid, int(rank) if rank else None) if last else None
    if found is None:
        return offset, 0
    day = int(rank) if rank else found.date
    ahead = (date_range_query(day + 1, 2**63) if sort == "newest"
             else date_range_query(0, day))
    count = functools.partial(mb.reader.count, exclude_tags=exclude_tags)
    that_second = all_of(nm_query, date_range_query(day, day + 1))
    if ranked:
        return count(all_of(nm_query, ahead)) + mb.reader.count_ranked_through(
            that_second, found.message_id, exclude_tags=exclude_tags,
            ascending=sort == "oldest"), 0
    before = count(all_of(nm_query, ahead))
    if count(all_of(that_second, id_query([found.message_id]))) > 0:
        return _resumed(True, before, lambda: count(that_second))
    return _place_in_second(mb, that_second, found.message_id, exclude_tags, before,
                            offset - 1), 0


def _place_in_second(mb: Mailbox, that_second: str, message_id: str,
                     exclude_tags: Sequence[str], before: int, shown_at: int) -> int:
    """Where the page after a last item that left its second (``that_second``'s matches)
    starts: after the matches notmuch lists before where it stood.  notmuch orders one
    second's messages as it indexed them (by document id, newest or oldest first alike),
    an order no query names but the unsorted one, in which the item keeps its place among
    them when it leaves (a tag, a folder or its date changed): read in that order with it, a
    bounded part of the second around where it stood (see _second_scan) says how many come
    before it.  Not found there, the second is listed again: a repeat, never a skip."""
    with_it = f"({that_second}) OR {id_query([message_id])}"
    begin, size = _second_scan(before, mb.reader.count(with_it, exclude_tags=exclude_tags),
                               shown_at)
    ids = mb.reader.page_ids(with_it, exclude_tags=exclude_tags, sort="none",
                             offset=begin - before, limit=size)
    return begin + ids.index(message_id) if message_id in ids else before


def _found_last(mb: Mailbox, uid: str, date: int | None) -> IndexedMessage | None:
    """The message a cursor's uid names: as the mirror resolves it, or, where the mirror
    lags and lacks it, among the messages of the second the cursor names (``date``) that
    notmuch changed since the mirror's last sync -- listed from notmuch, it was shown by
    uid all the same.  None where neither has it."""
    found = mb.find(uid)
    if found is not None or date is None:
        return found
    lag = mb.mirror_lag()
    if lag is not None and lag[1] is None:  # the mirror holds every message: it is gone
        return None
    changed = "" if lag is None else f"lastmod:{lag[1]}.."
    ids = mb.reader.page_ids(all_of(date_range_query(date, date + 1), changed),
                             exclude_tags=(), sort="none", limit=MAX_SECOND_SCAN)
    return next((mb.reader.find(m) for m in ids if sidecar.uid_for(m) == uid), None)


# The most items of one second a resumed page reads to find the last item shown among them
# (around where it stood: see _second_scan); not found there, the page reads that second
# again from its start.
MAX_SECOND_SCAN = 1000


def _resumed(still_listed: bool, before: int, same_second: Callable[[], int]
             ) -> tuple[int, int]:
    """Where the page after the last item shown starts, from whether it is still listed, how
    many items now sort before its second (``before``), and (counted only for a last item
    still listed) how many share that second: at that second, with the count of its items
    to look for the last one among (the offset could not say: items above may have left or
    come), or after a lone last item.  Where the last item is gone, that second's items are
    listed again: a repeat, never a skip."""
    if not still_listed:
        return before, 0
    second = same_second()
    return (before + 1, 0) if second == 1 else (before, second)


@dataclass(frozen=True)
class Answerable:
    """A search the mirror can answer (see current_mirror): its tags and dates, read once
    from the notmuch query, its tag groups (a pattern's tags looked up once: notmuch lists
    every tag for it), and the mirror's connection."""

    conn: sqlite3.Connection
    wanted: Conjunction
    groups: list[tuple[str, ...]]


def answerable(mb: Mailbox, nm_query: str, exclude_tags: Sequence[str]) -> Answerable | None:
    """The search as the mirror can answer it, or None: it asks for more than tags and
    dates, or the mirror lags (notmuch answers then)."""
    wanted = conjunction(nm_query)
    conn = current_mirror(mb, exclude_tags) if wanted is not None else None
    if conn is None or wanted is None:
        return None
    return Answerable(conn, wanted,
                      wanted.tag_groups(mb.reader.all_tags() if wanted.patterns else ()))


def _page_from_mirror(mirror: Answerable | None, sort: str, offset: int, limit: int
                      ) -> tuple[list[str], int, Callable[[], int]] | None:
    """Page, total and (a function counting) the excluded matches of all mail, or of a date
    range, by date, from the mirror's index of the mail a search shows: notmuch would sort
    (or, for a range, read the date of) every message in the database for them.  None for
    any other search."""
    if mirror is None or mirror.wanted.tags or mirror.wanted.patterns:
        return None
    conn, span = mirror.conn, _span(mirror.wanted)
    ids = sidecar.shown_page(conn, span=span, oldest_first=sort == "oldest", offset=offset,
                             limit=limit)
    return ids, sidecar.shown_count(conn, span), lambda: sidecar.excluded_count(conn, span)


def _span(wanted: Conjunction) -> sidecar.Span:
    return sidecar.Span(wanted.since, wanted.until)


# The most shown messages a page of a tag search reads along the mirror's date index before
# it leaves the page to notmuch: a rarer tag is quicker for notmuch to sort.  Reading them
# costs ~2-3 us a row (5,000: 9 ms for one tag, 13 for two, at 100k messages on a loaded
# machine, where notmuch's count and page of `tag:inbox` took 11 ms, of 5,800 matches 6-10).
MAX_TAG_SCAN = 5000
# ... and this many more than the tag's share says (a share is an average; the newest mail
# may hold less of the tag).
MIN_TAG_SCAN = 100
# A window (of a tag search, or of threads) that holds too few for the page is read once
# more, this many times larger and at most MAX_TAG_SCAN, before the page is left to notmuch:
# a burst of list mail, which skips the inbox, leaves the newest mail with little of
# "in:inbox", and a second read (~4 ms at 100k messages) is still far quicker.
WIDER_SCAN = 4


def _widening(read: Callable[[int], R | None], scan: int) -> R | None:
    """What ``read`` finds in a window of ``scan`` shown messages, or else in one
    WIDER_SCAN times larger (up to MAX_TAG_SCAN): None when neither holds it."""
    found = read(scan)
    if found is None and scan < MAX_TAG_SCAN:
        found = read(min(scan * WIDER_SCAN, MAX_TAG_SCAN))
    return found


def _tagged_page_from_mirror(mirror: Answerable | None, sort: str, offset: int,
                             limit: int) -> list[str] | None:
    """A page of a search for tags (and dates) read along the mirror's date index: enough of
    the shown messages, newest (or oldest) first, for the page at the tags' share of the
    mailbox, twice over and some, their tags checked in the mirror (notmuch would sort every
    match).  None for a search without tags, or with tags too rare for a short read."""
    if mirror is None or not mirror.groups:
        return None
    groups = mirror.groups
    carrying = min(sidecar.tagged_count(mirror.conn, group) for group in groups)
    if carrying == 0:
        return []
    scan = 2 * (offset + limit) * sidecar.shown_count(mirror.conn) // carrying + MIN_TAG_SCAN
    if scan > MAX_TAG_SCAN:
        return None
    return _widening(lambda scan: sidecar.tagged_page(
        mirror.conn, groups, span=_span(mirror.wanted), oldest_first=sort == "oldest",
        offset=offset, limit=limit, scan=scan), scan)


# How many messages (threads) each side of a page notmuch's page of a search the mirror may
# page is read with at first, so that those of the dates at the page's edges are there whole
# (the margin grows until they are, up to the largest: see _in_tie_order).  Grown until the
# dates were whole, a second of thousands (an import; undated mail, at 0) was read whole
# for each page of it: 0.2 s a page at 5,000, 2 s at 20,000, 12-18 s a page of threads.
# Past the largest margin a page reads only the messages (threads) of its edges' dates that
# stand on it (see _whole_edges).  A page of threads that kept notmuch's order there instead
# (past a margin of 640: 0.5 s a page at 2,000) repeated and skipped hundreds of threads in a
# walk whose other pages the mirror read.
TIE_MARGIN, MAX_TIE_MARGIN = 10, 40


def _in_mirror_order(mb: Mailbox, mirror: Answerable | None, nm_query: str,
                     exclude_tags: Sequence[str]) -> bool:
    """Whether a search's pages are in the mirror's order -- its own, or notmuch's put in
    it (see _tie_order) -- by date and Message-ID."""
    return mirror is not None or _tie_order(mb, None, nm_query, exclude_tags) is not None


def _tie_order(mb: Mailbox, mirror: Answerable | None, nm_query: str,
               exclude_tags: Sequence[str]) -> sqlite3.Connection | None:
    """The mirror whose order of one second's messages notmuch's page of a search the mirror
    answers (when it is current) follows: its other pages may be the mirror's.  A mirror that
    lags orders them too -- a page read while it lags follows one read before, or after."""
    if mirror is not None:
        return mirror.conn if mirror.groups else None
    if conjunction(nm_query) is None:
        return None
    return current_mirror(mb, exclude_tags, lagging=True)


def _page_in_mirror_order(mb: Mailbox, conn: sqlite3.Connection, nm_query: str,
                          exclude_tags: Sequence[str], sort: str, offset: int,
                          limit: int) -> list[str]:
    """notmuch's page of a search whose other pages the mirror may read: messages of one
    date in the mirror's order (by Message-ID) rather than notmuch's (by when it indexed
    them), so that no page repeats or skips one of them where the two meet.  Its reads of
    notmuch (the page, then the counts and ids of its edges' dates) see one snapshot: mail
    indexed between them moved an edge's messages against the page's places."""
    newest = sort == "newest"

    def read(offset: int, limit: int) -> list[str]:
        return _page_ids(mb, nm_query, exclude_tags, sort, offset, limit)

    def ranks(ids: Sequence[str]) -> Callable[[str], tuple[int, str]]:
        dates = sidecar.dates_of(conn, ids)
        # a message the mirror does not have yet (a sync in flight) ranks by notmuch's date,
        # the one the mirror will keep: left in notmuch's order, it broke the order the
        # pages before it followed
        missing = [mid for mid in ids if mid not in dates]
        for mid, found in zip(missing, mb.reader.find_many(missing)):
            dates[mid] = found.date if found is not None else 0
        return lambda mid: (dates[mid], mid)

    def of_date(date: int, at: int, size: int) -> list[str]:
        """The ``size`` messages of one date at ``at`` of the whole search, in the mirror's
        order: counted past the newer (older) dates, read from notmuch sorted by Message-ID
        (ascending only: newest first counts from the date's end)."""
        count = functools.partial(mb.reader.count, exclude_tags=exclude_tags)
        ahead = date_range_query(date + 1, 2**63) if newest else date_range_query(0, date)
        that_date = all_of(nm_query, date_range_query(date, date + 1))
        at -= count(all_of(nm_query, ahead))
        if newest:
            at = count(that_date) - at - size
        ids = mb.reader.page_ids(that_date, exclude_tags=exclude_tags, sort="message_id",
                                 offset=max(at, 0), limit=size + min(at, 0))
        return ids[::-1] if newest else ids
    return mb.reader.in_one_snapshot(lambda: _in_tie_order(read, ranks, offset, limit,
                                                           newest=newest, of_date=of_date))


def _in_tie_order(read: Callable[[int, int], list[Item]],
                  ranks: Callable[[Sequence[Item]], Callable[[Item], tuple[int, str]]],
                  offset: int, limit: int, *, newest: bool,
                  of_date: Callable[[int, int, int], list[Item]]) -> list[Item]:
    """notmuch's page (``read`` from an offset, so many) ordered by the (date, Message-ID)
    ``ranks`` gives its items, as the mirror orders its pages.  The page is read with a
    margin each side, ordered, and cut where the dates at its edges lie whole inside what
    was read.  The margin grows until they do, up to the largest; past it the items of the
    dates at the page's edges are those ``of_date`` gives (see _whole_edges)."""
    margin = TIE_MARGIN
    while True:
        start = max(0, offset - margin)
        wanted = offset - start + limit + margin
        items = read(start, wanted)
        rank = ranks(items)
        ordered = sorted(items, key=rank, reverse=newest)
        page = ordered[offset - start:offset - start + limit]
        whole_before = start == 0 or not page or rank(ordered[0])[0] != rank(page[0])[0]
        whole_after = (len(items) < wanted or not page
                       or rank(ordered[-1])[0] != rank(page[-1])[0])
        if whole_before and whole_after:
            return page
        margin *= 4
        if margin > MAX_TIE_MARGIN:
            break
    page = items[offset - start:offset - start + limit]  # notmuch's page, as read last
    return _whole_edges(page, rank, offset, of_date, newest=newest)


def _whole_edges(page: list[Item], rank: Callable[[Item], tuple[int, str]], offset: int,
                 of_date: Callable[[int, int, int], list[Item]], *, newest: bool) -> list[Item]:
    """notmuch's page at ``offset`` in the mirror's order, where the dates at its edges
    reach past what a margin read: notmuch sorts by date too, so each place of the page
    holds a message of the date it holds in the mirror's order, and only which messages of
    the edges' dates stand there differs -- ``of_date(date, at, size)`` reads those alone,
    however many share the date (a date inside the page is there whole)."""
    first, last = rank(page[0])[0], rank(page[-1])[0]
    if first == last:
        return of_date(first, offset, len(page))
    heads = sum(rank(item)[0] == first for item in page)
    tails = sum(rank(item)[0] == last for item in page)
    inside = sorted(page[heads:len(page) - tails], key=rank, reverse=newest)
    return [*of_date(first, offset, heads), *inside,
            *of_date(last, offset + len(page) - tails, tails)]


def _kept_counts(mirror: Answerable | None) -> tuple[int, int] | None:
    """For a search for one tag or two alone (a ``list:`` pattern naming one tag is that
    tag): how many messages with them a search shows, and how many more it leaves out, as
    the mirror's triggers keep them (notmuch would count every match).  None for any other
    search."""
    if mirror is None:
        return None
    groups = mirror.groups
    if mirror.wanted.since is not None or mirror.wanted.until is not None or not groups:
        return None
    if not all(groups):
        return 0, 0  # a pattern that names no tag: nothing matches
    if any(len(group) > 1 for group in groups):
        return None
    kept = sidecar.kept_tag_counts(mirror.conn, [group[0] for group in groups])
    return None if kept is None else (kept[1], kept[0] - kept[1])


def _excluded_of(mb: Mailbox, nm_query: str, kept: tuple[int, int] | None,
                 shown: int) -> Callable[[], int]:
    """(A function counting) the matches a search leaves out as spam or deleted, of its
    ``shown`` ones: kept by the mirror, or every match counted by notmuch less those."""
    if kept is not None:
        return lambda: kept[1]
    return lambda: mb.reader.count(nm_query, exclude_tags=()) - shown


def _total_of(mb: Mailbox, nm_query: str, exclude_tags: Sequence[str],
              kept: tuple[int, int] | None) -> Callable[[], int]:
    """The matches a search shows: kept by the mirror, or counted by notmuch on a second
    thread from now on (the caller reads its page meanwhile)."""
    if kept is not None:
        return lambda: kept[0]
    return mb.reader.count_soon(nm_query, exclude_tags=exclude_tags).result


def current_mirror(mb: Mailbox, exclude_tags: Sequence[str], *,
                   lagging: bool = False) -> sqlite3.Connection | None:
    """The mirror, when it holds every change notmuch has (or, ``lagging``, may not) and its
    ``is_excluded`` column stands for exactly these exclusions: then its pages are notmuch's
    (messages of one date in the order of their Message-IDs, which a tag search's pages from
    notmuch follow too: see _page_in_mirror_order)."""
    mirror = mb.mirror_lag()
    if mirror is None or (mirror[1] is not None and not lagging):
        return None
    conn = mirror[0]
    if not exclude_tags or sidecar.recorded_exclusions(conn) != frozenset(exclude_tags):
        return None
    return conn


# How many of the mailbox's newest messages a search first looks among, for each result it
# must skip or show: 20 finds a page in that window for any query that matches at
# least one message in 20.
WINDOW_PER_RESULT = 20
# ... and for a sender, how many of the sender's newest messages (as the mirror has senders,
# which only estimates notmuch's from: matches -- twice the page leaves room).
SENDER_WINDOW_PER_RESULT = 2


def _page_ids(mb: Mailbox, nm_query: str, exclude_tags: Sequence[str], sort: str,
              offset: int, limit: int) -> list[str]:
    """One sorted page of a search, newest first looked for among the newest mail only:
    notmuch sorts every match to return a page, so a broad search pays for all its matches,
    while the same query narrowed to a recent date window matches a few.  A window from
    date D on holds every match from D on, and every match outside it is older than D: when
    it fills the page, that page is the whole search's (ties keep their order, as both sort
    the same way).  Otherwise, for a query with a date range of its own (the window would
    likely miss it) and for oldest first (notmuch's ranges cannot reach dates before 1970,
    which sort first), the whole search runs.  The mirror's date index only chooses D: a
    stale mirror makes the window less apt, never the page wrong."""
    window = (_recent_window(mb, nm_query, (offset + limit) * WINDOW_PER_RESULT, offset + limit)
              if sort == "newest" else None)
    if window is not None:
        ids = mb.reader.page_ids(all_of(nm_query, window), exclude_tags=exclude_tags,
                                 sort=sort, offset=offset, limit=limit)
        if len(ids) == limit:
            return ids
    return mb.reader.page_ids(nm_query, exclude_tags=exclude_tags, sort=sort, offset=offset,
                              limit=limit)


def _recent_window(mb: Mailbox, nm_query: str, size: int, need: int) -> str | None:
    """``date:`` from the day of the mailbox's ``size``-th newest shown message -- for a
    sender (and tags), from the sender's own SENDER_WINDOW_PER_RESULT * ``need``-th newest,
    since notmuch matches ``from:`` in every message of the sender before it can sort them,
    and a window narrows only the sort.  None where there is no such window to try: no
    mirror, a smaller mailbox (or sender), or a query with dates of its own."""
    if "date:" in nm_query:
        return None
    conn = mb.mirror.connection()
    if conn is None:
        return None
    from_one = sender_conjunction(nm_query)
    if from_one is not None and not from_one[1].patterns:
        address, rest = from_one
        edge = sidecar.sender_date_at_rank(conn, address, rest.tag_groups(()),
                                           SENDER_WINDOW_PER_RESULT * need)
    else:
        edge = sidecar.day_at_rank(conn, size)
    if edge is None or edge <= 0:
        return None
    return f"date:@{edge}.."


def echoed_query(nm_query: str) -> str:
    return dto.cut(nm_query, MAX_ECHOED_QUERY)


def _hidden(compiled: CompiledQuery, cursor: str | None, excluded: Callable[[], int]) -> int:
    """On the last page: how many more messages match among the excluded (spam, deleted)
    ones, so "0 results" never hides that a blocked sender's mail is there.  One count,
    only when there are exclusions and no further page."""
    if cursor is not None or not compiled.exclude_tags:
        return 0
    return max(excluded(), 0)


# Counting threads reads the thread of every matching message (65 ms for 5,000 at 20k
# messages, linear in the matches): beyond this many matching messages a thread listing
# gives the message count alone.
THREAD_COUNT_MAX_MESSAGES = 1000


@one_mirror_state
def list_threads(mb: Mailbox, query: str = "in:inbox", since: str | None = None,
                 until: str | None = None, unread_only: bool = False,
                 limit: int = DEFAULT_LIMIT, cursor: str | None = None) -> dto.ThreadList:
    limit = clamp_limit(limit)
    compiled = mb.compile(query, cursor_anchor(cursor))
    nm_query = scoped_query(mb, compiled, since=since, until=until,
                            extra="tag:unread" if unread_only else None)
    fp = _fingerprint("threads", nm_query, compiled.exclude_tags)
    mirror = answerable(mb, nm_query, compiled.exclude_tags)
    kept = _kept_counts(mirror)
    total_of = _total_of(mb, nm_query, compiled.exclude_tags, kept)
    # asked once for the up to three page reads and the cursor, which names the last
    # thread as the page's order places it
    in_mirror_order = functools.cache(
        lambda: _in_mirror_order(mb, mirror, nm_query, compiled.exclude_tags))

    def fetch(offset: int, limit: int) -> tuple[list[ThreadSummary], bool]:
        return _thread_page(mb, nm_query, compiled.exclude_tags, mirror, offset, limit,
                            in_mirror_order)

    start, last = read_cursor(cursor, fp, compiled.anchor), cursor_last(cursor, fp)
    offset, (page, more) = _resumed_page(
        mb.reader, fetch, start, limit, last, lambda found: is_thread_last(found, last),
        lambda: _resumed_thread_offset(
            mb, _as_mirrored(mirror, nm_query), compiled.exclude_tags, start, last,
            in_mirror_order()))
    matched = total_of()
    total = (mb.reader.count_threads(nm_query, exclude_tags=compiled.exclude_tags)
             if matched <= THREAD_COUNT_MAX_MESSAGES else None)
    unread, attached = thread_figures(mb, [t.thread_id for t in page], compiled.exclude_tags)
    refs = []
    for t in page:
        refs.append(dto.ThreadRef(
            thread=t.thread_id, subject=dto.cut(t.subject, dto.MAX_LISTED_SUBJECT),
            authors=dto.capped([dto.cut(a, dto.MAX_NAME_CHARS) for a in t.authors],
                               dto.MAX_AUTHORS, "get_thread"),
            oldest=iso_from_epoch(t.oldest) or "", newest=iso_from_epoch(t.newest) or "",
            messages=t.message_count, matched=t.matched_count, unread=unread.get(t.thread_id, 0),
            tags=dto.shown_tags(t.tags),
            attachment=t.thread_id in attached or ATTACHMENT in t.tags))
    cursor_out = (make_cursor(offset + len(page), fp, compiled.anchor,
                              thread_tail(page[-1], not in_mirror_order()))
                  if more and page else None)
    return dto.ThreadList(threads=refs, total=total, matched_messages=matched,
                          next_cursor=cursor_out,
                          list_names=page_list_names(mb, (t.tags for t in refs)),
                          hidden=_hidden(compiled, cursor_out,
                                         _excluded_of(mb, nm_query, kept, matched)))


def thread_tail(thread: ThreadSummary, listed: bool = False) -> str:
    """The last item a thread cursor names: where the thread ranks, by the uid of the
    message it ranks by (its rank_id; of a page in notmuch's order, ``listed``, the message
    notmuch lists it by, its listed_by) and that message's date, where a cursor can carry
    that date (else the thread's id).  Cursors of old name the thread's id and that date
    (see :func:`thread_last`), or in notmuch's order the message it ranked by."""
    rank = str(thread.newest)
    if not _is_rank(rank):
        return thread.thread_id
    if listed and thread.listed_by:
        return f"{sidecar.uid_for(thread.listed_by)}{THREAD_LISTED_BY}{rank}"
    return f"{sidecar.uid_for(thread.rank_id)}{THREAD_RANKED_BY}{rank}"


def is_thread_last(thread: ThreadSummary, last: str | None) -> bool:
    """Whether ``thread`` is the last item a cursor names: where it ranks (see
    :func:`thread_tail`), or in cursors of old, its id."""
    head, ranked, _ = _split_last(last or "")
    if ranked == OLD_THREAD_RANKED_BY or not ranked:
        return thread.thread_id == head
    return thread_tail(thread, ranked == THREAD_LISTED_BY) == last


def thread_last(mb: Mailbox, last: str | None
                ) -> tuple[str | None, IndexedMessage | None, int | None]:
    """The thread a cursor's page ended with, the message it ranked by or notmuch listed it
    by (if the index still has it, and the cursor names it), and the date it ranked by then
    (its newest match), as far as the cursor names them."""
    if last is None:
        return None, None, None
    head, ranked, rank = _split_last(last)
    date = int(rank) if rank else None
    if ranked not in (THREAD_RANKED_BY, THREAD_LISTED_BY):
        return head, None, date
    found = _found_last(mb, head, date)
    return (None if found is None else found.thread_id), found, date


def _resumed_thread_offset(mb: Mailbox, nm_query: str, exclude_tags: Sequence[str],
                           offset: int, last: str | None, ranked: bool) -> tuple[int, int]:
    """:func:`_resumed_offset` for threads, which rank by their newest match: the page
    resumes at the date the last thread shown ranked by then (``rank``), not by now.  A
    thread whose newest match left the search ranks lower now, below threads not shown yet:
    its rank now would skip them.  Pages in the mirror's order (``ranked``) resume after
    the threads ranked before it or at it now: at that date, by a Message-ID up to that of
    the message it ranked by, whether or not the thread still ranks there (a reply moved
    it, or its newest match left).  Pages in notmuch's order resume after the threads it
    lists before where the thread stood (see :func:`_place_thread_in_second`), whether it
    still ranks there or not: one of its matches of that second leaving moves it within the
    second, past threads not shown yet.  Others (cursors of old in the mirror's order, or a
    thread not found so) resume at that thread where it still ranks at that date; where it
    does not, at that second's first thread again."""
    thread, ranked_by, rank = thread_last(mb, last)
    if last is None or rank is None:
        return offset, 0
    count = functools.partial(mb.reader.count_threads, exclude_tags=exclude_tags)
    newer = all_of(nm_query, date_range_query(rank + 1, 2**63))
    that_second = all_of(nm_query, date_range_query(rank, rank + 1))
    listed = _split_last(last)[1] == THREAD_LISTED_BY
    # (a cursor naming the message notmuch listed it by, from a page in notmuch's order,
    # counted through in the mirror's would skip the threads ranked between it and the
    # thread's rank_id: the thread is looked for instead, a repeat at worst)
    if ranked and ranked_by is not None and not listed:
        return count(newer) + mb.reader.count_ranked_through(
            that_second, ranked_by.message_id, exclude_tags=exclude_tags, newer=newer), 0
    before = count(newer)
    # in the mirror's order, only the message it ranked by names where it stood (a cursor of
    # old names none); in notmuch's order, the message it listed it by, where the cursor
    # names it (one of old names the message it ranked by: placed by its own messages)
    listed_by = ranked_by.message_id if ranked_by is not None and listed else None
    at = (None if thread is None or ranked else
          _place_thread_in_second(mb, that_second, newer, thread, rank, exclude_tags,
                                  listed_by))
    if at is not None:
        return before + at, 0
    # gone, that second is listed again; still there (past the messages placed from), it
    # is looked for around where it stood
    matched = (mb.reader.messages(all_of(nm_query, f"thread:{quote(thread)}"),
                                  exclude_tags=exclude_tags, limit=1) if thread else [])
    return _resumed(bool(matched) and matched[0].date == rank, before,
                    lambda: count(that_second))


def _place_thread_in_second(mb: Mailbox, that_second: str, newer: str, thread: str, rank: int,
                            exclude_tags: Sequence[str], listed_by: str | None) -> int | None:
    """:func:`_place_in_second` for a thread in notmuch's order that ranked at one second
    (``rank``; ``that_second``'s matches, ``newer`` those after it): how many threads of
    that second the page resumes after -- those notmuch lists before where it stood, found
    among the second's messages with the thread's own of that second (those that matched
    then are among them: placed by one that did not, it stands earlier, a repeat, never a
    skip), at most MAX_SECOND_SCAN from the second's start (its messages are no count of
    its threads: no part around where it stood can be counted to), and the thread itself
    where it is still listed there.  None where it is not among them.  A cursor naming the
    message notmuch listed it by (``listed_by``) places it at that message, counting the
    thread itself where a match of it comes before now: its first message of the second had
    left the search before the page that showed it, which listed it by a later one, past
    the threads between them."""
    with_it = (f"({that_second}) OR "
               f"({all_of(f'thread:{quote(thread)}', date_range_query(rank, rank + 1))})"
               if listed_by is None else f"({that_second}) OR {id_query([listed_by])}")
    placed = mb.reader.threads_listed_before(with_it, thread, newer, exclude_tags=exclude_tags,
                                             most=MAX_SECOND_SCAN, listed_by=listed_by)
    if placed is None:
        return None
    at, first = placed
    if listed_by not in (None, first):  # a match of it before that message: counted
        return at
    # still listed where it stood: its first message there still matches and it has no newer
    # match (that would sort first, newest first).  Else it moved down within the second (a
    # repeat of it at worst) or left it (listed above, or gone)
    still = mb.reader.messages(f"({all_of(that_second, id_query([first]))}) OR "
                               f"({all_of(newer, f'thread:{quote(thread)}')})",
                               exclude_tags=exclude_tags, limit=1)
    return at + (bool(still) and still[0].message_id == first)


def _thread_page(mb: Mailbox, nm_query: str, exclude_tags: Sequence[str],
                 mirror: Answerable | None, offset: int, limit: int,
                 in_mirror_order: Callable[[], bool] | None = None
                 ) -> tuple[list[ThreadSummary], bool]:
    """A page of threads, newest first, and whether more follow (one thread past the page
    says so).  notmuch collects and sorts every matching message before its first thread,
    then reads every message of each thread it returns, so for tags and dates alone the
    mirror picks the page's threads along its date index and summarizes them from its rows:
    the threads a search shows rank by their newest shown message, and the mirror reads the
    shown messages newest first."""
    if mirror is not None:
        want = offset + limit + 1
        span = _span(mirror.wanted)
        found = _widening(lambda scan: sidecar.newest_threads(
            mirror.conn, mirror.groups, span=span, want=want, scan=scan),
            want * WINDOW_PER_RESULT)
        if found is not None:
            chosen = found[offset:offset + limit]
            members = sidecar.thread_members(mirror.conn, chosen, mirror.groups, span=span)
            # (a thread a sync removed since the first read is left out)
            return [summarize(t, members[t]) for t in chosen if t in members], len(found) == want
    def read(offset: int, limit: int) -> list[ThreadSummary]:
        return mb.reader.threads(nm_query, exclude_tags=exclude_tags, offset=offset, limit=limit)

    def of_date(date: int, at: int, size: int) -> list[ThreadSummary]:
        """The ``size`` threads ranked at one date from ``at`` of the whole listing, in the
        mirror's order: counted past the threads ranked newer, then read from that date's
        messages (see Reader.threads_ranked_at)."""
        newer = all_of(nm_query, date_range_query(date + 1, 2**63))
        at -= mb.reader.count_threads(newer, exclude_tags=exclude_tags)
        ids = mb.reader.threads_ranked_at(
            all_of(nm_query, date_range_query(date, date + 1)), newer,
            exclude_tags=exclude_tags, offset=max(at, 0), limit=size + min(at, 0))
        return mb.reader.threads_of(nm_query, ids, exclude_tags=exclude_tags)

    # The mirror reads a page of any search it answers (when its window holds one), so
    # notmuch's pages follow its order whenever it may read the others, or once it catches up.
    if (in_mirror_order or functools.partial(
            _in_mirror_order, mb, mirror, nm_query, exclude_tags))():
        page = mb.reader.in_one_snapshot(lambda: _in_tie_order(
            read, lambda _: _thread_rank, offset, limit + 1, newest=True, of_date=of_date))
    else:
        page = read(offset, limit + 1)
    return page[:limit], len(page) > limit


def _thread_rank(thread: ThreadSummary) -> tuple[int, str]:
    """Where a thread ranks in the mirror's pages of threads (see _in_tie_order)."""
    return thread.newest, thread.rank_id


def thread_figures(mb: Mailbox, thread_ids: Sequence[str],
                   exclude_tags: Sequence[str]) -> tuple[dict[str, int], set[str]]:
    """Unread messages per thread of a page, and the threads with a file attached to a
    message (as the mirror's parse found: the caller adds those notmuch tagged): one mirror
    read; a thread with a message the mirror has not caught up with is counted by notmuch
    (one count for each such thread)."""
    mirror = mb.mirror_lag() if thread_ids else None
    counts: dict[str, int] = {}
    attached: set[str] = set()
    lagging = set(thread_ids)
    if mirror is not None:
        conn, lag = mirror
        figures = sidecar.thread_figures(conn, thread_ids, exclude_tags)
        counts = {tid: unread for tid, (unread, _) in figures.items() if unread}
        attached = {tid for tid, (_, has_file) in figures.items() if has_file}
        lagging = set() if lag is None else {m.thread_id for m in mb.reader.messages(
            f"lastmod:{lag}.. AND ({' OR '.join(f'thread:{quote(t)}' for t in thread_ids)})",
            exclude_tags=())}
    for tid in lagging:
        counts[tid] = mb.reader.count(f"thread:{quote(tid)} AND tag:unread", exclude_tags=exclude_tags)
    return counts, attached


# A write (ours on the write thread, a mail client's, mbsync's) renames a file before it
# commits the new name to the index: a read in between finds neither.  The file is looked for
# by its unique part in its folder, and the message looked up again after short pauses, before
# it is called gone.
REREAD_PAUSES = (0.0, 0.05, 0.1, 0.2, 0.4)


def read_file(mb: Mailbox, m: IndexedMessage) -> bytes:
    """The bytes of one of the message's files, as the index names them now."""
    for pause in REREAD_PAUSES:
        if pause:
            sleep(pause)
            m = mb.find(m.message_id) or m
        for name in m.filenames:
            for path in maildir.on_disk(Path(name)):
                try:
                    return path.read_bytes()
                except OSError:
                    continue
    raise ToolError(f"the file of message {m.message_id} is gone from disk; re-index "
                    "(fmail-nm index) and try again")


def _shown_file(mb: Mailbox, m: IndexedMessage) -> bytes:
    """The bytes of a message whose content the model is shown; a draft's version noted, so
    that saving it over an edit made since in another mail client is refused."""
    data = read_file(mb, m)
    if DRAFT in m.tags:
        mb.seen_drafts.saw(m.message_id, data)
    return data


def _find(mb: Mailbox, message_id: str) -> IndexedMessage:
    found = mb.find(message_id)
    if found is None:
        why = ""
        if mb.reader.is_ghost(clean_id(message_id)):
            why = (" (notmuch knows it only from replies that refer to it: it was never "
                   "received, or was deleted)")
        elif is_thread_id(mb.reader, message_id):
            why = " (that is a thread's id: get_thread reads the thread)"
        raise ToolError(f"no message with id {message_id!r}{why}; use an id from "
                        "search_emails or a uid from query_emails")
    return found


def is_thread_id(reader: Reader, ref: str) -> bool:
    """Whether ``ref`` is a thread id (list_threads gives those; they look like uids)."""
    thread = ref.strip().removeprefix("thread:")
    return bool(THREAD_ID.fullmatch(thread)) and reader.count(
        f'thread:"{thread}"', exclude_tags=()) > 0


def _body(parsed: BodyText | ParsedMessage, subject: str, body_format: str, max_chars: int,
          offset: int) -> dto.Body:
    """The body to show; ``subject`` tells clean whether it is a forward (whose forwarded
    message is kept)."""
    if body_format not in ("clean", "full"):
        raise ToolError("body_format must be clean or full")
    if max_chars < 1 or offset < 0:
        raise ToolError("max_body_chars must be positive and body_offset not negative")
    notes = parsed.body_notes
    if body_format == "clean" and len(parsed.text) > MAX_CLEAN_CHARS:
        body_format = "full"
        notes = [*notes, f"too long to clean ({len(parsed.text):,} characters): shown in full"]
    text = (clean_text(parsed.text, forward=is_forward_subject(subject))
            if body_format == "clean" else parsed.text)
    piece = slice_text(text, max_chars, offset)
    # Said, so that a forward or a how-to that clean cut short is not read as all there is.
    left_out = len(parsed.text) - len(text)
    return dto.Body(untrusted=True, text=piece.text, format=body_format, offset=piece.offset,
                    total_chars=piece.total_chars, next_offset=piece.next_offset,
                    from_html=parsed.from_html, notes=notes,
                    left_out=left_out if left_out >= MIN_LEFT_OUT else None)


# Less than this left out by clean (trailing blanks, a short signature) goes unsaid.
MIN_LEFT_OUT = 40
# Past this a body is shown as it is: clean reads it all, line by line, for every page of it
# (2.5 s for 30 MB of text); a body this long is a log or a dump, with no quotes to drop.
MAX_CLEAN_CHARS = 1_000_000


# Where the rest of a long To and Cc is: the mirror keeps a message's first recipients.
RECIPIENTS_REST = f"query_emails emails.recipients (the first {MAX_RECIPIENTS})"
# References kept: the newest, nearest the message (get_thread has the whole thread).
MAX_REFERENCES = 20


def _email_full(mb: Mailbox, m: IndexedMessage, *, max_body_chars: int, body_offset: int,
                body_format: str) -> dto.EmailFull:
    """One message, every header list and value bounded (see dto.capped)."""
    parsed = read_message(_shown_file(mb, m))
    attachments = [attachment_info(a) for a in parsed.attachments]
    subject = parsed.subject or m.subject
    return dto.EmailFull(
        id=sidecar.uid_for(m.message_id), message_id=m.message_id, thread=m.thread_id,
        subject=dto.cut(subject, dto.MAX_SUBJECT_CHARS),
        from_=dto.capped(people(parsed.from_) or [person(m.from_header)]),
        to=dto.capped(people(parsed.to), rest=RECIPIENTS_REST),
        cc=dto.capped(people(parsed.cc), rest=RECIPIENTS_REST),
        reply_to=dto.capped(people(parsed.reply_to)),
        date=parsed.date.isoformat().replace("+00:00", "Z") if parsed.date else iso_from_epoch(m.date),
        list_id=_value(parsed.list_id), unsubscribe=_unsubscribe(parsed.unsubscribe),
        in_reply_to=_value(parsed.in_reply_to),
        references=_references(parsed.references),
        folders=dto.capped(mb.folders_of(m)), tags=dto.shown_tags(m.tags, dto.MAX_LISTED),
        body=_body(parsed, subject, body_format, max_body_chars, body_offset),
        attachments=attachments[:dto.MAX_LISTED],
        more_attachments=max(len(attachments) - dto.MAX_LISTED, 0),
        problems=dto.capped(parsed.defects),
    )


def _value(text: str | None) -> str | None:
    return None if text is None else dto.cut(text, dto.MAX_VALUE_CHARS)


def _unsubscribe(found: Unsubscribe | None) -> str | None:
    """The links in <>, as the header gives them, and "(one-click)" when a POST to the https
    one unsubscribes: shown for the user to follow; fmail-nm follows none."""
    if found is None:
        return None
    links = dto.capped([f"<{dto.cut(link, dto.MAX_VALUE_CHARS)}>" for link in found.links],
                       dto.MAX_LINKS)
    return " ".join(links) + (" (one-click)" if found.one_click else "")


def _references(ids: Sequence[str]) -> list[str]:
    """The last MAX_REFERENCES, after one item counting those left out."""
    kept = [dto.cut(i, dto.MAX_VALUE_CHARS) for i in ids[-MAX_REFERENCES:]]
    left = len(ids) - len(kept)
    return [f"{dto.MORE}{left} more: get_thread", *kept] if left else kept


def attachment_info(a: AttachmentInfo) -> dto.Attachment:
    """An attachment's metadata, its file name bounded (a name can be kilobytes)."""
    return dto.Attachment(index=a.index, filename=_name(a.filename),
                          content_type=dto.cut(a.content_type, dto.MAX_NAME_CHARS), size=a.size)


def _name(filename: str | None) -> str | None:
    return None if filename is None else dto.cut(filename, dto.MAX_NAME_CHARS)


def get_email(mb: Mailbox, id: str, max_body_chars: int = 8000, body_offset: int = 0,
              body_format: str = "clean") -> dto.EmailFull:
    return _email_full(mb, _find(mb, id), max_body_chars=max_body_chars,
                       body_offset=body_offset, body_format=body_format)


def get_emails_content(mb: Mailbox, ids: Sequence[str], max_body_chars: int = 4000,
                       body_format: str = "clean") -> dto.EmailsContent:
    if len(ids) > 50:
        raise ToolError("at most 50 ids per call")
    emails, missing = [], []
    budget = MAX_CONTENT_CHARS
    for mid in ids:
        try:
            m = _find(mb, mid)
        except ToolError:
            missing.append(mid)
            continue
        # past the budget a body is one character, its next_offset where get_email reads on
        email = _email_full(mb, m, max_body_chars=min(max_body_chars, max(budget, 1)),
                            body_offset=0, body_format=body_format)
        budget -= len(email.body.text)
        emails.append(email)
    return dto.EmailsContent(emails=emails, not_found=missing)


# Body characters one get_emails_content answer holds in all (50 bodies of the default
# 4,000): 50 of the largest max_body_chars would be 10 MB.
MAX_CONTENT_CHARS = 200_000


# Messages get_thread shows, in reply order: a thread of thousands would be an answer of
# megabytes even without bodies; the text says how to list the rest (search_emails thread:).
MAX_THREAD_MESSAGES = 100


def get_thread(mb: Mailbox, thread_id: str, include_bodies: bool = True,
               max_body_chars: int = 8000, body_format: str = "clean",
               max_total_chars: int = 60000) -> dto.ThreadFull:
    tid = thread_id.removeprefix("thread:")
    shown, total = mb.reader.thread_start(tid, MAX_THREAD_MESSAGES)
    if not shown and (member := mb.find(thread_id)) is not None:  # a message id or uid
        tid = member.thread_id
        shown, total = mb.reader.thread_start(tid, MAX_THREAD_MESSAGES)
    if not shown:
        raise ToolError(f"no thread with id {thread_id!r}; use a thread from a search, or the "
                        "id of one of its messages")
    budget = max_total_chars
    truncated = False
    messages = []
    mirror = mb.mirror_lag()
    attached = (sidecar.attached_messages(mirror[0], [n.message.message_id for n in shown])
                if mirror is not None else set())
    for node in shown:
        body = None
        if include_bodies and budget > 0:
            # The body alone: the index has the header values a thread shows.
            parsed = read_body(_shown_file(mb, node.message))
            body = _body(parsed, node.message.subject, body_format,
                         min(max_body_chars, budget), 0)
            budget -= len(body.text)
        elif include_bodies:
            truncated = True
        messages.append(_thread_message(node, body, shown[0].message.subject,
                                        node.message.message_id in attached))
    return dto.ThreadFull(thread=tid, subject=dto.cut(shown[0].message.subject,
                                                       dto.MAX_SUBJECT_CHARS),
                          messages=messages, truncated=truncated,
                          more_messages=total - len(shown),
                          list_names=page_list_names(mb, (m.tags for m in messages)))


def _thread_message(node: ThreadNode, body: dto.Body | None, subject: str,
                    attached: bool) -> dto.ThreadMessage:
    """``attached``: the mirror's parse found a file attached (notmuch's tag counts too)."""
    m = node.message
    return dto.ThreadMessage(
        id=sidecar.uid_for(m.message_id), depth=node.depth,
        parent=sidecar.uid_for(node.parent_id) if node.parent_id else None,
        subject=(None if bare_subject(m.subject) == bare_subject(subject)
                 else dto.cut(m.subject, dto.MAX_LISTED_SUBJECT)),
        from_=person(m.from_header),
        date=iso_from_epoch(m.date), tags=dto.shown_tags(m.tags), body=body,
        attachment=attached or ATTACHMENT in m.tags)


_REPLY_PREFIX = re.compile(r"^\s*((re|fwd?|aw|wg|sv|vs)\s*(\[\d+\])?\s*:\s*)+", re.IGNORECASE)


def bare_subject(subject: str) -> str:
    """A subject without its reply and forward prefixes ("Re: Fwd: x" is "x")."""
    return _REPLY_PREFIX.sub("", subject).strip()


@one_mirror_state
def find_unanswered_threads(mb: Mailbox, since: str | None = None, until: str | None = None,
                            address: str | None = None, min_days_silent: int = 0,
                            limit: int = DEFAULT_LIMIT,
                            cursor: str | None = None) -> dto.UnansweredList:
    """Threads whose newest message is the user's, with nothing from anyone after it; that
    message written within ``since`` .. ``until``, and to someone the user waits for
    (:func:`_awaits_no_one`)."""
    limit = clamp_limit(limit)
    if not 0 <= min_days_silent <= MAX_DAYS_SILENT:
        raise ToolError(f"min_days_silent must be 0 to {MAX_DAYS_SILENT:,} (got "
                        f"{min_days_silent}); 365 is a year")
    # Compared in canonical form, as the mirror keeps a last word's sender (and as is_sent).
    mine = plain_addresses(search_forms([address]) if address else mb.own_addresses())
    if not mine and address:
        raise ToolError(f"address {address!r} is not an e-mail address")
    if not mine:
        raise ToolError("no addresses of yours are configured; pass address=")
    # Drafts were never sent: they neither make a thread "unanswered" nor count as its end.
    nm_query = scoped_query(mb, CompiledQuery("*", ()), since=since, until=until,
                            extra=f"{me_query(mine)} AND NOT tag:draft")
    # silent for min_days_silent whole days: written at least that many days before now --
    # for a later page, before the first page's now (its cursor's anchor)
    anchor = cursor_anchor(cursor) if min_days_silent > 0 else None
    now = int(mb.clock().timestamp()) if anchor is None else anchor
    silent_until = now - min_days_silent * 86400 if min_days_silent > 0 else None
    # The query finds threads with a message of the user's up to until; their last word, the
    # user's too, may be later: the bound is on the last word (as the mirror keeps it).
    asked_until = _parse_when(until, "until", end=True) if until else None
    until_epoch = min((b for b in (silent_until, asked_until) if b is not None), default=None)
    fp = _fingerprint("unanswered", nm_query, until_epoch, mine)
    offset = read_cursor(cursor, fp, anchor)
    since_epoch = _parse_when(since, "since", end=False) if since else None
    answer = _unanswered_from_mirror(mb, mine, since_epoch, until_epoch, offset, limit)
    if answer is None:
        found = [w for w in _unanswered_from_notmuch(mb, nm_query, mine,
                                                     sub_addresses=not address)
                 if until_epoch is None or w.date <= until_epoch]
        answer = len(found), found[offset:offset + limit]
    total, page = answer
    threads = []
    rows, _ = mb.mirror_rows([w.message_id for w in page])
    me = my_addresses(mb.config)
    for w in page:
        row = rows.get(w.message_id)
        # Not in the mirror yet (a sync in flight): notmuch and the file tell.
        last = None if row else mb.reader.find(w.message_id)
        subject = row[6] if row else last.subject if last else ""
        # A last word is the user's and no draft.
        to = (_listed_to(row[8], (SENT,), me) if row
              else _unmirrored_to(last, (SENT,), me) if last else [])
        threads.append(dto.UnansweredThread(
            thread=w.thread_id, subject=dto.cut(subject, dto.MAX_LISTED_SUBJECT),
            days_silent=max(0, (now - w.date) // 86400), messages=w.message_count,
            to=to, last=row[1] if row else w.message_id, date=iso_from_epoch(w.date)))
    return dto.UnansweredList(threads=threads, total=total,
                              next_cursor=next_cursor(offset, len(page), total, fp,
                                                      now if silent_until is not None else None))


def _unanswered_from_mirror(mb: Mailbox, mine: Sequence[str], since: int | None,
                            until: int | None, offset: int, limit: int
                            ) -> tuple[int, list[sidecar.LastWord]] | None:
    """From the last words the mirror keeps: exact when it is current and a search leaves
    out deleted and spam mail and nothing else a last word could be (drafts aside) -- then
    a thread with a message of the user's since ``since`` that a search shows and that is
    no draft is one whose last word is that recent.  None otherwise (notmuch answers)."""
    exclusions = frozenset(mb.reader.exclude_tags())
    if not {DELETED, SPAM} <= exclusions <= {DELETED, SPAM, DRAFT}:
        return None
    conn = current_mirror(mb, sorted(exclusions))
    if conn is None:
        return None
    blocked, me = sidecar.blocked_addresses(conn), my_addresses(mb.config)
    passed_over = [rowid for rowid, to in sidecar.last_words_to(conn, sorted(blocked)).items()
                   if _awaits_no_one(to, blocked, me)]
    return sidecar.last_words(conn, mine, since=since, until=until, offset=offset, limit=limit,
                              passed_over=passed_over)


def _unanswered_from_notmuch(mb: Mailbox, nm_query: str, mine: Sequence[str], *,
                             sub_addresses: bool) -> list[sidecar.LastWord]:
    """Each thread with a message of the user's the query matches, walked for its last
    word (see sidecar.LastWord); those from the user to someone the user waits for, newest
    first.  ``sub_addresses``: ``mine`` are the user's addresses, whose sub-addresses are the
    user's too -- also those the mirror, lagging when notmuch answers, has not seen yet
    (Mailbox.own_addresses)."""
    blocked, me = read_blocklist(mb.config), my_addresses(mb.config)
    found: list[sidecar.LastWord] = []
    for thread_id in mb.reader.thread_ids(nm_query, exclude_tags=mb.reader.exclude_tags()):
        nodes = mb.reader.thread(thread_id)
        live = [n.message for n in nodes if not (n.message.tags & {DELETED, SPAM, DRAFT})]
        if not live:
            continue
        last = max(live, key=lambda m: (m.date, m.message_id))  # as the mirror picks it
        address = sender(last.from_header)[1]
        if not (is_own_address(address, mine) if sub_addresses
                else canonical_address(address) in mine):
            continue
        # Whom it went to matters only while someone is blocked: no file is read otherwise.
        to = {canonical_address(r["email"]) for r in _file_recipients(last)} if blocked else set()
        if not _awaits_no_one(to, blocked, me):
            found.append(sidecar.LastWord(thread_id, last.message_id, last.date, len(nodes)))
    found.sort(key=lambda w: w.date, reverse=True)
    return found


def _awaits_no_one(recipients: Collection[str], blocked: Collection[str],
                   me: Collection[str]) -> bool:
    """Whether the user's last word to these (canonical) addresses awaits no reply: it went
    to blocked people -- whose replies the block makes spam, which ends no thread -- and to
    no one else but the user."""
    others = [r for r in recipients if not is_own_address(r, me)]
    return bool(others) and all(r in blocked for r in others)


def get_attachment(mb: Mailbox, id: str, index: int | str, max_chars: int = 20000,
                   offset: int = 0) -> dto.AttachmentContent:
    return attachment_content(*message_file(mb, id), index, max_chars, offset)


def message_file(mb: Mailbox, id: str) -> tuple[str, bytes]:
    """A message's Message-ID and the bytes of its file: all the index is needed for to read
    an attachment, so that the rest (:func:`attachment_content`) can run on another thread."""
    m = _find(mb, id)
    return m.message_id, read_file(mb, m)


# An attachment's index, or its path through forwarded messages ("2.0"): a few levels at most.
# ASCII digits only: \d also takes other scripts' digits, which int() reads ("\u0663" is 3).
_ATTACHMENT_PATH = re.compile(r"\d{1,6}(?:\.\d{1,6}){0,7}", re.ASCII)


def attachment_path(index: int | str) -> tuple[int, ...]:
    """``2`` or ``"2"`` -> ``(2,)``; ``"2.0"`` -> ``(2, 0)`` (attachment 0 of the message
    forwarded as attachment 2)."""
    if isinstance(index, int):
        if index < 0:
            raise ToolError(f"attachment index {index}: an index is 0 or more")
        return (index,)
    if not _ATTACHMENT_PATH.fullmatch(index):
        raise ToolError(f"attachment index {index!r}: give a number from get_email (2), or "
                        f"for an attachment inside a forwarded message its path (2.0)")
    return tuple(int(step) for step in index.split("."))


def attachment_content(message_id: str, raw: bytes, index: int | str, max_chars: int,
                       offset: int = 0) -> dto.AttachmentContent:
    if max_chars < 1 or offset < 0:
        raise ToolError("max_chars must be positive and offset not negative")
    path = attachment_path(index)
    try:
        content = attachment_text(raw, path, max_chars, offset)
    except LookupError as exc:
        raise ToolError(str(exc)) from None
    return dto.AttachmentContent(
        id=sidecar.uid_for(message_id), untrusted=True, attachment=attachment_info(content.info),
        path=dotted(path) if len(path) > 1 else None,
        text=content.text, truncated=content.truncated, note=content.note,
        offset=content.offset, total_chars=content.total_chars, next_offset=content.next_offset)


def list_tags(mb: Mailbox) -> dto.TagList:
    """Every tag with its messages (spam and deleted included): as the mirror's triggers
    keep them when it holds every change notmuch has, else one count per tag."""
    mirror = mb.mirror_lag()
    kept = (sidecar.tag_counts(mirror[0]) if mirror is not None and mirror[1] is None
            else None)

    def count(tag: str) -> int:
        if kept is not None:
            return kept.get(tag, 0)
        return mb.reader.count(f"tag:{quote(tag)}", exclude_tags=())
    counted = [dto.TagCount(tag=t, count=count(t)) for t in mb.reader.all_tags()]
    shown = _most(counted, MAX_TAGS, lambda t: t.count)
    return dto.TagList(tags=shown, more=len(counted) - len(shown))


# Tags and folders a listing shows: those with the most mail (a tag per mailing list, a
# folder per label, run to thousands); the text says where the rest are.
MAX_TAGS = 300
MAX_FOLDERS = 300


def _most(items: Sequence[Item], most: int, key: Callable[[Item], Any]) -> list[Item]:
    """The ``most`` items of the highest ``key``, in their own order."""
    if len(items) <= most:
        return list(items)
    chosen = set(heapq.nlargest(most, range(len(items)), key=lambda i: key(items[i])))
    return [item for i, item in enumerate(items) if i in chosen]


def list_folders(mb: Mailbox, account: str | None = None) -> dto.FolderList:
    accounts = [mb.config.account(account)] if account else list(mb.config.accounts)
    folders = []
    for folder in mb.config.folders:
        owner = mb.config.account_for_path(folder)
        if owner is None or owner not in accounts:
            continue
        role = next((r for r, f in owner.folders.items() if f == folder), None)
        q = folders_query([folder])
        name = mb.config.mailbox_names.get(folder)
        spelled = folder.removeprefix(f"{owner.maildir}/") if owner.maildir != "." else folder
        folders.append(dto.FolderInfo(folder=folder, account=owner.name, role=role,
                                      name=name if name != spelled else None,
                                      total=mb.reader.count(q, exclude_tags=()),
                                      unread=mb.reader.count(f"{q} AND tag:unread", exclude_tags=())))
    shown = _most(folders, MAX_FOLDERS, lambda f: (f.role is not None, f.total))
    return dto.FolderList(folders=shown, more=len(folders) - len(shown))


def list_available_accounts(config: Config) -> dto.AccountList:
    """From the configuration alone: nothing of the index is read."""
    return dto.AccountList(accounts=[
        dto.AccountInfo(name=a.name, addresses=list(a.addresses), folder=a.maildir,
                        roles=dict(a.folders), mbsync_channel=a.mbsync_channel)
        for a in config.accounts])
