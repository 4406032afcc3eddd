"""The last stage of every install: identify what was extracted, and commit it atomically.

What an install builds is built aside, in a work folder under the cache's tmp/, and becomes an
SDK in one `os.replace` into sdks/ once its manifest is written (a folder without a manifest is
never an SDK). One installer per version at a time holds the version's lock; a work folder
that a killed install left is removed by the next holder of that lock.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

from qnnctl.errors import IntegrityError
from qnnctl.files import remove_tree
from qnnctl.install.archive import archive_kind
from qnnctl.install.zipindex import file_directory_sha256
from qnnctl.paths import fsync_dir, make_folders, write_json_atomic
from qnnctl.sdk.cache import MANIFEST_NAME, MANIFEST_SCHEMA, Cache
from qnnctl.sdk.holds import exclusive, wait_for_holders
from qnnctl.sdk.identity import version_of_build
from qnnctl.sdk.layout import Sdk, missing_layout, read_build_id, version_claims
from qnnctl.sdk.members import FOLDER_MODE, installed_mode
from qnnctl.sdk.versions import archive_name
from qnnctl.version import __version__

log = logging.getLogger("qnnctl.install.pipeline")


@contextmanager
def used_up(*leftovers: Path) -> Iterator[None]:
    """A finished download and its record: removed once what they hold is installed, and when
    they prove to be no good SDK archive (never to be reused as a finished download); kept on
    any other failure, for the next run to resume from."""
    try:
        yield
    except IntegrityError:
        for leftover in leftovers:
            leftover.unlink(missing_ok=True)
        raise
    for leftover in leftovers:
        leftover.unlink(missing_ok=True)


def require_version(found: str | None, version: str, source: str) -> None:
    """The SDK a download holds must be the one asked for."""
    if found is not None and found != version:
        raise IntegrityError(
            f"{source} holds SDK {found}, not {version}",
            hint=f"check the URL or QNNCTL_MIRROR; to install {found}, run "
            f"`qnnctl install {found}` with a source that serves it",
        )


def download_name(url: str, version: str) -> str:
    base = unquote(urlparse(url).path.rsplit("/", 1)[-1])
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)
    if not safe or safe.startswith("."):
        safe = archive_name(version)
    return safe if version in safe else f"{version}-{safe}"


def directory_digest(archive: Path) -> dict[str, object] | None:
    """The sha256 of a zip's central directory, for the manifest: what a lock made from this
    SDK pins for installs of some of its components, which cannot take the archive's."""
    if archive_kind(archive) != "zip":
        return None
    return {"central_directory_sha256": file_directory_sha256(archive)}


def identify(root: Path, top: str | None, wanted: str | None, source: str) -> tuple[str | None, str | None]:
    """(version, build id) of an extracted SDK, as its libraries say (see qnnctl.sdk.identity).

    The libraries' build is the SDK's identity. What the archive's top folder or `sdk.yaml`
    claims must agree with it, unless the user named the libraries' version themselves; an
    SDK whose libraries carry no build id is taken at its word, as before.
    """
    claims = {"its top folder": top} if top else {}
    yaml_version = version_claims(root, manifest={}).get("sdk.yaml")
    if yaml_version:
        claims["its sdk.yaml"] = yaml_version
    build = read_build_id(root)
    if build is None:
        return next(iter(claims.values()), None), None
    true = version_of_build(build)
    wrong = sorted({version for version in claims.values() if version != true})
    if wrong and wanted != true:
        where = " and ".join(name for name, version in claims.items() if version != true)
        raise IntegrityError(
            f"{source} says it is SDK {', '.join(wrong)} ({where}), but its libraries are build "
            f"{build}: SDK {true}",
            hint=f"check where the archive came from; to install it as what its libraries are, "
            f"name that version: `qnnctl install {true} ...`; nothing was installed",
        )
    return true, build


def commit(
    root: Path,
    version: str,
    source: str,
    sha256: str | None,
    size: int,
    files: dict[str, str],
    unpacked: int,
    cache: Cache,
    force: bool,
    work: Path,
    build: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> Sdk:
    """`extra`: more for the manifest (what an install of some components records)."""
    missing = missing_layout(root)
    if missing:
        raise IntegrityError(
            f"the archive's SDK is incomplete: missing {', '.join(missing)}",
            hint="the archive may be truncated or not a QAIRT SDK for Linux; nothing was installed",
        )
    # The manifest is qnnctl's own record: a file of that name in the archive is not it.
    stray = root / MANIFEST_NAME
    if stray.is_file() and not stray.is_symlink():  # counted in what was unpacked
        unpacked -= stray.stat().st_size
    remove_tree(stray)
    files = {name: digest for name, digest in files.items() if name != MANIFEST_NAME}
    settle_modes(root)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "version": version,
        "build_id": build,
        "source": source,
        "sha256": sha256,
        "size": size,
        "unpacked_size": unpacked,
        "file_count": len(files),
        "files": files,
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "qnnctl_version": __version__,
        **(extra or {}),
    }
    # The manifest goes in last: a folder without one is never taken for an SDK.
    write_json_atomic(root / MANIFEST_NAME, manifest)
    destination = cache.sdk_dir(version)
    make_folders(cache.sdks)
    if destination.exists() or destination.is_symlink():
        if not force and (destination / MANIFEST_NAME).is_file() and not missing_layout(destination):
            return Sdk(destination, version, "qnnctl cache")
        # A folder without a manifest, components added, or --force: the new folder takes its
        # place in one step, so that no reader sees the SDK missing and no kill leaves none;
        # never while a running process uses it (qnnctl.sdk.holds).
        with exclusive(version, destination, "replaced", wait_for_holders.get()):
            exchange(root, destination)
    else:
        os.replace(root, destination)
    fsync_dir(cache.sdks)
    log.info("installed SDK %s into %s", version, destination)
    return Sdk(destination, version, "qnnctl cache")


def settle_modes(root: Path) -> None:
    """Give every folder and file of the tree about to be committed the mode qnnctl installs
    with (qnnctl.sdk.members.installed_mode): never group- or world-writable, whatever the
    archive, the umask or an SDK installed before asked for. Links are left as they are (their
    own mode means nothing) and never followed."""
    os.chmod(root, FOLDER_MODE)
    for folder, dirs, names in os.walk(root):
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, FOLDER_MODE)
        for name in names:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode) and stat.S_IMODE(mode) != installed_mode(mode):
                os.chmod(path, installed_mode(mode))


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def exchange(new: Path, old: Path) -> None:
    """Swap two folders in one step (Linux's renameat2 with RENAME_EXCHANGE): `old` then holds
    what `new` held, and `new` the old folder, to be removed with the work folder. Where the
    file system cannot (an old kernel, some network file systems), the old folder is moved
    aside first: two steps, with a moment in between when neither is there."""
    libc = _libc()
    rename = getattr(libc, "renameat2", None) if libc is not None else None
    if rename is not None:
        result = rename(_AT_FDCWD, os.fsencode(new), _AT_FDCWD, os.fsencode(old), _RENAME_EXCHANGE)
        if result == 0:
            return
        error = ctypes.get_errno()
        if error not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(error, os.strerror(error), str(old))
        log.debug("cannot exchange %s and %s in one step (%s)", new, old, os.strerror(error))
    aside = new.with_name(new.name + ".old")
    os.replace(old, aside)
    os.replace(new, old)
    os.replace(aside, new)


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no C library to ask
        return None
