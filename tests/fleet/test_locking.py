"""`qnnctl lock`, `lock --check` and the notes of `qnnctl use`, in the tests' own process: the lock
written from an SDK's manifest, from a fresh install, or from its archive fetched once; what it
is compared with, and each refusal and note whole (test_fleet.py runs them through the command
line). SDK trees, manifests and locks are written by the tests; archives are served by the
loopback server."""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from qnnctl.errors import UsageError
from qnnctl.fleet.locking import (
    Verdict,
    Written,
    _components_of,
    _from_manifest,
    check_lock,
    make_lock,
    pinned_notes,
    verdict,
)
from qnnctl.install.archive import zip_digests
from qnnctl.install.zipindex import central_directory_sha256, end_records
from qnnctl.net.download import file_sha256
from qnnctl.sdk.cache import Cache, read_manifest
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.lockfile import LockedSdk, LockError, read_lock, write_lock
from qnnctl.sdk.members import tree_digests
from qnnctl.shell.exports import Marker
from tests.httpserver import FaultServer
from tests.sdkfactory import OTHER_VERSION, VERSION, SdkSpec, build_archive, build_sdk_tree

# Their outcome depends on the standard library (TOML reading).
pytestmark = pytest.mark.stdlib

BUILD = f"v{VERSION}101010"  # as the libraries carry it; qnnctl reads it without the "v"
OTHER_BUILD = f"v{OTHER_VERSION}101010"
LATER_BUILD = f"v{VERSION}202020"  # another build of the same version
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
MANIFEST = ".qnnctl.json"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder pinned to VERSION, with the folder `src` below it."""
    folder = tmp_path / "project"
    (folder / "src").mkdir(parents=True)
    (folder / ".qnn-version").write_text(f"{VERSION}\n")
    return folder


def _environ(server: FaultServer | None = None, **extra: str) -> dict[str, str]:
    """The tests' environment (scrubbed by conftest's `isolated`), with QNNCTL_MIRROR at the
    loopback server behind a password, which no lock may hold."""
    environ = dict(os.environ)
    if server is not None:
        environ["QNNCTL_MIRROR"] = server.base.replace("http://", "http://ci:s3cret@")
    environ.update(extra)
    return environ


class Served:
    """An SDK archive the loopback server holds, and what a lock made from it pins."""

    def __init__(self, server: FaultServer, folder: Path, version: str = VERSION, build: str | None = BUILD) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.archive = build_archive(folder, "zip", SdkSpec(version=version, build_id=build))
        data = self.archive.read_bytes()
        self.path = f"/{version}/v{version}.zip"
        server.add(self.path, data)
        self.url = f"http://***@{server.base.removeprefix('http://')}{self.path}"  # as redacted
        self.sha256 = file_sha256(self.archive)
        self.size = len(data)
        self.build_id = build[1:] if build is not None else None
        self.central_directory_sha256 = central_directory_sha256(
            lambda offset, size: data[offset:offset + size], end_records(data, len(data)))
        self.components = zip_digests(self.archive)


def _in_cache(cache: Cache, manifest: dict[str, Any], version: str = VERSION, build: str | None = BUILD) -> Path:
    """An SDK in qnnctl's cache with the manifest `manifest` (schema and version added)."""
    root = build_sdk_tree(cache.sdk_dir(version), SdkSpec(version=version, build_id=build))
    (root / MANIFEST).write_text(json.dumps({"schema": 1, "version": version, **manifest}))
    return root


def _lock(folder: Path, version: str = VERSION, sha256: str = "0" * 64, build_id: str | None = None) -> LockedSdk:
    """A lock written into `folder`, as read back."""
    path = folder / "qnnctl.lock"
    write_lock(path, LockedSdk(path=path, version=version, sha256=sha256, size=1, build_id=build_id,
                               urls=("https://example.com/old.zip",), locked_at="2026-01-01T00:00:00Z"), "Old.")
    return read_lock(path)


def _stamped(written: Written, before: float) -> str:
    """The time the lock was written at, checked: UTC, now, in the lock's format."""
    stamp = written.lock.locked_at
    assert stamp is not None
    assert STAMP.fullmatch(stamp), stamp
    assert int(before) - 1 <= calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) <= time.time() + 1
    return stamp


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _downloads(cache: Cache) -> list[str]:
    return sorted(p.name for p in cache.downloads.iterdir()) if cache.downloads.is_dir() else []


