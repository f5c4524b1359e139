"""Turn one raw RFC 822 message into what an LLM should read.

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
The one slow path left is HTML: html2text costs ≈ 1.5 ms per KB of HTML.
"""

from __future__ import annotations

import binascii
import codecs
import html as html_lib
import io
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from email.parser import BytesParser
from email.policy import Compat32
from email.utils import getaddresses, parsedate_to_datetime

import html2text

__all__ = [
    "Address",
    "AttachmentContent",
    "AttachmentInfo",
    "ParsedMessage",
    "TextSlice",
    "attachment_text",
    "clean_text",
    "parse_message",
    "preview",
    "slice_text",
]


# --------------------------------------------------------------------------------------------
# Public types


@dataclass(frozen=True)
class Address:
    name: str
    address: str


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
    html_present: bool
    attachments: list[AttachmentInfo]
    defects: list[str]


@dataclass(frozen=True)
class TextSlice:
    text: str
    offset: int
    total_chars: int
    truncated: bool
    next_offset: int | None


@dataclass(frozen=True)
class AttachmentContent:
    info: AttachmentInfo
    text: str | None
    truncated: bool
    note: str | None


# --------------------------------------------------------------------------------------------
# Limits that keep hostile input cheap

_MAX_DEPTH = 32  # MIME nesting we follow; deeper parts become opaque attachments
_MAX_HEADER_BLOCK = 1 << 20  # a header block larger than this is not a header block
_MAX_HEADER_VALUE = 64 * 1024  # address parsing is superlinear on some inputs: cap its work
_PDF_MAX_PAGES = 500


# --------------------------------------------------------------------------------------------
# Output hygiene


# C0 controls except \t and \n, DEL, C1 controls (0x9B is a one-byte CSI on some terminals),
# bidi embeddings/overrides/isolates (the "Trojan Source" characters), and lone surrogates
# (which some codecs can emit and which UTF-8 JSON cannot carry).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
# Invisible padding that HTML newsletters use by the hundred (preheader spacers).
_INVISIBLE = re.compile("[\u200b\u2060\ufeff\u034f\u00ad]|\u200c(?=[\\s\u200c])|(?<=\\s)\u200c")
_TRAILING_WS = re.compile(r"(?m)^(?!-- $)(.*?)[ \t]+$")  # keep "-- ": it delimits signatures
_BLANK_RUNS = re.compile(r"\n{3,}")


