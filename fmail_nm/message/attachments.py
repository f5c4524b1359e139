"""The text of one attachment: text parts, HTML, forwarded messages and PDF (read by
pypdf in a process of its own: :mod:`.pdftext`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .headers import Address
from .html import html_to_text, read_message
from .mime import (
    CALENDAR_TYPES,
    AttachmentInfo,
    Entity,
    attachment_entities,
    calendar_summary,
    effective_type,
    encrypted_note,
    entity_filename,
    entity_payload,
    html_text,
    parse_entity,
    part_text,
)
from .pdftext import pdf_text
from .text import slice_text, tidy

__all__ = ["AttachmentText", "attachment_text", "dotted"]


_PDF_MAX_PAGES = 500
_PDF_READ_AHEAD = 100_000  # characters: five pages of get_attachment's default 20,000


@dataclass(frozen=True)
class AttachmentText:
    """``text`` from ``offset`` of ``total_chars`` (None for a PDF with pages left to read);
    ``next_offset`` is where the rest begins."""

    info: AttachmentInfo
    text: str | None
    truncated: bool
    note: str | None
    offset: int = 0
    total_chars: int | None = None
    next_offset: int | None = None


_TEXTUAL_APPLICATION = {"application/json", "application/xml", "application/x-sh", "application/javascript"}


def attachment_text(raw: bytes, path: int | Sequence[int], max_chars: int,
                    offset: int = 0) -> AttachmentText:
    """Text of attachment ``path``, ``max_chars`` of it from ``offset`` (see slice_text):
    ``path`` is an index as ``parse_message`` numbers them, or a path of indexes into
    forwarded messages (``(2, 0)``: attachment 0 of the message forwarded as attachment 2),
    so that an invoice inside a forward can be read without changing how the outer
    message's attachments are numbered."""
    steps = (path,) if isinstance(path, int) else tuple(path)
    if not steps:
        raise LookupError("no attachment index given")
    data = bytes(raw)
    for depth, index in enumerate(steps):
        entities = attachment_entities(parse_entity(data, []))
        if not 0 <= index < len(entities):
            raise LookupError(_no_attachment(steps[:depth], index, len(entities)))
        entity = entities[index]
        problems: list[str] = []  # this attachment's own decoding problems become its note
        data = entity_payload(entity, problems)
        info = AttachmentInfo(index, entity_filename(entity, problems), entity.ctype, len(data))
        inside = effective_type(info.content_type, info.filename)
        if depth + 1 < len(steps) and inside not in _MESSAGE_TYPES:
            raise LookupError(f"attachment {dotted(steps[:depth + 1])} is {info.content_type}, "
                              f"not a forwarded message: nothing is attached inside it")
    return _extract(info, entity, data, (max_chars, offset), problems, steps)


def dotted(steps: Sequence[int]) -> str:
    """An attachment's path as the tools write it: ``2.0``."""
    return ".".join(map(str, steps))


def _no_attachment(outer: Sequence[int], index: int, count: int) -> str:
    if not outer:
        valid = f"valid indexes are 0..{count - 1}" if count else "it has no attachments"
        return f"no attachment {index} in this message: {valid}"
    where = f"the message forwarded as attachment {dotted(outer)}"
    if not count:
        return f"no attachment {dotted([*outer, index])}: {where} has no attachments"
    return (f"no attachment {dotted([*outer, index])}: {where} has "
            f"{dotted([*outer, 0])}..{dotted([*outer, count - 1])}")


_MESSAGE_TYPES = ("message/rfc822", "message/global")
# A PDF whatever its label (application/x-pdf, text/plain): no other file begins so.
_PDF_MAGIC = b"%PDF-"


# How much of the text to show, from where: (max_chars, offset), slice_text's arguments.
Span = tuple[int, int]


