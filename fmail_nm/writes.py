"""The write tools as plain functions: tags, Maildir flags and folder moves, each audited and
undoable.  The MCP layer wraps these; tests call them directly.

Every write is a tag change or a file rename that mbsync pushes back (DESIGN.md, principle 3):

* read/unread and flagged are tags; ``WriteTxn.change_tags`` renames the files so their Maildir
  flags (S, F) say the same.
* archive, delete, junk, move and restore rename files into another folder (see
  :mod:`fmail_nm.mover` for how, and for which copies of a message are moved) and then set the
  place tags (inbox, deleted, spam, archived) the post-new rules would give there.

A batch runs in one write session on the writer thread, so it either starts or -- when another
program holds the notmuch lock for too long -- does nothing and says "database busy".  Inside
a batch each message is done on its own: one that fails is reported in ``errors`` and the
rest still apply.  What each applied write changed (tags, files, and the origin folders kept for
restore) goes to the sidecar's audit log, from which :func:`undo_last_write` reverts it.

Writes picked by a query are double-checked: without ``confirm_count`` equal to the number of
matches they only report that number.  No call touches more than ``MAX_BATCH`` messages.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from . import mover, sidecar, sqltools
from .config import Account, Config, ConfigError
from .dto import Dto
from .nm import IndexedMessage, NotmuchAccessError, Reader, WriteTxn, Writer
from .reads import Mailbox, ToolError, clean_id

log = logging.getLogger(__name__)

MAX_BATCH = 500
SAMPLE_SIZE = 5
MAX_TAG_LENGTH = 100
MAX_FOLDER_CHARS = 255
# Message property: JSON {file key: folder it was moved from}, for files we moved into Trash or
# Junk.  It lives in notmuch, so restore still knows the way back after a sidecar rebuild.
ORIGIN_PROPERTY = "fmail.origin"
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


@dataclass(frozen=True)
class WriteOutcome:
    """What a write changed, for the caller's follow-up work (sidecar sync, mbsync push)."""

    action: str
    result: WriteResult
    message_ids: tuple[str, ...]  # messages whose tags or files changed
    accounts: frozenset[str]  # accounts whose files changed on disk: these need a push


@dataclass
class WriteContext:
    """What every write needs.  Use it on the reader's thread: the writer has its own."""

    config: Config
    reader: Reader
    writer: Writer
    sidecar_file: Path
    after_write: Callable[[WriteOutcome], None] | None = None

    def mailbox(self) -> Mailbox:
        return Mailbox(self.config, self.reader)


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
    cleaned = [clean_id(i) for i in ids]
    uids = [c for c in cleaned if sidecar.looks_like_uid(c)]
    by_uid = sidecar.lookup_uids(ctx.config.data_dir, uids) if uids else {}
    asked: dict[str, str] = {}
    for original, mid in zip(ids, cleaned):
        asked.setdefault(by_uid.get(mid, mid), original)
    return Target(message_ids=list(asked), asked=asked, match_count=None)


def _check_batch(count: int) -> None:
    if count > MAX_BATCH:
        raise ToolError(f"{count} messages selected; one write takes at most {MAX_BATCH} -- "
                        "narrow the query (after:, before:, from:, in:) or split the ids")


def _from_query(ctx: WriteContext, query: str) -> Target:
    compiled = ctx.mailbox().compile(query)
    try:
        # Count first: listing every match of a broad query costs far more than refusing it.
        _check_batch(ctx.reader.count(compiled.query, exclude_tags=compiled.exclude_tags))
        mids = ctx.reader.message_ids(compiled.query, exclude_tags=compiled.exclude_tags)
    except NotmuchAccessError as exc:
        raise ToolError(str(exc)) from None
    return Target(message_ids=mids, asked={}, match_count=len(mids))


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
                           sample_ids=target.message_ids[:SAMPLE_SIZE])
    if not sel.dry_run:
        return None
    found = [m for m in target.message_ids if ctx.reader.find(m) is not None]
    known = set(found)
    missing = [target.asked.get(m, m) for m in target.message_ids if m not in known]
    return WriteResult(dry_run=True, match_count=len(found), sample_ids=found[:SAMPLE_SIZE],
                       not_found=missing)


# ---------------------------------------------------------------------------------------------
# Running a batch


