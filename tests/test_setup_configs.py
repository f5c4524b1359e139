"""Set-up against configs as users write them: mbsync and msmtp files in the syntax those
programs accept (checked by running them), folder names as servers and mbsync write them,
and the account fmail-nm adds kept out of the user's own stores."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fmail_nm import mbsyncrc, msmtprc
from fmail_nm.config import Settings, detect_roles, resolve
from fmail_nm.passes import mirror
from fmail_nm.passes.changes import WriteContext
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader, Writer
from fmail_nm.tools import reads, writes

from . import imapbed
from .conftest import MailEnv

USER, PASSWORD = "alex", "secret"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[imapbed.ImapServer]:
    srv = imapbed.ImapServer(tmp_path / "imap", users={USER: PASSWORD}, cleanup=False)
    srv.start()
    yield srv
    srv.stop(graceful=False)


def _rc(server: imapbed.ImapServer, root: Path, sep: str, comment: str = "") -> str:
    return "\n".join(f"{k}{sep}{v}{comment if k in ('Path', 'Expunge') else ''}" if k else ""
                     for k, v in [
        ("IMAPAccount", "work"), ("Host", server.host), ("Port", str(server.port)),
        ("User", USER), ("Pass", PASSWORD), ("SSLType", "None"),
        ("AuthMechs", "PLAIN LOGIN"), ("", ""),
        ("IMAPStore", "work-remote"), ("Account", "work"), ("", ""),
        ("MaildirStore", "work-local"), ("Path", f"{root}/work/"),
        ("Inbox", f"{root}/work/INBOX"), ("SubFolders", "Verbatim"), ("", ""),
        ("Channel", "work"), ("Far", ":work-remote:"), ("Near", ":work-local:"),
        ("Patterns", "*"), ("Create", "Both"), ("Expunge", "Both"), ("SyncState", "*"),
    ]) + "\n"


@pytest.mark.parametrize("sep,comment", [("\t", ""), (" ", "   # mbsync allows this")],
                         ids=["tab-separated", "trailing-comment"])
def test_mbsyncrc_real_world_syntax_is_understood(server: imapbed.ImapServer, tmp_path: Path,
                                                  sep: str, comment: str) -> None:
    """mbsync reads keyword<TAB>value and trailing '# comments'; fmail-nm must too."""
    imapbed.create_folder(server, USER, "Sent")
    root = tmp_path / "mail"
    (root / "work").mkdir(parents=True)
    rc = tmp_path / "mbsyncrc"
    rc.write_text(_rc(server, root, sep, comment))
    done = imapbed.run_mbsync(rc, "work")  # real mbsync accepts the file and syncs
    assert (root / "work" / "Sent" / "cur").is_dir(), done.stderr
    parsed = mbsyncrc.parse(rc)
    assert parsed.stores["work-local"].path == root / "work"
    assert parsed.channels["work"].expunge == "Both"
    config = resolve(Settings(mbsync_config=str(rc)), root)
    account = config.account("work")  # tied to its channel, so pulled and pushed
    assert account.mbsync_channel == "work"


def test_role_of_non_ascii_folder_synced_by_mbsync(server: imapbed.ImapServer,
                                                   tmp_path: Path) -> None:
    """German Outlook/Exchange names its folders "Gesendete Elemente", "Entwürfe",
    "Gelöschte Elemente": mbsync 1.4 writes the IMAP (modified UTF-7) name to disk, so
    the "entwürfe" in _ROLE_NAMES never matches, and neither do the Exchange names."""
    for folder in ("Entw&APw-rfe", "Gel&APY-schte Elemente", "Gesendete Elemente"):
        imapbed.create_folder(server, USER, folder)
    root = tmp_path / "mail"
    rc = imapbed.write_mbsync_config(tmp_path / "mbsyncrc", server, USER, root, account="work",
                                     patterns='INBOX "Entw*" "Gel*" "Gesendete*"')
    imapbed.run_mbsync(rc, "work")
    on_disk = sorted(p.name for p in (root / "work").iterdir())
    assert "Entw&APw-rfe" in on_disk  # what mbsync 1.4.4 really writes
    roles = resolve(Settings(mbsync_config=str(rc)), root).account("work").folders
    assert roles.get("drafts") == "work/Entw&APw-rfe", roles
    assert roles.get("trash") == "work/Gel&APY-schte Elemente", roles
    assert roles.get("sent") == "work/Gesendete Elemente", roles


def test_google_mail_prefix_roles() -> None:
    """Gmail accounts from the UK and Germany have "[Google Mail]/…", not "[Gmail]/…"."""
    folders = ["g/INBOX", "g/[Google Mail]/Sent Mail", "g/[Google Mail]/Drafts",
               "g/[Google Mail]/Bin", "g/[Google Mail]/Spam"]
    roles = detect_roles(folders, "g")
    assert roles == {"inbox": "g/INBOX", "sent": "g/[Google Mail]/Sent Mail",
                     "drafts": "g/[Google Mail]/Drafts", "trash": "g/[Google Mail]/Bin",
                     "junk": "g/[Google Mail]/Spam"}


def test_identity_from_imapstore_user(tmp_path: Path) -> None:
    """IMAPAccount options may stand directly in an IMAPStore (mbsync(1)); its User is an
    address of the user's just the same."""
    rc = tmp_path / "mbsyncrc"
    rc.write_text("IMAPStore work-remote\nHost imap.example.org\nUser alex@example.org\n"
                  "PassCmd \"pass mail\"\n")
    from fmail_nm.adopt.identity import Identity, from_mbsync
    identity = Identity()
    from_mbsync(identity, rc)
    assert identity.addresses == ["alex@example.org"]


