"""Header blocks of untrusted mail: splitting them off, decoding values, reading the fields.

The stdlib parser reads each header block that is not plain (its handling of malformed blocks
is well tested; a plain one's fields are built as it would build them), and its RFC 2231
parameter handling reads the values; this module decodes what it hands back -- raw 8-bit
bytes and RFC 2047 encoded-words -- and reads addresses, Message-IDs, List-Id,
List-Unsubscribe and the date. Nothing here raises on malformed input.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import Message
from email.parser import BytesParser
from email.policy import Compat32
from email.utils import getaddresses, parsedate_to_datetime
from typing import Any, BinaryIO
from urllib.parse import unquote

from .charset import decode_bytes, guess_decode
from .hygiene import one_line, sanitize
from .transfer import b64_decode, b64_pieces

__all__ = [
    "Address",
    "HeaderInfo",
    "Unsubscribe",
    "addresses",
    "date",
    "decode_header_text",
    "ends_head",
    "header",
    "header_info",
    "is_list_address",
    "list_author",
    "list_id",
    "list_rewrote",
    "list_takes_posts",
    "list_unsubscribe",
    "msg_id",
    "msg_ids",
    "parse_headers",
    "read_head",
    "split_head",
    "to_bytes",
    "via_name",
    "written_date",
]


_MAX_HEADER_BLOCK = 1 << 20  # a header block larger than this is not a header block
# Address parsing is superlinear on some inputs: it is given at most this much at a time.  A
# longer address header is parsed in pieces cut at the commas between addresses, so that a mass
# mailing's thousands of visible recipients all count while the work stays linear in the
# header's length, up to a bound: thousands of people in one header, not a megabyte of them.
_MAX_HEADER_VALUE = 64 * 1024
_MAX_ADDRESS_HEADER = 512 * 1024


@dataclass(frozen=True)
class Address:
    name: str
    address: str


@dataclass(frozen=True)
class HeaderInfo:
    """The headers the indexer keeps beside notmuch (which stores only From/Subject/Id)."""

    to: list[Address]
    cc: list[Address]
    bcc: list[Address]
    list_id: str | None
    author: Address | None = None  # of list mail whose From the list rewrote (list_author)


def parse_headers(head: bytes) -> HeaderInfo:
    """Recipients, List-Id and a list author from a message's header block (the start of
    the file is enough), read as the whole parse reads them; never raises."""
    try:
        return header_info(split_head(bytes(head))[0])
    except Exception:  # untrusted input: a header we cannot read is a header we do not have
        return HeaderInfo(to=[], cc=[], bcc=[], list_id=None)


def header_info(headers: Message) -> HeaderInfo:
    """Recipients, List-Id and a list author of a header block :func:`split_head` read."""
    defects: list[str] = []
    found_list = list_id(headers)
    return HeaderInfo(to=addresses(headers, "to", defects), cc=addresses(headers, "cc", defects),
                      bcc=addresses(headers, "bcc", defects), list_id=found_list,
                      author=_list_author(headers, found_list, defects))


def _list_author(headers: Message, found_list: str | None, defects: list[str]) -> Address | None:
    """:func:`list_author` of a header block.  Its other addresses are read only for list
    mail whose From the list rewrote: for all other mail list_author reads no more than the
    From (and for mail of no list, not even that), and each address header read costs."""
    from_ = addresses(headers, "from", defects) if found_list is not None else []
    if found_list is None or len(from_) != 1 or not list_rewrote(from_[0], found_list):
        return None
    return list_author(from_, addresses(headers, "reply-to", defects),
                       addresses(headers, "x-original-from", defects), found_list)


# --------------------------------------------------------------------------------------------
# Splitting a header block off


class _RawHeaderPolicy(Compat32):
    """Compat32, but header values come back as the raw (surrogate-escaped) string.

    Compat32 wraps 8-bit header values in ``Header(charset=unknown-8bit)``, which loses the
    bytes; we want them, to decode as UTF-8 or windows-1252 ourselves.
    """

    def header_fetch_parse(self, name: str, value: str) -> str:
        return value


class _Head(Message):
    """A header block, knowing whether :func:`split_head` cut it (its last header may be
    missing its end).  A lookup by name goes through an index of the fields' names: the
    stdlib lower-cases every name on each lookup, and reading one body looks up a few
    headers a dozen times in a block of dozens."""

    cut = False
    _headers: list[tuple[str, Any]]  # the stdlib's list of fields, as parsed
    # The fields list the index was built of, its length then, and each lower-cased name's
    # positions: held with the list, so a new list (a field deleted) or one more field
    # rebuilds it; replace_header keeps a field's name.
    _index: tuple[list[tuple[str, Any]], int, dict[str, list[int]]] | None = None

    def _positions(self, name: str) -> list[int] | None:
        fields = self._headers
        index = self._index
        if index is None or index[0] is not fields or index[1] != len(fields):
            positions: dict[str, list[int]] = {}
            for i, (key, _) in enumerate(fields):
                positions.setdefault(key.lower(), []).append(i)
            index = self._index = (fields, len(fields), positions)
        return index[2].get(name.lower())

    def get(self, name: str, failobj: Any = None) -> Any:
        found = self._positions(name)
        return failobj if found is None else self.policy.header_fetch_parse(
            *self._headers[found[0]])

    def get_all(self, name: str, failobj: Any = None) -> Any:
        found = self._positions(name)
        if found is None:
            return failobj
        fields, fetch = self._headers, self.policy.header_fetch_parse
        return [fetch(*fields[i]) for i in found]

    def __contains__(self, name: str) -> bool:
        return self._positions(name) is not None


_POLICY = _RawHeaderPolicy()
_HEADER_PARSER = BytesParser(_Head, policy=_POLICY)
_BLANK_LINE = re.compile(rb"\n\r?\n")


def split_head(raw: bytes) -> tuple[Message, bytes]:
    """Parse the header block as the stdlib does; return (headers, body bytes)."""
    if raw.startswith(b"\n") or raw.startswith(b"\r\n"):
        return _Head(policy=_POLICY), raw[raw.index(b"\n") + 1 :]
    match = _BLANK_LINE.search(raw, 0, _MAX_HEADER_BLOCK)
    end, start = (match.start() + 1, match.end()) if match else (min(len(raw), _MAX_HEADER_BLOCK),) * 2
    plain = _plain_head(raw[:end])
    headers = plain if plain is not None else _HEADER_PARSER.parsebytes(raw[:end],
                                                                        headersonly=True)
    # Lines the stdlib did not accept as headers (no blank line, bare-CR mail) begin the body.
    leftover = _raw_payload(headers)
    if isinstance(headers, _Head):
        # Cut inside its last header: not when the stdlib found the block's end before the
        # bound (a line no header, bare-CR mail), nor when the bound falls at the end of a
        # line the next line does not continue.
        line_ended = raw[end - 1:end] == b"\n" and raw[end:end + 1] not in (b" ", b"\t")
        headers.cut = (match is None and len(raw) > _MAX_HEADER_BLOCK and not leftover
                       and not line_ended)
    headers.set_payload("")
    return headers, leftover + raw[start:]


# A header field as the stdlib reads one: a name of printable ASCII but ":", a colon, the
# value's first line, and its continuation lines (each begins with a space or tab).  Each
# newline either continues the value or ends the field, so nothing is given back (the
# possessive quantifiers): a block that is not plain fails in one pass.
_NAME = r"[\041-\071\073-\176]++"
_VALUE = r"[^\n]*+(?:\n[ \t][^\n]*+)*+"
_FIELD = re.compile(rf"({_NAME}):[ \t]*({_VALUE})(?:\n|\Z)")
_PLAIN_BLOCK = re.compile(rf"(?:{_NAME}:{_VALUE}(?:\n|\Z))*")


def _plain_head(block: bytes) -> _Head | None:
    """The stdlib parser's answer for a plain header block, built without it (its line
    machinery costs more than the rest of reading a message's body): a block of header
    fields whose lines all end in LF or CRLF.  None for any other block (a bare CR, a line
    no header, a "From " line), which the stdlib parser reads, with its defects."""
    text = block.decode("ascii", "surrogateescape")
    if text.count("\r") != text.count("\r\n") or not _PLAIN_BLOCK.fullmatch(text):
        return None
    head = _Head(policy=_POLICY)
    for name, value in _FIELD.findall(text):
        # As Compat32.header_source_parse stores it: the value's leading blanks and its
        # last line end left out.
        head.set_raw(name, value.rstrip("\r\n"))
    head.set_payload("")
    return head


def read_head(file: BinaryIO, most: int) -> bytes:
    """The first ``most`` bytes of a message file -- or, when its header block goes on past
    them (thousands of recipients), through the end of that block, up to the bound
    :func:`split_head` reads one to: a header cut at ``most`` would lose the headers after
    it and could end in half an address.  Past the bound, split_head knows the block was
    cut."""
    head = file.read(most)
    if len(head) == most and not ends_head(head):
        head += file.read(_MAX_HEADER_BLOCK + 1 - len(head))
    return head


def ends_head(raw: bytes) -> bool:
    """Whether ``raw`` holds the end of its header block, as :func:`split_head` finds it."""
    return (raw.startswith((b"\n", b"\r\n"))
            or _BLANK_LINE.search(raw, 0, _MAX_HEADER_BLOCK) is not None)


def _raw_payload(msg: Message) -> bytes:
    # The private attribute is the only exact copy: get_payload() lossily decodes 8-bit text
    # with the declared charset. Only ever a few stray lines after a malformed header block.
    payload = getattr(msg, "_payload", None)
    if isinstance(payload, str):
        return to_bytes(payload)
    return b""


def to_bytes(text: str) -> bytes:
    """Undo the parser's ASCII+surrogateescape decoding."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