@dataclass
class _Work:
    """One message inside a write session, with the moves done to it so far."""

    txn: WriteTxn
    mb: Mailbox
    message: IndexedMessage
    moves: list[tuple[Path, Path]] = field(default_factory=list)

    @property
    def config(self) -> Config:
        return self.mb.config

    @property
    def mid(self) -> str:
        return self.message.message_id

    def current(self) -> IndexedMessage:
        found = self.txn.get(self.mid)
        if found is None:  # cannot happen: a move adds the new file before dropping the old
            raise WriteError("the message left the index during the write")
        return found

    def account(self, name: str | None) -> Account:
        """The account the write acts in: the one asked for, else the primary file's."""
        if name is not None:
            return self.config.account(name)
        account = mover.primary_account(self.mb, self.message)
        if account is None:
            raise WriteError("the message's file is in no configured account")
        return account

    def copies(self, account: Account) -> list[mover.Copy]:
        found = mover.copies_in(self.mb, self.current(), account)
        if not found:
            raise WriteError(f"the message has no file in account {account.name!r}")
        return found

    def tag(self, add: Sequence[str] = (), remove: Sequence[str] = ()) -> None:
        self.txn.change_tags([self.mid], add=add, remove=remove)

    def origins(self) -> dict[str, str]:
        raw = self.txn.get_property(self.mid, ORIGIN_PROPERTY)
        try:
            value = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}

    def move(self, copy: mover.Copy, folder: str) -> Path:
        """Move one file into a folder; remember its origin when it goes to Trash or Junk."""
        new = mover.move_file(self.txn, copy.path, mover.ensure_maildir(self.config, folder))
        self.moves.append((copy.path, new))
        origins = self.origins()
        changed = origins.pop(mover.file_key(copy.path), None) is not None
        if mover.role_of(self.config, folder) in ("trash", "junk"):
            origins[mover.file_key(new)] = copy.folder
            changed = True
        if changed:
            self.txn.set_property(self.mid, ORIGIN_PROPERTY,
                                  json.dumps(origins, ensure_ascii=False))
        return new

    def settle_place_tags(self) -> None:
        """Place tags as the post-new rules would give them for where the files are now."""
        now = self.current()
        folders = {f for f in map(self.mb.folder_of, now.filenames) if f}
        add, remove = mover.place_tags(self.config, folders, now.tags)
        self.tag(sorted(add), sorted(remove))


Step = Callable[[_Work], None]


def _relative(config: Config, path: str | Path) -> str:
    try:
        return Path(path).relative_to(config.mail_root).as_posix()
    except ValueError:
        return str(path)


def change_record(config: Config, before: IndexedMessage, after: IndexedMessage,
            moves: list[tuple[Path, Path]], origin_before: str | None,
            origin_after: str | None) -> dict[str, Any] | None:
    """The audit record of what a write did to one message; None if it changed nothing."""
    if (before.tags == after.tags and set(before.filenames) == set(after.filenames)
            and origin_before == origin_after):
        return None
    return {
        "message_id": before.message_id,
        "tags_before": sorted(before.tags),
        "tags_after": sorted(after.tags),
        # Paths relative to the mail root, so the log survives moving the whole tree.
        "files_before": [_relative(config, f) for f in before.filenames],
        "files_after": [_relative(config, f) for f in after.filenames],
        "moves": [[_relative(config, a), _relative(config, b)] for a, b in moves],
        "origin_before": origin_before,
        "origin_after": origin_after,
    }


@dataclass
class _BatchReport:
    result: WriteResult
    changes: list[dict[str, Any]]


def _write_one(txn: WriteTxn, mb: Mailbox, before: IndexedMessage, step: Step,
               report: _BatchReport) -> None:
    origin_before = txn.get_property(before.message_id, ORIGIN_PROPERTY)
    work = _Work(txn=txn, mb=mb, message=before)
    try:
        step(work)
        report.result.applied.append(before.message_id)
    # Any failure stays with its message: notmuch commits the atomic section even when an
    # exception escapes, so the batch must finish to record what the others did.
    except Exception as exc:
        report.result.errors.append(WriteErrorItem(id=before.message_id,
                                                   error=str(exc) or type(exc).__name__))
    after = txn.get(before.message_id) or before
    change = change_record(mb.config, before, after, work.moves, origin_before,
                     txn.get_property(before.message_id, ORIGIN_PROPERTY))
    if change is not None:
        report.changes.append(change)


def _run(ctx: WriteContext, target: Target, step: Step) -> _BatchReport:
    mb = ctx.mailbox()

    def batch(txn: WriteTxn) -> _BatchReport:
        report = _BatchReport(WriteResult(match_count=target.match_count), [])
        for mid in target.message_ids:
            before = txn.get(mid)
            if before is None:
                report.result.not_found.append(target.asked.get(mid, mid))
            else:
                _write_one(txn, mb, before, step, report)
        return report

    try:
        return ctx.writer.run(batch)
    except NotmuchAccessError as exc:  # DatabaseBusy says "nothing was changed"
        raise WriteError(str(exc)) from None


