"""Peak memory of `qnnctl inspect` on files of a gigabyte: the whole process tree.

`qnnctl inspect` hands the SDK's libQnnSystem.so a memory map of the file, in a child process,
and walks an ONNX model's protobuf on a map too: nothing is read whole or copied. This measures
the process tree (qnnctl, the reading child, the child that asks the backend library for its API
versions) while it inspects:

- the genuine binary given, as it is (the baseline);
- that binary followed by zeros up to `--size` (a sparse file), which the library refuses;
- an ONNX model of `--size` bytes whose EPContext node embeds that binary after a doc_string of
  zeros (sparse too), which the library reads.

The tree is sampled every `--interval` ms: each process whose parent chain leads to the
`qnnctl` started here, its VmRSS summed; the peak of the sums is reported, with the largest
single process's peak RSS (getrusage, exact) beside it.

    python bench/inspect_memory.py --sdk VERSION|PATH --binary FILE.bin [--size BYTES] [--interval MS]

The binary is one a QNN lowering made (`tests/test_genuine.py` makes them with ONNX Runtime);
the SDK one qnnctl can use (installed, or a path with its host runtime on LD_LIBRARY_PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def padded_binary(binary: Path, dest: Path, size: int) -> Path:
    shutil.copyfile(binary, dest)
    with open(dest, "r+b") as handle:
        handle.truncate(size)
    return dest


# A message as pieces: bytes, or the path of a file whose bytes go there (copied, never held).
Piece = bytes | Path


def _length(pieces: list[Piece]) -> int:
    return sum(p.stat().st_size if isinstance(p, Path) else len(p) for p in pieces)


def _wrap(number: int, pieces: list[Piece]) -> list[Piece]:
    """A length-delimited field holding `pieces`."""
    return [_varint(number << 3 | 2) + _varint(_length(pieces)), *pieces]


def big_epcontext_model(binary: Path, dest: Path, size: int) -> Path:
    """ModelProto: ir_version, a doc_string of zeros (not written: a hole), then the graph whose
    EPContext node embeds the binary, copied in by parts: this process never holds it."""
    attributes = (_wrap(5, [_field(1, b"embed_mode") + _field(3, 1) + _field(20, 2)])
                  + _wrap(5, [_field(1, b"ep_cache_context"), *_wrap(4, [binary]), _field(20, 3)]))
    node = _wrap(1, [_field(3, b"QNNExecutionProvider_QNN_0") + _field(4, b"EPContext") + _field(7, b"com.microsoft"),
                     *attributes])
    graph = _wrap(7, [*node, _field(2, b"main_graph")])
    head = _field(1, 10)
    filler = size - len(head) - _length(graph) - 16
    with open(dest, "wb") as out:
        out.write(head + _varint(6 << 3 | 2) + _varint(filler))
        out.seek(filler, os.SEEK_CUR)
        for piece in graph:
            if isinstance(piece, Path):
                with open(piece, "rb") as source:
                    shutil.copyfileobj(source, out, 1 << 20)
            else:
                out.write(piece)
    return dest


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(root: int) -> tuple[int, int]:
    """The summed RSS of `root` and its descendants, and how many processes that is."""
    tree = _children()
    todo, seen = [root], 0
    total = 0
    while todo:
        pid = todo.pop()
        seen += 1
        total += _rss(pid)
        todo.extend(tree.get(pid, ()))
    return total, seen


@dataclass
class Measured:
    file: str
    size: int
    exit: int
    read: list[bool]  # per binary: whether the library read it
    tree_peak: int
    processes: int
    largest_single: int
    seconds: float


def measure(path: Path, sdk: str, interval: float) -> Measured:
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", "inspect", "--json", str(path), "--sdk", sdk],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak, most = 0, 0
    while proc.poll() is None:
        total, count = tree_rss(proc.pid)
        peak, most = max(peak, total), max(most, count)
        time.sleep(interval)
    out, _ = proc.communicate()
    elapsed = time.monotonic() - start
    # The largest peak of any one process waited for so far in this run (each case's includes
    # the cases before it: the cases run smallest first).
    single = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    report = json.loads(out) if out else {}
    return Measured(path.name, path.stat().st_size, proc.returncode,
                    [b.get("error") is None for b in report.get("binaries", [])], peak, most, single, elapsed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdk", required=True)
    parser.add_argument("--binary", required=True, type=Path)
    parser.add_argument("--size", type=int, default=1 << 30)
    parser.add_argument("--interval", type=float, default=2.0, help="sampling interval, ms")
    args = parser.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"sampling every {args.interval} ms", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="qnnctl-bench-") as folder:
        files = [args.binary,
                 padded_binary(args.binary, Path(folder) / "padded.bin", args.size),
                 big_epcontext_model(args.binary, Path(folder) / "big_ctx.onnx", args.size)]
        for path in files:
            m = measure(path, args.sdk, args.interval / 1000)
            print(f"{m.file:>14} {m.size / MIB:7.1f} MiB  exit {m.exit}  read by the library {m.read}  "
                  f"tree peak {m.tree_peak / MIB:5.1f} MiB ({m.processes} processes at most)  largest single "
                  f"process so far {m.largest_single / MIB:5.1f} MiB  {m.seconds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
