"""Fleets: qnnctl.lock, read-only shared stores, links to existing SDK folders, a mirror made by
`qnnctl mirror`, and `uninstall --except`/`--all`. Real processes of the entry point, a real
loopback server (and Python's own http.server for the mirror), archives built at test time."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from qnnctl.install.archive import zip_digests
from qnnctl.paths import tree_size
from qnnctl.sdk.cache import Cache, read_manifest
from qnnctl.sdk.lockfile import read_lock
from qnnctl.sdk.select import find_installed
from qnnctl.sdk.vouchers import vouchers
from tests.conftest import run_qnnctl, start_qnnctl_waiting
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import OTHER_VERSION, VERSION, SdkSpec, build_archive, build_sdk_tree, install_tree_into_cache

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PATH = f"/{VERSION}/v{VERSION}.zip"
BUILD = f"v{VERSION}101010"  # as the libraries carry it
THIRD = "2.31.0.250130"


@pytest.fixture(autouse=True)
def _known_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Name the CPU vendor, so that no doctor run waits for py-cpuinfo."""
    monkeypatch.setenv("QNNCTL_FORCE_CPU_VENDOR", "GenuineIntel")


def _archive(folder: Path, version: str = VERSION, payload: bytes = b"first") -> bytes:
    folder.mkdir(parents=True, exist_ok=True)
    spec = SdkSpec(version=version, build_id=f"v{version}101010", extra_files={"docs/payload.bin": payload})
    return build_archive(folder, "zip", spec).read_bytes()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checks(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    return {c["id"]: c for c in json.loads(result.stdout)["checks"]}


def _comment(text: str) -> str:
    """The lock file's comment as one line."""
    return " ".join(line.removeprefix("#").strip() for line in text.splitlines() if line.startswith("#"))


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path below `root` with its mode, size and modification time."""
    found = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        found[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def _nothing_installed(cache_dir: Path, version: str = VERSION) -> None:
    assert not (cache_dir / "sdks" / version).exists()
    downloads = cache_dir / "downloads"
    assert not downloads.is_dir() or not [p for p in downloads.iterdir() if p.suffix == ".zip"]


# -- qnnctl.lock -------------------------------------------------------------------------------


def _install_and_lock(tmp_path: Path) -> tuple[Path, Path]:
    """The default SDK installed from an archive built in `tmp_path`, and the project's lock
    written for it: (the archive, the lock)."""
    archive = build_archive(tmp_path, "zip")
    assert run_qnnctl("install", "--file", str(archive)).returncode == 0
    made = run_qnnctl("lock", VERSION)
    assert made.returncode == 0, made.stderr
    return archive, Path(made.stdout.strip())


def _installed_from_another_archive(cache_dir: Path) -> None:
    """Make the SDK installed one that came from another archive than the one locked."""
    manifest_path = cache_dir / "sdks" / VERSION / ".qnnctl.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))


def test_lock_from_a_download_and_a_tampered_mirror_archive(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    good = _archive(tmp_path / "good")
    server.add(f"/qairt{PATH}", good)
    # A password in the mirror's URL is sent, and never written into the lock.
    monkeypatch.setenv("QNNCTL_MIRROR", server.base.replace("http://", "http://ci:s3cret@") + "/qairt")
    project = Path.cwd()
    assert run_qnnctl("use", VERSION).returncode == 0
    sub = project / "src"
    sub.mkdir()
    made = run_qnnctl("lock", cwd=sub)
    assert made.returncode == 0, made.stderr
    lock_path = project / "qnnctl.lock"  # beside .qnn-version, not in the folder it ran in
    assert made.stdout == f"{lock_path}\n"
    assert "qnnctl: trust on first use: these values were computed from the archive qnnctl downloaded" in made.stderr
    text = lock_path.read_text()
    assert "s3cret" not in text
    assert "Trust on first use: Qualcomm publishes no checksums" in _comment(text)
    data = tomllib.loads(text)
    assert data["schema"] == 2
    assert data["sdk"]["version"] == VERSION
    assert data["sdk"]["sha256"] == _sha256(good)
    assert data["sdk"]["size"] == len(good)
    assert data["sdk"]["build_id"] == BUILD[1:]
    assert data["sdk"]["urls"] == [f"http://***@{server.base.removeprefix('http://')}/qairt{PATH}"]
    # The archive's central directory, which installs of some components check (install --components).
    from qnnctl.install.zipindex import central_directory_sha256, end_records

    records = end_records(good, len(good))
    assert data["sdk"]["central_directory_sha256"] == central_directory_sha256(
        lambda offset, size: good[offset:offset + size], records)
    # And each component's digest, computed from the whole archive: what an install by parts is
    # checked against, as strictly as a whole one.
    (tmp_path / "good.zip").write_bytes(good)
    assert data["sdk"]["component_sha256"] == zip_digests(tmp_path / "good.zip")
    assert set(data["sdk"]["component_sha256"]) >= {"host", "android"}
    # It installed the SDK it locked.
    assert (cache_dir / "sdks" / VERSION / ".qnnctl.json").is_file()
    checked = run_qnnctl("lock", "--check", cwd=sub)
    assert checked.returncode == 0, checked.stderr
    assert "matches" in checked.stderr

    # The mirror's archive is replaced by another with the same name, and the same size (a longer
    # one is stopped at the size the lock pins: tests/install/test_endless_body.py).
    assert run_qnnctl("uninstall", VERSION).returncode == 0
    server.add(f"/qairt{PATH}", _archive(tmp_path / "bad", payload=b"fake!"))
    tampered = run_qnnctl("install", cwd=sub)
    assert tampered.returncode == 4, tampered.stderr
    assert f"does not match {lock_path}" in tampered.stderr
    assert _sha256(good) in tampered.stderr
    assert tampered.stdout == ""
    _nothing_installed(cache_dir)
    # As is an archive on disk that does not match.
    bad_file = tmp_path / "bad" / f"v{VERSION}.zip"
    from_file = run_qnnctl("install", "--file", str(bad_file))
    assert from_file.returncode == 4, from_file.stderr
    assert "does not match" in from_file.stderr
    _nothing_installed(cache_dir)


@pytest.mark.stdlib
def test_lock_of_an_installed_sdk_comes_from_its_manifest(mirror: FaultServer, cache_dir: Path) -> None:
    assert run_qnnctl("install", VERSION).returncode == 0
    manifest = read_manifest(cache_dir / "sdks" / VERSION)
    assert manifest is not None
    before = len(mirror.requests)
    made = run_qnnctl("lock", VERSION)
    assert made.returncode == 0, made.stderr
    assert len(mirror.requests) == before  # no download: the manifest has the values
    data = tomllib.loads(Path(made.stdout.strip()).read_text())
    assert data["sdk"]["sha256"] == manifest["sha256"]
    assert data["sdk"]["size"] == manifest["size"]
    assert f"recorded when SDK {VERSION} was installed from" in _comment(Path(made.stdout.strip()).read_text())
    assert "no .qnn-version pins" in made.stderr


def test_a_download_against_a_lock_that_contradicts_itself_is_refused_naming_where_it_came_from(
        mirror: FaultServer, cache_dir: Path) -> None:
    """The archive's sha256 is the one the lock pins, a component's digest is not: an edited lock,
    refused after the download is unpacked, naming the URL it came from; nothing installed."""
    assert run_qnnctl("install", VERSION).returncode == 0
    made = run_qnnctl("lock", VERSION)
    assert made.returncode == 0, made.stderr
    lock = Path(made.stdout.strip())
    host = tomllib.loads(lock.read_text())["sdk"]["component_sha256"]["host"]
    lock.write_text(lock.read_text().replace(host, "e" * 64))
    assert run_qnnctl("uninstall", VERSION).returncode == 0
    refused = run_qnnctl("install", VERSION, "--locked")
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    assert (f"qnnctl: error: {lock} contradicts itself: the archive from {mirror.url(PATH)} has the sha256 the "
            f"lock pins, but the digest of its component host is {host}, and the lock pins {'e' * 64}; nothing was "
            "installed\n") in refused.stderr, refused.stderr
    _nothing_installed(cache_dir)


def test_lock_check_doctor_and_install_against_a_lock_that_disagrees(mirror: FaultServer, cache_dir: Path) -> None:
    missing = run_qnnctl("lock", "--check")
    assert missing.returncode == 1
    assert "there is no qnnctl.lock" in missing.stderr
    doctor = run_qnnctl("doctor", "--json", "--offline")
    assert _checks(doctor)["lock"]["status"] == "skip"

    assert run_qnnctl("use", VERSION).returncode == 0
    assert run_qnnctl("lock").returncode == 0
    matching = _checks(run_qnnctl("doctor", "--json", "--offline"))["lock"]
    assert matching["status"] == "ok", matching
    assert matching["detail"].startswith("matching: ")

    # Stale: the project now selects another version.
    assert run_qnnctl("use", OTHER_VERSION).returncode == 0
    stale = run_qnnctl("lock", "--check")
    assert stale.returncode == 1
    assert f"pins SDK {VERSION}, not {OTHER_VERSION}" in stale.stderr
    assert f"qnnctl use {VERSION}" in stale.stderr
    check = _checks(run_qnnctl("doctor", "--json", "--offline"))["lock"]
    assert check["status"] == "warn"
    assert check["detail"].startswith("stale: ")
    locked = run_qnnctl("install", "--locked")
    assert locked.returncode == 1
    assert f"pins SDK {VERSION}, not {OTHER_VERSION}" in locked.stderr

    # The installed SDK came from another archive than the one locked.
    assert run_qnnctl("use", VERSION).returncode == 0
    manifest_path = cache_dir / "sdks" / VERSION / ".qnnctl.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    differs = run_qnnctl("lock", "--check")
    assert differs.returncode == 1
    assert "0" * 64 in differs.stderr
    assert _checks(run_qnnctl("doctor", "--json", "--offline"))["lock"]["status"] == "fail"
    reused = run_qnnctl("install")
    assert reused.returncode == 4, reused.stderr
    assert reused.stdout == ""


@pytest.mark.parametrize("body", [
    "urls = " + "[" * 5000 + "]" * 5000,  # the parser recurses once a level
    "urls = [" + "{ a = [" * 2500 + "1" + "] }" * 2500 + "]",
    "urls = [\"" + "[" * 5000 + "\"]\n# " + "x" * (1 << 20),  # brackets in a string count for nothing; size does
])
def test_a_lock_too_deep_or_too_big_is_refused_naming_it(body: str, mirror: FaultServer, cache_dir: Path) -> None:
    """A qnnctl.lock in a folder above the project, built to exhaust the parser: every command
    that reads it refuses with exit 1 and the file's name, never a traceback."""
    (Path.cwd() / "project").mkdir()
    lock = Path.cwd() / "qnnctl.lock"
    lock.write_text(f'schema = 1\n\n[sdk]\nversion = "{VERSION}"\nsha256 = "{"0" * 64}"\n{body}\n')
    project = Path.cwd() / "project"
    for args in (("lock", "--check"), ("install", VERSION), ("install", "--locked")):
        result = run_qnnctl(*args, cwd=project)
        assert result.returncode == 1, result.stderr
        assert str(lock) in result.stderr
        assert "Traceback" not in result.stderr
        assert "RecursionError" not in result.stderr
    check = _checks(run_qnnctl("doctor", "--json", "--offline", cwd=project))["lock"]
    assert check["status"] == "fail", check
    assert str(lock) in check["detail"]
    assert mirror.requests == []
    _nothing_installed(cache_dir)


def test_brackets_in_a_locks_strings_and_comments_nest_nothing(tmp_path: Path) -> None:
    deep = "[{" * 20
    lock = tmp_path / "qnnctl.lock"
    lock.write_text(f'schema = 1  # {deep}\n[sdk]\nversion = "{VERSION}"\nsha256 = "{"0" * 64}"\n'
                    f'urls = ["{deep}\\"{deep}", \'{deep}\\\', """{deep}\n{deep}""", \'\'\'{deep}\'\'\']\n')
    assert read_lock(lock).urls == (f'{deep}"{deep}', f"{deep}\\", f"{deep}\n{deep}", deep)


def test_install_locked_without_a_lock_fails_before_anything(mirror: FaultServer, cache_dir: Path) -> None:
    result = run_qnnctl("install", "--locked", VERSION)
    assert result.returncode == 1
    assert "--locked: there is no qnnctl.lock" in result.stderr
    assert "qnnctl lock" in result.stderr
    assert mirror.requests == []
    _nothing_installed(cache_dir)
    # Before an archive on disk is even read: this one is no archive at all (else exit 4).
    garbage = Path.cwd() / f"v{VERSION}.zip"
    garbage.write_bytes(b"not a zip")
    from_file = run_qnnctl("install", "--locked", "--file", str(garbage))
    assert from_file.returncode == 1, from_file.stderr
    assert "--locked: there is no qnnctl.lock" in from_file.stderr


def test_install_file_of_a_version_installed_already_is_checked_against_the_lock(cache_dir: Path,
                                                                                 tmp_path: Path) -> None:
    archive, lock = _install_and_lock(tmp_path)
    _installed_from_another_archive(cache_dir)
    reused = run_qnnctl("install", VERSION, "--file", str(archive))
    assert reused.returncode == 4, reused.stderr
    assert reused.stdout == ""
    assert reused.stderr.endswith(f"qnnctl: hint: reinstall the locked archive: `qnnctl install --force {VERSION}`, "
                                  "or, if the SDK in use is the one to trust, write the lock again: "
                                  f"`qnnctl lock {VERSION}`\n")
    # Without the version, which the archive then tells: it is checked all the same, after
    # the warning that the SDK installed came from another archive.
    unnamed = run_qnnctl("install", "--file", str(archive))
    assert (unnamed.returncode, unnamed.stdout) == (4, ""), unnamed.stderr
    assert (f"qnnctl: warning: SDK {VERSION} is installed already, from another archive than {archive} "
            f"(sha256 {'0' * 64}, not {_sha256(archive.read_bytes())}); it is left as it is: "
            f"`qnnctl install {VERSION} --force --file {archive}` replaces it\n") in unnamed.stderr
    assert unnamed.stderr.endswith(reused.stderr.splitlines(keepends=True)[-1])
    # --locked, for another version installed already: the lock pins this one.
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    other = tmp_path / f"v{OTHER_VERSION}.zip"
    other.write_bytes(b"never read: the version is installed")
    locked = run_qnnctl("install", OTHER_VERSION, "--file", str(other), "--locked")
    assert locked.returncode == 1, locked.stderr
    assert locked.stderr == (f"qnnctl: error: --locked: {lock} pins SDK {VERSION}, not {OTHER_VERSION}\n"
                             f"qnnctl: hint: install {VERSION} (`qnnctl use {VERSION}` pins it for the project), "
                             f"or lock {OTHER_VERSION} with `qnnctl lock {OTHER_VERSION}`\n")


def test_install_file_is_checked_against_the_lock(cache_dir: Path, tmp_path: Path) -> None:
    """The locked archive installs from a file; another of the same version is refused, with
    its sha256 and the lock's."""
    archive, lock = _install_and_lock(tmp_path)
    assert run_qnnctl("uninstall", VERSION).returncode == 0
    again = run_qnnctl("install", "--file", str(archive))
    assert (again.returncode, again.stdout) == (0, f"{cache_dir / 'sdks' / VERSION}\n"), again.stderr
    assert run_qnnctl("uninstall", VERSION).returncode == 0
    other = tmp_path / "other" / f"v{VERSION}.zip"
    data = _archive(other.parent, payload=b"another build")
    refused = run_qnnctl("install", "--file", str(other))
    assert refused.returncode == 4, refused.stderr
    assert (f"qnnctl: error: the archive from {other} does not match {lock}: its sha256 is {_sha256(data)}, "
            f"the lock pins {_sha256(archive.read_bytes())}; nothing was installed\n") in refused.stderr
    _nothing_installed(cache_dir)


def test_install_file_is_held_to_the_size_the_lock_pins_too(cache_dir: Path, tmp_path: Path) -> None:
    """A lock whose sha256 is the archive's but whose size is not contradicts itself: an edited lock
    vouches for nothing, and the file is refused, naming both sizes."""
    archive, lock = _install_and_lock(tmp_path)
    assert run_qnnctl("uninstall", VERSION).returncode == 0
    size = archive.stat().st_size
    text = lock.read_text()
    assert f"size = {size}\n" in text
    lock.write_text(text.replace(f"size = {size}\n", f"size = {size + 1}\n"))
    refused = run_qnnctl("install", "--file", str(archive))
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    assert (f"{lock} contradicts itself: the archive from {archive} has the sha256 the lock pins, but its size is "
            f"{size}, and the lock pins {size + 1}") in refused.stderr, refused.stderr
    _nothing_installed(cache_dir)


def test_an_install_without_the_lock_check_takes_a_file_the_lock_would_refuse(cache_dir: Path,
                                                                             tmp_path: Path) -> None:
    """`check_lock` off (how `qnnctl lock` installs what it is about to pin): no lock is consulted."""
    from qnnctl.install.pipeline import InstallRequest, install

    _install_and_lock(tmp_path)
    assert run_qnnctl("uninstall", VERSION).returncode == 0
    other = tmp_path / "other" / f"v{VERSION}.zip"
    data = _archive(other.parent, payload=b"another build")
    result = install(InstallRequest(file=other), Cache(cache_dir), dict(os.environ), Path.cwd(),
                     vouchers(os.environ, Path.cwd(), lock=False))
    assert result.action == "installed"
    assert result.sdk is not None
    manifest = read_manifest(result.sdk.root)
    assert manifest is not None
    assert manifest["sha256"] == _sha256(data)


def test_an_installed_sdk_the_lock_disagrees_with_is_locked_again(cache_dir: Path, tmp_path: Path) -> None:
    """The hint of a mismatch offers `qnnctl lock VERSION` when the SDK in use is the one to
    trust: it writes the lock from that SDK, which the old lock does not stop."""
    _, lock = _install_and_lock(tmp_path)
    _installed_from_another_archive(cache_dir)
    assert run_qnnctl("install", VERSION).returncode == 4
    again = run_qnnctl("lock", VERSION)
    assert (again.returncode, again.stdout) == (0, f"{lock}\n"), again.stderr
    assert tomllib.loads(lock.read_text())["sdk"]["sha256"] == "0" * 64
    reused = run_qnnctl("install", VERSION)
    assert (reused.returncode, reused.stdout) == (0, f"{cache_dir / 'sdks' / VERSION}\n"), reused.stderr


def test_the_lock_being_written_is_not_checked_against_the_one_it_replaces(cache_dir: Path,
                                                                           tmp_path: Path) -> None:
    """`qnnctl lock` installs an SDK it does not find; one installed meanwhile by another qnnctl
    (for which it waited) is locked as it is, even when the old lock disagrees with it."""
    _, lock = _install_and_lock(tmp_path)
    assert run_qnnctl("uninstall", VERSION).returncode == 0
    with FileLock(str(cache_dir / "locks" / f"{VERSION}.lock")).acquire(timeout=5):
        proc = start_qnnctl_waiting("lock", VERSION)
        root = install_tree_into_cache(cache_dir, VERSION)  # by the qnnctl holding the lock
        manifest = json.loads((root / ".qnnctl.json").read_text())
        manifest.update(sha256="0" * 64, size=1)
        (root / ".qnnctl.json").write_text(json.dumps(manifest))
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, f"{lock}\n"), err
    assert tomllib.loads(lock.read_text())["sdk"]["sha256"] == "0" * 64


