"""The contacts the user keeps (fmail_nm.tools.contacts): CSV export/import, blocking by
address, search and listing -- on a bare migrated sidecar, and through the CLI on the fixture
mail."""

from __future__ import annotations

import csv
import io
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fmail_nm import cli
from fmail_nm.errors import CallerError
from fmail_nm.store import sidecar
from fmail_nm.tools.contacts import (
    export_csv,
    format_rows,
    import_csv,
    normalize_address,
    search,
    set_blocked,
)

from .conftest import MailEnv

OWN = "alex@example.org"
BANK = "no-reply@northwind-bank.example.com"

NASTY_NOTES = 'class rep, says "call me"\nsecond line; tab\there, \'single\' and ünïcödé — 日本語 ✓'


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    with sidecar.opened(tmp_path / "s.sqlite3") as c:
        yield c


def add(conn: sqlite3.Connection, address: str, name: str | None = None, blocked: int = 0,
        notes: str | None = None, updated_at: str = "2020-01-01T00:00:00Z") -> None:
    conn.execute("INSERT INTO contact_info (email_address, name, is_blocked, notes, updated_at) "
                 "VALUES (?, ?, ?, ?, ?)", (address, name, blocked, notes, updated_at))


def table(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    """contact_info as it is, updated_at included (to see rows an edit must not touch)."""
    return conn.execute("SELECT email_address, name, is_blocked, notes, updated_at "
                        "FROM contact_info ORDER BY email_address").fetchall()


def kept(conn: sqlite3.Connection) -> dict[str, tuple[Any, ...]]:
    """What the user keeps per address (name, is_blocked, notes)."""
    return {row[0]: tuple(row[1:]) for row in conn.execute(
        "SELECT email_address, name, is_blocked, notes FROM contact_info")}


def import_text(conn: sqlite3.Connection, text: str) -> int:
    return import_csv(conn, io.StringIO(text, newline=""))


def raw(path: Path) -> str:
    """A file's text with its line ends as written (CSV rows end in CRLF)."""
    with path.open(newline="", encoding="utf-8") as fh:
        return fh.read()


def exported(conn: sqlite3.Connection) -> str:
    out = io.StringIO(newline="")
    export_csv(conn, out)
    return out.getvalue()


# ---------------------------------------------------------------------------------------------
# Export and import


def test_round_trip_into_a_fresh_sidecar_keeps_names_notes_and_blocks(
        conn: sqlite3.Connection, tmp_path: Path) -> None:
    add(conn, "anna.schmidt@example.com", "Schmidt, Anna \"Annie\"", 0, NASTY_NOTES)
    add(conn, "junk@prizes.example.net", None, 1, None)
    add(conn, "zoe@example.fr", "Zoë Ærøskøbing", 1, "prefers\r\nphone, not mail")
    add(conn, "plain@example.com", None, 0, None)
    original = kept(conn)

    csv_file = tmp_path / "contacts.csv"
    with csv_file.open("w", newline="", encoding="utf-8") as out:
        assert export_csv(conn, out) == 4

    with sidecar.opened(tmp_path / "fresh.sqlite3") as fresh:
        assert table(fresh) == []
        with csv_file.open(newline="", encoding="utf-8") as source:
            assert import_csv(fresh, source) == 4
        assert kept(fresh) == original
        assert sidecar.blocked_addresses(fresh) == {"junk@prizes.example.net", "zoe@example.fr"}
        # and exporting the copy gives the same file again
        assert exported(fresh) == raw(csv_file)


def test_export_writes_the_header_and_one_sorted_row_per_contact(conn: sqlite3.Connection) -> None:
    add(conn, "b@example.com", "Bea", 1, "x, y")
    add(conn, "a@example.com", None, 0, None)
    assert exported(conn) == ('email_address,name,is_blocked,notes\r\n'
                              'a@example.com,,0,\r\n'
                              'b@example.com,Bea,1,"x, y"\r\n')


def test_export_of_no_contacts_is_the_header_alone(conn: sqlite3.Connection) -> None:
    out = io.StringIO(newline="")
    assert export_csv(conn, out) == 0
    assert list(csv.reader(io.StringIO(out.getvalue()))) == [
        ["email_address", "name", "is_blocked", "notes"]]


def test_a_row_replaces_its_address_and_leaves_the_others(conn: sqlite3.Connection) -> None:
    add(conn, "a@example.com", "Old A", 1, "old notes")
    add(conn, "b@example.com", "Bea", 1, "keep me")
    before_b = [r for r in table(conn) if r[0] == "b@example.com"]
    n = import_text(conn, "email_address,name,is_blocked,notes\n"
                          "a@example.com,New A,0,\n"
                          "c@example.com,Cid,1,new contact\n")
    assert n == 2
    assert kept(conn) == {
        "a@example.com": ("New A", 0, None),  # name, block and (emptied) notes replaced
        "b@example.com": ("Bea", 1, "keep me"),
        "c@example.com": ("Cid", 1, "new contact"),
    }
    assert [r for r in table(conn) if r[0] == "b@example.com"] == before_b  # not even touched
    a = next(r for r in table(conn) if r[0] == "a@example.com")
    assert a[4] != "2020-01-01T00:00:00Z"  # updated_at moved on for the replaced row


def test_a_column_the_csv_lacks_keeps_that_field(conn: sqlite3.Connection) -> None:
    """A names-only list (from an address book) erased every listed contact's notes and
    unblocked its senders: notes and blocks live nowhere else."""
    add(conn, "a@example.com", "Anna", 0, "met at the PTA")
    add(conn, "spam@bad.example", "Spammer", 1, "phishing")
    assert import_text(conn, "email_address,name\n"
                             "a@example.com,Anna Schmidt\nspam@bad.example,Spammer Inc\n"
                             "new@example.com,Neu\n") == 3
    assert import_text(conn, "email_address,is_blocked\na@example.com,1\n") == 1
    assert kept(conn) == {"a@example.com": ("Anna Schmidt", 1, "met at the PTA"),
                          "spam@bad.example": ("Spammer Inc", 1, "phishing"),
                          "new@example.com": ("Neu", 0, None)}


@pytest.mark.parametrize("bad", ["broken", "", "@example.com", "user@", "Name <>"])
def test_a_bad_address_aborts_the_whole_import_naming_its_line(
        conn: sqlite3.Connection, bad: str) -> None:
    add(conn, "a@example.com", "Anna", 1, "notes")
    before = table(conn)
    text = ("email_address,name,is_blocked,notes\n"
            "a@example.com,Changed,0,changed\n"      # line 2: would replace
            "new@example.com,New,1,\n"               # line 3: would add
            f"{bad},Bad,1,\n"                        # line 4
            "later@example.com,Later,0,\n")
    with pytest.raises(CallerError, match=r"\bline 4\b"):
        import_text(conn, text)
    assert table(conn) == before
    # the connection is usable afterwards (the transaction was rolled back, not left open)
    assert not conn.in_transaction
    assert import_text(conn, "email_address\nok@example.com\n") == 1


def test_an_address_named_twice_aborts_the_import_naming_both_lines(
        conn: sqlite3.Connection) -> None:
    """The later row silently won: a block on line 2 undone by a row further down (the same
    address in capitals, or its domain in ACE), and the count said two contacts."""
    add(conn, "a@example.com", "Anna", 1, "notes")
    before = table(conn)
    with pytest.raises(CallerError, match=r"line 4: .*b\u00fccher.example.*line 2"):
        import_text(conn, "email_address,is_blocked\n"
                          "spam@b\u00fccher.example,1\n"
                          "a@example.com,1\n"
                          "SPAM@xn--bcher-kva.example,0\n")
    assert table(conn) == before


def test_a_csv_without_an_email_address_column_is_refused(conn: sqlite3.Connection) -> None:
    add(conn, "a@example.com", "Anna", 1)
    before = table(conn)
    for text in ("email,name,is_blocked\na@example.com,X,0\n", "", "name\nAnna\n"):
        with pytest.raises(CallerError, match="email_address"):
            import_text(conn, text)
    assert table(conn) == before


def test_a_header_only_csv_imports_nothing(conn: sqlite3.Connection) -> None:
    add(conn, "a@example.com", "Anna", 1)
    before = table(conn)
    assert import_text(conn, "email_address,name,is_blocked,notes\n") == 0
    assert table(conn) == before


@pytest.mark.parametrize("value,blocked", [
    ("1", 1), ("true", 1), ("TRUE", 1), ("True", 1), ("yes", 1), (" Yes ", 1),
    ("0", 0), ("false", 0), ("FALSE", 0), ("no", 0),
])
def test_is_blocked_spellings(conn: sqlite3.Connection, value: str, blocked: int) -> None:
    add(conn, "was-blocked@example.com", None, 1)
    add(conn, "was-open@example.com", None, 0)
    import_text(conn, "email_address,is_blocked\n"
                      f"was-blocked@example.com,{value}\n"
                      f"was-open@example.com,{value}\n")
    assert kept(conn) == {"was-blocked@example.com": (None, blocked, None),
                          "was-open@example.com": (None, blocked, None)}


def test_an_empty_is_blocked_cell_keeps_the_block_and_adds_unblocked(
        conn: sqlite3.Connection) -> None:
    """An empty cell unblocked the sender, which an export never writes (it says 0 or 1)."""
    add(conn, "was-blocked@example.com", None, 1, "spam")
    add(conn, "was-open@example.com", None, 0)
    import_text(conn, "email_address,is_blocked,notes\nwas-blocked@example.com,,\n"
                      "was-open@example.com, ,\nnew@example.com,,\n")
    assert kept(conn) == {"was-blocked@example.com": (None, 1, None),
                          "was-open@example.com": (None, 0, None),
                          "new@example.com": (None, 0, None)}


@pytest.mark.parametrize("row, said", [
    ("q@example.net,Quinn,0,met at conf, Berlin 2025", "5 cells for the header's 4 columns"),
    ("q@example.net,Quinn,0", "3 cells for the header's 4 columns"),
    ("q@example.net", "1 cell for the header's 4 columns"),
])
def test_a_row_with_more_or_fewer_cells_than_the_header_aborts_the_import(
        conn: sqlite3.Connection, row: str, said: str) -> None:
    """Cells past the header were dropped without a word (the rest of a note after an
    unquoted comma); missing ones were read as empty, emptying the name or notes."""
    add(conn, "q@example.net", "Quinn", 1, "kept")
    before = table(conn)
    with pytest.raises(CallerError, match=rf"^line 3: {said}"):
        import_text(conn, f"email_address,name,is_blocked,notes\nok@example.com,Ok,0,\n{row}\n")
    assert table(conn) == before


@pytest.mark.parametrize("value", ["y", "2", "blocked"])
def test_an_unknown_is_blocked_value_is_a_bad_row(conn: sqlite3.Connection, value: str) -> None:
    add(conn, "spammer@example.net", None, 1)
    before = table(conn)
    with pytest.raises(CallerError, match=r"\bline 2\b"):
        import_text(conn, f"email_address,is_blocked\nspammer@example.net,{value}\n")
    assert table(conn) == before


def test_imported_addresses_are_normalised(conn: sqlite3.Connection) -> None:
    n = import_text(conn, "email_address,name,is_blocked\n"
                          "  Anna.Schmidt@Example.COM  ,Anna,0\n"
                          '"Bob Stone <BOB@Example.org>",Bob,1\n'
                          "<carol@EXAMPLE.net>,Carol,0\n")
    assert n == 3
    assert sorted(kept(conn)) == ["anna.schmidt@example.com", "bob@example.org",
                                  "carol@example.net"]
    # another spelling of an address already there replaces that row, not a second one
    import_text(conn, 'email_address,name,is_blocked\n"Robert <bob@EXAMPLE.ORG>",Robert,0\n')
    assert kept(conn)["bob@example.org"] == ("Robert", 0, None)
    assert len(kept(conn)) == 3


@pytest.mark.parametrize("before_bad", [
    'a@example.com,Anna,0,"two\nlines"\n',
    "a@example.com,Anna,0,\n\n",
], ids=["multiline-note", "blank-line"])
def test_the_line_named_is_the_bad_rows_line_in_the_file(
        conn: sqlite3.Connection, before_bad: str) -> None:
    text = "email_address,name,is_blocked,notes\n" + before_bad + "broken,Bad,0,\n"
    bad_line = text.splitlines().index("broken,Bad,0,") + 1  # 4 in both cases
    with pytest.raises(CallerError, match=rf"\bline {bad_line}\b"):
        import_text(conn, text)


def test_import_refuses_to_block_the_users_own_address(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO me (email) VALUES (?)", (OWN,))
    add(conn, "a@example.com", "Anna", 0)
    before = table(conn)
    with pytest.raises(CallerError, match=OWN):
        import_text(conn, f"email_address,is_blocked\nspam@example.net,1\nAlex <{OWN.upper()}>,1\n")
    assert table(conn) == before


def test_import_may_keep_notes_on_the_users_own_address(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO me (email) VALUES (?)", (OWN,))
    assert import_text(conn, f"email_address,name,is_blocked,notes\n{OWN},Alex,0,me\n") == 1
    assert kept(conn) == {OWN: ("Alex", 0, "me")}


# ---------------------------------------------------------------------------------------------
# Addresses and blocking


@pytest.mark.parametrize("text,address", [
    ("a@example.com", "a@example.com"),
    ("  A@Example.COM ", "a@example.com"),
    ("Anna Schmidt <Anna.Schmidt@Example.com>", "anna.schmidt@example.com"),
    ('"Schmidt, Anna" <anna@example.com>', "anna@example.com"),
    ("<x@y.z>", "x@y.z"),
])
def test_normalize_address(text: str, address: str) -> None:
    assert normalize_address(text) == address


@pytest.mark.parametrize("text", ["", "anna", "@example.com", "anna@", "Anna <>", "Anna"])
def test_normalize_address_refuses_what_is_not_an_address(text: str) -> None:
    with pytest.raises(CallerError, match="not an email address"):
        normalize_address(text)


def test_set_blocked_normalises_adds_and_keeps_names_and_notes(conn: sqlite3.Connection) -> None:
    add(conn, "bob@example.org", "Bob", 0, "the neighbour")
    done = set_blocked(conn, ["Bob <BOB@example.org>", "bob@example.org", "New@Spam.test"], True)
    assert done == ["bob@example.org", "new@spam.test"]
    assert kept(conn) == {"bob@example.org": ("Bob", 1, "the neighbour"),
                          "new@spam.test": (None, 1, None)}
    assert set_blocked(conn, ["bob@example.org"], False) == ["bob@example.org"]
    assert kept(conn)["bob@example.org"] == ("Bob", 0, "the neighbour")
    assert kept(conn)["new@spam.test"] == (None, 1, None)


def test_set_blocked_refuses_the_users_own_address_and_changes_nothing(
        conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO me (email) VALUES (?)", (OWN,))
    add(conn, OWN, "Alex", 0, "me")
    add(conn, "a@example.com", "Anna", 0)
    before = table(conn)
    with pytest.raises(CallerError, match=rf"{OWN}.*own address"):
        set_blocked(conn, ["spam@example.net", f"Alex <{OWN.upper()}>"], True)
    with pytest.raises(CallerError, match="alex[+]lists@example.org.*own address"):
        set_blocked(conn, ["alex+lists@example.org"], True)  # a sub-address of the user's
    assert table(conn) == before  # spam@example.net was not added either
    # unblocking one's own address is harmless and allowed
    assert set_blocked(conn, [OWN], False) == [OWN]
    assert kept(conn)[OWN] == ("Alex", 0, "me")


def test_set_blocked_with_one_bad_address_changes_nothing(conn: sqlite3.Connection) -> None:
    add(conn, "a@example.com", "Anna", 0)
    before = table(conn)
    with pytest.raises(CallerError, match="not an email address"):
        set_blocked(conn, ["spam@example.net", "nonsense"], True)
    assert table(conn) == before


# ---------------------------------------------------------------------------------------------
# Search and listing


def test_search_and_format_rows(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO me (email) VALUES (?)", (OWN,))
    add(conn, OWN, "Alex Morgan", 0)
    add(conn, "anna@example.com", "Anna Schmidt", 0, "class rep")
    add(conn, "junk@prizes.example.net", None, 1)
    conn.execute("INSERT INTO contact_stats VALUES ('anna@example.com', 'Anna S', "
                 "'2024-01-01', '2025-02-03', 7, 2)")

    assert [r["email_address"] for r in search(conn)] == [
        "anna@example.com", OWN, "junk@prizes.example.net"]  # most mail first, then address
    assert [r["email_address"] for r in search(conn, "SCHMIDT")] == ["anna@example.com"]
    assert [r["email_address"] for r in search(conn, "prizes")] == ["junk@prizes.example.net"]
    assert [r["email_address"] for r in search(conn, blocked_only=True)] == [
        "junk@prizes.example.net"]
    assert len(search(conn, limit=1)) == 1
    assert conn.row_factory is None  # put back

    assert format_rows(search(conn)) == (
        "Anna Schmidt <anna@example.com>  from 7, to 2, last 2025-02-03  notes: class rep\n"
        f"Alex Morgan <{OWN}> [me]  from 0, to 0, last -\n"
        "<junk@prizes.example.net> [blocked]  from 0, to 0, last -\n")


@pytest.mark.parametrize(("text", "found"), [
    ("müller", ["jm@example.de"]),  # SQLite's lower() left 'MÜLLER' as it was
    ("Muller", ["jm@example.de"]),  # a keyboard without umlauts, as mutt users type
    ("JURGEN", ["jm@example.de"]),
    ("strasse", ["hs@example.de"]),  # ß is ss
    ("ZOË", ["zoe@example.net"]),
    ("a_b", ["a_b@example.com"]),  # _ and % are what they are, not LIKE's wildcards
    ("100%", ["p@example.com"]),
])
def test_search_ignores_case_and_accents_and_takes_the_text_literally(
        conn: sqlite3.Connection, text: str, found: list[str]) -> None:
    add(conn, "jm@example.de", "JÜRGEN MÜLLER")
    add(conn, "hs@example.de", "Hans Straße")
    add(conn, "zoe@example.net", "Zoë")
    add(conn, "a_b@example.com")
    add(conn, "axb@example.com", "100 percent")
    add(conn, "p@example.com", "100% Deals")
    assert [r["email_address"] for r in search(conn, text)] == found


# ---------------------------------------------------------------------------------------------
# The CLI: `fmail-nm contacts export|import FILE` on the indexed fixture mail


def sidecar_of(env: MailEnv) -> Path:
    return sidecar.sidecar_path(env.config().data_dir)


def tags_of(env: MailEnv, query: str) -> set[str]:
    return set(env.notmuch("search", "--output=tags", "--exclude=false", query).stdout.split())


def test_cli_export_and_import(indexed: MailEnv, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    path = sidecar_of(indexed)
    with sidecar.opened(path) as conn:
        assert OWN in {row[0] for row in conn.execute("SELECT email FROM me")}
        conn.execute("UPDATE contacts SET notes = ? WHERE email_address = "
                     "'anna.schmidt@example.com'", (NASTY_NOTES,))
    assert cli.main(["contacts", "block", BANK, "--no-push"]) == 0
    assert "blocked" in tags_of(indexed, f"from:{BANK}")
    capsys.readouterr()

    out_file = tmp_path / "export dir" / "contacts.csv"
    out_file.parent.mkdir()
    assert cli.main(["contacts", "export", str(out_file)]) == 0
    assert "exported 2 contacts" in capsys.readouterr().err
    with out_file.open(newline="", encoding="utf-8") as fh:
        rows = {r["email_address"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"anna.schmidt@example.com", BANK}
    assert rows["anna.schmidt@example.com"]["notes"] == NASTY_NOTES
    assert rows[BANK]["is_blocked"] == "1"

    assert cli.main(["contacts", "export"]) == 0  # no file: the CSV on stdout
    assert capsys.readouterr().out == raw(out_file)

    # Import an edited copy: the bank unblocked (its mail released), a new blocked sender.
    edited = tmp_path / "edited.csv"
    edited.write_text("email_address,name,is_blocked,notes\n"
                      f"{BANK},Northwind,0,it was real after all\n"
                      "ParcelGo <TRACKING@parcelgo.example.net>,,yes,\n", encoding="utf-8")
    assert cli.main(["contacts", "import", str(edited), "--no-push"]) == 0
    assert "imported 2 contacts" in capsys.readouterr().out
    with sidecar.opened(path) as conn:
        assert kept(conn) == {
            "anna.schmidt@example.com": (None, 0, NASTY_NOTES),
            BANK: ("Northwind", 0, "it was real after all"),
            "tracking@parcelgo.example.net": (None, 1, None),
        }
    assert "blocked" not in tags_of(indexed, f"from:{BANK}")
    assert "blocked" in tags_of(indexed, "from:tracking@parcelgo.example.net")


def test_cli_import_of_a_bad_file_changes_nothing(indexed: MailEnv, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["contacts", "block", BANK, "--no-push"]) == 0
    with sidecar.opened(sidecar_of(indexed)) as conn:
        before = table(conn)
    bad = tmp_path / "bad.csv"
    bad.write_text(f"email_address,is_blocked\n{BANK},0\ntracking@parcelgo.example.net,1\nbroken,1\n")
    capsys.readouterr()
    assert cli.main(["contacts", "import", str(bad), "--no-push"]) == 2
    assert "line 4" in capsys.readouterr().err
    no_column = tmp_path / "no-column.csv"
    no_column.write_text("email,is_blocked\nx@example.com,1\n")
    assert cli.main(["contacts", "import", str(no_column), "--no-push"]) == 2
    assert "email_address" in capsys.readouterr().err
    latin1 = tmp_path / "latin1.csv"  # a spreadsheet's plain "CSV": the local code page
    latin1.write_bytes("email_address,name\nx@example.com,Zoë\n".encode("latin-1"))
    assert cli.main(["contacts", "import", str(latin1), "--no-push"]) == 2
    assert f"{latin1} is not UTF-8 text: save it as CSV UTF-8" in capsys.readouterr().err
    with sidecar.opened(sidecar_of(indexed)) as conn:
        assert table(conn) == before
    assert "blocked" in tags_of(indexed, f"from:{BANK}")
    assert "blocked" not in tags_of(indexed, "from:tracking@parcelgo.example.net")


def test_cli_import_cannot_block_the_users_own_mail(indexed: MailEnv, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["contacts", "block", OWN, "--no-push"]) == 2  # the CLI's block refuses
    assert "own address" in capsys.readouterr().err
    own_csv = tmp_path / "own.csv"
    own_csv.write_text(f"email_address,is_blocked\n{OWN},1\n")
    cli.main(["contacts", "import", str(own_csv), "--no-push"])
    assert "blocked" not in tags_of(indexed, f"from:{OWN}")
    with sidecar.opened(sidecar_of(indexed)) as conn:
        assert OWN not in sidecar.blocked_addresses(conn)


def test_a_cell_a_spreadsheet_would_run_is_exported_inert_and_imported_as_it_was(
        conn: sqlite3.Connection, tmp_path: Path) -> None:
    """Notes can come from mail through the model: '=cmd|...' opened in a spreadsheet runs."""
    add(conn, "a@example.com", name="=HYPERLINK(\"http://evil.test\")",
        notes="=cmd|' /C calc'!A0")
    add(conn, "b@example.com", name="-minus", notes="@sum")
    text = exported(conn)
    assert "'=cmd|' /C calc'!A0" in text and "'=HYPERLINK" in text and "'-minus" in text
    before = kept(conn)
    with sidecar.opened(tmp_path / "fresh.sqlite3") as fresh:
        assert import_text(fresh, text) == 2
        assert kept(fresh) == before


def test_an_address_or_quoted_cell_a_spreadsheet_would_run_comes_back_as_it_was(
        conn: sqlite3.Connection, tmp_path: Path) -> None:
    """An address may start with - + or = too: export made it inert ('-…) and import kept the
    quote, so a round trip turned the block of -offers@… into one of an address no mail has;
    and a cell starting with a quote before such a character lost its quote."""
    add(conn, "-offers@shop.example", blocked=1)
    add(conn, "+1@sms.example", notes="text gateway")
    add(conn, "q@example.com", name="'-'", notes="''=quoted formula")  # lost a quote
    before = kept(conn)
    with sidecar.opened(tmp_path / "fresh.sqlite3") as fresh:
        assert import_text(fresh, exported(conn)) == 3
        assert kept(fresh) == before


@pytest.mark.parametrize("text", [
    'email_address,name\nx@example.com,"unterminated,0\n',
    "email_address,name\nx@example.com," + "y" * 200_000 + "\n",
])
def test_a_file_that_is_not_csv_is_refused_whole(conn: sqlite3.Connection, text: str) -> None:
    add(conn, "keep@example.com", notes="kept")
    before = table(conn)
    with pytest.raises(CallerError, match="line .*: not CSV"):
        import_text(conn, "email_address\nok@example.com\n" + text.split("\n", 1)[1])
    assert table(conn) == before


def test_a_csv_utf8_file_with_a_byte_order_mark_imports(indexed: MailEnv, tmp_path: Path) -> None:
    """Spreadsheets save "CSV UTF-8" with a BOM, which hid the email_address column."""
    path = tmp_path / "contacts.csv"
    path.write_bytes("\ufeffemail_address,name,is_blocked,notes\r\n"
                     "zoe@example.net,Zoë,0,from the BOM file\r\n".encode("utf-8"))
    done = indexed.fmail("contacts", "import", str(path))
    assert "1" in done.stdout
    exported_text = indexed.fmail("contacts", "export").stdout
    assert "zoe@example.net,Zoë,0,from the BOM file" in exported_text
