"""The library API: what a backend calls on the paths that need the SDK, instead of on import.

    sdk = qnnctl.setup_sdk()          # before the first QNN call; cheap after the first time
    qnnctl.disable_mkldnn_on_amd()    # before calibration runs a convolution

Both are safe to call from any thread, any number of times.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from qnnctl.errors import QnnctlError, UsageError
from qnnctl.host.machine import CPUINFO, cpu_vendor, is_amd
from qnnctl.records import TYPE_CHECKING
from qnnctl.run.environment import ensure_loadable, hold_runtime_to_lock, resolve_and_hold
from qnnctl.run.envplan import environment_for, runtime_lib_dirs
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.hosts import this_host
from qnnctl.sdk.layout import Sdk, missing_layout, read_sdk_version
from qnnctl.sdk.select import BY_ENV, caller_lib_dir, select_sdk
from qnnctl.shell.exports import check_cache_path

if TYPE_CHECKING:
    from qnnctl.sdk.cache import Cache

log = logging.getLogger("qnnctl.run.api")

# Names the CPU vendor to use instead of reading it (for tests, and for hosts where the reading
# is wrong). Empty means unset.
FORCE_VENDOR_VARIABLE = "QNNCTL_FORCE_CPU_VENDOR"
# The two variables setup_sdk sets for child processes. PATH is left alone: a library call
# that puts the SDK's tools ahead of the user's would surprise.
MANAGED = ("QNN_SDK_ROOT", "LD_LIBRARY_PATH")
# Host libraries loaded with RTLD_GLOBAL, in this order; the ones an SDK lacks are skipped.
# libQnnHtp.so opens libQnnHtpPrepare.so by bare name when it prepares a graph on the host;
# with the library already loaded the loader finds it by its soname, whatever
# LD_LIBRARY_PATH said when the process started.
PRELOAD = ("libQnnSystem.so", "libQnnHtpPrepare.so", "libQnnHtp.so")


class LibraryLoadError(QnnctlError):
    """A host library of the SDK would not load into this process."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        super().__init__(
            f"cannot load {path}: {reason}",
            hint="run `qnnctl doctor` to see what the SDK's libraries need",
        )


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sdk: Sdk | None = None  # success is remembered; a failure is not
        self.hold: int | None = None  # the SDK's hold (qnnctl.sdk.holds), kept open until the process ends
        self.warned_no_cpuinfo = False


_state = _State()


def setup_sdk(version: str | None = None) -> Sdk:
    """Make the SDK usable in this process and its children; return it.

    Resolves the SDK as `qnnctl install` does (installing it when missing), sets QNN_SDK_ROOT
    and LD_LIBRARY_PATH for child processes, and loads the host libraries with RTLD_GLOBAL.
    LD_LIBRARY_PATH cannot help this process' own later dlopen calls (the loader read it at
    startup); the preload is what does. A failed attempt leaves both variables exactly as they
    were and is not remembered, so the next call tries again.

    With QNN_SDK_ROOT exported but empty (and no `version`), the caller manages the SDK:
    nothing is downloaded and no variable is changed; the libraries are loaded from the SDK
    found on LD_LIBRARY_PATH, and an error says so when there is none.
    """
    done = _state.sdk
    if done is None:
        with _state.lock:
            done = _state.sdk
            if done is None:
                done = _setup(version)
                _state.sdk = done
                return done
    return _check_same(done, version)


def _check_same(done: Sdk, spec: str | None) -> Sdk:
    """The SDK set up earlier, when `spec` names it too; libraries once loaded cannot be swapped."""
    if spec is None:
        return done
    # A prefix names what it named when the SDK was set up: installed SDKs first.
    selection = select_sdk(spec, os.environ, Path.cwd(), Cache.from_env(os.environ))
    same = (selection.version == done.version if selection.version is not None
            else selection.root is not None and selection.root.resolve() == done.root.resolve())
    if not same:
        raise UsageError(
            f"SDK {done.version} ({done.root}) is already set up in this process; {spec} cannot replace it",
            hint="use one SDK per process: start a new process for another one",
        )
    return done


