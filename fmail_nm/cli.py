"""The ``fmail-nm`` command line."""

from __future__ import annotations

import argparse
import io
import logging
import math
import os
import signal
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import __version__
from .config import DEFAULT_TOOL_PROFILE, TOOL_PROFILES, load_settings
from .errors import BackendError, CallerError

if TYPE_CHECKING:
    from .config import Config
    from .service.cycle import SyncReport
    from .service.index import IndexSummary
    from .tools.contacts import MailEffect

log = logging.getLogger("fmail_nm")
T = TypeVar("T")


def cmd_init(args: argparse.Namespace) -> int:
    from .adopt.initialize import (check_named_notmuch_config, mirror_existing_mail, prepare,
                                   write_fmail_toml)
    from .store.notmuch_cli import database_located_by_environment
    from .store.notmuch_config import config_chosen_by_environment
    from .app import load_config
    from .config import default_config_path

    fmail_toml = Path(args.config).expanduser() if args.config else default_config_path()
    wrote_toml = not fmail_toml.is_file()
    if wrote_toml:
        # A config $NOTMUCH_CONFIG or $NOTMUCH_PROFILE chose, and a database $NOTMUCH_DATABASE
        # or $MAILDIR located, are written down: the server an MCP client or systemd starts
        # has no such environment.
        # Absolute: the hook reads fmail.toml from wherever notmuch new was started.
        chosen = (Path(args.notmuch_config).expanduser().absolute() if args.notmuch_config
                  else config_chosen_by_environment())
        write_fmail_toml(fmail_toml, str(chosen) if chosen else None, args.address or (),
                         os.environ.get("NOTMUCH_PROFILE") or None,
                         database_located_by_environment(chosen))
        print(f"wrote fmail-nm config (edit freely): {fmail_toml}"
              + (f"; it names the notmuch config {chosen}" if chosen else ""))
    settings = load_settings(fmail_toml)
    try:
        check_named_notmuch_config(settings, args.notmuch_config)
        report = prepare(
            settings,
            notmuch_config=args.notmuch_config or settings.notmuch_config,
            mail_root=Path(args.mail_root).expanduser() if args.mail_root else None,
            name=args.name,
            addresses=list(args.address or settings.addresses),
        )
    except BaseException:
        # Nothing names the fmail.toml of a run that failed before its hooks went in (they
        # are prepare's last step); left behind, it would keep this run's --address and
        # notmuch config for the corrected run, which reads it instead of its own arguments.
        if wrote_toml:
            fmail_toml.unlink(missing_ok=True)
            print(f"removed {fmail_toml} again: init did not finish", file=sys.stderr)
        raise
    if report.identity is not None:
        found = report.identity.describe()
        print("who you are:" if found else
              "who you are: no address found (notmuch config, mbsync, msmtp, Sent folders); "
              "give them with --address")
        for line in found:
            print(f"  {line}")
    if report.wrote_config:
        print(f"wrote notmuch config: {report.notmuch_config}")
    else:
        print(f"using your notmuch config (left unchanged): {report.notmuch_config}")
    for line in report.advice:
        print(f"  note: {line}")
    for folder in report.repaired_folders:
        print(f"created missing cur/new/tmp in {folder}")
    for action in report.hooks:
        print(f"hook {action.describe()}")
    config = load_config(fmail_toml)
    if mirror_existing_mail(config):
        print("mirrored the mail notmuch has into the sidecar (it keeps its tags: fmail-nm's "
              "rules tag only mail that arrives from now on)")
    if args.no_index:
        return 0
    sys.stdout.flush()  # what init did, before the progress line on stderr
    # A database init adopts, or one a re-run finds, holds tags only notmuch keeps, and the
    # service may be pulling into it: init's index waits as `fmail-nm index` does.
    print(index_after_syncs(config).describe())
    return 0


