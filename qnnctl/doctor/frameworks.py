"""The lowering frameworks a Python has (ExecuTorch, onnxruntime, onnxruntime-qnn), read from
their files without importing them: in qnnctl's own Python, or in another one (`doctor --python
PY`, the Python `lower --python` runs), asked in a fresh process of that Python."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from qnnctl.errors import QnnctlError
from qnnctl.records import Record
from qnnctl.sdk.select import executorch_package_dir

QUERY_TIMEOUT = 60.0

# Runs as `PY -c _QUERY`, in that Python's own environment: the standard library only, and no
# framework imported (find_spec of a top-level package does not run it).
_QUERY = r"""
import importlib.metadata as metadata, importlib.util as util, json, os, sys

def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

where = None
try:
    spec = util.find_spec("executorch")
except (ImportError, ValueError):
    spec = None
if spec is not None:
    locations = list(spec.submodule_search_locations or [])
    where = locations[0] if locations else (os.path.dirname(spec.origin) if spec.origin else None)
print("@@" + json.dumps({"executable": sys.executable, "executorch_dir": where,
                         "onnxruntime": version("onnxruntime"), "onnxruntime_qnn": version("onnxruntime-qnn")}))
"""


class Frameworks(Record):
    """What one Python has: its interpreter, ExecuTorch's package folder, onnxruntime's and
    onnxruntime-qnn's versions (None for what it lacks)."""

    python: str
    executorch_dir: Path | None
    onnxruntime: str | None
    onnxruntime_qnn: str | None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def own_frameworks() -> Frameworks:
    """The frameworks of the Python that runs qnnctl."""
    return Frameworks(sys.executable, executorch_package_dir(), _version("onnxruntime"), _version("onnxruntime-qnn"))


def python_frameworks(python: str, environ: Mapping[str, str]) -> Frameworks:
    """The frameworks of the Python `python`, asked in a process of its own started with `environ`."""
    try:
        proc = subprocess.run([python, "-c", _QUERY], env=dict(environ), capture_output=True, text=True,
                              errors="replace", timeout=QUERY_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise QnnctlError(f"cannot run {python}: {exc}",
                          hint="give --python the path of a Python interpreter") from None
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        raise QnnctlError(f"{python} did not say what it has (exit {proc.returncode}) {tail}".rstrip(),
                          hint="give --python the path of a Python interpreter")
    found = json.loads(line[2:])
    where = found.get("executorch_dir")
    return Frameworks(str(found.get("executable") or python), Path(where) if where else None,
                      found.get("onnxruntime"), found.get("onnxruntime_qnn"))
