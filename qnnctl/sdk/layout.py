"""What an SDK on disk is: its root, its host folders and libraries, the version it claims."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from qnnctl.errors import InvalidSdkError, UsageError
from qnnctl.paths import user_path
from qnnctl.records import Record
from qnnctl.sdk.cache import read_manifest
from qnnctl.sdk.hosts import HOSTS, HostPlatform, this_host
from qnnctl.sdk.identity import sdk_build_id, version_of_build
from qnnctl.sdk.versions import is_full_version, version_in

# The x86_64 host's folders, as SDKs built for tests lay them out; what a command uses is the
# folder of the host it runs on: `Sdk.lib_dir`, `this_host().lib_dir` (qnnctl.sdk.hosts).
HOST_LIB_DIR = HOSTS[0].lib_dir
HOST_BIN_DIR = HOSTS[0].bin_dir
REQUIRED_LIBS = ("libQnnHtp.so", "libQnnSystem.so")


class Sdk(Record):
    """A usable SDK: its root folder, its version and where it was found."""

    root: Path
    version: str
    origin: str

    @property
    def lib_dir(self) -> Path:
        """The folder of this host's libraries (qnnctl.sdk.hosts)."""
        return self.root / this_host().lib_dir

    @property
    def bin_dir(self) -> Path:
        return self.root / this_host().bin_dir


def missing_layout(root: Path, host: HostPlatform | None = None) -> list[str]:
    """The parts of the SDK layout that `root` lacks for `host` (this machine by default):
    empty when it is a usable SDK here."""
    if not root.is_dir():
        return ["the folder itself"]
    lib_dir = (host or this_host()).lib_dir
    return [f"{lib_dir}/{name}" for name in REQUIRED_LIBS if not (root / lib_dir / name).is_file()]


def hosts_of(root: Path) -> list[HostPlatform]:
    """The hosts `root` has the libraries of (qnnctl.sdk.hosts.HOSTS order)."""
    return [host for host in HOSTS if not missing_layout(root, host)]


SDK_YAML_MOST = 64 << 10  # bytes of sdk.yaml read: the version is on its first lines
_YAML_VERSION = re.compile(r"""^\s*version\s*:\s*["']?([0-9][0-9.]*[0-9])["']?\s*$""", re.M)


def read_sdk_version(root: Path) -> str | None:
    """The version the SDK is: its libraries' build when they carry one (see qnnctl.sdk.identity),
    else what `sdk.yaml`, the folder's name or the manifest says."""
    build = read_build_id(root)
    if build is not None:
        return version_of_build(build)
    claims = version_claims(root)
    return next(iter(claims.values()), None)


def read_build_id(root: Path) -> str | None:
    """The build id (`2.51.0.260929181845`) the SDK's host libraries carry, if any."""
    found = sdk_build_id(root / this_host().lib_dir)
    return found[0] if found else None


def version_claims(root: Path, manifest: Mapping[str, object] | None = None) -> dict[str, str]:
    """What names the SDK's version besides its libraries, in the order trusted:
    `sdk.yaml`, the folder's name, the manifest, the archive's name (from the manifest)."""
    claims: dict[str, str] = {}
    try:
        # Its first lines say the version; the rest is not read (an archive's may be gigabytes).
        with open(root / "sdk.yaml", "rb") as handle:
            text = handle.read(SDK_YAML_MOST).decode("utf-8", errors="replace")
    except OSError:
        text = ""
    match = _YAML_VERSION.search(text)
    if match and is_full_version(match.group(1)):
        claims["sdk.yaml"] = match.group(1)
    from_name = version_in(root.name)
    if from_name:
        claims["the folder name"] = from_name
    manifest = read_manifest(root) if manifest is None else manifest
    if manifest:
        recorded = manifest.get("version")
        if isinstance(recorded, str) and is_full_version(recorded):
            claims["the manifest"] = recorded
        source = manifest.get("source")
        if isinstance(source, str):
            named = version_in(unquote(urlparse(source).path).rsplit("/", 1)[-1])
            if named:
                claims["the archive's name"] = named
    return claims


