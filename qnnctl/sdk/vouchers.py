"""Who vouches for the SDK an install arrives at, besides --sha256: the project's qnnctl.lock and
the mirror's index.json, gathered here by the install pipeline's callers and handed down to it
(qnnctl.sdk.gate.Vouchers), so that the pipeline itself reads neither."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from qnnctl.sdk.gate import Vouchers
from qnnctl.sdk.lockfile import project_lock
from qnnctl.sdk.mirrorindex import MirrorIndex


def vouchers(environ: Mapping[str, str], cwd: Path, locked: bool = False, lock: bool = True) -> Vouchers:
    """The project's lock (at or above `cwd`; it must be there under `locked`, --locked, and is
    not consulted without `lock`, while `qnnctl lock` writes it) and QNNCTL_MIRROR's index."""
    mirror = environ.get("QNNCTL_MIRROR") or None
    return Vouchers(project_lock(cwd, locked) if lock else None,
                    MirrorIndex(mirror) if mirror is not None else None)
