"""A staged host runtime (the libc++ trio, glibc and its loader in qnnctl's cache) goes on the
loader's path of every pipeline, as an SDK's libraries do, and is held to the same rule: one
that another user could change (a folder of it made group-writable, a library of theirs) is
refused, never used."""

from __future__ import annotations

import json
import os
import pwd
import sys
from pathlib import Path

import pytest

from qnnctl.host.runtime import RuntimeRequest, stage_runtime
from qnnctl.host.staged import LOADER, TRIO
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import HOST_LIB_DIR, Sdk
from tests.conftest import run_qnnctl
from tests.host.test_runtime import stub_trio
from tests.host.test_runtime_integration import glibc_beside_loader, htp_needing_glibc_2_99
from tests.host.test_runtime_trust import open_trio_tar
from tests.lowerkit import write
from tests.sdkfactory import VERSION, install_tree_into_cache

_as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's takes root")
SHOW_PATH = ("--", "sh", "-c", 'printf %s "$LD_LIBRARY_PATH"')


def _staged_lib(tmp_path: Path, cache: Cache, cache_dir: Path) -> Path:
    """The trio staged in the cache, as `install --runtime-from` stages it; its lib folder."""
    install_tree_into_cache(cache_dir)
    archive = tmp_path / "trio.tar.xz"
    open_trio_tar(archive, tmp_path / "stubs")
    result = stage_runtime(cache, None, RuntimeRequest(sources=(archive,), force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    return result.libcxx.lib_dir


def _nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


@_as_root
@pytest.mark.parametrize("how", ["lib folder 0777", "stage folder 0775", "a library of nobody's",
                                 "a library linked into a writable folder"])
def test_a_staged_runtime_another_user_could_change_is_not_used(how: str, tmp_path: Path, cache: Cache,
                                                                cache_dir: Path) -> None:
    lib = _staged_lib(tmp_path, cache, cache_dir)
    sound = run_qnnctl("lower", "--sdk", VERSION, *SHOW_PATH)
    assert sound.returncode == 0, sound.stderr
    assert str(lib) in sound.stdout.split(":")
    if how == "lib folder 0777":
        culprit, why = lib, "is writable by its group and others (mode 0777)"
        lib.chmod(0o777)
    elif how == "stage folder 0775":
        culprit, why = lib.parent, "is writable by its group (mode 0775)"
        lib.parent.chmod(0o775)
    elif how == "a library of nobody's":
        culprit, why = lib / TRIO[0], f"belongs to user nobody (uid {_nobody()})"
        os.chown(culprit, _nobody(), -1)
    else:
        culprit, why = tmp_path / "open", "is writable by its group and others (mode 0777)"
        culprit.mkdir(mode=0o777)
        culprit.chmod(0o777)
        planted = stub_trio(culprit)  # what the other user puts there: their own libc++.so.1
        (lib / TRIO[0]).unlink()
        (lib / TRIO[0]).symlink_to(culprit / TRIO[0])
        assert (lib / TRIO[0]).read_bytes() == planted[TRIO[0]]
    said = f"the host runtime staged at {lib.parent} is not used: {culprit} {why}"
    lowered = run_qnnctl("lower", "--sdk", VERSION, *SHOW_PATH)
    assert (lowered.returncode, lowered.stdout) == (4, ""), lowered.stderr
    assert said in lowered.stderr
    assert ("chmod go-w" if "writable" in why else "chown root") in lowered.stderr
    env = run_qnnctl("env", VERSION, "--shell", "json")
    assert (env.returncode, env.stdout) == (4, ""), env.stderr
    assert said in env.stderr
    assert json.loads(run_qnnctl("list", "--json").stdout)["sdks"][0]["version"] == VERSION


@_as_root
def test_a_staged_loader_another_user_could_change_does_not_start_the_pipeline(tmp_path: Path,
                                                                              cache_dir: Path) -> None:
    """The staged glibc's loader starts the pipeline of an SDK that needs a newer glibc than the
    host's: a loader of another user's would run it."""
    root = install_tree_into_cache(cache_dir)
    libc = htp_needing_glibc_2_99(root / HOST_LIB_DIR, tmp_path)
    glibc = glibc_beside_loader(libc, tmp_path / "glibc")
    stub_trio(tmp_path / "trio")
    result = stage_runtime(Cache(cache_dir), Sdk(root, VERSION, "qnnctl cache"),
                           RuntimeRequest(sources=(tmp_path / "trio", glibc), force=True, use_apt=False), os.environ)
    assert result.glibc is not None
    loader = result.glibc.lib_dir / LOADER
    write(Path("pipeline.py"), "print('lowered')\n")
    args = ("lower", "--dry-run", "--keep-mkldnn", "--python", sys.executable, "pipeline.py")
    sound = run_qnnctl(*args)
    assert sound.returncode == 0, sound.stderr
    assert str(loader) in sound.stdout
    os.chown(loader, _nobody(), -1)
    lowered = run_qnnctl(*args)
    assert (lowered.returncode, lowered.stdout) == (4, ""), lowered.stderr
    assert (f"the host runtime staged at {result.glibc.root} is not used: {loader} belongs to user nobody "
            f"(uid {_nobody()})") in lowered.stderr


@_as_root
def test_a_lock_pins_no_staged_runtime_another_user_could_change(tmp_path: Path, cache: Cache, mirror: object,
                                                                  cache_dir: Path) -> None:
    """`qnnctl lock` pins the staged runtime as it is: one that another user could have written
    into would be vouched for by the lock, for every host of the project."""
    installed = run_qnnctl("install", VERSION)
    assert installed.returncode == 0, installed.stderr
    archive = tmp_path / "trio.tar.xz"
    open_trio_tar(archive, tmp_path / "stubs")
    result = stage_runtime(cache, None, RuntimeRequest(sources=(archive,), force=True, use_apt=False), os.environ)
    assert result.libcxx is not None
    result.libcxx.lib_dir.chmod(0o775)
    locked = run_qnnctl("lock", VERSION)
    assert (locked.returncode, locked.stdout) == (4, ""), locked.stderr
    assert (f"the host runtime staged at {result.libcxx.root} is not used: {result.libcxx.lib_dir} is writable by "
            "its group (mode 0775)") in locked.stderr
    assert not (Path.cwd() / "qnnctl.lock").exists()
    result.libcxx.lib_dir.chmod(0o755)
    again = run_qnnctl("lock", VERSION)
    assert again.returncode == 0, again.stderr
    assert "[runtime." in (Path.cwd() / "qnnctl.lock").read_text()