# --------------------------------------------------------------------------------------------
# Header values


_FOLD = re.compile(r"\r?\n(?=[ \t])")
_ENCODED_WORD = re.compile(r"=\?([^?\s]+)\?([bBqQ])\?([^?]*)\?=")


def header(headers: Message, name: str) -> str | None:
    """The first ``name`` header, unfolded and capped, still raw (not RFC 2047-decoded)."""
    value = headers.get(name)
    if value is None:
        return None
    return _FOLD.sub("", str(value))[:_MAX_HEADER_VALUE]


def _undo_8bit(text: str) -> str:
    """Header bytes sent raw (RFC 6532 UTF-8, legacy windows-1252 or ISO-2022-JP) back to
    text."""
    if text.isascii() and "\x1b" not in text:
        return text
    return guess_decode(to_bytes(text))[0]


def decode_header_text(value: str, defects: list[str]) -> str:
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
    text = decode_bytes(bytes(run), charset, "header", defects)
    run.clear()
    return text


def _decode_word(encoding: str, payload: str, defects: list[str]) -> bytes | None:
    data = to_bytes(payload)
    if encoding in "qQ":
        return binascii.a2b_qp(data, header=True)
    pieces, problems = b64_pieces(data)
    if problems:
        defects.append(f"header: bad base64 in encoded-word ({', '.join(problems)})")
        if not any(pieces):
            return None
    return b64_decode(pieces)


