"""Accounts fmail-nm adds itself: validated, written into config files it owns, removed again.

An added account lives in three files under :func:`fmail_nm.config.own_config_dir`, never in
the user's own ``~/.mbsyncrc``, ``~/.msmtprc`` or fmail.toml:

* ``mbsyncrc``     its IMAPAccount, stores and Channel (run with ``mbsync -c``),
* ``msmtprc``      its msmtp account (sent with ``msmtp -C``),
* ``accounts.toml`` its ``[[accounts]]`` entry, which :mod:`fmail_nm.config` reads beside
  fmail.toml's; once removed, a line under ``[removed]``, so that adding it again takes up
  the mail the remove left in place (:func:`left_mail`).

The password is never asked for and never written: mbsync's ``PassCmd`` and msmtp's
``passwordeval`` run the user's command (``pass show …``, ``secret-tool lookup …``) each time.
With ``auth = "oauth2"`` (Outlook.com and Microsoft 365 take nothing else) that command prints
an OAuth2 access token instead, which both tools hand to the server with SASL ``XOAUTH2``
(mbsync through the Cyrus SASL plugin that provides it, msmtp by itself).  Server
certificates are always verified; a server's own certificate is trusted for its account alone
(``certificate``: mbsync's ``CertificateFile``, msmtp's ``tls_trust_file``).
Each account's block in the two rc files sits between marker lines, so removing it takes out
exactly what adding it put in.  Checking the login and the SMTP server and pulling the mail
is :mod:`fmail_nm.service.onboard`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import ssl
import stat
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from .. import mbsyncrc
from ..config import (ADDED_ACCOUNTS_FILE, ROLES, Config, ConfigError, load_added_accounts,
                      own_config_dir, relative_to_root, users_mbsync_config)
from ..private import private_dir, replace_private
from .identity import looks_like_address

MBSYNC_FILE = "mbsyncrc"
MSMTP_FILE = "msmtprc"
IMAP_TLS = ("imaps", "starttls", "none")
SMTP_TLS = ("tls", "starttls", "none")
# How the account signs in: the command prints a password, or an OAuth2 access token (XOAUTH2).
AUTH = ("password", "oauth2")
_DEFAULT_PORTS = {"imaps": 993, "starttls": 143, "none": 143, "tls": 465}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?$")
_LOOPBACK_NAMES = ("localhost",)
MAX_COMMAND = 1000
LEFT_TABLE = "removed"
_LEFT_COMMENT = ("# Removed accounts whose mail was left in place: added again under the same "
                 "name, login\n# and server, an account takes it up.\n")


class AccountError(ConfigError):
    """An account to add or remove is not acceptable; the message says what to change."""


@dataclass(frozen=True)
class Provider:
    name: str
    domains: tuple[str, ...]
    settings: dict[str, Any]
    folders: dict[str, str]
    patterns: tuple[str, ...]
    server_saves_sent: bool
    note: str


def providers() -> dict[str, Provider]:
    """The presets in providers.toml, by name."""
    data = tomllib.loads((files("fmail_nm.adopt") / "providers.toml").read_text(encoding="utf-8"))
    return {name: Provider(name=name, domains=tuple(raw.get("domains", ())),
                           settings={k: v for k, v in raw.items()
                                     if k.startswith(("imap_", "smtp_")) or k == "auth"},
                           folders=dict(raw.get("folders", {})),
                           patterns=tuple(raw.get("patterns", ("*",))),
                           server_saves_sent=bool(raw.get("server_saves_sent", False)),
                           note=str(raw.get("note", "")))
            for name, raw in data.items()}


def provider_for(address: str, name: str | None) -> Provider | None:
    """The preset asked for by name, else the one whose domains hold the address."""
    known = providers()
    if name:
        if name not in known:
            raise AccountError(f"unknown provider {name!r} (known: {', '.join(sorted(known))}); "
                               "leave it out and give the servers instead")
        return known[name]
    domain = address.rpartition("@")[2].lower()
    return next((p for p in known.values() if domain in p.domains), None)


@dataclass(frozen=True)
class NewAccount:
    """What the user tells us.  Left out: taken from the provider preset, else defaults
    (IMAP user = the address, ports by TLS mode)."""

    name: str
    address: str
    password_command: str
    provider: str | None = None
    imap_host: str | None = None
    imap_port: int | None = None
    imap_user: str | None = None
    imap_tls: str | None = None
    smtp_host: str | None = None
    smtp_port: int | None = None
    smtp_tls: str | None = None
    auth: str | None = None  # one of AUTH; left out: the preset's, else "password"
    certificate: str | None = None  # PEM file: server certificates trusted besides the system's
    full_name: str = ""

    @classmethod
    def with_servers(cls, *, imap: str | None, smtp: str | None, **values: Any) -> NewAccount:
        """``imap``/``smtp`` as ``host[:port]``; TLS follows the port as providers document
        them (IMAP 143 STARTTLS, else IMAPS; SMTP 465 TLS, else STARTTLS).  ``imap://`` and
        ``smtp://`` ask for no TLS, which only a server on this machine is allowed."""
        imap_host, imap_port, imap_plain = split_server(imap, "imap")
        smtp_host, smtp_port, smtp_plain = split_server(smtp, "smtp")
        return cls(imap_host=imap_host, imap_port=imap_port,
                   imap_tls="none" if imap_plain else None if imap_port is None
                   else "starttls" if imap_port == 143 else "imaps",
                   smtp_host=smtp_host, smtp_port=smtp_port,
                   smtp_tls="none" if smtp_plain else None if smtp_port is None
                   else "tls" if smtp_port == 465 else "starttls", **values)