def test_lock_downloads_the_archive_it_is_about_to_pin_whatever_the_old_lock_says(mirror: FaultServer,
                                                                                   cache_dir: Path,
                                                                                   tmp_path: Path) -> None:
    """`qnnctl lock` of an SDK not installed downloads it unchecked by the lock it replaces."""
    _, lock = _install_and_lock(tmp_path)
    assert run_qnnctl("uninstall", VERSION).returncode == 0
    made = run_qnnctl("lock", VERSION)
    assert (made.returncode, made.stdout) == (0, f"{lock}\n"), made.stderr
    served = mirror.files[f"/{VERSION}/v{VERSION}.zip"]
    assert tomllib.loads(lock.read_text())["sdk"]["sha256"] == _sha256(served)


def test_install_locked_of_another_version_installed_already_fails(cache_dir: Path, tmp_path: Path) -> None:
    _, lock = _install_and_lock(tmp_path)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    locked = run_qnnctl("install", OTHER_VERSION, "--locked")
    assert (locked.returncode, locked.stdout) == (1, ""), locked.stderr
    assert locked.stderr == (f"qnnctl: error: --locked: {lock} pins SDK {VERSION}, not {OTHER_VERSION}\n"
                             f"qnnctl: hint: install {VERSION} (`qnnctl use {VERSION}` pins it for the project), "
                             f"or lock {OTHER_VERSION} with `qnnctl lock {OTHER_VERSION}`\n")
    # Without --locked the lock only speaks of the version it pins.
    assert run_qnnctl("install", OTHER_VERSION).returncode == 0


