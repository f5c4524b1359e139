"""Adopting a user's own setup as notmuch reads it: the hook's working directory, fmail.toml's
paths, notmuch profiles, list settings with regexes and spaces, and giving the user's hook
back on uninstall.  Real notmuch in an isolated HOME."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fmail_nm.adopt.initialize import notmuch_findings
from fmail_nm.app import load_config
from fmail_nm.service import doctor
from fmail_nm.store.notmuch import Reader

from .conftest import FIXTURE_MAILDIR, MailEnv, isolated_env, run_init


def _notmuch_new_from(env: MailEnv, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``notmuch new`` (hooks included) started from ``cwd``, as a user's shell or mbsync's
    PostSyncCmd would start it."""
    return subprocess.run(["notmuch", "new"], env={**os.environ, **env.env}, cwd=cwd, text=True,
                          capture_output=True, timeout=120, check=False)


# ---------------------------------------------------------------------------------------------
# The hook must not import Python modules from the directory notmuch new was started in


def test_the_hook_ignores_python_modules_in_the_directory_notmuch_new_runs_in(
        indexed: MailEnv, tmp_path: Path) -> None:
    project = tmp_path / "some project"
    project.mkdir()
    pwned = tmp_path / "pwned"
    # A file of the user's that happens to share a standard module's name.
    (project / "argparse.py").write_text(
        f"open({str(pwned)!r}, 'w').close()\nraise SystemExit('not the real argparse')\n")
    done = _notmuch_new_from(indexed, project)
    assert not pwned.exists(), "the hook ran code from the current directory"
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hook" not in (done.stdout + done.stderr).lower()


# ---------------------------------------------------------------------------------------------
# fmail.toml's [notmuch] config: "~" (the commented example init writes) and relative paths


