"""tree_digests against a plain reference (os.walk and lstat, as it was first written): the same
lines, so the same digests, for every tree a folder can hold.

The digests are what an install gate compares with a lock or a mirror's index: a tree read
another way than the lock was made from would be refused, or worse, let through.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import stat
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path

import pytest

import qnnctl.sdk.members
from qnnctl.sdk.members import component_digests, member_line, tree_digests

MANIFEST = ".qnnctl.json"
Lines = list[tuple[str, str]]


def reference_lines(root: Path, recorded: Mapping[str, str] | None = None, skip: Collection[str] = ()) -> Lines:
    """Each member's line, read the plain way: os.walk (links to folders listed, not followed), lstat."""
    lines: Lines = []
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if rel in skip:
                continue
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(path)
                lines.append((rel, member_line(rel, "link", False, target, len(os.fsencode(target)), "")))
            elif stat.S_ISREG(info.st_mode):
                known = (recorded or {}).get(rel)
                sha256 = known if known is not None and len(known) == 64 else \
                    hashlib.sha256(path.read_bytes()).hexdigest()
                lines.append((rel, member_line(rel, "file", bool(info.st_mode & 0o111), "", info.st_size, sha256)))
    return lines


def lines_of(monkeypatch: pytest.MonkeyPatch, root: Path, recorded: Mapping[str, str] | None = None,
             skip: Collection[str] = ()) -> tuple[Lines, dict[str, str]]:
    """The lines tree_digests hands to component_digests, and the digests it returns."""
    seen: Lines = []

    def keep(lines: Iterable[tuple[str, str]]) -> dict[str, str]:
        seen.extend(lines)
        return component_digests(seen)

    with monkeypatch.context() as patch:
        patch.setattr(qnnctl.sdk.members, "component_digests", keep)
        digests = tree_digests(root, recorded, skip)
    return seen, digests


def assert_same(monkeypatch: pytest.MonkeyPatch, root: Path, recorded: Mapping[str, str] | None = None,
                skip: Collection[str] = ()) -> Lines:
    expected = reference_lines(root, recorded, skip)
    got, digests = lines_of(monkeypatch, root, recorded, skip)
    assert sorted(got) == sorted(expected)
    assert digests == component_digests(expected) == tree_digests(root, recorded, skip)
    return expected


def _file(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def odd_tree(root: Path) -> None:
    """Files, executables, links of every kind, and names no archive should hold but a folder can."""
    _file(root / "QNN_README.txt", b"readme")
    _file(root / MANIFEST, b"{}")  # skipped at the root only
    _file(root / "share" / MANIFEST, b"not the manifest")
    _file(root / "sdk.yaml", b"version: 2.37.0.250724\n")
    _file(root / "bin/x86_64-linux-clang/qnn-net-run", b"#!/bin/sh\n", 0o755)
    _file(root / "bin/x86_64-linux-clang/only-group-x", b"x", 0o610)
    _file(root / "lib/x86_64-linux-clang/libQnnHtp.so", b"\x7fELF" + bytes(100))
    _file(root / "lib/x86_64-linux-clang/empty.so", b"")
    _file(root / "lib/aarch64-android/libQnnHtp.so", b"android")
    _file(root / "lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so", b"skel")
    _file(root / "include/QNN/QnnTypes.h", b"/* types */")
    (root / "docs/empty folder").mkdir(parents=True)
    os.symlink("libQnnHtp.so", root / "lib/x86_64-linux-clang/libQnnHtp.so.2")
    os.symlink("x86_64-linux-clang", root / "lib/host")  # a link to a folder: listed, not followed
    os.symlink("../../missing", root / "lib/x86_64-linux-clang/dangling")
    os.symlink("/etc", root / "share/absolute")
    os.symlink(".", root / "share/loop")
    os.symlink("loop2", root / "share/loop1")
    os.symlink("loop1", root / "share/loop2")
    os.symlink(os.fsdecode(b"caf\xe9"), root / "share/to-latin1")
    os.link(root / "QNN_README.txt", root / "share/hard link.txt")
    _file(root / "share/with space/a b.txt", b"space")
    _file(root / "share/new\nline", b"newline")
    _file(root / "share/tab\there", b"tab")
    _file(root / "share/back\\slash", b"backslash")
    _file(root / "share/-", b"dash")
    _file(root / "share/..dots", b"dots")
    _file(root / "share/ünïcödé", b"unicode")
    _file(root / "share/\u2028sep", b"line separator")
    raw = os.fsencode(root / "share")
    with open(os.path.join(raw, b"latin1-\xe9\xff"), "wb") as out:
        out.write(b"not utf-8")
    os.mkdir(os.path.join(raw, b"folder-\xfe"))
    with open(os.path.join(raw, b"folder-\xfe", b"inner-\x80"), "wb") as out:
        out.write(b"deeper")
    os.mkfifo(root / "share/fifo")  # neither file nor link: no member
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "share/sock"))
    deep = root.joinpath(*[f"d{i}" for i in range(40)])
    _file(deep / "bottom.txt", b"bottom")


