"""Text out of a message, made safe and short: sanitising, slicing, previews, quote stripping.

Everything here works on ``str`` and never raises on untrusted input; no message content may
put terminal control or bidi-override characters into our output. It also holds the cheap HTML
tag strippers (no html2text): the fallback when html2text fails, and the renderer the indexer
uses for previews.
"""

from __future__ import annotations

import bisect
import html as html_lib
import math
import re
from dataclasses import dataclass
from typing import NamedTuple

from .hygiene import one_line, sanitize, tidy

__all__ = [
    "HtmlText",
    "QUOTE_MARK_ESCAPE",
    "TextSlice",
    "clean_text",
    "escape_quote_marks",
    "hide_uuencoded",
    "is_forward_subject",
    "one_line",
    "preview",
    "preview_html_text",
    "sanitize",
    "slice_text",
    "strip_tags",
    "tidy",
]


# A line that begins with ">" but is not quoted history -- literal text of an HTML paragraph,
# a space-stuffed format=flowed line -- is written "\>", the Markdown escape (as html2text
# writes "\-" and "\--"), so that clean_text keeps it.
QUOTE_MARK_ESCAPE = "\\>"
_LEADING_QUOTE_MARK = re.compile(r"^([ \t]*)>", re.M)


def escape_quote_marks(text: str) -> str:
    """``text`` with every line that begins with ">" escaped so it is not read as a quote."""
    if ">" not in text:  # most text: found at C speed, the expression tries every position
        return text
    return _LEADING_QUOTE_MARK.sub(lambda m: m.group(1) + QUOTE_MARK_ESCAPE, text)


# The backslashes text rendered from HTML carries at the start of a line ("\-", "\+", "\>",
# "1\."): marks that keep it from being read as Markdown lists or quotes.
_LINE_START_ESCAPE = re.compile(r"^([ \t]*)\\([-+>])|^([ \t]*\d+)\\(\.)", re.M)


def unescape_line_marks(text: str) -> str:
    """Text rendered from HTML as a person reads it (a reply's quote): the escapes at the
    start of lines taken off again."""
    return _LINE_START_ESCAPE.sub(lambda m: (m.group(1) or m.group(3) or "")
                                  + (m.group(2) or m.group(4)), text)


# --------------------------------------------------------------------------------------------
# uuencoded files in a text body


# Old mailers send a file inside the text: "begin 644 name", data lines, a zero-length line
# ("`", or a space that transport may strip), "end". Read strictly, so that prose which starts
# with "begin" is never taken for one.
_UU_BEGIN = re.compile(r"^begin [0-7]{3,4} ([^\n]{1,255}?)[ \t\r]*$", re.M)
# A data line: a length character, then that many bytes in groups of four characters (one
# more character allowed: some encoders add a checksum). All from " " to "`".
_UU_DATA = re.compile(r"[!-`][ -`]{4,85}")
_UU_EMPTY = ("", " ", "`")
UU_NAME_CHARS = 100


def hide_uuencoded(text: str) -> str:
    """``text`` with each well-formed uuencoded block replaced by one line naming the file:
    its lines are noise to a reader. One pass: a walk stops at the first line that is not
    data, and no line of data can begin another block."""
    pieces: list[str] = []
    pos = 0
    for begin in _UU_BEGIN.finditer(text):
        if begin.start() < pos:
            continue
        block = _uu_block(text, begin.end())
        if block is None:
            continue
        end, size = block
        name = one_line(begin.group(1))[:UU_NAME_CHARS]
        pieces += [text[pos:begin.start()],
                   f"[uuencoded file {name}, ~{math.ceil(size / 1024)} KB, not shown]"]
        pos = end
    return "".join(pieces) + text[pos:] if pieces else text


def _uu_block(text: str, start: int) -> tuple[int, int] | None:
    """Where the block whose begin line ends at ``start`` ends (after its "end"), and how
    many bytes it encodes; None if what follows is not data lines, then "end"."""
    size = 0
    last_was_empty = False  # the zero-length line: only "end" may follow it
    pos = start + 1
    while pos <= len(text):
        newline = text.find("\n", pos)
        line_end = len(text) if newline == -1 else newline
        line = text[pos:line_end].rstrip("\r")
        if line.rstrip(" \t") == "end":
            return (line_end, size) if size else None
        count = None if last_was_empty else _uu_line_bytes(line)
        if count is None or newline == -1:
            return None
        size += count
        last_was_empty = count == 0
        pos = newline + 1
    return None


