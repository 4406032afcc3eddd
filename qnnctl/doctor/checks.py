"""`qnnctl doctor`: every reason the SDK will not load, each with the command that fixes it.

Each check is a small function of a `Context` that returns an `Outcome`. The checks run one
after another and independently: one that raises becomes a `fail` (or a `skip`) and the rest
still run. One list of results feeds the JSON, the plain text and the table, so they agree.
"""

from __future__ import annotations

import logging
import os
import platform
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qnnctl.doctor.context import (
    Check,
    Context,
    Target,
    env_command,
    is_library_name,
    reinstall_hint,
)
from qnnctl.doctor.report import (
    FAIL,
    SKIP,
    STATUSES,
    Outcome,
    Result,
    Skip,
    abridged,
    fail,
    ok,
    warn,
)
from qnnctl.errors import IntegrityError, NotInstalledError, QnnctlError, UsageError
from qnnctl.net.urls import redact
from qnnctl.run.probe import HTP_BACKEND_ID
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, read_manifest
from qnnctl.sdk.holds import HOLDS_FOLDER, describe_holders, held_by
from qnnctl.sdk.layout import HOST_BIN_DIR, HOST_LIB_DIR, REQUIRED_LIBS, missing_layout
from qnnctl.sdk.select import BY_INSTALLED, BY_SHELL, changed_link_error, pin_conflict, select_sdk
from qnnctl.shell.exports import split_path
from qnnctl.words import plural

log = logging.getLogger("qnnctl.doctor.checks")

NETWORK_TIMEOUT = 5.0
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
LIBCXX_RUNTIME = ("libc++.so.1", "libc++abi.so.1", "libunwind.so.1")
LIBCXX_HINT = (
    "run `qnnctl install --runtime` (stages them into qnnctl's cache, no root needed); or on "
    "Debian/Ubuntu: `sudo apt-get install libc++1-14 libc++abi1-14 libunwind-14`"
)

