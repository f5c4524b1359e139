"""Moving message files between Maildir folders, in step with the notmuch index.

A move is a rename the mail syncer pushes back (mbsync sees a file vanish from one folder and
a new one appear in another).  Three rules make that safe:

* The new name has no ``,U=<n>``: that UID belonged to the old folder, and mbsync refuses a
  file whose UID is beyond the highest it assigned in the new one.  The ``:2,FLAGS`` part is
  kept; a file from ``new/`` lands in ``cur/`` with an (empty or kept) ``:2,`` part.
* Nothing is ever overwritten: the file is hard-linked to its new name (which fails if the
  name is taken) and only then unlinked; a taken name gets a fresh Maildir name instead.
* Files and index stay in step: the rename, ``add_file(new)`` and ``remove_file(old)`` happen
  inside one write session (``Writer.run`` wraps it in ``db.atomic()``), the new file is added
  before the old one is forgotten (so the message, its tags and properties survive), and if
  notmuch fails after the rename, the rename is undone.

Several files per Message-ID (a Sent copy plus the copy the user cc'd to themself, the same
mail delivered to two accounts) -- the policy:

* A write acts only on the copies inside one account: the one given by the caller, else the
  account of the message's primary file (the first file notmuch lists).  Copies in other
  accounts are left alone, since each account is a separate mailbox on a separate server.
* Files are moved, never unlinked, so no copy is ever lost and the last copy is never removed.
* delete, junk and move-to-folder move every copy of the account that is not already in the
  destination folder; archive moves only the copy (or copies) in the account's inbox folder;
  restore moves the copies in the account's Trash and Junk folders back to where they came from
  (the writer keeps that per file in the message property ``fmail.origin``), else to the inbox.
* Tags belong to the message, not to a file: after a move, the message's place tags are what
  the post-new rules would give for the folders its files are now in (see :func:`place_tags`).
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .config import Account, Config
from .nm import IndexedMessage, WriteTxn
from .reads import Mailbox

INFO_SEPARATOR = ":2,"
MAILDIR_SUBDIRS = ("cur", "new", "tmp")
_UID_PART = re.compile(r",U=\d+")
_FRESH_NAMES = itertools.count(1)

# Tags that say where a message lives (DESIGN.md, "Tags"), by the role of a folder that implies
# them.  Trash, Junk and Archive win over the inbox, as in the default post-new rules.
PLACE_TAGS = ("inbox", "deleted", "spam", "archived")
_ROLE_TAGS = {"trash": "deleted", "junk": "spam", "archive": "archived"}
_NEVER_INBOX = frozenset({"sent", "draft", "list"})

# Errors from os.link that mean "this filesystem has no hard links", not "this move is wrong".
_NO_HARDLINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK}


class MoveError(RuntimeError):
    """A file could not be moved; for that file nothing changed, on disk or in the index."""


@dataclass(frozen=True)
class MaildirName:
    """A Maildir file name split into its unique part (without ``,U=``) and its flags."""

    key: str
    flags: str

    @classmethod
    def parse(cls, name: str) -> MaildirName:
        base, sep, flags = name.partition(INFO_SEPARATOR)
        return cls(key=_UID_PART.sub("", base), flags=flags if sep else "")

    def filename(self) -> str:
        return f"{self.key}{INFO_SEPARATOR}{self.flags}"

    def fresh(self) -> MaildirName:
        """A new unique name with the same flags, for when the plain name is taken."""
        now = time.time()
        key = (f"{int(now)}.M{int(now % 1 * 1e6)}P{os.getpid()}Q{next(_FRESH_NAMES)}."
               f"{socket.gethostname().replace('/', '_').replace(':', '_')}")
        return MaildirName(key=key, flags=self.flags)


def file_key(path: str | os.PathLike[str]) -> str:
    """What stays the same when mbsync or a flag change renames a file: its unique part."""
    return MaildirName.parse(Path(path).name).key


# ---------------------------------------------------------------------------------------------
# Folders


def folder_path(config: Config, folder: str) -> Path:
    return config.mail_root if folder == "." else config.mail_root / folder


def is_known_folder(config: Config, folder: str) -> bool:
    """A folder we may move mail into: a role folder of an account, a folder seen when the
    config was loaded, or a Maildir folder on disk now."""
    if folder in config.folders or any(folder in a.folders.values() for a in config.accounts):
        return True
    base = folder_path(config, folder)
    return (base / "cur").is_dir() or (base / "new").is_dir()


def ensure_maildir(config: Config, folder: str) -> Path:
    """The folder's directory, with ``cur/ new/ tmp/`` created when missing (a fresh clone or
    a role folder nobody has used yet)."""
    base = folder_path(config, folder)
    for sub in MAILDIR_SUBDIRS:
        (base / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    return base


def role_of(config: Config, folder: str) -> str | None:
    for account in config.accounts:
        for role, role_folder in account.folders.items():
            if role_folder == folder:
                return role
    return None


def place_tags(config: Config, folders: Iterable[str],
               tags: Iterable[str]) -> tuple[set[str], set[str]]:
    """(add, remove) among PLACE_TAGS for a message with these tags whose files are in these
    folders -- what the default post-new rules give a file arriving there: Trash -> deleted,
    Junk -> spam, Archive -> archived, else inbox for a copy in an inbox folder unless the
    message is the user's own, a draft or list mail; any other folder (Sent, a project folder)
    means "filed": no place tag."""
    roles = {role_of(config, f) for f in folders}
    add = {tag for role, tag in _ROLE_TAGS.items() if role in roles}
    if not add and "inbox" in roles and not _NEVER_INBOX & set(tags):
        add = {"inbox"}
    return add, set(PLACE_TAGS) - add


# ---------------------------------------------------------------------------------------------
# Which copies a write acts on


@dataclass(frozen=True)
class Copy:
    path: Path
    folder: str


def primary_account(mb: Mailbox, message: IndexedMessage) -> Account | None:
    """The account of the message's primary file (the first one notmuch lists)."""
    for name in message.filenames[:1]:
        folder = mb.folder_of(name)
        if folder is not None:
            return mb.config.account_for_path(folder)
    return None


