"""``fmail-nm doctor``: the whole setup checked, each problem with the command that fixes it.

Checks, in order: the config files exist and parse; notmuch's settings (``new.ignore``,
exclusions, flag sync, ``new.tags``); that the notmuch database opens; that fmail-nm knows
the user's addresses; our post-new and post-insert hooks installed, executable and chained;
each account's mbsync channel defined, syncing into the mail root, with ``Expunge``, and the
SASL plugin its IMAP account needs when it signs in with ``AuthMechs XOAUTH2``; folders
holding mail that the service's last sync found gone from the server; an msmtp account for
each address that sends through msmtp; the sidecar built from this notmuch database; the
HTTP token file private; the inotify watch limit against the folders to watch; mail on disk
that the index does not have.  Nothing is changed: the fixes are for the user to run.

``get_sync_status`` shows the same findings (:func:`diagnose_config` with ``quick``: without
the Sent-folder scan, the directory walks and the folders gone from the server, which its
status already says).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import sqlite3
import stat
import time
from collections.abc import Sequence
from pathlib import Path

from .. import mbsyncrc, msmtprc
from ..adopt.hooks import (HOOK_NAMES, conflict_advice, hook_text, hooks_in_conflict, is_ours,
                           kept_hook, legacy_kept_hook)
from ..adopt.identity import discover, missing_from_notmuch
from ..adopt.initialize import Finding, notmuch_findings
from ..app import load_config
from ..config import (Account, Config, ConfigError, default_config_path, fmail_command,
                      load_settings, relative_to_root)
from ..passes.indexing import Ignored, unreadable_ignore
from ..store import maildir, sidecar
from ..store.notmuch import (DatabaseDamaged, DatabaseMissing, NotmuchAccessError, Reader,
                             xapian_folders)
from ..store.notmuch_cli import notmuch_settings, user_settings_as_written
from ..store.notmuch_config import find_notmuch_config, new_config_path, notmuch_program
from .mbsync import gone_boxes, mbsync_config_of
from .status import StatusStore
from .watcher import WATCH_LIMIT_SYSCTL, count_dirs

WATCH_LIMIT_FILE = Path("/proc/sys/fs/inotify/max_user_watches")
# The watch limit is per user, shared with editors, IDEs and file managers: leave them room.
WATCH_SHARE = 0.5
# Where Cyrus SASL, which mbsync signs in with, loads its plugins from when $SASL_PATH does not
# say: its library's folder's sasl2/ -- lib/<multiarch>/ on Debian and Ubuntu, lib64/ on Fedora.
SASL_PLUGIN_DIRS = ("/usr/lib/sasl2", "/usr/lib/*/sasl2", "/usr/lib64/sasl2",
                    "/usr/local/lib/sasl2", "/usr/local/lib/*/sasl2", "/opt/homebrew/lib/sasl2")
# KDE's XOAUTH2 plugin (libkdexoauth2.so) or cyrus-sasl-xoauth2's (libxoauth2.so).
XOAUTH2_PLUGIN = "lib*xoauth2.so*"
XOAUTH2_PACKAGE = "libsasl2-modules-kdexoauth2"


def diagnose(config_path: str | None = None, *, token_file: Path | None = None,
             watch_limit_file: Path = WATCH_LIMIT_FILE) -> list[Finding]:
    """Every finding for the setup a command would use (``--config`` or the defaults)."""
    try:
        settings = load_settings(config_path)
    except ConfigError as exc:
        file = Path(config_path).expanduser() if config_path else default_config_path()
        # A missing fmail.toml is what init writes; one it cannot read, init cannot mend.
        return [Finding("config", str(exc).partition(";")[0], "fmail-nm init"
                        if not file.is_file() else f"edit {file} where the message says")]
    if find_notmuch_config(settings.notmuch_config) is None:
        return [Finding("notmuch", "no notmuch config at "
                        f"{new_config_path(settings.notmuch_config)}",
                        "fmail-nm init --mail-root ~/Mail (your Maildir root)")]
    try:
        config = load_config(config_path)
    except (ConfigError, NotmuchAccessError) as exc:
        return [Finding("config", str(exc), "edit the file it names, then fmail-nm doctor")]
    return diagnose_config(config, token_file=token_file, watch_limit_file=watch_limit_file)


def diagnose_config(config: Config, *, quick: bool = False, token_file: Path | None = None,
                    watch_limit_file: Path = WATCH_LIMIT_FILE) -> list[Finding]:
    nm = notmuch_settings(config.settings.notmuch_config)
    found = notmuch_findings(nm, notmuch_program(config.settings.notmuch_config))
    with Reader(config.settings.notmuch_config) as reader:
        unreadable = database_findings(reader, nm)
        # The identity and sidecar checks read the database, and notmuch names the hook
        # folder only for a database it opened: they wait until it opens.
        found += unreadable
        if not unreadable:
            found += identity_findings(config, nm, reader, quick=quick)
            found += hook_findings(Path(nm.get("database.hook_dir", "")),
                                   fmail_command(config.settings))
        found += mbsync_findings(config)
        if not quick:  # get_sync_status shows the runs' errors themselves
            found += gone_folder_findings(config)
        found += msmtp_findings(config)
        if not unreadable:
            found += sidecar_findings(config, reader)
            if not quick:
                found += unindexed_findings(config, reader)
    if token_file is not None:
        found += token_findings(token_file)
    if not quick:
        found += inotify_findings(config, watch_limit_file)
    return found


def problems(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.serious]


# ---------------------------------------------------------------------------------------------
# The checks


def database_findings(reader: Reader, nm: dict[str, str]) -> list[Finding]:
    """The notmuch database opens: missing (never built, or deleted) or damaged."""
    try:
        reader.revision()
    except DatabaseMissing as exc:
        return [Finding("database", str(exc).partition("; run")[0], "fmail-nm init")]
    except DatabaseDamaged as exc:
        xapian = _xapian_folder(nm)
        where = shlex.quote(str(xapian)) if xapian else "its .notmuch/xapian folder"
        moved = (f"mv {where} {shlex.quote(str(xapian) + '.damaged')}" if xapian
                 else "move its .notmuch/xapian folder aside")
        return [Finding("database", f"{exc.problem} (`xapian-check {where}` tells more)",
                        f"{moved} && fmail-nm init ({exc.LOST_IN_REBUILD})")]
    return []


def _xapian_folder(nm: dict[str, str]) -> Path | None:
    """Where the Xapian files of notmuch's database are, if it names a database.path."""
    if not nm.get("database.path"):
        return None
    base = Path(nm["database.path"]).expanduser()
    base = base if base.is_absolute() else Path.home() / base  # notmuch's rule
    return next((x for x in xapian_folders(base) if x.is_dir()), None)