# What `fmail-nm account add` takes as --flags: every field but full_name.
CLI_FIELDS = ("name", "address", "password_command", "provider", "imap_host", "imap_port",
              "imap_user", "imap_tls", "smtp_host", "smtp_port", "smtp_tls", "auth",
              "certificate")


def add_command(new: NewAccount) -> str:
    """The ``fmail-nm account add`` command line that adds ``new`` from a terminal."""
    argv = ["fmail-nm", "account", "add"]
    for key in CLI_FIELDS:
        value = getattr(new, key)
        if value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(argv)


def split_server(value: str | None, what: str) -> tuple[str | None, int | None, bool]:
    """``[what://]host[:port]`` -> (host, port, whether TLS was declined)."""
    if not value:
        return None, None, False
    rest = value.strip()
    plain = rest.startswith(f"{what}://")
    rest = rest.removeprefix(f"{what}://")
    host, colon, port = rest.rpartition(":")
    if not colon or "]" in port:
        return rest, None, plain
    if not (port.isascii() and port.isdigit()):
        raise AccountError(f"{what} must be host or host:port, not {value!r}")
    return host.strip("[]"), int(port), plain


@dataclass(frozen=True)
class AccountPlan:
    """A validated account with every value settled, and where its files go."""

    name: str
    address: str
    password_command: str
    imap_host: str
    imap_port: int
    imap_user: str
    imap_tls: str
    smtp_host: str | None
    smtp_port: int
    smtp_user: str
    smtp_tls: str
    maildir: Path  # the account's folder under the mail root
    mail_root: Path
    config_dir: Path
    folders: dict[str, str] = field(default_factory=dict)
    patterns: tuple[str, ...] = ("*",)
    server_saves_sent: bool = False
    note: str = ""
    full_name: str = ""
    auth: str = "password"  # one of AUTH
    certificate: Path | None = None  # trusted by this account's mbsync and msmtp only

    @property
    def mbsync_file(self) -> Path:
        return self.config_dir / MBSYNC_FILE

    @property
    def msmtp_file(self) -> Path:
        return self.config_dir / MSMTP_FILE

    @property
    def accounts_file(self) -> Path:
        return self.config_dir / ADDED_ACCOUNTS_FILE


# ---------------------------------------------------------------------------------------------
# Validation


def _clean(value: str, what: str) -> str:
    # A newline would start a new directive in the rc files: refuse every control character.
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise AccountError(f"{what} must be one line without control characters")
    return value.strip()


def _host(value: str | None, what: str) -> str:
    host = _clean(value or "", what)
    if not host:
        raise AccountError(f"{what} is needed (or a provider preset: "
                           f"{', '.join(sorted(providers()))})")
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if not _HOST.match(host):
        raise AccountError(f"{what} {host!r} is not a host name")
    return host


def is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls(value: str, allowed: tuple[str, ...], host: str, what: str) -> str:
    if value not in allowed:
        raise AccountError(f"{what} must be one of {', '.join(allowed)}, not {value!r}")
    if value == "none" and not is_loopback(host):
        raise AccountError(f"{what} none would send the password in clear text to {host}; "
                           "it is allowed only for a server on this machine (127.0.0.1)")
    return value


def _port(value: int | None, default: int, what: str) -> int:
    port = default if value is None else value
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise AccountError(f"{what} must be a port number (1-65535)")
    return port


