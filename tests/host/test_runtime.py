"""Staging the host runtime: the libc++ trio and glibc, from real packages and archives.

Tests named test_apt_* fetch real Debian packages with `apt-get download` (libc++1-14,
libc++abi1-14, libunwind-14, libc6); they skip locally when that fails and fail in CI.
Deselect them offline with `-k "not apt"`.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import lzma
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from qnnctl.errors import DownloadError, IntegrityError, QnnctlError, UsageError
from qnnctl.host import llvm as llvm_module
from qnnctl.host import sources as sources_module
from qnnctl.host.build import RuntimePins
from qnnctl.host.machine import glibc_version as host_glibc
from qnnctl.host.needs import glibc_shortfall, missing_host_libraries, sdk_glibc_requirement
from qnnctl.host.runtime import LOCK_KEY, RuntimeRequest, RuntimeResult, stage_runtime
from qnnctl.host.sources import PINNED_DEBS, check_sources
from qnnctl.host.staged import GLIBC, LIBCXX, LOADER, LOADER_GUARD, TRIO, current, staged_lib_dirs, staged_loader
from qnnctl.run.lower import reexec_command
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import Sdk
from tests.conftest import run_qnnctl
from tests.host.test_packages import Entry, apt_debs, build_deb, build_rpm, cpio_entries, cpio_newc, tar_bytes
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import VERSION, compile_shared, for_another_machine, install_tree_into_cache

LLVM_TOP = "clang+llvm-14.0.0-x86_64-linux-gnu-ubuntu-18.04"
TRIO_DEBS = ("libc++1-14", "libc++abi1-14", "libunwind-14")


@pytest.fixture
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return apt_debs(tmp_path_factory)


@pytest.fixture
def sdk(cache_dir: Path) -> Sdk:
    return Sdk(install_tree_into_cache(cache_dir), VERSION, "qnnctl cache")


def host_has_trio() -> bool:
    return not missing_host_libraries(TRIO, [])


def needs_host_without_trio() -> None:
    """The command line stages the trio only where the host lacks it (as on this Debian)."""
    if host_has_trio():
        pytest.skip("this host has libc++.so.1 and friends, so `install --runtime` stages nothing")


def nothing_staged(cache_dir: Path) -> None:
    runtime = cache_dir / "runtime"
    assert not runtime.exists() or list(runtime.iterdir()) == []
    tmp = cache_dir / "tmp"
    assert not tmp.exists() or list(tmp.iterdir()) == []


def stub_trio(folder: Path) -> dict[str, bytes]:
    """Three small real libraries with the trio's sonames."""
    built = {}
    for soname in TRIO:
        stem = soname.split(".")[0].replace("+", "x")
        path = compile_shared(folder / soname, f"int {stem}_stub(void) {{ return 7; }}\n",
                              extra=[f"-Wl,-soname,{soname}"])
        built[soname] = path.read_bytes()
    return built


def llvm_archive(folder: Path, big: int = 32 << 20, libs: dict[str, bytes] | None = None
                 ) -> tuple[bytes, dict[str, bytes]]:
    """A tar.xz laid out like the LLVM 14.0.0 release, with big members around the trio (`libs`,
    by soname; stub libraries by default).

    The big members compress to almost nothing; writing any of them to disk would take
    `big` bytes.
    """
    libs = libs if libs is not None else stub_trio(folder / "stubs")
    buffer = io.BytesIO()

    def add(name: str, data: bytes = b"", link: str | None = None) -> None:
        info = tarfile.TarInfo(f"{LLVM_TOP}/{name}")
        if link is not None:
            info.type = tarfile.SYMTYPE
            info.linkname = link
            tf.addfile(info)
        else:
            info.size = len(data)
            info.mode = 0o755
            tf.addfile(info, io.BytesIO(data))

    with tarfile.open(fileobj=buffer, mode="w") as tf:
        add("bin/clang-14", bytes(big))
        for soname, data in libs.items():
            add(f"lib/{soname}", link=f"{soname}.0")  # the link comes before its file
            add(f"lib/{soname}.0", data)
        add("lib/libc++.so", b"INPUT(libc++.so.1 -lc++abi)\n")
        add("lib/libclang-cpp.so.14", bytes(big))
        add("include/c++/v1/vector", b"// vector\n" * 1000)
    return lzma.compress(buffer.getvalue(), preset=0), libs


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_of(staged_root: Path) -> dict[str, object]:
    data = json.loads((staged_root / ".qnnctl.json").read_text())
    assert isinstance(data, dict)
    return data


# -- the libc++ trio from Debian packages ------------------------------------------------

LOAD_CHILD = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
print(lib.t_answer())
print("".join(line for line in open("/proc/self/maps") if "libc++" in line))
"""


def test_apt_trio_is_staged_and_a_library_needing_it_loads(cache: Cache, sdk: Sdk, debs: dict[str, Path],
                                                           tmp_path: Path) -> None:
    # force: stage even on a host that has libc++ already.
    result = stage_runtime(cache, sdk, RuntimeRequest(force=True), os.environ)
    assert result.libcxx_action == "staged"
    assert result.libcxx is not None
    lib = result.libcxx.lib_dir
    assert sorted(p.name for p in lib.iterdir()) == sorted(TRIO)
    assert result.libcxx.name == "libcxx-14.0.6-12"
    manifest = manifest_of(result.libcxx.root)
    sources = manifest["sources"]
    assert isinstance(sources, list)
    assert sorted(s["package"] for s in sources) == sorted(TRIO_DEBS)
    for source in sources:
        assert source["pinned"] is True
        assert source["sha256"] == PINNED_DEBS[(source["package"], source["version"], "amd64")]
    assert staged_lib_dirs(cache, sdk) == [lib]

    # A library with DT_NEEDED libc++.so.1, linked against the staged copy.
    source = tmp_path / "t.c"
    source.write_text("int t_answer(void) { return 42; }\n")
    libt = tmp_path / "libt.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(libt), str(source), f"-L{lib}",
                    f"-Wl,-rpath-link,{lib}", "-Wl,--no-as-needed", "-l:libc++.so.1"], check=True)
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    with open(libt, "rb") as handle:
        dynamic = ELFFile(handle).get_section_by_name(".dynamic")
        assert isinstance(dynamic, DynamicSection)
        needed = [getattr(tag, "needed") for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]
    assert "libc++.so.1" in needed

    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    loaded = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(libt)], capture_output=True,
                            text=True, env={**env, "LD_LIBRARY_PATH": str(lib)})
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.splitlines()[0] == "42"
    assert str(lib / "libc++.so.1") in loaded.stdout  # the staged copy is the one mapped
    plain = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(libt)], capture_output=True,
                           text=True, env=env)
    if host_has_trio():
        assert str(lib) not in plain.stdout
    else:
        assert plain.returncode != 0
        assert "libc++.so.1" in plain.stderr


def test_apt_trio_from_runtime_from_debs_records_pinned_digests(cache: Cache, sdk: Sdk,
                                                               debs: dict[str, Path]) -> None:
    sources = tuple(debs[name] for name in TRIO_DEBS)
    result = stage_runtime(cache, sdk, RuntimeRequest(sources=sources, force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    manifest = manifest_of(result.libcxx.root)
    recorded = {s["source"]: s["sha256"] for s in manifest["sources"]}  # type: ignore[attr-defined]
    assert recorded == {str(debs[n]): PINNED_DEBS[(n, "1:14.0.6-12", "amd64")] for n in TRIO_DEBS}
    files = manifest["files"]
    assert isinstance(files, dict)
    assert sorted(files) == sorted(f"lib/{n}" for n in TRIO)
    # The real libraries the packages' links lead to, not the links.
    assert all((result.libcxx.lib_dir / n).stat().st_size > 30_000 for n in TRIO)


def test_apt_concurrent_installs_stage_once(cache_dir: Path, sdk: Sdk, debs: dict[str, Path]) -> None:
    needs_host_without_trio()
    from filelock import FileLock

    args = ["install", VERSION, "--runtime"]
    for name in TRIO_DEBS:
        args += ["--runtime-from", str(debs[name])]
    lock = FileLock(str(cache_dir / "locks" / f"{LOCK_KEY}.lock"))
    (cache_dir / "locks").mkdir(parents=True, exist_ok=True)
    lock.acquire()
    procs = [subprocess.Popen([sys.executable, "-m", "qnnctl", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errs: list[list[str]] = [[] for _ in procs]
    waiting = [threading.Event() for _ in procs]

    def read(i: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            errs[i].append(line)
            if line == "qnnctl: waiting for another qnnctl to finish staging the host runtime\n":
                waiting[i].set()

    readers = [threading.Thread(target=read, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for reader in readers:
        reader.start()
    try:
        # Every process has decided to stage and is queued on the lock.
        for event in waiting:
            assert event.wait(120), "a process never reached the lock"
    finally:
        lock.release()
    # stdout only here: communicate() would also read stderr, racing the reader threads for its lines.
    outs = [p.stdout.read() if p.stdout is not None else "" for p in procs]
    for proc in procs:
        proc.wait(timeout=120)
    for reader in readers:
        reader.join()
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errs
    assert all(out.strip() == str(sdk.root) for out in outs)
    staged = [i for i, lines in enumerate(errs) if any("staged libc++ runtime" in x for x in lines)]
    assert len(staged) == 1, errs
    assert [p.name for p in (cache_dir / "runtime").iterdir()] == ["libcxx-14.0.6-12"]
    assert list((cache_dir / "tmp").iterdir()) == []


# -- the libc++ trio from the LLVM release archive ---------------------------------------

STREAM_CHILD = """
import os, resource, sys
from qnnctl.sdk.cache import Cache
from qnnctl.host.runtime import RuntimeRequest, stage_runtime
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
request = RuntimeRequest(force=True, use_apt=False, llvm_url=sys.argv[1], llvm_sha256=sys.argv[3])
result = stage_runtime(Cache.from_env(os.environ), None, request, os.environ)
print(result.libcxx.root)
"""


def test_llvm_archive_is_streamed_and_only_the_trio_written(server: FaultServer, tmp_path: Path,
                                                            cache_dir: Path) -> None:
    data, libs = llvm_archive(tmp_path)
    url = server.add(f"/llvmorg-14.0.0/{LLVM_TOP}.tar.xz", data, "application/x-xz")
    # No file bigger than 4 MiB may be written: the archive's big members would be 32 MiB.
    limit = 4 << 20
    proc = subprocess.run([sys.executable, "-c", STREAM_CHILD, url, str(limit), sha256_of(data)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    root = Path(proc.stdout.strip())
    assert root == cache_dir / "runtime" / "libcxx-14.0.0"
    assert sorted(p.name for p in (root / "lib").iterdir()) == sorted(TRIO)
    for soname, content in libs.items():
        assert (root / "lib" / soname).read_bytes() == content
    manifest = manifest_of(root)
    assert manifest["sources"] == [{"source": url, "sha256": sha256_of(data), "size": len(data),
                                    "checked_against": "QNNCTL_LLVM_SHA256"}]
    assert len(server.requests_for(f"/llvmorg-14.0.0/{LLVM_TOP}.tar.xz")) == 1
    assert list((cache_dir / "tmp").iterdir()) == []


def test_llvm_stream_retries_from_the_start(server: FaultServer, tmp_path: Path, cache: Cache) -> None:
    data, libs = llvm_archive(tmp_path, big=1 << 20)
    path = "/llvm.tar.xz"
    url = server.add(path, data, "application/x-xz")
    server.fail(path, Fault.status(503), Fault.drop_after(len(data) // 2))
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(data), backoff_base=0.01)
    result = stage_runtime(cache, None, request, os.environ)
    assert result.libcxx is not None
    assert (result.libcxx.lib_dir / "libc++.so.1").read_bytes() == libs["libc++.so.1"]
    assert len(server.requests_for(path)) == 3


def test_llvm_stream_that_keeps_failing_stages_nothing(server: FaultServer, tmp_path: Path,
                                                       cache: Cache, cache_dir: Path) -> None:
    data, _ = llvm_archive(tmp_path, big=1 << 20)
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    server.fail("/llvm.tar.xz", *[Fault.drop_after(len(data) // 3)] * 3)
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(data), backoff_base=0.01)
    with pytest.raises(DownloadError, match="after 3 attempts") as caught:
        stage_runtime(cache, None, request, os.environ)
    assert caught.value.hint == NETWORK_HINT
    assert len(server.requests_for("/llvm.tar.xz")) == 3
    nothing_staged(cache_dir)
    with pytest.raises(DownloadError, match="HTTP 404") as refused:
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False, llvm_url=server.url("/none")),
                      os.environ)
    assert refused.value.message == f"HTTP 404 from {server.url('/none')}"
    assert refused.value.hint == "check QNNCTL_LLVM_URL, or give the libraries with --runtime-from"
    nothing_staged(cache_dir)


NETWORK_HINT = ("check the network and proxy settings, set QNNCTL_LLVM_URL to a mirror, or give the libraries "
                "with --runtime-from")


def retry_waits(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings before each retry of the LLVM stream: why, and how long it waits."""
    return [record.getMessage() for record in caplog.records
            if record.levelname == "WARNING" and "; retrying in " in record.getMessage()]


