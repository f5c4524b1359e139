"""Folder names as servers make them and mbsync lays them out on disk, end to end: Gmail's
"[Gmail]/..." folders and a non-ASCII name (modified UTF-7 on the server and, with mbsync
1.4, on disk) under each ``SubFolders`` layout and ``Flatten``.  Whatever the spelling on
disk, each folder gets its role, ``in:`` finds it by the server's name, and a move to it by
that name reaches the server."""

from __future__ import annotations


import pytest

from fmail_nm.passes.changes import WriteContext
from fmail_nm.store import sidecar
from fmail_nm.tools import reads, render, writes

from . import imapbed
from .syncbed import ACCOUNT, IMAP_USER, SyncBed, sync_bed  # noqa: F401  (a fixture)

DRAFTS = "Entw&APw-rfe"  # "Entwürfe" as IMAP (and mbsync 1.4 on disk) spells it
SERVER_FOLDERS = ("[Gmail]/All Mail", "[Gmail]/Sent Mail", "[Gmail]/Trash", "[Gmail]/Spam",
                  DRAFTS)

# The MaildirStore lines of each layout; mbsync refuses Path with Maildir++, whose Inbox is
# the store's root.
LAYOUTS = {
    "verbatim": 'Path "{root}/"\nInbox "{root}/INBOX"\nSubFolders Verbatim',
    "maildir++": 'Inbox "{root}/"\nSubFolders Maildir++',
    "legacy": 'Path "{root}/"\nInbox "{root}/INBOX"\nSubFolders Legacy',
    "flatten": 'Path "{root}/"\nInbox "{root}/INBOX"\nFlatten .',
}

# How each layout spells "[Gmail]/<name>" on disk, below the account's folder.
GMAIL_SPELLED = {"verbatim": "[Gmail]/{}", "maildir++": ".[Gmail].{}", "legacy": "[Gmail]/.{}",
                 "flatten": "[Gmail].{}"}

# The account written out in fmail.toml, tied to its channel, roles left to be found.
IN_FMAIL_TOML = "in fmail.toml"
ACCOUNT_TOML = (f'\n[[accounts]]\nname = "{ACCOUNT}"\nmaildir = "{ACCOUNT}"\n'
                f'mbsync_channel = "{ACCOUNT}"\n')


def _fmail_toml(bed: SyncBed, account: bool) -> str:
    """Without an account the account comes from the mbsync configuration, as for most
    users."""
    return (f'data_dir = "{bed.base / "data"}"\n\n[notmuch]\n'
            f'config = "{bed.base / "notmuch-config"}"\n\n[mbsync]\n'
            f'config = "{bed.mbsync_config}"\n' + (ACCOUNT_TOML if account else ""))


@pytest.fixture(params=[*LAYOUTS, f"maildir++ {IN_FMAIL_TOML}"])
def gmail_bed(request: pytest.FixtureRequest, sync_bed: SyncBed) -> tuple[SyncBed, str]:
    """A Gmail-like server synced by mbsync in one layout: message 1 in "[Gmail]/All Mail",
    2 in INBOX; initialised and synced.  The bed and the layout's name."""
    bed = sync_bed
    for folder in bed.account_dir.iterdir():  # the bed's own Verbatim folders
        for sub in ("cur", "new", "tmp"):
            (folder / sub).rmdir()
        folder.rmdir()
    text = imapbed.mbsync_section(bed.server, IMAP_USER, bed.mail_root, account=ACCOUNT)
    verbatim = LAYOUTS["verbatim"].format(root=bed.account_dir)
    assert verbatim in text
    layout = request.param.removesuffix(f" {IN_FMAIL_TOML}")
    bed.mbsync_config.write_text(
        text.replace(verbatim, LAYOUTS[layout].format(root=bed.account_dir)))
    bed.mail_env.fmail_config.write_text(_fmail_toml(bed, layout != request.param))
    for folder in SERVER_FOLDERS:
        imapbed.create_folder(bed.server, IMAP_USER, folder)
    bed.seed(1, folder="[Gmail]/All Mail")
    bed.seed(2)
    bed.init()
    report = bed.sync()
    assert report.ok, report.errors()
    return bed, layout


def _where(bed: SyncBed, mid: str) -> list[str]:
    """The server folders holding the message."""
    return sorted(folder for folder, found in bed.server_state().items()
                  for m in found if m.message_id == f"<{mid}>")


