"""The Maildir layout: file names, folders, accounts and folder roles -- the one module that
knows how a path under the mail root maps to a folder, an account and a role.

Folder names are relative to the mail root; a mail root that is itself a Maildir is the folder
``"."`` (``config.ROOT_FOLDER``) everywhere fmail-nm names a folder -- accounts and roles, the
tools, the DSL, move targets, the sidecar mirror.  Only the notmuch queries it generates spell
it notmuch's way, ``folder:""`` (``config.folder_term``).

A Maildir file name is ``<unique part>[,U=<uid>]:2,<flags>``; ``,U=`` is mbsync's UID for the
folder the file is in (see ARCHITECTURE.md, "Traps": a moved file must lose it).
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import ROOT_FOLDER, Account, Config
from ..message.headers import header, msg_id, read_head, split_head
from .notmuch import IndexedMessage, Reader

INFO_SEPARATOR = ":2,"
MAILDIR_SUBDIRS = ("cur", "new", "tmp")
_UID_PART = re.compile(r",U=\d+")
_FRESH_NAMES = itertools.count(1)


# ---------------------------------------------------------------------------------------------
# File names


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


def on_disk(path: Path) -> list[Path]:
    """The file as it is named now: ``path`` itself, or -- after mbsync renamed it behind
    notmuch's back (adding ``,U=``) or a client changed its flags -- the file in the same
    folder with the same unique part.  Empty when it is gone, also with its folder."""
    if os.path.exists(path):  # unlike Path.exists, False also in a folder it cannot search
        return [path]
    key, folder = file_key(path), path.parent.parent
    return [candidate for sub in ("cur", "new")
            for candidate in _entries(folder / sub) if file_key(candidate) == key]


def _entries(directory: Path) -> list[Path]:
    """What ``directory`` holds; nothing when it is not there or cannot be read -- checking
    first would not do: mbsync removes a folder the server dropped, the user deletes one,
    at any moment."""
    try:
        return list(directory.iterdir())
    except OSError:  # FileNotFoundError, NotADirectoryError, PermissionError
        return []


# ---------------------------------------------------------------------------------------------
# Paths and folders


def folder_of(mail_root: Path, filename: str | os.PathLike[str]) -> str | None:
    """The folder a message file is in, ``"."`` for the root; None for a path that is not a
    message file under the mail root."""
    path = Path(filename)
    if path.parent.name not in MAILDIR_SUBDIRS:
        return None
    try:
        rel = path.parent.parent.relative_to(mail_root).as_posix()
    except ValueError:
        return None
    return rel or ROOT_FOLDER


def notmuch_folder(filename: str | os.PathLike[str], mail_root: Path) -> str | None:
    """The folder notmuch files a file under (what its ``folder:`` term matches): relative to
    the mail root, with a trailing ``cur``/``new`` dropped -- also for a file notmuch indexed
    outside a Maildir, unlike :func:`folder_of`."""
    parent = Path(filename).parent
    if parent.name in ("cur", "new"):
        parent = parent.parent
    try:
        return parent.relative_to(mail_root).as_posix()  # "." (ROOT_FOLDER) for the root
    except ValueError:
        return None


def folders_of(mail_root: Path, filenames: Iterable[str]) -> list[str]:
    """The folders a message's files are in, sorted, each once."""
    return sorted({f for f in (folder_of(mail_root, name) for name in filenames) if f})


def relative_path(mail_root: Path, path: str | os.PathLike[str]) -> str:
    """A path relative to the mail root (so a record survives moving the whole tree), or the
    path as it is when it lies outside."""
    try:
        return Path(path).relative_to(mail_root).as_posix()
    except ValueError:
        return str(path)


def folder_path(config: Config, folder: str) -> Path:
    return config.mail_root if folder == ROOT_FOLDER else config.mail_root / folder


def is_known_folder(config: Config, folder: str) -> bool:
    """A folder we may move mail into: a role folder of an account, a folder seen when the
    config was loaded, or a Maildir folder on disk now."""
    return folder in config.folders or is_there_now(config, folder)


def is_there_now(config: Config, folder: str) -> bool:
    """A role folder of an account (created when first used), or a Maildir folder on disk
    now -- not one that was there when the config was loaded and has been removed since."""
    if any(folder in a.folders.values() for a in config.accounts):
        return True
    base = folder_path(config, folder)
    return (base / "cur").is_dir() or (base / "new").is_dir()


def ensure_maildir(config: Config, folder: str) -> Path:
    """The folder's directory, with ``cur/ new/ tmp/`` created when missing (a fresh clone or
    a role folder nobody has used yet)."""
    return _made_whole(folder_path(config, folder))


