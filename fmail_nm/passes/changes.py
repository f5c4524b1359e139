"""The write engine: tag changes and folder moves on messages named by Message-ID, each batch
in one notmuch write session, audited and undoable.

Every write is a tag change or a file rename that mbsync pushes back (ARCHITECTURE.md, "Data
flow"):

* read/unread and flagged are tags; ``WriteTxn.change_tags`` renames the files so their Maildir
  flags (S, F) say the same.
* archive, delete, junk, move and restore rename files into another folder (see
  :mod:`fmail_nm.store.mover` for how, :mod:`fmail_nm.store.maildir` for which copies) and then
  set the place tags the user's tagging rules give there (:func:`passes.tagging.place_tags`).

A batch runs in one write session on the writer thread, so it either starts or -- when another
program holds the notmuch lock for too long -- does nothing and raises ``DatabaseBusy``.
Inside a batch each message is done on its own: one that fails is reported in ``errors`` and
the rest still apply.  What each applied write changed (tags, files, and the origin folders
kept for restore) can go to the sidecar's audit log, from which :func:`undo_last` reverts it.

mbsync renames a file it uploaded (``,U=``) without telling notmuch, so a write may find the
index naming a file no longer on disk.  When the caller gave a ``reindex``, the index is
then brought up to date once and such a message tried again (its two tries make one audit
record) before the error is reported.

Callers: the write tools (``tools.writes``, which choose the messages and check the caller's
limits) and the blocklist (which moves blocked mail to Junk).  Nothing here knows about
queries, batch limits or tool results.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from ..clock import utc_now
from ..config import ROOT_FOLDER, Account, Config
from ..errors import BackendError, CallerError
from ..flock import flock_within
from ..message.drafts import SeenDrafts
from ..private import private_dir
from ..store import maildir, mover, sidecar
from ..store.maildir import Copy
from ..store.notmuch import (
    DatabaseBusy,
    IndexedMessage,
    NotmuchAccessError,
    Reader,
    StaleFiles,
    Writer,
    WriteTxn,
)
from .tagging import folder_place_tags, place_tags

log = logging.getLogger(__name__)

# Message property: JSON {file key: folder it was moved from}, for files we moved into Trash or
# Junk -- and for copies held on their way there, which lie in that folder's hold.  It lives
# in notmuch, so restore still knows the way back after a sidecar rebuild.
ORIGIN_PROPERTY = "fmail.origin"
# Roles whose folders remember where a file came from, so restore can bring it back.
BIN_ROLES = ("trash", "junk")


def bin_folders(account: Account) -> set[str]:
    """The account's Trash and Junk folders (those it has)."""
    return {account.folders[r] for r in BIN_ROLES if r in account.folders}


T = TypeVar("T")


class ChangeError(CallerError):
    """One message could not be (fully) changed; the text says why and what to do."""


class UnrecordedWrite(BackendError):
    """A write notmuch committed whose audit record could not be written (undo cannot reach
    it); the follow-up was told all the same."""


class PartlyDone(ChangeError):
    """A message was changed as far as the files on disk allow; the text says what was not."""


# The index names a file that is not on disk (mbsync renamed it): re-indexing may help.
STALE = (StaleFiles, mover.SourceGone)


@dataclass(frozen=True)
class WriteOutcome:
    """What a write changed, for the caller's follow-up work (sidecar sync, mbsync push)."""

    action: str
    message_ids: tuple[str, ...]  # messages whose tags or files changed
    accounts: frozenset[str]  # accounts whose files changed on disk: these need a push


@dataclass
class WriteContext:
    """What every write needs.  Use it on the reader's thread: the writer has its own.

    ``clock`` is the time a write's selection is made against (relative dates in a query)."""

    config: Config
    reader: Reader
    writer: Writer
    sidecar_file: Path
    after_write: Callable[[WriteOutcome], None] | None = None
    clock: Callable[[], datetime] = utc_now
    # Brings the index up to date (notmuch new); None where that cannot run (the hook).
    reindex: Callable[[], object] | None = None
    # What the model last saw of each draft (the server shares it with its reads).
    seen_drafts: SeenDrafts = field(default_factory=SeenDrafts)
    # The MCP session the writes are made in, recorded with each (None: outside any, as the
    # CLI and the passes write): undo_last reverts the session's own latest write.
    session: str | None = None


@dataclass
class BatchReport:
    """What a batch did: per message applied, unknown or failed, and the audit records."""

    applied: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)  # as the caller wrote them
    errors: list[tuple[str, str]] = field(default_factory=list)  # (Message-ID, why)
    changes: list[dict[str, Any]] = field(default_factory=list)
    audit_id: int | None = None
    stale: list[str] = field(default_factory=list)  # the index named a file gone from disk
    failed: list[str] = field(default_factory=list)  # the step failed otherwise


# ---------------------------------------------------------------------------------------------
# One message inside a write session


# The accounts a folder change acts in: these, or (None) every account holding a copy.
Accounts = frozenset[str] | None


