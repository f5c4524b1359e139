"""Content-Transfer-Encodings undone leniently: base64 (also for RFC 2047 words), quoted-printable,
and the uuencoding older mailers name there.

Never raises: bad base64 decodes as much as it can and the problems go to ``defects``. Sizing
base64 costs two ``bytes.translate`` passes and no decoding.
"""

from __future__ import annotations

import binascii
import re

__all__ = ["b64_decode", "b64_pieces", "decode_transfer", "decoded_size", "transfer_encoding"]


_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_NOT_CODE = bytes(b for b in range(256) if b not in _B64_ALPHABET + b"=")
_B64_CODE_OR_SPACE = _B64_ALPHABET + b"= \t\r\n\x0b\x0c"
_PAD_RUNS = re.compile(rb"=+")
# The padded end of the data, then (past blank lines) a line that is not base64: one with a
# character outside the alphabet or a space inside -- a footer a list server appended, a
# stray boundary.  notmuch and the email package stop at the padding; a line of base64
# after it is the next of concatenated blobs.
_TEXT_AFTER_PADDING = re.compile(
    rb"=[ \t\r]*\n(?=(?:[ \t\r]*\n)*[^\n]*?(?:[^\sA-Za-z0-9+/=]|\S[ \t]+\S))")
_CTE_TOKEN = re.compile(r"\s*\"?([A-Za-z0-9_-]+)")


def b64_pieces(data: bytes) -> tuple[list[bytes], list[str]]:
    """Split base64 into alphabet-only runs (one per padded blob) and note what was wrong.

    Both the decoder and the size computation use this, so an attachment's size costs two
    ``bytes.translate`` passes and no decoding.
    """
    problems: list[str] = []
    junk = data.translate(None, _B64_CODE_OR_SPACE)  # whatever is left is not base64 at all
    # Searched for only past junk: a footer has some, and well-formed data costs no search.
    if junk and (end := _TEXT_AFTER_PADDING.search(data)):
        data = data[:end.start() + 1]
        problems.append("text after the end of the data left out")
        junk = data.translate(None, _B64_CODE_OR_SPACE)
    code = data.translate(None, _B64_NOT_CODE)
    body = code.rstrip(b"=")
    # Padding in the middle means concatenated blobs; decode each one on its own.
    pieces = _PAD_RUNS.split(body) if b"=" in body else [body]
    if junk:
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


def b64_decode(pieces: list[bytes]) -> bytes:
    # Each piece is alphabet-only with a length that is not 1 mod 4, so this cannot fail.
    return b"".join(binascii.a2b_base64(p + b"=" * (-len(p) % 4)) for p in pieces)


def transfer_encoding(value: str) -> str:
    """A Content-Transfer-Encoding header value as a lower-case token ("" when absent/garbled)."""
    match = _CTE_TOKEN.match(value)
    return match.group(1).lower() if match else ""


def decode_transfer(body: bytes, cte: str, where: str, defects: list[str]) -> bytes:
    """``body`` with its Content-Transfer-Encoding ``cte`` undone, leniently."""
    if cte == "base64":
        pieces, problems = b64_pieces(body)
        if problems:
            defects.append(f"{where}: bad base64 ({', '.join(problems)}); decoded what could be")
        return b64_decode(pieces)
    if cte == "quoted-printable":
        return binascii.a2b_qp(body)
    if cte in _UU_ENCODINGS:
        return _uu_decode(body, where, defects)
    if cte not in ("", "7bit", "8bit", "binary"):
        defects.append(f"{where}: unknown transfer encoding {cte!r}; used as is")
    return body


def decoded_size(body: bytes, cte: str, where: str, defects: list[str]) -> int:
    """Decoded byte size, computed without decoding base64 (the expensive, common case)."""
    if cte == "base64":
        pieces, problems = b64_pieces(body)
        if problems:
            defects.append(f"{where}: bad base64 ({', '.join(problems)})")
        return _b64_size(pieces)
    if cte == "quoted-printable":
        return len(binascii.a2b_qp(body))
    if cte in _UU_ENCODINGS:
        return len(_uu_decode(body, where, defects))
    return len(body)


# Not in RFC 2045, but written by older mailers; the stdlib and notmuch (GMime) decode them.
_UU_ENCODINGS = ("x-uuencode", "uuencode", "x-uue", "uue")
_UU_BEGIN = re.compile(rb"^begin [0-7]{3,4} ", re.M)
# Lines decoded: 45 bytes each at most, so 45 MB; a hostile run of one-character lines costs
# about 0.3 s a million (a bound on what every get_email of the message spends sizing it).
MAX_UU_LINES = 1_000_000


def _uu_decode(body: bytes, where: str, defects: list[str]) -> bytes:
    """The data of the lines between the ``begin`` line and ``end``; without a ``begin``
    line, ``body`` as is (as the stdlib reads it)."""
    begin = _UU_BEGIN.search(body)
    if begin is None:
        defects.append(f"{where}: uuencoded data without its begin line; used as is")
        return body
    data: list[bytes] = []
    lines = body[begin.end():].split(b"\n", MAX_UU_LINES + 1)[1:]
    for line in lines[:MAX_UU_LINES]:
        line = line.rstrip(b" \t\r")
        if line == b"end":
            return b"".join(data)
        if line:
            data.append(_uu_line(line))
    cut = len(lines) > MAX_UU_LINES
    defects.append(f"{where}: uuencoded data " + (f"past {MAX_UU_LINES:,} lines not decoded"
                                                  if cut else "without its end line"))
    return b"".join(data)


def _uu_line(line: bytes) -> bytes:
    """One line's bytes; a line with junk after its data or short of its padding is cut to
    the length its first character declares, as the stdlib does."""
    try:
        return binascii.a2b_uu(line)
    except binascii.Error:
        try:
            return binascii.a2b_uu(line[:(((line[0] - 32) & 63) * 4 + 5) // 3])
        except binascii.Error:
            return b""
