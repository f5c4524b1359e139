"""When each account's local changes last reached its server, whoever sent them.

``<data_dir>/pushed.json`` maps an account to the start of the last mbsync run that sent its
local changes and went through (a push or a two-way sync): :func:`~fmail_nm.service.mbsync.
run_mbsync` records every such run, so the service's, each MCP server's and ``fmail-nm sync``'s
all count, whether or not their process still runs.  ``fmail-nm status`` settles the writes a
stopped server left local against it: a run that started after they were made sent them
(``mbsync --push`` sends every local change of the channel).
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from ..private import private_dir, private_file, replace_private

log = logging.getLogger(__name__)

PUSHED_FILE = "pushed.json"


def _path(data_dir: Path) -> Path:
    return Path(data_dir) / PUSHED_FILE


def last_pushed(data_dir: Path) -> dict[str, datetime]:
    """Each account's last run that sent its local changes (its start, UTC); a missing or
    damaged file tells none."""
    try:
        stamps = json.loads(_path(data_dir).read_text(encoding="utf-8"))
        return {name: datetime.fromisoformat(at) for name, at in stamps.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        log.warning("ignoring damaged %s: %s", _path(data_dir), exc)
        return {}


def record_pushed(data_dir: Path, started: Mapping[str, datetime]) -> None:
    """Record runs that sent these accounts' local changes, by their start; an earlier start
    than the one recorded changes nothing.  Failing to write is logged: the pushes matter
    more than their record."""
    if not started:
        return
    path = _path(data_dir)
    try:
        private_dir(path.parent)
        private_file(lock_path := path.with_name(f".{PUSHED_FILE}.lock"))
        # Processes record side by side (a server's push, `fmail-nm sync`): one at a time.
        with open(lock_path, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            stamps = last_pushed(data_dir)
            for name, at in started.items():
                stamps[name] = max(at, stamps.get(name, at))
            replace_private(path, json.dumps({n: at.isoformat() for n, at in stamps.items()},
                                             indent=2, sort_keys=True))
    except OSError as exc:
        log.warning("cannot record the push in %s: %s", path, exc)