def test_llvm_stream_waits_as_long_as_the_server_asks(server: FaultServer, tmp_path: Path, cache: Cache,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A Retry-After is waited for; without one, the backoff from the base asked for, doubling."""
    data, libs = llvm_archive(tmp_path, big=1 << 10)
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    server.fail("/llvm.tar.xz", Fault.status(503, retry_after="1"), Fault.drop_after(len(data) // 2))
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(data), backoff_base=0.04)
    result = stage_runtime(cache, None, request, os.environ)
    assert result.libcxx is not None
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == libs
    waits = retry_waits(caplog)
    assert len(waits) == 2
    assert waits[0] == f"HTTP 503 from {url}; retrying in 1.0s"
    assert waits[1].startswith(f"the connection to {url} broke: ")
    assert waits[1].endswith("; retrying in 0.1s")  # 0.04 * 2 for the second attempt
    assert len(server.requests_for("/llvm.tar.xz")) == 3


def test_llvm_stream_waits_no_longer_than_its_most_whatever_the_server_asks(
        server: FaultServer, tmp_path: Path, cache: Cache, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Retry-After is a request, not an order: BACKOFF_MAX (a fifth of a second here, not a minute) bounds it."""
    monkeypatch.setattr(llvm_module, "BACKOFF_MAX", 0.2)
    data, _ = llvm_archive(tmp_path, big=1 << 10)
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    server.fail("/llvm.tar.xz", Fault.status(503, retry_after="30"))
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(data))
    assert stage_runtime(cache, None, request, os.environ).libcxx is not None
    assert retry_waits(caplog) == [f"HTTP 503 from {url}; retrying in 0.2s"]


def test_llvm_stream_gives_up_on_a_server_that_never_answers(server: FaultServer, tmp_path: Path, cache: Cache,
                                                             cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each attempt waits READ_TIMEOUT for an answer, not for ever (a second here, not a minute)."""
    monkeypatch.setattr(llvm_module, "READ_TIMEOUT", 1.0)
    data, _ = llvm_archive(tmp_path, big=1 << 10)
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    server.fail("/llvm.tar.xz", *[Fault.stall(6)] * 3)
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(data), backoff_base=0.01)
    with pytest.raises(DownloadError) as caught:
        stage_runtime(cache, None, request, os.environ)
    assert caught.value.message.startswith(f"streaming {url} failed after 3 attempts: cannot reach {url}: ")
    assert caught.value.hint == NETWORK_HINT
    assert len(server.requests_for("/llvm.tar.xz")) == 3
    nothing_staged(cache_dir)


@pytest.mark.parametrize("compress", [None, bz2.compress], ids=["xz", "bzip2"])
def test_a_damaged_llvm_archive_vouched_for_is_named_by_its_url(compress: Any, server: FaultServer, tmp_path: Path,
                                                                cache: Cache, cache_dir: Path) -> None:
    """Its sha256 given for the damaged bytes themselves: the decoder's error names the URL, secrets hidden
    (an archive another URL names may be compressed otherwise)."""
    data, _ = llvm_archive(tmp_path, big=1 << 10)
    if compress is not None:
        data = compress(lzma.decompress(data))
    middle = len(data) // 2
    damaged = data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 64]) + data[middle + 64:]
    url = server.add("/llvm.tar.xz", damaged, "application/x-xz").replace("http://", "http://user:secret@")
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(damaged))
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, request, os.environ)
    shown = url.replace("user:secret@", "***@")
    assert caught.value.message.startswith(f"{shown} is corrupt or truncated: "), caught.value.message
    nothing_staged(cache_dir)


def test_llvm_url_that_no_request_can_be_made_to_is_told_at_once(tmp_path: Path, cache: Cache,
                                                                 cache_dir: Path) -> None:
    url = "http://127.0.0.1:99999/llvm.tar.xz"  # no such port
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256="0" * 64, backoff_base=0.01)
    with pytest.raises(DownloadError) as caught:
        stage_runtime(cache, None, request, os.environ)
    assert caught.value.message.startswith(f"request to {url} failed: "), caught.value.message
    assert "99999" in caught.value.message.removeprefix(f"request to {url} failed: ")
    nothing_staged(cache_dir)


def test_failed_apt_get_falls_back_to_the_llvm_archive(server: FaultServer, tmp_path: Path, cache: Cache,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    data, libs = llvm_archive(tmp_path, big=1 << 20)
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package' >&2\nexit 100\n")
    (fake / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("QNNCTL_LLVM_URL", url)
    monkeypatch.setenv("QNNCTL_LLVM_SHA256", sha256_of(data).upper())  # as some tools print it
    result = stage_runtime(cache, None, RuntimeRequest(force=True), os.environ)
    assert result.libcxx is not None
    assert manifest_of(result.libcxx.root)["sources"][0]["source"] == url  # type: ignore[index]
    assert (result.libcxx.lib_dir / "libunwind.so.1").read_bytes() == libs["libunwind.so.1"]


def test_apt_get_runs_in_the_users_environment_with_the_c_locale(server: FaultServer, tmp_path: Path, cache: Cache,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """apt-get gets the user's environment (a proxy's variables, say), in the C locale; here it fails,
    and the trio comes from the LLVM archive."""
    data, libs = llvm_archive(tmp_path, big=1 << 10)
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    seen = tmp_path / "apt-get.env"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text(f'#!/bin/sh\necho "$LC_ALL|$http_proxy|$*" > {seen}\nexit 100\n')
    (fake / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9/proxy")
    result = stage_runtime(cache, None, RuntimeRequest(force=True, llvm_url=url, llvm_sha256=sha256_of(data)),
                           os.environ)
    assert result.libcxx is not None
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == libs
    assert seen.read_text() == f"C|http://127.0.0.1:9/proxy|download {' '.join(TRIO_DEBS)}\n"


APT_SHIMS = {
    "downloads": "cp {debs}/*.deb .\nexit 0\n",
    "downloads-two": "cp {debs}/test-libcxx_*.deb {debs}/test-libunwind_*.deb .\nexit 0\n",
    # Three packages, as asked, but one of them twice: libc++abi.so.1 is not among them.
    "downloads-three-lacking-one": "cp {debs}/test-libcxx_*.deb .\ncp {debs}/test-libcxx_*.deb ./again.deb\n"
                                   "cp {debs}/test-libunwind_*.deb .\nexit 0\n",
    "fails-after-downloading": "cp {debs}/*.deb .\nexit 100\n",
    "hangs": "sleep 4\ncp {debs}/*.deb .\nexit 0\n",
}


@pytest.mark.parametrize("shim", [*APT_SHIMS, "cannot-start"])
def test_what_apt_get_download_leaves_is_used_only_when_it_is_whole(
        shim: str, server: FaultServer, tmp_path: Path, cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    """The three packages, downloaded by an apt-get that ends well in time; anything else, and the
    trio comes from the LLVM archive."""
    data, libs = llvm_archive(tmp_path, big=1 << 10)
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    debs = trio_debs(tmp_path / "debs")
    fake = tmp_path / "bin"
    fake.mkdir()
    script = APT_SHIMS.get(shim, "").format(debs=tmp_path / "debs")
    shebang = "#!/no/such/shell\n" if shim == "cannot-start" else "#!/bin/sh\n"
    (fake / "apt-get").write_text(shebang + script)
    (fake / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(sources_module, "APT_TIMEOUT", 1.0)
    result = stage_runtime(cache, None, RuntimeRequest(force=True, llvm_url=url, llvm_sha256=sha256_of(data)),
                           os.environ)
    assert result.libcxx is not None
    sources = manifest_of(result.libcxx.root)["sources"]
    if shim == "downloads":
        assert sorted(record["source"] for record in sources) == sorted(  # type: ignore[attr-defined]
            f"apt-get download {deb.name}" for deb in debs)
        assert result.libcxx.name == "libcxx-1.0"
        assert sorted(p.name for p in result.libcxx.lib_dir.iterdir()) == sorted(TRIO)
    else:
        assert [record["source"] for record in sources] == [url]  # type: ignore[attr-defined]
        assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == libs


def test_without_apt_get_the_trio_comes_from_the_llvm_archive(server: FaultServer, tmp_path: Path, cache: Cache,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A Debian host whose PATH has no apt-get (a container's slimmed image)."""
    data, libs = llvm_archive(tmp_path, big=1 << 10)
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    empty = tmp_path / "no-programs"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    request = RuntimeRequest(force=True, llvm_url=url, llvm_sha256=sha256_of(data))
    result = stage_runtime(cache, None, request, os.environ)
    assert result.libcxx is not None
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == libs