def _uu_line_bytes(line: str) -> int | None:
    """The bytes a data line holds, by its length character; None unless its length
    agrees."""
    if line in _UU_EMPTY:
        return 0
    if not _UU_DATA.fullmatch(line):
        return None
    count = (ord(line[0]) - 32) & 63
    chars = (count + 2) // 3 * 4
    return count if chars <= len(line) - 1 <= chars + 1 else None


# --------------------------------------------------------------------------------------------
# Cheap HTML to text (no html2text)


_TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<[^>]*>", re.I | re.S)


class HtmlText(NamedTuple):
    """HTML rendered: the text shown, and the characters of text the HTML hides from its
    reader (see ``hidden``), left out of it."""

    text: str
    hidden_chars: int = 0


def strip_tags(html: str) -> str:
    """Tags out, entities decoded: the fallback when html2text fails on hostile markup."""
    return html_lib.unescape(_TAG.sub(" ", html))


# Elements whose content html2text drops (a stray <title> included), and comments.
_HIDDEN_OPEN = re.compile(r"<(head|title|script|style)\b|<!--", re.I)
_HIDDEN_CLOSE = {
    name: re.compile(rf"</{name}\s*>" if name else "-->", re.I)
    for name in ("head", "title", "script", "style", "")
}
# "[^<>]" rather than "[^>]": a run of "<" without ">" must not cost quadratic time.
_BLOCKQUOTE_TAG = re.compile(r"<(/?)blockquote\b[^<>]*>", re.I)
_BLOCK_TAG = re.compile(
    r"<(?:br|hr|/?(?:p|div|h[1-6]|ul|ol|li|dl|dt|dd|tr|table|pre|center|section|article|header|"
    r"footer|address|figure|form|fieldset))\b[^<>]*>",
    re.I,
)
_CELL_TAG = re.compile(r"</?t[dh]\b[^<>]*>", re.I)
_ANY_TAG = re.compile(r"<[/!?a-zA-Z][^<>]*>")  # "a < b" in text is not a tag


def preview_html_text(html: str) -> HtmlText:
    """A quick, approximate html2text for previews: block elements become line breaks and
    ``<blockquote>`` lines are ``>``-quoted, so ``clean_text`` drops quoted history and
    signatures as it does for html2text's output. Links, images and emphasis become their text.
    Linear time whatever the markup: the indexer runs this on every new HTML-only message.
    """
    # Loaded here, not on import: every index run loads this module for its previews, and
    # only HTML-only mail needs what hides (its patterns are compiled on import).
    from .hidden import style_sheet, without_hidden_elements

    html, hidden_chars = without_hidden_elements(_drop_hidden(html), style_sheet(html))
    pieces: list[str] = []
    depth = pos = 0
    for match in _BLOCKQUOTE_TAG.finditer(html):
        pieces.append(_quoted(_inline_text(html[pos : match.start()]), depth))
        depth = max(0, depth - 1) if match.group(1) else depth + 1
        pos = match.end()
    pieces.append(_quoted(_inline_text(html[pos:]), depth))
    return HtmlText("\n".join(pieces), hidden_chars)


def _drop_hidden(html: str) -> str:
    """Remove <head>, <title>, <script>, <style> elements and comments. An element that is
    never closed loses only its opening tag (HTML lets a page omit ``</head>``)."""
    out: list[str] = []
    unclosed: set[str] = set()  # no closing tag after some point: none after any later one
    pos = 0
    while match := _HIDDEN_OPEN.search(html, pos):
        name = (match.group(1) or "").lower()
        close = None if name in unclosed else _HIDDEN_CLOSE[name].search(html, match.end())
        out.append(html[pos : match.start()])
        if close is None:
            unclosed.add(name)
            pos = match.end()
        else:
            pos = close.end()
    out.append(html[pos:])
    return "".join(out)


