"""How long reading an SDK's build id takes: qnnctl.sdk.identity.build_id on real libraries.

    python bench/identity.py [LIBRARY...]     # default: the genuine QAIRT libraries of the tests

By default it reads the host libraries of the SDK archives tests/genuine.py builds (run
`python -m tests.genuine fetch` first). Each library is read `--runs` times after one warm-up
read (the first read of a file also pays for the page cache); the median is printed, with the
whole-file scan it replaces for comparison.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qnnctl.sdk.identity import build_id


def genuine_libraries(folder: Path) -> list[Path]:
    from tests import genuine

    found = []
    for wheel in genuine.WHEELS:
        archive = genuine.CACHE / "built" / f"v{wheel.qairt}-r{genuine.LAYOUT_REVISION}.zip"
        if not archive.is_file():
            continue
        with zipfile.ZipFile(archive) as zf:
            for name in ("libQnnHtp.so", "libQnnSystem.so"):
                member = f"qairt/{wheel.qairt}/lib/x86_64-linux-clang/{name}"
                target = folder / wheel.qairt / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(member))
                found.append(target)
    return found


def median_ms(read: object, path: Path, runs: int) -> float:
    assert callable(read)
    read(path)  # warm-up: the page cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        read(path)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def whole_file(path: Path) -> str | None:
    found = re.search(rb"v(\d+\.\d+\.\d+\.\d{12})", path.read_bytes())
    return found.group(1).decode() if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        libraries = args.libraries or genuine_libraries(Path(scratch))
        if not libraries:
            print("no libraries: give some, or run `python -m tests.genuine fetch`", file=sys.stderr)
            return 2
        print(f"{'library':<40} {'MB':>6} {'build id':<22} {'build_id ms':>11} {'whole file ms':>13}")
        for path in libraries:
            size = path.stat().st_size / 1e6
            ours = median_ms(build_id, path, args.runs)
            naive = median_ms(whole_file, path, max(3, args.runs // 10))
            label = f"{path.parent.name}/{path.name}"
            print(f"{label:<40} {size:6.1f} {build_id(path) or '-':<22} {ours:11.2f} {naive:13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
