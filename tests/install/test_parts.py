"""qnnctl.install.partial in the tests' own process: the members of a zip and of a tar, the
choice of members for some components and the links that bring more, what an SDK folder
holds, merging with the components installed, the checks that components added come from the
same archive, and the installs by parts (RangedInstall, install_components) against the
loopback server. Archives are built by the tests in the real layout (tests/sdkfactory.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import stat
import struct
import tarfile
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from qnnctl.errors import DiskSpaceError, DownloadError, IntegrityError, UsageError
from qnnctl.install.archive import zip_digests
from qnnctl.install.door import observed_tree
from qnnctl.install.partial import (
    Choice,
    Parts,
    RangedInstall,
    check_same_archive,
    choose_in_file,
    choose_members,
    extract_components,
    install_components,
    installed_members,
    link_closure,
    merge_old,
    merged_digests,
    merged_files,
    ranged_failure,
    read_link_target,
    same_archive,
    tar_members,
    unknown_links,
    wanted_components,
    with_installed,
    zip_members,
)
from qnnctl.net.download import PlainProgress
from qnnctl.net.ranged import ArchiveChanged
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, read_manifest
from qnnctl.sdk.gate import MOST_ARCHIVE, Expected, Observed, size_limit
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.members import Member, tree_digests
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import (
    OTHER_VERSION,
    VERSION,
    SdkSpec,
    add_tar_entry,
    add_zip_entry,
    build_archive,
    build_sdk_tree,
    build_two_host_archive,
    long_name_chain,
)

TOP = PurePosixPath(f"qairt/{VERSION}")
PATH = f"/{VERSION}/v{VERSION}.zip"
NAME = f"v{VERSION}.zip"
_RANDOM = random.Random(20261204)
UNPINNED = size_limit([])  # the most any archive is, when nothing pins its size
# Incompressible, so that each member's bytes on the wire are about its size.
EXTRA = {
    "lib/aarch64-android/libQnnHtpV73Stub.so": _RANDOM.randbytes(24 << 10),
    "lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so": _RANDOM.randbytes(24 << 10),
    "lib/hexagon-v73/libQnnHtpV73.cat": _RANDOM.randbytes(2 << 10),
    "lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so": _RANDOM.randbytes(24 << 10),
    "docs/guide.txt": b"how to\n",
    "lib/x86_64-windows-msvc/QnnHtp.dll": _RANDOM.randbytes(4 << 10),  # no component claims it
}
HOST = {"QNN_README.txt", "sdk.yaml", "bin/x86_64-linux-clang/qnn-context-binary-generator",
        "bin/x86_64-linux-clang/qnn-net-run", "include/QNN/QnnInterface.h", "lib/x86_64-linux-clang/libQnnCpu.so",
        "lib/x86_64-linux-clang/libQnnHtp.so", "lib/x86_64-linux-clang/libQnnHtp.so.2",
        "lib/x86_64-linux-clang/libQnnSystem.so"}
HOST_DIRS = {"bin", "bin/x86_64-linux-clang", "include", "include/QNN", "lib", "lib/x86_64-linux-clang", "share"}
ANDROID = {"lib/aarch64-android/libQnnHtp.so", "lib/aarch64-android/libQnnHtpV73Stub.so"}
V73 = {"lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so", "lib/hexagon-v73/libQnnHtpV73.cat"}
UNSAFE_HINT = "the archive was not installed; get it from a trusted source"
CORRUPT_HINT = "nothing was installed; download the archive again"


def below(*names: str) -> set[PurePosixPath]:
    """Archive paths of members named below the SDK folder."""
    return {TOP / name for name in names}


def sdk_zip(folder: Path, links: dict[str, str] | None = None, comment: bytes = b"") -> Path:
    """The SDK archive with EXTRA's members, and `links` (path below the SDK -> target) added."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = build_archive(folder, "zip", SdkSpec(extra_files=dict(EXTRA)))
    with zipfile.ZipFile(archive, "a") as zf:
        for name, target in (links or {}).items():
            add_zip_entry(zf, f"{TOP}/{name}", target.encode(), stat.S_IFLNK | 0o777)
        zf.comment = comment
    return archive


def directory_sha256(data: bytes) -> str:
    """The sha256 of a zip's central directory, read from its end record."""
    end = data.rfind(b"PK\x05\x06")
    size, offset = struct.unpack_from("<LL", data, end + 12)
    return hashlib.sha256(data[offset:offset + size]).hexdigest()


