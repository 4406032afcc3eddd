"""Which files of an SDK a device needs, where they go, and the device shell's environment.

A `.pte` with the QNN delegate, run on the HTP backend, loads these on the phone:

- from the SDK's `lib/aarch64-android/`: `libQnnHtp.so` (the backend), `libQnnSystem.so`,
  `libQnnHtpV<NN>Stub.so` (the CPU side of the DSP transport) and `libQnnHtpPrepare.so`
  (without it the runtime warns);
- from the SDK's `lib/hexagon-v<NN>/unsigned/`: `libQnnHtpV<NN>Skel.so` (the DSP side), found by
  the DSP through `ADSP_LIBRARY_PATH`, whose folders are separated by `;` (a `:` makes it one
  folder name);
- what the user adds: the runner, `libqnn_executorch_backend.so`, the `.pte`.

Stub and skel of different builds fail at transport setup (a CRC mismatch, error 14001), so a
plan is one build: the build id each library carries (`v2.51.0.260929181845`) must agree.
Planning reads only the SDK on disk; it talks to no device.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qnnctl.device.socs import Soc, arch, find_soc, known_socs, serves
from qnnctl.errors import QnnctlError, UsageError
from qnnctl.records import Record
from qnnctl.run.inspect import Binary, NotAModelError, api_release
from qnnctl.sdk.cache import read_manifest
from qnnctl.sdk.components import ALL, ANDROID, HEXAGON, install_command, installed_components
from qnnctl.sdk.identity import build_id
from qnnctl.sdk.layout import Sdk, read_build_id
from qnnctl.sdk.select import reinstall_hint
from qnnctl.sdk.stores import first_unsafe
from qnnctl.sdk.versions import is_full_version, parse_version
from qnnctl.shell.render import quote_posix
from qnnctl.words import printable

ANDROID_LIB_DIR = "lib/aarch64-android"
DEVICE_BASE = "/data/local/tmp/qnnctl"
# Where the DSP finds its own libraries; the pushed folder goes first.
DSP_DEFAULTS = ("/vendor/lib/rfsa/adsp", "/system/lib/rfsa/adsp", "/dsp")
DEVICE_SHELLS = ("sh", "json")

BACKEND = "backend"
SYSTEM = "system"
STUB = "stub"
PREPARE = "prepare"
SKEL = "skel"
EXTRA = "extra"


def hexagon_dir(number: int) -> str:
    return f"lib/hexagon-v{number}/unsigned"


class Need(Record):
    """One SDK file a device needs: its path in the SDK, and whether the runtime fails without it."""

    rel: str
    role: str
    required: bool

    @property
    def name(self) -> str:
        return self.rel.rsplit("/", 1)[-1]


def needs(number: int) -> tuple[Need, ...]:
    """The SDK files for HTP generation V<number>, in the order they are pushed."""
    return (
        Need(f"{ANDROID_LIB_DIR}/libQnnHtp.so", BACKEND, True),
        Need(f"{ANDROID_LIB_DIR}/libQnnSystem.so", SYSTEM, True),
        Need(f"{ANDROID_LIB_DIR}/libQnnHtpV{number}Stub.so", STUB, True),
        Need(f"{ANDROID_LIB_DIR}/libQnnHtpPrepare.so", PREPARE, False),
        Need(f"{hexagon_dir(number)}/libQnnHtpV{number}Skel.so", SKEL, True),
    )


@dataclass(frozen=True)
class DeviceFile:
    """One file of a plan: where it comes from, where it goes, and what it is."""

    name: str
    source: Path
    device_path: str
    size: int
    build_id: str | None
    role: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": str(self.source), "device_path": self.device_path,
                "size": self.size, "build_id": self.build_id, "role": self.role}


@dataclass(frozen=True)
class Plan:
    """What `qnnctl device push` puts on a device, and the environment it runs with there."""

    soc: Soc
    sdk: Sdk
    dest: str
    files: tuple[DeviceFile, ...]
    build_id: str | None  # the one build the SDK's files carry
    warnings: tuple[str, ...] = ()

    @property
    def arch_name(self) -> str:
        return arch(self.soc.arch).name

    def environment(self) -> dict[str, str]:
        return device_environment(self.dest)

    def as_dict(self) -> dict[str, Any]:
        return {
            "soc": self.soc.model,
            "htp_arch": self.arch_name,
            "sdk": {"version": self.sdk.version, "root": str(self.sdk.root), "build_id": self.build_id},
            "dest": self.dest,
            "files": [f.as_dict() for f in self.files],
            "environment": self.environment(),
            "warnings": list(self.warnings),
        }


# -- errors ----------------------------------------------------------------------------------


class UnknownSocError(UsageError):
    """A SoC that is not in the table: the user must name one (exit 2)."""

    def __init__(self, reported: str, where: str, given: bool) -> None:
        self.reported = reported
        shown = f"{reported!r}" if reported.strip() else "no SoC (ro.soc.model is empty)"
        message = (f"{where} reports {shown}" if not given else f"--soc {reported!r} is not a SoC qnnctl knows")
        super().__init__(
            f"{message}; the SoCs qnnctl knows: {known_socs()}",
            hint="name the SoC (or one with the same HTP generation) with --soc, e.g. "
            "`qnnctl device push --soc SM8750`",
        )


class UnservableSocError(QnnctlError):
    """The SDK's release predates the SoC's HTP generation."""

    def __init__(self, soc: Soc, version: str) -> None:
        generation = arch(soc.arch)
        since = ".".join(map(str, generation.since or ()))
        self.soc = soc
        super().__init__(
            f"SDK {version} cannot serve {soc.model} (HTP {generation.name}): {generation.name} needs "
            f"QAIRT {since} or later ({generation.evidence})",
            hint=f"install a newer SDK (`qnnctl install {since}` or later) and push it with "
            "`qnnctl device push --sdk VERSION`",
        )


class MissingDeviceFilesError(QnnctlError):
    """The installed SDK lacks files a device needs (installed without its device side)."""

    def __init__(self, sdk: Sdk, soc: Soc, missing: Sequence[str]) -> None:
        self.missing = list(missing)
        generation = arch(soc.arch)
        super().__init__(
            f"SDK {sdk.version} at {sdk.root} lacks what {soc.model} (HTP {generation.name}) needs: "
            + ", ".join(missing),
            hint=_device_files_hint(sdk, generation.number),
        )


def _device_files_hint(sdk: Sdk, number: int) -> str:
    """What brings a device's files: the components an SDK installed in parts lacks; for one
    installed whole, whose archive lacks them, another SDK (a reinstall would lack them too)."""
    folders = f"{ANDROID_LIB_DIR}/ and {hexagon_dir(number)}/"
    if sdk.origin != "qnnctl cache":
        return _full_install_hint(sdk) + f"; a full SDK archive holds {folders}"
    held = installed_components(read_manifest(sdk.root))
    if ALL not in held:
        adding = [ANDROID, HEXAGON.format(gen=number)]
        return f"add them: `{install_command(sdk.version, [*held, *adding])}` (fetches only what is missing)"
    return (f"SDK {sdk.version} was installed whole, so its archive has no {folders} (`qnnctl doctor --verify` "
            "tells whether files were lost since): a reinstall would lack them too; push from an SDK whose "
            "archive holds them, a full QAIRT release: `qnnctl device push --sdk VERSION`")


class MixedBuildError(QnnctlError):
    """The SDK's files are of different builds: the device would fail at transport setup."""

    def __init__(self, sdk: Sdk, builds: Mapping[str, str]) -> None:
        self.builds = dict(builds)
        shown = ", ".join(f"{name} is build {build}" for name, build in builds.items())
        super().__init__(
            f"SDK {sdk.version} at {sdk.root} mixes builds: {shown}; a stub and a skel of different "
            "builds fail on the device (transport CRC mismatch, error 14001)",
            hint=_full_install_hint(sdk) + " (one archive is one build)",
        )