def index_after_syncs(config: Config, *, show_progress: bool | None = None,
                      full_scan: bool = False) -> IndexSummary:
    """:func:`~fmail_nm.service.index.run_index` once no mbsync run of ours is half-way: in
    the middle of one (the service's pull) notmuch new would drop a message moved on the
    server, with the tags only notmuch keeps.  The wait is bounded, and said on stderr, as
    the wait for the notmuch write lock is."""
    from .service.index import SYNC_WAIT_TIMEOUT, run_index, wait_between_syncs

    wait_between_syncs(config, SYNC_WAIT_TIMEOUT, on_channel_wait=say_channel_wait)
    return run_index(config, show_progress=show_progress, full_scan=full_scan,
                     on_lock_wait=say_lock_wait)


def say_channel_wait(channels: Sequence[str]) -> None:
    """The wait for our own mbsync runs, said once: without it the command sat silent."""
    names = ", ".join(repr(channel) for channel in channels)
    print(f"fmail-nm: waiting for mbsync to finish syncing {names} (a sync of fmail-nm's, "
          "the service's or another command's, is half-way: indexing now could drop mail "
          "moved on the server, with its tags); indexing starts once it is done (Ctrl-C "
          "stops waiting; nothing is lost)", file=sys.stderr, flush=True)


def say_lock_wait() -> None:
    """notmuch new waits for a write lock held elsewhere without a word, and without a bound
    when run from here: the user must know what the command is waiting for."""
    print("fmail-nm: waiting for the notmuch write lock: another program (a mail client, "
          "another notmuch new) holds it; indexing starts once it is free (Ctrl-C stops "
          "waiting; nothing is lost)", file=sys.stderr, flush=True)