def span_of(data: bytes, name: str) -> tuple[int, int]:
    """The bytes of a member: its local header and its data."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = zf.getinfo(f"{TOP}/{name}")
    return info.header_offset, info.header_offset + 30 + len(info.filename) + info.compress_size


def refusal(error: pytest.ExceptionInfo[Any]) -> tuple[str, str | None]:
    return error.value.message, error.value.hint


def members_of(archive: Path) -> tuple[dict[PurePosixPath, Member], dict[PurePosixPath, zipfile.ZipInfo]]:
    with zipfile.ZipFile(archive) as zf:
        return zip_members(zf.infolist())


def files_below(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if (p.is_file() or p.is_symlink()) and p.name != MANIFEST_NAME}


def write_manifest(root: Path, **fields: Any) -> Sdk:
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST_NAME).write_text(json.dumps({"schema": 1, "version": VERSION, **fields}))
    return Sdk(root, VERSION, "qnnctl cache")


@pytest.fixture(scope="module")
def plain_zip(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return sdk_zip(tmp_path_factory.mktemp("plain")).read_bytes()


@pytest.fixture
def archive(tmp_path: Path, plain_zip: bytes) -> Path:
    path = tmp_path / "given" / NAME
    path.parent.mkdir()
    path.write_bytes(plain_zip)
    return path


# -- what is recorded, and the components wanted ---------------------------------------------------


def test_what_an_install_of_components_records() -> None:
    assert Parts(("host", "android"), True, "ab" * 32).manifest_fields() == {
        "components": ["host", "android"], "partial": True, "central_directory_sha256": "ab" * 32}
    assert Parts(("host",), False, None).manifest_fields() == {
        "components": ["host"], "partial": False, "central_directory_sha256": None}


def test_the_components_wanted_are_those_asked_for_and_those_installed(tmp_path: Path) -> None:
    assert wanted_components(["android", "host"], None) == ("host", "android")
    old = write_manifest(tmp_path / "old", components=["host", "docs"])
    assert wanted_components(["hexagon-v75", "host"], old) == ("host", "hexagon-v75", "docs")
    # An SDK whose manifest names no components holds them all.
    whole = write_manifest(tmp_path / "whole")
    assert wanted_components(["android"], whole) == ("all",)


# -- the members of a zip and of a tar -----------------------------------------------------------


def test_the_members_of_a_zip_by_path_and_kind(archive: Path) -> None:
    members, entries = members_of(archive)
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
    assert list(members) == [PurePosixPath(i.filename) for i in infos]
    assert members[TOP / "lib/x86_64-linux-clang/libQnnHtp.so.2"] == Member(
        TOP / "lib/x86_64-linux-clang/libQnnHtp.so.2", "link")
    assert members[TOP / "lib"] == Member(TOP / "lib", "dir")
    assert members[TOP / "sdk.yaml"] == Member(TOP / "sdk.yaml", "file")
    assert {p: i.filename for p, i in entries.items()} == {PurePosixPath(i.filename): i.filename for i in infos}


def test_a_zip_entry_of_no_path_is_no_member_and_a_name_given_twice_is_its_last_entry(tmp_path: Path) -> None:
    out = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w") as zf:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
        add_zip_entry(zf, "./", b"", 0o40755)
        add_zip_entry(zf, "top/a.txt", b"first", 0o100644)
        add_zip_entry(zf, "top/b.txt", b"b", 0o100644)
        add_zip_entry(zf, "top/a.txt", b"second", 0o120777)
    with zipfile.ZipFile(out) as zf:
        infos = zf.infolist()
    members, entries = zip_members(infos)
    a, b = PurePosixPath("top/a.txt"), PurePosixPath("top/b.txt")
    assert members == {a: Member(a, "link"), b: Member(b, "file")}
    assert entries == {a: infos[3], b: infos[2]}


def test_a_device_in_a_zip_is_refused(tmp_path: Path) -> None:
    archive = sdk_zip(tmp_path)
    with zipfile.ZipFile(archive, "a") as zf:
        add_zip_entry(zf, f"{TOP}/docs/null", b"", stat.S_IFCHR | 0o644)
    with pytest.raises(IntegrityError) as refused:
        members_of(archive)
    assert refusal(refused) == (f"unsafe archive: '{TOP}/docs/null' is a device or special file", UNSAFE_HINT)


def _tar(path: Path, *more: tuple[str, bytes, bytes, str]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        add_tar_entry(tf, "./", kind=tarfile.DIRTYPE, mode=0o755)
        add_tar_entry(tf, f"{TOP}/", kind=tarfile.DIRTYPE, mode=0o755)
        add_tar_entry(tf, f"{TOP}/lib/x86_64-linux-clang/", kind=tarfile.DIRTYPE, mode=0o755)
        add_tar_entry(tf, f"{TOP}/lib/x86_64-linux-clang/libQnnHtp.so", _RANDOM.randbytes(24 << 10))
        add_tar_entry(tf, f"{TOP}/lib/x86_64-linux-clang/libQnnHtp.so.2", kind=tarfile.SYMTYPE,
                      linkname="libQnnHtp.so")
        add_tar_entry(tf, f"{TOP}/docs/copy.so", kind=tarfile.LNKTYPE,
                      linkname=f"{TOP}/lib/x86_64-linux-clang/libQnnHtp.so")
        for name, data, kind, linkname in more:
            add_tar_entry(tf, name, data, kind=kind, linkname=linkname)
    return path


def test_the_members_of_a_tar_and_its_links_targets(tmp_path: Path) -> None:
    members, targets = tar_members(_tar(tmp_path / "sdk.tar.gz"))
    lib = TOP / "lib/x86_64-linux-clang"
    assert members == {TOP: Member(TOP, "dir"), lib: Member(lib, "dir"),
                       lib / "libQnnHtp.so": Member(lib / "libQnnHtp.so", "file"),
                       lib / "libQnnHtp.so.2": Member(lib / "libQnnHtp.so.2", "link"),
                       TOP / "docs/copy.so": Member(TOP / "docs/copy.so", "file")}
    assert targets == {lib / "libQnnHtp.so.2": "libQnnHtp.so"}


def test_a_pipe_in_a_tar_is_refused(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "sdk.tar.gz", (f"{TOP}/docs/fifo", b"", tarfile.FIFOTYPE, ""))
    with pytest.raises(IntegrityError) as refused:
        tar_members(archive)
    assert refusal(refused) == (f"unsafe archive: '{TOP}/docs/fifo' is a device or special file", UNSAFE_HINT)


@pytest.mark.parametrize(("damage", "said"), [
    (lambda data: data[:len(data) // 2], "unexpected end of data"),
    (lambda data: b"hello world" * 100, "invalid header"),
    (lambda data: b"", "empty file"),
], ids=["truncated", "garbage", "empty"])
def test_a_tar_that_cannot_be_read_is_corrupt(tmp_path: Path, damage: Any, said: str) -> None:
    archive = _tar(tmp_path / "sdk.tar.gz")
    archive.write_bytes(damage(archive.read_bytes()))
    with pytest.raises(IntegrityError) as refused:
        tar_members(archive)
    assert refusal(refused) == (f"sdk.tar.gz is corrupt or truncated: {said}", CORRUPT_HINT)
    assert refused.value.__cause__ is None
    assert refused.value.__suppress_context__


def test_a_tar_that_cannot_be_opened_is_not_called_corrupt(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        tar_members(tmp_path / "gone.tar.gz")


# -- choosing members ----------------------------------------------------------------------------


def test_the_members_of_the_components_asked_for_with_the_folders_above_them(archive: Path) -> None:
    members, _ = members_of(archive)
    choice = choose_members(members, ["host"], set(), "v.zip")
    assert choice == Choice(TOP, members, below(*HOST, *HOST_DIRS), set(), {})
    android = choose_members(members, ["android"], {TOP / "lib/aarch64-android/libQnnHtp.so"}, "v.zip")
    assert android.chosen == {TOP / "lib", TOP / "lib/aarch64-android",
                              TOP / "lib/aarch64-android/libQnnHtpV73Stub.so"}
    assert android.present == {TOP / "lib/aarch64-android/libQnnHtp.so"}
    # `all`: every member of the SDK folder, those of no component too.
    assert choose_members(members, ["all"], set(), "v.zip").chosen == set(members) - {TOP.parent, TOP}


def test_a_component_the_archive_lacks_is_refused_naming_those_it_has(archive: Path) -> None:
    members, _ = members_of(archive)
    with pytest.raises(UsageError) as refused:
        choose_members(members, ["android", "hexagon-v99", "host", "hexagon-v68"], set(), "https://m/v.zip")
    assert refusal(refused) == (
        "https://m/v.zip has no hexagon-v99, hexagon-v68: its components are host, android, hexagon-v73, "
        "hexagon-v75, docs",
        "ask only for some of those (`--components host,android`), or install from an archive that has them")
    with pytest.raises(UsageError) as alone:
        choose_members(members, ["hexagon-v99"], set(), "v.zip")
    assert refusal(alone) == (
        "v.zip has no hexagon-v99: its components are host, android, hexagon-v73, hexagon-v75, docs",
        "ask only for some of those (`--components host`), or install from an archive that has them")


def _choice(archive: Path, components: list[str], present: set[PurePosixPath] | None = None) -> Choice:
    members, entries = members_of(archive)
    choice = choose_members(members, components, present or set(), archive.name)
    with zipfile.ZipFile(archive) as zf:
        for path, member in members.items():
            if member.kind == "link":
                choice.targets[path] = read_link_target(zf, entries[path])
    return choice


def test_a_link_into_another_component_brings_all_of_it(tmp_path: Path) -> None:
    """Through a folder entry of no component: the component of the file it leads to comes whole."""
    archive = sdk_zip(tmp_path, {"lib/x86_64-linux-clang/libQnnHtpV73.cat": "../hexagon-v73/libQnnHtpV73.cat"})
    choice = _choice(archive, ["host"])
    before = set(choice.chosen)
    extra = link_closure(choice)
    assert extra == below(*V73, "lib/hexagon-v73", "lib/hexagon-v73/unsigned")
    assert choice.chosen == before | extra
    assert not any("hexagon-v75" in str(p) for p in choice.chosen)


def test_a_link_to_a_member_of_no_component_brings_it_alone(tmp_path: Path) -> None:
    archive = sdk_zip(tmp_path, {"lib/x86_64-linux-clang/QnnHtp.dll": "../x86_64-windows-msvc/QnnHtp.dll"})
    choice = _choice(archive, ["host"])
    assert link_closure(choice) == below("lib/x86_64-windows-msvc", "lib/x86_64-windows-msvc/QnnHtp.dll")


def test_what_is_installed_already_is_not_brought_again(tmp_path: Path) -> None:
    archive = sdk_zip(tmp_path, {"lib/aarch64-android/libQnnHtpV73Skel.so":
                                 "../hexagon-v73/unsigned/libQnnHtpV73Skel.so"})
    present = below("lib/hexagon-v73/libQnnHtpV73.cat")
    choice = _choice(archive, ["android"], present)
    assert link_closure(choice) == below("lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so", "lib/hexagon-v73",
                                         "lib/hexagon-v73/unsigned")
    assert choice.present == present
    # Nothing more to bring: nothing added.
    assert link_closure(choice) == set()


def test_links_whose_targets_are_not_known_yet(tmp_path: Path) -> None:
    archive = sdk_zip(tmp_path, {"lib/x86_64-linux-clang/a.so": "libQnnHtp.so", "docs/b.txt": "guide.txt"})
    members, _ = members_of(archive)
    choice = choose_members(members, ["host", "docs"], set(), archive.name)
    assert unknown_links(choice) == [TOP / "docs/b.txt", TOP / "lib/x86_64-linux-clang/a.so",
                                     TOP / "lib/x86_64-linux-clang/libQnnHtp.so.2"]
    assert link_closure(choice) == set()  # nothing known to follow
    choice.targets[TOP / "lib/x86_64-linux-clang/a.so"] = "libQnnHtp.so"
    assert unknown_links(choice) == [TOP / "docs/b.txt", TOP / "lib/x86_64-linux-clang/libQnnHtp.so.2"]
    host_only = choose_members(members, ["host"], set(), archive.name)
    assert TOP / "docs/b.txt" not in unknown_links(host_only)


def test_a_link_target_is_read_up_to_the_longest_path(tmp_path: Path) -> None:
    archive = tmp_path / "links.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        add_zip_entry(zf, "longest", b"a/" * 2048, stat.S_IFLNK | 0o777)
        add_zip_entry(zf, "longer", b"a/" * 2048 + b"b", stat.S_IFLNK | 0o777)
        add_zip_entry(zf, "latin", b"caf\xe9", stat.S_IFLNK | 0o777)
    with zipfile.ZipFile(archive) as zf:
        assert read_link_target(zf, zf.getinfo("longest")) == "a/" * 2048
        assert read_link_target(zf, zf.getinfo("latin")) == "caf\udce9"
        with pytest.raises(IntegrityError) as refused:
            read_link_target(zf, zf.getinfo("longer"))
    assert refusal(refused) == ("unsafe archive: symlink 'longer' has a target longer than 4096 bytes", UNSAFE_HINT)


def test_what_an_sdk_folder_holds_as_archive_paths(tmp_path: Path) -> None:
    root = write_manifest(tmp_path / "sdk").root
    (root / "lib/x86_64-linux-clang").mkdir(parents=True)
    (root / "lib/x86_64-linux-clang/libQnnHtp.so").write_bytes(b"lib")
    (root / "lib/x86_64-linux-clang/libQnnHtp.so.2").symlink_to("libQnnHtp.so")
    (root / "docs").mkdir()
    (root / "docs" / MANIFEST_NAME).write_text("{}")  # a member of that name below the root is one
    (root / "docs/up").symlink_to("../lib")
    notes = [f"NOTICE-{n}.txt" for n in range(12)]  # beside the manifest, in whatever order the folder lists
    for name in notes:
        (root / name).write_text(name)
    present, targets = installed_members(root, TOP)
    assert present == below("lib", "lib/x86_64-linux-clang", "lib/x86_64-linux-clang/libQnnHtp.so",
                            "lib/x86_64-linux-clang/libQnnHtp.so.2", "docs", f"docs/{MANIFEST_NAME}", "docs/up", *notes)
    assert targets == {TOP / "lib/x86_64-linux-clang/libQnnHtp.so.2": "libQnnHtp.so", TOP / "docs/up": "../lib"}


# -- from an archive on disk -----------------------------------------------------------------------


def test_the_members_of_a_zip_on_disk_with_its_links_followed(tmp_path: Path) -> None:
    """A link to a link in another component, which leads into a third: both come whole."""
    archive = sdk_zip(tmp_path, {"lib/x86_64-linux-clang/skel.so": "../aarch64-android/skel.so",
                                 "lib/aarch64-android/skel.so": "../hexagon-v73/libQnnHtpV73.cat"})
    choice, parts = choose_in_file(archive, ["docs", "host"])
    assert parts == Parts(("host", "docs"), False, directory_sha256(archive.read_bytes()))
    assert choice.chosen == below(*HOST, *HOST_DIRS, "docs", "docs/guide.txt", "lib/x86_64-linux-clang/skel.so",
                                  *ANDROID, "lib/aarch64-android/skel.so", "lib/aarch64-android", *V73,
                                  "lib/hexagon-v73", "lib/hexagon-v73/unsigned")
    assert choice.targets == {TOP / "lib/x86_64-linux-clang/libQnnHtp.so.2": "libQnnHtp.so",
                              TOP / "lib/x86_64-linux-clang/skel.so": "../aarch64-android/skel.so",
                              TOP / "lib/aarch64-android/skel.so": "../hexagon-v73/libQnnHtpV73.cat"}


def test_the_members_of_a_tar_on_disk_with_its_links_followed(tmp_path: Path) -> None:
    archive = build_archive(tmp_path, "tar.gz", SdkSpec(extra_files=dict(EXTRA)))
    choice, parts = choose_in_file(archive, ["android", "host"])
    assert parts == Parts(("host", "android"), False, None)
    assert choice.chosen == below(*HOST, *HOST_DIRS, *ANDROID, "lib/aarch64-android")
    assert choice.targets == {TOP / "lib/x86_64-linux-clang/libQnnHtp.so.2": "libQnnHtp.so"}
    assert choice.present == set()


def _bad_link_crc(archive: Path, name: str) -> None:
    """The CRC-32 of a link's entry, in its local header and the directory, made wrong."""
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zf:
        info = zf.getinfo(name)
    struct.pack_into("<L", data, info.header_offset + 14, info.CRC ^ 1)
    end = bytes(data).rfind(b"PK\x05\x06")
    size, offset = struct.unpack_from("<LL", data, end + 12)
    at = offset
    while at < offset + size:
        name_len, extra_len, comment_len = struct.unpack_from("<3H", data, at + 28)
        if bytes(data[at + 46:at + 46 + name_len]) == name.encode():
            struct.pack_into("<L", data, at + 16, info.CRC ^ 1)
        at += 46 + name_len + extra_len + comment_len
    archive.write_bytes(bytes(data))


