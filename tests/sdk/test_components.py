"""The pieces of `install --components`: the component rules, choosing members and the links
they need, the ranges requested, the sparse file's record, the zip's end records, and the
loopback server's Range support they are tested against."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import re
import stat
import struct
import urllib.request
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from qnnctl.errors import IntegrityError, UsageError
from qnnctl.install import zipindex
from qnnctl.install.zipindex import MAX_DIRECTORY, NeedMore, end_records, extents
from qnnctl.net.ranged import plan
from qnnctl.net.sparse import Remote, SparseFile, _read_record
from qnnctl.sdk.components import (
    canonical,
    complete,
    covers,
    install_command,
    installed_components,
    missing,
    parse_components,
)
from qnnctl.sdk.hosts import HOSTS
from qnnctl.sdk.members import (
    EXEC_MODE,
    FILE_MODE,
    FOLDER_MODE,
    Member,
    available,
    choose,
    component_digests,
    component_label,
    component_of,
    installed_mode,
    member_line,
    resolve_in,
    tree_digests,
    unresolved_links,
    with_link_targets,
)
from qnnctl.sdk.pin import read_pin_components, write_pin
from tests.httpserver import FaultServer, parse_ranges
from tests.sdkfactory import VERSION

# Their outcome depends on the standard library (zip reading and writing).
pytestmark = pytest.mark.stdlib

# Paths as QAIRT 2.37.0.250724 and 2.42.0.251225 lay them out below the SDK root.
REAL_LAYOUT = {
    "QNN_README.txt": "host",
    "sdk.yaml": "host",
    "bin/envsetup.sh": "host",
    "bin/x86_64-linux-clang/qnn-net-run": "host",
    "bin/x86_64-linux-clang/qnn-context-binary-generator": "host",
    "lib/x86_64-linux-clang/libQnnHtp.so": "host",
    "lib/x86_64-linux-clang/libQnnHtpPrepare.so": "host",
    "lib/python/qti/aisw/converters/qnn_backend/__init__.py": "host",
    "include/QNN/QnnInterface.h": "host",
    "include/QNN/HTP/QnnHtpDevice.h": "host",
    "share/QNN/htp/config.json": "host",
    "lib/aarch64-android/libQnnHtp.so": "android",
    "lib/aarch64-android/libQnnHtpV75Stub.so": "android",
    "bin/aarch64-android/qnn-net-run": "android",
    "lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so": "hexagon-v75",
    "lib/hexagon-v68/unsigned/libQnnHtpV68Skel.so": "hexagon-v68",
    "docs/QNN/general/overview.html": "docs",
    "examples/QNN/converter/model.py": "docs",
    "lib/x86_64-windows-msvc/QnnHtp.dll": None,
    "lib/aarch64-oe-linux-gcc11.2/libQnnHtp.so": None,
    "bin/aarch64-ubuntu-gcc9.4/qnn-net-run": None,
    "benchmarks/QNN/snapdragon.py": None,
}


@pytest.mark.parametrize(("path", "component"), sorted(REAL_LAYOUT.items()))
def test_component_rules_on_the_real_layout(path: str, component: str | None) -> None:
    assert component_of(path) == component


def test_folders_belong_to_the_component_of_what_they_hold() -> None:
    assert component_of("lib/aarch64-android", is_dir=True) == "android"
    assert component_of("lib/hexagon-v73/unsigned", is_dir=True) == "hexagon-v73"
    assert component_of("lib", is_dir=True) is None
    assert component_of("bin/x86_64-linux-clang", is_dir=True) == "host"


def test_the_host_folders_are_those_of_the_machine_qnnctl_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an aarch64 host, `host` holds its own library and tool folders, and x86_64's are no
    component; a host named explicitly wins over the machine's."""
    x86, arm = HOSTS[0], HOSTS[1]
    ours = ("lib/aarch64-oe-linux-gcc11.2/libQnnHtp.so", "bin/aarch64-oe-linux-gcc11.2/qnn-net-run")
    theirs = ("lib/x86_64-linux-clang/libQnnHtp.so", "bin/x86_64-linux-clang/qnn-net-run")
    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", "aarch64")
    assert [component_of(p) for p in (*ours, *theirs)] == ["host", "host", None, None]
    assert component_of("lib/aarch64-oe-linux-gcc11.2", is_dir=True) == "host"
    assert [component_of(p, host=x86) for p in (*ours, *theirs)] == [None, None, "host", "host"]
    assert [component_of(p) for p in ("sdk.yaml", "include/QNN/QnnInterface.h", "lib/aarch64-android/a.so")] == [
        "host", "host", "android"]
    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", "x86_64")
    assert [component_of(p) for p in (*ours, *theirs)] == [None, None, "host", "host"]
    assert [component_of(p, host=arm) for p in (*ours, *theirs)] == ["host", "host", None, None]


def test_the_rules_of_each_host_are_compiled_once_when_first_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """From no rules compiled yet (as in a new process): each host's are compiled the first time
    it is asked, kept by its machine, and the same rules answer the next time."""
    from qnnctl.sdk import members

    monkeypatch.setattr(members, "_COMPILED", {})
    x86, arm = HOSTS[0], HOSTS[1]
    assert component_of("lib/aarch64-oe-linux-gcc11.2/libQnnHtp.so", host=arm) == "host"
    assert list(members._COMPILED) == ["aarch64"]
    assert component_of("lib/x86_64-linux-clang/libQnnHtp.so", host=x86) == "host"
    assert list(members._COMPILED) == ["aarch64", "x86_64"]
    kept = members._COMPILED["x86_64"]
    assert [c for c, _ in kept] == [c for c, _ in members.host_rules(x86)]
    assert component_of("lib/aarch64-oe-linux-gcc11.2/libQnnHtp.so", host=x86) is None
    assert members._COMPILED["x86_64"] is kept


