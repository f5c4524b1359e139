"""Drafts, replies and forwards: messages built with the standard library's ``email`` package
and saved in the account's Drafts folder, where mutt, aerc and (after mbsync's push) the phone
see them; and the filing of a message once it was sent.

Sending itself -- the user's own sendmail-compatible command -- is ``service.send``; what it
sends is a draft saved here, checked again (:func:`load_draft`), since the user may have edited
it in their mail client meanwhile.

Everything a caller writes goes into headers only after checks: no CR, LF or NUL in any value
(header injection), every address parsed and named when it is not one, no recipient on the
blocklist, attachments only from files under ``[send] attachments_dir``, the whole message no
larger than ``[send] max_message_mb``.  Non-ASCII text becomes RFC 2047 encoded words in headers
and quoted-printable in the body (the SMTP policy: CRLF lines, folded at 78).

A draft is one file in the Drafts folder with Maildir flags ``DS`` (tags ``draft``, not
unread); saving it again under its id writes a new file with the same Message-ID and drops the
old one in the same write session.  Sent, it gets a copy in the Sent folder (flag ``S``, tag
``sent`` from the user's rules) unless the account's server files one itself; the draft file
goes; the original gets ``replied`` (forwarded: ``passed``), which renames its file's flags
(R, P), so mbsync pushes ``\\Answered``.
"""

from __future__ import annotations

import base64
import binascii
import email.charset
import email.errors
import email.header
import email.policy
import email.utils
import logging
import mimetypes
import re
import time
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime
from email._header_value_parser import TokenList, get_address_list
from email.headerregistry import Address as HeaderAddress
from email.headerregistry import BaseHeader, Group, HeaderRegistry
from email.message import EmailMessage, Message, MIMEPart
from email.parser import BytesParser
from pathlib import Path
from typing import cast

from pydantic import Field

from .. import tags
from ..config import Account, Config, ConfigError
from ..errors import BackendError
from ..message import drafts
from ..message.headers import (Address, addresses, ascii_address, canonical_address,
                                decode_header_text, header, is_own_address, mailbox_address,
                                parse_addresses, split_head, to_bytes, written_date)
from ..message.formats import unflow
from ..message.html import read_message
from ..message.mime import MAX_DEPTH, nested_past_max_depth
from ..message.text import clean_text, is_forward_subject, one_line, unescape_line_marks
from ..passes import changes
from ..passes.changes import NOT_UNDOABLE, WriteContext
from ..passes.mirror import my_addresses
from ..passes.tagging import tag_added
from ..store import maildir, mover, notmuch_cli, sidecar
from ..store.notmuch import DatabaseBusy, IndexedMessage, StaleFiles, WriteNotSaved, WriteTxn
from ..store.query import id_query
from .dto import MAX_SUBJECT_CHARS as MAX_SUBJECT_CHARS_SHOWN
from .dto import Dto, cut
from .reads import Mailbox, ToolError, is_thread_id

log = logging.getLogger(__name__)

# SMTP lines end in CRLF and fold at 78; the source of a forwarded message is kept byte for
# byte (refold_source="none"), only headers written here are folded.
POLICY = email.policy.SMTP.clone(refold_source="none")
MAX_RECIPIENTS = 100
MAX_ADDRESS_CHARS = 320
MAX_SUBJECT_CHARS = 500
MAX_BODY_CHARS = 200_000
MAX_ATTACHMENTS = 20
MAX_REFERENCES = 20  # the oldest and the newest are kept, as RFC 5322 suggests
DRAFT_FLAGS = "DS"
SENT_FLAGS = "S"
# Thunderbird's header for the same purpose: which message a forward forwards (-> passed).
FORWARDED_HEADER = "X-Forwarded-Message-Id"
_REPLY_PREFIX = re.compile(r"^\s*((re|aw|sv|antw)(\[\d+\])?\s*:\s*)+", re.I)
_FORWARD_PREFIX = re.compile(r"^\s*((fwd?|wg)\s*:\s*)+", re.I)
# In a header value: every control character but TAB, and what Python's email package also
# takes for a line break when it writes a header it read (VT, FF, FS-RS, NEL, LS, PS): any of
# them would end the header line and start one of the caller's.
_FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")
# In what the caller writes (names, subject, attachment names), characters that make it read
# otherwise than it is: C1 controls, bidi embeddings, overrides and isolates (with U+202E in
# it, "invoicefdp.exe" shows as "invoiceexe.pdf"), and the invisible tag characters: what the
# model reads of mail has them taken out (message.hygiene), so it would not see what it wrote.
# Headers read from a file are left as they are: these cannot break their lines.
_SPOOFING = re.compile("[\x80-\x9f\u202a-\u202e\u2066-\u2069\U000e0000-\U000e007f]")
# A subdivision flag (Scotland's: black flag, "gbsct" in tag letters, cancel tag) is the one
# use of tag characters, a flag a mail client shows: a region and a short code, no text.
_FLAG_TAGS = re.compile("\U0001f3f4[\U000e0061-\U000e007a]{2}"
                        "[\U000e0030-\U000e0039\U000e0061-\U000e007a]{1,4}\U000e007f")
# In a body: control characters a 7bit line must not carry (TAB, LF and FF may).
_BODY_CONTROL = re.compile("[\x00-\x08\x0b\x0d-\x1f\x7f]")
# A Message-ID we write into In-Reply-To / References (those of the original are untrusted).
_MSG_ID = re.compile(r"[!-;=?-~]{1,250}")  # printable ASCII without < > and space
# An address we send to: ASCII local part and a dotted domain name (no SMTPUTF8 here).
_ADDR_SPEC = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]([A-Za-z0-9-]*[A-Za-z0-9])?")


class ComposeError(ToolError):
    """A message cannot be written as asked; the text names the value and what to change."""


class FilingError(BackendError):
    """The message was sent, but storing the Sent copy or dropping the draft failed."""


# How long the filing of a sent message waits for a notmuch write lock another program holds
# (a big notmuch new): past a write's bound, since the message is out already.
FILING_WAIT_S = 60


# What was saved or sent: ``id`` is the id listings show and every tool takes (the draft_id:
# its uid once the mirror has it, see _answer_id); ``message_id`` is for the code that
# called, left out of the answer; ``sent`` false means "in Drafts".
class DraftResult(Dto):
    id: str
    message_id: str = Field(exclude=True)
    from_: str = Field(alias="from", serialization_alias="from")
    to: list[str]
    # Left out of the structured result when empty or false (results drop defaults).
    cc: list[str] = Field(default_factory=list)
    bcc: list[str] = Field(default_factory=list)
    subject: str
    sent: bool = False


# ---------------------------------------------------------------------------------------------
# Checking what the caller gives


def check_header(name: str, value: str) -> str:
    """A header value as given, or a ComposeError when it could inject headers."""
    if _FORBIDDEN.search(value):
        raise ComposeError(f"{name}: line breaks and control characters are not allowed in a "
                           f"header value (got {value[:80]!r})")
    return value


def check_given(name: str, value: str) -> str:
    """A header value the caller wrote, or a ComposeError when it could inject headers or
    read otherwise than it is (see _SPOOFING)."""
    check_header(name, value)
    if _SPOOFING.search(_FLAG_TAGS.sub("", value)):
        raise ComposeError(f"{name}: bidirectional formatting and invisible tag characters are "
                           f"not allowed in a header value (got {value[:80]!r})")
    return value


def check_addresses(values: Sequence[str], what: str) -> list[Address]:
    """Each value one address (``a@b.org`` or ``Name <a@b.org>``), or a ComposeError naming
    the value that is not."""
    found: list[Address] = []
    for value in values:
        check_given(what, value)
        if len(value) > MAX_ADDRESS_CHARS:
            raise ComposeError(f"{what}: {value[:40]!r}... is longer than {MAX_ADDRESS_CHARS} "
                               "characters")
        pairs = email.utils.getaddresses([value])
        wire = ascii_address(pairs[0][1]) if len(pairs) == 1 else ""
        if _needs_smtputf8(wire):
            raise ComposeError(f"{what}: {value!r} has {_SMTPUTF8_ONLY}")
        if not _ADDR_SPEC.fullmatch(wire):
            raise ComposeError(f"{what}: {value!r} is not an email address (give one address "
                               "per item: a@example.org or Name <a@example.org>)")
        found.append(Address(name=pairs[0][0], address=wire))
    return found


# A domain goes out in ACE (ascii_address); a local part has no ASCII form, and the send
# command (msmtp) speaks no SMTPUTF8: it would go out garbled or be refused by the server.
_SMTPUTF8_ONLY = ("non-ASCII letters before the @, which only SMTPUTF8 mail (RFC 6531) "
                  "carries and fmail-nm does not send; nothing was written or sent")
# What can be done about such an address read from mail: no tool here writes to it.
_SMTPUTF8_ELSEWHERE = "only a mail client that sends SMTPUTF8 mail can write to it"


def _needs_smtputf8(address: str) -> bool:
    local, at, _ = address.rpartition("@")
    return bool(at) and not local.isascii()


_WRITE_THEM = "write the recipients yourself with save_draft"
_ADD_THEM = ("reply without reply_all, then add those to write to with save_draft (draft_id, "
             "cc)")


def _unique(people: Sequence[Address], mine: Set[str], remedy: str = _WRITE_THEM, *,
            taken: Set[str] = frozenset()) -> list[Address]:
    """Each address once, none of the user's (``mine``, their sub-addresses too: see
    :func:`is_own_address`) nor of ``taken`` (canonical forms: see :func:`canonical_address`),
    each as it goes on the wire (:func:`ascii_address`); an address read from a message that
    fmail-nm cannot send to is refused by name, saying what to do instead (``remedy``) --
    mail content is untrusted."""
    seen = set(taken)
    out = []
    for person in people:
        # One mailbox however its domain is written (Unicode or ACE) and in whatever case;
        # one left out (the user's own, in Unicode say) need not be one fmail-nm sends to.
        key = canonical_address(person.address)
        if key in seen or is_own_address(key, mine):
            continue
        wire = ascii_address(person.address)
        if _needs_smtputf8(wire):
            # Adding recipients is a way to the others only, never to this one.
            others = f"; to write to the others, {remedy}" if remedy == _ADD_THEM else ""
            raise ComposeError(f"the original names {person.address!r}, which has "
                               f"{_SMTPUTF8_ONLY}: {_SMTPUTF8_ELSEWHERE}{others}")
        if not _ADDR_SPEC.fullmatch(wire):
            raise ComposeError(f"the original names {person.address!r}, which is not an email "
                               f"address fmail-nm sends to; {remedy}")
        seen.add(key)
        out.append(Address(person.name, wire))
    return out



def check_not_blocked(config: Config, recipients: Sequence[Address]) -> None:
    with sidecar.opened(sidecar.sidecar_path(config.data_dir), readonly=True) as conn:
        blocked = {canonical_address(a) for a in sidecar.blocked_addresses(conn)}
    # Compared in one form: a block catches an address whichever form its domain is written in.
    hits = sorted({p.address.lower() for p in recipients
                   if canonical_address(p.address) in blocked})
    if hits:
        raise ComposeError(f"recipients on the blocklist: {', '.join(hits)}; nothing was "
                           "written (unblock them with manage_contacts_sql first if the user "
                           "wants to write to them)")


