"""Safe extraction: real zip and tar archives, well-formed, corrupt and hostile."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tarfile
import tracemalloc
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

import qnnctl.install.archive
import qnnctl.install.pool
from qnnctl.errors import DiskSpaceError, IntegrityError, NoHostLibrariesError
from qnnctl.files import space_margin
from qnnctl.install.archive import extract
from qnnctl.install.memberdata import COPY_BUFFER, crc32_digest, digest_matches
from qnnctl.sdk.work import work_folder
from tests.conftest import run_qnnctl
from tests.sdkfactory import (
    VERSION,
    SdkSpec,
    add_tar_entry,
    add_zip_entry,
    build_archive,
    build_sdk_tree,
    long_name_chain,
    manifest_digest,
    write_zip_from_tree,
)

# Their outcome depends on the standard library (zip and tar reading and writing).
pytestmark = pytest.mark.stdlib

TOP = f"qairt/{VERSION}"
LIB = f"{TOP}/lib/x86_64-linux-clang"


_T = TypeVar("_T")

def _work(tmp_path: Path) -> Path:
    """An extraction folder as deep below tmp_path as the CLI's (cache/tmp/<id>/x)."""
    return tmp_path / "cache" / "tmp" / "w" / "x"


# -- well-formed archives --------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["zip", "tar.gz", "tgz", "tar.xz", "tar"])
def test_extract_keeps_modes_links_and_records_digests(tmp_path: Path, fmt: str) -> None:
    archive = build_archive(tmp_path, fmt)
    result = extract(archive, _work(tmp_path))
    root = result.root
    assert root == _work(tmp_path) / TOP
    assert result.top == TOP
    assert result.version == VERSION
    tool = root / "bin/x86_64-linux-clang/qnn-net-run"
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "QNN_README.txt").stat().st_mode) & 0o111 == 0
    link = root / "lib/x86_64-linux-clang/libQnnHtp.so.2"
    assert link.is_symlink()
    assert os.readlink(link) == "libQnnHtp.so"
    assert link.resolve() == (root / "lib/x86_64-linux-clang/libQnnHtp.so").resolve()
    regular = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    assert set(result.files) == regular
    for name, digest in result.files.items():
        assert digest == manifest_digest((root / name).read_bytes()), name
    assert result.size == sum((root / name).stat().st_size for name in result.files)
    assert (root / "lib/x86_64-linux-clang/libQnnHtp.so").read_bytes()[:4] == b"\x7fELF"


def test_zip_members_with_a_long_name_or_extra_field_are_extracted(tmp_path: Path) -> None:
    """A local header longer than what is read with it at first (a long name, an extra field of
    some tool's own) is read whole before the data."""
    archive = build_archive(tmp_path, "zip")
    long_name = f"{TOP}/docs/" + "/".join(["d" * 200] * 3) + ".txt"
    with zipfile.ZipFile(archive, "a") as zf:
        add_zip_entry(zf, long_name, b"long name\n" * 100, stat.S_IFREG | 0o644)
        info = zipfile.ZipInfo(f"{TOP}/docs/extra.txt", date_time=(2025, 7, 24, 0, 0, 0))
        info.extra = struct.pack("<HH", 0xCAFE, 600) + bytes(600)
        zf.writestr(info, b"extra field\n" * 100, zipfile.ZIP_DEFLATED)
    root = extract(archive, _work(tmp_path)).root
    assert (root / long_name.removeprefix(f"{TOP}/")).read_bytes() == b"long name\n" * 100
    assert (root / "docs/extra.txt").read_bytes() == b"extra field\n" * 100


def test_zip_member_names_are_read_as_their_flag_says(tmp_path: Path) -> None:
    """A name flagged UTF-8 is UTF-8 (zipfile flags names that are not ASCII); one without the
    flag is CP437, as old zip tools write it: each compares with its local header and is kept."""
    archive = build_archive(tmp_path, "zip")
    with zipfile.ZipFile(archive, "a") as zf:
        add_zip_entry(zf, f"{TOP}/docs/über-€.txt", b"utf-8\n", stat.S_IFREG | 0o644)
        add_zip_entry(zf, f"{TOP}/docs/old-u.txt", b"cp437\n", stat.S_IFREG | 0o644)
    data = archive.read_bytes()
    plain = f"{TOP}/docs/old-u.txt".encode()
    assert data.count(plain) == 2  # the local header and the central directory
    archive.write_bytes(data.replace(plain, f"{TOP}/docs/old-\x81.txt".encode("latin-1")))
    root = extract(archive, _work(tmp_path)).root
    assert (root / "docs/über-€.txt").read_bytes() == b"utf-8\n"
    assert (root / "docs/old-ü.txt").read_bytes() == b"cp437\n"


@pytest.mark.parametrize(("cores", "threads"), [(1, 2), (4, 4), (64, 8)])
def test_extraction_threads_follow_the_cores_this_process_may_run_on(monkeypatch: pytest.MonkeyPatch,
                                                                     cores: int, threads: int) -> None:
    from qnnctl.install import pool

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert pool.extraction_threads() == threads


