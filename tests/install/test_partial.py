"""`install --components`: only some members of the archive, fetched by Range requests.

End to end through the real entry point against the loopback server, whose log of bytes
served is what the transfer is measured by; archives built at test time in the real layout.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import re
import signal
import stat
import struct
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from qnnctl.errors import DownloadError
from qnnctl.install.archive import zip_digests
from qnnctl.net.ranged import Fetcher, probe
from qnnctl.net.sparse import SparseFile
from qnnctl.sdk.cache import MANIFEST_NAME, read_manifest
from qnnctl.sdk.vouchers import vouchers
from tests.conftest import run_qnnctl, run_qnnctl_on_a_terminal, with_default_sigint
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import (
    OTHER_VERSION,
    VERSION,
    SdkSpec,
    add_zip_entry,
    build_archive,
    long_name_chain,
    manifest_digest,
)

PATH = f"/{VERSION}/v{VERSION}.zip"
TOP = f"qairt/{VERSION}/"
_RANDOM = random.Random(15)

# Incompressible payloads, so that each component's compressed bytes are what its files weigh.
PAYLOADS = {
    "lib/x86_64-linux-clang/libQnnHtpPrepare.so": 1536 << 10,  # host
    "lib/aarch64-android/libQnnHtpV73Stub.so": 1 << 20,  # android
    "lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so": 1 << 20,
    "lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so": 1 << 20,
    "docs/payload.bin": 2 << 20,
    "examples/model.py": 10 << 10,
    "lib/x86_64-windows-msvc/QnnHtp.dll": 1 << 20,  # no component claims it: `all` only
}
HOST_FILES = {"QNN_README.txt", "sdk.yaml", "lib/x86_64-linux-clang/libQnnHtp.so",
              "lib/x86_64-linux-clang/libQnnSystem.so", "lib/x86_64-linux-clang/libQnnCpu.so",
              "lib/x86_64-linux-clang/libQnnHtpPrepare.so", "bin/x86_64-linux-clang/qnn-net-run",
              "bin/x86_64-linux-clang/qnn-context-binary-generator", "include/QNN/QnnInterface.h"}
ANDROID_FILES = {"lib/aarch64-android/libQnnHtp.so", "lib/aarch64-android/libQnnHtpV73Stub.so"}


def component_spec(**more: bytes) -> SdkSpec:
    files = {name: _RANDOM.randbytes(size) for name, size in PAYLOADS.items()}
    files.update(more)
    return SdkSpec(extra_files=files)


@pytest.fixture(scope="module")
def archive_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    folder = tmp_path_factory.mktemp("archives")
    return build_archive(folder, "zip", component_spec()).read_bytes()


@pytest.fixture
def parts_mirror(server: FaultServer, archive_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> FaultServer:
    server.add(PATH, archive_bytes)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    return server


def compressed(data: bytes, prefixes: tuple[str, ...]) -> int:
    """The compressed bytes of the members under `prefixes` (below the SDK root)."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return sum(i.compress_size for i in zf.infolist()
                   if i.filename.startswith(TOP) and i.filename[len(TOP):].startswith(prefixes))


def host_compressed(data: bytes) -> int:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return sum(i.compress_size for i in zf.infolist() if i.filename[len(TOP):] in HOST_FILES)


def files_in(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if (p.is_file() or p.is_symlink()) and p.name != MANIFEST_NAME}


def served_ranges(server: FaultServer) -> list[tuple[int, int]]:
    return [r for s in server.served_for(PATH) for r in s.ranges]


def member_span(data: bytes, name: str) -> tuple[int, int]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = zf.getinfo(TOP + name)
        return info.header_offset, info.header_offset + 30 + len(info.filename) + info.compress_size


# -- the common case: host only, then a component more ------------------------------------------


def test_host_only_then_android(parts_mirror: FaultServer, archive_bytes: bytes, cache_dir: Path) -> None:
    first = run_qnnctl("install", VERSION, "--components", "host")
    assert first.returncode == 0, first.stderr
    root = Path(first.stdout.strip())
    assert root == cache_dir / "sdks" / VERSION
    assert files_in(root) == HOST_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    assert os.readlink(root / "lib/x86_64-linux-clang/libQnnHtp.so.2") == "libQnnHtp.so"
    assert os.access(root / "bin/x86_64-linux-clang/qnn-net-run", os.X_OK)
    ran = subprocess.run([str(root / "bin/x86_64-linux-clang/qnn-net-run")], capture_output=True, text=True)
    assert ran.stdout.strip() == f"qnn-net-run {VERSION}"
    # The bytes served: the host members' compressed bytes, and at most 5% more.
    host = host_compressed(archive_bytes)
    sent = parts_mirror.bytes_served(PATH)
    assert host <= sent <= host * 1.05, (sent, host)
    manifest = read_manifest(root)
    assert manifest is not None
    assert manifest["components"] == ["host"]
    assert manifest["partial"] is True
    assert manifest["sha256"] is None
    assert manifest["central_directory_sha256"] == central_directory_sha256(archive_bytes)
    assert manifest["size"] == len(archive_bytes)
    for name, digest in manifest["files"].items():
        assert manifest_digest((root / name).read_bytes()) == digest, name
    assert sorted(p.name for p in (cache_dir / "downloads").iterdir()) == []
    assert list((cache_dir / "tmp").iterdir()) == []

    listed = json.loads(run_qnnctl("list", "--json").stdout)["sdks"]
    assert [(r["components"], r["partial"]) for r in listed] == [(["host"], True)]
    assert "components host" in run_qnnctl("list").stdout
    env = run_qnnctl("env", VERSION, "--shell", "json")
    assert env.returncode == 0, env.stderr
    assert json.loads(env.stdout)["QNN_SDK_ROOT"] == str(root)

    before = parts_mirror.served_for(PATH)
    host_inode = (root / "lib/x86_64-linux-clang/libQnnHtpPrepare.so").stat().st_ino
    second = run_qnnctl("install", VERSION, "--components", "android")
    assert second.returncode == 0, second.stderr
    assert files_in(root) == HOST_FILES | ANDROID_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    # Only what was missing came: the end, the directory, the Android members; no host byte again.
    added = parts_mirror.served_for(PATH)[len(before):]
    android = compressed(archive_bytes, ("lib/aarch64-android/",))
    sent = sum(s.sent for s in added)
    assert android <= sent <= android * 1.05 + (20 << 10), (sent, android)
    host_span = member_span(archive_bytes, "lib/x86_64-linux-clang/libQnnHtpPrepare.so")
    for start, end in (r for s in added for r in s.ranges):
        assert end <= host_span[0] or start >= host_span[1], (start, end)
    # The old folder's files were taken over (hard links), the new folder renamed into place.
    assert (root / "lib/x86_64-linux-clang/libQnnHtpPrepare.so").stat().st_ino == host_inode
    manifest = read_manifest(root)
    assert manifest is not None
    assert manifest["components"] == ["host", "android"]
    assert set(manifest["files"]) == HOST_FILES | ANDROID_FILES
    for name, digest in manifest["files"].items():
        assert manifest_digest((root / name).read_bytes()) == digest, name
    # Asked again: nothing to fetch.
    count = len(parts_mirror.requests_for(PATH))
    again = run_qnnctl("install", VERSION, "--components", "host,android")
    assert again.returncode == 0
    assert "already installed" in again.stderr
    plain = run_qnnctl("install", VERSION)
    assert plain.returncode == 0
    assert "already installed" in plain.stderr
    assert len(parts_mirror.requests_for(PATH)) == count


