"""The command line on bad input: a clear error, nothing half-written, no silent wait.

Real notmuch, a real lock holder, real SQLite locks; every command runs as a subprocess with
the environment of the test's own temp dir (conftest.isolated_env).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fmail_nm.passes import DELIVERY_MIN_FILES

from .conftest import MailEnv, notmuch_lock_held, stderr_lines
from .test_first_index import init_without_index

# Generous: no machine is this slow at printing one line; a wait without notice never ends.
NOTICE_WAIT = 60.0


def deliver_bulk(env: MailEnv, n: int) -> None:
    new = env.mail_root / "personal" / "INBOX" / "new"
    for i in range(n):
        (new / f"1800000{i:03d}.bulk.host").write_text(
            f"From: sender{i}@example.net\nTo: alex@example.org\nSubject: bulk {i}\n"
            f"Message-ID: <bulk-{i}@example.net>\nDate: Wed, 02 Dec 2026 10:00:00 +0000\n\nx\n")


def index_under_lock(env: MailEnv) -> tuple[str, subprocess.CompletedProcess[str]]:
    """`fmail-nm index` while mutt or another notmuch new holds the write lock, released once
    the command wrote its first line on stderr (or gave up waiting for one): that line, and
    how the command ended."""
    argv = [sys.executable, "-m", "fmail_nm", "index", "--quiet"]
    with notmuch_lock_held(env.env) as holder:
        proc = subprocess.Popen(argv, env={**os.environ, **env.env}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            [line] = stderr_lines(proc, 1, within=NOTICE_WAIT)
            holder.release()  # once the lock is free, the index goes on and finishes
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return line, subprocess.CompletedProcess(argv, proc.returncode, out, err)


# Below DELIVERY_MIN_FILES notmuch new indexes a delivery; from there fmail-nm does, first.
@pytest.mark.parametrize("delivered", [10, DELIVERY_MIN_FILES + 10])
def test_index_says_it_is_waiting_for_a_write_lock_held_elsewhere(indexed: MailEnv,
                                                                  delivered: int) -> None:
    """notmuch new waits silently, without a bound; the user must be told what it waits for.
    A delivery fmail-nm indexes itself waited silently, then failed "busy" and indexed
    nothing."""
    deliver_bulk(indexed, delivered)
    line, done = index_under_lock(indexed)
    assert "waiting for the notmuch write lock" in line, (line, done.stderr)
    assert done.returncode == 0 and "indexed:" in done.stdout, done.stderr
    bulk = indexed.notmuch("count", "--exclude=false", "subject:bulk")
    assert int(bulk.stdout) == delivered


def test_a_first_index_says_it_is_waiting_for_a_write_lock_held_elsewhere(
        mail_env: MailEnv) -> None:
    """The first index of an empty database, fmail-nm's own, waited silently too, then
    failed "busy"."""
    init_without_index(mail_env)
    line, done = index_under_lock(mail_env)
    assert "waiting for the notmuch write lock" in line, (line, done.stderr)
    assert done.returncode == 0, done.stderr
    assert int(mail_env.notmuch("count", "--exclude=false", "*").stdout) > 0
    assert int(mail_env.notmuch("count", "tag:sent").stdout) > 0  # tagged by the pass


def test_a_failed_init_leaves_no_fmail_toml_behind(mail_env: MailEnv) -> None:
    """init writes fmail.toml first; when it then fails (a mistyped mail root) the file
    stayed, with the --address of that run, and the corrected run used its stale addresses:
    none of the user's own mail was tagged sent."""
    mail_env.fmail_config.unlink()
    failed = mail_env.fmail("init", "--mail-root", str(mail_env.base / "Mial"),
                            "--address", "alex@exmaple.org", check=False)
    assert failed.returncode != 0 and "does not exist" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert not mail_env.fmail_config.exists()
    mail_env.fmail("init", "--mail-root", str(mail_env.mail_root), "--address",
                   "alex@example.org", "--address", "amorgan@acme.test")
    assert int(mail_env.notmuch("count", "tag:sent").stdout) > 0


def _damage(sidecar: Path) -> None:
    for extra in ("-wal", "-shm"):
        sidecar.with_name(sidecar.name + extra).unlink(missing_ok=True)
    sidecar.write_bytes(b"this is not an SQLite file " * 1000)


def _sidecar(env: MailEnv) -> Path:
    return Path(env.env["XDG_DATA_HOME"]) / "fmail-nm" / "sidecar.sqlite3"


