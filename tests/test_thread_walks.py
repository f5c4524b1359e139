"""Thread listings while another program commits to the index.

libnotmuch builds each thread of a listing with a query of its own; once two commits have
overwritten the reader's snapshot, that query fails and libnotmuch 0.37 hands back a thread it
has already freed, and releasing it aborts the process.  These tests commit from another
process in the middle of a walk (the walk is run in a child process, so that an abort fails
the test instead of ending the suite) and check that the read starts again on the new index,
or says clearly that the index kept changing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from fmail_nm.store.notmuch import Reader

from .conftest import MailEnv

# The child: wraps the per-thread step of Reader.threads so that another process commits
# twice at the second thread of the walk -- after its messages are read ("between" threads)
# or before ("during" a thread) -- or after every thread ("every"); then lists 40 threads.
WALK = textwrap.dedent("""
    import json, subprocess, sys
    import fmail_nm.store.notmuch as nm

    mode = sys.argv[1]
    target = nm.Reader().message_ids("*")[0]
    real_authors, calls = nm.thread_authors, [0]

    def commit_twice():
        for change in ("+walk-probe", "-walk-probe"):
            subprocess.run(["notmuch", "tag", change, "--", "id:" + target], check=True)

    def authors_committing(pairs):
        calls[0] += 1
        if mode == "during" and calls[0] == 2:
            commit_twice()
        authors = real_authors(pairs)
        if (mode == "between" and calls[0] == 2) or mode == "every":
            commit_twice()
        return authors

    nm.thread_authors = authors_committing
    with nm.Reader() as reader:
        try:
            page = reader.threads("*", exclude_tags=(), limit=40)
        except nm.IndexKeptChanging as exc:
            print(json.dumps({"error": str(exc)}))
        else:
            print(json.dumps({"threads": [t.thread_id for t in page], "calls": calls[0]}))
""")


def walk_in_child(env: MailEnv, mode: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", WALK, mode], env={**os.environ, **env.env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the walk ended with {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout)


@pytest.mark.parametrize("when", ["between", "during"])
def test_commits_during_a_thread_listing_restart_it_instead_of_aborting(
        indexed: MailEnv, when: str) -> None:
    with Reader() as reader:
        before = [t.thread_id for t in reader.threads("*", exclude_tags=(), limit=40)]
    assert len(before) == 40
    answer = walk_in_child(indexed, when)
    # The walk saw the commits (it went on past them) and gave the whole page of the index
    # as it now stands: the probe tag came and went, so the same threads.
    assert answer["threads"] == before
    assert isinstance(answer["calls"], int) and answer["calls"] > 40


def test_an_index_that_keeps_changing_gives_a_clear_error(indexed: MailEnv) -> None:
    answer = walk_in_child(indexed, "every")
    assert "changed during each of" in str(answer.get("error")), answer
    assert "retry" in str(answer["error"])


def test_thread_ids_are_the_threads_notmuch_lists(shared_indexed: MailEnv) -> None:
    for query in ("*", "tag:inbox", "tag:unread and not tag:inbox", "from:nobody@example.invalid"):
        listed = shared_indexed.notmuch("search", "--output=threads", "--exclude=true",
                                        query).stdout.split()
        with Reader() as reader:
            ids = reader.thread_ids(query, exclude_tags=reader.exclude_tags())
        assert len(ids) == len(set(ids))
        assert {f"thread:{t}" for t in ids} == set(listed), query


def test_a_later_page_of_threads_is_the_same_part_of_the_whole_listing(
        shared_indexed: MailEnv) -> None:
    # A page past the first is built from the query narrowed to its own threads; the first
    # page is libnotmuch's own walk.  Every field, both orders, pages that end inside and
    # past the listing.
    with Reader() as reader:
        for query in ("*", "tag:inbox", "tag:unread", "from:alex", "subject:school"):
            for sort in ("newest", "oldest"):
                whole = reader.threads(query, sort=sort, limit=1000)
                assert whole, query
                for offset, limit in ((1, 1), (3, 5), (10, 20), (len(whole) - 1, 5),
                                      (len(whole), 5)):
                    page = reader.threads(query, sort=sort, offset=offset, limit=limit)
                    assert page == whole[offset:offset + limit], (query, sort, offset, limit)


def test_the_rest_of_a_thread_listing_builds_its_own_threads_alone(
        shared_indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The threads from an offset to the end (no limit) are the end of the whole listing,
    built from the query narrowed to them: libnotmuch built each skipped thread (reading
    every message of it) as it handed it out, only for it to be dropped."""
    built: list[str] = []
    handed_out = Reader._threads

    def counting(self: Reader, threads: Any) -> Iterator[Any]:
        for thread in handed_out(self, threads):
            built.append(str(thread.threadid))
            yield thread

    monkeypatch.setattr(Reader, "_threads", counting)
    with Reader() as reader:
        for sort in ("newest", "oldest"):
            whole = reader.threads("*", exclude_tags=(), sort=sort)
            assert len(whole) > 5
            built.clear()
            rest = reader.threads("*", exclude_tags=(), sort=sort, offset=len(whole) - 3)
            assert rest == whole[-3:] and len(built) == 3, (sort, len(built))