def test_a_link_that_cannot_be_read_from_a_zip_on_disk_is_corrupt(archive: Path) -> None:
    name = f"{TOP}/lib/x86_64-linux-clang/libQnnHtp.so.2"
    _bad_link_crc(archive, name)
    with pytest.raises(IntegrityError) as refused:
        choose_in_file(archive, ["host"])
    assert refusal(refused) == (f"{NAME} is corrupt or truncated: Bad CRC-32 for file '{name}'", CORRUPT_HINT)
    assert refused.value.__suppress_context__


def test_the_members_of_some_components_extracted_from_an_archive_on_disk(archive: Path, tmp_path: Path) -> None:
    extracted, parts = extract_components(archive, ["android"], tmp_path / "x")
    assert parts == Parts(("android",), False, directory_sha256(archive.read_bytes()))
    assert extracted.root == tmp_path / "x" / TOP
    assert set(extracted.files) == files_below(extracted.root) == ANDROID


# -- merging with what is installed ----------------------------------------------------------------


def test_the_files_installed_are_taken_into_the_new_folder(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "lib/deep").mkdir(parents=True)
    (old / "lib/a.so").write_bytes(b"old a")
    (old / "lib/both.so").write_bytes(b"old both")
    (old / "lib/a.so.1").symlink_to("a.so")
    (old / MANIFEST_NAME).write_text("{}")
    notes = [f"NOTICE-{n}.txt" for n in range(12)]  # beside the manifest, in whatever order the folder lists
    for name in notes:
        (old / name).write_text(name)
    (old / "lib/deep").chmod(0o550)
    (old / "lib").chmod(0o750)
    (new / "lib").mkdir(parents=True)
    (new / "lib/both.so").write_bytes(b"new both")
    (new / "lib/b.so").write_bytes(b"new b")
    merge_old(old, new)
    assert (new / "lib/a.so").stat().st_ino == (old / "lib/a.so").stat().st_ino  # a hard link
    assert (new / "lib/both.so").read_bytes() == b"new both"  # the one written stands
    assert os.readlink(new / "lib/a.so.1") == "a.so"
    assert not (new / MANIFEST_NAME).exists()
    # Folders made get qnnctl's one folder mode, whatever the old one's were.
    assert stat.S_IMODE((new / "lib/deep").stat().st_mode) == 0o755
    assert sorted(p.relative_to(new).as_posix() for p in new.rglob("*")) == sorted([
        *notes, "lib", "lib/a.so", "lib/a.so.1", "lib/b.so", "lib/both.so", "lib/deep"])
    (old / "lib/deep").chmod(0o755)


