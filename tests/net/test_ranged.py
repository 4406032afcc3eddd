"""qnnctl.net.ranged in the tests' own process: the sparse file and its record, the plan of
requests, the probe of the archive's end, and the fetcher's requests, retries and failures,
against the loopback server's faults (tests/httpserver.py).

The fetcher reads its answers in blocks of `BLOCK` bytes here (ranged.NET_CHUNK, read at each
request), so that a range of a few kilobytes is several blocks; every wait between retries goes
to a list instead of the clock.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from qnnctl.errors import DownloadError
from qnnctl.net import ranged
from qnnctl.net import sparse as sparse_file
from qnnctl.net.download import make_session
from qnnctl.net.ranged import ArchiveChanged, Fetcher, RangesIgnored, plan, probe
from qnnctl.net.sparse import Remote, SparseFile
from qnnctl.threads import wait_ended
from tests.conftest import require_tool
from tests.httpserver import Fault, FaultServer, self_signed_certificate

DATA = random.Random(20261204).randbytes(200_000)
SIZE = len(DATA)
END = 16 << 10  # what the probe asks for: the archive's last 16 KiB
TAIL_START = SIZE - END
PATH = "/2.37.0.250724/v2.37.0.250724.zip"
NAME = "v2.37.0.250724.zip"
BLOCK = 4 << 10
LAST_MODIFIED = "Wed, 21 Oct 2015 07:28:00 GMT"
# A remote for the sparse file on its own: no request is made for it.
REMOTE = Remote("http://127.0.0.1:9/v.zip?token=s3cret", "http://127.0.0.1:9/v.zip?token=***", SIZE, '"e-1"',
                LAST_MODIFIED)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranged, "NET_CHUNK", BLOCK)


@pytest.fixture
def umask() -> Iterator[None]:
    """A umask that would let others read a new file: the sparse file and its record must not."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.fixture
def archive(server: FaultServer) -> FaultServer:
    server.add(PATH, DATA)
    return server


def url_of(server: FaultServer, path: str = PATH) -> str:
    """The archive's URL with a secret in it, which no message may show."""
    return server.url(f"{path}?token=s3cret")


def shown_of(server: FaultServer, path: str = PATH) -> str:
    return server.url(f"{path}?token=***")


@pytest.fixture
def sparse(archive: FaultServer, tmp_path: Path) -> Iterator[SparseFile]:
    """The archive probed (its first request) and its sparse file opened, holding the end."""
    remote, tail_start, tail = probe([url_of(archive)])
    opened = SparseFile.open(tmp_path / "downloads", NAME, remote, tail_start, tail)
    yield opened
    opened.close()


def asked(server: FaultServer) -> list[str]:
    """The Range of each request for the archive after the probe's."""
    return [r.headers["Range"] for r in server.requests_for(PATH)[1:]]


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def record_on_disk(sparse: SparseFile) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(sparse.record.read_text(encoding="utf-8"))
    return data


def as_lists(ranges: Iterable[tuple[int, int]]) -> list[list[int]]:
    return [[start, end] for start, end in ranges]


