"""`qnnctl lock` pins the staged host runtime's libraries, and `install --locked --runtime` holds
what it stages, or finds staged, to them: other libraries are refused (exit 4), nothing staged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from qnnctl.errors import IntegrityError
from qnnctl.host.build import RuntimePins
from qnnctl.host.runtime import LOCK_KEY, RuntimeRequest, RuntimeResult, check_staged, stage_runtime
from qnnctl.host.staged import TRIO
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.lockfile import LockedSdk, LockError, read_lock, write_lock
from qnnctl.sdk.work import version_lock
from tests.conftest import run_qnnctl
from tests.host.test_runtime import fake_glibc, needs_host_without_trio, nothing_staged
from tests.host.test_runtime_trust import marked_trio
from tests.sdkfactory import VERSION, install_tree_into_cache


def pins_of(libs: dict[str, bytes]) -> dict[str, str]:
    return {f"lib/{name}": hashlib.sha256(data).hexdigest() for name, data in libs.items()}


def test_the_lock_carries_the_runtime_it_pins(tmp_path: Path) -> None:
    path = tmp_path / "qnnctl.lock"
    pinned = {"libcxx": {"lib/libc++.so.1": "a" * 64, "lib/libunwind.so.1": "b" * 64},
              "glibc": {"lib/libc.so.6": "c" * 64}}
    write_lock(path, LockedSdk(path, VERSION, "d" * 64, runtime_sha256=pinned), "Test.")
    assert read_lock(path).runtime_sha256 == pinned
    assert '[runtime."libcxx"]\n"lib/libc++.so.1" = "' + "a" * 64 + '"' in path.read_text()
    write_lock(path, LockedSdk(path, VERSION, "d" * 64), "Test.")
    assert read_lock(path).runtime_sha256 is None
    assert "[runtime" not in path.read_text()
    path.write_text(path.read_text() + '\n[runtime.libcxx]\n"lib/libc++.so.1" = "not a digest"\n')
    with pytest.raises(LockError, match=r"\[runtime.<kind>\] table must map a file to a sha256"):
        read_lock(path)


def test_other_libraries_than_the_lock_pins_are_refused_and_nothing_staged(
        tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    locked = marked_trio(tmp_path / "locked", 7)
    other = marked_trio(tmp_path / "other", 666)
    pins = RuntimePins("qnnctl.lock", {"libcxx": pins_of(locked)})
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "other",), force=True, use_apt=False,
                                                  pins=pins), os.environ)
    assert caught.value.exit_code == 4
    given = ", ".join(str(tmp_path / "other" / name) for name in sorted(TRIO))  # the files it would be staged from
    assert caught.value.message.startswith(f"what would be staged from {given} is not the libcxx runtime "
                                           "qnnctl.lock pins: lib/libc++.so.1: "), caught.value.message
    assert hashlib.sha256(other["libc++.so.1"]).hexdigest() in caught.value.message
    nothing_staged(cache_dir)
    result = stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "locked",), force=True, use_apt=False,
                                                       pins=pins), os.environ)
    assert result.libcxx is not None
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == locked


def test_a_staged_runtime_changed_since_is_refused(tmp_path: Path, cache: Cache) -> None:
    locked = marked_trio(tmp_path / "locked", 7)
    pins = RuntimePins("qnnctl.lock", {"libcxx": pins_of(locked)})
    first = stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "locked",), force=True, use_apt=False),
                          os.environ)
    assert first.libcxx is not None
    again = stage_runtime(cache, None, RuntimeRequest(pins=pins), os.environ)  # kept, and it matches
    assert again.libcxx_action in ("reused", "host")
    # Its manifest still says what was staged; the file the loader maps says otherwise.
    library = first.libcxx.lib_dir / "libunwind.so.1"
    library.write_bytes(marked_trio(tmp_path / "other", 666)["libunwind.so.1"])
    with pytest.raises(IntegrityError) as caught:
        stage_runtime(cache, None, RuntimeRequest(pins=pins), os.environ)
    changed = hashlib.sha256(library.read_bytes()).hexdigest()
    assert caught.value.message == (
        f"the runtime staged in {first.libcxx.root} is not the libcxx runtime qnnctl.lock pins: lib/libunwind.so.1: "
        f"{changed}, pinned {pins_of(locked)['lib/libunwind.so.1']}")
    assert caught.value.hint == (
        "stage the locked one again: `qnnctl install --runtime --force --runtime-from FILE`, or, if these are the "
        "ones to trust, write the lock again with `qnnctl lock`; nothing was staged")
    # As the hint says: the locked files, staged again with --force, over the one that was changed.
    result = stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "locked",), force=True, use_apt=False,
                                                       pins=pins), os.environ)
    assert result.libcxx_action == "staged"
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == locked  # type: ignore[union-attr]
    assert stage_runtime(cache, None, RuntimeRequest(pins=pins), os.environ).libcxx_action in ("reused", "host")


def test_lock_pins_the_staged_runtime_and_install_locked_refuses_another(tmp_path: Path, cache_dir: Path) -> None:
    needs_host_without_trio()
    root = install_tree_into_cache(cache_dir)
    manifest = json.loads((root / ".qnnctl.json").read_text())
    manifest.update(sha256="e" * 64, size=1234)  # installed from an archive it recorded
    (root / ".qnnctl.json").write_text(json.dumps(manifest))
    locked = marked_trio(tmp_path / "locked", 7)
    marked_trio(tmp_path / "other", 666)
    project = tmp_path / "project"
    project.mkdir()
    staged = run_qnnctl("install", VERSION, "--runtime", "--runtime-from", str(tmp_path / "locked"), cwd=project)
    assert staged.returncode == 0, staged.stderr
    written = run_qnnctl("lock", VERSION, cwd=project)
    assert written.returncode == 0, written.stderr
    assert read_lock(project / "qnnctl.lock").runtime_sha256 == {"libcxx": pins_of(locked)}

    shutil.rmtree(cache_dir / "runtime")
    refused = run_qnnctl("install", VERSION, "--locked", "--runtime", "--runtime-from", str(tmp_path / "other"),
                         cwd=project)
    assert refused.returncode == 4, refused.stderr
    assert refused.stdout == ""
    assert f"is not the libcxx runtime {project / 'qnnctl.lock'} pins" in refused.stderr
    nothing_staged(cache_dir)
    accepted = run_qnnctl("install", VERSION, "--locked", "--runtime", "--runtime-from", str(tmp_path / "locked"),
                          cwd=project)
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip() == str(root)


def test_a_kept_runtime_is_held_to_the_lock_when_force_stages_the_other_kind_alone(
        tmp_path: Path, cache: Cache, cache_dir: Path) -> None:
    """--force with a glibc alone stages no trio: the trio staged before stays, and is held to the
    lock as what is kept always is (it was let through, counted as staged again, when it was not)."""
    locked = marked_trio(tmp_path / "locked", 7)
    pins = RuntimePins("qnnctl.lock", {"libcxx": pins_of(locked)})
    first = stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "locked",), force=True, use_apt=False),
                          os.environ)
    assert first.libcxx is not None
    (first.libcxx.lib_dir / "libunwind.so.1").write_bytes(marked_trio(tmp_path / "other", 666)["libunwind.so.1"])
    glibc = fake_glibc(tmp_path / "glibc", "2.99")
    with pytest.raises(IntegrityError, match=r"lib/libunwind\.so\.1: [0-9a-f]{64}, pinned"):
        stage_runtime(cache, None, RuntimeRequest(sources=(glibc,), force=True, use_apt=False, pins=pins), os.environ)
    assert sorted(p.name for p in (cache_dir / "runtime").iterdir()) == [first.libcxx.name]  # no glibc either


def test_a_staged_glibc_changed_since_is_refused_as_a_trio_is(tmp_path: Path, cache: Cache) -> None:
    first = stage_runtime(cache, None, RuntimeRequest(sources=(fake_glibc(tmp_path / "glibc", "2.99"),), force=True,
                                                      use_apt=False), os.environ)
    assert first.glibc is not None
    files = {name: hashlib.sha256((first.glibc.root / name).read_bytes()).hexdigest()
             for name in first.glibc.manifest["files"]}
    pins = RuntimePins("qnnctl.lock", {"glibc": files})
    check_staged(cache, pins)  # as staged: it matches
    (first.glibc.lib_dir / "libc.so.6").write_bytes(b"\x7fELF changed")
    with pytest.raises(IntegrityError, match=r"is not the glibc runtime qnnctl\.lock pins: lib/libc\.so\.6: "):
        check_staged(cache, pins)
    check_staged(cache, pins, restaged={"glibc"})  # about to be staged again: not held to the lock now


def test_a_stage_waits_for_another_and_clears_what_a_killed_one_left(
        tmp_path: Path, cache: Cache, caplog: pytest.LogCaptureFixture) -> None:
    """One stage at a time (another's lock held here, and said so while waited for); what a stage
    killed before its end left in tmp/ is removed, another install's work is not."""
    caplog.set_level(logging.INFO)
    locked = marked_trio(tmp_path / "locked", 7)
    left = cache.tmp / f"{LOCK_KEY}.0123456789ab"
    other = cache.tmp / "2.37.0.250724.0123456789ab"
    for folder in (left, other):
        (folder / "lib").mkdir(parents=True)
    done: list[object] = []
    with version_lock(cache, LOCK_KEY, "a test"):
        stager = threading.Thread(target=lambda: done.append(stage_runtime(
            cache, None, RuntimeRequest(sources=(tmp_path / "locked",), force=True, use_apt=False), os.environ)))
        stager.start()
        deadline = time.monotonic() + 30
        while "waiting for another qnnctl" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done == []
    stager.join(60)
    assert "to finish staging the host runtime" in caplog.text
    result = done[0]
    assert isinstance(result, RuntimeResult)
    assert result.libcxx is not None
    assert {n: (result.libcxx.lib_dir / n).read_bytes() for n in TRIO} == locked
    assert not left.exists()
    assert other.is_dir()