def test_component_digests_partition_as_on_x86_64_on_every_host(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [("lib/x86_64-linux-clang/a.so", "x"), ("lib/aarch64-oe-linux-gcc11.2/a.so", "a"), ("sdk.yaml", "y")]
    expected = {"host": _digest("x", "y"), "other": _digest("a")}
    for machine in ("aarch64", "x86_64"):
        monkeypatch.setenv("QNNCTL_FORCE_MACHINE", machine)
        assert component_digests(lines) == expected


def test_installed_modes_keep_only_the_execute_bit_of_the_archive() -> None:
    assert (FILE_MODE, EXEC_MODE, FOLDER_MODE) == (0o644, 0o755, 0o755)
    assert [installed_mode(m) for m in (0o644, 0o666, 0o600, 0o000, 0o4644)] == [0o644] * 5
    assert [installed_mode(m) for m in (0o755, 0o777, 0o700, 0o610, 0o601, 0o100744)] == [0o755] * 6


def test_parse_components() -> None:
    assert parse_components("android") == ("host", "android")
    assert parse_components("docs, hexagon-v75,hexagon-v69 ANDROID") == \
        ("host", "android", "hexagon-v69", "hexagon-v75", "docs")
    assert parse_components("host,all") == ("all",)
    with pytest.raises(UsageError, match="phone is not a component"):
        parse_components("host,phone")
    with pytest.raises(UsageError, match="names no component"):
        parse_components(" , ")
    with pytest.raises(UsageError, match="hexagon-vx is not"):
        parse_components("hexagon-vx")


def test_what_an_install_holds() -> None:
    assert installed_components(None) == ("all",)
    assert installed_components({"components": ["android", "host"]}) == ("host", "android")
    assert covers(("all",), ("host", "docs"))
    assert covers(("host", "android"), ("host",))
    assert not covers(("host",), ("host", "android"))
    assert not covers(("host", "android"), ("all",))
    assert missing(("host",), ("host", "hexagon-v75", "android")) == ("android", "hexagon-v75")
    assert missing(("host",), ("all",)) == ("all",)
    assert canonical(["docs", "hexagon-v9", "hexagon-v75", "host"]) == ("host", "hexagon-v9", "hexagon-v75", "docs")


def _members(spec: dict[str, str]) -> dict[PurePosixPath, Member]:
    return {PurePosixPath(p): Member(PurePosixPath(p), kind) for p, kind in spec.items()}


TOP = PurePosixPath("qairt/2.37.0.250724")
TREE = _members({
    "qairt": "dir", "qairt/2.37.0.250724": "dir", "qairt/2.37.0.250724/lib": "dir",
    "qairt/2.37.0.250724/sdk.yaml": "file",
    "qairt/2.37.0.250724/lib/x86_64-linux-clang": "dir",
    "qairt/2.37.0.250724/lib/x86_64-linux-clang/libQnnHtp.so": "file",
    "qairt/2.37.0.250724/lib/x86_64-linux-clang/skel": "link",  # -> ../hexagon-v73/unsigned
    "qairt/2.37.0.250724/lib/x86_64-linux-clang/cpu": "link",  # -> via -> a link on the way
    "qairt/2.37.0.250724/lib/aarch64-android/via": "link",  # -> libQnnCpu.so
    "qairt/2.37.0.250724/lib/aarch64-android/libQnnCpu.so": "file",
    "qairt/2.37.0.250724/lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so": "file",
    "qairt/2.37.0.250724/lib/hexagon-v73/unsigned/libQnnHtpV73.cat": "file",
    "qairt/2.37.0.250724/lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so": "file",
    "outside.txt": "file",
})


def test_choose_and_the_links_it_needs() -> None:
    assert available(TREE.values(), TOP) == ("host", "android", "hexagon-v73", "hexagon-v75")
    chosen = choose(TREE.values(), TOP, ("host",))
    lib = TOP / "lib/x86_64-linux-clang"
    assert chosen == {TOP / "sdk.yaml", lib, lib / "libQnnHtp.so", lib / "skel", lib / "cpu", TOP / "lib"}
    assert PurePosixPath("outside.txt") not in chosen  # not below the SDK folder
    targets = {lib / "skel": "../hexagon-v73/unsigned", lib / "cpu": "../aarch64-android/via"}
    # A link on the way whose target is not known yet is asked for first.
    first = with_link_targets(TREE, chosen, targets)
    assert TOP / "lib/aarch64-android/via" in first
    assert TOP / "lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so" in first  # a folder's members
    assert TOP / "lib/hexagon-v73/unsigned/libQnnHtpV73.cat" in first
    assert TOP / "lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so" not in first
    targets[TOP / "lib/aarch64-android/via"] = "libQnnCpu.so"
    second = with_link_targets(TREE, chosen | first, targets)
    assert second == {TOP / "lib/aarch64-android/libQnnCpu.so"}
    assert with_link_targets(TREE, chosen | first | second, targets) == set()
    assert unresolved_links(TREE, chosen | first | second, targets) == []
    cpu = TOP / "lib/aarch64-android/libQnnCpu.so"
    assert unresolved_links(TREE, chosen | first, targets) == \
        [(TOP / "lib/aarch64-android/via", cpu), (lib / "cpu", cpu)]


def test_links_that_leave_the_archive_add_nothing() -> None:
    lib = TOP / "lib/x86_64-linux-clang"
    chosen = choose(TREE.values(), TOP, ("host",))
    for target in ("/etc/passwd", "../../../../../x", "missing.so"):
        targets = {lib / "skel": target, lib / "cpu": target}
        assert with_link_targets(TREE, chosen, targets) == set()


def test_link_loops_end() -> None:
    tree = _members({"a": "link", "b": "link"})
    assert with_link_targets(tree, {PurePosixPath("a")}, {PurePosixPath("a"): "b", PurePosixPath("b"): "a"}) == \
        {PurePosixPath("b")}


def test_pin_components(tmp_path: Path) -> None:
    pin = tmp_path / ".qnn-version"
    pin.write_text(f"{VERSION}\n")
    assert read_pin_components(pin) is None
    pin.write_text(f"# the project's SDK\n{VERSION}\n\ncomponents = [\"host\", \"android\"]  # phones\n")
    assert read_pin_components(pin) == ("host", "android")
    pin.write_text(f"\ufeff{VERSION}\nhexagon-v75 android\n")
    assert read_pin_components(pin) == ("host", "android", "hexagon-v75")
    write_pin(tmp_path, "2.34")
    assert pin.read_text() == "2.34.0.250424\nhexagon-v75 android\n"
    pin.write_text(f"{VERSION}\nhost,radio\n")
    with pytest.raises(UsageError, match=r"\.qnn-version, line 2: radio is not a component"):
        read_pin_components(pin)


# -- ranges ---------------------------------------------------------------------------------------


def test_plan_merges_small_gaps_within_a_share() -> None:
    mib = 1 << 20
    # Two members 10 KB apart are read as one; a gap of 1 MiB is not.
    assert plan([(0, 4 * mib), (4 * mib + 10_000, 6 * mib), (7 * mib, 8 * mib)], piece=64 * mib) == \
        [(0, 6 * mib), (7 * mib, 8 * mib)]
    # Gaps read stay within 2% of the bytes wanted, smallest first.
    ranges = [(i * 110_000, i * 110_000 + 100_000) for i in range(20)]  # 2 MB wanted, 19 gaps of 10 KB
    joined = plan(ranges, piece=64 * mib)
    gaps_read = sum(b[0] - a[1] for a, b in itertools.pairwise(ranges)) - \
        sum(b[0] - a[1] for a, b in itertools.pairwise(joined))
    assert 0 < gaps_read <= 0.02 * 2_000_000
    # Long ranges are cut into pieces of about equal size, overlaps joined.
    assert plan([(0, 20), (10, 30)], piece=10) == [(0, 10), (10, 20), (20, 30)]
    assert plan([(0, 25)], piece=10) == [(0, 9), (9, 18), (18, 25)]
    assert plan([]) == []


def test_sparse_file_ranges_and_record(tmp_path: Path) -> None:
    tmp_path = tmp_path / "downloads"
    remote = Remote("http://u:p@h/v.zip", "http://***@h/v.zip", 1000, '"e1"', None)
    sparse = SparseFile.open(tmp_path, "v.zip", remote, 990, b"0123456789")
    assert stat.S_IMODE(sparse.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(sparse.record.stat().st_mode) == 0o600
    assert sparse.path.stat().st_size == 1000
    sparse.write(100, b"x" * 50)
    sparse.write(150, b"y" * 50)  # adjacent: one range
    sparse.write(300, b"z" * 10)
    assert sparse.held() == [(100, 200), (300, 310), (990, 1000)]
    assert sparse.covers(120, 200)
    assert not sparse.covers(120, 201)
    assert sparse.missing([(0, 1000)]) == [(0, 100), (200, 300), (310, 990)]
    sparse.write(190, b"w" * 120)  # joins two ranges
    assert sparse.held() == [(100, 310), (990, 1000)]
    sparse.save()
    record = json.loads(sparse.record.read_text())
    assert record["url"] == "http://***@h/v.zip"
    assert record["held"] == [[100, 310], [990, 1000]]
    assert "u:p" not in sparse.record.read_text()
    sparse.close()
    again = SparseFile.open(tmp_path, "v.zip", remote, 990, b"0123456789")
    assert again.held() == [(100, 310), (990, 1000)]
    assert again.read_at(150, 3) == b"yyy"
    again.close()
    # Another ETag, or other last bytes: started afresh.
    assert _read_record(again.record, dataclasses.replace(remote, etag='"e2"')) == []
    assert _read_record(again.record, dataclasses.replace(remote, size=1001)) == []
    fresh = SparseFile.open(tmp_path, "v.zip", remote, 990, b"9876543210")
    assert fresh.held() == [(990, 1000)]
    fresh.remove()
    assert list(tmp_path.iterdir()) == []


def test_threads_writing_at_once_keep_one_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several requests write their parts at once, and each may update the record: they share
    its temporary file, so one writes it at a time."""
    import threading

    import qnnctl.net.sparse

    monkeypatch.setattr(qnnctl.net.sparse, "SAVE_EVERY", 1)  # every write saves the record
    remote = Remote("http://h/v.zip", "http://h/v.zip", 1 << 20, None, None)
    sparse = SparseFile.open(tmp_path, "v.zip", remote, (1 << 20) - 10, b"0" * 10)
    failures: list[BaseException] = []

    def write(base: int) -> None:
        try:
            for i in range(50):
                sparse.write(base + i * 100, b"x" * 100)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(n * 10_000,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    sparse.save()
    held = json.loads(sparse.record.read_text())["held"]
    assert sum(end - start for start, end in held) == 8 * 5000 + 10
    sparse.close()


@pytest.mark.parametrize("held", [[[5, 3]], [[0, 2000]], [[0, 10], [5, 20]], "x", [[0, "1"]]])
def test_a_record_that_makes_no_sense_is_not_used(tmp_path: Path, held: object) -> None:
    remote = Remote("http://h/v.zip", "http://h/v.zip", 1000, None, None)
    record = tmp_path / "v.zip.sparse.json"
    record.write_text(json.dumps({"schema": 1, "url": remote.shown, "size": 1000, "etag": None,
                                  "last_modified": None, "held": held}))
    assert _read_record(record, remote) == []


# -- the end of a zip -------------------------------------------------------------------------------


def _zip(comment: bytes = b"") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("a.txt", b"a" * 100)
        zf.writestr("b.txt", b"b" * 200)
        zf.comment = comment
    return out.getvalue()


def test_end_records() -> None:
    data = _zip()
    records = end_records(data[-100:], len(data))
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
    assert records.cd_start == infos[-1].header_offset + 30 + 5 + 200
    assert records.entries == 2
    assert not records.zip64
    spans = extents(infos, records.cd_start)
    assert [(e.start, e.end) for e in spans.values()] == [(0, infos[1].header_offset),
                                                          (infos[1].header_offset, records.cd_start)]
    commented = _zip(b"c" * 3000)
    with pytest.raises(NeedMore) as more:
        end_records(commented[-1000:], len(commented))
    assert more.value.size == len(commented)  # smaller than the most the end can take
    assert end_records(commented, len(commented)).entries == 2
    with pytest.raises(IntegrityError, match="no end of central directory record"):
        end_records(b"\0" * 1000, 1000)


def test_a_central_directory_bigger_than_any_sdks_is_refused_from_the_end_records() -> None:
    """Its size is read from the end record before a byte of it is fetched: past MAX_DIRECTORY, no
    SDK's archive is that, and an install by parts would fetch it all and hold it in memory."""
    def tail(cd_size: int) -> tuple[bytes, int]:
        # An end record, with no comment, saying the directory fills the archive before it.
        return struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, cd_size, 0, 0), cd_size + 22

    records = end_records(*tail(MAX_DIRECTORY))
    assert (records.cd_start, records.entries) == (0, 1)
    with pytest.raises(IntegrityError) as refused:
        end_records(*tail(MAX_DIRECTORY + 1))
    assert refused.value.message == (f"unsafe archive: its central directory of {MAX_DIRECTORY + 1} bytes is larger "
                                     f"than any SDK's (at most {MAX_DIRECTORY})")


def test_extents_refuse_overlaps() -> None:
    data = _zip()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
    records = end_records(data, len(data))
    infos[1].header_offset = 50
    with pytest.raises(IntegrityError, match="overlaps the next member"):
        extents(infos, records.cd_start)


# -- the loopback server ------------------------------------------------------------------------------


def test_server_range_parsing() -> None:
    assert parse_ranges("bytes=0-9", 100) == [(0, 10)]
    assert parse_ranges("bytes=90-", 100) == [(90, 100)]
    assert parse_ranges("bytes=-10", 100) == [(90, 100)]
    assert parse_ranges("bytes=-1000", 100) == [(0, 100)]
    assert parse_ranges("bytes=0-1,5-6, 98-200", 100) == [(0, 2), (5, 7), (98, 100)]
    assert parse_ranges("bytes=100-", 100) == []
    assert parse_ranges("bytes=5-1", 100) is None
    assert parse_ranges("items=0-1", 100) is None


def test_server_serves_ranges(server: FaultServer) -> None:
    data = bytes(range(256)) * 4
    url = server.add("/f", data)

    def get(headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), b""

    status, headers, body = get({"Range": "bytes=10-19"})
    assert (status, headers["Content-Range"], body) == (206, "bytes 10-19/1024", data[10:20])
    status, headers, body = get({"Range": "bytes=-4"})
    assert (status, body) == (206, data[-4:])
    status, headers, body = get({"Range": "bytes=0-1,100-101"})
    assert status == 206
    assert headers["Content-Type"].startswith("multipart/byteranges; boundary=")
    assert b"Content-Range: bytes 0-1/1024\r\n\r\n" + data[0:2] in body
    assert b"Content-Range: bytes 100-101/1024\r\n\r\n" + data[100:102] in body
    status, headers, _ = get({"Range": "bytes=2000-"})
    assert (status, headers["Content-Range"]) == (416, "bytes */1024")
    server.ignore_ranges = True
    status, _, body = get({"Range": "bytes=10-19"})
    assert (status, body) == (200, data)
    served = server.served_for("/f")
    assert [(s.status, s.ranges) for s in served] == \
        [(206, ((10, 20),)), (206, ((1020, 1024),)), (206, ((0, 2), (100, 102))), (416, ()), (200, ((0, 1024),))]
    assert served[2].sent > 4
    assert server.bytes_served("/f") == sum(s.sent for s in served) == 10 + 4 + served[2].sent + 1024


def test_struct_layout_of_a_zip64_end() -> None:
    """The records zipindex reads for zip64 are those zipfile writes (APPNOTE 4.3.14, 4.3.15)."""
    saved = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    setattr(zipfile, "ZIP64_LIMIT", 1 << 8)
    setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)
    try:
        data = _zip()
    finally:
        setattr(zipfile, "ZIP64_LIMIT", saved[0])
        setattr(zipfile, "ZIP_FILECOUNT_LIMIT", saved[1])
    records = end_records(data[-200:], len(data))
    assert records.zip64
    assert records.entries == 2
    locator = data.rfind(b"PK\x06\x07")
    assert records.tail_start == locator - 56
    assert struct.unpack_from("<Q", data, locator + 8)[0] == records.tail_start


