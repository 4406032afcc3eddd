"""`qnnctl list`, `uninstall`, `use` and `cache clean`."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from filelock import FileLock

from qnnctl.errors import NotInstalledError
from qnnctl.install.prune import clean_cache, uninstall
from qnnctl.paths import tree_size
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.holds import HeldError, hold_sdk
from qnnctl.sdk.stores import link_sdk, read_link
from tests.conftest import run_qnnctl, start_qnnctl_waiting
from tests.sdkfactory import OTHER_VERSION, VERSION, SdkSpec, build_sdk_tree, install_tree_into_cache


def _executorch_sdk(version: str) -> Path:
    folder = Path(os.environ["XDG_CACHE_HOME"]) / "executorch" / "qnn" / f"sdk-{version}"
    return build_sdk_tree(folder, SdkSpec(version=version))


# -- list ------------------------------------------------------------------------------------


def test_list_json_when_nothing_is_installed() -> None:
    result = run_qnnctl("list", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"schema": 1, "sdks": []}


def test_list_json(cache_dir: Path, tmp_path: Path) -> None:
    ours = [install_tree_into_cache(cache_dir, v) for v in (VERSION, OTHER_VERSION)]
    build_sdk_tree(cache_dir / "sdks" / "2.40.0.251030")  # no manifest: not installed
    staging = tmp_path / "staging"
    staged = build_sdk_tree(staging / "sdk-2.28.2.241116", SdkSpec(version="2.28.2.241116", sdk_yaml=False))
    theirs = _executorch_sdk("2.31.0.250130")
    (theirs.parent / "sdk-2.32.0.250228").mkdir()  # an interrupted ExecuTorch download
    env = os.environ.copy()
    env["QNN_STAGING_DIR"] = str(staging)
    result = run_qnnctl("list", "--json", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["schema"] == 1
    rows = data["sdks"]
    assert [(r["version"], r["root"], r["origin"]) for r in rows] == [
        (OTHER_VERSION, str(ours[1]), "qnnctl cache"),
        (VERSION, str(ours[0]), "qnnctl cache"),
        ("2.28.2.241116", str(staged), "ExecuTorch cache"),
        ("2.31.0.250130", str(theirs), "ExecuTorch cache"),
    ]
    for row in rows:
        assert set(row) == {"version", "build_id", "root", "size", "origin", "missing", "components", "partial",
                            "held_by"}
        assert (row["components"], row["partial"]) == (["all"], False)
        assert row["held_by"] == []  # nothing runs
        assert row["build_id"] is None  # these libraries carry none
        assert row["missing"] == []
        assert row["size"] == tree_size(Path(row["root"])) > 0
    assert run_qnnctl("list", "--json", env=env).stdout == result.stdout  # stable


def test_list_text(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    result = run_qnnctl("list")
    assert result.returncode == 0, result.stderr
    header, line = result.stdout.splitlines()
    size = f"{tree_size(root) / (1 << 20):.1f} MiB"
    # The only SDK installed is the one used here (the newest installed), marked, and said why.
    assert header == "   version        build    size     where         root"
    assert line == f"*  {VERSION}  unknown  {size}  qnnctl cache  {root}"
    assert result.stderr == (f"qnnctl: * marks the SDK used here: SDK {VERSION} (installed: the newest SDK "
                             "already installed)\n")
    (root / "lib" / "x86_64-linux-clang" / "libQnnSystem.so").unlink()
    (_, damaged) = run_qnnctl("list").stdout.splitlines()
    assert damaged.endswith("  damaged: missing lib/x86_64-linux-clang/libQnnSystem.so")
    assert damaged.startswith(f"   {VERSION}")  # not used: nothing marked
    (row,) = json.loads(run_qnnctl("list", "--json").stdout)["sdks"]
    assert row["missing"] == ["lib/x86_64-linux-clang/libQnnSystem.so"]
    empty = run_qnnctl("uninstall", VERSION)
    assert empty.returncode == 0, empty.stderr
    nothing = run_qnnctl("list")
    assert nothing.stdout == ""
    assert "no SDK installed" in nothing.stderr


# -- uninstall -------------------------------------------------------------------------------


def test_uninstall_by_full_version(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    other = install_tree_into_cache(cache_dir, OTHER_VERSION)
    result = run_qnnctl("uninstall", VERSION)
    assert result.returncode == 0, result.stderr
    assert not root.exists()
    assert other.exists()
    assert result.stdout == ""
    assert list((cache_dir / "tmp").iterdir()) == []


def test_uninstall_waits_for_an_install_of_the_same_version(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    lock = FileLock(str(cache_dir / "locks" / f"{VERSION}.lock"))
    with lock.acquire(timeout=5):
        proc = start_qnnctl_waiting("uninstall", VERSION)
        assert root.exists()
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, ""), err
    assert not root.exists()
    # Removed meanwhile by the qnnctl that held the lock: said so, as for a version not installed.
    root = install_tree_into_cache(cache_dir, VERSION)
    with lock.acquire(timeout=5):
        proc = start_qnnctl_waiting("uninstall", VERSION)
        shutil.rmtree(root)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (1, "")
    assert err == (f"qnnctl: error: SDK {VERSION} is not installed in qnnctl's cache\n"
                   "qnnctl: hint: `qnnctl list` shows what is installed\n")


def test_uninstall_from_the_library_without_an_environment_names_what_is_not_installed(cache_dir: Path) -> None:
    """Called with no environment, no store is looked at: the version is just not installed."""
    from qnnctl.errors import NotInstalledError
    from qnnctl.install.prune import uninstall

    install_tree_into_cache(cache_dir, OTHER_VERSION)
    with pytest.raises(NotInstalledError) as caught:
        uninstall(VERSION, Cache(cache_dir))
    assert caught.value.message == f"SDK {VERSION} is not installed in qnnctl's cache"


def test_uninstall_by_prefix(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    result = run_qnnctl("uninstall", "2.37")
    assert result.returncode == 0, result.stderr
    assert not root.exists()


def test_uninstall_prefix_matches_whole_components(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    result = run_qnnctl("uninstall", "2.3")
    assert result.returncode == 1, result.stderr
    assert root.exists()


@pytest.mark.parametrize(("versions", "listed"), [
    (("2.28.2.241116", "2.28.0.241029"), "2.28.0.241029, 2.28.2.241116"),
    # In the order of the versions, not of their text.
    (("2.28.0.241029", "2.28.10.250101", "2.28.2.241116"), "2.28.0.241029, 2.28.2.241116, 2.28.10.250101"),
])
def test_uninstall_ambiguous_prefix(cache_dir: Path, versions: tuple[str, ...], listed: str) -> None:
    roots = [install_tree_into_cache(cache_dir, version) for version in versions]
    result = run_qnnctl("uninstall", "2.28")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"qnnctl: error: 2.28 matches more than one installed SDK: {listed}\n"
                             "qnnctl: hint: give the full version\n")
    assert all(root.exists() for root in roots)


def test_uninstall_not_installed(cache_dir: Path) -> None:
    theirs = _executorch_sdk(VERSION)
    result = run_qnnctl("uninstall", VERSION)
    assert result.returncode == 1, result.stderr
    assert result.stderr == (f"qnnctl: error: SDK {VERSION} is not installed in qnnctl's cache\n"
                             "qnnctl: hint: `qnnctl list` shows what is installed\n")
    assert theirs.exists()  # ExecuTorch's cache is never touched


def test_uninstall_of_a_prefix_of_no_known_release(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    result = run_qnnctl("uninstall", "2.99")
    assert result.returncode == 1, result.stderr
    assert result.stderr == ("qnnctl: error: SDK 2.99 is not installed in qnnctl's cache\n"
                             "qnnctl: hint: `qnnctl list` shows what is installed\n")


def test_uninstall_ignores_a_folder_without_manifest(cache_dir: Path) -> None:
    build_sdk_tree(cache_dir / "sdks" / VERSION)
    result = run_qnnctl("uninstall", VERSION)
    assert result.returncode == 1, result.stderr


def test_uninstall_garbage_is_a_usage_error(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    result = run_qnnctl("uninstall", "../sdks")
    assert result.returncode == 2, result.stderr


# -- use -------------------------------------------------------------------------------------


def test_use_writes_the_pin() -> None:
    result = run_qnnctl("use", "2.28")
    assert result.returncode == 0, result.stderr
    pin = Path.cwd() / ".qnn-version"
    assert result.stdout == f"{pin}\n"
    assert pin.read_text() == "2.28.2.241116\n"
    assert result.stderr.startswith(f"qnnctl: pinned SDK 2.28.2.241116 for this project: {pin}\n")  # the full version
    assert [p.name for p in Path.cwd().iterdir()] == [".qnn-version"]  # no temporary left


def test_use_replaces_the_pin() -> None:
    (Path.cwd() / ".qnn-version").write_text("2.28.2.241116\n")
    assert run_qnnctl("use", VERSION).returncode == 0
    assert (Path.cwd() / ".qnn-version").read_text() == f"{VERSION}\n"


@pytest.mark.parametrize("spec", ["2.99", "latest"])
def test_use_rejects_unknown_versions(spec: str) -> None:
    result = run_qnnctl("use", spec)
    assert result.returncode == 2, result.stderr
    assert not (Path.cwd() / ".qnn-version").exists()


# -- cache clean -----------------------------------------------------------------------------


def _leftovers(cache_dir: Path) -> dict[str, Path]:
    cache = Cache(cache_dir)
    cache.ensure()
    found = {
        "part": cache.downloads / f"v{VERSION}.zip.part",
        "meta": cache.downloads / f"v{VERSION}.zip.json",
        "finished": cache.downloads / "v2.28.2.241116.zip",
        "work": cache.tmp / f"{VERSION}.0123456789ab",
        "file-work": cache.tmp / "file.0123456789ab",
        "busy-work": cache.tmp / f"{OTHER_VERSION}.ba9876543210",
        "busy-part": cache.downloads / f"v{OTHER_VERSION}.zip.part",
    }
    for name, path in found.items():
        if "work" in name:
            (path / "x" / "qairt").mkdir(parents=True)
            (path / "x" / "qairt" / "f").write_text("x")
        else:
            path.write_bytes(b"partial")
    return found


def test_cache_clean(cache_dir: Path) -> None:
    sdk = install_tree_into_cache(cache_dir, VERSION)
    leftovers = _leftovers(cache_dir)
    # Another install of OTHER_VERSION is running: its work folder and partial stay.
    lock = FileLock(str(cache_dir / "locks" / f"{OTHER_VERSION}.lock"))
    with lock.acquire(timeout=5):
        result = run_qnnctl("cache", "clean")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    for name, path in leftovers.items():
        assert path.exists() == name.startswith("busy"), name
    assert "in use" in result.stderr
    assert (sdk / ".qnnctl.json").exists()
    again = run_qnnctl("cache", "clean")
    assert again.returncode == 0
    assert list((cache_dir / "tmp").iterdir()) == []
    assert list((cache_dir / "downloads").iterdir()) == []
    assert "nothing to clean" in run_qnnctl("cache", "clean").stderr


def test_clean_cache_reports_what_it_did(cache_dir: Path) -> None:
    leftovers = _leftovers(cache_dir)
    with FileLock(str(cache_dir / "locks" / f"{OTHER_VERSION}.lock")).acquire(timeout=5):
        cleaned = clean_cache(Cache(cache_dir))
    assert sorted(cleaned.busy) == sorted([leftovers["busy-work"], leftovers["busy-part"]])
    assert sorted(cleaned.removed) == sorted(path for name, path in leftovers.items() if not name.startswith("busy"))


def test_cache_clean_leaves_what_an_install_from_a_file_uses_and_does_not_wait_for_it(cache_dir: Path) -> None:
    """An install --file works under the `file` lock: its work folder (file.<id>), and anything in
    downloads/ that names no version, stay while it runs; each one in use is skipped at once."""
    leftovers = _leftovers(cache_dir)
    unnamed = cache_dir / "downloads" / "archive.zip.part"
    unnamed.write_bytes(b"partial")
    started = time.monotonic()
    with FileLock(str(cache_dir / "locks" / "file.lock")).acquire(timeout=5):
        cleaned = clean_cache(Cache(cache_dir))
    assert time.monotonic() - started < 1
    assert sorted(cleaned.busy) == sorted([leftovers["file-work"], unnamed])
    assert sorted(cleaned.removed) == sorted(path for name, path in leftovers.items() if name != "file-work")


def test_cache_clean_before_anything_was_installed(cache_dir: Path) -> None:
    assert not cache_dir.exists()
    result = run_qnnctl("cache", "clean")
    assert (result.returncode, result.stdout) == (0, "")
    assert "nothing to clean" in result.stderr


def test_list_shows_the_build_id_the_libraries_carry(cache_dir: Path, tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    build_sdk_tree(staging / f"sdk-{VERSION}", SdkSpec(build_id="v2.37.0.250724101112"))
    env = {**os.environ, "QNN_STAGING_DIR": str(staging)}
    (row,) = json.loads(run_qnnctl("list", "--json", env=env).stdout)["sdks"]
    assert row["build_id"] == "2.37.0.250724101112"
    (_, line) = run_qnnctl("list", env=env).stdout.splitlines()
    assert f"{VERSION}  2.37.0.250724101112  " in line


# -- uninstall --except and --all, as the library does them --------------------------------------


def _sized(cache_dir: Path, version: str, size: int) -> Path:
    root = install_tree_into_cache(cache_dir, version)
    manifest = json.loads((root / ".qnnctl.json").read_text())
    (root / ".qnnctl.json").write_text(json.dumps({**manifest, "unpacked_size": size}))
    return root


def test_prune_removes_all_but_the_versions_kept(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    from qnnctl.install.prune import Removed, prune

    third = "2.31.0.250130"
    roots = {v: _sized(cache_dir, v, size) for v, size in ((VERSION, 5 << 20), (OTHER_VERSION, 3 << 20),
                                                           (third, 1 << 20))}
    environ = dict(os.environ)
    cache = Cache(cache_dir)
    with caplog.at_level("INFO", logger="qnnctl.install.prune"):
        pruned = prune([f" {VERSION[:4]} "], False, cache, environ)
    assert pruned.kept == [VERSION]
    assert pruned.removed == [Removed(third, roots[third], 1 << 20), Removed(OTHER_VERSION, roots[OTHER_VERSION],
                                                                              3 << 20)]
    assert (pruned.busy, pruned.held, pruned.freed) == ([], [], 4 << 20)
    assert caplog.messages == [f"removed SDK {third} (1.0 MiB) from {roots[third]}",
                               f"removed SDK {OTHER_VERSION} (3.0 MiB) from {roots[OTHER_VERSION]}"]
    assert cache.installed_versions() == [VERSION]
    assert list((cache_dir / "tmp").iterdir()) == []  # moved aside there, then removed
    for version in (VERSION, OTHER_VERSION, third):  # every version's lock released
        FileLock(str(cache.lock_path(version))).acquire(timeout=0)
    everything = prune([VERSION], True, cache, environ)
    assert (everything.kept, everything.removed) == ([], [Removed(VERSION, roots[VERSION], 5 << 20)])
    assert cache.installed_versions() == []
    assert prune([], True, cache, environ) == ([], [], [], [])


def test_prune_keeps_what_each_spec_names_and_refuses_a_spec_that_names_nothing(cache_dir: Path,
                                                                                tmp_path: Path) -> None:
    from qnnctl.errors import UsageError
    from qnnctl.install.prune import kept_versions, prune

    for version in (VERSION, OTHER_VERSION, "2.37.1.250801"):
        install_tree_into_cache(cache_dir, version)
    cache = Cache(cache_dir)
    environ = dict(os.environ)
    assert kept_versions([VERSION, OTHER_VERSION], cache, environ) == {VERSION, OTHER_VERSION}
    assert kept_versions(["2.37"], cache, environ) == {VERSION, "2.37.1.250801"}
    assert kept_versions([], cache, environ) == set()
    with pytest.raises(UsageError) as refused:
        prune([VERSION, "2.38"], False, cache, environ)
    assert (refused.value.message, refused.value.hint) == (
        "--except 2.38: no SDK on disk is 2.38, so nothing was removed",
        "`qnnctl list` shows the SDKs on disk; give the versions to keep")
    with pytest.raises(UsageError, match="not an SDK version"):
        kept_versions(["latest"], cache, environ)
    assert len(cache.installed_versions()) == 3
    # An SDK elsewhere on disk (ExecuTorch's cache) is a version to keep: the cache's copies of
    # other versions go, that one stays where it is.
    elsewhere = _executorch_sdk("2.31.0.250130")
    assert kept_versions(["2.31"], cache, environ) == {"2.31.0.250130"}
    assert [r.version for r in prune(["2.31"], False, cache, environ).removed] == \
        [OTHER_VERSION, VERSION, "2.37.1.250801"]
    assert elsewhere.is_dir()


def test_prune_leaves_an_sdk_being_installed_or_in_use(cache_dir: Path) -> None:
    from qnnctl.install.prune import prune
    from qnnctl.sdk.holds import hold_sdk

    busy_root = install_tree_into_cache(cache_dir, VERSION)
    held_root = install_tree_into_cache(cache_dir, OTHER_VERSION)
    cache = Cache(cache_dir)
    installing = FileLock(str(cache.lock_path(VERSION)))
    installing.acquire()
    fd = hold_sdk(cache.sdk_dir(OTHER_VERSION), cache)
    assert fd is not None
    try:
        pruned = prune([], True, cache, dict(os.environ))
    finally:
        os.close(fd)
        installing.release()
    assert (pruned.removed, pruned.busy, pruned.kept) == ([], [(VERSION, busy_root)], [])
    assert [(e.version, e.root) for e in pruned.held] == [(OTHER_VERSION, held_root)]
    assert pruned.held[0].message.endswith("it was not removed")
    assert cache.installed_versions() == [OTHER_VERSION, VERSION]
    FileLock(str(cache.lock_path(OTHER_VERSION))).acquire(timeout=0)  # released though held
    assert [r.version for r in prune([], True, cache, dict(os.environ)).removed] == [OTHER_VERSION, VERSION]


def test_prune_says_sizes_as_list_does() -> None:
    from qnnctl.install.prune import mib

    assert (mib(252_300_000), mib(1_363_149)) == ("241 MiB", "1.3 MiB")


def test_prune_goes_on_past_a_version_kept_busy_or_gone(cache_dir: Path) -> None:
    from qnnctl.install.prune import prune

    oldest, middle, newest = "2.31.0.250130", OTHER_VERSION, VERSION
    for version in (oldest, middle, newest):
        install_tree_into_cache(cache_dir, version)
    cache = Cache(cache_dir)
    assert [r.version for r in prune([oldest], False, cache, dict(os.environ)).removed] == [middle, newest]
    for version in (middle, newest):
        install_tree_into_cache(cache_dir, version)
    installing = FileLock(str(cache.lock_path(oldest)))
    with installing:
        pruned = prune([], True, cache, dict(os.environ))
    assert (pruned.busy, [r.version for r in pruned.removed]) == ([(oldest, cache.sdk_dir(oldest))], [middle, newest])

    class Listed(Cache):
        """A cache whose listing still names a version another qnnctl removed just after."""

        def installed_versions(self) -> list[str]:
            return ["2.30.0.250101", *super().installed_versions()]

    assert [r.version for r in prune([], True, Listed(cache_dir), dict(os.environ)).removed] == [oldest]


def test_prune_does_not_wait_for_an_install_but_waits_for_holders_when_asked(cache_dir: Path) -> None:
    from qnnctl.install.prune import prune
    from qnnctl.sdk.holds import hold_sdk

    install_tree_into_cache(cache_dir, VERSION)
    cache = Cache(cache_dir)
    taken = threading.Event()

    def install_for_a_moment() -> None:
        with FileLock(str(cache.lock_path(VERSION))):
            taken.set()
            time.sleep(0.3)

    worker = threading.Thread(target=install_for_a_moment)
    worker.start()
    assert taken.wait(10)
    pruned = prune([], True, cache, dict(os.environ))
    worker.join()
    assert (pruned.busy, pruned.removed) == ([(VERSION, cache.sdk_dir(VERSION))], [])
    fd = hold_sdk(cache.sdk_dir(VERSION), cache)
    assert fd is not None
    threading.Timer(0.3, os.close, (fd,)).start()
    waited = prune([], True, cache, dict(os.environ), wait=True)
    assert ([r.version for r in waited.removed], waited.held) == ([VERSION], [])


def test_except_keeps_a_damaged_sdk_of_the_version_named(cache_dir: Path) -> None:
    from qnnctl.install.prune import kept_versions, prune

    damaged = install_tree_into_cache(cache_dir, VERSION)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    (damaged / "lib" / "x86_64-linux-clang" / "libQnnHtp.so").unlink()
    cache = Cache(cache_dir)
    assert kept_versions([VERSION], cache, dict(os.environ)) == {VERSION}
    assert [r.version for r in prune([VERSION], False, cache, dict(os.environ)).removed] == [OTHER_VERSION]


# -- uninstall, in the tests' own process --------------------------------------------------------


def _linked(cache: Cache, tmp_path: Path, version: str = VERSION) -> Path:
    folder = build_sdk_tree(tmp_path / "elsewhere" / version, SdkSpec(version=version))
    link_sdk(folder, version, cache, {})
    return folder


def test_uninstall_of_a_linked_sdk_drops_the_link_only(cache_dir: Path, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    cache = Cache(cache_dir)
    (cache_dir / "tmp").mkdir(parents=True)  # there already: it is reused
    folder = _linked(cache, tmp_path)
    with caplog.at_level(logging.INFO, logger="qnnctl.install.prune"):
        assert uninstall(VERSION, cache) == cache_dir / "links" / f"{VERSION}.json"
    assert read_link(cache, VERSION) is None
    assert (folder / "lib").is_dir()
    assert [r.getMessage() for r in caplog.records] == [
        f"removed the link of SDK {VERSION} to {folder}; the folder is left as it is"]


@pytest.mark.parametrize("gone", [False, True], ids=["folder there", "folder gone"])
def test_uninstall_of_an_sdk_also_linked_removes_the_cache_copy_and_says_the_link_stays(
        gone: bool, cache_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = Cache(cache_dir)
    (cache_dir / "tmp").mkdir(parents=True)
    root = install_tree_into_cache(cache_dir, VERSION)
    folder = _linked(cache, tmp_path)
    if gone:
        shutil.rmtree(folder)
    with caplog.at_level(logging.INFO, logger="qnnctl.install.prune"):
        assert uninstall(VERSION, cache) == root
    assert not root.exists()
    assert list((cache_dir / "tmp").iterdir()) == []
    link = read_link(cache, VERSION)
    assert link is not None
    assert link.root == folder
    said = [r.getMessage() for r in caplog.records]
    assert said[-1] == (f"SDK {VERSION} stays linked to {folder}, "
                        f"{'which is gone' if gone else 'which is used from now on'}; "
                        f"`qnnctl uninstall {VERSION}` again drops the link")
    assert uninstall(VERSION, cache) == link.record
    assert read_link(cache, VERSION) is None


def test_a_link_record_that_cannot_be_read_goes_with_the_sdk(cache_dir: Path) -> None:
    cache = Cache(cache_dir)
    root = install_tree_into_cache(cache_dir, VERSION)
    record = cache_dir / "links" / f"{VERSION}.json"
    record.parent.mkdir()
    record.write_text("{not json")
    assert uninstall(VERSION, cache) == root
    assert not record.exists()
    assert not root.exists()


def test_uninstall_of_an_sdk_in_a_store_says_where_it_is(cache_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    build_sdk_tree(store / VERSION, SdkSpec(build_id=f"v{VERSION}101010"))
    for folder in (tmp_path, store):
        folder.chmod(0o755)
    with pytest.raises(NotInstalledError) as caught:
        uninstall(VERSION, Cache(cache_dir), {"QNNCTL_STORES": str(store)})
    message = (f"SDK {VERSION} is in the store {store} ({store / VERSION}), which qnnctl never changes; it is not "
               "installed in qnnctl's cache")
    assert (caught.value.message, caught.value.args, caught.value.hint) == (
        message, (message,), "remove it from the store itself, or take the store out of QNNCTL_STORES")
    with pytest.raises(NotInstalledError) as plain:  # no environment given: no store is looked in
        uninstall(VERSION, Cache(cache_dir))
    assert plain.value.message == f"SDK {VERSION} is not installed in qnnctl's cache"


def test_uninstall_of_an_sdk_this_process_holds_leaves_it_by_default(cache_dir: Path) -> None:
    cache = Cache(cache_dir)
    root = install_tree_into_cache(cache_dir, VERSION)
    fd = hold_sdk(cache.sdk_dir(VERSION), cache)
    assert fd is not None
    release = threading.Timer(2.0, os.close, (fd,))  # so that a wrong default of waiting would end
    release.start()
    try:
        with pytest.raises(HeldError) as caught:
            uninstall(VERSION, cache)
    finally:
        release.join()
    assert (caught.value.version, caught.value.root) == (VERSION, root)
    assert caught.value.message.endswith("; it was not removed")
    assert root.is_dir()
    # With wait: removed once the holder lets go.
    fd = hold_sdk(cache.sdk_dir(VERSION), cache)
    assert fd is not None
    release = threading.Timer(1.0, os.close, (fd,))
    release.start()
    try:
        assert uninstall(VERSION, cache, wait=True) == root
    finally:
        release.join()
    assert not root.exists()