def attachment_path(config: Config, name: str) -> Path:
    """A file under ``[send] attachments_dir`` (relative to it, or absolute inside it)."""
    base = config.send.attachments_dir
    if base is None:
        raise ComposeError("attachments are off: set [send] attachments_dir in fmail.toml to "
                           "the folder attachments may come from")
    check_given("attachments", name)
    root = base.resolve()
    path = (root / name).resolve()  # symlinks resolved: a link out of the folder is outside
    if not path.is_relative_to(root):
        raise ComposeError(f"attachment {name!r} is outside the attachments folder {base}")
    if not path.is_file():
        raise ComposeError(f"attachment {name!r} is not a file in {base}")
    if path.stat().st_size > _max_bytes(config):  # before reading it into memory
        raise ComposeError(f"attachment {name!r} alone is larger than "
                           f"{config.send.max_message_mb:g} MB ([send] max_message_mb)")
    return path


def _max_bytes(config: Config) -> int:
    return int(config.send.max_message_mb * 1024 * 1024)


def check_size(config: Config, data: bytes) -> bytes:
    if len(data) > _max_bytes(config):
        raise ComposeError(f"the message would be {len(data) / 1048576:.1f} MB; at most "
                           f"{config.send.max_message_mb:g} MB ([send] max_message_mb)")
    return data


# ---------------------------------------------------------------------------------------------
# Building a message


@dataclass
class Composition:
    """What goes into one message; ``attached`` are MIME parts ready to add (attachments, a
    forwarded message)."""

    account: Account
    sender: Address  # who sends it: the envelope's sender, the account's address
    to: list[Address]
    cc: list[Address]
    bcc: list[Address]
    subject: str
    body: str
    message_id: str | None = None  # kept when a draft is replaced
    in_reply_to: str | None = None
    references: list[str] = field(default_factory=list)
    forwarded: str | None = None
    attached: list[MIMEPart] = field(default_factory=list)
    # A saved draft's other headers (Reply-To, Organization, X-...), kept when it is saved
    # again: another mail client may have written them.  Their source values (folded, 8-bit
    # bytes as surrogates), written back as they are: see _keep_header.
    kept_headers: list[tuple[str, str]] = field(default_factory=list)
    # A saved draft's From when it is not ``sender`` alone: several people wrote it, or
    # another than the one sending it, whom its Sender header (kept) names (RFC 5322 3.6.2).
    authors: list[Address] = field(default_factory=list)


def _header_address(person: Address) -> HeaderAddress:
    local, _, domain = person.address.rpartition("@")
    # The email package reads "=?" in a name as the start of an encoded word and decodes it
    # again when writing: a name that decoded to such text (untrusted, from the mail replied
    # to) would write its line breaks into the header block. No real name has one: left out.
    name = "" if "=?" in person.name else person.name
    return HeaderAddress(display_name=name, username=local, domain=domain)


def _address_list(name: str, people: Sequence[Address]) -> str:
    """An address header's value as it is to be written: a non-ASCII name as Q-encoded words
    of whole characters (:func:`_encoded_words`), folded between words at 78 columns."""
    return _folded_addresses(name, _mailboxes(name, people))


def _mailboxes(name: str, people: Sequence[Address], comments: Sequence[str] = ()) -> str:
    """The mailboxes, each followed by its comment in ``comments`` when given (_comments)."""
    mailboxes = []
    for i, person in enumerate(people):
        address = _header_address(person)
        if address.display_name.isascii():
            mailbox = str(address)  # quoted where the name needs it
        else:
            mailbox = f"{_encoded_words(name, address.display_name)} <{address.addr_spec}>"
        mailboxes.append(mailbox + (comments[i] if comments else ""))
    return ", ".join(mailboxes)


# What RFC 5322 3.2.3 does not allow in an atom: an ASCII phrase with one is quoted.
_SPECIALS = re.compile(r'[()<>@,;:\\".\[\]]')


def _group(name: str, display_name: str, people: Sequence[Address],
           comments: Sequence[str]) -> str:
    """``Name: a, b;`` (RFC 5322 3.4), the group's name as a mailbox's is written."""
    if not display_name.isascii():
        phrase = _encoded_words(name, display_name)
    elif _SPECIALS.search(display_name):
        phrase = f'"{email.utils.quote(display_name)}"'
    else:
        phrase = display_name
    return f"{phrase}: {_mailboxes(name, people, comments)};"


def _folded_addresses(name: str, value: str) -> str:
    # A name read from mail is untrusted: one that would break the line stops here.
    _check_source_header(name, value)
    # An address is at most 320 characters, an encoded word 75, a comment's word no longer
    # than in the draft's lines (_comment_source, _shorten_long_lines): every word fits a line.
    return _folded_source(name, value, _ADDRESS_WORD) or value


def _text_part(target: MIMEPart, body: str) -> None:
    if "\x00" in body:
        raise ComposeError("body: NUL characters are not allowed in a message")
    text = body.replace("\r\n", "\n")
    plain = (text.isascii() and not _BODY_CONTROL.search(text)
             and all(len(line) <= 78 for line in text.split("\n")))
    target.set_content(text, cte="7bit" if plain else "quoted-printable")


def file_part(path: Path) -> MIMEPart:
    ctype, encoding = mimetypes.guess_type(path.name)
    if ctype is None or encoding is not None:  # .tar.gz is a gzip file, not a tar
        ctype = "application/octet-stream"
    if ctype == "message/rfc822":  # a saved mail (.eml): never base64 (RFC 2046 5.2.1)
        return message_part(path.read_bytes(), path.name)
    data = path.read_bytes()
    maintype, subtype = ctype.split("/", 1)
    params: dict[str, str] = {}
    if maintype == "text":
        # Text without a charset is read as US-ASCII (RFC 2046 4.1.2), a UTF-8 "ü" as two
        # other letters.  Bytes that are not UTF-8 are in a charset nothing here can tell for
        # sure, and a wrong one garbles them just the same: those go as a file to save, which
        # its extension still names.
        if _is_utf8(data):
            params["charset"] = "utf-8"
        else:
            maintype, subtype = "application", "octet-stream"
    part = MIMEPart(policy=POLICY)
    # As bytes, base64: the file goes out exactly as it is on disk, whatever its line ends.
    part.set_content(data, maintype=maintype, subtype=subtype, disposition="attachment",
                     filename=path.name, params=params)
    return part


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def message_part(raw: bytes, filename: str) -> MIMEPart:
    """A message attached whole (message/rfc822), its source unchanged but for what must not
    go out: its Bcc and Resent-Bcc (the user's own Sent copy keeps one, which would tell the
    new recipients who had it blind), and lines over 998 bytes, re-encoded (the same content).
    One the email package fails on goes as its bytes (see _opaque_message_part)."""
    # Mail nested hundreds deep (an attached message's parts too), which the email package
    # would spend seconds parsing before _parsed refuses it.
    if nested_past_max_depth(raw):
        return _opaque_message_part(raw, filename)
    try:
        original = _parsed(raw, _ATTACHED)
        _drop_blind_headers(original)
        _shorten_long_lines(original, _ATTACHED)
    except ComposeError:
        return _opaque_message_part(raw, filename)
    part = MIMEPart(policy=POLICY)
    part.set_content(original, disposition="attachment", filename=filename)
    return part


def _opaque_message_part(raw: bytes, filename: str) -> MIMEPart:
    """Hostile mail, forwarded to report it, as its bytes but for its Bcc and Resent-Bcc
    lines: a file (.eml, base64), not message/rfc822, which may not be encoded (RFC 2046
    5.2.1) and so could not carry its long lines, NULs or lone CRs, and which the email
    package would parse again, failing the same way, when the draft is read back to be
    sent."""
    part = MIMEPart(policy=POLICY)
    part.set_content(_without_blind_lines(raw), maintype="application", subtype="octet-stream",
                     disposition="attachment", filename=filename)
    return part


# The headers naming whom a message went to blind (RFC 5322 3.6.3, 3.6.6): never sent on,
# neither in a message (load_draft) nor in one attached to it.
_BLIND_HEADERS = ("Bcc", "Resent-Bcc")
# Line ends as the email package and mail readers split lines: CRLF, a lone CR (old Mac
# style) or LF -- a Bcc after a lone CR is a header line of its own to them.
_LINE_END = rb"(?:\r\n|\r|\n)"
_LINE_START = rb"(?:\A|(?<=\n)|(?<=\r)(?!\n))"
# Such a header line with its folded continuation lines, taken with the line end before it
# (a header block is split at the first empty line before this applies): the line before
# then ends as the cut one did.  Cut with its own line end instead, the line before's lone CR
# and the empty line's LF after it would join into one CRLF, and the header block run on.
_BLIND_LINES = re.compile(_LINE_END + rb"(?:resent-)?bcc[ \t]*:[^\r\n]*(?:" + _LINE_END
                          + rb"[ \t][^\r\n]*)*", re.I)
_EMPTY_LINE = re.compile(_LINE_START + rb"(?:[\r\n]|\Z)")
_FIRST_LINE_END = re.compile(rb"\A" + _LINE_END)


def _drop_blind_headers(msg: Message) -> None:
    for name in _BLIND_HEADERS:
        del msg[name]  # every occurrence, in any case


def _without_blind_lines(raw: bytes) -> bytes:
    end = _EMPTY_LINE.search(raw)
    head = raw[:end.start()] if end else raw
    # A line end put before the first line, so that one is cut as the others are; the head
    # then starts with it, or with the first line's own if that was cut: taken off.
    kept = _BLIND_LINES.sub(b"", b"\n" + head)
    return _FIRST_LINE_END.sub(b"", kept, count=1) + raw[len(head):]


# RFC 5322 2.1.1: at most 998 bytes a line, CRLF not counted; SMTP servers refuse longer
# lines (RFC 5321 4.5.3.1.6) or break them, and a message/rfc822 part may not be encoded
# itself (RFC 2046 5.2.1): what has such lines is re-encoded inside it.
MAX_LINE_BYTES = 998


# A fold in a header's source: a line break (as the parser splits lines) before whitespace.
_SOURCE_FOLD = re.compile(r"(\r\n|\r|\n)(?=[ \t])")


def _unfold(value: str) -> str:
    return _SOURCE_FOLD.sub("", value)


def _check_source_header(name: str, source: str) -> None:
    """A header value as read from a file, to be written as it is: a ComposeError when the
    writer, which breaks the line at every line break str.splitlines() knows, would start a
    line of the value's own (only its folds may break it)."""
    check_header(name, _unfold(source))


# What the email package raises, besides its own errors, on a header value it cannot parse --
# which it does lazily, at each look at the header (a part's MIME headers as it parses and
# writes the message): a Message-ID "<@a@b>" or a parameter "name*0*" without "=" (IndexError),
# thousands of "(" opening nested comments (RecursionError), some ids (AttributeError), an id
# whose domain literal is left open, "<a@[ >" (UnboundLocalError).
_UNPARSABLE = (email.errors.MessageError, IndexError, AttributeError, RecursionError,
               UnboundLocalError)
# The headers the email package parses of every part (get_payload reads the transfer
# encoding), and those also read of a draft's own parts (its body, attachments and id).
_WRITTEN_HEADERS = frozenset({"content-type", "content-transfer-encoding"})
_READ_HEADERS = _WRITTEN_HEADERS | {"content-disposition", "message-id"}