def cmd_uninstall(args: argparse.Namespace) -> int:
    """Our hooks out of notmuch's hook folder, the user's own back in their place: what
    removing fmail-nm needs, since a hook left behind fails every notmuch new once the
    program is gone."""
    from .adopt.hooks import KEPT_DIR, MARKER, uninstall_hooks
    from .app import notmuch_config_not_found
    from .store.notmuch_cli import notmuch_settings

    settings = load_settings(args.config)
    left = (f"fmail-nm's own files (fmail.toml, the sidecar in "
            f"{settings.data_dir_or_default()}) are left for you to delete")
    hook_dir = notmuch_settings(settings.notmuch_config).get("database.hook_dir")
    if not hook_dir and (missing := notmuch_config_not_found(settings)):
        # Our hook is in the hook folder that config names: without it there is no telling
        # where, and nothing else we installed can be taken out.
        raise CallerError(
            f"{missing}: it names notmuch's hook folder, so fmail-nm's hook was not looked "
            "for and nothing was taken out or changed.  Put the config back and run "
            "`fmail-nm uninstall` again, or delete fmail-nm's post-new and post-insert hooks "
            f"(their second line is '{MARKER} <name>') from that folder yourself; a hook of "
            f"yours they kept is in {KEPT_DIR}/ beside them, to move back.  {left}")
    if not hook_dir:
        raise CallerError("notmuch names no hook folder (no database yet?): nothing to take out")
    for action in uninstall_hooks(Path(hook_dir)):
        print(f"hook {action.describe()}")
    print(f"your notmuch config, mail and tags are as they were; {left}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from .app import load_config

    print(index_after_syncs(load_config(args.config),
                            show_progress=None if not args.quiet else False,
                            full_scan=args.full_scan).describe())
    return 0


# How long the post-insert hook waits for a sidecar sync running elsewhere: another insert's
# pass is done within it, an index run is not.
INSERT_SYNC_WAIT = 5.0


def cmd_hook(args: argparse.Namespace) -> int:
    from .app import load_config
    from .passes import NEW_SINCE_ENV
    from .passes.mirror import SyncInProgress
    from .passes.post_new import post_new
    from .progress import from_environment
    from .store.notmuch import Reader, Writer

    config = load_config(args.config)
    since = os.environ.get(NEW_SINCE_ENV, "")
    new_since = int(since) if since.isascii() and since.isdigit() else None
    # notmuch insert waits on its hook, and the MDA on insert: one that gives up on a hook held
    # behind a long sync (a first index) delivers the mail again.  The next pass tags it.
    sync_wait = INSERT_SYNC_WAIT if args.name == "post-insert" else math.inf
    notmuch_config = config.settings.notmuch_config
    try:
        with Reader(notmuch_config) as reader, Writer(notmuch_config) as writer:
            report = post_new(config, reader, writer, new_since=new_since,
                              on_progress=from_environment(), sync_wait=sync_wait)
    except SyncInProgress as exc:
        log.info("%s: the mail is tagged by the next pass (notmuch new, fmail-nm sync)", exc)
        return 0
    log.info("tagged %d new messages in %d batches; blocklist: +%d -%d; sidecar: %d updated, "
             "%d removed", report.tagging.messages, report.tagging.batches,
             report.blocklist.tagged, report.blocklist.untagged, report.mirror.upserted,
             report.mirror.removed)
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from .app import load_config
    from .service.cycle import sync
    from .service.mbsync import Direction

    direction: Direction = "pull" if args.pull else "push" if args.push else "both"
    report = sync(load_config(args.config), args.account, direction,
                  on_lock_wait=say_lock_wait, on_channel_wait=say_channel_wait)
    print_runs(report)
    if report.index is not None:
        print(report.index.describe())
    for line in report.errors():
        print(f"fmail-nm: {line}", file=sys.stderr)
    return 0 if report.ok else 1


def print_runs(report: SyncReport) -> None:
    """The mbsync runs that did not fail, a line each: a failed one is among
    ``report.errors()``, which go to stderr, and is said once."""
    failed = report.failed()
    for run in report.runs:
        if run not in failed:
            print(run.describe())


def cmd_sidecar(args: argparse.Namespace) -> int:
    from .app import load_config
    from .passes.mirror import check, sync_sidecar
    from .store.notmuch import Reader
    from .store.sidecar import opened, readable, set_aside, sidecar_path

    config = load_config(args.config)
    path = sidecar_path(config.data_dir)
    if args.action == "rebuild" and path.is_file() and (why := readable(path)) is not None:
        aside = set_aside(path)
        print(f"the sidecar could not be read ({why}); moved it to {aside} (its contact notes, "
              "blocks and write log: `sqlite3 <that file> .recover` may bring them back)")
    with Reader(config.settings.notmuch_config) as reader:
        if args.action in ("sync", "rebuild"):
            report = sync_sidecar(config, reader, full=args.action == "rebuild")
            print(f"sidecar {'rebuilt' if report.full else 'synced'}: {report.upserted} updated, "
                  f"{report.parsed} parsed, {report.removed} removed (notmuch revision "
                  f"{report.revision})")
            return 0
        if not path.is_file():  # opening it would create it empty, to "differ" in every row
            reader.revision()  # no notmuch database either: that error first, rebuild needs one
            print(f"fmail-nm: the sidecar {path} is missing: `fmail-nm sidecar rebuild` builds "
                  "it from notmuch", file=sys.stderr)
            return 1
        with opened(path) as conn:
            problems = check(config, reader, conn, parse_files=args.files)
    for line in problems[:200]:
        print(line)
    if len(problems) > 200:
        print(f"... and {len(problems) - 200} more")
    # Not `sidecar sync`: it keeps mail marked for tagging marked, where the index run's pass
    # syncs the sidecar as it does and then tags that mail.
    print("sidecar matches notmuch" if not problems else f"{len(problems)} difference(s) found; "
          "`fmail-nm index` fixes them (or `fmail-nm sidecar rebuild`, then that)")
    return 0 if not problems else 1


def cmd_contacts(args: argparse.Namespace) -> int:
    from .app import load_config
    from .store.sidecar import opened, sidecar_path
    from .tools import contacts

    config = load_config(args.config)
    if args.action in ("search", "export"):
        with opened(sidecar_path(config.data_dir)) as conn:
            if args.action == "search":
                rows = contacts.search(conn, " ".join(args.args), blocked_only=args.blocked,
                                       limit=args.limit)
                print(contacts.format_rows(rows), end="")
            elif args.args:
                with open(args.args[0], "w", newline="", encoding="utf-8") as out:
                    n = contacts.export_csv(conn, out)
                print(f"exported {n} contacts to {args.args[0]}", file=sys.stderr)
            else:
                contacts.export_csv(conn, sys.stdout)
        return 0
    if args.action == "import":
        if len(args.args) != 1:
            raise CallerError("usage: fmail-nm contacts import FILE.csv")
        # utf-8-sig: a spreadsheet's "CSV UTF-8" starts with a byte-order mark.
        try:
            with open(args.args[0], newline="", encoding="utf-8-sig") as source:
                text = source.read()
        except UnicodeDecodeError:
            raise CallerError(f"{args.args[0]} is not UTF-8 text: save it as CSV UTF-8, "
                              "then import it again") from None
        n, effect = _edit_contacts(config, args, lambda conn: contacts.import_csv(
            conn, io.StringIO(text)))
        print(f"imported {n} contacts")
    else:
        if not args.args:
            raise CallerError(f"usage: fmail-nm contacts {args.action} ADDRESS...")
        done, effect = _edit_contacts(config, args, lambda conn: contacts.set_blocked(
            conn, args.args, args.action == "block"))
        print(f"{args.action}ed: {', '.join(done)}")
    print(f"mail tagged blocked: {effect.tagged}, released: {effect.untagged}")
    return 0


def _edit_contacts(config: Config, args: argparse.Namespace,
                   edit: Callable[[sqlite3.Connection], T]) -> tuple[T, MailEffect]:
    """A contacts edit with everything that follows it, as the MCP tool does it: mail
    retagged (and moved to or from Junk), one undoable audit entry, the sidecar synced, and
    the accounts whose files moved pushed with mbsync (unless --no-push)."""
    from .passes.changes import WriteContext, WriteOutcome
    from .passes.mirror import sync_sidecar
    from .service.index import reindex_for_write
    from .store.notmuch import Reader, Writer
    from .store.sidecar import sidecar_path
    from .tools.contacts import edit_contacts

    moved: set[str] = set()

    def after_write(outcome: WriteOutcome) -> None:
        moved.update(outcome.accounts)

    notmuch_config = config.settings.notmuch_config
    with Reader(notmuch_config) as reader, Writer(notmuch_config) as writer:
        ctx = WriteContext(config, reader, writer, sidecar_path(config.data_dir), after_write,
                           reindex=lambda: reindex_for_write(config))
        value, effect = edit_contacts(ctx, f"contacts {args.action}", {"args": args.args}, edit)
        sync_sidecar(config, reader)
    if moved and not args.no_push:
        _push(config, sorted(moved))
    return value, effect


def _push(config: Config, accounts: Sequence[str]) -> None:
    """mbsync push for accounts whose files moved (then re-index: mbsync renames what it
    uploads).  A failed push is reported; the change is made and the next sync carries it."""
    from .service.cycle import sync

    for name in accounts:
        if not config.account(name).mbsync_channel:
            continue
        report = sync(config, name, "push", on_channel_wait=say_channel_wait)
        print_runs(report)
        for line in report.errors():
            print(f"fmail-nm: push of {name} failed, the next sync retries it: {line}",
                  file=sys.stderr)


def _served_config(args: argparse.Namespace) -> Config:
    from .app import load_config
    from .config import allow_sending

    config = load_config(args.config)
    return allow_sending(config) if args.allow_send else config


def cmd_serve(args: argparse.Namespace) -> int:
    config = _served_config(args)
    if args.transport == "stdio":
        from .mcp.serving import serve_stdio_forever
        return serve_stdio_forever(config, read_only=args.read_only, push=not args.no_push,
                                   watch=args.watch, tools=args.tools)
    from .mcp.serving import serve_http_forever
    return serve_http_forever(config, host=args.host, port=args.port, allow_remote=args.allow_remote,
                              read_only=args.read_only, push=not args.no_push, watch=args.watch,
                              tools=args.tools)


def cmd_run(args: argparse.Namespace) -> int:
    """`serve --transport http --watch`, as a service: logs at INFO, one per data directory."""
    from .mcp.serving import serve_http_forever

    if not args.verbose:
        logging.getLogger("fmail_nm").setLevel(logging.INFO)
    return serve_http_forever(_served_config(args), host=args.host, port=args.port,
                              allow_remote=args.allow_remote, read_only=args.read_only,
                              push=not args.no_push, watch=True, tools=args.tools)


def cmd_status(args: argparse.Namespace) -> int:
    from .service.status import (StatusStore, render_text, server_statuses, servers_text,
                                 service_alive, to_json)

    data_dir = load_settings(args.config).data_dir_or_default()
    status = StatusStore(data_dir).load()
    # then the pushes of MCP servers without --watch, which push their own writes
    servers = server_statuses(data_dir)
    print(to_json(status, servers) if args.json else render_text(status) + servers_text(servers))
    return 0 if service_alive(status) else 3


def cmd_token(args: argparse.Namespace) -> int:
    from .app import load_config
    from .mcp.token import load_or_create_token

    print(load_or_create_token(load_config(args.config).data_dir))
    return 0


def cmd_client_config(args: argparse.Namespace) -> int:
    from .app import load_config
    from .mcp.serving import connection_help

    print(connection_help(load_config(args.config), host=args.host, port=args.port,
                          show_token=args.show_token))
    return 0


ACCOUNT_PROMPTS = (
    ("name", "account name (a word, e.g. work)"), ("address", "e-mail address"),
    ("password_command", "command that prints the password (e.g. pass show mail/work)"),
)
# An OAuth2 account's command prints an access token, which a token helper renews.
TOKEN_PROMPT = "command that prints an OAuth2 access token (e.g. oama access you@outlook.com)"


def cmd_account(args: argparse.Namespace) -> int:
    from .adopt import accounts
    from .app import load_config

    settings = load_settings(args.config)
    if args.action == "remove":
        if not args.name:
            raise CallerError("usage: fmail-nm account remove --name NAME")
        config = load_config(args.config)
        removed = accounts.remove(args.name, config.mail_root)
        for path in removed.files:
            print(f"took {removed.name} out of {path}")
        if removed.mail is not None:
            print(f"its mail in {removed.mail} is left in place: `fmail-nm account add` under "
                  "the same name, server and login takes it up again (delete it yourself if you "
                  "want; notmuch new then drops it from the index)")
        return 0
    if args.action == "list":
        return _account_list(args)
    return _account_add(args, settings.path)


def _account_list(args: argparse.Namespace) -> int:
    """Every account fmail-nm knows, marking those `account add` made (which `account remove`
    takes out again): a set-up's own accounts come from fmail.toml or its mbsyncrc."""
    from .adopt import accounts
    from .app import load_config
    added = {entry.get("name") for entry in accounts.added_entries()}
    known = load_config(args.config).accounts
    for account in known:
        made = "added with `fmail-nm account add`" if account.name in added else "your set-up's"
        print(f"{account.name}: {', '.join(account.addresses) or 'no address'}; "
              f"mail in {account.maildir}; {made}")
    if not known:
        print("no accounts: `fmail-nm account add` adds one")
    return 0


def _signs_in_with_oauth2(values: dict[str, Any]) -> bool:
    """Whether the account being added signs in with OAuth2: --auth, else its preset's."""
    from .adopt import accounts
    if values.get("auth"):
        return bool(values["auth"] == "oauth2")
    preset = accounts.provider_for(values.get("address") or "", values.get("provider"))
    return preset is not None and preset.settings.get("auth") == "oauth2"


def _account_add(args: argparse.Namespace, config_path: Path | None) -> int:
    from .adopt import accounts
    from .app import load_config
    from .service.onboard import add_account

    values = {key: getattr(args, key) for key in accounts.CLI_FIELDS}
    if sys.stdin.isatty():  # on a terminal, ask for what the flags left out
        for key, prompt in ACCOUNT_PROMPTS:
            if key == "password_command" and _signs_in_with_oauth2(values):
                prompt = TOKEN_PROMPT
            while not values[key]:
                values[key] = input(f"{prompt}: ").strip()
        preset = accounts.provider_for(values["address"] or "", values["provider"])
        if preset is None and not values["imap_host"]:
            values["imap_host"] = input("IMAP server (e.g. imap.example.org): ").strip()
            values["smtp_host"] = values["smtp_host"] or input(
                "SMTP server (empty: no sending): ").strip() or None
    missing = [f"--{k.replace('_', '-')}" for k, _ in ACCOUNT_PROMPTS if not values[k]]
    if missing:
        raise CallerError(f"fmail-nm account add needs {', '.join(missing)}")
    result, _ = add_account(load_config(config_path), accounts.NewAccount(**values),
                            config_path=config_path, on_pull=say_pull_starts,
                            on_lock_wait=say_lock_wait, on_channel_wait=say_channel_wait)
    print(f"added account {result.name} ({values['address']}): {len(result.folders)} folders on "
          f"the server, {result.added} messages indexed")
    for line in result.errors:
        print(f"fmail-nm: {line}", file=sys.stderr)
    for note in result.notes:
        print(f"  note: {note}")
    return 0 if result.pulled else 1


def say_pull_starts(folders: Sequence[str]) -> None:
    """The server took the login; the first pull can take long (every message of the
    account), and the command said nothing meanwhile."""
    print(f"fmail-nm: the server took the login ({len(folders)} folders); pulling its mail "
          "now, which takes a while for a large mailbox", file=sys.stderr, flush=True)


def cmd_doctor(args: argparse.Namespace) -> int:
    from .config import default_data_dir
    from .mcp.token import token_path
    from .service.doctor import diagnose

    try:
        data_dir = load_settings(args.config).data_dir_or_default()
    except CallerError:  # diagnose reports it
        data_dir = default_data_dir()
    findings = diagnose(args.config, token_file=token_path(data_dir))
    for finding in findings:
        mark = "problem" if finding.serious else "note"
        print(f"{mark} [{finding.check}] {finding.problem}\n    fix: {finding.fix}")
    serious = sum(f.serious for f in findings)
    print(f"{serious} problem(s) found" if serious else "no problems found")
    return 1 if serious else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(Path(args.dir), serve=not args.no_serve, port=args.port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fmail-nm", description="Your offline mail (mbsync + notmuch) for an LLM, over MCP.")
    parser.add_argument("--version", action="version", version=f"fmail-nm {__version__}")
    parser.add_argument("--config", help="fmail.toml to use (default: $FMAIL_CONFIG, else "
                        "$XDG_CONFIG_HOME/fmail-nm/fmail.toml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    # The same options after the command name too (`fmail-nm init --config X`); SUPPRESS keeps
    # a value given before the command from being reset by the subcommand's default.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    p = command("init", help="adopt a mail root or an existing notmuch setup, install hooks, index")
    p.add_argument("--mail-root", help="the Maildir root, when there is no notmuch config yet")
    p.add_argument("--notmuch-config", help="notmuch config to use or create")
    p.add_argument("--name", default="", help="your name, for a new notmuch config")
    p.add_argument("--address", action="append", help="one of your addresses (repeatable)")
    p.add_argument("--no-index", action="store_true", help="set up only; do not run notmuch new")
    p.set_defaults(func=cmd_init)

    p = command("uninstall", help="take fmail-nm's notmuch hooks out and put your own back")
    p.set_defaults(func=cmd_uninstall)

    p = command("index", help="run notmuch new (with hooks) and the tagging pass")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--full-scan", action="store_true",
                   help="list every folder, not only those whose mtime changed: finds mail "
                        "notmuch new passed over (README, \"Run it as a service\")")
    p.set_defaults(func=cmd_index)

    p = command("hook", help="entry points for the notmuch hooks")
    # Both run the same pass: it finds the new mail in the sidecar, however it was indexed.
    p.add_argument("name", choices=["post-new", "post-insert"])
    p.set_defaults(func=cmd_hook)

    p = command("sync", help="run mbsync for your accounts, then index (hooks, sidecar)")
    way = p.add_mutually_exclusive_group()
    way.add_argument("--pull", action="store_true", help="only fetch changes from the servers")
    way.add_argument("--push", action="store_true", help="only send local changes to the servers")
    way.add_argument("--both", action="store_true", help="both ways (the default)")
    p.add_argument("account", nargs="?", help="one account (default: all)")
    p.set_defaults(func=cmd_sync)

    p = command("sidecar", help="the sidecar SQLite (mirror, contacts): sync, rebuild or check it")
    p.add_argument("action", choices=["sync", "rebuild", "check"])
    p.add_argument("--files", action="store_true",
                   help="check: also re-parse every message file (slower)")
    p.set_defaults(func=cmd_sidecar)

    p = command("contacts", help="search contacts, block/unblock senders, export/import CSV")
    p.add_argument("action", choices=["search", "block", "unblock", "export", "import"])
    p.add_argument("args", nargs="*", help="search text, addresses, or a CSV file (import: "
                   "a column the file leaves out, or an empty is_blocked cell, keeps what "
                   "the contact has)")
    p.add_argument("--blocked", action="store_true", help="search: blocked contacts only")
    p.add_argument("--limit", type=count, default=50,
                   help="search: at most this many contacts (default 50)")
    p.add_argument("--no-push", action="store_true",
                   help="block/unblock/import: do not run mbsync for mail moved to or from Junk")
    p.set_defaults(func=cmd_contacts)

    def server_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
        p.add_argument("--port", type=tcp_port, default=8765, help="HTTP port (default 8765)")
        p.add_argument("--allow-remote", action="store_true",
                       help="allow binding a non-loopback address (mail then leaves this "
                            "machine, protected only by the token)")
        p.add_argument("--read-only", action="store_true",
                       help="offer no tool that changes mail, drafts, contacts or accounts")
        p.add_argument("--tools", choices=TOOL_PROFILES, default=DEFAULT_TOOL_PROFILE,
                       help="which tools to offer: read (reading and search), triage (also "
                            "read/unread, tags, archive, delete, junk, undo, drafts and, "
                            "with sending on, send_email; the default) or all")
        p.add_argument("--no-push", action="store_true",
                       help="do not run mbsync after writes (you push yourself)")
        p.add_argument("--allow-send", action="store_true",
                       help="offer send_email, as [send] enabled = true does (see README)")

    p = command("serve", help="serve the mail over MCP (stdio or Streamable HTTP)")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                   help="stdio (the default: the client starts the server) or http "
                        "(Streamable HTTP at http://HOST:PORT/mcp, bearer token)")
    p.add_argument("--watch", action="store_true",
                   help="also index new mail as it lands and pull on schedule (as `run`)")
    server_options(p)
    p.set_defaults(func=cmd_serve)

    p = command("run", help="the always-on service: MCP over HTTP, a watcher that indexes new "
                            "mail, scheduled mbsync pulls, pushes after writes")
    server_options(p)
    p.set_defaults(func=cmd_run)

    p = command("status", help="what the service did last: pulls, pushes, index runs; the "
                               "pushes of MCP servers without --watch (exit 3 when the "
                               "service is not running)")
    p.add_argument("--json", action="store_true", help="the status as JSON")
    p.set_defaults(func=cmd_status)

    p = command("token", help="print the HTTP bearer token (created on first use)")
    p.set_defaults(func=cmd_token)

    p = command("client-config", help="print MCP client configuration to paste")
    p.add_argument("--host", default="127.0.0.1",
                   help="the HTTP server's address, as given to serve (default 127.0.0.1)")
    p.add_argument("--port", type=tcp_port, default=8765,
                   help="the HTTP server's port (default 8765)")
    p.add_argument("--show-token", action="store_true", help="include the token itself")
    p.set_defaults(func=cmd_client_config)

    p = command("account", help="add an account (its own mbsync/msmtp config, a password "
                                "command, checked and pulled), remove one, list them")
    p.add_argument("action", choices=["add", "remove", "list"])
    p.add_argument("--name", help="the account's name (its folder under the mail root)")
    p.add_argument("--address", help="its e-mail address")
    p.add_argument("--password-command", help="a command that prints the password "
                   "(pass show ..., secret-tool lookup ...); the password itself is never asked")
    p.add_argument("--provider", help="a preset: gmail, fastmail, icloud, outlook (found from "
                   "the address when left out)")
    p.add_argument("--imap-host")
    p.add_argument("--imap-port", type=int)
    p.add_argument("--imap-user", help="IMAP login (default: the address)")
    p.add_argument("--imap-tls", choices=["imaps", "starttls", "none"])
    p.add_argument("--smtp-host")
    p.add_argument("--smtp-port", type=int)
    p.add_argument("--smtp-tls", choices=["tls", "starttls", "none"])
    p.add_argument("--certificate", metavar="FILE", help="a server's own certificate (PEM) "
                   "for this account to trust; certificates are always checked")
    p.add_argument("--auth", choices=["password", "oauth2"],
                   help="how it signs in (default password; oauth2 for outlook): oauth2 means "
                   "the password command prints an OAuth2 access token, sent with XOAUTH2 "
                   "(mbsync needs the SASL plugin: libsasl2-modules-kdexoauth2)")
    p.set_defaults(func=cmd_account)

    p = command("doctor", help="check the whole setup; each problem with the command that fixes "
                               "it (exit 1 when something is wrong)")
    p.set_defaults(func=cmd_doctor)

    p = command("demo", help="index a copy of the bundled sample mail and serve it")
    p.add_argument("--dir", default=".demo", help="where the copy and its config live")
    p.add_argument("--no-serve", action="store_true", help="index and print a summary only")
    p.add_argument("--port", type=tcp_port, default=8765, help="HTTP port (default 8765)")
    p.set_defaults(func=cmd_demo)
    return parser


def tcp_port(text: str) -> int:
    """A --port value: 1-65535 (a bigger one failed deep in the socket call with a traceback)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: 1 to 65535")
    return port


def count(text: str) -> int:
    """A --limit value: 1 or more (SQLite reads a negative LIMIT as no limit at all)."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: 1 or more") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} is not a count: 1 or more")
    return number


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line as parse_args reads it, except that words after an option go to a
    command's ``args`` too: argparse ends a ``nargs="*"`` positional at the first option, so
    `contacts block --no-push ADDR` failed with "unrecognized arguments: ADDR" -- naming the
    address as the mistake.  (parse_intermixed_args does not take subcommands.)"""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "args", None), list) and not any(
            word.startswith("-") for word in extra):
        args.args.extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


class _Terminated(KeyboardInterrupt):
    """SIGTERM (systemd's stop, `timeout`), raised in the main thread as Ctrl-C is: the
    paths that end a child on Ctrl-C (mbsync, msmtp, each in a session of its own that no
    signal to ours reaches) then end it on SIGTERM too, where Python's default left it
    running.  The servers catch SIGTERM themselves while they serve."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def _exit_by(signum: signal.Signals) -> int:
    """End the process by the signal that stopped it, as Python does on a Ctrl-C nothing
    caught, after one line instead of a traceback: a shell sees 128 + the signal, systemd a
    clean stop on SIGTERM (an exit status of 143 is a failure to it)."""
    name = "Ctrl-C" if signum == signal.SIGINT else signum.name
    print(f"fmail-nm: stopped ({name})", file=sys.stderr, flush=True)
    sys.stdout.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + signum  # not reached


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="fmail-nm: %(levelname)s: %(message)s", stream=sys.stderr)
    func: Callable[[argparse.Namespace], int] = args.func
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return func(args)
    except _Terminated:
        return _exit_by(signal.SIGTERM)
    except KeyboardInterrupt:  # what the command started is already stopped (see _Terminated)
        log.debug("details", exc_info=True)
        return _exit_by(signal.SIGINT)
    # One line each; --verbose shows the traceback.  Exit 2: the command can be fixed (a bad
    # argument, a file that is not there); exit 1: the machinery failed (see errors.py).
    except CallerError as exc:
        print(f"fmail-nm: {exc}", file=sys.stderr)
        return 2
    except BackendError as exc:
        log.debug("details", exc_info=True)
        print(f"fmail-nm: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:  # arguments and files named on the command line
        print(f"fmail-nm: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        log.debug("details", exc_info=True)
        print(f"fmail-nm: {sidecar_failure(exc, args.config)}", file=sys.stderr)
        return 1
    finally:  # for a caller that runs main() in its own process
        signal.signal(signal.SIGTERM, previous)


def sidecar_failure(exc: sqlite3.Error, config: str | None) -> str:
    """What an SQLite error means to the user: the sidecar is the only SQLite file a command
    opens (see sidecar.failure_text)."""
    from .store.sidecar import failure_text, sidecar_path

    try:
        where = f"the sidecar {sidecar_path(load_settings(config).data_dir_or_default())}"
    except CallerError:  # fmail.toml unreadable now: still say which database it is
        where = "fmail-nm's sidecar database"
    return failure_text(exc, where)