def identity_findings(config: Config, nm: dict[str, str], reader: Reader, *,
                      quick: bool) -> list[Finding]:
    """No address known: nothing is tagged sent and find_unanswered_threads cannot work."""
    if config.addresses:
        return []
    nm = user_settings_as_written(nm, config.settings.notmuch_config)
    identity = discover(nm, config, reader) if not quick else None
    notmuch = notmuch_program(config.settings.notmuch_config)
    commands = missing_from_notmuch(identity, nm, notmuch) if identity else []
    return [Finding("identity", "fmail-nm knows none of your addresses: your mail is not "
                    "tagged sent and find_unanswered_threads cannot answer",
                    " && ".join(commands) if commands else
                    f"{notmuch} config set user.primary_email you@example.org (your address)")]


# What is lost without each hook of ours.
HOOK_MISSED = {
    "post-new": "new mail is not tagged and the sidecar falls behind",
    "post-insert": "mail `notmuch insert` delivers waits for the next notmuch new to be tagged",
}


def hook_findings(hook_dir: Path, command: list[str]) -> list[Finding]:
    """``command``: the argv init would write into the hooks now (config.fmail_command)."""
    return [found for name in HOOK_NAMES for found in _hook_findings(hook_dir, name, command)]


def _hook_findings(hook_dir: Path, name: str, command: list[str]) -> list[Finding]:
    hook = hook_dir / name
    pair = hooks_in_conflict(hook_dir, name)
    if pair is not None:  # init refuses until the user has chosen
        return [Finding("hook", f"{pair[0]} and {pair[1]} are two different {name} hooks of "
                        "yours, and only one runs before fmail-nm's",
                        conflict_advice(hook_dir, name))]
    if not hook.exists():
        # Without post-insert nothing is lost, only later (the next notmuch new tags it): a
        # setup from before it existed is not a failing one.
        return [Finding("hook", f"fmail-nm's {name} hook is not installed in {hook_dir}: "
                        f"{HOOK_MISSED[name]}", "fmail-nm init", serious=name == "post-new")]
    if not is_ours(hook):
        return [Finding("hook", f"{hook} is not fmail-nm's hook: {HOOK_MISSED[name]}",
                        "fmail-nm init (it keeps your hook and runs it first)")]
    found = []
    kept, legacy = kept_hook(hook_dir, name), legacy_kept_hook(hook_dir, name)
    for path in (hook, kept, legacy):
        if path.exists() and not os.access(path, os.X_OK):
            found.append(Finding("hook", f"{path} is not executable, so notmuch "
                                 f"{'skips it' if path == hook else 'never runs your own hook'}",
                                 f"chmod +x {shlex.quote(str(path))}"))
    if os.path.lexists(legacy):
        found.append(_legacy_finding(hook, kept, legacy))
    program = _hook_program(hook)
    if program and not Path(program).exists():
        found.append(Finding("hook", f"the {name} hook runs {program}, which is gone (a "
                             "virtualenv moved or removed)", "fmail-nm init"))
    elif not found and (hook.read_text(encoding="utf-8", errors="replace")
                        != hook_text(name, command)):
        # An earlier version's hook (e.g. one that imported modules from notmuch new's working
        # directory), or one written for another fmail.toml: it runs, but not as init would.
        found.append(Finding("hook", f"{hook} is not the hook this fmail-nm would install "
                             "(an earlier version's, or another config's)", "fmail-nm init",
                             serious=False))
    return found


