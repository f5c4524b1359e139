"""A lock on an open file that is taken at once or not at all, for callers that poll: their
waits stay bounded (a blocking ``flock`` waits as long as the holder likes)."""

from __future__ import annotations

import fcntl
from typing import IO


def try_flock(fh: IO[str]) -> bool:
    """Take an exclusive ``flock`` on ``fh`` if no other open file holds one; False if one does."""
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