def _sanitize(text: str) -> str:
    """Normalise newlines and remove characters that can steer a terminal or hide text."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _UNSAFE.sub("", text)


def _tidy(text: str) -> str:
    """Sanitize, then drop the whitespace noise that costs tokens and carries no meaning."""
    text = _sanitize(text)
    text = _INVISIBLE.sub("", text).replace("\xa0", " ")
    text = _TRAILING_WS.sub(r"\1", text)
    return _BLANK_RUNS.sub("\n\n", text).strip("\n")


def _one_line(text: str) -> str:
    return " ".join(_sanitize(text).split())


# --------------------------------------------------------------------------------------------
# Charsets


# Labels Python does not know, or knows under a narrower codec than mail actually uses.
_LABEL_ALIASES = {
    "x-sjis": "cp932",
    "sjis": "cp932",
    "x-euc-jp": "euc_jp",
    "iso-8859-8-i": "iso8859_8",
    "windows-874": "cp874",
    "x-gbk": "gbk",
    "cn-gb": "gb18030",
    "x-mac-roman": "mac_roman",
    "ks_c_5601": "cp949",
    "x-windows-949": "cp949",
    "utf8mb4": "utf-8",
}
# WHATWG-style supersets: mail that says gb2312 routinely contains gbk/gb18030 characters, etc.
_CODEC_UPGRADES = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "big5": "big5hkscs",
    "euc_kr": "cp949",
    "shift_jis": "cp932",
    "iso8859-9": "cp1254",
    "iso8859-11": "cp874",
    "tis-620": "cp874",
}
# Second tries when the declared codec fails: mail "iso-2022-jp" often uses extensions.
_CODEC_RETRIES = {
    "iso2022_jp": ("iso2022_jp_2", "iso2022_jp_ext", "iso2022_jp_3"),
    "euc_jp": ("euc_jis_2004",),
}
# Text codecs that are not charsets: a hostile label must not select them.
_NOT_CHARSETS = {"unicode-escape", "raw-unicode-escape", "idna", "punycode", "undefined"}
_ASCII_LABELS = {"ascii", "us-ascii", "ansi_x3.4-1968", "us", "iso646-us"}
_C1_BYTES = re.compile(rb"[\x80-\x9f]")


def _codec_for(label: str) -> str | None:
    """Map a MIME charset label to a Python codec name, or None when it is unknown/unsafe."""
    label = label.strip().strip("\"'").lower().split("*", 1)[0]  # RFC 2231 "utf-8*en"
    label = _LABEL_ALIASES.get(label, label)
    try:
        info = codecs.lookup(label)
    except (LookupError, ValueError):
        return None
    if info.name in _NOT_CHARSETS or not getattr(info, "_is_text_encoding", True):
        return None
    return _CODEC_UPGRADES.get(info.name, info.name)


def _guess_decode(data: bytes) -> tuple[str, str]:
    """Decode bytes with no usable declaration: ASCII, else UTF-8, else windows-1252."""
    if data.isascii():
        return data.decode("ascii"), "ascii"
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        # windows-1252 is latin-1 plus printable 0x80-0x9F; its 5 undefined bytes become U+FFFD.
        return data.decode("cp1252", "replace"), "windows-1252"


def _decode_bytes(data: bytes, charset: str | None, where: str, defects: list[str]) -> str:
    """Decode with the declared charset when it works, falling back without ever raising."""
    label = (charset or "").strip().strip("\"'").lower()
    if not label or label in _ASCII_LABELS:
        # Undeclared, or "us-ascii" over 8-bit bytes: the commonest lie in mail; it is nearly
        # always UTF-8 (modern clients) or windows-1252 (old ones). Not worth a defect.
        return _guess_decode(data)[0]
    codec = _codec_for(label)
    if codec is None:
        text, used = _guess_decode(data)
        defects.append(f"{where}: unknown charset {charset!r}, decoded as {used}")
        return text
    if codec == "iso8859-1" and _C1_BYTES.search(data):
        codec = "cp1252"  # the WHATWG rule: "latin-1" with 0x80-0x9F means windows-1252
    for candidate in (codec, *_CODEC_RETRIES.get(codec, ())):
        try:
            return data.decode(candidate)
        except UnicodeDecodeError:
            continue
        except LookupError:  # pragma: no cover - codec vanished between lookup and use
            break
    return _decode_fallback(data, codec, charset, where, defects)


def _decode_fallback(data: bytes, codec: str, label: str | None, where: str, defects: list[str]) -> str:
    if codec != "utf-8":
        try:
            text = data.decode("utf-8")  # mislabelled UTF-8 is the most common case
        except UnicodeDecodeError:
            pass
        else:
            defects.append(f"{where}: text is not valid {label}, decoded as utf-8")
            return text
    if codec in ("utf-8", "cp1252", "iso8859-1"):
        text, used = data.decode("cp1252", "replace"), "windows-1252"
    else:
        text, used = data.decode(codec, "replace"), f"{label} with replacement characters"
    defects.append(f"{where}: text is not valid {label}, decoded as {used}")
    return text


# --------------------------------------------------------------------------------------------
# Transfer encodings


_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_NOT_CODE = bytes(b for b in range(256) if b not in _B64_ALPHABET + b"=")
_B64_CODE_OR_SPACE = _B64_ALPHABET + b"= \t\r\n\x0b\x0c"
_PAD_RUNS = re.compile(rb"=+")


def _b64_pieces(data: bytes) -> tuple[list[bytes], list[str]]:
    """Split base64 into alphabet-only runs (one per padded blob) and note what was wrong.

    Both the decoder and the size computation use this, so an attachment's size costs two
    ``bytes.translate`` passes and no decoding.
    """
    code = data.translate(None, _B64_NOT_CODE)
    body = code.rstrip(b"=")
    # Padding in the middle means concatenated blobs; decode each one on its own.
    pieces = _PAD_RUNS.split(body) if b"=" in body else [body]
    problems: list[str] = []
    if data.translate(None, _B64_CODE_OR_SPACE):  # whatever is left is not base64 at all
        problems.append("invalid characters skipped")
    if len(pieces) > 1:
        problems.append("padding inside the data")
    for i, piece in enumerate(pieces):
        if len(piece) % 4 == 1:  # 6 bits cannot make a byte: drop the stray character
            pieces[i] = piece[:-1]
            problems.append("truncated final group")
    rest = len(pieces[-1]) % 4
    if rest and (4 - rest) != len(code) - len(body):
        problems.append("wrong padding")
    return pieces, problems


def _b64_size(pieces: list[bytes]) -> int:
    return sum(len(p) // 4 * 3 + (0, 0, 1, 2)[len(p) % 4] for p in pieces)


def _b64_decode(pieces: list[bytes]) -> bytes:
    # Each piece is alphabet-only with a length that is not 1 mod 4, so this cannot fail.
    return b"".join(binascii.a2b_base64(p + b"=" * (-len(p) % 4)) for p in pieces)


# --------------------------------------------------------------------------------------------
# MIME structure


class _RawHeaderPolicy(Compat32):
    """Compat32, but header values come back as the raw (surrogate-escaped) string.

    Compat32 wraps 8-bit header values in ``Header(charset=unknown-8bit)``, which loses the
    bytes; we want them, to decode as UTF-8 or windows-1252 ourselves.
    """

    def header_fetch_parse(self, name: str, value: str) -> str:
        return value


_POLICY = _RawHeaderPolicy()
_HEADER_PARSER = BytesParser(policy=_POLICY)
_BLANK_LINE = re.compile(rb"\n\r?\n")
_HEADER_LINE = re.compile(rb"[!-9;-~]+:")


@dataclass
class _Entity:
    """One MIME entity: its headers (a stdlib Message holding only them) and raw body bytes."""

    headers: Message
    body: bytes
    ctype: str
    path: str
    children: list[_Entity] = field(default_factory=list)
    is_multipart: bool = False

    @property
    def where(self) -> str:
        return f"part {self.path} ({self.ctype})" if self.path else f"message ({self.ctype})"


def _raw_payload(msg: Message) -> bytes:
    # The private attribute is the only exact copy: get_payload() lossily decodes 8-bit text
    # with the declared charset. Only ever a few stray lines after a malformed header block.
    payload = getattr(msg, "_payload", None)
    if isinstance(payload, str):
        return _to_bytes(payload)
    return b""


def _to_bytes(text: str) -> bytes:
    """Undo the parser's ASCII+surrogateescape decoding."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def _split_head(raw: bytes) -> tuple[Message, bytes]:
    """Parse the header block with the stdlib; return (headers, body bytes)."""
    if raw.startswith(b"\n") or raw.startswith(b"\r\n"):
        return Message(policy=_POLICY), raw[raw.index(b"\n") + 1 :]
    match = _BLANK_LINE.search(raw, 0, _MAX_HEADER_BLOCK)
    end, start = (match.start() + 1, match.end()) if match else (min(len(raw), _MAX_HEADER_BLOCK),) * 2
    headers = _HEADER_PARSER.parsebytes(raw[:end], headersonly=True)
    # Lines the stdlib did not accept as headers (no blank line, bare-CR mail) begin the body.
    leftover = _raw_payload(headers)
    headers.set_payload("")
    return headers, leftover + raw[start:]