class _TooLongHeader(email.errors.HeaderParseError):
    """A header _BoundedHeaders would not parse: its name and its length."""


class _BoundedHeaders(HeaderRegistry):
    """The email package's headers, but for those it reads of a message from a file
    (_READ_HEADERS; forwarded mail is untrusted) longer than MAX_PARSED_HEADER_CHARS, which
    its parser takes time growing with the square of to read (a Content-Type of 100 KB took
    5 seconds, in parsing the message) and no real one comes near."""

    def __call__(self, name: str, value: str) -> BaseHeader:
        if len(value) > MAX_PARSED_HEADER_CHARS and name.lower() in _READ_HEADERS:
            raise _TooLongHeader(name, len(value))
        return super().__call__(name, value)


# The policy messages from files are parsed with (_parsed, _header).
_READ_POLICY = POLICY.clone(header_factory=_BoundedHeaders())


@dataclass(frozen=True)
class _Source:
    """A message read from a file, as a refusal of it names it and says what to do."""

    name: str
    remedy: str
    # MIME nesting read: the email package writes each level with a few frames of recursion,
    # and hostile mail nests hundreds (a RecursionError on writing it).
    max_depth: int = MAX_DEPTH


def _draft_source(draft_id: str) -> _Source:
    return _Source(f"draft {draft_id!r}", "nothing was sent or saved, and the draft is kept as "
                  "it was: correct it in the mail client that saved it")


# A forward puts it two levels down (multipart/mixed, message/rfc822): read back to be sent,
# the draft is within MAX_DEPTH.
_ATTACHED = _Source("the message to attach", "nothing was saved: attach it in a mail client",
                    MAX_DEPTH - 2)


def _header(name: str, source: str, whose: _Source) -> BaseHeader:
    """A header's source value as the email package reads it, or a ComposeError naming it
    when the package fails on it."""
    value = _unfold(source)
    try:
        return cast(BaseHeader, _READ_POLICY.header_factory(name, value))
    except _TooLongHeader:
        raise _too_long(name, len(value), whose) from None
    except _UNPARSABLE:
        raise _malformed(name, value, whose) from None


def _malformed(name: str, value: str, whose: _Source) -> ComposeError:
    return ComposeError(f"{whose.name}: its {name} header is malformed ({value[:80]!r}), which "
                        f"fmail-nm cannot read; {whose.remedy}")


def _parsed(data: bytes, whose: _Source, read: Set[str] = _WRITTEN_HEADERS) -> EmailMessage:
    """A message read from a file with the headers the email package parses (``read``, of
    the message and its own parts; of an attached message's, _WRITTEN_HEADERS) parsed once
    here: a ComposeError (see _header) instead of a crash wherever the package first looks at
    one."""
    try:
        msg = BytesParser(policy=_READ_POLICY).parsebytes(data)
    except _TooLongHeader as error:  # a Content-Type, which the parser reads of each part
        name, length = error.args
        raise _too_long(name, length, whose) from None
    except _UNPARSABLE:  # the parser reads each part's Content-Type, a multipart's encoding
        raise ComposeError(f"{whose.name}: a Content-Type or Content-Transfer-Encoding header "
                           f"in it is malformed, which fmail-nm cannot read; {whose.remedy}"
                           ) from None
    # A line that is no header ("Bcc : a@b.example", the space RFC 5322's obsolete syntax
    # allows, or one without a colon) ends the header block for the email package, which
    # writes the lines after it as text: a Bcc among them would go out for all to read.
    if any(isinstance(d, email.errors.MissingHeaderBodySeparatorDefect) for d in msg.defects):
        raise ComposeError(f"{whose.name} has a line in its header block that is no header "
                           f"(\"Name: value\"), which fmail-nm cannot read; {whose.remedy}")
    if _too_deep(msg, whose.max_depth):
        raise ComposeError(f"{whose.name} has MIME parts nested more than {whose.max_depth} "
                           f"deep, which fmail-nm cannot write; {whose.remedy}")
    own = {id(part) for part in _mime_parts(msg)}
    for part in msg.walk():
        names = read if id(part) in own else _WRITTEN_HEADERS
        for name, value in part.raw_items():
            if name.lower() in names:
                _header(name, value, whose)
        _check_writable(part, whose)
    return msg


def _too_deep(msg: Message, limit: int) -> bool:
    """Whether parts (an attached message's too) nest deeper than ``limit``: counted without
    recursion, as walk() and the writer would fail on such a message."""
    level = [msg]
    for _ in range(limit):
        level = [child for part in level if part.is_multipart()
                 for child in cast(list[Message], part.get_payload())]
    return any(part.is_multipart() for part in level)


def _check_writable(part: Message, whose: _Source) -> None:
    """A multipart without a boundary (or whose body lacks it) is read as one part, its body
    text (_mime_parts): the email package writes that text decoded in the part's charset, and
    fails on 8-bit bytes."""
    if (part.get_content_maintype() == "multipart" and not part.is_multipart()
            and not str(part.get_payload()).isascii()):
        raise ComposeError(f"{whose.name} says {part.get_content_type()} but has no parts "
                           "(it names no boundary, or one its body does not have), and its "
                           "body has 8-bit bytes, which cannot be written out as they are; "
                           f"{whose.remedy}")


def _has_long_line(data: bytes) -> bool:
    return any(len(line.rstrip(b"\r")) > MAX_LINE_BYTES for line in data.split(b"\n"))


def _header_has_long_line(name: str, value: str) -> bool:
    # The source's value as read: 8-bit bytes are kept as surrogates.
    return _has_long_line(f"{name}: {value}".encode("ascii", "surrogateescape"))


def _shorten_long_lines(msg: Message, whose: _Source) -> None:
    """Every line of a message read from a file (a draft, a forwarded mail) at most 998 bytes,
    what it says unchanged: long headers folded, long lines of a part re-encoded."""
    for inner in msg.walk():
        _fold_long_headers(inner, whose)
        if not inner.is_multipart():
            _encode_long_lines(inner)


def _encode_long_lines(part: Message) -> None:
    """A leaf part with a line over 998 bytes gets its content quoted-printable (text) or
    base64 (anything else): the bytes it decodes to stay the same."""
    # The part as it would be written (its headers are already short): get_payload() would
    # give 8-bit text decoded, not the bytes that go out.
    if not _has_long_line(part.as_bytes(policy=POLICY)):
        return
    data = cast(bytes, part.get_payload(decode=True))
    text = data.replace(b"\r\n", b"\n")
    # Text stays readable, its line breaks line breaks; quoted-printable would leave a lone CR
    # as it is, which the writer turns into a line break: such text goes base64 too.
    if part.get_content_maintype() == "text" and b"\r" not in text:
        cte, encoded = "quoted-printable", binascii.b2a_qp(text)
    else:
        cte, encoded = "base64", base64.encodebytes(data)
    part.set_payload(encoded.decode("ascii"))
    if "Content-Transfer-Encoding" in part:
        part.replace_header("Content-Transfer-Encoding", cte)
    else:
        part["Content-Transfer-Encoding"] = cte


# Of a header the email package parses (a MIME header or Message-ID of a message from a file,
# _BoundedHeaders; one it writes again: 8-bit text in ASCII, a word longer than a line as
# RFC 2047 words), in characters: its parser takes time growing with the square of the
# value's words (a comment of 120 KB took half a minute, a megabyte minutes).  A hundred
# recipients with names fit.
MAX_PARSED_HEADER_CHARS = 16 * 1024


def _too_long(name: str, length: int, whose: _Source, what: str = "") -> ComposeError:
    return ComposeError(f"{whose.name}: its {name} header has {what}{length:,} characters, "
                        f"more than the {MAX_PARSED_HEADER_CHARS:,} fmail-nm parses; "
                        f"{whose.remedy}")


def _check_rewritable(name: str, text: str, whose: _Source, what: str) -> None:
    """Refuse a header with ``what`` that the email package would have to write again when
    it is longer than MAX_PARSED_HEADER_CHARS."""
    if len(text) > MAX_PARSED_HEADER_CHARS:
        raise _too_long(name, len(text), whose, f"{what} and ")


def _fold_long_headers(part: Message, whose: _Source) -> None:
    """Headers with a line over 998 bytes folded at their spaces (the others as they are,
    in their order)."""
    items = list(part.raw_items())
    if not any(_header_has_long_line(name, value) for name, value in items):
        return
    for name in {name.lower() for name, _ in items}:
        del part[name]
    for name, value in items:
        if not _header_has_long_line(name, value):
            part.set_raw(name, value)
        elif (folded := _folded_source(name, _unfold(value))) is not None:
            part.set_raw(name, folded)
        else:
            # A word longer than a line: the email package writes the value again, as RFC 2047
            # words -- decoded first, so a line break it decodes to would start a header.
            _check_rewritable(name, _unfold(value), whose,
                              f"a word longer than a line ({MAX_LINE_BYTES} bytes)")
            header = _header(name, value, whose)
            try:
                header.fold(policy=POLICY)
            except UnicodeError:  # 8-bit bytes, which it cannot write as words of text
                raise ComposeError(f"{whose.name}: its {name} header has a word longer than a "
                                   f"line ({MAX_LINE_BYTES} bytes) and 8-bit bytes, which "
                                   f"fmail-nm cannot write; {whose.remedy}") from None
            part.set_raw(name, check_header(name, header))


# Folded headers' lines: at most 78 columns where the words allow (RFC 5322 2.1.1).
_FOLD_WIDTH = 78
_SOURCE_WORD = re.compile(r"[ \t]*[^ \t]+|[ \t]+")
# In an address list we write, a quoted name is one word: GMime (notmuch, and listings made
# from it) keeps a fold inside quotes as a line break in the name.  Only for values built
# here, whose quotes all close: in untrusted text each unclosed one would be a scan to its end.
_ADDRESS_WORD = re.compile(r'[ \t]*(?:"(?:[^"\\]|\\.)*"|[^ \t])+|[ \t]+')


def _folded_source(name: str, value: str, words: re.Pattern[str] = _SOURCE_WORD) -> str | None:
    """An unfolded source value folded before the whitespace between its ``words``, its words
    as they are (folding adds nothing a reader sees, and an encoded word holds no whitespace);
    None when a word is too long for a line of 998 bytes (8-bit bytes are one character each
    in a source value)."""
    lines = [""]
    width = len(name) + 2
    for word in words.findall(value):
        if lines[-1] and width + len(word) > _FOLD_WIDTH:
            lines.append("")
            width = 0
        lines[-1] += word
        width += len(word)
        if width > MAX_LINE_BYTES:
            return None
    return "\r\n".join(lines)


def _keep_header(msg: EmailMessage, name: str, source: str) -> None:
    """A header of a saved draft written back as its file has it (its line ends CRLF).  Given
    as text, the email package would parse it again: decode its encoded words a second time
    (text from hostile mail that decodes to an encoded word hiding a line break would start a
    header of its own) and put U+FFFD for 8-bit bytes."""
    _check_source_header(name, source)
    limit = POLICY.header_max_count(name)
    if limit is not None and sum(k.lower() == name.lower() for k in msg.keys()) >= limit:
        return  # a second Reply-To or Sender: the draft's first one stands
    msg.set_raw(name, source)


