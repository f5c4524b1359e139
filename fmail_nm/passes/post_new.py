"""The post-new pass: what follows every ``notmuch new`` -- the hook runs it, and
:func:`fmail_nm.service.index.run_index` runs it again for anything the hook did not reach."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Config
from ..store.notmuch import Reader, Writer
from .blocklist import BlockReport, apply_blocklist, read_blocklist
from .mirror import MirrorReport, sync_sidecar
from .tagging import TaggingReport, run_tagging


@dataclass(frozen=True)
class PostNewReport:
    tagging: TaggingReport
    blocklist: BlockReport
    mirror: MirrorReport


def post_new(config: Config, reader: Reader, writer: Writer) -> PostNewReport:
    """What follows every ``notmuch new``: tag new mail, apply the blocklist, sync the sidecar
    (in that order: the sidecar mirrors the final tags)."""
    tagging = run_tagging(config, reader, writer)
    blocklist = apply_blocklist(config, reader, writer, read_blocklist(config))
    return PostNewReport(tagging, blocklist, sync_sidecar(config, reader))
