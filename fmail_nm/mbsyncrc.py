"""Read the parts of an mbsync (isync) configuration fmail-nm relies on.

The local side says where mail lives on disk: each ``MaildirStore`` gives a ``Path``, an
``Inbox`` and the way sub-folders are named on disk (``SubFolders``, ``Flatten``); each
``Channel`` names the store it syncs into, which is how an account is tied to the channel that
pushes its changes, and whether deletions reach the server (``Expunge``).  Of the far side only
each ``IMAPAccount``'s ``User`` and ``Host`` are kept -- a login that looks like an address is
one of the user's (:mod:`fmail_nm.adopt.identity`) -- and its ``AuthMechs`` (XOAUTH2 needs a
SASL plugin that doctor looks for).  Passwords and ``PassCmd`` are never read.

Which file mbsync reads when it is not given one depends on its version
(:func:`default_path`): fmail-nm always gives it the one it parsed (``mbsync -c``).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class MaildirStore:
    name: str
    path: Path | None
    inbox: Path | None
    subfolders: str | None  # Verbatim, Maildir++ or Legacy; None means mbsync's default
    flatten: str | None


@dataclass(frozen=True)
class Channel:
    name: str
    near_store: str | None
    far_store: str | None
    patterns: tuple[str, ...] = ()
    expunge: str | None = None  # None, Far, Near or Both; unset means mbsync's default (None)


@dataclass(frozen=True)
class ImapAccount:
    name: str
    host: str | None
    user: str | None
    auth_mechs: tuple[str, ...] = ()  # upper case; () means mbsync's default (*)


@dataclass(frozen=True)
class MbsyncConfig:
    path: Path
    stores: dict[str, MaildirStore] = field(default_factory=dict)
    channels: dict[str, Channel] = field(default_factory=dict)
    imap_accounts: dict[str, ImapAccount] = field(default_factory=dict)
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> its channels
    store_accounts: dict[str, str] = field(default_factory=dict)  # IMAPStore -> its Account

    def channel_store(self, channel: Channel) -> MaildirStore | None:
        """The local Maildir store a channel syncs into, whichever side it is on."""
        for side in (channel.near_store, channel.far_store):
            if side and side in self.stores:
                return self.stores[side]
        return None

    def group_channels(self, group: str) -> list[Channel]:
        """The channels of a Group that this file defines (a member ``channel:box`` syncs
        only those boxes of its channel)."""
        names = (member.partition(":")[0] for member in self.groups.get(group, ()))
        return [self.channels[name] for name in names if name in self.channels]

    def channel_imap_account(self, channel: Channel) -> ImapAccount | None:
        """The IMAP account a channel logs in with: its IMAPStore's ``Account``, or the
        store itself when it holds the account's options."""
        for side in (channel.far_store, channel.near_store):
            name = self.store_accounts.get(side or "", side)
            if name and name in self.imap_accounts:
                return self.imap_accounts[name]
        return None


def default_path() -> Path | None:
    """The file mbsync itself reads when not given one: ``~/.mbsyncrc`` or
    ``$XDG_CONFIG_HOME/isyncrc``, whichever is there.  When both are, the installed mbsync's
    choice: isync 1.5 reads isyncrc first, 1.4 knows only ``~/.mbsyncrc``."""
    legacy = Path.home() / ".mbsyncrc"
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "isyncrc"
    present = [candidate for candidate in (legacy, xdg) if candidate.is_file()]
    if len(present) == 2:
        return xdg if reads_isyncrc_first(installed_version()) else legacy
    return present[0] if present else None


def reads_isyncrc_first(version: tuple[int, int] | None) -> bool:
    """Whether this mbsync version prefers ``$XDG_CONFIG_HOME/isyncrc`` to ``~/.mbsyncrc``
    (isync 1.5 and later).  An unknown version is taken for 1.4, which reads only the
    latter."""
    return version is not None and version >= (1, 5)


VERSION_TIMEOUT = 10.0


