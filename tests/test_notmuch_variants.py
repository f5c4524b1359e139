"""A notmuch setup as users of notmuch 0.3x write it: the config in
``$XDG_CONFIG_HOME/notmuch/default/config``, the database in ``$XDG_DATA_HOME/notmuch/default``
apart from the mail (``database.mail_root``), lists with spaces after the ``;``, a tag of the
user's own in ``new.tags`` (and, for drafts, flag sync off).  What fmail-nm reads, hides and
tags is what notmuch does.  Real notmuch in an isolated HOME; the setup is shared by the
module's tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from fmail_nm.config import resolve
from fmail_nm.passes.changes import WriteContext
from fmail_nm.service import doctor
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader, Writer
from fmail_nm.tools import compose, reads

from .conftest import MailEnv, make_mail_env

USERS_CONFIG = """\
[database]
mail_root={root}
[user]
name=Alex Morgan
primary_email=alex@example.org
other_email=alex.morgan@example.org; amorgan@acme.test
[new]
tags=unread;inbox;work
ignore=.mbsyncstate; .mbsyncstate.journal; .mbsyncstate.new; .mbsyncstate.lock; .uidvalidity
[search]
exclude_tags=deleted; spam
"""


@pytest.fixture(scope="module")
def users_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MailEnv]:
    """``fmail-nm init`` on that setup, with no fmail.toml: the addresses come from notmuch."""
    env = make_mail_env(tmp_path_factory.mktemp("variants"))
    del env.env["NOTMUCH_CONFIG"]
    env.fmail_config.unlink()
    env.notmuch_config = Path(env.env["XDG_CONFIG_HOME"]) / "notmuch" / "default" / "config"
    env.notmuch_config.parent.mkdir(parents=True)
    env.notmuch_config.write_text(USERS_CONFIG.format(root=env.mail_root))
    (Path(env.env["XDG_DATA_HOME"]) / "notmuch" / "default").mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("NOTMUCH_CONFIG", raising=False)
        mp.delenv("NOTMUCH_PROFILE", raising=False)
        for key, value in env.env.items():
            mp.setenv(key, value)
        env.fmail("init")
        yield env


@pytest.fixture
def mb(users_setup: MailEnv) -> Iterator[reads.Mailbox]:
    with Reader() as reader:
        yield reads.Mailbox(users_setup.config(), reader)


def cli_count(env: MailEnv, *args: str) -> int:
    """What ``notmuch count`` says, search.exclude_tags applied as notmuch applies it."""
    return int(env.notmuch("count", *args).stdout)


def test_the_database_lives_apart_from_the_mail(users_setup: MailEnv) -> None:
    database = Path(users_setup.notmuch("config", "get", "database.path").stdout.strip())
    assert database == Path(users_setup.env["XDG_DATA_HOME"]) / "notmuch" / "default"
    assert (database / "xapian").is_dir() and not (users_setup.mail_root / ".notmuch").exists()
    assert cli_count(users_setup, "--exclude=false", "*") == 169


def test_searches_hide_the_excluded_tags_listed_with_spaces(users_setup: MailEnv,
                                                            mb: reads.Mailbox) -> None:
    """``exclude_tags=deleted; spam``: notmuch hides spam too, and so must every listing."""
    assert cli_count(users_setup, "*") == cli_count(
        users_setup, "--exclude=false", "not tag:deleted and not tag:spam") < 169
    for query in ("", "after:2026/01/01", "from:anna", "is:unread"):
        found = reads.search_emails(mb, query, limit=500)
        assert found.total == len(found.results) == cli_count(users_setup, found.query), query
        threads = reads.list_threads(mb, query, limit=500)
        assert len(threads.threads) == cli_count(users_setup, "--output=threads", found.query)


def test_addresses_listed_with_spaces_are_the_users_addresses(mb: reads.Mailbox) -> None:
    assert mb.config.addresses == ("alex@example.org", "alex.morgan@example.org",
                                   "amorgan@acme.test")
    listed = reads.list_available_accounts(mb.config)
    assert {a for account in listed.accounts for a in account.addresses} == set(
        mb.config.addresses)


def test_a_tag_of_the_users_own_in_new_tags_stays_on_new_mail(users_setup: MailEnv) -> None:
    """``new.tags=unread;inbox;work``: the rules say which mail is in the inbox, but ``work``
    is the user's, on every new message -- from fmail-nm's own first index and after a plain
    ``notmuch new`` (our hook's pass) alike."""
    # (a draft fmail-nm saves itself gets no new.tags: drafts are left out)
    assert cli_count(users_setup, "--exclude=false", "not tag:work and not tag:draft") == 0
    assert cli_count(users_setup, "tag:list", "and", "tag:inbox") == 0  # the rules still rule
    delivered = users_setup.mail_root / "personal" / "INBOX" / "new" / "1764500000.v1.host"
    delivered.write_bytes(b"From: Bob <bob@example.net>\nTo: alex@example.org\n"
                          b"Subject: the rota\nMessage-ID: <rota@example.net>\n"
                          b"Date: Mon, 30 Nov 2026 10:00:00 +0000\n\nhello\n")
    users_setup.notmuch("new")
    tags = users_setup.notmuch("search", "--output=tags", "id:rota@example.net").stdout.split()
    assert tags == ["inbox", "unread", "work"]


def test_a_channel_outside_the_mail_root_is_fixed_with_mail_root(mb: reads.Mailbox,
                                                                 tmp_path: Path) -> None:
    """The doctor's fix for a channel that syncs elsewhere moves the mail root: here
    database.path names the database alone, and setting it would move only that."""
    rc = tmp_path / "mbsyncrc"
    rc.write_text(f"MaildirStore elsewhere\nPath {tmp_path}/elsewhere/\n\n"
                  "Channel personal\nNear :elsewhere:\nFar :personal-remote:\nExpunge Both\n")
    account = {"name": "personal", "maildir": "personal", "mbsync_channel": "personal"}
    settings = dataclasses.replace(mb.config.settings, mbsync_config=str(rc),
                                   accounts=(account,))
    config = resolve(settings, mb.config.mail_root, mb.config.addresses)
    [finding] = doctor.mbsync_findings(config)
    assert "outside notmuch's mail root" in finding.problem
    assert finding.fix.endswith("(or notmuch config set database.mail_root to a folder "
                                "holding both)")


def test_a_saved_draft_is_a_draft_with_maildir_flag_sync_off(users_setup: MailEnv,
                                                             tmp_path: Path) -> None:
    """``maildir.synchronize_flags=false``: no tag follows the D flag, so the draft is tagged
    ``draft`` as such -- not taken for mail the user sent, and found to be saved again."""
    flags_off = tmp_path / "notmuch-config"
    flags_off.write_text(USERS_CONFIG.format(root=users_setup.mail_root)
                         + "[maildir]\nsynchronize_flags=false\n")
    config = users_setup.config()
    with Reader(str(flags_off)) as reader, Writer(str(flags_off)) as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        draft = compose.save_draft(ctx, ["bob@example.net"], [], [], "Flags off", "v1",
                                   account="personal")
        saved = reader.find(draft.message_id)
        assert saved is not None and "draft" in saved.tags and "sent" not in saved.tags
        again = compose.save_draft(ctx, body="v2", draft_id=draft.message_id)
        assert again.message_id == draft.message_id
    assert users_setup.notmuch("count", "--exclude=false", "tag:draft", "and",
                               f"id:{draft.message_id}").stdout == "1\n"
