"""A mirror in one command: `<version>/v<version>.zip` files and an `index.json`.

The folder `qnnctl mirror DIR` fills is laid out like Qualcomm's server (qnnctl.sdk.versions
`archive_urls`), so any static HTTP server or object store serves it as `QNNCTL_MIRROR`. Its
`index.json` holds each version's sha256, size, build id and the time it was added; `install`
from a mirror that has one checks the archive against it (exit 4 on a mismatch).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qnnctl.errors import IntegrityError, UsageError
from qnnctl.install.archive import zip_digests
from qnnctl.install.commit import download_name
from qnnctl.install.door import admit_archive, admit_listing
from qnnctl.install.sources import LocalArchive, pinned_file
from qnnctl.install.zipindex import file_directory_sha256
from qnnctl.net.download import Downloader, PlainProgress, make_session, terminal_progress
from qnnctl.net.urls import check_url, redact
from qnnctl.paths import user_path, write_json_atomic
from qnnctl.records import Record
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.gate import Expected, agree, size_limit
from qnnctl.sdk.hosts import HOSTS
from qnnctl.sdk.identity import IDENTITY_LIBS, build_id, version_of_build
from qnnctl.sdk.layout import read_sdk_version
from qnnctl.sdk.mirrorindex import INDEX_NAME, INDEX_SCHEMA, parse_index
from qnnctl.sdk.select import resolve_spec, select_sdk
from qnnctl.sdk.stores import first_unsafe, refuse_unsafe_cache
from qnnctl.sdk.versions import archive_name, archive_urls, is_full_version, version_in
from qnnctl.sdk.vouchers import vouchers
from qnnctl.sdk.work import version_lock, work_folder, work_id

log = logging.getLogger("qnnctl.fleet.mirror")

class FetchedArchive(Record):
    path: Path
    url: str  # redacted
    sha256: str
    size: int
    build_id: str | None
    components: dict[str, str]  # component -> digest, computed from the whole archive
    central_directory_sha256: str  # what a lock pins for installs by parts, as from a manifest


# -- index.json ----------------------------------------------------------------------------


# -- an archive's build id ---------------------------------------------------------------------


# The largest library read for its build id (a QAIRT host library is at most about 100 MB: libQnnHtp.so).
MOST_LIBRARY = 512 << 20


def archive_build_id(archive: Path, scratch: Path, shown: str | None = None) -> str | None:
    """The build id the host libraries inside a zip archive carry (see qnnctl.sdk.identity), read
    from one library copied into `scratch`; None when they carry none. `shown`: the archive's
    name in messages (its path by default)."""
    try:
        with zipfile.ZipFile(archive) as zf:
            members: dict[str, zipfile.ZipInfo] = {}
            lib_dirs = {host.lib_dir for host in HOSTS}  # every host's libraries carry the build id
            for info in zf.infolist():
                # A folder's name ends with "/": its last part is "", no library's name.
                parts = info.filename.rsplit("/", 3)
                kind = stat.S_IFMT(info.external_attr >> 16)
                if len(parts) >= 3 and "/".join(parts[-3:-1]) in lib_dirs and kind != stat.S_IFLNK:
                    members.setdefault(parts[-1], info)
            for name in IDENTITY_LIBS:
                member = members.get(name)
                if member is None:
                    continue
                if member.file_size > MOST_LIBRARY:
                    # An archive no one vouched for yet: not written out past what a library could be.
                    raise IntegrityError(
                        f"{shown or archive} holds a {name} of {member.file_size} bytes, more than any SDK's library "
                        f"(at most {MOST_LIBRARY})", hint="remove it and fetch it again")
                copy = scratch / name
                with zf.open(member) as source, open(copy, "wb") as target:
                    shutil.copyfileobj(source, target, 1 << 20)
                try:
                    found = build_id(copy)
                finally:
                    copy.unlink(missing_ok=True)
                if found is not None:
                    return found
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise IntegrityError(f"{shown or archive} is not a readable zip archive: {exc}",
                             hint="remove it and fetch it again") from None
    return None


class Listing(Record):
    """What one archive holds, all read from the bytes of one open of it."""

    sha256: str
    size: int
    build_id: str | None
    components: dict[str, str]  # component -> digest
    central_directory_sha256: str


class Pinned(Record):
    """An archive opened once: `local.path` reads the very bytes hashed (qnnctl.install.sources)."""

    local: LocalArchive
    scratch: Path  # a work folder of the cache's, for as long as the archive is pinned

    def listing(self, shown: str) -> Listing:
        """Its sha256 and size, its libraries' build id, its components' digests and its central
        directory's sha256, all of the same bytes, whatever happens to its path meanwhile."""
        path = self.local.path
        return Listing(self.local.sha256, self.local.size, archive_build_id(path, self.scratch, shown),
                       zip_digests(path), file_directory_sha256(path))


@contextmanager
def pinned_archive(path: Path, version: str, cache: Cache) -> Iterator[Pinned]:
    """The archive at `path`, opened once and hashed; read through nothing else until the end."""
    cache.ensure()
    refuse_unsafe_cache(cache)
    with work_folder(cache.tmp / f"{version}.identify.{work_id()}") as scratch, \
            pinned_file(path, scratch / "source") as local:
        yield Pinned(local, scratch)


