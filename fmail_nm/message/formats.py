"""Text formats undone before reading: format=flowed plain text (RFC 3676) and
text/enriched (RFC 1896).

Pure ``str`` functions over decoded, untrusted text; linear time, never raise.
"""

from __future__ import annotations

import re

from .text import escape_quote_marks

__all__ = ["enriched_to_text", "unflow"]


_QUOTE_MARKS = re.compile(r">*")
_SIGNATURE_DELIMITER = "-- "


def unflow(text: str, delsp: bool) -> str:
    """format=flowed text as its logical lines (RFC 3676 §4): a line that ends in a space is
    joined to the next line of the same quote depth (its trailing space deleted with
    ``delsp``), the stuffing space after the quote marks goes, and quotes are written
    "> " per depth. A line that merely begins with ">" after unstuffing is not a quote and is
    escaped, as clean_text would otherwise drop it."""
    out: list[str] = []
    paragraph: list[str] = []
    paragraph_depth = 0
    for line in text.replace("\r\n", "\n").split("\n"):
        depth, content = _unquoted(line)
        if paragraph and (depth != paragraph_depth or not content):
            # A soft break into another depth or onto an empty line is the sender's error:
            # the break is hard, and the blank line between paragraphs stays.
            out.append(_logical_line(paragraph, paragraph_depth))
            paragraph = []
        paragraph_depth = depth
        soft = content.endswith(" ") and content != _SIGNATURE_DELIMITER  # "-- " is fixed
        if soft and delsp:
            content = content[:-1]
        paragraph.append(content)
        if not soft:
            out.append(_logical_line(paragraph, depth))
            paragraph = []
    if paragraph:
        out.append(_logical_line(paragraph, paragraph_depth))
    return "\n".join(out)


def _unquoted(line: str) -> tuple[int, str]:
    """The quote depth of a line and its content without the quote marks and stuffing."""
    marks = _QUOTE_MARKS.match(line)
    depth = marks.end() if marks else 0
    content = line[depth:]
    return depth, content[1:] if content.startswith(" ") else content


def _logical_line(pieces: list[str], depth: int) -> str:
    content = escape_quote_marks("".join(pieces))
    if not depth:
        return content
    return ">" * depth + (" " + content if content else "")


# A formatting command (RFC 1896: up to 60 letters, digits and hyphens), "<<" (a literal "<"),
# or a run of newlines.
_ENRICHED_TOKEN = re.compile(r"(<<)|<(/?)([A-Za-z0-9-]{1,60})>|(\n+)")


def enriched_to_text(text: str) -> str:
    """text/enriched as plain text: formatting commands and their <param> data dropped, "<<"
    read as "<", and newlines as RFC 1896 has them: one is a space, n in a row are n-1 line
    breaks (all of them inside <nofill>)."""
    text = text.replace("\r\n", "\n")
    out: list[str] = []
    in_param = nofill = 0
    pos = 0
    for token in _ENRICHED_TOKEN.finditer(text):
        if not in_param:
            out.append(text[pos : token.start()])
        pos = token.end()
        literal_lt, closing, command, newlines = token.groups()
        if command:
            step = -1 if closing else 1
            if command.lower() == "param":
                in_param = max(0, in_param + step)
            elif command.lower() == "nofill":
                nofill = max(0, nofill + step)
        elif in_param:
            continue
        elif literal_lt:
            out.append("<")
        elif nofill:
            out.append(newlines)
        else:
            out.append(" " if len(newlines) == 1 else newlines[1:])
    if not in_param:
        out.append(text[pos:])
    return "".join(out)
