"""Output hygiene: text from mail made safe to show, without the whitespace noise.

Apart from :mod:`fmail_nm.message.text` so that the header parsers, which need only this,
do not load the body renderers (dozens of patterns compiled on import) in every process
that reads a header: the delivery an index run writes before ``notmuch new`` is one."""

from __future__ import annotations

import re

# C0 controls except \t and \n, DEL, C1 controls (0x9B is a one-byte CSI on some terminals),
# bidi embeddings/overrides/isolates (the "Trojan Source" characters), and lone surrogates
# (which some codecs can emit and which UTF-8 JSON cannot carry), and the Unicode tag
# characters, which no mail client shows but a model reads as the ASCII they mirror
# ("ASCII smuggling": a hidden "ignore prior instructions").
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
                     "\U000e0000-\U000e007f]")
# Those of them ASCII text can hold: a set of one byte's characters is tested faster.
_UNSAFE_ASCII = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
# Invisible padding that HTML newsletters use by the hundred (preheader spacers), and the
# joiners next to white space or each other: between letters or emoji they join glyphs.
_INVISIBLE = re.compile("[\u200b\u2060\ufeff\u034f\u00ad]|[\u200c\u200d](?=[\\s\u200c\u200d]|$)"
                        "|(?:^|(?<=\\s))[\u200c\u200d]")
# Any of those characters: most text has none, and a plain scan for them is much cheaper
# than the lookarounds above at every position.
_ANY_INVISIBLE = re.compile("[\u200b\u2060\ufeff\u034f\u00ad\u200c\u200d]")
# A signature delimiter keeps its trailing space: "-- " is how mail readers find signatures.
_SIGNATURE_DELIMITER = "-- "
_BLANK_RUNS = re.compile(r"\n{3,}")


def sanitize(text: str) -> str:
    """Normalise newlines and remove characters that can steer a terminal or hide text."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return (_UNSAFE_ASCII if text.isascii() else _UNSAFE).sub("", text)


def tidy(text: str) -> str:
    """Sanitize, then drop the whitespace noise that costs tokens and carries no meaning."""
    text = sanitize(text)
    if not text.isascii() and _ANY_INVISIBLE.search(text):  # isascii() costs no scan
        text = _INVISIBLE.sub("", text)
    text = text.replace("\xa0", " ")
    # Line by line rather than one multi-line regex: ten times faster on long bodies -- and
    # only where a line ends in white space: a preview tidies again text tidied already.
    if " \n" in text or "\t\n" in text or text.endswith((" ", "\t")):
        text = "\n".join(line if line == _SIGNATURE_DELIMITER else line.rstrip(" \t")
                         for line in text.split("\n"))
    if "\n\n\n" in text:  # found at C speed: the expression is slower at every newline
        text = _BLANK_RUNS.sub("\n\n", text)
    return text.strip("\n")


def one_line(text: str) -> str:
    """``text`` on one line, its runs of white space one space each.  Split before the
    controls are taken out: VT, FF and NEL break lines as LF does, and taken out first, one
    between two words glued them into one ("foobar")."""
    return " ".join(sanitize(" ".join(text.split())).split())
