"""Damaged packages meet the libraries that read them: what arpy, python-debian and rpmfile
raise on them becomes an IntegrityError, exit 4 on the command line, with nothing staged.

The packages are built by tests/host/test_packages.py's byte-level builders and then damaged at
one known place each.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from qnnctl.errors import IntegrityError
from qnnctl.host.needs import missing_host_libraries
from qnnctl.host.packages import collect, deb_info, deb_members, package_members, rpm_info, rpm_members
from qnnctl.host.staged import TRIO
from tests.conftest import run_qnnctl
from tests.host.test_packages import TREE, Entry, ar_archive, build_deb, build_rpm, rpm_tree, tar_bytes, wanted
from tests.sdkfactory import VERSION, compile_shared, install_tree_into_cache

# tarfile's reading of headers (extended ones bounded by overriding its own steps), zlib, lzma, gzip:
# the same on every Python the README names.
pytestmark = pytest.mark.stdlib

CONTROL = b"Package: libc++1-14\nVersion: 1:14.0.6-99\nArchitecture: amd64\n"


def control_tar(compression: str = "gz") -> bytes:
    return tar_bytes([Entry("./"), Entry("./control", CONTROL)], compression)


def deb_of(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.write_bytes(ar_archive(members))
    return path


def good_members() -> list[tuple[str, bytes]]:
    return [("debian-binary", b"2.0\n"), ("control.tar.gz", control_tar()), ("data.tar.xz", tar_bytes(TREE))]


def set_ar_field(data: bytearray, member: int, start: int, width: int, value: bytes) -> None:
    """Overwrite one field of the `member`-th ar header (0-based), padded with spaces."""
    position = 8
    for _ in range(member):
        size = int(data[position + 48 : position + 58])
        position += 60 + size + (size & 1)
    data[position + start : position + start + width] = value.ljust(width)


# -- the ar table (arpy) -------------------------------------------------------------------


def negative_size(path: Path) -> Path:
    """A size of -60 points the next header back at this one: arpy and python-debian's ArFile
    would read it for ever."""
    data = bytearray(ar_archive(good_members()))
    set_ar_field(data, 1, 48, 10, b"-60")
    path.write_bytes(bytes(data))
    return path


def size_not_a_number(path: Path) -> Path:
    data = bytearray(ar_archive(good_members()))
    set_ar_field(data, 2, 48, 10, b"12ab")
    path.write_bytes(bytes(data))
    return path


def header_cut_short(path: Path) -> Path:
    """A last member header that the file ends inside of."""
    path.write_bytes(ar_archive(good_members()) + b"extra.txt       0   ")
    return path


def mtime_not_a_number(path: Path) -> Path:
    data = bytearray(ar_archive(good_members()))
    set_ar_field(data, 0, 16, 12, b"yesterday")
    path.write_bytes(bytes(data))
    return path


# -- the .deb's parts (python-debian) ------------------------------------------------------


def no_data_part(path: Path) -> Path:
    return deb_of(path, good_members()[:2])


def two_data_parts(path: Path) -> Path:
    return deb_of(path, [*good_members(), ("data.tar.gz", tar_bytes(TREE, "gz"))])


def unknown_compression(path: Path) -> Path:
    return deb_of(path, [*good_members()[:2], ("data.tar.lz4", b"\x04\x22\x4d\x18" + bytes(40))])


def info_part_not_first(path: Path) -> Path:
    members = good_members()
    return deb_of(path, [members[1], members[0], members[2]])


def damaged_control_tar(path: Path) -> Path:
    members = good_members()
    bad = bytearray(members[1][1])
    bad[len(bad) // 2 :] = bytes(len(bad) - len(bad) // 2)
    return deb_of(path, [members[0], ("control.tar.gz", bytes(bad)), members[2]])


DEB_DAMAGE: list[tuple[Callable[[Path], Path], str]] = [
    (negative_size, "runs past the end"),
    (size_not_a_number, "bad ar member header"),
    (header_cut_short, "bad ar member header"),
    (mtime_not_a_number, "bad ar member header"),
    (no_data_part, "missing required part"),
    (two_data_parts, "too many parts"),
    (unknown_compression, "missing required part"),
    (info_part_not_first, "first member is not debian-binary"),
    (damaged_control_tar, "corrupt"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("make", "message"), DEB_DAMAGE, ids=[m.__name__ for m, _ in DEB_DAMAGE])
def test_damaged_deb_is_an_integrity_error(tmp_path: Path, make: Callable[[Path], Path], message: str) -> None:
    deb = make(tmp_path / "p.deb")
    with pytest.raises(IntegrityError, match=message) as caught:
        deb_info(deb)
    assert deb.name in caught.value.message
    if make is not damaged_control_tar:  # the data part is sound there
        with pytest.raises(IntegrityError, match=message):
            collect(deb_members(deb), wanted, tmp_path / "out", deb.name)


@pytest.mark.parametrize("compression", ["xz", "gz", "bz2", "zst"])
def test_damaged_data_part_of_every_compression(tmp_path: Path, compression: str) -> None:
    """Each decompressor's own error (bz2's is a bare OSError) is an IntegrityError."""
    bad = bytearray(tar_bytes(TREE, compression))
    bad[len(bad) // 2] ^= 0xFF
    deb = build_deb(tmp_path / "p.deb", "x", "1", TREE, compression, data_member=bytes(bad))
    with pytest.raises(IntegrityError, match="corrupt"):
        collect(package_members(deb), wanted, tmp_path / "out", deb.name)


def test_zstd_parts_are_read_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ubuntu's dpkg writes control.tar.zst and data.tar.zst; python-debian would run `unzstd`."""
    deb = deb_of(tmp_path / "p.deb", [("debian-binary", b"2.0\n"), ("control.tar.zst", control_tar("zst")),
                                      ("data.tar.zst", tar_bytes(TREE, "zst"))])
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools-here"))
    assert deb_info(deb).package == "libc++1-14"
    found = collect(deb_members(deb), wanted, tmp_path / "out", deb.name)
    assert found.resolve("usr/lib64/libc++.so.1") == "usr/lib/llvm-14/lib/libc++.so.1.0"


