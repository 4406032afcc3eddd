"""Which SDKs are on disk, in qnnctl's cache and in ExecuTorch's."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from qnnctl.cache import Cache, read_manifest, tree_size
from qnnctl.sdk import executorch_cache_dirs, missing_layout, read_build_id, read_sdk_version


def installed_sdks(cache: Cache, environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per SDK: version, the build id its libraries carry (None when they carry none),
    root, size in bytes, where it was found, and what is missing.

    `missing` is empty for a usable SDK; a damaged one in qnnctl's cache is still listed, so
    that it can be found and reinstalled (`qnnctl install --force VERSION`).
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
    return rows
