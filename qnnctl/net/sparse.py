"""The sparse local file a ranged fetch writes into, and its record of the ranges held.

Each byte range is written at its own offset of `downloads/<name>.sparse`, a file as long as the
archive whose unfetched parts are holes; `<name>.sparse.json` (0600 like the file) lists the
ranges held, for the `Remote` they came from, so that an interrupted install resumes with them
(qnnctl.net.ranged fetches them).
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from qnnctl.errors import DownloadError
from qnnctl.paths import write_json_atomic
from qnnctl.words import human_size

log = logging.getLogger("qnnctl.net.ranged")

SAVE_EVERY = 4 << 20  # bytes between two updates of the record of ranges held
RECORD_SCHEMA = 1
SPARSE_SUFFIX = ".sparse"
RECORD_SUFFIX = ".sparse.json"


@dataclass(frozen=True)
class Remote:
    """The archive on the server: where, how long, and what identifies this version of it."""

    url: str  # as given, secrets included: only for requests
    shown: str  # redacted, for every message and record
    size: int
    etag: str | None
    last_modified: str | None

    @property
    def validator(self) -> str | None:
        """What If-Range sends: a strong ETag, else the Last-Modified date."""
        return self.etag or self.last_modified


class SparseFile:
    """The archive's bytes fetched so far, each at its offset, and the record of which."""

    def __init__(self, path: Path, remote: Remote, held: list[tuple[int, int]]) -> None:
        self.path = path
        self.record = path.with_name(path.name.removesuffix(SPARSE_SUFFIX) + RECORD_SUFFIX)
        self.remote = remote
        self._starts = [start for start, _ in held]
        self._ends = [end for _, end in held]
        self._lock = threading.Lock()
        self._saving = threading.Lock()  # one writer of the record at a time: they share its .tmp
        self._unsaved = 0
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)

    @classmethod
    def open(cls, folder: Path, name: str, remote: Remote, tail_start: int, tail: bytes) -> SparseFile:
        """The sparse file for `remote`, resumed when its record says it holds bytes of the
        same file (same URL, size and validator, and the same last bytes), else started anew."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}{SPARSE_SUFFIX}"
        record = folder / f"{name}{RECORD_SUFFIX}"
        held = _read_record(record, remote)
        if held and path.is_file() and path.stat().st_size == remote.size:
            sparse = cls(path, remote, held)
            # The end of the file again, where it was held before: the same bytes, or another file.
            tail_end = tail_start + len(tail)
            overlap = [(max(s, tail_start), min(e, tail_end)) for s, e in held if s < tail_end and e > tail_start]
            if all(sparse.read_at(s, e - s) == tail[s - tail_start:e - tail_start] for s, e in overlap):
                log.info("resuming: %s of %s held from an earlier run", human_size(sparse.held_bytes()),
                         human_size(remote.size))
                sparse.write(tail_start, tail)
                return sparse
            sparse.close()
        if record.exists() or path.exists():
            log.info("the archive at %s has changed since the last run (or its parts were not recorded); "
                     "fetching its parts afresh", remote.shown)
        for stale in (path, record):
            stale.unlink(missing_ok=True)
        # Private, like the record: the bytes are the user's download.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, remote.size)  # holes: no disk blocks until written
        finally:
            os.close(fd)
        sparse = cls(path, remote, [])
        sparse.write(tail_start, tail)
        sparse.save()
        return sparse

    def held(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(zip(self._starts, self._ends, strict=True))

    def held_bytes(self) -> int:
        with self._lock:
            return sum(end - start for start, end in zip(self._starts, self._ends, strict=True))

    def covers(self, start: int, end: int) -> bool:
        """Whether every byte of [start, end) is held."""
        if start >= end:
            return True
        with self._lock:
            i = bisect.bisect_right(self._starts, start) - 1
            return i >= 0 and self._ends[i] >= end

    def missing(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The parts of `ranges` not held yet."""
        out: list[tuple[int, int]] = []
        held = self.held()
        for start, end in ranges:
            i = max(bisect.bisect_right([s for s, _ in held], start) - 1, 0)
            cursor = start
            while cursor < end and i < len(held):
                s, e = held[i]
                if e <= cursor:
                    i += 1
                    continue
                if s >= end:
                    break
                if s > cursor:
                    out.append((cursor, s))
                cursor = max(cursor, e)
                i += 1
            if cursor < end:
                out.append((cursor, end))
        return out

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Write `data` at `offset` and count it as held."""
        view = memoryview(data)
        position = offset
        while view:
            written = os.pwrite(self.fd, view, position)
            view = view[written:]
            position += written
        save = False
        with self._lock:
            self._add(offset, offset + len(data))
            self._unsaved += len(data)
            save = self._unsaved >= SAVE_EVERY
        if save:
            self.save()

    def _add(self, start: int, end: int) -> None:
        if start >= end:
            return
        i = bisect.bisect_left(self._ends, start)  # the first range that ends at or after start
        j = bisect.bisect_right(self._starts, end)  # past the last range that starts at or before end
        if i < j:
            start = min(start, self._starts[i])
            end = max(end, self._ends[j - 1])
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def read_at(self, offset: int, size: int) -> bytes:
        data = os.pread(self.fd, size, offset)
        if len(data) != size:  # pragma: no cover - the file is as long as the archive
            raise DownloadError(f"{self.path} is shorter than the archive")
        return data

    def save(self) -> None:
        """Record the ranges held; the bytes are on disk first, so the record never claims more."""
        with self._saving:
            with self._lock:
                held = [[s, e] for s, e in zip(self._starts, self._ends, strict=True)]
                self._unsaved = 0
            os.fdatasync(self.fd)
            remote = self.remote
            write_json_atomic(self.record, {
                "schema": RECORD_SCHEMA, "url": remote.shown, "size": remote.size, "etag": remote.etag,
                "last_modified": remote.last_modified, "held": held,
            }, mode=0o600)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self) -> None:
        self.close()
        for path in (self.path, self.record):
            path.unlink(missing_ok=True)


def _read_record(record: Path, remote: Remote) -> list[tuple[int, int]]:
    """The ranges a record says are held, when it is for `remote`; else none."""
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
        return []
    if (data.get("url"), data.get("size")) != (remote.shown, remote.size):
        return []
    if data.get("etag") != remote.etag or data.get("last_modified") != remote.last_modified:
        return []
    held = data.get("held")
    if not isinstance(held, list):
        return []
    ranges: list[tuple[int, int]] = []
    for item in held:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) for x in item)):
            return []
        start, end = item
        if not 0 <= start < end <= remote.size or (ranges and start <= ranges[-1][1]):
            return []
        ranges.append((start, end))
    return ranges
