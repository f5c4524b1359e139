"""``fmail-nm demo``: the bundled sample mail, indexed in a directory of its own and served.

Nothing outside that directory is touched: it gets its own notmuch config, fmail.toml and data
directory, so a user's real setup is never read or changed by the demo.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .adopt.initialize import prepare

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def demo_environment(base: Path) -> dict[str, str]:
    # XDG_CONFIG_HOME too: the accounts `fmail-nm account add` wrote for the user
    # (accounts.toml) are none of the demo's.
    return {
        "NOTMUCH_CONFIG": str(base / "notmuch-config"),
        "FMAIL_CONFIG": str(base / "fmail.toml"),
        "XDG_DATA_HOME": str(base / "data"),
        "XDG_CONFIG_HOME": str(base / "config"),
    }


def setup_demo(base: Path) -> Path:
    """Copy the sample mail and its fmail.toml into ``base`` (once) and point the process at
    them.  Returns the mail root."""
    if not (FIXTURES / "maildir").is_dir():
        raise FileNotFoundError(f"sample mail not found at {FIXTURES / 'maildir'}; run the demo "
                                "from a checkout of fmail-nm")
    base = base.resolve()
    mail = base / "mail"
    if not mail.exists():
        shutil.copytree(FIXTURES / "maildir", mail, symlinks=True)
    # An mbsync config of the demo's own (there is none: the sample has no server), not the
    # user's ~/.mbsyncrc, whose channels of the sample's account names would set its layout.
    (base / "fmail.toml").write_text((FIXTURES / "fmail.toml").read_text(encoding="utf-8")
                                     + '\n[mbsync]\nconfig = "mbsyncrc"\n', encoding="utf-8")
    os.environ.update(demo_environment(base))
    return mail


def run_demo(base: Path, *, serve: bool, port: int) -> int:
    from .app import load_config
    from .config import load_settings
    from .service.index import run_index

    mail = setup_demo(base)
    settings = load_settings()
    report = prepare(settings, notmuch_config=None, mail_root=mail, name="Alex Morgan",
                     addresses=["alex@example.org", "alex.morgan@example.org", "amorgan@acme.test"])
    for action in report.hooks:
        print(f"hook {action.describe()}")
    # No wait for mbsync runs (as `fmail-nm index` has): nothing of fmail-nm's syncs the
    # demo's copy -- it has no server, and serve_demo neither pulls nor pushes.
    print(run_index(load_config()).describe())
    if not serve:
        return 0
    from .mcp.serving import serve_demo  # the MCP server

    return serve_demo(port=port)
