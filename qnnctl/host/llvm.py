"""LLVM's release archive, where the libc++ trio comes from when `apt-get download` cannot fetch
it: streamed once, hashed on the way through, and held to a sha256 known before the first byte.

Only the three libraries ever reach the disk (a megabyte out of 575), in a work folder; the
caller commits nothing from it unless `stream_llvm` returned, which it does only once the whole
archive's digest has been compared. The digest comes from the table below for LLVM's own
archive (under its own name, wherever it is served from, so a mirror of it is checked too), or
from QNNCTL_LLVM_SHA256 for another archive named by QNNCTL_LLVM_URL; an archive neither
vouches for is refused (exit 4) before anything is fetched.
"""

from __future__ import annotations

import io
import logging
import posixpath
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from qnnctl.errors import DownloadError, IntegrityError, UsageError
from qnnctl.files import remove_tree
from qnnctl.host.packages import Limits, collect, tar_members
from qnnctl.host.sources import APT_PACKAGES, Scan, llvm_version, trio_only
from qnnctl.host.streams import COPY_BUFFER, HashingReader, Late, Overrun
from qnnctl.net.download import (
    BACKOFF_MAX,
    Retry,
    backoff_delay,
    make_session,
    retryable_status,
)
from qnnctl.net.failures import BadRequest, RequestError
from qnnctl.net.http import CONNECT_TIMEOUT, READ_TIMEOUT, Session
from qnnctl.net.retry import describe, retry_after
from qnnctl.net.urls import redact
from qnnctl.records import Record

log = logging.getLogger("qnnctl.host.runtime")

LLVM_VERSION = "14.0.0"
LLVM_ARCHIVE = f"clang+llvm-{LLVM_VERSION}-x86_64-linux-gnu-ubuntu-18.04.tar.xz"
LLVM_URL = f"https://github.com/llvm/llvm-project/releases/download/llvmorg-{LLVM_VERSION}/{LLVM_ARCHIVE}"
LLVM_URL_ENV = "QNNCTL_LLVM_URL"  # another copy of the release archive (a mirror), or another archive
LLVM_SHA256_ENV = "QNNCTL_LLVM_SHA256"  # the sha256 of the archive QNNCTL_LLVM_URL names
LLVM_ATTEMPTS = 3
# The most qnnctl reads of an LLVM archive, whoever serves it, each several times what a release
# holds (LLVM 14's archive is about 575 MB, its trio a few MB): a server that goes past them is
# refused before it fills the disk or the memory, or is read for ever, whatever digest it would have.
LLVM_MOST = 4 << 30  # bytes of the archive
LLVM_LIMITS = Limits(members=200_000, unpacked=32 << 30, kept=256 << 20, names=16 << 20)
# The longest one attempt takes, whatever a server sends and however slowly (a byte a minute keeps
# every read within its timeout): LLVM 14's archive at 80 kB/s. A slower link takes the archive
# from a copy: `install --runtime --runtime-from` the file.
LLVM_DEADLINE = 2 * 3600.0


class Published(Record):
    """One release archive and the sha256 published for it: where it was read, and when."""

    archive: str
    sha256: str
    source: str
    checked: str


PUBLISHED = (
    Published(
        "clang+llvm-14.0.0-x86_64-linux-gnu-ubuntu-18.04.tar.xz",
        "61582215dafafb7b576ea30cc136be92c877ba1f1c31ddbbd372d6d65622fef5",
        "LLVM's release https://github.com/llvm/llvm-project/releases/tag/llvmorg-14.0.0, as the public "
        "toolchain tables list it (toolchains_llvm's toolchain/internal/llvm_distributions.bzl)",
        "2026-12-05",
    ),
)


class Expected(Record):
    """The sha256 an archive must have, and who says so (for the messages and the manifest)."""

    sha256: str
    said_by: str


def expected_sha256(url: str, given: str | None) -> Expected:
    """What the archive at `url` is held to: `given` (QNNCTL_LLVM_SHA256), else the published
    digest of the release archive its file name names; IntegrityError (exit 4) when neither
    vouches for it, and UsageError for a `given` that is no sha256."""
    if given is not None and given.strip():
        digest = given.strip().lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise UsageError(f"{LLVM_SHA256_ENV}={given!r} is not a sha256 digest (64 hex digits)",
                             hint=f"set it to the archive's sha256, as `sha256sum {LLVM_ARCHIVE}` prints it")
        return Expected(digest, LLVM_SHA256_ENV)
    name = posixpath.basename(urlsplit(url).path)
    for row in PUBLISHED:
        if row.archive == name:
            return Expected(row.sha256, f"the sha256 LLVM publishes for {row.archive}")
    raise IntegrityError(
        f"{redact(url)} is not LLVM's release archive {LLVM_ARCHIVE}, and no sha256 was given for it: "
        "qnnctl cannot check the libraries it would stage from it",
        hint=f"set {LLVM_SHA256_ENV} to the archive's sha256 (from a copy you trust), or point {LLVM_URL_ENV} at a "
        f"copy of {LLVM_ARCHIVE} under that name, or give the libraries with --runtime-from; nothing was fetched",
    )


