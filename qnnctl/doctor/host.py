"""Doctor's checks of the host: the machine and Python, the libraries the SDK's host libraries
need (libc++, glibc) and whether they load, this shell's environment, and the CPU vendor.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from qnnctl.doctor.context import Context, Target, env_command, reinstall_hint
from qnnctl.doctor.report import FAIL, Outcome, abridged, fail, ok, warn
from qnnctl.host.elf import format_version, glibcxx_provided_by
from qnnctl.host.machine import CPUINFO, cpu_vendor, is_amd, is_supported_host
from qnnctl.host.staged import GLIBC, current, staged_loader
from qnnctl.run.api import FORCE_VENDOR_VARIABLE
from qnnctl.run.probe import HTP_BACKEND_ID
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.hosts import HOSTS, supported_names, this_host
from qnnctl.sdk.layout import REQUIRED_LIBS
from qnnctl.shell.exports import split_path

LIBCXX_RUNTIME = ("libc++.so.1", "libc++abi.so.1", "libunwind.so.1")
LIBCXX_HINT = (
    "run `qnnctl install --runtime` (stages them into qnnctl's cache, no root needed); or on "
    "Debian/Ubuntu: `sudo apt-get install libc++1-14 libc++abi1-14 libunwind-14`"
)


def check_host(ctx: Context) -> Outcome:
    python = platform.python_version()
    glibc = ctx.glibc()
    libc = f"glibc {format_version(glibc)}" if glibc else "not glibc"
    detail = f"{ctx.system} {ctx.machine}, Python {python}, {libc}"
    if not is_supported_host(ctx.system, ctx.machine):
        return fail(
            f"{detail}: the SDK's host libraries run on {supported_names()} only",
            hint=f"run qnnctl on a {supported_names()} machine or container",
        )
    if glibc is None:
        return fail(f"{detail}: the SDK's host libraries need glibc",
                    hint="use a glibc-based distribution (Debian, Ubuntu, Fedora...), not Alpine/musl")
    return ok(detail)


def missing_hint(name: str, target: Target) -> str:
    """The fix for one library the loader cannot find: for the runtime this host's libraries
    need (qnnctl.sdk.hosts), the package that provides it."""
    if name in LIBCXX_RUNTIME and this_host().cxx_runtime == "libc++":
        return LIBCXX_HINT
    package = this_host().packages.get(name)
    if package is not None:
        return f"install {name} from the system's packages (Debian/Ubuntu: `sudo apt-get install {package}`)"
    if target.lib_dir is not None and name.startswith("libQnn"):
        return reinstall_hint(target)
    return (f"install the package that provides {name} (Debian/Ubuntu: `apt-file search {name}`), "
            "or add its folder to LD_LIBRARY_PATH")


def machine_name(elf_machine: int) -> str:
    """An ELF header's e_machine for people: "x86-64", "AArch64", "ELF machine 40"."""
    names = {host.elf_machine: host.name.split()[-1] for host in HOSTS}
    return names.get(elf_machine, f"ELF machine {elf_machine}")


def check_libraries(ctx: Context) -> Outcome:
    target = ctx.require_target()
    scan = ctx.scan()
    problems: list[str] = []
    hints: list[str] = []
    host = this_host()
    for closure in (scan.required, scan.others):
        foreign = [closure.libraries[p] for p in closure.roots
                   if p in closure.libraries and closure.libraries[p].identity.machine != host.elf_machine]
        if foreign:
            kinds = sorted({machine_name(info.identity.machine) for info in foreign})
            problems.append(f"{abridged([info.path.name for info in foreign])} "
                            f"{'is' if len(foreign) == 1 else 'are'} built for {', '.join(kinds)}, "
                            f"not this {host.name} host")
            hints.append(f"use an SDK with {host.name} libraries in {host.lib_dir}; {reinstall_hint(target)}")
    if scan.absent:
        problems.append(f"{abridged(scan.absent)} not in {scan.lib_dir}")
        hints.append(reinstall_hint(target))
    for path, why in scan.required.unreadable.items():
        problems.append(f"{path.name}: {why}")
        hints.append(reinstall_hint(target))
    for name, needers in sorted(scan.required.missing.items()):
        problems.append(f"{name} not found (needed by {abridged(sorted({p.name for p in needers}), 3)})")
        hints.append(missing_hint(name, target))
    for name, why in sorted(scan.required.broken.items()):
        problems.append(f"{name}: {why}")
        hints.append(f"remove it or take its folder off LD_LIBRARY_PATH; {missing_hint(name, target)}")
    if problems:
        return fail("; ".join(problems), "; ".join(dict.fromkeys(hints)))
    optional: list[str] = []
    optional_hints: list[str] = []
    for path, why in scan.others.unreadable.items():
        optional.append(f"{path.name}: {why}")
    for name, needers in sorted(scan.others.missing.items()):
        optional.append(f"{name} not found (needed by {abridged(sorted({p.name for p in needers}), 3)})")
        optional_hints.append(missing_hint(name, target))
    for name, why in sorted(scan.others.broken.items()):
        optional.append(f"{name}: {why}")
    required = ", ".join(REQUIRED_LIBS)
    if optional:
        return warn(f"{required} resolve; other libraries do not: " + "; ".join(optional),
                    "; ".join(dict.fromkeys(optional_hints)) or None)
    others = len(scan.required.libraries) + len(scan.others.libraries) - len(scan.required.roots)
    more = f" and {others} other librar{'y' if others == 1 else 'ies'}" if others else ""
    return ok(f"{required}{more} resolve every library they need")