def test_folders_by_their_server_names_in_every_layout(gmail_bed: tuple[SyncBed, str]) -> None:
    """One bed per layout (a Dovecot and a first sync each), three checks on it in turn."""
    _roles(gmail_bed)
    _listed(gmail_bed)
    _in_finds(gmail_bed)
    _moves(gmail_bed)


def _roles(gmail_bed: tuple[SyncBed, str]) -> None:
    """Gmail's own folders are the roles whatever other folders of those names the server has
    (Dovecot makes Sent, Trash and Junk): under Maildir++ and Flatten too, where
    ".[Gmail].Trash" and "[Gmail].Trash" were not seen as Gmail's."""
    bed, layout = gmail_bed
    account = bed.reload().account(ACCOUNT)  # with the folders mbsync made on the first sync
    assert account.mbsync_channel == ACCOUNT
    gmail = {role: f"{ACCOUNT}/" + GMAIL_SPELLED[layout].format(name)
             for role, name in (("sent", "Sent Mail"), ("trash", "Trash"), ("junk", "Spam"))}
    # A Maildir++ store's root is its INBOX, an account written out in fmail.toml's too.
    inbox = ACCOUNT if layout == "maildir++" else f"{ACCOUNT}/INBOX"
    roles = ("inbox", *gmail)
    assert {role: account.folders.get(role) for role in roles} == {"inbox": inbox, **gmail}


def _listed(gmail_bed: tuple[SyncBed, str]) -> None:
    """list_folders names each folder as the server does where the disk spells it otherwise:
    the model showed the user "Entw&APw-rfe" and ".[Gmail].All Mail"."""
    bed, layout = gmail_bed
    with bed.reader() as reader:
        listed = reads.list_folders(reads.Mailbox(bed.reload(), reader))
    names = {f.folder.removeprefix(f"{ACCOUNT}/"): f.name for f in listed.folders}
    all_mail = GMAIL_SPELLED[layout].format("All Mail")
    assert names[all_mail] == (None if layout == "verbatim" else "[Gmail]/All Mail")
    # mbsync 1.4 keeps IMAP's modified UTF-7 on disk, in every layout.
    assert next(n for f, n in names.items() if DRAFTS in f) == "Entwürfe"
    shown = "" if layout == "verbatim" else ' "[Gmail]/All Mail"'
    lines = render.folders_text(listed).splitlines()
    assert any(line.startswith(f"{ACCOUNT}/{all_mail}{shown}: 1, ") for line in lines), lines


def _in_finds(gmail_bed: tuple[SyncBed, str]) -> None:
    """in:"[Gmail]/All Mail" -- the name the user and the server use -- found nothing but an
    error: only the path under the mail root or its last level were known."""
    bed, _ = gmail_bed
    config = bed.reload()
    with bed.reader() as reader:
        mb = reads.Mailbox(config, reader)
        for query in ('in:"[Gmail]/All Mail"', 'in:"All Mail"'):
            found = reads.search_emails(mb, query)
            assert [r.id for r in found.results] == [sidecar.uid_for(bed.mid(1))], query
        assert reads.search_emails(mb, "in:Entwürfe").total == 0  # a folder, empty so far


def _moves(gmail_bed: tuple[SyncBed, str]) -> None:
    """move_to_folder("Entwürfe") -- not the "Entw&APw-rfe" or ".Entw&APw-rfe" on disk --, a
    delete into Gmail's Trash and the restore from it all reach the server."""
    bed, _ = gmail_bed
    config = bed.reload()
    in_all_mail, in_inbox = bed.mid(1), bed.mid(2)
    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        assert writes.move_to_folder(ctx, [in_inbox], "Entwürfe").applied == [in_inbox]
        assert writes.delete_messages(ctx, [in_all_mail]).applied == [in_all_mail]
    assert bed.sync().ok
    assert _where(bed, in_inbox) == [DRAFTS]
    assert _where(bed, in_all_mail) == ["[Gmail]/Trash"]

    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        assert writes.restore(ctx, [in_all_mail]).applied == [in_all_mail]
        assert writes.move_to_folder(ctx, [in_inbox], "INBOX").applied == [in_inbox]
    assert bed.sync().ok
    assert _where(bed, in_all_mail) == ["[Gmail]/All Mail"]
    assert _where(bed, in_inbox) == ["INBOX"]