def llvm_source(environ: Mapping[str, str], url: str | None, sha256: str | None) -> tuple[str, Expected]:
    """The archive to stream (an argument, else $QNNCTL_LLVM_URL, else LLVM's release) and what it must match."""
    chosen = url or environ.get(LLVM_URL_ENV) or LLVM_URL
    return chosen, expected_sha256(chosen, sha256 if sha256 is not None else environ.get(LLVM_SHA256_ENV))


def stream_llvm(url: str, expected: Expected, dest: Path, backoff_base: float) -> Scan:
    """Stream the archive once, keeping only the trio under `dest`; retry from the start.

    Returns only when the whole archive's sha256 is `expected`: IntegrityError otherwise, and
    what was written under `dest` is the caller's work folder's to remove.
    """
    session = make_session()
    attempt = 0
    while True:
        attempt += 1
        target = dest / f"attempt{attempt}"
        try:
            return _stream_once(session, url, expected, target)
        except Retry as retry:
            remove_tree(target)
            if attempt >= LLVM_ATTEMPTS:
                raise DownloadError(
                    f"streaming {redact(url)} failed after {attempt} attempts: {retry.reason}",
                    hint="check the network and proxy settings, set QNNCTL_LLVM_URL to a mirror, "
                    "or give the libraries with --runtime-from",
                ) from None
            delay = retry.delay if retry.delay is not None else backoff_delay(attempt, backoff_base)
            delay = min(delay, BACKOFF_MAX)  # a server's Retry-After is a request, not an order
            log.warning("%s; retrying in %.1fs", retry.reason, delay)
            time.sleep(delay)


def _stream_once(session: Session, url: str, expected: Expected, dest: Path) -> Scan:
    shown = redact(url)  # QNNCTL_LLVM_URL may name a mirror with a password or a token
    log.info("streaming %s (only the three libraries are kept)", shown)
    try:
        response = session.get(url, None, (CONNECT_TIMEOUT, READ_TIMEOUT))
    except BadRequest as exc:
        raise DownloadError(f"request to {shown} failed: {describe(exc)}") from None
    except RequestError as exc:
        raise Retry(f"cannot reach {shown}: {describe(exc)}") from None
    with response:
        status = response.status
        if retryable_status(status):
            raise Retry(f"HTTP {status} from {shown}", retry_after(response.headers.get("Retry-After")))
        if status != 200:
            raise DownloadError(
                f"HTTP {status} from {shown}",
                hint="check QNNCTL_LLVM_URL, or give the libraries with --runtime-from",
            )
        if "text/html" in response.headers.get("Content-Type", "").lower():
            raise DownloadError(f"{shown} answered with an HTML page, not the LLVM archive",
                                hint="check QNNCTL_LLVM_URL and proxy settings")
        # Every byte the reader sees passes through the hash, and the rest is read to the end.
        hashing = HashingReader(response, LLVM_MOST, time.monotonic() + LLVM_DEADLINE)
        try:
            collected = collect(tar_members(io.BufferedReader(hashing, COPY_BUFFER), shown), trio_only, dest,
                                shown, LLVM_LIMITS)
            hashing.drain()
        except (RequestError, ConnectionError) as exc:
            raise Retry(f"the connection to {shown} broke: {describe(exc)}") from None
        except Overrun as exc:
            raise IntegrityError(
                f"{shown} sent {exc}, more than any LLVM archive qnnctl reads: it was stopped there",
                hint="this is not the archive that was vouched for; check QNNCTL_LLVM_URL, or give the libraries "
                "with --runtime-from; nothing was staged",
            ) from None
        except Late as exc:
            raise DownloadError(
                f"streaming {shown} took more than {LLVM_DEADLINE:g} s ({exc} read): it was stopped there",
                hint=f"download {LLVM_ARCHIVE} (or the {' '.join(APT_PACKAGES)} packages) by other means and give "
                "the file with --runtime-from, or set QNNCTL_LLVM_URL to a faster mirror; nothing was staged",
            ) from None
    digest = hashing.sha256.hexdigest()
    if digest != expected.sha256:
        raise IntegrityError(
            f"sha256 mismatch for {shown}: {expected.said_by} is {expected.sha256}, the archive served is {digest} "
            f"({hashing.size} bytes)",
            hint="this is not the archive that was vouched for; check QNNCTL_LLVM_URL and QNNCTL_LLVM_SHA256, or "
            "give the libraries with --runtime-from; nothing was staged",
        )
    record = {"source": shown, "sha256": digest, "size": hashing.size, "checked_against": expected.said_by}
    return Scan(shown, [record], collected, version=llvm_version(collected))
