"""The project's lock pins the staged libc++ trio; a trio staged before (from another folder,
where no lock applies) and different from the pin was used all the same by the commands that
stage on their own (`lower`, `install`, qnnctl.run.api.setup_sdk) and by one that only uses it
(`lower --no-install`): each now refuses it, exit 4, and loads nothing of it. (`env` prints exports
and reads no lock, for the SDK as for its runtime: a project's lock is held by `install`, `lower`
and the library, which start or load what the SDK needs.)

Real commands, a real LLVM-layout archive on 127.0.0.1, real libraries (see
test_runtime_integration.py, whose fixtures these are)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qnnctl.host.llvm import LLVM_SHA256_ENV
from tests.conftest import run_qnnctl
from tests.host.test_runtime import llvm_archive, needs_host_without_trio
from tests.host.test_runtime_integration import (  # noqa: F401  (fixtures)
    LLVM_PATH,
    Llvm,
    apt_log,
    installed_sdk_needing_libcxx,
    llvm,
    staged_dirs,
)
from tests.host.test_runtime_trust import marked_trio
from tests.sdkfactory import VERSION

SHOW_PATH = 'printf "%s\\n" "$LD_LIBRARY_PATH"'


@pytest.fixture
def unpinned(llvm: Llvm, tmp_path: Path, cache_dir: Path) -> Path:  # noqa: F811
    """A project whose lock pins trio A; the cache holds trio B, staged from a folder without a
    lock. Returns the project."""
    needs_host_without_trio()
    root = installed_sdk_needing_libcxx(cache_dir, llvm.stubs)
    manifest = json.loads((root / ".qnnctl.json").read_text())
    manifest.update(sha256="e" * 64, size=1234)
    (root / ".qnnctl.json").write_text(json.dumps(manifest))
    project = tmp_path / "project"
    project.mkdir()
    assert run_qnnctl("install", VERSION, cwd=project).returncode == 0
    locked = run_qnnctl("lock", VERSION, cwd=project)
    assert locked.returncode == 0, locked.stderr
    assert "[runtime.\"libcxx\"]" in (project / "qnnctl.lock").read_text()
    shutil.rmtree(cache_dir / "runtime")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other, _ = llvm_archive(tmp_path / "other", big=1 << 10, libs=marked_trio(tmp_path / "other", 666))
    llvm.server.add(LLVM_PATH, other, "application/x-xz")
    env = {**os.environ, LLVM_SHA256_ENV: hashlib.sha256(other).hexdigest()}
    staged = run_qnnctl("install", VERSION, cwd=elsewhere, env=env)
    assert staged.returncode == 0, staged.stderr
    assert staged_dirs(cache_dir) == ["libcxx-14.0.0"]
    return project


@pytest.mark.parametrize("options", [[], ["--no-install"]])
def test_lower_in_the_project_does_not_load_a_trio_its_lock_does_not_pin(
        unpinned: Path, cache_dir: Path, options: list[str]) -> None:
    lowered = run_qnnctl("lower", "--sdk", VERSION, *options, "--", "sh", "-c", SHOW_PATH, cwd=unpinned)
    assert (lowered.returncode, lowered.stdout) == (4, ""), lowered.stderr
    assert f"is not the libcxx runtime {unpinned / 'qnnctl.lock'} pins" in lowered.stderr


def test_install_in_the_project_does_not_pass_a_trio_its_lock_does_not_pin(unpinned: Path) -> None:
    installed = run_qnnctl("install", VERSION, cwd=unpinned)
    assert (installed.returncode, installed.stdout) == (4, ""), installed.stderr
    assert "`qnnctl install --runtime --force --runtime-from FILE`" in installed.stderr


def test_setup_sdk_in_the_project_does_not_load_a_trio_its_lock_does_not_pin(unpinned: Path, cache_dir: Path) -> None:
    """A library user's process (qnnctl.run.api.setup_sdk), run from the project's folder."""
    code = ("import os; from qnnctl.run.api import setup_sdk\n"
            "try:\n    setup_sdk(os.environ['WANTED'])\nexcept Exception as exc:\n    print('refused:', exc)\n"
            "print('maps:')\nprint(open('/proc/self/maps').read())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=unpinned, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "WANTED": VERSION}, check=False)
    assert done.returncode == 0, done.stderr
    # Loaded into the process (RTLD_GLOBAL) is what matters; refused here, with exit 4's error.
    said, _, maps = done.stdout.partition("maps:\n")
    assert said.startswith("refused: the runtime staged in "), said
    assert f"is not the libcxx runtime {unpinned / 'qnnctl.lock'} pins" in said
    assert str(cache_dir / "runtime") not in maps