def _full_install_hint(sdk: Sdk) -> str:
    if sdk.origin == "qnnctl cache":
        return reinstall_hint(sdk.root, sdk.version) + " from a full archive"
    version = sdk.version if is_full_version(sdk.version) else "VERSION"
    return f"install the full SDK: `qnnctl install {version}` (or `--file ARCHIVE`), then pass --sdk {version}"


# -- planning --------------------------------------------------------------------------------


def resolve_soc(reported: str | None, override: str | None, where: str = "the device") -> Soc:
    """The SoC to plan for: `--soc` when given, else what the device reported."""
    if override is not None:
        soc = find_soc(override)
        if soc is None:
            raise UnknownSocError(override, where, given=True)
        return soc
    soc = find_soc(reported or "")
    if soc is None:
        raise UnknownSocError(reported or "", where, given=False)
    return soc


def default_dest(version: str) -> str:
    return f"{DEVICE_BASE}/{version}"


def check_dest(dest: str) -> str:
    """A device folder that can be exported: absolute, and splitting neither path list."""
    bad = [c for c in (";", ":", "\n", "\r", "\x00") if c in dest]
    if not dest.startswith("/") or bad:
        why = "must be absolute" if not dest.startswith("/") else f"contains {', '.join(map(repr, bad))}"
        raise UsageError(
            f"--dest {dest!r} {why}: LD_LIBRARY_PATH is split at ':' and ADSP_LIBRARY_PATH at ';'",
            hint=f"give an absolute folder without ':' or ';', e.g. --dest {DEVICE_BASE}/mine",
        )
    return dest.rstrip("/") or "/"


