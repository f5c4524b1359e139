"""Turn one raw RFC 822 message into what an LLM should read: MIME structure, body, attachments.

Everything here is pure (bytes in, values out; no notmuch, no files) and treats the message as
untrusted: it must never raise on malformed input, never be pathologically slow on a large
attachment, and never let message content put terminal control or bidi-override characters
into our output.

Parser choice (measured on this machine, a 7 MB message with one 5 MB base64 attachment):
``email``'s feed parser takes 180-240 ms and ``mailparser.parse_from_bytes`` (which wraps it
and then walks every part again) about the same or more, because both process the body line by
line in Python. So we split MIME ourselves with ``bytes.find`` on the boundary (≈ 25-30 ms for
the same message, most of it two ``bytes.translate`` passes to size the base64) and hand only
each part's *header block* to the stdlib parser, which keeps its well-tested header and
parameter handling (RFC 2231, quoting, defaults) where it is cheap. A typical 5 KB message
takes ≈ 1 ms (mailparser ≈ 2 ms). mailparser also raised ``ValueError`` on 2 of 3,000 mangled
messages (a NUL in a charset parameter reaches ``Message.get_payload``), so it is not used here.
Each part's body is an exact byte slice, so sizes and 8-bit bytes are exact too.
The one slow path left is HTML: html2text costs ≈ 1.5 ms per KB of HTML. So HTML rendering is
the caller's choice (``render_html``): the read tools pass ``html.html_to_text`` (html2text),
the indexer's previews pass ``text.preview_html_text`` (regular expressions, linear time), and
this module never imports html2text. ``tests/test_mime_differential.py`` checks the splitter
against the stdlib parser.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from email.message import Message
from typing import TYPE_CHECKING, TypeVar

from .charset import decode_bytes, guess_decode
from .formats import enriched_to_text, unflow
from .headers import (
    Address,
    HeaderInfo,
    Unsubscribe,
    addresses,
    date,
    decode_header_text,
    header,
    header_info,
    list_id,
    list_takes_posts,
    list_unsubscribe,
    msg_id,
    msg_ids,
    parse_headers,
    split_head,
    to_bytes,
)
from .text import HtmlText, hide_uuencoded, one_line, strip_tags, tidy
from .transfer import decode_transfer, decoded_size, transfer_encoding

if TYPE_CHECKING:
    from .calendar import CalendarSummary

# The iCalendar types (RFC 5545, RFC 6047): read by message.calendar, loaded for the first
# such part -- most mail carries none.
CALENDAR_TYPES = ("text/calendar", "application/ics")

__all__ = [
    "AttachmentInfo",
    "BodyText",
    "Entity",
    "HtmlRenderer",
    "HtmlText",
    "ParsedMessage",
    "Summary",
    "attachment_entities",
    "calendar_summary",
    "decoded_leaves",
    "effective_type",
    "encrypted_note",
    "entity_charset",
    "entity_filename",
    "entity_payload",
    "html_text",
    "parse_body",
    "parse_entity",
    "parse_message",
    "parse_summary",
    "part_text",
]


# --------------------------------------------------------------------------------------------
# Public types


HtmlRenderer = Callable[[str], HtmlText]
"""Decoded HTML in, text out (and a count of the text it hides); ``html_text`` tidies the
result and catches any exception."""


@dataclass(frozen=True)
class AttachmentInfo:
    index: int
    filename: str | None
    content_type: str
    size: int


@dataclass(frozen=True)
class ParsedMessage:
    subject: str
    from_: list[Address]
    to: list[Address]
    cc: list[Address]
    reply_to: list[Address]
    date: datetime | None
    message_id: str | None
    in_reply_to: str | None
    references: list[str]
    list_id: str | None
    text: str
    from_html: bool  # some of ``text`` was rendered from HTML
    attachments: list[AttachmentInfo]
    defects: list[str]
    # What the reader must know of a body that is not all there, e.g. that it is encrypted.
    body_notes: list[str] = field(default_factory=list)
    # Some attachment is a file to the reader (see is_file), not only a signature or such.
    has_files: bool = False
    # Bcc is in the user's own copies of mail sent (mutt, aerc and fmail-nm file it so).
    bcc: list[Address] = field(default_factory=list)
    # The parse raised and only the raw text is kept (see _guarded): no header was read.
    failed: bool = False
    # The author's address a list kept when it rewrote From (headers.list_author).
    original_from: list[Address] = field(default_factory=list)
    # List-Unsubscribe, but for a post to a discussion list (headers.list_takes_posts): its
    # every message would carry the same links, which its members seldom want (and its
    # footer, which full shows, gives).
    unsubscribe: Unsubscribe | None = None


# --------------------------------------------------------------------------------------------
# parse_message


def parse_message(raw: bytes, render_html: HtmlRenderer) -> ParsedMessage:
    """Parse one untrusted message. Never raises; problems are reported in ``defects``.

    ``render_html`` turns the HTML body parts that are shown (no plain alternative) into text.
    """
    return _guarded(bytes(raw), lambda data, defects: _parse(data, render_html, defects),
                    _fallback)


T = TypeVar("T")


def _guarded(raw: bytes, parse: Callable[[bytes, list[str]], T],
             fallback: Callable[[bytes, list[str]], T]) -> T:
    """``parse`` of untrusted mail, or -- should it raise anyway -- ``fallback``: the raw
    text, with the error as one more defect."""
    defects: list[str] = []
    try:
        return parse(raw, defects)
    except Exception as exc:  # noqa: BLE001 - last line of defence for untrusted input
        defects.append(f"internal error while parsing: {type(exc).__name__}; body shown raw")
        return fallback(raw, defects)


def _parse(raw: bytes, render_html: HtmlRenderer, defects: list[str]) -> ParsedMessage:
    root = parse_entity(raw, defects)
    headers = root.headers
    entities = attachment_entities(root)
    attachments = [
        AttachmentInfo(i, entity_filename(e, defects), e.ctype, _entity_size(e, defects))
        for i, e in enumerate(entities)
    ]
    body = _Rendering(render_html, defects)
    text = _body_text(root, body)
    to, cc = addresses(headers, "to", defects), addresses(headers, "cc", defects)
    list_name = list_id(headers)
    return ParsedMessage(
        subject=one_line(decode_header_text(header(headers, "subject") or "", defects)),
        from_=addresses(headers, "from", defects),
        to=to,
        cc=cc,
        reply_to=addresses(headers, "reply-to", defects),
        date=date(header(headers, "date")),
        message_id=msg_id(header(headers, "message-id")),
        in_reply_to=msg_id(header(headers, "in-reply-to")),
        references=msg_ids(header(headers, "references")),
        list_id=list_name,
        text=text,
        from_html=body.from_html,
        attachments=attachments,
        defects=list(dict.fromkeys(defects)),
        body_notes=list(dict.fromkeys(body.notes)),
        has_files=any(map(is_file, entities)),
        bcc=addresses(headers, "bcc", defects),
        original_from=addresses(headers, "x-original-from", defects),
        unsubscribe=(None if list_takes_posts(headers, [*to, *cc], list_name)
                     else list_unsubscribe(headers)),
    )


@dataclass(frozen=True)
class BodyText:
    """The readable body alone (see parse_body)."""

    text: str
    from_html: bool
    defects: list[str]
    body_notes: list[str] = field(default_factory=list)


def parse_body(raw: bytes, render_html: HtmlRenderer) -> BodyText:
    """Only the readable body of one untrusted message, as ``parse_message`` renders it:
    no addresses, dates or attachment facts (a thread shows each message's body under the
    index's own header values).  Never raises."""
    def body(data: bytes, defects: list[str]) -> BodyText:
        root = parse_entity(data, defects)
        rendering = _Rendering(render_html, defects)
        text = _body_text(root, rendering)
        return BodyText(text, rendering.from_html, list(dict.fromkeys(defects)),
                        list(dict.fromkeys(rendering.notes)))

    return _guarded(bytes(raw), body,
                    lambda data, defects: BodyText(_raw_text(data), False, defects))


@dataclass(frozen=True)
class Summary:
    """What the indexer keeps of a message beside notmuch (see parse_summary)."""

    fields: HeaderInfo
    text: str
    has_files: bool


def parse_summary(raw: bytes, render_html: HtmlRenderer) -> Summary:
    """The recipients, List-Id, list author, body text and ``has_files`` of one untrusted
    message, as ``parse_message`` reads them -- and nothing else: the indexer reads these of
    every new message, and the subject, dates, Message-IDs, attachment sizes and names, the
    From and Reply-To of mail no list rewrote would add a tenth to it.  When the parse
    raises (``parse_message`` then reads no header), the header block alone is read
    (:func:`~.headers.parse_headers`: the recipients a listing reads of the file while the
    mirror lags, and a list's mail keeps its List-Id), and the text is
    ``parse_message``'s raw text.  Never raises."""
    return _guarded(bytes(raw), lambda data, defects: _summary(data, render_html, defects),
                    lambda data, defects: Summary(parse_headers(data), _raw_text(data), False))


def _summary(raw: bytes, render_html: HtmlRenderer, defects: list[str]) -> Summary:
    root = parse_entity(raw, defects)
    has_files = any(map(is_file, attachment_entities(root)))
    text = _body_text(root, _Rendering(render_html, defects))
    return Summary(header_info(root.headers), text, has_files)


def _fallback(raw: bytes, defects: list[str]) -> ParsedMessage:
    return ParsedMessage(
        subject="", from_=[], to=[], cc=[], reply_to=[], date=None, message_id=None,
        in_reply_to=None, references=[], list_id=None, text=_raw_text(raw),
        from_html=False, attachments=[], defects=defects, failed=True,
    )  # fmt: skip


def _raw_text(raw: bytes) -> str:
    return tidy(guess_decode(raw)[0])


def decoded_leaves(raw: bytes) -> list[tuple[str, bytes]]:
    """Every leaf entity in document order as (content type, transfer-decoded bytes).

    Internal: it exists so ``tests/test_mime_differential.py`` can compare this splitter with
    the stdlib parser (``get_payload(decode=True)``); message/* parts are leaves here.
    """
    leaves: list[tuple[str, bytes]] = []
    stack = [parse_entity(bytes(raw), [])]
    while stack:
        entity = stack.pop()
        if entity.is_multipart:
            stack.extend(reversed(entity.children))
        else:
            leaves.append((entity.ctype, entity_payload(entity, [])))
    return leaves


# --------------------------------------------------------------------------------------------
# MIME structure


MAX_DEPTH = 32  # MIME nesting we follow; deeper parts become opaque attachments (compose too)
_HEADER_LINE = re.compile(rb"[!-9;-~]+:")


@dataclass
class Entity:
    """One MIME entity: its headers (a stdlib Message holding only them) and raw body bytes."""

    headers: Message
    body: bytes
    ctype: str
    path: str
    children: list[Entity] = field(default_factory=list)
    is_multipart: bool = False
    # A part of a multipart/encrypted (RFC 1847): its control part or the ciphertext.
    encrypted_part: bool = False

    @property
    def where(self) -> str:
        return f"part {self.path} ({self.ctype})" if self.path else f"message ({self.ctype})"


def parse_entity(raw: bytes, defects: list[str]) -> Entity:
    """The MIME tree of a whole message (multipart bodies split, leaves left encoded)."""
    return _parse_entity(raw, "", 0, defects)


def _parse_entity(
    raw: bytes, path: str, depth: int, defects: list[str], default: str = "text/plain"
) -> Entity:
    headers, body = split_head(raw)
    if default != "text/plain":
        headers.set_default_type(default)
    entity = Entity(headers, body, _content_type(headers), path)
    _note_header_defects(entity, defects)
    if entity.ctype.startswith("multipart/"):
        _split_children(entity, depth, defects)
    return entity


def nested_past_max_depth(raw: bytes) -> bool:
    """Whether a message's parts nest deeper than MAX_DEPTH, as this module splits them:
    milliseconds where the email package's parser takes seconds on hundreds of levels.  An
    attached message (message/*, whose text the email package parses as a message) is a
    level, as the package counts it: hostile mail wrapped in one nests as deep."""
    stack = [(parse_entity(raw, []), 0)]
    while stack:
        entity, depth = stack.pop()
        ctype = _content_type(entity.headers)  # as written: _split_children retypes a multipart
        attached = ctype.startswith("message/")
        if depth >= MAX_DEPTH and (attached or ctype.startswith("multipart/")):
            return True  # the multipart left unsplit (_split_children), or not followed here
        if attached:
            stack.append((parse_entity(entity.body, []), depth + 1))
        stack += [(child, depth + 1) for child in entity.children]
    return False


# A MIME type as RFC 2045 has it: two tokens of printable ASCII without specials.
_MIME_TYPE = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+/[!#$%&'*+.^_`|~0-9a-z-]+")
# A type whose parameter lost its semicolon ("text/plain charset=us-ascii"): the type is
# the part before the space, as notmuch (GMime) reads it.
_TYPE_BEFORE_PARAMETER = re.compile(_MIME_TYPE.pattern + r"(?=\s+[!#$%&'*+.^_`|~0-9a-z-]+\s*=)")


def _content_type(headers: Message) -> str:
    """The part's type, lower-cased; one that is not a MIME type (8-bit bytes, which the
    email package hands over as surrogates, a folded value) is application/octet-stream,
    as RFC 2045 says of an unrecognized one."""
    try:
        found = headers.get_content_type()
    except Exception:  # noqa: BLE001 - untrusted parameters; the default is a safe answer
        return "text/plain"
    if _MIME_TYPE.fullmatch(found):
        return found
    unsplit = _TYPE_BEFORE_PARAMETER.match(found)
    return unsplit.group() if unsplit else "application/octet-stream"


_DEFECT_TEXT = {
    "MissingHeaderBodySeparatorDefect": "header block not followed by a blank line",
    "FirstHeaderLineIsContinuationDefect": "first header line is a continuation line",
    "MisplacedEnvelopeHeaderDefect": "'From ' envelope line among the headers",
    "InvalidHeaderDefect": "malformed header line",
}


def _note_header_defects(entity: Entity, defects: list[str]) -> None:
    for defect in entity.headers.defects:
        name = type(defect).__name__
        defects.append(f"{entity.where}: {_DEFECT_TEXT.get(name, name)}")


def _split_children(entity: Entity, depth: int, defects: list[str]) -> None:
    """Split a multipart body into child entities, or demote it to text when that fails."""
    if depth >= MAX_DEPTH:
        defects.append(f"{entity.where}: MIME nesting deeper than {MAX_DEPTH}; not followed")
        entity.ctype = "application/octet-stream"
        return
    body = _multipart_body(entity, defects)
    boundary = _boundary(entity.headers)
    parts = _split_on_boundary(body, boundary, entity, defects) if boundary else None
    if parts is None:
        problem = "boundary not found in body" if boundary else "multipart without a boundary"
        guessed = _guess_boundary(body)
        parts = _split_on_boundary(body, guessed, entity, defects) if guessed else None
        if parts is None:
            defects.append(f"{entity.where}: {problem}; body treated as text")
            entity.ctype, entity.body = "text/plain", body
            return
        defects.append(f"{entity.where}: {problem}; recovered parts using boundary {guessed!r}")
    child_default = "message/rfc822" if entity.ctype == "multipart/digest" else "text/plain"
    prefix = f"{entity.path}." if entity.path else ""
    entity.children = [
        _parse_entity(part, f"{prefix}{i}", depth + 1, defects, child_default)
        for i, part in enumerate(parts, 1)
    ]
    for child in entity.children:
        child.encrypted_part = entity.ctype == "multipart/encrypted"
    entity.is_multipart, entity.body = True, b""


def _multipart_body(entity: Entity, defects: list[str]) -> bytes:
    # A transfer-encoded multipart is illegal, but some mailers do it; decode rather than lose it.
    cte = _cte(entity)
    if cte in ("base64", "quoted-printable"):
        defects.append(f"{entity.where}: multipart with {cte} transfer encoding")
        return entity_payload(entity, defects)
    return entity.body


def _boundary(headers: Message) -> str | None:
    try:
        boundary = headers.get_boundary()
    except Exception:  # noqa: BLE001 - untrusted parameters
        return None
    return boundary or None


def _split_on_boundary(body: bytes, boundary: str, entity: Entity, defects: list[str]) -> list[bytes] | None:
    """Cut a multipart body at its delimiter lines (RFC 2046 §5.1.1); None if there are none."""
    delimiter = b"--" + to_bytes(boundary)
    parts: list[bytes] = []
    start: int | None = None  # where the current part's content begins
    pos = 0
    while (hit := body.find(delimiter, pos)) != -1:
        pos = hit + len(delimiter)
        if hit and body[hit - 1] != 0x0A:  # a delimiter must begin a line
            continue
        line_end = body.find(b"\n", pos)
        line_end = len(body) if line_end == -1 else line_end
        tail = body[pos:line_end].rstrip(b" \t\r")
        if tail not in (b"", b"--"):
            continue  # a longer boundary that merely starts with ours
        if start is not None:
            parts.append(body[start : _before_newline(body, hit)])
        if tail == b"--":
            if start is None:
                continue  # a close before any open delimiter: keep looking
            return parts
        start = pos = line_end + 1
    if start is None:
        return None
    parts.append(body[start:])
    defects.append(f"{entity.where}: closing boundary missing (message may be truncated)")
    return parts


def _before_newline(body: bytes, hit: int) -> int:
    """The CRLF before a delimiter belongs to the delimiter, not to the part."""
    end = hit - 1 if hit and body[hit - 1] == 0x0A else hit
    return end - 1 if end and body[end - 1] == 0x0D else end


_GUESS_DELIMITER = re.compile(rb"^--([!-~]{1,200}?)[ \t]*\r?$", re.M)


def _guess_boundary(body: bytes) -> str | None:
    """Find a delimiter-looking line followed by a header line: the boundary the sender meant."""
    for match in _GUESS_DELIMITER.finditer(body, 0, 64 * 1024):
        after = body[match.end() + 1 : match.end() + 200]
        if _HEADER_LINE.match(after):
            candidate = match.group(1)
            if candidate.endswith(b"--"):
                candidate = candidate[:-2]
            return candidate.decode("ascii", "replace")
    return None


def _cte(entity: Entity) -> str:
    return transfer_encoding(str(entity.headers.get("content-transfer-encoding", "") or ""))


def entity_payload(entity: Entity, defects: list[str]) -> bytes:
    """The entity body with its Content-Transfer-Encoding undone, leniently."""
    return decode_transfer(entity.body, _cte(entity), entity.where, defects)


def _entity_size(entity: Entity, defects: list[str]) -> int:
    return decoded_size(entity.body, _cte(entity), entity.where, defects)


# --------------------------------------------------------------------------------------------
# Which parts are body and which are attachments


_BODY_TYPES = ("text/plain", "text/html", "text/enriched")


# Types worth trusting the file name for when the sender said only "application/octet-stream".
_EXTENSION_TYPES = {
    ".pdf": "application/pdf",
    ".txt": "text/plain",
    ".text": "text/plain",
    ".log": "text/plain",
    ".md": "text/markdown",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".json": "application/json",
    ".xml": "text/xml",
    ".html": "text/html",
    ".htm": "text/html",
    ".ics": "text/calendar",
    ".vcf": "text/vcard",
    ".eml": "message/rfc822",
    ".diff": "text/x-diff",
    ".patch": "text/x-diff",
}
_UNTYPED = ("application/octet-stream", "application/x-download")


def effective_type(content_type: str, filename: str | None) -> str:
    """The type to read a part as: the declared one, or the file name's when the sender
    declared only bytes."""
    if content_type in _UNTYPED and filename and (dot := filename.rfind(".")) >= 0:
        return _EXTENSION_TYPES.get(filename[dot:].lower(), content_type)
    return content_type


def entity_filename(entity: Entity, defects: list[str]) -> str | None:
    try:
        name = entity.headers.get_filename()
    except Exception:  # noqa: BLE001 - untrusted RFC 2231 parameters
        return None
    if not name:
        return None
    return one_line(decode_header_text(str(name), defects)) or None


def _disposition(entity: Entity) -> str | None:
    try:
        return entity.headers.get_content_disposition()
    except Exception:  # noqa: BLE001
        return None


def _is_attachment(entity: Entity) -> bool:
    if entity.is_multipart:
        return False
    if entity.ctype not in _BODY_TYPES:  # non-text leaves, message/*, text/calendar, ...
        return True
    if _disposition(entity) == "attachment":
        return True
    return bool(entity_filename(entity, []))


# Parts get_email lists that no mail reader calls attachments: a signature, the control part
# of an encrypted message, the machine-readable parts of a delivery or read report.
_NOT_FILES = frozenset({"application/pgp-signature", "application/pkcs7-signature",
                        "application/x-pkcs7-signature", "application/pgp-encrypted",
                        "message/delivery-status", "message/disposition-notification",
                        "text/rfc822-headers"})


def is_file(entity: Entity) -> bool:
    """Whether an attachment is one to the reader (the listing's ``A``): not one of
    _NOT_FILES, nor what an encrypted message holds in place of its body, nor an image the
    HTML shows in its place (one with a Content-ID, not sent as an attachment: a logo, a
    signature's picture)."""
    if entity.ctype in _NOT_FILES or encrypted_note(entity) is not None:
        return False
    embedded = entity.ctype.startswith("image/") and _disposition(entity) != "attachment"
    return not (embedded and header(entity.headers, "content-id"))


def attachment_entities(root: Entity) -> list[Entity]:
    """Attachments in depth-first order; this order *is* the attachment index."""
    found: list[Entity] = []
    stack = [root]
    while stack:
        entity = stack.pop()
        if _is_attachment(entity):
            found.append(entity)
        elif entity.is_multipart:
            stack.extend(reversed(entity.children))
    return found


def _has_plain(entity: Entity) -> bool:
    if entity.is_multipart:
        return any(_has_plain(child) for child in entity.children)
    return entity.ctype == "text/plain" and not _is_attachment(entity)


# --------------------------------------------------------------------------------------------
# Body text


@dataclass
class _Rendering:
    """What rendering a body needs, and what it learns on the way about the text shown."""

    render_html: HtmlRenderer
    defects: list[str]
    from_html: bool = False
    blank_html: bool = False  # an HTML part with markup but no text (images, a frame)
    notes: list[str] = field(default_factory=list)


def _body_text(root: Entity, body: _Rendering) -> str:
    """The body text of a message. One with none but with attachments shows the first
    calendar invitation (as its summary) or Markdown text among them, with a note saying
    which attachment it is; failing that, a note saying where its content is (a digest, a
    photo); HTML without words (an image) says so too, so that an empty body is not taken
    for an empty message. The attachments, and their numbering, stay as they are."""
    text = _render(root, body)
    if text or body.notes:
        return text
    attachments = attachment_entities(root)
    for index, entity in enumerate(attachments):
        if shown := _attachment_as_body(entity, index, body):
            return shown
    kinds = list(dict.fromkeys(entity.ctype for entity in attachments))
    if kinds:
        extra = len(kinds) - MAX_KINDS_NAMED
        more = f" and {extra} more" if extra > 0 else ""
        body.notes.append(f"no body text: its content is in its attachments "
                          f"({', '.join(kinds[:MAX_KINDS_NAMED])}{more})")
    elif body.blank_html:
        body.notes.append("no body text: its HTML shows only images or frames")
    return text


_MARKDOWN_TYPES = ("text/markdown", "text/x-markdown")


def _attachment_as_body(entity: Entity, index: int, body: _Rendering) -> str:
    """The text of attachment ``index`` if it can stand for the body: a calendar
    invitation's summary or Markdown text; else "". Its problems count only if it is shown."""
    kind = effective_type(entity.ctype, entity_filename(entity, []))
    if kind not in CALENDAR_TYPES and kind not in _MARKDOWN_TYPES:
        return ""
    problems: list[str] = []
    text = part_text(entity, kind, entity_payload(entity, problems), problems)
    if kind in CALENDAR_TYPES:
        summary = calendar_summary(entity, text, body.render_html)
        if summary is None:
            return ""
        problems.extend(f"{entity.where}: {problem}" for problem in summary.problems)
        text = summary.text
        body.from_html = body.from_html or summary.from_html
        note = f"no body text: this is the summary of calendar attachment {index}"
    else:
        text, note = tidy(text), f"no body text: this is attachment {index} ({kind})"
    if text:
        body.defects.extend(problems)
        body.notes.append(note)
    return text


MAX_KINDS_NAMED = 3


def calendar_summary(entity: Entity, text: str,
                     render_html: HtmlRenderer) -> CalendarSummary | None:
    """The summary of calendar part ``entity``, whose decoded data is ``text``: with the
    iTIP method of its Content-Type when the data names none (RFC 6047 asks for both, and
    some mailers write only the parameter), an HTML-only description rendered by
    ``render_html``."""
    from .calendar import summarize_calendar

    problems: list[str] = []
    summary = summarize_calendar(text, _param(entity, "method"), lambda html: html_text(
        html, render_html, "calendar description", problems, problems))
    if summary is not None:
        summary.problems.extend(problems)
    return summary


def _render(entity: Entity, body: _Rendering) -> str:
    """The readable text of an entity: plain preferred, HTML converted, attachments skipped."""
    if note := _encrypted_body(entity):
        body.notes.append(note)
        return ""
    if _is_attachment(entity):
        return ""
    if not entity.is_multipart:
        return _leaf_text(entity, body)
    if entity.ctype == "multipart/alternative":
        return _render_alternative(entity.children, body)
    texts = (_render(child, body) for child in entity.children)
    return "\n\n".join(text for text in texts if text)


# A plain alternative this short may be a stub ("." or "view this mail in a browser") beside
# the real message in HTML: it stands only if the richest alternative says little more.
STUB_PLAIN_CHARS = 80
_WORD = re.compile(r"\w+")


def _render_alternative(children: list[Entity], body: _Rendering) -> str:
    for child in children:  # plain text is the cheapest and most faithful rendering
        if _has_plain(child) and (text := _render(child, body)):
            if len(text) < STUB_PLAIN_CHARS:
                return _unless_stub(text, [c for c in children if c is not child], body)
            return text
    return _richest(children, body)


def _richest(children: list[Entity], body: _Rendering) -> str:
    for child in reversed(children):  # RFC 2046: the last alternative is the richest
        if text := _render(child, body):
            return text
    return ""


def _unless_stub(plain: str, others: list[Entity], body: _Rendering) -> str:
    """A short plain text, or the richest other alternative where that has more words the
    plain text lacks than the plain text has (the plain part was a stub: "view your order
    online" beside the order's items and total, which are short too); what rendering the
    other found is kept only if it is shown."""
    scratch = _Rendering(body.render_html, [])
    richer = _richest(others, scratch)
    plain_words = _words(plain)
    if len(_words(richer) - plain_words) <= len(plain_words):
        return plain
    body.defects.extend(scratch.defects)
    body.notes.extend(scratch.notes)
    body.from_html = body.from_html or scratch.from_html
    return richer


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.casefold()))


