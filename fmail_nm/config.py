"""fmail-nm's own configuration (``fmail.toml``) and the accounts it describes.

Where the file is silent the setup is discovered, not assumed: the mail root comes from notmuch,
accounts and their folders from the mbsync configuration or, failing that, from the folders on
disk, and the user's addresses from notmuch's ``user.*`` settings.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import mbsyncrc, tags
from .errors import CallerError

ROLES = ("inbox", "sent", "drafts", "trash", "junk", "archive")

# The folder name of a mail root that is itself a Maildir (cur/new/tmp directly in it),
# wherever fmail-nm names a folder; notmuch's folder: term spells it "" (folder_term).
ROOT_FOLDER = "."


def _below(folder: str, root: str) -> bool:
    """Whether a folder is ``root`` or inside it (both relative to the mail root)."""
    return root == ROOT_FOLDER or folder == root or folder.startswith(root + "/")


def folder_term(folder: str) -> str:
    """A folder (relative to the mail root) as the value of notmuch's ``folder:`` term."""
    return "" if folder == ROOT_FOLDER else folder


# What a notmuch thread id may be (notmuch writes 16 hex digits); anything else -- a `{...}`
# query, an empty value -- is not put after `thread:`.
THREAD_ID = re.compile(r"[0-9A-Za-z]{1,64}")

# Folder names mail servers and clients use for each role, compared case-insensitively against
# a folder's last path component.
_ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "inbox": ("inbox",),
    "sent": ("sent", "sent mail", "sent items", "sent messages", "gesendet",
             "gesendete elemente", "gesendete objekte", "messages envoyés", "éléments envoyés",
             "envoyés", "enviados", "elementos enviados", "verzonden", "verzonden items",
             "posta inviata", "inviati", "skickat", "skickade objekt"),
    "drafts": ("drafts", "draft", "entwürfe", "brouillons", "borradores", "concepten", "bozze",
               "utkast"),
    "trash": ("trash", "deleted", "deleted items", "deleted messages", "bin", "papierkorb",
              "gelöschte elemente", "gelöschte objekte", "corbeille", "éléments supprimés",
              "papelera", "elementos eliminados", "verwijderde items", "prullenbak",
              "cestino", "posta eliminata", "papperskorgen", "borttagna objekt"),
    "junk": ("junk", "spam", "junk e-mail", "junk email", "bulk mail", "junk-e-mail",
             "courrier indésirable", "correo no deseado", "ongewenste e-mail",
             "posta indesiderata", "skräppost", "spamverdacht", "unerwünscht"),
    "archive": ("archive", "archives", "archiv", "archivio", "archivo", "archief", "arkiv"),
}
# Gmail's own folders ("[Google Mail]" in the UK and Germany): they are the roles, whatever
# labels of the same names the user made.
_SYSTEM_PREFIXES = ("[gmail]/", "[google mail]/")


class ConfigError(CallerError):
    """fmail.toml or the mail setup it points at is not usable; the message says what to fix."""


@dataclass(frozen=True)
class SendMethod:
    """How an account sends: a sendmail-compatible command (msmtp).  The smtp_* keys are read
    but not used: fmail-nm sends only through the user's own command, never with credentials
    of its own."""

    command: tuple[str, ...] = ()
    smtp_host: str | None = None
    smtp_port: int = 587
    smtp_user: str | None = None
    smtp_starttls: bool = True
    # The server files a copy of what is sent (Gmail): no local Sent copy, or it would be twice.
    server_stores_sent: bool = False


# The [send] defaults: sending off (drafts only), drafts sent only once saved, 10 sends an hour.
DEFAULT_MAX_SENDS_PER_HOUR = 10
DEFAULT_MAX_MESSAGE_MB = 10.0
DEFAULT_SEND_TIMEOUT = 120.0


@dataclass(frozen=True)
class SendSettings:
    """``[send]``: whether the send tools exist and the limits they keep.

    Modes: ``enabled = false`` (the default, "drafts only": drafts and replies are saved in the
    Drafts folder for the user to send); ``enabled = true`` (saved drafts may be sent);
    ``direct = true`` as well (a new message or reply may be sent without a saved draft)."""

    enabled: bool = False
    direct: bool = False
    command: tuple[str, ...] = ("msmtp",)  # for accounts without send.command
    max_per_hour: int = DEFAULT_MAX_SENDS_PER_HOUR
    max_message_mb: float = DEFAULT_MAX_MESSAGE_MB
    attachments_dir: Path | None = None  # attachments only from files under it; None: none
    timeout_seconds: float = DEFAULT_SEND_TIMEOUT


@dataclass(frozen=True)
class FolderLayout:
    """How a store spells mailbox names on disk: mbsync's ``SubFolders`` (lower-cased;
    None is Verbatim's spelling, which every Maildir tree without mbsync has too) and
    ``Flatten``."""

    subfolders: str | None = None
    flatten: str | None = None


