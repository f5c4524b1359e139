"""fmail.toml, mbsync config and notmuch config discovery."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fmail_nm import mbsyncrc
from fmail_nm.adopt.initialize import (
    advice_for_existing,
    find_notmuch_config,
    new_config_path,
)
from fmail_nm.app import NOTMUCH_KEYS, load_config
from fmail_nm.config import (
    DEFAULT_RULES,
    ConfigError,
    FolderLayout,
    detect_roles,
    fmail_command,
    load_settings,
    maildir_folders,
    resolve,
)
from fmail_nm.store.notmuch import settings_of_database
from fmail_nm.store.notmuch_cli import notmuch_settings

from .conftest import REPO, USER_ADDRESSES, MailEnv


def make_maildir(root: Path, *folders: str) -> None:
    for folder in folders:
        for sub in ("cur", "new", "tmp"):
            (root / folder / sub).mkdir(parents=True, exist_ok=True)


MBSYNCRC = """\
# two accounts
IMAPAccount personal
Host imap.example.org
User alex

IMAPStore personal-remote
Account personal

MaildirStore personal-local
Path {root}/personal/
Inbox {root}/personal/INBOX
SubFolders Verbatim

Channel personal
Far :personal-remote:
Near :personal-local:
Patterns * !Spam
Create Both

MaildirStore work-local
Path {root}/work/
Inbox {root}/work/INBOX
SubFolders Maildir++

