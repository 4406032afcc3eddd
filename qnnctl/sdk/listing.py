"""Which SDKs are on disk: in qnnctl's cache, linked, in the stores, in ExecuTorch's cache."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qnnctl.errors import QnnctlError
from qnnctl.paths import tree_size
from qnnctl.sdk.cache import Cache, read_manifest, unpacked_size
from qnnctl.sdk.components import installed_components
from qnnctl.sdk.holds import held_by
from qnnctl.sdk.layout import missing_layout, read_build_id, read_sdk_version
from qnnctl.sdk.select import executorch_cache_dirs, find_installed, select_sdk
from qnnctl.sdk.stores import LINK_ORIGIN, all_links, store_origin, store_sdks
from qnnctl.words import columns, size_text


def installed_sdks(cache: Cache, environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per SDK: version, the build id its libraries carry (None when they carry none),
    root, size in bytes, where it was found, and what is missing.

    In the order `find_installed` looks: qnnctl's cache, links, stores (QNNCTL_STORES's order),
    ExecuTorch's cache. `missing` is empty for a usable SDK; a damaged one in qnnctl's cache is
    still listed, so that it can be found and reinstalled (`qnnctl install --force VERSION`), and
    so is a link whose folder has gone (`missing` is then ["the folder itself"], `size` None).
    `held_by` lists the processes using an SDK of qnnctl's cache (qnnctl.sdk.holds), each as
    {"pid", "command"}; it is empty for the others, which qnnctl never removes.
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
            "held_by": [holder._asdict() for holder in held_by(cache, version)],
        })
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
        row.setdefault("held_by", [])
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


def render_table(rows: list[dict[str, Any]], selected: Path | None) -> tuple[list[str], bool]:
    """`qnnctl list`'s lines: a header and aligned columns, `*` on the row of the `selected`
    root (its first, in the order commands look), a note on a second copy of a version that is
    not used while the first is there; and whether a row was marked."""
    chosen = os.path.realpath(selected) if selected is not None else None
    table = [[" ", "version", "build", "size", "where", "root", "notes"]]
    marked = False
    first: dict[str, str] = {}  # where each version is found first
    for row in rows:
        notes = [f"damaged: missing {', '.join(row['missing'])}"] if row["missing"] else []
        if row["missing"] and row["origin"] == LINK_ORIGIN:
            notes = [f"its folder is gone or no SDK root: not used; `qnnctl uninstall {row['version']}` drops "
                     "the link"]
        if row["components"] != ["all"]:
            notes.append(f"components {','.join(row['components'])}")
        users = ", ".join(f"PID {h['pid']} ({h['command']})" if h["command"] else f"PID {h['pid']}"
                          for h in row.get("held_by", ()))
        if users:
            notes.append(f"in use by {users}")
        if row["version"] in first and not row["missing"]:
            notes.append(f"not used: the {first[row['version']]} copy comes first")
        elif not row["missing"]:
            first[row["version"]] = row["origin"]
        mark = not marked and chosen is not None and os.path.realpath(row["root"]) == chosen
        marked = marked or mark
        table.append(["*" if mark else " ", row["version"], row["build_id"] or "unknown",
                      size_text(row["size"]) if row["size"] is not None else "?", row["origin"], row["root"],
                      "; ".join(notes)])
    if not any(line[-1] for line in table[1:]):
        table = [line[:-1] for line in table]  # no notes: no empty column
    return columns(table), marked


def _add_components(row: dict[str, Any]) -> None:
    """The components the SDK holds (["all"] unless it was installed with some), and whether
    it was fetched in parts (no sha256 of the whole archive vouches for it)."""
    manifest = read_manifest(Path(row["root"])) or {}
    row["components"] = list(installed_components(manifest))
    row["partial"] = manifest.get("partial") is True

