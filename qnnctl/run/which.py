"""`qnnctl which NAME`: the file a process set up for the selected SDK would use.

"Which libQnnHtp.so is actually loaded?" A library is resolved as the dynamic loader resolves
a bare name for a library of the SDK (LD_LIBRARY_PATH, the loader's cache, the default
folders), a tool as the shell finds a command on PATH, both in the environment a process
started by `qnnctl lower` (or after `eval "$(qnnctl env)"`) gets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qnnctl.errors import UsageError
from qnnctl.host.elf import ElfInfo, Resolver
from qnnctl.host.machine import read_ld_cache
from qnnctl.host.staged import LOADER_GUARD, sdk_identity
from qnnctl.records import Record
from qnnctl.run.environment import resolve_sdk
from qnnctl.run.envplan import environment_for, runtime_lib_dirs
from qnnctl.run.lower import staged_loader
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.select import BY_ENV, Selection
from qnnctl.shell.exports import apply, split_path

LIBRARY = "library"
TOOL = "tool"


class Candidate(Record):
    """A folder searched, where it came from, and whether it holds NAME."""

    folder: str
    origin: str
    holds: bool


class Answer(Record):
    name: str
    kind: str  # LIBRARY or TOOL
    path: str | None  # None: nothing provides it
    selection: Selection
    sdk: Sdk | None
    candidates: tuple[Candidate, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "path": self.path,
            "sdk": None if self.sdk is None else {"root": str(self.sdk.root), "version": self.sdk.version},
            "selection": {"reason": self.selection.reason, "detail": self.selection.detail},
            "candidates": [c._asdict() for c in self.candidates],
        }


def _is_library(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def which(name: str, spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache) -> Answer:
    """Where NAME would come from for the SDK `spec` selects (never installing one)."""
    if not name or "/" in name or "\x00" in name or name in (".", "..") or len(os.fsencode(name)) > 255:
        raise UsageError(f"{name!r} is not a bare library or tool name",
                         hint="give a name such as libQnnHtp.so, libc++.so.1 or qnn-net-run")
    selection, sdk = resolve_sdk(spec, environ, cwd, cache, allow_install=False)
    child = dict(environ)
    origins: dict[str, str] = {}
    if sdk is not None:
        child = apply(environ, environment_for(sdk, environ, cache, owns_root=selection.reason != BY_ENV))
        origins[str(sdk.lib_dir)] = f"the SDK's host libraries ({sdk.version})"
        origins[str(sdk.bin_dir)] = f"the SDK's tools ({sdk.version})"
        for folder in runtime_lib_dirs(cache, sdk):
            origins[folder] = "qnnctl's staged runtime"
    if _is_library(name):
        if sdk is not None:
            loader = staged_loader(sdk, cache)
            if loader is not None and not environ.get(LOADER_GUARD):
                # `qnnctl lower` starts the pipeline as `ld.so --library-path DIRS` (see
                # lower.under_loader): the staged glibc, the trio and the SDK, then LD_LIBRARY_PATH.
                search = list(loader.library_path)
                search += [d for d in split_path(child.get("LD_LIBRARY_PATH")) if d and d not in search]
                child = {**child, "LD_LIBRARY_PATH": ":".join(search)}
                origins.setdefault(loader.library_path[0], "qnnctl's staged glibc")
        return _library(name, selection, sdk, child, origins, cwd)
    candidates = tuple(
        Candidate(folder, origins.get(folder, "PATH"), _is_tool(Path(folder or ".", name)))
        for folder in dict.fromkeys(split_path(child.get("PATH")))
    )
    found = next((os.path.abspath(os.path.join(c.folder or ".", name)) for c in candidates if c.holds), None)
    return Answer(name, TOOL, found, selection, sdk, candidates)


def _is_tool(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _library(name: str, selection: Selection, sdk: Sdk | None, child: Mapping[str, str],
             origins: Mapping[str, str], cwd: Path) -> Answer:
    ld_cache = read_ld_cache()
    resolver = Resolver(child.get("LD_LIBRARY_PATH"), ld_cache, cwd=cwd)
    # A stand-in for the SDK's libraries: of this host's machine, with no RPATH of its own.
    needer = ElfInfo(path=Path(name), identity=sdk_identity(), soname=None,
                     needed=(), rpath=(), runpath=(), glibc=None)
    found = resolver.find(name, (needer,))
    candidates = [
        Candidate(folder, origins.get(folder, "LD_LIBRARY_PATH"), Path(folder or cwd, name).is_file())
        for folder in dict.fromkeys(split_path(child.get("LD_LIBRARY_PATH")))
    ]
    candidates += [Candidate(os.path.dirname(p), "the loader's cache (ld.so.cache)", True)
                   for p in ld_cache.get(name, ())]
    candidates += [Candidate(folder, "the loader's default folders", Path(folder, name).is_file())
                   for folder in resolver.default_dirs]
    path = None if found.path is None else str(found.path)
    return Answer(name, LIBRARY, path, selection, sdk, tuple(candidates))
