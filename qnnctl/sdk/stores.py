"""SDKs qnnctl uses where they are and never changes: read-only shared stores and links.

A store (`QNNCTL_STORES=/mnt/qairt:/opt/qcom/aistack/qairt`) is a folder of `<version>/` SDK
roots: an NFS export, a baked container image, the folder Qualcomm's own installer fills. It
may be mounted read-only, so nothing here writes, locks or stages anything in it. An SDK there
without a manifest is identified by the build id its libraries carry (qnnctl.sdk.identity). Its
libraries and tools run as the user, so a store or an SDK in it that another user could change
is not used (`unsafe_path`, as ssh checks `authorized_keys`).

A link is a record in qnnctl's own cache, `links/<version>.json`, naming an SDK folder that
someone else unpacked (`qnnctl link PATH`). The record is qnnctl's; the folder is not, and a
folder that has gone is reported, never followed.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from qnnctl.errors import IntegrityError, NotInstalledError, UsageError
from qnnctl.paths import make_folders, user_path, write_json_atomic
from qnnctl.records import TYPE_CHECKING, Record
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.hosts import this_host
from qnnctl.sdk.identity import version_of_build
from qnnctl.sdk.layout import (
    missing_layout,
    not_an_sdk_root,
    read_build_id,
    read_sdk_version,
    version_claims,
)
from qnnctl.sdk.versions import is_full_version, parse_version, resolve_version
from qnnctl.version import __version__

if TYPE_CHECKING:
    import logging
    from typing import Any


def _log() -> logging.Logger:
    import logging  # lazy: only when there is something to say; `qnnctl env` imports this module

    return logging.getLogger("qnnctl.sdk.stores")


STORES_VARIABLE = "QNNCTL_STORES"
LINK_ORIGIN = "link"
LINK_SCHEMA = 1


def store_origin(store: Path) -> str:
    """Sdk.origin of an SDK found in `store`: `store /mnt/qairt`."""
    return f"store {store}"


def store_dirs(environ: Mapping[str, str]) -> list[Path]:
    """The folders QNNCTL_STORES names, in its order, each once; empty entries are skipped."""
    value = environ.get(STORES_VARIABLE) or ""
    found: list[Path] = []
    for entry in value.split(os.pathsep):
        if entry.strip():
            path = user_path(entry).absolute()
            if path not in found:
                found.append(path)
    return found


class StoreSdk(Record):
    """An SDK root in a store, and the version its libraries (or labels) give it."""

    store: Path
    root: Path
    version: str


def _identify(root: Path) -> str | None:
    if missing_layout(root):
        return None
    version = read_sdk_version(root)
    return version if version is not None and is_full_version(version) else None


def _entries(store: Path) -> list[Path]:
    try:
        return sorted(entry for entry in store.iterdir() if os.path.isdir(entry))
    except OSError:  # gone, not a folder, or not readable: doctor's `stores` check says which
        return []


def store_sdks(environ: Mapping[str, str]) -> Iterator[StoreSdk]:
    """Every SDK in every store, stores in QNNCTL_STORES's order, entries by name; a store or
    an SDK that another user could change is skipped, with a warning (see `unsafe_path`)."""
    for store in usable_stores(environ):
        for entry in _entries(store):
            version = _identify(entry)
            if version is not None and _safe_sdk(store, entry):
                yield StoreSdk(store, entry, version)


def find_in_stores(version: str, environ: Mapping[str, str]) -> StoreSdk | None:
    """The first store SDK that is `version`, as its libraries say.

    `<store>/<version>/` is looked at first, then the other entries (`latest/`): a folder is the
    version its libraries say, whatever its name, as `list` shows it. A store or an SDK that
    another user could change is skipped, with a warning.
    """
    for store in usable_stores(environ):
        direct = store / version
        # os.path.isdir: a store this user may not enter is no error, only no SDK.
        if os.path.isdir(direct):
            found = _identify(direct)
            if found == version and _safe_sdk(store, direct):
                return StoreSdk(store, direct, version)
            if found is not None and found != version:
                _log().debug("%s is SDK %s by its libraries, not %s; skipped", direct, found, version)
        for entry in _entries(store):
            if entry.name != version and _identify(entry) == version and _safe_sdk(store, entry):
                return StoreSdk(store, entry, version)
    return None


# -- who could change a store ------------------------------------------------------------------

# As the kernel's MAXSYMLINKS: more links than this on one path is a loop.
_MAX_LINKS = 40


class Unsafe(Record):
    """Why another user could change what a path names: the folder (or link) at fault, what is
    wrong with it, and the command that fixes it."""

    folder: Path
    why: str
    fix: str

    def refusal(self, refused: str, harm: str, then: str = "") -> IntegrityError:
        """IntegrityError (exit 4): what is `refused` ("... is not used"), since another user could
        change it and so `harm` ("put code there that runs as you"); the hint is the fix, then `then`."""
        return IntegrityError(f"{refused}: {self.folder} {self.why}, so another user could {harm}",
                              hint=f"fix it with {self.fix}{then}")


def first_unsafe(paths: Iterable[Path]) -> Unsafe | None:
    """Why another user could change the first of `paths` that one could (unsafe_path); None
    when none."""
    return next((problem for problem in map(unsafe_path, paths) if problem is not None), None)


def unsafe_path(path: Path, uid: int | None = None) -> Unsafe | None:
    """Why a user other than `uid` (default: this process's) and root could change what `path`
    names, or None when none could: as ssh checks `authorized_keys`.

    Every folder from `/` down, each symbolic link followed where it leads, must belong to root
    or the user and be writable by neither group nor others. A folder above `path` may be
    sticky instead (`/tmp`, root's, mode 1777): others can add entries there but neither rename
    nor remove the user's. On a read-only mount the owner is not asked (the uids of an NFS server
    or of an image's builder mean nothing here), but the mode is: the same bytes may be written
    where the mount comes from. A path that is not there is None: nothing can be used from it.
    """
    uid = os.geteuid() if uid is None else uid
    # Not normalised: `..` after a link is the parent of where the link leads, as the kernel has it.
    pending = list(reversed((Path.cwd() / path).parts[1:]))
    here = Path("/")
    try:
        problem = _unsafe_folder(here, os.lstat(here), uid, last=not pending)
        links = 0
        while problem is None and pending:
            name = pending.pop()
            if name == "..":
                here = here.parent  # `here` is resolved: `..` is its real parent, as the kernel takes it
                continue
            candidate = here / name
            st = os.lstat(candidate)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > _MAX_LINKS:
                    return Unsafe(candidate, "leads through more than 40 symbolic links", "point it at a folder")
                if st.st_uid not in (0, uid) and not _read_only(here):
                    # A link in a sticky folder (`/tmp/store`) can be pointed elsewhere by its owner.
                    return Unsafe(candidate, f"is a symbolic link that belongs to {_owner(st.st_uid)}",
                                  "replace it with a link of your own: "
                                  f"`ln -sfn {_quoted(Path(os.readlink(candidate)))} {_quoted(candidate)}`")
                target = Path(os.readlink(candidate))
                if target.is_absolute():
                    here = Path("/")
                pending.extend(reversed([part for part in target.parts if part not in ("/", ".")]))
                continue
            here = candidate
            problem = _unsafe_folder(here, st, uid, last=not pending)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None  # nothing can be used from there
    except OSError as exc:
        return Unsafe(here, f"cannot be checked ({exc.strerror})", "check its permissions")
    return problem


def _unsafe_folder(path: Path, st: os.stat_result, uid: int, last: bool) -> Unsafe | None:
    trusted = st.st_uid in (0, uid)
    others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if trusted and not others:
        return None  # the common case, without asking the file system about its mount
    if not trusted and not _read_only(path):
        return Unsafe(path, f"belongs to {_owner(st.st_uid)}",
                      f"make it root's (or yours): `sudo chown root {_quoted(path)}`")
    if others and (last or not (st.st_mode & stat.S_ISVTX and trusted)):
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others")) if others & bit)
        return Unsafe(path, f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})",
                      f"`chmod go-w {_quoted(path)}`")
    return None


def unsafe_entry(path: Path, st: os.stat_result) -> Unsafe | None:
    """Why another user than this process's and root could change the file or folder `path`
    itself (`st`, its lstat), or None: the rule every folder of a store is held to."""
    return _unsafe_folder(path, st, os.geteuid(), last=True)


def _quoted(path: Path) -> str:
    return shlex.quote(str(path))


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _owner(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def store_problem(store: Path) -> Unsafe | None:
    """Why `store` is not used: another user could change it (or a folder above it)."""
    return unsafe_path(store)


def sdk_problem(root: Path) -> Unsafe | None:
    """Why an SDK folder is not used: another user could change it, the folders that go on
    LD_LIBRARY_PATH and PATH, or what is in them (a link there is followed to where it leads)."""
    problem = unsafe_path(root)
    host = this_host()
    for folder in (root / host.lib_dir, root / host.bin_dir):
        problem = problem or unsafe_path(folder) or _unsafe_entries(folder)
    return problem


def folder_problem(folder: Path) -> Unsafe | None:
    """Why another user could change what the folder `folder` holds: it, a folder down to it, or
    a file in it (a link there is followed to where it leads); None when none could."""
    return unsafe_path(folder) or _unsafe_entries(folder)


def _unsafe_entries(folder: Path) -> Unsafe | None:
    """The first file in `folder` (checked already) that another user could change."""
    uid = os.geteuid()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None  # not there, or not readable: nothing is loaded from it
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            if entry.is_symlink():
                problem = unsafe_path(Path(entry.path), uid)
            else:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid in (0, uid) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    continue
                problem = _unsafe_folder(Path(entry.path), st, uid, last=True)
        except OSError:
            continue  # gone meanwhile
        if problem is not None:
            return problem
    return None


def refuse_unsafe_cache(cache: Cache) -> None:
    """IntegrityError (exit 4) before anything is installed into a cache that another user
    could change: what qnnctl installs there, and the manifests it writes as evidence, would be
    theirs to change."""
    problem = cache_problem(cache)
    if problem is not None:
        raise problem.refusal(f"qnnctl's cache {cache.root} is not used",
                              "change the SDKs installed there and the records that vouch for them; nothing was "
                              "installed", ", or point QNNCTL_CACHE_DIR at a folder of your own")


def cache_problem(cache: Cache) -> Unsafe | None:
    """Why another user could change what qnnctl keeps in `cache`: the folders down to it, or a
    folder of its own (downloads, work, records, locks: any one of them open to others is a way
    to put bytes or evidence where qnnctl takes them as its own)."""
    problem = unsafe_path(cache.root)
    if problem is not None:
        return problem
    try:
        folders = sorted((entry for entry in os.scandir(cache.root) if entry.is_dir(follow_symlinks=False)),
                         key=lambda entry: entry.name)
    except OSError:
        return None  # not there yet: made with exact modes when it is
    for entry in folders:
        st = entry.stat(follow_symlinks=False)
        problem = _unsafe_folder(Path(entry.path), st, os.geteuid(), last=True)
        if problem is not None:
            return Unsafe(problem.folder, problem.why, f"`chmod -R go-w {_quoted(cache.root)}`")
    return None


def refuse_unsafe(root: Path, what: str) -> None:
    """IntegrityError (exit 4) when another user could change the SDK folder `root` (`what`
    names it: "SDK 2.37.0.250724 of qnnctl's cache at ..."), as a store's SDK is refused: its
    libraries and tools would run as this user. Refused rather than used with a warning: a
    warning scrolls by in a CI log while the code it warns of runs."""
    problem = sdk_problem(root)
    if problem is not None:
        raise problem.refusal(f"{what} is not used", "put code there that runs as you",
                              "; a cache shared by several users is made read-only for them (writable by its owner "
                              "alone), as a store is")


_warned: set[tuple[Path, Path]] = set()


def _refuse(what: str, where: Path, problem: Unsafe) -> None:
    """Say once per process why `what` is not used."""
    if (where, problem.folder) in _warned:
        return
    _warned.add((where, problem.folder))
    _log().warning("%s is not used: %s %s, so another user could put code there that runs as you; fix it "
                   "with %s, or take the store out of %s", what, problem.folder, problem.why, problem.fix,
                   STORES_VARIABLE)


def usable_stores(environ: Mapping[str, str]) -> list[Path]:
    """The stores of QNNCTL_STORES that no other user could change."""
    usable = []
    for store in store_dirs(environ):
        problem = store_problem(store)
        if problem is None:
            usable.append(store)
        else:
            _refuse(f"the store {store}", store, problem)
    return usable


def unsafe_store_sdks(environ: Mapping[str, str]) -> list[tuple[Path, Unsafe]]:
    """The SDK folders of the usable stores that are not used, and why."""
    return [(entry, problem) for store in store_dirs(environ) if store_problem(store) is None
            for entry in _entries(store)
            if _identify(entry) is not None and (problem := sdk_problem(entry)) is not None]


def _safe_sdk(store: Path, root: Path) -> bool:
    problem = sdk_problem(root)
    if problem is not None:
        _refuse(f"SDK folder {root} of the store {store}", root, problem)
    return problem is None


# -- links -------------------------------------------------------------------------------


def links_dir(cache: Cache) -> Path:
    return cache.root / "links"


def link_path(cache: Cache, version: str) -> Path:
    return links_dir(cache) / f"{version}.json"


class Link(Record):
    """A recorded SDK folder: what `qnnctl link` wrote into links/<version>.json."""

    version: str
    root: Path
    build_id: str | None
    record: Path
    linked_at: str | None

    @property
    def dangling(self) -> bool:
        """The folder has gone (or no longer has the SDK's layout): reported, never followed."""
        return bool(missing_layout(self.root))


def read_link(cache: Cache, version: str) -> Link | None:
    return _read_record(link_path(cache, version))


def _read_record(record: Path) -> Link | None:
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    version, root = data.get("version"), data.get("root")
    if not isinstance(version, str) or not is_full_version(version) or not isinstance(root, str):
        return None
    if record.name != f"{version}.json":
        # Renamed by hand: looked up by its name, it would answer for another version; listed by
        # what it holds, it would name a version that no look-up finds.
        return None
    build = data.get("build_id")
    linked_at = data.get("linked_at")
    return Link(version, Path(root), build if isinstance(build, str) else None, record,
                linked_at if isinstance(linked_at, str) else None)


def all_links(cache: Cache) -> list[Link]:
    """Every readable link record, by version."""
    folder = links_dir(cache)
    if not folder.is_dir():
        return []
    links = [link for record in folder.glob("*.json") if (link := _read_record(record)) is not None]
    return sorted(links, key=lambda link: parse_version(link.version))


def find_linked(version: str, cache: Cache) -> Link | None:
    """The link for `version` when its folder is there; a dangling one is not followed."""
    link = read_link(cache, version)
    if link is None:
        return None
    return None if link.dangling else link


def dangling_link_error(version: str, cache: Cache) -> NotInstalledError | None:
    """The error for `version` when it is linked to a folder that has gone; None otherwise."""
    link = read_link(cache, version)
    if link is None or not link.dangling:
        return None
    error = NotInstalledError(version)
    error.message = f"SDK {version} is linked to {link.root}, which is gone (or is no SDK root any more)"
    error.args = (error.message,)
    error.hint = (f"link its new place with `qnnctl link PATH`, drop the link with `qnnctl uninstall {version}`, "
                  f"or install a copy: `qnnctl install {version}`")
    return error


def link_sdk(path: Path, version: str | None, cache: Cache, environ: Mapping[str, str]) -> tuple[Link, Link | None]:
    """Record the SDK folder `path` as `version` (by default, what its libraries say it is).

    Returns the new link and the one it replaced, if any. The folder is only read.
    """
    root = user_path(path).absolute()
    missing = missing_layout(root)
    if missing:
        raise not_an_sdk_root(root, missing, "the folder")
    if os.path.realpath(root).startswith(os.path.realpath(cache.sdks) + os.sep):
        raise UsageError(f"{root} is in qnnctl's cache already; there is nothing to link",
                         hint="`qnnctl list` shows what is installed")
    wanted = resolve_version(version) if version is not None else None
    build = read_build_id(root)
    claims = version_claims(root)
    true = version_of_build(build) if build is not None else None
    chosen: str | None
    if true is not None:
        wrong = {name: claimed for name, claimed in claims.items() if claimed != true}
        if wanted is not None and wanted != true:
            raise IntegrityError(
                f"{root} holds SDK {true} (its libraries are build {build}), not {wanted}",
                hint=f"link it as what it is: `qnnctl link {root} --version {true}`, or without --version",
            )
        if wrong and wanted is None:
            said = " and ".join(f"{name} says {claimed}" for name, claimed in wrong.items())
            raise IntegrityError(
                f"{root}: its libraries are build {build} (SDK {true}), but {said}",
                hint=f"to link it as what its libraries are: `qnnctl link {root} --version {true}`",
            )
        chosen = true
    else:
        chosen = wanted or next(iter(claims.values()), None)
    if chosen is None:
        raise UsageError(
            f"cannot tell the SDK version of {root}: its libraries carry no build id, and neither "
            "sdk.yaml nor the folder's name names one",
            hint=f"give it: `qnnctl link {root} --version VERSION`",
        )
    previous = read_link(cache, chosen)
    record = link_path(cache, chosen)
    make_folders(record.parent)
    linked_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data: dict[str, Any] = {"schema": LINK_SCHEMA, "version": chosen, "root": str(root), "build_id": build,
                            "linked_at": linked_at, "qnnctl_version": __version__}
    write_json_atomic(record, data)
    if (cache.sdk_dir(chosen) / ".qnnctl.json").is_file():
        _log().warning("SDK %s is also in qnnctl's cache (%s), which comes first; the link is used once "
                       "that copy is uninstalled", chosen, cache.sdk_dir(chosen))
    return Link(chosen, root, build, record, linked_at), previous


def remove_link(cache: Cache, version: str) -> Link | None:
    """Forget the link for `version` (its folder is left as it is); the link removed, if any."""
    link = read_link(cache, version)
    record = link_path(cache, version)
    if link is None and not record.exists():
        return None
    record.unlink(missing_ok=True)
    return link