def test_a_damaged_sidecar_is_named_with_its_fix(indexed: MailEnv) -> None:
    """SQLite's bare "file is not a database" reads like the notmuch database is broken;
    the user must learn it is the sidecar, and that `fmail-nm sidecar rebuild` mends it."""
    _damage(_sidecar(indexed))
    done = indexed.fmail("contacts", "search", "anna", check=False)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert str(_sidecar(indexed)) in done.stderr and "fmail-nm sidecar rebuild" in done.stderr


def test_a_missing_sidecar_is_named_as_missing_with_its_fix(indexed: MailEnv) -> None:
    """`sidecar check` with the sidecar deleted said it was "built from another notmuch
    database (uuid differs)" -- and left an empty sidecar behind."""
    _sidecar(indexed).unlink()
    done = indexed.fmail("sidecar", "check", check=False)
    assert done.returncode == 1 and "uuid differs" not in done.stdout + done.stderr
    assert done.stderr.startswith(f"fmail-nm: the sidecar {_sidecar(indexed)} is missing")
    assert "fmail-nm sidecar rebuild" in done.stderr
    assert not _sidecar(indexed).exists()


def test_a_busy_sidecar_is_named_and_nothing_is_changed(indexed: MailEnv) -> None:
    """Another process writing the sidecar: the user is told which database is busy and to
    retry; the block is not half made (no mail tagged blocked)."""
    conn = sqlite3.connect(_sidecar(indexed), isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        done = indexed.fmail("contacts", "block", "winner@prizes.example.net", check=False)
    finally:
        conn.close()
    assert done.returncode == 1
    assert "sidecar" in done.stderr and "retry" in done.stderr, done.stderr
    assert indexed.notmuch("count", "--exclude=false", "tag:blocked").stdout.strip() == "0"


@pytest.mark.parametrize("prefix", [
    'notmuch = "~/.notmuch-config"',
    "index = 15",
    'tagging = "none"',
    "data_dir = 5",
    '[mbsync]\nconfig = 5',
])
def test_an_fmail_toml_with_a_value_of_the_wrong_kind_is_named(indexed: MailEnv,
                                                               prefix: str) -> None:
    """A table written as a value (or a path as a number) is a mistake in fmail.toml: the
    user gets the file and the key, not a Python traceback."""
    text = indexed.fmail_config.read_text()
    indexed.fmail_config.write_text(prefix + "\n" + text)
    done = indexed.fmail("index", check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert str(indexed.fmail_config) in done.stderr


def test_contacts_options_may_come_between_the_action_and_its_addresses(indexed: MailEnv) -> None:
    """`fmail-nm contacts block --no-push ADDR` (the README's own words, in the usual order)
    was refused as "unrecognized arguments: ADDR", naming the address as the mistake."""
    done = indexed.fmail("contacts", "block", "--no-push", "winner@prizes.example.net",
                         check=False)
    assert done.returncode == 0, done.stderr
    assert "blocked: winner@prizes.example.net" in done.stdout
    assert int(indexed.notmuch("count", "--exclude=false", "tag:blocked").stdout) > 0
    found = indexed.fmail("contacts", "search", "--blocked", "winner", check=False)
    assert found.returncode == 0 and "winner@prizes.example.net" in found.stdout, found.stderr


@pytest.mark.parametrize("port", ["99999", "0", "http"])
def test_a_port_out_of_range_is_named(indexed: MailEnv, port: str) -> None:
    done = indexed.fmail("serve", "--transport", "http", "--port", port, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--port" in done.stderr and "port" in done.stderr.split("--port", 1)[1]


@pytest.mark.parametrize("limit", ["-5", "0", "many"])
def test_a_contacts_limit_that_is_no_count_is_refused(indexed: MailEnv, limit: str) -> None:
    """`--limit -5` was taken, and SQLite reads a negative LIMIT as none at all."""
    done = indexed.fmail("contacts", "--limit", limit, "search", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--limit" in done.stderr and "1 or more" in done.stderr, done.stderr


def test_a_folder_role_given_a_number_is_named(indexed: MailEnv) -> None:
    """`inbox = 5` under [accounts.folders] (quotes forgotten) was read as the folder 5."""
    text = indexed.fmail_config.read_text()
    assert 'inbox = "INBOX"' in text
    indexed.fmail_config.write_text(text.replace('inbox = "INBOX"', "inbox = 5", 1))
    done = indexed.fmail("index", "--quiet", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert 'folder for inbox must be a folder name in quotes (e.g. inbox = "INBOX"), not 5' \
        in done.stderr
