"""`qnnctl mirror` and the archive fetch `qnnctl lock` uses (qnnctl.fleet.mirror), called in the
tests' own process: real cache folders, zip archives built here, the loopback server serving the
archives and a mirror's index.json."""

from __future__ import annotations

import calendar
import errno
import hashlib
import json
import os
import pwd
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from qnnctl.errors import IntegrityError, QnnctlError, UsageError
from qnnctl.fleet import mirror
from qnnctl.fleet.archives import add_archives
from qnnctl.fleet.mirror import (
    FetchedArchive,
    Mirrored,
    _finished_downloads,
    _move,
    _true_version,
    archive_build_id,
    fetch_archive,
    make_mirror,
    mirror_versions,
    read_local_index,
)
from qnnctl.install.archive import zip_digests
from qnnctl.net.download import Downloader
from qnnctl.sdk import gate
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import HOST_LIB_DIR
from qnnctl.sdk.lockfile import LockedSdk, write_lock
from tests.conftest import run_qnnctl
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import (
    OTHER_VERSION,
    VERSION,
    SdkSpec,
    add_zip_entry,
    build_archive,
    build_sdk_tree,
    install_tree_into_cache,
)

PATH = f"/{VERSION}/v{VERSION}.zip"
OTHER_PATH = f"/{OTHER_VERSION}/v{OTHER_VERSION}.zip"
BUILD = f"{VERSION}101010"  # as build_id() reads it from the libraries
OTHER_BUILD = f"{OTHER_VERSION}101010"
NEWER = "2.37.1.250807"  # a 2.37 that only the mirror's index lists
INSTALLED = "2.37.2.250901"  # a 2.37 only installed
INDEX_HINT = ("the mirror's file changed after it was indexed; put the right archive back, or index it again with "
              "`qnnctl mirror DIR VERSION` where the mirror is kept")
LOCK_HINT = ("the archive or the mirror serving it changed; if the new archive is the one to trust, write the lock "
             f"again with `qnnctl lock {VERSION}`")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _directory_sha256(data: bytes) -> str:
    """The sha256 of a zip's central directory, found through its end record (the tests'
    archives have no comment, so the record is the file's last 22 bytes)."""
    end = data[-22:]
    assert end[:4] == b"PK\x05\x06"
    size, start = struct.unpack("<2L", end[12:20])
    return _sha256(data[start:start + size])


def _archive(folder: Path, version: str = VERSION, payload: bytes = b"first", built: bool = True) -> Path:
    """A zip of a synthetic SDK of `version`, whose libraries carry its build (unless not `built`)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = SdkSpec(version=version, build_id=f"v{version}101010" if built else None,
                   extra_files={"docs/payload.bin": payload})
    return build_archive(folder, "zip", spec)


def _library(tmp_path: Path, name: str, build: str | None) -> bytes:
    """The bytes of a real shared library `name` that carries `build` (`v2.37.0.250724101010`) or none."""
    root = build_sdk_tree(tmp_path / "libraries" / f"{name}-{build}", SdkSpec(libs=(name,), build_id=build))
    return (root / HOST_LIB_DIR / name).read_bytes()


def _zip(path: Path, *members: tuple[str, bytes, int]) -> Path:
    """A zip holding `members` (name, data, mode) in that order."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, mode in members:
            add_zip_entry(zf, name, data, mode)
    return path


FILE = stat.S_IFREG | 0o644
LINK = stat.S_IFLNK | 0o777
FOLDER = stat.S_IFDIR | 0o755


def _index(versions: dict[str, object]) -> bytes:
    return json.dumps({"schema": 1, "versions": versions}).encode()


