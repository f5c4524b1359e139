"""What an HTML mail hides from its reader: elements a mail client never displays.

Senders hide text in HTML that the reader never sees -- a newsletter's "preheader" (the
subject again, padded with ``&zwnj;&nbsp;``), or an instruction to an assistant in white on
white -- with an inline style (``display:none``, ``visibility:hidden``, a zero font size,
opacity or box with its overflow hidden, a colour the same as the background or none), the
``hidden`` attribute, or the same in the rules of a ``<style>`` element (``StyleSheet``), read
only where they are sure to apply: a rule for some screens only (``@media``) or with a selector
more complex than a tag, classes and an id is left unread, as showing hidden text costs less
than losing text a reader sees.  A ``<template>`` is never shown.  ``HiddenElements`` follows
the open elements as a browser nests them, from the parser's tag events, and says when text is
hidden: the hidden element's content with it, until the element closes -- explicitly, by the
close of an element around it, or implicitly as HTML closes a ``<p>`` or ``<li>``.  Void
elements never open anything.  An element never closed hides the rest of its parent, as in a
browser.  Where a browser would show text after all, so does this: an inherited property
(font size, visibility, colour) set again inside the element that hid by it shows its text --
a fluid layout zeroes the font size between its columns and sizes each column's text -- and
Outlook's ``mso-hide:all`` hides nothing, as every other client shows that element (often a
button Outlook draws itself).
``without_hidden_elements`` does the same for the indexer's previews, from the tags a regular
expression finds rather than from a parser.
"""

from __future__ import annotations

import functools
import html as html_lib
import re
from collections.abc import Mapping
from typing import NamedTuple

__all__ = ["HiddenElements", "Hiding", "StyleSheet", "hiding", "is_void", "style_sheet",
           "text_chars", "without_hidden_elements"]


# Elements with no content and no closing tag: "<br>" or "<img ...>" opens nothing.
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                   "param", "source", "track", "wbr", "basefont", "bgsound", "frame", "keygen"})

# Start tags that close an open element implicitly (HTML's "optional end tags"), with the
# elements past which the search for it stops: a <div> in a cell does not close a <p> that
# holds the table.
_CLOSES_P = frozenset({
    "address", "article", "aside", "blockquote", "center", "details", "dialog", "dir", "div",
    "dl", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5",
    "h6", "header", "hgroup", "hr", "main", "menu", "nav", "ol", "p", "pre", "section",
    "summary", "table", "ul", "li", "dd", "dt"})
_SCOPE = ("table", "td", "th", "caption", "html", "button", "object", "template")
_IMPLIED_CLOSE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    **{tag: (("p",), _SCOPE) for tag in _CLOSES_P},
    "li": (("li", "p"), (*_SCOPE, "ul", "ol")),
    "dd": (("dd", "dt", "p"), (*_SCOPE, "dl")),
    "dt": (("dd", "dt", "p"), (*_SCOPE, "dl")),
    "td": (("td", "th"), ("table", "tr")),
    "th": (("td", "th"), ("table", "tr")),
    "tr": (("tr", "td", "th"), ("table",)),
    "option": (("option",), ("select",)),
}


def text_chars(text: str) -> int:
    """The characters of ``text`` but white space: how hidden text is counted."""
    return len("".join(text.split()))


def is_void(tag: str) -> bool:
    """Whether ``tag`` is a void element: it has no content, whatever follows it."""
    return tag in _VOID


class Hiding(NamedTuple):
    """What an element's attributes hide: the element and all it holds (``removes``), or
    its text by inherited properties (``conceals``) that an element inside may set again
    (``reveals``): "font-size" and "color" hide only text, "visibility" images too."""

    removes: bool = False
    conceals: frozenset[str] = frozenset()
    reveals: frozenset[str] = frozenset()


