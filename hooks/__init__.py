"""The notmuch hook scripts fmail-nm installs (shipped as package data; see fmail_nm.adopt.hooks)."""