def _true_version(build: str | None, version: str, shown: str) -> None:
    if build is not None and version_of_build(build) != version:
        raise IntegrityError(
            f"{shown} holds SDK {version_of_build(build)} (its libraries are build {build}), not {version}",
            hint="check the source; a mirror must serve each version under its own name",
        )


# -- fetching one archive into the cache ---------------------------------------------------------


def _finished_downloads(cache: Cache, version: str) -> list[tuple[Path, str, str]]:
    """Complete archives of `version` in the cache's downloads (downloads that an install did not
    get to use), by their records: (path, the sha256 recorded, the URL recorded). Each is still
    to be read and held to its record."""
    if not cache.downloads.is_dir():
        return []
    found = []
    for record in sorted(cache.downloads.glob("*.json")):
        archive = record.with_suffix("")
        if version_in(archive.name) != version or archive.suffix != ".zip" or not archive.is_file():
            continue
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        recorded = data.get("sha256") if isinstance(data, dict) else None
        if isinstance(recorded, str):
            url = data.get("url")
            # Records are written redacted; one of an earlier qnnctl may not be.
            found.append((archive, recorded, redact(url) if isinstance(url, str) else str(archive)))
    return found


def fetch_archive(version: str, cache: Cache, environ: Mapping[str, str], terminal: bool = False,
                  keep: bool = True, check_lock: bool = True, cwd: Path | None = None) -> FetchedArchive:
    """The archive of `version` in the cache's downloads: the one there already, else fetched
    (from QNNCTL_MIRROR when set), checked against the mirror's index.json and, with
    `check_lock`, the project's lock. Without `keep` it is hashed and removed again."""
    vouched = vouchers(environ, cwd or Path.cwd(), lock=check_lock)
    mirror = vouched.mirror
    if mirror is not None:
        check_url(mirror.base, "QNNCTL_MIRROR", allow_file=False)
    urls = archive_urls(version, mirror.base if mirror is not None else None)
    locked = vouched.lock.expected(version) if vouched.lock is not None else None
    cache.ensure()
    refuse_unsafe_cache(cache)
    with version_lock(cache, version):
        indexed = mirror.expected(version) if mirror is not None else None
        expected = [e for e in (indexed, locked) if e is not None]
        agree(expected)
        for path, recorded, shown in _finished_downloads(cache, version):
            with pinned_archive(path, version, cache) as pinned:
                if pinned.local.sha256 == recorded:  # else not the file its record names: passed over
                    log.info("using %s, downloaded earlier from %s", path, shown)
                    return _admitted(pinned, expected, version, shown, keep)
        downloader = Downloader(make_session(), cache.downloads, terminal_progress if terminal else PlainProgress)
        log.info("downloading SDK %s from %s", version, redact(urls[0]))
        fetched = downloader.fetch(urls, download_name(urls[0], version), limit=size_limit(expected))
        with pinned_archive(fetched.path, version, cache) as pinned:
            if pinned.local.sha256 != fetched.sha256:
                raise IntegrityError(f"{fetched.path} changed on disk after it was downloaded",
                                     hint="check what else writes to qnnctl's cache, and run the command again")
            return _admitted(pinned, expected, version, fetched.url, keep)


def _admitted(pinned: Pinned, expected: list[Expected], version: str, shown: str, keep: bool) -> FetchedArchive:
    """A download through the gate: its sha256 and size before it is opened as a zip, then its
    build id and components. Removed with its record when refused, and without `keep`."""
    path = pinned.local.given
    record = path.with_name(path.name + ".json")
    try:
        admit_archive(expected, shown, pinned.local.sha256, pinned.local.size)
        listing = pinned.listing(shown)
        _true_version(listing.build_id, version, shown)
        admit_listing(expected, shown, listing.sha256, listing.size, listing.components,
                      listing.central_directory_sha256)
    except IntegrityError:
        path.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        raise
    if not keep:
        path.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
    return FetchedArchive(path, shown, listing.sha256, listing.size, listing.build_id, listing.components,
                          listing.central_directory_sha256)


# -- qnnctl mirror DIR [VERSION]... --------------------------------------------------------------


class Mirrored(Record):
    version: str
    path: Path
    sha256: str
    size: int
    build_id: str | None
    action: str  # "added" or "kept" (already there, as indexed)


def refuse_unsafe_mirror(folder: Path, *paths: Path) -> None:
    """IntegrityError (exit 4) when another user could change the mirror's folder, or `paths` in
    it (an archive found there, its version's folder): what the index vouches for to every host
    must be what this user put there."""
    problem = first_unsafe((folder, *paths))
    if problem is not None:
        raise problem.refusal(f"the mirror's folder {folder} is not used",
                              "change the archives and the index.json that hosts install by; nothing was added to "
                              "the mirror", ", or give a folder of your own")


