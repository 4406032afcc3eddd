"""Installing some components of an SDK: only their members, fetched by Range requests.

From a server that serves ranges: the end of the archive, its central directory, then the
chosen members' byte ranges, into a sparse file (qnnctl.net.ranged) that the usual extractor
reads as the whole archive, with every check it makes (names, types, links, modes, each
member's CRC-32) and those that reading by parts needs (qnnctl.install.zipindex: members that overlap
or run past the directory, local headers that disagree with it). The archive's sha256 cannot
be known without all of it: the manifest says `partial` and records the central directory's
sha256 instead.

From an archive on disk (`--file`, or a server that ignores Range, or `--sha256`, which needs
the whole archive): the same choice of members, extracted from the file.

Adding components to an SDK installed with some: only the members it lacks are fetched, into
a new folder beside it that takes the old one's files as hard links, renamed into place.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import zipfile
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from qnnctl.errors import DownloadError, IntegrityError, UsageError
from qnnctl.files import require_free_space
from qnnctl.host.streams import bounded_tar
from qnnctl.install.archive import MAX_LINK_TARGET, archive_kind, extract
from qnnctl.install.commit import commit, identify, require_version, used_up
from qnnctl.install.confine import check_links_inside, member_path, sdk_top, unsafe
from qnnctl.install.door import admit_archive, admit_tree
from qnnctl.install.zipindex import (
    NeedMore,
    central_directory_sha256,
    check_local_header,
    check_zip_file,
    end_records,
    extent_of,
    extents,
    member_kind,
    open_zip,
    read_file_at,
    same_reading,
)
from qnnctl.net.download import Downloader, PlainProgress, make_session, terminal_progress, too_long
from qnnctl.net.ranged import ArchiveChanged, Fetcher, RangesIgnored, probe
from qnnctl.net.sparse import SparseFile
from qnnctl.records import Record
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, read_manifest
from qnnctl.sdk.components import ALL, HOST, OTHER, canonical, installed_components
from qnnctl.sdk.gate import Expected, size_limit, why_all, why_whole
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.members import FOLDER_MODE, Member, available, choose, component_label, with_link_targets
from qnnctl.sdk.work import work_folder, work_id
from qnnctl.words import human_size, plural

if TYPE_CHECKING:
    from qnnctl.install.zipindex import EndRecords, Extent
    from qnnctl.net.download import ProgressFactory
    from qnnctl.net.sparse import SparseFile

log = logging.getLogger("qnnctl.install.partial")


class Choice(Record):
    """What to extract from an archive for the components asked for."""

    top: PurePosixPath  # the archive's SDK folder
    members: dict[PurePosixPath, Member]  # every member of the archive
    chosen: set[PurePosixPath]  # the members to write
    present: set[PurePosixPath]  # members already installed (components added later)
    targets: dict[PurePosixPath, str]  # link targets known so far


class Parts(Record):
    """What an install of some components records in the manifest, beyond the usual."""

    components: tuple[str, ...]
    partial: bool  # fetched by parts: no sha256 of the whole archive
    central_directory_sha256: str | None

    def manifest_fields(self) -> dict[str, Any]:
        return {"components": list(self.components), "partial": self.partial,
                "central_directory_sha256": self.central_directory_sha256}


def wanted_components(components: Collection[str], old: Sdk | None) -> tuple[str, ...]:
    """The components the new SDK folder holds: those asked for and those already there."""
    have = installed_components(read_manifest(old.root)) if old is not None else ()
    return canonical([*components, *have])


# -- choosing members ------------------------------------------------------------------------


def zip_members(infos: Iterable[zipfile.ZipInfo]
                ) -> tuple[dict[PurePosixPath, Member], dict[PurePosixPath, zipfile.ZipInfo]]:
    """Every member of a zip by its path (checked safe: IntegrityError for one that is not,
    or for a device file), and its entry (the last of a name, though the one reading of a zip,
    qnnctl.install.zipindex, refuses a name given twice before this is asked)."""
    members: dict[PurePosixPath, Member] = {}
    entries: dict[PurePosixPath, zipfile.ZipInfo] = {}
    for info in infos:
        path = member_path(info.filename)
        if not path.parts:
            continue
        kind = member_kind(info)
        if kind == "special":
            raise unsafe(f"{info.filename!r} is a device or special file")
        members[path] = Member(path, kind)
        entries[path] = info
    return members, entries


def tar_members(archive: Path) -> tuple[dict[PurePosixPath, Member], dict[PurePosixPath, str]]:
    """Every member of a tar, and the target of each symlink, in one pass over it."""
    members: dict[PurePosixPath, Member] = {}
    targets: dict[PurePosixPath, str] = {}
    try:
        # Its headers within bounds: an archive no one vouched for may be read here (--file).
        for _, entry in bounded_tar(archive):
            path = member_path(entry.name)
            if not path.parts:
                continue
            if entry.isdir():
                kind = "dir"
            elif entry.issym():
                kind = "link"
                targets[path] = entry.linkname
            elif entry.isreg() or entry.islnk():
                kind = "file"
            else:
                raise unsafe(f"{entry.name!r} is a device or special file")
            members[path] = Member(path, kind)
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, EOFError) and exc.errno is not None:
            raise
        raise IntegrityError(f"{archive.name} is corrupt or truncated: {exc}",
                             hint="nothing was installed; download the archive again") from None
    return members, targets


def choose_members(members: dict[PurePosixPath, Member], components: Collection[str],
                   present: set[PurePosixPath], source: str) -> Choice:
    """The members `components` claim that are not installed already. UsageError when the
    archive has no member of a component asked for (a DSP generation it does not hold)."""
    top = sdk_top(members)
    if ALL not in components:
        found = set(available(members.values(), top))
        absent = [c for c in components if c not in found]
        if absent:
            held = ",".join(canonical(c for c in components if c in found) or (HOST,))
            raise UsageError(
                f"{source} has no {', '.join(absent)}: its components are {', '.join(canonical(found))}",
                hint=f"ask only for some of those (`--components {held}`), or install from an archive that "
                "has them",
            )
    chosen = choose(members.values(), top, components) - present
    return Choice(top, members, chosen, present, {})


def link_closure(choice: Choice) -> set[PurePosixPath]:
    """Members the chosen links need beyond the choice (added to it); links whose targets are
    not known yet are among them, for the caller to read and ask again.

    A link into another component brings all of that component: a component is installed
    whole or not at all, so that its digest in a lock or an index checks every member of it."""
    there = choice.chosen | choice.present
    extra = with_link_targets(choice.members, there, choice.targets)
    brought = {component_label(p, choice.top) for p in extra if choice.members[p].kind != "dir"}
    brought.discard(ALL)  # a member no rule claims comes alone, and is checked as such
    if brought:
        log.info("links of the components chosen lead into %s, which %s installed too", ", ".join(
            canonical(brought)), "is" if len(brought) == 1 else "are")
        extra |= choose(choice.members.values(), choice.top, brought) - there
    choice.chosen.update(extra)
    return extra


def unknown_links(choice: Choice) -> list[PurePosixPath]:
    return sorted(p for p in choice.chosen if choice.members[p].kind == "link" and p not in choice.targets)


def read_link_target(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    with zf.open(info) as source:
        raw = source.read(MAX_LINK_TARGET + 1)
    if len(raw) > MAX_LINK_TARGET:
        raise unsafe(f"symlink {info.filename!r} has a target longer than {MAX_LINK_TARGET} bytes")
    return raw.decode("utf-8", errors="surrogateescape")


def installed_members(root: Path, top: PurePosixPath) -> tuple[set[PurePosixPath], dict[PurePosixPath, str]]:
    """What an SDK folder holds, as archive paths below `top`, and its links' targets."""
    present: set[PurePosixPath] = set()
    targets: dict[PurePosixPath, str] = {}
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(folder, name)
            rel = path.relative_to(root)
            if str(rel) == MANIFEST_NAME:
                continue
            member = top / PurePosixPath(*rel.parts)
            present.add(member)
            if path.is_symlink():
                targets[member] = os.readlink(path)
    return present, targets


