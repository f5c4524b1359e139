"""Keeps the sidecar's mirror of the notmuch index exact, incrementally.

notmuch stamps every message with the database revision at which it last changed (tags, files,
properties, thread); ``lastmod:A..B`` finds those changed since the last sync.  Two things that
stamp cannot show are handled apart:

* a removed message leaves no trace (the revision does not even move), so every sync compares
  the message counts and, when the mirror has more, narrows the difference down folder by
  folder -- the mirror is a superset of the index once the changed messages are applied;
* a new database (its uuid changed) means a full rebuild.

Work is done in batches; each batch and the sync position are committed in one transaction, so
a sync killed at any point leaves a state the next run simply continues.  Message files are
opened only for messages the mirror has not seen (recipients, Bcc included, List-Id, a body
preview, whether it has attachments); a tag change or a moved file costs no parsing.  When
what a parse yields changes, a schema migration asks the next sync to parse again, once, the
rows that can differ (``Mirror._reparse``).
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import math
import os
import re
import sqlite3
from collections import deque
from collections.abc import (Callable, Container, Generator, Iterable, Iterator, Mapping,
                             Sequence)
# BrokenProcessPool's base: naming it needs none of the process pool's modules (pickle,
# multiprocessing), which every hook would import for the rare sync that starts workers.
from concurrent.futures import BrokenExecutor, Future
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import tags
from ..clock import iso_from_epoch
from ..config import ROOT_FOLDER, Config
from ..errors import BackendError
from ..flock import flock_within
from ..message.headers import (Address, HeaderInfo, canonical_address, ends_head,
                               is_own_address, list_rewrote, parse_headers,
                               read_head, search_forms, via_name)
from ..private import private_dir
from ..progress import SIDECAR, ProgressCallback
from ..store import maildir, sidecar
from ..store.maildir import notmuch_folder
from ..store.sidecar import chunks
from ..store.notmuch import IndexedMessage, Reader, Revision
from ..store.query import folders_query
from ..store.threads import sender
from .tagging import configured_new_tags

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

log = logging.getLogger(__name__)

BATCH_SIZE = 500
HEAD_BYTES = 64 * 1024  # all the headers (read_head) and text enough for a 200-character preview
PREVIEW_CHARS = 200
# Past this many unseen messages in a batch (a first index, a big delivery) their files are
# parsed by worker processes, one per core up to MAX_PARSE_WORKERS; below it, starting the
# workers costs more than it saves.
PARALLEL_PARSE_MIN = 400
MAX_PARSE_WORKERS = 4
PARSE_CHUNK = 16
# Hostile mail can carry megabyte subjects or thousands of recipients; the SQL tools refuse
# values over 250 KB, so the mirror keeps every value well below that.
MAX_SUBJECT_CHARS = 2000  # sender names: threads.MAX_NAME_CHARS
MAX_RECIPIENTS = 500

# The order in which a message's folders are chosen as its primary one.
_ROLE_RANK = {"inbox": 0, "archive": 2, "sent": 3, "drafts": 4, "junk": 5, "trash": 6}
_OTHER_RANK = 1


@dataclass
class MirrorReport:
    full: bool = False
    upserted: int = 0
    parsed: int = 0
    prefetched: int = 0  # of those parsed, how many while notmuch new ran (passes.prefetch)
    recounted: int = 0  # addresses whose contact figures were recounted (not added to)
    removed: int = 0
    revision: int = 0
    uuid: str = ""


@dataclass(frozen=True)
class Gone:
    """A message the index no longer has, as the mirror last knew it."""

    folders: tuple[str, ...]  # relative to the mail root, "." for the root
    tags: frozenset[str]


@dataclass(frozen=True)
class Parsed:
    """What only the file can tell, parsed once per message."""

    recipients: list[dict[str, str]]
    list_id: str | None
    body_preview: str
    size: int | None
    # Some part is a file get_email lists as an attachment: also a PDF sent inline, a forwarded
    # message, an invitation, which notmuch's "attachment" tag leaves out; not a signature or
    # a picture the HTML shows in place (mime.is_file).
    has_attachment: bool = False
    # Who wrote list mail whose From the list rewrote (headers.list_author): a contact the
    # mail is from, in message_addresses alone -- no recipient, no sender of a listing.
    author: Address | None = None


@dataclass
class _Window:
    """One lastmod range being applied; ``after`` is the last Message-ID committed."""

    start: int
    stop: int
    after: str = ""

    def dump(self) -> str:
        return json.dumps({"start": self.start, "stop": self.stop, "after": self.after})

    @classmethod
    def load(cls, text: str | None) -> _Window | None:
        if not text:
            return None
        data = json.loads(text)
        return cls(int(data["start"]), int(data["stop"]), str(data["after"]))


# ---------------------------------------------------------------------------------------------
# Building a row


@dataclass
class Layout:
    """Where a folder sits: its rank among a message's folders (the primary one is shown)."""

    config: Config
    _roles: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for account in self.config.accounts:
            for role, folder in account.folders.items():
                self._roles.setdefault(folder, role)

    def rank(self, folder: str) -> int:
        return _ROLE_RANK.get(self._roles.get(folder, ""), _OTHER_RANK)

    def account_and_name(self, folder: str) -> tuple[str | None, str]:
        return maildir.account_and_name(self.config, folder)


def parse_file(filenames: Sequence[str]) -> Parsed:
    """Recipients, List-Id, preview, size, whether it has attachments and a list author,
    from the first readable file."""
    # Imported here: the hook of a `notmuch new` that found nothing parses no file, and would
    # load the parser and the body renderers (dozens of patterns compiled on import) for nothing.
    from ..message.mime import parse_summary
    from ..message.text import preview, preview_html_text

    for name in filenames:
        if (read := _read_head(name)) is None:
            continue
        head, size = read
        summary = parse_summary(head, preview_html_text)
        fields = summary.fields
        return Parsed(recipients=_recipient_rows(fields),
                      list_id=fields.list_id.lower() if fields.list_id else None,
                      body_preview=preview(summary.text, PREVIEW_CHARS), size=size,
                      has_attachment=summary.has_files, author=fields.author)
    return Parsed(recipients=[], list_id=None, body_preview="", size=None)


def file_recipients(filenames: Sequence[str]) -> list[dict[str, str]]:
    """The recipients :func:`parse_file` finds, from the first readable file's header block
    alone (the same bytes, read by the same parser): what a listing shows of the user's own
    mail the mirror does not have yet is what it shows once the mirror has it."""
    for name in filenames:
        if (read := _read_head(name)) is not None:
            return _recipient_rows(parse_headers(read[0]))
    return []


def _recipient_rows(fields: HeaderInfo) -> list[dict[str, str]]:
    # Bcc too, whoever sent the message: whether it counts (only on the user's own mail,
    # see _STATS) can change with the user's addresses, and then no file is read again.
    return [{"name": a.name, "email": a.address.lower(), "kind": kind}
            for kind, people in (("to", fields.to), ("cc", fields.cc), ("bcc", fields.bcc))
            for a in people if a.address][:MAX_RECIPIENTS]


def _read_head(name: str) -> tuple[bytes, int] | None:
    """What is parsed of a message file (see :func:`read_head`: at least its header block,
    up to a bound) and the file's size; None when it cannot be read."""
    try:
        with open(name, "rb") as fh:
            head = read_head(fh, HEAD_BYTES)
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return None
    return _whole_lines(head, size), size


