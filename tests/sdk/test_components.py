"""The pieces of `install --components`: the component rules, choosing members and the links
they need, the ranges requested, the sparse file's record, the zip's end records, and the
loopback server's Range support they are tested against."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import stat
import struct
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from qnnctl.errors import IntegrityError, UsageError
from qnnctl.install.zipindex import NeedMore, end_records, extents
from qnnctl.net.ranged import Remote, SparseFile, _read_record, plan
from qnnctl.sdk.components import canonical, covers, installed_components, missing, parse_components
from qnnctl.sdk.members import Member, available, choose, component_of, unresolved_links, with_link_targets
from qnnctl.sdk.pin import read_pin_components, write_pin
from tests.httpserver import FaultServer, parse_ranges
from tests.sdkfactory import VERSION

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

    import qnnctl.net.ranged

    monkeypatch.setattr(qnnctl.net.ranged, "SAVE_EVERY", 1)  # every write saves the record
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
