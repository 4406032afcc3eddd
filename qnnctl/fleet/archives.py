"""`qnnctl mirror DIR --file ARCHIVE...`: archives you have, added to a mirror without fetching.

Each archive is opened once and copied into the mirror while it is hashed, so that the sha256
the index records is that of the bytes the mirror serves. The copy is then checked as `install
--file` checks an archive (the one reading of a zip, every member's name and kind, the version
its top folder, its `sdk.yaml` and its libraries' build id say, which must agree), and against
the project's qnnctl.lock, through its own open file, never by its name again. Only then is it
renamed into `<version>/v<version>.zip` and indexed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import IO
from urllib.parse import unquote, urlparse

from qnnctl.errors import IntegrityError, UsageError
from qnnctl.fleet.mirror import Mirrored, admit_to_mirror, read_local_index, refuse_unsafe_mirror
from qnnctl.install.archive import extract, zip_digests
from qnnctl.install.commit import identify
from qnnctl.install.zipindex import file_directory_sha256
from qnnctl.net.download import file_sha256
from qnnctl.paths import user_path, write_json_atomic
from qnnctl.sdk.cache import Cache, read_manifest
from qnnctl.sdk.gate import Lock
from qnnctl.sdk.hosts import this_host
from qnnctl.sdk.identity import IDENTITY_LIBS
from qnnctl.sdk.mirrorindex import INDEX_NAME, INDEX_SCHEMA
from qnnctl.sdk.select import find_installed
from qnnctl.sdk.stores import refuse_unsafe_cache
from qnnctl.sdk.versions import archive_name, is_full_version
from qnnctl.sdk.vouchers import vouchers
from qnnctl.sdk.work import work_folder, work_id

log = logging.getLogger("qnnctl.fleet.archives")

_BLOCK = 1 << 20


def add_archives(folder: Path, archives: Sequence[Path], environ: Mapping[str, str], cwd: Path,
                 cache: Cache) -> list[Mirrored]:
    """Add each archive to the mirror in `folder`, under the version read from it, and index it."""
    folder = user_path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    refuse_unsafe_mirror(folder, folder / INDEX_NAME)
    index = read_local_index(folder)
    lock = vouchers(environ, cwd).lock
    done: list[Mirrored] = []
    for given in archives:
        archive = user_path(given).absolute()
        added, entry = _add_one(folder, archive, index, cache, lock)
        done.append(added)
        if entry is not None:
            index[added.version] = entry
            # After each archive, so that an interrupted run keeps what it finished.
            write_json_atomic(folder / INDEX_NAME, {"schema": INDEX_SCHEMA, "versions": index})
            log.info("SDK %s added to the mirror from %s: %s", added.version, archive, added.path)
    return done


def _add_one(folder: Path, archive: Path, index: Mapping[str, Mapping[str, object]], cache: Cache,
             lock: Lock | None) -> tuple[Mirrored, dict[str, object] | None]:
    try:
        # Closed below, after the copy. O_NONBLOCK: a FIFO in the archive's place would hold the
        # open for ever; fstat refuses it below instead, as `install --file` does.
        source = os.fdopen(os.open(archive, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK), "rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise UsageError(f"{archive} is not a file", hint="give the path of a downloaded SDK archive "
                         "(v<version>.zip)") from None
    partial = folder / f".adding.{work_id()}.zip.partial"
    try:
        with source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                raise UsageError(f"{archive} is not a file", hint="give the path of a downloaded SDK archive "
                                 "(v<version>.zip)")
            os.set_blocking(source.fileno(), True)
            with open(partial, "xb+") as copy:
                digest, size = _copy_hashing(source, copy)
                version, build, components, directory = _check_copy(copy, str(archive), cache)
        dest = folder / version / archive_name(version)
        refuse_unsafe_mirror(folder, dest)
        entry = index.get(version)
        if entry is not None and entry.get("sha256") != digest:
            raise IntegrityError(
                f"the mirror holds another archive of SDK {version} (sha256 {entry.get('sha256')}); {archive} has "
                f"sha256 {digest}",
                hint=f"check where {archive} came from; a mirror keeps one archive per version",
            )
        # Kept only when the mirror's file is that archive still; else the copy checked replaces it.
        if entry is not None and isinstance(entry.get("components"), dict) and dest.is_file() \
                and dest.stat().st_size == size and file_sha256(dest) == digest:
            log.info("SDK %s is in the mirror already, from the same archive (%s)", version, dest)
            return Mirrored(version, dest, digest, size, build, "kept"), None
        locked = lock.expected(version) if lock is not None else None
        if locked is not None:
            admit_to_mirror([locked], str(archive), digest, size, components, directory)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    entry = {"sha256": digest, "size": size, "build_id": build, "path": f"{version}/{archive_name(version)}",
             "components": components, "added_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return Mirrored(version, dest, digest, size, build, "added"), entry


def _copy_hashing(source: IO[bytes], copy: IO[bytes]) -> tuple[str, int]:
    """Copy `source` into `copy`: the sha256 and size of exactly the bytes written."""
    digest = hashlib.sha256()
    size = 0
    while block := source.read(_BLOCK):
        digest.update(block)
        copy.write(block)
        size += len(block)
    copy.flush()
    os.fsync(copy.fileno())
    return digest.hexdigest(), size


def _check_copy(copy: IO[bytes], shown: str, cache: Cache) -> tuple[str, str | None, dict[str, str], str]:
    """(version, build id, components' digests, central directory's sha256) of the archive copied
    into `copy`, checked as
    `install --file` checks an archive, read through the open file (its /proc/self/fd name
    opens that very file, whatever becomes of the name it was created under)."""
    opened = Path(f"/proc/self/fd/{copy.fileno()}")
    cache.ensure()
    refuse_unsafe_cache(cache)  # its work folder is where the copy is read
    try:
        with work_folder(cache.tmp / f"mirror-file.{work_id()}") as work:
            # Every member's name and kind, and the SDK folder inside, with nothing written...
            top = PurePosixPath(extract(opened, work / "names", only=()).top)
            # ...then what names its version: sdk.yaml and the libraries that carry the build id,
            # in this host's folder, where identify() reads it.
            wanted = {top / "sdk.yaml", *(top / this_host().lib_dir / name for name in IDENTITY_LIBS)}
            extracted = extract(opened, work / "x", only=wanted)
            version, build = identify(extracted.root, extracted.version, None, shown)
        if version is None or not is_full_version(version):
            raise UsageError(f"cannot tell the SDK version of {shown}: neither its libraries, its sdk.yaml nor its "
                             "top folder name one",
                             hint=f"check that it is a QAIRT SDK archive; `qnnctl install VERSION --file {shown}` "
                             "installs one under a version you give")
        return version, build, zip_digests(opened), file_directory_sha256(opened)
    except IntegrityError as exc:
        # Said of the archive the user named, not of the file descriptor it was read through.
        message = exc.message.replace(str(opened), shown)
        if message.startswith(f"{opened.name} "):
            message = shown + message[len(opened.name):]
        raise IntegrityError(message, hint=f"check where {shown} came from; nothing was added to the mirror") from None


def no_archive_kept(versions: Sequence[str], cache: Cache, environ: Mapping[str, str]) -> list[str]:
    """For each version installed whose archive the cache does not keep: a note that it will be
    fetched although it is installed, and how to add an archive at hand instead."""
    notes = []
    for version in versions:
        sdk = find_installed(version, cache, environ)
        if sdk is None or (cache.downloads / archive_name(version)).is_file():
            continue
        source = (read_manifest(sdk.root) or {}).get("source") if sdk.origin == "qnnctl cache" else None
        # `install --file` records its archive as a file: URL; it may be there still.
        path = Path(unquote(urlparse(source).path)) if isinstance(source, str) and source.startswith("file:") else None
        there = (f"; it was installed from {path}: `qnnctl mirror DIR --file {path}` adds that"
                 if path is not None and path.is_file() else
                 "; with its archive at hand, `qnnctl mirror DIR --file ARCHIVE` adds it without a download")
        notes.append(f"SDK {version} is installed, but qnnctl's cache keeps no archive of it (an install removes "
                     f"the archive once it is unpacked), so it is fetched{there}")
    return notes