def _authors(c: Composition) -> list[Address]:
    """Its From: who wrote it."""
    return c.authors or [c.sender]


def build(c: Composition, now: datetime) -> EmailMessage:
    """The message as it is saved (Bcc included: the Drafts and Sent copies show it; the
    sender strips it)."""
    msg = EmailMessage(policy=POLICY)
    for name, people in (("From", _authors(c)), ("To", c.to), ("Cc", c.cc),
                         ("Bcc", c.bcc)):
        if people:
            msg.set_raw(name, _address_list(name, people))
    _set_subject(msg, check_header("subject", c.subject))
    msg["Date"] = email.utils.format_datetime(now.astimezone())
    msg["Message-ID"] = f"<{c.message_id}>" if c.message_id else new_message_id(c.sender)
    # Set as they are to be written: the email package folds a line an id does not fit into
    # as RFC 2047 words, which no mail client reads a msg-id from (Microsoft 365's and Amazon
    # SES's ids are that long), and the reply would not thread.
    if c.in_reply_to and _threadable(c.in_reply_to):
        msg.set_raw("In-Reply-To", f"<{c.in_reply_to}>")
    refs = [r for r in c.references if _threadable(r)]
    if refs:
        if len(refs) > MAX_REFERENCES:
            refs = refs[:1] + refs[-(MAX_REFERENCES - 1):]
        msg.set_raw("References", _id_list("References", refs))
    if c.forwarded and _threadable(c.forwarded):
        msg.set_raw(FORWARDED_HEADER, f"<{c.forwarded}>")
    for name, source in c.kept_headers:
        _keep_header(msg, name, source)
    _text_part(msg, c.body)
    if c.attached:
        msg.make_mixed()
        for part in c.attached:
            # typeshed wants an EmailMessage; a part must not be one (it would add its own
            # MIME-Version header)
            msg.attach(cast(EmailMessage, part))
    return msg


def _id_list(name: str, ids: Sequence[str]) -> str:
    """``<a> <b> ...`` folded between ids at 78 columns, never inside one (an id is at most
    250 characters: a line stays under 998)."""
    lines = [""]
    room = 78 - len(name) - 2  # after "References: "
    for mid in ids:
        word = f"<{mid}>"
        if lines[-1] and len(lines[-1]) + 1 + len(word) > room:
            lines.append("")
            room = 78 - 1  # after the folding space
        lines[-1] = f"{lines[-1]} {word}" if lines[-1] else word
    return "\r\n ".join(lines)


def new_message_id(sender: Address) -> str:
    """``<unique@domain>`` in the sender's domain, as mail clients write them."""
    return email.utils.make_msgid(domain=sender.address.rpartition("@")[2])


def _threadable(message_id: str) -> bool:
    """Whether an id may go into In-Reply-To / References: a well-formed one, and not the id
    notmuch made up for a message without a Message-ID (nobody else knows it)."""
    return bool(_MSG_ID.fullmatch(message_id)) and not message_id.startswith("notmuch-sha1-")


def serialize(config: Config, msg: EmailMessage) -> bytes:
    try:
        data = msg.as_bytes(policy=POLICY)
    except (UnicodeError, ValueError) as exc:  # e.g. a non-ASCII address the policy refuses
        raise ComposeError(f"the message cannot be encoded: {exc}") from None
    return check_size(config, data)


# A non-ASCII subject or name as Q-encoded words of whole characters.  The email package writes
# base64 words, and those before the last end in "=" padding; GMime, and so notmuch and every
# listing made from it, stops decoding at such padding ("Приглашение на день ро 14 марта"),
# and the package's folding can also move a space between two words, where readers drop it.
_SUBJECT_CHARSET = email.charset.Charset("utf-8")
_SUBJECT_CHARSET.header_encoding = email.charset.QP


def _set_subject(msg: EmailMessage, subject: str) -> None:
    if subject.isascii() and "=?" not in subject:
        msg["Subject"] = subject
        return
    # Encoded here and set as it is to be written: given the text, the email package would
    # also read "=?" in it as an encoded word and decode it, and a line break in that (a
    # subject taken from hostile mail) would start a header of its own, such as a Bcc.
    msg.set_raw("Subject", _subject_header(subject).encode(linesep="\r\n"))


def _encoded_words(name: str, text: str) -> str:
    """``text`` as Q-encoded words on one line, space between them (see _SUBJECT_CHARSET).
    Their letters are those RFC 2047 5(3) allows in a phrase: a name needs no quoting."""
    header = email.header.Header(text, _SUBJECT_CHARSET, header_name=name)
    return _unfold(header.encode(linesep="\r\n"))


def _subject_header(subject: str, name: str = "Subject") -> email.header.Header:
    """The ASCII words before the first other one as they are ("Re: ", as mutt writes it),
    the rest encoded -- all of it encoded where a plain prefix would not read back exactly."""
    header = email.header.Header(header_name=name)
    words = subject.split(" ")
    first = next(i for i, word in enumerate(words) if not word.isascii() or "=?" in word)
    prefix, rest = " ".join(words[:first]), " ".join(words[first:])
    # Header puts one space between the two parts; "=?" could read as an encoded word.
    if prefix and prefix.strip() == prefix and "  " not in prefix and "=?" not in prefix:
        header.append(prefix, "us-ascii")
        header.append(rest, _SUBJECT_CHARSET)
    else:
        header.append(subject, _SUBJECT_CHARSET)
    return header


# ---------------------------------------------------------------------------------------------
# Who writes: the account and the From address


def user_name(mb: Mailbox) -> str:
    return mb.reader.setting("user.name", "")


def account_named(config: Config, name: str | None) -> Account:
    if name is None:
        return config.accounts[0]
    try:
        return config.account(name)
    except ConfigError as exc:
        raise ComposeError(str(exc)) from None


def own_address(account: Account, config: Config) -> str:
    found = account.addresses or config.addresses
    if not found:
        raise ComposeError(f"account {account.name!r} has no address: set addresses in its "
                           "[[accounts]] entry in fmail.toml")
    return ascii_address(found[0])  # as it goes on the wire


def _configured_address(config: Config, address: str, holder: Account | None = None
                        ) -> tuple[Account | None, str] | None:
    """The user's address ``address`` is, as fmail.toml writes it, and the account it is of
    (None: a top-level address no account lists) -- the one account writing from it, else
    ``holder``, the account holding the message, when it lists the address too (accounts
    found in an mbsync config list all of the user's addresses); None when it is not the
    user's.  Compared in canonical form: mail may write the domain in ACE where the config
    has Unicode, or the other way round."""
    wanted = canonical_address(address)
    first = [a for a in [_writer_of(config, wanted), holder] if a is not None]
    for account in [*first, *config.accounts]:
        for own in account.addresses:
            if canonical_address(own) == wanted:
                return account, own
    for own in config.settings.addresses:
        if canonical_address(own) == wanted:
            return None, own
    return None


def _writer_of(config: Config, wanted: str) -> Account | None:
    """The one account writing from ``wanted`` (a canonical address, its first), when only
    one does: accounts found in an mbsync config list every address, the login first."""
    writers = [a for a in config.accounts
               if a.addresses and canonical_address(a.addresses[0]) == wanted]
    return writers[0] if len(writers) == 1 else None


# ---------------------------------------------------------------------------------------------
# Saving a draft


def _draft_folder(ctx: WriteContext, account: Account, replaced: str | None) -> Path:
    """The account's Drafts folder; a draft saved again whose From the user changed (in mutt)
    to an account that has none stays in the Drafts folder it lies in -- refusing it would
    lose the model's edit, and sending it goes through the From's account all the same
    (_draft_sender)."""
    folder = account.folders.get("drafts")
    if folder is None and replaced is not None:
        folder = _drafts_folder_of(ctx, replaced)
    try:
        return maildir.ensure_maildir(ctx.config, folder or account.folder("drafts"))
    except ConfigError as exc:
        raise ComposeError(str(exc)) from None


def _drafts_folder_of(ctx: WriteContext, message_id: str) -> str | None:
    """The Drafts folder (of any account) a saved draft's file lies in, if any."""
    found = ctx.reader.find(message_id)
    names = [] if found is None else _in_drafts(ctx.config, found.filenames)
    return next(iter(maildir.folders_of(ctx.config.mail_root, names)), None)


def _in_drafts(config: Config, filenames: Iterable[str]) -> list[str]:
    """The files of these that lie in a Drafts folder, of any account."""
    return [name for name in filenames if maildir.in_role(config, [name], "drafts")]


def _result(ctx: WriteContext, c: Composition, message_id: str,
            sent: bool = False) -> DraftResult:
    # From as the recipients see it: a Sender (the envelope's) is shown by no read either.
    return DraftResult(id=_answer_id(ctx, message_id), message_id=message_id,
                       from_=", ".join(p.address for p in _authors(c)),
                       to=[p.address for p in c.to], cc=[p.address for p in c.cc],
                       bcc=[p.address for p in c.bcc],
                       # (a reply keeps an original's subject of kilobytes: the draft has it)
                       subject=cut(c.subject, MAX_SUBJECT_CHARS_SHOWN), sent=sent)


def _answer_id(ctx: WriteContext, message_id: str) -> str:
    """The uid when the mirror has the message, else the Message-ID, as listings give it: a
    uid resolves only through the mirror, whose sync after the write may have failed."""
    uid = sidecar.uid_for(message_id)
    return uid if sidecar.lookup_uids(ctx.config.data_dir, [uid]) else message_id


def _drafts_of(txn: WriteTxn, config: Config, message_id: str,
               keep: Path | None = None) -> list[Path]:
    """The message's files in a Drafts folder, as the write session sees them -- of any
    account: a draft whose From the user changed to another account's address (in mutt)
    still lies in the Drafts folder it was first saved in."""
    message = txn.get(message_id)
    if message is None:
        return []
    return [Path(name) for name in _in_drafts(config, message.filenames) if Path(name) != keep]


def _already_tagged(ctx: WriteContext, message_id: str) -> None:
    """The rules ran on the new file in the write session: the sidecar's mirror (synced by the
    write's follow-up) need not queue it for the tagging pass."""
    with sidecar.opened(ctx.sidecar_file) as conn:
        sidecar.mark_tagged(conn, [message_id])


