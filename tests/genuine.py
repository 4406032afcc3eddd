"""Qualcomm's own QAIRT binaries, for the tests that must run on the real thing.

PyPI carries Qualcomm's QAIRT host libraries inside the `onnxruntime-qnn` wheels. This module
fetches such a wheel once into a cache outside the repository, and turns it into an archive laid
out as Qualcomm ships an SDK (`qairt/<version>/lib/x86_64-linux-clang/...`, `sdk.yaml`):

- auditwheel renamed the libc++ trio the libraries need (`libc++-71bc274c.so.1.0`, ...) and
  added an RPATH to the wheel's copies; the SDK's own libraries name plain `libc++.so.1`,
  `libc++abi.so.1` and `libunwind.so.1` and carry no RPATH, so `patchelf` restores that;
- the wheel's copies of the trio are left out, as the SDK leaves them out: the host, or qnnctl's
  staged runtime, must provide them.

The libc++ trio the tests stage comes from Debian's packages (`libc++1-14`, `libc++abi1-14`,
`libunwind-14`), fetched with `apt-get download` into the same cache and served to qnnctl on
127.0.0.1 in the layout of the LLVM release archive, so the tests themselves use no network.

The aarch64 wheel of the same release gives the SDK's device side (`lib/aarch64-android/`,
`lib/hexagon-v<NN>/unsigned/`), for the `qnnctl device` tests (`lay_out_device_files`), and the
host libraries of a Linux aarch64 SDK (`lib/aarch64-oe-linux-gcc11.2/`), which the tests load in
an emulated aarch64 Debian (tests/emulated.py, `cached_aarch64_archive`): GCC builds that name
`libstdc++.so.6` and `libatomic.so.1` as the SDK's do, so they are packed as the wheel has them.

The real lowering runs ONNX Runtime's QNN execution provider in a Python of its own
(`make_onnxruntime_python`): `onnxruntime-qnn` with every Qualcomm library taken out of the
installed wheel, keeping only its own provider library, so that the SDK qnnctl installs is the
only QAIRT the lowering can load.

Nothing taken from a wheel or a package is ever written into the repository.

    python -m tests.genuine fetch     # what .ci/run does: the wheels and the Debian packages
    python -m tests.genuine where     # the cache folder (QNNCTL_TEST_WHEELS overrides it)
    python -m tests.genuine onnxruntime .venv-onnxruntime   # the lowering's Python (.ci/run)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from qnnctl.sdk.hosts import host_for

# The folder that survives between runs; computed from the environment the tests start with,
# before any test points HOME elsewhere.
CACHE_VARIABLE = "QNNCTL_TEST_WHEELS"
# Bump when the archive layout built from a wheel changes, so stale archives are rebuilt.
LAYOUT_REVISION = 1
HOST_LIB_DIR = "lib/x86_64-linux-clang"
TRIO = ("libc++.so.1", "libc++abi.so.1", "libunwind.so.1")
DEBIAN_TRIO = ("libc++1-14", "libc++abi1-14", "libunwind-14")


@dataclass(frozen=True)
class Wheel:
    """One onnxruntime-qnn wheel and the QAIRT build inside it."""

    release: str  # onnxruntime-qnn's own version
    platform: str
    qairt: str  # the SDK version the build id names (major.minor.patch.yymmdd)
    build_id: str  # as the libraries carry it

    @property
    def file_name(self) -> str:
        return f"onnxruntime_qnn-{self.release}-cp311-cp311-{self.platform}.whl"

    @property
    def requirement(self) -> str:
        return f"onnxruntime-qnn=={self.release}"


# Builds read from the libraries of each wheel (`v<version><hhmmss>` in libQnnHtp.so's .rodata).
QAIRT_2_51 = Wheel("2.7.0", "manylinux_2_35_x86_64", "2.51.0.260929", "v2.51.0.260929181845")
QAIRT_2_47 = Wheel("2.3.0", "manylinux_2_35_x86_64", "2.47.0.260601", "v2.47.0.260601114230")
WHEELS = (QAIRT_2_51, QAIRT_2_47)
# The device side of the 2.51 build: its aarch64 wheel holds the aarch64 libQnnHtp.so,
# libQnnSystem.so, libQnnHtpPrepare.so and libQnnHtpV<NN>Stub.so, and the Hexagon skels
# libQnnHtpV<NN>Skel.so (V68 to V81), all of build v2.51.0.260929181845. The aarch64 libraries are
# Linux builds rather than Android's; nothing loads them here, and their names, build id and
# place in the layout are what the device tests read.
QAIRT_2_51_DEVICE = Wheel("2.7.0", "manylinux_2_34_aarch64", "2.51.0.260929", "v2.51.0.260929181845")
DEVICE_WHEELS = (QAIRT_2_51_DEVICE,)
DEVICE_ARCHES = (68, 69, 73, 75, 79, 81)
ANDROID_LIB_DIR = "lib/aarch64-android"
ANDROID_LIBS = ("libQnnHtp.so", "libQnnSystem.so", "libQnnHtpPrepare.so")
# The same wheel's libraries as a Linux aarch64 host's SDK holds them, in the folder the host
# table names. A part of them: what runs under emulation is about ten times slower, so the
# archive leaves out libQnnHtpPrepare.so (90 MB), libQnnGpu.so and libGenie.so. One stub and its
# skel stay, so that an install by parts has a Hexagon member to leave out and doctor meets a
# library that needs the device's libcdsprpc.so, as on a real board.
AARCH64_HOST = host_for("Linux", "aarch64")
AARCH64_HOST_LIBS = ("libQnnHtp.so", "libQnnSystem.so", "libQnnSaver.so", "libQnnIr.so",
                     "libQnnHtpNetRunExtensions.so", "libQnnHtpV73Stub.so")
AARCH64_SKELS = (73,)


# The Python that runs ONNX Runtime's QNN execution provider for the lowering tests, and what it
# holds. onnxruntime-qnn 2.7.0 is a plugin EP for onnxruntime 1.32 (2.3.0 would need 1.24.4);
# its wheels are built for CPython 3.11.
ONNXRUNTIME_PYTHON = "QNNCTL_TEST_ONNXRUNTIME_PYTHON"
ONNXRUNTIME_REQUIREMENTS = ("onnxruntime==1.32.0", "onnxruntime-qnn==2.7.0", "onnx==1.23.2", "numpy")
EP_PROVIDER_LIBRARY = "libonnxruntime_providers_qnn.so"


def cache_folder() -> Path:
    given = os.environ.get(CACHE_VARIABLE)
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "qnnctl-tests"


CACHE = cache_folder()


def wheel_path(wheel: Wheel) -> Path | None:
    path = CACHE / "wheels" / wheel.file_name
    return path if path.is_file() else None


def debian_trio_debs() -> list[Path] | None:
    """The Debian packages of the libc++ trio, when fetched."""
    found = [next(iter(sorted((CACHE / "debs").glob(f"{name}_*.deb"))), None) for name in DEBIAN_TRIO]
    return None if any(p is None for p in found) else [p for p in found if p is not None]


def missing_message(what: str) -> str:
    return (f"{what} is not in {CACHE}; fetch it with `python -m tests.genuine fetch` "
            f"(set {CACHE_VARIABLE} to keep it elsewhere)")


# -- building an SDK from a wheel ---------------------------------------------------------------


def patchelf() -> str:
    """The patchelf program: beside this Python (the PyPI package), else on PATH."""
    beside = Path(sys.executable).with_name("patchelf")
    found = str(beside) if beside.is_file() else shutil.which("patchelf")
    if found is None:
        raise RuntimeError("patchelf is not installed: `pip install patchelf` (a test dependency)")
    return found


def restore_sdk_names(library: Path) -> None:
    """Give a wheel's library the DT_NEEDED names and the (absent) RPATH the SDK ships it with."""
    tool = patchelf()
    needed = subprocess.run([tool, "--print-needed", str(library)], capture_output=True, text=True,
                            check=True).stdout.split()
    args: list[str] = []
    for name in needed:
        for plain in TRIO:
            stem = plain.split(".so", 1)[0]  # libc++, libc++abi, libunwind
            if name.startswith(f"{stem}-") and ".so" in name:
                args += ["--replace-needed", name, plain]
    subprocess.run([tool, *args, "--remove-rpath", str(library)], check=True)


