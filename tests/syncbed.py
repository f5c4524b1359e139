"""An end-to-end sync set-up: a real Dovecot, a real mbsync, a notmuch index fmail-nm manages.

One account, ``acct`` (IMAP login ``alex``), laid out under the mail root the way fmail-nm
expects::

    <base>/mail/acct/{INBOX,Sent,Trash,Junk,Archive}/{cur,new,tmp}   (Drafts comes from mbsync)
    <base>/mbsyncrc        Expunge Both, Create Both, SyncState *  (imapbed.write_mbsync_config)
    <base>/fmail.toml      the account, its addresses, mbsync_channel, [mbsync] config, data_dir
    <base>/notmuch-config  written by ``fmail-nm init``
    <base>/home/...        HOME and the XDG directories (see conftest.isolated_env)

Typical use (the ``sync_bed`` fixture does the first line, ``synced_bed`` all three)::

    bed = SyncBed(tmp_path).start()
    bed.seed(1, flags=["\\\\Seen"])       # APPEND <sync1@example.org> to INBOX on the server
    bed.init()                            # fmail-nm init, via the CLI, in the isolated env
    report = bed.sync()                   # cycle.sync: mbsync, notmuch new + hooks, tagging
    assert "unread" not in bed.tags(bed.mid(1))
    assert "\\\\Seen" in bed.server_flags(bed.mid(1))

In-process calls (``bed.config()``, ``bed.sync()``, ``bed.reader()``) read the env of this
process: the fixtures monkeypatch ``bed.env`` in; elsewhere use ``with bed.environment():``.

The fixtures are plain pytest fixtures: import them by name into a test module
(``from .syncbed import sync_bed, synced_bed``).  Both fail -- never skip -- when Dovecot,
mbsync or notmuch is missing.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fmail_nm.config import Config
from fmail_nm.service.cycle import SyncReport, sync
from fmail_nm.service.mbsync import Direction, MbsyncRun, run_mbsync
from fmail_nm.store.notmuch import IndexedMessage, Reader, Writer

from . import imapbed
from .conftest import USER_ADDRESSES, MailEnv, isolated_env, run_init
from .imapbed import ImapServer, ServerMessage

ACCOUNT = "acct"
IMAP_USER = "alex"
LOCAL_FOLDERS = ("INBOX", "Sent", "Trash", "Junk", "Archive")
ADDRESS = USER_ADDRESSES[0]  # the account's own address, as in run_init's --address list
SEEN, FLAGGED = "\\Seen", "\\Flagged"

# Tests run mbsync against loopback: fail fast instead of waiting out the product default.
MBSYNC_TIMEOUT = 60.0


def message(n: int, subject: str = "sync test", sender: str | None = None) -> bytes:
    """A small RFC 5322 message with Message-ID ``<sync<n>@example.org>``."""
    sender = sender or f"Sender {n} <sender{n}@example.net>"
    return (
        f"From: {sender}\r\n"
        f"To: Alex Morgan <{ADDRESS}>\r\n"
        f"Subject: {subject} {n}\r\n"
        f"Date: Tue, 02 Jan 2024 09:{n % 60:02d}:00 +0000\r\n"
        f"Message-ID: <sync{n}@example.org>\r\n"
        f"\r\n"
        f"Body of message {n}.\r\n"
    ).encode()


def fmail_toml(base: Path, mbsync_config: Path) -> str:
    return f"""\
# Written by tests/syncbed.py.
data_dir = "{base / "data"}"

[notmuch]
config = "{base / "notmuch-config"}"

[mbsync]
config = "{mbsync_config}"

[[accounts]]
name = "{ACCOUNT}"
addresses = ["{ADDRESS}"]
maildir = "{ACCOUNT}"
mbsync_channel = "{ACCOUNT}"