class HiddenElements:
    """The open elements of one HTML document, fed its tags in order, and whether the text
    at this point is hidden (``hiding``)."""

    def __init__(self) -> None:
        self._open: list[str] = []
        # The inherited properties hiding the text of each element in _open.
        self._concealed: list[frozenset[str]] = []
        # Where in _open each tag is open, innermost last: so that no tag costs a search of
        # every open element (hostile markup nests thousands).
        self._depths: dict[str, list[int]] = {}
        self._hidden_at: int | None = None  # where in _open the outermost removed element is

    @property
    def hiding(self) -> bool:
        return self._hidden_at is not None or bool(self._concealed and self._concealed[-1])

    def is_open(self, tag: str) -> bool:
        return bool(self._depths.get(tag))

    def start(self, tag: str, hiding: Hiding) -> bool:
        """Open ``tag`` (a void one opens nothing), which hides what ``hiding`` says; whether
        the tag is hidden (an image in it, a link)."""
        self._close_implied(tag)
        removed = self._hidden_at is not None or hiding.removes
        concealed = (self._concealed[-1] if self._concealed else frozenset())
        concealed = (concealed - hiding.reveals) | hiding.conceals
        if tag not in _VOID:
            if removed and self._hidden_at is None:
                self._hidden_at = len(self._open)
            self._depths.setdefault(tag, []).append(len(self._open))
            self._open.append(tag)
            self._concealed.append(concealed)
        return removed or "visibility" in concealed

    def end(self, tag: str) -> bool:
        """Close ``tag`` and what it holds; one not open is ignored, as browsers ignore it.
        Whether the tag is hidden: a visible element's end is shown though it closes a
        hidden one inside it."""
        if not (depths := self._depths.get(tag)):
            return self.hiding
        depth = depths[-1]
        hidden = ((self._hidden_at is not None and depth >= self._hidden_at)
                  or "visibility" in self._concealed[depth])
        self._pop_to(depth)
        return hidden

    def _close_implied(self, tag: str) -> None:
        if (rule := _IMPLIED_CLOSE.get(tag)) is None:
            return
        closes, scope = rule
        innermost = self._innermost(closes)
        if innermost >= 0 and innermost > self._innermost(scope):
            self._pop_to(innermost)

    def _innermost(self, tags: tuple[str, ...]) -> int:
        return max((depths[-1] for tag in tags if (depths := self._depths.get(tag))),
                   default=-1)

    def _pop_to(self, depth: int) -> None:
        for tag in self._open[depth:]:
            self._depths[tag].pop()
        del self._open[depth:]
        del self._concealed[depth:]
        if self._hidden_at is not None and self._hidden_at >= depth:
            self._hidden_at = None


def hiding(attrs: Mapping[str, str | None], tag: str = "",
           sheet: StyleSheet | None = None) -> Hiding:
    """What a ``tag`` element with these (entity-decoded) attributes hides, in a document
    styled by ``sheet``."""
    if "hidden" in attrs or tag == "template":
        return Hiding(removes=True)
    if sheet is not None and (rules := sheet.matching(tag, attrs)):
        return _css_hiding(_cascaded(rules, _declaration_list(attrs.get("style") or "")))
    if not (style := attrs.get("style")):
        return Hiding()
    if len(style) > _CACHED_STYLE_CHARS:  # the cache must not hold a hostile mail's megabytes
        return _css_hiding(_declarations(style))
    return _style_hiding(style)


_CACHED_STYLE_CHARS = 1000


@functools.lru_cache(maxsize=1024)  # a newsletter repeats a few styles on thousands of tags
def _style_hiding(style: str) -> Hiding:
    return _css_hiding(_declarations(style))


_CSS_COMMENT = re.compile(r"/\*.*?(?:\*/|$)", re.S)
# A CSS identifier: a declaration named anything else ("<!--display") is dropped by browsers.
_PROPERTY = re.compile(r"-?[a-z_][a-z0-9_-]*")
# A number, and a zero, each read one way only (possessive): a value of thousands of digits
# costs no backtracking through them, from each of them.
_NUMBER = r"(?:\d++(?:\.\d++)?|\.\d++)"
_ZERO_NUMBER = r"(?:0++(?:\.0++)?|\.0++)"
_ZERO = re.compile(rf"[+-]?{_ZERO_NUMBER}(?:px|pt|pc|em|rem|ex|ch|vw|vh|vmin|vmax|cm|mm|in|q|%)?")
_ZERO_BOXES = ("height", "max-height", "width", "max-width")


class _Declaration(NamedTuple):
    name: str
    value: str
    important: bool


def _declarations(style: str) -> dict[str, str]:
    """An inline style's declarations, lower-cased, by property: the last one wins, an
    important one over all that are not."""
    return _cascaded([], _declaration_list(style))


def _declaration_list(css: str) -> list[_Declaration]:
    """The declarations of a style or a rule's block, lower-cased, in order."""
    found = []
    css = _CSS_COMMENT.sub("", css)
    if "\\" in css:
        css = _CSS_ESCAPE.sub(_unescaped, css)
    for declaration in css.lower().split(";"):
        name, colon, value = declaration.partition(":")
        name = name.strip()
        if colon and _PROPERTY.fullmatch(name):
            value, important = _importance(value)
            found.append(_Declaration(name, value.strip(), important))
    return found