def wait_until(condition: Callable[[], bool], seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def etag_on(server: FaultServer) -> str:
    """The archive's ETag as the server sends it now (a HEAD, before any fault is queued)."""
    with make_session() as session, session.head(server.url(PATH)) as response:
        return str(response.headers["ETag"])


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port: int = probe_socket.getsockname()[1]
    return port


class Bars:
    """A progress factory that records what it is told."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, int | None, int]] = []
        self.updates: list[int] = []
        self.closed = 0

    def __call__(self, label: str, total: int | None, initial: int) -> Bars:
        self.opened.append((label, total, initial))
        return self

    def update(self, n: int) -> None:
        self.updates.append(n)

    def close(self) -> None:
        self.closed += 1


# -- the sparse file -----------------------------------------------------------------------


def runs(mask: bytearray, start: int = 0, end: int | None = None, value: int = 1) -> list[tuple[int, int]]:
    """The runs of `value` in mask[start:end], as (start, end) pairs."""
    end = len(mask) if end is None else end
    out: list[tuple[int, int]] = []
    i = start
    while i < end:
        if mask[i] != value:
            i += 1
            continue
        j = i
        while j < end and mask[j] == value:
            j += 1
        out.append((i, j))
        i = j
    return out


def test_a_new_sparse_file_is_as_long_as_the_archive_holds_its_end_and_is_private(tmp_path: Path,
                                                                                 umask: None) -> None:
    folder = tmp_path / "cache" / "downloads"  # neither exists yet
    tail = DATA[TAIL_START:]
    sparse = SparseFile.open(folder, NAME, REMOTE, TAIL_START, tail)
    try:
        assert sparse.path == folder / f"{NAME}.sparse"
        assert sparse.record == folder / f"{NAME}.sparse.json"
        assert sparse.path.stat().st_size == SIZE
        assert stat.S_IMODE(sparse.path.stat().st_mode) == 0o600
        assert stat.S_IMODE(sparse.record.stat().st_mode) == 0o600
        assert sparse.held() == [(TAIL_START, SIZE)]
        assert sparse.held_bytes() == END
        assert sparse.read_at(TAIL_START, END) == tail
        assert sparse.read_at(0, TAIL_START) == bytes(TAIL_START)  # holes read as zeros
        assert record_on_disk(sparse) == {
            "schema": 1, "url": REMOTE.shown, "size": SIZE, "etag": REMOTE.etag,
            "last_modified": REMOTE.last_modified, "held": [[TAIL_START, SIZE]]}
        assert "s3cret" not in sparse.record.read_text(encoding="utf-8")
    finally:
        sparse.close()


def test_the_ranges_held_are_the_bytes_written(tmp_path: Path) -> None:
    """Writes of every kind (apart, touching, overlapping, inside, empty) against a byte map."""
    size = 2000
    remote = Remote(REMOTE.url, REMOTE.shown, size, REMOTE.etag, None)
    sparse = SparseFile.open(tmp_path, NAME, remote, size, b"")  # nothing of the end either
    mask = bytearray(size)
    rng = random.Random(11)
    try:
        assert sparse.held() == []
        assert sparse.missing([(0, size)]) == [(0, size)]
        for _ in range(250):
            start = rng.randrange(size)
            end = min(size, start + rng.choice([0, 1, 2, rng.randrange(3, 60)]))
            sparse.write(start, DATA[start:end])
            mask[start:end] = b"\x01" * (end - start)
            assert sparse.held() == runs(mask)
            assert sparse.held_bytes() == sum(mask)
            a, b = rng.randrange(size + 1), rng.randrange(size + 1)
            assert sparse.covers(a, b) == all(mask[a:b])  # all() of nothing: an empty range is held
            queries = [(a, b), (b, a), (rng.randrange(size), size)]
            assert sparse.missing(queries) == [gap for s, e in queries for gap in runs(mask, s, max(s, e), 0)]
        for start, end in sparse.held():
            assert sparse.read_at(start, end - start) == DATA[start:end]
    finally:
        sparse.close()


@pytest.mark.parametrize(("writes", "held"), [
    ([(100, 200), (300, 400)], [(100, 200), (300, 400)]),
    ([(100, 200), (200, 300)], [(100, 300)]),  # touching after
    ([(200, 300), (100, 200)], [(100, 300)]),  # touching before
    ([(100, 200), (300, 400), (150, 350)], [(100, 400)]),  # across a gap
    ([(100, 200), (300, 400), (500, 600), (50, 700)], [(50, 700)]),  # over several
    ([(100, 200), (300, 400), (320, 350)], [(100, 200), (300, 400)]),  # inside the last
    ([(100, 200), (300, 400), (120, 150)], [(100, 200), (300, 400)]),  # inside the first
    ([(300, 400), (100, 150)], [(100, 150), (300, 400)]),  # before the first
    ([(100, 200), (500, 500), (50, 50), (150, 150)], [(100, 200)]),  # empty writes hold nothing
], ids=["apart", "touching-after", "touching-before", "across", "over-several", "inside-last", "inside-first",
        "before-first", "empty"])
def test_writes_join_the_ranges_they_touch(tmp_path: Path, writes: list[tuple[int, int]],
                                           held: list[tuple[int, int]]) -> None:
    remote = Remote(REMOTE.url, REMOTE.shown, 1000, None, None)
    sparse = SparseFile.open(tmp_path, NAME, remote, 1000, b"")
    try:
        for start, end in writes:
            sparse.write(start, DATA[start:end])
        assert sparse.held() == held
        assert sparse.held_bytes() == sum(end - start for start, end in held)
        for start, end in held:
            assert sparse.read_at(start, end - start) == DATA[start:end]
    finally:
        sparse.close()


@pytest.fixture
def three_held(tmp_path: Path) -> Iterator[SparseFile]:
    """A sparse file of 1000 bytes holding [100, 200), [300, 400) and [500, 600)."""
    remote = Remote(REMOTE.url, REMOTE.shown, 1000, None, None)
    sparse = SparseFile.open(tmp_path, NAME, remote, 1000, b"")
    for start in (100, 300, 500):
        sparse.write(start, DATA[start:start + 100])
    yield sparse
    sparse.close()


@pytest.mark.parametrize(("start", "end", "covered"), [
    (100, 200, True), (100, 150, True), (150, 200, True), (300, 400, True), (550, 600, True),
    (99, 150, False), (100, 201, False), (150, 250, False), (0, 10, False), (650, 700, False),
    (50, 50, True), (150, 150, True), (60, 40, True),  # empty: nothing to hold
])
def test_covers(three_held: SparseFile, start: int, end: int, covered: bool) -> None:
    assert three_held.covers(start, end) is covered


@pytest.mark.parametrize(("ranges", "missing"), [
    ([(0, 700)], [(0, 100), (200, 300), (400, 500), (600, 700)]),
    ([(0, 50)], [(0, 50)]),  # before the first
    ([(50, 150)], [(50, 100)]),
    ([(150, 250)], [(200, 250)]),  # from inside one
    ([(200, 450)], [(200, 300), (400, 450)]),  # from the end of one
    ([(300, 350)], []),  # from the start of one
    ([(100, 200)], []),  # exactly one
    ([(550, 650)], [(600, 650)]),  # past the last
    ([(10, 5)], []),
    ([(120, 130), (350, 550), (0, 20)], [(400, 500), (0, 20)]),
])
def test_missing(three_held: SparseFile, ranges: list[tuple[int, int]], missing: list[tuple[int, int]]) -> None:
    assert three_held.missing(ranges) == missing


def test_close_and_remove_can_be_done_twice(tmp_path: Path) -> None:
    folder = tmp_path / "downloads"
    sparse = SparseFile.open(folder, NAME, REMOTE, TAIL_START, DATA[TAIL_START:])
    sparse.close()
    assert sparse.fd == -1
    sparse.close()
    assert sparse.fd == -1
    sparse.remove()
    assert not sparse.path.exists()
    assert not sparse.record.exists()
    sparse.remove()
    assert list(folder.iterdir()) == []
    open_one = SparseFile.open(folder, NAME, REMOTE, TAIL_START, DATA[TAIL_START:])
    open_one.remove()  # closes it too
    assert open_one.fd == -1
    assert list(folder.iterdir()) == []


def test_a_sparse_file_opened_where_stdin_was_is_closed_too(tmp_path: Path) -> None:
    """With stdin closed (`qnnctl install <&-`), the sparse file is opened as descriptor 0."""
    saved = os.dup(0)
    try:
        os.close(0)
        sparse = SparseFile.open(tmp_path, NAME, REMOTE, TAIL_START, DATA[TAIL_START:])
        assert sparse.fd == 0
        sparse.close()
        assert sparse.fd == -1
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(0)
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_a_file_shortened_behind_its_back_is_refused(tmp_path: Path) -> None:
    sparse = SparseFile.open(tmp_path, NAME, REMOTE, TAIL_START, DATA[TAIL_START:])
    try:
        os.truncate(sparse.path, 1000)
        with pytest.raises(DownloadError) as caught:
            sparse.read_at(500, 1000)
    finally:
        sparse.close()
    assert str(caught.value) == f"{sparse.path} is shorter than the archive"


# -- resuming from the record --------------------------------------------------------------


def record_of(held: object, **changes: Any) -> dict[str, Any]:
    return {"schema": 1, "url": REMOTE.shown, "size": SIZE, "etag": REMOTE.etag,
            "last_modified": REMOTE.last_modified, "held": held, **changes}


def leave(folder: Path, record: object, content: bytes = DATA) -> None:
    """What an earlier run left: the sparse file (here all of the archive) and its record."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{NAME}.sparse").write_bytes(content)
    text = record if isinstance(record, str) else json.dumps(record)
    (folder / f"{NAME}.sparse.json").write_text(text, encoding="utf-8")


def test_a_record_of_the_same_archive_is_resumed(tmp_path: Path) -> None:
    """The ranges held before are kept, and the end asked for again is compared with what was
    held of it: here a longer end than the last run's, which overlaps two ranges in part."""
    later = SIZE - 4000
    held = [[0, 1000], [later - 500, later + 300], [SIZE - 1000, SIZE]]
    content = bytearray(SIZE)
    for start, end in held:
        content[start:end] = DATA[start:end]
    leave(tmp_path, record_of(held), bytes(content))
    sparse = SparseFile.open(tmp_path, NAME, REMOTE, later, DATA[later:])
    try:
        assert sparse.held() == [(0, 1000), (later - 500, SIZE)]
        assert sparse.held_bytes() == 1000 + SIZE - later + 500
        assert sparse.read_at(0, 1000) == DATA[:1000]
        assert sparse.read_at(later - 500, SIZE - later + 500) == DATA[later - 500:]
        assert sparse.read_at(1000, 1000) == bytes(1000)
        # The record is written when enough is new, not at once: it still says what it said.
        assert record_on_disk(sparse) == record_of(held)
    finally:
        sparse.close()


def test_what_a_run_saved_is_resumed_by_the_next(tmp_path: Path) -> None:
    first = SparseFile.open(tmp_path, NAME, REMOTE, TAIL_START, DATA[TAIL_START:])
    first.write(0, DATA[:1000])
    first.write(5000, DATA[5000:9000])
    first.save()
    first.close()
    again = SparseFile.open(tmp_path, NAME, REMOTE, TAIL_START, DATA[TAIL_START:])
    try:
        assert again.held() == [(0, 1000), (5000, 9000), (TAIL_START, SIZE)]
        assert again.read_at(5000, 4000) == DATA[5000:9000]
    finally:
        again.close()


HELD = [[0, 1000], [TAIL_START, SIZE]]


@pytest.mark.parametrize("record", [
    "{\"held\": ",
    [],
    record_of(HELD, schema=2),
    {k: v for k, v in record_of(HELD).items() if k != "schema"},
    record_of(HELD, url=REMOTE.url),
    record_of(HELD, size=SIZE + 1),
    record_of(HELD, etag='"e-2"'),
    record_of(HELD, last_modified="Thu, 22 Oct 2015 07:28:00 GMT"),
    {k: v for k, v in record_of(HELD).items() if k != "held"},
    record_of({"0": 1000}),
    record_of([0, 1000]),
    record_of([[0, 1000, 2000]]),
    record_of([["0", "1000"]]),
    record_of([[500, 500], [TAIL_START, SIZE]]),
    record_of([[1000, 0], [TAIL_START, SIZE]]),
    record_of([[-1, 1000], [TAIL_START, SIZE]]),
    record_of([[0, 1000], [TAIL_START, SIZE + 1]]),
    record_of([[0, 1000], [1000, 2000], [TAIL_START, SIZE]]),
    record_of([[0, 1000], [500, 2000], [TAIL_START, SIZE]]),
    record_of([[5000, 6000], [0, 1000], [TAIL_START, SIZE]]),
], ids=["not-json", "not-an-object", "another-schema", "no-schema", "another-url", "another-size", "another-etag",
        "another-date", "no-held", "held-not-a-list", "item-not-a-list", "three-numbers", "strings", "empty-range",
        "backwards-range", "before-the-start", "past-the-end", "touching", "overlapping", "out-of-order"])