_PEM_HINT = "give the server's certificate (PEM), e.g. as `openssl s_client -showcerts` prints it"


def _certificate(value: str | None) -> Path | None:
    """The file of certificates to trust, absolute (mbsync and msmtp run from anywhere)."""
    if value is None:
        return None
    path = Path(_clean(value, "certificate")).expanduser().absolute()
    if not path.is_file():
        raise AccountError(f"certificate {path} is not a file; {_PEM_HINT}")
    try:  # read as mbsync and msmtp read it (OpenSSL): a bad file fails every later run
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError):
        raise AccountError(f"certificate {path} is no readable PEM certificate; "
                           f"{_PEM_HINT}") from None
    return path


def check_password_command(command: str) -> str:
    """The command, if it can be one: a program that exists.  The value is never repeated in
    the error -- if it was the password itself, it must not end up in a transcript or log."""
    command = _clean(command, "password_command")
    if not command or len(command) > MAX_COMMAND:
        raise AccountError("password_command is needed: a command that prints the password, "
                           "e.g. `pass show mail/work` or `secret-tool lookup mail work`")
    try:
        program = shlex.split(command)[0]
    except (ValueError, IndexError):
        program = ""
    program = program.lstrip("+")  # mbsync: "+" marks a command that talks to the terminal
    path = Path(program).expanduser()
    if not program or not (shutil.which(program) or (path.is_file() and "/" in program)):
        raise AccountError("password_command must be a command that prints the password (its "
                           "first word a program on PATH or a path to one), not the password "
                           "itself; ask the user for the command")
    if "/" in program and not path.is_absolute():
        # Found from this directory only: mbsync and msmtp run it from wherever they start.
        raise AccountError("password_command must name its program by its full path (or "
                           "~/...), not relative to the current directory")
    return command


def plan(config: Config, new: NewAccount) -> AccountPlan:
    """Validate an account to add against the setup: every problem is an AccountError that
    says what to change, and nothing is written."""
    name = _clean(new.name, "name")
    if not _NAME.match(name):
        raise AccountError("name must be 1-40 letters, digits, '.', '_' or '-', starting with "
                           "a letter or digit")
    if any(a.name == name for a in config.accounts):
        raise AccountError(f"there is already an account {name!r}; choose another name")
    address = _clean(new.address, "address").lower()
    if not looks_like_address(address):
        raise AccountError(f"address {address!r} is not an e-mail address")
    preset = provider_for(address, new.provider)
    given = {k: v for k, v in vars(new).items() if v is not None}
    values: dict[str, Any] = {**(preset.settings if preset else {}), **given}
    imap_host = _host(values.get("imap_host"), "imap_host")
    imap_tls = _tls(values.get("imap_tls", "imaps"), IMAP_TLS, imap_host, "imap_tls")
    user_rule = values.get("imap_user", "address")
    imap_user = (address.partition("@")[0] if user_rule == "local-part" else
                 address if user_rule == "address" else _clean(user_rule, "imap_user"))
    smtp_host = _host(values["smtp_host"], "smtp_host") if values.get("smtp_host") else None
    smtp_tls = _tls(values.get("smtp_tls", "starttls"), SMTP_TLS, smtp_host or "", "smtp_tls") \
        if smtp_host else "starttls"
    maildir = config.mail_root / name
    _check_folder_free(maildir, name, far_side(imap_user, imap_host))
    _check_no_store_takes(config, maildir)
    auth = values.get("auth", "password")
    if auth not in AUTH:
        raise AccountError(f"auth must be one of {', '.join(AUTH)}, not {auth!r}")
    return AccountPlan(
        name=name, address=address,
        password_command=check_password_command(new.password_command),
        imap_host=imap_host,
        imap_port=_port(values.get("imap_port"), _DEFAULT_PORTS[imap_tls], "imap_port"),
        imap_user=imap_user, imap_tls=imap_tls, smtp_host=smtp_host,
        smtp_port=_port(values.get("smtp_port"), 587 if smtp_tls != "tls" else 465, "smtp_port"),
        # A provider that logs in to IMAP with the local part still wants the address for SMTP.
        smtp_user=address if user_rule == "local-part" else imap_user,
        smtp_tls=smtp_tls, maildir=maildir, mail_root=config.mail_root,
        config_dir=own_config_dir(),
        folders={r: f for r, f in (preset.folders if preset else {}).items() if r in ROLES},
        patterns=preset.patterns if preset else ("*",),
        server_saves_sent=preset.server_saves_sent if preset else False,
        note=preset.note if preset else "", full_name=_clean(new.full_name, "full_name"),
        auth=auth, certificate=_certificate(new.certificate))


