"""Adding an account end to end: written, checked against the server, pulled, indexed.

:func:`add_account` validates (:func:`fmail_nm.adopt.accounts.plan`), writes fmail-nm's own
mbsync/msmtp config and accounts.toml, asks the server for its folder list with
``mbsync -c <own file> --list`` (the login and the password command are proven before any
mail moves), has msmtp reach the SMTP server as sending will (``msmtp -C <own file> -a <name>
--serverinfo``: host, port, TLS mode and certificate; it does not sign in), then pulls and
indexes with :func:`fmail_nm.service.cycle.sync`.  When a check fails the files are put back
as they were, so a typo leaves no half account behind.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from ..adopt import accounts
from ..adopt.identity import Identity, missing_from_notmuch
from ..app import load_config
from ..config import Config
from ..errors import CallerError
from ..store.notmuch_cli import notmuch_settings
from ..store.notmuch_config import notmuch_program
from ..tools.dto import Dto
from ..tools.render import first_shown, one_line
from . import send
from .cycle import sync
from .mbsync import MBSYNC_TIMEOUT, STOPPED, execute, find_mbsync

log = logging.getLogger(__name__)

CHECK_TIMEOUT = 60.0
# What mbsync says when it got no answer at all: the host name or the port is wrong (or the
# network is down) -- no server refused anything.
_UNREACHABLE = ("Cannot resolve server", "Cannot connect to")
# ... when the password command failed: nothing was sent to the server.
_PASSWORD_COMMAND = "PassCmd"
# ... when the certificate was checked and not trusted (self-signed, expired, another host's).
_UNTRUSTED = "SSL error connecting"
# ... when no TLS could be set up: the port speaks another TLS mode (IMAPS on a STARTTLS or
# plain port, or the other way round: the greeting awaited never comes, as the server awaits
# a TLS handshake), or the server offers no STARTTLS.
_NO_TLS = ("secure connect to", "SSL support not available", "): timeout.")
# ... when the server hung up before any login (another service on the port, a firewall);
# over IMAPS mbsync dies of the broken pipe (SIGPIPE) without a word.
_CLOSED = ("unexpected EOF", "Broken pipe", "Connection reset",
           f"mbsync exited with status {-signal.SIGPIPE}")


# What msmtp says when it got no answer: the host name or the port is wrong.
_SMTP_UNREACHABLE = ("cannot locate host", "cannot connect to")
# ... when the server's certificate was checked and not trusted.
_SMTP_UNTRUSTED = "certificate verification failed"
# ... when no TLS could be set up: TLS on a STARTTLS or plain port, or no STARTTLS offered.
_SMTP_NO_TLS = ("TLS handshake failed", "does not support TLS")
_SMTP_PORTS = "TLS is usually port 465, STARTTLS port 587"


class AccountCheckFailed(CallerError):
    """The new account's IMAP or SMTP server could not be reached or refused it (host, port,
    TLS mode, certificate, login or password command wrong)."""


class AddedAccount(Dto):
    # What adding an account did; also the add_email_account tool's answer (no docstring:
    # it would go into the tool's output schema).
    name: str
    folders: list[str]  # on the server
    pulled: bool
    added: int  # messages indexed
    errors: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)  # for the user


def added_text(r: AddedAccount) -> str:
    """``add_email_account``'s text for the model: the account, its folders, the pull, then
    the errors and the notes for the user, a line each."""
    folders = first_shown(r.folders, one_line, ", ")  # (all are in the structured content)
    pull = f"pulled, {r.added} messages indexed" if r.pulled else "the first pull FAILED"
    lines = [f"account {r.name} added; {len(r.folders)} folders on the server: {folders}; "
             f"{pull}"]
    lines += [f"error: {one_line(e)}" for e in r.errors]
    lines += [f"note: {one_line(n)}" for n in r.notes]
    return "\n".join(lines)


def server_folders(plan: accounts.AccountPlan, timeout: float = CHECK_TIMEOUT) -> list[str]:
    """The far side's folders, as mbsync lists them: proves host, TLS, login and password."""
    argv = [find_mbsync(), "-c", str(plan.mbsync_file), "--list", plan.name]
    code, error = execute(argv, timeout, keep_output=True)
    if code != 0:
        raise AccountCheckFailed(check_failure(plan, error))
    return [line.strip() for line in error.splitlines() if line.strip()]


def check_failure(plan: accounts.AccountPlan, error: str) -> str:
    """Why ``mbsync --list`` failed, as what to fix: only a login the server turned down is
    "refused"; a password command that failed, a certificate not trusted, a TLS mode the
    port does not speak or a server that hung up are each named, so the user changes the
    right value."""
    if error == STOPPED:  # nothing to fix: the server was not what ended it
        return _stopped("IMAP", plan, error)
    server = f"({plan.imap_user} at {plan.imap_host}:{plan.imap_port}): {error}"
    if any(said in error for said in _UNREACHABLE):
        return f"could not reach the IMAP server of account {plan.name!r} {server}"
    if _PASSWORD_COMMAND in error:
        return (f"the password command of account {plan.name!r} failed, so nothing was sent "
                f"to the server {server}; run it in a terminal, fix it and add the account again")
    if _UNTRUSTED in error:
        return _not_trusted("IMAP", plan, server)
    if any(said in error for said in _NO_TLS):
        return _no_tls("IMAP", plan.imap_tls, plan, server,
                       "IMAPS is usually port 993, STARTTLS port 143")
    if any(said in error for said in _CLOSED):
        return (f"the IMAP server of account {plan.name!r} closed the connection before any "
                f"login {server}; check the port and the TLS mode")
    return f"the IMAP server refused account {plan.name!r} {server}"