def test_extraction_threads_count_the_cores_where_no_affinity_tells(monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl.install import pool

    def unknown(pid: int) -> set[int]:
        raise OSError(errno.ENOSYS, "sched_getaffinity is not available")

    monkeypatch.setattr(os, "sched_getaffinity", unknown)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert pool.extraction_threads() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # it cannot tell either
    assert pool.extraction_threads() == pool.MIN_THREADS


def test_top_folder_is_detected_not_assumed(tmp_path: Path) -> None:
    """The SDK folder is the one that holds lib/x86_64-linux-clang, whatever it is called."""
    archive = build_archive(tmp_path, "zip", SdkSpec(top="some/other/place-2.37.0.250724"))
    with zipfile.ZipFile(archive, "a") as zf:
        add_zip_entry(zf, "README-first.txt", b"not part of the SDK", stat.S_IFREG | 0o644)
    result = extract(archive, _work(tmp_path))
    assert result.top == "some/other/place-2.37.0.250724"
    assert result.version == VERSION
    assert "README-first.txt" not in result.files
    assert (result.root / "QNN_README.txt").is_file()


def _rezipped(archive: Path, first: list[zipfile.ZipInfo]) -> Path:
    """`archive` written again with the members `first` (empty) before its own."""
    again = archive.with_name(f"again-{archive.name}")
    with zipfile.ZipFile(archive) as zf, zipfile.ZipFile(again, "w") as out:
        for info in first:
            out.writestr(info, b"")
        for info in zf.infolist():
            out.writestr(info, zf.read(info))
    return again


def test_a_member_named_as_the_archive_itself_is_passed_over(tmp_path: Path) -> None:
    """`./` first, as `zip -r x.zip .` writes it: no member of its own, and the rest follow."""
    archive = build_archive(tmp_path, "zip")
    itself = zipfile.ZipInfo("./", date_time=(2025, 7, 24, 0, 0, 0))
    itself.create_system, itself.external_attr = 3, (stat.S_IFDIR | 0o755) << 16 | 0x10
    result = extract(_rezipped(archive, [itself]), _work(tmp_path))
    assert result.files == extract(archive, _work(tmp_path / "plain")).files


def test_a_member_from_another_system_has_no_unix_mode(tmp_path: Path) -> None:
    """The mode is in external_attr's high bits only for an archive made on Unix: elsewhere
    they mean nothing (here they look like a symlink's), and the member is a plain file."""
    archive = build_archive(tmp_path, "zip")
    info = zipfile.ZipInfo(f"{TOP}/share/from-windows.txt", date_time=(2025, 7, 24, 0, 0, 0))
    info.create_system, info.external_attr = 0, (stat.S_IFLNK | 0o777) << 16 | 0x20
    result = extract(_rezipped(archive, [info]), _work(tmp_path))
    written = result.root / "share" / "from-windows.txt"
    assert not written.is_symlink()
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert "share/from-windows.txt" in result.files


def test_folder_entries_are_folders_with_the_one_folder_mode(tmp_path: Path) -> None:
    """A folder entry made on Unix is a folder of qnnctl's one folder mode (0755, whatever the
    archive says); one made elsewhere has no mode, only its name's trailing slash, and is a
    folder all the same."""
    archive = build_archive(tmp_path, "zip")
    private = zipfile.ZipInfo(f"{TOP}/share/private/", date_time=(2025, 7, 24, 0, 0, 0))
    private.create_system, private.external_attr = 3, (stat.S_IFDIR | 0o550) << 16 | 0x10
    windows = zipfile.ZipInfo(f"{TOP}/share/from-windows/", date_time=(2025, 7, 24, 0, 0, 0))
    windows.create_system, windows.external_attr = 0, 0x10
    result = extract(_rezipped(archive, [private, windows]), _work(tmp_path))
    assert stat.S_IMODE((result.root / "share" / "private").stat().st_mode) == 0o755
    assert (result.root / "share" / "from-windows").is_dir()
    assert result.files == extract(archive, _work(tmp_path / "plain")).files


def test_top_folder_without_a_version(tmp_path: Path) -> None:
    result = extract(build_archive(tmp_path, "tar.xz", SdkSpec(top="qairt/latest")), _work(tmp_path))
    assert result.top == "qairt/latest"
    assert result.version is None


@pytest.mark.parametrize("fmt", ["zip", "tar.gz"])
def test_an_sdk_at_the_archives_root_is_recorded_whole(tmp_path: Path, fmt: str) -> None:
    """No folder above lib/x86_64-linux-clang: every member is the SDK's, recorded by its own name."""
    archive = build_archive(tmp_path, fmt, SdkSpec(top=""))
    work = _work(tmp_path)
    result = extract(archive, work)
    assert (result.root, result.top, result.version) == (work, ".", None)
    regular = {str(p.relative_to(work)) for p in work.rglob("*") if p.is_file() and not p.is_symlink()}
    assert set(result.files) == regular
    assert "lib/x86_64-linux-clang/libQnnHtp.so" in regular
    assert result.size == sum((work / name).stat().st_size for name in result.files)


def test_in_tree_links_are_kept(tmp_path: Path) -> None:
    """Links that stay in the SDK (to a file, to a folder, up and back down) are recreated."""
    staging = tmp_path / "staging"
    build_sdk_tree(staging / TOP)
    archive = tmp_path / "links.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(staging / "qairt", arcname="qairt")
        add_tar_entry(tf, f"{TOP}/docs/latest", kind=tarfile.SYMTYPE, linkname="../share")
        add_tar_entry(tf, f"{TOP}/include/QNN/up", kind=tarfile.SYMTYPE, linkname="../../lib/x86_64-linux-clang")
        add_tar_entry(tf, f"{TOP}/bin/readme-copy", kind=tarfile.LNKTYPE, linkname=f"{TOP}/QNN_README.txt")
    result = extract(archive, _work(tmp_path))
    root = result.root
    assert (root / "docs/latest").is_symlink()
    assert (root / "docs/latest").resolve() == (root / "share").resolve()
    assert (root / "include/QNN/up/libQnnHtp.so").is_file()
    copy = root / "bin/readme-copy"
    # A hard link inside the SDK becomes a copy: the tree shares no inode with anything.
    assert not copy.is_symlink()
    assert copy.read_bytes() == (root / "QNN_README.txt").read_bytes()
    assert copy.stat().st_ino != (root / "QNN_README.txt").stat().st_ino
    assert result.files["bin/readme-copy"] == result.files["QNN_README.txt"]


def test_members_are_streamed_not_read_whole(tmp_path: Path) -> None:
    """Memory does not grow with member size: a 48 MiB member costs a few MiB at most."""
    archive = _zip_with_zeros(tmp_path, zipfile.ZIP_DEFLATED, 48 << 20)
    result, peak = _traced(lambda: extract(archive, _work(tmp_path)))
    assert (result.root / "share/zeros.bin").stat().st_size == 48 << 20
    assert peak < 12 << 20, f"peak {peak >> 20} MiB while extracting a 48 MiB member"


def test_an_extraction_that_follows_a_fetch_holds_smaller_blocks(tmp_path: Path) -> None:
    """Its threads share this process (no forked workers): each holds a quarter of the usual
    block, so that four 4 MiB members in two threads take under 3 MiB (about 6 in 1 MiB blocks)."""
    archive = build_archive(tmp_path, "zip")
    with zipfile.ZipFile(archive, "a") as zf:
        for index in range(4):
            zf.writestr(f"{TOP}/share/noise{index}.bin", os.urandom(4 << 20), compress_type=zipfile.ZIP_DEFLATED)
    _, peak = _traced(lambda: extract(archive, _work(tmp_path), ready=lambda info: None, kind="zip"))
    assert peak < 3 << 20, f"peak {peak >> 10} KiB while following a fetch"


def test_an_extraction_that_follows_a_fetch_takes_the_members_in_the_archives_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """They arrive in that order: a member that sorts first by name but comes last in the
    archive is waited for last."""
    archive = build_archive(tmp_path, "zip")
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr(f"{TOP}/0-last-in-the-archive.txt", b"last\n")
    monkeypatch.setattr("qnnctl.install.archive.extraction_threads", lambda: 1)
    offsets: list[int] = []
    extract(archive, _work(tmp_path), ready=lambda info: offsets.append(info.header_offset), kind="zip")
    assert len(offsets) > 2
    assert offsets == sorted(offsets)


def _traced(run: Callable[[], _T]) -> tuple[_T, int]:
    """run() under tracemalloc: what it returns, and the most memory it held at once."""
    tracemalloc.start()
    try:
        result = run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def test_bzip2_and_lzma_members_are_read_from_the_archive_as_opened(tmp_path: Path) -> None:
    """bzip2 and lzma members are read from the archive opened for the checks, even when the
    threads that write them come after its path is gone."""
    staging = tmp_path / "staging"
    build_sdk_tree(staging / TOP)
    archive = tmp_path / "methods.zip"
    expected = {}
    with zipfile.ZipFile(archive, "w") as zf:
        for index, path in enumerate(sorted(p for p in staging.rglob("*") if p.is_file())):
            info = zipfile.ZipInfo(str(path.relative_to(staging)), date_time=(2025, 7, 24, 0, 0, 0))
            info.create_system = 3
            info.external_attr = (stat.S_IFREG | stat.S_IMODE(path.stat().st_mode)) << 16
            info.compress_type = (zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)[index % 2]
            zf.writestr(info, path.read_bytes())
            expected[str(path.relative_to(staging / TOP))] = manifest_digest(path.read_bytes())

    def ready(info: zipfile.ZipInfo) -> None:
        archive.unlink(missing_ok=True)

    result = extract(archive, _work(tmp_path), ready=ready, kind="zip")
    assert result.files == expected


# -- the record of each file --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sha256", "crc32"])
def test_a_file_of_several_blocks_is_verified_whole(tmp_path: Path, kind: str) -> None:
    """`doctor --verify` reads a file block by block: the sha256, or the CRC-32 an earlier
    qnnctl recorded, runs over every block, so a change in any of them is seen."""
    data = os.urandom(2 * COPY_BUFFER + 4096)
    path = tmp_path / "libQnnHtp.so"
    path.write_bytes(data)
    recorded = manifest_digest(data) if kind == "sha256" else crc32_digest(zlib.crc32(data))
    assert digest_matches(path, recorded)
    for place in (10, COPY_BUFFER + 10):  # in the first block, then only in the second
        damaged = bytearray(data)
        damaged[place] ^= 0x01
        path.write_bytes(damaged)
        assert not digest_matches(path, recorded), place


@pytest.mark.parametrize("kind", ["sha256", "crc32"])
def test_verifying_a_large_file_holds_one_block_in_memory(tmp_path: Path, kind: str) -> None:
    """By its sha256 or by the CRC-32 an earlier qnnctl recorded."""
    size = 48 << 20
    path = tmp_path / "libQnnHtp.so"
    with open(path, "wb") as handle:
        handle.truncate(size)  # 48 MiB of zeros, without writing them
    recorded = manifest_digest(bytes(size)) if kind == "sha256" else crc32_digest(zlib.crc32(bytes(size)))
    matches, peak = _traced(lambda: digest_matches(path, recorded))
    assert matches
    assert peak < 4 * COPY_BUFFER, f"peak {peak >> 20} MiB while verifying a {size >> 20} MiB file"


@pytest.mark.parametrize("mode", ["zip-empty", "zip", "w:", "w:gz", "w:xz", "w:bz2"])
def test_an_archives_kind_comes_from_its_magic_bytes(tmp_path: Path, mode: str) -> None:
    """A zip (an empty one is only its end record), a plain tar (`ustar` at byte 257), and a tar
    compressed with gzip, xz or bzip2; named .bin, so nothing comes from the name."""
    from qnnctl.install.archive import archive_kind

    path = tmp_path / "archive.bin"
    if mode.startswith("zip"):
        with zipfile.ZipFile(path, "w") as zf:
            if mode == "zip":
                zf.writestr("a.txt", "a")
    else:
        with tarfile.open(path, mode) as tf:  # type: ignore[call-overload]
            data = b"a"
            info = tarfile.TarInfo("a.txt")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert archive_kind(path) == ("zip" if mode.startswith("zip") else "tar")


@pytest.mark.parametrize("head", [b"<html><body>Sign in</body></html>", b"", b"PK\x01\x02", b"\x1f"])
def test_a_file_that_is_no_archive_is_refused_with_what_to_do(tmp_path: Path, head: bytes) -> None:
    """An error page saved under the archive's name, an empty file, or the first bytes of a
    kind cut short: refused whole, with what to do."""
    from qnnctl.install.archive import archive_kind

    path = tmp_path / "v2.37.0.250724.zip"
    path.write_bytes(head)
    with pytest.raises(IntegrityError) as caught:
        archive_kind(path)
    assert (caught.value.message, caught.value.hint) == (
        f"{path} is not a zip or tar archive", "the file may be corrupt or an error page; download it again")


def test_an_archives_kind_is_read_from_its_first_bytes_alone(tmp_path: Path) -> None:
    """A 1-2 GB archive: what kind it is comes from its start, not from reading it whole."""
    from qnnctl.install.archive import archive_kind

    path = tmp_path / "sdk.bin"
    with open(path, "wb") as handle:
        handle.write(b"PK\x03\x04")
        handle.truncate(48 << 20)
    tracemalloc.start()
    try:
        kind = archive_kind(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (kind, peak < 64 << 10) == ("zip", True), f"peak {peak} bytes"


# -- corrupt and truncated archives -----------------------------------------------------


def _truncate(path: Path, keep: float) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def _flip_in_payload(path: Path) -> Path:
    """Change one byte inside a zip member's compressed data (not in any header)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{TOP}/docs/payload.bin")
    # Local header: 30 bytes + name + extra, then the data.
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def garble_deflate(path: Path) -> Path:
    """Make a deflated member's data something that does not inflate at all (where a flipped
    byte in stored data only breaks the CRC)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{TOP}/docs/text.txt")
    assert info.compress_type == zipfile.ZIP_DEFLATED
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start:start + 8] = b"\xff" * 8  # block type 3: reserved, an error for every inflater
    path.write_bytes(bytes(data))
    return path


PAYLOAD_SPEC = SdkSpec(extra_files={"docs/payload.bin": os.urandom(256 << 10),
                                    "docs/text.txt": b"the quick brown fox jumps over the lazy dog\n" * 5000})


@pytest.mark.parametrize(("fmt", "damage"), [
    ("zip", lambda p: _truncate(p, 0.5)),
    ("zip", _flip_in_payload),
    ("zip", garble_deflate),
    ("tar.gz", lambda p: _truncate(p, 0.5)),
    ("tar.xz", lambda p: _truncate(p, 0.5)),
    ("tar.gz", lambda p: _truncate(p, 0.999)),
], ids=["zip-truncated", "zip-bad-crc", "zip-bad-deflate", "tar.gz-truncated", "tar.xz-truncated", "tar.gz-last-bytes"])
def test_corrupt_archives_are_integrity_errors(tmp_path: Path, fmt: str,
                                               damage: Callable[[Path], Path]) -> None:
    archive = damage(build_archive(tmp_path, fmt, PAYLOAD_SPEC))
    with pytest.raises(IntegrityError, match=rf"^v{re.escape(VERSION)}\.\S+ is corrupt or truncated: ") as caught:
        extract(archive, _work(tmp_path))
    assert caught.value.exit_code == 4
    assert caught.value.hint == "nothing was installed; download the archive again"
    if fmt != "zip":
        # A tar is read as one stream, in order: what is missing is the end of it.
        assert caught.value.message == f"{archive.name} is corrupt or truncated: unexpected end of data"