def _whole_lines(head: bytes, size: int) -> bytes:
    """The head of a longer file cut after its last whole line: a part header cut mid-line
    ("Content-Type: text/pl") would read as a part of another type, an attachment.  A head
    that ends inside its header block (one past the bound on header blocks) stays as read,
    so that the parser sees the block was cut (and drops the half address it may end in)."""
    if len(head) >= size or not ends_head(head):
        return head
    end = head.rfind(b"\n")
    return head[:end + 1] if end >= 0 else head


def parse_workers() -> int:
    return min(os.cpu_count() or 1, MAX_PARSE_WORKERS)


def parse_pool(workers: int) -> ProcessPoolExecutor | None:
    """Worker processes for :func:`parse_file`, or None (parse here) when none can start."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    try:
        # spawn, not fork: this process has threads (the notmuch writer) and handles
        return ProcessPoolExecutor(workers, mp_context=get_context("spawn"),
                                   initializer=exit_with_parent)
    except OSError as exc:
        log.warning("no worker processes for parsing (%s); parsing here", exc)
        return None


def exit_with_parent() -> None:
    """The start of a process that works for another (a parse worker, the first index's
    mirror follower): it ends when the process that started it does.  Such a process waits
    for work on a pipe it holds both ends of, so it never sees its parent go: one killed
    (``kill -9``, the OOM killer) left its workers waiting for good."""
    import multiprocessing
    import threading
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


PARSE_AHEAD = 2000  # files parse_in_order has parsed or queued beyond what was taken


def parse_in_order(paths: Sequence[str]) -> Generator[Parsed, None, None]:
    """:func:`parse_file` of each path, in order: in worker processes when there are many
    (parsing needs no notmuch, and the caller has other work meanwhile), at most
    ``PARSE_AHEAD`` files ahead of the caller, so memory does not grow with the mailbox; here,
    for whatever is left, if the workers fail."""
    pool = parse_pool(parse_workers()) if len(paths) >= PARALLEL_PARSE_MIN else None
    done = 0
    try:
        if pool is not None:
            starts = iter(range(0, len(paths), PARSE_CHUNK))
            pending: deque[Future[list[Parsed]]] = deque()

            def submit() -> None:
                if (start := next(starts, None)) is not None:
                    pending.append(pool.submit(_parse_chunk, paths[start:start + PARSE_CHUNK]))
            try:
                for _ in range(PARSE_AHEAD // PARSE_CHUNK):
                    submit()
                while pending:
                    for parsed in pending.popleft().result():
                        done += 1
                        yield parsed
                    submit()
            except (BrokenExecutor, OSError) as exc:
                log.warning("parsing in worker processes failed (%s); parsing here", exc)
        for path in paths[done:]:
            yield parse_file([path])
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _parse_chunk(paths: Sequence[str]) -> list[Parsed]:
    return [parse_file([path]) for path in paths]


def _as_text(name: str) -> str:
    """A folder name as the mirror's text: a name that is not UTF-8 on disk (Linux allows
    any bytes; Python holds them as surrogates, which SQLite cannot store) with those
    bytes shown as U+FFFD -- for reading only, nothing looks the folder up by it."""
    return os.fsencode(name).decode("utf-8", "replace") if _SURROGATES.search(name) else name


def _json_names(names: Sequence[str]) -> str:
    """File names as JSON text, exactly: with \\u escapes where a name is not UTF-8 on disk,
    which json.loads gives back as the name Python opens the file by."""
    text = json.dumps(list(names), ensure_ascii=False)
    return json.dumps(list(names)) if _SURROGATES.search(text) else text


_SURROGATES = re.compile("[\ud800-\udfff]")


def new_tag_is_pending(reader: Reader) -> bool:
    """Whether a message tagged ``new`` waits for the tagging pass: only when ``notmuch new``
    gives that tag (afew-style ``new.tags``); otherwise ``new`` is a tag of the user's own."""
    return tags.NEW in configured_new_tags(reader)


def build_row(m: IndexedMessage, parsed: Parsed, layout: Layout, me: frozenset[str],
              exclusions: frozenset[str], *, new_is_pending: bool) -> dict[str, Any]:
    folders = sorted({_as_text(f) for f in (notmuch_folder(n, layout.config.mail_root)
                                            for n in m.filenames) if f is not None})
    primary = min(folders, key=lambda f: (layout.rank(f), f)) if folders else None
    account, folder = layout.account_and_name(primary) if primary is not None else (None, None)
    sender_name, sender_email = sender(m.from_header)
    return {
        "message_id": m.message_id,
        "uid": sidecar.uid_for(m.message_id),
        "thread_id": m.thread_id,
        "account_name": account,
        "folder": folder,
        "folders": json.dumps(folders, ensure_ascii=False),
        "subject": m.subject[:MAX_SUBJECT_CHARS],
        "sender_email": sender_email,
        "sender_name": sender_name,
        "recipients": json.dumps(parsed.recipients, ensure_ascii=False),
        "date": iso_from_epoch(m.date),
        "date_epoch": m.date or None,
        "body_preview": parsed.body_preview,
        "is_read": int("unread" not in m.tags),
        "is_flagged": int("flagged" in m.tags),
        "is_replied": int("replied" in m.tags),
        "is_draft": int("draft" in m.tags),
        "is_sent": int(is_own_address(sender_email, me) and "draft" not in m.tags),
        # The tag also covers a file attached past the head parse_file reads.
        "has_attachment": int(parsed.has_attachment or "attachment" in m.tags),
        "is_excluded": int(not exclusions.isdisjoint(m.tags)),
        "tags": json.dumps(sorted(m.tags), ensure_ascii=False),
        "list_id": parsed.list_id,
        "size": parsed.size,
        "filenames": _json_names(m.filenames),
        "needs_tagging": int(new_is_pending and tags.NEW in m.tags),
        "_folders": folders,
        "_tags": sorted(m.tags),
    }


_COLUMNS = ("message_id", "uid", "thread_id", "account_name", "folder", "folders", "subject",
            "sender_email", "sender_name", "recipients", "date", "date_epoch", "body_preview",
            "is_read", "is_flagged", "is_replied", "is_draft", "is_sent", "has_attachment",
            "is_excluded", "tags", "list_id", "size", "filenames", "needs_tagging")
# A message waiting for the tagging pass keeps waiting until the pass clears the mark.
_UPSERT = (f"INSERT INTO messages ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))}) "
           "ON CONFLICT (message_id) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS
                       if c not in ("message_id", "needs_tagging"))
           + ", needs_tagging = max(needs_tagging, excluded.needs_tagging)")


# ---------------------------------------------------------------------------------------------
# Writing rows


def _known(conn: sqlite3.Connection,
           ids: Sequence[str]) -> dict[str, tuple[Parsed, frozenset[str]]]:
    """What the mirror already parsed for these messages (so it is not parsed again), with the
    files it was parsed from."""
    known: dict[str, tuple[Parsed, frozenset[str]]] = {}
    for chunk in chunks(ids, 500):
        marks = ",".join("?" * len(chunk))
        for mid, recipients, list_id, body_preview, size, attached, filenames in conn.execute(
                f"SELECT message_id, recipients, list_id, body_preview, size, has_attachment, "
                f"filenames FROM messages WHERE message_id IN ({marks})", chunk):
            known[mid] = (Parsed(json.loads(recipients), list_id, body_preview, size,
                                 bool(attached)),
                          frozenset(json.loads(filenames)))
        for mid, email, name in conn.execute(
                f"SELECT message_id, email, name FROM message_addresses "
                f"WHERE role = 'author' AND message_id IN ({marks})", chunk):
            parsed, files = known[mid]
            known[mid] = (replace(parsed, author=Address(name, email)), files)
    return known


