"""What the host runtime stages is what was checked: LLVM's archive held to a sha256 known before
it is fetched, a --runtime-from file read once, modes that nobody else can write through.

The attackers here are built as they would be: a loopback server handing out another archive
under LLVM's name, a file renamed over the one given while qnnctl reads it.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import re
import stat
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qnnctl.errors import DownloadError, IntegrityError, UsageError
from qnnctl.host import llvm
from qnnctl.host.llvm import LLVM_URL, Expected, expected_sha256, llvm_source
from qnnctl.host.packages import tar_members
from qnnctl.host.runtime import RuntimeRequest, stage_runtime
from qnnctl.host.staged import TRIO
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import Sdk
from tests.conftest import run_qnnctl
from tests.host.test_packages import Entry, build_deb, tar_bytes
from tests.host.test_runtime import (
    LLVM_TOP,
    llvm_archive,
    manifest_of,
    needs_host_without_trio,
    nothing_staged,
    stub_trio,
)
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import VERSION, compile_shared, install_tree_into_cache

LLVM_NAME = f"{LLVM_TOP}.tar.xz"
LLVM_PATH = f"/llvmorg-14.0.0/{LLVM_NAME}"
PUBLISHED = "61582215dafafb7b576ea30cc136be92c877ba1f1c31ddbbd372d6d65622fef5"


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def _no_llvm_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """No digest comes from the environment unless a test gives one; no apt, no LLVM release."""
    monkeypatch.delenv("QNNCTL_LLVM_SHA256", raising=False)
    monkeypatch.setenv("QNNCTL_LLVM_URL", "http://127.0.0.1:9/no-llvm-archive-here.tar.xz")


@pytest.fixture
def sdk(cache_dir: Path) -> Sdk:
    return Sdk(install_tree_into_cache(cache_dir), VERSION, "qnnctl cache")


# -- LLVM's archive ----------------------------------------------------------------------------


def test_another_archive_under_the_llvm_name_is_refused_and_nothing_staged(
        server: FaultServer, tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    data, _ = llvm_archive(tmp_path, big=1 << 20)  # a sound archive of LLVM's layout, but not LLVM's
    url = server.add(LLVM_PATH, data, "application/x-xz")
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False, llvm_url=url), os.environ)
    assert caught.value.exit_code == 4
    assert caught.value.message == (f"sha256 mismatch for {url}: the sha256 LLVM publishes for {LLVM_NAME} is "
                                    f"{PUBLISHED}, the archive served is {sha256_of(data)} ({len(data)} bytes)")
    assert caught.value.hint == (
        "this is not the archive that was vouched for; check QNNCTL_LLVM_URL and QNNCTL_LLVM_SHA256, or give the "
        "libraries with --runtime-from; nothing was staged")
    assert len(server.requests_for(LLVM_PATH)) == 1  # it was fetched, and refused
    nothing_staged(cache_dir)


def test_another_archive_under_the_llvm_name_exits_4_on_the_command_line(
        server: FaultServer, tmp_path: Path, cache_dir: Path, sdk: Sdk) -> None:
    needs_host_without_trio()
    data, _ = llvm_archive(tmp_path, big=1 << 20)
    url = server.add(LLVM_PATH, data, "application/x-xz")
    env = dict(os.environ, QNNCTL_LLVM_URL=url, PATH=no_apt(tmp_path))
    proc = run_qnnctl("install", VERSION, "--runtime", env=env)
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == ""
    assert "sha256 mismatch" in proc.stderr
    assert PUBLISHED in proc.stderr
    nothing_staged(cache_dir)


def claimed(name: str, size: int, then: bytes = b"") -> bytes:
    """A tar.xz whose one member's header says `size` bytes, followed by only `then`."""
    info = tarfile.TarInfo(f"{LLVM_TOP}/{name}")
    info.size = size
    return lzma.compress(info.tobuf(tarfile.GNU_FORMAT) + then, preset=0)


