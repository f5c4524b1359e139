"""Doctor's XOAUTH2 plugin check reads the IMAP account a channel signs in with as mbsync
itself does: a real mbsync against a real Dovecot says whether it could sign in, and doctor
must say the same.  A sign-in mbsync gives up is named to its IMAP account."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fmail_nm.adopt.initialize import Finding
from fmail_nm.config import Config, load_settings, resolve
from fmail_nm.service.doctor import mbsync_findings, xoauth2_plugin
from fmail_nm.service.mbsync import run_mbsync

from . import imapbed
from .syncbed import require_tools

pytestmark = pytest.mark.imap

# The local side and the channel, after each way of writing the far side below.
LOCAL_AND_CHANNEL = """
MaildirStore ms-local
Path {root}/ms/
Inbox {root}/ms/INBOX

Channel ms
Far :ms-remote:
Near :ms-local:
Patterns *
Expunge Both
"""

# An IMAPStore that holds its account's options itself, its login given by UserCmd.
STORE_HOLDS_ACCOUNT = """IMAPStore ms-remote
Host 127.0.0.1
Port {port}
UserCmd "echo casey"
PassCmd "echo tok"
SSLType None
AuthMechs XOAUTH2
""" + LOCAL_AND_CHANNEL

# A quoted IMAPAccount name, and the old singular AuthMech.
QUOTED_ACCOUNT = """IMAPAccount "ms"
Host 127.0.0.1
Port {port}
User casey
PassCmd "echo tok"
SSLType None
AuthMech XOAUTH2

IMAPStore ms-remote
Account ms
""" + LOCAL_AND_CHANNEL


def _mbsync_and_doctor(tmp_path: Path, rc_text: str) -> tuple[subprocess.CompletedProcess[str],
                                                              list[Finding]]:
    """What a real mbsync says signing in with ``rc_text``, and doctor's XOAUTH2 findings,
    both under the caller's $SASL_PATH."""
    require_tools()
    root = tmp_path / "mail"
    (root / "ms" / "INBOX").mkdir(parents=True)
    rc = tmp_path / "mbsyncrc"
    with imapbed.ImapServer(tmp_path / "imap", users={"casey": "pw"},
                            tokens={"casey": "tok"}) as server:
        rc.write_text(rc_text.format(root=root, port=server.port))
        run = subprocess.run([shutil.which("mbsync") or "mbsync", "-c", str(rc), "--list", "ms"],
                             capture_output=True, text=True, timeout=30)
    toml = tmp_path / "fmail.toml"
    toml.write_text(f'[mbsync]\nconfig = "{rc}"\n')
    config: Config = resolve(load_settings(toml), root)
    assert [a.mbsync_channel for a in config.accounts] == ["ms"]
    return run, [f for f in mbsync_findings(config) if "XOAUTH2" in f.problem]


@pytest.mark.parametrize("rc_text", [STORE_HOLDS_ACCOUNT, QUOTED_ACCOUNT],
                         ids=["store-with-usercmd", "quoted-account-name"])
def test_doctor_names_the_missing_plugin_whichever_way_the_account_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rc_text: str) -> None:
    """Without the XOAUTH2 plugin mbsync cannot sign in -- for an IMAPStore that holds its
    account itself with UserCmd (no User), and for ``IMAPAccount "ms"`` that ``Account ms``
    names: doctor must say so for both."""
    monkeypatch.setenv("SASL_PATH", str(tmp_path))  # no plugins at all
    run, missing = _mbsync_and_doctor(tmp_path, rc_text)
    assert run.returncode == 1 and "SASL mechanism(s) not available" in run.stderr, run.stderr
    assert len(missing) == 1 and "no Cyrus SASL plugin for XOAUTH2" in missing[0].line(), missing
    assert missing[0].serious and "mbsync cannot log in" in missing[0].problem


@pytest.mark.parametrize("sasl_path", ["", ":"])
def test_doctor_looks_for_the_plugin_where_libsasl2_does_when_sasl_path_is_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sasl_path: str) -> None:
    """libsasl2 reads a set $SASL_PATH as it is, even empty: set to "" (or only empty
    entries) it names no folder and mbsync has no plugin -- doctor must not find one in the
    default folders."""
    if xoauth2_plugin() is None:
        pytest.skip("no Cyrus SASL XOAUTH2 plugin: apt-get install libsasl2-modules-kdexoauth2")
    monkeypatch.setenv("SASL_PATH", sasl_path)
    run, missing = _mbsync_and_doctor(tmp_path, QUOTED_ACCOUNT.replace('"ms"', "ms"))
    assert run.returncode == 1 and "SASL mechanism(s) not available" in run.stderr, run.stderr
    assert len(missing) == 1 and "no Cyrus SASL plugin for XOAUTH2" in missing[0].line(), missing
    assert missing[0].serious and "mbsync cannot log in" in missing[0].problem