def far_side(imap_user: str, imap_host: str) -> str:
    """The mailbox an account syncs with, as the record of a removed one names it."""
    return f"{imap_user} at {imap_host}"


def _check_folder_free(maildir: Path, name: str, far: str) -> None:
    """Refuse a folder for the new account that holds anything, unless :func:`remove` left it:
    the mail of an account of this name on the same login and server, whose sync state mbsync
    takes up (another mailbox's makes it refuse every folder: UIDVALIDITY changed)."""
    if not (maildir.exists() and any(maildir.iterdir())):
        return
    left = left_mail().get(name)
    if left == far:
        return
    held = (f"holds the mail of the removed account {name!r} of {left}, not {far}" if left
            else "exists and is not empty")
    raise AccountError(f"{maildir} {held}; move or delete that folder (or choose another "
                       "name) and add the account again")


def _check_no_store_takes(config: Config, maildir: Path) -> None:
    """Refuse a folder for the new account that a channel of the user's own mbsync config
    syncs (a store whose Path holds it, with Patterns that take its folders): the user's
    next sync would create its folders on that other server and upload the mail there."""
    rc = users_mbsync_config(config.settings)
    if rc is None or not rc.is_file():
        return
    parsed = mbsyncrc.parse(rc)
    for channel in parsed.channels.values():
        store = parsed.channel_store(channel)
        box = relative_to_root(maildir, store.path) if store and store.path else None
        if store is None or box is None:
            continue
        if any(_synced(channel.patterns, b) for b in (box, f"{box}/INBOX")):
            raise AccountError(
                f"{maildir} lies in mbsync store {store.name!r} ({rc}), whose channel "
                f"{channel.name!r} syncs {box}/ with Patterns {' '.join(channel.patterns)}: its "
                "next sync would put this account's mail on that server. Leave it out there "
                f"(Patterns ... !{box} !{box}/*) and add the account again")


def _synced(patterns: Sequence[str], box: str) -> bool:
    """Whether mbsync's ``Patterns`` take the mailbox ``box``: ``*`` matches anything, ``%``
    anything but ``/``, ``!`` excludes; the last pattern that matches decides."""
    taken = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        regex = "".join(".*" if c == "*" else "[^/]*" if c == "%" else re.escape(c) for c in body)
        if re.fullmatch(regex, box):
            taken = not negated
    return taken


# ---------------------------------------------------------------------------------------------
# The files


def _rc_quote(value: str) -> str:
    """A double-quoted value for mbsyncrc (which takes backslash escapes).  Not for msmtprc:
    msmtp keeps escapes as written and takes the rest of the line as the value, so its
    values (a shell command, a DOMAIN\\user login) are written as they are."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _begin(name: str) -> str:
    return f"# fmail-nm account {name}: begin (written by `fmail-nm account add`)"


def _end(name: str) -> str:
    return f"# fmail-nm account {name}: end"


def mbsync_block(p: AccountPlan) -> str:
    ssl = {"imaps": "IMAPS", "starttls": "STARTTLS", "none": "None"}[p.imap_tls]
    # PassCmd prints a token, which only XOAUTH2 takes: no other mechanism may be tried with it.
    # Without TLS (loopback only, see _tls) mbsync offers no cleartext mechanism unless named.
    auth = ("AuthMechs XOAUTH2\n" if p.auth == "oauth2" else
            "AuthMechs PLAIN LOGIN\n" if p.imap_tls == "none" else "")
    # Trusted besides the system's certificates: verification stays on.
    trust = (f"CertificateFile {_rc_quote(str(p.certificate))}\n"
             if p.certificate and p.imap_tls != "none" else "")
    root = p.maildir
    return f"""{_begin(p.name)}
IMAPAccount {p.name}
Host {p.imap_host}
Port {p.imap_port}
User {_rc_quote(p.imap_user)}
PassCmd {_rc_quote(p.password_command)}
SSLType {ssl}
{trust}{auth}
IMAPStore {p.name}-remote
Account {p.name}

MaildirStore {p.name}-local
Path {_rc_quote(str(root) + "/")}
Inbox {_rc_quote(str(root / "INBOX"))}
SubFolders Verbatim