@pytest.mark.parametrize(("name", "size", "said"), [
    ("lib/libc++.so.1.0", 300 << 20, f"holds more than {256 << 20} bytes in the files qnnctl keeps of it"),
    ("lib/libclang-cpp.so.14", 40 << 30, f"holds more than {32 << 30} bytes in its files"),
], ids=["kept", "unpacked"])
def test_an_llvm_archive_past_what_qnnctl_reads_is_refused_from_a_header(
        server: FaultServer, tmp_path: Path, cache: Cache, cache_dir: Path, name: str, size: int, said: str) -> None:
    """A server could send a trio member, or any member, of any size: written or read through, it
    would fill the disk or take for ever before the digest refused it. Its header says so first."""
    data = claimed(name, size, b"\x7fELF" + bytes(1 << 20))
    url = server.add(LLVM_PATH, data, "application/x-xz")
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False, llvm_url=url), os.environ)
    assert caught.value.message == f"{url} {said}: more than the package it stands for could"
    nothing_staged(cache_dir)


def test_an_llvm_archive_of_links_past_what_qnnctl_holds_is_refused_from_their_headers(
        server: FaultServer, cache: Cache, cache_dir: Path) -> None:
    """Every link is kept, in memory, with its name and its target: 2,100 links of 16 kB each
    (a few hundred kilobytes compressed) pass the 16 MiB qnnctl holds of them (200,000 of them,
    1.5 MB compressed, held 3 GB before the digest refused the archive)."""
    links = []
    for i in range(2100):
        info = tarfile.TarInfo(f"{LLVM_TOP}/{i:05d}" + "d" * 7900)
        info.type, info.linkname = tarfile.SYMTYPE, "t" * 8000
        links.append(info.tobuf(tarfile.GNU_FORMAT))
    url = server.add(LLVM_PATH, lzma.compress(b"".join(links) + bytes(1024), preset=0), "application/x-xz")
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False, llvm_url=url), os.environ)
    assert caught.value.message == (f"{url} holds more than {16 << 20} bytes in the names and link targets qnnctl "
                                    "keeps of it: more than the package it stands for could")
    nothing_staged(cache_dir)