def test_doctor_finds_the_installed_plugin_mbsync_signs_in_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the plugin where libsasl2 looks, mbsync signs in and doctor says nothing."""
    if xoauth2_plugin() is None:
        pytest.skip("no Cyrus SASL XOAUTH2 plugin: apt-get install libsasl2-modules-kdexoauth2")
    monkeypatch.delenv("SASL_PATH", raising=False)
    run, missing = _mbsync_and_doctor(tmp_path, STORE_HOLDS_ACCOUNT)
    assert run.returncode == 0, run.stderr
    assert missing == []


def test_without_the_plugin_an_account_asking_for_oauth2_is_a_failure_whatever_else_it_lists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mbsync takes a mechanism that AuthMechs, the server and the installed plugins all
    have: with LOGIN listed beside XOAUTH2 it signs in without the plugin -- with a password,
    and fails with a token.  Doctor cannot tell which the command prints: a failure, saying
    OAuth2 is never used and what mbsync tries instead."""
    monkeypatch.setenv("SASL_PATH", str(tmp_path))  # no plugins at all
    listed = QUOTED_ACCOUNT.replace("AuthMech XOAUTH2", "AuthMechs XOAUTH2 LOGIN")
    run, missing = _mbsync_and_doctor(tmp_path, listed.replace("echo tok", "echo pw"))
    assert run.returncode == 0, run.stderr
    assert len(missing) == 1 and missing[0].serious, missing
    assert "never signs in with OAuth2; it tries LOGIN instead" in missing[0].problem
    assert "take XOAUTH2 out of AuthMechs" in missing[0].fix
    run, missing = _mbsync_and_doctor(tmp_path / "token", listed)
    assert run.returncode != 0 and len(missing) == 1 and missing[0].serious, missing


# A Group over two IMAP accounts of one server: one signs in with a password (LOGIN), the
# other with an OAuth2 token (XOAUTH2) that the server no longer takes.
GROUP_WITH_EXPIRED_TOKEN = """IMAPAccount pw
Host 127.0.0.1
Port {port}
User casey
PassCmd "echo pw"
SSLType None
AuthMechs LOGIN

IMAPAccount tok
Host 127.0.0.1
Port {port}
User casey
PassCmd "echo tok-expired"
SSLType None
AuthMechs XOAUTH2

IMAPStore pw-remote
Account pw

IMAPStore tok-remote
Account tok

MaildirStore ms-local
Path {root}/ms/
Inbox {root}/ms/INBOX

Channel inbox
Far :pw-remote:
Near :ms-local:
Patterns INBOX

Channel tokbox
Far :tok-remote:
Near :ms-local:
Patterns INBOX

Group all inbox tokbox:INBOX
"""


def test_a_sign_in_mbsync_gives_up_in_a_group_names_its_imap_account(tmp_path: Path) -> None:
    """mbsync gives up an XOAUTH2 sign-in the server refused, names no channel, and hangs;
    the run is stopped, and its error names the Group's IMAP account that asks for XOAUTH2."""
    require_tools()
    if xoauth2_plugin() is None:
        pytest.skip("no Cyrus SASL XOAUTH2 plugin: apt-get install libsasl2-modules-kdexoauth2")
    root = tmp_path / "mail"
    (root / "ms" / "INBOX").mkdir(parents=True)
    rc, toml = tmp_path / "mbsyncrc", tmp_path / "fmail.toml"
    toml.write_text(f'data_dir = "{tmp_path / "data"}"\n\n[mbsync]\nconfig = "{rc}"\n\n'
                    '[[accounts]]\nname = "ms"\nmaildir = "ms"\nmbsync_channel = "all"\n')
    with imapbed.ImapServer(tmp_path / "imap", users={"casey": "pw"},
                            tokens={"casey": "tok"}) as server:
        rc.write_text(GROUP_WITH_EXPIRED_TOKEN.format(root=root, port=server.port))
        [run] = run_mbsync(resolve(load_settings(toml), root), "ms", "pull", timeout=60)
    assert not run.ok and run.channel == "all"
    assert run.error.startswith("mbsync gave up signing in to IMAP account tok (channel "
                                "tokbox): the server did not take"), run.error
