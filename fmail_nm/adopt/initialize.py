"""``fmail-nm init``: adopt a mail root, or an existing notmuch setup, without harming it.

* No notmuch config yet: write one with the settings this stack needs (``new.tags=new``, mbsync's
  state files ignored, ``deleted;spam`` excluded, flag sync on, the user's addresses).
* A notmuch config already there: leave it alone, and say which settings differ from what
  fmail-nm expects and how the user could change them.
* No addresses given: find them (:mod:`fmail_nm.adopt.identity`).  For a config we write, the
  mail is indexed first without hooks so the Sent folders can be read from the index, and the
  addresses go into the new config before our hook tags anything; an existing config only
  gets the ``notmuch config set`` commands that would add what it lacks.
* Either way: install our hooks (chaining any existing ones), then index with ``notmuch new``.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Config, ConfigError, Settings, fmail_command, maildir_folders, resolve
from ..passes.indexing import Ignored
from ..passes.mirror import SETUP_REVISION, sync_sidecar
from ..store import sidecar
from ..store.notmuch import Reader, ensure_database
from ..store.notmuch_cli import notmuch_settings, user_settings_as_written
from ..store.notmuch_config import (config_bool, config_list, find_notmuch_config,
                                     new_config_path, notmuch_program)
from ..tags import DEFAULT_EXCLUDED, DELETED
from .hooks import HookAction, install_hooks
from .identity import Identity, discover, missing_from_notmuch

MBSYNC_STATE_FILES = (".mbsyncstate", ".mbsyncstate.journal", ".mbsyncstate.new",
                      ".mbsyncstate.lock", ".uidvalidity")
EXCLUDE_TAGS = DEFAULT_EXCLUDED
# mbsync writes its state files into each mailbox's folder: where new.ignore must catch them.
STATE_FILE_FOLDER = "INBOX"


@dataclass
class InitReport:
    notmuch_config: Path
    wrote_config: bool
    hooks: list[HookAction] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    repaired_folders: list[str] = field(default_factory=list)
    identity: Identity | None = None  # None: the addresses were given


def render_notmuch_config(mail_root: Path, name: str, addresses: list[str]) -> str:
    primary = addresses[0] if addresses else ""
    others = ";".join(addresses[1:])
    return f"""\
# notmuch configuration written by `fmail-nm init`; edit freely, fmail-nm never rewrites it.
# See notmuch-config(1).

[database]
path={mail_root}

[user]
name={name}
primary_email={primary}
other_email={others}

[new]
# What notmuch gives new mail; fmail-nm's post-new hook then changes only the exceptions
# (your own mail gets sent, list mail list, mail in Trash/Junk/Archive leaves the inbox).
tags=inbox;unread
# mbsync's bookkeeping files are not mail.
ignore={";".join(MBSYNC_STATE_FILES)}

[search]
exclude_tags={";".join(EXCLUDE_TAGS)}

