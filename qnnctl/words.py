"""Words for people: a count with its noun in the right number; text another party chose, escaped."""

from __future__ import annotations


def printable(text: str) -> str:
    """Text another party chose (a server's reason phrase, a device's name and properties, the
    names a model gives), fit for a terminal, a log and JSON alike: control characters, and any
    other character that is not printable, escaped: `Evil\\x1b]0;T\\x07` rather than a new
    window title."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def human_size(n: int) -> str:
    """A size as progress lines say it: bytes below 1 KiB, else KiB, MiB or GiB with one decimal."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{n} B"


def size_text(n: int) -> str:
    """A size in MiB, the one way `list` and `uninstall` say it: whole MiB from 10 MiB on
    (`241 MiB`), one decimal below (`1.3 MiB`)."""
    mib = n / (1 << 20)
    return f"{mib:.0f} MiB" if mib >= 9.95 else f"{mib:.1f} MiB"


def columns(rows: list[list[str]]) -> list[str]:
    """Rows as lines of aligned columns, two spaces apart; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 warning`, `2 warnings`, `0 SDKs`: `nouns` where adding an s is not the plural
    (`1 folder of it`, `2 folders of it`)."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {nouns if nouns is not None else noun + 's'}"
