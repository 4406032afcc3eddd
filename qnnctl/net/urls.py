"""URLs as qnnctl shows and keeps them (without the secrets they may carry), and as it takes them.

A mirror's URL can hold a password (`https://user:pw@host/...`) and a signed URL a token
(`...?X-Amz-Signature=...`). Everything qnnctl prints, logs or stores goes through `redact`,
so that neither ends up in a terminal, a CI log, a bug report or a file in the cache.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from qnnctl.errors import UsageError

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


def check_url(url: str, what: str, allow_file: bool = True) -> Path | None:
    """Refuse (exit 2) a URL that no download can start from; for a file: URL, its path.

    urllib parses `http://[::1/x` only to raise ValueError, and requests turns a missing host
    or an unknown scheme into a failed download (exit 3) after the lock and the cache: both
    are mistakes in what was typed, told before anything starts.
    """
    shown = redact(url)
    schemes = "https or http" + (" (or a file: URL)" if allow_file else "")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        # urlparse drops a newline or tab silently; the URL shown or logged would then break lines.
        raise UsageError(f"{what} {shown!r} holds a control character (a newline or tab)",
                         hint="remove it: a URL is one line of printable text")
    if at_in_path(url):
        raise UsageError(f"{what} {shown} holds an \"@\" after a \"/\" or \"\\\": a password with either in it is read "
                         "as a host and a path, and would be sent to that host",
                         hint="write a \"/\" in a password as %2F, a \"\\\" as %5C, and an \"@\" in a path as %40")
    try:
        parts = urlparse(url)
        parts.port  # noqa: B018 - a port that is no number raises here, not in the download
    except ValueError:
        # The parser's words would quote the bad part, which may be a misplaced password.
        raise UsageError(f"{what} {shown} is not a valid URL: its host or port cannot be read",
                         hint="check the brackets around an IPv6 address and the port number") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http", *(("file",) if allow_file else ())):
        named = f"{scheme}:" if scheme else "a URL without a scheme"
        raise UsageError(f"{what} {shown}: qnnctl downloads over {schemes}, not {named}",
                         hint="an archive on disk is installed with `qnnctl install --file ARCHIVE`")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"{what} {shown} names a file on another host ({parts.netloc})",
                             hint="a file: URL names a file on this machine: file:///path/to/v2.37.0.250724.zip")
        return Path(unquote(parts.path))
    if not parts.hostname:
        raise UsageError(f"{what} {shown} names no host", hint="URLs look like https://host/path/v2.37.0.250724.zip")
    return None


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
