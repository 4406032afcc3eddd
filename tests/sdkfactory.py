"""SDK trees and archives built at test time, in the real QAIRT layout.

The host libraries are real ELF shared objects compiled with `cc`; the tools are real
executables. Nothing here is downloaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "2.37.0.250724"
OTHER_VERSION = "2.34.0.250424"

_LIB_SOURCE = """
int qnn_{name}_version(void) {{ return 42; }}
"""
# The interface the SDK's libraries export (QnnInterface.h, QnnSystemInterface.h): an array of
# providers, each {{backendId, providerName, version}}; doctor's load check asks for it.
_PROVIDER_SOURCE = """
#include <stdint.h>
typedef struct {{ uint32_t major, minor, patch; }} ApiVersion;
typedef struct {{ uint32_t backendId; const char *providerName; ApiVersion first, second; }} Provider;
static const Provider provider = {{ {backend_id}, "{provider}", {{2, 40, 0}}, {{5, 51, 0}} }};
static const Provider *providers[] = {{ &provider }};
uint64_t {function}(const Provider ***list, uint32_t *count) {{
    *list = providers;
    *count = 1;
    return 0;
}}
"""
# Which synthetic library offers which provider, as Qualcomm's own do.
PROVIDERS = {
    "libQnnHtp.so": ("QnnInterface_getProviders", 6, "HTP_QTI_AISW"),
    "libQnnCpu.so": ("QnnInterface_getProviders", 3, "CPU_QTI_AISW"),
    "libQnnSystem.so": ("QnnSystemInterface_getProviders", 0, "SYSTEM_QTI_AISW"),
}




def compile_shared(path: Path, source: str = "int f(void) { return 1; }\n",
                   extra: Iterable[str] = (), providers: bool = True) -> Path:
    """Compile C source into a shared library at `path` with the machine's `cc`.

    A library named as one of the SDK's (libQnnHtp.so...) also gets that library's provider
    list, as Qualcomm's own have, unless `providers` is off.
    """
    if providers and path.name in PROVIDERS:
        function, backend_id, provider = PROVIDERS[path.name]
        source += _PROVIDER_SOURCE.format(function=function, backend_id=backend_id, provider=provider)
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_name(path.name + ".c")
    src.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(src), *extra], check=True)
    src.unlink()
    return path


EM_AARCH64 = 183  # an ELF header's e_machine for AArch64


def for_another_machine(library: bytes, machine: int = EM_AARCH64) -> bytes:
    """A little-endian ELF library's bytes with another e_machine: one the loader passes over."""
    data = bytearray(library)
    data[18:20] = machine.to_bytes(2, "little")
    return bytes(data)


@dataclass
class SdkSpec:
    """What goes into a synthetic SDK."""

    version: str = VERSION
    libs: tuple[str, ...] = ("libQnnHtp.so", "libQnnSystem.so", "libQnnCpu.so")
    tools: tuple[str, ...] = ("qnn-net-run", "qnn-context-binary-generator")
    extra_files: dict[str, bytes] = field(default_factory=dict)
    top: str | None = None  # archive folder above the SDK; default qairt/<version>
    sdk_yaml: bool = True
    # The build id the libraries carry in their read-only data, as QAIRT's do
    # (`v2.51.0.260929181845`); None: none, as the libraries of releases before it.
    build_id: str | None = None


_lib_cache: dict[tuple[str, str | None], bytes] = {}
# Where the SDK's libraries, once compiled, are kept for later sessions (and for each mutant of
# a mutation run, which forks a fresh session from a process that compiled none): named after
# the digest of what `cc` was given, so a change to the source compiles anew. Decided on import,
# before the tests move HOME into their temporary folders.
LIBRARY_STORE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qnnctl-tests" / "libs"