# --------------------------------------------------------------------------------------------
# Fields


def addresses(headers: Message, name: str, defects: list[str],
              unread: list[str] | None = None, *, as_written: bool = False) -> list[Address]:
    """The addresses in the ``name`` headers; what of them could not be read is a defect
    and, when ``unread`` is given, one more item of it (see :func:`parse_addresses`, and for
    ``as_written``).  In a header the header block was cut inside, the last address may be
    half of one: it is left out."""
    cut = _cut_last(headers, name)
    found = parse_addresses(headers.get_all(name) or [], name, defects, unread, cut=cut,
                            as_written=as_written)
    if cut:
        problem = (f"header {name}: the header block is longer than "
                   f"{_MAX_HEADER_BLOCK // 1024} KB and was cut inside this header; its "
                   "last address was not read")
        defects.append(problem)
        if unread is not None:
            unread.append(problem)
    return found


def parse_addresses(raw_values: Iterable[object], name: str, defects: list[str],
                    unread: list[str] | None = None, *, cut: bool = False,
                    as_written: bool = False) -> list[Address]:
    """The addresses in a header's raw values (folded, encoded-words as sent); ``cut``: the
    last value does not end where the header did, so what follows its last comma is left
    out.  The stdlib's parser adds an address's comments to its name ("Jörg
    <j(c1)@ex(c2).example>" is "Jörg (c1 c2)", "j(c1)@ex.example" is "c1 c1"); ``as_written``
    names each as it is written, for mail that shows the name to others (a draft, a reply):
    by its phrase, else by the comment after it ("a@b.example (Ann)", as older mail clients
    write a name) -- a comment is no name (RFC 5322 3.2.2).  Nameless where the list read
    without comments holds other addresses (a domain literal holding a parenthesis): never
    misnamed.

    Never raises: a part that cannot be read is left out, saying so in ``defects`` and --
    for a caller that must not go on without it (a reply to everyone) -- in ``unread``."""
    joined = ", ".join(_FOLD.sub("", str(v)) for v in raw_values)
    if not joined:
        return []
    if "\x1b" in joined:  # raw ISO-2022-JP: its letters' bytes read as quotes and commas
        joined = _undo_8bit(joined)
    people, problems = _read_addresses(joined, name, defects, cut)
    if unread is not None:
        unread += problems
    if not as_written or "(" not in joined:
        return people
    # A comment between a name's words reads as a space; one inside an address
    # ("Zoë <b(c)c@y.example>", RFC 5322 4's obsolete syntax) as nothing, or that address
    # would read as another: the space is tried first, then nothing.
    for gap in (" ", ""):
        phrases, _ = _read_addresses(_without_comments(joined, gap), name, [], cut)
        comments, _ = _read_addresses(_without_comments(joined, gap, keep_names=True), name,
                                      [], cut)
        if [p.address for p in people] == [p.address for p in phrases] == [
                p.address for p in comments]:
            return [Address(phrase.name or comment.name, p.address)
                    for p, phrase, comment in zip(people, phrases, comments)]
    return [Address("", p.address) for p in people]


