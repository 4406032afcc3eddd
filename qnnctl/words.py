"""Words for people: a count with its noun in the right number."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 warning`, `2 warnings`, `0 SDKs`: `nouns` where adding an s is not the plural
    (`1 folder of it`, `2 folders of it`)."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {nouns if nouns is not None else noun + 's'}"
