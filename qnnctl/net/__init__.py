"""Talking to servers: HTTP on the standard library, URLs and their redaction, the retry policy,
whole and ranged downloads. Nothing here knows what an SDK is; everything above uses it to move bytes.
"""