[maildir]
# Keep Maildir flags (S, F, R, D, P) and tags in step, so mbsync carries them to the server.
synchronize_flags=true
"""


@dataclass(frozen=True)
class Finding:
    """Something wrong with the setup, and the command (or edit) that fixes it."""

    check: str  # which check found it: notmuch, identity, hook, mbsync, msmtp, sidecar, ...
    problem: str
    fix: str
    serious: bool = True  # False: works, but could be better (doctor's exit status ignores it)

    def line(self) -> str:
        return f"{self.problem}; fix: {self.fix}"


def notmuch_findings(nm: dict[str, str], notmuch: str = "notmuch") -> list[Finding]:
    """What differs from fmail-nm's expectations in a notmuch config, with the fix
    (``notmuch``: how the fix runs notmuch on that config, see notmuch_program)."""
    found = []
    new_tags = config_list(nm.get("new.tags"))
    if "new" in new_tags:
        faster = [t for t in new_tags if t != "new"]
        faster += [t for t in ("inbox", "unread") if t not in faster]
        found.append(Finding(
            "notmuch", "new.tags includes 'new': fmail-nm's tagging pass works with it, but must "
            "rewrite every new message once to take 'new' off again; without it only the "
            "exceptions are rewritten (if no other tool of yours relies on 'new')",
            f"{notmuch} config set new.tags {shlex.quote(';'.join(faster))}", serious=False))
    missing = state_files_not_ignored(nm.get("new.ignore", ""))
    if missing:
        current = config_list(nm.get("new.ignore"))
        found.append(Finding("notmuch", "notmuch new will warn about mbsync's state files",
                             f"{notmuch} config set new.ignore "
                             f"{shlex.quote(';'.join(current + missing))}"))
    if not config_bool(nm.get("maildir.synchronize_flags"), True):
        found.append(Finding("notmuch", "maildir.synchronize_flags is off: read/flagged changes "
                             "will not reach the server through mbsync",
                             f"{notmuch} config set maildir.synchronize_flags true"))
    current_excluded = config_list(nm.get("search.exclude_tags"))
    lacking = [t for t in EXCLUDE_TAGS if t not in current_excluded]
    if lacking:
        # fmail-nm's searches hide what notmuch's do, and deleted;spam only where it names none
        # (Reader.search_exclusions).
        shown = " and ".join("deleted mail" if t == DELETED else t for t in lacking)
        who = (f"your mail client shows {shown} (fmail-nm hides them regardless)"
               if not current_excluded else
               f"your mail client and fmail-nm's searches show {shown}")
        found.append(Finding("notmuch", f"search.exclude_tags lacks deleted;spam: {who}",
                             f"{notmuch} config set search.exclude_tags "
                             f"{shlex.quote(';'.join(current_excluded + lacking))}"))
    return found


def state_files_not_ignored(setting: str) -> list[str]:
    """mbsync's state files that ``new.ignore`` lets notmuch new warn about: neither a name
    it lists nor matched by one of its ``/regex/`` patterns in a mailbox folder."""
    try:
        ignored = Ignored(setting)
    except re.error:  # a pattern only notmuch's regex dialect reads: judge by names alone
        names = set(config_list(setting))
        return [f for f in MBSYNC_STATE_FILES if f not in names]
    return [f for f in MBSYNC_STATE_FILES if not ignored(f"{STATE_FILE_FOLDER}/{f}")]


def advice_for_existing(nm: dict[str, str], notmuch: str = "notmuch") -> list[str]:
    """What differs from fmail-nm's expectations in a user's own config, with the fix."""
    return [f.line() for f in notmuch_findings(nm, notmuch)]


def repair_maildirs(mail_root: Path, folders: list[str]) -> list[str]:
    """Create missing cur/new/tmp in Maildir folders (git, rsync and backups drop empty dirs)."""
    repaired = []
    for folder in folders:
        base = mail_root / folder
        missing = [d for d in ("cur", "new", "tmp") if not (base / d).is_dir()]
        for d in missing:
            (base / d).mkdir(parents=True, exist_ok=True)
        if missing:
            repaired.append(folder)
    return repaired


def ensure_notmuch_config(explicit: str | None, mail_root: Path | None, name: str,
                          addresses: list[str]) -> tuple[Path, bool]:
    """The config to use, and whether we wrote it."""
    existing = find_notmuch_config(explicit)
    if existing is not None:
        if mail_root is not None:
            check_same_mail_root(existing, mail_root)
        return existing, False
    if mail_root is None:
        raise FileNotFoundError(
            "no notmuch config found and no mail root given: run `fmail-nm init --mail-root DIR`"
        )
    if not mail_root.is_dir():
        raise FileNotFoundError(f"mail root {mail_root} does not exist")
    target = new_config_path(explicit)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_notmuch_config(mail_root.resolve(), name, addresses), encoding="utf-8")
    return target, True


def check_same_mail_root(config_path: Path, mail_root: Path) -> None:
    """Refuse a ``--mail-root`` that is not the mail root of the notmuch config init adopts:
    that config is the user's and is never rewritten, so the folder given would not be used."""
    own_root = Path(notmuch_settings(config_path)["database.mail_root"])
    if mail_root.resolve() != own_root.resolve():
        raise ConfigError(
            f"the notmuch config {config_path} is for the mail in {own_root}, not {mail_root}, "
            "and fmail-nm never rewrites it: leave out --mail-root to use that mail, or give "
            f"{mail_root} a notmuch config of its own with --notmuch-config FILE (or "
            "NOTMUCH_CONFIG), which init writes when FILE is not there yet")