def _read_addresses(joined: str, name: str, defects: list[str], cut: bool
                    ) -> tuple[list[Address], list[str]]:
    """parse_addresses of its values joined, and the parts of it that could not be read
    (also in ``defects``)."""
    problems: list[str] = []
    too_long = len(joined) > _MAX_ADDRESS_HEADER
    pieces = _pieces(joined[:_MAX_ADDRESS_HEADER], _MAX_HEADER_VALUE, cut=cut or too_long)
    if too_long:
        problems.append(f"header {name}: {len(joined):,} characters, more than the "
                        f"{_MAX_ADDRESS_HEADER // 1024} KB of addresses read; the rest was not "
                        "read")
    pairs: list[tuple[str, str]] = []
    for piece in pieces:
        if len(piece) > _MAX_HEADER_VALUE:  # one "address" this long: read what fits
            problems.append(f"header {name}: {len(piece):,} characters without a comma "
                            "between addresses; only the start was read")
            piece = piece[:_MAX_HEADER_VALUE]
        try:
            # Parse before decoding: an encoded-word may hide a comma inside a display name.
            bare = _bare_addresses(piece)
            pairs += bare if bare is not None else getaddresses([piece])
        except Exception:  # noqa: BLE001 - untrusted header; report rather than fail
            problems.append(f"header {name}: could not parse {len(piece):,} characters of "
                            "addresses")
    defects += problems
    result: list[Address] = []
    for display, addr in pairs:
        address = one_line(_undo_8bit(addr))
        if address:
            result.append(Address(one_line(decode_header_text(display, defects)), address))
    return result, problems


