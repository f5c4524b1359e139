"""HTML to readable text with html2text: the full rendering the read tools show.

The only module that imports html2text (≈ 1.5 ms per KB of HTML), so the indexer, which
renders previews with ``text.preview_html_text``, never loads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser

import html2text
from html2text.utils import escape_md_section

from .hidden import HiddenElements, StyleSheet, hiding, is_void, style_sheet, text_chars
from .mime import BodyText, HtmlText, ParsedMessage, parse_body, parse_message
from .text import QUOTE_MARK_ESCAPE

__all__ = ["html_to_text", "read_body", "read_message"]


# html2text indents every level of a list or quote, so text grows with the nesting squared: a
# 190 KB mail of 10,000 nested lists became 100 M characters in 33 s (and held the reads).
# Levels past this one are read as this one.
MAX_NESTING = 20
_NESTING_TAG = re.compile(r"<\s*(/?)\s*(ul|ol|dl|menu|blockquote)\b[^>]*>", re.IGNORECASE)


def _flattened(html: str) -> str:
    """``html`` without the list and quote tags nested deeper than MAX_NESTING."""
    depth = 0

    def keep(match: re.Match[str]) -> str:
        nonlocal depth
        if match.group(1):  # a closing tag
            depth = max(0, depth - 1)
            return match.group(0) if depth < MAX_NESTING else ""
        depth += 1
        return match.group(0) if depth <= MAX_NESTING else ""
    return _NESTING_TAG.sub(keep, html)


# html2text writes a <blockquote> line and a paragraph that begins with a literal "&gt;" alike,
# as "> ...", and clean_text would drop the paragraph as quoted history. So every ">" of the
# text goes through html2text as this stand-in: a control character, which the input cannot
# hold (it is removed first, as ``tidy`` would remove it anyway).
_TEXT_GT = "\x1a"
# The stand-in at the start of a line, after html2text's own "> " blockquote marks.
_LEADING_TEXT_GT = re.compile(f"^((?:> ?)*[ \t]*){_TEXT_GT}", re.M)


# The elements whose content html2text leaves out, by a counter of them open; and <title>,
# which html2text leaves out only inside <head>, while browsers never show it in the page.
_HIDING = ("head", "style", "script", "title")
# What a <head> holds: any other element starts the body, as browsers read it (a <head>
# left open, then the message's <div>s, with no <body> tag anywhere).
_HEAD_CONTENT = frozenset({"title", "meta", "link", "base", "style", "script", "noscript",
                           "template", "head", "html"})
_TABLE_TAGS = frozenset({"table", "tr", "td", "th"})
# The roles that mark a table as layout, not data (WAI-ARIA): modern mail sets one on every
# table it lays its columns out with.
_LAYOUT_ROLES = frozenset({"presentation", "none"})


# --------------------------------------------------------------------------------------------
# Layout or data: a table's shape, read before html2text renders it


# Blocks of which a data cell holds one, or one in another (Outlook puts each cell's text in a
# <p>): of two in turn html2text writes one line, "Hi Sam,Your password was changed.", so a
# cell that holds them is a column of the layout.
_BLOCKS = frozenset({"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "blockquote",
                     "pre"})


@dataclass
class _TableShape:
    """What a table holds, so far as it is read."""

    start: tuple[int, int]  # where its tag starts, as ``HTMLParser.getpos`` says
    rows_of_cells: int = 0  # rows of two cells or more, but for the one open
    rows_of_one: int = 0  # rows of a single cell (a banner, a heading), but for the one open
    cells: int = 0  # in the row open
    block_ended: bool = False  # in the cell open
    has_layout: bool = False  # a table inside, or blocks in turn: what no data table holds

    def end_row(self) -> None:
        self.rows_of_cells += self.cells >= 2
        self.rows_of_one += self.cells == 1
        self.cells = 0

    def is_layout(self) -> bool:
        """Whether the table, its rows ended, lays content out: a data table has rows, two or
        more and most of them, of two cells or more, a word or a paragraph each. Read as rows,
        a table of one row, or of one cell to a row, is "---" and "|" debris."""
        return (self.has_layout or self.rows_of_cells < 2
                or self.rows_of_one > self.rows_of_cells)


_TABLE_START = re.compile("<table", re.I)


def _layout_table_starts(html: str) -> set[tuple[int, int]]:
    """Where the tables of ``html`` start that lay out its content rather than hold data
    (see ``_TableShape.is_layout``), as (line, column) of ``HTMLParser.getpos``.  In one pass
    over its tags: a table's shape decides how to render it, from its start tag on."""
    if not _TABLE_START.search(html):  # no table: no second parse of the whole body
        return set()
    shapes = _TableShapes()
    shapes.feed(html)
    shapes.close()
    return shapes.layout