def test_an_llvm_archive_that_never_ends_is_stopped_at_the_most_qnnctl_reads(
        server: FaultServer, tmp_path: Path, cache: Cache, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole tar, then bytes without end: the trio is written, but the rest is read only up to the
    most any LLVM archive could hold (made small here), and nothing is staged."""
    monkeypatch.setattr(llvm, "LLVM_MOST", 8 << 20)
    data, _ = llvm_archive(tmp_path, big=1 << 20)
    url = server.add(LLVM_PATH, b"", "application/x-xz")
    server.fail(LLVM_PATH, Fault.endless(data, 256 << 20))
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False, llvm_url=url), os.environ)
    assert caught.value.message == (f"{url} sent more than {8 << 20} bytes, more than any LLVM archive qnnctl reads: "
                                    "it was stopped there")
    assert caught.value.hint == ("this is not the archive that was vouched for; check QNNCTL_LLVM_URL, or give the "
                                 "libraries with --runtime-from; nothing was staged")
    assert server.bytes_served(LLVM_PATH) < 64 << 20, server.bytes_served(LLVM_PATH)
    nothing_staged(cache_dir)


def extended(kind: bytes, payload: bytes) -> bytes:
    """One extended tar header (a GNU long name, a pax header...) of `payload`, in its blocks."""
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = kind, len(payload)
    return info.tobuf(tarfile.GNU_FORMAT) + payload + bytes(-len(payload) % tarfile.BLOCKSIZE)


def pax(records: dict[str, str]) -> bytes:
    """A pax header of `records`, each as `LEN KEY=VALUE\n`."""
    lines = b""
    for key, value in records.items():
        line = f" {key}={value}\n".encode()
        size = len(line) + len(str(len(line)))
        size += len(str(size)) - len(str(len(line)))
        lines += str(size).encode() + line
    return extended(tarfile.XHDTYPE, lines)


def trio_member() -> bytes:
    info = tarfile.TarInfo(f"{LLVM_TOP}/lib/libc++.so.1")
    info.size = 4
    return info.tobuf(tarfile.GNU_FORMAT) + b"\x7fELF" + bytes(508) + bytes(1024)


def old_sparse() -> bytes:
    """A GNU sparse member (type S), whose extension blocks tarfile reads without end."""
    info = tarfile.TarInfo(f"{LLVM_TOP}/lib/libc++.so.1")
    info.type = tarfile.GNUTYPE_SPARSE
    return info.tobuf(tarfile.GNU_FORMAT)


@pytest.mark.parametrize(("headers", "said"), [
    # Each GNU long name makes tarfile read the next header from inside its own reading: a few
    # hundred of them (a kilobyte compressed) ran Python out of stack, an "unexpected error".
    (b"".join(extended(tarfile.GNUTYPE_LONGNAME, f"{LLVM_TOP}/n{i}".encode()) for i in range(400)),
     "more than 8 extended tar headers in a row"),
    # A long name is read whole into memory: 64 MiB here, compressed to a few kilobytes (a gigabyte
    # of it, 150 kB compressed, took 7 GB of memory before the digest refused it).
    (extended(tarfile.GNUTYPE_LONGNAME, b"a" * (64 << 20)),
     f"an extended tar header of {64 << 20} bytes (at most 8192)"),
    (extended(tarfile.XHDTYPE, b"1" * (64 << 10)), f"an extended tar header of {64 << 10} bytes (at most 8192)"),
    # A sparse map is read by tarfile without bound, or parsed unchecked (ValueError).
    (pax({"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "x"}),
     f"'{LLVM_TOP}/lib/libc++.so.1' is a sparse member"),
    (pax({"GNU.sparse.map": "x,y"}), "bad tar header: invalid literal for int() with base 10: 'x'"),
    (old_sparse(), f"'{LLVM_TOP}/lib/libc++.so.1' is a sparse member"),
], ids=["chained", "long-name", "pax", "sparse-1.0", "sparse-map", "sparse"])
def test_an_llvm_archive_whose_tar_headers_pass_what_qnnctl_reads_is_refused_before_they_are_read(
        server: FaultServer, cache: Cache, cache_dir: Path, headers: bytes, said: str) -> None:
    """Before the digest can refuse it, a server's archive is read by tarfile: its extended headers
    are bounded in size and in number before tarfile reads them, and a sparse member is refused."""
    url = server.add(LLVM_PATH, lzma.compress(headers + trio_member(), preset=0), "application/x-xz")
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False, llvm_url=url), os.environ)
    assert caught.value.message == f"{url} is corrupt or truncated: {said}"
    nothing_staged(cache_dir)


def test_extended_tar_headers_within_the_bounds_are_read(
        server: FaultServer, tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    """Long names in both forms, pax's and GNU's, up to 8 in a row and PATH_MAX long: read as before."""
    long = "d/" * 2000 + "libc++.so.1"
    headers = (pax({"comment": "c" * 4000}) + pax({"path": f"{LLVM_TOP}/{long}", "linkpath": "l" * 4000})
               + extended(tarfile.GNUTYPE_LONGNAME, f"{LLVM_TOP}/{long}".encode()))
    data = lzma.compress(headers + trio_member(), preset=0)
    found = list(tar_members(io.BytesIO(data), "p.tar.xz"))
    assert [(m.name, m.size) for m in found] == [(f"{LLVM_TOP}/{long}", 4)]


def test_an_llvm_archive_sent_slowly_is_stopped_at_the_time_qnnctl_gives_it(
        server: FaultServer, tmp_path: Path, cache: Cache, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read comes within its timeout, but the whole never comes: a server can send a byte a
    minute for ever. The stream is stopped at its deadline (made short here), not retried."""
    monkeypatch.setattr(llvm, "LLVM_DEADLINE", 0.5)
    data, _ = llvm_archive(tmp_path, big=1 << 20)
    url = server.add(LLVM_PATH, data, "application/x-xz")
    server.fail(LLVM_PATH, Fault.slow(64, 0.1))  # 4 s for the 2.5 kB it is
    started = time.monotonic()
    with pytest.raises(DownloadError) as caught:
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False, llvm_url=url), os.environ)
    assert time.monotonic() - started < 2  # the whole would take 4 s: stopped in the middle of a read
    assert re.fullmatch(rf"streaming {re.escape(url)} took more than 0.5 s \(\d+ bytes read\): it was stopped there",
                        caught.value.message), caught.value.message
    assert caught.value.hint == (
        f"download {LLVM_NAME} (or the libc++1-14 libc++abi1-14 libunwind-14 packages) by other means and give the "
        "file with --runtime-from, or set QNNCTL_LLVM_URL to a faster mirror; nothing was staged")
    assert len(server.requests_for(LLVM_PATH)) == 1
    nothing_staged(cache_dir)