def _parse_entity(
    raw: bytes, path: str, depth: int, defects: list[str], default: str = "text/plain"
) -> _Entity:
    headers, body = _split_head(raw)
    if default != "text/plain":
        headers.set_default_type(default)
    entity = _Entity(headers, body, _content_type(headers), path)
    _note_header_defects(entity, defects)
    if entity.ctype.startswith("multipart/"):
        _split_children(entity, depth, defects)
    return entity


def _content_type(headers: Message) -> str:
    try:
        return headers.get_content_type()
    except Exception:  # noqa: BLE001 - untrusted parameters; the default is a safe answer
        return "text/plain"


_DEFECT_TEXT = {
    "MissingHeaderBodySeparatorDefect": "header block not followed by a blank line",
    "FirstHeaderLineIsContinuationDefect": "first header line is a continuation line",
    "MisplacedEnvelopeHeaderDefect": "'From ' envelope line among the headers",
    "InvalidHeaderDefect": "malformed header line",
}


def _note_header_defects(entity: _Entity, defects: list[str]) -> None:
    for defect in entity.headers.defects:
        name = type(defect).__name__
        defects.append(f"{entity.where}: {_DEFECT_TEXT.get(name, name)}")


def _split_children(entity: _Entity, depth: int, defects: list[str]) -> None:
    """Split a multipart body into child entities, or demote it to text when that fails."""
    if depth >= _MAX_DEPTH:
        defects.append(f"{entity.where}: MIME nesting deeper than {_MAX_DEPTH}; not followed")
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
    entity.is_multipart, entity.body = True, b""


def _multipart_body(entity: _Entity, defects: list[str]) -> bytes:
    # A transfer-encoded multipart is illegal, but some mailers do it; decode rather than lose it.
    cte = _cte(entity.headers)
    if cte in ("base64", "quoted-printable"):
        defects.append(f"{entity.where}: multipart with {cte} transfer encoding")
        return _decode_transfer(entity, defects)
    return entity.body


def _boundary(headers: Message) -> str | None:
    try:
        boundary = headers.get_boundary()
    except Exception:  # noqa: BLE001 - untrusted parameters
        return None
    return boundary or None


def _split_on_boundary(body: bytes, boundary: str, entity: _Entity, defects: list[str]) -> list[bytes] | None:
    """Cut a multipart body at its delimiter lines (RFC 2046 §5.1.1); None if there are none."""
    delimiter = b"--" + _to_bytes(boundary)
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


def _cte(headers: Message) -> str:
    value = str(headers.get("content-transfer-encoding", "") or "")
    match = re.match(r"\s*\"?([A-Za-z0-9_-]+)", value)
    return match.group(1).lower() if match else ""


