"""``fmail-nm init``: adopt a mail root, or an existing notmuch setup, without harming it.

* No notmuch config yet: write one with the settings this stack needs (``new.tags=new``, mbsync's
  state files ignored, ``deleted;spam`` excluded, flag sync on, the user's addresses).
* A notmuch config already there: leave it alone, and say which settings differ from what
  fmail-nm expects and how the user could change them.
* Either way: install our hooks (chaining any existing ones), then index with ``notmuch new``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Settings, default_data_dir, fmail_command, maildir_folders
from ..passes.mirror import SETUP_REVISION
from ..store import sidecar
from ..store.notmuch import Reader, ensure_database
from ..store.notmuch_cli import notmuch_settings
from ..tags import DEFAULT_EXCLUDED
from .hooks import HookAction, install_hooks

MBSYNC_STATE_FILES = (".mbsyncstate", ".mbsyncstate.journal", ".mbsyncstate.new",
                      ".mbsyncstate.lock", ".uidvalidity")
EXCLUDE_TAGS = DEFAULT_EXCLUDED


@dataclass
class InitReport:
    notmuch_config: Path
    wrote_config: bool
    hooks: list[HookAction] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    repaired_folders: list[str] = field(default_factory=list)


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


def new_config_path(explicit: str | None = None) -> Path:
    """Where a new config goes: the explicit or $NOTMUCH_CONFIG path, else ~/.notmuch-config
    (what ``notmuch setup`` writes)."""
    return notmuch_config_candidates(explicit)[-1]


def render_notmuch_config(mail_root: Path, name: str, addresses: list[str]) -> str:
    primary = addresses[0] if addresses else ""
    others = ";".join(addresses[1:])
    return f"""\
# notmuch configuration written by `fmail-nm init`; edit freely, fmail-nm never rewrites it.
# See notmuch-config(1).

[database]
path={mail_root}

[user]
name={name}
primary_email={primary}
other_email={others}

[new]
# What notmuch gives new mail; fmail-nm's post-new hook then changes only the exceptions
# (your own mail gets sent, list mail list, mail in Trash/Junk/Archive leaves the inbox).
tags=inbox;unread
# mbsync's bookkeeping files are not mail.
ignore={";".join(MBSYNC_STATE_FILES)}

[search]
exclude_tags={";".join(EXCLUDE_TAGS)}

[maildir]
# Keep Maildir flags (S, F, R, D, P) and tags in step, so mbsync carries them to the server.
synchronize_flags=true
"""


def advice_for_existing(nm: dict[str, str]) -> list[str]:
    """What differs from fmail-nm's expectations in a user's own config, with the fix."""
    advice = []
    new_tags = [t for t in nm.get("new.tags", "").split(";") if t]
    if "new" in new_tags:
        faster = [t for t in new_tags if t != "new"]
        faster += [t for t in ("inbox", "unread") if t not in faster]
        advice.append("new.tags includes 'new': fmail-nm's tagging pass works with it, but must "
                      "rewrite every new message once to take 'new' off again; without it only "
                      "the exceptions are rewritten (if no other tool of yours relies on 'new'): "
                      f"notmuch config set new.tags '{';'.join(faster)}'")
    ignored = set(nm.get("new.ignore", "").split(";"))
    missing = [f for f in MBSYNC_STATE_FILES if f not in ignored]
    if missing:
        current = [t for t in nm.get("new.ignore", "").split(";") if t]
        advice.append("notmuch new will warn about mbsync's state files; to silence it: "
                      f"notmuch config set new.ignore '{';'.join(current + missing)}'")
    if nm.get("maildir.synchronize_flags", "true") != "true":
        advice.append("maildir.synchronize_flags is off: read/flagged changes will not reach the "
                      "server through mbsync")
    excluded = set(nm.get("search.exclude_tags", "").split(";"))
    if not set(EXCLUDE_TAGS) <= excluded:
        advice.append("search.exclude_tags lacks deleted;spam; fmail-nm hides them in its own "
                      "searches regardless")
    return advice


def repair_maildirs(mail_root: Path, folders: list[str]) -> list[str]:
    """Create missing cur/new/tmp in Maildir folders (git, rsync and backups drop empty dirs)."""
    repaired = []
    for folder in folders:
        base = mail_root / folder
        missing = [d for d in ("cur", "new", "tmp") if not (base / d).is_dir()]
        for d in missing:
            (base / d).mkdir(parents=True, exist_ok=True)
        if missing:
            repaired.append(folder)
    return repaired


def ensure_notmuch_config(explicit: str | None, mail_root: Path | None, name: str,
                          addresses: list[str]) -> tuple[Path, bool]:
    """The config to use, and whether we wrote it."""
    existing = find_notmuch_config(explicit)
    if existing is not None:
        return existing, False
    if mail_root is None:
        raise FileNotFoundError(
            "no notmuch config found and no mail root given: run `fmail-nm init --mail-root DIR`"
        )
    if not mail_root.is_dir():
        raise FileNotFoundError(f"mail root {mail_root} does not exist")
    target = new_config_path(explicit)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_notmuch_config(mail_root.resolve(), name, addresses), encoding="utf-8")
    return target, True


def prepare(settings: Settings, *, notmuch_config: str | None, mail_root: Path | None,
            name: str, addresses: list[str]) -> InitReport:
    """Everything init does before indexing: config, maildir repair and hooks."""
    config_path, wrote = ensure_notmuch_config(notmuch_config, mail_root, name, addresses)
    # The hook directory is only resolved once a database exists.
    ensure_database(config_path)
    nm = notmuch_settings(config_path)
    report = InitReport(notmuch_config=config_path, wrote_config=wrote)
    if not wrote:
        report.advice = advice_for_existing(nm)
    root = Path(nm["database.mail_root"])
    report.repaired_folders = repair_maildirs(root, maildir_folders(root))
    report.hooks = install_hooks(Path(nm["database.hook_dir"]), fmail_command(settings))
    mark_setup_revision(settings, str(config_path))
    return report


def mark_setup_revision(settings: Settings, config_path: str) -> None:
    """Record the notmuch revision fmail-nm was set up at, unless the sidecar is built already:
    the first post-new pass then tags what is indexed after it -- whoever runs that first
    ``notmuch new`` -- and never the mail that was there before."""
    with sidecar.opened(sidecar.sidecar_path(settings.data_dir or default_data_dir())) as conn:
        if sidecar.get_state(conn, "notmuch_uuid") is not None:
            return
        with Reader(config_path) as reader, sidecar.transaction(conn):
            sidecar.set_state(conn, SETUP_REVISION, str(reader.revision().number))
