"""Adding an account: validated, written into fmail-nm's own config files, checked against a
real Dovecot, pulled by a real mbsync, indexed by notmuch -- with a password *command* only,
and the user's own mbsyncrc and msmtprc left byte for byte as they were."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp.types import ElicitRequestParams, ElicitResult

from fmail_nm.store.sidecar import uid_for
from fmail_nm.adopt import accounts
from fmail_nm.app import load_config
from fmail_nm.config import own_config_dir
from fmail_nm.mcp.consent import account_question
from fmail_nm.service import send
from fmail_nm.service.doctor import mbsync_findings, xoauth2_plugin
from fmail_nm.service.mbsync import execute, find_mbsync
from fmail_nm.service.background import Background
from fmail_nm.service.onboard import (
    AccountCheckFailed,
    add_account,
    check_failure,
    check_sending,
    server_folders,
)
from fmail_nm.store.notmuch import Reader
from fmail_nm.tools import reads

from . import imapbed
from .conftest import MailEnv, notmuch_lock_held, search_rows, stderr_lines
from .smtpbed import SmtpBed
from .syncbed import require_tools, runs_with

pytestmark = pytest.mark.imap

USER = "casey"
PASSWORD = "pw-Qx7vR2kLm9"  # unique, so any copy of it can be found
TOKEN = "tok-Hq4mZ8wPc3"  # the OAuth2 access token the test servers take for USER
USER_MBSYNCRC = b"""# my own mbsync config; fmail-nm must never rewrite it
IMAPAccount personal
Host imap.example.org
User alex@example.org
PassCmd "pass show mail/personal"
SSLType IMAPS
"""
USER_MSMTPRC = b"""# my own msmtp config
account personal
host smtp.example.org
from alex@example.org
"""
RECORD = """#!/bin/sh
# Records how it was called, then runs the real program.
printf '%s\\n' "$0 $*" >> "{log}"
exec "{real}" "$@"
"""


def message(n: int, sender: str, to: str, subject: str) -> bytes:
    return (f"From: {sender}\r\nTo: {to}\r\nSubject: {subject}\r\n"
            f"Date: Wed, 02 Dec 2026 10:{n:02d}:00 +0000\r\n"
            f"Message-ID: <casey-{n}@example.net>\r\n\r\nBody {n}.\r\n").encode()


@dataclass
class Bed:
    env: MailEnv
    server: imapbed.ImapServer
    smtp: SmtpBed  # the new account's SMTP server (no TLS: loopback)
    password_script: Path
    argv_log: Path


@pytest.fixture
def bed(indexed: MailEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    """The indexed fixture mail with the user's own ~/.mbsyncrc and ~/.msmtprc, a Dovecot
    with a second mailbox (two messages in INBOX, one in Sent), an SMTP server, a password
    script, and mbsync/msmtp/notmuch behind recorders that log every argv they are started
    with."""
    require_tools()
    home = Path(indexed.env["HOME"])
    (home / ".mbsyncrc").write_bytes(USER_MBSYNCRC)
    (home / ".msmtprc").write_bytes(USER_MSMTPRC)
    script = tmp_path / "secrets" / "print-password"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{PASSWORD}'\n")
    script.chmod(0o700)
    shims, argv_log = tmp_path / "shims", tmp_path / "argv.log"
    shims.mkdir()
    for program in ("mbsync", "msmtp", "notmuch"):
        shim = shims / program
        shim.write_text(RECORD.format(log=argv_log, real=imapbed.find_program(program)))
        shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    server = imapbed.ImapServer(tmp_path / "imap", users={USER: PASSWORD},
                                tokens={USER: TOKEN}, cleanup=False)
    server.start()
    smtp = SmtpBed(tmp_path / "smtp", {}).start()
    try:
        imapbed.append(server, USER, "INBOX", message(1, "Dana Lee <dana@example.net>",
                                                      "casey@example.com", "Quarterly figures"))
        imapbed.append(server, USER, "INBOX", message(2, "Eli Park <eli@example.net>",
                                                      "casey@example.com", "Lunch on Friday"))
        imapbed.append(server, USER, "Sent", message(3, "Casey <casey@example.com>",
                                                     "dana@example.net", "Re: Quarterly figures"))
        yield Bed(indexed, server, smtp, script, argv_log)
    finally:
        smtp.stop()
        server.stop(graceful=False)


def new_account(bed: Bed, **changes: object) -> accounts.NewAccount:
    values: dict[str, object] = dict(
        name="side", address="casey@example.com", password_command=str(bed.password_script),
        imap_host="127.0.0.1", imap_port=bed.server.port, imap_user=USER, imap_tls="none",
        smtp_host="127.0.0.1", smtp_port=bed.smtp.port, smtp_tls="none")
    values.update(changes)
    return accounts.NewAccount(**values)  # type: ignore[arg-type]


def files_fmail_writes(bed: Bed) -> list[Path]:
    """Every file under the test's tree except the password script and Dovecot's own files
    (its passwd file holds the password by design)."""
    skip = (bed.password_script.parent, bed.server.workdir)
    return [p for p in bed.env.base.rglob("*")
            if p.is_file() and not any(p.is_relative_to(s) for s in skip)]


def assert_password_nowhere(bed: Bed, *texts: str) -> None:
    needle = PASSWORD.encode()
    leaked = [p for p in files_fmail_writes(bed) if needle in p.read_bytes()]
    assert leaked == []
    argv = bed.argv_log.read_text()
    assert "mbsync" in argv  # the recorder saw mbsync start, so it could have seen a leak
    assert PASSWORD not in argv
    for text in texts:
        assert PASSWORD not in text


def test_an_added_account_is_checked_pulled_indexed_and_searchable(
        bed: Bed, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    home = Path(bed.env.env["HOME"])
    config = load_config()
    result, updated = add_account(config, new_account(bed), timeout=60)

    assert result.pulled and result.errors == []
    assert {"INBOX", "Sent"} <= set(result.folders)
    assert result.added == 3
    assert "side" in [a.name for a in updated.accounts]
    # The user's own accounts are still there, beside the new one.
    assert {"personal", "work"} <= {a.name for a in updated.accounts}
    # Its own config files, private, used with -c / -C.
    own = own_config_dir()
    for name in ("mbsyncrc", "msmtprc", "accounts.toml"):
        assert stat.S_IMODE((own / name).stat().st_mode) == 0o600
    # Its mail folder too, as mbsync makes the folders in it (it was 0755 under umask 022).
    assert stat.S_IMODE((config.mail_root / "side").stat().st_mode) == 0o700
    assert f"-c {own / 'mbsyncrc'}" in bed.argv_log.read_text()
    side = updated.account("side")
    assert side.send is not None and list(side.send.command[:3]) == ["msmtp", "-C",
                                                                     str(own / "msmtprc")]
    # A command fmail-nm sends with (it refused the -t it was written with), and one msmtp
    # takes: --pretend reads the file and the account without sending.
    command = send.command_for(updated, side)
    pretend = subprocess.run([*command, "--pretend"], capture_output=True, text=True,
                             timeout=30, env={**os.environ, **bed.env.env})
    assert pretend.returncode == 0 and "from = casey@example.com" in pretend.stdout, pretend
    assert side.folders.get("sent") == "side/Sent"

    # Through the read tools: found by search and listed as an account.
    with Reader(updated.settings.notmuch_config) as reader:
        mailbox = reads.Mailbox(updated, reader)
        found = reads.search_emails(mailbox, "subject:Quarterly account:side")
        assert {m.id for m in found.results} == {uid_for("casey-1@example.net"),
                                                 uid_for("casey-3@example.net")}
        listed = reads.list_available_accounts(mailbox.config)
        assert "side" in [a.name for a in listed.accounts]
        sent = reader.find("casey-3@example.net")
        assert sent is not None and "sent" in sent.tags  # the new address is the user's

    # Again from a fresh load, as the next command would see it.
    assert "side" in [a.name for a in load_config().accounts]
    assert (home / ".mbsyncrc").read_bytes() == USER_MBSYNCRC
    assert (home / ".msmtprc").read_bytes() == USER_MSMTPRC
    out = capsys.readouterr()
    assert_password_nowhere(bed, caplog.text, out.out, out.err, repr(result))


def test_a_refused_login_leaves_nothing_behind(bed: Bed) -> None:
    wrong = bed.env.base / "secrets" / "wrong-password"
    wrong.write_text("#!/bin/sh\necho not-the-password\n")
    wrong.chmod(0o700)
    config = load_config()
    with pytest.raises(AccountCheckFailed, match="refused"):
        add_account(config, new_account(bed, password_command=str(wrong)), timeout=60)
    assert accounts.added_entries() == []
    assert not (own_config_dir() / "mbsyncrc").exists()
    assert not (config.mail_root / "side").exists()
    assert [a.name for a in load_config().accounts] == [a.name for a in config.accounts]


@pytest.mark.parametrize("server, said", [
    ({"imap_host": "imap.nonexistent.invalid", "imap_tls": "imaps"},
     "Cannot resolve server 'imap.nonexistent.invalid'"),
    ({"imap_port": 1}, "Cannot connect to 127.0.0.1"),
])
def test_a_server_that_cannot_be_reached_is_not_said_to_refuse(
        bed: Bed, server: dict[str, object], said: str) -> None:
    """A host name that does not resolve was reported as "the IMAP server refused account"."""
    with pytest.raises(AccountCheckFailed) as refused:
        add_account(load_config(), new_account(bed, **server), timeout=60)
    assert str(refused.value).startswith("could not reach the IMAP server of account 'side'")
    assert said in str(refused.value) and "refused account" not in str(refused.value)
    assert accounts.added_entries() == []


@pytest.mark.parametrize("tls", ["imaps", "starttls", "none"])
def test_a_server_that_hangs_up_is_not_said_to_refuse(bed: Bed, tls: str) -> None:
    """A port whose server closes every connection before any login (another service, a
    firewall) was "the IMAP server refused account": the user was sent to the password.
    Over IMAPS mbsync dies of the broken pipe and says nothing of its own."""
    with socket.create_server(("127.0.0.1", 0)) as hanging_up:
        def hang_up() -> None:
            while True:
                try:
                    hanging_up.accept()[0].close()
                except OSError:  # closed: the test is done
                    return
        threading.Thread(target=hang_up, daemon=True).start()
        with pytest.raises(AccountCheckFailed) as failed:
            add_account(load_config(), new_account(bed, imap_tls=tls,
                                                   imap_port=hanging_up.getsockname()[1]),
                        timeout=60)
    assert "closed the connection before any login" in str(failed.value)
    assert "refused" not in str(failed.value) and accounts.added_entries() == []


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A fresh self-signed certificate for 127.0.0.1 and its key, as PEM files."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    folder.mkdir()
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_a_failed_check_names_what_to_fix_not_a_refusal(bed: Bed, tmp_path: Path) -> None:
    """A password command that failed, a TLS mode the port does not speak and a certificate
    not trusted were all "the IMAP server refused account": the user was sent to fix the
    password.  Each is named, and nothing is left behind."""
    failing = bed.env.base / "secrets" / "failing"
    failing.write_text("#!/bin/sh\necho 'gpg: decryption failed' >&2\nexit 2\n")
    failing.chmod(0o700)
    server = imapbed.ImapServer(tmp_path / "imaps", users={USER: PASSWORD}, cleanup=False,
                                tls=self_signed(tmp_path / "tls"))
    with server:
        cases = [({"password_command": str(failing)},
                  "the password command of account 'side' failed", "gpg: decryption failed"),
                 ({"imap_tls": "imaps"}, "no TLS (imaps) with the IMAP server", "port 993"),
                 ({"imap_tls": "starttls"}, "no TLS (starttls) with the IMAP server",
                  "SSL support not available"),
                 ({"imap_tls": "imaps", "imap_port": server.port},
                  "has a certificate this machine does not trust", "--certificate FILE")]
        for values, says, detail in cases:
            with pytest.raises(AccountCheckFailed) as failed:
                add_account(load_config(), new_account(bed, **values), timeout=60)
            assert says in str(failed.value) and detail in str(failed.value)
            assert "refused" not in str(failed.value)
            assert own_files() == {} and not (load_config().mail_root / "side").exists()
        # The other way round (STARTTLS on the IMAPS port) the greeting awaited never comes,
        # and mbsync 1.4.4 says so after its 20 s Timeout -- in these words, not waited out here.
        starttls = accounts.plan(load_config(), new_account(bed, imap_tls="starttls",
                                                            imap_port=server.port))
        said = check_failure(starttls, f"Socket error on 127.0.0.1 (127.0.0.1:{server.port}): "
                                       "timeout.")
        assert "no TLS (starttls) with the IMAP server" in said and "refused" not in said
    assert add_account(load_config(), new_account(bed), timeout=60)[0].pulled


def test_a_servers_own_certificate_is_trusted_for_its_account_only(
        bed: Bed, tmp_path: Path) -> None:
    """A server with a self-signed certificate could not be added at all but by trusting
    its certificate system-wide: `--certificate` trusts it for that account's mbsync and
    msmtp, verification on.  Another account on that server still refuses it."""
    cert, key = self_signed(tmp_path / "tls")
    server = imapbed.ImapServer(tmp_path / "imaps", users={USER: PASSWORD}, cleanup=False,
                                tls=(cert, key))
    smtp = SmtpBed(tmp_path / "smtps", {}, tls=(cert, key)).start()
    try:
        with server:
            imapbed.append(server, USER, "INBOX", message(5, "Dana Lee <dana@example.net>",
                                                          "casey@example.com", "Over TLS"))
            args = ["account", "add", "--address", "casey@example.com",
                    "--password-command", str(bed.password_script), "--imap-host", "127.0.0.1",
                    "--imap-port", str(server.port), "--imap-user", USER, "--imap-tls", "imaps",
                    "--smtp-host", "127.0.0.1", "--smtp-port", str(smtp.port),
                    "--smtp-tls", "starttls"]
            done = bed.env.fmail(*args, "--name", "tls", "--certificate", str(cert),
                                 check=False)
            assert done.returncode == 0 and "1 messages indexed" in done.stdout, done.stderr
            refused = bed.env.fmail(*args, "--name", "other", check=False)
            assert refused.returncode == 2 and "does not trust" in refused.stderr, \
                refused.stderr
    finally:
        smtp.stop()
    assert f'CertificateFile "{cert}"\n' in (own_config_dir() / "mbsyncrc").read_text()
    assert "SSLType IMAPS\n" in (own_config_dir() / "mbsyncrc").read_text()
    config = load_config()  # msmtp reads the trust file as the account's
    pretend = subprocess.run([*send.command_for(config, config.account("tls")), "--pretend"],
                             capture_output=True, text=True, timeout=30,
                             env={**os.environ, **bed.env.env})
    assert f"tls_trust_file = {cert}\n" in pretend.stdout, pretend


def test_the_smtp_server_is_checked_with_msmtp_before_the_add_stands(
        bed: Bed, tmp_path: Path) -> None:
    """The add checked IMAP only: an SMTP port or TLS mode that was wrong, or a certificate
    not trusted, showed at the first send, long after.  msmtp itself (``--serverinfo`` with
    the account's msmtprc: connection, TLS, certificate) finds each; the add is refused,
    named, and fmail-nm's files are put back byte for byte."""
    add_account(load_config(), new_account(bed, name="other"), timeout=60)
    before, mail_root = own_files(), load_config().mail_root
    cert, key = self_signed(tmp_path / "tls")
    untrusted = SmtpBed(tmp_path / "smtps", {}, tls=(cert, key)).start()
    try:
        cases = [({"smtp_port": imapbed.free_port()},
                  "could not reach the SMTP server of account 'side'", "Connection refused"),
                 ({"smtp_port": untrusted.port, "smtp_tls": "starttls"},
                  "the SMTP server of account 'side' has a certificate this machine does not "
                  "trust", "--certificate FILE"),
                 ({"smtp_tls": "starttls"}, "no TLS (starttls) with the SMTP server of account "
                  "'side'", "does not support TLS")]
        for values, says, detail in cases:
            with pytest.raises(AccountCheckFailed) as failed:
                add_account(load_config(), new_account(bed, **values), timeout=60)
            assert says in str(failed.value) and detail in str(failed.value), failed.value
            assert own_files() == before and not (mail_root / "side").exists()
        trusted = new_account(bed, smtp_port=untrusted.port, smtp_tls="starttls",
                              certificate=str(cert))
        assert add_account(load_config(), trusted, timeout=60)[0].pulled
        ran = bed.argv_log.read_text()  # with the account's own msmtprc, as sending will
        assert f"msmtp -C {own_config_dir() / 'msmtprc'} -a side --serverinfo" in ran, ran
    finally:
        untrusted.stop()


def _msmtp_runs_with(config_path: Path) -> list[int]:
    return runs_with("msmtp", config_path)


def _check_stopped_by_the_service(bed: Bed, kind: str) -> BaseException:
    """The check of a new account's ``kind`` ("IMAP" or "SMTP") server, which never greets,
    while the background service stops: what the check raised (no msmtp left running)."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never greets
    silent.settimeout(60)
    port = silent.getsockname()[1]
    plan = accounts.plan(load_config(), new_account(
        bed, **({"imap_port": port} if kind == "IMAP" else {"smtp_port": port})))
    accounts.write(plan)
    failed: list[BaseException] = []

    def check() -> None:
        try:
            if kind == "IMAP":
                server_folders(plan)
            else:
                check_sending(plan)
        except BaseException as exc:
            failed.append(exc)

    bg = Background(load_config(), watch=False, schedule=False, push=False)
    bg.start()
    checking = threading.Thread(target=check)
    try:
        checking.start()
        conn, _ = silent.accept()  # the check waits for the greeting now
        bg.stop(timeout=1.0)
        assert _msmtp_runs_with(plan.msmtp_file) == []
        checking.join(60)
        conn.close()
    finally:
        for pid in _msmtp_runs_with(plan.msmtp_file):
            os.kill(pid, signal.SIGKILL)
        silent.close()
        checking.join(60)
    assert len(failed) == 1, failed
    return failed[0]


def test_stopping_the_service_ends_the_smtp_check_of_an_account_being_added(
        bed: Bed) -> None:
    """add_email_account checks the SMTP server with msmtp, for up to a minute: one that
    never answers must not keep the service's shutdown (and the process's exit) waiting, nor
    outlive it -- the shutdown ends it as it ends the service's mbsync runs."""
    failed = _check_stopped_by_the_service(bed, "SMTP")
    assert isinstance(failed, AccountCheckFailed), failed
    assert "fmail-nm was shutting down" in str(failed)


