"""The IMAP test bed works: a real Dovecot on loopback, a real mbsync, real Maildir files.

These tests also pin down the mbsync behaviour the product relies on (flag renames are pushed,
a move between folders must drop ``,U=<n>``).  They fail -- never skip -- when Dovecot or
mbsync is missing: CI installs both.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import imapbed
from .imapbed import (
    ImapServer,
    MbsyncError,
    append,
    fetch_state,
    run_mbsync,
    write_mbsync_config,
)
from .syncbed import require_tools

pytestmark = pytest.mark.imap

UID_BEYOND = "beyond highest assigned UID"


def message(n: int, subject: str = "hello") -> bytes:
    return (
        f"From: Sender {n} <sender{n}@example.org>\r\n"
        f"To: alex@example.com\r\n"
        f"Subject: {subject} {n}\r\n"
        f"Date: Mon, 01 Jan 2024 10:{n % 60:02d}:00 +0000\r\n"
        f"Message-ID: <msg{n}@example.org>\r\n"
        f"\r\n"
        f"Body of message {n}.\r\n"
    ).encode()


@pytest.fixture(autouse=True)
def _tools_installed() -> None:
    require_tools(("dovecot", "mbsync"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ImapServer]:
    # cleanup=False: keep dovecot.log in tmp_path when a test fails (pytest prunes old dirs).
    with ImapServer(tmp_path / "imap", cleanup=False) as srv:
        yield srv
        problems = [
            line
            for line in srv.log().splitlines()
            if ": Error: " in line or ": Fatal: " in line or ": Panic: " in line
        ]
        assert not problems, "Dovecot logged errors:\n" + "\n".join(problems)


@pytest.fixture
def mail_root(tmp_path: Path) -> Path:
    return tmp_path / "mail"


@pytest.fixture
def mbsync_cfg(tmp_path: Path, server: ImapServer, mail_root: Path) -> Path:
    return write_mbsync_config(tmp_path / "mbsyncrc", server, "alex", mail_root)


def files(folder: Path) -> list[Path]:
    """Message files of a local Maildir folder (new/ and cur/)."""
    return sorted(p for sub in ("new", "cur") for p in (folder / sub).iterdir())


def ids(state: dict[str, list[imapbed.ServerMessage]], folder: str) -> list[str]:
    return [m.message_id for m in state[folder]]


def assert_clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert UID_BEYOND not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_server_greets_and_lists_special_folders(server: ImapServer) -> None:
    assert server.host == "127.0.0.1"
    assert server.running
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        greeting = sock.makefile("rb").readline()
    assert greeting.startswith(b"* OK"), greeting
    assert b"AUTH=PLAIN" in greeting

    config = server.config_path.read_text()
    assert "listen = 127.0.0.1\n" in config
    assert "ssl = no\n" in config

    for user in server.users:
        with server.imap(user) as client:
            typ, listing = client.list()
        assert typ == "OK"
        text = b"\n".join(x for x in listing if isinstance(x, bytes)).decode()
        for folder, flag in imapbed.SPECIAL_FOLDERS.items():
            assert f'{flag}) "/" {folder}' in text, text
        assert fetch_state(server, user) == {
            name: [] for name in ["INBOX", *imapbed.SPECIAL_FOLDERS]
        }


def test_append_and_fetch_state(server: ImapServer) -> None:
    uid1 = append(server, "alex", "INBOX", message(1), flags=("\\Seen", "\\Flagged"))
    uid2 = append(server, "alex", "INBOX", message(2).replace(b"\r\n", b"\n"))
    uid3 = append(server, "alex", "Sent", message(3), flags=("\\Seen",))
    assert (uid1, uid2, uid3) == (1, 2, 1)

    state = fetch_state(server, "alex")
    assert state["INBOX"] == [
        imapbed.ServerMessage("<msg1@example.org>", frozenset({"\\Seen", "\\Flagged"}), 1),
        imapbed.ServerMessage("<msg2@example.org>", frozenset(), 2),
    ]
    assert ids(state, "Sent") == ["<msg3@example.org>"]
    assert fetch_state(server, "work")["INBOX"] == []  # users are separate
    assert fetch_state(server, "alex") == state  # reading changes nothing


def test_pull_creates_maildir_files(
    server: ImapServer, mbsync_cfg: Path, mail_root: Path
) -> None:
    arrived = dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    seen = append(server, "alex", "INBOX", message(1), flags=("\\Seen",), date=arrived)
    unseen = append(server, "alex", "INBOX", message(2))
    append(server, "alex", "Archive", message(3), flags=("\\Seen", "\\Answered"))

    run_mbsync(mbsync_cfg, "alex")

    account = mail_root / "alex"
    for folder in ["INBOX", *imapbed.SPECIAL_FOLDERS]:
        for sub in ("cur", "new", "tmp"):
            assert (account / folder / sub).is_dir(), f"{folder}/{sub}"
    (cur_file,) = (account / "INBOX" / "cur").iterdir()
    (new_file,) = (account / "INBOX" / "new").iterdir()
    assert cur_file.name.endswith(f",U={seen}:2,S"), cur_file.name
    assert new_file.name.endswith(f",U={unseen}:2,"), new_file.name
    (archived,) = files(account / "Archive")
    assert archived.name.endswith(":2,RS"), archived.name
    # mbsync stores LF line ends and inserts an X-TUID header; the rest is the message.
    body = cur_file.read_bytes()
    assert b"Message-ID: <msg1@example.org>\n" in body
    assert body.endswith(b"\n\nBody of message 1.\n")
    # CopyArrivalDate: the file's mtime is the server's INTERNALDATE.
    assert cur_file.stat().st_mtime == arrived.timestamp()

    # A second run with nothing new is a no-op.
    run_mbsync(mbsync_cfg, "alex")
    assert set(files(account / "INBOX")) == {new_file, cur_file}


def test_local_flag_rename_is_pushed(
    server: ImapServer, mbsync_cfg: Path, mail_root: Path
) -> None:
    append(server, "alex", "INBOX", message(1))
    append(server, "alex", "INBOX", message(2), flags=("\\Seen",))
    run_mbsync(mbsync_cfg, "alex")
    inbox = mail_root / "alex" / "INBOX"

    # Read message 1 (new/ -> cur/, add S) and flag message 2 (S -> FS), as a MUA would.
    (unread,) = (inbox / "new").iterdir()
    unread.rename(inbox / "cur" / (unread.name + "S"))
    (read,) = [p for p in (inbox / "cur").iterdir() if p.name.endswith(":2,S") and "U=2" in p.name]
    read.rename(read.with_name(read.name.replace(":2,S", ":2,FS")))

    assert_clean(run_mbsync(mbsync_cfg, "alex"))

    state = fetch_state(server, "alex")
    assert state["INBOX"] == [
        imapbed.ServerMessage("<msg1@example.org>", frozenset({"\\Seen"}), 1),
        imapbed.ServerMessage("<msg2@example.org>", frozenset({"\\Seen", "\\Flagged"}), 2),
    ]


def test_move_to_trash_without_uid_part(
    server: ImapServer, mbsync_cfg: Path, mail_root: Path
) -> None:
    for n in (1, 2, 3):
        append(server, "alex", "INBOX", message(n), flags=("\\Seen",))
    run_mbsync(mbsync_cfg, "alex")
    account = mail_root / "alex"
    victim = next(p for p in (account / "INBOX" / "cur").iterdir() if ",U=2:" in p.name)

    # The product's way to delete: rename into Trash/cur/ with ",U=<n>" stripped.
    moved = account / "Trash" / "cur" / victim.name.replace(",U=2", "")
    victim.rename(moved)
    assert_clean(run_mbsync(mbsync_cfg, "alex"))

    state = fetch_state(server, "alex")
    assert ids(state, "INBOX") == ["<msg1@example.org>", "<msg3@example.org>"]
    assert [(m.message_id, m.flags) for m in state["Trash"]] == [
        ("<msg2@example.org>", frozenset({"\\Seen"}))
    ]
    # mbsync gave the uploaded file its new server UID.
    (trashed,) = files(account / "Trash")
    assert trashed.name.endswith(",U=1:2,S"), trashed.name
    assert len(files(account / "INBOX")) == 2


def test_move_keeping_uid_part_is_refused(
    server: ImapServer, mbsync_cfg: Path, mail_root: Path
) -> None:
    """The gotcha the product must avoid (ARCHITECTURE.md, "Traps"): keeping ",U=<n>" across folders."""
    append(server, "alex", "INBOX", message(1), flags=("\\Seen",))
    run_mbsync(mbsync_cfg, "alex")
    account = mail_root / "alex"
    (victim,) = (account / "INBOX" / "cur").iterdir()
    victim.rename(account / "Trash" / "cur" / victim.name)

    proc = run_mbsync(mbsync_cfg, "alex", check=False)

    assert proc.returncode != 0
    assert UID_BEYOND in proc.stdout + proc.stderr
    assert fetch_state(server, "alex")["Trash"] == []


def test_outage_and_recovery_on_same_port(
    server: ImapServer, mbsync_cfg: Path, mail_root: Path
) -> None:
    append(server, "alex", "INBOX", message(1))
    run_mbsync(mbsync_cfg, "alex")
    port = server.port

    server.stop()
    assert not server.running
    with pytest.raises(OSError):
        socket.create_connection((server.host, port), timeout=2).close()

    # A change made while the server is down ...
    inbox = mail_root / "alex" / "INBOX"
    (unread,) = (inbox / "new").iterdir()
    unread.rename(inbox / "cur" / (unread.name + "S"))
    proc = run_mbsync(mbsync_cfg, "alex", check=False)
    assert proc.returncode != 0
    assert "Connection refused" in proc.stderr and str(port) in proc.stderr, proc.stderr
    with pytest.raises(MbsyncError, match="Connection refused"):
        run_mbsync(mbsync_cfg, "alex")

    # ... is pushed once it is back, on the same port and with the same mail.
    server.start()
    assert server.running and server.port == port
    assert_clean(run_mbsync(mbsync_cfg, "alex"))
    assert fetch_state(server, "alex")["INBOX"] == [
        imapbed.ServerMessage("<msg1@example.org>", frozenset({"\\Seen"}), 1)
    ]


def test_two_accounts_in_one_config(
    tmp_path: Path, server: ImapServer, mail_root: Path
) -> None:
    cfg = tmp_path / "multi.mbsyncrc"
    write_mbsync_config(cfg, server, "alex", mail_root)
    write_mbsync_config(cfg, server, "work", mail_root, append=True)
    assert os.stat(cfg).st_mode & 0o077 == 0  # holds passwords
    append(server, "alex", "INBOX", message(1))
    append(server, "work", "INBOX", message(2))
    append(server, "work", "Junk", message(3))

    run_mbsync(cfg, "alex")
    run_mbsync(cfg, "work")

    assert len(files(mail_root / "alex" / "INBOX")) == 1
    assert len(files(mail_root / "work" / "INBOX")) == 1
    assert len(files(mail_root / "work" / "Junk")) == 1
    assert b"<msg2@example.org>" in files(mail_root / "work" / "INBOX")[0].read_bytes()


def test_long_workdir_cleanup_and_clear_start_error(tmp_path: Path) -> None:
    # A deep workdir would overflow the 108-byte unix socket limit: the runtime dir then
    # lives in a short private temp dir, removed on stop().
    workdir = tmp_path / ("deep" * 20) / "imap"
    with ImapServer(workdir, users={"solo": "pw"}) as srv:
        runtime = srv._runtime_dir()
        assert not runtime.is_relative_to(workdir)
        assert append(srv, "solo", "INBOX", message(1)) == 1
    assert not runtime.exists()
    assert not workdir.exists()  # cleanup=True is the default

    # A port that is taken: a bounded wait, then an error that carries Dovecot's log.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        srv = ImapServer(tmp_path / "taken", port=port, start_timeout=2)
        with pytest.raises(imapbed.ImapBedError, match="Address already in use"):
            srv.start()
        assert not srv.running