def _touched_accounts(ctx: WriteContext, changes: list[dict[str, Any]]) -> frozenset[str]:
    mb = ctx.mailbox()
    names: set[str] = set()
    for change in changes:
        for rel in set(change["files_before"]) ^ set(change["files_after"]):
            folder = mb.folder_of(str(ctx.config.mail_root / rel))
            account = ctx.config.account_for_path(folder) if folder else None
            if account is not None:
                names.add(account.name)
    return frozenset(names)


def _notify(ctx: WriteContext, action: str, report: _BatchReport) -> None:
    if ctx.after_write is None or not report.changes:
        return
    outcome = WriteOutcome(action=action, result=report.result,
                           message_ids=tuple(c["message_id"] for c in report.changes),
                           accounts=_touched_accounts(ctx, report.changes))
    try:
        ctx.after_write(outcome)
    except Exception:  # the write is done and recorded; a failed follow-up must not hide that
        log.exception("follow-up after %s failed", action)


def _write(ctx: WriteContext, action: str, sel: Selection, step: Step,
           **params: Any) -> WriteResult:
    target = _select(ctx, sel)
    preview = _preview(ctx, sel, target)
    if preview is not None:
        return preview
    report = _run(ctx, target, step)
    if report.changes:  # a call that changed nothing leaves nothing to undo
        with sidecar.opened(ctx.sidecar_file) as conn:
            report.result.audit_id = sidecar.record_write(
                conn, action, {**sel.params(), **params}, report.changes)
    _notify(ctx, action, report)
    return report.result


# ---------------------------------------------------------------------------------------------
# Tags and flags


def _tag_step(add: Sequence[str] = (), remove: Sequence[str] = ()) -> Step:
    return lambda work: work.tag(add, remove)


def set_read(ctx: WriteContext, ids: Sequence[str] | None, is_read: bool, *,
             query: str | None = None, confirm_count: int | None = None,
             dry_run: bool = False) -> WriteResult:
    """Mark messages read or unread (the ``unread`` tag; Maildir flag S follows)."""
    step = _tag_step(remove=["unread"]) if is_read else _tag_step(add=["unread"])
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
    step = _tag_step(add=["flagged"]) if flagged else _tag_step(remove=["flagged"])
    return _write(ctx, "set_flagged", Selection(ids, query, confirm_count, dry_run), step,
                  flagged=flagged)


def check_tag(tag: str) -> str:
    """A tag name as notmuch and its query syntax take it, or a ToolError saying what is wrong."""
    if not tag:
        raise ToolError("tag names must not be empty")
    if any(c.isspace() for c in tag):
        raise ToolError(f"tag {tag!r} contains whitespace")
    if tag.startswith("-"):
        raise ToolError(f"tag {tag!r} starts with '-' (list it under remove instead)")
    if len(tag) > MAX_TAG_LENGTH:
        raise ToolError(f"tag {tag[:20]!r}... is longer than {MAX_TAG_LENGTH} characters")
    return tag


# Tags whose meaning belongs to notmuch or to fmail-nm's own passes: `new` is notmuch's
# new.tags marker, which the next index run removes again, so adding it would silently vanish.
RESERVED_TAGS = frozenset({"new"})


def check_added_tag(tag: str) -> str:
    check_tag(tag)
    if tag in RESERVED_TAGS:
        raise ToolError(f"tag {tag!r} is reserved: notmuch gives it to mail it has just "
                        "indexed and the next index run removes it; choose another name")
    return tag


def tag_emails(ctx: WriteContext, ids: Sequence[str] | None = None, add: Sequence[str] = (),
               remove: Sequence[str] = (), *, query: str | None = None,
               confirm_count: int | None = None, dry_run: bool = False) -> WriteResult:
    """Add and remove tags; flag tags (unread, flagged, replied, ...) rename files to match."""
    adds = [check_added_tag(t) for t in add]
    removes = [check_tag(t) for t in remove]
    if not adds and not removes:
        raise ToolError("give at least one tag to add or remove")
    if both := sorted(set(adds) & set(removes)):
        raise ToolError(f"tags both added and removed: {', '.join(both)}")
    return _write(ctx, "tag_emails", Selection(ids, query, confirm_count, dry_run),
                  _tag_step(adds, removes), add=adds, remove=removes)


