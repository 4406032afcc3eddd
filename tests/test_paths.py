"""Paths as users write them, folders made with an exact mode, JSON records written atomically
with an exact mode, and the size of a folder: on real files in the tests' own process, under the
umasks that would otherwise leave qnnctl's folders and records writable by others."""

from __future__ import annotations

import json
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from qnnctl.paths import fsync_dir, make_folders, tree_size, user_path, write_json_atomic


@pytest.fixture
def umask() -> Iterator[None]:
    """Restores the process's umask, which the tests below set."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# -- paths as users write them ---------------------------------------------------------------


def test_a_leading_tilde_is_the_home_folder_as_a_shell_expands_it(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_path("~") == tmp_path / "home"
    assert user_path("~/sdks/x") == tmp_path / "home" / "sdks" / "x"
    assert user_path(Path("~/a")) == tmp_path / "home" / "a"
    assert user_path("a/~/b") == Path("a/~/b")
    assert user_path("/abs/path") == Path("/abs/path")
    me = pwd.getpwuid(os.getuid())
    assert user_path(f"~{me.pw_name}/x") == Path(me.pw_dir) / "x"


def test_a_user_this_machine_does_not_know_stays_as_written() -> None:
    assert user_path("~no-such-user-here/sdk") == Path("~no-such-user-here/sdk")


# -- the size of a folder ----------------------------------------------------------------------


def test_a_folders_size_is_that_of_everything_below_it_links_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "a" / "b").mkdir(parents=True)
    (root / "one").write_bytes(b"x" * 1000)
    (root / "a" / "two").write_bytes(b"y" * 20)
    (root / "a" / "b" / "three").write_bytes(b"z" * 3)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"w" * 100_000)
    (root / "a" / "to-outside").symlink_to(outside)
    (root / "to-big").symlink_to(outside / "big")
    folders = sum((root / p).lstat().st_size for p in ("a", "a/b"))
    links = len(str(outside)) + len(str(outside / "big"))  # a link's size is its target's length
    assert tree_size(root) == 1000 + 20 + 3 + folders + links


def test_the_size_of_a_folder_not_there_or_empty_is_nothing(tmp_path: Path) -> None:
    assert tree_size(tmp_path / "missing") == 0
    (tmp_path / "empty").mkdir()
    assert tree_size(tmp_path / "empty") == 0
    (tmp_path / "file").write_text("abc")
    assert tree_size(tmp_path / "file") == 0  # a file is no folder: nothing below it


# -- folders made with an exact mode -----------------------------------------------------------


@pytest.mark.parametrize("mask", [0o000, 0o077, 0o022])
@pytest.mark.usefixtures("umask")
def test_folders_made_have_exactly_their_mode_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    os.umask(mask)
    made = tmp_path / "a" / "b" / "c"
    make_folders(made)
    assert [_mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o755] * 3
    private = tmp_path / "p" / "q"
    make_folders(private, 0o700)
    assert [_mode(tmp_path / p) for p in ("p", "p/q")] == [0o700] * 2


@pytest.mark.usefixtures("umask")
def test_folders_already_there_are_left_as_they_are(tmp_path: Path) -> None:
    os.umask(0)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs").chmod(0o775)
    make_folders(tmp_path / "theirs" / "mine" / "deeper")
    assert _mode(tmp_path / "theirs") == 0o775
    assert [_mode(tmp_path / p) for p in ("theirs/mine", "theirs/mine/deeper")] == [0o755] * 2
    (tmp_path / "theirs" / "mine").chmod(0o711)
    make_folders(tmp_path / "theirs" / "mine")
    assert _mode(tmp_path / "theirs" / "mine") == 0o711


@pytest.mark.usefixtures("umask")
def test_a_folder_made_is_never_wider_than_its_mode_even_before_its_chmod(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a umask of 0 a folder made with mkdir's default of 0o777 would be writable by
    everyone until its chmod, time enough for another user to put a file in it: it is made with
    its mode from the start, and the chmod only takes off what a umask would have left."""
    os.umask(0)
    real_chmod = os.chmod
    seen: dict[str, int] = {}

    def look_first(path: str | os.PathLike[str], mode: int) -> None:
        seen[Path(path).name] = _mode(Path(path))
        real_chmod(path, mode)

    monkeypatch.setattr(os, "chmod", look_first)
    make_folders(tmp_path / "a" / "b")
    make_folders(tmp_path / "p", 0o700)
    assert seen == {"a": 0o755, "b": 0o755, "p": 0o700}