def glibc_verdict(highest: tuple[tuple[int, ...], Path] | None, host: tuple[int, ...] | None,
                  optional: tuple[tuple[int, ...], Path] | None = None) -> Outcome:
    """Compare the glibc the libraries need with the host's."""
    if host is None:
        return fail("the host's C library is not glibc",
                    hint="use a glibc-based distribution (Debian, Ubuntu, Fedora...)")
    have = format_version(host)
    if highest is not None and highest[0] > host:
        need = format_version(highest[0])
        return fail(
            f"{highest[1].name} needs GLIBC_{need}; this host has glibc {have}",
            hint=f"run on a distribution with glibc {need} or newer (Ubuntu 22.04, Debian 12, "
            "RHEL 9 or later), or in a container based on one",
        )
    if optional is not None and optional[0] > host:
        need = format_version(optional[0])
        return warn(f"{optional[1].name} needs GLIBC_{need}; this host has glibc {have}",
                    hint=f"it cannot be used here; run on a distribution with glibc {need} or newer")
    if highest is None:
        return ok(f"no GLIBC symbol version needed; host has glibc {have}")
    return ok(f"GLIBC_{format_version(highest[0])} needed (by {highest[1].name}); host has glibc {have}")


def check_glibc(ctx: Context) -> Outcome:
    scan = ctx.scan()
    outcome = glibc_verdict(scan.required.highest_glibc(), ctx.glibc(), scan.others.highest_glibc())
    if outcome.status != FAIL:
        return outcome
    staged = staged_glibc(ctx.cache())
    needed = scan.required.highest_glibc()
    if staged is not None and needed is not None and staged[1] >= needed[0]:
        return warn(f"{outcome.detail}; `qnnctl lower` runs pipelines under the staged glibc "
                    f"{format_version(staged[1])} ({staged[0]})",
                    hint="other programs still need `qnnctl lower` (or a newer host) to load the SDK")
    return Outcome(outcome.status, outcome.detail, (outcome.hint or "") + (
        "; or stage a newer glibc for `qnnctl lower`: `qnnctl install --runtime --runtime-from "
        "GLIBC.deb|GLIBC.rpm`"))


def check_glibcxx(ctx: Context) -> Outcome:
    """The GNU libstdc++ symbol versions (GLIBCXX_x.y.z) the SDK's libraries need, against the
    libstdc++.so.6 the loader finds for them (the aarch64 libraries need GLIBCXX_3.4.29: GCC 11's
    runtime or newer)."""
    scan = ctx.scan()
    needed: tuple[tuple[int, ...], Path] | None = None
    found: Path | None = None
    for closure in (scan.required, scan.others):
        for path, info in closure.libraries.items():
            if info.glibcxx is not None and (needed is None or info.glibcxx > needed[0]):
                needed = (info.glibcxx, path)
        for hits in closure.found.values():
            found = found or next((hit.path for hit in hits if hit.name == "libstdc++.so.6" and hit.path), None)
    if needed is None:
        return ok(f"no GLIBCXX symbol version needed (the SDK's libraries use {this_host().cxx_runtime})")
    need = f"GLIBCXX_{format_version(needed[0])}"
    package = this_host().packages.get("libstdc++.so.6", "libstdc++6")
    newer = (f"install a newer libstdc++ (Debian/Ubuntu: `sudo apt-get install {package}` from a release with "
             "GCC 11's runtime or newer: Ubuntu 22.04, Debian 12 or later)")
    if found is None:
        return fail(f"{needed[1].name} needs {need}, and the loader finds no libstdc++.so.6", hint=newer)
    have = glibcxx_provided_by(found)
    if have is None or have < needed[0]:
        upto = f"up to GLIBCXX_{format_version(have)}" if have else "no GLIBCXX version"
        return fail(f"{needed[1].name} needs {need}; {found} has {upto}", hint=newer)
    return ok(f"{need} needed (by {needed[1].name}); {found} has up to GLIBCXX_{format_version(have)}")


def staged_glibc(cache: Cache) -> tuple[Path, tuple[int, ...]] | None:
    """(loader, glibc version) of a glibc staged with `install --runtime`, as `lower` sees it."""
    if not cache.runtime.is_dir():
        return None
    found = staged_loader(cache)  # None too when the loader file has gone missing
    staged = current(cache, GLIBC)
    version = staged.glibc_version if staged is not None else None
    return (found[0], version) if found is not None and version is not None else None


