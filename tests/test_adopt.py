"""First contact: init finds who the user is and creates what is missing; doctor finds what is
wrong with a setup and names the fix."""

from __future__ import annotations

import os
import sqlite3
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fmail_nm.adopt.hooks import kept_hook, legacy_kept_hook
from fmail_nm.adopt.identity import Identity, from_mbsync, from_msmtp
from fmail_nm.app import load_config
from fmail_nm.config import fmail_command, load_settings
from fmail_nm.service import doctor
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader
from fmail_nm.tools import reads

from .conftest import (EARLIER_POST_NEW_HOOK, USER_ADDRESSES, MailEnv, damage_index,
                       link_multicall_hook, make_mail_env, run_init)


def init_like_a_new_user(env: MailEnv) -> str:
    """No fmail.toml yet (FMAIL_CONFIG points at a missing file), no --address."""
    env.fmail_config.unlink()
    done = env.fmail("init", "--mail-root", str(env.mail_root))
    return done.stdout


def test_init_without_addresses_learns_them_from_the_sent_folders(mail_env: MailEnv) -> None:
    out = init_like_a_new_user(mail_env)
    assert mail_env.fmail_config.is_file()  # created, commented
    assert "config file not found" not in out
    for address in USER_ADDRESSES:
        assert f"address {address} (from Sent folder" in out
    nm = mail_env.notmuch("config", "list").stdout
    assert "user.primary_email=alex@example.org" in nm
    assert "user.other_email=alex.morgan@example.org;amorgan@acme.test" in nm
    assert "user.name=Alex Morgan" in nm
    # The user's mail was tagged as if the addresses had been given: sent mail is sent.
    sent = mail_env.notmuch("search", "--output=messages", "tag:sent").stdout.split()
    assert "id:wedding-2@example.org" in sent and "id:work-deep-2@acme.test" in sent
    assert mail_env.notmuch("count", "tag:sent AND tag:inbox").stdout.strip() == "0"
    config = load_config()
    with Reader(config.settings.notmuch_config) as reader:
        unanswered = reads.find_unanswered_threads(reads.Mailbox(config, reader),
                                                   since="2026-10-02")
        thread = reader.find("unanswered-2@example.org")
    assert thread is not None
    assert [t.thread for t in unanswered.threads] == [thread.thread_id]


def test_the_sent_folders_are_read_from_the_files_before_anything_is_indexed(
        mail_env: MailEnv) -> None:
    """So that init's first index knows the addresses without a notmuch new of its own."""
    mail_env.fmail_config.unlink()
    out = mail_env.fmail("init", "--no-index", "--mail-root", str(mail_env.mail_root)).stdout
    for address in USER_ADDRESSES:
        assert f"address {address} (from Sent folder" in out
    assert "name: Alex Morgan" in out or "Alex Morgan" in out
    assert mail_env.notmuch("count", "--exclude=false", "*").stdout.strip() == "0"


def test_the_tags_match_an_init_that_was_given_the_addresses(mail_env: MailEnv,
                                                             tmp_path: Path) -> None:
    init_like_a_new_user(mail_env)
    learnt = mail_env.notmuch("dump").stdout
    other = tmp_path / "given"
    other.mkdir()
    given = make_mail_env(other)
    run_init(given)
    assert sorted(learnt.splitlines()) == sorted(given.notmuch("dump").stdout.splitlines())


def test_addresses_from_mbsync_and_msmtp(tmp_path: Path) -> None:
    mbsync = tmp_path / "mbsyncrc"
    mbsync.write_text("IMAPAccount personal\nHost imap.example.org\nUser alex@example.org\n\n"
                      "IMAPAccount work\nHost imap.acme.test\nUser amorgan\n")
    msmtp = tmp_path / "msmtprc"
    msmtp.write_text("defaults\nauth on\n\naccount work\nhost smtp.acme.test\n"
                     "from amorgan@acme.test\n\naccount wild\nfrom *@example.net\n")
    identity = Identity()
    from_mbsync(identity, mbsync)
    from_msmtp(identity, msmtp)
    # "amorgan" is a login, not an address; a wildcard from is not one address either.
    assert identity.addresses == ["alex@example.org", "amorgan@acme.test"]
    assert "IMAPAccount personal" in identity.found[0].source
    assert "account work" in identity.found[1].source