def test_zstd_data_cut_where_a_member_ends_is_corrupt(tmp_path: Path) -> None:
    """data.tar.zst in two frames, the second cut after its header: the tar read would end
    where the libraries' members begin, as a shorter tar with nothing wrong in it."""
    zstandard = pytest.importorskip("zstandard")
    tar = tar_bytes(TREE, "")
    before_libraries = 2 * 512  # "./" and "./usr/": a header each
    second = zstandard.ZstdCompressor().compress(tar[before_libraries:])
    data = zstandard.ZstdCompressor().compress(tar[:before_libraries]) + second[:8]
    deb = deb_of(tmp_path / "p.deb", [("debian-binary", b"2.0\n"), ("control.tar.gz", control_tar()),
                                      ("data.tar.zst", data)])
    with pytest.raises(IntegrityError) as caught:
        collect(deb_members(deb), wanted, tmp_path / "out", deb.name)
    assert caught.value.message == "p.deb is corrupt or truncated: zstd: the data ends inside a frame"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("libc++*"))


# -- RPM headers (rpmfile) -----------------------------------------------------------------


def rpm_layout(data: bytes) -> tuple[int, int]:
    """Where the signature header and the main header start."""
    count, size = struct.unpack(">II", data[96 + 8 : 96 + 16])
    main = 96 + 16 + 16 * count + size
    return 96, main + (-main % 8)


def damaged_rpm(path: Path, damage: Callable[[bytearray, int], None]) -> Path:
    rpm = build_rpm(path, "glibc", "2.36", "1.el9", rpm_tree())
    data = bytearray(rpm.read_bytes())
    damage(data, rpm_layout(bytes(data))[1])
    rpm.write_bytes(bytes(data))
    return rpm


def tag_outside_the_store(data: bytearray, main: int) -> None:
    struct.pack_into(">I", data, main + 16 + 8, 1 << 20)  # the first tag's offset


def string_without_an_end(data: bytearray, main: int) -> None:
    count, size = struct.unpack(">II", data[main + 8 : main + 16])
    store = main + 16 + 16 * count
    # The first tag (the name) now points at the last byte of the store, with no NUL after it.
    struct.pack_into(">I", data, main + 16 + 8, size - 1)
    data[store + size - 1] = ord("x")


def string_of_no_count(data: bytearray, main: int) -> None:
    struct.pack_into(">I", data, main + 16 + 12, 0)  # the name's count


def main_magic(data: bytearray, main: int) -> None:
    data[main + 1] = 0  # \x8e kept, \xad gone: rpmfile's own check is an `assert`


def main_magic_unsigned(data: bytearray, main: int) -> None:
    """The same, in a package whose signature holds no sha256 of the header to catch it."""
    struct.pack_into(">I", data, 96 + 16, 9999)  # the signature's first tag, its sha256
    main_magic(data, main)


