"""What runs after ``notmuch new``: the mirror, the tagging pass, the blocklist.

The environment variables that carry an index run's facts to our ``post-new`` hook live here,
apart from the passes, so that reading them costs no import of the passes themselves."""

NEW_SINCE_ENV = "FMAIL_NEW_SINCE"  # the notmuch revision before the index run
PASS_AFTER_ENV = "FMAIL_PASS_AFTER"  # read by hooks/post-new: the caller runs the pass itself