def store_draft(ctx: WriteContext, c: Composition) -> DraftResult:
    """Check, build and save a draft (replacing the draft with ``c.message_id``, if any)."""
    everyone = [*c.to, *c.cc, *c.bcc]
    if len(everyone) > MAX_RECIPIENTS:
        raise ComposeError(f"{len(everyone)} recipients; at most {MAX_RECIPIENTS}")
    check_not_blocked(ctx.config, everyone)
    replaced = c.message_id
    if replaced is not None and not _threadable(replaced):
        # notmuch's name for a draft saved without a Message-ID (a hash of its file, which
        # saving changes): the draft gets a Message-ID of its own.
        c = replace(c, message_id=None)
    msg = build(c, ctx.clock())
    data = serialize(ctx.config, msg)
    mid = str(msg["Message-ID"]).strip().strip("<>")
    folder = _draft_folder(ctx, c.account, replaced)

    written: list[Path] = []  # what the session did on disk, for a commit that fails
    removed: list[Path] = []

    def job(txn: WriteTxn) -> None:
        new = mover.add_new_file(txn, data, folder, DRAFT_FLAGS)
        written.append(new)
        # With maildir.synchronize_flags off no tag follows the D flag: without the tag the
        # rules would take the draft for mail the user sent, and no tool would find it again.
        txn.change_tags([mid], add=[tags.DRAFT])
        # The new file is indexed first, so the message never leaves the index.
        for draft in dict.fromkeys([mid, replaced or mid]):
            for path in _drafts_of(txn, ctx.config, draft, keep=new):
                mover.delete_file(txn, path)
                removed.append(path)
        tag_added(txn, ctx.config, [mid])

    try:
        report = changes.apply_session(ctx, "save_draft", {
            "id": mid, "account": c.account.name, "subject": c.subject,
            NOT_UNDOABLE: "a saved draft is not taken back by undo; delete_messages moves it "
                          "to Trash"}, [mid], job)
    except WriteNotSaved as exc:
        raise _draft_not_saved(exc, written, removed) from None
    if report.errors:
        raise ComposeError(f"the draft could not be saved: {report.errors[0][1]}")
    _already_tagged(ctx, mid)
    ctx.seen_drafts.saw(mid, data)
    if replaced == mid:
        _read_again(ctx, mid)
    return _result(ctx, c, mid)


def _draft_not_saved(exc: WriteNotSaved, written: Sequence[Path],
                     removed: Sequence[Path]) -> WriteNotSaved:
    """A draft's session notmuch could not commit, with what it left on disk said exactly:
    the next index would index its new file, and saving it again would make a second draft.
    A new draft's file is taken back (nothing refers to it); a new version stays, as the
    session unlinked the old one already."""
    if not removed:
        for path in written:
            path.unlink(missing_ok=True)
        return WriteNotSaved(exc.reason, "the draft was not saved, nothing was changed; "
                                         "save it again once there is space")
    return WriteNotSaved(exc.reason, f"the new version of the draft is saved as the file "
                         f"{written[0]} in place of the old one, and the next `fmail-nm index` "
                         "indexes it; do not save it again")


def _read_again(ctx: WriteContext, message_id: str) -> None:
    """A draft saved again under its Message-ID: notmuch keeps the subject, date and sender
    (and the words) of the file it first indexed -- a later file of the same id only adds
    words -- so listings would show the first save.  Reindexed, and the mirror told."""
    failed = notmuch_cli.reindex(ctx.writer.config_path, id_query([message_id]))
    if failed is not None:  # saved all the same; the next `fmail-nm index` shows it right
        log.warning("draft %s saved, but not reindexed: %s", message_id, failed)
        return
    if ctx.after_write is not None:  # no file changed: nothing more to push
        ctx.after_write(changes.WriteOutcome("save_draft", (message_id,), frozenset()))


def _existing_draft(ctx: WriteContext, draft_id: str) -> tuple[IndexedMessage, bytes]:
    """The draft and its one version in Drafts (without mbsync's header): refused when another
    mail client left two versions of it (an edit whose old version is not gone yet) -- it
    would be sent or saved over, stale -- and as :func:`_files_in_drafts` says."""
    found = Mailbox(ctx.config, ctx.reader, ctx.clock).find(draft_id)
    if found is None or not (tags.DRAFT in found.tags
                             or maildir.in_role(ctx.config, found.filenames, "sent")):
        raise ComposeError(f"no draft with id {draft_id!r}; drafts are found with "
                           "search_emails('in:drafts')")
    # A copy mbsync fetched back (its state lost) is the same version as the local file.
    versions = {drafts.version(data): drafts.without_sync_header(data)
                for data in _file_contents(_files_in_drafts(ctx.config, found, draft_id))}
    if len(versions) > 1:
        raise ComposeError(f"draft {draft_id!r} has {len(versions)} different versions in "
                           "Drafts (edited in another mail client meanwhile); nothing was "
                           "changed: the user keeps the right one there, deletes the others")
    if not versions:
        raise ComposeError(f"draft {draft_id!r} has no file in a Drafts folder; re-index "
                           "(fmail-nm index) and try again")
    return found, versions.popitem()[1]


def _files_in_drafts(config: Config, found: IndexedMessage, draft_id: str) -> list[str]:
    """The draft's files in a Drafts folder; refused when another mail client moved, deleted
    or sent it -- its copy in Sent while the draft's deletion has not arrived yet: sending it
    here would send it twice."""
    names = _in_drafts(config, found.filenames)
    if not names:
        raise ComposeError(f"draft {draft_id!r} is no longer in a Drafts folder but in "
                           f"{', '.join(maildir.folders_of(config.mail_root, found.filenames))}"
                           " (sent, deleted or moved in a mail client); it was left as it is")
    if maildir.in_role(config, found.filenames, "sent"):
        raise ComposeError(f"draft {draft_id!r} has a copy in Sent too: it was sent already "
                           "(from another mail client); it was left as it is")
    return names


def _file_contents(names: Sequence[str]) -> list[bytes]:
    """What the files hold as they are named now; those gone meanwhile left out."""
    found = []
    for name in names:
        for path in maildir.on_disk(Path(name)):
            try:
                found.append(path.read_bytes())
            except OSError:
                continue
    return found


def _people(msg: EmailMessage, name: str, draft_id: str) -> list[Address]:
    """A draft's addresses in header ``name`` as it goes out (_ascii_source), for sending
    and for saving again alike: its raw 8-bit bytes may read as other addresses than its text
    in the draft's charset does (iso-8859-2's c-caron is windows-1252's e-grave; a Shift_JIS
    letter's second byte is a backslash, escaping a quote)."""
    # From the source values: the email package's own parse puts a space between two
    # adjacent encoded-words of a long name, which saving the draft again would make real.
    charset = _draft_charset(msg)
    return parse_addresses((_ascii_source(key, value, charset, draft_id)
                            for key, value in msg.raw_items() if key.lower() == name), name, [],
                           as_written=True)


def save_draft(ctx: WriteContext, to: Sequence[str] | None = None,
               cc: Sequence[str] | None = None, bcc: Sequence[str] | None = None,
               subject: str | None = None, body: str | None = None, *,
               account: str | None = None, attachments: Sequence[str] = (),
               draft_id: str | None = None) -> DraftResult:
    """A new draft, or -- with ``draft_id`` -- that draft saved again: what is given replaces
    its part, the rest (threading, From, what is not given) is kept."""
    if draft_id is None:
        acct = account_named(ctx.config, account)
        c = Composition(account=acct, sender=Address("", own_address(acct, ctx.config)),
                        to=[], cc=[], bcc=[], subject="", body="")
    else:
        c = draft_composition(ctx, draft_id)
        if account is not None and account != c.account.name:
            raise ComposeError("a saved draft stays in its account; start a new draft to "
                               "write from another")
    if to is not None:
        c.to = check_addresses(to, "to")
    if cc is not None:
        c.cc = check_addresses(cc, "cc")
    if bcc is not None:
        c.bcc = check_addresses(bcc, "bcc")
    if subject is not None:
        c.subject = check_given("subject", subject)
    if body is not None:
        c.body = body
    if attachments:
        c.attached = [*c.attached, *(file_part(attachment_path(ctx.config, a))
                                     for a in attachments[:MAX_ATTACHMENTS + 1])]
        if len(c.attached) > MAX_ATTACHMENTS:
            raise ComposeError(f"at most {MAX_ATTACHMENTS} attachments")
    name = user_name(Mailbox(ctx.config, ctx.reader, ctx.clock))
    if draft_id is None and name:
        c.sender = Address(name, c.sender.address)
    return store_draft(ctx, c)


def draft_composition(ctx: WriteContext, draft_id: str) -> Composition:
    """A saved draft read back into its parts (the user may have edited it in mutt), to be
    built again: refused when the user changed it since the model last saw it (the model's
    text would drop the user's edit), and when building would lose its HTML."""
    found, data = _existing_draft(ctx, draft_id)
    if ctx.seen_drafts.changed(found.message_id, data):
        raise ComposeError(f"draft {draft_id!r} changed since you last read or saved it (in "
                           "another mail client); nothing was saved: read it again "
                           "(get_email) and apply your change to that")
    c, msg = _draft_parts(ctx, draft_id, found, data)
    if msg.get_body(preferencelist=("html",)) is not None:
        raise ComposeError(f"draft {draft_id!r} has an HTML body (written by another mail "
                           "client), which fmail-nm does not edit: change it there, or start "
                           "a new draft; send_email sends it as it is")
    c.body = _draft_body(msg, draft_id)
    return c


def _draft_body(msg: EmailMessage, draft_id: str) -> str:
    """A draft's plain text, to be built again; refused in a charset Python has no codec for
    (mutt sends such a draft as it is, and so does send_email)."""
    part = msg.get_body(preferencelist=("plain",))
    if not isinstance(part, EmailMessage):
        return ""
    try:
        body = str(part.get_content())
    except (LookupError, ValueError):  # ValueError: UnicodeError, a NUL in the name
        raise ComposeError(f"draft {draft_id!r} has its text in charset "
                           f"{part.get_param('charset')!r}, which fmail-nm cannot read; "
                           "nothing was saved, and the draft is kept as it was: change it in "
                           "the mail client that saved it, or start a new draft; send_email "
                           "sends it as it is") from None
    if part.get_param("format") == "flowed":
        # aerc's or Thunderbird's draft: rebuilt as plain text, its lines are the logical ones
        body = unescape_line_marks(unflow(body, delsp=part.get_param("delsp") == "yes"))
    return body


def _draft_parts(ctx: WriteContext, draft_id: str, found: IndexedMessage,
                 data: bytes) -> tuple[Composition, EmailMessage]:
    msg = _parsed(data, _draft_source(draft_id), _READ_HEADERS)
    account, sender, authors = _draft_sender(ctx.config, msg, found, draft_id)
    # The body is read by draft_composition alone (_draft_body): a draft is sent as it is.
    return Composition(
        account=account, sender=sender, authors=authors, to=_people(msg, "to", draft_id),
        cc=_people(msg, "cc", draft_id), bcc=_people(msg, "bcc", draft_id),
        subject=str(msg.get("subject", "")), body="",
        message_id=found.message_id, in_reply_to=_first_id(msg.get("in-reply-to")),
        references=_ids(msg.get("references")), forwarded=_first_id(msg.get(FORWARDED_HEADER)),
        attached=[p for p in msg.iter_attachments() if isinstance(p, MIMEPart)],
        kept_headers=[(name, value) for name, value in msg.raw_items()
                      if name.lower() not in _BUILT_HEADERS]), msg