def _legacy_finding(hook: Path, kept: Path, legacy: Path) -> Finding:
    """The user's hook where an earlier version kept it: run under another name by that
    version's hook (a script that dispatches on its name fails), by this one's not at all."""
    fix = f"fmail-nm init (it moves your hook to {kept})"
    if legacy.name in hook.read_text(encoding="utf-8", errors="replace"):
        return Finding("hook", f"your own {hook.name} hook runs as {legacy}: a script that "
                       "tells pre-new from post-new by its name fails there", fix, serious=False)
    return Finding("hook", f"your own {hook.name} hook at {legacy} is never run", fix)


def _hook_program(hook: Path) -> str | None:
    for line in hook.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.endswith(f" hook {hook.name} || status=$?"):
            try:
                return shlex.split(line)[0]
            except (ValueError, IndexError):
                return None
    return None


def _mbsync_file(config: Config, account: Account) -> Path | None:
    path = mbsync_config_of(config, account)
    return Path(path) if path else None


def mbsync_findings(config: Config) -> list[Finding]:
    found = []
    parsed: dict[Path, mbsyncrc.MbsyncConfig] = {}
    for account in config.accounts:
        if not account.mbsync_channel:
            continue
        path = _mbsync_file(config, account)
        if path is None or not path.is_file():
            where = f"at {path}" if path else "(~/.mbsyncrc or $XDG_CONFIG_HOME/isyncrc)"
            found.append(Finding("mbsync", f"account {account.name} syncs with mbsync channel "
                                 f"{account.mbsync_channel}, but there is no mbsync "
                                 f"config {where}",
                                 "write it (see mbsync(1)), or fmail-nm account add"))
            continue
        rc = parsed.setdefault(path, mbsyncrc.parse(path))
        if account.mbsync_channel in rc.groups:  # a Group's channels, one store
            for member in rc.group_channels(account.mbsync_channel):
                found += _channel_findings(config, path, rc, member)
            continue
        channel = rc.channels.get(account.mbsync_channel)
        if channel is None:
            known = ", ".join(rc.channels) or "none"
            found.append(Finding("mbsync", f"account {account.name} names mbsync channel "
                                 f"{account.mbsync_channel}, which {path} does not define "
                                 f"(channels there: {known})",
                                 f"set mbsync_channel of account {account.name} in fmail.toml "
                                 "to one of them"))
            continue
        found += _channel_findings(config, path, rc, channel)
    return list(dict.fromkeys(found))  # a Group's channels share one IMAP account


