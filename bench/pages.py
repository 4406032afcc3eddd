"""What writing new files costs this machine right now: the yardstick under the install's.

    python bench/pages.py                 # 400 MB in 20 files, 5 rounds, kept until the end
    python bench/pages.py --size 130      # the size of the 400 MB benchmark's archive

An install writes its archive and then its tree: on a virtual machine whose host backs the
guest's memory lazily, the kernel's copy into page-cache pages it has not used lately costs a
fault in the host for each, and that cost, not qnnctl's code, moves `bench/install.py`'s
ratios from one session to the next. Each round writes `--size` MB of random bytes into new
files with plain `write()` calls (1 MiB each), as every contender there does, after an
`os.sync()`, and reports the system time it took: the same bytes, the same calls, only the
state of the machine's memory differs. What a round writes is kept until the end, as the
install benchmark keeps what each run extracts.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

BLOCK = 1 << 20


def write_round(folder: Path, size_mb: int, files: int, block: bytes) -> tuple[float, float]:
    """(wall, system) seconds to write `size_mb` MB into `files` new files under `folder`."""
    folder.mkdir()
    per_file = (size_mb << 20) // files
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for n in range(files):
        fd = os.open(folder / f"f{n:03d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            written = 0
            while written < per_file:
                written += os.write(fd, block[:per_file - written])
        finally:
            os.close(fd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    return wall, after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=400, help="MB written in each round")
    parser.add_argument("--files", type=int, default=20, help="files each round writes")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    block = os.urandom(BLOCK)
    work = Path(tempfile.mkdtemp(prefix="qnnctl-bench-pages-"))
    try:
        system = []
        for n in range(args.rounds):
            os.sync()
            wall, sys_time = write_round(work / f"round{n}", args.size, args.files, block)
            system.append(sys_time)
            print(f"round {n + 1}: {args.size} MB in {wall:.3f} s, system time {sys_time:.3f} s "
                  f"({sys_time * 1000 / args.size:.2f} ms per MB)", flush=True)
        print(f"system time per round: median {statistics.median(system):.3f} s, "
              f"least {min(system):.3f} s, most {max(system):.3f} s; load average {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
