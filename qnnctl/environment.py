"""The environment an SDK needs, computed once for `env`, `lower` and `doctor`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from qnnctl.cache import Cache
from qnnctl.sdk import BY_ENV, Sdk, Selection, resolve_installed, select_sdk
from qnnctl.shell import EnvValues, sdk_environment, unset_environment


def runtime_lib_dirs(cache: Cache, sdk: Sdk) -> list[str]:
    """Staged host runtime folders (libc++ and friends) to put on LD_LIBRARY_PATH."""
    if not cache.runtime.is_dir():
        return []  # the usual case, answered without importing the runtime module
    from qnnctl.runtime import staged_lib_dirs

    return [str(path) for path in staged_lib_dirs(cache, sdk)]


def environment_for(sdk: Sdk, environ: Mapping[str, str], cache: Cache, owns_root: bool) -> EnvValues:
    """Final values of QNN_SDK_ROOT, LD_LIBRARY_PATH, PATH and the marker for `sdk`."""
    lib_dirs = [str(sdk.lib_dir), *runtime_lib_dirs(cache, sdk)]
    return sdk_environment(environ, str(sdk.root), lib_dirs, [str(sdk.bin_dir)], owns_root)


class EnvPlan:
    """What `qnnctl env` decided: the values to export, or why there are none.

    A plain class rather than a dataclass, for `qnnctl env`'s start-up time.
    """

    __slots__ = ("sdk", "selection", "values")

    def __init__(self, selection: Selection | None, sdk: Sdk | None, values: EnvValues) -> None:
        self.selection = selection
        self.sdk = sdk
        self.values = values


def plan_env(
    spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache, unset: bool = False
) -> EnvPlan:
    """Choose the SDK (never installing it) and compute the exports for it.

    The choice is made as if an earlier `qnnctl env` had been undone (see
    `sdk.user_environ`), the way every command makes it.
    """
    if unset:
        return EnvPlan(None, None, unset_environment(environ))
    selection = select_sdk(spec, environ, cwd)
    if selection.caller_managed:
        return EnvPlan(selection, None, {})
    sdk = resolve_installed(selection, cache, environ)
    owns_root = selection.reason != BY_ENV
    return EnvPlan(selection, sdk, environment_for(sdk, environ, cache, owns_root))