_NOT_DECRYPTED = "fmail-nm does not decrypt mail"
_PGP_NOTE = f"encrypted (PGP/MIME): {_NOT_DECRYPTED}"
_SMIME_TYPES = ("application/pkcs7-mime", "application/x-pkcs7-mime")


def _encrypted_body(entity: Entity) -> str | None:
    """The note for an entity that stands where a body would and cannot be read without a
    key (or, for opaque-signed S/MIME, without unpacking it); None for any other entity."""
    if entity.ctype == "multipart/encrypted":
        return _PGP_NOTE
    return _smime_body(entity)


def encrypted_note(entity: Entity) -> str | None:
    """``_encrypted_body``'s note for an attachment: a part of a PGP/MIME message or an
    S/MIME body is the encrypted message itself, not a file attached to it."""
    return _PGP_NOTE if entity.encrypted_part else _smime_body(entity)


def _smime_body(entity: Entity) -> str | None:
    """The note for an S/MIME entity in place of a body; None for any other entity."""
    if entity.ctype not in _SMIME_TYPES or (entity.path and _disposition(entity) == "attachment"):
        return None  # a .p7m file attached to a readable body is an attachment
    if _param(entity, "smime-type") == "signed-data":
        return "S/MIME signed in opaque form: fmail-nm does not unpack it"
    return f"encrypted (S/MIME): {_NOT_DECRYPTED}"


