"""The reliability figures: fault injection, load and fuzzing, summed per suite.

    .venv/bin/python -m bench.reliability [--runslow] [--json figures.json] [pytest args...]

Runs the tests marked ``reliability`` (``--runslow`` for the long variants) with
FMAIL_RELIABILITY_LOG set, so each test appends the trials it ran, the faults it injected and
survived, the inputs it tried, and the messages lost and hangs it saw (both must be 0); then
prints one Markdown row per suite, as BENCHMARKS.md ("Reliability") quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

FIGURES = ("trials", "faults", "inputs", "lost", "hangs")


def run_suites(pytest_args: list[str], runslow: bool) -> tuple[int, list[dict[str, object]], float]:
    """Run the reliability tests; return pytest's exit status, the logged lines and the time."""
    with tempfile.TemporaryDirectory(prefix="fmail-reliability-") as tmp:
        log = Path(tmp) / "figures.jsonl"
        argv = [sys.executable, "-m", "pytest", "-m", "reliability", "-q", "-p",
                "no:cacheprovider", *(["--runslow"] if runslow else []), *pytest_args]
        started = time.monotonic()
        status = subprocess.run(argv, env={**os.environ, "FMAIL_RELIABILITY_LOG": str(log)},
                                timeout=6 * 3600).returncode
        elapsed = time.monotonic() - started
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return status, lines, elapsed


def summarise(lines: list[dict[str, object]]) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(FIGURES, 0))
    for line in lines:
        suite = totals[str(line["suite"])]
        for figure in FIGURES:
            suite[figure] += int(line.get(figure, 0))  # type: ignore[call-overload]
    return dict(totals)


def markdown(totals: dict[str, dict[str, int]]) -> str:
    rows = ["| suite | trials | faults survived | inputs tried | messages lost | hangs |",
            "|---|---:|---:|---:|---:|---:|"]
    for suite, figures in sorted(totals.items()):
        rows.append(f"| {suite} | " + " | ".join(str(figures[f]) for f in FIGURES) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runslow", action="store_true", help="the long variants")
    parser.add_argument("--json", type=Path, help="also write the totals here")
    args, pytest_args = parser.parse_known_args()
    status, lines, elapsed = run_suites(pytest_args, args.runslow)
    totals = summarise(lines)
    print(markdown(totals))
    print(f"\npytest exit status {status}, {len(lines)} tests reporting, {elapsed:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"status": status, "seconds": round(elapsed),
                                         "runslow": args.runslow, "suites": totals}, indent=2))
    lost_or_hung = any(f["lost"] or f["hangs"] for f in totals.values())
    return 1 if status or lost_or_hung else 0


if __name__ == "__main__":
    sys.exit(main())