def gone_folder_findings(config: Config) -> list[Finding]:
    """The folders the service's last pull or push found gone from the server (see
    :func:`~fmail_nm.service.mbsync.gone_boxes`) whose local folder still holds mail or
    copies held for undo; one emptied since goes with the next sync."""
    found: dict[str, Finding] = {}
    for account, error in _recorded_errors(config):
        for gone in gone_boxes(config, account, error):
            if gone.messages or gone.held:
                found.setdefault(gone.problem(), Finding("mbsync", gone.problem(), gone.fix()))
    return list(found.values())


def _recorded_errors(config: Config) -> list[tuple[Account, str]]:
    """The errors of each account's last pull and push, as the service recorded them."""
    status = StatusStore(config.data_dir).load()
    accounts = {a.name: a for a in config.accounts}
    return [(accounts[acct.name], run.error)
            for acct in (status.accounts if status is not None else [])
            if acct.name in accounts
            for run in (acct.last_pull, acct.last_push) if run is not None and run.error]


def _channel_findings(config: Config, path: Path, rc: mbsyncrc.MbsyncConfig,
                      channel: mbsyncrc.Channel) -> list[Finding]:
    found = []
    store = rc.channel_store(channel)
    root = config.mail_root.resolve()
    if (store is not None and store.path is not None
            and relative_to_root(store.path, config.mail_root) is None):
        # With the database apart from the mail (notmuch 0.32's database.mail_root, the XDG
        # layout), database.path would move only the database.
        setting = "database.path" if (root / ".notmuch").is_dir() else "database.mail_root"
        found.append(Finding("mbsync", f"channel {channel.name} syncs into {store.path}, outside "
                             f"notmuch's mail root {root}: notmuch never indexes that mail",
                             f"in {path}, put the Path of MaildirStore {store.name} under {root} "
                             f"(or notmuch config set {setting} to a folder holding both)"))
    if (channel.expunge or "none").lower() not in ("both", "far"):
        found.append(Finding("expunge", f"channel {channel.name} in {path} has no Expunge Both: "
                             "mail moved to Trash or Junk stays in the server's folder as well, "
                             "marked deleted", f"add `Expunge Both` to Channel {channel.name} "
                             f"in {path}"))
    imap = rc.channel_imap_account(channel)
    if imap is not None and "XOAUTH2" in imap.auth_mechs and xoauth2_plugin() is None:
        found.append(_no_xoauth2_plugin(path, imap))
    return found