def _library_bytes(name: str, workdir: Path, build_id: str | None = None) -> bytes:
    """Each distinct library compiled once (cc is slow-ish), then read from LIBRARY_STORE."""
    key = (name, build_id)
    if key not in _lib_cache:
        stem = name.removeprefix("lib").removesuffix(".so").replace("-", "_").lower()
        source = _LIB_SOURCE.format(name=stem)
        if build_id is not None:
            source += f'__attribute__((used)) static const char qnn_build[] = "{build_id}";\n'
        digest = hashlib.sha256(name.encode() + b"\0" + source.encode()).hexdigest()
        kept = LIBRARY_STORE / f"{digest[:32]}.so"
        try:
            _lib_cache[key] = kept.read_bytes()
        except OSError:
            # Built under its own name, which decides the provider list it gets (compile_shared).
            with tempfile.TemporaryDirectory() as build:
                out = compile_shared(Path(build) / name, source)
                _lib_cache[key] = out.read_bytes()
                with contextlib.suppress(OSError):  # a read-only home: compiled again next time
                    LIBRARY_STORE.mkdir(parents=True, exist_ok=True)
                    partial = kept.with_name(f"{kept.name}.{os.getpid()}.part")
                    partial.write_bytes(_lib_cache[key])
                    os.replace(partial, kept)  # whole or not at all, for sessions that run at once
    return _lib_cache[key]


def build_sdk_tree(dest: Path, spec: SdkSpec | None = None) -> Path:
    """Lay out an SDK root at `dest` (the folder that holds QNN_README.txt)."""
    spec = spec or SdkSpec()
    lib = dest / "lib" / "x86_64-linux-clang"
    tools = dest / "bin" / "x86_64-linux-clang"
    lib.mkdir(parents=True, exist_ok=True)
    tools.mkdir(parents=True, exist_ok=True)
    (dest / "include" / "QNN").mkdir(parents=True, exist_ok=True)
    (dest / "include" / "QNN" / "QnnInterface.h").write_text("/* QnnInterface */\n")
    (dest / "docs").mkdir(exist_ok=True)
    (dest / "share").mkdir(exist_ok=True)
    (dest / "lib" / "aarch64-android").mkdir(parents=True, exist_ok=True)
    (dest / "lib" / "aarch64-android" / "libQnnHtp.so").write_bytes(b"\x7fELF-android-stub")
    (dest / "QNN_README.txt").write_text(f"Qualcomm AI Runtime SDK {spec.version}\n")
    if spec.sdk_yaml:
        (dest / "sdk.yaml").write_text(f"name: qairt\nversion: {spec.version}\n")
    for name in spec.libs:
        (lib / name).write_bytes(_library_bytes(name, dest, spec.build_id))
    for name in spec.tools:
        tool = tools / name
        tool.write_text(f"#!/bin/sh\necho {name} {spec.version} \"$@\"\n")
        tool.chmod(0o755)
    for rel, data in spec.extra_files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return dest


