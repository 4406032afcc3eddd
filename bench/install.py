"""Install speed: qnnctl against curl + unzip and ExecuTorch's own downloader, side by side.

    python bench/install.py                 # ~100 MB archive, ~2,000 files, 3 rounds
    python bench/install.py --size 1000     # ~1 GB

Builds a synthetic SDK archive in the real layout from chunks of this machine's own shared
libraries (so it compresses like real ones, about 3:1), serves it on 127.0.0.1, and times, in
interleaved rounds: (a) `qnnctl install` into an empty cache, (b) `curl` then `unzip`, and
(c) the reference, `_download_qnn_sdk()` from ExecuTorch 1.5.1's
`backends/qualcomm/scripts/download_qnn_sdk.py`, loaded by file path from the wheel (fetched with
`pip download --no-deps` into a temporary folder). Then a cache-hit install against
`qnnctl --version`. Reports medians of wall and CPU time, ratios and each one's peak RSS.

    python bench/install.py --size 400 --no-reference --against df6cbb8

With `--against COMMIT`, that commit's build is one more contender, and both builds run from
source (`python -m qnnctl` with their folder on PYTHONPATH, as bench/startup.py explains), so
that their ratio is the code's alone, whatever the machine's load.

The order of the contenders rotates every round, and one warm-up round is not counted. What
each run extracts is kept until the end: deleting thousands of files just before the next
run makes creating files slower on some file systems (ext4 without a journal skips inodes
freed in the last 30 s), which would favour whoever runs first. Each run starts after an
`os.sync()`, so that the kernel writes back what the run before it wrote before the clock
starts, not on a core the next contender needs. Bytecode caching is on for the children, as
after a normal install.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

from startup import Build, builds, compiled

VERSION = "2.37.0.250724"
DROP_CACHES = "/proc/sys/vm/drop_caches"
REFERENCE_WHEEL = "executorch==1.5.1"
REFERENCE_SCRIPT = "executorch/backends/qualcomm/scripts/download_qnn_sdk.py"


# -- the archive ---------------------------------------------------------------------------


def _library_chunks(total: int) -> Callable[[int, int], bytes]:
    """Bytes taken from this machine's shared libraries, cycled: they compress like real ones."""
    sources = sorted(
        p for p in glob.glob("/usr/lib/x86_64-linux-gnu/*.so*") if os.path.isfile(p) and not os.path.islink(p)
    )
    pool = bytearray()
    for path in sources:
        pool += Path(path).read_bytes()
        if len(pool) >= min(total, 64 << 20):
            break
    if not pool:
        raise SystemExit("no shared libraries found under /usr/lib/x86_64-linux-gnu")

    def chunk(offset: int, size: int) -> bytes:
        start = offset % len(pool)
        out = bytearray()
        while len(out) < size:
            out += pool[start : start + size - len(out)]
            start = 0
        return bytes(out)

    return chunk


def build_archive(dest: Path, size_mb: int, files: int) -> Path:
    total = size_mb << 20
    chunk = _library_chunks(total)
    archive = dest / f"v{VERSION}.zip"
    top = f"qairt/{VERSION}"
    # A few large libraries (as in the real SDK) and many small files.
    big = [f"lib/x86_64-linux-clang/libQnn{n}.so" for n in ("Htp", "System", "Cpu", "HtpPrepare", "Gpu")]
    big_share = total // 2
    small_count = max(files - len(big), 1)
    small_size = max((total - big_share) // small_count, 1)
    offset = 0
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name in big:
            size = big_share // len(big)
            zf.writestr(_info(f"{top}/{name}", 0o755), chunk(offset, size))
            offset += size
        for i in range(small_count):
            folder = ("lib/hexagon-v73/unsigned", "lib/aarch64-android", "include/QNN", "docs", "share")[i % 5]
            zf.writestr(_info(f"{top}/{folder}/file{i:05d}.bin", 0o644), chunk(offset, small_size))
            offset += small_size
        zf.writestr(_info(f"{top}/bin/x86_64-linux-clang/qnn-net-run", 0o755), b"#!/bin/sh\necho ok\n")
        zf.writestr(_info(f"{top}/sdk.yaml", 0o644), f"version: {VERSION}\n".encode())
    return archive


def _info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2025, 7, 24, 0, 0, 0))
    info.create_system = 3
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


