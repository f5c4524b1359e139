"""The tag vocabulary fmail-nm shares with notmuch, afew, lieer and aerc -- the one place that
says which tag means what, and which folder role implies which tag.

The default tagging rules (config.DEFAULT_RULES), the search language (dsl), the move engine
(passes.changes), the blocklist and the read tools all take their tag names from here.
"""

from __future__ import annotations

# notmuch's own: `notmuch new` gives NEW to what it indexes (new.tags); the post-new pass
# removes it.  A caller must never add it: the next index run would silently take it away.
NEW = "new"
RESERVED = frozenset({NEW})

# Tags notmuch keeps in step with Maildir flags (maildir.synchronize_flags): D F P R and not-S.
DRAFT, FLAGGED, PASSED, REPLIED, UNREAD = "draft", "flagged", "passed", "replied", "unread"
FLAG_TAGS = frozenset({DRAFT, FLAGGED, PASSED, REPLIED, UNREAD})

INBOX = "inbox"
SENT = "sent"  # from one of the user's addresses (drafts excepted)
LIST = "list"  # mailing-list mail; also list/<list-id>
ATTACHMENT = "attachment"  # set by notmuch itself
DELETED, SPAM, ARCHIVED = "deleted", "spam", "archived"
BLOCKED = "blocked"  # the sender is on the blocklist

# The tag a message carries because one of its files sits in a folder of this role.
ROLE_TAGS: dict[str, str] = {"trash": DELETED, "junk": SPAM, "archive": ARCHIVED}
# Tags that say where a message lives; a move recomputes them (see passes.tagging.place_tags).
PLACE_TAGS = (INBOX, *ROLE_TAGS.values())
# Mail that is never in the inbox, wherever its file is: the user's own, drafts, list mail.
NEVER_INBOX = (SENT, DRAFT, LIST)

# The tags of the vocabulary above: a list of tags cut short keeps these (see tools.dto).
STANDARD = FLAG_TAGS | {INBOX, SENT, LIST, ATTACHMENT, DELETED, SPAM, ARCHIVED, BLOCKED}

# Hidden from searches unless asked for: notmuch's search.exclude_tags as fmail-nm writes it,
# and what a search excludes when the user's notmuch config names none.
DEFAULT_EXCLUDED = (DELETED, SPAM)

# Blocking a sender adds these and takes BLOCK_HIDES away (recorded, so unblocking undoes
# exactly that).
BLOCK_TAGS = (BLOCKED, SPAM)
BLOCK_HIDES = (INBOX,)