def test_a_link_to_a_folder_is_a_folder_there(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real").chmod(0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    make_folders(tmp_path / "link" / "inside")
    assert _mode(tmp_path / "real") == 0o700
    assert (tmp_path / "real" / "inside").is_dir()
    assert _mode(tmp_path / "real" / "inside") == 0o755


def test_a_relative_path_is_made_below_the_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_folders(Path("x/y"))
    assert (tmp_path / "x" / "y").is_dir()
    make_folders(Path("x/y"))  # there already: nothing to do


def test_a_folder_made_meanwhile_by_another_is_taken_as_made_and_given_the_mode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another qnnctl makes the same folder between the look and the mkdir: no error, and the
    folders below it are made all the same."""
    real_mkdir = os.mkdir
    raced: list[str] = []

    def another_first(path: str | os.PathLike[str], mode: int = 0o777) -> None:
        if Path(path).name == "b" and not raced:
            raced.append(str(path))
            real_mkdir(path, 0o700)  # the other qnnctl's, made under its own umask
        real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", another_first)
    make_folders(tmp_path / "a" / "b" / "c")
    assert raced == [str(tmp_path / "a" / "b")]
    assert (tmp_path / "a" / "b" / "c").is_dir()
    assert _mode(tmp_path / "a" / "b") == 0o700  # the other's, left as it made it
    assert _mode(tmp_path / "a" / "b" / "c") == 0o755


def test_a_file_in_the_way_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        make_folders(tmp_path / "file" / "below")


# -- JSON records written atomically, with an exact mode ---------------------------------------


@pytest.mark.parametrize("mask", [0o000, 0o077, 0o022])
@pytest.mark.usefixtures("umask")
def test_a_record_is_written_whole_with_exactly_its_mode(tmp_path: Path, mask: int) -> None:
    os.umask(mask)
    folder = tmp_path / "records"
    folder.mkdir()
    record = folder / "r.json"
    write_json_atomic(record, {"b": [1, 2], "a": "é", "c": {"z": 1, "y": None}})
    assert record.read_text(encoding="utf-8") == (
        '{\n "a": "\\u00e9",\n "b": [\n  1,\n  2\n ],\n "c": {\n  "y": null,\n  "z": 1\n }\n}\n')
    assert _mode(record) == 0o644
    private = folder / "p.json"
    write_json_atomic(private, {"k": 1}, 0o600)
    assert json.loads(private.read_text()) == {"k": 1}
    assert _mode(private) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == ["p.json", "r.json"]  # no .tmp left


@pytest.mark.usefixtures("umask")
def test_a_record_is_never_wider_than_its_mode_even_before_its_fchmod(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a umask of 0 a record created with open's default of 0o777 could be opened for
    writing by anyone before its fchmod, and written to after it: it is created with its mode."""
    os.umask(0)
    real_fchmod = os.fchmod
    seen: list[int] = []

    def look_first(fd: int, mode: int) -> None:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", look_first)
    write_json_atomic(tmp_path / "r.json", {"n": 1})
    write_json_atomic(tmp_path / "p.json", {"n": 1}, 0o600)
    assert seen == [0o644, 0o600]


def test_a_record_replaces_the_one_there_in_one_step(tmp_path: Path) -> None:
    record = tmp_path / "r.json"
    write_json_atomic(record, {"n": 1})
    other = tmp_path / "other-name"
    os.link(record, other)  # the old file, as a reader that opened it before holds it
    write_json_atomic(record, {"n": 2})
    assert json.loads(record.read_text()) == {"n": 2}
    assert json.loads(other.read_text()) == {"n": 1}  # replaced by a rename, not written over
    assert record.stat().st_ino != other.stat().st_ino


@pytest.mark.usefixtures("umask")
def test_a_partial_record_left_by_a_killed_run_is_started_over(tmp_path: Path) -> None:
    """A .tmp of another mode (or another's hard link) is removed, not written into: the record
    gets its own mode, and what the .tmp was linked to is left as it was."""
    os.umask(0)
    record = tmp_path / "r.json"
    partial = tmp_path / "r.json.tmp"
    partial.write_text("half a recor")
    partial.chmod(0o666)
    theirs = tmp_path / "theirs"
    os.link(partial, theirs)
    write_json_atomic(record, {"n": 1})
    assert json.loads(record.read_text()) == {"n": 1}
    assert _mode(record) == 0o644
    assert theirs.read_text() == "half a recor"
    assert _mode(theirs) == 0o666
    assert not partial.exists()


def test_a_record_written_through_a_link_to_a_folder_lands_there(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    write_json_atomic(tmp_path / "link" / "r.json", {"n": 1})
    assert json.loads((tmp_path / "real" / "r.json").read_text()) == {"n": 1}


def test_a_record_in_a_folder_not_there_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_json_atomic(tmp_path / "missing" / "r.json", {"n": 1})


def test_a_rename_is_made_durable_in_a_folder_and_a_file_is_no_folder(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        fsync_dir(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before  # each descriptor closed
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "missing")