# ---------------------------------------------------------------------------------------------
# Moves


def _check_account(ctx: WriteContext, account: str | None) -> None:
    if account is not None:
        try:
            ctx.config.account(account)
        except ConfigError as exc:
            raise ToolError(str(exc)) from None


def _move_step(role: str, account: str | None) -> Step:
    """delete / junk: every copy in the account that is not yet in the role's folder."""
    def step(work: _Work) -> None:
        acct = work.account(account)
        dest = acct.folder(role)
        for copy in work.copies(acct):
            if copy.folder != dest:
                work.move(copy, dest)
        work.settle_place_tags()
    return step


def delete_messages(ctx: WriteContext, ids: Sequence[str] | None = None, *,
                    query: str | None = None, confirm_count: int | None = None,
                    dry_run: bool = False, account: str | None = None) -> WriteResult:
    """Move messages to their account's Trash folder (tags: +deleted -inbox)."""
    _check_account(ctx, account)
    return _write(ctx, "delete", Selection(ids, query, confirm_count, dry_run),
                  _move_step("trash", account), account=account)


def move_to_junk(ctx: WriteContext, ids: Sequence[str] | None = None, *,
                 query: str | None = None, confirm_count: int | None = None,
                 dry_run: bool = False, account: str | None = None) -> WriteResult:
    """Move messages to their account's Junk folder (tags: +spam -inbox)."""
    _check_account(ctx, account)
    return _write(ctx, "junk", Selection(ids, query, confirm_count, dry_run),
                  _move_step("junk", account), account=account)


def _archive_step(account: str | None) -> Step:
    def step(work: _Work) -> None:
        acct = work.account(account)
        dest, inbox = acct.folder("archive"), acct.folder("inbox")
        for copy in work.copies(acct):
            if copy.folder == inbox:
                work.move(copy, dest)
        work.settle_place_tags()
    return step


def archive(ctx: WriteContext, ids: Sequence[str] | None = None, *, query: str | None = None,
            confirm_count: int | None = None, dry_run: bool = False,
            account: str | None = None) -> WriteResult:
    """Move the inbox copy of messages to their account's Archive folder (+archived -inbox)."""
    _check_account(ctx, account)
    return _write(ctx, "archive", Selection(ids, query, confirm_count, dry_run),
                  _archive_step(account), account=account)


def _folder_name(folder: str) -> str:
    """A folder name that cannot leave the mail root or name a Maildir's own directories."""
    if len(folder) > MAX_FOLDER_CHARS:
        raise ToolError(f"folder names are at most {MAX_FOLDER_CHARS} characters")
    name = folder.strip().strip("/")
    parts = name.split("/")
    if not name or any(p in ("", ".", "..", ".notmuch", *mover.MAILDIR_SUBDIRS) for p in parts):
        raise ToolError(f"bad folder name {folder!r}: give a folder like 'Archive' or "
                        "'Projects/2026' (list_folders shows them)")
    return name


def resolve_folder(config: Config, account: Account, folder: str) -> str:
    """A folder relative to the account ('Archive', 'Projects/2026') or to the mail root
    ('work/INBOX'), as a folder relative to the mail root; it must exist in the config or on
    disk."""
    name = _folder_name(folder)
    inside = name if account.maildir == "." else f"{account.maildir}/{name}"
    for candidate in (inside, name):
        if mover.is_known_folder(config, candidate):
            return candidate
    known = [f for f in config.folders if config.account_for_path(f) == account]
    shown = ", ".join(known[:_FOLDER_LIST_LIMIT])
    if len(known) > _FOLDER_LIST_LIMIT:
        shown += ", ..."
    raise WriteError(f"no folder {folder!r} in account {account.name!r} or under the mail root "
                     f"(folders of {account.name}: {shown or 'none'})")


def _check_folder_exists(config: Config, folder: str, account: str | None) -> None:
    """Refuse a folder that exists in no account the write may act in, before selecting
    anything (per message it is checked again, for the message's own account)."""
    accounts = [config.account(account)] if account else list(config.accounts)
    for acct in accounts:
        try:
            resolve_folder(config, acct, folder)
            return
        except WriteError as exc:
            if len(accounts) == 1:
                raise
    shown = ", ".join(config.folders[:_FOLDER_LIST_LIMIT])
    if len(config.folders) > _FOLDER_LIST_LIMIT:
        shown += ", ..."
    raise WriteError(f"no folder {folder!r} in any account; nothing was changed (folders: "
                     f"{shown or 'none'}; list_folders shows them all)")