def device_environment(dest: str) -> dict[str, str]:
    """What a process on the device needs: the pushed folder first, for the loader and the DSP."""
    return {
        "LD_LIBRARY_PATH": dest,
        "ADSP_LIBRARY_PATH": ";".join((dest, *DSP_DEFAULTS)),
    }


def render_device_env(values: Mapping[str, str], shell: str) -> str:
    """Exports for Android's sh (mksh), single-quoted so that `;` stays inside the value."""
    if shell == "json":
        return json.dumps(dict(values), indent=2) + "\n"
    if shell != "sh":
        raise UsageError(f"unknown device shell {shell!r}", hint="use --shell sh or --shell json")
    return "".join(f"export {name}={quote_posix(value)}\n" for name, value in values.items())


def remote_command(dest: str, argv: Sequence[str]) -> str:
    """The line Android's sh runs for `qnnctl device run`: in `dest`, with the environment."""
    exports = " ".join(f"{name}={quote_posix(value)}" for name, value in device_environment(dest).items())
    command = " ".join(quote_posix(word) for word in argv)
    # exec: the command's exit status is the shell's, which adb passes back.
    return f"cd {quote_posix(dest)} && export {exports} && exec {command}"


def sdk_files(sdk: Sdk, number: int) -> tuple[list[tuple[Need, Path]], list[str], list[str]]:
    """(present needs with their paths, missing required files, missing optional files)."""
    present: list[tuple[Need, Path]] = []
    missing: list[str] = []
    optional: list[str] = []
    for need in needs(number):
        path = sdk.root / need.rel
        if path.is_file():
            present.append((need, path))
        elif need.required:
            missing.append(need.rel)
        else:
            optional.append(need.rel)
    return present, missing, optional


def sdk_release(sdk: Sdk) -> tuple[int, int] | None:
    """The SDK's (major, minor) release, from its version; None when unknown."""
    if not is_full_version(sdk.version):
        return None
    return parse_version(sdk.version).major_minor


# Reads a lowered model with the host SDK's libQnnSystem.so (qnnctl.run.inspect.read_model).
ModelReader = Callable[[Path], list[Binary]]
# Extra files taken for lowered models, and checked against the device before they are pushed.
MODEL_SUFFIXES = (".bin", ".onnx")


def _release(build: str) -> tuple[int, int] | None:
    parts = build.removeprefix("v").split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() else None


