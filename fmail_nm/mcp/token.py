"""The bearer token that guards the HTTP transport.

One random token per data directory, kept in ``<data_dir>/http-token`` with mode 0600.
``FMAIL_TOKEN`` in the environment overrides the file (for service managers and containers).
A running server follows the file (:class:`TokenFile`): a token replaced while it runs takes
effect at once.  The token itself is never logged.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from ..private import private_dir

logger = logging.getLogger(__name__)

TOKEN_ENV = "FMAIL_TOKEN"
TOKEN_FILE = "http-token"


def token_path(data_dir: Path) -> Path:
    """Where the token for ``data_dir`` lives."""
    return Path(data_dir) / TOKEN_FILE


def load_or_create_token(data_dir: Path) -> str:
    """Return the HTTP bearer token: ``$FMAIL_TOKEN``, else the stored one, else a new one.

    A new token (``secrets.token_urlsafe(32)``) is written atomically with mode 0600 whatever
    the umask; a missing ``data_dir`` is created 0700. A stored token that is readable by group
    or others is tightened to 0600 (with a warning).
    """
    from_env = os.environ.get(TOKEN_ENV, "").strip()
    if from_env:
        return from_env

    path = token_path(data_dir)
    existing = _read_token(path)
    if existing:
        return existing

    private_dir(Path(data_dir))
    token = secrets.token_urlsafe(32)
    if existing is not None:  # an empty file: replace it
        path.unlink(missing_ok=True)
    written = _write_new(path, token)
    if written != token:  # somebody else created it first: theirs wins
        return written
    logger.info("created a new HTTP bearer token in %s", path)
    return token


class TokenFile:
    """The token as ``<data_dir>/http-token`` stands now, for a server that runs for days:
    the file is read again whenever it changes (one stat a request), so a token replaced
    while the server runs -- the file deleted and a new one made by ``fmail-nm token``, or
    edited -- is the one it accepts from then on, and the old one stops working.  While the
    file is missing or empty the last token stays in force."""

    def __init__(self, data_dir: Path) -> None:
        self._path = token_path(data_dir)
        self._token = load_or_create_token(data_dir)
        self._seen = self._stamp()

    def __call__(self) -> str:
        stamp = self._stamp()
        if stamp is not None and stamp != self._seen:
            self._seen = stamp
            fresh = _read_token(self._path)
            if fresh and fresh != self._token:
                logger.info("%s changed: its new token is now the one accepted", self._path)
                self._token = fresh
        return self._token

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self._path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size


def server_token(data_dir: Path) -> Callable[[], str]:
    """What a server checks requests against: ``$FMAIL_TOKEN`` when set (fixed for the
    server's life), else the token file as it stands (:class:`TokenFile`)."""
    from_env = os.environ.get(TOKEN_ENV, "").strip()
    if from_env:
        return lambda: from_env
    return TokenFile(data_dir)


def _read_token(path: Path) -> str | None:
    """The stripped token in ``path`` ('' when empty), None when there is no file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if stat.S_IMODE(st.st_mode) & 0o077:
        logger.warning("%s was readable by other users (mode %o); tightened it to 0600 — "
                       "consider replacing the token (delete the file, then `fmail-nm token` makes a "
                       "new one; a running server takes it up)",
                       path, stat.S_IMODE(st.st_mode))
        os.chmod(path, 0o600)
    return path.read_text(encoding="utf-8").strip()


def _write_new(path: Path, token: str) -> str:
    """Create ``path`` holding ``token`` without ever exposing a partial or loose file.

    Writes a private temp file next to it, then hard-links it into place (fails if the target
    appeared meanwhile, in which case the existing token is returned instead).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # the umask may have taken bits away (or left none for us)
            os.write(fd, (token + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            other = _read_token(path)
            if other:
                return other
            os.replace(tmp, path)
        except OSError:  # a filesystem without hard links
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return token
