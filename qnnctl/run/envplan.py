"""What `qnnctl env` exports for an installed SDK: never installing, never importing more than it reads.

`qnnctl env` runs in every shell's start-up file; qnnctl.launch answers it from here alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from qnnctl.host.staged import staged_lib_dirs
from qnnctl.records import TYPE_CHECKING, Record
from qnnctl.sdk.cache import Cache, read_manifest
from qnnctl.sdk.components import install_command, installed_components, missing
from qnnctl.sdk.hosts import require_supported_host
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.pin import read_pin_components
from qnnctl.sdk.select import BY_ENV, BY_PIN, Selection, find_pin, resolve_installed, select_sdk
from qnnctl.shell.exports import EnvValues, sdk_environment, unset_environment

if TYPE_CHECKING:
    from typing import Any


def runtime_lib_dirs(cache: Cache, sdk: Sdk) -> list[str]:
    """Staged host runtime folders (libc++ and friends) to put on LD_LIBRARY_PATH."""
    return [str(path) for path in staged_lib_dirs(cache, sdk)]


def environment_for(sdk: Sdk, environ: Mapping[str, str], cache: Cache, owns_root: bool) -> EnvValues:
    """Final values of QNN_SDK_ROOT, LD_LIBRARY_PATH, PATH and the marker for `sdk`.

    The SDK's tool folder goes on PATH only when it exists: an SDK of host libraries alone has
    none, and a PATH entry that does not exist only slows every command lookup.
    """
    lib_dirs = [str(sdk.lib_dir), *runtime_lib_dirs(cache, sdk)]
    bin_dirs = [str(sdk.bin_dir)] if sdk.bin_dir.is_dir() else []
    return sdk_environment(environ, str(sdk.root), lib_dirs, bin_dirs, owns_root)


class PinGap(Record):
    """The components a `.qnn-version` pin names (its second line) that the SDK it chose lacks."""

    pin: Path
    lacking: tuple[str, ...]

    def said(self, version: str) -> str:
        """"SDK V lacks A, B, which the pin in PATH names"."""
        return f"SDK {version} lacks {', '.join(self.lacking)}, which the pin in {self.pin} names"


def pin_gap(selection: Selection, manifest: Mapping[str, Any] | None, cwd: Path) -> PinGap | None:
    """What the pin that made `selection` names and the SDK's `manifest` does not record as
    installed; None when the choice was not a pin's, or its pin names no components."""
    if selection.reason != BY_PIN:
        return None
    pin = find_pin(cwd)
    wanted = read_pin_components(pin) if pin is not None else None
    if pin is None or not wanted:
        return None  # the pin names no components (or went while qnnctl ran)
    lacking = missing(installed_components(manifest), wanted)
    return PinGap(pin, lacking) if lacking else None


class EnvPlan:
    """What `qnnctl env` decided: the values to export, or why there are none.

    A plain class rather than a dataclass, for `qnnctl env`'s start-up time.
    """

    __slots__ = ("notes", "selection", "values")

    def __init__(self, selection: Selection | None, values: EnvValues, notes: tuple[str, ...] = ()) -> None:
        self.selection = selection
        self.values = values
        self.notes = notes  # warnings for stderr: what the SDK lacks that the project asks for


def plan_env(
    spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache, unset: bool = False
) -> EnvPlan:
    """Choose the SDK (never installing it) and compute the exports for it.

    The choice is made as if an earlier `qnnctl env` had been undone (see
    `qnnctl.sdk.select.user_environ`), the way every command makes it.
    """
    if unset:
        return EnvPlan(None, unset_environment(environ))
    require_supported_host()
    # Afresh, not from what this shell was set up for: that is how one switches SDKs.
    selection = select_sdk(spec, environ, cwd, cache, from_shell=False)
    if selection.caller_managed:
        # The caller's choice again: undo what an earlier `qnnctl env` exported over it.
        return EnvPlan(selection, unset_environment(environ))
    sdk = resolve_installed(selection, cache, environ)
    owns_root = selection.reason != BY_ENV
    gap = pin_gap(selection, read_manifest(sdk.root), cwd)
    # env never downloads: it says what is missing, and exports what is there.
    notes = (f"{gap.said(sdk.version)}; `{install_command(sdk.version, gap.lacking)}` "
             f"adds {'them' if len(gap.lacking) > 1 else 'it'}",) if gap is not None else ()
    return EnvPlan(selection, environment_for(sdk, environ, cache, owns_root), notes)
