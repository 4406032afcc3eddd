"""How long `qnnctl env --shell json` takes next to `python -c pass` and `python -c "import click"`.

`eval "$(qnnctl env)"` runs in shell start-up files, so its cost is paid by every new shell.
The floor is starting Python at all; the target is a median at most 1.5 times that floor
(qnnctl.launch answers `env` without importing click or the commands). `import click` is
shown beside it: what any click program pays before it does anything.

The three commands run in the same session, interleaved (the order rotates each round), so
a machine that slows down part-way slows both. Each runs against a throw-away default cache
(XDG_CACHE_HOME) holding the SDK that qnnctl would select, with bytecode caching on as after
a normal install; warm-up runs are not counted.

    python bench/env.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version as dist_version
from pathlib import Path

TARGET = 1.5
WARMUP = 3
# What would make a run depend on the caller's shell rather than on qnnctl.
SCRUB = ("QNN_SDK_ROOT", "QNNCTL_SDK", "QNNCTL_CACHE_DIR", "QNN_STAGING_DIR", "PYTHONDONTWRITEBYTECODE",
         "QNNCTL_DEBUG")


def qnnctl_command() -> list[str]:
    """The installed `qnnctl` script next to this interpreter, else `python -m qnnctl`."""
    script = Path(sys.executable).with_name("qnnctl")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "qnnctl"]


def fake_sdk(root: Path, version: str) -> None:
    """An SDK folder that passes qnnctl's checks (env never loads the libraries)."""
    lib = root / "lib" / "x86_64-linux-clang"
    lib.mkdir(parents=True)
    (root / "bin" / "x86_64-linux-clang").mkdir(parents=True)
    for name in ("libQnnHtp.so", "libQnnSystem.so"):
        (lib / name).write_bytes(b"\x7fELF")
    (root / "sdk.yaml").write_text(f"version: {version}\n")
    (root / ".qnnctl.json").write_text(json.dumps({"schema": 1, "version": version, "files": {}}))


def prepare(base: Path, staged: bool = False) -> tuple[dict[str, str], Path]:
    """The environment and working folder for the runs, with the selected SDK installed (and,
    with `staged`, a libc++ trio staged for it, as on a host that lacks one)."""
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import select_sdk

    # platformdirs reads os.environ itself, so this process gets the same setting.
    os.environ["XDG_CACHE_HOME"] = str(base / "xdg-cache")
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    work = base / "work"
    work.mkdir()
    selection = select_sdk(None, env, work)
    if selection.version is None:
        raise SystemExit(f"qnnctl would not use a cached SDK here ({selection.detail})")
    sdk_dir = Cache.from_env(env).sdk_dir(selection.version)
    if base not in sdk_dir.parents:
        raise SystemExit(f"the cache {sdk_dir} is outside the benchmark's folder; not touching it")
    fake_sdk(sdk_dir, selection.version)
    if staged:
        trio = Cache.from_env(env).runtime / "libcxx-14.0.6"
        (trio / "lib").mkdir(parents=True)
        (trio / ".qnnctl.json").write_text(json.dumps({"kind": "libcxx", "staged_ns": 1}))
    return env, work


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each command (at least 20)")
    parser.add_argument("--staged", action="store_true",
                        help="with a libc++ trio staged, as on hosts that lack one (Debian 12, say)")
    args = parser.parse_args()
    if args.runs < 20:
        parser.error("--runs must be at least 20")

    commands = {
        "qnnctl env --shell json": [*qnnctl_command(), "env", "--shell", "json"],
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import click"': [sys.executable, "-c", "import click"],
    }
    base = Path(tempfile.mkdtemp(prefix="qnnctl-bench-"))
    try:
        env, work = prepare(base, args.staged)
        check = subprocess.run(commands["qnnctl env --shell json"], env=env, cwd=work,
                               capture_output=True, text=True)
        if check.returncode != 0 or "QNN_SDK_ROOT" not in json.loads(check.stdout or "{}"):
            raise SystemExit(f"qnnctl env failed: {check.stderr.strip()}")
        for _ in range(WARMUP):
            for command in commands.values():
                time_once(command, env, work)
        wall: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        names = list(commands)
        for i in range(args.runs):
            for name in names[i % len(names):] + names[:i % len(names)]:
                elapsed, used = time_once(commands[name], env, work)
                wall[name].append(elapsed)
                cpu[name].append(used)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"python {platform.python_version()}, click {dist_version('click')}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, {args.runs} runs each, interleaved"
          f"{', a libc++ trio staged' if args.staged else ''}")
    ratio = report("wall", wall, names)[0]
    # CPU time is what the command costs; on a busy machine it varies less than wall time.
    report("cpu ", cpu, names)
    verdict = "within" if ratio <= TARGET else "above"
    print(f"wall-time ratio to python -c pass {ratio:.2f} ({verdict} the target of {TARGET})")
    return 0


def report(label: str, samples: dict[str, list[float]], names: list[str]) -> list[float]:
    """Print the medians, and the first command's ratio to each other one's; return the ratios."""
    medians = [statistics.median(samples[name]) for name in names]
    cells = "   ".join(f"{name} {m * 1000:6.1f} ms" for name, m in zip(names, medians, strict=True))
    ratios = [medians[0] / m for m in medians[1:]]
    print(f"{label} medians: {cells}   ratios {' / '.join(f'{r:.2f}' for r in ratios)}")
    return ratios


if __name__ == "__main__":
    sys.exit(main())