# -- what a manifest gives a lock ----------------------------------------------------------------


def test_the_components_an_sdk_was_installed_with_are_named_by_the_lock() -> None:
    assert _components_of(None) is None
    assert _components_of({}) is None
    assert _components_of({"components": None}) is None
    assert _components_of({"components": "host"}) is None  # not a list: not read as its letters
    assert _components_of({"components": ["host", "android"]}) == ("host", "android")
    assert _components_of({"sha256": "a" * 64, "components": ["hexagon-v73", 5]}) == ("hexagon-v73", "5")


def test_a_lock_takes_what_the_manifest_records_over_what_the_sdk_holds(tmp_path: Path) -> None:
    # The libraries carry another build than the manifest records, and the files digests of
    # their own: the manifest is what the lock is taken from.
    root = build_sdk_tree(tmp_path / "sdk", SdkSpec(build_id=LATER_BUILD))
    manifest = {"sha256": "a" * 64, "size": 1234, "build_id": BUILD[1:],
                "source": f"http://ci:s3cret@mirror.example/{VERSION}/v{VERSION}.zip",
                "central_directory_sha256": "c" * 64, "components": ["host", "android"],
                "component_sha256": {"host": "d" * 64, "android": "e" * 64}}
    sdk = Sdk(root, VERSION, "qnnctl cache")
    assert _from_manifest(manifest, VERSION, sdk, "2026-12-04T10:00:00Z") == LockedSdk(
        path=Path(), version=VERSION, sha256="a" * 64, size=1234, build_id=BUILD[1:],
        urls=(f"http://***@mirror.example/{VERSION}/v{VERSION}.zip",), central_directory_sha256="c" * 64,
        components=("host", "android"), locked_at="2026-12-04T10:00:00Z",
        component_sha256={"host": "d" * 64, "android": "e" * 64})


def test_what_the_manifest_does_not_record_is_read_from_the_sdk(tmp_path: Path) -> None:
    """A manifest of an earlier qnnctl: no build id, no component digests (the SDK's files are
    hashed, its manifest left out), no source, and values that are not what they should be."""
    root = build_sdk_tree(tmp_path / "sdk", SdkSpec(build_id=BUILD))
    (root / MANIFEST).write_text("{}")
    manifest = {"sha256": "b" * 64, "size": 99, "build_id": 7, "source": 5, "central_directory_sha256": "C" * 64,
                "component_sha256": ["host"]}
    files = tree_digests(root, skip={MANIFEST})
    assert files != tree_digests(root)  # the manifest is no member: skipped, it changes a digest
    assert _from_manifest(manifest, VERSION, Sdk(root, VERSION, "qnnctl cache"), "now") == LockedSdk(
        path=Path(), version=VERSION, sha256="b" * 64, size=99, build_id=BUILD[1:], urls=(),
        central_directory_sha256=None, components=None, locked_at="now", component_sha256=files)


def test_without_an_sdk_a_lock_takes_only_what_the_manifest_records() -> None:
    manifest = {"sha256": "b" * 64, "size": 99, "build_id": 7, "source": 5, "component_sha256": "host"}
    assert _from_manifest(manifest, OTHER_VERSION, None, "now") == LockedSdk(
        path=Path(), version=OTHER_VERSION, sha256="b" * 64, size=99, build_id=None, urls=(),
        central_directory_sha256=None, components=None, locked_at="now", component_sha256=None)


# -- qnnctl lock: from the manifest of an SDK installed ------------------------------------------