def _setup(spec: str | None) -> Sdk:
    environ = os.environ
    saved = {name: environ.get(name) for name in MANAGED}
    held: int | None = None
    try:
        cache = Cache.from_env(environ)
        check_cache_path(str(cache.root))  # before a download, not after: LD_LIBRARY_PATH cannot hold it
        cwd = Path.cwd()
        # Held for the life of this process: its libraries stay loaded, and it may load more.
        selection, sdk, held = resolve_and_hold(spec, environ, cwd, cache)
        if sdk is None:
            return _caller_managed(environ)
        # As `qnnctl install` does: a host without libc++ gets the staged trio, which this
        # process must load before the SDK's libraries (its loader never saw LD_LIBRARY_PATH).
        ensure_loadable(sdk, environ, cache, cwd)
        hold_runtime_to_lock(sdk, cache, cwd)
        values = environment_for(sdk, environ, cache, owns_root=selection.reason != BY_ENV)
        for name in MANAGED:
            _set(name, values.get(name))
        preload_runtime(cache, sdk)
        preload(sdk.lib_dir)
    except BaseException:
        for name, value in saved.items():
            _set(name, value)
        if held is not None:
            os.close(held)
        raise
    _state.hold = held
    log.debug("SDK %s set up from %s", sdk.version, sdk.root)
    return sdk


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _caller_managed(environ: Mapping[str, str]) -> Sdk:
    """The SDK a caller put on LD_LIBRARY_PATH itself (QNN_SDK_ROOT exported but empty)."""
    lib_dir = caller_lib_dir(environ)
    if lib_dir is not None and lib_dir.parts[-2:] == tuple(this_host().lib_dir.split("/")):
        root = lib_dir.parent.parent
        if not missing_layout(root):
            preload(lib_dir)
            return Sdk(root=root, version=read_sdk_version(root) or "unknown", origin="LD_LIBRARY_PATH")
    raise QnnctlError(
        "QNN_SDK_ROOT is exported but empty, which leaves the SDK to the caller, and no folder on "
        f"LD_LIBRARY_PATH is an SDK's {this_host().lib_dir}",
        hint=f"export LD_LIBRARY_PATH=<sdk>/{this_host().lib_dir} before Python starts, "
        "or unset QNN_SDK_ROOT to let qnnctl set the SDK up",
    )


def preload(lib_dir: Path, names: Sequence[str] = PRELOAD) -> list[Path]:
    """Load the libraries of `names` that `lib_dir` holds, in that order, with RTLD_GLOBAL."""
    loaded = []
    for name in names:
        path = lib_dir / name
        if not path.is_file():
            continue
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise LibraryLoadError(path, str(exc)) from exc
        loaded.append(path)
    return loaded


# The staged trio, each after what it needs: the loader then finds them by soname when the
# SDK's libraries ask for libc++.so.1.
RUNTIME_PRELOAD = ("libunwind.so.1", "libc++abi.so.1", "libc++.so.1")


def preload_runtime(cache: Cache, sdk: Sdk) -> list[Path]:
    """Load the staged libc++ trio the SDK uses, if any, with RTLD_GLOBAL."""
    loaded: list[Path] = []
    for folder in runtime_lib_dirs(cache, sdk):
        loaded += preload(Path(folder), RUNTIME_PRELOAD)
    return loaded


# -- the AMD MKLDNN guard --------------------------------------------------------------


def amd_guard_needed(environ: Mapping[str, str] | None = None) -> bool:
    """True on an AMD CPU. The vendor is read once per process (from /proc/cpuinfo); where that
    file is missing and py-cpuinfo is not installed, a warning once and no."""
    environ = os.environ if environ is None else environ
    if this_host(environ).machine != "x86_64":
        return False  # MKLDNN's AMD crash is an x86 one; other machines have no such CPU
    vendor = environ.get(FORCE_VENDOR_VARIABLE) or None
    if vendor is None:
        try:
            vendor = cpu_vendor()
        except ModuleNotFoundError as exc:
            if exc.name != "cpuinfo":
                raise  # a module missing inside py-cpuinfo is a real bug; keep its traceback
            _warn_no_cpuinfo_once()
            return False
    return is_amd(vendor)


def _warn_no_cpuinfo_once() -> None:
    with _state.lock:
        if _state.warned_no_cpuinfo:
            return
        _state.warned_no_cpuinfo = True
    log.warning("%s cannot be read and py-cpuinfo is not installed, so the CPU vendor is unknown; "
                "the AMD MKLDNN guard is skipped (pip install py-cpuinfo)", CPUINFO)


def disable_mkldnn_on_amd() -> bool:
    """Turn PyTorch's MKLDNN (oneDNN) path off on an AMD CPU, where it can crash a convolution.

    Applies the setting on every call (the caller may have turned it back on). Imports torch
    only on AMD. Leaves flags that torch has frozen (`torch.backends.disable_global_flags()`)
    alone. Returns True when this call turned MKLDNN off.
    """
    if not amd_guard_needed():
        return False
    try:
        backends = importlib.import_module("torch.backends")
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        log.debug("torch is not installed: no MKLDNN to turn off")
        return False
    frozen = getattr(backends, "flags_frozen", None)
    if callable(frozen) and frozen():
        log.debug("torch's backend flags are frozen; MKLDNN left as it is")
        return False
    mkldnn = importlib.import_module("torch.backends.mkldnn")
    mkldnn.enabled = False  # type: ignore[attr-defined]
    return True