def test_a_record_that_does_not_fit_starts_anew(tmp_path: Path, record: object) -> None:
    leave(tmp_path, record)
    sparse = SparseFile.open(tmp_path, NAME, REMOTE, TAIL_START, DATA[TAIL_START:])
    try:
        assert sparse.held() == [(TAIL_START, SIZE)]
        assert sparse.read_at(0, TAIL_START) == bytes(TAIL_START)  # nothing of the old file is kept
        assert sparse.read_at(TAIL_START, END) == DATA[TAIL_START:]
        assert record_on_disk(sparse) == record_of([[TAIL_START, SIZE]])
    finally:
        sparse.close()


@pytest.mark.parametrize("case", ["no-record", "no-file", "file-of-another-size", "another-end"])
def test_what_cannot_be_trusted_starts_anew(tmp_path: Path, case: str) -> None:
    other = random.Random(3).randbytes(SIZE)
    tail = other[TAIL_START:] if case == "another-end" else DATA[TAIL_START:]
    leave(tmp_path, record_of(HELD), DATA[:-1] if case == "file-of-another-size" else DATA)
    if case == "no-record":
        (tmp_path / f"{NAME}.sparse.json").unlink()
    if case == "no-file":
        (tmp_path / f"{NAME}.sparse").unlink()
    sparse = SparseFile.open(tmp_path, NAME, REMOTE, TAIL_START, tail)
    try:
        assert sparse.held() == [(TAIL_START, SIZE)]
        assert sparse.path.stat().st_size == SIZE
        assert sparse.read_at(0, TAIL_START) == bytes(TAIL_START)
        assert sparse.read_at(TAIL_START, END) == tail
        assert record_on_disk(sparse) == record_of([[TAIL_START, SIZE]])
    finally:
        sparse.close()


def test_the_record_is_written_each_time_save_every_bytes_are_new(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse_file, "SAVE_EVERY", 100)
    sparse = SparseFile.open(tmp_path, NAME, REMOTE, TAIL_START, DATA[TAIL_START:])
    try:
        sparse.write(0, DATA[:99])
        assert record_on_disk(sparse)["held"] == [[TAIL_START, SIZE]]
        sparse.write(200, DATA[200:201])  # the 100th byte since the last record
        assert record_on_disk(sparse)["held"] == [[0, 99], [200, 201], [TAIL_START, SIZE]]
        sparse.write(300, DATA[300:350])
        sparse.write(400, DATA[400:449])
        assert record_on_disk(sparse)["held"] == [[0, 99], [200, 201], [TAIL_START, SIZE]]
        sparse.write(500, DATA[500:501])
        assert record_on_disk(sparse)["held"] == [[0, 99], [200, 201], [300, 350], [400, 449], [500, 501],
                                                  [TAIL_START, SIZE]]
    finally:
        sparse.close()


@pytest.mark.parametrize(("more", "written"), [(0, True), (1, False)])
def test_the_end_written_on_resuming_counts_towards_the_next_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     more: int, written: bool) -> None:
    first = SparseFile.open(tmp_path, NAME, REMOTE, SIZE - 1000, DATA[-1000:])
    first.write(0, DATA[:1000])
    first.save()
    first.close()
    later = SIZE - 4000
    monkeypatch.setattr(sparse_file, "SAVE_EVERY", SIZE - later + more)
    sparse = SparseFile.open(tmp_path, NAME, REMOTE, later, DATA[later:])
    try:
        assert sparse.held() == [(0, 1000), (later, SIZE)]
        expected = [[0, 1000], [later, SIZE]] if written else [[0, 1000], [SIZE - 1000, SIZE]]
        assert record_on_disk(sparse)["held"] == expected
    finally:
        sparse.close()


# -- the plan ------------------------------------------------------------------------------


def test_plan_joins_overlapping_and_touching_ranges_and_leaves_out_empty_ones() -> None:
    # No gap is bridged (gap=0): only what overlaps or touches is one request.
    assert plan([(50, 60), (0, 10), (5, 20), (20, 30), (40, 40), (45, 44), (55, 58)], gap=0, share=1.0,
                piece=1000) == [(0, 30), (50, 60)]
    assert plan([], gap=10, share=1.0, piece=10) == []


@pytest.mark.parametrize(("gap", "share", "planned"), [
    (51, 0.25, [(0, 250)]),  # the gap (50) is under `gap` and exactly the budget (0.25 x 200)
    (50, 1.0, [(0, 100), (150, 250)]),  # a gap of exactly `gap` is not bridged
    (1000, 0.2, [(0, 100), (150, 250)]),  # over the budget (40)
    (10, 1.0, [(0, 100), (150, 250)]),  # within the budget, over `gap`
])
def test_plan_bridges_a_gap_under_the_limit_and_within_the_share(gap: int, share: float,
                                                                  planned: list[tuple[int, int]]) -> None:
    assert plan([(0, 100), (150, 250)], gap=gap, share=share, piece=1000) == planned


def test_plan_bridges_the_smallest_gaps_first_while_the_budget_lasts() -> None:
    # Gaps of 30, 10 and 60; a budget of 40 (0.1 x 400): the 10, then the 30, not the 60.
    assert plan([(0, 100), (130, 230), (240, 340), (400, 500)], gap=100, share=0.1, piece=1000) == [
        (0, 340), (400, 500)]
    # Two gaps of 10, a budget of 15: the first only.
    assert plan([(0, 100), (110, 210), (220, 320)], gap=100, share=0.05, piece=1000) == [(0, 210), (220, 320)]


def test_plan_bridges_a_gap_late_in_the_file() -> None:
    assert plan([(0, 10), (100, 110), (200, 210), (215, 225)], gap=10, share=1.0, piece=1000) == [
        (0, 10), (100, 110), (200, 225)]


def test_plan_cuts_long_ranges_into_pieces_of_about_equal_size() -> None:
    assert plan([(0, 25), (100, 105), (200, 220), (300, 310)], gap=1, share=0.0, piece=10) == [
        (0, 9), (9, 18), (18, 25), (100, 105), (200, 210), (210, 220), (300, 310)]


# -- the probe -----------------------------------------------------------------------------


def test_probe_reads_the_end_of_the_archive_and_what_identifies_it(archive: FaultServer) -> None:
    archive.last_modified = LAST_MODIFIED
    etag = etag_on(archive)
    sleeps: list[float] = []
    remote, tail_start, tail = probe([url_of(archive)], sleep=sleeps.append)
    assert remote == Remote(url_of(archive), shown_of(archive), SIZE, etag, LAST_MODIFIED)
    assert remote.validator == etag
    assert (tail_start, tail) == (TAIL_START, DATA[TAIL_START:])
    assert [r.headers["Range"] for r in archive.requests_for(PATH)] == ["bytes=-16384"]
    assert sleeps == []


def test_probe_of_an_archive_shorter_than_the_end_it_asks_for(server: FaultServer) -> None:
    server.add(PATH, DATA[:1000])
    remote, tail_start, tail = probe([url_of(server)])
    assert (remote.size, tail_start, tail) == (1000, 0, DATA[:1000])