def check_named_notmuch_config(settings: Settings, explicit: str | None) -> None:
    """Refuse a ``--notmuch-config`` other than the one fmail.toml names: init would put the
    hook into that config's hook folder, while the hook and every command read fmail.toml's."""
    named = settings.notmuch_config
    if explicit is None or named is None:
        return
    if Path(explicit).expanduser().resolve() == Path(named).expanduser().resolve():
        return
    raise ConfigError(
        f"{settings.path} names the notmuch config {named}, not {explicit}, and fmail-nm and "
        f"its hook use that one: leave out --notmuch-config to set up {named}, or change "
        f"`config` under [notmuch] in {settings.path} (or give another fmail.toml with "
        "--config), then run `fmail-nm init` again")


def prepare(settings: Settings, *, notmuch_config: str | None, mail_root: Path | None,
            name: str, addresses: list[str]) -> InitReport:
    """Everything init does before indexing: config, maildir repair, identity and hooks."""
    config_path, wrote = ensure_notmuch_config(notmuch_config, mail_root, name, addresses)
    # The hook directory is only resolved once a database exists.
    ensure_database(config_path)
    # Before anything is indexed: the first post-new pass tags all that comes after this.
    mark_setup_revision(settings, str(config_path))
    nm = notmuch_settings(config_path)
    report = InitReport(notmuch_config=config_path, wrote_config=wrote)
    notmuch = notmuch_program(config_path)
    if not wrote:
        report.advice = advice_for_existing(nm, notmuch)
    root = Path(nm["database.mail_root"])
    report.repaired_folders = repair_maildirs(root, maildir_folders(root))
    if not addresses:
        nm = user_settings_as_written(nm, config_path)
        report.identity = learn_identity(settings, config_path, root, nm)
        if wrote:
            config_path.write_text(render_notmuch_config(
                root, name or report.identity.name, report.identity.addresses), encoding="utf-8")
        else:
            report.advice += missing_from_notmuch(report.identity, nm, notmuch)
    elif not wrote:  # given, for a config of the user's: notmuch is told how to learn them
        given = Identity()
        for address in addresses:
            given.add(address, "--address")
        report.advice += missing_from_notmuch(given, user_settings_as_written(nm, config_path),
                                              notmuch)
    report.hooks = install_hooks(Path(nm["database.hook_dir"]), fmail_command(settings))
    return report


def learn_identity(settings: Settings, config_path: Path, mail_root: Path,
                   nm: dict[str, str]) -> Identity:
    """The user's identity from their setup: the Sent folders from the index, or from their
    files while nothing is indexed (so the first index, with the addresses known, can be
    fmail-nm's own: :mod:`fmail_nm.passes.first_index`)."""
    config = resolve(settings, mail_root)
    with Reader(str(config_path)) as reader:
        empty = reader.count("*", exclude_tags=()) == 0
        return discover(nm, config, None if empty else reader)


def mark_setup_revision(settings: Settings, config_path: str) -> None:
    """Record the notmuch revision fmail-nm was set up at, unless the sidecar is built already:
    the first post-new pass then tags what is indexed after it -- whoever runs that first
    ``notmuch new`` -- and never the mail that was there before."""
    with sidecar.opened(sidecar.sidecar_path(settings.data_dir_or_default())) as conn:
        if sidecar.get_state(conn, "notmuch_uuid") is not None:
            return
        with Reader(config_path) as reader, sidecar.transaction(conn):
            sidecar.set_state(conn, SETUP_REVISION, str(reader.revision().number))