def origins_of(raw: str | None) -> dict[str, str]:
    """An origin property's value: per file key of a copy in a bin, the folder it came from."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


@dataclass
class MessageWork:
    """One message inside a write session, with the moves done to it so far."""

    txn: WriteTxn
    config: Config
    message: IndexedMessage
    moves: list[tuple[Path, Path]] = field(default_factory=list)

    @property
    def mid(self) -> str:
        return self.message.message_id

    def current(self) -> IndexedMessage:
        found = self.txn.get(self.mid)
        if found is None:  # cannot happen: a move adds the new file before dropping the old
            raise ChangeError("the message left the index during the write")
        return found

    def folder_of(self, filename: str | Path) -> str | None:
        return maildir.folder_of(self.config.mail_root, filename)

    def accounts(self, names: Accounts) -> list[tuple[Account, list[Copy]]]:
        """The accounts a folder change acts in, each with the message's copies there: those
        asked for, else every account holding a copy -- tags belong to the message, so a move
        in one account alone would leave the other accounts' copies out of step."""
        groups = maildir.copies_by_account(self.config, self.current())
        if names is None:
            if not groups:
                raise ChangeError("the message's file is in no configured account")
            return groups
        chosen = [group for group in groups if group[0].name in names]
        if not chosen:
            raise ChangeError("the message has no file in account "
                              + " or ".join(repr(name) for name in sorted(names)))
        return chosen

    def tag(self, add: Sequence[str] = (), remove: Sequence[str] = ()) -> None:
        self.txn.change_tags([self.mid], add=add, remove=remove)

    def origins(self) -> dict[str, str]:
        return origins_of(self.txn.get_property(self.mid, ORIGIN_PROPERTY))

    def move(self, copy: Copy, folder: str | None, bound_for: str | None = None) -> Path:
        """Move one file into a folder (None: into its own folder's hold, on its way to
        ``bound_for``); remember its origin when it goes to Trash or Junk -- held on its way
        there too, so restore brings it back as well as the copy that went."""
        # A held copy's name kept the flags it had then; it comes back with the message's.
        tags = self.current().tags if maildir.is_held(copy.path) else None
        new = _relocate(self.txn, self.config, copy.path, folder, tags)
        self.moves.append((copy.path, new))
        origins = self.origins()
        known = origins.pop(maildir.file_key(copy.path), None)
        changed = known is not None
        from_bin = _is_bin(self.config, copy.folder)
        if folder is not None and _is_bin(self.config, folder):
            # From one bin to the other (Trash to Junk), the home it had before the first.
            origins[maildir.file_key(new)] = known if from_bin and known else copy.folder
            changed = True
        elif folder is None and _is_bin(self.config, bound_for) and not from_bin:
            # Held in the hold of the folder it left, which is where restore looks for it.  A
            # copy held in a bin's own hold stays there: restore takes mail out of the bins.
            origins[maildir.file_key(new)] = copy.folder
            changed = True
        if changed:
            self.txn.set_property(self.mid, ORIGIN_PROPERTY,
                                  json.dumps(origins, ensure_ascii=False))
        return new

    def settle_place_tags(self) -> None:
        """Place tags as the user's tagging rules give them for where the files are now."""
        place_tags(self.txn, self.config, self.mid)


def _is_bin(config: Config, folder: str | None) -> bool:
    return folder is not None and maildir.role_of(config, folder) in BIN_ROLES


def _relocate(txn: WriteTxn, config: Config, path: Path, folder: str | None,
              tags: frozenset[str] | None = None) -> Path:
    """Move one file into a folder, or (None) into the hold of the folder it is in; a file
    out of a hold takes the flags ``tags`` say (see mover.move_file)."""
    if folder is None:
        return mover.hold_file(txn, path)
    return mover.move_file(txn, path, maildir.ensure_maildir(config, folder), tags)


Step = Callable[[MessageWork], None]


# ---------------------------------------------------------------------------------------------
# Steps: what a write does to one message


def tag_step(add: Sequence[str] = (), remove: Sequence[str] = ()) -> Step:
    return lambda work: work.tag(add, remove)


# A move: a copy and the folder it goes to -- None: its own folder's hold (see _no_second_copy).
Move = tuple[Copy, str | None]
# The folders a write sends an account's copies to.  Raises CallerError when the account
# cannot take them (it has no folder for the role, or no such folder).
Plan = Callable[[Account, list[Copy]], list[tuple[Copy, str]]]


def _move_in_each_account(work: MessageWork, groups: Sequence[tuple[Account, list[Copy]]],
                          plan: Plan) -> None:
    """Make the moves ``plan`` gives in each account, then set the place tags.  An account
    that cannot take its moves keeps its copies and PartlyDone names them; when no account
    has anything to move, nothing changes and the first such account's error stands."""
    moves: list[tuple[Copy, str]] = []
    left: list[tuple[list[Copy], CallerError]] = []
    for acct, copies in groups:
        try:
            moves += plan(acct, copies)
        except CallerError as exc:
            left.append((copies, exc))
    if left and not moves:
        raise left[0][1]
    _no_second_copy(work, {copy.folder for _, copies in groups for copy in copies}, moves)
    work.settle_place_tags()
    if left:
        raise PartlyDone("; ".join(f"not moved: {', '.join(c.folder for c in copies)} ({exc})"
                                   for copies, exc in left))


def _no_second_copy(work: MessageWork, present: set[str],
                    moves: Sequence[tuple[Copy, str]]) -> None:
    """Make the moves, except that a copy bound for a folder ``present`` names or another
    copy has just gone to goes to its own folder's hold instead: moved there, it would be
    uploaded as a second copy (on Gmail, archiving into "[Gmail]/All Mail" made one of every
    message archived; deleting a message cc'd to oneself, from INBOX and Sent, put two in
    Trash).  It leaves its folder all the same, and undo brings it back.  A held copy bound
    for such a folder (one restore found) stays where it is."""
    for copy, dest in moves:
        if dest not in present:
            work.move(copy, dest)
            present.add(dest)
        elif not maildir.is_held(copy.path):
            work.move(copy, None, bound_for=dest)


def _into(dest: Callable[[Account], str], moving: Callable[[Account, Copy], bool]) -> Plan:
    """A plan: the account's copies ``moving`` picks go to its folder ``dest`` names.  The
    folder is asked for only when a copy is picked: an account without it that has nothing
    to move there (a Sent copy when archiving) is no error."""
    def plan(acct: Account, copies: list[Copy]) -> list[tuple[Copy, str]]:
        picked = [copy for copy in copies if moving(acct, copy)]
        folder = dest(acct) if picked else ""
        return [(copy, folder) for copy in picked if copy.folder != folder]
    return plan


def move_to_role_step(role: str, accounts: Accounts) -> Step:
    """Trash / Junk: in each account, every copy not yet in that account's folder of the
    role."""
    return move_to_folder_step(lambda acct: acct.folder(role), accounts)


