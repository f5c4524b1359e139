"""Files and directories that hold mail data or secrets: readable by the user only.

The sidecar holds previews, contacts, notes and the audit log; the data directory holds the
HTTP token too.  They are created 0600 / 0700 whatever the umask, and loose ones left by an
older version are tightened whenever they are opened.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """``path`` as a directory only the user can enter (created with its parents if missing;
    existing parents are left as they are: they are not ours)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    tighten(path, DIR_MODE)
    return path


def private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if missing, else tighten it.

    SQLite gives its -wal and -shm files the mode of the database file, so creating the
    database 0600 before SQLite opens it makes its journals private too."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
    except FileExistsError:
        tighten(path, FILE_MODE)
        return
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away
    finally:
        os.close(fd)


def tighten(path: Path, mode: int = FILE_MODE) -> None:
    """Drop group and other bits from an existing file or directory (missing: nothing)."""
    try:
        current = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return
    if current & 0o077:
        os.chmod(path, mode)


def replace_private(path: Path, text: str | bytes) -> None:
    """Write ``path`` whole, mode 0600, atomically: a reader sees the old text or the new.
    Bytes are written as they are (a file put back exactly as it was)."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            out.write(text.encode("utf-8") if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
