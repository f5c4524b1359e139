"""What runs after ``notmuch new``: the mirror, the tagging pass, the blocklist.

The environment variables that carry an index run's facts to our ``post-new`` hook live here,
apart from the passes, so that reading them costs no import of the passes themselves; so does
the size from which an index run indexes a delivery itself (``passes.delivery``), which it
checks before importing that module."""

NEW_SINCE_ENV = "FMAIL_NEW_SINCE"  # the notmuch revision before the index run
PASS_AFTER_ENV = "FMAIL_PASS_AFTER"  # read by hooks/post-new: the caller runs the pass itself
# A delivery smaller than this is notmuch new's: the delivery module and a write session of
# its own cost ~30 ms, which the rewrites saved (~1 ms a list message) pay back only from about
# here (measured on the benchmark's corpus: even at 50 new messages, 60 ms saved at 100).
DELIVERY_MIN_FILES = 50
