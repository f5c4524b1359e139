"""The layering ARCHITECTURE.md describes, checked: imports only run downward, and the
``post-new`` hook path loads nothing of the tools, the MCP server, pydantic or html2text."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from fmail_nm.store import sidecar

from .conftest import REPO, MailEnv

PACKAGE = REPO / "fmail_nm"

# Lowest first.  A module may import from its own layer and any layer below it, never above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("fmail_nm", "fmail_nm.errors", "fmail_nm.tags", "fmail_nm.clock",
              "fmail_nm.private", "fmail_nm.progress")),
    ("config", ("fmail_nm.config", "fmail_nm.mbsyncrc", "fmail_nm.msmtprc", "fmail_nm.dsl")),
    ("message", ("fmail_nm.message",)),
    ("store", ("fmail_nm.store", "fmail_nm.app")),
    ("passes", ("fmail_nm.passes",)),
    ("tools", ("fmail_nm.tools", "fmail_nm.adopt")),
    ("service", ("fmail_nm.service",)),
    ("mcp", ("fmail_nm.mcp",)),
    ("commands", ("fmail_nm.cli", "fmail_nm.demo", "fmail_nm.__main__")),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The layer of a module: the longest listed prefix wins (``fmail_nm`` itself is base)."""
    best, rank = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank >= 0, f"{module} is in no layer: add it to LAYERS and ARCHITECTURE.md"
    return rank


def imports_of(path: Path) -> set[str]:
    """Every fmail_nm module a file imports, at the top or inside a function."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fmail_nm"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if not target.startswith("fmail_nm"):
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{alias.name}"
                is_module = (REPO / Path(*sub.split("."))).with_suffix(".py").exists() or (
                    REPO / Path(*sub.split(".")) / "__init__.py").exists()
                found.add(sub if is_module else target)
    return found


def all_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    for path in all_modules():
        layer_of(module_name(path))


def test_imports_only_run_downward() -> None:
    upward = []
    for path in all_modules():
        module = module_name(path)
        for imported in imports_of(path):
            if layer_of(imported) > layer_of(module):
                upward.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {imported} "
                              f"({LAYERS[layer_of(imported)][0]})")
    assert upward == []


def test_the_import_check_sees_relative_lazy_and_submodule_imports(tmp_path: Path) -> None:
    """The check above would pass vacuously if it saw no imports: make sure it sees them."""
    server = imports_of(PACKAGE / "mcp" / "server.py")
    assert "fmail_nm.tools.reads" in server and "fmail_nm.config" in server
    cli = imports_of(PACKAGE / "cli.py")  # lazy imports inside the command functions
    assert "fmail_nm.mcp.serving" in cli or "fmail_nm.mcp.server" in cli
    assert layer_of("fmail_nm.mcp.server") > layer_of("fmail_nm.tools.reads")


def test_only_the_bindings_module_imports_notmuch2() -> None:
    users = [module_name(p) for p in all_modules()
             if any(isinstance(n, (ast.Import, ast.ImportFrom)) and (
                 any(a.name.split(".")[0] == "notmuch2" for a in n.names)
                 if isinstance(n, ast.Import) else (n.module or "").split(".")[0] == "notmuch2")
                 for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))]
    assert users == ["fmail_nm.store.notmuch"]


# Whole packages the hook must never load: it runs after every `notmuch new`, so what it
# imports is paid on every delivery, and the tools and the server have no business there;
# nor have worker processes, which only a sync of hundreds of new messages starts.
FORBIDDEN_ON_POST_NEW = ("fmail_nm.tools", "fmail_nm.mcp", "fmail_nm.service", "fmail_nm.adopt",
                         "fmail_nm.dsl", "pydantic", "html2text", "pypdf", "mcp", "starlette",
                         "multiprocessing",
                         # the write engine: only where the blocklist moves or releases mail
                         "fmail_nm.passes.changes", "fmail_nm.message.drafts",
                         # loaded for a move (ctypes: renameat2) or an invitation only
                         "ctypes", "fmail_nm.message.calendar")

LIST_MESSAGE = "list-rust-7@example.com"

RUN_HOOK = """
import json, sys
from fmail_nm.cli import main
code = main(["hook", "post-new"])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_the_post_new_path_loads_no_tools_server_pydantic_or_html2text(
        indexed: MailEnv) -> None:
    # New mail for the pass to work on: an HTML-only message (its preview is made at index
    # time) and a list message, delivered as mbsync would, indexed without hooks.
    inbox_new = indexed.mail_root / "personal" / "INBOX" / "new"
    sources = {"html-only-1@coop.example.com": "layer-html@example.test",
               LIST_MESSAGE: "layer-list@example.test"}
    delivered = 0
    for old_id, new_id in sources.items():
        found = indexed.notmuch("search", "--output=files", f"id:{old_id}").stdout.split()
        raw = Path(found[0]).read_bytes().replace(old_id.encode(), new_id.encode())
        (inbox_new / f"1700000000.layering{delivered}.host").write_bytes(raw)
        delivered += 1
    indexed.notmuch("new", "--no-hooks")
    new_ids = list(sources.values())
    assert sidecar.recipients_of(indexed.config().data_dir, new_ids) == {}  # not mirrored yet

    done = subprocess.run([sys.executable, "-c", RUN_HOOK], env={**os.environ, **indexed.env},
                          capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    # the pass did its work: mirrored, and the list message tagged
    assert set(sidecar.recipients_of(indexed.config().data_dir, new_ids)) == set(new_ids)
    listed = indexed.notmuch("search", "--output=tags", "id:layer-list@example.test").stdout
    assert "list" in listed.split()
    loaded = [m for m in report["modules"]
              if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_ON_POST_NEW)]
    assert loaded == []
    assert "fmail_nm.passes.mirror" in report["modules"]  # the check saw the real path


