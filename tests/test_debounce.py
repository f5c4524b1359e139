"""The one debounce behind the Maildir watcher and the push scheduler.

Real time, short intervals.  Assertions about time are lower bounds only (a batch is never
handed over before it is due), never speed goals.  Where a test needs items to arrive closer
together than the quiet period, it measures the gaps it actually achieved and, on a machine too
busy to keep them short, tries again instead of failing: the scenario, not the debouncer, was
off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from fmail_nm.service.debounce import Debouncer

WAIT = 30.0  # generous bound for things that must happen "soon"
ATTEMPTS = 5


@dataclass
class Delivered:
    """Records each batch with the time it was handed over."""

    batches: list[tuple[float, list[str]]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, batch: list[str]) -> None:
        with self.cond:
            self.batches.append((time.monotonic(), batch))
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float = WAIT) -> list[tuple[float, list[str]]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.batches) >= count, timeout), (
                f"expected {count} batch(es) within {timeout:g}s, got {self.batches}")
            return list(self.batches)

    def items(self) -> list[str]:
        with self.cond:
            return [item for _, batch in self.batches for item in batch]


@pytest.fixture
def make() -> Iterator[Callable[..., Debouncer[str]]]:
    made: list[Debouncer[str]] = []

    def factory(callback: Callable[[list[str]], None], **kwargs: float) -> Debouncer[str]:
        debouncer: Debouncer[str] = Debouncer(callback, name="test-debouncer", **kwargs)
        made.append(debouncer)
        return debouncer

    yield factory
    for debouncer in made:
        debouncer.close(timeout=WAIT)
        assert debouncer.join(0), "the debouncer thread did not stop"


def add_stream(debouncer: Debouncer[str], names: list[str], gap: float) -> tuple[float, float]:
    """Add the names one by one, ``gap`` apart.  Returns the time just before the last add and
    the longest time between one add starting and the next one ending (the widest window in
    which the debouncer could have seen no new item)."""
    widest = 0.0
    before_prev = before = time.monotonic()
    for i, name in enumerate(names):
        if i:
            time.sleep(gap)
        before = time.monotonic()
        assert debouncer.add([name])
        after = time.monotonic()
        if i:
            widest = max(widest, after - before_prev)
        before_prev = before
    return before, widest


def test_items_are_merged_in_order_and_delivered_after_the_quiet_period(
        make: Callable[..., Debouncer[str]]) -> None:
    got = Delivered()
    debouncer = make(got, quiet=0.2, max_wait=30)
    before = time.monotonic()
    debouncer.add(["b", "a"])
    debouncer.add(["b", "c", "a"])
    ((at, batch),) = got.wait_for(1)
    assert batch == ["b", "a", "c"]  # distinct, in the order first added
    assert at >= before + 0.2
    assert debouncer.wait_idle(WAIT)
    state = debouncer.state()
    assert state.batches == 1 and state.idle and not state.closed


def test_each_new_item_restarts_the_quiet_period(make: Callable[..., Debouncer[str]]) -> None:
    quiet = 0.4
    for _ in range(ATTEMPTS):
        got = Delivered()
        debouncer = make(got, quiet=quiet, max_wait=60)
        names = [f"m{i}" for i in range(8)]  # spread over ~0.56 s, longer than `quiet`
        last_add, widest = add_stream(debouncer, names, gap=0.08)
        at, batch = got.wait_for(1)[0]
        if widest >= quiet:  # this machine stalled between two adds: not a fair run
            continue
        # No quiet period ran out between adds: one batch, and not before the last add's.
        assert batch == names
        assert at >= last_add + quiet
        assert debouncer.wait_idle(WAIT) and debouncer.state().batches == 1
        return
    pytest.fail(f"could not add items less than {quiet}s apart in {ATTEMPTS} attempts")


def test_max_wait_caps_the_delay_of_a_steady_stream(make: Callable[..., Debouncer[str]]) -> None:
    quiet, max_wait = 0.5, 0.8
    for _ in range(ATTEMPTS):
        got = Delivered()
        debouncer = make(got, quiet=quiet, max_wait=max_wait)
        first = time.monotonic()
        debouncer.add(["s0"])
        added = ["s0"]
        widest = 0.0
        before_prev = first
        # Keep items coming, each well inside the quiet period, until a batch is handed over:
        # only max_wait can end a batch while the stream goes on.
        while not got.batches and time.monotonic() - first < WAIT:
            time.sleep(0.05)
            before = time.monotonic()
            name = f"s{len(added)}"
            debouncer.add([name])
            added.append(name)
            widest = max(widest, time.monotonic() - before_prev)
            before_prev = before
        at, batch = got.wait_for(1)[0]
        # (The time from the last add to the hand-over counts too.)
        if max(widest, at - before_prev) >= quiet:
            continue
        assert at >= first + max_wait
        assert batch[0] == "s0" and batch == added[:len(batch)]
        # The stream's rest forms the next batch.
        got.wait_for(2)
        assert debouncer.wait_idle(WAIT)
        assert got.items() == added
        return
    pytest.fail(f"could not add items less than {quiet}s apart in {ATTEMPTS} attempts")


def test_flush_delivers_what_is_pending_at_once(make: Callable[..., Debouncer[str]]) -> None:
    got = Delivered()
    debouncer = make(got, quiet=3600, max_wait=3600)
    debouncer.flush()  # nothing pending: nothing happens
    debouncer.add(["x", "y"])
    assert debouncer.state().pending == ("x", "y")
    debouncer.flush()
    ((_, batch),) = got.wait_for(1)
    assert batch == ["x", "y"]
    assert debouncer.wait_idle(WAIT)
    # A flush applies to what was pending then; new items wait for their own quiet period.
    debouncer.add(["z"])
    assert not debouncer.wait_idle(0.3)
    assert debouncer.state().pending == ("z",) and len(got.batches) == 1


def test_close_without_flush_drops_and_returns_what_is_pending(
        make: Callable[..., Debouncer[str]]) -> None:
    got = Delivered()
    debouncer = make(got, quiet=3600, max_wait=3600)
    debouncer.add(["a", "b"])
    assert debouncer.close(timeout=WAIT) == ["a", "b"]
    assert debouncer.join(0)
    assert got.batches == []
    state = debouncer.state()
    assert state.closed and state.idle and state.batches == 0
    assert debouncer.add(["c"]) is False  # refused once closed
    assert debouncer.state().pending == ()


def test_close_with_flush_delivers_at_once_then_stops(
        make: Callable[..., Debouncer[str]]) -> None:
    got = Delivered()
    debouncer = make(got, quiet=3600, max_wait=3600)
    debouncer.add(["a", "b"])
    assert debouncer.close(flush=True, timeout=WAIT) == []
    assert debouncer.join(0)  # delivered before close returned, without waiting an hour
    assert [batch for _, batch in got.batches] == [["a", "b"]]
    assert debouncer.add(["c"]) is False


def test_close_leaves_a_batch_in_flight_to_finish(make: Callable[..., Debouncer[str]]) -> None:
    started, release = threading.Event(), threading.Event()
    got = Delivered()
    refused: list[bool] = []

    def slow(batch: list[str]) -> None:
        started.set()
        assert release.wait(WAIT)
        refused.append(debouncer.add(["from-callback"]))  # closed meanwhile: refused
        got(batch)

    debouncer = make(slow, quiet=0, max_wait=0)
    debouncer.add(["a"])
    assert started.wait(WAIT)
    debouncer.add(["b"])  # arrives during the callback: the next batch
    assert debouncer.state().in_flight == ("a",) and debouncer.state().pending == ("b",)
    assert debouncer.close(timeout=0) == ["b"]  # returns without waiting for the callback
    assert not debouncer.join(0.1)
    release.set()
    assert debouncer.join(WAIT)
    assert [batch for _, batch in got.batches] == [["a"]] and refused == [False]
    assert debouncer.state().idle


def test_items_added_during_a_batch_form_the_next_one(
        make: Callable[..., Debouncer[str]]) -> None:
    started, release = threading.Event(), threading.Event()
    got = Delivered()

    def slow(batch: list[str]) -> None:
        started.set()
        assert release.wait(WAIT)
        got(batch)

    debouncer = make(slow, quiet=0.05, max_wait=0.05)
    debouncer.add(["a"])
    assert started.wait(WAIT)
    debouncer.add(["a", "b"])  # "a" again: it changed again after the batch was taken
    assert not debouncer.wait_idle(0.1)  # wait_idle covers the callback
    release.set()
    got.wait_for(2)
    assert [batch for _, batch in got.batches] == [["a"], ["a", "b"]]
    assert debouncer.wait_idle(WAIT) and debouncer.state().batches == 2


def test_a_failing_callback_does_not_stop_the_thread(
        make: Callable[..., Debouncer[str]], caplog: pytest.LogCaptureFixture) -> None:
    got = Delivered()

    def flaky(batch: list[str]) -> None:
        if batch == ["boom"]:
            raise RuntimeError("callback broke")
        got(batch)

    caplog.set_level(logging.ERROR, logger="fmail_nm.service.debounce")
    debouncer = make(flaky, quiet=0.01, max_wait=0.01)
    debouncer.add(["boom"])
    assert debouncer.wait_idle(WAIT)
    assert "test-debouncer" in caplog.text and "callback broke" in caplog.text
    debouncer.add(["fine"])
    ((_, batch),) = got.wait_for(1)
    assert batch == ["fine"]
    assert debouncer.wait_idle(WAIT) and debouncer.state().batches == 2


def test_max_wait_is_at_least_quiet_and_quiet_not_negative() -> None:
    debouncer: Debouncer[str] = Debouncer(lambda batch: None, quiet=2.0, max_wait=0.5)
    try:
        assert debouncer.max_wait == 2.0
    finally:
        debouncer.close()
    with pytest.raises(ValueError):
        Debouncer(lambda batch: None, quiet=-1, max_wait=1)


def test_added_items_are_told_on_the_debouncers_thread_before_their_batch_is_due() -> None:
    """What a push scheduler's record needs: a write it was asked to push is known at once,
    not only after the quiet period -- a write to an account already waiting too, as the
    record keeps the time of the latest -- yet the adder's thread never does the telling."""
    told: list[tuple[str, list[str]]] = []
    seen = threading.Event()
    delivered = Delivered()

    def on_added() -> None:
        told.append((threading.current_thread().name, list(debouncer.state().pending)))
        seen.set()

    debouncer: Debouncer[str] = Debouncer(delivered, quiet=600.0, max_wait=600.0,
                                          name="test-debouncer", on_added=on_added)
    try:
        debouncer.add(["a"])
        assert seen.wait(WAIT)
        assert told == [("test-debouncer", ["a"])]
        assert delivered.batches == []  # not due for ten minutes
        seen.clear()
        debouncer.add(["a"])  # nothing new, yet added again
        assert seen.wait(WAIT)
        assert told[1:] == [("test-debouncer", ["a"])]
        seen.clear()
        debouncer.add(["b"])
        assert seen.wait(WAIT)
        assert told[2:] == [("test-debouncer", ["a", "b"])]
    finally:
        debouncer.close(flush=True, timeout=WAIT)
    assert delivered.items() == ["a", "b"]
