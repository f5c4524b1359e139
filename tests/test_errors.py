"""One error root: every exception fmail-nm raises on purpose is a CallerError or a
BackendError, and the MCP layer and the CLI each map the two branches in one place."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError as McpToolError

import fmail_nm
from fmail_nm.errors import BackendError, CallerError, FmailError
from fmail_nm.mcp.registry import tool_error
from fmail_nm.store.notmuch import DatabaseBusy, QueryError
from fmail_nm.tools.reads import ToolError

from .conftest import MailEnv, damage_index, run_init


def defined_exceptions() -> list[type[BaseException]]:
    for info in pkgutil.walk_packages(fmail_nm.__path__, "fmail_nm."):
        if not info.name.endswith("__main__"):  # running it would start the CLI
            importlib.import_module(info.name)
    found: list[type[BaseException]] = []
    pending: list[type[BaseException]] = [BaseException]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith("fmail_nm.") and cls not in found:
            found.append(cls)
    return found


def test_every_public_exception_has_the_one_root_and_one_branch() -> None:
    classes = [c for c in defined_exceptions() if not c.__name__.startswith("_")]
    assert len(classes) >= 15  # the walk found the package's exceptions, not nothing
    for cls in classes:
        if cls in (FmailError, CallerError, BackendError):
            continue
        assert issubclass(cls, FmailError), f"{cls.__module__}.{cls.__name__}"
        assert issubclass(cls, CallerError) != issubclass(cls, BackendError), cls


def test_caller_errors_reach_the_model_as_they_are() -> None:
    error = tool_error(ToolError("no message with id 'x'; use an id from search_emails"))
    assert isinstance(error, McpToolError)
    assert str(error) == "no message with id 'x'; use an id from search_emails"
    assert str(tool_error(QueryError("notmuch rejected the query: bad"))) == (
        "notmuch rejected the query: bad")


def test_backend_errors_tell_the_model_the_request_was_fine() -> None:
    text = str(tool_error(DatabaseBusy(10.0)))
    assert text.startswith("fmail-nm could not do this (not a problem with the request): ")
    assert "database busy" in text and "nothing was changed" in text


@pytest.mark.parametrize("argv,code", [
    (["contacts", "block"], 2),  # a usage mistake: CallerError
    (["sidecar", "check"], 1),  # no notmuch database here: BackendError (DatabaseMissing)
])
def test_the_cli_exits_2_for_the_callers_mistakes_and_1_for_the_machinerys(
        argv: list[str], code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from fmail_nm import cli

    mail = tmp_path / "mail"
    mail.mkdir()
    config = tmp_path / "notmuch-config"
    config.write_text(f"[database]\npath={mail}\n")
    for key, value in {"HOME": tmp_path, "XDG_CONFIG_HOME": tmp_path / "config",
                       "XDG_DATA_HOME": tmp_path / "data", "NOTMUCH_CONFIG": config}.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.delenv("FMAIL_CONFIG", raising=False)
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith("fmail-nm: ") and "Traceback" not in err


def files_of(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and ".notmuch" not in p.parts)


@pytest.mark.anyio
async def test_a_damaged_index_is_named_as_such_and_left_as_it_is(indexed: MailEnv) -> None:
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    mail_before = files_of(indexed.mail_root)
    listed_before = indexed.notmuch("search", "--output=messages", "tag:list").stdout
    postlist, damaged = damage_index(indexed)
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--tools", "all", "--no-push"],
                                   env={**os.environ, **indexed.env})
    async with Client(params) as client:
        for tool, args in [("search_emails", {"query": "in:inbox"}),
                           ("archive", {"ids": ["answered-2@example.com"]})]:
            result = await client.call_tool(tool, args)
            assert result.is_error, (tool, result.content)
            said = result.content[0].text  # type: ignore[union-attr]
            assert "not a problem with the request" in said, said
            assert "the notmuch database cannot be read" in said, said
            assert "move that folder aside and run `fmail-nm init`" in said, said
            assert "run `fmail-nm init` first" not in said, said
    init = run_init(indexed, check=False)
    assert init.returncode == 1 and "the notmuch database cannot be read" in init.stderr
    assert postlist.read_bytes() == damaged  # neither the server nor init wrote over it
    assert files_of(indexed.mail_root) == mail_before
    # The advice works: the folder moved aside, `fmail-nm init` builds the index again.
    xapian = postlist.parent
    xapian.rename(xapian.with_name("xapian.damaged"))
    run_init(indexed)
    assert indexed.notmuch("search", "--output=messages", "tag:list").stdout == listed_before



@pytest.mark.anyio
async def test_queries_libnotmuch_would_abort_on_are_refused_and_the_server_lives(
        shared_indexed: MailEnv) -> None:
    """libnotmuch 0.37 aborts the process on an empty thread: value (`notmuch count
    'thread:""'` dies the same way); a thread id that is a `{...}` query is no thread."""
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio",
                                         "--no-push"],
                                   env={**os.environ, **shared_indexed.env})
    async with Client(params) as client:
        for tool, args, said in [
                ("get_thread", {"thread_id": ""}, "no thread with id ''"),
                ("get_thread", {"thread_id": "thread:"}, "no thread with id 'thread:'"),
                ("get_thread", {"thread_id": "{tag:spam}"}, "no thread with id '{tag:spam}'"),
                ("search_emails", {"query": r'raw:"thread:\"\""'}, "an empty thread: value"),
                ("search_emails", {"query": r'raw:"tag:inbox -thread:\"\""'},
                 "an empty thread: value"),
                ("list_threads", {"query": r'raw:"thread:\"\""'}, "an empty thread: value")]:
            result = await client.call_tool(tool, args)
            assert result.is_error, (tool, args, result.content)
            text = result.content[0].text  # type: ignore[union-attr]
            assert said in text, (tool, args, text)
        alive = await client.call_tool("search_emails", {"query": "in:inbox", "limit": 1})
        assert not alive.is_error and alive.structured_content is not None
