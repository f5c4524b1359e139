"""The read tools as plain functions: the MCP layer wraps these, tests call them directly.

Listings come from the index alone (no message file is opened); only tools that return a body
or an attachment read a file, and only the files of the messages they return.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timezone
from pathlib import Path

from ..clock import iso_from_epoch, utc_now
from ..config import Config
from ..dsl import CompiledQuery, DslContext, DslError, compile_query
from ..errors import CallerError
from ..message.attachments import attachment_text
from ..message.headers import Address
from ..message.html import read_message
from ..message.mime import ParsedMessage
from ..message.text import clean_text, slice_text
from ..store import maildir, sidecar
from ..store.notmuch import IndexedMessage, Reader, ThreadNode
from ..store.query import clean_id, me_query, quote
from ..tags import DEFAULT_EXCLUDED, DELETED, DRAFT, SPAM
from . import dto

MAX_LIMIT = 500
DEFAULT_LIMIT = 50
# The notmuch query is echoed for the model to check what ran; a long one is cut, since the
# answer must stay small whatever the input (the query itself is limited by the DSL).
MAX_ECHOED_QUERY = 500
MAX_CURSOR_CHARS = 200
MAX_DATE_CHARS = 40
SORTS = ("newest", "oldest")


class ToolError(CallerError):
    """A request the caller can fix (unknown id, bad cursor, bad search); the text says how."""


@dataclass
class Mailbox:
    """What every read needs: the resolved config, a reader (on the caller's thread) and a clock."""

    config: Config
    reader: Reader
    clock: Callable[[], datetime] = utc_now

    def dsl_context(self) -> DslContext:
        return DslContext(
            now=self.clock(),
            accounts={a.name: a.maildir for a in self.config.accounts},
            folder_roles=self.config.roles(),
            folders=self.config.folders,
            excluded_tags=self.reader.exclude_tags() or DEFAULT_EXCLUDED,
        )

    def compile(self, text: str) -> CompiledQuery:
        try:
            return compile_query(text or "", self.dsl_context())
        except DslError as exc:
            raise ToolError(str(exc)) from None

    def find(self, ref: str) -> IndexedMessage | None:
        """A message by Message-ID (with or without <> or id:) or by its sidecar ``uid``."""
        mid = clean_id(ref)
        found = self.reader.find(mid)
        if found is None and sidecar.looks_like_uid(mid):
            resolved = sidecar.lookup_uids(self.config.data_dir, [mid]).get(mid)
            found = self.reader.find(resolved) if resolved else None
        return found

    def folders_of(self, message: IndexedMessage) -> list[str]:
        return maildir.folders_of(self.config.mail_root, message.filenames)

    def account_of(self, folders: Sequence[str]) -> str | None:
        account = maildir.account_of(self.config, folders)
        return account.name if account is not None else None


# ---------------------------------------------------------------------------------------------
# Small conversions


def person(header: str) -> dto.Person:
    name, address = email.utils.parseaddr(header)
    return dto.Person(name=name, address=address.lower())


def people(addresses: Sequence[Address]) -> list[dto.Person]:
    return [dto.Person(name=a.name, address=a.address.lower()) for a in addresses]


# Recipients shown per message in listings (the sidecar keeps them all).
LISTED_RECIPIENTS = 5


def recipients_of(mb: Mailbox, messages: Sequence[IndexedMessage]) -> dict[str, list[dto.Person]]:
    """The first To/Cc recipients of a page's messages, from the sidecar mirror in one read (no
    file is opened); a message the mirror does not have yet has none."""
    rows = sidecar.recipients_of(mb.config.data_dir, [m.message_id for m in messages])
    return {mid: [dto.Person(name=r["name"], address=r["email"])
                  for r in people[:LISTED_RECIPIENTS]] for mid, people in rows.items()}


def email_ref(mb: Mailbox, m: IndexedMessage, to: list[dto.Person]) -> dto.EmailRef:
    folders = mb.folders_of(m)
    return dto.EmailRef(
        id=m.message_id, thread_id=m.thread_id, subject=m.subject, from_=person(m.from_header),
        to=to,
        date=iso_from_epoch(m.date), account=mb.account_of(folders), folders=folders, tags=sorted(m.tags),
        is_read="unread" not in m.tags, is_flagged="flagged" in m.tags,
        has_attachment="attachment" in m.tags,
    )


def clamp_limit(limit: int) -> int:
    if limit < 1:
        raise ToolError("limit must be at least 1")
    return min(limit, MAX_LIMIT)


def _parse_when(value: str, name: str, end: bool) -> int:
    """An ISO date or datetime as epoch seconds; a bare date means the start (or, for an upper
    bound, the end) of that day in UTC."""
    if len(value) > MAX_DATE_CHARS:
        raise ToolError(f"{name} must be an ISO 8601 date or datetime, e.g. 2026-03-01")
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            moment = datetime.combine(day, time.max if end else time.min, timezone.utc)
        else:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
    except ValueError:
        raise ToolError(f"{name} must be an ISO 8601 date or datetime, e.g. 2026-03-01 "
                        f"(got {value!r})") from None
    return int(moment.timestamp())


def scoped_query(mb: Mailbox, compiled: CompiledQuery, *, since: str | None = None,
                 until: str | None = None, account: str | None = None,
                 extra: str | None = None) -> str:
    parts = [] if compiled.query.strip() == "*" else [f"({compiled.query})"]
    if since or until:
        start = _parse_when(since, "since", end=False) if since else 0
        stop = _parse_when(until, "until", end=True) if until else 2**32
        parts.append(f"date:@{start}..@{stop}")
    if account:
        acct = mb.config.account(account)
        if acct.maildir != ".":
            parts.append(f"path:{quote(acct.maildir + '/**')}")
    if extra:
        parts.append(f"({extra})")
    return " AND ".join(parts) or "*"


# Cursors carry the offset and a fingerprint of the request, so a cursor from one search cannot
# silently page through another.


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:12]