# What of a message the contact figures read (contact_stats: names, dates, counts); drafts and
# spam are left out of them, so a draft, spam or blocked tag coming or going changes them too.
_PEOPLE_COLUMNS = ("date", "sender_email", "sender_name", "is_sent", "is_draft", "recipients")
_PEOPLE_TAGS = (tags.SPAM, tags.BLOCKED)
# Whether message {m} has the tag {tag}.
_TAGGED = ("EXISTS (SELECT 1 FROM message_tags s "
           "WHERE s.message_id = {m}.message_id AND s.tag = '{tag}')")


def _people(row: dict[str, Any]) -> tuple[Any, ...]:
    return (*(row[c] for c in _PEOPLE_COLUMNS), *(int(t in row["_tags"]) for t in _PEOPLE_TAGS))


def _people_of(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    found: dict[str, tuple[Any, ...]] = {}
    tagged = ", ".join(_TAGGED.format(m="m", tag=t) for t in _PEOPLE_TAGS)
    for chunk in chunks(ids, 500):
        marks = ",".join("?" * len(chunk))
        for mid, *people in conn.execute(
                f"SELECT message_id, {', '.join(_PEOPLE_COLUMNS)}, {tagged} "
                f"FROM messages m WHERE message_id IN ({marks})", chunk):
            found[mid] = tuple(people)
    return found


def _threads_of(conn: sqlite3.Connection, ids: Sequence[str]) -> set[str]:
    """The threads the mirror files these messages under (before a batch changes them)."""
    return _distinct(conn, "SELECT DISTINCT thread_id FROM messages WHERE message_id IN ({})", ids)


def _addresses_of(conn: sqlite3.Connection, ids: Sequence[str]) -> set[str]:
    return _distinct(conn, "SELECT DISTINCT email FROM message_addresses WHERE message_id IN ({})",
                     ids)


def _last_known(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, Gone]:
    folders: dict[str, list[str]] = {mid: [] for mid in ids}
    tags_of: dict[str, set[str]] = {mid: set() for mid in ids}
    for chunk in chunks(ids, 500):
        marks = ",".join("?" * len(chunk))
        for mid, folder in conn.execute("SELECT message_id, folder FROM message_folders "
                                        f"WHERE message_id IN ({marks})", chunk):
            folders[mid].append(folder or ROOT_FOLDER)
        for mid, tag in conn.execute("SELECT message_id, tag FROM message_tags "
                                     f"WHERE message_id IN ({marks})", chunk):
            tags_of[mid].add(tag)
    return {mid: Gone(tuple(sorted(folders[mid])), frozenset(tags_of[mid])) for mid in ids}


def _distinct(conn: sqlite3.Connection, sql: str, ids: Sequence[str]) -> set[str]:
    found: set[str] = set()
    for chunk in chunks(ids, 500):
        found.update(r[0] for r in conn.execute(sql.format(",".join("?" * len(chunk))), chunk))
    return found


def _write_rows(conn: sqlite3.Connection, rows: Sequence[tuple[dict[str, Any], Parsed]],
                known: Container[str]) -> dict[str, set[str]]:
    """Upsert messages with their tags, folders and addresses, one statement a table for them
    all (not four a message); returns each one's addresses.  ``known``: the messages the
    mirror had rows for, whose tags, folders and addresses go first."""
    conn.executemany(_UPSERT, [[row[c] for c in _COLUMNS] for row, _ in rows])
    stale = [(row["message_id"],) for row, _ in rows if row["message_id"] in known]
    for table in ("message_tags", "message_folders", "message_addresses"):
        conn.executemany(f"DELETE FROM {table} WHERE message_id = ?", stale)
    conn.executemany("INSERT INTO message_tags (message_id, tag) VALUES (?, ?)",
                     [(row["message_id"], t) for row, _ in rows for t in row["_tags"]])
    conn.executemany("INSERT INTO message_folders (message_id, folder) VALUES (?, ?)",
                     [(row["message_id"], f) for row, _ in rows for f in row["_folders"]])
    people = {row["message_id"]: _address_rows(row["message_id"], row["sender_email"],
                                               row["sender_name"], parsed)
              for row, parsed in rows}
    conn.executemany(_INSERT_ADDRESS, [p for found in people.values() for p in found])
    return {mid: {p[2] for p in found} for mid, found in people.items()}


_INSERT_ADDRESS = ("INSERT INTO message_addresses (message_id, role, email, name) "
                   "VALUES (?, ?, ?, ?)")


def _write_addresses(conn: sqlite3.Connection, mid: str, sender_email: str, sender_name: str,
                     parsed: Parsed) -> set[str]:
    """A message's rows of message_addresses, in place of those it had; returns its
    addresses."""
    conn.execute("DELETE FROM message_addresses WHERE message_id = ?", (mid,))
    people = _address_rows(mid, sender_email, sender_name, parsed)
    conn.executemany(_INSERT_ADDRESS, people)
    return {p[2] for p in people}


def _address_rows(mid: str, sender_email: str, sender_name: str,
                  parsed: Parsed) -> list[tuple[str, str, str, str]]:
    """A message's rows of message_addresses: (message_id, role, email, name)."""
    # Contacts count a person once whichever form of their domain (ACE or Unicode) mail wrote.
    people = ({(mid, "from", canonical_address(sender_email),
                _sender_name(Address(sender_name, sender_email), parsed))}
              if sender_email else set())
    people.update((mid, r["kind"], canonical_address(r["email"]), r["name"])
                  for r in parsed.recipients)
    if parsed.author is not None:
        people.add((mid, "author", canonical_address(parsed.author.address), parsed.author.name))
    # One row per (address, role): a message that names someone twice counts once.
    return list({(p[0], p[1], p[2]): p for p in people}.values())


def _address_rows_of(conn: sqlite3.Connection, mid: str) -> set[tuple[str, str, str, str]]:
    """The rows of message_addresses the mirror has for a message (see _address_rows)."""
    return set(conn.execute("SELECT message_id, role, email, name FROM message_addresses "
                            "WHERE message_id = ?", (mid,)))


def _sender_name(sender: Address, parsed: Parsed) -> str:
    """The name a message gives its sender's address: none when a list rewrote the From to
    its own address, whose name is then the author's ("Alice Smith via dev-list")."""
    rewritten = parsed.author is not None or (
        via_name(sender.name) is not None and list_rewrote(sender, parsed.list_id))
    return "" if rewritten else sender.name


# What of the mirror a contact's figures count (a message ``m``, one of its addresses ``a``):
# the mail sent or received, not drafts, which are neither (a draft to Anna is not mail to
# her, nor does an unsent draft make anyone seen); not spam (a spammer, or whom spam names,
# is no one to suggest) but for a blocked sender's own figures, from the mail the block made
# spam (the blocklist keeps the sender a contact, blocked: found by name to unblock); and a
# Bcc only on the user's own mail (the Sent copy keeps whom the user wrote to in Bcc), not the
# Bcc a sender's client left in mail the user received.  The author of list mail whose From
# the list rewrote ('author') counts as its sender, beside the list's address ('from'): its
# block too (the blocklist blocks it with its author).
_FROM_ROLES = ("from", "author")
_COUNTED = ("{m}.is_draft = 0 AND (NOT " + _TAGGED.format(m="{m}", tag=tags.SPAM)
            + " OR ({a}.role IN " + str(_FROM_ROLES) + " AND "
            + _TAGGED.format(m="{m}", tag=tags.BLOCKED) + "))"
            + " AND ({a}.role != 'bcc' OR {m}.is_sent = 1)")
# An address named only where nothing counts has no figures at all -- no row -- as for an
# address never written to.  A contact is named after the newest mail naming it; a "name"
# holding an @ is an address (as Outlook writes "bob@x" <bob@x>), which would hide the name
# other mail gives (_Added.add).
_STATS = """
INSERT INTO contact_stats (email_address, name, first_seen, last_seen, messages_from, messages_to)
SELECT a.email,
       (SELECT b.name FROM message_addresses b JOIN messages mb USING (message_id)
        WHERE b.email = a.email AND b.name != '' AND instr(b.name, '@') = 0
              AND """ + _COUNTED.format(m="mb", a="b") + """
        ORDER BY mb.date DESC LIMIT 1),
       min(m.date), max(m.date),
       count(DISTINCT CASE WHEN a.role IN """ + str(_FROM_ROLES) + """ THEN a.message_id END),
       count(DISTINCT CASE WHEN a.role NOT IN """ + str(_FROM_ROLES) + """ AND m.is_sent = 1
                           THEN a.message_id END)
FROM message_addresses a JOIN messages m USING (message_id)
WHERE ({where}) AND """ + _COUNTED.format(m="m", a="a") + """
GROUP BY a.email
ON CONFLICT (email_address) DO UPDATE SET
    name = excluded.name, first_seen = excluded.first_seen, last_seen = excluded.last_seen,
    messages_from = excluded.messages_from, messages_to = excluded.messages_to
"""


_STATS_ONE = _STATS.format(where="a.email = ?")
_STATS_ALL = _STATS.format(where="1")
# Past this many addresses one pass over the whole mirror beats one query per address.
STATS_IN_ONE_PASS = 2000


def refresh_stats(conn: sqlite3.Connection, addresses: Iterable[str]) -> None:
    """Recompute the harvested figures of these addresses from the mirror."""
    wanted = set(addresses)
    if len(wanted) > STATS_IN_ONE_PASS:
        conn.execute("DELETE FROM contact_stats")
        conn.execute(_STATS_ALL)
        return
    for address in wanted:
        conn.execute("DELETE FROM contact_stats WHERE email_address = ?", (address,))
        conn.execute(_STATS_ONE, (address,))


@dataclass
class _Added:
    """One address's figures over the messages a sync added."""

    sent_from: set[str] = field(default_factory=set)
    sent_to: set[str] = field(default_factory=set)  # the user's own messages naming it
    first: str | None = None
    last: str | None = None
    named: tuple[str | None, str] | None = None  # (date, name) of the newest naming it
    unsure: bool = False  # two newest namings of one date disagree

    def add(self, role: str, name: str, mid: str, date: str | None, is_sent: int) -> None:
        if role in _FROM_ROLES:
            self.sent_from.add(mid)
        elif is_sent:
            self.sent_to.add(mid)
        self.first, self.last = _edge(min, self.first, date), _edge(max, self.last, date)
        if name and "@" not in name:  # as _STATS names contacts
            if self.named is None or _later(date, self.named[0]):
                self.named, self.unsure = (date, name), False
            elif date == self.named[0] and name != self.named[1]:
                self.unsure = True


def _edge(pick: Callable[[list[str]], str], *dates: str | None) -> str | None:
    known = [d for d in dates if d is not None]
    return pick(known) if known else None


def _later(date: str | None, than: str | None) -> bool:
    """As _STATS orders dates newest first: any date is later than none."""
    return date is not None and (than is None or date > than)


def add_to_stats(conn: sqlite3.Connection, message_ids: Sequence[str], *,
                 skip: set[str]) -> set[str]:
    """Add messages new to the mirror to their addresses' figures (all but ``skip``; what
    _STATS does not count adds nothing), which stand for every other message of theirs;
    returns the addresses to recount instead: a new address, or one whose name the new
    messages may or may not change (_STATS names a contact after the newest message that
    names it, and a figure does not say how new its name is unless the new message is newer
    than any)."""
    added: dict[str, _Added] = {}
    for chunk in chunks(message_ids, 500):
        marks = ",".join("?" * len(chunk))
        for email, role, name, mid, date, is_sent in conn.execute(
                f"SELECT a.email, a.role, a.name, a.message_id, m.date, m.is_sent "
                f"FROM message_addresses a JOIN messages m USING (message_id) "
                f"WHERE a.message_id IN ({marks}) AND {_COUNTED.format(m='m', a='a')}",
                chunk):
            if email not in skip:
                added.setdefault(email, _Added()).add(role, name, mid, date, is_sent)
    recount: set[str] = set()
    updates = []
    for chunk in chunks(sorted(added), 500):
        marks = ",".join("?" * len(chunk))
        had = {row[0]: row[1:] for row in conn.execute(
            f"SELECT email_address, name, first_seen, last_seen, messages_from, messages_to "
            f"FROM contact_stats WHERE email_address IN ({marks})", chunk)}
        for email in chunk:
            new = added[email]
            if email not in had:
                recount.add(email)
                continue
            name, first, last, sent_from, sent_to = had[email]
            if new.named is not None and new.named[1] != name:
                if new.unsure or not (name is None or _later(new.named[0], last)):
                    recount.add(email)
                    continue
                name = new.named[1]
            updates.append((name, _edge(min, first, new.first), _edge(max, last, new.last),
                            sent_from + len(new.sent_from), sent_to + len(new.sent_to), email))
    conn.executemany("UPDATE contact_stats SET name = ?, first_seen = ?, last_seen = ?, "
                     "messages_from = ?, messages_to = ? WHERE email_address = ?", updates)
    return recount


def my_addresses(config: Config) -> frozenset[str]:
    """The user's addresses as :func:`canonical_address` writes them, senders being compared
    in that form (their sub-addresses too: is_own_address): notmuch's ``from:`` (and so the
    ``sent`` tag) matches mail writing a domain in ACE (``xn--``) or in Unicode alike."""
    return frozenset(search_forms(config.addresses))


def _set_me(conn: sqlite3.Connection, me: frozenset[str]) -> bool:
    """Store the user's addresses; True when they changed (is_sent must then be recomputed)."""
    before = {r[0] for r in conn.execute("SELECT email FROM me")}
    if before == me:
        return False
    conn.execute("DELETE FROM me")
    conn.executemany("INSERT INTO me (email) VALUES (?)", [(a,) for a in sorted(me)])
    conn.execute("UPDATE messages SET is_sent = ("
                 + sidecar.is_mine_sql("canonical_address(sender_email)") + " AND is_draft = 0)")
    sidecar.rebuild_threads(conn)
    return True


# ---------------------------------------------------------------------------------------------
# The sync


@dataclass(frozen=True)
class _Loaded:
    """One batch as read before its write transaction: what the mirror had, what notmuch has
    (None: gone), and the parsed files of the messages new to the mirror -- ``fresh()``,
    which waits for the worker processes parsing them (the first time)."""

    known: dict[str, tuple[Parsed, frozenset[str]]]
    messages: list[IndexedMessage | None]
    fresh: Callable[[], dict[str, Parsed]]


def _ready(parsed: dict[str, Parsed]) -> Callable[[], dict[str, Parsed]]:
    return lambda: parsed


class Mirror:
    """Syncs one sidecar connection from one notmuch reader (both used from one thread)."""

    def __init__(self, config: Config, reader: Reader, conn: sqlite3.Connection, *,
                 batch_size: int = BATCH_SIZE,
                 on_batch: Callable[[int], None] | None = None,
                 new_since: int | None = None,
                 on_progress: ProgressCallback | None = None,
                 on_marked: Callable[[list[tuple[str, str | None]]], None] | None = None,
                 on_moved: Callable[[list[str]], None] | None = None,
                 on_gone: Callable[[dict[str, Gone]], None] | None = None,
                 prefetched: Mapping[str, Parsed] | None = None,
                 mark_new: bool = True, tagged: frozenset[str] = frozenset()) -> None:
        self.config = config
        self.reader = reader
        # False: the mail new to the mirror has its final tags already (passes.first_index);
        # ``tagged``: these messages have (passes.delivery).
        self.mark_new = mark_new
        self.tagged = tagged
        self.conn = conn
        self.batch_size = batch_size
        self.on_batch = on_batch  # called after each committed batch (tests use it to crash)
        # Called after each committed batch with the (Message-ID, List-Id) it marked for
        # tagging, so the tagging pass can start on them while the mirror goes on.
        self.on_marked = on_marked
        self._marked: list[tuple[str, str | None]] = []
        # Called after each committed batch with the messages the mirror knew whose files are
        # in other folders now, so their place tags can follow (passes.tagging.settle_places).
        self.on_moved = on_moved
        self._moved: list[str] = []
        # Called with the messages the index dropped, as the mirror knew them, before they
        # leave it (a held copy of one takes its place: passes.holds).
        self.on_gone = on_gone
        self.layout = Layout(config)
        self.me = my_addresses(config)
        self.exclusions = frozenset(reader.search_exclusions())
        self.new_is_pending = new_tag_is_pending(reader)
        # Which messages new to the mirror are new mail, to be tagged (passes.tagging): in an
        # incremental sync all of them; in a full build (first index, or the sidecar was
        # deleted) only those changed since ``new_since`` -- the revision before this index
        # run, when the caller knows it -- never the whole mailbox again.
        self.new_since = new_since
        self._workers = parse_workers()
        self._pool: ProcessPoolExecutor | None = None
        # Files parsed while notmuch new ran (passes.prefetch), by file name.
        self.prefetched: Mapping[str, Parsed] = prefetched or {}
        self._prefetch_used = 0
        self.on_progress = on_progress
        self._recent: frozenset[str] | None = None
        # Addresses whose contact figures changed: refreshed once, at the end of the sync
        # (per batch, an address in every batch -- the user's own -- was recounted each time).
        self._touched: set[str] = set()
        self._fresh: list[str] = []  # messages this sync added (their figures are added up)
        self._marked_dirty = False  # this sync set STATS_DIRTY itself (not a crashed one)

    def sync(self, *, full: bool = False) -> MirrorReport:
        report = MirrorReport()
        commit = self.reader.commit_stamp()  # before anything is read: later commits differ
        rev = self.reader.revision()
        report.revision, report.uuid = rev.number, rev.uuid
        if not full and self._older_than_mirrored(rev):
            # This reader's snapshot predates what another process mirrored already: there is
            # nothing new in it, and what it lacks (newer mail) must not be dropped as removed.
            log.debug("sidecar: snapshot at revision %d is older than the mirror", rev.number)
            return report
        with sidecar.transaction(self.conn):
            if full or sidecar.get_state(self.conn, "notmuch_uuid") != rev.uuid:
                setup = sidecar.get_state(self.conn, SETUP_REVISION) or ""
                compacted = None if full else self._compacted_at(rev)
                pending = [mid for mid, _ in sidecar.pending_tagging(self.conn)]
                self._reset(rev.uuid)
                report.full = True
                # Kept until the build is done, so a build resumed after a crash still knows.
                # Mail indexed after the setup but before this run (init's own first pass
                # without hooks, a `notmuch new --no-hooks`) is new mail too; so is mail
                # changed since the mirror's last sync of a database compacted since.
                first = setup if self.new_since is None or (
                    setup and int(setup) < self.new_since) else str(self.new_since)
                if compacted is not None and self.new_since is None:
                    first, by_hand = compacted
                    # tagged by a pass before, then changed by hand: no new mail
                    self.tagged |= by_hand
                sidecar.set_state(self.conn, "full_build_new_since", first)
                # Mail a post-new pass that failed left untagged stays marked for the next.
                sidecar.set_state(self.conn, FULL_BUILD_PENDING,
                                  json.dumps(pending) if pending else None)
                sidecar.set_state(self.conn, SETUP_REVISION, None)
            if (since := sidecar.get_state(self.conn, "full_build_new_since")) is not None:
                self._recent = frozenset(
                    self.reader.message_ids(f"lastmod:{int(since) + 1}..") if since else ()
                ) | frozenset(json.loads(sidecar.get_state(self.conn, FULL_BUILD_PENDING) or "[]"))
            if sidecar.follow_exclusions(self.conn, sorted(self.exclusions)):
                log.info("sidecar: searches now leave out %s", ", ".join(sorted(self.exclusions)))
            if _set_me(self.conn, self.me):
                # A Bcc counts on the user's own mail alone: one that had no figures may now.
                refresh_stats(self.conn, [r[0] for r in self.conn.execute(
                    "SELECT email_address FROM contact_stats "
                    "UNION SELECT email FROM message_addresses WHERE role = 'bcc'")])
        while (window := self._next_window(rev.number)) is not None:
            self._apply_window(window, report)
        with sidecar.transaction(self.conn):
            sidecar.set_state(self.conn, "full_build_new_since", None)
            sidecar.set_state(self.conn, FULL_BUILD_PENDING, None)
        # A message leaves the index only in a commit -- one that does not move the revision
        # (notmuch's lastmod) -- so removals are looked for once per commit, as the commit
        # marker tells them apart: a count of every message (8 ms at 100k) on every sync
        # would find none.
        if commit is None or sidecar.get_state(self.conn, REMOVALS_CHECKED) != commit:
            self._drop_removed(report)
            if commit is not None:
                with sidecar.transaction(self.conn):
                    sidecar.set_state(self.conn, REMOVALS_CHECKED, commit)
        for reparse in sidecar.REPARSES:
            if (after := sidecar.get_state(self.conn, reparse.key)) is not None:
                self._reparse(reparse, after, report)
        report.recounted = self._refresh_stats()
        report.prefetched = self._prefetch_used
        return report

    def _older_than_mirrored(self, rev: Revision) -> bool:
        state = sidecar.mirror_state(self.conn)
        return (state.revision is not None and rev.number < state.revision
                and state.uuid == rev.uuid)

    def _compacted_at(self, rev: Revision) -> tuple[str, frozenset[str]] | None:
        """The revision the mirror was synced to and the mirrored messages changed since (by
        hand, in a mail client), when the database under this new UUID is the mirrored one
        compacted (``notmuch compact`` gives a new UUID and keeps each message's lastmod):
        every mirrored message is there, at that revision or before unless changed since.
        A rebuilt database counts lastmod afresh, one per message, so it seldom matches,
        and when it does, little of it is changed after that revision."""
        state = sidecar.mirror_state(self.conn)
        if state.uuid is None or state.revision is None or rev.number < state.revision:
            return None
        mirrored = self.conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        kept = self.reader.count(f"lastmod:0..{state.revision}", exclude_tags=())
        changed = self.reader.message_ids(f"lastmod:{state.revision + 1}..")
        by_hand = frozenset(sidecar.dates_of(self.conn, changed))
        if not mirrored or kept + len(by_hand) != mirrored:
            return None
        return str(state.revision), by_hand

    def _reset(self, uuid: str) -> None:
        log.info("sidecar: full rebuild of the mirror (new notmuch database %s)", uuid)
        self.conn.execute("DELETE FROM messages")  # cascades to tags, folders, addresses
        self.conn.execute("DELETE FROM contact_stats")
        self.conn.execute("DELETE FROM thread_rows")  # the messages are gone: so are threads
        sidecar.set_state(self.conn, "notmuch_uuid", uuid)
        sidecar.set_state(self.conn, "revision", None)
        sidecar.set_state(self.conn, "window", None)
        sidecar.set_state(self.conn, REMOVALS_CHECKED, None)
        for reparse in sidecar.REPARSES:  # every file is parsed anew
            sidecar.set_state(self.conn, reparse.key, None)

    def _next_window(self, current: int) -> _Window | None:
        pending = _Window.load(sidecar.get_state(self.conn, "window"))
        if pending is not None:
            return pending
        done = sidecar.get_state(self.conn, "revision")
        start = 0 if done is None else int(done) + 1
        return _Window(start, current) if start <= current else None

    def _apply_window(self, window: _Window, report: MirrorReport) -> None:
        query = "*" if window.start == 0 else f"lastmod:{window.start}..{window.stop}"
        ids = sorted(i for i in self.reader.message_ids(query) if i > window.after)
        done = 0
        if self.on_progress is not None and ids:
            self.on_progress(SIDECAR, 0, len(ids))
        batches = list(chunks(ids, self.batch_size))
        # Read and parse before the write transaction: parsing is most of a batch, and a
        # transaction held that long makes every other sidecar writer (the tagging pass
        # clearing its marks, a write tool's audit entry) wait for it.  The next batch is read
        # and handed to the parsing workers before this one is written, so that they parse
        # while this process writes (batches are disjoint: writing one changes nothing the
        # next one reads from the mirror).
        upcoming = self._load_batch(batches[0]) if batches else None
        for number, chunk in enumerate(batches):
            assert upcoming is not None
            loaded = upcoming
            loaded.fresh()  # waited for here, outside the transaction
            upcoming = (self._load_batch(batches[number + 1]) if number + 1 < len(batches)
                        else None)
            with sidecar.transaction(self.conn):
                self._mark_stats_dirty()
                self._marked, self._moved = [], []
                self._apply_batch(chunk, loaded, report)
                window.after = chunk[-1]
                sidecar.set_state(self.conn, "window", window.dump())
            if self.on_marked is not None and self._marked:
                self.on_marked(self._marked)
            if self.on_moved is not None and self._moved:
                self.on_moved(self._moved)
            if self.on_batch is not None:
                self.on_batch(len(chunk))
            done += len(chunk)
            if self.on_progress is not None:
                self.on_progress(SIDECAR, done, len(ids))
        with sidecar.transaction(self.conn):
            sidecar.set_state(self.conn, "revision", str(window.stop))
            sidecar.set_state(self.conn, "window", None)

    def _mark_stats_dirty(self) -> None:
        """Within a transaction that changes what figures count: should the process die
        before _refresh_stats, the next sync recounts them all."""
        if not self._marked_dirty:
            dirty_before = sidecar.get_state(self.conn, sidecar.STATS_DIRTY) is not None
            sidecar.set_state(self.conn, sidecar.STATS_DIRTY, "1")
            self._marked_dirty = not dirty_before

    def _load_batch(self, ids: Sequence[str]) -> _Loaded:
        known = _known(self.conn, ids)
        messages = self.reader.find_many(ids)
        fresh = self._parse_new([m for m in messages if m is not None
                                 and m.message_id not in known])
        return _Loaded(known, messages, fresh)

    def _apply_batch(self, ids: Sequence[str], loaded: _Loaded, report: MirrorReport) -> None:
        known, messages, fresh = loaded.known, loaded.messages, loaded.fresh()
        # A message can change threads (a late parent joins two): both rows are recomputed.
        threads = _threads_of(self.conn, ids)
        people_before = _people_of(self.conn, [mid for mid in ids if mid in known])
        gone: list[str] = []
        rows: list[tuple[dict[str, Any], Parsed]] = []
        for mid, message in zip(ids, messages):
            if message is None:  # removed since the id list was taken
                gone.append(mid)
                continue
            parsed, files = known.get(mid, (None, frozenset()))
            if parsed is None:
                parsed = fresh[mid]
                report.parsed += 1
            elif files != set(message.filenames):
                parsed = self._parse(message, parsed)
                report.parsed += 1
                if self._folders(files) != self._folders(message.filenames):
                    self._moved.append(mid)
            row = build_row(message, parsed, self.layout, self.me, self.exclusions,
                            new_is_pending=self.new_is_pending)
            if self.mark_new and mid not in known and mid not in self.tagged and (
                    self._recent is None or mid in self._recent):
                row["needs_tagging"] = 1
                self._marked.append((mid, parsed.list_id))
            rows.append((row, parsed))
        # Contact figures depend on a message's people, date and whether it is a draft, spam
        # or blocked, not on its other tags or its files: a message whose people changed (a
        # draft sent, a draft, spam or blocked tag set or taken off) is counted again for its old and new addresses; one new
        # to the mirror is added to its addresses' figures (see _refresh_stats).
        recount = {row["message_id"] for row, _ in rows if row["message_id"] in people_before
                   and _people(row) != people_before[row["message_id"]]}
        self._touched |= _addresses_of(self.conn, sorted(recount))
        addresses = _write_rows(self.conn, rows, known)
        for row, _ in rows:
            mid = row["message_id"]
            if mid not in people_before:
                self._fresh.append(mid)
            elif mid in recount:
                self._touched |= addresses[mid]
            threads.add(row["thread_id"])
            report.upserted += 1
        self._delete(gone, report)
        sidecar.refresh_threads(self.conn, threads)

    def _reparse(self, reparse: sidecar.Reparse, after: str, report: MirrorReport) -> None:
        """Parse again the files of the rows a parse of an older version may have got wrong
        (see sidecar.REPARSES), after the Message-ID ``after``, updating only what the
        parse changed; a batch at a time, so a killed run goes on from its last batch."""
        rows = self.conn.execute(
            f"SELECT message_id, filenames, sender_email, sender_name, recipients FROM messages "
            f"WHERE message_id > ? AND ({reparse.rows}) ORDER BY message_id", (after,)).fetchall()
        names = [json.loads(row[1]) for row in rows]
        if self.on_progress is not None and rows:  # minutes at 100k: say so
            self.on_progress(SIDECAR, 0, len(rows))
        with closing(parse_in_order([files[0] if files else "" for files in names])) as parses:
            self._write_reparsed(reparse.key, rows, names, parses, report)
        with sidecar.transaction(self.conn):
            sidecar.set_state(self.conn, reparse.key, None)

    def _write_reparsed(self, key: str, rows: Sequence[tuple[str, str, str, str, str]],
                        names: Sequence[list[str]], parses: Iterator[Parsed],
                        report: MirrorReport) -> None:
        for start in range(0, len(rows), self.batch_size):
            updates = []
            people = []  # rows whose people the parse changed
            for (mid, _, sender_email, sender_name, recipients), files, parsed in zip(
                    rows[start:start + self.batch_size], names[start:start + self.batch_size],
                    parses):
                if parsed.size is None and len(files) > 1:  # the first copy is gone
                    parsed = parse_file(files[1:])
                if parsed.size is None:  # no file to read: the row stays as it was
                    continue
                updates.append((int(parsed.has_attachment), parsed.body_preview, mid))
                if (parsed.recipients != json.loads(recipients)
                        or set(_address_rows(mid, sender_email, sender_name, parsed))
                        != _address_rows_of(self.conn, mid)):
                    people.append((mid, sender_email, sender_name, parsed))
            with sidecar.transaction(self.conn):
                # max(): the tag's answer, already in the column, covers files attached past
                # the head parse_file reads.
                self.conn.executemany("UPDATE messages SET has_attachment = "
                                      "max(has_attachment, ?), body_preview = ? "
                                      "WHERE message_id = ?", updates)
                if people:  # their old and new addresses are recounted
                    self._mark_stats_dirty()
                    self._touched |= _addresses_of(self.conn, [p[0] for p in people])
                for mid, sender_email, sender_name, parsed in people:
                    self.conn.execute("UPDATE messages SET recipients = ? WHERE message_id = ?",
                                      (json.dumps(parsed.recipients, ensure_ascii=False), mid))
                    self._touched |= _write_addresses(self.conn, mid, sender_email, sender_name,
                                                      parsed)
                last = rows[min(start + self.batch_size, len(rows)) - 1][0]
                sidecar.set_state(self.conn, key, last)
            report.parsed += len(updates)
            if self.on_batch is not None:
                self.on_batch(len(updates))
            if self.on_progress is not None:
                self.on_progress(SIDECAR, min(start + self.batch_size, len(rows)), len(rows))

    def _folders(self, filenames: Iterable[str]) -> set[str | None]:
        return {notmuch_folder(name, self.config.mail_root) for name in filenames}

    def _parse_new(self, messages: Sequence[IndexedMessage]) -> Callable[[], dict[str, Parsed]]:
        """Parse the files of messages the mirror has not seen: in worker processes when there
        are many (a first index), since parsing is most of the build and needs no notmuch;
        the result waits for them.  A file parsed while notmuch new ran is not parsed again
        (the first name is the one :func:`parse_file` would read)."""
        done = {m.message_id: p for m in messages
                if m.filenames and (p := self.prefetched.get(m.filenames[0])) is not None}
        messages = [m for m in messages if m.message_id not in done]
        self._prefetch_used += len(done)
        names = [m.filenames for m in messages]
        if len(names) >= PARALLEL_PARSE_MIN and (pool := self._parse_pool()) is not None:
            try:
                parsing = pool.map(parse_file, names, chunksize=PARSE_CHUNK)  # submitted now
            except (BrokenExecutor, OSError) as exc:
                self._no_workers(exc)
            else:
                @functools.cache
                def collected() -> dict[str, Parsed]:
                    try:
                        return done | {m.message_id: p for m, p in zip(messages, parsing)}
                    except (BrokenExecutor, OSError) as exc:
                        self._no_workers(exc)
                        return done | {m.message_id: parse_file(m.filenames) for m in messages}
                return collected
        return _ready(done | {m.message_id: parse_file(m.filenames) for m in messages})

    def _no_workers(self, exc: BaseException) -> None:
        log.warning("parsing in worker processes failed (%s); parsing here", exc)
        self._workers = 0

    def _parse_pool(self) -> ProcessPoolExecutor | None:
        if self._pool is None and self._workers > 1:
            self._pool = parse_pool(self._workers)
            if self._pool is None:
                self._workers = 0
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _parse(self, message: IndexedMessage, known: Parsed | None) -> Parsed:
        # A draft's new file is the draft saved again under its Message-ID: new content.
        if known is not None and tags.DRAFT not in message.tags:
            # Same Message-ID, same content: a moved or renamed file changes only the size we
            # report if the copy differs; keep the parsed fields, refresh the size cheaply.
            for name in message.filenames:
                try:
                    return replace(known, size=os.stat(name).st_size)
                except OSError:
                    continue
            return known
        return parse_file(message.filenames)

    def _refresh_stats(self) -> int:
        """Bring the figures of the addresses this sync touched up to date -- all of them if
        a sync died before its refresh or a migration changed what they count (the
        STATS_DIRTY mark, which a sync sets with its first batch):
        recounted for the addresses of changed or removed messages, added up from the new
        messages alone for the others (their other messages did not change).  Returns how
        many were recounted."""
        dirty = sidecar.get_state(self.conn, sidecar.STATS_DIRTY) is not None
        if not self._touched and not self._fresh and not dirty:
            return 0
        with sidecar.transaction(self.conn):
            if dirty and not self._marked_dirty:
                self.conn.execute("DELETE FROM contact_stats")
                self.conn.execute(_STATS_ALL)
                recounted = int(self.conn.execute(
                    "SELECT count(*) FROM contact_stats").fetchone()[0])
            else:
                recount = set(self._touched)
                if len(self._fresh) > STATS_IN_ONE_PASS:  # a first build: one pass beats sums
                    recount |= _addresses_of(self.conn, self._fresh)
                else:
                    recount |= add_to_stats(self.conn, self._fresh, skip=recount)
                refresh_stats(self.conn, recount)
                recounted = len(recount)
            sidecar.set_state(self.conn, sidecar.STATS_DIRTY, None)
        self._touched, self._fresh = set(), []
        return recounted

    def _delete(self, ids: Sequence[str], report: MirrorReport) -> None:
        if not ids:
            return
        if self.on_gone is not None:
            self.on_gone(_last_known(self.conn, ids))
        self._touched |= _addresses_of(self.conn, ids)
        threads = _threads_of(self.conn, ids)
        for chunk in chunks(ids, 500):
            marks = ",".join("?" * len(chunk))
            self.conn.execute(f"DELETE FROM messages WHERE message_id IN ({marks})", chunk)
        # Gone from notmuch (expunged from Trash or Junk, deleted): there is no mail left to
        # unblock; a blocked message still in Junk or Trash is still in notmuch, and kept.
        sidecar.forget_pre_block(self.conn, ids)
        sidecar.refresh_threads(self.conn, threads)
        report.removed += len(ids)

    # -- removals ------------------------------------------------------------------------------

    def _drop_removed(self, report: MirrorReport) -> None:
        """Find messages the index no longer has: compare counts, then folders, then ids."""
        if self._surplus() <= 0:
            return
        suspects: set[str] = set()
        for folder, mirrored in self.conn.execute(
                "SELECT folder, count(*) FROM message_folders GROUP BY folder").fetchall():
            indexed = self.reader.count(folders_query([folder]), exclude_tags=())
            if mirrored > indexed:
                present = set(self.reader.message_ids(folders_query([folder])))
                suspects.update(r[0] for r in self.conn.execute(
                    "SELECT message_id FROM message_folders WHERE folder = ?", (folder,))
                    if r[0] not in present)
        if not suspects:  # the folders did not explain it: compare every id
            present = set(self.reader.message_ids("*"))
            suspects = {r[0] for r in self.conn.execute("SELECT message_id FROM messages")
                        if r[0] not in present}
        ordered = sorted(suspects)
        for chunk in chunks(ordered, self.batch_size):
            with sidecar.transaction(self.conn):
                # A suspect may have moved after our window: refresh it instead of dropping it.
                still = [m for m, found in zip(chunk, self.reader.find_many(chunk)) if found]
                self._delete([m for m in chunk if m not in set(still)], report)
                if still:
                    self._apply_batch(still, self._load_batch(still), report)

    def _surplus(self) -> int:
        mirrored = self.conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        return int(mirrored) - self.reader.count("*", exclude_tags=())


# ---------------------------------------------------------------------------------------------
# Checking


def check(config: Config, reader: Reader, conn: sqlite3.Connection, *,
          parse_files: bool = False) -> list[str]:
    """Every difference between the mirror and notmuch (and, with ``parse_files``, the files);
    an empty list means the mirror is exact."""
    problems: list[str] = []
    layout = Layout(config)
    me = my_addresses(config)
    exclusions = frozenset(reader.search_exclusions())
    new_is_pending = new_tag_is_pending(reader)
    rev = reader.revision()
    if sidecar.get_state(conn, "notmuch_uuid") != rev.uuid:
        problems.append("the mirror was built from another notmuch database (uuid differs)")
    mirrored = {r[0]: r for r in conn.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM messages")}
    indexed = reader.message_ids("*")
    for mid in sorted(set(mirrored) - set(indexed)):
        problems.append(f"{mid}: in the mirror but not in notmuch")
    for chunk in chunks(sorted(indexed), 500):
        for mid, message in zip(chunk, reader.find_many(chunk)):
            row = mirrored.get(mid)
            if message is None:
                continue
            if row is None:
                problems.append(f"{mid}: in notmuch but not in the mirror")
                continue
            have = dict(zip(_COLUMNS, row))
            parsed = parse_file(message.filenames) if parse_files else Parsed(
                json.loads(have["recipients"]), have["list_id"], have["body_preview"], have["size"],
                bool(have["has_attachment"]))
            want = build_row(message, parsed, layout, me, exclusions,
                             new_is_pending=new_is_pending)
            for column in _COLUMNS:
                if have[column] != want[column]:
                    problems.append(f"{mid}: {column} is {have[column]!r}, notmuch says {want[column]!r}")
            problems.extend(_check_children(conn, mid, want))
            if parse_files:
                problems.extend(_check_author(conn, mid, parsed))
    if sidecar.recorded_exclusions(conn) != exclusions:
        problems.append(f"the mirror's exclusions are {sorted(sidecar.recorded_exclusions(conn))}, "
                        f"searches leave out {sorted(exclusions)}")
    return problems + sidecar.thread_problems(conn) + sidecar.count_problems(conn)


def _check_author(conn: sqlite3.Connection, mid: str, parsed: Parsed) -> list[str]:
    have = conn.execute("SELECT email, name FROM message_addresses "
                        "WHERE message_id = ? AND role = 'author'", (mid,)).fetchone()
    want = (None if parsed.author is None
            else (canonical_address(parsed.author.address), parsed.author.name))
    return [] if have == want else [f"{mid}: author is {have!r}, the file says {want!r}"]


def _check_children(conn: sqlite3.Connection, mid: str, want: dict[str, Any]) -> list[str]:
    problems = []
    tags = sorted(r[0] for r in conn.execute("SELECT tag FROM message_tags WHERE message_id = ?", (mid,)))
    if tags != want["_tags"]:
        problems.append(f"{mid}: message_tags {tags} differ from {want['_tags']}")
    folders = sorted(r[0] for r in conn.execute(
        "SELECT folder FROM message_folders WHERE message_id = ?", (mid,)))
    if folders != want["_folders"]:
        problems.append(f"{mid}: message_folders {folders} differ from {want['_folders']}")
    return problems


# ---------------------------------------------------------------------------------------------
# Entry points used by the CLI, the hook and the server

# Sidecar state: the notmuch revision `fmail-nm init` found; the first full build tags only
# what was indexed after it (see Mirror).
SETUP_REVISION = "setup_revision"
# ... the messages marked for the tagging pass before a full build (JSON), marked again by it.
FULL_BUILD_PENDING = "full_build_pending"
# ... and the notmuch commit (Reader.commit_stamp) whose removed messages it has dropped.
REMOVALS_CHECKED = "removals_checked"


class SyncInProgress(BackendError):
    """Another process is syncing the sidecar right now."""


@contextmanager
def sync_lock(path: Path, *, wait: float) -> Iterator[None]:
    """One sync at a time per sidecar, across processes (the hook, the server, the CLI): two
    would do the same work twice and could set the sync position back.  ``wait``: the
    seconds a sync running elsewhere is waited for (``math.inf``: until it ends), then
    :class:`SyncInProgress`."""
    private_dir(path.parent)
    with open(path.with_name(path.name + ".sync-lock"), "a") as fh:
        if wait == math.inf:
            fcntl.flock(fh, fcntl.LOCK_EX)
        elif not flock_within(fh, wait):
            raise SyncInProgress("another fmail-nm process is syncing the sidecar")
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sync_sidecar(config: Config, reader: Reader, *, full: bool = False,
                 wait: float = math.inf, new_since: int | None = None,
                 on_progress: ProgressCallback | None = None,
                 on_marked: Callable[[list[tuple[str, str | None]]], None] | None = None,
                 on_moved: Callable[[list[str]], None] | None = None,
                 on_gone: Callable[[dict[str, Gone]], None] | None = None,
                 prefetched: Mapping[str, Parsed] | None = None,
                 tagged: frozenset[str] = frozenset(), mark_new: bool = True) -> MirrorReport:
    """Bring the sidecar up to date with notmuch.  A sync already running elsewhere is waited
    for ``wait`` seconds (:func:`sync_lock`), then raises :class:`SyncInProgress`.
    ``new_since``: the notmuch revision before the index run that brought new mail (see
    :class:`Mirror`); ``prefetched``: files parsed already (:mod:`fmail_nm.passes.prefetch`);
    ``tagged``: new messages that have their final tags already
    (:mod:`fmail_nm.passes.delivery`); ``on_gone``: told the messages the index dropped, as
    the mirror knew them; ``mark_new`` false: no message is marked for the tagging pass (the
    mail of a setup)."""
    path = sidecar.sidecar_path(config.data_dir)
    with sync_lock(path, wait=wait), sidecar.opened(path) as conn:
        mirror = Mirror(config, reader, conn, new_since=new_since, on_progress=on_progress,
                        on_marked=on_marked, on_moved=on_moved, on_gone=on_gone,
                        prefetched=prefetched, tagged=tagged, mark_new=mark_new)
        try:
            return mirror.sync(full=full)
        finally:
            mirror.close()