Channel {p.name}
Far :{p.name}-remote:
Near :{p.name}-local:
Patterns {" ".join(_rc_quote(x) for x in p.patterns)}
Create Both
# Moves to Trash and Junk by fmail-nm reach the server only with Expunge.
Expunge Both
SyncState *
CopyArrivalDate yes
{_end(p.name)}
"""


def msmtp_block(p: AccountPlan) -> str:
    tls = {"tls": "tls on\ntls_starttls off", "starttls": "tls on\ntls_starttls on",
           "none": "tls off"}[p.smtp_tls]
    if p.certificate and p.smtp_tls != "none":  # instead of the system's: a server's own
        tls += f"\ntls_trust_file {p.certificate}"
    return f"""{_begin(p.name)}
account {p.name}
host {p.smtp_host}
port {p.smtp_port}
from {p.address}
user {p.smtp_user}
auth {"xoauth2" if p.auth == "oauth2" else "on"}
{tls}
passwordeval {p.password_command}
{_end(p.name)}
"""


def _without_block(text: str, name: str) -> tuple[str, bool]:
    """``text`` without the account's marked block (and the blank line after it)."""
    lines = text.splitlines(keepends=True)
    begin, end = _begin(name), _end(name)
    out: list[str] = []
    inside = found = False
    for line in lines:
        if line.rstrip("\n") == begin:
            inside = found = True
        elif inside and line.rstrip("\n") == end:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out).replace("\n\n\n", "\n\n"), found


def _read(path: Path) -> str:
    """One of fmail-nm's own config files, read to be rewritten ("" when there is none).
    mbsync and msmtp read bytes, so a hand edit may have left some that are not UTF-8; read
    with ``errors="replace"`` (as the parsers read the user's files) they would be written
    back changed.  Such a file is refused, named."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                          f"offset {exc.start}); fmail-nm rewrites this file: save it as "
                          "UTF-8 and try again") from None


def _header(kind: str) -> str:
    return (f"# {kind} for the accounts `fmail-nm account add` created; fmail-nm rewrites this "
            "file.\n# `fmail-nm account remove --name NAME` takes an account out. Your own config "
            "is never touched.\n\n")


def _append_block(path: Path, kind: str, block: str) -> None:
    text = _read(path) or _header(kind)
    replace_private(path, text.rstrip("\n") + "\n\n" + block)


def account_entry(p: AccountPlan) -> dict[str, Any]:
    """The account's ``[[accounts]]`` entry in accounts.toml (as fmail.toml would have it)."""
    entry: dict[str, Any] = {
        "name": p.name, "addresses": [p.address], "maildir": p.name,
        "mbsync_channel": p.name, "mbsync_config": str(p.mbsync_file),
    }
    if p.smtp_host:
        entry["send"] = {"command": send_command(p)}
    if p.server_saves_sent:
        entry["server_saves_sent"] = True
    if p.folders:
        entry["folders"] = dict(p.folders)
    return entry


def send_command(p: AccountPlan) -> list[str]:
    """How the account sends: its msmtp account in fmail-nm's msmtprc.  No -t: fmail-nm gives
    msmtp the recipients (Bcc included) and the sender (-f)."""
    return ["msmtp", "-C", str(p.msmtp_file), "-a", p.name]


def _toml_value(value: Any) -> str:
    # JSON strings, lists of strings and booleans are TOML values too.
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value, ensure_ascii=False)


def render_accounts(entries: list[dict[str, Any]], left: dict[str, str]) -> str:
    """accounts.toml: the added accounts' entries, then ``left`` (see :func:`left_mail`)."""
    out = [_header("fmail-nm accounts").rstrip("\n") + "\n"]
    for entry in entries:
        folders = entry.get("folders")
        out.append("\n[[accounts]]\n" + "".join(
            f"{key} = {_toml_value(value)}\n" for key, value in entry.items() if key != "folders"))
        if folders:
            out.append("\n[accounts.folders]\n" + "".join(
                f"{json.dumps(role)} = {json.dumps(folder)}\n" for role, folder in folders.items()))
    if left:
        out.append(f"\n{_LEFT_COMMENT}[{LEFT_TABLE}]\n" + "".join(
            f"{json.dumps(name)} = {json.dumps(far)}\n" for name, far in left.items()))
    return "".join(out)


def left_mail(config_dir: Path | None = None) -> dict[str, str]:
    """Accounts :func:`remove` took out, whose mail it left under the mail root: name -> the
    mailbox it was synced with (:func:`far_side`), which mbsync's state in it is about."""
    path = (config_dir or own_config_dir()) / ADDED_ACCOUNTS_FILE
    try:
        table = tomllib.loads(_read(path)).get(LEFT_TABLE, {})
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return {str(name): str(far) for name, far in table.items()}