def archive_step(accounts: Accounts) -> Step:
    """In each account, the copies in its inbox folder go to its Archive folder.  Mail only in
    Trash or Junk is refused: archiving takes nothing out of those (restore does)."""
    def step(work: MessageWork) -> None:
        groups = work.accounts(accounts)
        binned = [copy for acct, copies in groups for copy in copies
                  if copy.folder in bin_folders(acct)]
        if binned and len(binned) == sum(len(copies) for _, copies in groups):  # all of them
            raise ChangeError(f"it is in {binned[0].folder}: archive moves mail out of the "
                              "inbox only; restore it first")
        _move_in_each_account(work, groups, _ARCHIVE)
    return step


_ARCHIVE = _into(lambda acct: acct.folder("archive"),
                 lambda acct, copy: copy.folder == acct.folders.get("inbox"))


def move_to_folder_step(destination: Callable[[Account], str], accounts: Accounts) -> Step:
    """In each account, every copy to the folder ``destination`` names for that account."""
    plan = _into(destination, lambda acct, copy: True)
    return lambda work: _move_in_each_account(work, work.accounts(accounts), plan)


def restore_step(accounts: Accounts) -> Step:
    """In each account, the copies in its Trash/Junk go back where they came from (else to
    its inbox)."""
    return lambda work: _move_in_each_account(work, work.accounts(accounts),
                                              _back_home(work.config, work.origins()))


def _back_home(config: Config, origins: dict[str, str]) -> Plan:
    """A plan: the account's copies held on their way into its bins, then its copies in its
    bins, to the folders ``origins`` names for them.  Held copies first: each goes back where
    it was, as undo puts it, and a file from a bin bound for the same folder is held instead."""
    def plan(acct: Account, copies: list[Copy]) -> list[tuple[Copy, str]]:
        bins = bin_folders(acct)
        moves = _held_on_the_way(config, acct, copies, origins)
        for copy in copies:
            if copy.folder not in bins:
                continue
            dest = origins.get(maildir.file_key(copy.path))
            # A folder removed since (even if the config still lists it) is not made again.
            if dest is None or dest in bins or not maildir.is_there_now(config, dest):
                dest = acct.folder("inbox")
            moves.append((copy, dest))
        return moves
    return plan


def _held_on_the_way(config: Config, acct: Account, copies: list[Copy],
                     origins: dict[str, str]) -> list[tuple[Copy, str]]:
    """The account's copies held on their way into a bin (see MessageWork.move), each back to
    the folder whose hold it is in; a copy pruned from the hold since is left out."""
    indexed = {maildir.file_key(copy.path) for copy in copies}
    found = []
    for key, folder in origins.items():
        if key in indexed or config.account_for_path(folder) != acct:
            continue
        held = maildir.held_copy(config, folder, key)
        if held is not None:
            found.append((Copy(held, folder), folder))
    return found


# ---------------------------------------------------------------------------------------------
# Running a batch


def change_record(config: Config, before: IndexedMessage, after: IndexedMessage,
                  moves: Sequence[tuple[Path, Path]], origin_before: str | None,
                  origin_after: str | None) -> dict[str, Any] | None:
    """The audit record of what a write did to one message; None if it changed nothing."""
    if (before.tags == after.tags and set(before.filenames) == set(after.filenames)
            and origin_before == origin_after):
        return None
    root = config.mail_root
    return {
        "message_id": before.message_id,
        "tags_before": sorted(before.tags),
        "tags_after": sorted(after.tags),
        # Paths relative to the mail root, so the log survives moving the whole tree.
        "files_before": [maildir.relative_path(root, f) for f in before.filenames],
        "files_after": [maildir.relative_path(root, f) for f in after.filenames],
        "moves": [[maildir.relative_path(root, a), maildir.relative_path(root, b)]
                  for a, b in moves],
        "origin_before": origin_before,
        "origin_after": origin_after,
    }


def _write_one(txn: WriteTxn, config: Config, before: IndexedMessage, step: Step,
               report: BatchReport) -> None:
    origin_before = txn.get_property(before.message_id, ORIGIN_PROPERTY)
    work = MessageWork(txn=txn, config=config, message=before)
    try:
        step(work)
        report.applied.append(before.message_id)
    except PartlyDone as exc:  # done as far as the files on disk allow; the text says what
        report.applied.append(before.message_id)
        report.errors.append((before.message_id, str(exc)))
    # Any failure stays with its message: notmuch commits the atomic section even when an
    # exception escapes, so the batch must finish to record what the others did.
    except Exception as exc:
        why = str(exc) or type(exc).__name__
        if work.moves:  # one message whole or not at all: the files it moved go back
            try:
                _put_back(work, origin_before)
            except Exception as back:  # noqa: BLE001 - said in the error; tags follow files
                work.settle_place_tags()
                why += f" (and moving its files back failed: {back}; they stay where they are)"
        report.errors.append((before.message_id, why))
        (report.stale if isinstance(exc, STALE) else report.failed).append(before.message_id)
    after = txn.get(before.message_id) or before
    change = change_record(config, before, after, work.moves, origin_before,
                           txn.get_property(before.message_id, ORIGIN_PROPERTY))
    if change is not None:
        report.changes.append(change)


def _session(ctx: WriteContext, message_ids: Sequence[str], step: Step,
             names: dict[str, str]) -> BatchReport:
    def batch(txn: WriteTxn) -> BatchReport:
        report = BatchReport()
        for mid in message_ids:
            before = txn.get(mid)
            if before is None:
                report.not_found.append(names.get(mid, mid))
            else:
                _write_one(txn, ctx.config, before, step, report)
        return report
    return ctx.writer.run(batch)


