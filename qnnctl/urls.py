"""URLs as qnnctl shows and keeps them: without the secrets they may carry.

A mirror's URL can hold a password (`https://user:pw@host/...`) and a signed URL a token
(`...?X-Amz-Signature=...`). Everything qnnctl prints, logs or stores goes through `redact`,
so that neither ends up in a terminal, a CI log, a bug report or a file in the cache.
"""

from __future__ import annotations

import re

MASK = "***"

# Words in free text that may be URLs or a request target with a query (urllib3 writes
# "... with url: /path?token=... (Caused by ...)"). Quotes and brackets end a word.
_WORD = re.compile(r"[^\s'\"<>()\[\]]+")


def redact(url: str) -> str:
    """`url` fit to print, log or store: the userinfo becomes `***`, and so does every value
    of its query and fragment; the names stay, so that one can still see what was sent.

    `http://user:pw@host/v.zip?token=abc&v=1#k=x` -> `http://***@host/v.zip?token=***&v=***#k=***`

    Never raises: a URL that does not parse is masked by the same rules, on its text.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    before, at, after = rest.rpartition("@")
    if at:
        # The userinfo ends at the last "@", wherever it is: a password typed as it is may hold
        # "/", "?", "#" and "@" (base64 holds "/"), and no parser agrees on where it stops (a
        # browser ends the authority at the first "/", urllib3 too). A path or query holding an
        # "@" hides more than it need: never less.
        if any(c in before for c in "?#"):
            # The "@" may be in a query or a fragment, whose later values stay hidden.
            items, hashmark, fragment = after.partition("#")
            return scheme + sep + MASK + at + _mask_values(items) + hashmark + _mask_values(fragment)
        rest = MASK + at + after
    rest, hashmark, fragment = rest.partition("#")
    rest, qmark, query = rest.partition("?")
    return (scheme + sep + rest + qmark + _mask_values(query)
            + hashmark + _mask_values(fragment))


def redact_text(text: str) -> str:
    """`text` (an exception's message, say) with every URL-like word in it redacted."""
    return _WORD.sub(lambda m: redact(m.group()) if _looks_like_url(m.group()) else m.group(), text)


def _looks_like_url(word: str) -> bool:
    # An "@" too: urllib3 names the request target of `http://u:pa/ss@host/` as "/ss@host/".
    return "://" in word or "?" in word or "#" in word or "@" in word


def _mask_values(items: str) -> str:
    """`a=1&b&c=` -> `a=***&***&c=`: a value is hidden; a lone word may be a token itself."""
    if not items:
        return items
    masked = []
    for item in items.split("&"):
        name, equals, value = item.partition("=")
        if equals:
            masked.append(name + equals + (MASK if value else ""))
        else:
            masked.append(MASK if name else "")
    return "&".join(masked)


def at_in_path(url: str) -> bool:
    """Whether an "@" follows the first "/" (or "\\") after `url`'s scheme, before its query: a
    password typed with a "/" in it (`http://user:pa/ss@host/`), which every parser reads as a host
    `user` and a path `/ss@host/`, sending the rest of the password to a host it was not for."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() == "file":  # a file's path may hold an "@"
        return False
    # urllib3 ends the authority at a "\" too, as browsers do for http and https.
    before_query = re.split(r"[?#]", rest, maxsplit=1)[0]
    _, *path = re.split(r"[/\\]", before_query, maxsplit=1)
    return "@" in "".join(path)