def test_the_library_is_told_what_each_install_of_components_did(parts_mirror: FaultServer, cache_dir: Path,
                                                                  tmp_path: Path) -> None:
    """install() of some components: installed when fetched by parts, installed again when
    components are added, reused once all are there; then the whole archive, downloaded and
    installed, then reused; each chosen by the version given."""
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.layout import Sdk
    from qnnctl.sdk.select import BY_ARGUMENT, Selection

    chosen = Selection(BY_ARGUMENT, f"given as {VERSION}", version=VERSION)
    sdk = Sdk(cache_dir / "sdks" / VERSION, VERSION, "qnnctl cache")
    for request, action in ((InstallRequest(spec=VERSION, components=("host",)), "installed"),
                            (InstallRequest(spec=VERSION, components=("android",)), "installed"),
                            (InstallRequest(spec=VERSION, components=("host", "android")), "reused"),
                            (InstallRequest(spec=VERSION, force=True), "installed"),
                            (InstallRequest(spec=VERSION), "reused")):
        result = install(request, Cache(cache_dir), dict(os.environ), tmp_path, vouchers(os.environ, tmp_path))
        assert (result.action, result.selection, result.sdk) == (action, chosen, sdk), request
        if request.components == ("host", "android"):
            assert files_in(sdk.root) == HOST_FILES | ANDROID_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    assert "partial" not in (read_manifest(sdk.root) or {})


def central_directory_sha256(data: bytes) -> str:
    (cd_size, cd_offset) = struct.unpack_from("<LL", data, len(data) - 22 + 12)
    return hashlib.sha256(data[cd_offset:cd_offset + cd_size]).hexdigest()


def test_doctor_says_what_a_partial_install_guarantees(parts_mirror: FaultServer, cache_dir: Path) -> None:
    assert run_qnnctl("install", VERSION, "--components", "host").returncode == 0
    report = run_qnnctl("doctor", "--sdk", VERSION, "--json", "--offline")
    checks = {c["id"]: c for c in json.loads(report.stdout)["checks"]}
    detail = checks["sdk.manifest"]["detail"]
    assert "components host (not the whole archive)" in detail
    assert "fetched in parts" in detail
    assert "each component's files were hashed as they were written" in detail
    assert checks["sdk.layout"]["status"] == "ok"


def test_hexagon_generations_and_all(parts_mirror: FaultServer, archive_bytes: bytes, cache_dir: Path) -> None:
    result = run_qnnctl("install", VERSION, "--components", "hexagon-v75")
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    held = files_in(root)
    assert "lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so" in held
    assert HOST_FILES <= held
    assert not any(name.startswith("lib/hexagon-v73") for name in held)
    assert read_manifest(root)["components"] == ["host", "hexagon-v75"]  # type: ignore[index]
    # `all` fills in the rest, the members of no component included; still by parts.
    result = run_qnnctl("install", VERSION, "--components", "all")
    assert result.returncode == 0, result.stderr
    with zipfile.ZipFile(io.BytesIO(archive_bytes)) as zf:
        every = {i.filename[len(TOP):] for i in zf.infolist() if not i.is_dir()}
    assert files_in(root) == every
    manifest = read_manifest(root)
    assert manifest is not None
    assert manifest["components"] == ["all"]
    assert manifest["partial"] is True


def test_a_generation_the_archive_lacks(parts_mirror: FaultServer, cache_dir: Path) -> None:
    result = run_qnnctl("install", VERSION, "--components", "android,hexagon-v99")
    assert result.returncode == 2
    # The hint asks for what the archive has, of what was asked: not the components it lacks.
    assert result.stderr.endswith(
        f"qnnctl: error: {parts_mirror.base}{PATH} has no hexagon-v99: its components are host, android, "
        "hexagon-v73, hexagon-v75, docs\n"
        "qnnctl: hint: ask only for some of those (`--components host,android`), or install from an archive that "
        "has them\n")
    assert not (cache_dir / "sdks" / VERSION).exists()
    assert list((cache_dir / "downloads").iterdir()) == []
    asked = len(parts_mirror.requests)
    bad = run_qnnctl("install", VERSION, "--components", "host,phone,andriod,hexagon75")
    assert bad.returncode == 2
    assert bad.stderr == ("qnnctl: error: --components: andriod, hexagon75, phone are not components\n"
                          "qnnctl: hint: did you mean android, hexagon-v75? the components are host, android, "
                          "hexagon-vNN (one per DSP generation, e.g. hexagon-v75), docs, all\n")
    assert len(parts_mirror.requests) == asked  # refused before any request


def test_a_generation_the_archive_lacks_from_a_server_without_ranges(parts_mirror: FaultServer,
                                                                    cache_dir: Path) -> None:
    """Found only once the whole archive is here: said so, and that it stays to be read again;
    the next install of the version reads it instead of downloading it again."""
    parts_mirror.ignore_ranges = True
    result = run_qnnctl("install", VERSION, "--components", "hexagon-v99")
    assert result.returncode == 2, result.stderr
    kept = cache_dir / "downloads" / f"v{VERSION}.zip"
    assert kept.is_file()
    assert result.stderr.endswith(
        f"qnnctl: hint: ask only for some of those (`--components host`), or install from an archive that has them; "
        f"the whole archive stays in {kept}, so that the next install of this version reads it instead of "
        "downloading it again (`qnnctl cache clean` removes it)\n"), result.stderr
    again = run_qnnctl("install", VERSION, "--components", "host")
    assert again.returncode == 0, again.stderr
    assert f"reusing the download finished earlier: {kept}" in again.stderr
    assert not kept.exists()  # used up


@pytest.mark.parametrize("components", [(), ("--components", "all")])
def test_default_is_unchanged(parts_mirror: FaultServer, archive_bytes: bytes, cache_dir: Path,
                              components: tuple[str, ...]) -> None:
    """Without --components, or all of them into an empty cache: one request for the whole
    archive, its sha256, no new fields."""
    result = run_qnnctl("install", VERSION, *components)
    assert (result.returncode, result.stdout) == (0, f"{cache_dir / 'sdks' / VERSION}\n"), result.stderr
    (request,) = parts_mirror.requests_for(PATH)
    assert "Range" not in request.headers
    manifest = read_manifest(Path(result.stdout.strip()))
    assert manifest is not None
    assert manifest["sha256"] == hashlib.sha256(archive_bytes).hexdigest()
    assert "components" not in manifest
    assert "partial" not in manifest
    # What a lock made from it pins for installs of some components.
    assert manifest["central_directory_sha256"] == central_directory_sha256(archive_bytes)
    # An SDK installed whole has every component.
    again = run_qnnctl("install", VERSION, "--components", "android")
    assert again.returncode == 0
    assert "already installed" in again.stderr


def test_components_added_later_come_from_the_same_archive(parts_mirror: FaultServer, tmp_path: Path,
                                                           cache_dir: Path) -> None:
    assert run_qnnctl("install", VERSION, "--components", "host").returncode == 0
    root = cache_dir / "sdks" / VERSION
    before = read_manifest(root)
    # The server now has another archive of the same version: its central directory differs.
    other = build_archive(tmp_path, "zip", component_spec())
    parts_mirror.add(PATH, other.read_bytes())
    result = run_qnnctl("install", VERSION, "--components", "android")
    assert result.returncode == 4, result.stderr
    assert f"is not the archive SDK {VERSION} was installed from" in result.stderr
    # From a file, which the refusal names.
    from_file = run_qnnctl("install", "--file", str(other), "--components", "android")
    assert from_file.returncode == 4, from_file.stderr
    assert f"qnnctl: error: {other} is not the archive SDK {VERSION} was installed from" in from_file.stderr
    assert read_manifest(root) == before
    assert not (root / "lib/aarch64-android").exists()