def build_sdk_tree(wheel: Wheel, dest: Path, label: str | None = None) -> Path:
    """The SDK root (`dest`) laid out from the wheel's Qualcomm libraries.

    `label` is the version its sdk.yaml names (default: the libraries' own; "" for no sdk.yaml).
    """
    source = wheel_path(wheel)
    if source is None:
        raise FileNotFoundError(missing_message(wheel.file_name))
    lib = dest / HOST_LIB_DIR
    lib.mkdir(parents=True)
    with zipfile.ZipFile(source) as zf:
        for info in zf.infolist():
            folder, _, name = info.filename.rpartition("/")
            # Qualcomm's libraries only: not the wheel's own provider, nor its copies of libc++.
            if folder != "onnxruntime_qnn" or not name.endswith(".so") or "onnxruntime" in name:
                continue
            target = lib / name
            with zf.open(info) as member, open(target, "wb") as out:
                shutil.copyfileobj(member, out, 1 << 20)
            target.chmod(0o755)
            restore_sdk_names(target)
    label = wheel.qairt if label is None else label
    if label:
        (dest / "sdk.yaml").write_text(f"name: qairt\nversion: {label}\n")
    (dest / "QNN_README.txt").write_text(f"Qualcomm AI Runtime SDK {wheel.qairt} (host libraries)\n")
    return dest


