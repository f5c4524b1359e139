"""What an HTML mail hides from its reader: elements a mail client never displays.

Senders hide text in HTML that the reader never sees -- a newsletter's "preheader" (the
subject again, padded with ``&zwnj;&nbsp;``), or an instruction to an assistant in white on
white -- with an inline style (``display:none``, ``visibility:hidden``, a zero font size,
opacity or box with its overflow hidden, Outlook's ``mso-hide:all``, a colour the same as
the background) or the ``hidden`` attribute.  ``HiddenElements`` follows the open elements as
a browser nests them, from the parser's tag events, and says when text is hidden: the
hidden element's content with it, until the element closes -- explicitly, by the close of an
element around it, or implicitly as HTML closes a ``<p>`` or ``<li>``.  Void elements never
open anything.  An element never closed hides the rest of its parent, as in a browser.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

__all__ = ["HiddenElements", "hides", "is_void", "text_chars"]


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


class HiddenElements:
    """The open elements of one HTML document, fed its tags in order, and whether the text
    at this point is hidden (``hiding``)."""

    def __init__(self) -> None:
        self._open: list[str] = []
        # Where in _open each tag is open, innermost last: so that no tag costs a search of
        # every open element (hostile markup nests thousands).
        self._depths: dict[str, list[int]] = {}
        self._hidden_at: int | None = None  # where in _open the outermost hidden element is

    @property
    def hiding(self) -> bool:
        return self._hidden_at is not None

    def start(self, tag: str, hides_itself: bool) -> bool:
        """Open ``tag`` (a void one opens nothing), which ``hides_itself`` (see ``hides``) or
        not; whether the tag is hidden."""
        self._close_implied(tag)
        hidden = self.hiding or hides_itself
        if tag not in _VOID:
            if hidden and self._hidden_at is None:
                self._hidden_at = len(self._open)
            self._depths.setdefault(tag, []).append(len(self._open))
            self._open.append(tag)
        return hidden

    def end(self, tag: str) -> bool:
        """Close ``tag`` and what it holds; one not open is ignored, as browsers ignore it.
        Whether the tag is hidden: a visible element's end is shown though it closes a
        hidden one inside it."""
        if not (depths := self._depths.get(tag)):
            return self.hiding
        hidden = self._hidden_at is not None and depths[-1] >= self._hidden_at
        self._pop_to(depths[-1])
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
        if self._hidden_at is not None and self._hidden_at >= depth:
            self._hidden_at = None


def hides(attrs: Mapping[str, str | None]) -> bool:
    """Whether an element with these (entity-decoded) attributes is not displayed."""
    if "hidden" in attrs:
        return True
    style = attrs.get("style")
    return bool(style) and _style_hides(style or "")


@functools.lru_cache(maxsize=1024)  # a newsletter repeats a few styles on thousands of tags
def _style_hides(style: str) -> bool:
    return _css_hides(_declarations(style))


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


def _css_hides(css: dict[str, str]) -> bool:
    zero = [name for name in ("font-size", "opacity") if _ZERO.fullmatch(css.get(name, "x"))]
    clipped = css.get("overflow") == "hidden" and any(
        _ZERO.fullmatch(css.get(name, "x")) for name in _ZERO_BOXES)
    return (css.get("display") == "none" or css.get("visibility") in ("hidden", "collapse")
            or css.get("mso-hide") == "all" or bool(zero) or clipped
            or _same_colour(css.get("color"), css.get("background-color", css.get("background"))))


_NAMED = {"white": "#ffffff", "black": "#000000"}
_SHORT_HEX = re.compile(r"#([0-9a-f])([0-9a-f])([0-9a-f])")
_RGB = re.compile(r"rgba?\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*1(?:\.0*)?\s*)?\)")


def _same_colour(text: str | None, background: str | None) -> bool:
    """Best effort: both the same colour, written as a name, #rgb, #rrggbb or rgb()."""
    if not text or not background:
        return False
    return _colour(text) is not None and _colour(text) == _colour(background)


def _colour(value: str) -> str | None:
    value = _NAMED.get(value, value)
    if short := _SHORT_HEX.fullmatch(value):
        return "#" + "".join(digit * 2 for digit in short.groups())
    if rgb := _RGB.fullmatch(value):
        return "#" + "".join(f"{min(int(n), 255):02x}" for n in rgb.groups())
    return value if re.fullmatch(r"#[0-9a-f]{6}", value) else None