# An address alone, of letters, digits and "._+-" (no name, comment, quote or route), between
# blanks: the stdlib parser reads one as it is written.
_BARE_ADDRESS = re.compile(
    r"[ \t]*([A-Za-z0-9_+-]++(?:\.[A-Za-z0-9_+-]++)*+@[A-Za-z0-9-]++(?:\.[A-Za-z0-9-]++)*+)[ \t]*")


def _bare_addresses(piece: str) -> list[tuple[str, str]] | None:
    """``getaddresses([piece])`` of a list of bare addresses (a third of the address headers
    of real mail), read without the stdlib parser, which costs more than the rest of a
    header block; None for any other list."""
    found: list[tuple[str, str]] = []
    for item in piece.split(","):
        match = _BARE_ADDRESS.fullmatch(item)
        if match is None:
            return None
        found.append(("", match.group(1)))
    return found


# What ends a run of ordinary text in an address list, a quoted string, a comment.
_LIST_STOPS = re.compile(r'[,"(]')
_QUOTE_STOPS = re.compile(r'["\\]')
_COMMENT_STOPS = re.compile(r'[()\\]')


def _pieces(value: str, most: int, *, cut: bool = False) -> list[str]:
    """``value`` cut at commas between addresses (not in a quoted string or a comment, as
    the stdlib's parser reads them) into pieces of at most ``most`` characters where the
    addresses allow; the whole value when it is that short.  A value that was ``cut`` loses
    what follows its last comma, which may be part of an address.  Linear: each stop is
    found by one regex search from the last."""
    if len(value) <= most and not cut:
        return [value]
    pieces: list[str] = []
    start = last_comma = pos = 0
    depth, quoted = 0, False
    while True:
        stops = _QUOTE_STOPS if quoted else _COMMENT_STOPS if depth else _LIST_STOPS
        match = stops.search(value, pos)
        end = match.start() if match else len(value)
        if end - start > most and last_comma > start:  # the piece is full: cut at its last comma
            pieces.append(value[start:last_comma])
            start = last_comma + 1
            continue
        if match is None:
            break
        char, pos = match.group(), match.end()
        if char == "\\":
            pos += 1  # the next character is quoted, whatever it is
        elif char == ",":
            last_comma = match.start()
        elif char == '"':
            quoted = not quoted
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
    if not cut:
        pieces.append(value[start:])
    elif last_comma > start:
        pieces.append(value[start:last_comma])
    return pieces


def _without_comments(value: str, gap: str, *, keep_names: bool = False) -> str:
    """``value``, an address list, without the comments the stdlib's parser reads in it
    (as _pieces reads them): read, it gives the same addresses, and names without the
    comments that parser adds to them.  A comment taken out leaves ``gap``: a space, as CFWS
    between words reads ("Jörg(c)Smith" is "Jörg Smith").  ``keep_names`` keeps each comment
    that only blanks and comments separate from the start or the end of its mailbox (a comma,
    a semicolon, either end of the list): one before or after a bare address is its name, the
    RFC 822 way ("(Ann) a@b.example", "a@b.example (Ann)").  Linear, as _pieces."""
    spans: list[tuple[int, int]] = []
    pos = depth = start = 0
    quoted = False
    while match := (_QUOTE_STOPS if quoted else _COMMENT_STOPS if depth
                    else _LIST_STOPS).search(value, pos):
        char, pos = match.group(), match.end()
        if char == "\\":
            pos += 1  # the next character is quoted, whatever it is
        elif char == '"':
            quoted = not quoted
        elif char == "(":
            start = start if depth else match.start()
            depth += 1
        elif char == ")":
            depth -= 1
            if not depth:
                spans.append((start, pos))
    if depth:  # a comment not closed runs to the end, as the parser reads it
        spans.append((start, len(value)))
    kept = _at_mailbox_edges(value, spans) if keep_names else [False] * len(spans)
    out: list[str] = []
    end = 0
    for (first, last), keep in zip(spans, kept):
        out += [value[end:first], value[first:last] if keep else gap]
        end = last
    return "".join(out) + value[end:]


