"""The one root of fmail-nm's exceptions, and its two branches.

Every error fmail-nm raises on purpose derives from :class:`FmailError` through one of:

* :class:`CallerError` -- the request can be fixed by whoever made it: an unknown id, a bad
  search, a bad argument, an unknown account, SQL the sandbox refuses.  The text says what to
  change.  The MCP layer hands it to the model as it is; the CLI exits 2.
* :class:`BackendError` -- the request was fine, the machinery failed: the notmuch database is
  busy, missing or corrupt, the sidecar cannot be opened, mbsync is not installed, another
  process is syncing.  The MCP layer tells the model so (it must not rewrite its request over
  it); the CLI exits 1.

Both map to answers in exactly one place each: :func:`fmail_nm.mcp.registry.tool_error` and
``fmail_nm.cli.main``.
"""

from __future__ import annotations


class FmailError(Exception):
    """Anything fmail-nm reports on purpose."""


class CallerError(FmailError, ValueError):
    """A request the caller can fix; the text says how."""


class BackendError(FmailError, RuntimeError):
    """The request was fine but the mail store, the sidecar or a tool behind it failed."""