def _importance(value: str) -> tuple[str, bool]:
    """A declaration's ``value`` without its "!important" (white space around the "!"), and
    whether it had one."""
    head, bang, tail = value.rpartition("!")
    return (head, True) if bang and tail.strip() == "important" else (value, False)


# CSS escapes ("d\\69splay" is "display"): a hex code point and the white space ending it, or a
# character as itself.
_CSS_ESCAPE = re.compile(r"\\(?:([0-9a-fA-F]{1,6})[ \t\n]?|(.))", re.S)


def _unescaped(match: re.Match[str]) -> str:
    if match.group(1) is None:
        return match.group(2)
    code = int(match.group(1), 16)
    return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"


def _cascaded(rules: list[_Rule], inline: list[_Declaration]) -> dict[str, str]:
    """Each property's value, as the cascade decides between the declarations of ``rules``
    and an ``inline`` style: an important one over all that are not, then the inline style's,
    then the rule whose selector is the more specific, then the later one."""
    ranked = [((found.important, False, rule.specificity, rule.order), found)
              for rule in rules for found in rule.declarations]
    ranked += [((found.important, True, (0, 0, 0), 0), found) for found in inline]
    values: dict[str, str] = {}
    for _, found in sorted(ranked, key=lambda pair: pair[0]):  # stable: of equals, the last
        values[found.name] = found.value
    return values


# The properties _css_hiding reads: a rule without any of them is of no matter here.
_HIDING_PROPERTIES = frozenset({
    "display", "visibility", "opacity", "overflow", *_ZERO_BOXES, "font-size", "font", "color",
    "background-color", "background", "background-image"})


def _css_hiding(css: dict[str, str]) -> Hiding:
    clipped = css.get("overflow") == "hidden" and any(
        _ZERO.fullmatch(css.get(name, "x")) for name in _ZERO_BOXES)
    inherited = {"font-size": _size_hides(css), "color": _colour_hides(css),
                 "visibility": {"hidden": True, "collapse": True, "visible": False}.get(
                     css.get("visibility", ""))}
    return Hiding(
        removes=(css.get("display") == "none" or clipped
                 or bool(_ZERO.fullmatch(css.get("opacity", "x")))),
        conceals=frozenset(name for name, hides in inherited.items() if hides),
        reveals=frozenset(name for name, hides in inherited.items() if hides is False))


# The size in the "font" shorthand ("bold 14px/20px Arial", "0/0 a"): one with a unit, or 0.
_FONT_SIZE = re.compile(rf"(?:^|\s)(0|[+-]?{_NUMBER}(?:[a-z]++|%))(?:\s*/\s*\S+)?\s+\S")
# A size of the parent's: of a zero font size, zero again.
_RELATIVE_SIZE = re.compile(rf"[+-]?{_NUMBER}(?:em|ex|ch|%)|smaller|larger|inherit")


def _size_hides(css: dict[str, str]) -> bool | None:
    """Whether the font size hides text (True), shows it (False) or is the parent's (None)."""
    size = css.get("font-size") or (
        (found := _FONT_SIZE.search(css.get("font", ""))) and found.group(1))
    if not size or _RELATIVE_SIZE.fullmatch(size):
        return None
    return bool(_ZERO.fullmatch(size))


def _colour_hides(css: dict[str, str]) -> bool | None:
    """Whether the colours hide text (True), show it (False: a colour or background of the
    element's own) or are the parent's (None)."""
    colours = [css.get(name) for name in ("color", "background-color", "background",
                                          "background-image")]
    if not any(colours):
        return None
    text, background = colours[0], colours[1] or colours[2]
    return bool(text) and (_colour(text or "") == "transparent" or (
        not colours[3] and _same_colour(text, background)))


_NAMED = {"white": "#ffffff", "black": "#000000"}
_SHORT_HEX = re.compile(r"#([0-9a-f])([0-9a-f])([0-9a-f])")
_RGB = re.compile(r"rgba?\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*1(?:\.0*)?\s*)?\)")
_NO_ALPHA = re.compile(rf"rgba\((?:\s*+[\d.]++%?\s*+,){{3}}\s*+{_ZERO_NUMBER}\s*+\)")


