"""What holding the SDK costs `qnnctl lower` before the pipeline starts.

`qnnctl lower` holds the SDK of qnnctl's cache it runs the pipeline with (a shared flock on
`holds/<version>.hold`, qnnctl/sdk/holds.py), so that no uninstall or reinstall removes it under
the pipeline. This measures, in one process and side by side:

- `plan_lower` (everything `lower` does before its exec: choosing the SDK, its environment,
  the command) as it is, which takes the hold, and the same with the hold taken out;
- the hold alone (open, flock, close);
- `qnnctl lower --sdk VERSION -- true` end to end, for the scale of a whole start-up.

The two variants of `plan_lower` alternate each round (the order swapped every round), so a
machine that slows down part-way slows both; warm-up rounds are not counted. Medians.

    python bench/hold.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

WARMUP = 20


def fake_sdk(root: Path, version: str) -> None:
    """An SDK folder that passes qnnctl's checks (lower loads no library before its exec)."""
    lib = root / "lib" / "x86_64-linux-clang"
    lib.mkdir(parents=True)
    (root / "bin" / "x86_64-linux-clang").mkdir(parents=True)
    for name in ("libQnnHtp.so", "libQnnSystem.so"):
        (lib / name).write_bytes(b"\x7fELF")
    (root / "sdk.yaml").write_text(f"version: {version}\n")
    (root / ".qnnctl.json").write_text(json.dumps({"schema": 1, "version": version, "files": {}}))


def median_us(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e6:9.1f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="rounds of the in-process measurements")
    parser.add_argument("--processes", type=int, default=20, help="runs of the whole command")
    args = parser.parse_args()

    from qnnctl.run import lower
    from qnnctl.run.lower import COMMAND, LowerOptions, Target, plan_lower
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.holds import hold_sdk

    version = "2.37.0.250724"
    with tempfile.TemporaryDirectory(prefix="qnnctl-bench-hold-") as tmp:
        base = Path(tmp)
        cache = Cache(base / "cache")
        fake_sdk(cache.sdk_dir(version), version)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QNN", "QNNCTL"))}
        env.update(QNNCTL_CACHE_DIR=str(cache.root), QNNCTL_FORCE_CPU_VENDOR="GenuineIntel")
        target = Target(COMMAND, "true")
        options = LowerOptions(spec=version)

        def plan_held() -> None:
            plan = plan_lower(target, options, env, base, cache)
            if plan.hold is None:
                raise SystemExit("the plan took no hold: nothing to measure")
            os.close(plan.hold)  # as the pipeline's end would

        def plan_unheld() -> None:
            # lower's own name for it, swapped for one that holds nothing, for this call only.
            saved = getattr(lower, "hold_sdk")  # noqa: B009 - not exported: mypy would refuse the attribute
            setattr(lower, "hold_sdk", lambda root, cache: None)  # noqa: B010
            try:
                plan_lower(target, options, env, base, cache)
            finally:
                setattr(lower, "hold_sdk", saved)  # noqa: B010

        def hold_alone() -> None:
            fd = hold_sdk(cache.sdk_dir(version), cache)
            if fd is not None:
                os.close(fd)

        variants: dict[str, Callable[[], None]] = {"plan, held": plan_held, "plan, no hold": plan_unheld,
                                                    "hold alone": hold_alone}
        samples: dict[str, list[float]] = {name: [] for name in variants}
        order = list(variants)
        for round_ in range(WARMUP + args.runs):
            for name in order:
                start = time.perf_counter()
                variants[name]()
                if round_ >= WARMUP:
                    samples[name].append(time.perf_counter() - start)
            order.reverse()

        whole: list[float] = []
        command = [sys.executable, "-m", "qnnctl", "lower", "--sdk", version, "--", "true"]
        for run in range(3 + args.processes):
            start = time.perf_counter()
            subprocess.run(command, env=env, cwd=base, check=True)
            if run >= 3:
                whole.append(time.perf_counter() - start)

    print(f"machine: {os.cpu_count()} cores, {platform.system()} {platform.machine()}, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"{args.runs} rounds in one process, medians:")
    for name, values in samples.items():
        print(f"  {name:<14} {median_us(values)}")
    held, unheld = statistics.median(samples["plan, held"]), statistics.median(samples["plan, no hold"])
    print(f"  held / no hold: {held / unheld:.3f}")
    print(f"qnnctl lower --sdk {version} -- true, {args.processes} runs: median "
          f"{statistics.median(whole) * 1e3:.1f} ms; the hold alone is "
          f"{statistics.median(samples['hold alone']) / statistics.median(whole) * 100:.3f}% of it")


if __name__ == "__main__":
    main()
