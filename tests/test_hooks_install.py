"""Installing fmail-nm's notmuch hooks (fmail_nm.adopt.hooks): a fresh install, re-installs,
keeping and chaining the user's own hook, and what the installed script really does when run."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from fmail_nm.adopt.hooks import (
    KEPT_DIR,
    MARKER,
    HookAction,
    hook_text,
    install_hook,
    install_hooks,
    is_ours,
    kept_hook,
    legacy_kept_hook,
)

from .conftest import EARLIER_POST_NEW_HOOK, MailEnv, link_multicall_hook

LEGACY = "post-new.before-fmail-nm"  # where versions before this one kept the user's hook
EXEC_BITS = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH

# A stand-in for fmail-nm: appends "fmail <NOTMUCH_CONFIG> <args...>" to $MARKER_FILE.
FAKE_FMAIL = """#!/bin/sh
printf 'fmail|%s|%s\\n' "$NOTMUCH_CONFIG" "$*" >> "$MARKER_FILE"
exit "${FAKE_FMAIL_STATUS:-0}"
"""

# The user's own hook: appends "user <NOTMUCH_CONFIG> <argc>" to $MARKER_FILE.
USER_HOOK = b"""#!/bin/sh
# my own post-new hook (afew, say) \xc3\xa9 and a stray byte \xff
printf 'user|%s|%s\\n' "$NOTMUCH_CONFIG" "$#" >> "$MARKER_FILE"
exit "${USER_HOOK_STATUS:-0}"
"""


def fake_fmail(base: Path) -> list[str]:
    """An executable at a path with a space and a single quote in it; returns its argv."""
    folder = base / "my tools" / "it's here"
    folder.mkdir(parents=True)
    script = folder / "fake fmail"
    script.write_text(FAKE_FMAIL)
    script.chmod(0o755)
    return [str(script)]


def run_hook(hook: Path, marker: Path, *, runner: tuple[str, ...] = ("bash",),
             notmuch_config: str = "/cfg dir/notmuch config", cwd: Path | None = None,
             **extra: str) -> subprocess.CompletedProcess[str]:
    """Run the installed hook as notmuch would (NOTMUCH_CONFIG set), from another directory."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NOTMUCH_CONFIG": notmuch_config,
           "MARKER_FILE": str(marker), **extra}
    return subprocess.run([*runner, str(hook)], check=False, env=env,
                          cwd=cwd or hook.parent.parent,
                          capture_output=True, text=True, timeout=30)


def lines(marker: Path) -> list[str]:
    return marker.read_text().splitlines() if marker.exists() else []


def snapshot(path: Path) -> tuple[bytes, int, int, int]:
    st = path.lstat()
    return path.read_bytes(), st.st_mtime_ns, st.st_ino, st.st_mode


# ---------------------------------------------------------------------------------------------
# The template and a fresh install


def test_hook_text_fills_the_shipped_template() -> None:
    text = hook_text("post-new", ["/opt/fmail nm/bin/fmail-nm", "--config", "/x/it's.toml"])
    assert text.startswith("#!/bin/sh\n")
    assert MARKER in text[:512]
    assert "@FMAIL_NM@" not in text
    command_line = next(line for line in text.splitlines() if "hook post-new" in line)
    # The command line, split as sh splits it, is exactly the argv given, then the hook call.
    assert shlex.split(command_line.split("||")[0]) == [
        "/opt/fmail nm/bin/fmail-nm", "--config", "/x/it's.toml", "hook", "post-new"]


def install_post_new(hook_dir: Path, command: list[str]) -> list[HookAction]:
    """What install_hooks does for post-new alone: every hook is kept and chained the same
    way, so the tests of that way install one."""
    return [install_hook(hook_dir, "post-new", command)]