def _is_program(path: Path) -> bool:
    """An ELF executable or a script: what must keep its exec bit (data files need not)."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return False
    return head == b"\x7fELF" or head.startswith(b"#!")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


# -- the checks ------------------------------------------------------------------------------


def check_host(ctx: Context) -> Outcome:
    from qnnctl.host.elf import format_version
    from qnnctl.host.machine import SUPPORTED_HOST, is_supported_host

    python = platform.python_version()
    glibc = ctx.glibc()
    libc = f"glibc {format_version(glibc)}" if glibc else "not glibc"
    detail = f"{ctx.system} {ctx.machine}, Python {python}, {libc}"
    if not is_supported_host(ctx.system, ctx.machine):
        return fail(
            f"{detail}: the SDK's host libraries run on {SUPPORTED_HOST} only",
            hint=f"run qnnctl on a {SUPPORTED_HOST} machine or container",
        )
    if glibc is None:
        return fail(f"{detail}: the SDK's host libraries need glibc",
                    hint="use a glibc-based distribution (Debian, Ubuntu, Fedora...), not Alpine/musl")
    return ok(detail)


def check_selection(ctx: Context) -> Outcome:
    selection = select_sdk(ctx.spec, ctx.environ, ctx.cwd, ctx.cache())
    why = f"{selection.reason}: {selection.detail}"
    if selection.caller_managed:
        lib_dir = ctx.target().lib_dir
        where = f"libraries from {lib_dir}" if lib_dir else "no folder on LD_LIBRARY_PATH holds libQnnHtp.so"
        return ok(f"{why}; checking LD_LIBRARY_PATH as it is ({where})")
    try:
        sdk = ctx.target().sdk
    except (NotInstalledError, IntegrityError) as exc:
        return fail(f"{why}; {exc.message}", exc.hint)
    if sdk is None:  # pragma: no cover - only a caller-managed selection has no SDK
        return ok(why)
    if selection.root is not None:
        conflict = pin_conflict(ctx.environ, ctx.cwd, ctx.cache()) if selection.reason == BY_SHELL else None
        if conflict is not None:
            return warn(f"{why}: {sdk.root}, version {sdk.version}; {conflict.said()}", hint=conflict.switch())
        return ok(f"{why}: {sdk.root}, version {sdk.version}")
    if selection.reason == BY_INSTALLED:
        # Chosen only because nothing named another: the next install could change it.
        return ok(f"{why}; {sdk.version} at {sdk.root} ({sdk.origin})",
                  hint=f"pin it for this project so that it stays the choice: `qnnctl use {sdk.version}`")
    return ok(f"{why}; {sdk.version} at {sdk.root} ({sdk.origin})")


def check_layout(ctx: Context) -> Outcome:
    """Judged by what is there and what it is for: the host libraries are what a lowering
    needs; headers and tools are for building and running natively, and their absence is said."""
    target = ctx.require_target()
    sdk = ctx.require_sdk()
    problems: list[str] = []
    fixes: list[str] = []
    lib_dir = sdk.lib_dir
    missing = [f"{HOST_LIB_DIR}/{n}" for n in REQUIRED_LIBS if not (lib_dir / n).is_file()]
    if missing:
        problems.append("missing " + abridged(missing))
        fixes.append(reinstall_hint(target))
    tools = sorted(p for p in sdk.bin_dir.iterdir() if _is_program(p)) if sdk.bin_dir.is_dir() else []
    not_exec = [p for p in tools if not os.access(p, os.X_OK)]
    if not_exec:
        problems.append("not executable: " + abridged([p.name for p in not_exec]))
        fixes.append("chmod +x " + " ".join(shlex.quote(str(p)) for p in not_exec))
    if sdk.bin_dir.is_dir() and not tools:
        problems.append(f"no tools in {HOST_BIN_DIR}")
        fixes.append(reinstall_hint(target))
    if problems:
        return fail(f"{sdk.root}: " + "; ".join(problems), "; ".join(dict.fromkeys(fixes)))
    libs = sum(1 for p in lib_dir.iterdir() if is_library_name(p.name))
    has = [f"{libs} host libraries"]
    cannot: list[str] = []
    if tools:
        has.append(f"{len(tools)} tool{'' if len(tools) == 1 else 's'} (executable)")
    else:
        cannot.append(f"no {HOST_BIN_DIR} (no qnn-net-run or qnn-context-binary-generator)")
    if (sdk.root / "include" / "QNN").is_dir():
        has.append("include/QNN")
    else:
        cannot.append("no include/QNN (nothing to compile native code against)")
    if cannot:
        return ok(", ".join(has) + ": enough for lowering with ExecuTorch's Python flow; " + "; ".join(cannot))
    return ok(", ".join(has))


def check_version(ctx: Context) -> Outcome:
    """The build id the libraries carry is what loads; every other label must agree with it."""
    from qnnctl.sdk.identity import version_of_build
    from qnnctl.sdk.layout import read_build_id, version_claims

    target = ctx.require_target()
    sdk = ctx.require_sdk()
    build = read_build_id(sdk.root)
    claims = version_claims(sdk.root)
    wanted = target.selection.version
    if build is None:
        if not claims:
            return warn(
                f"cannot tell the version of {sdk.root}: its libraries carry no build id, and "
                "neither sdk.yaml nor the folder's name names a version",
                hint="use the folder as unpacked from the archive (qairt/<version>), or install it "
                "with `qnnctl install --file ARCHIVE`",
            )
        (source, version), *_ = claims.items()
        others = {name: v for name, v in claims.items() if v != version}
        if others:
            return warn(f"{version} (from {source}), but " + _named(others)
                        + "; its libraries carry no build id to settle it", hint=reinstall_hint(target))
        if wanted is not None and wanted != version:
            return warn(f"{version} (from {source}), but it was selected as {wanted}", hint=reinstall_hint(target))
        return ok(f"{version} (from {source}; its libraries carry no build id)")
    from qnnctl.sdk.identity import sdk_build_ids

    builds = sdk_build_ids(sdk.lib_dir)
    if len(set(builds.values())) > 1:
        return fail("its libraries are of more than one build: "
                    + ", ".join(f"{name} is {b}" for name, b in builds.items())
                    + "; a process loading them together fails (`Stub lib id mismatch` and the like)",
                    hint=f"reinstall the SDK whole; {reinstall_hint(target)}")
    true = version_of_build(build)
    wrong = {name: v for name, v in claims.items() if v != true}
    if wanted is not None and wanted != true:
        wrong.setdefault("the selection", wanted)
    if wrong:
        return fail(
            f"its libraries are build {build} (SDK {true}), but {_named(wrong)}: the libraries are "
            "what a lowering loads",
            hint=f"use an SDK whose labels and libraries agree; {reinstall_hint(target)}",
        )
    names = list(claims)
    said = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    agreeing = f", as {said} say{'s' if len(names) == 1 else ''}" if names else ""
    return ok(f"{true}: its libraries are build {build}{agreeing}")


def _named(claims: Mapping[str, str]) -> str:
    """`sdk.yaml says 2.37.0.250724 and the folder name says 2.34.0.250424`."""
    return " and ".join(f"{name} says {version}" for name, version in claims.items())


def check_manifest(ctx: Context) -> Outcome:
    from qnnctl.run.environment import pin_gap
    from qnnctl.sdk.components import install_command

    target = ctx.require_target()
    sdk = ctx.require_sdk()
    path = sdk.root / MANIFEST_NAME
    if not path.exists():
        if sdk.origin == "qnnctl cache":
            return fail(f"{path} is missing", reinstall_hint(target))
        raise Skip(f"no manifest: not installed by qnnctl ({sdk.origin})")
    manifest = read_manifest(sdk.root)
    if manifest is None:
        return fail(f"{path} cannot be read as JSON", reinstall_hint(target))
    files = manifest.get("files")
    count = len(files) if isinstance(files, dict) else 0
    # Earlier qnnctl releases recorded the URL as it was given, password and token included.
    source = redact(str(manifest.get("source", "?")))
    detail = f"installed {manifest.get('installed_at', '?')} from {source}, {count} files recorded"
    detail += _parts_detail(manifest)
    gap = pin_gap(target.selection, manifest, ctx.cwd)
    if gap is not None:
        return warn(f"{detail}; {gap.pin} asks for {', '.join(gap.lacking)}, which it lacks",
                    f"`{install_command(sdk.version, gap.lacking)}`")
    if manifest.get("version") not in (None, sdk.version):
        return warn(f"{detail}; it names version {manifest.get('version')}, not {sdk.version}",
                    reinstall_hint(target))
    if not count:
        return warn(f"{detail}: no per-file digests, so --verify cannot check it",
                    reinstall_hint(target))
    return ok(detail)


def _parts_detail(manifest: Mapping[str, Any]) -> str:
    """Which components an SDK holds, and what vouches for one fetched in parts."""
    from qnnctl.sdk.components import installed_components

    held = installed_components(manifest)
    detail = "" if held == ("all",) else f"; components {', '.join(held)} (not the whole archive)"
    if manifest.get("partial") is True:
        cd = manifest.get("central_directory_sha256")
        detail += ("; fetched in parts (Range requests) from the archive whose central directory has sha256 "
                   f"{cd if isinstance(cd, str) else 'unrecorded'}; each component's files were hashed as they "
                   "were written, and checked against a lock or mirror index where one pinned them")
    return detail


def check_verify(ctx: Context) -> Outcome:
    from qnnctl.install.archive import digest_matches

    target = ctx.require_target()
    sdk = ctx.require_sdk()
    manifest = read_manifest(sdk.root)
    files = manifest.get("files") if manifest else None
    if not isinstance(files, dict) or not files:
        raise Skip("no per-file digests recorded for this SDK")
    if not ctx.verify:
        raise Skip(f"not requested ({len(files)} files recorded)",
                   hint="`qnnctl doctor --verify` checks them")
    changed: list[str] = []
    missing: list[str] = []
    for rel, digest in sorted(files.items()):
        path = sdk.root / rel
        if not path.is_file():
            missing.append(rel)
        elif not isinstance(digest, str) or not digest_matches(path, digest):
            changed.append(rel)
    if changed or missing:
        parts = []
        if changed:
            parts.append(f"{len(changed)} changed ({abridged(changed)})")
        if missing:
            parts.append(f"{len(missing)} missing ({abridged(missing)})")
        return fail("; ".join(parts) + f" of {len(files)} files ({_compared(files)})", reinstall_hint(target))
    return ok(f"all {len(files)} files match their digests ({_compared(files)})")


def _compared(files: Mapping[str, object]) -> str:
    """What --verify compared: sha256s (manifests from this qnnctl on), or CRC-32s only, which
    an earlier qnnctl recorded and which tell damage from a forgery no better than the loader."""
    from qnnctl.install.archive import digest_kind

    kinds = {digest_kind(d) for d in files.values() if isinstance(d, str)}
    if kinds == {"sha256"}:
        return "by sha256"
    if kinds == {"CRC-32"}:
        return "by CRC-32 only: recorded by an earlier qnnctl; reinstall for sha256s"
    return "by sha256, some by CRC-32 only"


def missing_hint(name: str, target: Target) -> str:
    """The fix for one library the loader cannot find."""
    if name in LIBCXX_RUNTIME:
        return LIBCXX_HINT
    if target.lib_dir is not None and name.startswith("libQnn"):
        return reinstall_hint(target)
    return (f"install the package that provides {name} (Debian/Ubuntu: `apt-file search {name}`), "
            "or add its folder to LD_LIBRARY_PATH")


def check_libraries(ctx: Context) -> Outcome:
    target = ctx.require_target()
    scan = ctx.scan()
    problems: list[str] = []
    hints: list[str] = []
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
    from qnnctl.host.elf import format_version

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
        from qnnctl.host.elf import format_version

        return warn(f"{outcome.detail}; `qnnctl lower` runs pipelines under the staged glibc "
                    f"{format_version(staged[1])} ({staged[0]})",
                    hint="other programs still need `qnnctl lower` (or a newer host) to load the SDK")
    return Outcome(outcome.status, outcome.detail, (outcome.hint or "") + (
        "; or stage a newer glibc for `qnnctl lower`: `qnnctl install --runtime --runtime-from "
        "GLIBC.deb|GLIBC.rpm`"))


def staged_glibc(cache: Cache) -> tuple[Path, tuple[int, ...]] | None:
    """(loader, glibc version) of a glibc staged with `install --runtime`, as `lower` sees it."""
    if not cache.runtime.is_dir():
        return None
    from qnnctl.host.runtime import GLIBC, current, staged_loader

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
                hint=f"add the SDK's {HOST_LIB_DIR} to LD_LIBRARY_PATH, or unset QNN_SDK_ROOT and "
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


def executorch_version(package_dir: Path) -> str | None:
    """The installed ExecuTorch's version, from its dist-info, without importing it."""
    import importlib.metadata

    for dist in importlib.metadata.distributions(path=[str(package_dir.parent)]):
        if (dist.metadata["Name"] or "").lower() == "executorch":
            return str(dist.version)
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_executorch(ctx: Context) -> Outcome:
    from qnnctl.sdk.select import executorch_expected_version, executorch_package_dir
    from qnnctl.sdk.versions import parse_version

    package_dir = executorch_package_dir()
    if package_dir is None:
        raise Skip(f"ExecuTorch is not installed for {sys.executable}")
    version = executorch_version(package_dir) or "of unknown version"
    expected = executorch_expected_version(package_dir)
    name = f"ExecuTorch {version} ({package_dir})"
    if expected is None:
        return warn(f"{name}: cannot tell which SDK version it expects")
    sdk_version = ctx.sdk_version()
    if sdk_version is None:
        return warn(f"{name} expects SDK {expected}; the selected SDK's version is unknown",
                    hint=f"`qnnctl install {expected}`, then {env_command(expected)}")
    from qnnctl.sdk.compat import known_pairing

    fix = (f"`qnnctl install {expected}`, then `qnnctl use {expected}` to pin it here "
           f"(or {env_command(expected)})")
    what = f"{name} expects SDK {expected}, the selected SDK is {sdk_version}"
    known = known_pairing(version, sdk_version) if version[:1].isdigit() else None
    if known is not None and not known.works:
        return fail(f"{what}: {known.consequence} (seen {known.seen}: {known.evidence})", hint=fix)
    if parse_version(expected).major_minor != parse_version(sdk_version).major_minor:
        return warn(
            f"{what}: another minor version than it was built for; context binaries are tied to the "
            "build that made them, so a .pte compiled here may not run with the SDK on the device",
            hint=fix,
        )
    return ok(f"{name} expects SDK {expected}; the selected SDK is {sdk_version}")