@pytest.mark.parametrize("validators", ["weak-etag", "no-etag", "none"])
def test_probe_takes_only_a_strong_etag(archive: FaultServer, validators: str) -> None:
    archive.weak_etags = True
    archive.etag_enabled = validators == "weak-etag"
    archive.last_modified = None if validators == "none" else LAST_MODIFIED
    remote, _, _ = probe([url_of(archive)])
    assert remote.etag is None
    assert remote.last_modified == archive.last_modified
    assert remote.validator == archive.last_modified


def test_probe_goes_on_to_the_next_url_after_a_404(archive: FaultServer) -> None:
    remote, tail_start, _ = probe([url_of(archive, "/elsewhere.zip"), url_of(archive)])
    assert (remote.url, remote.shown, tail_start) == (url_of(archive), shown_of(archive), TAIL_START)
    assert len(archive.requests_for("/elsewhere.zip")) == 1


def test_probe_names_the_last_url_when_none_has_the_archive(archive: FaultServer) -> None:
    archive.fail(PATH, Fault.status(404))
    with pytest.raises(DownloadError) as caught:
        probe([url_of(archive, "/elsewhere.zip"), url_of(archive)])
    assert caught.value.exit_code == 3
    assert str(caught.value) == f"the archive was not found (HTTP 404) at {shown_of(archive)}"
    assert caught.value.hint == ("check the version (a prefix such as `qnnctl install 2.37` picks the newest known "
                                 "release), or set QNNCTL_MIRROR to a mirror that holds it")


def test_probe_of_no_url_names_none() -> None:
    with pytest.raises(DownloadError) as caught:
        probe([])
    assert str(caught.value) == "the archive was not found (HTTP 404) at "