def test_the_same_lines_as_the_reference_for_odd_trees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sdk"
    odd_tree(root)
    lines = assert_same(monkeypatch, root, skip={MANIFEST})
    listed = {rel for rel, _ in lines}
    # The reference saw what this test is about; none of it was passed over unnoticed.
    assert {"lib/host", "lib/x86_64-linux-clang/dangling", "share/loop", "share/new\nline", f"share/{MANIFEST}",
            os.fsdecode(b"share/latin1-\xe9\xff"), os.fsdecode(b"share/folder-\xfe/inner-\x80"),
            "bin/x86_64-linux-clang/only-group-x", "/".join(f"d{i}" for i in range(40)) + "/bottom.txt"} <= listed
    assert not {MANIFEST, "share/fifo", "share/sock", "lib/host/libQnnHtp.so", "docs/empty folder"} & listed
    assert len(tree_digests(root, skip={MANIFEST})) >= 4  # several components


def test_the_same_lines_without_a_skip_and_with_recorded_digests(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sdk"
    odd_tree(root)
    assert_same(monkeypatch, root)
    # Recorded sha256 (even a wrong one) are taken as they are; anything not 64 long is read.
    recorded = {"QNN_README.txt": "0" * 64, "sdk.yaml": "crc32:01234567",
                os.fsdecode(b"share/latin1-\xe9\xff"): "f" * 64, "lib/host": "e" * 64, "missing": "d" * 64}
    lines = assert_same(monkeypatch, root, recorded, {MANIFEST, "docs", "lib/host"})
    assert any("0" * 64 in line for _, line in lines)
    assert not any("lib/host" == rel for rel, _ in lines)


def test_a_root_given_through_a_link_or_with_dots_reads_the_same(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sdk"
    odd_tree(root)
    os.symlink(root, tmp_path / "link")
    expected = tree_digests(root, skip={MANIFEST})
    for other in (tmp_path / "link", Path(f"{root}/"), tmp_path / "sdk" / "share" / ".." / "."):
        assert_same(monkeypatch, other, skip={MANIFEST})
        assert tree_digests(other, skip={MANIFEST}) == expected


def _random_tree(root: Path, rng: random.Random) -> None:
    names = ["a", "b c", "lib", "bin", "x86_64-linux-clang", "aarch64-android", "hexagon-v75", "unsigned",
             "include", "\n", "é", os.fsdecode(b"\xff\xfe"), ".qnnctl.json", "QNN", "share"]
    folders = [root]
    root.mkdir()
    for _ in range(rng.randrange(20, 80)):
        parent = rng.choice(folders)
        path = parent / rng.choice(names)
        if os.path.lexists(path):
            continue
        kind = rng.random()
        if kind < 0.3:
            path.mkdir()
            folders.append(path)
        elif kind < 0.75:
            _file(path, rng.randbytes(rng.randrange(0, 200)), rng.choice([0o644, 0o755, 0o600, 0o700, 0o444]))
        else:
            os.symlink(rng.choice(["a", "..", ".", "../lib", "/", "missing", os.fsdecode(b"\xe9")]), path)


@pytest.mark.parametrize("seed", range(30))
def test_the_same_lines_for_random_trees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    root = tmp_path / "sdk"
    _random_tree(root, random.Random(seed))
    assert_same(monkeypatch, root, skip={MANIFEST, "lib/.qnnctl.json"})


# -- folders this user cannot read (root reads everything: the walks then run as nobody) ---------


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder another user can reach (pytest's own is the owner's alone)."""
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


def _as_nobody(call: Callable[[], object]) -> object:
    """`call()` in a child process that runs as nobody when this one is root: its result, or
    the type of what it raised."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(reader)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            try:
                result: object = ["ok", call()]
            except Exception as exc:
                result = ["raised", type(exc).__name__]
            os.write(writer, json.dumps(result).encode("utf-8", "surrogateescape"))
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data.decode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("mode", [0o750, 0o751, 0o754], ids=["closed", "searchable only", "listable only"])
@pytest.mark.parametrize("where", ["lib/x86_64-linux-clang", "share/folder", "root"])
def test_a_folder_that_cannot_be_listed_or_searched_reads_the_same(shared_tmp: Path, mode: int, where: str) -> None:
    root = shared_tmp / "sdk"
    odd_tree(root)
    _file(root / "share/folder/inner/file.txt", b"inner")
    (root / "bin/x86_64-linux-clang/only-group-x").chmod(0o644)  # every file readable by nobody
    folder = root if where == "root" else root / where
    # The bits for whoever walks: others (nobody) under root, else the owner.
    folder.chmod(mode if os.geteuid() == 0 else (mode & 0o7) << 6)
    try:
        old = _as_nobody(lambda: component_digests(reference_lines(root, skip={MANIFEST})))
        new = _as_nobody(lambda: tree_digests(root, skip={MANIFEST}))
        plain = _as_nobody(lambda: sorted(os.listdir(folder)))
    finally:
        folder.chmod(0o755)
    assert new == old
    if mode != 0o754:
        assert plain == ["raised", "PermissionError"]  # the walks did run where it cannot be listed
    else:
        assert new == ["raised", "PermissionError"]  # listed, but its entries cannot be looked at
