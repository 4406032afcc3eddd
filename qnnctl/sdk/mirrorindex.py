"""A mirror's index.json: what it says of each version, read from the mirror's URL.

Below the install pipeline and the SDK model, which ask it what a mirror holds (a version's
sha256, size, build id and component digests; the versions it lists): the pipeline through a
`MirrorIndex` its caller hands down. qnnctl.fleet.mirror, above them, writes it.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import zlib
from typing import Any

from qnnctl.errors import DownloadError, IntegrityError
from qnnctl.net.download import make_session, retry_policy
from qnnctl.net.failures import RequestError
from qnnctl.net.http import Response
from qnnctl.net.retry import describe, refused
from qnnctl.net.urls import check_url, redact
from qnnctl.records import Record
from qnnctl.sdk.gate import Expected, is_sha256
from qnnctl.sdk.limits import nesting_depth
from qnnctl.sdk.versions import is_full_version, parse_version

log = logging.getLogger("qnnctl.fleet.mirror")

INDEX_NAME = "index.json"
INDEX_SCHEMA = 1
INDEX_TIMEOUT = (10.0, 30.0)  # connect, read: a small file
# What an index may be: `qnnctl mirror` writes about a kilobyte a version, four levels deep. It
# comes from a server, which may never stop sending or nest without end: a bigger, deeper or
# slower one is refused (as a lock is) before it is parsed.
INDEX_MAX_BYTES = 8 << 20
INDEX_MAX_DEPTH = 16
INDEX_DEADLINE = 60.0  # seconds for the whole body


class IndexEntry(Record):
    """What a mirror's index.json says of one version."""

    url: str  # of the index, redacted
    sha256: str
    size: int | None
    build_id: str | None
    components: dict[str, str] | None = None  # component -> digest (qnnctl.sdk.components)

    def expected(self) -> Expected:
        """What the gate (qnnctl.sdk.gate) holds the mirror's archive of this version to."""
        return Expected(f"the mirror's {self.url}", "the index", "says",
                        "the mirror's file changed after it was indexed; put the right archive back, or index it "
                        "again with `qnnctl mirror DIR VERSION` where the mirror is kept",
                        sha256=self.sha256, size=self.size, components=self.components)


def index_url(base: str) -> str:
    return f"{base.rstrip('/')}/{INDEX_NAME}"


def parse_index(data: object, where: str) -> dict[str, dict[str, Any]]:
    """The `versions` table of an index; ValueError when `data` is no mirror index."""
    if not isinstance(data, dict) or data.get("schema") != INDEX_SCHEMA or not isinstance(data.get("versions"), dict):
        raise ValueError(f"{where} is not a qnnctl mirror index (schema {INDEX_SCHEMA} with a `versions` table)")
    # Each version as it parses: a key is the server's text, and whitespace or control characters
    # around it would reach messages, URLs and folder names. Other keys name no version anyone asks for.
    return {str(parse_version(k)) if is_full_version(str(k)) else str(k): v
            for k, v in data["versions"].items() if isinstance(v, dict)}


def read_index(base: str) -> dict[str, dict[str, Any]] | None:
    """The `versions` table of the index.json of the mirror at `base`; None when it has none
    (404) or it cannot be read (a warning says so). A refused connection is DownloadError at
    once: the mirror the user named is not there (a mistyped port, most often), and the
    archive's own download would only meet the same refusal, retried for half a minute."""
    url = index_url(base)
    shown = redact(url)
    # Retried as downloads are, but briefly: the archive's own download follows. A refused
    # connection is tried once more only (a mirror restarting), after a second.
    policy = retry_policy().new(total=2, connect=1).start(shown)  # retries name the URL
    try:
        # Asked unencoded, and read as it comes off the wire: a body that decodes to gigabytes is
        # refused by its decoded size, decoded here in bounded steps.
        with make_session() as session, session.get(url, None, INDEX_TIMEOUT, policy) as response:
            if response.status in (404, 410):
                log.debug("the mirror has no %s", shown)
                return None
            if response.status != 200:
                log.warning("the mirror answered HTTP %d for %s; the archive is not checked against it",
                            response.status, shown)
                return None
            body = _bounded_body(response, shown)
    except RequestError as exc:
        if refused(exc):
            raise DownloadError(f"cannot reach the mirror: {shown}: {describe(exc)}",
                                hint="check the host and port of QNNCTL_MIRROR; nothing was fetched") from None
        log.warning("cannot read the mirror's %s (%s); the archive is not checked against it", shown, describe(exc))
        return None
    try:
        text = body.decode("utf-8")
        if nesting_depth(text) > INDEX_MAX_DEPTH:
            raise IntegrityError(f"the mirror's {shown} nests deeper than {INDEX_MAX_DEPTH} levels, which no "
                                 "index qnnctl writes does; nothing was fetched",
                                 hint="write the index again with `qnnctl mirror DIR VERSION`, or check QNNCTL_MIRROR")
        return parse_index(json.loads(text), shown)
    except ValueError as exc:
        log.warning("%s; the archive is not checked against it", exc)
        return None