def test_fresh_hook_dir_gets_executable_hooks_of_ours(tmp_path: Path) -> None:
    hook_dir = tmp_path / "notmuch" / "hooks"  # does not exist yet
    command = ["/usr/local/bin/fmail nm", "--config", "/home/a/it's mine.toml"]
    actions = install_hooks(hook_dir, command)
    names = ["post-new", "post-insert"]
    assert actions == [HookAction(name, "installed", hook_dir / name) for name in names]
    hook = hook_dir / "post-new"
    assert "installed" in actions[0].describe() and str(hook) in actions[0].describe()
    assert sorted(p.name for p in hook_dir.iterdir()) == sorted(names)  # no temp file left
    for name in names:
        hook = hook_dir / name
        assert hook.is_file() and not hook.is_symlink()
        assert hook.stat().st_mode & stat.S_IXUSR and os.access(hook, os.X_OK)
        assert is_ours(hook)
        assert hook.read_text() == hook_text(name, command)
        assert f"{shlex.join(command)} hook {name} " in hook.read_text()


def test_is_ours_only_for_our_marker(tmp_path: Path) -> None:
    assert not is_ours(tmp_path / "missing")
    assert not is_ours(tmp_path)  # a directory
    user = tmp_path / "user"
    user.write_bytes(USER_HOOK)
    assert not is_ours(user)
    install_hook(tmp_path / "h", "post-new", ["fmail-nm"])
    assert is_ours(tmp_path / "h" / "post-new")


@pytest.mark.parametrize("runner", [("bash",), ()], ids=["bash", "exec"])
def test_command_with_space_and_quote_in_its_path_runs_with_its_exact_argv(
        tmp_path: Path, runner: tuple[str, ...]) -> None:
    command = fake_fmail(tmp_path)
    hook_dir = tmp_path / "hooks"
    install_post_new(hook_dir, command)
    marker = tmp_path / "marker"
    done = run_hook(hook_dir / "post-new", marker, runner=runner)
    assert done.returncode == 0, done.stderr
    assert lines(marker) == ["fmail|/cfg dir/notmuch config|hook post-new"]


def test_command_arguments_are_not_evaluated_by_the_shell(tmp_path: Path) -> None:
    command = [*fake_fmail(tmp_path), "$(touch PWNED)", "`touch PWNED2`", "a;touch PWNED3", "*"]
    hook_dir = tmp_path / "hooks"
    install_post_new(hook_dir, command)
    marker = tmp_path / "marker"
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "some-file").write_text("")
    done = run_hook(hook_dir / "post-new", marker, cwd=work)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in work.iterdir()) == ["some-file"]
    assert lines(marker) == [
        "fmail|/cfg dir/notmuch config|$(touch PWNED) `touch PWNED2` a;touch PWNED3 * hook post-new"]


# ---------------------------------------------------------------------------------------------
# Installing again


