"""Install speed: qnnctl against curl + unzip and ExecuTorch's own downloader, side by side.

    python bench/install.py                 # ~100 MB archive, ~2,000 files, 3 rounds
    python bench/install.py --size 1000     # ~1 GB

Builds a synthetic SDK archive in the real layout from chunks of this machine's own shared
libraries (so it compresses like real ones, about 3:1), serves it on 127.0.0.1, and times, in
interleaved rounds: (a) `qnnctl install` into an empty cache, (b) `curl` then `unzip`, and
(c) the reference, `_download_qnn_sdk()` from ExecuTorch 1.5.1's
`backends/qualcomm/scripts/download_qnn_sdk.py`, loaded by file path from the wheel (fetched with
`pip download --no-deps` into a temporary folder). Then a cache-hit install against
`qnnctl --version`. Reports medians, ratios and each one's peak RSS.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

VERSION = "2.37.0.250724"
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


def serve(folder: Path) -> tuple[ThreadingHTTPServer, str]:
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
                    os.sendfile(self.wfile.fileno(), handle.fileno(), start, end - start + 1)
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
    print(json.dumps({"elapsed": elapsed, "maxrss": usage.ru_maxrss,
                      "rc": os.waitstatus_to_exitcode(status), "stderr": err[-4000:]}), flush=True)
"""


class Launcher:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run(self, cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
        """Wall time and peak RSS (KiB, the largest of the process and its descendants)."""
        if self.proc.stdin is None or self.proc.stdout is None:
            raise RuntimeError("launcher pipes are closed")
        self.proc.stdin.write(json.dumps({"cmd": cmd, "env": env or dict(os.environ)}) + "\n")
        self.proc.stdin.flush()
        result = json.loads(self.proc.stdout.readline())
        if result["rc"] != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({result['rc']}):\n{result['stderr']}")
        return float(result["elapsed"]), int(result["maxrss"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


_launcher: Launcher | None = None


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    if _launcher is None:
        raise RuntimeError("the launcher is not started")
    return _launcher.run(cmd, env)


def fetch_reference(workdir: Path) -> Path:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100, help="uncompressed size in MB (default 100)")
    parser.add_argument("--files", type=int, default=2000, help="number of files (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--hit-runs", type=int, default=20, help="runs of the cache-hit comparison")
    parser.add_argument("--no-reference", action="store_true", help="skip ExecuTorch's downloader")
    args = parser.parse_args()
    global _launcher
    _launcher = Launcher()

    qnnctl = [sys.executable, "-m", "qnnctl"]
    with tempfile.TemporaryDirectory(prefix="qnnctl-bench-") as tmp:
        work = Path(tmp)
        archive = build_archive(work, args.size, args.files)
        print(f"archive: {archive.stat().st_size / 1e6:.1f} MB compressed, {args.size} MB uncompressed, "
              f"{args.files} files; {os.cpu_count()} cores", file=sys.stderr)
        httpd, base = serve(work)
        url = f"{base}/{VERSION}/v{VERSION}.zip"
        reference = None if args.no_reference else fetch_reference(work)

        def run_qnnctl(i: int) -> tuple[float, int]:
            env = dict(os.environ, QNNCTL_CACHE_DIR=str(work / f"cache-{i}"), QNNCTL_MIRROR=base)
            env.pop("QNN_SDK_ROOT", None)
            result = timed([*qnnctl, "-q", "install", VERSION], env)
            shutil.rmtree(work / f"cache-{i}")
            return result

        def run_curl(i: int) -> tuple[float, int]:
            out = work / f"curl-{i}"
            out.mkdir()
            zip_path = out / "a.zip"
            result = timed(["bash", "-c", f'curl -sSfo "{zip_path}" "{url}" && unzip -q "{zip_path}" -d "{out}/x"'])
            shutil.rmtree(out)
            return result

        def run_reference(i: int) -> tuple[float, int]:
            dest = work / f"ref-{i}"
            result = timed([sys.executable, "-c", REFERENCE_RUNNER, str(reference), VERSION, url, str(dest)])
            shutil.rmtree(dest)
            return result

        contenders: dict[str, Callable[[int], tuple[float, int]]] = {
            "qnnctl install": run_qnnctl,
            "curl + unzip": run_curl,
        }
        if reference is not None:
            contenders["reference"] = run_reference
        times: dict[str, list[float]] = {name: [] for name in contenders}
        rss: dict[str, int] = dict.fromkeys(contenders, 0)
        for i in range(args.rounds):
            for name, run in contenders.items():
                elapsed, peak = run(i)
                times[name].append(elapsed)
                rss[name] = max(rss[name], peak)
                print(f"round {i + 1}: {name}: {elapsed:.2f}s, peak RSS {peak / 1024:.0f} MB", file=sys.stderr)

        # Cache hit against `qnnctl --version`, interleaved.
        hit_env = dict(os.environ, QNNCTL_CACHE_DIR=str(work / "hit"), QNNCTL_MIRROR=base)
        hit_env.pop("QNN_SDK_ROOT", None)
        timed([*qnnctl, "-q", "install", VERSION], hit_env)
        hit: list[float] = []
        version: list[float] = []
        for _ in range(args.hit_runs):
            hit.append(timed([*qnnctl, "-q", "install", VERSION], hit_env)[0])
            version.append(timed([*qnnctl, "--version"])[0])
        httpd.shutdown()
        _launcher.close()

    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"\n{'':18}{'median':>10}{'peak RSS':>12}")
    for name in contenders:
        print(f"{name:18}{med[name]:>9.2f}s{rss[name] / 1024:>9.0f} MB")
    ours = med["qnnctl install"]
    print(f"\nqnnctl / (curl + unzip) = {ours / med['curl + unzip']:.2f}   (target <= 0.7)")
    if "reference" in med:
        print(f"qnnctl / reference      = {ours / med['reference']:.2f}   (target <= 0.7)")
    print(f"cache hit: {statistics.median(hit) * 1000:.0f} ms vs qnnctl --version "
          f"{statistics.median(version) * 1000:.0f} ms: ratio {statistics.median(hit) / statistics.median(version):.2f}"
          "   (target <= 1.3)")


if __name__ == "__main__":
    main()
