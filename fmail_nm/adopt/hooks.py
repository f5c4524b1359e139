"""Install fmail-nm's notmuch hooks without losing the user's own: ``post-new`` and
``post-insert`` (mail ``notmuch insert`` delivers gets the same pass at once, not at the next
``notmuch new``).

A hook already in place (afew, a shell script) is kept under its own name in a folder of its
own, ``<hooks>/before-fmail-nm/<hook>``, and our hook runs it first: a script that tells what
it was called as by its name (one script linked as both ``pre-new`` and ``post-new``) still
sees ``post-new``.  Earlier versions kept it as ``<hooks>/<hook>.before-fmail-nm``; installing
moves it.  Our hooks carry a marker line, so installing again only refreshes them.  A hook of
the user's that comes back where ours was (a dotfiles manager restoring its link) is kept the
same way; two different hooks of the user's are never merged, nor one dropped.
"""

from __future__ import annotations

import errno
import filecmp
import os
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path

from ..passes import PASS_AFTER_ENV
from ..store.mover import NO_HARDLINKS

HOOK_NAMES = ("post-new", "post-insert")
MARKER = "# fmail-nm hook:"
KEPT_DIR = "before-fmail-nm"
# Where earlier versions kept the user's hook: <hook><LEGACY_SUFFIX>, beside ours.
LEGACY_SUFFIX = ".before-fmail-nm"


@dataclass(frozen=True)
class HookAction:
    hook: str
    # "installed", "chained" (the user's hook moved aside and run first), "rechained" (the
    # user's hook came back where ours was: it is the one already kept), "updated", "unchanged";
    # uninstalling: "restored", "removed", "not ours", "not installed"
    action: str
    path: Path
    moved_from: Path | None = None  # where an earlier version had kept the user's hook

    def describe(self) -> str:
        kept = kept_hook(self.path.parent, self.hook)
        if self.action == "restored":
            return f"{self.hook}: your own hook is back at {self.path} (from {self.moved_from})"
        if self.action == "not ours":
            return f"{self.hook}: {self.path} is not fmail-nm's hook; left as it is"
        # notmuch did not run a hook that is not executable; ours skips it the same way
        idle = kept.exists() and not os.access(kept, os.X_OK)
        chmod = f"chmod +x {shlex.quote(str(kept))} to have it run first"
        if self.action == "chained" and idle:
            text = (f"{self.hook}: installed at {self.path}; your previous hook, kept at {kept}, "
                    f"is not executable, so it does not run (nor did it before): {chmod}")
        elif self.action == "chained":
            text = (f"{self.hook}: installed at {self.path}; your previous hook now runs first "
                    f"from {kept}")
        elif self.action == "rechained":
            text = (f"{self.hook}: installed at {self.path} again, over your hook put back there "
                    f"(by a dotfiles manager?), the same one that "
                    + (f"is kept, not executable, at {kept} ({chmod})" if idle
                       else f"runs first from {kept}")
                    + f"; have it install your hook at {kept} instead")
        else:
            text = f"{self.hook}: {self.action} at {self.path}"
        if self.moved_from is not None:
            text += (f"; your own hook moved from {self.moved_from} to {kept}, where it runs "
                     f"under its own name")
        return text


def kept_hook(hook_dir: Path, name: str) -> Path:
    """Where the user's own hook ``name`` is kept, to run before ours."""
    return hook_dir / KEPT_DIR / name


def legacy_kept_hook(hook_dir: Path, name: str) -> Path:
    """Where earlier versions kept it (run as ``<name>.before-fmail-nm``)."""
    return hook_dir / (name + LEGACY_SUFFIX)


def hook_text(name: str, command: list[str]) -> str:
    # Imported here: every index run loads this module (is_ours), few install a hook.
    from importlib.resources import files

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


def same_hook(a: Path, b: Path) -> bool:
    """Whether two entries are one hook: links (or a link and a file) to the same file, or
    two files with the same bytes and mode -- dropping either loses nothing."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    if a.is_symlink() or b.is_symlink():
        return False
    try:
        return (stat.S_IMODE(a.stat().st_mode) == stat.S_IMODE(b.stat().st_mode)
                and filecmp.cmp(a, b, shallow=False))
    except OSError:
        return False


def users_hooks(hook_dir: Path, name: str) -> list[Path]:
    """The user's own hooks called ``name`` in ``hook_dir``: the one kept to run before ours,
    the one an earlier version kept, and one in our hook's place."""
    path = hook_dir / name
    found = [p for p in (kept_hook(hook_dir, name), legacy_kept_hook(hook_dir, name))
             if os.path.lexists(p)]
    if os.path.lexists(path) and not is_ours(path):
        found.append(path)
    return found


def hooks_in_conflict(hook_dir: Path, name: str) -> tuple[Path, Path] | None:
    """Two different hooks of the user's that would both have to run before ours, where
    there is room for one: installing refuses rather than drop or merge either."""
    found = users_hooks(hook_dir, name)
    for other in found[1:]:
        if not same_hook(found[0], other):
            return found[0], other
    return None