def test_installing_twice_changes_nothing(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hooks"
    install_post_new(hook_dir, ["fmail-nm"])
    hook = hook_dir / "post-new"
    before = snapshot(hook)
    again = install_post_new(hook_dir, ["fmail-nm"])
    assert again == [HookAction("post-new", "unchanged", hook)]
    assert snapshot(hook) == before  # same bytes, mtime, inode, mode
    assert sorted(p.name for p in hook_dir.iterdir()) == ["post-new"]


def test_a_new_command_updates_our_hook_without_chaining_it(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hooks"
    install_post_new(hook_dir, ["/old/fmail-nm"])
    actions = install_post_new(hook_dir, ["/new/fmail-nm", "--config", "/c.toml"])
    hook = hook_dir / "post-new"
    assert actions == [HookAction("post-new", "updated", hook)]
    assert hook.read_text() == hook_text("post-new", ["/new/fmail-nm", "--config", "/c.toml"])
    assert "/old/fmail-nm" not in hook.read_text()
    assert os.access(hook, os.X_OK)
    assert sorted(p.name for p in hook_dir.iterdir()) == ["post-new"]  # ours is never chained


# ---------------------------------------------------------------------------------------------
# The user's own hook


def user_hook(hook_dir: Path, mode: int = 0o750, name: str = "post-new") -> Path:
    hook_dir.mkdir(parents=True, exist_ok=True)
    path = hook_dir / name
    path.write_bytes(USER_HOOK)
    path.chmod(mode)
    return path


def dotfiles_hook(tmp_path: Path, data: bytes = USER_HOOK) -> Path:
    """A hook kept in a dotfiles folder, as stow or home-manager link it into place."""
    target = tmp_path / "dotfiles" / "post-new"
    target.parent.mkdir()
    target.write_bytes(data)
    target.chmod(0o755)
    return target


def test_a_users_hook_is_kept_byte_for_byte_and_chained(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hooks"
    user_hook(hook_dir, 0o750)
    actions = install_post_new(hook_dir, ["fmail-nm"])
    hook, chained = hook_dir / "post-new", kept_hook(hook_dir, "post-new")
    assert chained == hook_dir / KEPT_DIR / "post-new"  # under its own name
    assert actions == [HookAction("post-new", "chained", hook)]
    assert str(chained) in actions[0].describe()
    assert chained.read_bytes() == USER_HOOK
    assert stat.S_IMODE(chained.stat().st_mode) == 0o750
    assert is_ours(hook) and os.access(hook, os.X_OK)
    assert sorted(p.name for p in hook_dir.iterdir()) == [KEPT_DIR, "post-new"]

    chained_before, hook_before = snapshot(chained), snapshot(hook)
    assert install_post_new(hook_dir, ["fmail-nm"]) == [HookAction("post-new", "unchanged", hook)]
    assert snapshot(chained) == chained_before and snapshot(hook) == hook_before
    # a new command refreshes our hook only; the user's stays as it is
    assert install_post_new(hook_dir, ["fmail-nm", "-v"])[0].action == "updated"
    assert snapshot(chained) == chained_before


@pytest.mark.parametrize("runner", [("bash",), ()], ids=["bash", "exec"])
def test_installed_hook_runs_the_users_hook_first_then_ours(
        tmp_path: Path, runner: tuple[str, ...]) -> None:
    hook_dir = tmp_path / "notmuch dir" / "hooks"
    user_hook(hook_dir)
    install_post_new(hook_dir, fake_fmail(tmp_path))
    marker = tmp_path / "marker"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_hook(hook_dir / "post-new", marker, runner=runner, cwd=elsewhere,
                    notmuch_config="/home/a/my notmuch/config")
    assert done.returncode == 0, done.stderr
    assert lines(marker) == ["user|/home/a/my notmuch/config|0",
                             "fmail|/home/a/my notmuch/config|hook post-new"]


def test_a_failing_users_hook_still_lets_ours_run_and_its_status_is_kept(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hooks"
    user_hook(hook_dir)
    install_post_new(hook_dir, fake_fmail(tmp_path))
    marker = tmp_path / "marker"
    done = run_hook(hook_dir / "post-new", marker, USER_HOOK_STATUS="3")
    assert done.returncode == 3
    assert [line.split("|")[0] for line in lines(marker)] == ["user", "fmail"]

    marker.unlink()
    done = run_hook(hook_dir / "post-new", marker, FAKE_FMAIL_STATUS="5")
    assert done.returncode == 5
    assert [line.split("|")[0] for line in lines(marker)] == ["user", "fmail"]


@pytest.mark.parametrize("layout", ["kept", "legacy"])
def test_an_existing_chained_hook_is_never_overwritten(tmp_path: Path, layout: str) -> None:
    hook_dir = tmp_path / "hooks"
    user_hook(hook_dir)
    chained = (kept_hook if layout == "kept" else legacy_kept_hook)(hook_dir, "post-new")
    chained.parent.mkdir(exist_ok=True)
    chained.write_bytes(b"#!/bin/sh\necho an older hook the user keeps\n")
    chained.chmod(0o700)
    listing = sorted(p.name for p in hook_dir.iterdir())
    hook_before, chained_before = snapshot(hook_dir / "post-new"), snapshot(chained)
    with pytest.raises(FileExistsError, match="merge them by hand") as refused:
        install_post_new(hook_dir, ["fmail-nm"])
    assert str(hook_dir / "post-new") in str(refused.value) and str(chained) in str(refused.value)
    assert snapshot(hook_dir / "post-new") == hook_before
    assert snapshot(chained) == chained_before
    assert sorted(p.name for p in hook_dir.iterdir()) == listing


def test_a_leftover_chained_hook_without_post_new_is_kept_and_run(tmp_path: Path) -> None:
    """No post-new but a kept before-fmail-nm/post-new (say the user deleted our hook): a plain
    install, which leaves the old file alone -- and the new hook runs it again."""
    hook_dir = tmp_path / "hooks"
    user_hook(hook_dir)
    chained = kept_hook(hook_dir, "post-new")
    chained.parent.mkdir()
    (hook_dir / "post-new").rename(chained)
    chained_before = snapshot(chained)
    actions = install_post_new(hook_dir, fake_fmail(tmp_path))
    assert [a.action for a in actions] == ["installed"]
    assert snapshot(chained) == chained_before
    marker = tmp_path / "marker"
    assert run_hook(hook_dir / "post-new", marker).returncode == 0
    assert [line.split("|")[0] for line in lines(marker)] == ["user", "fmail"]


def test_a_dangling_chained_symlink_is_not_overwritten(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hooks"
    user_hook(hook_dir)
    chained = kept_hook(hook_dir, "post-new")
    chained.parent.mkdir()
    chained.symlink_to(tmp_path / "dotfiles" / "old-post-new")  # target not there (yet)
    try:
        install_post_new(hook_dir, ["fmail-nm"])
    except FileExistsError:
        pass
    assert chained.is_symlink()
    assert os.readlink(chained) == str(tmp_path / "dotfiles" / "old-post-new")


def test_a_non_executable_users_hook_is_kept_but_not_run(tmp_path: Path) -> None:
    """notmuch itself refuses a post-new it cannot execute ("hook access failed"); after the
    install it is chained as it is (mode kept) and our hook skips it without a word."""
    hook_dir = tmp_path / "hooks"
    user_hook(hook_dir, 0o644)
    actions = install_post_new(hook_dir, fake_fmail(tmp_path))
    chained = kept_hook(hook_dir, "post-new")
    assert [a.action for a in actions] == ["chained"]
    assert chained.read_bytes() == USER_HOOK
    assert stat.S_IMODE(chained.stat().st_mode) == 0o644
    assert os.access(hook_dir / "post-new", os.X_OK)
    marker = tmp_path / "marker"
    done = run_hook(hook_dir / "post-new", marker)
    assert done.returncode == 0 and done.stderr == ""
    assert lines(marker) == ["fmail|/cfg dir/notmuch config|hook post-new"]


def test_installing_says_when_the_kept_users_hook_will_not_run(tmp_path: Path) -> None:
    """A hook notmuch could not execute is not said to "run first" now: init names it and
    what makes it run."""
    hook_dir = tmp_path / "hooks"
    user_hook(hook_dir, 0o644)
    command = fake_fmail(tmp_path)
    [action] = install_post_new(hook_dir, command)
    chained = kept_hook(hook_dir, "post-new")
    assert "runs first" not in action.describe()
    assert f"chmod +x {chained}" in action.describe()

    # Put back by a dotfiles manager and chained again: still not said to run.
    user_hook(hook_dir, 0o644)
    [again] = install_post_new(hook_dir, command)
    assert again.action == "rechained" and "runs first" not in again.describe()
    assert f"chmod +x {chained}" in again.describe()


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_a_symlinked_users_hook_is_chained_as_the_link_and_still_runs(
        tmp_path: Path, relative: bool) -> None:
    target = dotfiles_hook(tmp_path)
    hook_dir = tmp_path / "hooks"
    hook_dir.mkdir()
    link_text = "../dotfiles/post-new" if relative else str(target)
    (hook_dir / "post-new").symlink_to(link_text)
    actions = install_post_new(hook_dir, fake_fmail(tmp_path))
    chained = kept_hook(hook_dir, "post-new")
    assert [a.action for a in actions] == ["chained"]
    # The link moved, still pointing at the same file: one folder down, a relative one gets a ..
    assert chained.is_symlink()
    assert os.readlink(chained) == (os.path.join("..", link_text) if relative else link_text)
    assert chained.resolve() == target.resolve()
    assert target.read_bytes() == USER_HOOK  # the dotfile itself untouched
    hook = hook_dir / "post-new"
    assert not hook.is_symlink() and is_ours(hook)
    marker = tmp_path / "marker"
    assert run_hook(hook, marker).returncode == 0
    assert [line.split("|")[0] for line in lines(marker)] == ["user", "fmail"]


def test_a_dangling_symlink_hook_is_chained_and_skipped(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hooks"
    hook_dir.mkdir()
    (hook_dir / "post-new").symlink_to(tmp_path / "gone")
    actions = install_post_new(hook_dir, fake_fmail(tmp_path))
    assert [a.action for a in actions] == ["chained"]
    assert os.readlink(kept_hook(hook_dir, "post-new")) == str(tmp_path / "gone")
    marker = tmp_path / "marker"
    done = run_hook(hook_dir / "post-new", marker)
    assert done.returncode == 0
    assert lines(marker) == ["fmail|/cfg dir/notmuch config|hook post-new"]


def test_a_symlink_to_an_older_hook_of_ours_is_replaced_by_a_file(tmp_path: Path) -> None:
    """post-new a symlink to one of our hooks elsewhere (a dotfiles repo): refreshing it
    replaces the link with a regular file and leaves the link's target as it was."""
    target = dotfiles_hook(tmp_path, hook_text("post-new", ["/old/fmail-nm"]).encode())
    hook_dir = tmp_path / "hooks"
    hook_dir.mkdir()
    (hook_dir / "post-new").symlink_to(target)

    assert [a.action for a in install_post_new(hook_dir, ["/old/fmail-nm"])] == ["unchanged"]
    assert (hook_dir / "post-new").is_symlink()

    assert [a.action for a in install_post_new(hook_dir, ["/new/fmail-nm"])] == ["updated"]
    hook = hook_dir / "post-new"
    assert not hook.is_symlink()
    assert hook.read_text() == hook_text("post-new", ["/new/fmail-nm"])
    assert target.read_text() == hook_text("post-new", ["/old/fmail-nm"])
    assert not (hook_dir / KEPT_DIR).exists()


# ---------------------------------------------------------------------------------------------
# The user's hook runs under its own name, through real notmuch new


def users_notmuch_with_multicall_hook(env: MailEnv, monkeypatch: pytest.MonkeyPatch, *,
                                      relative: bool) -> tuple[Path, Path, Path]:
    """A user's notmuch config and one hook script linked as pre-new and post-new; the hook
    folder, the script, and the log its branches (and our stand-in for fmail-nm) write to."""
    env.notmuch_config.write_text(f"[database]\npath={env.mail_root}\n")
    hook_dir = env.mail_root / ".notmuch" / "hooks"
    script = env.base / "bin" / "nm-hooks"
    link_multicall_hook(hook_dir, script, relative=relative)
    log = env.base / "hook.log"
    monkeypatch.setenv("HOOK_LOG", str(log))
    monkeypatch.setenv("MARKER_FILE", str(log))
    return hook_dir, script, log


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_a_multicall_users_hook_still_runs_its_post_new_branch(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch, relative: bool) -> None:
    hook_dir, script, log = users_notmuch_with_multicall_hook(mail_env, monkeypatch,
                                                             relative=relative)
    assert [a.action for a in install_post_new(hook_dir, fake_fmail(mail_env.base))] == ["chained"]
    assert kept_hook(hook_dir, "post-new").resolve() == script
    done = mail_env.notmuch("new", check=False)
    assert done.returncode == 0, done.stderr
    assert lines(log) == ["pre-new", "post-new", f"fmail|{mail_env.notmuch_config}|hook post-new"]


def test_notmuch_insert_runs_the_users_post_insert_hook_then_ours(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    mail_env.notmuch_config.write_text(f"[database]\npath={mail_env.mail_root}\n")
    mail_env.notmuch("new", "--no-hooks")
    hook_dir = mail_env.mail_root / ".notmuch" / "hooks"
    user_hook(hook_dir, name="post-insert")
    marker = mail_env.base / "marker"
    monkeypatch.setenv("MARKER_FILE", str(marker))
    assert "post-insert" in [a.hook for a in install_hooks(hook_dir, fake_fmail(mail_env.base))
                             if a.action == "chained"]
    assert kept_hook(hook_dir, "post-insert").read_bytes() == USER_HOOK
    done = subprocess.run(["notmuch", "insert", "--create-folder", "--folder=in"],
                          input=b"Subject: hi\nMessage-ID: <hi@example.com>\n\nhi\n",
                          env={**os.environ, **mail_env.env}, capture_output=True, check=False)
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert lines(marker) == [f"user|{mail_env.notmuch_config}|0",
                             f"fmail|{mail_env.notmuch_config}|hook post-insert"]


def chain_the_earlier_way(hook_dir: Path, command: list[str]) -> Path:
    """What init did before: the user's post-new renamed post-new.before-fmail-nm and our hook
    of then, running it under that name, in its place."""
    legacy = legacy_kept_hook(hook_dir, "post-new")
    assert legacy.name == LEGACY
    (hook_dir / "post-new").rename(legacy)
    (hook_dir / "post-new").write_text(EARLIER_POST_NEW_HOOK.replace("@FMAIL_NM@",
                                                                     shlex.join(command)))
    (hook_dir / "post-new").chmod(0o755)
    return legacy


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_a_hook_chained_the_earlier_way_moves_to_run_under_its_own_name(
        mail_env: MailEnv, monkeypatch: pytest.MonkeyPatch, relative: bool) -> None:
    hook_dir, script, log = users_notmuch_with_multicall_hook(mail_env, monkeypatch,
                                                             relative=relative)
    command = fake_fmail(mail_env.base)
    legacy = chain_the_earlier_way(hook_dir, command)
    link = os.readlink(legacy)
    mail_env.notmuch("new", check=False)
    assert lines(log)[:2] == ["pre-new", f"run as {legacy}"]  # why it moves
    log.unlink()

    actions = install_post_new(hook_dir, command)
    hook, kept = hook_dir / "post-new", kept_hook(hook_dir, "post-new")
    assert actions == [HookAction("post-new", "updated", hook, moved_from=legacy)]
    assert str(legacy) in actions[0].describe() and str(kept) in actions[0].describe()
    assert not os.path.lexists(legacy)
    assert kept.is_symlink()  # still a link, to the same script
    assert os.readlink(kept) == (os.path.join("..", link) if relative else link)
    assert kept.resolve() == script
    assert sorted(p.name for p in hook_dir.iterdir()) == [KEPT_DIR, "post-new", "pre-new"]
    done = mail_env.notmuch("new", check=False)
    assert done.returncode == 0, done.stderr
    assert lines(log) == ["pre-new", "post-new", f"fmail|{mail_env.notmuch_config}|hook post-new"]
    assert install_post_new(hook_dir, command) == [HookAction("post-new", "unchanged", hook)]


def test_a_file_chained_the_earlier_way_moves_as_it_is(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hooks"
    user_hook(hook_dir, 0o700)
    command = fake_fmail(tmp_path)
    legacy = chain_the_earlier_way(hook_dir, command)
    before = snapshot(legacy)
    install_post_new(hook_dir, command)
    assert snapshot(kept_hook(hook_dir, "post-new")) == before  # bytes, mtime, inode, mode
    marker = tmp_path / "marker"
    assert run_hook(hook_dir / "post-new", marker).returncode == 0
    assert [line.split("|")[0] for line in lines(marker)] == ["user", "fmail"]


@pytest.mark.parametrize("same", [True, False], ids=["same", "different"])
def test_a_hook_kept_both_ways_is_dropped_only_when_it_is_the_same(
        tmp_path: Path, same: bool) -> None:
    target = dotfiles_hook(tmp_path)
    hook_dir = tmp_path / "hooks"
    install_post_new(hook_dir, ["fmail-nm"])
    kept, legacy = kept_hook(hook_dir, "post-new"), legacy_kept_hook(hook_dir, "post-new")
    kept.parent.mkdir()
    kept.symlink_to(target)
    if same:
        legacy.symlink_to(os.path.relpath(target, hook_dir))
        install_post_new(hook_dir, ["fmail-nm"])
        assert not os.path.lexists(legacy)
        assert os.readlink(kept) == str(target)
        return
    legacy.write_bytes(b"#!/bin/sh\necho another hook\n")
    with pytest.raises(FileExistsError, match="merge them by hand") as refused:
        install_post_new(hook_dir, ["fmail-nm"])
    assert str(kept) in str(refused.value) and str(legacy) in str(refused.value)
    assert legacy.read_bytes() == b"#!/bin/sh\necho another hook\n"
    assert os.readlink(kept) == str(target)


# ---------------------------------------------------------------------------------------------
# The user's hook put back in our hook's place (a dotfiles manager restoring its link)


@pytest.mark.parametrize("how", ["absolute link", "relative link", "copy"])
def test_a_users_hook_put_back_after_chaining_is_chained_again(tmp_path: Path, how: str) -> None:
    target = dotfiles_hook(tmp_path)
    hook_dir = tmp_path / "hooks"
    hook_dir.mkdir()
    hook, kept = hook_dir / "post-new", kept_hook(hook_dir, "post-new")

    def put_back() -> None:
        if how == "copy":
            hook.write_bytes(USER_HOOK)
            hook.chmod(0o755)
        else:
            hook.symlink_to("../dotfiles/post-new" if how == "relative link" else target)

    put_back()
    command = fake_fmail(tmp_path)
    assert [a.action for a in install_post_new(hook_dir, command)] == ["chained"]
    kept_before = snapshot(kept)
    hook.unlink()
    put_back()  # `stow -R`, `home-manager switch`
    actions = install_post_new(hook_dir, command)
    assert actions == [HookAction("post-new", "rechained", hook)]
    assert str(kept) in actions[0].describe()
    assert snapshot(kept) == kept_before
    assert target.read_bytes() == USER_HOOK
    assert is_ours(hook) and not hook.is_symlink()
    assert sorted(p.name for p in hook_dir.iterdir()) == [KEPT_DIR, "post-new"]
    marker = tmp_path / "marker"
    assert run_hook(hook, marker).returncode == 0
    assert [line.split("|")[0] for line in lines(marker)] == ["user", "fmail"]  # once each


def test_a_hook_put_back_over_one_chained_the_earlier_way_is_chained_again(
        tmp_path: Path) -> None:
    target = dotfiles_hook(tmp_path)
    hook_dir = tmp_path / "hooks"
    hook_dir.mkdir()
    hook = hook_dir / "post-new"
    hook.symlink_to(target)
    command = fake_fmail(tmp_path)
    legacy = chain_the_earlier_way(hook_dir, command)
    hook.unlink()
    hook.symlink_to(target)
    actions = install_post_new(hook_dir, command)
    assert actions == [HookAction("post-new", "rechained", hook, moved_from=legacy)]
    assert os.readlink(kept_hook(hook_dir, "post-new")) == str(target)
    assert sorted(p.name for p in hook_dir.iterdir()) == [KEPT_DIR, "post-new"]