# -- one reading of a zip: its end records, its members' ranges, their local headers ---------------


def _records_of(data: bytes) -> zipindex.EndRecords:
    return end_records(data, len(data))


def _refused_as(what: str) -> Any:
    return pytest.raises(IntegrityError, match=f"^{re.escape('unsafe archive: ' + what)}$")


def test_the_end_records_of_a_zip_are_read_from_its_tail() -> None:
    data = _zip()
    expected = zipindex.EndRecords(cd_start=370, cd_size=102, entries=2, tail_start=472, zip64=False)
    assert len(data) == 494
    assert end_records(data, len(data)) == expected
    assert end_records(data[-22:], len(data)) == expected
    commented = _zip(b"c" * 3000)
    assert end_records(commented[-3022:], len(commented)) == expected
    with pytest.raises(NeedMore) as more:
        end_records(commented[-3021:], len(commented))
    assert more.value.size == len(commented)
    # A comment that ends in two zero bytes is read as a comment, not as a record without one.
    zeros = _zip(b"PK\x05\x06" + b"\0" * 18)
    with _refused_as("494 bytes before its first member, or between its central directory and its end records"):
        end_records(zeros, len(zeros))  # the record in the comment, which is the last: no directory before it
    assert end_records(_zip(b"\0\0"), 496) == expected


def test_a_tail_without_an_end_record_asks_for_the_most_an_end_can_take() -> None:
    size = zipindex.MAX_TAIL + 1000
    assert zipindex.MAX_TAIL == 0xFFFF + 22 + 20 + 56
    with pytest.raises(NeedMore) as more:
        end_records(b"\0" * 1000, size)
    assert more.value.size == zipindex.MAX_TAIL
    with pytest.raises(NeedMore) as more:
        end_records(b"\0" * (zipindex.MAX_TAIL - 1), size)
    assert more.value.size == zipindex.MAX_TAIL
    with _refused_as("no end of central directory record: not a zip archive, or cut short") as refused:
        end_records(b"\0" * zipindex.MAX_TAIL, size)
    assert refused.value.hint == "the archive was not installed; get it from a trusted source"
    with _refused_as("no end of central directory record: not a zip archive, or cut short"):
        end_records(b"PK\x05\x06" + b"\0" * 10, 14)  # a signature with no room for its record


