"""A delivery indexed by fmail-nm itself before ``notmuch new`` (passes.delivery): the same
messages, threads, tags and sidecar rows as ``notmuch new`` followed by the post-new pass,
each new message written once, and ``notmuch new`` left the rest."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fmail_nm.passes.delivery import file_list_id
from fmail_nm.passes.indexing import Ignored
from fmail_nm.passes.prefetch import STAMP_NAME
from fmail_nm.service import index as service_index
from fmail_nm.service.index import IndexingFailed, run_index
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import WriteTxn

from .conftest import MailEnv, make_mail_env, run_init
from .test_first_index import mail, threads
from .test_index_tags import LISTED, MINE, changed_since, dump, revision

FIXTURE_ID = "school-trip-1@example.com"  # a fixture message a copy of is delivered again


def deliver_cases(env: MailEnv) -> None:
    """Mail delivered into new/ folders as mbsync does it: list mail, the user's own, plain
    mail, a reply to fixture mail, mail into Trash, another copy of known mail, not mail."""
    personal = env.mail_root / "personal"
    new = personal / "INBOX" / "new"
    (new / "1800000000.1_1.host").write_bytes(LISTED)
    (new / "1800000000.2_1.host").write_bytes(MINE)
    (new / "1800000000.3_1.host").write_bytes(mail("plain@x"))
    (new / "1800000000.4_1.host").write_bytes(
        mail("reply@x", f"In-Reply-To: <{FIXTURE_ID}>\n".encode()))
    (new / "1800000000.5_1.host").write_bytes(b"\x00\x01 not mail at all")
    (personal / "Trash" / "new" / "1800000000.6_1.host").write_bytes(mail("binned@x"))
    known = env.notmuch("search", "--output=files", f"id:{FIXTURE_ID}").stdout.split()[0]
    shutil.copyfile(known, personal / "Archive" / "new" / "1800000000.7_1.host")


@pytest.fixture(autouse=True)
def small_deliveries_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixture deliveries are a few messages: below the size from which an index run
    indexes a delivery itself (a cost that pays back on larger ones)."""
    monkeypatch.setattr(service_index, "DELIVERY_MIN_FILES", 1)


def needs_tagging(env: MailEnv) -> int:
    with sqlite3.connect(sidecar.sidecar_path(env.config().data_dir)) as conn:
        return int(conn.execute("SELECT count(*) FROM messages WHERE needs_tagging")
                   .fetchone()[0])


def test_a_delivery_equals_notmuch_new_and_the_pass(indexed: MailEnv, tmp_path: Path) -> None:
    deliver_cases(indexed)
    before = revision(indexed)
    phases: list[tuple[str, int, int]] = []
    summary = run_index(indexed.config(), show_progress=False,
                        on_progress=lambda *event: phases.append(event))
    assert (summary.delivered, summary.added) == (5, 5)
    assert summary.tagging.rewritten == 0  # written once, with their final tags
    # One phase for indexing and tagging the 7 files, then notmuch new's (nothing), then the
    # sidecar's; none for tagging.
    assert phases[:2] == [("indexing", 0, 7), ("indexing", 7, 7)]
    assert "tagging" not in {phase for phase, _, _ in phases}

    # The other way: the same mail, left to notmuch new and the pass (no stamp: the run does
    # not know what was delivered).
    other = make_mail_env(tmp_path / "other")
    run_init(other)
    deliver_cases(other)
    (Path(other.env["XDG_DATA_HOME"]) / "fmail-nm" / STAMP_NAME).unlink()
    other.fmail("index", "--quiet")

    assert dump(indexed) == dump(other)
    assert threads(indexed) == threads(other)
    tags = set(indexed.notmuch("search", "--output=tags", "--exclude=false", "id:binned@x").stdout.split())
    assert "deleted" in tags and "inbox" not in tags
    # Each new message changed once (written with its tags), the known one once more (a file).
    assert changed_since(indexed, before) == {"listed-1@example.com", "mine-1@example.org",
                                              "plain@x", "reply@x", "binned@x", FIXTURE_ID}
    assert "No new mail" in indexed.notmuch("new").stdout
    assert needs_tagging(indexed) == 0
    check = indexed.fmail("sidecar", "check", check=False)
    assert check.returncode == 0, check.stdout