def mirror_existing_mail(config: Config) -> bool:
    """Build the sidecar from the mail notmuch holds before fmail-nm first indexes, marking
    none of it new; True if built.  The tagging pass takes the messages the mirror meets
    later: the setup revision alone told "changed since" (a message read on the phone, a tag
    set by hand) from "indexed since", and the rules then put archived mail back in the inbox."""
    with sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        if sidecar.get_state(conn, "notmuch_uuid") is not None:
            return False
    with Reader(config.settings.notmuch_config) as reader:
        if reader.count("*", exclude_tags=()) == 0:
            return False  # an empty database: the first index tags everything itself
        sync_sidecar(config, reader, mark_new=False)
    return True


FMAIL_TOML = """\
# fmail-nm configuration, written by `fmail-nm init`; edit freely, fmail-nm never rewrites it.
# Everything is optional: without [[accounts]], accounts and folders come from your mbsync
# config, then from the folders on disk; your addresses from notmuch's user.* settings.
# Accounts added with `fmail-nm account add` live in accounts.toml beside the mbsync and
# msmtp configs fmail-nm writes for them, in $XDG_CONFIG_HOME/fmail-nm/.

# Top-level keys go above every [table]: below one, TOML reads them as the table's.
# Where fmail-nm keeps its own state (sidecar database, HTTP token, status).
# data_dir = "~/.local/share/fmail-nm"

# Addresses of yours not tied to one account.
# addresses = ["me@example.org"]
{notmuch}
# Which mbsync config describes your Maildir stores (default: ~/.mbsyncrc, else
# $XDG_CONFIG_HOME/isyncrc; a relative path is read from this file's folder), and how often
# `fmail-nm run` pulls each channel (0: never).
# [mbsync]
# config = "~/.mbsyncrc"
# pull_interval_minutes = 10

# The watcher of `fmail-nm run` indexes new mail as it lands; a full index run this often
# (when none ran meanwhile) finds anything it missed, e.g. after the kernel's inotify queue
# overflowed (0: never; an overflow is always followed by a full run).
# [index]
# safety_interval_minutes = 15

# An account by hand (folders relative to its folder under the mail root; the usual names
# Sent, Sent Items, Trash, Junk, Spam, Archive, [Gmail]/... are found without them):
# [[accounts]]
# name = "personal"
# addresses = ["me@example.org"]
# maildir = "personal"
# mbsync_channel = "personal"
# send = {{ command = ["msmtp", "-a", "personal"] }}
# [accounts.folders]
# sent = "Sent"
"""


def write_fmail_toml(path: Path, notmuch_config: str | None,
                     addresses: Sequence[str] = (), profile: str | None = None,
                     locations: Mapping[str, str] | None = None) -> None:
    """A commented fmail.toml; it names the notmuch config when init was told one, or the
    environment chose it, with the $NOTMUCH_PROFILE init ran with (it also picks notmuch's
    hook folder), the database ``locations`` the environment gave notmuch
    ($NOTMUCH_DATABASE, $MAILDIR: config.NOTMUCH_LOCATION_VARIABLES's keys) and the
    addresses init was given (--address)."""
    named = {"config": notmuch_config, "profile": profile if notmuch_config else None,
             **(locations or {})}
    written = "".join(f"{key} = {json.dumps(value)}\n" for key, value in named.items() if value)
    notmuch = ("\n[notmuch]\n" + written if written
               else "\n# Which notmuch config to use (default: found as libnotmuch finds it).\n"
                    "# [notmuch]\n# config = \"~/.notmuch-config\"\n")
    if addresses:  # top-level keys go before the first table
        notmuch = ("\n# Given to `fmail-nm init --address`.\naddresses = "
                   + json.dumps(list(addresses), ensure_ascii=False) + "\n" + notmuch)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x", encoding="utf-8") as out:  # never over a file that appeared meanwhile
        out.write(FMAIL_TOML.format(notmuch=notmuch))