def _same_colour(text: str | None, background: str | None) -> bool:
    """Best effort: both the same colour, written as a name, #rgb, #rrggbb or rgb()."""
    if not text or not background:
        return False
    return _colour(text) is not None and _colour(text) == _colour(background)


def _colour(value: str) -> str | None:
    if value == "transparent" or _NO_ALPHA.fullmatch(value):
        return "transparent"
    value = _NAMED.get(value, value)
    if short := _SHORT_HEX.fullmatch(value):
        return "#" + "".join(digit * 2 for digit in short.groups())
    if rgb := _RGB.fullmatch(value):
        return "#" + "".join(f"{min(int(n), 255):02x}" for n in rgb.groups())
    return value if re.fullmatch(r"#[0-9a-f]{6}", value) else None


# --------------------------------------------------------------------------------------------
# Style sheets


class _Rule(NamedTuple):
    """A style sheet's rule for one simple selector: the tag (or "" for any), classes and id
    ("" for any) an element must have."""

    tag: str
    classes: frozenset[str]
    id: str
    specificity: tuple[int, int, int]
    order: int  # where in the document's style sheets
    declarations: tuple[_Declaration, ...]  # of the properties _css_hiding reads

    def matches(self, tag: str, classes: set[str], id_: str) -> bool:
        return (self.tag in ("", tag) and self.classes <= classes
                and self.id in ("", id_))


# What separates an element's classes: a no-break space is part of one.
_ASCII_SPACE = re.compile(r"[ \t\n\f\r]+")
# The rules for one id, class or tag a sheet may hold (see StyleSheet).
_MAX_RULES_A_NAME = 32


class StyleSheet:
    """The rules of a document's ``<style>`` elements that can hide an element or show it
    again, each found by the id, a class or the tag its selector asks for -- none, where more
    than _MAX_RULES_A_NAME are found by one."""

    def __init__(self, css: str = "") -> None:
        self._rules: dict[str, list[_Rule]] = {}  # by "#id", ".class" or tag
        self._hiding: list[_Rule] = []  # those that hide by their own declarations
        for rule in _rules(css):
            key = (f"#{rule.id}" if rule.id else f".{min(rule.classes)}" if rule.classes
                   else rule.tag)
            self._rules.setdefault(key, []).append(rule)
            own = _css_hiding(_cascaded([rule], []))
            if own.removes or own.conceals:
                self._hiding.append(rule)
        if any(len(rules) > _MAX_RULES_A_NAME for rules in self._rules.values()):
            # No newsletter's: each element of that name would go through them all (a hostile
            # mail's thousands, on as many elements).  Read as none: no rule that shows again
            # may be missed where one that hides is read.
            self._rules, self._hiding = {}, []

    def __bool__(self) -> bool:
        return bool(self._rules)

    def may_match(self, tag: str, attributes: str) -> bool:
        """Whether a rule may match a ``tag`` element with these attributes (the tag's text
        after its name, lower-cased): a quick test before they are read."""
        return bool(self._rules) and (
            tag in self._rules or "class" in attributes or "id" in attributes)

    def matching(self, tag: str, attrs: Mapping[str, str | None]) -> list[_Rule]:
        """The rules for a ``tag`` element with these attributes."""
        if not self._rules:
            return []
        classes = set(_ASCII_SPACE.split(attrs.get("class") or "")) - {""}
        id_ = attrs.get("id") or ""
        keys = [tag, *(f".{name}" for name in classes), *([f"#{id_}"] if id_ else [])]
        return [rule for key in keys for rule in self._rules.get(key, ())
                if rule.matches(tag, classes, id_)]

    def may_hide(self, html: str) -> bool:
        """Whether a rule that hides may match an element of ``html`` (its style sheets
        taken out): the names its selector asks for are all in it -- as its attributes are
        read, character references decoded ("&#112;re" is "pre")."""
        if self._hiding and "&" in html:
            html = html_lib.unescape(html)
        return any(
            (not rule.id or rule.id in html) and all(name in html for name in rule.classes)
            and (not rule.tag or re.search(rf"<{rule.tag}[\s/>]", html, re.I) is not None)
            for rule in self._hiding)


# A <style> element's attributes and content, or a comment: a style sheet in one is none.
# Either runs to the end of the document if not closed.
_STYLE_ELEMENT = re.compile(
    r"<!--.*?(?:-->|$)|<style\b([^<>]*)>(.*?)(?:(</style\s*>)|$)", re.I | re.S)
_MEDIA = re.compile(r"""(?<![\w-])media\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]*))""", re.I)


