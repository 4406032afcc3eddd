"""Parts of a remote archive, fetched with HTTP Range requests into a sparse local file.

Each byte range is written at its own offset of `downloads/<name>.sparse`, a file as long as
the archive whose unfetched parts are holes, so that zipfile and qnnctl's extractor read the
central directory and the chosen members from it as from the whole archive. A small record
beside it (`<name>.sparse.json`, 0600 like the file) lists the ranges held (qnnctl.net.sparse):
an interrupted install resumes with what it had, and asks with If-Range so that bytes of another version of
the file are never mixed in.

The requests go through qnnctl.net.download's session and retry policy (each URL redacted in
every message); a body that breaks off is asked for again from where it stopped.
A few requests run at a time, each for at most `PIECE` bytes, in the order of the archive, so
that the extractor can follow close behind. A server that answers a ranged request with the
whole file (200) raises RangesIgnored: the caller downloads the archive whole instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from qnnctl.errors import DownloadError
from qnnctl.net.body import blocks
from qnnctl.net.download import (
    BACKOFF_BASE,
    MAX_TOTAL_ATTEMPTS,
    NET_CHUNK,
    RETRY_STATUSES,
    Downloader,
    make_session,
    request_failed,
    retry_policy,
    strong_etag,
)
from qnnctl.net.failures import BodyBroke, RequestError
from qnnctl.net.http import CONNECT_TIMEOUT, READ_TIMEOUT, Response
from qnnctl.net.retry import GaveUp, answered, attempts_made, describe
from qnnctl.net.sparse import Remote, SparseFile
from qnnctl.net.urls import redact
from qnnctl.threads import start_daemon, wait_ended
from qnnctl.words import human_size

if TYPE_CHECKING:
    from qnnctl.net.download import ProgressFactory
    from qnnctl.net.retry import Policy

log = logging.getLogger("qnnctl.net.ranged")

TAIL = 16 << 10  # asked for first: the end records, and often the whole central directory
PIECE = 8 << 20  # the most one request asks for: several requests share a long range
THREADS = 4  # requests at a time
# Neighbouring ranges closer than MERGE_GAP are read as one, the gap with them, as long as the
# gaps read add up to at most MERGE_SHARE of the bytes wanted: one request less costs a round
# trip, a few kilobytes read for nothing cost less than that.
MERGE_GAP = 256 << 10
MERGE_SHARE = 0.02
# The longest one request takes: a read's timeout, and its bytes at SLOWEST. Each read of a server
# that sends a byte a minute comes within its timeout; the whole would never come. A request past
# it is asked again from where it got to, as one that broke off is, within the same budget.
REQUEST_TIME = READ_TIMEOUT
SLOWEST = 64 << 10  # bytes a second


class RangesIgnored(Exception):
    """The server sent the whole file (200) for a ranged request, or refused the range."""


class ArchiveChanged(Exception):
    """The file on the server is not the one the ranges held so far came from."""


# -- which ranges ----------------------------------------------------------------------------


def plan(ranges: Iterable[tuple[int, int]], gap: int = MERGE_GAP, share: float = MERGE_SHARE,
         piece: int = PIECE) -> list[tuple[int, int]]:
    """The requests for `ranges`: overlapping ones joined, the smallest gaps under `gap` read
    as long as all gaps read stay within `share` of the bytes wanted, then cut into pieces of
    at most `piece` bytes, in the order of the file."""
    merged: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[0] < r[1]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    wanted = sum(end - start for start, end in merged)
    gaps = sorted((merged[i + 1][0] - merged[i][1], i) for i in range(len(merged) - 1))
    budget = share * wanted
    bridged: set[int] = set()
    for size, index in gaps:
        if size >= gap or size > budget:
            break
        budget -= size
        bridged.add(index)
    joined: list[tuple[int, int]] = []
    for index, (start, end) in enumerate(merged):
        if index - 1 in bridged:
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((start, end))
    pieces: list[tuple[int, int]] = []
    for start, end in joined:
        count = max(1, -(-(end - start) // piece))
        step = -(-(end - start) // count)  # pieces of about equal size
        pieces.extend((s, min(s + step, end)) for s in range(start, end, step))
    return pieces


# -- requests --------------------------------------------------------------------------------


class _Client:
    """One thread's session, and the download retry policy."""

    def __init__(self, sleep: Callable[[float], None], backoff_base: float) -> None:
        self.session = make_session()
        self.policy = retry_policy(backoff_base, sleep)

    def get(self, url: str, shown: str, headers: dict[str, str], policy: Policy) -> Response:
        try:
            return self.session.get(url, headers, (CONNECT_TIMEOUT, READ_TIMEOUT), policy)
        except RequestError as exc:
            raise request_failed(shown, exc) from None

    def close(self) -> None:
        self.session.close()


