"""Who the user is: their name and addresses, found in the setup they already have.

Sources, in order (an address is reported once, with the first source that gave it):

1. notmuch's ``user.name``, ``user.primary_email`` and ``user.other_email``;
2. the mbsync config: the ``User`` of each ``IMAPAccount`` that looks like an address;
3. the msmtp config: each account's ``from``;
4. the From addresses of the Sent folders' newest mail, read from the notmuch index -- or,
   before the first index (``fmail-nm init`` learns them first, so that the first index tags
   the user's mail ``sent``), from the files' headers: an address counts when it wrote a fair
   share of a Sent folder, so a stray message filed there does not make a stranger one of the
   user's addresses.

Nothing here writes anything; :mod:`fmail_nm.adopt.initialize` decides what to do with it.
"""

from __future__ import annotations

import os
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .. import mbsyncrc, msmtprc
from ..config import Config, users_mbsync_config
from ..message.headers import addresses, canonical_address, date, header, split_head
from ..store.maildir import folder_path
from ..store.notmuch import Reader
from ..store.notmuch_config import config_list
from ..store.query import folders_query
from ..store.threads import sender

# An address with a dotted domain: an IMAP login like "alex" or "alex@localhost" is not one.
_ADDRESS = re.compile(r"^[^\s@\"<>()\\,;:*]+@[^\s@\"<>()\\,;:*]+\.[A-Za-z0-9-]{2,}$")
SENT_SAMPLE = 2000  # newest messages per Sent folder: enough to see who writes there
SENT_SHARE = 0.05  # an address must have written this share of a Sent folder
MAX_SENT_ADDRESSES = 10


def looks_like_address(value: str | None) -> bool:
    return bool(value) and _ADDRESS.match(value or "") is not None


@dataclass(frozen=True)
class Found:
    address: str  # lower-cased, its domain as first found (Unicode or ACE)
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
        """The address, unless it is one found already -- compared in canonical form, since
        ``alex@bücher.example`` and ``alex@xn--bcher-kva.example`` are one address."""
        address = address.strip().lower()
        known = {canonical_address(a) for a in self.addresses}
        if looks_like_address(address) and canonical_address(address) not in known:
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
        # "*" is a wildcard, "%U"-like a substitution (msmtp fills in the user, host...):
        # templates, not addresses.
        if account.from_address and not set("*%") & set(account.from_address):
            identity.add(account.from_address,
                         f"msmtp config {_home(path)} (account {account.name})")


def from_sent_folders(identity: Identity, config: Config, reader: Reader | None) -> None:
    """The most common From addresses of each Sent folder's newest mail: from the index, or
    from the files when ``reader`` is None (nothing indexed yet)."""
    names: Counter[str] = Counter()
    for folder in config.roles().get("sent", []):
        if reader is not None:
            # notmuch's From is decoded: the mirror's parser reads an encoded "Doe, Jane"
            # (Exchange, Outlook) that lost its quotes as one name, not as two addresses.
            senders = [sender(m.from_header) for m in reader.messages(
                folders_query([folder]), exclude_tags=(), limit=SENT_SAMPLE)]
        else:
            senders = senders_on_disk(folder_path(config, folder))
        counts: Counter[str] = Counter()  # by canonical form: one address however written
        written: dict[str, str] = {}  # each address as its newest message writes it
        for display, address in senders:
            if looks_like_address(address):
                canonical = canonical_address(address)
                counts[canonical] += 1
                written.setdefault(canonical, address)
                if display:
                    names[display.strip()] += 1
        for canonical, n in counts.most_common(MAX_SENT_ADDRESSES):
            if n >= max(1.0, SENT_SHARE * len(senders)):
                identity.add(written[canonical],
                             f"Sent folder {folder} ({n} of {len(senders)} messages)")
    if names and not identity.name:
        identity.name = names.most_common(1)[0][0]
        identity.name_source = "the From of your Sent folders"


SENT_FILES = 20000  # files of a Sent folder read at most (the most recently written)
HEAD_BYTES = 16 * 1024  # From and Date are in the header block


def senders_on_disk(folder: Path) -> list[tuple[str, str]]:
    """``(name, address)`` of the From of a Maildir folder's newest mail by its Date header
    (``SENT_SAMPLE`` of the ``SENT_FILES`` files written last), read from the files."""
    files: list[tuple[float, str]] = []
    for leaf in ("cur", "new"):
        try:
            with os.scandir(folder / leaf) as entries:
                files += [(e.stat().st_mtime, e.path) for e in entries if e.is_file()]
        except OSError:
            continue
    dated: list[tuple[float, str, str]] = []
    for _, path in sorted(files, reverse=True)[:SENT_FILES]:
        try:
            with open(path, "rb") as fh:
                headers, _ = split_head(fh.read(HEAD_BYTES))
            first = addresses(headers, "from", [])[:1]
            when = date(header(headers, "date"))
        except Exception:  # untrusted files: one we cannot read tells us nothing
            continue
        if first:
            dated.append((when.timestamp() if when else 0.0, first[0].name, first[0].address))
    dated.sort(key=lambda d: d[0], reverse=True)
    return [(name, address) for _, name, address in dated[:SENT_SAMPLE]]


def discover(nm: dict[str, str], config: Config, reader: Reader | None,
             mbsync_path: Path | None = None, msmtp_path: Path | None = None) -> Identity:
    """The user's identity from every source, in the order of the module docstring.
    ``reader`` None: nothing is indexed yet, the Sent folders are read from their files."""
    identity = Identity()
    from_notmuch(identity, nm)
    rc = mbsync_path or users_mbsync_config(config.settings)
    from_mbsync(identity, rc)
    from_msmtp(identity, msmtp_path or msmtprc.default_path())
    from_sent_folders(identity, config, reader)
    return identity


def missing_from_notmuch(identity: Identity, nm: dict[str, str],
                         notmuch: str = "notmuch") -> list[str]:
    """``notmuch config set`` commands that give notmuch the addresses it lacks (empty when
    it knows them all); ``notmuch``: how they run notmuch on that config."""
    known = {canonical_address(a) for a in [nm.get("user.primary_email", "").strip(),
                                            *config_list(nm.get("user.other_email"))] if a}
    missing = [a for a in identity.addresses if canonical_address(a) not in known]
    commands = []
    primary = nm.get("user.primary_email", "")
    if not primary and missing:
        primary = missing.pop(0)
        commands.append(f"{notmuch} config set user.primary_email {shlex.quote(primary)}")
    if missing:
        others = config_list(nm.get("user.other_email")) + missing
        commands.append(f"{notmuch} config set user.other_email {shlex.quote(';'.join(others))}")
    if identity.name and not nm.get("user.name"):
        commands.append(f"{notmuch} config set user.name {shlex.quote(identity.name)}")
    return commands
