"""Which SDKs are on disk: in qnnctl's cache, linked, in the stores, in ExecuTorch's cache."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qnnctl.cache import Cache, read_manifest, tree_size, unpacked_size
from qnnctl.errors import QnnctlError
from qnnctl.sdk import (
    executorch_cache_dirs,
    find_installed,
    missing_layout,
    read_build_id,
    read_sdk_version,
    select_sdk,
)


def installed_sdks(cache: Cache, environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per SDK: version, the build id its libraries carry (None when they carry none),
    root, size in bytes, where it was found, and what is missing.

    In the order `find_installed` looks: qnnctl's cache, links, stores (QNNCTL_STORES's order),
    ExecuTorch's cache. `missing` is empty for a usable SDK; a damaged one in qnnctl's cache is
    still listed, so that it can be found and reinstalled (`qnnctl install --force VERSION`), and
    so is a link whose folder has gone (`missing` is then ["the folder itself"], `size` None).
    """
    rows: list[dict[str, Any]] = []
    for version in cache.installed_versions():
        root = cache.sdk_dir(version)
        manifest = read_manifest(root) or {}
        size = manifest.get("unpacked_size")
        recorded = manifest.get("build_id")
        rows.append({
            "version": version,
            "build_id": read_build_id(root) or (recorded if isinstance(recorded, str) else None),
            "root": str(root),
            "size": size if isinstance(size, int) else tree_size(root),
            "origin": "qnnctl cache",
            "missing": missing_layout(root),
        })
    from qnnctl.stores import LINK_ORIGIN, all_links, store_origin, store_sdks

    for link in all_links(cache):
        missing = missing_layout(link.root)
        rows.append({
            "version": link.version,
            "build_id": link.build_id if missing else read_build_id(link.root),
            "root": str(link.root),
            "size": None if missing else unpacked_size(link.root),
            "origin": LINK_ORIGIN,
            "missing": missing,
        })
    for stored in store_sdks(environ):
        rows.append({
            "version": stored.version,
            "build_id": read_build_id(stored.root),
            "root": str(stored.root),
            "size": unpacked_size(stored.root),
            "origin": store_origin(stored.store),
            "missing": [],
        })
    seen: set[str] = set()
    # In the order ExecuTorch looks ($QNN_STAGING_DIR first), so --json output is stable.
    for folder in dict.fromkeys(p.parent for p in executorch_cache_dirs("x", environ)):
        if not folder.is_dir():
            continue
        for entry in sorted(folder.glob("sdk-*")):
            real = os.path.realpath(entry)
            if real in seen or missing_layout(entry):
                continue
            seen.add(real)
            rows.append({
                "version": read_sdk_version(entry) or entry.name.removeprefix("sdk-"),
                "build_id": read_build_id(entry),
                "root": str(entry),
                "missing": [],
                "size": tree_size(entry),
                "origin": "ExecuTorch cache",
            })
    for row in rows:
        _add_components(row)
    return rows


def selected_here(cache: Cache, environ: Mapping[str, str], cwd: Path) -> tuple[Path, str] | None:
    """The root of the SDK that a command run here without a VERSION would use, and why
    (Selection.describe); None when that SDK is not on disk or the choice fails."""
    try:
        selection = select_sdk(None, environ, cwd, cache)
        root = selection.root
        if root is None and selection.version is not None:
            found = find_installed(selection.version, cache, environ)
            root = found.root if found is not None else None
    except QnnctlError:
        return None
    return (root, selection.describe()) if root is not None else None


def _add_components(row: dict[str, Any]) -> None:
    """The components the SDK holds (["all"] unless it was installed with some), and whether
    it was fetched in parts (no sha256 of the whole archive vouches for it)."""
    from qnnctl.components import installed_components

    manifest = read_manifest(Path(row["root"])) or {}
    row["components"] = list(installed_components(manifest))
    row["partial"] = manifest.get("partial") is True