def _draft_sender(config: Config, msg: EmailMessage, found: IndexedMessage,
                  draft_id: str) -> tuple[Account, Address, list[Address]]:
    """The account a draft goes out through, its sender and its From: the sender is the one
    its Sender names, one of the user's addresses, else its From's one address (RFC 5322
    3.6.2: From with several needs a Sender saying who sent it); the account the one writing
    from it, else the one holding the draft."""
    authors = _people(msg, "from", draft_id)
    named = _people(msg, "sender", draft_id)
    if len(named) > 1:
        raise ComposeError(f"draft {draft_id!r} has {len(named)} Sender addresses; it names "
                           "the one who sends the mail: correct it in the mail client that "
                           "saved the draft")
    if not named and msg.get_all("sender"):
        raise ComposeError(f"draft {draft_id!r} has a Sender header that names no address (it "
                           "holds the one mailbox that sends the mail): correct it in the mail "
                           "client that saved the draft, or drop it")
    if len(authors) > 1 and not named:
        raise ComposeError(f"draft {draft_id!r} has {len(authors)} From addresses and no "
                           "Sender, which mail needs to say which of them sends it: add a "
                           "Sender header in the mail client that saved the draft, or keep "
                           "one From address")
    senders = named or authors
    holder = maildir.primary_account(config, found)
    own = _configured_address(config, senders[0].address, holder) if senders else None
    # Reads show no Sender: one naming another (a list's bounce address, kept from mail
    # edited as new) would be the envelope's sender unseen, getting the bounces, which quote
    # the mail.  (A From naming another is shown: that one goes out from it.)
    if named and own is None:
        raise ComposeError(f"draft {draft_id!r} has Sender {named[0].address}, none of the "
                           "user's addresses, which the mail would go from: correct it in "
                           "the mail client that saved the draft, or drop it")
    account = (own[0] if own else None) or holder
    if account is None or not senders or not authors:
        raise ComposeError(f"draft {draft_id!r} has no From address of the user's accounts")
    return account, senders[0], authors


# The headers build() writes itself; a saved draft's others are kept (Composition).
_BUILT_HEADERS = frozenset({
    "from", "to", "cc", "bcc", "subject", "date", "message-id", "in-reply-to", "references",
    FORWARDED_HEADER.lower(), "mime-version", "content-type", "content-transfer-encoding",
    "content-disposition"})


def _ids(value: object) -> list[str]:
    return re.findall(r"<([^<>\s]+)>", str(value or ""))


def _first_id(value: object) -> str | None:
    found = _ids(value)
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# Replies and forwards


def strip_prefix(subject: str, prefix: re.Pattern[str]) -> str:
    return prefix.sub("", subject, count=1).strip()


def reply_subject(subject: str) -> str:
    """``Re:`` once, on one line (a hostile subject may carry encoded line breaks)."""
    return "Re: " + strip_prefix(one_line(subject), _REPLY_PREFIX)


def forward_subject(subject: str) -> str:
    return "Fwd: " + strip_prefix(one_line(subject), _FORWARD_PREFIX)


def quoted(text: str) -> str:
    return "\n".join(">" if not line else f"> {line}" for line in text.rstrip().split("\n"))


def _original(mb: Mailbox, ref: str) -> tuple[IndexedMessage, bytes]:
    found = mb.find(ref)
    if found is None:
        thread = is_thread_id(mb.reader, ref)
        why = " (that is a thread's id: name one of its messages)" if thread else ""
        raise ComposeError(f"no message with id {ref!r}{why}; use an id from search_emails")
    for name in found.filenames:
        try:
            return found, Path(name).read_bytes()
        except OSError:
            continue
    raise ComposeError(f"the file of message {found.message_id} is gone from disk; re-index "
                       "(fmail-nm index) and try again")


def _writer_of_reply(config: Config, message: IndexedMessage,
                     seen: Sequence[Address]) -> tuple[Account, str]:
    """The account and address a reply is written from: the user's address the original was
    sent to (as configured, whichever form the original wrote it in; for a sub-address
    fmail.toml does not list, the address it is of), else the address of the account that
    holds it."""
    holder = maildir.primary_account(config, message)
    for person in seen:
        found = (_configured_address(config, person.address, holder)
                 or _configured_address(config, mailbox_address(person.address), holder))
        if found is not None:
            account = found[0] or holder
            if account is not None:
                return account, ascii_address(found[1])
    account = holder or config.accounts[0]
    return account, own_address(account, config)


def _delivered_to(head: Message) -> list[Address]:
    """The addresses the mail was delivered to when To/Cc do not say (Bcc, aliases, lists)."""
    defects: list[str] = []
    return [a for name in ("delivered-to", "x-original-to", "envelope-to")
            for a in addresses(head, name, defects)]


def _check_read_whole(head: Message, names: Sequence[str], advice: str) -> None:
    """A ComposeError when one of these address headers, which the reply takes its
    recipients from, could not be read whole (a recipient left out of a reply unsaid is worse
    than no reply)."""
    unread: list[str] = []
    for name in names:
        addresses(head, name, [], unread)
    if unread:
        raise ComposeError(f"the original's addresses could not all be read "
                           f"({'; '.join(unread)}); {advice}")


def reply_recipients(config: Config, head: Message, reply_all: bool,
                     parsed_from: list[Address], parsed_to: list[Address],
                     parsed_cc: list[Address], reply_to: list[Address]
                     ) -> tuple[list[Address], list[Address]]:
    """(To, Cc) of a reply: Reply-To over From; for reply-all Mail-Followup-To over
    everyone; the user's own addresses left out (a reply to one's own mail goes to its
    recipients).  When that leaves To empty but not Cc, Cc becomes To; a Reply-To naming
    only the user gives way to From.  Refused when a header it takes recipients from was not
    read whole -- only those it takes them from."""
    defects: list[str] = []
    mine = my_addresses(config)
    own = bool(parsed_from) and is_own_address(parsed_from[0].address, mine)
    advice = _ADD_THEM if reply_all else _WRITE_THEM
    _check_read_whole(head, ("from", "reply-to", *(("to", "cc", "mail-followup-to")
                                                   if reply_all else ())), advice)
    followup = addresses(head, "mail-followup-to", defects, as_written=True)
    if reply_all and followup:
        return _unique(followup, mine, _ADD_THEM), []
    if own:
        if not reply_all:
            _check_read_whole(head, ("to",), advice)
        to = _unique(parsed_to, mine)
        rest = parsed_cc
    else:
        to = _unique(reply_to, mine) or _unique(parsed_from, mine)
        rest = [*parsed_to, *parsed_cc]
    if to and not reply_all:  # the others are not read: one of them cannot stop the reply
        return to, []
    if not reply_all:  # the others are whom the reply goes to
        _check_read_whole(head, ("cc",) if own else ("to", "cc"), advice)
    others = _unique(rest, mine, _ADD_THEM if to else _WRITE_THEM,
                     taken={canonical_address(p.address) for p in to})
    if not to:  # e.g. the user's own mail to themselves, the others in Cc
        return others, []
    return to, others


def _attribution(date: datetime | None, author: list[Address]) -> str:
    """As mutt's: the original's date in its sender's own zone, as the Date header gives
    it ("+0100"); UTC when the header names no zone."""
    who = author[0] if author else None
    name = (who.name or who.address) if who else "someone"
    if date is None:
        return f"{name} wrote:"
    return f"On {date:%a, %d %b %Y at %H:%M} {date.strftime('%z') or 'UTC'}, {name} wrote:"


# Of the original a reply quotes, in characters: quoting a log of megabytes took seconds to
# clean and build, and made a draft too big to send ([send] max_message_mb).
MAX_QUOTED_CHARS = MAX_BODY_CHARS


def reply_to_email(ctx: WriteContext, id: str, body: str, *, reply_all: bool = False,
                   quote: bool = True) -> DraftResult:
    """A reply saved as a draft: threading headers, Re: subject, From the address the mail
    was sent to; with ``quote`` the original's clean text quoted below an attribution line
    (the reply is written above the quote)."""
    mb = Mailbox(ctx.config, ctx.reader, ctx.clock)
    message, raw = _original(mb, id)
    parsed = read_message(raw)
    head, _ = split_head(raw)
    # Named as written (a comment is no name): the reply shows the names to its recipients.
    from_, original_to, original_cc, reply_to = (
        addresses(head, name, [], as_written=True) for name in ("from", "to", "cc", "reply-to"))
    to, cc = reply_recipients(ctx.config, head, reply_all, from_, original_to, original_cc,
                              reply_to)
    if reply_all and len(to) + len(cc) > MAX_RECIPIENTS:
        raise ComposeError(f"a reply to everyone would go to {len(to) + len(cc):,} people, "
                           f"and a draft has at most {MAX_RECIPIENTS} recipients; {_ADD_THEM}")
    if not to:
        raise ComposeError("the reply has no recipient left (the original is from and to the "
                           "user only); use save_draft with to")
    account, address = _writer_of_reply(ctx.config, message, [
        *original_to, *original_cc, *_delivered_to(head), *from_])
    text = body.rstrip("\n")
    if quote and parsed.text.strip():
        # A forward's forwarded message is what the reply is about: quoted with the note.
        forward = is_forward_subject(parsed.subject or message.subject)
        whole = parsed.text
        original = clean_text(whole[:MAX_QUOTED_CHARS], forward=forward, answered=True,
                              head=len(whole) > MAX_QUOTED_CHARS)
        if parsed.from_html:  # the quote goes to people: no Markdown escapes
            original = unescape_line_marks(original)
        written = written_date(header(head, "date"))  # parsed.date is in UTC
        text += "\n\n" + _attribution(written, from_) + "\n" + quoted(original)
        if len(whole) > MAX_QUOTED_CHARS:
            text += (f"\n>\n> [… {len(whole) - MAX_QUOTED_CHARS:,} more characters of the "
                     "original not quoted]")
    refs = parsed.references or ([parsed.in_reply_to] if parsed.in_reply_to else [])
    c = Composition(
        account=account, sender=Address(user_name(mb), address), to=to, cc=cc, bcc=[],
        subject=reply_subject(parsed.subject or message.subject), body=text + "\n",
        in_reply_to=message.message_id, references=[*refs, message.message_id])
    return store_draft(ctx, c)


def forward_email(ctx: WriteContext, id: str, to: Sequence[str], body: str = "") -> DraftResult:
    """A forward saved as a draft: the original attached whole (message/rfc822, with its own
    attachments), the caller's text as the body, Fwd: subject."""
    mb = Mailbox(ctx.config, ctx.reader, ctx.clock)
    message, raw = _original(mb, id)
    recipients = check_addresses(to, "to")
    if not recipients:
        raise ComposeError("to: give at least one recipient")
    parsed = read_message(raw)
    account, address = _writer_of_reply(ctx.config, message, [
        *parsed.to, *parsed.cc, *_delivered_to(split_head(raw)[0])])
    subject = parsed.subject or message.subject
    c = Composition(
        account=account, sender=Address(user_name(mb), address), to=recipients, cc=[], bcc=[],
        subject=forward_subject(subject), body=body.rstrip("\n") + "\n",
        forwarded=message.message_id,
        attached=[message_part(raw, _eml_name(subject))])
    return store_draft(ctx, c)


def _eml_name(subject: str) -> str:
    stem = re.sub(r"[^\w.-]+", "_", subject).strip("._")[:60] or "message"
    return f"{stem}.eml"


# ---------------------------------------------------------------------------------------------
# After a send


@dataclass(frozen=True)
class Outgoing:
    """A draft checked and ready for the sender: the bytes to send (no Bcc nor Resent-Bcc),
    the envelope."""

    composition: Composition
    message_id: str  # as sent: the draft's, or one given to a draft saved without
    saved: bytes  # the draft as filed in Sent (with Bcc, as mutt's copy keeps it)
    sent_folder: Path | None  # None: the account's server files its own copy
    wire: bytes
    envelope_from: str
    recipients: tuple[str, ...]