def run(ctx: WriteContext, message_ids: Sequence[str], step: Step, *,
        asked: dict[str, str] | None = None) -> BatchReport:
    """Apply ``step`` to each message in one write session; nothing is recorded or notified.
    ``asked`` maps a Message-ID to the id as the caller wrote it (for ``not_found``).  The
    messages whose files the index named wrongly are tried once more after ``ctx.reindex``.
    Raises ``DatabaseBusy`` (and changes nothing) when the write lock cannot be had for the
    first session; the retry's own failure leaves the first session's changes standing."""
    names = asked or {}
    report = _session(ctx, message_ids, step, names)
    if report.stale and _reindexed(ctx):
        try:
            retry = _session(ctx, report.stale, step, names)
        except NotmuchAccessError as exc:  # the first session is committed: it must be told
            report.errors = [(mid, f"{why}; tried again after re-indexing: {exc}"
                              if mid in report.stale else why) for mid, why in report.errors]
            return report
        report = _merged(report, retry)
    return report


def _reindexed(ctx: WriteContext) -> bool:
    if ctx.reindex is None:
        return False
    try:
        ctx.reindex()
    except Exception as exc:  # the stale-file errors stand, with their advice to re-index
        log.warning("re-indexing for a file renamed since the last index failed: %s", exc)
        return False
    return True


def _merged(first: BatchReport, retry: BatchReport) -> BatchReport:
    """The first try's report with its stale messages replaced by how the retry went."""
    again = set(first.stale)
    merged = BatchReport(
        applied=first.applied + retry.applied,
        not_found=first.not_found + retry.not_found,
        errors=[e for e in first.errors if e[0] not in again] + retry.errors,
        stale=retry.stale, failed=first.failed + retry.failed)
    later = {c["message_id"]: c for c in retry.changes}
    merged.changes = [_joined(c, later.pop(c["message_id"], None)) for c in first.changes]
    merged.changes += later.values()
    return merged


def _joined(first: dict[str, Any], then: dict[str, Any] | None) -> dict[str, Any]:
    """One audit record for two changes made to a message in a row."""
    if then is None:
        return first
    return {**then, "tags_before": first["tags_before"], "files_before": first["files_before"],
            "moves": first["moves"] + then["moves"], "origin_before": first["origin_before"]}


def touched_accounts(config: Config, changes: Sequence[dict[str, Any]]) -> frozenset[str]:
    """The accounts whose files a batch changed on disk: those need an mbsync push."""
    names: set[str] = set()
    for change in changes:
        for rel in set(change["files_before"]) ^ set(change["files_after"]):
            folder = maildir.folder_of(config.mail_root, config.mail_root / rel)
            account = config.account_for_path(folder) if folder else None
            if account is not None:
                names.add(account.name)
    return frozenset(names)


def notify(ctx: WriteContext, action: str, changes: Sequence[dict[str, Any]]) -> None:
    """Tell the caller's follow-up (sidecar sync, push) what changed, if anything did."""
    if ctx.after_write is None or not changes:
        return
    outcome = WriteOutcome(action=action,
                           message_ids=tuple(c["message_id"] for c in changes),
                           accounts=touched_accounts(ctx.config, changes))
    try:
        ctx.after_write(outcome)
    except Exception:  # the write is done and recorded; a failed follow-up must not hide that
        log.exception("follow-up after %s failed", action)


# ---------------------------------------------------------------------------------------------
# The undo lock: writes hold it shared, undos exclusive


class UndoUnderWay(DatabaseBusy):
    """An undo held the undo lock past the write's bound; nothing was changed."""

    def __init__(self, waited: float) -> None:
        NotmuchAccessError.__init__(self, (
            f"an undo is under way (in this or another fmail-nm process); gave up after "
            f"{waited:.1f}s, nothing was changed -- retry shortly"))
        self.waited = waited


# The undo lock file this thread holds, if any (see _undo_lock).
_holding = threading.local()


@contextmanager
def _undo_lock(ctx: WriteContext, *, shared: bool, wait: float | None = None
               ) -> Iterator[None]:
    """The lock next to the sidecar, across processes (two servers, the CLI, the post-new
    pass): it goes with its file, or its process.  Always taken before notmuch's lock, never
    inside it, so neither waits for the other in a circle.  It is waited for as a write waits
    for notmuch's (the caller's bound, else the Writer's lock timeout): the holder may
    re-index or wait for a sync.  A write made inside another on this thread (a re-index's
    pass) is covered by that one's hold -- of the same lock file: flock, per open file,
    would have this thread wait for itself; one of another sidecar covers nothing here.
    ``wait``: seconds instead of that bound (0: taken now or never)."""
    path = ctx.sidecar_file.with_name(ctx.sidecar_file.name + ".undo-lock")
    outer = getattr(_holding, "path", None)
    if shared and outer == path:
        yield
        return
    private_dir(ctx.sidecar_file.parent)
    wait = ctx.writer.lock_wait() if wait is None else wait
    with open(path, "a") as fh:
        if not flock_within(fh, wait, shared=shared):
            waited = ctx.writer.waited(wait)  # since the caller asked, as "database busy" says
            if shared:
                raise UndoUnderWay(waited)
            raise ChangeError(f"another undo is under way, or a write not yet recorded "
                              f"(waited {waited:.1f}s); nothing was undone -- retry shortly")
        _holding.path = path
        try:
            yield
        finally:
            _holding.path = outer


def until_recorded(ctx: WriteContext, *, wait: float | None = None
                   ) -> contextlib.AbstractContextManager[None]:
    """Held by a write from before it takes notmuch's write lock until its audit record is
    written (or failed): an undo reads what stands only when no write is between the two --
    else one made before the undo, recorded after its read, would count as made after it,
    and undoing it later would bring back what the undo undid (see Standing).  Never held
    across a network call: a send is made before, a push after.  ``wait``: see _undo_lock;
    past it, :class:`UndoUnderWay`."""
    return _undo_lock(ctx, shared=True, wait=wait)


def _one_undo_at_a_time(ctx: WriteContext) -> contextlib.AbstractContextManager[None]:
    """Held by an undo throughout: undos run one after another, across processes (two that
    read the same latest entry would both revert it, and both say so), and each reads what
    stands with every write committed before it recorded (see until_recorded)."""
    return _undo_lock(ctx, shared=False)