def _no_xoauth2_plugin(path: Path, imap: mbsyncrc.ImapAccount) -> Finding:
    """An account that asks for XOAUTH2 without the plugin.  mbsync signs in with the best
    mechanism that AuthMechs, the server and the installed plugins all have: with XOAUTH2
    alone it cannot sign in; with others listed too (or ``*``) it tries one of them, with a
    token where the password command prints one -- whether that works no file tells, so it
    is a failure either way."""
    others = " ".join(m for m in imap.auth_mechs if m != "XOAUTH2")
    missing = (f"IMAP account {imap.name} in {path} asks for OAuth2 (AuthMechs "
               f"{' '.join(imap.auth_mechs)}), but no Cyrus SASL plugin for XOAUTH2 is "
               f"installed (none in {_sasl_dirs_text()})")
    fix = (f"sudo apt-get install {XOAUTH2_PACKAGE} (elsewhere: the package with the XOAUTH2 "
           "SASL plugin, e.g. cyrus-sasl-xoauth2)")
    if not others:
        return Finding("mbsync", f"{missing}: mbsync cannot log in", fix)
    return Finding("mbsync", f"{missing}: mbsync never signs in with OAuth2; it tries "
                   f"{others} instead, which fails unless the password command prints a "
                   "password", f"{fix}; or, to sign in with a password, take XOAUTH2 out of "
                   "AuthMechs")


def sasl_plugin_dirs() -> list[Path]:
    """The folders Cyrus SASL loads plugins from: ``$SASL_PATH`` (colon-separated) when set,
    as libsasl2 reads it -- set but empty, it names no folder and mbsync gets no plugin at
    all --, else the usual install folders that exist."""
    given = os.environ.get("SASL_PATH")
    if given is not None:
        return [Path(d) for d in given.split(":") if d]
    return [Path(d) for pattern in SASL_PLUGIN_DIRS for d in sorted(glob.glob(pattern))]


def xoauth2_plugin() -> Path | None:
    """The installed SASL plugin that gives mbsync XOAUTH2, None without one."""
    return next((plugin for folder in sasl_plugin_dirs()
                 for plugin in sorted(folder.glob(XOAUTH2_PLUGIN))), None)


def _sasl_dirs_text() -> str:
    return ", ".join(str(d) for d in sasl_plugin_dirs()) or (
        "$SASL_PATH, which names no folder" if "SASL_PATH" in os.environ
        else "any SASL plugin folder")


def _msmtp_file(account: Account) -> Path | None:
    command = list(account.send.command) if account.send else []
    if "-C" in command[:-1]:
        return Path(command[command.index("-C") + 1]).expanduser()
    return msmtprc.default_path()


def msmtp_findings(config: Config) -> list[Finding]:
    """Every address of an account that sends with msmtp needs an msmtp account for it."""
    found = []
    for account in config.accounts:
        if not account.send or not account.send.command or \
                Path(account.send.command[0]).name != "msmtp":
            continue
        path = _msmtp_file(account)
        if path is None or not path.is_file():
            found.append(Finding("msmtp", f"account {account.name} sends with msmtp, but there "
                                 "is no msmtp config (~/.msmtprc)",
                                 "write one (see msmtp(1)), or fmail-nm account add"))
            continue
        rc = msmtprc.parse(path)
        for address in account.addresses:
            if rc.account_for(address) is None:
                found.append(Finding("msmtp", f"no msmtp account in {path} sends as {address} "
                                     f"(account {account.name})",
                                     f"add to {path}: account {account.name} / from {address} "
                                     "/ host ... (see msmtp(1))"))
    return found


def sidecar_findings(config: Config, reader: Reader) -> list[Finding]:
    path = sidecar.sidecar_path(config.data_dir)
    if not path.is_file():
        return [Finding("sidecar", f"the sidecar {path} is not built yet: SQL and contacts "
                        "have nothing to read", "fmail-nm sidecar sync")]
    try:
        with sidecar.opened(path, readonly=True) as conn:
            revision = reader.revision()
            uuid = sidecar.get_state(conn, "notmuch_uuid")
            done = sidecar.get_state(conn, "revision")
    except sidecar.SidecarError as exc:  # an older schema (an upgrade not indexed yet), or newer
        problem, _, fix = str(exc).partition("; ")
        return [Finding("sidecar", problem, fix)]
    except sqlite3.DatabaseError as exc:
        return [Finding("sidecar", f"the sidecar {path} cannot be read ({exc}): the post-new "
                        "hook, SQL and contacts fail on it", "fmail-nm sidecar rebuild (it "
                        "moves the damaged file aside first)")]
    if uuid != revision.uuid:
        return [Finding("sidecar", "the sidecar was built from another notmuch database (it "
                        "was rebuilt or replaced)", "fmail-nm sidecar rebuild")]
    if done is None or int(done) < revision.number:
        # Tag changes by mail clients land here until the next sync: worth knowing, not wrong.
        return [Finding("sidecar", f"the sidecar is at notmuch revision {done}, notmuch at "
                        f"{revision.number}", "fmail-nm sidecar sync", serious=False)]
    return []