# What a mail client keeps in a postponed message for its own sending, never sent nor filed:
# mutt's X-Mutt-* (its Fcc, crypto, the message replied to), an Fcc (mutt, notmuch-emacs),
# Thunderbird's X-Mozilla-* and identity; the phones': Apple Mail's X-Apple-* and draft type,
# K-9's (Thunderbird for Android) identity, which holds the signature and the message replied
# to; mbsync's X-TUID, in the copy it uploads, which a draft edited on the phone keeps.
_CLIENT_HEADER = re.compile(r"x-mutt-|x-mozilla-|x-apple-|(fcc|x-identity-key|x-account-key"
                            r"|x-uniform-type-identifier|x-k9mail-identity|x-tuid)$", re.I)
# mutt's crypto letters in X-Mutt-PGP / X-Mutt-SMIME (postpone.c): E encrypt, S sign, A
# Autocrypt; <...> holds a key id or an algorithm.
_MUTT_CRYPTO = re.compile(r"[ESA]", re.I)


def _check_sendable(msg: EmailMessage, draft_id: str) -> None:
    """Refuse a draft another client still has work to do on before it is mail."""
    if msg["X-Notmuch-Emacs-Draft"] is not None:
        raise ComposeError(f"draft {draft_id!r} was saved by notmuch-emacs as MML, markup only "
                           "Emacs turns into mail (attachments, signing): send it from Emacs")
    for name in ("X-Mutt-PGP", "X-Mutt-SMIME"):
        letters = re.sub(r"<[^>]*>", "", str(msg.get(name, "")))
        if _MUTT_CRYPTO.search(letters):
            raise ComposeError(f"draft {draft_id!r} is to be encrypted or signed on sending "
                               f"({name}: {letters.strip()}), which fmail-nm cannot do: send "
                               "it from mutt")
    # Re-encoded (see _shorten_long_lines), a signed part would no longer match its signature.
    if any(_has_long_line(signed.as_bytes(policy=POLICY))
           for part in msg.walk() if part.get_content_type() == "multipart/signed"
           for signed in part.iter_parts()):
        raise ComposeError(f"draft {draft_id!r} is signed and has a line over 998 bytes, which "
                           "servers refuse and re-encoding would break the signature: nothing "
                           "was sent; sign it again from the mail client that signed it")


def load_draft(ctx: WriteContext, draft_id: str) -> Outgoing:
    """A saved draft read back and checked again as if it were new, since the user may have
    edited it in a mail client: headers, addresses, blocklist, size; lines over 998 bytes
    re-encoded.  Its Date becomes the time of sending, as mail clients do with a postponed
    message."""
    found, data = _existing_draft(ctx, draft_id)
    c, msg = _draft_parts(ctx, draft_id, found, data)
    _check_sendable(msg, draft_id)
    for name in {name for name in msg.keys() if _CLIENT_HEADER.match(name)}:
        del msg[name]
    # Another client's draft, or one edited by hand: servers refuse longer lines, and mutt too
    # encodes a postponed message again on sending.
    _shorten_long_lines(msg, _draft_source(draft_id))
    # As they go out: the source values (a kept header's encoded words are not decoded).
    for name, value in msg.raw_items():
        _check_source_header(name, value)
    # The Date goes before the 8-bit check: one in the locale's month names ("Mär") is replaced.
    del msg["Date"]
    # The envelope and the account were read from the headers (From, Sender) as this writes
    # them (_people).
    _encode_8bit_headers(msg, draft_id)
    if msg["Message-ID"] is None:  # the recipients' copy and the Sent copy share one
        msg["Message-ID"] = new_message_id(c.sender)  # its domain in ACE, as it goes out
    everyone = [*c.to, *c.cc, *c.bcc]
    for person in [c.sender, *everyone]:
        check_addresses([person.address], "address")
    if not everyone:
        raise ComposeError(f"draft {draft_id!r} has no recipient; add one with save_draft")
    if len(everyone) > MAX_RECIPIENTS:
        raise ComposeError(f"{len(everyone)} recipients; at most {MAX_RECIPIENTS}")
    check_not_blocked(ctx.config, everyone)
    msg["Date"] = email.utils.format_datetime(ctx.clock().astimezone())
    saved = check_size(ctx.config, msg.as_bytes(policy=POLICY))
    # Resent-Bcc's addresses are no recipients (a resending's, RFC 5322 3.6.6: the envelope
    # is To, Cc and Bcc), and it goes no more than Bcc: the Sent copy keeps both.
    _drop_blind_headers(msg)
    return Outgoing(composition=c, saved=saved, sent_folder=_sent_folder(ctx, c.account),
                    message_id=str(msg["Message-ID"]).strip().strip("<>"),
                    wire=msg.as_bytes(policy=POLICY),
                    envelope_from=c.sender.address,
                    # Each mailbox once: addresses differing in case (as in mutt) or in their
                    # domain's form (Unicode or ACE) only are one.
                    recipients=tuple(p.address for p in _unique(everyone, set())))


# Headers whose values are addresses: a name in one goes out as encoded words, the address as
# it is, its domain in ACE.  Those whose values are text: all encoded words.  Any other holds
# a syntax of its own (ids, a date) that encoded words may not stand in.
_ADDRESS_HEADERS = frozenset({"from", "to", "cc", "bcc", "reply-to", "sender",
                              "resent-from", "resent-sender", "resent-to", "resent-cc",
                              "resent-bcc", "mail-followup-to", "mail-reply-to",
                              "disposition-notification-to"})  # a read receipt's (RFC 8098)
_TEXT_HEADER = re.compile(r"subject|comments|organi[sz]ation|content-description|x-.*", re.I)
# MIME parameters (an attachment's file name) go out as RFC 2231 parameters.
_PARAMETER_HEADERS = frozenset({"content-type", "content-disposition"})


def _encode_8bit_headers(msg: EmailMessage, draft_id: str) -> None:
    """A draft's header values with raw 8-bit text (mutt and aerc write UTF-8 so where their
    config allows), its parts' too, written again in ASCII, in their order: the send command
    (msmtp) speaks no SMTPUTF8, and servers refuse or garble 8-bit headers without it."""
    charset = _draft_charset(msg)
    for part in _mime_parts(msg):
        items = list(part.raw_items())
        if all(value.isascii() for _, value in items):
            continue
        for name in {name.lower() for name, _ in items}:
            del part[name]
        for name, value in items:
            if not value.isascii():
                value = _ascii_source(name, value, charset, draft_id)
                if not value:  # a References all of whose ids were 8-bit is left out
                    continue
                # Encoded words decoded (in a MIME parameter, a keyword) may hold a line
                # break: untrusted text, which must not start a header or a boundary.
                _check_source_header(name, value)
            part.set_raw(name, value)


def _mime_parts(msg: Message) -> list[Message]:
    """The message and its parts, not into an attached message: that one is forwarded as
    it is (walk() goes into it).  A multipart without a boundary is read as one part, its
    payload text: is_multipart() says which."""
    if msg.get_content_maintype() != "multipart" or not msg.is_multipart():
        return [msg]
    parts: list[Message] = [msg]
    for part in cast(list[Message], msg.get_payload()):
        parts += _mime_parts(part)
    return parts


def _draft_charset(msg: EmailMessage) -> str | None:
    body = msg.get_body(preferencelist=("plain", "html"))
    return body.get_content_charset() if body is not None else None


def _ascii_source(name: str, source: str, charset: str | None, draft_id: str) -> str:
    """A draft's header source value as it goes out: one with raw 8-bit bytes written again
    in ASCII from its text in the draft's charset."""
    if source.isascii():
        return source
    return _ascii_header(name, _draft_header_text(name, source, charset, draft_id), draft_id)


def _draft_header_text(name: str, source: str, charset: str | None, draft_id: str) -> str:
    """A header value with 8-bit bytes as text: UTF-8 (RFC 6532), else the charset the draft's
    text declares (mutt writes headers in its send_charset too); refused when neither reads
    it, since a guess could send other letters than the user wrote."""
    data = to_bytes(_unfold(source))
    tried = list(dict.fromkeys(["utf-8", charset or "utf-8"]))
    for codec in tried:
        try:
            return data.decode(codec)
        except (LookupError, ValueError):  # ValueError: UnicodeError, a NUL in the name
            continue
    raise ComposeError(f"draft {draft_id!r}: its {name} header has bytes that are not "
                       f"{' nor '.join(tried)}; nothing was sent or saved: write that header "
                       "again in the mail client that saved the draft")


def _ascii_header(name: str, text: str, draft_id: str) -> str:
    """A header's decoded text as it goes out without SMTPUTF8 (see _encode_8bit_headers)."""
    _check_rewritable(name, text, _draft_source(draft_id), "non-ASCII text")
    key = name.lower()
    if key in _ADDRESS_HEADERS and (value := _ascii_addresses(name, key, text,
                                                              draft_id)) is not None:
        return value
    if key.startswith("x-") and (value := _x_addresses(name, key, text)) is not None:
        return value
    if key == "keywords":  # each phrase its own words: a comma in one would join two
        value = ", ".join(_ascii_phrase(name, phrase) for phrase in text.split(","))
        return _folded_source(name, value) or value
    if _TEXT_HEADER.fullmatch(name):
        # Its encoded words decoded may hold a line break (a reply's subject from hostile
        # mail), refused here: the email package would raise on it.
        text = check_header(name, decode_header_text(text, []))
        return _subject_header(text, name).encode(linesep="\r\n")
    if key in _PARAMETER_HEADERS:
        # The email package writes a non-ASCII parameter as RFC 2231 ones (filename*=utf-8'').
        parsed = POLICY.header_factory(name, text)
        folded = parsed.fold(policy=POLICY)
        value = folded.split(":", 1)[1].removeprefix(" ").removesuffix("\r\n")
        if value.isascii():
            _check_parameters(name, parsed, value, draft_id)
            return value
    if key in ("references", "in-reply-to"):
        return _ascii_ids(name, text, draft_id)
    raise ComposeError(f"draft {draft_id!r}: its {name} header has non-ASCII text, which only "
                       "SMTPUTF8 mail (RFC 6531) carries and fmail-nm does not send; nothing "
                       "was sent: correct it in the mail client that saved the draft")


def _check_parameters(name: str, header: BaseHeader, written: str, draft_id: str) -> None:
    """Refuse a parameter whose value, its encoded words decoded, has a quote mark the email
    package writes as a quoted pair (filename="a\\"; filename=evil.exe"), which mail
    clients that ignore backslashes read as the value's end, and the rest as another
    parameter (another file name).  A non-ASCII or long value goes out as RFC 2231
    parameters instead, its quote mark %22: that one is sent."""
    params: dict[str, str] = dict(getattr(header, "params", {}))
    for key, value in params.items():
        if '"' in value and f'"{email.utils.quote(value)}"' in written:
            raise ComposeError(f"draft {draft_id!r}: its {name} parameter {key} is {value!r}, "
                               "whose quote mark some mail clients take for the end of the "
                               f"value; {_draft_source(draft_id).remedy}")