def record(ctx: WriteContext, action: str, params: dict[str, Any],
           changes: Sequence[dict[str, Any]]) -> int | None:
    """One audit entry for what a write changed (none when it changed nothing)."""
    if not changes:  # a call that changed nothing leaves nothing to undo
        return None
    return _recorded(ctx, f"{action} was done, but the sidecar could not record it, so "
                     "undo_last_write cannot revert it",
                     lambda conn: sidecar.record_write(conn, action, params, list(changes),
                                                       ctx.session))


def _recorded(ctx: WriteContext, failure: str, write: Callable[[sqlite3.Connection], T]) -> T:
    """``write`` to the sidecar after a change notmuch has committed, waiting out another
    process's writes up to RECORD_WAIT_S; else an UnrecordedWrite starting with ``failure``."""
    deadline = time.monotonic() + RECORD_WAIT_S
    while True:
        try:
            with sidecar.opened(ctx.sidecar_file) as conn:
                return write(conn)
        except (sqlite3.Error, sidecar.SidecarError) as exc:  # busy, full, damaged, a fault
            busy = isinstance(exc, sqlite3.Error) and sidecar.is_busy(exc)
            if not busy or time.monotonic() >= deadline:
                raise UnrecordedWrite(_unrecorded(failure, exc, ctx.sidecar_file)) from None


def _unrecorded(failure: str, exc: Exception, path: Path) -> str:
    """``failure`` and why; of a damaged sidecar, its way out too (each write after fails
    so); of an error in fmail-nm's own SQL, that it is one."""
    if isinstance(exc, sqlite3.Error) and (sidecar.is_damaged(exc) or sidecar.is_internal(exc)):
        return f"{failure}: {sidecar.failure_text(exc, f'the sidecar {path}')}"
    return f"{failure} ({exc})"


# How long the record of a committed write waits for a sidecar another process is writing
# (each try waits sidecar.BUSY_TIMEOUT_MS): past a read's patience, since the write is done.
RECORD_WAIT_S = 30


def apply(ctx: WriteContext, action: str, params: dict[str, Any], message_ids: Sequence[str],
          step: Step, *, asked: dict[str, str] | None = None) -> BatchReport:
    """Run a write, record it in the audit log and tell the follow-up."""
    report = BatchReport()
    try:
        with until_recorded(ctx):
            report = run(ctx, message_ids, step, asked=asked)
            report.audit_id = record(ctx, action, params, report.changes)
    finally:  # done in notmuch and on disk: the follow-up pushes it, recorded or not
        notify(ctx, action, report.changes)
    return report


# A write whose params carry this key is recorded but never reverted (see there); undo_last
# tells the caller why.
NOT_UNDOABLE = sidecar.NOT_UNDOABLE


def _absent(message_id: str) -> IndexedMessage:
    """How a message not (or no longer) in the index looks in an audit record."""
    return IndexedMessage(message_id=message_id, thread_id="", subject="", from_header="",
                          date=0, tags=frozenset(), filenames=())


def apply_session(ctx: WriteContext, action: str, params: dict[str, Any],
                  message_ids: Sequence[str], job: Callable[[WriteTxn], None]) -> BatchReport:
    """Run ``job`` in one write session -- for writes that add or remove files, where a
    message may be new to the index or leave it -- then record what it did to each of
    ``message_ids`` and tell the follow-up, as :func:`apply` does.  A failing job is reported
    in ``errors`` (under the first id), beside what it changed before it failed."""
    def batch(txn: WriteTxn) -> BatchReport:
        report = BatchReport()
        before = {mid: txn.get(mid) or _absent(mid) for mid in message_ids}
        try:
            job(txn)
        except Exception as exc:  # notmuch commits what was done: record it (see _write_one)
            report.errors.append((message_ids[0], str(exc) or type(exc).__name__))
        for mid in message_ids:
            change = change_record(ctx.config, before[mid], txn.get(mid) or _absent(mid),
                                   (), None, None)
            if change is not None:
                report.changes.append(change)
                report.applied.append(mid)
        return report

    report = BatchReport()
    try:
        with until_recorded(ctx):
            report = ctx.writer.run(batch)
            report.audit_id = record(ctx, action, params, report.changes)
    finally:
        notify(ctx, action, report.changes)
    return report


# ---------------------------------------------------------------------------------------------
# Undo


def _current_file(work: MessageWork, recorded: str) -> Copy | None:
    """The file a recorded move produced, as it is named now (flag changes and mbsync's
    ``,U=`` may have renamed it since; its unique part stays)."""
    path = work.config.mail_root / recorded
    held = maildir.is_held(path)
    if held and path.exists():  # not in the index, and nothing renames it
        folder = maildir.held_folder(work.config.mail_root, path)
        return Copy(path, folder) if folder is not None else None
    folder, key = work.folder_of(path), maildir.file_key(path)
    for name in work.current().filenames:
        # A held copy out of its hold took the place of the message's last file
        # (passes.holds), in whichever folder that was.
        if (held or work.folder_of(name) == folder) and maildir.file_key(name) == key:
            return Copy(Path(name), work.folder_of(name) or ".")
    return None


@dataclass
class _RevertPlan:
    """The recorded moves to turn back, as (the file as it is named now, the folder it goes
    to, None for the hold it came out of); the files no longer where the write put them; the
    folders they came from that are gone since, whose files go to the account's inbox instead
    (as restore sends them); the files a later write moved again, which stay where it put
    them."""

    moves: list[Move] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    overtaken: list[str] = field(default_factory=list)


@dataclass
class LaterWrites:
    """What the writes recorded after the one being undone, and not undone themselves, changed
    on one message -- each named ``audit 9 (archive)``: the tags each changed (the latest
    one's name), and the latest that moved its files.  Those changes stand: an undo that
    turned them back would silently take back another session's (or a pass's) later write."""

    tags: dict[str, str] = field(default_factory=dict)
    moved: str | None = None