Channel work
Master :work-remote:
Slave :work-local:
"""


def test_mbsyncrc_parse_reads_stores_and_channels(tmp_path: Path) -> None:
    rc = tmp_path / "mbsyncrc"
    rc.write_text(MBSYNCRC.format(root=tmp_path / "mail"))
    parsed = mbsyncrc.parse(rc)
    assert set(parsed.stores) == {"personal-local", "work-local"}
    assert parsed.stores["personal-local"].inbox == tmp_path / "mail" / "personal" / "INBOX"
    assert parsed.stores["work-local"].subfolders == "Maildir++"
    assert parsed.channels["personal"].patterns == ("*", "!Spam")
    # Old-style Master/Slave names the same sides as Far/Near.
    work = parsed.channels["work"]
    assert parsed.channel_store(work).name == "work-local"  # type: ignore[union-attr]


def test_accounts_come_from_mbsyncrc_when_fmail_toml_has_none(tmp_path: Path) -> None:
    root = tmp_path / "mail"
    make_maildir(root, "personal/INBOX", "personal/Sent", "personal/Trash", "personal/Spam",
                 "work/INBOX", "work/.Sent Items", "work/.Deleted Items")
    rc = tmp_path / "mbsyncrc"
    rc.write_text(MBSYNCRC.format(root=root))
    settings = load_settings(_toml(tmp_path, f'[mbsync]\nconfig = "{rc}"\n'))
    config = resolve(settings, root, ("alex@example.org",))
    personal = config.account("personal")
    assert personal.mbsync_channel == "personal"
    assert personal.folders == {"inbox": "personal/INBOX", "sent": "personal/Sent",
                                "trash": "personal/Trash", "junk": "personal/Spam"}
    work = config.account("work")
    assert work.folders["sent"] == "work/.Sent Items"
    assert work.folders["trash"] == "work/.Deleted Items"
    assert config.addresses == ("alex@example.org",)


def test_an_mbsync_account_writes_from_the_address_it_logs_in_as(tmp_path: Path) -> None:
    """Accounts found in an mbsync config each list all of notmuch's addresses: the address
    an account logs in as comes first, so a draft of the work account is not from the
    personal address (notmuch's primary_email)."""
    root = tmp_path / "mail"
    make_maildir(root, "personal/INBOX", "work/INBOX")
    rc = tmp_path / "mbsyncrc"
    rc.write_text("".join(
        f"IMAPAccount {name}\nHost imap.example.org\nUser {user}\n\n"
        f"IMAPStore {name}-remote\nAccount {name}\n\n"
        f"MaildirStore {name}-local\nPath {root}/{name}/\nInbox {root}/{name}/INBOX\n\n"
        f"Channel {name}\nFar :{name}-remote:\nNear :{name}-local:\n\n"
        for name, user in (("personal", "alex@example.org"), ("work", "AMorgan@acme.test"))))
    settings = load_settings(_toml(tmp_path, f'[mbsync]\nconfig = "{rc}"\n'))
    config = resolve(settings, root, ("alex@example.org", "amorgan@acme.test"))
    assert config.account("personal").addresses == ("alex@example.org", "amorgan@acme.test")
    assert config.account("work").addresses == ("amorgan@acme.test", "alex@example.org")


def test_notmuchs_addresses_stay_the_users_when_each_account_lists_its_own(
        tmp_path: Path) -> None:
    """An alias in notmuch's user.other_email that no [[accounts]] entry names is still the
    user's (mail from it is sent mail, a reply-all leaves it out)."""
    root = tmp_path / "mail"
    make_maildir(root, "personal/INBOX", "work/INBOX")
    settings = load_settings(_toml(tmp_path, """\
[[accounts]]
name = "personal"
addresses = ["alex@example.org"]

[[accounts]]
name = "work"
addresses = ["amorgan@acme.test"]
"""))
    config = resolve(settings, root, ("alex@example.org", "alias@example.net"))
    assert set(config.addresses) == {"alex@example.org", "alias@example.net",
                                     "amorgan@acme.test"}
    assert config.account("work").addresses == ("amorgan@acme.test",)


def test_a_relative_mbsync_config_is_read_from_fmail_tomls_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[mbsync] config`` is resolved once, as ``[notmuch] config`` is: a relative name from
    fmail.toml's own folder, not from wherever the command or the service was started."""
    root = tmp_path / "mail"
    make_maildir(root, "personal/INBOX", "work/INBOX")
    (tmp_path / "mbsyncrc").write_text(MBSYNCRC.format(root=root))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = load_settings(_toml(tmp_path, '[mbsync]\nconfig = "mbsyncrc"\n'))
    assert settings.mbsync_config == str(tmp_path / "mbsyncrc")
    config = resolve(settings, root)
    assert {a.name: a.mbsync_channel for a in config.accounts} == {"personal": "personal",
                                                                  "work": "work"}


def test_the_example_config_loads_and_lists_the_default_rules_as_they_are(
        tmp_path: Path) -> None:
    """config/fmail.toml is copied as it is, and its commented defaults are written out by
    users who add a rule (giving any replaces them all): they must be the code's."""
    example = REPO / "config" / "fmail.toml"
    settings = load_settings(example)
    assert [a["name"] for a in settings.accounts] == ["personal", "work"]
    text = example.read_text().split("Giving any rule replaces the defaults, which are:\n")[1]
    rules = "\n".join(line.removeprefix("# ") for line in text.splitlines())
    assert load_settings(_toml(tmp_path, rules)).rules == DEFAULT_RULES


def test_a_relative_data_dir_is_read_from_fmail_tomls_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``data_dir`` holds the sidecar the hook and the server share: read from wherever each
    was started (the hook in notmuch new's working directory), a relative one split it in
    two.  It is resolved as the other paths fmail.toml names are; ``~`` still expands."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = load_settings(_toml(tmp_path, 'data_dir = "state"\n'))
    assert settings.data_dir_or_default() == tmp_path / "state"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    settings = load_settings(_toml(tmp_path, 'data_dir = "~/fmail"\n'))
    assert settings.data_dir_or_default() == tmp_path / "home" / "fmail"


def test_a_symlinked_fmail_toml_gives_the_hook_the_servers_data_dir(tmp_path: Path) -> None:
    """fmail.toml kept with the user's dotfiles, linked into ~/.config/fmail-nm: the hook is
    run with the file's resolved path (fmail_command), the server with the link's, and a
    relative data_dir read from each one's folder gave them two sidecars."""
    real = _toml(tmp_path, 'data_dir = "state"\n')
    link = tmp_path / "config" / "fmail.toml"
    link.parent.mkdir()
    link.symlink_to(real)
    hook = load_settings(fmail_command(load_settings(link))[-1])
    assert load_settings(link).data_dir_or_default() == hook.data_dir_or_default()


def test_an_accounts_own_mbsync_config_is_read_from_its_files_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An account's ``mbsync_config`` is resolved once, at load, as ``[mbsync] config`` is:
    a relative name from the folder of the file it is written in (fmail.toml, or
    accounts.toml), ``~`` expanded -- not left for ``mbsync -c`` to look up from wherever
    the command or the service was started."""
    root = tmp_path / "mail"
    make_maildir(root, "a/INBOX", "b/INBOX", "c/INBOX")
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    (xdg / "fmail-nm").mkdir(parents=True)
    (xdg / "fmail-nm" / "accounts.toml").write_text(
        '[[accounts]]\nname = "c"\nmbsync_channel = "c"\nmbsync_config = "added.rc"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = load_settings(_toml(tmp_path, """
[[accounts]]
name = "a"
mbsync_channel = "a"
mbsync_config = "rc/a.mbsyncrc"

[[accounts]]
name = "b"
mbsync_channel = "b"
mbsync_config = "~/b.mbsyncrc"
"""))
    config = resolve(settings, root)
    assert {a.name: a.mbsync_config for a in config.accounts} == {
        "a": str(tmp_path / "rc" / "a.mbsyncrc"), "b": str(home / "b.mbsyncrc"),
        "c": str(xdg / "fmail-nm" / "added.rc")}
    with pytest.raises(ConfigError, match="account 'a' mbsync_config must be a string"):
        load_settings(_toml(tmp_path, '[[accounts]]\nname = "a"\nmbsync_config = 1\n'))


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fmail.toml"
    path.write_text(text)
    return path


def test_explicit_accounts_override_detected_roles(tmp_path: Path) -> None:
    root = tmp_path / "mail"
    make_maildir(root, "a/INBOX", "a/Sent", "a/Old Stuff")
    settings = load_settings(_toml(tmp_path, """
[[accounts]]
name = "a"
addresses = ["Me@Example.org"]
[accounts.folders]
archive = "Old Stuff"
"""))
    config = resolve(settings, root)
    account = config.account("a")
    assert account.folders == {"inbox": "a/INBOX", "sent": "a/Sent", "archive": "a/Old Stuff"}
    assert config.addresses == ("me@example.org",)
    with pytest.raises(ConfigError, match="no trash folder"):
        account.folder("trash")
    with pytest.raises(ConfigError, match="unknown account 'b'"):
        config.account("b")


def test_an_accounts_own_folder_is_a_role_folder_as_dot(tmp_path: Path) -> None:
    """An account whose folder is itself a Maildir++ store (INBOX at its root): `inbox = "."`
    named "a/.", which is no folder; a dot-named folder of it is found as a Maildir++ one."""
    root = tmp_path / "mail"
    make_maildir(root, "a", "a/.Sent", "a/.Papierkorb")
    settings = load_settings(_toml(tmp_path, """
[[accounts]]
name = "a"
[accounts.folders]
inbox = "."
trash = ".Papierkorb"
"""))
    account = resolve(settings, root).account("a")
    assert account.folders == {"inbox": "a", "sent": "a/.Sent", "trash": "a/.Papierkorb"}
    assert account.mailbox("a/.Papierkorb") == "Papierkorb"


def test_disk_discovery_without_any_config(tmp_path: Path) -> None:
    root = tmp_path / "mail"
    make_maildir(root, "one/INBOX", "one/Junk", "two/INBOX", "two/Archive")
    config = resolve(load_settings(_toml(tmp_path, "")), root)
    assert [a.name for a in config.accounts] == ["one", "two"]
    assert config.account("two").folders == {"inbox": "two/INBOX", "archive": "two/Archive"}
    assert config.roles()["inbox"] == ["one/INBOX", "two/INBOX"]
    assert config.account_for_path("two/Archive").name == "two"  # type: ignore[union-attr]


def test_maildir_folders_skips_database_and_maildir_internals(tmp_path: Path) -> None:
    root = tmp_path / "mail"
    make_maildir(root, "x/INBOX", "x/INBOX/Sub")
    (root / ".notmuch" / "xapian").mkdir(parents=True)
    assert maildir_folders(root) == ["x/INBOX", "x/INBOX/Sub"]


def test_role_detection_handles_gmail_and_flatten() -> None:
    folders = ["g/[Gmail]/Sent Mail", "g/[Gmail]/Trash", "g/INBOX", "f/Lists.Sent", "f/INBOX"]
    assert detect_roles(folders, "g") == {"sent": "g/[Gmail]/Sent Mail", "trash": "g/[Gmail]/Trash",
                                          "inbox": "g/INBOX"}
    assert detect_roles(folders, "f", FolderLayout(flatten="."))["sent"] == "f/Lists.Sent"


@pytest.mark.parametrize("text, message", [
    ("accounts = 3", "must be a list of tables"),
    ("[[tagging.rules]]\nadd = ['x']", "needs a query string"),
    ("addresses = [1]", "must be a string or a list of strings"),
    ("= broken", "fmail.toml"),
    # a misspelt key did nothing, without a word
    ("data-dir = '/x'", r"fmail.toml: unknown key data-dir \(known: accounts, addresses, data_dir"),
    ("[mbsync]\npull_interval = 5", r"\[mbsync\]: unknown key pull_interval \(known: config"),
    ("[[accounts]]\nname = 'a'\nmail_dir = 'a'", "account 'a': unknown key mail_dir"),
    ("[[accounts]]\nname = 'a'\nsend = { comand = ['msmtp'] }", "account 'a' send: unknown key"),
    ("[[tagging.rules]]\nquery = 'x'\nadds = ['y']", "tagging rule #1: unknown key adds"),
    # a {folder:ROLE} naming no role matched nothing, without a word
    ("[[tagging.rules]]\nquery = '{folder:archived}'\nadd = ['x']",
     r"rule #1: \{folder:archived\} names no folder role"),
    ("[[tagging.rules]]\nquery = 'tag:a'\n[[tagging.rules]]\nquery = 'not {Folder:Trash}'",
     r"rule #2: \{Folder:Trash\} names no folder role \(one of inbox, sent"),
])
def test_bad_fmail_toml_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(_toml(tmp_path, text))


def test_missing_named_config_is_an_error_but_missing_default_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FMAIL_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert load_settings().path is None
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml")
    monkeypatch.setenv("FMAIL_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="not found"):
        load_settings()


def test_notmuch_config_discovery_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv("NOTMUCH_CONFIG", raising=False)
    monkeypatch.delenv("NOTMUCH_PROFILE", raising=False)
    assert find_notmuch_config() is None
    assert new_config_path() == home / ".notmuch-config"
    (home / ".notmuch-config").write_text("")
    assert find_notmuch_config() == home / ".notmuch-config"
    xdg = home / ".config" / "notmuch" / "default" / "config"
    xdg.parent.mkdir(parents=True)
    xdg.write_text("")
    assert find_notmuch_config() == xdg  # the XDG profile comes before ~/.notmuch-config
    monkeypatch.setenv("NOTMUCH_PROFILE", "work")
    assert find_notmuch_config() is None
    monkeypatch.setenv("NOTMUCH_CONFIG", str(tmp_path / "explicit"))
    assert new_config_path() == tmp_path / "explicit"
    assert find_notmuch_config("/elsewhere/cfg") is None


def test_advice_for_an_existing_config_names_the_fix() -> None:
    advice = advice_for_existing({"new.tags": "new;unread", "new.ignore": "",
                                  "maildir.synchronize_flags": "false",
                                  "search.exclude_tags": "deleted"})
    joined = "\n".join(advice)
    # 'new' works, but costs a rewrite of every new message: the advice says how to drop it
    assert "notmuch config set new.tags 'unread;inbox'" in joined
    assert ".uidvalidity" in joined
    assert "synchronize_flags is off" in joined
    assert "deleted;spam" in joined
    good = advice_for_existing({"new.tags": "inbox;unread", "maildir.synchronize_flags": "true",
                                "search.exclude_tags": "deleted;spam",
                                "new.ignore": ".mbsyncstate;.mbsyncstate.journal;.mbsyncstate.new;"
                                              ".mbsyncstate.lock;.uidvalidity"})
    assert good == []


@pytest.mark.parametrize(("excluded", "shown"), [
    ("", False), ("deleted", True), ("killed; muted", True)])
def test_advice_on_exclude_tags_says_whether_fmail_nm_shows_spam(excluded: str,
                                                                  shown: bool) -> None:
    """fmail-nm hides deleted mail and spam itself only where notmuch's config names no tag to
    hide; where it names others (afew's killed), its searches hide those, as notmuch does."""
    advice = advice_for_existing({"new.tags": "inbox;unread", "maildir.synchronize_flags": "true",
                                  "search.exclude_tags": excluded,
                                  "new.ignore": ".mbsyncstate;.mbsyncstate.journal;"
                                                ".mbsyncstate.new;.mbsyncstate.lock;.uidvalidity"})
    [line] = advice
    assert ("fmail-nm hides them regardless" in line) is not shown
    assert ("fmail-nm's searches show" in line) is shown
    assert ("deleted mail" in line) is (excluded != "deleted")


@pytest.mark.parametrize(("value", "off"), [
    ("true", False), ("True", False), ("yes", False), ("YES", False), ("1", False),
    ("false", True), ("no", True), ("No", True), ("0", True)])
def test_synchronize_flags_reads_as_notmuch_reads_a_boolean(value: str, off: bool) -> None:
    advice = advice_for_existing({"new.tags": "inbox;unread", "maildir.synchronize_flags": value,
                                  "search.exclude_tags": "deleted;spam",
                                  "new.ignore": ".mbsyncstate;.mbsyncstate.journal;"
                                                ".mbsyncstate.new;.mbsyncstate.lock;.uidvalidity"})
    assert any("synchronize_flags is off" in line for line in advice) is off


def test_shipped_examples_parse(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parent.parent
    settings = load_settings(repo / "config" / "fmail.toml")
    assert [a["name"] for a in settings.accounts] == ["personal", "work"]
    rc = mbsyncrc.parse(repo / "config" / "mbsyncrc")
    assert set(rc.channels) == {"personal", "work"}
    assert rc.channel_store(rc.channels["work"]).subfolders == "Verbatim"  # type: ignore[union-attr]
    root = tmp_path / "Mail"
    make_maildir(root, "personal/INBOX", "personal/Sent", "work/INBOX", "work/Sent", "work/Trash")
    config = resolve(settings, root)
    assert config.account("work").folders["trash"] == "work/Trash"


def test_pull_interval_per_account_with_a_default_for_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "mail"
    make_maildir(root, "a/INBOX", "b/INBOX")
    settings = load_settings(_toml(tmp_path, """
[mbsync]
pull_interval_minutes = 15
[[accounts]]
name = "a"
mbsync_channel = "a"
pull_interval_minutes = 2.5
[[accounts]]
name = "b"
mbsync_channel = "b"
"""))
    config = resolve(settings, root)
    assert [a.pull_interval_minutes for a in config.accounts] == [2.5, 15.0]
    rc = tmp_path / "mbsyncrc"
    rc.write_text(MBSYNCRC.format(root=root))
    discovered = resolve(load_settings(_toml(
        tmp_path, f'[mbsync]\nconfig = "{rc}"\npull_interval_minutes = 5\n')), root)
    assert {a.pull_interval_minutes for a in discovered.accounts} == {5.0}
    with pytest.raises(ConfigError, match="pull_interval_minutes must be a number"):
        resolve(load_settings(_toml(tmp_path, '[[accounts]]\nname = "a"\n'
                                              'pull_interval_minutes = "often"\n')), root)


def test_an_account_both_added_and_in_fmail_toml_names_a_command_that_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clash of an added account with one of the user's own names the way out: that
    command line must be one `fmail-nm` takes (`account remove` wants `--name`)."""
    from fmail_nm.cli import parse_arguments

    root = tmp_path / "mail"
    make_maildir(root, "work/INBOX")
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    (xdg / "fmail-nm").mkdir(parents=True)
    (xdg / "fmail-nm" / "accounts.toml").write_text('[[accounts]]\nname = "work"\n')
    settings = load_settings(_toml(tmp_path, '[[accounts]]\nname = "work"\n'))
    with pytest.raises(ConfigError, match="account 'work' is both in") as failure:
        resolve(settings, root)
    command = str(failure.value).split("`")[1]
    assert command.startswith("fmail-nm account remove")
    args = parse_arguments(command.split()[1:])
    assert (args.action, args.name) == ("remove", "work")


# ---------------------------------------------------------------------------------------------
# notmuch's settings read in this process: the same values `notmuch config list` prints

SETTINGS_CONFIG = """[database]
{database}
[user]
name=Alex Morgan
primary_email=alex@example.org
"""

# Where each setup keeps its config file (under HOME) and database: the file, its [database]
# lines, the environment ({home}: HOME), the folders it needs made (a database's own folder).
SETTINGS_SETUPS: dict[str, tuple[str, str, dict[str, str], tuple[str, ...]]] = {
    "NOTMUCH_CONFIG": ("notmuch-config", "path={home}/mail", {}, ()),
    "legacy-file": (".notmuch-config", "path={home}/mail", {}, ()),
    "xdg-split-database": (".config/notmuch/default/config", "mail_root={home}/mail", {},
                           (".local/share/notmuch/default",)),
    "profile-relative-paths": (".config/notmuch/work/config",
                               "mail_root=mail\npath=.local/share/notmuch/work",
                               {"NOTMUCH_PROFILE": "work"}, (".local/share/notmuch/work",)),
    "NOTMUCH_DATABASE": (".notmuch-config", "mail_root={home}/mail",
                         {"NOTMUCH_DATABASE": "{home}/db"}, ("db",)),
    "MAILDIR": (".notmuch-config", "", {"MAILDIR": "{home}/mail"}, ()),
    "no-config-file": ("", "", {"MAILDIR": "{home}/mail"}, ()),
}


@pytest.mark.parametrize("setup", sorted(SETTINGS_SETUPS))
def test_settings_read_in_process_are_what_notmuch_config_list_prints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: str) -> None:
    """load_config reads notmuch's settings through libnotmuch in its own process, not by
    starting `notmuch config list`: for every way notmuch finds its config and database
    (XDG, a profile, the environment, settings stored in the database) the two agree."""
    home = tmp_path / "home"
    name, database, variables, extra = SETTINGS_SETUPS[setup]
    for key in ("NOTMUCH_CONFIG", "NOTMUCH_PROFILE", "NOTMUCH_DATABASE", "MAILDIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    for key, value in variables.items():
        monkeypatch.setenv(key, value.format(home=home))
    if setup == "NOTMUCH_CONFIG":
        monkeypatch.setenv("NOTMUCH_CONFIG", str(home / name))
    if name:
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(SETTINGS_CONFIG.format(database=database.format(home=home)))
    for folder in ("mail/INBOX/cur", "mail/INBOX/new", "mail/INBOX/tmp", *extra):
        (home / folder).mkdir(parents=True, exist_ok=True)
    # The last: a setting kept in the database alone (notmuch >= 0.32).  `--config=`: none.
    config = [] if name else ["--config="]
    for argv in (["notmuch", *config, "new"],
                 ["notmuch", *config, "config", "set", "--database", "user.other_email",
                  "alex.morgan@example.org; amorgan@acme.test"]):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
    listed = notmuch_settings()
    in_process = settings_of_database(None, NOTMUCH_KEYS)
    if not name:  # libnotmuch opens no database without a config file: notmuch is asked
        assert in_process is None and listed == {}
        return
    assert in_process == {key: listed[key] for key in NOTMUCH_KEYS if listed.get(key)}
    # fmail.toml naming the file (`notmuch --config=FILE`): the same
    named = notmuch_settings(home / name)
    assert settings_of_database(home / name, NOTMUCH_KEYS) == {
        key: named[key] for key in NOTMUCH_KEYS if named.get(key)}
    assert in_process["user.other_email"] == "alex.morgan@example.org; amorgan@acme.test"
    assert in_process["database.mail_root"] == str(home / "mail")


def test_a_configuration_loads_without_starting_notmuch(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The hook and every index run load the configuration: with a database there, that reads
    notmuch's settings in-process, starting no `notmuch config list` (a process start on
    every delivery)."""
    with_notmuch = load_config()
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))
    assert load_config() == with_notmuch
    assert with_notmuch.mail_root == indexed.mail_root
    assert with_notmuch.addresses[:1] == (USER_ADDRESSES[0],)