def _lock(folder: Path, sha256: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "qnnctl.lock"
    write_lock(path, LockedSdk(path, VERSION, sha256), "trusted")
    return path


def _record(archive: Path, **fields: object) -> Path:
    record = archive.with_name(archive.name + ".json")
    record.write_text(json.dumps(fields), encoding="utf-8")
    return record


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.fixture
def served(server: FaultServer, tmp_path: Path) -> bytes:
    """The server holding an archive of VERSION at its place; the archive's bytes."""
    data = _archive(tmp_path / "served").read_bytes()
    server.add(PATH, data)
    return data


# -- an archive's build id ---------------------------------------------------------------------


def test_an_archives_build_is_the_one_its_host_libraries_carry(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert archive_build_id(_archive(tmp_path / "built"), scratch) == BUILD
    assert archive_build_id(_archive(tmp_path / "unbuilt", built=False), scratch) is None
    assert archive_build_id(_archive(tmp_path / "other", OTHER_VERSION), scratch) == OTHER_BUILD
    assert _entries(scratch) == []  # each library copied there is removed again


def test_only_the_host_librarys_folder_is_read_at_any_depth(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ours = _library(tmp_path, "libQnnHtp.so", f"v{BUILD}")
    theirs = _library(tmp_path, "libQnnHtp.so", f"v{OTHER_BUILD}")

    def build_of(*members: tuple[str, bytes, int]) -> str | None:
        return archive_build_id(_zip(tmp_path / "a.zip", *members), scratch)

    assert build_of((f"{HOST_LIB_DIR}/libQnnHtp.so", ours, FILE)) == BUILD  # no top folder
    assert build_of((f"a/b/c/qairt/{VERSION}/{HOST_LIB_DIR}/libQnnHtp.so", ours, FILE)) == BUILD
    # Libraries of the same name elsewhere, listed first, are not the host's.
    assert build_of((f"qairt/{VERSION}/lib/aarch64-android/libQnnHtp.so", theirs, FILE),
                    (f"qairt/{VERSION}/bin/x86_64-linux-clang/libQnnHtp.so", theirs, FILE),
                    (f"qairt/{VERSION}/{HOST_LIB_DIR}/sub/libQnnHtp.so", theirs, FILE),
                    (f"qairt/{VERSION}/{HOST_LIB_DIR}/libQnnHtp.so", ours, FILE)) == BUILD
    # Of two copies of one library, the first is read.
    assert build_of((f"a/{HOST_LIB_DIR}/libQnnHtp.so", theirs, FILE), (f"b/{HOST_LIB_DIR}/libQnnHtp.so", ours, FILE)) \
        == OTHER_BUILD
    # A symbolic link named as the library is not it: the library after it is read.
    assert build_of((f"a/{HOST_LIB_DIR}/libQnnHtp.so", b"libQnnHtp.so.2", LINK),
                    (f"b/{HOST_LIB_DIR}/libQnnHtp.so", ours, FILE)) == BUILD
    assert build_of((f"a/{HOST_LIB_DIR}/libQnnHtp.so", b"libQnnHtp.so.2", LINK)) is None
    # Nor is a folder named as it.
    assert build_of((f"a/{HOST_LIB_DIR}/libQnnHtp.so/", b"", FOLDER),
                    (f"b/{HOST_LIB_DIR}/libQnnHtp.so", ours, FILE)) == BUILD
    assert _entries(scratch) == []


def test_the_libraries_of_every_hosts_folder_tell_the_build(tmp_path: Path) -> None:
    """An archive whose only host libraries are aarch64 Linux's tells its build as well, wherever
    qnnctl runs: the mirror and the lock name the same build on every host."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ours = _library(tmp_path, "libQnnHtp.so", f"v{BUILD}")
    theirs = _library(tmp_path, "libQnnHtp.so", f"v{OTHER_BUILD}")
    arm = "lib/aarch64-oe-linux-gcc11.2"
    assert archive_build_id(_zip(tmp_path / "a.zip", (f"qairt/{VERSION}/{arm}/libQnnHtp.so", ours, FILE)),
                            scratch) == BUILD
    assert archive_build_id(_zip(tmp_path / "b.zip", (f"qairt/{VERSION}/bin/aarch64-oe-linux-gcc11.2/libQnnHtp.so",
                                                      theirs, FILE)), scratch) is None
    assert _entries(scratch) == []


def test_the_libraries_are_read_most_telling_first_until_one_carries_a_build(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    lib = f"qairt/{VERSION}/{HOST_LIB_DIR}"
    system = _library(tmp_path, "libQnnSystem.so", f"v{OTHER_BUILD}")
    cpu = _library(tmp_path, "libQnnCpu.so", f"v{BUILD}")
    # No libQnnHtp.so at all: libQnnSystem.so tells.
    assert archive_build_id(_zip(tmp_path / "a.zip", (f"{lib}/libQnnCpu.so", cpu, FILE),
                                 (f"{lib}/libQnnSystem.so", system, FILE)), scratch) == OTHER_BUILD
    # A libQnnHtp.so that carries none: the next that carries one.
    bare = _library(tmp_path, "libQnnHtp.so", None)
    assert archive_build_id(_zip(tmp_path / "b.zip", (f"{lib}/libQnnHtp.so", bare, FILE),
                                 (f"{lib}/libQnnCpu.so", cpu, FILE)), scratch) == BUILD
    assert archive_build_id(_zip(tmp_path / "c.zip", (f"{lib}/libQnnHtp.so", bare, FILE)), scratch) is None
    assert archive_build_id(_zip(tmp_path / "d.zip", ("README", b"no libraries", FILE)), scratch) is None
    assert _entries(scratch) == []


def test_a_library_bigger_than_any_sdks_is_not_written_out_for_its_build(tmp_path: Path) -> None:
    """Read from an archive no one vouched for yet, a library's size comes from the archive: one
    said to be past MOST_LIBRARY is refused from the central directory, before a byte is written."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = _zip(tmp_path / "a.zip", (f"qairt/{VERSION}/{HOST_LIB_DIR}/libQnnHtp.so", b"\x7fELF small", FILE))
    data = bytearray(path.read_bytes())
    central = data.rindex(b"PK\x01\x02")
    struct.pack_into("<L", data, central + 24, mirror.MOST_LIBRARY + 1)  # its uncompressed size
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as refused:
        archive_build_id(path, scratch, "the archive")
    assert refused.value.message == (f"the archive holds a libQnnHtp.so of {mirror.MOST_LIBRARY + 1} bytes, more than "
                                     f"any SDK's library (at most {mirror.MOST_LIBRARY})")
    assert refused.value.hint == "remove it and fetch it again"
    assert _entries(scratch) == []
    struct.pack_into("<L", data, central + 24, mirror.MOST_LIBRARY)
    path.write_bytes(bytes(data))
    assert archive_build_id(path, scratch, "the archive") is None  # read: a library of that size may be


def test_an_archive_that_cannot_be_read_is_refused_naming_it(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    hint = "remove it and fetch it again"

    def refusal(archive: Path, where: Path = scratch) -> tuple[str, str | None]:
        with pytest.raises(IntegrityError) as refused:
            archive_build_id(archive, where)
        return refused.value.message, refused.value.hint

    garbage = tmp_path / "garbage.zip"
    garbage.write_bytes(b"no zip at all" * 100)
    assert refusal(garbage) == (f"{garbage} is not a readable zip archive: File is not a zip file", hint)
    missing = tmp_path / "missing.zip"
    assert refusal(missing) == (
        f"{missing} is not a readable zip archive: [Errno 2] No such file or directory: '{missing}'", hint)
    built = _archive(tmp_path / "built")
    gone = tmp_path / "gone"
    assert refusal(built, gone) == (
        f"{built} is not a readable zip archive: [Errno 2] No such file or directory: '{gone / 'libQnnHtp.so'}'",
        hint)


def test_an_archive_whose_libraries_name_another_version_is_refused() -> None:
    _true_version(None, VERSION, "anywhere")  # no build: nothing to contradict the name
    _true_version(BUILD, VERSION, "anywhere")
    with pytest.raises(IntegrityError) as refused:
        _true_version(OTHER_BUILD, VERSION, "https://m/x.zip")
    assert (refused.value.message, refused.value.hint) == (
        f"https://m/x.zip holds SDK {OTHER_VERSION} (its libraries are build {OTHER_BUILD}), not {VERSION}",
        "check the source; a mirror must serve each version under its own name")


# -- a download finished earlier ---------------------------------------------------------------


def test_a_download_finished_earlier_is_found_by_its_record(cache: Cache) -> None:
    assert _finished_downloads(cache, VERSION) == []  # no downloads folder yet
    downloads = cache.downloads
    downloads.mkdir(parents=True)
    assert _finished_downloads(cache, VERSION) == []
    data = b"an archive's bytes"
    digest = _sha256(data)

    def put(name: str, content: bytes = data) -> Path:
        path = downloads / name
        path.write_bytes(content)
        return path

    # Records that say nothing usable: each is passed over.
    _record(put(f"a-{VERSION}.zip"), sha256=digest).write_text("not json")
    _record(put(f"b-{VERSION}.zip"), sha256=digest).write_bytes(b'{"sha256": "\xff"}')
    _record(put(f"c-{VERSION}.zip"), sha256=digest).write_text(json.dumps([digest]))
    _record(put(f"d-{VERSION}.zip"), sha256=5)
    put(f"f-{VERSION}.zip")
    (downloads / f"f-{VERSION}.zip.json").mkdir()  # no record to read
    _record(put(f"g-{VERSION}.tar.gz"), sha256=digest)  # not a zip
    _record(put(f"h-{OTHER_VERSION}.zip"), sha256=digest)  # another version
    _record(downloads / f"i-{VERSION}.zip", sha256=digest)  # its archive is gone
    (downloads / f"j-{VERSION}.zip").mkdir()
    _record(downloads / f"j-{VERSION}.zip", sha256=digest)  # its archive is no file
    assert _finished_downloads(cache, VERSION) == []
    # A record of an earlier qnnctl that holds a password in its URL: said redacted. Each is listed
    # with what its record says, in the records' order; the bytes are read, and held to it, by the caller.
    good = put(f"v{VERSION}.zip")
    _record(good, sha256=digest, url=f"https://ci:s3cret@mirror.example{PATH}")
    later = put(f"w-{VERSION}.zip")
    _record(later, sha256="0" * 64)
    assert _finished_downloads(cache, VERSION) == [(good, digest, f"https://***@mirror.example{PATH}"),
                                                   (later, "0" * 64, str(later))]
    assert _finished_downloads(cache, OTHER_VERSION) == [(downloads / f"h-{OTHER_VERSION}.zip", digest,
                                                          str(downloads / f"h-{OTHER_VERSION}.zip"))]


def test_index_and_records_are_read_as_utf_8_whatever_the_locale(tmp_path: Path, cache: Cache) -> None:
    folder = tmp_path / "mirror"
    folder.mkdir()
    (folder / "index.json").write_text(json.dumps({"schema": 1, "versions": {VERSION: {"note": "dépôt"}}},
                                                  ensure_ascii=False), encoding="utf-8")
    cache.downloads.mkdir(parents=True)
    archive = cache.downloads / f"v{VERSION}.zip"
    archive.write_bytes(b"bytes")
    archive.with_name(archive.name + ".json").write_text(
        json.dumps({"sha256": _sha256(b"bytes"), "url": "https://dépôt.example/a.zip"}, ensure_ascii=False),
        encoding="utf-8")
    code = ("import json, sys\nfrom pathlib import Path\n"
            "from qnnctl.fleet.mirror import _finished_downloads, read_local_index\n"
            "from qnnctl.sdk.cache import Cache\n"
            "found = _finished_downloads(Cache(Path(sys.argv[2])), sys.argv[3])\n"
            "print(json.dumps([read_local_index(Path(sys.argv[1])), [[str(p) for p in f] for f in found]]))\n")
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    proc = subprocess.run([sys.executable, "-c", code, str(folder), str(cache.root), VERSION], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [{VERSION: {"note": "dépôt"}},
                                       [[str(archive), _sha256(b"bytes"), "https://dépôt.example/a.zip"]]]


# -- fetching one archive into the cache ---------------------------------------------------------


def test_an_archive_is_fetched_from_the_mirror_and_described_whole(server: FaultServer, served: bytes,
                                                                   cache: Cache, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    fetched = fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base + "/"}, cwd=tmp_path)
    path = cache.downloads / f"v{VERSION}.zip"
    assert fetched == FetchedArchive(path, server.base + PATH, _sha256(served), len(served), BUILD,
                                     zip_digests(path), _directory_sha256(served))
    assert set(fetched.components) >= {"host", "android"}
    assert path.read_bytes() == served
    assert json.loads(path.with_name(path.name + ".json").read_text())["sha256"] == _sha256(served)
    assert [r.path for r in server.requests] == ["/index.json", PATH]  # the mirror has no index
    assert _entries(cache.tmp) == []  # the folder the build was read in is gone
    assert capsys.readouterr().err == ""  # no bar unless on a terminal
    # Fetched again: the archive there already is used, with the URL it came from.
    assert fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path) == fetched
    assert len(server.requests_for(PATH)) == 1


def swap_when_read(monkeypatch: pytest.MonkeyPatch, target: Path, other: Path) -> None:
    """Rename `other` over `target` once the archive has been hashed, as its libraries are about
    to be read: what another writer of the file's folder could do between two opens by path."""
    read = mirror.archive_build_id

    def swapped(archive: Path, scratch: Path, shown: str | None = None) -> str | None:
        if other.exists():
            os.replace(other, target)
        return read(archive, scratch, shown)

    monkeypatch.setattr(mirror, "archive_build_id", swapped)


def test_a_download_is_described_from_the_bytes_hashed_whatever_its_path_holds_meanwhile(
        server: FaultServer, served: bytes, cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = _archive(tmp_path / "other", payload=b"other")  # the same version, other bytes
    path = cache.downloads / f"v{VERSION}.zip"
    swap_when_read(monkeypatch, path, other)
    fetched = fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)
    good = tmp_path / "good.zip"
    good.write_bytes(served)
    assert (fetched.sha256, fetched.components, fetched.central_directory_sha256) == (
        _sha256(served), zip_digests(good), _directory_sha256(served))
    assert fetched.components != zip_digests(path)  # what the path holds now


def test_a_download_changed_on_disk_before_it_was_read_is_refused(
        server: FaultServer, served: bytes, cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fetch = Downloader.fetch
    other = _archive(tmp_path / "other", payload=b"other").read_bytes()

    def changed(self: Downloader, *args: Any, **kwargs: Any) -> Any:
        fetched = fetch(self, *args, **kwargs)
        fetched.path.write_bytes(other)
        return fetched

    monkeypatch.setattr(Downloader, "fetch", changed)
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)
    assert (refused.value.message, refused.value.hint) == (
        f"{cache.downloads / f'v{VERSION}.zip'} changed on disk after it was downloaded",
        "check what else writes to qnnctl's cache, and run the command again")


def test_a_finished_download_that_is_not_its_records_is_passed_over(server: FaultServer, served: bytes,
                                                                    cache: Cache, tmp_path: Path) -> None:
    cache.downloads.mkdir(parents=True)
    stale = cache.downloads / f"a-v{VERSION}.zip"
    stale.write_bytes(_archive(tmp_path / "other", payload=b"other").read_bytes())
    _record(stale, sha256=_sha256(served))  # its record names the served archive's digest
    assert [found[0] for found in _finished_downloads(cache, VERSION)] == [stale]
    fetched = fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)
    assert (fetched.path, fetched.sha256) == (cache.downloads / f"v{VERSION}.zip", _sha256(served))
    assert len(server.requests_for(PATH)) == 1


def test_on_a_terminal_a_bar_shows_and_without_keep_nothing_is_kept(server: FaultServer, served: bytes,
                                                                    cache: Cache, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # A password in the mirror's URL is sent, and said redacted.
    base = server.base.replace("http://", "http://ci:s3cret@")
    fetched = fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": base}, terminal=True, keep=False, cwd=tmp_path)
    path = cache.downloads / f"v{VERSION}.zip"
    assert fetched == FetchedArchive(path, server.base.replace("http://", "http://***@") + PATH,
                                     _sha256(served), len(served), BUILD, fetched.components,
                                     _directory_sha256(served))
    assert fetched.components == zip_digests(_archive(tmp_path / "again"))
    assert _entries(cache.downloads) == []
    assert f"v{VERSION}.zip" in capsys.readouterr().err


def test_the_archive_is_checked_against_the_mirrors_index(server: FaultServer, served: bytes, cache: Cache,
                                                          tmp_path: Path) -> None:
    url, where = server.base + PATH, f"{server.base}/index.json"
    digest = _sha256(served)
    env = {"QNNCTL_MIRROR": server.base}

    def refusal() -> tuple[str, str | None]:
        with pytest.raises(IntegrityError) as refused:
            fetch_archive(VERSION, cache, env, cwd=tmp_path)
        assert _entries(cache.downloads) == []  # the archive and its record are removed
        return refused.value.message, refused.value.hint

    server.add("/index.json", _index({VERSION: {"sha256": "1" * 64, "size": len(served)}}), "application/json")
    assert refusal() == (f"the archive from {url} does not match the mirror's {where}: its sha256 is {digest}, the "
                         f"index says {'1' * 64}; nothing was installed", INDEX_HINT)
    server.add("/index.json", _index({VERSION: {"sha256": digest, "size": len(served) + 1}}), "application/json")
    assert refusal() == (f"the mirror's {where} contradicts itself: the archive from {url} has the sha256 the index "
                         f"says, but its size is {len(served)}, and the index says {len(served) + 1}; nothing was "
                         "installed", INDEX_HINT)
    server.add("/index.json", _index({VERSION: {"sha256": digest, "size": len(served)}}), "application/json")
    assert fetch_archive(VERSION, cache, env, cwd=tmp_path).sha256 == digest


def test_an_archive_is_held_to_its_size_before_it_is_opened_as_a_zip(server: FaultServer, cache: Cache,
                                                                     tmp_path: Path) -> None:
    """The whole archive passes its pins before anything reads its members: bytes an index gives
    the wrong size are refused for it, and never opened as a zip."""
    garbage = b"no zip at all" * 100
    server.add(PATH, garbage)
    where = f"{server.base}/index.json"
    server.add("/index.json", _index({VERSION: {"sha256": _sha256(garbage), "size": len(garbage) + 1}}),
               "application/json")
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)
    assert (refused.value.message, refused.value.hint) == (
        f"the mirror's {where} contradicts itself: the archive from {server.base}{PATH} has the sha256 the index "
        f"says, but its size is {len(garbage)}, and the index says {len(garbage) + 1}; nothing was installed",
        INDEX_HINT)
    assert _entries(cache.downloads) == []


def test_a_fetched_archive_that_is_no_zip_is_refused_naming_where_it_came_from(server: FaultServer, cache: Cache,
                                                                             tmp_path: Path) -> None:
    server.add(PATH, b"no zip at all" * 100)
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)
    assert (refused.value.message, refused.value.hint) == (
        f"{server.base}{PATH} is not a readable zip archive: File is not a zip file", "remove it and fetch it again")
    assert _entries(cache.downloads) == []


def test_a_lock_whose_central_directory_contradicts_its_sha256_is_refused(server: FaultServer, served: bytes,
                                                                         cache: Cache, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    lock = project / "qnnctl.lock"
    write_lock(lock, LockedSdk(lock, VERSION, _sha256(served), len(served), central_directory_sha256="3" * 64),
               "trusted")
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=project)
    assert "contradicts itself" in refused.value.message, refused.value.message
    assert _directory_sha256(served) in refused.value.message, refused.value.message
    assert _entries(cache.downloads) == []


def test_a_body_longer_than_the_index_pins_is_cut_off_there(server: FaultServer, served: bytes, cache: Cache,
                                                            tmp_path: Path) -> None:
    server.add("/index.json", _index({VERSION: {"sha256": _sha256(served), "size": len(served)}}), "application/json")
    server.fail(PATH, Fault.endless(served, 64 << 20))
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)
    assert f"is longer than {len(served)} bytes" in refused.value.message, refused.value.message
    assert server.bytes_served(PATH) < 32 << 20
    assert _entries(cache.downloads) == []