def _central_entry(data: bytearray, name: str) -> int:
    """Where member `name`'s central directory entry starts."""
    at = 0
    while True:
        at = data.index(b"PK\x01\x02", at)
        (name_len,) = struct.unpack_from("<H", data, at + 28)
        if data[at + 46:at + 46 + name_len] == name.encode():
            return at
        at += 4


def _compressed_size(size: Callable[[int], int]) -> Callable[[bytearray, zipfile.ZipInfo], None]:
    """A damage: the central directory gives the member size(its compressed size) bytes."""
    def damage(data: bytearray, info: zipfile.ZipInfo) -> None:
        struct.pack_into("<I", data, _central_entry(data, info.filename) + 20, size(info.compress_size))
    return damage


def _header_at(where: Callable[[int, zipfile.ZipInfo], int]) -> Callable[[bytearray, zipfile.ZipInfo], None]:
    """A damage: the central directory puts the member's local header at where(file size, info)."""
    def damage(data: bytearray, info: zipfile.ZipInfo) -> None:
        struct.pack_into("<I", data, _central_entry(data, info.filename) + 42, where(len(data), info))
    return damage


def _encrypted(data: bytearray, info: zipfile.ZipInfo) -> None:
    """A damage: the member's local header says its data is encrypted (flag bit 0)."""
    (flags,) = struct.unpack_from("<H", data, info.header_offset + 6)
    struct.pack_into("<H", data, info.header_offset + 6, flags | 1)


def _renamed_locally(data: bytearray, info: zipfile.ZipInfo) -> None:
    """A damage: the member's local header gives it another name (its last letter in upper case)."""
    at = info.header_offset + 30 + len(info.filename.encode()) - 1
    data[at] = ord(chr(data[at]).upper())


@pytest.mark.parametrize(("member", "damage", "said"), [
    ("docs/text.txt", _compressed_size(lambda size: size // 2), "{name!r} ends early"),  # deflated data cut mid-stream
    ("docs/payload.bin", _compressed_size(lambda size: 0x7FFFFFF0), "{name!r} is cut short"),  # data past the end
    ("docs/text.txt", _header_at(lambda end, info: end - 10), "{name!r} is cut short"),  # header past the end
    ("docs/text.txt", _header_at(lambda end, info: info.header_offset + 1), "bad local header for {name!r}"),
    ("docs/text.txt", _encrypted, "{name!r} is encrypted or patched data"),
    ("docs/text.txt", _renamed_locally, "{name!r} has another name in its local header"),
], ids=["deflate-ends-early", "data-past-the-end", "header-past-the-end", "no-local-header", "encrypted", "renamed"])
def test_a_zip_member_that_cannot_be_read_is_named(tmp_path: Path, member: str,
                                                   damage: Callable[[bytearray, zipfile.ZipInfo], None],
                                                   said: str) -> None:
    archive = build_archive(tmp_path, "zip", PAYLOAD_SPEC)
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo(f"{TOP}/{member}")
    data = bytearray(archive.read_bytes())
    damage(data, info)
    archive.write_bytes(bytes(data))
    # Refused as an archive that readers would read two ways, before any member is read...
    with pytest.raises(IntegrityError, match=re.escape(repr(info.filename))):
        extract(archive, _work(tmp_path))
    # ...and, read piecewise (where the fetcher checks each member as it comes), by the extractor.
    with pytest.raises(IntegrityError) as caught:
        extract(archive, tmp_path / "piecewise", whole=False)
    assert caught.value.message == f"{archive.name} is corrupt or truncated: {said.format(name=info.filename)}"


def test_a_large_zip_member_is_read_a_block_at_a_time(tmp_path: Path) -> None:
    """Only a small member's data is read along with its local header: a large one's is read
    block by block, never whole."""
    from qnnctl.install.memberdata import member_data as _member_data

    archive = tmp_path / "large.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("large.bin", bytes(16 * COPY_BUFFER))
        info = zf.getinfo("large.bin")
    fd = os.open(archive, os.O_RDONLY)
    tracemalloc.start()
    try:
        data = _member_data(fd, info)
        assert data is not None
        read = 0
        while block := data.read(COPY_BUFFER):
            read += len(block)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        os.close(fd)
    assert read == 16 * COPY_BUFFER
    assert peak < 3 * COPY_BUFFER, f"peak {peak >> 20} MiB while reading a {16} MiB member"


def _deflated_with_empty_blocks(first: bytes, then: bytes) -> bytes:
    """Raw deflate of `first` + `then` with 64 empty stored blocks between them, as a writer that
    flushes often leaves: input that inflates to nothing."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    head = compressor.compress(first) + compressor.flush(zlib.Z_SYNC_FLUSH)  # ends on a byte
    return head + b"\x00\x00\x00\xff\xff" * 64 + compressor.compress(then) + compressor.flush()


def _member(stream: bytes, size: int, crc: int) -> Any:
    from qnnctl.install.memberdata import MemberData as _MemberData

    return _MemberData(lambda offset, n: stream[offset:offset + n], 0, len(stream), size, crc,
                       zipfile.ZIP_DEFLATED, "m.bin", b"")


def test_a_zip_member_is_read_past_data_that_inflates_to_nothing() -> None:
    """A block of input that yields no output is not the end: reading goes on to the member's end."""
    first, then = os.urandom(100), b"the rest " * 50
    data = _member(_deflated_with_empty_blocks(first, then), len(first + then), zlib.crc32(first + then))
    read = b""
    while block := data.read(16):  # blocks of input smaller than the run of empty ones
        read += block
    assert read == first + then
    data.verify(zlib.crc32(read), len(read))


def test_a_zip_member_that_inflates_past_its_size_stops_there() -> None:
    """A member that inflates to more than the archive says (a zip bomb's way) is refused while it
    is read, counted over all its blocks, not when it is whole."""
    first, then = os.urandom(100), b"the rest " * 50
    data = _member(_deflated_with_empty_blocks(first, then), len(first + then) - 1, zlib.crc32(first + then))
    handed: list[bytes] = []

    def read_all() -> None:
        while block := data.read(16):
            handed.append(block)

    with pytest.raises(zipfile.BadZipFile) as caught:
        read_all()
    assert str(caught.value) == "'m.bin' is longer than the archive says"
    assert len(b"".join(handed)) <= len(first + then) - 1  # no byte past what the archive says was handed on


def test_not_an_archive(tmp_path: Path) -> None:
    page = tmp_path / "v2.37.0.250724.zip"
    page.write_bytes(b"<!DOCTYPE html><html>log in</html>")
    with pytest.raises(IntegrityError, match="not a zip or tar"):
        extract(page, _work(tmp_path))


def test_archive_without_an_sdk(tmp_path: Path) -> None:
    archive = tmp_path / "other.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        add_zip_entry(zf, "qairt/2.37.0.250724/README.txt", b"hello", stat.S_IFREG | 0o644)
    with pytest.raises(IntegrityError) as caught:
        extract(archive, _work(tmp_path))
    assert (caught.value.message, caught.value.hint) == (
        "the archive holds no SDK: no member under lib/x86_64-linux-clang/",
        "check that it is a Qualcomm AI Runtime (QAIRT) SDK archive")


def test_of_two_folders_with_sdk_libraries_the_shallowest_is_the_sdk(tmp_path: Path) -> None:
    """An SDK with an example that carries its own lib/x86_64-linux-clang deeper down, sorting first."""
    archive = tmp_path / "two.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in ("a/examples/app/lib/x86_64-linux-clang/libApp.so", "z/lib/x86_64-linux-clang/libQnnHtp.so"):
            add_zip_entry(zf, name, b"\x7fELF", stat.S_IFREG | 0o644)
    assert extract(archive, _work(tmp_path)).top == "z"


def test_extraction_checks_free_space_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = build_archive(tmp_path, "zip")
    real = shutil.disk_usage

    def tiny(path: Any) -> Any:
        usage = real(path)
        # Less than the SDK and the smallest margin: 10 MiB was too little only while the
        # margin was a fixed 64 MiB.
        return usage._replace(free=1 << 20)

    monkeypatch.setattr(shutil, "disk_usage", tiny)
    work = _work(tmp_path)
    with pytest.raises(DiskSpaceError) as caught:
        extract(archive, work)
    assert caught.value.message.startswith(f"not enough free space in {work} to extract the archive: ")
    assert caught.value.free == 1 << 20
    assert list(work.iterdir()) == []  # checked before anything was written


def test_tar_extraction_needs_three_times_the_archive_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tar's uncompressed size is known only at its end: three times the archive is asked
    for (with the margin), before anything is written. (Of an archive that unpacks to less than
    that: its bytes do not compress.)"""
    archive = build_archive(tmp_path, "tar.gz", SdkSpec(extra_files={"docs/noise.bin": os.urandom(256 << 10)}))
    needed = 3 * archive.stat().st_size
    wanted = needed + space_margin(needed)
    real = shutil.disk_usage
    free = wanted - 1
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=free))
    work = _work(tmp_path)
    with pytest.raises(DiskSpaceError) as caught:
        extract(archive, work)
    assert (caught.value.needed, caught.value.free) == (wanted, free)
    assert caught.value.message == (f"not enough free space in {work} to extract the archive: "
                                    f"need {wanted / (1 << 20):.1f} MiB, {free / (1 << 20):.1f} MiB free")
    assert list(work.iterdir()) == []
    free = wanted  # just enough
    assert (extract(archive, work).root / "sdk.yaml").is_file()


def test_past_three_times_its_size_each_tar_member_is_held_to_the_free_space(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' SDK unpacks to about 14 times its tar.gz: with three times free, and the margin,
    the member that goes past it is refused from its header, before it is written."""
    archive = build_archive(tmp_path, "tar.gz")
    needed = 3 * archive.stat().st_size
    free = needed + space_margin(needed)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=free))
    with pytest.raises(DiskSpaceError) as caught:
        extract(archive, _work(tmp_path))
    assert caught.value.free == free
    assert caught.value.needed is not None
    assert caught.value.needed > free