def test_a_lock_of_an_installed_sdk_is_taken_from_its_manifest_and_replaces_the_old_one(
        server: FaultServer, cache: Cache, project: Path, far_from_utc: None,
        capfd: pytest.CaptureFixture[str]) -> None:
    """Written beside .qnn-version, from the folder below it, with nothing fetched."""
    root = _in_cache(cache, {"sha256": "a" * 64, "size": 1234, "build_id": f"{VERSION}999999",
                             "source": f"http://ci:s3cret@mirror.example/{VERSION}/v{VERSION}.zip",
                             "installed_at": "2026-11-30T08:00:00Z", "central_directory_sha256": "c" * 64,
                             "component_sha256": {"host": "d" * 64, "android": "e" * 64}, "partial": False})
    Served(server, project.parent / "archive")  # there to be fetched, and not fetched
    old = _lock(project, OTHER_VERSION)
    before = time.time()
    written = make_lock(None, _environ(server), project / "src", cache)
    path = project / "qnnctl.lock"
    lock = LockedSdk(path=path, version=VERSION, sha256="a" * 64, size=1234, build_id=f"{VERSION}999999",
                     urls=(f"http://***@mirror.example/{VERSION}/v{VERSION}.zip",),
                     central_directory_sha256="c" * 64, components=None, locked_at=_stamped(written, before),
                     component_sha256={"host": "d" * 64, "android": "e" * 64})
    trust = (f"These values were recorded when SDK {VERSION} was installed from "
             f"http://***@mirror.example/{VERSION}/v{VERSION}.zip (2026-11-30T08:00:00Z).")
    assert written == Written(path, lock, trust, old)
    assert read_lock(path) == lock
    assert trust in " ".join(line.removeprefix("#").strip() for line in path.read_text().splitlines())
    assert server.requests == []
    assert (root / MANIFEST).is_file()
    assert capfd.readouterr() == ("", "")


def test_a_lock_pins_the_runtime_staged_in_the_cache_as_its_files_are_now(
        server: FaultServer, cache: Cache, project: Path) -> None:
    """The libraries of the staged runtime in use of each kind, hashed; one staged before it of
    the same kind, or a folder that is no staged runtime, not."""
    import hashlib

    _in_cache(cache, {"sha256": "a" * 64, "size": 1, "source": "s", "installed_at": "2026-11-30T08:00:00Z"})

    def stage(name: str, kind: str, when: int, files: dict[str, bytes]) -> None:
        root = cache.root / "runtime" / name
        (root / "lib").mkdir(parents=True)
        (root / MANIFEST).write_text(json.dumps({"schema": 1, "kind": kind, "staged_ns": when}))
        for file, data in files.items():
            (root / "lib" / file).write_bytes(data)

    written = make_lock(None, _environ(server), project, cache)
    assert written.lock.runtime_sha256 is None  # nothing staged: nothing pinned
    stage("libcxx-14-old", "libcxx", 1, {"libc++.so.1": b"old"})
    stage("libcxx-14", "libcxx", 2, {"libc++.so.1": b"trio 1", "libunwind.so.1": b"trio 3"})
    stage("glibc-2.35", "glibc", 3, {"libc.so.6": b"libc"})
    (cache.root / "runtime" / "half-staged" / "lib").mkdir(parents=True)  # no manifest: no runtime
    written = make_lock(None, _environ(server), project, cache)
    sha = {data: hashlib.sha256(data).hexdigest() for data in (b"trio 1", b"trio 3", b"libc")}
    pinned = {"libcxx": {"lib/libc++.so.1": sha[b"trio 1"], "lib/libunwind.so.1": sha[b"trio 3"]},
              "glibc": {"lib/libc.so.6": sha[b"libc"]}}
    assert written.lock.runtime_sha256 == pinned
    assert read_lock(project / "qnnctl.lock").runtime_sha256 == pinned
    assert server.requests == []


def test_a_manifest_that_says_neither_where_nor_when_is_said_so(server: FaultServer, cache: Cache,
                                                               project: Path) -> None:
    root = _in_cache(cache, {"sha256": "b" * 64, "size": 99}, build=None)
    (project / "qnnctl.lock").write_text("no lock\n")  # unreadable: replaced, and said to replace none
    written = make_lock(VERSION, _environ(server), project, cache)
    path = project / "qnnctl.lock"
    assert written == Written(path, LockedSdk(
        path=path, version=VERSION, sha256="b" * 64, size=99, build_id=None, urls=(), locked_at=written.lock.locked_at,
        component_sha256=tree_digests(root, skip={MANIFEST})),
        f"These values were recorded when SDK {VERSION} was installed from an unrecorded source "
        "(at an unrecorded time).", None)
    assert read_lock(path) == written.lock
    assert server.requests == []


def test_a_lock_without_a_pin_is_written_in_the_folder_it_is_made_in(server: FaultServer, cache: Cache,
                                                                     tmp_path: Path) -> None:
    _in_cache(cache, {"sha256": "b" * 64, "size": 99})
    here = tmp_path / "elsewhere"
    here.mkdir()
    written = make_lock(VERSION, _environ(server), here, cache)
    assert (written.path, written.lock.path, written.replaced) == (here / "qnnctl.lock", here / "qnnctl.lock", None)
    assert read_lock(here / "qnnctl.lock") == written.lock
    assert server.requests == []