def test_probe_retries_a_busy_server_with_the_default_backoff(archive: FaultServer,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    archive.fail(PATH, Fault.status(503), Fault.status(503))
    sleeps: list[float] = []
    remote, tail_start, tail = probe([url_of(archive)], sleep=sleeps.append)
    assert (remote.size, tail_start, tail) == (SIZE, TAIL_START, DATA[TAIL_START:])
    assert sleeps == [1.0, 2.0]
    assert len(archive.requests_for(PATH)) == 3
    assert warnings_in(caplog) == [
        f"{shown_of(archive)} answered HTTP 503 Service Unavailable; retrying in 1.0s (attempt 2 of 6)",
        f"{shown_of(archive)} answered HTTP 503 Service Unavailable; retrying in 2.0s (attempt 3 of 6)"]


@pytest.mark.parametrize(("status", "answer"), [(503, "HTTP 503 Service Unavailable"), (599, "HTTP 599")])
def test_probe_gives_up_when_the_server_stays_busy(archive: FaultServer, status: int, answer: str) -> None:
    archive.fail(PATH, *[Fault.status(status)] * 6)
    sleeps: list[float] = []
    with pytest.raises(DownloadError) as caught:
        probe([url_of(archive)], sleep=sleeps.append, backoff_base=0.5)
    assert str(caught.value) == f"download of {shown_of(archive)} failed after 6 attempts: the last answer was {answer}"
    assert caught.value.hint == ("run the same command again to resume; check the network, HTTPS_PROXY and "
                                 "REQUESTS_CA_BUNDLE with `qnnctl doctor`")
    assert sleeps == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert len(archive.requests_for(PATH)) == 6


HTML_REFUSAL = ("{} answered with an HTML page, not an archive (a login page, a proxy's error page, or a wrong URL)",
                "open the URL in a browser, or download the archive by hand and run `qnnctl install --file ARCHIVE`")
STATUS_HINT = "check the URL, the version, or your access to the mirror"


@pytest.mark.parametrize(("fault", "message", "hint"), [
    (Fault.html(), *HTML_REFUSAL),
    (Fault.status(403), "HTTP 403 Forbidden from {}", STATUS_HINT),
    (Fault.status(401), "HTTP 401 Unauthorized from {}", STATUS_HINT),
    # An unregistered status has no reason phrase: said without one.
    (Fault.status(499), "HTTP 499 from {}", STATUS_HINT),
], ids=["html", "403", "401", "499"])
def test_probe_refuses_what_no_archive_comes_from(archive: FaultServer, fault: Fault, message: str,
                                                  hint: str) -> None:
    archive.fail(PATH, fault)
    with pytest.raises(DownloadError) as caught:
        probe([url_of(archive)])
    assert str(caught.value) == message.format(shown_of(archive))
    assert caught.value.hint == hint
    assert len(archive.requests_for(PATH)) == 1


@pytest.mark.parametrize(("fault", "words"), [
    (Fault.ignore_range(), "answered a ranged request with the whole file (HTTP 200)"),
    (Fault.status(416), "refused a ranged request (HTTP 416)"),
    (Fault("status", 206), "answered a request for its end with None"),
    (Fault.short_range(100), f"answered a request for its end with 'bytes {TAIL_START}-{TAIL_START + 99}/{SIZE}'"),
    (Fault("status", 206, {"Content-Range": f"items {TAIL_START}-{SIZE - 1}/{SIZE}"}),
     f"answered a request for its end with 'items {TAIL_START}-{SIZE - 1}/{SIZE}'"),
    (Fault("status", 206, {"Content-Range": f"bytes {TAIL_START}-{SIZE - 1}"}),
     f"answered a request for its end with 'bytes {TAIL_START}-{SIZE - 1}'"),
    (Fault("status", 206, {"Content-Range": f"bytes {TAIL_START}-{SIZE - 1}/*"}),
     f"answered a request for its end with 'bytes {TAIL_START}-{SIZE - 1}/*'"),
    (Fault("status", 206, {"Content-Range": f"bytes -5-{SIZE - 1}/{SIZE}"}),
     f"answered a request for its end with 'bytes -5-{SIZE - 1}/{SIZE}'"),
    # More than the end asked for: not read (a "tail" of gigabytes was held whole in memory).
    (Fault.misplaced_range(-1000),
     f"answered a request for its end with 'bytes {TAIL_START - 1000}-{SIZE - 1}/{SIZE}'"),
], ids=["200", "416", "no-content-range", "short", "another-unit", "no-length", "unknown-length", "negative",
        "longer"])
def test_probe_of_a_server_that_does_not_serve_the_end_as_a_range(archive: FaultServer, fault: Fault,
                                                                  words: str) -> None:
    archive.fail(PATH, fault)
    with pytest.raises(RangesIgnored) as caught:
        probe([url_of(archive)])
    assert str(caught.value) == f"{shown_of(archive)} {words}"


def test_a_content_range_is_read_one_way() -> None:
    assert ranged._content_range(f"bytes 100-199/{SIZE}") == (100, 200, SIZE)
    # A first byte that is no number is no range, whatever the dashes: not a negative start.
    assert ranged._content_range("bytes -5-9/10") is None
    assert ranged._content_range("bytes 5-9") is None


def test_probe_reads_no_further_than_the_end_it_was_answered(archive: FaultServer) -> None:
    """The end, as asked, then bytes without end and no Content-Length: read up to one byte past
    the range, not to the end of the server's patience (it was read whole, into memory). Of an
    archive said to be 1 GiB, so that reading to any other bound than the range's end would read
    more than the server's 256 MiB."""
    size = 1 << 30
    archive.fail(PATH, Fault.endless(bytes(1 << 16), 256 << 20, 206,
                                     {"Content-Range": f"bytes {size - END}-{size - 1}/{size}"}))
    with pytest.raises(DownloadError) as caught:
        probe([url_of(archive)])
    assert str(caught.value) == f"the end of {shown_of(archive)} went on past the {END} bytes its Content-Range holds"
    assert caught.value.hint == "run the same command again"
    assert archive.bytes_served(PATH) < 32 << 20, archive.bytes_served(PATH)


def test_probe_of_an_end_sent_slowly_stops_at_its_deadline(archive: FaultServer,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The end of the archive a byte at a time: each read within its timeout, the whole never."""
    monkeypatch.setattr(ranged, "REQUEST_TIME", 0.5)
    archive.fail(PATH, Fault.slow(100, 0.2))  # its 16 KiB in 33 s
    started = time.monotonic()
    with pytest.raises(DownloadError) as caught:
        probe([url_of(archive)])
    assert time.monotonic() - started < 5
    assert re.fullmatch(rf"the end of {re.escape(shown_of(archive))} took more than 0\.75 s to come \(\d+ of {END} "
                        r"bytes\)", str(caught.value)), str(caught.value)
    assert caught.value.hint == "run the same command again"


def test_probe_of_an_end_that_comes_short(archive: FaultServer) -> None:
    start = SIZE - 100
    archive.fail(PATH, Fault("status", 206, {"Content-Range": f"bytes {start}-{SIZE - 1}/{SIZE}"}))  # and no body
    with pytest.raises(DownloadError) as caught:
        probe([url_of(archive)])
    assert str(caught.value) == f"the end of {shown_of(archive)} came short (0 of 100 bytes)"
    assert caught.value.hint == "run the same command again"


def test_probe_of_an_end_that_breaks_off(archive: FaultServer) -> None:
    archive.fail(PATH, Fault.drop_after(1000))
    with pytest.raises(DownloadError) as caught:
        probe([url_of(archive)])
    assert str(caught.value) == (f"cannot read the end of {shown_of(archive)}: the server closed the connection "
                                 f"{END - 1000} bytes before the end it announced")
    assert caught.value.hint == "run the same command again"


def test_probe_where_nothing_listens() -> None:
    port = closed_port()
    sleeps: list[float] = []
    with pytest.raises(DownloadError) as caught:
        probe([f"http://127.0.0.1:{port}/v.zip?token=s3cret"], sleep=sleeps.append)
    assert str(caught.value).startswith(
        f"download of http://127.0.0.1:{port}/v.zip?token=*** failed after 6 attempts: cannot reach the server: "
        "the connection was refused")
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_probe_over_https_retries_as_over_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_tool("openssl")
    certificate = self_signed_certificate(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate.cert))
    with FaultServer(tls=certificate) as server:
        server.add(PATH, DATA)
        server.fail(PATH, Fault.status(503))
        sleeps: list[float] = []
        remote, tail_start, tail = probe([server.url(PATH)], sleep=sleeps.append)
    assert remote.shown.startswith("https://")
    assert (tail_start, tail) == (TAIL_START, DATA[TAIL_START:])
    assert sleeps == [1.0]


# -- fetching ------------------------------------------------------------------------------


def test_fetch_asks_for_each_range_in_the_order_of_the_file(archive: FaultServer, sparse: SparseFile,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    sleeps: list[float] = []
    fetcher = Fetcher(sparse, threads=1, sleep=sleeps.append)
    fetcher.fetch([(70_000, 90_000), (1000, 30_000)], "host")
    assert asked(archive) == ["bytes=1000-29999", "bytes=70000-89999"]
    assert {r.headers["If-Range"] for r in archive.requests_for(PATH)[1:]} == {sparse.remote.etag}
    assert sparse.held() == [(1000, 30_000), (70_000, 90_000), (TAIL_START, SIZE)]
    assert sparse.read_at(1000, 29_000) == DATA[1000:30_000]
    assert sparse.read_at(70_000, 20_000) == DATA[70_000:90_000]
    assert sparse.read_at(30_000, 40_000) == bytes(40_000)
    assert fetcher.received == 49_000
    assert record_on_disk(sparse)["held"] == as_lists(sparse.held())  # saved when the fetching ends
    # The same fetcher again: only what is missing is asked for.
    fetcher.fetch([(1000, 40_000)], "more")
    assert asked(archive)[2:] == ["bytes=30000-39999"]
    assert sparse.read_at(1000, 39_000) == DATA[1000:40_000]
    assert fetcher.received == 59_000
    assert sleeps == []
    assert warnings_in(caplog) == []


def test_fetch_in_several_threads(archive: FaultServer, sparse: SparseFile) -> None:
    ranges = [(i * 20_000, i * 20_000 + 5000) for i in range(6)]
    Fetcher(sparse).fetch(ranges, "host")
    assert sorted(asked(archive)) == sorted(f"bytes={start}-{end - 1}" for start, end in ranges)
    for start, end in ranges:
        assert sparse.read_at(start, end - start) == DATA[start:end]
    assert sparse.held() == [*ranges, (TAIL_START, SIZE)]


def test_ranges_a_small_gap_apart_are_one_request(archive: FaultServer, sparse: SparseFile) -> None:
    Fetcher(sparse, threads=1).fetch([(10_000, 60_000), (60_100, 110_000)], "host")
    assert asked(archive) == ["bytes=10000-109999"]
    assert sparse.held() == [(10_000, 110_000), (TAIL_START, SIZE)]
    assert sparse.read_at(10_000, 100_000) == DATA[10_000:110_000]


def test_progress_counts_the_bytes_asked_for_and_is_not_shown_for_nothing(archive: FaultServer,
                                                                          sparse: SparseFile) -> None:
    bars = Bars()
    fetcher = Fetcher(sparse, progress=bars, threads=1)
    fetcher.fetch([(5000, 25_000), (100_000, 130_000)], "host")
    assert bars.opened == [("host", 50_000, 0)]
    assert sum(bars.updates) == 50_000
    assert max(bars.updates) == BLOCK
    assert bars.closed == 1
    fetcher.fetch([(5000, 25_000)], "again")  # held already
    assert bars.opened == [("host", 50_000, 0)]
    assert bars.closed == 1
    assert len(asked(archive)) == 2


@pytest.mark.parametrize("validators", ["last-modified", "none"])
def test_if_range_sends_the_date_without_an_etag(archive: FaultServer, tmp_path: Path, validators: str) -> None:
    archive.etag_enabled = False
    archive.last_modified = None if validators == "none" else LAST_MODIFIED
    remote, tail_start, tail = probe([url_of(archive)])
    sparse = SparseFile.open(tmp_path, NAME, remote, tail_start, tail)
    try:
        Fetcher(sparse, threads=1).fetch([(1000, 2000)], "host")
        assert sparse.read_at(1000, 1000) == DATA[1000:2000]
    finally:
        sparse.close()
    (request,) = archive.requests_for(PATH)[1:]
    assert request.headers["Range"] == "bytes=1000-1999"
    assert request.headers.get("If-Range") == archive.last_modified


def test_retries_name_the_url_and_a_range_that_moved_on_has_its_budget_again(
        archive: FaultServer, sparse: SparseFile, caplog: pytest.LogCaptureFixture) -> None:
    archive.fail(PATH, Fault.status(503), Fault.drop_after(2 * BLOCK), Fault.status(503))
    sleeps: list[float] = []
    fetcher = Fetcher(sparse, threads=1, sleep=sleeps.append)
    fetcher.fetch([(20_000, 60_000)], "host")
    shown = shown_of(archive)
    moved = 20_000 + 2 * BLOCK
    assert asked(archive) == ["bytes=20000-59999"] * 2 + [f"bytes={moved}-59999"] * 2
    # After the 503, the budget is spent by one; once the range moved on, it is whole again.
    assert sleeps == [1.0, 1.0, 2.0]
    assert warnings_in(caplog) == [
        f"{shown} answered HTTP 503 Service Unavailable; retrying in 1.0s (attempt 2 of 6)",
        f"a range of {shown} stopped at {2 * BLOCK} of 40000 bytes: the server closed the connection "
        f"{40_000 - 2 * BLOCK} bytes before the end it announced; retrying in 1.0s (attempt 2 of 6)",
        f"{shown} answered HTTP 503 Service Unavailable; retrying in 2.0s (attempt 3 of 6)"]
    assert sparse.read_at(20_000, 40_000) == DATA[20_000:60_000]
    assert fetcher.received == 40_000


def test_a_body_that_breaks_off_before_a_whole_block_is_asked_for_again_from_its_start(
        archive: FaultServer, sparse: SparseFile) -> None:
    archive.fail(PATH, Fault.drop_after(100))
    sleeps: list[float] = []
    Fetcher(sparse, threads=1, sleep=sleeps.append, backoff_base=0.25).fetch([(20_000, 30_000)], "host")
    assert asked(archive) == ["bytes=20000-29999"] * 2
    assert sleeps == [0.25]
    assert sparse.read_at(20_000, 10_000) == DATA[20_000:30_000]


@pytest.mark.parametrize(("by", "body", "before"), [
    (0, b"", []),
    (500, b"x" * 300, []),
    (0, b"", [Fault.status(503)]),  # counts against the same budget
], ids=["empty", "backwards", "after-a-503"])
def test_answers_that_hold_none_of_the_range_end_it(archive: FaultServer, sparse: SparseFile, by: int, body: bytes,
                                                    before: list[Fault]) -> None:
    archive.fail(PATH, *before, *[Fault.backwards_range(by, body)] * 8)
    sleeps: list[float] = []
    with pytest.raises(DownloadError) as caught:
        Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(20_000, 30_000)], "host")
    shown = shown_of(archive)
    assert str(caught.value) == (
        f"download of {shown} failed after 6 attempts: {shown} answered bytes 20000-29999 with "
        f"'bytes 20000-{19_999 - by}/{SIZE}', which holds none of them")
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert len(asked(archive)) == 6
    assert sparse.held() == [(TAIL_START, SIZE)]


def test_answers_that_trickle_end_it(archive: FaultServer, sparse: SparseFile,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranged, "MAX_TOTAL_ATTEMPTS", 5)
    archive.fail(PATH, *[Fault.short_range(1)] * 8)
    sleeps: list[float] = []
    with pytest.raises(DownloadError) as caught:
        Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(20_000, 120_000)], "host")
    assert str(caught.value) == (f"download of {shown_of(archive)} failed after 5 attempts: 5 answers brought less "
                                 "than 4 KiB each (5 of bytes 20000-119999 in all)")
    assert asked(archive) == [f"bytes={start}-119999" for start in range(20_000, 20_005)]
    assert sparse.held() == [(20_000, 20_005), (TAIL_START, SIZE)]
    assert sparse.read_at(20_000, 5) == DATA[20_000:20_005]
    assert sleeps == []


def test_a_few_trickles_and_then_the_rest(archive: FaultServer, sparse: SparseFile,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Four answers of a byte, then the rest in one short answer: it ends the range, and is
    not a trickle."""
    monkeypatch.setattr(ranged, "MAX_TOTAL_ATTEMPTS", 5)
    archive.fail(PATH, *[Fault.short_range(1)] * 4)
    sleeps: list[float] = []
    Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(20_000, 22_000)], "host")
    assert len(asked(archive)) == 5
    assert sparse.read_at(20_000, 2000) == DATA[20_000:22_000]
    assert sleeps == []