def _decode_transfer(entity: _Entity, defects: list[str]) -> bytes:
    """The entity body with its Content-Transfer-Encoding undone, leniently."""
    cte = _cte(entity.headers)
    if cte == "base64":
        pieces, problems = _b64_pieces(entity.body)
        if problems:
            defects.append(f"{entity.where}: bad base64 ({', '.join(problems)}); decoded what could be")
        return _b64_decode(pieces)
    if cte == "quoted-printable":
        return binascii.a2b_qp(entity.body)
    if cte not in ("", "7bit", "8bit", "binary"):
        defects.append(f"{entity.where}: unknown transfer encoding {cte!r}; used as is")
    return entity.body


def _decoded_size(entity: _Entity, defects: list[str]) -> int:
    """Decoded byte size, computed without decoding base64 (the expensive, common case)."""
    cte = _cte(entity.headers)
    if cte == "base64":
        pieces, problems = _b64_pieces(entity.body)
        if problems:
            defects.append(f"{entity.where}: bad base64 ({', '.join(problems)})")
        return _b64_size(pieces)
    if cte == "quoted-printable":
        return len(binascii.a2b_qp(entity.body))
    return len(entity.body)


# --------------------------------------------------------------------------------------------
# Which parts are body and which are attachments


_BODY_TYPES = ("text/plain", "text/html")


def _filename(entity: _Entity, defects: list[str]) -> str | None:
    try:
        name = entity.headers.get_filename()
    except Exception:  # noqa: BLE001 - untrusted RFC 2231 parameters
        return None
    if not name:
        return None
    return _one_line(_decode_header_text(str(name), defects)) or None


def _disposition(entity: _Entity) -> str | None:
    try:
        return entity.headers.get_content_disposition()
    except Exception:  # noqa: BLE001
        return None


def _is_attachment(entity: _Entity) -> bool:
    if entity.is_multipart:
        return False
    if entity.ctype not in _BODY_TYPES:  # non-text leaves, message/*, text/calendar, ...
        return True
    if _disposition(entity) == "attachment":
        return True
    return bool(_filename(entity, []))


def _attachment_entities(root: _Entity) -> list[_Entity]:
    """Attachments in depth-first order; this order *is* the attachment index."""
    found: list[_Entity] = []
    stack = [root]
    while stack:
        entity = stack.pop()
        if _is_attachment(entity):
            found.append(entity)
        elif entity.is_multipart:
            stack.extend(reversed(entity.children))
    return found


def _has_html(root: _Entity) -> bool:
    stack = [root]
    while stack:
        entity = stack.pop()
        if entity.is_multipart:
            stack.extend(entity.children)
        elif entity.ctype == "text/html" and not _is_attachment(entity):
            return True
    return False


def _has_plain(entity: _Entity) -> bool:
    if entity.is_multipart:
        return any(_has_plain(child) for child in entity.children)
    return entity.ctype == "text/plain" and not _is_attachment(entity)


# --------------------------------------------------------------------------------------------
# Body text


def _render(entity: _Entity, defects: list[str]) -> str:
    """The readable text of an entity: plain preferred, HTML converted, attachments skipped."""
    if _is_attachment(entity):
        return ""
    if not entity.is_multipart:
        return _leaf_text(entity, defects)
    if entity.ctype == "multipart/alternative":
        return _render_alternative(entity.children, defects)
    texts = (_render(child, defects) for child in entity.children)
    return "\n\n".join(text for text in texts if text)


def _render_alternative(children: list[_Entity], defects: list[str]) -> str:
    for child in children:  # plain text is the cheapest and most faithful rendering
        if _has_plain(child) and (text := _render(child, defects)):
            return text
    for child in reversed(children):  # RFC 2046: the last alternative is the richest
        if text := _render(child, defects):
            return text
    return ""


_META_CHARSET = re.compile(rb"<meta[^>]{0,200}?charset\s*=\s*[\"']?\s*([A-Za-z0-9._:-]+)", re.I)


def _leaf_text(entity: _Entity, defects: list[str]) -> str:
    data = _decode_transfer(entity, defects)
    charset = _charset(entity)
    if entity.ctype == "text/html":
        if charset is None and (meta := _META_CHARSET.search(data, 0, 4096)):
            charset = meta.group(1).decode("ascii")
        return _html_to_text(_decode_bytes(data, charset, entity.where, defects), entity, defects)
    return _tidy(_decode_bytes(data, charset, entity.where, defects))


def _charset(entity: _Entity) -> str | None:
    try:
        return entity.headers.get_content_charset()
    except Exception:  # noqa: BLE001 - untrusted RFC 2231 parameters
        return None


def _html_to_text(html: str, entity: _Entity, defects: list[str]) -> str:
    converter = html2text.HTML2Text()
    converter.body_width = 0  # no hard wrapping: the reader wraps, and wrapping breaks URLs
    converter.images_to_alt = True  # tracking pixels vanish, meaningful alt text stays
    converter.unicode_snob = True  # keep “quotes” and é instead of ASCII approximations
    converter.inline_links = True  # [text](url), which every LLM reads
    try:
        # html2text drops <script>, <style> and <head> contents and renders tables as
        # Markdown rows, which reads well for data tables.
        return _tidy(converter.handle(html))
    except Exception as exc:  # noqa: BLE001 - html2text on hostile markup; degrade, don't fail
        defects.append(f"{entity.where}: HTML conversion failed ({type(exc).__name__}); tags stripped")
        return _tidy(_strip_tags(html))


_TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<[^>]*>", re.I | re.S)


def _strip_tags(html: str) -> str:
    return html_lib.unescape(_TAG.sub(" ", html))


# --------------------------------------------------------------------------------------------
# Headers


_FOLD = re.compile(r"\r?\n(?=[ \t])")
_ENCODED_WORD = re.compile(r"=\?([^?\s]+)\?([bBqQ])\?([^?]*)\?=")


def _header(headers: Message, name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    return _FOLD.sub("", str(value))[:_MAX_HEADER_VALUE]


def _header_all(headers: Message, name: str) -> list[str]:
    return [_FOLD.sub("", str(v))[:_MAX_HEADER_VALUE] for v in headers.get_all(name) or []]


def _undo_8bit(text: str) -> str:
    """Header bytes sent raw (RFC 6532 UTF-8, or legacy windows-1252) back to text."""
    if text.isascii():
        return text
    return _guess_decode(_to_bytes(text))[0]


def _decode_header_text(value: str, defects: list[str]) -> str:
    """Decode raw 8-bit bytes and RFC 2047 encoded-words; broken words stay as written."""
    value = _undo_8bit(value)
    if "=?" not in value:
        return value
    out: list[str] = []
    run = bytearray()  # adjacent words in one charset: join bytes before decoding, since
    run_charset: str | None = None  # senders split multi-byte characters across words
    pos = 0
    for match in _ENCODED_WORD.finditer(value):
        between = value[pos : match.start()]
        if not (run_charset is not None and between.strip() == ""):  # RFC 2047 §6.2
            out.append(_flush(run, run_charset, defects))
            run_charset = None
            out.append(between)
        pos = match.end()
        charset, encoding, payload = match.groups()
        data = _decode_word(encoding, payload, defects)
        if data is None:
            out.append(_flush(run, run_charset, defects))
            run_charset = None
            out.append(match.group(0))
            continue
        charset = charset.split("*", 1)[0].lower()
        if charset != run_charset:
            out.append(_flush(run, run_charset, defects))
            run_charset = charset
        run += data
    out.append(_flush(run, run_charset, defects))
    out.append(value[pos:])
    return "".join(out)


def _flush(run: bytearray, charset: str | None, defects: list[str]) -> str:
    if not run:
        return ""
    text = _decode_bytes(bytes(run), charset, "header", defects)
    run.clear()
    return text


def _decode_word(encoding: str, payload: str, defects: list[str]) -> bytes | None:
    data = _to_bytes(payload)
    if encoding in "qQ":
        return binascii.a2b_qp(data, header=True)
    pieces, problems = _b64_pieces(data)
    if problems:
        defects.append(f"header: bad base64 in encoded-word ({', '.join(problems)})")
        if not any(pieces):
            return None
    return _b64_decode(pieces)


def _addresses(headers: Message, name: str, defects: list[str]) -> list[Address]:
    values = _header_all(headers, name)
    if not values:
        return []
    try:
        # Parse before decoding: an encoded-word may hide a comma inside a display name.
        pairs = getaddresses(values)
    except Exception:  # noqa: BLE001 - untrusted header; report rather than fail
        defects.append(f"header {name}: could not parse addresses")
        return []
    result: list[Address] = []
    for display, addr in pairs:
        address = _one_line(_undo_8bit(addr))
        if address:
            result.append(Address(_one_line(_decode_header_text(display, defects)), address))
    return result


_ANGLE_ID = re.compile(r"<([^<>\s]+)>")


def _msg_id(value: str | None) -> str | None:
    if value is None:
        return None
    if match := _ANGLE_ID.search(value):
        return _one_line(match.group(1)) or None
    tokens = _one_line(value).split()
    return tokens[0].strip("<>") or None if tokens else None


def _msg_ids(value: str | None) -> list[str]:
    if not value:
        return []
    ids = _ANGLE_ID.findall(value) or value.replace(",", " ").split()
    return list(dict.fromkeys(i for i in (_one_line(x).strip("<>") for x in ids) if i))


def _list_id(value: str | None) -> str | None:
    if value is None:
        return None
    if match := _ANGLE_ID.search(value):
        return _one_line(match.group(1)) or None
    bare = _one_line(value)
    return bare if bare and " " not in bare else None


def _date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value.strip())
        if parsed.tzinfo is None:  # "-0000": UTC with unknown local zone (RFC 5322 §3.3)
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


# --------------------------------------------------------------------------------------------
# parse_message


@dataclass(frozen=True)
class HeaderInfo:
    """The headers the indexer keeps beside notmuch (which stores only From/Subject/Id)."""

    to: list[Address]
    cc: list[Address]
    list_id: str | None


