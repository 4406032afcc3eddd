"""Teams pin, share and mirror SDKs: `qnnctl lock` and `install --locked` (locking), a mirror's
folder and its index.json (mirror), archives you have added to it (archives), above the install
pipeline they feed.
"""