def test_a_notmuch_config_named_with_a_tilde_in_fmail_toml_is_found(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path(indexed.env["HOME"])
    moved = home / ".notmuch-config"
    indexed.notmuch_config.rename(moved)
    text = indexed.fmail_config.read_text()
    indexed.fmail_config.write_text('[notmuch]\nconfig = "~/.notmuch-config"\n\n' + text)
    env = {k: v for k, v in indexed.env.items() if k != "NOTMUCH_CONFIG"}
    monkeypatch.delenv("NOTMUCH_CONFIG")
    assert load_config().mail_root == indexed.mail_root
    assert [f for f in doctor.diagnose() if f.check in ("config", "notmuch")] == []
    done = subprocess.run(["notmuch", f"--config={moved}", "new"], env={**os.environ, **env},
                          text=True, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0 and "hook" not in done.stderr.lower(), done.stderr


def test_init_writes_a_relative_notmuch_config_into_fmail_toml_as_an_absolute_path(
        mail_env: MailEnv) -> None:
    mail_env.fmail_config.unlink()
    base = mail_env.base
    done = subprocess.run(
        [*_fmail_argv(), "init", "--mail-root", "mail", "--notmuch-config", "notmuch-config",
         "--address", "alex@example.org", "--no-index"],
        env={**os.environ, **mail_env.env}, cwd=base, text=True, capture_output=True,
        timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    # The hook runs where notmuch new was started: the path must not depend on that.
    assert f'config = "{base / "notmuch-config"}"' in mail_env.fmail_config.read_text()


def _fmail_argv() -> list[str]:
    return [sys.executable, "-m", "fmail_nm"]


# ---------------------------------------------------------------------------------------------
# new.ignore / search.exclude_tags as notmuch reads them: /regex/ entries, spaces around ';'


STATE_FILES_BY_REGEX = r"/\.mbsyncstate/;/\.uidvalidity$/"


def test_mbsync_state_files_ignored_by_a_regex_are_not_a_problem() -> None:
    nm = {"new.ignore": STATE_FILES_BY_REGEX, "search.exclude_tags": "deleted;spam",
          "maildir.synchronize_flags": "true", "new.tags": "inbox;unread"}
    assert notmuch_findings(nm) == []


def test_lists_with_spaces_around_the_semicolons_read_as_notmuch_reads_them() -> None:
    nm = {"new.ignore": ".mbsyncstate; .mbsyncstate.journal; .mbsyncstate.new; "
                        ".mbsyncstate.lock; .uidvalidity",
          "search.exclude_tags": "deleted; spam", "maildir.synchronize_flags": "true",
          "new.tags": "inbox; unread"}
    assert notmuch_findings(nm) == []


def test_doctor_passes_a_regex_new_ignore_that_notmuch_new_honours(indexed: MailEnv) -> None:
    indexed.notmuch("config", "set", "new.ignore", STATE_FILES_BY_REGEX)
    (indexed.mail_root / "personal" / "INBOX" / ".mbsyncstate").write_text("FarUidValidity 1\n")
    (indexed.mail_root / "personal" / "INBOX" / ".uidvalidity").write_text("1\n2\n")
    quiet = indexed.notmuch("new")
    assert "mbsyncstate" not in quiet.stdout + quiet.stderr  # notmuch new ignores them
    assert [f for f in doctor.diagnose() if f.check == "notmuch"] == []


def test_a_regex_with_a_posix_class_is_left_to_notmuch_new(indexed: MailEnv) -> None:
    """``/Old[[:digit:]]+/`` is a POSIX bracket expression to notmuch, a set of characters
    to Python: the folder notmuch new passes over is not "mail it missed" to the doctor."""
    from fmail_nm.passes.indexing import unreadable_ignore

    ignore = indexed.notmuch("config", "get", "new.ignore").stdout.split()
    setting = ";".join([*ignore, "/Old[[:digit:]]+/"])
    indexed.notmuch("config", "set", "new.ignore", setting)
    old = indexed.mail_root / "personal" / "Old2019"
    for sub in ("cur", "new", "tmp"):
        (old / sub).mkdir(parents=True)
    (old / "cur" / "1.host:2,S").write_bytes(
        b"From: Old <old@example.net>\nTo: alex@example.org\nSubject: ancient\n"
        b"Message-ID: <old-1@example.net>\nDate: Sat, 30 Nov 2019 10:00:00 +0000\n\nold\n")
    os.utime(old / "cur" / "1.host:2,S", (1_500_000_000, 1_500_000_000))  # settled long ago
    indexed.notmuch("new")
    assert indexed.notmuch("count", "--exclude=false", "id:old-1@example.net").stdout == "0\n"
    assert [f for f in doctor.diagnose() if f.check == "index"] == []
    assert unreadable_ignore(setting) is not None  # the first index leaves it to notmuch new
    assert unreadable_ignore("/[^a[:space:]]/") is not None
    assert unreadable_ignore(r"/.*[.]mbsyncstate/;/\[:/") is None  # a dot, a bracket: alike


def test_an_address_listed_after_a_space_is_one_notmuch_knows() -> None:
    from fmail_nm.adopt.identity import Identity, missing_from_notmuch
    identity = Identity()
    for address in ("alex@example.org", "amorgan@acme.test"):
        identity.add(address, "test")
    nm = {"user.primary_email": "alex@example.org", "user.name": "Alex",
          "user.other_email": "old@example.org; amorgan@acme.test"}
    assert missing_from_notmuch(identity, nm) == []


ACE = "alex@xn--bcher-kva.example"  # alex@bücher.example, its domain as mail carries it


def test_one_address_with_its_domain_in_unicode_and_in_ace_is_found_once(
        tmp_path: Path) -> None:
    """The mbsync login wrote the domain in ACE, the msmtp from in Unicode: init wrote both
    into the notmuch config, and advised adding to notmuch an address it had already."""
    from fmail_nm.adopt.identity import Identity, from_mbsync, from_msmtp, missing_from_notmuch
    mbsync = tmp_path / "mbsyncrc"
    mbsync.write_text(f"IMAPAccount books\nHost imap.example.org\nUser {ACE}\n")
    msmtp = tmp_path / "msmtprc"
    msmtp.write_text("account books\nhost smtp.example.org\nfrom Alex@Bücher.example\n",
                     encoding="utf-8")
    identity = Identity()
    from_mbsync(identity, mbsync)
    from_msmtp(identity, msmtp)
    assert identity.addresses == [ACE]  # the first form found, as written
    nm = {"user.primary_email": "alex@bücher.example", "user.name": "Alex"}
    assert missing_from_notmuch(identity, nm) == []


def test_a_sent_folder_counts_one_address_however_its_domain_is_written(
        indexed: MailEnv) -> None:
    """Each form was counted apart, so an address the user wrote half of its mail from in
    each form could fall short of the share either form needs."""
    from fmail_nm.adopt.identity import SENT_SHARE, Identity, from_sent_folders
    sent = indexed.mail_root / "personal" / "Sent" / "cur"
    total = len(list(sent.iterdir())) + 2
    while SENT_SHARE * total <= 1:  # each form alone falls short of the share
        total += 1
    for n in range(total - len(list(sent.iterdir()))):
        sender = ACE if n == 0 else "alex@bücher.example" if n == 1 else "alex@example.org"
        year = 2025 if n == 0 else 2024  # the newest message is read first
        (sent / f"170000{n:04d}.idn_{n}.host:2,S").write_text(
            f"From: Alex <{sender}>\nTo: someone@example.net\nSubject: {n}\n"
            f"Date: Mon, 1 Jan {year} 10:00:00 +0000\nMessage-ID: <idn-{n}@example.org>\n"
            "\ntext\n", encoding="utf-8")
    identity = Identity()
    from_sent_folders(identity, load_config(), None)
    books = [a for a in identity.addresses if a.endswith(("bücher.example", "kva.example"))]
    assert books == [ACE], identity.found


def test_a_sent_folder_finds_the_user_named_last_comma_first(indexed: MailEnv) -> None:
    """Exchange and Outlook write the user's name "Doe, Jane": quoted, or in an encoded word,
    which notmuch's From decodes to an unquoted 'Doe, Jane <jane@…>' -- read as two
    addresses, the first "Doe", it gave no address; from the index or from the files, both
    forms give the user's address and name."""
    from fmail_nm.adopt.identity import Identity, from_sent_folders
    forms = {"personal/Sent": ('"Doe, Jane" <jane@example.com>', "jane@example.com"),
             "work/Sent": ("=?utf-8?q?Doe=2C_Jane?= <jane.doe@corp.example>",
                           "jane.doe@corp.example")}
    for folder, (sender, _) in forms.items():
        cur = indexed.mail_root / folder / "cur"
        for old in cur.iterdir():  # Jane's mail alone: her name is the most common
            old.unlink()
        for n in range(2):
            (cur / f"170000{n:04d}.doe_{n}.host:2,S").write_text(
                f"From: {sender}\nTo: someone@example.net\nSubject: {n}\n"
                f"Date: Mon, 1 Jan 2024 10:00:0{n} +0000\n"
                f"Message-ID: <doe-{n}@{folder.replace('/', '.')}>\n\ntext\n")
    indexed.notmuch("new", "--no-hooks")
    config = load_config()
    from_files = Identity()
    from_sent_folders(from_files, config, None)
    with Reader(config.settings.notmuch_config) as reader:
        from_index = Identity()
        from_sent_folders(from_index, config, reader)
    for identity in (from_files, from_index):
        assert identity.addresses == [address for _, address in forms.values()], identity.found
        assert identity.name == "Doe, Jane"


# ---------------------------------------------------------------------------------------------
# NOTMUCH_PROFILE: the profile picks the hook folder (and a default database) too


PROFILE_CONFIG = """[database]
mail_root=Mail
path=.local/share/notmuch/work
[user]
primary_email=alex@example.org
[new]
tags=inbox;unread
ignore=.mbsyncstate;.uidvalidity;.mbsyncstate.journal;.mbsyncstate.new;.mbsyncstate.lock
[search]
exclude_tags=deleted;spam
"""

USER_HOOK = '#!/bin/sh\necho "my hook ran" >> "{marker}"\n'


def test_a_profile_init_was_run_with_still_holds_without_notmuch_profile_set(
        tmp_path: Path) -> None:
    """Set up under NOTMUCH_PROFILE=work; then fmail-nm runs as systemd or an MCP client
    starts it, without that variable: notmuch must still run the profile's hooks."""
    env = {**os.environ, **isolated_env(tmp_path)}
    for name in ("NOTMUCH_CONFIG", "FMAIL_CONFIG", "NOTMUCH_PROFILE"):
        env.pop(name, None)
    home, xdg = Path(env["HOME"]), Path(env["XDG_CONFIG_HOME"])
    shutil.copytree(FIXTURE_MAILDIR, home / "Mail", symlinks=True)
    (home / ".local/share/notmuch/work").mkdir(parents=True)
    hooks = xdg / "notmuch" / "work" / "hooks"
    hooks.mkdir(parents=True)
    (xdg / "notmuch" / "work" / "config").write_text(PROFILE_CONFIG)
    marker = tmp_path / "marker"
    (hooks / "post-new").write_text(USER_HOOK.format(marker=marker))
    (hooks / "post-new").chmod(0o755)
    profile = {**env, "NOTMUCH_PROFILE": "work"}
    subprocess.run(["notmuch", "new"], env=profile, check=True, capture_output=True)
    run = [*_fmail_argv()]
    subprocess.run([*run, "init", "--no-index"], env=profile, check=True, capture_output=True)
    marker.unlink(missing_ok=True)

    done = subprocess.run([*run, "index"], env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert marker.exists(), "notmuch new ran without the profile's hooks"
    assert marker.read_text() == "my hook ran\n"
    doctor_run = subprocess.run([*run, "doctor"], env=env, text=True, capture_output=True,
                                timeout=300)
    assert "[hook]" not in doctor_run.stdout, doctor_run.stdout
    # procmail delivering under the profile: the profile's post-insert hook tags the mail.
    subprocess.run(["notmuch", "insert", "--create-folder", "--folder=lists"], env=profile,
                   input=b"From: r@lists.example.com\nList-Id: <r.lists.example.com>\n"
                         b"Message-ID: <listed@example.com>\n\nhi\n", check=True)
    tags = subprocess.run(["notmuch", "search", "--output=tags", "id:listed@example.com"],
                          env=profile, text=True, capture_output=True, check=True).stdout
    assert tags.split() == ["list", "list/r.lists.example.com", "unread"]


# ---------------------------------------------------------------------------------------------
# NOTMUCH_DATABASE and MAILDIR: where notmuch finds the database, from the environment only


def _small_mail(root: Path, mid: str) -> None:
    inbox = root / "INBOX" / "cur"
    inbox.mkdir(parents=True, exist_ok=True)
    (root / "INBOX" / "new").mkdir(exist_ok=True)
    (root / "INBOX" / "tmp").mkdir(exist_ok=True)
    (inbox / f"{mid}:2,S").write_text(
        f"From: Nia <nia@example.com>\nTo: alex@example.org\nSubject: {mid}\n"
        f"Message-ID: <{mid}@example.com>\nDate: Tue, 01 Dec 2026 10:00:00 +0000\n\nhi\n")


@pytest.mark.parametrize("variable", ["NOTMUCH_DATABASE", "MAILDIR"])
def test_a_database_the_environment_located_at_init_is_found_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    """init under $NOTMUCH_DATABASE (the database, apart from the config's mail_root) or
    $MAILDIR (the mail, database inside, for a config naming neither); then fmail-nm runs as
    an MCP client or systemd starts it, without that variable: it must reach that database,
    not another one or none."""
    env = {**os.environ, **isolated_env(tmp_path)}
    env.pop("NOTMUCH_DATABASE", None), env.pop("MAILDIR", None)
    mail = tmp_path / "mail"
    _small_mail(mail, "first")
    config = Path(env["NOTMUCH_CONFIG"])
    where = {"NOTMUCH_DATABASE": str(tmp_path / "db"), "MAILDIR": str(mail)}[variable]
    Path(where).mkdir(exist_ok=True)  # notmuch makes no database folder of its own
    config.write_text(("[database]\nmail_root=" + str(mail) + "\n" if variable == "NOTMUCH_DATABASE"
                       else "") + "[user]\nprimary_email=alex@example.org\n")
    located = {**env, variable: where}
    subprocess.run([*_fmail_argv(), "init"], env=located, check=True, capture_output=True,
                   timeout=300)
    assert "[notmuch]" in Path(env["FMAIL_CONFIG"]).read_text()
    without = subprocess.run(["notmuch", "count", "*"], env=env, text=True, capture_output=True,
                             timeout=60)
    assert without.stdout.strip() != "1"  # notmuch alone, unset: another database, or none

    _small_mail(mail, "later")
    done = subprocess.run([*_fmail_argv(), "index", "--quiet"], env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count = subprocess.run(["notmuch", "count", "*"], env=located, text=True,
                           capture_output=True, timeout=60, check=True)
    assert count.stdout == "2\n"  # the index run reached the database init set up
    for name in ("NOTMUCH_DATABASE", "MAILDIR", "NOTMUCH_CONFIG", "NOTMUCH_PROFILE"):
        monkeypatch.setenv(name, "")  # so that what the loader sets is undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", env["HOME"])
    monkeypatch.setenv("FMAIL_CONFIG", env["FMAIL_CONFIG"])
    loaded = load_config()  # puts the variable back, for libnotmuch in this process
    from fmail_nm.store.notmuch import Reader
    with Reader(loaded.settings.notmuch_config) as reader:
        assert set(reader.message_ids("*")) == {"first@example.com", "later@example.com"}


def test_maildir_is_recorded_only_where_it_locates_the_database(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$MAILDIR is the user's shell's, read by other programs too: fmail.toml pins it only when
    notmuch would find the database elsewhere without it."""
    from fmail_nm.store.notmuch_cli import database_located_by_environment
    for name, value in isolated_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NOTMUCH_DATABASE", raising=False)
    monkeypatch.delenv("NOTMUCH_PROFILE", raising=False)
    monkeypatch.setenv("MAILDIR", str(tmp_path / "mail"))
    config = tmp_path / "notmuch-config"
    config.write_text("[user]\nprimary_email=alex@example.org\n")
    assert database_located_by_environment(config) == {"maildir": str(tmp_path / "mail")}
    config.write_text(f"[database]\npath={tmp_path / 'db'}\n")  # the config decides
    assert database_located_by_environment(config) == {}
    monkeypatch.setenv("NOTMUCH_DATABASE", str(tmp_path / "elsewhere"))  # decides over both
    assert database_located_by_environment(config) == {"database": str(tmp_path / "elsewhere")}


# ---------------------------------------------------------------------------------------------
# Removing fmail-nm: the user's own hook goes back where it was


@pytest.mark.parametrize("kind", ["relative link", "file"])
def test_uninstall_puts_the_users_own_hook_back_as_it_was(mail_env: MailEnv, tmp_path: Path,
                                                          kind: str) -> None:
    from fmail_nm.adopt.hooks import KEPT_DIR, is_ours

    hooks = mail_env.mail_root / ".notmuch" / "hooks"
    hooks.mkdir(parents=True)
    marker = tmp_path / "marker"
    script = tmp_path / "dotfiles" / "post-new"
    script.parent.mkdir()
    script.write_text(USER_HOOK.format(marker=marker))
    script.chmod(0o750)
    hook = hooks / "post-new"
    if kind == "file":
        hook.write_bytes(script.read_bytes())
        hook.chmod(0o750)
    else:
        hook.symlink_to(os.path.relpath(script, hooks))
    before = os.readlink(hook) if hook.is_symlink() else hook.read_bytes()
    run_init(mail_env)
    assert is_ours(hook)

    done = mail_env.fmail("uninstall", check=False)
    assert done.returncode == 0, done.stderr
    assert (os.readlink(hook) if hook.is_symlink() else hook.read_bytes()) == before
    assert hook.is_symlink() == (kind != "file")
    assert sorted(p.name for p in hooks.iterdir()) == ["post-new"]
    assert not (hooks / KEPT_DIR).exists()
    marker.unlink(missing_ok=True)
    mail_env.notmuch("new")
    assert marker.read_text() == "my hook ran\n"  # run by notmuch itself, from its place


def test_uninstall_without_the_notmuch_config_names_it_and_changes_nothing(
        mail_env: MailEnv, tmp_path: Path) -> None:
    """The notmuch config gone (moved, deleted before fmail-nm): uninstall said "notmuch names
    no hook folder (no database yet?): nothing to take out" -- as if no hook of ours were
    left.  It must name the missing config and say that the hook was not taken out."""
    from fmail_nm.adopt.hooks import is_ours

    run_init(mail_env)
    hook = mail_env.mail_root / ".notmuch" / "hooks" / "post-new"
    assert is_ours(hook)
    aside = tmp_path / "notmuch-config.aside"
    mail_env.notmuch_config.rename(aside)

    done = mail_env.fmail("uninstall", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    said = " ".join(done.stderr.split())
    assert f"notmuch config not found: {mail_env.notmuch_config}" in said
    assert "nothing was taken out" in said and "nothing to take out" not in said
    assert "fmail-nm uninstall" in said  # what to do about it
    assert is_ours(hook) and not mail_env.notmuch_config.exists()

    aside.rename(mail_env.notmuch_config)  # with the config back, uninstall finds the hook
    assert mail_env.fmail("uninstall").returncode == 0
    assert not hook.exists()


def test_doctor_names_a_hook_an_earlier_version_installed_and_init_renews_it(
        mail_env: MailEnv) -> None:
    run_init(mail_env)
    hook = mail_env.mail_root / ".notmuch" / "hooks" / "post-new"
    # The hook as versions before `-P` wrote it: it imports from notmuch new's directory.
    hook.write_text(hook.read_text().replace(" -P -m fmail_nm", " -m fmail_nm"))

    def hook_findings() -> list[doctor.Finding]:
        return [f for f in doctor.diagnose(str(mail_env.fmail_config)) if f.check == "hook"]

    found = hook_findings()
    assert [(f.problem, f.fix, f.serious) for f in found] == [
        (f"{hook} is not the hook this fmail-nm would install (an earlier version's, or "
         "another config's)", "fmail-nm init", False)]
    run_init(mail_env)
    assert " -P -m fmail_nm" in hook.read_text()
    assert hook_findings() == []


def test_a_hook_kept_already_is_never_overwritten(tmp_path: Path) -> None:
    """Two inits at once: between one's check and its move, the other may have kept the
    user's hook already; moving a second hook there must fail, not replace it."""
    from fmail_nm.adopt.hooks import _move_keeping_target
    kept = tmp_path / "before-fmail-nm" / "post-new"
    kept.parent.mkdir()
    kept.write_text("#!/bin/sh\necho the user's hook\n")
    other = tmp_path / "post-new"
    other.write_text("#!/bin/sh\necho another hook\n")
    with pytest.raises(FileExistsError):
        _move_keeping_target(other, kept)
    assert kept.read_text() == "#!/bin/sh\necho the user's hook\n"
    assert other.read_text() == "#!/bin/sh\necho another hook\n"