# -- from an archive on disk -------------------------------------------------------------------


def choose_in_file(archive: Path, components: Collection[str]) -> tuple[Choice, Parts]:
    """The members of the archive on disk that `components` need, and what to record."""
    if archive_kind(archive) != "zip":
        members, targets = tar_members(archive)
        choice = choose_members(members, components, set(), archive.name)
        choice.targets.update(targets)
        link_closure(choice)
        return choice, Parts(canonical(components), False, None)
    records = check_zip_file(archive)
    try:
        with open_zip(archive) as zf:
            members, entries = zip_members(zf.infolist())
            choice = choose_members(members, components, set(), archive.name)
            while True:
                for link in unknown_links(choice):
                    choice.targets[link] = read_link_target(zf, entries[link])
                if not link_closure(choice):
                    break
    except zipfile.BadZipFile as exc:
        raise IntegrityError(f"{archive.name} is corrupt or truncated: {exc}",
                             hint="nothing was installed; download the archive again") from None
    digest = central_directory_sha256(read_file_at(archive), records)
    return choice, Parts(canonical(components), False, digest)


# -- from a server, by parts -------------------------------------------------------------------


class RangedInstall:
    """One install of some components by Range requests. The caller holds the version's lock."""

    def __init__(self, version: str, urls: list[str], name: str, cache: Cache, work: Path,
                 progress: ProgressFactory) -> None:
        self.version = version
        self.urls = urls
        self.name = name
        self.cache = cache
        self.work = work
        self.progress = progress
        self.sparse: SparseFile | None = None
        self.records: EndRecords | None = None

    def open(self, limit: tuple[int, str]) -> None:
        """The end of the archive and its central directory, into the sparse file.

        RangesIgnored when the server does not serve ranges; IntegrityError when it says the
        archive is longer than `limit` (the size pinned, who pins it), before a byte is kept."""
        remote, tail_start, tail = probe(self.urls)
        if remote.size > limit[0]:
            raise too_long(remote.shown, limit, f"it says the file is {remote.size} bytes")
        log.info("reading the central directory of %s (%s)", remote.shown, human_size(remote.size))
        self.sparse = sparse = SparseFile.open(self.cache.downloads, self.name, remote, tail_start, tail)
        fetcher = Fetcher(sparse)
        want = len(tail)
        while True:
            try:
                records = end_records(sparse.read_at(remote.size - want, want), remote.size)
                break
            except NeedMore as more:
                if more.size <= want:  # pragma: no cover - end_records asks for more only
                    raise
                want = more.size
                fetcher.fetch([(remote.size - want, remote.size)], "end of the archive")
        fetcher.fetch([(records.cd_start, records.tail_start)], "central directory")
        self.records = records

    def central_directory_sha256(self) -> str:
        if self.sparse is None or self.records is None:  # pragma: no cover - open() comes first
            raise RuntimeError("the archive is not open")
        return central_directory_sha256(self.sparse.read_at, self.records)

    def install(self, components: Collection[str], old: Sdk | None
                ) -> tuple[Path, str, dict[str, str], int, str | None]:
        """Fetch and extract the members `components` need (beyond what `old` holds) into
        work/x; returns the SDK root there, the archive's top folder, the files written with
        their digests, the bytes written and the libraries' version."""
        sparse = self.sparse
        if sparse is None:  # pragma: no cover - open() comes first
            raise RuntimeError("the archive is not open")
        # Planned in a function of its own, so that the directory read for it (10,000 entries
        # of a real release, some 15 MB) is gone before the extractor reads its own.
        chosen, present, spans = self._plan(components, old)
        ranges = [(e.start, e.end) for e in spans.values()]
        wanted = sum(end - start for start, end in sparse.missing(ranges))
        adding = [c for c in components if old is None or c not in installed_components(read_manifest(old.root))]
        log.info("fetching %s of %s: %s of the archive's %s", plural(len(spans), "file"),
                 ", ".join(adding or components), human_size(wanted), human_size(sparse.remote.size))
        require_free_space(self.cache.downloads, wanted, "download the archive's parts")
        fetcher = Fetcher(sparse, self.progress)

        def ready(info: zipfile.ZipInfo) -> None:
            extent = spans[info.header_offset]
            fetcher.wait(extent.start, extent.end)
            check_local_header(sparse.read_at, extent)

        fetcher.start(ranges, f"{self.version} ({','.join(components)})")
        try:
            extracted = extract(sparse.path, self.work / "x", only=chosen, beside=present, ready=ready, kind="zip",
                                whole=False)
        except BaseException:
            fetcher.abandon()
            try:
                fetcher.finish()
            except Exception as exc:  # the extraction's failure is the one to report
                log.debug("fetching stopped: %s", exc)
            raise
        fetcher.finish()
        log.debug("received %s in this run", human_size(fetcher.received))
        return extracted.root, extracted.top, extracted.files, extracted.size, extracted.version

    def _plan(self, components: Collection[str], old: Sdk | None
              ) -> tuple[set[PurePosixPath], set[PurePosixPath], dict[int, Extent]]:
        """The members to extract (links followed, their bytes fetched), those `old` holds,
        and the byte range of every file entry to fetch, by its offset."""
        sparse = self.sparse
        records = self.records
        if sparse is None or records is None:  # pragma: no cover - open() comes first
            raise RuntimeError("the archive is not open")
        try:
            with open_zip(sparse.path) as zf:
                infos = same_reading(zf, records)
                spans = extents(infos, records.cd_start)
                members, entries = zip_members(infos)
                present: set[PurePosixPath] = set()
                old_targets: dict[PurePosixPath, str] = {}
                if old is not None:
                    present, old_targets = installed_members(old.root, sdk_top(members))
                    # Folders the archive has no entry for (as many archivers write zips) are
                    # on disk, but no member: nothing to choose, follow or fetch.
                    present &= members.keys()
                choice = choose_members(members, components, present, sparse.remote.shown)
                choice.targets.update(old_targets)

                def every(paths: Iterable[PurePosixPath]) -> list[Extent]:
                    return [extent_of(spans, entries[p]) for p in paths]

                # Links first: what they lead to may add members, and the links on the way.
                while True:
                    links = unknown_links(choice)
                    if links:
                        found = every(links)
                        Fetcher(sparse, threads=2).fetch([(e.start, e.end) for e in found], "links")
                        for extent in found:
                            check_local_header(sparse.read_at, extent)
                        for link in links:
                            choice.targets[link] = read_link_target(zf, entries[link])
                    if not link_closure(choice) and not unknown_links(choice):
                        break
        except zipfile.BadZipFile as exc:
            raise IntegrityError(f"the central directory of {sparse.remote.shown} cannot be read: {exc}",
                                 hint="nothing was installed; check the URL or mirror") from None
        files = every(p for p in choice.chosen if members[p].kind == "file")
        return choice.chosen, present, {e.start: e for e in files}

    def remove(self) -> None:
        if self.sparse is not None:
            self.sparse.remove()

    def close(self) -> None:
        if self.sparse is not None:
            self.sparse.close()