def main_magic_first_byte(data: bytearray, main: int) -> None:
    data[main] = 0  # rpmfile looks further on for a \x8e byte


def signature_magic(data: bytearray, main: int) -> None:
    data[97] = 0


def header_cut_short_rpm(data: bytearray, main: int) -> None:
    del data[main + 20 :]


RPM_DAMAGE: list[tuple[Callable[[bytearray, int], None], str]] = [
    (tag_outside_the_store, "bad RPM header"),
    (string_without_an_end, "bad RPM header"),
    (string_of_no_count, "bad RPM header"),
    (main_magic, "bad RPM header"),
    (main_magic_unsigned, "bad RPM header"),
    (main_magic_first_byte, "RPM header"),
    (signature_magic, "bad RPM header magic"),
    (header_cut_short_rpm, "runs past the end"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("damage", "message"), RPM_DAMAGE, ids=[d.__name__ for d, _ in RPM_DAMAGE])
def test_damaged_rpm_header_is_an_integrity_error(tmp_path: Path, damage: Callable[[bytearray, int], None],
                                                  message: str) -> None:
    rpm = damaged_rpm(tmp_path / "glibc.rpm", damage)
    with pytest.raises(IntegrityError, match=message):
        with open(rpm, "rb") as handle:
            rpm_info(handle, rpm.name)
    with pytest.raises(IntegrityError):
        list(rpm_members(rpm))


def test_rpm_header_values_of_every_shape(tmp_path: Path) -> None:
    """rpmfile gives bytes, lists of bytes and ints: each is read as qnnctl reads the tag."""
    rpm = build_rpm(tmp_path / "glibc.rpm", "glibc", "2.36", "1.el9", rpm_tree(), "zstd")
    with open(rpm, "rb") as handle:
        info = rpm_info(handle, rpm.name)
        assert handle.tell() == info.payload_offset
    assert (info.name, info.version, info.release, info.arch, info.compressor) == (
        "glibc", "2.36", "1.el9", "x86_64", "zstd")
    assert info.payload_sha256 is not None
    assert len(info.payload_sha256) == 64
    assert {m.name for m in package_members(rpm)} >= {"usr/lib/llvm-14/lib/libc++.so.1.0"}


# -- on the command line: exit 4, nothing staged -------------------------------------------


def stub_trio(folder: Path) -> None:
    for soname in TRIO:
        stem = soname.split(".")[0].replace("+", "x")
        compile_shared(folder / soname, f"int {stem}_stub(void) {{ return 7; }}\n", extra=[f"-Wl,-soname,{soname}"])


def nothing_staged(cache_dir: Path) -> None:
    for sub in ("runtime", "tmp"):
        folder = cache_dir / sub
        assert not folder.exists() or list(folder.iterdir()) == []


COMMAND_LINE = [
    ("deb", negative_size),
    ("deb", size_not_a_number),
    ("deb", two_data_parts),
    ("rpm", tag_outside_the_store),
    ("rpm", string_without_an_end),
    ("rpm", main_magic),
    ("rpm", main_magic_unsigned),
]


@pytest.mark.parametrize("optimize", ["", "1"], ids=["asserts", "python-O"])
@pytest.mark.parametrize(("kind", "make"), COMMAND_LINE, ids=[f"{k}-{m.__name__}" for k, m in COMMAND_LINE])
def test_damaged_package_exits_4(tmp_path: Path, cache_dir: Path, kind: str, make: Callable[..., object],
                                 optimize: str) -> None:
    """Under `python -O` too, where rpmfile's `assert` on the header magic is gone."""
    if not missing_host_libraries(TRIO, []):
        pytest.skip("this host has libc++.so.1 and friends, so `install --runtime` reads no package")
    install_tree_into_cache(cache_dir)
    if kind == "deb":
        bad = make(tmp_path / "libc++1-14.deb")
    else:
        bad = damaged_rpm(tmp_path / "glibc-2.36-1.el9.x86_64.rpm", make)  # type: ignore[arg-type]
    good = tmp_path / "good"
    stub_trio(good)
    env = {**os.environ, "PYTHONOPTIMIZE": optimize} if optimize else None
    proc = run_qnnctl("install", VERSION, "--runtime", "--runtime-from", str(bad),
                      "--runtime-from", str(good), env=env, timeout=60)
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == ""
    assert "nothing was staged" in proc.stderr
    assert "Traceback" not in proc.stderr
    nothing_staged(cache_dir)
