"""SDKs qnnctl uses where they are and never changes: read-only shared stores and links.

A store (`QNNCTL_STORES=/mnt/qairt:/opt/qcom/aistack/qairt`) is a folder of `<version>/` SDK
roots: an NFS export, a baked container image, the folder Qualcomm's own installer fills. It
may be mounted read-only, so nothing here writes, locks or stages anything in it. An SDK there
without a manifest is identified by the build id its libraries carry (qnnctl.identity).

A link is a record in qnnctl's own cache, `links/<version>.json`, naming an SDK folder that
someone else unpacked (`qnnctl link PATH`). The record is qnnctl's; the folder is not, and a
folder that has gone is reported, never followed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from qnnctl.cache import Cache, write_json_atomic
from qnnctl.errors import IntegrityError, NotInstalledError, UsageError
from qnnctl.paths import user_path
from qnnctl.versions import is_full_version

if TYPE_CHECKING:
    import logging


def _log() -> logging.Logger:
    # Imported on first use: `qnnctl env` runs in shell start-up files and logs nothing.
    import logging

    return logging.getLogger("qnnctl.stores")


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


class StoreSdk(NamedTuple):
    """An SDK root in a store, and the version its libraries (or labels) give it."""

    store: Path
    root: Path
    version: str


def _identify(root: Path) -> str | None:
    from qnnctl.sdk import missing_layout, read_sdk_version

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
    """Every SDK in every store, stores in QNNCTL_STORES's order, entries by name."""
    for store in store_dirs(environ):
        for entry in _entries(store):
            version = _identify(entry)
            if version is not None:
                yield StoreSdk(store, entry, version)


def find_in_stores(version: str, environ: Mapping[str, str]) -> StoreSdk | None:
    """The first store SDK that is `version`, as its libraries say.

    `<store>/<version>/` is looked at first, then the other entries (`latest/`): a folder is the
    version its libraries say, whatever its name, as `list` shows it.
    """
    for store in store_dirs(environ):
        direct = store / version
        # os.path.isdir: a store this user may not enter is no error, only no SDK.
        if os.path.isdir(direct):
            found = _identify(direct)
            if found == version:
                return StoreSdk(store, direct, version)
            if found is not None:
                _log().debug("%s is SDK %s by its libraries, not %s; skipped", direct, found, version)
        for entry in _entries(store):
            if entry.name != version and _identify(entry) == version:
                return StoreSdk(store, entry, version)
    return None


def in_a_store(path: Path, environ: Mapping[str, str]) -> Path | None:
    """The store `path` lies in, if any (resolved, so a symlink into a store counts)."""
    real = Path(os.path.realpath(path))
    for store in store_dirs(environ):
        if real.is_relative_to(os.path.realpath(store)):
            return store
    return None


# -- links -------------------------------------------------------------------------------


def links_dir(cache: Cache) -> Path:
    return cache.root / "links"


def link_path(cache: Cache, version: str) -> Path:
    return links_dir(cache) / f"{version}.json"


class Link(NamedTuple):
    """A recorded SDK folder: what `qnnctl link` wrote into links/<version>.json."""

    version: str
    root: Path
    build_id: str | None
    record: Path
    linked_at: str | None

    @property
    def dangling(self) -> bool:
        """The folder has gone (or no longer has the SDK's layout): reported, never followed."""
        from qnnctl.sdk import missing_layout

        return bool(missing_layout(self.root))


def read_link(cache: Cache, version: str) -> Link | None:
    return _read_record(link_path(cache, version))


def _read_record(record: Path) -> Link | None:
    import json

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
    from qnnctl.versions import parse_version

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
    from qnnctl.identity import version_of_build
    from qnnctl.sdk import missing_layout, not_an_sdk_root, read_build_id, version_claims
    from qnnctl.versions import resolve_version

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
    import time

    from qnnctl import __version__

    previous = read_link(cache, chosen)
    record = link_path(cache, chosen)
    record.parent.mkdir(parents=True, exist_ok=True)
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