_INLINE_PGP = re.compile(r"^-----BEGIN PGP MESSAGE-----[ \t]*$", re.M)
_META_CHARSET = re.compile(rb"<meta[^>]{0,200}?charset\s*=\s*[\"']?\s*([A-Za-z0-9._:-]+)", re.I)


def _leaf_text(entity: Entity, body: _Rendering) -> str:
    defects = body.defects
    data = entity_payload(entity, defects)
    charset = entity_charset(entity)
    if entity.ctype == "text/html":
        if charset is None and (meta := _META_CHARSET.search(data, 0, 4096)):
            charset = meta.group(1).decode("ascii")
        html = decode_bytes(data, charset, entity.where, defects)
        text = html_text(html, body.render_html, entity.where, defects, body.notes)
        # Only a rendering that is shown counts: an empty one leaves the plain text shown.
        body.from_html = body.from_html or bool(text)
        body.blank_html = body.blank_html or (not text and bool(html.strip()))
        return text
    text = decode_bytes(data, charset, entity.where, defects)
    if entity.ctype == "text/enriched":
        text = enriched_to_text(text)
    elif _param(entity, "format") == "flowed":
        text = unflow(text, delsp=_param(entity, "delsp") == "yes")
    if _INLINE_PGP.search(text):
        body.notes.append(f"has an inline PGP-encrypted block: {_NOT_DECRYPTED}")
    return tidy(hide_uuencoded(text))


