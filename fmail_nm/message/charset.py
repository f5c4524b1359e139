"""Bytes to text by a MIME charset label, the way mail actually uses labels.

Declared charsets are often wrong or unknown; decoding here never raises, falls back to UTF-8
or windows-1252, and records what it had to guess in the caller's ``defects`` list.
"""

from __future__ import annotations

import codecs
import functools
import re

__all__ = ["decode_bytes", "guess_decode"]


# Labels Python does not know, or knows under a narrower codec than mail actually uses ("x-"
# prefixes and "cp-850" spellings are handled by _known_label).
_LABEL_ALIASES = {
    "iso-8859-8-i": "iso8859_8",
    "cn-gb": "gb18030",
    "mac-ce": "mac_latin2",
    "ks_c_5601": "cp949",
    "utf8mb4": "utf-8",
    "chinesebig5": "big5",  # Outlook Express: a Windows font charset, without "_charset"
}
# Windows font charsets (GB2312_CHARSET, ...), which some Windows mailers write as the MIME
# label: the code page each one stands for, by the name without "_charset".
_WINDOWS_CHARSETS = {
    "ansi": "cp1252", "easteurope": "cp1250", "russian": "cp1251", "greek": "cp1253",
    "turkish": "cp1254", "hebrew": "cp1255", "arabic": "cp1256", "baltic": "cp1257",
    "vietnamese": "cp1258", "thai": "cp874", "shiftjis": "cp932", "gb2312": "gb2312",
    "chinesebig5": "big5", "big5": "big5", "hangeul": "cp949", "hangul": "cp949",
    "johab": "johab", "mac": "mac_roman",
}
# A code page number however it is written: "cp-850", "win-1251", "ibm-437", "ms-936".
_CODE_PAGE = re.compile(r"(?:cp|win|windows|ibm|ms)[-_ ]?(\d{3,5})")
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
# Labels that say the sender did not know the charset: read as if none were declared.
_UNKNOWN_LABELS = {"unknown", "x-unknown", "unknown-8bit", "x-user-defined", "default",
                   "default_charset"}
_C1_BYTES = re.compile(rb"[\x80-\x9f]")


def _clean_label(charset: str | None) -> str:
    """A charset label lower-cased, without the quotes, spaces, RFC 2231 language
    ("utf-8*en") or "3D" (a header that went through quoted-printable) around it."""
    label = (charset or "").strip().lower()
    label = label.removeprefix("3d")  # 3D"utf-8": no charset name begins with "3d"
    return label.strip("\"' ").split("*", 1)[0]


def _known_label(label: str) -> str:
    """A label as Python's codecs know it: aliases, Windows font charsets and code page
    spellings mapped, an "x-" prefix dropped."""
    if label in _LABEL_ALIASES:
        return _LABEL_ALIASES[label]
    if label.endswith("_charset"):
        return _WINDOWS_CHARSETS.get(label[:-len("_charset")], label)
    label = label.removeprefix("x-")
    if code_page := _CODE_PAGE.fullmatch(label):
        return "cp" + code_page.group(1)
    return _LABEL_ALIASES.get(label, label)


def _codec_for(label: str) -> str | None:
    """Map a cleaned MIME charset label to a Python codec name, or None when it is
    unknown/unsafe."""
    try:
        info = codecs.lookup(_known_label(label))
    except (LookupError, ValueError):
        return None
    if info.name in _NOT_CHARSETS or not getattr(info, "_is_text_encoding", True):
        return None
    return _CODEC_UPGRADES.get(info.name, info.name)


def guess_decode(data: bytes) -> tuple[str, str]:
    """Decode bytes with no usable declaration: ASCII (ISO-2022-JP when it has its escapes),
    else UTF-8 (its stray bytes read as windows-1252, when UTF-8 is most of the 8-bit text),
    else windows-1252."""
    if data.isascii():
        if (japanese := _iso_2022_jp(data)) is not None:
            return japanese, "iso-2022-jp"
        return data.decode("ascii"), "ascii"
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    mixed = _mostly_utf8(data)
    if mixed is not None:
        return mixed, "utf-8 with some windows-1252 bytes"
    if (gbk := _gbk_in_disguise(data)) is not None:
        return gbk, "gb18030"
    # windows-1252 is latin-1 plus printable 0x80-0x9F; its 5 undefined bytes become U+FFFD.
    return data.decode("cp1252", "replace"), "windows-1252"


# ISO-2022-JP's switches to JIS X 0208 / 0212: 7-bit text that older Japanese
# mailers write unencoded in headers (and bodies without a charset).  Its two-byte letters
# are ASCII bytes, quotes and parentheses among them.
_ISO_2022_JP = re.compile(rb"\x1b\$[@B(]")


def _iso_2022_jp(data: bytes) -> str | None:
    """``data`` read as ISO-2022-JP when it switches to Japanese and decodes as such; else
    None."""
    if not _ISO_2022_JP.search(data):
        return None
    try:
        return data.decode("iso2022_jp_2")
    except UnicodeDecodeError:
        return _windows_iso_2022_jp(data)


