"""``fmail-nm contacts block|unblock`` in an account with ``blocked_to_junk``, against a real
IMAP server (Dovecot + mbsync, tests/syncbed.py): the CLI pushes the Junk moves it made by
itself, unless ``--no-push``.  What counts is what the *server* holds, read with imaplib.
"""

from __future__ import annotations

import os
import subprocess
from collections import defaultdict

import pytest

from .syncbed import (  # noqa: F401  (pytest fixtures, used by name)
    ACCOUNT,
    SEEN,
    SyncBed,
    sync_bed,
)

pytestmark = pytest.mark.imap

SENDER = "bulk@offers.example.net"
# Message n -> (server folder, flags) as seeded.  1-3 are from SENDER, 4 and 5 are not.
SEEDED = {
    1: ("INBOX", ()),
    2: ("INBOX", (SEEN,)),
    3: ("Archive", (SEEN,)),
    4: ("INBOX", ()),
    5: ("Archive", (SEEN,)),
}
FROM_SENDER = (1, 2, 3)

# Per Message-ID (no angle brackets): the (folder, flags) of each copy on the server.
Snapshot = dict[str, list[tuple[str, frozenset[str]]]]


def server_snapshot(bed: SyncBed) -> Snapshot:
    found: defaultdict[str, list[tuple[str, frozenset[str]]]] = defaultdict(list)
    for folder, messages in bed.server_state().items():
        for msg in messages:
            found[msg.message_id.strip("<>")].append((folder, msg.flags))
    return {mid: sorted(places, key=lambda p: (p[0], sorted(p[1])))
            for mid, places in found.items()}


def local_folders(bed: SyncBed, mid: str) -> list[str]:
    """The folders of the message's files on disk (not through the index)."""
    return sorted(path.parent.parent.name for path in bed.files(mid))


def notmuch_new(bed: SyncBed) -> str:
    done = subprocess.run(["notmuch", "new", "--no-hooks"], env={**os.environ, **bed.env},
                          text=True, capture_output=True, timeout=120, check=True)
    return done.stdout.strip()


@pytest.fixture
def junk_bed(sync_bed: SyncBed) -> SyncBed:  # noqa: F811  (the fixture, by name)
    """The bed with ``blocked_to_junk = true`` on its account, three messages from SENDER
    (two in INBOX, one in Archive) and two from others, initialised and synced."""
    bed = sync_bed
    toml = bed.mail_env.fmail_config.read_text()
    channel_line = f'mbsync_channel = "{ACCOUNT}"\n'
    assert channel_line in toml and "[accounts.folders]" in toml and 'junk = "Junk"' in toml
    bed.mail_env.fmail_config.write_text(
        toml.replace(channel_line, channel_line + "blocked_to_junk = true\n", 1))
    for n, (folder, flags) in SEEDED.items():
        sender = f"Bulk Offers <{SENDER}>" if n in FROM_SENDER else None
        bed.seed(n, folder=folder, flags=flags, **({"sender": sender} if sender else {}))
    bed.init()
    assert bed.reload().account(ACCOUNT).blocked_to_junk
    report = bed.sync()
    assert report.ok, report.errors()
    return bed


def test_cli_block_pushes_the_junk_moves_to_the_server(junk_bed: SyncBed) -> None:
    bed = junk_bed
    mine = [bed.mid(n) for n in FROM_SENDER]
    before = server_snapshot(bed)
    assert before == {bed.mid(n): [(folder, frozenset(flags))]
                      for n, (folder, flags) in SEEDED.items()}, before

    done = bed.mail_env.fmail("contacts", "block", SENDER, check=False)
    assert done.returncode == 0, done
    assert "push of" not in done.stderr, done.stderr  # no failed push reported

    # Locally: in Junk, tagged blocked and spam.
    for mid in mine:
        assert local_folders(bed, mid) == ["Junk"], mid
        assert {"blocked", "spam"} <= bed.tags(mid), mid
    # On the server, with no mbsync run by this test: in Junk, and gone from INBOX/Archive,
    # flags kept; the other senders' mail untouched.
    blocked = server_snapshot(bed)
    for n in FROM_SENDER:
        assert blocked[bed.mid(n)] == [("Junk", frozenset(SEEDED[n][1]))], (n, blocked)
    assert {k: v for k, v in blocked.items() if k not in mine} == {
        k: v for k, v in before.items() if k not in mine}
    # The CLI re-indexed after its push: mbsync's renames are known to notmuch.
    assert notmuch_new(bed) == "No new mail."

    # Unblocking without a push moves the mail back here only ...
    done = bed.mail_env.fmail("contacts", "unblock", SENDER, "--no-push", check=False)
    assert done.returncode == 0, done
    for n in FROM_SENDER:
        mid = bed.mid(n)
        assert local_folders(bed, mid) == [SEEDED[n][0]], (n, local_folders(bed, mid))
        assert not {"blocked", "spam"} & bed.tags(mid), (n, bed.tags(mid))
    assert server_snapshot(bed) == blocked  # ... the server still has it in Junk

    # ... until the next sync carries it.
    report = bed.sync()
    assert report.ok, report.errors()
    assert server_snapshot(bed) == before
    assert notmuch_new(bed) == "No new mail."
