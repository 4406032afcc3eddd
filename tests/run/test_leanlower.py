"""`qnnctl lower` without click (qnnctl.commands.leanlower): the command lines it takes, those it
leaves to the full command line, and, for both, the same outcome: the same pipeline run, the same
error told with the same exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qnnctl.commands.leanlower import lower_arguments
from qnnctl.run.lower import LowerOptions
from tests.sdkfactory import VERSION, install_tree_into_cache

PY = sys.executable


@pytest.mark.parametrize(("args", "options", "pipeline"), [
    (["--", "true"], LowerOptions(), ["--", "true"]),
    (["x.py", "--sdk", "y"], LowerOptions(), ["x.py", "--sdk", "y"]),
    (["-m", "pkg.mod", "-v"], LowerOptions(), ["-m", "pkg.mod", "-v"]),
    (["-mpkg"], LowerOptions(), ["-mpkg"]),
    (["-"], LowerOptions(), ["-"]),
    (["--sdk", "2.37", "--python", "/p/python", "x.py"], LowerOptions(spec="2.37", python="/p/python"), ["x.py"]),
    (["--sdk=2.37", "--python=/p", "--", "a", "--"], LowerOptions(spec="2.37", python="/p"), ["--", "a", "--"]),
    (["--sdk=", "--", "a"], LowerOptions(spec=""), ["--", "a"]),
    (["--no-install", "--keep-mkldnn", "--", "a"], LowerOptions(install=False, keep_mkldnn=True), ["--", "a"]),
    (["--sdk", "--no-install", "--", "a"], LowerOptions(spec="--no-install"), ["--", "a"]),  # as click takes it
])
def test_the_usual_command_lines_are_parsed_here(args: list[str], options: LowerOptions, pipeline: list[str]) -> None:
    assert lower_arguments(args) == (options, pipeline)


@pytest.mark.parametrize("args", [
    [], ["--sdk", "2.37"], ["--sdk"], ["--sdk", "--", "x"], ["--help", "--", "x"], ["-h"], ["--dry-run", "x.py"],
    ["-v", "x.py"], ["-q", "--", "a"], ["--verbose", "x.py"], ["--sdk", "a", "--sdk", "b", "x.py"],
    ["--unknown", "x.py"], ["--no-install=1", "x.py"], ["--sdkx", "y", "x.py"],
])
def test_the_others_are_left_to_the_full_command_line(args: list[str]) -> None:
    assert lower_arguments(args) is None


def _both(args: list[str], cwd: Path, env: dict[str, str] | None = None
          ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """`qnnctl lower ARGS` through the entry point (lean), and through the full command line."""
    lean = subprocess.run([PY, "-m", "qnnctl", "lower", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)
    full = subprocess.run([PY, "-c", "import sys; from qnnctl.cli import main; main(sys.argv[1:])", "lower", *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    return lean, full


@pytest.mark.parametrize("args", [
    ["--no-install", "--sdk", "2.99.0.990101", "--", "true"],  # not installed: the install command named
    ["--python", PY, "--", "true"],  # --python with a command
    ["missing.py"],  # no such script
    ["--", "no-such-command-here"],  # exit 127, as a shell says
    ["--sdk", "/no/such/folder", "--", "true"],
    ["--sdk", "--no-install", "--", "true"],  # click takes the next word as the value, whatever it is
])
def test_an_error_is_told_as_the_full_command_line_tells_it(args: list[str], tmp_path: Path, cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir)
    lean, full = _both(args, tmp_path)
    assert lean.returncode != 0
    assert (lean.returncode, lean.stdout, lean.stderr) == (full.returncode, full.stdout, full.stderr)
    assert lean.stderr.startswith("qnnctl: error: ")


def test_the_same_pipeline_runs_with_the_same_environment(tmp_path: Path, cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir)
    show = ["--sdk", VERSION, "--keep-mkldnn", "--", PY, "-c",
            "import json, os, sys; print(json.dumps([sys.argv[1:], dict(os.environ)]))", "--sdk", "x"]
    lean, full = _both(show, tmp_path)
    assert lean.returncode == full.returncode == 0, (lean.stderr, full.stderr)
    assert (lean.stdout, lean.stderr) == (full.stdout, full.stderr)
    assert f'"QNN_SDK_ROOT": "{root}"' in lean.stdout


def test_a_cache_path_the_library_path_cannot_hold_is_refused_alike(tmp_path: Path) -> None:
    env = {**os.environ, "QNNCTL_CACHE_DIR": str(tmp_path / "a:b")}
    lean, full = _both(["--", "true"], tmp_path, env)
    assert lean.returncode == 2, lean.stderr
    assert (lean.returncode, lean.stderr) == (full.returncode, full.stderr)
    assert not (tmp_path / "a:b").exists()