def test_a_body_that_never_ends_is_cut_off_at_the_most_any_archive_is_when_nothing_pins_it(
        server: FaultServer, cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "MOST_ARCHIVE", 1 << 20)  # 16 GiB, as served here
    server.fail(PATH, Fault.endless(b"PK\x03\x04" + bytes(1 << 16), 256 << 20))
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)
    assert refused.value.message.startswith(
        f"{server.base}{PATH} is longer than {1 << 20} bytes, the size qnnctl takes as the most any SDK archive is "
        "(the body went on past them)"), refused.value.message
    assert server.bytes_served(PATH) < 32 << 20


def test_a_body_longer_than_the_size_pinned_is_stopped_before_it_is_written(server: FaultServer, cache: Cache,
                                                                            tmp_path: Path) -> None:
    """The download stops at the size the index pins: a server that says the body is longer is
    refused for it before a byte is written, not after the whole body filled the disk."""
    data = _archive(tmp_path / "served").read_bytes()
    longer = data + bytes(1 << 20)
    server.add(PATH, longer)
    where = f"{server.base}/index.json"
    server.add("/index.json", _index({VERSION: {"sha256": _sha256(data), "size": len(data)}}), "application/json")
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)
    assert (refused.value.message, refused.value.hint) == (
        f"{server.base}{PATH} is longer than {len(data)} bytes, the size the mirror's {where} says (it says the "
        f"file is {len(longer)} bytes): it is not that archive; the download was stopped and removed, and nothing "
        "was installed",
        "check the server or proxy that answers for that URL; run the same command again once it serves the archive")
    assert _entries(cache.downloads) == []