def _inline_text(html: str) -> str:
    html = _BLOCK_TAG.sub("\n", html)
    html = _CELL_TAG.sub(" ", html)
    # Only <blockquote> quotes in HTML: a paragraph that begins with "&gt;" is text.
    return escape_quote_marks(html_lib.unescape(_ANY_TAG.sub("", html)))


def _quoted(text: str, depth: int) -> str:
    if not depth:
        return text
    mark = "> " * depth
    return "\n".join(mark + line for line in text.split("\n"))


# --------------------------------------------------------------------------------------------
# Slicing and previews


@dataclass(frozen=True)
class TextSlice:
    text: str
    offset: int
    total_chars: int
    truncated: bool
    next_offset: int | None


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
    return " ".join(clean_text(window, head=True).split())[:chars].rstrip()


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
_TO_OR_SUBJECT_FIELD = re.compile(
    r"^[ \t]*[*_]*(To|Cc|Subject|An|Betreff|À|Objet|Para|Asunto|A|Oggetto|Aan|Onderwerp|"
    r"Till|Ämne|Do|Temat|Assunto)[ \t]*:", re.I
)
_FORWARD_MARK = re.compile(r"forward|weitergeleitet|transféré|reenviado|inoltrato|doorgestuurd", re.I)
_MOBILE_SIGNATURE = re.compile(
    r"^[ \t]*(Sent from my \S+( \S+)?|Sent from (Mail|Outlook) for \S+|Get Outlook for \S+|"
    r"Envoyé de mon \S+|Von meinem \S+ gesendet|Enviado desde mi \S+)[ \t.]*$",
    re.I,
)


# A subject that starts with a forward prefix, in the languages clients write it, perhaps
# after tags such as "[EXTERNAL]" or a list's "[team]".
_FORWARD_SUBJECT = re.compile(
    r"^[ \t]*(\[[^\]]{0,40}\][ \t]*)*(fwd?|wg|tr|rv|enc|vl|doorst|i)[ \t]*(\[\d+\])?[ \t]*:", re.I
)


def is_forward_subject(subject: str) -> bool:
    """Whether ``subject`` is that of a forward ("Fwd:", "FW:", "WG:", "TR:", ...)."""
    return bool(_FORWARD_SUBJECT.match(subject))


def clean_text(text: str, forward: bool = False, *, head: bool = False,
               answered: bool = False) -> str:
    """The new content of a message: quoted history, attributions and signature removed,
    and the link addresses a reader sees no words for or was given already (``_fewer_links``).

    Quoted (``>``) lines go wherever they are, so interleaved answers keep their new lines.
    A signature delimiter or an Outlook-style header block ends the new content, since
    Outlook's history below it is not quoted -- except in a ``forward``, where the message
    below that block is the content the reader is after. Never returns an empty string for
    text that had unquoted content; text that is all quotes comes back unchanged.  ``head``:
    the text is the start of a longer one (a preview's), so an inline signature may lie
    beyond its end.  ``answered``: quoted lines (and their attribution) that new lines
    answer below them stay -- a reply's quote of an interleaved answer keeps the questions.
    """
    lines = _without_clearsign_armor(sanitize(text).split("\n"), head)
    kept = "\n".join(_without_boilerplate(_new_content(lines, forward, answered)))
    cleaned = tidy(_fewer_links(kept))
    if cleaned:
        return cleaned
    unquoted = [line for line in lines if not _QUOTED.match(line)]
    return (tidy("\n".join(_without_boilerplate(unquoted[:]))) or tidy("\n".join(unquoted))
            or text)


# A Markdown link as html2text writes it: "[words](address)" or "[words](address "title")",
# "()[]" of the address escaped.  Words with a bracket of their own are not matched: such a
# link is left as it is.  The address has a scheme, as a mail's links have: code in plain
# text ("handlers[kind](event)") is no link, nor is a Markdown image ("![alt](address)"),
# which a plain mail may show again and again.
_LINK_ADDRESS = r"[A-Za-z][A-Za-z0-9+.-]*:(?:\\.|[^\s()\[\]\\])+"
_LINK_TITLE = r'(?: "[^"\n]*")?'
_LINK = re.compile(rf"(?<!!)\[([^\[\]]*)\]\(({_LINK_ADDRESS}){_LINK_TITLE}\)")
# A line of links with no words: linked images without alt text (a logo, social icons).
_WORDLESS_LINK = rf"[ \t]*\[[ \t]*\]\(({_LINK_ADDRESS}){_LINK_TITLE}\)"
_WORDLESS_LINKS_LINE = re.compile(rf"^(?:{_WORDLESS_LINK})+[ \t]*$", re.M)
_ONE_WORDLESS_LINK_LINE = re.compile(rf"{_WORDLESS_LINK}[ \t]*")
_WORD = re.compile(r"\w")


