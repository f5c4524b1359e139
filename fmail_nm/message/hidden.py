"""What an HTML mail hides from its reader: elements a mail client never displays.

Senders hide text in HTML that the reader never sees -- a newsletter's "preheader" (the
subject again, padded with ``&zwnj;&nbsp;``), or an instruction to an assistant in white on
white -- with an inline style (``display:none``, ``visibility:hidden``, a zero font size,
opacity or box with its overflow hidden, a colour the same as the background or none) or the
``hidden`` attribute.  ``HiddenElements`` follows the open elements as a browser nests them,
from the parser's tag events, and says when text is hidden: the hidden element's content with
it, until the element closes -- explicitly, by the close of an element around it, or
implicitly as HTML closes a ``<p>`` or ``<li>``.  Void elements never open anything.  An
element never closed hides the rest of its parent, as in a browser.  Where a browser would
show text after all, so does this: an inherited property (font size, visibility, colour) set
again inside the element that hid by it shows its text -- a fluid layout zeroes the font size
between its columns and sizes each column's text -- and Outlook's ``mso-hide:all`` hides
nothing, as every other client shows that element (often a button Outlook draws itself).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import NamedTuple

__all__ = ["HiddenElements", "Hiding", "hiding", "is_void", "text_chars"]


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


def hiding(attrs: Mapping[str, str | None]) -> Hiding:
    """What an element with these (entity-decoded) attributes hides."""
    if "hidden" in attrs:
        return Hiding(removes=True)
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
_IMPORTANT = re.compile(r"\s*!\s*important\s*$")
# A CSS identifier: a declaration named anything else ("<!--display") is dropped by browsers.
_PROPERTY = re.compile(r"-?[a-z_][a-z0-9_-]*")
_ZERO = re.compile(r"[+-]?0*\.?0+(?:px|pt|pc|em|rem|ex|ch|vw|vh|vmin|vmax|cm|mm|in|q|%)?")
_ZERO_BOXES = ("height", "max-height", "width", "max-width")


def _declarations(style: str) -> dict[str, str]:
    """An inline style's declarations, lower-cased, by property; the last one wins."""
    found: dict[str, str] = {}
    css = _CSS_COMMENT.sub("", style)
    if "\\" in css:
        css = _CSS_ESCAPE.sub(_unescaped, css)
    for declaration in css.lower().split(";"):
        name, colon, value = declaration.partition(":")
        name = name.strip()
        if colon and _PROPERTY.fullmatch(name):
            found[name] = _IMPORTANT.sub("", value).strip()
    return found


# CSS escapes ("d\\69splay" is "display"): a hex code point and the white space ending it, or a
# character as itself.
_CSS_ESCAPE = re.compile(r"\\(?:([0-9a-fA-F]{1,6})[ \t\n]?|(.))", re.S)


def _unescaped(match: re.Match[str]) -> str:
    if match.group(1) is None:
        return match.group(2)
    code = int(match.group(1), 16)
    return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"


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
_FONT_SIZE = re.compile(r"(?:^|\s)(0|[+-]?\d*\.?\d+(?:[a-z]+|%))(?:\s*/\s*\S+)?\s+\S")
# A size of the parent's: of a zero font size, zero again.
_RELATIVE_SIZE = re.compile(r"[+-]?\d*\.?\d+(?:em|ex|ch|%)|smaller|larger|inherit")


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
_NO_ALPHA = re.compile(r"rgba\((?:\s*[\d.]+%?\s*,){3}\s*0*\.?0+\s*\)")


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