def check_load(ctx: Context) -> Outcome:
    target = ctx.require_target()
    # For a caller-managed SDK this is the environment as it is: whatever it provides is
    # what a lowering would get.
    loaded = ctx.loaded()
    failures = [entry.failure for entry in loaded if not entry.ok]
    if failures:
        return fail("; ".join(failures), hint=_load_hint(ctx, target))
    offered: list[str] = []
    problems: list[str] = []
    for entry in loaded:
        if entry.function is None:
            wanted = "QnnSystemInterface_getProviders" if entry.name == "libQnnSystem.so" else \
                "QnnInterface_getProviders"
            problems.append(f"{entry.name} loads but exports no {wanted}: not a QNN library")
        elif entry.status:
            problems.append(f"{entry.name}: {entry.function} failed with error {entry.status}")
        elif not entry.providers:
            problems.append(f"{entry.name}: {entry.function} lists no provider")
        else:
            offered.append(f"{entry.name}: " + ", ".join(p.describe() for p in entry.providers))
    htp = next((e for e in loaded if e.name == "libQnnHtp.so"), None)
    if htp is not None and htp.providers and not any(p.backend_id == HTP_BACKEND_ID for p in htp.providers):
        problems.append(f"libQnnHtp.so offers no HTP provider (backend {HTP_BACKEND_ID})")
    if problems:
        return fail("; ".join(problems + offered), hint=reinstall_hint(target))
    expected = os.path.realpath(target.lib_dir) if target.lib_dir else None
    elsewhere = [
        f"{entry.name} from {entry.path}"
        for entry in loaded
        if entry.path and expected and os.path.dirname(os.path.realpath(entry.path)) != expected
    ]
    if elsewhere:
        return warn(f"loads, but {'; '.join(elsewhere)}, not from {target.lib_dir}",
                    hint="remove the other SDK's folder from LD_LIBRARY_PATH")
    return ok(f"{' and '.join(REQUIRED_LIBS)} load in a fresh process; " + "; ".join(offered))


def _load_hint(ctx: Context, target: Target) -> str:
    """The fix for a failed load: the library check's hint when it has one."""
    try:
        libraries = check_libraries(ctx)
        glibc = check_glibc(ctx)
    except Exception:
        return reinstall_hint(target)
    hints = [o.hint for o in (libraries, glibc) if o.status == FAIL and o.hint]
    return "; ".join(hints) if hints else "see the libraries and glibc checks"


def check_environment(ctx: Context) -> Outcome:
    target = ctx.require_target()
    if target.sdk is None:
        if target.lib_dir is None:
            return warn(
                "QNN_SDK_ROOT is exported but empty, and no folder on LD_LIBRARY_PATH holds libQnnHtp.so",
                hint=f"add the SDK's {this_host().lib_dir} to LD_LIBRARY_PATH, or unset QNN_SDK_ROOT and "
                "run `eval \"$(qnnctl env)\"`",
            )
        return ok(f"the caller manages the SDK; LD_LIBRARY_PATH holds {target.lib_dir}")
    wanted = ctx.env_values()
    wrong: list[str] = []
    want_root = wanted.get("QNN_SDK_ROOT")
    have_root = ctx.environ.get("QNN_SDK_ROOT")
    if want_root is not None and have_root != want_root:
        wrong.append("QNN_SDK_ROOT is not set" if have_root is None else f"QNN_SDK_ROOT is {have_root}")
    have_path = split_path(ctx.environ.get("LD_LIBRARY_PATH"))
    lacking = [e for e in split_path(wanted.get("LD_LIBRARY_PATH")) if e not in have_path]
    if lacking:
        wrong.append(f"LD_LIBRARY_PATH lacks {abridged(lacking, 3)}")
    if wrong:
        return warn(f"this shell is not set up for {target.sdk.root}: " + "; ".join(wrong),
                    hint=env_command(ctx.spec, target) + " (qnnctl lower sets it up by itself)")
    return ok(f"QNN_SDK_ROOT and LD_LIBRARY_PATH point at {target.sdk.root}")


def check_cpu(ctx: Context) -> Outcome:
    # The same answer the AMD guard of `qnnctl lower` will get.
    if ctx.machine != "x86_64":
        return ok(f"{ctx.machine}: `qnnctl lower` has no MKLDNN guard to arm here (it is for AMD x86 CPUs)")
    forced = ctx.environ.get(FORCE_VENDOR_VARIABLE) or None
    try:
        vendor = forced or cpu_vendor()
    except ModuleNotFoundError as exc:
        if exc.name != "cpuinfo":
            raise
        return warn(f"{CPUINFO} cannot be read and py-cpuinfo is not installed: the CPU vendor is unknown, "
                    "so `qnnctl lower` cannot turn MKLDNN off on AMD", hint="pip install py-cpuinfo")
    if vendor is None:
        return warn(f"{CPUINFO} names no CPU vendor; `qnnctl lower` leaves MKLDNN as it is")
    name = f"{vendor} (from {FORCE_VENDOR_VARIABLE})" if forced else vendor
    if is_amd(vendor):
        return ok(f"{name}: `qnnctl lower` turns PyTorch's MKLDNN off for the pipeline (it can "
                  "crash on AMD CPUs during calibration)")
    return ok(name)
