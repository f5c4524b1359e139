"""The sidecar and the data directory are the user's alone: 0600 files, 0700 directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fmail_nm.private import private_dir, private_file
from fmail_nm.store import sidecar

from .conftest import MailEnv


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_indexed_sidecar_is_private(indexed: MailEnv) -> None:
    path = sidecar.sidecar_path(indexed.config().data_dir)
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    for journal in ("-wal", "-shm"):
        extra = path.with_name(path.name + journal)
        if extra.exists():
            assert mode(extra) == 0o600, journal


def test_loose_modes_left_by_an_older_version_are_tightened_on_open(indexed: MailEnv) -> None:
    path = sidecar.sidecar_path(indexed.config().data_dir)
    os.chmod(path, 0o644)
    os.chmod(path.parent, 0o755)
    with sidecar.opened(path) as conn:
        conn.execute("SELECT count(*) FROM messages").fetchone()
    assert mode(path) == 0o600 and mode(path.parent) == 0o700


def test_private_paths_ignore_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        folder = private_dir(tmp_path / "a" / "b")
        private_file(folder / "f")
    finally:
        os.umask(old)
    assert mode(folder) == 0o700 and mode(folder / "f") == 0o600
    assert (folder / "f").read_bytes() == b""
    (folder / "f").write_bytes(b"kept")
    os.chmod(folder / "f", 0o666)
    private_file(folder / "f")
    assert mode(folder / "f") == 0o600 and (folder / "f").read_bytes() == b"kept"
