"""`qnnctl install` end to end: real archives, a real HTTP server, real processes."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import qnnctl
import qnnctl.install.commit
from qnnctl.install.archive import zip_digests
from qnnctl.install.commit import directory_digest
from qnnctl.sdk.cache import MANIFEST_NAME, read_manifest
from qnnctl.sdk.vouchers import vouchers
from tests.conftest import run_qnnctl, start_qnnctl_waiting, with_default_sigint
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import OTHER_VERSION, VERSION, SdkSpec, build_archive, build_sdk_tree, manifest_digest

PATH = f"/{VERSION}/v{VERSION}.zip"
LIB = "lib/x86_64-linux-clang"
BIN = "bin/x86_64-linux-clang"


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_complete_sdk(root: Path, version: str = VERSION) -> dict[str, object]:
    """The tree works (tools run, libraries load) and its manifest describes it exactly."""
    for tool in ("qnn-net-run", "qnn-context-binary-generator"):
        path = root / BIN / tool
        assert os.access(path, os.X_OK), path
        ran = subprocess.run([str(path), "--help"], capture_output=True, text=True, check=True)
        assert ran.stdout.strip() == f"{tool} {version} --help"
    library = ctypes.CDLL(str(root / LIB / "libQnnHtp.so.2"))  # through the in-tree symlink
    assert library.qnn_qnnhtp_version() == 42
    link = root / LIB / "libQnnHtp.so.2"
    assert link.is_symlink()
    assert os.readlink(link) == "libQnnHtp.so"
    manifest = read_manifest(root)
    assert manifest is not None
    files = manifest["files"]
    assert isinstance(files, dict)
    on_disk = {
        str(p.relative_to(root)) for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and p.name != MANIFEST_NAME
    }
    assert set(files) == on_disk
    for name, digest in files.items():
        assert manifest_digest((root / name).read_bytes()) == digest, name
    assert manifest["file_count"] == len(files)
    assert manifest["unpacked_size"] == sum((root / name).stat().st_size for name in files)
    assert manifest["schema"] == 1  # for readers of later releases: the manifest's format
    assert manifest["version"] == version
    assert manifest["qnnctl_version"] == qnnctl.__version__
    installed_at = datetime.strptime(str(manifest["installed_at"]), "%Y-%m-%dT%H:%M:%SZ")
    age = datetime.now(timezone.utc).replace(tzinfo=None) - installed_at
    assert abs(age.total_seconds()) < 3600
    # That the manifest is in the tree before the tree is renamed into sdks/ is observed at the
    # rename itself (test_the_manifest_is_in_place_before_the_rename): mtimes cannot tell, as a
    # rename changes none.
    return manifest


def _cache_is_tidy(cache_dir: Path) -> None:
    assert list((cache_dir / "tmp").iterdir()) == []
    assert list((cache_dir / "downloads").iterdir()) == []


# -- from a mirror ---------------------------------------------------------------------------


def test_installed_at_is_utc_whatever_the_local_time_zone(mirror: FaultServer, cache_dir: Path) -> None:
    env = dict(os.environ, TZ="XST-5:30")  # POSIX: a zone five and a half hours east of UTC
    result = run_qnnctl("install", env=env)
    assert result.returncode == 0, result.stderr
    _assert_complete_sdk(Path(result.stdout.strip()))  # installed within the hour, in UTC


def test_fresh_install(mirror: FaultServer, cache_dir: Path) -> None:
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    assert result.stdout == f"{root}\n"
    assert root == cache_dir / "sdks" / VERSION
    manifest = _assert_complete_sdk(root)
    archive = mirror.files[PATH]
    assert manifest["source"] == mirror.url(PATH)
    assert manifest["sha256"] == hashlib.sha256(archive).hexdigest()
    assert manifest["size"] == len(archive)
    (request,) = mirror.requests_for(PATH)
    assert request.headers["User-Agent"] == f"qnnctl/{qnnctl.__version__}"
    _cache_is_tidy(cache_dir)
    assert "installed SDK" in result.stderr


def test_an_empty_sdk_root_leaves_the_sdk_to_the_caller(mirror: FaultServer, cache_dir: Path) -> None:
    """QNN_SDK_ROOT exported but empty: install fetches nothing, prints no root and says why."""
    from qnnctl.install.pipeline import InstallRequest, InstallResult, install
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import BY_CALLER

    env = {**os.environ, "QNN_SDK_ROOT": ""}
    result = run_qnnctl("install", env=env)
    assert (result.returncode, result.stdout) == (0, ""), result.stderr
    assert result.stderr == ("qnnctl: QNN_SDK_ROOT is exported but empty: the SDK is left to the caller; "
                             "nothing to install\n")
    found = install(InstallRequest(), Cache(cache_dir), env, Path.cwd(), vouchers(env, Path.cwd()))
    assert found == InstallResult(None, "caller", found.selection)
    assert found.selection is not None
    assert found.selection.reason == BY_CALLER
    assert mirror.requests == []
    assert not (cache_dir / "sdks").exists() or list((cache_dir / "sdks").iterdir()) == []


def test_an_sdk_installed_while_waiting_for_the_lock_is_checked_against_sha256(mirror: FaultServer,
                                                                             cache_dir: Path) -> None:
    """Another qnnctl installed the version while this one waited for the version's lock: what
    it installed must have the --sha256 asked for."""
    import json

    from filelock import FileLock

    from tests.sdkfactory import install_tree_into_cache

    asked, other = "0" * 64, "1" * 64
    with FileLock(str(cache_dir / "locks" / f"{VERSION}.lock")).acquire(timeout=5):
        proc = start_qnnctl_waiting("install", VERSION, "--sha256", asked)
        root = install_tree_into_cache(cache_dir, VERSION)  # by the qnnctl holding the lock
        manifest = json.loads((root / MANIFEST_NAME).read_text())
        (root / MANIFEST_NAME).write_text(json.dumps({**manifest, "sha256": other}))
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (4, ""), err
    # After "waiting for another qnnctl to finish installing": no line repeating it.
    assert err == (f"qnnctl: error: SDK {VERSION} is installed from an archive whose sha256 is {other}, not {asked}\n"
                   f"qnnctl: hint: check the --sha256 value; to replace the SDK with the archive that has it: "
                   f"`qnnctl install {VERSION} --force --sha256 {asked}`\n")
    # No archive; the mirror's index.json may have been read, to refuse a version it lacks.
    assert [r.path for r in mirror.requests if r.path != "/index.json"] == []


def test_an_sdk_installed_while_waiting_for_the_lock_is_reused(mirror: FaultServer, cache_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from filelock import FileLock

    import qnnctl.install.pipeline as installing
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import BY_ARGUMENT, Selection
    from tests.sdkfactory import install_tree_into_cache

    with FileLock(str(cache_dir / "locks" / f"{VERSION}.lock")).acquire(timeout=5):
        proc = start_qnnctl_waiting("install", VERSION)
        root = install_tree_into_cache(cache_dir, VERSION)  # by the qnnctl holding the lock
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, f"{root}\n"), err
    # After "waiting for another qnnctl to finish installing": one line, not three.
    assert err == f"qnnctl: SDK {VERSION} is already installed in qnnctl's cache\n"
    # No archive; the mirror's index.json may have been read, to refuse a version it lacks.
    assert [r.path for r in mirror.requests if r.path != "/index.json"] == []
    mirror.requests.clear()
    # In this process: found only by the look under the lock.
    looks: list[str] = []

    def late(version: str, *args: Any) -> Any:
        looks.append(version)
        return None if len(looks) == 1 else find_installed(version, *args)  # then asking the mirror finds it

    from qnnctl.sdk.select import find_installed

    monkeypatch.setattr(installing, "find_installed", late)
    again = installing.install(installing.InstallRequest(spec=VERSION), Cache(cache_dir), dict(os.environ), Path.cwd(),
                               vouchers(os.environ, Path.cwd()))
    assert (again.sdk is not None and again.sdk.root, again.action) == (root, "reused")
    assert again.selection == Selection(BY_ARGUMENT, f"given as {VERSION}", version=VERSION)
    assert looks == [VERSION, VERSION, VERSION]
    assert mirror.requests == []


def test_a_reinstall_of_an_sdk_in_use_is_refused_before_the_download_or_waits_for_it(mirror: FaultServer,
                                                                                  cache_dir: Path) -> None:
    """In the tests' own process, which holds the SDK (as a pipeline using it does): `install --force`
    names it in use and fetches nothing; with --wait it waits for the hold to end, then reinstalls."""
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.holds import HeldError, hold_sdk, wait_for_holders
    from tests.sdkfactory import install_tree_into_cache

    root = install_tree_into_cache(cache_dir, VERSION)
    cache, env, request = Cache(cache_dir), dict(os.environ), InstallRequest(spec=VERSION, force=True)
    fd = hold_sdk(root, cache)
    assert fd is not None
    try:
        with pytest.raises(HeldError) as refused:
            install(request, cache, env, Path.cwd(), vouchers(env, Path.cwd()))
    finally:
        os.close(fd)
    assert refused.value.message.startswith(f"SDK {VERSION} ({root}) is in use by PID {os.getpid()} ")
    assert refused.value.message.endswith("; it was not replaced")
    assert refused.value.hint == ("run it again once that process has ended, or the same `qnnctl install` with "
                                  "--wait to wait for it")
    assert [r.path for r in mirror.requests if r.path != "/index.json"] == []
    fd = hold_sdk(root, cache)
    assert fd is not None
    threading.Timer(0.5, os.close, (fd,)).start()
    waiting = wait_for_holders.set(True)
    try:
        started = time.monotonic()
        result = install(request, cache, env, Path.cwd(), vouchers(env, Path.cwd()))
    finally:
        wait_for_holders.reset(waiting)
    assert time.monotonic() - started >= 0.5
    assert (result.sdk is not None and result.sdk.root, result.action) == (root, "installed")
    manifest = read_manifest(root)
    assert manifest is not None
    assert manifest["sha256"] == hashlib.sha256(mirror.files[PATH]).hexdigest()


def test_cache_hit_makes_no_request(mirror: FaultServer, cache_dir: Path) -> None:
    first = run_qnnctl("install")
    assert first.returncode == 0, first.stderr
    second = run_qnnctl("install", VERSION)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    # Found before any lock is taken: no "another qnnctl installed it meanwhile".
    assert second.stderr == f"qnnctl: SDK {VERSION} is already installed in qnnctl's cache\n"
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import BY_ARGUMENT, Selection

    again = install(InstallRequest(spec=VERSION), Cache(cache_dir), dict(os.environ), Path.cwd(),
                    vouchers(os.environ, Path.cwd()))
    assert (again.action, again.selection) == ("reused", Selection(BY_ARGUMENT, f"given as {VERSION}", version=VERSION))
    # The first install asked for the archive and the mirror's index.json; the second for nothing.
    assert sorted(r.path for r in mirror.requests) == sorted([PATH, "/index.json"])


def test_folder_without_manifest_is_not_an_installed_sdk(mirror: FaultServer, cache_dir: Path) -> None:
    """A complete-looking tree in sdks/ without a manifest (an interrupted copy) is replaced."""
    leftover = cache_dir / "sdks" / VERSION
    build_sdk_tree(leftover)
    (leftover / "stale-marker").write_text("from an interrupted install")
    listed = run_qnnctl("list", "--json")
    assert '"sdks": []' in listed.stdout
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    assert len(mirror.requests_for(PATH)) == 1
    assert not (leftover / "stale-marker").exists()
    _assert_complete_sdk(leftover)


def test_manifest_with_a_broken_tree_is_reinstalled(mirror: FaultServer, cache_dir: Path) -> None:
    assert run_qnnctl("install").returncode == 0
    (cache_dir / "sdks" / VERSION / LIB / "libQnnHtp.so").unlink()
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    assert len(mirror.requests_for(PATH)) == 2
    _assert_complete_sdk(cache_dir / "sdks" / VERSION)


def test_force_reinstalls(mirror: FaultServer, cache_dir: Path) -> None:
    assert run_qnnctl("install").returncode == 0
    root = cache_dir / "sdks" / VERSION
    (root / "added-by-hand").write_text("x")
    result = run_qnnctl("install", "--force")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == root
    assert len(mirror.requests_for(PATH)) == 2
    assert not (root / "added-by-hand").exists()
    _assert_complete_sdk(root)
    _cache_is_tidy(cache_dir)


class Renames:
    """Every os.replace of this process; for each rename into sdks/, what the folder held then."""

    def __init__(self, sdks: Path) -> None:
        self.sdks = sdks
        self.into_sdks: list[tuple[Path, dict[str, object] | None, bool]] = []
        self.real = os.replace
        self.real_exchange = qnnctl.install.commit.exchange

    def __call__(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        source, target = Path(src), Path(dst)
        if target.parent == self.sdks:
            # The manifest as it is at the moment of the rename, and whether the tree is whole.
            whole = (source / LIB / "libQnnHtp.so").is_file() and (source / BIN / "qnn-net-run").is_file()
            self.into_sdks.append((target, read_manifest(source), whole))
        self.real(src, dst)

    def exchange(self, new: Path, old: Path) -> None:
        """An SDK replaced (--force, components added): the two folders swap places in one step."""
        whole = (new / LIB / "libQnnHtp.so").is_file() and (new / BIN / "qnn-net-run").is_file()
        self.into_sdks.append((old, read_manifest(new), whole))
        self.real_exchange(new, old)


@pytest.mark.parametrize("how", ["mirror", "file", "force"])
def test_the_manifest_is_in_place_before_the_rename(mirror: FaultServer, cache_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The manifest is what makes a folder of sdks/ an installed SDK: it must be complete in the
    work folder when that folder is renamed into sdks/, never written there afterwards."""
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import Cache

    cache = Cache(cache_dir)
    if how == "force":
        install(InstallRequest(), cache, dict(os.environ), Path.cwd(), vouchers(os.environ, Path.cwd()))
    renames = Renames(cache_dir / "sdks")
    monkeypatch.setattr(os, "replace", renames)
    monkeypatch.setattr(qnnctl.install.commit, "exchange", renames.exchange)
    if how == "file":
        (tmp_path / "a").mkdir()
        request = InstallRequest(file=build_archive(tmp_path / "a", "zip"))
    else:
        request = InstallRequest(force=how == "force", spec=VERSION if how == "force" else None)
    result = install(request, cache, dict(os.environ), Path.cwd(), vouchers(os.environ, Path.cwd()))
    assert result.sdk is not None
    assert result.sdk.root == cache_dir / "sdks" / VERSION
    (target, manifest, whole), = renames.into_sdks
    assert target == result.sdk.root
    assert whole
    assert manifest is not None, "the folder was renamed into sdks/ without its manifest"
    assert manifest["version"] == VERSION
    assert isinstance(manifest["files"], dict)
    assert manifest["files"]
    assert read_manifest(target) == manifest  # and not rewritten after the rename


