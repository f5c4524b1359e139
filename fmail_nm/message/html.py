"""HTML to readable text with html2text: the full rendering the read tools show.

The only module that imports html2text (≈ 1.5 ms per KB of HTML), so the indexer, which
renders previews with ``text.preview_html_text``, never loads it.
"""

from __future__ import annotations

import re

import html2text

from .mime import BodyText, ParsedMessage, parse_body, parse_message

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


def html_to_text(html: str) -> str:
    """HTML as Markdown-ish text; an ``HtmlRenderer`` (``mime.html_text`` tidies the result)."""
    converter = html2text.HTML2Text()
    converter.body_width = 0  # no hard wrapping: the reader wraps, and wrapping breaks URLs
    converter.images_to_alt = True  # tracking pixels vanish, meaningful alt text stays
    converter.unicode_snob = True  # keep “quotes” and é instead of ASCII approximations
    converter.inline_links = True  # [text](url), which every LLM reads
    # html2text drops <script>, <style> and <head> contents and renders tables as
    # Markdown rows, which reads well for data tables.
    return converter.handle(_flattened(html))


def read_message(raw: bytes) -> ParsedMessage:
    """``mime.parse_message`` with HTML rendered by html2text: what get_email shows."""
    return parse_message(raw, html_to_text)


def read_body(raw: bytes) -> BodyText:
    """``mime.parse_body`` with HTML rendered by html2text: what get_thread shows."""
    return parse_body(raw, html_to_text)
