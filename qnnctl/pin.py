"""The project pin: a `.qnn-version` file naming the SDK a project uses."""

from __future__ import annotations

import os
from pathlib import Path

from qnnctl.sdk import PIN_FILE
from qnnctl.versions import resolve_version


def write_pin(folder: Path, spec: str) -> Path:
    """Write the full version that `spec` names into `folder/.qnn-version`, atomically."""
    version = resolve_version(spec)
    path = folder / PIN_FILE
    partial = folder / f"{PIN_FILE}.{os.getpid()}.tmp"
    partial.write_text(version + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path
