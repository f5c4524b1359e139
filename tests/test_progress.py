"""One progress line for the whole index run: notmuch's phase and ours, parsed from the terminal
notmuch new runs on and drawn as one bar (``fmail_nm.service.index``), and the lines our hook
writes for it (``fmail_nm.progress``)."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from fmail_nm import progress
from fmail_nm.adopt.hooks import kept_hook
from fmail_nm.service.index import (
    LINE_WIDTH,
    ProgressDisplay,
    format_left,
    parse_line,
    render_progress,
    run_index,
)

from .conftest import USER_ADDRESSES, MailEnv
from .test_index_tags import LISTED

# What notmuch 0.37 wrote to its terminal: a first index of 30000 files, then 15000 more.
FIRST_RUN = (
    b"Found 1000 files so far.\rFound 2000 files so far.\rFound 30000 files so far.\r"
    b"Found 30000 total files (that's not much mail).\r\n"
    b"Processed 7341 of 30000 files (3s remaining).\x1b[K\r"
    b"Processed 13601 of 30000 files (2s remaining).\x1b[K\r"
    b"Processed 21000 of 30000 files (1s remaining).\x1b[K\r"
    b"Processed 27253 of 30000 files (almost no time remaining).\x1b[K\r"
    b"Processed 30000 total files in 4s (6704 files/sec.).\x1b[K\r\n"
    b"Added 30000 new messages to the database.\r\n")
LATER_RUN = (
    b"Processed 7550 files (7548 files/sec.).\x1b[K\r"
    b"Processed 14815 files (7406 files/sec.).\x1b[K\r"
    b"Processed 15000 total files in 2s (7312 files/sec.).\x1b[K\r\n"
    b"Added 15000 new messages to the database.\r\n")


def split(recorded: bytes) -> list[str]:
    from fmail_nm.store.notmuch_cli import _split_progress
    return list(_split_progress([recorded]))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# ---------------------------------------------------------------------------------------------
# Parsing


def test_notmuch_lines_parse_into_phases() -> None:
    events = [e for e in map(parse_line, split(FIRST_RUN)) if e is not None]
    assert events == [
        ("counting", 1000, 0), ("counting", 2000, 0), ("counting", 30000, 0),
        ("indexing", 0, 30000),
        ("indexing", 7341, 30000), ("indexing", 13601, 30000), ("indexing", 21000, 30000),
        ("indexing", 27253, 30000),
        ("indexing", 30000, 30000),
    ]
    events = [e for e in map(parse_line, split(LATER_RUN)) if e is not None]
    assert events == [("indexing", 7550, 0), ("indexing", 14815, 0), ("indexing", 15000, 15000)]
    assert parse_line("Processed 1 file in almost no time.\x1b[K\r") == ("indexing", 1, 1)
    assert parse_line("\r\x1b[KProcessed 5 of 9 files.\x1b[K\r") == ("indexing", 5, 9)


def test_our_lines_parse_next_to_notmuchs() -> None:
    assert parse_line("fmail-nm progress: tagging 1200/6044\r") == ("tagging", 1200, 6044)
    assert parse_line("\x1b[Kfmail-nm progress: sidecar 0/0\n") == ("sidecar", 0, 0)


@pytest.mark.parametrize("line", [
    "", "\n", "\r", "No new mail.\r", "Added 169 new messages to the database.\r",
    "Note: Ignoring non-mail file: /mail/INBOX/cur/x\n", "Stopping...         \n",
    "\x00\xff\ufffd garbage", "Processed files", "Processed 99999999999999999999 of 3 files",
    "fmail-nm progress:", "fmail-nm progress: tagging", "fmail-nm progress: Tagging 1/2",
    "fmail-nm progress: tagging -1/2", "fmail-nm progress: tagging 1/2x",
    "fmail-nm progress: tagging 1/9999999999999999", "fmail-nm progress: tagging 1/ 2",
    "fmail-nm progress: " + "a" * 21 + " 1/2",
])
def test_other_lines_are_not_progress(line: str) -> None:
    assert parse_line(line) is None
    display = ProgressDisplay(FakeTerminal(), clock=FakeClock())
    display.feed(line)
    display.finish()
    assert display.stream.getvalue() == ""  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# Rendering


def test_render_a_bar_with_rate_and_time_left() -> None:
    assert render_progress("indexing", 1200, 6044, 310.4, 15.6) == (
        "indexing [#####.........................] 1200/6044 files, 310/s, 16 s left")
    assert render_progress("tagging", 3, 10) == (
        "tagging [#########.....................] 3/10 messages")
    assert render_progress("sidecar", 12, 0, 2.5) == "sidecar: 12 messages, 2.5/s"
    assert render_progress("indexing", 12, 10) == (
        "indexing [##############################] 12/10 files")


def test_render_fits_80_columns_whatever_the_numbers() -> None:
    line = render_progress("recipients", 123456789012, 999999999999, 123456789.0, 10 ** 7)
    # Too long with the time left: that goes first.
    assert line == ("recipients [##................] 123456789012/999999999999 messages, "
                    "123456789/s")
    assert render_progress("sidecar", 10 ** 11, 10 ** 11 + 1, 10 ** 6, 10 ** 6) == (
        "sidecar [######################.] 100000000000/100000000001 messages, 1000000/s")
    for total in (1, 10, 10 ** 6, 10 ** 11):
        for phase in ("indexing", "blocklist", "a" * 20):
            assert len(render_progress(phase, total // 2, total, 9999.0, 3600 * 99)) <= LINE_WIDTH


@pytest.mark.parametrize(("seconds", "text"), [
    (0.2, "1 s left"), (38, "38 s left"), (89.5, "90 s left"), (90, "2 min left"),
    (125, "2 min left"), (5399, "1 h 30 min left"), (3 * 3600 + 5 * 60, "3 h 05 min left"),
])
def test_time_left(seconds: float, text: str) -> None:
    assert format_left(seconds) == text


def test_one_line_for_notmuchs_phase_and_ours_with_a_fake_clock() -> None:
    clock, terminal = FakeClock(), FakeTerminal()
    display = ProgressDisplay(terminal, clock=clock)
    lines = [line for line in split(FIRST_RUN) if not line.startswith("Found 1000")
             and not line.startswith("Found 2000") and not line.startswith("Found 30000 files")]
    times = iter([0.0, 0.0, 1.0, 2.0, 3.0, 3.5, 4.0, 4.0, 4.0, 4.0])
    for line in lines:
        clock.now = next(times)
        display.feed(line)
    # The hook's pass, through the same terminal; then the pass run in-process, through the
    # callback.  A redraw within REDRAW_INTERVAL is held back until finish().
    for now, line in ((4.05, "fmail-nm progress: tagging 0/30000\r"),
                      (4.10, "fmail-nm progress: tagging 500/30000\r"),
                      (8.05, "fmail-nm progress: tagging 30000/30000\r")):
        clock.now = now
        display.feed(line)
        display.feed("\n")
    clock.now = 8.1
    display.update("sidecar", 0, 0)  # nothing to do: not shown
    display.update("sidecar", 10, 40)
    clock.now = 8.15
    display.update("sidecar", 20, 40)
    clock.now = 8.2
    display.finish()
    display.finish()  # once only
    assert terminal.getvalue().split("\r") == [
        "",
        "indexing [..............................] 0/30000 files",
        "indexing [#######.......................] 7341/30000 files",
        "indexing [#############.................] 13601/30000 files, 6800/s, 3 s left",
        "indexing [#####################.........] 21000/30000 files, 7000/s, 2 s left",
        "indexing [###########################...] 27253/30000 files, 7787/s, 1 s left",
        "indexing [##############################] 30000/30000 files, 7500/s          ",
        "tagging [..............................] 0/30000 messages          ",
        "tagging [##############################] 30000/30000 messages, 7500/s",
        "sidecar [#######.......................] 10/40 messages              ",
        "sidecar [###############...............] 20/40 messages\n",
    ]


def test_no_rate_until_a_few_seconds_and_items() -> None:
    clock, terminal = FakeClock(), FakeTerminal()
    display = ProgressDisplay(terminal, clock=clock)
    for now, done in ((0.0, 0), (1.9, 100), (5.0, 3), (10.0, 4), (12.0, 8)):
        clock.now = now
        display.update("sidecar", done, 10 if done < 10 else 1000)
    display.finish()
    assert terminal.getvalue().split("\r")[1:] == [
        "sidecar [..............................] 0/10 messages",
        "sidecar [###...........................] 100/1000 messages",  # under 2 s
        "sidecar [#########.....................] 3/10 messages    ",  # went back: a new start
        "sidecar [############..................] 4/10 messages",  # 1 item in 5 s
        "sidecar [########################......] 8/10 messages, 0.7/s, 3 s left\n",
    ]


# ---------------------------------------------------------------------------------------------
# Quiet


def test_quiet_when_not_a_terminal() -> None:
    pipe = io.StringIO()
    display = ProgressDisplay(pipe, clock=FakeClock())
    assert not display.enabled
    for line in split(FIRST_RUN):
        display.feed(line)
    display.update("tagging", 5, 10)
    display.finish()
    assert pipe.getvalue() == ""
    forced = ProgressDisplay(FakeTerminal(), enabled=False)
    forced.update("tagging", 5, 10)
    forced.finish()
    assert forced.stream.getvalue() == ""  # type: ignore[attr-defined]


def test_the_hook_writes_nothing_unless_asked(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(progress.ENV, raising=False)
    assert progress.from_environment() is None
    progress.report_progress("tagging", 1, 2)
    monkeypatch.setenv(progress.ENV, "0")
    assert progress.from_environment() is None
    progress.report_progress("tagging", 1, 2)
    assert capsys.readouterr() == ("", "")


# ---------------------------------------------------------------------------------------------
# The hook's lines


def test_the_hooks_lines_round_trip_through_the_parser(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr(progress, "_reporter", progress.LineReporter())
    callback = progress.from_environment()
    assert callback is progress.report_progress
    sent = [("tagging", 0, 6044), ("blocklist", 3, 3), ("sidecar", 6044, 6044)]
    for event in sent:
        callback(*event)
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("fmail-nm progress: tagging 0/6044\n"
                   "fmail-nm progress: blocklist 3/3\n"
                   "fmail-nm progress: sidecar 6044/6044\n")
    assert [parse_line(line) for line in err.splitlines()] == sent
    assert progress.strip_progress("a\r\n" + err + "b\n") == "a\r\nb\n"


def test_the_hooks_lines_are_throttled_but_keep_each_phases_first_and_last() -> None:
    clock, stream = FakeClock(), io.StringIO()
    reporter = progress.LineReporter(stream, clock=clock)
    for now, done in ((0.0, 0), (0.1, 100), (0.2, 200), (0.3, 300), (0.35, 350), (0.36, 400)):
        clock.now = now
        reporter("tagging", done, 400)
    clock.now = 0.37
    reporter("sidecar", 0, 400)
    reporter("sidecar", 1, 400)
    reporter("Bad Phase", 1, 2)  # dropped, never raised
    reporter("sidecar", -1, 2)
    assert [parse_line(line) for line in stream.getvalue().splitlines()] == [
        ("tagging", 0, 400), ("tagging", 200, 400), ("tagging", 400, 400), ("sidecar", 0, 400)]


def test_format_refuses_what_the_parser_would_not_read() -> None:
    assert progress.format_progress("sidecar", 1, 2) == "fmail-nm progress: sidecar 1/2\n"
    for phase, done, total in (("Tagging", 1, 2), ("tag ging", 1, 2), ("x", -1, 2),
                               ("x", 1, 10 ** 12), ("", 1, 2)):
        with pytest.raises(ValueError):
            progress.format_progress(phase, done, total)


# ---------------------------------------------------------------------------------------------
# End to end: fmail-nm index on a terminal and not


def init_without_index(env: MailEnv) -> None:
    args = ["init", "--mail-root", str(env.mail_root), "--name", "Alex Morgan", "--no-index"]
    for address in USER_ADDRESSES:
        args += ["--address", address]
    env.fmail(*args)


def run_on_pty(env: MailEnv, *args: str, timeout: float = 120) -> tuple[int, str]:
    """``fmail-nm ARGS`` with stdout and stderr on a pseudo-terminal; its exit code and all it
    wrote there (the terminal turns ``\\n`` into ``\\r\\n``)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fmail_nm", *args], stdout=slave,
                            stderr=slave, stdin=subprocess.DEVNULL,
                            env={**os.environ, **env.env, progress.ENV: ""})
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=30), out.decode("utf-8", errors="replace")


