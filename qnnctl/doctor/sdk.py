"""Doctor's checks of the SDK: how it was selected, its layout, its version, its manifest and
files (--verify), the ExecuTorch and ONNX Runtime installed to use it, and qnnctl's cache.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qnnctl.doctor.context import Context, env_command, is_library_name, reinstall_hint
from qnnctl.doctor.frameworks import Frameworks
from qnnctl.doctor.report import Outcome, Skip, abridged, fail, ok, warn
from qnnctl.errors import IntegrityError, NotInstalledError
from qnnctl.host.staged import staged_runtimes
from qnnctl.install.memberdata import digest_kind, digest_matches
from qnnctl.net.urls import redact
from qnnctl.run.envplan import pin_gap
from qnnctl.run.probe import HTP_BACKEND_ID
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, read_manifest
from qnnctl.sdk.compat import ep_requirement, known_pairing, ort_qnn_carries, passes_that_fall_back
from qnnctl.sdk.components import install_command, installed_components
from qnnctl.sdk.evidence import is_own
from qnnctl.sdk.holds import describe_holders, held_and_removed, held_by
from qnnctl.sdk.hosts import this_host
from qnnctl.sdk.identity import sdk_build_ids, version_of_build
from qnnctl.sdk.layout import (
    REQUIRED_LIBS,
    Sdk,
    missing_layout,
    read_build_id,
    version_claims,
)
from qnnctl.sdk.select import (
    BY_INSTALLED,
    BY_SHELL,
    executorch_expected_version,
    pin_conflict,
    select_sdk,
)
from qnnctl.sdk.stores import cache_problem, unsafe_path
from qnnctl.sdk.versions import parse_version
from qnnctl.words import plural


def check_selection(ctx: Context) -> Outcome:
    selection = select_sdk(ctx.spec, ctx.environ, ctx.cwd, ctx.cache())
    why = selection.why
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
    missing = [f"{this_host().lib_dir}/{n}" for n in REQUIRED_LIBS if not (lib_dir / n).is_file()]
    if missing:
        problems.append("missing " + abridged(missing))
        fixes.append(reinstall_hint(target))
    tools = sorted(p for p in sdk.bin_dir.iterdir() if _is_program(p)) if sdk.bin_dir.is_dir() else []
    not_exec = [p for p in tools if not os.access(p, os.X_OK)]
    if not_exec:
        problems.append("not executable: " + abridged([p.name for p in not_exec]))
        fixes.append("chmod +x " + " ".join(shlex.quote(str(p)) for p in not_exec))
    if sdk.bin_dir.is_dir() and not tools:
        problems.append(f"no tools in {this_host().bin_dir}")
        fixes.append(reinstall_hint(target))
    if problems:
        return fail(f"{sdk.root}: " + "; ".join(problems), "; ".join(dict.fromkeys(fixes)))
    libs = sum(1 for p in lib_dir.iterdir() if is_library_name(p.name))
    has = [f"{libs} host libraries"]
    cannot: list[str] = []
    if tools:
        has.append(f"{len(tools)} tool{'' if len(tools) == 1 else 's'} (executable)")
    else:
        cannot.append(f"no {this_host().bin_dir} (no qnn-net-run or qnn-context-binary-generator)")
    if (sdk.root / "include" / "QNN").is_dir():
        has.append("include/QNN")
    else:
        cannot.append("no include/QNN (nothing to compile native code against)")
    if cannot:
        return ok(", ".join(has) + ": enough for lowering with ExecuTorch's Python flow; " + "; ".join(cannot))
    return ok(", ".join(has))


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


def check_version(ctx: Context) -> Outcome:
    """The build id the libraries carry is what loads; every other label must agree with it."""
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
    target = ctx.require_target()
    sdk = ctx.require_sdk()
    path = sdk.root / MANIFEST_NAME
    if not path.exists():
        if sdk.origin == "qnnctl cache":
            return fail(f"{path} is missing", reinstall_hint(target))
        raise Skip(f"no manifest: not installed by qnnctl ({sdk.origin})")
    _refuse_foreign_manifest(ctx, sdk)
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


def _refuse_foreign_manifest(ctx: Context, sdk: Sdk) -> None:
    """Skip when the SDK's manifest is not evidence: qnnctl did not write it into this cache, or
    another user could have changed it (qnnctl.sdk.evidence); it may say anything of the files."""
    if not is_own(sdk.root, sdk.version, ctx.cache()):
        raise Skip(f"{sdk.root / MANIFEST_NAME} was not written by qnnctl into this cache ({sdk.origin}), or "
                   "another user could change it: it vouches for nothing, its files' digests included",
                   hint="`qnnctl lock --check` compares the SDK's files, hashed, with the project's qnnctl.lock")


def _parts_detail(manifest: Mapping[str, Any]) -> str:
    """Which components an SDK holds, and what vouches for one fetched in parts."""
    held = installed_components(manifest)
    detail = "" if held == ("all",) else f"; components {', '.join(held)} (not the whole archive)"
    if manifest.get("partial") is True:
        cd = manifest.get("central_directory_sha256")
        detail += ("; fetched in parts (Range requests) from the archive whose central directory has sha256 "
                   f"{cd if isinstance(cd, str) else 'unrecorded'}; each component's files were hashed as they "
                   "were written, and checked against a lock or mirror index where one pinned them")
    return detail


def check_verify(ctx: Context) -> Outcome:
    target = ctx.require_target()
    sdk = ctx.require_sdk()
    if (sdk.root / MANIFEST_NAME).exists():
        _refuse_foreign_manifest(ctx, sdk)
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
    kinds = {digest_kind(d) for d in files.values() if isinstance(d, str)}
    if kinds == {"sha256"}:
        return "by sha256"
    if kinds == {"CRC-32"}:
        return "by CRC-32 only: recorded by an earlier qnnctl; reinstall for sha256s"
    return "by sha256, some by CRC-32 only"


def executorch_version(package_dir: Path) -> str | None:
    """The installed ExecuTorch's version, from its dist-info, without importing it."""
    for dist in importlib.metadata.distributions(path=[str(package_dir.parent)]):
        if (dist.metadata["Name"] or "").lower() == "executorch":
            return str(dist.version)
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_executorch(ctx: Context) -> Outcome:
    frameworks = ctx.frameworks()
    package_dir = frameworks.executorch_dir
    if package_dir is None:
        raise Skip(f"ExecuTorch is not installed for {frameworks.python}")
    version = executorch_version(package_dir) or "of unknown version"
    expected = executorch_expected_version(package_dir)
    name = f"ExecuTorch {version} ({package_dir})"
    if expected is None:
        return warn(f"{name}: cannot tell which SDK version it expects")
    sdk_version = ctx.sdk_version()
    if sdk_version is None:
        return warn(f"{name} expects SDK {expected}; the selected SDK's version is unknown",
                    hint=f"`qnnctl install {expected}`, then {env_command(expected)}")
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
    fallbacks = passes_that_fall_back(sdk_version)
    if fallbacks:
        needs = ", ".join(f"{p.what} from QAIRT {p.qairt[0]}.{p.qairt[1]}" for p in fallbacks)
        return warn(f"{name} expects SDK {expected}; the selected SDK is {sdk_version}, on which its passes that "
                    f"need a newer one fall back without a word: {needs} (source: {fallbacks[0].evidence}, "
                    f"read {fallbacks[0].seen})")
    return ok(f"{name} expects SDK {expected}; the selected SDK is {sdk_version}")