def test_a_file_that_cannot_be_linked_is_copied(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system to link across")
    old = shm / f"qnnctl-test-{os.getpid()}-{os.urandom(4).hex()}"
    old.mkdir()
    try:
        (old / "a.so").write_bytes(b"old a")
        os.utime(old / "a.so", (1_000_000_000, 1_000_000_000))
        new = tmp_path / "new"
        new.mkdir()
        merge_old(old, new)
        assert (new / "a.so").read_bytes() == b"old a"
        assert (new / "a.so").stat().st_mtime == 1_000_000_000  # a copy with its times
    finally:
        (old / "a.so").unlink()
        old.rmdir()


@pytest.mark.parametrize("folder_was", [True, False])
def test_a_folder_that_is_a_file_in_the_archive_is_refused(tmp_path: Path, folder_was: bool) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    for root, folder in ((old, folder_was), (new, not folder_was)):
        if folder:
            (root / "docs").mkdir()
        else:
            (root / "docs").symlink_to("lib")
    with pytest.raises(IntegrityError) as refused:
        merge_old(old, new)
    what = "folder" if folder_was else "file or link"
    assert refusal(refused) == (
        f"unsafe archive: docs is a {what} in the SDK installed and something else in the archive", UNSAFE_HINT)


def test_the_files_recorded_are_the_old_ones_and_those_written(tmp_path: Path) -> None:
    written = {"lib/a.so": "1" * 64, "lib/b.so": "2" * 64}
    assert merged_files(None, written) == written
    old = write_manifest(tmp_path / "old", files={"lib/a.so": "0" * 64, "docs/c.txt": "3" * 64})
    assert merged_files(old, written) == {"lib/a.so": "1" * 64, "docs/c.txt": "3" * 64, "lib/b.so": "2" * 64}
    assert merged_files(write_manifest(tmp_path / "odd", files=["lib/a.so"]), written) == written
    assert merged_files(Sdk(tmp_path / "none", VERSION, "qnnctl cache"), written) == written


def test_the_component_digests_recorded_are_the_old_ones_and_those_written(tmp_path: Path) -> None:
    written = {"android": "1" * 64}
    assert merged_digests(None, written) == written
    old = write_manifest(tmp_path / "old", component_sha256={"host": "0" * 64, "android": "9" * 64, "n": 5})
    assert merged_digests(old, written) == {"host": "0" * 64, "android": "1" * 64, "n": "5"}
    assert merged_digests(write_manifest(tmp_path / "odd", component_sha256="host"), written) == written
    assert merged_digests(Sdk(tmp_path / "none", VERSION, "qnnctl cache"), written) == written


def test_components_added_come_from_the_archive_of_those_installed(tmp_path: Path) -> None:
    old = write_manifest(tmp_path / "old", central_directory_sha256="a" * 64)
    check_same_archive(old, "a" * 64, "v.zip")
    with pytest.raises(IntegrityError) as refused:
        check_same_archive(old, "b" * 64, "https://m/v.zip")
    assert refusal(refused) == (
        f"https://m/v.zip is not the archive SDK {VERSION} was installed from: its central directory's sha256 "
        f"is {'b' * 64}, not {'a' * 64}",
        f"to replace the SDK with this archive's: `qnnctl install --force {VERSION} --components ...`; nothing was "
        "changed")
    # Nothing recorded to compare with: taken as it is.
    check_same_archive(write_manifest(tmp_path / "none"), "b" * 64, "v.zip")
    check_same_archive(write_manifest(tmp_path / "odd", central_directory_sha256=1), "b" * 64, "v.zip")


def test_what_to_say_when_the_archive_changed_part_way() -> None:
    error = ranged_failure(ArchiveChanged("its ETag is now \"2\""), "https://m/v.zip")
    assert isinstance(error, DownloadError)
    assert (error.message, error.hint) == (
        "https://m/v.zip changed on the server while its parts were being fetched: its ETag is now \"2\"",
        "the parts fetched were removed; run the same command again")


@pytest.mark.parametrize(("fields", "sha256", "directory"), [
    ({"sha256": "a" * 64, "partial": False, "central_directory_sha256": "c" * 64}, "a" * 64, "c" * 64),
    ({"sha256": "a" * 64, "partial": True, "central_directory_sha256": "c" * 64}, None, "c" * 64),
    ({"sha256": "a" * 64, "central_directory_sha256": 5}, None, None),
    ({"sha256": 7, "partial": False}, None, None),
], ids=["from-a-file", "by-parts", "no-partial", "not-text"])
def test_what_components_added_must_match(tmp_path: Path, fields: dict[str, Any], sha256: str | None,
                                          directory: str | None) -> None:
    old = write_manifest(tmp_path / "old", **fields)
    assert same_archive(old) == Expected(
        f"SDK {VERSION} installed at {old.root}", "the SDK installed", "came from an archive with",
        f"to replace the SDK with this archive's: `qnnctl install --force {VERSION} --components ...`",
        sha256=sha256, central_directory_sha256=directory, by_directory=True)


def test_what_the_gate_sees_of_an_extraction(tmp_path: Path) -> None:
    root = write_manifest(tmp_path / "sdk").root
    (root / "docs").mkdir()
    (root / "docs/guide.txt").write_bytes(b"guide")
    (root / "sdk.yaml").write_bytes(b"yaml")
    files = {"sdk.yaml": hashlib.sha256(b"yaml").hexdigest()}
    digests = tree_digests(root, files, skip={MANIFEST_NAME})  # the manifest is qnnctl's, no member
    assert digests != tree_digests(root, files)
    assert set(digests) == {"host", "docs"}
    assert observed_tree(root, files, "v.zip", "a" * 64, 10, "c" * 64) == Observed(
        "v.zip", "a" * 64, 10, digests, "c" * 64)
    assert observed_tree(root, files, "v.zip") == Observed("v.zip", None, None, digests, None)


def test_an_extraction_with_the_components_installed_beside_it(tmp_path: Path, archive: Path) -> None:
    old = write_manifest(tmp_path / "old", components=["host"], partial=True, unpacked_size=100,
                         central_directory_sha256=directory_sha256(archive.read_bytes()),
                         files={"sdk.yaml": "0" * 64})
    (old.root / "sdk.yaml").write_text("old")
    extracted, parts = extract_components(archive, ["android"], tmp_path / "x")
    merged, files, unpacked = with_installed(old, extracted, parts, str(archive))
    assert merged == Parts(("host", "android"), True, parts.central_directory_sha256)
    assert files == {"sdk.yaml": "0" * 64, **extracted.files}
    assert unpacked == extracted.size + 100
    assert (extracted.root / "sdk.yaml").read_text() == "old"
    # From a whole archive (no `partial`, no size recorded), and another archive refused.
    whole = write_manifest(tmp_path / "whole", components=["host"], central_directory_sha256="f" * 64)
    again, _ = extract_components(archive, ["android"], tmp_path / "y")
    with pytest.raises(IntegrityError) as refused:
        with_installed(whole, again, parts, "v.zip")
    assert refused.value.message.startswith("v.zip is not the archive SDK")
    unchecked = parts._replace(central_directory_sha256=None)
    assert with_installed(whole, again, unchecked, "v.zip") == (Parts(("host", "android"), False, None),
                                                               {**again.files}, again.size)


# -- by parts, from the loopback server ------------------------------------------------------------


@pytest.fixture
def served(server: FaultServer, plain_zip: bytes) -> FaultServer:
    server.add(PATH, plain_zip)
    return server


def _job(server: FaultServer, cache: Cache, work: Path) -> RangedInstall:
    work.mkdir(parents=True, exist_ok=True)
    return RangedInstall(VERSION, [server.url(PATH)], NAME, cache, work, PlainProgress)


@pytest.fixture
def job(served: FaultServer, cache_dir: Path, tmp_path: Path) -> Iterator[RangedInstall]:
    opened = _job(served, Cache(cache_dir), tmp_path / "work")
    yield opened
    opened.close()
    opened.remove()


def test_opening_reads_the_end_of_the_archive_and_its_directory(job: RangedInstall, served: FaultServer,
                                                                plain_zip: bytes, cache_dir: Path) -> None:
    job.open(UNPINNED)
    assert job.central_directory_sha256() == directory_sha256(plain_zip)
    assert job.records is not None
    assert job.sparse is not None
    end = plain_zip.rfind(b"PK\x05\x06")
    size, offset = struct.unpack_from("<LL", plain_zip, end + 12)
    assert (job.records.cd_start, job.records.cd_size) == (offset, size)
    assert job.sparse.covers(offset, len(plain_zip))
    assert (cache_dir / "downloads").is_dir()
    job.remove()
    assert list((cache_dir / "downloads").iterdir()) == []


def _refused_opening(server: FaultServer, cache: Cache, work: Path,
                     limit: tuple[int, str] = UNPINNED) -> IntegrityError:
    """What opening the archive `server` serves is refused with; the job closed and removed."""
    job = _job(server, cache, work)
    try:
        with pytest.raises(IntegrityError) as caught:
            job.open(limit)
        assert job.sparse is None or job.records is None
    finally:
        job.close()
        job.remove()
    return caught.value


def test_an_archive_of_exactly_the_size_pinned_is_opened(job: RangedInstall, plain_zip: bytes) -> None:
    job.open((len(plain_zip), "the lock pins"))
    assert job.central_directory_sha256() == directory_sha256(plain_zip)


def test_a_central_directory_larger_than_any_sdks_is_refused_before_it_is_fetched(
        server: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    """The end records say where the directory is and how long: a server's word, read before
    anything vouches for it. One of 96 MiB (a server could say 32 GiB, and fill the disk with it
    before zipfile held it whole in memory) is refused from the end records, unfetched."""
    claimed = 96 << 20
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, claimed, 0, 0)
    server.add(PATH, bytes(claimed) + end)
    refused = _refused_opening(server, Cache(cache_dir), tmp_path / "work")
    assert refused.message == (f"unsafe archive: its central directory of {claimed} bytes is larger than any "
                               f"SDK's (at most {64 << 20})")
    assert server.bytes_served(PATH) < 1 << 20, server.bytes_served(PATH)


def _end_of(said: int, tail: int = 16 << 10) -> Fault:
    """The answer to the probe of an archive that the server says is `said` bytes long."""
    return Fault.raw(b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n\r\n"
                     % (said - tail, said - 1, said, tail) + bytes(tail))


@pytest.mark.parametrize("said", [MOST_ARCHIVE + 1, 1 << 62], ids=["a-byte-past-the-most", "2**62"])
def test_an_archive_said_to_be_longer_than_the_size_allowed_is_refused_before_a_byte_is_kept(
        server: FaultServer, cache_dir: Path, tmp_path: Path, said: int) -> None:
    """The probe's Content-Range names the archive's size: a server's word, held to the size pinned
    (or the most any archive is) before the sparse file is made. A sparse file of 2**62 bytes once
    ended in "cannot use: File too large", and one of 16 GiB would have been kept."""
    server.add(PATH, b"")
    server.fail(PATH, _end_of(said))
    refused = _refused_opening(server, Cache(cache_dir), tmp_path / "work")
    assert refused.message == (
        f"{server.url(PATH)} is longer than {MOST_ARCHIVE} bytes, the size qnnctl takes as the most any SDK archive "
        f"is (it says the file is {said} bytes): it is not that archive; the download was stopped and removed, and "
        "nothing was installed")
    assert not any((cache_dir / "downloads").glob("*.sparse*"))
    server.fail(PATH, _end_of((1 << 20) + 1))
    refused = _refused_opening(server, Cache(cache_dir), tmp_path / "work", (1 << 20, "the lock pins"))
    assert f"is longer than {1 << 20} bytes, the size the lock pins (it says the file is {(1 << 20) + 1} bytes)" \
        in refused.message


def test_an_end_record_further_than_the_first_read_is_fetched(server: FaultServer, cache_dir: Path,
                                                              tmp_path: Path) -> None:
    data = sdk_zip(tmp_path / "a", comment=b"c" * 60_000).read_bytes()
    server.add(PATH, data)
    job = _job(server, Cache(cache_dir), tmp_path / "work")
    try:
        job.open(UNPINNED)
        assert job.central_directory_sha256() == directory_sha256(data)
        assert job.records is not None
        end = data.rfind(b"PK\x05\x06")
        assert job.records.tail_start == end
    finally:
        job.close()
        job.remove()


def test_installing_some_components_fetches_their_members_only(job: RangedInstall, served: FaultServer,
                                                               plain_zip: bytes, tmp_path: Path) -> None:
    job.open(UNPINNED)
    root, top, files, size, version = job.install(["host"], None)
    assert (root, top, version) == (tmp_path / "work" / "x" / TOP, str(TOP), VERSION)
    assert files_below(root) == HOST
    assert files == {name: hashlib.sha256((root / name).read_bytes()).hexdigest()
                     for name in HOST - {"lib/x86_64-linux-clang/libQnnHtp.so.2"}}
    assert size == sum((root / name).stat().st_size for name in files)
    skipped = [span_of(plain_zip, name) for name in (*ANDROID, *V73)]
    for served_range in (r for s in served.served_for(PATH) for r in s.ranges):
        for start, end in skipped:
            assert served_range[1] <= start or served_range[0] >= end, (served_range, start, end)


def test_components_added_fetch_only_what_the_sdk_lacks(server: FaultServer, cache_dir: Path,
                                                        tmp_path: Path) -> None:
    """The SDK holds a link into hexagon-v73, whose folder is gone: the link is followed from
    what is on disk, and what it leads to comes with the component asked for."""
    data = sdk_zip(tmp_path / "a", {"lib/x86_64-linux-clang/libQnnHtpV73.cat": "../hexagon-v73/libQnnHtpV73.cat"}
                   ).read_bytes()
    server.add(PATH, data)
    cache = Cache(cache_dir)
    first = _job(server, cache, tmp_path / "first")
    first.open(UNPINNED)
    host_root, _, _, _, _ = first.install(["host"], None)
    first.close()
    first.remove()
    assert files_below(host_root) == HOST | V73 | {"lib/x86_64-linux-clang/libQnnHtpV73.cat"}
    shutil.rmtree(host_root / "lib/hexagon-v73")
    old = write_manifest(host_root, components=["host"])
    job = _job(server, cache, tmp_path / "second")
    job.open(UNPINNED)
    try:
        root, _, files, _, _ = job.install(["android"], old)
    finally:
        job.close()
        job.remove()
    assert set(files) == files_below(root) == ANDROID | V73


def test_a_directory_whose_links_cannot_be_read_is_refused_by_parts(server: FaultServer, archive: Path,
                                                                    cache_dir: Path, tmp_path: Path) -> None:
    _bad_link_crc(archive, f"{TOP}/lib/x86_64-linux-clang/libQnnHtp.so.2")
    server.add(PATH, archive.read_bytes())
    job = _job(server, Cache(cache_dir), tmp_path / "work")
    try:
        job.open(UNPINNED)
        with pytest.raises(IntegrityError) as refused:
            job.install(["host"], None)
    finally:
        job.close()
        job.remove()
    assert refusal(refused) == (
        f"the central directory of {server.url(PATH)} cannot be read: Bad CRC-32 for file "
        f"'{TOP}/lib/x86_64-linux-clang/libQnnHtp.so.2'", "nothing was installed; check the URL or mirror")


def test_a_member_refused_while_fetching_stops_the_fetch(server: FaultServer, plain_zip: bytes, cache_dir: Path,
                                                        tmp_path: Path) -> None:
    """The host library's local header gives another CRC-32 than the directory."""
    with zipfile.ZipFile(io.BytesIO(plain_zip)) as zf:
        local = zf.getinfo(f"{TOP}/lib/x86_64-linux-clang/libQnnCpu.so").header_offset
    data = bytearray(plain_zip)
    data[local + 14] ^= 1
    server.add(PATH, bytes(data))
    job = _job(server, Cache(cache_dir), tmp_path / "work")
    try:
        job.open(UNPINNED)
        with pytest.raises(IntegrityError, match="local header that disagrees with the central directory"):
            job.install(["host"], None)
    finally:
        job.close()
        job.remove()


def test_a_job_never_opened_has_nothing_to_close_or_remove(served: FaultServer, cache_dir: Path,
                                                           tmp_path: Path) -> None:
    job = _job(served, Cache(cache_dir), tmp_path / "work")
    job.close()
    job.remove()
    assert (job.version, job.urls, job.name, job.work) == (VERSION, [served.url(PATH)], NAME, tmp_path / "work")
    assert job.sparse is None
    assert job.records is None


def test_a_tar_whose_extended_headers_pass_the_bounds_is_refused(tmp_path: Path) -> None:
    """Each GNU long name makes tarfile read the next header from inside its own reading: 400 of
    them (a kilobyte compressed) ran Python out of stack."""
    archive = tmp_path / "deep.tar"
    archive.write_bytes(long_name_chain(f"qairt/{VERSION}", 400))
    with pytest.raises(IntegrityError, match="more than 8 extended tar headers in a row"):
        tar_members(archive)


# -- install_components ----------------------------------------------------------------------------


def _install(server: FaultServer, cache_dir: Path, components: list[str], old: Sdk | None = None,
             expected: list[Expected] | None = None, sha256: str | None = None, force: bool = False) -> Sdk:
    return install_components(VERSION, [server.url(PATH)], NAME, components, expected or [], Cache(cache_dir),
                              force, False, old, sha256)


def test_an_install_of_some_components_by_parts(served: FaultServer, plain_zip: bytes, cache_dir: Path) -> None:
    sdk = _install(served, cache_dir, ["host"])
    assert sdk == Sdk(cache_dir / "sdks" / VERSION, VERSION, "qnnctl cache")
    manifest = read_manifest(sdk.root) or {}
    assert files_below(sdk.root) == HOST
    assert {k: manifest[k] for k in ("components", "partial", "central_directory_sha256", "sha256", "size",
                                     "source")} == {
        "components": ["host"], "partial": True, "central_directory_sha256": directory_sha256(plain_zip),
        "sha256": None, "size": len(plain_zip), "source": served.url(PATH)}
    assert manifest["component_sha256"] == tree_digests(sdk.root, skip={MANIFEST_NAME})
    assert list((cache_dir / "downloads").iterdir()) == []
    assert list((cache_dir / "tmp").iterdir()) == []
    host_size = manifest["unpacked_size"]

    added = _install(served, cache_dir, ["android"], old=sdk)
    assert added == sdk
    manifest = read_manifest(sdk.root) or {}
    assert files_below(sdk.root) == HOST | ANDROID
    assert manifest["components"] == ["host", "android"]
    assert manifest["partial"] is True
    assert set(manifest["files"]) == (HOST | ANDROID) - {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    assert manifest["unpacked_size"] == host_size + sum((sdk.root / n).stat().st_size for n in ANDROID)
    assert manifest["component_sha256"] == tree_digests(sdk.root, skip={MANIFEST_NAME})
    assert set(manifest["component_sha256"]) == {"host", "android"}


def test_a_link_into_another_component_is_recorded_with_it(server: FaultServer, cache_dir: Path,
                                                           tmp_path: Path) -> None:
    data = sdk_zip(tmp_path, {"lib/x86_64-linux-clang/libQnnHtpV73.cat": "../hexagon-v73/libQnnHtpV73.cat"})
    server.add(PATH, data.read_bytes())
    sdk = _install(server, cache_dir, ["host"])
    assert (read_manifest(sdk.root) or {})["components"] == ["host", "hexagon-v73"]


def test_components_added_from_another_archive_are_refused(served: FaultServer, cache_dir: Path,
                                                           tmp_path: Path) -> None:
    sdk = _install(served, cache_dir, ["host"])
    before = read_manifest(sdk.root)
    other = sdk_zip(tmp_path / "other", {"docs/more.txt": "guide.txt"}).read_bytes()
    served.add(PATH, other)
    with pytest.raises(IntegrityError) as refused:
        _install(served, cache_dir, ["android"], old=sdk)
    assert refused.value.message.startswith(f"{served.url(PATH)} is not the archive SDK {VERSION} was installed from")
    assert read_manifest(sdk.root) == before
    assert list((cache_dir / "downloads").iterdir()) == []


def test_a_component_the_archive_lacks_leaves_nothing(served: FaultServer, cache_dir: Path) -> None:
    with pytest.raises(UsageError) as refused:
        _install(served, cache_dir, ["hexagon-v99"])
    assert refused.value.message == (f"{served.url(PATH)} has no hexagon-v99: its components are host, android, "
                                     "hexagon-v73, hexagon-v75, docs")
    assert list((cache_dir / "downloads").iterdir()) == []
    assert not (cache_dir / "sdks" / VERSION).exists()


def test_from_a_server_that_ignores_ranges_the_whole_archive(served: FaultServer, plain_zip: bytes,
                                                             cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    served.ignore_ranges = True
    with caplog.at_level("WARNING", logger="qnnctl"):
        sdk = _install(served, cache_dir, ["host", "android"])
    manifest = read_manifest(sdk.root) or {}
    assert files_below(sdk.root) == HOST | ANDROID
    assert (manifest["components"], manifest["partial"]) == (["host", "android"], False)
    assert manifest["sha256"] == hashlib.sha256(plain_zip).hexdigest()
    assert manifest["central_directory_sha256"] == directory_sha256(plain_zip)
    assert manifest["component_sha256"] == tree_digests(sdk.root, skip={MANIFEST_NAME})
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [f"{served.url(PATH)} answered a ranged request with the whole file (HTTP 200): downloading "
                      "the whole archive instead, then installing only host, android"]
    assert list((cache_dir / "downloads").iterdir()) == []


def test_a_whole_download_of_a_pinned_archive_stops_at_the_size_pinned(served: FaultServer, plain_zip: bytes,
                                                                     cache_dir: Path) -> None:
    """A pin of the whole archive alone has it fetched whole (its sha256 is all that can check it),
    and says its size: a server sending without end is stopped there."""
    served.fail(PATH, Fault.endless(b"PK\x03\x04" + bytes(1 << 16), 256 << 20))
    pinned = Expected("the lock", "the lock", "pins", "lock it again", sha256=hashlib.sha256(plain_zip).hexdigest(),
                      size=len(plain_zip))
    with pytest.raises(IntegrityError) as refused:
        _install(served, cache_dir, ["host"], expected=[pinned])
    assert f"is longer than {len(plain_zip)} bytes" in refused.value.message, refused.value.message
    assert served.bytes_served(PATH) < 32 << 20
    assert list((cache_dir / "downloads").iterdir()) == []


def test_a_whole_archive_is_fetched_where_only_its_sha256_can_check_it(served: FaultServer, plain_zip: bytes,
                                                                       cache_dir: Path) -> None:
    digest = hashlib.sha256(plain_zip).hexdigest()
    pinned = Expected("qnnctl.lock", "the lock", "pins", "update the lock", sha256=digest, size=len(plain_zip))
    sdk = _install(served, cache_dir, ["host"], expected=[pinned], sha256=digest)
    manifest = read_manifest(sdk.root) or {}
    assert (manifest["sha256"], manifest["partial"], manifest["components"]) == (digest, False, ["host"])
    (request,) = served.requests_for(PATH)
    assert "Range" not in request.headers
    # A wrong one is refused before anything is installed.
    wrong = pinned._replace(sha256="0" * 64)
    with pytest.raises(IntegrityError):
        _install(served, cache_dir, ["android"], old=sdk, expected=[wrong])
    assert files_below(sdk.root) == HOST


def test_on_another_host_than_x86_64_components_digests_make_the_install_whole(
        server: FaultServer, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Components' digests partition an SDK as on x86_64: on aarch64 they cannot check the host's
    folders alone, so the whole SDK is installed and checked whole; with nothing that pins
    components, the same install is by parts."""
    archive = build_two_host_archive(tmp_path)
    data = archive.read_bytes()
    server.add(PATH, data)
    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", "aarch64")
    pinned = Expected("qnnctl.lock", "the lock", "pins", "update the lock", sha256=hashlib.sha256(data).hexdigest(),
                      size=len(data), components=zip_digests(archive))
    with caplog.at_level("WARNING", logger="qnnctl"):
        sdk = _install(server, cache_dir, ["host"], expected=[pinned])
    manifest = read_manifest(sdk.root) or {}
    assert (manifest["components"], manifest["partial"], manifest["sha256"]) == (
        ["all"], False, hashlib.sha256(data).hexdigest())
    assert (sdk.root / "lib" / "aarch64-android").is_dir()  # the whole SDK
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "qnnctl.lock pins components' digests as on Linux x86_64, which do not cover this Linux aarch64 host's "
        "components: installing the whole SDK, checked whole"]
    assert not any(r.headers.get("Range") for r in server.requests)
    shutil.rmtree(cache_dir / "sdks")
    by_parts = _install(server, cache_dir, ["host"])
    assert (read_manifest(by_parts.root) or {})["partial"] is True
    assert not (by_parts.root / "lib" / "aarch64-android").exists()


def test_on_another_host_than_x86_64_the_whole_install_is_the_one_asked_for(
        server: FaultServer, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole install that components' digests make on aarch64 replaces the SDK whose
    components it adds, as any install of components added does, and checks a --sha256 given
    as its download arrives."""
    archive = build_two_host_archive(tmp_path)
    data = archive.read_bytes()
    server.add(PATH, data)
    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", "aarch64")
    sdk = _install(server, cache_dir, ["host"])  # by parts: nothing pins components
    assert not (sdk.root / "lib" / "aarch64-android").exists()
    pinned = Expected("qnnctl.lock", "the lock", "pins", "update the lock", components=zip_digests(archive))
    assert _install(server, cache_dir, ["android"], old=sdk, expected=[pinned]) == sdk
    manifest = read_manifest(sdk.root) or {}
    assert (manifest["components"], manifest["partial"]) == (["all"], False)
    assert (sdk.root / "lib" / "aarch64-android").is_dir()
    shutil.rmtree(cache_dir / "sdks")
    wrong = "0" * 64
    given = Expected("--sha256", "--sha256", "expects", "check the --sha256 value", sha256=wrong)
    with pytest.raises(IntegrityError) as refused:
        _install(server, cache_dir, ["host"], expected=[pinned, given], sha256=wrong)
    assert refusal(refused) == (
        f"sha256 mismatch for {server.url(PATH)}: expected {wrong}, got {hashlib.sha256(data).hexdigest()}",
        "the download was removed; check the --sha256 value or the mirror's file")
    assert list((cache_dir / "downloads").iterdir()) == []
    assert not (cache_dir / "sdks" / VERSION).exists()


def test_a_missing_component_found_in_the_whole_archive_says_it_stays(served: FaultServer, cache_dir: Path) -> None:
    served.ignore_ranges = True
    with pytest.raises(UsageError) as refused:
        _install(served, cache_dir, ["hexagon-v99"])
    kept = cache_dir / "downloads" / NAME
    assert refused.value.hint == (
        "ask only for some of those (`--components host`), or install from an archive that has them; the whole "
        f"archive stays in {kept}, so that the next install of this version reads it instead of downloading it "
        "again (`qnnctl cache clean` removes it)")
    assert kept.is_file()


def test_an_archive_that_changes_part_way_is_said_and_its_parts_removed(served: FaultServer, plain_zip: bytes,
                                                                        cache_dir: Path) -> None:
    """A range of the archive refused after its end was read (HTTP 416): it is shorter now."""
    served.fail(PATH, Fault.none(), Fault.status(416))
    with pytest.raises(DownloadError) as refused:
        _install(served, cache_dir, ["host"])
    url = served.url(PATH)
    assert refused.value.message.startswith(
        f"{url} changed on the server while its parts were being fetched: {url} refused bytes ")
    assert refused.value.message.endswith(f" of its {len(plain_zip)} (HTTP 416)")
    assert refused.value.hint == "the parts fetched were removed; run the same command again"
    assert refused.value.__suppress_context__
    assert list((cache_dir / "downloads").iterdir()) == []
    assert not (cache_dir / "sdks" / VERSION).exists()


# -- more of RangedInstall ------------------------------------------------------------------------


def _ranged(server: FaultServer, cache_dir: Path, work: Path, components: list[str], old: Sdk | None = None
            ) -> tuple[Path, str, dict[str, str], int, str | None]:
    job = _job(server, Cache(cache_dir), work)
    try:
        job.open(UNPINNED)
        return job.install(components, old)
    finally:
        job.close()
        job.remove()


def test_links_are_followed_by_parts_from_link_to_link(server: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    """A host link to an Android link, which leads into hexagon-v73: read in two rounds."""
    data = sdk_zip(tmp_path / "a", {"lib/x86_64-linux-clang/skel.so": "../aarch64-android/skel.so",
                                    "lib/aarch64-android/skel.so": "../hexagon-v73/libQnnHtpV73.cat"}).read_bytes()
    server.add(PATH, data)
    root, _, files, _, _ = _ranged(server, cache_dir, tmp_path / "work", ["host"])
    assert files_below(root) == HOST | ANDROID | V73 | {"lib/x86_64-linux-clang/skel.so", "lib/aarch64-android/skel.so"}
    assert set(files) == (HOST | ANDROID | V73) - {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    assert (root / "lib/x86_64-linux-clang/skel.so").read_bytes() == EXTRA["lib/hexagon-v73/libQnnHtpV73.cat"]


def test_a_link_whose_local_header_disagrees_is_refused_by_parts(server: FaultServer, plain_zip: bytes,
                                                                 cache_dir: Path, tmp_path: Path) -> None:
    name = f"{TOP}/lib/x86_64-linux-clang/libQnnHtp.so.2"
    with zipfile.ZipFile(io.BytesIO(plain_zip)) as zf:
        local = zf.getinfo(name).header_offset
    data = bytearray(plain_zip)
    data[local + 14] ^= 1  # its CRC-32, in the local header only
    server.add(PATH, bytes(data))
    with pytest.raises(IntegrityError) as refused:
        _ranged(server, cache_dir, tmp_path / "work", ["host"])
    assert refused.value.message.startswith(f"unsafe archive: {name!r} has a local header that disagrees with the "
                                            "central directory: CRC-32 ")


def test_a_link_added_may_lead_to_a_member_installed(server: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    """The Android link needs a host library, which is there already: only Android's members
    are written, beside it. A folder of the SDK that the archive has no entry for is no member."""
    data = sdk_zip(tmp_path / "a", {"lib/aarch64-android/libQnnCpu.so": "../x86_64-linux-clang/libQnnCpu.so"}
                   ).read_bytes()
    server.add(PATH, data)
    host_root, _, _, _, _ = _ranged(server, cache_dir, tmp_path / "first", ["host"])
    (host_root / "lib/x86_64-linux-clang/extra").mkdir()
    old = write_manifest(host_root, components=["host"])
    root, _, files, _, _ = _ranged(server, cache_dir, tmp_path / "second", ["android"], old)
    assert files_below(root) == ANDROID | {"lib/aarch64-android/libQnnCpu.so"}
    assert set(files) == ANDROID


def test_the_progress_of_the_parts_is_named_by_version_and_components(
        served: FaultServer, cache_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="qnnctl.net.download"):
        _ranged(served, cache_dir, tmp_path / "work", ["host", "docs"])
    said = [r.getMessage() for r in caplog.records if r.name == "qnnctl.net.download"]
    assert len(said) == 1
    assert said[0].startswith(f"{VERSION} (host,docs): ")


def test_the_parts_need_room_for_their_bytes(served: FaultServer, plain_zip: bytes, cache_dir: Path,
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=0))
    with pytest.raises(DiskSpaceError) as refused:
        _ranged(served, cache_dir, tmp_path / "work", ["host"])
    needed = refused.value.needed
    assert needed is not None
    assert refused.value.message == (f"not enough free space in {cache_dir / 'downloads'} to download the archive's "
                                     f"parts: need {needed / (1 << 20):.1f} MiB, 0.0 MiB free")
    # What is missing of the host files' bytes (the archive's last 16 KiB are there), and the margin.
    tail = len(plain_zip) - (16 << 10)
    with zipfile.ZipFile(io.BytesIO(plain_zip)) as zf:
        infos = sorted(zf.infolist(), key=lambda i: i.header_offset)
    starts = [i.header_offset for i in infos] + [len(plain_zip)]
    least = most = 0
    for index, info in enumerate(infos):
        if info.filename[len(f"{TOP}/"):] in HOST and not info.filename.endswith(".so.2"):
            start = info.header_offset
            least += max(0, min(start + 30 + len(info.filename) + info.compress_size, tail) - start)
            most += max(0, min(starts[index + 1], tail) - start)
    assert least > 0
    assert least <= needed - (1 << 20) <= most


# -- more of install_components --------------------------------------------------------------------


def test_the_components_written_are_checked_at_the_gate(served: FaultServer, cache_dir: Path) -> None:
    pinned = Expected("qnnctl.lock", "the lock", "pins", "update the lock", components={"host": "0" * 64})
    with pytest.raises(IntegrityError) as refused:
        _install(served, cache_dir, ["host"], expected=[pinned])
    assert refused.value.message.startswith(f"the archive from {served.url(PATH)} does not match qnnctl.lock: the "
                                            "digest of its component host is ")
    assert not (cache_dir / "sdks" / VERSION).exists()
    assert list((cache_dir / "downloads").iterdir()) == []


def test_an_archive_of_another_version_is_refused_by_parts(server: FaultServer, cache_dir: Path,
                                                           tmp_path: Path) -> None:
    other = build_archive(tmp_path, "zip", SdkSpec(version=OTHER_VERSION))
    server.add(PATH, other.read_bytes())
    with pytest.raises(IntegrityError) as refused:
        _install(server, cache_dir, ["host"])
    assert refusal(refused) == (
        f"{server.url(PATH)} holds SDK {OTHER_VERSION}, not {VERSION}",
        f"check the URL or QNNCTL_MIRROR; to install {OTHER_VERSION}, run `qnnctl install {OTHER_VERSION}` with a "
        "source that serves it")
    server.ignore_ranges = True  # and whole
    with pytest.raises(IntegrityError) as whole:
        _install(server, cache_dir, ["host"])
    assert refusal(whole) == refusal(refused)


def test_a_member_of_no_component_is_not_recorded_as_one(server: FaultServer, cache_dir: Path,
                                                          tmp_path: Path) -> None:
    data = sdk_zip(tmp_path, {"lib/x86_64-linux-clang/QnnHtp.dll": "../x86_64-windows-msvc/QnnHtp.dll"})
    server.add(PATH, data.read_bytes())
    sdk = _install(server, cache_dir, ["host"])
    manifest = read_manifest(sdk.root) or {}
    assert manifest["components"] == ["host"]
    assert set(manifest["component_sha256"]) == {"host", "other"}
    assert (sdk.root / "lib/x86_64-windows-msvc/QnnHtp.dll").is_file()


def test_components_added_by_a_whole_download(served: FaultServer, plain_zip: bytes, cache_dir: Path) -> None:
    """A pin of the whole archive: the whole archive, checked, then the SDK's components and
    those asked for installed from it in place of the SDK."""
    sdk = _install(served, cache_dir, ["host"])
    digest = hashlib.sha256(plain_zip).hexdigest()
    pinned = Expected("qnnctl.lock", "the lock", "pins", "update the lock", sha256=digest, size=len(plain_zip))
    added = _install(served, cache_dir, ["android"], old=sdk, expected=[pinned], sha256=digest)
    assert added == sdk
    manifest = read_manifest(sdk.root) or {}
    assert files_below(sdk.root) == HOST | ANDROID
    assert {k: manifest[k] for k in ("components", "partial", "sha256", "size", "source", "file_count")} == {
        "components": ["host", "android"], "partial": False, "sha256": digest, "size": len(plain_zip),
        "source": served.url(PATH), "file_count": len(HOST | ANDROID) - 1}
    assert manifest["unpacked_size"] == sum((sdk.root / n).stat().st_size for n in manifest["files"])
    assert manifest["component_sha256"] == tree_digests(sdk.root, skip={MANIFEST_NAME})


def test_components_added_to_an_sdk_from_another_whole_archive_are_refused(
        server: FaultServer, plain_zip: bytes, cache_dir: Path, tmp_path: Path) -> None:
    """The SDK recorded its archive's sha256 (installed from a file): a server that ignores
    ranges sends another archive of the version, which that sha256 refuses."""
    server.add(PATH, plain_zip)
    server.ignore_ranges = True
    sdk = _install(server, cache_dir, ["host"])
    manifest = read_manifest(sdk.root) or {}
    assert manifest["sha256"] == hashlib.sha256(plain_zip).hexdigest()
    other = sdk_zip(tmp_path / "other", {"docs/more.txt": "guide.txt"}).read_bytes()
    server.add(PATH, other)
    with pytest.raises(IntegrityError) as refused:
        _install(server, cache_dir, ["android"], old=sdk)
    assert refusal(refused) == (
        f"the archive from {server.url(PATH)} does not match SDK {VERSION} installed at {sdk.root}: its sha256 is "
        f"{hashlib.sha256(other).hexdigest()}, the SDK installed came from an archive with "
        f"{manifest['sha256']}; nothing was installed",
        f"to replace the SDK with this archive's: `qnnctl install --force {VERSION} --components ...`")
    assert files_below(sdk.root) == HOST


def test_a_sha256_given_is_checked_by_the_whole_download(served: FaultServer, plain_zip: bytes,
                                                         cache_dir: Path) -> None:
    wrong = "0" * 64
    given = Expected("--sha256", "--sha256", "expects", "check the --sha256 value", sha256=wrong)
    with pytest.raises(IntegrityError) as refused:
        _install(served, cache_dir, ["host"], expected=[given], sha256=wrong)
    assert refusal(refused) == (
        f"sha256 mismatch for {served.url(PATH)}: expected {wrong}, got {hashlib.sha256(plain_zip).hexdigest()}",
        "the download was removed; check the --sha256 value or the mirror's file")
    assert list((cache_dir / "downloads").iterdir()) == []


# -- what a whole download is checked against, and what it records ---------------------------------


BUILD = "v2.37.0.250724101112"  # what libraries of VERSION carry


def test_an_sdk_already_installed_is_kept_without_force(served: FaultServer, cache_dir: Path) -> None:
    """Another qnnctl installed the version meanwhile: its folder stays, by parts and whole."""
    for ignore_ranges in (False, True):
        served.ignore_ranges = ignore_ranges
        root = build_sdk_tree(cache_dir / "sdks" / VERSION)
        write_manifest(root)
        (root / "mine").write_text("kept")
        assert _install(served, cache_dir, ["host"]) == Sdk(root, VERSION, "qnnctl cache")
        assert (root / "mine").read_text() == "kept"
        assert _install(served, cache_dir, ["host"], force=True) == Sdk(root, VERSION, "qnnctl cache")
        assert not (root / "mine").exists()
        shutil.rmtree(root)


@pytest.mark.parametrize("ignore_ranges", [False, True], ids=["parts", "whole"])
def test_the_libraries_build_is_recorded(server: FaultServer, cache_dir: Path, tmp_path: Path,
                                         ignore_ranges: bool) -> None:
    server.add(PATH, build_archive(tmp_path, "zip", SdkSpec(build_id=BUILD)).read_bytes())
    server.ignore_ranges = ignore_ranges
    sdk = _install(server, cache_dir, ["host"])
    assert (read_manifest(sdk.root) or {})["build_id"] == BUILD[1:]


@pytest.mark.parametrize("ignore_ranges", [False, True], ids=["parts", "whole"])
def test_a_top_folder_of_another_version_is_taken_when_the_libraries_are_the_one_asked_for(
        server: FaultServer, cache_dir: Path, tmp_path: Path, ignore_ranges: bool) -> None:
    spec = SdkSpec(top=f"qairt/{OTHER_VERSION}", build_id=BUILD)
    server.add(PATH, build_archive(tmp_path, "zip", spec).read_bytes())
    server.ignore_ranges = ignore_ranges
    sdk = _install(server, cache_dir, ["host"])
    assert sdk == Sdk(cache_dir / "sdks" / VERSION, VERSION, "qnnctl cache")


@pytest.mark.parametrize("ignore_ranges", [False, True], ids=["parts", "whole"])
def test_without_a_build_the_top_folder_says_the_version_before_sdk_yaml(
        server: FaultServer, cache_dir: Path, tmp_path: Path, ignore_ranges: bool) -> None:
    spec = SdkSpec(extra_files={"sdk.yaml": f"name: qairt\nversion: {OTHER_VERSION}\n".encode()})
    server.add(PATH, build_archive(tmp_path, "zip", spec).read_bytes())
    server.ignore_ranges = ignore_ranges
    assert _install(server, cache_dir, ["host"]).version == VERSION


@pytest.mark.parametrize("ignore_ranges", [False, True], ids=["parts", "whole"])
def test_a_link_into_another_component_is_recorded_whole_or_by_parts(server: FaultServer, cache_dir: Path,
                                                                    tmp_path: Path, ignore_ranges: bool) -> None:
    data = sdk_zip(tmp_path, {"lib/x86_64-linux-clang/libQnnHtpV73.cat": "../hexagon-v73/libQnnHtpV73.cat"})
    server.add(PATH, data.read_bytes())
    server.ignore_ranges = ignore_ranges
    sdk = _install(server, cache_dir, ["host"])
    manifest = read_manifest(sdk.root) or {}
    assert manifest["components"] == ["host", "hexagon-v73"]
    assert set(manifest["component_sha256"]) == {"host", "hexagon-v73"}


def test_a_pin_of_the_whole_archive_is_checked_before_it_is_read(server: FaultServer, cache_dir: Path) -> None:
    """What was served is no archive: its sha256 and size, pinned, are what refuse it."""
    page = b"<p>not an archive</p>" * 100
    server.add(PATH, page)
    digest = hashlib.sha256(page).hexdigest()
    url = server.url(PATH)
    for sha256, size, said in ((
            "0" * 64, len(page), f"the archive from {url} does not match qnnctl.lock: its sha256 is {digest}, "
            f"the lock pins {'0' * 64}"), (
            digest, len(page) + 1, f"qnnctl.lock contradicts itself: the archive from {url} has the sha256 the "
            f"lock pins, but its size is {len(page)}, and the lock pins {len(page) + 1}")):
        pinned = Expected("qnnctl.lock", "the lock", "pins", "update the lock", sha256=sha256, size=size)
        with pytest.raises(IntegrityError) as refused:
            _install(server, cache_dir, ["host"], expected=[pinned])
        assert refusal(refused) == (f"{said}; nothing was installed", "update the lock")
        assert list((cache_dir / "downloads").iterdir()) == []


def test_what_a_whole_download_is_checked_against_after_it_is_extracted(served: FaultServer, plain_zip: bytes,
                                                                       cache_dir: Path) -> None:
    """A server that ignores ranges: the components and the central directory pinned are
    checked on what the whole archive installs."""
    served.ignore_ranges = True
    url = served.url(PATH)
    pinned = Expected("qnnctl.lock", "the lock", "pins", "update the lock", components={"host": "0" * 64})
    with pytest.raises(IntegrityError) as refused:
        _install(served, cache_dir, ["host"], expected=[pinned])
    assert refused.value.message.startswith(f"the archive from {url} does not match qnnctl.lock: the digest of its "
                                            "component host is ")
    sdk = _install(served, cache_dir, ["host"])
    host = (read_manifest(sdk.root) or {})["component_sha256"]["host"]
    shutil.rmtree(sdk.root)
    directory = Expected("qnnctl.lock", "the lock", "pins", "update the lock", components={"host": host},
                         central_directory_sha256="0" * 64)
    with pytest.raises(IntegrityError) as other:
        _install(served, cache_dir, ["host"], expected=[directory])
    assert refusal(other) == (
        f"the archive from {url} does not match qnnctl.lock: its central directory's sha256 is "
        f"{directory_sha256(plain_zip)}, the lock pins {'0' * 64}; nothing was installed", "update the lock")


def test_components_added_whole_come_from_the_archive_of_those_installed(
        served: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    sdk = _install(served, cache_dir, ["host"])
    recorded = (read_manifest(sdk.root) or {})["central_directory_sha256"]
    other = sdk_zip(tmp_path / "other", {"docs/more.txt": "guide.txt"}).read_bytes()
    served.add(PATH, other)
    served.ignore_ranges = True
    with pytest.raises(IntegrityError) as refused:
        _install(served, cache_dir, ["android"], old=sdk)
    assert refusal(refused) == (
        f"the archive from {served.url(PATH)} does not match SDK {VERSION} installed at {sdk.root}: its central "
        f"directory's sha256 is {directory_sha256(other)}, the SDK installed came from an archive with {recorded}; "
        "nothing was installed",
        f"to replace the SDK with this archive's: `qnnctl install --force {VERSION} --components ...`")


@pytest.mark.parametrize("ignore_ranges", [False, True], ids=["parts", "whole"])
def test_progress_is_a_bar_on_a_terminal(served: FaultServer, cache_dir: Path, capsys: pytest.CaptureFixture[str],
                                         ignore_ranges: bool) -> None:
    served.ignore_ranges = ignore_ranges
    install_components(VERSION, [served.url(PATH)], NAME, ["host"], [], Cache(cache_dir), False, True, None)
    assert "iB/" in capsys.readouterr().err
    shutil.rmtree(cache_dir / "sdks" / VERSION)
    _install(served, cache_dir, ["host"])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("fmt", ["zip", "tar.gz"])
def test_a_component_an_archive_on_disk_lacks_is_refused_by_its_name(tmp_path: Path, fmt: str) -> None:
    archive = build_archive(tmp_path, fmt, SdkSpec(extra_files=dict(EXTRA)))
    with pytest.raises(UsageError) as refused:
        choose_in_file(archive, ["hexagon-v99"])
    assert refused.value.message == (f"{archive.name} has no hexagon-v99: its components are host, android, "
                                     "hexagon-v73, hexagon-v75, docs")


def test_an_archive_not_open_yet_cannot_be_read(served: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    job = _job(served, Cache(cache_dir), tmp_path / "work")
    with pytest.raises(RuntimeError, match=r"\Athe archive is not open\Z"):
        job.central_directory_sha256()
    with pytest.raises(RuntimeError, match=r"\Athe archive is not open\Z"):
        job.install(["host"], None)
    # Its end read, not its directory: still not open.
    served.add(PATH, b"\0" * 100_000)
    with pytest.raises(IntegrityError):
        job.open(UNPINNED)
    assert job.sparse is not None
    with pytest.raises(RuntimeError, match=r"\Athe archive is not open\Z"):
        job.central_directory_sha256()
    with pytest.raises(RuntimeError, match=r"\Athe archive is not open\Z"):
        job.install(["host"], None)
    job.close()
    job.remove()


def test_a_folder_on_a_links_way_brings_no_component(tmp_path: Path) -> None:
    """docs/v73.cat leads through hexagon-v75's unsigned/ and back out, into hexagon-v73: that
    component comes whole, hexagon-v75 not at all. A link to a member of no component brings it
    alone, beside the component another link brings."""
    archive = sdk_zip(tmp_path, {"docs/v73.cat": "../lib/hexagon-v75/unsigned/../../hexagon-v73/libQnnHtpV73.cat",
                                 "docs/QnnHtp.dll": "../lib/x86_64-windows-msvc/QnnHtp.dll"})
    choice = _choice(archive, ["docs"])
    assert link_closure(choice) == below(*V73, "lib", "lib/hexagon-v73", "lib/hexagon-v73/unsigned", "lib/hexagon-v75",
                                         "lib/hexagon-v75/unsigned", "lib/x86_64-windows-msvc",
                                         "lib/x86_64-windows-msvc/QnnHtp.dll")


def test_components_pinned_are_those_fetched(served: FaultServer, cache_dir: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock with a digest of android alone: enough to add android by parts to an SDK with host."""
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(tmp_path / "elsewhere"))
    whole = _install(served, tmp_path / "elsewhere", ["host", "android"])
    android = (read_manifest(whole.root) or {})["component_sha256"]["android"]
    sdk = _install(served, cache_dir, ["host"])
    pinned = Expected("qnnctl.lock", "the lock", "pins", "update the lock", components={"android": android})
    asked = len(served.requests_for(PATH))
    _install(served, cache_dir, ["android"], old=sdk, expected=[pinned])
    assert files_below(sdk.root) == HOST | ANDROID
    assert all("Range" in r.headers for r in served.requests_for(PATH)[asked:])


def test_the_size_unpacked_adds_what_the_sdk_recorded(served: FaultServer, cache_dir: Path) -> None:
    sdk = _install(served, cache_dir, ["host"])
    manifest = read_manifest(sdk.root) or {}
    del manifest["unpacked_size"]  # as an older qnnctl wrote it
    (sdk.root / MANIFEST_NAME).write_text(json.dumps(manifest))
    _install(served, cache_dir, ["android"], old=sdk)
    assert (read_manifest(sdk.root) or {})["unpacked_size"] == sum((sdk.root / n).stat().st_size for n in ANDROID)


def test_the_progress_of_an_install_by_parts_is_named_by_version(served: FaultServer, cache_dir: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="qnnctl.net.download"):
        _install(served, cache_dir, ["host"])
    said = [r.getMessage() for r in caplog.records if r.name == "qnnctl.net.download"]
    assert len(said) == 1
    assert said[0].startswith(f"{VERSION} (host): ")


def test_the_parts_of_an_install_that_failed_are_kept_by_the_archives_name(served: FaultServer,
                                                                           cache_dir: Path) -> None:
    """The archive gone part-way: what was fetched stays, for the next run to resume from."""
    served.fail(PATH, Fault.none(), Fault.status(404))
    with pytest.raises(DownloadError) as refused:
        _install(served, cache_dir, ["host"])
    assert refused.value.message == f"{served.url(PATH)} is no longer on the server (HTTP 404)"
    assert sorted(p.name for p in (cache_dir / "downloads").iterdir()) == [f"{NAME}.sparse", f"{NAME}.sparse.json"]
    assert list((cache_dir / "tmp").iterdir()) == []


@pytest.mark.parametrize("ignore_ranges", [False, True], ids=["parts", "whole"])
def test_libraries_of_another_version_are_refused_by_the_source_named(server: FaultServer, cache_dir: Path,
                                                                      tmp_path: Path, ignore_ranges: bool) -> None:
    server.add(PATH, build_archive(tmp_path, "zip", SdkSpec(build_id="v2.34.0.250424101112")).read_bytes())
    server.ignore_ranges = ignore_ranges
    with pytest.raises(IntegrityError) as refused:
        _install(server, cache_dir, ["host"])
    assert refused.value.message == (
        f"{server.url(PATH)} says it is SDK {VERSION} (its top folder and its sdk.yaml), but its libraries are build "
        f"2.34.0.250424101112: SDK {OTHER_VERSION}")


def _early_link(archive: Path) -> bytes:
    """The archive with a host link as its third entry, ahead of the bulk of it (and of its end)."""
    out = io.BytesIO()
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(out, "w") as target:
        infos = source.infolist()
        for index, info in enumerate(infos):
            if index == 2:
                add_zip_entry(target, f"{TOP}/libQnnHtp.so", b"lib/x86_64-linux-clang/libQnnHtp.so",
                              stat.S_IFLNK | 0o777)
            target.writestr(info, source.read(info))
    return out.getvalue()


def test_a_link_far_from_the_end_is_fetched_for_its_target(server: FaultServer, cache_dir: Path,
                                                           tmp_path: Path) -> None:
    data = _early_link(sdk_zip(tmp_path))
    assert span_of(data, "libQnnHtp.so")[1] < len(data) - (16 << 10)
    server.add(PATH, data)
    sdk = _install(server, cache_dir, ["host"])
    assert os.readlink(sdk.root / "libQnnHtp.so") == "lib/x86_64-linux-clang/libQnnHtp.so"


def _tar_at_first_sight(archive: Path) -> bytes:
    """The archive with a host link, stored, as its second entry, whose target puts `ustar` at
    byte 257: where a tar says what it is. Fetched by parts, the link's bytes are there before
    the extraction starts, and the archive's first bytes (its top folder's entry) never are."""
    with zipfile.ZipFile(archive) as source:
        infos = source.infolist()
        contents = [source.read(info) for info in infos]
    assert infos[0].filename == "qairt/"
    name = f"{TOP}/ustar.so"

    def rebuilt(pad: int) -> tuple[bytes, str]:
        target = "./" * (pad // 2) + ("_" if pad % 2 else "") + "ustar.txt"
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as zf:
            for index, (info, content) in enumerate(zip(infos, contents)):
                zf.writestr(info, content)
                if index == 0:
                    link = zipfile.ZipInfo(name, date_time=(2025, 7, 24, 0, 0, 0))
                    link.create_system, link.external_attr = 3, (stat.S_IFLNK | 0o777) << 16
                    zf.writestr(link, target, compress_type=zipfile.ZIP_STORED)
            add_zip_entry(zf, f"{TOP}/{target.rsplit('/', 1)[1]}", b"notes", 0o100644)
        return out.getvalue(), target

    first, target = rebuilt(200)
    data, _ = rebuilt(257 - first.index(target.encode()))  # its data starts where it did
    assert data[257:262] == b"ustar"
    return data


def test_an_archive_fetched_by_parts_is_read_as_a_zip_whatever_its_bytes_so_far(
        server: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    server.add(PATH, _tar_at_first_sight(sdk_zip(tmp_path)))
    sdk = _install(server, cache_dir, ["host"])
    assert (sdk.root / "ustar.so").read_bytes() == b"notes"
