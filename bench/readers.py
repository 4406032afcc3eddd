"""Package and ELF readers, measured on whole commands: each reader against the one it replaced
or the one that could replace it, side by side in one session.

    python bench/readers.py                   # 15 rounds of every pair
    python bench/readers.py --rounds 25 --only lower,install
    python bench/readers.py --old-packages REV   # also qnnctl/host/packages.py as of git REV

Pairs (the variant is swapped in by a small launcher before qnnctl's CLI starts):
- deb: `qnnctl install --runtime --runtime-from` the libc++ trio's and libc6's real .debs
  (`apt-get download`); the current readers against packages.py of --old-packages REV.
- rpm-xz, rpm-zstd: the same with an RPM holding all of libc6's files instead of its .deb;
  the cpio walk in packages.py against rpmfile's own payload reader (RPMFile.getmembers and
  extractfile, which keep no hard links).
- lower: `qnnctl lower --dry-run --keep-mkldnn script.py` on an installed SDK (without the
  CPU-vendor probe, whose subprocess would drown the difference);
  elf.needed_libraries, the program-header reader, against pyelftools (`read_elf(path).needed`).
- install: `qnnctl install --file SDK.zip` into an empty cache; the same two.

Interleaved, the order swapped every round, after one warm-up round. Medians of wall time
and of the child's CPU time (user + system, from wait4). Bytecode caching is on.
"""

from __future__ import annotations

import sys

# -- the launcher: runs in the child, before anything else is imported ------------------------