def style_sheet(html: str) -> StyleSheet:
    """The rules of the style sheets in ``html`` that apply on every screen: a ``<style>``
    for some media only (print, small screens) is left out, as is one never closed."""
    sheets = []
    for element in _STYLE_ELEMENT.finditer(html):
        if not element.group(3):
            continue
        media = _MEDIA.search(element.group(1))
        # The whole query: "screen and (max-width:600px)" is for small screens only.
        if media is None or "".join(media.groups("")).strip().lower() in ("all", "screen"):
            sheets.append(element.group(2))
    css = "\n".join(sheets)
    return StyleSheet(css) if len(css) > _CACHED_SHEET_CHARS else _cached_sheet(css)


_CACHED_SHEET_CHARS = 20_000


@functools.lru_cache(maxsize=64)  # a sender's newsletters, a message read again, share theirs
def _cached_sheet(css: str) -> StyleSheet:
    return StyleSheet(css)


# A selector of a tag, classes and an id: no combinator, attribute or pseudo-class.
_SIMPLE_SELECTOR = re.compile(r"([a-zA-Z][a-zA-Z0-9]*)?((?:[.#]-?[_a-zA-Z][\w-]*)*)")
_SELECTOR_PART = re.compile(r"[.#][^.#]+")
_BRACE = re.compile(r"[{}]")


def _rules(css: str) -> list[_Rule]:
    """The rules of ``css`` for simple selectors, with the declarations _css_hiding reads; a
    block in an at-rule (``@media``) is not read, nor a rule with blocks nested in it."""
    # "<!--" and "-->" around a style sheet (for browsers of the 1990s) are no part of it.
    css = _CSS_COMMENT.sub(" ", css).replace("<!--", " ").replace("-->", " ")
    rules: list[_Rule] = []
    pos = 0
    while (start := css.find("{", pos)) >= 0:
        end = _block_end(css, start)
        prelude = css[pos:start].rpartition(";")[2].strip()  # after "@import x;" or a stray ";"
        block = css[start + 1:end]
        pos = end + 1
        if prelude.startswith("@") or "{" in block or not (selectors := _selectors(prelude)):
            continue
        declarations = tuple(found for found in _declaration_list(block)
                             if found.name in _HIDING_PROPERTIES)
        if declarations:
            order = len(rules)
            rules += (_Rule(*selector, order=order, declarations=declarations)
                      for selector in selectors)
    return rules


def _block_end(css: str, start: int) -> int:
    """Where the block opened at ``start`` closes: its brace, or the end of ``css``."""
    depth = 0
    for brace in _BRACE.finditer(css, start):
        depth += 1 if brace.group() == "{" else -1
        if not depth:
            return brace.start()
    return len(css)


def _selectors(prelude: str) -> list[tuple[str, frozenset[str], str, tuple[int, int, int]]]:
    """The simple selectors of a selector list, as (tag, classes, id, specificity); the
    others are skipped -- and all, where a pseudo-class or an escape is among them: a client
    that does not know it drops the whole rule."""
    if ":" in prelude or "\\" in prelude:
        return []
    found = []
    for selector in prelude.split(","):
        simple = _SIMPLE_SELECTOR.fullmatch(selector.strip())
        if simple is None or not selector.strip():
            continue
        parts = _SELECTOR_PART.findall(simple.group(2))
        ids = {part[1:] for part in parts if part[0] == "#"}
        classes = frozenset(part[1:] for part in parts if part[0] == ".")
        if len(ids) > 1:
            continue  # matches nothing
        tag = (simple.group(1) or "").lower()
        class_parts = sum(part[0] == "." for part in parts)
        specificity = (len(parts) - class_parts, class_parts, int(bool(tag)))
        found.append((tag, classes, next(iter(ids), ""), specificity))
    return found


# A tag, its attribute values quoted or not: "<p style='x:\">\"'>" is one tag. Possessive, and
# a quoted value bounded, so that a quote left open costs no backtracking or quadratic time.
_TAG_PARTS = re.compile(
    r"""<(/?)([a-zA-Z][^\s/<>]*)((?:[^<>"']|"[^"]{0,2000}"|'[^']{0,2000}'|["'])*+)>""")
# The attributes ``hiding`` reads, and the start tag of the element it hides by name
# (found at its name).
_HIDING_WORDS = (("style", 0), ("hidden", 0), ("<template", 1))
_MAY_HIDE = re.compile(r"style|hidden|(?<=<)template", re.I)
_MAY_HIDE_WORDS = 64
_ATTRIBUTE = re.compile(r"""([^\s=/<>"']+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'=<>`]+)))?""")