[accounts.folders]
inbox = "INBOX"
sent = "Sent"
trash = "Trash"
junk = "Junk"
archive = "Archive"
"""


class SyncBed:
    """The server, the local mail, the configs; helpers to act on and inspect both sides."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        # cleanup=False: keep dovecot.log for a failed test (pytest prunes old tmp dirs).
        self.server = ImapServer(self.base / "imap", users={IMAP_USER: "secret"}, cleanup=False)
        self.mail_root = self.base / "mail"
        self.account_dir = self.mail_root / ACCOUNT
        self.mbsync_config = self.base / "mbsyncrc"
        self.mail_env = MailEnv(base=self.base, mail_root=self.mail_root,
                                notmuch_config=self.base / "notmuch-config",
                                fmail_config=self.base / "fmail.toml",
                                env=isolated_env(self.base))
        self._config: Config | None = None

    @property
    def env(self) -> dict[str, str]:
        return self.mail_env.env

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> SyncBed:
        """Start Dovecot and write the mbsync config, fmail.toml and the empty local folders."""
        self.server.start()
        imapbed.write_mbsync_config(self.mbsync_config, self.server, IMAP_USER, self.mail_root,
                                    account=ACCOUNT)
        for folder in LOCAL_FOLDERS:
            for sub in ("cur", "new", "tmp"):
                (self.account_dir / folder / sub).mkdir(parents=True, exist_ok=True)
        self.mail_env.fmail_config.write_text(fmail_toml(self.base, self.mbsync_config))
        return self

    def close(self) -> None:
        """Stop the server for good (a teardown: its log has been read)."""
        self.server.stop(graceful=False)

    @contextmanager
    def environment(self) -> Iterator[None]:
        """This process's env pointed at the bed (for use outside pytest's monkeypatch)."""
        saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def dovecot_problems(self) -> list[str]:
        return [line for line in self.server.log().splitlines()
                if ": Error: " in line or ": Fatal: " in line or ": Panic: " in line]

    # -- fmail-nm ----------------------------------------------------------------------------

    def init(self) -> subprocess.CompletedProcess[str]:
        """``fmail-nm init`` through the CLI, as a user would run it."""
        done = run_init(self.mail_env)
        self._config = None
        return done

    def config(self) -> Config:
        """fmail-nm's resolved configuration (loaded once; call :meth:`reload` after layout
        changes)."""
        if self._config is None:
            from fmail_nm.app import load_config
            self._config = load_config(self.mail_env.fmail_config)
        return self._config

    def reload(self) -> Config:
        self._config = None
        return self.config()

    def sync(self, direction: Direction = "both", **kwargs: object) -> SyncReport:
        kwargs.setdefault("timeout", MBSYNC_TIMEOUT)
        return sync(self.config(), ACCOUNT, direction, **kwargs)  # type: ignore[arg-type]

    def mbsync(self, direction: Direction = "both", **kwargs: float) -> list[MbsyncRun]:
        kwargs.setdefault("timeout", MBSYNC_TIMEOUT)
        return run_mbsync(self.config(), ACCOUNT, direction, **kwargs)

    def index(self) -> None:
        """``notmuch new`` with hooks, then the tagging pass (what a watcher would trigger)."""
        from fmail_nm.service.index import run_index
        run_index(self.config(), show_progress=False)

    def reader(self) -> Reader:
        return Reader(self.config().settings.notmuch_config)

    def writer(self) -> Writer:
        return Writer(self.config().settings.notmuch_config)

    # -- the local side ----------------------------------------------------------------------

    @staticmethod
    def mid(n: int) -> str:
        """The Message-ID of :func:`message` ``n`` as notmuch spells it (no angle brackets)."""
        return f"sync{n}@example.org"

    def find(self, message_id: str) -> IndexedMessage | None:
        with self.reader() as reader:
            return reader.find(message_id)

    def tags(self, message_id: str) -> frozenset[str]:
        found = self.find(message_id)
        assert found is not None, f"{message_id} is not in the notmuch index"
        return found.tags

    def search(self, query: str) -> list[str]:
        """Message-IDs matching a notmuch query, excluded tags included."""
        with self.reader() as reader:
            return sorted(reader.message_ids(query))

    def files(self, message_id: str) -> list[Path]:
        """The message's files on disk, found by Message-ID (not through the index)."""
        needle = f"Message-ID: <{message_id}>".encode()
        return sorted(
            path for path in self.account_dir.glob("*/*/*")
            if path.parent.name in ("cur", "new") and needle in path.read_bytes()
        )

    def maildir_flags(self, message_id: str) -> str:
        (path,) = self.files(message_id)
        return path.name.rpartition(":2,")[2]

    def rename_flags(self, message_id: str, flags: str) -> Path:
        """Give the message's file these Maildir flags, as a mail client does (into cur/)."""
        (path,) = self.files(message_id)
        base = path.name.rpartition(":2,")[0] if ":2," in path.name else path.name
        target = path.parent.parent / "cur" / f"{base}:2,{''.join(sorted(flags))}"
        path.rename(target)
        return target

    # -- the server side ---------------------------------------------------------------------

    def seed(self, n: int, folder: str = "INBOX", flags: Iterable[str] = (), **kwargs: str) -> str:
        """APPEND :func:`message` ``n`` on the server; return its notmuch Message-ID."""
        imapbed.append(self.server, IMAP_USER, folder, message(n, **kwargs), flags=tuple(flags))
        return self.mid(n)

    def server_state(self) -> dict[str, list[ServerMessage]]:
        return imapbed.fetch_state(self.server, IMAP_USER)

    def server_flags(self, message_id: str, folder: str = "INBOX") -> frozenset[str]:
        matches = [m for m in self.server_state()[folder] if m.message_id == f"<{message_id}>"]
        assert len(matches) == 1, f"<{message_id}> in {folder}: {matches}"
        return matches[0].flags

    def store(self, message_id: str, change: str, flags: Iterable[str],
              folder: str = "INBOX") -> None:
        """Change flags on the server, like another mail client would: ``change`` is
        ``+FLAGS``, ``-FLAGS`` or ``FLAGS``."""
        if change not in ("+FLAGS", "-FLAGS", "FLAGS"):
            raise ValueError(change)
        if not re.fullmatch(r"[\w.@+-]+", message_id):
            raise ValueError(f"unsupported Message-ID in this bed: {message_id!r}")
        with self.server.imap(IMAP_USER) as client:
            typ, data = client.select(f'"{folder}"')
            assert typ == "OK", data
            typ, data = client.uid("SEARCH", "HEADER", "Message-ID", f'"<{message_id}>"')
            assert typ == "OK", data
            uids = (data[0] or b"").split()
            assert len(uids) == 1, f"<{message_id}> in {folder}: UIDs {uids}"
            typ, data = client.uid("STORE", uids[0].decode(), change,
                                   "(" + " ".join(flags) + ")")
            assert typ == "OK", data
            client.close()


