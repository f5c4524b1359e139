"""fmail-nm: an MCP server and indexer for mail kept offline with mbsync and notmuch."""

__version__ = "0.1.0"