@dataclass(frozen=True)
class Account:
    name: str
    addresses: tuple[str, ...]
    maildir: str  # the account's folder, relative to the mail root ("." for the root itself)
    folders: dict[str, str] = field(default_factory=dict)  # role -> folder relative to mail root
    mbsync_channel: str | None = None
    mbsync_config: str | None = None  # the channel's own mbsync config (absolute), if any
    send: SendMethod | None = None
    pull_interval_minutes: float = 0.0  # scheduled pulls by `fmail-nm run` (0: none)
    blocked_to_junk: bool = False  # move mail from blocked senders into the Junk folder
    server_saves_sent: bool = False  # the SMTP server files sent mail in Sent (Gmail)
    layout: FolderLayout = FolderLayout()

    def outside_inbox(self) -> str | None:
        """The account's INBOX where mbsync's ``Inbox`` puts it outside the store's ``Path``
        (Path ~/Mail/gmx/, Inbox ~/Mail/gmx-inbox): a folder of the account all the same."""
        inbox = self.folders.get("inbox")
        return None if inbox is None or _below(inbox, self.maildir) else inbox

    def place(self, folder: str) -> str | None:
        """``folder`` (relative to the mail root) as written below the account's own folder:
        "" for that folder itself, "INBOX" for its INBOX outside it; None for a folder
        outside the account."""
        if folder == self.outside_inbox():
            return "INBOX"
        if not _below(folder, self.maildir):
            return None
        if self.maildir == ROOT_FOLDER:
            return "" if folder == ROOT_FOLDER else folder
        return folder[len(self.maildir) + 1:]

    def holder(self, folder: str) -> str | None:
        """Which of the account's folders holds ``folder`` (relative to the mail root): its
        own, or its INBOX outside it; None for a folder outside the account."""
        if self.place(folder) is None:
            return None
        return self.maildir if _below(folder, self.maildir) else folder

    def mailbox(self, folder: str) -> str | None:
        """The server's name of one of this account's folders (relative to the mail root),
        as the user knows it: "[Gmail]/All Mail" for Maildir++'s ".[Gmail].All Mail",
        "Entwürfe" for "Entw&APw-rfe"; None for a folder outside the account."""
        rest = self.place(folder)
        # Only Maildir++ keeps a mailbox (INBOX) in the store's root itself.
        return None if rest is None else mailbox_name(rest, self.layout) or None

    def folder(self, role: str) -> str:
        """The folder for a role, or a ConfigError naming the account and role."""
        try:
            return self.folders[role]
        except KeyError:
            raise ConfigError(
                f"account {self.name!r} has no {role} folder; set [accounts.folders] {role} = "
                f'"<folder>" in fmail.toml'
            ) from None


@dataclass(frozen=True)
class TagRule:
    """Tags to add and remove on new messages matching a notmuch query.

    ``{me}`` in the query stands for "from one of the user's addresses" (their sub-addresses
    too: passes.tagging.me_among), and ``{folder:ROLE}`` (ROLE one of inbox, sent, drafts,
    trash, junk, archive) for "in any account's ROLE folder".
    """

    query: str
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()


DEFAULT_RULES: tuple[TagRule, ...] = (
    # Mail in a Drafts folder is a draft (a draft written on a phone, pulled by mbsync), whether
    # or not notmuch follows the D flag (maildir.synchronize_flags) or the server set \Draft.
    TagRule(query="{folder:drafts}", add=(tags.DRAFT,), remove=(tags.INBOX,)),
    # A draft is from the user too, but it was never sent.
    TagRule(query=f"{{me}} AND NOT tag:{tags.DRAFT}", add=(tags.SENT,), remove=(tags.INBOX,)),
    # Mail that arrives already in Trash, Junk or Archive (moved there on another device) carries
    # the standard tag for that place and stays out of the inbox.
    *(TagRule(query=f"{{folder:{role}}}", add=(tag,), remove=(tags.INBOX,))
      for role, tag in tags.ROLE_TAGS.items()),
    TagRule(query="NOT (" + " OR ".join(f"tag:{t}" for t in (*tags.NEVER_INBOX,
                                                               *tags.ROLE_TAGS.values())) + ")",
            add=(tags.INBOX,)),
)


# The watcher can lose events (the kernel's inotify queue overflows, a folder it could not
# watch); a full index run this often, when none ran meanwhile, finds what it missed.
DEFAULT_SAFETY_INDEX_MINUTES = 15.0


@dataclass(frozen=True)
class Settings:
    """The contents of fmail.toml, before anything is discovered."""

    path: Path | None = None
    notmuch_config: str | None = None
    notmuch_profile: str | None = None  # [notmuch] profile: $NOTMUCH_PROFILE init ran with
    notmuch_database: str | None = None  # [notmuch] database: $NOTMUCH_DATABASE init ran with
    notmuch_maildir: str | None = None  # [notmuch] maildir: $MAILDIR init ran with
    mbsync_config: str | None = None  # absolute, as _named_path resolves it
    pull_interval_minutes: float = 0.0  # [mbsync] default for accounts that set none
    safety_index_minutes: float = DEFAULT_SAFETY_INDEX_MINUTES  # [index] (0: none)
    data_dir: Path | None = None
    addresses: tuple[str, ...] = ()
    accounts: tuple[dict[str, Any], ...] = ()
    added_accounts: tuple[dict[str, Any], ...] = ()  # accounts.toml: `fmail-nm account add`
    rules: tuple[TagRule, ...] = DEFAULT_RULES
    send: SendSettings = SendSettings()

    def data_dir_or_default(self) -> Path:
        """Where the sidecar and the service's state live: ``data_dir``, else the default."""
        return self.data_dir or default_data_dir()


