"""What the downloader's own resume loop is worth: a connection that drops half-way.

    python bench/resume.py                  # ~100 MB unpacked (a 33 MB archive), 3 rounds
    python bench/resume.py --size 300 --rounds 5

A retry policy that repeats a request (urllib3's Retry, which qnnctl's was once built on)
cannot resume a body that broke off after the headers, so qnnctl keeps a small loop that asks
again with Range and If-Range. This times `qnnctl install` (the installed script, an empty cache each
run) against an archive served on 127.0.0.1 by the tests' fault-injecting server, in three
cases, interleaved and rotating, after one warm-up round:

- `whole`: no fault;
- `resumed`: the connection drops after half the archive, and qnnctl resumes from there;
- `again`: the same drop, after which the server ignores Range, so the whole archive comes
  again: what a request-level retry alone costs.

Served at loopback speed, so the time is what the extra work costs this machine (a restart
also ends the extraction that ran while the archive arrived); over a network the bytes sent
matter more. Prints medians of wall time and of the bytes the server sent. Each case that
drops waits the policy's first backoff (1 s) before it asks again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from install import VERSION, build_archive  # noqa: E402  (bench/install.py)

from tests.httpserver import Fault, FaultServer  # noqa: E402

PATH = f"/{VERSION}/v{VERSION}.zip"


def qnnctl() -> list[str]:
    script = Path(sys.executable).with_name("qnnctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "qnnctl"]


def sent_bytes(server: FaultServer, size: int, drop: int, case: str) -> int:
    """What the server sent for the GETs of this run (a dropped one sent `drop` bytes)."""
    total = 0
    for i, request in enumerate(server.requests_for(PATH)):
        if i == 0 and case != "whole":
            total += drop
            continue
        start = request.headers.get("Range", "bytes=0-").removeprefix("bytes=").split("-")[0]
        total += size - (int(start) if case == "resumed" else 0)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100, help="uncompressed size in MB (default 100)")
    parser.add_argument("--files", type=int, default=2000, help="number of files (default 2000)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="qnnctl-resume-"))
    try:
        archive = build_archive(work, args.size, args.files)
        data = archive.read_bytes()
        drop = len(data) // 2
        cases = ["whole", "resumed", "again"]
        walls: dict[str, list[float]] = {c: [] for c in cases}
        sent: dict[str, list[int]] = {c: [] for c in cases}
        with FaultServer() as server:
            server.add(PATH, data)
            for round_ in range(args.rounds + 1):
                order = cases[round_ % 3:] + cases[:round_ % 3]
                for case in order:
                    faults = {"whole": [], "resumed": [Fault.drop_after(drop)],
                              "again": [Fault.drop_after(drop), Fault.ignore_range()]}[case]
                    with server.lock:
                        server.requests.clear()
                        server.faults[PATH].clear()
                    server.fail(PATH, *faults)
                    cache = work / f"cache-{case}-{round_}"
                    env = dict(os.environ, QNNCTL_CACHE_DIR=str(cache), QNNCTL_MIRROR=server.base)
                    env.pop("PYTHONDONTWRITEBYTECODE", None)
                    began = time.monotonic()
                    proc = subprocess.run([*qnnctl(), "-q", "install", VERSION], env=env,
                                          capture_output=True, text=True, check=False)
                    wall = time.monotonic() - began
                    if proc.returncode != 0:
                        raise SystemExit(f"{case}: qnnctl install failed: {proc.stderr}")
                    if round_:
                        walls[case].append(wall)
                        sent[case].append(sent_bytes(server, len(data), drop, case))
                    shutil.rmtree(cache)
        print(f"{len(data) / 1e6:.0f} MB archive ({args.size} MB unpacked), loopback, {os.cpu_count()} cores, "
              f"{args.rounds} rounds; medians")
        for case in cases:
            print(f"  {case:8} {statistics.median(walls[case]):6.2f} s   "
                  f"{statistics.median(sent[case]) / 1e6:6.0f} MB sent")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
