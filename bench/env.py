"""How long `qnnctl env --shell json` takes next to `python -c pass` and `python -c "import click"`.

`eval "$(qnnctl env)"` runs in shell start-up files, so its cost is paid by every new shell.
The floor is starting Python at all; the target is a median at most 1.5 times that floor
(qnnctl.launch answers `env` from qnnctl.commands.leanenv without click, qnnctl.net or the
command table). `import click` is shown beside it: what any click program pays before it does
anything, and `import re, sys`, what the script pip writes for an entry point does before it
calls qnnctl: the floor of any console script. `--imports` adds what each module on the path
costs (`python -X importtime`, medians); `--against COMMIT` runs that commit's build
interleaved with this one (bench/startup.py).

Each command runs against a throw-away default cache (XDG_CACHE_HOME) holding the SDK that
qnnctl would select, with bytecode caching on as after a normal install; warm-up runs are not
counted.

    python bench/env.py [--runs N] [--staged] [--imports] [--against COMMIT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version as dist_version
from pathlib import Path

from startup import builds, compiled, import_costs, interleaved, machine, summarize

TARGET = 1.5
PASS = "python -c pass"
# What would make a run depend on the caller's shell rather than on qnnctl.
SCRUB = ("QNN_SDK_ROOT", "QNNCTL_SDK", "QNNCTL_CACHE_DIR", "QNN_STAGING_DIR", "PYTHONDONTWRITEBYTECODE",
         "QNNCTL_DEBUG", "PYTHONPATH")


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each command (at least 20)")
    parser.add_argument("--staged", action="store_true",
                        help="with a libc++ trio staged, as on hosts that lack one (Debian 12, say)")
    parser.add_argument("--imports", action="store_true", help="also what each import on the path costs")
    parser.add_argument("--against", metavar="COMMIT", help="run this commit's build interleaved with this one")
    args = parser.parse_args()
    if args.runs < 20:
        parser.error("--runs must be at least 20")

    load = os.getloadavg()[0]
    base = Path(tempfile.mkdtemp(prefix="qnnctl-bench-"))
    try:
        env, work = prepare(base, args.staged)
        with builds(args.against) as compared:
            commands: dict[str, tuple[list[str], dict[str, str]]] = {}
            for build in compared:
                compiled(build)
                command = [*build.argv, "env", "--shell", "json"]
                check = subprocess.run(command, env={**env, **build.env}, cwd=work, capture_output=True, text=True)
                if check.returncode != 0 or "QNN_SDK_ROOT" not in json.loads(check.stdout or "{}"):
                    raise SystemExit(f"{build.label} env failed: {check.stderr.strip()}")
                commands[f"{build.label} env"] = (command, {**env, **build.env})
            commands[PASS] = ([sys.executable, "-c", "pass"], env)
            commands['python -c "import click"'] = ([sys.executable, "-c", "import click"], env)
            # What pip's `qnnctl` script does before it calls qnnctl: the floor of any console script.
            commands['python -c "import re, sys"'] = ([sys.executable, "-c", "import re, sys"], env)
            wall, cpu = interleaved(commands, work, args.runs)
            first = next(iter(commands))
            costs = import_costs(*commands[first], work) if args.imports else []
            floor = import_costs(*commands[PASS], work) if args.imports else []
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(machine(args.runs, load) + f", click {dist_version('click')}"
          + (", a libc++ trio staged" if args.staged else ""))
    names = list(commands)
    summarize(wall, cpu, names, PASS, TARGET, args.against is not None, costs, floor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