def test_a_second_end_record_in_the_comment_is_refused() -> None:
    for comment in (b"PK\x05\x06", b"xxPK\x05\x06" + b"\0" * 20, b"PK\x05\x06" + b"\0" * 17):
        data = _zip(comment)
        with _refused_as("more than one end of central directory record (one inside the comment of another)"):
            end_records(data, len(data))


@pytest.mark.parametrize("field", [4, 6])
def test_a_spanned_zip_is_refused(field: int) -> None:
    data = bytearray(_zip())
    struct.pack_into("<H", data, 472 + field, 1)
    with _refused_as("a multi-part (spanned) archive"):
        end_records(bytes(data), len(data))


def test_a_directory_that_does_not_end_at_the_end_records_is_refused() -> None:
    with _refused_as("4 bytes before its first member, or between its central directory and its end records"):
        end_records(b"stub" + _zip(), 498)
    data = bytearray(_zip())
    struct.pack_into("<L", data, 472 + 16, 371)  # the directory said to start a byte later
    with _refused_as("its central directory (102 bytes at 371) does not fit before its end records (at 472)"):
        end_records(bytes(data), len(data))
    struct.pack_into("<LL", data, 472 + 12, 473, 0)  # a directory longer than what precedes the record
    with _refused_as("its central directory (473 bytes at 0) does not fit before its end records (at 472)"):
        end_records(bytes(data), len(data))
    struct.pack_into("<LL", data, 472 + 12, 472, 0)  # the whole file before the record: no member
    assert end_records(bytes(data), len(data)) == zipindex.EndRecords(0, 472, 2, 472, False)


def _zip64() -> bytes:
    saved = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    setattr(zipfile, "ZIP64_LIMIT", 1 << 8)
    setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)
    try:
        return _zip()
    finally:
        setattr(zipfile, "ZIP64_LIMIT", saved[0])
        setattr(zipfile, "ZIP_FILECOUNT_LIMIT", saved[1])


def test_the_zip64_end_records() -> None:
    data = _zip64()
    locator = data.rfind(b"PK\x06\x07")
    record = locator - 56
    (cd_size, cd_offset) = struct.unpack_from("<2Q", data, record + 40)
    expected = zipindex.EndRecords(cd_offset, cd_size, 2, record, True)
    assert cd_offset + cd_size == record
    assert end_records(data, len(data)) == expected
    # What the zip64 record says counts, not the end record's fields (all ones when they overflow).
    overflowed = bytearray(data)
    struct.pack_into("<2H2L", overflowed, len(data) - 22 + 8, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    assert end_records(bytes(overflowed), len(data)) == expected
    assert end_records(data[record:], len(data)) == expected
    with pytest.raises(NeedMore) as more:
        end_records(data[record + 1:], len(data))
    assert more.value.size == len(data) - record
    with pytest.raises(NeedMore) as more:
        end_records(data[locator:], len(data))
    assert more.value.size == len(data) - record
    with _refused_as("a zip64 locator with no zip64 record before it"):
        end_records(data[record + 1:], len(data) - record - 1)
    moved = bytearray(data)
    moved[record:record + 4] = b"PK\x06\x05"
    with _refused_as("a zip64 locator whose record is not where it should be"):
        end_records(bytes(moved), len(moved))
    for field in (16, 20):
        spanned = bytearray(data)
        struct.pack_into("<L", spanned, record + field, 1)
        with _refused_as("a multi-part (spanned) archive"):
            end_records(bytes(spanned), len(spanned))


def _info(name: str, offset: int, size: int, flags: int = 0) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.header_offset, info.compress_size, info.flag_bits = offset, size, flags
    return info


def test_each_member_runs_to_the_next() -> None:
    first, second = _info("a", 0, 10), _info("bé", 100_000, 5, flags=0x800)
    found = extents([second, first], 150_000)
    assert list(found) == ["0:a", "100000:bé"]
    # At most an extra field and a data descriptor past its header, name and data.
    assert found["0:a"] == zipindex.Extent(first, 0, 41 + 0xFFFF + 24, 100_000)
    assert found["100000:bé"] == zipindex.Extent(second, 100_000, 150_000, 150_000)
    assert found["0:a"].size == 41 + 0xFFFF + 24
    assert zipindex.extent_of(found, second).size == 50_000
    assert extents([second, first], 200_000)["100000:bé"].end == 100_000 + 38 + 0xFFFF + 24
    exact = extents([_info("a", 0, 10), _info("b", 41, 0)], 72)
    assert [(e.start, e.end, e.limit) for e in exact.values()] == [(0, 41, 41), (41, 72, 72)]
    assert extents([], 0) == {}


def test_a_member_name_is_read_as_the_archive_stores_it() -> None:
    assert zipindex.raw_name(_info("bé", 0, 0, flags=0x800)) == "bé".encode()
    assert zipindex.raw_name(_info("bé", 0, 0)) == "bé".encode("cp437")


def test_members_that_do_not_tile_the_archive_are_refused() -> None:
    with _refused_as("3 bytes before its first member, 'a'"):
        extents([_info("b", 50, 1), _info("a", 3, 1)], 100)
    with _refused_as("7 bytes before its central directory, and no member"):
        extents([], 7)
    with _refused_as("'a' is in it twice"):
        extents([_info("a", 0, 1), _info("a", 40, 1)], 100)
    with _refused_as("'a' (11 bytes at 0) overlaps the next member (at 41)"):
        extents([_info("a", 0, 11), _info("b", 41, 0)], 100)
    with _refused_as("'b' (1 bytes at 41) runs past the start of the central directory (at 72)"):
        extents([_info("a", 0, 10), _info("b", 41, 1)], 72)


def _one_member(data: bytes = b"a" * 100, flags: int = 0, method: int = zipfile.ZIP_STORED,
                descriptor: bytes = b"", local_sizes: tuple[int, int] | None = None, extra: bytes = b"",
                ) -> tuple[bytes, zipindex.Extent]:
    """A zip of one member `a.txt` written by hand, and its extent; `local_sizes` (compressed,
    uncompressed) and `extra` go into its local header only."""
    crc = zlib.crc32(data)
    sizes = (0, 0, 0) if flags & 0x08 else (crc, *(local_sizes or (len(data), len(data))))
    local = (struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, flags, method, 0, 0, *sizes, 5, len(extra)) + b"a.txt"
             + extra + data + descriptor)
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, flags, method, 0, 0, crc, len(data), len(data),
                          5, 0, 0, 0, 0, 0, 0) + b"a.txt"
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central), len(local), 0)
    archive = local + central + end
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        infos = zf.infolist()
    return archive, extents(infos, len(local))["0:a.txt"]


def _check(archive: bytes, extent: zipindex.Extent) -> None:
    zipindex.check_local_header(lambda offset, size: archive[offset:offset + size], extent)


def _disagreement(what: str) -> Any:
    return _refused_as(f"'a.txt' has a local header that disagrees with the central directory: {what}")


def test_a_local_header_that_says_what_the_directory_says_passes() -> None:
    _check(*_one_member())
    for size in (12, 16, 20, 24):
        _check(*_one_member(flags=0x08, descriptor=b"d" * size))


def test_a_local_header_must_name_its_member_by_its_bytes() -> None:
    archive, extent = _one_member()
    for other in (b"b.txt", b"a.TXT", b"a.tx"):
        changed = archive[:30] + other.ljust(5, b"_") + archive[35:]
        with _disagreement(f"its local header names it {other.ljust(5, b'_')!r}"):
            _check(changed, extent)


