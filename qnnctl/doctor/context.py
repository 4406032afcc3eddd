"""What a doctor check looks at: the `Context` (the SDK chosen, the environment, the host's
facts, each computed once and shared by the checks) and the hints that depend on that SDK.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from qnnctl.doctor.frameworks import Frameworks, own_frameworks, python_frameworks
from qnnctl.doctor.report import Outcome, Skip
from qnnctl.errors import InvalidSdkError, NotInstalledError, QnnctlError
from qnnctl.host.elf import Closure, Resolver, Scanner
from qnnctl.host.machine import glibc_version, read_ld_cache
from qnnctl.run.envplan import environment_for
from qnnctl.run.probe import Loaded, probe
from qnnctl.sdk.cache import MANIFEST_NAME, Cache
from qnnctl.sdk.hosts import this_host, this_system
from qnnctl.sdk.layout import REQUIRED_LIBS, Sdk, read_sdk_version
from qnnctl.sdk.select import (
    BY_ENV,
    BY_SHELL,
    Selection,
    caller_lib_dir,
    resolve_installed,
    select_sdk,
    selection_origin,
)
from qnnctl.sdk.select import reinstall_hint as reinstall_cached
from qnnctl.shell.exports import EnvValues, apply

# What an install needs on disk: the archive and the unpacked SDK side by side.
TYPICAL_ARCHIVE = 1_500 << 20
TYPICAL_UNPACKED = 2_500 << 20


@dataclass(frozen=True)
class Target:
    """The SDK doctor looks at, as `qnnctl env` and `qnnctl lower` would choose it.

    `sdk` is None when the caller manages the SDK (QNN_SDK_ROOT exported but empty); the
    host libraries are then the folder on LD_LIBRARY_PATH that holds libQnnHtp.so, if any.
    """

    selection: Selection
    sdk: Sdk | None
    lib_dir: Path | None


_T = TypeVar("_T")


@dataclass
class Context:
    """Everything a check may look at. Expensive facts are computed once, on first use."""

    spec: str | None
    environ: Mapping[str, str]
    cwd: Path
    offline: bool = False
    verify: bool = False
    # The device `--device` names for the device checks ("" for the only one adb sees).
    device: str | None = None
    # Lowered models to check against the device's runtime (`--model`).
    models: tuple[Path, ...] = ()
    # The Python whose frameworks to check (`--python`); None: qnnctl's own.
    python: str | None = None
    # The host's facts; tests replace them to see a check's verdict on another host.
    system: str = field(default_factory=lambda: this_system()[0])
    machine: str = field(default_factory=lambda: this_system()[1])
    glibc_reader: Callable[[], tuple[int, ...] | None] = glibc_version
    space_needed: int = TYPICAL_ARCHIVE + TYPICAL_UNPACKED
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    def once(self, key: str, compute: Callable[[], _T]) -> _T:
        """compute() once; a failure is remembered too, so each check sees the same one."""
        if key not in self._memo:
            try:
                self._memo[key] = (True, compute())
            except Exception as exc:
                self._memo[key] = (False, exc)
        done, value = self._memo[key]
        if not done:
            raise value
        return cast(_T, value)

    def frameworks(self) -> Frameworks:
        """The lowering frameworks of the Python `--python` names, else of qnnctl's own."""
        python = self.python

        def compute() -> Frameworks:
            return own_frameworks() if python is None else python_frameworks(python, self.environ)

        return self.once("frameworks", compute)

    def cache(self) -> Cache:
        return self.once("cache", lambda: Cache.from_env(self.environ))

    def loaded(self) -> list[Loaded]:
        """The SDK's libraries as a fresh process loads them (the load check, and the ONNX
        Runtime check that reads the HTP provider's API version)."""
        return self.once("loaded", lambda: probe(REQUIRED_LIBS, self.child_environ()))

    def glibc(self) -> tuple[int, ...] | None:
        """The host's glibc version; None when the C library is not glibc."""
        return self.once("glibc", self.glibc_reader)

    def target(self) -> Target:
        return self.once("target", self._find_target)

    def _find_target(self) -> Target:
        selection = select_sdk(self.spec, self.environ, self.cwd, self.cache())
        if selection.caller_managed:
            return Target(selection, None, caller_lib_dir(self.environ))
        sdk = locate(selection, self.cache(), self.environ)
        return Target(selection, sdk, sdk.lib_dir)

    def require_target(self) -> Target:
        """The target, or a Skip pointing at sdk.selection, which reports why there is none."""
        try:
            return self.target()
        except Exception:
            raise Skip("no SDK to check (see sdk.selection)") from None

    def require_sdk(self) -> Sdk:
        target = self.require_target()
        if target.sdk is None:
            raise Skip("the caller manages the SDK (QNN_SDK_ROOT is exported but empty)")
        return target.sdk

    def env_values(self) -> EnvValues:
        """The change `qnnctl env` would make for the target ({} for a caller-managed SDK)."""

        def compute() -> EnvValues:
            target = self.target()
            if target.sdk is None:
                return {}
            owns_root = target.selection.reason != BY_ENV
            return environment_for(target.sdk, self.environ, self.cache(), owns_root)

        return self.once("env_values", compute)

    def child_environ(self) -> dict[str, str]:
        """The environment a process started after `eval "$(qnnctl env)"` would have."""
        return apply(self.environ, self.env_values())

    def sdk_version(self) -> str | None:
        """The target's version as read from disk (also for a caller-managed SDK)."""
        target = self.require_target()
        if target.sdk is not None:
            return read_sdk_version(target.sdk.root)
        if target.lib_dir is not None and target.lib_dir.name == Path(this_host().lib_dir).name:
            return read_sdk_version(target.lib_dir.parent.parent)
        return None

    def scan(self) -> LibraryScan:
        return self.once("scan", self._scan)

    def _scan(self) -> LibraryScan:
        target = self.require_target()
        if target.lib_dir is None:
            raise Skip(
                "QNN_SDK_ROOT is empty and no folder on LD_LIBRARY_PATH holds libQnnHtp.so",
                hint=f"add the SDK's {this_host().lib_dir} to LD_LIBRARY_PATH, or unset QNN_SDK_ROOT "
                "and run `eval \"$(qnnctl env)\"`",
            )
        lib_dir = target.lib_dir
        if not lib_dir.is_dir():
            raise QnnctlError(f"{lib_dir} does not exist", hint=reinstall_hint(target))
        resolver = Resolver(self.child_environ().get("LD_LIBRARY_PATH"), read_ld_cache(), cwd=self.cwd)
        scanner = Scanner(resolver)
        every = sorted(p for p in lib_dir.iterdir() if is_library_name(p.name) and p.is_file())
        # Several names can point at one file (libQnnHtp.so.2 -> libQnnHtp.so): read it once.
        unique: dict[str, Path] = {}
        for path in every:
            unique.setdefault(os.path.realpath(path), path)
        required = [lib_dir / name for name in REQUIRED_LIBS if (lib_dir / name).is_file()]
        absent = [name for name in REQUIRED_LIBS if not (lib_dir / name).is_file()]
        required_real = {os.path.realpath(p) for p in required}
        others = [p for real, p in unique.items() if real not in required_real]
        return LibraryScan(
            lib_dir=lib_dir,
            absent=absent,
            required=scanner.closure(required),
            others=scanner.closure(others),
        )


