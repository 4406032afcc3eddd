"""`qnnctl doctor --device [SERIAL]`: the checks of the phone side, each with an id under `device.`.

They are doctor's own kind of check (a function of doctor's `Context` returning an `Outcome`),
run after the host's, on the device `ctx.device` names ("" for the only one adb sees), for the
SDK doctor selected. What the device says is read once and shared by the checks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from qnnctl.device.adb import Adb, Device, DeviceError
from qnnctl.device.plan import (
    DSP_DEFAULTS,
    MissingDeviceFilesError,
    default_dest,
    model_problems,
    needs,
    sdk_files,
    sdk_release,
)
from qnnctl.device.push import file_sha256
from qnnctl.device.socs import Soc, arch, find_soc, known_socs, serves
from qnnctl.doctor.context import Check, Context
from qnnctl.doctor.report import Outcome, Skip, fail, ok, warn
from qnnctl.run.inspect import NotAModelError, read_model
from qnnctl.sdk.identity import build_id, version_of_build
from qnnctl.sdk.layout import read_build_id
from qnnctl.shell.render import quote_posix
from qnnctl.words import plural, printable

# Where a phone keeps libraries of its own that load before the pushed ones unless the pushed
# folder comes first (a vendor's older libQnnHtp.so, a skel on the DSP's default path).
PREINSTALLED = ("/vendor/lib64", "/odm/lib64", "/vendor/lib/rfsa/adsp")
# A phone's folders hold a few dozen libQnn* at the most; past this many, each read whole for its
# build, the rest are named as not read, not read one after the other for as long as a device lists.
MOST_PREINSTALLED = 64


def _device(ctx: Context) -> Device:
    def connect() -> Device:
        return Adb(ctx.environ).device(ctx.device or None)

    return ctx.once("device", connect)


def _require_device(ctx: Context) -> Device:
    try:
        return _device(ctx)
    except Exception:
        raise Skip("no device to check (see device.connection)") from None


def _require_soc(ctx: Context) -> Soc:
    soc = find_soc(_require_device(ctx).soc_model)
    if soc is None:
        raise Skip("the device's SoC is not known (see device.soc)")
    return soc


def _serial_option(ctx: Context) -> str:
    return f" --serial {ctx.device}" if ctx.device else ""


def _push_command(ctx: Context) -> str:
    sdk = f" --sdk {ctx.spec}" if ctx.spec else ""
    return f"`qnnctl device push{_serial_option(ctx)}{sdk}`"


def _dest(ctx: Context) -> str:
    return default_dest(ctx.require_sdk().version)


def check_connection(ctx: Context) -> Outcome:
    device = _device(ctx)
    return ok(f"{device.describe()}, through {device.adb.path}")


def check_soc(ctx: Context) -> Outcome:
    device = _require_device(ctx)
    reported = device.soc_model
    soc = find_soc(reported)
    if soc is None:
        manufacturer = device.props().get("ro.soc.manufacturer", "")
        what = f"ro.soc.model is {reported!r}" if reported else "the device reports no ro.soc.model"
        if manufacturer and manufacturer.upper() not in ("QTI", "QUALCOMM"):
            what += f" (made by {manufacturer}: QNN's HTP backend runs on Qualcomm SoCs)"
        return fail(f"{what}; the SoCs qnnctl knows: {known_socs()}",
                    hint="if it is a Qualcomm SoC with an HTP, name one of the same generation: "
                    f"`qnnctl device push{_serial_option(ctx)} --soc MODEL`")
    generation = arch(soc.arch)
    named = f"{reported} is {soc.model}, HTP {generation.name}"
    try:
        sdk = ctx.require_sdk()
    except Skip:
        return ok(f"{named} (no SDK to check it against; see sdk.selection)")
    _, missing, _ = sdk_files(sdk, soc.arch)
    if not missing:
        return ok(f"{named}; SDK {sdk.version} has its stub and skel")
    release = sdk_release(sdk)
    if release is not None and not serves(soc.arch, release):
        since = ".".join(map(str, generation.since or ()))
        return fail(f"{named}; SDK {sdk.version} cannot serve it: {generation.name} needs QAIRT {since} or "
                    f"later ({generation.evidence})",
                    hint=f"`qnnctl install {since}` (or newer), then {_push_command(ctx)} with --sdk of it")
    error = MissingDeviceFilesError(sdk, soc, missing)
    return fail(f"{named}; {error.message}", hint=error.hint)


def _device_build(device: Device, path: str) -> str | None:
    """The build id a file on the device carries, read from its own bytes."""
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "lib.so"
        copy.write_bytes(device.read(path))
        return build_id(copy)


def check_libraries(ctx: Context) -> Outcome:
    """The pushed set is complete and of one build, the host SDK's."""
    device = _require_device(ctx)
    soc = _require_soc(ctx)
    sdk = ctx.require_sdk()
    dest = _dest(ctx)
    present, _, _ = sdk_files(sdk, soc.arch)
    local = {need.name: path for need, path in present}
    wanted = [n.name for n in needs(soc.arch) if n.required or n.name in local]
    there = device.sha256([f"{dest}/{name}" for name in wanted])
    absent = [name for name in wanted if f"{dest}/{name}" not in there]
    if len(absent) == len(wanted):
        return fail(f"nothing pushed to {device.serial}:{dest}", hint=_push_command(ctx))
    builds: dict[str, str | None] = {}
    for name in wanted:
        digest = there.get(f"{dest}/{name}")
        if digest is None:
            continue
        if name in local and file_sha256(local[name]) == digest:
            builds[name] = build_id(local[name])  # this SDK's own copy
        else:
            builds[name] = _device_build(device, f"{dest}/{name}")
    # The host SDK's build: its host libraries', else that of its own device files.
    host = read_build_id(sdk.root) or next((b for b in map(build_id, local.values()) if b), None)
    distinct = {b for b in builds.values() if b is not None}
    problems: list[str] = []
    if absent:
        problems.append(f"missing {', '.join(absent)}")
    if len(distinct) > 1:
        problems.append("mixed builds (" + ", ".join(f"{name} is {b}" for name, b in builds.items() if b)
                        + "): a stub and a skel of different builds fail at transport setup (error 14001)")
    elif distinct and host is not None and distinct != {host}:
        (pushed,) = distinct
        problems.append(f"build {pushed} (SDK {version_of_build(pushed)}), but the host SDK is build {host}: "
                        "a .pte compiled here may not load with them")
    if problems:
        return fail(f"{device.serial}:{dest}: " + "; ".join(problems), hint=_push_command(ctx))
    build = next(iter(distinct), None)
    same = f", all build {build}, as the host SDK" if build else " (they carry no build id)"
    return ok(f"{len(builds)} files in {device.serial}:{dest}{same}")