def build_archive(workdir: Path, fmt: str = "zip", spec: SdkSpec | None = None,
                  with_symlink: bool = True) -> Path:
    """An SDK archive as Qualcomm ships it: one top folder qairt/<version>/.

    fmt is one of zip, tar.gz, tgz, tar.xz. A relative in-tree symlink is included
    (lib/x86_64-linux-clang/libQnnHtp.so.2 -> libQnnHtp.so) unless with_symlink is off.
    """
    spec = spec or SdkSpec()
    top = spec.top if spec.top is not None else f"qairt/{spec.version}"
    staging = workdir / f"staging-{spec.version}-{fmt}"
    if staging.exists():
        shutil.rmtree(staging)
    root = staging / top if top else staging
    build_sdk_tree(root, spec)
    if with_symlink:
        os.symlink("libQnnHtp.so", root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so.2")
    name = f"v{spec.version}.{fmt}"
    archive = workdir / name
    if fmt == "zip":
        write_zip_from_tree(staging, archive)
    else:
        if fmt in ("tar.gz", "tgz"):
            tf = tarfile.open(archive, "w:gz")
        elif fmt == "tar.xz":
            tf = tarfile.open(archive, "w:xz")
        elif fmt == "tar":
            tf = tarfile.open(archive, "w")
        else:
            raise ValueError(f"unknown archive format {fmt!r}")
        with tf:
            for entry in sorted(staging.iterdir()):
                tf.add(entry, arcname=entry.name)
    shutil.rmtree(staging)
    return archive


def write_zip_from_tree(tree: Path, archive: Path, folders: bool = True, unix: bool = True) -> None:
    """Zip a folder the way `zip -ry` does: Unix modes kept, symlinks stored as links (their
    targets' bytes as the file system has them). Without `folders`, no entries for folders, as
    many archivers write zips; without `unix`, as an archiver that records no Unix modes."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for dirpath, dirnames, filenames in os.walk(tree):
            dirnames.sort()
            base = Path(dirpath)
            for dirname in dirnames:
                path = base / dirname
                if path.is_symlink() or not folders:
                    continue
                add_zip_entry(zf, str(path.relative_to(tree)) + "/", b"", 0o40755)
            for filename in sorted(filenames) + [d for d in dirnames if (base / d).is_symlink()]:
                path = base / filename
                rel = str(path.relative_to(tree))
                if path.is_symlink():
                    add_zip_entry(zf, rel, os.fsencode(os.readlink(path)), stat.S_IFLNK | 0o777)
                elif unix:
                    mode = stat.S_IMODE(path.stat().st_mode)
                    add_zip_entry(zf, rel, path.read_bytes(), stat.S_IFREG | mode)
                else:
                    info = zipfile.ZipInfo(rel, date_time=(2025, 7, 24, 0, 0, 0))
                    info.create_system = 0  # MS-DOS: external_attr holds no mode
                    info.external_attr = 0o755 << 16  # what a Unix reader would take for one
                    zf.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)


def manifest_digest(data: bytes) -> str:
    """What the manifest records for a file holding `data`: the sha256 of its content."""
    return hashlib.sha256(data).hexdigest()


def add_zip_entry(zf: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
    info = zipfile.ZipInfo(name, date_time=(2025, 7, 24, 0, 0, 0))
    info.create_system = 3  # Unix, so external_attr carries the mode
    info.external_attr = (mode & 0xFFFF) << 16
    if stat.S_ISDIR(mode):
        info.external_attr |= 0x10
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def add_tar_entry(tf: tarfile.TarFile, name: str, data: bytes = b"", *,
                  kind: bytes = tarfile.REGTYPE, mode: int = 0o644, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def long_name_chain(top: str, count: int) -> bytes:
    """A plain tar whose one member (`top`/sdk.yaml) comes after `count` GNU long-name headers in a
    row: tarfile reads each next header from inside its reading of the one before."""
    chain = b""
    for i in range(count):
        name = f"{top}/n{i}".encode()
        info = tarfile.TarInfo("././@LongLink")
        info.type, info.size = tarfile.GNUTYPE_LONGNAME, len(name)
        chain += info.tobuf(tarfile.GNU_FORMAT) + name + bytes(-len(name) % tarfile.BLOCKSIZE)
    return chain + tarfile.TarInfo(f"{top}/sdk.yaml").tobuf(tarfile.GNU_FORMAT) + bytes(1024)


def install_tree_into_cache(cache_dir: Path, version: str = VERSION) -> Path:
    """An SDK placed straight into qnnctl's cache with a manifest (no download)."""
    import json

    root = cache_dir / "sdks" / version
    build_sdk_tree(root, SdkSpec(version=version))
    (root / ".qnnctl.json").write_text(json.dumps({"schema": 1, "version": version, "files": {}}))
    return root


# -- a Linux aarch64 host's libraries, on this x86_64 one ------------------------------------------
#
# As the aarch64 libraries of QAIRT 2.51 (onnxruntime_qnn-2.7.0's manylinux_2_34_aarch64 wheel):
# ELF AArch64, in lib/aarch64-oe-linux-gcc11.2, needing GNU libstdc++.so.6 with GLIBCXX_3.4.29,
# and libQnnSystem.so also libatomic.so.1. Built by `cc` against stand-ins of those two (so that
# their version needs are real ones), linked without the C library, then marked AArch64.

AARCH64_LIB_DIR = "lib/aarch64-oe-linux-gcc11.2"
AARCH64_BIN_DIR = "bin/aarch64-oe-linux-gcc11.2"
_CXX_SOURCE = "int qnn_cxx_old(void) { return 1; }\nint qnn_cxx_new(void) { return 2; }\n"
_CXX_VERSIONS = {
    "3.4.29": "GLIBCXX_3.4.28 { global: qnn_cxx_old; local: *; };\n"
              "GLIBCXX_3.4.29 { global: qnn_cxx_new; } GLIBCXX_3.4.28;\n",
    "3.4.28": "GLIBCXX_3.4.28 { global: qnn_cxx_old; qnn_cxx_new; local: *; };\n",
}


def _link(path: Path, source: str, *extra: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_name(path.name + ".c")
    src.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-nostdlib", "-o", str(path), str(src), *extra], check=True)
    src.unlink()
    return path


def native_system_stand_ins(folder: Path, glibcxx: str = "3.4.29", atomic: bool = True) -> Path:
    """libstdc++.so.6 (defining GLIBCXX versions up to `glibcxx`: "3.4.29" or "3.4.28") and
    libatomic.so.1 stand-ins in `folder`, for this machine (what the linker takes)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / f"cxx-{glibcxx}.map"
    script.write_text(_CXX_VERSIONS[glibcxx])
    _link(folder / "libstdc++.so.6", _CXX_SOURCE, "-Wl,-soname,libstdc++.so.6", f"-Wl,--version-script={script}")
    script.unlink()
    if atomic:
        _link(folder / "libatomic.so.1", "int qnn_atomic(void) { return 3; }\n", "-Wl,-soname,libatomic.so.1")
    return folder


def mark_aarch64(folder: Path) -> Path:
    """Every ELF library in `folder` rewritten as AArch64."""
    for path in folder.iterdir():
        if ".so" in path.name and path.is_file() and not path.is_symlink():
            path.write_bytes(for_another_machine(path.read_bytes()))
    return folder


def aarch64_system(folder: Path, glibcxx: str = "3.4.29", atomic: bool = True) -> Path:
    """An aarch64 Debian's libstdc++.so.6 and libatomic.so.1, as far as a loader's search and
    their version definitions go: AArch64 stand-ins in `folder`."""
    return mark_aarch64(native_system_stand_ins(folder, glibcxx, atomic))


def add_aarch64_host(root: Path, work: Path, build_id: str | None = None) -> Path:
    """Give the SDK tree at `root` a Linux aarch64 host's folders: libQnnHtp.so and
    libQnnSystem.so as QAIRT 2.51's (see above), and a tool; `build_id` in libQnnHtp.so's data."""
    stand_ins = native_system_stand_ins(work / "aarch64-link")
    lib = root / AARCH64_LIB_DIR
    linked = ("-L", str(stand_ins), "-l:libstdc++.so.6")
    carried = f'__attribute__((used)) static const char qnn_build[] = "{build_id}";\n' if build_id else ""
    _link(lib / "libQnnHtp.so", "extern int qnn_cxx_new(void);\nint qnn_htp(void) { return qnn_cxx_new(); }\n"
          + carried, *linked)
    _link(lib / "libQnnSystem.so", "extern int qnn_cxx_new(void);\nextern int qnn_atomic(void);\n"
          "int qnn_system(void) { return qnn_cxx_new() + qnn_atomic(); }\n", *linked, "-l:libatomic.so.1")
    mark_aarch64(lib)
    tool = root / AARCH64_BIN_DIR / "qnn-net-run"
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text("#!/bin/sh\necho qnn-net-run aarch64 \"$@\"\n")
    tool.chmod(0o755)
    shutil.rmtree(stand_ins)
    return root


def build_two_host_archive(workdir: Path, version: str = VERSION, x86_64: bool = True,
                           build_id: str | None = None) -> Path:
    """A zip laid out as Qualcomm's (qairt/<version>/) with both hosts' folders, or, without
    `x86_64`, the aarch64 host's alone; `build_id` in both hosts' libraries."""
    staging = workdir / f"staging-{version}-two-hosts"
    root = build_sdk_tree(staging / "qairt" / version, SdkSpec(version=version, build_id=build_id))
    add_aarch64_host(root, workdir, build_id)
    if not x86_64:
        shutil.rmtree(root / "lib" / "x86_64-linux-clang")
        shutil.rmtree(root / "bin" / "x86_64-linux-clang")
    archive = workdir / f"v{version}.zip"
    write_zip_from_tree(staging, archive)
    shutil.rmtree(staging)
    return archive
