"""A lock on an open file taken at once, or within a bound by polling: a blocking ``flock``
waits as long as the holder likes, and the callers must answer within theirs."""

from __future__ import annotations

import fcntl
import time
from typing import IO


def try_flock(fh: IO[str]) -> bool:
    """Take an exclusive ``flock`` on ``fh`` if no other open file holds one; False if one does."""
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def flock_within(fh: IO[str], seconds: float) -> bool:
    """Take an exclusive ``flock`` on ``fh``, looking again (every 20 ms, backing off to
    250 ms) for at most ``seconds``; False if another open file still holds one then."""
    deadline = time.monotonic() + max(seconds, 0.0)
    delay = 0.02
    while not try_flock(fh):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.25)
    return True