@pytest.mark.parametrize("fmt", ["zip", "tar"])
def test_an_archive_with_another_hosts_libraries_only_holds_no_sdk_for_this_host(tmp_path: Path, fmt: str) -> None:
    """Linux aarch64's libraries alone (as an SDK built for an aarch64 board ships them): not "no
    SDK", but none for this host, named, with the host's folder and exit 5."""
    archive = tmp_path / f"v{VERSION}.{fmt}"
    name = f"{TOP}/lib/aarch64-oe-linux-gcc11.2/libQnnHtp.so"
    if fmt == "zip":
        with zipfile.ZipFile(archive, "w") as zf:
            add_zip_entry(zf, name, b"\x7fELF", stat.S_IFREG | 0o644)
    else:
        with tarfile.open(archive, "w") as tf:
            info = tarfile.TarInfo(name)
            info.size = 4
            tf.addfile(info, io.BytesIO(b"\x7fELF"))
    with pytest.raises(NoHostLibrariesError) as caught:
        extract(archive, _work(tmp_path))
    assert (caught.value.message, caught.value.hint, caught.value.exit_code) == (
        "the archive has host libraries for Linux aarch64 (lib/aarch64-oe-linux-gcc11.2/) only, none for this Linux "
        "x86_64 host (lib/x86_64-linux-clang/)",
        "use an SDK archive with lib/x86_64-linux-clang/, or install it on one of the hosts it has libraries for", 5)


def test_a_file_that_starts_as_an_empty_zip_is_read_as_a_zip_and_refused_as_damaged(tmp_path: Path) -> None:
    """Its first bytes are a zip's end record (a zip of no member starts so), then a megabyte of
    something else: told as a damaged zip, not as no archive at all."""
    archive = tmp_path / "v.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18) + b"\xff" * (1 << 20))
    with pytest.raises(IntegrityError) as caught:
        extract(archive, _work(tmp_path))
    assert caught.value.message.endswith("v.zip is corrupt or truncated: no end of central directory record: not a "
                                         "zip archive, or cut short"), caught.value.message


def _tar_that_unpacks_to(tmp_path: Path, times: int, more: int = 0) -> tuple[Path, int]:
    """The tests' SDK as a tar.gz with a file of zeros, padded past its end (where a tar reader
    never reads) to a size S at which its files come to exactly `times` * S bytes, and `more`."""
    base = build_archive(tmp_path / "base", "tar.gz")
    with tarfile.open(base) as tf:
        files = sum(member.size for member in tf if member.isreg())
    size = max(2 * base.stat().st_size, -(-files // times))
    spec = SdkSpec(extra_files={"docs/zeros.bin": bytes(times * size + more - files)})
    archive = build_archive(tmp_path / "sized", "tar.gz", spec)
    assert archive.stat().st_size <= size
    with open(archive, "ab") as out:
        out.write(bytes(size - archive.stat().st_size))
    return archive, size


@pytest.mark.parametrize("more", [0, 1], ids=["twenty-times", "a-byte-more"])
def test_a_tar_may_unpack_to_twenty_times_its_size_and_no_more(tmp_path: Path, more: int) -> None:
    archive, size = _tar_that_unpacks_to(tmp_path, 20, more)
    work = _work(tmp_path)
    if not more:
        assert (extract(archive, work).root / "sdk.yaml").is_file()
        return
    with pytest.raises(IntegrityError) as caught:
        extract(archive, work)
    assert caught.value.message == f"unsafe archive: it unpacks to more than 20 times its {size} bytes, as no SDK does"


@pytest.mark.parametrize("more", [0, 1], ids=["three-times", "a-byte-more"])
def test_past_three_times_its_size_each_tar_member_is_held_to_what_is_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, more: int) -> None:
    """Three times the archive is asked for up front; once its files go past that, each member is
    held to the free space left, from its header: a disk that filled up after the first look (here
    nothing is left) refuses the member that goes past, and none before it."""
    archive, _ = _tar_that_unpacks_to(tmp_path, 3, more)
    real = shutil.disk_usage
    looks: list[Any] = []

    def usage(path: Any) -> Any:
        looks.append(path)
        return real(path) if len(looks) == 1 else real(path)._replace(free=0)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    work = _work(tmp_path)
    if not more:
        assert (extract(archive, work).root / "sdk.yaml").is_file()
        assert len(looks) == 1
        return
    with pytest.raises(DiskSpaceError) as caught:
        extract(archive, work)
    assert caught.value.message.startswith(f"not enough free space in {work} to extract the archive: need "), \
        caught.value.message
    assert caught.value.free == 0


@pytest.mark.parametrize("chain", [400, 9])
def test_a_tar_whose_extended_headers_pass_the_bounds_is_refused_as_damaged(tmp_path: Path, chain: int) -> None:
    """Each GNU long name has tarfile read the next header from inside its own reading: 400 of
    them ran Python out of stack (an unexpected error); more than 8 in a row are refused."""
    archive = tmp_path / f"v{VERSION}.tar"
    archive.write_bytes(long_name_chain(TOP, chain))
    with pytest.raises(IntegrityError) as caught:
        extract(archive, _work(tmp_path))
    assert "more than 8 extended tar headers in a row" in caught.value.message, caught.value.message


def test_a_tar_that_unpacks_to_more_than_any_sdk_is_refused_before_the_member_is_written(tmp_path: Path) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tf:
        info = tarfile.TarInfo(f"{TOP}/lib/bomb.so")
        info.size = 64 << 20
        tf.addfile(info, io.BytesIO(bytes(info.size)))  # zeros: about a thousand times smaller
    archive = tmp_path / f"v{VERSION}.tar.gz"
    archive.write_bytes(data.getvalue())
    work = _work(tmp_path)
    with pytest.raises(IntegrityError) as caught:
        extract(archive, work)
    assert caught.value.message == (f"unsafe archive: it unpacks to more than 20 times its {len(data.getvalue())} "
                                    "bytes, as no SDK does")
    assert not list(work.rglob("bomb.so"))


@pytest.mark.parametrize("fmt", ["zip", "tar.gz"])
def test_a_disk_that_fills_up_while_extracting_is_told_as_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               fmt: str) -> None:
    """Something else filled the disk after the check: writes there fail with ENOSPC (in every
    process extracting), told as a full disk with what is left, not as a damaged archive."""
    archive = build_archive(tmp_path, fmt)
    work = _work(tmp_path)
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(f"{work}/"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    real_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real_usage(path)._replace(free=1 << 30))
    with pytest.raises(DiskSpaceError) as caught:
        extract(archive, work)
    assert caught.value.message == f"ran out of space in {work} while trying to extract the archive (1024.0 MiB free)"
    assert (caught.value.needed, caught.value.free) == (None, 1 << 30)


@contextlib.contextmanager
def chmods_under_umask(monkeypatch: pytest.MonkeyPatch, umask: int) -> Iterator[list[int]]:
    """Within: this process's umask is `umask`, and the list gets the modes os.fchmod is called
    with here (it still changes them)."""
    changed: list[int] = []
    real_fchmod = os.fchmod

    def fchmod(fd: int, mode: int) -> None:
        changed.append(mode)
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", fchmod)
    old = os.umask(umask)
    try:
        yield changed
    finally:
        os.umask(old)