def test_plain_inbox_mail_is_written_once_as_it_is_indexed(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mail in an inbox from no list gets the tags notmuch new gives it right as it is
    indexed, and is not written again after the rules unless they want otherwise: a message
    looked up again must have its whole term list read back before it can change."""
    later: list[str] = []
    write_tags = WriteTxn._write_tags

    def recorded(self: WriteTxn, messages: Mapping[str, Sequence[str]], *args: Any) -> None:
        later.extend(messages)
        write_tags(self, messages, *args)
    monkeypatch.setattr(WriteTxn, "_write_tags", recorded)
    deliver_cases(indexed)
    summary = run_index(indexed.config(), show_progress=False)
    assert summary.delivered == 5
    # The list's mail and the Trash's are no guess; the user's own was one, the rules said
    # otherwise (sent, not inbox): written again, with the tags the rules give.
    assert sorted(later) == ["binned@x", "listed-1@example.com", "mine-1@example.org"]
    tags = indexed.notmuch("search", "--output=tags", "--exclude=false", "id:mine-1@example.org")
    assert sorted(tags.stdout.split()) == ["sent", "unread"]
    tags = indexed.notmuch("search", "--output=tags", "--exclude=false", "id:plain@x")
    assert sorted(tags.stdout.split()) == ["inbox", "unread"]


def test_a_small_delivery_is_left_to_notmuch_new(indexed: MailEnv,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ``DELIVERY_MIN_FILES`` a write session of our own costs more than it saves."""
    monkeypatch.setattr(service_index, "DELIVERY_MIN_FILES", 3)
    new = indexed.mail_root / "personal" / "INBOX" / "new"
    (new / "1800000000.1_1.host").write_bytes(LISTED)
    (new / "1800000000.2_1.host").write_bytes(MINE)
    summary = run_index(indexed.config(), show_progress=False)
    assert (summary.delivered, summary.added, summary.tagging.rewritten) == (0, 2, 2)
    for n in range(3, 6):
        (new / f"1800000000.{n}_1.host").write_bytes(mail(f"plain-{n}@x"))
    summary = run_index(indexed.config(), show_progress=False)
    assert (summary.delivered, summary.added, summary.tagging.rewritten) == (3, 3, 0)


def test_with_a_pre_new_hook_notmuch_new_indexes_the_delivery(indexed: MailEnv) -> None:
    """A pre-new hook runs before any new mail is indexed (it may act on tags): left as it
    was, the delivery goes to notmuch new, and the pass tags it."""
    hook_dir = Path(indexed.notmuch("config", "get", "database.hook_dir").stdout.strip())
    (hook_dir / "pre-new").write_text("#!/bin/sh\nexit 0\n")
    (hook_dir / "pre-new").chmod(0o755)
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1800000000.1_1.host").write_bytes(LISTED)
    summary = run_index(indexed.config(), show_progress=False)
    assert (summary.delivered, summary.added, summary.tagging.rewritten) == (0, 1, 1)
    tags = indexed.notmuch("search", "--output=tags", "id:listed-1@example.com").stdout.split()
    assert sorted(tags) == ["list", "list/rust-users.lists.example.com", "unread"]


def test_a_run_that_dies_after_the_delivery_is_finished_by_the_next(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The delivery committed, then notmuch new failed: the next run's mirror takes the mail
    for new, and the rules give it the tags it has; nothing is lost or tagged twice over."""
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1800000000.1_1.host").write_bytes(LISTED)
    (indexed.mail_root / "personal" / "INBOX" / "new" / "1800000000.2_1.host").write_bytes(MINE)

    def notmuch_new_fails(*args: object, **kwargs: object) -> object:
        raise IndexingFailed("notmuch new failed (simulated)")
    config = indexed.config()
    with monkeypatch.context() as patched, pytest.raises(IndexingFailed):
        patched.setattr(service_index, "run_notmuch_new", notmuch_new_fails)
        run_index(config, show_progress=False)
    written = dump(indexed)
    assert any(line.startswith("+list ") for line in written)  # the delivery is in, tagged
    summary = run_index(config, show_progress=False)
    assert summary.tagging.rewritten == 0
    assert dump(indexed) == written
    assert needs_tagging(indexed) == 0
    check = indexed.fmail("sidecar", "check", check=False)
    assert check.returncode == 0, check.stdout


def test_ignored_names_and_patterns_apply_to_every_folder_on_the_way() -> None:
    ignored = Ignored(".mbsyncstate;/^work/Spam/")
    assert ignored.anywhere("personal/INBOX/new/.mbsyncstate")
    assert ignored.anywhere("work/Spam/new/1.host")
    assert Ignored("Spam").anywhere("work/Spam/new/1.host")
    assert not ignored.anywhere("work/INBOX/new/1.host")


def test_the_list_id_read_from_the_header_block_is_the_mirrors(tmp_path: Path) -> None:
    """The tags take a delivery's List-Id from the header block alone; the sidecar's comes
    from the whole parse: the same, for well-formed and for odd headers alike."""
    from fmail_nm.passes.mirror import parse_file

    cases = {
        "plain": LISTED,
        "bare": b"List-Id: Dev.Example.ORG\nSubject: x\n\nbody\n",
        "folded": b"List-Id: A very\n long name <team.example.com>\nSubject: y\n\nbody\n",
        "spaces": b"List-Id: not an id at all\n\nbody\n",
        "none": MINE,
        "no header block": b"just text, no headers\n",
        "binary": b"\x00\xff\xfe List-Id: <x.y>\n",
    }
    for name, raw in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        assert file_list_id(str(path)) == parse_file([str(path)]).list_id, name
    assert file_list_id(str(tmp_path / "plain")) == "rust-users.lists.example.com"
    assert file_list_id(str(tmp_path / "gone")) is None
