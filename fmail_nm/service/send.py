"""Sending: a saved draft handed to the user's own sendmail-compatible command, then filed.

fmail-nm has no SMTP code and holds no credentials: the account's ``send.command`` (else
``[send] command``, default ``msmtp``) gets the message on stdin and its envelope as
arguments -- ``-f <From address>`` (its Sender's when it has one; msmtp then picks the
account with that ``from``, unless the command chooses the sender itself) and
``-- <recipients>``, Bcc included, while the bytes carry no Bcc header (nor Resent-Bcc).  A
command that reads recipients from the message (``-t``) is refused: those would be the
headers, without Bcc, or with it.

A send happens only when ``[send] enabled`` (or ``serve --allow-send``), at most
``max_per_hour`` times an hour (counted in the audit log), and -- for a message that was never
saved as a draft -- only with ``[send] direct = true``.  When the command fails its exit
status and stderr are reported as they are; nothing is filed and the draft stays.

A send is recorded in the sidecar as started before its command runs, and that record goes
only when the send ends with nothing sent (the command failed or is missing) or filed.  A
draft whose send never ended -- the process killed meanwhile, the command timed out, the
filing failed -- may have gone out: it is refused until the caller, once the user checked,
asks for it again with ``resend_unfinished``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from ..clock import utc_now, utc_stamp
from ..config import Account, Config
from ..errors import BackendError, CallerError
from ..passes.changes import WriteContext
from ..store import sidecar
from ..store.query import clean_id
from ..tools import compose
from ..tools.compose import DraftResult, Outgoing
from ..tools.reads import Mailbox
from .mbsync import StoppedAtShutdown, kill_group, start_tracked, untrack

# Options by which a command picks the envelope sender itself: then no -f is added.
_CHOOSES_SENDER = ("-f", "--from", "--read-envelope-from")
_GLUED_SENDER = re.compile(r"-f[^-]")  # -fADDR, one argument
_READS_RECIPIENTS = ("-t", "--read-recipients")
MAX_STDERR_CHARS = 2000
# What a send does past its command's timeout and its filing's wait for the notmuch lock: its
# other steps of filing (a Sent copy written, the sidecar synced), which take a moment.
FILING_MARGIN_S = 10.0
log = logging.getLogger(__name__)


class SendRefused(CallerError):
    """Sending is off, over its limit or not allowed for this kind of message."""


class SendFailed(BackendError):
    """The send command failed; nothing was filed and the draft is kept."""


class NothingSent(SendFailed):
    """The send command failed before anything went out: it exited non-zero (msmtp does once
    the server refused the message) but not in a way that may have sent
    (:data:`MAY_HAVE_SENT_EXITS`), or is not installed -- not a timeout, which may have sent."""


def command_for(config: Config, account: Account) -> tuple[str, ...]:
    """The account's send command, checked; a SendRefused says what to fix in fmail.toml."""
    command = (account.send.command if account.send is not None else ()) or config.send.command
    if not command:
        raise SendRefused(f"account {account.name!r} has no send command")
    if account.send is not None and account.send.smtp_host and not account.send.command:
        raise SendRefused(f"account {account.name!r}: fmail-nm sends only through a command "
                          'such as msmtp (send = { command = ["msmtp", "-a", "NAME"] }), '
                          "not with smtp_host")
    if any(arg in _READS_RECIPIENTS or (arg.startswith("-") and not arg.startswith("--")
                                        and "t" in arg[1:] and arg[1:].isalpha())
           for arg in command):
        raise SendRefused(f"account {account.name!r}: drop -t from send.command; fmail-nm "
                          "passes the recipients (Bcc included) as arguments")
    return tuple(command)


def argv_for(command: Sequence[str], out: Outgoing) -> list[str]:
    chooses = any(arg.split("=", 1)[0] in _CHOOSES_SENDER or _GLUED_SENDER.match(arg)
                  for arg in command)
    sender = [] if chooses else ["-f", out.envelope_from]
    return [*command, *sender, "--", *out.recipients]


def check_allowed(config: Config) -> None:
    """Sending on, and under the hourly limit -- counted against the audit log's own clock
    (real UTC time), whatever clock the caller's queries use."""
    if not config.send.enabled:
        raise SendRefused("sending is off (drafts only): the draft is saved for the user to "
                          "send; [send] enabled = true in fmail.toml (or serve --allow-send) "
                          "allows sending")
    with sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        sent = sidecar.count_writes(conn, "send", utc_stamp(utc_now() - timedelta(hours=1)))
    if sent >= config.send.max_per_hour:
        raise SendRefused(f"{sent} messages were sent in the last hour; the limit is "
                          f"{config.send.max_per_hour} ([send] max_per_hour). Nothing was "
                          "sent; the draft is kept")


