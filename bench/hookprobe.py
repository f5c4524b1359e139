"""fmail-nm's post-new hook with its steps timed: ``python bench/hookprobe.py OUT.json``.

Runs exactly what ``fmail-nm hook post-new`` runs (``fmail_nm.cli.main(["hook", "post-new"])``),
in its own process, after wrapping every function that ``fmail_nm.passes.post_new`` imported
from the rest of fmail_nm (today ``run_tagging``, ``read_blocklist``, ``apply_blocklist``,
``sync_sidecar``) in a timer.  Nothing is assumed about which steps exist: whatever the module
calls through those names is timed, the rest shows up in the caller as the hook's total minus
the steps (interpreter start, imports, opening the database).  Writes ``{"exit": n, "steps":
{name: {"wall", "cpu", "calls"}}}`` to OUT.json.

Run as a script (not ``-m bench.…``) so that only ``fmail_nm`` comes from the import path the
caller set up (``--code`` puts a commit's snapshot first on ``PYTHONPATH``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return ru.ru_utime + ru.ru_stime


def timed(name: str, fn: Callable[..., Any], steps: dict[str, dict[str, float]]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        c, start = cpu(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            step = steps.setdefault(name, {"wall": 0.0, "cpu": 0.0, "calls": 0})
            step["wall"] += time.perf_counter() - start
            step["cpu"] += cpu() - c
            step["calls"] += 1
    return wrapper


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    steps: dict[str, dict[str, float]] = {}
    code = 1
    try:
        from fmail_nm import cli
        try:
            module = importlib.import_module("fmail_nm.passes.post_new")
        except ImportError:  # moved: the hook is still timed as a whole by the caller
            pass
        else:
            for name, value in list(vars(module).items()):
                if (inspect.isfunction(value) and value.__module__ != module.__name__
                        and value.__module__.startswith("fmail_nm.")):
                    setattr(module, name, timed(name, value, steps))
        code = cli.main(["hook", "post-new"])
    finally:
        out.write_text(json.dumps({"exit": code, "steps": steps}), encoding="utf-8")
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
