"""Who the user is: their name and addresses, found in the setup they already have.

Sources, in order (an address is reported once, with the first source that gave it):

1. notmuch's ``user.name``, ``user.primary_email`` and ``user.other_email``;
2. the mbsync config: the ``User`` of each ``IMAPAccount`` that looks like an address;
3. the msmtp config: each account's ``from``;
4. the From addresses of the Sent folders, read from the notmuch index (never the files):
   an address counts when it wrote a fair share of a Sent folder, so a stray message filed
   there does not make a stranger one of the user's addresses.

Nothing here writes anything; :mod:`fmail_nm.adopt.initialize` decides what to do with it.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from email.utils import parseaddr
from pathlib import Path

from .. import mbsyncrc, msmtprc
from ..config import Config
from ..store.notmuch import Reader
from ..store.query import folders_query

# An address with a dotted domain: an IMAP login like "alex" or "alex@localhost" is not one.
_ADDRESS = re.compile(r"^[^\s@\"<>()\\,;:*]+@[^\s@\"<>()\\,;:*]+\.[A-Za-z0-9-]{2,}$")
SENT_SAMPLE = 2000  # newest messages per Sent folder: enough to see who writes there
SENT_SHARE = 0.05  # an address must have written this share of a Sent folder
MAX_SENT_ADDRESSES = 10


def looks_like_address(value: str | None) -> bool:
    return bool(value) and _ADDRESS.match(value or "") is not None


@dataclass(frozen=True)
class Found:
    address: str  # lower-cased
    source: str  # where it was found, for people: "msmtp config ~/.msmtprc (account work)"


@dataclass
class Identity:
    name: str = ""
    name_source: str = ""
    found: list[Found] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return [f.address for f in self.found]

    def add(self, address: str, source: str) -> None:
        address = address.strip().lower()
        if looks_like_address(address) and address not in self.addresses:
            self.found.append(Found(address, source))

    def describe(self) -> list[str]:
        """One line per finding, for ``init`` and ``doctor``."""
        lines = [f"name {self.name!r} (from {self.name_source})"] if self.name else []
        return lines + [f"address {f.address} (from {f.source})" for f in self.found]


def _home(path: Path) -> str:
    try:
        return "~/" + path.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(path)


def from_notmuch(identity: Identity, nm: dict[str, str]) -> None:
    addresses = [nm.get("user.primary_email", ""),
                 *nm.get("user.other_email", "").split(";")]
    for address in addresses:
        identity.add(address, "notmuch config")
    if nm.get("user.name") and not identity.name:
        identity.name, identity.name_source = nm["user.name"], "notmuch config"


def from_mbsync(identity: Identity, path: Path | None) -> None:
    if path is None or not path.is_file():
        return
    for account in mbsyncrc.parse(path).imap_accounts.values():
        if account.user:
            identity.add(account.user,
                         f"mbsync config {_home(path)} (IMAPAccount {account.name})")


def from_msmtp(identity: Identity, path: Path | None) -> None:
    if path is None or not path.is_file():
        return
    for account in msmtprc.parse(path).accounts.values():
        if account.from_address and "*" not in account.from_address:
            identity.add(account.from_address,
                         f"msmtp config {_home(path)} (account {account.name})")


def from_sent_folders(identity: Identity, config: Config, reader: Reader) -> None:
    """The most common From addresses of each Sent folder, newest mail first."""
    names: Counter[str] = Counter()
    for folder in config.roles().get("sent", []):
        messages = reader.messages(folders_query([folder]), exclude_tags=(),
                                   limit=SENT_SAMPLE)
        counts: Counter[str] = Counter()
        for message in messages:
            display, address = parseaddr(message.from_header)
            if looks_like_address(address):
                counts[address.lower()] += 1
                if display:
                    names[display.strip()] += 1
        for address, n in counts.most_common(MAX_SENT_ADDRESSES):
            if n >= max(1.0, SENT_SHARE * len(messages)):
                identity.add(address, f"Sent folder {folder} ({n} of {len(messages)} messages)")
    if names and not identity.name:
        identity.name = names.most_common(1)[0][0]
        identity.name_source = "the From of your Sent folders"


def discover(nm: dict[str, str], config: Config, reader: Reader | None,
             mbsync_path: Path | None = None, msmtp_path: Path | None = None) -> Identity:
    """The user's identity from every source, in the order of the module docstring.
    ``reader`` None skips the Sent folders (no index yet)."""
    identity = Identity()
    from_notmuch(identity, nm)
    rc = mbsync_path or (Path(config.settings.mbsync_config).expanduser()
                         if config.settings.mbsync_config else mbsyncrc.default_path())
    from_mbsync(identity, rc)
    from_msmtp(identity, msmtp_path or msmtprc.default_path())
    if reader is not None:
        from_sent_folders(identity, config, reader)
    return identity


def missing_from_notmuch(identity: Identity, nm: dict[str, str]) -> list[str]:
    """``notmuch config set`` commands that give notmuch the addresses it lacks (empty when
    it knows them all)."""
    known = {a.lower() for a in [nm.get("user.primary_email", ""),
                                 *nm.get("user.other_email", "").split(";")] if a}
    missing = [a for a in identity.addresses if a not in known]
    commands = []
    primary = nm.get("user.primary_email", "")
    if not primary and missing:
        primary = missing.pop(0)
        commands.append(f"notmuch config set user.primary_email {primary}")
    if missing:
        others = [a for a in nm.get("user.other_email", "").split(";") if a] + missing
        commands.append(f"notmuch config set user.other_email {shlex.quote(';'.join(others))}")
    if identity.name and not nm.get("user.name"):
        commands.append(f"notmuch config set user.name {shlex.quote(identity.name)}")
    return commands
