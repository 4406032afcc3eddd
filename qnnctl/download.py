"""Streaming HTTP downloads that resume, retry, hash as they go, and report progress."""

from __future__ import annotations

import email.utils
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
from typing import TYPE_CHECKING, Any, Protocol

from qnnctl.cache import require_free_space
from qnnctl.errors import DiskSpaceError, DownloadError, IntegrityError

if TYPE_CHECKING:
    import requests

log = logging.getLogger("qnnctl.download")

CHUNK = 1 << 20
# What a dropped connection can cost: a partial chunk is lost, whole ones are on disk.
NET_CHUNK = 64 << 10
CONNECT_TIMEOUT = 15.0
READ_TIMEOUT = 60.0
MAX_ATTEMPTS = 6  # attempts that make no progress; a resumed download that moves on resets it
MAX_TOTAL_ATTEMPTS = 30
BACKOFF_BASE = 1.0
BACKOFF_MAX = 60.0
# Besides these, every 5xx is retried: a mirror's proxy can answer anything while it restarts.
RETRY_STATUSES = frozenset({408, 425, 429})


def make_session(user_agent_version: str | None = None) -> requests.Session:
    """The one HTTP session every qnnctl request goes through.

    requests takes proxies (HTTP(S)_PROXY, NO_PROXY) and the CA bundle
    (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE) from the environment because trust_env is on.
    """
    import requests

    from qnnctl import __version__

    session = requests.Session()
    session.trust_env = True
    session.headers["User-Agent"] = f"qnnctl/{user_agent_version or __version__}"
    # Ask for the bytes as stored: a transparently gzipped body would break Range offsets.
    session.headers["Accept-Encoding"] = "identity"
    return session


@dataclass(frozen=True)
class Fetched:
    path: Path
    url: str
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