def _fewer_links(text: str) -> str:
    """``text`` without the link addresses a reader sees no words for, nor those given
    already: a line of links without words goes (but for a call to action, see
    ``_without_wordless_lines``), so does such a link to an address linked
    with words elsewhere; of links to one address, the first with words keeps it, the others
    keep their words.  A newsletter links each story's image, title and button to one
    tracking address of 150 characters or more, and its logo and icons to more."""
    if "](" not in text:  # no link: most mail, read here for every preview the indexer makes
        return text
    text = _without_wordless_lines(text)
    worded = {link.group(2) for link in _LINK.finditer(text) if link.group(1).strip()}
    given: set[str] = set()

    def shown(link: re.Match[str]) -> str:
        words, address = link.group(1), link.group(2)
        if address in given or (address in worded and not words.strip()):
            return words
        given.add(address)
        return link.group(0)
    return _LINK.sub(shown, text)


def _without_wordless_lines(text: str) -> str:
    """``text`` without its lines of links without words -- but for its call to action, an
    image button ("Confirm your subscription") that may be the reader's only way on: the one
    such line below words of the text's own that holds one link, to an address given nowhere
    else.  A logo heads the words, icons come in rows, and a newsletter's pictures are many or
    link what its titles link."""
    lines = list(_WORDLESS_LINKS_LINE.finditer(text))
    if not lines:
        return text
    words_start = _words_start(text)
    below = [line for line in lines if line.start() > words_start
             and _ONE_WORDLESS_LINK_LINE.fullmatch(line.group(0))]
    kept = below[0].span() if len(below) == 1 and text.count(below[0].group(1)) == 1 else None
    return _WORDLESS_LINKS_LINE.sub(lambda line: line.group(0) if line.span() == kept else "",
                                    text)


def _words_start(text: str) -> int:
    """Where the first line of ``text`` with words outside its links starts (its length if
    none has)."""
    at = 0
    for line in text.split("\n"):
        if _WORD.search(_LINK.sub("", line)):
            return at
        at += len(line) + 1
    return len(text)


# An inline ("cleartext") PGP signature (RFC 4880 7): a header, the text with lines that begin
# with "-" escaped as "- -", then the armored signature.  clean keeps the text as written.
_CLEARSIGN_BEGIN = "-----BEGIN PGP SIGNED MESSAGE-----"
_SIGNATURE_BEGIN = "-----BEGIN PGP SIGNATURE-----"
_SIGNATURE_END = "-----END PGP SIGNATURE-----"
_ARMOR_HEADER = re.compile(r"^(Hash|Version|Comment|Charset):", re.I)
# Signature armor is a few hundred bytes: an "end" further away is not this signature's.
_ARMOR_LINES = 60


def _without_clearsign_armor(lines: list[str], head: bool = False) -> list[str]:
    """``lines`` with each inline-signed block's header and signature removed and its text
    unescaped; a block without its signature is left as it is -- unless ``lines`` are the
    ``head`` of a text, where the signature may be past their end."""
    if _CLEARSIGN_BEGIN not in lines:  # the common case, at C speed
        return lines
    # Found once: a search from each "BEGIN" would take quadratic time on hostile text.
    signatures = [j for j, line in enumerate(lines) if line == _SIGNATURE_BEGIN]
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i] != _CLEARSIGN_BEGIN:
            out.append(lines[i])
            i += 1
            continue
        block = _clearsigned_block(lines, i, signatures, head)
        if block is None:
            out.append(lines[i])
            i += 1
            continue
        text_start, signature, end = block
        out += [line[2:] if line.startswith("- ") else line
                for line in lines[text_start:signature]]
        i = end + 1
    return out