def parse_headers(head: bytes) -> HeaderInfo:
    """Recipients and List-Id from a message's header block (the start of the file is
    enough); never raises."""
    defects: list[str] = []
    try:
        headers, _ = _split_head(bytes(head))
        return HeaderInfo(to=_addresses(headers, "to", defects), cc=_addresses(headers, "cc", defects),
                          list_id=_list_id(_header(headers, "list-id")))
    except Exception:  # untrusted input: a header we cannot read is a header we do not have
        return HeaderInfo(to=[], cc=[], list_id=None)


def parse_message(raw: bytes) -> ParsedMessage:
    """Parse one untrusted message. Never raises; problems are reported in ``defects``."""
    raw = bytes(raw)
    defects: list[str] = []
    try:
        return _parse(raw, defects)
    except Exception as exc:  # noqa: BLE001 - last line of defence for untrusted input
        defects.append(f"internal error while parsing: {type(exc).__name__}; body shown raw")
        return _fallback(raw, defects)


def _parse(raw: bytes, defects: list[str]) -> ParsedMessage:
    root = _parse_entity(raw, "", 0, defects)
    headers = root.headers
    attachments = [
        AttachmentInfo(i, _filename(e, defects), e.ctype, _decoded_size(e, defects))
        for i, e in enumerate(_attachment_entities(root))
    ]
    text = _render(root, defects)
    return ParsedMessage(
        subject=_one_line(_decode_header_text(_header(headers, "subject") or "", defects)),
        from_=_addresses(headers, "from", defects),
        to=_addresses(headers, "to", defects),
        cc=_addresses(headers, "cc", defects),
        reply_to=_addresses(headers, "reply-to", defects),
        date=_date(_header(headers, "date")),
        message_id=_msg_id(_header(headers, "message-id")),
        in_reply_to=_msg_id(_header(headers, "in-reply-to")),
        references=_msg_ids(_header(headers, "references")),
        list_id=_list_id(_header(headers, "list-id")),
        text=text,
        html_present=_has_html(root),
        attachments=attachments,
        defects=list(dict.fromkeys(defects)),
    )