def merge_old(old_root: Path, new_root: Path) -> None:
    """Put the files, links and folders of `old_root` into `new_root` where it has none: hard
    links for files (a copy where the file system refuses), the same modes for folders."""
    folders: list[Path] = []
    for folder, dirs, names in os.walk(old_root):
        base = Path(folder)
        rel_base = base.relative_to(old_root)
        for name in dirs + names:
            old = base / name
            new = new_root / rel_base / name
            rel = rel_base / name
            if str(rel) == MANIFEST_NAME:
                continue
            is_folder = old.is_dir() and not old.is_symlink()
            if os.path.lexists(new):
                if is_folder != (new.is_dir() and not new.is_symlink()):
                    raise unsafe(f"{rel} is a {'folder' if is_folder else 'file or link'} in the SDK installed "
                                 "and something else in the archive")
                if not is_folder:
                    continue  # written again from the archive: the new one stands
            if old.is_symlink():
                os.symlink(os.readlink(old), new)
            elif is_folder:
                new.mkdir(exist_ok=True)
                folders.append(new)
            else:
                try:
                    os.link(old, new)
                except OSError:
                    shutil.copy2(old, new, follow_symlinks=False)
    for path in folders:
        os.chmod(path, FOLDER_MODE)
    check_links_inside(new_root)


