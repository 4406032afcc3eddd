"""Teams pin, share and mirror SDKs: `qnnctl lock` and `install --locked` (locking), a mirror's
folder and its index.json (mirror), filled from archives you have too (archives).
"""