def test_a_file_whose_mode_the_umask_leaves_whole_is_not_chmod_again(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The umask, read once, saves a system call for each of an SDK's thousands of files where
    it takes no bit of the file's mode (022 and modes 644 and 755 here)."""
    archive = build_archive(tmp_path, "tar.gz")  # written in this process: the calls are seen here
    with chmods_under_umask(monkeypatch, 0o022) as changed:
        result = extract(archive, _work(tmp_path))
    assert stat.S_IMODE((result.root / "bin/x86_64-linux-clang/qnn-net-run").stat().st_mode) == 0o755
    assert changed == []


def test_the_umask_is_read_in_a_process_with_a_name_not_in_ascii() -> None:
    """/proc/self/status begins with the process's name, as bytes: a program run as `./модель`
    is named in UTF-8. The fields after it are still read."""
    script = ("import ctypes, os; import qnnctl.install.pool as pool; os.umask(0o027); "
              "ctypes.CDLL(None).prctl(15, 'модель'.encode(), 0, 0, 0); "  # PR_SET_NAME
              "print(open('/proc/self/status', 'rb').readline(), pool.proc_status('Umask'))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [repr("Name:\tмодель\n".encode()), "0027"]


@pytest.mark.parametrize("umask_field", [None, "unknown"], ids=["missing", "not-octal"])
def test_a_umask_the_system_does_not_tell_makes_every_mode_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 umask_field: str | None) -> None:
    """A kernel before 4.7 has no Umask in /proc/self/status: with the umask not known, every
    file is chmod to its mode, never left to a guess."""
    real_status = qnnctl.install.pool.proc_status
    monkeypatch.setattr(qnnctl.install.archive, "proc_status",
                        lambda field: umask_field if field == "Umask" else real_status(field))
    archive = build_archive(tmp_path, "tar.gz")
    with chmods_under_umask(monkeypatch, 0o022) as changed:
        result = extract(archive, _work(tmp_path))
    assert stat.S_IMODE((result.root / "bin/x86_64-linux-clang/qnn-net-run").stat().st_mode) == 0o755
    assert {0o755, 0o644} <= set(changed)


# -- hostile archives ---------------------------------------------------------------------


class Member(NamedTuple):
    name: str
    kind: str  # file, symlink, hardlink, chardev, fifo
    data: bytes = b""
    target: str = ""


_ZIP_MODES = {"file": stat.S_IFREG | 0o644, "symlink": stat.S_IFLNK | 0o777,
              "chardev": stat.S_IFCHR | 0o644, "fifo": stat.S_IFIFO | 0o644}
_TAR_KINDS = {"file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
              "chardev": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}


def hostile_archive(tmp_path: Path, fmt: str, members: list[Member], top: str = TOP) -> Path:
    """A valid SDK archive (in the folder `top`) with `members` added after the SDK's own files."""
    staging = tmp_path / "hostile-staging"
    build_sdk_tree(staging / top)
    archive = tmp_path / f"v{VERSION}.{fmt}"
    if fmt == "zip":
        from tests.sdkfactory import write_zip_from_tree

        write_zip_from_tree(staging, archive)
        with zipfile.ZipFile(archive, "a") as zf:
            for m in members:
                data = m.target.encode() if m.kind == "symlink" else m.data
                add_zip_entry(zf, m.name, data, _ZIP_MODES[m.kind])
    else:
        with tarfile.open(archive, "w:gz") as tf:
            tf.add(staging / "qairt", arcname="qairt")
            for m in members:
                add_tar_entry(tf, m.name, m.data, kind=_TAR_KINDS[m.kind], linkname=m.target)
    shutil.rmtree(staging)
    return archive


@pytest.mark.parametrize("fmt", ["zip", "tar.gz"])
def test_links_beside_the_sdk_folder_are_left_out_not_refused(tmp_path: Path, fmt: str) -> None:
    """A link outside the SDK's folder (a `latest` beside it, as release trees have; in a tar,
    a hard link between two files there too) is not part of the SDK: neither made nor refused."""
    members = [Member("qairt/latest", "symlink", target=VERSION)]
    if fmt == "tar.gz":
        members += [Member("qairt/NOTICE.txt", "file", b"notice"),
                    Member("qairt/NOTICE-copy.txt", "hardlink", target="qairt/NOTICE.txt")]
    members.append(Member(f"{TOP}/docs/readme", "symlink", target="../QNN_README.txt"))  # inside, after them
    result = extract(hostile_archive(tmp_path, fmt, members), _work(tmp_path))
    assert result.top == TOP
    assert not os.path.lexists(result.root.parent / "latest")
    assert not os.path.lexists(result.root.parent / "NOTICE-copy.txt")
    assert os.readlink(result.root / "docs/readme") == "../QNN_README.txt"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert result.files == extract(hostile_archive(plain, fmt, []), _work(plain)).files


@dataclass(frozen=True)
class Hostile:
    members: Callable[[Path], list[Member]]  # given tmp_path
    # The refusal after "unsafe archive: ", {t} standing for tmp_path: the check that must catch
    # the case, since another check refusing it for another reason would hide the loss of this one.
    refusal: str
    formats: tuple[str, ...] = ("zip", "tar.gz")


# Six levels up from <cache>/tmp/<id>/x/qairt/<version> is tmp_path: escapes land there.
UP = "../../../../../.."
_CHAIN = [Member(f"{TOP}/l1", "symlink", target=".")] + [
    Member(f"{TOP}/l{i}", "symlink", target=f"l{i - 1}/..") for i in range(2, 8)
]
_CHAIN_REFUSAL = f"symlink {TOP}/l2 -> l1/.. points outside the SDK"

HOSTILE: dict[str, Hostile] = {
    "zip-slip": Hostile(lambda t: [Member(f"{TOP}/{UP}/escaped.txt", "file", b"pwned")],
                        f"member path '{TOP}/{UP}/escaped.txt' leaves the archive"),
    "zip-slip-from-root": Hostile(lambda t: [Member("../../../../escaped.txt", "file", b"pwned")],
                                  "member path '../../../../escaped.txt' leaves the archive"),
    "absolute-path": Hostile(lambda t: [Member(f"{t}/escaped.txt", "file", b"pwned")],
                             "absolute member path '{t}/escaped.txt'"),
    "symlink-relative-then-file": Hostile(lambda t: [
        Member(f"{TOP}/share/out", "symlink", target=f"../{UP}"),
        Member(f"{TOP}/share/out/escaped.txt", "file", b"pwned"),
    ], f"symlink {TOP}/share/out -> ../{UP} points outside the SDK"),
    "symlink-absolute-then-file": Hostile(lambda t: [
        Member(f"{TOP}/share/out", "symlink", target=str(t)),
        Member(f"{TOP}/share/out/escaped.txt", "file", b"pwned"),
    ], f"symlink {TOP}/share/out -> '{{t}}' points outside the SDK"),
    "symlink-to-a-system-file": Hostile(lambda t: [Member(f"{LIB}/libc.so", "symlink", target="/etc/passwd")],
                                        f"symlink {LIB}/libc.so -> '/etc/passwd' points outside the SDK"),
    # A folder beside the SDK whose name starts with the SDK's: outside, though its path has the
    # SDK's path as a prefix.
    "symlink-into-a-sibling-folder": Hostile(lambda t: [
        Member(f"{TOP}-evil/escaped.txt", "file", b"pwned"),
        Member(f"{LIB}/libQnnEvil.so", "symlink", target=f"../../../{VERSION}-evil/escaped.txt"),
    ], f"symlink {LIB}/libQnnEvil.so -> ../../../{VERSION}-evil/escaped.txt points outside the SDK"),
    "symlink-to-a-sibling-folder-then-file": Hostile(lambda t: [
        Member(f"{TOP}-evil/keep.txt", "file", b"x"),
        Member(f"{TOP}/share/sibling", "symlink", target=f"../../{VERSION}-evil"),
        Member(f"{TOP}/share/sibling/escaped.txt", "file", b"pwned"),
    ], f"symlink {TOP}/share/sibling -> ../../{VERSION}-evil points outside the SDK"),
    "symlink-two-step": Hostile(lambda t: [
        Member(f"{TOP}/a", "symlink", target="."),
        Member(f"{TOP}/b", "symlink", target="a/.."),
    ], f"symlink {TOP}/b -> a/.. points outside the SDK"),
    # Each link looks inside on its own; together they climb out and a link is then made
    # through the last one.
    "symlink-chain-then-link": Hostile(lambda t: [*_CHAIN, Member(f"{TOP}/l7/escaped.txt", "symlink",
                                                                  target="whatever")], _CHAIN_REFUSAL),
    "symlink-chain-then-hardlink": Hostile(lambda t: [*_CHAIN, Member(f"{TOP}/l7/escaped.txt", "hardlink",
                                                                      target=f"{TOP}/QNN_README.txt")],
                                           _CHAIN_REFUSAL, formats=("tar.gz",)),
    "hardlink-absolute": Hostile(lambda t: [Member(f"{TOP}/victim", "hardlink", target=str(t / "victim.txt")),
                                            Member(f"{TOP}/victim", "file", b"pwned")],
                                 "absolute member path '{t}/victim.txt'", formats=("tar.gz",)),
    "hardlink-relative": Hostile(lambda t: [Member(f"{TOP}/victim", "hardlink", target=f"{UP}/victim.txt")],
                                 f"member path '{UP}/victim.txt' leaves the archive", formats=("tar.gz",)),
    "hardlink-outside-the-sdk": Hostile(lambda t: [Member("qairt/elsewhere.txt", "file", b"x"),
                                                   Member(f"{TOP}/victim", "hardlink",
                                                          target="qairt/elsewhere.txt")],
                                        f"hard link {TOP}/victim -> qairt/elsewhere.txt leaves the SDK",
                                        formats=("tar.gz",)),
    "char-device": Hostile(lambda t: [Member(f"{TOP}/share/null", "chardev")],
                           f"'{TOP}/share/null' is a device or special file"),
    "fifo": Hostile(lambda t: [Member(f"{TOP}/share/pipe", "fifo")], f"'{TOP}/share/pipe' is a device or special file"),
}

HOSTILE_CASES = [
    pytest.param(name, fmt, id=f"{name}-{fmt}")
    for name, case in HOSTILE.items()
    for fmt in case.formats
]


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"original")
    return victim


def _assert_nothing_escaped(tmp_path: Path, victim: Path) -> None:
    escaped = [p for p in tmp_path.rglob("escaped*")]
    assert escaped == [], escaped
    assert victim.read_bytes() == b"original"
    assert victim.stat().st_nlink == 1


@pytest.mark.parametrize(("case", "fmt"), HOSTILE_CASES)
def test_hostile_archive_is_refused_by_install(tmp_path: Path, cache_dir: Path, case: str, fmt: str) -> None:
    victim = _victim(tmp_path)
    archive = hostile_archive(tmp_path, fmt, HOSTILE[case].members(tmp_path))
    result = run_qnnctl("install", "--file", str(archive))
    assert result.returncode == 4, result.stderr
    assert "unsafe archive: " + HOSTILE[case].refusal.format(t=tmp_path) in result.stderr
    assert result.stdout == ""
    _assert_nothing_escaped(tmp_path, victim)
    assert list((cache_dir / "sdks").iterdir()) == []
    assert list((cache_dir / "tmp").iterdir()) == []


@pytest.mark.parametrize(("case", "fmt"), HOSTILE_CASES)
def test_hostile_archive_is_refused_by_extract(tmp_path: Path, case: str, fmt: str) -> None:
    victim = _victim(tmp_path)
    archive = hostile_archive(tmp_path, fmt, HOSTILE[case].members(tmp_path))
    with pytest.raises(IntegrityError) as caught, work_folder(_work(tmp_path).parent) as work:
        extract(archive, work / "x")
    assert caught.value.message == "unsafe archive: " + HOSTILE[case].refusal.format(t=tmp_path)
    _assert_nothing_escaped(tmp_path, victim)
    assert not _work(tmp_path).parent.exists()


@pytest.mark.parametrize(("fmt", "name", "what"), [
    # Only a pax header carries a NUL: a zip's name and a tar's own field end at the first one.
    ("tar.gz", f"{TOP}/{'n' * 100}\x00.txt", "member name {!r} contains NUL"),
    ("tar.gz", "/tmp/escaped.txt", "absolute member path {!r}"),
    ("zip", "C:/escaped.txt", "absolute member path {!r}"),
    ("tar.gz", "C:", "absolute member path {!r}"),
    ("zip", f"{TOP}/../../escaped.txt", "member path {!r} leaves the archive"),
], ids=["nul", "absolute", "drive", "drive-alone", "dot-dot"])
def test_an_unsafe_member_name_is_named_in_the_refusal(tmp_path: Path, fmt: str, name: str, what: str) -> None:
    archive = hostile_archive(tmp_path, fmt, [Member(name, "file", b"pwned")])
    with pytest.raises(IntegrityError) as caught, work_folder(_work(tmp_path).parent) as work:
        extract(archive, work / "x")
    assert caught.value.message == "unsafe archive: " + what.format(name)
    assert caught.value.hint == "the archive was not installed; get it from a trusted source"


@pytest.mark.parametrize("end", [" ", "X"])
def test_a_link_into_a_sibling_named_as_the_sdk_without_its_last_character_is_refused(tmp_path: Path,
                                                                                      end: str) -> None:
    """The SDK's folder is `qairt/<version> ` (or `...X`): its sibling `qairt/<version>` is
    outside it, though it starts with the SDK's path less its last character."""
    top = f"{TOP}{end}"
    archive = hostile_archive(tmp_path, "zip", [
        Member(f"{TOP}/escaped.txt", "file", b"pwned"),
        Member(f"{top}/lib/x86_64-linux-clang/libQnnEvil.so", "symlink", target=f"../../../{VERSION}/escaped.txt"),
    ], top=top)
    with pytest.raises(IntegrityError, match="points outside the SDK"):
        extract(archive, _work(tmp_path))


