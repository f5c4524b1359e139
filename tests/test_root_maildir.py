"""A mail root that is itself a Maildir (cur/new/tmp directly in it, Maildir++ subfolders
beside them): its folder is "." wherever fmail-nm names one -- search results, the DSL, list
and move targets, the sidecar mirror, accounts and roles -- and notmuch's own spelling of it
(``folder:""``) stays inside the queries fmail-nm generates."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from fmail_nm.passes import mirror
from fmail_nm.passes.changes import WriteContext
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader, Writer
from fmail_nm.store.query import folders_query
from fmail_nm.tools import reads, writes

from .conftest import BACK_TO_SCHEMA_4, MailEnv, run_init

IN_ROOT = "school-trip-3@example.com"  # personal/INBOX in the fixtures: the root here
FMAIL_TOML = """\
[[accounts]]
name = "mail"
addresses = ["alex@example.org", "alex.morgan@example.org", "amorgan@acme.test"]
maildir = "."

[accounts.folders]
inbox = "."
archive = ".Archive"
trash = ".Trash"
"""


@pytest.fixture
def root_env(mail_env: MailEnv) -> MailEnv:
    """The fixtures' personal account laid out as one Maildir++ tree at the mail root."""
    root = mail_env.mail_root
    personal = root / "personal"
    for sub in ("cur", "new", "tmp"):  # git keeps no empty tmp/
        (personal / "INBOX" / sub).mkdir(exist_ok=True)
        shutil.move(personal / "INBOX" / sub, root / sub)
    for name in ("Archive", "Trash"):
        shutil.move(personal / name, root / f".{name}")
    shutil.rmtree(personal)
    shutil.rmtree(root / "work")
    mail_env.fmail_config.write_text(FMAIL_TOML)
    run_init(mail_env)
    return mail_env


@pytest.fixture
def ctx(root_env: MailEnv) -> Iterator[WriteContext]:
    config = root_env.config()
    with Reader() as reader, Writer() as writer:
        yield WriteContext(config=config, reader=reader, writer=writer,
                           sidecar_file=sidecar.sidecar_path(config.data_dir))


def _in_root(env: MailEnv) -> int:
    return len([p for sub in ("cur", "new") for p in (env.mail_root / sub).iterdir()])


def test_the_root_maildir_is_one_folder_named_dot_everywhere(
        root_env: MailEnv, ctx: WriteContext) -> None:
    config, reader = ctx.config, ctx.reader
    assert config.accounts[0].maildir == "." and config.accounts[0].folders["inbox"] == "."
    assert "." in config.folders
    in_root = _in_root(root_env)
    assert int(root_env.notmuch("count", "--exclude=false", 'folder:""').stdout) == in_root

    mb = reads.Mailbox(config, reader)
    assert reads.get_email(mb, IN_ROOT).folders == ["."]
    assert reads.search_emails(mb, "in:. in:anywhere", limit=500).total == in_root
    assert reader.count(folders_query(["."]), exclude_tags=()) == in_root
    [listed] = [f for f in reads.list_folders(mb).folders if f.folder == "."]
    assert listed.total == in_root and listed.role == "inbox"

    with sidecar.opened(ctx.sidecar_file) as conn:
        row = conn.execute("SELECT folder, folders FROM messages WHERE message_id = ?",
                           (IN_ROOT,)).fetchone()
        assert row == ("INBOX", json.dumps(["."]))
        spelled = {f for (f,) in conn.execute("SELECT DISTINCT folder FROM message_folders")}
        assert spelled == {".", ".Archive", ".Trash"}
        assert mirror.check(config, reader, conn) == []


def test_mail_moves_out_of_and_back_into_the_root_maildir(
        root_env: MailEnv, ctx: WriteContext) -> None:
    archived = writes.archive(ctx, [IN_ROOT])
    assert archived.applied == [IN_ROOT]
    back = writes.move_to_folder(ctx, [IN_ROOT], ".")
    assert back.applied == [IN_ROOT], back
    out = root_env.notmuch("search", "--output=files", f"id:{IN_ROOT}").stdout.split()
    assert [Path(p).parent.parent for p in out] == [root_env.mail_root]
    assert root_env.notmuch("new", "--no-hooks").stdout.strip() == "No new mail."
    # The move and its undo leave the mirror exact, "." rows included.
    writes.undo_last_write(ctx)
    root_env.fmail("sidecar", "sync")
    with sidecar.opened(ctx.sidecar_file) as conn:
        assert mirror.check(ctx.config, ctx.reader, conn) == []


def test_a_mirror_from_before_names_the_root_dot_once_migrated(
        root_env: MailEnv, ctx: WriteContext) -> None:
    # Schema 3 spelled the root notmuch's way, "".
    with sidecar.opened(ctx.sidecar_file) as conn:
        conn.executescript(BACK_TO_SCHEMA_4)
    with sqlite3.connect(ctx.sidecar_file) as conn:
        conn.execute("UPDATE message_folders SET folder = '' WHERE folder = '.'")
        conn.execute("""UPDATE messages SET folders = '[""' || substr(folders, 5)
                        WHERE folders LIKE '[".",%' OR folders = '["."]'""")
        conn.execute("PRAGMA user_version = 3")
        assert conn.execute("SELECT count(*) FROM message_folders WHERE folder = ''").fetchone()[0]
    with sidecar.opened(ctx.sidecar_file) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sidecar.SCHEMA_VERSION
        assert mirror.check(ctx.config, ctx.reader, conn) == []


def test_a_maildir_plus_plus_tree_found_on_disk_has_its_roles_and_server_names(
        root_env: MailEnv) -> None:
    """Without an account in fmail.toml or mbsync's config, a root Maildir whose folders are
    all dot-named (Dovecot's and Courier's Maildir++, as a delivery agent fills it) is read as
    Maildir++: the root is the INBOX, ".Trash" the Trash.  Read as plain folders it had no
    role at all, so delete, junk and archive were refused and ".Archive" was listed as is."""
    root_env.fmail_config.write_text('addresses = ["alex@example.org"]\n')
    (root_env.mail_root / ".Sent Messages" / "cur").mkdir(parents=True)
    config = root_env.config()
    [account] = config.accounts
    assert (account.maildir, account.layout.subfolders) == (".", "maildir++")
    assert {role: account.folders.get(role) for role in ("inbox", "archive", "trash", "sent")} \
        == {"inbox": ".", "archive": ".Archive", "trash": ".Trash", "sent": ".Sent Messages"}
    with Reader() as reader:
        mb = reads.Mailbox(config, reader)
        names = {f.folder: f.name for f in reads.list_folders(mb).folders}
        assert names == {".": "INBOX", ".Archive": "Archive", ".Trash": "Trash",
                         ".Sent Messages": "Sent Messages"}
        assert reads.search_emails(mb, "in:Archive in:anywhere").total == \
            reader.count(folders_query([".Archive"]), exclude_tags=())
    with Reader() as reader, Writer() as writer:
        ctx = WriteContext(config=config, reader=reader, writer=writer,
                           sidecar_file=sidecar.sidecar_path(config.data_dir))
        assert writes.delete_messages(ctx, [IN_ROOT]).applied == [IN_ROOT]
    out = root_env.notmuch("search", "--exclude=false", "--output=files",
                           f"id:{IN_ROOT}").stdout.split()
    assert [Path(p).parent.parent.name for p in out] == [".Trash"]