def later_writes(conn: sqlite3.Connection, entry: sidecar.AuditEntry) -> dict[str, LaterWrites]:
    """Per message of ``entry``, what later writes changed on it (see LaterWrites)."""
    found: dict[str, LaterWrites] = {}
    mids = [c["message_id"] for c in entry.changes if "message_id" in c]
    for audit_id, action, change in sidecar.later_changes(conn, entry.id, mids):
        name = f"audit {audit_id} ({action})"
        later = found.setdefault(change["message_id"], LaterWrites())
        for tag in set(change["tags_before"]) ^ set(change["tags_after"]):
            later.tags[tag] = name
        # A flag change renames files too: only moves (and the origins they keep) count.
        if change["moves"] or change["origin_before"] != change["origin_after"]:
            later.moved = name
    return found


@dataclass
class UndoneBefore:
    """What earlier writes, undone after this one was made, changed on one message that this
    one changed again: their undo left that as this one set it (see LaterWrites), so this
    one's recorded "before" still holds their change, which must not come back when this one
    is undone.  ``tags``: the tags as they were before those writes (True: it had it), where
    that differs from the recorded before; ``sources``: per file this one moved (its recorded
    source), where it was before them; ``origins``: per such file's key, its entry in the
    origin property then (None: none) -- each copy's own, as its trace may end at another
    write than the others'."""

    tags: dict[str, bool] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    origins: dict[str, str | None] = field(default_factory=dict)

    def recorded(self, change: dict[str, Any]) -> dict[str, Any]:
        """``change`` as if those earlier writes had never been made."""
        tags = {t for t in change["tags_before"] if self.tags.get(t, True)}
        tags |= {t for t, had in self.tags.items() if had}
        moves = [(self.sources.get(src, src), dest) for src, dest in change["moves"]]
        # A file traced back to the folder this write put it in is home already: "moved back"
        # it would only get a new name, which mbsync uploads again as new mail.
        return {**change, "tags_before": sorted(tags),
                "moves": [(src, dest) for src, dest in moves
                          if _file_of(src)[0] != _file_of(dest)[0]],
                "origin_before": self._origin(change["origin_before"])}

    def _origin(self, recorded: str | None) -> str | None:
        if not self.origins:
            return recorded
        origins = origins_of(recorded)
        for key, origin in self.origins.items():
            if origin is None:
                origins.pop(key, None)
            else:
                origins[key] = origin
        return json.dumps(origins, ensure_ascii=False)


@dataclass(frozen=True)
class Standing:
    """What undo found standing around the entry it reverts, read once each write session of
    its revert holds notmuch's write lock: a write recorded by then made its change before
    the revert, and stands (``later``); one recorded after made it after the revert: no
    write is between its commit and its record then (see until_recorded).  ``upto``, the
    newest entry then, is what mark_undone records for each message the session reverted:
    read when the undo is recorded instead (after its contact rows are put back, or a
    retry's revert, say), a write made after the revert but recorded first would count as
    undone after (see UndoneBefore)."""

    later: dict[str, LaterWrites] = field(default_factory=dict)
    earlier: dict[str, UndoneBefore] = field(default_factory=dict)
    upto: int = 0


def standing(conn: sqlite3.Connection, entry: sidecar.AuditEntry) -> Standing:
    # The newest entry last: one recorded while the others are read was made before.
    return Standing(later_writes(conn, entry), undone_before(conn, entry),
                    sidecar.newest_entry(conn))


def _file_of(recorded: str) -> tuple[str, str]:
    """A recorded file as (its folder's path, its unique part): renames keep both."""
    return str(Path(recorded).parent.parent), maildir.file_key(recorded)


def undone_before(conn: sqlite3.Connection, entry: sidecar.AuditEntry) -> dict[str, UndoneBefore]:
    """Per message of ``entry``, what earlier writes undone since it was made left in its
    recorded before (see UndoneBefore).  Each tag and file is followed back through such
    writes, newest first, while each one's after is what the next one found."""
    found: dict[str, UndoneBefore] = {}
    past: dict[str, list[sidecar.EarlierChange]] = {}
    mids = [c["message_id"] for c in entry.changes if "message_id" in c]
    for earlier in sidecar.earlier_changes(conn, entry, mids):
        past.setdefault(earlier.change["message_id"], []).append(earlier)
    for change in entry.changes:
        if change.get("message_id") not in past:
            continue
        before = found.setdefault(change["message_id"], UndoneBefore())
        for tag in set(change["tags_before"]) ^ set(change["tags_after"]):
            had, since = tag in change["tags_before"], entry.id
            for e in past[change["message_id"]]:
                if tag not in set(e.change["tags_before"]) ^ set(e.change["tags_after"]):
                    continue
                if not e.undone_after(since) or (tag in e.change["tags_after"]) != had:
                    break
                had, since = tag in e.change["tags_before"], e.audit_id
            if had != (tag in change["tags_before"]):
                before.tags[tag] = had
        for source, _ in change["moves"]:
            home, since, key = source, entry.id, maildir.file_key(source)
            for e in past[change["message_id"]]:
                if not e.change["moves"]:  # a tag change: files stay where they are
                    continue
                back = {_file_of(dest): src for src, dest in e.change["moves"]}
                if not e.undone_after(since) or _file_of(home) not in back:
                    break
                home, since = back[_file_of(home)], e.audit_id
                before.origins[key] = origins_of(e.change["origin_before"]).get(key)
            if home != source:
                before.sources[source] = home
    return found