def onnxruntime_qnn_version() -> str | None:
    """The installed onnxruntime-qnn's version, from its dist-info, without importing it."""
    import importlib.metadata

    try:
        return importlib.metadata.version("onnxruntime-qnn")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_onnxruntime(ctx: Context) -> Outcome:
    from qnnctl.sdk.compat import ep_requirement

    version = onnxruntime_qnn_version()
    if version is None:
        raise Skip(f"onnxruntime-qnn is not installed for {sys.executable}")
    name = f"onnxruntime-qnn {version}"
    ctx.require_target()
    row = ep_requirement(version)
    if row is None:
        return ok(f"{name}: no known requirement of the SDK's QNN API version")
    try:
        loaded = ctx.loaded()
    except Exception:
        loaded = []
    htp = next((e for e in loaded if e.name == "libQnnHtp.so" and e.ok), None)
    core = next((p.core_api for p in (htp.providers if htp else ()) if p.backend_id == HTP_BACKEND_ID and p.core_api),
                None)
    wanted = f"QNN core API {row.core_api[0]}.{row.core_api[1]} (QAIRT {row.qairt})"
    if core is None:
        return warn(f"{name} needs {wanted}; the selected SDK's libQnnHtp.so did not load, so its API "
                    "version is unknown (see the load check)")
    have = tuple(int(x) for x in core.split(".")[:2])
    if have < row.core_api:
        return warn(f"{name} needs {wanted}, the selected SDK's libQnnHtp.so offers core API {core}: "
                    f"{row.consequence} (seen {row.seen}: {row.evidence})",
                    hint=f"`qnnctl install {row.qairt}` and lower with it, or give the provider option "
                    "skip_qnn_version_check=\"1\"")
    return ok(f"{name} needs {wanted}; the selected SDK's libQnnHtp.so offers core API {core}")