def copies_in(mb: Mailbox, message: IndexedMessage, account: Account) -> list[Copy]:
    """The message's files inside one account (nested accounts are told apart)."""
    found = []
    for name in message.filenames:
        folder = mb.folder_of(name)
        if folder is not None and mb.config.account_for_path(folder) == account:
            found.append(Copy(Path(name), folder))
    return found


# ---------------------------------------------------------------------------------------------
# The move itself


def move_file(txn: WriteTxn, source: Path, dest_folder: Path) -> Path:
    """Move one message file into ``dest_folder/cur/`` and tell notmuch; returns the new path.

    Raises MoveError (and leaves file and index as they were) when it cannot be done.
    """
    target = _place(source, dest_folder / "cur", MaildirName.parse(source.name))
    try:
        # Tags stay as they are: a move is not a flag change, and the caller sets place tags.
        txn.add_file(target, sync_flags=False)
    except Exception as exc:
        _put_back(target, source)
        raise MoveError(f"notmuch could not index {target.name}: {exc}") from exc
    try:
        txn.remove_file(source)
    except Exception as exc:
        try:
            txn.remove_file(target)
        finally:
            _put_back(target, source)
        raise MoveError(f"notmuch could not forget {source}: {exc}") from exc
    return target


def _place(source: Path, cur: Path, name: MaildirName) -> Path:
    """Rename ``source`` into ``cur`` under ``name`` (or a fresh name if taken), never
    overwriting anything."""
    candidate = cur / name.filename()
    for _ in range(100):
        try:
            os.link(source, candidate, follow_symlinks=False)
        except FileExistsError:
            candidate = cur / name.fresh().filename()
            continue
        except FileNotFoundError:
            raise MoveError(f"{source.name} is gone from {source.parent} (moved by another "
                            "program?); re-index and try again") from None
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                raise MoveError(f"{cur} is on another filesystem than {source}; moves must "
                                "stay on one filesystem") from None
            if exc.errno not in _NO_HARDLINKS:
                raise MoveError(f"cannot move {source.name} to {cur}: {exc.strerror}") from None
            return _rename_unless_taken(source, candidate, name)
        os.unlink(source)
        return candidate
    raise MoveError(f"no free file name in {cur}")


def _rename_unless_taken(source: Path, candidate: Path, name: MaildirName) -> Path:
    # Without hard links there is no atomic "rename unless the name exists"; check first.
    while candidate.exists():
        candidate = candidate.parent / name.fresh().filename()
    try:
        os.rename(source, candidate)
    except OSError as exc:
        raise MoveError(f"cannot move {source.name} to {candidate.parent}: "
                        f"{exc.strerror}") from None
    return candidate


def _put_back(target: Path, source: Path) -> None:
    os.rename(target, source)
