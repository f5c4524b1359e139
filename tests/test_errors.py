"""One error root: every exception fmail-nm raises on purpose is a CallerError or a
BackendError, and the MCP layer and the CLI each map the two branches in one place."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError as McpToolError

import fmail_nm
from fmail_nm.errors import BackendError, CallerError, FmailError
from fmail_nm.mcp.registry import tool_error
from fmail_nm.store.notmuch import DatabaseBusy, QueryError
from fmail_nm.tools.reads import ToolError


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