def test_index_on_a_terminal_draws_one_bar_through_every_phase(mail_env: MailEnv) -> None:
    init_without_index(mail_env)
    code, out = run_on_pty(mail_env, "index")
    assert code == 0
    assert "\rindexing [..............................] 0/171 files" in out
    assert "\rindexing [##############################] 171/171 files" in out
    assert out.endswith("\r\nindexed: 169 new, 169 messages in all (inbox 98, unread 15, sent 23, "
                        "list 13, flagged 6, attachment 4)\r\n")
    assert "Found 171" not in out and "Added 169" not in out  # notmuch's own lines: not echoed
    bars = out.rpartition("\r\n")[0].rpartition("\r\n")[0].split("\r")
    assert bars[0] == "" and all(len(bar) <= LINE_WIDTH for bar in bars)
    # A first index: fmail-nm indexes and tags in one phase (the mirror follows it).
    phases = [bar.split(" ", 1)[0] for bar in bars[1:]]
    assert phases[:2] == ["indexing", "indexing"] and "tagging" not in phases

    # Later runs: notmuch new's phase, then the pass's: the mirror parses the new mail, the
    # rules tag it.
    inbox = mail_env.mail_root / "personal" / "INBOX" / "new"
    for n in range(3):
        (inbox / f"listed-{n}").write_bytes(LISTED.replace(b"listed-1@", f"listed-{n}@".encode()))
    code, out = run_on_pty(mail_env, "index")
    assert code == 0 and "\r\nindexed: 3 new, 172 messages in all" in out
    bars = out.rpartition("\r\n")[0].rpartition("\r\n")[0].split("\r")
    phases = [bar.split(" ", 1)[0] for bar in bars[1:]]
    assert phases[0] == "indexing"
    assert phases.index("sidecar") < phases.index("tagging")
    assert any(bar.startswith("tagging [######") and "3/3 messages" in bar for bar in bars)