def _clearsigned_block(lines: list[str], begin: int, signatures: list[int],
                       head: bool) -> tuple[int, int, int] | None:
    """(first text line, signature line, end line) of the block opening at ``begin``;
    ``signatures``: where the signature armors begin, in order; ``head``: a block with no
    signature runs to the end of ``lines``."""
    text_start = begin + 1
    while text_start < len(lines) and _ARMOR_HEADER.match(lines[text_start]):
        text_start += 1
    if text_start < len(lines) and not lines[text_start].strip():
        text_start += 1
    after = bisect.bisect_left(signatures, text_start)
    if after == len(signatures):
        return (text_start, len(lines), len(lines) - 1) if head else None
    signature = signatures[after]
    for end in range(signature + 1, min(signature + _ARMOR_LINES, len(lines))):
        if lines[end].strip() == _SIGNATURE_END:
            return text_start, signature, end
    return None


_QUOTE_OR_ATTRIBUTION = re.compile(rf"{_QUOTED.pattern}|{_ATTRIBUTION_START.pattern}", re.I)


def _may_be_more_than_text(line: str) -> bool:
    """Whether ``line`` can be more than a line of new content: only if it is quoted, has
    what an end of the new content needs (see _ends_new_content) or a colon, or opens an
    attribution (see _attribution_end).  Tests at C speed spare most lines the three calls."""
    return ("--" in line or "__" in line or ":" in line
            or _QUOTE_OR_ATTRIBUTION.match(line) is not None)


def _new_content(lines: list[str], forward: bool, answered: bool = False) -> list[str]:
    kept: list[str] = []
    # With ``answered``: quoted lines and attributions read since the last new line, kept
    # only if a new line follows them.
    pending: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _may_be_more_than_text(line):
            if _QUOTED.match(line):
                if answered:
                    pending.append(line)
                i += 1
                continue
            if _ends_new_content(lines, i, forward):
                forwarded = _forwarded_block(lines, i + 1) if forward else None
                if forwarded is None:
                    break
                i = forwarded  # the forwarder's signature goes, the message it forwards stays
                continue
            attribution_end = _attribution_end(lines, i)
            if attribution_end is not None:
                if answered:
                    pending += lines[i:attribution_end + 1]
                i = attribution_end + 1
                continue
        if pending and not line.strip():
            pending.append(line)
        else:
            kept += pending
            pending = []
            kept.append(line)
        i += 1
    _drop_trailing(kept)
    return kept


def _drop_trailing(kept: list[str]) -> list[str]:
    while kept and (not kept[-1].strip() or _MOBILE_SIGNATURE.match(kept[-1])):
        kept.pop()
    return kept


def _without_boilerplate(kept: list[str]) -> list[str]:
    """``kept`` without what mail systems add around a message: an external-sender banner
    at its top, list and notification footers and confidentiality notices at its end
    (stacked ones too)."""
    _drop_banner(kept)
    _drop_trailing(kept)
    while (start := _tail_start(kept)) is not None:
        del kept[start:]
        _drop_trailing(kept)
    return kept


def _tail_start(lines: list[str]) -> int | None:
    footer = _footer_start(lines)
    return footer if footer is not None else _disclaimer_start(lines)


# The banner a mail system puts above mail from outside (Microsoft 365, Mimecast, Proofpoint),
# and Outlook's first-contact tip: a short first paragraph.
_BANNER = re.compile(
    r"^\W{0,5}(caution|warning|attention|notice|important|external( e-?mail| sender| message)?)"
    r"\b.{0,60}?(originated (from )?outside|from an? external sender|outside (of )?(the|your|"
    r"our) (organi[sz]ation|company|firm|network))|^\W{0,5}you don.t often get e-?mail from ",
    re.I | re.S)
_BANNER_CHARS = 600
_BANNER_LINES = 4


def _drop_banner(kept: list[str]) -> None:
    first = next((i for i, line in enumerate(kept) if line.strip()), None)
    if first is None:
        return
    end = next((i for i in range(first, len(kept)) if not kept[i].strip()), len(kept))
    paragraph = "\n".join(kept[first:end])
    if (end - first <= _BANNER_LINES and len(paragraph) <= _BANNER_CHARS
            and _BANNER.search(paragraph)):
        del kept[:end]