# -- qnnctl lock: an SDK installed first --------------------------------------------------------


def test_a_version_not_installed_is_installed_and_locked_unchecked_by_the_old_lock(
        server: FaultServer, cache: Cache, tmp_path: Path, far_from_utc: None,
        capfd: pytest.CaptureFixture[str]) -> None:
    """Not the default version, which an install without it would choose; the old lock pins
    another archive of the same version, which the new one replaces."""
    served = Served(server, tmp_path / "archive", OTHER_VERSION, OTHER_BUILD)
    here = Path.cwd()
    old = _lock(here, OTHER_VERSION)
    before = time.time()
    written = make_lock(OTHER_VERSION, _environ(server), here, cache)
    path = here / "qnnctl.lock"
    lock = LockedSdk(path=path, version=OTHER_VERSION, sha256=served.sha256, size=served.size,
                     build_id=OTHER_BUILD[1:], urls=(served.url,),
                     central_directory_sha256=served.central_directory_sha256, components=None,
                     locked_at=_stamped(written, before), component_sha256=served.components)
    assert written == Written(path, lock, f"These values were computed from the archive qnnctl downloaded now from "
                                          f"{served.url}.", old)
    assert read_lock(path) == lock
    manifest = read_manifest(cache.sdk_dir(OTHER_VERSION))
    assert manifest is not None
    assert manifest["sha256"] == served.sha256
    assert len(server.requests_for(served.path)) == 1
    assert capfd.readouterr() == ("", "")  # no bar: not asked for one