# -- pytest fixtures ------------------------------------------------------------------------------


def require_tools(programs: tuple[str, ...] = ("dovecot", "mbsync", "notmuch")) -> None:
    """Fail (not skip) with an installation hint when a program is missing."""
    missing = []
    for program in programs:
        try:
            imapbed.find_program(program)
        except imapbed.ImapBedError as err:
            missing.append(str(err))
    if missing:
        pytest.fail("\n".join(missing), pytrace=False)


def seed_standard(bed: SyncBed) -> None:
    """Messages 1-4 in INBOX (plain, read, flagged, read+flagged), 5 in Archive (read)."""
    bed.seed(1)
    bed.seed(2, flags=[SEEN])
    bed.seed(3, flags=[FLAGGED])
    bed.seed(4, flags=[SEEN, FLAGGED])
    bed.seed(5, folder="Archive", flags=[SEEN])


@pytest.fixture
def sync_bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncBed]:
    """A started bed with its env in place; nothing seeded, not initialised.  Dovecot must
    log no error by the end of the test."""
    require_tools()
    bed = SyncBed(tmp_path)
    for key, value in bed.env.items():
        monkeypatch.setenv(key, value)
    bed.start()
    try:
        yield bed
        assert not bed.dovecot_problems(), "\n".join(bed.dovecot_problems())
    finally:
        bed.close()


@pytest.fixture
def synced_bed(sync_bed: SyncBed) -> SyncBed:
    """:func:`seed_standard`, then ``fmail-nm init`` and a first ``cycle.sync``."""
    seed_standard(sync_bed)
    sync_bed.init()
    report = sync_bed.sync()
    assert report.ok, report.errors()
    return sync_bed


def runs_with(program: str, config_path: Path) -> list[int]:
    """The pids of ``program``'s processes (mbsync, msmtp) started with this config file:
    each runs in a session of its own, so one a test's stop left behind is found here."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or gone
            continue
        if argv and Path(os.fsdecode(argv[0])).name == program and \
                os.fsencode(config_path) in argv:
            pids.append(int(entry.name))
    return pids