def _windows_iso_2022_jp(data: bytes) -> str | None:
    """ISO-2022-JP as Windows writes it (CP50220): with NEC's row 13 (①, ㈱, Ⅳ, the
    commonest letters outside JIS X 0208 in Japanese mail) under JIS X 0208's escape, where
    no codec reads them.  JIS X 0213, a superset of JIS X 0208, has them at the same codes.
    None where that does not decode either."""
    try:
        return data.replace(b"\x1b$B", b"\x1b$(Q").decode("iso2022_jp_2004")
    except UnicodeDecodeError:
        return None


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
    label = _clean_label(charset)
    if not label or label in _ASCII_LABELS or label in _UNKNOWN_LABELS:
        # Undeclared, or "us-ascii" over 8-bit bytes: the commonest lie in mail; it is nearly
        # always UTF-8 (modern clients) or windows-1252 (old ones). Not worth a defect.
        return guess_decode(data)[0]
    codec = _codec_for(label)
    if codec is None:
        text, used = guess_decode(data)
        defects.append(f"{where}: unknown charset {charset!r}, decoded as {used}")
        return text
    if codec in _WESTERN_CODECS and (
            (found := _utf8_in_disguise(data)) is not None
            or (found := _gbk_in_disguise(data)) is not None):
        return found
    if codec == "iso8859-1" and _C1_BYTES.search(data):
        codec = "cp1252"  # the WHATWG rule: "latin-1" with 0x80-0x9F means windows-1252
    for candidate in (codec, *_CODEC_RETRIES.get(codec, ())):
        try:
            return data.decode(candidate)
        except UnicodeDecodeError:
            continue
        except LookupError:  # pragma: no cover - codec vanished between lookup and use
            break
    if codec == "iso2022_jp" and (windows := _windows_iso_2022_jp(data)) is not None:
        return windows
    return _decode_fallback(data, codec, charset, where, defects)


# Single-byte codecs that decode any bytes, and that mailers write by default over UTF-8 text.
_WESTERN_CODECS = {"iso8859-1", "cp1252", "iso8859-15"}


def _utf8_in_disguise(data: bytes) -> str | None:
    """Text labelled Latin-1 that is valid UTF-8 with some 8-bit bytes: UTF-8 ("cafÃ©" read
    as Latin-1); else None. Not a statistical guess: in real Latin-1 text an accented letter
    is followed by a letter or space, which UTF-8 never allows after its lead byte, so a
    whole part that is valid UTF-8 (every 8-bit byte in a well-formed sequence) is UTF-8."""
    if data.isascii():
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# A run of 8-bit bytes: in GBK text (the characters of two 8-bit bytes; those with an ASCII
# trail byte, 0x40-0x7E, not taken) each is whole characters, an even number of bytes; in
# Latin-1 text most are a single accented letter.
_HIGH_RUN = re.compile(rb"[\x80-\xff]+")
# The lead bytes of EUC-KR's Hangul syllables, rows which GB2312 has hanzi in: Korean text
# in them is just as valid GBK.
_HANGUL_LEADS = bytes(range(0xB0, 0xC9))
# Latin-1's symbols (¡ to ¿): a third of GB2312's trail bytes and many of its lead bytes are
# in this range, so GBK read as Latin-1 has them among its letters; Latin-1 text hardly ever
# has one next to an accented letter.
_LATIN1_SYMBOL = re.compile(rb"[\xa1-\xbf]")


@functools.cache
def _ideographs() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """An ideograph, and two in a row.  Compiled on first use, not on import: the regex
    compiler walks a range this wide character by character (over ten million instructions
    a pattern), which every process that loads this module -- each index run -- would pay,
    and only text that looks like GBK in disguise is searched with them."""
    return re.compile("[\u4e00-\u9fff]"), re.compile("[\u4e00-\u9fff]{2}")


def _gbk_in_disguise(data: bytes) -> str | None:
    """Chinese text in GBK under a Latin-1 label, or none (mojibake like "ÄãºÃ" read as
    Latin-1): the text, decoded as GB18030; else None.  Only where Latin-1 text cannot be:
    every 8-bit byte in a pair of 8-bit bytes (real Latin-1 has a lone accented letter in
    nearly every word: "café", "Müller"), a Latin-1 symbol in one of the pairs ("Trèèèès"
    is all letters), and the pairs decoding to ideographs -- two in a row at least, and most
    of the non-ASCII text.  Text whose pairs all lie in the Hangul rows may be Korean
    (EUC-KR) as well, and stays as it was."""
    if data.isascii():  # no 8-bit byte, no pair: said at C speed, not by scanning for runs
        return None
    runs = []
    for run in _HIGH_RUN.finditer(data):  # Latin-1 text mostly stops at its first accent
        if len(run.group()) % 2:
            return None
        runs.append(run.group())
    pairs = b"".join(runs)
    if not _LATIN1_SYMBOL.search(pairs) or not pairs[::2].translate(None, _HANGUL_LEADS):
        return None
    try:
        text = data.decode("gb18030")
    except UnicodeDecodeError:
        return None
    characters = len(pairs) // 2
    ideograph, ideograph_pair = _ideographs()
    ideographs = len(text) - len(ideograph.sub("", text))
    if not ideograph_pair.search(text) or 2 * ideographs < characters:
        return None
    return text


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
