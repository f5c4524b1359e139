"""Drafts and sends against the real IMAP server: Dovecot, mbsync, notmuch, and a real SMTP
server behind a real msmtp.  Judged by what the *server* holds after mbsync's push: the draft
in Drafts, then after the send the copy in Sent (not for an account whose server files its
own, as Gmail does), the draft gone, the original ``\\Answered``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fmail_nm.passes.changes import WriteContext
from fmail_nm.service import send
from fmail_nm.store import sidecar
from fmail_nm.tools import compose

from .smtpbed import SmtpBed
from .syncbed import (  # noqa: F401  (pytest fixtures, used by name)
    ACCOUNT,
    ADDRESS,
    SEEN,
    SyncBed,
    sync_bed,
    synced_bed,
)

pytestmark = pytest.mark.imap
ANSWERED, DRAFT = "\\Answered", "\\Draft"


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[SmtpBed]:
    bed = SmtpBed(tmp_path / "smtp", {ACCOUNT: ADDRESS}).start()
    try:
        yield bed
    finally:
        bed.stop()


def where(bed: SyncBed, message_id: str) -> dict[str, frozenset[str]]:
    """Server folder -> flags of each copy of the message there."""
    return {folder: msg.flags for folder, messages in bed.server_state().items()
            for msg in messages if msg.message_id == f"<{message_id}>"}


def synced(bed: SyncBed) -> None:
    report = bed.sync()
    assert report.ok, report.errors()


@pytest.mark.parametrize("server_stores_sent", [False, True], ids=["sent-copy", "gmail-style"])
def test_a_reply_drafted_then_sent_shows_on_the_server(
        synced_bed: SyncBed, smtp: SmtpBed, server_stores_sent: bool) -> None:
    bed = synced_bed
    text = bed.mail_env.fmail_config.read_text()
    text = text.replace('mbsync_channel = "acct"\n', 'mbsync_channel = "acct"\n' + (
        "send = { server_stores_sent = true }\n" if server_stores_sent else ""))
    bed.mail_env.fmail_config.write_text(text + 'drafts = "Drafts"\n\n' + smtp.send_settings())
    config = bed.reload()
    original = bed.mid(2)

    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        draft = compose.reply_to_email(ctx, original, "Thanks, will do.")
        synced(bed)
        assert where(bed, draft.message_id) == {"Drafts": {DRAFT, SEEN}}
        assert ANSWERED not in bed.server_flags(original)

        done = send.send_draft(ctx, draft.message_id)
        assert done.sent
        synced(bed)

    (got,) = smtp.received
    assert got.mail_from == ADDRESS and got.rcpt_tos == ("sender2@example.net",)
    assert f"In-Reply-To: <{original}>".encode() in got.data
    if server_stores_sent:  # the server's own copy arrives with the next pull; none from us
        assert where(bed, draft.message_id) == {}
        assert not list((bed.account_dir / "Sent" / "cur").iterdir())
    else:
        assert where(bed, draft.message_id) == {"Sent": {SEEN}}
        assert bed.tags(draft.message_id) == {"sent"}
    assert bed.server_flags(original) == {SEEN, ANSWERED}
    assert "replied" in bed.tags(original)
    assert not [p for p in (bed.account_dir / "Drafts").glob("*/*")]


def test_a_draft_replaced_after_mbsync_renamed_it_leaves_one_copy(
        synced_bed: SyncBed, smtp: SmtpBed) -> None:
    """mbsync renames a file it uploads (``,U=``) behind notmuch's back; replacing or sending
    the draft before the next index must still remove that file, or the next ``notmuch new``
    would bring the old version back."""
    bed = synced_bed
    bed.mail_env.fmail_config.write_text(bed.mail_env.fmail_config.read_text() +
                                         'drafts = "Drafts"\n\n' + smtp.send_settings())
    config = bed.reload()
    with bed.reader() as reader, bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        draft = compose.save_draft(ctx, ["x@example.com"], subject="first", body="v1")
        (run,) = bed.mbsync("push")
        assert run.ok, run.error
        (uploaded,) = (bed.account_dir / "Drafts" / "cur").iterdir()
        assert ",U=" in uploaded.name and bed.find(draft.message_id).filenames != (str(uploaded),)  # type: ignore[union-attr]

        compose.save_draft(ctx, subject="second", draft_id=draft.message_id)
        synced(bed)

    (left,) = (bed.account_dir / "Drafts" / "cur").iterdir()
    assert b"Subject: second" in left.read_bytes()
    (on_server,) = [m for m in bed.server_state()["Drafts"]]
    assert on_server.message_id == f"<{draft.message_id}>"
