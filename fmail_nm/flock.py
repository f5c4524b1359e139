"""A lock on an open file taken at once, or within a bound by polling: a blocking ``flock``
waits as long as the holder likes, and the callers must answer within theirs."""

from __future__ import annotations

import fcntl
import time
from typing import IO


def try_flock(fh: IO[str], *, shared: bool = False) -> bool:
    """Take an exclusive ``flock`` on ``fh`` if no other open file holds one (``shared``: a
    shared one, if no other open file holds an exclusive one); False if one does."""
    try:
        fcntl.flock(fh, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def flock_within(fh: IO[str], seconds: float, *, shared: bool = False) -> bool:
    """Take a ``flock`` on ``fh`` as :func:`try_flock` does, looking again (every 20 ms,
    backing off to 250 ms) for at most ``seconds``; False if another open file still holds
    one in the way then."""
    deadline = time.monotonic() + max(seconds, 0.0)
    delay = 0.02
    while not try_flock(fh, shared=shared):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.25)
    return True