def _core_onnxruntime(frameworks: Frameworks, version: str) -> str | None:
    """What is wrong with the core onnxruntime beside onnxruntime-qnn `version`, if anything."""
    carried = ort_qnn_carries(version)
    if carried is None:
        return None
    lowest = ".".join(str(n) for n in carried.onnxruntime)
    if frameworks.onnxruntime is None:
        return (f"onnxruntime-qnn {version} is a plugin of onnxruntime (>= {lowest}), which {frameworks.python} "
                f"lacks (source: {carried.evidence})")
    try:
        have = tuple(int(x) for x in frameworks.onnxruntime.split("+")[0].split(".")[:3])
    except ValueError:
        return None
    if have < carried.onnxruntime:
        return (f"onnxruntime-qnn {version} needs onnxruntime >= {lowest}, {frameworks.python} has "
                f"{frameworks.onnxruntime} (source: {carried.evidence})")
    return None


def check_onnxruntime(ctx: Context) -> Outcome:
    frameworks = ctx.frameworks()
    version = frameworks.onnxruntime_qnn
    if version is None:
        raise Skip(f"onnxruntime-qnn is not installed for {frameworks.python}")
    name = f"onnxruntime-qnn {version}"
    ctx.require_target()
    core = _core_onnxruntime(frameworks, version)
    if core is not None:
        return warn(core, hint=f"`{frameworks.python} -m pip install onnxruntime-qnn=={version}` installs the "
                    "onnxruntime it needs")
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
    carried = ort_qnn_carries(version)
    with_core = f", with onnxruntime {frameworks.onnxruntime}" if frameworks.onnxruntime else ""
    carries = f" (it carries QAIRT {carried.qairt}{with_core})" if carried else ""
    return ok(f"{name} needs {wanted}; the selected SDK's libQnnHtp.so offers core API {core}{carries}")


def check_cache(ctx: Context) -> Outcome:
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
    unsafe = cache_problem(cache) if existing == root else unsafe_path(existing)
    if unsafe is not None:
        return fail(f"{unsafe.folder} {unsafe.why}, so another user could change the SDKs of the cache {root} "
                    "and the records that vouch for them; qnnctl uses none of them and installs nothing there",
                    hint=f"fix it with {unsafe.fix}, or point QNNCTL_CACHE_DIR at a folder of your own")
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
        names = [s.name for s in staged_runtimes(cache)]
        staged = f"; staged host runtime: {', '.join(names)} (used by env and lower)" if names else ""
    if problems:
        return warn(f"{where}: " + "; ".join(problems) + staged, "; ".join(hints))
    return ok(f"{where}: writable, {_gib(free)} free{staged}")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _held_and_gone(cache: Cache) -> list[tuple[str, str, str]]:
    """(version, what is wrong, its holders) for each SDK that a running process holds and that is
    no longer whole in the cache.

    qnnctl itself never leaves this: uninstall and a reinstall move an SDK out of sdks/ (one
    rename) only while they hold its exclusive lock, which no hold can share, and a new hold
    checks that the SDK is still there once it has its lock; an interrupted uninstall leaves the
    half-removed folder in tmp/, which nothing holds. A folder removed by hand, or by an older
    qnnctl, under a running pipeline is what this finds.
    """
    found = [(version, f"{cache.sdk_dir(version)} is gone", describe_holders(holders))
             for version, holders in held_and_removed(cache).items()]
    present = sorted(entry.name for entry in cache.sdks.iterdir()) if cache.sdks.is_dir() else []
    for version in present:
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
    found.sort()
    return found