def check_cpu(ctx: Context) -> Outcome:
    from qnnctl.host.machine import cpu_vendor, is_amd
    from qnnctl.run.api import FORCE_VENDOR_VARIABLE

    # The same answer the AMD guard of `qnnctl lower` will get.
    forced = ctx.environ.get(FORCE_VENDOR_VARIABLE) or None
    try:
        vendor = forced or cpu_vendor()
    except ModuleNotFoundError as exc:
        if exc.name != "cpuinfo":
            raise
        return warn("py-cpuinfo is not installed: the CPU vendor is unknown, so `qnnctl lower` "
                    "cannot turn MKLDNN off on AMD", hint="pip install py-cpuinfo")
    if vendor is None:
        return warn("py-cpuinfo reported no CPU vendor; `qnnctl lower` leaves MKLDNN as it is")
    name = f"{vendor} (from {FORCE_VENDOR_VARIABLE})" if forced else vendor
    if is_amd(vendor):
        return ok(f"{name}: `qnnctl lower` turns PyTorch's MKLDNN off for the pipeline (it can "
                  "crash on AMD CPUs during calibration)")
    return ok(name)


def check_cache(ctx: Context) -> Outcome:
    import shutil

    cache = ctx.cache()
    root = cache.root
    existing = root
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return fail(f"{existing} is not a folder, so the cache {root} cannot be created",
                    hint="point QNNCTL_CACHE_DIR at a writable folder")
    read_only = not os.access(existing, os.W_OK | os.X_OK)
    if read_only and (existing != root or not os.access(root, os.R_OK | os.X_OK)):
        return fail(f"{existing} is not writable" + ("" if existing == root else f" (cache {root})"),
                    hint="point QNNCTL_CACHE_DIR at a writable folder")
    free = shutil.disk_usage(existing).free
    where = str(root) if existing == root else f"{root} (not created yet)"
    problems: list[str] = []
    hints: list[str] = []
    if read_only:
        # A shared cache, filled by its owner: `env` and `lower` use its SDKs as they are.
        installed = cache.installed_versions()
        problems.append(f"read-only for you ({plural(len(installed), 'SDK')}: env, lower and doctor use "
                        "them); install, uninstall, `cache clean` and staging a runtime cannot write here")
        hints.append("to install, point QNNCTL_CACHE_DIR at a folder of your own, or ask the "
                     "cache's owner to run `qnnctl install VERSION`")
    elif free < ctx.space_needed:
        problems.append(f"{_gib(free)} free; an SDK install needs about {_gib(ctx.space_needed)}")
        hints.append("free some space, or point QNNCTL_CACHE_DIR at a larger disk")
    partial = cache.partial_downloads()
    records = cache.stray_download_records()
    stale = cache.stale_tmp()
    if partial or records or stale:
        size = sum(p.stat().st_size for p in partial)
        leftovers = []
        if partial:
            leftovers.append(f"{plural(len(partial), 'partial download')} ({size / (1 << 20):.0f} MiB: "
                             f"{abridged([p.name for p in partial], 3)})")
        if records:
            leftovers.append(f"{plural(len(records), 'record')} of downloads that did not finish "
                             f"({abridged([p.name for p in records], 3)})")
        if stale:
            leftovers.append(f"{plural(len(stale), 'folder')} left by interrupted installs in {cache.tmp}")
        problems.append(", ".join(leftovers))
        hints.append("`qnnctl install` resumes a partial download; `qnnctl cache clean` removes them")
    for version, state, holders in _held_and_gone(cache):
        problems.append(f"SDK {version} is in use by {holders}, but {state}: removed by hand or by a qnnctl "
                        "that did not know holds; those processes may fail to load a library")
        hints.append(f"let them end, then `qnnctl install --force {version}`")
    staged = ""
    if cache.runtime.is_dir():
        from qnnctl.host.runtime import staged_runtimes

        names = [s.name for s in staged_runtimes(cache)]
        staged = f"; staged host runtime: {', '.join(names)} (used by env and lower)" if names else ""
    if problems:
        return warn(f"{where}: " + "; ".join(problems) + staged, "; ".join(hints))
    return ok(f"{where}: writable, {_gib(free)} free{staged}")


