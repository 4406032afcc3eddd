"""Knowing an SDK: the hosts it has libraries for, versions, build identity, layout, the cache, stores and
links, the pin, holds, components, locks and mirror indexes, the gate, and which SDK is selected.
"""