def test_an_index_whose_components_contradict_its_sha256_is_refused_naming_the_archive(
        server: FaultServer, served: bytes, cache: Cache, tmp_path: Path) -> None:
    """The archive the index pins whole, read for its components' digests as an extraction would
    be: an index that gives one of them another digest contradicts itself, and vouches for nothing."""
    url, where = server.base + PATH, f"{server.base}/index.json"
    digest = _sha256(served)
    copy = tmp_path / "copy.zip"
    copy.write_bytes(served)
    components = zip_digests(copy)
    env = {"QNNCTL_MIRROR": server.base}
    server.add("/index.json", _index({VERSION: {"sha256": digest, "size": len(served),
                                                "components": dict(components, android="2" * 64)}}),
               "application/json")
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, env, cwd=tmp_path)
    assert (refused.value.message, refused.value.hint) == (
        f"the mirror's {where} contradicts itself: the archive from {url} has the sha256 the index says, but the "
        f"digest of its component android is {components['android']}, and the index says {'2' * 64}; "
        "nothing was installed", INDEX_HINT)
    assert _entries(cache.downloads) == []
    server.add("/index.json", _index({VERSION: {"sha256": digest, "size": len(served), "components": components}}),
               "application/json")
    assert fetch_archive(VERSION, cache, env, cwd=tmp_path).components == components


def test_an_archive_of_another_version_served_under_this_ones_name_is_refused(server: FaultServer, cache: Cache,
                                                                              tmp_path: Path) -> None:
    server.add(PATH, _archive(tmp_path / "other", OTHER_VERSION).read_bytes())
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)
    assert (refused.value.message, refused.value.hint) == (
        f"{server.base}{PATH} holds SDK {OTHER_VERSION} (its libraries are build {OTHER_BUILD}), not {VERSION}",
        "check the source; a mirror must serve each version under its own name")
    assert _entries(cache.downloads) == []
    assert _entries(cache.tmp) == []


def test_the_archive_is_checked_against_the_projects_lock_unless_told_not_to(
        server: FaultServer, served: bytes, cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    lock = _lock(project, "a" * 64)
    env = {"QNNCTL_MIRROR": server.base}
    message = (f"the archive from {server.base}{PATH} does not match {lock}: its sha256 is {_sha256(served)}, "
               f"the lock pins {'a' * 64}; nothing was installed")
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, env, cwd=project / "src")  # the lock is found above
    assert (refused.value.message, refused.value.hint) == (message, LOCK_HINT)
    assert _entries(cache.downloads) == []
    # Without a folder, the lock is looked for from the process's.
    monkeypatch.chdir(project)
    with pytest.raises(IntegrityError) as again:
        fetch_archive(VERSION, cache, env)
    assert again.value.message == message
    assert fetch_archive(VERSION, cache, env, cwd=elsewhere).sha256 == _sha256(served)
    # While `qnnctl lock` writes the lock, the one it replaces is not consulted.
    assert fetch_archive(VERSION, cache, env, check_lock=False, cwd=project).sha256 == _sha256(served)


def test_a_lock_and_an_index_that_disagree_fetch_nothing(server: FaultServer, served: bytes, cache: Cache,
                                                         tmp_path: Path) -> None:
    lock = _lock(tmp_path / "project", "a" * 64)
    server.add("/index.json", _index({VERSION: {"sha256": "1" * 64}}), "application/json")
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=lock.parent)
    assert (refused.value.message, refused.value.hint) == (
        f"the mirror's {server.base}/index.json expects sha256 {'1' * 64}, but {lock} expects {'a' * 64}; "
        "nothing was fetched",
        "find out which is right; `qnnctl lock VERSION` writes the lock again, `qnnctl mirror DIR VERSION` the "
        "mirror's index")
    assert server.requests_for(PATH) == []


def test_a_download_finished_earlier_is_used_and_checked_as_a_fetched_one(cache: Cache, tmp_path: Path) -> None:
    data = _archive(tmp_path / "a").read_bytes()
    cache.downloads.mkdir(parents=True)
    path = cache.downloads / f"v{VERSION}.zip"
    path.write_bytes(data)
    record = _record(path, sha256=_sha256(data), url=f"https://ci:s3cret@mirror.example{PATH}")
    shown = f"https://***@mirror.example{PATH}"
    # No mirror: Qualcomm's server would be asked, but nothing is fetched.
    assert fetch_archive(VERSION, cache, {}, cwd=tmp_path) == FetchedArchive(
        path, shown, _sha256(data), len(data), BUILD, zip_digests(path), _directory_sha256(data))
    lock = _lock(tmp_path / "project", "a" * 64)
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, {}, cwd=lock.parent)
    assert refused.value.message == (f"the archive from {shown} does not match {lock}: its sha256 is "
                                     f"{_sha256(data)}, the lock pins {'a' * 64}; nothing was installed")
    assert not path.exists()
    assert not record.exists()