def test_an_html_page_in_place_of_the_llvm_archive_is_told_as_such(server: FaultServer, tmp_path: Path,
                                                                    cache: Cache, cache_dir: Path) -> None:
    """A proxy's login page, say: told for what it is, not as a damaged archive."""
    data, _ = llvm_archive(tmp_path, big=1 << 10)
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    server.fail("/llvm.tar.xz", Fault.html())
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(data))
    with pytest.raises(DownloadError) as caught:
        stage_runtime(cache, None, request, os.environ)
    assert caught.value.message == f"{url} answered with an HTML page, not the LLVM archive"
    assert caught.value.hint == "check QNNCTL_LLVM_URL and proxy settings"
    nothing_staged(cache_dir)
    page = server.add("/login.tar.xz", b"<html><body>Please log in</body></html>", "Text/HTML; charset=UTF-8")
    with pytest.raises(DownloadError, match="answered with an HTML page"):  # a media type's case is no matter
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False, llvm_url=page, llvm_sha256="0" * 64),
                      os.environ)
    # A server that names no type at all sends what it sends: the archive, held to its sha256.
    server.fail("/llvm.tar.xz", Fault.bare())
    assert stage_runtime(cache, None, request, os.environ).libcxx is not None


def test_llvm_archive_given_as_a_file(tmp_path: Path, cache: Cache) -> None:
    data, libs = llvm_archive(tmp_path, big=1 << 20)
    archive = tmp_path / f"{LLVM_TOP}.tar.xz"
    archive.write_bytes(data)
    result = stage_runtime(cache, None, RuntimeRequest(sources=(archive,), force=True, use_apt=False),
                           os.environ)
    assert result.libcxx is not None
    assert result.libcxx.name == "libcxx-14.0.0"
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == libs


# -- folders, partial sources, where it goes ---------------------------------------------


def test_folder_source_follows_links_on_disk(tmp_path: Path, cache: Cache, sdk: Sdk) -> None:
    libs = stub_trio(tmp_path / "real")
    folder = tmp_path / "given"
    folder.mkdir()
    for soname in TRIO:
        (folder / soname).symlink_to(tmp_path / "real" / soname)
    (folder / "README").write_text("not a library")
    result = stage_runtime(cache, sdk, RuntimeRequest(sources=(folder,), force=True, use_apt=False),
                           os.environ)
    assert result.libcxx is not None
    assert result.libcxx.name.startswith("libcxx-local-")
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == libs
    assert not (result.libcxx.lib_dir / "README").exists()
    assert len(manifest_of(result.libcxx.root)["sources"]) == 3  # type: ignore[arg-type]
    assert staged_lib_dirs(cache, sdk) == [result.libcxx.lib_dir]
    # An SDK that ships the trio itself (releases before 2.23) needs no staged copy.
    for soname in TRIO:
        shutil.copy(folder / soname, sdk.lib_dir / soname)
    assert staged_lib_dirs(cache, sdk) == []
    # Unless the loader passes one of its own over (a library of another machine, AArch64):
    # the staged trio is then what the SDK's libraries load.
    (sdk.lib_dir / TRIO[1]).write_bytes(for_another_machine((sdk.lib_dir / TRIO[1]).read_bytes()))
    assert staged_lib_dirs(cache, sdk) == [result.libcxx.lib_dir]
    assert missing_host_libraries(TRIO, [sdk.lib_dir, *staged_lib_dirs(cache, sdk)]) == []
    # A file that is no ELF the loader stops at, and fails on: a staged trio after it changes nothing.
    (sdk.lib_dir / TRIO[1]).write_bytes(b"INPUT(libc++.so.1.0)\n")
    assert staged_lib_dirs(cache, sdk) == []


def test_a_partial_trio_is_refused(tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    stub_trio(tmp_path / "real")
    folder = tmp_path / "given"
    folder.mkdir()
    shutil.copy(tmp_path / "real" / "libc++.so.1", folder / "libc++.so.1")
    with pytest.raises(UsageError, match=r"not libc\+\+abi\.so\.1, libunwind\.so\.1"):
        stage_runtime(cache, None, RuntimeRequest(sources=(folder,), force=True, use_apt=False), os.environ)
    nothing_staged(cache_dir)


def test_a_partial_trio_is_refused_with_what_to_give(tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    libs = stub_trio(tmp_path / "real")
    folder = tmp_path / "given"
    folder.mkdir()
    for soname in (TRIO[0], TRIO[2]):
        (folder / soname).write_bytes(libs[soname])
    with pytest.raises(UsageError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(folder,), force=True, use_apt=False), os.environ)
    assert caught.value.message == ("the files given with --runtime-from hold libc++.so.1, libunwind.so.1 "
                                    "but not libc++abi.so.1")
    assert caught.value.hint == "give all three libraries (from one LLVM release) or none of them"
    nothing_staged(cache_dir)


def test_an_llvm_archive_without_the_whole_trio_is_refused(server: FaultServer, tmp_path: Path, cache: Cache,
                                                           cache_dir: Path) -> None:
    """Vouched for by its sha256, and sound, but not the release it should be: it lacks libunwind."""
    libs = stub_trio(tmp_path / "stubs")
    data, _ = llvm_archive(tmp_path, big=1 << 10, libs={n: libs[n] for n in TRIO[:2]})
    url = server.add("/llvm.tar.xz", data, "application/x-xz")
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(data))
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, request, os.environ)
    assert caught.value.message == f"{url} does not hold libunwind.so.1"
    assert caught.value.hint == "check QNNCTL_LLVM_URL; it must be the LLVM 14 release archive for Linux x86_64"
    nothing_staged(cache_dir)
    # Each library it lacks is named, in the trio's order.
    data, _ = llvm_archive(tmp_path, big=1 << 10, libs={TRIO[0]: libs[TRIO[0]]})
    url = server.add("/llvm-libcxx-only.tar.xz", data, "application/x-xz")
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(data))
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, request, os.environ)
    assert caught.value.message == f"{url} does not hold libc++abi.so.1, libunwind.so.1"
    nothing_staged(cache_dir)


def test_staged_runtime_is_reused(tmp_path: Path, cache: Cache, sdk: Sdk) -> None:
    libs = stub_trio(tmp_path / "real")
    folder = tmp_path / "given"
    folder.mkdir()
    for soname in TRIO:
        (folder / soname).write_bytes(libs[soname])
    first = stage_runtime(cache, sdk, RuntimeRequest(sources=(folder,), force=True, use_apt=False),
                          os.environ)
    assert first.libcxx_action == "staged"
    again = stage_runtime(cache, sdk, RuntimeRequest(sources=(folder,)), os.environ)
    expected = "host" if host_has_trio() else "reused"
    assert again.libcxx_action == expected
    assert [p.name for p in cache.runtime.iterdir()] == [first.libcxx.name]  # type: ignore[union-attr]


# -- every file given is used, or said why not -------------------------------------------


