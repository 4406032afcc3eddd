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
    if sep:
        # The authority runs to the first "/" here, not to "?" or "#" as RFC 3986 has it:
        # a password with an unescaped "#" or "?" must not leak as the "host".
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            authority = MASK + "@" + authority.rpartition("@")[2]
        rest = authority + slash + path
    else:
        scheme, rest = "", url
    rest, hashmark, fragment = rest.partition("#")
    rest, qmark, query = rest.partition("?")
    return (scheme + sep + rest + qmark + _mask_values(query)
            + hashmark + _mask_values(fragment))


def redact_text(text: str) -> str:
    """`text` (an exception's message, say) with every URL-like word in it redacted."""
    return _WORD.sub(lambda m: redact(m.group()) if _looks_like_url(m.group()) else m.group(), text)


def _looks_like_url(word: str) -> bool:
    return "://" in word or "?" in word or "#" in word


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