def without_hidden_elements(html: str, sheet: StyleSheet) -> tuple[str, int]:
    """``html`` (its style sheets ``sheet``, taken out of it) without the elements it hides
    from its reader, and the characters of text they held -- as ``html.html_to_text`` reads
    them, from tags found by a regular expression rather than a parser: the indexer's
    previews (``text.preview_html_text``)."""
    # Most styled mail hides nothing: finding that out costs no element tracking, which is
    # what costs (the indexer reads every new HTML-only message this way).
    if not _may_hide(html, sheet):
        return html, 0
    elements = HiddenElements()
    kept: list[str] = []
    hidden_chars = pos = 0
    for tag in _TAG_PARTS.finditer(html):
        text = html[pos : tag.start()]
        if elements.hiding:
            hidden_chars += text_chars(html_lib.unescape(text))
        else:
            kept.append(text)
        closing, name, rest = tag.group(1), tag.group(2).lower(), tag.group(3)
        if closing:
            hidden = elements.end(name)
        else:
            hidden = elements.start(name, _tag_hiding(name, rest, sheet))
            if rest.endswith("/") and not elements.hiding:  # as the converter reads "<x/>"
                elements.end(name)
        if not hidden:  # by its name alone: later expressions take "<p title='>'>" apart
            kept.append(f"<{closing}{name}>")
        pos = tag.end()
    if elements.hiding:
        hidden_chars += text_chars(html_lib.unescape(html[pos:]))
    else:
        kept.append(html[pos:])
    return "".join(kept), hidden_chars


_SHOWN = Hiding()


def _may_hide_at(html: str) -> list[int]:
    """Where "style", "hidden" or "<template" is in ``html``, in any case: searched in a
    lower-cased copy (the case-blind expression costs five times as much), unless lowering
    changed its length."""
    lowered = html.lower()
    if len(lowered) != len(html):
        return [word.start() for word in _MAY_HIDE.finditer(html)]
    # Each word by ``str.find``, three times as fast as one expression for all: as no end of
    # one word begins another, the places found apart are those the expression finds.
    return sorted(at + skip for word, skip in _HIDING_WORDS for at in _places(lowered, word))


def _places(text: str, word: str) -> list[int]:
    """Where ``word`` is in ``text``, each place looked for after the last one's end."""
    found: list[int] = []
    at = text.find(word)
    while at >= 0:
        found.append(at)
        at = text.find(word, at + len(word))
    return found


def _may_hide(html: str, sheet: StyleSheet) -> bool:
    """Whether a start tag of ``html`` may hide something: a rule of its style ``sheet`` that
    hides may match it, a ``<template>`` opens, or one of the tags around the words "style"
    and "hidden" hides -- and where a word's place is unclear (a quote, "<" or ">" between it
    and the tag before it: a value holding "<" or ">"), it may.  So may mail with more of the
    words than _MAY_HIDE_WORDS: each looks back for its tag."""
    if sheet.may_hide(html):
        return True
    words = _may_hide_at(html)
    if len(words) > _MAY_HIDE_WORDS:
        return True
    for word in words:
        start = html.rfind("<", 0, word)
        if start < 0:
            continue  # text before the first tag
        tag = _TAG_PARTS.match(html, start)
        if tag is None:
            return True
        if tag.end() <= word:  # in the text after that tag, unless a quote says otherwise
            if any(mark in html[tag.end():word] for mark in "\"'<>"):
                return True
            continue
        hides = _tag_hiding(tag.group(2).lower(), tag.group(3))
        if not tag.group(1) and (hides.removes or hides.conceals):
            return True
    return False


def _tag_hiding(name: str, tag_rest: str, sheet: StyleSheet | None = None) -> Hiding:
    """What a ``name`` tag hides by its attributes, the text after its name, in a document
    styled by ``sheet``."""
    lowered = tag_rest.lower()
    if not ("style" in lowered or "hidden" in lowered or name == "template"
            or (sheet and sheet.may_match(name, lowered))):
        return _SHOWN
    attrs: dict[str, str | None] = {}
    for match in _ATTRIBUTE.finditer(tag_rest):
        value = next((value for value in match.group(2, 3, 4) if value is not None), "")
        attrs.setdefault(match.group(1).lower(), html_lib.unescape(value))  # the first counts
    return hiding(attrs, name, sheet)