def unused_warnings(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """source -> reason, from the warnings about --runtime-from files that were not used."""
    said = {}
    for record in caplog.records:
        source, sep, reason = record.getMessage().partition(" is not used: ")
        if record.levelname == "WARNING" and sep and source.startswith("--runtime-from "):
            said[source.removeprefix("--runtime-from ")] = reason
    return said


def test_files_given_when_nothing_is_to_be_staged_are_named_with_the_reason(
        tmp_path: Path, cache: Cache, sdk: Sdk, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "trio"
    stub_trio(folder)
    first = stage_runtime(cache, sdk, RuntimeRequest(sources=(folder,), force=True, use_apt=False), os.environ)
    assert first.libcxx is not None
    assert unused_warnings(caplog) == {}  # it was used
    other = tmp_path / "other-trio"
    stub_trio(other)
    caplog.clear()
    again = stage_runtime(cache, sdk, RuntimeRequest(sources=(other,)), os.environ)
    assert again.libcxx_action in ("reused", "host")
    (reason,) = unused_warnings(caplog).values()
    assert list(unused_warnings(caplog)) == [str(other)]
    if again.libcxx_action == "reused":
        assert f"already staged in {first.libcxx.lib_dir} (--force stages it again)" in reason
    assert "glibc" in reason  # nor a glibc, which this host does not need
    assert [p.name for p in cache.runtime.iterdir()] == [first.libcxx.name]


def test_install_runtime_force_stages_again_as_the_reasons_say(tmp_path: Path, cache_dir: Path,
                                                                mirror: FaultServer) -> None:
    """A trio already staged: the file given is not used, "(--force stages it again)"; with
    `install --runtime --force` it is, as that reason and the lock's hint
    (`qnnctl install --runtime --force --runtime-from FILE`) tell the user."""
    first, second = tmp_path / "first", tmp_path / "second"
    stub_trio(first)
    libs = marked_trio_of(second, 666)
    assert run_qnnctl("install", VERSION, "--runtime", "--runtime-from", str(first)).returncode == 0
    again = run_qnnctl("install", VERSION, "--runtime", "--runtime-from", str(second))
    assert again.returncode == 0, again.stderr
    assert "(--force stages it again)" in again.stderr
    forced = run_qnnctl("install", VERSION, "--runtime", "--force", "--runtime-from", str(second))
    assert forced.returncode == 0, forced.stderr
    assert "is not used" not in forced.stderr
    staged = current(Cache(cache_dir), LIBCXX)  # the newest stage, which the SDK's libraries load
    assert staged is not None
    assert {n: (staged.lib_dir / n).read_bytes() for n in TRIO} == libs


def marked_trio_of(folder: Path, mark: int) -> dict[str, bytes]:
    """The trio's sonames, with bytes of their own (`mark`), unlike stub_trio's."""
    built = {}
    for soname in TRIO:
        stem = soname.split(".")[0].replace("+", "x")
        built[soname] = compile_shared(folder / soname, f"int {stem}_mark(void) {{ return {mark}; }}\n",
                                       extra=[f"-Wl,-soname,{soname}"]).read_bytes()
    return built


def test_a_file_that_is_no_package_is_refused_even_when_nothing_is_to_be_staged(
        tmp_path: Path, cache: Cache, cache_dir: Path, sdk: Sdk) -> None:
    junk = tmp_path / "random.bin"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(UsageError, match=rf"--runtime-from {junk}: not a \.deb, \.rpm or tar archive"):
        stage_runtime(cache, sdk, RuntimeRequest(sources=(junk,), force=True, use_apt=False), os.environ)
    nothing_staged(cache_dir)
    trio = tmp_path / "trio"
    stub_trio(trio)
    stage_runtime(cache, sdk, RuntimeRequest(sources=(trio,), force=True, use_apt=False), os.environ)
    # Once a trio is staged, nothing is left to stage: refused all the same.
    with pytest.raises(UsageError, match=r"random\.bin: not a"):
        stage_runtime(cache, sdk, RuntimeRequest(sources=(junk,)), os.environ)
    proc = run_qnnctl("install", VERSION, "--runtime-from", str(junk))
    assert proc.returncode == 2, proc.stderr
    assert f"--runtime-from {junk}: not a .deb, .rpm or tar archive" in proc.stderr


def trio_debs(folder: Path) -> list[Path]:
    """Three .debs that hold the trio, one library each, as `apt-get download` leaves them."""
    libs = stub_trio(folder / "built")
    folder.mkdir(parents=True, exist_ok=True)
    return [build_deb(folder / f"{package}_1.0_amd64.deb", package, "1.0",
                      [Entry(f"./usr/lib/x86_64-linux-gnu/{soname}", libs[soname])])
            for package, soname in zip(("test-libcxx", "test-libcxxabi", "test-libunwind"), TRIO)]


def test_what_is_given_is_checked_and_a_folder_read_for_its_packages_and_libraries(tmp_path: Path) -> None:
    """check_sources, in the tests' own process: each path once, a folder's packages (by name, files
    only) in its place, then the folder itself for its bare libraries."""
    debs = trio_debs(tmp_path / "given")
    given = tmp_path / "given"
    (given / "notes.deb").mkdir()  # named as a package, but a folder
    shutil.copy(debs[0], given / "zz.tar.xz")  # a package by its name; what it holds is read later
    stub_trio(tmp_path / "stubs")
    shutil.copy(tmp_path / "stubs" / TRIO[0], given / TRIO[0])
    assert check_sources([debs[1], given, debs[1]]) == (
        debs[1], *(deb for deb in sorted(debs) if deb != debs[1]), given / "zz.tar.xz", given)
    only_packages = tmp_path / "packages"
    only_packages.mkdir()
    shutil.copy(debs[0], only_packages / debs[0].name)
    assert check_sources([only_packages]) == (only_packages / debs[0].name,)
    empty = tmp_path / "empty"
    (empty / "lib.so.d").mkdir(parents=True)  # named as a library, but a folder
    with pytest.raises(UsageError) as caught:
        check_sources([empty])
    assert caught.value.message == (f"--runtime-from {empty}: the folder holds no package (.deb, .rpm, .tar.xz) "
                                    "and none of libc++.so.1, libc++abi.so.1, libunwind.so.1, nor a glibc")
    assert caught.value.hint == "give the folder that holds the packages or the libraries, or the files themselves"
    with pytest.raises(UsageError) as missing:
        check_sources([tmp_path / "nowhere.deb"])
    assert missing.value.message == f"--runtime-from {tmp_path / 'nowhere.deb'}: no such file or folder"
    # A path as a user writes it: ~ expanded, a link followed to the file it names.
    home_deb = Path(os.environ["HOME"]) / "Downloads" / debs[0].name
    home_deb.parent.mkdir(parents=True)
    shutil.copy(debs[0], home_deb)
    (tmp_path / "link.deb").symlink_to(home_deb)
    assert check_sources([Path("~/Downloads") / debs[0].name, tmp_path / "link.deb"]) == (home_deb,)
    listening = socket.socket(socket.AF_UNIX)
    try:
        listening.bind(str(tmp_path / "a.sock"))
        with pytest.raises(UsageError) as unreadable:
            check_sources([tmp_path / "a.sock"])
    finally:
        listening.close()
    assert unreadable.value.message == (f"--runtime-from {tmp_path / 'a.sock'}: cannot read it "
                                        "(No such device or address)")
    notes = tmp_path / "notes.txt"
    notes.write_text("no package\n")
    with pytest.raises(UsageError) as no_package:
        check_sources([notes])
    assert no_package.value.message == f"--runtime-from {notes}: not a .deb, .rpm or tar archive"
    assert no_package.value.hint == "give a package file (.deb, .rpm, .tar.xz) or a folder holding the libraries"


def test_a_folder_of_debs_stages_from_its_debs(tmp_path: Path, cache: Cache, cache_dir: Path, sdk: Sdk) -> None:
    """The README's `--runtime-from ~/Downloads/libcxx-debs/`: a folder is read for the packages it holds."""
    debs = trio_debs(tmp_path / "libcxx-debs")
    result = stage_runtime(cache, sdk, RuntimeRequest(sources=(tmp_path / "libcxx-debs",), force=True, use_apt=False),
                           os.environ)
    assert result.libcxx is not None
    sources = manifest_of(result.libcxx.root)["sources"]
    assert isinstance(sources, list)
    assert sorted(s["source"] for s in sources) == sorted(str(d) for d in debs)
    assert sorted(p.name for p in result.libcxx.lib_dir.iterdir()) == sorted(TRIO)


def test_a_folder_with_nothing_of_use_is_refused_before_anything_is_fetched(
        tmp_path: Path, cache_dir: Path, mirror: FaultServer) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("nothing here\n")
    proc = run_qnnctl("install", VERSION, "--runtime-from", str(empty))
    assert proc.returncode == 2, proc.stderr
    assert f"--runtime-from {empty}: the folder holds no package" in proc.stderr
    assert mirror.requests == []


def test_a_bad_runtime_from_is_refused_before_the_sdk_is_fetched(tmp_path: Path, cache_dir: Path,
                                                                 mirror: FaultServer) -> None:
    """Not after a 1-2 GB download: every argument is checked before any byte is fetched."""
    tiny = tmp_path / "tiny.py"
    tiny.write_text("print('hello')\n")
    proc = run_qnnctl("install", VERSION, "--runtime-from", str(tiny))
    assert proc.returncode == 2, proc.stderr
    assert f"--runtime-from {tiny}: not a .deb, .rpm or tar archive" in proc.stderr
    assert mirror.requests == []
    assert not (cache_dir / "sdks").exists()
    proc = run_qnnctl("install", VERSION, "--runtime-from", str(tmp_path / "missing.deb"))
    assert proc.returncode == 2, proc.stderr
    assert "no such file or folder" in proc.stderr
    assert mirror.requests == []


def test_a_package_holding_nothing_of_use_is_refused(tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    trio = tmp_path / "trio"
    stub_trio(trio)
    unrelated = build_deb(tmp_path / "hello_1.0_amd64.deb", "hello", "1.0",
                          [Entry("./usr/bin/hello", b"#!/bin/sh\n", mode=0o755)])
    with pytest.raises(UsageError, match=r"hello_1\.0_amd64\.deb holds none of libc\+\+\.so\.1"):
        stage_runtime(cache, None, RuntimeRequest(sources=(trio, unrelated), force=True, use_apt=False),
                      os.environ)
    nothing_staged(cache_dir)


def test_a_second_trio_is_named_as_not_used(tmp_path: Path, cache: Cache, caplog: pytest.LogCaptureFixture) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    stub_trio(first)
    stub_trio(second)
    result = stage_runtime(cache, None, RuntimeRequest(sources=(first, second), force=True, use_apt=False),
                           os.environ)
    assert result.libcxx is not None
    (source, reason), = unused_warnings(caplog).items()
    assert source == str(second)
    assert reason.startswith(f"the libc++ trio came from {first}/")


def host_glibc_reason() -> str:
    host = ".".join(str(part) for part in host_glibc() or ())
    return (f"this host's glibc {host} covers what the SDK needs, so no glibc is staged "
            "(--force stages one all the same)")


def test_a_file_not_used_is_told_why_in_full(tmp_path: Path, cache: Cache, sdk: Sdk,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Each reason whole: what the user reads to decide whether --force is what they meant."""
    needs_host_without_trio()
    stub_trio(tmp_path / "first")
    first = stage_runtime(cache, sdk, RuntimeRequest(sources=(tmp_path / "first",), force=True, use_apt=False),
                          os.environ)
    assert first.libcxx is not None
    other = tmp_path / "other"
    stub_trio(other)
    caplog.clear()
    kept = stage_runtime(cache, sdk, RuntimeRequest(sources=(other,)), os.environ)
    assert kept == RuntimeResult(first.libcxx, "reused", None, "not-needed")
    assert unused_warnings(caplog) == {str(other): f"the libc++ trio is already staged in {first.libcxx.lib_dir} "
                                                   f"(--force stages it again), and {host_glibc_reason()}"}
    # An SDK that ships the trio needs none staged, whatever the cache holds (a glibc too, not needed).
    stage_runtime(cache, sdk, RuntimeRequest(sources=(fake_glibc(tmp_path / "glibc", "2.99"),), force=True,
                                             use_apt=False), os.environ)
    assert current(cache, GLIBC) is not None
    for soname in TRIO:
        shutil.copy(other / soname, sdk.lib_dir / soname)
    caplog.clear()
    assert stage_runtime(cache, sdk, RuntimeRequest(sources=(other,)), os.environ) == RuntimeResult(
        None, "host", None, "not-needed")
    assert unused_warnings(caplog) == {
        str(other): "this host (or the SDK) has libc++.so.1, libc++abi.so.1, libunwind.so.1 (--force stages them "
                    f"all the same), and {host_glibc_reason()}"}


def test_what_stage_runtime_says_of_the_trio_it_did_not_stage(tmp_path: Path, cache: Cache, sdk: Sdk) -> None:
    """The host's (here the SDK's own) with nothing staged; the one staged before, kept when --force
    is given a glibc alone."""
    needs_host_without_trio()
    assert stage_runtime(cache, None, RuntimeRequest(sources=(fake_glibc(tmp_path / "glibc", "2.99"),), force=True,
                                                     use_apt=False), os.environ).libcxx_action == "missing"
    stub_trio(tmp_path / "trio")
    first = stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "trio",), force=True, use_apt=False),
                          os.environ)
    assert first.libcxx is not None
    kept = stage_runtime(cache, None, RuntimeRequest(sources=(fake_glibc(tmp_path / "glibc2", "2.99"),), force=True,
                                                     use_apt=False), os.environ)
    assert (kept.libcxx, kept.libcxx_action, kept.glibc_action) == (first.libcxx, "reused", "staged")
    shutil.rmtree(cache.runtime)
    for soname in TRIO:
        shutil.copy(tmp_path / "trio" / soname, sdk.lib_dir / soname)
    assert stage_runtime(cache, sdk, RuntimeRequest(), os.environ) == RuntimeResult(None, "host", None, "not-needed")


def fake_glibc(folder: Path, version: str) -> Path:
    """A folder holding a loader and a libc.so.6 that defines GLIBC_`version` (real ELF libraries,
    never loaded: the version is read from the libc's version definitions)."""
    folder.mkdir(parents=True)
    script = folder.parent / f"{folder.name}.map"
    script.write_text(f"GLIBC_{version} {{ global: qnn_new_symbol; local: *; }};\n")
    compile_shared(folder / "libc.so.6", "int qnn_new_symbol(void) { return 1; }\n",
                   extra=["-Wl,-soname,libc.so.6", f"-Wl,--version-script={script}"])
    compile_shared(folder / LOADER, "int qnn_loader(void) { return 2; }\n", extra=[f"-Wl,-soname,{LOADER}"])
    return folder


def test_a_glibc_given_when_one_is_staged_is_told_why_in_full(
        tmp_path: Path, cache: Cache, new_glibc_sdk: Sdk, caplog: pytest.LogCaptureFixture) -> None:
    stub_trio(tmp_path / "trio")
    first = stage_runtime(cache, new_glibc_sdk, RuntimeRequest(sources=(tmp_path / "trio", fake_glibc(
        tmp_path / "glibc", "2.99")), use_apt=False), os.environ)
    assert (first.libcxx_action, first.glibc_action) == ("staged", "staged")
    assert first.glibc is not None
    assert first.glibc.name == "glibc-2.99-local"
    other = fake_glibc(tmp_path / "other", "2.99")
    caplog.clear()
    caplog.set_level("INFO", logger="qnnctl")
    again = stage_runtime(cache, new_glibc_sdk, RuntimeRequest(sources=(other,)), os.environ)
    assert (again.libcxx_action, again.glibc_action) == ("reused", "reused")
    assert again.glibc == first.glibc  # the one staged before, which the loader is started with
    assert f"glibc 2.99 already staged in {first.glibc.lib_dir}" in caplog.messages
    assert unused_warnings(caplog) == {
        str(other): f"the libc++ trio is already staged in {first.libcxx.lib_dir} (--force stages it again), and "  # type: ignore[union-attr]
                    "glibc 2.99 is already staged, and covers what the SDK needs (--force stages it again)"}


def test_a_folder_of_both_kinds_not_used_is_told_where_each_came_from(
        tmp_path: Path, cache: Cache, caplog: pytest.LogCaptureFixture) -> None:
    trio, glibc, both = tmp_path / "trio", fake_glibc(tmp_path / "glibc", "2.99"), tmp_path / "both"
    stub_trio(trio)
    stub_trio(both)
    for name in (LOADER, "libc.so.6"):
        shutil.copy(glibc / name, both / name)
    result = stage_runtime(cache, None, RuntimeRequest(sources=(trio, glibc, both), force=True, use_apt=False),
                           os.environ)
    assert (result.libcxx_action, result.glibc_action) == ("staged", "staged")
    assert result.libcxx is not None
    assert result.glibc is not None  # each records the sources it came from, and those alone
    assert [r["source"] for r in manifest_of(result.libcxx.root)["sources"]] == [  # type: ignore[attr-defined]
        str(trio / n) for n in sorted(TRIO)]
    assert [r["source"] for r in manifest_of(result.glibc.root)["sources"]] == [  # type: ignore[attr-defined]
        str(glibc / n) for n in sorted((LOADER, "libc.so.6"))]
    from_trio = ", ".join(str(trio / n) for n in sorted(TRIO))
    from_glibc = ", ".join(str(glibc / n) for n in sorted((LOADER, "libc.so.6")))
    assert unused_warnings(caplog) == {
        str(both): f"the libc++ trio came from {from_trio}, and the glibc came from {from_glibc}"}


def test_a_trio_given_when_only_a_glibc_is_to_be_staged_is_told_why(
        tmp_path: Path, cache: Cache, new_glibc_sdk: Sdk, caplog: pytest.LogCaptureFixture) -> None:
    """The SDK needs a newer glibc and its trio is had already: the glibc given is staged, the trio
    given beside it is not, and the user is told why, as when nothing is staged."""
    stub_trio(tmp_path / "trio")
    first = stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "trio",), force=True, use_apt=False),
                          os.environ)
    assert first.libcxx is not None
    other, glibc = tmp_path / "other", fake_glibc(tmp_path / "glibc", "2.99")
    stub_trio(other)
    caplog.clear()
    result = stage_runtime(cache, new_glibc_sdk, RuntimeRequest(sources=(other, glibc)), os.environ)
    assert result.glibc_action == "staged"
    assert result.glibc is not None
    assert [r["source"] for r in result.glibc.manifest["sources"]] == [
        str(glibc / n) for n in sorted((LOADER, "libc.so.6"))]
    host_has = ("this host (or the SDK) has libc++.so.1, libc++abi.so.1, libunwind.so.1 "
                "(--force stages them all the same)")
    if host_has_trio():
        assert (result.libcxx, result.libcxx_action) == (None, "host")
        assert unused_warnings(caplog) == {str(other): host_has}
    else:
        assert (result.libcxx, result.libcxx_action) == (first.libcxx, "reused")
        assert unused_warnings(caplog) == {
            str(other): f"the libc++ trio is already staged in {first.libcxx.lib_dir} (--force stages it again)"}
    assert sorted(p.name for p in cache.runtime.iterdir()) == sorted((first.libcxx.name, result.glibc.name))
    # Nothing staged, and an SDK that ships the trio itself: the trio given is not needed.
    shutil.rmtree(cache.runtime)
    for soname in TRIO:
        shutil.copy(other / soname, new_glibc_sdk.lib_dir / soname)
    caplog.clear()
    result = stage_runtime(cache, new_glibc_sdk, RuntimeRequest(sources=(other, glibc)), os.environ)
    assert (result.libcxx, result.libcxx_action, result.glibc_action) == (None, "host", "staged")
    assert unused_warnings(caplog) == {str(other): host_has}
    assert [p.name for p in cache.runtime.iterdir()] == [result.glibc.name]  # type: ignore[union-attr]


def test_a_glibc_given_when_only_the_trio_is_to_be_staged_is_told_why(
        tmp_path: Path, cache: Cache, new_glibc_sdk: Sdk, caplog: pytest.LogCaptureFixture) -> None:
    """A glibc that covers what the SDK needs is staged and the trio is missing: the trio given is
    staged, the glibc given beside it is not, and the user is told why."""
    needs_host_without_trio()
    first = stage_runtime(cache, new_glibc_sdk, RuntimeRequest(sources=(fake_glibc(tmp_path / "glibc", "2.99"),)),
                          os.environ)
    assert (first.libcxx_action, first.glibc_action) == ("missing", "staged")
    stub_trio(tmp_path / "trio")
    other = fake_glibc(tmp_path / "other", "2.99")
    caplog.clear()
    result = stage_runtime(cache, new_glibc_sdk, RuntimeRequest(sources=(tmp_path / "trio", other)), os.environ)
    assert (result.libcxx_action, result.glibc, result.glibc_action) == ("staged", first.glibc, "reused")
    assert unused_warnings(caplog) == {
        str(other): "glibc 2.99 is already staged, and covers what the SDK needs (--force stages it again)"}


def test_only_a_loader_with_a_libc_is_a_glibc(tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    """A package with a libc.so.6 but no loader (or a loader but no libc) holds no glibc: given with
    the trio, it holds nothing of use, and is refused."""
    stub_trio(tmp_path / "trio")
    glibc = fake_glibc(tmp_path / "glibc", "2.99")
    for name, other in ((LOADER, "libc.so.6"), ("libc.so.6", LOADER)):
        package = build_deb(tmp_path / f"only-{name}_1.0_amd64.deb", "only", "1.0",
                            [Entry(f"./usr/lib/x86_64-linux-gnu/{name}", (glibc / name).read_bytes())])
        with pytest.raises(UsageError) as caught:
            stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "trio", package), force=True, use_apt=False),
                          os.environ)
        assert caught.value.message == (f"--runtime-from {package} holds none of libc++.so.1, libc++abi.so.1, "
                                        f"libunwind.so.1, and no glibc ({LOADER} with libc.so.6) (libraries of "
                                        "another class or machine than the SDK's do not count)"), other
        assert caught.value.hint == ("give the packages, the LLVM 14 archive or a folder that hold them; "
                                     "nothing was staged")
        nothing_staged(cache_dir)