def test_install_from_url(server: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    """The version is the one the archive's name says, whatever the folders above it say."""
    (tmp_path / "a").mkdir()
    url = server.add(f"/custom/{OTHER_VERSION}/v{VERSION}.zip", build_archive(tmp_path / "a", "zip").read_bytes())
    result = run_qnnctl("install", "--url", url)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / VERSION
    manifest = _assert_complete_sdk(Path(result.stdout.strip()))
    assert manifest["source"] == url
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import BY_ARGUMENT, Selection

    again = install(InstallRequest(url=url), Cache(cache_dir), dict(os.environ), Path.cwd(),
                    vouchers(os.environ, Path.cwd()))
    assert (again.action, again.selection) == ("reused", Selection(BY_ARGUMENT, f"named by {url}", version=VERSION))


def test_url_without_a_version_needs_one(server: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    (tmp_path / "a").mkdir()
    url = server.add("/latest.zip", build_archive(tmp_path / "a", "zip").read_bytes())
    refused = run_qnnctl("install", "--url", url)
    assert refused.returncode == 2
    assert refused.stderr == (f"qnnctl: error: cannot tell the SDK version from {url}\n"
                              "qnnctl: hint: give it too: `qnnctl install VERSION --url URL`\n")
    assert server.requests == []
    # A URL with no path at all names no version either.
    bare = run_qnnctl("install", "--url", server.base.rstrip("/"))
    assert (bare.returncode, bare.stderr) == (2, f"qnnctl: error: cannot tell the SDK version from "
                                                 f"{server.base.rstrip('/')}\nqnnctl: hint: give it too: "
                                                 "`qnnctl install VERSION --url URL`\n")
    result = run_qnnctl("install", "2.37", "--url", url)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / VERSION


@pytest.mark.parametrize(("path", "name"), [
    (f"/files/qairt%20sdk+v{VERSION}.zip", f"qairt_sdk_v{VERSION}.zip"),  # only safe characters
    ("/files/sdk.zip", f"{VERSION}-sdk.zip"),  # the version, where the name lacks it
    ("/files/.zip", f"v{VERSION}.zip"),  # never a hidden file: the version's archive name
    ("/", f"v{VERSION}.zip"),  # a server's root: no name at all
], ids=["unsafe", "no-version", "hidden", "root"])
def test_a_download_is_named_after_its_url(server: FaultServer, tmp_path: Path, cache_dir: Path, path: str,
                                           name: str) -> None:
    (tmp_path / "a").mkdir()
    url = server.add(path, build_archive(tmp_path / "a", "zip").read_bytes())
    # Typed with a space as it is (not a control character), which the request quotes.
    url = url.replace("%20", " ") if path != "/" else server.base.rstrip("/")
    result = run_qnnctl("install", VERSION, "--url", url)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / VERSION
    assert f"\nqnnctl: {name}: " in result.stderr, result.stderr
    _cache_is_tidy(cache_dir)


def test_url_holding_another_version_is_refused(server: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    (tmp_path / "a").mkdir()
    other = build_archive(tmp_path / "a", "zip", SdkSpec(version=OTHER_VERSION)).read_bytes()
    url = server.add(f"/v{VERSION}.zip", other)
    result = run_qnnctl("install", "--url", url)
    assert result.returncode == 4, result.stderr
    assert result.stderr.endswith(
        f"qnnctl: error: {url} holds SDK {OTHER_VERSION}, not {VERSION}\n"
        f"qnnctl: hint: check the URL or QNNCTL_MIRROR; to install {OTHER_VERSION}, run "
        f"`qnnctl install {OTHER_VERSION}` with a source that serves it\n")
    assert "--file" not in result.stderr  # the download is gone: no hint may point at it
    assert list((cache_dir / "sdks").iterdir()) == []
    _cache_is_tidy(cache_dir)


def test_url_whose_top_folder_alone_names_another_version_is_refused(server: FaultServer, tmp_path: Path,
                                                                     cache_dir: Path) -> None:
    """No sdk.yaml and no build id in the libraries: the archive's top folder is all that says
    which SDK it holds."""
    (tmp_path / "a").mkdir()
    other = build_archive(tmp_path / "a", "zip", SdkSpec(version=OTHER_VERSION, sdk_yaml=False)).read_bytes()
    url = server.add(f"/v{VERSION}.zip", other)
    result = run_qnnctl("install", "--url", url)
    assert result.returncode == 4, result.stderr
    assert f"qnnctl: error: {url} holds SDK {OTHER_VERSION}, not {VERSION}\n" in result.stderr
    assert list((cache_dir / "sdks").iterdir()) == []


def test_url_whose_top_folder_is_not_what_its_libraries_are_is_refused(server: FaultServer, tmp_path: Path,
                                                                       cache_dir: Path) -> None:
    """No sdk.yaml: the top folder says the version asked for, the libraries' build another; named, the
    libraries' version is installed."""
    (tmp_path / "a").mkdir()
    true = "2.51.0.260929"
    data = build_archive(tmp_path / "a", "zip", SdkSpec(sdk_yaml=False, build_id=f"v{true}181845")).read_bytes()
    url = server.add(f"/v{VERSION}.zip", data)
    result = run_qnnctl("install", "--url", url)
    assert result.returncode == 4, result.stderr
    assert (f"{url} says it is SDK {VERSION} (its top folder), but its libraries are build {true}181845: "
            f"SDK {true}\n"
            "qnnctl: hint: check where the archive came from; to install it as what its libraries are, "
            f"name that version: `qnnctl install {true} ...`; nothing was installed\n") in result.stderr
    assert list((cache_dir / "sdks").iterdir()) == []
    # As the refusal says: the libraries' version named, it installs as that.
    named = run_qnnctl("install", true, "--url", url)
    assert (named.returncode, named.stdout) == (0, f"{cache_dir / 'sdks' / true}\n"), named.stderr
    assert (read_manifest(cache_dir / "sdks" / true) or {})["build_id"] == f"{true}181845"


def test_an_archive_whose_two_labels_name_two_other_versions_is_refused_naming_both(
        server: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    """The top folder says one version, sdk.yaml another, the libraries' build a third."""
    (tmp_path / "a").mkdir()
    true = "2.51.0.260929"
    spec = SdkSpec(sdk_yaml=False, build_id=f"v{true}181845",
                   extra_files={"sdk.yaml": f"name: qairt\nversion: {OTHER_VERSION}\n".encode()})
    url = server.add(f"/v{VERSION}.zip", build_archive(tmp_path / "a", "zip", spec).read_bytes())
    result = run_qnnctl("install", "--url", url)
    assert result.returncode == 4, result.stderr
    first, second = sorted([VERSION, OTHER_VERSION])
    assert (f"{url} says it is SDK {first}, {second} (its top folder and its sdk.yaml), but its libraries "
            f"are build {true}181845: SDK {true}\n") in result.stderr
    assert list((cache_dir / "sdks").iterdir()) == []


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _garbage(data: bytes) -> bytes:
    return os.urandom(len(data))


@pytest.mark.parametrize("damage", [_truncated, _garbage], ids=["truncated", "corrupt"])
def test_bad_archive_from_the_server(mirror: FaultServer, cache_dir: Path,
                                     damage: Callable[[bytes], bytes]) -> None:
    good = mirror.files[PATH]
    mirror.add(PATH, damage(good))
    result = run_qnnctl("install")
    assert result.returncode == 4, result.stderr
    assert result.stdout == ""
    assert list((cache_dir / "sdks").iterdir()) == []
    # Nothing is kept as a finished download: the next run fetches again.
    _cache_is_tidy(cache_dir)
    mirror.add(PATH, good)
    again = run_qnnctl("install")
    assert again.returncode == 0, again.stderr
    assert len(mirror.requests_for(PATH)) == 2
    _assert_complete_sdk(cache_dir / "sdks" / VERSION)


# -- from a file -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["zip", "tar.gz", "tgz", "tar.xz"])
def test_install_from_file(tmp_path: Path, cache_dir: Path, fmt: str) -> None:
    archive = build_archive(tmp_path, fmt)
    result = run_qnnctl("install", "--file", str(archive))
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    assert root == cache_dir / "sdks" / VERSION
    manifest = _assert_complete_sdk(root)
    assert manifest["source"] == archive.resolve().as_uri()
    assert manifest["sha256"] == _sha256_file(archive)
    assert archive.exists()  # the user's file is left alone
    assert list((cache_dir / "tmp").iterdir()) == []


def test_file_version_from_the_top_folder(tmp_path: Path, cache_dir: Path) -> None:
    archive = build_archive(tmp_path, "tar.gz", SdkSpec(version=OTHER_VERSION, sdk_yaml=False))
    result = run_qnnctl("install", "--file", str(archive))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / OTHER_VERSION


@pytest.mark.parametrize("fmt", ["zip", "tar.xz"])
def test_file_version_from_sdk_yaml_when_the_folder_has_none(tmp_path: Path, cache_dir: Path, fmt: str) -> None:
    archive = build_archive(tmp_path, fmt, SdkSpec(version=OTHER_VERSION, top="qairt/latest"))
    result = run_qnnctl("install", "--file", str(archive))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / OTHER_VERSION
    _assert_complete_sdk(cache_dir / "sdks" / OTHER_VERSION, OTHER_VERSION)


def test_file_without_any_version_needs_one(tmp_path: Path, cache_dir: Path) -> None:
    archive = build_archive(tmp_path, "zip", SdkSpec(top="qairt/latest", sdk_yaml=False))
    refused = run_qnnctl("install", "--file", str(archive))
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
    assert refused.stderr == (f"qnnctl: error: cannot tell the SDK version of {archive}\n"
                              f"qnnctl: hint: give it: `qnnctl install VERSION --file {archive}`\n")
    result = run_qnnctl("install", VERSION, "--file", str(archive))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / VERSION


def test_file_holding_another_version_than_asked(tmp_path: Path, cache_dir: Path) -> None:
    archive = build_archive(tmp_path, "zip")
    result = run_qnnctl("install", OTHER_VERSION, "--file", str(archive))
    assert (result.returncode, result.stdout) == (4, ""), result.stderr
    assert result.stderr == (f"qnnctl: error: {archive} holds SDK {VERSION}, not {OTHER_VERSION}\n"
                             f"qnnctl: hint: run `qnnctl install --file {archive}` to install it as {VERSION}\n")
    assert list((cache_dir / "sdks").iterdir()) == []


def test_file_named_by_version_already_installed_says_so_without_reading_it(tmp_path: Path, cache_dir: Path) -> None:
    archive = build_archive(tmp_path, "zip")
    assert run_qnnctl("install", "--file", str(archive)).returncode == 0
    again = run_qnnctl("install", VERSION, "--file", str(archive))
    assert (again.returncode, again.stdout) == (0, f"{cache_dir / 'sdks' / VERSION}\n"), again.stderr
    assert f"qnnctl: SDK {VERSION} is already installed in qnnctl's cache\n" in again.stderr
    assert not list((cache_dir / "tmp").iterdir())  # nothing was extracted


def test_file_named_by_version_repairs_an_installed_sdk_that_lost_a_library(tmp_path: Path, cache_dir: Path) -> None:
    """The SDK installed has its manifest but not its layout: it is not taken as installed."""
    archive = build_archive(tmp_path, "zip")
    assert run_qnnctl("install", "--file", str(archive)).returncode == 0
    library = cache_dir / "sdks" / VERSION / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"
    library.unlink()
    repaired = run_qnnctl("install", VERSION, "--file", str(archive))
    assert (repaired.returncode, repaired.stdout) == (0, f"{cache_dir / 'sdks' / VERSION}\n"), repaired.stderr
    assert library.is_file()


def test_file_sha256(tmp_path: Path, cache_dir: Path) -> None:
    archive = build_archive(tmp_path, "zip")
    wrong = run_qnnctl("install", "--file", str(archive), "--sha256", "f" * 64)
    assert (wrong.returncode, wrong.stdout) == (4, "")
    assert wrong.stderr == (f"qnnctl: error: the archive from {archive} does not match --sha256: its sha256 is "
                            f"{_sha256_file(archive)}, --sha256 expects {'f' * 64}; nothing was installed\n"
                            "qnnctl: hint: check the --sha256 value, or the archive's source\n")
    assert not (cache_dir / "sdks").exists() or list((cache_dir / "sdks").iterdir()) == []
    right = run_qnnctl("install", "--file", str(archive), "--sha256", _sha256_file(archive))
    assert right.returncode == 0, right.stderr
    # Installed now, it is asked for by version with the same digest: reused, the digest matches the record.
    reused = run_qnnctl("install", VERSION, "--sha256", _sha256_file(archive))
    assert reused.returncode == 0, reused.stderr
    assert reused.stdout == f"{cache_dir / 'sdks' / VERSION}\n"
    # Named, installed already, and the file given: the file is held to --sha256 before the SDK
    # installed is looked at, as when nothing is installed.
    named = run_qnnctl("install", VERSION, "--file", str(archive), "--sha256", "f" * 64)
    assert (named.returncode, named.stdout, named.stderr) == (4, "", wrong.stderr)


def test_file_already_installed_is_reused(tmp_path: Path, cache_dir: Path) -> None:
    archive = build_archive(tmp_path, "zip")
    assert run_qnnctl("install", "--file", str(archive)).returncode == 0
    marker = cache_dir / "sdks" / VERSION / "still-here"
    marker.write_text("x")
    again = run_qnnctl("install", "--file", str(archive))
    assert again.returncode == 0
    assert "already installed" in again.stderr
    assert marker.exists()
    forced = run_qnnctl("install", "--file", str(archive), "--force")
    assert forced.returncode == 0
    assert not marker.exists()


def test_manifest_in_the_archive_is_not_taken_for_ours(tmp_path: Path, cache_dir: Path) -> None:
    spec = SdkSpec(extra_files={MANIFEST_NAME: b'{"version": "9.9.9.999999", "files": {}}'})
    result = run_qnnctl("install", "--file", str(build_archive(tmp_path, "zip", spec)))
    assert result.returncode == 0, result.stderr
    manifest = _assert_complete_sdk(cache_dir / "sdks" / VERSION)
    assert MANIFEST_NAME not in manifest["files"]  # type: ignore[operator]


def test_file_install_waits_for_an_install_of_the_same_version(tmp_path: Path, cache_dir: Path) -> None:
    """`--file` and a download of one version never build into sdks/ at the same time."""
    from filelock import FileLock

    archive = build_archive(tmp_path, "zip")
    (cache_dir / "locks").mkdir(parents=True)
    with FileLock(str(cache_dir / "locks" / f"{VERSION}.lock")):
        proc = _start("install", "--file", str(archive))
        stderr = _Stderr([proc])
        assert stderr.wait_for(f"finish installing {VERSION}", 1), stderr.lines
        assert not (cache_dir / "sdks" / VERSION).exists()
    assert proc.wait(timeout=120) == 0, stderr.text(0)
    _assert_complete_sdk(cache_dir / "sdks" / VERSION)


def test_ctrl_c_while_waiting_for_the_lock_ends_the_wait_and_leaves_the_holder_alone(tmp_path: Path,
                                                                                    cache_dir: Path) -> None:
    """A user tired of waiting for another install presses Ctrl-C: exit 130, nothing written, and
    the other install's lock still its own."""
    from filelock import FileLock, Timeout

    archive = build_archive(tmp_path, "zip")
    (cache_dir / "locks").mkdir(parents=True)
    lock = str(cache_dir / "locks" / "file.lock")
    with FileLock(lock).acquire(timeout=5):
        argv = with_default_sigint([sys.executable, "-m", "qnnctl", "install", "--file", str(archive)])
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stderr = _Stderr([proc])
        assert stderr.wait_for("waiting for another qnnctl to finish installing from a file", 1), stderr.lines
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        with pytest.raises(Timeout):  # another holder than this FileLock finds it taken
            FileLock(lock).acquire(timeout=0)
    assert stderr.text(0).endswith("qnnctl: interrupted; run the same command again to resume\n"), stderr.text(0)
    assert not (cache_dir / "sdks").exists() or list((cache_dir / "sdks").iterdir()) == []
    assert not (cache_dir / "tmp").exists() or list((cache_dir / "tmp").iterdir()) == []


def test_installs_from_files_wait_for_each_other_and_clear_what_a_killed_one_left(tmp_path: Path,
                                                                                 cache_dir: Path) -> None:
    """An archive's version is known only once it is extracted: installs from files share one
    lock, and under it the work folder a killed one left (tmp/file.<id>) is removed."""
    from filelock import FileLock

    archive = build_archive(tmp_path, "zip")
    left = cache_dir / "tmp" / "file.0123abcd"
    (left / "x").mkdir(parents=True)
    (cache_dir / "locks").mkdir(parents=True)
    with FileLock(str(cache_dir / "locks" / "file.lock")).acquire(timeout=5):
        proc = start_qnnctl_waiting("install", "--file", str(archive), doing="installing from a file")
        assert left.exists()
        assert not (cache_dir / "sdks" / VERSION).exists()
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out) == (0, f"{cache_dir / 'sdks' / VERSION}\n"), err
    assert not left.exists()
    _assert_complete_sdk(cache_dir / "sdks" / VERSION)


def test_an_install_from_a_file_of_all_components_is_the_whole_archive(tmp_path: Path, cache_dir: Path) -> None:
    """`--components all` is the whole archive, members no component claims included, and the
    SDK is recorded as whole, as without --components."""
    archive = build_archive(tmp_path, "zip")
    result = run_qnnctl("install", "--file", str(archive), "--components", "all")
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(cache_dir / "sdks" / VERSION)
    assert manifest is not None
    assert ("components" in manifest, manifest.get("partial")) == (False, None)
    whole = tmp_path / "whole"
    plain = run_qnnctl("install", "--file", str(archive), env={**os.environ, "QNNCTL_CACHE_DIR": str(whole)})
    assert plain.returncode == 0, plain.stderr
    assert manifest["files"] == (read_manifest(whole / "sdks" / VERSION) or {})["files"]


def test_an_archive_whose_libraries_are_another_version_installs_only_as_that_version_named(
        tmp_path: Path, cache_dir: Path) -> None:
    """The top folder and sdk.yaml say 2.37, the libraries' build 2.51: refused, unless the
    user names the libraries' version, as the refusal says."""
    true = "2.51.0.260929"
    archive = build_archive(tmp_path, "zip", SdkSpec(build_id=f"v{true}181845"))
    refused = run_qnnctl("install", "--file", str(archive))
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    said = (f"qnnctl: error: {archive} says it is SDK {VERSION} (its top folder and its sdk.yaml), but its "
            f"libraries are build {true}181845: SDK {true}\n")
    assert refused.stderr.startswith(said), refused.stderr
    assert not (cache_dir / "sdks").exists() or not any((cache_dir / "sdks").iterdir())
    named = run_qnnctl("install", true, "--file", str(archive))
    assert (named.returncode, named.stdout) == (0, f"{cache_dir / 'sdks' / true}\n"), named.stderr
    assert (read_manifest(cache_dir / "sdks" / true) or {})["build_id"] == f"{true}181845"


def test_install_file_with_its_sha256_of_a_version_installed_from_another_archive_is_refused(
        tmp_path: Path, cache_dir: Path) -> None:
    """--sha256 vouches for the SDK installed, which came from another archive than this one:
    refused, with the command that replaces it; without --sha256, a warning."""
    import json

    archive = build_archive(tmp_path, "zip")
    assert run_qnnctl("install", "--file", str(archive)).returncode == 0
    path = cache_dir / "sdks" / VERSION / MANIFEST_NAME
    path.write_text(json.dumps({**json.loads(path.read_text()), "sha256": "0" * 64}))
    digest = _sha256_file(archive)
    refused = run_qnnctl("install", "--file", str(archive), "--sha256", digest)
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    assert refused.stderr.endswith(
        f"qnnctl: error: SDK {VERSION} is installed from an archive whose sha256 is {'0' * 64}, not {digest}\n"
        f"qnnctl: hint: check the --sha256 value; to replace the SDK with the archive that has it: "
        f"`qnnctl install {VERSION} --force --file {archive} --sha256 {digest}`\n"), refused.stderr
    warned = run_qnnctl("install", "--file", str(archive))
    assert (warned.returncode, warned.stdout) == (0, f"{cache_dir / 'sdks' / VERSION}\n"), warned.stderr
    assert "from another archive than" in warned.stderr


def test_an_install_from_a_file_says_the_sdk_was_chosen_by_argument(tmp_path: Path, cache_dir: Path) -> None:
    """What the library's caller is told of the choice and the SDK: installed, reused by the version given
    without reading the archive, and reused after reading it."""
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.layout import Sdk
    from qnnctl.sdk.select import BY_ARGUMENT, Selection

    archive = build_archive(tmp_path, "zip")
    chosen = Selection(BY_ARGUMENT, f"from {archive}", version=VERSION)
    sdk = Sdk(cache_dir / "sdks" / VERSION, VERSION, "qnnctl cache")
    for request, action in ((InstallRequest(file=archive), "installed"),
                            (InstallRequest(file=archive, spec=VERSION), "reused"),
                            (InstallRequest(file=archive), "reused")):
        result = install(request, Cache(cache_dir), dict(os.environ), tmp_path, vouchers(os.environ, tmp_path))
        assert (result.action, result.selection, result.sdk) == (action, chosen, sdk)


@pytest.mark.parametrize("fmt", ["zip", "tar.xz"])
def test_corrupt_file(tmp_path: Path, cache_dir: Path, fmt: str) -> None:
    archive = build_archive(tmp_path, fmt, SdkSpec(extra_files={"docs/payload.bin": os.urandom(300_000)}))
    archive.write_bytes(archive.read_bytes()[:-100_000])
    result = run_qnnctl("install", "--file", str(archive))
    assert result.returncode == 4, result.stderr
    assert "corrupt or truncated" in result.stderr
    assert list((cache_dir / "sdks").iterdir()) == []
    assert list((cache_dir / "tmp").iterdir()) == []


def test_an_archive_without_the_host_libraries_is_no_sdk(tmp_path: Path, cache_dir: Path) -> None:
    """Its folder and version are right, its host libraries missing: nothing is installed."""
    archive = build_archive(tmp_path, "zip", SdkSpec(libs=("libQnnCpu.so",)))
    result = run_qnnctl("install", "--file", str(archive))
    assert (result.returncode, result.stdout) == (4, "")
    assert result.stderr == (
        "qnnctl: error: the archive's SDK is incomplete: missing lib/x86_64-linux-clang/libQnnHtp.so, "
        "lib/x86_64-linux-clang/libQnnSystem.so\n"
        "qnnctl: hint: the archive may be truncated or not a QAIRT SDK for Linux; nothing was installed\n")
    assert list((cache_dir / "sdks").iterdir()) == []
    _cache_is_tidy(cache_dir)


@pytest.mark.parametrize("name", ["nope.zip", "folder"])
def test_a_missing_file_or_a_folder_is_a_usage_error(tmp_path: Path, cache_dir: Path, name: str) -> None:
    (tmp_path / "folder").mkdir()
    result = run_qnnctl("install", "--file", str(tmp_path / name))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"qnnctl: error: {tmp_path / name} is not a file\n"
                             "qnnctl: hint: give the path of a downloaded SDK archive\n")
    assert not (cache_dir / "sdks").exists() or list((cache_dir / "sdks").iterdir()) == []


# -- concurrent installs -----------------------------------------------------------------------


class _Stderr:
    """Collects the stderr lines of several processes, so a test can wait for messages."""

    def __init__(self, procs: list[subprocess.Popen[str]]) -> None:
        self.lines: list[list[str]] = [[] for _ in procs]
        self.changed = threading.Condition()
        self.threads = [threading.Thread(target=self._read, args=(i, p.stderr), daemon=True)
                        for i, p in enumerate(procs)]
        for thread in self.threads:
            thread.start()

    def _read(self, index: int, stream: Iterable[str]) -> None:
        for line in stream:
            with self.changed:
                self.lines[index].append(line)
                self.changed.notify_all()

    def count(self, text: str) -> int:
        return sum(any(text in line for line in lines) for lines in self.lines)

    def wait_for(self, text: str, processes: int, timeout: float = 60) -> bool:
        """Wait until `processes` of them have printed a line holding `text`."""
        with self.changed:
            return self.changed.wait_for(lambda: self.count(text) >= processes, timeout)

    def text(self, index: int) -> str:
        self.threads[index].join(timeout=30)
        return "".join(self.lines[index])


def _start(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "qnnctl", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy(), cwd=cwd)


@pytest.mark.parametrize("count", [2, 4])
def test_concurrent_installs_download_once(mirror: FaultServer, cache_dir: Path, count: int) -> None:
    # The first GET is held open until every other process is seen waiting for the lock.
    opened = threading.Event()
    mirror.fail(PATH, Fault.gate(opened))
    procs = [_start("install") for _ in range(count)]
    stderr = _Stderr(procs)
    try:
        assert stderr.wait_for("waiting for another qnnctl", count - 1), stderr.lines
    finally:
        opened.set()
    outputs = []
    for index, proc in enumerate(procs):
        assert proc.stdout is not None
        out = proc.stdout.read()
        assert proc.wait(timeout=120) == 0, stderr.text(index)
        outputs.append(out)
    # Every process but the one that downloaded found the SDK after taking the lock (each of
    # them waited for it), and said so in one line after the wait.
    assert stderr.count(f"SDK {VERSION} is already installed in qnnctl's cache") == count - 1, stderr.lines
    assert len(mirror.requests_for(PATH)) == 1
    assert outputs == [f"{cache_dir / 'sdks' / VERSION}\n"] * count
    assert [p.name for p in (cache_dir / "sdks").iterdir()] == [VERSION]
    _assert_complete_sdk(cache_dir / "sdks" / VERSION)
    _cache_is_tidy(cache_dir)


def test_an_install_that_waited_for_another_holds_what_it_installed_to_its_sha256(mirror: FaultServer,
                                                                                   cache_dir: Path,
                                                                                   tmp_path: Path) -> None:
    """Installs at once, the others with --sha256 or in a project with a lock: each waits for the
    first's lock, then finds the SDK installed meanwhile, which is held to its --sha256 and its
    lock as one installed before would be (exit 4 for another digest), not taken because another
    qnnctl put it there."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "qnnctl.lock").write_text(f'schema = 1\n[sdk]\nversion = "{VERSION}"\nsha256 = "{"1" * 64}"\n')
    opened = threading.Event()
    mirror.fail(PATH, Fault.gate(opened))
    right = hashlib.sha256(mirror.files[PATH]).hexdigest()
    procs = [_start("install", VERSION)]
    _wait_until(lambda: bool(mirror.requests_for(PATH)), "the first install's download (it holds the lock)", procs[0])
    procs += [_start("install", VERSION, "--sha256", "0" * 64), _start("install", VERSION, "--sha256", right),
              _start("install", VERSION, cwd=project)]
    stderr = _Stderr(procs)
    try:
        assert stderr.wait_for("waiting for another qnnctl", 3), stderr.lines
    finally:
        opened.set()
    codes = [proc.wait(timeout=120) for proc in procs]
    assert codes == [0, 4, 0, 4], [stderr.text(i) for i in range(4)]
    assert f"not {'0' * 64}" in stderr.text(1), stderr.text(1)
    assert "1" * 64 in stderr.text(3), stderr.text(3)
    assert len(mirror.requests_for(PATH)) == 1


# -- killed installs ---------------------------------------------------------------------------


def _wait_until(condition: Callable[[], bool], what: str, proc: subprocess.Popen[str],
                timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"qnnctl exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.mark.stdlib
def test_sigkill_during_download_then_resume(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    spec = SdkSpec(extra_files={"docs/payload.bin": os.urandom(4 << 20)})
    data = build_archive(tmp_path / "a", "zip", spec).read_bytes()
    server.add(PATH, data)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    server.fail(PATH, Fault.slow(64 << 10, 0.05))
    part = cache_dir / "downloads" / f"v{VERSION}.zip.part"
    proc = _start("install")
    try:
        _wait_until(lambda: part.exists() and part.stat().st_size >= 1 << 20, "part of the download on disk",
                    proc)
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    kept = part.stat().st_size
    assert 0 < kept < len(data)
    assert not (cache_dir / "sdks" / VERSION).exists()

    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    resumed = server.requests_for(PATH)[-1]
    assert resumed.headers["Range"] == f"bytes={kept}-"
    manifest = _assert_complete_sdk(cache_dir / "sdks" / VERSION)
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    _cache_is_tidy(cache_dir)


@pytest.mark.stdlib
def test_sigkill_during_extraction_then_rerun(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    many = {f"share/many/d{i // 100}/f{i}.txt": b"%d" % i * 40 for i in range(2000)}
    server.add(PATH, build_archive(tmp_path / "a", "zip", SdkSpec(extra_files=many)).read_bytes())
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    proc = _start("install")
    try:
        # share/many/ is written last and takes most of the extraction.
        _wait_until(lambda: any((cache_dir / "tmp").glob(f"{VERSION}.*/x/qairt/{VERSION}/share/many")),
                    "the extraction", proc)
        proc.send_signal(signal.SIGSTOP)
        assert not (cache_dir / "sdks" / VERSION).exists(), "the install finished before it was killed"
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert list((cache_dir / "tmp").iterdir()) != []
    assert run_qnnctl("list", "--json").stdout.count('"version"') == 0

    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    assert len(server.requests_for(PATH)) == 1  # the finished download was reused
    _assert_complete_sdk(cache_dir / "sdks" / VERSION)
    _cache_is_tidy(cache_dir)  # the killed run's work folder is gone


def test_url_and_file_together_are_refused(tmp_path: Path, cache_dir: Path) -> None:
    result = run_qnnctl("install", "--url", f"http://127.0.0.1:9/v{VERSION}.zip", "--file", str(tmp_path / "a.zip"))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == "qnnctl: error: --url and --file cannot be used together\n"
    assert not (cache_dir / "sdks").exists()


@pytest.mark.parametrize("value", ["ab" * 31, "ab" * 33, "g" * 64, "a" * 62 + " b"])
def test_a_sha256_that_is_not_one_is_refused_before_anything_is_fetched(value: str, cache_dir: Path) -> None:
    """Too short, too long, 64 characters not all hex: each refused by name."""
    result = run_qnnctl("install", VERSION, "--sha256", f" {value.upper()} ")
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == f"qnnctl: error: --sha256 {value!r} is not a sha256 digest (64 hex digits)\n"
    assert not (cache_dir / "sdks").exists()


# -- the commit stage, in the tests' own process ------------------------------------------------------


def test_a_download_is_named_for_its_url_and_version() -> None:
    from qnnctl.install.commit import download_name
    from qnnctl.sdk.versions import archive_name

    assert download_name(f"https://h/a/v{VERSION}.zip?x=1", VERSION) == f"v{VERSION}.zip"
    assert download_name("https://h/a/q%20a%2Fi%40rt.zip", VERSION) == f"{VERSION}-q_a_i_rt.zip"
    assert download_name("https://h/a/.hidden.zip", VERSION) == archive_name(VERSION)
    assert download_name("https://h/", VERSION) == archive_name(VERSION)
    assert download_name("https://h/a/sdk-1_2.zip", VERSION) == f"{VERSION}-sdk-1_2.zip"


def test_a_download_holding_another_version_is_refused() -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.install.commit import require_version

    require_version(None, VERSION, "x")
    require_version(VERSION, VERSION, "x")
    with pytest.raises(IntegrityError) as refused:
        require_version(OTHER_VERSION, VERSION, "https://h/a.zip")
    assert (refused.value.message, refused.value.hint) == (
        f"https://h/a.zip holds SDK {OTHER_VERSION}, not {VERSION}",
        f"check the URL or QNNCTL_MIRROR; to install {OTHER_VERSION}, run `qnnctl install {OTHER_VERSION}` with a "
        "source that serves it")


def test_a_finished_download_is_kept_only_for_a_failure_that_is_not_its_own(tmp_path: Path) -> None:
    from qnnctl.errors import DownloadError, IntegrityError
    from qnnctl.install.commit import used_up

    files = [tmp_path / "a.zip", tmp_path / "a.zip.json"]

    def made() -> list[Path]:
        for f in files:
            f.write_text("x")
        return files

    with used_up(*made()):
        pass
    assert not any(f.exists() for f in files)
    with pytest.raises(IntegrityError), used_up(*made()):
        raise IntegrityError("bad")
    assert not any(f.exists() for f in files)
    with pytest.raises(DownloadError), used_up(*made()):
        raise DownloadError("cut")
    assert all(f.exists() for f in files)
    files[1].unlink()
    with used_up(*files):  # one of them gone already
        pass
    assert not files[0].exists()


def test_what_a_killed_install_left_is_removed_by_the_next(tmp_path: Path) -> None:
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.work import remove_stale_work, work_id

    cache = Cache(tmp_path / "cache")
    remove_stale_work(cache, VERSION)  # no tmp/ yet
    for name in (f"{VERSION}.{work_id()}", f"{VERSION}.x/deep", f"{VERSION}x", f"{OTHER_VERSION}.1", "file.1"):
        (cache.tmp / name).mkdir(parents=True)
    remove_stale_work(cache, VERSION)
    assert {p.name for p in cache.tmp.iterdir()} == {f"{VERSION}x", f"{OTHER_VERSION}.1", "file.1"}
    assert len(work_id()) == 12
    assert work_id() != work_id()


def test_the_version_lock_says_what_it_waits_for(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from filelock import FileLock, Timeout

    from qnnctl.sdk import work
    from qnnctl.sdk.cache import Cache

    cache = Cache(tmp_path / "cache")

    def held_elsewhere(key: str, seconds: float) -> threading.Event:
        """The lock of `key` taken by another thread, released after `seconds`; set once taken."""
        taken = threading.Event()

        def hold() -> None:
            with FileLock(str(cache.lock_path(key))):
                taken.set()
                time.sleep(seconds)

        threading.Thread(target=hold, daemon=True).start()
        assert taken.wait(10)
        return taken

    def try_lock(key: str) -> bool:
        result: list[bool] = []

        def attempt() -> None:
            try:
                FileLock(str(cache.lock_path(key))).acquire(timeout=0)
            except Timeout:
                result.append(False)
            else:
                result.append(True)

        thread = threading.Thread(target=attempt)
        thread.start()
        thread.join()
        return result[0]

    with work.version_lock(cache, VERSION):
        assert not try_lock(VERSION)
    assert try_lock(VERSION)  # released
    monkeypatch.setattr(work, "LOCK_WAIT_NOTICE", 0.05)
    held_elsewhere("file", 0.5)
    with caplog.at_level("INFO", logger="qnnctl.sdk.work"), work.version_lock(cache, "file", "installing a file"):
        pass
    assert caplog.messages == ["waiting for another qnnctl to finish installing a file"]
    caplog.clear()
    held_elsewhere("file", 0.5)
    with caplog.at_level("INFO", logger="qnnctl.sdk.work"), work.version_lock(cache, "file"):
        pass
    assert caplog.messages == ["waiting for another qnnctl to finish installing file"]
    caplog.clear()
    with caplog.at_level("INFO", logger="qnnctl.sdk.work"), work.version_lock(cache, "file"):
        pass
    assert caplog.messages == []
    # Held by another qnnctl: the notice names its process.
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from pathlib import Path\n"
                               "from qnnctl.sdk.cache import Cache\n"
                               "from qnnctl.sdk.work import version_lock\n"
                               "with version_lock(Cache(Path(sys.argv[1])), sys.argv[2]):\n"
                               "    print('held', flush=True)\n"
                               "    time.sleep(0.5)\n", str(cache.root), VERSION],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        with caplog.at_level("INFO", logger="qnnctl.sdk.work"), work.version_lock(cache, VERSION):
            pass
    finally:
        holder.kill()
        holder.wait()
    assert caplog.messages == [f"waiting for another qnnctl (process {holder.pid}) to finish installing {VERSION}"]
    assert not cache.lock_path(VERSION).with_suffix(".pid").exists()  # gone with its holder's lock


def test_the_digest_of_a_zips_directory_goes_into_the_manifest(tmp_path: Path) -> None:
    import zipfile

    from qnnctl.install.commit import directory_digest

    archive = build_archive(tmp_path, "zip", SdkSpec())
    with zipfile.ZipFile(archive) as zf:
        start = zf.start_dir
    data = archive.read_bytes()
    assert directory_digest(archive) == {
        "central_directory_sha256": hashlib.sha256(data[start:len(data) - 22]).hexdigest()}
    assert directory_digest(build_archive(tmp_path / "t", "tar.gz", SdkSpec())) is None


def test_an_extracted_sdk_is_what_its_libraries_say(tmp_path: Path) -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.install.commit import identify

    build = f"v{VERSION}101010"
    root = build_sdk_tree(tmp_path / "a", SdkSpec(build_id=build))
    assert identify(root, VERSION, None, "a.zip") == (VERSION, f"{VERSION}101010")
    assert identify(root, None, None, "a.zip") == (VERSION, f"{VERSION}101010")
    with pytest.raises(IntegrityError) as refused:
        identify(root, OTHER_VERSION, None, "a.zip")
    assert refused.value.message == (f"a.zip says it is SDK {OTHER_VERSION} (its top folder), but its libraries are "
                                     f"build {VERSION}101010: SDK {VERSION}")
    assert refused.value.hint == (f"check where the archive came from; to install it as what its libraries are, "
                                  f"name that version: `qnnctl install {VERSION} ...`; nothing was installed")
    assert identify(root, OTHER_VERSION, VERSION, "a.zip") == (VERSION, f"{VERSION}101010")  # named by the user
    with pytest.raises(IntegrityError, match=f"^a.zip says it is SDK {OTHER_VERSION} "):
        identify(root, OTHER_VERSION, OTHER_VERSION, "a.zip")
    (root / "sdk.yaml").write_text("version: 2.31.0.250130\n")
    with pytest.raises(IntegrityError) as both:
        identify(root, OTHER_VERSION, None, "a.zip")
    assert both.value.message.startswith(f"a.zip says it is SDK 2.31.0.250130, {OTHER_VERSION} (its top folder and "
                                         "its sdk.yaml), but")
    with pytest.raises(IntegrityError, match=r"^a.zip says it is SDK 2.31.0.250130 \(its sdk.yaml\), but"):
        identify(root, VERSION, None, "a.zip")
    # Libraries without a build id: taken at the word of the top folder, then of sdk.yaml.
    plain = build_sdk_tree(tmp_path / "b", SdkSpec())
    assert identify(plain, OTHER_VERSION, None, "b.zip") == (OTHER_VERSION, None)
    assert identify(plain, None, None, "b.zip") == (VERSION, None)
    (plain / "sdk.yaml").unlink()
    assert identify(plain, None, None, "b.zip") == (None, None)
    assert identify(plain, "", None, "b.zip") == (None, None)


def test_commit_writes_the_manifest_and_moves_the_sdk_into_place(tmp_path: Path, cache_dir: Path) -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.install.commit import commit
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.layout import Sdk

    cache = Cache(cache_dir)
    work = tmp_path / "w"
    root = build_sdk_tree(work / "sdk", SdkSpec())
    (root / MANIFEST_NAME).write_text('{"theirs": 1}')  # the archive's, not ours: not counted
    installed = commit(root, VERSION, "https://h/a.zip", "a" * 64, 10, {"lib/a": "d", MANIFEST_NAME: "e"}, 100 + 13,
                       cache, False, work, build="b1", extra={"partial": True})
    destination = cache_dir / "sdks" / VERSION
    assert installed == Sdk(destination, VERSION, "qnnctl cache")
    assert not root.exists()
    manifest = read_manifest(destination)
    assert manifest is not None
    installed_at = manifest.pop("installed_at")
    assert datetime.strptime(installed_at, "%Y-%m-%dT%H:%M:%SZ")
    assert manifest == {"schema": 1, "version": VERSION, "build_id": "b1", "source": "https://h/a.zip",
                        "sha256": "a" * 64, "size": 10, "unpacked_size": 100, "file_count": 1,
                        "files": {"lib/a": "d"}, "qnnctl_version": qnnctl.__version__, "partial": True}
    # Complete at its place already, and no --force: kept as it is.
    again = build_sdk_tree(work / "again", SdkSpec())
    assert commit(again, VERSION, "s", None, 1, {}, 1, cache, False, work) == installed
    assert again.exists()
    assert read_manifest(destination) == {**manifest, "installed_at": installed_at}
    # --force: the new folder takes its place, the old one goes to the work folder.
    assert commit(again, VERSION, "s2", None, 1, {}, 1, cache, True, work) == installed
    assert (read_manifest(destination) or {})["source"] == "s2"
    assert (read_manifest(again) or {})["source"] == "https://h/a.zip"
    # An incomplete SDK at its place is replaced without --force.
    shutil.rmtree(destination / LIB)
    third = build_sdk_tree(work / "third", SdkSpec())
    commit(third, VERSION, "s3", None, 1, {}, 1, cache, False, work)
    assert (read_manifest(destination) or {})["source"] == "s3"
    broken = build_sdk_tree(work / "broken", SdkSpec())
    (broken / LIB / "libQnnHtp.so").unlink()
    with pytest.raises(IntegrityError) as refused:
        commit(broken, VERSION, "s", None, 1, {}, 1, cache, True, work)
    assert (refused.value.message, refused.value.hint) == (
        f"the archive's SDK is incomplete: missing {LIB}/libQnnHtp.so",
        "the archive may be truncated or not a QAIRT SDK for Linux; nothing was installed")


def test_a_tree_committed_has_the_modes_qnnctl_installs_with_whatever_it_had(tmp_path: Path) -> None:
    """Folders 0755, files 0644 or, with any exec bit, 0755: never writable by the group or
    others. Links keep theirs and are not followed: what they point to outside is not changed."""
    from qnnctl.install.commit import settle_modes

    root = tmp_path / "sdk"
    (root / "lib" / "deep").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "theirs").write_text("")
    modes = {"lib/open.so": 0o666, "lib/deep/run": 0o775, "lib/mine": 0o700, "lib/deep/private": 0o600,
             "plain": 0o644, "tool": 0o755, "x-by-others": 0o601, "setuid": 0o4755}
    for name, mode in modes.items():
        (root / name).write_text(name)
        (root / name).chmod(mode)
    (root / "to-theirs").symlink_to(outside / "theirs")
    (root / "to-outside").symlink_to(outside)
    for folder, mode in ((root, 0o777), (root / "lib", 0o700), (root / "lib" / "deep", 0o775)):
        folder.chmod(mode)
    (outside / "theirs").chmod(0o666)
    outside.chmod(0o777)
    settle_modes(root)
    assert {name: stat.S_IMODE((root / name).stat().st_mode) for name in modes} == {
        "lib/open.so": 0o644, "lib/deep/run": 0o755, "lib/mine": 0o755, "lib/deep/private": 0o644,
        "plain": 0o644, "tool": 0o755, "x-by-others": 0o755, "setuid": 0o755}
    assert [stat.S_IMODE(f.stat().st_mode) for f in (root, root / "lib", root / "lib" / "deep")] == [0o755] * 3
    assert stat.S_IMODE((outside / "theirs").stat().st_mode) == 0o666
    assert stat.S_IMODE(outside.stat().st_mode) == 0o777
    outside.chmod(0o755)


def test_folders_given_by_relative_paths_are_exchanged_in_one_step(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """renameat2 resolves relative paths against the current folder (AT_FDCWD), as os.replace does."""
    from qnnctl.install import commit

    monkeypatch.chdir(tmp_path)
    for name in ("new", "old"):
        Path(name).mkdir()
        Path(name, "x").write_text(name)
    commit.exchange(Path("new"), Path("old"))
    assert (Path("old/x").read_text(), Path("new/x").read_text()) == ("new", "old")


def test_an_exchange_that_fails_says_why_and_moves_nothing(tmp_path: Path) -> None:
    """A failure other than "not supported here" is the kernel's own, with its errno, and nothing
    is moved aside (the two-step way would lose `new` to a missing `old`)."""
    import errno

    from qnnctl.install import commit

    folder = tmp_path / "exchanged"
    (folder / "new").mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as failed:
        commit.exchange(folder / "new", folder / "missing")
    assert (failed.value.errno, failed.value.strerror, failed.value.filename) == (
        errno.ENOENT, os.strerror(errno.ENOENT), str(folder / "missing"))
    assert sorted(p.name for p in folder.iterdir()) == ["new"]


def test_folders_are_exchanged_in_two_steps_where_the_kernel_cannot_in_one(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from qnnctl.install import commit

    def folders() -> tuple[Path, Path]:
        new, old = tmp_path / "new", tmp_path / "old"
        for folder, text in ((new, "new"), (old, "old")):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            (folder / "x").write_text(text)
        return new, old

    commit.exchange(*folders())
    assert ((tmp_path / "old/x").read_text(), (tmp_path / "new/x").read_text()) == ("new", "old")

    class NoExchange:
        def __init__(self, error: int) -> None:
            self.error = error

        def renameat2(self, *args: object) -> int:
            ctypes.set_errno(self.error)
            return -1

    for error in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        monkeypatch.setattr(commit, "_libc", lambda error=error: NoExchange(error))
        commit.exchange(*folders())
        assert ((tmp_path / "old/x").read_text(), (tmp_path / "new/x").read_text()) == ("new", "old")
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".old")) == []
    monkeypatch.setattr(commit, "_libc", lambda: NoExchange(errno.EACCES))
    with pytest.raises(PermissionError) as failed:
        commit.exchange(*folders())
    assert failed.value.filename == str(tmp_path / "old")
    assert (tmp_path / "old/x").read_text() == "old"
    monkeypatch.setattr(commit, "_libc", lambda: None)
    commit.exchange(*folders())
    assert ((tmp_path / "old/x").read_text(), (tmp_path / "new/x").read_text()) == ("new", "old")


@pytest.mark.parametrize("way", ["download", "file"])
def test_a_lock_whose_sha256_is_right_and_central_directory_wrong_is_refused(
        server: FaultServer, tmp_path: Path, cache_dir: Path, way: str) -> None:
    """The archive is the one the lock pins, its central directory is not the one the lock pins
    beside it: an edited lock, which vouches for nothing (exit 4, nothing installed)."""
    archive = build_archive(tmp_path, "zip")
    server.add(PATH, archive.read_bytes())
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    fields = directory_digest(archive)
    assert fields is not None
    directory = fields["central_directory_sha256"]
    project = tmp_path / "project"
    project.mkdir()
    digests = "".join(f'{name} = "{digest}"\n' for name, digest in sorted(zip_digests(archive).items()))
    (project / "qnnctl.lock").write_text(f'schema = 2\n[sdk]\nversion = "{VERSION}"\nsha256 = "{sha256}"\n'
                                         f'central_directory_sha256 = "{"0" * 64}"\n'
                                         f"[sdk.component_sha256]\n{digests}")
    given = ("--file", str(archive)) if way == "file" else ()
    refused = run_qnnctl("install", VERSION, "--locked", *given, cwd=project,
                         env={**os.environ, "QNNCTL_MIRROR": server.base})
    assert refused.returncode == 4, refused.stderr
    assert (f"its central directory's sha256 is {directory}, and the lock pins {'0' * 64}; nothing was "
            "installed") in refused.stderr, refused.stderr
    assert "qnnctl.lock contradicts itself" in refused.stderr
    assert not (cache_dir / "sdks" / VERSION).exists()


def test_a_lock_whose_sha256_is_right_and_size_wrong_refuses_the_download_before_it_is_read(
        server: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    """The bytes served are the ones the lock's sha256 pins, their size is not the one it pins
    beside it: refused as they are, before anything reads them as an archive (here they are none)."""
    page = b"<p>not an archive</p>" * 100
    server.add(PATH, page)
    sha256 = hashlib.sha256(page).hexdigest()
    project = tmp_path / "project"
    project.mkdir()
    (project / "qnnctl.lock").write_text(f'schema = 2\n[sdk]\nversion = "{VERSION}"\nsha256 = "{sha256}"\n'
                                         f"size = {len(page) + 1}\n")
    refused = run_qnnctl("install", VERSION, "--locked", cwd=project, env={**os.environ, "QNNCTL_MIRROR": server.base})
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("qnnctl: error: ")]
    assert errors == [f"qnnctl: error: {project / 'qnnctl.lock'} contradicts itself: the archive from "
                      f"{server.base}{PATH} has the sha256 the lock pins, but its size is {len(page)}, and the lock "
                      f"pins {len(page) + 1}; nothing was installed"], refused.stderr
    assert not (cache_dir / "sdks" / VERSION).exists()


_MODULES_AT_EXIT = r"""
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from qnnctl.launch import main
main()
"""


def test_an_install_without_runtime_imports_no_staging(tmp_path: Path, cache_dir: Path) -> None:
    """The host runtime's staging, and the readers of Debian's and RPM's packages it brings, are
    for `--runtime`: every other install paid for their imports before its download started."""
    archive = build_archive(tmp_path, "zip", SdkSpec())
    modules = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", _MODULES_AT_EXIT, str(modules), "install", "--file", str(archive)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(modules.read_text())
    assert "qnnctl.install.pipeline" in loaded
    staging = ("qnnctl.host.runtime", "qnnctl.host.build", "qnnctl.host.packages", "qnnctl.host.sources",
               "qnnctl.host.llvm", "debian", "rpmfile", "arpy")
    assert [m for m in loaded if any(m == name or m.startswith(name + ".") for name in staging)] == []


def test_a_download_without_a_bar_imports_neither_tqdm_nor_filelock(mirror: FaultServer, cache_dir: Path,
                                                                   tmp_path: Path) -> None:
    """The bar is drawn on a terminal only (here stderr is a pipe), and the install lock is
    flock(2) itself: from a cold page cache, the two imports were about 45 ms of every install's
    start (bench/README.md)."""
    modules = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", _MODULES_AT_EXIT, str(modules), "install", VERSION],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "downloading" in proc.stderr.lower(), proc.stderr  # the lines, in place of a bar
    loaded = json.loads(modules.read_text())
    assert "qnnctl.net.download" in loaded
    assert "qnnctl.sdk.work" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("tqdm", "filelock")] == []


@pytest.mark.parametrize("way", ["download", "file"])
def test_what_an_install_writes_is_checked_as_written_never_read_back(
        way: str, mirror: FaultServer, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The components' digests are taken over the sha256 of each file as it was written: nothing
    is read back from the disk to be hashed again (the check would then be of another read, and
    hash a 1-2 GB SDK twice)."""
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk import members
    from qnnctl.sdk.cache import Cache

    read_back: list[str] = []

    def read_again(path: str) -> str:
        read_back.append(path)
        return "0" * 64

    monkeypatch.setattr(members, "_file_sha256", read_again)
    archive = tmp_path / "v.zip"
    archive.write_bytes(mirror.files[PATH])
    request = InstallRequest(spec=VERSION) if way == "download" else InstallRequest(file=archive)
    env = dict(os.environ)
    result = install(request, Cache(cache_dir), env, Path.cwd(), vouchers(env, Path.cwd()))
    assert result.action == "installed"
    assert read_back == []
    manifest = read_manifest(cache_dir / "sdks" / VERSION)
    assert manifest is not None
    assert manifest["component_sha256"]


@pytest.mark.parametrize(("mirror_url", "scheme"), [("ftp://mirror.example/qairt", "ftp"),
                                                      ("file:///srv/qairt", "file")])
def test_a_mirror_no_download_can_start_from_is_refused_before_anything(cache_dir: Path, mirror_url: str,
                                                                        scheme: str) -> None:
    """A reinstall behind a QNNCTL_MIRROR that is no https or http URL (a mirror is a server, never a
    folder here: `qnnctl install --file` takes an archive on disk): that is what was typed
    wrong, said first (exit 2), before the SDK installed is looked at (here held by a running
    process, which would be exit 1) or any lock is taken."""
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.holds import hold_sdk
    from tests.sdkfactory import install_tree_into_cache

    root = install_tree_into_cache(cache_dir, VERSION)
    fd = hold_sdk(root, Cache(cache_dir))
    assert fd is not None
    try:
        proc = run_qnnctl("install", VERSION, "--force",
                          env={**os.environ, "QNNCTL_MIRROR": mirror_url})
    finally:
        os.close(fd)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.startswith(f"qnnctl: error: QNNCTL_MIRROR {mirror_url}: qnnctl downloads over https or "
                                  f"http, not {scheme}:\n"), proc.stderr