def _at_mailbox_edges(value: str, spans: Sequence[tuple[int, int]]) -> list[bool]:
    """For each comment (its span in ``value``), whether only blanks and comments lie
    between it and the start or the end of its mailbox (a comma, a semicolon, an end) -- at
    its start, before a bare address: the stdlib's parser names "(Ann) <a@b.example>"
    "(Ann)", its parentheses kept."""
    before, edge, last = [], True, 0
    for first, end in spans:
        between = value[last:first].rstrip()
        if between:
            edge = between[-1] in ",;"
        before.append(edge)
        last = end
    after: list[tuple[bool, bool]] = []
    edge, angle, last = True, False, len(value)
    for first, end in reversed(spans):
        between = value[end:last].lstrip()
        if between:
            edge, angle = between[0] in ",;", between[0] == "<"
        after.append((edge, angle))
        last = first
    return [b and not angle or a for b, (a, angle) in zip(before, reversed(after))]


def _cut_last(headers: Message, name: str) -> bool:
    """Whether the last header of a block :func:`split_head` had to cut is ``name``."""
    keys = headers.keys()
    return (isinstance(headers, _Head) and headers.cut and bool(keys)
            and keys[-1].lower() == name.lower())


ACE_PREFIX = "xn--"


def canonical_address(address: str) -> str:
    """One form of an address however its mail writes it: trimmed, lower-cased, its domain in
    Unicode -- the form notmuch indexes a From address in, decoding ACE (``xn--``) labels.
    The blocklist and the contacts compare and keep addresses in it.  A label that is not
    valid ACE stays as written."""
    local, at, domain = address.strip().lower().rpartition("@")
    if not at:
        return domain
    return f"{local}@{'.'.join(_unicode_label(label) for label in domain.split('.'))}"


def mailbox_address(address: str) -> str:
    """The canonical address without its sub-address ("+tag"): the mailbox a server delivers
    it to, ``alex+lists@example.org`` being ``alex@example.org``.  Cut at the first "+", as
    Postfix, Gmail and Fastmail deliver it."""
    return _without_sub_address(canonical_address(address))


def _without_sub_address(canonical: str) -> str:
    local, at, domain = canonical.rpartition("@")
    if not at or "+" not in local:
        return canonical
    return f"{local.partition('+')[0]}@{domain}"


def is_own_address(address: str, mine: Collection[str]) -> bool:
    """Whether ``address`` is the user's: one of ``mine`` (canonical forms), or a sub-address of
    one that has none (``alex+lists@example.org`` of ``alex@example.org``)."""
    canonical = canonical_address(address)
    return canonical in mine or _without_sub_address(canonical) in mine


def ascii_address(address: str) -> str:
    """The address with its domain in ACE (``xn--`` labels), the form a header or an SMTP
    envelope without SMTPUTF8 carries: ``alex@bücher.example`` is ``alex@xn--bcher-kva.example``
    on the wire.  Unchanged when the domain is ASCII or not a name IDNA can encode."""
    local, at, domain = address.rpartition("@")
    if not at or domain.isascii():
        return address
    try:
        return f"{local}@{domain.encode('idna').decode('ascii')}"
    except UnicodeError:
        return address


def search_forms(addresses: Iterable[str]) -> tuple[str, ...]:
    """The user's addresses as notmuch indexes them (:func:`canonical_address`), each once, in
    their order: ``from:alex@xn--bcher-kva.example`` matches nothing, since notmuch indexes
    that domain as ``bücher.example`` however a mail writes it."""
    return tuple(dict.fromkeys(canonical_address(a) for a in addresses))


def _unicode_label(label: str) -> str:
    if not label.startswith(ACE_PREFIX):
        return label
    try:
        return label.encode("ascii").decode("idna")
    except UnicodeError:
        return label


_ANGLE_ID = re.compile(r"<([^<>\s]+)>")