def _fallback(raw: bytes, defects: list[str]) -> ParsedMessage:
    return ParsedMessage(
        subject="", from_=[], to=[], cc=[], reply_to=[], date=None, message_id=None,
        in_reply_to=None, references=[], list_id=None, text=_tidy(_guess_decode(raw)[0]),
        html_present=False, attachments=[], defects=defects,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Attachments


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
_TEXTUAL_APPLICATION = {"application/json", "application/xml", "application/x-sh", "application/javascript"}


def attachment_text(raw: bytes, index: int, max_chars: int) -> AttachmentContent:
    """Text of attachment ``index`` (as numbered by ``parse_message``), cut to ``max_chars``."""
    raw = bytes(raw)
    defects: list[str] = []
    entities = _attachment_entities(_parse_entity(raw, "", 0, defects))
    if not 0 <= index < len(entities):
        count = len(entities)
        valid = f"valid indexes are 0..{count - 1}" if count else "it has no attachments"
        raise LookupError(f"no attachment {index} in this message: {valid}")
    entity = entities[index]
    problems: list[str] = []  # this attachment's own decoding problems become its note
    data = _decode_transfer(entity, problems)
    info = AttachmentInfo(index, _filename(entity, problems), entity.ctype, len(data))
    return _extract(info, entity, data, max_chars, problems)


def _effective_type(info: AttachmentInfo) -> str:
    if info.content_type in ("application/octet-stream", "application/x-download") and info.filename:
        dot = info.filename.rfind(".")
        return (
            _EXTENSION_TYPES.get(info.filename[dot:].lower(), info.content_type)
            if dot >= 0
            else info.content_type
        )
    return info.content_type


def _extract(
    info: AttachmentInfo, entity: _Entity, data: bytes, max_chars: int, problems: list[str]
) -> AttachmentContent:
    kind = _effective_type(info)
    if kind in ("message/rfc822", "message/global"):
        return _sliced(info, _render_embedded(data), max_chars, "; ".join(problems) or None)
    if kind.startswith("text/") or kind in _TEXTUAL_APPLICATION or kind.startswith("message/"):
        text = _decode_bytes(data, _charset(entity), entity.where, problems)
        text = _html_to_text(text, entity, problems) if kind == "text/html" else _tidy(text)
        return _sliced(info, text, max_chars, "; ".join(problems) or None)
    if kind == "application/pdf":
        return _pdf_content(info, data, max_chars)
    return AttachmentContent(
        info, None, False, f"binary attachment ({info.content_type}, {info.size} bytes); no text extracted"
    )


def _sliced(info: AttachmentInfo, text: str, max_chars: int, note: str | None = None) -> AttachmentContent:
    part = slice_text(text, max_chars)
    return AttachmentContent(info, part.text, part.truncated, note)


def _render_embedded(data: bytes) -> str:
    """A forwarded message as the headers a reader needs, then its body."""
    inner = parse_message(data)
    lines = [
        f"From: {_format_addresses(inner.from_)}",
        f"To: {_format_addresses(inner.to)}",
    ]
    if inner.cc:
        lines.append(f"Cc: {_format_addresses(inner.cc)}")
    lines.append(f"Date: {inner.date.isoformat() if inner.date else ''}")
    lines.append(f"Subject: {inner.subject}")
    if inner.attachments:
        names = ", ".join(a.filename or a.content_type for a in inner.attachments)
        lines.append(f"Attachments: {names}")
    return "\n".join(lines) + "\n\n" + inner.text


def _format_addresses(addresses: list[Address]) -> str:
    return ", ".join(f"{a.name} <{a.address}>" if a.name else a.address for a in addresses)


def _pdf_content(info: AttachmentInfo, data: bytes, max_chars: int) -> AttachmentContent:
    if b"%PDF-" not in data[:1024]:
        # pypdf would scan the whole blob for trailers first: seconds on a large non-PDF.
        return AttachmentContent(info, None, False, "not a PDF (no %PDF- header); no text extracted")
    try:
        text, more_pages = _pdf_text(data, max_chars)
    except Exception as exc:  # noqa: BLE001 - pypdf on hostile input raises many things
        return AttachmentContent(info, None, False, f"could not extract text from PDF ({type(exc).__name__})")
    if not text.strip():
        return AttachmentContent(info, None, False, "PDF has no extractable text (scanned or image-only?)")
    result = _sliced(info, text, max_chars)
    if more_pages and not result.truncated:
        return AttachmentContent(info, result.text, True, "PDF text extraction stopped early")
    return result


def _pdf_text(data: bytes, max_chars: int) -> tuple[str, bool]:
    """Extract page text until ``max_chars`` is exceeded; (text, pages left unread)."""
    from pypdf import PdfReader  # imported lazily: only attachment reads pay for it

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        reader.decrypt("")  # many "encrypted" PDFs use an empty user password
    chunks: list[str] = []
    length = 0
    pages = reader.pages
    for number, page in enumerate(pages):
        if length > max_chars or number >= _PDF_MAX_PAGES:
            return _tidy("\n\n".join(chunks)), True
        chunk = page.extract_text() or ""
        chunks.append(chunk)
        length += len(chunk)
    return _tidy("\n\n".join(chunks)), False


# --------------------------------------------------------------------------------------------
# Slicing and previews


def slice_text(text: str, max_chars: int, offset: int = 0) -> TextSlice:
    """At most ``max_chars`` characters from ``offset``, cut at whitespace when one is near.

    Slices read in sequence (following ``next_offset``) concatenate to exactly ``text``.
    ``truncated`` means more text follows this slice.
    """
    if max_chars < 1:
        raise ValueError("max_chars must be at least 1")
    if offset < 0:
        raise ValueError("offset must not be negative")
    total = len(text)
    offset = min(offset, total)
    end = offset + max_chars
    if end >= total:
        return TextSlice(text[offset:], offset, total, False, None)
    cut = _cut_point(text, offset, end, max_chars)
    return TextSlice(text[offset:cut], offset, total, True, cut)


def _cut_point(text: str, offset: int, end: int, max_chars: int) -> int:
    # Look back a quarter of the budget (16 to 1000 chars) for a paragraph break, then a
    # line break, then any whitespace; failing that, cut mid-word rather than return less.
    low = max(offset + 1, end - min(max(max_chars // 4, 16), 1000))
    for separator in ("\n\n", "\n"):
        found = text.rfind(separator, low, end)
        if found != -1:
            return found + len(separator)
    for i in range(end - 1, low - 1, -1):
        if text[i].isspace():
            return i + 1
    return end


def preview(text: str, chars: int = 200) -> str:
    """The first ``chars`` characters of the new content, on one line (for listings)."""
    # The head of the text is enough for a preview; don't clean megabytes to show 200 chars.
    window = text[: max(chars * 50, 50_000)]
    return " ".join(clean_text(window).split())[:chars].rstrip()


# --------------------------------------------------------------------------------------------
# clean_text: drop quoted history and signatures


_QUOTED = re.compile(r"^[ \t]*>")
_SIG_STRICT = re.compile(r"^\\?-- $")
_SIG_LOOSE = re.compile(r"^\\?--[ \t]*$")
_ATTRIBUTION_START = re.compile(r"^[ \t]*[*_]*(On|Am|Le|El|Il|Op|Em|Den|På|W dniu|Dne)\b", re.I)
_ATTRIBUTION = re.compile(
    r"^[ \t]*[*_]*(On|Am|Le|El|Il|Op|Em|Den|På|W dniu|Dne)\b.{0,500}?"
    r"((wrote|writes|a écrit|escribió|ha scritto|escreveu|pisze|napisał|napsal)"
    r"|(schrieb|schreef|skrev)\b[^:]{0,120})"  # German, Dutch, Danish: the name follows
    r"[ \t]*:[*_ \t]*$",
    re.I | re.S,
)
_WROTE = re.compile(
    r"\b(wrote|writes|schrieb|a écrit|escribió|ha scritto|schreef|escreveu|skrev)[ \t]*:[*_ \t]*$", re.I
)
_ORIGINAL_MESSAGE = re.compile(
    r"^[ \t]*\\?-{2,}[ \t]*(Original Message|Ursprüngliche Nachricht|Message d'origine|"
    r"Mensaje original|Messaggio originale|Oorspronkelijk bericht|Originalmeddelande|"
    r"Mensagem original)[ \t]*\\?-{2,}[ \t]*$",
    re.I,
)
_RULE = re.compile(r"^[ \t]*_{8,}[ \t]*$")
_FROM_FIELD = re.compile(r"^[ \t]*[*_]*(From|Von|De|Da|Van|Från|Od)[ \t]*:[*_]*[ \t]*\S", re.I)
_SENT_FIELD = re.compile(
    r"^[ \t]*[*_]*(Sent|Date|Gesendet|Datum|Envoyé|Enviado|Inviato|Verzonden|Skickat|Wysłano)[ \t]*:", re.I
)
_FORWARD_MARK = re.compile(r"forward|weitergeleitet|transféré|reenviado|inoltrato|doorgestuurd", re.I)
_MOBILE_SIGNATURE = re.compile(
    r"^[ \t]*(Sent from my \S+( \S+)?|Sent from (Mail|Outlook) for \S+|Get Outlook for \S+|"
    r"Envoyé de mon \S+|Von meinem \S+ gesendet|Enviado desde mi \S+)[ \t.]*$",
    re.I,
)


def clean_text(text: str) -> str:
    """The new content of a message: quoted history, attributions and signature removed.

    Quoted (``>``) lines go wherever they are, so interleaved answers keep their new lines.
    A signature delimiter or an Outlook-style header block ends the new content, since
    Outlook's history below it is not quoted. Never returns an empty string for text that had
    unquoted content; text that is all quotes comes back unchanged.
    """
    lines = _sanitize(text).split("\n")
    cleaned = _tidy("\n".join(_new_content(lines)))
    if cleaned:
        return cleaned
    unquoted = _tidy("\n".join(line for line in lines if not _QUOTED.match(line)))
    return unquoted or text


def _new_content(lines: list[str]) -> list[str]:
    kept: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _QUOTED.match(line):
            i += 1
            continue
        if _ends_new_content(lines, i):
            break
        attribution_end = _attribution_end(lines, i)
        if attribution_end is not None:
            i = attribution_end + 1
            continue
        kept.append(line)
        i += 1
    while kept and (not kept[-1].strip() or _MOBILE_SIGNATURE.match(kept[-1])):
        kept.pop()
    return kept


def _ends_new_content(lines: list[str], i: int) -> bool:
    line = lines[i]
    if _SIG_STRICT.match(line) or _ORIGINAL_MESSAGE.match(line):
        return True
    if _SIG_LOOSE.match(line):  # "--" without its space: only if what follows is short
        rest = [x for x in lines[i + 1 :] if x.strip() and not _QUOTED.match(x)]
        return len(rest) <= 10
    if _RULE.match(line):
        following = _next_nonblank(lines, i + 1)
        return following is not None and bool(_FROM_FIELD.match(lines[following]))
    return _is_reply_header_block(lines, i)


def _is_reply_header_block(lines: list[str], i: int) -> bool:
    """Outlook's "From: … Sent: … To: … Subject: …" block — unless it introduces a forward."""
    if not _FROM_FIELD.match(lines[i]):
        return False
    if not any(_SENT_FIELD.match(x) for x in lines[i + 1 : i + 5]):
        return False
    before = [x for x in lines[max(0, i - 3) : i] if x.strip()]
    return not any(_FORWARD_MARK.search(x) for x in before)


def _attribution_end(lines: list[str], i: int) -> int | None:
    """Index of the last line of an "On … wrote:" attribution starting at ``i``, or None."""
    if _ATTRIBUTION_START.match(lines[i]):
        joined = lines[i]
        for j in range(i, min(i + 4, len(lines))):  # clients wrap long attributions
            if j > i:
                joined += " " + lines[j]
            if _ATTRIBUTION.match(joined):
                return j
    if _WROTE.search(lines[i]):  # "Bob <b@x> wrote:" directly above a quote
        following = _next_nonblank(lines, i + 1)
        if following is not None and _QUOTED.match(lines[following]):
            return i
    return None


def _next_nonblank(lines: list[str], start: int) -> int | None:
    for j in range(start, min(start + 3, len(lines))):
        if lines[j].strip():
            return j
    return None