def _revert_plan(work: MessageWork, change: dict[str, Any]) -> _RevertPlan:
    """Raises StaleFiles -- before anything changed -- when the index names a file that is
    gone from disk."""
    plan = _RevertPlan()
    for source, dest in reversed(change["moves"]):
        copy = _current_file(work, dest)
        held = maildir.is_held(work.config.mail_root / source)
        home = work.folder_of(work.config.mail_root / source)
        if copy is None or (home is None and not held):
            plan.missing.append(dest)
            continue
        if not copy.path.exists():
            raise StaleFiles.naming(copy.path)
        if home is None:  # an undo's move out of the hold, rolled back: into the hold again
            plan.moves.append((copy, None))
            continue
        account = work.config.account_for_path(home)
        # A folder made again here, mbsync would make again on the server.
        if (not maildir.is_there_now(work.config, home) and account is not None
                and "inbox" in account.folders):
            plan.removed.append(home)
            home = account.folder("inbox")
        plan.moves.append((copy, home))
    return plan


def _put_back(work: MessageWork, origin: str | None) -> None:
    """Undo the moves made so far to this message, and its origin property."""
    for old, new in reversed(work.moves):
        home = None if maildir.is_held(old) else work.folder_of(old) or ROOT_FOLDER
        _relocate(work.txn, work.config, new, home)
    work.moves.clear()
    work.txn.update(work.mid, properties={ORIGIN_PROPERTY: origin})


def revert_step(changes: dict[str, dict[str, Any]],
                seen: Callable[[MessageWork], Standing] = lambda work: Standing()) -> Step:
    """Undo what an audit entry recorded for each message: moves back, then tags and origin.
    A message is done whole or not at all; only a file gone since (moved or deleted by
    another program) is left out, and what later writes changed since stands (the tags
    they changed, files they moved); what earlier writes undone since changed does not
    come back -- both as ``seen`` says of the message in its write session (called under
    notmuch's write lock, see Standing).
    :class:`PartlyDone` says exactly what was done."""
    def step(work: MessageWork) -> None:
        read = seen(work)
        past = read.earlier.get(work.mid, UndoneBefore())
        change = past.recorded(changes[work.mid])
        since = read.later.get(work.mid, LaterWrites())
        plan = (_revert_plan(work, change) if since.moved is None
                else _RevertPlan(overtaken=[dest for _, dest in change["moves"]]))
        origin = work.txn.get_property(work.mid, ORIGIN_PROPERTY)
        try:
            for copy, home in plan.moves:
                work.move(copy, home)
        except Exception as exc:
            _put_back(work, origin)
            raise ChangeError(f"nothing of this message was undone: {exc}") from exc
        before, after = set(change["tags_before"]), set(change["tags_after"])
        kept = {tag: by for tag, by in since.tags.items() if (tag in before) != (tag in after)}
        # Files sent further back than this write found them: their place tags follow them.
        left = _revert_tags(work, change, keep=frozenset(kept), placed=bool(
            plan.missing or plan.removed or plan.overtaken or past.sources))
        if change["origin_before"] != change["origin_after"] and since.moved is None:
            work.txn.set_property(work.mid, ORIGIN_PROPERTY, change["origin_before"] or "{}")
        restored = "tags restored" + (f", except {', '.join(left)}: place tags follow where "
                                      "its files are now" if left else "")
        if kept:
            restored += "; left as a later write set them: " + ", ".join(
                f"{tag} ({by})" for tag, by in sorted(kept.items()))
        if plan.overtaken:
            raise PartlyDone(f"not moved back: {', '.join(plan.overtaken)} ({since.moved} "
                             f"moved it since, and that stands); {restored}")
        if plan.missing:
            root = work.config.mail_root
            moved = ", ".join(maildir.relative_path(root, new) for _, new in work.moves)
            raise PartlyDone(f"not moved back: {', '.join(plan.missing)} (gone: no longer "
                             f"where the write put it, moved or deleted since); moved back: "
                             f"{moved or 'nothing'}; {restored}")
        if plan.removed:
            raise PartlyDone(f"moved to the inbox: {', '.join(plan.removed)} was removed "
                             f"since; {restored}")
        if kept:
            raise PartlyDone(restored)
    return step


def _revert_tags(work: MessageWork, change: dict[str, Any], *, placed: bool,
                 keep: frozenset[str] = frozenset()) -> list[str]:
    """Turn back the tag changes ``change`` recorded -- only those, so later changes by others
    survive, and none of ``keep`` (a later write changed those again).  With ``placed`` (files
    not back where the write found them) the place tags are not turned back but set for where
    the files are now, as a move sets them: a message left in Trash must not be tagged inbox.
    Returns the place tags the write changed that are not as they were before it."""
    before, after = set(change["tags_before"]), set(change["tags_after"])
    place = (folder_place_tags(work.config) if placed else frozenset()) | keep
    work.tag(add=sorted(before - after - place), remove=sorted(after - before - place))
    if not placed:
        return []
    work.settle_place_tags()
    now = work.current().tags
    return sorted(t for t in (before ^ after) & (place - keep) if (t in now) != (t in before))


def _roll_back(ctx: WriteContext, undone: BatchReport) -> BatchReport:
    """Revert what an undo that could not finish did to the other messages."""
    records = {c["message_id"]: c for c in undone.changes}
    return run(ctx, list(records), revert_step(records))


@dataclass(frozen=True)
class Undone:
    """An entry undone: what its messages' revert did, and what ``restore_rows`` left of
    its non-mail rows as later writes set them (one line each)."""

    entry: sidecar.AuditEntry
    report: BatchReport
    kept: list[str]


# Puts back an entry's non-mail rows (contacts) in the sidecar; returns what it left as later
# writes set it, one line each.
RestoreRows = Callable[[sqlite3.Connection, sidecar.AuditEntry], list[str]]


def undo_last(ctx: WriteContext, restore_rows: RestoreRows | None = None,
              audit_id: int | None = None) -> Undone | None:
    """Revert the latest audit entry not yet undone that was made in ``ctx.session`` -- what
    the model calling means by "undo that" is its own write, never another session's, the
    CLI's or a pass's: its tags, files moved back into the folders they came from (into
    ``cur/``, keeping the flags they have now), and -- through ``restore_rows`` -- the
    non-mail rows it recorded (contacts).  What later writes changed on its messages and
    rows stands (see revert_step, and ``restore_rows``).  None when nothing is left; a
    ChangeError when only others' are.
    ``audit_id``: that entry instead, whoever made it (asked for by name: a write of an
    earlier server, or another session's, that the user wants undone)."""
    told: list[tuple[str, list[dict[str, Any]]]] = []
    try:
        with _one_undo_at_a_time(ctx):
            return _undo_latest(ctx, restore_rows, audit_id, told)
    finally:  # the follow-up (a sidecar sync, a push) once the lock is let go: writes wait
        for action, changed in told:  # for the undo, not for that
            notify(ctx, action, changed)