def test_a_glibc_behind_links_is_found_past_links_of_its_names_elsewhere(tmp_path: Path, cache: Cache) -> None:
    """A tree of a whole system, say: its loader and libc are links in lib64/ (as EL8 lays them out), and
    a cross toolchain's links of the same names, in folders no glibc is taken from, come before them."""
    glibc = fake_glibc(tmp_path / "glibc", "2.99")
    archive = tmp_path / "sysroot.tar.xz"
    archive.write_bytes(tar_bytes([
        Entry(f"./usr/x86_64-linux-gnu/lib64/{LOADER}", target=f"../lib/{LOADER}"),
        Entry("./usr/x86_64-linux-gnu/lib64/libc.so.6", target="../lib/libc.so.6"),
        Entry("./usr/lib64/ld-2.99.so", (glibc / LOADER).read_bytes(), mode=0o755),
        Entry("./usr/lib64/libc-2.99.so", (glibc / "libc.so.6").read_bytes(), mode=0o755),
        Entry(f"./usr/lib64/{LOADER}", target="ld-2.99.so"),
        Entry("./usr/lib64/libc.so.6", target="libc-2.99.so"),
    ]))
    result = stage_runtime(cache, None, RuntimeRequest(sources=(archive,), force=True, use_apt=False), os.environ)
    assert result.glibc is not None
    assert result.glibc.name == "glibc-2.99-local"
    assert {name: (result.glibc.root / name).read_bytes() for name in result.glibc.manifest["files"]} == {
        f"lib/{LOADER}": (glibc / LOADER).read_bytes(), "lib/libc.so.6": (glibc / "libc.so.6").read_bytes()}