# A confidentiality notice below the message: a paragraph that opens like one and says both
# that the mail is confidential and whom it is for.  Within the last _NOTICE_CHARS.
_NOTICE_OPENING = re.compile(
    r"^\W{0,5}(confidentiality( notice)?|disclaimer|notice|privileged|this (e-?mail|message|"
    r"communication|transmission)|the (information|contents?) (contained )?in this|any "
    r"(views|opinions))\b", re.I)
_NOTICE_CONFIDENTIAL = re.compile(r"confidential|privileged", re.I)
_NOTICE_ADDRESSEE = re.compile(r"intended (solely |only )?(for|recipient)|addressee|in error|"
                               r"named above", re.I)
_NOTICE_CHARS = 2000
# What may stand above a notice as its heading: "E-MAIL DISCLAIMER", a rule.
_NOTICE_HEADING = re.compile(r"^\W*((e-?mail )?(disclaimer|confidentiality( notice)?|legal "
                             r"notice)\W*|[=_*-]{8,}[ \t]*)$", re.I)


def _disclaimer_start(lines: list[str]) -> int | None:
    """Where a confidentiality notice at the end of ``lines`` begins (its first paragraph
    within reach of the end), or None."""
    chars = 0
    found = None
    for j in range(len(lines) - 1, -1, -1):
        chars += len(lines[j]) + 1
        if chars > _NOTICE_CHARS:
            break
        starts_paragraph = j == 0 or not lines[j - 1].strip()
        if starts_paragraph and _NOTICE_OPENING.match(lines[j]):
            end = next((i for i in range(j, len(lines)) if not lines[i].strip()), len(lines))
            paragraph = " ".join(lines[j:end])
            if _NOTICE_CONFIDENTIAL.search(paragraph) and _NOTICE_ADDRESSEE.search(paragraph):
                found = j
    while found and (above := _previous_nonblank(lines, found)) is not None \
            and _NOTICE_HEADING.match(lines[above]):
        found = above
    return found


def _previous_nonblank(lines: list[str], start: int) -> int | None:
    return next((j for j in range(start - 1, -1, -1) if lines[j].strip()), None)


# What a list server or a notification sender appends below the message: a separator (a rule
# of underscores or dashes, GitHub's lone dash, groups.io's -=-=-), then a few lines on how to
# leave the list or where the message came from, or an ad: a sponsor's stacked on it ("This
# SF.net email is sponsored by"), a free-mail provider's.  Yahoo Groups' and Bugzilla's own
# lines need no separator.
_FOOTER_SEPARATOR = re.compile(r"^[ \t]*(_{8,}|-{8,}|(-=){4,}-?|[\u2014\u2013])[ \t]*$")
_FOOTER_HEAD = re.compile(
    r"^[ \t]*(-{8,} ?Yahoo! Groups Sponsor ?-+~?-->|To unsubscribe from this group\b|"
    r"-{3,} You are receiving this mail because: -{3,}$)", re.I)
_FOOTER_WORDS = re.compile(
    r"mailing list|maillist|/listinfo\b|/mailman/|unsubscribe|Yahoo! Groups|Groups\.io Links|"
    r"view it on GitHub|You are receiving this because|\bemail is sponsored by\b|"
    r"Do You Yahoo!\?|try MSN Messenger|with MSN Hotmail|MSN Explorer download", re.I)
# Some lists append only the address of their info page (Mailman's listinfo).
_LIST_INFO_URL = re.compile(r"^[ \t]*<?https?://\S+/listinfo/\S*[ \t]*$")
# A footer is short: more text below a separator is the message's own.
_FOOTER_LINES = 10
_FOOTER_CHARS = 800


def _footer_start(lines: list[str]) -> int | None:
    """Where a list or notification footer at the end of ``lines`` begins: the lowest
    separator with footer words below it (the rule above a table is not one), or None."""
    if lines and _LIST_INFO_URL.match(lines[-1]):
        return len(lines) - 1
    below = chars = 0
    for j in range(len(lines) - 1, -1, -1):
        if _FOOTER_HEAD.match(lines[j]):
            return j
        if _FOOTER_SEPARATOR.match(lines[j]) and any(
                _FOOTER_WORDS.search(line) for line in lines[j + 1:]):
            return j
        below += bool(lines[j].strip())
        chars += len(lines[j])
        if below > _FOOTER_LINES or chars > _FOOTER_CHARS:
            return None
    return None