def check_preinstalled(ctx: Context) -> Outcome:
    """A phone's own libQnn* of another build load first unless the pushed folder comes first."""
    device = _require_device(ctx)
    folders = " ".join(quote_posix(d) for d in PREINSTALLED)
    listing = device.shell(f'for d in {folders}; do for f in "$d"/libQnn*.so; do [ -f "$f" ] && echo "$f"; '
                           "done; done; true", check=False)
    # Escaped on the way in, as all a device says: a name with a control character is then
    # one the device does not have, and shows as unreadable.
    found = [printable(line.strip()) for line in listing.stdout.splitlines() if line.strip().startswith("/")]
    if not found:
        return ok("no libQnn* in " + ", ".join(PREINSTALLED))
    try:
        ours = read_build_id(ctx.require_sdk().root)
    except Skip:
        ours = None
    other: list[str] = []
    for path in found[:MOST_PREINSTALLED]:
        try:
            build = _device_build(device, path)
        except DeviceError:  # unreadable without root: still a library that may load first
            other.append(f"{path} (unreadable)")
            continue
        if ours is None or build != ours:
            other.append(f"{path} (build {build or 'unknown'})")
    if len(found) > MOST_PREINSTALLED:
        other.append(f"{len(found) - MOST_PREINSTALLED} more libQnn* (not read: qnnctl reads the first "
                     f"{MOST_PREINSTALLED})")
    if not other:
        return ok(f"{len(found)} preinstalled libQnn* of build {ours}, the host SDK's")
    versus = f", not the host SDK's {ours}" if ours else ""
    return warn(
        f"preinstalled {', '.join(other)}{versus}: they load instead of the pushed ones unless the pushed folder "
        "comes first on LD_LIBRARY_PATH (and, for a skel, on ADSP_LIBRARY_PATH)",
        hint=f"run through `qnnctl device run{_serial_option(ctx)} -- COMMAND` (it puts the pushed folder "
        "first), or export what `qnnctl device env` prints",
    )


