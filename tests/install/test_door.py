"""The ways around the install's checks, built as an attacker would, each refused: a file
checked and another installed, modes that leave code writable by others, an SDK or a lock
that vouches for itself, a mirror's index that never ends. Each test also shows the honest
path still works, so that a refusal of everything cannot pass it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path

import pytest

from qnnctl.errors import IntegrityError
from qnnctl.install.archive import zip_digests
from qnnctl.install.pipeline import InstallRequest, install
from qnnctl.sdk.cache import Cache, read_manifest
from qnnctl.sdk.vouchers import vouchers
from tests.conftest import run_qnnctl
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import VERSION, SdkSpec, add_zip_entry, build_archive, build_sdk_tree, install_tree_into_cache

TOP = f"qairt/{VERSION}"


def _loose_zip(tmp_path: Path) -> Path:
    """An SDK archive whose folders are 0777 and whose files are 0666 (0777 for the tools)."""
    tree = build_sdk_tree(tmp_path / "loose-tree", SdkSpec())
    archive = tmp_path / f"v{VERSION}.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for folder, dirs, names in os.walk(tree):
            dirs.sort()
            rel = Path(folder).relative_to(tree)
            add_zip_entry(zf, f"{Path(TOP, rel).as_posix()}/", b"", stat.S_IFDIR | 0o777)
            for name in sorted(names):
                path = Path(folder, name)
                loose = 0o777 if path.stat().st_mode & 0o111 else 0o666
                add_zip_entry(zf, Path(TOP, rel, name).as_posix(), path.read_bytes(), stat.S_IFREG | loose)
    return archive


def _writable_by_others(root: Path) -> list[str]:
    found = []
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(folder, name)
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode) and mode & (stat.S_IWGRP | stat.S_IWOTH):
                found.append(f"{path.relative_to(root)} {stat.S_IMODE(mode):o}")
    if root.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        found.append(". (the SDK root)")
    return found


@pytest.mark.parametrize("umask", [0o022, 0o000])
@pytest.mark.parametrize("way", ["download", "file", "parts"])
def test_an_archive_of_world_writable_modes_installs_nothing_others_can_write(
        tmp_path: Path, cache: Cache, server: FaultServer, way: str, umask: int) -> None:
    archive = _loose_zip(tmp_path)
    server.add(f"/{VERSION}/v{VERSION}.zip", archive.read_bytes())
    environ = {"QNNCTL_MIRROR": server.base}
    request = {
        "download": InstallRequest(VERSION),
        "file": InstallRequest(VERSION, file=archive),
        "parts": InstallRequest(VERSION, components=("host",)),
    }[way]
    old = os.umask(umask)
    try:
        result = install(request, cache, environ, tmp_path, vouchers(environ, tmp_path))
    finally:
        os.umask(old)
    assert result.sdk is not None
    root = result.sdk.root
    assert _writable_by_others(root) == []
    tool = root / "bin/x86_64-linux-clang/qnn-net-run"
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755  # the exec bit is the archive's
    assert stat.S_IMODE((root / "lib/x86_64-linux-clang/libQnnHtp.so").stat().st_mode) == 0o644
    assert stat.S_IMODE((root / "lib/x86_64-linux-clang").stat().st_mode) == 0o755


# -- a file checked, another installed ------------------------------------------------------


def _evil_archive(tmp_path: Path) -> Path:
    """Another build of the same version, with a library of its own."""
    folder = tmp_path / "evil"
    folder.mkdir()
    return build_archive(folder, "zip", SdkSpec(extra_files={"lib/x86_64-linux-clang/libEvil.so": b"\x7fELF evil"}))


@pytest.mark.parametrize("how", ["renamed over", "written into"])
@pytest.mark.parametrize("sha256", [True, False])
def test_a_file_swapped_after_it_was_hashed_is_never_installed(
        tmp_path: Path, cache: Cache, monkeypatch: pytest.MonkeyPatch, how: str, sha256: bool) -> None:
    """Between the hash and the extraction, another archive takes the file's place: renamed over
    its path (by anyone who can write its folder), or written into the file itself (by anyone
    who can write the file: it is made world-writable here, so qnnctl copies what it hashes)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    good = build_archive(shared, "zip")
    good_digest = hashlib.sha256(good.read_bytes()).hexdigest()
    evil = _evil_archive(tmp_path)
    if how == "written into":
        good.chmod(0o666)
    swapped: list[str] = []

    from qnnctl.install.door import admit_archive as real_check

    def check_then_swap(*args: object, **kwargs: object) -> None:
        real_check(*args, **kwargs)  # type: ignore[arg-type]
        if not swapped:
            if how == "renamed over":
                os.replace(evil, good)
            else:
                good.write_bytes(evil.read_bytes())
            swapped.append(how)

    monkeypatch.setattr("qnnctl.install.pipeline.admit_archive", check_then_swap)
    request = InstallRequest(VERSION, file=good, sha256=good_digest if sha256 else None)
    result = install(request, cache, {}, tmp_path, vouchers({}, tmp_path))
    assert swapped == [how]
    assert result.sdk is not None
    assert not (result.sdk.root / "lib/x86_64-linux-clang/libEvil.so").exists()
    manifest = read_manifest(result.sdk.root)
    assert manifest is not None
    assert manifest["sha256"] == good_digest
    assert not list(cache.tmp.iterdir())  # the link or copy went with the work folder


