"""A draft's version: its file's content, blind to what mbsync changes in a copy without
changing the draft -- the X-TUID header it puts into the copy it uploads, and LF for CRLF in a
copy it fetches (a rename of the file for its flags changes no content).  Two files of one
Message-ID are one version when their digests are equal; a draft changed since the model last
saw it is one whose digest is no longer the one seen.
"""

from __future__ import annotations

import hashlib
import re

_SYNC_HEADER = re.compile(rb"^X-TUID:[^\r\n]*\r?\n", re.I | re.M)
_END_OF_HEADER = re.compile(rb"\n\r?\n")


def without_sync_header(data: bytes) -> bytes:
    """``data`` without mbsync's X-TUID header -- which it puts last, before the blank line:
    the header block is cut after the newline that ends its last line."""
    end = _END_OF_HEADER.search(data)
    split = end.start() + 1 if end else len(data)
    return _SYNC_HEADER.sub(b"", data[:split]) + data[split:]


def version(data: bytes) -> bytes:
    """The digest of a draft file's content, the same for every copy of one version."""
    return hashlib.sha256(without_sync_header(data).replace(b"\r\n", b"\n")).digest()


class SeenDrafts:
    """The version of each draft the model last saw, by Message-ID: the file a read showed it
    (get_email, get_thread) or a save wrote for it.  Held by the server process: a stdio
    server's is one conversation's, starting empty as the model's own memory does; an HTTP
    server's sessions share one (the version any of them saw last)."""

    def __init__(self) -> None:
        # Set and read on the read and the write thread: single dict operations, atomic.
        self._versions: dict[str, bytes] = {}

    def saw(self, message_id: str, data: bytes) -> None:
        self._versions[message_id] = version(data)

    def changed(self, message_id: str, data: bytes) -> bool:
        """Whether ``data`` is not the version last seen; never seen: nothing to compare."""
        seen = self._versions.get(message_id)
        return seen is not None and seen != version(data)