def check_sending(plan: accounts.AccountPlan, timeout: float = CHECK_TIMEOUT) -> None:
    """Reach the SMTP server with the account's own msmtp config, as a send will: proves the
    host, port, TLS mode and certificate now rather than at the first send.  An account
    without an SMTP server sends nothing, and is not checked."""
    if not plan.smtp_host:
        return
    try:
        code, said = send.run_to_end([*accounts.send_command(plan), "--serverinfo"], None,
                                     timeout, stoppable=True)
    except send.StoppedAtShutdown as exc:
        raise AccountCheckFailed(_stopped("SMTP", plan, str(exc))) from None
    except FileNotFoundError:
        raise AccountCheckFailed(f"account {plan.name!r} sends with msmtp, which is not "
                                 "installed: install msmtp, or add the account without an SMTP "
                                 "server (it then sends nothing)") from None
    except subprocess.TimeoutExpired:
        raise AccountCheckFailed(sending_failure(plan, f"no answer within {timeout:g}s")) from None
    if code != 0:
        raise AccountCheckFailed(sending_failure(plan, said or f"msmtp exited with status {code}"))


def sending_failure(plan: accounts.AccountPlan, error: str) -> str:
    """Why ``msmtp --serverinfo`` failed, as what to fix (as :func:`check_failure` for IMAP)."""
    server = f"({plan.smtp_host}:{plan.smtp_port}, {plan.smtp_tls}): {error}"
    if any(said in error for said in _SMTP_UNREACHABLE):
        return (f"could not reach the SMTP server of account {plan.name!r} {server}; check the "
                "SMTP host and port")
    if _SMTP_UNTRUSTED in error:
        return _not_trusted("SMTP", plan, server)
    if any(said in error for said in _SMTP_NO_TLS):
        return _no_tls("SMTP", plan.smtp_tls, plan, server, _SMTP_PORTS)
    return (f"the SMTP server of account {plan.name!r} could not be used {server}; check the "
            f"SMTP host, port and TLS mode ({_SMTP_PORTS})")


def _stopped(kind: str, plan: accounts.AccountPlan, said: str) -> str:
    # The service's shutdown ended the check (see mbsync.stop_running).
    return (f"the check of account {plan.name!r}'s {kind} server was stopped ({said}); add the "
            "account again")


def _not_trusted(kind: str, plan: accounts.AccountPlan, server: str) -> str:
    # Verification stays on: a server's own certificate is trusted for its account only.
    return (f"the {kind} server of account {plan.name!r} has a certificate this machine does "
            f"not trust {server}; check the host name, or (a server's own certificate) "
            "add the account with `fmail-nm account add --certificate FILE`")


def _no_tls(kind: str, tls: str, plan: accounts.AccountPlan, server: str, ports: str) -> str:
    return (f"no TLS ({tls}) with the {kind} server of account {plan.name!r} {server}; check "
            f"the port and the TLS mode: {ports}")


def add_account(config: Config, new: accounts.NewAccount, *, config_path: Path | None = None,
                timeout: float = MBSYNC_TIMEOUT,
                on_pull: Callable[[list[str]], None] | None = None,
                on_lock_wait: Callable[[], None] | None = None,
                on_channel_wait: Callable[[list[str]], None] | None = None
                ) -> tuple[AddedAccount, Config]:
    """Add, check, pull and index an account; returns what happened and the config that has
    it.  ``config_path`` is the fmail.toml ``config`` was loaded from.  ``on_pull`` is told
    the server's folders once the check passed and the first pull (which may take long)
    starts; the index's waits are told as :func:`~fmail_nm.service.cycle.sync` tells them."""
    plan = accounts.plan(config, new)
    with accounts.written(plan):  # refused (a failed check, a config that no longer loads): undone
        folders = server_folders(plan, min(timeout, CHECK_TIMEOUT))
        check_sending(plan, min(timeout, CHECK_TIMEOUT))
        updated = load_config(config_path)
    if on_pull is not None:
        on_pull(folders)
    report = sync(updated, plan.name, "pull", timeout=timeout, on_lock_wait=on_lock_wait,
                  on_channel_wait=on_channel_wait)
    result = AddedAccount(name=plan.name, folders=folders,
                          pulled=report.mbsync_ok,
                          added=report.index.added if report.index else 0,
                          errors=report.errors())
    updated = load_config(config_path)  # again: the pull made the folders, and their roles
    result.notes += notmuch_commands(updated, plan.address)
    if plan.note:
        result.notes.append(plan.note)
    log.info("added account %s (%d folders on the server, %d messages indexed)",
             plan.name, len(folders), result.added)
    return result, updated


def notmuch_commands(config: Config, address: str) -> list[str]:
    """fmail-nm knows the new address from accounts.toml; notmuch (and the mail clients that
    read its config) learn it only from the user, who is told the command."""
    identity = Identity()
    identity.add(address, "the new account")
    return [f"so that notmuch and your mail client know the address too: {command}"
            for command in missing_from_notmuch(
                identity, notmuch_settings(config.settings.notmuch_config),
                notmuch_program(config.settings.notmuch_config))]