def test_a_folder_or_a_missing_file_given_with_file_is_a_usage_error(tmp_path: Path, cache: Cache) -> None:
    from qnnctl.errors import UsageError

    for given in (tmp_path, tmp_path / "missing.zip"):
        with pytest.raises(UsageError, match="is not a file"):
            install(InstallRequest(VERSION, file=given), cache, {}, tmp_path, vouchers({}, tmp_path))


# -- a mirror's index that never ends, or nests without end ------------------------------------


@pytest.mark.parametrize("index", ["endless", "deep", "deep in a string"])
def test_a_mirror_index_without_end_is_refused_with_a_message(server: FaultServer, tmp_path: Path,
                                                              index: str) -> None:
    archive = build_archive(tmp_path, "zip")
    server.add(f"/{VERSION}/v{VERSION}.zip", archive.read_bytes())
    if index == "endless":
        server.add("/index.json", b"")
        server.fail("/index.json", Fault.endless(b'{"schema": 1, "versions": {' + b" " * 65536))
    elif index == "deep":
        server.add("/index.json", b'{"schema": 1, "versions": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                   content_type="application/json")
    else:  # brackets inside a string nest nothing: an honest index that says "[[[[" is read
        server.add("/index.json", json.dumps({"schema": 1, "note": "[" * 100_000, "versions": {
            VERSION: {"sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}}}).encode(),
            content_type="application/json")
    env = dict(os.environ, QNNCTL_MIRROR=server.base)
    result = run_qnnctl("install", VERSION, env=env)
    if index == "deep in a string":
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 4, result.stderr
    assert "unexpected error" not in result.stderr
    assert ("larger than 8 MiB" if index == "endless" else "nests deeper than 16 levels") in result.stderr
    assert server.requests_for(f"/{VERSION}/v{VERSION}.zip") == []  # nothing was fetched
    assert not (Cache.from_env(env).sdk_dir(VERSION)).exists()


# -- a cache that anyone can write -------------------------------------------------------------


@pytest.mark.parametrize("loose", ["cache", "sdk folder", "library folder"])
def test_a_cache_others_can_write_is_refused_by_every_command(tmp_path: Path, cache_dir: Path, loose: str) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    made_loose = {"cache": cache_dir, "sdk folder": root, "library folder": root / "lib/x86_64-linux-clang"}[loose]
    made_loose.chmod(0o777)
    env = {**os.environ, "QNNCTL_FORCE_CPU_VENDOR": "GenuineIntel"}
    for args in (["env", VERSION], ["lower", "--sdk", VERSION, "--", "true"], ["install", VERSION]):
        result = run_qnnctl(*args, env=env)
        assert result.returncode == 4, (args, result.stderr)
        assert f"{made_loose} is writable by its group and others (mode 0777)" in result.stderr
        assert f"`chmod go-w {made_loose}`" in result.stderr
        assert result.stdout == ""
    doctor = run_qnnctl("doctor", "--json", "--offline", "--sdk", VERSION, env=env)
    checks = {check["id"]: check for check in json.loads(doctor.stdout)["checks"]}
    assert doctor.returncode == 1
    assert any(check["status"] == "fail" and f"{made_loose} is writable by its group and others" in check["detail"]
               for check in checks.values()), checks
    made_loose.chmod(0o755)  # as the hint says: then it is used
    assert run_qnnctl("env", VERSION, env=env).returncode == 0


def test_a_cache_readable_by_all_and_writable_by_its_owner_alone_is_shared(tmp_path: Path, cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    for folder in (cache_dir, cache_dir / "sdks", root):
        folder.chmod(0o755)
    result = run_qnnctl("env", VERSION)
    assert result.returncode == 0, result.stderr
    assert f"QNN_SDK_ROOT={root}" in result.stdout or f"QNN_SDK_ROOT='{root}'" in result.stdout


# -- a lock that contradicts itself; an SDK that vouches for itself ------------------------------


def _write_lock(project: Path, sha256: str, components: dict[str, str]) -> Path:
    lines = [f'schema = 2\n[sdk]\nversion = "{VERSION}"\nsha256 = "{sha256}"\n[sdk.component_sha256]\n']
    lines += [f'{name} = "{digest}"\n' for name, digest in sorted(components.items())]
    path = project / "qnnctl.lock"
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize("way", ["download", "file"])
def test_a_lock_whose_sha256_is_right_and_host_digest_wrong_is_refused(
        tmp_path: Path, cache: Cache, server: FaultServer, way: str) -> None:
    archive = build_archive(tmp_path, "zip")
    server.add(f"/{VERSION}/v{VERSION}.zip", archive.read_bytes())
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    digests = zip_digests(archive)
    project = tmp_path / "project"
    project.mkdir()
    environ = {"QNNCTL_MIRROR": server.base}
    request = InstallRequest(VERSION) if way == "download" else InstallRequest(VERSION, file=archive)
    _write_lock(project, sha256, {**digests, "host": "0" * 64})
    with pytest.raises(IntegrityError, match=r"qnnctl.lock contradicts itself: .* the digest of its component host "
                                             rf"is {digests['host']}, and the lock pins {'0' * 64}; nothing was "):
        install(request, cache, environ, project, vouchers(environ, project, locked=True))
    assert not cache.sdk_dir(VERSION).exists()
    _write_lock(project, sha256, digests)  # the honest lock: installed
    result = install(request, cache, environ, project, vouchers(environ, project, locked=True))
    assert result.sdk is not None
    assert result.action == "installed"


def test_lock_check_refuses_a_lock_that_contradicts_itself(tmp_path: Path, cache_dir: Path,
                                                           server: FaultServer) -> None:
    archive = build_archive(tmp_path, "zip")
    assert run_qnnctl("install", "--file", str(archive)).returncode == 0
    project = tmp_path / "project"
    project.mkdir()
    digests = zip_digests(archive)
    _write_lock(project, hashlib.sha256(archive.read_bytes()).hexdigest(), {**digests, "host": "0" * 64})
    result = run_qnnctl("lock", "--check", VERSION, cwd=project)
    assert result.returncode == 1, result.stderr
    assert "qnnctl.lock contradicts itself: its sha256 is the archive's, but the files of component host" \
        in result.stderr
    assert run_qnnctl("install", VERSION, "--locked", cwd=project).returncode == 4


@pytest.mark.parametrize("where", ["link", "store", "ExecuTorch's cache"])
def test_an_sdk_carrying_its_own_manifest_vouches_for_nothing(tmp_path: Path, cache_dir: Path, where: str) -> None:
    """A folder qnnctl did not write, holding a `.qnnctl.json` that names the lock's sha256 and
    digests, but another library than the locked archive's: refused by install --locked and
    lock --check, as the same tree without that file is."""
    good = build_archive(tmp_path, "zip")
    sha256 = hashlib.sha256(good.read_bytes()).hexdigest()
    digests = zip_digests(good)
    project = tmp_path / "project"
    project.mkdir()
    _write_lock(project, sha256, digests)
    folder = {"link": tmp_path / "linked" / VERSION, "store": tmp_path / "store" / VERSION,
              "ExecuTorch's cache": tmp_path / "home" / ".cache" / "executorch" / "qnn" / f"sdk-{VERSION}"}[where]
    root = build_sdk_tree(folder, SdkSpec(extra_files={"lib/x86_64-linux-clang/libEvil.so": b"\x7fELF evil"}))
    forged = {"schema": 1, "version": VERSION, "sha256": sha256, "size": good.stat().st_size, "partial": False,
              "component_sha256": digests, "files": {}}
    (root / ".qnnctl.json").write_text(json.dumps(forged))
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "home" / ".cache")}
    if where == "link":
        assert run_qnnctl("link", str(root), "--version", VERSION, env=env).returncode == 0
    elif where == "store":
        env["QNNCTL_STORES"] = str(tmp_path / "store")
    for args in (["install", VERSION, "--locked"], ["lock", "--check", VERSION]):
        result = run_qnnctl(*args, env=env, cwd=project)
        assert result.returncode == (4 if args[0] == "install" else 1), (args, result.stderr)
        assert "the files of component host" in result.stderr
        assert digests["host"] in result.stderr
    assert not cache_dir.joinpath("sdks", VERSION).exists()


def test_a_folder_hashed_once_is_not_hashed_again_until_it_changes(tmp_path: Path, cache: Cache,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl.sdk import evidence

    root = build_sdk_tree(tmp_path / "store" / VERSION)
    hashed: list[Path] = []
    from qnnctl.sdk.members import tree_digests as real

    def counting(path: Path, *args: object, **kwargs: object) -> dict[str, str]:
        hashed.append(path)
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("qnnctl.sdk.evidence.tree_digests", counting)
    first = evidence.hashed_digests(root, cache)
    assert evidence.hashed_digests(root, cache) == first
    assert hashed == [root]
    library = root / "lib/x86_64-linux-clang/libQnnHtp.so"
    stamp = library.stat()
    library.write_bytes(library.read_bytes()[:-1] + b"X")  # the same size and, set back, the same times
    os.utime(library, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    changed = evidence.hashed_digests(root, cache)
    assert hashed == [root, root]
    assert changed["host"] != first["host"]


def test_qnnctl_lock_never_takes_its_values_from_a_manifest_a_store_carries(tmp_path: Path, cache_dir: Path,
                                                                           server: FaultServer) -> None:
    archive = build_archive(tmp_path, "zip")
    server.add(f"/{VERSION}/v{VERSION}.zip", archive.read_bytes())
    root = build_sdk_tree(tmp_path / "store" / VERSION)
    (root / ".qnnctl.json").write_text(json.dumps({"schema": 1, "version": VERSION, "sha256": "f" * 64,
                                                   "size": 1, "partial": False, "files": {}}))
    project = tmp_path / "project"
    project.mkdir()
    env = {**os.environ, "QNNCTL_STORES": str(tmp_path / "store"), "QNNCTL_MIRROR": server.base}
    result = run_qnnctl("lock", VERSION, env=env, cwd=project)
    assert result.returncode == 0, result.stderr
    lock = (project / "qnnctl.lock").read_text()
    assert hashlib.sha256(archive.read_bytes()).hexdigest() in lock  # fetched and hashed
    assert "f" * 64 not in lock


# -- what an attacker who read the first round tried next ----------------------------------------


def test_an_index_that_decodes_to_gigabytes_is_refused_by_its_decoded_size(tmp_path: Path) -> None:
    """1 GiB of spaces gzip to about 1 MB: refused at 8 MiB decoded, by a reader whose memory
    never grows with the decoded size (a decoder that inflates each block whole would)."""
    import gzip
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bomb = gzip.compress(b'{"schema": 1, "versions": {' + b" " * (1 << 30), compresslevel=9)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(bomb)))
            self.end_headers()
            try:
                self.wfile.write(bomb)
            except OSError:
                pass  # the reader stopped early, as it should

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # The peak of this process's own memory (VmHWM): ru_maxrss would carry the test's own peak
    # over the fork and exec.
    code = ("import sys\nfrom qnnctl.errors import IntegrityError\n"
            "from qnnctl.sdk.mirrorindex import read_index\n"
            "try:\n    read_index(sys.argv[1])\nexcept IntegrityError as exc:\n    print(exc.message)\n"
            "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')))")
    try:
        result = subprocess.run([sys.executable, "-c", code, f"http://127.0.0.1:{server.server_address[1]}"],
                                capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    said, peak_kib = result.stdout.splitlines()
    assert "is larger than 8 MiB" in said, result.stderr
    assert int(peak_kib) < 200 << 10  # KiB: far below the gigabyte it decodes to


def test_a_cache_whose_own_folders_others_can_write_is_refused(tmp_path: Path, cache: Cache,
                                                               server: FaultServer) -> None:
    """The cache itself closed, but its downloads/ still open to others (an old cache made under
    umask 0, mended by half): a finished download planted there would be taken as qnnctl's own."""
    cache.ensure()
    (cache.root / "downloads").chmod(0o777)
    archive = build_archive(tmp_path, "zip")
    server.add(f"/{VERSION}/v{VERSION}.zip", archive.read_bytes())
    environ = {"QNNCTL_MIRROR": server.base}
    with pytest.raises(IntegrityError, match=r"downloads is writable by its group and others .*") as refused:
        install(InstallRequest(VERSION), cache, environ, tmp_path, vouchers(environ, tmp_path))
    assert refused.value.hint is not None
    assert f"`chmod -R go-w {cache.root}`" in refused.value.hint
    assert server.requests_for(f"/{VERSION}/v{VERSION}.zip") == []
    from qnnctl.fleet.mirror import fetch_archive

    with pytest.raises(IntegrityError, match="downloads is writable"):
        fetch_archive(VERSION, cache, environ)


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_a_download_in_progress_is_its_owners_alone(tmp_path: Path, cache: Cache, server: FaultServer,
                                                    umask: int) -> None:
    from qnnctl.net.download import Downloader, PlainProgress, make_session

    server.add("/v.zip", os.urandom(1 << 16))
    cache.ensure()
    old = os.umask(umask)
    try:
        fetched = Downloader(make_session(), cache.downloads, PlainProgress).fetch([server.url("/v.zip")], "v.zip")
    finally:
        os.umask(old)
    assert stat.S_IMODE(fetched.path.stat().st_mode) == 0o600


def test_an_sdk_named_by_path_that_others_can_change_is_refused(tmp_path: Path, cache_dir: Path) -> None:
    """`export QNN_SDK_ROOT=$(qnnctl install)` names the cache's SDK by its path: held to the same
    rule as the cache's own look-up, as any SDK named by path is."""
    root = install_tree_into_cache(cache_dir, VERSION)
    (root / "lib/x86_64-linux-clang").chmod(0o777)
    env = {**os.environ, "QNN_SDK_ROOT": str(root), "QNNCTL_FORCE_CPU_VENDOR": "GenuineIntel"}
    for args in (["env"], ["install"], ["which", "libQnnHtp.so"], ["lower", "--", "true"]):
        result = run_qnnctl(*args, env=env)
        assert result.returncode == 4, (args, result.stderr)
        assert "lib/x86_64-linux-clang is writable by its group and others" in result.stderr
    (root / "lib/x86_64-linux-clang").chmod(0o755)
    assert run_qnnctl("env", env=env).returncode == 0


def test_a_fifo_in_the_archives_place_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Opened for reading, a FIFO blocks until someone writes to it: the open must not."""
    import threading

    from qnnctl.errors import UsageError
    from qnnctl.install.sources import pinned_file

    fifo = tmp_path / "v.zip"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def pin() -> None:
        try:
            with pinned_file(fifo, tmp_path / "work"):
                pass
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=pin, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # free the thread before failing
        with open(fifo, "wb"):
            pass
        pytest.fail("the open of a FIFO blocked")
    (refused,) = outcome
    assert isinstance(refused, UsageError)
    assert refused.message == f"{fifo} is not a file"


def test_a_foreign_sdk_with_any_entry_others_can_change_vouches_for_nothing(tmp_path: Path, cache: Cache) -> None:
    """Beyond the folders a store's check looks at (lib/ and bin/ of the host): a library for
    the phone, a header, a folder: hashing such a tree, or remembering it, proves nothing."""
    from qnnctl.sdk.evidence import hashed_digests

    root = build_sdk_tree(tmp_path / "store" / VERSION)
    assert hashed_digests(root, cache)  # a tree only its owner can change: hashed
    for loose in (root / "lib/aarch64-android", root / "lib/aarch64-android/libQnnHtp.so", root / "include/QNN"):
        mode = loose.stat().st_mode
        loose.chmod(stat.S_IMODE(mode) | 0o002)
        with pytest.raises(IntegrityError, match=f"could be changed by another user .*{loose.name}|{loose}"):
            hashed_digests(root, cache)
        loose.chmod(stat.S_IMODE(mode))


def test_a_shared_cache_read_only_for_its_user_still_checks_a_foreign_sdk(tmp_path: Path, cache: Cache) -> None:
    """No record can be written there: the tree is hashed each time, and nothing fails."""
    from qnnctl.sdk.evidence import hashed_digests

    root = build_sdk_tree(tmp_path / "store" / VERSION)
    cache.root.mkdir(parents=True)
    (cache.root / "verified").write_text("")  # no folder can be made there, as in a cache of another owner
    assert hashed_digests(root, cache) == hashed_digests(root, cache)


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_install_locks_are_never_writable_by_others(tmp_path: Path, cache: Cache, umask: int) -> None:
    from qnnctl.sdk.work import version_lock

    cache.ensure()
    old = os.umask(umask)
    try:
        with version_lock(cache, VERSION):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(cache.lock_path(VERSION).stat().st_mode) & 0o022 == 0


@pytest.mark.parametrize("where", ["link", "store", "ExecuTorch's cache"])
def test_an_honest_foreign_sdk_passes_locked_and_is_hashed_once(tmp_path: Path, cache_dir: Path, where: str) -> None:
    from qnnctl.sdk.members import tree_digests

    folder = {"link": tmp_path / "linked" / VERSION, "store": tmp_path / "store" / VERSION,
              "ExecuTorch's cache": tmp_path / "home" / ".cache" / "executorch" / "qnn" / f"sdk-{VERSION}"}[where]
    root = build_sdk_tree(folder)
    project = tmp_path / "project"
    project.mkdir()
    _write_lock(project, "e" * 64, tree_digests(root))
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "home" / ".cache")}
    if where == "link":
        assert run_qnnctl("link", str(root), "--version", VERSION, env=env).returncode == 0
    elif where == "store":
        env["QNNCTL_STORES"] = str(tmp_path / "store")
    first = run_qnnctl("install", VERSION, "--locked", "-v", env=env, cwd=project)
    assert first.returncode == 0, first.stderr
    assert Path(first.stdout.strip()) == root
    (record,) = (cache_dir / "verified").iterdir()
    stamp = record.stat().st_mtime_ns
    assert run_qnnctl("lock", "--check", VERSION, env=env, cwd=project).returncode == 0
    assert record.stat().st_mtime_ns == stamp  # answered from the record: not hashed again
    os.utime(root / "QNN_README.txt", (1, 1))  # a change to the tree's entries: hashed again, still matching
    assert run_qnnctl("lock", "--check", VERSION, env=env, cwd=project).returncode == 0
    assert record.stat().st_mtime_ns != stamp
    (root / "docs" / "new.txt").write_text("added")  # a change of content: hashed again, and refused
    changed = run_qnnctl("lock", "--check", VERSION, env=env, cwd=project)
    assert changed.returncode == 1
    assert "the files of component docs" in changed.stderr


def test_mirror_file_refuses_a_fifo_rather_than_waiting_on_it(tmp_path: Path, cache_dir: Path) -> None:
    fifo = tmp_path / "v2.37.0.250724.zip"
    os.mkfifo(fifo)
    result = run_qnnctl("mirror", str(tmp_path / "mirror"), "--file", str(fifo), timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"{fifo} is not a file" in result.stderr
