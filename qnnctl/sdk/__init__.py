"""Knowing an SDK: versions, build identity, layout, the cache, stores and links, the pin, holds,
components, locks and mirror indexes, what an SDK must be (the gate), and which SDK is selected.
"""