def test_components_of_an_archive_holding_another_version_are_refused(parts_mirror: FaultServer, tmp_path: Path,
                                                                        cache_dir: Path) -> None:
    """Fetched in parts, as a whole download: the SDK found must be the one asked for."""
    url = f"{parts_mirror.base}{PATH}"
    other = SdkSpec(version=OTHER_VERSION, extra_files=component_spec().extra_files)
    parts_mirror.add(PATH, build_archive(tmp_path, "zip", other).read_bytes())
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert (result.returncode, result.stdout) == (4, ""), result.stderr
    assert result.stderr.endswith(
        f"qnnctl: error: {url} holds SDK {OTHER_VERSION}, not {VERSION}\n"
        f"qnnctl: hint: check the URL or QNNCTL_MIRROR; to install {OTHER_VERSION}, run "
        f"`qnnctl install {OTHER_VERSION}` with a source that serves it\n"), result.stderr
    assert not (cache_dir / "sdks" / VERSION).exists()


# -- resuming, retrying, falling back ----------------------------------------------------------


def test_interrupted_partial_install_resumes(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    big = component_spec(**{"lib/x86_64-linux-clang/libQnnHtpPrepare.so": _RANDOM.randbytes(12 << 20)})
    data = build_archive(tmp_path, "zip", big).read_bytes()
    server.add(PATH, data)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    server.rate = 3e6
    child = subprocess.Popen(with_default_sigint([sys.executable, "-m", "qnnctl", "install", VERSION,
                                                  "--components", "host"]),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while server.bytes_served(PATH) < 6 << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    first = server.bytes_served(PATH)
    sparse = cache_dir / "downloads" / f"v{VERSION}.zip.sparse"
    record = cache_dir / "downloads" / f"v{VERSION}.zip.sparse.json"
    assert stat.S_IMODE(sparse.stat().st_mode) == 0o600
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert sparse.stat().st_size == len(data)
    held = json.loads(record.read_text())["held"]
    assert sum(end - start for start, end in held) >= 4 << 20
    assert not (cache_dir / "sdks" / VERSION).exists()

    server.rate = None
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert result.returncode == 0, result.stderr
    assert "resuming" in result.stderr
    host = host_compressed(data)
    # What the first run recorded is not fetched again: the runs together move the host
    # members (and the end and the directory, twice) about once.
    assert first + (server.bytes_served(PATH) - first) <= host * 1.05 + (40 << 10), (first, host)
    assert not sparse.exists()
    assert not record.exists()
    root = cache_dir / "sdks" / VERSION
    assert (root / "lib/x86_64-linux-clang/libQnnHtpPrepare.so").read_bytes() == \
        big.extra_files["lib/x86_64-linux-clang/libQnnHtpPrepare.so"]


def test_killed_partial_install_resumes(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL: what the record says is held is kept (the record never claims more)."""
    big = component_spec(**{"lib/x86_64-linux-clang/libQnnHtpPrepare.so": _RANDOM.randbytes(16 << 20)})
    data = build_archive(tmp_path, "zip", big).read_bytes()
    server.add(PATH, data)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    server.rate = 4e6
    child = subprocess.Popen([sys.executable, "-m", "qnnctl", "install", VERSION, "--components", "host"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while server.bytes_served(PATH) < 10 << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    child.kill()
    child.wait()
    record = cache_dir / "downloads" / f"v{VERSION}.zip.sparse.json"
    held = sum(end - start for start, end in json.loads(record.read_text())["held"])
    assert held >= 4 << 20
    server.rate = None
    before = server.bytes_served(PATH)
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert result.returncode == 0, result.stderr
    assert server.bytes_served(PATH) - before <= (host_compressed(data) - held) * 1.05 + (40 << 10), result.stderr


def test_a_dropped_range_is_asked_for_again(parts_mirror: FaultServer, archive_bytes: bytes,
                                            cache_dir: Path) -> None:
    # After the end of the archive, the next answers break off after 100 KB: the host
    # library's range among them, which is then asked for from where it stopped.
    parts_mirror.fail(PATH, Fault.none(), *[Fault.drop_after(100_000)] * 4)
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert result.returncode == 0, result.stderr
    assert "retrying" in result.stderr
    ranges = [r.headers["Range"] for r in parts_mirror.requests_for(PATH)]
    host = member_span(archive_bytes, "lib/x86_64-linux-clang/libQnnHtpPrepare.so")
    starts = [int(r[6:].split("-")[0]) for r in ranges if not r.startswith("bytes=-")]
    resumed = [start for start in starts if host[0] < start < host[1]]
    assert resumed, ranges
    assert parts_mirror.bytes_served(PATH) <= host_compressed(archive_bytes) * 1.05


@pytest.mark.parametrize(("by", "body"), [(0, b""), (500, b"x" * 300)], ids=["empty", "backwards"])
def test_an_answer_that_moves_nothing_forward_is_a_failed_attempt(server: FaultServer, archive_bytes: bytes,
                                                                  tmp_path: Path, by: int, body: bytes) -> None:
    """206 with `Content-Range: bytes S-(S-1)/SIZE` (or one that ends before it starts) and
    nothing useful after it, to every request: the retry budget ends it, with the cause."""
    server.add(PATH, archive_bytes)
    server.fail(PATH, Fault.none(), *[Fault.backwards_range(by, body)] * 40)
    remote, tail_start, tail = probe([server.url(PATH)])
    sparse = SparseFile.open(tmp_path, "v.zip", remote, tail_start, tail)
    sleeps: list[float] = []
    try:
        with pytest.raises(DownloadError) as caught:
            Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(1000, 5000)], "host")
        held = sparse.held()
    finally:
        sparse.close()
    assert caught.value.exit_code == 3
    assert str(caught.value) == (
        f"download of {remote.shown} failed after 6 attempts: {remote.shown} answered bytes 1000-4999 with "
        f"'bytes 1000-{999 - by}/{len(archive_bytes)}', which holds none of them")
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert len(server.requests_for(PATH)) == 1 + 6
    assert held == [(tail_start, len(archive_bytes))]  # nothing of the body was taken


def test_answers_that_trickle_a_byte_at_a_time_end_it(server: FaultServer, archive_bytes: bytes,
                                                       tmp_path: Path) -> None:
    """Each moves forward, so none is a failed attempt; but a range of a few MB at one byte an
    answer, with no back-off, would take millions of requests."""
    server.add(PATH, archive_bytes)
    server.fail(PATH, Fault.none(), *[Fault.short_range(1)] * 40)
    remote, tail_start, tail = probe([server.url(PATH)])
    sparse = SparseFile.open(tmp_path, "v.zip", remote, tail_start, tail)
    sleeps: list[float] = []
    try:
        with pytest.raises(DownloadError) as caught:
            Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(1000, 1_001_000)], "host")
        held = sparse.held()
    finally:
        sparse.close()
    assert caught.value.exit_code == 3
    assert str(caught.value) == (f"download of {remote.shown} failed after 30 attempts: 30 answers brought less than "
                                 "64 KiB each (30 of bytes 1000-1000999 in all)")
    assert len(server.requests_for(PATH)) == 1 + 30
    assert held[0] == (1000, 1030)
    assert sleeps == []


def test_a_server_that_serves_ranges_in_short_pieces_is_followed_to_the_end(server: FaultServer,
                                                                           archive_bytes: bytes,
                                                                           tmp_path: Path) -> None:
    """Less than asked each time, but a block or more: every answer is taken, however many."""
    server.add(PATH, archive_bytes)
    server.fail(PATH, Fault.none(), *[Fault.short_range(64 << 10)] * 40)
    remote, tail_start, tail = probe([server.url(PATH)])
    sparse = SparseFile.open(tmp_path, "v.zip", remote, tail_start, tail)
    sleeps: list[float] = []
    try:
        Fetcher(sparse, threads=1, sleep=sleeps.append).fetch([(0, 40 * (64 << 10) + 10)], "host")
        assert sparse.read_at(0, 40 * (64 << 10) + 10) == archive_bytes[:40 * (64 << 10) + 10]
    finally:
        sparse.close()
    assert len(server.requests_for(PATH)) == 1 + 41
    assert sleeps == []


def test_an_empty_answer_now_and_then_is_retried_and_the_install_goes_on(parts_mirror: FaultServer,
                                                                         cache_dir: Path) -> None:
    parts_mirror.fail(PATH, Fault.none(), Fault.backwards_range(0))
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert result.returncode == 0, result.stderr
    assert "which holds none of them; retrying in 1.0s (attempt 2 of 6)" in result.stderr
    assert files_in(Path(result.stdout.strip())) == HOST_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}


def test_a_server_that_ignores_ranges(parts_mirror: FaultServer, archive_bytes: bytes, cache_dir: Path) -> None:
    parts_mirror.ignore_ranges = True
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert result.returncode == 0, result.stderr
    assert "warning:" in result.stderr
    assert "answered a ranged request with the whole file (HTTP 200)" in result.stderr
    assert "downloading the whole archive instead, then installing only host" in result.stderr
    root = Path(result.stdout.strip())
    assert files_in(root) == HOST_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    manifest = read_manifest(root)
    assert manifest is not None
    assert manifest["components"] == ["host"]
    assert manifest["partial"] is False
    assert manifest["sha256"] == hashlib.sha256(archive_bytes).hexdigest()
    assert manifest["central_directory_sha256"] == central_directory_sha256(archive_bytes)
    assert list((cache_dir / "downloads").iterdir()) == []


def test_a_server_that_stops_serving_ranges_part_way(parts_mirror: FaultServer, cache_dir: Path) -> None:
    parts_mirror.fail(PATH, Fault.none(), *[Fault.ignore_range()] * 8)
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert result.returncode == 0, result.stderr
    assert "downloading the whole archive instead" in result.stderr
    assert files_in(Path(result.stdout.strip())) == HOST_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}


def test_the_archive_changes_between_runs(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                          monkeypatch: pytest.MonkeyPatch, archive_bytes: bytes) -> None:
    """Parts held from one file are never mixed with another: its ETag and its end differ."""
    server.add(PATH, archive_bytes)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    server.fail(PATH, Fault.none(), Fault.status(404))
    failed = run_qnnctl("install", VERSION, "--components", "host")
    assert failed.returncode == 3, failed.stderr
    assert (cache_dir / "downloads" / f"v{VERSION}.zip.sparse.json").exists()
    other = build_archive(tmp_path, "zip", component_spec()).read_bytes()
    server.add(PATH, other)
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert result.returncode == 0, result.stderr
    assert "has changed since the last run" in result.stderr
    manifest = read_manifest(cache_dir / "sdks" / VERSION)
    assert manifest is not None
    assert manifest["central_directory_sha256"] == central_directory_sha256(other)


# -- zip64 ------------------------------------------------------------------------------------


@contextmanager
def zip64_everywhere() -> Iterator[None]:
    """zipfile writes zip64 records (end of directory, locator, member extras) past these."""
    saved = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    setattr(zipfile, "ZIP64_LIMIT", 1 << 12)
    setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 8)
    try:
        yield
    finally:
        setattr(zipfile, "ZIP64_LIMIT", saved[0])
        setattr(zipfile, "ZIP_FILECOUNT_LIMIT", saved[1])


def as_zip64(data: bytes) -> bytes:
    """The end record's fields set to "see the zip64 record", as an archiver past 4 GiB writes them."""
    eocd = data.rfind(b"PK\x05\x06")
    fields = struct.pack("<4H2L", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    return data[:eocd + 4] + fields + data[eocd + 20:]


def test_zip64_archive(server: FaultServer, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with zip64_everywhere():
        data = as_zip64(build_archive(tmp_path, "zip", component_spec()).read_bytes())
    assert b"PK\x06\x06" in data[-200:]
    assert b"PK\x06\x07" in data[-100:]
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        big = zf.getinfo(TOP + "lib/x86_64-linux-clang/libQnnHtpPrepare.so")
        assert b"\x01\x00" in big.extra[:2]  # the member's zip64 extra field
    server.add(PATH, data)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    assert files_in(root) == HOST_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    assert server.bytes_served(PATH) <= host_compressed(data) * 1.05
    added = run_qnnctl("install", VERSION, "--components", "android,hexagon-v73")
    assert added.returncode == 0, added.stderr
    assert ANDROID_FILES <= files_in(root)


# -- hostile central directories ----------------------------------------------------------------


def _entries(data: bytes) -> list[int]:
    """The offsets of the central directory's entries."""
    size, offset = struct.unpack_from("<LL", data, data.rfind(b"PK\x05\x06") + 12)
    found, at = [], offset
    while at < offset + size:
        found.append(at)
        name_len, extra_len, comment_len = struct.unpack_from("<3H", data, at + 28)
        at += 46 + name_len + extra_len + comment_len
    return found


def _entry_named(data: bytes, name: str) -> int:
    for at in _entries(data):
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + name_len] == (TOP + name).encode():
            return at
    raise KeyError(name)


def _patch(data: bytes, at: int, fmt: str, *values: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


def overlapping(data: bytes) -> bytes:
    """An Android member's directory entry points into the host library's bytes."""
    host = _entry_named(data, "lib/x86_64-linux-clang/libQnnHtpPrepare.so")
    android = _entry_named(data, "lib/aarch64-android/libQnnHtpV73Stub.so")
    return _patch(data, android + 42, "<L", struct.unpack_from("<L", data, host + 42)[0] + 1000)


def past_the_end(data: bytes) -> bytes:
    """The last member, longer than the archive (a member of no component chosen: the
    directory is refused whole)."""
    last = max(_entries(data), key=lambda at: struct.unpack_from("<L", data, at + 42)[0])
    return _patch(data, last + 20, "<L", len(data) * 2)


def local_header_disagrees(data: bytes) -> bytes:
    """The host library's local header gives another CRC-32 than the directory."""
    at = _entry_named(data, "lib/x86_64-linux-clang/libQnnHtpPrepare.so")
    local = struct.unpack_from("<L", data, at + 42)[0]
    return _patch(data, local + 14, "<L", struct.unpack_from("<L", data, local + 14)[0] ^ 1)


def local_extra_too_long(data: bytes) -> bytes:
    """The host library's local header claims an extra field that would put its data past
    where the next member starts."""
    at = _entry_named(data, "lib/x86_64-linux-clang/libQnnHtpPrepare.so")
    local = struct.unpack_from("<L", data, at + 42)[0]
    return _patch(data, local + 28, "<H", 0xFFFF)


def directory_before_the_start(data: bytes) -> bytes:
    """The end record says the directory is larger than everything before it."""
    eocd = data.rfind(b"PK\x05\x06")
    return _patch(data, eocd + 12, "<L", eocd + 100)


def escaping_name(tmp_path: Path) -> bytes:
    archive = build_archive(tmp_path, "zip", component_spec())
    with zipfile.ZipFile(archive, "a") as zf:
        add_zip_entry(zf, TOP + "lib/x86_64-linux-clang/../../../../evil.so", b"x", 0o100644)
    return archive.read_bytes()


def device_file(tmp_path: Path) -> bytes:
    archive = build_archive(tmp_path, "zip", component_spec())
    with zipfile.ZipFile(archive, "a") as zf:
        add_zip_entry(zf, TOP + "docs/null", b"", stat.S_IFCHR | 0o644)  # in a component not chosen
    return archive.read_bytes()


def two_end_records(data: bytes) -> bytes:
    """A second end record inside the first one's comment, naming the same directory: the
    reader that takes the last signature and the one that takes the record whose comment ends
    the file choose two records."""
    end = data.rfind(b"PK\x05\x06")
    record = data[end:end + 20]
    second = record + struct.pack("<H", 3)  # its comment runs 3 bytes past the file's end
    return data[:end + 20] + struct.pack("<H", len(second)) + second


def bytes_before_the_first_member(data: bytes) -> bytes:
    """A stub before the zip (as a self-extractor has): zipfile shifts every offset by it."""
    return b"#!/bin/sh\nexit 0\n" + data


def bytes_after_a_members_data(data: bytes) -> bytes:
    """Bytes hidden after the host library's data, inside its range: every later offset moved."""
    junk = b"JUNK" * 64
    at = _entry_named(data, "lib/x86_64-linux-clang/libQnnHtpPrepare.so")
    local = struct.unpack_from("<L", data, at + 42)[0]
    name_len, extra_len = struct.unpack_from("<2H", data, local + 26)
    cut = local + 30 + name_len + extra_len + struct.unpack_from("<L", data, local + 18)[0]
    out = bytearray(data[:cut] + junk + data[cut:])
    for entry in _entries(data):
        offset = struct.unpack_from("<L", data, entry + 42)[0]
        if offset >= cut:
            struct.pack_into("<L", out, entry + len(junk) + 42, offset + len(junk))
    end = bytes(out).rfind(b"PK\x05\x06")
    struct.pack_into("<L", out, end + 16, struct.unpack_from("<L", out, end + 16)[0] + len(junk))
    return bytes(out)


def _rewritten(data: bytes, change: Callable[[zipfile.ZipInfo], None]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            content = source.read(info)
            change(info)
            target.writestr(info, content)
    return out.getvalue()


def name_not_utf8(data: bytes) -> bytes:
    """A member whose name is flagged as UTF-8 and is not (a lone 0xff byte)."""
    marker = "lib/x86_64-linux-clang/libQnnHtpPrepare.so"
    raw = bytearray(data)
    for at in (m.start() for m in re.finditer(re.escape((TOP + marker).encode()), data)):
        raw[at + len(TOP) + 4] = 0xFF  # lib/\xff86_64... in both the local header and the directory
    for at in _entries(data):
        struct.pack_into("<H", raw, at + 8, struct.unpack_from("<H", raw, at + 8)[0] | 0x800)
        local = struct.unpack_from("<L", raw, at + 42)[0]
        struct.pack_into("<H", raw, local + 6, struct.unpack_from("<H", raw, local + 6)[0] | 0x800)
    return bytes(raw)


def zip64_extra_too_short(data: bytes) -> bytes:
    """A zip64 extra field that says 16 bytes and holds 8."""
    def change(info: zipfile.ZipInfo) -> None:
        if info.filename.endswith("libQnnHtpPrepare.so"):
            info.extra = struct.pack("<HH", 0x0001, 16) + bytes(8)

    return _rewritten(data, change)


HOSTILE = [
    (overlapping, "overlaps the next member"),
    (past_the_end, "runs past the start of the central directory"),
    (local_header_disagrees, "local header that disagrees with the central directory"),
    (local_extra_too_long, "runs past its range"),
    (directory_before_the_start, "does not fit before its end records"),
    (escaping_name, "leaves the archive"),
    (device_file, "is a device or special file"),
    (two_end_records, "more than one end of central directory record"),
    (bytes_before_the_first_member, "bytes before its first member"),
    (bytes_after_a_members_data, "libQnnHtpPrepare.so' is followed by 256 bytes that are none of its own"),
    (name_not_utf8, "flagged as UTF-8 but is not"),
    (zip64_extra_too_short, "extra field"),
]


@pytest.mark.parametrize("way", ["parts", "whole", "file", "file-parts"])
@pytest.mark.parametrize(("hostile", "said"), HOSTILE, ids=[h.__name__ for h, _ in HOSTILE])
def test_hostile_archive(server: FaultServer, tmp_path: Path, cache_dir: Path, archive_bytes: bytes,
                         monkeypatch: pytest.MonkeyPatch, hostile: Callable[..., bytes], said: str, way: str) -> None:
    """Every hostile archive is refused on every way in: exit 4 with what is wrong, never an
    unexpected error, and nothing installed or left behind."""
    made = hostile(tmp_path) if hostile in (escaping_name, device_file) else hostile(archive_bytes)
    server.add(PATH, made)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    archive = tmp_path / "given" / f"v{VERSION}.zip"
    archive.parent.mkdir()
    archive.write_bytes(made)
    args = {"parts": ("install", VERSION, "--components", "host"), "whole": ("install", VERSION),
            "file": ("install", "--file", str(archive)),
            "file-parts": ("install", "--file", str(archive), "--components", "host")}[way]
    result = run_qnnctl(*args)
    assert (result.returncode, result.stdout) == (4, ""), result.stderr
    assert said in result.stderr
    assert "unexpected" not in result.stderr
    assert not (cache_dir / "sdks" / VERSION).exists()
    assert list((cache_dir / "tmp").iterdir()) == []
    assert list((cache_dir / "downloads").iterdir()) == []
    if way == "parts" and hostile not in (local_header_disagrees, local_extra_too_long, bytes_after_a_members_data):
        # Refused from the directory alone: no member was fetched.
        assert server.bytes_served(PATH) < 64 << 10


# -- links across components ---------------------------------------------------------------------


def test_a_link_into_another_component_brings_its_target(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    archive = build_archive(tmp_path, "zip", component_spec())
    with zipfile.ZipFile(archive, "a") as zf:
        add_zip_entry(zf, TOP + "lib/x86_64-linux-clang/libQnnHtpV73Skel.so",
                      b"../hexagon-v73/unsigned/libQnnHtpV73Skel.so", stat.S_IFLNK | 0o777)
    server.add(PATH, archive.read_bytes())
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    result = run_qnnctl("install", VERSION, "--components", "host")
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    link = root / "lib/x86_64-linux-clang/libQnnHtpV73Skel.so"
    assert link.is_symlink()
    assert link.resolve().is_file()
    assert link.read_bytes() == (root / "lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so").read_bytes()
    # The component the link leads into comes whole: what a lock's digest of it covers.
    assert "links of the components chosen lead into hexagon-v73, which is installed too" in result.stderr
    assert not (root / "lib/hexagon-v75").exists()
    assert (read_manifest(root) or {})["components"] == ["host", "hexagon-v73"]


def _names_in(archive: Path) -> set[PurePosixPath]:
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zf:
            return {PurePosixPath(i.filename.rstrip("/")) for i in zf.infolist()}
    with tarfile.open(archive) as tf:
        return {PurePosixPath(name) for name in tf.getnames()}


@pytest.mark.parametrize("fmt", ["zip", "tar.gz"])
def test_the_extractor_refuses_a_choice_that_leaves_a_link_dangling(tmp_path: Path, fmt: str) -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.install.archive import extract

    archive = build_archive(tmp_path, fmt, SdkSpec())
    chosen = {n for n in _names_in(archive) if not str(n).endswith("libQnnHtp.so") or "android" in str(n)}
    with pytest.raises(IntegrityError, match=r"libQnnHtp.so.2 -> libQnnHtp.so needs .*libQnnHtp.so, which is "
                                             r"not being installed"):
        extract(archive, tmp_path / "out", only=chosen)


@pytest.mark.parametrize("fmt", ["zip", "tar.gz"])
def test_a_link_through_a_file_to_a_member_left_out_is_refused(tmp_path: Path, fmt: str) -> None:
    """docs/odd -> ../sdk.yaml/../QNN_README.txt: a path through a file is followed as far as the
    members go, and the member it names is needed as any link's target is."""
    from tests.install.test_archive import TOP, Member, hostile_archive

    archive = hostile_archive(tmp_path, fmt, [Member(f"{TOP}/docs/odd", "symlink",
                                                     target="../sdk.yaml/../QNN_README.txt")])
    assert _refusal_without(archive, "QNN_README.txt", tmp_path / "out") == (
        f"unsafe archive: symlink {TOP}/docs/odd -> ../sdk.yaml/../QNN_README.txt needs {TOP}/QNN_README.txt, "
        "which is not being installed (the components chosen leave it out)")


def _refusal_without(archive: Path, left_out: str, out: Path) -> str:
    """What extract says, refusing to extract `archive` without the members named `left_out`."""
    from qnnctl.errors import IntegrityError
    from qnnctl.install.archive import extract

    chosen = {n for n in _names_in(archive) if n.name != left_out}
    with pytest.raises(IntegrityError) as refused:
        extract(archive, out, only=chosen)
    return refused.value.message


def test_a_link_through_a_folder_entry_to_a_member_left_out_is_refused(tmp_path: Path) -> None:
    """A folder entry is a folder on a link's way whatever mode it carries (this one, a link's):
    lib/extra.so -> ../extra/libExtra.so needs libExtra.so, left out."""
    from tests.install.test_archive import TOP
    from tests.sdkfactory import add_zip_entry

    archive = build_archive(tmp_path, "zip", SdkSpec())
    with zipfile.ZipFile(archive, "a") as zf:
        add_zip_entry(zf, f"{TOP}/extra/", b"", stat.S_IFLNK | 0o777)
        add_zip_entry(zf, f"{TOP}/extra/libExtra.so", b"extra", stat.S_IFREG | 0o644)
        add_zip_entry(zf, f"{TOP}/lib/extra.so", b"../extra/libExtra.so", stat.S_IFLNK | 0o777)
    assert _refusal_without(archive, "libExtra.so", tmp_path / "out") == (
        f"unsafe archive: symlink {TOP}/lib/extra.so -> ../extra/libExtra.so needs {TOP}/extra/libExtra.so, "
        "which is not being installed (the components chosen leave it out)")


def test_a_member_from_another_system_is_extracted_when_chosen(tmp_path: Path) -> None:
    """No Unix mode (the archive was made elsewhere): a plain file, chosen as any other."""
    from qnnctl.install.archive import extract
    from tests.install.test_archive import TOP, _rezipped

    info = zipfile.ZipInfo(f"{TOP}/share/from-windows.txt", date_time=(2025, 7, 24, 0, 0, 0))
    info.create_system, info.external_attr = 0, 0x20
    archive = _rezipped(build_archive(tmp_path, "zip", SdkSpec()), [info])
    result = extract(archive, tmp_path / "out", only={PurePosixPath(info.filename)})
    assert list(result.files) == ["share/from-windows.txt"]


def test_a_hard_link_to_a_member_left_out_is_refused_and_one_to_a_member_chosen_is_made(tmp_path: Path) -> None:
    """A tar's hard link is a second name for a member's data: without that member there is nothing to name."""
    from qnnctl.errors import IntegrityError
    from qnnctl.install.archive import extract
    from tests.install.test_archive import TOP, Member, hostile_archive

    archive = hostile_archive(tmp_path, "tar.gz", [Member(f"{TOP}/docs/readme-copy", "hardlink",
                                                          target=f"{TOP}/QNN_README.txt")])
    chosen = {n for n in _names_in(archive) if n.name != "QNN_README.txt"}
    with pytest.raises(IntegrityError) as refused:
        extract(archive, tmp_path / "out", only=chosen)
    assert (refused.value.message, refused.value.hint) == (
        f"unsafe archive: hard link {TOP}/docs/readme-copy -> {TOP}/QNN_README.txt needs a member that is not "
        "being installed", "the archive was not installed; get it from a trusted source")
    # With the member it names among those chosen, the link is made (as a copy of its data).
    root = extract(archive, tmp_path / "whole", only=set(_names_in(archive))).root
    assert (root / "docs" / "readme-copy").read_bytes() == (root / "QNN_README.txt").read_bytes()


@pytest.mark.parametrize("fmt", ["zip", "tar.gz"])
def test_a_device_file_is_refused_even_where_the_components_chosen_leave_it_out(tmp_path: Path, fmt: str) -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.install.archive import extract
    from tests.install.test_archive import TOP, Member, hostile_archive

    archive = hostile_archive(tmp_path, fmt, [Member(f"{TOP}/share/null", "chardev")])
    chosen = {n for n in _names_in(archive) if n.name != "null"}
    with pytest.raises(IntegrityError) as refused:
        extract(archive, tmp_path / "out", only=chosen)
    assert (refused.value.message, refused.value.hint) == (
        f"unsafe archive: '{TOP}/share/null' is a device or special file",
        "the archive was not installed; get it from a trusted source")


def test_links_that_lead_outside_once_two_installs_are_put_together_are_refused(tmp_path: Path) -> None:
    """Each tree's links lead inside it; together, one redirects another: lib/up -> b/.. of the
    SDK installed, through lib/b -> .. of the components added, leads out of the SDK."""
    from qnnctl.errors import IntegrityError
    from qnnctl.install.partial import merge_old

    old, new = tmp_path / "old", tmp_path / "new"
    (old / "lib").mkdir(parents=True)
    (old / "lib/up").symlink_to("b/..")  # lib/b is not there: lib/up is lib itself
    (new / "lib").mkdir(parents=True)
    (new / "lib/b").symlink_to("..")
    with pytest.raises(IntegrityError) as refused:
        merge_old(old, new)
    assert (refused.value.message, refused.value.hint) == (
        "unsafe archive: symlink lib/up -> b/.. leads outside the SDK",
        "the archive was not installed; get it from a trusted source")


# -- from a file, and from the pin ------------------------------------------------------------------


def test_file_with_components(tmp_path: Path, cache_dir: Path, archive_bytes: bytes) -> None:
    archive = tmp_path / f"v{VERSION}.zip"
    archive.write_bytes(archive_bytes)
    result = run_qnnctl("install", "--file", str(archive), "--components", "host")
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    assert files_in(root) == HOST_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    manifest = read_manifest(root)
    assert manifest is not None
    assert (manifest["components"], manifest["partial"]) == (["host"], False)
    assert manifest["sha256"] == hashlib.sha256(archive_bytes).hexdigest()
    added = run_qnnctl("install", "--file", str(archive), "--components", "docs")
    assert added.returncode == 0, added.stderr
    assert "docs/payload.bin" in files_in(root)
    assert HOST_FILES <= files_in(root)
    assert read_manifest(root)["components"] == ["host", "docs"]  # type: ignore[index]
    # The digests of both, the one installed before kept beside the one added: what the archive's are.
    digests = read_manifest(root)["component_sha256"]  # type: ignore[index]
    assert {name: digests.get(name) for name in ("host", "docs")} == {
        name: zip_digests(archive)[name] for name in ("host", "docs")}
    # Named by version too: what is installed is looked at before the archive, and it lacks android.
    named = run_qnnctl("install", VERSION, "--file", str(archive), "--components", "android")
    assert named.returncode == 0, named.stderr
    assert files_in(root) >= HOST_FILES | ANDROID_FILES
    assert read_manifest(root)["components"] == ["host", "android", "docs"]  # type: ignore[index]
    digests = read_manifest(root)["component_sha256"]  # type: ignore[index]
    assert {name: digests.get(name) for name in ("host", "android", "docs")} == {
        name: zip_digests(archive)[name] for name in ("host", "android", "docs")}


def test_tar_file_with_components(tmp_path: Path, cache_dir: Path) -> None:
    archive = build_archive(tmp_path, "tar.gz", component_spec())
    result = run_qnnctl("install", VERSION, "--file", str(archive), "--components", "android")
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    assert files_in(root) == HOST_FILES | ANDROID_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}


def test_a_tar_whose_headers_pass_the_bounds_is_refused_before_components_are_chosen(
        tmp_path: Path, cache_dir: Path) -> None:
    """Each GNU long name makes tarfile read the next header from inside its own reading: 400 of
    them (a kilobyte compressed) ran Python out of stack, an "unexpected error"."""
    archive = tmp_path / f"v{VERSION}.tar.gz"
    archive.write_bytes(gzip.compress(long_name_chain(TOP.rstrip("/"), 400)))
    result = run_qnnctl("install", VERSION, "--file", str(archive), "--components", "android")
    assert result.returncode == 4, result.stderr
    assert (f"{archive.name} is corrupt or truncated: more than 8 extended tar headers in a row"
            in result.stderr)
    assert not (cache_dir / "sdks" / VERSION).exists()


def test_pinned_components(parts_mirror: FaultServer, cache_dir: Path) -> None:
    work = Path.cwd()
    (work / ".qnn-version").write_text(f"{VERSION}\n# what this project needs\nhost\n")
    first = run_qnnctl("install")
    assert first.returncode == 0, first.stderr
    root = Path(first.stdout.strip())
    assert read_manifest(root)["components"] == ["host"]  # type: ignore[index]
    (work / ".qnn-version").write_text(f"{VERSION}\ncomponents: host, android\n")
    env = run_qnnctl("env", "--shell", "json")
    assert env.returncode == 0, env.stderr
    assert "lacks android" in env.stderr
    assert f"`qnnctl install {VERSION} --components android` adds it" in env.stderr
    refused = run_qnnctl("lower", "--no-install", "--", "true")
    assert refused.returncode == 1
    assert "installed without android" in refused.stderr
    assert f"qnnctl install {VERSION} --components android" in refused.stderr
    dry = run_qnnctl("lower", "--dry-run", "--", "true")
    assert dry.returncode == 0, dry.stderr
    assert "would first fetch only those" in dry.stdout + dry.stderr
    doctor = json.loads(run_qnnctl("doctor", "--json", "--offline").stdout)
    manifest_check = next(c for c in doctor["checks"] if c["id"] == "sdk.manifest")
    assert manifest_check["status"] == "warn"
    assert "asks for android" in manifest_check["detail"]
    second = run_qnnctl("install")
    assert second.returncode == 0, second.stderr
    assert ANDROID_FILES <= files_in(root)
    # `qnnctl use` keeps the components line.
    assert run_qnnctl("use", VERSION).returncode == 0
    assert (work / ".qnn-version").read_text() == f"{VERSION}\ncomponents: host, android\n"
    (work / ".qnn-version").write_text(f"{VERSION}\nhost,wifi\n")
    bad = run_qnnctl("install")
    assert bad.returncode == 2
    assert ".qnn-version, line 2: wifi is not a component" in bad.stderr


# -- with the project's qnnctl.lock ------------------------------------------------------------------


def test_the_lock_pins_each_component(parts_mirror: FaultServer, archive_bytes: bytes, cache_dir: Path,
                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Locked from a whole install, which records each component's digest.
    assert run_qnnctl("install", VERSION).returncode == 0
    locked = run_qnnctl("lock", VERSION)
    assert locked.returncode == 0, locked.stderr
    lock = Path(locked.stdout.strip())
    text = lock.read_text()
    assert f'central_directory_sha256 = "{central_directory_sha256(archive_bytes)}"' in text
    host = tomllib.loads(text)["sdk"]["component_sha256"]["host"]
    # Another machine (another cache), with the components in the lock: host only, by parts, checked.
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(tmp_path / "other"))
    lock.write_text(text.replace("urls = [", 'components = ["host"]\nurls = ['))
    before = parts_mirror.bytes_served(PATH)
    result = run_qnnctl("install", VERSION)
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    assert files_in(root) == HOST_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    assert parts_mirror.bytes_served(PATH) - before <= host_compressed(archive_bytes) * 1.05
    check = run_qnnctl("lock", "--check", VERSION)
    assert check.returncode == 0, check.stderr
    assert "used unchecked" not in result.stderr
    # A lock that pins another digest of the host component: refused, nothing installed.
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(tmp_path / "third"))
    lock.write_text(text.replace(host, "0" * 64))
    refused = run_qnnctl("install", VERSION, "--components", "host")
    assert refused.returncode == 4, refused.stderr
    assert (f"the digest of its component host is {host}, the lock pins {'0' * 64}; nothing was installed"
            in refused.stderr)
    assert not (tmp_path / "third" / "sdks" / VERSION).exists()
    # A component the lock names that is none: refused before any download, naming the lock.
    lock.write_text(text.replace("urls = [", 'components = ["host", "wifi"]\nurls = ['))
    before = parts_mirror.bytes_served(PATH)
    bad = run_qnnctl("install", VERSION)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert f"qnnctl: error: {lock} (sdk.components): wifi is not a component\n" in bad.stderr
    assert parts_mirror.bytes_served(PATH) == before


def test_a_lock_without_component_digests_checks_the_whole_archive(
        parts_mirror: FaultServer, archive_bytes: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock of schema 1 (or one without digests of the components asked for) cannot check
    an install by parts: the whole archive is fetched and checked against its sha256, and only
    the components asked for are installed. Never by parts unchecked."""
    digest = hashlib.sha256(archive_bytes).hexdigest()
    lock = Path.cwd() / "qnnctl.lock"
    lock.write_text(f'schema = 1\n\n[sdk]\nversion = "{VERSION}"\nsha256 = "{digest}"\nsize = {len(archive_bytes)}\n'
                    f'central_directory_sha256 = "{central_directory_sha256(archive_bytes)}"\nurls = []\n')
    before = parts_mirror.bytes_served(PATH)
    result = run_qnnctl("install", VERSION, "--locked", "--components", "host")
    assert result.returncode == 0, result.stderr
    assert (f"{lock} pins the whole archive's sha256 and no component's: downloading the whole archive to check "
            "it, then installing only host") in result.stderr
    assert parts_mirror.bytes_served(PATH) - before == len(archive_bytes)
    assert files_in(Path(result.stdout.strip())) == HOST_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    # Another archive of the same version: refused whole, as it would be without --components.
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(tmp_path / "other"))
    changed = build_archive(tmp_path, "zip", component_spec()).read_bytes()
    parts_mirror.add(PATH, changed)
    refused = run_qnnctl("install", VERSION, "--locked", "--components", "host")
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    assert f"its sha256 is {hashlib.sha256(changed).hexdigest()}, the lock pins {digest}" in refused.stderr
    assert not (tmp_path / "other" / "sdks" / VERSION).exists()


@pytest.mark.parametrize("components", [(), ("--components", "host")])
def test_a_sha256_the_archive_does_not_have_is_refused(parts_mirror: FaultServer, archive_bytes: bytes,
                                                       cache_dir: Path, components: tuple[str, ...]) -> None:
    """Whole or for some components, --sha256 is checked against the whole archive downloaded."""
    result = run_qnnctl("install", VERSION, "--sha256", "0" * 64, *components)
    assert (result.returncode, result.stdout) == (4, ""), result.stderr
    assert hashlib.sha256(archive_bytes).hexdigest() in result.stderr
    assert result.stderr.endswith("qnnctl: hint: the download was removed; check the --sha256 value or the "
                                  "mirror's file\n"), result.stderr
    assert not (cache_dir / "sdks" / VERSION).exists()


def test_a_whole_download_is_checked_against_the_lock(parts_mirror: FaultServer, cache_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """On another machine, the archive downloaded whole must have the sha256 and size the lock
    pins; one the mirror changed since is refused, naming where it came from."""
    assert run_qnnctl("install", VERSION).returncode == 0
    locked = run_qnnctl("lock", VERSION)
    assert locked.returncode == 0, locked.stderr
    lock = Path(locked.stdout.strip())
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(tmp_path / "other"))
    result = run_qnnctl("install", VERSION)
    assert (result.returncode, result.stdout) == (0, f"{tmp_path / 'other' / 'sdks' / VERSION}\n"), result.stderr
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(tmp_path / "third"))
    changed = build_archive(tmp_path, "zip", component_spec()).read_bytes()
    parts_mirror.add(PATH, changed)
    refused = run_qnnctl("install", VERSION)
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    assert (f"qnnctl: error: the archive from {parts_mirror.base}{PATH} does not match {lock}: its sha256 is "
            f"{hashlib.sha256(changed).hexdigest()}") in refused.stderr
    assert not (tmp_path / "third" / "sdks" / VERSION).exists()


def test_force_with_components_installs_them_anew(parts_mirror: FaultServer, cache_dir: Path) -> None:
    """--force --components over an SDK installed by parts: the parts fetched again and put in
    its place, a file damaged since included."""
    assert run_qnnctl("install", VERSION, "--components", "host").returncode == 0
    root = cache_dir / "sdks" / VERSION
    prepare = root / "lib/x86_64-linux-clang/libQnnHtpPrepare.so"
    good = prepare.read_bytes()
    prepare.write_bytes(b"damaged")
    before = len(parts_mirror.requests_for(PATH))
    forced = run_qnnctl("install", VERSION, "--force", "--components", "host")
    assert (forced.returncode, forced.stdout) == (0, f"{root}\n"), forced.stderr
    assert len(parts_mirror.requests_for(PATH)) > before
    assert prepare.read_bytes() == good
    assert files_in(root) == HOST_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}


def test_components_a_store_lacks_are_installed_into_the_cache_apart_from_it(
        parts_mirror: FaultServer, archive_bytes: bytes, cache_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared store holds the version with fewer components: the cache gets its own install of
    all those asked for, the store's files neither taken over (no hard link) nor changed."""
    store_cache = tmp_path / "store-cache"
    first = run_qnnctl("install", VERSION, "--components", "host",
                       env={**os.environ, "QNNCTL_CACHE_DIR": str(store_cache)})
    assert first.returncode == 0, first.stderr
    stored = store_cache / "sdks" / VERSION
    held = read_manifest(stored)
    monkeypatch.setenv("QNNCTL_STORES", str(store_cache / "sdks"))
    before = parts_mirror.bytes_served(PATH)
    result = run_qnnctl("install", VERSION, "--components", "host,android")
    root = cache_dir / "sdks" / VERSION
    assert (result.returncode, result.stdout) == (0, f"{root}\n"), result.stderr
    assert files_in(root) == HOST_FILES | ANDROID_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    assert parts_mirror.bytes_served(PATH) - before >= host_compressed(archive_bytes)
    name = "lib/x86_64-linux-clang/libQnnHtpPrepare.so"
    assert (root / name).stat().st_ino != (stored / name).stat().st_ino
    assert read_manifest(stored) == held


@pytest.mark.parametrize("components", [(), ("--components", "host")])
def test_progress_is_a_bar_on_a_terminal_whole_or_by_parts(parts_mirror: FaultServer, cache_dir: Path,
                                                           components: tuple[str, ...]) -> None:
    returncode, out, seen = run_qnnctl_on_a_terminal("install", VERSION, *components)
    assert (returncode, out) == (0, f"{cache_dir / 'sdks' / VERSION}\n"), seen.decode(errors="replace")
    # tqdm redraws its bar in place: a carriage return that starts no new line (the terminal
    # writes every line's end as \r\n, a bar or not)
    assert re.search(rb"\r(?!\n)", seen), seen
    assert b"% of" not in seen  # and the plain lines are not printed as well


# -- adding components: archives without folder entries, and never a moment without the SDK --


def without_folder_entries(data: bytes) -> bytes:
    """The zip written again without entries for its folders, as many archivers write zips."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            if not info.is_dir():
                target.writestr(info, source.read(info))
    return out.getvalue()


@pytest.mark.parametrize("folders", [True, False], ids=["folder-entries", "no-folder-entries"])
def test_a_component_is_added_to_an_archive_with_or_without_folder_entries(
        server: FaultServer, archive_bytes: bytes, cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
        folders: bool) -> None:
    data = archive_bytes if folders else without_folder_entries(archive_bytes)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert any(info.is_dir() for info in zf.infolist()) is folders
    server.add(PATH, data)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    assert run_qnnctl("install", VERSION, "--components", "host").returncode == 0
    added = run_qnnctl("install", VERSION, "--components", "android")
    assert added.returncode == 0, added.stderr
    root = Path(added.stdout.strip())
    assert files_in(root) == HOST_FILES | ANDROID_FILES | {"lib/x86_64-linux-clang/libQnnHtp.so.2"}
    assert (read_manifest(root) or {})["components"] == ["host", "android"]


def test_a_reader_never_sees_the_sdk_missing_while_components_are_added(
        parts_mirror: FaultServer, cache_dir: Path) -> None:
    """The SDK with the new components takes the old one's place in one step (an exchange of
    the two folders): a reader polling the SDK all the while finds it every time, whole."""
    assert run_qnnctl("install", VERSION, "--components", "host").returncode == 0
    library = cache_dir / "sdks" / VERSION / "lib/x86_64-linux-clang/libQnnHtp.so"
    manifest = cache_dir / "sdks" / VERSION / MANIFEST_NAME
    adding = subprocess.Popen([sys.executable, "-m", "qnnctl", "install", VERSION, "--components",
                               "android,hexagon-v73,hexagon-v75,docs"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    looks = missing = 0
    while adding.poll() is None:
        looks += 1
        if not (library.is_file() and manifest.is_file()):
            missing += 1
    _, err = adding.communicate()
    assert adding.returncode == 0, err
    assert (looks > 100, missing) == (True, 0)
    assert (read_manifest(cache_dir / "sdks" / VERSION) or {})["components"] == [
        "host", "android", "hexagon-v73", "hexagon-v75", "docs"]
    assert list((cache_dir / "tmp").iterdir()) == []


def test_no_step_of_adding_components_leaves_the_sdk_missing(parts_mirror: FaultServer, cache_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rename the commit makes is followed by a look at the SDK: it is there each time, so
    a kill between any two steps leaves the old SDK or the new one, never none."""
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import Cache

    assert run_qnnctl("install", VERSION, "--components", "host").returncode == 0
    sdk = cache_dir / "sdks" / VERSION
    seen: list[bool] = []
    rename = os.replace

    def looked(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        rename(source, target)
        seen.append((sdk / MANIFEST_NAME).is_file() and (sdk / "lib/x86_64-linux-clang/libQnnHtp.so").is_file())

    monkeypatch.setattr(os, "replace", looked)
    result = install(InstallRequest(spec=VERSION, components=("host", "android")), Cache(cache_dir),
                     dict(os.environ), Path.cwd(), vouchers(os.environ, Path.cwd()))
    assert result.action == "installed"
    assert all(seen), seen
    assert (sdk / "lib/aarch64-android/libQnnHtp.so").is_file()
