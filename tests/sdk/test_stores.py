"""Who could change a shared store, checked in the tests' own process: the owner and mode of each
folder and file, the user it is asked for, and what the refusal says (test_fleet.py has the same
stores through the command line)."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from qnnctl.errors import IntegrityError
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.stores import (
    StoreSdk,
    Unsafe,
    all_links,
    cache_problem,
    find_in_stores,
    link_sdk,
    refuse_unsafe,
    refuse_unsafe_cache,
    sdk_problem,
    store_sdks,
    unsafe_entry,
    unsafe_path,
    usable_stores,
)
from tests.sdkfactory import VERSION, SdkSpec, build_sdk_tree

BUILD = f"v{VERSION}101010"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's takes root")


def _nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder that every user can enter (pytest's own are root's, mode 0700), root's, 0755."""
    folder = Path(tempfile.mkdtemp(prefix="qnnctl-stores-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def _store(shared: Path, *versions: str) -> Path:
    store = shared / "store"
    for version in versions:
        build_sdk_tree(store / version, SdkSpec(version=version, build_id=f"v{version}101010"))
    return store


def _chown_tree(top: Path, uid: int) -> None:
    for folder, _, files in os.walk(top):
        os.chown(folder, uid, -1)
        for name in files:
            os.lchown(Path(folder) / name, uid, -1)


@contextmanager
def _as_user(uid: int) -> Iterator[None]:
    """This process acts as `uid` (its effective uid, which every check and permission asks), then
    as root again: in this process, so that whatever runs meanwhile is this process's code."""
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)


def test_a_folder_of_the_users_own_is_safe_for_that_user_only(shared: Path) -> None:
    store = _store(shared, VERSION)
    _chown_tree(store, _nobody())
    assert unsafe_path(store, uid=_nobody()) is None
    found = unsafe_path(store)  # asked for this process's user, root
    assert found == Unsafe(store, f"belongs to user nobody (uid {_nobody()})",
                           f"make it root's (or yours): `sudo chown root {store}`")
    assert unsafe_path(store, uid=0) == found


def test_the_files_of_an_sdk_are_checked_for_the_user_who_runs_it(shared: Path) -> None:
    """An SDK that nobody unpacked is nobody's to use: the check runs as the user, not as root."""
    store = _store(shared, VERSION)
    sdk = store / VERSION
    _chown_tree(store, _nobody())
    with _as_user(_nobody()):
        assert sdk_problem(sdk) is None
    assert sdk_problem(sdk) == Unsafe(store, f"belongs to user nobody (uid {_nobody()})",  # the first above it
                                      f"make it root's (or yours): `sudo chown root {store}`")
    # Its own tool, made writable by others: that is what is wrong, not who owns it.
    tool = sdk / "bin" / "x86_64-linux-clang" / "qnn-net-run"
    tool.chmod(0o757)
    with _as_user(_nobody()):
        assert sdk_problem(sdk) == Unsafe(tool, "is writable by others (mode 0757)", f"`chmod go-w {tool}`")
        assert unsafe_path(sdk) is None  # asked for this process's user, now nobody


@pytest.mark.parametrize("uid", [1, 2], ids=["daemon", "bin"])
def test_a_library_of_a_system_user_other_than_root_is_refused(uid: int, shared: Path) -> None:
    store = _store(shared, VERSION)
    library = store / VERSION / "lib" / "x86_64-linux-clang" / "libQnnCpu.so"
    os.chown(library, uid, -1)
    found = sdk_problem(store / VERSION)
    assert found is not None
    assert (found.folder, found.why) == (library, f"belongs to user {pwd.getpwuid(uid).pw_name} (uid {uid})")


def test_a_sticky_library_writable_by_others_is_refused(shared: Path) -> None:
    """The sticky bit spares a folder above (others cannot rename the user's entries there),
    never a file that is loaded."""
    store = _store(shared, VERSION)
    library = store / VERSION / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"
    library.chmod(0o1777)
    assert sdk_problem(store / VERSION) == Unsafe(
        library, "is writable by its group and others (mode 1777)", f"`chmod go-w {library}`")


def test_a_refusal_says_what_who_and_how_to_fix_it_once(shared: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = shared / "our store"  # a space: the fix quotes the path
    build_sdk_tree(store / VERSION, SdkSpec(build_id=BUILD))
    store.chmod(0o775)
    environ = {"QNNCTL_STORES": str(store)}
    with caplog.at_level(logging.WARNING, logger="qnnctl.sdk.stores"):
        assert usable_stores(environ) == []
        assert usable_stores(environ) == []
    (record,) = caplog.records
    assert record.name == "qnnctl.sdk.stores"
    assert record.getMessage() == (
        f"the store {store} is not used: {store} is writable by its group (mode 0775), so another user could "
        f"put code there that runs as you; fix it with `chmod go-w '{store}'`, or take the store out of "
        "QNNCTL_STORES")


def test_each_sdk_refused_for_one_folder_is_named(shared: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Two SDKs whose libraries lead into one writable folder: each is said to be unused."""
    other = "2.38.0.250901"
    store = _store(shared, VERSION, other)
    (shared / "open").mkdir(mode=0o777)
    (shared / "open").chmod(0o777)
    for version in (VERSION, other):
        library = store / version / "lib" / "x86_64-linux-clang" / "libQnnCpu.so"
        shutil.move(library, shared / "open" / f"{version}.so")
        library.symlink_to(shared / "open" / f"{version}.so")
    with caplog.at_level(logging.WARNING, logger="qnnctl.sdk.stores"):
        assert list(store_sdks({"QNNCTL_STORES": str(store)})) == []
    said = [record.getMessage() for record in caplog.records]
    assert [line.split(" is not used: ")[0] for line in said] == [
        f"SDK folder {store / VERSION} of the store {store}", f"SDK folder {store / other} of the store {store}"]
    assert all(f": {shared / 'open'} is writable by its group and others (mode 0777)," in line for line in said)


@pytest.mark.parametrize("links", [40, 41])
def test_a_path_through_as_many_links_as_the_kernel_follows_is_checked_and_one_more_is_refused(
        links: int, shared: Path) -> None:
    """The kernel follows 40 symbolic links on one path (MAXSYMLINKS); the 41st is a loop to it."""
    (shared / "real").mkdir(mode=0o755)
    chain = shared / "chain"
    chain.mkdir(mode=0o755)
    for n in range(links):
        (chain / f"l{n}").symlink_to(f"l{n + 1}" if n + 1 < links else "../real")
    if links == 40:
        assert os.path.isdir(chain / "l0")
        assert unsafe_path(chain / "l0") is None
    else:
        with pytest.raises(OSError, match="Too many levels of symbolic links"):
            os.stat(chain / "l0")
        assert unsafe_path(chain / "l0") == Unsafe(chain / "l40", "leads through more than 40 symbolic links",
                                                   "point it at a folder")


def test_a_file_gone_while_the_folder_is_checked_is_skipped_and_the_rest_still_checked(
        shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library removed between the folder's listing and its own check (an update in progress)
    is nothing to load; the files after it are checked all the same."""
    store = _store(shared, VERSION)
    folder = store / VERSION / "lib" / "x86_64-linux-clang"
    (folder / "a-gone.so").write_bytes(b"")
    library = folder / "libQnnCpu.so"
    os.chown(library, 1, -1)
    listed = os.scandir

    def listed_then_removed(path: Any) -> Any:
        if not isinstance(path, (str, Path)) or Path(path) != folder:
            return listed(path)
        entries = list(listed(path))
        (folder / "a-gone.so").unlink()
        return entries

    monkeypatch.setattr(os, "scandir", listed_then_removed)
    found = sdk_problem(store / VERSION)
    assert found is not None
    assert found.folder == library


def test_a_store_sdk_is_found_by_what_its_libraries_say_and_a_mislabelled_folder_is_said_to_be_skipped(
        shared: Path, caplog: pytest.LogCaptureFixture) -> None:
    other = "2.38.0.250901"
    store = shared / "store"
    build_sdk_tree(store / VERSION, SdkSpec(version=VERSION, build_id=f"v{other}101010"))  # named VERSION, is other
    (store / "notes").mkdir()  # no SDK at all
    build_sdk_tree(store / "latest", SdkSpec(version=VERSION, build_id=BUILD))
    third = "2.39.0.251001"
    build_sdk_tree(store / third, SdkSpec(version=third, build_id=f"v{third}101010"))
    environ = {"QNNCTL_STORES": str(store)}
    with caplog.at_level(logging.DEBUG, logger="qnnctl.sdk.stores"):
        assert find_in_stores(third, environ) == StoreSdk(store, store / third, third)
        assert find_in_stores(VERSION, environ) == StoreSdk(store, store / "latest", VERSION)
        assert find_in_stores(other, environ) == StoreSdk(store, store / VERSION, other)
        assert find_in_stores("notes", environ) is None
    assert [record.getMessage() for record in caplog.records] == [
        f"{store / VERSION} is SDK {other} by its libraries, not {VERSION}; skipped"]


@pytest.mark.parametrize("named", [True, False], ids=["named-for-its-version", "named-otherwise"])
def test_a_store_sdk_another_user_could_change_is_not_found_and_the_store_is_named(
        named: bool, shared: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = shared / "store"
    sdk = build_sdk_tree(store / (VERSION if named else "latest"), SdkSpec(build_id=BUILD))
    sdk.chmod(0o777)
    with caplog.at_level(logging.DEBUG, logger="qnnctl.sdk.stores"):
        assert find_in_stores(VERSION, {"QNNCTL_STORES": str(store)}) is None
    assert [record.getMessage() for record in caplog.records] == [
        f"SDK folder {sdk} of the store {store} is not used: {sdk} is writable by its group and others (mode 0777), "
        f"so another user could put code there that runs as you; fix it with `chmod go-w {sdk}`, or take the store "
        "out of QNNCTL_STORES"]


def test_a_link_of_another_users_in_a_sticky_folder_is_refused_with_the_command_that_replaces_it(
        shared: Path) -> None:
    store = _store(shared, VERSION)
    public = shared / "public"
    public.mkdir()
    public.chmod(0o1777)
    link = public / "our store"
    link.symlink_to(store)
    os.lchown(link, 1, -1)
    assert unsafe_path(link / VERSION) == Unsafe(
        link, "is a symbolic link that belongs to user daemon (uid 1)",
        f"replace it with a link of your own: `ln -sfn {store} '{link}'`")


def test_a_link_of_roots_is_trusted_by_every_user(shared: Path) -> None:
    store = _store(shared, VERSION)
    _chown_tree(store, _nobody())
    (shared / "mine").mkdir(mode=0o755)
    (shared / "mine" / "store").symlink_to(store)  # root's, as this process is
    with _as_user(_nobody()):
        assert unsafe_path(shared / "mine" / "store" / VERSION) is None


def test_a_path_the_file_system_cannot_look_up_is_named_with_why(shared: Path) -> None:
    long = shared / ("x" * 300)
    assert unsafe_path(long / "store") == Unsafe(shared, "cannot be checked (File name too long)",
                                                 "check its permissions")


def test_links_are_listed_by_version_not_by_name(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    versions = ["2.10.0.250101", "2.9.0.250101", "2.37.0.250724"]
    for version in versions:
        link_sdk(build_sdk_tree(tmp_path / version, SdkSpec(version=version)), None, cache, {})
    assert [link.version for link in all_links(cache)] == ["2.9.0.250101", "2.10.0.250101", "2.37.0.250724"]


def test_each_store_below_one_folder_others_could_change_is_named(shared: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    (shared / "open").mkdir()
    (shared / "open").chmod(0o777)
    stores = [shared / "open" / "a", shared / "open" / "b"]
    for store in stores:
        store.mkdir(mode=0o755)
    with caplog.at_level(logging.WARNING, logger="qnnctl.sdk.stores"):
        assert usable_stores({"QNNCTL_STORES": os.pathsep.join(map(str, stores))}) == []
    assert [record.getMessage().split(" is not used: ")[0] for record in caplog.records] == [
        f"the store {store}" for store in stores]


# -- qnnctl's own cache, and an SDK folder of it, held to the store's rule -------------------------


def test_a_cache_whose_folders_only_its_owner_can_write_has_no_problem(shared: Path) -> None:
    cache = Cache(shared / "cache")
    assert cache_problem(cache) is None  # not there yet: made with exact modes when it is
    for name in ("sdks", "downloads", "verified"):
        (cache.root / name).mkdir(parents=True, mode=0o755)
    (cache.root / "loose file").write_text("")
    (cache.root / "loose file").chmod(0o666)  # no folder: what qnnctl keeps is in folders
    (shared / "open").mkdir(mode=0o755)
    (shared / "open").chmod(0o777)
    (cache.root / "elsewhere").symlink_to(shared / "open")  # a link, not followed
    assert cache_problem(cache) is None
    refuse_unsafe_cache(cache)


def test_a_cache_open_to_others_is_refused_by_its_first_open_folder(shared: Path) -> None:
    cache = Cache(shared / "my cache")
    for name in ("sdks", "downloads", "tmp", "verified"):
        (cache.root / name).mkdir(parents=True, mode=0o755)
    (cache.root / "verified").chmod(0o777)
    (cache.root / "downloads").chmod(0o775)
    fix = f"`chmod -R go-w '{cache.root}'`"
    assert cache_problem(cache) == Unsafe(cache.root / "downloads", "is writable by its group (mode 0775)", fix)
    with pytest.raises(IntegrityError) as refused:
        refuse_unsafe_cache(cache)
    assert refused.value.exit_code == 4
    assert refused.value.message == (
        f"qnnctl's cache {cache.root} is not used: {cache.root / 'downloads'} is writable by its group (mode 0775), "
        "so another user could change the SDKs installed there and the records that vouch for them; nothing was "
        "installed")
    assert refused.value.hint == f"fix it with {fix}, or point QNNCTL_CACHE_DIR at a folder of your own"
    (cache.root / "downloads").chmod(0o755)
    assert cache_problem(cache) == Unsafe(cache.root / "verified", "is writable by its group and others (mode 0777)",
                                          fix)
    (cache.root / "verified").chmod(0o1777)  # sticky spares no folder of qnnctl's own
    assert cache_problem(cache) == Unsafe(cache.root / "verified", "is writable by its group and others (mode 1777)",
                                          fix)
    (cache.root / "verified").chmod(0o755)
    os.chown(cache.root / "tmp", _nobody(), -1)
    assert cache_problem(cache) == Unsafe(cache.root / "tmp", f"belongs to user nobody (uid {_nobody()})", fix)


def test_a_cache_of_the_users_own_is_checked_for_that_user(shared: Path) -> None:
    """A cache that nobody made and owns is nobody's to use: its folders are checked for the
    user qnnctl runs as, not for root."""
    cache = Cache(shared / "cache")
    for name in ("sdks", "downloads"):
        (cache.root / name).mkdir(parents=True, mode=0o755)
    _chown_tree(cache.root, _nobody())
    with _as_user(_nobody()):
        assert cache_problem(cache) is None
    assert cache_problem(cache) == Unsafe(cache.root, f"belongs to user nobody (uid {_nobody()})",
                                          f"make it root's (or yours): `sudo chown root {cache.root}`")


def test_a_cache_below_a_folder_others_can_write_is_refused_by_that_folder(shared: Path) -> None:
    (shared / "open").mkdir()
    (shared / "open").chmod(0o777)
    cache = Cache(shared / "open" / "cache")
    (cache.root / "sdks").mkdir(parents=True, mode=0o755)
    assert cache_problem(cache) == Unsafe(shared / "open", "is writable by its group and others (mode 0777)",
                                          f"`chmod go-w {shared / 'open'}`")


def test_an_sdk_folder_others_could_change_is_refused_with_who_and_the_fix(shared: Path) -> None:
    store = _store(shared, VERSION)
    root = store / VERSION
    refuse_unsafe(root, f"SDK {VERSION} at {root}")
    tool = root / "bin" / "x86_64-linux-clang" / "qnn-net-run"
    tool.chmod(0o775)
    with pytest.raises(IntegrityError) as refused:
        refuse_unsafe(root, f"SDK {VERSION} at {root}")
    assert refused.value.exit_code == 4
    assert refused.value.message == (f"SDK {VERSION} at {root} is not used: {tool} is writable by its group "
                                     "(mode 0775), so another user could put code there that runs as you")
    assert refused.value.hint == (f"fix it with `chmod go-w {tool}`; a cache shared by several users is made "
                                  "read-only for them (writable by its owner alone), as a store is")


def test_an_entry_is_held_to_the_rule_by_its_own_owner_and_mode(shared: Path) -> None:
    entry = shared / "entry"
    entry.write_text("")
    assert unsafe_entry(entry, entry.lstat()) is None
    entry.chmod(0o646)
    assert unsafe_entry(entry, entry.lstat()) == Unsafe(entry, "is writable by others (mode 0646)",
                                                       f"`chmod go-w {entry}`")
    entry.chmod(0o644)
    os.chown(entry, _nobody(), -1)
    assert unsafe_entry(entry, entry.lstat()) == Unsafe(entry, f"belongs to user nobody (uid {_nobody()})",
                                                       f"make it root's (or yours): `sudo chown root {entry}`")
    with _as_user(_nobody()):  # this process's user is the one asked for
        assert unsafe_entry(entry, entry.lstat()) is None
    # The sticky bit spares a folder on the way to a store, never an entry of the tree itself.
    sticky = shared / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert unsafe_entry(sticky, sticky.lstat()) == Unsafe(sticky, "is writable by its group and others (mode 1777)",
                                                         f"`chmod go-w {sticky}`")


def test_the_host_folders_checked_are_those_of_the_machine_qnnctl_runs_on(shared: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(shared, VERSION)
    root = store / VERSION
    ours = root / "lib" / "aarch64-oe-linux-gcc11.2"
    ours.mkdir(mode=0o755)
    (ours / "libQnnHtp.so").write_text("")
    (ours / "libQnnHtp.so").chmod(0o666)
    tools = root / "bin" / "aarch64-oe-linux-gcc11.2"
    tools.mkdir(mode=0o755)
    tools.chmod(0o777)
    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", "x86_64")
    assert sdk_problem(root) is None
    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", "aarch64")
    assert sdk_problem(root) == Unsafe(ours / "libQnnHtp.so", "is writable by its group and others (mode 0666)",
                                       f"`chmod go-w {ours / 'libQnnHtp.so'}`")
    (ours / "libQnnHtp.so").chmod(0o644)
    assert sdk_problem(root) == Unsafe(tools, "is writable by its group and others (mode 0777)",
                                       f"`chmod go-w {tools}`")
