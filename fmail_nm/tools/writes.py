"""The write tools as plain functions: which messages a call writes, the caller's limits and
the result it gets.  The MCP layer wraps these; tests call them directly.

What a write does to each message -- tags, Maildir flags, folder moves, the audit log and undo
-- is the write engine's (:mod:`fmail_nm.passes.changes`).  Here: selection by ids (Message-IDs
or sidecar uids) or by a search, and the double check for searches -- without
``confirm_count`` equal to the number of matches a call only reports that number.  No call
touches more than ``MAX_BATCH`` messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import Field, PrivateAttr

from .. import tags
from ..clock import MACHINE_ZONE
from ..config import ROOT_FOLDER, Account, Config, ConfigError
from ..dsl import CompiledQuery
from ..passes import changes
from ..passes.blocklist import apply_blocklist, read_blocklist
from ..passes.changes import BatchReport, Step, WriteContext
from ..passes.tagging import filed_tags
from ..store import maildir, sidecar
from ..store.query import id_forms
from . import sql as sqltools
from .dto import Dto
from .reads import Mailbox, ToolError, is_thread_id

MAX_BATCH = 500
SAMPLE_SIZE = 5
MAX_TAG_LENGTH = 100
MAX_FOLDER_CHARS = 255
_FOLDER_LIST_LIMIT = 20


class WriteError(ToolError):
    """A write (or one message of it) could not be done; the text says why and what to do."""


class WriteErrorItem(Dto):
    id: str = Field(description="Message-ID")
    error: str


class WriteResult(Dto):
    applied: list[str] = Field(default_factory=list,
                               description="Message-IDs now in the requested state")
    not_found: list[str] = Field(default_factory=list, description="ids not in the index")
    errors: list[WriteErrorItem] = Field(default_factory=list,
                                         description="messages that could not be (fully) written")
    dry_run: bool = Field(default=False, description="true: nothing was changed")
    match_count: int | None = Field(default=None,
                                    description="messages the query (or ids) selected")
    sample_ids: list[str] = Field(default_factory=list,
                                  description="a few of the selected Message-IDs (dry runs)")
    audit_id: int | None = Field(default=None,
                                 description="audit log entry; undo_last_write reverts it")
    accounts: list[str] = Field(default_factory=list,
                                description="accounts whose files changed, when more than one")
    # A search's write previewed: it runs only when confirm_count repeats match_count.
    needs_confirm: bool = Field(default=False, exclude=True)
    # Of ``applied``, those that were in the requested state already.  Their text says so:
    # a write that changed nothing has no audit entry, and undo_last_write would revert an
    # earlier one.  Not in the structured content (``applied`` already describes them).
    unchanged: list[str] = Field(default_factory=list, exclude=True)


# ---------------------------------------------------------------------------------------------
# Which messages a call writes


@dataclass(frozen=True)
class Selection:
    ids: Sequence[str] | None
    query: str | None
    confirm_count: int | None
    dry_run: bool

    def params(self) -> dict[str, Any]:
        return {"ids": list(self.ids) if self.ids else None, "query": self.query}


@dataclass(frozen=True)
class Target:
    message_ids: list[str]
    asked: dict[str, str]  # Message-ID -> the id as the caller wrote it, for not_found
    match_count: int | None  # set for query selections


def _from_ids(ctx: WriteContext, ids: Sequence[str]) -> Target:
    cleaned = [_message_id(ctx, i) for i in ids]
    uids = [c for c in cleaned if sidecar.looks_like_uid(c)]
    by_uid = sidecar.lookup_uids(ctx.config.data_dir, uids) if uids else {}
    _refuse_thread_ids(ctx, [i for i, c in zip(ids, cleaned) if c not in by_uid])
    asked: dict[str, str] = {}
    for original, mid in zip(ids, cleaned):
        asked.setdefault(by_uid.get(mid, mid), original)
    return Target(message_ids=list(asked), asked=asked, match_count=None)


def _refuse_thread_ids(ctx: WriteContext, refs: Sequence[str]) -> None:
    """A thread's id (list_threads lists them, shaped like uids) names no message: said at
    once, with the query that selects the thread, rather than reported as not found."""
    for ref in refs:
        if is_thread_id(ctx.reader, ref) and ctx.reader.find_first(id_forms(ref)) is None:
            thread = "thread:" + ref.strip().removeprefix("thread:")
            raise ToolError(f"{ref!r} is a thread's id, not a message's: pass "
                            f"query='{thread}' to change the thread; nothing was changed")


def _message_id(ctx: WriteContext, ref: str) -> str:
    """The Message-ID (or uid) ``ref`` names: cleaned, unless only the id exactly as given
    is in the index (see id_forms)."""
    forms = id_forms(ref) or [ref]
    if len(forms) == 1:  # a uid or a plain id: nothing to choose, no lookup
        return forms[0]
    found = ctx.reader.find_first(forms)
    return forms[0] if found is None else found.message_id


def _check_batch(count: int, part: str = "") -> None:
    if count > MAX_BATCH:
        raise ToolError(f"{count} messages selected; one write takes at most {MAX_BATCH} -- "
                        f"narrow the query (after:, before:, from:, in:) or split the ids{part}")


def _from_query(ctx: WriteContext, query: str) -> Target:
    mailbox = Mailbox(ctx.config, ctx.reader, ctx.clock)
    compiled = mailbox.compile(query)
    # Count first: listing every match of a broad query costs far more than refusing it.
    count = ctx.reader.count(compiled.query, exclude_tags=compiled.exclude_tags)
    if count > MAX_BATCH:
        _check_batch(count, _newest_part(mailbox, query, compiled))
    mids = ctx.reader.message_ids(compiled.query, exclude_tags=compiled.exclude_tags)
    return Target(message_ids=mids, asked={}, match_count=len(mids))


def _newest_part(mailbox: Mailbox, query: str, compiled: CompiledQuery) -> str:
    """A query for the newest part of a selection too large for one write, said so that the
    caller need not find dates that split it: the days after the one its MAX_BATCH-th newest
    message is dated; "" when that part is empty (so many messages in one day) or the query
    has no room left for it (the DSL's limits on words, characters and nesting)."""
    reader = mailbox.reader
    last = reader.messages(compiled.query, exclude_tags=compiled.exclude_tags,
                           offset=MAX_BATCH - 1, limit=1)
    if not last:  # the matches went below the bound since they were counted
        return ""
    day = datetime.fromtimestamp(last[0].date, MACHINE_ZONE).date() + timedelta(days=1)
    part = f"({query}) after:{day.isoformat()}"
    try:
        newer = mailbox.compile(part)
    except ToolError:  # the refusal is still the answer, only without the suggestion
        return ""
    count = reader.count(newer.query, exclude_tags=newer.exclude_tags)
    return f"; query='{part}' selects the newest {count} of them" if count else ""


def _select(ctx: WriteContext, sel: Selection) -> Target:
    if sel.ids and sel.query:
        raise ToolError("pass either ids or query, not both")
    if not sel.ids and not (sel.query or "").strip():
        raise ToolError("pass ids (Message-IDs or uids) or a query to say which messages")
    target = _from_ids(ctx, sel.ids) if sel.ids else _from_query(ctx, sel.query or "")
    _check_batch(len(target.message_ids))  # a query's matches may have grown since the count
    return target


def _preview(ctx: WriteContext, sel: Selection, target: Target) -> WriteResult | None:
    """The report a call gets instead of a write: a dry run, or a query not yet confirmed."""
    if sel.query and sel.confirm_count is not None and sel.confirm_count != target.match_count:
        raise WriteError(f"confirm_count {sel.confirm_count} does not match the "
                         f"{target.match_count} messages the query selects now; nothing was "
                         "changed. Check the query, then call again with confirm_count="
                         f"{target.match_count} if that is what the user wants")
    if sel.query and sel.confirm_count is None:
        return WriteResult(dry_run=True, match_count=target.match_count,
                           sample_ids=target.message_ids[:SAMPLE_SIZE], needs_confirm=True)
    if not sel.dry_run:
        return None
    found = [m for m in target.message_ids if ctx.reader.find(m) is not None]
    known = set(found)
    missing = [target.asked.get(m, m) for m in target.message_ids if m not in known]
    return WriteResult(dry_run=True, match_count=len(found), sample_ids=found[:SAMPLE_SIZE],
                       not_found=missing)


# ---------------------------------------------------------------------------------------------
# Running a write


class UndoResult(WriteResult):
    """A write undone: ``applied`` are the messages put back, ``audit_id`` the entry undone."""

    # What of a contacts write was left as later writes set it, one line per contact.
    _kept: list[str] = PrivateAttr(default_factory=list)

    @property
    def kept(self) -> list[str]:
        return self._kept


def _result(config: Config, report: BatchReport, match_count: int | None) -> WriteResult:
    return WriteResult(**_reported(config, report), match_count=match_count)


def _reported(config: Config, report: BatchReport) -> dict[str, Any]:
    # The accounts whose servers get this change (a message may have a copy in each), named
    # only when there are several: one account is the usual case, not worth the words.
    accounts = sorted(changes.touched_accounts(config, report.changes))
    changed = {change["message_id"] for change in report.changes}
    failed = {mid for mid, _ in report.errors}
    return {"applied": report.applied, "not_found": report.not_found,
            "errors": [WriteErrorItem(id=mid, error=why) for mid, why in report.errors],
            "audit_id": report.audit_id, "accounts": accounts if len(accounts) > 1 else [],
            "unchanged": [mid for mid in report.applied if mid not in changed | failed]}


def _write(ctx: WriteContext, action: str, sel: Selection, step: Step,
           **params: Any) -> WriteResult:
    target = _select(ctx, sel)
    preview = _preview(ctx, sel, target)
    if preview is not None:
        return preview
    report = changes.apply(ctx, action, {**sel.params(), **params}, target.message_ids, step,
                           asked=target.asked)
    return _result(ctx.config, report, target.match_count)


# ---------------------------------------------------------------------------------------------
# Tags and flags


def set_read(ctx: WriteContext, ids: Sequence[str] | None, is_read: bool, *,
             query: str | None = None, confirm_count: int | None = None,
             dry_run: bool = False) -> WriteResult:
    """Mark messages read or unread (the ``unread`` tag; Maildir flag S follows)."""
    step = changes.tag_step(remove=["unread"]) if is_read else changes.tag_step(add=["unread"])
    return _write(ctx, "set_read", Selection(ids, query, confirm_count, dry_run), step,
                  is_read=is_read)


def update_email_status(ctx: WriteContext, ids: Sequence[str] | None, mark_as: str, *,
                        query: str | None = None, confirm_count: int | None = None,
                        dry_run: bool = False) -> WriteResult:
    """``mark_as`` is 'read' or 'unread'."""
    choice = mark_as.strip().lower()
    if choice not in ("read", "unread"):
        raise ToolError(f"mark_as must be 'read' or 'unread' (got {mark_as!r})")
    return set_read(ctx, ids, choice == "read", query=query, confirm_count=confirm_count,
                    dry_run=dry_run)


def set_flagged(ctx: WriteContext, ids: Sequence[str] | None, flagged: bool, *,
                query: str | None = None, confirm_count: int | None = None,
                dry_run: bool = False) -> WriteResult:
    """Flag (star) or unflag messages (the ``flagged`` tag; Maildir flag F follows)."""
    step = changes.tag_step(add=["flagged"]) if flagged else changes.tag_step(remove=["flagged"])
    return _write(ctx, "set_flagged", Selection(ids, query, confirm_count, dry_run), step,
                  flagged=flagged)


def check_tag(tag: str, *, removing: bool = False) -> str:
    """A tag name as notmuch and its query syntax take it, or a ToolError saying what is wrong."""
    if not tag:
        raise ToolError("tag names must not be empty")
    if any(c.isspace() for c in tag):
        raise ToolError(f"tag {tag!r} contains whitespace")
    # A control or invisible character: listings cannot show the tag as it is, so the model
    # could not name it again (and libnotmuch ends the tag at a NUL).
    if not tag.isprintable():
        raise ToolError(f"tag {tag!r} contains a control or invisible character")
    if tag.startswith("-"):
        raise ToolError(f"tag {tag!r} starts with '-': " + (
            f"name the tag itself ({tag.lstrip('-')!r})" if removing
            else "list it under remove instead"))
    if len(tag) > MAX_TAG_LENGTH:
        raise ToolError(f"tag {tag[:20]!r}... is longer than {MAX_TAG_LENGTH} characters")
    return tag


def check_added_tag(tag: str) -> str:
    check_tag(tag)
    if tag in tags.RESERVED:
        raise ToolError(f"tag {tag!r} is reserved: notmuch gives it to mail it has just "
                        "indexed and the next index run removes it; choose another name")
    return tag


# The tools that change what a place tag or ``blocked`` says, for tag_emails to name.
_OWNING_TOOLS = {
    tags.DELETED: "delete_messages moves mail to Trash; restore brings it back",
    tags.SPAM: "move_to_junk moves mail to Junk; restore brings it back",
    tags.ARCHIVED: "archive moves mail to Archive; move_to_folder moves it elsewhere",
}
_FOLDER_RULE_TOOL = "a tagging rule in fmail.toml gives it to mail in a folder: move_to_folder"


def _check_not_owned(config: Config, tag: str) -> str:
    """Refuse a tag that says which folder a message is filed in (passes.tagging.filed_tags)
    or that the blocklist keeps: set by hand it would leave the file where it is -- still in
    the server's inbox, say -- while the tags say otherwise."""
    if tag == tags.BLOCKED:
        raise ToolError("tag 'blocked' is the blocklist's: block or unblock the sender with "
                        "manage_contacts_sql (is_blocked); nothing was changed")
    if tag in filed_tags(config):
        raise ToolError(f"tag {tag!r} says which folder a message is in, and a tag alone "
                        f"leaves its file where it is: {_OWNING_TOOLS.get(tag, _FOLDER_RULE_TOOL)}"
                        "; nothing was changed")
    return tag


def tag_emails(ctx: WriteContext, ids: Sequence[str] | None = None, add: Sequence[str] = (),
               remove: Sequence[str] = (), *, query: str | None = None,
               confirm_count: int | None = None, dry_run: bool = False) -> WriteResult:
    """Add and remove tags; flag tags (unread, flagged, replied, ...) rename files to match.
    Place tags and ``blocked`` are refused (:func:`_check_not_owned`)."""
    adds = [_check_not_owned(ctx.config, check_added_tag(t)) for t in add]
    removes = [_check_not_owned(ctx.config, check_tag(t, removing=True)) for t in remove]
    if not adds and not removes:
        raise ToolError("give at least one tag to add or remove")
    if both := sorted(set(adds) & set(removes)):
        raise ToolError(f"tags both added and removed: {', '.join(both)}")
    return _write(ctx, "tag_emails", Selection(ids, query, confirm_count, dry_run),
                  changes.tag_step(adds, removes), add=adds, remove=removes)


# ---------------------------------------------------------------------------------------------
# Moves


def _only(ctx: WriteContext, account: str | None) -> changes.Accounts:
    """The accounts a move acts in: the one the caller named (which must exist), else every
    account holding a copy."""
    if account is None:
        return None
    try:
        return frozenset({ctx.config.account(account).name})
    except ConfigError as exc:
        raise ToolError(str(exc)) from None


def delete_messages(ctx: WriteContext, ids: Sequence[str] | None = None, *,
                    query: str | None = None, confirm_count: int | None = None,
                    dry_run: bool = False, account: str | None = None) -> WriteResult:
    """Move each copy of messages to its account's Trash folder (tags: +deleted -inbox)."""
    return _write(ctx, "delete", Selection(ids, query, confirm_count, dry_run),
                  changes.move_to_role_step("trash", _only(ctx, account)), account=account)


def move_to_junk(ctx: WriteContext, ids: Sequence[str] | None = None, *,
                 query: str | None = None, confirm_count: int | None = None,
                 dry_run: bool = False, account: str | None = None) -> WriteResult:
    """Move each copy of messages to its account's Junk folder (tags: +spam -inbox)."""
    return _write(ctx, "junk", Selection(ids, query, confirm_count, dry_run),
                  changes.move_to_role_step("junk", _only(ctx, account)), account=account)


def archive(ctx: WriteContext, ids: Sequence[str] | None = None, *, query: str | None = None,
            confirm_count: int | None = None, dry_run: bool = False,
            account: str | None = None) -> WriteResult:
    """Move the inbox copies of messages to their accounts' Archive folders (+archived -inbox)."""
    return _write(ctx, "archive", Selection(ids, query, confirm_count, dry_run),
                  changes.archive_step(_only(ctx, account)), account=account)


def _folder_name(folder: str) -> str:
    """A folder name that cannot leave the mail root or name a Maildir's own directories."""
    if len(folder) > MAX_FOLDER_CHARS:
        raise ToolError(f"folder names are at most {MAX_FOLDER_CHARS} characters")
    name = folder.strip().strip("/")
    parts = name.split("/")
    if not name or any(p in ("", ".", "..", ".notmuch", *maildir.MAILDIR_SUBDIRS) for p in parts):
        raise ToolError(f"bad folder name {folder!r}: give a folder like 'Archive' or "
                        "'Projects/2026' (list_folders shows them)")
    return name


def resolve_folder(config: Config, account: Account, folder: str) -> str:
    """A folder relative to the account ('Archive', 'Projects/2026') or to the mail root
    ('work/INBOX'), or the server's name for it ('Entwürfe' for 'Entw&APw-rfe' on disk), as
    a folder relative to the mail root; it must exist in the config or on disk.  "." is a
    mail root that is itself a Maildir, as list_folders names it."""
    name = ROOT_FOLDER if folder.strip() == ROOT_FOLDER else _folder_name(folder)
    inside = name if account.maildir == "." or name == ROOT_FOLDER else f"{account.maildir}/{name}"
    for candidate in dict.fromkeys((inside, name)):
        if not maildir.is_known_folder(config, candidate):
            continue
        owner = config.account_for_path(candidate)
        if owner == account:
            return candidate
        # Another account's folder is another server's mailbox: mail never moves there.
        raise WriteError(f"folder {candidate!r} is in account "
                         f"{owner.name if owner else '(none)'!r}; messages move only within "
                         f"their own account ({account.name!r})")
    # The server's name ("[Gmail]/All Mail", "Entwürfe"), however the store spells it on disk.
    for candidate, mailbox in config.mailbox_names.items():
        if mailbox == name and config.account_for_path(candidate) == account:
            return candidate
    known = [f for f in config.folders if config.account_for_path(f) == account]
    shown = ", ".join(known[:_FOLDER_LIST_LIMIT])
    if len(known) > _FOLDER_LIST_LIMIT:
        shown += ", ..."
    raise WriteError(f"no folder {folder!r} in account {account.name!r} or under the mail root "
                     f"(folders of {account.name}: {shown or 'none'})")


def _check_folder_exists(config: Config, folder: str, account: str | None) -> None:
    """Refuse a folder that exists in no account the write may act in, before selecting
    anything (per message it is checked again, for each account holding a copy)."""
    accounts = [config.account(account)] if account else list(config.accounts)
    for acct in accounts:
        try:
            resolve_folder(config, acct, folder)
            return
        except WriteError:
            if len(accounts) == 1:
                raise
    shown = ", ".join(config.folders[:_FOLDER_LIST_LIMIT])
    if len(config.folders) > _FOLDER_LIST_LIMIT:
        shown += ", ..."
    raise WriteError(f"no folder {folder!r} in any account; nothing was changed (folders: "
                     f"{shown or 'none'}; list_folders shows them all)")


def move_to_folder(ctx: WriteContext, ids: Sequence[str] | None, folder: str, *,
                   query: str | None = None, confirm_count: int | None = None,
                   dry_run: bool = False, account: str | None = None) -> WriteResult:
    """Move messages' files to a folder, each within its own account; place tags follow its
    role."""
    only = _only(ctx, account)
    _check_folder_exists(ctx.config, folder, account)
    return _write(ctx, "move_to_folder", Selection(ids, query, confirm_count, dry_run),
                  changes.move_to_folder_step(
                      lambda acct: resolve_folder(ctx.config, acct, folder), only),
                  folder=folder, account=account)


def restore(ctx: WriteContext, ids: Sequence[str] | None = None, *, query: str | None = None,
            confirm_count: int | None = None, dry_run: bool = False,
            account: str | None = None) -> WriteResult:
    """Move messages out of Trash/Junk back to the folder they were deleted from (else the
    inbox); tags: -deleted -spam, +inbox when back in the inbox (unless it is the user's own
    mail, a draft or list mail, which the post-new rules keep out of the inbox too)."""
    return _write(ctx, "restore", Selection(ids, query, confirm_count, dry_run),
                  changes.restore_step(_only(ctx, account)), account=account)


# ---------------------------------------------------------------------------------------------
# Undo


def undo_last_write(ctx: WriteContext, audit_id: int | None = None) -> UndoResult:
    """Revert the latest write not yet undone that this session made -- or the write
    ``audit_id``, whoever made it: its tags, and files moved back into the folders they came
    from (into ``cur/``, keeping the flags they have now).  Repeated calls walk back through
    older writes."""
    undone = changes.undo_last(ctx, restore_rows=sqltools.restore_contacts, audit_id=audit_id)
    if undone is None:
        raise ToolError("nothing to undo: no recorded write is left that has not been undone")
    _follow_undone_blocks(ctx, undone.entry)
    result = UndoResult(**_reported(ctx.config, undone.report))
    result._kept = undone.kept
    return result


def _follow_undone_blocks(ctx: WriteContext, entry: sidecar.AuditEntry) -> None:
    """After undoing a block or an unblock, the mail it did not record -- a blocked sender's
    new mail the hook blocked, or mail let in after an unblock -- follows the blocklist as it
    is now, as after any blocklist change (moves recorded as the blocklist's, not undone)."""
    if any(sqltools.block_changes(entry.contact_rows)):
        apply_blocklist(ctx.config, ctx.reader, ctx.writer, read_blocklist(ctx.config),
                        after_write=ctx.after_write, reindex=ctx.reindex)