def test_init_takes_addresses_from_mbsyncrc_and_msmtprc(mail_env: MailEnv) -> None:
    home = Path(mail_env.env["HOME"])
    (home / ".mbsyncrc").write_text("IMAPAccount personal\nHost imap.example.org\n"
                                    "User alex@example.org\n")
    (home / ".msmtprc").write_text("account work\nhost smtp.acme.test\nfrom amorgan@acme.test\n")
    for folder in ("personal/Sent", "work/Sent"):  # nothing to learn from Sent folders
        for sub in ("cur", "new"):
            for f in (mail_env.mail_root / folder / sub).glob("*"):
                f.unlink()
    out = init_like_a_new_user(mail_env)
    assert "address alex@example.org (from mbsync config ~/.mbsyncrc" in out
    assert "address amorgan@acme.test (from msmtp config ~/.msmtprc" in out
    nm = mail_env.notmuch("config", "list").stdout
    assert "user.primary_email=alex@example.org" in nm
    assert "user.other_email=amorgan@acme.test" in nm


def test_an_existing_notmuch_config_is_left_alone_and_told_the_command(
        mail_env: MailEnv) -> None:
    mail_env.notmuch_config.write_text(f"[database]\npath={mail_env.mail_root}\n[new]\n"
                                       "tags=inbox;unread\n")
    before = mail_env.notmuch_config.read_bytes()
    out = init_like_a_new_user(mail_env)
    assert mail_env.notmuch_config.read_bytes() == before
    assert ("notmuch config set user.primary_email alex@example.org" in out)
    assert "notmuch config set user.other_email 'alex.morgan@example.org;amorgan@acme.test'" in out