def test_answers_of_a_whole_block_each_are_followed_to_the_end(archive: FaultServer, sparse: SparseFile,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranged, "MAX_TOTAL_ATTEMPTS", 5)
    archive.fail(PATH, *[Fault.short_range(BLOCK)] * 8)
    end = 20_000 + 10 * BLOCK + 100
    sleeps: list[float] = []
    Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(20_000, end)], "host")
    assert asked(archive) == [f"bytes={20_000 + i * BLOCK}-{end - 1}" for i in range(9)]
    assert sparse.read_at(20_000, end - 20_000) == DATA[20_000:end]
    assert sleeps == []


def test_bodies_that_break_off_each_time_end_at_the_most_attempts(archive: FaultServer, sparse: SparseFile,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each moves on, and so has the retry budget again; the total of requests ends it."""
    monkeypatch.setattr(ranged, "MAX_TOTAL_ATTEMPTS", 4)
    archive.fail(PATH, *[Fault.drop_after(2 * BLOCK)] * 6)
    sleeps: list[float] = []
    with pytest.raises(DownloadError) as caught:
        Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(50_000, 150_000)], "host")
    shown = shown_of(archive)
    last = 50_000 + 3 * 2 * BLOCK
    assert str(caught.value) == (
        f"download of {shown} failed after 4 attempts: a range of {shown} stopped at {2 * BLOCK} of "
        f"{150_000 - last} bytes: the server closed the connection {150_000 - last - 2 * BLOCK} bytes before the "
        "end it announced")
    assert asked(archive) == [f"bytes={50_000 + i * 2 * BLOCK}-149999" for i in range(4)]
    assert sleeps == [1.0, 1.0, 1.0]
    assert sparse.held() == [(50_000, 50_000 + 4 * 2 * BLOCK), (TAIL_START, SIZE)]


def test_bodies_that_end_short_of_their_range(archive: FaultServer, sparse: SparseFile,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Bodies that end before the end of their Content-Range: nothing the first time (a failed
    attempt), then two blocks at a time (each moves on), until the most attempts."""
    monkeypatch.setattr(ranged, "MAX_TOTAL_ATTEMPTS", 3)
    archive.fail(PATH, Fault.truncated_range(0), *[Fault.truncated_range(2 * BLOCK)] * 3)
    sleeps: list[float] = []
    with pytest.raises(DownloadError) as caught:
        Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(50_000, 150_000)], "host")
    shown = shown_of(archive)
    moved = 50_000 + 2 * BLOCK
    assert str(caught.value) == (f"download of {shown} failed after 3 attempts: a range of {shown} ended early, at "
                                 f"{2 * BLOCK} of {150_000 - moved} bytes")
    assert asked(archive) == ["bytes=50000-149999"] * 2 + [f"bytes={moved}-149999"]
    assert sleeps == [1.0, 1.0]
    assert sparse.read_at(50_000, 4 * BLOCK) == DATA[50_000:50_000 + 4 * BLOCK]


@pytest.mark.parametrize("shift", [10, -10])
def test_a_range_from_another_offset_is_refused(archive: FaultServer, sparse: SparseFile, shift: int) -> None:
    archive.fail(PATH, Fault.misplaced_range(shift))
    with pytest.raises(RangesIgnored) as caught:
        Fetcher(sparse, threads=1).fetch([(20_000, 30_000)], "host")
    assert str(caught.value) == (f"{shown_of(archive)} answered bytes 20000-29999 with "
                                 f"'bytes {20_000 + shift}-29999/{SIZE}'")
    assert sparse.held() == [(TAIL_START, SIZE)]
    assert sparse.read_at(19_000, 12_000) == bytes(12_000)


def test_a_content_range_past_the_range_asked_for_is_refused(archive: FaultServer, sparse: SparseFile) -> None:
    archive.fail(PATH, Fault("status", 206, {"Content-Range": f"bytes 20000-30009/{SIZE}"}))
    with pytest.raises(RangesIgnored) as caught:
        Fetcher(sparse, threads=1).fetch([(20_000, 30_000)], "host")
    assert str(caught.value) == f"{shown_of(archive)} answered bytes 20000-29999 with 'bytes 20000-30009/{SIZE}'"


def test_a_206_without_content_range_is_refused(archive: FaultServer, sparse: SparseFile) -> None:
    archive.fail(PATH, Fault("status", 206))
    with pytest.raises(RangesIgnored) as caught:
        Fetcher(sparse, threads=1).fetch([(20_000, 30_000)], "host")
    assert str(caught.value) == f"{shown_of(archive)} answered bytes 20000-29999 with None"


