"""The package readers: ar/.deb, tar, RPM with a cpio payload, on archives built here.

The builders below (ar, .deb, cpio newc, RPM) write the formats byte by byte so that the
readers are checked against the layouts themselves, not against another reader.
Tests named test_apt_* fetch real Debian packages with `apt-get download`; deselect them
offline with `-k "not apt"`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import os
import stat
import struct
import subprocess
import sys
import tarfile
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from qnnctl.errors import IntegrityError, QnnctlError, UsageError
from qnnctl.host import streams
from qnnctl.host.packages import (
    DIRECTORY,
    FILE,
    HARDLINK,
    MAX_LINK_HOPS,
    OTHER,
    SYMLINK,
    Collected,
    CollectedFile,
    Limits,
    Member,
    RpmInfo,
    ar_members,
    collect,
    cpio_members,
    deb_info,
    deb_members,
    package_kind,
    package_members,
    parse_control,
    rpm_info,
    rpm_members,
    tar_members,
)
from tests.conftest import IN_CI, require_tool

# tarfile's reading of headers (extended ones bounded by overriding its own steps), zlib, lzma, gzip:
# the same on every Python the README names.
pytestmark = pytest.mark.stdlib

# -- builders ----------------------------------------------------------------------------


def ar_archive(members: Sequence[tuple[str, bytes]]) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode(errors="surrogateescape")
        out += data
        if len(data) % 2:
            out += b"\n"
    return bytes(out)


@dataclass
class Entry:
    """One member for a built package: a file (data), a symlink (target) or a folder."""

    name: str
    data: bytes = b""
    target: str | None = None
    folder: bool = False
    mode: int = 0o644


def tar_bytes(entries: Sequence[Entry], compression: str = "xz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tf:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            if entry.folder:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tf.addfile(info)
            elif entry.target is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.target
                tf.addfile(info)
            else:
                info.size = len(entry.data)
                info.mode = entry.mode
                tf.addfile(info, io.BytesIO(entry.data))
    return compress(buffer.getvalue(), compression)


def compress(data: bytes, compression: str) -> bytes:
    if compression == "xz":
        return lzma.compress(data, format=lzma.FORMAT_XZ, preset=0)
    if compression == "gz":
        return gzip.compress(data, compresslevel=1)
    if compression == "bz2":
        import bz2

        return bz2.compress(data, 1)
    if compression == "zst":
        zstandard = pytest.importorskip("zstandard")
        return bytes(zstandard.ZstdCompressor().compress(data))
    if compression == "":
        return data
    raise ValueError(compression)


def build_deb(path: Path, package: str, version: str, entries: Sequence[Entry],
              compression: str = "xz", architecture: str = "amd64",
              data_member: bytes | None = None, control_member: bytes | None = None) -> Path:
    """A .deb as dpkg-deb writes it: debian-binary, control.tar.*, data.tar.*."""
    control = (f"Package: {package}\nVersion: {version}\nArchitecture: {architecture}\n"
               "Description: built by the tests\n continuation line\n")
    control_tar = control_member or tar_bytes([Entry("./"), Entry("./control", control.encode())], "gz")
    suffix = f".{compression}" if compression else ""
    data = data_member if data_member is not None else tar_bytes(entries, compression)
    path.write_bytes(ar_archive([("debian-binary", b"2.0\n"), ("control.tar.gz", control_tar),
                                 (f"data.tar{suffix}", data)]))
    return path


def cpio_newc(entries: Sequence[tuple[str, int, bytes, int, int]]) -> bytes:
    """(name, mode, data, ino, nlink) entries and the trailer, in cpio "newc" format."""
    out = bytearray()
    for name, mode, data, ino, nlink in [*entries, ("TRAILER!!!", 0, b"", 0, 1)]:
        raw_name = name.encode(errors="surrogateescape") + b"\x00"
        fields = [ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(raw_name), 0]
        out += b"070701" + b"".join(f"{v:08x}".encode() for v in fields) + raw_name
        out += b"\x00" * (-len(out) % 4)
        out += data
        out += b"\x00" * (-len(out) % 4)
    return bytes(out)


def cpio_entries(entries: Sequence[Entry]) -> list[tuple[str, int, bytes, int, int]]:
    result = []
    for ino, entry in enumerate(entries, start=1):
        name = "./" + entry.name.lstrip("./")
        if entry.folder:
            result.append((name, stat.S_IFDIR | 0o755, b"", ino, 2))
        elif entry.target is not None:
            result.append((name, stat.S_IFLNK | 0o777, entry.target.encode(), ino, 1))
        else:
            result.append((name, stat.S_IFREG | entry.mode, entry.data, ino, 1))
    return result


_STRING, _STRING_ARRAY, _INT32 = 6, 8, 4


def rpm_header(tags: Sequence[tuple[int, int, object]]) -> bytes:
    index = bytearray()
    store = bytearray()
    for tag, kind, value in sorted(tags, key=lambda t: t[0]):
        if kind == _INT32:
            store += b"\x00" * (-len(store) % 4)
            ints = list(value) if isinstance(value, list) else [value]
            data, count = struct.pack(f">{len(ints)}I", *ints), len(ints)
        elif kind == _STRING_ARRAY or isinstance(value, list):  # a list as a string: its count, 0 too
            strings = value if isinstance(value, list) else [value]
            data, count = b"".join(str(s).encode() + b"\x00" for s in strings), len(strings)
        else:
            data, count = (value if isinstance(value, bytes) else str(value).encode()) + b"\x00", 1
        index += struct.pack(">IIII", tag, kind, len(store), count)
        store += data
    return (b"\x8e\xad\xe8\x01" + b"\x00" * 4 + struct.pack(">II", len(index) // 16, len(store))
            + bytes(index) + bytes(store))


def build_rpm(path: Path, name: str, version: str, release: str, cpio: bytes,
              compressor: str = "xz", payload_digest: str | None = None,
              header_digest: str | None = None, compressed_as: str | None = None,
              tags: dict[int, tuple[int, object] | None] | None = None) -> Path:
    """An RPM v3 lead, a signature header (sha256 of the header), a header, the payload.

    `compressed_as` compresses the payload otherwise than the header says; `tags` replaces
    header or signature tags by number (None leaves one out, 273 being the signature's sha256)."""
    codecs = {"xz": "xz", "zstd": "zst", "gzip": "gz", "none": ""}
    payload = compress(cpio, codecs[compressed_as or compressor])
    chosen: dict[int, tuple[int, object] | None] = {
        1000: (_STRING, name), 1001: (_STRING, version), 1002: (_STRING, release),
        1022: (_STRING, "x86_64"), 1124: (_STRING, "cpio"), 1125: (_STRING, compressor),
        5092: (_STRING_ARRAY, [payload_digest or hashlib.sha256(payload).hexdigest()]),
        5093: (_INT32, [8]),
    }
    overrides = dict(tags or {})
    sha_tag = overrides.pop(273, (_STRING, None))
    chosen.update(overrides)
    header = rpm_header([(tag, *value) for tag, value in chosen.items() if value is not None])
    signed: list[tuple[int, int, object]] = [(1000, _INT32, [len(header) + len(payload)])]
    if sha_tag is not None:
        signed.append((273, sha_tag[0], sha_tag[1] or header_digest or hashlib.sha256(header).hexdigest()))
    signature = rpm_header(signed)
    lead = (b"\xed\xab\xee\xdb" + bytes([3, 0]) + struct.pack(">hh", 0, 1)
            + name.encode()[:65].ljust(66, b"\x00") + struct.pack(">hh", 1, 5) + b"\x00" * 16)
    assert len(lead) == 96
    signature += b"\x00" * (-len(signature) % 8)
    path.write_bytes(lead + signature + header + payload)
    return path


# A small tree with the shapes real packages have: a file reached through a chain of links
# across folders, an absolute link, and a folder that is itself a link.
TREE = [
    Entry("./", folder=True),
    Entry("./usr/", folder=True),
    Entry("./usr/lib/llvm-14/lib/libc++.so.1.0", b"\x7fELF real libc++"),
    Entry("./usr/lib/llvm-14/lib/libc++.so.1", target="libc++.so.1.0"),
    Entry("./usr/lib/x86_64-linux-gnu/libc++.so.1.0", target="../llvm-14/lib/libc++.so.1.0"),
    Entry("./usr/lib/x86_64-linux-gnu/libc++.so.1", target="libc++.so.1.0"),
    Entry("./usr/lib64", target="lib/x86_64-linux-gnu"),
    Entry("./lib64/ld-linux-x86-64.so.2", target="/usr/lib/llvm-14/lib/libc++.so.1.0"),
    Entry("./usr/share/doc/libc++1-14/copyright", b"not wanted" * 100),
]


def wanted(name: str) -> bool:
    return os.path.basename(name).startswith(("libc++.so.1", "ld-linux"))


def check_tree(found: Collected, dest: Path) -> None:
    real = "usr/lib/llvm-14/lib/libc++.so.1.0"
    assert set(found.files) == {real}
    assert found.files[real].path.read_bytes() == b"\x7fELF real libc++"
    assert found.files[real].sha256 == hashlib.sha256(b"\x7fELF real libc++").hexdigest()
    assert found.resolve("usr/lib/x86_64-linux-gnu/libc++.so.1") == real
    assert found.resolve("usr/lib64/libc++.so.1") == real  # through a folder link
    assert found.resolve("lib64/ld-linux-x86-64.so.2") == real  # an absolute target
    assert found.resolve("usr/share/doc/libc++1-14/copyright") is None  # not kept
    assert sorted(p.name for p in dest.iterdir()) == ["0"]  # nothing else written


# -- ar and .deb -------------------------------------------------------------------------


def test_ar_members_are_read_with_odd_sizes_and_gnu_names(tmp_path: Path) -> None:
    path = tmp_path / "x.a"
    path.write_bytes(ar_archive([("odd/", b"abc"), ("even", b"abcd"), ("last", b"z")]))
    with open(path, "rb") as handle:
        members = ar_members(handle, "x.a")
        assert [(m.name, m.size) for m in members] == [("odd", 3), ("even", 4), ("last", 1)]
        handle.seek(members[1].offset)
        assert handle.read(members[1].size) == b"abcd"


@pytest.mark.parametrize("compression", ["xz", "gz", "bz2", "zst", ""])
def test_deb_data_is_streamed_and_links_followed(tmp_path: Path, compression: str) -> None:
    deb = build_deb(tmp_path / "p.deb", "libc++1-14", "1:14.0.6-12", TREE, compression)
    info = deb_info(deb)
    assert (info.package, info.version, info.architecture) == ("libc++1-14", "1:14.0.6-12", "amd64")
    assert info.fields["Description"] == "built by the tests\ncontinuation line"
    assert package_kind(deb) == "deb"
    found = collect(deb_members(deb), wanted, tmp_path / "out", deb.name)
    check_tree(found, tmp_path / "out")


LIMITED = Limits(members=6, unpacked=4000, kept=1000, names=1000)
KEEP = [Entry("lib/a.so.1", b"a" * 400), Entry("lib/b.so.1", b"b" * 400), Entry("share/doc", b"d" * 1000)]


@pytest.mark.parametrize(("extra", "said"), [
    # The third kept file would take 1,200 bytes of the 1,000 kept: refused from its header, unwritten.
    ([Entry("lib/c.so.1", b"c" * 400)], "holds more than 1000 bytes in the files qnnctl keeps of it"),
    # Unwanted files are not written, but read through: 4,000 bytes at most of them all.
    ([Entry("share/big", b"x" * 2500)], "holds more than 4000 bytes in its files"),
    # Links cost no bytes, only memory: 6 entries at most, of any kind.
    ([Entry(f"lib/l{i}", target="a.so.1") for i in range(4)], "holds more than 6 entries"),
    # A link's name and target are held in memory, up to 8 KiB each: 1,000 bytes at most of them all.
    ([Entry(f"lib/l{i}" + "x" * 400, target="a.so.1") for i in range(3)],
     "holds more than 1000 bytes in the names and link targets qnnctl keeps of it"),
], ids=["kept", "unpacked", "members", "names"])
def test_a_package_past_its_limits_is_refused_before_the_member_past_them_is_read(
        tmp_path: Path, extra: list[Entry], said: str) -> None:
    data = tar_bytes(KEEP + extra)
    out = tmp_path / "out"
    with pytest.raises(IntegrityError) as caught:
        collect(tar_members(io.BytesIO(data), "p.tar.xz"), is_lib, out, "p.tar.xz", LIMITED)
    assert caught.value.message == f"p.tar.xz {said}: more than the package it stands for could"
    assert caught.value.hint == "it is not the package that was asked for; nothing was staged"
    assert sorted(p.read_bytes() for p in out.iterdir()) == [b"a" * 400, b"b" * 400]
    # Within them, the same package is collected whole.
    roomy = Limits(members=7, unpacked=5000, kept=1200, names=2000)
    found = collect(tar_members(io.BytesIO(data), "p.tar.xz"), is_lib, tmp_path / "roomy", "p.tar.xz", roomy)
    assert sorted(found.files) == sorted(e.name for e in KEEP + extra if e.target is None and is_lib(e.name))


def test_a_tar_streamed_holds_no_member_it_has_passed() -> None:
    """tarfile keeps every header it read, long names and all: 3,000 links of 8,000-byte names
    (24 MB, a few kilobytes compressed) would be held until the end, and a server's archive may
    have 200,000 entries. Read as a stream, each is let go once the next is read."""
    names = [f"{i:04d}" + "n" * 7996 for i in range(3000)]
    data = tar_bytes([Entry(name, target="t") for name in names])
    tracemalloc.start()
    try:
        count = sum(1 for _ in tar_members(io.BytesIO(data), "p.tar.xz"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 3000
    assert peak < 8 << 20, peak


def test_a_large_library_is_kept_a_block_at_a_time(tmp_path: Path) -> None:
    """A library is written as it is read, never held whole (the trio's largest is a few MB; the
    most kept of a package is 256 MiB)."""
    library = bytes(48 << 20)
    data = tar_bytes([Entry("./usr/lib/libc++.so.1", library)], "gz")
    del library
    tracemalloc.start()
    try:
        found = collect(tar_members(io.BytesIO(data), "p.tar.gz"), wanted, tmp_path / "out", "p.tar.gz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found.files["usr/lib/libc++.so.1"].size == 48 << 20
    assert peak < 16 << 20, peak


def test_a_tar_whose_extended_headers_pass_the_most_together_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """Each within the most one may be, and none chained: their bytes together are bounded too,
    each header's parse costing time (32 MiB; 64 KiB here)."""
    monkeypatch.setattr(streams, "MOST_EXTENDED_TOTAL", 64 << 10)
    within = tar_bytes([Entry(f"{i:02d}" + "n" * 4000, b"x") for i in range(15)])  # 15 long names of 4 KB
    assert sum(1 for _ in tar_members(io.BytesIO(within), "p.tar.xz")) == 15
    past = tar_bytes([Entry(f"{i:02d}" + "n" * 4000, b"x") for i in range(17)])
    with pytest.raises(IntegrityError) as refused:
        collect(tar_members(io.BytesIO(past), "p.tar.xz"), is_lib, tmp_path / "out", "p.tar.xz")
    assert refused.value.message == "p.tar.xz is corrupt or truncated: more than 65536 bytes of extended tar headers"


def is_lib(name: str) -> bool:
    return name.startswith("lib/") and ".so" in name


def test_parse_control_stops_at_the_first_paragraph() -> None:
    fields = parse_control("\nPackage: a\nVersion: 1\n multi\n\nPackage: b\n")
    assert fields == {"Package": "a", "Version": "1\nmulti"}


def test_truncated_deb_is_an_integrity_error(tmp_path: Path) -> None:
    deb = build_deb(tmp_path / "p.deb", "x", "1", TREE)
    data = deb.read_bytes()
    deb.write_bytes(data[: len(data) - 40])
    with pytest.raises(IntegrityError) as caught:
        list(deb_members(deb))
    assert caught.value.message == ("p.deb is corrupt or truncated: ar member 'data.tar.xz' runs past"
                                    " the end of the file")


def test_damaged_data_tar_is_an_integrity_error(tmp_path: Path) -> None:
    good = tar_bytes(TREE, "xz")
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    deb = build_deb(tmp_path / "p.deb", "x", "1", TREE, data_member=bytes(bad))
    with pytest.raises(IntegrityError, match="corrupt"):
        collect(deb_members(deb), wanted, tmp_path / "out", deb.name)


def test_bad_ar_header_is_an_integrity_error(tmp_path: Path) -> None:
    deb = build_deb(tmp_path / "p.deb", "x", "1", TREE)
    data = bytearray(deb.read_bytes())
    data[8 + 58] = ord("X")  # the first member header's terminator
    deb.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        deb_info(deb)


def test_not_a_package_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n" * 100)
    with pytest.raises(UsageError) as caught:
        list(package_members(path))
    assert caught.value.message == f"{path} is not a .deb, .rpm or tar archive"


def test_tar_archive_members(tmp_path: Path) -> None:
    path = tmp_path / "a.tar.xz"
    path.write_bytes(tar_bytes(TREE, "xz"))
    assert package_kind(path) == "tar"
    check_tree(collect(package_members(path), wanted, tmp_path / "out", path.name), tmp_path / "out")


# -- RPM ---------------------------------------------------------------------------------


def rpm_tree() -> bytes:
    entries = cpio_entries(TREE)
    # A hard-linked pair as newc stores it: the first name empty, the data with the last.
    entries.append(("./usr/lib/x86_64-linux-gnu/libc++.so.1.hard", stat.S_IFREG | 0o644, b"", 99, 2))
    entries.append(("./usr/lib/x86_64-linux-gnu/libc++.so.1.data", stat.S_IFREG | 0o644, b"\x7fELF h", 99, 2))
    return cpio_newc(entries)


@pytest.mark.parametrize("compressor", ["xz", "zstd", "gzip", "none"])
def test_rpm_payload_is_read(tmp_path: Path, compressor: str) -> None:
    rpm = build_rpm(tmp_path / "p.rpm", "glibc", "2.36", "1.el9", rpm_tree(), compressor)
    assert package_kind(rpm) == "rpm"
    with open(rpm, "rb") as handle:
        info = rpm_info(handle, rpm.name)
    assert (info.name, info.version, info.release, info.arch) == ("glibc", "2.36", "1.el9", "x86_64")
    assert info.compressor == compressor
    dest = tmp_path / "out"
    found = collect(rpm_members(rpm), lambda n: "libc++" in n or "ld-linux" in n, dest, rpm.name)
    assert found.resolve("usr/lib64/libc++.so.1") == "usr/lib/llvm-14/lib/libc++.so.1.0"
    assert found.resolve("lib64/ld-linux-x86-64.so.2") == "usr/lib/llvm-14/lib/libc++.so.1.0"
    hard = found.resolve("usr/lib/x86_64-linux-gnu/libc++.so.1.hard")
    assert hard == "usr/lib/x86_64-linux-gnu/libc++.so.1.data"
    assert found.files[hard].path.read_bytes() == b"\x7fELF h"


def test_rpm_payload_digest_mismatch(tmp_path: Path) -> None:
    rpm = build_rpm(tmp_path / "p.rpm", "glibc", "2.36", "1", rpm_tree(), payload_digest="0" * 64)
    with pytest.raises(IntegrityError, match="payload does not match"):
        list(rpm_members(rpm))


def test_rpm_header_digest_mismatch(tmp_path: Path) -> None:
    rpm = build_rpm(tmp_path / "p.rpm", "glibc", "2.36", "1", rpm_tree(), header_digest="0" * 64)
    with pytest.raises(IntegrityError, match="header does not match"):
        list(rpm_members(rpm))


def test_damaged_rpm_payload(tmp_path: Path) -> None:
    rpm = build_rpm(tmp_path / "p.rpm", "glibc", "2.36", "1", rpm_tree())
    data = bytearray(rpm.read_bytes())
    data[-30] ^= 0xFF
    rpm.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        collect(rpm_members(rpm), lambda n: True, tmp_path / "out", rpm.name)


def test_truncated_rpm_header(tmp_path: Path) -> None:
    rpm = build_rpm(tmp_path / "p.rpm", "glibc", "2.36", "1", rpm_tree())
    rpm.write_bytes(rpm.read_bytes()[:200])
    with pytest.raises(IntegrityError, match="past the end"):
        list(rpm_members(rpm))


def test_zstd_payload_without_a_zstd_module_names_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rpm = build_rpm(tmp_path / "p.rpm", "glibc", "2.36", "1", rpm_tree(), "zstd")
    # A None entry makes the import fail as it does where the module is not installed.
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setitem(sys.modules, "compression.zstd", None)
    with pytest.raises(QnnctlError) as caught:
        list(rpm_members(rpm))
    assert caught.value.message == "p.rpm is compressed with zstd, and Python here has no zstd module"
    assert caught.value.hint is not None
    assert "pip install zstandard" in caught.value.hint


# -- real packages -----------------------------------------------------------------------

APT_PACKAGES = ("libc++1-14", "libc++abi1-14", "libunwind-14", "libc6")
_apt_folder: list[Path] = []


def apt_debs(factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real packages, fetched once per session with `apt-get download`.

    Offline, the tests that need them are skipped locally; in CI that is a failure. A session's
    temporary folder can be gone before another session in the same process asks (pytest keeps
    the last three of a user's, whoever ran them): the packages are then fetched again.
    """
    if _apt_folder and not _apt_folder[0].is_dir():
        _apt_folder.clear()
    if not _apt_folder:
        require_tool("apt-get")
        folder = factory.mktemp("apt")
        proc = subprocess.run(["apt-get", "download", *APT_PACKAGES], cwd=folder,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            message = f"apt-get download failed: {proc.stderr.strip()[-500:]}"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        _apt_folder.append(folder)
    found = {}
    for deb in _apt_folder[0].glob("*.deb"):
        found[deb.name.split("_", 1)[0]] = deb
    assert set(found) == set(APT_PACKAGES)
    return found


@pytest.fixture
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return apt_debs(tmp_path_factory)


def test_apt_real_deb_is_read_and_its_links_followed(debs: dict[str, Path], tmp_path: Path) -> None:
    deb = debs["libc++1-14"]
    info = deb_info(deb)
    assert info.package == "libc++1-14"
    found = collect(deb_members(deb), wanted, tmp_path / "out", deb.name)
    real = found.resolve("usr/lib/x86_64-linux-gnu/libc++.so.1")
    assert real is not None
    assert real.endswith("libc++.so.1.0")
    assert found.files[real].path.read_bytes()[:4] == b"\x7fELF"
    # The same bytes dpkg-deb would unpack.
    dpkg = require_tool("dpkg-deb")
    out = subprocess.run([dpkg, "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(out)) as tf:
        member = tf.extractfile("./" + real)
        assert member is not None
        assert hashlib.sha256(member.read()).hexdigest() == found.files[real].sha256


# -- member by member --------------------------------------------------------------------


def seen(members: Iterable[Member]) -> list[tuple[str, str, int, int, str, bytes | None]]:
    """Each member as a caller sees it, its bytes read before the next is asked for."""
    return [(m.name, m.kind, m.size, m.mode, m.linkname, None if m.data is None else m.data.read())
            for m in members]


def test_cpio_members_yield_each_kind_as_stored() -> None:
    cpio = cpio_newc([
        ("./usr/bin/tool", stat.S_IFREG | 0o755, b"run", 1, 1),
        ("./etc/empty", stat.S_IFREG | 0o600, b"", 2, 1),  # empty, and not a hard link
        ("./usr/lib/link", stat.S_IFLNK | 0o777, b"t\xffarget", 3, 1),
        ("./usr/lib/nowhere", stat.S_IFLNK | 0o777, b"", 4, 1),
        ("./usr/share/", stat.S_IFDIR | 0o750, b"", 5, 2),
        ("./dev/fifo", stat.S_IFIFO | 0o600, b"", 6, 1),
        ("./usr/lib/caf\udce9X", stat.S_IFREG | 0o644, b"x", 7, 1),  # not UTF-8, ends in "X"
        ("./X11/a\x00b", stat.S_IFREG | 0o644, b"y", 10, 1),  # a NUL inside the name is dropped
        (".", stat.S_IFDIR | 0o755, b"", 11, 2),
        # Two hard-linked pairs, interleaved: each empty name repeats its own inode's data.
        ("./a1", stat.S_IFREG | 0o640, b"", 8, 2),
        ("./b1", stat.S_IFREG | 0o604, b"", 9, 2),
        ("./a2", stat.S_IFREG | 0o640, b"AA", 8, 2),
        ("./b2", stat.S_IFREG | 0o604, b"BBB", 9, 2),
    ])
    assert seen(cpio_members(io.BytesIO(cpio), "p.rpm")) == [
        ("usr/bin/tool", FILE, 3, 0o755, "", b"run"),
        ("etc/empty", FILE, 0, 0o600, "", b""),
        ("usr/lib/link", SYMLINK, 0, 0o777, "t\udcffarget", None),
        ("usr/lib/nowhere", SYMLINK, 0, 0o777, "", None),
        ("usr/share", DIRECTORY, 0, 0o750, "", None),
        ("dev/fifo", OTHER, 0, 0o644, "", None),
        ("usr/lib/caf\udce9X", FILE, 1, 0o644, "", b"x"),
        ("X11/ab", FILE, 1, 0o644, "", b"y"),
        ("", DIRECTORY, 0, 0o755, "", None),
        ("a2", FILE, 2, 0o640, "", b"AA"),
        ("a1", HARDLINK, 0, 0o640, "a2", None),
        ("b2", FILE, 3, 0o604, "", b"BBB"),
        ("b1", HARDLINK, 0, 0o604, "b2", None),
    ]


FIRST = ("./a", stat.S_IFREG | 0o644, b"12345", 1, 1)
SECOND_HEADER = len(cpio_newc([FIRST])) - len(cpio_newc([]))  # 124: where the second header starts


def damaged_cpio(at: int, byte: bytes) -> bytes:
    cpio = bytearray(cpio_newc([FIRST, ("./b", stat.S_IFREG | 0o644, b"x", 2, 1)]))
    cpio[at : at + len(byte)] = byte
    return bytes(cpio)


@pytest.mark.parametrize(("cpio", "error", "message"), [
    (damaged_cpio(SECOND_HEADER, b"1"), IntegrityError,
     f"p.rpm is corrupt or truncated: bad cpio header at payload byte {SECOND_HEADER}"),
    (damaged_cpio(SECOND_HEADER + 6, b"g"), IntegrityError,  # the first digit of the inode
     f"p.rpm is corrupt or truncated: bad cpio header at payload byte {SECOND_HEADER}"),
    (damaged_cpio(0, b"07070X"), UsageError,
     "p.rpm: the payload uses RPM's large-file cpio format, not supported"),
], ids=["magic", "digit", "large-file"])
def test_a_bad_cpio_header_is_refused_where_it_is(cpio: bytes, error: type[QnnctlError], message: str) -> None:
    with pytest.raises(error) as caught:
        seen(cpio_members(io.BytesIO(cpio), "p.rpm"))
    assert type(caught.value) is error
    assert caught.value.message == message


def rpm_mismatched(path: Path) -> Path:
    return build_rpm(path, "glibc", "2.36", "1", rpm_tree(), payload_digest="0" * 64)


@pytest.mark.parametrize(("build", "source", "said"), [
    (rpm_mismatched, None, "the RPM payload does not match its sha256 in the header"),
    (rpm_mismatched, "glibc 2.36", "the RPM payload does not match its sha256 in the header"),
    (lambda p: build_rpm(p, "glibc", "2.36", "1", rpm_tree(), header_digest="0" * 64), None,
     "the RPM header does not match its sha256 in the signature"),
    (lambda p: build_rpm(p, "glibc", "2.36", "1", rpm_tree(), "zstd", compressed_as="xz"), None,
     "the payload is not zstd data as the header says"),
    (lambda p: build_rpm(p, "glibc", "2.36", "1", b"not a cpio archive" * 10), None,
     "bad cpio header at payload byte 0"),
], ids=["payload", "payload-named", "header", "not-zstd", "not-cpio"])
def test_rpm_errors_name_the_package(tmp_path: Path, build: Callable[[Path], Path], source: str | None,
                                     said: str) -> None:
    rpm = build(tmp_path / "p.rpm")
    with pytest.raises(IntegrityError) as caught:
        seen(rpm_members(rpm, source))
    assert caught.value.message == f"{source or 'p.rpm'} is corrupt or truncated: {said}"


def rpm_info_of(path: Path) -> RpmInfo:
    with open(path, "rb") as handle:
        return rpm_info(handle, path.name)


def test_rpm_header_values_missing_empty_or_not_utf8(tmp_path: Path) -> None:
    # No sha256 in the signature, no payload format nor compressor: cpio and gzip, as rpm reads them.
    bare = build_rpm(tmp_path / "bare.rpm", "glibc", "2.36", "1", rpm_tree(), "gzip",
                     tags={273: None, 1124: None, 1125: None})
    info = rpm_info_of(bare)
    assert (info.name, info.compressor, info.payload_sha256) == ("glibc", "gzip", hashlib.sha256(
        bare.read_bytes()[info.payload_offset:]).hexdigest())
    odd = build_rpm(tmp_path / "odd.rpm", "glibc", "2.36", "1", rpm_tree(),
                    tags={1000: (_STRING, b"gl\xffibc"), 5092: (_STRING_ARRAY, [])})
    info = rpm_info_of(odd)
    assert (info.name, info.payload_sha256) == ("gl\ufffdibc", None)
    # A header of no tags: its index and its store are reads of no bytes, none past the end.
    empty = build_rpm(tmp_path / "empty.rpm", "glibc", "2.36", "1", rpm_tree(), "gzip",
                      tags={tag: None for tag in (1000, 1001, 1002, 1022, 1124, 1125, 5092, 5093)})
    info = rpm_info_of(empty)
    assert (info.name, info.version, info.release, info.arch, info.compressor) == ("", "", "", "", "gzip")


@pytest.mark.parametrize("kind", ["deb", "rpm", "tar"])
@pytest.mark.parametrize("source", [None, "the package"])
def test_package_members_name_the_package_as_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   kind: str, source: str | None) -> None:
    """Each kind read by its own reader, which names the package by `source`, else by its file's name."""
    path = tmp_path / f"p.{kind}"
    if kind == "deb":
        build_deb(path, "x", "1", TREE, "zst")
    elif kind == "rpm":
        build_rpm(path, "glibc", "2.36", "1", rpm_tree(), "zstd")
    else:
        path.write_bytes(tar_bytes(TREE, "zst"))
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setitem(sys.modules, "compression.zstd", None)
    with pytest.raises(QnnctlError) as caught:
        seen(package_members(path, source))
    assert caught.value.message == f"{source or path.name} is compressed with zstd, and Python here has no zstd module"


def chain(links: int) -> Collected:
    """l0 -> l1 -> ... -> lib/real: `links` links to follow from l0."""
    found = Collected(files={"lib/real": CollectedFile(Path("0"), "0" * 64, 0, 0o644)})
    for i in range(links):
        found.symlinks[f"l{i}"] = f"l{i + 1}" if i + 1 < links else "lib/real"
    return found


@pytest.mark.parametrize(("found", "name", "resolved"), [
    (chain(MAX_LINK_HOPS), "l0", "lib/real"),
    (chain(MAX_LINK_HOPS + 1), "l0", None),
    (chain(MAX_LINK_HOPS + 1), "l1", "lib/real"),
    (chain(1), "./lib/./real", "lib/real"),
    (chain(1), "lib/../l0", "lib/real"),
    (Collected(symlinks={"a": "b", "b": "a"}), "a", None),
], ids=["most-hops", "one-hop-too-many", "from-the-second", "dot", "dot-dot", "loop"])
def test_resolve_follows_at_most_max_link_hops(found: Collected, name: str, resolved: str | None) -> None:
    assert found.resolve(name) == resolved


def test_links_kept_cost_names_not_bytes(tmp_path: Path) -> None:
    """Limits' `kept` counts the files' bytes only; a link's target counts among the names."""
    entries = [*KEEP[:2], Entry("lib/c.so.1", target="a.so.1")]
    exact = Limits(members=3, unpacked=800, kept=800, names=30 + len("a.so.1"))
    found = collect(tar_members(io.BytesIO(tar_bytes(entries)), "p.tar.xz"), is_lib, tmp_path / "out",
                    "p.tar.xz", exact)
    assert found.resolve("lib/c.so.1") == "lib/a.so.1"
    long_target = [*KEEP[:2], Entry("lib/c", target="x" * 981)]
    with pytest.raises(IntegrityError) as caught:
        collect(tar_members(io.BytesIO(tar_bytes(long_target)), "p.tar.xz"), is_lib, tmp_path / "long",
                "p.tar.xz", LIMITED)
    assert caught.value.message == ("p.tar.xz holds more than 1000 bytes in the names and link targets"
                                    " qnnctl keeps of it: more than the package it stands for could")


def tar_of_each_kind() -> bytes:
    """The first member's name begins as a bzip2 stream does: read as the plain tar it is."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tf:
        for name, kind, mode, link, data in [
            ("BZh91AY&SY notes", tarfile.REGTYPE, 0o750, "", b"run"),
            ("./usr/lib/link", tarfile.SYMTYPE, 0o644, "../x", b""),
            ("./usr/lib/hard", tarfile.LNKTYPE, 0o640, "./BZh91AY&SY notes", b""),
            ("./usr/share/", tarfile.DIRTYPE, 0o750, "", b""),
            ("./dev/fifo", tarfile.FIFOTYPE, 0o600, "", b""),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.size = kind, mode, link, len(data)
            tf.addfile(info, io.BytesIO(data))
    return compress(buffer.getvalue(), "xz")


def test_tar_members_yield_each_kind_as_stored() -> None:
    assert seen(tar_members(io.BytesIO(tar_of_each_kind()), "p.tar.xz")) == [
        ("BZh91AY&SY notes", FILE, 3, 0o750, "", b"run"),
        ("usr/lib/link", SYMLINK, 0, 0o777, "../x", None),
        ("usr/lib/hard", HARDLINK, 0, 0o640, "BZh91AY&SY notes", None),
        ("usr/share", DIRECTORY, 0, 0o750, "", None),
        ("dev/fifo", OTHER, 0, 0o644, "", None),
    ]


def rpm_cut(path: Path, end: Callable[[bytes, int], int], **kwargs: Any) -> Path:
    """An RPM cut to `end(its bytes, where its payload starts)` bytes."""
    build_rpm(path, "glibc", "2.36", "1", rpm_tree(), **kwargs)
    data = path.read_bytes()
    path.write_bytes(data[: end(data, rpm_info_of(path).payload_offset)])
    return path


def rpm_changed(path: Path, at: int, byte: bytes) -> Path:
    build_rpm(path, "glibc", "2.36", "1", rpm_tree())
    data = bytearray(path.read_bytes())
    data[at : at + len(byte)] = byte
    path.write_bytes(bytes(data))
    return path


def header_start(path: Path) -> int:
    """Where an RPM's header (after the lead and signature) starts."""
    data = path.read_bytes()
    return data.index(b"\x8e\xad\xe8\x01", 100)


@pytest.mark.parametrize(("build", "error", "said"), [
    (lambda p: rpm_cut(p, lambda d, end: 50), UsageError, "p.rpm is not an RPM package"),
    (lambda p: rpm_cut(p, lambda d, end: 96), IntegrityError,
     "p.rpm is corrupt or truncated: the RPM header runs past the end of the file"),
    (lambda p: rpm_cut(p, lambda d, end: 98), IntegrityError,
     "p.rpm is corrupt or truncated: the RPM header runs past the end of the file"),
    (lambda p: rpm_cut(p, lambda d, end: end - 1), IntegrityError,
     "p.rpm is corrupt or truncated: the RPM header runs past the end of the file"),
    (lambda p: rpm_changed(p, 4, b"\x02"), UsageError, "p.rpm: RPM format 2 is too old to read"),
    (lambda p: rpm_changed(p, 99, b"\x02"), IntegrityError, "p.rpm is corrupt or truncated: bad RPM header magic"),
    (lambda p: rpm_changed(p, header_start(build_rpm(p, "glibc", "2.36", "1", rpm_tree())) + 3, b"\x02"),
     IntegrityError, "p.rpm is corrupt or truncated: bad RPM header magic"),
    (lambda p: build_rpm(p, "glibc", "2.36", "1", rpm_tree(), tags={1000: (_STRING, [])}), IntegrityError,
     "p.rpm is corrupt or truncated: bad RPM header: AssertionError"),
    (lambda p: build_rpm(p, "glibc", "2.36", "1", rpm_tree(), tags={1124: (_STRING, "drpm")}), UsageError,
     "p.rpm: RPM payload format 'drpm' is not supported"),
], ids=["short", "lead-only", "half-magic", "header-short-by-one", "old-format", "signature-magic",
        "header-magic", "string-of-none", "not-cpio"])
def test_rpm_info_refuses_what_it_cannot_read(tmp_path: Path, build: Callable[[Path], Path],
                                              error: type[QnnctlError], said: str) -> None:
    rpm = build(tmp_path / "p.rpm")
    with pytest.raises(error) as caught:
        rpm_info_of(rpm)
    assert type(caught.value) is error
    assert caught.value.message == said


def test_rpm_payload_digest_is_kept_only_when_sha256(tmp_path: Path) -> None:
    md5 = build_rpm(tmp_path / "md5.rpm", "glibc", "2.36", "1", rpm_tree(), payload_digest="AB" * 16,
                    tags={5093: (_INT32, [1])})
    assert rpm_info_of(md5).payload_sha256 is None
    upper = build_rpm(tmp_path / "upper.rpm", "glibc", "2.36", "1", rpm_tree(), payload_digest="AB" * 32)
    assert rpm_info_of(upper).payload_sha256 == "ab" * 32


def test_ar_members_skip_a_symbol_table_and_keep_empty_members(tmp_path: Path) -> None:
    path = tmp_path / "x.a"
    path.write_bytes(ar_archive([("/", b"\x00" * 4), ("empty", b""), ("caf\udce9", b"ab"), ("last", b"xyz")]))
    with open(path, "rb") as handle:
        assert [(m.name, m.size) for m in ar_members(handle, "x.a")] == [
            ("empty", 0), ("caf\udce9", 2), ("last", 3)]


@pytest.mark.parametrize(("data", "error", "said"), [
    (ar_archive([("a", b"12"), ("last", b"xyz")])[:-2], IntegrityError,  # the pad, and a byte of "xyz"
     "x.a is corrupt or truncated: ar member 'last' runs past the end of the file"),
    (b"!<arch>\r" + b"\x00" * 60, UsageError, "x.a is not an ar archive (.deb)"),
], ids=["one-byte-short", "not-ar"])
def test_ar_members_refuse(tmp_path: Path, data: bytes, error: type[QnnctlError], said: str) -> None:
    path = tmp_path / "x.a"
    path.write_bytes(data)
    with open(path, "rb") as handle, pytest.raises(error) as caught:
        ar_members(handle, "x.a")
    assert caught.value.message == said


def deb_version_3(path: Path) -> Path:
    path.write_bytes(ar_archive([("debian-binary", b"3.0\n"), ("control.tar.gz", tar_bytes([], "gz")),
                                 ("data.tar.gz", tar_bytes([], "gz"))]))
    return path


def deb_with_control(path: Path, control: bytes, compression: str = "gz") -> Path:
    control_tar = tar_bytes([Entry("./"), Entry("./control", control)], compression) if control else \
        tar_bytes([Entry("./md5sums", b"")], compression)
    return build_deb(path, "x", "1", TREE, control_member=control_tar)


def test_deb_info_takes_fields_as_they_are(tmp_path: Path) -> None:
    bare = deb_info(deb_with_control(tmp_path / "bare.deb", b"Description: no name\n"))
    assert (bare.package, bare.version, bare.architecture) == ("", "", "")
    odd = deb_info(deb_with_control(tmp_path / "odd.deb", b"Package: caf\xe9\nVersion: 1\n"))
    assert (odd.package, odd.version) == ("caf\ufffd", "1")
    # Only the first MiB of a control file is read.
    long = b"Package: big\nDescription: " + b"x" * (1 << 20) + b"\nVersion: 2\n"
    big = deb_info(deb_with_control(tmp_path / "big.deb", long))
    assert (big.package, big.version) == ("big", "")


@pytest.mark.parametrize(("build", "error", "said"), [
    (lambda p: deb_with_control(p, b""), IntegrityError,
     "p.deb is corrupt or truncated: control.tar holds no control file"),
    (lambda p: build_deb(p, "x", "1", TREE, control_member=gzip.compress(b"not a tar" * 200)), IntegrityError,
     "p.deb is corrupt or truncated: invalid header"),
    (lambda p: deb_with_control(p, b"Package: x\n", "zst"), QnnctlError,
     "p.deb is compressed with zstd, and Python here has no zstd module"),
    (lambda p: deb_version_3(p), UsageError,
     "p.deb: unsupported .deb format version"),
], ids=["no-control", "not-a-tar", "zstd", "version-3"])
def test_deb_info_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build: Callable[[Path], Path],
                          error: type[QnnctlError], said: str) -> None:
    deb = build(tmp_path / "p.deb")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setitem(sys.modules, "compression.zstd", None)
    with pytest.raises(error) as caught:
        deb_info(deb)
    assert type(caught.value) is error
    assert caught.value.message == said


def test_rpm_without_payload_has_its_header_read_to_the_last_byte(tmp_path: Path) -> None:
    rpm = rpm_cut(tmp_path / "p.rpm", lambda d, end: end)
    assert rpm_info_of(rpm).payload_offset == rpm.stat().st_size


def test_collect_writes_into_a_folder_made_or_there_already(tmp_path: Path) -> None:
    big = b"\x7fELF" + bytes(range(256)) * 5000  # more than one block of copying
    data = tar_bytes([Entry("lib/a.so.1", big, mode=0o755)])
    for dest in (tmp_path / "new" / "deeper", tmp_path):
        found = collect(tar_members(io.BytesIO(data), "p.tar.xz"), is_lib, dest, "p.tar.xz")
        kept = found.files["lib/a.so.1"]
        assert (kept.path.read_bytes(), kept.size, kept.mode) == (big, len(big), 0o755)


def test_a_member_shorter_than_it_says_is_corrupt(tmp_path: Path) -> None:
    short = Member("lib/a.so.1", FILE, 5, 0o644, "", io.BytesIO(b"abc"))
    with pytest.raises(IntegrityError) as caught:
        collect([short], is_lib, tmp_path / "out", "p.tar.xz")
    assert caught.value.message == "p.tar.xz is corrupt or truncated: lib/a.so.1: 3 of 5 bytes"