def test_a_local_header_that_disagrees_is_refused() -> None:
    archive, extent = _one_member()

    def local(offset: int, fmt: str, *values: int | bytes) -> bytes:
        changed = bytearray(archive)
        struct.pack_into(fmt, changed, offset, *values)
        return bytes(changed)

    with _disagreement("no local header where the directory says it starts"):
        _check(local(0, "<4s", b"PK\x01\x02"), extent)
    with _disagreement("compression method 8, not 0"):
        _check(local(8, "<H", 8), extent)
    for flags in (0x01, 0x20, 0x21):
        with _disagreement("it is encrypted or patched data"):
            _check(local(6, "<H", flags), extent)
    with _disagreement("one of them says the sizes follow the data, the other not"):
        _check(local(6, "<H", 0x08), extent)
    with _disagreement("flags 0x0802, not 0x0000"):
        _check(local(6, "<H", 0x802), extent)
    # The UTF-8 flag alone: another reader decodes the name another way (cp437 or UTF-8).
    with _disagreement("flags 0x0800, not 0x0000"):
        _check(local(6, "<H", 0x800), extent)
    with _disagreement("CRC-32 00000000, 100 bytes compressed, 100 bytes, where the directory has "
                       f"{zlib.crc32(b'a' * 100):08x}, 100 and 100"):
        _check(local(14, "<L", 0), extent)
    with _disagreement(f"CRC-32 {zlib.crc32(b'a' * 100):08x}, 99 bytes compressed, 100 bytes, where the "
                       f"directory has {zlib.crc32(b'a' * 100):08x}, 100 and 100"):
        _check(local(18, "<L", 99), extent)
    with _disagreement(f"CRC-32 {zlib.crc32(b'a' * 100):08x}, 100 bytes compressed, 101 bytes, where the "
                       f"directory has {zlib.crc32(b'a' * 100):08x}, 100 and 100"):
        _check(local(22, "<L", 101), extent)
    with _disagreement("its data (100 bytes from 36) runs past its range (to 135)"):
        _check(local(28, "<H", 1), extent)  # an extra field the data would follow


def test_bytes_between_members_are_refused() -> None:
    archive, extent = _one_member(descriptor=b"x")
    with _refused_as("'a.txt' is followed by 1 bytes that are none of its own (before the next member at 136)"):
        _check(archive, extent)
    for size in (4, 13, 28):
        archive, extent = _one_member(flags=0x08, descriptor=b"d" * size)
        with _refused_as(f"'a.txt' is followed by {size} bytes that are none of its own (before the next member "
                         f"at {135 + size})"):
            _check(archive, extent)


def _zip64_extra(*sizes: int) -> bytes:
    """A zip64 extended information extra field (APPNOTE 4.5.3): its sizes, uncompressed first."""
    return struct.pack(f"<HH{len(sizes)}Q", 0x0001, 8 * len(sizes), *sizes)


def test_zip64_sizes_in_a_local_header() -> None:
    """A local header whose sizes are 0xFFFFFFFF holds them in its zip64 extra field. The header
    is built here byte by byte: Python's zipfile writes one way or the other by release (3.11.2
    writes the real sizes with force_zip64, 3.11.7 writes 0xFFFFFFFF)."""
    full, crc = 0xFFFFFFFF, zlib.crc32(b"a" * 100)
    archive, extent = _one_member(local_sizes=(full, full), extra=_zip64_extra(100, 100))
    assert struct.unpack_from("<2L", archive, 18) == (full, full)
    _check(archive, extent)
    for wrong in ((99, 100), (100, 101)):  # the compressed size, then the size, as the extra field holds them
        archive, extent = _one_member(local_sizes=(full, full), extra=_zip64_extra(wrong[1], wrong[0]))
        with _disagreement(f"CRC-32 {crc:08x}, {wrong[0]} bytes compressed, {wrong[1]} bytes, where the "
                           f"directory has {crc:08x}, 100 and 100"):
            _check(archive, extent)
    # One size in the extra field, the other in the header itself.
    _check(*_one_member(local_sizes=(100, full), extra=_zip64_extra(100)))
    archive, extent = _one_member(local_sizes=(full, 100), extra=_zip64_extra(98))
    with _disagreement(f"CRC-32 {crc:08x}, 98 bytes compressed, 100 bytes, where the directory has {crc:08x}, "
                       "100 and 100"):
        _check(archive, extent)
    # Without the extra field, 0xFFFFFFFF is taken at its word, and disagrees.
    archive, extent = _one_member(local_sizes=(full, full))
    with _disagreement(f"CRC-32 {crc:08x}, {full} bytes compressed, {full} bytes, where the directory has "
                       f"{crc:08x}, 100 and 100"):
        _check(archive, extent)


def test_the_sizes_a_zip64_extra_field_holds() -> None:
    def field(kind: int, *values: int, pad: bytes = b"") -> bytes:
        body = struct.pack(f"<{len(values)}Q", *values) + pad
        return struct.pack("<HH", kind, len(body)) + body

    full = 0xFFFFFFFF
    assert zipindex.zip64_sizes(field(1, 7, 8), full, full) == (7, 8)
    assert zipindex.zip64_sizes(field(0x5455, 1, pad=b"t") + field(1, 7, 8), full, full) == (7, 8)
    assert zipindex.zip64_sizes(field(1, 7), full, 3) == (7, 3)
    assert zipindex.zip64_sizes(field(1, 8), 2, full) == (2, 8)
    assert zipindex.zip64_sizes(field(1, 7, 8, pad=b"xyz"), full, full) == (7, 8)
    assert zipindex.zip64_sizes(field(1, 7, 8) + field(1, 1, 2), full, full) == (7, 8)  # the first counts
    assert zipindex.zip64_sizes(field(0x5455, 1) + b"\1\0", full, full) == (full, full)  # none: as they are
    assert zipindex.zip64_sizes(b"", 2, 3) == (2, 3)
    with _refused_as("an extra field of 16 bytes where 8 are left"):
        zipindex.zip64_sizes(field(1, 7, 8)[:12], full, full)
    for usize, csize, values in ((full, full, (7,)), (full, 3, ()), (2, full, ())):
        with _refused_as("a zip64 extra field shorter than the sizes it stands for"):
            zipindex.zip64_sizes(field(1, *values, pad=b"1234567"), usize, csize)


@pytest.mark.parametrize(("name", "system", "mode", "kind"), [
    ("a/", 3, 0o40755, "dir"), ("a/", 0, 0, "dir"), ("a", 3, 0o40755, "dir"), ("a", 3, 0o120777, "link"),
    ("a", 3, 0o100644, "file"), ("a", 3, 0, "file"), ("a", 3, 0o10644, "special"), ("a", 3, 0o20644, "special"),
    ("a", 0, 0o120777, "file"), ("a", 0, 0o10644, "file")])
def test_the_kind_of_a_member(name: str, system: int, mode: int, kind: str) -> None:
    info = zipfile.ZipInfo(name)
    info.create_system, info.external_attr = system, mode << 16
    assert zipindex.member_kind(info) == kind


def test_the_digest_of_a_central_directory() -> None:
    data = _zip()
    records = _records_of(data)
    assert zipindex.central_directory_sha256(lambda offset, size: data[offset:offset + size], records) == \
        hashlib.sha256(data[370:472]).hexdigest()
    # Read a byte at a time, as a reader that gives less than asked would.
    assert zipindex.central_directory_sha256(lambda offset, size: data[offset:offset + 1], records) == \
        hashlib.sha256(data[370:472]).hexdigest()
    big = zipindex.EndRecords(0, (1 << 20) + 10, 0, (1 << 20) + 10, False)
    blob = bytes(range(256)) * 4097
    assert zipindex.central_directory_sha256(lambda offset, size: blob[offset:offset + size], big) == \
        hashlib.sha256(blob[:(1 << 20) + 10]).hexdigest()



def test_the_digest_of_a_central_directory_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "sdk.zip"
    path.write_bytes(_zip())
    assert zipindex.file_directory_sha256(path) == hashlib.sha256(_zip()[370:472]).hexdigest()


def test_a_zip_on_disk_read_one_way(tmp_path: Path) -> None:
    path = tmp_path / "sdk.zip"
    path.write_bytes(_zip(b"c" * 20_000))  # its end past the first 16 KiB read
    assert zipindex.file_end_records(path) == zipindex.EndRecords(370, 102, 2, 472, False)
    assert zipindex.check_zip_file(path) == zipindex.EndRecords(370, 102, 2, 472, False)
    assert zipindex.read_file_at(path)(370, 4) == b"PK\x01\x02"
    with _refused_as("it is cut short at 20494"):
        zipindex.read_file_at(path)(20490, 5)
    path.write_bytes(b"not a zip" * 100)
    with pytest.raises(IntegrityError) as refused:
        zipindex.check_zip_file(path)
    assert refused.value.message == ("sdk.zip is corrupt or truncated: no end of central directory record: not a "
                                     "zip archive, or cut short")
    assert refused.value.hint == "nothing was installed; download the archive again"