def _held_and_gone(cache: Cache) -> list[tuple[str, str, str]]:
    """(version, what is wrong, its holders) for each SDK that a running process holds and that is
    no longer whole in the cache.

    qnnctl itself never leaves this: uninstall and a reinstall move an SDK out of sdks/ (one
    rename) only while they hold its exclusive lock, which no hold can share, and a new hold
    checks that the SDK is still there once it has its lock; an interrupted uninstall leaves the
    half-removed folder in tmp/, which nothing holds. A folder removed by hand, or by an older
    qnnctl, under a running pipeline is what this finds.
    """
    folder = cache.root / HOLDS_FOLDER
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.hold")):
        version = path.name.removesuffix(".hold")
        root = cache.sdk_dir(version)
        if not (root / MANIFEST_NAME).is_file():
            state = f"{root} is gone"
        elif missing := missing_layout(root):
            state = f"{root} is missing {', '.join(missing)}"
        else:
            continue
        holders = held_by(cache, version)
        if holders:
            found.append((version, state, describe_holders(holders)))
    return found


def check_network(ctx: Context) -> Outcome:
    if ctx.offline:
        raise Skip("--offline")
    import requests

    from qnnctl.net.download import make_session
    from qnnctl.net.retry import describe
    from qnnctl.net.urls import check_url
    from qnnctl.sdk.versions import DEFAULT_BASE_URL, DEFAULT_VERSION, archive_urls, is_full_version

    mirror = ctx.environ.get("QNNCTL_MIRROR") or None
    if mirror is not None:
        try:
            # As install would refuse it, before a request: the parser's words would quote a
            # misplaced password.
            check_url(mirror, "QNNCTL_MIRROR", allow_file=False)
        except QnnctlError as exc:
            return fail(exc.message, exc.hint)
    try:
        target: Target | None = ctx.target()
    except Exception:
        target = None
    # The archive of the SDK selected: the one an SDK named by its folder (this shell's, a
    # QNN_SDK_ROOT) is, else the one named but not installed; qnnctl's default only when
    # nothing was selected at all.
    version: str | None = None
    if target is not None:
        version = target.selection.version or (target.sdk.version if target.sdk is not None else None)
    else:
        try:
            version = select_sdk(ctx.spec, ctx.environ, ctx.cwd, ctx.cache()).version
        except Exception:
            version = None
    if version is None and ctx.spec is None:
        version = DEFAULT_VERSION
    url = archive_urls(version, mirror)[0] if version and is_full_version(version) else (mirror or DEFAULT_BASE_URL)
    shown = redact(url)  # people paste doctor's report into bug reports
    installed = target is not None and (target.sdk is not None or target.selection.caller_managed)

    session = make_session()
    # What requests will do for this URL, from the same environment variables.
    settings = session.merge_environment_settings(url, {}, None, None, None)
    proxy = requests.utils.select_proxy(url, settings.get("proxies", {}))
    proxy_vars = [name for name in PROXY_VARS if ctx.environ.get(name)]
    no_proxy = ctx.environ.get("NO_PROXY") or ctx.environ.get("no_proxy")
    if proxy:
        via = f"through proxy {redact(proxy)} (from {', '.join(proxy_vars) or 'the system settings'})"
    elif proxy_vars and no_proxy:
        via = f"directly: NO_PROXY={no_proxy} covers it ({', '.join(proxy_vars)} set)"
    elif proxy_vars:
        via = f"directly ({', '.join(proxy_vars)} set, none for {url.split(':', 1)[0]})"
    else:
        via = "directly (no proxy variable set)"
    verify = settings.get("verify")
    if isinstance(verify, str) and url.startswith("https:"):
        via += f", CA bundle {verify}"
    source = "the mirror (QNNCTL_MIRROR)" if mirror else "the download host"
    try:
        with session:
            response = session.head(url, timeout=NETWORK_TIMEOUT, allow_redirects=False)
    except requests.exceptions.SSLError as exc:
        outcome = fail
        detail = f"TLS to {source} {shown} failed {via}: {describe(exc)}"
        hint = "set REQUESTS_CA_BUNDLE to your organisation's CA bundle"
    except requests.exceptions.ProxyError as exc:
        outcome = fail
        detail = f"the proxy refused the request for {shown}: {describe(exc)}"
        hint = "check HTTPS_PROXY / HTTP_PROXY (and NO_PROXY)"
    except requests.RequestException as exc:
        outcome = fail
        detail = f"cannot reach {source} {shown} {via}: {describe(exc)}"
        hint = "check the network, HTTPS_PROXY and NO_PROXY; set QNNCTL_MIRROR for a mirror"
    else:
        status = response.status_code
        detail = f"{source} answered HTTP {status} for {shown}, {via}"
        if status == 404:
            return warn(detail, hint="the archive is not there; check the version or QNNCTL_MIRROR")
        if status in (401, 403, 407) or status >= 500:
            return warn(detail, hint="check proxy credentials and access to the download host")
        return ok(detail)
    if installed:
        # The SDK is already on disk: nothing needs the network until the next install.
        return warn(detail + " (the SDK is already installed)", hint + "; `--offline` skips this check")
    return outcome(detail, hint)