def test_an_install_for_a_lock_on_a_terminal_draws_its_bar(server: FaultServer, cache: Cache, tmp_path: Path,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    served = Served(server, tmp_path / "archive")
    written = make_lock(VERSION, _environ(server), Path.cwd(), cache, terminal=True)
    assert written.lock.sha256 == served.sha256
    assert f"v{VERSION}.zip:" in capfd.readouterr().err


# -- qnnctl lock: an SDK on disk that records no checksum, its archive fetched once -----------


def _fetched_lock(written: Written, served: Served, components: tuple[str, ...] | None = None) -> LockedSdk:
    return LockedSdk(path=written.path, version=VERSION, sha256=served.sha256, size=served.size,
                     build_id=served.build_id, urls=(served.url,),
                     central_directory_sha256=served.central_directory_sha256, components=components,
                     locked_at=written.lock.locked_at, component_sha256=served.components)


def _fetched_trust(served: Served, where: str) -> str:
    return (f"These values were computed from the archive qnnctl downloaded now from {served.url} "
            f"(the SDK in use, {where}, records none).")


def test_an_sdk_whose_manifest_records_no_checksum_is_locked_from_its_archive_fetched_once(
        server: FaultServer, cache: Cache, tmp_path: Path, far_from_utc: None,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """Installed by an earlier qnnctl; the old lock, which pins another archive, does not stop
    the fetch; the archive is not kept, and the SDK is left as it is."""
    root = _in_cache(cache, {"files": {}})
    served = Served(server, tmp_path / "archive")
    here = Path.cwd()
    old = _lock(here)
    before = time.time()
    written = make_lock(VERSION, _environ(server), here, cache)
    _stamped(written, before)
    lock = _fetched_lock(written, served)
    assert written == Written(here / "qnnctl.lock", lock, _fetched_trust(served, f"{root} (qnnctl cache)"), old)
    assert read_lock(here / "qnnctl.lock") == lock
    assert len(server.requests_for(served.path)) == 1
    assert _downloads(cache) == []
    assert read_manifest(root) == {"schema": 1, "version": VERSION, "files": {}}
    assert _warnings(caplog) == []  # the same build as the archive's
    assert capfd.readouterr() == ("", "")


def test_an_sdk_installed_by_parts_is_locked_from_its_archive(server: FaultServer, cache: Cache, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Its manifest records a sha256 and a size, but it holds part of the archive: the values
    are not its own. Its libraries carry no build id, the archive's do: no warning."""
    root = _in_cache(cache, {"sha256": "a" * 64, "size": 1234, "partial": True}, build=None)
    served = Served(server, tmp_path / "archive")
    written = make_lock(VERSION, _environ(server), Path.cwd(), cache)
    assert written == Written(Path.cwd() / "qnnctl.lock", _fetched_lock(written, served),
                              _fetched_trust(served, f"{root} (qnnctl cache)"), None)
    assert _warnings(caplog) == []


def test_the_components_an_sdk_holds_are_locked_with_its_archive(server: FaultServer, cache: Cache, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Components chosen at install (not a partial one): the lock names them. The archive's
    libraries carry no build id, the SDK's do: no warning."""
    root = _in_cache(cache, {"sha256": "a" * 64, "size": 1234, "partial": False,
                             "components": ["host", "android"]})
    served = Served(server, tmp_path / "archive", build=None)
    written = make_lock(VERSION, _environ(server), Path.cwd(), cache)
    lock = _fetched_lock(written, served, ("host", "android"))
    assert written == Written(Path.cwd() / "qnnctl.lock", lock, _fetched_trust(served, f"{root} (qnnctl cache)"), None)
    assert read_lock(Path.cwd() / "qnnctl.lock") == lock
    assert _warnings(caplog) == []


def test_a_store_sdk_of_another_build_than_its_archive_is_locked_with_a_warning(
        server: FaultServer, cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """A store's SDK, with no manifest, on a terminal: the fetch draws its bar."""
    store = tmp_path / "store"
    root = build_sdk_tree(store / VERSION, SdkSpec(build_id=LATER_BUILD))
    served = Served(server, tmp_path / "archive")
    here = Path.cwd()
    old = _lock(here)
    written = make_lock(VERSION, _environ(server, QNNCTL_STORES=str(store)), here, cache, terminal=True)
    where = f"{root} (store {store})"
    assert written == Written(here / "qnnctl.lock", _fetched_lock(written, served), _fetched_trust(served, where), old)
    assert _warnings(caplog) == [f"the SDK in use at {where} is build {LATER_BUILD[1:]}, but the archive is build "
                                 f"{BUILD[1:]}"]
    assert f"v{VERSION}.zip:" in capfd.readouterr().err
    assert _downloads(cache) == []
    assert not cache.sdk_dir(VERSION).exists()


# -- qnnctl lock: what it refuses ---------------------------------------------------------------


def test_no_lock_is_written_for_an_sdk_the_caller_manages(server: FaultServer, cache: Cache, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        make_lock(None, _environ(server, QNN_SDK_ROOT=""), tmp_path, cache)
    assert (caught.value.message, caught.value.hint) == (
        "QNN_SDK_ROOT is exported but empty: the caller manages the SDK, so there is none to lock",
        "give the version: `qnnctl lock VERSION`")
    assert not (tmp_path / "qnnctl.lock").exists()
    assert server.requests == []


def test_no_lock_is_written_for_an_sdk_whose_version_cannot_be_told(server: FaultServer, cache: Cache,
                                                                    tmp_path: Path) -> None:
    root = build_sdk_tree(tmp_path / "qairt", SdkSpec(sdk_yaml=False))
    with pytest.raises(UsageError) as caught:
        make_lock(str(root), _environ(server), tmp_path, cache)
    assert (caught.value.message, caught.value.hint) == (f"cannot tell the version of the SDK at {root}",
                                                         "give the version: `qnnctl lock VERSION`")
    assert not (tmp_path / "qnnctl.lock").exists()
    assert server.requests == []


# -- qnnctl lock --check ------------------------------------------------------------------------


def test_without_a_lock_there_is_no_verdict_and_the_check_fails_saying_how_to_write_one(
        cache: Cache, project: Path) -> None:
    _in_cache(cache, {"sha256": "a" * 64, "size": 1})
    assert verdict(None, _environ(), project / "src", cache) is None
    with pytest.raises(LockError) as caught:
        check_lock(None, _environ(), project / "src", cache)
    assert (caught.value.message, caught.value.hint) == (
        f"there is no qnnctl.lock in {project / 'src'} or any folder above it",
        "write one with `qnnctl lock`, and commit it")


def test_an_installed_sdk_that_matches_the_lock_above_passes(cache: Cache, project: Path) -> None:
    root = _in_cache(cache, {"sha256": "a" * 64, "size": 1})
    lock = _lock(project, sha256="a" * 64, build_id=BUILD[1:])
    expected = Verdict(lock, VERSION, f"pinned in {project / '.qnn-version'}",
                       Sdk(root, VERSION, "qnnctl cache"), [])
    assert verdict(None, _environ(), project / "src", cache) == expected
    assert check_lock(None, _environ(), project / "src", cache) == expected


def test_a_locked_version_not_installed_yet_passes(cache: Cache, project: Path) -> None:
    """Nothing to compare yet: install checks it."""
    lock = _lock(project)
    expected = Verdict(lock, VERSION, f"pinned in {project / '.qnn-version'}", None, [])
    assert check_lock(None, _environ(), project / "src", cache) == expected


def test_an_installed_sdk_that_disagrees_with_its_lock_in_two_ways_is_refused_naming_both(
        cache: Cache, project: Path) -> None:
    root = _in_cache(cache, {"sha256": "a" * 64, "size": 1})
    lock = _lock(project, build_id=LATER_BUILD[1:])
    problems = [f"SDK {VERSION} at {root} (qnnctl cache) was installed from an archive whose sha256 is {'a' * 64}; "
                f"qnnctl.lock pins {'0' * 64}",
                f"the libraries of SDK {VERSION} at {root} (qnnctl cache) are build {BUILD[1:]}; qnnctl.lock pins "
                f"build {LATER_BUILD[1:]}"]
    assert verdict(None, _environ(), project, cache) == Verdict(
        lock, VERSION, f"pinned in {project / '.qnn-version'}", Sdk(root, VERSION, "qnnctl cache"), problems)
    with pytest.raises(LockError) as caught:
        check_lock(None, _environ(), project, cache)
    assert (caught.value.message, caught.value.hint) == (
        "; ".join(problems), f"`qnnctl lock {VERSION}` writes the lock for SDK {VERSION}")


def test_a_version_given_that_the_lock_does_not_pin_is_refused_with_both_ways_out(cache: Cache,
                                                                                  project: Path) -> None:
    lock = _lock(project)
    found = verdict(OTHER_VERSION, _environ(), project / "src", cache)
    assert found == Verdict(lock, OTHER_VERSION, f"argument: given as {OTHER_VERSION}", None,
                            [f"qnnctl.lock pins SDK {VERSION}, not {OTHER_VERSION}"])
    with pytest.raises(LockError) as caught:
        check_lock(OTHER_VERSION, _environ(), project / "src", cache)
    assert (caught.value.message, caught.value.hint) == (
        f"qnnctl.lock pins SDK {VERSION}, not {OTHER_VERSION}",
        f"pin the locked version with `qnnctl use {VERSION}`, or `qnnctl lock {OTHER_VERSION}` writes the lock for "
        f"SDK {OTHER_VERSION} (qnnctl chose {OTHER_VERSION}: argument: given as {OTHER_VERSION})")


def test_the_newest_sdk_installed_is_what_an_unpinned_project_is_checked_as(cache: Cache, tmp_path: Path) -> None:
    """No pin: the step "the newest SDK installed", which needs the cache, chooses."""
    root = _in_cache(cache, {"sha256": "a" * 64, "size": 1}, OTHER_VERSION, OTHER_BUILD)
    lock = _lock(tmp_path)
    assert verdict(None, _environ(), tmp_path, cache) == Verdict(
        lock, OTHER_VERSION, "installed: the newest SDK already installed", Sdk(root, OTHER_VERSION, "qnnctl cache"),
        [f"qnnctl.lock pins SDK {VERSION}, not {OTHER_VERSION}"])


def test_an_sdk_named_by_its_folder_is_checked_as_what_it_is(cache: Cache, tmp_path: Path) -> None:
    root = build_sdk_tree(tmp_path / "qairt", SdkSpec(build_id=BUILD))
    lock = _lock(tmp_path, sha256="a" * 64, build_id=LATER_BUILD[1:])
    problem = (f"the libraries of SDK {VERSION} at {root} (--sdk) are build {BUILD[1:]}; qnnctl.lock pins build "
               f"{LATER_BUILD[1:]}")
    assert verdict(str(root), _environ(), tmp_path, cache) == Verdict(
        lock, VERSION, f"argument: given as {root}", Sdk(root, VERSION, "--sdk"), [problem])
    # And by QNN_SDK_ROOT, which says so.
    by_env = verdict(None, _environ(QNN_SDK_ROOT=str(root)), tmp_path, cache)
    assert by_env == Verdict(lock, VERSION, "from QNN_SDK_ROOT", Sdk(root, VERSION, "QNN_SDK_ROOT"),
                             [problem.replace("(--sdk)", "(QNN_SDK_ROOT)")])


def test_a_version_prefix_is_resolved_by_what_the_mirror_lists(server: FaultServer, cache: Cache,
                                                               tmp_path: Path) -> None:
    """As `qnnctl install 2.37` would install it: the mirror lists a newer 2.37 than qnnctl knows."""
    newer = "2.37.5.251231"
    server.add("/index.json", json.dumps({"schema": 1, "versions": {newer: {"sha256": "a" * 64, "size": 1}}}).encode(),
               "application/json")
    lock = _lock(tmp_path)
    assert verdict("2.37", _environ(server), tmp_path, cache) == Verdict(
        lock, newer, "argument: given as 2.37", None, [f"qnnctl.lock pins SDK {VERSION}, not {newer}"])


# -- the notes of a new pin ----------------------------------------------------------------------


def _shell_for(folder: Path, version: str) -> dict[str, str]:
    """The environment of a shell that `qnnctl env` set up for an SDK of `version` at `folder`."""
    root = build_sdk_tree(folder, SdkSpec(version=version))
    return _environ(QNN_SDK_ROOT=str(root), QNNCTL_SDK=Marker(str(root), True).dumps())


def test_a_pin_that_disagrees_with_nothing_has_no_notes(cache: Cache, project: Path) -> None:
    _in_cache(cache, {"sha256": "a" * 64, "size": 1})
    _lock(project)
    assert pinned_notes(VERSION, _environ(), project / "src", cache) == []


def test_a_pin_of_a_version_not_installed_says_how_to_install_it(cache: Cache, project: Path) -> None:
    """Looked for in the stores and ExecuTorch's cache too, which it is not in."""
    assert pinned_notes(VERSION, _environ(), project / "src", cache) == [
        f"SDK {VERSION} is not installed; `qnnctl install` installs it"]


def test_a_pin_of_another_version_than_the_lock_says_what_fails_until_it_is_written_again(
        cache: Cache, project: Path) -> None:
    _in_cache(cache, {"sha256": "a" * 64, "size": 1}, OTHER_VERSION, OTHER_BUILD)
    _lock(project)
    assert pinned_notes(OTHER_VERSION, _environ(), project / "src", cache) == [
        f"{project / 'qnnctl.lock'} pins SDK {VERSION}, not {OTHER_VERSION}: `qnnctl lock --check` and `qnnctl "
        f"install --locked` fail until `qnnctl lock` writes it again for {OTHER_VERSION}"]


def test_a_lock_that_cannot_be_read_is_left_to_the_commands_that_check_it(cache: Cache, project: Path) -> None:
    _in_cache(cache, {"sha256": "a" * 64, "size": 1})
    (project / "qnnctl.lock").write_text("schema = 9\n")
    assert pinned_notes(VERSION, _environ(), project / "src", cache) == []


def test_a_pin_that_this_shells_sdk_hides_says_how_to_switch(cache: Cache, project: Path, tmp_path: Path) -> None:
    """The pinned version installed: switching is all it takes."""
    _in_cache(cache, {"sha256": "a" * 64, "size": 1})
    environ = _shell_for(tmp_path / "shell-sdk", OTHER_VERSION)
    assert pinned_notes(VERSION, environ, project / "src", cache) == [
        f"this shell was set up by `qnnctl env` for SDK {OTHER_VERSION} ({tmp_path / 'shell-sdk'}), but "
        f"{project / '.qnn-version'} pins SDK {VERSION}; `eval \"$(qnnctl env)\"` switches this shell to SDK {VERSION}"]


def test_each_disagreement_of_a_new_pin_is_said_in_turn(cache: Cache, project: Path, tmp_path: Path) -> None:
    _lock(project, OTHER_VERSION)
    environ = _shell_for(tmp_path / "shell-sdk", OTHER_VERSION)
    assert pinned_notes(VERSION, environ, project / "src", cache) == [
        f"SDK {VERSION} is not installed; `qnnctl install` installs it",
        f"{project / 'qnnctl.lock'} pins SDK {OTHER_VERSION}, not {VERSION}: `qnnctl lock --check` and `qnnctl "
        f"install --locked` fail until `qnnctl lock` writes it again for {VERSION}",
        f"this shell was set up by `qnnctl env` for SDK {OTHER_VERSION} ({tmp_path / 'shell-sdk'}), but "
        f"{project / '.qnn-version'} pins SDK {VERSION}; `qnnctl install {VERSION}`, then `eval \"$(qnnctl env)\"` "
        f"switches this shell to SDK {VERSION}"]
