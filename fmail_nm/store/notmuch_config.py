"""Where libnotmuch finds its configuration file, found in its order (notmuch-config(1)):
for the bindings, the ``notmuch`` program and the set-up alike."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

def _profile() -> str:
    return os.environ.get("NOTMUCH_PROFILE", "")


def notmuch_config_candidates(explicit: str | None = None) -> list[Path]:
    """Where libnotmuch looks for its config, in its order (notmuch-config(1))."""
    if explicit:
        return [Path(explicit).expanduser()]
    if os.environ.get("NOTMUCH_CONFIG"):
        return [Path(os.environ["NOTMUCH_CONFIG"]).expanduser()]
    profile = _profile()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    home = Path.home() / (".notmuch-config" + (f".{profile}" if profile else ""))
    return [xdg / "notmuch" / (profile or "default") / "config", home]


def find_notmuch_config(explicit: str | None = None) -> Path | None:
    for candidate in notmuch_config_candidates(explicit):
        if candidate.is_file():
            return candidate
    return None


def notmuch_program(config: str | os.PathLike[str] | None) -> str:
    """How a printed fix runs notmuch on ``config``: ``notmuch``, or ``notmuch --config=...``
    when notmuch would find another config by itself (the fix must change the one it is
    about)."""
    if config is None:
        return "notmuch"
    path = Path(config).expanduser()
    found = find_notmuch_config()
    if found is not None and found.absolute() == path.absolute():
        return "notmuch"
    return f"notmuch --config={shlex.quote(str(path))}"


def new_config_path(explicit: str | None = None) -> Path:
    """Where a new config goes: the explicit or $NOTMUCH_CONFIG path, else ~/.notmuch-config
    (what ``notmuch setup`` writes)."""
    return notmuch_config_candidates(explicit)[-1]


def config_chosen_by_environment() -> Path | None:
    """The config $NOTMUCH_CONFIG or $NOTMUCH_PROFILE picks (whether it exists yet or not):
    a program started without that environment -- by an MCP client, by systemd -- would
    find another one, or none."""
    if os.environ.get("NOTMUCH_CONFIG"):
        return Path(os.environ["NOTMUCH_CONFIG"]).expanduser().absolute()
    if _profile():
        found = find_notmuch_config()
        return found.absolute() if found is not None else new_config_path().absolute()
    return None


def config_bool(value: str | None, default: bool) -> bool:
    """A boolean setting as libnotmuch reads it: true/yes/1 and false/no/0 in any case;
    anything else (or nothing) is ``default``."""
    word = (value or "").strip().lower()
    if word in ("true", "yes", "1"):
        return True
    if word in ("false", "no", "0"):
        return False
    return default


def config_list(value: str | None) -> list[str]:
    """A ``;``-separated setting as libnotmuch reads it: each item trimmed of spaces, empty
    items dropped (``new.ignore=.uidvalidity; .mbsyncstate`` ignores both)."""
    return [item.strip() for item in (value or "").split(";") if item.strip()]


def file_stamp(path: Path | None) -> tuple[int, int, int] | None:
    """What changes when a file is rewritten or replaced; None when it is not there."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