def merged_files(old: Sdk | None, files: Mapping[str, str]) -> dict[str, str]:
    """The manifest's files: the old SDK's and those just written (which win)."""
    recorded = (read_manifest(old.root) or {}).get("files") if old is not None else None
    merged = dict(recorded) if isinstance(recorded, dict) else {}
    merged.update(files)
    return merged


def check_same_archive(old: Sdk, digest: str, shown: str) -> None:
    """Components added later come from the archive the others came from: the same central
    directory (so the same members, offsets and CRC-32s)."""
    recorded = (read_manifest(old.root) or {}).get("central_directory_sha256")
    if isinstance(recorded, str) and recorded != digest:
        raise IntegrityError(
            f"{shown} is not the archive SDK {old.version} was installed from: its central directory's "
            f"sha256 is {digest}, not {recorded}",
            hint=f"to replace the SDK with this archive's: `qnnctl install --force {old.version} "
            "--components ...`; nothing was changed",
        )




def ranged_failure(exc: BaseException, shown: str) -> DownloadError:
    """What to say when the archive changed on the server part-way."""
    return DownloadError(f"{shown} changed on the server while its parts were being fetched: {exc}",
                         hint="the parts fetched were removed; run the same command again")


# -- the installs ------------------------------------------------------------------------------


def extract_components(archive: Path, components: Collection[str], work: Path) -> tuple[Any, Parts]:
    """Extract what `components` need from an archive on disk into `work`."""
    choice, parts = choose_in_file(archive, components)
    log.info("installing %s: %d of %d members", ", ".join(parts.components), len(choice.chosen),
             len(choice.members))
    return extract(archive, work, only=choice.chosen), parts