def test_an_imap_check_the_shutdown_ends_is_not_a_refused_login(bed: Bed) -> None:
    """The IMAP check (mbsync --list) ended by the service's shutdown was told as "the IMAP
    server refused account ...": the user would go and change a password that was right."""
    failed = _check_stopped_by_the_service(bed, "IMAP")
    assert isinstance(failed, AccountCheckFailed), failed
    assert "refused" not in str(failed)
    assert "IMAP server was stopped (mbsync was stopped: fmail-nm was shutting down)" in str(
        failed)


def test_cli_add_refuses_an_smtp_server_it_cannot_reach(bed: Bed) -> None:
    """Nothing listening on the SMTP port: `account add` says so and leaves nothing."""
    refused = bed.env.fmail(*add_args(bed), "--smtp-port", str(imapbed.free_port()),
                            check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "could not reach the SMTP server of account 'side'" in refused.stderr
    assert own_files() == {} and not (load_config().mail_root / "side").exists()


def own_files() -> dict[str, bytes]:
    """fmail-nm's own config folder, file name -> bytes ({} when the folder is not there)."""
    own = own_config_dir()
    return {p.name: p.read_bytes() for p in own.iterdir()} if own.is_dir() else {}


def test_a_refused_cli_add_leaves_fmail_nms_files_as_they_were(bed: Bed) -> None:
    """`fmail-nm account add` refused -- by the server, or by a file of ours it cannot read
    once it has begun writing -- left accounts.toml, mbsyncrc and msmtprc holding only their
    headers, or an earlier file changed: each must be as it was, an absent one absent."""
    wrong = bed.env.base / "secrets" / "wrong-password"
    wrong.write_text("#!/bin/sh\necho not-the-password\n")
    wrong.chmod(0o700)
    mail_root = load_config().mail_root

    def add(password_command: Path) -> None:
        refused = bed.env.fmail(
            "account", "add", "--name", "side", "--address", "casey@example.com",
            "--password-command", str(password_command), "--imap-host", "127.0.0.1",
            "--imap-port", str(bed.server.port), "--imap-user", USER, "--imap-tls", "none",
            "--smtp-host", "127.0.0.1", "--smtp-port", str(bed.smtp.port),
            "--smtp-tls", "none", check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert not (mail_root / "side").exists()

    assert own_files() == {}
    add(wrong)  # the login is refused
    assert own_files() == {}
    own_config_dir().mkdir(parents=True)
    (own_config_dir() / "mbsyncrc").write_bytes(b"# hand-made, kept as it is\n")
    (own_config_dir() / "msmtprc").write_bytes(b"# \xe9crit en latin-1\n")  # not UTF-8
    before = own_files()
    add(wrong)
    assert own_files() == before
    add(bed.password_script)  # mbsyncrc written, then msmtprc cannot be read
    assert own_files() == before


def test_a_file_of_ours_that_is_not_utf8_is_named_and_left_as_it_is(bed: Bed) -> None:
    """fmail-nm's own msmtprc with a byte that is not UTF-8 (a hand edit: msmtp and mbsync
    take bytes) stopped `account add` and `account remove` with Python's bare words, naming
    no file -- and the remove had taken the account out of accounts.toml and mbsyncrc by
    then."""
    add_account(load_config(), new_account(bed), timeout=60)
    msmtprc = own_config_dir() / "msmtprc"
    msmtprc.write_bytes(msmtprc.read_bytes() + b"# \xe9crit en latin-1\n")
    before = own_files()
    refused = bed.env.fmail("account", "remove", "--name", "side", check=False)
    assert refused.returncode == 2, refused.stderr
    assert f"{msmtprc} is not UTF-8 text (byte 0xe9 at offset" in refused.stderr
    assert own_files() == before
    refused = bed.env.fmail(
        "account", "add", "--name", "other", "--address", "casey@example.com",
        "--password-command", str(bed.password_script), "--imap-host", "127.0.0.1",
        "--imap-port", str(bed.server.port), "--imap-user", USER, "--imap-tls", "none",
        "--smtp-host", "127.0.0.1", "--smtp-port", str(bed.smtp.port),
        "--smtp-tls", "none", check=False)
    assert refused.returncode == 2, refused.stderr
    assert f"{msmtprc} is not UTF-8 text" in refused.stderr
    assert own_files() == before


def test_remove_undoes_an_add_and_keeps_the_mail(bed: Bed) -> None:
    before_mbsync = (own_config_dir() / "mbsyncrc")
    config = load_config()
    add_account(config, new_account(bed), timeout=60)
    add_account(load_config(), new_account(bed, name="other"), timeout=60)
    listed = bed.env.fmail("account", "list").stdout.splitlines()
    assert "side: casey@example.com; mail in side; added with `fmail-nm account add`" in listed
    assert any(line.startswith("personal: ") and line.endswith("; your set-up's")
               for line in listed), listed
    done = bed.env.fmail("account", "remove", "--name", "side")
    assert "left in place" in done.stdout
    assert not any(line.startswith("side: ")
                   for line in bed.env.fmail("account", "list").stdout.splitlines())
    assert [e["name"] for e in accounts.added_entries()] == ["other"]
    text = before_mbsync.read_text()
    assert "IMAPAccount side" not in text and "IMAPAccount other" in text
    assert "account side" not in (own_config_dir() / "msmtprc").read_text()
    assert (config.mail_root / "side" / "INBOX").is_dir()  # mail is never removed
    assert "side" not in [a.name for a in load_config().accounts]
    refused = bed.env.fmail("account", "remove", "--name", "personal", check=False)
    assert refused.returncode == 2 and "not an account fmail-nm added" in refused.stderr


def add_args(bed: Bed, name: str = "side") -> list[str]:
    return ["account", "add", "--name", name, "--address", "casey@example.com",
            "--password-command", str(bed.password_script), "--imap-host", "127.0.0.1",
            "--imap-port", str(bed.server.port), "--imap-user", USER, "--imap-tls", "none",
            "--smtp-host", "127.0.0.1", "--smtp-port", str(bed.smtp.port),
            "--smtp-tls", "none"]


def test_an_account_removed_and_added_again_takes_up_the_mail_it_left(bed: Bed) -> None:
    """Remove, then add again under the same name (to fix the password command): the add
    refused the name, as the folder the remove left in place was not empty."""
    bed.env.fmail(*add_args(bed))
    done = bed.env.fmail("account", "remove", "--name", "side")
    assert "takes it up again" in done.stdout
    imapbed.append(bed.server, USER, "INBOX", message(4, "Dana Lee <dana@example.net>",
                                                      "casey@example.com", "While away"))
    again = bed.env.fmail(*add_args(bed), check=False)
    assert again.returncode == 0, again.stderr
    assert "side" in [a.name for a in load_config().accounts]
    # mbsync took up its sync state: only the new message was pulled, nothing twice.
    inbox = load_config().mail_root / "side" / "INBOX"
    assert len([*(inbox / "new").iterdir(), *(inbox / "cur").iterdir()]) == 3
    for n in (1, 2, 3, 4):
        files = bed.env.notmuch("search", "--output=files", f"id:casey-{n}@example.net")
        assert len(files.stdout.splitlines()) == 1, files.stdout
    assert bed.env.fmail("sidecar", "check").returncode == 0
    # Taken up: a later remove and add take it up again, as the first did.
    bed.env.fmail("account", "remove", "--name", "side")
    bed.env.fmail(*add_args(bed))


def test_a_folder_that_is_not_the_mail_of_a_removed_account_of_that_server_is_refused(
        bed: Bed) -> None:
    mail_root = load_config().mail_root
    stray = mail_root / "side" / "notes.txt"
    stray.parent.mkdir()
    stray.write_text("not mail of ours\n")
    with pytest.raises(accounts.AccountError, match="side exists and is not empty; move or "
                       "delete that folder"):
        accounts.plan(load_config(), new_account(bed))
    stray.unlink()
    add_account(load_config(), new_account(bed), timeout=60)
    bed.env.fmail("account", "remove", "--name", "side")
    # Another login: mbsync's sync state in the folder is of the mailbox the mail came from.
    with pytest.raises(accounts.AccountError, match=f"holds the mail of the removed account "
                       f"'side' of {USER} at 127.0.0.1, not someone at 127.0.0.1"):
        accounts.plan(load_config(), new_account(bed, imap_user="someone"))
    assert (mail_root / "side" / "INBOX").is_dir()


def test_cli_add_with_flags_says_what_it_waits_for(bed: Bed) -> None:
    """The first pull and a notmuch write lock held elsewhere are said on stderr as they
    start: the command sat silent through both."""
    argv = [sys.executable, "-m", "fmail_nm", "account", "add", "--name", "side",
            "--address", "casey@example.com", "--password-command", str(bed.password_script),
            "--imap-host", "127.0.0.1", "--imap-port", str(bed.server.port),
            "--imap-user", USER, "--imap-tls", "none"]
    with notmuch_lock_held(bed.env.env) as holder:
        add = subprocess.Popen(argv, env={**os.environ, **bed.env.env}, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        said = stderr_lines(add, 2, within=60)
        holder.release()  # the index waited for it, and said so (or the wait is over): go on
        out, rest = add.communicate(timeout=120)
    assert add.returncode == 0, said + [rest]
    assert "the server took the login (" in said[0] and "pulling its mail" in said[0], said
    assert "waiting for the notmuch write lock" in said[1], said
    assert "side" in out and "3 messages" in out
    assert_password_nowhere(bed, out, "".join(said), rest)
    assert "msmtp" not in bed.argv_log.read_text()  # no SMTP server given: none checked


@pytest.mark.parametrize("changes, message", [
    ({"password_command": PASSWORD}, "not the password itself"),
    # Found from the test's directory only; the service starts mbsync from another.
    ({"password_command": os.path.relpath("/bin/echo")}, "by its full path"),
    ({"imap_host": "imap.example.net"}, "clear text"),
    ({"name": "personal"}, "already an account"),
    ({"name": "../up"}, "name must be"),
    ({"imap_user": "casey\nPassCmd evil"}, "one line"),
    ({"address": "not-an-address"}, "not an e-mail address"),
    ({"provider": "aol"}, "unknown provider"),
    ({"auth": "kerberos"}, "auth must be one of password, oauth2"),
    # mbsync refused it only at the check, which then said the server refused the login.
    ({"certificate": __file__}, "no readable PEM certificate"),
    ({"certificate": "/"}, "is not a file"),
])
def test_bad_accounts_are_refused_before_anything_is_written(
        indexed: MailEnv, tmp_path: Path, changes: dict[str, object], message: str) -> None:
    values: dict[str, object] = dict(name="side", address="casey@example.com",
                                     password_command="/bin/echo", imap_host="127.0.0.1",
                                     imap_tls="none")
    values.update(changes)
    with pytest.raises(accounts.AccountError, match=message) as err:
        accounts.plan(load_config(), accounts.NewAccount(**values))  # type: ignore[arg-type]
    assert PASSWORD not in str(err.value)
    assert not own_config_dir().exists() or not any(own_config_dir().iterdir()) or \
        accounts.added_entries() == []


def test_a_port_that_is_not_ascii_digits_is_refused() -> None:
    assert accounts.split_server("imap.example.net:993", "imap") == ("imap.example.net", 993, False)
    with pytest.raises(accounts.AccountError, match="must be host or host:port"):
        accounts.split_server("imap.example.net:\u00b2", "imap")


def test_presets_fill_in_gmail() -> None:
    gmail = accounts.provider_for("someone@gmail.com", None)
    assert gmail is not None and gmail.name == "gmail"
    assert gmail.folders["sent"] == "[Gmail]/Sent Mail" and gmail.server_saves_sent
    assert "![Gmail]/All Mail" in gmail.patterns
    assert {"gmail", "fastmail", "icloud", "outlook"} <= set(accounts.providers())


def test_a_gmail_plan_renders_its_folders_and_server_side_sent(indexed: MailEnv) -> None:
    plan = accounts.plan(load_config(), accounts.NewAccount(
        name="g", address="someone@gmail.com", password_command="/bin/echo"))
    assert (plan.imap_host, plan.imap_port, plan.imap_tls) == ("imap.gmail.com", 993, "imaps")
    block = accounts.mbsync_block(plan)
    assert 'Patterns "*" "![Gmail]/All Mail"' in block and "SSLType IMAPS" in block
    assert 'PassCmd "/bin/echo"' in block
    entry = accounts.account_entry(plan)
    assert entry["server_saves_sent"] is True and entry["folders"]["junk"] == "[Gmail]/Spam"
    msmtp = accounts.msmtp_block(plan)
    assert "host smtp.gmail.com" in msmtp and "tls_starttls on" in msmtp
    assert 'passwordeval /bin/echo\n' in msmtp  # msmtp takes the rest of the line as it is
    assert "auth on\n" in msmtp and "AuthMechs" not in block  # a password, as mbsync likes


def test_an_outlook_plan_signs_in_with_oauth2(indexed: MailEnv) -> None:
    """Outlook.com and Microsoft 365 take no password over IMAP or SMTP: the preset's account
    must ask both tools for XOAUTH2, or it cannot sign in at all."""
    plan = accounts.plan(load_config(), accounts.NewAccount(
        name="o", address="someone@outlook.com", password_command="/bin/echo"))
    assert plan.auth == "oauth2" and "oama" in plan.note
    block, msmtp = accounts.mbsync_block(plan), accounts.msmtp_block(plan)
    assert "AuthMechs XOAUTH2\n" in block and 'PassCmd "/bin/echo"' in block
    assert "auth xoauth2\n" in msmtp and "passwordeval /bin/echo\n" in msmtp
    asked = accounts.plan(load_config(), accounts.NewAccount(
        name="p", address="someone@outlook.com", password_command="/bin/echo", auth="password"))
    assert "AuthMechs" not in accounts.mbsync_block(asked)
    assert "auth on\n" in accounts.msmtp_block(asked)
    assert "--auth password" in accounts.add_command(accounts.NewAccount(
        name="p", address="someone@outlook.com", password_command="/bin/echo", auth="password"))


def test_an_oauth2_account_asks_for_a_token_command(indexed: MailEnv) -> None:
    """The user is told it is a token, not a password, that the command prints -- on the
    terminal `account add` asks, and in what an MCP client puts to the user."""
    plan = accounts.plan(load_config(), accounts.NewAccount(
        name="o", address="someone@outlook.com", password_command="/bin/echo"))
    question = account_question(plan)
    assert "Token command: /bin/echo\n" in question and "as an OAuth2 access token" in question
    assert "password" not in question.lower()
    main, terminal = os.openpty()
    run = subprocess.Popen(  # on a terminal, what the flags leave out is asked for
        [sys.executable, "-m", "fmail_nm", "account", "add", "--name", "o", "--address",
         "someone@outlook.com"], stdin=terminal, stdout=terminal, stderr=terminal,
        env={**os.environ, **indexed.env})
    os.close(terminal)
    try:
        shown = b""
        while b": " not in shown:
            ready, _, _ = select.select([main], [], [], 60)
            assert ready, shown
            shown += os.read(main, 1024)
        assert shown.decode().strip() == (
            "command that prints an OAuth2 access token (e.g. oama access you@outlook.com):")
    finally:
        run.kill()
        run.wait(10)
        os.close(main)


def token_command(bed: Bed, token: str) -> Path:
    """A command that prints an access token, as a token helper (oama, mutt_oauth2.py) does."""
    script = bed.password_script.parent / "print-token"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{token}'\n")
    script.chmod(0o700)
    return script


def test_an_oauth2_account_signs_in_to_imap_and_smtp_with_the_token_its_command_prints(
        bed: Bed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`account add --auth oauth2` wrote an account that a real mbsync and msmtp sign in with
    by XOAUTH2 (the servers take the token with no other mechanism); a token they refuse is a
    clear error from fmail-nm, and doctor names a missing SASL plugin, as mbsync then fails."""
    if xoauth2_plugin() is None:
        pytest.skip("no Cyrus SASL XOAUTH2 plugin: apt-get install libsasl2-modules-kdexoauth2")
    smtp = SmtpBed(tmp_path / "smtp", {}, tokens={USER: TOKEN}).start()
    try:
        tokens = token_command(bed, TOKEN)

        def add(name: str) -> subprocess.CompletedProcess[str]:
            return bed.env.fmail(
                "account", "add", "--name", name, "--address", "casey@example.com",
                "--password-command", str(tokens), "--auth", "oauth2", "--imap-host", "127.0.0.1",
                "--imap-port", str(bed.server.port), "--imap-user", USER, "--imap-tls", "none",
                "--smtp-host", "127.0.0.1", "--smtp-port", str(smtp.port), "--smtp-tls", "none",
                check=False)

        added = add("ms")
        assert added.returncode == 0 and "3 messages indexed" in added.stdout, added.stderr
        assert "user=<casey>, method=XOAUTH2" in bed.server.log()
        assert "AuthMechs XOAUTH2\n" in (own_config_dir() / "mbsyncrc").read_text()
        assert "auth xoauth2\n" in (own_config_dir() / "msmtprc").read_text()
        config = load_config()
        argv = [*send.command_for(config, config.account("ms")), "-f", "casey@example.com",
                "--", "dana@example.net"]
        raw = message(4, "Casey <casey@example.com>", "dana@example.net", "Figures attached")
        send.run_command(argv, raw, 30)
        assert [r.rcpt_tos for r in smtp.received] == [("dana@example.net",)]

        # Without the plugin mbsync cannot offer XOAUTH2: doctor says so, and why.
        def xoauth2_findings() -> list[str]:
            return [f.line() for f in mbsync_findings(config) if "XOAUTH2" in f.problem]

        assert xoauth2_findings() == []
        monkeypatch.setenv("SASL_PATH", str(tmp_path))  # libsasl2 loads plugins from here
        missing = xoauth2_findings()
        assert len(missing) == 1 and "no Cyrus SASL plugin for XOAUTH2" in missing[0], missing
        assert "libsasl2-modules-kdexoauth2" in missing[0]
        code, error = execute([find_mbsync(), "-c", str(own_config_dir() / "mbsyncrc"),
                               "--list", "ms"], 30)
        assert code == 1 and "SASL mechanism(s) not available" in error, error
        monkeypatch.delenv("SASL_PATH")

        # An expired or revoked token: refused, said, nothing sent (Dovecot delays every
        # login after a refused one, so the IMAP refusal comes last).
        tokens.write_text("#!/bin/sh\necho tok-expired\n")
        with pytest.raises(send.SendFailed, match="authentication failed"):
            send.run_command(argv, raw, 30)
        assert len(smtp.received) == 1
        refused = add("ms2")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert "the IMAP server refused account 'ms2'" in refused.stderr, refused.stderr
        # (mbsync itself gives up on the refused sign-in and then waits for good: not a
        # timeout after a minute, but this.)
        assert "an access token that is expired, revoked" in refused.stderr, refused.stderr
        assert [e["name"] for e in accounts.added_entries()] == ["ms"]
    finally:
        smtp.stop()


def test_without_accounts_toml_the_accounts_are_those_of_fmail_toml(indexed: MailEnv) -> None:
    assert not (own_config_dir() / "accounts.toml").exists()
    assert [a.name for a in load_config().accounts] == ["personal", "work"]


class UserAnswers:
    """The user behind an MCP client: answers each elicitation with the next of ``answers``
    (an action and the form's content) and keeps what was asked."""

    def __init__(self, *answers: tuple[str, dict[str, Any] | None]) -> None:
        self.answers = list(answers)
        self.asked: list[ElicitRequestParams] = []

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params)
        action, content = self.answers.pop(0)
        return ElicitResult(action=action, content=content)  # type: ignore[arg-type]


def tool_args(bed: Bed, password_command: Path) -> dict[str, Any]:
    return {"name": "side", "address": f"{USER}@example.com",
            "password_command": str(password_command),
            "imap": f"imap://127.0.0.1:{bed.server.port}", "imap_user": USER}


def assert_nothing_added(bed: Bed) -> None:
    assert accounts.added_entries() == []
    mbsyncrc = own_config_dir() / "mbsyncrc"
    assert not mbsyncrc.exists() or "side" not in mbsyncrc.read_text()
    assert not (load_config().mail_root / "side").exists()
    assert not bed.argv_log.exists() or "mbsync" not in bed.argv_log.read_text()


@pytest.mark.anyio
async def test_add_email_account_over_mcp(bed: Bed) -> None:
    """The tool: no password parameter; the user is asked, with the command and servers that
    will be used; the account shows in list_available_accounts and its mail in search_emails
    of the same server, without a restart."""
    from mcp.client.client import Client

    from .test_server_writes import call, server_params

    user = UserAnswers(("accept", {"add": True}))
    async with Client(server_params(bed.env), elicitation_callback=user) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        schema = tools["add_email_account"].input_schema["properties"]
        assert "password_command" in schema and not any(
            "password" in key and key != "password_command" for key in schema)
        assert set(schema).isdisjoint({"new", "answer"})  # filled by the server, not the model
        result = await client.call_tool("add_email_account", tool_args(bed, bed.password_script))
        assert not result.is_error, result.content
        added = result.structured_content or {}
        assert added["pulled"] is True and added["added"] == 3
        shown = result.content[0].text.split("\n")  # type: ignore[union-attr]
        assert shown[0] == (f"account side added; {len(added['folders'])} folders on the "
                            f"server: {', '.join(added['folders'])}; pulled, 3 messages indexed")
        assert shown[1:] == [f"note: {note}" for note in added.get("notes", [])]
        [asked] = user.asked
        assert f"Password command: {bed.password_script}\n" in asked.message
        assert f"IMAP: {USER} at 127.0.0.1:{bed.server.port} (no TLS)" in asked.message
        assert asked.requested_schema["properties"]["add"]["type"] == "boolean"
        accounts_now = await call(client, "list_available_accounts")
        assert "side" in [a["name"] for a in accounts_now["accounts"]]
        found = await call(client, "search_emails", {"query": "subject:Lunch", "account": "side"})
        assert [m["id"] for m in search_rows(found)] == [uid_for("casey-2@example.net")]
    assert_password_nowhere(bed)


@pytest.mark.anyio
async def test_add_email_account_over_mcp_with_oauth2(bed: Bed, tmp_path: Path) -> None:
    """auth oauth2 over MCP makes the account `account add --auth oauth2` makes: the user is
    asked about a token command, mbsync and msmtp sign in by XOAUTH2 with what it prints.
    An auth that is neither password nor oauth2 is refused, named, before anyone is asked."""
    from mcp.client.client import Client

    from .test_server_writes import error_text, server_params

    if xoauth2_plugin() is None:
        pytest.skip("no Cyrus SASL XOAUTH2 plugin: apt-get install libsasl2-modules-kdexoauth2")
    smtp = SmtpBed(tmp_path / "smtp", {}, tokens={USER: TOKEN}).start()
    try:
        args = {**tool_args(bed, token_command(bed, TOKEN)),
                "smtp": f"smtp://127.0.0.1:{smtp.port}"}
        user = UserAnswers(("accept", {"add": True}))
        async with Client(server_params(bed.env), elicitation_callback=user) as client:
            text = await error_text(client, "add_email_account", {**args, "auth": "kerberos"})
            assert "auth must be one of password, oauth2, not 'kerberos'" in text, text
            assert user.asked == []
            result = await client.call_tool("add_email_account", {**args, "auth": "oauth2"})
            assert not result.is_error, result.content
            assert (result.structured_content or {})["added"] == 3
        [asked] = user.asked
        assert "Token command: " in asked.message and "OAuth2 access token" in asked.message
        assert "user=<casey>, method=XOAUTH2" in bed.server.log()
        assert "AuthMechs XOAUTH2\n" in (own_config_dir() / "mbsyncrc").read_text()
        assert "auth xoauth2\n" in (own_config_dir() / "msmtprc").read_text()
        config = load_config()
        send.run_command([*send.command_for(config, config.account("side")),
                          "-f", "casey@example.com", "--", "dana@example.net"],
                         message(4, "Casey <casey@example.com>", "dana@example.net", "Hi"), 30)
        assert [r.rcpt_tos for r in smtp.received] == [("dana@example.net",)]
    finally:
        smtp.stop()


@pytest.mark.anyio
async def test_without_the_users_yes_no_account_is_added_and_no_command_runs(bed: Bed) -> None:
    """A declined, cancelled or unticked answer: an error that says so, nothing written, the
    password command never run, mbsync never started.  A bad value is not put to the user."""
    from mcp.client.client import Client

    from .test_server_writes import error_text, server_params

    ran = bed.env.base / "secrets" / "ran"
    command = bed.env.base / "secrets" / "records-each-run"
    command.write_text(f"#!/bin/sh\necho ran >> '{ran}'\nprintf '%s\\n' '{PASSWORD}'\n")
    command.chmod(0o700)
    user = UserAnswers(("decline", None), ("cancel", None), ("accept", {"add": False}))
    async with Client(server_params(bed.env), elicitation_callback=user) as client:
        # A bad value is refused before the user is asked.
        text = await error_text(client, "add_email_account",
                                {**tool_args(bed, command), "password_command": PASSWORD})
        assert "not the password itself" in text and PASSWORD not in text
        assert user.asked == []
        for _ in range(3):
            text = await error_text(client, "add_email_account", tool_args(bed, command))
            assert "the user did not confirm adding the account 'side'" in text
    assert len(user.asked) == 3
    assert not ran.exists()
    assert_nothing_added(bed)


@pytest.mark.anyio
async def test_add_email_account_errors_name_its_own_arguments(bed: Bed) -> None:
    """A bad or missing server is named as the tool's imap/smtp argument and its form, not as
    the imap_host/imap_port of `fmail-nm account add`, which the tool does not take."""
    from mcp.client.client import Client

    from .test_server_writes import error_text, server_params

    args = tool_args(bed, bed.password_script)
    wanted = {None: "imap (host[:port]) is needed",
              "127.0.0.1:99999": "the port of imap (host:port) must be a port number (1-65535)",
              "imap://mail.example.net": "imap:// (no TLS) would send the password in clear text"}
    async with Client(server_params(bed.env)) as client:
        for imap, message in wanted.items():
            text = await error_text(client, "add_email_account", {**args, "imap": imap})
            assert message in text and "imap_" not in text, text
        text = await error_text(client, "add_email_account", {**args, "smtp": "smtp:0"})
        assert "the port of smtp (host:port) must be" in text, text
    assert_nothing_added(bed)


@pytest.mark.anyio
async def test_a_client_that_cannot_ask_the_user_gets_the_terminal_command(bed: Bed) -> None:
    """Without elicitation the tool adds nothing and answers with the `fmail-nm account add`
    command line; run in a terminal, that command adds the same account."""
    from mcp.client.client import Client

    from .test_server_writes import error_text, server_params

    async with Client(server_params(bed.env)) as client:
        text = await error_text(client, "add_email_account",
                                tool_args(bed, bed.password_script))
    assert "cannot ask the user" in text
    assert_nothing_added(bed)
    command = text.partition("The user can add the account in a terminal: ")[2]
    argv = shlex.split(command)
    assert argv[:3] == ["fmail-nm", "account", "add"]
    done = bed.env.fmail(*argv[1:], check=False)
    assert done.returncode == 0, done.stderr
    assert "side" in done.stdout and "3 messages" in done.stdout
    side = load_config().account("side")
    assert side.maildir == "side"


def test_a_write_on_an_account_the_push_scheduler_does_not_know_yet_stands(
        indexed: MailEnv, caplog: pytest.LogCaptureFixture) -> None:
    """After add_email_account, the server's push scheduler (started with the old config)
    refuses the new account's name; the write is not turned into an error for it."""
    from fmail_nm.mcp.server import MailService
    from fmail_nm.passes.changes import WriteOutcome
    from fmail_nm.service.push import PushScheduler

    with PushScheduler(load_config(), quiet_period=60, timeout=10) as scheduler:
        service = MailService(load_config(), on_push=scheduler.request)
        try:
            service._after_write(WriteOutcome("archive", ("casey-1@example.net",),
                                              frozenset({"side"})))
        finally:
            service.close()
        assert scheduler.status().pending == set()
    assert "the next `fmail-nm sync` pushes it" in caplog.text


def agent_starting_command(folder: Path, secret: str) -> tuple[Path, Path]:
    """A password command that starts a helper in a session of its own (an agent), which
    holds the stderr it was given; the command and the file of the helpers' pids."""
    pid_file = folder / "holder.pid"
    script = folder / "starts-an-agent"
    script.write_text("#!/bin/sh\n"
                      f"setsid sh -c 'echo $$ >> \"$0\"; exec sleep 600' '{pid_file}' "
                      ">/dev/null </dev/null &\n"
                      f"printf '%s\\n' '{secret}'\n")
    script.chmod(0o700)
    return script, pid_file


def kill_helpers(pid_file: Path) -> None:
    for holder in pid_file.read_text().split() if pid_file.is_file() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(holder), signal.SIGKILL)


def test_a_password_helper_left_running_does_not_make_a_sent_message_a_maybe(
        tmp_path: Path) -> None:
    """msmtp runs the password command for every send; a helper it leaves running held the
    pipe the send read msmtp's words from, and a message that went out was reported as "did
    not finish within 10 s; it may or may not have sent the message" -- sent again, twice."""
    require_tools()
    smtp = SmtpBed(tmp_path / "smtp", {}, tokens={USER: TOKEN}).start()
    script, pid_file = agent_starting_command(tmp_path, TOKEN)
    rc = tmp_path / "msmtprc"
    rc.write_text(f"account t\nhost 127.0.0.1\nport {smtp.port}\nfrom casey@example.com\n"
                  f"auth xoauth2\nuser {USER}\npasswordeval {script}\ntls off\n")
    rc.chmod(0o600)
    try:
        send.run_command(["msmtp", "-C", str(rc), "-a", "t", "-f", "casey@example.com", "--",
                          "dana@example.net"],
                         message(7, "Casey <casey@example.com>", "dana@example.net", "Once"), 10)
        assert [r.rcpt_tos for r in smtp.received] == [("dana@example.net",)]
        assert pid_file.is_file()  # the helper did start, and outlived msmtp
    finally:
        kill_helpers(pid_file)
        smtp.stop()


def test_a_password_helper_left_running_does_not_fail_the_smtp_check(
        bed: Bed, tmp_path: Path) -> None:
    """A password command whose helper stays in a session of its own (an agent it starts)
    holds msmtp's stderr after msmtp exited.  The SMTP check read msmtp's pipes until they
    closed: it reached its timeout, then waited on for the helper, and refused a good
    account as "no answer"."""
    script, pid_file = agent_starting_command(tmp_path / "secrets", PASSWORD)
    result: list[object] = []

    def add() -> None:
        try:
            result.append(add_account(load_config(),
                                      new_account(bed, password_command=str(script)),
                                      timeout=10)[0])
        except AccountCheckFailed as exc:
            result.append(exc)

    worker = threading.Thread(target=add, daemon=True)
    worker.start()
    try:
        worker.join(120)  # before: until the last helper ends (600 s)
        assert result, "the add still waits for the pipes a helper holds"
        assert not isinstance(result[0], AccountCheckFailed), result[0]
    finally:
        kill_helpers(pid_file)
        worker.join(30)
