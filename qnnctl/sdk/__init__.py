"""Knowing an SDK: versions, build identity, the cache, stores and links, the pin, holds,
components, and which SDK is selected for a folder and a shell. No downloads, no commands.
"""