@pytest.mark.parametrize("fmt", ["zip", "tar.gz"])
def test_a_device_file_is_refused_by_name(tmp_path: Path, fmt: str) -> None:
    archive = hostile_archive(tmp_path, fmt, [Member(f"{TOP}/share/null", "chardev")])
    with pytest.raises(IntegrityError) as refused:
        extract(archive, _work(tmp_path))
    assert (refused.value.message, refused.value.hint) == (
        f"unsafe archive: '{TOP}/share/null' is a device or special file",
        "the archive was not installed; get it from a trusted source")


def test_link_made_before_its_redirect_is_checked_at_the_end(tmp_path: Path) -> None:
    """b -> a/.. is harmless while a does not exist; a -> . made later turns it outward."""
    archive = hostile_archive(tmp_path, "tar.gz", [
        Member(f"{TOP}/b", "symlink", target="a/.."),
        Member(f"{TOP}/a", "symlink", target="."),
    ])
    with pytest.raises(IntegrityError, match="leads outside"):
        extract(archive, _work(tmp_path))


@pytest.mark.parametrize(("members", "said"), [
    # b -> a/.. is inside while a does not exist; a -> . then turns b outward, under b/x.
    ([Member(f"{TOP}/b", "symlink", target="a/.."), Member(f"{TOP}/a", "symlink", target="."),
      Member(f"{TOP}/b/x", "symlink", target="y")], f"symlink {TOP}/b/x would be written outside the SDK"),
    ([Member(f"{TOP}/b", "symlink", target="a/.."), Member(f"{TOP}/a", "symlink", target="."),
      Member(f"{TOP}/b/x", "hardlink", target=f"{TOP}/QNN_README.txt")],
     f"hard link {TOP}/b/x would be written outside the SDK"),
    ([Member("qairt/elsewhere.txt", "file", b"x"), Member(f"{TOP}/victim", "hardlink", target="qairt/elsewhere.txt")],
     f"hard link {TOP}/victim -> qairt/elsewhere.txt leaves the SDK"),
    ([Member(f"{TOP}/docs/sub/x.txt", "file", b"x"),
      Member(f"{TOP}/docs/sub", "hardlink", target=f"{TOP}/QNN_README.txt")],
     f"{TOP}/docs/sub is both a folder and a link"),
    # A hard link's source must be a file the archive wrote: a symlink (to a file inside) is none.
    ([Member(f"{TOP}/docs/readme", "symlink", target="../QNN_README.txt"),
      Member(f"{TOP}/docs/copy", "hardlink", target=f"{TOP}/docs/readme")],
     f"hard link {TOP}/docs/copy -> {TOP}/docs/readme leaves the SDK"),
], ids=["symlink-written-outside", "hard-link-written-outside", "hard-link-leaves", "hard-link-over-a-folder",
        "hard-link-to-a-symlink"])
def test_a_refused_link_is_named_with_its_kind(tmp_path: Path, members: list[Member], said: str) -> None:
    with pytest.raises(IntegrityError) as caught:
        extract(hostile_archive(tmp_path, "tar.gz", members), _work(tmp_path))
    assert caught.value.message == f"unsafe archive: {said}"


@pytest.mark.parametrize(("fmt", "target"), [("tar.gz", "/etc/passwd"), ("zip", "lib\x00.so"), ("zip", "")],
                         ids=["absolute", "nul", "empty"])
def test_a_symlink_target_that_is_no_relative_path_is_refused_as_it_is(tmp_path: Path, fmt: str, target: str) -> None:
    """Named as written (repr: a NUL shows): never resolved, where a NUL would stop realpath()."""
    archive = hostile_archive(tmp_path, fmt, [Member(f"{TOP}/lib/evil.so", "symlink", target=target)])
    with pytest.raises(IntegrityError) as caught:
        extract(archive, _work(tmp_path))
    assert caught.value.message == f"unsafe archive: symlink {TOP}/lib/evil.so -> {target!r} points outside the SDK"


def test_name_used_for_a_folder_and_a_link(tmp_path: Path) -> None:
    archive = hostile_archive(tmp_path, "tar.gz", [Member(f"{TOP}/share", "symlink", target="docs")])
    with pytest.raises(IntegrityError, match=f"^unsafe archive: {TOP}/share is both a folder and a link$"):
        extract(archive, _work(tmp_path))


@pytest.mark.parametrize(("fmt", "error"), [("zip", "Is a directory"), ("tar.gz", "File exists")])
def test_file_then_folder_of_the_same_name(tmp_path: Path, fmt: str, error: str) -> None:
    """A zip's folders are made before its files (the file fails), a tar's in its order."""
    archive = hostile_archive(tmp_path, fmt, [Member(f"{TOP}/QNN_README.txt/inner", "file", b"x")])
    work = _work(tmp_path)
    with pytest.raises(IntegrityError) as refused:
        extract(archive, work)
    assert (refused.value.message, refused.value.hint) == (
        f"{archive.name} is malformed: {error}: {work / TOP / 'QNN_README.txt'}",
        "the archive was not installed; get it from a trusted source")


def test_overlong_zip_symlink_target(tmp_path: Path) -> None:
    archive = hostile_archive(tmp_path, "zip", [Member(f"{TOP}/long", "symlink", target="a/" * 4000)])
    with pytest.raises(IntegrityError) as refused:
        extract(archive, _work(tmp_path))
    assert refused.value.message == f"unsafe archive: symlink '{TOP}/long' has a target longer than 4096 bytes"


def test_a_zip_symlink_target_of_4096_bytes_is_not_refused_as_longer(tmp_path: Path) -> None:
    """PATH_MAX is the most a target may hold: one of exactly that many bytes goes on to the
    system, whose symlink() refuses it (the terminating NUL counts there)."""
    archive = hostile_archive(tmp_path, "zip", [Member(f"{TOP}/long", "symlink", target="./" * 2048)])
    with pytest.raises(IntegrityError) as refused:
        extract(archive, _work(tmp_path))
    assert refused.value.message.startswith(f"{archive.name} is malformed: a member's name is too long: ./././")


@pytest.mark.parametrize("fmt", ["zip", "tgz"])
def test_a_symlink_target_that_is_not_utf8_is_made_byte_for_byte(tmp_path: Path, fmt: str) -> None:
    """Linux names are bytes: a target of any bytes but NUL and `/`-escapes is a target."""
    target = b"libQnnHtp\xff.so"
    if fmt == "zip":
        archive = build_archive(tmp_path, "zip")
        with zipfile.ZipFile(archive, "a") as zf:
            add_zip_entry(zf, f"{TOP}/lib/x86_64-linux-clang/alias.so", target, stat.S_IFLNK | 0o777)
    else:
        archive = hostile_archive(tmp_path, "tgz", [Member(f"{TOP}/lib/x86_64-linux-clang/alias.so", "symlink",
                                                          target=os.fsdecode(target))])
    result = extract(archive, _work(tmp_path))
    assert os.readlink(os.fsencode(result.root / "lib/x86_64-linux-clang/alias.so")) == target


def test_the_target_of_a_zip_symlink_is_read_no_further_than_the_longest_a_path_may_be(tmp_path: Path) -> None:
    """A "symlink" member that inflates to 64 MiB: 4097 bytes of it are read, and it is refused."""
    archive = build_archive(tmp_path, "zip")
    with zipfile.ZipFile(archive, "a") as zf:
        info = zipfile.ZipInfo(f"{TOP}/share/huge-link", date_time=(2025, 7, 24, 0, 0, 0))
        info.create_system, info.external_attr = 3, (stat.S_IFLNK | 0o777) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w") as out:
            block = b"a/" * (1 << 19)
            for _ in range(64):
                out.write(block)
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError, match="has a target longer than 4096 bytes"):
            extract(archive, _work(tmp_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak >> 20} MiB while reading the target of a 64 MiB symlink member"


def _zip_with_zeros(tmp_path: Path, method: int, size: int = 64 << 20) -> Path:
    """The SDK's zip with a member `share/zeros.bin` of `size` zero bytes compressed with `method`."""
    archive = build_archive(tmp_path, "zip")
    with zipfile.ZipFile(archive, "a") as zf:
        info = zipfile.ZipInfo(f"{TOP}/share/zeros.bin", date_time=(2025, 7, 24, 0, 0, 0))
        info.compress_type = method
        with zf.open(info, "w") as out:
            for _ in range(size >> 20):
                out.write(bytes(1 << 20))
    return archive


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA], ids=["bzip2", "lzma"])
def test_a_bzip2_or_lzma_member_is_inflated_block_by_block(tmp_path: Path, method: int) -> None:
    """64 MiB of zeros in a few KiB: zipfile would inflate it whole in one read (and a hostile
    member to gigabytes); here the memory is a block and the decoder's own (LZMA's dictionary:
    8 MiB as zipfile writes it; the decoders take theirs from Python's allocator)."""
    archive = _zip_with_zeros(tmp_path, method)
    result, peak = _traced(lambda: extract(archive, _work(tmp_path)))
    assert (result.root / "share/zeros.bin").stat().st_size == 64 << 20
    assert result.files["share/zeros.bin"] == manifest_digest(bytes(64 << 20))
    assert peak < 16 << 20, f"peak {peak >> 20} MiB while writing a 64 MiB member"


def _member_data_offset(archive: Path, name: str) -> int:
    """Where the data of the member `name` starts in `archive`."""
    with zipfile.ZipFile(archive) as zf:
        offset = int(zf.getinfo(name).header_offset)
    head = archive.read_bytes()[offset:offset + 30]
    name_len, extra_len = struct.unpack("<2H", head[26:30])
    return offset + 30 + int(name_len) + int(extra_len)


def _zip_with_raw_member(tmp_path: Path, data: bytes, method: int, content: bytes | None = None) -> tuple[Path, str]:
    """The SDK's zip with a member `share/odd.bin` whose data is `data` as it stands, said to
    be compressed with `method` (and, given `content`, to hold it: its CRC-32 and size)."""
    archive = build_archive(tmp_path, "zip")
    name = f"{TOP}/share/odd.bin"
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr(name, data)  # stored
    raw = bytearray(archive.read_bytes())
    local = _member_data_offset(archive, name) - 30 - len(name)
    central = raw.rindex(b"PK\x01\x02", 0, raw.rindex(name.encode()))
    for header, method_at in ((local, 8), (central, 10)):
        raw[header + method_at:header + method_at + 2] = struct.pack("<H", method)
        if content is not None:  # the CRC-32, then (after the compressed size) the size
            raw[header + method_at + 6:header + method_at + 10] = struct.pack("<I", zlib.crc32(content))
            raw[header + method_at + 14:header + method_at + 18] = struct.pack("<I", len(content))
    archive.write_bytes(raw)
    return archive, name