def _undo_latest(ctx: WriteContext, restore_rows: RestoreRows | None, audit_id: int | None,
                 told: list[tuple[str, list[dict[str, Any]]]]) -> Undone | None:
    """The undo, holding the undo lock; what ``notify`` is to be told goes in ``told``."""
    with sidecar.opened(ctx.sidecar_file) as conn:
        if audit_id is not None:
            entry = sidecar.write_left(conn, audit_id)
            if entry is None:
                raise ChangeError(f"nothing was undone: audit {audit_id} is no write left to "
                                  "undo (undone already, made by fmail-nm itself, or unknown)")
        elif (entry := sidecar.last_write(conn, ctx.session)) is None:
            _none_of_this_session(conn, ctx.session)
            return None
    if entry.params.get(NOT_UNDOABLE) and audit_id is not None:  # asked for by name: stays
        raise ChangeError(f"nothing was undone: audit {entry.id} ({entry.action}) cannot be "
                          f"reverted: {entry.params[NOT_UNDOABLE]}")
    if entry.params.get(NOT_UNDOABLE):
        with sidecar.opened(ctx.sidecar_file) as conn:
            # Skipped, so the next call reaches older writes (its undone_upto is never read).
            sidecar.mark_undone(conn, entry.id, sidecar.newest_entry(conn))
        raise ChangeError(f"nothing was undone: this session's latest write ({entry.action}) "
                          f"cannot be reverted: {entry.params[NOT_UNDOABLE]}. Call "
                          "undo_last_write again to undo the write before it")
    changes = {c["message_id"]: c for c in entry.changes if "message_id" in c}
    # Per message, the newest entry when its revert read what stands (see mark_undone).
    read_upto: dict[str, int] = {}

    # Read by each write session's first message (see Standing): a retry after re-indexing
    # reads again -- another session may have written meanwhile, before the retry's revert
    # (and after the first session's: each message keeps the read its own revert went by).
    @functools.cache
    def read(txn: WriteTxn) -> Standing:
        with sidecar.opened(ctx.sidecar_file) as conn:
            return standing(conn, entry)

    def seen(work: MessageWork) -> Standing:
        now = read(work.txn)
        read_upto[work.mid] = now.upto
        return now
    report = run(ctx, list(changes), revert_step(changes, seen))
    if report.failed or report.stale:  # all or nothing: put the others back as they were
        _nothing_undone(ctx, entry, report, "; ".join(
            f"{mid}: {text}" for mid, text in report.errors
            if mid in {*report.failed, *report.stale}), told)
    reverted = {mid: read_upto[mid] for mid in report.applied}

    def undone(conn: sqlite3.Connection) -> list[str]:
        if not entry.contact_rows or restore_rows is None:
            sidecar.mark_undone(conn, entry.id, max(reverted.values(), default=None)
                                or sidecar.newest_entry(conn), reverted)
            return []
        # One transaction: rows put back but the entry not marked undone would be put back
        # again by the next undo, and the log would say the write stands.
        with sidecar.enclosing(conn, keep=True):
            kept = restore_rows(conn, entry)
            # Its rows were put back as its own read of what stands, just now, said; a write
            # recorded since its mail's revert read was made after that (see mark_undone).
            sidecar.mark_undone(conn, entry.id, sidecar.newest_entry(conn), reverted)
        return kept
    rows = bool(entry.contact_rows) and restore_rows is not None
    try:
        kept = _recorded(ctx, "the sidecar could not put its contacts back and record the undo"
                         if rows else f"the {entry.action} was undone, but the sidecar could "
                         "not record that: do not undo it again", undone)
    except UnrecordedWrite as exc:
        if rows:  # its contacts stand as the write left them: so does its mail
            _nothing_undone(ctx, entry, report, str(exc), told)
        raise
    finally:
        if not told:  # else told of the roll-back (see _nothing_undone)
            told.append((f"undo {entry.action}", report.changes))
    report.audit_id = entry.id
    return Undone(entry, report, kept)


def _nothing_undone(ctx: WriteContext, entry: sidecar.AuditEntry, undone: BatchReport,
                    why: str, told: list[tuple[str, list[dict[str, Any]]]]) -> NoReturn:
    """An undo is all or nothing: when part of it cannot be done, the messages it reverted
    go back as the write left them, and a ChangeError says why.  Undoing the write again
    then reverts it whole -- not files put back already, which it would find gone."""
    back = _roll_back(ctx, undone)
    told.append((f"undo {entry.action} (rolled back)", undone.changes + back.changes))
    left = "" if not back.errors else (" -- and putting back " + "; ".join(
        f"{mid}: {text}" for mid, text in back.errors) + " failed")
    raise ChangeError(f"nothing was undone ({why}){left}; the write can be undone once "
                      "that is fixed")


def _none_of_this_session(conn: sqlite3.Connection, session: str | None) -> None:
    """Raises a ChangeError naming the latest write left to undo that another session, the
    CLI or an earlier server made, if there is one: "nothing to undo" would mislead."""
    other = sidecar.last_write(conn, session, others=True)
    if other is not None:
        raise ChangeError(f"nothing was undone: this session has no write left to undo "
                          f"(undo_last_write reverts only the writes made in this session); "
                          f"the latest write left was made elsewhere (another session, the "
                          f"CLI or an earlier server): audit {other.id} ({other.action}, "
                          f"{other.at}); undo_last_write(audit_id={other.id}) reverts it if "
                          "the user asks")