def build_archive(wheel: Wheel, dest: Path, top: str | None = None, label: str | None = None) -> Path:
    """A zip of the SDK as Qualcomm publishes it (one top folder `qairt/<version>/`); `top` and
    `label` (see build_sdk_tree) say otherwise, for archives that lie about what they hold."""
    top = f"qairt/{wheel.qairt}" if top is None else top
    # Named by process: test workers running side by side may build the same archive at once.
    staging = dest.with_name(f"{dest.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    build_sdk_tree(wheel, staging / top if top else staging, label)
    return zip_folder(staging, dest)


def zip_folder(staging: Path, dest: Path) -> Path:
    """Zip what is in `staging` into `dest` (by a rename, so a reader never meets half of it), and
    remove `staging`."""
    partial = dest.with_name(f"{dest.name}.part-{os.getpid()}")
    # Deflate at level 1: the tests read these archives, their size matters little.
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for path in sorted(p for p in staging.rglob("*")):
            rel = path.relative_to(staging).as_posix()
            zf.write(path, rel)
    shutil.rmtree(staging)
    os.replace(partial, dest)
    return dest


def cached_archive(wheel: Wheel) -> Path:
    """The archive built from `wheel`, built once and kept beside the wheel."""
    built = CACHE / "built" / f"v{wheel.qairt}-r{LAYOUT_REVISION}.zip"
    if not built.is_file():
        built.parent.mkdir(parents=True, exist_ok=True)
        build_archive(wheel, built)
    return built


def llvm_layout_archive(dest: Path, top: str) -> Path:
    """The Debian trio packed as the LLVM release archive holds it: `<top>/lib/libc++.so.1`..."""
    debs = debian_trio_debs()
    if debs is None:
        raise FileNotFoundError(missing_message("the libc++ trio's Debian packages"))
    staging = dest.with_name(dest.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True)
    found = {p.name: p for p in staging.rglob("*.so.1") if p.name in TRIO}
    if set(found) != set(TRIO):
        raise RuntimeError(f"the Debian packages hold {sorted(found)}, not the whole trio")
    with tarfile.open(dest, "w:xz") as tf:
        for name in TRIO:
            tf.add(os.path.realpath(found[name]), arcname=f"{top}/lib/{name}")
    shutil.rmtree(staging)
    return dest


# -- the device side ----------------------------------------------------------------------------


def device_file_places(wheel: Wheel) -> dict[str, str]:
    """Each device file of the wheel, by name, and where a QAIRT SDK keeps it."""
    places = {name: f"{ANDROID_LIB_DIR}/{name}" for name in ANDROID_LIBS}
    for n in DEVICE_ARCHES:
        places[f"libQnnHtpV{n}Stub.so"] = f"{ANDROID_LIB_DIR}/libQnnHtpV{n}Stub.so"
        places[f"libQnnHtpV{n}Skel.so"] = f"lib/hexagon-v{n}/unsigned/libQnnHtpV{n}Skel.so"
    return places


def unpack_wheel_files(wheel: Wheel, source: Path, places: dict[str, str], root: Path,
                       mode: int | None = None) -> None:
    """The wheel's `onnxruntime_qnn/<name>` files written below `root` where `places` puts each
    (with `mode` when given); RuntimeError naming any of them the wheel lacks."""
    with zipfile.ZipFile(source) as zf:
        for info in zf.infolist():
            folder, _, name = info.filename.rpartition("/")
            if folder != "onnxruntime_qnn" or name not in places:
                continue
            target = root / places[name]
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as member, open(target, "wb") as out:
                shutil.copyfileobj(member, out, 1 << 20)
            if mode is not None:
                target.chmod(mode)
    missing = sorted(set(places) - {p.name for p in root.rglob("*.so")})
    if missing:
        raise RuntimeError(f"{wheel.file_name} lacks {missing}")


def device_tree(wheel: Wheel) -> Path:
    """The wheel's device files in the SDK's layout, unpacked once beside the wheel."""
    source = wheel_path(wheel)
    if source is None:
        raise FileNotFoundError(missing_message(wheel.file_name))
    built = CACHE / "built" / f"device-{wheel.qairt}-r{LAYOUT_REVISION}"
    if built.is_dir():
        return built
    staging = built.with_name(f"{built.name}.staging-{os.getpid()}")  # as in build_archive
    shutil.rmtree(staging, ignore_errors=True)
    unpack_wheel_files(wheel, source, device_file_places(wheel), staging)
    try:
        os.replace(staging, built)
    except OSError:
        if not built.is_dir():
            raise
        shutil.rmtree(staging)  # another worker's tree landed first: the same files
    return built


def aarch64_member_places(wheel: Wheel) -> dict[str, str]:
    """The files of the aarch64 SDK's archive, by their name in the wheel, and where in the SDK."""
    if AARCH64_HOST is None:
        raise RuntimeError("the host table has no Linux aarch64 row")
    places = {name: f"{AARCH64_HOST.lib_dir}/{name}" for name in AARCH64_HOST_LIBS}
    places.update({f"libQnnHtpV{n}Skel.so": f"lib/hexagon-v{n}/unsigned/libQnnHtpV{n}Skel.so" for n in AARCH64_SKELS})
    return places


def build_aarch64_archive(wheel: Wheel, dest: Path) -> Path:
    """A zip of a Linux aarch64 host's SDK (`qairt/<version>/lib/aarch64-oe-linux-gcc11.2/...`,
    `sdk.yaml`) holding the wheel's aarch64 libraries byte for byte."""
    source = wheel_path(wheel)
    if source is None:
        raise FileNotFoundError(missing_message(wheel.file_name))
    staging = dest.with_name(f"{dest.name}.staging-{os.getpid()}")  # as in build_archive
    shutil.rmtree(staging, ignore_errors=True)
    root = staging / "qairt" / wheel.qairt
    unpack_wheel_files(wheel, source, aarch64_member_places(wheel), root, mode=0o755)
    (root / "sdk.yaml").write_text(f"name: qairt\nversion: {wheel.qairt}\n")
    (root / "QNN_README.txt").write_text(f"Qualcomm AI Runtime SDK {wheel.qairt} (Linux aarch64 host libraries)\n")
    return zip_folder(staging, dest)


def cached_aarch64_archive(wheel: Wheel = QAIRT_2_51_DEVICE) -> Path:
    """The Linux aarch64 SDK's archive built from the aarch64 `wheel`, built once."""
    built = CACHE / "built" / f"v{wheel.qairt}-aarch64-r{LAYOUT_REVISION}.zip"
    if not built.is_file():
        built.parent.mkdir(parents=True, exist_ok=True)
        build_aarch64_archive(wheel, built)
    return built


def lay_out_device_files(wheel: Wheel, root: Path) -> Path:
    """Put the wheel's device files where a QAIRT SDK at `root` keeps them: lib/aarch64-android/
    and lib/hexagon-v<NN>/unsigned/ (as links to the unpacked copies: they are 200 MB)."""
    tree = device_tree(wheel)
    for rel in device_file_places(wheel).values():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            target.unlink()
        target.symlink_to(tree / rel)
    return root


def rebuild(path: Path, old: str, new: str) -> None:
    """Replace the build id string `old` by `new` (of the same length) in the file at `path`,
    which becomes a file of its own (not a link): how a library of another build is made from a
    genuine one when no genuine library of that build is at hand."""
    if len(old) != len(new):
        raise ValueError("a build id must keep its length, or the library's layout would shift")
    data = path.read_bytes()
    if old.encode() not in data:
        raise ValueError(f"{path} does not carry {old}")
    path.unlink()
    path.write_bytes(data.replace(old.encode(), new.encode()))


# -- the lowering's Python ----------------------------------------------------------------------


def strip_execution_provider(site_packages: Path) -> list[str]:
    """Take Qualcomm's libraries (and their libc++ copies) out of an installed onnxruntime-qnn,
    keeping only the provider library, which needs nothing but libstdc++. What was removed."""
    package = site_packages / "onnxruntime_qnn"
    if not (package / EP_PROVIDER_LIBRARY).is_file():
        raise FileNotFoundError(f"{package} holds no {EP_PROVIDER_LIBRARY}")
    removed = []
    for library in sorted(package.glob("*.so*")):
        if library.name != EP_PROVIDER_LIBRARY:
            library.unlink()
            removed.append(library.name)
    libs = site_packages / "onnxruntime_qnn.libs"
    if libs.is_dir():
        removed += sorted(p.name for p in libs.iterdir())
        shutil.rmtree(libs)
    return removed


def make_onnxruntime_python(dest: Path) -> Path:
    """A virtual environment at `dest` with ONNX Runtime's QNN execution provider, stripped of
    Qualcomm's libraries; its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True)
    python = dest / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", *ONNXRUNTIME_REQUIREMENTS], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    strip_execution_provider(Path(site))
    return python


# -- fetching --------------------------------------------------------------------------------


def fetch() -> None:
    """Download what is missing: the wheels (pip) and the trio's Debian packages (apt-get)."""
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for wheel in (*WHEELS, *DEVICE_WHEELS):
        if wheel_path(wheel) is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--only-binary", ":all:", "--platform", wheel.platform,
                            "--python-version", "3.11", "-d", str(wheels), wheel.requirement],
                           check=True)
    if debian_trio_debs() is None:
        debs = CACHE / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", *DEBIAN_TRIO], cwd=debs, check=True)
    for wheel in WHEELS:
        print(cached_archive(wheel))
    for wheel in DEVICE_WHEELS:
        print(device_tree(wheel))
        print(cached_aarch64_archive(wheel))


def main(argv: list[str]) -> int:
    if argv == ["fetch"]:
        fetch()
        return 0
    if argv == ["where"]:
        print(CACHE)
        return 0
    if len(argv) == 2 and argv[0] == "onnxruntime":
        print(make_onnxruntime_python(Path(argv[1])))
        return 0
    print("usage: python -m tests.genuine fetch|where|onnxruntime DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