def test_index_without_a_terminal_prints_no_carriage_return(mail_env: MailEnv) -> None:
    init_without_index(mail_env)
    done = mail_env.fmail("index")
    assert "\r" not in done.stdout and "\r" not in done.stderr
    assert done.stderr == ""
    assert done.stdout == ("indexed: 169 new, 169 messages in all (inbox 98, unread 15, sent 23, "
                           "list 13, flagged 6, attachment 4)\n")


HOOK_BEFORE = """#!/bin/sh
exec {python} -c 'from fmail_nm.progress import report_progress as r
for done in range(0, 11, 5):
    r("tagging", done, 10)'
"""


def test_the_hooks_progress_reaches_the_bar_through_notmuch_new(mail_env: MailEnv) -> None:
    """A post-new hook that reports (here the user's, chained before ours) is asked for its lines
    through notmuch new, and they are drawn after notmuch's phase; without a terminal it is
    not asked."""
    init_without_index(mail_env)
    hook_dir = mail_env.mail_root / ".notmuch" / "hooks"
    chained = kept_hook(hook_dir, "post-new")
    chained.parent.mkdir()
    chained.write_text(HOOK_BEFORE.format(python=sys.executable), encoding="utf-8")
    chained.chmod(0o755)
    code, out = run_on_pty(mail_env, "index")
    assert code == 0
    parts = out.split("\r")
    indexing = parts.index("indexing [##############################] 171/171 files")
    tagging = parts.index("tagging [##############################] 10/10 messages")
    assert indexing < tagging
    assert "fmail-nm progress" not in out

    # No new mail is needed: the hook runs after every notmuch new.
    events: list[tuple[str, int, int]] = []
    summary = run_index(mail_env.config(), show_progress=False,
                        on_progress=lambda *event: events.append(event))
    # A phase's first and last line always (5/10 came within 0.2 s: most likely left out).
    assert events[0] == ("tagging", 0, 10) and events[-1] == ("tagging", 10, 10)
    assert set(events) <= {("tagging", 0, 10), ("tagging", 5, 10), ("tagging", 10, 10)}
    assert "fmail-nm progress" not in summary.notmuch_output
    lines: list[str] = []
    run_index(mail_env.config(), show_progress=False, on_line=lines.append)
    assert lines and not any("fmail-nm progress" in line for line in lines)  # not asked