def same_archive(old: Sdk) -> Expected:
    """What components added to `old` must match: the archive its components came from."""
    manifest = read_manifest(old.root) or {}
    recorded, cd = manifest.get("sha256"), manifest.get("central_directory_sha256")
    return Expected(
        f"SDK {old.version} installed at {old.root}", "the SDK installed", "came from an archive with",
        f"to replace the SDK with this archive's: `qnnctl install --force {old.version} --components ...`",
        sha256=recorded if isinstance(recorded, str) and manifest.get("partial") is False else None,
        central_directory_sha256=cd if isinstance(cd, str) else None, by_directory=True)


def install_components(version: str, urls: list[str], name: str, components: Collection[str],
                       expected: list[Expected], cache: Cache, force: bool, terminal: bool, old: Sdk | None,
                       sha256: str | None = None) -> Sdk:
    """Install the members of SDK `version` that `components` need, into qnnctl's cache, with
    those of `old` (the same version, installed with fewer components) kept. What was written
    passes the gate (qnnctl.sdk.gate) against `expected` (and, with `old`, the archive it came
    from) before it is renamed into place. `sha256`: --sha256, which the download checks too.
    The caller holds the version's lock and has removed stale work folders."""
    components = wanted_components(components, old)
    fetching = [c for c in components if old is None or c not in installed_components(read_manifest(old.root))]
    progress: ProgressFactory = terminal_progress if terminal else PlainProgress
    if old is not None:
        expected = [*expected, same_archive(old)]
    everything = why_all(expected, components)
    if everything is not None:
        log.warning("%s: installing the whole SDK, checked whole", everything)
        return _install_whole(version, urls, name, (ALL,), expected, sha256, cache, force or old is not None,
                              progress)
    whole = why_whole(expected, fetching)
    if whole is not None:
        log.warning("%s: downloading the whole archive to check it, then installing only %s", whole,
                    ", ".join(components))
        return _install_whole(version, urls, name, components, expected, sha256, cache, force or old is not None,
                              progress)
    with work_folder(cache.tmp / f"{version}.{work_id()}") as work:
        job = RangedInstall(version, urls, name, cache, work, progress)
        try:
            job.open(size_limit(expected))
            if job.sparse is None:  # pragma: no cover - open() sets it
                raise RuntimeError("the archive is not open")
            remote = job.sparse.remote
            digest = job.central_directory_sha256()
            if old is not None:
                check_same_archive(old, digest, remote.shown)  # before any member is fetched
            root, _, files, size, found = job.install(components, old)
            seen = admit_tree(expected, root, files, remote.shown, directory=digest)
            found, build = identify(root, found, version, remote.shown)
            require_version(found, version, remote.shown)
            written = dict(seen.components or {})
            if old is not None:
                merge_old(old.root, root)
                files = merged_files(old, files)
                before = (read_manifest(old.root) or {}).get("unpacked_size")
                size += before if isinstance(before, int) else 0
            parts = Parts(canonical([*components, *(c for c in written if c != OTHER)]), True, digest)
            sdk = commit(root, version, remote.shown, None, remote.size, files, size, cache,
                         force or old is not None, work, build,
                         extra={**parts.manifest_fields(), "component_sha256": merged_digests(old, written)})
        except RangesIgnored as why:
            job.remove()
            fallback = str(why)
        except ArchiveChanged as exc:
            job.remove()
            raise ranged_failure(exc, job.sparse.remote.shown if job.sparse else "the archive") from None
        except (IntegrityError, UsageError):
            # Bytes that make no good archive are no base to resume from; a component the
            # archive lacks leaves only its directory, read again in a moment.
            job.remove()
            raise
        else:
            job.remove()
            return sdk
        finally:
            job.close()
    # Said on stderr whatever the verbosity: the whole archive is a much longer wait.
    log.warning("%s: downloading the whole archive instead, then installing only %s", fallback,
                ", ".join(components))
    return _install_whole(version, urls, name, components, expected, None, cache, force or old is not None,
                          progress)


