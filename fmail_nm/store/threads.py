"""A thread as a listing shows it, built from its messages in date order: the same rules
whether the messages come from notmuch or from the sidecar mirror.

The subject, dates and counts follow libnotmuch's (lib/thread.cc): the dates span the
messages the search matched, the subject is the newest matched message's without one
``Re: `` (``Aw: ``, ``Vs: ``, ``Sv: ``), the tags are every message's, and those who wrote a
matched message come first among the authors, in date order.  An author is the From name
as Python's email parser reads it (else the address, in lower case as listings show it),
the mirror's sender: the same for either source, where GMime's parse, which libnotmuch
uses, differs on odd headers.
"""

from __future__ import annotations

import email.utils
import functools
from collections.abc import Iterable
from dataclasses import dataclass

# Hostile mail can carry megabyte names; the mirror keeps this much of one (passes.mirror).
MAX_NAME_CHARS = 2000

# The reply prefixes libnotmuch takes off a thread's subject (once, case-insensitively).
_REPLY_PREFIXES = ("re: ", "aw: ", "vs: ", "sv: ")


@dataclass(frozen=True)
class ThreadSummary:
    thread_id: str
    subject: str
    authors: tuple[str, ...]
    oldest: int
    newest: int
    message_count: int
    matched_count: int
    tags: frozenset[str]
    # The Message-ID that ranks the thread among those of its newest second: its newest
    # match's (the greatest on a tie), as the mirror reads matches by date and Message-ID.
    rank_id: str
    # The Message-ID notmuch lists it by among the threads of its newest second, in its own
    # order (by document id within a second): its first match of that second in index order.
    listed_by: str = ""


@dataclass(frozen=True)
class ThreadMember:
    """One message of a thread, as a summary needs it."""

    date: int  # 0 when the message has no usable Date, as notmuch keeps it
    message_id: str
    subject: str
    author: str
    tags: frozenset[str]
    matched: bool  # the search matched it and shows it (no excluded tag)


def sender(from_header: str) -> tuple[str, str]:
    """(name, lower-case address) of the first address of a From header."""
    if len(from_header) > MAX_CACHED_HEADER:
        return _parse_sender(from_header)
    return _cached_sender(from_header)


# Python's address parser takes ~8 us a header, and a thread listing from notmuch names the
# author of every message of its threads, where a few senders write most of them.
MAX_CACHED_HEADER = 300
CACHED_SENDERS = 4096


def _parse_sender(from_header: str) -> tuple[str, str]:
    name, address = email.utils.parseaddr(from_header)
    if "@" not in address and (named := _name_and_angle_address(from_header)) is not None:
        # notmuch decodes the header: 'Smith, Bob <bob@x>' (an encoded word's comma, its
        # quotes gone) reads to parseaddr as two addresses, the first 'Smith'.
        name, address = named
    return name[:MAX_NAME_CHARS], address.lower()


def _name_and_angle_address(header: str) -> tuple[str, str] | None:
    """(name, address) of a header that is one name and one ``<address>``, the name all
    before it, commas included; else None.  String scans, no regex: headers are hostile."""
    name, lt, tail = header.partition("<")
    address, gt, after = tail.partition(">")
    if not (lt and gt) or after.strip() or ">" in name or "<" in address or "@" not in address \
            or any(c.isspace() for c in address):
        return None
    return name.strip().strip('"'), address


_cached_sender = functools.lru_cache(maxsize=CACHED_SENDERS)(_parse_sender)


def author(name: str, address: str) -> str:
    """How a thread names whoever sent a message: the name, else the address.  A name
    written "Last, First" whose address holds first.last is turned round, as libnotmuch
    does (Exchange writes names that way)."""
    if not name:
        return address
    last, comma, first = name.partition(",")
    first = first.lstrip(" ")
    if comma and first and f"{first}.{last}".replace(" ", ".").lower() in address:
        return f"{first} {last}"
    return name


def author_of(from_header: str) -> str:
    return author(*sender(from_header))


def thread_authors(members: Iterable[tuple[str, bool]]) -> tuple[str, ...]:
    """The distinct authors of (author, matched) pairs in date order: those of a matched
    message first, then the rest."""
    matched: dict[str, None] = {}
    others: dict[str, None] = {}
    for name, is_match in members:
        if name:
            (matched if is_match else others)[name] = None
    return (*matched, *(name for name in others if name not in matched))


def _subject_of(subject: str) -> str:
    return subject[4:] if subject[:4].lower() in _REPLY_PREFIXES else subject


def rank_id(matches: Iterable[tuple[int, str]]) -> str:
    """A thread's rank_id, from the (date, Message-ID) of each of its matches."""
    return max(matches, default=(0, ""))[1]


def listed_by(matches: Iterable[tuple[int, str]]) -> str:
    """A thread's listed_by, from the (date, Message-ID) of each of its matches, oldest
    first with ties in index order: the first of the newest date."""
    newest: tuple[int, str] = (0, "")
    for date, message_id in matches:
        if date > newest[0] or not newest[1]:
            newest = (date, message_id)
    return newest[1]


def summarize(thread_id: str, members: Iterable[ThreadMember]) -> ThreadSummary:
    """The summary of a thread from all its messages, oldest first (ties in index order)."""
    listed = list(members)
    subject = listed[0].subject if listed else ""
    oldest = newest = 0
    matched = 0
    for m in listed:
        if not m.matched:
            continue
        if not matched or m.date < oldest:
            oldest = m.date
        if not matched or m.date > newest:
            newest = m.date
            subject = _subject_of(m.subject) or subject
        matched += 1
    return ThreadSummary(
        thread_id=thread_id, subject=subject,
        authors=thread_authors((m.author, m.matched) for m in listed),
        oldest=oldest, newest=newest, message_count=len(listed), matched_count=matched,
        tags=frozenset(tag for m in listed for tag in m.tags),
        rank_id=rank_id((m.date, m.message_id) for m in listed if m.matched),
        listed_by=listed_by((m.date, m.message_id) for m in listed if m.matched))
