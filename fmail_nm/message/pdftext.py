"""PDF text extraction in a process of its own, under a memory and CPU cap.

A PDF attachment is untrusted input, and pypdf on hostile input can take seconds and hundreds
of MiB: a 57 KB attachment whose content stream inflates to 20 MB cost pypdf 7.1 4.7 s and
330 MiB before it gave up, and pypdf's advisories are a steady list of such inputs.  In the
server's process that memory would stay with it, and a new pypdf bug could hold the reading
thread for ever.  The child gets at most :data:`MEMORY_MIB` of address space and
:data:`SECONDS` of CPU and wall time; the server keeps its memory and gets a note instead.

The child: ``python -m fmail_nm.message.pdftext MAX_CHARS MAX_PAGES``, the PDF on stdin, one
JSON object on stdout: ``{"text": ..., "more": bool}`` or ``{"error": "<exception class>"}``.

The texts read last are kept (:data:`KEPT_TEXTS`, :data:`KEPT_CHARS`): a PDF read page
after page (get_attachment's offset) starts the child again only to read further than
before, each time the PDF parsed anew from its first page (0.3 to 0.5 s for a 60-page
contract, most of it the child starting); a caller reading on asks for some text ahead.
"""

from __future__ import annotations

import hashlib
import io
import json
import signal
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

from .text import tidy

MEMORY_MIB = 256  # Python with pypdf loaded is ~45 MiB of address space
SECONDS = 10


@dataclass(frozen=True)
class PdfText:
    """What the reader got: the text (None when it failed or hit a cap, ``problem`` then says
    which), and whether pages were left unread."""

    text: str | None
    more_pages: bool = False
    problem: str | None = None


def pdf_text(data: bytes, max_chars: int, max_pages: int, *, ahead: int = 0) -> PdfText:
    """The PDF's page text until ``max_chars`` is exceeded or ``max_pages`` are read (or
    more of it: a text kept from a read that went further; when it must be read, ``ahead``
    characters further, unless the reader fails there).  The text read for a larger
    ``max_chars`` begins with the one read for a smaller."""
    key = (hashlib.sha256(data).digest(), max_pages)
    with _kept_lock:
        kept = _kept.get(key)
        if kept is not None and kept.covers(max_chars):
            _kept.move_to_end(key)
            return kept.read
    read = _read(data, max_chars + ahead, max_pages)
    if read.text is None and ahead and kept is not None:
        # The reader read this PDF before: what it failed on may be the pages ahead (one
        # that exhausts its caps), which must not cost the text asked for.
        ahead = 0
        read = _read(data, max_chars, max_pages)
    if read.text is not None:  # a failure is not kept: what was read for less stays kept
        _keep(key, _Kept(read, max_chars + ahead))
    return read


@dataclass(frozen=True)
class _Kept:
    read: PdfText
    max_chars: int  # what it was read for

    def covers(self, max_chars: int) -> bool:
        """Whether reading for ``max_chars`` would give no more text: this read went past
        it, to the PDF's end, or to the page cap (it stopped short of its own max_chars)."""
        length = len(self.read.text or "")
        return not self.read.more_pages or length > max_chars or length <= self.max_chars


# The texts kept, and their characters in all (a 60-page contract has ~200,000; up to 4
# bytes each).
KEPT_TEXTS = 16
KEPT_CHARS = 2_000_000
_kept: OrderedDict[tuple[bytes, int], _Kept] = OrderedDict()  # least recently read first
_kept_lock = threading.Lock()  # attachments are read on more than one thread


def _keep(key: tuple[bytes, int], kept: _Kept) -> None:
    size = len(kept.read.text or "")
    with _kept_lock:
        known = _kept.get(key)
        if known is not None and known.covers(kept.max_chars):
            _kept.move_to_end(key)
            return  # read as far or further meanwhile, on another thread
        _kept.pop(key, None)
        if size > KEPT_CHARS:
            return
        _kept[key] = kept
        while (len(_kept) > KEPT_TEXTS
               or sum(len(k.read.text or "") for k in _kept.values()) > KEPT_CHARS):
            _kept.popitem(last=False)


def _read(data: bytes, max_chars: int, max_pages: int) -> PdfText:
    # -P: -m would put the server's working directory first on sys.path, where a planted
    # module would run in place of the library's.
    argv = [sys.executable, "-P", "-m", __name__, str(max_chars), str(max_pages)]
    try:
        done = subprocess.run(argv, input=data, capture_output=True, timeout=SECONDS,
                              check=False)
    except subprocess.TimeoutExpired:
        return PdfText(None, problem=f"PDF text extraction stopped after {SECONDS} s")
    try:
        answer = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return PdfText(None, problem=_failure(done.returncode))
    if answer.get("error") == "MemoryError":
        return PdfText(None, problem=f"PDF text extraction stopped: it needed more than "
                                     f"{MEMORY_MIB} MiB")
    if answer.get("error") == "FileNotDecryptedError":  # not the empty password _extract tries
        return PdfText(None, problem="PDF is protected by a password; no text extracted")
    if "error" in answer:
        return PdfText(None, problem=f"could not extract text from PDF ({answer['error']})")
    return PdfText(str(answer["text"]), bool(answer["more"]))


def _failure(returncode: int) -> str:
    # The kernel sends SIGXCPU at the CPU cap, and SIGKILL at its hard limit.
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"PDF text extraction stopped after {SECONDS} s of CPU"
    return f"PDF text extraction failed (the reader exited with status {returncode})"


def _extract(data: bytes, max_chars: int, max_pages: int) -> tuple[str, bool]:
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        reader.decrypt("")  # many "encrypted" PDFs use an empty user password
    # Each page tidied on its own, the length counted as joined: the text read for a larger
    # max_chars then begins with the one for a smaller, and is longer than max_chars
    # whenever pages are left, so that a page read from an offset follows on exactly.
    pages: list[str] = []
    length = 0
    for number, page in enumerate(reader.pages):
        if length > max_chars or number >= max_pages:
            return _PAGE_BREAK.join(pages), True
        text = tidy(page.extract_text() or "")
        if text:
            length += len(text) + (len(_PAGE_BREAK) if pages else 0)
            pages.append(text)
    return _PAGE_BREAK.join(pages), False


_PAGE_BREAK = "\n\n"


def _child(argv: list[str]) -> int:
    import resource

    cap = MEMORY_MIB << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CPU, (SECONDS, SECONDS + 1))
    data = sys.stdin.buffer.read()
    try:
        text, more = _extract(data, int(argv[0]), int(argv[1]))
        answer: dict[str, object] = {"text": text, "more": more}
    except Exception as exc:  # noqa: BLE001 - pypdf on hostile input raises many things
        answer = {"error": type(exc).__name__}  # MemoryError too: the memory cap
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1:]))
