"""One debounce, for everything that turns a burst of requests into one piece of work.

A :class:`Debouncer` collects items (distinct, in the order first added) and hands them to a
callback as one batch, on its own thread, once ``quiet`` seconds passed without a new item --
but never later than ``max_wait`` after the first item of the batch, so a steady stream is
still handled.  One batch at a time: items added while the callback runs form the next batch.

Used by the Maildir watcher (changed files -> one ``notmuch new``) and the push scheduler
(accounts written to -> one ``mbsync --push`` each).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T", bound=Hashable)


@dataclass(frozen=True)
class DebounceState(Generic[T]):
    """A consistent snapshot of a :class:`Debouncer`."""

    pending: tuple[T, ...]  # waiting for the quiet period (or max_wait)
    in_flight: tuple[T, ...]  # the batch the callback is handling now
    batches: int  # batches handed to the callback so far
    closed: bool

    @property
    def idle(self) -> bool:
        return not self.pending and not self.in_flight


class Debouncer(Generic[T]):
    """Batch items; call ``callback(batch)`` on a background thread when the batch is due.

    A batch is due ``quiet`` seconds after its last item or ``max_wait`` seconds after its
    first (``max_wait`` is at least ``quiet``), or at once after :meth:`flush`.  An exception
    from the callback is logged and the thread goes on with the next batch.  ``on_added`` (if
    given) is called on that thread soon after items are added, pending ones again too (once
    for adds in quick succession), before their batch is due -- after a batch in flight,
    though -- so the adder's thread never waits for it.

    :meth:`close` stops taking items; what is pending is dropped (and returned) or, with
    ``flush=True``, delivered at once; a batch in flight is left to finish.
    """

    def __init__(self, callback: Callable[[list[T]], None], *, quiet: float, max_wait: float,
                 name: str = "debouncer", on_added: Callable[[], None] | None = None) -> None:
        if quiet < 0:
            raise ValueError(f"quiet must not be negative, not {quiet!r}")
        self.callback = callback
        self.on_added = on_added
        self.quiet = quiet
        self.max_wait = max(max_wait, quiet)
        self.name = name
        self._pending: dict[T, None] = {}  # insertion-ordered set
        self._in_flight: tuple[T, ...] = ()
        self._first = 0.0
        self._last = 0.0
        self._flush = False
        self._added = False  # items added since on_added was last called
        self._closed = False
        self._drain = False  # closed with flush=True: deliver what is pending, then stop
        self._batches = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- public --------------------------------------------------------------------------------

    def add(self, items: Iterable[T]) -> bool:
        """Add items (duplicates of pending ones are merged); restarts the quiet period.
        Returns False, dropping the items, once the debouncer is closed."""
        new = list(items)
        with self._cond:
            if self._closed:
                return False
            if not new:
                return True
            now = time.monotonic()
            if not self._pending:
                self._first = now
            self._last = now
            self._added = True
            for item in new:
                self._pending[item] = None
            self._cond.notify_all()
            return True

    def flush(self) -> None:
        """Deliver what is pending now instead of when it is due; returns at once (the
        callback runs on the debouncer's thread, after a batch in flight)."""
        with self._cond:
            if self._pending:
                self._flush = True
                self._cond.notify_all()

    def close(self, *, flush: bool = False, timeout: float | None = None) -> list[T]:
        """Stop taking items and stop the thread once done; returns what was dropped.

        Pending items are dropped, or with ``flush=True`` delivered at once.  Waits at most
        ``timeout`` seconds (None: no limit, 0: not at all) for the thread; see :meth:`join`.
        """
        with self._cond:
            self._closed = True
            self._drain = self._drain or flush
            dropped: list[T] = []
            if not self._drain:
                dropped = list(self._pending)
                self._pending.clear()
            self._cond.notify_all()
        if dropped:
            log.debug("%s closed with %d item(s) not delivered", self.name, len(dropped))
        if timeout is None or timeout > 0:
            self.join(timeout)
        return dropped

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end (after :meth:`close`); False if it still runs."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def state(self) -> DebounceState[T]:
        with self._cond:
            return DebounceState(pending=tuple(self._pending), in_flight=self._in_flight,
                                 batches=self._batches, closed=self._closed)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or being delivered; False if ``timeout`` ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._in_flight,
                                       timeout)

    # -- the thread ----------------------------------------------------------------------------

    def _next_batch(self) -> list[T] | None:
        """Wait until a batch is due and take it; None when closed and nothing is left, an
        empty batch when added items are to be told to ``on_added`` first."""
        with self._cond:
            while True:
                if not self._pending:
                    if self._closed:
                        return None
                    self._cond.wait()
                    continue
                if self._added and self.on_added is not None:
                    self._added = False
                    return []
                wait = min(self._last + self.quiet, self._first + self.max_wait) - time.monotonic()
                if wait > 0 and not self._flush and not self._closed:
                    self._cond.wait(wait)
                    continue
                batch = list(self._pending)
                self._pending.clear()
                self._added = self._flush = False
                self._in_flight = tuple(batch)
                self._batches += 1
                return batch

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            if not batch:
                self._tell_added()
                continue
            try:
                self.callback(batch)
            except Exception:  # keep the thread alive for the next batch
                log.exception("%s: handling a batch of %d item(s) failed", self.name, len(batch))
            finally:
                with self._cond:
                    self._in_flight = ()
                    self._cond.notify_all()

    def _tell_added(self) -> None:
        assert self.on_added is not None
        try:
            self.on_added()
        except Exception:  # keep the thread alive for the batch
            log.exception("%s: telling of added items failed", self.name)