def test_bytes_past_the_range_in_a_body_are_not_written(archive: FaultServer, sparse: SparseFile) -> None:
    archive.fail(PATH, Fault.overlong_range(b"\xff" * 5000))
    sleeps: list[float] = []
    fetcher = Fetcher(sparse, threads=1, sleep=sleeps.append)
    fetcher.fetch([(20_000, 30_000)], "host")
    assert sparse.held() == [(20_000, 30_000), (TAIL_START, SIZE)]
    assert sparse.read_at(20_000, 10_000) == DATA[20_000:30_000]
    assert sparse.read_at(30_000, 5000) == bytes(5000)
    assert fetcher.received == 10_000
    assert sleeps == []


def test_a_body_that_goes_on_past_its_range_is_read_no_further(archive: FaultServer, sparse: SparseFile) -> None:
    """The range, then bytes without end: the range is written and the rest left unread (it was
    read, and thrown away, for as long as the server went on)."""
    archive.fail(PATH, Fault.endless(b"\xee" * (1 << 16), 256 << 20, 206,
                                     {"Content-Range": f"bytes 20000-29999/{SIZE}"}))
    fetcher = Fetcher(sparse, threads=1)
    fetcher.fetch([(20_000, 30_000)], "host")
    assert sparse.held() == [(20_000, 30_000), (TAIL_START, SIZE)]
    assert sparse.read_at(20_000, 10_000) == b"\xee" * 10_000
    assert fetcher.received == 10_000
    assert archive.bytes_served(PATH) < 32 << 20, archive.bytes_served(PATH)


def test_a_range_sent_slowly_is_asked_again_from_where_it_got_to_at_its_deadline(
        archive: FaultServer, sparse: SparseFile, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read comes within its timeout, but the whole would take for ever (a byte a minute):
    a request has a read timeout's time and its bytes' at 64 KiB/s (made short here), then it is
    asked again, as one that broke off is."""
    monkeypatch.setattr(ranged, "REQUEST_TIME", 0.5)
    archive.fail(PATH, Fault.slow(100, 0.2))  # 10,000 bytes in 20 s
    sleeps: list[float] = []
    started = time.monotonic()
    Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(20_000, 30_000)], "host")
    assert time.monotonic() - started < 5
    assert sparse.read_at(20_000, 10_000) == DATA[20_000:30_000]
    assert asked(archive) == ["bytes=20000-29999"] * 2  # no whole block came in its 0.65 s
    assert sleeps == [1.0]


def test_a_range_that_never_comes_in_time_ends_the_download_saying_so(
        archive: FaultServer, sparse: SparseFile, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every answer slower than the request's time: given up as other failed attempts are, with the
    time the range had (a read's timeout and its bytes at 64 KiB/s: 0.5 + 10,000 / 65,536 s here) and
    how far it got."""
    monkeypatch.setattr(ranged, "REQUEST_TIME", 0.5)
    archive.fail(PATH, *[Fault.slow(100, 0.2)] * 10)
    with pytest.raises(DownloadError) as caught:
        Fetcher(sparse, threads=1, sleep=lambda _: None).fetch([(20_000, 30_000)], "host")
    shown = shown_of(archive)
    assert caught.value.message == (f"download of {shown} failed after 6 attempts: a range of {shown} took more "
                                    f"than {0.5 + 10_000 / 65_536:g} s, at 0 of 10000 bytes")
    assert asked(archive) == ["bytes=20000-29999"] * 6


def test_a_range_whose_last_block_lands_past_its_deadline_is_whole(
        archive: FaultServer, sparse: SparseFile, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two blocks of 4 KiB: the first at once, the second's last bytes 0.9 s later, past the
    request's 0.625 s. Every byte of the range came: it is kept, not asked for again."""
    monkeypatch.setattr(ranged, "REQUEST_TIME", 0.5)
    archive.fail(PATH, Fault.slow(8000, 0.9))
    sleeps: list[float] = []
    fetcher = Fetcher(sparse, threads=1, sleep=sleeps.append)
    fetcher.fetch([(20_000, 20_000 + 2 * BLOCK)], "host")
    assert sparse.read_at(20_000, 2 * BLOCK) == DATA[20_000:20_000 + 2 * BLOCK]
    assert asked(archive) == [f"bytes=20000-{20_000 + 2 * BLOCK - 1}"]
    assert fetcher.received == 2 * BLOCK
    assert sleeps == []  # no failed attempt, waited after


def test_a_server_that_ignores_the_range(archive: FaultServer, sparse: SparseFile) -> None:
    archive.fail(PATH, Fault.ignore_range())
    with pytest.raises(RangesIgnored) as caught:
        Fetcher(sparse, threads=1).fetch([(20_000, 30_000)], "host")
    assert str(caught.value) == f"{shown_of(archive)} answered a ranged request with the whole file (HTTP 200)"
    assert sparse.held() == [(TAIL_START, SIZE)]


def test_bytes_of_another_version_of_the_archive_are_never_mixed_in(archive: FaultServer,
                                                                    sparse: SparseFile) -> None:
    """If-Range: the server sends the new file whole (200), with its new ETag."""
    changed = random.Random(5).randbytes(SIZE)
    archive.add(PATH, changed)
    etag = etag_on(archive)
    with pytest.raises(ArchiveChanged) as caught:
        Fetcher(sparse, threads=1).fetch([(20_000, 30_000)], "host")
    assert str(caught.value) == f"{shown_of(archive)} has a new ETag ({etag}, was {sparse.remote.etag})"
    assert sparse.held() == [(TAIL_START, SIZE)]
    assert sparse.read_at(20_000, 10_000) == bytes(10_000)


@pytest.fixture
def unvalidated(server: FaultServer, tmp_path: Path) -> Iterator[SparseFile]:
    """The archive on a server that sends neither ETag nor Last-Modified, probed and opened."""
    server.etag_enabled = False
    server.add(PATH, DATA)
    remote, tail_start, tail = probe([url_of(server)])
    opened = SparseFile.open(tmp_path, NAME, remote, tail_start, tail)
    yield opened
    opened.close()


def test_an_archive_now_of_another_length(server: FaultServer, unvalidated: SparseFile) -> None:
    server.add(PATH, DATA + bytes(400))
    with pytest.raises(ArchiveChanged) as caught:
        Fetcher(unvalidated, threads=1).fetch([(20_000, 30_000)], "host")
    assert str(caught.value) == f"{shown_of(server)} is now {SIZE + 400} bytes long, not {SIZE}"
    assert "If-Range" not in server.requests_for(PATH)[1].headers


def test_a_range_past_the_end_of_an_archive_now_shorter(server: FaultServer, unvalidated: SparseFile) -> None:
    server.add(PATH, DATA[:100_000])
    with pytest.raises(ArchiveChanged) as caught:
        Fetcher(unvalidated, threads=1).fetch([(150_000, 160_000)], "host")
    assert str(caught.value) == f"{shown_of(server)} refused bytes 150000-159999 of its {SIZE} (HTTP 416)"


def test_an_archive_no_longer_there(archive: FaultServer, sparse: SparseFile) -> None:
    archive.fail(PATH, Fault.status(404))
    bars = Bars()
    with pytest.raises(DownloadError) as caught:
        Fetcher(sparse, progress=bars, threads=1).fetch([(20_000, 30_000)], "host")
    assert str(caught.value) == f"{shown_of(archive)} is no longer on the server (HTTP 404)"
    assert caught.value.hint == "check the URL or mirror, then run the same command again"
    assert bars.closed == 1
    assert record_on_disk(sparse)["held"] == [[TAIL_START, SIZE]]


def test_the_first_failure_is_raised_by_wait_and_by_finish(archive: FaultServer, sparse: SparseFile) -> None:
    archive.fail(PATH, Fault.status(404))
    fetcher = Fetcher(sparse, threads=1)
    fetcher.start([(20_000, 30_000)], "host")
    with pytest.raises(DownloadError) as waited:
        fetcher.wait(20_000, 30_000)
    with pytest.raises(DownloadError) as finished:
        fetcher.finish()
    assert waited.value is finished.value
    assert str(waited.value) == f"{shown_of(archive)} is no longer on the server (HTTP 404)"


def test_a_server_busy_for_a_range_ends_it(archive: FaultServer, sparse: SparseFile) -> None:
    archive.fail(PATH, *[Fault.status(503)] * 6)
    sleeps: list[float] = []
    with pytest.raises(DownloadError) as caught:
        Fetcher(sparse, threads=1, sleep=sleeps.append, backoff_base=0.5).fetch([(20_000, 30_000)], "host")
    assert str(caught.value) == (f"download of {shown_of(archive)} failed after 6 attempts: the last answer was "
                                 "HTTP 503 Service Unavailable")
    assert sleeps == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_an_html_page_for_a_range(archive: FaultServer, sparse: SparseFile) -> None:
    archive.fail(PATH, Fault.html())
    with pytest.raises(DownloadError) as caught:
        Fetcher(sparse, threads=1).fetch([(20_000, 30_000)], "host")
    assert str(caught.value) == HTML_REFUSAL[0].format(shown_of(archive))


def test_a_server_that_went_away(tmp_path: Path) -> None:
    port = closed_port()
    shown = f"http://127.0.0.1:{port}/v.zip?token=***"
    remote = Remote(f"http://127.0.0.1:{port}/v.zip?token=s3cret", shown, SIZE, '"e-1"', None)
    sparse = SparseFile.open(tmp_path, NAME, remote, TAIL_START, DATA[TAIL_START:])
    sleeps: list[float] = []
    try:
        with pytest.raises(DownloadError) as caught:
            Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(1000, 2000)], "host")
    finally:
        sparse.close()
    assert str(caught.value).startswith(
        f"download of {shown} failed after 6 attempts: cannot reach the server: the connection was refused")
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_an_answer_that_does_not_come_in_time_is_asked_for_again(archive: FaultServer, sparse: SparseFile,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranged, "READ_TIMEOUT", 0.2)
    held_back = threading.Event()
    archive.fail(PATH, Fault.gate(held_back))
    release = threading.Timer(3.0, held_back.set)  # in case no timeout ends the wait
    release.start()
    sleeps: list[float] = []
    try:
        Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(20_000, 30_000)], "host")
    finally:
        release.cancel()
        held_back.set()
    assert sleeps == [1.0]
    assert asked(archive) == ["bytes=20000-29999"] * 2
    assert sparse.read_at(20_000, 10_000) == DATA[20_000:30_000]