def _child(variant: str, args: list[str]) -> None:
    if variant == "pyelftools":
        import qnnctl.host.elf

        def needed(path: object) -> tuple[str, ...]:
            return qnnctl.host.elf.read_elf(path).needed  # type: ignore[arg-type]

        qnnctl.host.elf.needed_libraries = needed
    elif variant == "rpmfile":
        import qnnctl.host.packages

        qnnctl.host.packages.rpm_members = _rpmfile_members  # type: ignore[assignment]
    elif variant.startswith("old:"):
        import importlib.util

        spec = importlib.util.spec_from_file_location("qnnctl.host.packages", variant[4:])
        if spec is None or spec.loader is None:
            raise SystemExit(f"cannot load {variant[4:]}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["qnnctl.host.packages"] = module
        spec.loader.exec_module(module)
    from qnnctl.cli import main

    sys.argv = ["qnnctl", *args]
    main()


def _rpmfile_members(path: object) -> object:
    """rpm_members through rpmfile.RPMFile: its cpio index, its decompression, its extractfile."""
    import stat

    import rpmfile

    from qnnctl.host.packages import FILE, SYMLINK, Member, member_name

    with open(path, "rb") as handle:  # type: ignore[call-overload]
        rpm = rpmfile.RPMFile(fileobj=handle)
        for info in rpm.getmembers():
            data = rpm.extractfile(info)
            if info.issymlink:
                yield Member(member_name(info.name), SYMLINK, 0, 0o777, data.read(info.size).decode())
            else:
                yield Member(member_name(info.name), FILE, info.size, stat.S_IMODE(info.mode), "", data)


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    _child(sys.argv[2], sys.argv[3:])
    raise SystemExit(0)

# -- the benchmark ---------------------------------------------------------------------------

import argparse  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NamedTuple  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.host.test_packages import build_rpm, cpio_newc  # noqa: E402
from tests.sdkfactory import VERSION, build_archive, install_tree_into_cache  # noqa: E402

DEBS = ("libc++1-14", "libc++abi1-14", "libunwind-14", "libc6")


class Pair(NamedTuple):
    name: str
    args: list[str]
    variants: tuple[str, str]  # (current, other)
    fresh_cache: bool


class Run(NamedTuple):
    wall: float
    cpu: float


def run_child(variant: str, args: list[str], env: dict[str, str], cwd: Path) -> Run:
    """One command, its wall time and CPU time (user + system) from wait4."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant, *args]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime)


def fetch_debs(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", *DEBS], cwd=folder, check=True, capture_output=True)
    return {deb.name.split("_", 1)[0]: deb for deb in folder.glob("*.deb")}


def glibc_rpm(libc6: Path, dest: Path, compressor: str) -> Path:
    """An RPM of every file, link and folder of libc6's data.tar, as an EL glibc package lays them out."""
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(libc6)], capture_output=True, check=True).stdout
    entries: list[tuple[str, int, bytes, int, int]] = []
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        for ino, info in enumerate(tf, start=1):
            name = "./" + info.name.lstrip("./")
            if info.isdir():
                entries.append((name, stat.S_IFDIR | 0o755, b"", ino, 2))
            elif info.issym():
                entries.append((name, stat.S_IFLNK | 0o777, info.linkname.encode(), ino, 1))
            elif info.isreg():
                member = tf.extractfile(info)
                assert member is not None
                entries.append((name, stat.S_IFREG | stat.S_IMODE(info.mode), member.read(), ino, 1))
    return build_rpm(dest, "glibc", "2.36", "9.el9", cpio_newc(entries), compressor)


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", default="deb,rpm-xz,rpm-zstd,lower,install")
    parser.add_argument("--old-packages", metavar="REV", help="compare the deb pair with packages.py at git REV")
    options = parser.parse_args()
    only = set(options.only.split(","))

    work = Path(tempfile.mkdtemp(prefix="qnnctl-bench-readers-"))
    try:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPATH"] = str(REPO)
        pairs: list[Pair] = []
        debs = fetch_debs(work / "debs") if only & {"deb", "rpm-xz", "rpm-zstd"} else {}
        trio = [a for name in DEBS[:3] for a in ("--runtime-from", str(debs[name]))] if debs else []
        if "deb" in only:
            if options.old_packages:
                old = work / "packages_old.py"
                old.write_bytes(subprocess.run(["git", "show", f"{options.old_packages}:qnnctl/host/packages.py"],
                                               cwd=REPO, capture_output=True, check=True).stdout)
                pairs.append(Pair("deb", ["install", "--runtime", *trio, "--runtime-from", str(debs["libc6"])],
                                  ("current", f"old:{old}"), True))
            else:
                print("deb: skipped (give --old-packages REV to compare with an earlier packages.py)")
        for compressor in ("xz", "zstd"):
            if f"rpm-{compressor}" in only:
                rpm = glibc_rpm(debs["libc6"], work / f"glibc-{compressor}.rpm", compressor)
                print(f"{rpm.name}: {rpm.stat().st_size / 1e6:.1f} MB")
                pairs.append(Pair(f"rpm-{compressor}", ["install", "--runtime", *trio, "--runtime-from", str(rpm)],
                                  ("current", "rpmfile"), True))
        lower_cache = work / "lower-cache"
        if "lower" in only:
            install_tree_into_cache(lower_cache)
            (work / "script.py").write_text("print('lowered')\n")
            pairs.append(Pair("lower", ["lower", "--sdk", VERSION, "--dry-run", "--keep-mkldnn", "script.py"],
                              ("current", "pyelftools"), False))
        if "install" in only:
            archive = build_archive(work, "zip")
            pairs.append(Pair("install", ["install", VERSION, "--file", str(archive)], ("current", "pyelftools"), True))

        results: dict[tuple[str, str], list[Run]] = {}
        counter = 0
        for round_number in range(options.rounds + 1):
            for pair in pairs:
                order = pair.variants if round_number % 2 == 0 else pair.variants[::-1]
                for variant in order:
                    counter += 1
                    cache = work / f"cache{counter}" if pair.fresh_cache else lower_cache
                    child_env = dict(env, QNNCTL_CACHE_DIR=str(cache))
                    if pair.name.startswith(("deb", "rpm")):
                        child_env["QNN_SDK_ROOT"] = ""  # no SDK: only the runtime is staged
                    run = run_child(variant, pair.args, child_env, work)
                    if round_number > 0:  # the first round warms up
                        results.setdefault((pair.name, variant), []).append(run)
                    if pair.fresh_cache:
                        shutil.rmtree(cache, ignore_errors=True)

        print(f"\nPython {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f}, {options.rounds} rounds")
        summary = []
        for pair in pairs:
            current, other = (results[(pair.name, v)] for v in pair.variants)
            row = {
                "pair": pair.name,
                "variants": [pair.variants[0], pair.variants[1].split("/")[-1]],
                "wall_ms": [round(1000 * median([r.wall for r in current])),
                            round(1000 * median([r.wall for r in other]))],
                "cpu_ms": [round(1000 * median([r.cpu for r in current])),
                           round(1000 * median([r.cpu for r in other]))],
            }
            summary.append(row)
            print(f"{pair.name:10} {row['variants'][0]:>10} {row['wall_ms'][0]:5d} ms wall {row['cpu_ms'][0]:5d} ms CPU"
                  f" | {row['variants'][1]:>16} {row['wall_ms'][1]:5d} ms wall {row['cpu_ms'][1]:5d} ms CPU")
        print(json.dumps(summary))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