def test_a_zip_on_disk_whose_members_disagree_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sdk.zip"
    archive, _ = _one_member()
    path.write_bytes(archive[:30] + b"b.txt" + archive[35:])
    with _disagreement("its local header names it b'b.txt'"):
        zipindex.check_zip_file(path)
    path.write_bytes(_one_member(descriptor=b"x")[0])
    with _refused_as("'a.txt' is followed by 1 bytes that are none of its own (before the next member at 136)"):
        zipindex.check_zip_file(path)


def test_what_zipfile_cannot_read_is_an_unsafe_archive(tmp_path: Path) -> None:
    path = tmp_path / "sdk.zip"
    archive, _ = _one_member()
    named = archive.replace(b"a.txt", b"\xff.txt")
    flagged = bytearray(named)
    struct.pack_into("<H", flagged, 6, 0x800)
    struct.pack_into("<H", flagged, 135 + 8, 0x800)
    path.write_bytes(bytes(flagged))
    with _refused_as("a member's name is flagged as UTF-8 but is not: b'\\xff.txt'"):
        zipindex.open_zip(path)
    path.write_bytes(_zip()[:370] + b"PK\x01\x03" + _zip()[374:])
    with _refused_as("its central directory cannot be read: Bad magic number for central directory"):
        zipindex.open_zip(path)


def test_zipfile_must_read_the_directory_the_end_records_point_to() -> None:
    data = _zip()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zipindex.same_reading(zf, _records_of(data)) == zf.infolist()
        with _refused_as("two readings: its end records point to 3 members at 370, zipfile reads 2 at 370"):
            zipindex.same_reading(zf, _records_of(data)._replace(entries=3))
        with _refused_as("two readings: its end records point to 2 members at 369, zipfile reads 2 at 370"):
            zipindex.same_reading(zf, _records_of(data)._replace(cd_start=369))


# -- the component names, and what an install holds ------------------------------------------------


KNOWN = "host, android, hexagon-vNN (one per DSP generation, e.g. hexagon-v75), docs, all"


def test_component_names_as_given() -> None:
    assert parse_components(["docs", "Android\thexagon-v68"]) == ("host", "android", "hexagon-v68", "docs")
    assert parse_components("host") == ("host",)
    assert parse_components("docs all") == ("all",)
    assert parse_components(["all"]) == ("all",)
    with pytest.raises(UsageError) as refused:
        parse_components([" ,", ""], where=".qnn-version, line 2")
    assert (refused.value.message, refused.value.hint) == (".qnn-version, line 2 names no component",
                                                           f"give some of: {KNOWN}")
    assert refused.value.exit_code == 2


def test_names_that_are_no_component_are_refused_with_a_guess() -> None:
    def refusal(spec: str) -> tuple[str, str | None]:
        with pytest.raises(UsageError) as refused:
            parse_components(spec)
        return refused.value.message, refused.value.hint

    assert refusal("host,andriod") == ("--components: andriod is not a component",
                                       f"did you mean android? the components are {KNOWN}")
    assert refusal("radio,hexagon75,hvx-v69,andriod,andrid") == (
        "--components: andrid, andriod, hexagon75, hvx-v69, radio are not components",
        f"did you mean android, hexagon-v75, hexagon-v69? the components are {KNOWN}")
    assert refusal("radio") == ("--components: radio is not a component", f"the components are {KNOWN}")
    assert refusal("h_v073") == ("--components: h_v073 is not a component",
                                 f"did you mean hexagon-v73? the components are {KNOWN}")
    assert refusal("dcos") == ("--components: dcos is not a component",
                               f"did you mean docs? the components are {KNOWN}")
    assert refusal("hots") == ("--components: hots is not a component",
                               f"did you mean host? the components are {KNOWN}")


def test_components_in_the_order_people_read_them() -> None:
    assert canonical([]) == ()
    assert canonical(["other", "docs", "hexagon-v100", "hexagon-v68", "android", "host", "android", "zz", "aa"]) == \
        ("host", "android", "hexagon-v68", "hexagon-v100", "docs", "aa", "other", "zz")
    assert canonical(["hexagon-vx", "hexagon-v", "docs", "hexagon-v7"]) == \
        ("hexagon-v7", "docs", "hexagon-v", "hexagon-vx")
    assert canonical(["host", "all", "docs"]) == ("all",)


def test_what_an_sdk_lacks_of_what_is_wanted() -> None:
    assert covers(("host",), ())
    assert covers(("all",), ("all",))
    assert not covers(("host",), ("all",))
    assert covers(("host", "android", "docs"), ["docs", "host"])
    assert missing(("all",), ("all", "docs")) == ()
    assert missing(("host", "docs"), ("docs", "host")) == ()
    assert missing(("host", "docs"), ("docs", "all")) == ("all",)
    assert missing(("host",), ["docs", "hexagon-v73", "docs"]) == ("hexagon-v73", "docs")


@pytest.mark.parametrize(("manifest", "held"), [
    (None, ("all",)), ({}, ("all",)), ({"components": []}, ("all",)), ({"components": "host"}, ("all",)),
    ({"components": ["host", 1]}, ("all",)), ({"components": None}, ("all",)),
    ({"components": ["docs", "host"]}, ("host", "docs")), ({"components": ["all", "host"]}, ("all",))])
def test_the_components_an_sdk_holds_by_its_manifest(manifest: dict[str, object] | None,
                                                      held: tuple[str, ...]) -> None:
    assert installed_components(manifest) == held


def test_the_command_that_adds_components() -> None:
    assert install_command(VERSION, ["docs", "android", "host"]) == \
        f"qnnctl install {VERSION} --components host,android,docs"


def test_completion_of_component_names() -> None:
    everything = ["host", "android", "hexagon-v68", "hexagon-v69", "hexagon-v73", "hexagon-v75", "hexagon-v79",
                  "docs", "all"]
    assert complete(None, None, "") == everything
    assert complete(None, None, "a") == ["android", "all"]
    assert complete(None, None, "host,") == ["host," + name for name in everything if name != "host"]
    assert complete(None, None, "host,android,hexagon-v7") == [
        "host,android,hexagon-v73", "host,android,hexagon-v75", "host,android,hexagon-v79"]
    assert complete(None, None, "docs,h") == ["docs,host", "docs,hexagon-v68", "docs,hexagon-v69",
                                              "docs,hexagon-v73", "docs,hexagon-v75", "docs,hexagon-v79"]
    assert complete(None, None, "x") == []


# -- the members of a component, and its digest ----------------------------------------------------


def test_the_path_rules_read_whole_path_pieces() -> None:
    assert component_of("NOTICE.txt") == "host"
    assert component_of("bin/envsetup.sh") == "host"
    assert component_of("bin/aarch64-oe-linux-gcc11.2/qnn-net-run") is None  # not bin/*
    assert component_of("lib/libQnnHtp.so") is None  # lib/* is no rule
    assert component_of("lib/hexagon-v08/unsigned/libQnnHtpV8Skel.so") == "hexagon-v08"
    assert component_of("lib/hexagon-vx/unsigned/a.so") is None
    assert component_of("lib/hexagon-v73") is None  # a file of that name: not below the folder
    assert component_of("lib/hexagon-v73", is_dir=True) == "hexagon-v73"
    assert component_of("docsx/a.html") is None
    assert component_of("include", is_dir=True) == "host"


def test_members_of_an_sdk_at_the_archive_root() -> None:
    root = PurePosixPath()
    tree = _members({"sdk.yaml": "file", "docs": "dir", "docs/a.html": "file", "lib": "dir",
                     "lib/aarch64-android": "dir", "lib/aarch64-android/libQnnHtp.so": "file",
                     "benchmarks/b.py": "file"})
    assert available(tree.values(), root) == ("host", "android", "docs")
    assert choose(tree.values(), root, ("docs",)) == {PurePosixPath("docs"), PurePosixPath("docs/a.html")}
    assert choose(tree.values(), root, ("all",)) == set(tree)
    assert available([Member(PurePosixPath("lib/aarch64-android"), "dir")], root) == ("android",)
    assert available([Member(PurePosixPath("lib/aarch64-android"), "file")], root) == ()