def test_init_refuses_a_mail_root_other_than_the_existing_configs(indexed: MailEnv) -> None:
    """`init --mail-root DIR` on a notmuch config whose mail root is another folder ignored
    DIR without a word (even one that does not exist): the user believed it set up."""
    before = indexed.notmuch_config.read_bytes()
    other = indexed.base / "Mail2"
    done = indexed.fmail("init", "--mail-root", str(other), "--no-index", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{indexed.notmuch_config} is for the mail in {indexed.mail_root}, not {other}" in \
        done.stderr and "--notmuch-config" in done.stderr, done.stderr
    assert indexed.notmuch_config.read_bytes() == before
    # The same folder by another path is the config's own.
    (indexed.base / "link").symlink_to(indexed.mail_root)
    indexed.fmail("init", "--mail-root", str(indexed.base / "link"), "--no-index")


def test_init_refuses_a_notmuch_config_other_than_the_one_fmail_toml_names(
        indexed: MailEnv) -> None:
    """`init --notmuch-config B` with an fmail.toml naming config A put our hook into B's
    hook folder while that hook, the index and every command went on using A: B's new mail
    never tagged, A's tagged on each `notmuch new` of B.  Nothing is changed instead."""
    indexed.fmail_config.write_text(f'[notmuch]\nconfig = "{indexed.notmuch_config}"\n')
    other_mail = indexed.base / "other-mail"
    for leaf in ("cur", "new", "tmp"):
        (other_mail / "INBOX" / leaf).mkdir(parents=True)
    other = indexed.base / "other-notmuch-config"
    other.write_text(f"[database]\npath={other_mail}\n")
    indexed.notmuch("--config", str(other), "new")
    done = indexed.fmail("init", "--notmuch-config", str(other), "--no-index", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (f"{indexed.fmail_config} names the notmuch config {indexed.notmuch_config}, not "
            f"{other}") in done.stderr, done.stderr
    assert not (other_mail / ".notmuch" / "hooks").exists()


def test_commands_name_a_missing_config_and_say_to_run_init(mail_env: MailEnv) -> None:
    mail_env.fmail_config.unlink()
    done = mail_env.fmail("index", check=False)
    assert done.returncode == 2
    assert str(mail_env.fmail_config) in done.stderr and "fmail-nm init" in done.stderr
    mail_env.fmail_config.write_text("")
    done = mail_env.fmail("index", check=False)
    assert done.returncode == 2
    assert str(mail_env.notmuch_config) in done.stderr and "fmail-nm init" in done.stderr


# ---------------------------------------------------------------------------------------------
# doctor


def checks(env: MailEnv, **kwargs: object) -> list[doctor.Finding]:
    return doctor.problems(doctor.diagnose(str(env.fmail_config), **kwargs))  # type: ignore[arg-type]


def test_a_healthy_setup_passes(indexed: MailEnv) -> None:
    home = Path(indexed.env["HOME"])
    (home / ".msmtprc").write_text("account personal\nfrom alex@example.org\n\n"
                                   "account alias\nfrom alex.morgan@example.org\n\n"
                                   "account work\nfrom amorgan@acme.test\n")
    (home / ".mbsyncrc").write_text(
        "".join(f"MaildirStore {a}-local\nPath {indexed.mail_root / a}/\n\n"
                f"Channel {a}\nNear :{a}-local:\nFar :{a}-remote:\nExpunge Both\n\n"
                for a in ("personal", "work")))
    assert checks(indexed) == []
    done = indexed.fmail("doctor", check=False)
    assert done.returncode == 0 and "no problems found" in done.stdout


def fixes(found: list[doctor.Finding], check: str) -> list[str]:
    return [f.fix for f in found if f.check == check]


def test_doctor_reports_each_broken_part_with_its_fix(indexed: MailEnv, tmp_path: Path) -> None:
    home = Path(indexed.env["HOME"])
    env = indexed
    # notmuch: no ignore list for mbsync's files, flag sync off
    env.notmuch("config", "set", "new.ignore", "")
    env.notmuch("config", "set", "maildir.synchronize_flags", "false")
    # mbsync: one channel outside the mail root without Expunge, the other one missing
    (home / ".mbsyncrc").write_text(f"MaildirStore personal-local\nPath {tmp_path}/elsewhere/\n\n"
                                    "Channel personal\nNear :personal-local:\nFar :p-remote:\n")
    # msmtp: no account sends as the work address
    (home / ".msmtprc").write_text("account personal\nfrom alex@example.org\n\n"
                                   "account alias\nfrom alex.morgan@example.org\n")
    # the token readable by others, a watch limit far too small
    token = tmp_path / "http-token"
    token.write_text("t")
    token.chmod(0o644)
    limit = tmp_path / "max_user_watches"
    limit.write_text("8\n")
    found = checks(env, token_file=token, watch_limit_file=limit)

    assert "notmuch config set new.ignore '.mbsyncstate;" in " ".join(fixes(found, "notmuch"))
    assert "notmuch config set maildir.synchronize_flags true" in fixes(found, "notmuch")
    mbsync = " ".join(f.problem for f in found if f.check == "mbsync")
    assert "outside notmuch's mail root" in mbsync and "channel work" in mbsync
    assert fixes(found, "expunge") == [f"add `Expunge Both` to Channel personal in "
                                       f"{home / '.mbsyncrc'}"]
    assert any("amorgan@acme.test" in f.problem for f in found if f.check == "msmtp")
    assert fixes(found, "token") == [f"chmod 600 {token}"]
    assert fixes(found, "inotify")[0].startswith("sudo sysctl fs.inotify.max_user_watches=")
    done = env.fmail("doctor", check=False)
    assert done.returncode == 1 and "fix: notmuch config set maildir.synchronize_flags true" \
        in done.stdout


def test_doctor_finds_mail_notmuch_new_passed_over(indexed: MailEnv) -> None:
    """A file that lands in the second notmuch new recorded for its folder is passed over
    until the folder changes (here: the folder's time put back, as after such a delivery)."""
    cur = indexed.mail_root / "personal" / "INBOX" / "cur"
    recorded = cur.stat().st_mtime_ns
    passed_over = cur / "1700000000.race.host:2,S"
    passed_over.write_bytes(b"From: Late <late@example.net>\nSubject: passed over\n"
                            b"Message-ID: <passed-over@example.net>\n\nhello\n")
    (cur / "1700000001.junk.host:2,S").write_bytes(b"\x00\x01 not mail")  # notmuch ignores it
    hour_ago = time.time() - 3600
    for name in ("1700000000.race.host:2,S", "1700000001.junk.host:2,S"):
        os.utime(cur / name, (hour_ago, hour_ago))
    (cur / "1700000002.fresh.host:2,S").write_bytes(  # a delivery the next run takes
        b"From: a@example.net\nMessage-ID: <fresh@example.net>\n\nhi\n")
    os.utime(cur, ns=(recorded, recorded))

    indexed.fmail("index")  # notmuch new: the folder looks unchanged
    assert indexed.notmuch("count", "id:passed-over@example.net").stdout.strip() == "0"
    found = [f for f in checks(indexed) if f.check == "index"]
    assert [(f.problem, f.fix) for f in found] == [(
        "1 message file(s) in the mail root are not in the index (e.g. personal/INBOX/cur/"
        "1700000000.race.host:2,S): notmuch new passed over them, and looks again only when "
        "their folder changes", "fmail-nm index --full-scan")]

    indexed.fmail("index", "--full-scan")
    assert indexed.notmuch("count", "id:passed-over@example.net").stdout.strip() == "1"
    assert not [f for f in checks(indexed) if f.check == "index"]


def test_doctor_names_a_damaged_or_missing_database_and_its_fix(indexed: MailEnv) -> None:
    before = checks(indexed)  # this setup's other findings (no mbsync/msmtp files here)
    assert not [f for f in before if f.check in ("database", "identity", "sidecar")]
    postlist, _ = damage_index(indexed)
    xapian = postlist.parent
    found = checks(indexed)
    database = [f for f in found if f.check == "database"]
    assert len(database) == 1, found
    assert "cannot be read" in database[0].problem
    assert f"xapian-check {xapian}" in database[0].problem
    assert database[0].fix.startswith(f"mv {xapian} {xapian}.damaged && fmail-nm init")
    assert [f for f in found if f.check != "database"] == before  # the other checks still ran
    done = indexed.fmail("doctor", check=False)
    assert done.returncode == 1 and f"fix: mv {xapian} {xapian}.damaged" in done.stdout
    xapian.rename(xapian.with_name("xapian.damaged"))  # half of the fix: now it is missing
    found = checks(indexed)
    assert [(f.check, f.fix) for f in found if f.check == "database"] == [
        ("database", "fmail-nm init")], found
    run_init(indexed)  # the other half
    assert checks(indexed) == before


def test_doctor_hook_checks(indexed: MailEnv) -> None:
    hook = indexed.mail_root / ".notmuch" / "hooks" / "post-new"
    hook.chmod(0o644)
    assert fixes(checks(indexed), "hook") == [f"chmod +x {hook}"]
    hook.unlink()
    assert fixes(checks(indexed), "hook") == ["fmail-nm init"]
    hook.write_text("#!/bin/sh\nafew --tag --new\n")
    hook.chmod(0o755)
    assert fixes(checks(indexed), "hook") == ["fmail-nm init (it keeps your hook and runs it first)"]
    indexed.fmail("init", "--mail-root", str(indexed.mail_root), "--no-index")
    assert fixes(checks(indexed), "hook") == []
    assert kept_hook(hook.parent, "post-new").is_file()  # afew's hook, chained


def test_doctor_names_a_missing_or_foreign_post_insert_hook(indexed: MailEnv) -> None:
    hook = indexed.mail_root / ".notmuch" / "hooks" / "post-insert"
    hook.unlink(missing_ok=True)
    assert [f for f in checks(indexed) if f.check == "hook"] == []  # not a failing setup
    [finding] = [f for f in doctor.diagnose(str(indexed.fmail_config)) if f.check == "hook"]
    assert finding.problem.startswith("fmail-nm's post-insert hook is not installed")
    assert finding.fix == "fmail-nm init"
    assert not finding.serious  # nothing is lost: the next notmuch new tags that mail
    users = "#!/bin/sh\nnotify-send 'mail filed'\n"
    hook.write_text(users)  # the user's own, put back
    hook.chmod(0o755)
    assert fixes(checks(indexed), "hook") == [
        "fmail-nm init (it keeps your hook and runs it first)"]
    indexed.fmail("init", "--mail-root", str(indexed.mail_root), "--no-index")
    assert fixes(checks(indexed), "hook") == []
    assert kept_hook(hook.parent, "post-insert").read_text() == users


def test_doctor_identity_and_sidecar(mail_env: MailEnv) -> None:
    mail_env.fmail_config.write_text("")  # no accounts, no addresses
    mail_env.notmuch_config.write_text(f"[database]\npath={mail_env.mail_root}\n")
    mail_env.notmuch("new", "--no-hooks")
    found = checks(mail_env)
    (identity,) = [f for f in found if f.check == "identity"]
    assert identity.fix.startswith("notmuch config set user.primary_email alex@example.org")
    assert fixes(found, "sidecar") == ["fmail-nm sidecar sync"]


def test_doctor_names_a_missing_config(mail_env: MailEnv) -> None:
    found = checks(mail_env)
    assert fixes(found, "notmuch") == ["fmail-nm init --mail-root ~/Mail (your Maildir root)"]
    mail_env.fmail_config.unlink()
    assert fixes(checks(mail_env), "config") == ["fmail-nm init"]


def test_get_sync_status_lists_the_problems(indexed: MailEnv) -> None:
    from fmail_nm.mcp.server import setup_problems
    indexed.notmuch("config", "set", "maildir.synchronize_flags", "false")
    problems = setup_problems(load_config())
    assert any("notmuch config set maildir.synchronize_flags true" in p for p in problems)


def test_the_token_check_passes_a_private_token(tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text("x")
    os.chmod(token, 0o600)
    assert doctor.token_findings(token) == []
    assert stat.S_IMODE(token.stat().st_mode) == 0o600


def test_init_on_a_used_notmuch_leaves_the_users_tags_on_mail_changed_meanwhile(
        mail_env: MailEnv) -> None:
    """A user's notmuch, indexed and tagged; a message archived by tag (-inbox +done) is read
    on the phone before init (mbsync renames its file with S). init's first index sees that
    change -- which is no new mail: the rules must not put it back in the inbox."""
    mail_env.notmuch_config.write_text(
        f"[database]\npath={mail_env.mail_root}\n[new]\ntags=inbox;unread\n"
        "[maildir]\nsynchronize_flags=true\n")
    mail_env.notmuch("new")
    mid = "html-only-1@coop.example.com"
    mail_env.notmuch("tag", "-inbox", "+done", "--", f"id:{mid}")
    [path] = mail_env.notmuch("search", "--output=files", f"id:{mid}").stdout.split()
    assert path.endswith(":2,")
    os.rename(path, path + "S")  # read on the phone; mbsync brought the flag
    before = {line.split(" -- ")[1]: line for line in mail_env.notmuch(
        "dump", "--include=tags").stdout.splitlines() if " -- " in line}

    init_like_a_new_user(mail_env)

    tags = set(mail_env.notmuch("search", "--output=tags", f"id:{mid}").stdout.split())
    assert "done" in tags and "inbox" not in tags and "unread" not in tags
    after = {line.split(" -- ")[1]: line for line in mail_env.notmuch(
        "dump", "--include=tags").stdout.splitlines() if " -- " in line}
    changed = [k for k in before if before[k] != after.get(k)]
    assert changed == [f"id:{mid}"]  # only the flag's own change


def test_a_notmuch_config_the_environment_chose_is_written_into_fmail_toml(
        mail_env: MailEnv) -> None:
    """init found the config through $NOTMUCH_CONFIG; an MCP client or systemd starts the
    server without it, and doctor then advised an init that made a second database."""
    init_like_a_new_user(mail_env)
    assert f'config = "{mail_env.notmuch_config}"' in mail_env.fmail_config.read_text()
    without = {k: v for k, v in {**os.environ, **mail_env.env}.items() if k != "NOTMUCH_CONFIG"}
    doctor = subprocess.run([sys.executable, "-m", "fmail_nm", "doctor"], env=without,
                            text=True, capture_output=True, timeout=120)
    assert "no notmuch config" not in doctor.stdout + doctor.stderr
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


@pytest.mark.parametrize("notmuch_config", [None, "/home/me/.notmuch-config"])
def test_every_key_of_the_written_fmail_toml_works_once_uncommented(
        tmp_path: Path, notmuch_config: str | None) -> None:
    """The user uncomments what they need: data_dir and addresses sat below the [notmuch]
    table init writes when it names a config, so they became the table's and did nothing; the
    send example had the -t sending refuses."""
    import re
    import tomllib

    from fmail_nm.adopt.initialize import write_fmail_toml
    from fmail_nm.config import load_settings

    path = tmp_path / "fmail.toml"
    write_fmail_toml(path, notmuch_config)
    uncommented = "\n".join(re.sub(r"^# (?=\[|[a-z_]+ = )", "", line)
                            for line in path.read_text().splitlines())
    path.write_text(uncommented)
    parsed = tomllib.loads(uncommented)
    assert {"data_dir", "addresses"} <= set(parsed) and set(parsed["notmuch"]) == {"config"}
    settings = load_settings(str(path))
    assert settings.addresses == ("me@example.org",) and settings.data_dir is not None
    [account] = settings.accounts
    assert "-t" not in account["send"]["command"]


def test_a_damaged_sidecar_is_a_doctor_finding_and_rebuild_sets_it_aside(
        indexed: MailEnv) -> None:
    """doctor, `sidecar rebuild` and init all stopped at "file is not a database"."""
    path = indexed.config().data_dir / "sidecar.sqlite3"
    for extra in ("-wal", "-shm"):
        path.with_name(path.name + extra).unlink(missing_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    doctor = indexed.fmail("doctor", check=False)
    assert doctor.returncode == 1
    assert "cannot be read (file is not a database)" in doctor.stdout
    assert "fix: fmail-nm sidecar rebuild" in doctor.stdout
    rebuilt = indexed.fmail("sidecar", "rebuild")
    assert "moved it to" in rebuilt.stdout and "sidecar rebuilt" in rebuilt.stdout
    [aside] = path.parent.glob("sidecar.sqlite3.damaged-*")
    assert aside.read_bytes() == b"this is not a database" * 100
    assert [f for f in checks(indexed) if f.check == "sidecar"] == []


@pytest.mark.parametrize(("version", "fix"), [
    (4, "fix: run `fmail-nm index` to migrate it"),
    (len(sidecar.MIGRATIONS) + 1, "fix: upgrade fmail-nm to use it")])
def test_a_sidecar_of_another_version_is_a_doctor_finding(indexed: MailEnv, version: int,
                                                           fix: str) -> None:
    """After an upgrade (or a downgrade) doctor stopped at the sidecar's schema, the other
    checks unsaid; it is one finding, with what brings the file to this version."""
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {version}")
    doctor = indexed.fmail("doctor", check=False)
    assert doctor.returncode == 1 and doctor.stderr == ""
    assert f"has schema {version}" in doctor.stdout or f"(schema {version} >" in doctor.stdout
    assert fix in doctor.stdout


def test_addresses_given_to_init_for_a_users_notmuch_config_are_used_and_told(
        mail_env: MailEnv) -> None:
    """--address was dropped when the notmuch config was the user's: saved nowhere, the
    user's own mail not tagged sent, and doctor then said no address was known."""
    mail_env.notmuch_config.write_text(f"[database]\npath={mail_env.mail_root}\n[new]\n"
                                       "tags=inbox;unread\n")
    mail_env.fmail_config.unlink()
    out = mail_env.fmail("init", "--address", "alex@example.org").stdout
    assert "notmuch config set user.primary_email alex@example.org" in out
    assert 'addresses = ["alex@example.org"]' in mail_env.fmail_config.read_text()
    assert "alex@example.org" in mail_env.config().addresses
    sent = mail_env.notmuch("count", "tag:sent").stdout.strip()
    assert int(sent) > 0


def test_doctor_sends_a_broken_fmail_toml_to_the_editor_not_to_init(indexed: MailEnv) -> None:
    """init cannot mend a fmail.toml it cannot read (it fails on the same error)."""
    indexed.fmail_config.write_text("[send\nenabled = true\n")
    [finding] = checks(indexed)
    assert finding.check == "config" and str(indexed.fmail_config) in finding.problem
    assert finding.fix == f"edit {indexed.fmail_config} where the message says"
    indexed.fmail_config.unlink()
    [missing] = checks(indexed)
    assert missing.fix == "fmail-nm init"


# ---------------------------------------------------------------------------------------------
# A user's own post-new hook, through init, doctor and real notmuch new


def users_notmuch_with_multicall_hook(env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's notmuch, indexed, with one hook script linked as both pre-new and post-new
    (:data:`~tests.conftest.MULTICALL_HOOK`); the log its branches write to."""
    env.notmuch_config.write_text(f"[database]\npath={env.mail_root}\n[new]\ntags=inbox;unread\n"
                                  "[maildir]\nsynchronize_flags=true\n")
    env.notmuch("new", "--no-hooks")
    link_multicall_hook(env.mail_root / ".notmuch" / "hooks", env.base / "bin" / "nm-hooks")
    log = env.base / "hook.log"
    monkeypatch.setenv("HOOK_LOG", str(log))
    return log


def branches_run_by_notmuch_new(env: MailEnv, log: Path) -> tuple[int, list[str]]:
    """notmuch new's exit status, and which branches of the user's hook script it ran."""
    log.unlink(missing_ok=True)
    done = env.notmuch("new", check=False)
    return done.returncode, log.read_text().splitlines()


def hook_findings(env: MailEnv) -> list[doctor.Finding]:
    return [f for f in doctor.diagnose(str(env.fmail_config)) if f.check == "hook"]


def test_init_keeps_a_multicall_hook_running_its_post_new_branch(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    log = users_notmuch_with_multicall_hook(mail_env, monkeypatch)
    assert branches_run_by_notmuch_new(mail_env, log) == (0, ["pre-new", "post-new"])
    mail_env.fmail("init", "--address", "alex@example.org")
    assert branches_run_by_notmuch_new(mail_env, log) == (0, ["pre-new", "post-new"])
    assert hook_findings(mail_env) == []


def test_doctor_and_init_move_a_hook_chained_the_earlier_way(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    log = users_notmuch_with_multicall_hook(mail_env, monkeypatch)
    hook_dir = mail_env.mail_root / ".notmuch" / "hooks"
    hook, legacy = hook_dir / "post-new", legacy_kept_hook(hook_dir, "post-new")
    # What an earlier init left: the user's link renamed, and its hook running it by that name.
    hook.rename(legacy)
    command = fmail_command(load_settings(str(mail_env.fmail_config)))
    hook.write_text(EARLIER_POST_NEW_HOOK.replace("@FMAIL_NM@", shlex.join(command)))
    hook.chmod(0o755)
    assert branches_run_by_notmuch_new(mail_env, log) == (1, ["pre-new", f"run as {legacy}"])

    finding, missing = hook_findings(mail_env)  # that version had no post-insert hook
    assert str(legacy) in finding.problem and "by its name" in finding.problem
    assert finding.fix.startswith("fmail-nm init")
    assert missing.problem.startswith("fmail-nm's post-insert hook is not installed")
    mail_env.fmail("init", "--address", "alex@example.org")
    kept = kept_hook(hook_dir, "post-new")
    assert not os.path.lexists(legacy)
    assert kept.is_symlink() and os.readlink(kept) == str(mail_env.base / "bin" / "nm-hooks")
    assert branches_run_by_notmuch_new(mail_env, log) == (0, ["pre-new", "post-new"])
    assert hook_findings(mail_env) == []


def test_doctors_advice_chains_a_hook_a_dotfiles_manager_put_back(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    log = users_notmuch_with_multicall_hook(mail_env, monkeypatch)
    mail_env.fmail("init", "--address", "alex@example.org")
    hook_dir = mail_env.mail_root / ".notmuch" / "hooks"
    hook, kept = hook_dir / "post-new", kept_hook(hook_dir, "post-new")
    script = mail_env.base / "bin" / "nm-hooks"
    hook.unlink()
    hook.symlink_to(script)  # `stow -R`, `home-manager switch`
    assert fixes(checks(mail_env), "hook") == [
        "fmail-nm init (it keeps your hook and runs it first)"]
    mail_env.fmail("init", "--address", "alex@example.org")
    assert hook_findings(mail_env) == []
    assert os.readlink(kept) == str(script)
    assert branches_run_by_notmuch_new(mail_env, log) == (0, ["pre-new", "post-new"])

    # Another hook put back: doctor and init name both, and keep both as they are.
    hook.unlink()
    hook.write_text("#!/bin/sh\necho another hook\n")
    hook.chmod(0o755)
    [finding] = hook_findings(mail_env)
    assert str(hook) in finding.problem and str(kept) in finding.problem
    assert finding.fix.startswith(f"merge them by hand into one hook at {kept}")
    done = mail_env.fmail("init", "--address", "alex@example.org", check=False)
    assert done.returncode != 0
    assert str(hook) in done.stderr and str(kept) in done.stderr
    assert hook.read_text() == "#!/bin/sh\necho another hook\n"
    assert os.readlink(kept) == str(script)


@pytest.mark.parametrize("broken", ["[database\npath={root}\n", "[database]\npath={root}\nnew\n"],
                         ids=["section", "line"])
def test_a_notmuch_config_notmuch_cannot_parse_is_named_as_such(indexed: MailEnv,
                                                                broken: str) -> None:
    """notmuch loads nothing from it, says only "cannot load config file", and lists no
    setting at all: init and doctor blamed a missing database.path."""
    path = indexed.notmuch_config
    path.write_text(broken.format(root=indexed.mail_root))
    before = path.read_bytes()
    said = f"notmuch could not parse its config file {path}"

    done = indexed.fmail("init", check=False)
    assert done.returncode != 0
    assert said in done.stderr and "(notmuch: Error: cannot load config file.)" in done.stderr
    assert "database" not in done.stderr.replace(str(path), "")
    [finding] = checks(indexed)
    assert finding.check == "config" and finding.problem.startswith(said)
    assert "database.path" not in finding.problem
    doctor = indexed.fmail("doctor", check=False)
    assert doctor.returncode == 1 and said in doctor.stdout
    assert path.read_bytes() == before  # the user's file, as they left it