def make_cursor(offset: int, fingerprint: str) -> str:
    raw = json.dumps({"o": offset, "f": fingerprint}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_cursor(cursor: str | None, fingerprint: str) -> int:
    if not cursor:
        return 0
    if len(cursor) > MAX_CURSOR_CHARS:
        raise ToolError("bad cursor: pass next_cursor exactly as returned")
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        offset, fp = int(data["o"]), str(data["f"])
    except (ValueError, KeyError, TypeError):
        raise ToolError("bad cursor: pass next_cursor exactly as returned") from None
    if offset < 0:
        raise ToolError("bad cursor: its offset is negative; pass next_cursor exactly as returned")
    if fp != fingerprint:
        raise ToolError("bad cursor: it belongs to a different search; start again without a cursor")
    return offset


def next_cursor(offset: int, page: int, total: int, fingerprint: str) -> str | None:
    return make_cursor(offset + page, fingerprint) if offset + page < total else None


# ---------------------------------------------------------------------------------------------
# Tools


def search_emails(mb: Mailbox, query: str = "", limit: int = DEFAULT_LIMIT,
                  cursor: str | None = None, since: str | None = None,
                  until: str | None = None, sort: str = "newest",
                  account: str | None = None) -> dto.SearchResult:
    if sort not in SORTS:
        raise ToolError(f"sort must be one of {', '.join(SORTS)}")
    limit = clamp_limit(limit)
    compiled = mb.compile(query)
    nm_query = scoped_query(mb, compiled, since=since, until=until, account=account)
    fp = _fingerprint("search", nm_query, compiled.exclude_tags, sort)
    offset = read_cursor(cursor, fp)
    total = mb.reader.count(nm_query, exclude_tags=compiled.exclude_tags)
    page = mb.reader.messages(nm_query, exclude_tags=compiled.exclude_tags, sort=sort,
                              offset=offset, limit=limit)
    changed = mb.reader.changed_at()
    cursor_out = next_cursor(offset, len(page), total, fp)
    to = recipients_of(mb, page)
    return dto.SearchResult(results=[email_ref(mb, m, to.get(m.message_id, [])) for m in page],
                            total=total,
                            next_cursor=cursor_out, query=echoed_query(nm_query),
                            hidden=_hidden(mb, nm_query, compiled, total, cursor_out),
                            indexed_at=iso_from_epoch(int(changed)) if changed else None)


def echoed_query(nm_query: str) -> str:
    if len(nm_query) <= MAX_ECHOED_QUERY:
        return nm_query
    return nm_query[:MAX_ECHOED_QUERY] + f"… ({len(nm_query)} characters)"


def _hidden(mb: Mailbox, nm_query: str, compiled: CompiledQuery, total: int,
            cursor: str | None) -> int | None:
    """On the last page: how many more messages match among the excluded (spam, deleted)
    ones, so "0 results" never hides that a blocked sender's mail is there.  One count,
    only when there are exclusions and no further page."""
    if cursor is not None or not compiled.exclude_tags:
        return None
    hidden = mb.reader.count(nm_query, exclude_tags=()) - total
    return hidden if hidden > 0 else None


def list_threads(mb: Mailbox, query: str = "in:inbox", since: str | None = None,
                 until: str | None = None, unread_only: bool = False,
                 limit: int = DEFAULT_LIMIT, cursor: str | None = None) -> dto.ThreadList:
    limit = clamp_limit(limit)
    compiled = mb.compile(query)
    nm_query = scoped_query(mb, compiled, since=since, until=until,
                            extra="tag:unread" if unread_only else None)
    fp = _fingerprint("threads", nm_query, compiled.exclude_tags)
    offset = read_cursor(cursor, fp)
    total = mb.reader.count_threads(nm_query, exclude_tags=compiled.exclude_tags)
    page = mb.reader.threads(nm_query, exclude_tags=compiled.exclude_tags, offset=offset, limit=limit)
    refs = []
    for t in page:
        unread = mb.reader.count(f"thread:{quote(t.thread_id)} AND tag:unread",
                                 exclude_tags=compiled.exclude_tags)
        authors = [a.strip() for a in t.authors.replace("|", ",").split(",") if a.strip()]
        refs.append(dto.ThreadRef(
            thread_id=t.thread_id, subject=t.subject, authors=authors,
            oldest=iso_from_epoch(t.oldest) or "", newest=iso_from_epoch(t.newest) or "",
            message_count=t.message_count, matched_count=t.matched_count, unread_count=unread,
            tags=sorted(t.tags)))
    return dto.ThreadList(threads=refs, total=total,
                          next_cursor=next_cursor(offset, len(page), total, fp))


def _read_file(m: IndexedMessage) -> bytes:
    for name in m.filenames:
        try:
            return Path(name).read_bytes()
        except OSError:
            continue
    raise ToolError(f"the file of message {m.message_id} is gone from disk; re-index "
                    "(fmail-nm index) and try again")


def _find(mb: Mailbox, message_id: str) -> IndexedMessage:
    found = mb.find(message_id)
    if found is None:
        raise ToolError(f"no message with id {message_id!r}; use an id from search_emails "
                        "or a uid from query_emails")
    return found


def _body(parsed: ParsedMessage, body_format: str, max_chars: int, offset: int) -> dto.Body:
    if body_format not in ("clean", "full"):
        raise ToolError("body_format must be clean or full")
    if max_chars < 1 or offset < 0:
        raise ToolError("max_body_chars must be positive and body_offset not negative")
    text = clean_text(parsed.text) if body_format == "clean" else parsed.text
    piece = slice_text(text, max_chars, offset)
    return dto.Body(text=piece.text, format=body_format, offset=piece.offset,
                    total_chars=piece.total_chars, truncated=piece.truncated,
                    next_offset=piece.next_offset, html_present=parsed.html_present)


def _email_full(mb: Mailbox, m: IndexedMessage, *, max_body_chars: int, body_offset: int,
                body_format: str) -> dto.EmailFull:
    parsed = read_message(_read_file(m))
    folders = mb.folders_of(m)
    return dto.EmailFull(
        id=m.message_id, thread_id=m.thread_id, subject=parsed.subject or m.subject,
        from_=people(parsed.from_) or [person(m.from_header)], to=people(parsed.to),
        cc=people(parsed.cc), reply_to=people(parsed.reply_to),
        date=parsed.date.isoformat().replace("+00:00", "Z") if parsed.date else iso_from_epoch(m.date),
        list_id=parsed.list_id, in_reply_to=parsed.in_reply_to, references=parsed.references,
        account=mb.account_of(folders), folders=folders, tags=sorted(m.tags),
        body=_body(parsed, body_format, max_body_chars, body_offset),
        attachments=[dto.Attachment(index=a.index, filename=a.filename,
                                    content_type=a.content_type, size=a.size)
                     for a in parsed.attachments],
        problems=parsed.defects,
    )


def get_email(mb: Mailbox, id: str, max_body_chars: int = 8000, body_offset: int = 0,
              body_format: str = "clean") -> dto.EmailFull:
    return _email_full(mb, _find(mb, id), max_body_chars=max_body_chars,
                       body_offset=body_offset, body_format=body_format)


def get_emails_content(mb: Mailbox, ids: Sequence[str], max_body_chars: int = 4000,
                       body_format: str = "clean") -> dto.EmailsContent:
    if len(ids) > 50:
        raise ToolError("at most 50 ids per call")
    emails, missing = [], []
    for mid in ids:
        try:
            m = _find(mb, mid)
        except ToolError:
            missing.append(mid)
            continue
        emails.append(_email_full(mb, m, max_body_chars=max_body_chars, body_offset=0,
                                  body_format=body_format))
    return dto.EmailsContent(emails=emails, not_found=missing)


def get_thread(mb: Mailbox, thread_id: str, include_bodies: bool = True,
               max_body_chars: int = 8000, body_format: str = "clean",
               max_total_chars: int = 60000) -> dto.ThreadFull:
    tid = thread_id.removeprefix("thread:")
    nodes = mb.reader.thread(tid)
    if not nodes:
        raise ToolError(f"no thread with id {thread_id!r}; use a thread_id from a search")
    budget = max_total_chars
    truncated = False
    messages = []
    for node in nodes:
        body = None
        if include_bodies and budget > 0:
            parsed = read_message(_read_file(node.message))
            body = _body(parsed, body_format, min(max_body_chars, budget), 0)
            budget -= len(body.text)
        elif include_bodies:
            truncated = True
        messages.append(_thread_message(node, body))
    return dto.ThreadFull(thread_id=tid, subject=nodes[0].message.subject,
                          message_count=len(nodes), messages=messages, truncated=truncated)


def _thread_message(node: ThreadNode, body: dto.Body | None) -> dto.ThreadMessage:
    m = node.message
    return dto.ThreadMessage(id=m.message_id, depth=node.depth, in_reply_to=node.parent_id,
                             subject=m.subject, from_=person(m.from_header),
                             date=iso_from_epoch(m.date), tags=sorted(m.tags), body=body)


def find_unanswered_threads(mb: Mailbox, since: str | None = None, address: str | None = None,
                            min_days_silent: int = 0, limit: int = DEFAULT_LIMIT,
                            cursor: str | None = None) -> dto.UnansweredList:
    """Threads whose newest message is the user's, with nothing from anyone after it."""
    limit = clamp_limit(limit)
    mine = [address.lower()] if address else list(mb.config.addresses)
    if not mine:
        raise ToolError("no addresses of yours are configured; pass address=")
    # Drafts were never sent: they neither make a thread "unanswered" nor count as its end.
    nm_query = scoped_query(mb, CompiledQuery("*", ()), since=since,
                            extra=f"{me_query(mine)} AND NOT tag:draft")
    now = int(mb.clock().timestamp())
    found: list[tuple[IndexedMessage, int]] = []
    for thread in mb.reader.threads(nm_query, exclude_tags=mb.reader.exclude_tags()):
        nodes = mb.reader.thread(thread.thread_id)
        live = [n.message for n in nodes if not (n.message.tags & {DELETED, SPAM, DRAFT})]
        if not live:
            continue
        last = max(live, key=lambda m: m.date)
        if person(last.from_header).address not in mine:
            continue
        silent = max(0, (now - last.date) // 86400)
        if silent >= min_days_silent:
            found.append((last, len(nodes)))
    found.sort(key=lambda item: item[0].date, reverse=True)
    fp = _fingerprint("unanswered", nm_query, min_days_silent, mine)
    offset = read_cursor(cursor, fp)
    page = found[offset:offset + limit]
    threads = []
    stored = recipients_of(mb, [last for last, _ in page])
    for last, count in page:
        recipients = stored.get(last.message_id) or _recipients(mb, last)
        threads.append(dto.UnansweredThread(
            thread_id=last.thread_id, subject=last.subject,
            days_silent=max(0, (now - last.date) // 86400), message_count=count,
            recipients=recipients, last_outgoing=email_ref(mb, last, recipients)))
    return dto.UnansweredList(threads=threads, total=len(found),
                              next_cursor=next_cursor(offset, len(page), len(found), fp))


def _recipients(mb: Mailbox, m: IndexedMessage) -> list[dto.Person]:
    # Not in the mirror yet (a sync in flight): read this page's rows only.
    pairs = email.utils.getaddresses([mb.reader.header(m.message_id, "To"),
                                      mb.reader.header(m.message_id, "Cc")])
    return [dto.Person(name=n, address=a.lower()) for n, a in pairs if a]


def get_attachment(mb: Mailbox, id: str, index: int, max_chars: int = 20000) -> dto.AttachmentContent:
    m = _find(mb, id)
    try:
        content = attachment_text(_read_file(m), index, max_chars)
    except LookupError as exc:
        raise ToolError(str(exc)) from None
    info = content.info
    return dto.AttachmentContent(
        id=m.message_id,
        attachment=dto.Attachment(index=info.index, filename=info.filename,
                                  content_type=info.content_type, size=info.size),
        text=content.text, truncated=content.truncated, note=content.note)


def list_tags(mb: Mailbox) -> dto.TagList:
    return dto.TagList(tags=[dto.TagCount(tag=t, count=mb.reader.count(f"tag:{quote(t)}", exclude_tags=()))
                             for t in mb.reader.all_tags()])


def list_folders(mb: Mailbox, account: str | None = None) -> dto.FolderList:
    accounts = [mb.config.account(account)] if account else list(mb.config.accounts)
    folders = []
    for folder in mb.config.folders:
        owner = mb.config.account_for_path(folder)
        if owner is None or owner not in accounts:
            continue
        role = next((r for r, f in owner.folders.items() if f == folder), None)
        q = f"folder:{quote(folder)}"
        folders.append(dto.FolderInfo(folder=folder, account=owner.name, role=role,
                                      total=mb.reader.count(q, exclude_tags=()),
                                      unread=mb.reader.count(f"{q} AND tag:unread", exclude_tags=())))
    return dto.FolderList(folders=folders)


def list_available_accounts(mb: Mailbox) -> dto.AccountList:
    return dto.AccountList(accounts=[
        dto.AccountInfo(name=a.name, addresses=list(a.addresses), folder=a.maildir,
                        roles=dict(a.folders), mbsync_channel=a.mbsync_channel)
        for a in mb.config.accounts])