def _check_status(response: Response, shown: str, policy: Policy) -> None:
    """DownloadError for the answers that no range can come from (404 is the caller's)."""
    status = response.status
    if status in RETRY_STATUSES:
        spent: Policy = response.retries or policy
        raise Downloader._gave_up(shown, spent.attempts,
                                  f"the last answer was {answered(status, response.reason)}")
    if "text/html" in response.headers.get("Content-Type", "").lower():
        raise DownloadError(
            f"{shown} answered with an HTML page, not an archive "
            "(a login page, a proxy's error page, or a wrong URL)",
            hint="open the URL in a browser, or download the archive by hand and run "
            "`qnnctl install --file ARCHIVE`",
        )
    if status not in (200, 206, 404, 416):
        raise DownloadError(f"{answered(status, response.reason)} from {shown}",
                            hint="check the URL, the version, or your access to the mirror")


def _content_range(value: str | None) -> tuple[int, int, int] | None:
    """`bytes 100-199/1000` as (100, 200, 1000): the end is exclusive."""
    if not value or not value.startswith("bytes "):
        return None
    span, _, total = value[6:].partition("/")
    first, _, last = span.partition("-")
    try:
        return int(first), int(last) + 1, int(total)
    except ValueError:
        return None


class NotFound(Exception):
    """404 at this URL."""


def probe(urls: Sequence[str], sleep: Callable[[float], None] = time.sleep,
          backoff_base: float | None = None) -> tuple[Remote, int, bytes]:
    """The first of `urls` that exists, its size and validators, and its last bytes (from the
    offset returned). RangesIgnored when the server does not serve ranges."""
    client = _Client(sleep, BACKOFF_BASE if backoff_base is None else backoff_base)
    try:
        missing = ""
        for url in urls:
            shown = redact(url)
            try:
                return _probe_one(client, url, shown)
            except NotFound:
                missing = shown
                log.info("not found at %s", shown)
        raise DownloadError(
            f"the archive was not found (HTTP 404) at {missing}",
            hint="check the version (a prefix such as `qnnctl install 2.37` picks the newest known "
            "release), or set QNNCTL_MIRROR to a mirror that holds it",
        )
    finally:
        client.close()


def _probe_one(client: _Client, url: str, shown: str) -> tuple[Remote, int, bytes]:
    policy = client.policy.start(shown)
    response = client.get(url, shown, {"Range": f"bytes=-{TAIL}"}, policy)
    with response:
        if response.status == 404:
            raise NotFound(url)
        _check_status(response, shown, policy)
        if response.status == 416:
            raise RangesIgnored(f"{shown} refused a ranged request (HTTP 416)")
        if response.status == 200:
            raise RangesIgnored(f"{shown} answered a ranged request with the whole file (HTTP 200)")
        span = _content_range(response.headers.get("Content-Range"))
        # More than the end asked for is no answer to it, and is held in memory: not read.
        if span is None or span[1] != span[2] or span[2] - span[0] > TAIL:
            raise RangesIgnored(f"{shown} answered a request for its end with "
                                f"{response.headers.get('Content-Range')!r}")
        start, _, size = span
        etag = response.headers.get("ETag")
        remote = Remote(url, shown, size, etag if strong_etag(etag) else None, response.headers.get("Last-Modified"))
        tail = bytearray()
        allowed = REQUEST_TIME + TAIL / SLOWEST
        try:
            for block in blocks(response, NET_CHUNK, _by(time.monotonic() + allowed)):
                tail += block
                if len(tail) > size - start:
                    break
        except _Late:
            raise DownloadError(f"the end of {shown} took more than {allowed:g} s to come ({len(tail)} of "
                                f"{size - start} bytes)", hint="run the same command again") from None
        except Exception as exc:  # a body that broke off: the caller asks again
            raise DownloadError(f"cannot read the end of {shown}: {describe(exc)}",
                                hint="run the same command again") from None
        if len(tail) > size - start:
            raise DownloadError(f"the end of {shown} went on past the {size - start} bytes its Content-Range holds",
                                hint="run the same command again")
        if len(tail) != size - start:
            raise DownloadError(f"the end of {shown} came short ({len(tail)} of {size - start} bytes)",
                                hint="run the same command again")
        return remote, start, bytes(tail)