def added_entries(config_dir: Path | None = None) -> list[dict[str, Any]]:
    return list(load_added_accounts(config_dir))


@contextmanager
def written(p: AccountPlan) -> Iterator[None]:
    """The account written (:func:`write`) for the ``with`` block that checks it.  If the
    write or the block fails, the add is refused and leaves nothing behind: fmail-nm's files
    are put back byte for byte (one that was not there is removed, not left holding only
    its header), the folders made for them removed, the account's folder dropped if empty."""
    before = {path: _saved(path) for path in (p.mbsync_file, p.msmtp_file, p.accounts_file)}
    made = [d for d in (p.config_dir, *p.config_dir.parents) if not d.exists()]  # deepest first
    try:
        write(p)
        yield
    except BaseException:
        for path, saved in before.items():
            _put_back(path, saved)
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # something else is in it now: it stays
                break
        drop_empty_maildir(p)
        raise


def _saved(path: Path) -> tuple[bytes, int] | None:
    """A file's bytes and mode, None when it is not there."""
    try:
        return path.read_bytes(), stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return None


def _put_back(path: Path, saved: tuple[bytes, int] | None) -> None:
    """``path`` as :func:`_saved` found it; left alone when it did not change."""
    if saved is None:
        path.unlink(missing_ok=True)
    elif _saved(path) != saved:
        replace_private(path, saved[0])
        os.chmod(path, saved[1])


def write(p: AccountPlan) -> None:
    """Put the account into fmail-nm's own files (rc files first: an entry in accounts.toml
    without its channel would be a broken account) and create its folder."""
    private_dir(p.maildir)  # as mbsync makes its folders: the mail is the user's alone
    _append_block(p.mbsync_file, "mbsync config", mbsync_block(p))
    if p.smtp_host:
        _append_block(p.msmtp_file, "msmtp config", msmtp_block(p))
    entries = [e for e in added_entries(p.config_dir) if e.get("name") != p.name]
    left = {n: far for n, far in left_mail(p.config_dir).items() if n != p.name}
    replace_private(p.accounts_file, render_accounts([*entries, account_entry(p)], left))


@dataclass(frozen=True)
class Removed:
    name: str
    files: tuple[Path, ...]  # the files the account was taken out of
    mail: Path | None  # its mail, left in place


def remove(name: str, mail_root: Path | None = None, config_dir: Path | None = None) -> Removed:
    """Take an added account out of fmail-nm's files; its mail stays where it is."""
    config_dir = config_dir or own_config_dir()
    entries = added_entries(config_dir)
    if not any(e.get("name") == name for e in entries):
        known = ", ".join(str(e.get("name")) for e in entries) or "none"
        raise AccountError(f"{name!r} is not an account fmail-nm added (added: {known}); "
                           "accounts of your own setup are edited in your own config files")
    # Every file read before any is written: one that is refused leaves all as they were.
    blocks = {config_dir / filename: _without_block(_read(config_dir / filename), name)
              for filename in (MBSYNC_FILE, MSMTP_FILE)}
    mail = mail_root / name if mail_root is not None and (mail_root / name).is_dir() else None
    left = {n: far for n, far in left_mail(config_dir).items() if n != name}
    far = _synced_with(config_dir / MBSYNC_FILE, name)
    if mail is not None and far is not None:  # for an add under this name to take it up
        left[name] = far
    changed = []
    replace_private(config_dir / ADDED_ACCOUNTS_FILE,
                    render_accounts([e for e in entries if e.get("name") != name], left))
    changed.append(config_dir / ADDED_ACCOUNTS_FILE)
    for path, (text, found) in blocks.items():
        if found:
            replace_private(path, text)
            changed.append(path)
    return Removed(name=name, files=tuple(changed), mail=mail)


def _synced_with(rc: Path, channel: str) -> str | None:
    """The mailbox (:func:`far_side`) an added account's channel syncs with, None when its
    block in fmail-nm's mbsyncrc is gone or names no login and server."""
    if not rc.is_file():
        return None
    parsed = mbsyncrc.parse(rc)
    imap = parsed.channel_imap_account(parsed.channels[channel]) \
        if channel in parsed.channels else None
    return far_side(imap.user, imap.host) if imap and imap.user and imap.host else None


def drop_empty_maildir(p: AccountPlan) -> None:
    """After a failed add: drop the account's folder again if nothing landed in it."""
    try:
        p.maildir.rmdir()
    except OSError:
        pass