def check_lock(ctx: Context) -> Outcome:
    """The project's qnnctl.lock: present, matching the selected SDK, or stale."""
    from qnnctl.fleet.lockfile import LOCK_FILE, compare, find_lock, read_lock, unchecked

    path = find_lock(ctx.cwd)
    if path is None:
        raise Skip(f"no {LOCK_FILE} in {ctx.cwd} or above it",
                   hint="`qnnctl lock` pins the SDK's version and checksums for this project")
    lock = read_lock(path)
    pins = f"{path} pins SDK {lock.version} (sha256 {lock.sha256})"
    try:
        target: Target | None = ctx.target()
    except NotInstalledError:
        target = None
    if target is not None and target.sdk is None:
        raise Skip(f"{pins}; the caller manages the SDK (QNN_SDK_ROOT is exported but empty)")
    selection = target.selection if target is not None else select_sdk(ctx.spec, ctx.environ, ctx.cwd, ctx.cache())
    sdk = target.sdk if target is not None else None
    version = selection.version or (sdk.version if sdk is not None else None)
    if version is None:  # pragma: no cover - a selection names a version or a root
        raise Skip(f"{pins}; no SDK selected")
    if version != lock.version:
        return warn(f"stale: {pins}, but the selected SDK is {version} ({selection.reason}: {selection.detail})",
                    hint=f"`qnnctl lock {version}` locks the selected SDK; `qnnctl use {lock.version}` selects "
                    "the locked one")
    if sdk is None:
        return ok(f"present: {pins}; not installed yet: `qnnctl install` checks the archive against it")
    problems, how = compare(lock, sdk)
    if problems:
        return fail("; ".join(problems), hint=f"`qnnctl install --force {version}` reinstalls the locked archive; "
                    f"`qnnctl lock {version}` trusts the SDK in use instead")
    if how is None:
        return warn(f"present: {pins}; {unchecked(lock, sdk)}",
                    hint=f"`qnnctl lock {version}` writes the lock again with each component's digest; "
                    f"`qnnctl install --force {version}` installs a checked copy into qnnctl's cache")
    return ok(f"matching: {pins}; the SDK at {sdk.root} ({sdk.origin}) matches by {how}")