class _TableShapes(HTMLParser):
    """The shapes of a document's tables, read by the parser html2text reads it with: what
    is a tag (not a comment, nor text of a <style> or <script>) and where each starts are
    then the same for both, whatever this Python's parser takes for either."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)  # as html2text's
        self.layout: set[tuple[int, int]] = set()
        self._open_tables: list[_TableShape] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._read(tag, closing=False)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._read(tag, closing=False)
        self._read(tag, closing=True)  # as _Converter closes it, where it is not hidden

    def handle_endtag(self, tag: str) -> None:
        self._read(tag, closing=True)

    def _read(self, tag: str, *, closing: bool) -> None:
        if tag in _TABLE_TAGS or tag in _BLOCKS:
            _read_table_tag(tag, closing, self.getpos(), self._open_tables, self.layout)

    def close(self) -> None:
        super().close()
        for table in self._open_tables:  # never closed: as far as it goes
            table.end_row()
            if table.is_layout():
                self.layout.add(table.start)


def _read_table_tag(name: str, closing: bool, where: tuple[int, int],
                    open_tables: list[_TableShape], layout: set[tuple[int, int]]) -> None:
    """Take the tag ``name`` at ``where`` into the shape of the innermost table open."""
    table = open_tables[-1] if open_tables else None
    if name == "table" and not closing:
        if table:
            table.has_layout = True
        open_tables.append(_TableShape(where))
    elif table is None:
        return  # a cell or closing tag outside any table: no table's shape
    elif name == "table":
        open_tables.pop()
        table.end_row()
        if table.is_layout():
            layout.add(table.start)
    elif name == "tr":
        table.end_row()
    elif name in ("td", "th"):
        if not closing:
            table.cells += 1
            table.block_ended = False
    elif closing:
        table.block_ended = True
    else:
        table.has_layout = table.has_layout or table.block_ended


class _Converter(html2text.HTML2Text):
    """html2text, with its hidden-content counter kept as a browser keeps those elements
    open: a closing tag that closes nothing (``</SCRIPT>`` first thing in a body) drove the
    counter below zero, and a ``<head>`` after ``<body>`` (a ZDNet newsletter's) opened one
    that never closed; either hid the whole rest of the message, as did a <head> left open
    before the content with no <body> tag.  And the text between two tags goes to html2text
    as one piece: it takes each entity for a new piece, and one after emphasis for text
    following it, which it spaces off ("<em>caf&eacute;</em>" read "caf é").  Elements the
    sender hides (see ``hidden``) go unshown, tags and all, their text only counted -- and a
    link around nothing else, its address and title too: a reader sees no link there.
    A layout table (see _LAYOUT_ROLES and ``_layout_table_starts``) reads as blocks, a line to each
    cell: as Markdown rows, its cells' paragraphs ran into one line between "| |" and "---"
    debris."""

    def __init__(self, sheet: StyleSheet, layout_starts: set[tuple[int, int]]) -> None:
        super().__init__()
        self._sheet = sheet  # the document's style sheets
        self._layout_starts = layout_starts  # see ``_layout_table_starts``
        self._hiding: dict[str, int] = dict.fromkeys(_HIDING, 0)
        self._in_body = False
        self._text: list[str] = []  # the text since the last tag, escaped as html2text would
        self._hidden = HiddenElements()
        self.hidden_chars = 0  # of text the sender hid (see hidden.text_chars)
        # Whether the link open, of which nothing is shown yet, holds hidden content.
        self._link_hides = False
        self._layout_tables: list[bool] = []  # of each table open, whether it is for layout
        self._spanned = 0  # the empty cells the data cell open spans beyond itself

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # Of an attribute given twice the first counts, as in a browser: a second style must
        # not undo the "display:none" of the first.
        self.handle_tag(tag, dict(reversed(attrs)), start=True)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        # "<div/>" opens a <div> in a browser: only a void element is closed by its "/".
        # Kept open only where hidden, so that html2text renders visible markup as before.
        if is_void(tag) or not self._hidden.hiding:
            self.handle_endtag(tag)

    def handle_tag(self, tag: str, attrs: dict[str, str | None], start: bool) -> None:
        self._flush_text(hold_blank=True)
        if (self._hidden.start(tag, hiding(attrs, tag, self._sheet)) if start
                else self._hidden.end(tag)):
            self._link_hides = self._link_hides or self._in_empty_link()
            return  # a hidden image's alt text or link shows nothing either
        if tag == "a" and not start and self._link_hides and self._in_empty_link():
            self.astack.pop()  # what html2text would write at its end: "[](url)"
            self.maybe_automatic_link = None
            self.empty_link = False
            return
        if tag == "a" and start:
            self._link_hides = False
        self._flush_text()
        if tag == "body":  # html2text shows everything from here: nothing is open any more
            self._in_body = True
            self._hiding = dict.fromkeys(_HIDING, 0)
        elif start and self._hiding["head"] and tag not in _HEAD_CONTENT:
            self.handle_tag("body", {}, True)  # the head ends where its content does
        if tag in self._hiding:
            if start and tag == "head" and self._in_body:
                return  # a <head> inside the body: browsers ignore it
            if not start and not self._hiding[tag]:
                return  # closes nothing: ignored, as browsers do
            self._hiding[tag] += 1 if start else -1
            if tag == "title":  # html2text's counter, which it does not move for <title>
                self.quiet += 1 if start else -1
                return
        if tag in _TABLE_TAGS:
            self._handle_table_tag(tag, attrs, start)
            return
        if tag == "img" and start:
            if _is_pixel(attrs):  # shows nothing: nor does a link around it alone
                self._link_hides = self._link_hides or self._in_empty_link()
                return
            if not (attrs.get("alt") or "").strip() and attrs.get("title"):
                attrs = {**attrs, "alt": attrs["title"]}  # its name, where alt gives none
        super().handle_tag(tag, attrs, start)

    def _handle_table_tag(self, tag: str, attrs: dict[str, str | None], start: bool) -> None:
        """html2text's table markup for a data table; for a layout table, its own reading
        of tables as text ("ignore_tables"), with each cell on a line of its own."""
        if tag == "table" and start:
            role = (attrs.get("role") or "").strip().lower()
            self._layout_tables.append(role in _LAYOUT_ROLES
                                       or self.getpos() in self._layout_starts)
        layout = bool(self._layout_tables) and self._layout_tables[-1]
        if tag == "table" and not start and self._layout_tables:
            self._layout_tables.pop()
        self.ignore_tables = layout
        if layout and start and tag in ("td", "th"):
            self.soft_br()
        if not layout and (start or tag in ("tr", "table")):  # the spanning cell ended
            self._end_spanned_cells(followed=start and tag in ("td", "th"))
        super().handle_tag(tag, attrs, start)
        if not layout and start and tag in ("td", "th"):
            self._spanned = _colspan(attrs) - 1

    def _end_spanned_cells(self, followed: bool) -> None:
        """Write the empty cells a data cell's colspan spans, after its own (html2text
        reads no colspan): a total below a price, not below a count.  Only where a cell of
        its row ``followed`` or in the header row, whose cells count the columns: Markdown
        fills a short row, and a receipt's rules, a row of one empty cell, read "| |"."""
        if followed or self.table_start:
            for _ in range(self._spanned):
                super().handle_tag("td", {}, True)
        self._spanned = 0

    def handle_data(self, data: str, entity_char: bool = False) -> None:
        if self._hidden.hiding:
            if not any(map(self._hidden.is_open, _HIDING)):  # CSS or a script: never text
                self.hidden_chars += text_chars(_visible(data))
            self._link_hides = self._link_hides or self._in_empty_link()
            return
        data = data.replace(">", _TEXT_GT)
        if not (entity_char or self.code or self.pre):  # html2text leaves entities as they are
            data = escape_md_section(data, snob=self.escape_snob)
        self._text.append(data)

    def close(self) -> None:
        super().close()
        self._flush_text()

    def _flush_text(self, hold_blank: bool = False) -> None:
        """Give html2text the text since the last tag; with ``hold_blank``, white space alone
        in a link that shows nothing yet waits: the link may go, the space stays."""
        if not self._text:
            return
        text = "".join(self._text)
        if hold_blank and self._in_empty_link() and not text_chars(_visible(text)):
            return
        self._text = []
        super().handle_data(text, entity_char=True)  # escaped already

    def _in_empty_link(self) -> bool:
        """Whether a link is open that html2text has written nothing of yet."""
        return self.empty_link and self.maybe_automatic_link is not None