def _of_class(elf: bytes, bits: int = 32, machine: int = 3) -> bytes:
    """`elf` with the header of another class and machine (ELFCLASS32, i386 by default): what the
    loader reads to pass a library over."""
    return elf[:4] + bytes([1 if bits == 32 else 2]) + elf[5:18] + machine.to_bytes(2, "little") + elf[20:]


@pytest.mark.parametrize("foreign_in", ["usr/lib", "lib64"], ids=["multilib-usr-lib", "a-folder-looked-in-first"])
def test_a_glibc_of_another_class_is_passed_over_as_the_loader_passes_it(tmp_path: Path, cache: Cache,
                                                                       foreign_in: str) -> None:
    """A multilib tree: a 32-bit libc comes first in the archive, the x86-64 one after it. A libc
    of another class or machine than the loader's is passed over, as the loader passes it over:
    the x86-64 libc is staged, beside the x86-64 loader, never the other."""
    glibc = fake_glibc(tmp_path / "glibc", "2.99")
    libc = (glibc / "libc.so.6").read_bytes()
    archive = tmp_path / "sysroot.tar.xz"
    archive.write_bytes(tar_bytes([
        Entry(f"./{foreign_in}/libc.so.6", _of_class(libc), mode=0o755),
        Entry(f"./{foreign_in}/libm.so.6", _of_class(libc), mode=0o755),  # a 32-bit library alone
        Entry(f"./usr/lib64/{LOADER}", (glibc / LOADER).read_bytes(), mode=0o755),
        Entry("./usr/lib64/libc.so.6", libc, mode=0o755),
    ]))
    result = stage_runtime(cache, None, RuntimeRequest(sources=(archive,), force=True, use_apt=False), os.environ)
    assert result.glibc is not None
    assert result.glibc.name == "glibc-2.99-local"
    assert {name: (result.glibc.root / name).read_bytes() for name in result.glibc.manifest["files"]} == {
        f"lib/{LOADER}": (glibc / LOADER).read_bytes(), "lib/libc.so.6": libc}


def test_a_trio_of_another_machine_is_no_trio(tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    """An i386 package's libc++ (ELFCLASS32, EM_386) is no library the SDK's can load: a source that
    holds only that holds none of the trio, and says why."""
    given = tmp_path / "i386"
    for soname, data in stub_trio(tmp_path / "stubs").items():
        given.mkdir(exist_ok=True)
        (given / soname).write_bytes(_of_class(data))
    with pytest.raises(UsageError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(given,), force=True, use_apt=False), os.environ)
    assert caught.value.message.startswith(f"--runtime-from {given} holds none of libc++.so.1, ")
    assert caught.value.message.endswith("(libraries of another class or machine than the SDK's do not count)")
    nothing_staged(cache_dir)


def test_a_folder_is_read_past_what_it_holds_of_no_use(tmp_path: Path, cache: Cache) -> None:
    """Notes, folders named as libraries and links to nothing are passed over, not the end of the folder."""
    given = tmp_path / "given"
    libs = stub_trio(given)
    (given / "A-README").write_text("notes\n")  # sorted first, and no library
    (given / "aaa.so").mkdir()  # named as a library, but a folder
    (given / "libc++.so.0").symlink_to(given / "gone")  # a link to nothing, before the trio
    result = stage_runtime(cache, None, RuntimeRequest(sources=(given,), force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == libs
    assert sorted(record["source"] for record in manifest_of(result.libcxx.root)["sources"]) == sorted(  # type: ignore[attr-defined]
        str(given / n) for n in TRIO)


def trio_tar_file(path: Path, libs: dict[str, bytes], compress: Any = lzma.compress) -> Path:
    """The trio in a tar laid out as LLVM's release archive is, compressed by `compress`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tf:
        for soname, data in libs.items():
            info = tarfile.TarInfo(f"{LLVM_TOP}/lib/{soname}")
            info.size = len(data)
            info.mode = 0o755
            tf.addfile(info, io.BytesIO(data))
    path.write_bytes(compress(buffer.getvalue()))
    return path


def test_what_a_file_given_is_recorded_as_is_its_bytes_and_its_package(tmp_path: Path, cache: Cache) -> None:
    libs = stub_trio(tmp_path / "stubs")
    archive = trio_tar_file(tmp_path / "trio.tar.xz", libs)
    result = stage_runtime(cache, None, RuntimeRequest(sources=(archive,), force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    assert result.libcxx.name == "libcxx-14.0.0"  # the LLVM release its top folder names
    assert manifest_of(result.libcxx.root)["sources"] == [
        {"source": str(archive), "sha256": sha256_of(archive.read_bytes()), "size": archive.stat().st_size}]
    debs = trio_debs(tmp_path / "debs")
    result = stage_runtime(cache, None, RuntimeRequest(sources=tuple(debs), force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    assert manifest_of(result.libcxx.root)["sources"] == [
        {"source": str(deb), "sha256": sha256_of(deb.read_bytes()), "size": deb.stat().st_size,
         "package": package, "version": "1.0", "architecture": "amd64"}
        for deb, package in zip(debs, ("test-libcxx", "test-libcxxabi", "test-libunwind"))]
    result = stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "stubs",), force=True, use_apt=False),
                           os.environ)
    assert result.libcxx is not None
    assert manifest_of(result.libcxx.root)["sources"] == [
        {"source": str(tmp_path / "stubs" / soname), "sha256": sha256_of(data), "size": len(data)}
        for soname, data in sorted(libs.items())]
    rpm = build_rpm(tmp_path / "trio.rpm", "libcxx-trio", "14.0.6", "3.el9", cpio_newc(cpio_entries(
        [Entry(f"./usr/lib64/{soname}", data, mode=0o755) for soname, data in libs.items()])))
    result = stage_runtime(cache, None, RuntimeRequest(sources=(rpm,), force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    assert result.libcxx.name == "libcxx-14.0.6-3.el9"
    assert manifest_of(result.libcxx.root)["sources"] == [
        {"source": str(rpm), "sha256": sha256_of(rpm.read_bytes()), "size": rpm.stat().st_size,
         "package": "libcxx-trio", "version": "14.0.6-3.el9", "architecture": "x86_64"}]


BOUNDED_CHILD = """
import os, resource, sys
from pathlib import Path
from qnnctl.sdk.cache import Cache
from qnnctl.host.runtime import RuntimeRequest, stage_runtime
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))
request = RuntimeRequest(sources=(Path(sys.argv[1]),), force=True, use_apt=False)
print(stage_runtime(Cache.from_env(os.environ), None, request, os.environ).libcxx.root)
"""


def test_an_archive_given_is_read_in_blocks_however_big(tmp_path: Path, cache_dir: Path) -> None:
    """A tar with 512 MiB of other members (a hole on disk) stages its trio in a process that may
    map 256 MiB and write files of 4 MiB at most: nothing reads the file whole, not even to tell
    what kind of file it is, and nothing but the libraries wanted is written."""
    libs = stub_trio(tmp_path / "stubs")
    archive = tmp_path / "trio.tar"
    big = tarfile.TarInfo(f"{LLVM_TOP}/lib/libclang-cpp.so.14")
    big.size = 512 << 20
    with open(archive, "wb") as handle:
        for soname, data in libs.items():  # each member: its header, its data padded to a block
            info = tarfile.TarInfo(f"{LLVM_TOP}/lib/{soname}")
            info.size = len(data)
            handle.write(info.tobuf() + data + bytes(-len(data) % 512))
        handle.write(big.tobuf())
        handle.truncate(handle.tell() + big.size + 1024)  # the member's zeros, then the two end blocks
    with tarfile.open(archive) as read_back:
        assert read_back.getnames()[-1] == big.name
    proc = subprocess.run([sys.executable, "-c", BOUNDED_CHILD, str(archive), str(256 << 20)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    root = Path(proc.stdout.strip())
    assert root == cache_dir / "runtime" / "libcxx-14.0.0"
    assert {n: (root / "lib" / n).read_bytes() for n in TRIO} == libs


def test_a_debian_version_is_named_without_its_epoch_alone(tmp_path: Path, cache: Cache) -> None:
    """Only the epoch goes: an upstream version may hold colons of its own (Debian policy, where an
    epoch is given)."""
    libs = stub_trio(tmp_path / "stubs")
    deb = build_deb(tmp_path / "libcxx.deb", TRIO_DEBS[0], "1:14.0.6:git2-1",
                    [Entry(f"./usr/lib/x86_64-linux-gnu/{soname}", data) for soname, data in libs.items()])
    result = stage_runtime(cache, None, RuntimeRequest(sources=(deb,), force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    assert result.libcxx.name == "libcxx-14.0.6_git2-1"


def test_a_deb_whose_bzip2_data_is_damaged_is_named_as_the_file_given(tmp_path: Path, cache: Cache,
                                                                      cache_dir: Path) -> None:
    libs = stub_trio(tmp_path / "stubs")
    deb = build_deb(tmp_path / "trio_1.0_amd64.deb", "trio", "1.0",
                    [Entry(f"./usr/lib/x86_64-linux-gnu/{soname}", data) for soname, data in libs.items()], "bz2")
    data = bytearray(deb.read_bytes())
    middle = len(data) * 3 // 4  # in data.tar.bz2, the last member
    data[middle:middle + 32] = bytes(b ^ 0x5A for b in data[middle:middle + 32])
    deb.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(deb,), force=True, use_apt=False), os.environ)
    assert caught.value.message.startswith("trio_1.0_amd64.deb is corrupt or truncated: "), caught.value.message
    nothing_staged(cache_dir)


def test_the_trio_is_named_by_the_version_of_its_libcxx_package(tmp_path: Path, cache: Cache) -> None:
    """Given as three packages, whatever their order: the version of libc++1-14's."""
    libs = stub_trio(tmp_path / "stubs")
    debs = [build_deb(tmp_path / f"{package}.deb", package, version,
                      [Entry(f"./usr/lib/x86_64-linux-gnu/{soname}", libs[soname])])
            for package, version, soname in (("libc++abi1-14", "1:14.0.6-99", TRIO[1]),
                                             ("libc++1-14", "1:14.0.6-7", TRIO[0]),
                                             ("libunwind-14", "1:14.0.6-99", TRIO[2]))]
    result = stage_runtime(cache, None, RuntimeRequest(sources=tuple(debs), force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    assert result.libcxx.name == "libcxx-14.0.6-7"


def test_an_rpm_whose_header_is_damaged_is_named_as_the_file_given(tmp_path: Path, cache: Cache,
                                                                   cache_dir: Path) -> None:
    rpm = build_rpm(tmp_path / "trio.rpm", "libcxx-trio", "14.0.6", "1", cpio_newc(cpio_entries([])))
    data = bytearray(rpm.read_bytes())
    data[96:100] = b"\x00\x00\x00\x00"  # the signature header's magic, after the 96-byte lead
    rpm.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(rpm,), force=True, use_apt=False), os.environ)
    assert caught.value.message == "trio.rpm is corrupt or truncated: bad RPM header magic"
    nothing_staged(cache_dir)