def _bounded_body(response: Response, shown: str) -> bytes:
    """The body of the index's answer, decoded, read with a size cap and a deadline."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip", "deflate", "x-gzip"):
        raise IntegrityError(f"the mirror's {shown} came encoded as {encoding!r}, which qnnctl did not ask for; "
                             "nothing was fetched", hint="serve index.json unencoded, or check QNNCTL_MIRROR")
    # wbits 47: a zlib or gzip header, whichever the server sent ("deflate" is zlib's).
    inflate = zlib.decompressobj(47) if encoding not in ("identity", "") else None
    deadline = time.monotonic() + INDEX_DEADLINE
    body = bytearray()
    while block := response.read1(64 << 10):
        if inflate is not None:
            block = inflate.decompress(block, INDEX_MAX_BYTES + 1 - len(body))
        body += block
        if len(body) > INDEX_MAX_BYTES:
            raise IntegrityError(f"the mirror's {shown} is larger than {INDEX_MAX_BYTES >> 20} MiB, which no index "
                                 "qnnctl writes is; nothing was fetched",
                                 hint="write the index again with `qnnctl mirror DIR VERSION`, or check QNNCTL_MIRROR")
        if time.monotonic() > deadline:
            raise DownloadError(f"the mirror's {shown} did not arrive whole within {INDEX_DEADLINE:.0f} s; "
                                "nothing was fetched", hint="check the mirror's server, or QNNCTL_MIRROR")
    return bytes(body)


def mirror_entry(base: str, version: str, versions: dict[str, dict[str, Any]] | None = None) -> IndexEntry | None:
    """What the mirror at `base` says of `version` in its index.json (`versions`, when read
    already); None when it has no index (404), the index names no such version, or it cannot
    be read (a warning says so)."""

    shown = redact(index_url(base))
    versions = read_index(base) if versions is None else versions
    if versions is None:
        return None
    entry = versions.get(version)
    if entry is None:
        log.warning("the mirror's %s has no entry for SDK %s; the archive is not checked against it", shown, version)
        return None
    sha256 = entry.get("sha256")
    if not is_sha256(sha256):
        raise IntegrityError(f"the mirror's {shown} gives SDK {version} the sha256 {sha256!r}, which is no digest",
                             hint="write the index again with `qnnctl mirror DIR VERSION`")
    size, build, digests = entry.get("size"), entry.get("build_id"), entry.get("components")
    if digests is not None and (not isinstance(digests, dict) or not all(map(is_sha256, digests.values()))):
        raise IntegrityError(f"the mirror's {shown} gives SDK {version} components that are no digests",
                             hint="write the index again with `qnnctl mirror DIR VERSION`")
    return IndexEntry(shown, str(sha256), size if isinstance(size, int) else None,
                      build if isinstance(build, str) else None,
                      {str(k): str(v) for k, v in digests.items()} if digests else None)


def indexed_versions(base: str) -> list[str] | None:
    """The versions the index.json of the mirror at `base` lists, oldest first; None when it
    has no index, or it cannot be read."""
    versions = read_index(base)
    if versions is None:
        return None
    return sorted((v for v in versions if is_full_version(v)), key=parse_version)


class MirrorIndex:
    """The index.json of the mirror at `base`, as the install pipeline asks it (qnnctl.sdk.gate.Index):
    read at most once, when first asked (QNNCTL_MIRROR is checked then, not before)."""

    def __init__(self, base: str) -> None:
        self.base = base

    @property
    def where(self) -> str:
        return redact(index_url(self.base))

    @functools.cached_property
    def _versions(self) -> dict[str, dict[str, Any]] | None:
        check_url(self.base, "QNNCTL_MIRROR", allow_file=False)
        return read_index(self.base)

    def versions(self) -> dict[str, dict[str, Any]] | None:
        return self._versions

    def expected(self, version: str) -> Expected | None:
        versions = self.versions()
        entry = mirror_entry(self.base, version, versions) if versions is not None else None
        return entry.expected() if entry is not None else None
