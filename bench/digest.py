"""What the per-file sha256 costs an install: per MiB in one process, and on the whole command.

    python bench/digest.py                    # per MiB, then 400 MB installs, 10 rounds
    python bench/digest.py --size 100 --rounds 15
    python bench/digest.py --rounds 0         # per MiB only

1. Per MiB, over the same 1 MiB blocks (this machine's shared libraries, which bench/install.py's
   archive is made of): hashlib's sha256, and the crc32 and raw inflate (the blocks deflated at
   level 6, as zip members are) of zlib and of each faster zlib installed: ISA-L's (python-isal,
   what qnnctl uses) and zlib-ng's. Interleaved, the order swapped every repeat, three warm-up repeats; medians.
2. On the whole command: `qnnctl install VERSION` of bench/install.py's archive into an empty
   cache as it is (CRC-32 and sha256 of every file written) and with the per-file sha256 taken
   out (a launcher replaces `hashlib` in qnnctl.install.archive with one whose digest does nothing, so
   the manifest it writes is wrong; the archive's own sha256 is still taken). Interleaved, the
   order swapped every round, after one warm-up round, each started by bench/install.py's
   launcher. Medians of wall and CPU time (wait4), and the median of the CPU difference within
   each round, which a busy machine moves least. What each run extracts is kept until the end
   (see bench/install.py).
"""

from __future__ import annotations

import sys
from typing import Any


def _child(variant: str, args: list[str]) -> None:
    if variant == "crc-only":
        import qnnctl.install.archive

        class _Nothing:
            def update(self, data: Any) -> None:
                pass

            def hexdigest(self) -> str:
                return "0" * 64  # a sha256's length, so that nothing reads the file again

        class _Hashlib:
            @staticmethod
            def sha256(data: Any = b"") -> _Nothing:
                return _Nothing()

        qnnctl.install.archive.hashlib = _Hashlib  # type: ignore[attr-defined,assignment]
    from qnnctl.cli import main

    sys.argv = ["qnnctl", *args]
    main()


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    _child(sys.argv[2], sys.argv[3:])
    raise SystemExit(0)

import argparse  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import install as bench_install  # noqa: E402  (bench/install.py)
from install import VERSION, Launcher, Run, build_archive, child_env, serve  # noqa: E402

BLOCK = 1 << 20


def inflaters() -> dict[str, Any]:
    """zlib, and the faster zlibs that are installed: ISA-L's (python-isal, what qnnctl uses) and
    zlib-ng's (its dependency until 2026-12-05)."""
    found: dict[str, Any] = {"zlib": zlib}
    for label, name in (("isal", "isal.isal_zlib"), ("zlib-ng", "zlib_ng.zlib_ng")):
        try:
            found[label] = importlib.import_module(name)
        except ImportError:
            pass
    return found


def per_mib(blocks: list[bytes], repeats: int) -> dict[str, float]:
    """Milliseconds per MiB of each operation over `blocks`, medians of `repeats`: the CRC-32
    and the raw inflate (as a zip member is) of every zlib installed, and hashlib's sha256."""
    deflated = []
    for block in blocks:
        packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
        deflated.append(packer.compress(block) + packer.flush())

    def crc(module: Any) -> Callable[[], None]:
        def run() -> None:
            value = 0
            for block in blocks:
                value = module.crc32(block, value)
        return run

    def inflate(module: Any) -> Callable[[], None]:
        def run() -> None:
            for data in deflated:
                module.decompressobj(-zlib.MAX_WBITS).decompress(data)
        return run

    def sha256() -> None:
        digest = hashlib.sha256()
        for block in blocks:
            digest.update(block)
        digest.hexdigest()

    jobs: dict[str, Callable[[], None]] = {"sha256 (hashlib)": sha256}
    for label, module in inflaters().items():
        jobs[f"crc32 ({label})"] = crc(module)
        jobs[f"inflate ({label})"] = inflate(module)
    times: dict[str, list[float]] = {name: [] for name in jobs}
    names = list(jobs)
    for i in range(repeats + 3):
        for name in names if i % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            jobs[name]()
            if i >= 3:
                times[name].append(time.perf_counter() - start)
    mib = len(blocks) * BLOCK / (1 << 20)
    return {name: 1000 * statistics.median(values) / mib for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64, help="MiB hashed per repeat (default 64)")
    parser.add_argument("--repeats", type=int, default=15, help="repeats per MiB figure (default 15)")
    parser.add_argument("--size", type=int, default=400, help="the install's archive, MB uncompressed (default 400)")
    parser.add_argument("--files", type=int, default=2000, help="its number of files (default 2000)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved install rounds (default 10; 0: none)")
    parser.add_argument("--tmp", type=Path, help="where to build, serve and extract (default: the system's)")
    args = parser.parse_args()

    chunk = bench_install._library_chunks(args.mib * BLOCK)
    blocks = [chunk(i * BLOCK, BLOCK) for i in range(args.mib)]
    costs = per_mib(blocks, args.repeats)
    print(f"per MiB ({args.mib} MiB, {args.repeats} repeats; {os.cpu_count()} cores; load average {_load()}):")
    for name, ms in costs.items():
        print(f"  {name:18} {ms:6.3f} ms/MiB  {1000 / ms:6.0f} MiB/s")
    if args.rounds <= 0:
        return

    launcher = Launcher()
    variants = ("crc + sha256", "crc-only")
    results: dict[str, list[Run]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="qnnctl-bench-digest-", dir=args.tmp) as tmp:
        work = Path(tmp)
        archive = build_archive(work, args.size, args.files)
        httpd, base = serve(work)
        print(f"\narchive: {archive.stat().st_size / 1e6:.1f} MB compressed, {args.size} MB in {args.files} files; "
              f"load average {_load()}", file=sys.stderr)
        for i in range(args.rounds + 1):
            for name in variants if i % 2 == 0 else variants[::-1]:
                cache = work / f"cache-{i}-{name.replace(' ', '')}"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "-q", "install", VERSION]
                run = launcher.run(cmd, child_env(QNNCTL_CACHE_DIR=str(cache), QNNCTL_MIRROR=base))
                if i > 0:
                    results[name].append(run)
                label = f"round {i}" if i else "warm-up"
                print(f"{label}: {name}: {run.wall:.2f}s wall, {run.cpu:.2f}s CPU", file=sys.stderr)
        httpd.shutdown()
    launcher.close()

    print(f"\n{args.size} MB in {args.files} files, {args.rounds} rounds; load average at the end {_load()}")
    for name in variants:
        runs = results[name]
        print(f"  {name:14} wall {statistics.median(r.wall for r in runs):5.2f}s   "
              f"CPU {statistics.median(r.cpu for r in runs):5.2f}s")
    both, crc = results[variants[0]], results[variants[1]]
    extra = statistics.median(a.cpu - b.cpu for a, b in zip(both, crc, strict=True))
    print(f"  per-file sha256, within a round: {extra:+.2f}s CPU (median); "
          f"expected from the per-MiB figure: {args.size * 1e6 / (1 << 20) * costs['sha256 (hashlib)'] / 1000:.2f}s")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