def test_a_member_of_another_compression_method_is_refused_by_name(tmp_path: Path) -> None:
    """Method 99 (AES), which neither zipfile nor qnnctl reads: an error for the archive, not a crash."""
    archive, name = _zip_with_raw_member(tmp_path, b"x" * 1000, 99)
    with pytest.raises(IntegrityError) as caught:
        extract(archive, _work(tmp_path))
    assert caught.value.message == (f"{archive.name} is corrupt or truncated: '{name}' is compressed with "
                                    "method 99, which is none of stored, deflated, bzip2 and LZMA")


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA], ids=["bzip2", "lzma"])
def test_bytes_after_the_end_of_a_bzip2_or_lzma_stream_are_left_unread(tmp_path: Path, method: int) -> None:
    """As zlib leaves them for a deflated member (and zipfile, and unzip): the stream's end is
    the member's, which its CRC-32 and size then check. 1.5 MiB of them, so that some come in
    a read after the end."""
    content = b"the member's content\n" * 100
    if method == zipfile.ZIP_BZIP2:
        import bz2

        stream = bz2.compress(content)
    else:
        import lzma

        lzma1 = {"id": lzma.FILTER_LZMA1, "dict_size": 1 << 16, "lc": 3, "lp": 0, "pb": 2}
        # The zip header: a version, the properties' size, (pb * 5 + lp) * 9 + lc, the dictionary's size.
        header = struct.pack("<BBHBI", 9, 20, 5, (2 * 5 + 0) * 9 + 3, 1 << 16)
        stream = header + lzma.compress(content, format=lzma.FORMAT_RAW, filters=[lzma1])
    archive, _ = _zip_with_raw_member(tmp_path, stream + os.urandom(3 << 19), method, content)
    result = extract(archive, _work(tmp_path))
    assert (result.root / "share/odd.bin").read_bytes() == content


@pytest.mark.parametrize("data", [b"", b"\x09\x14\x05", b"\x09\x14\x05\x00\x5d\x00"],
                         ids=["empty", "in-its-size", "in-its-properties"])
def test_an_lzma_member_that_ends_in_its_header_is_a_corrupt_archive(tmp_path: Path, data: bytes) -> None:
    archive, name = _zip_with_raw_member(tmp_path, data, zipfile.ZIP_LZMA)
    with pytest.raises(IntegrityError) as caught:
        extract(archive, _work(tmp_path))
    assert caught.value.message == f"{archive.name} is corrupt or truncated: '{name}' ends in its LZMA header"


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA], ids=["bzip2", "lzma"])
def test_a_bzip2_or_lzma_member_larger_than_a_read_is_inflated_whole(tmp_path: Path, method: int) -> None:
    """4 MiB of zeros, then 1.5 MiB that do not compress: the reads of compressed data hold more
    than a block of output, which the decoder gives out a block at a time before it takes the
    next read (an LZMA header comes in reads of its own)."""
    content = bytes(4 << 20) + os.urandom(3 << 19)
    archive = build_archive(tmp_path, "zip")
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr(f"{TOP}/share/mixed.bin", content, compress_type=method)
    result = extract(archive, _work(tmp_path))
    assert (result.root / "share/mixed.bin").read_bytes() == content


@pytest.mark.parametrize(("method", "at", "patch", "said"), [
    # The decoder's own words follow: what it found wrong.
    (zipfile.ZIP_BZIP2, 40, b"\xff" * 8, "does not inflate: Invalid data stream"),
    (zipfile.ZIP_LZMA, 40, b"\xff" * 8, "does not inflate: Corrupt input data"),
    # The header: 2 bytes of version, 2 of the properties' size, the properties: lc, lp and pb
    # in one byte (below 9 * 5 * 5), the dictionary's size in 4.
    (zipfile.ZIP_LZMA, 2, b"\x06\x00", "has no valid LZMA properties"),
    (zipfile.ZIP_LZMA, 4, bytes([9 * 5 * 5]), "has no valid LZMA properties"),
    # lc 8, lp 4, pb 4: each in range, together more than liblzma takes (lc + lp > 4).
    (zipfile.ZIP_LZMA, 4, bytes([(4 * 5 + 4) * 9 + 8]), "does not inflate: Internal error"),
], ids=["bzip2", "lzma", "lzma-properties-size", "lzma-properties", "lzma-options"])
def test_a_damaged_bzip2_or_lzma_member_is_a_corrupt_archive(tmp_path: Path, method: int, at: int,
                                                              patch: bytes, said: str) -> None:
    archive = _zip_with_zeros(tmp_path, method, 4 << 20)
    data = bytearray(archive.read_bytes())
    start = _member_data_offset(archive, f"{TOP}/share/zeros.bin")
    data[start + at:start + at + len(patch)] = patch
    archive.write_bytes(data)
    with pytest.raises(IntegrityError) as caught:
        extract(archive, _work(tmp_path))
    assert caught.value.message.startswith(f"{archive.name} is corrupt or truncated: "), caught.value.message
    assert f"'{TOP}/share/zeros.bin' {said}" in caught.value.message, caught.value.message


def test_an_lzma_dictionary_of_3_gib_is_a_size_like_any_other(tmp_path: Path) -> None:
    """Its 4 bytes are unsigned; the decoder fills only as much of it as it writes."""
    archive = _zip_with_zeros(tmp_path, zipfile.ZIP_LZMA, 4 << 20)
    data = bytearray(archive.read_bytes())
    start = _member_data_offset(archive, f"{TOP}/share/zeros.bin")
    data[start + 5:start + 9] = struct.pack("<I", 3 << 30)
    archive.write_bytes(data)
    result = extract(archive, _work(tmp_path))
    assert result.files["share/zeros.bin"] == manifest_digest(bytes(4 << 20))


def test_tar_member_names_with_dot_prefix_are_fine(tmp_path: Path) -> None:
    """`tar -C dir -czf x.tgz .` stores ./qairt/...; that is not an escape."""
    staging = tmp_path / "s"
    build_sdk_tree(staging / TOP)
    archive = tmp_path / "dot.tgz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(staging, arcname=".")
    result = extract(archive, _work(tmp_path))
    assert result.top == TOP
    assert (result.root / "lib/x86_64-linux-clang/libQnnHtp.so").is_file()


def test_folders_of_a_tar_get_the_one_folder_mode(tmp_path: Path) -> None:
    """Writable by their owner, so that the tree can always be replaced or removed, and by
    no one else: 0750 and 0550 are taken as 0755, as 0777 is, whatever the umask (under 002,
    a folder made and left as made would be 0775)."""
    staging = tmp_path / "s"
    build_sdk_tree(staging / TOP)
    (staging / TOP / "docs").chmod(0o750)
    (staging / TOP / "include").chmod(0o550)
    (staging / TOP / "share").chmod(0o777)
    archive = tmp_path / "modes.tar"
    with tarfile.open(archive, "w") as tf:
        tf.add(staging / "qairt", arcname="qairt")
    (staging / TOP / "include").chmod(0o750)  # for the cleanup of tmp_path
    umask = os.umask(0o002)
    try:
        root = extract(archive, _work(tmp_path)).root
    finally:
        os.umask(umask)
    assert stat.S_IMODE((root / "docs").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "include").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "share").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "lib").stat().st_mode) == 0o755


def test_setuid_bits_are_dropped(tmp_path: Path) -> None:
    archive = tmp_path / "suid.tar"
    staging = tmp_path / "s"
    build_sdk_tree(staging / TOP)
    with tarfile.open(archive, "w") as tf:
        tf.add(staging / "qairt", arcname="qairt")
        info = tarfile.TarInfo(f"{TOP}/bin/x86_64-linux-clang/suid-tool")
        info.mode = 0o4755
        info.size = 3
        tf.addfile(info, io.BytesIO(b"#!\n"))
    result = extract(archive, _work(tmp_path))
    assert stat.S_IMODE((result.root / "bin/x86_64-linux-clang/suid-tool").stat().st_mode) == 0o755


def test_record_of_files_follows_links_that_replace_files(tmp_path: Path) -> None:
    """A link that replaces a file (through a linked folder) is not recorded as that file."""
    archive = hostile_archive(tmp_path, "tar.gz", [
        Member(f"{TOP}/docs/guide.txt", "file", b"old"),
        Member(f"{TOP}/manual", "symlink", target="docs"),
        Member(f"{TOP}/manual/guide.txt", "symlink", target="../QNN_README.txt"),
        Member(f"{TOP}/manual/copy.txt", "hardlink", target=f"{TOP}/QNN_README.txt"),
        Member(f"{TOP}/docs/old.txt", "file", b"replaced by a copy"),
        Member(f"{TOP}/manual/old.txt", "hardlink", target=f"{TOP}/QNN_README.txt"),
    ])
    result = extract(archive, _work(tmp_path))
    assert (result.root / "docs/guide.txt").is_symlink()
    assert "docs/guide.txt" not in result.files
    assert result.files["docs/copy.txt"] == result.files["QNN_README.txt"]
    assert "manual/copy.txt" not in result.files
    assert (result.root / "docs/old.txt").read_bytes() == (result.root / "QNN_README.txt").read_bytes()
    assert result.size == sum((result.root / name).stat().st_size for name in result.files)


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
def test_a_name_given_twice_is_the_last_of_its_members(tmp_path: Path, fmt: str) -> None:
    """As tar extracts it: the file holds the last member's data, and is recorded (and counted
    in the size) once, as that member. A zip is refused: readers disagree on which one is the
    member (zipfile's name lookup takes the last, a reader of local headers the first)."""
    with pytest.warns(UserWarning, match="Duplicate name") if fmt == "zip" else contextlib.nullcontext():
        archive = hostile_archive(tmp_path, fmt, [
            Member(f"{TOP}/docs/a.txt", "file", b"the first, and longer, a"),
            Member(f"{TOP}/docs/b.txt", "file", b"b"),
            Member(f"{TOP}/docs/a.txt", "file", b"last a"),
        ])
    if fmt == "zip":
        with pytest.raises(IntegrityError, match=f"'{TOP}/docs/a.txt' is in it twice"):
            extract(archive, _work(tmp_path))
        return
    result = extract(archive, _work(tmp_path))
    assert (result.root / "docs/a.txt").read_bytes() == b"last a"
    assert stat.S_IMODE((result.root / "docs/a.txt").stat().st_mode) == 0o644  # the last member's mode
    assert result.files["docs/a.txt"] == manifest_digest(b"last a")
    assert result.size == sum((result.root / name).stat().st_size for name in result.files)