# A check: a function of the Context that returns an Outcome, or raises Skip.
Check = Callable[[Context], Outcome]


@dataclass(frozen=True)
class LibraryScan:
    """The SDK's host libraries and what they need: the ones every lowering loads, and the rest."""

    lib_dir: Path
    absent: list[str]
    required: Closure
    others: Closure


def is_library_name(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def locate(selection: Selection, cache: Cache, environ: Mapping[str, str]) -> Sdk:
    """The selected SDK, as `qnnctl env` resolves it; also a damaged one, so doctor can say
    what is wrong with it rather than only that it is unusable."""
    try:
        return resolve_installed(selection, cache, environ)
    except InvalidSdkError:
        root = selection.root
        if root is None or not root.is_dir():
            raise
        return Sdk(root=root, version=read_sdk_version(root) or "unknown", origin=selection_origin(selection))
    except NotInstalledError:
        version = selection.version or ""
        own = cache.sdk_dir(version)
        if version and (own / MANIFEST_NAME).is_file():
            # Installed by qnnctl and damaged since.
            return Sdk(root=own, version=version, origin="qnnctl cache")
        raise


def reinstall_hint(target: Target) -> str:
    sdk = target.sdk
    if sdk is not None and sdk.origin == "qnnctl cache":
        return reinstall_cached(sdk.root, sdk.version)
    return "reinstall this SDK, or run `qnnctl install` and point QNN_SDK_ROOT (or --sdk) at the result"


def env_command(spec: str | None, target: Target | None = None) -> str:
    """The `qnnctl env` command that selects the same SDK doctor looked at.

    Plain `qnnctl env` chooses afresh: when this shell's own record chose the SDK, the
    command names it, or it would switch the shell to another one.
    """
    if spec is None and target is not None and target.selection.reason == BY_SHELL and target.sdk:
        spec = str(target.sdk.root)
    if spec is None:
        return 'eval "$(qnnctl env)"'
    if target is not None and target.selection.version is not None:
        return f'eval "$(qnnctl env {target.selection.version})"'  # a prefix resolved already
    chosen = select_sdk(spec, {}, Path.cwd())
    if chosen.root is not None:
        return f'eval "$(qnnctl env --sdk {shlex.quote(str(chosen.root))})"'
    return f'eval "$(qnnctl env {chosen.version})"'
