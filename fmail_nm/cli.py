"""The ``fmail-nm`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__
from .config import ConfigError, load_settings

if TYPE_CHECKING:
    from .indexing import IndexSummary

log = logging.getLogger("fmail_nm")


def cmd_init(args: argparse.Namespace) -> int:
    from .app import load_config
    from .indexing import run_index
    from .initialize import prepare

    settings = load_settings(args.config)
    report = prepare(
        settings,
        notmuch_config=args.notmuch_config or settings.notmuch_config,
        mail_root=Path(args.mail_root).expanduser() if args.mail_root else None,
        name=args.name,
        addresses=list(args.address or settings.addresses),
    )
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
    if args.no_index:
        return 0
    print_index_summary(run_index(load_config(args.config), backfill=True))
    return 0


def print_index_summary(summary: IndexSummary) -> None:
    counts = ", ".join(f"{tag} {n}" for tag, n in summary.counts.items())
    print(f"indexed: {summary.added} new, {summary.total} messages in all ({counts})")


def cmd_index(args: argparse.Namespace) -> int:
    from .app import load_config
    from .indexing import run_index

    print_index_summary(run_index(load_config(args.config), show_progress=None if not args.quiet else False))
    return 0


def cmd_hook(args: argparse.Namespace) -> int:
    from .app import load_config
    from .indexing import post_new
    from .nm import Reader, Writer

    config = load_config(args.config)
    with Reader(config.settings.notmuch_config) as reader, Writer(config.settings.notmuch_config) as writer:
        report = post_new(config, reader, writer)
    log.info("tagged %d new messages in %d batches; blocklist: +%d -%d; sidecar: %d updated, "
             "%d removed", report.tagging.messages, report.tagging.batches,
             report.blocklist.tagged, report.blocklist.untagged, report.mirror.upserted,
             report.mirror.removed)
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from .app import load_config
    from .syncer import sync

    direction = "pull" if args.pull else "push" if args.push else "both"
    report = sync(load_config(args.config), args.account, direction)
    for run in report.runs:
        print(run.describe())
    if report.index is not None:
        print_index_summary(report.index)
    for line in report.errors():
        print(f"fmail-nm: {line}", file=sys.stderr)
    return 0 if report.ok else 1


def cmd_sidecar(args: argparse.Namespace) -> int:
    from .app import load_config
    from .mirror import check, sync_sidecar
    from .nm import Reader
    from .sidecar import opened, sidecar_path

    config = load_config(args.config)
    with Reader(config.settings.notmuch_config) as reader:
        if args.action in ("sync", "rebuild"):
            report = sync_sidecar(config, reader, full=args.action == "rebuild")
            print(f"sidecar {'rebuilt' if report.full else 'synced'}: {report.upserted} updated, "
                  f"{report.parsed} parsed, {report.removed} removed (notmuch revision "
                  f"{report.revision})")
            return 0
        with opened(sidecar_path(config.data_dir)) as conn:
            problems = check(config, reader, conn, parse_files=args.files)
    for line in problems[:200]:
        print(line)
    if len(problems) > 200:
        print(f"... and {len(problems) - 200} more")
    print("sidecar matches notmuch" if not problems else f"{len(problems)} difference(s) found; "
          "`fmail-nm sidecar sync` fixes them (or `rebuild`)")
    return 0 if not problems else 1


def cmd_contacts(args: argparse.Namespace) -> int:
    from . import contacts
    from .app import load_config
    from .mirror import sync_sidecar
    from .nm import Reader, Writer
    from .sidecar import blocked_addresses, opened, sidecar_path

    config = load_config(args.config)
    with opened(sidecar_path(config.data_dir)) as conn:
        if args.action == "search":
            rows = contacts.search(conn, " ".join(args.args), blocked_only=args.blocked,
                                   limit=args.limit)
            print(contacts.format_rows(rows), end="")
            return 0
        if args.action == "export":
            if args.args:
                with open(args.args[0], "w", newline="", encoding="utf-8") as out:
                    n = contacts.export_csv(conn, out)
                print(f"exported {n} contacts to {args.args[0]}", file=sys.stderr)
            else:
                contacts.export_csv(conn, sys.stdout)
            return 0
        if args.action == "import":
            if len(args.args) != 1:
                raise ValueError("usage: fmail-nm contacts import FILE.csv")
            with open(args.args[0], newline="", encoding="utf-8") as source:
                n = contacts.import_csv(conn, source)
            print(f"imported {n} contacts")
        else:
            if not args.args:
                raise ValueError(f"usage: fmail-nm contacts {args.action} ADDRESS...")
            done = contacts.set_blocked(conn, args.args, args.action == "block")
            print(f"{args.action}ed: {', '.join(done)}")
        blocked = blocked_addresses(conn)
    notmuch_config = config.settings.notmuch_config
    with Reader(notmuch_config) as reader, Writer(notmuch_config) as writer:
        report = contacts.apply_blocklist(config, reader, writer, blocked)
        sync_sidecar(config, reader)
    print(f"mail tagged blocked: {report.tagged}, released: {report.untagged}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .app import load_config

    config = load_config(args.config)
    if args.transport == "stdio":
        import anyio

        from .server import serve_stdio
        anyio.run(lambda: serve_stdio(config, read_only=args.read_only, push=not args.no_push,
                                      watch=args.watch))
        return 0
    from .server import serve_http_forever
    return serve_http_forever(config, host=args.host, port=args.port, allow_remote=args.allow_remote,
                              read_only=args.read_only, push=not args.no_push, watch=args.watch)


def cmd_run(args: argparse.Namespace) -> int:
    """`serve --transport http --watch`, as a service: logs at INFO, one per data directory."""
    from .app import load_config
    from .server import serve_http_forever

    if not args.verbose:
        logging.getLogger("fmail_nm").setLevel(logging.INFO)
    return serve_http_forever(load_config(args.config), host=args.host, port=args.port,
                              allow_remote=args.allow_remote, read_only=args.read_only,
                              push=not args.no_push, watch=True)


def cmd_status(args: argparse.Namespace) -> int:
    from .config import default_data_dir
    from .status import StatusStore, render_text, service_alive, to_json

    settings = load_settings(args.config)
    status = StatusStore(settings.data_dir or default_data_dir()).load()
    print(to_json(status) if args.json else render_text(status))
    return 0 if service_alive(status) else 3


def cmd_token(args: argparse.Namespace) -> int:
    from .app import load_config
    from .token import load_or_create_token

    print(load_or_create_token(load_config(args.config).data_dir))
    return 0


def cmd_client_config(args: argparse.Namespace) -> int:
    from .app import load_config
    from .server import connection_help

    print(connection_help(load_config(args.config), host=args.host, port=args.port,
                          show_token=args.show_token))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(Path(args.dir), serve=not args.no_serve, port=args.port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fmail-nm", description=__doc__)
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

    p = command("index", help="run notmuch new (with hooks) and the tagging pass")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_index)

    p = command("hook", help="entry points for the notmuch hooks")
    p.add_argument("name", choices=["post-new"])
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
    p.add_argument("args", nargs="*", help="search text, addresses, or a CSV file")
    p.add_argument("--blocked", action="store_true", help="search: blocked contacts only")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_contacts)

    def server_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
        p.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
        p.add_argument("--allow-remote", action="store_true",
                       help="allow binding a non-loopback address (mail then leaves this "
                            "machine, protected only by the token)")
        p.add_argument("--read-only", action="store_true",
                       help="offer no tool that changes mail or contacts")
        p.add_argument("--no-push", action="store_true",
                       help="do not run mbsync after writes (you push yourself)")

    p = command("serve", help="serve the mail over MCP (stdio or Streamable HTTP)")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--watch", action="store_true",
                   help="also index new mail as it lands and pull on schedule (as `run`)")
    server_options(p)
    p.set_defaults(func=cmd_serve)

    p = command("run", help="the always-on service: MCP over HTTP, a watcher that indexes new "
                            "mail, scheduled mbsync pulls, pushes after writes")
    server_options(p)
    p.set_defaults(func=cmd_run)

    p = command("status", help="what the service did last: pulls, pushes, index runs")
    p.add_argument("--json", action="store_true", help="the status as JSON")
    p.set_defaults(func=cmd_status)

    p = command("token", help="print the HTTP bearer token (created on first use)")
    p.set_defaults(func=cmd_token)

    p = command("client-config", help="print MCP client configuration to paste")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--show-token", action="store_true", help="include the token itself")
    p.set_defaults(func=cmd_client_config)

    p = command("demo", help="index a copy of the bundled sample mail and serve it")
    p.add_argument("--dir", default=".demo", help="where the copy and its config live")
    p.add_argument("--no-serve", action="store_true", help="index and print a summary only")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="fmail-nm: %(levelname)s: %(message)s", stream=sys.stderr)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError, OSError) as exc:
        print(f"fmail-nm: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a clear one-line error; --verbose shows the traceback
        import sqlite3

        from .mirror import SyncInProgress
        from .nm import NotmuchAccessError
        from .sidecar import SidecarError
        if isinstance(exc, (NotmuchAccessError, SidecarError, SyncInProgress, sqlite3.Error)):
            log.debug("details", exc_info=True)
            print(f"fmail-nm: {exc}", file=sys.stderr)
            return 1
        raise
