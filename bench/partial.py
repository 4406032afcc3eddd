"""Installing some components: `install --components host` against a whole install.

    python bench/partial.py                      # ~1.5 GB archive, ~10,000 entries, 50 MB/s
    python bench/partial.py --scale 0.25         # the same shape, a quarter of the bytes
    python bench/partial.py --tmp /dev/shm --rounds 3

Builds a synthetic archive shaped like a QAIRT release (2.42.0.251225: 1,543,955,191 bytes,
10,910 entries, 3.48 GB unpacked): the real folders (host libraries and tools, headers,
lib/python, share; Android; six Hexagon generations; embedded Linux and Windows builds;
documentation and examples), the host component about 15% of the compressed bytes, files
made of this machine's shared libraries with a sixth of random bytes so that they compress
about as the real ones do (2.25:1). It is kept in the --tmp folder for the next run.

Serves it on 127.0.0.1 at --rate MB/s for all connections together (a network link, not one
limit per connection, so several requests at a time gain nothing from the rate), with Range
support, and times, interleaved, the order rotating every round, after one warm-up round:
(a) `qnnctl install VERSION` into an empty cache, (b) `curl` then `unzip`, and (c) `qnnctl
install VERSION --components host` into an empty cache. Each command is started by
bench/install.py's launcher, which reads wall time, CPU time and peak RSS from wait4(). The
bytes the server sent for each run are counted too. Each run's output is deleted after it
(else 1.5 GB archives and 3.5 GB trees pile up); --keep keeps them until the end.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from install import VERSION, Launcher, Run, _info, _library_chunks, child_env  # noqa: E402  (bench/install.py)

TOP = f"qairt/{VERSION}"
HOST_LIBS = ("libQnnHtp.so", "libQnnSystem.so", "libQnnCpu.so", "libQnnHtpPrepare.so", "libQnnGpu.so")
RANDOM_SHARE = 1 / 6  # random bytes among library bytes (which deflate 3:1): about 2.25:1 overall

# (folder, files, MB unpacked, component) at scale 1: 3.5 GB unpacked in about 10,000 entries.
LAYOUT: list[tuple[str, int, int, str]] = [
    ("lib/x86_64-linux-clang", 45, 440, "host"),
    ("bin/x86_64-linux-clang", 60, 45, "host"),
    ("include/QNN", 900, 9, "host"),
    ("lib/python/qti/aisw", 1400, 28, "host"),
    ("share/QNN", 250, 12, "host"),
    ("lib/aarch64-android", 60, 420, "android"),
    ("bin/aarch64-android", 60, 40, "android"),
    *[(f"lib/hexagon-v{g}/unsigned", 22, 140, f"hexagon-v{g}") for g in (68, 69, 73, 75, 79, 81)],
    ("lib/aarch64-oe-linux-gcc11.2", 60, 400, "all"),
    ("lib/aarch64-ubuntu-gcc9.4", 60, 380, "all"),
    ("lib/x86_64-windows-msvc", 80, 420, "all"),
    ("bin/x86_64-windows-msvc", 60, 60, "all"),
    ("docs/QNN", 5200, 300, "docs"),
    ("examples/QNN", 1500, 95, "docs"),
    ("benchmarks/QNN", 80, 10, "all"),
]


def build_archive(dest: Path, scale: float) -> Path:
    """The synthetic release, reused when one of this scale is there already."""
    archive = dest / f"v{VERSION}-scale{scale:g}.zip"
    if archive.is_file():
        return archive
    total = int(sum(mb for _, _, mb, _ in LAYOUT) * scale) << 20
    chunk = _library_chunks(total)
    noise = random.Random(15)
    partial = archive.with_suffix(".part")
    offset = 0
    started = time.monotonic()
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        entries = [(f"{TOP}/{name}", 0o644, f"version: {VERSION}\n".encode()) for name in ("sdk.yaml",)]
        entries.append((f"{TOP}/QNN_README.txt", 0o644, b"Qualcomm AI Runtime SDK\n" * 40))
        for name, data_mode, data in entries:
            zf.writestr(_info(name, data_mode), data)
        for folder, files, mb, _ in sorted(LAYOUT):
            count = max(1, int(files * min(1.0, scale * 4)))  # fewer, larger files at a small scale
            size = max(1, int(mb * scale * (1 << 20)) // count)
            mode = 0o755 if folder.startswith("bin/") else 0o644
            for i in range(count):
                # Libraries of very different sizes, as in the real folders.
                this = size * (1 + (i % 5)) // 3 if folder.startswith("lib/") else size
                name = HOST_LIBS[i] if folder == "lib/x86_64-linux-clang" and i < len(HOST_LIBS) else \
                    f"f{i:05d}{_suffix(folder)}"
                zf.writestr(_info(f"{TOP}/{folder}/{name}", mode), _content(chunk, offset, this, noise))
                offset += this
    os.replace(partial, archive)
    print(f"built {archive.name}: {archive.stat().st_size / 1e6:.0f} MB in {time.monotonic() - started:.0f}s",
          file=sys.stderr)
    return archive


def _suffix(folder: str) -> str:
    if folder.startswith(("lib/", "bin/aarch64-android")):
        return ".so"
    return {"include": ".h", "docs": ".html", "examples": ".py"}.get(folder.split("/")[0], ".bin")


def _content(chunk: Callable[[int, int], bytes], offset: int, size: int, noise: random.Random) -> bytes:
    """Library bytes with a share of random ones, in 64 KiB blocks."""
    out = bytearray()
    block = 64 << 10
    while len(out) < size:
        take = min(block, size - len(out))
        wild = int(take * RANDOM_SHARE)
        out += chunk(offset + len(out), take - wild) + noise.randbytes(wild)
    return bytes(out)


def component_bytes(archive: Path) -> dict[str, tuple[int, int]]:
    """(compressed, unpacked) bytes of each component, by the rules qnnctl uses."""
    from qnnctl.sdk.members import component_of

    found: dict[str, list[int]] = {}
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            rel = info.filename[len(TOP) + 1:]
            name = component_of(rel.rstrip("/"), info.is_dir()) or "all"
            sizes = found.setdefault(name, [0, 0])
            sizes[0] += info.compress_size
            sizes[1] += info.file_size
    return {name: (c, u) for name, (c, u) in found.items()}


# -- a server with one rate for every connection ---------------------------------------------------


class Server:
    """Serves one file on 127.0.0.1 with Range support, at `rate` bytes/s shared by every
    connection, counting the body bytes sent."""

    def __init__(self, archive: Path, rate: float | None) -> None:
        self.archive = archive
        self.rate = rate
        self.sent = 0
        self.lock = threading.Lock()
        self.next_send = 0.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        host, port = self.httpd.server_address[:2]
        self.base = f"http://{host!s}:{port}"

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        if not h.path.endswith(f"/v{VERSION}.zip"):
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        size = self.archive.stat().st_size
        start, end = 0, size - 1
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and "," not in rng:
            first, _, last = rng[6:].partition("-")
            start = int(first) if first else max(0, size - int(last))
            end = min(int(last), size - 1) if first and last else size - 1
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            h.send_response(200)
        h.send_header("Content-Type", "application/zip")
        h.send_header("Content-Length", str(end - start + 1))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("ETag", f'"{size:x}"')
        h.end_headers()
        with open(self.archive, "rb") as handle:
            position = start
            try:
                while position <= end:
                    block = min(256 << 10, end - position + 1)
                    self.wait(block)
                    sent = os.sendfile(h.wfile.fileno(), handle.fileno(), position, block)
                    position += sent
                    with self.lock:
                        self.sent += sent
            except (BrokenPipeError, ConnectionResetError):
                pass

    def wait(self, size: int) -> None:
        if self.rate is None:
            return
        with self.lock:
            now = time.monotonic()
            due = max(self.next_send, now)
            self.next_send = due + size / self.rate
        if due > now:
            time.sleep(due - now)

    def close(self) -> None:
        self.httpd.shutdown()


class Result(NamedTuple):
    run: Run
    sent: int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="of the 1.5 GB archive (default 1)")
    parser.add_argument("--rate", type=float, default=50,
                        help="MB/s for all connections together (default 50; 0: as fast as loopback goes)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds not counted (default 1)")
    parser.add_argument("--tmp", type=Path, help="where to build, serve and extract (default: the system's)")
    parser.add_argument("--keep", action="store_true", help="keep each run's output until the end")
    args = parser.parse_args()
    launcher = Launcher()
    script = Path(sys.executable).with_name("qnnctl")
    qnnctl = [str(script)] if os.access(script, os.X_OK) else [sys.executable, "-m", "qnnctl"]
    base_dir = args.tmp or Path(tempfile.gettempdir())
    archive = build_archive(base_dir, args.scale)
    sizes = component_bytes(archive)
    compressed = archive.stat().st_size
    entries = len(zipfile.ZipFile(archive).infolist())
    host_c, host_u = sizes["host"]
    speed = f"{args.rate:g} MB/s" if args.rate else "loopback speed"
    print(f"archive: {compressed / 1e6:.0f} MB, {entries} entries, "
          f"{sum(u for _, u in sizes.values()) / 1e9:.2f} GB unpacked; host {host_c / 1e6:.0f} MB compressed "
          f"({100 * host_c / compressed:.1f}%), {host_u / 1e6:.0f} MB unpacked; served at {speed}; "
          f"{os.cpu_count()} cores; load average {_load()}", file=sys.stderr)
    server = Server(archive, args.rate * 1e6 if args.rate else None)
    url = f"{server.base}/{VERSION}/v{VERSION}.zip"
    with tempfile.TemporaryDirectory(prefix="qnnctl-bench-partial-", dir=base_dir) as tmp:
        runs = Path(tmp)

        def measured(cmd: list[str], env: dict[str, str] | None, out: Path) -> Result:
            before = server.sent
            run = launcher.run(cmd, env)
            result = Result(run, server.sent - before)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
            return result

        def full(i: int) -> Result:
            cache = runs / f"full-{i}"
            return measured([*qnnctl, "-q", "install", VERSION],
                            child_env(QNNCTL_CACHE_DIR=str(cache), QNNCTL_MIRROR=server.base), cache)

        def host(i: int) -> Result:
            cache = runs / f"host-{i}"
            return measured([*qnnctl, "-q", "install", VERSION, "--components", "host"],
                            child_env(QNNCTL_CACHE_DIR=str(cache), QNNCTL_MIRROR=server.base), cache)

        def curl(i: int) -> Result:
            out = runs / f"curl-{i}"
            out.mkdir()
            return measured(["bash", "-c", f'curl -sSfo "{out}/a.zip" "{url}" && unzip -q "{out}/a.zip" -d "{out}/x"'],
                            None, out)

        contenders: dict[str, Callable[[int], Result]] = {
            "qnnctl install": full, "curl + unzip": curl, "--components host": host,
        }
        results: dict[str, list[Result]] = {name: [] for name in contenders}
        names = list(contenders)
        for i in range(args.warmup + args.rounds):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                result = contenders[name](i)
                counted = i >= args.warmup
                if counted:
                    results[name].append(result)
                label = f"round {i - args.warmup + 1}" if counted else "warm-up"
                print(f"{label}: {name}: {result.run.wall:.2f}s wall, {result.run.cpu:.2f}s CPU, peak RSS "
                      f"{result.run.maxrss / 1024:.0f} MB, {result.sent / 1e6:.1f} MB sent", file=sys.stderr)
    server.close()
    launcher.close()

    def med(name: str, get: Callable[[Result], float]) -> float:
        return float(statistics.median(get(r) for r in results[name]))

    print(f"\n{compressed / 1e6:.0f} MB archive, {entries} entries, host {host_c / 1e6:.0f} MB compressed "
          f"({100 * host_c / compressed:.1f}%), served at {speed}; {os.cpu_count()} cores; "
          f"load average at the end {_load()}")
    print(f"{'':20}{'median wall':>12}{'median CPU':>12}{'peak RSS':>10}{'sent':>12}")
    for name in contenders:
        peak = max(r.run.maxrss for r in results[name])
        print(f"{name:20}{med(name, lambda r: r.run.wall):>11.2f}s{med(name, lambda r: r.run.cpu):>11.2f}s"
              f"{peak / 1024:>7.0f} MB{med(name, lambda r: r.sent) / 1e6:>9.1f} MB")
    ours = med("--components host", lambda r: r.run.wall)
    print(f"\nhost / qnnctl install = {ours / med('qnnctl install', lambda r: r.run.wall):.3f}   (target <= 0.2)")
    print(f"host / (curl + unzip) = {ours / med('curl + unzip', lambda r: r.run.wall):.3f}   (target <= 0.2)")
    sent = max(r.sent for r in results["--components host"])
    print(f"sent / host compressed = {sent / host_c:.4f}   (target <= 1.05)")
    peak_host = max(r.run.maxrss for r in results["--components host"])
    peak_full = max(r.run.maxrss for r in results["qnnctl install"])
    print(f"peak RSS host / full = {peak_host / peak_full:.2f}   (target <= 1)")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