def test_members_outside_the_sdk_folder_are_chosen_by_no_component() -> None:
    members = [Member(TOP, "dir"), Member(PurePosixPath("qairt"), "dir"), Member(PurePosixPath("qairt/x"), "file"),
               Member(PurePosixPath("qairt/2.37.0.250724x/sdk.yaml"), "file"), Member(TOP / "sdk.yaml", "file"),
               Member(TOP / "benchmarks/b.py", "file"), Member(TOP / "benchmarks", "dir")]
    assert choose(members, TOP, ("all",)) == {TOP / "sdk.yaml", TOP / "benchmarks/b.py", TOP / "benchmarks"}
    assert choose(members, TOP, ("host",)) == {TOP / "sdk.yaml"}
    assert available(members, TOP) == ("host",)


def test_the_folders_above_a_chosen_member_are_chosen_with_it() -> None:
    deep = TOP / "lib/hexagon-v75/unsigned/a/b.so"
    members = [Member(TOP / "lib", "dir"), Member(TOP / "lib/hexagon-v75", "dir"),
               Member(TOP / "lib/hexagon-v75/unsigned/a", "dir"), Member(deep, "file"),
               Member(TOP / "lib/hexagon-v75/unsigned/c.so", "file"), Member(TOP / "lib/other", "dir")]
    assert choose(members, TOP, ("hexagon-v75",)) == {
        TOP / "lib", TOP / "lib/hexagon-v75", TOP / "lib/hexagon-v75/unsigned/a", deep,
        TOP / "lib/hexagon-v75/unsigned/c.so"}


def test_where_a_link_leads_among_the_members() -> None:
    tree = _members({"top": "dir", "top/lib": "dir", "top/lib/a.so": "file", "top/lib/b": "link", "top/lib/c": "link",
                     "top/bin": "dir", "top/bin/tool": "link", "top/bin/abs": "link", "top/bin/deep": "link"})
    lib, tool = PurePosixPath("top/lib"), PurePosixPath("top/bin/tool")
    targets = {tool: "./../lib//b", lib / "b": "c", lib / "c": "a.so", PurePosixPath("top/bin/abs"): "../lib/d",
               PurePosixPath("top/bin/deep"): "../../../x"}
    assert resolve_in(tree, tool, targets) == (lib / "a.so", [lib, lib / "b", lib / "c", lib / "a.so"])
    assert resolve_in(tree, PurePosixPath("top/bin/abs"), targets) == (lib / "d", [lib])  # d is no member
    assert resolve_in(tree, PurePosixPath("top/bin/deep"), targets) == (None, [])  # above the archive
    assert resolve_in(tree, PurePosixPath("top/lib/x"), targets) == (None, [PurePosixPath("top/lib/x")])
    assert resolve_in(tree, lib / "b", {lib / "b": "/etc/passwd"}) == (None, [])
    assert resolve_in(tree, lib / "b", {lib / "b": "c", lib / "c": "/usr/lib/a.so"}) == (None, [lib / "c"])
    assert resolve_in(tree, lib / "b", {lib / "b": "c"}) == (None, [lib / "c"])  # c's target not known yet
    assert resolve_in(tree, lib / "b", {lib / "b": "."}) == (lib, [])
    assert resolve_in(tree, lib / "b", {lib / "b": ""}) == (lib, [])


def test_a_chain_of_links_ends_after_forty_hops() -> None:
    names = [f"l{i}" for i in range(42)]
    tree = _members({**{name: "link" for name in names}, "end": "file"})
    chain = {PurePosixPath(a): b for a, b in zip(names, [*names[1:], "end"])}
    # l0 -> l1 -> ... -> l41 -> end: 41 links passed through from l0, one too many.
    assert resolve_in(tree, PurePosixPath("l0"), chain) == (None, [PurePosixPath(n) for n in names[1:]])
    assert resolve_in(tree, PurePosixPath("l1"), chain) == (
        PurePosixPath("end"), [PurePosixPath(n) for n in names[2:]] + [PurePosixPath("end")])


def test_a_link_to_a_folder_needs_what_the_folder_holds() -> None:
    tree = _members({"a": "link", "d": "dir", "d/x": "file", "d/e/y": "file", "f": "file", "g": "link",
                     "h/z": "file", "dx/w": "file"})
    targets = {PurePosixPath("a"): "d", PurePosixPath("g"): "h"}
    assert with_link_targets(tree, {PurePosixPath("a")}, targets) == {
        PurePosixPath("d"), PurePosixPath("d/x"), PurePosixPath("d/e/y")}
    assert with_link_targets(tree, {PurePosixPath("a"), PurePosixPath("d/x")}, targets) == {
        PurePosixPath("d"), PurePosixPath("d/e/y")}
    # A folder with no entry of its own, found by its members' names.
    assert with_link_targets(tree, {PurePosixPath("g"), PurePosixPath("f")}, targets) == {PurePosixPath("h/z")}
    assert with_link_targets(tree, {PurePosixPath("f")}, targets) == set()
    assert unresolved_links(tree, {PurePosixPath("a"), PurePosixPath("g")}, targets) == [
        (PurePosixPath("a"), PurePosixPath("d"))]


def test_the_component_of_an_archive_member_in_words() -> None:
    assert component_label(TOP / "lib/aarch64-android/libQnnHtp.so", TOP) == "android"
    assert component_label(TOP / "lib/hexagon-v75", TOP, is_dir=True) == "hexagon-v75"
    assert component_label(TOP / "benchmarks/b.py", TOP) == "all"
    assert component_label(PurePosixPath("qairt/sdk.yaml"), TOP) == "all"
    assert component_label(TOP, TOP, is_dir=True) == "all"
    assert component_label(PurePosixPath("sdk.yaml"), PurePosixPath()) == "host"


def _digest(*lines: str) -> str:
    return hashlib.sha256("\n".join(sorted(lines)).encode("utf-8", "surrogateescape")).hexdigest()


def test_a_component_digest_is_the_sha256_of_its_member_lines() -> None:
    assert member_line("lib/é.so", "file", True, "", 3, "ab") == '["lib/é.so", "file", 493, "", 3, "ab"]'
    assert member_line("a", "link", False, "b", 1, "") == '["a", "link", 420, "b", 1, ""]'
    lines = [("sdk.yaml", "y"), ("docs/b", "b2"), ("docs/a", "a1"), ("benchmarks/x", "x"), ("bad\udcff", "z\udcff")]
    assert component_digests(lines) == {"docs": _digest("a1", "b2"), "host": _digest("y", "z\udcff"),
                                        "other": _digest("x")}
    assert list(component_digests(lines)) == ["docs", "host", "other"]
    assert component_digests([]) == {}


def test_the_digests_of_an_sdk_folder(tmp_path: Path) -> None:
    root = tmp_path / "sdk"
    (root / "lib/aarch64-android").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "sdk.yaml").write_bytes(b"version: 1\n")
    tool = root / "lib/aarch64-android/qnn-net-run"
    tool.write_bytes(b"\x7fELF" * 300_000)  # past a block of the reads
    tool.chmod(0o750)
    (root / "lib/aarch64-android/libQnnHtp.so").symlink_to("qnn-net-run")
    (root / "lib/aarch64-android/dangling").symlink_to("é" * 3)
    (root / ".qnnctl.json").write_text("{}")
    sha = hashlib.sha256
    android = _digest(
        member_line("lib/aarch64-android/qnn-net-run", "file", True, "", 1_200_000, sha(tool.read_bytes()).hexdigest()),
        member_line("lib/aarch64-android/libQnnHtp.so", "link", False, "qnn-net-run", 11, ""),
        member_line("lib/aarch64-android/dangling", "link", False, "é" * 3, 6, ""))
    host = _digest(member_line("sdk.yaml", "file", False, "", 11, sha(b"version: 1\n").hexdigest()))
    assert tree_digests(root, skip={".qnnctl.json"}) == {"android": android, "host": host}
    assert tree_digests(root)["host"] == _digest(
        member_line(".qnnctl.json", "file", False, "", 2, sha(b"{}").hexdigest()),
        member_line("sdk.yaml", "file", False, "", 11, sha(b"version: 1\n").hexdigest()))
    # A sha256 just computed while writing is taken as it is; anything else is read.
    told = tree_digests(root, {"sdk.yaml": "f" * 64, "lib/aarch64-android/qnn-net-run": "short"},
                        skip={".qnnctl.json"})
    assert told == {"android": android,
                    "host": _digest(member_line("sdk.yaml", "file", False, "", 11, "f" * 64))}