def check_adsp_path(ctx: Context) -> Outcome:
    """The device shell's ADSP_LIBRARY_PATH, if set: `;`-separated folders that exist."""
    device = _require_device(ctx)
    # Escaped once, here: shown in quotes, not by repr, which would escape the escapes again.
    value = printable(device.shell('printf "%s" "$ADSP_LIBRARY_PATH"', check=False).stdout.strip())
    if not value:
        return ok("not set in the device's shell; `qnnctl device run` sets it for the command it runs")
    entries = [e for e in value.split(";") if e]
    colon = [e for e in entries if ":" in e]
    if colon:
        return fail(f"ADSP_LIBRARY_PATH='{value}' separates folders with ':', so the DSP reads "
                    f"'{colon[0]}' as one folder name; it takes ';'",
                    hint="separate its folders with ';' and quote it: as `qnnctl device env` prints")
    relative = [e for e in entries if not e.startswith("/")]
    listing = device.shell("for d in " + " ".join(quote_posix(e) for e in entries) +
                           '; do [ -d "$d" ] && echo "$d"; done; true', check=False)
    existing = {printable(line.strip()) for line in listing.stdout.splitlines()}
    gone = [e for e in entries if e not in existing and e not in relative]
    problems = []
    if relative:
        problems.append(f"{'relative folder' if len(relative) == 1 else 'relative folders'} {', '.join(relative)}")
    if gone:
        problems.append(f"no folder {', '.join(gone)} on the device")
    try:
        dest = _dest(ctx)
    except Skip:
        dest = None
    if dest is not None and entries and entries[0] != dest:
        problems.append(f"it does not start with {dest}, so a skel in {entries[0]} loads before the pushed one")
    missing_defaults = [d for d in DSP_DEFAULTS if d not in entries]
    if problems:
        return warn(f"ADSP_LIBRARY_PATH='{value}': " + "; ".join(problems),
                    hint="export what `qnnctl device env` prints, or run through `qnnctl device run`")
    more = f" (without {', '.join(missing_defaults)})" if missing_defaults else ""
    return ok(f"ADSP_LIBRARY_PATH='{value}': {plural(len(entries), 'folder')}, ';'-separated{more}")


def _device_runtime(ctx: Context) -> tuple[str, str | None] | None:
    """The libQnnHtp.so a program run on the device loads, in words, and its build: the pushed
    set's (what `qnnctl device run` puts first), else the phone's own; None when there is none."""
    device = _require_device(ctx)
    try:
        dest: str | None = _dest(ctx)
    except Skip:
        dest = None
    if dest is not None:
        pushed = f"{dest}/libQnnHtp.so"
        digest = device.sha256([pushed]).get(pushed)
        if digest is not None:
            local = ctx.require_sdk().root / "lib" / "aarch64-android" / "libQnnHtp.so"
            same = local.is_file() and file_sha256(local) == digest
            return (f"the runtime pushed to {device.serial}:{dest}",
                    build_id(local) if same else _device_build(device, pushed))
    for folder in PREINSTALLED[:2]:
        path = f"{folder}/libQnnHtp.so"
        if device.shell(f"[ -f {quote_posix(path)} ]", check=False).returncode == 0:
            return f"the device's own {device.serial}:{path}", _device_build(device, path)
    return None


def check_model(ctx: Context) -> Outcome:
    """Each model `--model` names, as the SDK's own libQnnSystem.so reads it, against the device:
    a binary compiled for another HTP architecture than the device's does not load there, nor one
    whose QNN API is newer than the device's runtime (error 5000)."""
    runtime = _device_runtime(ctx)
    if runtime is None:
        raise Skip("no libQnnHtp.so on the device to load a model with (see device.libraries)")
    where, build = runtime
    soc = find_soc(_require_device(ctx).soc_model)
    sdk = ctx.require_sdk()
    problems: list[str] = []
    fine: list[str] = []
    for model in ctx.models:
        try:
            _, binaries = read_model(model, sdk, ctx.child_environ())
        except NotAModelError as exc:
            problems.append(exc.message)
            continue
        bad, good = model_problems(binaries, soc, build, where)
        problems += bad
        fine += good
    device = f"{soc.model}, HTP V{soc.arch}" if soc else "SoC unknown"
    if problems:
        return fail("; ".join(problems),
                    hint=f"lower the model for the device's SoC with an SDK no newer than its runtime, or push a "
                    f"newer runtime: {_push_command(ctx)} with --sdk of that QAIRT")
    if build is None:
        return warn(f"{where} carries no build id: whether it loads {', '.join(fine)} is unknown")
    return ok(f"{where} (build {build}, {device}) loads {', '.join(fine)}")


# Run when `doctor --device` is given `--model FILE`.
MODEL_CHECK: tuple[str, Check] = ("device.model", check_model)

DEVICE_CHECKS: tuple[tuple[str, Check], ...] = (
    ("device.connection", check_connection),
    ("device.soc", check_soc),
    ("device.libraries", check_libraries),
    ("device.preinstalled", check_preinstalled),
    ("device.adsp_library_path", check_adsp_path),
)