@functools.cache
def installed_version() -> tuple[int, int] | None:
    """(major, minor) of the mbsync on ``$PATH``, asked once (``mbsync --version`` prints
    ``isync 1.4.4``); None when there is none or it does not say."""
    program = shutil.which("mbsync")
    if program is None:
        return None
    try:
        done = subprocess.run([program, "--version"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace",
                              timeout=VERSION_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_version(done.stdout)


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from ``mbsync --version``'s output, or None."""
    found = re.search(r"(\d+)\.(\d+)", text)
    return (int(found[1]), int(found[2])) if found else None


def _expand(value: str, base: Path) -> Path:
    # mbsync expands a leading "~" and resolves relative paths against the config's directory.
    p = Path(os.path.expanduser(value))
    return p if p.is_absolute() else base / p


def _store_ref(value: str) -> str:
    # "Far :store-name:optional/box" -> "store-name"
    parts = value.split(":")
    return parts[1] if len(parts) >= 3 else value


# Keywords that open a section; anything else before the first one (or after a blank line
# ends a section) is a global option, e.g. a default ``Expunge`` for every channel.
_SECTION_KINDS = frozenset({"imapaccount", "imapstore", "maildirstore", "channel", "group"})


def _without_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a word outside quotes: mbsync ends the line there."""
    quoted = escaped = False
    for i, c in enumerate(line):
        if escaped:
            escaped = False
        elif quoted and c == "\\":
            escaped = True
        elif c == '"':
            quoted = not quoted
        elif c == "#" and not quoted and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def _sections(text: str) -> tuple[list[tuple[str, str]], list[list[tuple[str, str]]]]:
    """(global options, sections) of ``Keyword value`` lines (keyword and value apart by
    spaces or tabs, comments dropped): a section opens at a section keyword and ends at a
    blank line or the next section keyword -- but in a ``Group``, ``Channel`` names a
    member."""
    options: list[tuple[str, str]] = []
    sections: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        if not raw.strip():
            current = None
            continue
        line = _without_comment(raw.strip())
        if not line:
            continue
        key, value = (line.split(None, 1) + [""])[:2]
        key, value = key.lower(), value.strip()
        in_group = current is not None and current[0][0] == "group"
        if key in _SECTION_KINDS and not (in_group and key == "channel"):  # a group's member
            current = [(key, value)]
            sections.append(current)
        elif current is not None:
            current.append((key, value))
        else:
            options.append((key, value))
    return options, sections


def _words(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError:
        return value.split()


def _unquote(value: str) -> str:
    try:
        parts = shlex.split(value)
    except ValueError:
        return value
    return " ".join(parts) if parts else ""


def parse(path: Path) -> MbsyncConfig:
    """Parse an mbsync configuration file; unknown keys and store types are ignored."""
    text = path.read_text(encoding="utf-8", errors="replace")
    base = path.parent
    config = MbsyncConfig(path=path)
    options, sections = _sections(text)
    defaults = dict(options)  # mbsync's global channel options, e.g. Expunge
    for section in sections:
        kind, name = section[0]
        values = {key: value for key, value in section[1:]}
        if kind == "group":  # "Group name [channel ...]", then "Channel(s) name ..." lines
            words = _words(name)
            if words:
                config.groups[words[0]] = tuple(words[1:]) + tuple(
                    member for key, value in section[1:] if key in ("channel", "channels")
                    for member in _words(value))
            continue
        name = _unquote(name)  # mbsync takes the name quoted, too: IMAPAccount "work"
        if kind == "maildirstore":
            config.stores[name] = MaildirStore(
                name=name,
                path=_expand(_unquote(values["path"]), base) if "path" in values else None,
                inbox=_expand(_unquote(values["inbox"]), base) if "inbox" in values else None,
                subfolders=values.get("subfolders"),
                flatten=_unquote(values["flatten"]) if "flatten" in values else None,
            )
        if kind == "imapstore" and "account" in values:
            config.store_accounts[name] = _unquote(values["account"])
        if kind == "imapaccount" or (kind == "imapstore" and "account" not in values):
            # (an IMAPStore without Account holds the account's options itself -- its login
            # given by User, or by UserCmd, or asked for)
            config.imap_accounts[name] = ImapAccount(
                name=name, host=_unquote(values["host"]) if "host" in values else None,
                user=_unquote(values["user"]) if "user" in values else None,
                # (mbsync takes the old singular spelling too)
                auth_mechs=tuple(m.upper() for m in _words(
                    values.get("authmechs", values.get("authmech", "")))))
        elif kind == "channel":
            near = values.get("near") or values.get("slave")
            far = values.get("far") or values.get("master")
            patterns = tuple(
                shlex.split(values.get("patterns", ""))
                if "patterns" in values
                else ()
            )
            config.channels[name] = Channel(
                name=name,
                near_store=_store_ref(near) if near else None,
                far_store=_store_ref(far) if far else None,
                patterns=patterns,
                expunge=values.get("expunge", defaults.get("expunge")),
            )
    return config