def check_stores(ctx: Context) -> Outcome:
    """The read-only stores of QNNCTL_STORES and the links of `qnnctl link`."""
    from qnnctl.sdk.stores import STORES_VARIABLE, all_links, store_dirs, store_problem, store_sdks, unsafe_store_sdks

    stores = store_dirs(ctx.environ)
    links = all_links(ctx.cache())
    if not stores and not links:
        raise Skip(f"no {STORES_VARIABLE} set and no SDK linked",
                   hint=f"{STORES_VARIABLE}=DIR:... shares read-only SDK folders; `qnnctl link PATH` adopts one")
    found: dict[Path, list[str]] = {}
    for stored in store_sdks(ctx.environ):
        found.setdefault(stored.store, []).append(stored.version)
    parts: list[str] = []
    problems: list[str] = []
    hints: list[str] = []
    unsafe: list[str] = []  # a failure, not a warning: what another user could change
    for store in stores:
        problem = store_problem(store)
        if problem is not None:
            unsafe.append(f"store {store} is not used: {problem.folder} {problem.why}")
            hints.append(f"{problem.fix}, or take the store out of {STORES_VARIABLE}")
        elif not os.path.isdir(store):
            problems.append(f"store {store} is not there (or is no folder you may enter)")
            hints.append(f"mount it, or take it out of {STORES_VARIABLE}")
        elif not os.access(store, os.R_OK | os.X_OK):
            problems.append(f"store {store} cannot be read")
            hints.append(f"check its permissions, or take it out of {STORES_VARIABLE}")
        else:
            versions = found.get(store, [])
            writable = os.access(store, os.W_OK)
            parts.append(f"store {store}: {plural(len(versions), 'SDK')}"
                         + (f" ({abridged(versions, 3)})" if versions else "")
                         + ("" if writable else ", read-only"))
    dangling = [link for link in links if link.dangling]
    if links:
        parts.append(f"{plural(len(links) - len(dangling), 'linked SDK')}"
                     + (f" ({abridged([f'{lk.version} at {lk.root}' for lk in links if not lk.dangling], 3)})"
                        if len(links) > len(dangling) else ""))
    for link in dangling:
        problems.append(f"SDK {link.version} is linked to {link.root}, which is gone (or is no SDK root): not used")
        hints.append(f"`qnnctl link NEWPATH` links its new place; `qnnctl uninstall {link.version}` drops the link")
    for link in links:
        changed = None if link.dangling else changed_link_error(link.version, link.root, link.build_id)
        if changed is not None:
            problems.append(changed.message)
            hints.append(changed.hint or "")
    for root, problem in unsafe_store_sdks(ctx.environ):
        unsafe.append(f"SDK folder {root} is not used: {problem.folder} {problem.why}")
        hints.append(problem.fix)
    if unsafe:
        return fail("; ".join(unsafe + problems + parts) + "; another user could put code there that runs as you",
                    "; ".join(dict.fromkeys(hints)))
    if problems:
        return warn("; ".join(problems + parts), "; ".join(dict.fromkeys(hints)))
    return ok("; ".join(parts))