# A file younger than this may be a delivery the next index run is about to take.
SETTLE_SECONDS = 60
# The start of a message file: a header line, or an mbox "From " line.
_MAIL_START = re.compile(rb"From |[!-9;-~]+:")


def unindexed_findings(config: Config, reader: Reader) -> list[Finding]:
    """Mail on disk that the index does not have.  ``notmuch new`` lists a folder only when
    its modification time changed since the second it recorded; a file delivered later in
    that second (a fine-grained file time can read a second ahead of the clock) is passed
    over until the folder changes again.  Every file ``notmuch new`` would index is looked
    up by name (1.6 s at 100,000 messages); files that do not start like mail, which
    notmuch ignores, and files still settling are left out."""
    # Here, not at the top: the server imports this module for its quick checks, which
    # never walk the mail, and first_index brings multiprocessing with it.
    from ..passes.first_index import FirstIndexFailed, mail_files
    setting = reader.setting("new.ignore")
    if unreadable_ignore(setting):
        return []  # which files notmuch new ignores is then notmuch's to know
    mail_root = Path(reader.setting("database.mail_root") or config.mail_root)
    try:
        files = mail_files(mail_root, Ignored(setting))
    except FirstIndexFailed:
        return []  # an unreadable folder: notmuch new says so itself
    settled = time.time() - SETTLE_SECONDS
    missing = [f for f in reader.unknown_files([f for f in files if _settled(f, settled)])
               if _starts_like_mail(f)]
    if not missing:
        return []
    example = maildir.relative_path(mail_root, missing[0])
    return [Finding("index", f"{len(missing)} message file(s) in the mail root are not in the "
                    f"index (e.g. {example}): notmuch new passed over them, and looks again "
                    "only when their folder changes", "fmail-nm index --full-scan")]


def _settled(path: str, before: float) -> bool:
    try:
        return os.stat(path).st_mtime < before
    except OSError:
        return False  # gone since the listing: moved by mbsync or a mail client


def _starts_like_mail(path: str) -> bool:
    try:
        with open(path, "rb") as file:
            return bool(_MAIL_START.match(file.read(256)))
    except OSError:
        return False


def token_findings(token_file: Path) -> list[Finding]:
    try:
        mode = stat.S_IMODE(token_file.stat().st_mode)
    except FileNotFoundError:
        return []
    if mode & 0o077:
        return [Finding("token", f"the HTTP token {token_file} is readable by others (mode "
                        f"{mode:o}): anyone on this machine could read your mail",
                        f"chmod 600 {shlex.quote(str(token_file))}")]
    return []


def watch_limit(limit_file: Path) -> int | None:
    try:
        return int(limit_file.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def inotify_findings(config: Config, limit_file: Path) -> list[Finding]:
    limit = watch_limit(limit_file)
    if limit is None:
        return []
    needed = count_dirs(str(config.mail_root))
    if needed <= limit * WATCH_SHARE:
        return []
    target = max(524288, 4 * needed)
    return [Finding("inotify", f"the mail root has {needed} directories to watch and "
                    f"{WATCH_LIMIT_SYSCTL} is {limit} (shared with every program of yours that "
                    "watches files): `fmail-nm run` would fall back to polling",
                    f"sudo sysctl {WATCH_LIMIT_SYSCTL}={target} && echo "
                    f"{WATCH_LIMIT_SYSCTL}={target} | sudo tee /etc/sysctl.d/90-fmail-nm.conf")]