def msg_id(value: str | None) -> str | None:
    if value is None:
        return None
    if match := _ANGLE_ID.search(value):
        return one_line(match.group(1)) or None
    tokens = one_line(value).split()
    return tokens[0].strip("<>") or None if tokens else None


def msg_ids(value: str | None) -> list[str]:
    if not value:
        return []
    ids = _ANGLE_ID.findall(value) or value.replace(",", " ").split()
    return list(dict.fromkeys(i for i in (one_line(x).strip("<>") for x in ids) if i))


def list_id(headers: Message) -> str | None:
    """The list a message came through: its List-Id, else the address an older list server
    (Yahoo Groups, eGroups) sent in its stead, ``Mailing-List: list <address>; contact ...``,
    with ``@`` read as ``.`` (as ``list:`` reads it)."""
    return (_list_id_value(header(headers, "list-id"))
            or _mailing_list(header(headers, "mailing-list")))


def _list_id_value(value: str | None) -> str | None:
    if value is None:
        return None
    if match := _ANGLE_ID.search(value):
        return one_line(match.group(1)) or None
    bare = one_line(value)
    return bare if bare and " " not in bare else None


@dataclass(frozen=True)
class Unsubscribe:
    """A list message's way out (RFC 2369): its links, and whether an HTTP POST to its https
    one unsubscribes at once (RFC 8058 one-click)."""

    links: list[str]
    one_click: bool


# RFC 2369's links are each in <>, whitespace in them ignored (a long one is folded).  Only the
# schemes a person follows out of a list: a javascript: or data: link is no way out.
_BRACKETED = re.compile(r"<([^<>]*)>")
_UNSUBSCRIBE_SCHEME = re.compile(r"(?i)(https?|mailto):")
_ONE_CLICK = "list-unsubscribe=one-click"


def list_unsubscribe(headers: Message) -> Unsubscribe | None:
    """The List-Unsubscribe links (http, https, mailto) as given, each once, or None."""
    value = header(headers, "list-unsubscribe")
    if value is None:
        return None
    found = ("".join(sanitize(link).split()) for link in _BRACKETED.findall(_undo_8bit(value)))
    links = list(dict.fromkeys(link for link in found if _UNSUBSCRIBE_SCHEME.match(link)))
    if not links:
        return None
    post = header(headers, "list-unsubscribe-post")
    one_click = (post is not None and one_line(post).lower() == _ONE_CLICK
                 and any(link.lower().startswith("https:") for link in links))
    return Unsubscribe(links, one_click)


def list_takes_posts(headers: Message, recipients: Iterable[Address],
                     list_name: str | None) -> bool:
    """Whether a message is a post to a discussion list: its List-Post (RFC 2369) gives an
    address to post to that the message was written to, or that is the list's own (List-Id
    "devel.example.org" for devel@example.org; a list has other names, a post other ways
    in).  An announcement list's or a newsletter's gives none, or "NO"; GitHub's is the
    reply address of one thread, whose own unsubscribe link is otherwise only in the footer
    that clean drops."""
    value = header(headers, "list-post")
    if value is None:
        return False
    links = ("".join(link.split()) for link in _BRACKETED.findall(value))
    posts = {unquote(link[len("mailto:"):].split("?", 1)[0]).lower()
             for link in links if link[:len("mailto:")].lower() == "mailto:"}
    own = {post.replace("@", ".", 1) for post in posts}
    return (list_name is not None and list_name.lower() in own) or any(
        person.address.lower() in posts for person in recipients)


# ezmlm's "Mailing-List: contact <help address>; run by ezmlm" names no list address.
_MAILING_LIST = re.compile(r"list[ \t]+<?([^\s<>;@]+@[^\s<>;]+?)>?[ \t]*(;|$)", re.I)


def _mailing_list(value: str | None) -> str | None:
    match = _MAILING_LIST.match(one_line(value).strip()) if value else None
    return match.group(1).replace("@", ".") if match else None