class PlainProgress:
    """A few log lines (every 10%, or every 256 MiB when the size is unknown), no bars."""

    def __init__(self, label: str, total: int | None, initial: int) -> None:
        self.label = label
        self.total = total
        self.done = initial
        self.next_mark = 0
        self.started = time.monotonic()
        self._advance_mark()
        if initial:
            log.info("%s: resuming at %s", label, _human(initial))

    def _advance_mark(self) -> None:
        step = self.total // 10 if self.total else 256 << 20
        step = max(step, 1)
        while self.next_mark <= self.done:
            self.next_mark += step

    def update(self, n: int) -> None:
        self.done += n
        if self.done >= self.next_mark:
            if self.total:
                log.info("%s: %3d%% of %s", self.label, self.done * 100 // self.total, _human(self.total))
            else:
                log.info("%s: %s", self.label, _human(self.done))
            self._advance_mark()

    def close(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        if self.total is not None and self.done < self.total:
            # Interrupted or dropped: say how far it got, not something that reads like success.
            log.info("%s: stopped at %s of %s", self.label, _human(self.done), _human(self.total))
        else:
            log.info("%s: %s in %.1fs", self.label, _human(self.done), elapsed)


def terminal_progress(label: str, total: int | None, initial: int) -> Progress:
    """A tqdm bar on stderr, for when stderr is a terminal."""
    from tqdm import tqdm

    class Bar(tqdm):  # type: ignore[misc]
        # No monitor thread: the download updates the bar often enough, and that thread
        # outlives the bar, which would keep the extraction from forking (archive.in_processes).
        monitor_interval = 0

    bar: Progress = Bar(
        total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024,
        desc=label, file=sys.stderr, leave=False,
    )
    return bar


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{n} B"


class Retry(Exception):
    """A failure worth another attempt; `delay` is what the server asked for, if anything."""

    def __init__(self, reason: str, delay: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class _NotFound(Exception):
    pass


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def retryable_status(status: int) -> bool:
    """Statuses that a later attempt may not get: timeouts, rate limits, any server error."""
    return status in RETRY_STATUSES or 500 <= status <= 599


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
    """Fetch one archive into the downloads folder, resuming a partial file left there."""

    def __init__(
        self,
        session: requests.Session,
        folder: Path,
        progress: ProgressFactory = PlainProgress,
        sleep: Callable[[float], None] = time.sleep,
        backoff_base: float = BACKOFF_BASE,
    ) -> None:
        self.session = session
        self.folder = folder
        self.progress = progress
        self.sleep = sleep
        self.backoff_base = backoff_base

    def fetch(self, urls: Sequence[str], name: str, expected_sha256: str | None = None,
              sink: Sink | None = None) -> Fetched:
        """Download the first of `urls` that exists; the result is complete and hashed.

        `sink` is told about every byte written, as soon as it is in the partial file.
        """
        last_missing = ""
        for url in urls:
            try:
                return self._fetch(url, name, expected_sha256, sink)
            except _NotFound:
                last_missing = url
                log.info("not found at %s", url)
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
        from qnnctl.cache import write_json_atomic

        write_json_atomic(meta_path, data)

    def _fetch(self, url: str, name: str, expected_sha256: str | None, sink: Sink | None) -> Fetched:
        self.folder.mkdir(parents=True, exist_ok=True)
        final, part, meta_path = self._paths(name)
        meta = self._read_meta(meta_path)
        if meta.get("url") != url:
            # Bytes from another source are no base to resume from.
            for stale in (final, part):
                stale.unlink(missing_ok=True)
            meta = {"url": url}
        elif final.is_file() and meta.get("sha256"):
            # A complete download from an earlier run that stopped before it was installed.
            digest = file_sha256(final)
            if digest == meta["sha256"]:
                log.info("reusing the download finished earlier: %s", final)
                return self._finish(final, url, digest, expected_sha256, meta_path)
            final.unlink(missing_ok=True)

        no_progress = 0
        total_attempts = 0
        while True:
            total_attempts += 1
            before = part.stat().st_size if part.exists() else 0
            try:
                digest, size = self._attempt(url, part, meta, meta_path, sink)
            except Retry as retry:
                after = part.stat().st_size if part.exists() else 0
                no_progress = 0 if after > before else no_progress + 1
                if no_progress >= MAX_ATTEMPTS or total_attempts >= MAX_TOTAL_ATTEMPTS:
                    raise DownloadError(
                        f"download of {url} failed after {total_attempts} attempts: {retry.reason}",
                        hint="run the same command again to resume; check the network, "
                        "HTTPS_PROXY and REQUESTS_CA_BUNDLE with `qnnctl doctor`",
                    ) from None
                delay = retry.delay if retry.delay is not None else backoff_delay(
                    no_progress or 1, self.backoff_base
                )
                delay = min(delay, BACKOFF_MAX)
                log.warning("%s; retrying in %.1fs", retry.reason, delay)
                self.sleep(delay)
                continue
            break
        os.replace(part, final)
        meta["sha256"] = digest
        meta["size"] = size
        self._write_meta(meta_path, meta)
        return self._finish(final, url, digest, expected_sha256, meta_path)

    def _finish(
        self, final: Path, url: str, digest: str, expected: str | None, meta_path: Path
    ) -> Fetched:
        if expected is not None and digest != expected.lower():
            final.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
            raise IntegrityError(
                f"sha256 mismatch for {url}: expected {expected.lower()}, got {digest}",
                hint="the download was removed; check the --sha256 value or the mirror's file",
            )
        return Fetched(final, url, digest, final.stat().st_size)

    def _attempt(self, url: str, part: Path, meta: dict[str, Any], meta_path: Path,
                 sink: Sink | None) -> tuple[str, int]:
        """One request; returns (sha256, size) of the complete file or raises Retry."""
        import requests

        offset = part.stat().st_size if part.exists() else 0
        headers = {}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            validator = meta.get("etag") or meta.get("last_modified")
            if validator:
                # The server sends the whole file again (200) if it has changed since.
                headers["If-Range"] = validator
        try:
            response = self.session.get(
                url, headers=headers, stream=True, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT)
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise Retry(f"cannot reach {url}: {_short(exc)}") from None
        except requests.RequestException as exc:
            raise DownloadError(
                f"request to {url} failed: {_short(exc)}",
                hint="check the URL (or QNNCTL_MIRROR) and proxy settings",
            ) from None
        with response:
            status = response.status_code
            if status == 416:
                # Our partial file does not fit the file on the server: start over.
                log.warning("the server refused to resume (HTTP 416); starting over")
                part.unlink(missing_ok=True)
                raise Retry("range not satisfiable", delay=0.0)
            if retryable_status(status):
                raise Retry(f"HTTP {status} from {url}", retry_after(response.headers.get("Retry-After")))
            if status == 404:
                raise _NotFound(url)
            if status not in (200, 206):
                raise DownloadError(
                    f"HTTP {status} {response.reason or ''} from {url}".rstrip(),
                    hint="check the URL, the version, or your access to the mirror",
                )
            content_type = response.headers.get("Content-Type", "")
            if "text/html" in content_type.lower():
                raise DownloadError(
                    f"{url} answered with an HTML page, not an archive "
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
                    part.unlink(missing_ok=True)
                    raise Retry("the server resumed at the wrong offset", delay=0.0)
                offset = 0
                mode = "wb"
                if part.exists():
                    log.info("the server sent the whole file; starting over")
            meta.update(
                url=url,
                etag=response.headers.get("ETag") if _strong(response.headers.get("ETag")) else None,
                last_modified=response.headers.get("Last-Modified"),
                total=offset + body_length if body_length is not None else None,
            )
            meta.pop("sha256", None)
            self._write_meta(meta_path, meta)
            if body_length is not None:
                require_free_space(part.parent, body_length, "download the archive")
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
                with open(part, mode, buffering=CHUNK) as out:
                    first = True
                    for block in response.iter_content(NET_CHUNK):
                        if first and offset == 0 and _is_html(block):
                            raise DownloadError(
                                f"{url} answered with an HTML page, not an archive",
                                hint="check the URL or mirror; download the archive by hand and "
                                "run `qnnctl install --file ARCHIVE`",
                            )
                        first = False
                        out.write(block)
                        digest.update(block)
                        received += len(block)
                        bar.update(len(block))
                        if sink is not None and received - announced >= CHUNK:
                            out.flush()
                            announced = received
                            sink.extend(offset + received)
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                raise Retry(f"connection lost after {_human(offset + received)}: {_short(exc)}") from None
            except DownloadError:
                part.unlink(missing_ok=True)
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
                raise Retry(f"the body ended early at {_human(size)} of {_human(total)}")
            return digest.hexdigest(), size


def _strong(etag: str | None) -> bool:
    return bool(etag) and not str(etag).startswith("W/")


def _range_start(content_range: str | None) -> int | None:
    # "bytes 100-199/200"
    if not content_range or not content_range.startswith("bytes "):
        return None
    try:
        return int(content_range[6:].split("-", 1)[0])
    except ValueError:
        return None


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