def sdk_from_root(root: Path, origin: str) -> Sdk:
    """An SDK named by path: its layout checked, its version read from disk."""
    if str(root).strip() == "":
        raise UsageError(f"{origin} is empty; an SDK root must be a folder")
    root = user_path(root).absolute()
    missing = missing_layout(root)
    if missing:
        raise not_an_sdk_root(root, missing, origin)
    return Sdk(root=root, version=read_sdk_version(root) or "unknown", origin=origin)


# How deep below a folder named as an SDK root to look for one (`qairt/`, `qairt/2.37.0.250724/`).
_ROOTS_BELOW_DEPTH = 3


def sdk_roots_below(folder: Path, depth: int = _ROOTS_BELOW_DEPTH, limit: int = 3, budget: int = 2000) -> list[Path]:
    """Up to `limit` SDK roots in the folders below `folder`, nearest first (sorted by name at
    each level), looking into `budget` folders at most (a home folder named by mistake is
    not walked whole); links to folders are not followed."""
    found: list[Path] = []
    level = [folder]
    for _ in range(depth):
        below: list[Path] = []
        for parent in level:
            budget -= 1
            if budget < 0:
                return found
            try:
                children = sorted(p for p in parent.iterdir() if p.is_dir() and not p.is_symlink())
            except OSError:
                continue
            for child in children:
                try:
                    missing = missing_layout(child)
                except OSError:
                    continue  # a folder this user may not enter: no root, and no way to one
                if not missing:
                    found.append(child)
                    if len(found) == limit:
                        return found
                else:
                    below.append(child)
        level = below
    return found


def not_an_sdk_root(root: Path, missing: list[str], origin: str) -> InvalidSdkError:
    """The error for a path named as an SDK root (by `origin`: "--sdk", "QNN_SDK_ROOT", "the
    folder" of `qnnctl link`) that is none: whether it is there, and an SDK root below it."""
    use = {"QNN_SDK_ROOT": "`export QNN_SDK_ROOT={}`", "--sdk": "`--sdk {}`", "the folder": "`qnnctl link {}`"}
    if not root.exists():
        return InvalidSdkError(str(root), missing, origin, problem="does not exist",
                               hint="give the path of an SDK root: the folder that holds QNN_README.txt, lib/ "
                               "and bin/ (qairt/<version>/ where Qualcomm's archive was unpacked)")
    if not root.is_dir():
        return InvalidSdkError(str(root), missing, origin, problem="is a file, not a folder")
    elsewhere = hosts_of(root)
    if elsewhere:
        return InvalidSdkError(str(root), missing, origin, problem=no_libraries_for_this_host(elsewhere),
                               hint=f"use an SDK with {this_host().lib_dir}/, or run on one of the hosts it has "
                               "libraries for")
    below = sdk_roots_below(root)
    if below:
        named = " or ".join(use.get(origin, "{}").format(shlex.quote(str(p))) for p in below)
        some = "an SDK root is" if len(below) == 1 else "SDK roots are"
        return InvalidSdkError(str(root), missing, origin, hint=f"{some} below it: {named}")
    if origin != "QNN_SDK_ROOT":
        return InvalidSdkError(str(root), missing, origin,
                               hint="an SDK root is the folder that holds QNN_README.txt, lib/ and bin/ "
                               "(qairt/<version>/ where Qualcomm's archive was unpacked); an archive is "
                               "installed with `qnnctl install --file ARCHIVE`")
    return InvalidSdkError(str(root), missing, origin)


def no_libraries_for_this_host(hosts: list[HostPlatform]) -> str:
    """What is wrong with an SDK that has host libraries for `hosts` and not for this one."""
    here = this_host()
    names = " and ".join(f"{host.name} ({host.lib_dir}/)" for host in hosts)
    return f"has host libraries for {names} only, none for this {here.name} host ({here.lib_dir}/)"
