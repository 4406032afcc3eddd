"""Helpers for the lower, guard and API tests: pipelines on disk, torch, a foreign interpreter."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, run_qnnctl

# What a pipeline sees of itself, printed as one JSON line.
PROBE = """\
import json, os, sys
annotated: int = 0
print(json.dumps({
    "name": __name__,
    "argv": sys.argv,
    "path": sys.path,
    "annotation": repr(__annotations__["annotated"]),  # no __future__ import leaks in
    "file": globals().get("__file__"),
    "main_is_this": sys.modules["__main__"].__dict__ is globals(),
    "spec": getattr(globals().get("__spec__"), "name", None),
    "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
    "pythonpath": os.environ.get("PYTHONPATH"),
    "qnnctl_finders": [k for k in sys.path_importer_cache if os.path.basename(k) == "_site"],
    "env": {k: os.environ.get(k) for k in ("QNN_SDK_ROOT", "LD_LIBRARY_PATH", "QNNCTL_DISABLE_MKLDNN")},
    "builtins": type(__builtins__).__name__,
    "loader": [type(globals().get("__loader__")).__name__, getattr(globals().get("__loader__"), "name", None),
               getattr(globals().get("__loader__"), "path", None)],
    "cached": globals().get("__cached__", "absent"),
    "code_file": sys._getframe().f_code.co_filename,
}))
"""

# Prints torch's MKLDNN setting as the pipeline finds it right after its own `import torch`.
TORCH_PROBE = """\
import torch
print("mkldnn", torch.backends.mkldnn.enabled)
"""

# Anything of these in a site-packages folder is kept out of the foreign interpreter.
_NOT_FOR_FOREIGN = ("qnnctl", "__editable__", "cpuinfo", "py_cpuinfo")


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def lower(*args: str, env: dict[str, str] | None = None, input: str | None = None,
          cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_qnnctl("lower", *args, env=env, input=input, cwd=cwd)


def direct(*argv: str, env: dict[str, str] | None = None, input: str | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The same pipeline run directly, without qnnctl, for comparison."""
    return subprocess.run(list(argv), env=os.environ.copy() if env is None else env, input=input,
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def last_json(stdout: str) -> Any:
    return json.loads(stdout.strip().splitlines()[-1])


def torch_site_packages() -> Path:
    """The site-packages folder that holds torch; in CI a missing torch fails instead of skipping."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        if IN_CI:
            pytest.fail("torch is not installed; .ci/run must install torch==2.13.0")
        pytest.skip("torch is not installed")
    return Path(spec.origin).parent.parent


def make_foreign_venv(dest: Path, torch_from: Path | None) -> Path:
    """A virtualenv without qnnctl and without py-cpuinfo; its interpreter's path.

    `python -m venv` without system site-packages sees neither. With `torch_from`, a .pth file
    adds a folder of links to everything in that site-packages except qnnctl and py-cpuinfo,
    so that torch (and what it imports) is there and the two are not.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    python = dest / "bin" / "python"
    if torch_from is not None:
        shelf = dest / "torch-only"
        shelf.mkdir()
        for entry in torch_from.iterdir():
            if entry.name.startswith(_NOT_FOR_FOREIGN) or entry.suffix == ".pth":
                continue
            (shelf / entry.name).symlink_to(entry)
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()
        Path(purelib, "torch-only.pth").write_text(f"{shelf}\n")
    return python


def host_vendor() -> str | None:
    """This host's CPU vendor, read from the kernel rather than through qnnctl.host.machine (the
    code under test): the first `vendor_id` line of /proc/cpuinfo; None without one (not x86)."""
    for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return value.strip()
    return None


def host_is_amd() -> bool:
    """Whether this host's CPU is AMD's (host_vendor)."""
    return host_vendor() == "AuthenticAMD"


# /proc/cpuinfo as Linux writes it (arch/x86/kernel/cpu/proc.c) on an AMD EPYC host, abridged to
# its first processor's block.
AMD_CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7763 64-Core Processor
stepping\t: 1
microcode\t: 0xa0011d1
cpu MHz\t\t: 2445.406
cache size\t: 512 KB
physical id\t: 0
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov sse sse2 avx2

"""

# And on an aarch64 host (arch/arm64/kernel/cpuinfo.c): no vendor_id, the implementer's code.
ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

"""


def write_cpuinfo(folder: Path, text: str) -> Path:
    """A stand-in for /proc/cpuinfo holding `text`, in `folder`; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cpuinfo"
    path.write_text(text)
    return path


# Read before any test points HOME elsewhere: pyenv keeps interpreters of many versions there.
_PYENV_ROOT = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")


def other_python(name: str) -> str:
    """An interpreter called `name` that runs: on PATH, else one of pyenv's; skips without one."""
    import glob
    import shutil

    found = shutil.which(name)
    for candidate in [*([found] if found else []), *sorted(glob.glob(f"{_PYENV_ROOT}/versions/*/bin/{name}"))]:
        if subprocess.run([candidate, "-c", "pass"], capture_output=True, timeout=60).returncode == 0:
            return candidate
    pytest.skip(f"no {name} here")