# -- a file server with Range support ------------------------------------------------------


def serve(folder: Path, rate: float | None = None) -> tuple[ThreadingHTTPServer, str]:
    """Serve `folder` on 127.0.0.1, at `rate` MB/s when given (a network, not loopback)."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = folder / self.path.lstrip("/").split("/")[-1]
            if not path.is_file():
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            size = path.stat().st_size
            start, end = 0, size - 1
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                first, _, last = rng[6:].partition("-")
                start = int(first) if first else max(0, size - int(last))
                end = int(last) if first and last else size - 1
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Type", "application/zip")
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            with open(path, "rb") as handle:
                try:
                    if rate is None:
                        os.sendfile(self.wfile.fileno(), handle.fileno(), start, end - start + 1)
                        return
                    began = time.monotonic()
                    sent = 0
                    while start + sent <= end:
                        sent += os.sendfile(self.wfile.fileno(), handle.fileno(), start + sent,
                                            min(256 << 10, end - start + 1 - sent))
                        ahead = sent / (rate * 1e6) - (time.monotonic() - began)
                        if ahead > 0:
                            time.sleep(ahead)
                except (BrokenPipeError, ConnectionResetError):
                    pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    host, port = httpd.server_address[:2]
    return httpd, f"http://{host!s}:{port}"


# -- timing --------------------------------------------------------------------------------


# Peak RSS comes from wait4(), which reports the largest RSS among a process and the
# descendants it waited for. Linux carries a forked child's pre-exec high-water mark into that
# figure, so a child forked from this (large) process would report this process's size. The
# commands are therefore started by a small launcher forked while this process is still small.
LAUNCHER = """
import json, os, subprocess, sys, time
for line in sys.stdin:
    job = json.loads(line)
    start = time.perf_counter()
    proc = subprocess.Popen(job["cmd"], env=job["env"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    print(json.dumps({"elapsed": elapsed, "maxrss": usage.ru_maxrss, "cpu": usage.ru_utime + usage.ru_stime,
                      "rc": os.waitstatus_to_exitcode(status), "stderr": err[-4000:]}), flush=True)
"""


class Launcher:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run(self, cmd: list[str], env: dict[str, str] | None = None) -> Run:
        """Wall time, CPU time and peak RSS (KiB, the largest of the process and its descendants)."""
        if self.proc.stdin is None or self.proc.stdout is None:
            raise RuntimeError("launcher pipes are closed")
        self.proc.stdin.write(json.dumps({"cmd": cmd, "env": env or dict(os.environ)}) + "\n")
        self.proc.stdin.flush()
        result = json.loads(self.proc.stdout.readline())
        if result["rc"] != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({result['rc']}):\n{result['stderr']}")
        return Run(float(result["elapsed"]), float(result["cpu"]), int(result["maxrss"]))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


class Run(NamedTuple):
    wall: float
    cpu: float  # user + system, of the process and its descendants
    maxrss: int  # KiB


_launcher: Launcher | None = None


def timed(cmd: list[str], env: dict[str, str] | None = None) -> Run:
    if _launcher is None:
        raise RuntimeError("the launcher is not started")
    return _launcher.run(cmd, env)


def fetch_reference(workdir: Path) -> Path:
    # ExecuTorch's installer downloads with requests, which qnnctl no longer installs.
    if importlib.util.find_spec("requests") is None:
        raise SystemExit("ExecuTorch's installer needs requests: `pip install requests`, or run with --no-reference")
    wheel_dir = workdir / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel_dir), REFERENCE_WHEEL],
        check=True,
    )
    wheel = next(wheel_dir.glob("executorch-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        target = workdir / "reference" / "download_qnn_sdk.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(zf.read(REFERENCE_SCRIPT))
    return target


REFERENCE_RUNNER = """
import importlib.util, pathlib, sys
spec = importlib.util.spec_from_file_location("download_qnn_sdk", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
mod.QNN_VERSION = sys.argv[2]
mod.QNN_ZIP_URL = sys.argv[3]
if mod._download_qnn_sdk(pathlib.Path(sys.argv[4])) is None:
    sys.exit(1)
"""


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    # Bytecode caching on, as after a normal install; no SDK chosen by the caller's shell.
    for name in ("PYTHONDONTWRITEBYTECODE", "QNN_SDK_ROOT", "QNNCTL_DEBUG"):
        env.pop(name, None)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100, help="uncompressed size in MB (default 100)")
    parser.add_argument("--files", type=int, default=2000, help="number of files (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds not counted (default 1)")
    parser.add_argument("--hit-runs", type=int, default=20, help="runs of the cache-hit comparison")
    parser.add_argument("--no-reference", action="store_true", help="skip ExecuTorch's downloader")
    parser.add_argument("--only", choices=("qnnctl", "curl", "reference"), action="append",
                        help="time only these (repeatable)")
    parser.add_argument("--rate", type=float, help="serve at this many MB/s, like a network (default: as fast "
                        "as loopback goes)")
    parser.add_argument("--tmp", type=Path, help="where to build, serve and extract (default: the system's)")
    parser.add_argument("--drop-caches", action="store_true", help="before each run, write back and drop the "
                        "page cache (root only), so that every contender writes into pages the machine has at hand")
    parser.add_argument("--against", metavar="COMMIT", help="that commit's build too, interleaved (both from "
                        "source)")
    args = parser.parse_args()
    if args.drop_caches and not os.access(DROP_CACHES, os.W_OK):
        parser.error(f"--drop-caches writes {DROP_CACHES}: run as root")
    with builds(args.against) as contending:
        for build in contending:
            compiled(build)
        run(args, contending)


def run(args: argparse.Namespace, contending: list[Build]) -> None:
    global _launcher
    _launcher = Launcher()
    # Without --against: the installed `qnnctl` script next to this interpreter, as a user runs it.
    qnnctl = contending[0].argv
    with tempfile.TemporaryDirectory(prefix="qnnctl-bench-", dir=args.tmp) as tmp:
        work = Path(tmp)
        archive = build_archive(work, args.size, args.files)
        compressed = archive.stat().st_size
        needed = (args.rounds + args.warmup) * 3 * ((args.size << 20) + archive.stat().st_size)
        if shutil.disk_usage(work).free < needed:
            raise SystemExit(f"{work} needs about {needed >> 30} GiB free for the extracted trees")
        print(f"archive: {archive.stat().st_size / 1e6:.1f} MB compressed, {args.size} MB uncompressed, "
              f"{args.files} files; {os.cpu_count()} cores; load average {_load()}; served at "
              f"{f'{args.rate:g} MB/s' if args.rate else 'loopback speed'}", file=sys.stderr)
        httpd, base = serve(work, args.rate)
        url = f"{base}/{VERSION}/v{VERSION}.zip"
        want_reference = not args.no_reference and (not args.only or "reference" in args.only)
        reference = fetch_reference(work) if want_reference else None
        runs = work / "runs"
        runs.mkdir()

        def installer(build: Build) -> Callable[[int], Run]:
            def run_qnnctl(i: int) -> Run:
                cache = runs / f"cache-{build.label.replace(' ', '-')}-{i}"
                return timed([*build.argv, "-q", "install", VERSION],
                             child_env(QNNCTL_CACHE_DIR=str(cache), QNNCTL_MIRROR=base, **build.env))
            return run_qnnctl

        def run_curl(i: int) -> Run:
            out = runs / f"curl-{i}"
            out.mkdir()
            zip_path = out / "a.zip"
            return timed(["bash", "-c", f'curl -sSfo "{zip_path}" "{url}" && unzip -q "{zip_path}" -d "{out}/x"'])

        def run_reference(i: int) -> Run:
            dest = runs / f"ref-{i}"
            return timed([sys.executable, "-c", REFERENCE_RUNNER, str(reference), VERSION, url, str(dest)],
                         child_env())

        contenders: dict[str, Callable[[int], Run]] = {}
        if not args.only or "qnnctl" in args.only:
            contenders["qnnctl install"] = installer(contending[0])
            for earlier in contending[1:]:
                contenders[f"qnnctl {earlier.label}"] = installer(earlier)
        if not args.only or "curl" in args.only:
            contenders["curl + unzip"] = run_curl
        if reference is not None:
            contenders["reference"] = run_reference
        results: dict[str, list[Run]] = {name: [] for name in contenders}
        names = list(contenders)
        for i in range(args.warmup + args.rounds):
            counted = i >= args.warmup
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                # What the previous run wrote is written back now, not by the kernel's flusher
                # threads during this run, where they would take a core from whoever runs next.
                os.sync()
                if args.drop_caches:
                    Path(DROP_CACHES).write_text("3\n")
                result = contenders[name](i)
                if counted:
                    results[name].append(result)
                label = f"round {i - args.warmup + 1}" if counted else "warm-up"
                print(f"{label}: {name}: {result.wall:.2f}s wall, {result.cpu:.2f}s CPU, "
                      f"peak RSS {result.maxrss / 1024:.0f} MB", file=sys.stderr)

        hit: list[float] = []
        version: list[float] = []
        if "qnnctl install" in contenders and args.hit_runs:
            # Cache hit against `qnnctl --version`, interleaved, the order alternating.
            hit_env = child_env(QNNCTL_CACHE_DIR=str(runs / f"cache-{contending[0].label.replace(' ', '-')}-0"),
                                QNNCTL_MIRROR=base, **contending[0].env)
            hit_cmd = [*qnnctl, "-q", "install", VERSION]
            for _ in range(3):
                timed(hit_cmd, hit_env)
                timed([*qnnctl, "--version"], child_env(**contending[0].env))
            for i in range(args.hit_runs):
                pair = [(hit, hit_cmd, hit_env), (version, [*qnnctl, "--version"], child_env(**contending[0].env))]
                for into, cmd, env in pair if i % 2 == 0 else pair[::-1]:
                    into.append(timed(cmd, env).wall)
        httpd.shutdown()
        _launcher.close()
        load_after = _load()

    def med(name: str, field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in results[name]))

    print(f"\n{compressed / 1e6:.0f} MB archive, {args.size} MB in {args.files} files, served at "
          f"{f'{args.rate:g} MB/s' if args.rate else 'loopback speed'}; {os.cpu_count()} cores; "
          f"load average at the end {load_after}")
    width = max(18, *(len(name) + 2 for name in contenders))
    print(f"{'':{width}}{'median wall':>12}{'median CPU':>12}{'peak RSS':>10}")
    for name in contenders:
        peak = max(r.maxrss for r in results[name])
        print(f"{name:{width}}{med(name, 'wall'):>11.2f}s{med(name, 'cpu'):>11.2f}s{peak / 1024:>7.0f} MB")
    if "qnnctl install" in contenders:
        ours = med("qnnctl install", "wall")
        if "curl + unzip" in contenders:
            rounds = [a.wall / b.wall for a, b in zip(results["qnnctl install"], results["curl + unzip"], strict=True)]
            print(f"\nqnnctl / (curl + unzip) = {ours / med('curl + unzip', 'wall'):.2f}   (target <= 0.40); "
                  f"median of the rounds' ratios {statistics.median(rounds):.2f}")
        if "reference" in contenders:
            print(f"qnnctl / reference      = {ours / med('reference', 'wall'):.2f}   (target <= 0.55)")
        for earlier in contending[1:]:
            name = f"qnnctl {earlier.label}"
            print(f"qnnctl / {earlier.label} = {ours / med(name, 'wall'):.2f} wall, "
                  f"{med('qnnctl install', 'cpu') / med(name, 'cpu'):.2f} CPU")
    if hit:
        print(f"cache hit: {statistics.median(hit) * 1000:.0f} ms vs qnnctl --version "
              f"{statistics.median(version) * 1000:.0f} ms: ratio "
              f"{statistics.median(hit) / statistics.median(version):.2f}   (target <= 1.3)")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
