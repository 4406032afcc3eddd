"""`qnnctl which NAME`: the library or tool a process set up for the SDK would use."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import run_qnnctl
from tests.httpserver import FaultServer
from tests.sdkfactory import OTHER_VERSION, VERSION, build_sdk_tree, compile_shared, install_tree_into_cache

LIB = "lib/x86_64-linux-clang"
BIN = "bin/x86_64-linux-clang"


def test_a_library_as_the_loader_finds_it(cache_dir: Path, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    # A stray copy on the user's LD_LIBRARY_PATH comes after the SDK's own folder.
    stray = compile_shared(tmp_path / "stray" / "libQnnHtp.so")
    env = {**os.environ, "LD_LIBRARY_PATH": str(stray.parent)}
    found = run_qnnctl("which", "libQnnHtp.so", env=env)
    assert found.returncode == 0, found.stderr
    assert found.stdout == f"{root / LIB / 'libQnnHtp.so'}\n"
    report = json.loads(run_qnnctl("which", "--json", "libQnnHtp.so", env=env).stdout)
    assert report["kind"] == "library"
    assert report["sdk"] == {"root": str(root), "version": VERSION}
    origins = [(c["folder"], c["origin"], c["holds"]) for c in report["candidates"][:2]]
    assert origins == [(str(root / LIB), f"the SDK's host libraries ({VERSION})", True),
                       (str(stray.parent), "LD_LIBRARY_PATH", True)]
    # A library of the host: from the loader's cache or its default folders.
    libc = run_qnnctl("which", "libc.so.6")
    assert libc.returncode == 0, libc.stderr
    assert Path(libc.stdout.strip()).name == "libc.so.6"


def test_a_tool_as_path_finds_it_and_nothing_found_is_exit_1(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    tool = run_qnnctl("which", "qnn-net-run")
    assert tool.returncode == 0, tool.stderr
    assert tool.stdout == f"{root / BIN / 'qnn-net-run'}\n"
    missing = run_qnnctl("which", "libQnnNowhere.so")
    assert missing.returncode == 1
    assert missing.stdout == ""
    assert f"no library libQnnNowhere.so for SDK {VERSION} at {root}" in missing.stderr
    as_json = run_qnnctl("which", "--json", "qnn-nowhere")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["path"] is None


def test_which_follows_the_shell_and_the_argument(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    other = install_tree_into_cache(cache_dir, OTHER_VERSION)
    exported = json.loads(run_qnnctl("env", OTHER_VERSION, "--shell", "json").stdout)
    shell = {**os.environ, **{k: v for k, v in exported.items() if v is not None}}
    assert run_qnnctl("which", "libQnnSystem.so", env=shell).stdout == f"{other / LIB / 'libQnnSystem.so'}\n"
    given = build_sdk_tree(cache_dir.parent / "vendor" / "qairt")
    by_path = run_qnnctl("which", "--sdk", str(given), "libQnnSystem.so", env=shell)
    assert by_path.stdout == f"{given / LIB / 'libQnnSystem.so'}\n", by_path.stderr


def test_which_takes_a_bare_name_and_installs_nothing(mirror: FaultServer, cache_dir: Path) -> None:
    bad = run_qnnctl("which", "../libQnnHtp.so")
    assert bad.returncode == 2
    assert "not a bare library or tool name" in bad.stderr
    absent = run_qnnctl("which", "libQnnHtp.so")  # nothing installed: the default is not fetched
    assert absent.returncode == 1
    assert "is not installed" in absent.stderr
    assert not (cache_dir / "sdks").exists()
    assert mirror.requests == []