def test_a_zip64_extra_field_that_holds_no_size_or_claims_more_than_it_has() -> None:
    full = 0xFFFFFFFF
    with _refused_as("a zip64 extra field shorter than the sizes it stands for"):
        zipindex.zip64_sizes(struct.pack("<HH", 1, 0), full, full)  # a header alone, of no length
    assert zipindex.zip64_sizes(struct.pack("<HH", 0x5455, 0), full, 3) == (full, 3)
    for kind in (1, 0x5455):
        with _refused_as("an extra field of 36864 bytes where 8 are left"):
            zipindex.zip64_sizes(struct.pack("<HH", kind, 0x9000) + b"\0" * 8, full, full)


def test_the_digest_of_a_central_directory_reads_only_the_directory() -> None:
    data = _zip()
    records = _records_of(data)
    read: list[tuple[int, int]] = []

    def read_at(offset: int, size: int) -> bytes:
        assert 370 <= offset <= offset + size <= 472, (offset, size)  # within the directory
        read.append((offset, size))
        return data[offset:offset + min(size, 40)]  # less than asked, as a slow reader gives

    assert zipindex.central_directory_sha256(read_at, records) == hashlib.sha256(data[370:472]).hexdigest()
    assert read == [(370, 102), (410, 62), (450, 22)]


def _zip_holding(data: bytes, comment: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("a.txt", data)
        zf.comment = comment
    return out.getvalue()


def test_an_end_record_signature_in_a_member_or_after_the_record_is_not_the_record() -> None:
    marker = b"PK\x05\x06" + b"\0" * 16 + b"\x01\x00"  # a record's signature whose comment would not end the file
    plain = _zip_holding(b"PK\x05\x06" * 8, b"a comment")
    size = len(plain)
    assert end_records(plain, size) == zipindex.EndRecords(size - 22 - 9 - 51, 51, 1, size - 22 - 9, False)
    for data in (_zip_holding(b"x", marker), _zip_holding(b"PK\x05\x06" * 8, marker)):
        for tail in (data, data[-44:]):
            with _refused_as("more than one end of central directory record (one inside the comment of another)"):
                end_records(tail, len(data))


def test_a_zip64_locator_with_no_room_for_its_record() -> None:
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, 0, 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0, 0, 0, 0, 0)
    # 18 bytes before the locator: its record would start before the file.
    with _refused_as("a zip64 locator with no zip64 record before it"):
        end_records(locator + end, 18 + 42)
    # The record at the file's first byte, before the tail read: asked for.
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 0, 0, 0, 0)
    empty = record + locator + end
    with pytest.raises(NeedMore) as more:
        end_records(locator + end, len(empty))
    assert more.value.size == len(empty)
    assert end_records(empty, len(empty)) == zipindex.EndRecords(0, 0, 0, 0, True)


def test_each_of_several_members_runs_to_the_one_after_it() -> None:
    found = extents([_info("c", 100, 1), _info("a", 0, 1), _info("b", 50, 1)], 150)
    assert [(e.info.filename, e.start, e.end, e.limit) for e in found.values()] == [
        ("a", 0, 50, 50), ("b", 50, 100, 100), ("c", 100, 150, 150)]


def test_a_long_name_that_is_not_utf8_is_shown_in_part(tmp_path: Path) -> None:
    path = tmp_path / "sdk.zip"
    name = b"\xff" * 100
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0x800, 0, 0, 0, 0, 0, 0, len(name), 0) + name
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0x800, 0, 0, 0, 0, 0, 0, len(name), 0, 0, 0, 0, 0,
                          0) + name
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central), len(local), 0)
    path.write_bytes(local + central + end)
    with _refused_as(f"a member's name is flagged as UTF-8 but is not: {name[:80]!r}"):
        zipindex.open_zip(path)


def test_completion_leaves_out_every_name_given_already() -> None:
    assert complete(None, None, "host,android,a") == ["host,android,all"]
    assert complete(None, None, "docs,android,") == ["docs,android," + name for name in (
        "host", "hexagon-v68", "hexagon-v69", "hexagon-v73", "hexagon-v75", "hexagon-v79", "all")]


def test_an_sdk_covers_what_it_has_exactly() -> None:
    assert covers(("host",), ("host",))
    assert covers(("host", "docs"), ("docs", "host"))


def test_the_rule_language() -> None:
    """What RULES' patterns mean, for the next line written: `dir/` everything under dir,
    `dir/*` the files directly in it, `*` the files at the root, `{gen}` a number."""
    from qnnctl.sdk.members import _compile

    prefix = _compile("lib/hexagon-v{gen}/")
    found = prefix.match("lib/hexagon-v81/unsigned/libQnnHtpV81Skel.so")
    assert found is not None
    assert found.groupdict() == {"gen": "81"}
    assert prefix.match("lib/hexagon-v81/") is not None
    assert prefix.match("lib/hexagon-vx/a.so") is None
    assert prefix.match("lib/hexagon-v81") is None
    files = _compile("tools/*")
    assert files.match("tools/run.sh") is not None
    assert files.match("tools/sub/run.sh") is None
    assert files.match("tools/") is None
    root = _compile("*")
    assert root.match("NOTICE") is not None
    assert root.match("lib/a.so") is None
    exact = _compile("bin/tool-v{gen}.sh")
    assert exact.match("bin/tool-v2.sh") is not None
    assert exact.match("bin/tool-v2.shx") is None
    assert exact.match("bin/tool-v{gen}.sh") is None
    assert _compile("a.b/").match("axb/c") is None  # the pattern's own characters are literal


def test_choose_keeps_the_folders_above_a_member_whose_entries_the_archive_leaves_out() -> None:
    members = [Member(TOP / "lib", "dir"), Member(TOP / "lib/python/qti/x.py", "file"),
               Member(TOP / "sdk.yaml", "file"), Member(TOP / "sdk.yam", "dir"), Member(TOP / "lib/pytho", "dir")]
    assert choose(members, TOP, ("host",)) == {TOP / "lib", TOP / "lib/python/qti/x.py", TOP / "sdk.yaml"}
    root = PurePosixPath()
    everything = [Member(PurePosixPath("."), "dir"), Member(PurePosixPath("sdk.yaml"), "file")]
    assert choose(everything, root, ("all",)) == {PurePosixPath("sdk.yaml")}  # the archive's root is no member


def test_a_link_through_a_linked_folder_keeps_the_rest_of_its_path() -> None:
    tree = _members({"top/bin/tool": "link", "top/d": "link", "top/e": "dir", "top/e/x": "file"})
    targets = {PurePosixPath("top/bin/tool"): "../d/x", PurePosixPath("top/d"): "e"}
    assert resolve_in(tree, PurePosixPath("top/bin/tool"), targets) == (
        PurePosixPath("top/e/x"), [PurePosixPath("top/d"), PurePosixPath("top/e"), PurePosixPath("top/e/x")])


def test_the_digests_of_an_sdk_folder_take_every_file_and_only_the_execute_bits(tmp_path: Path) -> None:
    root = tmp_path / "sdk"
    root.mkdir()
    names = [f"f{i:02}.txt" for i in range(40)]
    for name in names[:20]:
        (root / name).write_text(name)
    (root / ".qnnctl.json").write_text("{}")  # skipped, wherever the folder lists it
    for name in names[20:]:
        (root / name).write_text(name)
    (root / names[0]).chmod(0o602)  # writable by others: not executable
    (root / names[1]).chmod(0o601)  # executable by others only: executable
    sha = hashlib.sha256
    lines = [member_line(name, "file", name == names[1], "", 7, sha(name.encode()).hexdigest()) for name in names]
    assert tree_digests(root, skip={".qnnctl.json"}) == {"host": _digest(*lines)}