def _made_whole(base: Path) -> Path:
    for sub in MAILDIR_SUBDIRS:
        (base / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    return base


# ---------------------------------------------------------------------------------------------
# The hold: where a copy goes that leaves its folder without going anywhere

# A directory inside a folder's tmp/.  notmuch new does not index a Maildir's tmp/, nor does
# the watcher count it, and mbsync neither syncs it nor clears it (it removes only stale
# files lying directly in tmp/, not directories), so a file moved there has left the folder
# -- for the index and, after the next push, for the server -- and is still on disk.
HOLD = "fmail-held"


def ensure_hold(path: Path) -> Path:
    """The hold of the folder a message file is in, created when missing -- with the folder's
    ``cur/ new/ tmp/``: notmuch new leaves ``tmp/`` alone only in a whole Maildir."""
    hold = _made_whole(path.parent.parent) / "tmp" / HOLD
    hold.mkdir(mode=0o700, exist_ok=True)
    return hold


def is_held(path: Path) -> bool:
    """Whether a file lies in a folder's hold (and so is in no folder and not indexed)."""
    return path.parent.name == HOLD and path.parent.parent.name == "tmp"


def held_folder(mail_root: Path, path: Path) -> str | None:
    """The folder whose hold a held file is in."""
    return folder_of(mail_root, path.parent)  # the hold lies in the folder's tmp/


def held_copy(config: Config, folder: str, key: str) -> Path | None:
    """The file with this unique part in the folder's hold; None when there is none (never
    held, taken back, or pruned)."""
    return next((path for path in _held_in(config, folder) if file_key(path) == key), None)


def held_files(config: Config) -> list[Path]:
    """Every held copy, in the holds of all configured folders (a stat each without one)."""
    return [path for folder in config.folders for path in _held_in(config, folder)]


def _held_in(config: Config, folder: str) -> list[Path]:
    return held_in(folder_path(config, folder))


def held_in(folder: Path) -> list[Path]:
    """The held copies of the Maildir folder at this path."""
    try:
        entries = list(os.scandir(folder / "tmp" / HOLD))
    except OSError:
        return []
    return [Path(e.path) for e in entries]


# Enough of a file for its header block (read_head reads on to the block's end).
HELD_HEAD_BYTES = 16384


def held_message_id(path: Path) -> str | None:
    """The Message-ID of a held copy, as notmuch has it; None when its header has none (or it
    cannot be read)."""
    try:
        with open(path, "rb") as fh:
            head = read_head(fh, HELD_HEAD_BYTES)
    except OSError:
        return None
    return msg_id(header(split_head(head)[0], "Message-ID"))


# How long a held copy is kept for undo_last_write; then it is removed.  Its message had
# another file where the copy was bound (a Gmail user's every archived message: All Mail
# holds it), so keeping each one for ever would double the archive on disk.  A copy whose
# other files all went since is not removed: it took their place if the post-new pass saw
# them go (passes.holds), and is the message's last copy if not (or if they went from Trash).
HOLD_DAYS = 30


def prune_holds(config: Config, reader: Reader, now: float | None = None) -> int:
    """Remove the held copies that came into a hold more than ``HOLD_DAYS`` ago (a rename
    sets a file's ctime) and whose message has a file in the index; returns how many.  An
    undo of an older write names them gone."""
    cutoff = (time.time() if now is None else now) - HOLD_DAYS * 86400
    removed = 0
    for path in held_files(config):
        try:
            info = path.lstat()
        except OSError:  # gone meanwhile (an undo took it back)
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_ctime >= cutoff:
            continue
        message_id = held_message_id(path)
        if message_id is None or reader.find(message_id) is None:
            continue  # its last copy (or one we cannot tell): never removed
        try:
            os.unlink(path)
            removed += 1
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    return removed


# ---------------------------------------------------------------------------------------------
# Roles and accounts


def role_of(config: Config, folder: str) -> str | None:
    """The role (inbox, sent, drafts, trash, junk, archive) of a folder in any account."""
    for account in config.accounts:
        for role, role_folder in account.folders.items():
            if role_folder == folder:
                return role
    return None


def in_role(config: Config, filenames: Iterable[str], role: str) -> bool:
    """Whether any of the files lies in a folder of this role (in any account)."""
    wanted = set(config.roles().get(role, []))
    return any(folder_of(config.mail_root, name) in wanted for name in filenames)


def account_of(config: Config, folders: Sequence[str]) -> Account | None:
    """The account of the first of these folders that belongs to one."""
    for folder in folders:
        account = config.account_for_path(folder)
        if account is not None:
            return account
    return None


def account_and_name(config: Config, folder: str) -> tuple[str | None, str]:
    """A folder as (account, its name inside the account), the way IMAP names it: the
    account's own top folder (the root Maildir included) is ``INBOX``."""
    account = config.account_for_path(folder)
    if account is None:
        return None, "INBOX" if folder in (ROOT_FOLDER, "") else folder
    return account.name, account.place(folder) or "INBOX"


# ---------------------------------------------------------------------------------------------
# Which copies of a message a write acts on


@dataclass(frozen=True)
class Copy:
    """One file of a message, with the folder it is in."""

    path: Path
    folder: str


def primary_account(config: Config, message: IndexedMessage) -> Account | None:
    """The account of the message's primary file (the first one notmuch lists)."""
    for name in message.filenames[:1]:
        folder = folder_of(config.mail_root, name)
        if folder is not None:
            return config.account_for_path(folder)
    return None


def copies_by_account(config: Config, message: IndexedMessage
                      ) -> list[tuple[Account, list[Copy]]]:
    """The message's files grouped by account (nested accounts are told apart), the primary
    file's account first; a file in no account is left out."""
    groups: dict[str, tuple[Account, list[Copy]]] = {}
    for name in message.filenames:
        folder = folder_of(config.mail_root, name)
        account = config.account_for_path(folder) if folder is not None else None
        if folder is not None and account is not None:
            groups.setdefault(account.name, (account, []))[1].append(Copy(Path(name), folder))
    return list(groups.values())
