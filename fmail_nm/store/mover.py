"""Moving message files between Maildir folders, in step with the notmuch index.

A move is a rename the mail syncer pushes back (mbsync sees a file vanish from one folder and
a new one appear in another).  Three rules make that safe:

* The new name has no ``,U=<n>``: that UID belonged to the old folder, and mbsync refuses a
  file whose UID is beyond the highest it assigned in the new one.  The ``:2,FLAGS`` part is
  kept; a file from ``new/`` lands in ``cur/`` with an (empty or kept) ``:2,`` part.
* Nothing is ever overwritten, and a file never has two names: the move is one
  ``renameat2(RENAME_NOREPLACE)`` (atomic, fails if the name is taken), so a process killed
  mid-move leaves the file under its old name or its new one, never both; a taken name gets a
  fresh Maildir name instead.  Where the filesystem lacks it, a hard link to the new name and
  an unlink of the old one do the same, less atomically.
* Files and index stay in step: the rename, ``add_file(new)`` and ``remove_file(old)`` happen
  inside one write session (``Writer.run`` wraps it in ``db.atomic()``), the new file is added
  before the old one is forgotten (so the message, its tags and properties survive), and if
  notmuch fails after the rename, the rename is undone.

Several files per Message-ID (a Sent copy plus the copy the user cc'd to themself, the same
mail delivered to two accounts) -- the policy:

* Tags belong to the message, so a write acts on its copies in every account (or only in the
  account the caller names), each copy within its own account: an account is a separate
  mailbox on a separate server, so a copy moves to its own account's folder for the role, and
  never into another account.  An account without that folder keeps its copy, and the write
  says so (the message is then done in part).
* Files are moved, never unlinked, so no copy is ever lost and the last copy is never removed.
* delete, junk and move-to-folder move every copy that is not already in its account's
  destination folder; archive moves only the copies in their account's inbox folder; restore
  moves the copies in their account's Trash and Junk folders back to where they came from
  (the writer keeps that per file in the message property ``fmail.origin``), else to the inbox.
* A copy bound for a folder where its account already has a file of the message -- or where
  another of its copies goes in the same write -- is not moved there but into its own
  folder's hold (:func:`hold_file`): a second file there would be a second copy on the server
  (Gmail keeps every message in ``[Gmail]/All Mail``, so archiving into it doubled each one;
  deleting mail cc'd to oneself put its INBOX and Sent files both in Trash).  The copy still
  leaves its folder, on the server too; it stays on disk, out of the index and of mbsync's
  sight, and undo brings it back -- restore too, when it was bound for Trash or Junk.  It is
  never the last copy: when its message leaves the index (the file it was held for went),
  it takes that file's place (:mod:`fmail_nm.passes.holds`).
* Maildir flags (read, flagged, replied) are renamed on every file of the message by notmuch.
* Tags belong to the message, not to a file: after a move, the message's place tags are what
  the user's tagging rules give for the folders its files are now in
  (:func:`fmail_nm.passes.tagging.place_tags`).

Which copies of a message a write acts on is told by :mod:`fmail_nm.store.maildir`.

New files (a saved draft, the Sent copy of a sent message) follow the Maildir delivery rule:
written and synced in ``tmp/``, then linked into ``cur/`` under a name nothing else has, then
indexed; a replaced draft's old file is forgotten and unlinked only after its successor is in
the index, so the message never leaves it.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import BackendError
from .maildir import MaildirName, ensure_hold, is_held, on_disk
from .notmuch import WriteTxn, flags_saying

# Errors from os.link that mean "this filesystem has no hard links", not "this move is wrong".
NO_HARDLINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK}
# renameat2(2) (Linux 3.15, glibc 2.28): a rename that fails with EEXIST instead of replacing.
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_NOREPLACE_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


@functools.cache
def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    # ctypes loaded at the first move, not on import: the hook imports this module for the
    # moves it seldom makes.
    import ctypes
    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                     ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


class MoveError(BackendError):
    """A file could not be moved; for that file nothing changed, on disk or in the index."""


class SourceGone(MoveError):
    """The file to move is not on disk under the name the index has (renamed by mbsync or a
    mail client since the last index, or deleted)."""


# ---------------------------------------------------------------------------------------------
# The move itself


def move_file(txn: WriteTxn, source: Path, dest_folder: Path,
              tags: Iterable[str] | None = None) -> Path:
    """Move one message file into ``dest_folder/cur/`` and tell notmuch; returns the new path.
    A file out of a hold comes with the Maildir flags the message's ``tags`` say (with
    ``maildir.synchronize_flags``): notmuch renamed its other files while it was held, not
    this one, and the flags it kept would go to the server -- and, once mbsync renames the
    upload, back into the tags.

    Raises MoveError (and leaves file and index as they were) when it cannot be done.
    """
    name = MaildirName.parse(source.name)
    if is_held(source) and tags is not None and txn.sync_flags:
        name = MaildirName(key=name.key, flags=flags_saying(tags, name.flags))
    target = _place(source, dest_folder / "cur", name)
    try:
        # Tags stay as they are: a move is not a flag change, and the caller sets place tags.
        txn.add_file(target, sync_flags=False)
    except Exception as exc:
        _put_back(target, source)
        raise MoveError(f"notmuch could not index {target.name}: {exc}") from exc
    if is_held(source):  # out of the index while held: only its new name is added
        return target
    try:
        txn.remove_file(source)
    except Exception as exc:
        try:
            txn.remove_file(target)
        finally:
            _put_back(target, source)
        raise MoveError(f"notmuch could not forget {source}: {exc}") from exc
    return target


def hold_file(txn: WriteTxn, source: Path) -> Path:
    """Move one message file into its folder's hold (:func:`maildir.ensure_hold`) and forget
    it; returns the new path.  The caller keeps another file of the message indexed, so the
    message stays.  Raises MoveError (and leaves file and index as they were) when it cannot
    be done."""
    target = _place(source, ensure_hold(source), MaildirName.parse(source.name))
    try:
        txn.remove_file(source)
    except Exception as exc:
        _put_back(target, source)
        raise MoveError(f"notmuch could not forget {source}: {exc}") from exc
    return target


def add_new_file(txn: WriteTxn, data: bytes, dest_folder: Path, flags: str) -> Path:
    """Deliver ``data`` as a new file in ``dest_folder/cur/`` with these Maildir flags and
    index it (tags follow the flags); returns its path.  Raises MoveError (and leaves no file
    behind) when it cannot be done."""
    name = MaildirName(key="", flags=flags).fresh()
    staged = dest_folder / "tmp" / name.key
    try:
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())  # on disk before it is visible in cur/ (Maildir delivery)
    except OSError as exc:
        staged.unlink(missing_ok=True)
        raise MoveError(f"cannot write a new file in {dest_folder}: {exc.strerror}") from None
    target = _place(staged, dest_folder / "cur", name)
    try:
        txn.add_file(target, sync_flags=True)
    except Exception as exc:
        target.unlink(missing_ok=True)
        raise MoveError(f"notmuch could not index {target.name}: {exc}") from exc
    return target


def delete_file(txn: WriteTxn, path: Path) -> None:
    """Forget one file of a message and unlink it (a draft that was sent or replaced).  The
    index goes first: a file left behind is found again by the next ``notmuch new``.  A file
    mbsync renamed since the last index (it adds ``,U=``) is found by its unique part."""
    try:
        txn.remove_file(path)
    except Exception as exc:
        raise MoveError(f"notmuch could not forget {path}: {exc}") from exc
    for current in on_disk(path):
        try:
            current.unlink()
        except FileNotFoundError:
            pass  # gone already (mbsync expunged it): what we wanted
        except OSError as exc:
            txn.add_file(path, sync_flags=False)
            raise MoveError(f"cannot remove {current.name}: {exc.strerror}") from None


def _place(source: Path, cur: Path, name: MaildirName) -> Path:
    """Rename ``source`` into ``cur`` (or a hold) under ``name`` (or a fresh name if taken),
    never overwriting anything."""
    candidate = cur / name.filename()
    for _ in range(100):
        try:
            if _rename_noreplace(source, candidate):
                return candidate
            os.link(source, candidate, follow_symlinks=False)
        except FileExistsError:
            candidate = cur / name.fresh().filename()
            continue
        except FileNotFoundError:
            raise SourceGone(f"{source.name} is gone from {source.parent} (moved by another "
                             "program?); re-index and try again") from None
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                raise MoveError(f"{cur} is on another filesystem than {source}; moves must "
                                "stay on one filesystem") from None
            if exc.errno not in NO_HARDLINKS:
                raise MoveError(f"cannot move {source.name} to {cur}: {exc.strerror}") from None
            return _rename_unless_taken(source, candidate, name)
        os.unlink(source)
        return candidate
    raise MoveError(f"no free file name in {cur}")


def _rename_noreplace(source: Path, target: Path) -> bool:
    """Rename atomically unless ``target`` exists (FileExistsError); False where this
    filesystem (or C library) cannot, so the caller links and unlinks instead."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target),
                 _RENAME_NOREPLACE) == 0:
        return True
    import ctypes  # loaded by _renameat2

    code = ctypes.get_errno()
    if code in _NOREPLACE_UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(source), None, str(target))


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