_PIXEL_SIZE = re.compile(r"\s*[01](\.0*)?\s*(px)?\s*", re.I)


def _is_pixel(attrs: dict[str, str | None]) -> bool:
    """Whether an <img> is a pixel wide or high, or none: a tracking pixel."""
    return any(_PIXEL_SIZE.fullmatch(attrs.get(side) or "x") for side in ("width", "height"))


# Beyond this a cell spans no more columns: a colspan of 1000 (HTML's most) in every cell
# would write kilobytes of "| " for each.
MAX_COLSPAN = 32
# Leading zeros skipped, nine digits at most read: Python refuses to read a number of more
# than 4,300 digits (the whole conversion failed), and one of nine is past the cap anyway.
_LEADING_NUMBER = re.compile(r"\s*0*(\d{1,9})")


def _colspan(attrs: dict[str, str | None]) -> int:
    """How many columns a cell spans, as a browser reads its colspan (1 for what is no
    number), up to MAX_COLSPAN."""
    digits = _LEADING_NUMBER.match(attrs.get("colspan") or "")
    return min(max(int(digits.group(1)), 1), MAX_COLSPAN) if digits else 1


def _visible(text: str) -> str:
    """``text`` with html2text's stand-in for "&nbsp;", which it writes until its output is
    done, a space again."""
    return text.replace(html2text.config.UNIFIABLE["nbsp"], " ")


