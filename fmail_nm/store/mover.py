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
  the user's tagging rules give for the folders its files are now in
  (:func:`fmail_nm.passes.tagging.place_tags`).

Which copies of a message a write acts on is told by :mod:`fmail_nm.store.maildir`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import BackendError
from .maildir import MaildirName
from .notmuch import WriteTxn

# Errors from os.link that mean "this filesystem has no hard links", not "this move is wrong".
_NO_HARDLINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK}


class MoveError(BackendError):
    """A file could not be moved; for that file nothing changed, on disk or in the index."""


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