def check_direct(config: Config) -> None:
    if not config.send.direct:
        raise SendRefused("sending a message that was not saved as a draft first is off: save "
                          "it (save_draft, or reply/forward without send) and send it with "
                          "send_email(draft_id) once the user agreed; [send] direct = true "
                          "allows it")


# msmtp's exits that can come after the server took the message: the connection lost or its
# own ``timeout`` passed while it waited for the answer to the message's end (an I/O or a
# protocol error: "the server sent an empty reply"), or an error of its own.  A command ended
# by a signal (a negative status) may have been anywhere too.  Any other exit is msmtp's
# before the message went in, or the server's refusal of it: nothing went out.
MAY_HAVE_SENT_EXITS = frozenset({os.EX_SOFTWARE, os.EX_OSERR, os.EX_IOERR, os.EX_PROTOCOL})
MAYBE_SENT = ("it may or may not have sent the message (check the recipient's copy or the "
              "server's log before sending again, with resend_unfinished=true); nothing was "
              "filed, the draft is kept")


def run_command(argv: list[str], data: bytes, timeout: float) -> None:
    """Hand the message to the command; a SendFailed with its own words when it fails."""
    try:
        code, said = run_to_end(argv, data, timeout)
    except FileNotFoundError:
        raise NothingSent(f"the send command {argv[0]!r} is not installed; nothing was "
                          "sent, the draft is kept") from None
    except subprocess.TimeoutExpired:
        raise SendFailed(f"{argv[0]} did not finish within {timeout:g} s; {MAYBE_SENT}"
                         ) from None
    if code == 0:
        return
    failed = (f"{argv[0]} failed with exit status {code}: "
              f"{said[:MAX_STDERR_CHARS] or '(no message)'}")
    if code < 0 or code in MAY_HAVE_SENT_EXITS:
        raise SendFailed(f"{failed}; {MAYBE_SENT}")
    raise NothingSent(f"{failed}; nothing was sent or filed, the draft is kept")


def run_to_end(argv: list[str], data: bytes | None, timeout: float, *,
               stoppable: bool = False) -> tuple[int, str]:
    """Run a sending command (msmtp) until it ends: its exit status and what it said.

    Its words go to a file, not a pipe: it runs the user's password command, and a helper
    that outlives it (an agent it starts) would hold a pipe open, so that waiting for the
    pipe's end waited past the command's exit -- a message sent was reported as maybe sent.
    The command runs in a session of its own, ended whole when it takes too long (a password
    command that hangs goes with it); TimeoutExpired then.  A ``stoppable`` one (a check,
    which sends nothing) is ended by the service's shutdown as an mbsync run is, or not
    started once it is under way (:func:`~fmail_nm.service.mbsync.stop_running`);
    StoppedAtShutdown then.  A send is not: ended midway, it may or may not have sent."""
    with tempfile.TemporaryFile() as said:
        streams: dict[str, Any] = dict(
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=said, start_new_session=True)
        proc: subprocess.Popen[bytes] = (start_tracked(argv, **streams) if stoppable
                                         else subprocess.Popen(argv, **streams))
        try:
            proc.communicate(data, timeout=timeout)
        except BaseException:  # the timeout, or Ctrl-C: its session would outlive us
            kill_group(proc)
            proc.wait()
            raise
        finally:
            if stoppable and untrack(proc):
                raise StoppedAtShutdown(f"{argv[0]} was stopped: fmail-nm was shutting down")
        said.seek(0)
        return proc.returncode, said.read().decode("utf-8", "replace").strip()


class SendsUnderWay:
    """The sends under way in this process, each with the time by which it has ended.  A
    server process that ends waits for them (:meth:`wait`): a send cut off after its command
    took the message leaves its draft in Drafts, unfiled, to be sent twice."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._until: dict[object, float] = {}

    @contextlib.contextmanager
    def tracked(self, bound: float) -> Iterator[None]:
        """A send under way, which ends within ``bound`` seconds from now."""
        key = object()
        with self._changed:
            self._until[key] = time.monotonic() + bound
        try:
            yield
        finally:
            with self._changed:
                del self._until[key]
                self._changed.notify_all()

    def wait(self) -> None:
        """Until no send is under way -- each is bounded, by its command's timeout and its
        filing's wait -- or the last of them is past its bound (a hung file system)."""
        with self._changed:
            if not self._until:
                return
            log.warning("waiting for %d send(s) under way to end and be filed (at most %.0f "
                        "s)", len(self._until), max(self._until.values()) - time.monotonic())
            while self._until:
                left = max(self._until.values()) - time.monotonic()
                if left <= 0:
                    log.warning("ending with %d send(s) still under way: they may or may not "
                                "have gone out, and their drafts are not filed",
                                len(self._until))
                    return
                self._changed.wait(left)


SENDS = SendsUnderWay()


