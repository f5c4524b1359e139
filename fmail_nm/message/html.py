"""HTML to readable text with html2text: the full rendering the read tools show.

The only module that imports html2text (≈ 1.5 ms per KB of HTML), so the indexer, which
renders previews with ``text.preview_html_text``, never loads it.
"""

from __future__ import annotations

import html2text

from .mime import BodyText, ParsedMessage, parse_body, parse_message

__all__ = ["html_to_text", "read_body", "read_message"]


def html_to_text(html: str) -> str:
    """HTML as Markdown-ish text; an ``HtmlRenderer`` (``mime.html_text`` tidies the result)."""
    converter = html2text.HTML2Text()
    converter.body_width = 0  # no hard wrapping: the reader wraps, and wrapping breaks URLs
    converter.images_to_alt = True  # tracking pixels vanish, meaningful alt text stays
    converter.unicode_snob = True  # keep “quotes” and é instead of ASCII approximations
    converter.inline_links = True  # [text](url), which every LLM reads
    # html2text drops <script>, <style> and <head> contents and renders tables as
    # Markdown rows, which reads well for data tables.
    return converter.handle(html)


def read_message(raw: bytes) -> ParsedMessage:
    """``mime.parse_message`` with HTML rendered by html2text: what get_email shows."""
    return parse_message(raw, html_to_text)


def read_body(raw: bytes) -> BodyText:
    """``mime.parse_body`` with HTML rendered by html2text: what get_thread shows."""
    return parse_body(raw, html_to_text)