def test_an_archive_given_that_holds_nothing_of_use_is_named(tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    stub_trio(tmp_path / "trio")
    unrelated = tmp_path / "docs.tar.xz"
    unrelated.write_bytes(lzma.compress(tar_bytes_of({"share/doc/README": b"nothing\n"})))
    with pytest.raises(UsageError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "trio", unrelated), force=True, use_apt=False),
                      os.environ)
    assert caught.value.message.startswith(f"--runtime-from {unrelated} holds none of libc++.so.1, ")
    nothing_staged(cache_dir)


def tar_bytes_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("compress", [lzma.compress, bz2.compress], ids=["xz", "bzip2"])
def test_a_damaged_archive_given_is_named_as_damaged(compress: Any, tmp_path: Path, cache: Cache,
                                                     cache_dir: Path) -> None:
    """Bytes changed in the middle of its compressed stream: the decoder's error names the file given."""
    whole = trio_tar_file(tmp_path / "whole", stub_trio(tmp_path / "stubs"), compress).read_bytes()
    damaged = tmp_path / "trio.tar.cmp"
    middle = len(whole) // 2
    damaged.write_bytes(whole[:middle] + bytes(b ^ 0x5A for b in whole[middle:middle + 64]) + whole[middle + 64:])
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(damaged,), force=True, use_apt=False), os.environ)
    assert caught.value.message.startswith("trio.tar.cmp is corrupt or truncated: "), caught.value.message
    assert caught.value.hint == "download it again or get it from a trusted source; nothing was staged"
    nothing_staged(cache_dir)


def test_a_glibc_alone_fetches_no_trio(tmp_path: Path, cache: Cache, cache_dir: Path, sdk: Sdk,
                                       monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Files given are what is used: no `apt-get download`, no LLVM archive behind the user's back."""
    needs_host_without_trio()
    ran = tmp_path / "apt-get-ran"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text(f"#!/bin/sh\ntouch {ran}\nexit 100\n")
    (fake / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    host_lib = Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2")).parent
    glibc = tmp_path / "glibc"
    glibc.mkdir()
    for name in (LOADER, "libc.so.6"):
        shutil.copy(host_lib / name, glibc / name)
    result = stage_runtime(cache, sdk, RuntimeRequest(sources=(glibc,)), os.environ)
    assert not ran.exists()
    assert (result.libcxx_action, result.libcxx) == ("missing", None)
    assert "none of the files given with --runtime-from holds them" in caplog.text
    assert "without --runtime-from to fetch them" in caplog.text
    # The glibc is not needed on this host, and is said so.
    assert "covers what the SDK needs" in unused_warnings(caplog)[str(glibc)]
    nothing_staged(cache_dir)
    # Without files, qnnctl fetches the trio itself: apt-get is where it starts.
    with pytest.raises(DownloadError):
        stage_runtime(cache, sdk, RuntimeRequest(backoff_base=0.01), os.environ)
    assert ran.exists()


def test_on_an_aarch64_host_nothing_is_staged_and_the_systems_packages_are_named(
        tmp_path: Path, cache: Cache, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's aarch64 libraries use the system's libstdc++: refused before any file given is read."""
    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", "aarch64")
    stub_trio(tmp_path / "trio")
    with pytest.raises(UsageError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "trio", tmp_path / "missing.deb"), force=True,
                                                  use_apt=False), os.environ)
    assert caught.value.message == (
        "--runtime stages libc++ and glibc for Linux x86_64; on Linux aarch64 the SDK's libraries use the system's "
        "GNU libstdc++ and glibc, which qnnctl does not stage")
    assert caught.value.hint == ("install them with the system's packages (Debian/Ubuntu: `sudo apt-get install "
                                 "libstdc++6 libatomic1`); `qnnctl doctor` says what is missing")
    nothing_staged(cache_dir)


def test_missing_host_libraries(tmp_path: Path) -> None:
    (tmp_path / "libqnnctl-only-here.so.1").write_bytes(b"\x7fELF")
    names = ["libc.so.6", "libqnnctl-only-here.so.1", "libqnnctl-nowhere.so.1"]
    assert missing_host_libraries(names, [tmp_path]) == ["libqnnctl-nowhere.so.1"]
    assert missing_host_libraries(names, []) == ["libqnnctl-only-here.so.1", "libqnnctl-nowhere.so.1"]


def test_nothing_staged_means_no_dirs_and_no_loader(cache: Cache, sdk: Sdk) -> None:
    assert staged_lib_dirs(cache, sdk) == []
    assert staged_loader(cache) is None
    assert reexec_command(cache, sdk, ["/usr/bin/env"], {}) is None


# -- integrity: exit 4, nothing staged ---------------------------------------------------


def fake_known_deb(path: Path) -> Path:
    """A well-formed .deb that claims to be Debian's libc++1-14 but holds other bytes."""
    entries = [Entry("./usr/lib/x86_64-linux-gnu/libc++.so.1", b"\x7fELF not the real one")]
    return build_deb(path, "libc++1-14", "1:14.0.6-12", entries)


def corrupt_deb(path: Path) -> Path:
    entries = [Entry("./usr/lib/x86_64-linux-gnu/libc++.so.1", os.urandom(200_000))]
    deb = build_deb(path, "libc++1-14", "1:14.0.6-99", entries)
    data = bytearray(deb.read_bytes())
    data[len(data) // 2] ^= 0xFF
    deb.write_bytes(bytes(data))
    return deb


def not_elf_deb(path: Path) -> Path:
    """A sound package whose libc++.so.1 is no library (a linker script, say)."""
    entries = [Entry("./usr/lib/libc++.so.1", b"INPUT(libc++.so.1.0 -lc++abi)\n")]
    return build_deb(path, "libc++1-local", "1.0", entries)


BAD_DEBS = [fake_known_deb, corrupt_deb, not_elf_deb]


@pytest.mark.parametrize("make", BAD_DEBS)
def test_bad_deb_is_an_integrity_error_and_stages_nothing(make: object, tmp_path: Path, cache: Cache,
                                                          cache_dir: Path) -> None:
    deb = make(tmp_path / "libc++1-14.deb")  # type: ignore[operator]
    good = tmp_path / "good"
    stub_trio(good)
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(deb, good), force=True, use_apt=False), os.environ)
    assert ("sha256 mismatch" in caught.value.message) == (make is fake_known_deb)
    if make is corrupt_deb:
        assert caught.value.message.startswith("libc++1-14.deb is corrupt or truncated: "), caught.value.message
    if make is fake_known_deb:
        pinned = PINNED_DEBS[("libc++1-14", "1:14.0.6-12", "amd64")]
        assert caught.value.message == (f"sha256 mismatch for libc++1-14.deb (libc++1-14 1:14.0.6-12 amd64): "
                                        f"expected {pinned}, got {sha256_of(deb.read_bytes())}")
        assert caught.value.hint == "this is not the package Debian published; nothing was staged"
    nothing_staged(cache_dir)


def test_a_deb_without_its_control_file_is_named_as_damaged(tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    """Read from the private copy staging makes of it, and named as the file the user gave."""
    deb = build_deb(tmp_path / "libc++1-14.deb", "libc++1-14", "1.0", [Entry("./usr/lib/libc++.so.1", b"\x7fELF")],
                    control_member=tar_bytes([Entry("./"), Entry("./md5sums", b"")], "gz"))
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(deb,), force=True, use_apt=False), os.environ)
    assert caught.value.message == "libc++1-14.deb is corrupt or truncated: control.tar holds no control file"
    nothing_staged(cache_dir)


@pytest.mark.parametrize("make", BAD_DEBS)
def test_bad_deb_exits_4_on_the_command_line(make: object, tmp_path: Path, cache_dir: Path, sdk: Sdk) -> None:
    needs_host_without_trio()
    deb = make(tmp_path / "libc++1-14.deb")  # type: ignore[operator]
    good = tmp_path / "good"
    stub_trio(good)
    proc = run_qnnctl("install", VERSION, "--runtime", "--runtime-from", str(deb), "--runtime-from", str(good))
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == ""
    assert "nothing was staged" in proc.stderr
    nothing_staged(cache_dir)


# -- glibc and the staged loader ---------------------------------------------------------

LOADER_CHILD = """
import json, os, sys
from qnnctl.sdk.cache import Cache
from qnnctl.run.lower import reexec_command
maps = [line.split()[-1] for line in open("/proc/self/maps") if "libc.so.6" in line or "ld-linux" in line]
again = reexec_command(Cache.from_env(os.environ), None, [sys.executable], os.environ)
print(json.dumps({"argv": sys.argv[1:], "probe": os.environ.get("QNN_PROBE"), "maps": sorted(set(maps)),
                  "again": again}))
"""


def check_loader_runs(cache: Cache, sdk: Sdk) -> None:
    """A child started under the staged loader sees its arguments and environment."""
    staged = staged_loader(cache)
    assert staged is not None
    loader, glibc_lib = staged
    base = {k: v for k, v in os.environ.items() if k != LOADER_GUARD}
    base["QNN_PROBE"] = "a value with spaces"
    planned = reexec_command(cache, sdk, ["/usr/bin/env"], base)
    assert planned is not None
    command, env = planned
    assert command[:3] == [str(loader), "--library-path", command[2]]
    assert command[2].split(os.pathsep)[0] == str(glibc_lib)
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    assert "QNN_PROBE=a value with spaces" in out.splitlines()
    assert f"{LOADER_GUARD}={loader}" in out.splitlines()

    planned = reexec_command(cache, sdk, [sys.executable, "-c", LOADER_CHILD, "one two", "--x"], base)
    assert planned is not None
    proc = subprocess.run(planned[0], env=planned[1], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["argv"] == ["one two", "--x"]
    assert seen["probe"] == "a value with spaces"
    assert sorted(seen["maps"]) == sorted([str(glibc_lib / "libc.so.6"), str(loader)])
    assert seen["again"] is None  # the guard: no second re-exec


def test_staged_loader_from_a_folder_runs_a_child_once(tmp_path: Path, cache: Cache, sdk: Sdk) -> None:
    host_lib = Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2")).parent
    folder = tmp_path / "glibc"
    folder.mkdir()
    for name in (LOADER, "libc.so.6", "libm.so.6"):
        shutil.copy(host_lib / name, folder / name)
    stub = tmp_path / "trio"
    stub_trio(stub)
    result = stage_runtime(cache, sdk, RuntimeRequest(sources=(stub, folder), force=True, use_apt=False),
                           os.environ)
    assert result.glibc_action == "staged"
    assert result.glibc is not None
    assert result.glibc.manifest["loader"] == f"lib/{LOADER}"
    host = host_glibc()
    assert host is not None
    assert result.glibc.manifest["glibc_version"] == f"{host[0]}.{host[1]}"
    # glibc never goes on LD_LIBRARY_PATH: only the trio does.
    assert staged_lib_dirs(cache, sdk) == [result.libcxx.lib_dir]  # type: ignore[union-attr]
    check_loader_runs(cache, sdk)


def test_apt_loader_from_the_hosts_libc6_deb(cache: Cache, sdk: Sdk, debs: dict[str, Path]) -> None:
    sources = (*(debs[n] for n in TRIO_DEBS), debs["libc6"])
    result = stage_runtime(cache, sdk, RuntimeRequest(sources=sources, force=True, use_apt=False), os.environ)
    assert result.glibc is not None
    assert result.glibc.name.startswith("glibc-2.")
    manifest = result.glibc.manifest
    assert [s["package"] for s in manifest["sources"]] == ["libc6"]
    assert {"lib/ld-linux-x86-64.so.2", "lib/libc.so.6", "lib/libm.so.6"} <= set(manifest["files"])
    check_loader_runs(cache, sdk)


def test_apt_loader_from_an_rpm(cache: Cache, sdk: Sdk, debs: dict[str, Path], tmp_path: Path) -> None:
    """An RPM laid out like an EL8 glibc: real files named libc-2.NN.so behind soname links."""
    from qnnctl.host.packages import collect, deb_members

    found = collect(deb_members(debs["libc6"]), lambda n: n.startswith("lib/x86_64-linux-gnu/"),
                    tmp_path / "libc6", "libc6")
    files = {Path(name).name: f.path.read_bytes() for name, f in found.files.items()}
    entries = [Entry("./usr/lib64", folder=True)]
    for name in ("libc.so.6", "libm.so.6", LOADER):
        real = name.split(".so")[0] + "-2.99.so"
        entries.append(Entry(f"./usr/lib64/{real}", files[name], mode=0o755))
        entries.append(Entry(f"./usr/lib64/{name}", target=real))
    entries.append(Entry(f"./lib64/{LOADER}", target=f"/usr/lib64/{LOADER}"))
    rpm = build_rpm(tmp_path / "glibc-2.36-1.el8.x86_64.rpm", "glibc", "2.36", "1.el8",
                    cpio_newc(cpio_entries(entries)))
    trio = tuple(debs[n] for n in TRIO_DEBS)
    result = stage_runtime(cache, sdk, RuntimeRequest(sources=(*trio, rpm), force=True, use_apt=False),
                           os.environ)
    assert result.glibc is not None
    assert result.glibc.name == "glibc-2.36-1.el8"
    assert sorted(result.glibc.manifest["files"]) == sorted(f"lib/{n}" for n in ("libc.so.6", "libm.so.6", LOADER))
    check_loader_runs(cache, sdk)


# -- when the SDK needs a newer glibc ----------------------------------------------------


@pytest.fixture
def new_glibc_sdk(tmp_path: Path, sdk: Sdk) -> Sdk:
    """The SDK's libQnnHtp.so references GLIBC_2.99, through a stub libc that defines it."""
    stub = tmp_path / "stub"
    stub.mkdir()
    version_script = stub / "v.map"
    version_script.write_text("GLIBC_2.99 { global: qnn_new_symbol; local: *; };\n")
    compile_shared(stub / "libc.so.6", "int qnn_new_symbol(void) { return 1; }\n",
                   extra=["-Wl,-soname,libc.so.6", f"-Wl,--version-script={version_script}"])
    source = tmp_path / "htp.c"
    source.write_text("int qnn_new_symbol(void);\nint qnn_htp(void) { return qnn_new_symbol(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-nostdlib", "-o", str(sdk.lib_dir / "libQnnHtp.so"),
                    str(source), str(stub / "libc.so.6")], check=True)
    return sdk


def test_a_kept_trio_off_the_lock_is_refused_before_a_glibc_source_is_read(
        tmp_path: Path, cache: Cache, new_glibc_sdk: Sdk) -> None:
    """A glibc to stage, the trio kept: the kept trio is held to the lock first, so a stage refused
    anyway reads no source (nor downloads a package), and the refusal names the kept library."""
    stub_trio(tmp_path / "trio")
    first = stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "trio",), force=True, use_apt=False),
                          os.environ)
    assert first.libcxx is not None
    pins = RuntimePins("qnnctl.lock", {"libcxx": {
        f"lib/{name}": hashlib.sha256((first.libcxx.lib_dir / name).read_bytes()).hexdigest() for name in TRIO}})
    (first.libcxx.lib_dir / "libunwind.so.1").write_bytes(b"\x7fELF changed")
    damaged = build_deb(tmp_path / "libc6.deb", "libc6", "2.99", [], data_member=b"\xfd7zXZ\x00 cut short")
    with pytest.raises(IntegrityError, match=r"^the runtime staged in .*: lib/libunwind\.so\.1: [0-9a-f]{64}, pinned"):
        stage_runtime(cache, new_glibc_sdk, RuntimeRequest(sources=(damaged,), use_apt=False, pins=pins), os.environ)
    assert current(cache, GLIBC) is None