class Fetcher:
    """Fetches ranges of `sparse`'s archive in `threads` threads, in the order given.

    `fetch()` waits for all of them; `start()` returns at once, and `wait()` then blocks until
    a range is held, so that another thread can use each part as soon as it is there. The
    first failure stops the others and is raised by `wait()` and `finish()`.
    """

    def __init__(self, sparse: SparseFile, progress: ProgressFactory | None = None, threads: int = THREADS,
                 sleep: Callable[[float], None] = time.sleep, backoff_base: float | None = None) -> None:
        self.sparse = sparse
        self.progress = progress
        self.threads = threads
        self.sleep = sleep
        self.backoff_base = BACKOFF_BASE if backoff_base is None else backoff_base
        self._queue: list[tuple[int, int]] = []
        self._changed = threading.Condition()
        self._failure: BaseException | None = None
        self._stop = threading.Event()
        self._workers_ended: list[threading.Event] = []  # one per worker thread, set as it ends
        self._bar: Any = None
        self.received = 0  # bytes this run received

    def fetch(self, ranges: Sequence[tuple[int, int]], label: str) -> None:
        self.start(ranges, label)
        self.finish()

    def start(self, ranges: Sequence[tuple[int, int]], label: str) -> None:
        wanted = plan(self.sparse.missing(ranges))
        total = sum(end - start for start, end in wanted)
        if not wanted:
            return
        log.debug("%d requests for %s", len(wanted), human_size(total))
        if self.progress is not None:
            self._bar = _LockedProgress(self.progress(label, total, 0))
        self._queue = list(reversed(wanted))
        for i in range(min(self.threads, len(wanted))):
            self._workers_ended.append(start_daemon(self._work, f"qnnctl-range-{i}"))

    def wait(self, start: int, end: int) -> None:
        """Block until [start, end) is held; raise the failure that stopped the fetching."""
        with self._changed:
            while not self.sparse.covers(start, end):
                if self._failure is not None:
                    raise self._failure
                if all(ended.is_set() for ended in self._workers_ended):
                    raise DownloadError(f"bytes {start}-{end - 1} of {self.sparse.remote.shown} were not fetched")
                self._changed.wait(1.0)

    def finish(self) -> None:
        """Wait for every request; the first failure is raised here."""
        interrupted = wait_ended(self._workers_ended, self.abandon)  # Ctrl-C: stop the others, still wait
        self._workers_ended = []
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self.sparse.save()
        if interrupted is not None:
            raise interrupted
        if self._failure is not None:
            raise self._failure

    def abandon(self) -> None:
        """Stop taking requests; the ones running end at their next block."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()

    # -- the threads ---------------------------------------------------------------------

    def _work(self) -> None:
        client = _Client(self.sleep, self.backoff_base)
        try:
            while not self._stop.is_set():
                with self._changed:
                    if not self._queue:
                        return
                    start, end = self._queue.pop()
                self._range(client, start, end)
        except BaseException as exc:  # raised again by wait() and finish()
            with self._changed:
                if self._failure is None:
                    self._failure = exc
                self._changed.notify_all()
            self._stop.set()
        finally:
            client.close()
            with self._changed:
                self._changed.notify_all()

    def _range(self, client: _Client, start: int, end: int) -> None:
        """Fetch [start, end) into the sparse file, asking again from where a body broke off."""
        remote = self.sparse.remote
        policy = client.policy.start(remote.shown)
        attempts = 0
        first = start
        trickles = 0  # answers that ended short of the range with less than a block each
        while start < end and not self._stop.is_set():
            attempts += 1
            before = start
            try:
                start = self._request(client, start, end, policy)
                if start < end and start - before < NET_CHUNK and not self._stop.is_set():
                    # A byte an answer moves forward, and no back-off: a hang by another name.
                    trickles += 1
                    if trickles >= MAX_TOTAL_ATTEMPTS:
                        raise Downloader._gave_up(
                            remote.shown, attempts, f"{trickles} answers brought less than {NET_CHUNK >> 10} KiB "
                            f"each ({start - first} of bytes {first}-{end - 1} in all)")
            except _Broke as broke:
                start = broke.reached
                if start > before:
                    policy = client.policy.start(remote.shown)  # it moved on: the whole budget again
                else:
                    policy = broke.policy
                if attempts >= MAX_TOTAL_ATTEMPTS:
                    raise Downloader._gave_up(remote.shown, attempts, str(broke.error)) from None
                try:
                    policy = policy.increment(error=broke.error)
                except GaveUp as exc:
                    raise Downloader._gave_up(remote.shown, attempts_made(exc), str(broke.error)) from None
                policy.sleep()

    def _request(self, client: _Client, start: int, end: int, policy: Policy) -> int:
        """One request for [start, end); returns where it got to (`end` when complete)."""
        remote = self.sparse.remote
        headers = {"Range": f"bytes={start}-{end - 1}"}
        if remote.validator:
            headers["If-Range"] = remote.validator
        response = client.get(remote.url, remote.shown, headers, policy)
        with response:
            spent: Policy = response.retries or policy
            status = response.status
            if status == 404:
                raise DownloadError(f"{remote.shown} is no longer on the server (HTTP 404)",
                                    hint="check the URL or mirror, then run the same command again")
            _check_status(response, remote.shown, spent)
            etag = response.headers.get("ETag")
            if status == 416:
                raise ArchiveChanged(f"{remote.shown} refused bytes {start}-{end - 1} of its {remote.size} (HTTP 416)")
            if status == 200:
                if strong_etag(etag) and etag != remote.etag:
                    raise ArchiveChanged(f"{remote.shown} has a new ETag ({etag}, was {remote.etag})")
                raise RangesIgnored(f"{remote.shown} answered a ranged request with the whole file (HTTP 200)")
            span = _content_range(response.headers.get("Content-Range"))
            if span is None or span[0] != start or span[1] > end or span[2] != remote.size:
                if span is not None and span[2] != remote.size:
                    raise ArchiveChanged(f"{remote.shown} is now {span[2]} bytes long, not {remote.size}")
                raise RangesIgnored(f"{remote.shown} answered bytes {start}-{end - 1} with "
                                    f"{response.headers.get('Content-Range')!r}")
            if span[1] <= start:
                # Empty or backwards (`bytes S-(S-1)/SIZE`): asked again at once, it would be asked
                # for ever. A failed attempt instead, which the retry budget ends.
                raise _Broke(spent, BodyBroke(f"{remote.shown} answered bytes {start}-{end - 1} with "
                                              f"{response.headers.get('Content-Range')!r}, which holds none "
                                              "of them"), start)
            position = start
            allowed = REQUEST_TIME + (end - start) / SLOWEST
            deadline = time.monotonic() + allowed
            try:
                for block in blocks(response, NET_CHUNK, _by(deadline)):
                    if self._stop.is_set():
                        return position
                    if position >= span[1]:
                        break  # what comes past the range is not read: it may never end
                    block = block[: span[1] - position]
                    self.sparse.write(position, block)
                    position += len(block)
                    if self._bar is not None:
                        self._bar.update(len(block))
                    with self._changed:
                        self.received += len(block)
                        self._changed.notify_all()
            except _Late:
                if position < span[1]:
                    raise _Broke(spent, BodyBroke(f"a range of {remote.shown} took more than {allowed:g} s, at "
                                                  f"{position - start} of {end - start} bytes"), position) from None
            except RequestError as exc:
                raise _Broke(spent, BodyBroke(f"a range of {remote.shown} stopped at {position - start} of "
                                              f"{end - start} bytes: {describe(exc)}"), position) from None
            if position < span[1]:
                raise _Broke(spent, BodyBroke(f"a range of {remote.shown} ended early, at {position - start} of "
                                              f"{span[1] - start} bytes"), position)
            return position


class _Late(Exception):
    """A request went on past its deadline."""


def _by(deadline: float) -> Callable[[int], None]:
    """The check `blocks` makes of each piece of a request's body: _Late past `deadline`, however
    slowly a server sends, within a read's timeout."""
    def check(_: int) -> None:
        if time.monotonic() > deadline:
            raise _Late
    return check


class _Broke(Exception):
    def __init__(self, policy: Policy, error: Exception, reached: int) -> None:
        super().__init__(str(error))
        self.policy = policy
        self.error = error
        self.reached = reached


class _LockedProgress:
    """One progress display for every thread."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lock = threading.Lock()

    def update(self, n: int) -> None:
        with self.lock:
            self.inner.update(n)

    def close(self) -> None:
        with self.lock:
            self.inner.close()