def _ascii_addresses(name: str, key: str, text: str, draft_id: str) -> str | None:
    """An address header as it goes out, None when it names no address.  Its groups are kept
    only where the email package reads the very addresses parse_addresses does -- the parse
    the envelope is made from (load_draft): the header never shows other addresses than the
    mail goes to (``"Zoë" <a> <b>`` is one address to the one, two to the other).  Refused
    when parse_addresses cannot read all of it (comments nested thousands deep): the
    envelope would leave out whom it names."""
    unread: list[str] = []
    people = parse_addresses([text], key, [], unread, as_written=True)
    if unread:
        raise _malformed(name, text, _draft_source(draft_id))
    groups = _groups(text)
    if groups is not None and [a.addr_spec for group in groups for a in group.addresses] == [
            p.address for p in people]:
        return _group_list(name, key, _with_comment_names(groups, people),
                           _comments(name, text, after_nameless=False))
    if not people:
        return None
    # check_addresses refuses a local part only SMTPUTF8 carries, naming it.
    return _folded_addresses(name, _mailboxes(name, [
        Address(p.name, check_addresses([p.address], key)[0].address) for p in people],
        _comments(name, text, after_nameless=False, of=[p.address for p in people])))


def _with_comment_names(groups: Sequence[Group], people: Sequence[Address]
                        ) -> tuple[Group, ...]:
    """The groups, a mailbox without a name named as ``people`` (the same addresses, in
    order, read ``as_written``) name it: from its comment ("a@b.example (Zoë)", as older mail
    clients write a name), which the email package drops, as the header written without
    groups keeps it."""
    names = iter(p.name for p in people)
    return tuple(Group(group.display_name, [
        HeaderAddress(a.display_name or person, a.username, a.domain)
        for a, person in zip(group.addresses, names)]) for group in groups)


def _comments(name: str, text: str, *, after_nameless: bool,
              of: Sequence[str] | None = None) -> list[str]:
    """Each mailbox's comments in an address list _groups reads (in the order of its groups'
    mailboxes), as written after it: " (work)" for "Ann <a@b.example> (work)" -- text the user
    wrote, which the groups drop.  For a mailbox written without a name (none, or one
    _header_address leaves out), those after its address when ``after_nameless``, else none: a
    comment after it reads as its name ("a@b.example (Ann)", _with_comment_names); one
    inside its address (RFC 5322 3.4.1's CFWS, obsolete syntax in a domain, which RFC 5322
    4 says not to write) would read as part of that name.  None at all when given the
    addresses ``of`` the mailboxes and it reads others: no comment goes after another's
    address."""
    try:  # the parse the email package's groups are made from
        boxes = get_address_list(text)[0].all_mailboxes
        if of is not None and [box.addr_spec for box in boxes] != list(of):
            return []
    except Exception:  # noqa: BLE001 - untrusted header _groups could not read either
        return []
    written = []
    for box in boxes:
        named = bool(box.display_name) and "=?" not in box.display_name
        written.append("".join(f" {_comment_source(name, comment)}"
                               for comment, after in _comment_tokens(box)
                               if named or (after_nameless and after)))
    return written


def _comment_tokens(box: TokenList) -> list[tuple[TokenList, bool]]:
    """The comments in a parsed mailbox (not those inside them), each with whether it is
    after all of the mailbox's words."""
    pieces: list[TokenList | None] = []  # None: a word
    tokens = [iter(box)]
    while tokens:
        token = next(tokens[-1], None)
        if token is None:
            tokens.pop()
        elif token.token_type == "comment":
            pieces.append(cast(TokenList, token))
        elif isinstance(token, TokenList):
            tokens.append(iter(token))
        elif str(token).strip():
            pieces.append(None)
    words = [i for i, piece in enumerate(pieces) if piece is None]
    last = words[-1] if words else -1
    return [(piece, i > last) for i, piece in enumerate(pieces) if piece is not None]


def _comment_source(name: str, comment: TokenList) -> str:
    """A comment as it goes out: as written, its nesting kept, but for its parentheses and
    backslashes quoted one way (RFC 5322 3.2.2); one with non-ASCII text as encoded words
    (RFC 2047 5(2)), its inner comments' parentheses among their text.  Read level by level,
    not by recursion: the email package's own writer spends two frames a level, and fails on
    a few hundred levels its parser reads."""
    source, text = ["("], []
    levels = [iter(comment)]
    while levels:
        token = next(levels[-1], None)
        if token is None:
            levels.pop()
            source.append(")")
            text.append(")" if levels else "")
        elif token.token_type == "comment":
            levels.append(iter(cast(TokenList, token)))
            source.append("(")
            text.append("(")
        else:  # ctext or whitespace, its quoted pairs read (the parser unquoted them)
            source.append(re.sub(r"[()\\]", r"\\\g<0>", str(token)))
            text.append(str(token))
    written = "".join(source)
    return written if written.isascii() else f"({_encoded_words(name, ''.join(text))})"


def _x_addresses(name: str, key: str, text: str) -> str | None:
    """An X- header that reads as addresses, with 8-bit text only in names (X-Original-From),
    as them: readable as such.  None for any other, which goes as text: an X- header is no
    recipient, and one naming an address a recipient header may not hold must not stop the
    send."""
    groups = _groups(text)
    if not groups or any(not a.addr_spec.isascii() for g in groups for a in g.addresses):
        return None
    try:
        return _group_list(name, key, groups, _comments(name, text, after_nameless=True))
    except ComposeError:
        return None


def _groups(text: str) -> tuple[Group, ...] | None:
    """``text`` read as an address list by the email package, which keeps groups; None where
    it reads it with defects, or fails on it (it raises on some untrusted text)."""
    try:
        parsed = POLICY.header_factory("to", text)
    except Exception:  # noqa: BLE001 - untrusted header: read otherwise
        return None
    groups: tuple[Group, ...] = parsed.groups
    return None if parsed.defects else groups


def _group_list(name: str, key: str, groups: Sequence[Group], comments: Sequence[str]) -> str:
    """The groups, their mailboxes followed by ``comments`` (_comments) in order."""
    after = iter(comments)
    return _folded_addresses(name, ", ".join(
        _address_group(name, key, g, [next(after, "") for _ in g.addresses]) for g in groups))


def _address_group(name: str, key: str, group: Group, comments: Sequence[str]) -> str:
    # check_addresses refuses a local part only SMTPUTF8 carries, naming it.
    people = [Address(a.display_name, check_addresses([a.addr_spec], key)[0].address)
              for a in group.addresses]
    # A name that decoded to "=?" is left out, as a mailbox's is (_header_address).
    if not group.display_name or "=?" in group.display_name:
        return _mailboxes(name, people, comments)
    return _group(name, group.display_name, people, comments)


def _ascii_phrase(name: str, phrase: str) -> str:
    text = decode_header_text(phrase, []).strip()
    return text if text.isascii() and "=?" not in text else _encoded_words(name, text)


def _ascii_ids(name: str, text: str, draft_id: str) -> str:
    """References without its 8-bit ids (RFC 6532): an id is no text encoded words may stand
    in (RFC 5322 3.6.4), and the thread is found from the others -- empty when none is left.
    An 8-bit In-Reply-To, the one mail replied to, is refused: left out, the reply would
    silently start a thread of its own."""
    ids = re.findall(r"<([^<>]*)>", text)
    kept = [mid for mid in ids if _threadable(mid)]
    if name.lower() == "in-reply-to" and (not kept or kept != ids):
        raise ComposeError(f"draft {draft_id!r}: its In-Reply-To has a non-ASCII message id "
                           "(RFC 6532), which only SMTPUTF8 mail (RFC 6531) carries and "
                           "fmail-nm does not send; nothing was sent: to send it anyway, as a "
                           "reply that may not thread, remove its In-Reply-To in the mail "
                           "client that saved the draft")
    return _id_list(name, kept)


def _sent_folder(ctx: WriteContext, account: Account) -> Path | None:
    """Where the Sent copy goes -- found before sending, so a missing folder role stops the
    send instead of failing after it.  None when the server files it itself: the account's
    ``server_saves_sent`` (as `fmail-nm account add` writes it) or ``send.server_stores_sent``."""
    if account.server_saves_sent or (account.send is not None
                                     and account.send.server_stores_sent):
        return None
    try:
        return maildir.ensure_maildir(ctx.config, account.folder("sent"))
    except ConfigError as exc:
        raise ComposeError(f"{exc} (or send = {{ server_stores_sent = true }} when the server "
                           "files sent mail itself); nothing was sent") from None


def _mark_original(ctx: WriteContext, original: list[str], mark: str) -> None:
    """Mark the original replied/passed after the index caught up with a rename another
    program made (``changes.run`` re-indexes once), so the flag still reaches the server.
    Part of the send, which undo refuses: not an audit entry of its own."""
    done = changes.run(ctx, original, changes.tag_step(add=[mark]))
    changes.notify(ctx, "send", done.changes)
    if done.errors:
        raise FilingError(f"the message was sent and filed, but the original could not be "
                          f"marked {mark}: {done.errors[0][1]}; do not send it again")


def file_sent(ctx: WriteContext, out: Outgoing) -> DraftResult:
    """After the sender took the message: the Sent copy (unless the server keeps one), the
    draft gone, the original marked replied or passed -- one write session, one audit entry
    that undo refuses (a sent message cannot be recalled)."""
    c = out.composition
    mid = c.message_id or ""  # the draft's
    sent_id = out.message_id
    sent_folder = out.sent_folder
    original = c.in_reply_to or c.forwarded
    mark = tags.REPLIED if c.in_reply_to else tags.PASSED
    known_original = original is not None and ctx.reader.find(original) is not None
    stale_original: list[str] = []

    def job(txn: WriteTxn) -> None:
        if sent_folder is not None:
            mover.add_new_file(txn, out.saved, sent_folder, SENT_FLAGS)
        for path in _drafts_of(txn, ctx.config, mid):
            mover.delete_file(txn, path)
        if txn.get(sent_id) is not None:
            txn.change_tags([sent_id], remove=[tags.DRAFT])
            tag_added(txn, ctx.config, [sent_id])
        if known_original and original is not None:
            try:
                txn.change_tags([original], add=[mark])
            except StaleFiles:  # a pull renamed its file (read elsewhere): marked below
                stale_original.append(original)

    ids = [*dict.fromkeys([mid, sent_id]), *([original] if known_original and original else [])]
    # The message is out: the filing waits for a lock another program holds past the call's
    # bound, or the Sent copy would be missing and the draft left to be sent again.
    with ctx.writer.deadline(time.monotonic() + FILING_WAIT_S, extend=True):
        try:
            report = changes.apply_session(ctx, "send", {
                "id": sent_id, "to": list(out.recipients), "subject": c.subject,
                NOT_UNDOABLE: "a sent message cannot be recalled"}, ids, job)
        except DatabaseBusy as exc:  # its own "retry shortly" would read as "send it again"
            held = ("an undo was under way, in this or another fmail-nm process,"
                    if isinstance(exc, changes.UndoUnderWay)
                    else "another program held the notmuch database")
            raise FilingError(f"the message was sent, but it could not be filed ({held} "
                              f"for over {FILING_WAIT_S} s): it is still in Drafts and not "
                              "in Sent; do not send it again") from None
        if report.errors:  # sent all the same: say so, so nobody sends it twice
            raise FilingError(f"the message was sent, but filing it failed: "
                              f"{report.errors[0][1]}; do not send it again")
        if stale_original:
            _mark_original(ctx, stale_original, mark)
    _already_tagged(ctx, sent_id)
    return _result(ctx, c, sent_id, sent=True)