def _param(entity: Entity, name: str) -> str:
    """A Content-Type parameter, lower-cased; "" when absent or unreadable."""
    try:
        value = entity.headers.get_param(name, header="content-type")
    except Exception:  # noqa: BLE001 - untrusted parameters
        return ""
    return value.strip().lower() if isinstance(value, str) else ""


def part_text(entity: Entity, kind: str, data: bytes, problems: list[str]) -> str:
    """``data``, the payload of ``entity`` read as type ``kind``, decoded in its charset;
    iCalendar data unfolded first (see calendar.unfold)."""
    if kind in CALENDAR_TYPES:
        from .calendar import unfold

        data = unfold(data)
    return decode_bytes(data, entity_charset(entity), entity.where, problems)


def entity_charset(entity: Entity) -> str | None:
    try:
        return entity.headers.get_content_charset()
    except Exception:  # noqa: BLE001 - untrusted RFC 2231 parameters
        return None


# HTML rendered of one part, in characters: html2text takes about 0.8 s a megabyte, and a
# body or an attachment of 30 MB of HTML (a report, an exported log) would hold up every
# read; newsletters stay far below (Gmail clips a message's HTML at 102 KB).
MAX_HTML_CHARS = 500_000


def html_text(html: str, render_html: HtmlRenderer, where: str, defects: list[str],
              notes: list[str]) -> str:
    """``render_html(html)``, tidied, of the first MAX_HTML_CHARS (the rest noted as a
    defect), with a note of the text it hides and leaves out; on any failure, the tags
    stripped and a defect noted."""
    if len(html) > MAX_HTML_CHARS:
        defects.append(f"{where}: HTML of {len(html):,} characters; only the first "
                       f"{MAX_HTML_CHARS:,} rendered")
        html = html[:MAX_HTML_CHARS]
    try:
        rendered = render_html(html)
    except Exception as exc:  # noqa: BLE001 - a renderer on hostile markup; degrade, don't fail
        defects.append(f"{where}: HTML conversion failed ({type(exc).__name__}); tags stripped")
        return tidy(strip_tags(html))
    if rendered.hidden_chars:
        # Said, not shown: what the sender hid is a preheader's padding or an instruction
        # meant for an assistant, never for the reader.
        notes.append(f"left out {rendered.hidden_chars:,} characters of text the HTML hides")
    return tidy(rendered.text)
