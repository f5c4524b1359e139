"""Bytes to text by a MIME charset label, the way mail actually uses labels.

Declared charsets are often wrong or unknown; decoding here never raises, falls back to UTF-8
or windows-1252, and records what it had to guess in the caller's ``defects`` list.
"""

from __future__ import annotations

import codecs
import re

__all__ = ["decode_bytes", "guess_decode"]


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


def guess_decode(data: bytes) -> tuple[str, str]:
    """Decode bytes with no usable declaration: ASCII, else UTF-8 (its stray bytes read as
    windows-1252, when UTF-8 is most of the 8-bit text), else windows-1252."""
    if data.isascii():
        return data.decode("ascii"), "ascii"
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    mixed = _mostly_utf8(data)
    if mixed is not None:
        return mixed, "utf-8 with some windows-1252 bytes"
    # windows-1252 is latin-1 plus printable 0x80-0x9F; its 5 undefined bytes become U+FFFD.
    return data.decode("cp1252", "replace"), "windows-1252"


def _mostly_utf8(data: bytes) -> str | None:
    """UTF-8 text with a few bytes that are not (a footer a list server added in Latin-1):
    those bytes read as windows-1252, the rest kept -- when valid UTF-8 is at least half of
    the 8-bit bytes; else None (the whole text is more likely windows-1252)."""
    text = data.decode("utf-8", "surrogateescape")  # each stray byte: one U+DC80-U+DCFF
    stray = len(_ESCAPED_BYTE.findall(text))
    eight_bit = len(data) - len(data.translate(None, _EIGHT_BIT))
    if eight_bit - stray < stray:
        return None
    return _ESCAPED_BYTE.sub(_as_cp1252, text)


def _as_cp1252(match: re.Match[str]) -> str:
    return bytes([ord(match.group()) - 0xDC00]).decode("cp1252", "replace")


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
_EIGHT_BIT = bytes(range(0x80, 0x100))


def decode_bytes(data: bytes, charset: str | None, where: str, defects: list[str]) -> str:
    """Decode with the declared charset when it works, falling back without ever raising."""
    label = (charset or "").strip().strip("\"'").lower()
    if not label or label in _ASCII_LABELS:
        # Undeclared, or "us-ascii" over 8-bit bytes: the commonest lie in mail; it is nearly
        # always UTF-8 (modern clients) or windows-1252 (old ones). Not worth a defect.
        return guess_decode(data)[0]
    codec = _codec_for(label)
    if codec is None:
        text, used = guess_decode(data)
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
    if codec == "utf-8" and (mixed := _mostly_utf8(data)) is not None:
        text, used = mixed, "utf-8 with some windows-1252 bytes"
    elif codec in ("utf-8", "cp1252", "iso8859-1"):
        text, used = data.decode("cp1252", "replace"), "windows-1252"
    else:
        text, used = data.decode(codec, "replace"), f"{label} with replacement characters"
    defects.append(f"{where}: text is not valid {label}, decoded as {used}")
    return text
