"""Which of an archive's members belong to which component, and the digests of a component's members.

The rules read paths below the SDK root; the digests are what a lock and a mirror's index
record per component, and what an install by parts and `lock --check` compare.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path, PurePosixPath

from qnnctl.records import Record
from qnnctl.sdk.components import ALL, ANDROID, DOCS, HEXAGON, HOST, OTHER, canonical
from qnnctl.sdk.hosts import HOSTS, HostPlatform, this_host

# (component, pattern) over a member's path below the SDK root. `dir/` claims everything under
# dir, `dir/*` the files directly in dir, `*` the files at the root; `{gen}` is a number.
# From the layout of a QAIRT SDK root (../shared/design.md, "The SDK"; the 2.37.0.250724 and
# 2.42.0.251225 archives, read 2025): one folder per target triple under lib/ (and bin/),
# include/QNN/ for the headers, lib/hexagon-vNN/unsigned/ for each DSP generation's skels,
# lib/python/ and share/ for what the host tools import and read, docs/ and examples/.
# The host's own library and tool folders (lib/x86_64-linux-clang/ on x86_64) are `host` too:
# those of the machine qnnctl runs on, from qnnctl.sdk.hosts (`host_rules`). A newer folder is
# one more line.
RULES: tuple[tuple[str, str], ...] = (
    (HOST, "*"),  # QNN_README.txt, sdk.yaml, the notices
    (HOST, "bin/*"),  # envsetup.sh and the dependency checks beside the tool folders
    (HOST, "lib/python/"),
    (HOST, "include/"),
    (HOST, "share/"),
    (ANDROID, "lib/aarch64-android/"),
    (ANDROID, "bin/aarch64-android/"),  # qnn-net-run and friends, for the phone
    (HEXAGON, "lib/hexagon-v{gen}/"),
    (DOCS, "docs/"),
    (DOCS, "examples/"),
)


def host_rules(host: HostPlatform) -> tuple[tuple[str, str], ...]:
    """RULES with `host`'s own folders: what `--components host` fetches on that machine."""
    return ((HOST, f"{host.bin_dir}/"), (HOST, f"{host.lib_dir}/"), *RULES)


# How a link is followed within the archive: at most this many links on one path, as the kernel.
_MAX_HOPS = 40


def _compile(pattern: str) -> re.Pattern[str]:
    body = re.escape(pattern).replace(re.escape("{gen}"), r"(?P<gen>\d+)")
    if pattern.endswith("/"):
        return re.compile(body)  # a prefix: the folder and everything under it
    return re.compile(body.replace(r"\*", r"[^/]+") + r"\Z")


_COMPILED: dict[str, tuple[tuple[str, re.Pattern[str]], ...]] = {}  # per host machine


def component_of(path: str, is_dir: bool = False, host: HostPlatform | None = None) -> str | None:
    """The component that holds `path` (below the SDK root) on `host` (this one by default), or
    None: `all` only."""
    host = host or this_host()
    rules = _COMPILED.get(host.machine)
    if rules is None:
        rules = _COMPILED[host.machine] = tuple((c, _compile(p)) for c, p in host_rules(host))
    text = path + "/" if is_dir else path
    for component, rule in rules:
        found = rule.match(text)
        if found is not None:
            return component.format(**found.groupdict())
    return None


class Member(Record):
    """One member of an archive, as far as choosing goes."""

    path: PurePosixPath  # in the archive, checked safe (no absolute path, no `..`)
    kind: str  # "file", "dir" or "link"


def available(members: Iterable[Member], top: PurePosixPath) -> tuple[str, ...]:
    """The components an archive has a member of."""
    found = set()
    for member in members:
        rel = _below(member.path, top)
        if rel is not None:
            component = component_of(rel, member.kind == "dir")
            if component is not None:
                found.add(component)
    return canonical(found)


def choose(members: Iterable[Member], top: PurePosixPath, components: Collection[str]) -> set[PurePosixPath]:
    """The members of the SDK folder `top` that `components` claim, and every folder entry above
    one of them (so that folders keep the archive's modes). Links are not followed here: see
    `with_link_targets`."""
    everything = ALL in components
    chosen: set[PurePosixPath] = set()
    folders: dict[str, PurePosixPath] = {}
    for member in members:
        rel = _below(member.path, top)
        if rel is None:
            continue
        if member.kind == "dir":
            folders[str(member.path)] = member.path
        if everything or component_of(rel, member.kind == "dir") in components:
            chosen.add(member.path)
    # Folder entries above the chosen members, found by their names' prefixes: this runs for
    # every member of a 10,000-member archive.
    above: set[str] = set()
    for path in chosen:
        text = str(path)
        cut = text.rfind("/")
        while cut > 0 and text[:cut] not in above:
            above.add(text[:cut])
            cut = text.rfind("/", 0, cut)
    chosen.update(folders[name] for name in above if name in folders)
    return chosen


def with_link_targets(members: Mapping[PurePosixPath, Member], chosen: set[PurePosixPath],
                      targets: Mapping[PurePosixPath, str]) -> set[PurePosixPath]:
    """The members that the chosen links need, beyond `chosen`: each one's target, whatever
    component holds it (the file, or a folder's members), and the links on the way to it.

    A link is kept working rather than refused: the component it belongs to is what was
    asked for, and a few more members make it whole. `targets` holds the target of each
    chosen link; a link whose target is not known yet is reported in the result so that the
    caller fetches it and asks again. Targets outside the archive's members (or outside the
    archive) add nothing: the extractor's own checks decide about those.
    """
    needed: set[PurePosixPath] = set()
    folders: set[PurePosixPath] = set()
    for link in sorted(p for p in chosen if members[p].kind == "link"):
        final, on_the_way = resolve_in(members, link, targets)
        needed.update(p for p in on_the_way if p not in chosen)
        if final is not None and (final not in members or members[final].kind == "dir"):
            folders.add(final)  # a folder, with or without an entry of its own
    for folder in folders:
        needed.update(p for p in members if folder in p.parents and p not in chosen)
    return needed