def _ends_new_content(lines: list[str], i: int, forward: bool) -> bool:
    line = lines[i]
    # Every end below needs "--" (a signature, "-----Original Message-----"), "________" (a
    # rule) or a colon (a "From:" line): most lines have none, and five regexes on every line
    # of every new message's body were a good part of the mirror's parse at index time.  A
    # line with only a colon (a link's "https:") can be only the From line of a header block.
    if "--" not in line and "__" not in line:
        return not forward and ":" in line and _is_reply_header_block(lines, i)
    if _SIG_STRICT.match(line):
        return True
    if _SIG_LOOSE.match(line):  # "--" without its space: only if what follows is short
        rest = [x for x in lines[i + 1 :] if x.strip() and not _QUOTED.match(x)]
        return len(rest) <= 10
    if forward:  # the forwarded message's own header block and separator are its content
        return False
    if _ORIGINAL_MESSAGE.match(line):
        return True
    if _RULE.match(line):
        following = _next_nonblank(lines, i + 1)
        return following is not None and _is_reply_header_block(lines, following)
    return _is_reply_header_block(lines, i)


def _is_reply_header_block(lines: list[str], i: int) -> bool:
    """Outlook's "From: … Sent: … To: … Subject: …" block — unless it introduces a forward.
    All of its shape is asked for (a From line, then a Sent or Date line and a To, Cc or
    Subject line close below), or a how-to that says "From: must match …" would end the
    new content."""
    if not _FROM_FIELD.match(lines[i]):
        return False
    block = lines[i + 1 : i + 6]
    if not any(_SENT_FIELD.match(x) for x in block):
        return False
    if not any(_TO_OR_SUBJECT_FIELD.match(x) for x in block):
        return False
    before = [x for x in lines[max(0, i - 3) : i] if x.strip()]
    return not any(_FORWARD_MARK.search(x) for x in before)


# How far below a signature delimiter the forwarded message may begin.
_SIGNATURE_LINES = 20


def _forwarded_block(lines: list[str], start: int) -> int | None:
    """Where a forwarded message begins within a signature's length of ``start``: a
    separator line ("---------- Forwarded message ---------", "Begin forwarded message:",
    "-----Original Message-----"), or Outlook's rule above its header block."""
    for j in range(start, min(start + _SIGNATURE_LINES, len(lines))):
        line = lines[j].strip()
        if _FORWARD_MARK.search(line) and (line.startswith("-") or line.endswith(":")):
            return j
        if _ORIGINAL_MESSAGE.match(line):
            return j
        if _RULE.match(line):
            following = _next_nonblank(lines, j + 1)
            if following is not None and _FROM_FIELD.match(lines[following]):
                return j
    return None


def _attribution_end(lines: list[str], i: int) -> int | None:
    """Index of the last line of an "On … wrote:" attribution starting at ``i``, or None."""
    if _ATTRIBUTION_START.match(lines[i]):
        joined = lines[i]
        for j in range(i, min(i + 4, len(lines))):  # clients wrap long attributions
            if j > i:
                # A blank or quoted line is no part of one: past it, a new line that
                # begins "On" would be joined to the next attribution and go with it.
                if not lines[j].strip() or _QUOTED.match(lines[j]):
                    break
                joined += " " + lines[j]
            if _ATTRIBUTION.match(joined):
                return j
    # "Bob <b@x> wrote:" directly above a quote.  Only a line that ends in a colon can match:
    # the test first spares the search, which tries every word of every line (about a tenth
    # of the mirror's parse of a new message).
    if lines[i].rstrip("*_ \t").endswith(":") and _WROTE.search(lines[i]):
        following = _next_nonblank(lines, i + 1)
        if following is not None and _QUOTED.match(lines[following]):
            return i
    return None


def _next_nonblank(lines: list[str], start: int) -> int | None:
    for j in range(start, min(start + 3, len(lines))):
        if lines[j].strip():
            return j
    return None
