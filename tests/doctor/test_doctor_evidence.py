"""`doctor`'s manifest and --verify checks: a `.qnnctl.json` counts only where qnnctl wrote it,
in this cache. One carried by a folder qnnctl did not write (a store, a linked folder, a copy
of another cache's SDK) may say anything of the files beside it, and vouches for nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from qnnctl.sdk.cache import MANIFEST_NAME
from tests.conftest import run_qnnctl
from tests.sdkfactory import VERSION, build_archive

README = "QNN_README.txt"


def _checks(*args: str, env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    proc = run_qnnctl("doctor", "--json", "--offline", *args, env=env)
    return {check["id"]: check for check in json.loads(proc.stdout)["checks"]}


def _copied_sdk(tmp_path: Path) -> Path:
    """An SDK that qnnctl installed into another cache, copied elsewhere with its manifest, then
    one file changed and the manifest written again to match it, as anyone can."""
    other_cache = tmp_path / "other-cache"
    installed = run_qnnctl("install", "--file", str(build_archive(tmp_path, "zip")),
                           env=dict(os.environ, QNNCTL_CACHE_DIR=str(other_cache)))
    assert installed.returncode == 0, installed.stderr
    copy = tmp_path / "elsewhere" / VERSION
    shutil.copytree(Path(installed.stdout.strip()), copy, symlinks=True)
    changed = b"changed after qnnctl wrote the manifest\n"
    (copy / README).chmod(0o644)
    (copy / README).write_bytes(changed)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    assert README in manifest["files"]
    manifest["files"][README] = hashlib.sha256(changed).hexdigest()
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    return copy


def test_a_manifest_in_a_folder_qnnctl_did_not_write_here_vouches_for_nothing(tmp_path: Path,
                                                                              cache_dir: Path) -> None:
    copy = _copied_sdk(tmp_path)
    checks = _checks("--sdk", str(copy), "--verify")
    assert checks["sdk.selection"]["status"] == "ok", checks["sdk.selection"]
    verify = checks["sdk.verify"]
    assert verify["status"] == "skip", verify
    assert "vouches for nothing" in verify["detail"]
    assert "all " not in verify["detail"]
    assert "qnnctl lock --check" in (verify["hint"] or "")
    manifest = checks["sdk.manifest"]
    assert manifest["status"] == "skip", manifest
    assert "vouches for nothing" in manifest["detail"]
    # The same folder as an SDK of this cache is qnnctl's own, and --verify reads its manifest.
    own = cache_dir / "sdks" / VERSION
    own.parent.mkdir(parents=True)
    shutil.copytree(copy, own, symlinks=True)
    (own / README).write_bytes(b"changed again\n")
    checks = _checks("--sdk", VERSION, "--verify")
    assert checks["sdk.manifest"]["status"] == "ok", checks["sdk.manifest"]
    assert checks["sdk.verify"]["status"] == "fail", checks["sdk.verify"]
    assert f"1 changed ({README})" in checks["sdk.verify"]["detail"]