def conflict_advice(hook_dir: Path, name: str) -> str:
    return (f"merge them by hand into one hook at {kept_hook(hook_dir, name)}, delete the "
            f"other, then run `fmail-nm init` again")


def _write_executable(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".fmail-nm-tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | stat.S_IRUSR)
    os.replace(tmp, path)


def _move_keeping_target(source: Path, target: Path) -> None:
    """Move a hook into the keeping folder as it is: a file with its bytes and mode, a link
    still pointing where it pointed (a relative link gets one ``..`` more, for the folder)."""
    target.parent.mkdir(exist_ok=True)
    # Never over a hook kept there already (two inits at once: the other may have moved the
    # user's hook in between): both ways fail with FileExistsError instead.
    if source.is_symlink() and not os.path.isabs(link := os.readlink(source)):
        os.symlink(os.path.join("..", link), target)
    else:
        try:
            os.link(source, target, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in NO_HARDLINKS:
                raise
            if os.path.lexists(target):  # no atomic way here: check, then move
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST),
                                      str(target)) from None
            os.replace(source, target)
            return
    source.unlink()


def _move_legacy(hook_dir: Path, name: str) -> Path | None:
    """The user's hook where an earlier version kept it, moved to where it runs under its own
    name; that old place if there was one."""
    legacy, kept = legacy_kept_hook(hook_dir, name), kept_hook(hook_dir, name)
    if not os.path.lexists(legacy):
        return None
    if os.path.lexists(kept):  # the same hook, or hooks_in_conflict would have refused
        legacy.unlink()
    else:
        _move_keeping_target(legacy, kept)
    return legacy


def install_hook(hook_dir: Path, name: str, command: list[str]) -> HookAction:
    """Install our hook ``name``, keeping any hook of the user's to run first; FileExistsError
    (nothing changed) when two different hooks of the user's compete for that place."""
    pair = hooks_in_conflict(hook_dir, name)
    if pair is not None:
        raise FileExistsError(f"{pair[0]} and {pair[1]} are two different {name} hooks of "
                              f"yours, and only one runs before fmail-nm's: "
                              f"{conflict_advice(hook_dir, name)}")
    hook_dir.mkdir(parents=True, exist_ok=True)
    path = hook_dir / name
    moved_from = _move_legacy(hook_dir, name)
    text = hook_text(name, command)
    if not os.path.lexists(path):
        action = "installed"
    elif is_ours(path):
        if path.read_text(encoding="utf-8", errors="replace") == text:
            return HookAction(name, "unchanged", path, moved_from)
        action = "updated"
    elif os.path.lexists(kept_hook(hook_dir, name)):  # the same hook, as checked above
        action = "rechained"
    else:
        _move_keeping_target(path, kept_hook(hook_dir, name))
        action = "chained"
    _write_executable(path, text)
    return HookAction(name, action, path, moved_from)


def install_hooks(hook_dir: Path, command: list[str]) -> list[HookAction]:
    """Install every hook we ship; ``command`` is the argv that runs fmail-nm."""
    return [install_hook(hook_dir, name, command) for name in HOOK_NAMES]


def _put_back(source: Path, target: Path) -> None:
    """Move the user's kept hook back to ``target`` in one step (over our hook, so notmuch
    never finds no hook at all); a relative link gets back the ``..`` it lost."""
    link = os.readlink(source) if source.is_symlink() else None
    if link is None or os.path.isabs(link) or source.parent == target.parent:
        os.replace(source, target)
        return
    tmp = target.with_name(target.name + ".fmail-nm-tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.normpath(os.path.join(source.parent.name, link)), tmp)
    os.replace(tmp, target)
    source.unlink()


def uninstall_hook(hook_dir: Path, name: str) -> HookAction:
    """Take our hook ``name`` out and put the user's own back in its place ("restored"), or
    just remove ours ("removed").  A hook in that place that is not ours is left alone
    ("not ours"), and so is everything kept beside it."""
    path = hook_dir / name
    kept, legacy = kept_hook(hook_dir, name), legacy_kept_hook(hook_dir, name)
    if os.path.lexists(path) and not is_ours(path):
        # Put back by a dotfiles manager: the copy we kept is dropped only if it is that hook.
        if os.path.lexists(kept) and same_hook(path, kept):
            kept.unlink()
            _drop_if_empty(kept.parent)
        return HookAction(name, "not ours", path)
    source = kept if os.path.lexists(kept) else legacy if os.path.lexists(legacy) else None
    if source is not None:
        _put_back(source, path)
        action = "restored"
    elif os.path.lexists(path):
        path.unlink()
        action = "removed"
    else:
        return HookAction(name, "not installed", path)
    _drop_if_empty(kept.parent)
    return HookAction(name, action, path, moved_from=source)


def _drop_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()  # only when empty: anything else in it is the user's
    except OSError:
        pass


def uninstall_hooks(hook_dir: Path) -> list[HookAction]:
    return [uninstall_hook(hook_dir, name) for name in HOOK_NAMES]