def check_not_sent(ctx: WriteContext, draft_id: str, *,
                   resend_unfinished: bool = False) -> tuple[str, str | None]:
    """The draft's Message-ID, once it is known not to have been sent, and when a send of it
    that never ended started (None: none), for :func:`_record_start` to find unchanged.  A
    draft sent already is refused, saying so: a call whose caller gave up waiting (a timeout,
    a cancel) may have sent and filed it, and its "no draft" would read as "never sent".  So
    is one whose send started and never ended (see the module's doc), unless
    ``resend_unfinished``."""
    found = Mailbox(ctx.config, ctx.reader, ctx.clock).find(draft_id)
    ref = found.message_id if found is not None else clean_id(draft_id)
    with sidecar.opened(sidecar.sidecar_path(ctx.config.data_dir)) as conn:
        at = sidecar.sent_at(conn, ref)
        started = sidecar.started_at(conn, ref)
    if at is not None:
        raise SendRefused(f"{ref} was sent already, at {at} (in:sent); it was not "
                          "sent again")
    if started is not None and not resend_unfinished:
        raise SendRefused(f"a send of {ref} started at {started} and never finished (fmail-nm "
                          "was stopped, the send command timed out or the filing failed): it "
                          "may have gone out. Nothing was sent now. Check the Sent folder or "
                          "with the recipients; if it did not arrive and the user agrees, "
                          "send_email with resend_unfinished=true sends it anyway")
    return ref, started


def send_draft(ctx: WriteContext, draft_id: str, *,
               resend_unfinished: bool = False) -> DraftResult:
    """Send a saved draft, then file it (Sent copy, draft gone, original replied)."""
    check_allowed(ctx.config)
    ref, seen = check_not_sent(ctx, draft_id, resend_unfinished=resend_unfinished)
    out = compose.load_draft(ctx, draft_id)
    argv = argv_for(command_for(ctx.config, out.composition.account), out)
    timeout = ctx.config.send.timeout_seconds
    with SENDS.tracked(timeout + compose.FILING_WAIT_S + FILING_MARGIN_S), \
            sidecar.opened(sidecar.sidecar_path(ctx.config.data_dir)) as conn:
        _record_start(conn, ref, seen)
        try:
            run_command(argv, out.wire, timeout)
        except NothingSent:
            _forget_started(conn, ref)
            raise
        done = compose.file_sent(ctx, out)
        # Killed before this, the send's own entry (sent_at) refuses sending it again.
        _forget_started(conn, ref)
        return done


def _record_start(conn: sqlite3.Connection, ref: str, seen: str | None) -> None:
    """The record that the send began, committed before its command runs: a process killed
    while it runs leaves it.  Taken only if nothing changed since :func:`check_not_sent`
    looked, under the write lock: another server process sending the same draft meanwhile
    would otherwise send it too."""
    try:
        recorded = sidecar.send_started(conn, ref, utc_stamp(utc_now()), seen=seen)
    except sqlite3.Error as exc:
        raise NothingSent(f"could not record that the send of {ref} begins ({exc}); nothing "
                         "was sent, the draft is kept") from None
    if not recorded:
        raise SendRefused(f"another send of {ref} began or ended while this one got ready "
                          "(another fmail-nm process sending it?); nothing was sent now. "
                          "Check the Sent folder before sending it again")


def _forget_started(conn: sqlite3.Connection, ref: str) -> None:
    """The started record gone, or logged: its failure must not read as the send's (a sent
    message reported failed would be sent again); left, it refuses the draft, saying why."""
    try:
        sidecar.send_ended(conn, ref)
    except sqlite3.Error as exc:
        log.warning("the record that the send of %s started was left: %s", ref, exc)


def save_and_send(ctx: WriteContext, save: Callable[[WriteContext], DraftResult]) -> DraftResult:
    """A message sent without a draft the user saw first (``[send] direct``): ``save`` writes
    it as a draft, which a failed or refused send leaves there for the user (its id in the
    error).  Sending off or over its limit is found after the save, by ``send_draft``: the
    user's words are kept, as the refusal says."""
    check_direct(ctx.config)
    draft = save(ctx)
    try:
        return send_draft(ctx, draft.message_id)
    except (SendFailed, SendRefused, compose.ComposeError, compose.FilingError) as exc:
        # Sent again the same way, it would be saved again: a draft per try.
        raise type(exc)(f"{exc} (draft_id {draft.id}: to try again, send_email that "
                        "draft_id)") from None


def send_new(ctx: WriteContext, to: Sequence[str], subject: str, body: str, *,
             cc: Sequence[str] = (), bcc: Sequence[str] = (), account: str | None = None,
             attachments: Sequence[str] = ()) -> DraftResult:
    """A new message sent at once (``[send] direct``)."""
    if not to:
        raise SendRefused("to: give at least one recipient")
    return save_and_send(ctx, lambda c: compose.save_draft(
        c, to, cc, bcc, subject, body, account=account, attachments=attachments))
