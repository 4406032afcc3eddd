"""What bench/env.py and bench/lower.py share: the builds compared, interleaved runs, medians, ratios.

A build is qnnctl as some commit has it. The current one runs as people run it: the installed
`qnnctl` script next to this interpreter (else `python -m qnnctl`). An earlier one (`--against
COMMIT`) is checked out with `git worktree add` into a temporary folder, and then both builds run
as `python -m qnnctl` with their own folder first on PYTHONPATH, so that the ratio between them
is the code's alone, whatever the machine's load. The folder is removed afterwards.

Runs are interleaved: each round runs every command once, the order rotated every round, so a
machine that slows down part-way slows all of them. Wall time is measured, and the CPU time
(user + system, from wait4) of each child, which varies less on a busy machine.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent


class Build(NamedTuple):
    """How to start one build's `qnnctl`: the words before its arguments, and what its environment adds."""

    label: str
    argv: list[str]
    env: dict[str, str]


def installed_build() -> Build:
    """The installed `qnnctl` script next to this interpreter, else `python -m qnnctl`."""
    script = Path(sys.executable).with_name("qnnctl")
    if script.is_file() and os.access(script, os.X_OK):
        return Build("qnnctl", [str(script)], {})
    return Build("qnnctl", [sys.executable, "-m", "qnnctl"], {})


def source_build(label: str, folder: Path) -> Build:
    """The qnnctl in `folder` (a checkout), ahead of any installed one."""
    return Build(label, [sys.executable, "-m", "qnnctl"], {"PYTHONPATH": str(folder)})


def short_commit(commit: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", commit], capture_output=True,
                          text=True, check=True).stdout.strip()


@contextmanager
def earlier_build(commit: str) -> Iterator[Build]:
    """`commit` checked out in a temporary worktree, for as long as the block runs."""
    folder = Path(tempfile.mkdtemp(prefix="qnnctl-build-")) / "src"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(folder), commit],
                   check=True)
    try:
        yield source_build(short_commit(commit), folder)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)], check=False)
        shutil.rmtree(folder.parent, ignore_errors=True)


@contextmanager
def builds(against: str | None) -> Iterator[list[Build]]:
    """The current build alone; with `against`, it and that commit's, both run from source."""
    if against is None:
        yield [installed_build()]
        return
    with earlier_build(against) as earlier:
        yield [source_build("this build", REPO), earlier]


def compiled(build: Build) -> None:
    """Write the build's bytecode first, as an install does, so that no run pays for compiling."""
    folder = build.env.get("PYTHONPATH")
    if folder:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(folder) / "qnnctl")],
                       check=True, stdout=subprocess.DEVNULL)


def time_once(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall time, and the CPU time (user + system) the child itself used."""
    start = time.perf_counter()
    child = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{command} exited with {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


Samples = dict[str, list[float]]


def interleaved(commands: dict[str, tuple[list[str], dict[str, str]]], cwd: Path, runs: int,
                warmup: int = 3) -> tuple[Samples, Samples]:
    """Wall and CPU times of each command, `runs` rounds, the order rotated every round."""
    for _ in range(warmup):
        for argv, env in commands.values():
            time_once(argv, env, cwd)
    wall: Samples = {name: [] for name in commands}
    cpu: Samples = {name: [] for name in commands}
    names = list(commands)
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            elapsed, used = time_once(*commands[name], cwd)
            wall[name].append(elapsed)
            cpu[name].append(used)
    return wall, cpu


def report(label: str, samples: Samples, names: list[str], base: str) -> dict[str, float]:
    """Print the medians, and each command's ratio to `base`'s; return the ratios."""
    medians = {name: statistics.median(samples[name]) for name in names}
    ratios = {name: medians[name] / medians[base] for name in names if name != base}
    print(f"{label} medians (ms): " + "   ".join(f"{name} {medians[name] * 1000:.1f}" for name in names))
    print(f"{label} ratios to {base}: " + "   ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items()))
    return ratios


def machine(runs: int, load_before: float) -> str:
    """One line: when, where, and how busy the machine was."""
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, python {platform.python_version()}, "
            f"{os.cpu_count()} cores, load average {load_before:.2f} before and {os.getloadavg()[0]:.2f} after, "
            f"{runs} runs of each command, interleaved")


def import_costs(command: list[str], env: dict[str, str], cwd: Path, runs: int = 7) -> list[tuple[str, float, float]]:
    """(module, self ms, cumulative ms) of what `command` (a Python command line) imports, from
    `python -X importtime`, medians of `runs` runs; the costliest first."""
    if command[0] != sys.executable:  # a script: its interpreter reads the option
        command = [sys.executable, *command]
    own: dict[str, list[float]] = {}
    total: dict[str, list[float]] = {}
    for _ in range(runs):
        proc = subprocess.run([command[0], "-X", "importtime", *command[1:]], env=env, cwd=cwd,
                              capture_output=True, text=True, check=False)
        for line in proc.stderr.splitlines():
            if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
                continue
            _, self_us, cumulative_us, name = (part.strip() for part in line.replace(":", "|", 1).split("|"))
            own.setdefault(name, []).append(int(self_us) / 1000)
            total.setdefault(name, []).append(int(cumulative_us) / 1000)
    rows = [(name, statistics.median(own[name]), statistics.median(total[name])) for name in own]
    return sorted(rows, key=lambda row: row[1], reverse=True)


def print_import_costs(rows: list[tuple[str, float, float]], floor: list[tuple[str, float, float]],
                       top: int = 25) -> None:
    """What a command imports (`rows`), beside what `python -c pass` imports (`floor`)."""
    qnnctl = [row for row in rows if row[0].split(".")[0] == "qnnctl"]
    beyond = [row for row in rows if row[0] not in {name for name, _, _ in floor}]
    print(f"imports: {len(rows)} modules, {sum(row[1] for row in rows):.1f} ms in all; python -c pass's own "
          f"{len(floor)}: {sum(row[1] for row in floor):.1f} ms; beyond those {len(beyond)}: "
          f"{sum(row[1] for row in beyond):.1f} ms, of which qnnctl's {len(qnnctl)}: "
          f"{sum(row[1] for row in qnnctl):.1f} ms")
    print("the costliest, self / cumulative ms:")
    for name, own, cumulative in rows[:top]:
        print(f"  {name:44} {own:6.2f} {cumulative:7.2f}")


def summarize(wall: Samples, cpu: Samples, names: list[str], base: str, target: float, against: bool,
              costs: list[tuple[str, float, float]], floor: list[tuple[str, float, float]]) -> None:
    """The ratios to `base`, to the earlier build when one ran beside, the verdict against the
    target, and what each import costs."""
    ratios = report("wall", wall, names, base)
    report("cpu ", cpu, names, base)
    if against:
        report("wall", wall, names[:2], names[1])
        report("cpu ", cpu, names[:2], names[1])
    ratio = ratios[names[0]]
    print(f"{names[0]}: wall-time ratio to {base} {ratio:.2f} "
          f"({'within' if ratio <= target else 'above'} the target of {target:g})")
    if costs:
        print_import_costs(costs, floor)
