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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qnnctl.errors import IntegrityError, UsageError
from qnnctl.install.archive import zip_digests
from qnnctl.install.commit import download_name
from qnnctl.install.door import admit_archive, admit_listing
from qnnctl.install.zipindex import file_directory_sha256
from qnnctl.net.download import Downloader, PlainProgress, file_sha256, make_session, terminal_progress
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


def archive_build_id(archive: Path, scratch: Path) -> str | None:
    """The build id the host libraries inside a zip archive carry (see qnnctl.sdk.identity), read
    from one library copied into `scratch`; None when they carry none."""
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
        raise IntegrityError(f"{archive} is not a readable zip archive: {exc}",
                             hint="remove it and fetch it again") from None
    return None


def _true_version(build: str | None, version: str, shown: str) -> None:
    if build is not None and version_of_build(build) != version:
        raise IntegrityError(
            f"{shown} holds SDK {version_of_build(build)} (its libraries are build {build}), not {version}",
            hint="check the source; a mirror must serve each version under its own name",
        )


# -- fetching one archive into the cache ---------------------------------------------------------


def _finished_download(cache: Cache, version: str) -> tuple[Path, str, str] | None:
    """A complete archive of `version` already in the cache's downloads (a download that an
    install did not get to use): (path, its recorded sha256, checked again, the URL recorded)."""
    if not cache.downloads.is_dir():
        return None
    for record in sorted(cache.downloads.glob("*.json")):
        archive = record.with_suffix("")
        if version_in(archive.name) != version or archive.suffix != ".zip" or not archive.is_file():
            continue
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        recorded = data.get("sha256") if isinstance(data, dict) else None
        if isinstance(recorded, str) and file_sha256(archive) == recorded:
            url = data.get("url")
            # Records are written redacted; one of an earlier qnnctl may not be.
            return archive, recorded, redact(url) if isinstance(url, str) else str(archive)
    return None


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
        found = _finished_download(cache, version)
        if found is not None:
            path, digest, shown = found
            log.info("using %s, downloaded earlier from %s", path, shown)
        else:
            downloader = Downloader(make_session(), cache.downloads,
                                    terminal_progress if terminal else PlainProgress)
            log.info("downloading SDK %s from %s", version, redact(urls[0]))
            fetched = downloader.fetch(urls, download_name(urls[0], version), limit=size_limit(expected))
            path, digest, shown = fetched.path, fetched.sha256, fetched.url
        record = path.with_name(path.name + ".json")
        try:
            admit_archive(expected, shown, digest, path.stat().st_size)
            with work_folder(cache.tmp / f"{version}.identify.{work_id()}") as scratch:
                build = archive_build_id(path, scratch)
            _true_version(build, version, shown)
            digests = zip_digests(path)
            directory = file_directory_sha256(path)
            admit_listing(expected, shown, digest, path.stat().st_size, digests, directory)
        except IntegrityError:
            path.unlink(missing_ok=True)
            record.unlink(missing_ok=True)
            raise
        result = FetchedArchive(path, shown, digest, path.stat().st_size, build, digests, directory)
        if not keep:
            path.unlink(missing_ok=True)
            record.unlink(missing_ok=True)
        return result


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
            digest = file_sha256(dest)
            # An entry of an earlier qnnctl, without components' digests, is indexed again.
            if entry is not None and entry.get("sha256") == digest and isinstance(entry.get("components"), dict):
                done.append(Mirrored(version, dest, digest, dest.stat().st_size, entry.get("build_id"), "kept"))
                log.info("SDK %s is in the mirror already (%s)", version, dest)
                continue
            if entry is not None and entry.get("sha256") != digest:
                raise IntegrityError(
                    f"{dest} has sha256 {digest}, but {folder / INDEX_NAME} says {entry.get('sha256')}",
                    hint=f"remove {dest} and run `qnnctl mirror {folder} {version}` again",
                )
            cache.ensure()
            refuse_unsafe_cache(cache)
            with work_folder(cache.tmp / f"{version}.identify.{work_id()}") as scratch:
                build = archive_build_id(dest, scratch)
            _true_version(build, version, str(dest))
            size, digests = dest.stat().st_size, zip_digests(dest)
            _admit_found(dest, version, digest, size, digests, environ, cwd)
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


def _admit_found(dest: Path, version: str, digest: str, size: int, digests: dict[str, str],
                 environ: Mapping[str, str], cwd: Path) -> None:
    """An archive found in the mirror, held to what a fetched one is: the project's lock and the
    upstream mirror's index (IntegrityError, nothing indexed, when it differs)."""
    vouched = vouchers(environ, cwd)
    expected = [e for e in (vouched.mirror.expected(version) if vouched.mirror is not None else None,
                            vouched.lock.expected(version) if vouched.lock is not None else None) if e is not None]
    admit_to_mirror(expected, str(dest), digest, size, digests, file_directory_sha256(dest))


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