def resolve_in(members: Mapping[PurePosixPath, Member], link: PurePosixPath,
               targets: Mapping[PurePosixPath, str]) -> tuple[PurePosixPath | None, list[PurePosixPath]]:
    """Where `link` leads among the archive's members, and the members on the way (the links
    passed through, and the target itself when it is a member). None for a target outside the
    archive, or one that passes through a link whose own target is not in `targets`."""
    on_the_way: list[PurePosixPath] = []
    pending = [*PurePosixPath(targets[link]).parts] if link in targets else None
    if pending is None:
        return None, [link]
    if pending and pending[0] == "/":
        return None, on_the_way
    place: list[str] = list(link.parent.parts)
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not place:
                return None, on_the_way  # above the archive: the extractor refuses it
            place.pop()
            continue
        place.append(part)
        here = PurePosixPath(*place)
        member = members.get(here)
        if member is None:
            continue
        on_the_way.append(here)
        if member.kind == "link":
            hops += 1
            if hops > _MAX_HOPS:
                return None, on_the_way
            if here not in targets:
                return None, on_the_way  # fetch it, then ask again
            target = targets[here]
            if target.startswith("/"):
                return None, on_the_way
            place.pop()
            pending[:0] = [p for p in PurePosixPath(target).parts]
    return PurePosixPath(*place), on_the_way


def unresolved_links(members: Mapping[PurePosixPath, Member], chosen: Collection[PurePosixPath],
                     targets: Mapping[PurePosixPath, str]) -> list[tuple[PurePosixPath, PurePosixPath]]:
    """(link, member) for each chosen link that needs a member left out of `chosen`: what the
    extractor refuses, so that no link is left dangling by the choice of members."""
    wrong = []
    for link in sorted(p for p in chosen if members[p].kind == "link"):
        for path in resolve_in(members, link, targets)[1]:
            if path not in chosen:
                wrong.append((link, path))
                break
    return wrong


def _below(path: PurePosixPath, top: PurePosixPath) -> str | None:
    """`path` relative to the SDK folder `top`, or None when it is not inside it (or is it)."""
    text = str(path)
    if not top.parts:
        return text if path.parts else None
    prefix = str(top) + "/"
    return text[len(prefix):] if text.startswith(prefix) else None


def component_label(path: PurePosixPath, top: PurePosixPath, is_dir: bool = False) -> str:
    """Which component holds an archive member, in words: its name, or `all`."""
    rel = _below(path, top)
    return (component_of(rel, is_dir) if rel is not None else None) or ALL


# What qnnctl installs is never group- or world-writable, whatever modes the archive carries:
# the exec bit comes from the archive, the rest from this policy. The digests record the same.
FILE_MODE = 0o644
EXEC_MODE = 0o755
FOLDER_MODE = 0o755


def installed_mode(mode: int) -> int:
    """The mode a file with the archive's `mode` is installed with."""
    return EXEC_MODE if mode & 0o111 else FILE_MODE


def member_line(rel: str, kind: str, executable: bool, target: str, size: int, sha256: str) -> str:
    return json.dumps([rel, kind, EXEC_MODE if executable else FILE_MODE, target, size, sha256], ensure_ascii=False)


def component_digests(lines: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The digest of each component's lines. Components as on an x86_64 host, whatever this one
    is: a lock or a mirror's index then says the same on every host (its `host` is x86_64's
    folders and the shared ones; an aarch64 host's folders are among `other`)."""
    by_component: dict[str, list[str]] = {}
    for rel, line in lines:
        by_component.setdefault(component_of(rel, host=HOSTS[0]) or OTHER, []).append(line)
    return {name: hashlib.sha256("\n".join(sorted(found)).encode("utf-8", "surrogateescape")).hexdigest()
            for name, found in sorted(by_component.items())}


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def tree_digests(root: Path, recorded: Mapping[str, str] | None = None, skip: Collection[str] = ()) -> dict[str, str]:
    """Each component's digest over the SDK folder `root` as it is on disk. `recorded` gives
    the sha256 of files just written (path below root -> sha256); any other file is read.
    `skip`: paths below root that are no member (qnnctl's manifest). A folder that cannot be
    listed is passed over, as os.walk does (its files are then missing from the digests)."""
    lines: list[tuple[str, str]] = []
    known = recorded or {}
    # Paths as strings, not Path objects: on the install's critical path, pathlib took most of
    # the time for an SDK of thousands of files.
    folders = [("", os.fspath(root))]
    while folders:
        prefix, folder = folders.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError:
            continue
        for entry in entries:
            rel = prefix + entry.name
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                folders.append((f"{rel}/", entry.path))
            elif rel in skip:
                continue
            elif stat.S_ISLNK(info.st_mode):
                target = os.readlink(entry.path)
                lines.append((rel, member_line(rel, "link", False, target, len(os.fsencode(target)), "")))
            elif stat.S_ISREG(info.st_mode):
                sha256 = known.get(rel)
                if sha256 is None or len(sha256) != 64:
                    sha256 = _file_sha256(entry.path)
                lines.append((rel, member_line(rel, "file", bool(info.st_mode & 0o111), "", info.st_size, sha256)))
    return component_digests(lines)