def no_apt(tmp_path: Path) -> str:
    """A PATH whose apt-get fails, so that the trio comes from the LLVM archive."""
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    (shims / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package' >&2\nexit 100\n")
    (shims / "apt-get").chmod(0o755)
    return f"{shims}{os.pathsep}{os.environ['PATH']}"


def test_an_archive_with_the_sha256_given_for_it_is_staged(
        server: FaultServer, tmp_path: Path, cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    data, libs = llvm_archive(tmp_path, big=1 << 20)
    url = server.add("/mirror/llvm-14.tar.xz", data, "application/x-xz")
    monkeypatch.setenv("QNNCTL_LLVM_URL", url)
    monkeypatch.setenv("QNNCTL_LLVM_SHA256", sha256_of(data))
    result = stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == libs
    assert manifest_of(result.libcxx.root)["sources"] == [
        {"source": url, "sha256": sha256_of(data), "size": len(data), "checked_against": "QNNCTL_LLVM_SHA256"}]
    # One byte off in the digest given, and the same archive is refused.
    monkeypatch.setenv("QNNCTL_LLVM_SHA256", sha256_of(data)[:-1] + ("0" if sha256_of(data)[-1] != "0" else "1"))
    with pytest.raises(IntegrityError, match="QNNCTL_LLVM_SHA256 is"):
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False), os.environ)
    assert [p.name for p in cache.runtime.iterdir()] == [result.libcxx.name]


def test_an_llvm_url_without_a_sha256_is_refused_before_it_is_fetched(
        server: FaultServer, tmp_path: Path, cache_dir: Path, sdk: Sdk) -> None:
    needs_host_without_trio()
    data, _ = llvm_archive(tmp_path, big=1 << 20)
    url = server.add("/mirror/llvm-14.tar.xz", data, "application/x-xz")
    env = dict(os.environ, QNNCTL_LLVM_URL=url, PATH=no_apt(tmp_path))
    proc = run_qnnctl("install", VERSION, "--runtime", env=env)
    assert proc.returncode == 4, proc.stderr
    assert "no sha256 was given for it" in proc.stderr
    assert "QNNCTL_LLVM_SHA256" in proc.stderr
    assert server.requests_for("/mirror/llvm-14.tar.xz") == []
    nothing_staged(cache_dir)
    # A digest that is no digest is a usage error, named as such.
    proc = run_qnnctl("install", VERSION, "--runtime", env=dict(env, QNNCTL_LLVM_SHA256="abc"))
    assert proc.returncode == 2, proc.stderr
    assert "QNNCTL_LLVM_SHA256='abc' is not a sha256 digest" in proc.stderr