def read_local_index(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / INDEX_NAME
    if not path.exists():
        return {}
    try:
        return parse_index(json.loads(path.read_text(encoding="utf-8")), str(path))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot use {path}: {exc}",
                         hint=f"move it out of the way; `qnnctl mirror {folder}` writes a new one") from None


def mirror_versions(specs: Sequence[str], environ: Mapping[str, str], cwd: Path, cache: Cache) -> list[str]:
    """The versions `specs` name (prefixes resolved), or the one qnnctl resolves here."""
    if specs:
        return list(dict.fromkeys(resolve_spec(spec, cache, environ, mirror=True) for spec in specs))
    selection = select_sdk(None, environ, cwd, cache)
    version = selection.version or (read_sdk_version(selection.root) if selection.root else None)
    if version is None or not is_full_version(version):
        raise UsageError("no SDK version to mirror was given, and qnnctl resolves none here",
                         hint="name them: `qnnctl mirror DIR VERSION...`")
    return [version]


def make_mirror(folder: Path, specs: Sequence[str], environ: Mapping[str, str], cwd: Path, cache: Cache,
                terminal: bool = False) -> list[Mirrored]:
    """Fill `folder` with `<version>/v<version>.zip` for each version and index them."""
    folder = user_path(folder).absolute()
    versions = mirror_versions(specs, environ, cwd, cache)
    folder.mkdir(parents=True, exist_ok=True)
    refuse_unsafe_mirror(folder, folder / INDEX_NAME)
    index = read_local_index(folder)
    done: list[Mirrored] = []
    for version in versions:
        rel = f"{version}/{archive_name(version)}"
        dest = folder / version / archive_name(version)
        refuse_unsafe_mirror(folder, dest)
        entry = index.get(version)
        if dest.is_file():
            with pinned_archive(dest, version, cache) as pinned:
                digest = pinned.local.sha256
                # An entry of an earlier qnnctl, without components' digests, is indexed again.
                if entry is not None and entry.get("sha256") == digest and isinstance(entry.get("components"), dict):
                    done.append(Mirrored(version, dest, digest, pinned.local.size, entry.get("build_id"), "kept"))
                    log.info("SDK %s is in the mirror already (%s)", version, dest)
                    continue
                if entry is not None and entry.get("sha256") != digest:
                    raise IntegrityError(
                        f"{dest} has sha256 {digest}, but {folder / INDEX_NAME} says {entry.get('sha256')}",
                        hint=f"remove {dest} and run `qnnctl mirror {folder} {version}` again",
                    )
                listing = pinned.listing(str(dest))
            size, build, digests = listing.size, listing.build_id, listing.components
            _true_version(build, version, str(dest))
            _admit_found(listing, dest, version, environ, cwd)
            action = "indexed"
        else:
            fetched = fetch_archive(version, cache, environ, terminal=terminal, cwd=cwd)
            dest.parent.mkdir(parents=True, exist_ok=True)
            _move(fetched.path, dest)
            fetched.path.with_name(fetched.path.name + ".json").unlink(missing_ok=True)
            digest, size, build, action = fetched.sha256, fetched.size, fetched.build_id, "added"
            digests = fetched.components
        index[version] = {"sha256": digest, "size": size, "build_id": build, "path": rel, "components": digests,
                          "added_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        # After each version, so that an interrupted run keeps what it finished.
        write_json_atomic(folder / INDEX_NAME, {"schema": INDEX_SCHEMA, "versions": index})
        done.append(Mirrored(version, dest, digest, size, build, action))
        log.info("SDK %s %s: %s", version, "indexed" if action == "indexed" else "added to the mirror", dest)
    return done


def _admit_found(listing: Listing, dest: Path, version: str, environ: Mapping[str, str], cwd: Path) -> None:
    """An archive found in the mirror, held to what a fetched one is: the project's lock and the
    upstream mirror's index (IntegrityError, nothing indexed, when it differs)."""
    vouched = vouchers(environ, cwd)
    expected = [e for e in (vouched.mirror.expected(version) if vouched.mirror is not None else None,
                            vouched.lock.expected(version) if vouched.lock is not None else None) if e is not None]
    admit_to_mirror(expected, str(dest), listing.sha256, listing.size, listing.components,
                    listing.central_directory_sha256)


def admit_to_mirror(expected: list[Expected], shown: str, digest: str, size: int, components: dict[str, str],
                    directory_sha256: str | None) -> None:
    """The install's gate for an archive about to be indexed (qnnctl.install.door.admit_listing),
    its refusal saying that nothing was added to the mirror."""
    try:
        admit_listing(expected, shown, digest, size, components, directory_sha256)
    except IntegrityError as exc:
        raise IntegrityError(exc.message.replace("nothing was installed", "nothing was added to the mirror"),
                             hint=exc.hint) from None


def _move(source: Path, dest: Path) -> None:
    """Move a file into the mirror: a rename on one file system, else a copy renamed into place."""
    try:
        os.replace(source, dest)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    partial = dest.with_name(dest.name + ".partial")
    shutil.copyfile(source, partial)
    os.replace(partial, dest)
    source.unlink(missing_ok=True)