@pytest.mark.parametrize("through", ["docs", "manual"])
def test_a_hard_link_to_itself_leaves_the_file_as_it_is(tmp_path: Path, through: str) -> None:
    """By its own name, or through a link to its folder: the file is not removed to make room."""
    archive = hostile_archive(tmp_path, "tar.gz", [
        Member(f"{TOP}/docs/a.txt", "file", b"abc"),
        Member(f"{TOP}/manual", "symlink", target="docs"),
        Member(f"{TOP}/{through}/a.txt", "hardlink", target=f"{TOP}/docs/a.txt"),
        Member(f"{TOP}/docs/b.txt", "hardlink", target=f"{TOP}/docs/a.txt"),  # and the links after it
    ])
    result = extract(archive, _work(tmp_path))
    assert (result.root / "docs/a.txt").read_bytes() == b"abc"
    assert (result.root / "docs/b.txt").read_bytes() == b"abc"
    assert result.files["docs/a.txt"] == manifest_digest(b"abc")
    assert result.size == sum((result.root / name).stat().st_size for name in result.files)


def test_a_member_name_too_long_for_the_file_system_is_an_integrity_error(tmp_path: Path) -> None:
    archive = tmp_path / "long.zip"
    top = f"qairt/{VERSION}"
    with zipfile.ZipFile(archive, "w") as zf:
        add_zip_entry(zf, f"{top}/lib/x86_64-linux-clang/libQnnHtp.so", b"x", 0o100644)
        add_zip_entry(zf, f"{top}/share/{'n' * 300}.txt", b"x", 0o100644)
    work = tmp_path / "work"
    with pytest.raises(IntegrityError) as refused:
        extract(archive, work)
    long_name = work / top / "share" / f"{'n' * 300}.txt"
    assert (refused.value.message, refused.value.hint) == (
        f"long.zip is malformed: a member's name is too long: {long_name}",
        "the archive was not installed; get it from a trusted source")


def test_a_tree_put_together_from_two_installs_is_refused_for_a_link_that_leads_outside(tmp_path: Path) -> None:
    """check_links_inside, which a partial install runs on the SDK it made from the installed
    one and the archive's new members: every link, of a file or a folder, must stay inside."""
    from qnnctl.install.confine import check_links_inside

    root = tmp_path / "sdk"
    (root / "lib" / "sub").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "lib" / "tools").symlink_to("../bin")
    (root / "lib" / "sub" / "same").symlink_to("../tools")
    check_links_inside(root)  # all inside: nothing to say
    (root / "lib" / "sub" / "away").symlink_to("../../../outside")
    with pytest.raises(IntegrityError) as caught:
        check_links_inside(root)
    assert caught.value.message == "unsafe archive: symlink lib/sub/away -> ../../../outside leads outside the SDK"
    assert caught.value.hint == "the archive was not installed; get it from a trusted source"
    (root / "lib" / "sub" / "away").unlink()
    (root / "docs").symlink_to(tmp_path)  # a folder's link, which the walk does not follow
    with pytest.raises(IntegrityError, match=re.escape(f"unsafe archive: symlink docs -> {tmp_path} leads outside")):
        check_links_inside(root)


# -- what a lock or an index pins of an archive: the digests of the SDK it installs -------------


def _zip_tree(tree: Path, archive: Path, folders: bool = True, unix: bool = True,
              outside: dict[str, bytes] | None = None) -> Path:
    """`tree` zipped (see write_zip_from_tree), with `outside`: members beside the SDK's folder."""
    write_zip_from_tree(tree, archive, folders, unix)
    with zipfile.ZipFile(archive, "a", zipfile.ZIP_DEFLATED) as zf:
        for name, data in (outside or {}).items():
            add_zip_entry(zf, name, data, stat.S_IFREG | 0o644)
    return archive


def _staged(tmp_path: Path, top: str | None = None, link: bool = True) -> tuple[Path, Path]:
    """(the folder an archive is made of, the SDK in it): a library of more than 1 MiB, read
    in several blocks, and a link unless `link` is off."""
    staging = tmp_path / "staging"
    root = build_sdk_tree(staging / (TOP if top is None else top),
                          SdkSpec(extra_files={"docs/big.bin": os.urandom((3 << 20) + 5), "docs/empty.txt": b""}))
    if link:
        (root / "lib/x86_64-linux-clang/libQnnHtp.so.2").symlink_to("libQnnHtp.so")
    # Names that end in a space or an X, and a mode with no x bit but others' w bit.
    (root / "docs/notes ").write_bytes(b"notes")
    (root / "docs/INDEX").write_bytes(b"index")
    (root / "docs/shared.txt").write_bytes(b"shared")
    (root / "docs/shared.txt").chmod(0o646)
    return staging, root


@pytest.mark.parametrize("top", [None, ""], ids=["top-folder", "no-top-folder"])
def test_an_archives_component_digests_are_those_of_the_sdk_it_installs(tmp_path: Path, top: str | None) -> None:
    """What `qnnctl lock` and `qnnctl mirror` compute from an archive is what an install of it
    records and what `--locked` checks an SDK on disk by: zip_digests over the archive equals
    tree_digests over what extract writes, links, modes, empty and multi-block files included."""
    from qnnctl.install.archive import zip_digests
    from qnnctl.sdk.members import tree_digests

    staging, root = _staged(tmp_path, top)
    archive = _zip_tree(staging, tmp_path / "sdk.zip")
    digests = zip_digests(archive)
    assert {"host", "docs"} <= set(digests)
    assert digests == tree_digests(root)
    assert digests == tree_digests(extract(archive, _work(tmp_path)).root)


def test_a_change_to_one_member_changes_its_components_digest_alone(tmp_path: Path) -> None:
    """Its content (same size), its mode, a link's target, a member gone: each moves the digest of
    the component that holds it, and the archive's digests stay those of the tree it holds."""
    from qnnctl.install.archive import zip_digests
    from qnnctl.sdk.members import tree_digests

    staging, root = _staged(tmp_path)
    before = zip_digests(_zip_tree(staging, tmp_path / "before.zip"))
    lib, tool = root / "lib/x86_64-linux-clang/libQnnHtp.so", root / "bin/x86_64-linux-clang/qnn-net-run"
    big, link = root / "docs/big.bin", root / "lib/x86_64-linux-clang/libQnnHtp.so.2"

    def relink() -> None:
        link.unlink()
        link.symlink_to("libQnnCpu.so")

    changes: list[tuple[str, Callable[[], object]]] = [
        ("host", lambda: lib.write_bytes(lib.read_bytes()[:-1] + bytes([lib.read_bytes()[-1] ^ 1]))),
        ("host", lambda: tool.chmod(0o644)),
        ("docs", lambda: big.write_bytes(big.read_bytes()[:-1] + b"?")),  # in its last block
        ("host", relink),
        ("docs", lambda: (root / "docs/empty.txt").unlink()),
    ]
    for n, (component, change) in enumerate(changes):
        change()
        after = zip_digests(_zip_tree(staging, tmp_path / f"after-{n}.zip"))
        assert after == tree_digests(root), component
        assert {name for name in before if after.get(name) != before[name]} == {component}, n
        before = after


def test_folder_entries_and_members_beside_the_sdk_change_no_digest(tmp_path: Path) -> None:
    from qnnctl.install.archive import zip_digests

    staging, _ = _staged(tmp_path)
    digests = zip_digests(_zip_tree(staging, tmp_path / "with.zip"))
    assert zip_digests(_zip_tree(staging, tmp_path / "without.zip", folders=False)) == digests
    beside = _zip_tree(staging, tmp_path / "beside.zip", outside={"README.txt": b"not the SDK's", "qairt/x": b"x"})
    assert zip_digests(beside) == digests


@pytest.mark.parametrize("name", ["/etc/cron.d/evil", "../evil", "docs/../../evil", "C:evil"])
def test_an_archive_with_a_member_extract_refuses_has_no_digests(tmp_path: Path, name: str) -> None:
    """A name that leads out of the archive (absolute, with a drive letter, or up through `..`)
    makes the archive one no install takes: zip_digests refuses it as extract does, whether or
    not the SDK sits at the archive's root, so that `qnnctl mirror` (which reads the archive's
    names no other way before) never indexes an archive install refuses."""
    from qnnctl.install.archive import zip_digests

    staging, _ = _staged(tmp_path, top="", link=False)
    archive = _zip_tree(staging, tmp_path / "sdk.zip", outside={name: b"x"})
    with pytest.raises(IntegrityError) as refused:
        extract(archive, _work(tmp_path))
    with pytest.raises(IntegrityError) as digested:
        zip_digests(archive)
    assert digested.value.message == refused.value.message
    assert name in digested.value.message


def test_an_archive_that_records_no_unix_modes_holds_no_executables(tmp_path: Path) -> None:
    """An archiver that is not Unix's: the mode bits its external attributes may seem to hold are
    not read, as extract does not read them; the digests are those of a tree without x bits."""
    from qnnctl.install.archive import zip_digests
    from qnnctl.sdk.members import tree_digests

    staging, root = _staged(tmp_path, link=False)
    archive = _zip_tree(staging, tmp_path / "dos.zip", unix=False)
    for path in root.rglob("*"):
        if path.is_file():
            path.chmod(0o644)
    assert zip_digests(archive) == tree_digests(root)
    assert zip_digests(archive) == tree_digests(extract(archive, _work(tmp_path)).root)


def test_a_link_whose_target_is_not_utf8_is_pinned_by_its_bytes(tmp_path: Path) -> None:
    from qnnctl.install.archive import zip_digests
    from qnnctl.sdk.members import tree_digests

    staging, root = _staged(tmp_path)
    os.symlink(b"lib\xffQnn.so", bytes(root / "lib/x86_64-linux-clang/libQnnOld.so"))
    digests = zip_digests(_zip_tree(staging, tmp_path / "sdk.zip"))
    assert digests == tree_digests(root)
    os.unlink(root / "lib/x86_64-linux-clang/libQnnOld.so")
    assert tree_digests(root)["host"] != digests["host"]