def model_problems(binaries: Sequence[Binary], soc: Soc | None, runtime: str | None,
                   where: str) -> tuple[list[str], list[str]]:
    """What keeps each binary (as the host SDK's library read it) from loading on a device with
    `soc` and the runtime `where` of build `runtime`: its HTP architecture, then the QAIRT release
    its API versions need. Returns (problems, what is fine), in words that name both sides."""
    problems: list[str] = []
    fine: list[str] = []
    for b in binaries:
        origin = printable(b.origin)
        if b.error is not None:
            problems.append(f"{origin} cannot be read by the SDK's libQnnSystem.so ({printable(b.error)}), so no "
                            "runtime loads it")
            continue
        if soc is not None and b.htp_arch is not None and b.htp_arch != soc.arch:
            problems.append(f"{origin} was compiled for HTP V{b.htp_arch} ({printable(b.soc or 'SoC not named')}), "
                            f"the device's {soc.model} is HTP V{soc.arch}: it does not load there; lower it "
                            f"again for {soc.model}")
            continue
        needs = api_release(b)
        have = _release(runtime) if runtime else None
        if needs is not None and have is not None and needs > have:
            problems.append(
                f"{origin} needs the runtime of QAIRT {needs[0]}.{needs[1]} or newer (its API: core {b.core_api}, "
                f"backend {b.backend_api}; build string {printable(b.build or '-')}), and {where} is build {runtime}: "
                "it fails to load with error 5000 (`Using newer context binary on old SDK`)")
            continue
        same_soc = "" if soc is None or not b.soc or b.soc == soc.model else (
            f", compiled for {printable(b.soc)}, the same HTP V{soc.arch} as the device's {soc.model}")
        fine.append(f"{origin} (HTP V{b.htp_arch}, API {b.core_api}/{b.backend_api}{same_soc})")
    return problems, fine


def refuse_unsafe_device_files(sdk: Sdk, paths: Sequence[Path]) -> None:
    """IntegrityError (exit 4) when another user could change one of the SDK's files bound for
    the device, or a folder down to it: selecting the SDK checked its host folders only, and
    these are what runs on the phone."""
    problem = first_unsafe(paths)
    if problem is not None:
        raise problem.refusal(f"the device files of SDK {sdk.version} at {sdk.root} are not used",
                              "put there what runs on the device; nothing was pushed",
                              ", then run the same command again")


def plan_push(sdk: Sdk, soc: Soc, dest: str | None = None, extras: Sequence[Path] = (),
              read: ModelReader | None = None) -> Plan:
    """The files of `sdk` that `soc` needs, plus `extras`, bound for `dest` on the device; with
    `read`, each extra named like a lowered model is checked against `soc` and the runtime."""
    dest = check_dest(dest if dest is not None else default_dest(sdk.version))
    present, missing, optional = sdk_files(sdk, soc.arch)
    if missing:
        release = sdk_release(sdk)
        if release is not None and not serves(soc.arch, release):
            raise UnservableSocError(soc, sdk.version)
        raise MissingDeviceFilesError(sdk, soc, missing)
    refuse_unsafe_device_files(sdk, [path for _, path in present])
    files: list[DeviceFile] = []
    for need, path in present:
        files.append(DeviceFile(need.name, path, f"{dest}/{need.name}", path.stat().st_size, build_id(path), need.role))
    builds = {f.name: f.build_id for f in files if f.build_id is not None}
    host = read_build_id(sdk.root)
    if host is not None:
        builds["the host libraries"] = host
    if len(set(builds.values())) > 1:
        raise MixedBuildError(sdk, builds)
    names = {f.name for f in files}
    for extra in extras:
        path = Path(extra)
        if path.name in names:
            raise UsageError(f"{path} would overwrite {path.name} on the device, which is already in the set",
                             hint="rename it, or push it apart with `adb push`")
        names.add(path.name)
        files.append(DeviceFile(path.name, path.absolute(), f"{dest}/{path.name}", path.stat().st_size,
                                build_id(path), EXTRA))
    warnings = [f"{rel} is not in the SDK: the runtime warns without it" for rel in optional]
    runtime = next(iter(builds.values()), None)
    for extra in extras:
        if read is None or Path(extra).suffix not in MODEL_SUFFIXES:
            continue
        try:
            binaries = read(Path(extra))
        except NotAModelError as exc:
            warnings.append(exc.message)
            continue
        problems, _ = model_problems(binaries, soc, runtime, "the runtime pushed with it")
        warnings.extend(problems)
    return Plan(soc, sdk, dest, tuple(files), runtime, tuple(warnings))


def render_plan(plan: Plan) -> str:
    """The plan for a person or a script: one tab-separated line per file, then the exports."""
    lines = [f"{f.source}\t{f.device_path}\t{f.size}\t{f.build_id or '-'}" for f in plan.files]
    return "\n".join(lines) + "\n" + render_device_env(plan.environment(), "sh")