def _move_to_step(folder: str, account: str | None) -> Step:
    def step(work: _Work) -> None:
        acct = work.account(account)
        dest = resolve_folder(work.config, acct, folder)
        for copy in work.copies(acct):
            if copy.folder != dest:
                work.move(copy, dest)
        work.settle_place_tags()
    return step


def move_to_folder(ctx: WriteContext, ids: Sequence[str] | None, folder: str, *,
                   query: str | None = None, confirm_count: int | None = None,
                   dry_run: bool = False, account: str | None = None) -> WriteResult:
    """Move messages' files (in their account) to a folder; place tags follow its role."""
    _check_account(ctx, account)
    _check_folder_exists(ctx.config, folder, account)
    return _write(ctx, "move_to_folder", Selection(ids, query, confirm_count, dry_run),
                  _move_to_step(folder, account), folder=folder, account=account)


def _restore_step(account: str | None) -> Step:
    def step(work: _Work) -> None:
        acct = work.account(account)
        bins = {acct.folders[r] for r in ("trash", "junk") if r in acct.folders}
        origins = work.origins()
        for copy in work.copies(acct):
            if copy.folder not in bins:
                continue
            dest = origins.get(mover.file_key(copy.path))
            if dest is None or dest in bins or not mover.is_known_folder(work.config, dest):
                dest = acct.folder("inbox")
            work.move(copy, dest)
        work.settle_place_tags()
    return step


def restore(ctx: WriteContext, ids: Sequence[str] | None = None, *, query: str | None = None,
            confirm_count: int | None = None, dry_run: bool = False,
            account: str | None = None) -> WriteResult:
    """Move messages out of Trash/Junk back to the folder they were deleted from (else the
    inbox); tags: -deleted -spam, +inbox when back in the inbox (unless it is the user's own
    mail, a draft or list mail, which the post-new rules keep out of the inbox too)."""
    _check_account(ctx, account)
    return _write(ctx, "restore", Selection(ids, query, confirm_count, dry_run),
                  _restore_step(account), account=account)


# ---------------------------------------------------------------------------------------------
# Undo


def _current_file(work: _Work, recorded: str) -> mover.Copy | None:
    """The file a recorded move produced, as it is named now (flag changes and mbsync's
    ``,U=`` may have renamed it since; its unique part stays)."""
    path = work.config.mail_root / recorded
    folder, key = work.mb.folder_of(str(path)), mover.file_key(path)
    for name in work.current().filenames:
        if work.mb.folder_of(name) == folder and mover.file_key(name) == key:
            return mover.Copy(Path(name), folder or ".")
    return None


def _revert_step(changes: dict[str, dict[str, Any]]) -> Step:
    def step(work: _Work) -> None:
        change = changes[work.mid]
        missing = []
        for source, dest in reversed(change["moves"]):
            copy = _current_file(work, dest)
            home = work.mb.folder_of(str(work.config.mail_root / source))
            if copy is None or home is None:
                missing.append(dest)
                continue
            work.move(copy, home)
        before, after = set(change["tags_before"]), set(change["tags_after"])
        # Only what the write changed is turned back, so later changes by others survive.
        work.tag(add=sorted(before - after), remove=sorted(after - before))
        if change["origin_before"] != change["origin_after"]:
            work.txn.set_property(work.mid, ORIGIN_PROPERTY, change["origin_before"] or "{}")
        if missing:
            raise WriteError(f"not moved back, no longer where the write put it: "
                             f"{', '.join(missing)}")
    return step


def undo_last_write(ctx: WriteContext) -> WriteResult:
    """Revert the latest write not yet undone: its tags, and files moved back into the folders
    they came from (into ``cur/``, keeping the flags they have now).  Repeated calls walk back
    through older writes."""
    with sidecar.opened(ctx.sidecar_file) as conn:
        entry = sidecar.last_write(conn)
    if entry is None:
        raise ToolError("nothing to undo: no recorded write is left that has not been undone")
    # A contacts write records its rows ("contact") beside the mail tags it caused.
    contacts = [c for c in entry.changes if "contact" in c]
    changes = {c["message_id"]: c for c in entry.changes if "message_id" in c}
    target = Target(message_ids=list(changes), asked={}, match_count=None)
    report = _run(ctx, target, _revert_step(changes))
    with sidecar.opened(ctx.sidecar_file) as conn:
        if contacts:
            sqltools.restore_contacts(conn, contacts)
        sidecar.mark_undone(conn, entry.id)
    report.result.audit_id = entry.id
    _notify(ctx, f"undo {entry.action}", report)
    return report.result
