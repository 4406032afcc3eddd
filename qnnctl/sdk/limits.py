"""Text that others wrote (a project's qnnctl.lock, a mirror's index.json) is read with limits:
its size, and how deep it nests, measured before a parser that recurses once per level sees it."""

from __future__ import annotations


def nesting_depth(text: str) -> int:
    """How deep arrays, tables and objects nest in TOML or JSON `text`, strings and TOML's
    comments skipped, without parsing it. Valid JSON holds no `#` or `'` outside its strings,
    so the one reading serves both."""
    depth = deepest = i = 0
    while i < len(text):
        c = text[i]
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(depth - 1, 0)
        elif c == "#":
            i = text.find("\n", i)
            if i < 0:
                break
        elif c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            j = i + len(quote)
            while j < len(text) and not text.startswith(quote, j):
                j += 2 if c == '"' and text[j] == "\\" else 1  # only basic strings escape
            i = j + len(quote) - 1
        i += 1
    return deepest