# What a list appends to the author's name in the From it rewrites: Mailman's "Alice Smith
# via dev-list", Google Groups' "'Alice Smith' via golang-nuts" (the last " via " is the
# list's: a list name has no " via ").
_VIA = re.compile(r"(.*\S) via \S.*", re.S)


def via_name(name: str) -> str | None:
    """The author's name in a From name a list rewrote ("Alice Smith" of "'Alice Smith' via
    golang-nuts"); None for a name that does not end in " via <list>"."""
    match = _VIA.fullmatch(name)
    if match is None:
        return None
    person = match.group(1).strip()
    return person[1:-1].strip() if len(person) > 1 and person[0] == person[-1] == "'" else person


def is_list_address(address: str, list_id: str) -> bool:
    """Whether ``address`` is the posting address of the list ``list_id`` names: lists
    name themselves by it, "@" read as "." (``dev@lists.example.org``,
    ``<dev.lists.example.org>``)."""
    return address.strip().lower().replace("@", ".") == list_id.strip().lower()


def list_rewrote(sender: Address, list_id: str | None) -> bool:
    """Whether a list rewrote this From to an address of its own (DMARC mitigation): the
    list's posting address (Mailman, Google Groups, Yahoo Groups), or a name ending in " via
    <list>" on an address of the list's host (:func:`_on_list_host`: groups.io's
    ``noreply@groups.io`` of ``<hikers.groups.io>``, a Discourse site's notification
    address).  Not the author's own address, whatever her name says (``"Maria via Roma"
    <maria@roma.example>``)."""
    if list_id is None:
        return False
    return is_list_address(sender.address, list_id) or (
        via_name(sender.name) is not None and _on_list_host(sender.address, list_id))


def _on_list_host(address: str, list_id: str) -> bool:
    """Whether the address's domain is one the List-Id ends in, a whole label or more
    (``groups.io`` of ``hikers.groups.io``); not a top-level domain alone."""
    _, at, domain = address.strip().lower().rpartition("@")
    return bool(at) and "." in domain and list_id.strip().lower().endswith("." + domain)


def list_author(from_: Sequence[Address], reply_to: Sequence[Address],
                original_from: Sequence[Address], list_id: str | None) -> Address | None:
    """Who wrote list mail whose From the list rewrote (:func:`list_rewrote`:
    ``"Alice Smith via dev-list" <dev@lists.example.org>``): X-Original-From, else a
    Reply-To naming one address that is not the list's, named as the From names the author
    when it does not.  None for any other mail: the Reply-To of mail a list did not rewrite
    names no one who wrote it; nor is a name or word without "@" ("X-Original-From: Alice")
    anyone's address, to count mail from."""
    if list_id is None or len(from_) != 1 or not list_rewrote(from_[0], list_id):
        return None
    sender = from_[0]
    for named in (original_from, reply_to):
        if (len(named) == 1 and "@" in named[0].address
                and not _the_lists(named[0].address, sender, list_id)):
            return Address(named[0].name or via_name(sender.name) or "", named[0].address)
    return None


def _the_lists(address: str, sender: Address, list_id: str) -> bool:
    """The list's address, the From's -- or, the From being its host's rather than the
    list's, any other of that host: a Discourse site's reply-by-email address, no author."""
    return (is_list_address(address, list_id)
            or canonical_address(address) == canonical_address(sender.address)
            or (not is_list_address(sender.address, list_id)
                and _on_list_host(address, list_id)))


def date(value: str | None) -> datetime | None:
    """A Date header's moment, in UTC."""
    written = written_date(value)
    if written is None:
        return None
    try:
        return (written if written.tzinfo else written.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def written_date(value: str | None) -> datetime | None:
    """A Date header's moment in the zone its writer gave (the sender's own time); naive when
    it gives none: "-0000" is UTC with the local zone unknown (RFC 5322 §3.3)."""
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value.strip())
        if 100 <= parsed.year < 1000:  # the years since 1900 ("0102"), RFC 5322 §4.3
            parsed = parsed.replace(year=parsed.year + 1900)
        return parsed
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