def _extract(
    info: AttachmentInfo, entity: Entity, data: bytes, span: Span, problems: list[str],
    steps: Sequence[int],
) -> AttachmentText:
    if note := encrypted_note(entity):  # ciphertext read as a file would be gibberish
        return AttachmentText(info, None, False, note)
    kind = effective_type(info.content_type, info.filename)
    if kind in _MESSAGE_TYPES:
        return _sliced(info, _render_embedded(data, steps), span, "; ".join(problems) or None)
    textual = (kind.startswith("text/") or kind in _TEXTUAL_APPLICATION
               or kind.startswith("message/") or kind in CALENDAR_TYPES)
    if kind == "application/pdf" or data.startswith(_PDF_MAGIC):
        pdf = _pdf_content(info, data, span)
        # Labelled as text, what is no PDF is a text that begins like one (one about PDFs).
        if pdf.text is not None or not textual:
            return pdf
    if textual:
        text = part_text(entity, kind, data, problems)
        return _sliced(info, _readable(kind, text, entity, problems), span,
                       "; ".join(problems) or None)
    return AttachmentText(
        info, None, False, f"binary attachment ({info.content_type}, {info.size} bytes); no text extracted"
    )


def _readable(kind: str, text: str, entity: Entity, problems: list[str]) -> str:
    """Decoded text as a reader wants it: HTML rendered, calendar data summarized (the raw
    iCalendar text, folded and escaped, only where no event could be read from it)."""
    if kind == "text/html":
        return html_text(text, html_to_text, entity.where, problems, problems)
    if kind in CALENDAR_TYPES and (
            summary := calendar_summary(entity, text, html_to_text)) is not None:
        problems.extend(summary.problems)
        return summary.text
    return tidy(text)


def _sliced(info: AttachmentInfo, text: str, span: Span, note: str | None = None) -> AttachmentText:
    part = slice_text(text, *span)
    return AttachmentText(info, part.text, part.truncated, note, part.offset, part.total_chars,
                          part.next_offset)


def _render_embedded(data: bytes, steps: Sequence[int]) -> str:
    """A forwarded message as the headers a reader needs, then its body; its own
    attachments with the paths that read them (``[2.0] invoice.pdf``), and what get_email
    would say of its body (encrypted, only a photo) and of its problems."""
    inner = read_message(data)
    lines = [
        f"From: {_format_addresses(inner.from_)}",
        f"To: {_format_addresses(inner.to)}",
    ]
    if inner.cc:
        lines.append(f"Cc: {_format_addresses(inner.cc)}")
    lines.append(f"Date: {inner.date.isoformat() if inner.date else ''}")
    lines.append(f"Subject: {inner.subject}")
    if inner.attachments:
        names = ", ".join(f"[{dotted([*steps, a.index])}] {a.filename or a.content_type}"
                          for a in inner.attachments)
        lines.append(f"Attachments: {names}")
    if inner.body_notes:
        lines.append(f"Notes: {'; '.join(inner.body_notes)}")
    if inner.defects:
        more = len(inner.defects) - MAX_EMBEDDED_PROBLEMS
        lines.append(f"Problems: {'; '.join(inner.defects[:MAX_EMBEDDED_PROBLEMS])}"
                     + (f"; … {more} more" if more > 0 else ""))
    return "\n".join(lines) + "\n\n" + inner.text


# Problems of a forwarded message named (a mangled one has hundreds); the rest are counted.
MAX_EMBEDDED_PROBLEMS = 10


def _format_addresses(addresses: list[Address]) -> str:
    return ", ".join(f"{a.name} <{a.address}>" if a.name else a.address for a in addresses)


def _pdf_content(info: AttachmentInfo, data: bytes, span: Span) -> AttachmentText:
    if _PDF_MAGIC not in data[:1024]:
        # pypdf would scan the whole blob for trailers first: seconds on a large non-PDF.
        return AttachmentText(info, None, False, "not a PDF (no %PDF- header); no text extracted")
    max_chars, offset = span
    # A first page is read as far as it goes (most are the only one read); a page after it,
    # _PDF_READ_AHEAD further, so that the pages after that come from the text kept.
    ahead = _PDF_READ_AHEAD if offset else 0
    read = pdf_text(data, offset + max_chars, _PDF_MAX_PAGES, ahead=ahead)
    if read.text is None:
        return AttachmentText(info, None, False, read.problem)
    if not read.text.strip():
        return AttachmentText(info, None, False, "PDF has no extractable text (scanned or image-only?)")
    result = _sliced(info, read.text, span)
    if not read.more_pages:
        return result
    # Pages are left: the whole length is not known.  Read past the slice, the text goes on
    # at next_offset; short of it, the reader stopped at its page cap.
    if result.truncated:
        return replace(result, total_chars=None)
    return replace(result, truncated=True, total_chars=None,
                   note="PDF text extraction stopped early")
