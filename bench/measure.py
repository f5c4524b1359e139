"""Run one command and report its wall time, CPU time and peak RSS: ``python -S -I
bench/measure.py OUT.json ARGV...``.

Why a launcher, rather than ``os.wait4`` on a child of the bench itself: Linux counts into a
process's ``ru_maxrss`` the memory of the process image it replaced at ``exec`` -- for a child
of the bench, the bench's own resident set (~70 MiB with the corpus loaded), shared at
``fork``/``vfork`` time.  So every step would read "at least the bench's size".  This launcher
is a bare interpreter (``-S -I``: no site, no environment; ~6 MiB) that ``fork``s and ``exec``s
the command and ``wait4``s it: the command's peak RSS (and that of any process it waited for:
notmuch, the hook) comes out floored at the launcher's few MiB instead.  The wall time is taken
here too, around fork and wait, so the launcher's own start-up is not counted.

Writes ``{"status": exit status, "wall": s, "cpu": user+sys s, "maxrss_kib": n}`` and exits
with the command's exit status.  stdin, stdout and stderr pass through to the command.
"""

import os
import sys
import time

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies: a bench that is stopped (or that stops a step
    at its timeout, by killing this launcher) leaves no step running on behind it."""
    import ctypes  # before the fork: ~1 MiB more on the floor of the peak RSS, no more
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 9)


def main(argv: list[str]) -> int:
    out, command = argv[1], argv[2:]
    die_with_parent()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: become the command
        try:
            die_with_parent()
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    import json  # only now: whatever the launcher holds at fork is the floor of the peak RSS
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"status": code, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                   "maxrss_kib": usage.ru_maxrss}, fh)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