def merged_digests(old: Sdk | None, written: Mapping[str, str]) -> dict[str, str]:
    """The manifest's component digests: the old SDK's and those just written (which win)."""
    recorded = (read_manifest(old.root) or {}).get("component_sha256") if old is not None else None
    merged = {str(k): str(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}
    merged.update(written)
    return merged


def _install_whole(version: str, urls: list[str], name: str, components: Collection[str],
                   expected: list[Expected], sha256: str | None, cache: Cache, force: bool,
                   progress: ProgressFactory) -> Sdk:
    """Download the whole archive, check it at the gate, then install only the members
    `components` need."""
    downloader = Downloader(make_session(), cache.downloads, progress)
    with work_folder(cache.tmp / f"{version}.{work_id()}") as work:
        fetched = downloader.fetch(urls, name, sha256, limit=size_limit(expected))
        with used_up(fetched.path, cache.downloads / f"{name}.json"):
            # What pins the whole archive is checked before a byte of it is read as a zip.
            admit_archive(expected, fetched.url, fetched.sha256, fetched.size)
            try:
                extracted, parts = extract_components(fetched.path, components, work / "x")
            except UsageError as exc:
                # Known only now that it is all here: say that it stays, and what for.
                exc.hint = (f"{exc.hint}; the whole archive stays in {fetched.path}, so that the next install "
                            "of this version reads it instead of downloading it again (`qnnctl cache clean` "
                            "removes it)")
                raise
            seen = admit_tree(expected, extracted.root, extracted.files, fetched.url, fetched.sha256, fetched.size,
                              parts.central_directory_sha256)
            found, build = identify(extracted.root, extracted.version, version, fetched.url)
            require_version(found, version, fetched.url)
            written = dict(seen.components or {})
            parts = parts._replace(components=canonical([*parts.components, *(c for c in written if c != OTHER)]))
            sdk = commit(extracted.root, version, fetched.url, fetched.sha256, fetched.size, extracted.files,
                         extracted.size, cache, force, work, build,
                         extra={**parts.manifest_fields(), "component_sha256": written})
    return sdk


def with_installed(old: Sdk, extracted: Any, parts: Parts, source: str) -> tuple[Parts, dict[str, str], int]:
    """An extraction of some components, with the components `old` holds beside them (the same
    archive, by its central directory): their files hard-linked into the new folder."""
    have = installed_components(read_manifest(old.root))
    if parts.central_directory_sha256 is not None:
        check_same_archive(old, parts.central_directory_sha256, source)
    merge_old(old.root, extracted.root)
    before = (read_manifest(old.root) or {}).get("unpacked_size")
    unpacked = extracted.size + (before if isinstance(before, int) else 0)
    was_partial = bool((read_manifest(old.root) or {}).get("partial"))
    merged = Parts(canonical([*parts.components, *have]), parts.partial or was_partial,
                   parts.central_directory_sha256)
    return merged, merged_files(old, extracted.files), unpacked