def test_what_an_llvm_archive_is_held_to_before_it_is_fetched() -> None:
    """In the tests' own process: the digest given wins, else the one published for the archive's
    file name (wherever it is served from); neither is refused, naming the URL without its secrets."""
    mirror = f"https://user:secret@mirror.example/llvm/{LLVM_NAME}?token=t0k"
    assert expected_sha256(mirror, None) == Expected(PUBLISHED, f"the sha256 LLVM publishes for {LLVM_NAME}")
    assert expected_sha256(mirror, "  \n") == expected_sha256(mirror, None)  # an empty setting is none
    digest = "AB" * 32
    assert expected_sha256("https://mirror.example/other.tar.xz", f" {digest} ") == Expected(
        digest.lower(), "QNNCTL_LLVM_SHA256")
    for bad in ("ab" * 31 + "a", "ab" * 31 + "ag", "ab" * 33):
        with pytest.raises(UsageError) as refused:
            expected_sha256(mirror, bad)
        assert refused.value.message == f"QNNCTL_LLVM_SHA256={bad!r} is not a sha256 digest (64 hex digits)"
        assert refused.value.hint == f"set it to the archive's sha256, as `sha256sum {LLVM_NAME}` prints it"
    other = "https://user:secret@mirror.example/llvm-14.tar.xz"
    with pytest.raises(IntegrityError) as unknown:
        expected_sha256(other, None)
    assert unknown.value.message == (
        f"https://***@mirror.example/llvm-14.tar.xz is not LLVM's release archive {LLVM_NAME}, and no sha256 "
        "was given for it: qnnctl cannot check the libraries it would stage from it")
    assert unknown.value.hint == (
        f"set QNNCTL_LLVM_SHA256 to the archive's sha256 (from a copy you trust), or point QNNCTL_LLVM_URL at a "
        f"copy of {LLVM_NAME} under that name, or give the libraries with --runtime-from; nothing was fetched")
    # Where the URL and the digest come from: the request's, else the environment's, else LLVM's own.
    environ = {"QNNCTL_LLVM_URL": "https://env.example/llvm.tar.xz", "QNNCTL_LLVM_SHA256": "cd" * 32}
    assert llvm_source(environ, None, None) == ("https://env.example/llvm.tar.xz",
                                                Expected("cd" * 32, "QNNCTL_LLVM_SHA256"))
    assert llvm_source(environ, mirror, "ef" * 32) == (mirror, Expected("ef" * 32, "QNNCTL_LLVM_SHA256"))
    assert llvm_source({}, None, None) == (LLVM_URL, expected_sha256(LLVM_URL, None))
    assert llvm_source(environ, mirror, "") == (mirror, expected_sha256(mirror, None))  # given empty: not the env's


# -- a file given with --runtime-from, swapped while it is read -----------------------------

_SWAP: dict[str, Any] = {}


def _swap_on_open(event: str, args: tuple[Any, ...]) -> None:
    """Before the `at`-th open of `path` (by any means: open(), os.open, a copy), rename `other`
    over it: what anyone who can write the file's folder can do between two reads."""
    if event != "open" or not _SWAP or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    if os.path.realpath(os.fsdecode(args[0])) != _SWAP["path"]:
        return
    _SWAP["opens"] += 1
    if _SWAP["opens"] == _SWAP["at"]:
        os.replace(_SWAP["other"], _SWAP["path"])
        _SWAP["swapped"] = True


sys.addaudithook(_swap_on_open)  # audit hooks stay for the process: it does nothing unless armed


@pytest.fixture
def swap() -> Iterator[dict[str, Any]]:
    yield _SWAP
    _SWAP.clear()


def marked_trio(folder: Path, mark: int) -> dict[str, bytes]:
    """Three real libraries with the trio's sonames whose bytes differ with `mark`."""
    built = {}
    for soname in TRIO:
        stem = soname.split(".")[0].replace("+", "x")
        path = compile_shared(folder / soname, f"int {stem}_mark(void) {{ return {mark}; }}\n",
                              extra=[f"-Wl,-soname,{soname}"])
        built[soname] = path.read_bytes()
    return built


def trio_deb(path: Path, folder: Path, mark: int) -> tuple[bytes, dict[str, bytes]]:
    libs = marked_trio(folder, mark)
    entries = [Entry(f"./usr/lib/x86_64-linux-gnu/{name}", data) for name, data in libs.items()]
    build_deb(path, "libcxx-trio-local", "1.0", entries)
    return path.read_bytes(), libs


def trio_tar(path: Path, folder: Path, mark: int) -> tuple[bytes, dict[str, bytes]]:
    """The trio laid out as in LLVM's release archive, as a file given with --runtime-from."""
    libs = marked_trio(folder, mark)
    path.write_bytes(tar_bytes([Entry(f"{LLVM_TOP}/lib/{name}", data, mode=0o755) for name, data in libs.items()]))
    return path.read_bytes(), libs