# What the hook of a `notmuch new` that found nothing has no use for: the message parser and
# the body renderers (dozens of patterns compiled on import) are loaded by the first file the
# mirror parses, hashlib (it loads OpenSSL) by the first message it adds, pty by a notmuch new.
FORBIDDEN_WITH_NOTHING_NEW = ("fmail_nm.message.mime", "fmail_nm.message.text",
                              "fmail_nm.message.formats", "hashlib", "pty")


def test_a_post_new_run_with_nothing_new_loads_no_message_parser(indexed: MailEnv) -> None:
    """A ``notmuch new`` that found nothing (a timer's, a sync's with no new mail) still runs
    the hook, and pays for what it imports."""
    done = subprocess.run([sys.executable, "-c", RUN_HOOK], env={**os.environ, **indexed.env},
                          capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert "fmail_nm.passes.mirror" in report["modules"]  # the check saw the real path
    assert [m for m in FORBIDDEN_WITH_NOTHING_NEW if m in report["modules"]] == []


RUN_INDEX = """
import json, sys
from fmail_nm.cli import main
code = main(["index", "--quiet"])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""

# What an index run of new mail without invitations, moves or hook installs has no use for.
FORBIDDEN_ON_INDEX = ("ctypes", "fmail_nm.message.calendar", "importlib.resources")


def test_an_index_run_loads_no_calendar_reader_ctypes_or_hook_templates(
        indexed: MailEnv) -> None:
    inbox_new = indexed.mail_root / "personal" / "INBOX" / "new"
    (inbox_new / "1700000000.layering.host").write_bytes(
        b"From: Bob <bob@example.net>\nTo: alex@example.org\nSubject: rota\n"
        b"Message-ID: <layer-index@example.test>\nDate: Mon, 30 Nov 2026 10:00:00 +0000\n"
        b"Content-Type: text/html\n\n<p>the rota</p>\n")
    done = subprocess.run([sys.executable, "-c", RUN_INDEX], env={**os.environ, **indexed.env},
                          capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert sidecar.recipients_of(indexed.config().data_dir, ["layer-index@example.test"])
    loaded = [m for m in report["modules"]
              if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_ON_INDEX)]
    assert loaded == []
    assert "fmail_nm.message.mime" in report["modules"]  # the check saw the real path


RUN_INDEX_RECORDING_PATTERNS = """
import json, re, sys
compiled = []
_compile = re.compile
def recording(pattern, flags=0):
    compiled.append(pattern if isinstance(pattern, str) else "")
    return _compile(pattern, flags)
re.compile = recording
from fmail_nm.cli import main
code = main(["index", "--quiet"])
print(json.dumps({"code": code, "modules": sorted(sys.modules), "compiled": compiled}))
"""


def test_an_index_run_of_plain_mail_loads_no_html_hiding_or_ideograph_patterns(
        indexed: MailEnv) -> None:
    """Each delivery's index run pays for what it imports: what HTML hides (its patterns)
    is loaded by the first HTML-only message's preview, and the ideograph patterns (the regex
    compiler walks their wide ranges character by character) by the first text that looks
    like GBK in disguise -- not by plain mail."""
    inbox_new = indexed.mail_root / "personal" / "INBOX" / "new"
    (inbox_new / "1700000000.layering-plain.host").write_bytes(
        b"From: Bob <bob@example.net>\nTo: alex@example.org\nSubject: the caf\xe9\n"
        b"Message-ID: <layer-plain@example.test>\nDate: Mon, 30 Nov 2026 10:00:00 +0000\n"
        b"Content-Type: text/plain; charset=iso-8859-1\n\nLunch at the caf\xe9?\n")
    done = subprocess.run([sys.executable, "-c", RUN_INDEX_RECORDING_PATTERNS],
                          env={**os.environ, **indexed.env}, capture_output=True, text=True,
                          timeout=120, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert sidecar.recipients_of(indexed.config().data_dir, ["layer-plain@example.test"])
    assert "fmail_nm.message.mime" in report["modules"]  # the check saw the real path
    assert "fmail_nm.message.hidden" not in report["modules"]
    assert [p for p in report["compiled"] if "\u4e00" in p] == []


def test_reading_headers_loads_no_body_renderer() -> None:
    """The delivery an index run writes before ``notmuch new`` reads headers alone: the body
    renderers (dozens of patterns compiled on import) are loaded on a thread while Xapian
    commits, not before the delivery is written."""
    done = subprocess.run([sys.executable, "-c", "import json, sys, fmail_nm.passes.delivery; "
                           "print(json.dumps(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=120, check=True)
    modules = json.loads(done.stdout)
    assert "fmail_nm.message.headers" in modules  # the check saw the real path
    assert [m for m in ("fmail_nm.message.text", "fmail_nm.message.hidden",
                        "fmail_nm.message.mime") if m in modules] == []


def test_layers_listed_in_architecture_md_match_the_tree() -> None:
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    for package in sorted(p.name for p in PACKAGE.iterdir()
                          if p.is_dir() and (p / "__init__.py").exists()):
        assert f"{package}/" in text, f"fmail_nm/{package}/ is not described in ARCHITECTURE.md"
    for path in all_modules():
        if path.name == "__init__.py":
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        assert rel.removesuffix(".py") in text or path.stem in text, (
            f"fmail_nm/{rel} is not mentioned in ARCHITECTURE.md")