CHECKS: tuple[tuple[str, Check], ...] = (
    ("host", check_host),
    ("sdk.selection", check_selection),
    ("sdk.layout", check_layout),
    ("sdk.version", check_version),
    ("sdk.manifest", check_manifest),
    ("sdk.verify", check_verify),
    ("libraries", check_libraries),
    ("glibc", check_glibc),
    ("load", check_load),
    ("environment", check_environment),
    ("executorch", check_executorch),
    ("onnxruntime", check_onnxruntime),
    ("cpu", check_cpu),
    ("cache", check_cache),
    ("network", check_network),
    ("lock", check_lock),
    ("stores", check_stores),
)


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def run_check(check_id: str, check: Check, ctx: Context) -> Result:
    """Run one check; whatever it raises becomes its result, never the end of the report."""
    try:
        outcome = check(ctx)
    except Skip as skip:
        outcome = Outcome(SKIP, skip.detail, skip.hint)
    except QnnctlError as exc:
        outcome = Outcome(FAIL, exc.message, exc.hint)
    except Exception as exc:
        import traceback

        log.debug("check %s raised:\n%s", check_id, traceback.format_exc().rstrip())
        outcome = Outcome(
            FAIL,
            f"the check itself failed: {type(exc).__name__}: {exc}",
            "this is a bug in qnnctl; `qnnctl -vv doctor` shows the traceback",
        )
    if outcome.status not in STATUSES:
        outcome = Outcome(FAIL, f"the check returned an unknown status {outcome.status!r}")
    hint = _one_line(outcome.hint) if outcome.hint else None
    return Result(check_id, outcome.status, _one_line(outcome.detail), hint)


def run_checks(ctx: Context, checks: Sequence[tuple[str, Check]] = CHECKS) -> list[Result]:
    results = []
    for check_id, check in checks:
        log.debug("checking %s", check_id)
        results.append(run_check(check_id, check, ctx))
    return results


def diagnose(
    spec: str | None,
    environ: Mapping[str, str],
    cwd: Path,
    offline: bool = False,
    verify: bool = False,
    device: str | None = None,
    models: Sequence[Path] = (),
) -> list[Result]:
    """Every check, for the SDK `spec` names (or the one qnnctl would choose); with `device`
    (a serial, or "" for the only device adb sees), the device's checks after the host's, and
    with `models`, whether the device's runtime loads them."""
    if spec is not None:
        # A malformed argument is a usage error (exit 2), not a failed check.
        select_sdk(spec, environ, cwd, Cache.from_env(environ))
    if models and device is None:
        raise UsageError("--model is checked against a device's runtime: give --device too",
                         hint="`qnnctl inspect --sdk VERSION MODEL` checks it against an SDK on this host")
    checks = CHECKS
    if device is not None:
        from qnnctl.doctor.device import DEVICE_CHECKS, MODEL_CHECK

        checks = CHECKS + DEVICE_CHECKS + ((MODEL_CHECK,) if models else ())
    ctx = Context(spec=spec, environ=environ, cwd=cwd, offline=offline, verify=verify, device=device,
                  models=tuple(models))
    return run_checks(ctx, checks)