def test_msmtprc_tab_separated(tmp_path: Path) -> None:
    """msmtp splits a command from its argument at spaces or tabs."""
    rc = tmp_path / "msmtprc"
    rc.write_text("defaults\ntls\ton\n\naccount\twork\nhost\t127.0.0.1\n"
                  "from\talex@example.org\nauth\toff\n")
    rc.chmod(0o600)
    shown = subprocess.run(["msmtp", "-C", str(rc), "-a", "work", "--pretend"],
                           capture_output=True, text=True, timeout=20)
    assert "alex@example.org" in shown.stdout, shown.stderr  # msmtp reads it
    assert msmtprc.parse(rc).account_for("alex@example.org") is not None


def _tiny_maildir(root: Path) -> None:
    for f in ("INBOX", "Sent"):
        for leaf in ("cur", "new", "tmp"):
            (root / f / leaf).mkdir(parents=True, exist_ok=True)


def test_password_command_with_quotes_runs_the_same_in_msmtp_as_in_mbsync(
        server: imapbed.ImapServer, tmp_path: Path) -> None:
    """`_rc_quote` backslash-escapes '"' and '\\' for both files; mbsync undoes that, msmtp
    does not (it takes the argument verbatim, minus enclosing quotes), so a password command
    with double quotes (`secret-tool lookup service "my mail"`) passes the login check
    (mbsync) and then runs broken for every send (msmtp)."""
    from fmail_nm.adopt import accounts
    from fmail_nm.adopt.accounts import AccountPlan

    def plan(marker: Path) -> AccountPlan:
        return AccountPlan(
            name="side", address="casey@example.com",
            password_command=f'sh -c "touch {marker}; echo {PASSWORD}"',
            imap_host="127.0.0.1", imap_port=server.port, imap_user=USER, imap_tls="none",
            smtp_host="127.0.0.1", smtp_port=imapbed.free_port(), smtp_user=USER,
            smtp_tls="none", maildir=tmp_path / "mail" / "side", mail_root=tmp_path / "mail",
            config_dir=tmp_path / "cfg")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "mail" / "side").mkdir(parents=True)
    p = plan(tmp_path / "mbsync-ran")
    p.mbsync_file.write_text(accounts.mbsync_block(p))
    listed = subprocess.run(["mbsync", "-c", str(p.mbsync_file), "--list", "side"],
                            capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0 and (tmp_path / "mbsync-ran").exists(), listed.stderr
    p = plan(tmp_path / "msmtp-ran")
    p.msmtp_file.write_text(accounts.msmtp_block(p))
    p.msmtp_file.chmod(0o600)
    subprocess.run(["msmtp", "-C", str(p.msmtp_file), "-a", "side", "dana@example.net"],
                   input="Subject: t\n\nx\n", capture_output=True, text=True, timeout=30)
    assert (tmp_path / "msmtp-ran").exists(), "msmtp ran another command than mbsync"


def test_folders_under_inbox_get_their_roles(server: imapbed.ImapServer, tmp_path: Path) -> None:
    """Courier/cPanel-style servers keep every folder under INBOX (INBOX.Sent, INBOX.Trash,
    …); mbsync (SubFolders Verbatim) puts them in <Inbox>/Sent etc., and their roles are
    never found: Trash and Junk mail stays in the inbox, the trash tool has no folder."""
    for folder in ("INBOX/Sent", "INBOX/Trash", "INBOX/Drafts", "INBOX/spam"):
        imapbed.create_folder(server, USER, folder)
    root = tmp_path / "mail"
    rc = imapbed.write_mbsync_config(tmp_path / "mbsyncrc", server, USER, root, account="work",
                                     patterns="INBOX INBOX/*")
    imapbed.run_mbsync(rc, "work")
    assert (root / "work" / "INBOX" / "Trash" / "cur").is_dir()  # where mbsync put it
    roles = resolve(Settings(mbsync_config=str(rc)), root).account("work").folders
    assert roles.get("trash") == "work/INBOX/Trash", roles
    assert roles.get("sent") == "work/INBOX/Sent", roles
    assert roles.get("junk") == "work/INBOX/spam", roles


def test_msmtp_from_substitution_is_no_address(tmp_path: Path) -> None:
    """msmtp expands %U (user), %H/%C (host), %M (mail domain) in `from`: "%u@example.org"
    is a template, not an address to write into notmuch's user.primary_email."""
    from fmail_nm.adopt.identity import Identity, from_msmtp
    rc = tmp_path / "msmtprc"
    rc.write_text("account work\nhost 127.0.0.1\nfrom %U@example.org\n")
    rc.chmod(0o600)
    shown = subprocess.run(["msmtp", "-C", str(rc), "-a", "work", "--pretend"],
                           capture_output=True, text=True, timeout=20).stdout
    assert "%U" not in shown  # msmtp itself substitutes it
    identity = Identity()
    from_msmtp(identity, rc)
    assert not any("%" in a for a in identity.addresses), identity.addresses


def test_an_added_account_never_lands_inside_the_users_own_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mbsync(1) layout of a single account: `Path ~/Mail/`, `Inbox ~/Mail/INBOX`,
    Patterns *, Create Both, with notmuch's mail root ~/Mail.  An account added under
    ~/Mail/<name>/ would be inside that store: the user's next sync would create its folders
    on the first account's server and upload its mail there.  It is refused, naming the way
    out; once the user's Patterns leave it out, it is added and the user's sync stays as it
    was."""
    from fmail_nm.adopt import accounts
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    srv = imapbed.ImapServer(tmp_path / "imap", users={"alex": "pw1", "casey": "pw2"},
                             cleanup=False)
    srv.start()
    try:
        imapbed.append(srv, "casey", "INBOX", b"From: dana@example.net\r\nTo: casey@example."
                       b"com\r\nSubject: private\r\nMessage-ID: <p1@example.net>\r\n\r\nhi\r\n")
        root = tmp_path / "Mail"
        root.mkdir()
        rc = tmp_path / "home-mbsyncrc"  # the user's own ~/.mbsyncrc
        own_rc = (f"IMAPAccount alex\nHost 127.0.0.1\nPort {srv.port}\nUser alex\nPass pw1\n"
                  "SSLType None\nAuthMechs PLAIN LOGIN\n\nIMAPStore alex-remote\n"
                  f"Account alex\n\nMaildirStore alex-local\nPath {root}/\n"
                  f"Inbox {root}/INBOX\nSubFolders Verbatim\n\nChannel alex\n"
                  "Far :alex-remote:\nNear :alex-local:\nPatterns *\nCreate Both\n"
                  f"SyncState {tmp_path}/state/\n")
        rc.write_text(own_rc)
        imapbed.run_mbsync(rc, "alex")
        secret = tmp_path / "pw"
        secret.write_text("#!/bin/sh\necho pw2\n")
        secret.chmod(0o700)
        new = accounts.NewAccount(
            name="side", address="casey@example.com", password_command=str(secret),
            imap_host="127.0.0.1", imap_port=srv.port, imap_user="casey", imap_tls="none")
        with pytest.raises(accounts.AccountError, match="alex-local.*!side !side/\\*"):
            accounts.plan(resolve(Settings(mbsync_config=str(rc)), root), new)
        assert not (root / "side").exists()

        rc.write_text(own_rc.replace("Patterns *", "Patterns * !side !side/*"))
        plan = accounts.plan(resolve(Settings(mbsync_config=str(rc)), root), new)
        accounts.write(plan)
        imapbed.run_mbsync(plan.mbsync_file, "side")  # the first pull, as onboard does
        assert list((root / "side" / "INBOX").glob("*/*"))
        own = imapbed.run_mbsync(rc, "alex", check=False)
        assert own.returncode == 0, own.stderr
        assert not [f for f in imapbed.fetch_state(srv, "alex") if f.startswith("side")]
    finally:
        srv.stop(graceful=False)


@pytest.mark.parametrize("folders,role,expected", [
    # Gmail in French / Spanish (as mbsync 1.4 writes them: modified UTF-7)
    (["g/[Gmail]/Corbeille", "g/[Gmail]/Brouillons"], "trash", "g/[Gmail]/Corbeille"),
    (["g/[Gmail]/Messages envoy&AOk-s"], "sent", "g/[Gmail]/Messages envoy&AOk-s"),
    (["g/[Gmail]/Papelera", "g/[Gmail]/Enviados"], "trash", "g/[Gmail]/Papelera"),
    # Outlook / Exchange in German, Dutch, French
    (["w/Gesendete Elemente"], "sent", "w/Gesendete Elemente"),
    (["w/Junk-E-Mail"], "junk", "w/Junk-E-Mail"),
    (["w/Verwijderde items"], "trash", "w/Verwijderde items"),
    (["w/&AMk-l&AOk-ments supprim&AOk-s"], "trash", "w/&AMk-l&AOk-ments supprim&AOk-s"),
    # GMX and WEB.DE, the large German mail services
    (["x/Gesendet", "x/Spamverdacht"], "junk", "x/Spamverdacht"),
    (["x/Gesendet", "x/Unerw&APw-nscht"], "junk", "x/Unerw&APw-nscht"),
], ids=["gmail-fr-trash", "gmail-fr-sent", "gmail-es-trash", "exchange-de-sent",
        "exchange-de-junk", "exchange-nl-trash", "exchange-fr-trash", "gmx-junk", "webde-junk"])
def test_role_names_in_other_languages(folders: list[str], role: str, expected: str) -> None:
    account = folders[0].split("/")[0]
    assert detect_roles(folders, account).get(role) == expected


def test_gmail_system_folders_win_over_labels_of_the_same_name() -> None:
    """A label "Trash" (imported from another client) is no trash in Gmail: deleting into
    it only relabels.  Sorted order makes "g/Trash" win over "g/[Gmail]/Trash"."""
    roles = detect_roles(["g/INBOX", "g/Sent", "g/Trash", "g/[Gmail]/Sent Mail",
                          "g/[Gmail]/Trash"], "g")
    assert roles["trash"] == "g/[Gmail]/Trash" and roles["sent"] == "g/[Gmail]/Sent Mail"


def test_primary_email_command_is_shell_quoted() -> None:
    """An apostrophe is valid in an address (o'brien@…): the printed command must run."""
    import shlex

    from fmail_nm.adopt.identity import Identity, missing_from_notmuch
    identity = Identity()
    identity.add("o'brien@example.org", "test")
    [command] = missing_from_notmuch(identity, {})
    assert shlex.split(command)[-1] == "o'brien@example.org"


@pytest.mark.parametrize("gap", ["\n", ""], ids=["blank-line", "no-blank-line"])
def test_global_channel_options(server: imapbed.ImapServer, tmp_path: Path, gap: str) -> None:
    """mbsync(1): "Sync, Create, Remove, Expunge, MaxMessages, and CopyArrivalDate can be used
    before any section for a global effect" -- and mbsync needs no blank line after them."""
    from fmail_nm.service.doctor import mbsync_findings
    imapbed.create_folder(server, USER, "Spam")
    root = tmp_path / "mail"
    (root / "work").mkdir(parents=True)
    body = imapbed.mbsync_section(server, USER, root, account="work").replace(
        "Expunge Both\n", "")
    rc = tmp_path / "mbsyncrc"
    rc.write_text("# global defaults\nExpunge Both\nCreate Both\n" + gap + body)
    imapbed.run_mbsync(rc, "work")  # real mbsync reads it
    config = resolve(Settings(mbsync_config=str(rc)), root)
    assert config.account("work").mbsync_channel == "work"
    assert [f.line() for f in mbsync_findings(config)] == []  # no "has no Expunge Both"


def test_maildirpp_store_is_tied_to_its_channel(tmp_path: Path) -> None:
    """SubFolders Maildir++ forbids Path (mbsync: "Setting Path is incompatible with
    'SubFolders Maildir++'"): the store's root is its Inbox, its folders .Sent etc."""
    root = tmp_path / "Maildir"
    for f in ("", ".Sent", ".Drafts", ".Trash"):
        for leaf in ("cur", "new", "tmp"):
            (root / f / leaf).mkdir(parents=True, exist_ok=True)
    rc = tmp_path / "mbsyncrc"
    rc.write_text(f"MaildirStore local\nInbox {root}/\nSubFolders Maildir++\n\n"
                  "Channel main\nFar :remote:\nNear :local:\nExpunge Both\n")
    config = resolve(Settings(mbsync_config=str(rc)), root)
    [account] = config.accounts
    assert account.mbsync_channel == "main", account  # pulled and pushed
    assert account.folders["sent"] == ".Sent"


def test_init_advice_names_the_config_it_read(tmp_path: Path) -> None:
    """`init --notmuch-config X` on a config of the user's prints `notmuch config set …`
    fixes without --config: run as printed, they change another config (here the user's
    ~/.notmuch-config of another mailbox) and never X."""
    import os
    import shlex
    import sys

    from .conftest import isolated_env
    env = {**os.environ, **isolated_env(tmp_path)}
    del env["NOTMUCH_CONFIG"]
    home = Path(env["HOME"])
    mine, other = tmp_path / "mail", tmp_path / "other"
    _tiny_maildir(mine)
    _tiny_maildir(other)
    custom = tmp_path / "nm-work"
    custom.write_text(f"[database]\npath={mine}\n[user]\nprimary_email=alex@example.org\n")
    (home / ".notmuch-config").write_text(f"[database]\npath={other}\n")
    before = (home / ".notmuch-config").read_text()
    done = subprocess.run([sys.executable, "-m", "fmail_nm", "init", "--notmuch-config",
                           str(custom), "--no-index"], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    fixes = [line.split("fix: ", 1)[1] for line in done.stdout.splitlines() if "fix: " in line]
    assert fixes, done.stdout
    for fix in fixes:
        subprocess.run(shlex.split(fix), env=env, capture_output=True, timeout=30)
    assert (home / ".notmuch-config").read_text() == before, "the other config was changed"
    assert "mbsyncstate" in custom.read_text(), "the fix never reached the config init read"


def test_symlinked_account_folder_is_seen(tmp_path: Path) -> None:
    """An account folder that is a symlink (mail kept on another disk): notmuch new follows
    it and indexes the mail, fmail-nm's folder walk and mbsync store matching do not."""
    data = tmp_path / "data" / "work"
    for f in ("INBOX", "Sent", "Trash"):
        for leaf in ("cur", "new", "tmp"):
            (data / f / leaf).mkdir(parents=True, exist_ok=True)
    root = tmp_path / "mail"
    root.mkdir()
    (root / "work").symlink_to(data)
    config = resolve(Settings(), root)
    assert "work/Sent" in config.folders, config.folders
    assert config.account("work").folders["trash"] == "work/Trash"
    rc = tmp_path / "mbsyncrc"
    rc.write_text(f"MaildirStore work-local\nPath {root}/work/\nInbox {root}/work/INBOX\n\n"
                  "Channel work\nFar :work-remote:\nNear :work-local:\n")
    config = resolve(Settings(mbsync_config=str(rc)), root)
    assert config.account("work").mbsync_channel == "work"
    from fmail_nm.service.doctor import mbsync_findings
    assert not [f for f in mbsync_findings(config) if "outside" in f.line()]


def test_a_group_names_its_channels_without_redefining_them(tmp_path: Path) -> None:
    """In a Group section, `Channel x` names a member (mbsync(1)); read as the start of a
    section it would redefine channel x without its stores."""
    rc = tmp_path / "mbsyncrc"
    rc.write_text("MaildirStore local\nPath ~/Mail/\nInbox ~/Mail/INBOX\n\n"
                  "Channel inbox\nFar :remote:\nNear :local:\nExpunge Both\n\n"
                  "Channel sent\nFar :remote:Sent\nNear :local:Sent\n\n"
                  "Group all\nChannel inbox\nChannel sent\n")
    channels = mbsyncrc.parse(rc).channels
    assert (channels["inbox"].near_store, channels["inbox"].expunge) == ("local", "Both")
    assert channels["sent"].near_store == "local"


def test_channels_per_folder_make_one_account(tmp_path: Path) -> None:
    """The common Gmail recipe: one Channel per folder, tied together by a Group."""
    root = tmp_path / "mail"
    for f in ("gmail/INBOX", "gmail/Sent", "gmail/Trash"):
        for leaf in ("cur", "new", "tmp"):
            (root / f / leaf).mkdir(parents=True, exist_ok=True)
    rc = tmp_path / "mbsyncrc"
    rc.write_text(f"MaildirStore gmail-local\nPath {root}/gmail/\nInbox {root}/gmail/INBOX\n\n"
                  "Channel gmail-inbox\nFar :gmail-remote:\nNear :gmail-local:\n"
                  "Patterns INBOX\n\n"
                  "Channel gmail-sent\nFar :gmail-remote:\"[Gmail]/Sent Mail\"\n"
                  "Near :gmail-local:Sent\n\n"
                  "Channel gmail-trash\nFar :gmail-remote:\"[Gmail]/Trash\"\n"
                  "Near :gmail-local:Trash\n\n"
                  "Group gmail\nChannel gmail-inbox\nChannel gmail-sent\nChannel gmail-trash\n")
    config = resolve(Settings(mbsync_config=str(rc)), root)
    [account] = config.accounts  # not three accounts over one Maildir
    assert (account.name, account.mbsync_channel, account.maildir) == ("gmail", "gmail", "gmail")
    assert account.folders["trash"] == "gmail/Trash"
    from fmail_nm.service.doctor import mbsync_findings
    assert not [f for f in mbsync_findings(config) if "does not define" in f.line()]
    # a Group spanning two stores, or leaving a channel of its store out, is not an account
    rc.write_text(rc.read_text().removesuffix("Channel gmail-trash\n"))
    config = resolve(Settings(mbsync_config=str(rc)), root)
    assert sorted(a.name for a in config.accounts) == ["gmail-inbox", "gmail-sent", "gmail-trash"]


def test_an_smtp_login_with_a_backslash_reaches_msmtp_as_written(tmp_path: Path) -> None:
    """Exchange logins are DOMAIN\\user: msmtp keeps a backslash escape as written, so the
    msmtprc line carries the login unquoted (msmtp takes the rest of the line)."""
    from fmail_nm.adopt import accounts
    from fmail_nm.adopt.accounts import AccountPlan
    (tmp_path / "cfg").mkdir()
    plan = AccountPlan(
        name="side", address="casey@example.com", password_command="/bin/echo pw",
        imap_host="127.0.0.1", imap_port=993, imap_user="CORP\\casey", imap_tls="none",
        smtp_host="127.0.0.1", smtp_port=587, smtp_user="CORP\\casey", smtp_tls="none",
        maildir=tmp_path / "mail" / "side", mail_root=tmp_path / "mail",
        config_dir=tmp_path / "cfg")
    plan.msmtp_file.write_text(accounts.msmtp_block(plan))
    plan.msmtp_file.chmod(0o600)
    shown = subprocess.run(["msmtp", "-C", str(plan.msmtp_file), "-a", "side", "--pretend"],
                           capture_output=True, text=True, timeout=20)
    assert "user = CORP\\casey\n" in shown.stdout, shown.stdout + shown.stderr


def inbox_outside_path(indexed: MailEnv) -> Path:
    """The personal account's INBOX moved outside its store's Path (mbsync's ``Inbox``
    ~/Mail/personal-inbox beside ``Path`` ~/Mail/personal/), indexed; the mail root."""
    root = indexed.mail_root
    (root / "personal" / "INBOX").rename(root / "personal-inbox")
    rc = indexed.base / "mbsyncrc"
    rc.write_text(f"MaildirStore local\nPath {root}/personal/\nInbox {root}/personal-inbox\n\n"
                  "Channel personal\nFar :remote:\nNear :local:\nExpunge Both\n")
    indexed.fmail_config.write_text(f'[mbsync]\nconfig = "{rc}"\n')
    indexed.notmuch("new")
    return root


def test_an_inbox_outside_the_stores_path_is_the_accounts(indexed: MailEnv) -> None:
    """mbsync's ``Inbox`` may lie outside the store's ``Path`` (Path ~/Mail/personal/, Inbox
    ~/Mail/personal-inbox): that INBOX is the account's like its other folders -- mail in it
    is archived into the account's Archive, listed and searched as the account's."""
    root = inbox_outside_path(indexed)
    config = indexed.config()
    with Reader() as reader, Writer() as writer:
        mb = reads.Mailbox(config, reader)
        [mid, *_] = reader.message_ids("folder:personal-inbox and not path:work/**")
        assert reads.search_emails(mb, f"account:personal id:{mid}").total == 1
        assert reads.search_emails(mb, f"id:{mid}", account="personal").total == 1
        listed = {f.folder: f.role for f in reads.list_folders(mb).folders}
        assert listed.get("personal-inbox") == "inbox", listed
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        result = writes.archive(ctx, [mid])
        assert result.applied == [mid], result.errors
        [moved] = reader.find(mid).filenames  # type: ignore[union-attr]
    assert Path(moved).parent.parent == root / "personal" / "Archive"


def test_a_mirror_from_before_an_outside_inbox_was_the_accounts_shows_it_as_the_accounts(
        indexed: MailEnv) -> None:
    """A mirror built when the INBOX outside the store's Path belonged to no account kept its
    mail so (emails.account_name NULL: query_emails for the account left the inbox out); a
    sync after the upgrade reads every message again, and the account is the mirror's too."""
    root = inbox_outside_path(indexed)
    config = indexed.config()
    path = sidecar.sidecar_path(config.data_dir)
    inbox = "message_id IN (SELECT message_id FROM message_folders WHERE folder = 'personal-inbox')"
    with sidecar.opened(path) as conn:  # as schema 24 left it
        conn.execute(f"UPDATE messages SET account_name = NULL, folder = 'personal-inbox' "
                     f"WHERE {inbox}")
        conn.execute("PRAGMA user_version = 24")
    with Reader() as reader:
        mirror.sync_sidecar(config, reader)
    with sidecar.opened(path) as conn:
        shown = set(conn.execute(f"SELECT account_name, folder FROM messages WHERE {inbox}"))
    assert shown == {("personal", "INBOX")}
