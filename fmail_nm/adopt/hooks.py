"""Install fmail-nm's notmuch hooks without losing the user's own.

A hook already in place (afew, a shell script) is renamed to ``<hook>.before-fmail-nm`` and our
hook runs it first.  Our hooks carry a marker line, so installing again only refreshes them.
"""

from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from ..passes import PASS_AFTER_ENV

HOOK_NAMES = ("post-new",)
MARKER = "# fmail-nm hook:"
CHAINED_SUFFIX = ".before-fmail-nm"


@dataclass(frozen=True)
class HookAction:
    hook: str
    action: str  # "installed", "chained", "updated", "unchanged"
    path: Path

    def describe(self) -> str:
        if self.action == "chained":
            return (f"{self.hook}: installed at {self.path}; your previous hook now runs first "
                    f"from {self.path.name}{CHAINED_SUFFIX}")
        return f"{self.hook}: {self.action} at {self.path}"


def hook_text(name: str, command: list[str]) -> str:
    template = (files("fmail_nm.hooks") / name).read_text(encoding="utf-8")
    return template.replace("@FMAIL_NM@", shlex.join(command))


def is_ours(path: Path) -> bool:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            head = fh.read(512)
    except OSError:
        return False
    return MARKER in head


def defers_pass(path: Path) -> bool:
    """Whether the installed hook is ours and leaves the post-new pass to ``fmail-nm index``
    when asked (:data:`~fmail_nm.passes.PASS_AFTER_ENV`); hooks installed by earlier
    versions always run it."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return MARKER in text[:512] and PASS_AFTER_ENV in text


def _write_executable(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".fmail-nm-tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | stat.S_IRUSR)
    os.replace(tmp, path)


def install_hook(hook_dir: Path, name: str, command: list[str]) -> HookAction:
    hook_dir.mkdir(parents=True, exist_ok=True)
    path = hook_dir / name
    text = hook_text(name, command)
    if path.exists() or path.is_symlink():
        if is_ours(path):
            if path.read_text(encoding="utf-8", errors="replace") == text:
                return HookAction(name, "unchanged", path)
            _write_executable(path, text)
            return HookAction(name, "updated", path)
        chained = hook_dir / (name + CHAINED_SUFFIX)
        if chained.exists() or chained.is_symlink():  # a dangling link is the user's too
            raise FileExistsError(
                f"{path} is not fmail-nm's and {chained} already exists; merge them by hand"
            )
        os.replace(path, chained)
        _write_executable(path, text)
        return HookAction(name, "chained", path)
    _write_executable(path, text)
    return HookAction(name, "installed", path)


def install_hooks(hook_dir: Path, command: list[str]) -> list[HookAction]:
    """Install every hook we ship; ``command`` is the argv that runs fmail-nm."""
    return [install_hook(hook_dir, name, command) for name in HOOK_NAMES]