def test_glibc_requirement_is_read_from_the_sdk(new_glibc_sdk: Sdk, sdk: Sdk) -> None:
    assert sdk_glibc_requirement(new_glibc_sdk) == (2, 99)
    assert glibc_shortfall(new_glibc_sdk) == ((2, 99), host_glibc())


def test_glibc_requirement_of_a_plain_sdk_is_met(sdk: Sdk) -> None:
    # The test SDK's libraries call nothing versioned in libc: nothing to require.
    assert sdk_glibc_requirement(sdk) is None
    assert glibc_shortfall(sdk) is None


def test_too_old_glibc_package_is_refused(new_glibc_sdk: Sdk, cache: Cache, cache_dir: Path,
                                          tmp_path: Path) -> None:
    host_lib = Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2")).parent
    folder = tmp_path / "glibc"
    folder.mkdir()
    for name in (LOADER, "libc.so.6"):
        shutil.copy(host_lib / name, folder / name)
    stub = tmp_path / "trio"
    stub_trio(stub)
    with pytest.raises(QnnctlError) as caught:
        stage_runtime(cache, new_glibc_sdk, RuntimeRequest(sources=(stub, folder), use_apt=False), os.environ)
    host = ".".join(str(part) for part in host_glibc() or ())
    assert caught.value.message == f"{folder} holds glibc {host}; SDK {VERSION} needs 2.99 or newer"
    assert caught.value.hint == "give a newer glibc package with --runtime-from; nothing was staged"
    nothing_staged(cache_dir)


def test_needed_glibc_without_a_package_warns(new_glibc_sdk: Sdk, cache: Cache, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    stub = tmp_path / "trio"
    stub_trio(stub)
    result = stage_runtime(cache, new_glibc_sdk, RuntimeRequest(sources=(stub,), force=True, use_apt=False),
                           os.environ)
    assert result.glibc_action == "missing"
    assert result.glibc is None
    assert "needs glibc 2.99" in caplog.text
    assert "--runtime-from" in caplog.text


def test_apt_command_line_stages_only_what_is_missing(debs: dict[str, Path], cache_dir: Path, sdk: Sdk) -> None:
    needs_host_without_trio()
    args = ["install", VERSION, "--runtime-from", str(debs["libc6"])]
    for name in TRIO_DEBS:
        args += ["--runtime-from", str(debs[name])]
    proc = run_qnnctl(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sdk.root)
    assert "staged libc++ runtime" in proc.stderr
    assert "no glibc is staged" in proc.stderr  # this host's glibc is new enough
    assert [p.name for p in (cache_dir / "runtime").iterdir()] == ["libcxx-14.0.6-12"]
    again = run_qnnctl("install", VERSION, "--runtime")
    assert again.returncode == 0, again.stderr
    assert "already staged" in again.stderr


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reaches the real LLVM release: a test that falls through to it gets a closed port."""
    monkeypatch.setenv("QNNCTL_LLVM_URL", "http://127.0.0.1:9/no-llvm-archive-here.tar.xz")
    monkeypatch.setenv("QNNCTL_LLVM_SHA256", "0" * 64)  # vouched for, so that it is tried, and fails
    monkeypatch.delenv(LOADER_GUARD, raising=False)


def test_llvm_url_secrets_are_neither_logged_nor_recorded(server: FaultServer, tmp_path: Path, cache: Cache,
                                                          cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    data, _ = llvm_archive(tmp_path, big=1 << 20)
    server.add("/llvm.tar.xz", data, "application/x-xz")
    server.fail("/llvm.tar.xz", Fault.drop_after(len(data) // 2))
    url = server.base.replace("http://", "http://user:S3cr3t@") + "/llvm.tar.xz?token=SIGNED"
    caplog.set_level("INFO", logger="qnnctl")
    request = RuntimeRequest(force=True, use_apt=False, llvm_url=url, llvm_sha256=sha256_of(data), backoff_base=0.01)
    result = stage_runtime(cache, None, request, os.environ)
    assert result.libcxx is not None
    shown = server.base.replace("http://", "http://***@") + "/llvm.tar.xz?token=***"
    assert manifest_of(result.libcxx.root)["sources"][0]["source"] == shown  # type: ignore[index]
    with pytest.raises(DownloadError) as caught:
        stage_runtime(cache, None, RuntimeRequest(force=True, use_apt=False, llvm_url=url.replace("llvm", "none")),
                      os.environ)
    said = caplog.text + str(caught.value)
    assert "retrying" in said
    for secret in ("S3cr3t", "SIGNED"):
        assert secret not in said
        for path in cache_dir.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