# -- waiting for a range, stopping ---------------------------------------------------------


def test_wait_returns_once_the_range_is_held(archive: FaultServer, sparse: SparseFile) -> None:
    held_back = threading.Event()
    archive.fail(PATH, Fault.none(), Fault.gate(held_back))
    fetcher = Fetcher(sparse, threads=1)

    def let_it_through() -> None:
        # Once the second range is asked for, and the test is waiting for it.
        wait_until(lambda: held_back.is_set() or len(archive.requests_for(PATH)) == 3)
        time.sleep(0.1)
        held_back.set()

    opener = threading.Thread(target=let_it_through)
    try:
        fetcher.start([(50_000, 60_000), (1000, 5000)], "host")
        fetcher.wait(1000, 5000)
        assert sparse.read_at(1000, 4000) == DATA[1000:5000]
        opener.start()
        fetcher.wait(50_000, 60_000)
        assert sparse.covers(50_000, 60_000)
        assert sparse.read_at(50_000, 10_000) == DATA[50_000:60_000]
        fetcher.finish()
    finally:
        held_back.set()
        if opener.ident is not None:
            opener.join()


def test_wait_for_a_range_no_request_asked_for(archive: FaultServer, sparse: SparseFile) -> None:
    fetcher = Fetcher(sparse, threads=1)
    fetcher.fetch([(1000, 2000)], "host")
    fetcher.wait(1000, 2000)  # held
    fetcher.wait(TAIL_START, SIZE)
    with pytest.raises(DownloadError) as caught:
        fetcher.wait(5000, 6000)
    assert str(caught.value) == f"bytes 5000-5999 of {shown_of(archive)} were not fetched"


def test_abandon_stops_the_requests_at_the_next_block(archive: FaultServer, sparse: SparseFile) -> None:
    resume = threading.Event()
    archive.fail(PATH, Fault.pause(2 * BLOCK, resume))
    fetcher = Fetcher(sparse, threads=1)

    def stop() -> None:
        wait_until(lambda: resume.is_set() or fetcher.received >= 2 * BLOCK)
        fetcher.abandon()
        resume.set()

    stopper = threading.Thread(target=stop)
    try:
        fetcher.start([(20_000, 60_000), (100_000, 110_000)], "host")
        stopper.start()
        fetcher.finish()  # abandoned is not a failure
    finally:
        resume.set()
        stopper.join()
    assert asked(archive) == ["bytes=20000-59999"]
    assert sparse.held() == [(20_000, 20_000 + 2 * BLOCK), (TAIL_START, SIZE)]
    assert record_on_disk(sparse)["held"] == as_lists(sparse.held())
    with pytest.raises(DownloadError) as caught:
        fetcher.wait(100_000, 110_000)
    assert str(caught.value) == f"bytes 100000-109999 of {shown_of(archive)} were not fetched"


def test_ctrl_c_while_finishing_stops_the_requests_and_waits_for_them(archive: FaultServer, sparse: SparseFile,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    resume = threading.Event()
    archive.fail(PATH, Fault.pause(2 * BLOCK, resume))
    fetcher = Fetcher(sparse, threads=1)
    waiting = threading.Event()
    stopping = threading.Event()

    def watched(ended: Iterable[threading.Event], interrupt: Callable[[], None]) -> BaseException | None:
        def interrupting() -> None:
            interrupt()
            stopping.set()

        waiting.set()
        return wait_ended(ended, interrupting)

    monkeypatch.setattr(ranged, "wait_ended", watched)
    armed = threading.Event()

    def on_sigint(signum: int, frame: object) -> None:
        if armed.is_set():
            armed.clear()
            raise KeyboardInterrupt

    main = threading.get_ident()
    done = threading.Event()

    def press_ctrl_c() -> None:
        if wait_until(lambda: done.is_set() or (waiting.is_set() and fetcher.received >= 2 * BLOCK)) \
                and not done.is_set():
            time.sleep(0.05)  # well into the wait
            signal.pthread_kill(main, signal.SIGINT)
        wait_until(lambda: done.is_set() or stopping.is_set())
        resume.set()  # the request held in the middle of its answer goes on, and sees the stop

    previous = signal.signal(signal.SIGINT, on_sigint)
    presser = threading.Thread(target=press_ctrl_c)
    try:
        fetcher.start([(20_000, 60_000), (100_000, 110_000)], "host")
        armed.set()
        presser.start()
        with pytest.raises(KeyboardInterrupt):
            fetcher.finish()
    finally:
        armed.clear()
        done.set()
        resume.set()
        if presser.ident is not None:
            presser.join()
        signal.signal(signal.SIGINT, previous)
    assert asked(archive) == ["bytes=20000-59999"]
    assert sparse.held() == [(20_000, 20_000 + 2 * BLOCK), (TAIL_START, SIZE)]
    assert record_on_disk(sparse)["held"] == as_lists(sparse.held())