def test_a_store_sdk_without_a_manifest_is_locked_from_its_archive_fetched_once(
        mirror: FaultServer, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    # The store holds what the archive holds, unpacked by another tool.
    with zipfile.ZipFile(io.BytesIO(mirror.files[PATH])) as zf:
        for info in zf.infolist():
            parts = info.filename.rstrip("/").split("/", 2)
            if len(parts) < 3:
                continue  # qairt/ and qairt/VERSION/
            target = store / VERSION / parts[2]
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            data = zf.read(info)
            if stat.S_ISLNK(info.external_attr >> 16):
                target.symlink_to(data.decode())
            else:
                target.write_bytes(data)
                target.chmod(stat.S_IMODE(info.external_attr >> 16))
    monkeypatch.setenv("QNNCTL_STORES", str(store))
    made = run_qnnctl("lock", VERSION)
    assert made.returncode == 0, made.stderr
    data = tomllib.loads(Path(made.stdout.strip()).read_text())["sdk"]
    served = mirror.files[PATH]
    assert data["sha256"] == _sha256(served)
    assert data["size"] == len(served)
    assert len(mirror.requests_for(PATH)) == 1
    # Hashed, then removed; nothing installed over the store's copy.
    _nothing_installed(cache_dir)
    checked = run_qnnctl("lock", "--check")
    assert checked.returncode == 0, checked.stderr
    # The store's files are hashed against the lock's component digests: one changed file fails.
    (store / VERSION / "docs" / "payload.bin").write_bytes(b"changed")
    changed = run_qnnctl("lock", "--check")
    assert changed.returncode == 1
    assert f"the files of component docs of SDK {VERSION} at {store / VERSION}" in changed.stderr


# -- read-only stores ---------------------------------------------------------------------------


def _can_bind_mount_read_only() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    with tempfile.TemporaryDirectory() as folder:
        probe = subprocess.run(
            [unshare, *([] if os.geteuid() == 0 else ["-r"]), "--mount", "--propagation", "private", "sh", "-c",
             'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && ! touch "$1/x" 2>/dev/null', "sh",
             folder], capture_output=True)
        return probe.returncode == 0 and not os.path.exists(os.path.join(folder, "x"))


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


@contextmanager
def _read_only_store(how: str, tmp_path: Path) -> Iterator[tuple[Path, Path, Path, Runner]]:
    """(store, cache, work folder, run) where `run(*args)` runs qnnctl unable to write in the store:
    through a read-only bind mount of it (in a mount namespace of its own), or as a user who
    lacks write permission there (`nobody` when the tests run as root)."""
    as_root = os.geteuid() == 0
    if how == "bind mount":
        if not _can_bind_mount_read_only():
            pytest.skip("no read-only bind mount here (unshare --mount)")
        base = tmp_path / "ro"
        base.mkdir()
    else:
        # Another user must reach these folders, which tmp_path (under a 0700 folder) is not.
        base = Path(tempfile.mkdtemp(prefix="qnnctl-store-")) if as_root else tmp_path / "ro"
        base.mkdir(exist_ok=True)
        base.chmod(0o755)
    store, cache, home, work = base / "store", base / "cache", base / "home", base / "work"
    for folder in (cache, home, work):
        folder.mkdir(parents=True)
        # The user who runs qnnctl owns its cache: one that others can write is refused.
        if as_root and how != "bind mount":
            nobody = pwd.getpwnam("nobody")
            os.chown(folder, nobody.pw_uid, nobody.pw_gid)
    build_sdk_tree(store / VERSION, SdkSpec(build_id=BUILD, sdk_yaml=False))
    build_sdk_tree(store / "latest", SdkSpec(version=OTHER_VERSION, build_id=f"v{OTHER_VERSION}101010"))
    if how == "bind mount":
        prefix = [shutil.which("unshare") or "unshare", *([] if as_root else ["-r"]), "--mount", "--propagation",
                  "private", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && '
                  'exec "$@"', "sh", str(store)]
    elif as_root:
        prefix = [shutil.which("setpriv") or "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    else:
        prefix = []
        for path in [store, *store.rglob("*")]:
            if path.is_dir():
                path.chmod(0o555)
    env = dict(os.environ, QNNCTL_CACHE_DIR=str(cache), HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
               QNNCTL_STORES=f"{tmp_path / 'no-such-store'}:{store}")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, sys.executable, "-m", "qnnctl", *args], env=env, cwd=work,
                              capture_output=True, text=True, timeout=120)

    try:
        yield store, cache, work, run
    finally:
        for path in [store, *store.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        if not base.is_relative_to(tmp_path):
            shutil.rmtree(base)


@pytest.mark.parametrize("how", ["bind mount", "no write permission"])
def test_a_read_only_store_is_used_and_never_written(how: str, tmp_path: Path, server: FaultServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)  # nothing may be fetched: the server has no file
    with _read_only_store(how, tmp_path) as (store, cache, work, run):
        (work / ".qnn-version").write_text(VERSION + "\n")
        before = _snapshot(store)
        installed = run("install")
        assert installed.returncode == 0, installed.stderr
        assert installed.stdout == f"{store / VERSION}\n"
        assert f"is already installed in store {store}\n" in installed.stderr
        env = run("env", "--shell", "json")
        assert env.returncode == 0, env.stderr
        assert json.loads(env.stdout)["QNN_SDK_ROOT"] == str(store / VERSION)
        lowered = run("lower", "--", "sh", "-c", 'printf %s "$QNN_SDK_ROOT"')
        assert lowered.returncode == 0, lowered.stderr
        assert lowered.stdout == str(store / VERSION)
        doctor = run("doctor", "--json", "--offline")
        checks = _checks(doctor)
        failed = [c for c in checks.values() if c["status"] == "fail"]
        if how != "bind mount" and os.geteuid() == 0:
            # `nobody` may lack the right to run this Python in the load check's child process.
            failed = [c for c in failed if not (c["id"] == "load" and "Permission denied" in c["detail"])]
        assert not failed, failed
        assert f"(store {store})" in checks["sdk.selection"]["detail"]
        assert checks["sdk.version"]["status"] == "ok"  # identified by its libraries' build id
        assert checks["sdk.manifest"]["status"] == "skip"
        assert checks["stores"]["status"] == "warn"  # the first store named is not there
        assert f"store {store}: 2 SDKs ({VERSION}, {OTHER_VERSION}), read-only" in checks["stores"]["detail"]
        listed = json.loads(run("list", "--json").stdout)["sdks"]
        assert [(r["version"], r["root"], r["origin"], r["build_id"]) for r in listed] == [
            (VERSION, str(store / VERSION), f"store {store}", BUILD[1:]),
            (OTHER_VERSION, str(store / "latest"), f"store {store}", f"{OTHER_VERSION}101010"),
        ]
        # `latest/` is SDK OTHER_VERSION by its libraries.
        other = run("env", OTHER_VERSION, "--shell", "json")
        assert json.loads(other.stdout)["QNN_SDK_ROOT"] == str(store / "latest")
        assert server.requests == []
        assert _snapshot(store) == before
        assert not (store / VERSION / ".qnnctl.json").exists()
        # Used where it is: nothing copied into the user's own cache either.
        assert not (cache / "sdks").is_dir() or list((cache / "sdks").iterdir()) == []


def test_a_store_folder_named_for_one_version_whose_libraries_are_another_is_not_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    build_sdk_tree(store / VERSION, SdkSpec(build_id="v2.51.0.260929181845"))
    environ = {"QNNCTL_STORES": str(store), "HOME": str(tmp_path)}
    cache = Cache(tmp_path / "cache")
    assert find_installed(VERSION, cache, environ) is None
    found = find_installed("2.51.0.260929", cache, environ)
    assert found is not None
    assert found.root == store / VERSION
    assert found.origin == f"store {store}"


# -- stores another user could change -----------------------------------------------------------

_as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's takes root")


def _nobody() -> int:
    import pwd

    return pwd.getpwnam("nobody").pw_uid


def _hostile_store(how: str, tmp_path: Path) -> tuple[str, Path, str]:
    """A store holding SDK VERSION, made unsafe in the way `how` names: (QNNCTL_STORES, the
    folder or link at fault, what is wrong with it)."""
    store = tmp_path / "shared" / "store"
    sdk = build_sdk_tree(store / VERSION, SdkSpec(build_id=BUILD))
    for folder in (tmp_path / "shared", store):
        folder.chmod(0o755)
    named = str(store)
    if how == "store 0777":
        store.chmod(0o777)
        return named, store, "is writable by its group and others (mode 0777)"
    if how == "store 1777":
        store.chmod(0o1777)
        return named, store, "is writable by its group and others (mode 1777)"
    if how == "store 0775":
        store.chmod(0o775)
        return named, store, "is writable by its group (mode 0775)"
    if how == "SDK folder of nobody":
        os.chown(sdk, _nobody(), -1)
        return named, sdk, f"belongs to user nobody (uid {_nobody()})"
    if how == "SDK folder 0777":
        sdk.chmod(0o777)
        return named, sdk, "is writable by its group and others (mode 0777)"
    if how == "library folder 0777":
        (sdk / "lib" / "x86_64-linux-clang").chmod(0o777)
        return named, sdk / "lib" / "x86_64-linux-clang", "is writable by its group and others (mode 0777)"
    if how == "a library of nobody's":
        library = sdk / "lib" / "x86_64-linux-clang" / "libQnnCpu.so"
        os.chown(library, _nobody(), -1)
        return named, library, f"belongs to user nobody (uid {_nobody()})"
    if how == "a tool writable by others":
        tool = sdk / "bin" / "x86_64-linux-clang" / "qnn-net-run"
        tool.chmod(0o777)
        return named, tool, "is writable by its group and others (mode 0777)"
    if how == "a library linked into a writable folder":
        (tmp_path / "open").mkdir()
        (tmp_path / "open").chmod(0o777)
        library = sdk / "lib" / "x86_64-linux-clang" / "libQnnCpu.so"
        shutil.move(library, tmp_path / "open" / library.name)
        library.symlink_to(tmp_path / "open" / library.name)
        return named, tmp_path / "open", "is writable by its group and others (mode 0777)"
    if how == "a parent writable by others":
        (tmp_path / "shared").chmod(0o777)
        return named, tmp_path / "shared", "is writable by its group and others (mode 0777)"
    if how == "a link of nobody's in a sticky folder":
        public = tmp_path / "public"
        public.mkdir(mode=0o1777)
        public.chmod(0o1777)
        link = public / "store"
        link.symlink_to(store)
        os.lchown(link, _nobody(), -1)
        return str(link), link, f"is a symbolic link that belongs to user nobody (uid {_nobody()})"
    if how == "a link into a writable folder":
        (tmp_path / "shared").chmod(0o777)
        (tmp_path / "mine").mkdir(mode=0o755)
        link = tmp_path / "mine" / "store"
        link.symlink_to("../shared/store")  # relative, through `..`
        return str(link), tmp_path / "shared", "is writable by its group and others (mode 0777)"
    if how == "a link to a link of nobody's":
        public = tmp_path / "public"
        public.mkdir(mode=0o1777)
        public.chmod(0o1777)
        (public / "store").symlink_to(store)
        os.lchown(public / "store", _nobody(), -1)
        (tmp_path / "mine").mkdir(mode=0o755)
        (tmp_path / "mine" / "store").symlink_to(public / "store")
        return str(tmp_path / "mine" / "store"), public / "store", \
            f"is a symbolic link that belongs to user nobody (uid {_nobody()})"
    raise AssertionError(how)


@_as_root
@pytest.mark.parametrize("how", ["store 0777", "store 1777", "store 0775", "SDK folder of nobody", "SDK folder 0777",
                                 "library folder 0777", "a library of nobody's", "a tool writable by others",
                                 "a library linked into a writable folder", "a parent writable by others",
                                 "a link of nobody's in a sticky folder", "a link into a writable folder",
                                 "a link to a link of nobody's"])
def test_a_store_another_user_could_change_is_not_used(how: str, tmp_path: Path, cache_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    stores, culprit, why = _hostile_store(how, tmp_path)
    monkeypatch.setenv("QNNCTL_STORES", stores)
    older = install_tree_into_cache(cache_dir, OTHER_VERSION)
    said = f"is not used: {culprit} {why}, so another user could put code there that runs as you"
    env = run_qnnctl("env", VERSION)
    assert (env.returncode, env.stdout) == (1, ""), env.stderr
    assert said in env.stderr
    assert "QNNCTL_STORES" in env.stderr
    # Not the newest SDK on disk either: the older one of qnnctl's cache is.
    newest = run_qnnctl("env", "--shell", "json")
    assert json.loads(newest.stdout)["QNN_SDK_ROOT"] == str(older), newest.stderr
    assert newest.stderr.count(said) == 1, newest.stderr  # said once, however often the stores are read
    assert [row["version"] for row in json.loads(run_qnnctl("list", "--json").stdout)["sdks"]] == [OTHER_VERSION]
    doctor = run_qnnctl("doctor", "--sdk", OTHER_VERSION, "--json", "--offline")
    assert doctor.returncode == 1
    check = _checks(doctor)["stores"]
    assert check["status"] == "fail"
    assert f"{culprit} {why}" in check["detail"]
    assert ("chmod go-w" if "writable" in why else "ln -sfn" if "link" in why else "chown root") in check["hint"]


@_as_root
def test_a_store_below_a_sticky_folder_of_roots_is_used(tmp_path: Path, cache_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Like /tmp: others may add entries there, but neither rename nor remove the store."""
    public = tmp_path / "public"
    public.mkdir()
    public.chmod(0o1777)
    store = public / "store"
    build_sdk_tree(store / VERSION, SdkSpec(build_id=BUILD))
    store.chmod(0o755)
    monkeypatch.setenv("QNNCTL_STORES", str(store))
    env = run_qnnctl("env", VERSION, "--shell", "json")
    assert json.loads(env.stdout)["QNN_SDK_ROOT"] == str(store / VERSION), env.stderr
    assert "not used" not in env.stderr
    assert _checks(run_qnnctl("doctor", "--json", "--offline"))["stores"]["status"] == "ok"


@_as_root
@pytest.mark.parametrize("mode", [0o755, 0o777], ids=["0755", "0777"])
def test_on_a_read_only_mount_the_owner_is_not_asked_but_the_mode_is(mode: int, tmp_path: Path,
                                                                      cache_dir: Path) -> None:
    """An NFS export or an image's files may belong to a uid of another machine; a folder
    writable by others there may be written where the mount comes from."""
    if not _can_bind_mount_read_only():
        pytest.skip("no read-only bind mount here (unshare --mount)")
    store = tmp_path / "store"
    sdk = build_sdk_tree(store / VERSION, SdkSpec(build_id=BUILD))
    for folder in (store, sdk):
        os.chown(folder, _nobody(), -1)
    store.chmod(mode)
    env = dict(os.environ, QNNCTL_STORES=str(store))
    found = subprocess.run(
        [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"', "sh", str(store),
         sys.executable, "-m", "qnnctl", "env", VERSION, "--shell", "json"],
        env=env, capture_output=True, text=True, timeout=120)
    if mode == 0o755:
        assert json.loads(found.stdout)["QNN_SDK_ROOT"] == str(sdk), found.stderr
        assert "not used" not in found.stderr
    else:
        assert found.returncode == 1
        assert f"is not used: {store} is writable by its group and others (mode 0777)" in found.stderr
    # Mounted read-write, the same store is another user's.
    rw = run_qnnctl("env", VERSION, env=env)
    assert rw.returncode == 1
    assert f"{store} belongs to user nobody" in rw.stderr


def test_unsafe_path_on_paths_that_are_not_there(tmp_path: Path) -> None:
    from qnnctl.sdk.stores import unsafe_path

    assert unsafe_path(tmp_path / "no" / "such") is None
    (tmp_path / "file").write_text("")
    assert unsafe_path(tmp_path / "file" / "below") is None
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    found = unsafe_path(loop / "x")
    assert found is not None
    assert found.why == "leads through more than 40 symbolic links"


# -- links --------------------------------------------------------------------------------------


def test_a_link_to_a_folder_that_is_later_removed(tmp_path: Path, cache_dir: Path) -> None:
    folder = build_sdk_tree(tmp_path / "opt" / "qcom" / "aistack" / "qairt" / VERSION, SdkSpec(build_id=BUILD))
    linked = run_qnnctl("link", str(folder))
    assert linked.returncode == 0, linked.stderr
    assert linked.stdout == f"{folder}\n"
    record = json.loads((cache_dir / "links" / f"{VERSION}.json").read_text())
    assert record["root"] == str(folder)
    assert record["build_id"] == BUILD[1:]
    (row,) = json.loads(run_qnnctl("list", "--json").stdout)["sdks"]
    assert (row["version"], row["root"], row["origin"], row["missing"]) == (VERSION, str(folder), "link", [])
    env = run_qnnctl("env", VERSION, "--shell", "json")
    assert json.loads(env.stdout)["QNN_SDK_ROOT"] == str(folder)
    # The newest SDK on disk, for a project that names none.
    assert json.loads(run_qnnctl("env", "--shell", "json").stdout)["QNN_SDK_ROOT"] == str(folder)
    checks = _checks(run_qnnctl("doctor", "--sdk", VERSION, "--json", "--offline"))
    assert "(link)" in checks["sdk.selection"]["detail"]
    assert checks["stores"]["status"] == "ok"
    assert checks["stores"]["detail"] == f"1 linked SDK ({VERSION} at {folder})"

    shutil.rmtree(folder)
    (gone,) = json.loads(run_qnnctl("list", "--json").stdout)["sdks"]
    assert gone["missing"] == ["the folder itself"]
    assert gone["size"] is None
    assert "its folder is gone" in run_qnnctl("list").stdout
    env = run_qnnctl("env", VERSION)
    assert env.returncode == 1
    assert env.stdout == ""
    assert f"SDK {VERSION} is linked to {folder}, which is gone" in env.stderr
    assert f"qnnctl uninstall {VERSION}" in env.stderr
    doctor = run_qnnctl("doctor", "--sdk", VERSION, "--json", "--offline")
    assert doctor.returncode == 1
    checks = _checks(doctor)
    assert checks["sdk.selection"]["status"] == "fail"
    assert "which is gone" in checks["sdk.selection"]["detail"]
    assert checks["stores"]["status"] == "warn"
    assert f"qnnctl uninstall {VERSION}" in checks["stores"]["hint"]
    dropped = run_qnnctl("uninstall", VERSION)
    assert dropped.returncode == 0, dropped.stderr
    assert not (cache_dir / "links" / f"{VERSION}.json").exists()
    assert json.loads(run_qnnctl("list", "--json").stdout)["sdks"] == []


def test_install_of_a_version_whose_linked_folder_is_gone_installs_a_copy_saying_so(
        mirror: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    folder = build_sdk_tree(tmp_path / "unpacked", SdkSpec(build_id=BUILD))
    assert run_qnnctl("link", str(folder)).returncode == 0
    shutil.rmtree(folder)
    installed = run_qnnctl("install", VERSION)
    assert (installed.returncode, installed.stdout) == (0, f"{cache_dir / 'sdks' / VERSION}\n"), installed.stderr
    assert installed.stderr.startswith(f"qnnctl: warning: SDK {VERSION} is linked to {folder}, which is gone (or is "
                                       "no SDK root any more); installing a copy into qnnctl's cache\n"), \
        installed.stderr


def test_uninstall_removes_only_the_link(tmp_path: Path, cache_dir: Path) -> None:
    folder = build_sdk_tree(tmp_path / "unpacked", SdkSpec(build_id=BUILD))
    assert run_qnnctl("link", str(folder)).returncode == 0
    before = _snapshot(folder)
    removed = run_qnnctl("uninstall", VERSION)
    assert removed.returncode == 0, removed.stderr
    assert "the folder is left as it is" in removed.stderr
    assert _snapshot(folder) == before
    assert run_qnnctl("env", VERSION).returncode == 1


def test_uninstall_of_a_version_in_the_cache_and_linked_removes_the_copy_then_the_link(tmp_path: Path,
                                                                                       cache_dir: Path) -> None:
    """As `link` says: the link is used once the cache's copy is uninstalled."""
    root = install_tree_into_cache(cache_dir, VERSION)
    folder = build_sdk_tree(tmp_path / "unpacked", SdkSpec(build_id=BUILD))
    linked = run_qnnctl("link", str(folder))
    assert linked.returncode == 0, linked.stderr
    assert "the link is used once that copy is uninstalled" in linked.stderr
    before = _snapshot(folder)
    first = run_qnnctl("uninstall", VERSION)
    assert first.returncode == 0, first.stderr
    assert not root.exists()
    assert (cache_dir / "links" / f"{VERSION}.json").is_file()
    assert (f"SDK {VERSION} stays linked to {folder}, which is used from now on; `qnnctl uninstall {VERSION}` "
            "again drops the link") in first.stderr
    assert json.loads(run_qnnctl("env", VERSION, "--shell", "json").stdout)["QNN_SDK_ROOT"] == str(folder)
    second = run_qnnctl("uninstall", VERSION)
    assert second.returncode == 0, second.stderr
    assert "the folder is left as it is" in second.stderr
    assert not (cache_dir / "links" / f"{VERSION}.json").exists()
    assert _snapshot(folder) == before
    assert run_qnnctl("env", VERSION).returncode == 1


def test_uninstall_takes_an_unreadable_link_record_with_the_sdk(cache_dir: Path) -> None:
    """A record of the version that cannot be read links nothing: it is not left behind."""
    root = install_tree_into_cache(cache_dir, VERSION)
    (cache_dir / "links").mkdir()
    record = cache_dir / "links" / f"{VERSION}.json"
    record.write_text("{cut short", encoding="utf-8")
    removed = run_qnnctl("uninstall", VERSION)
    assert (removed.returncode, removed.stdout) == (0, ""), removed.stderr
    assert not root.exists()
    assert not record.exists()


def test_link_of_a_folder_above_the_sdk_points_at_the_sdk_below(tmp_path: Path, cache_dir: Path) -> None:
    """The folder Qualcomm's archive unpacks into (`qairt/`), or a path that is not there: said
    as such, with the command that links the SDK root below it; nothing borrowed from the
    QNN_SDK_ROOT check ("unset it")."""
    root = build_sdk_tree(tmp_path / "unpacked" / "qairt" / VERSION, SdkSpec(build_id=BUILD))
    for above in (root.parent, root.parent.parent):
        result = run_qnnctl("link", str(above))
        assert (result.returncode, result.stdout) == (1, ""), result.stderr
        assert result.stderr == (
            f"qnnctl: error: the folder {above} is not a QNN SDK root: missing lib/x86_64-linux-clang/libQnnHtp.so, "
            "lib/x86_64-linux-clang/libQnnSystem.so\n"
            f"qnnctl: hint: an SDK root is below it: `qnnctl link {root}`\n")
    # The same for --sdk and QNN_SDK_ROOT, in their own words.
    by_option = run_qnnctl("env", "--sdk", str(root.parent))
    assert by_option.stderr.endswith(f"qnnctl: hint: an SDK root is below it: `--sdk {root}`\n"), by_option.stderr
    by_variable = run_qnnctl("which", "libQnnHtp.so", env={**os.environ, "QNN_SDK_ROOT": str(root.parent)})
    assert by_variable.stderr.endswith(f"qnnctl: hint: an SDK root is below it: `export QNN_SDK_ROOT={root}`\n"), \
        by_variable.stderr
    gone = run_qnnctl("link", str(tmp_path / "nonexistent"))
    assert gone.returncode == 1
    assert gone.stderr == (f"qnnctl: error: the folder {tmp_path / 'nonexistent'} does not exist\n"
                           "qnnctl: hint: give the path of an SDK root: the folder that holds QNN_README.txt, lib/ "
                           "and bin/ (qairt/<version>/ where Qualcomm's archive was unpacked)\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing_below = run_qnnctl("link", str(empty))
    assert nothing_below.returncode == 1
    assert "unset it" not in nothing_below.stderr
    assert nothing_below.stderr.endswith("an archive is installed with `qnnctl install --file ARCHIVE`\n")
    assert not (cache_dir / "links").exists()


def _refused_where_used(version: str, cache_dir: Path, server: FaultServer, *said: str) -> None:
    """install, env, lower and doctor refuse `version` (exit 4, doctor 1), each saying all of `said`;
    nothing is fetched or installed."""
    for args in (("install", version), ("env", version), ("lower", "--sdk", version, "--", "true")):
        result = run_qnnctl(*args)
        assert (result.returncode, result.stdout) == (4, ""), (args, result.stderr)
        for words in said:
            assert words in result.stderr, (args, result.stderr)
    doctor = run_qnnctl("doctor", "--sdk", version, "--json", "--offline")
    assert doctor.returncode == 1
    selection = _checks(doctor)["sdk.selection"]
    assert selection["status"] == "fail"
    for words in said:
        assert words in f"{selection['detail']} {selection['hint']}"
    if "linked" in said[0]:
        stores = _checks(run_qnnctl("doctor", "--json", "--offline"))["stores"]
        assert stores["status"] == "warn"
        for words in said:
            assert words in f"{stores['detail']} {stores['hint']}"
    assert server.requests == []
    _nothing_installed(cache_dir, version)


@pytest.mark.parametrize("now", ["v2.51.0.260929181845", "v2.37.0.250724101011", None],
                         ids=["another version", "another build of it", "no build id"])
def test_a_linked_folder_that_now_holds_another_build_is_refused_where_used(
        now: str | None, mirror: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    folder = build_sdk_tree(tmp_path / "unpacked", SdkSpec(build_id=BUILD))
    assert run_qnnctl("link", str(folder)).returncode == 0
    shutil.rmtree(folder)
    build_sdk_tree(folder, SdkSpec(build_id=now))  # sdk.yaml and the folder's name still say VERSION
    now_said = f"build {now[1:]}" if now else "a build that carries no id"
    _refused_where_used(VERSION, cache_dir, mirror, f"SDK {VERSION} is linked to {folder}, but its libraries "
                        f"are now {now_said}", f"not build {BUILD[1:]} as when it was linked", f"qnnctl link {folder}")
    # Linked again as what it holds, it is used.
    if now is not None:
        assert run_qnnctl("link", str(folder), "--version", now[1:14]).returncode == 0
        env = run_qnnctl("env", now[1:14], "--shell", "json")
        assert json.loads(env.stdout)["QNN_SDK_ROOT"] == str(folder), env.stderr


def test_a_link_through_a_symlink_that_is_pointed_elsewhere_is_refused(mirror: FaultServer, tmp_path: Path,
                                                                      cache_dir: Path) -> None:
    build_sdk_tree(tmp_path / "a" / VERSION, SdkSpec(build_id=BUILD))
    build_sdk_tree(tmp_path / "b" / VERSION, SdkSpec(build_id="v2.51.0.260929181845"))
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "a" / VERSION)
    assert run_qnnctl("link", str(current)).returncode == 0
    assert json.loads(run_qnnctl("env", VERSION, "--shell", "json").stdout)["QNN_SDK_ROOT"] == str(current)
    current.unlink()
    current.symlink_to(tmp_path / "b" / VERSION)
    _refused_where_used(VERSION, cache_dir, mirror, "build 2.51.0.260929181845", f"not build {BUILD[1:]}")


def test_a_link_recorded_without_a_build_id_is_refused_once_its_libraries_name_another_version(
        mirror: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    folder = build_sdk_tree(tmp_path / "unpacked", SdkSpec(build_id=None))
    assert run_qnnctl("link", str(folder), "--version", VERSION).returncode == 0
    assert run_qnnctl("env", VERSION).returncode == 0
    shutil.rmtree(folder)
    build_sdk_tree(folder, SdkSpec(build_id=f"v{VERSION}101010"))  # a build of the same version: fine
    assert run_qnnctl("env", VERSION).returncode == 0
    shutil.rmtree(folder)
    # A build whose version ends as the one linked does.
    build = f"1{VERSION}101010"
    build_sdk_tree(folder, SdkSpec(build_id=f"v{build}"))
    _refused_where_used(VERSION, cache_dir, mirror, f"its libraries are build {build}",
                        f"not one of SDK {VERSION}")


def test_an_executorch_cache_folder_holding_another_build_is_refused_where_used(mirror: FaultServer,
                                                                               cache_dir: Path) -> None:
    old = "2.34.0.250424"
    folder = Path(os.environ["XDG_CACHE_HOME"]) / "executorch" / "qnn" / f"sdk-{old}"
    build_sdk_tree(folder, SdkSpec(version=old, build_id=BUILD))
    _refused_where_used(old, cache_dir, mirror, f"ExecuTorch's cache folder {folder} is named for SDK {old}, "
                        f"but its libraries are build {BUILD[1:]} (SDK {VERSION})")
    shutil.rmtree(folder)
    build_sdk_tree(folder, SdkSpec(version=old, build_id=f"v{old}093000"))
    env = run_qnnctl("env", old, "--shell", "json")
    assert json.loads(env.stdout)["QNN_SDK_ROOT"] == str(folder), env.stderr


def test_link_refuses_a_version_its_libraries_contradict(tmp_path: Path, cache_dir: Path) -> None:
    folder = build_sdk_tree(tmp_path / "unpacked", SdkSpec(build_id=BUILD))
    wrong = run_qnnctl("link", str(folder), "--version", OTHER_VERSION)
    assert wrong.returncode == 4
    assert f"holds SDK {VERSION}" in wrong.stderr
    assert not (cache_dir / "links").exists()
    not_sdk = run_qnnctl("link", str(tmp_path))
    assert not_sdk.returncode == 1
    assert "is not a QNN SDK root" in not_sdk.stderr


# -- qnnctl mirror -------------------------------------------------------------------------------


@contextmanager
def _http_server(folder: Path) -> Iterator[str]:
    """`python3 -m http.server` serving `folder` on loopback, as the README shows; its base URL."""
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                             "--directory", str(folder)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"port (\d+)", line)
        assert match, line
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_mirror_round_trip_served_by_http_server(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    good = _archive(tmp_path / "good")
    server.add(PATH, good)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    folder = tmp_path / "mirror"
    made = run_qnnctl("mirror", str(folder), "2.37")
    assert made.returncode == 0, made.stderr
    archive = folder / VERSION / f"v{VERSION}.zip"
    assert made.stdout == f"{archive}\n"
    assert archive.read_bytes() == good
    index = json.loads((folder / "index.json").read_text())
    assert index["schema"] == 1
    entry = index["versions"][VERSION]
    assert (entry["sha256"], entry["size"], entry["build_id"], entry["path"]) == (
        _sha256(good), len(good), BUILD[1:], f"{VERSION}/v{VERSION}.zip")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["added_at"])
    assert not list((cache_dir / "downloads").glob("*.zip"))  # moved into the mirror, not copied
    again = run_qnnctl("mirror", str(folder), VERSION)
    assert again.returncode == 0, again.stderr
    assert len(server.requests_for(PATH)) == 1  # already there, as indexed
    assert json.loads((folder / "index.json").read_text()) == index

    with _http_server(folder) as base:
        env = dict(os.environ, QNNCTL_MIRROR=base, QNNCTL_CACHE_DIR=str(tmp_path / "fresh"))
        installed = run_qnnctl("install", VERSION, "-v", env=env)
        assert installed.returncode == 0, installed.stderr
        root = Path(installed.stdout.strip())
        assert root == tmp_path / "fresh" / "sdks" / VERSION
        assert (read_manifest(root) or {})["sha256"] == _sha256(good)

        archive.write_bytes(_archive(tmp_path / "bad", payload=b"fake!"))  # the same size, other bytes
        env["QNNCTL_CACHE_DIR"] = str(tmp_path / "fresh2")
        tampered = run_qnnctl("install", VERSION, env=env)
        assert tampered.returncode == 4, tampered.stderr
        assert (f"qnnctl: error: the archive from {base}/{VERSION}/v{VERSION}.zip does not match the mirror's "
                f"{base}/index.json: its sha256 is ") in tampered.stderr
        _nothing_installed(tmp_path / "fresh2")
        # `mirror` finds the file changed against its own index.
        changed = run_qnnctl("mirror", str(folder), VERSION)
        assert changed.returncode == 4
        assert "index.json says" in changed.stderr


def test_mirror_takes_an_archive_already_downloaded(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    good = _archive(tmp_path / "good")
    downloads = cache_dir / "downloads"
    downloads.mkdir(parents=True)
    (downloads / f"v{VERSION}.zip").write_bytes(good)
    (downloads / f"v{VERSION}.zip.json").write_text(json.dumps({"url": f"https://example.invalid{PATH}",
                                                                 "sha256": _sha256(good), "size": len(good)}))
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)  # serves nothing
    made = run_qnnctl("mirror", str(tmp_path / "mirror"), VERSION)
    assert made.returncode == 0, made.stderr
    assert server.requests_for(PATH) == []
    assert (tmp_path / "mirror" / VERSION / f"v{VERSION}.zip").read_bytes() == good
    assert not (downloads / f"v{VERSION}.zip").exists()


def test_install_from_a_mirror_whose_index_disagrees_with_the_lock_fetches_nothing(
        server: FaultServer, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _archive(tmp_path / "good")
    server.add(PATH, good)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    lock = Path(run_qnnctl("lock", VERSION).stdout.strip())
    assert run_qnnctl("uninstall", VERSION).returncode == 0
    index = {"schema": 1, "versions": {VERSION: {"sha256": "1" * 64, "size": len(good)}}}
    server.add("/index.json", json.dumps(index).encode(), "application/json")
    before = len(server.requests_for(PATH))
    result = run_qnnctl("install", VERSION)
    assert result.returncode == 4, result.stderr
    assert result.stderr.startswith(f"qnnctl: error: {lock} expects sha256 {_sha256(good)}, but the mirror's "
                                    f"{server.base.rstrip('/')}/index.json expects {'1' * 64}; nothing was fetched\n")
    assert len(server.requests_for(PATH)) == before
    _nothing_installed(cache_dir)


def test_a_sha256_the_mirrors_index_disagrees_with_is_named_and_a_url_of_its_own_skips_the_index(
        server: FaultServer, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _archive(tmp_path / "good")
    server.add(PATH, good)
    indexed = "1" * 64
    server.add("/index.json", json.dumps({"schema": 1, "versions": {VERSION: {"sha256": indexed, "size": len(good)}}})
               .encode(), "application/json")
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    mine = _sha256(good)
    refused = run_qnnctl("install", VERSION, "--sha256", mine)
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    assert refused.stderr == (f"qnnctl: error: --sha256 expects sha256 {mine}, but the mirror's "
                              f"{server.base.rstrip('/')}/index.json expects {indexed}; nothing was fetched\n"
                              "qnnctl: hint: find out which is right; `qnnctl lock VERSION` writes the lock again, "
                              "`qnnctl mirror DIR VERSION` the mirror's index\n")
    # An archive named by --url is not the mirror's: its index is not read.
    url = server.add(f"/elsewhere/v{VERSION}.zip", good)
    installed = run_qnnctl("install", "--url", url)
    assert installed.returncode == 0, installed.stderr
    assert len(server.requests_for("/index.json")) == 1
    assert server.requests_for(PATH) == []


# -- uninstall --except / --all ---------------------------------------------------------------


def test_uninstall_except_leaves_what_a_running_install_holds(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for version in (VERSION, OTHER_VERSION, THIRD):
        install_tree_into_cache(cache_dir, version)
    third_size = tree_size(cache_dir / "sdks" / THIRD)
    store = tmp_path / "store"
    build_sdk_tree(store / "2.28.2.241116", SdkSpec(version="2.28.2.241116"))
    linked = build_sdk_tree(tmp_path / "linked", SdkSpec(version="2.26.0.240828"))
    assert run_qnnctl("link", str(linked), "--version", "2.26.0.240828").returncode == 0
    monkeypatch.setenv("QNNCTL_STORES", str(store))
    other = f"/{OTHER_VERSION}/v{OTHER_VERSION}.zip"
    server.add(other, _archive(tmp_path / "other", OTHER_VERSION))
    opened = threading.Event()
    server.fail(other, Fault.gate(opened))
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    untouched = (_snapshot(store), _snapshot(linked))
    # A reinstall of OTHER_VERSION, held at its download: it holds that version's install lock.
    running = subprocess.Popen([sys.executable, "-m", "qnnctl", "install", "--force", OTHER_VERSION],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not server.requests_for(other) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.requests_for(other), "the install never started its download"
        pruned = run_qnnctl("uninstall", "--except", "2.37")
    finally:
        opened.set()
        out, err = running.communicate(timeout=120)
    assert pruned.returncode == 0, pruned.stderr
    assert f"SDK {OTHER_VERSION} ({cache_dir / 'sdks' / OTHER_VERSION}) is held by a running install" in pruned.stderr
    assert f"removed SDK {THIRD}" in pruned.stderr
    assert f"removed 1 SDK, freed {third_size / (1 << 20):.1f} MiB" in pruned.stderr
    assert f"kept {VERSION}" in pruned.stderr
    assert sorted(p.name for p in (cache_dir / "sdks").iterdir()) == sorted([VERSION, OTHER_VERSION])
    assert (_snapshot(store), _snapshot(linked)) == untouched
    assert (cache_dir / "links" / "2.26.0.240828.json").is_file()
    assert running.returncode == 0, err
    assert out == f"{cache_dir / 'sdks' / OTHER_VERSION}\n"


def test_uninstall_of_an_sdk_in_a_store_says_qnnctl_never_changes_it(tmp_path: Path, cache_dir: Path) -> None:
    store = tmp_path / "store"
    root = build_sdk_tree(store / VERSION)
    before = _snapshot(root)
    env = {**os.environ, "QNNCTL_STORES": str(store)}
    for spec in (VERSION, "2.37"):
        result = run_qnnctl("uninstall", spec, env=env)
        assert result.returncode == 1, result.stderr
        assert result.stderr == (f"qnnctl: error: SDK {VERSION} is in the store {store} ({root}), which qnnctl never "
                                 "changes; it is not installed in qnnctl's cache\nqnnctl: hint: remove it from the "
                                 "store itself, or take the store out of QNNCTL_STORES\n")
    assert _snapshot(root) == before


def test_uninstall_all_and_an_except_that_names_nothing(cache_dir: Path) -> None:
    for version in (VERSION, OTHER_VERSION):
        install_tree_into_cache(cache_dir, version)
    typo = run_qnnctl("uninstall", "--except", "2.38")
    assert typo.returncode == 2
    assert "nothing was removed" in typo.stderr
    assert len(list((cache_dir / "sdks").iterdir())) == 2
    assert run_qnnctl("uninstall", "--all", VERSION).returncode == 2
    assert run_qnnctl("uninstall").returncode == 2
    everything = run_qnnctl("uninstall", "--all")
    assert everything.returncode == 0, everything.stderr
    assert "removed 2 SDKs, freed" in everything.stderr
    assert list((cache_dir / "sdks").iterdir()) == []


def test_list_has_a_header_aligned_columns_and_marks_the_sdk_used_here(tmp_path: Path, cache_dir: Path) -> None:
    """A cache copy and a link of one version tell apart (the link is not used while the copy
    comes first), the SDK used here is marked, and the columns do not shift with a root's length."""
    folder = build_sdk_tree(tmp_path / "a-rather-longer-folder-name" / "unpacked", SdkSpec(build_id=BUILD))
    assert run_qnnctl("link", str(folder)).returncode == 0
    copy = install_tree_into_cache(cache_dir, VERSION)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    assert run_qnnctl("use", OTHER_VERSION).returncode == 0
    listed = run_qnnctl("list")
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split() == ["version", "build", "size", "where", "root", "notes"]
    starts = [header.index(name) for name in ("version", "build", "size", "where", "root", "notes")]
    rows = {(line[starts[0]:].split()[0], line[starts[3]:starts[4]].strip()): line for line in lines}
    assert sorted(rows) == sorted([(VERSION, "qnnctl cache"), (VERSION, "link"), (OTHER_VERSION, "qnnctl cache")])
    for line in lines:
        assert line[starts[4] - 2:starts[4] + 1] == "  /", line  # every root starts there
    assert rows[(OTHER_VERSION, "qnnctl cache")].startswith("*  ")
    assert rows[(VERSION, "link")][starts[4]:].startswith(f"{folder}  ")
    assert rows[(VERSION, "link")].endswith("not used: the qnnctl cache copy comes first")
    assert rows[(VERSION, "qnnctl cache")][starts[4]:].rstrip() == str(copy)
    assert listed.stderr == (f"qnnctl: * marks the SDK used here: SDK {OTHER_VERSION} (pinned in "
                             f"{Path.cwd() / '.qnn-version'})\n")
    assert [line[0] for line in lines].count("*") == 1


def test_uninstall_says_each_size_as_list_shows_it(cache_dir: Path) -> None:
    """One version or --all: the size freed, rounded as `qnnctl list` rounds it (240.6 MiB
    is `241 MiB` in both)."""
    sizes = {VERSION: 252_300_000, OTHER_VERSION: 1_363_149, THIRD: 99_000_000}
    for version, size in sizes.items():
        root = install_tree_into_cache(cache_dir, version)
        manifest = json.loads((root / ".qnnctl.json").read_text())
        (root / ".qnnctl.json").write_text(json.dumps({**manifest, "unpacked_size": size}))
    listed = run_qnnctl("list").stdout
    for shown in ("241 MiB", "1.3 MiB", "94 MiB"):
        assert f"  {shown}  " in listed, listed
    one = run_qnnctl("uninstall", VERSION)
    assert (one.returncode, one.stdout) == (0, ""), one.stderr
    assert one.stderr == f"qnnctl: removed SDK {VERSION} (241 MiB) from {cache_dir / 'sdks' / VERSION}\n"
    rest = run_qnnctl("uninstall", "--all")
    assert rest.returncode == 0, rest.stderr
    assert f"removed SDK {OTHER_VERSION} (1.3 MiB)" in rest.stderr
    assert f"removed SDK {THIRD} (94 MiB)" in rest.stderr
    assert rest.stderr.endswith("qnnctl: removed 2 SDKs, freed 96 MiB\n"), rest.stderr
    nothing = run_qnnctl("uninstall", "--all")
    assert (nothing.returncode, nothing.stderr) == (0, "qnnctl: no SDK of qnnctl's cache to remove; nothing freed\n")


def test_a_mirror_index_that_fails_is_retried_naming_its_url(server: FaultServer,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    from qnnctl.sdk.mirrorindex import mirror_entry

    url = f"{server.base}/index.json"
    server.add("/index.json", b"{}", "application/json")
    server.fail("/index.json", *[Fault.status(503, retry_after="0")] * 3)
    assert mirror_entry(server.base, VERSION) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"{url} answered HTTP 503 Service Unavailable; retrying in 0.0s (attempt 2 of 3)",
        f"{url} answered HTTP 503 Service Unavailable; retrying in 0.0s (attempt 3 of 3)",
        f"the mirror answered HTTP 503 for {url}; the archive is not checked against it",
    ]


# -- a mirror's index.json, read on its own -----------------------------------------------------------


def _index(versions: object, schema: object = 1) -> bytes:
    return json.dumps({"schema": schema, "versions": versions}).encode()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_a_mirror_index_entry_is_what_the_gate_holds_the_archive_to(server: FaultServer,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    from qnnctl.sdk.gate import Expected
    from qnnctl.sdk.mirrorindex import IndexEntry, indexed_versions, mirror_entry, read_index

    digest, other = "a" * 64, "b" * 64
    server.add("/m/index.json", _index({
        VERSION: {"sha256": digest, "size": 123, "build_id": BUILD, "components": {"host": other}},
        OTHER_VERSION: {"sha256": other, "size": 12.5, "build_id": 7, "components": {}},
        THIRD: {"sha256": other, "size": "12"},
        "2.37": {"sha256": digest}, "2.4.0.1": "no table",
    }), "application/json")
    base = server.base.replace("://", "://user:secret@") + "/m/"
    url = f"{server.base.replace('://', '://***@')}/m/index.json"
    entry = mirror_entry(base, VERSION)
    assert entry == IndexEntry(url, digest, 123, BUILD, {"host": other})
    assert entry is not None
    assert entry.expected() == Expected(
        f"the mirror's {url}", "the index", "says",
        "the mirror's file changed after it was indexed; put the right archive back, or index it again with "
        "`qnnctl mirror DIR VERSION` where the mirror is kept", sha256=digest, size=123, components={"host": other})
    assert mirror_entry(base, OTHER_VERSION) == IndexEntry(url, other, None, None, None)
    assert mirror_entry(base, THIRD) == IndexEntry(url, other, None, None, None)
    assert indexed_versions(server.base + "/m") == sorted([VERSION, OTHER_VERSION, THIRD], key=lambda v: [
        int(p) for p in v.split(".")])
    assert (indexed_versions(server.base + "/m") or [])[0] == THIRD
    versions = read_index(server.base + "/m")
    assert versions is not None
    assert sorted(versions) == sorted(["2.37", OTHER_VERSION, THIRD, VERSION])
    asked = len(server.requests_for("/m/index.json"))
    assert mirror_entry(server.base + "/elsewhere", VERSION, versions) is not None  # read once is enough
    assert len(server.requests_for("/m/index.json")) == asked
    assert mirror_entry(server.base + "/m", "2.38.0.250901") is None
    assert _warnings(caplog) == [f"the mirror's {server.base}/m/index.json has no entry for SDK 2.38.0.250901; the "
                                 "archive is not checked against it"]


@pytest.mark.parametrize(("entry", "said"), [
    ({"sha256": "A" * 64}, f"gives SDK {VERSION} the sha256 '{'A' * 64}', which is no digest"),
    ({"size": 1}, f"gives SDK {VERSION} the sha256 None, which is no digest"),
    ({"sha256": "a" * 64, "components": ["host"]}, f"gives SDK {VERSION} components that are no digests"),
    ({"sha256": "a" * 64, "components": {"host": "a" * 64, "docs": "x"}},
     f"gives SDK {VERSION} components that are no digests"),
])
def test_a_mirror_index_that_pins_no_digest_is_refused(server: FaultServer, entry: dict[str, object],
                                                       said: str) -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.sdk.mirrorindex import mirror_entry

    server.add("/index.json", _index({VERSION: entry}), "application/json")
    with pytest.raises(IntegrityError) as refused:
        mirror_entry(server.base, VERSION)
    assert refused.value.message == f"the mirror's {server.base}/index.json {said}"
    assert refused.value.hint == "write the index again with `qnnctl mirror DIR VERSION`"


@pytest.mark.parametrize(("body", "said"), [
    (_index({}, schema=2), "is not a qnnctl mirror index (schema 1 with a `versions` table)"),
    (json.dumps({"versions": {}}).encode(), "is not a qnnctl mirror index (schema 1 with a `versions` table)"),
    (_index([VERSION]), "is not a qnnctl mirror index (schema 1 with a `versions` table)"),
    (b"[1]", "is not a qnnctl mirror index (schema 1 with a `versions` table)"),
])
def test_a_file_that_is_no_mirror_index_is_not_used(server: FaultServer, caplog: pytest.LogCaptureFixture,
                                                     body: bytes, said: str) -> None:
    from qnnctl.sdk.mirrorindex import indexed_versions, mirror_entry, read_index

    server.add("/index.json", body, "application/json")
    assert read_index(server.base) is None
    assert mirror_entry(server.base, VERSION) is None
    assert indexed_versions(server.base) is None
    assert _warnings(caplog) == [f"{server.base}/index.json {said}; the archive is not checked against it"] * 3


def test_a_mirror_index_that_cannot_be_read_is_not_used(server: FaultServer,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from qnnctl.sdk.mirrorindex import read_index

    url = f"{server.base}/index.json"
    assert read_index(server.base) is None  # none: said at debug level only
    server.add("/index.json", b"{}", "application/json")
    for status in (404, 410):
        server.fail("/index.json", Fault.status(status))
        assert read_index(server.base) is None
    assert _warnings(caplog) == []
    server.fail("/index.json", Fault.status(403))
    assert read_index(server.base) is None
    server.add("/index.json", b"{not json", "application/json")
    assert read_index(server.base) is None
    warned = _warnings(caplog)
    assert warned[0] == f"the mirror answered HTTP 403 for {url}; the archive is not checked against it"
    assert warned[1].startswith(f"{url} is not a qnnctl mirror index") or warned[1].endswith(
        "; the archive is not checked against it")
    assert len(warned) == 2
    caplog.clear()
    server.add("/index.json", b"{}" * 1000, "application/json")
    server.fail("/index.json", *[Fault.drop_after(10)] * 3)
    assert read_index(server.base) is None
    assert _warnings(caplog)[-1].startswith(f"cannot read the mirror's {url} (")
    assert _warnings(caplog)[-1].endswith("); the archive is not checked against it")


def test_a_mirror_nobody_listens_at_is_an_error_at_once() -> None:
    import socket

    from qnnctl.errors import DownloadError
    from qnnctl.sdk.mirrorindex import read_index

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(DownloadError) as refused:
        read_index(f"http://127.0.0.1:{port}")
    assert refused.value.message.startswith(f"cannot reach the mirror: http://127.0.0.1:{port}/index.json: ")
    assert "refused" in refused.value.message
    assert refused.value.hint == "check the host and port of QNNCTL_MIRROR; nothing was fetched"


# -- qnnctl.lock, read, written and compared in the tests' own process -------------------------------


def _lock(tmp_path: Path, **fields: Any) -> Path:
    from qnnctl.sdk.lockfile import LockedSdk, write_lock

    path = tmp_path / "qnnctl.lock"
    write_lock(path, LockedSdk(path, VERSION, "a" * 64)._replace(**fields), "trusted")
    return path


def test_a_lock_is_written_as_it_is_read(tmp_path: Path) -> None:
    from qnnctl import __version__
    from qnnctl.sdk.lockfile import LockedSdk, read_lock, render_lock

    full = LockedSdk(tmp_path / "qnnctl.lock", VERSION, "a" * 64, 123, BUILD, ("https://m/a.zip", 'q"x'), "c" * 64,
                     ("host", "android"), "2026-12-04T00:00:00Z", {"host": "d" * 64, "android": "e" * 64})
    text = render_lock(full, "Its values came from a download of https://m/a.zip on 2026-12-04.")
    assert text == (
        "# qnnctl.lock: the QAIRT SDK this project uses, pinned by its checksums.\n"
        f"# Written by `qnnctl lock` (qnnctl {__version__}); commit it. `qnnctl install` checks every\n"
        "# archive of this version against it (a mismatch exits 4 and installs nothing), and\n"
        "# `qnnctl lock --check` exits 1 when it and what qnnctl resolves disagree.\n"
        "#\n"
        "# Trust on first use: Qualcomm publishes no checksums for its archives. Its values came from a\n"
        "# download of https://m/a.zip on 2026-12-04.\n"
        "# Nothing else vouches for these values: check them once against a copy you trust.\n"
        "\n"
        "schema = 2\n"
        "\n"
        "[sdk]\n"
        f'version = "{VERSION}"\n'
        f'build_id = "{BUILD}"\n'
        f'sha256 = "{"a" * 64}"\n'
        "size = 123\n"
        f'central_directory_sha256 = "{"c" * 64}"\n'
        'components = ["host", "android"]\n'
        'urls = ["https://m/a.zip", "q\\"x"]\n'
        'locked_at = "2026-12-04T00:00:00Z"\n'
        "\n"
        "[sdk.component_sha256]\n"
        f'"android" = "{"e" * 64}"\n'
        f'"host" = "{"d" * 64}"\n')
    folder = tmp_path / "project"
    folder.mkdir()
    path = _lock(folder, size=123, build_id=BUILD, urls=("https://m/a.zip", 'q"x'), central_directory_sha256="c" * 64,
                 components=("host", "android"), locked_at="2026-12-04T00:00:00Z",
                 component_sha256={"host": "d" * 64, "android": "e" * 64})
    assert read_lock(path) == full._replace(path=path)
    assert [p.name for p in folder.iterdir()] == ["qnnctl.lock"]  # written aside, then moved
    bare = LockedSdk(path, VERSION, "a" * 64)
    assert render_lock(bare, "t").endswith(f'\n[sdk]\nversion = "{VERSION}"\nsha256 = "{"a" * 64}"\nurls = []\n')
    _lock(folder)
    assert read_lock(path) == bare


def test_what_a_lock_holds_an_archive_to_includes_its_central_directory(tmp_path: Path) -> None:
    from qnnctl.sdk.gate import Expected
    from qnnctl.sdk.lockfile import read_lock

    lock = read_lock(_lock(tmp_path, size=9, central_directory_sha256="c" * 64, component_sha256={"host": "d" * 64}))
    assert lock.expected() == Expected(
        str(tmp_path / "qnnctl.lock"), "the lock", "pins",
        "the archive or the mirror serving it changed; if the new archive is the one to trust, write the lock again "
        f"with `qnnctl lock {VERSION}`", sha256="a" * 64, size=9, components={"host": "d" * 64},
        central_directory_sha256="c" * 64)


@pytest.mark.parametrize(("body", "said"), [
    ("schema = 3\n[sdk]\n", "has schema 3; this qnnctl reads schemas 1, 2"),
    ("[sdk]\n", "has schema None; this qnnctl reads schemas 1, 2"),
    ("schema = 2\nsdk = 1\n", "has no [sdk] table"),
    ("schema = 1\n[sdk]\nversion = \"2.37\"\n", ": sdk.version '2.37' is not an SDK version"),
    (f"schema = 1\n[sdk]\nversion = 2\nsha256 = \"{'a' * 64}\"\n", ": sdk.version 2 is not an SDK version"),
    (f"schema = 1\n[sdk]\nversion = \"{VERSION}\"\nsha256 = \"{'A' * 64}\"\n",
     f": sdk.sha256 '{'A' * 64}' is not a sha256 digest (64 lowercase hex digits)"),
    (f"schema = 2\n[sdk]\nversion = \"{VERSION}\"\nsha256 = \"{'a' * 64}\"\ncomponent_sha256 = [\"x\"]\n",
     ": sdk.component_sha256 must map each component to a sha256 digest"),
    (f"schema = 2\n[sdk]\nversion = \"{VERSION}\"\nsha256 = \"{'a' * 64}\"\n[sdk.component_sha256]\nhost = \"x\"\n",
     ": sdk.component_sha256 must map each component to a sha256 digest"),
])
def test_a_lock_that_is_no_lock_is_refused_naming_it(tmp_path: Path, body: str, said: str) -> None:
    from qnnctl.sdk.lockfile import LockError, read_lock

    path = tmp_path / "qnnctl.lock"
    path.write_text(body)
    with pytest.raises(LockError) as refused:
        read_lock(path)
    assert refused.value.message == f"{path}{'' if said.startswith(':') else ' '}{said}"
    assert refused.value.hint == f"fix it, or write it again with `qnnctl lock` (in {tmp_path})"
    assert refused.value.exit_code == 1


def test_a_lock_too_big_too_deep_unreadable_or_not_toml(tmp_path: Path) -> None:
    from qnnctl.sdk.lockfile import LockError, read_lock

    path = tmp_path / "qnnctl.lock"
    valid = f"schema = 2\n[sdk]\nversion = \"{VERSION}\"\nsha256 = \"{'a' * 64}\"\n"

    def refusal(data: bytes) -> str:
        path.write_bytes(data)
        with pytest.raises(LockError) as refused:
            read_lock(path)
        return refused.value.message

    path.write_text(valid + "#" * ((1 << 20) - len(valid)))  # as large as a lock can be
    assert read_lock(path).version == VERSION
    assert refusal(valid.encode() + b"#" * ((1 << 20) + 1 - len(valid))) == \
        f"{path} is larger than a lock can be (1048576 bytes)"
    path.write_text(valid + "x = " + "[" * 16 + "]" * 16 + "\n")
    assert read_lock(path).version == VERSION
    assert refusal((valid + "x = " + "[" * 17 + "]" * 17 + "\n").encode()) == \
        f"{path} nests arrays or tables deeper than a lock can (16 levels)"
    assert refusal(valid.encode() + b"x = \"\xff\"\n").startswith(f"cannot read the lock {path}: ")
    assert refusal(valid.encode() + b"x = \n").startswith(f"{path} is not TOML: ")
    path.unlink()
    with pytest.raises(LockError, match=f"^cannot read the lock {re.escape(str(path))}: "):
        read_lock(path)


def test_what_counts_as_nesting_in_a_lock() -> None:
    from qnnctl.sdk.limits import nesting_depth as _toml_depth

    assert _toml_depth("") == 0
    assert _toml_depth("a = [[1], {b = [2]}]\nc = [3]") == 3
    assert _toml_depth("a = [1]]]]\nb = [[2]]") == 2  # too many closing brackets count as none
    assert _toml_depth('a = "[[[{"\nb = \'[[[\'\nc = """[[\n[[""" # [[[[\nd = [1]') == 1
    assert _toml_depth('a = "\\"[[[" # ]\nb = [1]') == 1  # an escaped quote ends no string
    assert _toml_depth("a = 'x\\' # [[\nb = [1]") == 1  # a literal string escapes nothing
    assert _toml_depth("a = '''[[''' [\n") == 1
    assert _toml_depth("# [[[[") == 0
    assert _toml_depth("[a]\n# [[[[\n") == 1
    # The same reading serves a mirror's JSON index: brackets in its strings nest nothing.
    assert _toml_depth('{"a": [1, {"b": "[[\\"[["}], "c": {}}') == 3
    assert _toml_depth('a = "[[[') == 0  # a string that never ends


def test_a_lock_takes_what_it_can_read_of_the_optional_fields(tmp_path: Path) -> None:
    from qnnctl.sdk.lockfile import read_lock

    path = tmp_path / "qnnctl.lock"
    path.write_text(f"schema = 1\n[sdk]\nversion = \"{VERSION}\"\nsha256 = \"{'a' * 64}\"\nsize = true\n"
                    "build_id = 7\nurls = [\"u\", 3]\ncentral_directory_sha256 = \"c\"\ncomponents = [\"host\", 1]\n"
                    "locked_at = 5\n[sdk.component_sha256]\n")
    lock = read_lock(path)
    assert (lock.size, lock.build_id, lock.urls, lock.central_directory_sha256, lock.components, lock.locked_at,
            lock.component_sha256) == (None, None, ("u",), None, ("host",), None, None)
    path.write_text(f"schema = 1\n[sdk]\nversion = \"{VERSION}\"\nsha256 = \"{'a' * 64}\"\nsize = 0\n"
                    "urls = \"u\"\ncomponents = \"host\"\n")
    lock = read_lock(path)
    assert (lock.size, lock.urls, lock.components) == (0, (), None)


def test_the_nearest_lock_and_where_a_new_one_goes(tmp_path: Path) -> None:
    from qnnctl.sdk.lockfile import LockError, lock_destination, require_lock
    from qnnctl.sdk.select import find_lock

    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_lock(deep) is None
    assert lock_destination(deep) == deep / "qnnctl.lock"
    with pytest.raises(LockError) as refused:
        require_lock(deep)
    assert (refused.value.message, refused.value.hint) == (
        f"--locked: there is no qnnctl.lock in {deep} or any folder above it",
        "write one with `qnnctl lock` (and commit it), or drop --locked")
    (tmp_path / ".qnn-version").write_text(f"{VERSION}\n")
    assert lock_destination(deep) == tmp_path / "qnnctl.lock"
    (tmp_path / "qnnctl.lock").write_text("")
    (deep / "qnnctl.lock").mkdir()  # a folder of that name is no lock
    assert find_lock(deep) == tmp_path / "qnnctl.lock"
    assert require_lock(deep) == tmp_path / "qnnctl.lock"
    (tmp_path / "a" / "qnnctl.lock").write_text("")
    assert find_lock(deep) == tmp_path / "a" / "qnnctl.lock"


def _sdk_with(tmp_path: Path, build: str | None, manifest: dict[str, object] | None) -> object:
    from qnnctl.sdk.layout import Sdk

    root = build_sdk_tree(tmp_path / "sdks" / VERSION, SdkSpec(version=VERSION, build_id=build))
    if manifest is not None:
        (root / ".qnnctl.json").write_text(json.dumps(manifest))
    return Sdk(root, VERSION, "--sdk")


def test_an_sdk_is_compared_with_a_lock_by_its_archive_then_its_components_then_its_build(tmp_path: Path) -> None:
    from qnnctl.sdk.layout import Sdk, read_build_id
    from qnnctl.sdk.lockfile import LockedSdk, compare, disagreements
    from qnnctl.sdk.members import tree_digests

    sdk = _sdk_with(tmp_path, BUILD, {"sha256": "a" * 64})
    assert isinstance(sdk, Sdk)
    cache = Cache(tmp_path)  # the SDK is one of its: its manifest is qnnctl's record
    build = read_build_id(sdk.root)
    assert build is not None
    lock = LockedSdk(tmp_path / "qnnctl.lock", VERSION, "a" * 64, build_id=build)
    by_archive = "the sha256 of the archive it was installed from"
    assert compare(lock, sdk, cache) == ([], by_archive)
    assert disagreements(lock, VERSION, sdk, cache) == []
    assert disagreements(lock, VERSION, None, cache) == []
    assert disagreements(lock, OTHER_VERSION, sdk, cache) == [f"qnnctl.lock pins SDK {VERSION}, not {OTHER_VERSION}"]
    other = lock._replace(sha256="b" * 64)
    assert compare(other, sdk, cache) == ([f"SDK {VERSION} at {sdk.root} (--sdk) was installed from an archive "
                                           "whose sha256 "
                                    f"is {'a' * 64}; qnnctl.lock pins {'b' * 64}"], by_archive)
    # Build ids are compared whole: one that starts with the other is another build.
    for pinned in (build[:-2], build + "00", "v" + build):
        assert compare(lock._replace(build_id=pinned), sdk, cache) == (
            [f"the libraries of SDK {VERSION} at {sdk.root} (--sdk) are build {build}; qnnctl.lock pins build "
             f"{pinned}"], by_archive)
    assert compare(lock._replace(build_id=None), sdk, cache) == ([], by_archive)
    # Installed by parts: the sha256 recorded is of no archive it holds all of; its components count.
    digests = tree_digests(sdk.root, skip={".qnnctl.json"})
    (sdk.root / ".qnnctl.json").write_text(json.dumps({"sha256": "a" * 64, "partial": True,
                                                       "components": ["host"]}))
    parts = lock._replace(sha256="b" * 64, component_sha256={"host": digests["host"], "android": "e" * 64})
    assert compare(parts, sdk, cache) == ([], "the digests of its components (host)")
    assert compare(parts._replace(component_sha256={"android": "e" * 64}), sdk, cache) == (
        [f"the files of component host of SDK {VERSION} at {sdk.root} (--sdk) have digest {digests['host']}; "
         "qnnctl.lock pins none"], "the digests of its components (host)")
    (sdk.root / ".qnnctl.json").write_text(json.dumps({"components": ["host"], "component_sha256": {"host": "f" * 64}}))
    assert compare(parts, sdk, cache)[0] == [f"the files of component host of SDK {VERSION} at {sdk.root} (--sdk) have "
                                      f"digest {'f' * 64}; qnnctl.lock pins {digests['host']}"]
    # No manifest: every component its files hold, hashed as they are now.
    (sdk.root / ".qnnctl.json").unlink()
    names = ", ".join(sorted(digests))
    assert compare(lock._replace(component_sha256=digests), sdk, cache) == (
        [], f"the digests of its components ({names})")
    assert compare(lock._replace(component_sha256={**digests, "docs": "e" * 64}), sdk, cache) == (
        [], f"the digests of its components ({names})")
    assert compare(lock._replace(component_sha256={"host": digests["host"]}), sdk, cache)[0] == [
        f"the files of component {name} of SDK {VERSION} at {sdk.root} (--sdk) have digest {digests[name]}; "
        "qnnctl.lock pins none" for name in sorted(digests) if name != "host"]
    # Nothing to compare by: said, unless the builds already disagree.
    assert compare(lock, sdk, cache) == ([], None)
    assert disagreements(lock, VERSION, sdk, cache) == [
        f"SDK {VERSION} at {sdk.root} (--sdk) cannot be checked against {lock.path}: qnnctl has no record of the "
        "archive it came from, and the lock pins no digest of its components (a lock of schema 1, written before "
        "they existed)"]
    assert disagreements(lock._replace(build_id=build + "0"), VERSION, sdk, cache) == [
        f"the libraries of SDK {VERSION} at {sdk.root} (--sdk) are build {build}; qnnctl.lock pins build {build}0"]


def test_the_staged_runtime_a_lock_pins_is_written_and_read_by_kind(tmp_path: Path) -> None:
    from qnnctl.sdk.lockfile import LockedSdk, read_lock, render_lock

    pinned = {"libcxx": {"lib/libc++.so.1": "1" * 64, "lib/libc++abi.so.1": "2" * 64}, "glibc": {"libm.so.6": "3" * 64}}
    lock = LockedSdk(tmp_path / "qnnctl.lock", VERSION, "a" * 64, runtime_sha256=pinned)
    text = render_lock(lock, "t")
    assert text.endswith(f'urls = []\n\n[runtime."glibc"]\n"libm.so.6" = "{"3" * 64}"\n\n[runtime."libcxx"]\n'
                         f'"lib/libc++.so.1" = "{"1" * 64}"\n"lib/libc++abi.so.1" = "{"2" * 64}"\n')
    (tmp_path / "qnnctl.lock").write_text(text)
    assert read_lock(tmp_path / "qnnctl.lock") == lock
    (tmp_path / "qnnctl.lock").write_text(text.split("\n[runtime.")[0] + "\n[runtime]\n")
    assert read_lock(tmp_path / "qnnctl.lock").runtime_sha256 is None  # an empty table pins nothing


@pytest.mark.parametrize("runtime", ["runtime = 1", "runtime = {libcxx = 1}", "[runtime.libcxx]\n\"a\" = \"x\"",
                                     "[runtime.libcxx]\n\"a\" = 7", "runtime = []"])
def test_a_runtime_table_that_maps_no_file_to_a_sha256_is_refused(tmp_path: Path, runtime: str) -> None:
    from qnnctl.sdk.lockfile import LockError, read_lock

    path = tmp_path / "qnnctl.lock"
    path.write_text(f"schema = 2\n{runtime}\n[sdk]\nversion = \"{VERSION}\"\nsha256 = \"{'a' * 64}\"\n"
                    if runtime.startswith("runtime =") else
                    f"schema = 2\n[sdk]\nversion = \"{VERSION}\"\nsha256 = \"{'a' * 64}\"\n{runtime}\n")
    with pytest.raises(LockError) as refused:
        read_lock(path)
    assert refused.value.message == f"{path}: each [runtime.<kind>] table must map a file to a sha256 digest"
    assert refused.value.hint == f"fix it, or write it again with `qnnctl lock` (in {tmp_path})"


def test_the_runtime_a_projects_lock_pins_for_a_version(tmp_path: Path) -> None:
    from qnnctl.sdk.lockfile import locked_runtime

    project = tmp_path / "project"
    deep = project / "src"
    deep.mkdir(parents=True)
    assert locked_runtime(VERSION, deep) is None  # no lock
    _lock(project)
    assert locked_runtime(VERSION, deep) is None  # a lock that pins no runtime
    pinned = {"libcxx": {"lib/libc++.so.1": "1" * 64}}
    path = _lock(project, runtime_sha256=pinned)
    assert locked_runtime(VERSION, deep) == (path, pinned)
    assert locked_runtime(OTHER_VERSION, deep) is None  # a lock of another version


def test_a_lock_whose_sha256_matches_while_a_component_does_not_contradicts_itself(tmp_path: Path) -> None:
    """Installed whole from the archive the lock pins, the SDK's components are what the archive
    holds: a lock that pins other digests for them was edited, and vouches for nothing."""
    from qnnctl.sdk.layout import Sdk
    from qnnctl.sdk.lockfile import LockedSdk, compare
    from qnnctl.sdk.members import tree_digests

    sdk = _sdk_with(tmp_path, None, None)
    assert isinstance(sdk, Sdk)
    cache = Cache(tmp_path)
    digests = tree_digests(sdk.root)
    (sdk.root / ".qnnctl.json").write_text(json.dumps({"sha256": "a" * 64, "component_sha256": digests}))
    lock = LockedSdk(tmp_path / "qnnctl.lock", VERSION, "a" * 64, component_sha256=digests)
    by_archive = "the sha256 of the archive it was installed from"
    assert compare(lock, sdk, cache) == ([], by_archive)
    where = f"SDK {VERSION} at {sdk.root} (--sdk)"
    edited = {**digests, "host": "e" * 64, "docs": "f" * 64}
    assert compare(lock._replace(component_sha256=edited), sdk, cache) == ([
        f"qnnctl.lock contradicts itself: its sha256 is the archive's, but the files of component docs of {where} "
        f"have digest none; qnnctl.lock pins {'f' * 64}",
        f"the files of component host of {where} have digest {digests['host']}; qnnctl.lock pins {'e' * 64}"],
        by_archive)
    # A component the lock leaves out is one it contradicts too, as is one the SDK lacks.
    assert compare(lock._replace(component_sha256={"host": digests["host"]}), sdk, cache)[0] == [
        ("qnnctl.lock contradicts itself: its sha256 is the archive's, but " if i == 0 else "")
        + f"the files of component {name} of {where} have digest {digests[name]}; qnnctl.lock pins none"
        for i, name in enumerate(n for n in sorted(digests) if n != "host")]
    # Another archive's sha256: said first, and the components' disagreement is no contradiction then.
    assert compare(lock._replace(sha256="b" * 64, component_sha256={**digests, "host": "e" * 64}), sdk, cache)[0] == [
        f"{where} was installed from an archive whose sha256 is {'a' * 64}; qnnctl.lock pins {'b' * 64}",
        f"the files of component host of {where} have digest {digests['host']}; qnnctl.lock pins {'e' * 64}"]


def test_a_lock_whose_sha256_matches_while_its_central_directory_does_not_contradicts_itself(
        tmp_path: Path) -> None:
    from qnnctl.sdk.layout import Sdk
    from qnnctl.sdk.lockfile import LockedSdk, compare

    sdk = _sdk_with(tmp_path, None, None)
    assert isinstance(sdk, Sdk)
    cache = Cache(tmp_path)
    (sdk.root / ".qnnctl.json").write_text(json.dumps({"sha256": "a" * 64, "central_directory_sha256": "c" * 64}))
    lock = LockedSdk(tmp_path / "qnnctl.lock", VERSION, "a" * 64, central_directory_sha256="c" * 64)
    assert compare(lock, sdk, cache) == ([], "the sha256 of the archive it was installed from")
    where = f"SDK {VERSION} at {sdk.root} (--sdk)"
    assert compare(lock._replace(central_directory_sha256="d" * 64), sdk, cache)[0] == [
        f"qnnctl.lock contradicts itself: its sha256 is the archive's, but the central directory of the archive "
        f"{where} was installed from has sha256 {'c' * 64}; qnnctl.lock pins {'d' * 64}"]
    # Another archive's sha256: said, and the central directory's disagreement follows from it.
    assert compare(lock._replace(sha256="b" * 64, central_directory_sha256="d" * 64), sdk, cache)[0] == [
        f"{where} was installed from an archive whose sha256 is {'a' * 64}; qnnctl.lock pins {'b' * 64}"]


def test_the_components_a_projects_lock_names_for_a_version(tmp_path: Path) -> None:
    from qnnctl.errors import UsageError
    from qnnctl.sdk.lockfile import ProjectLock

    project = tmp_path / "project"
    project.mkdir()
    assert ProjectLock(project).components(VERSION) is None  # no lock
    _lock(project)
    assert ProjectLock(project).components(VERSION) is None  # none named
    _lock(project, components=())
    assert ProjectLock(project).components(VERSION) is None
    _lock(project, components=("android",))
    assert ProjectLock(project).components(VERSION) == ("host", "android")
    assert ProjectLock(project).components(OTHER_VERSION) is None
    path = _lock(project, components=("andriod",))
    with pytest.raises(UsageError, match=f"^{re.escape(str(path))} \\(sdk.components\\)"):
        ProjectLock(project).components(VERSION)


def test_each_lock_that_cannot_be_read_is_refused_with_how_to_mend_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl.sdk import lockfile
    from qnnctl.sdk.lockfile import LockError, expected_for_download, read_lock

    path = tmp_path / "qnnctl.lock"
    mend = f"fix it, or write it again with `qnnctl lock` (in {tmp_path})"

    def refusal(content: bytes) -> tuple[str, str | None]:
        path.write_bytes(content)
        with pytest.raises(LockError) as refused:
            read_lock(path)
        return refused.value.message, refused.value.hint

    assert refusal(b"#" * (1 << 20) + b"\n") == (f"{path} is larger than a lock can be ({1 << 20} bytes)", mend)
    message, hint = refusal(b"schema = 2\n# \xff\n")
    assert (message.startswith(f"cannot read the lock {path}: 'utf-8' codec can't decode"), hint) == (True, mend)
    message, hint = refusal(b"schema = \n")
    assert (message.startswith(f"{path} is not TOML: "), hint) == (True, mend)
    assert refusal(b"deep = " + b"[" * 17 + b"]" * 17 + b"\n") == (
        f"{path} nests arrays or tables deeper than a lock can (16 levels)", mend)

    def too_deep(text: str) -> dict[str, object]:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(lockfile, "_toml_loads", too_deep)  # what the depth check would miss
    assert refusal(b"schema = 2\n") == (f"{path} nests too deep to be read", mend)
    monkeypatch.undo()
    path.unlink()
    with pytest.raises(LockError) as refused:
        expected_for_download(VERSION, tmp_path / "elsewhere", True)
    assert (refused.value.message, refused.value.hint) == (
        f"--locked: there is no qnnctl.lock in {tmp_path / 'elsewhere'} or any folder above it",
        "write one with `qnnctl lock` (and commit it), or drop --locked")


@pytest.mark.stdlib
def test_a_locks_depth_is_counted_outside_its_strings_and_comments(tmp_path: Path) -> None:
    """read_lock refuses nesting deeper than 16 levels before tomllib (whose recursion a deep
    file would exhaust) reads it, counting the brackets of arrays and tables only: not those
    in comments or strings, literal, basic (with escapes) or multi-line."""
    from qnnctl.sdk.lockfile import LockedSdk, LockError, read_lock, render_lock

    base = render_lock(LockedSdk(tmp_path / "qnnctl.lock", VERSION, "a" * 64), "From a test.")
    deep = "[" * 17 + "]" * 17

    def refused_for_depth(extra: str) -> bool:
        path = tmp_path / "qnnctl.lock"
        path.write_text(base + extra)
        try:
            read_lock(path)
        except LockError as exc:
            return "nests arrays or tables deeper" in exc.message
        return False

    assert refused_for_depth(f"deep = {deep}\n")
    assert not refused_for_depth("deep = " + "[" * 16 + "]" * 16 + "\n")
    assert refused_for_depth(f"# a comment [[\ndeep = {deep}\n")  # a comment ends at its line
    assert refused_for_depth(f"X = {deep}\n")
    assert not refused_for_depth("X" * 17 + " = 1\n")
    assert refused_for_depth("deep = " + "[{X = " * 9 + "1" + "}]" * 9 + "\n")  # tables nest too
    assert not refused_for_depth(f'note = """a quote " then {deep} in a multi-line string"""\n')
    assert not refused_for_depth("note = '''a quote ' then " + deep + " in a literal one'''\n")
    assert not refused_for_depth(f"note = 'a literal string, {deep}'\n")
    assert refused_for_depth(f'escaped = "a backslash \\\\"\ndeep = {deep}\n')


def test_a_locks_comment_is_wrapped_at_96_columns_without_breaking_words(tmp_path: Path) -> None:
    from qnnctl.sdk.lockfile import LockedSdk, render_lock

    url = "https://mirror.example/" + "x" * 100 + ".zip"
    # The paragraph's first 70 characters, then a word that would end a line of 97.
    # Then a compound word that does not fit the rest of its line, whose hyphens it is not broken at.
    trust = "b" * 27 + " " + "c" * 50 + " well-known-and-long-hyphenated-compound word, and " + url + " as its source."
    text = render_lock(LockedSdk(tmp_path / "qnnctl.lock", VERSION, "a" * 64), trust)
    comment = [line.removeprefix("#").removeprefix(" ") for line in text.splitlines() if line.startswith("#")]
    assert comment[5] == "Trust on first use: Qualcomm publishes no checksums for its archives."
    assert comment[6] == "b" * 27 + " " + "c" * 50
    assert url in comment  # a long word on a line of its own, whole
    assert any("well-known-and-long-hyphenated-compound" in line for line in comment)
    assert all(len(line) <= 96 for line in comment if line != url)
    end = next(i for i, line in enumerate(comment) if line.endswith("as its source."))
    paragraph = comment[5:end + 1]
    for line, following in itertools.pairwise(paragraph):
        if line != url and following != url:
            assert len(line) + 1 + len(following.split()[0]) > 96, (line, following)  # each line filled


def test_a_lock_is_written_in_utf_8_whatever_the_locale(tmp_path: Path) -> None:
    code = ("import sys\nfrom pathlib import Path\nfrom qnnctl.sdk.lockfile import LockedSdk, write_lock\n"
            "write_lock(Path(sys.argv[1]), LockedSdk(Path(sys.argv[1]), sys.argv[2], 'a' * 64, "
            "urls=('https://d\\u00e9p\\u00f4t.example/v.zip',)), 'Fetched from the d\\u00e9p\\u00f4t.')")
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    path = tmp_path / "qnnctl.lock"
    proc = subprocess.run([sys.executable, "-c", code, str(path), VERSION], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Fetched from the dépôt." in path.read_bytes().decode("utf-8")


def test_each_way_an_sdk_disagrees_with_its_lock_is_said(tmp_path: Path) -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.sdk.lockfile import check_reused

    sdk = _sdk_with(tmp_path, BUILD, {"partial": True, "components": ["host", "docs"],
                                      "component_sha256": {"host": "f" * 64}})
    (tmp_path / "qnnctl.lock").write_text(f'schema = 2\n[sdk]\nversion = "{VERSION}"\nsha256 = "{"a" * 64}"\n'
                                          f'[sdk.component_sha256]\nhost = "{"b" * 64}"\ndocs = "{"c" * 64}"\n')
    with pytest.raises(IntegrityError) as refused:
        check_reused(sdk, tmp_path, False, Cache(tmp_path))  # type: ignore[arg-type]
    where = f"of SDK {VERSION} at {sdk.root} (--sdk)"  # type: ignore[attr-defined]
    assert refused.value.message == (
        f"the files of component host {where} have digest {'f' * 64}; qnnctl.lock pins {'b' * 64}; "
        f"the files of component docs {where} have digest none; qnnctl.lock pins {'c' * 64}")


def test_an_sdk_found_on_disk_is_checked_against_the_projects_lock(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.sdk.layout import Sdk
    from qnnctl.sdk.lockfile import LockError, check_reused, expected_for_download

    sdk = _sdk_with(tmp_path, None, {"sha256": "a" * 64})
    assert isinstance(sdk, Sdk)
    project = tmp_path / "project"
    project.mkdir()
    check_reused(sdk, project, False, Cache(tmp_path))  # no lock: nothing to check
    assert expected_for_download(VERSION, project, False) is None
    with pytest.raises(LockError, match=f"^--locked: there is no qnnctl.lock in {re.escape(str(project))} or any"):
        check_reused(sdk, project, True, Cache(tmp_path))
    path = _lock(project, version=OTHER_VERSION)
    with caplog.at_level("INFO", logger="qnnctl.sdk.lockfile"):
        check_reused(sdk, project, False, Cache(tmp_path))
    assert caplog.messages[-1] == f"{path} pins SDK {OTHER_VERSION}; SDK {VERSION} is not checked against it"
    with pytest.raises(LockError) as other:
        expected_for_download(VERSION, project, True)
    assert (other.value.message, other.value.hint) == (
        f"--locked: {path} pins SDK {OTHER_VERSION}, not {VERSION}",
        f"install {OTHER_VERSION} (`qnnctl use {OTHER_VERSION}` pins it for the project), or lock {VERSION} with "
        f"`qnnctl lock {VERSION}`")
    _lock(project, sha256="a" * 64)
    check_reused(sdk, project, True, Cache(tmp_path))
    locked = expected_for_download(VERSION, project, True)
    assert locked is not None
    assert locked.sha256 == "a" * 64
    _lock(project, sha256="b" * 64)
    with pytest.raises(IntegrityError) as refused:
        check_reused(sdk, project, False, Cache(tmp_path))
    assert refused.value.message == (f"SDK {VERSION} at {sdk.root} (--sdk) was installed from an archive whose "
                                     f"sha256 is {'a' * 64}; qnnctl.lock pins {'b' * 64}")
    assert refused.value.hint == (f"reinstall the locked archive: `qnnctl install --force {VERSION}`, or, if the SDK "
                                  f"in use is the one to trust, write the lock again: `qnnctl lock {VERSION}`")
    (sdk.root / ".qnnctl.json").unlink()
    caplog.clear()
    check_reused(sdk, project, False, Cache(tmp_path))
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"SDK {VERSION} at {sdk.root} (--sdk) cannot be checked against {project / 'qnnctl.lock'}: qnnctl has no "
        "record of the archive it came from, and the lock pins no digest of its components (a lock of schema 1, "
        "written before they existed); used unchecked"]
    with pytest.raises(IntegrityError) as unchecked:
        check_reused(sdk, project, True, Cache(tmp_path))
    assert unchecked.value.message.startswith(f"--locked: SDK {VERSION} at {sdk.root} (--sdk) cannot be checked ")
    assert unchecked.value.hint == (f"write the lock again with `qnnctl lock {VERSION}` (it then pins each "
                                    f"component), or install a checked copy: `qnnctl install --force {VERSION}`")


def test_a_store_folder_without_the_host_libraries_is_no_sdk(tmp_path: Path) -> None:
    """A store folder that names its version (sdk.yaml, its name) but lacks a library the
    layout needs is offered nowhere: not found, not listed among the store's SDKs."""
    from qnnctl.sdk.stores import find_in_stores, store_sdks

    store = tmp_path / "store"
    for name in (VERSION, "latest"):
        root = build_sdk_tree(store / name, SdkSpec())
        (root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so").unlink()
    environ = {"QNNCTL_STORES": str(store), "HOME": str(tmp_path)}
    assert find_in_stores(VERSION, environ) is None
    assert list(store_sdks(environ)) == []
    assert find_installed(VERSION, Cache(tmp_path / "cache"), environ) is None
    build_sdk_tree(store / "whole", SdkSpec())
    found = find_in_stores(VERSION, environ)
    assert found is not None
    assert found.root == store / "whole"
    assert [sdk.root for sdk in store_sdks(environ)] == [store / "whole"]


def test_a_mirror_index_lists_its_versions_oldest_first_by_number(server: FaultServer) -> None:
    from qnnctl.sdk.mirrorindex import indexed_versions

    entry = {"sha256": "a" * 64}
    server.add("/index.json", _index({"2.10.0.250101": entry, "2.9.0.250101": entry, "2.10.0.241231": entry}),
               "application/json")
    assert indexed_versions(server.base) == ["2.9.0.250101", "2.10.0.241231", "2.10.0.250101"]


def test_a_refused_mirror_is_tried_once_more_only(caplog: pytest.LogCaptureFixture) -> None:
    import socket

    from qnnctl.errors import DownloadError
    from qnnctl.sdk.mirrorindex import index_url, read_index

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"http://127.0.0.1:{port}/index.json"
    with pytest.raises(DownloadError):
        read_index(f"http://127.0.0.1:{port}/")
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retries == [f"cannot reach {url}: the connection was refused ([Errno 111] Connection refused); retrying in "
                       "1.0s (attempt 2 of 2)"]
    assert index_url("https://h/MIRROR_X/") == "https://h/MIRROR_X/index.json"
    assert index_url("https://h/m//") == "https://h/m/index.json"


def test_an_https_mirror_index_is_retried_as_an_http_one_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    from qnnctl.sdk.mirrorindex import read_index
    from tests.httpserver import self_signed_certificate

    certificate = self_signed_certificate(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate.cert))
    with FaultServer(tls=certificate) as server:
        server.add("/index.json", _index({}), "application/json")
        server.fail("/index.json", *[Fault.status(503, retry_after="0")] * 3)
        assert server.base.startswith("https://")
        assert read_index(server.base) is None
    url = f"{server.base}/index.json"
    assert _warnings(caplog) == [
        f"{url} answered HTTP 503 Service Unavailable; retrying in 0.0s (attempt 2 of 3)",
        f"{url} answered HTTP 503 Service Unavailable; retrying in 0.0s (attempt 3 of 3)",
        f"the mirror answered HTTP 503 for {url}; the archive is not checked against it",
    ]


def test_a_mirror_index_that_does_not_come_is_given_up(server: FaultServer, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    from qnnctl.sdk import mirrorindex

    monkeypatch.setattr(mirrorindex, "INDEX_TIMEOUT", (5.0, 0.2))  # as its 30 s, shortened
    server.add("/index.json", _index({}), "application/json")
    server.fail("/index.json", *[Fault.stall(3)] * 3)
    assert mirrorindex.read_index(server.base) is None
    assert _warnings(caplog)[-1].startswith(f"cannot read the mirror's {server.base}/index.json (")