def test_a_mirror_that_is_a_file_url_is_refused_before_the_cache_is_touched(cache: Cache, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as refused:
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": "file:///srv/mirror"}, cwd=tmp_path)
    assert (refused.value.message, refused.value.hint) == (
        "QNNCTL_MIRROR file:///srv/mirror: qnnctl downloads over https or http, not file:",
        "an archive on disk is installed with `qnnctl install --file ARCHIVE`")
    assert not cache.root.exists()


def test_a_fetch_waits_for_another_install_of_the_version(server: FaultServer, served: bytes, cache: Cache,
                                                          tmp_path: Path) -> None:
    cache.ensure()
    held = FileLock(str(cache.lock_path(VERSION)))
    held.acquire()
    results: list[FetchedArchive] = []
    thread = threading.Thread(target=lambda: results.append(
        fetch_archive(VERSION, cache, {"QNNCTL_MIRROR": server.base}, cwd=tmp_path)))
    try:
        thread.start()
        time.sleep(0.5)
        assert server.requests == []  # not even the index: it is read under the lock
        assert results == []
    finally:
        held.release()
        thread.join(timeout=60)
    assert [r.sha256 for r in results] == [_sha256(served)]


# -- the mirror's own index.json -----------------------------------------------------------------


def test_a_mirrors_own_index_is_read_or_refused_with_how_to_mend_it(tmp_path: Path) -> None:
    folder = tmp_path / "mirror"
    folder.mkdir()
    assert read_local_index(folder) == {}
    path = folder / "index.json"
    path.write_bytes(_index({VERSION: {"sha256": "a" * 64}, OTHER_VERSION: "no table"}))
    assert read_local_index(folder) == {VERSION: {"sha256": "a" * 64}}
    hint = f"move it out of the way; `qnnctl mirror {folder}` writes a new one"

    def refusal() -> tuple[str, str | None]:
        with pytest.raises(UsageError) as refused:
            read_local_index(folder)
        return refused.value.message, refused.value.hint

    path.write_text("{")
    assert refusal() == (f"cannot use {path}: Expecting property name enclosed in double quotes: line 1 column 2 "
                         "(char 1)", hint)
    path.write_text(json.dumps({"schema": 2, "versions": {}}))
    assert refusal() == (f"cannot use {path}: {path} is not a qnnctl mirror index (schema 1 with a `versions` "
                         "table)", hint)
    path.unlink()
    path.mkdir()
    assert refusal() == (f"cannot use {path}: [Errno 21] Is a directory: '{path}'", hint)


# -- which versions to mirror ----------------------------------------------------------------------


def test_the_versions_named_are_resolved_in_the_mirrors_index_and_said_once(server: FaultServer, cache: Cache,
                                                                           tmp_path: Path) -> None:
    server.add("/index.json", _index({NEWER: {"sha256": "a" * 64}}), "application/json")
    env = {"QNNCTL_MIRROR": server.base}
    assert mirror_versions(["2.37", NEWER, "2.34", VERSION, "2.34.0"], env, tmp_path, cache) == [
        NEWER, OTHER_VERSION, VERSION]


def test_a_prefix_names_the_newest_sdk_installed_first(server: FaultServer, cache_dir: Path, cache: Cache,
                                                      tmp_path: Path) -> None:
    server.add("/index.json", _index({NEWER: {"sha256": "a" * 64}}), "application/json")
    install_tree_into_cache(cache_dir, INSTALLED)
    assert mirror_versions(["2.37", "2.34"], {"QNNCTL_MIRROR": server.base}, tmp_path, cache) == [
        INSTALLED, OTHER_VERSION]
    # Without a version, nor anything else to choose by, the newest SDK installed.
    assert mirror_versions([], {}, tmp_path, cache) == [INSTALLED]


def test_without_versions_the_one_resolved_here_is_mirrored(cache: Cache, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / ".qnn-version").write_text(f"{OTHER_VERSION}\n")
    assert mirror_versions([], {}, project, cache) == [OTHER_VERSION]
    root = build_sdk_tree(tmp_path / "sdk", SdkSpec(version="2.31.0.250130", build_id=f"v{OTHER_BUILD}"))
    assert mirror_versions([], {"QNN_SDK_ROOT": str(root)}, tmp_path, cache) == [OTHER_VERSION]  # its libraries'


@pytest.mark.parametrize("root", ["", "empty"])
def test_without_versions_and_none_resolved_here_nothing_is_mirrored(root: str, cache: Cache,
                                                                     tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError) as refused:
        mirror_versions([], {"QNN_SDK_ROOT": str(tmp_path / root) if root else ""}, tmp_path, cache)
    assert (refused.value.message, refused.value.hint) == (
        "no SDK version to mirror was given, and qnnctl resolves none here",
        "name them: `qnnctl mirror DIR VERSION...`")


# -- qnnctl mirror DIR VERSION... ----------------------------------------------------------------


def _index_of(folder: Path) -> dict[str, dict[str, object]]:
    data = json.loads((folder / "index.json").read_text())
    assert data["schema"] == 1
    versions: dict[str, dict[str, object]] = data["versions"]
    return versions


def _added_at(entry: dict[str, object], before: float) -> None:
    """`added_at` is a UTC time between `before` and now, to the second."""
    stamp = entry.pop("added_at")
    assert isinstance(stamp, str)
    moment = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    assert int(before) <= moment <= time.time(), stamp


@pytest.fixture
def two_served(server: FaultServer, served: bytes, tmp_path: Path) -> tuple[bytes, bytes]:
    other = _archive(tmp_path / "served-other", OTHER_VERSION).read_bytes()
    server.add(OTHER_PATH, other)
    return served, other


@pytest.mark.usefixtures("far_from_utc")
def test_a_mirror_is_filled_indexed_and_kept(server: FaultServer, two_served: tuple[bytes, bytes], cache: Cache,
                                             tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, other = two_served
    env = {"QNNCTL_MIRROR": server.base}
    before = time.time()
    done = make_mirror(Path("out/mirror"), ["2.37", OTHER_VERSION], env, tmp_path, cache)
    folder = Path.cwd() / "out" / "mirror"
    dest, other_dest = folder / VERSION / f"v{VERSION}.zip", folder / OTHER_VERSION / f"v{OTHER_VERSION}.zip"
    assert done == [Mirrored(VERSION, dest, _sha256(data), len(data), BUILD, "added"),
                    Mirrored(OTHER_VERSION, other_dest, _sha256(other), len(other), OTHER_BUILD, "added")]
    assert (dest.read_bytes(), other_dest.read_bytes()) == (data, other)
    assert _entries(cache.downloads) == []  # moved into the mirror, records and all
    assert capsys.readouterr().err == ""  # no bar unless on a terminal
    index = _index_of(folder)
    for entry in index.values():
        _added_at(entry, before)
    assert index == {
        VERSION: {"sha256": _sha256(data), "size": len(data), "build_id": BUILD, "path": f"{VERSION}/v{VERSION}.zip",
                  "components": zip_digests(dest)},
        OTHER_VERSION: {"sha256": _sha256(other), "size": len(other), "build_id": OTHER_BUILD,
                        "path": f"{OTHER_VERSION}/v{OTHER_VERSION}.zip", "components": zip_digests(other_dest)},
    }
    # Again: each is there, as indexed; nothing is fetched, and the index is not written again.
    written = (folder / "index.json").stat()
    requests = len(server.requests)
    again = make_mirror(folder, [VERSION, OTHER_VERSION], env, tmp_path, cache)
    assert again == [d._replace(action="kept") for d in done]
    assert len(server.requests) == requests  # full versions: not even the index is read
    assert (folder / "index.json").stat().st_ino == written.st_ino
    assert (folder / "index.json").stat().st_mtime_ns == written.st_mtime_ns


@pytest.mark.usefixtures("far_from_utc")
def test_an_entry_without_components_digests_is_indexed_again(server: FaultServer, served: bytes, cache: Cache,
                                                               tmp_path: Path) -> None:
    env = {"QNNCTL_MIRROR": server.base}
    folder = tmp_path / "mirror"
    make_mirror(folder, [VERSION], env, tmp_path, cache)
    dest = folder / VERSION / f"v{VERSION}.zip"
    index = _index_of(folder)
    entry = index[VERSION]
    del entry["components"]
    entry["build_id"] = "left as an earlier qnnctl wrote it"
    (folder / "index.json").write_text(json.dumps({"schema": 1, "versions": index}))
    before = time.time()
    assert make_mirror(folder, [VERSION], env, tmp_path, cache) == [
        Mirrored(VERSION, dest, _sha256(served), len(served), BUILD, "indexed")]
    entry = _index_of(folder)[VERSION]
    _added_at(entry, before)
    assert entry == {"sha256": _sha256(served), "size": len(served), "build_id": BUILD,
                     "path": f"{VERSION}/v{VERSION}.zip", "components": zip_digests(dest)}
    assert len(server.requests_for(PATH)) == 1
    assert _entries(cache.tmp) == []


def test_a_cache_others_can_write_is_refused_before_anything_is_fetched_or_indexed(
        server: FaultServer, served: bytes, cache: Cache, tmp_path: Path) -> None:
    env = {"QNNCTL_MIRROR": server.base}
    cache.ensure()
    (cache.root / "downloads").chmod(0o777)
    said = (f"qnnctl's cache {cache.root} is not used: {cache.root / 'downloads'} is writable by its group and "
            "others (mode 0777), so another user could change the SDKs installed there and the records that vouch "
            "for them; nothing was installed")
    with pytest.raises(IntegrityError) as refused:
        fetch_archive(VERSION, cache, env, cwd=tmp_path)
    assert refused.value.message == said
    assert server.requests == []
    folder = tmp_path / "mirror"
    dest = folder / VERSION / f"v{VERSION}.zip"
    dest.parent.mkdir(parents=True)
    shutil.copyfile(_archive(tmp_path / "by hand"), dest)
    with pytest.raises(IntegrityError) as refused:
        make_mirror(folder, [VERSION], env, tmp_path, cache)
    assert refused.value.message == said
    assert not (folder / "index.json").exists()
    assert server.requests == []
    (cache.root / "downloads").chmod(0o755)
    assert make_mirror(folder, [VERSION], env, tmp_path, cache)[0].action == "indexed"


def test_an_archive_put_in_the_mirror_by_hand_is_indexed_if_it_is_the_version(server: FaultServer,
                                                                              cache: Cache, tmp_path: Path) -> None:
    env = {"QNNCTL_MIRROR": server.base}
    folder = tmp_path / "mirror"
    dest = folder / VERSION / f"v{VERSION}.zip"
    dest.parent.mkdir(parents=True)
    shutil.copyfile(_archive(tmp_path / "other", OTHER_VERSION), dest)
    with pytest.raises(IntegrityError) as refused:
        make_mirror(folder, [VERSION], env, tmp_path, cache)
    assert (refused.value.message, refused.value.hint) == (
        f"{dest} holds SDK {OTHER_VERSION} (its libraries are build {OTHER_BUILD}), not {VERSION}",
        "check the source; a mirror must serve each version under its own name")
    assert not (folder / "index.json").exists()
    data = _archive(tmp_path / "right").read_bytes()
    dest.write_bytes(data)
    assert make_mirror(folder, [VERSION], env, tmp_path, cache) == [
        Mirrored(VERSION, dest, _sha256(data), len(data), BUILD, "indexed")]
    assert _index_of(folder)[VERSION]["components"] == zip_digests(dest)
    assert server.requests_for(PATH) == []
    # Changed after it was indexed: refused, saying how to mend it.
    dest.write_bytes(_archive(tmp_path / "changed", payload=b"changed").read_bytes())
    with pytest.raises(IntegrityError) as changed:
        make_mirror(folder, [VERSION], env, tmp_path, cache)
    assert (changed.value.message, changed.value.hint) == (
        f"{dest} has sha256 {_sha256(dest.read_bytes())}, but {folder / 'index.json'} says {_sha256(data)}",
        f"remove {dest} and run `qnnctl mirror {folder} {VERSION}` again")


def test_an_archive_in_the_mirror_is_indexed_from_the_bytes_hashed(
        server: FaultServer, cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "mirror"
    dest = folder / VERSION / f"v{VERSION}.zip"
    dest.parent.mkdir(parents=True)
    data = _archive(tmp_path / "right").read_bytes()
    dest.write_bytes(data)
    swap_when_read(monkeypatch, dest, _archive(tmp_path / "other", payload=b"other"))
    assert make_mirror(folder, [VERSION], {"QNNCTL_MIRROR": server.base}, tmp_path, cache) == [
        Mirrored(VERSION, dest, _sha256(data), len(data), BUILD, "indexed")]
    good = tmp_path / "good.zip"
    good.write_bytes(data)
    assert _index_of(folder)[VERSION]["components"] == zip_digests(good) != zip_digests(dest)


def test_a_mirror_folder_others_can_write_is_refused_before_its_index_is_read(cache: Cache, tmp_path: Path) -> None:
    folder = tmp_path / "mirror"
    folder.mkdir()
    (folder / "index.json").write_text("planted, and no JSON")
    folder.chmod(0o777)
    with pytest.raises(IntegrityError) as refused:
        make_mirror(folder, [VERSION], {}, tmp_path, cache)
    assert refused.value.message == (
        f"the mirror's folder {folder} is not used: {folder} is writable by its group and others (mode 0777), so "
        "another user could change the archives and the index.json that hosts install by; nothing was added to the "
        "mirror")
    hint = refused.value.hint or ""
    assert hint.startswith("fix it with "), hint
    assert hint.endswith(", or give a folder of your own"), hint


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
def test_an_index_another_user_could_change_is_refused_in_a_folder_of_ones_own(cache: Cache, tmp_path: Path) -> None:
    folder = tmp_path / "mirror"
    folder.mkdir()
    index = folder / "index.json"
    index.write_text(json.dumps({"schema": 1, "versions": {}}))
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(index, nobody, -1)
    with pytest.raises(IntegrityError) as refused:
        make_mirror(folder, [VERSION], {}, tmp_path, cache)
    assert refused.value.message.startswith(f"the mirror's folder {folder} is not used: {index} belongs to user "
                                            f"nobody (uid {nobody})"), refused.value.message


@pytest.mark.parametrize("contradicted", [None, "components", "central directory"])
def test_an_archive_in_the_mirror_is_refused_by_a_lock_that_contradicts_itself(
        contradicted: str | None, cache: Cache, tmp_path: Path) -> None:
    folder = tmp_path / "mirror"
    dest = folder / VERSION / f"v{VERSION}.zip"
    dest.parent.mkdir(parents=True)
    data = _archive(tmp_path / "found").read_bytes()
    dest.write_bytes(data)
    project = tmp_path / "project"
    project.mkdir()
    lock = project / "qnnctl.lock"
    components = zip_digests(dest)
    if contradicted == "components":
        components = {name: "5" * 64 for name in components}
    directory = "6" * 64 if contradicted == "central directory" else _directory_sha256(data)
    write_lock(lock, LockedSdk(lock, VERSION, _sha256(data), len(data), central_directory_sha256=directory,
                               component_sha256=components), "trusted")
    if contradicted is None:  # no mirror to ask, and a lock that holds: indexed
        assert make_mirror(folder, [VERSION], {}, project, cache)[0].action == "indexed"
        return
    with pytest.raises(IntegrityError) as refused:
        make_mirror(folder, [VERSION], {}, project, cache)
    assert refused.value.message.startswith(f"{lock} contradicts itself: the archive from {dest} has the sha256 "
                                            "the lock pins, but "), refused.value.message
    assert not (folder / "index.json").exists()


def test_an_archive_in_the_mirror_that_is_no_zip_is_refused_naming_it(cache: Cache, tmp_path: Path) -> None:
    folder = tmp_path / "mirror"
    dest = folder / VERSION / f"v{VERSION}.zip"
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"no zip at all" * 100)
    with pytest.raises(IntegrityError) as refused:
        make_mirror(folder, [VERSION], {}, tmp_path, cache)
    assert refused.value.message == f"{dest} is not a readable zip archive: File is not a zip file"


def test_an_archive_in_the_mirror_is_held_to_the_upstream_index(server: FaultServer, cache: Cache,
                                                                tmp_path: Path) -> None:
    folder = tmp_path / "mirror"
    dest = folder / VERSION / f"v{VERSION}.zip"
    dest.parent.mkdir(parents=True)
    data = _archive(tmp_path / "found").read_bytes()
    dest.write_bytes(data)
    server.add("/index.json", _index({VERSION: {"sha256": "0" * 64, "size": len(data)}}), "application/json")
    with pytest.raises(IntegrityError) as refused:
        make_mirror(folder, [VERSION], {"QNNCTL_MIRROR": server.base}, tmp_path, cache)
    assert refused.value.message == (
        f"the archive from {dest} does not match the mirror's {server.base}/index.json: its sha256 is "
        f"{_sha256(data)}, the index says {'0' * 64}; nothing was added to the mirror")
    assert refused.value.hint == INDEX_HINT
    assert not (folder / "index.json").exists()


@pytest.mark.parametrize("contradicted", ["components", "central directory"])
def test_an_archive_added_is_refused_by_a_lock_that_contradicts_itself(contradicted: str, tmp_path: Path,
                                                                       cache: Cache) -> None:
    archive = _archive(tmp_path / "a")
    data = archive.read_bytes()
    project = tmp_path / "project"
    project.mkdir()
    lock = project / "qnnctl.lock"
    components = {name: "5" * 64 for name in zip_digests(archive)} if contradicted == "components" else None
    directory = "6" * 64 if contradicted == "central directory" else _directory_sha256(data)
    write_lock(lock, LockedSdk(lock, VERSION, _sha256(data), len(data), central_directory_sha256=directory,
                               component_sha256=components), "trusted")
    folder = tmp_path / "mirror"
    with pytest.raises(IntegrityError) as refused:
        add_archives(folder, [archive], {}, project, cache)
    assert refused.value.message.startswith(f"{lock} contradicts itself: the archive from {archive} has the sha256 "
                                            "the lock pins, but "), refused.value.message
    assert refused.value.message.endswith("; nothing was added to the mirror"), refused.value.message
    assert refused.value.hint == LOCK_HINT
    assert not (folder / VERSION).exists()


def test_an_archive_put_in_the_mirror_by_hand_is_held_to_the_upstream_mirrors_index(server: FaultServer,
                                                                                    cache: Cache,
                                                                                    tmp_path: Path) -> None:
    """Found in the folder, an archive passes the gate a fetched one passes: without a lock or a
    QNNCTL_MIRROR it is indexed as it is; with one, it is held to that mirror's index (its
    sha256, its size, its components' digests), and nothing is indexed when it differs."""
    folder = tmp_path / "mirror"
    dest = folder / VERSION / f"v{VERSION}.zip"
    dest.parent.mkdir(parents=True)
    data = _archive(tmp_path / "by hand").read_bytes()
    dest.write_bytes(data)
    digest, where, components = _sha256(data), f"{server.base}/index.json", zip_digests(dest)
    indexed = [Mirrored(VERSION, dest, digest, len(data), BUILD, "indexed")]
    assert make_mirror(folder, [VERSION], {}, tmp_path, cache) == indexed
    (folder / "index.json").unlink()
    env = {"QNNCTL_MIRROR": server.base}

    def refusal(entry: dict[str, object]) -> tuple[str, str | None]:
        server.add("/index.json", _index({VERSION: entry}), "application/json")
        with pytest.raises(IntegrityError) as refused:
            make_mirror(folder, [VERSION], env, tmp_path, cache)
        assert not (folder / "index.json").exists()
        return refused.value.message, refused.value.hint

    assert refusal({"sha256": "1" * 64, "size": len(data)}) == (
        f"the archive from {dest} does not match the mirror's {where}: its sha256 is {digest}, the index says "
        f"{'1' * 64}; nothing was added to the mirror", INDEX_HINT)
    assert refusal({"sha256": digest, "size": len(data) + 1}) == (
        f"the mirror's {where} contradicts itself: the archive from {dest} has the sha256 the index says, but its "
        f"size is {len(data)}, and the index says {len(data) + 1}; nothing was added to the mirror", INDEX_HINT)
    assert refusal({"sha256": digest, "size": len(data), "components": dict(components, android="2" * 64)}) == (
        f"the mirror's {where} contradicts itself: the archive from {dest} has the sha256 the index says, but the "
        f"digest of its component android is {components['android']}, and the index says {'2' * 64}; nothing was "
        "added to the mirror", INDEX_HINT)
    server.add("/index.json", _index({VERSION: {"sha256": digest, "size": len(data), "components": components}}),
               "application/json")
    assert make_mirror(folder, [VERSION], env, tmp_path, cache) == indexed
    assert server.requests_for(PATH) == []


def test_a_mirror_folder_or_index_others_can_write_is_refused_before_the_index_is_read(server: FaultServer,
                                                                                       cache: Cache,
                                                                                       tmp_path: Path) -> None:
    """The folder whose index.json every host installs by, and that file, are this user's alone:
    the refusal names which one others can write and how to fix it; an index in such a folder is
    not read (a sticky folder, where another user's file may stand in for it, included)."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    index = folder / "index.json"

    def refusal() -> tuple[str, str | None]:
        with pytest.raises(IntegrityError) as refused:
            make_mirror(folder, [VERSION], {"QNNCTL_MIRROR": server.base}, tmp_path, cache)
        assert _entries(folder) == (["index.json"] if index.exists() else [])
        assert server.requests == []
        return refused.value.message, refused.value.hint

    def said(culprit: Path, mode: int) -> tuple[str, str]:
        return (f"the mirror's folder {folder} is not used: {culprit} is writable by its group and others (mode "
                f"{mode:04o}), so another user could change the archives and the index.json that hosts install by; "
                "nothing was added to the mirror",
                f"fix it with `chmod go-w {shlex.quote(str(culprit))}`, or give a folder of your own")

    folder.chmod(0o777)
    assert refusal() == said(folder, 0o777)
    folder.chmod(0o755)
    index.write_text(json.dumps({"schema": 1, "versions": {}}))
    index.chmod(0o666)
    assert refusal() == said(index, 0o666)
    index.write_text("not an index")
    index.chmod(0o644)
    folder.chmod(0o1777)
    assert refusal() == said(folder, 0o1777)


def test_what_a_mirror_finished_is_indexed_when_a_later_version_fails(server: FaultServer, served: bytes,
                                                                      cache: Cache, tmp_path: Path) -> None:
    folder = tmp_path / "mirror"
    (folder / VERSION).mkdir(parents=True)  # left empty by an earlier run
    with pytest.raises(QnnctlError):
        make_mirror(folder, [VERSION, OTHER_VERSION], {"QNNCTL_MIRROR": server.base}, tmp_path, cache)
    assert list(_index_of(folder)) == [VERSION]
    assert (folder / VERSION / f"v{VERSION}.zip").read_bytes() == served
    assert not (folder / OTHER_VERSION).exists()


def test_without_versions_a_mirror_takes_the_newest_sdk_installed(server: FaultServer,
                                                                   two_served: tuple[bytes, bytes], cache_dir: Path,
                                                                   cache: Cache, tmp_path: Path) -> None:
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    done = make_mirror(tmp_path / "mirror", [], {"QNNCTL_MIRROR": server.base}, tmp_path, cache)
    assert [(d.version, d.action) for d in done] == [(OTHER_VERSION, "added")]


def test_a_mirror_in_the_home_folder_and_on_a_terminal(server: FaultServer, served: bytes, cache: Cache,
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = make_mirror(Path("~/mirror"), [VERSION], {"QNNCTL_MIRROR": server.base}, tmp_path, cache, terminal=True)
    dest = Path(os.environ["HOME"]) / "mirror" / VERSION / f"v{VERSION}.zip"
    assert [(d.path, d.action) for d in done] == [(dest, "added")]
    assert dest.read_bytes() == served
    assert f"v{VERSION}.zip" in capsys.readouterr().err


def test_a_mirror_fetches_by_the_lock_and_the_pin_of_the_folder_it_is_given(server: FaultServer, served: bytes,
                                                                            cache: Cache, tmp_path: Path) -> None:
    project = tmp_path / "project"
    lock = _lock(project, "a" * 64)
    (project / ".qnn-version").write_text(f"{VERSION}\n")
    with pytest.raises(IntegrityError) as refused:
        make_mirror(tmp_path / "mirror", [], {"QNNCTL_MIRROR": server.base}, project, cache)
    assert refused.value.message.endswith(f"does not match {lock}: its sha256 is {_sha256(served)}, the lock pins "
                                          f"{'a' * 64}; nothing was installed")
    assert len(server.requests_for(PATH)) == 1


# -- moving an archive into the mirror ------------------------------------------------------------


def test_an_archive_is_moved_by_a_rename_on_one_file_system(tmp_path: Path) -> None:
    source, dest = tmp_path / "a.zip", tmp_path / "m" / "a.zip"
    dest.parent.mkdir()
    source.write_bytes(b"archive")
    inode = source.stat().st_ino
    _move(source, dest)
    assert (dest.read_bytes(), dest.stat().st_ino, source.exists()) == (b"archive", inode, False)


@pytest.fixture
def other_file_system(tmp_path: Path) -> Iterator[Path]:
    """A folder on another file system than `tmp_path` (/dev/shm, a tmpfs)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no writable file system other than the tests' own")
    folder = Path(tempfile.mkdtemp(dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_an_archive_is_copied_across_file_systems_then_renamed(tmp_path: Path, other_file_system: Path) -> None:
    source, dest = tmp_path / "a.zip", other_file_system / "a.zip"
    source.write_bytes(b"archive")
    with pytest.raises(OSError, match="cross-device") as across:
        os.rename(source, dest)
    assert across.value.errno == errno.EXDEV
    (other_file_system / "a.zip.partial").write_bytes(b"left by an interrupted copy, longer than the archive")
    _move(source, dest)
    assert dest.read_bytes() == b"archive"
    assert not source.exists()
    assert _entries(other_file_system) == ["a.zip"]


def test_a_move_that_fails_otherwise_is_said_as_it_failed(tmp_path: Path) -> None:
    source, dest = tmp_path / "a.zip", tmp_path / "m" / "a.zip"
    source.write_bytes(b"archive")
    (dest / "inside").mkdir(parents=True)  # a folder where the archive goes
    with pytest.raises(IsADirectoryError) as failed:
        _move(source, dest)
    assert failed.value.filename == str(source)
    assert _entries(dest.parent) == ["a.zip"]  # no copy left beside it
    assert source.read_bytes() == b"archive"


# -- qnnctl mirror DIR --file ARCHIVE... -------------------------------------------------------------


def test_archives_you_have_make_a_mirror_that_installs(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Version and build read from each archive, nothing fetched; the mirror then serves installs."""
    first, other = _archive(tmp_path / "a"), _archive(tmp_path / "b", OTHER_VERSION)
    folder = tmp_path / "mirror"
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)  # asked for nothing
    proc = run_qnnctl("mirror", str(folder), "--file", str(first), "--file", str(other))
    assert proc.returncode == 0, proc.stderr
    dests = [folder / VERSION / f"v{VERSION}.zip", folder / OTHER_VERSION / f"v{OTHER_VERSION}.zip"]
    assert proc.stdout == "".join(f"{d}\n" for d in dests)
    assert f"SDK {VERSION} added to the mirror from {first}: {dests[0]}" in proc.stderr
    assert server.requests == []
    versions = json.loads((folder / "index.json").read_text())["versions"]
    for archive, dest, version in ((first, dests[0], VERSION), (other, dests[1], OTHER_VERSION)):
        assert dest.read_bytes() == archive.read_bytes()
        entry = versions[version]
        assert (entry["sha256"], entry["size"], entry["build_id"], entry["path"]) == (
            _sha256(archive.read_bytes()), archive.stat().st_size, f"{version}101010", f"{version}/v{version}.zip")
        assert entry["components"] == zip_digests(archive)
    assert _entries(folder) == sorted([VERSION, OTHER_VERSION, "index.json"])  # no copy left half-way
    # The same archive again is kept; the mirror serves installs, checked against its index.
    again = run_qnnctl("mirror", str(folder), "--file", str(first))
    assert (again.returncode, again.stdout) == (0, f"{dests[0]}\n"), again.stderr
    assert "is in the mirror already" in again.stderr
    server.add("/index.json", (folder / "index.json").read_bytes())
    server.add(PATH, dests[0].read_bytes())
    installed = run_qnnctl("install", VERSION)
    assert (installed.returncode, installed.stdout) == (0, f"{cache_dir}/sdks/{VERSION}\n"), installed.stderr


def _refused(folder: Path, archive: Path, code: int, *said: str) -> None:
    proc = run_qnnctl("mirror", str(folder), "--file", str(archive))
    assert (proc.returncode, proc.stdout) == (code, ""), proc.stderr
    for words in said:
        assert words in proc.stderr
    assert "/proc/self/fd" not in proc.stderr
    assert [p for p in _entries(folder) if p != "index.json"] == []  # nothing added, no copy left


def test_an_archive_added_is_checked_as_install_file_checks_it(tmp_path: Path, cache_dir: Path) -> None:
    folder = tmp_path / "mirror"
    # Its libraries are another version than its folder says.
    liar = build_archive(tmp_path / "liar", "zip", SdkSpec(version=VERSION, build_id=f"v{OTHER_VERSION}101010"))
    _refused(folder, liar, 4, f"{liar} says it is SDK {VERSION} (its top folder and its sdk.yaml), but its "
             f"libraries are build {OTHER_VERSION}101010",
             f"check where {liar} came from; nothing was added to the mirror")
    # A member that leaves the archive.
    lib = f"qairt/{VERSION}/{HOST_LIB_DIR}/libQnnHtp.so"
    slip = _zip(tmp_path / "slip.zip", (lib, b"x", FILE), ("../evil", b"x", FILE))
    _refused(folder, slip, 4, "unsafe archive: member path '../evil' leaves the archive")
    # No SDK in it; no zip at all; no file.
    _refused(folder, _zip(tmp_path / "docs.zip", ("README", b"x", FILE)), 4, "the archive holds no SDK")
    (tmp_path / "page.zip").write_text("<html>not found</html>")
    _refused(folder, tmp_path / "page.zip", 4, f"{tmp_path / 'page.zip'}")
    _refused(folder, tmp_path / "missing.zip", 2, f"{tmp_path / 'missing.zip'} is not a file")
    _refused(folder, tmp_path, 2, f"{tmp_path} is not a file")


def test_an_archive_added_must_match_the_index_and_the_lock(tmp_path: Path, cache_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "mirror"
    first, second = _archive(tmp_path / "a"), _archive(tmp_path / "b", payload=b"second")
    assert run_qnnctl("mirror", str(folder), "--file", str(first)).returncode == 0
    proc = run_qnnctl("mirror", str(folder), "--file", str(second))
    assert proc.returncode == 4, proc.stderr
    assert (f"the mirror holds another archive of SDK {VERSION} (sha256 {_sha256(first.read_bytes())}); {second} has "
            f"sha256 {_sha256(second.read_bytes())}") in proc.stderr
    assert (folder / VERSION / f"v{VERSION}.zip").read_bytes() == first.read_bytes()
    project = tmp_path / "project"
    _lock(project, "0" * 64)
    monkeypatch.chdir(project)
    locked = run_qnnctl("mirror", str(tmp_path / "other"), "--file", str(first))
    assert locked.returncode == 4, locked.stderr
    assert (f"its sha256 is {_sha256(first.read_bytes())}, the lock pins {'0' * 64}; nothing was added to the "
            "mirror") in locked.stderr
    assert not (tmp_path / "other" / VERSION).exists()


def test_a_version_and_file_together_are_a_usage_error(tmp_path: Path) -> None:
    proc = run_qnnctl("mirror", str(tmp_path / "m"), VERSION, "--file", str(tmp_path / "a.zip"))
    assert proc.returncode == 2, proc.stderr
    assert "give VERSION... or --file ARCHIVE..., not both" in proc.stderr


def test_mirroring_an_installed_sdk_says_the_cache_keeps_no_archive(server: FaultServer, served: bytes,
                                                                    tmp_path: Path, cache_dir: Path) -> None:
    archive = tmp_path / "served" / f"v{VERSION}.zip"
    assert run_qnnctl("install", "--file", str(archive)).returncode == 0
    proc = run_qnnctl("mirror", str(tmp_path / "mirror"), VERSION, env={**os.environ, "QNNCTL_MIRROR": server.base})
    assert proc.returncode == 0, proc.stderr
    assert (f"SDK {VERSION} is installed, but qnnctl's cache keeps no archive of it (an install removes the archive "
            f"once it is unpacked), so it is fetched; it was installed from {archive}: `qnnctl mirror DIR --file "
            f"{archive}` adds that") in proc.stderr
    archive.unlink()
    proc = run_qnnctl("mirror", str(tmp_path / "mirror2"), VERSION, env={**os.environ, "QNNCTL_MIRROR": server.base})
    assert proc.returncode == 0, proc.stderr
    assert "with its archive at hand, `qnnctl mirror DIR --file ARCHIVE` adds it without a download" in proc.stderr