def _restore_text_gt(text: str) -> str:
    text = _LEADING_TEXT_GT.sub(lambda m: m.group(1) + QUOTE_MARK_ESCAPE, text)
    return text.replace(_TEXT_GT, ">")


def html_to_text(html: str) -> HtmlText:
    """HTML as Markdown-ish text, without what it hides; an ``HtmlRenderer`` (``mime.html_text``
    tidies the result). Only <blockquote> content comes out ``>``-quoted."""
    source = _flattened(_unclosable_lt_escaped(html.replace(_TEXT_GT, "")))
    converter = _Converter(style_sheet(html), _layout_table_starts(source))
    converter.body_width = 0  # no hard wrapping: the reader wraps, and wrapping breaks URLs
    converter.images_to_alt = True  # tracking pixels vanish, meaningful alt text stays
    converter.unicode_snob = True  # keep “quotes” and é instead of ASCII approximations
    converter.inline_links = True  # [text](url), which every LLM reads
    # html2text drops <script>, <style> and <head> contents and renders tables as
    # Markdown rows, which reads well for data tables: layout tables read as blocks.
    text = converter.handle(source)
    return HtmlText(_restore_text_gt(text), converter.hidden_chars)


def _unclosable_lt_escaped(html: str) -> str:
    """``html`` with each ``<`` after its last ``>`` written ``&lt;``, text as the parser
    reads it anyway: no tag can start there, and Python's parser looked for one's end from
    each of them -- quadratic, minutes on 200 KB of ``if a<b`` code in an HTML part."""
    last = html.rfind(">")
    if "<" not in html[last + 1:]:
        return html
    return html[:last + 1] + html[last + 1:].replace("<", "&lt;")


def read_message(raw: bytes) -> ParsedMessage:
    """``mime.parse_message`` with HTML rendered by html2text: what get_email shows."""
    return parse_message(raw, html_to_text)


def read_body(raw: bytes) -> BodyText:
    """``mime.parse_body`` with HTML rendered by html2text: what get_thread shows."""
    return parse_body(raw, html_to_text)
