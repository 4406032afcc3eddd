"""Keeping an extraction inside its folder: member names made safe, the SDK folder found among
them, and links made only after every file, each checked to lead inside the SDK.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from qnnctl.errors import IntegrityError, NoHostLibrariesError
from qnnctl.sdk.hosts import HOSTS, HostPlatform, this_host
from qnnctl.sdk.layout import no_libraries_for_this_host


class Tree(Protocol):
    """What links are made into: the work folder, and the digests and size of the files written."""

    work: Path
    digests: dict[PurePosixPath, str]
    size: int

    def forget(self, name: PurePosixPath, path: str) -> None: ...


@dataclass
class Link:
    """A symlink or hard link of the archive, made once every file is written."""


    name: PurePosixPath
    target: str
    hard: bool


def member_path(name: str) -> PurePosixPath:
    """A member's name as a safe relative path; IntegrityError for an unsafe one."""
    if "\x00" in name:
        raise unsafe(f"member name {name!r} contains NUL")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise unsafe(f"absolute member path {name!r}")
    if ".." in name.split("/"):
        raise unsafe(f"member path {name!r} leaves the archive")
    return PurePosixPath(name)  # which drops the empty and "." parts


def sdk_top(names: Iterable[PurePosixPath]) -> PurePosixPath:
    """The folder of the archive that holds the SDK: the one with this host's library folder
    (lib/x86_64-linux-clang on x86_64) in it. NoHostLibrariesError (exit 5) for an archive with
    another host's only; IntegrityError for one with none."""
    names = list(names)
    here = this_host()
    tops = _tops(names, here)
    if tops:
        return min(tops, key=lambda p: len(p.parts))
    others = [host for host in HOSTS if host != here and _tops(names, host)]
    if others:
        raise NoHostLibrariesError(
            "the archive", no_libraries_for_this_host(others),
            hint=f"use an SDK archive with {here.lib_dir}/, or install it on one of the hosts it has libraries for")
    raise IntegrityError(
        f"the archive holds no SDK: no member under {here.lib_dir}/",
        hint="check that it is a Qualcomm AI Runtime (QAIRT) SDK archive",
    )


def _tops(names: Iterable[PurePosixPath], host: HostPlatform) -> set[PurePosixPath]:
    """The folders above `host`'s library folder among `names`."""
    marker = tuple(host.lib_dir.split("/"))
    width = len(marker)
    tops: set[PurePosixPath] = set()
    for name in names:
        parts = name.parts
        for i in range(len(parts) - width + 1):
            if parts[i : i + width] == marker:
                tops.add(PurePosixPath(*parts[:i]))
                break
    return tops


def _within(path: PurePosixPath, top: PurePosixPath) -> bool:
    return path == top or top in path.parents or top == PurePosixPath()


def make_links(links: list[Link], top: PurePosixPath, writer: Tree) -> None:
    work = writer.work
    root_real = os.path.realpath(work / top)
    for link in links:
        if not _within(link.name, top):
            continue  # outside the SDK folder: thrown away with the work folder
        kind = "hard link" if link.hard else "symlink"
        # Where the link really goes, given the links made before it: a folder on its path
        # may already be a link (a -> . then a/b), so resolve the parent as it is now.
        parent_real = os.path.realpath(work / link.name.parent)
        if not _inside(parent_real, root_real):
            raise unsafe(f"{kind} {link.name} would be written outside the SDK")
        place = os.path.join(parent_real, link.name.name)
        # The name the link ends up under, for the record of files.
        recorded = PurePosixPath(os.path.relpath(place, work))
        if link.hard:
            source = member_path(link.target)
            source_real = os.path.realpath(work / source)
            if (
                not _within(source, top)
                or source not in writer.digests
                or not _inside(source_real, root_real)
                or not os.path.isfile(source_real)
            ):
                raise unsafe(f"hard link {link.name} -> {link.target} leaves the SDK")
            if place == source_real:  # the file itself, by its name or through a linked folder
                continue
            os.makedirs(parent_real, exist_ok=True)
            writer.forget(recorded, place)
            _clear(place, link.name)
            # A copy rather than a link: the SDK tree then shares no inode with anything.
            shutil.copyfile(source_real, place)
            shutil.copymode(source_real, place)
            writer.digests[recorded] = writer.digests[source]
            writer.size += os.path.getsize(place)
            continue
        if not link.target or link.target.startswith("/") or "\x00" in link.target:
            raise unsafe(f"symlink {link.name} -> {link.target!r} points outside the SDK")
        if not _inside(os.path.realpath(os.path.join(parent_real, link.target)), root_real):
            raise unsafe(f"symlink {link.name} -> {link.target} points outside the SDK")
        os.makedirs(parent_real, exist_ok=True)
        writer.forget(recorded, place)
        _clear(place, link.name)
        os.symlink(link.target, place)
    # A link made early can be redirected by one made later (b -> a/.. before a -> .):
    # check where each one finally leads.
    for link in links:
        if _within(link.name, top) and not link.hard:
            real = os.path.realpath(work / link.name)
            if not _inside(real, root_real):
                raise unsafe(f"symlink {link.name} -> {link.target} leads outside the SDK")


def _clear(place: str, name: PurePosixPath) -> None:
    """Make room for a link where an earlier member of the same name was written."""
    if os.path.islink(place) or os.path.isfile(place):
        os.unlink(place)
    elif os.path.lexists(place):
        raise unsafe(f"{name} is both a folder and a link")


def unsafe(what: str) -> IntegrityError:
    return IntegrityError(
        f"unsafe archive: {what}",
        hint="the archive was not installed; get it from a trusted source",
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_links_inside(root: Path) -> None:
    """Every symlink under `root` leads inside it: for a tree put together from two
    installs, whose links were each checked on their own (one can redirect another)."""
    real_root = os.path.realpath(root)
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not _inside(os.path.realpath(path), real_root):
                raise unsafe(f"symlink {os.path.relpath(path, root)} -> {os.readlink(path)} leads outside the SDK")


# -- what a lock or an index pins of an archive ---------------------------------------------
