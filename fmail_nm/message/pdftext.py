"""PDF text extraction in a process of its own, under a memory and CPU cap.

A PDF attachment is untrusted input, and pypdf on hostile input can take seconds and hundreds
of MiB: a 57 KB attachment whose content stream inflates to 20 MB cost pypdf 7.1 4.7 s and
330 MiB before it gave up, and pypdf's advisories are a steady list of such inputs.  In the
server's process that memory would stay with it, and a new pypdf bug could hold the reading
thread for ever.  The child gets at most :data:`MEMORY_MIB` of address space and
:data:`SECONDS` of CPU and wall time; the server keeps its memory and gets a note instead.

The child: ``python -m fmail_nm.message.pdftext MAX_CHARS MAX_PAGES``, the PDF on stdin, one
JSON object on stdout: ``{"text": ..., "more": bool}`` or ``{"error": "<exception class>"}``.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
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


def pdf_text(data: bytes, max_chars: int, max_pages: int) -> PdfText:
    """The PDF's page text until ``max_chars`` is exceeded or ``max_pages`` are read."""
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
    chunks: list[str] = []
    length = 0
    for number, page in enumerate(reader.pages):
        if length > max_chars or number >= max_pages:
            return tidy("\n\n".join(chunks)), True
        chunk = page.extract_text() or ""
        chunks.append(chunk)
        length += len(chunk)
    return tidy("\n\n".join(chunks)), False


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