def users_mbsync_config(settings: Settings) -> Path | None:
    """The user's own mbsync config: fmail.toml's ``[mbsync] config``, else the file mbsync
    itself reads (None: there is none)."""
    return Path(settings.mbsync_config) if settings.mbsync_config else mbsyncrc.default_path()


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / fallback


def default_config_path() -> Path:
    """``$FMAIL_CONFIG``, else ``$XDG_CONFIG_HOME/fmail-nm/fmail.toml``."""
    explicit = os.environ.get("FMAIL_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    return _xdg("XDG_CONFIG_HOME", ".config") / "fmail-nm" / "fmail.toml"


def own_config_dir() -> Path:
    """Where fmail-nm keeps the config files it writes itself: accounts.toml and the mbsync
    and msmtp configs of the accounts it added (``$XDG_CONFIG_HOME/fmail-nm``)."""
    return _xdg("XDG_CONFIG_HOME", ".config") / "fmail-nm"


ADDED_ACCOUNTS_FILE = "accounts.toml"


def load_added_accounts(config_dir: Path | None = None) -> tuple[dict[str, Any], ...]:
    """The [[accounts]] of accounts.toml in ``config_dir`` (default: :func:`own_config_dir`);
    none when there is no such file."""
    path = (config_dir or own_config_dir()) / ADDED_ACCOUNTS_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ()
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return _account_tables(data.get("accounts", []), path)


def default_data_dir() -> Path:
    return _xdg("XDG_DATA_HOME", ".local/share") / "fmail-nm"


def fmail_command(settings: Settings) -> list[str]:
    """The argv that runs fmail-nm from outside (our hooks, MCP client configs): this very
    interpreter, so it works whether or not the virtualenv is on the caller's PATH.  ``-P``:
    ``-m`` would put the caller's working directory first on ``sys.path`` -- a ``notmuch new``
    started in a folder holding an ``email.py`` would run that file instead of the library."""
    argv = [sys.executable, "-P", "-m", "fmail_nm"]
    if settings.path is not None:
        argv += ["--config", str(settings.path.resolve())]
    return argv


def _str_tuple(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{what} must be a string or a list of strings")


# A rule's "in a folder of this role" placeholder; anything else spelled {folder:...} is a typo.
FOLDER_PLACEHOLDER = re.compile(r"\{folder:([a-z]+)\}")
_ANY_FOLDER_PLACEHOLDER = re.compile(r"\{\s*folder\s*:([^}]*)\}", re.IGNORECASE)


def _check_placeholders(query: str, n: int) -> None:
    """A {folder:ROLE} naming no role matched no mail without a word (notmuch takes the
    braces as text): refused when the config is read."""
    for m in _ANY_FOLDER_PLACEHOLDER.finditer(query):
        if not FOLDER_PLACEHOLDER.fullmatch(m[0]) or m[1] not in ROLES:
            raise ConfigError(f"tagging rule #{n}: {m[0]} names no folder role (one of "
                              f"{', '.join(ROLES)}, as {{folder:trash}})")


def _parse_rules(raw: Any) -> tuple[TagRule, ...]:
    if raw is None:
        return DEFAULT_RULES
    if not isinstance(raw, list):
        raise ConfigError("[[tagging.rules]] must be a list of tables")
    rules = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("query"), str):
            raise ConfigError(f"tagging rule #{i + 1} needs a query string")
        _known_keys(item, _RULE_KEYS, f"tagging rule #{i + 1}")
        _check_placeholders(item["query"], i + 1)
        rules.append(
            TagRule(
                query=item["query"],
                add=_str_tuple(item.get("add"), f"tagging rule #{i + 1} add"),
                remove=_str_tuple(item.get("remove"), f"tagging rule #{i + 1} remove"),
            )
        )
    return tuple(rules)


def _minutes(value: Any, where: str, key: str = "pull_interval_minutes",
             zero: str = "no scheduled pull") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{where}: {key} must be a number of minutes >= 0 (0: {zero})")
    return float(value)


def _flag(value: Any, where: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false")
    return value


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{where} must be a number > 0")
    return float(value)


def _parse_send(raw: Any) -> SendSettings:
    if raw is None:
        return SendSettings()
    if not isinstance(raw, dict):
        raise ConfigError("[send] must be a table")
    _known_keys(raw, _SEND_KEYS, "[send]")
    limit = raw.get("max_per_hour", DEFAULT_MAX_SENDS_PER_HOUR)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigError("[send] max_per_hour must be a whole number >= 0 (0: no sends)")
    folder = raw.get("attachments_dir")
    if folder is not None and not isinstance(folder, str):
        raise ConfigError("[send] attachments_dir must be a folder path")
    return SendSettings(
        enabled=_flag(raw.get("enabled", False), "[send]", "enabled"),
        direct=_flag(raw.get("direct", False), "[send]", "direct"),
        command=_str_tuple(raw.get("command"), "[send] command") or SendSettings.command,
        max_per_hour=limit,
        max_message_mb=_positive(raw.get("max_message_mb", DEFAULT_MAX_MESSAGE_MB),
                                 "[send] max_message_mb"),
        attachments_dir=Path(folder).expanduser() if folder else None,
        timeout_seconds=_positive(raw.get("timeout_seconds", DEFAULT_SEND_TIMEOUT),
                                  "[send] timeout_seconds"),
    )


def _text(value: Any, config_path: Path, what: str) -> str | None:
    """A path or name fmail.toml gives as is (None when left out)."""
    if value is None or isinstance(value, str):
        return value
    raise ConfigError(f"{config_path}: {what} must be a string, not {value!r}")


def _named_path(value: Any, config_path: Path, what: str) -> str | None:
    """A file named in fmail.toml or accounts.toml (the notmuch config, an mbsync config, the
    data directory), as an absolute path, resolved once here: ``~`` expanded (notmuch, the
    bindings and ``mbsync -c`` take the name literally), a relative name taken from that
    file's folder -- not from the working directory, which is wherever notmuch new runs our
    hook or the service was started.  The real file's folder: our hook names fmail.toml
    resolved (:func:`fmail_command`), the server maybe by a link to it."""
    name = _text(value, config_path, what)
    if not name:  # left out or empty: none named (found the way the tool finds it)
        return None
    return str((config_path.resolve().parent / Path(name).expanduser()).absolute())


def _account_tables(value: Any, config_path: Path) -> tuple[dict[str, Any], ...]:
    """The ``[[accounts]]`` tables of fmail.toml or accounts.toml, each one's own
    ``mbsync_config`` resolved as :func:`_named_path` resolves a file fmail.toml names:
    against the folder of the file it is written in, not wherever fmail-nm runs."""
    if not isinstance(value, list) or not all(isinstance(a, dict) for a in value):
        raise ConfigError(f"{config_path}: [[accounts]] must be a list of tables")
    for table in value:
        where = f"{config_path}: account {table.get('name')!r}"
        _known_keys(table, _ACCOUNT_KEYS, where)
        if isinstance(table.get("send"), dict):
            _known_keys(table["send"], _ACCOUNT_SEND_KEYS, f"{where} send")
    return tuple(_with_mbsync_config_resolved(table, config_path) for table in value)


def _with_mbsync_config_resolved(table: dict[str, Any], config_path: Path) -> dict[str, Any]:
    if "mbsync_config" not in table:
        return table
    what = f"account {table.get('name')!r} mbsync_config"
    return {**table, "mbsync_config": _named_path(table["mbsync_config"], config_path, what)}


_TOP_KEYS = ("data_dir", "addresses", "accounts", "notmuch", "mbsync", "index", "tagging",
             "send")
_TABLE_KEYS = {"notmuch": ("config", "profile", "database", "maildir"),
               "mbsync": ("config", "pull_interval_minutes"),
               "index": ("safety_interval_minutes",), "tagging": ("rules",)}
_ACCOUNT_KEYS = ("name", "addresses", "maildir", "folders", "mbsync_channel", "mbsync_config",
                 "send", "pull_interval_minutes", "blocked_to_junk", "server_saves_sent")
_ACCOUNT_SEND_KEYS = ("command", "server_stores_sent", "smtp_host", "smtp_port", "smtp_user",
                      "smtp_starttls")
_RULE_KEYS = ("query", "add", "remove")
_SEND_KEYS = ("enabled", "direct", "command", "max_per_hour", "max_message_mb",
              "attachments_dir", "timeout_seconds")


def _known_keys(table: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    """A misspelt key (data-dir, pull_interval) did nothing without a word: named instead."""
    if unknown := sorted(set(table) - set(known)):
        raise ConfigError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)} (known: {', '.join(sorted(known))})")


def _table(data: dict[str, Any], key: str, config_path: Path) -> dict[str, Any]:
    """The ``[key]`` table of fmail.toml ({} when left out).  ``key = "..."`` in its place is
    an easy slip in TOML; it must be named, not fail later as a Python AttributeError."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{config_path}: {key} must be a table -- a line [{key}] with its "
                          f"settings below it -- not {key} = {value!r}")
    _known_keys(value, _TABLE_KEYS[key], f"{config_path}: [{key}]")
    return value


def _use_profile(value: Any, config_path: Path) -> str | None:
    """Put fmail.toml's notmuch profile into the environment: libnotmuch and the notmuch
    program take it only from $NOTMUCH_PROFILE, and it picks the hook folder (and, unset
    in the config, the database) -- a service started without it would run notmuch new
    without the user's hooks."""
    return _export("NOTMUCH_PROFILE", _text(value, config_path, "[notmuch] profile"))


# The variables besides NOTMUCH_CONFIG and NOTMUCH_PROFILE by which libnotmuch and the notmuch
# program find the database (notmuch-config(1), "DATABASE LOCATION"), as fmail.toml names them.
NOTMUCH_LOCATION_VARIABLES = {"database": "NOTMUCH_DATABASE", "maildir": "MAILDIR"}


def _use_location(notmuch: dict[str, Any], key: str, config_path: Path) -> str | None:
    """Put fmail.toml's ``[notmuch] database`` (as $NOTMUCH_DATABASE: the database, before
    database.path) or ``maildir`` (as $MAILDIR: the database when the config and the XDG
    data folder name none) into the environment, which is the only place notmuch reads them
    from: a service started without them would open another database, or none."""
    path = _named_path(notmuch.get(key), config_path, f"[notmuch] {key}")
    return _export(NOTMUCH_LOCATION_VARIABLES[key], path)


def _export(variable: str, value: str | None) -> str | None:
    """``value`` set as the environment variable ``variable`` (for this process, libnotmuch
    in it and every notmuch it starts); nothing for none."""
    if value:
        os.environ[variable] = value
    return value or None


def load_settings(path: Path | str | None = None) -> Settings:
    """Read fmail.toml. A missing file at the default place means defaults; a missing file that
    was asked for by name (``--config`` or ``$FMAIL_CONFIG``) is an error."""
    explicit = path is not None or bool(os.environ.get("FMAIL_CONFIG"))
    config_path = Path(path).expanduser() if path is not None else default_config_path()
    if not config_path.is_file():
        if explicit:
            raise ConfigError(f"config file not found: {config_path}; run `fmail-nm init` to "
                              "create it")
        return Settings(added_accounts=load_added_accounts())
    try:
        data = tomllib.loads(config_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{config_path}: {exc}") from None
    _known_keys(data, _TOP_KEYS, str(config_path))
    notmuch = _table(data, "notmuch", config_path)
    mbsync = _table(data, "mbsync", config_path)
    index = _table(data, "index", config_path)
    tagging = _table(data, "tagging", config_path)
    data_dir = _named_path(data.get("data_dir"), config_path, "data_dir")
    return Settings(
        path=config_path,
        notmuch_config=_named_path(notmuch.get("config"), config_path, "[notmuch] config"),
        notmuch_profile=_use_profile(notmuch.get("profile"), config_path),
        notmuch_database=_use_location(notmuch, "database", config_path),
        notmuch_maildir=_use_location(notmuch, "maildir", config_path),
        mbsync_config=_named_path(mbsync.get("config"), config_path, "[mbsync] config"),
        pull_interval_minutes=_minutes(mbsync.get("pull_interval_minutes", 0), "[mbsync]"),
        safety_index_minutes=_minutes(
            index.get("safety_interval_minutes", DEFAULT_SAFETY_INDEX_MINUTES), "[index]",
            "safety_interval_minutes", "no safety index"),
        data_dir=Path(data_dir) if data_dir else None,
        addresses=_str_tuple(data.get("addresses"), "addresses"),
        accounts=_account_tables(data.get("accounts", []), config_path),
        added_accounts=load_added_accounts(),
        rules=_parse_rules(tagging.get("rules")),
        send=_parse_send(data.get("send")),
    )


# ---------------------------------------------------------------------------------------------
# Folders on disk


def each_directory_once(root: str | Path) -> Iterator[tuple[str, list[str]]]:
    """``os.walk`` of ``root`` following symlinked folders, as notmuch new follows them (mail
    kept on another disk), each directory once (a link back into the tree is not walked
    again) and unreadable ones left out.  The caller may prune the names it is given, as
    with ``os.walk``."""
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, _ in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        yield dirpath, dirnames


def maildir_folders(mail_root: Path) -> list[str]:
    """Every Maildir folder under the mail root, relative to it, sorted ("." for the root)."""
    found: list[str] = []
    for dirpath, dirnames in each_directory_once(mail_root):
        here = Path(dirpath)
        # .notmuch holds the database; tmp/new/cur are the Maildir's own, never folders.
        dirnames[:] = sorted(d for d in dirnames if d not in (".notmuch", "tmp", "new", "cur"))
        if (here / "cur").is_dir() or (here / "new").is_dir():
            found.append(here.relative_to(mail_root).as_posix())
    return sorted(found)


def mailbox_name(rest: str, layout: FolderLayout) -> str:
    """The mailbox name ("/" between levels, modified UTF-7 decoded) of a folder spelled
    ``rest`` on disk below its store's root, as mbsync lays it out: Maildir++ writes
    "INBOX/Sub" as "..Sub" and "[Gmail]/Sent Mail" as ".[Gmail].Sent Mail", Legacy as
    "[Gmail]/.Sent Mail", ``Flatten .`` as "[Gmail].Sent Mail".  The store's root is the
    INBOX of a Maildir++ store (its only folder without a leading dot)."""
    if layout.subfolders == "maildir++":
        if not rest:
            return "INBOX"
        parts = rest.removeprefix(".").split(".")
        if parts and not parts[0]:  # "..Sub": below INBOX, whose own name is ""
            parts[0] = "INBOX"
    else:
        parts = rest.split("/")
        if layout.subfolders == "legacy":
            parts = parts[:1] + [p.removeprefix(".") for p in parts[1:]]
        if layout.flatten:
            parts = [level for p in parts for level in p.split(layout.flatten)]
    return imap_utf7_decode("/".join(parts))


def _leaf_name(name: str) -> str:
    return name.rsplit("/", 1)[-1].lstrip(".").lower()


_UTF7_RUN = re.compile(r"&([A-Za-z0-9+,]*)-")


def imap_utf7_decode(name: str) -> str:
    """An IMAP mailbox name as mbsync writes it to disk (modified UTF-7, RFC 3501 5.1.3:
    "Entw&APw-rfe") in Unicode ("Entwürfe"); a malformed run stays as written."""
    def run(match: re.Match[str]) -> str:
        if not match[1]:
            return "&"
        data = match[1].replace(",", "/")
        try:
            return base64.b64decode(data + "=" * (-len(data) % 4)).decode("utf-16-be")
        except (ValueError, UnicodeDecodeError):
            return match[0]
    return _UTF7_RUN.sub(run, name) if "&" in name else name


def detect_roles(folders: list[str], account_dir: str,
                 layout: FolderLayout = FolderLayout()) -> dict[str, str]:
    """Guess folder roles from the usual names: Gmail's own folders first, then the folders
    directly in the account, then those under its INBOX (servers that keep every folder
    there: INBOX.Sent).  Names are the server's (see mailbox_name), so Gmail's folders are
    found whichever way mbsync lays them out on disk."""
    roles: dict[str, str] = {}
    prefix = "" if account_dir == "." else account_dir + "/"
    ranked: list[tuple[int, str, str]] = []
    for folder in folders:
        if folder == account_dir:
            rest = ""  # the store's root: INBOX itself in Maildir++, else no mailbox
        elif prefix and not folder.startswith(prefix):
            continue
        else:
            rest = folder[len(prefix):].strip("/")
        name = mailbox_name(rest, layout)
        if not name:
            continue
        lower = name.lower()
        if lower.startswith(_SYSTEM_PREFIXES):
            ranked.append((0, folder, name))
        elif "/" not in rest:
            ranked.append((1, folder, name))
        elif lower.startswith("inbox/") and name.count("/") == 1:
            ranked.append((2, folder, name))
    for _, folder, name in sorted(ranked, key=lambda item: item[0]):  # stable: sorted names within
        leaf = _leaf_name(name)
        for role, names in _ROLE_NAMES.items():
            if leaf in names and role not in roles:
                roles[role] = folder
    return roles


# ---------------------------------------------------------------------------------------------
# Resolved configuration


@dataclass(frozen=True)
class Config:
    settings: Settings
    mail_root: Path
    accounts: tuple[Account, ...]
    folders: tuple[str, ...]

    @property
    def rules(self) -> tuple[TagRule, ...]:
        return self.settings.rules

    @property
    def send(self) -> SendSettings:
        return self.settings.send

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir_or_default()

    @property
    def addresses(self) -> tuple[str, ...]:
        """All of the user's addresses, lower-cased, each once, in configuration order."""
        seen: dict[str, None] = {}
        for address in self.settings.addresses:
            seen.setdefault(address.lower(), None)
        for account in self.accounts:
            for address in account.addresses:
                seen.setdefault(address.lower(), None)
        return tuple(seen)

    def account(self, name: str) -> Account:
        for account in self.accounts:
            if account.name == name:
                return account
        known = ", ".join(a.name for a in self.accounts) or "none"
        raise ConfigError(f"unknown account {name!r} (known: {known})")

    def account_for_path(self, relative_folder: str) -> Account | None:
        """The account whose folder holds a folder (relative to the mail root), longest first."""
        best: Account | None = None
        best_length = -1
        for account in self.accounts:
            holder = account.holder(relative_folder)
            if holder is None:
                continue
            length = 0 if holder == ROOT_FOLDER else len(holder)
            if length > best_length or best_length == 0:
                best, best_length = account, length
        return best

    def account_name_for_path(self, relative_folder: str) -> str | None:
        """The name of :meth:`account_for_path`'s account, None for none."""
        owner = self.account_for_path(relative_folder)
        return owner.name if owner is not None else None

    @functools.cached_property
    def mailbox_names(self) -> Mapping[str, str]:
        """Folder (relative to the mail root) -> the server's name for it in its account
        (Account.mailbox), for every folder some account holds.  Worked out once: every
        search's DSL context reads it."""
        names: dict[str, str] = {}
        for folder in self.folders:
            owner = self.account_for_path(folder)
            name = owner.mailbox(folder) if owner is not None else None
            if name is not None:
                names[folder] = name
        return names

    def roles(self) -> dict[str, list[str]]:
        """Role -> folders of that role across all accounts."""
        out: dict[str, list[str]] = {role: [] for role in ROLES}
        for account in self.accounts:
            for role, folder in account.folders.items():
                out.setdefault(role, []).append(folder)
        return out


def relative_to_root(path: Path, mail_root: Path) -> str | None:
    """``path`` relative to the mail root (or another root) as written -- a symlinked
    folder under the root is where notmuch sees it --, else as the links resolve; None when
    it is outside."""
    for a, b in ((Path(os.path.normpath(path.absolute())),
                  Path(os.path.normpath(mail_root.absolute()))),
                 (path.resolve(), mail_root.resolve())):
        try:
            return a.relative_to(b).as_posix() or "."
        except ValueError:
            continue
    return None


def _send_method(raw: Any, name: str) -> SendMethod | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"account {name!r}: send must be a table")
    return SendMethod(
        command=_str_tuple(raw.get("command"), f"account {name!r} send.command"),
        smtp_host=raw.get("smtp_host"),
        smtp_port=int(raw.get("smtp_port", 587)),
        smtp_user=raw.get("smtp_user"),
        smtp_starttls=bool(raw.get("smtp_starttls", True)),
        server_stores_sent=_flag(raw.get("server_stores_sent", False), f"account {name!r}",
                                 "send.server_stores_sent"),
    )


def _configured_accounts(settings: Settings, mail_root: Path, folders: list[str],
                         default_addresses: tuple[str, ...],
                         entries: tuple[dict[str, Any], ...]) -> list[Account]:
    accounts = []
    # Accounts usually share one mbsyncrc: read it once for all of them, not once each.
    parsed: dict[Path, mbsyncrc.MbsyncConfig | None] = {}
    for raw in entries:
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError("every [[accounts]] entry needs a name")
        maildir = str(raw.get("maildir", name)).strip("/") or "."
        if not (mail_root / maildir).is_dir():
            raise ConfigError(f"account {name!r}: folder {maildir!r} not found under {mail_root}")
        layout = _channel_layout(raw.get("mbsync_channel"),
                                 raw.get("mbsync_config") or users_mbsync_config(settings),
                                 parsed) or _disk_layout(folders, maildir)
        roles = detect_roles(folders, maildir, layout)
        explicit = raw.get("folders", {})
        if not isinstance(explicit, dict):
            raise ConfigError(f"account {name!r}: folders must be a table of role = folder")
        for role, folder in explicit.items():
            if role not in ROLES:
                raise ConfigError(f"account {name!r}: unknown folder role {role!r} (roles: {', '.join(ROLES)})")
            if not isinstance(folder, str) or not folder:
                raise ConfigError(f"account {name!r}: folder for {role} must be a folder name "
                                  f'in quotes (e.g. {role} = "INBOX"), not {folder!r}')
            # "." is the account's own folder (a Maildir++ store's INBOX), not "<maildir>/.".
            roles[role] = folder if maildir == "." else (
                maildir if folder.strip("/") == "." else f"{maildir}/{folder}")
        accounts.append(Account(
            name=name,
            addresses=_str_tuple(raw.get("addresses"), f"account {name!r} addresses") or default_addresses,
            maildir=maildir,
            folders=roles,
            mbsync_channel=raw.get("mbsync_channel"),
            mbsync_config=raw.get("mbsync_config"),
            send=_send_method(raw.get("send"), name),
            pull_interval_minutes=_minutes(
                raw.get("pull_interval_minutes", settings.pull_interval_minutes),
                f"account {name!r}"),
            blocked_to_junk=_flag(raw.get("blocked_to_junk", False), f"account {name!r}",
                                  "blocked_to_junk"),
            server_saves_sent=_flag(raw.get("server_saves_sent", False), f"account {name!r}",
                                    "server_saves_sent"),
            layout=layout,
        ))
    return accounts


def _store_layout(store: mbsyncrc.MaildirStore) -> FolderLayout:
    return FolderLayout((store.subfolders or "").lower() or None, store.flatten)


def _channel_layout(channel: object, rc_path: object,
                    parsed: dict[Path, mbsyncrc.MbsyncConfig | None]) -> FolderLayout | None:
    """The layout of the store an account's mbsync channel (or Group) syncs into, so that
    an account written out in fmail.toml knows its folders' server names too; None when
    there is no such channel.  ``parsed`` keeps each file read during this load.
    (fmail.toml's values are not checked here.)"""
    if not isinstance(channel, str) or not isinstance(rc_path, str | Path):
        return None
    path = Path(rc_path)
    if path not in parsed:
        try:
            parsed[path] = mbsyncrc.parse(path) if path.is_file() else None
        except OSError:
            parsed[path] = None
    rc = parsed[path]
    if rc is None:
        return None
    for name in (channel, *rc.groups.get(channel, ())):
        store = rc.channel_store(rc.channels[name]) if name in rc.channels else None
        if store is not None:
            return _store_layout(store)
    return None


def _disk_layout(folders: Sequence[str], account_dir: str) -> FolderLayout:
    """The layout of a store no mbsync channel describes, read from the disk: Maildir++ (as
    Dovecot, Courier and the tools delivering for them lay mail out: the store's root is
    INBOX, every other folder a dot-named directory in it, ".Sent", ".Lists.Linux") when the
    account's folder is a Maildir with subfolders, all of them dot-named at its top level;
    Verbatim otherwise."""
    prefix = "" if account_dir == "." else account_dir + "/"
    below = [f[len(prefix):] for f in folders if f != account_dir and f.startswith(prefix)]
    if (account_dir in folders and below
            and all(f.startswith(".") and "/" not in f for f in below)):
        return FolderLayout("maildir++")
    return FolderLayout()


def _mbsync_accounts(rc: mbsyncrc.MbsyncConfig, mail_root: Path, folders: list[str],
                     addresses: tuple[str, ...], pull_interval: float = 0.0) -> list[Account]:
    """One account per channel -- or per Group whose channels all sync into one store (one
    channel per folder, the usual Gmail recipe): one account over that Maildir, synced by
    the Group's name."""
    accounts = []
    grouped = _store_groups(rc)
    done: set[str] = set()
    for channel in rc.channels.values():
        if channel.name in done:
            continue
        group = grouped.get(channel.name)
        if group is not None:
            done.update(rc.groups[group])
        store = rc.channel_store(channel)
        if store is None:
            continue
        # A Maildir++ store has no Path (mbsync refuses one): its Inbox is its root.
        maildir_plus = store.path is None and (store.subfolders or "").lower() == "maildir++"
        root = store.inbox if maildir_plus else store.path
        if root is None:
            continue
        maildir = relative_to_root(root, mail_root)
        if maildir is None:
            continue
        layout = _store_layout(store)
        roles = detect_roles(folders, maildir, layout)
        if store.inbox is not None:
            inbox = relative_to_root(store.inbox, mail_root)
            if inbox is not None:
                roles["inbox"] = inbox
        name = group or channel.name
        login = rc.channel_imap_account(channel)
        accounts.append(Account(name=name, addresses=_login_first(addresses, login),
                                maildir=maildir,
                                folders=roles, mbsync_channel=name,
                                pull_interval_minutes=pull_interval, layout=layout))
    return accounts


def _login_first(addresses: tuple[str, ...],
                 login: mbsyncrc.ImapAccount | None) -> tuple[str, ...]:
    """The user's addresses with the one the account logs in as first: the address its mail
    is written from (each channel's account lists all of them, none being tied to it)."""
    user = (login.user or "").lower() if login is not None else ""
    return (*(a for a in addresses if a.lower() == user),
            *(a for a in addresses if a.lower() != user))


def _store_groups(rc: mbsyncrc.MbsyncConfig) -> dict[str, str]:
    """channel -> the Group that holds it with the other channels of its store: a Group of
    two or more defined channels that all sync into one store and are that store's only
    channels."""
    by_store: dict[str, set[str]] = {}
    for channel in rc.channels.values():
        store = rc.channel_store(channel)
        if store is not None:
            by_store.setdefault(store.name, set()).add(channel.name)
    found: dict[str, str] = {}
    for group, members in rc.groups.items():
        stores = {store.name for m in members if m in rc.channels
                  and (store := rc.channel_store(rc.channels[m])) is not None}
        if (len(members) > 1 and len(stores) == 1 and all(m in rc.channels for m in members)
                and by_store[next(iter(stores))] == set(members)):
            found.update(dict.fromkeys(members, group))
    return found


def _disk_accounts(mail_root: Path, folders: list[str], addresses: tuple[str, ...]) -> list[Account]:
    """One account per top-level directory holding Maildir folders; the root itself if it is one."""
    tops = sorted({f.split("/", 1)[0] for f in folders if f != "."})
    if "." in folders or not tops or any(
            (mail_root / top / "cur").is_dir() and top.lower() != "inbox" for top in tops):
        # A top-level folder that is itself a Maildir (e.g. "Sent") means a single account.
        tops = ["."]
    accounts = []
    for top in tops:
        layout = _disk_layout(folders, top)
        accounts.append(Account(name="mail" if top == "." else top, addresses=addresses,
                                maildir=top, folders=detect_roles(folders, top, layout),
                                layout=layout))
    return accounts


def resolve(settings: Settings, mail_root: Path, notmuch_addresses: tuple[str, ...] = ()) -> Config:
    """Combine fmail.toml with what is discovered: explicit accounts win, then mbsync's, then disk."""
    mail_root = Path(mail_root)
    if not mail_root.is_dir():
        raise ConfigError(f"mail root {mail_root} does not exist")
    folders = maildir_folders(mail_root)
    addresses = settings.addresses or notmuch_addresses
    added = _configured_accounts(settings, mail_root, folders, addresses, settings.added_accounts)
    if settings.accounts:
        accounts = _configured_accounts(settings, mail_root, folders, addresses,
                                        settings.accounts)
    else:
        rc_path = users_mbsync_config(settings)
        accounts = []
        if rc_path is not None and rc_path.is_file():
            accounts = _mbsync_accounts(mbsyncrc.parse(rc_path), mail_root, folders, addresses,
                                        settings.pull_interval_minutes)
        # The folders of added accounts are theirs, not accounts found on disk.
        remaining = [f for f in folders if not any(
            f == a.maildir or f.startswith(a.maildir + "/") for a in added)]
        if not accounts and (remaining or not added):
            accounts = _disk_accounts(mail_root, remaining, addresses)
    clash = {a.name for a in accounts} & {a.name for a in added}
    if clash:
        raise ConfigError(f"account {sorted(clash)[0]!r} is both in "
                          f"{own_config_dir() / ADDED_ACCOUNTS_FILE} and your own setup; "
                          f"`fmail-nm account remove --name {sorted(clash)[0]}` drops the "
                          "added one")
    accounts = [*accounts, *added]
    # notmuch's addresses are the user's even when each account lists its own: an alias in
    # user.other_email that no account names is still mail from and to the user.
    settings = dataclasses.replace(settings, addresses=addresses)
    return Config(settings=settings, mail_root=mail_root, accounts=tuple(accounts),
                  folders=tuple(folders))


def allow_sending(config: Config) -> Config:
    """The configuration with ``[send] enabled = true`` (``serve --allow-send``)."""
    send = dataclasses.replace(config.settings.send, enabled=True)
    return dataclasses.replace(config, settings=dataclasses.replace(config.settings, send=send))


# The tool profiles a server offers (``fmail-nm serve --tools``), each holding the ones before
# it.  Every tool offered costs the model's context on every turn, so the default is the set
# used day to day; ``all`` adds the rest (mcp.registry registers by profile).
TOOL_PROFILES = ("read", "triage", "all")
DEFAULT_TOOL_PROFILE = "triage"
