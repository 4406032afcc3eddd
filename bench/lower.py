"""What `qnnctl lower` adds to a pipeline: `qnnctl lower -- python -c pass` against `python -c pass`.

`lower` re-executes the pipeline with the SDK in place, so its own cost is paid by every run:
a user lowering in a loop, a CI step that runs twenty small pipelines. What it should cost is a
Python start-up (qnnctl's) and the exec; the target is a median at most 6 times `python -c pass`.
Both run interleaved (bench/startup.py), against a throw-away cache holding the SDK, with the
CPU vendor read as `lower` reads it (unless --amd names AMD's, to measure the guard's
sitecustomize in the pipeline's process too).

The SDK is, with --genuine, the tests' archive of QAIRT 2.51 built from the onnxruntime-qnn wheel
(genuine host libraries, whose ELF files `lower` reads: `python -m tests.genuine fetch` first), or
the file given with --archive, installed with `qnnctl install --file`; else a stand-in folder
with no real libraries (bench/env.py's), which leaves the ELF reading out.

    python bench/lower.py [--runs N] [--genuine | --archive ZIP] [--amd] [--imports] [--against COMMIT]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from env import fake_sdk
from startup import REPO, builds, compiled, import_costs, interleaved, machine, summarize

TARGET = 6.0
PASS = "python -c pass"
SCRUB = ("QNN_SDK_ROOT", "QNNCTL_SDK", "QNNCTL_CACHE_DIR", "QNN_STAGING_DIR", "PYTHONDONTWRITEBYTECODE",
         "QNNCTL_DEBUG", "PYTHONPATH", "LD_LIBRARY_PATH", "QNNCTL_FORCE_CPU_VENDOR", "QNNCTL_DISABLE_MKLDNN",
         "QNNCTL_STAGED_LOADER", "VIRTUAL_ENV")
STAND_IN = "2.37.0.250724"


def genuine_archive() -> Path:
    sys.path.insert(0, str(REPO))
    from tests.genuine import QAIRT_2_51, cached_archive

    return cached_archive(QAIRT_2_51)


def prepare(base: Path, archive: Path | None) -> tuple[dict[str, str], Path, str]:
    """The environment, working folder and SDK version for the runs, the SDK installed in a cache of its own."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env["QNNCTL_CACHE_DIR"] = str(base / "cache")
    work = base / "work"
    work.mkdir()
    if archive is None:
        fake_sdk(base / "cache" / "sdks" / STAND_IN, STAND_IN)
        return env, work, STAND_IN
    installed = subprocess.run([sys.executable, "-m", "qnnctl", "install", "--file", str(archive)], env=env,
                               cwd=work, capture_output=True, text=True)
    if installed.returncode != 0:
        raise SystemExit(f"qnnctl install --file {archive} failed: {installed.stderr.strip()}")
    return env, work, Path(installed.stdout.strip()).name


def lower_command(argv: list[str], version: str) -> list[str]:
    return [*argv, "lower", "--sdk", version, "--", sys.executable, "-c", "pass"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each command (at least 20)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--genuine", action="store_true", help="the tests' genuine QAIRT 2.51 archive")
    source.add_argument("--archive", type=Path, help="an SDK archive to install and lower with")
    parser.add_argument("--amd", action="store_true", help="name the CPU AMD's: the guard is armed in the pipeline")
    parser.add_argument("--imports", action="store_true", help="also what each import of `lower` costs")
    parser.add_argument("--against", metavar="COMMIT", help="run this commit's build interleaved with this one")
    args = parser.parse_args()
    if args.runs < 20:
        parser.error("--runs must be at least 20")

    archive = genuine_archive() if args.genuine else args.archive
    load = os.getloadavg()[0]
    base = Path(tempfile.mkdtemp(prefix="qnnctl-bench-"))
    try:
        env, work, version = prepare(base, archive)
        if args.amd:
            env["QNNCTL_FORCE_CPU_VENDOR"] = "AuthenticAMD"
        with builds(args.against) as compared:
            commands: dict[str, tuple[list[str], dict[str, str]]] = {}
            for build in compared:
                compiled(build)
                command = lower_command(build.argv, version)
                check = subprocess.run(command, env={**env, **build.env}, cwd=work, capture_output=True, text=True)
                if check.returncode != 0:
                    raise SystemExit(f"{build.label} lower failed: {check.stderr.strip()}")
                commands[f"{build.label} lower"] = (command, {**env, **build.env})
            commands[PASS] = ([sys.executable, "-c", "pass"], env)
            wall, cpu = interleaved(commands, work, args.runs)
            # What `lower` itself imports: the same command (`-X importtime` is not passed on to
            # the pipeline it becomes, so only qnnctl's imports are reported).
            first = compared[0]
            costs = (import_costs(lower_command(first.argv, version), {**env, **first.env}, work)
                     if args.imports else [])
            floor = import_costs(*commands[PASS], work) if args.imports else []
    finally:
        shutil.rmtree(base, ignore_errors=True)

    what = f"SDK {version} " + (f"from {archive.name}" if archive is not None else "(a stand-in, no real libraries)")
    print(machine(args.runs, load) + f", {what}" + (", the CPU named AMD's" if args.amd else ""))
    names = list(commands)
    summarize(wall, cpu, names, PASS, TARGET, args.against is not None, costs, floor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