@pytest.mark.parametrize("build", [trio_deb, trio_tar], ids=["deb", "tar.xz"])
def test_a_file_swapped_while_it_is_read_is_never_staged_under_the_first_ones_digest(
        build: Any, tmp_path: Path, cache: Cache, swap: dict[str, Any]) -> None:
    """Whenever the swap comes, what is staged is what the recorded sha256 is of."""
    given = tmp_path / "given" / "trio.pkg"
    given.parent.mkdir()
    seen = set()
    for at in range(1, 8):
        good, good_libs = build(given, tmp_path / f"good{at}", 7)
        evil_path = tmp_path / "given" / f"evil{at}.pkg"
        evil, evil_libs = build(evil_path, tmp_path / f"evil{at}", 666)
        assert good_libs != evil_libs
        swap.update(path=os.path.realpath(given), other=str(evil_path), at=at, opens=0, swapped=False)
        result = stage_runtime(cache, None, RuntimeRequest(sources=(given,), force=True, use_apt=False), os.environ)
        swapped = swap["swapped"]
        swap.clear()
        assert result.libcxx is not None
        staged = {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO}
        sources = manifest_of(result.libcxx.root)["sources"]
        assert isinstance(sources, list)
        assert len(sources) == 1
        record: dict[str, Any] = sources[0]
        if record["sha256"] == sha256_of(good):
            assert staged == good_libs, f"swapped before open {at}: staged the other file's libraries"
        else:
            assert record["sha256"] == sha256_of(evil)
            assert staged == evil_libs
        seen.add((swapped, record["sha256"] == sha256_of(evil)))
    # The swap did come, early enough to be read whole, and too late to be read at all.
    assert (True, True) in seen
    assert (False, False) in seen or (True, False) in seen


def test_a_file_swapped_for_no_package_after_the_first_look_is_refused_by_its_name(
        tmp_path: Path, cache: Cache, cache_dir: Path, swap: dict[str, Any]) -> None:
    """The first look (before anything is fetched) saw a package; the one reading that stages saw
    something else, and says which file."""
    given = tmp_path / "given" / "trio.pkg"
    given.parent.mkdir()
    trio_tar(given, tmp_path / "good", 7)
    junk = tmp_path / "given" / "junk"
    junk.write_bytes(b"#!/bin/sh\n" * 100)
    swap.update(path=os.path.realpath(given), other=str(junk), at=2, opens=0, swapped=False)
    with pytest.raises(UsageError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(given,), force=True, use_apt=False), os.environ)
    assert swap["swapped"]
    assert caught.value.message == f"{given} is not a .deb, .rpm or tar archive"
    nothing_staged(cache_dir)


# -- modes -------------------------------------------------------------------------------------


def open_trio_tar(path: Path, folder: Path) -> dict[str, bytes]:
    """A tar.xz whose folders and libraries are writable by everyone, as an archive may say."""
    libs = stub_trio(folder)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tf:
        for name in ("lib", "lib/x86_64-linux-gnu"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o777
            tf.addfile(info)
        for soname, data in libs.items():
            info = tarfile.TarInfo(f"lib/x86_64-linux-gnu/{soname}")
            info.size = len(data)
            info.mode = 0o777
            tf.addfile(info, io.BytesIO(data))
    path.write_bytes(lzma.compress(buffer.getvalue(), preset=0))
    return libs


def test_what_is_staged_is_writable_by_its_owner_alone(tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    archive = tmp_path / "open.tar.xz"
    open_trio_tar(archive, tmp_path / "stubs")
    previous = os.umask(0)
    try:
        result = stage_runtime(cache, None, RuntimeRequest(sources=(archive,), force=True, use_apt=False),
                               os.environ)
    finally:
        os.umask(previous)
    assert result.libcxx is not None
    checked = [cache_dir / "runtime", *sorted((cache_dir / "runtime").rglob("*"))]
    assert len(checked) >= 6  # runtime/, the stage, lib/, three libraries, the manifest
    loose = {str(p.relative_to(cache_dir)): oct(stat.S_IMODE(p.lstat().st_mode)) for p in checked
             if p.lstat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)}
    assert loose == {}
    assert all(os.access(result.libcxx.lib_dir / n, os.X_OK) for n in TRIO)
    assert json.loads((result.libcxx.root / ".qnnctl.json").read_text())["kind"] == "libcxx"
