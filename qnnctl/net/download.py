"""Streaming HTTP downloads that resume, retry, hash as they go, and report progress."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from qnnctl.errors import DiskSpaceError, DownloadError, IntegrityError
from qnnctl.files import require_free_space
from qnnctl.net.body import Pace, blocks
from qnnctl.net.failures import BodyBroke, NoAnswer, NoConnection, RequestError, UnusableBundle
from qnnctl.net.http import CONNECT_TIMEOUT, READ_TIMEOUT, Session
from qnnctl.net.retry import (
    GaveUp,
    Policy,
    answered,
    attempts_made,
    causes,
    describe,
    unknown_host,
    untrusted_certificate,
)
from qnnctl.net.urls import redact
from qnnctl.paths import write_json_atomic
from qnnctl.version import __version__
from qnnctl.words import human_size

log = logging.getLogger("qnnctl.net.download")

CHUNK = 1 << 20
# What a dropped connection can cost: a partial chunk is lost, whole ones are on disk.
NET_CHUNK = 64 << 10
SLOWEST = (64 << 10, 60.0)  # a body that brings fewer bytes in as many seconds is broken off, and resumed
# The retry policy (see `retry_policy`): what is tried again, how often, how long to wait.
MAX_ATTEMPTS = 6  # attempts that make no progress; a resumed download that moves on resets it
MAX_TOTAL_ATTEMPTS = 30  # requests of one download, however far each one got
BACKOFF_BASE = 1.0  # the wait before retry n is BACKOFF_BASE * 2**(n-1) seconds...
BACKOFF_MAX = 60.0  # ...and at most this, a server's Retry-After included
# Timeouts and rate limits, and every 5xx: a mirror's proxy can answer anything while it
# restarts. Everything else (401, 403, 404, 410...) is final, as are a name that does not
# resolve and a certificate that is not trusted (qnnctl.net.retry.worth_retrying).
RETRY_STATUSES = frozenset({408, 425, 429, *range(500, 600)})


def make_session(user_agent_version: str | None = None) -> Session:
    """The one HTTP session every qnnctl request goes through: proxies (HTTP(S)_PROXY, NO_PROXY)
    and the CA bundle (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE) from the environment (qnnctl.net.http)."""
    return Session(f"qnnctl/{user_agent_version or __version__}")


def retry_policy(backoff_base: float = BACKOFF_BASE, sleep: Callable[[float], None] = time.sleep) -> Policy:
    """The retry policy of every download, declared: the session applies it to each request (it
    retries a refused connection, a timeout and the statuses above by itself; the last answer
    comes back when it is spent, to be reported with its status), and the downloader asks it
    again when a body breaks off. Only requests that change nothing are sent again."""
    return Policy(total=MAX_ATTEMPTS - 1, statuses=RETRY_STATUSES, methods=frozenset({"GET", "HEAD"}),
                  backoff_factor=backoff_base, backoff_max=BACKOFF_MAX, sleeper=sleep, shown="")


@dataclass(frozen=True)
class Fetched:
    path: Path
    url: str  # redacted: fit to print and to record in a manifest
    sha256: str
    size: int


class Sink(Protocol):
    """Reads the partial file while it downloads (an archive extracted as it arrives)."""

    def begin(self, part: Path, offset: int, total: int | None) -> None:
        """`part` holds `offset` good bytes and is about to be written from there on; called
        before the file is truncated when the download starts over."""

    def extend(self, size: int) -> None:
        """The first `size` bytes of `part` are written."""


class Progress(Protocol):
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


ProgressFactory = Callable[[str, "int | None", int], Progress]


# Piped, a line at each tenth, but not sooner than this after the last one: a download that
# takes a few seconds says only how it ended, not ten lines of percentages.
PLAIN_INTERVAL = 3.0


def _closing_line(label: str, total: int | None, initial: int, done: int, elapsed: float) -> str:
    """What a download says when its bar or lines end: its size and time, else how far it got."""
    if total is not None and done < total:
        # Interrupted or dropped: say how far it got, not something that reads like success.
        return f"{label}: stopped at {human_size(done)} of {human_size(total)}"
    if initial:
        # The time is this run's, so the size must be too: a resumed download received only the rest.
        return (f"{label}: {human_size(done - initial)} in {elapsed:.1f}s (resumed at {human_size(initial)}; "
                f"{human_size(done)} in all)")
    return f"{label}: {human_size(done)} in {elapsed:.1f}s"


class PlainProgress:
    """A few log lines (at each 10%, or every 256 MiB when the size is unknown, and at most one
    every PLAIN_INTERVAL seconds), no bars; then how it ended."""

    def __init__(self, label: str, total: int | None, initial: int) -> None:
        self.label = label
        self.total = total
        self.initial = initial
        self.done = initial
        self.next_mark = 0
        self.started = time.monotonic()
        self.said = self.started
        self._advance_mark()
        if initial:
            log.info("%s: resuming at %s", label, _of(initial, total))

    def _advance_mark(self) -> None:
        step = max(self.total // 10 if self.total else 256 << 20, 1)
        while self.next_mark <= self.done:
            self.next_mark += step

    def update(self, n: int) -> None:
        self.done += n
        if self.done >= self.next_mark:
            now = time.monotonic()
            if now - self.said >= PLAIN_INTERVAL and (self.total is None or self.done < self.total):
                self.said = now
                if self.total:
                    log.info("%s: %3d%% of %s", self.label, self.done * 100 // self.total, human_size(self.total))
                else:
                    log.info("%s: %s", self.label, human_size(self.done))
            self._advance_mark()

    def close(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        log.info("%s", _closing_line(self.label, self.total, self.initial, self.done, elapsed))


def terminal_progress(label: str, total: int | None, initial: int) -> Progress:
    """A tqdm bar on stderr, for when stderr is a terminal, in the units of the lines (MiB, and
    MiB/s); it says first that it resumes, and when it closes, how it ended, as the lines do."""
    if initial:
        log.info("%s: resuming at %s", label, _of(initial, total))
    started = time.monotonic()
    # Imported here, not at the top: most installs draw no bar (a pipe, a CI log, `-q`), and tqdm
    # is about 15 ms of an install's start from a cold page cache (bench/README.md).
    from tqdm import tqdm

    class Bar(tqdm):  # type: ignore[misc]
        # No monitor thread: the download updates the bar often enough, and that thread
        # outlives the bar, which would keep the extraction from forking (pool.in_processes).
        monitor_interval = 0
        said = False

        def close(self) -> None:
            done = self.n
            super().close()
            if not self.said:  # tqdm closes again when the bar is collected
                self.said = True
                log.info("%s", _closing_line(label, total, initial, done, time.monotonic() - started))

    # "iB" with a divisor of 1024: the rate in KiB/s, MiB/s; the sizes get the unit too (tqdm's
    # own format writes "1.00M/4.00M" beside "7.74MiB/s"). Of an unknown size, tqdm's format is
    # "1.00MiB [00:01, 7.74MiB/s]" already.
    sized = "{l_bar}{bar}| {n_fmt}iB/{total_fmt}iB [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
    bar: Progress = Bar(
        total=total, initial=initial, unit="iB", unit_scale=True, unit_divisor=1024,
        desc=label, file=sys.stderr, leave=False, bar_format=sized if total is not None else None,
    )
    return bar


class Retry(Exception):
    """A failure worth another attempt; `delay` is what the server asked for, if anything.

    For the loop in qnnctl.host.runtime, which streams the LLVM archive; downloads use `retry_policy`.
    """

    def __init__(self, reason: str, delay: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class _NotFound(Exception):
    pass


class _StartOver(Exception):
    """The partial file cannot be resumed (removed): request the whole file, at once."""


def retryable_status(status: int) -> bool:
    """Statuses that a later attempt may not get: timeouts, rate limits, any server error."""
    return status in RETRY_STATUSES


def backoff_delay(attempt: int, base: float = BACKOFF_BASE) -> float:
    return float(min(BACKOFF_MAX, base * (2 ** max(attempt - 1, 0))))


def _is_html(first: bytes) -> bool:
    head = first.lstrip()[:64].lower()
    return head.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml"))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


class Downloader:
    """Fetch one archive into the downloads folder, resuming a partial file left there.

    Every URL it prints, logs or records is redacted (qnnctl.net.urls.redact).
    """

    def __init__(
        self,
        session: Session,
        folder: Path,
        progress: ProgressFactory = PlainProgress,
        sleep: Callable[[float], None] = time.sleep,
        backoff_base: float = BACKOFF_BASE,
        slowest: tuple[int, float] = SLOWEST,
    ) -> None:
        self.session = session
        self.folder = folder
        self.progress = progress
        self.slowest = slowest
        # The session retries each request by the policy; the downloader hands it the budget
        # that is left before each request (see _fetch).
        self.policy = retry_policy(backoff_base, sleep)

    def fetch(self, urls: Sequence[str], name: str, expected_sha256: str | None = None,
              sink: Sink | None = None, limit: tuple[int, str] | None = None) -> Fetched:
        """Download the first of `urls` that exists; the result is complete and hashed.

        `sink` is told about every byte written, as soon as it is in the partial file. A body
        longer than `limit` (the size pinned, who pins it) is stopped there (IntegrityError).
        """
        last_missing = ""
        for url in urls:
            try:
                return self._fetch(url, name, expected_sha256, sink, limit)
            except _NotFound:
                last_missing = redact(url)
                log.info("not found at %s", last_missing)
        raise DownloadError(
            f"the archive was not found (HTTP 404) at {last_missing}",
            hint="check the version (a prefix such as `qnnctl install 2.37` picks the newest known "
            "release), or set QNNCTL_MIRROR to a mirror that holds it",
        )

    # -- one URL -----------------------------------------------------------------------

    def _paths(self, name: str) -> tuple[Path, Path, Path]:
        return self.folder / name, self.folder / f"{name}.part", self.folder / f"{name}.json"

    def _read_meta(self, meta_path: Path) -> dict[str, Any]:
        try:
            data = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_meta(self, meta_path: Path, data: dict[str, Any]) -> None:
        # Private: the record names the URL (redacted, but a URL can hold more than that).
        write_json_atomic(meta_path, data, mode=0o600)

    def _fetch(self, url: str, name: str, expected_sha256: str | None, sink: Sink | None,
               limit: tuple[int, str] | None = None) -> Fetched:
        self.folder.mkdir(parents=True, exist_ok=True)
        final, part, meta_path = self._paths(name)
        shown = redact(url)
        meta = self._read_meta(meta_path)
        # Records are kept redacted; one written before that holds the URL as it was given.
        if meta.get("url") not in (shown, url):
            # Bytes from another source are no base to resume from.
            for stale in (final, part):
                stale.unlink(missing_ok=True)
            meta = {"url": shown}
        elif final.is_file() and meta.get("sha256"):
            # A complete download from an earlier run that stopped before it was installed.
            digest = file_sha256(final)
            if digest == meta["sha256"]:
                log.info("reusing the download finished earlier: %s", final)
                return self._finish(final, shown, digest, expected_sha256, meta_path)
            final.unlink(missing_ok=True)

        policy = self.policy.start(shown)
        requests_made = 0
        # Hand-written because a retry library repeats the request: the whole file again
        # (147 MB for a 98 MB archive dropped half-way; bench/README.md, "resume").
        while True:
            requests_made += 1
            before = part.stat().st_size if part.exists() else 0
            try:
                digest, size = self._attempt(url, shown, part, meta, meta_path, sink, policy, limit)
                break
            except _StartOver:
                if requests_made >= MAX_TOTAL_ATTEMPTS:
                    raise self._gave_up(shown, requests_made, "the server never let the download resume") from None
                continue
            except _Broke as broke:
                after = part.stat().st_size if part.exists() else 0
                if after > before:
                    policy = self.policy.start(shown)  # it moved on: the whole budget again
                else:
                    policy = broke.policy
                if requests_made >= MAX_TOTAL_ATTEMPTS:
                    raise self._gave_up(shown, requests_made, str(broke.error)) from None
                try:
                    policy = policy.increment(error=broke.error)
                except GaveUp as exc:
                    raise self._gave_up(shown, attempts_made(exc), str(broke.error)) from None
                policy.sleep()
        os.replace(part, final)
        meta["sha256"] = digest
        meta["size"] = size
        self._write_meta(meta_path, meta)
        return self._finish(final, shown, digest, expected_sha256, meta_path)

    @staticmethod
    def _gave_up(shown: str, attempts: int, last: str) -> DownloadError:
        return DownloadError(
            f"download of {shown} failed after {attempts} attempts: {last}",
            hint="run the same command again to resume; check the network, "
            "HTTPS_PROXY and REQUESTS_CA_BUNDLE with `qnnctl doctor`",
        )

    def _finish(
        self, final: Path, shown: str, digest: str, expected: str | None, meta_path: Path
    ) -> Fetched:
        if expected is not None and digest != expected.lower():
            final.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
            raise IntegrityError(
                f"sha256 mismatch for {shown}: expected {expected.lower()}, got {digest}",
                hint="the download was removed; check the --sha256 value or the mirror's file",
            )
        return Fetched(final, shown, digest, final.stat().st_size)

    def _attempt(self, url: str, shown: str, part: Path, meta: dict[str, Any], meta_path: Path,
                 sink: Sink | None, policy: Policy, limit: tuple[int, str] | None = None) -> tuple[str, int]:
        """One request, retried by the session until it has an answer; returns (sha256, size) of
        the complete file, or raises _Broke (the body broke off) or _StartOver."""
        offset = part.stat().st_size if part.exists() else 0
        headers = {}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            validator = meta.get("etag") or meta.get("last_modified")
            if validator:
                # The server sends the whole file again (200) if it has changed since.
                headers["If-Range"] = validator
        try:
            response = self.session.get(url, headers, (CONNECT_TIMEOUT, READ_TIMEOUT), policy)
        except RequestError as exc:
            raise request_failed(shown, exc) from None
        with response:
            # What the session spent on this request, for the next one.
            spent: Policy = response.retries or policy
            status = response.status
            answer = answered(status, response.reason)
            if status == 416:
                # Our partial file does not fit the file on the server: start over.
                log.warning("the server refused to resume (HTTP 416); starting over")
                part.unlink(missing_ok=True)
                raise _StartOver
            if status in RETRY_STATUSES:
                # The session retried it for as long as the policy allows.
                raise self._gave_up(shown, spent.attempts, f"the last answer was {answer}")
            if status == 404:
                raise _NotFound(url)
            if status not in (200, 206):
                raise DownloadError(
                    f"{answer} from {shown}",
                    hint="check the URL, the version, or your access to the mirror",
                )
            content_type = response.headers.get("Content-Type", "")
            if "text/html" in content_type.lower():
                raise DownloadError(
                    f"{shown} answered with an HTML page, not an archive "
                    "(a login page, a proxy's error page, or a wrong URL)",
                    hint="open the URL in a browser, or download the archive by hand and run "
                    "`qnnctl install --file ARCHIVE`",
                )
            length = response.headers.get("Content-Length")
            body_length = int(length) if length and length.isdigit() else None
            if status == 206 and offset and _range_start(response.headers.get("Content-Range")) == offset:
                mode = "ab"
            else:
                if status == 206:
                    log.warning("the server resumed at the wrong offset; starting over")
                    part.unlink(missing_ok=True)
                    raise _StartOver
                offset = 0
                mode = "wb"
                if part.exists():
                    log.info("the server sent the whole file; starting over")
            meta.update(
                url=shown,
                etag=response.headers.get("ETag") if strong_etag(response.headers.get("ETag")) else None,
                last_modified=response.headers.get("Last-Modified"),
                total=offset + body_length if body_length is not None else None,
            )
            meta.pop("sha256", None)
            if limit is not None and (meta["total"] or 0) > limit[0]:  # said before a byte is written
                raise too_long(shown, limit, f"it says the file is {meta['total']} bytes")
            if body_length is not None:
                require_free_space(part.parent, body_length, "download the archive")
            self._write_meta(meta_path, meta)
            digest = hashlib.sha256()
            if mode == "ab":
                with open(part, "rb") as existing:
                    while block := existing.read(CHUNK):
                        digest.update(block)
            total = meta["total"]
            if sink is not None:
                sink.begin(part, offset, total)
            bar = self.progress(part.name.removesuffix(".part"), total, offset)
            received = 0
            announced = 0
            try:
                # Readable and writable by its owner alone, whatever the umask: what is hashed
                # here is read again from this file.
                flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if mode == "ab" else os.O_TRUNC)
                fd = os.open(part, flags, 0o600)
                os.fchmod(fd, 0o600)
                with os.fdopen(fd, mode, buffering=CHUNK) as out:
                    for block in blocks(response, NET_CHUNK, Pace(*self.slowest)):
                        if received == 0 and offset == 0 and _is_html(block):
                            raise DownloadError(
                                f"{shown} answered with an HTML page, not an archive",
                                hint="check the URL or mirror; download the archive by hand and "
                                "run `qnnctl install --file ARCHIVE`",
                            )
                        out.write(block)
                        digest.update(block)
                        received += len(block)
                        if limit is not None and offset + received > limit[0]:
                            raise too_long(shown, limit, "the body went on past them")
                        bar.update(len(block))
                        if sink is not None and received - announced >= CHUNK:
                            out.flush()
                            announced = received
                            sink.extend(offset + received)
            except RequestError as exc:
                raise _Broke(spent, BodyBroke(
                    f"the download stopped at {_of(offset + received, total)}: {describe(exc)}")) from None
            except (DownloadError, IntegrityError):
                # Nothing of a page, or of a body longer than the file, is worth resuming, nor its record.
                part.unlink(missing_ok=True)
                meta_path.unlink(missing_ok=True)
                raise
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    # The partial file stays: after space is freed the next run resumes it.
                    raise DiskSpaceError(str(part.parent), None,
                                         shutil.disk_usage(part.parent).free,
                                         "download the archive") from None
                raise
            finally:
                bar.close()
            size = offset + received
            if sink is not None:
                sink.extend(size)
            if total is not None and size != total:
                raise _Broke(spent, BodyBroke(f"the body ended early, at {_of(size, total)}"))
            return digest.hexdigest(), size


def too_long(shown: str, limit: tuple[int, str], how: str) -> IntegrityError:
    size, who = limit
    return IntegrityError(
        f"{shown} is longer than {size} bytes, the size {who} ({how}): it is not that archive; the download "
        "was stopped and removed, and nothing was installed",
        hint="check the server or proxy that answers for that URL; run the same command again once it serves "
        "the archive",
    )


class _Broke(Exception):
    """The body of an answer broke off; `policy` is what was left of the budget."""

    def __init__(self, policy: Policy, error: BodyBroke) -> None:
        super().__init__(str(error))
        self.policy = policy
        self.error = error


def request_failed(shown: str, exc: BaseException) -> DownloadError:
    """A request that got no answer: retried as long as the policy allows, or not at all
    when retrying cannot help."""
    cause = describe(exc)
    attempts = attempts_made(exc)
    if untrusted_certificate(exc):
        return DownloadError(
            f"cannot download {shown}: {cause}",
            hint="if your network inspects TLS, set REQUESTS_CA_BUNDLE to your organisation's CA "
            "bundle; `qnnctl doctor` shows the bundle in use",
        )
    if isinstance(exc, UnusableBundle):
        return DownloadError(
            f"cannot download {shown}: {cause}",
            hint="set REQUESTS_CA_BUNDLE to a file of PEM certificates (or a folder of them), or unset it and "
            "CURL_CA_BUNDLE to use certifi's bundle; `qnnctl doctor` shows the bundle in use",
        )
    if unknown_host(exc):
        return DownloadError(
            f"cannot download {shown}: {cause}",
            hint="check the host name in the URL (or QNNCTL_MIRROR); behind a proxy, set HTTPS_PROXY",
        )
    if not any(isinstance(link, (NoConnection, NoAnswer)) for link in causes(exc)):
        return DownloadError(
            f"request to {shown} failed: {cause}",
            hint="check the URL (or QNNCTL_MIRROR) and proxy settings",
        )
    if attempts > 1:
        return Downloader._gave_up(shown, attempts, f"cannot reach the server: {cause}")
    return DownloadError(
        f"cannot reach {shown}: {cause}",
        hint="run the same command again to resume; check the network, "
        "HTTPS_PROXY and REQUESTS_CA_BUNDLE with `qnnctl doctor`",
    )


def _of(done: int, total: int | None) -> str:
    return human_size(done) if total is None else f"{human_size(done)} of {human_size(total)}"


def strong_etag(etag: str | None) -> bool:
    return bool(etag) and not str(etag).startswith("W/")


def _range_start(content_range: str | None) -> int | None:
    # "bytes 100-199/200"
    if not content_range or not content_range.startswith("bytes "):
        return None
    try:
        return int(content_range[6:].split("-", 1)[0])
    except ValueError:
        return None
