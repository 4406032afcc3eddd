"""What counts as evidence about an SDK on disk, in the tests' own process: a manifest only in an
SDK folder of this cache (by its real path) that no other user could change; any other folder
hashed, and that hashing remembered in qnnctl's records only while the tree is unchanged and
where no one else can write."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from qnnctl.errors import IntegrityError
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.evidence import hashed_digests, is_own, own_manifest, tree_key
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.members import tree_digests
from tests.sdkfactory import OTHER_VERSION, VERSION, build_sdk_tree, install_tree_into_cache

HTP = "lib/x86_64-linux-clang/libQnnHtp.so"


def _sdk(root: Path, version: str = VERSION) -> Sdk:
    return Sdk(root=root, version=version, origin="test")


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folders hashed by `hashed_digests` (each call of tree_digests), in order."""
    hashed: list[Path] = []

    def counting(path: Path, *args: object, **kwargs: object) -> dict[str, str]:
        hashed.append(path)
        return tree_digests(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("qnnctl.sdk.evidence.tree_digests", counting)
    return hashed


def _records(cache: Cache) -> list[Path]:
    return sorted((cache.root / "verified").glob("*")) if (cache.root / "verified").is_dir() else []


# -- a manifest is evidence only where qnnctl wrote it -----------------------------------------


def test_the_manifest_of_an_sdk_of_this_cache_is_evidence(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    assert is_own(root, VERSION, cache)
    assert own_manifest(_sdk(root), cache) == {"schema": 1, "version": VERSION, "files": {}}


def test_a_link_to_an_sdk_of_this_cache_is_the_same_folder(tmp_path: Path, cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    link = tmp_path / "elsewhere"
    link.symlink_to(root)
    assert is_own(link, VERSION, cache)
    assert own_manifest(_sdk(link), cache) == {"schema": 1, "version": VERSION, "files": {}}


def test_an_sdk_folder_outside_the_cache_vouches_for_nothing(tmp_path: Path, cache: Cache) -> None:
    install_tree_into_cache(cache.root, VERSION)
    copy = build_sdk_tree(tmp_path / "store" / VERSION)
    (copy / ".qnnctl.json").write_text(json.dumps({"schema": 1, "version": VERSION, "files": {}}))
    assert not is_own(copy, VERSION, cache)
    assert own_manifest(_sdk(copy), cache) is None


def test_an_sdk_of_this_cache_under_another_version_vouches_for_nothing(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    install_tree_into_cache(cache.root, OTHER_VERSION)
    assert not is_own(root, OTHER_VERSION, cache)
    assert own_manifest(_sdk(root, OTHER_VERSION), cache) is None


def test_a_version_not_installed_is_no_evidence_and_no_error(tmp_path: Path, cache: Cache) -> None:
    copy = build_sdk_tree(tmp_path / "store" / VERSION)
    assert not is_own(copy, VERSION, cache)  # the cache's folder is not there: not the same
    assert not is_own(tmp_path / "nothing", VERSION, cache)


@pytest.mark.parametrize("loose", ["cache", "sdk folder", "library folder"])
def test_a_manifest_others_could_have_written_vouches_for_nothing(cache: Cache, loose: str) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    folder = {"cache": cache.root, "sdk folder": root, "library folder": root / "lib/x86_64-linux-clang"}[loose]
    folder.chmod(0o777)
    assert not is_own(root, VERSION, cache)
    assert own_manifest(_sdk(root), cache) is None
    folder.chmod(0o755)
    assert is_own(root, VERSION, cache)


def test_an_own_sdk_without_a_manifest_has_none(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    (root / ".qnnctl.json").unlink()
    assert is_own(root, VERSION, cache)
    assert own_manifest(_sdk(root), cache) is None


# -- the tree's key: any change to any entry changes it -----------------------------------------


def test_the_key_of_a_tree_is_the_same_while_nothing_changes(tmp_path: Path) -> None:
    root = build_sdk_tree(tmp_path / "sdk")
    assert tree_key(root) == tree_key(root)
    assert len(tree_key(root)) == 64


@pytest.mark.parametrize("change", ["write", "add", "remove", "chmod", "rename", "relink", "touch folder",
                                    "add in folder", "rename folder"])
def test_any_change_to_a_tree_changes_its_key(tmp_path: Path, change: str) -> None:
    root = build_sdk_tree(tmp_path / "sdk")
    (root / "lib" / "link.so").symlink_to("x86_64-linux-clang/libQnnHtp.so")
    before = tree_key(root)
    library = root / HTP
    if change == "write":
        library.write_bytes(library.read_bytes() + b"!")
    elif change == "add":
        (root / "new.txt").write_text("")
    elif change == "remove":
        library.unlink()
    elif change == "chmod":
        library.chmod(0o700)
    elif change == "rename":
        library.rename(library.with_name("libQnnHtq.so"))
    elif change == "relink":
        (root / "lib" / "link.so").unlink()
        (root / "lib" / "link.so").symlink_to("x86_64-linux-clang/libQnnHtq.so")
    elif change == "touch folder":
        stamp = root.stat()
        os.utime(root / "docs", ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))
    elif change == "add in folder":
        (root / "docs" / "a").write_text("")
    else:
        (root / "docs").rename(root / "docz")
    assert tree_key(root) != before


def test_a_link_replaced_within_one_tick_by_another_of_its_length_changes_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link removed and made again pointing elsewhere may get the freed inode number back, and
    the same change time (the file system's clock ticks every few milliseconds): its target
    must change the key then, as nothing else does."""
    root = build_sdk_tree(tmp_path / "sdk")
    link = root / "lib" / "link.so"
    link.symlink_to("x86_64-linux-clang/libQnnHtp.so")
    real_lstat = os.lstat

    def one_tick(path: str | Path) -> os.stat_result:
        """As lstat, within one tick: every time the same, and the link's inode number reused."""
        fields = list(real_lstat(path))
        fields[7:10] = [0, 0, 0]  # atime, mtime, ctime (and their ns fields, below)
        if str(path) == str(link):
            fields[1] = 4242
        return os.stat_result((*fields, 0.0, 0.0, 0.0, 0, 0, 0))

    monkeypatch.setattr(os, "lstat", one_tick)
    before = tree_key(root)
    link.unlink()
    link.symlink_to("x86_64-linux-clang/libQnnHtq.so")
    assert tree_key(root) != before


def test_a_key_is_the_trees_own_not_its_paths(tmp_path: Path) -> None:
    """A relative layout: the same tree under another parent has the key the walk gives it there,
    and two trees that differ only in which folder holds a file differ."""
    one = build_sdk_tree(tmp_path / "one")
    two = build_sdk_tree(tmp_path / "two")
    (one / "docs" / "x").write_text("")
    (two / "share" / "x").write_text("")
    assert tree_key(one) != tree_key(two)


def test_a_tree_whose_names_are_not_utf8_has_a_key(tmp_path: Path) -> None:
    root = build_sdk_tree(tmp_path / "sdk")
    name = os.fsdecode(b"caf\xe9")
    (root / "docs" / name).write_text("")
    before = tree_key(root)
    assert tree_key(root) == before
    os.rename(root / "docs" / name, root / "docs" / os.fsdecode(b"caf\xe8"))
    assert tree_key(root) != before


def test_the_key_walks_in_one_order_whatever_the_directory_order(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """os.walk lists a folder's entries in the file system's order, which may differ between two
    reads of the same tree (another cache's copy, a rebuilt directory index): the key must not."""
    root = build_sdk_tree(tmp_path / "sdk")
    for name in ("b", "a", "c"):
        (root / "docs" / name).mkdir()
        (root / "docs" / name / "f").write_text(name)
    before = tree_key(root)
    real_walk = os.walk

    def reversed_walk(top: str | Path) -> Iterator[tuple[str, list[str], list[str]]]:
        for folder, dirs, names in real_walk(top):
            dirs.reverse()
            names.reverse()
            yield folder, dirs, names

    monkeypatch.setattr("qnnctl.sdk.evidence.os.walk", reversed_walk)
    assert tree_key(root) == before


@pytest.mark.parametrize(("mode", "who"), [(0o664, "its group"), (0o646, "others"), (0o2775, "its group")])
def test_a_tree_with_an_entry_others_can_write_has_no_key(tmp_path: Path, mode: int, who: str) -> None:
    """Nothing about such a tree lasts: the refusal names the entry, why, and the chmod that fixes it."""
    root = build_sdk_tree(tmp_path / "sdk")
    entry = root / "docs" / "shared file" if mode < 0o1000 else root / "docs" / "shared folder"
    if mode < 0o1000:
        entry.write_text("")
    else:
        entry.mkdir()
    entry.chmod(mode)
    with pytest.raises(IntegrityError) as caught:
        tree_key(root)
    assert str(caught.value) == (f"the SDK folder {root} cannot be vouched for: {entry} could be changed by another "
                                 f"user (it is writable by {who} (mode {mode & 0o7777:04o})); it is not used")
    assert caught.value.hint == f"fix it with `chmod go-w '{entry}'`"


# -- a hashing remembered while the tree is unchanged -----------------------------------------


def test_a_hashing_is_remembered_in_the_caches_records(tmp_path: Path, cache: Cache, counted: list[Path]) -> None:
    root = build_sdk_tree(tmp_path / "store" / VERSION)
    digests = hashed_digests(root, cache)
    assert digests == tree_digests(root, skip={".qnnctl.json"})
    assert counted == [root]
    [record] = _records(cache)
    assert record.parent == cache.root / "verified"
    assert json.loads(record.read_text()) == {"schema": 1, "root": os.path.realpath(root),
                                              "key": tree_key(root), "digests": digests}
    assert oct(record.stat().st_mode & 0o777) == oct(0o644)
    assert hashed_digests(root, cache) == digests
    assert counted == [root]


def test_the_manifest_is_no_part_of_what_is_hashed(tmp_path: Path, cache: Cache) -> None:
    root = build_sdk_tree(tmp_path / "store" / VERSION)
    without = hashed_digests(root, cache)
    other = build_sdk_tree(tmp_path / "other" / VERSION)
    (other / ".qnnctl.json").write_text("{}")
    assert hashed_digests(other, cache) == without


def test_each_folder_has_a_record_of_its_own(tmp_path: Path, cache: Cache, counted: list[Path]) -> None:
    one = build_sdk_tree(tmp_path / "one" / VERSION)
    two = build_sdk_tree(tmp_path / "two" / VERSION)
    (two / HTP).write_bytes(b"\x7fELF another")
    first, second = hashed_digests(one, cache), hashed_digests(two, cache)
    assert first["host"] != second["host"]
    assert len(_records(cache)) == 2
    assert hashed_digests(one, cache) == first
    assert hashed_digests(two, cache) == second
    assert counted == [one, two]


def test_a_folder_named_by_a_link_shares_its_record(tmp_path: Path, cache: Cache, counted: list[Path]) -> None:
    root = build_sdk_tree(tmp_path / "store" / VERSION)
    link = tmp_path / "link"
    link.symlink_to(root)
    digests = hashed_digests(root, cache)
    assert hashed_digests(link, cache) == digests
    assert counted == [root]
    assert len(_records(cache)) == 1


@pytest.mark.parametrize("kept", ["not json", "a list", "digests not a mapping", "no key", "another key"])
def test_a_record_that_is_not_one_is_hashed_again(tmp_path: Path, cache: Cache, counted: list[Path],
                                                  kept: str) -> None:
    root = build_sdk_tree(tmp_path / "store" / VERSION)
    digests = hashed_digests(root, cache)
    [record] = _records(cache)
    forged = {"host": "0" * 64}
    text = {"not json": "{", "a list": json.dumps([tree_key(root), forged]),
            "digests not a mapping": json.dumps({"key": tree_key(root), "digests": ["0" * 64]}),
            "no key": json.dumps({"digests": forged}),
            "another key": json.dumps({"key": "0" * 64, "digests": forged})}[kept]
    record.write_text(text)
    assert hashed_digests(root, cache) == digests
    assert counted == [root, root]
    assert json.loads(record.read_text())["digests"] == digests  # written anew


def test_a_record_is_read_as_text_digests(tmp_path: Path, cache: Cache, counted: list[Path]) -> None:
    root = build_sdk_tree(tmp_path / "store" / VERSION)
    hashed_digests(root, cache)
    [record] = _records(cache)
    record.write_text(json.dumps({"key": tree_key(root), "digests": {"host": 7}}))
    assert hashed_digests(root, cache) == {"host": "7"}
    assert counted == [root]


def test_a_tree_that_changes_while_it_is_hashed_is_not_remembered(tmp_path: Path, cache: Cache,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root = build_sdk_tree(tmp_path / "store" / VERSION)

    def changing(path: Path, *args: object, **kwargs: object) -> dict[str, str]:
        digests = tree_digests(path, *args, **kwargs)  # type: ignore[arg-type]
        (path / "docs" / "late").write_text("written while it was read")
        return digests

    monkeypatch.setattr("qnnctl.sdk.evidence.tree_digests", changing)
    hashed_digests(root, cache)
    assert _records(cache) == []


def test_a_cache_others_can_write_remembers_nothing_and_trusts_no_record(tmp_path: Path, cache: Cache,
                                                                         counted: list[Path]) -> None:
    root = build_sdk_tree(tmp_path / "store" / VERSION)
    digests = hashed_digests(root, cache)
    [record] = _records(cache)
    record.write_text(json.dumps({"key": tree_key(root), "digests": {"host": "0" * 64}}))
    cache.root.chmod(0o777)
    try:
        assert hashed_digests(root, cache) == digests  # the forged record is not read
        assert counted == [root, root]
        assert json.loads(record.read_text())["digests"] == {"host": "0" * 64}  # nor written
        record.unlink()
        hashed_digests(root, cache)
        assert _records(cache) == []
    finally:
        cache.root.chmod(0o755)


def test_the_first_record_makes_the_caches_folder(tmp_path: Path, cache: Cache) -> None:
    assert not cache.root.exists()
    root = build_sdk_tree(tmp_path / "store" / VERSION)
    hashed_digests(root, cache)
    assert len(_records(cache)) == 1
